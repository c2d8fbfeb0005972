//! Sessions: one runner per way a routed request is served, and what they share.
//!
//! The runners, at the top of the room, one file each:
//! - [`exec_handler`]: v5 exec/attach WebSockets translated to SPDY upstream.
//! - [`tunnel_handler`]: the port-forward tunnel (`SPDY/3.1+portforward.k8s.io` over
//!   WebSocket) to a SPDY upstream.
//! - [`reverse_handler`]: SPDY clients (kubectl ≤ 1.30) to a WebSocket-only upstream.
//! - [`pass_through`]: v5 and the tunnel passed upstream unchanged
//!   (`--upstream-streaming websocket|auto`).
//! - [`spdy_auto`]: SPDY clients under `auto`: relayed, or translated where SPDY is refused.
//! - [`relay`] (a room): byte-for-byte relays of upgrades the upstream serves natively; its
//!   runner is [`relay::run`].
//! - [`forward`]: the plain reverse proxy for requests that do not upgrade.
//! - [`kubelet_run`]: the kubelet's `run` through `nodes/{node}/proxy`, a plain POST audited
//!   and recorded as a session.
//!
//! Beside them, what picks a runner and what the runners answer with:
//! - [`admission`]: what a streaming request must be before it is admitted, and which runner
//!   it goes to (it asks the runners, so it lives beside them).
//! - [`upstream_refusal`]: an upstream that would not open a session, answered as
//!   kube-apiserver answers it.
//!
//! What they share:
//! - [`lifecycle`] (a room): a session's life from its admission to its one end (the gate,
//!   its own task, the start before anything goes upstream, audit, recording, the end).
//! - [`state`]: what every runner is given (the upstream, limits, metrics, audit).
//! - [`registry`]: admission (`--max-sessions`) and draining of running sessions, held in
//!   [`state`]; the registry of live sessions that operators list, follow and end grows here,
//!   every session kind registering the same way.
//!
//! Inside the room the arrows run down: the runners (and `admission`, `upstream_refusal`) may
//! use everything here; [`relay`] may use [`lifecycle`] and [`state`]; [`lifecycle`] may use
//! [`state`] and [`registry`]; [`state`] only [`registry`] (`src/layering.rs` enforces it).
//!
//! May use `route`, `auth`, `upstream`, `client`, `observability` and `wire`; used only by
//! `listen`.

pub mod admission;
pub mod exec_handler;
pub mod forward;
pub mod kubelet_run;
pub mod lifecycle;
pub mod pass_through;
pub mod registry;
pub mod relay;
pub mod reverse_handler;
pub mod spdy_auto;
pub mod state;
pub mod tunnel_handler;
pub mod upstream_refusal;
