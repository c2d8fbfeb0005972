//! Routing: what a request is and where it goes, decided once per request.
//!
//! - [`classify`]: a request's class (translated exec, tunnel, relay, reverse, plain forward)
//!   from its method, target and headers.
//! - [`stream_request`]: a streaming request read once (pod, subresource, options, ports,
//!   caller, client, audit id), which the front door hands to its session.
//! - [`kubelet`]: kubelet calls through `nodes/{node}/proxy` and what is done with them.
//! - [`sessions_api`]: requests to the proxy's own API group (`kube-ws-proxy.io`), which never
//!   go upstream.
//!
//! - [`cluster`]: one cluster behind the proxy (its upstream, credentials, auth and streaming
//!   mode, what `auto` learned), and its name.
//! - [`fleet`]: the configured clusters and the pick per request (`/clusters/NAME/...`).
//! - [`by_host`]: the cluster a request's host names (`NAME.SUFFIX`), checked against the
//!   connection's TLS server name.
//!
//! Decisions only: route never runs a session. May use `auth`, `upstream`, `observability` (a
//! cluster's readiness check) and `wire`; used by
//! `sessions` and `listen`.

pub mod by_host;
pub mod classify;
pub mod cluster;
pub mod fleet;
pub mod kubelet;
pub mod sessions_api;
pub mod stream_request;
