//! The integration tests, as one test binary (`integration`): each file in tests/ is a module
//! of it, and tests/common/ holds their shared helpers. One binary compiles the helpers once and
//! links the crate once; a binary per file did both some thirty times, which was most of the
//! test build. Cargo.toml turns off Cargo's one-binary-per-file discovery (`autotests = false`),
//! so a new file in tests/ must be declared here; `every_test_file_is_declared` fails if one
//! is not.
//!
//! Run one file's tests with a filter on its module, e.g.
//! `cargo nextest run --release --test integration e2e_exec::` (or
//! `cargo test --release --test integration e2e_exec::`).

mod common;

mod config_file;
mod container_image;
mod dependency_policy;
mod deployment_files;
mod e2e_audit;
mod e2e_audit_flood;
mod e2e_browser;
mod e2e_browser_http2;
mod e2e_cancellation;
mod e2e_console;
mod e2e_exec;
mod e2e_exec_errors;
mod e2e_fleet;
mod e2e_fleet_credentials;
mod e2e_fleet_hosts;
mod e2e_fleet_http2;
mod e2e_fleet_isolation;
mod e2e_fleet_kubectl;
mod e2e_fleet_limits;
mod e2e_fleet_reload;
mod e2e_front_door;
mod e2e_front_door_errors;
mod e2e_hangup;
mod e2e_http2_websocket;
mod e2e_keepalive;
mod e2e_memory;
mod e2e_node;
mod e2e_node_proxy;
mod e2e_operations;
mod e2e_port_forward;
mod e2e_python;
mod e2e_recording;
mod e2e_recording_cap;
mod e2e_request_reading;
mod e2e_reverse;
mod e2e_security;
mod e2e_session_ends;
mod e2e_session_status;
mod e2e_sessions_api;
mod e2e_sessions_discovery;
mod e2e_sessions_recording;
mod e2e_sessions_replicas;
mod e2e_sessions_terminate;
mod e2e_slow_clients;
mod e2e_spdy_headers;
mod e2e_tls;
mod e2e_upload;
mod e2e_upstream_streaming;
mod go_url_differential;
mod monitoring_files;
mod sim_cluster;
mod sim_identity;
mod sim_streaming_modes;
mod spdy_header_differential;
mod spdy_interop;

/// Cargo no longer makes a binary of each file in tests/, so a file not declared above would
/// compile nowhere and its tests would silently not run.
#[test]
fn every_test_file_is_declared() {
    let tests = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let main = include_str!("main.rs");
    for entry in std::fs::read_dir(&tests).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        let Some(module) = name.strip_suffix(".rs") else {
            continue;
        };
        if module != "main" {
            assert!(
                main.lines().any(|l| l == format!("mod {module};")),
                "tests/{name} is not declared in tests/main.rs: add `mod {module};`"
            );
        }
    }
}
