//! The official Kubernetes Python client through kube-ws-proxy into the simulated SPDY-only
//! cluster: v5 exec (translated; stdin ended with the CLOSE signal), v4 exec and the legacy
//! WebSocket port-forward (both relayed). It goes through the SPDY-dropping gateway like every
//! other WebSocket client.

use crate::common;

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
    python_at(&format!("http://{}", h.middlebox.addr), py, args).await
}

/// What `k8s_client.py` saw with `server` as its client's host (a URL with a path too).
pub(crate) async fn python_at(server: &str, py: &Path, args: &[&str]) -> serde_json::Value {
    let mut cmd = std::process::Command::new(py);
    cmd.arg(script()).arg(server).args(args);
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

/// Recordings and audit with the Python client: v5 (translated) and v4 (relayed, followed
/// passively), each replayed by `asciinema cat` to exactly what the client read, with the exit
/// code in the audit event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sessions_are_recorded_and_audited_on_both_paths() {
    let (Some(py), Some(asciinema)) = (
        require(
            "python3 with the kubernetes package",
            python_with_kubernetes(),
        ),
        common::clients::require_asciinema(),
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let records = dir.path().join("recordings");
    std::fs::create_dir(&records).unwrap();
    let audit = dir.path().join("audit.log");
    let h = Harness::start_with(
        kube_ws_proxy::sim::SimConfig::default(),
        &[
            "--record",
            "required",
            "--record-dir",
            &records.display().to_string(),
            "--audit-log",
            &audit.display().to_string(),
        ],
    )
    .await;
    for (mode, protocol, path, shown, exit) in [
        (
            "exec-v5",
            "v5.channel.k8s.io",
            "translated",
            "hello from python\ndone\n",
            3,
        ),
        (
            "exec-v4",
            "v4.channel.k8s.io",
            "relay_websocket",
            "out\nerr\n",
            4,
        ),
    ] {
        let r = python(&h, &py, &[mode]).await;
        assert_eq!(r["subprotocol"], protocol, "{r}");
        assert_eq!(r["returncode"], exit, "{r}");
        let ended = common::replay::ended_event(&audit, "web", path).await;
        assert_eq!(ended["protocol_path"], path, "{ended}");
        assert_eq!(ended["exit_code"], exit, "{ended}");
        let recording = std::path::PathBuf::from(ended["recording"].as_str().expect("recorded"));
        // The writer finishes the file on its own thread just after the session.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let asciinema = asciinema.clone();
        let replayed =
            tokio::task::spawn_blocking(move || common::replay::replay(&asciinema, &recording))
                .await
                .unwrap();
        let client_saw = format!(
            "{}{}",
            r["stdout"].as_str().unwrap(),
            r["stderr"].as_str().unwrap()
        );
        common::replay::assert_same_lines(
            &replayed,
            shown,
            &format!("the client read {client_saw:?}"),
        );
        assert_eq!(replayed.len(), client_saw.len());
    }
}
