//! `--record-max-bytes`: a recording stops at its cap with a marker event, the session goes on
//! unrecorded to its end, and its audit `ended` event says the recording was cut short and how
//! many bytes it left out. kubectl 1.33 (translated to SPDY) and kubectl 1.28 (SPDY relayed),
//! under `--record required`, each print a megabyte through a 64 KiB cap.

use crate::common;

use std::path::Path;

use common::clients::require_kubectl;
use common::harness::stderr;
use common::operated::{Operated, T, TINA};

/// What the pod prints: this many `x`.
const PRINTED: usize = 1_000_000;
/// The cap.
const CAP: u64 = 64 * 1024;

/// Runs kubectl `k` as tina printing [`PRINTED`] bytes; checks she got them all, and that the
/// session's recording stopped at the cap and its `ended` event says so.
async fn capped_session(o: &Operated, k: &Path, path: &str) {
    let tina = o.kubeconfig("tina", Some(TINA), None);
    let script = format!("head -c {PRINTED} /dev/zero | tr '\\0' x");
    let done = o
        .kubectl(k, &tina, &["exec", "web", "--", "sh", "-c", &script])
        .await;
    assert!(done.status.success(), "{}", stderr(&done));
    assert_eq!(
        done.stdout.len(),
        PRINTED,
        "the session went on past the cap"
    );
    assert!(done.stdout.iter().all(|&b| b == b'x'));

    // The session's `ended` event names the path it took (its `started` one may say `auto`).
    let deadline = tokio::time::Instant::now() + T;
    let ended = loop {
        let events = std::fs::read_to_string(&o.audit_log).unwrap();
        let found = events
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .rfind(|e| e["stage"] == "ended" && e["protocol_path"] == path);
        if let Some(ended) = found {
            break ended;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "a {path} session in {events}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(ended["outcome"], "success", "{ended}");
    assert!(ended["recording_error"].is_null(), "{ended}");
    let cut = &ended["recording_truncated"];
    assert_eq!(cut["max_bytes"], CAP, "{ended}");

    let file = ended["recording"].as_str().unwrap();
    let text = std::fs::read_to_string(file).unwrap();
    let last = text.lines().last().unwrap();
    let marker: serde_json::Value = serde_json::from_str(last).unwrap();
    assert_eq!(marker[1], "m", "{marker}");
    assert!(marker[2].as_str().unwrap().contains("--record-max-bytes"));
    // The event that reached the cap was the last one recorded: at most one frame beyond it.
    let before_marker = (text.len() - last.len() - 1) as u64;
    assert!(
        (CAP..CAP + 33 * 1024).contains(&before_marker),
        "{before_marker}"
    );
    let recorded: u64 = text
        .lines()
        .skip(1)
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| e[1] == "o")
        .map(|e| e[2].as_str().unwrap().len() as u64)
        .sum();
    assert_eq!(
        recorded + cut["unrecorded_bytes"].as_u64().unwrap(),
        PRINTED as u64,
        "{ended}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recording_stops_at_its_cap_and_the_session_goes_on() {
    let (Some(k33), Some(k28)) = (require_kubectl("1.33"), require_kubectl("1.28")) else {
        return;
    };
    let records = tempfile::tempdir().unwrap();
    let dir = records.path().display().to_string();
    let cap = CAP.to_string();
    let o = Operated::start(&[
        "--record",
        "required",
        "--record-dir",
        &dir,
        "--record-max-bytes",
        &cap,
    ])
    .await;
    capped_session(&o, &k33, "translated").await;
    capped_session(&o, &k28, "relay_spdy").await;
}
