//! Headless Chromium opening WebSockets over HTTP/2 (RFC 8441): three v5 exec sessions
//! (translated to SPDY) and a followed log (relayed) at once, on the one TLS connection it
//! keeps to the proxy, each with its stdin, output and exit code; the token travels as the
//! bearer subprotocol entry, as a web dashboard sends it. The proxy's logs and metrics show
//! every session as HTTP/2 and all on one connection.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::browser::Browser;
use common::clients::{chromium, require};
use common::page_server::PageServer;
use common::pki::Ca;
use common::proxy_process::ProxyProcess;
use kube_ws_proxy::sim::{SimCluster, SimConfig};
use serde_json::Value;

const TOKEN: &str = "browser-h2-t0ken";
const T: Duration = Duration::from_secs(45);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_multiplexes_exec_sessions_and_a_log_on_one_http2_connection() {
    let Some(chromium) = require("chromium", chromium()) else {
        return;
    };
    let sim = SimCluster::start(SimConfig {
        require_bearer_token: Some(TOKEN.into()),
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("proxy");
    let (cert, key) = ca.server().write(dir.path(), "serving");
    let (cert, key) = (cert.display().to_string(), key.display().to_string());
    let upstream = sim.url();
    let proxy = ProxyProcess::launch(
        &[
            "--upstream",
            &upstream,
            "--tls-cert-file",
            &cert,
            "--tls-private-key-file",
            &key,
        ],
        &[],
    );
    let mut pages =
        PageServer::start(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser")).await;
    let mut url = url::Url::parse(&format!("http://{}/index.html", pages.addr)).unwrap();
    url.query_pairs_mut()
        .append_pair("proxy", &format!("127.0.0.1:{}", proxy.addr.port()))
        .append_pair("token", TOKEN)
        .append_pair("scenario", "h2-sessions")
        .append_pair("tls", "1");
    // The test CA is not in Chromium's store; the connection is still TLS with ALPN h2.
    let browser = Browser::open_with(&chromium, url.as_str(), &["--ignore-certificate-errors"]);
    let Some(report) = pages.next_result(T).await else {
        panic!(
            "the page reported nothing; chromium said:\n{}",
            browser.stderr()
        );
    };
    drop(browser);
    assert_eq!(report["ok"], true, "the page failed: {}", report["error"]);
    let r = &report["result"];

    for n in 0..3 {
        let e = &r["execs"][n];
        assert_eq!(e["protocol"], "v5.channel.k8s.io", "{e}");
        assert_eq!(e["stdout"], format!("hello {n}\n"), "{e}");
        assert_eq!(e["stderr"], format!("err{n}\n"), "{e}");
        assert_eq!(e["exitCode"], n as i64 + 2, "{e}");
        assert_eq!(e["close"]["code"], 1000, "{e}");
    }
    assert_eq!(r["log"]["protocol"], "base64.binary.k8s.io", "{r}");
    let want: Vec<String> = (1..=12).map(|n| format!("log line {n}")).collect();
    assert_eq!(r["log"]["lines"], serde_json::json!(want), "{r}");

    // Every session was an HTTP/2 stream, all of one connection.
    let lines = wait_lines(&proxy, 4).await;
    assert_eq!(lines.len(), 4, "{lines:?}");
    for l in &lines {
        assert_eq!(l["fields"]["http_version"], "2", "not over HTTP/2: {l}");
    }
    let connection = &lines[0]["fields"]["connection"];
    assert!(
        lines
            .iter()
            .all(|l| &l["fields"]["connection"] == connection),
        "sessions on several connections: {lines:?}"
    );
    let metrics = proxy.metrics();
    assert!(
        metrics.contains(
            r#"kube_ws_proxy_sessions_admitted_total{cluster="default",http_version="2"} 4"#
        ),
        "{metrics}"
    );
    // Upstream every request carried the token as Authorization (from the subprotocol entry).
    for req in sim.requests().iter().filter(|r| r.is_upgrade()) {
        assert_eq!(
            req.header("authorization"),
            Some(format!("Bearer {TOKEN}").as_str()),
            "{req:?}"
        );
    }
}

/// The proxy's "finished" lines of exec sessions and relays, once `n` are there.
async fn wait_lines(proxy: &ProxyProcess, n: usize) -> Vec<Value> {
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let lines: Vec<Value> = proxy
            .log_lines()
            .iter()
            .filter(|l| {
                l.contains("exec session finished") || l.contains("relayed upgrade finished")
            })
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        if lines.len() >= n || tokio::time::Instant::now() > deadline {
            return lines;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
