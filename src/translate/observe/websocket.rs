//! Following a relayed legacy WebSocket remote-command session (PROTOCOL.md §1): every message
//! starts with its channel (0 stdin, 1 stdout, 2 stderr, 3 error, 4 resize), as a byte in
//! binary messages or as an ASCII digit before a base64 payload in text messages (the
//! `base64.` protocols). Client frames are masked; messages may be fragmented, with control
//! frames between the fragments.

use base64::Engine;
use bytes::{Bytes, BytesMut};

use super::port_forward::{ChannelForwards, PortForwardReport};
use super::{Direction, ObserveError, Observed, MAX_FRAME};
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
}

/// Follows both directions of a relayed legacy WebSocket session.
#[derive(Debug)]
pub struct WebSocketObserver {
    framing: WebSocketFraming,
    client: Side,
    upstream: Side,
    resize: ResizeDecoder,
    /// Set for a legacy port-forward: its channels are followed there instead.
    forwards: Option<Box<ChannelForwards>>,
}

impl WebSocketObserver {
    /// An observer of a session that has not sent a frame yet.
    pub fn new(framing: WebSocketFraming) -> WebSocketObserver {
        WebSocketObserver {
            framing,
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
    pub fn feed(
        &mut self,
        direction: Direction,
        bytes: &[u8],
        out: &mut Vec<Observed>,
    ) -> Result<(), ObserveError> {
        let framing = self.framing;
        let resize = &mut self.resize;
        let mut forwards = self.forwards.as_deref_mut();
        let side = match direction {
            Direction::ClientToUpstream => &mut self.client,
            Direction::UpstreamToClient => &mut self.upstream,
        };
        let mut bytes = bytes;
        loop {
            let head = FrameHead::parse(&side.frame)
                .map_err(|e| ObserveError::WebSocket(e.to_string()))?;
            // Take in no more than the frame at the front needs: its head byte by byte (at
            // most 14), then exactly its payload.
            let want = match head {
                None => 1,
                Some(head) => {
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
            OpCode::Continuation => {
                if !side.in_message {
                    return Err(ObserveError::WebSocket(
                        "a continuation frame outside a message".into(),
                    ));
                }
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
                if side.in_message {
                    return Err(ObserveError::WebSocket(
                        "a new message before the last one ended".into(),
                    ));
                }
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
