//! A real browser (headless Chromium) through kube-ws-proxy into the simulated SPDY-only
//! cluster, as a web dashboard uses it: the token can only travel as the
//! `base64url.bearer.authorization.k8s.io.` subprotocol entry. The page (tests/browser/) runs
//! one scenario and POSTs what it saw to the test's own page server:
//!
//! * v5 exec (translated to SPDY): stdin, the CLOSE signal, stdout, stderr, the exit code;
//! * `base64.channel.k8s.io` exec (relayed): text frames both ways;
//! * a followed pod log over `base64.binary.k8s.io` (relayed), closed by the page.
//!
//! The browser goes through the SPDY-dropping gateway, and the cluster demands the token on
//! every request.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::bearer::{self, Carrier};
use common::browser::Browser;
use common::clients::{chromium, require};
use common::harness::Harness;
use common::page_server::PageServer;
use kube_ws_proxy::sim::{SeenRequest, SessionKind, SimConfig, SimEvent};
use serde_json::Value;

/// Standard base64 of these bytes has `+` and `/`, and the length needs padding, so the page
/// must really produce unpadded base64url.
const TOKEN: &str = "browser-t0ken~~~???x";
const EXEC_PATH: &str = "/api/v1/namespaces/default/pods/web/exec";
const LOG_PATH: &str = "/api/v1/namespaces/default/pods/web/log";
const T: Duration = Duration::from_secs(45);

/// Everything one scenario leaves behind.
struct Run {
    h: Harness,
    result: Value,
}

/// Runs `scenario` of the page against a fresh cluster, proxy and gateway; `None` when
/// Chromium is missing (outside CI).
async fn run_page(scenario: &str) -> Option<Run> {
    run_page_with(scenario, &[]).await
}

/// As [`run_page`], with extra flags for the proxy.
async fn run_page_with(scenario: &str, proxy_flags: &[&str]) -> Option<Run> {
    let chromium = require("chromium", chromium())?;
    let sim = SimConfig {
        require_bearer_token: Some(TOKEN.into()),
        ..SimConfig::default()
    };
    let h = Harness::start_with(sim, proxy_flags).await;
    let mut pages =
        PageServer::start(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser")).await;
    let mut url = url::Url::parse(&format!("http://{}/index.html", pages.addr)).unwrap();
    url.query_pairs_mut()
        .append_pair("proxy", &h.middlebox.addr.to_string())
        .append_pair("token", TOKEN)
        .append_pair("scenario", scenario);
    let browser = Browser::open(&chromium, url.as_str());
    let Some(report) = pages.next_result(T).await else {
        panic!(
            "the page reported nothing for {scenario}; chromium said:\n{}",
            browser.stderr()
        );
    };
    drop(browser);
    assert_eq!(report["scenario"], scenario, "{report}");
    assert_eq!(report["ok"], true, "the page failed: {}", report["error"]);
    assert!(
        h.middlebox.websockets() > 0,
        "no WebSocket reached the proxy"
    );
    assert_eq!(h.middlebox.dropped(), 0);
    Some(Run {
        h,
        result: report["result"].clone(),
    })
}

/// The upstream requests for `path`, each checked to carry the token as `Authorization`.
fn upstream_requests(h: &Harness, path: &str) -> Vec<(SeenRequest, Carrier)> {
    let seen: Vec<_> = h
        .sim
        .requests()
        .into_iter()
        .filter(|r| r.path == path)
        .map(|r| {
            let how = bearer::carrier(&r, TOKEN);
            (r, how)
        })
        .collect();
    assert!(!seen.is_empty(), "the cluster saw no request for {path}");
    // On every path, relayed ones included, the token travels as `Authorization` and the
    // subprotocol entry itself is never sent on.
    for (r, how) in &seen {
        assert_eq!(
            *how,
            Carrier::Header,
            "token not in Authorization upstream: {r:?}"
        );
        assert!(
            !bearer::offers_entry(r),
            "bearer entry sent upstream: {r:?}"
        );
    }
    seen
}

async fn wait_exit_code(h: &Harness, code: i32) {
    let exited = h
        .sim
        .wait_for_event(
            T,
            |e| matches!(e, SimEvent::ProcessExited { exit_code: Some(c), .. } if *c == code),
        )
        .await;
    assert!(exited.is_some(), "no process exited with {code}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v5_exec_with_bearer_subprotocol_is_translated() {
    // Translated, so that every upstream request below is the translation's.
    let flags = ["--upstream-streaming", "spdy"];
    let Some(Run { h, result: r }) = run_page_with("v5-exec", &flags).await else {
        return;
    };
    // The bearer entry is consumed, never echoed.
    assert_eq!(r["protocol"], "v5.channel.k8s.io", "{r}");
    assert_eq!(
        r["firstMessage"],
        serde_json::json!([1]),
        "ready message: {r}"
    );
    // `cat` only ends on EOF: the CLOSE signal reached the process as end of stdin.
    assert_eq!(r["stdout"], "hello from the browser\n", "{r}");
    assert_eq!(r["stderr"], "to-stderr\n", "{r}");
    assert_eq!(r["status"]["status"], "Failure", "{r}");
    assert_eq!(r["status"]["reason"], "NonZeroExitCode", "{r}");
    assert_eq!(r["exitCode"], 3, "{r}");
    assert_eq!(r["close"]["code"], 1000, "{r}");
    wait_exit_code(&h, 3).await;

    // Translated: the cluster saw only SPDY for exec, with the token as a header.
    for (req, how) in upstream_requests(&h, EXEC_PATH) {
        let upgrade = req.header("upgrade").unwrap_or_default().to_owned();
        assert!(
            upgrade.starts_with("SPDY/3.1"),
            "not SPDY upstream: {req:?}"
        );
        assert_eq!(how, Carrier::Header, "{req:?}");
        assert!(!bearer::offers_entry(&req), "{req:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn base64_channel_exec_with_bearer_subprotocol_is_relayed() {
    let Some(Run { h, result: r }) = run_page("base64-exec").await else {
        return;
    };
    assert_eq!(r["protocol"], "base64.channel.k8s.io", "{r}");
    assert_eq!(r["firstMessage"], "1", "ready message: {r}");
    assert_eq!(r["stdout"], "got:hello from the browser\n", "{r}");
    assert_eq!(r["stderr"], "to-stderr\n", "{r}");
    // Legacy protocols report failures as text on channel 3.
    let status = r["status"].as_str().unwrap_or_default();
    assert!(status.contains("exit code 3"), "{r}");
    assert_eq!(r["close"]["code"], 1000, "{r}");
    wait_exit_code(&h, 3).await;

    // Relayed: the cluster served the WebSocket itself and got the token.
    for (req, _) in upstream_requests(&h, EXEC_PATH) {
        assert_eq!(req.header("upgrade"), Some("websocket"), "{req:?}");
        let offered = req.header("sec-websocket-protocol").unwrap_or_default();
        assert!(offered.contains("base64.channel.k8s.io"), "{req:?}");
    }
    let started = h
        .sim
        .wait_for_event(T, |e| {
            matches!(e, SimEvent::SessionStarted { kind: SessionKind::Exec, protocol, .. }
                if protocol == "base64.channel.k8s.io")
        })
        .await;
    assert!(started.is_some(), "{:?}", h.sim.events());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followed_log_over_base64_binary_with_bearer_subprotocol() {
    let Some(Run { h, result: r }) = run_page("log").await else {
        return;
    };
    assert_eq!(r["protocol"], "base64.binary.k8s.io", "{r}");
    assert_eq!(
        r["binaryMessages"], 0,
        "base64.binary.k8s.io is text only: {r}"
    );
    let want: Vec<String> = (1..=12).map(|n| format!("log line {n}")).collect();
    assert_eq!(r["lines"], serde_json::json!(want), "{r}");

    for (req, _) in upstream_requests(&h, LOG_PATH) {
        assert_eq!(req.header("upgrade"), Some("websocket"), "{req:?}");
        assert_eq!(
            req.query.as_deref(),
            Some("follow=true"),
            "the query must reach the cluster unchanged"
        );
    }
    // The page's close went through the proxy: the cluster stopped following.
    let ended = h
        .sim
        .wait_for_event(
            T,
            |e| matches!(e, SimEvent::SessionEnded { reason, .. } if reason == "client gone"),
        )
        .await;
    assert!(ended.is_some(), "{:?}", h.sim.events());
}

/// A browser's sessions are recorded and audited on both paths: v5 (translated) and
/// `base64.channel.k8s.io` (relayed, followed passively); each replays exactly what the page
/// received, and the audit names the token's user (a SelfSubjectReview made with the token the
/// page offered in its bearer subprotocol entry).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browser_sessions_are_recorded_and_audited_on_both_paths() {
    let Some(asciinema) = common::clients::require_asciinema() else {
        return;
    };
    for (scenario, path, shown) in [
        (
            "v5-exec",
            "translated",
            "hello from the browser\nto-stderr\n",
        ),
        (
            "base64-exec",
            "relay_websocket",
            "got:hello from the browser\nto-stderr\n",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let audit = dir.path().join("audit.log");
        let flags = [
            "--record".to_owned(),
            "required".to_owned(),
            "--record-dir".to_owned(),
            dir.path().display().to_string(),
            "--audit-log".to_owned(),
            audit.display().to_string(),
        ];
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let Some(Run { h: _h, result: r }) = run_page_with(scenario, &flags).await else {
            return;
        };
        let ended = common::replay::ended_event(&audit, "web", path).await;
        if scenario == "v5-exec" {
            assert_eq!(ended["exit_code"], 3, "{ended}");
        } else {
            // The v1 protocol reports a failure as text only, with no exit code as such.
            assert_eq!(ended["exit_code"], Value::Null, "{ended}");
            let status = ended["status"].as_str().unwrap_or_default();
            assert!(status.contains("exit code 3"), "{ended}");
        }
        assert_eq!(ended["user"], "sim-user", "{ended}");
        assert_eq!(ended["identity_source"], "self_subject_review", "{ended}");
        let recording = std::path::PathBuf::from(ended["recording"].as_str().expect("recorded"));
        // The writer finishes the file on its own thread just after the session.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let asciinema = asciinema.clone();
        let replayed =
            tokio::task::spawn_blocking(move || common::replay::replay(&asciinema, &recording))
                .await
                .unwrap();
        let page_got = format!(
            "{}{}",
            r["stdout"].as_str().unwrap(),
            r["stderr"].as_str().unwrap()
        );
        common::replay::assert_same_lines(
            &replayed,
            shown,
            &format!("{scenario}: the page got {page_got:?}"),
        );
        common::replay::assert_same_lines(&replayed, &page_got, scenario);
    }
}
