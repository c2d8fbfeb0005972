//! Where the frames of a WebSocket byte stream begin and end, followed from their headers alone
//! (payloads are skipped, never read): the places a relay that copies a server's bytes to its
//! client can slip in a ping of its own. RFC 6455 §5.4 lets control frames go between the
//! fragments of a message, so every frame boundary will do.
//!
//! Tolerant of what a relay may carry: reserved bits (an extension the two ends agreed on) and
//! masked frames are followed as they are. A header that cannot be a frame (a reserved opcode,
//! a 64-bit length with its top bit set) or a close frame ends the following for good: nothing
//! is ever slipped in after the server began closing, or into a stream that is not understood.

use super::frame::{FrameHead, OpCode, MAX_HEAD_LEN};

/// An empty ping from a server: FIN, opcode 9, unmasked, no payload.
pub const SERVER_PING: [u8; 2] = [0x89, 0x00];

/// Whether the frames can still be followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Following,
    /// The server sent a close frame: nothing more may be added.
    Closed,
    /// Not a WebSocket frame stream as far as we can tell.
    Lost,
}

/// Follows a WebSocket byte stream's frame boundaries.
#[derive(Debug, Clone)]
pub struct FrameBoundaries {
    /// The header being gathered, when one is split across reads.
    head: [u8; MAX_HEAD_LEN],
    /// Bytes of it gathered so far.
    have: usize,
    /// Payload bytes of the current frame still to come.
    payload_left: u64,
    state: State,
}

impl Default for FrameBoundaries {
    fn default() -> Self {
        FrameBoundaries {
            head: [0; MAX_HEAD_LEN],
            have: 0,
            payload_left: 0,
            state: State::Following,
        }
    }
}

impl FrameBoundaries {
    /// A stream at its start (a boundary).
    pub fn new() -> FrameBoundaries {
        FrameBoundaries::default()
    }

    /// Whether the bytes followed so far end exactly between two frames, where a frame of our
    /// own may go.
    pub fn at_boundary(&self) -> bool {
        self.state == State::Following && self.have == 0 && self.payload_left == 0
    }

    /// Whether the stream can no longer take frames of our own (closing, or not understood).
    pub fn stopped(&self) -> bool {
        self.state != State::Following
    }

    /// Follows the next `bytes` of the stream; returns the last offset within them (`0` to
    /// `bytes.len()`) at which a frame of our own may go, if there is one.
    pub fn follow(&mut self, bytes: &[u8]) -> Option<usize> {
        let mut last = self.at_boundary().then_some(0);
        let mut at = 0;
        while at < bytes.len() && self.state == State::Following {
            if self.payload_left > 0 {
                let skip = self.payload_left.min((bytes.len() - at) as u64);
                at += skip as usize;
                self.payload_left -= skip;
                if self.payload_left == 0 {
                    last = Some(at);
                }
                continue;
            }
            let take = (MAX_HEAD_LEN - self.have).min(bytes.len() - at);
            self.head[self.have..self.have + take].copy_from_slice(&bytes[at..at + take]);
            let mut head = self.head;
            // The reserved bits belong to an extension the ends agreed on; the length does not
            // depend on them.
            head[0] &= !0x70;
            match FrameHead::parse(&head[..self.have + take]) {
                Ok(Some(frame)) => {
                    at += frame.head_len - self.have;
                    self.have = 0;
                    if frame.opcode == OpCode::Close {
                        // Anything of ours must go before it.
                        self.state = State::Closed;
                        break;
                    }
                    self.payload_left = frame.len;
                    if frame.len == 0 {
                        last = Some(at);
                    }
                }
                Ok(None) => {
                    self.have += take;
                    at += take;
                }
                Err(_) => {
                    self.state = State::Lost;
                    // A boundary before the bytes we could not make sense of is no safer than
                    // the bytes themselves: offer none.
                    return None;
                }
            }
        }
        last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server frame: header then payload.
    fn frame(b0: u8, payload: &[u8]) -> Vec<u8> {
        let mut head = [0u8; MAX_HEAD_LEN];
        let opcode = match b0 & 0x0F {
            0x1 => OpCode::Text,
            0x2 => OpCode::Binary,
            0x8 => OpCode::Close,
            0x9 => OpCode::Ping,
            0xA => OpCode::Pong,
            _ => OpCode::Continuation,
        };
        let n = FrameHead::encode_server(opcode, payload.len(), &mut head);
        head[0] = b0;
        let mut out = head[..n].to_vec();
        out.extend_from_slice(payload);
        out
    }

    #[test]
    fn the_server_ping_is_a_valid_final_empty_ping() {
        let head = FrameHead::parse(&SERVER_PING).unwrap().unwrap();
        assert_eq!(head.opcode, OpCode::Ping);
        assert!(head.fin);
        assert_eq!((head.len, head.head_len, head.mask), (0, 2, None));
    }

    #[test]
    fn boundaries_of_whole_frames_in_one_read() {
        let mut f = FrameBoundaries::new();
        assert!(f.at_boundary());
        let mut bytes = frame(0x82, b"\x01hello");
        let first = bytes.len();
        bytes.extend(frame(0x82, &[7u8; 300]));
        assert_eq!(f.follow(&bytes), Some(bytes.len()));
        assert!(f.at_boundary());
        // Mid-second-frame: the last boundary is after the first.
        let mut f = FrameBoundaries::new();
        assert_eq!(f.follow(&bytes[..first + 10]), Some(first));
        assert!(!f.at_boundary());
        assert_eq!(
            f.follow(&bytes[first + 10..]),
            Some(bytes.len() - first - 10)
        );
    }

    #[test]
    fn a_read_inside_one_payload_has_no_boundary() {
        let bytes = frame(0x82, &[1u8; 70_000]);
        let mut f = FrameBoundaries::new();
        assert_eq!(f.follow(&bytes[..100]), Some(0));
        assert_eq!(f.follow(&bytes[100..50_000]), None);
        assert_eq!(f.follow(&bytes[50_000..]), Some(bytes.len() - 50_000));
    }

    #[test]
    fn headers_split_across_reads_byte_by_byte() {
        // 64-bit length header (10 bytes), then a 16-bit one.
        let mut bytes = frame(0x82, &[3u8; 70_000]);
        let second = bytes.len();
        bytes.extend(frame(0x02, &[4u8; 200]));
        bytes.extend(frame(0x80, b"end"));
        let mut f = FrameBoundaries::new();
        let mut boundaries = Vec::new();
        for (i, b) in bytes.iter().enumerate() {
            if let Some(p) = f.follow(std::slice::from_ref(b)) {
                if p == 1 {
                    boundaries.push(i + 1);
                }
            }
        }
        assert_eq!(boundaries, [second, second + 4 + 200, bytes.len()]);
    }

    #[test]
    fn empty_frames_and_control_frames_are_boundaries_too() {
        let mut bytes = frame(0x82, b"");
        bytes.extend(frame(0x8A, b"pong"));
        let mut f = FrameBoundaries::new();
        assert_eq!(f.follow(&bytes[..2]), Some(2));
        assert_eq!(f.follow(&bytes[2..]), Some(bytes.len() - 2));
    }

    #[test]
    fn nothing_goes_in_after_a_close_frame() {
        let mut bytes = frame(0x82, b"\x01bye");
        let before_close = bytes.len();
        bytes.extend(frame(0x88, &[0x03, 0xE8]));
        let mut f = FrameBoundaries::new();
        assert_eq!(f.follow(&bytes), Some(before_close));
        assert!(f.stopped());
        assert!(!f.at_boundary());
        assert_eq!(f.follow(b"\x82\x00"), None);
    }

    #[test]
    fn reserved_bits_and_masks_are_followed() {
        // permessage-deflate's RSV1 on a data frame; a masked frame (a client's, relayed).
        let mut bytes = frame(0xC2, b"compressed");
        let first = bytes.len();
        bytes.extend_from_slice(&[0x82, 0x83, 1, 2, 3, 4, 9, 9, 9]);
        let mut f = FrameBoundaries::new();
        assert_eq!(f.follow(&bytes[..first + 3]), Some(first));
        assert_eq!(f.follow(&bytes[first + 3..]), Some(bytes.len() - first - 3));
        assert!(f.at_boundary());
    }

    #[test]
    fn a_stream_that_is_not_websocket_is_given_up() {
        let mut f = FrameBoundaries::new();
        // Opcode 3 is reserved.
        assert_eq!(f.follow(b"\x83\x00"), None);
        assert!(f.stopped());
        assert_eq!(f.follow(b"\x82\x00"), None);
        // A 64-bit length with its top bit set.
        let mut f = FrameBoundaries::new();
        assert_eq!(f.follow(&[0x82, 127, 0x80, 0, 0, 0, 0, 0, 0, 0]), None);
        assert!(f.stopped());
    }

    proptest::proptest! {
        /// However a stream of frames is cut into reads, the boundaries found are exactly the
        /// frame ends (and the start), and never a place inside a frame.
        #[test]
        fn any_cutting_finds_exactly_the_frame_ends(
            sizes in proptest::collection::vec(0usize..70_000, 1..8),
            cuts in proptest::collection::vec(1usize..20_000, 1..40),
        ) {
            let mut bytes = Vec::new();
            let mut ends = vec![0];
            for (i, n) in sizes.iter().enumerate() {
                bytes.extend(frame(if i % 2 == 0 { 0x82 } else { 0x02 }, &vec![5u8; *n]));
                ends.push(bytes.len());
            }
            let mut f = FrameBoundaries::new();
            let mut at = 0;
            let mut cut = cuts.iter().cycle();
            while at < bytes.len() {
                let n = (*cut.next().unwrap()).min(bytes.len() - at);
                let found = f.follow(&bytes[at..at + n]);
                let expected = ends.iter().rev().find(|&&e| e >= at && e <= at + n).map(|e| e - at);
                proptest::prop_assert_eq!(found, expected);
                at += n;
            }
            proptest::prop_assert!(f.at_boundary());
        }

        /// Arbitrary bytes never panic it, and a boundary is always within the bytes given.
        #[test]
        fn arbitrary_bytes_are_followed_without_panics(
            chunks in proptest::collection::vec(proptest::collection::vec(proptest::num::u8::ANY, 0..64), 0..16),
        ) {
            let mut f = FrameBoundaries::new();
            for c in &chunks {
                if let Some(p) = f.follow(c) {
                    proptest::prop_assert!(p <= c.len());
                }
            }
        }
    }
}
