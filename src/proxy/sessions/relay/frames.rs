//! Where the frames a relay passes from the upstream to the client begin and end (SPDY/3.1 or
//! WebSocket), followed from their heads alone, payloads never read (but for the stream id a
//! SPDY frame that ends a stream names in its first four bytes, taken as part of its head). One [`FrameCursor`]
//! follows the relay's upstream-to-client bytes, and everything that adds frames of the
//! proxy's own asks it: keepalive pings ([`super::pings`]) go only between two frames,
//! and a relayed session under `--record=required` is ended between two frames with a Status
//! ([`super::ending`]).
//!
//! The cursor is shown only the bytes the client is sent. Under `--record=required` it never
//! lets a read end inside a frame head ([`FrameCursor::holding_heads`]: [`Followed::pass`]
//! stops before one), so whenever it is asked the client holds either whole frames or whole
//! heads and part of one frame's payload, whose declared length is known
//! ([`FrameCursor::owed`]). That length is what `--record=required` counts as ahead of the
//! recording the moment the head goes, so finishing the frame before the Status never passes
//! the bound. Otherwise ([`FrameCursor::new`]) every byte goes at once, a head split across
//! reads being gathered here.
//!
//! Tolerant of what a relay may carry: WebSocket reserved bits (an extension the two ends
//! agreed on) and masked frames are followed as they are. A head that cannot be a frame (a
//! reserved opcode, a 64-bit length with its top bit set) loses the stream for good, and a
//! WebSocket Close or a SPDY GOAWAY ends what may be added: nothing of ours ever goes after
//! the upstream began closing, or into a stream that is not understood. RFC 6455 §5.4 lets
//! control frames go between the fragments of a message, so every boundary takes a ping.

use crate::spdy::frame::{FLAG_FIN, HEAD_LEN};
use crate::translate::ws::frame::{FrameHead, OpCode, MAX_HEAD_LEN};

/// SPDY control frame types this follower looks at.
const SYN_REPLY: u16 = 2;
const RST_STREAM: u16 = 3;
const GOAWAY: u16 = 7;
const HEADERS: u16 = 8;
/// A SPDY head with the stream id of the control frame it starts.
const HEAD_WITH_STREAM: usize = HEAD_LEN + 4;
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

/// What following one read gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Followed {
    /// How much of the read may go to the client now: all of it, unless heads are held back
    /// and it ends inside one (the start of that head then waits for the rest of it).
    pub pass: usize,
    /// The last offset within `..pass` at which a frame of ours may go, if there is one.
    pub boundary: Option<usize>,
}

impl Followed {
    /// All of a read of `len` bytes goes, and no frame of ours goes into it (nothing follows
    /// its frames).
    pub fn whole(len: usize) -> Followed {
        Followed {
            pass: len,
            boundary: None,
        }
    }
}

/// What the head at the front of the bytes is.
enum Head {
    /// Followed: its length (of the part in these bytes, when it was begun in an earlier read).
    Whole(usize),
    /// Not all there yet.
    Partial,
    /// Cannot be a frame head.
    Lost,
}

/// The SPDY streams the upstream ended, in a fixed space (no allocation as the relay runs): by
/// FIN on a DATA, SYN_REPLY or HEADERS frame (its side of the stream is done), or by
/// RST_STREAM (the stream is gone both ways). spdystream ends a stream on each of these, so
/// nothing of ours goes on one afterwards.
#[derive(Debug, Clone, Copy)]
struct Finished {
    streams: [u32; MAX_FINISHED],
    len: usize,
}

impl Finished {
    fn contains(&self, stream: u32) -> bool {
        self.streams[..self.len].contains(&stream)
    }

    /// Remembers `stream`, unless it is known or the space is full.
    fn add(&mut self, stream: u32) {
        if self.len < MAX_FINISHED && !self.contains(stream) {
            self.streams[self.len] = stream;
            self.len += 1;
        }
    }
}

/// Follows the frames of one direction of a relay (the upstream's, towards the client).
/// `Copy` and allocation-free: the relay keeps the frames as the client has them and goes
/// back to that when a read it followed is not passed on after all.
#[derive(Debug, Clone, Copy)]
pub struct FrameCursor {
    framing: Framing,
    state: State,
    /// Whether a read may not end inside a head ([`FrameCursor::holding_heads`]).
    holds_heads: bool,
    /// The head being gathered, when one is split across reads (never when heads are held).
    head: [u8; MAX_HEAD_LEN],
    /// Bytes of it gathered so far.
    have: usize,
    /// Payload bytes of the frame whose head has been passed on, still to come.
    owed: u64,
    /// WebSocket: a data message has begun and not ended (its next frames are its fragments).
    in_message: bool,
    /// SPDY: the streams the upstream ended.
    finished: Finished,
}

impl FrameCursor {
    /// A cursor at the start of a stream framed as `framing` that passes every byte on at
    /// once, gathering a head split across reads.
    pub fn new(framing: Framing) -> FrameCursor {
        FrameCursor {
            framing,
            state: State::Following,
            holds_heads: false,
            head: [0; MAX_HEAD_LEN],
            have: 0,
            owed: 0,
            in_message: false,
            finished: Finished {
                streams: [0; MAX_FINISHED],
                len: 0,
            },
        }
    }

    /// A cursor that never lets a read end inside a frame head (`--record=required`): the
    /// client is only ever sent whole heads, so the declared length of every frame it has
    /// begun is known.
    pub fn holding_heads(framing: Framing) -> FrameCursor {
        FrameCursor {
            holds_heads: true,
            ..FrameCursor::new(framing)
        }
    }

    /// How the stream is framed.
    pub fn framing(&self) -> Framing {
        self.framing
    }

    /// Follows the next bytes going to the client: how many may go now, and the last
    /// boundary among them. A stream it cannot follow is passed on whole, with no boundary.
    pub fn follow(&mut self, bytes: &[u8]) -> Followed {
        let mut boundary = self.at_boundary().then_some(0);
        let mut at = 0;
        while at < bytes.len() {
            if self.owed > 0 {
                at += self.complete(&bytes[at..]);
            } else {
                match self.head(&bytes[at..]) {
                    Head::Whole(len) => at += len,
                    Head::Partial if self.holds_heads => break,
                    Head::Partial => at = bytes.len(),
                    // A boundary before bytes we could not make sense of is no safer than the
                    // bytes themselves: none is offered.
                    Head::Lost => {
                        return Followed {
                            pass: bytes.len(),
                            boundary: None,
                        }
                    }
                }
            }
            if self.at_boundary() {
                boundary = Some(at);
            }
        }
        Followed { pass: at, boundary }
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
        self.state == State::Following && self.owed == 0 && self.have == 0
    }

    /// Whether the stream can no longer take frames of ours (closing, or not understood).
    pub fn stopped(&self) -> bool {
        self.state != State::Following
    }

    /// WebSocket: whether a data message is unfinished (a message of ours cannot go between
    /// its fragments).
    pub fn in_message(&self) -> bool {
        self.in_message
    }

    /// SPDY: whether the upstream ended `stream`.
    pub fn finished(&self, stream: u32) -> bool {
        self.finished.contains(stream)
    }

    /// Follows the head at the front of `bytes` (at a boundary), with what was gathered of it
    /// from earlier reads.
    fn head(&mut self, bytes: &[u8]) -> Head {
        if self.state == State::Lost {
            return Head::Lost;
        }
        let take = (MAX_HEAD_LEN - self.have).min(bytes.len());
        self.head[self.have..self.have + take].copy_from_slice(&bytes[..take]);
        let gathered = self.have + take;
        let head = match self.framing {
            Framing::Spdy => self.spdy_head(gathered),
            Framing::WebSocket => self.websocket_head(gathered),
        };
        match head {
            Head::Whole(len) => {
                let begun = std::mem::take(&mut self.have);
                Head::Whole(len - begun)
            }
            Head::Partial if !self.holds_heads => {
                self.have = gathered;
                Head::Partial
            }
            Head::Partial => Head::Partial,
            Head::Lost => {
                self.state = State::Lost;
                Head::Lost
            }
        }
    }

    /// The SPDY head in `self.head[..gathered]`: 8 bytes, or 12 for a control frame that ends
    /// a stream (SYN_REPLY or HEADERS with FIN, RST_STREAM), whose stream id is read with it.
    fn spdy_head(&mut self, gathered: usize) -> Head {
        if gathered < HEAD_LEN {
            return Head::Partial;
        }
        let head = &self.head;
        let length = u32::from_be_bytes([0, head[5], head[6], head[7]]);
        let fin = head[4] & FLAG_FIN != 0;
        if head[0] & 0x80 == 0 {
            if fin {
                self.finished.add(stream_id(&head[..4]));
            }
            self.owed = u64::from(length);
            return Head::Whole(HEAD_LEN);
        }
        let ty = u16::from_be_bytes([head[2], head[3]]);
        let ends_stream = match ty {
            RST_STREAM => true,
            SYN_REPLY | HEADERS => fin,
            _ => false,
        };
        // A frame too short to name its stream is the peer's error, not a longer head.
        if ends_stream && length >= 4 {
            if gathered < HEAD_WITH_STREAM {
                return Head::Partial;
            }
            self.finished
                .add(stream_id(&head[HEAD_LEN..HEAD_WITH_STREAM]));
            self.owed = u64::from(length - 4);
            return Head::Whole(HEAD_WITH_STREAM);
        }
        if ty == GOAWAY {
            self.state = State::Closing;
        }
        self.owed = u64::from(length);
        Head::Whole(HEAD_LEN)
    }

    /// The WebSocket head in `self.head[..gathered]`.
    fn websocket_head(&mut self, gathered: usize) -> Head {
        let mut head = self.head;
        // The reserved bits belong to an extension the ends agreed on; the length does not
        // depend on them.
        head[0] &= !0x70;
        match FrameHead::parse(&head[..gathered]) {
            Ok(Some(frame)) => {
                self.owed = frame.len;
                match frame.opcode {
                    OpCode::Close => self.state = State::Closing,
                    op if op.is_control() => {}
                    _ => self.in_message = !frame.fin,
                }
                Head::Whole(frame.head_len)
            }
            Ok(None) => Head::Partial,
            Err(_) => Head::Lost,
        }
    }
}

/// A 31-bit SPDY stream id from its four bytes (the top bit is the control bit or reserved).
fn stream_id(bytes: &[u8]) -> u32 {
    u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) & 0x7FFF_FFFF
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

    /// A cursor as under `--record=required`.
    fn holding(framing: Framing) -> FrameCursor {
        FrameCursor::holding_heads(framing)
    }

    /// A WebSocket cursor that passes every byte on (as for keepalive pings alone).
    fn websocket() -> FrameCursor {
        FrameCursor::new(Framing::WebSocket)
    }

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
    fn a_read_never_ends_inside_a_spdy_head() {
        let mut c = holding(Framing::Spdy);
        let mut stream = spdy_data(3, false, b"hello");
        stream.extend(spdy_data(5, true, b"bye"));
        // The first frame and 3 bytes of the second one's head.
        assert_eq!(c.follow(&stream[..16]).pass, 13);
        assert!(c.at_boundary());
        // The rest of the head and one payload byte: 2 payload bytes owed.
        assert_eq!(c.follow(&stream[13..22]).pass, 9);
        assert_eq!(c.owed(), 2);
        assert!(!c.at_boundary());
        assert!(c.finished(5) && !c.finished(3));
        assert_eq!(c.complete(&stream[22..]), 2);
        assert!(c.at_boundary());
    }

    #[test]
    fn a_spdy_head_split_across_reads_is_gathered_when_heads_are_not_held() {
        let mut c = FrameCursor::new(Framing::Spdy);
        let mut stream = spdy_data(3, false, b"hello");
        stream.extend(spdy_data(5, true, b"bye"));
        let first = c.follow(&stream[..16]);
        assert_eq!(
            first,
            Followed {
                pass: 16,
                boundary: Some(13)
            }
        );
        assert!(!c.at_boundary());
        assert_eq!(
            c.follow(&stream[16..]),
            Followed {
                pass: 8,
                boundary: Some(8)
            }
        );
        assert!(c.finished(5) && c.at_boundary());
    }

    #[test]
    fn the_spdy_streams_remembered_are_bounded() {
        let mut c = holding(Framing::Spdy);
        for stream in 1..=(MAX_FINISHED as u32 + 4) {
            let fin = spdy_data(stream, true, b"");
            assert_eq!(c.follow(&fin).pass, fin.len());
            // Twice: remembered once.
            c.follow(&fin);
        }
        assert!(c.finished(1) && c.finished(MAX_FINISHED as u32));
        assert!(!c.finished(MAX_FINISHED as u32 + 1));
    }

    fn spdy_control(ty: u16, flags: u8, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0x80, 3];
        f.extend_from_slice(&ty.to_be_bytes());
        f.push(flags);
        f.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
        f.extend_from_slice(payload);
        f
    }

    /// The frames of [`spdy_streams_end_by_fin_on_any_frame_and_by_rst_stream`]: stream 1
    /// answered, 3 answered and ended, 5 ended by HEADERS, 7 reset, 9 given headers, 11 data.
    fn ending_frames() -> (Vec<u8>, Vec<usize>) {
        let mut bytes = Vec::new();
        let mut ends = vec![0];
        for frame in [
            spdy_control(SYN_REPLY, 0, &[0, 0, 0, 1, 0x78, 0xF9]),
            spdy_control(SYN_REPLY, FLAG_FIN, &[0, 0, 0, 3, 1, 2, 3]),
            spdy_control(HEADERS, FLAG_FIN, &[0, 0, 0, 5, 9]),
            spdy_control(RST_STREAM, 0, &[0, 0, 0, 7, 0, 0, 0, 5]),
            spdy_control(HEADERS, 0, &[0, 0, 0, 9, 9]),
            spdy_data(11, false, b"x"),
        ] {
            bytes.extend(frame);
            ends.push(bytes.len());
        }
        (bytes, ends)
    }

    fn assert_ended(c: &FrameCursor) {
        for (id, ended) in [
            (1, false),
            (3, true),
            (5, true),
            (7, true),
            (9, false),
            (11, false),
        ] {
            assert_eq!(c.finished(id), ended, "stream {id}");
        }
    }

    #[test]
    fn spdy_streams_end_by_fin_on_any_frame_and_by_rst_stream() {
        let (bytes, _) = ending_frames();
        for mut c in [FrameCursor::new(Framing::Spdy), holding(Framing::Spdy)] {
            assert_eq!(
                c.follow(&bytes),
                Followed {
                    pass: bytes.len(),
                    boundary: Some(bytes.len())
                }
            );
            assert_ended(&c);
        }
        // Byte by byte: the stream id is gathered with the head.
        let mut c = FrameCursor::new(Framing::Spdy);
        for b in &bytes {
            assert_eq!(c.follow(std::slice::from_ref(b)).pass, 1);
        }
        assert_ended(&c);
        assert!(c.at_boundary());
    }

    #[test]
    fn a_read_never_ends_inside_the_stream_id_of_a_frame_that_ends_a_stream() {
        let rst = spdy_control(RST_STREAM, 0, &[0, 0, 0, 7, 0, 0, 0, 5]);
        for cut in 1..12 {
            let mut c = holding(Framing::Spdy);
            assert_eq!(c.follow(&rst[..cut]).pass, 0, "cut at {cut}");
            assert!(!c.finished(7));
        }
        let mut c = holding(Framing::Spdy);
        assert_eq!(c.follow(&rst[..13]).pass, 13);
        assert!(c.finished(7));
        assert_eq!(c.owed(), 3);
        assert!(!c.at_boundary());
        assert_eq!(c.complete(&rst[13..]), 3);
        assert!(c.at_boundary());
        // A SYN_REPLY without FIN ends nothing: its head is the usual 8 bytes.
        let reply = spdy_control(SYN_REPLY, 0, &[0, 0, 0, 1]);
        let mut c = holding(Framing::Spdy);
        assert_eq!(c.follow(&reply[..9]).pass, 9);
        assert_eq!(c.owed(), 3);
    }

    #[test]
    fn a_control_frame_too_short_to_name_its_stream_is_followed_by_its_length() {
        let mut bytes = spdy_control(RST_STREAM, 0, &[0, 7]);
        bytes.extend(spdy_data(3, true, b"ok"));
        let mut c = holding(Framing::Spdy);
        assert_eq!(
            c.follow(&bytes),
            Followed {
                pass: bytes.len(),
                boundary: Some(bytes.len())
            }
        );
        assert!(c.finished(3) && !c.finished(7));
    }

    #[test]
    fn a_spdy_goaway_ends_what_may_be_added() {
        let mut c = holding(Framing::Spdy);
        let goaway = [0x80, 3, 0, 7, 0, 0, 0, 8, 0, 0, 0, 1, 0, 0, 0, 0];
        assert_eq!(
            c.follow(&goaway),
            Followed {
                pass: goaway.len(),
                boundary: Some(0)
            }
        );
        assert!(!c.at_boundary() && c.stopped());
    }

    #[test]
    fn websocket_heads_of_every_length_are_waited_for() {
        let mut c = holding(Framing::WebSocket);
        // A 300-byte binary frame (16-bit length), then a 70000-byte one (64-bit length).
        let mut s = vec![0x82, 126, 0x01, 0x2c];
        s.extend(vec![1u8; 300]);
        s.extend([0x82, 127, 0, 0, 0, 0, 0, 1, 0x11, 0x70]);
        assert_eq!(c.follow(&s[..3]).pass, 0);
        assert_eq!(c.follow(&s[..10]).pass, 10);
        assert_eq!(c.owed(), 294);
        assert_eq!(c.follow(&s[10..310]).pass, 294);
        assert!(c.at_boundary());
        assert_eq!(c.follow(&s[304..]).pass, 10);
        assert_eq!(c.owed(), 70_000);
    }

    #[test]
    fn websocket_fragments_and_close_are_followed() {
        let mut c = holding(Framing::WebSocket);
        // A first fragment, a ping between fragments, the last fragment.
        assert_eq!(c.follow(&[0x02, 1, 1]).pass, 3);
        assert!(c.in_message() && c.at_boundary());
        assert_eq!(c.follow(&[0x89, 0]).pass, 2);
        assert!(c.in_message());
        assert_eq!(c.follow(&[0x80, 1, b'x']).pass, 3);
        assert!(!c.in_message());
        assert_eq!(c.follow(&[0x88, 2, 3, 0xe8]).pass, 4);
        assert!(!c.at_boundary());
    }

    #[test]
    fn a_stream_that_is_not_websocket_is_passed_on_and_never_added_to() {
        let mut c = holding(Framing::WebSocket);
        assert_eq!(c.follow(&[0x83, 0, 1, 2]).pass, 4);
        assert!(!c.at_boundary());
        assert_eq!(c.follow(&[9, 9]).pass, 2);
    }

    #[test]
    fn boundaries_of_whole_frames_in_one_read() {
        let mut f = websocket();
        assert!(f.at_boundary());
        let mut bytes = frame(0x82, b"\x01hello");
        let first = bytes.len();
        bytes.extend(frame(0x82, &[7u8; 300]));
        assert_eq!(f.follow(&bytes).boundary, Some(bytes.len()));
        assert!(f.at_boundary());
        // Mid-second-frame: the last boundary is after the first.
        let mut f = websocket();
        assert_eq!(f.follow(&bytes[..first + 10]).boundary, Some(first));
        assert!(!f.at_boundary());
        assert_eq!(
            f.follow(&bytes[first + 10..]).boundary,
            Some(bytes.len() - first - 10)
        );
    }

    #[test]
    fn a_read_inside_one_payload_has_no_boundary() {
        let bytes = frame(0x82, &[1u8; 70_000]);
        let mut f = websocket();
        assert_eq!(f.follow(&bytes[..100]).boundary, Some(0));
        assert_eq!(f.follow(&bytes[100..50_000]).boundary, None);
        assert_eq!(
            f.follow(&bytes[50_000..]).boundary,
            Some(bytes.len() - 50_000)
        );
    }

    #[test]
    fn headers_split_across_reads_byte_by_byte() {
        // 64-bit length header (10 bytes), then a 16-bit one.
        let mut bytes = frame(0x82, &[3u8; 70_000]);
        let second = bytes.len();
        bytes.extend(frame(0x02, &[4u8; 200]));
        bytes.extend(frame(0x80, b"end"));
        let mut f = websocket();
        let mut boundaries = Vec::new();
        for (i, b) in bytes.iter().enumerate() {
            let followed = f.follow(std::slice::from_ref(b));
            assert_eq!(followed.pass, 1);
            if followed.boundary == Some(1) {
                boundaries.push(i + 1);
            }
        }
        assert_eq!(boundaries, [second, second + 4 + 200, bytes.len()]);
    }

    #[test]
    fn empty_frames_and_control_frames_are_boundaries_too() {
        let mut bytes = frame(0x82, b"");
        bytes.extend(frame(0x8A, b"pong"));
        let mut f = websocket();
        assert_eq!(f.follow(&bytes[..2]).boundary, Some(2));
        assert_eq!(f.follow(&bytes[2..]).boundary, Some(bytes.len() - 2));
    }

    #[test]
    fn nothing_goes_in_after_a_close_frame() {
        let mut bytes = frame(0x82, b"\x01bye");
        let before_close = bytes.len();
        bytes.extend(frame(0x88, &[0x03, 0xE8]));
        let mut f = websocket();
        assert_eq!(f.follow(&bytes).boundary, Some(before_close));
        assert!(f.stopped());
        assert!(!f.at_boundary());
        assert_eq!(f.follow(b"\x82\x00").boundary, None);
    }

    #[test]
    fn reserved_bits_and_masks_are_followed() {
        // permessage-deflate's RSV1 on a data frame; a masked frame (a client's, relayed).
        let mut bytes = frame(0xC2, b"compressed");
        let first = bytes.len();
        bytes.extend_from_slice(&[0x82, 0x83, 1, 2, 3, 4, 9, 9, 9]);
        let mut f = websocket();
        assert_eq!(f.follow(&bytes[..first + 3]).boundary, Some(first));
        assert_eq!(
            f.follow(&bytes[first + 3..]).boundary,
            Some(bytes.len() - first - 3)
        );
        assert!(f.at_boundary());
    }

    #[test]
    fn a_stream_that_is_not_websocket_is_given_up() {
        let mut f = websocket();
        // Opcode 3 is reserved.
        assert_eq!(
            f.follow(b"\x83\x00"),
            Followed {
                pass: 2,
                boundary: None
            }
        );
        assert!(f.stopped());
        assert_eq!(f.follow(b"\x82\x00").boundary, None);
        // A 64-bit length with its top bit set.
        let mut f = websocket();
        assert_eq!(
            f.follow(&[0x82, 127, 0x80, 0, 0, 0, 0, 0, 0, 0]).boundary,
            None
        );
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
            let mut f = websocket();
            let mut at = 0;
            let mut cut = cuts.iter().cycle();
            while at < bytes.len() {
                let n = (*cut.next().unwrap()).min(bytes.len() - at);
                let found = f.follow(&bytes[at..at + n]).boundary;
                let expected = ends.iter().rev().find(|&&e| e >= at && e <= at + n).map(|e| e - at);
                proptest::prop_assert_eq!(found, expected);
                at += n;
            }
            proptest::prop_assert!(f.at_boundary());
        }

        /// However the SPDY frames that end streams are cut into reads, the boundaries are
        /// exactly the frame ends and the same streams end; a cursor holding heads passes
        /// every byte once the reads are joined with what it held back.
        #[test]
        fn any_cutting_of_spdy_frames_finds_the_frame_ends_and_the_ended_streams(
            cuts in proptest::collection::vec(1usize..16, 1..20),
        ) {
            let (bytes, ends) = ending_frames();
            let mut free = FrameCursor::new(Framing::Spdy);
            let mut held = holding(Framing::Spdy);
            let (mut at, mut held_at) = (0, 0);
            let mut cut = cuts.iter().cycle();
            while at < bytes.len() {
                let n = (*cut.next().unwrap()).min(bytes.len() - at);
                let found = free.follow(&bytes[at..at + n]).boundary;
                let expected = ends.iter().rev().find(|&&e| e >= at && e <= at + n).map(|e| e - at);
                proptest::prop_assert_eq!(found, expected);
                at += n;
                held_at += held.follow(&bytes[held_at..at]).pass;
            }
            assert_ended(&free);
            assert_ended(&held);
            proptest::prop_assert_eq!(held_at, bytes.len());
        }

        /// Arbitrary bytes never panic it, and what it passes and its boundary are always
        /// within the bytes given.
        #[test]
        fn arbitrary_bytes_are_followed_without_panics(
            chunks in proptest::collection::vec(proptest::collection::vec(proptest::num::u8::ANY, 0..64), 0..16),
            spdy in proptest::bool::ANY,
            holds in proptest::bool::ANY,
        ) {
            let framing = if spdy { Framing::Spdy } else { Framing::WebSocket };
            let mut f = if holds { FrameCursor::holding_heads(framing) } else { FrameCursor::new(framing) };
            for c in &chunks {
                let followed = f.follow(c);
                proptest::prop_assert!(followed.pass <= c.len());
                if let Some(p) = followed.boundary {
                    proptest::prop_assert!(p <= followed.pass);
                }
            }
        }
    }
}
