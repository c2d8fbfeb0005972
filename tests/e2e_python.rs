//! The official Kubernetes Python client through kube-ws-proxy into the simulated SPDY-only
//! cluster: v5 exec (translated; stdin ended with the CLOSE signal), v4 exec and the legacy
//! WebSocket port-forward (both relayed). It goes through the SPDY-dropping gateway like every
//! other WebSocket client.

mod common;

use std::path::Path;
use std::time::Duration;

use common::clients::{python_with_kubernetes, require};
use common::harness::{run, stderr, Harness};
use common::pod_server::PodServer;

const T: Duration = Duration::from_secs(180);

fn script() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/k8s_client.py")
}

async fn python(h: &Harness, py: &Path, args: &[&str]) -> serde_json::Value {
    let mut cmd = std::process::Command::new(py);
    cmd.arg(script())
        .arg(format!("http://{}", h.middlebox.addr))
        .args(args);
    let o = run(cmd, None, T).await;
    assert!(o.status.success(), "python client failed: {}", stderr(&o));
    let line = String::from_utf8_lossy(&o.stdout);
    serde_json::from_str(line.trim()).unwrap_or_else(|e| panic!("bad output {line:?}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_v5_exec_with_close_signal_and_exit_code() {
    let Some(py) = require(
        "python3 with the kubernetes package",
        python_with_kubernetes(),
    ) else {
        return;
    };
    let h = Harness::start().await;
    let r = python(&h, &py, &["exec-v5"]).await;
    assert_eq!(r["subprotocol"], "v5.channel.k8s.io", "{r}");
    assert_eq!(r["stdout"], "hello from python\ndone\n", "{r}");
    assert_eq!(r["returncode"], 3, "{r}");
    assert!(h.middlebox.websockets() > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_v4_exec_is_relayed() {
    let Some(py) = require(
        "python3 with the kubernetes package",
        python_with_kubernetes(),
    ) else {
        return;
    };
    let h = Harness::start().await;
    let r = python(&h, &py, &["exec-v4"]).await;
    assert_eq!(r["subprotocol"], "v4.channel.k8s.io", "{r}");
    assert_eq!(r["stdout"], "out\n", "{r}");
    assert_eq!(r["stderr"], "err\n", "{r}");
    assert_eq!(r["returncode"], 4, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_port_forward_is_byte_exact_both_ways() {
    let Some(py) = require(
        "python3 with the kubernetes package",
        python_with_kubernetes(),
    ) else {
        return;
    };
    let h = Harness::start().await;
    let pod = PodServer::echo().await;
    let port = pod.port.to_string();
    let size = (8 * 1024 * 1024).to_string();
    let r = python(&h, &py, &["portforward", &port, &size]).await;
    assert_eq!(r["sent"], 8 * 1024 * 1024, "{r}");
    assert_eq!(r["received"], 8 * 1024 * 1024, "{r}");
    assert_eq!(r["sent_sha256"], r["received_sha256"], "{r}");
    assert!(r["error"].is_null(), "{r}");
    assert_eq!(pod.accepted(), 1);
}
