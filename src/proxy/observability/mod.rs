//! What operators see of the proxy itself.
//!
//! - [`metrics`]: the Prometheus metrics served on the admin listener.
//! - [`log_throttle`]: aggregation of repeated log lines.
//! - [`readiness`]: the shared, cached verdict behind `/readyz`.
//!
//! Session audit events are written by `sessions::lifecycle::audit` into the crate's `audit`;
//! the admin listener that serves these is `listen::admin`. May use `wire` only, so every
//! room may count and log.

pub mod log_throttle;
pub mod metrics;
pub mod readiness;
