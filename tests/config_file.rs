//! `--config` with the real binary: a file value applies unless the environment or the
//! command line sets the same flag (command line > environment > file > default).

use crate::common;

use std::time::Duration;

use common::proxy_process::ProxyProcess;
use kube_ws_proxy::sim::{SimCluster, SimConfig};

/// `GET /version` through the proxy: the status line.
fn version_status(proxy: &ProxyProcess) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(proxy.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(
        s,
        "GET /version HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    answer.lines().next().unwrap_or_default().to_owned()
}

/// A v5 exec upgrade through the proxy: the status line (429 when the file's session limit of
/// zero applies).
fn exec_status(proxy: &ProxyProcess) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(proxy.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(
        s,
        "GET /api/v1/namespaces/default/pods/web/exec?command=true&stdout=true HTTP/1.1\r\n\
         Host: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: v5.channel.k8s.io\r\n\r\n"
    )
    .unwrap();
    let mut answer = vec![0u8; 512];
    let n = s.read(&mut answer).unwrap();
    String::from_utf8_lossy(&answer[..n])
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn command_line_beats_environment_beats_file() {
    let sim = SimCluster::start(SimConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.yaml");
    // The file's upstream is a closed port; its session limit of zero must still apply.
    std::fs::write(
        &file,
        "# kube-ws-proxy settings\nupstream: http://127.0.0.1:9\nmax-sessions: 0\n",
    )
    .unwrap();
    let config = file.display().to_string();

    // File only: the dead upstream answers 502.
    let proxy = ProxyProcess::launch(&["--config", &config], &[]);
    assert!(version_status(&proxy).contains(" 502 "));
    drop(proxy);

    // The environment beats the file; the file's other values still apply.
    let sim_url = sim.url();
    let proxy = ProxyProcess::launch(
        &["--config", &config],
        &[("KUBE_WS_PROXY_UPSTREAM", sim_url.as_str())],
    );
    assert!(version_status(&proxy).contains(" 200 "));
    assert!(exec_status(&proxy).contains(" 429 "));
    drop(proxy);

    // The command line beats the environment (and the file).
    let proxy = ProxyProcess::launch(
        &[
            "--config",
            &config,
            "--upstream",
            &sim_url,
            "--max-sessions",
            "5",
        ],
        &[("KUBE_WS_PROXY_UPSTREAM", "http://127.0.0.1:9")],
    );
    assert!(version_status(&proxy).contains(" 200 "));
    assert!(exec_status(&proxy).contains(" 101 "));
}

#[test]
fn a_bad_file_stops_the_start_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.yaml");
    std::fs::write(&file, "upstream: http://127.0.0.1:9\nmax-sesions: 3\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kube-ws-proxy"))
        .args(["--config", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(r#"unknown key "max-sesions""#), "{err}");
}
