//! Per-cluster limits: a cluster's `max-sessions` bounds its own running sessions (429 beyond,
//! a Status naming the cluster's limit) within the proxy's `--max-sessions`, so that one slow
//! or hung cluster cannot hold every slot; the other clusters admit on, `/clusters` shows the
//! limit, and the refusals are counted under the cluster's label.

use crate::common;

use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

use common::proxy_process::{http_get, ProxyProcess};
use common::sims::of_kind as sim;
use common::ws_client::{self, Ws};
use kube_ws_proxy::sim::SimStreaming;
use serde_json::Value;

const T: Duration = Duration::from_secs(30);

/// A running `cat` on `cluster`, answering: the session holds its slot until dropped.
async fn open(proxy: &ProxyProcess, cluster: &str) -> Result<Ws, (u16, String)> {
    let exec = ws_client::exec_path("web", &["cat"], true, true, false);
    match ws_client::connect(
        proxy.addr,
        &format!("/clusters/{cluster}{exec}"),
        "v5.channel.k8s.io",
    )
    .await
    {
        Ok((mut ws, _)) => {
            ws.send(Message::binary(b"\x00ping\n".to_vec()))
                .await
                .unwrap();
            loop {
                match tokio::time::timeout(T, ws.next()).await.unwrap() {
                    Some(Ok(Message::Binary(b))) if b.first() == Some(&1) && b.len() > 1 => {
                        assert_eq!(&b[1..], b"ping\n");
                        return Ok(ws);
                    }
                    Some(Ok(_)) => {}
                    other => panic!("the session on {cluster} ended: {other:?}"),
                }
            }
        }
        Err(WsError::Http(resp)) => {
            let body = String::from_utf8_lossy(resp.body().as_deref().unwrap_or_default());
            Err((resp.status().as_u16(), body.into_owned()))
        }
        Err(other) => panic!("{other}"),
    }
}

fn refused(opened: Result<Ws, (u16, String)>) -> (u16, String) {
    match opened {
        Ok(_) => panic!("admitted"),
        Err(refusal) => refusal,
    }
}

/// `/clusters` on the admin listener: (sessions, maxSessions) of `name`.
fn listed(proxy: &ProxyProcess, name: &str) -> (u64, Value) {
    let (status, body) = http_get(proxy.admin_addr, "/clusters");
    assert_eq!(status, 200, "{body}");
    let page: Value = serde_json::from_str(&body).unwrap();
    let row = page["clusters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("{name} not on {body}"))
        .clone();
    (
        row["sessions"].as_u64().unwrap(),
        row["maxSessions"].clone(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clusters_max_sessions_bounds_its_own_sessions_only() {
    let (a, b) = (
        sim(SimStreaming::SpdyOnly).await,
        sim(SimStreaming::New).await,
    );
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "max-sessions: 3\nclusters:\n- name: a\n  upstream: {}\n  max-sessions: 1\n\
             - name: b\n  upstream: {}\n",
            a.url(),
            b.url()
        ),
    )
    .unwrap();
    let proxy = ProxyProcess::launch(&["--config", config.to_str().unwrap()], &[]);
    assert_eq!(listed(&proxy, "a"), (0, Value::from(1)));
    assert_eq!(listed(&proxy, "b"), (0, Value::Null));

    let on_a = open(&proxy, "a").await.expect("a's first session");
    let (status, body) = refused(open(&proxy, "a").await);
    assert_eq!(status, 429, "{body}");
    assert!(
        body.contains("this cluster") && body.contains("max-sessions"),
        "{body}"
    );
    assert_eq!(listed(&proxy, "a"), (1, Value::from(1)));

    // b is not held back by a's limit; the proxy's own limit still counts every cluster.
    let _b1 = open(&proxy, "b").await.expect("b's first session");
    let _b2 = open(&proxy, "b").await.expect("b's second session");
    let (status, body) = refused(open(&proxy, "b").await);
    assert_eq!(status, 429, "{body}");
    assert!(body.contains("--max-sessions"), "{body}");
    assert_eq!(
        proxy.metric(
            r#"kube_ws_proxy_handshake_rejections_total{cluster="a",reason="too_many_sessions"}"#
        ),
        Some(1.0)
    );

    // a's slot comes back when its session ends; the proxy's with it.
    drop(on_a);
    let deadline = Instant::now() + T;
    while listed(&proxy, "a").0 != 0 {
        assert!(Instant::now() < deadline, "a's session never ended");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _again = open(&proxy, "a").await.expect("a admits again");
}

#[test]
fn a_max_sessions_of_zero_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        "clusters:\n- name: a\n  upstream: http://127.0.0.1:1\n  max-sessions: 0\n",
    )
    .unwrap();
    let out = std::process::Command::new(common::proxy_process::binary())
        .args(["--config", config.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cluster a") && stderr.contains("max-sessions"),
        "{stderr}"
    );
}
