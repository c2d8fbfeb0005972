//! Following a relayed SPDY/3.1 session (PROTOCOL.md §3). In a remote-command session the
//! client opens one stream per `streamtype` (error, stdin, stdout, stderr, resize) with
//! SYN_STREAM; the kubelet answers on them with DATA. Header blocks are read as the receiving
//! end reads them ([`FrameDecoder::following`], [`StreamHeaders`]): a `streamtype` of
//! `stdout\0` is stdout, as it is for the kubelet; a block the observer cannot read (one that
//! does not inflate within its limits) stops the observation with an error. In a port-forward session each forwarded
//! connection is an `error` and a `data` stream ([`super::port_forward`]); their DATA payloads
//! are counted as they pass, never buffered. Each direction has its own zlib context for
//! header blocks, so each has its own decoder, and every control frame must go through it.
//! Followed for the error stream alone ([`Scope::ErrorStream`]), the DATA frames of the other
//! streams pass by the same way: from their 8-byte head, uncopied.

use std::collections::HashMap;

use bytes::BytesMut;

use super::port_forward::{OpenForwards, PortForwards};
use super::{Direction, ObserveError, Observed, Scope, MAX_FRAME};
use crate::audit::port_forward::PortForwardReport;
use crate::spdy::codec::FrameDecoder;
use crate::spdy::frame::{Frame, FLAG_FIN, HEAD_LEN};
use crate::spdy::kube_headers::StreamHeaders;
use crate::translate::resize::ResizeDecoder;

/// Streams a remote-command session opens: five, and a few spare for clients that reopen.
const MAX_STREAMS: usize = 32;
/// Largest inflated header block looked at; a SYN_STREAM of Kubernetes' holds a few dozen
/// bytes.
const MAX_HEADER_BLOCK: usize = 16 * 1024;

/// What a stream carries, from its `streamtype` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StreamType {
    Error,
    Stdin,
    Stdout,
    Stderr,
    Resize,
    /// Anything else (a newer stream type): followed, not observed.
    Other,
}

impl StreamType {
    /// The kubelet's switch on `streamtype`.
    fn of(headers: StreamHeaders<'_>) -> StreamType {
        match headers.stream_type {
            b"error" => StreamType::Error,
            b"stdin" => StreamType::Stdin,
            b"stdout" => StreamType::Stdout,
            b"stderr" => StreamType::Stderr,
            b"resize" => StreamType::Resize,
            _ => StreamType::Other,
        }
    }
}

/// One direction: its bytes not yet a whole frame, and its header-compression context.
#[derive(Debug)]
struct Side {
    buf: BytesMut,
    decoder: FrameDecoder,
    /// The DATA frame whose payload is passing by uncopied (port-forward sessions).
    skipping: Option<Skip>,
}

/// A DATA payload being counted (port-forward) or passed over (error stream only) rather than
/// buffered.
#[derive(Debug, Clone, Copy)]
struct Skip {
    stream: u32,
    remaining: usize,
    fin: bool,
}

impl Side {
    fn new() -> Side {
        Side {
            buf: BytesMut::new(),
            decoder: FrameDecoder::following(MAX_FRAME - HEAD_LEN, MAX_HEADER_BLOCK),
            skipping: None,
        }
    }
}

/// The streams of a remote-command session the upstream writes on, by id, as the client opened
/// them: what the proxy needs to end the session itself.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RemoteCommandStreams {
    pub error: Option<u32>,
    pub stdout: Option<u32>,
    pub stderr: Option<u32>,
}

/// Follows both directions of a relayed SPDY/3.1 session.
#[derive(Debug)]
pub struct SpdyObserver {
    client: Side,
    upstream: Side,
    streams: HashMap<u32, StreamType>,
    resize: ResizeDecoder,
    /// Which streams' payloads a remote-command observer looks at.
    scope: Scope,
    /// Set for a port-forward session: its streams are followed there instead.
    forwards: Option<Box<PortForwards>>,
}

impl Default for SpdyObserver {
    fn default() -> Self {
        SpdyObserver::new()
    }
}

impl SpdyObserver {
    /// Bytes of the unfinished frame relayed in `direction`.
    pub fn held(&self, direction: Direction) -> usize {
        match direction {
            Direction::ClientToUpstream => self.client.buf.len(),
            Direction::UpstreamToClient => self.upstream.buf.len(),
        }
    }

    /// The error, stdout and stderr streams the client has opened (and not reset).
    pub fn remote_command_streams(&self) -> RemoteCommandStreams {
        let mut found = RemoteCommandStreams::default();
        for (&id, &ty) in &self.streams {
            let slot = match ty {
                StreamType::Error => &mut found.error,
                StreamType::Stdout => &mut found.stdout,
                StreamType::Stderr => &mut found.stderr,
                _ => continue,
            };
            // A client that reopens a stream type: the newest one is the one in use.
            if slot.is_none_or(|old| old < id) {
                *slot = Some(id);
            }
        }
        found
    }

    /// An observer of a session that has not sent a frame yet.
    pub fn new() -> SpdyObserver {
        SpdyObserver::with_scope(Scope::Everything)
    }

    /// An observer of a remote-command session that looks at as much as `scope` says.
    pub fn with_scope(scope: Scope) -> SpdyObserver {
        SpdyObserver {
            client: Side::new(),
            upstream: Side::new(),
            streams: HashMap::new(),
            resize: ResizeDecoder::new(),
            scope,
            forwards: None,
        }
    }

    /// An observer of a port-forward session (`portforward.k8s.io`): it reports the forwarded
    /// connections ([`SpdyObserver::port_forwards`]) and yields no [`Observed`] events.
    pub fn port_forward() -> SpdyObserver {
        SpdyObserver {
            forwards: Some(Box::default()),
            ..SpdyObserver::new()
        }
    }

    /// A port-forward's streams the upstream has not ended; `None` for a remote-command one.
    pub fn open_forwards(&self) -> Option<OpenForwards> {
        self.forwards.as_deref().map(PortForwards::open)
    }

    /// What a port-forward observer has seen so far; `None` for a remote-command one.
    pub fn port_forwards(&self) -> Option<PortForwardReport> {
        self.forwards.as_deref().map(PortForwards::report)
    }

    /// Follows `bytes` relayed in `direction`, appending what whole frames carried to `out`.
    pub fn feed(
        &mut self,
        direction: Direction,
        bytes: &[u8],
        out: &mut Vec<Observed>,
    ) -> Result<(), ObserveError> {
        let side = match direction {
            Direction::ClientToUpstream => &mut self.client,
            Direction::UpstreamToClient => &mut self.upstream,
        };
        let mut bytes = bytes;
        loop {
            if let Some(mut skip) = side.skipping {
                let take = skip.remaining.min(bytes.len());
                if let Some(forwards) = self.forwards.as_deref_mut() {
                    forwards.payload(skip.stream, direction, &bytes[..take]);
                }
                bytes = &bytes[take..];
                if take < skip.remaining {
                    skip.remaining -= take;
                    side.skipping = Some(skip);
                    return Ok(());
                }
                side.skipping = None;
                if let (true, Some(forwards)) = (skip.fin, self.forwards.as_deref_mut()) {
                    forwards.finished(skip.stream, direction);
                }
                continue;
            }
            // Take in no more than the frame at the front needs, so the buffer never holds
            // more than one frame whatever the size of the reads.
            let want = match side.buf.get(..HEAD_LEN) {
                None => HEAD_LEN - side.buf.len(),
                // A port-forward's DATA frame (control bit clear): its payload is counted as
                // it passes, whatever its size; so is one of a stream the scope leaves out.
                Some(head)
                    if head[0] & 0x80 == 0
                        && (self.forwards.is_some()
                            || passed_over(self.scope, &self.streams, direction, head)) =>
                {
                    side.skipping = Some(Skip {
                        stream: u32::from_be_bytes([head[0], head[1], head[2], head[3]]),
                        remaining: u32::from_be_bytes([0, head[5], head[6], head[7]]) as usize,
                        fin: head[4] & FLAG_FIN != 0,
                    });
                    side.buf.clear();
                    continue;
                }
                Some(head) => {
                    let total =
                        HEAD_LEN + u32::from_be_bytes([0, head[5], head[6], head[7]]) as usize;
                    if total > MAX_FRAME {
                        return Err(ObserveError::TooLarge(total as u64));
                    }
                    total - side.buf.len()
                }
            };
            if want > 0 {
                let take = want.min(bytes.len());
                side.buf.extend_from_slice(&bytes[..take]);
                bytes = &bytes[take..];
                if take < want {
                    return Ok(());
                }
                // The head may just have completed: look at it again.
                continue;
            }
            let frame = side
                .decoder
                .decode(&mut side.buf)
                .map_err(|e| ObserveError::Spdy(e.to_string()))?;
            // The buffer holds exactly one whole frame here.
            let Some(frame) = frame else {
                return Err(ObserveError::Spdy("a whole frame did not decode".into()));
            };
            match self.forwards.as_deref_mut() {
                Some(forwards) => Self::observe_forwards(forwards, direction, frame)?,
                None => Self::observe(
                    (&mut self.streams, &mut self.resize, self.scope),
                    direction,
                    frame,
                    out,
                )?,
            }
        }
    }

    /// A port-forward session's control frame (its DATA frames never reach here).
    fn observe_forwards(
        forwards: &mut PortForwards,
        direction: Direction,
        frame: Frame,
    ) -> Result<(), ObserveError> {
        match frame {
            Frame::SynStream(syn) => {
                forwards.opened(
                    syn.stream_id,
                    direction,
                    syn.fin,
                    StreamHeaders::read(&syn.headers),
                )?;
            }
            // spdystream ends its side of a stream on FIN, whichever frame carries it.
            Frame::SynReply(reply) if reply.fin => {
                forwards.finished(reply.stream_id.get(), direction);
            }
            Frame::Headers(headers) if headers.fin => {
                forwards.finished(headers.stream_id.get(), direction);
            }
            Frame::RstStream(rst) => forwards.reset(rst.stream_id.get()),
            _ => {}
        }
        Ok(())
    }

    fn observe(
        (streams, resize, scope): (&mut HashMap<u32, StreamType>, &mut ResizeDecoder, Scope),
        direction: Direction,
        frame: Frame,
        out: &mut Vec<Observed>,
    ) -> Result<(), ObserveError> {
        match frame {
            Frame::SynStream(syn) => {
                let id = syn.stream_id.get();
                if !streams.contains_key(&id) && streams.len() >= MAX_STREAMS {
                    return Err(ObserveError::TooManyStreams(MAX_STREAMS));
                }
                let headers = StreamHeaders::read(&syn.headers);
                let ty = StreamType::of(headers);
                if ty == StreamType::Other
                    && direction == Direction::ClientToUpstream
                    && scope == Scope::Everything
                {
                    out.push(Observed::UnknownStream(unknown_stream(id, headers)));
                }
                streams.insert(id, ty);
            }
            Frame::RstStream(rst) => {
                streams.remove(&rst.stream_id.get());
            }
            Frame::Data(data) if !data.payload.is_empty() => {
                let ty = streams.get(&data.stream_id.get()).copied();
                let payload = data.payload;
                match (direction, ty) {
                    (Direction::ClientToUpstream, Some(StreamType::Stdin)) => {
                        out.push(Observed::Stdin(payload))
                    }
                    (Direction::ClientToUpstream, Some(StreamType::Resize)) => {
                        let sizes = resize
                            .push(&payload)
                            .map_err(|e| ObserveError::Resize(e.to_string()))?;
                        out.extend(sizes.into_iter().map(Observed::Resize));
                    }
                    (Direction::UpstreamToClient, Some(StreamType::Stdout)) => {
                        out.push(Observed::Stdout(payload))
                    }
                    (Direction::UpstreamToClient, Some(StreamType::Stderr)) => {
                        out.push(Observed::Stderr(payload))
                    }
                    (Direction::UpstreamToClient, Some(StreamType::Error)) => {
                        out.push(Observed::Error(payload))
                    }
                    _ => {}
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// Most bytes of an unknown `streamtype` quoted in words (it is the client's).
const MAX_QUOTED_TYPE: usize = 64;

/// Why a stream of an unknown type is not observed, in words.
fn unknown_stream(id: u32, headers: StreamHeaders<'_>) -> String {
    let ty = headers.stream_type;
    let quoted = ty[..ty.len().min(MAX_QUOTED_TYPE)].escape_ascii();
    let cut = if ty.len() > MAX_QUOTED_TYPE {
        "..."
    } else {
        ""
    };
    format!("stream {id} has a type the proxy does not know (streamtype \"{quoted}{cut}\")")
}

/// Whether the DATA frame whose head is `head` goes by unread: under [`Scope::ErrorStream`],
/// every one but the upstream's on the error stream.
fn passed_over(
    scope: Scope,
    streams: &HashMap<u32, StreamType>,
    direction: Direction,
    head: &[u8],
) -> bool {
    if scope == Scope::Everything {
        return false;
    }
    let id = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
    !(direction == Direction::UpstreamToClient && streams.get(&id) == Some(&StreamType::Error))
}
