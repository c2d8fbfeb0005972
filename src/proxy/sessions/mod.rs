//! Sessions: one runner per way a routed request is served, and what they share.
//!
//! The runners:
//! - [`exec_handler`]: v5 exec/attach WebSockets translated to SPDY upstream.
//! - [`tunnel_handler`]: the port-forward tunnel (`SPDY/3.1+portforward.k8s.io` over
//!   WebSocket) to a SPDY upstream.
//! - [`reverse_handler`]: SPDY clients (kubectl ≤ 1.30) to a WebSocket-only upstream.
//! - [`pass_through`]: v5 and the tunnel passed upstream unchanged
//!   (`--upstream-streaming websocket|auto`).
//! - [`spdy_auto`]: SPDY clients under `auto`: relayed, or translated where SPDY is refused.
//! - [`relay`]: byte-for-byte relays of upgrades the upstream serves natively, with
//!   [`relay_answer`] (what the client is told), [`relay_session`] (a relayed session
//!   from the 101 to its end), [`relay_pump`] (the byte copy both ways),
//!   [`relay_frames`] (where the frames going to the client begin and end, the one follower
//!   of them), [`relay_pings`] (keepalive pings into a relayed WebSocket),
//!   [`relay_recording`] (recording a relayed exec/attach) and [`relay_ending`] (the Status a
//!   relay ends a session with when its recording fails).
//! - [`forward`]: the plain reverse proxy for requests that do not upgrade.
//! - [`kubelet_run`]: the kubelet's `run` through `nodes/{node}/proxy`, a plain POST audited
//!   and recorded as a session.
//!
//! What they share:
//! - [`admission`]: what a streaming request must be before it is admitted, and which runner
//!   it goes to.
//! - [`session_task`]: from admission on a session is its own task, which a client hanging
//!   up cannot cancel; its request only waits for the answer.
//! - [`session_start`]: the steps every session takes before anything goes upstream (caller
//!   identified, recording opened, audit `started`), and whether it may go.
//! - [`state`]: what every runner is given (the upstream, limits, metrics, audit).
//! - [`session_audit`]: the audit hooks every streaming session calls at its start and end.
//! - [`session_end`]: the one way a session ends, from its admission on (audit event, slot,
//!   metrics).
//! - [`session_gate`]: what the proxy refuses itself before a session starts (kubelet
//!   sessions, an address's spent refusal budget, a caller the upstream does not
//!   authenticate).
//! - [`session_recording`]: a translated exec or attach's recording, opened one way.
//! - [`upstream_refusal`]: an upstream that would not open a session, answered as
//!   kube-apiserver answers it.
//! - [`registry`]: admission (`--max-sessions`) and draining of running sessions; the
//!   registry of live sessions that operators list, follow and end grows here, every session
//!   kind registering the same way.
//!
//! May use `route`, `auth`, `upstream`, `client`, `observability` and `wire`; used only by
//! `listen`.

pub mod admission;
pub mod exec_handler;
pub mod forward;
pub mod kubelet_run;
pub mod pass_through;
pub mod registry;
pub mod relay;
pub mod relay_answer;
pub mod relay_ending;
pub mod relay_frames;
pub mod relay_pings;
pub mod relay_pump;
pub mod relay_recording;
pub mod relay_session;
pub mod reverse_handler;
pub mod session_audit;
pub mod session_end;
pub mod session_gate;
pub mod session_recording;
pub mod session_start;
pub mod session_task;
pub mod spdy_auto;
pub mod state;
pub mod tunnel_handler;
pub mod upstream_refusal;
