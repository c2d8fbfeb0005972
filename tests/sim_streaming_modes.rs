//! The simulated cluster's streaming modes on their own (no proxy): a `New` cluster serves
//! kubectl 1.31+'s v5 exec and port-forward tunnel natively, so kubectl needs no SPDY even behind
//! the SPDY-dropping gateway; a `WebSocketOnly` cluster refuses SPDY; raw v5 sessions follow
//! kube-apiserver's translator (CLOSE signal, status, resize, refusal inside the WebSocket).

use crate::common;

use std::time::Duration;

use common::clients::require_kubectl;
use common::forward::{self, Forward};
use common::harness::{run, stderr, stdout};
use common::middlebox::Middlebox;
use common::pod_server::PodServer;
use common::sims::of_kind as sim;
use common::ws_client;
use kube_ws_proxy::sim::{SimCluster, SimEvent, SimStreaming, Transport};

const T: Duration = Duration::from_secs(60);

fn kubectl(k: &std::path::Path, dir: &std::path::Path, server: &str) -> std::process::Command {
    let kubeconfig = common::clients::write_kubeconfig(dir, server, None);
    let mut cmd = std::process::Command::new(k);
    cmd.arg("--kubeconfig")
        .arg(kubeconfig)
        .env("HOME", dir)
        .env_remove("KUBECONFIG")
        .env_remove("KUBECTL_REMOTE_COMMAND_WEBSOCKETS")
        .env_remove("KUBECTL_PORT_FORWARD_WEBSOCKETS");
    cmd
}

/// The protocols of every session the cluster started, in order.
fn session_protocols(sim: &SimCluster) -> Vec<(Transport, String)> {
    sim.events()
        .into_iter()
        .filter_map(|e| match e {
            SimEvent::SessionStarted {
                transport,
                protocol,
                ..
            } => Some((transport, protocol)),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_cluster_serves_kubectl_1_33_without_spdy() {
    let Some(k) = require_kubectl("1.33") else {
        return;
    };
    let sim = sim(SimStreaming::New).await;
    let gateway = Middlebox::start(sim.addr()).await;
    let dir = tempfile::tempdir().unwrap();
    let server = format!("http://{}", gateway.addr);

    let mut c = kubectl(&k, dir.path(), &server);
    c.args(["exec", "web", "--", "echo", "native v5"]);
    let o = run(c, None, T).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "native v5\n");

    // stdin EOF (the CLOSE signal) ends `cat`.
    let mut c = kubectl(&k, dir.path(), &server);
    c.args(["exec", "-i", "web", "--", "cat"]);
    let o = run(c, Some(b"through v5\n".to_vec()), T).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "through v5\n");

    let mut c = kubectl(&k, dir.path(), &server);
    c.args(["exec", "web", "--", "sh", "-c", "exit 3"]);
    let o = run(c, None, T).await;
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));

    let pod = PodServer::commands().await;
    let f = Forward::start(kubectl(&k, dir.path(), &server), "web", &[pod.port]).await;
    assert!(f.ready(), "port-forward did not start: {}", f.stderr());
    forward::echo(f.port(pod.port), 1 << 20).await;
    drop(f);

    assert_eq!(gateway.dropped(), 0, "kubectl fell back to SPDY");
    let sessions = session_protocols(&sim);
    let v5 = (Transport::WebSocket, "v5.channel.k8s.io".to_string());
    let tunnel = (
        Transport::WebSocket,
        "SPDY/3.1+portforward.k8s.io".to_string(),
    );
    assert_eq!(sessions, vec![v5.clone(), v5.clone(), v5, tunnel]);
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_only_cluster_refuses_spdy() {
    let (Some(old), Some(new)) = (require_kubectl("1.28"), require_kubectl("1.33")) else {
        return;
    };
    let sim = sim(SimStreaming::WebSocketOnly).await;
    let dir = tempfile::tempdir().unwrap();

    let mut c = kubectl(&old, dir.path(), &sim.url());
    c.args(["exec", "web", "--", "echo", "never"]);
    let o = run(c, None, T).await;
    assert!(!o.status.success(), "SPDY exec passed: {}", stdout(&o));
    assert!(
        stderr(&o).contains("SPDY upgrades are not allowed"),
        "{}",
        stderr(&o)
    );

    let mut c = kubectl(&new, dir.path(), &sim.url());
    c.args(["exec", "web", "--", "echo", "websocket only"]);
    let o = run(c, None, T).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "websocket only\n");

    let pod = PodServer::commands().await;
    let f = Forward::start(kubectl(&new, dir.path(), &sim.url()), "web", &[pod.port]).await;
    assert!(f.ready(), "port-forward did not start: {}", f.stderr());
    forward::echo(f.port(pod.port), 64 << 10).await;
    drop(f);

    let requests = sim.requests();
    assert!(requests.iter().any(|r| r
        .header("upgrade")
        .is_some_and(|u| u.eq_ignore_ascii_case("SPDY/3.1"))));
    let sessions = session_protocols(&sim);
    assert!(
        sessions.iter().all(|(t, _)| *t == Transport::WebSocket),
        "{sessions:?}"
    );
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_cluster_refuses_v5_and_the_tunnel() {
    let sim = sim(SimStreaming::SpdyOnly).await;
    let path = ws_client::exec_path("web", &["echo", "hi"], false, true, false);
    let err = ws_client::connect(sim.addr(), &path, "v5.channel.k8s.io")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("403"), "{err}");
    let err = ws_client::connect(
        sim.addr(),
        "/api/v1/namespaces/default/pods/web/portforward",
        "SPDY/3.1+portforward.k8s.io",
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("400"), "{err}");
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_v5_sessions_behave_like_the_translator() {
    let sim = sim(SimStreaming::New).await;

    // v5 is chosen even when offered after v4; the CLOSE signal ends stdin.
    let path = ws_client::exec_path("web", &["cat"], true, true, false);
    let (mut ws, resp) =
        ws_client::connect(sim.addr(), &path, "v4.channel.k8s.io, v5.channel.k8s.io")
            .await
            .unwrap();
    assert_eq!(
        resp.headers()["sec-websocket-protocol"],
        "v5.channel.k8s.io"
    );
    ws_client::send(&mut ws, b"\x00hello\n").await;
    ws_client::send(&mut ws, &[0xFF, 0x00]).await;
    let t = ws_client::read_to_close(&mut ws).await;
    assert_eq!(t.messages.first().map(Vec::as_slice), Some(&[1u8][..]));
    assert_eq!(t.stdout, b"hello\n");
    assert_eq!(t.status, br#"{"metadata":{},"status":"Success"}"#);
    assert_eq!(t.close.map(|c| u16::from(c.code)), Some(1000));

    // tty: the first size reaches the terminal.
    let path = "/api/v1/namespaces/default/pods/web/exec?command=stty&command=size&stdin=true&stdout=true&tty=true";
    let (mut ws, _) = ws_client::connect(sim.addr(), path, "v5.channel.k8s.io")
        .await
        .unwrap();
    ws_client::send(&mut ws, b"\x04{\"Width\":100,\"Height\":40}\n").await;
    let t = ws_client::read_to_close(&mut ws).await;
    assert_eq!(String::from_utf8_lossy(&t.stdout).trim(), "40 100");

    // A malformed CLOSE signal ends the session without a status.
    let path = ws_client::exec_path("web", &["sleep", "30"], true, true, false);
    let (mut ws, _) = ws_client::connect(sim.addr(), &path, "v5.channel.k8s.io")
        .await
        .unwrap();
    ws_client::send(&mut ws, &[0xFF, 0x09]).await;
    let t = tokio::time::timeout(T, ws_client::read_to_close(&mut ws))
        .await
        .expect("session ended");
    assert!(t.status.is_empty(), "{:?}", t.status);

    // A kubelet error comes inside the WebSocket, as the translator reports it.
    let path = ws_client::exec_path("error500-x", &["true"], false, true, false);
    let (mut ws, _) = ws_client::connect(sim.addr(), &path, "v5.channel.k8s.io")
        .await
        .unwrap();
    let t = ws_client::read_to_close(&mut ws).await;
    let status: serde_json::Value = serde_json::from_slice(&t.status).unwrap();
    assert_eq!(status["reason"], "InternalError");
    assert_eq!(status["code"], 500);
    assert!(status["message"]
        .as_str()
        .unwrap()
        .contains("container runtime is not responding"));
    assert_eq!(t.close.map(|c| u16::from(c.code)), Some(1000));

    // Legacy protocols are still the kubelet's.
    let path = ws_client::exec_path("web", &["echo", "v4"], false, true, false);
    let (mut ws, resp) = ws_client::connect(sim.addr(), &path, "v4.channel.k8s.io")
        .await
        .unwrap();
    assert_eq!(
        resp.headers()["sec-websocket-protocol"],
        "v4.channel.k8s.io"
    );
    assert_eq!(ws_client::read_to_close(&mut ws).await.stdout, b"v4\n");
    sim.shutdown().await;
}
