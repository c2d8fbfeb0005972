//! Operating the proxy: `/metrics`, `/readyz`, graceful drain on SIGTERM, `--max-sessions`
//! and the JSON session log, all against the real binary.

use crate::common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

use common::harness::Harness;
use common::proxy_process::http_get;
use common::ws_client::{connect, exec_path, read_to_close, send};
use kube_ws_proxy::sim::SimConfig;

const T: Duration = Duration::from_secs(60);

/// Scrapes `/metrics`, checking every line against the Prometheus text format, and returns
/// each series (`name{labels}`) with its value.
fn scrape(admin: SocketAddr) -> HashMap<String, f64> {
    let (code, body) = http_get(admin, "/metrics");
    assert_eq!(code, 200);
    let mut series = HashMap::new();
    for line in body.lines().filter(|l| !l.is_empty()) {
        if let Some(comment) = line.strip_prefix("# ") {
            assert!(
                comment.starts_with("HELP ") || comment.starts_with("TYPE "),
                "bad comment line {line:?}"
            );
            continue;
        }
        let (key, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad line {line:?}"));
        let name_end = key.find('{').unwrap_or(key.len());
        let name = &key[..name_end];
        assert!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
                && !name.starts_with(|c: char| c.is_ascii_digit()),
            "bad metric name in {line:?}"
        );
        if name_end < key.len() {
            assert!(key.ends_with('}'), "bad labels in {line:?}");
        }
        let v: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value in {line:?}"));
        series.insert(key.to_owned(), v);
    }
    series
}

fn get(m: &HashMap<String, f64>, key: &str) -> f64 {
    m.get(key).copied().unwrap_or(0.0)
}

/// Waits until no session of any kind is running (sessions finish after the client's Close).
async fn wait_no_active(admin: SocketAddr) {
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let m = scrape(admin);
        let active: f64 = m
            .iter()
            .filter(|(k, _)| k.starts_with("kube_ws_proxy_sessions_active"))
            .map(|(_, v)| v)
            .sum();
        if active == 0.0 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "sessions still active: {m:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_by_the_right_amounts() {
    let h = Harness::start().await;
    let admin = h.proxy.admin_addr;
    let before = scrape(admin);

    // An exec: 3 bytes of stdin, 8 bytes of stdout, success.
    let path = exec_path("web", &["sh", "-c", "cat; printf 12345"], true, true, true);
    let (mut ws, _) = connect(h.proxy.addr, &path, "v5.channel.k8s.io")
        .await
        .unwrap();
    send(&mut ws, b"\x00abc").await;
    send(&mut ws, b"\xff\x00").await;
    let t = read_to_close(&mut ws).await;
    assert_eq!(t.stdout, b"abc12345");
    drop(ws);

    // A failed upgrade: the cluster forbids the exec.
    let path = exec_path("forbidden-m", &["true"], false, true, false);
    let (mut ws, _) = connect(h.proxy.addr, &path, "v5.channel.k8s.io")
        .await
        .unwrap();
    let _ = read_to_close(&mut ws).await;
    drop(ws);

    // A port-forward tunnel that moves 1000 bytes each way (plus SPDY framing).
    let pod = common::pod_server::PodServer::echo().await;
    {
        use kube_ws_proxy::spdy::frame::HeaderBlock;
        use kube_ws_proxy::spdy::proto::{Config, Connection};
        let pf = "/api/v1/namespaces/default/pods/web/portforward";
        let (ws, _) = connect(h.proxy.addr, pf, "SPDY/3.1+portforward.k8s.io")
            .await
            .unwrap();
        let conn = Connection::client(
            common::ws_client::as_io(ws),
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
        let _error = conn.open_stream(headers("error")).await.unwrap();
        let (mut tx, mut rx) = conn.open_stream(headers("data")).await.unwrap().split();
        tx.send(bytes::Bytes::from(vec![7u8; 1000])).await.unwrap();
        tx.finish().await.unwrap();
        let mut n = 0;
        while let Some(chunk) = rx.recv().await {
            n += chunk.unwrap().len();
        }
        assert_eq!(n, 1000);
        conn.close().await;
    }

    wait_no_active(admin).await;
    let after = scrape(admin);
    let delta = |k: &str| get(&after, k) - get(&before, k);
    assert_eq!(
        delta(r#"kube_ws_proxy_sessions_total{cluster="default",kind="exec",outcome="success"}"#),
        1.0
    );
    assert_eq!(
        delta(r#"kube_ws_proxy_session_bytes_total{cluster="default",direction="up",kind="exec"}"#),
        3.0
    );
    assert_eq!(
        delta(
            r#"kube_ws_proxy_session_bytes_total{cluster="default",direction="down",kind="exec"}"#
        ),
        8.0
    );
    assert_eq!(
        delta(
            r#"kube_ws_proxy_sessions_total{cluster="default",kind="exec",outcome="upstream_error"}"#
        ),
        1.0
    );
    assert_eq!(
        delta(r#"kube_ws_proxy_upstream_upgrade_failures_total{cluster="default",code="403"}"#),
        1.0
    );
    assert_eq!(
        delta(r#"kube_ws_proxy_session_duration_seconds_count{cluster="default",kind="exec"}"#),
        2.0
    );
    let tunnels: f64 = after
        .iter()
        .filter(|(k, _)| {
            k.starts_with(
                r#"kube_ws_proxy_sessions_total{cluster="default",kind="portforward_tunnel""#,
            )
        })
        .map(|(_, v)| v)
        .sum();
    assert_eq!(tunnels, 1.0, "{after:?}");
    assert!(
        delta(
            r#"kube_ws_proxy_session_bytes_total{cluster="default",direction="up",kind="portforward_tunnel"}"#
        ) > 1000.0
    );
    assert!(
        delta(
            r#"kube_ws_proxy_session_bytes_total{cluster="default",direction="down",kind="portforward_tunnel"}"#
        ) > 1000.0
    );
    // Plain requests are counted too (this scrape goes to the admin port, not counted).
    let (code, _) = http_get(h.proxy.addr, "/api/v1/namespaces/default/pods/web");
    assert_eq!(code, 200);
    let last = scrape(admin);
    assert_eq!(
        get(
            &last,
            r#"kube_ws_proxy_http_requests_total{cluster="default",code="200",method="GET"}"#
        ) - get(
            &after,
            r#"kube_ws_proxy_http_requests_total{cluster="default",code="200",method="GET"}"#
        ),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_follows_the_upstream() {
    let Harness { sim, proxy, .. } = Harness::start().await;
    assert_eq!(http_get(proxy.admin_addr, "/readyz").0, 200);
    assert_eq!(http_get(proxy.admin_addr, "/healthz").0, 200);
    sim.shutdown().await;
    // One check's answer serves every probe for a second (docs/operations.md, /readyz): unready within
    // that period plus the check.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while http_get(proxy.admin_addr, "/readyz").0 != 503 {
        assert!(std::time::Instant::now() < deadline, "/readyz stays ready");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(http_get(proxy.admin_addr, "/healthz").0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_then_ends_sessions_with_a_status() {
    let mut h = Harness::start_with(SimConfig::default(), &["--drain-timeout", "3s"]).await;
    let short = exec_path(
        "web",
        &["sh", "-c", "sleep 1; echo finished"],
        false,
        true,
        false,
    );
    let long = exec_path("web", &["sleep", "60"], false, true, false);
    let (mut a, _) = connect(h.proxy.addr, &short, "v5.channel.k8s.io")
        .await
        .unwrap();
    let (mut b, _) = connect(h.proxy.addr, &long, "v5.channel.k8s.io")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    h.proxy.terminate();
    let admin = h.proxy.admin_addr;
    let addr = h.proxy.addr;
    // Draining: unready at once, and new connections are refused.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while http_get(admin, "/readyz").0 != 503 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "/readyz still ready while draining"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "listener still open"
    );

    let ta = read_to_close(&mut a).await;
    assert_eq!(
        ta.stdout, b"finished\n",
        "a session inside the drain timeout completes"
    );
    assert_eq!(ta.status, br#"{"metadata":{},"status":"Success"}"#);
    let tb = tokio::time::timeout(Duration::from_secs(15), read_to_close(&mut b))
        .await
        .unwrap();
    let status: serde_json::Value =
        serde_json::from_slice(&tb.status).expect("a Status on channel 3");
    assert_eq!(status["status"], "Failure");
    assert_eq!(status["reason"], "ServiceUnavailable");
    assert_eq!(tb.close.map(|c| u16::from(c.code)), Some(1000));
    drop((a, b));
    let code = tokio::task::spawn_blocking(move || {
        let code = h.proxy.wait_exit(Duration::from_secs(20));
        (code, h)
    })
    .await
    .unwrap();
    assert_eq!(code.0, Some(0), "exit code after drain");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_sessions_refuses_the_third_with_429() {
    let h = Harness::start_with(SimConfig::default(), &["--max-sessions", "2"]).await;
    let path = exec_path("web", &["sh", "-c", "sleep 1; echo ok"], false, true, false);
    let (mut a, _) = connect(h.proxy.addr, &path, "v5.channel.k8s.io")
        .await
        .unwrap();
    let (mut b, _) = connect(h.proxy.addr, &path, "v5.channel.k8s.io")
        .await
        .unwrap();
    let third = connect(h.proxy.addr, &path, "v5.channel.k8s.io")
        .await
        .expect_err("third admitted");
    let tokio_tungstenite::tungstenite::Error::Http(resp) = third else {
        panic!("expected an HTTP answer, got {third:?}");
    };
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.headers()["retry-after"], "1");
    let body: serde_json::Value = serde_json::from_slice(resp.body().as_deref().unwrap()).unwrap();
    assert_eq!(body["kind"], "Status");
    assert_eq!(body["reason"], "TooManyRequests");
    assert_eq!(body["code"], 429);
    for ws in [&mut a, &mut b] {
        let t = read_to_close(ws).await;
        assert_eq!(t.stdout, b"ok\n");
        assert_eq!(t.status, br#"{"metadata":{},"status":"Success"}"#);
    }
    let m = scrape(h.proxy.admin_addr);
    assert_eq!(
        get(
            &m,
            r#"kube_ws_proxy_handshake_rejections_total{cluster="default",reason="too_many_sessions"}"#
        ),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_session_log_line_has_the_fields_and_no_token() {
    // The token travels as a browser would send it (a bearer subprotocol entry); the cluster
    // requires it, so the session only works if the proxy carried it upstream.
    use base64::Engine;
    let token = "sekrit-token-0123456789abcdef";
    let config = SimConfig {
        require_bearer_token: Some(token.into()),
        ..SimConfig::default()
    };
    let h = Harness::start_with(config, &[]).await;
    let path =
        exec_path("web", &["sh", "-c", "cat; exit 3"], true, true, true) + "&container=sidecar";
    let entry = format!(
        "base64url.bearer.authorization.k8s.io.{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(token)
    );
    let (mut ws, answer) = connect(h.proxy.addr, &path, &format!("v5.channel.k8s.io, {entry}"))
        .await
        .unwrap();
    let audit_id = answer
        .headers()
        .get("audit-id")
        .expect("the answer names the request's audit id")
        .to_str()
        .unwrap()
        .to_owned();
    send(&mut ws, b"\x00four").await;
    send(&mut ws, b"\xff\x00").await;
    let t = read_to_close(&mut ws).await;
    assert_eq!(t.stdout, b"four");
    let status: serde_json::Value = serde_json::from_slice(&t.status).unwrap();
    assert_eq!(status["reason"], "NonZeroExitCode", "{status}");
    drop(ws);
    let line = h
        .proxy
        .wait_for_log("exec session finished", Duration::from_secs(20))
        .expect("a session log line");
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    let f = &v["fields"];
    assert!(f["session"].as_u64().is_some(), "{line}");
    assert_eq!(f["verb"], "exec");
    assert_eq!(f["namespace"], "default");
    assert_eq!(f["pod"], "web");
    assert_eq!(f["container"], "sidecar");
    assert_eq!(f["bytes_in"], 4);
    assert_eq!(f["bytes_out"], 4);
    assert_eq!(f["exit_code"], 3);
    assert_eq!(f["close_reason"], "completed");
    assert!(f["duration_ms"].as_u64().is_some(), "{line}");
    // The line names its request as the cluster's audit log does.
    assert_eq!(v["span"]["audit_id"], audit_id.as_str(), "{line}");
    let seen = h.sim.requests();
    assert!(
        seen.iter()
            .any(|r| r.path.ends_with("/exec") && r.header("audit-id") == Some(&audit_id)),
        "{seen:?}"
    );
    let encoded = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(token);
    for l in h.proxy.log_lines() {
        assert!(
            !l.contains(token) && !l.contains(&encoded),
            "token in a log line: {l}"
        );
        assert!(!l.contains("four"), "stdin in a log line: {l}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_oversized_request_heads_are_refused() {
    let h = Harness::start_with(
        SimConfig::default(),
        &[
            "--request-header-timeout",
            "1s",
            "--max-request-header-bytes",
            "16384",
        ],
    )
    .await;
    let addr = h.proxy.addr;
    tokio::task::spawn_blocking(move || {
        // A head that never ends is cut off after the timeout.
        let mut slow = std::net::TcpStream::connect(addr).unwrap();
        slow.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        slow.write_all(b"GET /api HTTP/1.1\r\nHost: x\r\n").unwrap();
        let started = std::time::Instant::now();
        let mut rest = Vec::new();
        let _ = slow.read_to_end(&mut rest);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "slow head not cut off"
        );

        // A head above the cap gets 431.
        let mut big = std::net::TcpStream::connect(addr).unwrap();
        big.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let filler = "a".repeat(40_000);
        let _ = write!(
            big,
            "GET /api HTTP/1.1\r\nHost: x\r\nX-Filler: {filler}\r\n\r\n"
        );
        let mut answer = Vec::new();
        let _ = big.read_to_end(&mut answer);
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 431"), "answer: {answer:?}");
    })
    .await
    .unwrap();
    // The proxy still serves.
    assert_eq!(http_get(addr, "/api/v1/namespaces/default/pods/web").0, 200);
}

/// Text logs written to a pipe or file (a log collector, the demo's output redirected) carry no
/// ANSI colour codes.
#[test]
fn text_logs_to_a_pipe_have_no_colour_codes() {
    use std::io::{BufRead, BufReader};
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_kube-ws-proxy"))
        .args([
            "--upstream",
            "http://127.0.0.1:1",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--log-format",
            "text",
        ])
        .env_remove("NO_COLOR")
        .env_remove("RUST_LOG")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut seen = Vec::new();
    for line in BufReader::new(child.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        let ready = line.contains("kube-ws-proxy ready");
        seen.push(line);
        if ready {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        seen.iter().any(|l| l.contains("kube-ws-proxy ready")),
        "{seen:?}"
    );
    assert!(
        seen.iter().all(|l| !l.contains('\u{1b}')),
        "colour codes in piped logs: {seen:?}"
    );
}
