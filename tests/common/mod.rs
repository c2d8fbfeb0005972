//! Shared helpers for the end-to-end tests: locating real clients, running the proxy binary,
//! the SPDY-dropping middlebox, running programs under a pseudo-terminal, and headless
//! Chromium with the server of its test page.
#![allow(dead_code)]

pub mod bearer;
pub mod browser;
pub mod clients;
pub mod connect_proxy;
pub mod exec_suite;
pub mod forward;
pub mod go_front;
pub mod h2_ws;
pub mod hangup;
pub mod harness;
pub mod middlebox;
pub mod operated;
pub mod page_server;
pub mod pki;
pub mod pod_server;
pub mod proxy_process;
pub mod pty;
pub mod replay;
pub mod rewriter;
pub mod s3;
pub mod sims;
pub mod tls_client;
pub mod ws_client;
