//! Where the frames a relay passes from the upstream to the client begin and end (SPDY/3.1 or
//! WebSocket), followed from their heads alone, payloads never read: what a relayed session
//! under `--record=required` needs to end between two frames with a Status of its own.
//!
//! The cursor is shown only the bytes the client has been sent, and it never lets a read end
//! inside a frame head ([`FrameCursor::follow`] stops before one): so whenever it is asked,
//! the client holds either whole frames or whole heads and part of one frame's payload, whose
//! declared length is known ([`FrameCursor::owed`]). That length is what `--record=required`
//! counts as ahead of the recording the moment the head goes, so finishing the frame before
//! the Status never passes the bound.

use crate::spdy::frame::{FLAG_FIN, HEAD_LEN};
use crate::translate::ws::frame::{FrameHead, OpCode, MAX_HEAD_LEN};

/// SPDY control frame type of GOAWAY.
const GOAWAY: u16 = 7;
/// Most SPDY streams whose end is remembered (a remote-command session opens five).
const MAX_FINISHED: usize = 32;

/// How the relayed stream is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// SPDY/3.1: 8-byte heads, a 24-bit length.
    Spdy,
    /// RFC 6455 frames from a server.
    WebSocket,
}

/// Whether the frames can still be followed, and whether the upstream began ending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Following,
    /// The upstream sent a WebSocket Close or a SPDY GOAWAY: nothing of ours may follow.
    Closing,
    /// Not a frame stream as far as we can tell.
    Lost,
}

/// Follows the frames of one direction of a relay (the upstream's, towards the client).
#[derive(Debug, Clone)]
pub struct FrameCursor {
    framing: Framing,
    state: State,
    /// Payload bytes of the frame whose head has been passed on, still to come.
    owed: u64,
    /// WebSocket: a data message has begun and not ended (its next frames are its fragments).
    in_message: bool,
    /// SPDY: the streams the upstream ended (a DATA frame with FIN).
    finished: Vec<u32>,
}

impl FrameCursor {
    /// A cursor at the start of a stream framed as `framing`.
    pub fn new(framing: Framing) -> FrameCursor {
        FrameCursor {
            framing,
            state: State::Following,
            owed: 0,
            in_message: false,
            finished: Vec::new(),
        }
    }

    /// Follows as much of `bytes` as can be passed on now and returns how much that is: all
    /// of it, unless it ends inside a frame head, which is then left out (to go with the rest
    /// of the head). A stream it cannot follow is passed on whole.
    pub fn follow(&mut self, bytes: &[u8]) -> usize {
        let mut at = 0;
        while at < bytes.len() {
            if self.state == State::Lost {
                return bytes.len();
            }
            at += self.complete(&bytes[at..]);
            if at == bytes.len() {
                break;
            }
            match self.head(&bytes[at..]) {
                Some(len) => at += len,
                None => break,
            }
        }
        at
    }

    /// Follows the part of `bytes` that belongs to the frame already begun (its payload still
    /// owed to the client); returns its length, `0` at a boundary.
    pub fn complete(&mut self, bytes: &[u8]) -> usize {
        let take = self.owed.min(bytes.len() as u64);
        self.owed -= take;
        take as usize
    }

    /// Payload bytes of a frame the client has the head of and not all the rest: what must
    /// follow before anything of ours can.
    pub fn owed(&self) -> u64 {
        self.owed
    }

    /// Whether a frame of ours may go now: between two frames of a stream still followed and
    /// not ending.
    pub fn at_boundary(&self) -> bool {
        self.state == State::Following && self.owed == 0
    }

    /// WebSocket: whether a data message is unfinished (a message of ours cannot go between
    /// its fragments).
    pub fn in_message(&self) -> bool {
        self.in_message
    }

    /// SPDY: whether the upstream ended `stream`.
    pub fn finished(&self, stream: u32) -> bool {
        self.finished.contains(&stream)
    }

    /// Follows the head at the front of `bytes` (at a boundary): its length, or `None` while
    /// it is incomplete.
    fn head(&mut self, bytes: &[u8]) -> Option<usize> {
        match self.framing {
            Framing::Spdy => self.spdy_head(bytes),
            Framing::WebSocket => self.websocket_head(bytes),
        }
    }

    fn spdy_head(&mut self, bytes: &[u8]) -> Option<usize> {
        let head = bytes.get(..HEAD_LEN)?;
        self.owed = u64::from(u32::from_be_bytes([0, head[5], head[6], head[7]]));
        if head[0] & 0x80 != 0 {
            if u16::from_be_bytes([head[2], head[3]]) == GOAWAY {
                self.state = State::Closing;
            }
        } else if head[4] & FLAG_FIN != 0 {
            let stream = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
            if !self.finished.contains(&stream) && self.finished.len() < MAX_FINISHED {
                self.finished.push(stream);
            }
        }
        Some(HEAD_LEN)
    }

    fn websocket_head(&mut self, bytes: &[u8]) -> Option<usize> {
        let mut head = [0u8; MAX_HEAD_LEN];
        let n = bytes.len().min(MAX_HEAD_LEN);
        head[..n].copy_from_slice(&bytes[..n]);
        // The reserved bits belong to an extension the ends agreed on; the length does not
        // depend on them.
        head[0] &= !0x70;
        match FrameHead::parse(&head[..n]) {
            Ok(Some(frame)) => {
                self.owed = frame.len;
                match frame.opcode {
                    OpCode::Close => self.state = State::Closing,
                    op if op.is_control() => {}
                    _ => self.in_message = !frame.fin,
                }
                Some(frame.head_len)
            }
            Ok(None) => None,
            Err(_) => {
                self.state = State::Lost;
                Some(bytes.len())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spdy_data(stream: u32, fin: bool, payload: &[u8]) -> Vec<u8> {
        let mut f = stream.to_be_bytes().to_vec();
        f.push(if fin { FLAG_FIN } else { 0 });
        f.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn a_read_never_ends_inside_a_spdy_head() {
        let mut c = FrameCursor::new(Framing::Spdy);
        let mut stream = spdy_data(3, false, b"hello");
        stream.extend(spdy_data(5, true, b"bye"));
        // The first frame and 3 bytes of the second one's head.
        assert_eq!(c.follow(&stream[..16]), 13);
        assert!(c.at_boundary());
        // The rest of the head and one payload byte: 2 payload bytes owed.
        assert_eq!(c.follow(&stream[13..22]), 9);
        assert_eq!(c.owed(), 2);
        assert!(!c.at_boundary());
        assert!(c.finished(5) && !c.finished(3));
        assert_eq!(c.complete(&stream[22..]), 2);
        assert!(c.at_boundary());
    }

    #[test]
    fn a_spdy_goaway_ends_what_may_be_added() {
        let mut c = FrameCursor::new(Framing::Spdy);
        let goaway = [0x80, 3, 0, 7, 0, 0, 0, 8, 0, 0, 0, 1, 0, 0, 0, 0];
        assert_eq!(c.follow(&goaway), goaway.len());
        assert!(!c.at_boundary());
    }

    #[test]
    fn websocket_heads_of_every_length_are_waited_for() {
        let mut c = FrameCursor::new(Framing::WebSocket);
        // A 300-byte binary frame (16-bit length), then a 70000-byte one (64-bit length).
        let mut s = vec![0x82, 126, 0x01, 0x2c];
        s.extend(vec![1u8; 300]);
        s.extend([0x82, 127, 0, 0, 0, 0, 0, 1, 0x11, 0x70]);
        assert_eq!(c.follow(&s[..3]), 0);
        assert_eq!(c.follow(&s[..10]), 10);
        assert_eq!(c.owed(), 294);
        assert_eq!(c.follow(&s[10..310]), 294);
        assert!(c.at_boundary());
        assert_eq!(c.follow(&s[304..]), 10);
        assert_eq!(c.owed(), 70_000);
    }

    #[test]
    fn websocket_fragments_and_close_are_followed() {
        let mut c = FrameCursor::new(Framing::WebSocket);
        // A first fragment, a ping between fragments, the last fragment.
        assert_eq!(c.follow(&[0x02, 1, 1]), 3);
        assert!(c.in_message() && c.at_boundary());
        assert_eq!(c.follow(&[0x89, 0]), 2);
        assert!(c.in_message());
        assert_eq!(c.follow(&[0x80, 1, b'x']), 3);
        assert!(!c.in_message());
        assert_eq!(c.follow(&[0x88, 2, 3, 0xe8]), 4);
        assert!(!c.at_boundary());
    }

    #[test]
    fn a_stream_that_is_not_websocket_is_passed_on_and_never_added_to() {
        let mut c = FrameCursor::new(Framing::WebSocket);
        assert_eq!(c.follow(&[0x83, 0, 1, 2]), 4);
        assert!(!c.at_boundary());
        assert_eq!(c.follow(&[9, 9]), 2);
    }
}
