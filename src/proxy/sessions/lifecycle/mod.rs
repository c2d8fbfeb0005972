//! A session's life, the same for every runner: the steps every streaming session takes from
//! its admission to its one end, in the order of SECURITY.md's "a session's order of events"
//! (evidence before effect).
//!
//! - [`gate`]: what the proxy refuses itself before a session starts (kubelet sessions, an
//!   address's spent refusal budget, a caller the upstream does not authenticate).
//! - [`task`]: from admission on a session is its own task, which a client hanging up cannot
//!   cancel; its request only waits for the answer.
//! - [`start`]: the steps before anything goes upstream (caller identified, recording opened,
//!   audit `started`), and whether it may go.
//! - [`audit`]: the audit hooks every streaming session calls at its start and end.
//! - [`recording`]: a translated or relayed exec or attach's recording, opened one way.
//! - [`end`]: the one way a session ends, from its admission on (audit event, slot,
//!   metrics).
//!
//! May use, inside `sessions`, only [`state`](super::state) and
//! [`registry`](super::registry); used by the runners, the relay and `listen`.
//! `src/layering.rs` enforces it.

pub mod audit;
pub mod end;
pub mod gate;
pub mod recording;
pub mod start;
pub mod task;
