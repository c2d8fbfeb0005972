//! The HTTP front door: listeners, routing, relaying and upstream connections.

pub mod admin;
pub mod auth;
pub mod classify;
pub mod connection_deadline;
pub mod exec_handler;
pub mod forward;
pub mod headers;
pub mod kubeconfig;
pub mod listener_tls;
pub mod maybe_tls;
pub mod metrics;
pub mod relay;
pub mod self_subject_review;
pub mod server;
pub mod session_audit;
pub mod sessions;
pub mod spdy_dial;
pub mod state;
pub mod status_response;
pub mod tcp_keepalive;
pub mod tunnel_handler;
pub mod upgrade_request;
pub mod upstream;
pub mod upstream_client_cert;
pub mod upstream_source;
pub mod websocket;
