//! Following a relayed legacy WebSocket remote-command session (PROTOCOL.md §1): every message
//! starts with its channel (0 stdin, 1 stdout, 2 stderr, 3 error, 4 resize), as a byte in
//! binary messages or as an ASCII digit before a base64 payload in text messages (the
//! `base64.` protocols). Client frames are masked; messages may be fragmented, with control
//! frames between the fragments.
//!
//! Followed for the error stream alone ([`Scope::ErrorStream`]), a message is looked at only
//! as far as its channel (the first byte of its first non-empty fragment, unmasked on its own):
//! the payload of every message but the upstream's on the error channel passes by uncopied,
//! from the frame heads alone, and so does everything the client sends.

use base64::Engine;
use bytes::{Bytes, BytesMut};

use super::port_forward::ChannelForwards;
use super::{Direction, ObserveError, Observed, Scope, MAX_FRAME};
use crate::audit::port_forward::PortForwardReport;
use crate::translate::channel::Channel;
use crate::translate::resize::ResizeDecoder;
use crate::translate::ws::frame::{FrameHead, OpCode};
use crate::translate::ws::mask::apply_mask;

/// How a channel protocol writes its messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WebSocketFraming {
    /// `channel.k8s.io`, `v2.`…`v5.channel.k8s.io`: binary messages, channel byte first.
    Binary,
    /// `base64.channel.k8s.io`, `v4.base64.channel.k8s.io`: text messages, channel digit
    /// first, then the payload in standard base64.
    Base64,
}

impl WebSocketFraming {
    /// The framing of a negotiated subprotocol; `None` for one that is not a remote-command
    /// channel protocol.
    pub fn from_subprotocol(name: &str) -> Option<WebSocketFraming> {
        match name {
            "channel.k8s.io" | "v2.channel.k8s.io" | "v3.channel.k8s.io" | "v4.channel.k8s.io"
            | "v5.channel.k8s.io" => Some(WebSocketFraming::Binary),
            "base64.channel.k8s.io" | "v4.base64.channel.k8s.io" => Some(WebSocketFraming::Base64),
            _ => None,
        }
    }
}

/// One direction: the frame being received and the message being assembled.
#[derive(Debug, Default)]
struct Side {
    /// The bytes of the frame at the front, head included, until it is whole.
    frame: BytesMut,
    /// The fragments so far of an unfinished data message.
    message: BytesMut,
    /// Whether a data message is unfinished (its first fragment came, its last did not).
    in_message: bool,
    /// Error stream only: payload bytes of the frame at the front still to pass by unread.
    skip: u64,
    /// Error stream only: the unfinished message is not the error channel's (its fragments
    /// pass by unread).
    skipping_message: bool,
}

/// What [`Scope::ErrorStream`] does with a data frame whose head has come.
enum Verdict {
    /// Take it whole, as every frame is taken under [`Scope::Everything`].
    Keep,
    /// Its message's channel is in its first payload byte, not here yet.
    Peek,
    /// Pass its payload by.
    Skip,
}

/// Follows both directions of a relayed legacy WebSocket session.
#[derive(Debug)]
pub struct WebSocketObserver {
    framing: WebSocketFraming,
    scope: Scope,
    client: Side,
    upstream: Side,
    resize: ResizeDecoder,
    /// Set for a legacy port-forward: its channels are followed there instead.
    forwards: Option<Box<ChannelForwards>>,
}

impl WebSocketObserver {
    /// An observer of a session that has not sent a frame yet.
    pub fn new(framing: WebSocketFraming) -> WebSocketObserver {
        WebSocketObserver::with_scope(framing, Scope::Everything)
    }

    /// An observer of a remote-command session that looks at as much as `scope` says.
    pub fn with_scope(framing: WebSocketFraming, scope: Scope) -> WebSocketObserver {
        WebSocketObserver {
            framing,
            scope,
            client: Side::default(),
            upstream: Side::default(),
            resize: ResizeDecoder::new(),
            forwards: None,
        }
    }

    /// An observer of a legacy WebSocket port-forward (PROTOCOL.md §2.2): it reports each
    /// port's bytes ([`WebSocketObserver::port_forwards`]) and yields no [`Observed`] events.
    pub fn port_forward(framing: WebSocketFraming) -> WebSocketObserver {
        WebSocketObserver {
            forwards: Some(Box::default()),
            ..WebSocketObserver::new(framing)
        }
    }

    /// What a port-forward observer has seen so far; `None` for a remote-command one.
    pub fn port_forwards(&self) -> Option<PortForwardReport> {
        self.forwards.as_deref().map(ChannelForwards::report)
    }

    /// Follows `bytes` relayed in `direction`, appending what whole messages carried to
    /// `out`.
    /// Bytes relayed in `direction` not reported yet: the unfinished frame and the earlier
    /// fragments of an unfinished message.
    pub fn held(&self, direction: Direction) -> usize {
        let side = match direction {
            Direction::ClientToUpstream => &self.client,
            Direction::UpstreamToClient => &self.upstream,
        };
        side.frame.len() + side.message.len()
    }

    pub fn feed(
        &mut self,
        direction: Direction,
        bytes: &[u8],
        out: &mut Vec<Observed>,
    ) -> Result<(), ObserveError> {
        let framing = self.framing;
        let error_only = self.scope == Scope::ErrorStream && self.forwards.is_none();
        let resize = &mut self.resize;
        let mut forwards = self.forwards.as_deref_mut();
        let side = match direction {
            Direction::ClientToUpstream => &mut self.client,
            Direction::UpstreamToClient => &mut self.upstream,
        };
        let mut bytes = bytes;
        loop {
            if side.skip > 0 {
                let take = side.skip.min(bytes.len() as u64);
                side.skip -= take;
                bytes = &bytes[take as usize..];
                if side.skip > 0 || bytes.is_empty() {
                    return Ok(());
                }
            }
            let head = FrameHead::parse(&side.frame)
                .map_err(|e| ObserveError::WebSocket(e.to_string()))?;
            // Take in no more than the frame at the front needs: its head (2 to 14 bytes, as
            // its first two tell), then exactly its payload.
            let want = match head {
                None => head_bytes_wanted(&side.frame),
                Some(head) => {
                    if !head.opcode.is_control() {
                        // Before the payload: a frame out of order is not worth taking in.
                        check_order(side, &head)?;
                    }
                    if error_only && !head.opcode.is_control() {
                        match verdict(framing, side, direction, &head)? {
                            Verdict::Keep => {}
                            Verdict::Peek => {
                                let Some((&first, rest)) = bytes.split_first() else {
                                    return Ok(());
                                };
                                side.frame.extend_from_slice(&[first]);
                                bytes = rest;
                                continue;
                            }
                            Verdict::Skip => {
                                let seen = (side.frame.len() - head.head_len) as u64;
                                side.skip = head.len - seen;
                                side.frame.clear();
                                side.message.clear();
                                side.in_message = !head.fin;
                                side.skipping_message = !head.fin;
                                continue;
                            }
                        }
                    }
                    let total = head.len.saturating_add(head.head_len as u64);
                    if total > MAX_FRAME as u64 {
                        return Err(ObserveError::TooLarge(total));
                    }
                    total as usize - side.frame.len()
                }
            };
            let take = want.min(bytes.len());
            side.frame.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if take < want {
                return Ok(());
            }
            if let Some(head) = head {
                let mut payload = side.frame.split_off(head.head_len);
                side.frame.clear();
                if let Some(key) = head.mask {
                    apply_mask(&mut payload, key);
                }
                if let Some(message) = Self::assemble(side, head, payload)? {
                    match forwards.as_deref_mut() {
                        Some(forwards) => {
                            dispatch_forwards(framing, forwards, direction, &message)?
                        }
                        None => dispatch(framing, resize, direction, message, out)?,
                    }
                }
                if bytes.is_empty() {
                    return Ok(());
                }
            }
        }
    }

    /// Adds a whole frame to the message it belongs to; the message once it is complete.
    fn assemble(
        side: &mut Side,
        head: FrameHead,
        payload: BytesMut,
    ) -> Result<Option<BytesMut>, ObserveError> {
        match head.opcode {
            // Close, ping and pong carry nothing of the session's streams.
            op if op.is_control() => Ok(None),
            // `check_order` saw to it that it belongs to a message.
            OpCode::Continuation => {
                if side.message.len() + payload.len() > MAX_FRAME {
                    return Err(ObserveError::TooLarge(
                        (side.message.len() + payload.len()) as u64,
                    ));
                }
                side.message.extend_from_slice(&payload);
                if head.fin {
                    side.in_message = false;
                    Ok(Some(std::mem::take(&mut side.message)))
                } else {
                    Ok(None)
                }
            }
            _ => {
                if head.fin {
                    Ok(Some(payload))
                } else {
                    side.in_message = true;
                    side.message = payload;
                    Ok(None)
                }
            }
        }
    }
}

/// How many more bytes the incomplete frame head at the front of `frame` needs, as far as
/// its first two bytes tell (the length's size and the mask bit): never a payload byte.
fn head_bytes_wanted(frame: &[u8]) -> usize {
    let [_, b1, ..] = *frame else {
        return 2 - frame.len();
    };
    let length = match b1 & 0x7F {
        126 => 2,
        127 => 8,
        _ => 0,
    };
    let mask: usize = if b1 & 0x80 != 0 { 4 } else { 0 };
    (2 + length + mask).saturating_sub(frame.len()).max(1)
}

/// Whether the data frame whose head is `head` may come now: a continuation inside a
/// message, a new message outside one.
fn check_order(side: &Side, head: &FrameHead) -> Result<(), ObserveError> {
    match (head.opcode == OpCode::Continuation, side.in_message) {
        (true, false) => Err(ObserveError::WebSocket(
            "a continuation frame outside a message".into(),
        )),
        (false, true) => Err(ObserveError::WebSocket(
            "a new message before the last one ended".into(),
        )),
        _ => Ok(()),
    }
}

/// Under [`Scope::ErrorStream`]: whether the data frame at the front of `side`, whose head
/// is `head` (and perhaps its first payload byte after it), is taken whole or passed by. Its
/// order has been checked.
fn verdict(
    framing: WebSocketFraming,
    side: &Side,
    direction: Direction,
    head: &FrameHead,
) -> Result<Verdict, ObserveError> {
    let continuation = head.opcode == OpCode::Continuation;
    if continuation && side.skipping_message {
        return Ok(Verdict::Skip);
    }
    // A message with bytes gathered already is the error channel's.
    if continuation && !side.message.is_empty() {
        return Ok(Verdict::Keep);
    }
    // The client sends nothing on the error channel.
    if direction == Direction::ClientToUpstream {
        return Ok(Verdict::Skip);
    }
    // An empty fragment says nothing of the channel and costs nothing to take.
    if head.len == 0 {
        return Ok(Verdict::Keep);
    }
    let Some(&first) = side.frame.get(head.head_len) else {
        return Ok(Verdict::Peek);
    };
    // The frame's first payload byte is at key position 0.
    let first = first ^ head.mask.map_or(0, |key| key[0]);
    let error = match framing {
        WebSocketFraming::Binary => Channel::from_byte(first) == Some(Channel::Error),
        WebSocketFraming::Base64 => {
            first.checked_sub(b'0').and_then(Channel::from_byte) == Some(Channel::Error)
        }
    };
    Ok(if error { Verdict::Keep } else { Verdict::Skip })
}

/// Counts a whole message of a legacy port-forward on its channel.
fn dispatch_forwards(
    framing: WebSocketFraming,
    forwards: &mut ChannelForwards,
    direction: Direction,
    message: &[u8],
) -> Result<(), ObserveError> {
    let Some((&first, rest)) = message.split_first() else {
        return Ok(());
    };
    match framing {
        WebSocketFraming::Binary => forwards.message(direction, first, rest),
        WebSocketFraming::Base64 => {
            // The channel as a character from '0' on (':' is 10, and so on).
            let Some(channel) = first.checked_sub(b'0') else {
                return Ok(());
            };
            // The kubelet drops a message that is not base64 (and forwards nothing of it).
            let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(rest) else {
                return Ok(());
            };
            forwards.message(direction, channel, &decoded);
        }
    }
    Ok(())
}

/// Says what a whole message carried.
fn dispatch(
    framing: WebSocketFraming,
    resize: &mut ResizeDecoder,
    direction: Direction,
    message: BytesMut,
    out: &mut Vec<Observed>,
) -> Result<(), ObserveError> {
    let Some((&first, rest)) = message.split_first() else {
        return Ok(());
    };
    let (channel, payload) = match framing {
        WebSocketFraming::Binary => {
            let mut message = message.freeze();
            (Channel::from_byte(first), message.split_off(1))
        }
        WebSocketFraming::Base64 => {
            let channel = first.checked_sub(b'0').and_then(Channel::from_byte);
            if channel.is_none() || rest.is_empty() {
                return Ok(());
            }
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(rest)
                .map_err(|e| ObserveError::Base64(e.to_string()))?;
            (channel, Bytes::from(decoded))
        }
    };
    // The channel's opening message (its number alone) carries nothing.
    if payload.is_empty() {
        return Ok(());
    }
    match (direction, channel) {
        (Direction::ClientToUpstream, Some(Channel::Stdin)) => out.push(Observed::Stdin(payload)),
        (Direction::ClientToUpstream, Some(Channel::Resize)) => {
            let sizes = resize
                .push(&payload)
                .map_err(|e| ObserveError::Resize(e.to_string()))?;
            out.extend(sizes.into_iter().map(Observed::Resize));
        }
        (Direction::UpstreamToClient, Some(Channel::Stdout)) => out.push(Observed::Stdout(payload)),
        (Direction::UpstreamToClient, Some(Channel::Stderr)) => out.push(Observed::Stderr(payload)),
        (Direction::UpstreamToClient, Some(Channel::Error)) => out.push(Observed::Error(payload)),
        // v5's close signal (255) and anything unknown: nothing to record.
        _ => {}
    }
    Ok(())
}
