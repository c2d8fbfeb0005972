//! The web console in headless Chromium (driven by Playwright, tests/console/drive.mjs), served
//! by the real proxy in front of the simulated cluster with RBAC for the sessions API: olga
//! signs in with her token, sees tina's kubectl 1.33 session appear (by the watch), watches its
//! terminal (xterm.js renders what the session prints after she opened it), terminates it with
//! a reason (tina's kubectl prints who and why) and replays its recording in the player; tina,
//! who may not list sessions, is refused. The page keeps nothing (no storage, no cookie) and
//! reaches nothing but the proxy. Screenshots of each step are kept in
//! `target/test-artifacts/e2e_console/`.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::clients::{chromium, require, require_kubectl};
use common::operated::{failed_stderr, Operated, OLGA, T, TINA};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// Headless Chromium under Playwright: one JSON command per line in, one answer per line out.
struct Driver {
    child: Child,
    stdin: ChildStdin,
    answers: Lines<BufReader<ChildStdout>>,
    shots: PathBuf,
    shot: usize,
}

impl Driver {
    fn start(chromium: &Path) -> Driver {
        let project = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/console");
        assert!(
            project.join("node_modules/playwright-core").is_dir(),
            "tests/console has no node_modules (scripts/install-test-deps.sh installs them)"
        );
        let mut child = Command::new("node")
            .arg("drive.mjs")
            .current_dir(&project)
            .env("CHROMIUM", chromium)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("node runs");
        let shots = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))
            .join("test-artifacts/e2e_console");
        // This run's screenshots only: an earlier run's steps would be read as this one's.
        let _ = std::fs::remove_dir_all(&shots);
        std::fs::create_dir_all(&shots).unwrap();
        Driver {
            stdin: child.stdin.take().unwrap(),
            answers: BufReader::new(child.stdout.take().unwrap()).lines(),
            child,
            shots,
            shot: 0,
        }
    }

    /// Sends `command`; its answer, which must be a success.
    async fn run(&mut self, command: Value) -> Value {
        let answer = self.try_run(command.clone()).await;
        assert_eq!(answer["ok"], true, "{command} failed: {answer}");
        answer
    }

    async fn try_run(&mut self, command: Value) -> Value {
        let mut line = command.to_string();
        line.push('\n');
        self.stdin.write_all(line.as_bytes()).await.unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(90), self.answers.next_line())
            .await
            .expect("the driver answers")
            .unwrap()
            .expect("the driver is running");
        serde_json::from_str(&answer).unwrap()
    }

    async fn click(&mut self, selector: &str) {
        self.run(json!({"op": "click", "selector": selector})).await;
    }

    async fn fill(&mut self, selector: &str, value: &str) {
        self.run(json!({"op": "fill", "selector": selector, "value": value}))
            .await;
    }

    /// Waits until `selector`'s text holds `text`; the text.
    async fn wait_text(&mut self, selector: &str, text: &str) -> String {
        let answer = self
            .run(json!({"op": "waitText", "selector": selector, "text": text, "timeoutMs": 45000}))
            .await;
        answer["text"].as_str().unwrap().to_owned()
    }

    /// Closes the browser (the driver ends without answering).
    async fn close(mut self) {
        let _ = self.stdin.write_all(b"{\"op\":\"close\"}\n").await;
        let _ = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await;
    }

    async fn screenshot(&mut self, name: &str) {
        self.shot += 1;
        let path = self.shots.join(format!("{:02}-{name}.png", self.shot));
        self.run(json!({"op": "screenshot", "path": path})).await;
    }
}

/// tina's kubectl 1.33 running `script` in the pod, its output read (so it never blocks).
async fn session(o: &Operated, k: &Path, kc: &Path, script: &str) -> Child {
    let mut c = o.kubectl_cmd(k, kc);
    c.args(["exec", "web", "--", "sh", "-c", script])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(T, lines.next_line())
        .await
        .expect("the session started")
        .unwrap();
    assert_eq!(first.as_deref(), Some("started"));
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    child
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_signs_in_sees_and_terminates_a_session_in_the_browser() {
    let Some(k33) = require_kubectl("1.33") else {
        return;
    };
    let Some(chromium) = require("chromium", chromium()) else {
        return;
    };
    let records = tempfile::tempdir().unwrap();
    let record_dir = records.path().display().to_string();
    let o = Operated::start(&["--record", "required", "--record-dir", &record_dir]).await;
    let tina = o.kubeconfig("tina", Some(TINA), None);
    let origin = o.url();
    let mut page = Driver::start(&chromium);
    page.run(json!({"op": "open", "url": format!("{origin}/kube-ws-proxy/console/")}))
        .await;
    page.screenshot("sign-in").await;

    // olga signs in with her token; tina's session appears by the watch.
    page.fill("#token", OLGA).await;
    page.click("#sign-in-token").await;
    page.wait_text("#who", "Signed in with a token").await;
    let kubectl = session(
        &o,
        &k33,
        &tina,
        "echo started; sleep 3; echo seen:LIVE-MARKER-7; sleep 60",
    )
    .await;
    let row = page.wait_text("#live-rows", "tina").await;
    assert!(row.contains("web") && row.contains("exec sh -c"), "{row}");
    page.screenshot("live-session").await;

    // She watches its terminal: the output printed after she opened it appears, rendered.
    page.click("#live-rows tr button.watch").await;
    page.wait_text("#viewer-state", "live").await;
    let shown = page
        .wait_text("#terminal .xterm-rows", "seen:LIVE-MARKER-7")
        .await;
    assert!(shown.contains("started"), "{shown}");
    page.screenshot("watching").await;

    // She terminates it with a reason: tina's kubectl is told who and why and fails.
    page.click("#live-rows tr button.terminate").await;
    page.fill("#terminate-reason", "console-drill").await;
    page.screenshot("terminate-dialog").await;
    page.click("#terminate-confirm").await;
    let printed = failed_stderr(kubectl).await;
    assert!(
        printed.contains("terminated by olga: console-drill"),
        "{printed}"
    );
    let ended = page.wait_text("#ended-rows", "default/").await; // recorded, so listed for replay
    assert!(ended.contains("tina"), "{ended}");
    page.wait_text("#viewer-state", "ended").await;
    page.screenshot("ended").await;

    // She replays it: the player plays the recording through to what the session showed.
    page.click("#ended-rows li button.replay").await;
    page.wait_text("#replay-title", "default/").await;
    let replayed = page.wait_text("#player", "seen:LIVE-MARKER-7").await;
    assert!(replayed.contains("started"), "{replayed}");
    page.screenshot("replay").await;

    // The page kept nothing and reached nothing but the proxy.
    let stored = page.run(json!({"op": "storage"})).await;
    assert_eq!(
        stored["stored"],
        json!({"local": 0, "session": 0, "cookie": ""}),
        "{stored}"
    );
    let seen = page.run(json!({"op": "requests"})).await;
    let requests = seen["requests"].as_array().unwrap();
    assert!(!requests.is_empty());
    for url in requests {
        let url = url.as_str().unwrap();
        assert!(url.starts_with(&origin), "the page reached {url}");
    }
    assert_eq!(seen["consoleErrors"], json!([]), "{seen}");

    // tina may not list sessions: the console says so and shows nothing.
    page.click("#sign-out").await;
    page.fill("#token", TINA).await;
    page.click("#sign-in-token").await;
    let refused = page.wait_text("#error", "forbidden").await;
    assert!(refused.contains("(403)"), "{refused}");
    page.screenshot("refused").await;
    page.close().await;
}
