//! A live session's status counts its traffic (docs/sessions-api.md): kubectl 1.33 or 1.27
//! runs an exec as tina and sends a known number of bytes on stdin while the pod prints a
//! known number; olga reads the session with `kubectl get --raw` and watches the list.
//! `bytesFromClient`/`bytesToClient` grow by what was sent and printed (exactly on the
//! translated path, which counts payload; at least that and at most a little framing more on
//! the relayed SPDY path, which counts the stream as it is), `idleSeconds` grows while the
//! session is idle and `lastActivity` moves on traffic, and a watch gets a `MODIFIED` with
//! the new counts, never more than one per 5 s of its life however many chunks moved.

use crate::common;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use common::clients::require_kubectl;
use common::operated::{session_path, Operated, OLGA, SESSIONS, T, TINA};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// What the test sends on stdin, in [`CHUNKS`] writes.
const SENT: u64 = 4096;
/// How many writes carry [`SENT`] (spaced so that the bytes move in many chunks).
const CHUNKS: u64 = 16;
/// What the pod prints once it has read them.
const PRINTED: u64 = 3000;
/// How long the watch lasts (it must end for the test to count its events).
const WATCH_SECONDS: u64 = 20;
/// What the relayed path may count beyond the payload: SPDY data frame headers (8 bytes per
/// frame) for a few dozen frames, and the connection's pings.
const FRAMING: u64 = 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn translated_session_counts_its_bytes_and_idles() {
    let Some(k33) = require_kubectl("1.33") else {
        return;
    };
    let o = Operated::start(&[]).await;
    traffic_is_counted(&o, &k33, &k33, "translated", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relayed_spdy_session_counts_its_bytes_and_idles() {
    let (Some(k33), Some(k27)) = (require_kubectl("1.33"), require_kubectl("1.27")) else {
        return;
    };
    let o = Operated::start(&[]).await;
    traffic_is_counted(&o, &k33, &k27, "relay_spdy", false).await;
}

/// The session's two byte counts.
fn counts(s: &Value) -> (u64, u64) {
    let n = |f: &str| {
        s["status"][f]
            .as_u64()
            .unwrap_or_else(|| panic!("{f}: {s}"))
    };
    (n("bytesFromClient"), n("bytesToClient"))
}

/// olga's view of the session `id`, polled until `done` holds for it.
async fn session_when(o: &Operated, k33: &Path, id: &str, done: impl Fn(&Value) -> bool) -> Value {
    let olga = o.kubeconfig("olga", Some(OLGA), None);
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let s = o
            .get_raw(k33, &olga, &session_path("default", id))
            .await
            .expect("got");
        if done(&s) {
            return s;
        }
        assert!(tokio::time::Instant::now() < deadline, "{s}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Runs tina's session with kubectl `client` (which must take `path`), checks its status
/// counts and idling as olga (kubectl 1.33), and a watch's events over the traffic.
async fn traffic_is_counted(o: &Operated, k33: &Path, client: &Path, path: &str, exact: bool) {
    let (tina, olga) = (
        o.kubeconfig("tina", Some(TINA), None),
        o.kubeconfig("olga", Some(OLGA), None),
    );
    let script =
        format!("echo started; head -c {SENT} >/dev/null; head -c {PRINTED} /dev/zero; sleep 50");
    let mut c = o.kubectl_cmd(client, &tina);
    c.args(["exec", "-i", "web", "--", "sh", "-c", &script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut session = c.spawn().unwrap();
    let mut stdin = session.stdin.take().unwrap();
    let mut out = BufReader::new(session.stdout.take().unwrap());
    let mut first = String::new();
    tokio::time::timeout(T, out.read_line(&mut first))
        .await
        .expect("the session started")
        .unwrap();
    assert_eq!(first, "started\n");

    let (id, s) = o.only_session(k33, &olga).await;
    assert_eq!(s["spec"]["protocolPath"], path, "{s}");
    // Idle: idleSeconds grows, lastActivity stays.
    let before = session_when(o, k33, &id, |s| {
        s["status"]["idleSeconds"].as_u64().unwrap() >= 2
    })
    .await;
    let (from0, to0) = counts(&before);
    if exact {
        assert_eq!((from0, to0), (0, "started\n".len() as u64), "{before}");
    }
    let idle = session_when(o, k33, &id, |s| {
        s["status"]["idleSeconds"].as_u64().unwrap() >= 3
    })
    .await;
    assert_eq!(
        idle["status"]["lastActivity"],
        before["status"]["lastActivity"]
    );
    assert_eq!(counts(&idle), (from0, to0), "{idle}");

    // A watch from before the traffic to after it.
    let mut w = o.kubectl_cmd(k33, &olga);
    w.args([
        "get",
        "--raw",
        &format!("{SESSIONS}?watch=true&timeoutSeconds={WATCH_SECONDS}"),
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::piped());
    let mut w = w.spawn().unwrap();
    let mut lines = BufReader::new(w.stdout.take().unwrap()).lines();
    let watch_started = tokio::time::Instant::now();
    let added: Value = serde_json::from_str(
        &tokio::time::timeout(T, lines.next_line())
            .await
            .expect("the watch's first event")
            .unwrap()
            .expect("an event"),
    )
    .unwrap();
    assert_eq!(added["type"], "ADDED", "{added}");
    assert_eq!(added["object"]["metadata"]["name"], id.as_str(), "{added}");

    // Traffic: SENT bytes in CHUNKS writes, then the pod prints PRINTED.
    let chunk = vec![b'a'; (SENT / CHUNKS) as usize];
    for _ in 0..CHUNKS {
        stdin.write_all(&chunk).await.unwrap();
        stdin.flush().await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut printed = vec![0u8; PRINTED as usize];
    tokio::time::timeout(T, out.read_exact(&mut printed))
        .await
        .expect("the pod printed")
        .unwrap();

    let after = session_when(o, k33, &id, |s| {
        let (from, to) = counts(s);
        from >= from0 + SENT && to >= to0 + PRINTED
    })
    .await;
    let (from, to) = counts(&after);
    if exact {
        assert_eq!((from - from0, to - to0), (SENT, PRINTED), "{after}");
    } else {
        assert!(from - from0 <= SENT + FRAMING, "{after}");
        assert!(to - to0 <= PRINTED + FRAMING, "{after}");
    }
    let (last0, last1) = (
        before["status"]["lastActivity"].as_str().unwrap(),
        after["status"]["lastActivity"].as_str().unwrap(),
    );
    assert!(last1 > last0, "lastActivity {last0} then {last1}");
    assert!(
        after["status"]["idleSeconds"].as_u64().unwrap()
            < idle["status"]["idleSeconds"].as_u64().unwrap() + watch_started.elapsed().as_secs(),
        "{after}"
    );

    // The watch, to its end: MODIFIED events with the new counts, at most one per 5 s.
    let mut modified = Vec::new();
    while let Some(line) =
        tokio::time::timeout(T + Duration::from_secs(WATCH_SECONDS), lines.next_line())
            .await
            .expect("the watch ends")
            .unwrap()
    {
        let e: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(e["type"], "MODIFIED", "{e}");
        assert_eq!(e["object"]["metadata"]["name"], id.as_str(), "{e}");
        modified.push(e);
    }
    let lasted = watch_started.elapsed().as_secs();
    let last = modified.last().expect("a MODIFIED after the traffic");
    if exact {
        assert_eq!(counts(&last["object"]), (from, to), "{last}");
    } else {
        // The relay counts the connection as it is: SPDY pings and window updates go on
        // moving a few bytes after the payload.
        let (f, t) = counts(&last["object"]);
        assert!((from..=from + FRAMING).contains(&f), "{last}");
        assert!((to..=to + FRAMING).contains(&t), "{last}");
    }
    assert!(
        modified.len() as u64 <= lasted / 5 + 1,
        "{} MODIFIED in {lasted} s: {modified:?}",
        modified.len()
    );
    let _ = w.wait().await;
    drop(stdin);
    let _ = session.kill().await;
}
