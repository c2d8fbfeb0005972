//! Shared helpers for the end-to-end tests: locating real clients, running the proxy binary,
//! the SPDY-dropping middlebox, and running programs under a pseudo-terminal.
#![allow(dead_code)]

pub mod clients;
pub mod harness;
pub mod middlebox;
pub mod pod_server;
pub mod proxy_process;
pub mod pty;
pub mod ws_client;
