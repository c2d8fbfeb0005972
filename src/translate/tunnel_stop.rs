//! How a port-forward tunnel an operator terminated tells its client (the sessions API): as a
//! kubelet ends a forwarded connection that failed, the message goes on the error stream of
//! each connection still open (a DATA frame with FIN), and each data stream is ended (an empty
//! DATA frame with FIN). kubectl then prints `an error occurred forwarding …: <message>`,
//! closes the tunnel and exits with `lost connection to pod`. The frames go between two of the
//! upstream's SPDY frames ([`SpdyEdges`]); DATA frames carry no header block, so nothing
//! touches the upstream's zlib context.
//!
//! Which streams are open is known only from the port-forward's audit watch
//! ([`PortForwardWatch`]): without the audit log nothing follows the SPDY session, and the
//! client gets the Close (1008, the message's first 123 bytes) alone.

use bytes::{Bytes, BytesMut};

use super::observe::{OpenForwards, PortForwardWatch};
use crate::session_stop::SessionStop;
use crate::spdy::frame::{FLAG_FIN, HEAD_LEN};

/// Most bytes of the proxy's frames sent as one WebSocket message.
const MESSAGE_BYTES: usize = 64 * 1024;

/// Where the upstream's SPDY frames begin and end in what has gone to the client (every frame,
/// control or data, is an 8-byte head whose last three bytes are the payload's length).
#[derive(Debug, Clone, Copy, Default)]
pub struct SpdyEdges {
    head: [u8; HEAD_LEN],
    /// Bytes of a head gathered so far.
    have: usize,
    /// Payload bytes of the current frame still to come.
    left: u32,
}

impl SpdyEdges {
    /// Whether what went so far ends between two frames.
    pub fn at_boundary(&self) -> bool {
        self.have == 0 && self.left == 0
    }

    /// Follows `bytes`, passed on to the client.
    pub fn follow(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            bytes = &bytes[self.step(bytes)..];
        }
    }

    /// How many of `bytes` finish the frame the client has begun: all of them when it does
    /// not end within them; none at a boundary.
    pub fn finishing(&self, bytes: &[u8]) -> usize {
        let mut edges = *self;
        let mut used = 0;
        while !edges.at_boundary() && used < bytes.len() {
            used += edges.step(&bytes[used..]);
        }
        used
    }

    /// Takes the next piece of `bytes` (part of a head, or of a payload); how much it took.
    fn step(&mut self, bytes: &[u8]) -> usize {
        if self.left > 0 {
            let take = bytes.len().min(self.left as usize);
            self.left -= take as u32;
            return take;
        }
        let take = bytes.len().min(HEAD_LEN - self.have);
        self.head[self.have..self.have + take].copy_from_slice(&bytes[..take]);
        self.have += take;
        if self.have == HEAD_LEN {
            self.have = 0;
            self.left = u32::from_be_bytes([0, self.head[5], self.head[6], self.head[7]]);
        }
        take
    }
}

/// Resolves once an operator terminated the session; never on a drain (which ends the tunnel
/// with its own Close) nor without a signal.
pub async fn operator_ended(stop: Option<&SessionStop>) {
    match stop {
        Some(stop) => {
            stop.stopped().await;
            if stop.termination().is_none() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}

/// The messages that tell the client's open connections that the session ended with
/// `message`: the proxy's frames, at most [`MESSAGE_BYTES`] a message (a connection's two
/// streams, 4,096 at most, are what the watch follows).
pub fn end_messages(watch: &PortForwardWatch, message: &str) -> Vec<Bytes> {
    let OpenForwards { errors, data } = watch.open_forwards();
    let mut messages = Vec::new();
    let mut out = BytesMut::new();
    let frames = errors
        .iter()
        .map(|&id| (id, message.as_bytes()))
        .chain(data.iter().map(|&id| (id, &b""[..])));
    for (stream, payload) in frames {
        if out.len() + HEAD_LEN + payload.len() > MESSAGE_BYTES && !out.is_empty() {
            messages.push(out.split().freeze());
        }
        data_fin(stream, payload, &mut out);
    }
    if !out.is_empty() {
        messages.push(out.freeze());
    }
    messages
}

/// A SPDY DATA frame with FIN: stream id (control bit clear), flags, 24-bit length, payload.
fn data_fin(stream: u32, payload: &[u8], out: &mut BytesMut) {
    // The message is the termination's, cut to 1 KiB: far below the 24-bit limit.
    let len = payload.len().min(0x00FF_FFFF);
    out.extend_from_slice(&(stream & 0x7FFF_FFFF).to_be_bytes());
    out.extend_from_slice(&[FLAG_FIN]);
    out.extend_from_slice(&(len as u32).to_be_bytes()[1..]);
    out.extend_from_slice(&payload[..len]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::observe::Direction;

    #[test]
    fn edges_follow_frames_however_they_are_cut() {
        // A DATA frame of 3 bytes, then a control frame with an empty payload.
        let frames = [
            0, 0, 0, 1, 0, 0, 0, 3, b'a', b'b', b'c', 0x80, 3, 0, 9, 0, 0, 0, 0,
        ];
        for cut in 0..frames.len() {
            let mut edges = SpdyEdges::default();
            edges.follow(&frames[..cut]);
            let boundary = matches!(cut, 0 | 11 | 19);
            assert_eq!(edges.at_boundary(), boundary, "cut at {cut}");
            let finish = edges.finishing(&frames[cut..]);
            let frame_end = [11, 19].into_iter().find(|&end| end > cut).unwrap_or(cut);
            let want = if boundary { 0 } else { frame_end - cut };
            assert_eq!(finish, want, "cut at {cut}");
            edges.follow(&frames[cut..cut + finish]);
            assert!(edges.at_boundary() || cut + finish == frames.len());
        }
    }

    #[test]
    fn every_open_connection_gets_the_message_and_its_data_ended() {
        use crate::spdy::codec::FrameEncoder;
        use crate::spdy::frame::{Frame, HeaderBlock, StreamId, SynStream};

        let watch = PortForwardWatch::new();
        let mut enc = FrameEncoder::new();
        let mut syn = |id: u32, kind: &str| {
            let mut headers = HeaderBlock::new();
            headers.push("streamtype", kind);
            headers.push("port", "80");
            headers.push("requestid", "0");
            let frame = Frame::SynStream(SynStream::new(StreamId::new(id), headers));
            let mut out = BytesMut::new();
            enc.encode(&frame, &mut out).unwrap();
            out
        };
        let (error, data) = (syn(1, "error"), syn(3, "data"));
        watch.relayed(Direction::ClientToUpstream, &error);
        watch.relayed(Direction::ClientToUpstream, &data);
        let messages = end_messages(&watch, "bye");
        assert_eq!(
            messages,
            [Bytes::from_static(&[
                0, 0, 0, 1, FLAG_FIN, 0, 0, 3, b'b', b'y', b'e', 0, 0, 0, 3, FLAG_FIN, 0, 0, 0
            ])]
        );
    }
}
