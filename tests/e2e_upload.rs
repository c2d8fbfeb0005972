//! Recordings to object storage (`--record-upload`), against a real S3-compatible server
//! (moto's server mode, tests/common/s3.rs): the proxy's store client puts small and
//! multipart objects; a kubectl 1.33 session's recording lands under
//! `PREFIX/YYYY/MM/DD/<session id>.cast`, replays with `asciinema cat`, leaves the spool, and
//! its audit `ended` event names the object; with the store down the `ended` event says
//! `pending` and an `uploaded` event follows once the store is back. With `--s3-sse` every
//! object (single and multipart, recordings and audit batches) is stored under the asked
//! server-side encryption and KMS key, as HeadObject reports; a KMS key without a KMS
//! algorithm stops the start.

use crate::common;

use std::time::Duration;

use common::clients::{require_asciinema, require_kubectl, require_moto};
use common::harness::stderr;
use common::operated::{Operated, T, TINA};
use common::s3::{bucket, Forwarder, S3Server, AWS_ENV};
use serde_json::Value;

/// The first audit event in `o`'s log that `matches`, once written within `within`; `what`
/// names it if none comes.
async fn audit_event(
    o: &Operated,
    within: Duration,
    what: &str,
    matches: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let text = std::fs::read_to_string(&o.audit_log).unwrap_or_default();
        let found = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|e| matches(e));
        if let Some(e) = found {
            return e;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no {what} in {text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The audit event of `stage` for `session_id` in `o`'s audit log, once written.
async fn event(o: &Operated, stage: &str, session_id: &str, within: Duration) -> Value {
    let what = format!("{stage} event for {session_id}");
    audit_event(o, within, &what, |e| {
        e["stage"] == stage && e["session_id"] == session_id
    })
    .await
}

/// The `ended` event of the session whose command holds `needle`, once written (a session's
/// end is written after its client is told: kubectl may be done before it).
async fn ended_of(o: &Operated, needle: &str) -> Value {
    let what = format!("ended event for {needle}");
    audit_event(o, T, &what, |e| {
        e["stage"] == "ended"
            && e["command"]
                .as_array()
                .is_some_and(|c| c.iter().any(|a| a.as_str().unwrap().contains(needle)))
    })
    .await
}

/// Today's (UTC) `YYYY/MM/DD`, from the `ended` event's time.
fn day_of(event: &Value) -> String {
    let time = event["time"].as_str().unwrap();
    time[..10].replace('-', "/")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_client_puts_single_and_multipart_objects() {
    let Some(moto) = require_moto() else {
        return;
    };
    let server = S3Server::start(&moto).await;
    let store = bucket(&server.endpoint(), "s3://round-trip/p").await;
    let dir = tempfile::tempdir().unwrap();
    // Three parts (8 + 8 + 4 MiB), each byte telling where it is.
    let big: Vec<u8> = (0..20u32 << 20).map(|i| (i % 251) as u8).collect();
    let small = b"ten bytes!".to_vec();
    for (name, data) in [("big", &big), ("small", &small)] {
        let path = dir.path().join(name);
        std::fs::write(&path, data).unwrap();
        let put = store.put_file(&format!("p/{name}"), &path).await.unwrap();
        assert_eq!(put, data.len() as u64);
    }
    let mut listed = store.list("p/").await.unwrap();
    listed.sort();
    assert_eq!(
        listed,
        vec![
            ("p/big".to_owned(), big.len() as u64),
            ("p/small".to_owned(), small.len() as u64)
        ]
    );
    assert!(
        store.get("p/big").await.unwrap() == big,
        "the multipart object differs"
    );
    assert_eq!(store.get("p/small").await.unwrap(), small);
}

/// A proxy recording under `policy` to `--record-dir` (its spool), uploading to `endpoint`,
/// each session waiting `wait` for its upload, with `extra` flags.
async fn uploading_proxy_with(
    spool: &std::path::Path,
    endpoint: &str,
    policy: &str,
    wait: &str,
    extra: &[&str],
) -> Operated {
    let dir = spool.display().to_string();
    let mut flags = vec![
        "--record",
        policy,
        "--record-dir",
        &dir,
        "--record-upload",
        "s3://evidence/recordings",
        "--s3-endpoint",
        endpoint,
        "--record-upload-wait",
        wait,
    ];
    flags.extend_from_slice(extra);
    Operated::start_env(&flags, &AWS_ENV).await
}

/// A proxy recording (`required`) to `--record-dir` (its spool) and uploading to `endpoint`.
async fn uploading_proxy(spool: &std::path::Path, endpoint: &str, wait: &str) -> Operated {
    uploading_proxy_with(spool, endpoint, "required", wait, &[]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_session_s_recording_is_stored_and_named_in_its_ended_event() {
    let (Some(moto), Some(k33), Some(asciinema)) =
        (require_moto(), require_kubectl("1.33"), require_asciinema())
    else {
        return;
    };
    let server = S3Server::start(&moto).await;
    let store = bucket(&server.endpoint(), "s3://evidence/recordings").await;
    let spool = tempfile::tempdir().unwrap();
    let o = uploading_proxy(spool.path(), &server.endpoint(), "10s").await;
    let tina = o.kubeconfig("tina", Some(TINA), None);
    let done = o
        .kubectl(
            &k33,
            &tina,
            &[
                "exec",
                "web",
                "--",
                "sh",
                "-c",
                "echo UPLOADED-LINE-1; echo line-2",
            ],
        )
        .await;
    assert!(done.status.success(), "{}", stderr(&done));

    let ended = ended_of(&o, "UPLOADED-LINE-1").await;
    let id = ended["session_id"].as_str().unwrap();
    let key = format!("recordings/{}/{id}.cast", day_of(&ended));
    assert_eq!(ended["recording_upload"], "stored", "{ended}");
    assert_eq!(
        ended["recording_object"],
        format!("s3://evidence/{key}"),
        "{ended}"
    );
    // The spool keeps nothing the store has.
    let spool_file = ended["recording"].as_str().unwrap();
    assert!(
        !std::path::Path::new(spool_file).exists(),
        "{spool_file} is still in the spool"
    );

    let object = store.get(&key).await.expect("the object");
    let fetched = tempfile::tempdir().unwrap();
    let copy = fetched.path().join("fetched.cast");
    std::fs::write(&copy, &object).unwrap();
    let header: Value = serde_json::from_str(
        object
            .split(|&b| b == b'\n')
            .next()
            .map(|l| std::str::from_utf8(l).unwrap())
            .unwrap(),
    )
    .unwrap();
    assert_eq!(header["kube_ws_proxy"]["session_id"], id, "{header}");
    let shown = common::replay::replay(&asciinema, &copy);
    assert!(shown.contains("UPLOADED-LINE-1"), "{shown}");
    assert!(shown.contains("line-2"), "{shown}");
    // Stored within the wait: no `uploaded` event of its own.
    let log = std::fs::read_to_string(&o.audit_log).unwrap();
    assert!(!log.contains("\"stage\":\"uploaded\""), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_is_down_leaves_the_upload_pending_until_it_is_back() {
    let (Some(moto), Some(k33)) = (require_moto(), require_kubectl("1.33")) else {
        return;
    };
    let server = S3Server::start(&moto).await;
    let store = bucket(&server.endpoint(), "s3://evidence/recordings").await;
    let forwarder = Forwarder::start(server.addr).await;
    forwarder.down();
    let spool = tempfile::tempdir().unwrap();
    let o = uploading_proxy(spool.path(), &forwarder.endpoint(), "1s").await;
    let tina = o.kubeconfig("tina", Some(TINA), None);
    let done = o
        .kubectl(
            &k33,
            &tina,
            &["exec", "web", "--", "echo", "WHILE-THE-STORE-WAS-DOWN"],
        )
        .await;
    assert!(done.status.success(), "{}", stderr(&done));

    let ended = ended_of(&o, "WHILE-THE-STORE-WAS-DOWN").await;
    let id = ended["session_id"].as_str().unwrap().to_owned();
    assert_eq!(ended["recording_upload"], "pending", "{ended}");
    assert!(ended.get("recording_object").is_none(), "{ended}");
    let spool_file = ended["recording"].as_str().unwrap().to_owned();
    assert!(
        std::path::Path::new(&spool_file).exists(),
        "the spool keeps it meanwhile"
    );
    // A few failed attempts, then the store comes back.
    tokio::time::sleep(Duration::from_secs(4)).await;
    forwarder.up();
    let uploaded = event(&o, "uploaded", &id, Duration::from_secs(120)).await;
    let key = format!("recordings/{}/{id}.cast", day_of(&ended));
    assert_eq!(
        uploaded["recording_object"],
        format!("s3://evidence/{key}"),
        "{uploaded}"
    );
    assert!(uploaded["attempts"].as_u64().unwrap() >= 2, "{uploaded}");
    assert_eq!(uploaded["after_restart"], false, "{uploaded}");
    assert_eq!(uploaded["recording"], spool_file.as_str(), "{uploaded}");
    let object = store.get(&key).await.expect("the object");
    assert_eq!(uploaded["bytes"], object.len() as u64, "{uploaded}");
    assert!(String::from_utf8_lossy(&object).contains("WHILE-THE-STORE-WAS-DOWN"));
    assert!(!std::path::Path::new(&spool_file).exists());
    // The failures were counted.
    let metrics = o.proxy.metrics();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("kube_ws_proxy_upload_failures_total{reason=\"connect\"}")),
        "{metrics}"
    );
    assert!(
        metrics.contains("kube_ws_proxy_upload_pending_files{kind=\"recording\"} 0"),
        "{metrics}"
    );
}

/// A proxy with a 2 KiB spool cap under `policy`, uploading through `forwarder`.
async fn capped_spool_proxy(spool: &std::path::Path, endpoint: &str, policy: &str) -> Operated {
    uploading_proxy_with(
        spool,
        endpoint,
        policy,
        "0s",
        &["--record-spool-max", "2Ki"],
    )
    .await
}

/// Runs execs printing a kilobyte each, with the store down, until the recordings waiting for
/// their upload reach the spool's cap.
async fn fill_the_spool(o: &Operated, k33: &std::path::Path, tina: &std::path::Path) {
    for n in 0..10 {
        let script = format!("head -c 1024 /dev/zero | tr '\\0' s; echo fill-{n}");
        let done = o
            .kubectl(k33, tina, &["exec", "web", "--", "sh", "-c", &script])
            .await;
        assert!(done.status.success(), "{}", stderr(&done));
        // Its recording is queued for upload before its `ended` event is written.
        ended_of(o, &format!("fill-{n}")).await;
        let pending = gauge(
            &o.proxy.metrics(),
            "kube_ws_proxy_upload_pending_bytes{kind=\"recording\"}",
        );
        if pending >= 2048 {
            return;
        }
    }
    panic!("ten recordings did not fill a 2 KiB spool");
}

/// The value of the unlabelled gauge `name`.
fn gauge(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("{name} in {metrics}"))
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_spool_refuses_required_sessions_until_the_store_drains_it() {
    let (Some(moto), Some(k33)) = (require_moto(), require_kubectl("1.33")) else {
        return;
    };
    let server = S3Server::start(&moto).await;
    let _store = bucket(&server.endpoint(), "s3://evidence/recordings").await;
    let forwarder = Forwarder::start(server.addr).await;
    forwarder.down();
    let spool = tempfile::tempdir().unwrap();
    let o = capped_spool_proxy(spool.path(), &forwarder.endpoint(), "required").await;
    let tina = o.kubeconfig("tina", Some(TINA), None);
    fill_the_spool(&o, &k33, &tina).await;

    let refused = o
        .kubectl(&k33, &tina, &["exec", "web", "--", "echo", "MUST-NOT-RUN"])
        .await;
    assert!(!refused.status.success(), "ran with a full spool");
    let said = stderr(&refused);
    assert!(said.contains("spool is full"), "{said}");
    assert!(!String::from_utf8_lossy(&refused.stdout).contains("MUST-NOT-RUN"));
    let ended = ended_of(&o, "MUST-NOT-RUN").await;
    assert_eq!(ended["outcome"], "recording_failed", "{ended}");
    assert!(
        ended["recording_error"]
            .as_str()
            .unwrap()
            .contains("--record-spool-max"),
        "{ended}"
    );

    // The store comes back: the spool drains and sessions run again.
    forwarder.up();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let metrics = o.proxy.metrics();
        if metrics.contains("kube_ws_proxy_upload_pending_files{kind=\"recording\"} 0") {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{metrics}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let again = o
        .kubectl(&k33, &tina, &["exec", "web", "--", "echo", "RUNS-AGAIN"])
        .await;
    assert!(again.status.success(), "{}", stderr(&again));
    assert_eq!(String::from_utf8_lossy(&again.stdout), "RUNS-AGAIN\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_spool_lets_best_effort_sessions_run_unrecorded() {
    let (Some(moto), Some(k33)) = (require_moto(), require_kubectl("1.33")) else {
        return;
    };
    let server = S3Server::start(&moto).await;
    let _store = bucket(&server.endpoint(), "s3://evidence/recordings").await;
    let forwarder = Forwarder::start(server.addr).await;
    forwarder.down();
    let spool = tempfile::tempdir().unwrap();
    let o = capped_spool_proxy(spool.path(), &forwarder.endpoint(), "best-effort").await;
    let tina = o.kubeconfig("tina", Some(TINA), None);
    fill_the_spool(&o, &k33, &tina).await;

    let ran = o
        .kubectl(&k33, &tina, &["exec", "web", "--", "echo", "UNRECORDED"])
        .await;
    assert!(ran.status.success(), "{}", stderr(&ran));
    assert_eq!(String::from_utf8_lossy(&ran.stdout), "UNRECORDED\n");
    let ended = ended_of(&o, "UNRECORDED").await;
    assert_eq!(ended["outcome"], "success", "{ended}");
    assert!(ended["recording"].is_null(), "{ended}");
    assert!(
        ended["recording_error"]
            .as_str()
            .unwrap()
            .contains("spool is full"),
        "{ended}"
    );
    assert!(ended.get("recording_upload").is_none(), "{ended}");
}

/// The batches' lines in the order they were written: objects by their UTC start and number
/// (`<stamp>_<replica>-<n>.jsonl`), lines in file order.
async fn batched_lines(store: &kube_ws_proxy::audit::upload::Store) -> Vec<String> {
    let mut objects = store.list("audit/").await.unwrap();
    let order = |key: &str| {
        let name = key.rsplit('/').next().unwrap().trim_end_matches(".jsonl");
        let (stamp, rest) = name.split_once('_').unwrap();
        let n: u64 = rest.rsplit('-').next().unwrap().parse().unwrap();
        (stamp.to_owned(), n)
    };
    objects.sort_by_key(|(key, _)| order(key));
    let mut lines = Vec::new();
    for (key, _) in objects {
        let body = store.get(&key).await.unwrap();
        lines.extend(String::from_utf8(body).unwrap().lines().map(str::to_owned));
    }
    lines
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_log_goes_to_the_store_in_batches_nothing_missing_over_an_outage() {
    let (Some(moto), Some(k33)) = (require_moto(), require_kubectl("1.33")) else {
        return;
    };
    let server = S3Server::start(&moto).await;
    let store = bucket(&server.endpoint(), "s3://evidence/audit").await;
    let forwarder = Forwarder::start(server.addr).await;
    let o = Operated::start_env(
        &[
            "--audit-upload",
            "s3://evidence/audit",
            "--audit-upload-interval",
            "2s",
            "--s3-endpoint",
            &forwarder.endpoint(),
        ],
        &AWS_ENV,
    )
    .await;
    let tina = o.kubeconfig("tina", Some(TINA), None);
    let run = |n: usize| {
        let (k33, tina, o) = (&k33, &tina, &o);
        async move {
            let done = o
                .kubectl(
                    k33,
                    tina,
                    &["exec", "web", "--", "echo", &format!("batch-{n}")],
                )
                .await;
            assert!(done.status.success(), "{}", stderr(&done));
        }
    };
    for n in 0..3 {
        run(n).await;
    }
    // Down across at least one batch's end, then back.
    forwarder.down();
    for n in 3..6 {
        run(n).await;
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    forwarder.up();
    for n in 6..8 {
        run(n).await;
    }

    // Every line of the local log reaches the store, in its order.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let local: Vec<String> = std::fs::read_to_string(&o.audit_log)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect();
        assert!(local.len() >= 16, "8 sessions, two events each: {local:?}");
        let stored = batched_lines(&store).await;
        if stored == local {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "stored {} lines, the local log {}:\n{stored:#?}\n{local:#?}",
            stored.len(),
            local.len()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let metrics = o.proxy.metrics();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("kube_ws_proxy_upload_failures_total{reason=\"connect\"}")),
        "{metrics}"
    );
    // No `uploaded` events for the log's own batches.
    let log = std::fs::read_to_string(&o.audit_log).unwrap();
    assert!(!log.contains("\"stage\":\"uploaded\""), "{log}");
}

/// The session ids of the `started` events in the audit log at `path`.
fn started_ids(path: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["stage"] == "started")
        .map(|e| e["session_id"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recordings_pending_when_the_proxy_is_killed_are_uploaded_after_its_restart() {
    let (Some(moto), Some(k33), Some(asciinema)) =
        (require_moto(), require_kubectl("1.33"), require_asciinema())
    else {
        return;
    };
    let server = S3Server::start(&moto).await;
    let store = bucket(&server.endpoint(), "s3://evidence/recordings").await;
    let forwarder = Forwarder::start(server.addr).await;
    forwarder.down();
    let spool = tempfile::tempdir().unwrap();
    let spool_dir = spool.path().display().to_string();
    let endpoint = forwarder.endpoint();
    let flags = [
        "--record",
        "required",
        "--record-dir",
        &spool_dir,
        "--record-upload",
        "s3://evidence/recordings",
        "--s3-endpoint",
        &endpoint,
        "--record-upload-wait",
        "0s",
    ];
    let o = Operated::start_env(&flags, &AWS_ENV).await;
    let tina = o.kubeconfig("tina", Some(TINA), None);
    for n in 0..3 {
        let done = o
            .kubectl(
                &k33,
                &tina,
                &["exec", "web", "--", "echo", &format!("ENDED-{n}")],
            )
            .await;
        assert!(done.status.success(), "{}", stderr(&done));
    }
    // One more, killed with the proxy in its middle.
    let mut c = o.kubectl_cmd(&k33, &tina);
    c.args([
        "exec",
        "web",
        "--",
        "sh",
        "-c",
        "echo KILLED-MIDWAY; sleep 60",
    ])
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::null());
    let mut midway = c.spawn().unwrap();
    let mut out = tokio::io::BufReader::new(midway.stdout.take().unwrap());
    let mut first = String::new();
    tokio::time::timeout(
        T,
        tokio::io::AsyncBufReadExt::read_line(&mut out, &mut first),
    )
    .await
    .expect("the session printed")
    .unwrap();
    assert_eq!(first, "KILLED-MIDWAY\n");
    // Its output is in the recording's file before the kill (the writer writes as it comes).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let ids = started_ids(&o.audit_log);
    assert_eq!(ids.len(), 4, "{ids:?}");
    // SAFETY: a plain signal to the proxy's own child process.
    unsafe { libc::kill(o.proxy.pid() as i32, libc::SIGKILL) };
    let _ = midway.wait().await;

    // The store is back; a new process on the same spool uploads what the killed one left.
    forwarder.up();
    let again = o.replica_env("again", &flags, &AWS_ENV);
    let log = o.dir.path().join("audit-again.log");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let uploaded = loop {
        let events: Vec<Value> = std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|e| e["stage"] == "uploaded")
            .collect();
        if events.len() >= 4 {
            break events;
        }
        assert!(tokio::time::Instant::now() < deadline, "{events:#?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let mut uploaded_ids: Vec<&str> = uploaded
        .iter()
        .map(|e| e["session_id"].as_str().unwrap())
        .collect();
    uploaded_ids.sort();
    let mut want: Vec<&str> = ids.iter().map(String::as_str).collect();
    want.sort();
    assert_eq!(uploaded_ids, want);
    for e in &uploaded {
        assert_eq!(e["after_restart"], true, "{e}");
        let object = e["recording_object"].as_str().unwrap();
        let key = object.strip_prefix("s3://evidence/").unwrap();
        let body = store.get(key).await.expect("the object");
        assert_eq!(e["bytes"], body.len() as u64, "{e}");
        let fetched = tempfile::tempdir().unwrap();
        let copy = fetched.path().join("fetched.cast");
        std::fs::write(&copy, &body).unwrap();
        let shown = common::replay::replay(&asciinema, &copy);
        let id = e["session_id"].as_str().unwrap();
        let expected = if id == ids[3] {
            "KILLED-MIDWAY".to_owned()
        } else {
            format!("ENDED-{}", ids.iter().position(|i| i == id).unwrap())
        };
        assert!(shown.contains(&expected), "{id}: {shown}");
    }
    // The spool keeps nothing the store has.
    let left: Vec<_> = std::fs::read_dir(spool.path()).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
    drop(again);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_s_recordings_are_stored_under_their_cluster_s_folder() {
    use crate::e2e_fleet::{Fleet, CLUSTERS};
    let Some(moto) = require_moto() else {
        return;
    };
    let server = S3Server::start(&moto).await;
    let store = bucket(&server.endpoint(), "s3://evidence/rec").await;
    let endpoint = server.endpoint();
    let f = Fleet::start_env(
        false,
        |dir| {
            let (records, audit) = (dir.join("recordings"), dir.join("audit.log"));
            std::fs::create_dir(&records).unwrap();
            [
                "--audit-log",
                audit.to_str().unwrap(),
                "--record",
                "best-effort",
                "--record-dir",
                records.to_str().unwrap(),
                "--record-upload",
                "s3://evidence/rec",
                "--s3-endpoint",
                &endpoint,
            ]
            .map(String::from)
            .to_vec()
        },
        &AWS_ENV,
    )
    .await;
    // An exec on each cluster: translated for the old one, passed through to the others.
    for (name, _, _) in CLUSTERS {
        let path = format!(
            "/clusters/{name}{}",
            common::ws_client::exec_path(
                "web",
                &["echo", &format!("FROM-{name}")],
                false,
                true,
                true
            )
        );
        let (mut ws, _) = common::ws_client::connect(f.proxy.addr, &path, "v5.channel.k8s.io")
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let t = common::ws_client::read_to_close(&mut ws).await;
        assert_eq!(
            t.stdout,
            format!("FROM-{name}\n").as_bytes(),
            "{name}: {t:?}"
        );
    }
    let log = f.dir.path().join("audit.log");
    for (name, _, _) in CLUSTERS {
        let deadline = tokio::time::Instant::now() + T;
        let ended = loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let found = text
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .find(|e| e["stage"] == "ended" && e["cluster"] == name);
            if let Some(e) = found {
                break e;
            }
            assert!(tokio::time::Instant::now() < deadline, "{name}: {text}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let id = ended["session_id"].as_str().unwrap();
        let key = format!("rec/{name}/{}/{id}.cast", day_of(&ended));
        assert_eq!(ended["recording_upload"], "stored", "{ended}");
        assert_eq!(
            ended["recording_object"],
            format!("s3://evidence/{key}"),
            "{ended}"
        );
        let object = String::from_utf8(store.get(&key).await.expect("the object")).unwrap();
        let header: Value = serde_json::from_str(object.lines().next().unwrap()).unwrap();
        assert_eq!(header["kube_ws_proxy"]["cluster"], name, "{header}");
        assert!(object.contains(&format!("FROM-{name}")), "{object}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_behind_tls_is_trusted_through_its_ca_file_only() {
    let (Some(moto), Some(k33)) = (require_moto(), require_kubectl("1.33")) else {
        return;
    };
    let certs = tempfile::tempdir().unwrap();
    let ca = common::pki::Ca::new("object store");
    let (cert, key) = ca.server().write(certs.path(), "store");
    let ca_file = ca.write(certs.path(), "store-ca");
    let server = S3Server::start_tls(&moto, (&cert, &key)).await;
    let endpoint = format!("https://{}", server.addr);
    let store =
        common::s3::store_trusting(&endpoint, "s3://evidence/recordings", Some(&ca_file)).await;
    store
        .create_bucket()
        .await
        .expect("make the bucket over TLS");
    // Without the CA the store's certificate is refused.
    let stranger = common::s3::store(&endpoint, "s3://evidence/recordings").await;
    let refused = stranger
        .check()
        .await
        .expect_err("an unknown CA is refused");
    assert_eq!(refused.reason.label(), "connect", "{refused}");

    let spool = tempfile::tempdir().unwrap();
    let dir = spool.path().display().to_string();
    let ca_arg = ca_file.display().to_string();
    let o = Operated::start_env(
        &[
            "--record",
            "required",
            "--record-dir",
            &dir,
            "--record-upload",
            "s3://evidence/recordings",
            "--s3-endpoint",
            &endpoint,
            "--s3-ca-file",
            &ca_arg,
        ],
        &AWS_ENV,
    )
    .await;
    let tina = o.kubeconfig("tina", Some(TINA), None);
    let done = o
        .kubectl(&k33, &tina, &["exec", "web", "--", "echo", "OVER-TLS"])
        .await;
    assert!(done.status.success(), "{}", stderr(&done));
    let ended = ended_of(&o, "OVER-TLS").await;
    assert_eq!(ended["recording_upload"], "stored", "{ended}");
    let key = ended["recording_object"]
        .as_str()
        .unwrap()
        .strip_prefix("s3://evidence/")
        .unwrap()
        .to_owned();
    let object = store.get(&key).await.expect("the object");
    assert!(String::from_utf8_lossy(&object).contains("OVER-TLS"));
}

/// The KMS key the encrypting tests name (moto takes any key id: it keeps the name and
/// encrypts nothing).
const KMS_KEY: &str = "arn:aws:kms:us-east-1:123456789012:key/0a1b2c3d-kube-ws-proxy-evidence";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_client_asks_for_server_side_encryption_of_single_and_multipart_objects() {
    use kube_ws_proxy::audit::upload::{Encryption, PART_SIZE};
    let Some(moto) = require_moto() else {
        return;
    };
    let server = S3Server::start(&moto).await;
    let endpoint = server.endpoint();
    let plain = bucket(&endpoint, "s3://sealed/p").await;
    let dir = tempfile::tempdir().unwrap();
    let small = dir.path().join("small");
    std::fs::write(&small, b"ten bytes!").unwrap();
    // Two parts: a multipart upload's parts take the encryption of its CreateMultipartUpload.
    let big = dir.path().join("big");
    std::fs::write(&big, vec![b'x'; PART_SIZE as usize + (1 << 20)]).unwrap();

    // Without --s3-sse nothing is asked: the bucket's default (here none) applies.
    plain.put_file("p/plain", &small).await.unwrap();
    assert_eq!(plain.encryption_of("p/plain").await.unwrap(), (None, None));

    let kms = Some(KMS_KEY.to_owned());
    let cases = [
        ("aes256", Encryption::S3Managed, None),
        ("kms", Encryption::Kms(kms.clone()), kms.clone()),
        // moto keeps a DSSE object's key but reports only its algorithm.
        ("dsse", Encryption::DualLayerKms(kms.clone()), None),
    ];
    for (name, encryption, reported_key) in cases {
        let algorithm = encryption.algorithm().to_owned();
        let store = common::s3::store_encrypting(&endpoint, "s3://sealed/p", encryption).await;
        for (size, file) in [("small", &small), ("big", &big)] {
            let key = format!("p/{name}-{size}");
            store.put_file(&key, file).await.unwrap();
            assert_eq!(
                store.encryption_of(&key).await.unwrap(),
                (Some(algorithm.clone()), reported_key.clone()),
                "{key}"
            );
        }
    }
    // Read back whole, with nothing of the encryption to say (SSE-S3 and KMS are the store's).
    let sealed = common::s3::store(&endpoint, "s3://sealed/p").await;
    assert!(sealed.get("p/kms-big").await.unwrap() == std::fs::read(&big).unwrap());
}

/// The `s3://evidence/` key the `ended` event of the session whose command holds `needle`
/// names as its recording's object, once stored.
async fn stored_recording(o: &Operated, needle: &str) -> String {
    let ended = ended_of(o, needle).await;
    assert_eq!(ended["recording_upload"], "stored", "{ended}");
    ended["recording_object"]
        .as_str()
        .unwrap()
        .strip_prefix("s3://evidence/")
        .unwrap()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_with_s3_sse_kms_stores_recordings_and_audit_batches_under_its_key() {
    let (Some(moto), Some(k33)) = (require_moto(), require_kubectl("1.33")) else {
        return;
    };
    let server = S3Server::start(&moto).await;
    let store = bucket(&server.endpoint(), "s3://evidence/recordings").await;
    let spool = tempfile::tempdir().unwrap();
    let o = uploading_proxy_with(
        spool.path(),
        &server.endpoint(),
        "required",
        "60s",
        &[
            "--audit-upload",
            "s3://evidence/audit",
            "--audit-upload-interval",
            "1s",
            "--s3-sse",
            "aws:kms",
            "--s3-sse-kms-key-id",
            KMS_KEY,
        ],
    )
    .await;
    let tina = o.kubeconfig("tina", Some(TINA), None);
    // A small recording (one PUT) and one past a part's size (a multipart upload): 9 MiB.
    let small = o
        .kubectl(&k33, &tina, &["exec", "web", "--", "echo", "SEALED-SMALL"])
        .await;
    assert!(small.status.success(), "{}", stderr(&small));
    let script = "head -c 9437184 /dev/zero | tr '\\0' s; echo; echo SEALED-BIG";
    let big = o
        .kubectl(&k33, &tina, &["exec", "web", "--", "sh", "-c", script])
        .await;
    assert!(big.status.success(), "{}", stderr(&big));

    let kms = (Some("aws:kms".to_owned()), Some(KMS_KEY.to_owned()));
    for needle in ["SEALED-SMALL", "SEALED-BIG"] {
        let key = stored_recording(&o, needle).await;
        assert_eq!(store.encryption_of(&key).await.unwrap(), kms, "{key}");
        let object = store.get(&key).await.unwrap();
        assert!(
            String::from_utf8_lossy(&object).contains(needle),
            "{needle} not in {key}"
        );
        if needle == "SEALED-BIG" {
            assert!(object.len() as u64 > kube_ws_proxy::audit::upload::PART_SIZE);
        }
    }
    // The audit log's batches too.
    let deadline = tokio::time::Instant::now() + T;
    let batch = loop {
        if let Some((key, _)) = store.list("audit/").await.unwrap().into_iter().next() {
            break key;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no audit batch stored"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(store.encryption_of(&batch).await.unwrap(), kms, "{batch}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_with_s3_sse_aes256_stores_recordings_encrypted_by_the_store() {
    let (Some(moto), Some(k33)) = (require_moto(), require_kubectl("1.33")) else {
        return;
    };
    let server = S3Server::start(&moto).await;
    let store = bucket(&server.endpoint(), "s3://evidence/recordings").await;
    let spool = tempfile::tempdir().unwrap();
    let o = uploading_proxy_with(
        spool.path(),
        &server.endpoint(),
        "required",
        "60s",
        &["--s3-sse", "AES256"],
    )
    .await;
    let tina = o.kubeconfig("tina", Some(TINA), None);
    let done = o
        .kubectl(&k33, &tina, &["exec", "web", "--", "echo", "SEALED-AES"])
        .await;
    assert!(done.status.success(), "{}", stderr(&done));
    let key = stored_recording(&o, "SEALED-AES").await;
    assert_eq!(
        store.encryption_of(&key).await.unwrap(),
        (Some("AES256".to_owned()), None),
        "{key}"
    );
}

#[test]
fn a_kms_key_without_a_kms_algorithm_stops_the_start() {
    let start = |flags: &[&str]| {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_kube-ws-proxy"))
            .args([
                "--upstream",
                "http://127.0.0.1:1",
                "--listen",
                "127.0.0.1:0",
                "--admin-listen",
                "127.0.0.1:0",
            ])
            .args(flags)
            .output()
            .unwrap();
        assert!(!o.status.success(), "{flags:?} started");
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let aes = start(&["--s3-sse", "AES256", "--s3-sse-kms-key-id", KMS_KEY]);
    assert!(
        aes.contains("--s3-sse-kms-key-id") && aes.contains("AES256"),
        "{aes}"
    );
    let alone = start(&["--s3-sse-kms-key-id", KMS_KEY]);
    assert!(alone.contains("--s3-sse <"), "{alone}");
}
