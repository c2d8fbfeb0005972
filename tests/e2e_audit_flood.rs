//! Refused sessions cannot wipe the audit log (issue 35, finding 4). In passthrough mode with
//! the audit log at small rotation sizes: an accepted exec is audited, then a flood of
//! upgrades carrying huge commands that the cluster refuses. Unauthenticated ones (401) are
//! refused by the proxy before their sessions start and write nothing; authenticated ones the
//! cluster forbids (403) write events no larger than the cap until their address's refusal
//! budget is spent, then get 429 without asking the cluster. The accepted session's events
//! stay in the kept files, and a `refused` event says how many were refused and from where.
//!
//! Against a proxy without the bounds (`KUBE_WS_PROXY_BIN` set to an older build) the flood
//! rotates the accepted session's events out.

use crate::common;
use crate::e2e_audit::{Audited, TINA};

use std::path::Path;
use std::time::Duration;

use common::tls_client::connect;
use kube_ws_proxy::sim::SimStreaming;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const T: Duration = Duration::from_secs(60);
/// The cap of one audit event line (src/audit/bounds.rs).
const EVENT_CAP: usize = 32 * 1024;
/// A command near the request header limit (64 KiB).
const HUGE: usize = 60_000;

/// Every line of the audit log and its kept backups, oldest first.
fn kept_lines(log: &Path) -> Vec<String> {
    let mut files: Vec<_> = (1..=3)
        .rev()
        .map(|n| format!("{}.{n}", log.display()).into())
        .collect();
    files.push(log.to_path_buf());
    files
        .iter()
        .filter_map(|f: &std::path::PathBuf| std::fs::read_to_string(f).ok())
        .flat_map(|text| text.lines().map(str::to_owned).collect::<Vec<_>>())
        .collect()
}

fn kept_events(log: &Path) -> Vec<Value> {
    kept_lines(log)
        .iter()
        .map(|l| serde_json::from_str(l).expect("an audit line is JSON"))
        .collect()
}

/// A legacy (v4) WebSocket exec of a huge command on `pod`, as `token` (if any), over TLS;
/// the status line of the answer.
async fn huge_exec(a: &Audited, pod: &str, token: Option<&str>) -> String {
    let command = "x".repeat(HUGE);
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let request = format!(
        "GET /api/v1/namespaces/default/pods/{pod}/exec?command=sh&command=-c&command={command}&stdout=true HTTP/1.1\r\n\
         Host: 127.0.0.1\r\n{auth}Connection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
         Sec-WebSocket-Protocol: v4.channel.k8s.io\r\nConnection: close\r\n\r\n"
    );
    let answer = tokio::time::timeout(T, async {
        let mut tls = connect(a.proxy.addr, &a.proxy_ca.pem, None, &[b"http/1.1"])
            .await
            .expect("a TLS session");
        tls.write_all(request.as_bytes()).await.unwrap();
        // The answer's head is all that matters; the proxy may close without close_notify.
        let mut answer = Vec::new();
        let _ = tls.read_to_end(&mut answer).await;
        answer
    })
    .await
    .expect("an answer in time");
    String::from_utf8_lossy(&answer)
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// The accepted exec, audited before the flood: a v4 WebSocket exec as tina (kubectl is not
/// needed for a session the cluster accepts; the flood is what matters); its session id.
async fn accepted_exec(a: &Audited) -> String {
    use futures_util::StreamExt;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;

    let path = common::ws_client::exec_path("keep", &["echo", "evidence"], false, true, false);
    let mut req = format!("wss://127.0.0.1:{}{path}", a.proxy.addr.port())
        .into_client_request()
        .unwrap();
    let h = req.headers_mut();
    h.insert(
        "Sec-WebSocket-Protocol",
        "v4.channel.k8s.io".parse().unwrap(),
    );
    h.insert("Authorization", format!("Bearer {TINA}").parse().unwrap());
    let tls = connect(a.proxy.addr, &a.proxy_ca.pem, None, &[b"http/1.1"])
        .await
        .unwrap();
    let (mut ws, _) = tokio_tungstenite::client_async(req, tls).await.unwrap();
    tokio::time::timeout(T, async { while let Some(Ok(_)) = ws.next().await {} })
        .await
        .unwrap();
    drop(ws);
    let (start, _) = a.pair(|e| e["pod"] == "keep").await;
    start["session_id"].as_str().unwrap().to_owned()
}

fn assert_kept(log: &Path, session: &str) {
    let events = kept_events(log);
    for stage in ["started", "ended"] {
        assert!(
            events
                .iter()
                .any(|e| e["session_id"] == session && e["stage"] == stage),
            "the accepted session's {stage} event is gone from the kept files ({} events kept)",
            events.len()
        );
    }
    for line in kept_lines(log) {
        assert!(line.len() <= EVENT_CAP, "an event of {} bytes", line.len());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_refusals_cannot_rotate_an_accepted_sessions_events_out() {
    let rotation = [
        "--audit-log-max-size",
        "256Ki",
        "--audit-log-max-backups",
        "1",
    ];
    let a = Audited::launch(SimStreaming::SpdyOnly, &rotation, &[]).await;
    let session = accepted_exec(&a).await;
    for n in 0..20 {
        let status = huge_exec(&a, &format!("flood-{n}"), Some("not-a-token")).await;
        assert!(status.contains(" 401 "), "{status}");
    }
    assert_kept(&a.audit_log, &session);
    // Nothing of the flood went upstream as a session.
    assert!(
        !a.sim.requests().iter().any(|r| r.path.contains("flood-")),
        "an unauthenticated session reached the cluster"
    );
    assert!(a
        .proxy
        .metrics()
        .contains(r#"kube_ws_proxy_auth_rejections_total{cluster="default",reason="upstream_unauthenticated"} 20"#));
    assert!(
        !kept_events(&a.audit_log)
            .iter()
            .any(|e| e["pod"].as_str().is_some_and(|p| p.starts_with("flood-"))),
        "an unauthenticated session was audited"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forbidden_refusals_are_bounded_then_refused_by_the_proxy_and_counted() {
    let rotation = [
        "--audit-log-max-size",
        "256Ki",
        "--audit-log-max-backups",
        "1",
    ];
    // Set through the environment, which an older build ignores.
    let env = [
        ("KUBE_WS_PROXY_AUDIT_REFUSAL_BURST", "5"),
        ("KUBE_WS_PROXY_AUDIT_REFUSAL_REFILL", "1h"),
    ];
    let mut a = Audited::launch(SimStreaming::SpdyOnly, &rotation, &env).await;
    let session = accepted_exec(&a).await;
    let mut statuses = Vec::new();
    for n in 0..40 {
        statuses.push(huge_exec(&a, &format!("forbidden-{n}"), Some(TINA)).await);
    }
    assert_kept(&a.audit_log, &session);
    // The cluster refused the first five itself; the proxy refused the rest.
    assert!(
        statuses[..5].iter().all(|s| s.contains(" 403 ")),
        "{statuses:#?}"
    );
    assert!(
        statuses[5..].iter().all(|s| s.contains(" 429 ")),
        "{statuses:#?}"
    );
    let asked = a
        .sim
        .requests()
        .iter()
        .filter(|r| r.path.contains("/pods/forbidden-"))
        .count();
    assert_eq!(
        asked, 5,
        "the cluster was asked for {asked} refused sessions"
    );
    assert!(a
        .proxy
        .metrics()
        .contains(r#"kube_ws_proxy_handshake_rejections_total{cluster="default",reason="refused_sessions"} 35"#));
    // The five refused sessions' events name tina, and their commands show their beginning.
    let refused: Vec<Value> = kept_events(&a.audit_log)
        .into_iter()
        .filter(|e| {
            e["pod"]
                .as_str()
                .is_some_and(|p| p.starts_with("forbidden-"))
        })
        .collect();
    assert_eq!(refused.len(), 10, "{refused:#?}");
    for e in &refused {
        assert_eq!(e["user"], "tina", "{e}");
        assert_eq!(e["command"][0], "sh");
        assert!(e["command"][2].as_str().unwrap().starts_with("xxxx"));
        assert_eq!(
            e["truncated"]["command"],
            serde_json::json!({"original_bytes": HUGE + 4, "original_items": 3})
        );
    }
    // At shutdown the refusals not yet reported are: one event, from where.
    a.proxy.terminate();
    assert!(a.proxy.wait_exit(T).is_some());
    let report = kept_events(&a.audit_log)
        .into_iter()
        .find(|e| e["stage"] == "refused")
        .expect("a refused event");
    assert_eq!(report["sessions_refused"], 35, "{report}");
    assert_eq!(
        report["addresses"],
        serde_json::json!([{"address": "127.0.0.1", "sessions_refused": 35}])
    );
}

/// Only refusals of the caller (401, 403) and upgrades the client never completed spend an
/// address's budget: a cluster that answers something else (here 500, as it would 404 or
/// not at all during an outage) charges nobody, so every client behind one address is not
/// locked out once the cluster is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_that_are_not_the_callers_fault_cost_nothing() {
    let env = [
        ("KUBE_WS_PROXY_AUDIT_REFUSAL_BURST", "2"),
        ("KUBE_WS_PROXY_AUDIT_REFUSAL_REFILL", "1h"),
    ];
    let a = Audited::launch(SimStreaming::SpdyOnly, &[], &env).await;
    let mut statuses = Vec::new();
    for n in 0..8 {
        // The cluster fails these with a 500.
        statuses.push(huge_exec(&a, &format!("error500-{n}"), Some(TINA)).await);
    }
    assert!(
        statuses.iter().all(|s| s.contains(" 500 ")),
        "{statuses:#?}"
    );
    // A session's `ended` event may follow its client's answer: wait for all eight.
    let ended_events = || -> Vec<Value> {
        kept_events(&a.audit_log)
            .into_iter()
            .filter(|e| {
                e["stage"] == "ended"
                    && e["pod"]
                        .as_str()
                        .is_some_and(|p| p.starts_with("error500-"))
            })
            .collect()
    };
    let deadline = std::time::Instant::now() + T;
    while ended_events().len() < 8 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ended = ended_events();
    assert_eq!(ended.len(), 8, "{ended:#?}");
    for e in &ended {
        assert_eq!(e["ended_by"], "upstream refused", "{e}");
    }
    let session = accepted_exec(&a).await;
    assert_kept(&a.audit_log, &session);
}
