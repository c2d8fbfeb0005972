//! WebSockets over HTTP/2 (RFC 8441) with the `h2` crate as the client, through the proxy's
//! TLS listener into the simulated SPDY-only cluster: several v5 exec sessions (translated), a
//! followed log (relayed as an HTTP/1.1 WebSocket upstream) and a port-forward tunnel on ONE
//! connection; the handshake's edge cases (plain CONNECT, another `:protocol`, a bad
//! subprotocol or version, the feature turned off); RST_STREAM ending one session only; the
//! drain's GOAWAY letting running sessions finish; a relay whose client never ends its stream
//! ending anyway once the upstream closed; sessions whose reader or writer stalls
//! never stalling a sibling on the same connection; audit events and recordings of translated
//! and relayed sessions saying `HTTP/2`; and the proxy's pings ending a session whose client
//! stream stopped answering, not its sibling.

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
const V5: &str = "v5.channel.k8s.io";

/// The simulated cluster and the proxy over TLS in front of it.
struct Setup {
    sim: SimCluster,
    proxy: ProxyProcess,
    ca: Ca,
    _dir: tempfile::TempDir,
}

async fn setup(extra: &[&str]) -> Setup {
    setup_with(SimConfig::default(), extra).await
}

async fn setup_with(sim: SimConfig, extra: &[&str]) -> Setup {
    let sim = SimCluster::start(sim).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("proxy");
    let (cert, key) = ca.server().write(dir.path(), "serving");
    let (cert, key) = (cert.display().to_string(), key.display().to_string());
    let mut args = vec![
        "--upstream",
        &sim.url(),
        "--tls-cert-file",
        &cert,
        "--tls-private-key-file",
        &key,
    ]
    .into_iter()
    .map(str::to_owned)
    .collect::<Vec<_>>();
    args.extend(extra.iter().map(|s| s.to_string()));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let proxy = ProxyProcess::launch(&refs, &[]);
    Setup {
        sim,
        proxy,
        ca,
        _dir: dir,
    }
}

impl Setup {
    /// An HTTP/2 connection with roomy windows.
    async fn connect(&self) -> H2Connection {
        H2Connection::connect(self.proxy.addr, &self.ca.pem, 1 << 20, 16 << 20).await
    }

    /// The proxy's JSON log lines with `message`, as JSON.
    fn finished(&self, message: &str) -> Vec<serde_json::Value> {
        self.proxy
            .log_lines()
            .iter()
            .filter(|l| l.contains(message))
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// Waits until `n` log lines with `message` are there.
    async fn wait_finished(&self, message: &str, n: usize) -> Vec<serde_json::Value> {
        let deadline = tokio::time::Instant::now() + T;
        loop {
            let lines = self.finished(message);
            if lines.len() >= n || tokio::time::Instant::now() > deadline {
                return lines;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A v5 session's stdout, stderr and exit code (from its Status), read to its Close.
#[derive(Debug, Default, PartialEq)]
struct Outcome {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    exit_code: Option<i64>,
}

async fn read_outcome(ws: &mut H2Ws) -> Outcome {
    let mut o = Outcome::default();
    let mut status = Vec::new();
    while let Some(msg) = tokio::time::timeout(T, ws.next())
        .await
        .expect("session output")
    {
        match msg {
            Ok(Message::Binary(data)) => match data.first() {
                Some(1) => o.stdout.extend_from_slice(&data[1..]),
                Some(2) => o.stderr.extend_from_slice(&data[1..]),
                Some(3) => status.extend_from_slice(&data[1..]),
                _ => {}
            },
            Ok(Message::Close(_)) | Err(_) => break,
            Ok(_) => {}
        }
    }
    let status: serde_json::Value = serde_json::from_slice(&status).expect("a v5 Status");
    o.exit_code = if status["status"] == "Success" {
        Some(0)
    } else {
        status["details"]["causes"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["reason"] == "ExitCode"))
            .and_then(|c| c["message"].as_str())
            .and_then(|m| m.parse().ok())
    };
    o
}

async fn stdin(ws: &mut H2Ws, data: &[u8]) {
    let mut m = vec![0u8];
    m.extend_from_slice(data);
    ws.send(Message::Binary(m.into())).await.unwrap();
}

/// The v5 CLOSE signal for stdin.
async fn close_stdin(ws: &mut H2Ws) {
    ws.send(Message::Binary(vec![255u8, 0].into()))
        .await
        .unwrap();
}

/// Reads stdout until it holds `want` (echo checks).
async fn read_stdout_until(ws: &mut H2Ws, want: &[u8]) {
    let mut got = Vec::new();
    while !got.windows(want.len()).any(|w| w == want) {
        match tokio::time::timeout(T, ws.next()).await.expect("echo") {
            Some(Ok(Message::Binary(data))) if data.first() == Some(&1) => {
                got.extend_from_slice(&data[1..])
            }
            Some(Ok(_)) => {}
            other => panic!("session ended before {want:?}: {other:?} after {got:?}"),
        }
    }
}

fn sh(script: &str) -> String {
    exec_path("web", &["sh", "-c", script], true, true, true)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_sessions_log_and_tunnel_share_one_http2_connection() {
    let s = setup(&[]).await;
    let conn = s.connect().await;
    assert!(
        conn.extended_connect_enabled(),
        "SETTINGS_ENABLE_CONNECT_PROTOCOL not advertised"
    );
    // Three translated execs at once, each with its own stdin, output and exit code.
    let mut sessions = Vec::new();
    for n in 0..3 {
        let path = sh(&format!("cat; echo err{n} >&2; exit {}", n + 2));
        let (ws, chosen) = conn.websocket(&path, V5).await.expect("v5 over h2");
        assert_eq!(chosen, V5);
        sessions.push(ws);
    }
    // A followed log (relayed: the cluster's own WebSocket, asked over HTTP/1.1).
    let (mut log, chosen) = conn
        .websocket(
            "/api/v1/namespaces/default/pods/web/log?follow=true",
            "binary.k8s.io",
        )
        .await
        .expect("log over h2");
    assert_eq!(chosen, "binary.k8s.io");
    for (n, ws) in sessions.iter_mut().enumerate() {
        stdin(ws, format!("hello {n}\n").as_bytes()).await;
    }
    let mut lines = String::new();
    while lines.lines().count() < 12 {
        match tokio::time::timeout(T, log.next()).await.expect("log") {
            Some(Ok(Message::Binary(b))) => lines.push_str(&String::from_utf8_lossy(&b)),
            Some(Ok(_)) => {}
            other => panic!("log ended: {other:?} after {lines:?}"),
        }
    }
    let want: Vec<String> = (1..=12).map(|n| format!("log line {n}")).collect();
    assert_eq!(lines.lines().take(12).collect::<Vec<_>>(), want);
    // A port-forward tunnel (SPDY inside the WebSocket) to an echo service in the pod.
    let pod = common::pod_server::PodServer::echo().await;
    let (tunnel, chosen) = conn
        .websocket(
            "/api/v1/namespaces/default/pods/web/portforward",
            "SPDY/3.1+portforward.k8s.io",
        )
        .await
        .expect("tunnel over h2");
    assert_eq!(chosen, "SPDY/3.1+portforward.k8s.io");
    {
        use kube_ws_proxy::spdy::frame::HeaderBlock;
        use kube_ws_proxy::spdy::proto::{Config, Connection};
        let spdy = Connection::client(
            common::ws_client::as_io(tunnel),
            bytes::Bytes::new(),
            Config::default(),
        );
        let headers = |kind: &str| {
            let mut hb = HeaderBlock::new();
            hb.push("streamtype", kind);
            hb.push("port", pod.port.to_string());
            hb.push("requestid", "0");
            hb
        };
        let _error = spdy.open_stream(headers("error")).await.unwrap();
        let (mut tx, mut rx) = spdy.open_stream(headers("data")).await.unwrap().split();
        tx.send(bytes::Bytes::from(vec![7u8; 100_000]))
            .await
            .unwrap();
        tx.finish().await.unwrap();
        let mut echoed = 0;
        while let Some(chunk) = rx.recv().await {
            echoed += chunk.unwrap().len();
        }
        assert_eq!(echoed, 100_000);
        spdy.close().await;
    }
    for (n, ws) in sessions.iter_mut().enumerate() {
        close_stdin(ws).await;
        let o = read_outcome(ws).await;
        assert_eq!(String::from_utf8_lossy(&o.stdout), format!("hello {n}\n"));
        assert_eq!(String::from_utf8_lossy(&o.stderr), format!("err{n}\n"));
        assert_eq!(o.exit_code, Some(n as i64 + 2));
    }
    log.close(None).await.unwrap();
    drop(log);

    // The proxy saw them all as HTTP/2 sessions of one connection.
    let execs = s.wait_finished("exec session finished", 3).await;
    let relays = s.wait_finished("relayed upgrade finished", 1).await;
    assert_eq!(execs.len(), 3, "{execs:?}");
    let tunnels = s.wait_finished("port-forward tunnel finished", 1).await;
    assert_eq!(relays.len(), 1, "{relays:?}");
    assert_eq!(tunnels.len(), 1, "{tunnels:?}");
    let all: Vec<_> = execs.iter().chain(&relays).chain(&tunnels).collect();
    for l in &all {
        assert_eq!(l["fields"]["http_version"], "2", "{l}");
    }
    let connection = &all[0]["fields"]["connection"];
    assert!(
        all.iter().all(|l| &l["fields"]["connection"] == connection),
        "{all:?}"
    );
    let metrics = s.proxy.metrics();
    assert!(
        metrics.contains(
            r#"kube_ws_proxy_sessions_admitted_total{cluster="default",http_version="2"} 5"#
        ),
        "{metrics}"
    );
    // Upstream, the relayed log was an ordinary HTTP/1.1 WebSocket upgrade.
    let upstream_log = s
        .sim
        .requests()
        .into_iter()
        .find(|r| r.path.ends_with("/log"))
        .expect("log request upstream");
    assert_eq!(upstream_log.header("upgrade"), Some("websocket"));
    assert!(upstream_log.header("sec-websocket-key").is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshake_edge_cases_are_refused_clearly() {
    let s = setup(&[]).await;
    let conn = s.connect().await;

    // A plain CONNECT (no :protocol) asks for a tunnel: 405, saying what is served.
    let (resp, _send) = conn.connect_stream("", None, &[]).await.expect("an answer");
    assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED);
    let body = common::h2_ws::read_body(resp.into_body()).await;
    assert!(body.contains(":protocol websocket"), "{body}");

    // Another :protocol.
    let (resp, _send) = conn
        .connect_stream(
            &sh("true"),
            Some("webtransport"),
            &[("sec-websocket-version", "13")],
        )
        .await
        .expect("an answer");
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);

    // A bearer subprotocol entry offered alone, as on HTTP/1.1.
    let err = conn
        .websocket(&sh("true"), "base64url.bearer.authorization.k8s.io.dG9rZW4")
        .await
        .err()
        .expect("refused");
    assert_eq!(err.status, StatusCode::BAD_REQUEST, "{}", err.body);
    assert!(err.body.contains("bearer"), "{}", err.body);

    // Sec-WebSocket-Version other than 13.
    let (resp, _send) = conn
        .connect_stream(
            &sh("true"),
            Some("websocket"),
            &[
                ("sec-websocket-version", "8"),
                ("sec-websocket-protocol", V5),
            ],
        )
        .await
        .expect("an answer");
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);

    // The connection is fine after all that: a session still works.
    let (mut ws, _) = conn.websocket(&sh("cat"), V5).await.expect("v5");
    stdin(&mut ws, b"still fine\n").await;
    close_stdin(&mut ws).await;
    let o = read_outcome(&mut ws).await;
    assert_eq!(o.stdout, b"still fine\n");
    assert_eq!(o.exit_code, Some(0));
    // Refused before admission: the plain CONNECT, the other :protocol, the bearer entry alone
    // and the wrong version (a handshake is checked before a slot is taken, as on HTTP/1.1).
    let metrics = s.proxy.metrics();
    assert!(
        metrics.contains(
            r#"kube_ws_proxy_sessions_admitted_total{cluster="default",http_version="2"} 1"#
        ),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turned_off_the_proxy_does_not_advertise_it() {
    let s = setup(&["--http2-websockets=false"]).await;
    let conn = s.connect().await;
    assert!(!conn.extended_connect_enabled());
    // h2 itself refuses to send a :protocol the server did not allow.
    assert!(conn
        .connect_stream(&sh("true"), Some("websocket"), &[])
        .await
        .is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rst_stream_ends_only_that_session() {
    let s = setup(&[]).await;
    let conn = s.connect().await;
    let (mut a, _) = conn.websocket(&sh("cat"), V5).await.unwrap();
    let (mut b, _) = conn.websocket(&sh("cat"), V5).await.unwrap();
    stdin(&mut a, b"a1\n").await;
    read_stdout_until(&mut a, b"a1\n").await;
    stdin(&mut b, b"b1\n").await;
    read_stdout_until(&mut b, b"b1\n").await;

    a.get_mut().reset(h2::Reason::CANCEL);
    // The proxy ends A's session (its upstream side too) ...
    let ended = s.wait_finished("exec session finished", 1).await;
    assert_eq!(ended.len(), 1, "{ended:?}");
    assert_eq!(ended[0]["fields"]["http_version"], "2");
    // ... while B goes on to a normal end.
    stdin(&mut b, b"b2\n").await;
    read_stdout_until(&mut b, b"b2\n").await;
    close_stdin(&mut b).await;
    let o = read_outcome(&mut b).await;
    assert_eq!(o.exit_code, Some(0));
    let ended = s.wait_finished("exec session finished", 2).await;
    assert_eq!(ended.len(), 2, "{ended:?}");
    assert!(!conn.driver.is_finished(), "the connection must survive");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_sends_goaway_and_running_sessions_finish() {
    let mut s = setup(&["--drain-timeout", "30s"]).await;
    let conn = s.connect().await;
    let (mut a, _) = conn.websocket(&sh("cat; exit 4"), V5).await.unwrap();
    stdin(&mut a, b"before\n").await;
    read_stdout_until(&mut a, b"before\n").await;

    s.proxy.terminate();
    s.proxy
        .wait_for_log("draining", T)
        .expect("the proxy drains");
    // No new session on this connection any more (GOAWAY, or refused while draining).
    let mut refused = false;
    for _ in 0..100 {
        match conn.websocket(&sh("true"), V5).await {
            Err(e) => {
                assert_ne!(e.status, StatusCode::OK);
                refused = true;
                break;
            }
            Ok(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    assert!(refused, "a new session was accepted while draining");
    // The running one finishes normally, after the GOAWAY.
    stdin(&mut a, b"after\n").await;
    close_stdin(&mut a).await;
    let o = read_outcome(&mut a).await;
    assert_eq!(o.stdout, b"after\n");
    assert_eq!(o.exit_code, Some(4));
    assert_eq!(s.proxy.wait_exit(T), Some(0), "drained and exited");
}

/// Session A's client stops reading (its stream window closes) and session C's upstream stops
/// reading (the proxy stops reading C's stream); siblings B and D on the same connection still
/// move megabytes both ways to completion, and A then completes too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_sessions_do_not_stall_their_siblings() {
    let s = setup(&[]).await;
    // Small stream windows on our side, a connection window with room for all.
    let conn = H2Connection::connect(s.proxy.addr, &s.ca.pem, 64 * 1024, 16 << 20).await;
    const A_BYTES: usize = 8_000_000;
    const B_BYTES: usize = 4_000_000;
    const D_BYTES: usize = 4_000_000;
    let (mut a, _) = conn
        .websocket(&sh(&format!("head -c {A_BYTES} /dev/zero")), V5)
        .await
        .unwrap();
    // C never reads its stdin; we push more into it than any buffer on the way holds (the
    // loopback sockets to the cluster take several MiB).
    let (c, _) = conn.websocket(&sh("sleep 600"), V5).await.unwrap();
    let (mut c_sink, _c_stream) = c.split();
    let c_writer = tokio::spawn(async move {
        let chunk = vec![0u8; 64 * 1024];
        for _ in 0..1024 {
            let mut m = vec![0u8];
            m.extend_from_slice(&chunk);
            if c_sink.send(Message::Binary(m.into())).await.is_err() {
                break;
            }
        }
    });
    // Let A's window and C's pipeline fill.
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Bounded, so that a stalled sibling fails the test instead of hanging it.
    let siblings = async {
        let (mut b, _) = conn
            .websocket(&sh(&format!("head -c {B_BYTES} /dev/zero")), V5)
            .await
            .unwrap();
        let ob = read_outcome(&mut b).await;
        let (mut d, _) = conn.websocket(&sh("wc -c"), V5).await.unwrap();
        let chunk = vec![7u8; 64 * 1024];
        let mut sent = 0;
        while sent < D_BYTES {
            let n = chunk.len().min(D_BYTES - sent);
            stdin(&mut d, &chunk[..n]).await;
            sent += n;
        }
        close_stdin(&mut d).await;
        (ob, read_outcome(&mut d).await)
    };
    let (ob, od) = tokio::time::timeout(T, siblings)
        .await
        .expect("a sibling of the stalled sessions stalled");
    assert_eq!(ob.stdout.len(), B_BYTES);
    assert_eq!(ob.exit_code, Some(0));
    assert_eq!(
        String::from_utf8_lossy(&od.stdout).trim(),
        D_BYTES.to_string()
    );
    assert_eq!(od.exit_code, Some(0));
    assert!(
        !c_writer.is_finished(),
        "C's upstream should still be stalled"
    );

    // A was only paused: reading it now yields everything.
    let oa = read_outcome(&mut a).await;
    assert_eq!(oa.stdout.len(), A_BYTES);
    assert_eq!(oa.exit_code, Some(0));
    c_writer.abort();
}

/// Answers the proxy's Close (tungstenite sends the reply on the next poll), waits for the
/// stream's end and ends our side of it (END_STREAM), as a browser does after a session: a
/// byte relay ends when both sides have.
async fn answer_close(ws: &mut H2Ws) {
    tokio::time::timeout(T, async { while let Some(Ok(_)) = ws.next().await {} })
        .await
        .expect("the session's stream ends");
    tokio::io::AsyncWriteExt::shutdown(ws.get_mut())
        .await
        .unwrap();
}

/// The audit log's events, parsed (empty until written).
fn audit_events(path: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The `started` and `ended` events of the session whose command mentions `marker`, once both
/// are written.
async fn audit_pair(
    path: &std::path::Path,
    marker: &str,
) -> (serde_json::Value, serde_json::Value) {
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let events = audit_events(path);
        let of_session = |stage: &str| {
            events
                .iter()
                .find(|e| {
                    e["stage"] == stage
                        && e["command"]
                            .as_array()
                            .is_some_and(|c| c.iter().any(|a| a.as_str().unwrap().contains(marker)))
                })
                .cloned()
        };
        if let (Some(started), Some(ended)) = (of_session("started"), of_session("ended")) {
            return (started, ended);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no started/ended pair for {marker}: {events:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What an asciicast recording showed (its output events), once its writer has written it.
async fn recorded_output(path: &str) -> String {
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let mut lines = text.lines();
        let header = lines
            .next()
            .and_then(|l| serde_json::from_str::<serde_json::Value>(l).ok());
        let output: String = lines
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|e| e[1] == "o")
            .map(|e| e[2].as_str().unwrap().to_owned())
            .collect();
        if header.is_some_and(|h| h["version"] == 2) && !output.is_empty() {
            return output;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{path} holds no output: {text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A translated v5 exec and a relayed legacy `v4.channel.k8s.io` exec on one HTTP/2
/// connection are audited (`http_version: "HTTP/2"`, exit codes) and recorded like their
/// HTTP/1.1 twins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_over_http2_are_audited_and_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.log");
    let records = dir.path().join("recordings");
    std::fs::create_dir(&records).unwrap();
    let s = setup(&[
        "--audit-log",
        audit.to_str().unwrap(),
        "--record",
        "best-effort",
        "--record-dir",
        records.to_str().unwrap(),
    ])
    .await;
    let conn = s.connect().await;

    // Translated.
    let (mut v5, _) = conn
        .websocket(&sh("echo translated-over-h2; exit 5"), V5)
        .await
        .expect("v5 over h2");
    let o = read_outcome(&mut v5).await;
    assert_eq!(o.stdout, b"translated-over-h2\n");
    assert_eq!(o.exit_code, Some(5));
    answer_close(&mut v5).await;

    // Relayed byte for byte (HTTP/1.1 WebSocket upstream), followed for the recording.
    let legacy = exec_path(
        "web",
        &["sh", "-c", "echo relayed-over-h2; exit 6"],
        false,
        true,
        true,
    );
    let (mut v4, chosen) = conn
        .websocket(&legacy, "v4.channel.k8s.io")
        .await
        .expect("v4 over h2");
    assert_eq!(chosen, "v4.channel.k8s.io");
    let o = read_outcome(&mut v4).await;
    assert_eq!(o.stdout, b"relayed-over-h2\n");
    assert_eq!(o.exit_code, Some(6));
    answer_close(&mut v4).await;

    // Both carry the exit code, and a non-zero one is the outcome on either path.
    for (marker, path, protocol, exit_code, outcome) in [
        ("translated-over-h2", "translated", V5, 5, "non_zero_exit"),
        (
            "relayed-over-h2",
            "relay_websocket",
            "v4.channel.k8s.io",
            6,
            "non_zero_exit",
        ),
    ] {
        let (started, ended) = audit_pair(&audit, marker).await;
        for e in [&started, &ended] {
            assert_eq!(e["http_version"], "HTTP/2", "{e}");
            assert_eq!(e["verb"], "exec", "{e}");
            assert_eq!(e["pod"], "web", "{e}");
        }
        // The `ended` event names the path and protocol the session took; the `started` one,
        // written before the upstream was asked, what was known then: `auto` for a v5 exec
        // (`--upstream-streaming auto` decides on the upstream's answers), and no protocol
        // where the upstream chooses it.
        assert_eq!(ended["protocol_path"], path, "{ended}");
        assert_eq!(ended["protocol"], protocol, "{ended}");
        let started_path = if path == "translated" { "auto" } else { path };
        assert_eq!(started["protocol_path"], started_path, "{started}");
        assert_eq!(started["protocol"], serde_json::Value::Null, "{started}");
        assert_eq!(ended["exit_code"], exit_code, "{ended}");
        assert_eq!(ended["outcome"], outcome, "{ended}");
        assert_eq!(ended["recording_error"], serde_json::Value::Null, "{ended}");
        let recording = ended["recording"].as_str().expect("a recording");
        assert!(recording.starts_with(records.to_str().unwrap()), "{ended}");
        let output = recorded_output(recording).await;
        assert!(output.contains(marker), "{recording}: {output:?}");
    }
}

/// The value of one series on `/metrics` (0 when absent).
fn metric(proxy: &ProxyProcess, series: &str) -> f64 {
    proxy
        .metrics()
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.trim().parse().expect("metric value"))
        .unwrap_or(0.0)
}

/// Waits (at most `timeout`) until `series` reads `want`; how long that took.
async fn wait_metric(proxy: &ProxyProcess, series: &str, want: f64, timeout: Duration) -> Duration {
    let start = tokio::time::Instant::now();
    loop {
        let v = metric(proxy, series);
        if v == want {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < timeout,
            "{series} is {v}, not {want}, after {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The sim's session whose process runs a command mentioning `marker`.
async fn sim_session(sim: &SimCluster, marker: &str) -> u64 {
    let started = sim
        .wait_for_event(T, |e| {
            matches!(e, SimEvent::ProcessStarted { command, .. }
                if command.iter().any(|c| c.contains(marker)))
        })
        .await
        .unwrap_or_else(|| panic!("no process for {marker}"));
    let SimEvent::ProcessStarted { session, .. } = started else {
        unreachable!()
    };
    session
}

/// Keepalive per session over HTTP/2: a WebSocket whose client stops reading its stream (so
/// never answers the proxy's pings; tungstenite answers a ping only when it reads) is ended
/// within the ping interval + timeout, its pod process with it, while a sibling on the same
/// connection that keeps reading answers its pings and goes on working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_stream_that_stops_answering_pings_ends_only_its_session() {
    const EXEC_ACTIVE: &str = r#"kube_ws_proxy_sessions_active{cluster="default",kind="exec"}"#;
    const UNRESPONSIVE: &str = r#"kube_ws_proxy_sessions_total{cluster="default",kind="exec",outcome="client_unresponsive"}"#;
    // Interval + timeout is 3 s; a generous bound for it to be noticed.
    const DETECT: Duration = Duration::from_secs(15);
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.log");
    let s = setup(&[
        "--client-ping-interval",
        "1s",
        "--client-ping-timeout",
        "2s",
        "--audit-log",
        audit.to_str().unwrap(),
    ])
    .await;
    let conn = s.connect().await;
    // A: never read after the handshake.
    let (_silent, _) = conn
        .websocket(&sh("exec sleep 1001"), V5)
        .await
        .expect("A over h2");
    let silent_since = tokio::time::Instant::now();
    let silent_session = sim_session(&s.sim, "sleep 1001").await;
    // B: read all along by its own task (which answers its pings), written from here.
    let (b, _) = conn.websocket(&sh("cat"), V5).await.expect("B over h2");
    let (mut b_sink, mut b_stream) = b.split();
    let (stdout_tx, mut stdout_rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    let b_reader = tokio::spawn(async move {
        let mut status = Vec::new();
        while let Some(msg) = b_stream.next().await {
            match msg {
                Ok(Message::Binary(data)) => match data.first() {
                    Some(1) => {
                        let _ = stdout_tx.send(data[1..].to_vec());
                    }
                    Some(3) => status.extend_from_slice(&data[1..]),
                    _ => {}
                },
                // Read on past the proxy's Close: that sends our reply.
                Ok(_) => {}
                Err(_) => break,
            }
        }
        status
    });
    let mut b_stdout = Vec::new();
    let mut b_echo = async |sink: &mut futures_util::stream::SplitSink<H2Ws, Message>,
                            line: &[u8]| {
        let mut m = vec![0u8];
        m.extend_from_slice(line);
        sink.send(Message::Binary(m.into())).await.unwrap();
        while !b_stdout.windows(line.len()).any(|w| w == line) {
            let chunk = tokio::time::timeout(T, stdout_rx.recv())
                .await
                .expect("B's echo")
                .expect("B's session went on");
            b_stdout.extend_from_slice(&chunk);
        }
    };
    b_echo(&mut b_sink, b"before\n").await;
    wait_metric(&s.proxy, EXEC_ACTIVE, 2.0, T).await;

    // A's pings go unanswered: A ends, B stays.
    wait_metric(&s.proxy, EXEC_ACTIVE, 1.0, DETECT).await;
    // A never answered: its first ping is due an interval after it opened, and it is given the
    // timeout after that; an earlier end would not be the pings'.
    let took = silent_since.elapsed();
    assert!(
        took >= Duration::from_secs(2),
        "A ended {took:?} after it opened"
    );
    assert_eq!(metric(&s.proxy, UNRESPONSIVE), 1.0, "{}", s.proxy.metrics());
    let ended = s.wait_finished("exec session finished", 1).await;
    assert_eq!(ended.len(), 1, "{ended:?}");
    let line = ended[0].to_string();
    assert!(line.contains("client unresponsive"), "{line}");
    assert_eq!(ended[0]["fields"]["http_version"], "2", "{line}");
    // Its pod process is gone: the cluster ended that session.
    let gone = s
        .sim
        .wait_for_event(
            T,
            |e| matches!(e, SimEvent::SessionEnded { session, .. } if *session == silent_session),
        )
        .await;
    assert!(gone.is_some(), "the cluster's session of A did not end");
    assert!(
        s.sim.events().iter().any(
            |e| matches!(e, SimEvent::ProcessExited { session, .. } if *session == silent_session)
        ),
        "A's process did not exit"
    );
    let (_, ended) = audit_pair(&audit, "sleep 1001").await;
    assert_eq!(ended["http_version"], "HTTP/2", "{ended}");
    assert_eq!(ended["outcome"], "client_unresponsive", "{ended}");

    // B, on the same connection, answered its pings throughout and still works.
    b_echo(&mut b_sink, b"after\n").await;
    b_sink
        .send(Message::Binary(vec![255u8, 0].into()))
        .await
        .unwrap();
    let status = tokio::time::timeout(T, b_reader)
        .await
        .expect("B ends")
        .unwrap();
    let status: serde_json::Value = serde_json::from_slice(&status).expect("a v5 Status");
    assert_eq!(status["status"], "Success", "{status}");
    assert_eq!(b_stdout, b"before\nafter\n");
    wait_metric(&s.proxy, EXEC_ACTIVE, 0.0, T).await;
    assert_eq!(metric(&s.proxy, UNRESPONSIVE), 1.0);
    assert!(!conn.driver.is_finished(), "the connection must survive");
}

/// A passed-through session (a relay) over HTTP/2 whose client reads everything, answers the
/// Close, and then never ends its stream: once the upstream has closed, the relay gives the
/// client `--close-drain-timeout` and ends, handing back its slot and the upstream connection
/// rather than holding them until the idle timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_whose_client_never_ends_its_stream_ends_after_the_drain_timeout() {
    const PASSED_ACTIVE: &str =
        r#"kube_ws_proxy_sessions_active{cluster="default",kind="websocket_pass_through"}"#;
    let sim = SimConfig {
        streaming: SimStreaming::New,
        ..SimConfig::default()
    };
    let s = setup_with(
        sim,
        &[
            "--upstream-streaming",
            "websocket",
            "--close-drain-timeout",
            "1s",
        ],
    )
    .await;
    let conn = s.connect().await;
    let (mut ws, _) = conn.websocket(&sh("echo relayed"), V5).await.unwrap();
    let o = read_outcome(&mut ws).await;
    assert_eq!(
        (o.stdout.as_slice(), o.exit_code),
        (&b"relayed\n"[..], Some(0))
    );
    // `ws` stays open: its stream is never ended or reset from this side. The relay ends a
    // second after the upstream closed (well before the 4 h idle timeout).
    wait_metric(&s.proxy, PASSED_ACTIVE, 0.0, Duration::from_secs(10)).await;
    let ended = s.wait_finished("relayed upgrade finished", 1).await;
    assert_eq!(ended.len(), 1, "{ended:?}");
    assert_eq!(ended[0]["fields"]["http_version"], "2", "{:?}", ended[0]);
    assert!(!conn.driver.is_finished(), "the connection must survive");
    drop(ws);
}
