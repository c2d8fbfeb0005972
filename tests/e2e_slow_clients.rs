//! Clients that stop reading plain (forwarded) responses: `--response-write-timeout` cuts a
//! response its client takes nothing of, releasing the upstream's connection, over HTTP/1.1
//! (the connection closes) and HTTP/2 (the stream ends with an error, the connection goes on);
//! a watch its client reads slowly, or one that is quiet, goes on to its end.
//!
//! The upstream is a plain HTTP/1.1 server of the test's own, so that it can serve a response
//! larger than every buffer on the way and tell when the proxy let go of its connection.

use crate::common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::proxy_process::ProxyProcess;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// The write timeout the tests run the proxy with.
const TIMEOUT: Duration = Duration::from_secs(2);
/// The big response: far more than the socket buffers and the proxy hold on the way.
const BIG: usize = 64 << 20;
/// The watch a slow client reads: well more than the buffers on the way, so that the client's
/// pace is what moves it.
const WATCH: usize = 4 << 20;

/// An upstream answering one request per connection: `/big` (a `BIG`-byte body written as fast
/// as the proxy takes it), `/watch` (`WATCH` bytes chunked, as fast as taken), `/quiet` (a
/// small chunk a second for six seconds), anything else a short body. Every connection that
/// ended before its answer was all written is reported (its path), with when.
async fn upstream() -> (SocketAddr, mpsc::UnboundedReceiver<(String, Instant)>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (released, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            let released = released.clone();
            tokio::spawn(async move {
                if let Some(path) = answer(conn).await {
                    let _ = released.send((path, Instant::now()));
                }
            });
        }
    });
    (addr, rx)
}

/// Serves one request on `conn`; the path when the connection ended before the answer did.
async fn answer(mut conn: TcpStream) -> Option<String> {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        if conn.read(&mut byte).await.ok()? == 0 {
            return None;
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head);
    let path = head.split(' ').nth(1).unwrap_or("/").to_owned();
    let chunk = vec![b'x'; 64 * 1024];
    let written: std::io::Result<()> = async {
        match path.as_str() {
            "/big" => {
                let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {BIG}\r\n\r\n");
                conn.write_all(head.as_bytes()).await?;
                for _ in 0..BIG / chunk.len() {
                    conn.write_all(&chunk).await?;
                }
            }
            "/watch" | "/quiet" => {
                let head = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
                conn.write_all(head.as_bytes()).await?;
                let (size, count, pause) = if path == "/watch" {
                    (chunk.len(), WATCH / chunk.len(), Duration::ZERO)
                } else {
                    (100, 6, Duration::from_secs(1))
                };
                for _ in 0..count {
                    tokio::time::sleep(pause).await;
                    conn.write_all(format!("{size:x}\r\n").as_bytes()).await?;
                    conn.write_all(&chunk[..size]).await?;
                    conn.write_all(b"\r\n").await?;
                }
                conn.write_all(b"0\r\n\r\n").await?;
            }
            _ => {
                conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    .await?;
            }
        }
        conn.flush().await
    }
    .await;
    written.err().map(|_| path)
}

fn proxy(upstream: SocketAddr) -> ProxyProcess {
    ProxyProcess::start(
        &format!("http://{upstream}"),
        &["--response-write-timeout", "2s"],
    )
}

fn response_write_timeouts(proxy: &ProxyProcess) -> f64 {
    let metrics = proxy.metrics();
    metrics
        .lines()
        .find(|l| {
            l.starts_with("kube_ws_proxy_client_connections_closed_total")
                && l.contains("reason=\"response_write_timeout\"")
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

/// Over HTTP/1.1, a client that asks for a big response and reads none of it: once the
/// response has waited the timeout for it, the upstream's connection is released and the
/// client's closed. Without the timeout both stay for as long as the client likes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_reads_nothing_of_a_big_response_is_cut_after_the_timeout() {
    let (upstream, mut released) = upstream().await;
    let proxy = proxy(upstream);
    let mut client = TcpStream::connect(proxy.addr).await.unwrap();
    client
        .write_all(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let asked = Instant::now();
    let (path, at) = tokio::time::timeout(Duration::from_secs(20), released.recv())
        .await
        .expect("the upstream's connection was never released")
        .unwrap();
    assert_eq!(path, "/big");
    let after = at - asked;
    assert!(
        after >= TIMEOUT && after < 4 * TIMEOUT,
        "released {after:?} after the request"
    );
    // The client's connection was closed: what it now reads ends (short of the whole body).
    let mut got = 0usize;
    let mut buf = vec![0u8; 1 << 20];
    let read_all = async {
        loop {
            match client.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got += n,
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(20), read_all)
        .await
        .expect("the client's connection stayed open");
    assert!(got < BIG, "the client got the whole body ({got} bytes)");
    assert_eq!(response_write_timeouts(&proxy), 1.0);
}

/// A watch its client reads slowly (and one that is quiet) is never cut: the client takes a
/// little every quarter second, for several times the timeout, and gets every byte and the
/// end; the quiet one sends a line a second for six seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_but_moving_watch_and_a_quiet_one_are_not_cut() {
    let (upstream, mut released) = upstream().await;
    let proxy = proxy(upstream);
    let slow = async {
        let mut client = TcpStream::connect(proxy.addr).await.unwrap();
        client
            .write_all(b"GET /watch HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let started = Instant::now();
        let mut body = Vec::new();
        let mut buf = vec![0u8; 128 * 1024];
        while !body.ends_with(b"0\r\n\r\n") {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let n = client.read(&mut buf).await.unwrap();
            assert!(n > 0, "cut after {} bytes", body.len());
            body.extend_from_slice(&buf[..n]);
        }
        (body.len(), started.elapsed())
    };
    let quiet = async {
        let mut client = TcpStream::connect(proxy.addr).await.unwrap();
        client
            .write_all(b"GET /quiet HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut body = Vec::new();
        let mut buf = vec![0u8; 4096];
        while !body.ends_with(b"0\r\n\r\n") {
            let n = client.read(&mut buf).await.unwrap();
            assert!(n > 0, "cut after {} bytes", body.len());
            body.extend_from_slice(&buf[..n]);
        }
    };
    let ((got, took), ()) = tokio::time::timeout(Duration::from_secs(120), async {
        tokio::join!(slow, quiet)
    })
    .await
    .expect("the watches never ended");
    assert!(got > WATCH, "{got} bytes");
    assert!(
        took > 2 * TIMEOUT,
        "the slow client read for {took:?} only: it did not test the clock"
    );
    assert!(released.try_recv().is_err(), "an upstream was cut");
    assert_eq!(response_write_timeouts(&proxy), 0.0);
}

/// Over HTTP/2, a stream whose client takes nothing of its response is cut after the timeout
/// (its upstream released), while the connection goes on serving other requests; when the
/// client does read the stream at last, it ends with an error, never as if whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http2_a_stalled_stream_is_cut_and_the_connection_goes_on() {
    let (upstream, mut released) = upstream().await;
    let proxy = proxy(upstream);
    let tcp = TcpStream::connect(proxy.addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    let get = |path: &str| {
        http::Request::get(format!("http://{}{path}", proxy.addr))
            .body(Empty::<Bytes>::new())
            .unwrap()
    };
    let asked = Instant::now();
    let big = sender.send_request(get("/big")).await.unwrap();
    assert_eq!(big.status(), 200);
    let (path, at) = tokio::time::timeout(Duration::from_secs(20), released.recv())
        .await
        .expect("the upstream's connection was never released")
        .unwrap();
    assert_eq!(path, "/big");
    assert!(at - asked >= TIMEOUT, "released after {:?}", at - asked);
    // The connection still serves.
    sender.ready().await.unwrap();
    let small = sender.send_request(get("/small")).await.unwrap();
    let body = small.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"ok");
    // The stalled stream ends with an error once read.
    let read = tokio::time::timeout(Duration::from_secs(20), big.into_body().collect())
        .await
        .expect("the stalled stream never ended");
    assert!(read.is_err(), "the cut stream ended as if whole");
    assert_eq!(response_write_timeouts(&proxy), 1.0);
}
