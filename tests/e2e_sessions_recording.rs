//! A session's recording through the sessions API
//! (`…/namespaces/NS/sessions/ID/recording[?follow=true]`), with real kubectl on both sides:
//! tina's kubectl 1.33 runs an interactive session through a recording proxy while olga
//! follows its recording with `kubectl get --raw …?follow=true`. The follower sees the
//! session's output while it runs (it sees the prompt before tina answers it, then the
//! answer), and its stream ends with the session, holding exactly the file the recorder wrote.
//! Readers are bounded per address (the ninth is a 429 with `Retry-After`); vic, who may get
//! sessions in `team-a` but not their recordings, is refused; an unrecorded session and an
//! unknown one are 404s. A follower that opens the stream and reads nothing does not hold the
//! session back (its 64 MiB of output pours through a `--record required` proxy and the session
//! ends well), and is only held back itself: read afterwards, it gets the whole recording.

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

/// What the session prints in the stalled-follower test: lines of this, cut at
/// [`STALLED_OUTPUT`] bytes.
const OUTPUT_LINE: &str = "drwxr-xr-x  2 kube kube  4096 Nov 25 01:02 a-directory-listing-line";
/// More than a stalled follower's connection can take in: the kernel's socket buffers on both
/// ends (checked below) and the follower's chunks ahead.
const STALLED_OUTPUT: usize = 64 << 20;

/// The most a loopback connection's kernel buffers hold: the largest receive buffer plus the
/// largest send buffer (`tcp_rmem`, `tcp_wmem`).
fn socket_buffers_max() -> u64 {
    let max = |name: &str| -> u64 {
        let text = std::fs::read_to_string(format!("/proc/sys/net/ipv4/{name}")).unwrap();
        text.split_whitespace().last().unwrap().parse().unwrap()
    };
    max("tcp_rmem") + max("tcp_wmem")
}

/// Reads an HTTP/1.1 chunked body to its last chunk.
async fn read_chunked<R: tokio::io::AsyncBufRead + Unpin>(r: &mut R) -> Vec<u8> {
    let mut body = Vec::new();
    loop {
        let mut size = String::new();
        r.read_line(&mut size).await.unwrap();
        let size = usize::from_str_radix(size.trim_end(), 16).expect("a chunk size");
        let start = body.len();
        body.resize(start + size, 0);
        r.read_exact(&mut body[start..]).await.unwrap();
        let mut crlf = [0u8; 2];
        r.read_exact(&mut crlf).await.unwrap();
        assert_eq!(&crlf, b"\r\n");
        if size == 0 {
            return body;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_that_reads_nothing_does_not_hold_the_session_back() {
    let Some(k33) = require_kubectl("1.33") else {
        return;
    };
    let records = tempfile::tempdir().unwrap();
    let record_dir = records.path().display().to_string();
    // `required`: the session waits for the recording's writer, so a writer that waited for a
    // follower would stop the session.
    let o = Operated::start(&["--record", "required", "--record-dir", &record_dir]).await;
    let (tina, olga) = (
        o.kubeconfig("tina", Some(TINA), None),
        o.kubeconfig("olga", Some(OLGA), None),
    );
    // tina's session waits for a line, then prints 64 MiB.
    let mut c = o.kubectl_cmd(&k33, &tina);
    c.args(["exec", "-i", "web", "--", "sh", "-c"])
        .arg(format!(
            "read go; yes '{OUTPUT_LINE}' | head -c {STALLED_OUTPUT}"
        ))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut session = c.spawn().unwrap();
    let (id, _) = o.only_session(&k33, &olga).await;

    // olga follows its recording and never reads past the answer's head.
    let (head, stalled) = follow_by_hand(&o, &recording_path("default", &id)).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut stdin = session.stdin.take().unwrap();
    stdin.write_all(b"go\n").await.unwrap();

    // The session pours out all its output and ends well.
    let mut out = Vec::with_capacity(STALLED_OUTPUT);
    let mut stdout = session.stdout.take().unwrap();
    tokio::time::timeout(T, stdout.read_to_end(&mut out))
        .await
        .expect("the session's output while a follower reads nothing")
        .unwrap();
    let done = tokio::time::timeout(T, session.wait()).await.unwrap();
    assert!(done.unwrap().success());
    drop(stdin);
    assert_eq!(out.len(), STALLED_OUTPUT);
    let text = String::from_utf8(out).unwrap();
    let whole = text.lines().count() - 1;
    assert!(text.lines().take(whole).all(|l| l == OUTPUT_LINE));
    let event = o.ended(&id).await;
    assert_eq!(event["outcome"], "success", "{event}");

    // The follower could not have taken it all in: its recording is larger than its
    // connection's kernel buffers on both ends could grow to hold.
    let file = event["recording"].as_str().expect("recorded").to_owned();
    let written = std::fs::read(&file).unwrap();
    let room = socket_buffers_max() + (1 << 20);
    assert!(written.len() as u64 > room, "{} ≤ {room}", written.len());

    // It was only held back, not cut off: read now, it holds the whole recording.
    let mut stalled = tokio::io::BufReader::new(stalled);
    assert!(
        head.to_ascii_lowercase()
            .contains("transfer-encoding: chunked"),
        "{head}"
    );
    let body = tokio::time::timeout(T, read_chunked(&mut stalled))
        .await
        .expect("the stalled follower reads the rest");
    assert!(body == written, "{} bytes of {}", body.len(), written.len());
}
