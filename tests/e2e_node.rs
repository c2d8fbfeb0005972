//! The official Kubernetes JavaScript client (`@kubernetes/client-node`, tests/node/) through
//! the SPDY-dropping gateway and kube-ws-proxy into the simulated SPDY-only cluster: exec with
//! its own protocol list (v5 first: translated to SPDY, stdin ended with the CLOSE signal) and
//! with only `v4.channel.k8s.io` (relayed). The client sees stdout, stderr and the non-zero
//! exit code in both; the cluster demands the kubeconfig's token on every request.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::bearer::{self, Carrier};
use common::clients::{node_project, node_with_client_node, require};
use common::harness::{run, stderr, Harness};
use kube_ws_proxy::sim::{SeenRequest, SimConfig};
use serde_json::Value;

const TOKEN: &str = "node-client-token";
const EXEC_PATH: &str = "/api/v1/namespaces/default/pods/web/exec";
const T: Duration = Duration::from_secs(45);

/// A kubeconfig for the gateway as client-node needs it for `http://`: it refuses plain HTTP
/// unless TLS verification is off.
fn kubeconfig(h: &Harness) -> PathBuf {
    let path = h.dir.path().join("node-kubeconfig");
    let yaml = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: gateway\n  cluster:\n    \
         server: http://{}\n    insecure-skip-tls-verify: true\ncontexts:\n- name: gateway\n  \
         context:\n    cluster: gateway\n    user: tester\n    namespace: default\n\
         current-context: gateway\nusers:\n- name: tester\n  user:\n    token: {TOKEN}\n",
        h.middlebox.addr
    );
    std::fs::write(&path, yaml).unwrap();
    path
}

/// Runs tests/node/exec.mjs in `mode`, returning what the client observed.
async fn exec(h: &Harness, node: &Path, mode: &str) -> Value {
    let mut cmd = std::process::Command::new(node);
    cmd.current_dir(node_project())
        .arg("exec.mjs")
        .arg(kubeconfig(h))
        .arg(mode)
        .env_remove("KUBECONFIG");
    let o = run(cmd, None, T).await;
    assert!(o.status.success(), "node client failed: {}", stderr(&o));
    let line = String::from_utf8_lossy(&o.stdout);
    serde_json::from_str(line.trim()).unwrap_or_else(|e| panic!("bad output {line:?}: {e}"))
}

async fn start() -> Harness {
    let sim = SimConfig {
        require_bearer_token: Some(TOKEN.into()),
        ..SimConfig::default()
    };
    // The translation's exact upstream requests are checked: no WebSocket attempt first
    // (`auto` against this SPDY-only cluster would make one).
    Harness::start_with(sim, &["--upstream-streaming", "spdy"]).await
}

/// The cluster's exec requests, each checked to carry the token as a header.
fn exec_requests(h: &Harness) -> Vec<SeenRequest> {
    let seen: Vec<_> = h
        .sim
        .requests()
        .into_iter()
        .filter(|r| r.path == EXEC_PATH)
        .collect();
    assert!(!seen.is_empty(), "the cluster saw no exec");
    for r in &seen {
        assert_eq!(bearer::carrier(r, TOKEN), Carrier::Header, "{r:?}");
    }
    seen
}

fn assert_websocket_only(h: &Harness) {
    assert!(
        h.middlebox.websockets() > 0,
        "no WebSocket reached the proxy"
    );
    assert_eq!(h.middlebox.dropped(), 0, "the client tried SPDY");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_v5_exec_is_translated_to_spdy() {
    let Some(node) = require(
        "node with tests/node installed (npm ci)",
        node_with_client_node(),
    ) else {
        return;
    };
    let h = start().await;
    let r = exec(&h, &node, "v5").await;
    assert_eq!(r["protocol"], "v5.channel.k8s.io", "{r}");
    // `cat` ends only on EOF: the client's CLOSE signal got through as end of stdin.
    assert_eq!(r["stdout"], "line from node\n", "{r}");
    assert_eq!(r["stderr"], "to-stderr\n", "{r}");
    assert_eq!(r["status"]["reason"], "NonZeroExitCode", "{r}");
    assert_eq!(r["exitCode"], 3, "{r}");
    assert_websocket_only(&h);
    // The translation happened: the SPDY-only cluster got SPDY, never a WebSocket.
    for req in exec_requests(&h) {
        assert_eq!(req.method, "POST", "{req:?}");
        let upgrade = req.header("upgrade").unwrap_or_default();
        assert!(upgrade.starts_with("SPDY/3.1"), "{req:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_v4_only_exec_is_relayed() {
    let Some(node) = require(
        "node with tests/node installed (npm ci)",
        node_with_client_node(),
    ) else {
        return;
    };
    let h = start().await;
    let r = exec(&h, &node, "v4").await;
    assert_eq!(r["protocol"], "v4.channel.k8s.io", "{r}");
    assert_eq!(r["stdout"], "got:line from node\n", "{r}");
    assert_eq!(r["stderr"], "to-stderr\n", "{r}");
    assert_eq!(r["status"]["reason"], "NonZeroExitCode", "{r}");
    assert_eq!(r["exitCode"], 4, "{r}");
    assert_websocket_only(&h);
    // Relayed: the cluster served the v4 WebSocket itself.
    for req in exec_requests(&h) {
        assert_eq!(req.header("upgrade"), Some("websocket"), "{req:?}");
        assert_eq!(
            req.header("sec-websocket-protocol"),
            Some("v4.channel.k8s.io"),
            "{req:?}"
        );
    }
}
