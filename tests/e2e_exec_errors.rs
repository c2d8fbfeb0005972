//! Error paths and bad input through kube-ws-proxy: upstream refusals, an upstream that dies,
//! clients that leave, and protocol violations. Each gets a clear answer, and a concurrent
//! healthy session is never disturbed.

use crate::common;

use std::time::Duration;

use common::clients::require_kubectl;
use common::harness::{run, stderr, Harness};
use common::ws_client::{connect, exec_path, read_http_head, read_to_close, send};
use kube_ws_proxy::sim::SimEvent;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

const T: Duration = Duration::from_secs(60);
const SUCCESS: &[u8] = br#"{"metadata":{},"status":"Success"}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_v5_session_matches_the_reference_order() {
    let h = Harness::start().await;
    let path = exec_path("web", &["echo", "hi"], false, true, false);
    let (mut ws, resp) = connect(h.proxy.addr, &path, "v5.channel.k8s.io")
        .await
        .unwrap();
    assert_eq!(
        resp.headers().get("sec-websocket-protocol").unwrap(),
        "v5.channel.k8s.io"
    );
    let t = read_to_close(&mut ws).await;
    // Ready message, output, status, Close 1000 — in this order (PROTOCOL.md §6.3 #6).
    assert_eq!(t.messages.first().unwrap(), &vec![1u8]);
    assert_eq!(t.stdout, b"hi\n");
    assert_eq!(t.messages.last().unwrap()[0], 3);
    assert_eq!(t.status, SUCCESS);
    assert_eq!(t.close.unwrap().code, CloseCode::Normal);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_signal_half_closes_stdin_after_earlier_bytes() {
    let h = Harness::start().await;
    let path = exec_path("web", &["cat"], true, true, true);
    let (mut ws, _) = connect(h.proxy.addr, &path, "v4.channel.k8s.io, v5.channel.k8s.io")
        .await
        .unwrap();
    send(&mut ws, b"\x00first ").await;
    send(&mut ws, b"\x00second").await;
    send(&mut ws, b"\xff\x00").await;
    let t = read_to_close(&mut ws).await;
    assert_eq!(t.stdout, b"first second");
    assert_eq!(t.status, SUCCESS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_become_non_zero_exit_statuses() {
    let h = Harness::start().await;
    let path = exec_path("web", &["sh", "-c", "exit 2"], false, true, true);
    let (mut ws, _) = connect(h.proxy.addr, &path, "v5.channel.k8s.io")
        .await
        .unwrap();
    let t = read_to_close(&mut ws).await;
    let status: serde_json::Value = serde_json::from_slice(&t.status).unwrap();
    assert_eq!(status["status"], "Failure");
    assert_eq!(status["reason"], "NonZeroExitCode");
    assert_eq!(status["details"]["causes"][0]["reason"], "ExitCode");
    assert_eq!(status["details"]["causes"][0]["message"], "2");
}

/// Starts a slow healthy session, runs `bad` against the same proxy, and checks the healthy
/// one still completes byte-exact.
async fn with_healthy_neighbour<F, Fut>(h: &Harness, bad: F)
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let path = exec_path(
        "web",
        &["sh", "-c", "sleep 1; echo still-fine"],
        false,
        true,
        true,
    );
    let (mut healthy, _) = connect(h.proxy.addr, &path, "v5.channel.k8s.io")
        .await
        .unwrap();
    bad().await;
    let t = read_to_close(&mut healthy).await;
    assert_eq!(t.stdout, b"still-fine\n");
    assert_eq!(t.status, SUCCESS);
}

async fn expect_close(h: &Harness, frames: &[&[u8]], code: CloseCode) {
    let path = exec_path("web", &["sleep", "5"], true, true, true);
    let (mut ws, _) = connect(h.proxy.addr, &path, "v5.channel.k8s.io")
        .await
        .unwrap();
    for f in frames {
        send(&mut ws, f).await;
    }
    let t = tokio::time::timeout(T, read_to_close(&mut ws))
        .await
        .unwrap();
    assert_eq!(t.close.map(|c| c.code), Some(code));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_close_signal_closes_with_1002() {
    let h = Harness::start().await;
    with_healthy_neighbour(&h, || {
        expect_close(&h, &[b"\xff\x00\x00"], CloseCode::Protocol)
    })
    .await;
    with_healthy_neighbour(&h, || expect_close(&h, &[b"\xff\x09"], CloseCode::Protocol)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_channel_closes_with_1002_and_server_channels_are_ignored() {
    let h = Harness::start().await;
    with_healthy_neighbour(&h, || expect_close(&h, &[b"\x07junk"], CloseCode::Protocol)).await;
    // Channels 1–3 from a client are ignored: the session still completes.
    let path = exec_path("web", &["cat"], true, true, false);
    let (mut ws, _) = connect(h.proxy.addr, &path, "v5.channel.k8s.io")
        .await
        .unwrap();
    send(&mut ws, b"\x01ignored").await;
    send(&mut ws, b"\x03ignored").await;
    send(&mut ws, b"\x00kept").await;
    send(&mut ws, b"\xff\x00").await;
    let t = read_to_close(&mut ws).await;
    assert_eq!(t.stdout, b"kept");
    assert_eq!(t.status, SUCCESS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_messages_are_channel_data_like_the_reference() {
    // kube-apiserver reads text frames as bytes, and the Python client sends string stdin as
    // text: the channel byte is the first character.
    use futures_util::SinkExt;
    let h = Harness::start().await;
    let path = exec_path("web", &["cat"], true, true, false);
    let (mut ws, _) = connect(h.proxy.addr, &path, "v5.channel.k8s.io")
        .await
        .unwrap();
    ws.send(tokio_tungstenite::tungstenite::Message::Text(
        "\u{0}typed".into(),
    ))
    .await
    .unwrap();
    send(&mut ws, b"\xff\x00").await;
    let t = read_to_close(&mut ws).await;
    assert_eq!(t.stdout, b"typed");
    assert_eq!(t.status, SUCCESS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_messages_close_with_1009() {
    let h = Harness::start_with(Default::default(), &["--max-message-size", "65536"]).await;
    let big = vec![0u8; 100_000];
    let frames: [&[u8]; 1] = [&big];
    with_healthy_neighbour(&h, || expect_close(&h, &frames, CloseCode::Size)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fragmented_messages_are_reassembled() {
    use tokio::io::AsyncWriteExt;
    let h = Harness::start().await;
    let path = exec_path("web", &["cat"], true, true, false);
    let mut tcp = tokio::net::TcpStream::connect(h.proxy.addr).await.unwrap();
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Protocol: v5.channel.k8s.io\r\n\r\n"
    );
    tcp.write_all(req.as_bytes()).await.unwrap();
    // Binary FIN=0 "\x00fra", continuation FIN=0 "gme", continuation FIN=1 "nted", then CLOSE.
    let frames: [(u8, &[u8]); 4] = [
        (0x02, b"\x00fra"),
        (0x00, b"gme"),
        (0x80, b"nted"),
        (0x82, b"\xff\x00"),
    ];
    for (head, payload) in frames {
        tcp.write_all(&masked(head, payload)).await.unwrap();
    }
    let (head, leftover) = read_http_head(&mut tcp).await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    let mut ws = tokio_tungstenite::WebSocketStream::from_partially_read(
        tcp,
        leftover,
        tokio_tungstenite::tungstenite::protocol::Role::Client,
        None,
    )
    .await;
    let t = read_to_close(&mut ws).await;
    assert_eq!(t.stdout, b"fragmented");
    assert_eq!(t.status, SUCCESS);
}

fn masked(head: u8, payload: &[u8]) -> Vec<u8> {
    let key = [1u8, 2, 3, 4];
    let mut f = vec![head, 0x80 | payload.len() as u8];
    f.extend_from_slice(&key);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
    f
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_handshakes_get_http_errors() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let h = Harness::start().await;
    let path = exec_path("web", &["true"], false, true, false);
    for (req, want) in [
        (
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 8\r\nSec-WebSocket-Protocol: v5.channel.k8s.io\r\n\r\n"),
            "400",
        ),
        (
            format!("POST {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: v5.channel.k8s.io\r\nContent-Length: 0\r\n\r\n"),
            "405",
        ),
        ("\x16\x03\x01garbage that is not HTTP\r\n\r\n".to_string(), "400"),
    ] {
        let mut tcp = tokio::net::TcpStream::connect(h.proxy.addr).await.unwrap();
        tcp.write_all(req.as_bytes()).await.unwrap();
        let mut buf = vec![0u8; 4096];
        let n = tokio::time::timeout(T, tcp.read(&mut buf)).await.unwrap().unwrap_or(0);
        let head = String::from_utf8_lossy(&buf[..n]);
        assert!(head.starts_with(&format!("HTTP/1.1 {want}")), "got {head:?}");
    }
    // The proxy is still serving.
    let path = exec_path("web", &["echo", "alive"], false, true, false);
    let (mut ws, _) = connect(h.proxy.addr, &path, "v5.channel.k8s.io")
        .await
        .unwrap();
    assert_eq!(read_to_close(&mut ws).await.stdout, b"alive\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_sees_the_clusters_refusals_not_the_gateways() {
    let Some(k) = require_kubectl("1.33") else {
        return;
    };
    let h = Harness::start().await;

    let mut c = h.kubectl(&k, &h.via_gateway);
    c.args(["exec", "forbidden-x", "--", "true"]);
    let o = run(c, None, T).await;
    assert!(!o.status.success());
    assert!(stderr(&o).contains("forbidden"), "stderr: {}", stderr(&o));

    let mut c = h.kubectl(&k, &h.via_gateway);
    c.args(["exec", "error500-x", "--", "true"]);
    let o = run(c, None, T).await;
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("container runtime is not responding"),
        "stderr: {}",
        stderr(&o)
    );

    let mut c = h.kubectl(&k, &h.via_gateway);
    c.args([
        "exec",
        "dying-x",
        "--",
        "sh",
        "-c",
        "echo partial; sleep 5; echo never",
    ]);
    let o = run(c, None, T).await;
    assert!(
        !o.status.success(),
        "an upstream that died must not look like success"
    );

    assert_eq!(h.middlebox.dropped(), 0, "kubectl fell back to SPDY");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_disconnect_ends_the_upstream_session() {
    let h = Harness::start().await;
    let path = exec_path(
        "web",
        &["sh", "-c", "cat >/dev/null; sleep 30"],
        true,
        true,
        true,
    );
    let (mut ws, _) = connect(h.proxy.addr, &path, "v5.channel.k8s.io")
        .await
        .unwrap();
    send(&mut ws, b"\x00some input").await;
    let started = h
        .sim
        .wait_for_event(T, |e| matches!(e, SimEvent::ProcessStarted { .. }))
        .await
        .expect("process started");
    let SimEvent::ProcessStarted { session, .. } = started else {
        unreachable!()
    };
    drop(ws); // TCP close without a Close frame, like a killed kubectl.
    let stdin_closed = h
        .sim
        .wait_for_event(
            Duration::from_secs(5),
            |e| matches!(e, SimEvent::StdinClosed { session: s } if *s == session),
        )
        .await;
    assert!(stdin_closed.is_some(), "the process never saw stdin EOF");
    let ended = h
        .sim
        .wait_for_event(
            Duration::from_secs(5),
            |e| matches!(e, SimEvent::SessionEnded { session: s, .. } if *s == session),
        )
        .await;
    assert!(ended.is_some(), "the upstream session was not torn down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_base64_on_a_relayed_session_is_dropped_like_the_kubelet_does() {
    // base64.channel.k8s.io is relayed to the (old) kubelet unchanged; an undecodable message
    // is dropped there, the session goes on, and a concurrent session is untouched.
    use base64::Engine;
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let h = Harness::start().await;
    with_healthy_neighbour(&h, || async {
        let path = exec_path("web", &["head", "-c", "4"], true, true, false);
        let (mut ws, resp) = connect(h.proxy.addr, &path, "base64.channel.k8s.io")
            .await
            .unwrap();
        assert_eq!(
            resp.headers()["sec-websocket-protocol"],
            "base64.channel.k8s.io"
        );
        let b64 = base64::engine::general_purpose::STANDARD;
        ws.send(Message::Text("0!!!not base64!!!".into()))
            .await
            .unwrap();
        ws.send(Message::Text(format!("0{}", b64.encode("good")).into()))
            .await
            .unwrap();
        let mut stdout = Vec::new();
        let read = async {
            while let Some(Ok(msg)) = ws.next().await {
                if let Message::Text(t) = msg {
                    if let Some(payload) = t.strip_prefix('1') {
                        stdout.extend(b64.decode(payload).unwrap());
                    }
                }
            }
        };
        tokio::time::timeout(T, read).await.unwrap();
        assert_eq!(stdout, b"good");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pings_are_answered_while_output_is_backed_up() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let h = Harness::start().await;
    const TOTAL: usize = 100_000_000;
    let path = exec_path(
        "web",
        &["head", "-c", &TOTAL.to_string(), "/dev/zero"],
        false,
        true,
        false,
    );
    let (mut ws, _) = connect(h.proxy.addr, &path, "v5.channel.k8s.io")
        .await
        .unwrap();
    // Let output pile up in every buffer between the pod and us, then ping.
    tokio::time::sleep(Duration::from_secs(1)).await;
    ws.send(Message::Ping(b"are you there".to_vec().into()))
        .await
        .unwrap();
    let mut stdout_before_pong = None;
    let mut stdout = 0usize;
    let read = async {
        while let Some(Ok(msg)) = ws.next().await {
            match msg {
                Message::Binary(d) if d.first() == Some(&1) => stdout += d.len() - 1,
                Message::Pong(p) if &p[..] == b"are you there" => {
                    stdout_before_pong.get_or_insert(stdout);
                }
                Message::Close(_) => break,
                _ => {}
            }
        }
    };
    tokio::time::timeout(T, read).await.unwrap();
    assert_eq!(stdout, TOTAL);
    let before = stdout_before_pong.expect("the ping was never answered");
    // Answered behind what was already buffered, not after the whole output.
    assert!(
        before < TOTAL / 2,
        "pong only after {before} of {TOTAL} bytes"
    );
}

/// A session with no output streams (stdin only) still answers pings while the command runs:
/// kubectl's heartbeat closes a connection whose pings go unanswered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pings_are_answered_on_a_session_without_output() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let h = Harness::start().await;
    let path = exec_path("web", &["sh", "-c", "cat >/dev/null"], true, false, false);
    let (mut ws, _) = connect(h.proxy.addr, &path, "v5.channel.k8s.io")
        .await
        .unwrap();
    for i in 0..3u8 {
        send(&mut ws, b"\x00some stdin").await;
        ws.send(Message::Ping(vec![i; 3].into())).await.unwrap();
        let pong = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match ws.next().await {
                    Some(Ok(Message::Pong(p))) => return p,
                    Some(Ok(Message::Close(c))) => panic!("closed before the pong: {c:?}"),
                    Some(Ok(_)) => continue,
                    other => panic!("session ended: {other:?}"),
                }
            }
        })
        .await
        .expect("no pong while the command runs");
        assert_eq!(&pong[..], &[i; 3]);
    }
    send(&mut ws, b"\xff\x00").await;
    let t = tokio::time::timeout(T, read_to_close(&mut ws))
        .await
        .unwrap();
    assert_eq!(t.status, SUCCESS);
}
