//! The HTTP front door: listeners, routing, sessions and upstream connections, in rooms by job.
//!
//! A WebSocket exec, from the listener to the upstream: [`listen::server`] accepts the
//! connection and reads the request, [`route::classify`] says what it is, a session runner in
//! [`sessions`] serves it ([`sessions::exec_handler`] translates it to SPDY, dialled by
//! [`upstream::spdy_dial`]; [`sessions::pass_through`] passes v5 on unchanged), and
//! [`sessions::lifecycle::audit`] writes its audit events.
//!
//! The rooms, top to bottom. A room may use only the rooms it names (an arrow never runs back
//! up; `src/layering.rs` enforces it, file and line); all of them may use the crate's
//! `translate`, `spdy`, `audit` and the leaf modules.
//!
//! - [`listen`]: the listeners and what arrives on them (TLS, HTTP/1.1 and HTTP/2, extended
//!   CONNECT), handing each request to a session; the admin listener. May use every room.
//! - [`sessions`]: one runner per way a routed request is served (translated exec, tunnel,
//!   reverse translation, pass-through, relay, the `auto` SPDY fallback, the plain forward),
//!   what they share (state, audit hooks, the registry of live sessions). May use `route`,
//!   `auth`, `upstream`, `client`, `observability`, `wire`.
//! - [`route`]: what a request is and where it goes, decided once. May use `auth`, `upstream`,
//!   `wire`.
//! - [`auth`]: who the caller is and what the upstream is told about it. May use `upstream`,
//!   `observability`, `wire`.
//! - [`upstream`]: where the upstream is, the proxy's own credentials for it, and dialling it
//!   (SPDY, WebSocket, auto-detection of what it serves). May use `observability`, `wire`.
//! - [`client`]: the client's connection and request before its session runs: the
//!   connection's clocks, the request layers, the upgrade request, accepting its WebSocket.
//!   May use `observability`, `wire`.
//! - [`observability`]: metrics, log throttling, the readiness check. May use `wire`.
//! - [`console`]: the web console's files (embedded), served on the main listener under
//!   `/kube-ws-proxy/console/`. May use `wire`.
//! - [`wire`]: the vocabulary both sides speak: response bodies, Status answers, header
//!   hygiene, the client's stream and handshake form, TCP-or-TLS sockets. Uses no room.
//!
//! What comes next has a place: one proxy in front of many clusters puts each cluster's
//! upstream (address, credentials, auth mode, streaming mode) in [`upstream`] and the pick per
//! request in [`route`], so the one global upstream in [`sessions::state`] becomes the routed
//! one; a registry of live sessions that operators list, follow and end grows from
//! [`sessions::registry`], where every session kind registers, with its operator endpoints in
//! [`listen::admin`].

pub mod auth;
pub mod client;
pub mod console;
pub mod listen;
pub mod observability;
pub mod route;
pub mod sessions;
pub mod sessions_api;
pub mod upstream;
pub mod wire;
