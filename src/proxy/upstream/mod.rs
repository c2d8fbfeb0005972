//! The upstream API server (or kubelet): where it is, the proxy's own credentials for it, and
//! dialling it.
//!
//! Where and with what:
//! - [`source`]: the upstream from exactly one of `--upstream`, `--kubeconfig`, `--in-cluster`.
//! - [`kubeconfig`]: reading a kubeconfig's server, CA and user.
//! - [`endpoint`]: the [`Upstream`](endpoint::Upstream): its address and TLS, connecting to it,
//!   the pooled client for plain requests.
//! - [`token_source`], [`client_cert`], [`pem`]: the proxy's own token, client certificate
//!   and PEM material, re-read when rotated.
//! - [`error`]: why the upstream could not be described or reached.
//!
//! Dialling streaming sessions:
//! - [`spdy_dial`]: an `Upgrade: SPDY/3.1` request on behalf of a client request.
//! - [`websocket_dial`]: a WebSocket client handshake (the reverse translator).
//! - [`streaming`]: `--upstream-streaming` and what `auto` learned about the upstream.
//! - [`refusal_body`]: an upstream's refusal held while `auto` decides on it.
//!
//! One proxy in front of many clusters keeps one such upstream per cluster, each with its own
//! credentials and streaming mode; `route` picks among them. May use `observability` and
//! `wire`; knows nothing of callers (`auth`) or sessions.

pub mod client_cert;
pub mod endpoint;
pub mod error;
pub mod kubeconfig;
pub mod peers;
pub mod pem;
pub mod refusal_body;
pub mod source;
pub mod spdy_dial;
pub mod streaming;
pub mod token_source;
pub mod websocket_dial;
