//! How big the next socket read is, for the two frame readers of the hot path (SPDY from the
//! upstream, WebSocket from the client): large while data flows, 512 bytes while a session is
//! quiet (what an idle session parks on is its largest per-session buffer), and exactly up to
//! a started frame's end, so the frame's payload stays in the buffer it started in.

use bytes::BytesMut;

/// Bytes asked of the socket per read while data flows.
pub const READ_CHUNK: usize = 64 * 1024;
/// Bytes asked per read while the session is quiet.
pub const IDLE_READ: usize = 512;
/// A buffer grown beyond this by a large frame is dropped once empty, so an idle session does
/// not keep a multi-MiB allocation.
const SHRINK_ABOVE: usize = 256 * 1024;

/// The read-size policy of one reader.
#[derive(Debug, Clone)]
pub struct ReadSizer {
    read_size: usize,
    /// Room kept beyond a busy read so the frame it ends inside can be completed in place: the
    /// largest frame the peer sends in practice.
    frame_slack: usize,
}

impl ReadSizer {
    /// A quiet reader whose peer's frames are at most about `frame_slack` bytes.
    pub fn new(frame_slack: usize) -> Self {
        ReadSizer {
            read_size: IDLE_READ,
            frame_slack,
        }
    }

    /// Readies `buf` for the next read and says how many bytes it may take. `missing`: the
    /// bytes still missing from a frame whose head is in `buf`.
    pub fn prepare(&self, buf: &mut BytesMut, missing: Option<usize>) -> usize {
        if buf.is_empty()
            && (buf.capacity() > SHRINK_ABOVE
                || (self.read_size == IDLE_READ && buf.capacity() > 2 * IDLE_READ))
        {
            *buf = BytesMut::new();
        }
        let want = missing.unwrap_or(self.read_size);
        let room = if missing.is_none() && self.read_size == READ_CHUNK {
            want + self.frame_slack
        } else {
            want
        };
        if buf.capacity() - buf.len() < room {
            buf.reserve(room);
        }
        want
    }

    /// Learns from a read of `n` bytes out of `want`: how busy the session is shows in whether
    /// a read we sized (not one finishing a frame) filled up.
    pub fn observe(&mut self, n: usize, want: usize, missing: Option<usize>) {
        if n == 0 || missing.is_some() {
            return;
        }
        self.read_size = if n >= want {
            READ_CHUNK
        } else if n < IDLE_READ {
            IDLE_READ
        } else {
            self.read_size
        };
    }

    /// The size a read not finishing a frame would have now.
    pub fn read_size(&self) -> usize {
        self.read_size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_when_reads_fill_and_parks_small_when_quiet() {
        let mut s = ReadSizer::new(1000);
        let mut buf = BytesMut::new();
        let want = s.prepare(&mut buf, None);
        assert_eq!(want, IDLE_READ);
        s.observe(IDLE_READ, want, None);
        assert_eq!(s.read_size(), READ_CHUNK);
        let want = s.prepare(&mut buf, None);
        assert_eq!(want, READ_CHUNK);
        assert!(buf.capacity() >= READ_CHUNK + 1000);
        s.observe(100, want, None);
        assert_eq!(s.read_size(), IDLE_READ);
        // An empty, now oversized buffer is released before a quiet read.
        s.prepare(&mut buf, None);
        assert!(buf.capacity() < READ_CHUNK);
    }

    #[test]
    fn a_started_frame_is_finished_exactly_and_teaches_nothing() {
        let mut s = ReadSizer::new(1000);
        let mut buf = BytesMut::from(&b"head"[..]);
        assert_eq!(s.prepare(&mut buf, Some(7)), 7);
        s.observe(7, 7, Some(7));
        assert_eq!(s.read_size(), IDLE_READ);
        s.observe(0, IDLE_READ, None);
        assert_eq!(s.read_size(), IDLE_READ);
    }
}
