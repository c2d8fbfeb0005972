//! Malformed bearer-token subprotocol entries (PROTOCOL.md §1.2: at most one entry, valid
//! unpadded base64url of UTF-8, never alone) are refused at the front door on every kind of
//! path — translated exec, port-forward tunnel, relayed log — with `400` and a Kubernetes
//! Status, no upgrade, and nothing sent upstream on their behalf.

use crate::common;

use common::bearer::{self, Carrier};
use common::harness::Harness;
use common::ws_client::{connect, exec_path};
use std::time::Duration;

use kube_ws_proxy::sim::{SeenRequest, SimConfig};
use tokio_tungstenite::tungstenite::Error;

const TOKEN: &str = "front-door-token";
const T: Duration = Duration::from_secs(20);

/// One kind of path, with the protocol a well-behaved client offers on it.
struct Route {
    name: &'static str,
    path: String,
    /// The upstream path the cluster would see for it.
    upstream_path: &'static str,
    protocol: &'static str,
}

fn routes() -> Vec<Route> {
    vec![
        Route {
            name: "v5 exec (translated)",
            path: exec_path("web", &["echo", "hi"], false, true, false),
            upstream_path: "/api/v1/namespaces/default/pods/web/exec",
            protocol: "v5.channel.k8s.io",
        },
        Route {
            name: "port-forward tunnel",
            path: "/api/v1/namespaces/default/pods/web/portforward".into(),
            upstream_path: "/api/v1/namespaces/default/pods/web/portforward",
            protocol: "SPDY/3.1+portforward.k8s.io",
        },
        Route {
            name: "log (relayed)",
            path: "/api/v1/namespaces/default/pods/web/log?follow=true".into(),
            upstream_path: "/api/v1/namespaces/default/pods/web/log",
            protocol: "base64.binary.k8s.io",
        },
    ]
}

/// The malformed offers for a route whose own protocol is `protocol`.
fn bad_offers(protocol: &str) -> Vec<(&'static str, String)> {
    let good = bearer::entry(TOKEN);
    let other = bearer::entry("another-token");
    vec![
        ("two bearer entries", format!("{good}, {other}, {protocol}")),
        (
            "the same bearer entry twice",
            format!("{good}, {protocol}, {good}"),
        ),
        (
            "bad base64",
            format!("{}!!not*base64, {protocol}", bearer::PREFIX),
        ),
        // Valid standard base64 of the token, but padded: not unpadded base64url.
        (
            "padded base64",
            format!("{}Zm9vYg==, {protocol}", bearer::PREFIX),
        ),
        // 0xff 0xfe: decodes, but is no UTF-8.
        (
            "token not UTF-8",
            format!("{}__4, {protocol}", bearer::PREFIX),
        ),
        ("a bearer entry alone", good.clone()),
    ]
}

/// The cluster's requests for `path` once there is at least one (or `timeout` passed).
async fn requests_for(h: &Harness, path: &str, timeout: Duration) -> Vec<SeenRequest> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let seen: Vec<_> = h
            .sim
            .requests()
            .into_iter()
            .filter(|r| r.path == path)
            .collect();
        if !seen.is_empty() || tokio::time::Instant::now() >= deadline {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn start() -> Harness {
    let sim = SimConfig {
        require_bearer_token: Some(TOKEN.into()),
        ..SimConfig::default()
    };
    // What the translation sends upstream is checked request by request: no WebSocket attempt
    // first (--upstream-streaming auto's is in e2e_upstream_streaming).
    Harness::start_with(sim, &["--upstream-streaming", "spdy"]).await
}

/// Offers `protocols` on `path` and expects a 400 with a Status body instead of an upgrade.
async fn expect_bad_request(h: &Harness, what: &str, path: &str, protocols: &str) {
    let refusal = connect(h.proxy.addr, path, protocols)
        .await
        .err()
        .unwrap_or_else(|| panic!("{what}: upgraded"));
    let Error::Http(resp) = refusal else {
        panic!("{what}: expected an HTTP answer, got {refusal:?}");
    };
    assert_eq!(resp.status(), 400, "{what}");
    assert!(
        resp.headers().get("sec-websocket-protocol").is_none(),
        "{what}: no protocol is chosen for a refused request"
    );
    let body = resp.body().as_deref().unwrap_or_default();
    let status: serde_json::Value = serde_json::from_slice(body)
        .unwrap_or_else(|e| panic!("{what}: body is no JSON ({e}): {body:?}"));
    assert_eq!(status["kind"], "Status", "{what}: {status}");
    assert_eq!(status["apiVersion"], "v1", "{what}: {status}");
    assert_eq!(status["status"], "Failure", "{what}: {status}");
    assert_eq!(status["reason"], "BadRequest", "{what}: {status}");
    assert_eq!(status["code"], 400, "{what}: {status}");
    let message = status["message"].as_str().unwrap_or_default();
    assert!(
        message.to_ascii_lowercase().contains("bearer"),
        "{what}: {status}"
    );
    assert!(
        !message.contains(TOKEN),
        "{what}: the token must not be echoed: {status}"
    );
}

/// Every malformed offer on one route is refused and never reaches the cluster; a well-formed
/// offer afterwards does, carrying the token, so the cluster really records that path.
async fn refuses_on(route: &Route) {
    let h = start().await;
    for (what, offer) in bad_offers(route.protocol) {
        let what = format!("{}: {what}", route.name);
        expect_bad_request(&h, &what, &route.path, &offer).await;
    }
    let forwarded = h
        .sim
        .requests()
        .into_iter()
        .filter(|r| r.path == route.upstream_path)
        .count();
    assert_eq!(
        forwarded, 0,
        "{}: a refused request was forwarded",
        route.name
    );

    let good = format!("{}, {}", bearer::entry(TOKEN), route.protocol);
    let (ws, resp) = connect(h.proxy.addr, &route.path, &good)
        .await
        .unwrap_or_else(|e| panic!("{}: a valid offer failed: {e:?}", route.name));
    assert_eq!(
        resp.headers()
            .get("sec-websocket-protocol")
            .and_then(|v| v.to_str().ok()),
        Some(route.protocol),
        "{}",
        route.name
    );
    // The translator may answer 101 before it dials the cluster: wait for the request.
    let seen = requests_for(&h, route.upstream_path, T).await;
    drop(ws);
    assert_eq!(seen.len(), 1, "{}: {seen:?}", route.name);
    assert_eq!(
        bearer::carrier(&seen[0], TOKEN),
        Carrier::Header,
        "{}: {:?}",
        route.name,
        seen[0]
    );
    assert!(
        !bearer::offers_entry(&seen[0]),
        "{}: {:?}",
        route.name,
        seen[0]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_bearer_entries_on_v5_exec_are_refused() {
    refuses_on(&routes()[0]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_bearer_entries_on_the_port_forward_tunnel_are_refused() {
    refuses_on(&routes()[1]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_bearer_entries_on_a_relayed_log_are_refused() {
    refuses_on(&routes()[2]).await;
}
