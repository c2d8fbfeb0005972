//! Whole sessions over in-memory pipes: our SPDY client role plays kubectl ≤ 1.30, a
//! tungstenite server plays the v5 upstream, the reverse translator sits between them.

use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use super::*;
use crate::spdy::frame::HeaderBlock;
use crate::spdy::proto::{Config, Connection, RecvStream, SendStream};
use crate::translate::exec_options::{ExecOptions, StreamKind};
use crate::translate::protocol::UpstreamVersion;
use crate::translate::remote_command::{Outcome, SessionEndKind, SessionRecording};

const SUCCESS: &[u8] = br#"{"metadata":{},"status":"Success"}"#;
const EXIT_3: &[u8] = br#"{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit code: command terminated with exit code 3","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"3"}]}}"#;

type Upstream = WebSocketStream<DuplexStream>;

fn quiet() -> Config {
    Config {
        ping_interval: None,
        ..Config::default()
    }
}

/// The client's streams, by kind, as kubectl holds them.
#[derive(Default)]
struct Kubectl {
    conn: Option<Connection>,
    error: Option<RecvStream>,
    stdin: Option<SendStream>,
    stdout: Option<RecvStream>,
    stderr: Option<RecvStream>,
    resize: Option<SendStream>,
}

/// Starts a session: kubectl's streams for `query` under `version`, the translator running
/// against the returned upstream end.
async fn start(
    query: &str,
    version: UpstreamVersion,
    limits: ReverseLimits,
) -> (Kubectl, Upstream, tokio::task::JoinHandle<Outcome>) {
    start_recorded(query, version, limits, None).await
}

/// [`start`], the session recorded by `recording`.
async fn start_recorded(
    query: &str,
    version: UpstreamVersion,
    limits: ReverseLimits,
    recording: Option<SessionRecording>,
) -> (Kubectl, Upstream, tokio::task::JoinHandle<Outcome>) {
    let options = ExecOptions::from_query(query);
    let (client_io, proxy_io) = tokio::io::duplex(256 * 1024);
    let (proxy_up, upstream_io) = tokio::io::duplex(256 * 1024);
    let (server, incoming) = Connection::server(proxy_io, Bytes::new(), quiet());
    let opts = options.clone();
    let accepting = tokio::spawn(async move {
        accept_streams(server, incoming, version, &opts, Duration::from_secs(5)).await
    });
    let conn = Connection::client(client_io, Bytes::new(), quiet());
    let mut k = Kubectl::default();
    for kind in options.upstream_streams(version) {
        let mut h = HeaderBlock::new();
        h.push("streamtype", kind.wire_name());
        let (tx, rx) = conn.open_stream(h).await.unwrap().split();
        match kind {
            StreamKind::Error => k.error = Some(rx),
            StreamKind::Stdin => k.stdin = Some(tx),
            StreamKind::Stdout => k.stdout = Some(rx),
            StreamKind::Stderr => k.stderr = Some(rx),
            StreamKind::Resize => k.resize = Some(tx),
            StreamKind::Data => {}
        }
    }
    k.conn = Some(conn);
    let streams = accepting.await.unwrap().unwrap();
    let to_upstream = WebSocketStream::from_raw_socket(proxy_up, Role::Client, None).await;
    let upstream = WebSocketStream::from_raw_socket(upstream_io, Role::Server, None).await;
    let session = tokio::spawn(async move {
        let traffic = crate::session_traffic::SessionTraffic::new();
        let stop = crate::session_stop::SessionStop::default();
        run(
            streams,
            to_upstream,
            &limits,
            stop,
            recording.as_ref(),
            &traffic,
        )
        .await
    });
    (k, upstream, session)
}

async fn read_all(rx: &mut RecvStream) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(Ok(chunk)) = rx.recv().await {
        out.extend_from_slice(&chunk);
    }
    out
}

async fn next_binary(up: &mut Upstream) -> Vec<u8> {
    loop {
        match up.next().await.expect("upstream message").unwrap() {
            Message::Binary(b) => return b.to_vec(),
            Message::Ping(_) | Message::Pong(_) => continue,
            other => panic!("unexpected {other:?}"),
        }
    }
}

async fn finish_upstream(up: &mut Upstream, status: &[u8]) {
    up.send(Message::Binary(Bytes::from([&[3u8][..], status].concat())))
        .await
        .unwrap();
    up.close(Some(CloseFrame {
        code: CloseCode::Normal,
        reason: "".into(),
    }))
    .await
    .unwrap();
}

#[tokio::test]
async fn output_exit_code_and_status_bytes() {
    let (mut k, mut up, session) = start(
        "command=sh&stdout=true&stderr=true",
        UpstreamVersion::V4,
        ReverseLimits::default(),
    )
    .await;
    // Ready message, output on both channels, the exit status, Close 1000.
    up.send(Message::Binary(Bytes::from_static(&[1])))
        .await
        .unwrap();
    up.send(Message::Binary(Bytes::from_static(b"\x01out\n")))
        .await
        .unwrap();
    up.send(Message::Binary(Bytes::from_static(b"\x02err\n")))
        .await
        .unwrap();
    finish_upstream(&mut up, EXIT_3).await;
    assert_eq!(read_all(k.stdout.as_mut().unwrap()).await, b"out\n");
    assert_eq!(read_all(k.stderr.as_mut().unwrap()).await, b"err\n");
    // A v4 client decodes the upstream's Status exactly as a v5 one would.
    assert_eq!(read_all(k.error.as_mut().unwrap()).await, EXIT_3);
    let outcome = session.await.unwrap();
    assert_eq!(outcome.end, SessionEndKind::Completed);
    assert_eq!(outcome.status.unwrap().exit_code(), Some(3));
    assert_eq!(outcome.bytes_out, 8);
}

#[tokio::test]
async fn output_sent_in_a_burst_arrives_and_is_recorded_in_order() {
    use crate::audit::recording::{
        RecordPolicy, RecordingConfig, RecordingCounters, RecordingPlace, Recordings,
    };
    let dir = tempfile::tempdir().unwrap();
    let recordings = Recordings::start(
        RecordingConfig {
            dir: dir.path().to_owned(),
            policy: RecordPolicy::Required,
            record_stdin: false,
            min_free: 0,
            max_bytes: None,
        },
        RecordingCounters::unregistered(),
    )
    .unwrap();
    let recorder = recordings
        .open(
            RecordingPlace {
                cluster: "default",
                folder: None,
                namespace: "default",
            },
            "burst-1",
            &["sh".into()],
            String::new(),
            false,
        )
        .await
        .unwrap();
    let path = recorder.path().to_owned();
    let (mut k, mut up, session) = start_recorded(
        "command=sh&stdout=true&stderr=true",
        UpstreamVersion::V4,
        ReverseLimits::default(),
        Some(SessionRecording {
            recorder,
            required: true,
        }),
    )
    .await;
    // More than one batch's worth, both channels mixed, all queued before the reader looks,
    // the Status and Close right behind: nothing may be lost, reordered or cut short.
    let mut shown = Vec::new();
    let mut expected = [Vec::new(), Vec::new()];
    for i in 0..200u32 {
        let channel = if i % 3 == 2 { 2u8 } else { 1 };
        let text = format!("{i:05}{}\n", "x".repeat(2000));
        expected[channel as usize - 1].extend_from_slice(text.as_bytes());
        shown.extend_from_slice(text.as_bytes());
        up.send(Message::Binary(Bytes::from(
            [&[channel], text.as_bytes()].concat(),
        )))
        .await
        .unwrap();
    }
    finish_upstream(&mut up, SUCCESS).await;
    let (out, err) = tokio::join!(
        read_all(k.stdout.as_mut().unwrap()),
        read_all(k.stderr.as_mut().unwrap())
    );
    assert_eq!((out, err), (expected[0].clone(), expected[1].clone()));
    let outcome = session.await.unwrap();
    assert_eq!(outcome.end, SessionEndKind::Completed);
    assert_eq!(outcome.bytes_out, shown.len() as u64);
    drop(outcome);
    // The recording holds every message in the order the upstream sent them.
    let mut recorded = String::new();
    for _ in 0..500 {
        recorded = std::fs::read_to_string(&path).unwrap_or_default();
        if recorded.lines().count() > 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let text = crate::audit::recording::asciicast::event_text(recorded.lines().skip(1));
    assert_eq!(text.as_bytes(), &shown[..]);
}

#[tokio::test]
async fn stdin_then_eof_becomes_data_then_close_signal() {
    let (mut k, mut up, session) = start(
        "command=cat&stdin=true&stdout=true",
        UpstreamVersion::V4,
        ReverseLimits::default(),
    )
    .await;
    let stdin = k.stdin.as_mut().unwrap();
    stdin.send(Bytes::from_static(b"hello ")).await.unwrap();
    stdin.send(Bytes::from_static(b"world")).await.unwrap();
    stdin.finish().await.unwrap();
    assert_eq!(next_binary(&mut up).await, b"\x00hello ");
    assert_eq!(next_binary(&mut up).await, b"\x00world");
    assert_eq!(next_binary(&mut up).await, [0xFF, 0x00]);
    up.send(Message::Binary(Bytes::from_static(b"\x01hello world")))
        .await
        .unwrap();
    finish_upstream(&mut up, SUCCESS).await;
    assert_eq!(read_all(k.stdout.as_mut().unwrap()).await, b"hello world");
    assert_eq!(read_all(k.error.as_mut().unwrap()).await, SUCCESS);
    let outcome = session.await.unwrap();
    assert_eq!(outcome.bytes_in, 11);
    assert_eq!(outcome.status.unwrap().exit_code(), Some(0));
}

#[tokio::test]
async fn a_large_stdin_frame_goes_upstream_in_messages_of_kubectls_size() {
    let (mut k, mut up, session) = start(
        "command=cat&stdin=true&stdout=true",
        UpstreamVersion::V4,
        ReverseLimits::default(),
    )
    .await;
    // One 100,000-byte DATA frame from the client.
    let big: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
    let stdin = k.stdin.as_mut().unwrap();
    stdin.send(Bytes::from(big.clone())).await.unwrap();
    stdin.finish().await.unwrap();
    let mut got = Vec::new();
    loop {
        let msg = next_binary(&mut up).await;
        if msg == [0xFF, 0x00] {
            break;
        }
        assert_eq!(msg[0], 0, "stdin");
        assert!(msg.len() <= 32 * 1024 + 1, "{}", msg.len());
        got.extend_from_slice(&msg[1..]);
    }
    assert_eq!(got, big);
    finish_upstream(&mut up, SUCCESS).await;
    assert_eq!(session.await.unwrap().bytes_in, 100_000);
}

#[tokio::test]
async fn tty_sizes_go_to_channel_4_reencoded() {
    let (mut k, mut up, session) = start(
        "command=sh&stdin=true&stdout=true&tty=true",
        UpstreamVersion::V4,
        ReverseLimits::default(),
    )
    .await;
    assert!(k.stderr.is_none(), "no stderr stream under tty");
    let resize = k.resize.as_mut().unwrap();
    // Split across frames, lowercase keys: still one size, written as kubectl writes it.
    resize
        .send(Bytes::from_static(b"{\"width\":100,"))
        .await
        .unwrap();
    resize
        .send(Bytes::from_static(b"\"height\":40}\n"))
        .await
        .unwrap();
    assert_eq!(
        next_binary(&mut up).await,
        b"\x04{\"Width\":100,\"Height\":40}\n"
    );
    // A malformed size ends resizing, not the session.
    resize.send(Bytes::from_static(b"nonsense")).await.unwrap();
    resize
        .send(Bytes::from_static(b"{\"Width\":1,\"Height\":2}"))
        .await
        .unwrap();
    k.stdin
        .as_mut()
        .unwrap()
        .send(Bytes::from_static(b"x"))
        .await
        .unwrap();
    assert_eq!(next_binary(&mut up).await, b"\x00x");
    finish_upstream(&mut up, SUCCESS).await;
    assert_eq!(read_all(k.error.as_mut().unwrap()).await, SUCCESS);
    assert_eq!(session.await.unwrap().end, SessionEndKind::Completed);
}

#[tokio::test]
async fn older_versions_get_text_on_failure_and_nothing_on_success() {
    let (mut k, mut up, session) = start(
        "command=true&stdout=true",
        UpstreamVersion::V2,
        ReverseLimits::default(),
    )
    .await;
    finish_upstream(&mut up, SUCCESS).await;
    assert_eq!(read_all(k.error.as_mut().unwrap()).await, b"");
    assert_eq!(read_all(k.stdout.as_mut().unwrap()).await, b"");
    session.await.unwrap();

    let (mut k, mut up, session) = start(
        "command=false&stdout=true",
        UpstreamVersion::V1,
        ReverseLimits::default(),
    )
    .await;
    finish_upstream(&mut up, EXIT_3).await;
    assert_eq!(
        read_all(k.error.as_mut().unwrap()).await,
        b"command terminated with non-zero exit code: command terminated with exit code 3"
    );
    session.await.unwrap();

    // v2 under tty: no resize stream exists (v3 brought it).
    let (k, mut up, session) = start(
        "command=sh&stdin=true&stdout=true&tty=true",
        UpstreamVersion::V2,
        ReverseLimits::default(),
    )
    .await;
    assert!(k.resize.is_none());
    finish_upstream(&mut up, SUCCESS).await;
    session.await.unwrap();
}

#[tokio::test]
async fn an_upstream_that_vanishes_without_a_status_is_a_failure() {
    let (mut k, up, session) = start(
        "command=sh&stdout=true",
        UpstreamVersion::V4,
        ReverseLimits::default(),
    )
    .await;
    drop(up);
    let status = read_all(k.error.as_mut().unwrap()).await;
    let status: crate::translate::status::Status = serde_json::from_slice(&status).unwrap();
    assert_eq!(status.reason, "InternalError");
    assert!(status
        .message
        .contains(crate::translate::status_mapping::NO_STATUS_MESSAGE));
    assert_eq!(session.await.unwrap().end, SessionEndKind::Completed);
}

#[tokio::test]
async fn a_client_that_leaves_closes_the_upstream() {
    let (k, mut up, session) = start(
        "command=sh&stdin=true&stdout=true",
        UpstreamVersion::V4,
        ReverseLimits::default(),
    )
    .await;
    k.conn.as_ref().unwrap().close().await;
    // Whatever stdin EOF got out first, the upstream ends with Close 1000.
    let close = loop {
        match up.next().await {
            Some(Ok(Message::Close(frame))) => break frame,
            Some(Ok(_)) => continue,
            other => panic!("no close: {other:?}"),
        }
    };
    assert_eq!(close.unwrap().code, CloseCode::Normal);
    let outcome = session.await.unwrap();
    assert_eq!(outcome.end, SessionEndKind::ClientGone);
    assert!(outcome.status.is_none());
}

#[tokio::test(start_paused = true)]
async fn an_idle_session_is_ended_with_a_status() {
    let limits = ReverseLimits {
        idle_timeout: Some(Duration::from_secs(60)),
        upstream_ping_interval: None,
        ..ReverseLimits::default()
    };
    let (mut k, _up, session) =
        start("command=sleep&stdout=true", UpstreamVersion::V4, limits).await;
    let status = read_all(k.error.as_mut().unwrap()).await;
    let status: crate::translate::status::Status = serde_json::from_slice(&status).unwrap();
    assert_eq!(status.code, 504);
    assert!(status.message.contains("--stream-idle-timeout"));
    assert_eq!(session.await.unwrap().end, SessionEndKind::IdleTimeout);
}

#[tokio::test(start_paused = true)]
async fn a_silent_upstream_is_pinged_then_given_up_on() {
    let limits = ReverseLimits {
        upstream_ping_interval: Some(Duration::from_secs(5)),
        upstream_ping_timeout: Some(Duration::from_secs(10)),
        ..ReverseLimits::default()
    };
    let (mut k, up, session) =
        start("command=sleep&stdout=true", UpstreamVersion::V4, limits).await;
    // The upstream's socket is kept open but never read: no pong ever comes.
    let status = read_all(k.error.as_mut().unwrap()).await;
    let status: crate::translate::status::Status = serde_json::from_slice(&status).unwrap();
    assert!(status.message.contains("stopped answering"), "{status:?}");
    assert_eq!(
        session.await.unwrap().end,
        SessionEndKind::UpstreamUnresponsive
    );
    drop(up);
}

#[tokio::test]
async fn port_forward_carries_spdy_bytes_unchanged() {
    let (client, proxy_side) = tokio::io::duplex(64 * 1024);
    let (proxy_up, upstream_io) = tokio::io::duplex(64 * 1024);
    let to_upstream = WebSocketStream::from_raw_socket(proxy_up, Role::Client, None).await;
    let mut up = WebSocketStream::from_raw_socket(upstream_io, Role::Server, None).await;
    let relay = tokio::spawn(async move {
        let traffic = crate::session_traffic::SessionTraffic::new();
        let stop = crate::session_stop::SessionStop::default();
        port_forward::run(proxy_side, to_upstream, stop, None, None, &traffic).await
    });
    let (mut client_read, mut client_write) = tokio::io::split(client);
    // A SYN_STREAM's first bytes, in two writes: whatever the boundaries, the bytes arrive.
    let frame = [
        0x80u8, 0x03, 0x00, 0x01, 0x00, 0x00, 0x00, 0x0A, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,
    ];
    client_write.write_all(&frame[..5]).await.unwrap();
    let mut got = next_binary(&mut up).await;
    client_write.write_all(&frame[5..]).await.unwrap();
    while got.len() < frame.len() {
        got.extend(next_binary(&mut up).await);
    }
    assert_eq!(got, frame);
    // Upstream messages, split anywhere, reach the client as one byte stream.
    up.send(Message::Binary(Bytes::from_static(&[0x80, 0x03])))
        .await
        .unwrap();
    up.send(Message::Binary(Bytes::from_static(&[
        0x00, 0x06, 0, 0, 0, 4, 0, 0, 0, 1,
    ])))
    .await
    .unwrap();
    let mut buf = [0u8; 12];
    client_read.read_exact(&mut buf).await.unwrap();
    assert_eq!(buf, [0x80, 0x03, 0x00, 0x06, 0, 0, 0, 4, 0, 0, 0, 1]);
    // The client leaving ends the tunnel with Close 1000 upstream.
    drop(client_write);
    drop(client_read);
    let close = loop {
        match up.next().await {
            Some(Ok(Message::Close(frame))) => break frame,
            Some(Ok(_)) => continue,
            other => panic!("no close: {other:?}"),
        }
    };
    assert_eq!(close.unwrap().code, CloseCode::Normal);
    // Reading on sends the answer to the Close.
    assert!(up.next().await.is_none());
    let outcome = relay.await.unwrap();
    assert_eq!(outcome.bytes_up, frame.len() as u64);
    assert_eq!(outcome.bytes_down, 12);
}

#[tokio::test]
async fn streams_must_all_arrive_in_time() {
    let (client_io, proxy_io) = tokio::io::duplex(64 * 1024);
    let (server, incoming) = Connection::server(proxy_io, Bytes::new(), quiet());
    let options = ExecOptions::from_query("stdout=true&stdin=true");
    let accepting = tokio::spawn(async move {
        accept_streams(
            server,
            incoming,
            UpstreamVersion::V4,
            &options,
            Duration::from_millis(200),
        )
        .await
    });
    let conn = Connection::client(client_io, Bytes::new(), quiet());
    let mut h = HeaderBlock::new();
    h.push("streamtype", "error");
    let _error = conn.open_stream(h).await.unwrap();
    // An unknown type is replied to and not counted.
    let mut h = HeaderBlock::new();
    h.push("streamtype", "bogus");
    let _bogus = conn.open_stream(h).await.unwrap();
    assert_eq!(accepting.await.unwrap().unwrap_err(), AcceptError::Timeout);
}
