//! The fleet over HTTP/2: one TLS connection to the proxy carries RFC 8441 v5 execs to three
//! simulated clusters of different kinds (an old SPDY-only one: translated; a new one: passed
//! through; a WebSocket-only one) and plain requests to each, every stream routed by its own
//! `/clusters/NAME/` prefix, removed before it goes upstream; an unknown name and a path trick
//! on the same connection reach no cluster.

use crate::common;

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use http::StatusCode;
use kube_ws_proxy::sim::{SimCluster, SimConfig, SimEvent, SimStreaming};
use tokio_tungstenite::tungstenite::Message;

use common::h2_ws::{H2Connection, H2Ws};
use common::pki::Ca;
use common::proxy_process::ProxyProcess;
use common::ws_client::exec_path;

const T: Duration = Duration::from_secs(60);

const CLUSTERS: [(&str, SimStreaming); 3] = [
    ("old", SimStreaming::SpdyOnly),
    ("new", SimStreaming::New),
    ("ws-only", SimStreaming::WebSocketOnly),
];

/// A v5 session's stdout and whether its Status said Success, read to its Close.
async fn run_to_end(ws: &mut H2Ws) -> (Vec<u8>, bool) {
    let (mut stdout, mut status) = (Vec::new(), Vec::new());
    while let Some(msg) = tokio::time::timeout(T, ws.next()).await.expect("output") {
        match msg {
            Ok(Message::Binary(data)) => match data.first() {
                Some(1) => stdout.extend_from_slice(&data[1..]),
                Some(3) => status.extend_from_slice(&data[1..]),
                _ => {}
            },
            Ok(Message::Close(_)) | Err(_) => break,
            Ok(_) => {}
        }
    }
    let status: serde_json::Value = serde_json::from_slice(&status).expect("a v5 Status");
    (stdout, status["status"] == "Success")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_http2_connection_streams_to_each_cluster_by_its_prefix() {
    let mut sims = Vec::new();
    for (_, streaming) in CLUSTERS {
        let sim = SimCluster::start(SimConfig {
            streaming,
            ..SimConfig::default()
        })
        .await
        .unwrap();
        sims.push(sim);
    }
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("proxy");
    let (cert, key) = ca.server().write(dir.path(), "serving");
    let (cert, key) = (cert.display().to_string(), key.display().to_string());
    let flags: Vec<String> = CLUSTERS
        .iter()
        .zip(&sims)
        .map(|((name, _), sim)| format!("{name}={}", sim.url()))
        .collect();
    let mut args = vec!["--tls-cert-file", &cert, "--tls-private-key-file", &key];
    for flag in &flags {
        args.extend(["--cluster", flag.as_str()]);
    }
    let proxy = ProxyProcess::launch(&args, &[]);
    let conn = H2Connection::connect(proxy.addr, &ca.pem, 1 << 20, 16 << 20).await;
    assert!(conn.extended_connect_enabled());

    // Sessions to all three at once, on one connection.
    let mut sessions = Vec::new();
    for (name, _) in CLUSTERS {
        let path = format!(
            "/clusters/{name}{}",
            exec_path("web", &["cat"], true, true, false)
        );
        let (ws, chosen) = conn
            .websocket(&path, "v5.channel.k8s.io")
            .await
            .unwrap_or_else(|r| panic!("{name}: {} {}", r.status, r.body));
        assert_eq!(chosen, "v5.channel.k8s.io");
        sessions.push((name, ws));
    }
    for (name, ws) in &mut sessions {
        let line = format!("\x00hello {name}\n");
        ws.send(Message::Binary(line.into_bytes().into()))
            .await
            .unwrap();
        ws.send(Message::Binary(vec![255u8, 0].into()))
            .await
            .unwrap();
    }
    for (name, ws) in &mut sessions {
        let (stdout, success) = run_to_end(ws).await;
        assert_eq!(String::from_utf8_lossy(&stdout), format!("hello {name}\n"));
        assert!(success, "{name}: the exit Status");
    }
    // Plain requests on the same connection, to each cluster.
    for (name, _) in CLUSTERS {
        let (status, body) = conn.get(&format!("/clusters/{name}/version")).await;
        assert_eq!(status, StatusCode::OK, "{name}: {body}");
    }
    // An unknown name and a trick: refused on this connection, which goes on serving.
    let unknown = format!(
        "/clusters/nope{}",
        exec_path("web", &["true"], false, true, false)
    );
    let refused = conn
        .websocket(&unknown, "v5.channel.k8s.io")
        .await
        .err()
        .unwrap();
    assert_eq!(refused.status, StatusCode::NOT_FOUND, "{}", refused.body);
    assert!(!refused.body.contains("old") && !refused.body.contains("ws-only"));
    let trick = format!(
        "/clusters/old/..{}",
        exec_path("web", &["true"], false, true, false)
    );
    let refused = conn
        .websocket(&trick, "v5.channel.k8s.io")
        .await
        .err()
        .unwrap();
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{}", refused.body);
    let (status, _) = conn.get("/clusters/new/version").await;
    assert_eq!(status, StatusCode::OK);

    // Each cluster ran exactly its own session and never saw the prefix.
    for ((name, _), sim) in CLUSTERS.iter().zip(&sims) {
        let started = sim
            .events()
            .iter()
            .filter(|e| matches!(e, SimEvent::SessionStarted { .. }))
            .count();
        assert_eq!(started, 1, "{name}: sessions");
        for r in sim.requests() {
            assert!(!r.path.starts_with("/clusters"), "{name}: {}", r.path);
        }
    }
}
