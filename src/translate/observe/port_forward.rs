//! What a port-forward's SPDY session carried (PROTOCOL.md §2.1, §3.6): each forwarded
//! connection is a pair of streams, `error` and `data`, whose SYN_STREAM headers name the
//! `port` and the `requestid` that pairs them. Kept per connection: the port, the bytes of its
//! data stream each way and the text of its error stream. Payloads are counted, never kept,
//! except a bounded piece of the error text.
//!
//! Streams are read as the kubelet reads them ([`StreamHeaders`]): it pairs a connection's two
//! streams by request id (derived from the stream ids when the client sent none) and forwards
//! to the port its data stream names, if that is a valid port. A pair whose port the kubelet
//! refuses is kept all the same (an attempt, with no port), its bytes counted until the
//! streams are reset.

use std::collections::{BTreeSet, HashMap};

use super::{Direction, ObserveError};
use crate::audit::port_forward::{ForwardedConnection, PortForwardReport};
use crate::spdy::frame::StreamId;
use crate::spdy::kube_headers::StreamHeaders;

/// Connections kept in detail; those after them are only counted.
pub const MAX_CONNECTIONS: usize = 1_000;
/// Streams open at once that are followed: a connection holds two, and kubectl opens one
/// connection per accepted local socket, so this is 2,048 concurrent connections.
const MAX_OPEN_STREAMS: usize = 4_096;
/// Most bytes of a connection's error text kept (the kubelet's messages are one line).
const MAX_ERROR_TEXT: usize = 1_024;

/// The streams of a port-forward's connections that the upstream may still write on: where
/// the proxy tells the client that the session ended (the error streams) and ends their data.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpenForwards {
    /// Error streams.
    pub errors: Vec<u32>,
    /// Data streams.
    pub data: Vec<u32>,
}

/// What a stream is for, within its connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Data,
    Error,
    /// Neither (an unknown streamtype): followed for its end, not observed.
    Other,
}

#[derive(Debug)]
struct Stream {
    kind: Kind,
    /// Index into `connections`; `None` beyond the detailed ones.
    connection: Option<usize>,
    client_done: bool,
    upstream_done: bool,
}

#[derive(Debug)]
struct Connection {
    info: ForwardedConnection,
    error: Vec<u8>,
}

/// The port-forward streams of one session, both directions.
#[derive(Debug, Default)]
pub(super) struct PortForwards {
    streams: HashMap<u32, Stream>,
    /// Detailed connections by request id (bytes, as the kubelet compares them).
    by_request: HashMap<Vec<u8>, usize>,
    connections: Vec<Connection>,
    omitted: u64,
    ports: BTreeSet<u16>,
}

impl PortForwards {
    /// A stream opened by `direction`'s SYN_STREAM with these headers.
    pub(super) fn opened(
        &mut self,
        id: StreamId,
        direction: Direction,
        fin: bool,
        headers: StreamHeaders<'_>,
    ) -> Result<(), ObserveError> {
        let key = id.get();
        if !self.streams.contains_key(&key) && self.streams.len() >= MAX_OPEN_STREAMS {
            return Err(ObserveError::TooManyStreams(MAX_OPEN_STREAMS));
        }
        let kind = if headers.is("data") {
            Kind::Data
        } else if headers.is("error") {
            Kind::Error
        } else {
            Kind::Other
        };
        let connection = match kind {
            Kind::Other => None,
            Kind::Data | Kind::Error => self.connection(&headers.port_forward_request(id), kind),
        };
        // The kubelet forwards to the port the data stream names.
        if let (Kind::Data, Some(port)) = (kind, headers.port()) {
            self.ports.insert(port);
            if let Some(c) = connection.and_then(|i| self.connections.get_mut(i)) {
                c.info.port.get_or_insert(port);
            }
        }
        self.streams.insert(
            key,
            Stream {
                kind,
                connection,
                client_done: false,
                upstream_done: false,
            },
        );
        if fin {
            self.finished(key, direction);
        }
        Ok(())
    }

    /// The detailed connection of `request`, made if it is new and there is room; `None`
    /// beyond the detailed ones (counted once, by their data stream).
    fn connection(&mut self, request: &[u8], kind: Kind) -> Option<usize> {
        if let Some(&i) = self.by_request.get(request) {
            return Some(i);
        }
        if self.connections.len() >= MAX_CONNECTIONS {
            if kind == Kind::Data {
                self.omitted += 1;
            }
            return None;
        }
        let i = self.connections.len();
        self.connections.push(Connection {
            info: ForwardedConnection {
                port: None,
                request_id: String::from_utf8_lossy(request).into_owned(),
                bytes_in: 0,
                bytes_out: 0,
                error: None,
            },
            error: Vec::new(),
        });
        self.by_request.insert(request.to_vec(), i);
        Some(i)
    }

    /// `direction` sent its last frame on stream `id`.
    pub(super) fn finished(&mut self, id: u32, direction: Direction) {
        let Some(stream) = self.streams.get_mut(&id) else {
            return;
        };
        match direction {
            Direction::ClientToUpstream => stream.client_done = true,
            Direction::UpstreamToClient => stream.upstream_done = true,
        }
        if stream.client_done && stream.upstream_done {
            self.streams.remove(&id);
        }
    }

    /// Stream `id` was reset: nothing more goes over it either way.
    pub(super) fn reset(&mut self, id: u32) {
        self.streams.remove(&id);
    }

    /// Payload bytes (a whole DATA frame's or part of one) sent in `direction` on `id`.
    pub(super) fn payload(&mut self, id: u32, direction: Direction, bytes: &[u8]) {
        let Some(stream) = self.streams.get(&id) else {
            return;
        };
        let Some(connection) = stream.connection.and_then(|i| self.connections.get_mut(i)) else {
            return;
        };
        match (stream.kind, direction) {
            (Kind::Data, Direction::ClientToUpstream) => {
                connection.info.bytes_in += bytes.len() as u64
            }
            (Kind::Data, Direction::UpstreamToClient) => {
                connection.info.bytes_out += bytes.len() as u64
            }
            (Kind::Error, Direction::UpstreamToClient) => {
                let room = MAX_ERROR_TEXT.saturating_sub(connection.error.len());
                connection
                    .error
                    .extend_from_slice(&bytes[..bytes.len().min(room)]);
            }
            _ => {}
        }
    }

    /// The forwarded connections' streams the upstream has not ended yet, lowest first.
    pub(super) fn open(&self) -> OpenForwards {
        let mut open = OpenForwards::default();
        for (&id, stream) in &self.streams {
            match (stream.kind, stream.upstream_done) {
                (Kind::Error, false) => open.errors.push(id),
                (Kind::Data, false) => open.data.push(id),
                _ => {}
            }
        }
        open.errors.sort_unstable();
        open.data.sort_unstable();
        open
    }

    /// What was seen so far.
    pub(super) fn report(&self) -> PortForwardReport {
        PortForwardReport {
            ports: self.ports.iter().copied().collect(),
            connections: self
                .connections
                .iter()
                .map(|c| {
                    let mut info = c.info.clone();
                    let text = String::from_utf8_lossy(&c.error);
                    let text = text.trim();
                    info.error = (!text.is_empty()).then(|| text.to_owned());
                    info
                })
                .collect(),
            omitted: self.omitted,
            failure: None,
        }
    }
}

/// One port of a legacy WebSocket port-forward: channels `2i` (data) and `2i + 1` (error).
#[derive(Debug)]
struct ChannelPair {
    info: ForwardedConnection,
    /// Whether the kubelet's first message on the data / error channel (the port, two bytes
    /// little-endian, PROTOCOL.md §2.2) has come.
    data_prefixed: bool,
    error_prefixed: bool,
    error: Vec<u8>,
}

/// The ports of a legacy WebSocket port-forward (`v4.channel.k8s.io`, or no subprotocol, and
/// its base64 form), one connection per port the request named. At most 128 (channels are
/// one byte), so none are left out.
#[derive(Debug, Default)]
pub(super) struct ChannelForwards {
    pairs: Vec<ChannelPair>,
}

impl ChannelForwards {
    /// A whole message's payload (channel number taken off, base64 decoded) on `channel`.
    pub(super) fn message(&mut self, direction: Direction, channel: u8, payload: &[u8]) {
        let index = usize::from(channel / 2);
        while self.pairs.len() <= index {
            let place = self.pairs.len();
            self.pairs.push(ChannelPair {
                info: ForwardedConnection {
                    port: None,
                    // Nothing names a request here: the port's place in the request's list
                    // stands in.
                    request_id: place.to_string(),
                    bytes_in: 0,
                    bytes_out: 0,
                    error: None,
                },
                data_prefixed: false,
                error_prefixed: false,
                error: Vec::new(),
            });
        }
        let Some(pair) = self.pairs.get_mut(index) else {
            return;
        };
        let is_error = channel % 2 == 1;
        match direction {
            // The client writes no prefix, and nothing on error channels.
            Direction::ClientToUpstream if !is_error => pair.info.bytes_in += payload.len() as u64,
            Direction::ClientToUpstream => {}
            Direction::UpstreamToClient => {
                let prefixed = if is_error {
                    &mut pair.error_prefixed
                } else {
                    &mut pair.data_prefixed
                };
                let mut payload = payload;
                if !*prefixed {
                    *prefixed = true;
                    if let [lo, hi, rest @ ..] = payload {
                        if pair.info.port.is_none() {
                            pair.info.port = Some(u16::from_le_bytes([*lo, *hi]));
                        }
                        payload = rest;
                    } else {
                        payload = &[];
                    }
                }
                if is_error {
                    let room = MAX_ERROR_TEXT.saturating_sub(pair.error.len());
                    pair.error
                        .extend_from_slice(&payload[..payload.len().min(room)]);
                } else {
                    pair.info.bytes_out += payload.len() as u64;
                }
            }
        }
    }

    /// What was seen so far.
    pub(super) fn report(&self) -> PortForwardReport {
        let ports: BTreeSet<u16> = self.pairs.iter().filter_map(|p| p.info.port).collect();
        PortForwardReport {
            ports: ports.into_iter().collect(),
            connections: self
                .pairs
                .iter()
                .map(|p| {
                    let mut info = p.info.clone();
                    let text = String::from_utf8_lossy(&p.error);
                    let text = text.trim();
                    info.error = (!text.is_empty()).then(|| text.to_owned());
                    info
                })
                .collect(),
            omitted: 0,
            failure: None,
        }
    }
}
