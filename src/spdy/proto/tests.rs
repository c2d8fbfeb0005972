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

fn quiet() -> Config {
    Config {
        ping_interval: None,
        ..Config::default()
    }
}

fn headers(kind: &str) -> HeaderBlock {
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
struct RawPeer {
    io: DuplexStream,
    buf: BytesMut,
    dec: FrameDecoder,
    enc: FrameEncoder,
}

impl RawPeer {
    fn new(io: DuplexStream) -> Self {
        RawPeer {
            io,
            buf: BytesMut::new(),
            dec: FrameDecoder::new(),
            enc: FrameEncoder::new(),
        }
    }

    async fn read(&mut self) -> Option<Frame> {
        loop {
            if let Some(f) = self.dec.decode(&mut self.buf).unwrap() {
                return Some(f);
            }
            if self.io.read_buf(&mut self.buf).await.ok()? == 0 {
                return None;
            }
        }
    }

    async fn write(&mut self, frame: Frame) {
        let mut out = BytesMut::new();
        self.enc.encode(&frame, &mut out).unwrap();
        self.io.write_all(&out).await.unwrap();
    }

    /// Reads frames until a SYN_STREAM and replies to it.
    async fn accept(&mut self) -> StreamId {
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
