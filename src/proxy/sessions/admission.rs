//! What a streaming request must be before it takes a `--max-sessions` slot, and which runner
//! it goes to. The checks here need nothing but the request (its WebSocket handshake, the
//! tunnel's protocols, the version a SPDY client offers the reverse translator): a request
//! that fails one is refused (400/403) and never admitted, so that every admitted session is
//! one that may run, and ends as a session.

use http::{header, Response, StatusCode};

use super::pass_through;
use super::reverse_handler;
use super::state::ProxyState;
use crate::proxy::client::upgrade_request::UpgradeRequest;
use crate::proxy::client::websocket::{
    is_valid_key, validate_handshake, ClientAnswer, HandshakeError,
};
use crate::proxy::observability::metrics::SessionKind;
use crate::proxy::route::classify::RelayKind;
use crate::proxy::route::stream_request::StreamTarget;
use crate::proxy::upstream::streaming::{StreamFamily, UpstreamStreaming};
use crate::proxy::wire::body::ProxyBody;
use crate::proxy::wire::status_response::failure;
use crate::translate::exec_options::Subresource;
use crate::translate::protocol::UpstreamVersion;
use crate::translate::reverse::negotiation::NegotiationError;

/// A streaming session as the front door classified it.
#[derive(Debug)]
pub enum Requested {
    /// A v5 exec/attach WebSocket.
    RemoteCommand(Subresource),
    /// The port-forward tunnel; its de-prefixed SPDY protocols.
    Tunnel(Vec<String>),
    /// An upgrade the upstream serves natively.
    Relay(RelayKind),
}

/// Why a streaming request is refused before it is admitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotAdmissible {
    /// Its WebSocket handshake is not one.
    #[error(transparent)]
    Handshake(#[from] HandshakeError),
    /// A tunnel offering no tunnelled protocol.
    #[error("unable to upgrade: no tunneling spdy protocols provided")]
    NoTunnelProtocols,
    /// A pass-through with nothing the upstream may be offered.
    #[error("no WebSocket subprotocol to offer upstream")]
    NothingToOffer,
    /// The version a SPDY client offers, which the reverse translator does not speak.
    #[error(transparent)]
    Version(#[from] NegotiationError),
}

impl NotAdmissible {
    /// The answer for the client: a Status (a version refused as a kubelet refuses it).
    pub fn response(&self) -> Response<ProxyBody> {
        match self {
            NotAdmissible::Handshake(e) => failure(e.status(), "BadRequest", e.to_string()),
            NotAdmissible::Version(e) => reverse_handler::refuse_offer(e),
            other => failure(StatusCode::BAD_REQUEST, "BadRequest", other.to_string()),
        }
    }
}

/// A session that may be admitted, with what its checks found.
#[derive(Debug)]
pub enum Admissible {
    /// A v5 exec/attach (translated, or passed through under `websocket`/`auto`); `answer` is
    /// how its client is answered when the proxy answers it.
    RemoteCommand {
        subresource: Subresource,
        answer: ClientAnswer,
    },
    /// The port-forward tunnel (translated or passed through).
    Tunnel {
        protocols: Vec<String>,
        answer: ClientAnswer,
    },
    /// A SPDY exec, attach or port-forward to the reverse translator
    /// (`--upstream-streaming websocket`); `version` is what it speaks with the client (`None`
    /// for port-forward).
    Reverse {
        subresource: Subresource,
        version: Option<UpstreamVersion>,
    },
    /// A SPDY exec, attach or port-forward under `--upstream-streaming auto`: relayed or
    /// reverse-translated, as the upstream's answers decide; `version` is what the reverse
    /// translator would speak with the client.
    SpdyAuto {
        subresource: Subresource,
        version: Option<UpstreamVersion>,
    },
    /// A byte-for-byte relay.
    Relay(RelayKind),
}

impl Admissible {
    /// Checks `requested` (`req`, naming `target`) for admission; why it is refused
    /// otherwise.
    pub fn check(
        state: &ProxyState,
        req: &UpgradeRequest,
        target: &StreamTarget,
        requested: Requested,
    ) -> Result<Admissible, NotAdmissible> {
        let setting = state.cluster.upstream_streaming;
        match requested {
            Requested::RemoteCommand(subresource) => {
                let answer = client_answer(req)?;
                if setting != UpstreamStreaming::Spdy {
                    offers_upstream(req, StreamFamily::RemoteCommand)?;
                }
                Ok(Admissible::RemoteCommand {
                    subresource,
                    answer,
                })
            }
            Requested::Tunnel(protocols) => {
                let answer = client_answer(req)?;
                if protocols.is_empty() {
                    return Err(NotAdmissible::NoTunnelProtocols);
                }
                if setting != UpstreamStreaming::Spdy {
                    offers_upstream(req, StreamFamily::PortForward)?;
                }
                Ok(Admissible::Tunnel { protocols, answer })
            }
            Requested::Relay(RelayKind::Spdy) => Ok(spdy(req, target, setting)?),
            Requested::Relay(RelayKind::WebSocket) => {
                let key = req.parts.headers.get(header::SEC_WEBSOCKET_KEY);
                if !key.is_some_and(|k| is_valid_key(k.as_bytes())) {
                    return Err(HandshakeError::Key.into());
                }
                Ok(Admissible::Relay(RelayKind::WebSocket))
            }
            Requested::Relay(kind) => Ok(Admissible::Relay(kind)),
        }
    }

    /// The kind the session is counted as from its admission: the path it takes, or under
    /// `auto` the one asked first (the session is moved to the path it takes).
    pub fn first_kind(&self, setting: UpstreamStreaming) -> SessionKind {
        match self {
            Admissible::RemoteCommand { subresource, .. } if setting == UpstreamStreaming::Spdy => {
                remote_command_kind(*subresource)
            }
            Admissible::Tunnel { .. } if setting == UpstreamStreaming::Spdy => {
                SessionKind::PortForwardTunnel
            }
            Admissible::RemoteCommand { .. } | Admissible::Tunnel { .. } => {
                SessionKind::PassThrough
            }
            Admissible::Reverse { subresource, .. } => reverse_kind(*subresource),
            Admissible::SpdyAuto { .. } | Admissible::Relay(RelayKind::Spdy) => {
                SessionKind::SpdyRelay
            }
            Admissible::Relay(_) => SessionKind::WebSocketRelay,
        }
    }
}

/// How a translated exec or attach is counted.
pub fn remote_command_kind(subresource: Subresource) -> SessionKind {
    match subresource {
        Subresource::Attach => SessionKind::Attach,
        _ => SessionKind::Exec,
    }
}

/// How a reverse-translated session (a SPDY client, a WebSocket upstream) is counted.
pub fn reverse_kind(subresource: Subresource) -> SessionKind {
    match subresource {
        Subresource::PortForward => SessionKind::PortForwardTunnel,
        other => remote_command_kind(other),
    }
}

/// A SPDY upgrade: relayed, reverse-translated (`websocket`) or decided under `auto`, for an
/// exec, attach or port-forward (the version it offers checked now: one the reverse translator
/// cannot serve is refused as a kubelet refuses it); always relayed otherwise.
fn spdy(
    req: &UpgradeRequest,
    target: &StreamTarget,
    setting: UpstreamStreaming,
) -> Result<Admissible, NotAdmissible> {
    let Some(subresource) = target.streaming_subresource() else {
        return Ok(Admissible::Relay(RelayKind::Spdy));
    };
    if setting == UpstreamStreaming::Spdy {
        return Ok(Admissible::Relay(RelayKind::Spdy));
    }
    let port_forward = subresource == Subresource::PortForward;
    let version = reverse_handler::negotiate(req, port_forward)?;
    Ok(match setting {
        UpstreamStreaming::Auto => Admissible::SpdyAuto {
            subresource,
            version,
        },
        _ => Admissible::Reverse {
            subresource,
            version,
        },
    })
}

/// How the client's WebSocket handshake is answered, if it is a valid one.
fn client_answer(req: &UpgradeRequest) -> Result<ClientAnswer, NotAdmissible> {
    Ok(validate_handshake(
        &req.parts.method,
        &req.parts.headers,
        req.client.form,
    )?)
}

/// Whether a pass-through has a subprotocol to offer the upstream.
fn offers_upstream(req: &UpgradeRequest, family: StreamFamily) -> Result<(), NotAdmissible> {
    match pass_through::upstream_offer(family, &req.parts.headers).is_empty() {
        true => Err(NotAdmissible::NothingToOffer),
        false => Ok(()),
    }
}
