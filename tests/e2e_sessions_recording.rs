//! A session's recording through the sessions API
//! (`…/namespaces/NS/sessions/ID/recording[?follow=true]`), with real kubectl on both sides:
//! tina's kubectl 1.33 runs an interactive session through a recording proxy while olga
//! follows its recording with `kubectl get --raw …?follow=true`. The follower sees the
//! session's output while it runs (it sees the prompt before tina answers it, then the
//! answer), and its stream ends with the session, holding exactly the file the recorder wrote.
//! Readers are bounded per address (the ninth is a 429 with `Retry-After`); vic, who may get
//! sessions in `team-a` but not their recordings, is refused; an unrecorded session and an
//! unknown one are 404s.

use crate::common;

use std::path::Path;
use std::process::Stdio;

use common::clients::require_kubectl;
use common::harness::stderr;
use common::operated::{failed_stderr, session_path, Operated, OLGA, T, TINA, VIC};
use common::tls_client::connect;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout};

/// A session's recording path, for `get --raw`.
fn recording_path(namespace: &str, id: &str) -> String {
    format!("{}/recording", session_path(namespace, id))
}

/// Reads `lines` until one contains `want`; every line read, that one last.
async fn read_until(lines: &mut Lines<BufReader<ChildStdout>>, want: &str) -> Vec<String> {
    let mut seen = Vec::new();
    loop {
        let line = tokio::time::timeout(T, lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("{want:?} within {T:?}; saw {seen:#?}"))
            .unwrap()
            .unwrap_or_else(|| panic!("the recording ended before {want:?}: {seen:#?}"));
        let found = line.contains(want);
        seen.push(line);
        if found {
            return seen;
        }
    }
}

/// tina's interactive session in `namespace`: it prints `started` and a prompt, then waits
/// for a line on stdin and prints it back before sleeping.
async fn interactive_session(o: &Operated, k: &Path, namespace: &str) -> Child {
    let tina = o.kubeconfig("tina", Some(TINA), None);
    let mut c = o.kubectl_cmd(k, &tina);
    c.args(["exec", "-i", "-n", namespace, "web", "--", "sh", "-c"])
        .arg("echo started; echo PROMPT-ONE; read line; echo \"got:$line\"; sleep 60")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(T, out.next_line()).await.unwrap();
    assert_eq!(first.unwrap().as_deref(), Some("started"));
    // The rest of what tina sees is not this test's concern; keep her pipe drained.
    tokio::spawn(async move { while let Ok(Some(_)) = out.next_line().await {} });
    child
}

/// Opens a followed recording by hand as olga, and reads its answer's head: the status line
/// and headers. The stream is held open while the returned value lives.
async fn follow_by_hand(
    o: &Operated,
    path: &str,
) -> (
    String,
    tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
) {
    let mut tls = connect(o.proxy.addr, &o.proxy_ca.pem, None, &[b"http/1.1"])
        .await
        .unwrap();
    let request = format!(
        "GET {path}?follow=true HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {OLGA}\r\n\r\n"
    );
    tls.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(T, tls.read(&mut byte))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            n,
            1,
            "the answer's head: {}",
            String::from_utf8_lossy(&head)
        );
        head.push(byte[0]);
    }
    (String::from_utf8(head).unwrap(), tls)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_followed_recording_shows_the_session_as_it_runs_and_ends_with_it() {
    let Some(k33) = require_kubectl("1.33") else {
        return;
    };
    let records = tempfile::tempdir().unwrap();
    let record_dir = records.path().display().to_string();
    let o = Operated::start(&["--record", "required", "--record-dir", &record_dir]).await;
    let olga = o.kubeconfig("olga", Some(OLGA), None);
    let mut session = interactive_session(&o, &k33, "default").await;
    let (id, _) = o.only_session(&k33, &olga).await;
    let recording = recording_path("default", &id);

    // olga follows: the prompt is there while tina has not answered it yet.
    let mut c = o.kubectl_cmd(&k33, &olga);
    c.args(["get", "--raw", &format!("{recording}?follow=true")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut follower = c.spawn().unwrap();
    let mut followed = BufReader::new(follower.stdout.take().unwrap()).lines();
    let mut seen = read_until(&mut followed, "PROMPT-ONE").await;
    let header: serde_json::Value = serde_json::from_str(&seen[0]).expect("a JSON header");
    assert_eq!(header["version"], 2, "{header}");
    assert!(session.try_wait().unwrap().is_none(), "the session runs");
    assert!(seen[1..].iter().all(|l| !l.contains("got:")), "{seen:#?}");

    // Readers are bounded per address: olga's kubectl and seven more are let in, a ninth not.
    let mut held = Vec::new();
    for _ in 0..7 {
        let (head, stream) = follow_by_hand(&o, &recording).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert!(head.contains("application/x-asciicast"), "{head}");
        held.push(stream);
    }
    let (head, _) = follow_by_hand(&o, &recording).await;
    assert!(head.starts_with("HTTP/1.1 429"), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("retry-after: 5"),
        "{head}"
    );
    drop(held);

    // tina answers; the follower sees it.
    let mut stdin = session.stdin.take().unwrap();
    stdin.write_all(b"ANSWER-TWO\n").await.unwrap();
    seen.extend(read_until(&mut followed, "got:ANSWER-TWO").await);

    // The session is ended; the followed stream ends with it, holding what the recorder wrote.
    let one = session_path("default", &id);
    let printed = o
        .terminate(&k33, &olga, &format!("{one}?reason=drill"), session)
        .await;
    assert!(printed.contains("terminated by olga: drill"), "{printed}");
    while let Some(line) = tokio::time::timeout(T, followed.next_line())
        .await
        .expect("the followed recording ends with the session")
        .unwrap()
    {
        seen.push(line);
    }
    let done = tokio::time::timeout(T, follower.wait()).await.unwrap();
    assert!(done.unwrap().success());
    let event = o.ended(&id).await;
    let file = event["recording"].as_str().expect("recorded").to_owned();
    let written = std::fs::read_to_string(&file).unwrap();
    assert_eq!(seen.join("\n") + "\n", written);

    // Read again once ended, without following: the same bytes.
    let again = o.kubectl(&k33, &olga, &["get", "--raw", &recording]).await;
    assert!(again.status.success(), "{}", stderr(&again));
    assert_eq!(String::from_utf8(again.stdout).unwrap(), written);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recording_is_refused_without_its_own_permission_and_absent_when_not_recorded() {
    let Some(k33) = require_kubectl("1.33") else {
        return;
    };
    // No recordings here: a live session has none.
    let o = Operated::start(&[]).await;
    let (olga, vic) = (
        o.kubeconfig("olga", Some(OLGA), None),
        o.kubeconfig("vic", Some(VIC), None),
    );
    let session = interactive_session(&o, &k33, "team-a").await;
    let (id, _) = o.only_session(&k33, &olga).await;

    // vic may get the session, not its recording: kube-apiserver's 403 for the subresource.
    let got = o.get_raw(&k33, &vic, &session_path("team-a", &id)).await;
    assert_eq!(got.unwrap()["metadata"]["name"], id.as_str());
    let denied = o
        .kubectl(
            &k33,
            &vic,
            &["get", "--raw", &recording_path("team-a", &id)],
        )
        .await;
    assert!(!denied.status.success());
    let said = stderr(&denied);
    assert!(
        said.contains("cannot get resource \"sessions/recording\" in API group \"kube-ws-proxy.io\" in the namespace \"team-a\""),
        "{said}"
    );

    // olga may: the live session is not recorded, an unknown one is not found.
    let absent = o
        .kubectl(
            &k33,
            &olga,
            &["get", "--raw", &recording_path("team-a", &id)],
        )
        .await;
    assert!(!absent.status.success());
    assert!(
        stderr(&absent).contains("is not recorded"),
        "{}",
        stderr(&absent)
    );
    let unknown = o
        .kubectl(
            &k33,
            &olga,
            &["get", "--raw", &recording_path("team-a", "00000000-9")],
        )
        .await;
    assert!(!unknown.status.success());
    assert!(
        stderr(&unknown).contains("not found"),
        "{}",
        stderr(&unknown)
    );

    let one = session_path("team-a", &id);
    o.delete(&k33, &olga, &format!("{one}?reason=done")).await;
    let printed = failed_stderr(session).await;
    assert!(printed.contains("terminated by olga: done"), "{printed}");
}
