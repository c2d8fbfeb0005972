//! Routing: what a request is and where it goes, decided once per request.
//!
//! - [`classify`]: a request's class (translated exec, tunnel, relay, reverse, plain forward)
//!   from its method, target and headers.
//! - [`stream_request`]: a streaming request read once (pod, subresource, options, ports,
//!   caller, client, audit id), which the front door hands to its session.
//! - [`kubelet`]: kubelet calls through `nodes/{node}/proxy` and what is done with them.
//!
//! One proxy in front of many clusters picks the upstream here too: the route names the
//! upstream (with its credentials, auth mode and streaming mode) a request goes to.
//! Decisions only: route never runs a session. May use `auth`, `upstream` and `wire`; used by
//! `sessions` and `listen`.

pub mod classify;
pub mod kubelet;
pub mod stream_request;
