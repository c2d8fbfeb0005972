//! Following a port-forward tunnel passed through unchanged (PROTOCOL.md §2.1): a WebSocket
//! with the subprotocol `SPDY/3.1+portforward.k8s.io` whose binary messages, concatenated,
//! are a SPDY/3.1 port-forward session (message boundaries mean nothing; kubectl writes a
//! frame as several tiny messages). Each direction's frames are followed from their heads;
//! the payload bytes of binary messages go on to a SPDY port-forward observer
//! ([`SpdyObserver::port_forward`]), which counts each forwarded connection's bytes as they
//! pass. Nothing is buffered here beyond one frame head: an unmasked payload (the upstream's)
//! is handed on where it lies, a masked one (the client's) is unmasked a small piece at a time
//! on the stack.

use super::{Direction, ObserveError, OpenForwards, SpdyObserver};
use crate::audit::port_forward::PortForwardReport;
use crate::translate::ws::frame::{FrameHead, OpCode, MAX_HEAD_LEN};
use crate::translate::ws::mask::apply_mask;

/// Bytes of a masked payload unmasked at a time.
const UNMASK_PIECE: usize = 4096;

/// One direction's WebSocket framing.
#[derive(Debug)]
struct Deframer {
    /// The head being gathered, when it is split across reads.
    head: [u8; MAX_HEAD_LEN],
    have: usize,
    /// Payload bytes of the current frame still to come.
    left: u64,
    /// The current frame's masking key, turned so that its first byte applies to the next
    /// payload byte.
    mask: Option<[u8; 4]>,
    /// Whether the current frame's payload is SPDY bytes (a frame of a binary message).
    carries: bool,
    /// Whether a binary message is unfinished (its last fragment has not come).
    in_message: bool,
}

impl Deframer {
    fn new() -> Deframer {
        Deframer {
            head: [0; MAX_HEAD_LEN],
            have: 0,
            left: 0,
            mask: None,
            carries: false,
            in_message: false,
        }
    }

    /// Takes a frame head from the front of `bytes` (or as much of one as there is); returns
    /// how many bytes it took.
    fn take_head(&mut self, bytes: &[u8]) -> Result<usize, ObserveError> {
        let take = (MAX_HEAD_LEN - self.have).min(bytes.len());
        self.head[self.have..self.have + take].copy_from_slice(&bytes[..take]);
        let Some(head) = FrameHead::parse(&self.head[..self.have + take])
            .map_err(|e| ObserveError::WebSocket(e.to_string()))?
        else {
            self.have += take;
            return Ok(take);
        };
        let used = head.head_len - self.have;
        self.have = 0;
        self.left = head.len;
        self.mask = head.mask;
        self.carries = match head.opcode {
            op if op.is_control() => false,
            OpCode::Binary if !self.in_message => true,
            OpCode::Continuation if self.in_message => true,
            OpCode::Text => {
                return Err(ObserveError::WebSocket(
                    "a text message in the port-forward tunnel".into(),
                ))
            }
            OpCode::Continuation => {
                return Err(ObserveError::WebSocket(
                    "a continuation frame outside a message".into(),
                ))
            }
            _ => {
                return Err(ObserveError::WebSocket(
                    "a new message before the last one ended".into(),
                ))
            }
        };
        if self.carries {
            self.in_message = !head.fin;
        }
        Ok(used)
    }
}

/// Follows both directions of a passed-through port-forward tunnel.
#[derive(Debug)]
pub struct TunnelObserver {
    client: Deframer,
    upstream: Deframer,
    spdy: SpdyObserver,
}

impl Default for TunnelObserver {
    fn default() -> Self {
        TunnelObserver::new()
    }
}

impl TunnelObserver {
    /// Bytes its SPDY observer buffers now (a control frame's), both directions; the framing
    /// itself holds one head at most.
    pub fn buffered(&self) -> usize {
        self.spdy.held(Direction::ClientToUpstream) + self.spdy.held(Direction::UpstreamToClient)
    }

    /// An observer of a tunnel that has not sent a frame yet.
    pub fn new() -> TunnelObserver {
        TunnelObserver {
            client: Deframer::new(),
            upstream: Deframer::new(),
            spdy: SpdyObserver::port_forward(),
        }
    }

    /// The tunnel's forwarded connections' streams the upstream has not ended.
    pub fn open_forwards(&self) -> OpenForwards {
        self.spdy.open_forwards().unwrap_or_default()
    }

    /// What the tunnel's SPDY session carried so far.
    pub fn port_forwards(&self) -> PortForwardReport {
        self.spdy.port_forwards().unwrap_or_default()
    }

    /// Follows `bytes` relayed in `direction`.
    pub fn feed(&mut self, direction: Direction, bytes: &[u8]) -> Result<(), ObserveError> {
        let side = match direction {
            Direction::ClientToUpstream => &mut self.client,
            Direction::UpstreamToClient => &mut self.upstream,
        };
        let mut bytes = bytes;
        while !bytes.is_empty() {
            if side.left == 0 {
                let used = side.take_head(bytes)?;
                bytes = &bytes[used..];
                continue;
            }
            let take = side.left.min(bytes.len() as u64) as usize;
            let (payload, rest) = bytes.split_at(take);
            side.left -= take as u64;
            bytes = rest;
            if !side.carries {
                continue;
            }
            // A port-forward observer yields no events: nothing is ever pushed here.
            let mut none = Vec::new();
            match side.mask {
                None => self.spdy.feed(direction, payload, &mut none)?,
                Some(key) => {
                    let mut piece = [0u8; UNMASK_PIECE];
                    let mut key = key;
                    for chunk in payload.chunks(UNMASK_PIECE) {
                        let piece = &mut piece[..chunk.len()];
                        piece.copy_from_slice(chunk);
                        apply_mask(piece, key);
                        // The next chunk starts this many bytes further into the key.
                        key.rotate_left(chunk.len() % 4);
                        self.spdy.feed(direction, piece, &mut none)?;
                    }
                    side.mask = Some(key);
                }
            }
        }
        Ok(())
    }
}
