//! kube-ws-proxy: terminates kubectl's WebSocket streaming protocols and re-originates SPDY/3.1
//! towards Kubernetes API servers and kubelets that only speak SPDY.
//!
//! - [`spdy`]: an SPDY/3.1 library (frames, header blocks, session, HTTP/1.1 upgrade).
//! - [`translate`]: the WebSocket channel protocols and their mapping to SPDY streams.
//! - [`proxy`]: the HTTP front door, routing, relaying and upstream connections.
//! - [`request`]: a request target read as kube-apiserver reads it (Go's URL rules).
//! - [`audit`]: audit events of streaming sessions.
//! - [`sim`]: a simulated SPDY-only cluster for tests and the demo.
//!
//! Layering (`src/layering.rs` enforces it, naming file and line; test code is exempt): a
//! module uses only the modules below it that it names, never one above.
//!
//! - `demo` uses `app`, `cli`, `sim`, `kubeconfig`; `kubeconfig` uses `app`, `cli`, `proxy`;
//!   `app` uses `cli`, `config_file`, `proxy`, `translate`,
//!   `audit`; `config_file` uses `cli`, `proxy`; `cli` uses `proxy`, `audit`, `sim`.
//! - `proxy` uses `translate`, `spdy`, `audit`.
//! - `translate` uses `spdy`, `audit`: sessions feed the audit's recorder and fill its
//!   port-forward records.
//! - `sim` uses `spdy` only: the reference cluster shares no session code with what it tests.
//! - `spdy` and `audit` use only the leaves.
//! - Leaves, usable by all and using none: `request`, `activity_clock`, `address_budget`,
//!   `read_sizer`, `timestamp`, `memory_trim`, `peer_hangup`, `session_memory`,
//!   `session_traffic`.

pub mod activity_clock;
pub mod address_budget;
pub mod app;
pub mod audit;
pub mod cli;
pub mod config_file;
pub mod demo;
#[cfg(test)]
mod function_length;
pub mod kubeconfig;
#[cfg(test)]
mod layering;
pub mod memory_trim;
pub mod peer_hangup;
pub mod proxy;
pub mod read_sizer;
pub mod request;
pub mod session_memory;
pub mod session_stop;
pub mod session_traffic;
pub mod sim;
pub mod spdy;
pub mod timestamp;
pub mod translate;
