//! Session tests over an in-memory pipe: our client against our server role, plus raw-frame
//! peers for the behaviours a well-behaved server of ours would never show.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use super::*;
use crate::spdy::codec::{FrameDecoder, FrameEncoder};
use crate::spdy::frame::{
    Data, Frame, GoAway, GoAwayStatus, HeaderBlock, Ping, PingId, RstStatus, RstStream, Settings,
    StreamId, SynReply, WindowUpdate,
};

pub(super) fn quiet() -> Config {
    Config {
        ping_interval: None,
        ..Config::default()
    }
}

pub(super) fn headers(kind: &str) -> HeaderBlock {
    let mut h = HeaderBlock::new();
    h.push("streamtype", kind);
    h
}

/// A server that echoes every stream and half-closes when the client does.
async fn echo_server(io: DuplexStream) -> Connection {
    let (conn, mut incoming) = Connection::server(io, Bytes::new(), quiet());
    tokio::spawn(async move {
        while let Some(s) = incoming.accept().await {
            tokio::spawn(async move {
                let (mut tx, mut rx) = s.accept().await.unwrap().split();
                while let Some(Ok(data)) = rx.recv().await {
                    if tx.send(data).await.is_err() {
                        return;
                    }
                }
                let _ = tx.finish().await;
            });
        }
    });
    conn
}

#[tokio::test]
async fn echo_round_trip_with_half_close() {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let _server = echo_server(b).await;
    let client = Connection::client(a, Bytes::new(), quiet());
    let stream = client.open_stream(headers("stdin")).await.unwrap();
    assert_eq!(stream.id(), StreamId::new(1));
    let (mut tx, mut rx) = stream.split();
    tx.send(Bytes::from_static(b"hello ")).await.unwrap();
    tx.send(Bytes::from_static(b"world")).await.unwrap();
    tx.finish().await.unwrap();
    let mut got = Vec::new();
    while let Some(chunk) = rx.recv().await {
        got.extend_from_slice(&chunk.unwrap());
    }
    assert_eq!(got, b"hello world");
    assert!(!rx.was_reset());
}

#[tokio::test]
async fn stream_ids_are_odd_and_increasing_under_concurrency() {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let _server = echo_server(b).await;
    let client = Connection::client(a, Bytes::new(), quiet());
    let mut opens = Vec::new();
    for _ in 0..50 {
        let c = client.clone();
        opens.push(tokio::spawn(
            async move { c.open_stream(headers("data")).await },
        ));
    }
    let mut ids = Vec::new();
    for o in opens {
        ids.push(o.await.unwrap().unwrap().id().get());
    }
    ids.sort();
    assert_eq!(ids, (0..50).map(|i| 1 + 2 * i).collect::<Vec<_>>());
}

#[tokio::test]
async fn large_transfer_needs_no_window_update() {
    // A peer that never sends WINDOW_UPDATE (like every Kubernetes peer) must not stall us.
    let (a, b) = tokio::io::duplex(256 * 1024);
    let _server = echo_server(b).await;
    let client = Connection::client(a, Bytes::new(), quiet());
    let (mut tx, mut rx) = client.open_stream(headers("data")).await.unwrap().split();
    let total = 8 * 1024 * 1024;
    let writer = tokio::spawn(async move {
        let chunk = Bytes::from(vec![7u8; 100_000]);
        let mut sent = 0;
        while sent < total {
            tx.send(chunk.clone()).await.unwrap();
            sent += chunk.len();
        }
        tx.finish().await.unwrap();
        sent
    });
    let mut received = 0;
    while let Some(chunk) = rx.recv().await {
        received += chunk.unwrap().len();
    }
    assert_eq!(received, writer.await.unwrap());
}

/// A raw peer: reads our frames and writes frames we choose.
pub(super) struct RawPeer<T = DuplexStream> {
    pub(super) io: T,
    buf: BytesMut,
    dec: FrameDecoder,
    enc: FrameEncoder,
}

impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin> RawPeer<T> {
    pub(super) fn new(io: T) -> Self {
        RawPeer {
            io,
            buf: BytesMut::new(),
            dec: FrameDecoder::new(),
            enc: FrameEncoder::new(),
        }
    }

    pub(super) async fn read(&mut self) -> Option<Frame> {
        loop {
            if let Some(f) = self.dec.decode(&mut self.buf).unwrap() {
                return Some(f);
            }
            if self.io.read_buf(&mut self.buf).await.ok()? == 0 {
                return None;
            }
        }
    }

    pub(super) async fn write(&mut self, frame: Frame) {
        let mut out = BytesMut::new();
        self.enc.encode(&frame, &mut out).unwrap();
        self.io.write_all(&out).await.unwrap();
    }

    /// Reads frames until a SYN_STREAM and replies to it.
    pub(super) async fn accept(&mut self) -> StreamId {
        loop {
            if let Some(Frame::SynStream(syn)) = self.read().await {
                self.write(Frame::SynReply(SynReply {
                    stream_id: syn.stream_id,
                    fin: false,
                    headers: HeaderBlock::new(),
                }))
                .await;
                return syn.stream_id;
            }
        }
    }
}

fn data(id: StreamId, payload: &'static [u8], fin: bool) -> Frame {
    Frame::Data(Data {
        stream_id: id,
        fin,
        payload: Bytes::from_static(payload),
    })
}

#[tokio::test]
async fn reset_ends_reader_after_earlier_data() {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let client = Connection::client(a, Bytes::new(), quiet());
    let mut peer = RawPeer::new(b);
    let open = tokio::spawn({
        let c = client.clone();
        async move { c.open_stream(headers("stdout")).await }
    });
    let id = peer.accept().await;
    let (_tx, mut rx) = open.await.unwrap().unwrap().split();
    peer.write(data(id, b"before reset", false)).await;
    peer.write(Frame::RstStream(RstStream {
        stream_id: id,
        status: RstStatus::Cancel,
    }))
    .await;
    assert_eq!(
        rx.recv().await.unwrap().unwrap(),
        Bytes::from_static(b"before reset")
    );
    assert!(rx.recv().await.is_none());
    assert!(rx.was_reset());
}

#[tokio::test]
async fn peer_pings_are_echoed_and_extra_frames_ignored() {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let client = Connection::client(a, Bytes::new(), quiet());
    let mut peer = RawPeer::new(b);
    peer.write(Frame::Settings(Settings {
        clear: false,
        entries: vec![],
    }))
    .await;
    peer.write(Frame::WindowUpdate(WindowUpdate {
        stream_id: StreamId::ZERO,
        delta: 65536,
    }))
    .await;
    peer.write(Frame::Ping(Ping { id: PingId(2) })).await;
    assert_eq!(peer.read().await, Some(Frame::Ping(Ping { id: PingId(2) })));
    // Our own ping gets an odd id and resolves on the echo.
    let ping = tokio::spawn({
        let c = client.clone();
        async move { c.ping().await }
    });
    let Some(Frame::Ping(p)) = peer.read().await else {
        panic!("expected our ping")
    };
    assert_eq!(p.id.0 % 2, 1);
    peer.write(Frame::Ping(p)).await;
    assert!(ping.await.unwrap().is_ok());
    assert!(client.end_reason().is_none());
}

#[tokio::test]
async fn periodic_pings_are_sent() {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let config = Config {
        ping_interval: Some(Duration::from_millis(50)),
        ..Config::default()
    };
    let _client = Connection::client(a, Bytes::new(), config);
    let mut peer = RawPeer::new(b);
    let first = tokio::time::timeout(Duration::from_secs(2), peer.read())
        .await
        .unwrap();
    let second = tokio::time::timeout(Duration::from_secs(2), peer.read())
        .await
        .unwrap();
    // Unanswered pings do not stop the session or the pinging.
    assert!(matches!(first, Some(Frame::Ping(Ping { id: PingId(1) }))));
    assert!(matches!(second, Some(Frame::Ping(Ping { id: PingId(3) }))));
}

#[tokio::test]
async fn kubernetes_style_close_ends_streams_cleanly() {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let client = Connection::client(a, Bytes::new(), quiet());
    let mut peer = RawPeer::new(b);
    let open = tokio::spawn({
        let c = client.clone();
        async move { c.open_stream(headers("error")).await }
    });
    let id = peer.accept().await;
    let (_tx, mut rx) = open.await.unwrap().unwrap().split();
    peer.write(data(id, b"{\"status\":\"Success\"}", false))
        .await;
    peer.write(Frame::RstStream(RstStream {
        stream_id: id,
        status: RstStatus::Cancel,
    }))
    .await;
    peer.write(Frame::GoAway(GoAway {
        last_good_stream_id: StreamId::ZERO,
        status: GoAwayStatus::Ok,
    }))
    .await;
    drop(peer);
    assert_eq!(
        rx.recv().await.unwrap().unwrap(),
        Bytes::from_static(b"{\"status\":\"Success\"}")
    );
    assert!(rx.recv().await.is_none());
    assert_eq!(client.closed().await, SessionEnd::GoAway(GoAwayStatus::Ok));
    assert!(client.open_stream(headers("stdin")).await.is_err());
}

#[tokio::test]
async fn connection_loss_is_an_error_for_open_streams() {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let client = Connection::client(a, Bytes::new(), quiet());
    let mut peer = RawPeer::new(b);
    let open = tokio::spawn({
        let c = client.clone();
        async move { c.open_stream(headers("stdout")).await }
    });
    peer.accept().await;
    let (_tx, mut rx) = open.await.unwrap().unwrap().split();
    drop(peer);
    assert!(matches!(
        rx.recv().await,
        Some(Err(Error::SessionClosed(SessionEnd::Eof)))
    ));
    assert!(rx.recv().await.is_none());
}

#[tokio::test]
async fn syn_reply_timeout_and_refusal() {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let config = Config {
        syn_reply_timeout: Duration::from_millis(100),
        ..quiet()
    };
    let client = Connection::client(a, Bytes::new(), config);
    let mut peer = RawPeer::new(b);
    let first = client.open_stream(headers("error")).await;
    assert!(matches!(first, Err(Error::SynReplyTimeout)));
    let open = tokio::spawn({
        let c = client.clone();
        async move { c.open_stream(headers("error")).await }
    });
    // Skip the first SYN_STREAM, refuse the second.
    let _ = peer.read().await;
    let Some(Frame::SynStream(syn)) = peer.read().await else {
        panic!()
    };
    peer.write(Frame::RstStream(RstStream {
        stream_id: syn.stream_id,
        status: RstStatus::Cancel,
    }))
    .await;
    assert!(matches!(
        open.await.unwrap(),
        Err(Error::StreamReset(RstStatus::Cancel))
    ));
}

#[tokio::test]
async fn our_close_resets_open_streams_then_goes_away() {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let client = Connection::client(a, Bytes::new(), quiet());
    let mut peer = RawPeer::new(b);
    let open = tokio::spawn({
        let c = client.clone();
        async move { c.open_stream(headers("stdin")).await }
    });
    let id = peer.accept().await;
    let _stream = open.await.unwrap().unwrap();
    client.close().await;
    assert_eq!(
        peer.read().await,
        Some(Frame::RstStream(RstStream {
            stream_id: id,
            status: RstStatus::Cancel
        }))
    );
    assert!(matches!(peer.read().await, Some(Frame::GoAway(_))));
    assert_eq!(peer.read().await, None);
}

#[tokio::test]
async fn slow_reader_applies_backpressure_instead_of_buffering() {
    // The peer floods a stream nobody reads; the session must stop reading the socket after
    // the inbox bound instead of buffering everything.
    let (a, b) = tokio::io::duplex(16 * 1024);
    let config = Config {
        stream_inbox_bytes: 64 * 1024,
        ..quiet()
    };
    let client = Connection::client(a, Bytes::new(), config);
    let mut peer = RawPeer::new(b);
    let open = tokio::spawn({
        let c = client.clone();
        async move { c.open_stream(headers("stdout")).await }
    });
    let id = peer.accept().await;
    let (_tx, mut rx) = open.await.unwrap().unwrap().split();
    let flood = tokio::spawn(async move {
        let chunk = vec![1u8; 16 * 1024];
        let mut written = 0usize;
        loop {
            let mut out = BytesMut::new();
            FrameEncoder::encode_data_head(id, false, chunk.len(), &mut out);
            out.extend_from_slice(&chunk);
            match tokio::time::timeout(Duration::from_millis(300), peer.io.write_all(&out)).await {
                Ok(Ok(())) => written += out.len(),
                _ => return (written, peer),
            }
        }
    });
    let (written, _peer) = flood.await.unwrap();
    // inbox (64 KiB) + pipe (16 KiB) + one frame in flight, not megabytes.
    assert!(written < 160 * 1024, "peer could write {written} bytes");
    let mut drained = 0;
    while drained < 64 * 1024 {
        drained += rx.recv().await.unwrap().unwrap().len();
    }
}

#[tokio::test]
async fn close_never_overtakes_data_already_sent() {
    let (a, b) = tokio::io::duplex(1024 * 1024);
    let client = Connection::client(a, Bytes::new(), quiet());
    let mut peer = RawPeer::new(b);
    let open = tokio::spawn({
        let c = client.clone();
        async move { c.open_stream(headers("error")).await }
    });
    let id = peer.accept().await;
    let (mut send, _recv) = open.await.unwrap().unwrap().split();
    // Enough frames to fill the data queue, then a FIN, then close at once.
    for _ in 0..16 {
        send.send(Bytes::from_static(b"status")).await.unwrap();
    }
    send.finish().await.unwrap();
    client.close().await;
    let mut payload = Vec::new();
    let mut fin = false;
    loop {
        match peer.read().await {
            Some(Frame::Data(d)) => {
                assert!(!fin, "data after FIN");
                payload.extend_from_slice(&d.payload);
                fin = d.fin;
            }
            Some(Frame::GoAway(_)) => break,
            other => panic!("unexpected frame before GOAWAY: {other:?}"),
        }
    }
    assert!(fin, "FIN must precede GOAWAY");
    assert_eq!(payload, b"status".repeat(16));
    let _ = id;
}

/// Pings every 5 s, and the peer may stay silent 10 s past a due ping: 15 s in all.
const PING_INTERVAL: Duration = Duration::from_secs(5);
const PING_TIMEOUT: Duration = Duration::from_secs(10);
const ALLOWED_SILENCE: Duration = Duration::from_secs(15);

fn liveness() -> Config {
    Config {
        ping_interval: Some(PING_INTERVAL),
        ping_timeout: Some(PING_TIMEOUT),
        ..Config::default()
    }
}

/// Opens one stream against `peer`, which replies to it.
async fn open_against(client: &Connection, peer: &mut RawPeer) -> Stream {
    let open = tokio::spawn({
        let c = client.clone();
        async move { c.open_stream(headers("stdout")).await }
    });
    peer.accept().await;
    open.await.unwrap().unwrap()
}

/// Whether the other end of `io` is gone: writing to a dropped duplex end fails.
async fn other_end_dropped(io: &mut DuplexStream) -> bool {
    match io.write_all(b"x").await {
        Ok(()) => false,
        Err(e) => {
            assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe);
            true
        }
    }
}

#[tokio::test(start_paused = true)]
async fn unanswered_pings_end_the_session_as_ping_timeout() {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let client = Connection::client(a, Bytes::new(), liveness());
    let mut peer = RawPeer::new(b);
    let (_tx, mut rx) = open_against(&client, &mut peer).await.split();
    // The SYN_REPLY just written is the last thing the client hears.
    let silent_since = tokio::time::Instant::now();
    // The peer reads everything and answers nothing.
    let drain = tokio::spawn(async move {
        let mut pings = 0;
        while let Some(frame) = peer.read().await {
            if matches!(frame, Frame::Ping(_)) {
                pings += 1;
            }
        }
        pings
    });
    let end = client.closed().await;
    let waited = silent_since.elapsed();
    assert_eq!(end, SessionEnd::PingTimeout(ALLOWED_SILENCE));
    assert!(!end.is_clean());
    assert!(waited >= ALLOWED_SILENCE, "ended after {waited:?}");
    assert!(
        waited <= ALLOWED_SILENCE + Duration::from_millis(50),
        "ended after {waited:?}"
    );
    // Open streams end as on a lost connection.
    assert!(matches!(
        rx.recv().await,
        Some(Err(Error::SessionClosed(SessionEnd::PingTimeout(_))))
    ));
    assert!(rx.recv().await.is_none());
    assert_eq!(
        client.end_reason(),
        Some(SessionEnd::PingTimeout(ALLOWED_SILENCE))
    );
    assert!(SessionEnd::PingTimeout(ALLOWED_SILENCE)
        .to_string()
        .contains("stopped answering"));
    // The writer stops and shuts its half down: the peer sees EOF.
    let pings = tokio::time::timeout(Duration::from_secs(1), drain)
        .await
        .expect("the peer sees EOF")
        .unwrap();
    assert!(pings >= 2, "the peer saw {pings} pings");
}

#[tokio::test(start_paused = true)]
async fn answered_pings_keep_the_session_up() {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let client = Connection::client(a, Bytes::new(), liveness());
    let mut peer = RawPeer::new(b);
    let (_tx, _rx) = open_against(&client, &mut peer).await.split();
    // The peer says nothing but the answers to our pings.
    let answers = tokio::spawn(async move {
        let mut answered = 0;
        while let Some(frame) = peer.read().await {
            if let Frame::Ping(ping) = frame {
                peer.write(Frame::Ping(ping)).await;
                answered += 1;
            }
        }
        answered
    });
    tokio::time::sleep(10 * ALLOWED_SILENCE).await;
    assert_eq!(client.end_reason(), None);
    client.close().await;
    let answered = answers.await.unwrap();
    assert!(answered >= 29, "only {answered} pings answered");
}

#[tokio::test(start_paused = true)]
async fn without_ping_timeout_silence_is_not_held_against_the_peer() {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let config = Config {
        ping_timeout: None,
        ..liveness()
    };
    let client = Connection::client(a, Bytes::new(), config);
    let mut peer = RawPeer::new(b);
    let (_tx, _rx) = open_against(&client, &mut peer).await.split();
    let drain = tokio::spawn(async move { while peer.read().await.is_some() {} });
    tokio::time::sleep(20 * ALLOWED_SILENCE).await;
    assert_eq!(client.end_reason(), None);
    client.close().await;
    drain.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn slow_local_consumer_is_not_peer_silence() {
    // The peer floods a stream and answers pings, but its answers queue behind DATA that the
    // session cannot read while the stream's consumer sleeps: that is not the peer's silence.
    let (a, b) = tokio::io::duplex(16 * 1024);
    let config = Config {
        stream_inbox_bytes: 64 * 1024,
        ..liveness()
    };
    let client = Connection::client(a, Bytes::new(), config);
    let mut peer = RawPeer::new(b);
    let (_tx, mut rx) = open_against(&client, &mut peer).await.split();
    let id = StreamId::new(1);
    let RawPeer {
        io,
        mut buf,
        mut dec,
        mut enc,
    } = peer;
    let (mut peer_read, mut peer_write) = tokio::io::split(io);
    // One writer for the peer: DATA and ping answers in the order they were queued.
    let (out_tx, mut out_rx) = tokio::sync::mpsc::channel::<Frame>(4);
    let writer = tokio::spawn(async move {
        while let Some(frame) = out_rx.recv().await {
            let mut out = BytesMut::new();
            enc.encode(&frame, &mut out).unwrap();
            if peer_write.write_all(&out).await.is_err() {
                return;
            }
        }
    });
    let answers = tokio::spawn({
        let out_tx = out_tx.clone();
        async move {
            let mut answered = 0;
            loop {
                while let Some(frame) = dec.decode(&mut buf).unwrap() {
                    if let Frame::Ping(ping) = frame {
                        let _ = out_tx.send(Frame::Ping(ping)).await;
                        answered += 1;
                    }
                }
                if peer_read.read_buf(&mut buf).await.unwrap_or(0) == 0 {
                    return answered;
                }
            }
        }
    });
    let chunk = Bytes::from(vec![3u8; 16 * 1024]);
    let frames = 64;
    let flood = tokio::spawn(async move {
        for i in 0..frames {
            let frame = Frame::Data(Data {
                stream_id: id,
                fin: i == frames - 1,
                payload: chunk.clone(),
            });
            out_tx.send(frame).await.unwrap();
        }
    });
    // Far longer than the allowed silence, with the session parked on the full inbox.
    tokio::time::sleep(6 * ALLOWED_SILENCE).await;
    assert_eq!(client.end_reason(), None);
    let mut received = 0;
    while let Some(chunk) = rx.recv().await {
        received += chunk.unwrap().len();
    }
    assert_eq!(received, frames * 16 * 1024);
    assert!(!rx.was_reset());
    flood.await.unwrap();
    // And the session lives on once the backlog is gone.
    tokio::time::sleep(2 * ALLOWED_SILENCE).await;
    assert_eq!(client.end_reason(), None);
    client.close().await;
    assert!(answers.await.unwrap() >= 6);
    writer.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn ping_timeout_releases_a_writer_blocked_on_a_peer_that_stopped_reading() {
    let (a, b) = tokio::io::duplex(4 * 1024);
    let client = Connection::client(a, Bytes::new(), liveness());
    let mut peer = RawPeer::new(b);
    let (mut tx, _rx) = open_against(&client, &mut peer).await.split();
    let silent_since = tokio::time::Instant::now();
    // The peer now neither reads nor writes; our writer blocks on the full pipe.
    let sender = tokio::spawn(async move {
        let chunk = Bytes::from(vec![5u8; 16 * 1024]);
        while tx.send(chunk.clone()).await.is_ok() {}
    });
    assert_eq!(
        client.closed().await,
        SessionEnd::PingTimeout(ALLOWED_SILENCE)
    );
    assert!(silent_since.elapsed() <= ALLOWED_SILENCE + Duration::from_millis(50));
    tokio::time::timeout(Duration::from_millis(10), client.close())
        .await
        .expect("close returns at once on an ended session");
    tokio::time::timeout(Duration::from_millis(10), sender)
        .await
        .expect("sends fail once the session ended")
        .unwrap();
    // Both socket tasks are gone, so the client's end of the pipe is dropped: writes to it
    // fail, and the peer reads what was buffered, then EOF.
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(other_end_dropped(&mut peer.io).await);
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_millis(10), peer.io.read_to_end(&mut rest))
        .await
        .expect("EOF after the buffered bytes")
        .unwrap();
    assert!(read > 0);
}

#[tokio::test(start_paused = true)]
async fn close_against_a_peer_that_stopped_reading_releases_the_socket() {
    // Without pings: close itself gives up on the peer after its grace period.
    let (a, b) = tokio::io::duplex(4 * 1024);
    let client = Connection::client(a, Bytes::new(), quiet());
    let mut peer = RawPeer::new(b);
    let (mut tx, _rx) = open_against(&client, &mut peer).await.split();
    tokio::spawn(async move {
        let chunk = Bytes::from(vec![5u8; 16 * 1024]);
        while tx.send(chunk.clone()).await.is_ok() {}
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let started = tokio::time::Instant::now();
    client.close().await;
    assert!(started.elapsed() <= Duration::from_secs(2));
    assert_eq!(client.end_reason(), Some(SessionEnd::Local));
    // The writer gives up its blocked write at once, the reader is aborted after the grace.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(other_end_dropped(&mut peer.io).await);
}

#[tokio::test]
async fn a_stream_the_connection_leaves_unfinished_is_cut_off_and_says_so_at_once() {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let client = Connection::client(a, Bytes::new(), quiet());
    let mut peer = RawPeer::new(b);
    let open = |name: &'static str| {
        let c = client.clone();
        tokio::spawn(async move { c.open_stream(headers(name)).await })
    };
    let stdout = open("stdout");
    let out_id = peer.accept().await;
    let (_tx, stdout) = stdout.await.unwrap().unwrap().split();
    let stderr = open("stderr");
    let err_id = peer.accept().await;
    let (_tx2, mut stderr) = stderr.await.unwrap().unwrap().split();
    peer.write(data(out_id, b"the rest", false)).await;
    peer.write(data(err_id, b"done", true)).await;
    assert_eq!(&stderr.recv().await.unwrap().unwrap()[..], b"done");
    assert!(stderr.recv().await.is_none());
    assert!(!stdout.is_cut() && !stderr.is_cut());
    let waiting = tokio::spawn(async move {
        stdout.cut().await;
        stdout
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(!waiting.is_finished(), "cut before the connection ended");
    // The connection dies (a reset, a truncation): what stdout holds is all it will get.
    drop(peer);
    let mut stdout = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the cut is told when the connection ends")
        .unwrap();
    assert!(stdout.is_cut());
    assert_eq!(&stdout.recv().await.unwrap().unwrap()[..], b"the rest");
    // A stream that finished first was not cut off, and is never told it was.
    assert!(!stderr.is_cut());
    let never = tokio::time::timeout(Duration::from_millis(20), stderr.cut());
    assert!(never.await.is_err());
}

/// Reads frames until the other end is gone; whether a GOAWAY came before the EOF.
async fn goaway_then_eof(peer: &mut RawPeer) -> bool {
    let mut goaway = false;
    while let Some(frame) = peer.read().await {
        goaway |= matches!(frame, Frame::GoAway(_));
    }
    goaway
}

#[tokio::test]
async fn the_last_handle_dropped_closes_the_session_and_releases_the_socket() {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let client = Connection::client(a, Bytes::new(), quiet());
    let mut peer = RawPeer::new(b);
    let stream = open_against(&client, &mut peer).await;
    let clone = client.clone();
    drop(client);
    drop(clone);
    // A stream still open keeps the session: it can still send.
    let (mut tx, rx) = stream.split();
    tx.send(Bytes::from_static(b"still here")).await.unwrap();
    assert!(matches!(peer.read().await, Some(Frame::Data(_))));
    drop(tx);
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(
        !other_end_dropped(&mut peer.io).await,
        "one half still held"
    );
    // The last half goes: the session is closed as Kubernetes closes it, and both socket
    // tasks end (the pipe's other end is dropped).
    drop(rx);
    let goaway = tokio::time::timeout(Duration::from_secs(2), goaway_then_eof(&mut peer))
        .await
        .expect("the session ends once nothing holds it");
    assert!(goaway, "GOAWAY before the end");
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(other_end_dropped(&mut peer.io).await);
}

#[tokio::test]
async fn a_dropped_connection_whose_reader_is_parked_on_a_full_inbox_is_released() {
    // The peer floods a stream nobody reads: the reader parks on the full inbox. Dropping
    // every handle must still end both tasks (no task, no socket left behind).
    let (a, b) = tokio::io::duplex(16 * 1024);
    let config = Config {
        stream_inbox_bytes: 16 * 1024,
        ..quiet()
    };
    let client = Connection::client(a, Bytes::new(), config);
    let mut peer = RawPeer::new(b);
    let stream = open_against(&client, &mut peer).await;
    let id = stream.id();
    let RawPeer { io, mut enc, .. } = peer;
    let (mut peer_read, mut peer_write) = tokio::io::split(io);
    let flood = tokio::spawn(async move {
        let chunk = Bytes::from(vec![1u8; 8 * 1024]);
        loop {
            let mut out = BytesMut::new();
            let frame = Frame::Data(Data {
                stream_id: id,
                fin: false,
                payload: chunk.clone(),
            });
            enc.encode(&frame, &mut out).unwrap();
            if peer_write.write_all(&out).await.is_err() {
                return;
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        !flood.is_finished(),
        "the flood is held back by the parked reader"
    );
    drop(stream);
    drop(client);
    // The flood's writes fail once the session's end of the pipe is gone.
    tokio::time::timeout(Duration::from_secs(2), flood)
        .await
        .expect("the socket is released")
        .unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(2), peer_read.read_to_end(&mut rest))
        .await
        .expect("EOF")
        .unwrap();
}

#[tokio::test]
async fn a_server_session_ends_when_its_connection_and_streams_drop_even_with_incoming_held() {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let (server, mut incoming) = Connection::server(a, Bytes::new(), quiet());
    let client = Connection::client(b, Bytes::new(), quiet());
    let opened = tokio::spawn({
        let c = client.clone();
        async move { c.open_stream(headers("stdout")).await }
    });
    let accepted = incoming.accept().await.unwrap().accept().await.unwrap();
    let _opened = opened.await.unwrap().unwrap();
    drop(server);
    // The accepted stream holds the session: the client's session is still up.
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(client.end_reason(), None);
    drop(accepted);
    // Now only the accept queue is left, which does not hold the session.
    let end = tokio::time::timeout(Duration::from_secs(2), client.closed())
        .await
        .expect("the client sees the session end");
    assert!(end.is_clean(), "{end:?}");
    let next = tokio::time::timeout(Duration::from_secs(2), incoming.accept())
        .await
        .expect("the accept queue ends with the session");
    assert!(next.is_none());
}

#[tokio::test]
async fn a_stream_the_peer_opens_after_every_handle_dropped_is_refused() {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let (server, incoming) = Connection::server(a, Bytes::new(), quiet());
    let mut peer = RawPeer::new(b);
    drop(server);
    peer.write(Frame::SynStream(crate::spdy::frame::SynStream::new(
        StreamId::new(1),
        headers("stdin"),
    )))
    .await;
    // Whatever it says before the end, the peer never gets a SYN_REPLY, and the socket goes.
    let mut frames = Vec::new();
    while let Some(frame) = tokio::time::timeout(Duration::from_secs(2), peer.read())
        .await
        .expect("the session ends")
    {
        frames.push(frame);
    }
    assert!(
        !frames.iter().any(|f| matches!(f, Frame::SynReply(_))),
        "{frames:?}"
    );
    drop(incoming);
}

/// A connection over real TCP whose reader watches its socket: the proxy's end, with room in
/// the kernel for all a peer sends, and the peer's end.
pub(super) async fn watched_tcp(config: Config) -> (Connection, RawPeer<tokio::net::TcpStream>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4 << 20).unwrap();
    let (ours, theirs) = tokio::join!(
        socket.connect(listener.local_addr().unwrap()),
        listener.accept()
    );
    let ours = ours.unwrap();
    let hangup = crate::peer_hangup::PeerHangup::of(&ours);
    let client = Connection::client_watching(ours, Bytes::new(), config, hangup);
    (client, RawPeer::new(theirs.unwrap().0))
}

/// How a peer ends the connection in [`a_watched_connection_tells_its_streams_of_a_reset_behind_unread_data`].
#[derive(Debug, Clone, Copy, PartialEq)]
enum PeerEnd {
    /// RST, the stream unfinished.
    Reset,
    /// FIN, the stream unfinished (a truncation).
    Truncated,
    /// FIN after the stream's own end (a session that ended well).
    Finished,
}

/// A peer that sends sixteen times what the stream's inbox holds and then hangs up: the
/// reader, parked on the full inbox, sees the hang-up on the socket while most of the data is
/// still unread. A reset tells the stream at once that it is cut; a FIN does not (a session
/// that ended well ends so too), and a stream that then ends unfinished is cut once the reader
/// reaches the connection's end. Every byte sent before the hang-up is still delivered.
#[tokio::test]
async fn a_watched_connection_tells_its_streams_of_a_reset_behind_unread_data() {
    const FRAME: usize = 32 * 1024;
    for how in [PeerEnd::Reset, PeerEnd::Truncated, PeerEnd::Finished] {
        let config = Config {
            stream_inbox_bytes: 64 * 1024,
            ..quiet()
        };
        let (client, mut peer) = watched_tcp(config).await;
        let opening = tokio::spawn(async move { client.open_stream(headers("stdout")).await });
        let id = peer.accept().await;
        let (_tx, mut rx) = opening.await.unwrap().unwrap().split();
        for i in 0..32 {
            peer.write(Frame::Data(Data {
                stream_id: id,
                fin: how == PeerEnd::Finished && i == 31,
                payload: Bytes::from(vec![b'o'; FRAME]),
            }))
            .await;
        }
        if how == PeerEnd::Reset {
            // A zero linger makes the close a reset.
            peer.io.set_zero_linger().unwrap();
            drop(peer);
        } else {
            peer.io.shutdown().await.unwrap();
        }
        let told = tokio::time::timeout(Duration::from_millis(500), rx.cut()).await;
        assert_eq!(told.is_ok(), how == PeerEnd::Reset, "{how:?}");
        let mut got = 0;
        while let Some(Ok(chunk)) = rx.recv().await {
            got += chunk.len();
        }
        assert_eq!(got, 32 * FRAME, "{how:?}");
        assert!(rx.recv().await.is_none());
        // Read to the end: cut if it was left unfinished, never if it finished.
        assert_eq!(rx.is_cut(), how != PeerEnd::Finished, "{how:?}");
        let told = tokio::time::timeout(Duration::from_millis(50), rx.cut()).await;
        assert_eq!(told.is_ok(), how != PeerEnd::Finished, "{how:?}");
    }
}
