//! The benchmark workloads, each over one of three paths to the same simulated cluster: exec
//! stdout and stdin transfers, 1-byte echoes, port-forward down and up, session setup. Shared by
//! the interleaved timing bench (`streaming`) and the instruction-count profile (`profile`).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use kube_ws_proxy::proxy::upstream::endpoint::{Upstream, UpstreamTls};
use kube_ws_proxy::proxy::upstream::spdy_dial::dial_spdy;
use kube_ws_proxy::spdy::proto::{Config, Connection};
use kube_ws_proxy::translate::exec_options::ExecOptions;
use kube_ws_proxy::translate::protocol::UpstreamVersion;
use kube_ws_proxy::translate::remote_command::{open_streams, ExecStreams};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

use super::ws_client::{self, Ws};

/// How a workload reaches the simulated cluster.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Path {
    /// A v5 WebSocket (or tunnel) client through kube-ws-proxy.
    Proxy,
    /// An SPDY client straight to the cluster.
    Direct,
    /// An SPDY client through a plain TCP relay.
    Relay,
}

/// Every path, in the order a round runs them.
pub const PATHS: [Path; 3] = [Path::Proxy, Path::Direct, Path::Relay];

/// Where the paths and the pod services listen.
pub struct Setup {
    pub proxy: SocketAddr,
    pub sim: SocketAddr,
    pub relay: SocketAddr,
    /// Pod service that sends the transfer size per connection (port-forward down).
    pub pod_source: u16,
    /// Pod service that reads to EOF (port-forward up).
    pub pod_sink: u16,
}

impl Setup {
    /// Where an SPDY client connects for `path` (direct or through the TCP relay).
    fn spdy_addr(&self, path: Path) -> SocketAddr {
        if path == Path::Direct {
            self.sim
        } else {
            self.relay
        }
    }
}

/// Waits for the command's status, then closes the session.
async fn finish_spdy(mut st: ExecStreams) {
    while let Some(Ok(_)) = st.error.recv().await {}
    st.conn.close().await;
}

fn exec_query(command: &[&str], stdin: bool) -> String {
    let mut q: Vec<String> = command
        .iter()
        .map(|c| {
            format!(
                "command={}",
                url::form_urlencoded::byte_serialize(c.as_bytes()).collect::<String>()
            )
        })
        .collect();
    q.push("stdout=true".into());
    if stdin {
        q.push("stdin=true".into());
    }
    q.join("&")
}

fn exec_path(query: &str) -> String {
    format!("/api/v1/namespaces/default/pods/bench/exec?{query}")
}

async fn ws_connect(proxy: SocketAddr, query: &str) -> Ws {
    let mut req = format!("ws://{proxy}{}", exec_path(query))
        .into_client_request()
        .unwrap();
    req.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        "v5.channel.k8s.io".parse().unwrap(),
    );
    let tcp = TcpStream::connect(proxy).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    tokio_tungstenite::client_async(req, tcp).await.unwrap().0
}

async fn spdy_connect(addr: SocketAddr, query: &str) -> ExecStreams {
    let upstream = Upstream::from_url(&format!("http://{addr}"), UpstreamTls::default()).unwrap();
    let offered = UpstreamVersion::offer_list()
        .iter()
        .map(|v| v.name().to_owned())
        .collect();
    let up = dial_spdy(
        &upstream,
        &exec_path(query),
        http::HeaderMap::new(),
        offered,
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    let version = UpstreamVersion::from_negotiated(up.protocol.as_deref());
    let conn = Connection::client(up.io, up.leftover, Config::default());
    open_streams(conn, version, &ExecOptions::from_query(query))
        .await
        .unwrap()
}

/// Seconds to receive `n` bytes of stdout.
pub async fn stdout_run(s: &Setup, path: Path, n: u64) -> f64 {
    let command = ["head", "-c", &n.to_string(), "/dev/zero"];
    let query = exec_query(&command, false);
    let started = Instant::now();
    let mut got = 0u64;
    match path {
        Path::Proxy => return proxy_stdout_run(s.proxy, &command, n).await,
        Path::Direct | Path::Relay => {
            let addr = s.spdy_addr(path);
            let mut st = spdy_connect(addr, &query).await;
            let mut out = st.stdout.take().unwrap();
            while let Some(Ok(chunk)) = out.recv().await {
                got += chunk.len() as u64;
            }
            finish_spdy(st).await;
        }
    }
    assert_eq!(got, n, "{path:?} stdout");
    started.elapsed().as_secs_f64()
}

/// Seconds for the `n` bytes `command` prints to arrive through the proxy at `proxy`.
pub async fn proxy_stdout_run(proxy: SocketAddr, command: &[&str], n: u64) -> f64 {
    let query = exec_query(command, false);
    let started = Instant::now();
    let mut got = 0u64;
    let mut ws = ws_connect(proxy, &query).await;
    while let Some(Ok(msg)) = ws.next().await {
        match msg {
            Message::Binary(d) if d.first() == Some(&1) => got += d.len() as u64 - 1,
            Message::Close(_) => break,
            _ => {}
        }
    }
    assert_eq!(got, n, "proxy stdout of {command:?}");
    started.elapsed().as_secs_f64()
}

/// Seconds to send `n` bytes of stdin and see the command finish.
pub async fn stdin_run(s: &Setup, path: Path, n: u64) -> f64 {
    let query = exec_query(&["sh", "-c", "cat >/dev/null"], true);
    let chunk = Bytes::from(vec![b'x'; 32 * 1024]);
    let started = Instant::now();
    match path {
        Path::Proxy => {
            let mut ws = ws_connect(s.proxy, &query).await;
            let mut msg = vec![0u8; chunk.len() + 1];
            let mut sent = 0u64;
            while sent < n {
                let len = (n - sent).min(chunk.len() as u64) as usize;
                ws.feed(Message::Binary(Bytes::copy_from_slice(&msg[..len + 1])))
                    .await
                    .unwrap();
                sent += len as u64;
            }
            msg.truncate(2);
            msg.copy_from_slice(&[255, 0]);
            ws.send(Message::Binary(Bytes::from(msg))).await.unwrap();
            while let Some(Ok(m)) = ws.next().await {
                if let Message::Close(_) = m {
                    break;
                }
            }
        }
        Path::Direct | Path::Relay => {
            let addr = s.spdy_addr(path);
            let mut st = spdy_connect(addr, &query).await;
            let mut stdin = st.stdin.take().unwrap();
            let mut sent = 0u64;
            while sent < n {
                let len = (n - sent).min(chunk.len() as u64) as usize;
                stdin.send(chunk.slice(..len)).await.unwrap();
                sent += len as u64;
            }
            stdin.finish().await.unwrap();
            if let Some(mut out) = st.stdout.take() {
                while let Some(Ok(_)) = out.recv().await {}
            }
            finish_spdy(st).await;
        }
    }
    started.elapsed().as_secs_f64()
}

/// Round-trip times (µs) of `count` 1-byte echoes through `cat`.
pub async fn echo_run(s: &Setup, path: Path, count: usize) -> Vec<f64> {
    let query = exec_query(&["cat"], true);
    let mut rtts = Vec::with_capacity(count);
    match path {
        Path::Proxy => return proxy_echo_run(s.proxy, count, Duration::ZERO, false).await,
        Path::Direct | Path::Relay => {
            let addr = s.spdy_addr(path);
            let mut st = spdy_connect(addr, &query).await;
            let mut stdin = st.stdin.take().unwrap();
            let mut out = st.stdout.take().unwrap();
            for _ in 0..count {
                let t = Instant::now();
                stdin.send(Bytes::from_static(b"x")).await.unwrap();
                out.recv().await.unwrap().unwrap();
                rtts.push(t.elapsed().as_secs_f64() * 1e6);
            }
            stdin.finish().await.unwrap();
            while let Some(Ok(_)) = out.recv().await {}
            finish_spdy(st).await;
        }
    }
    rtts
}

/// Round-trip times (µs) of `count` 1-byte echoes through `cat` over a v5 WebSocket through
/// the proxy at `proxy`, `pause` apart (a person typing rather than a flood). With `tty`, on a
/// terminal as `kubectl exec -it` types: its size first (JSON and a newline, as kubectl sends
/// it), then a key and Enter each time, timed until the terminal's echo of it comes back (what
/// a person sees), and `cat`'s line read before the next.
pub async fn proxy_echo_run(
    proxy: SocketAddr,
    count: usize,
    pause: Duration,
    tty: bool,
) -> Vec<f64> {
    let mut query = exec_query(&["cat"], true);
    let (typed, back): (&'static [u8], usize) = match tty {
        // The echo "x\r\n", then cat's "x\r\n".
        true => (b"\x00x\n", 6),
        false => (b"\x00x", 1),
    };
    if tty {
        query.push_str("&tty=true");
    }
    let mut rtts = Vec::with_capacity(count);
    let mut ws = ws_connect(proxy, &query).await;
    if tty {
        let size = Bytes::from_static(b"\x04{\"Width\":80,\"Height\":24}\n");
        ws.send(Message::Binary(size)).await.unwrap();
    }
    for _ in 0..count {
        let t = Instant::now();
        ws.send(Message::Binary(Bytes::from_static(typed)))
            .await
            .unwrap();
        let mut got = 0;
        while got < back {
            match ws.next().await {
                Some(Ok(Message::Binary(d))) if d.first() == Some(&1) && d.len() > 1 => {
                    if got == 0 {
                        rtts.push(t.elapsed().as_secs_f64() * 1e6);
                    }
                    got += d.len() - 1;
                }
                Some(Ok(_)) => continue,
                other => panic!("echo ended: {other:?}"),
            }
        }
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
    }
    ws.send(Message::Binary(Bytes::from_static(b"\xff\x00")))
        .await
        .unwrap();
    while let Some(Ok(m)) = ws.next().await {
        if let Message::Close(_) = m {
            break;
        }
    }
    rtts
}

/// An SPDY port-forward session over `path`.
async fn pf_session(s: &Setup, path: Path) -> Connection {
    let pf = "/api/v1/namespaces/default/pods/bench/portforward";
    match path {
        Path::Proxy => {
            let mut req = format!("ws://{}{pf}", s.proxy)
                .into_client_request()
                .unwrap();
            req.headers_mut().insert(
                "Sec-WebSocket-Protocol",
                "SPDY/3.1+portforward.k8s.io".parse().unwrap(),
            );
            let tcp = TcpStream::connect(s.proxy).await.unwrap();
            tcp.set_nodelay(true).unwrap();
            let ws = tokio_tungstenite::client_async(req, tcp).await.unwrap().0;
            Connection::client(ws_client::as_io(ws), Bytes::new(), Config::default())
        }
        Path::Direct | Path::Relay => {
            let addr = s.spdy_addr(path);
            let upstream =
                Upstream::from_url(&format!("http://{addr}"), UpstreamTls::default()).unwrap();
            let up = dial_spdy(
                &upstream,
                pf,
                http::HeaderMap::new(),
                vec!["portforward.k8s.io".into()],
                Duration::from_secs(30),
            )
            .await
            .unwrap();
            Connection::client(up.io, up.leftover, Config::default())
        }
    }
}

/// Seconds to move `n` bytes through a forwarded connection: `down` from the pod service
/// (which sends `n` bytes and closes) or up to it (which reads to EOF and closes).
pub async fn pf_run(s: &Setup, path: Path, n: u64, down: bool) -> f64 {
    use kube_ws_proxy::spdy::frame::HeaderBlock;
    let port = if down { s.pod_source } else { s.pod_sink };
    let started = Instant::now();
    let conn = pf_session(s, path).await;
    let headers = |kind: &str| {
        let mut h = HeaderBlock::new();
        h.push("streamtype", kind);
        h.push("port", port.to_string());
        h.push("requestid", "0");
        h
    };
    let _error = conn.open_stream(headers("error")).await.unwrap();
    let (mut tx, mut rx) = conn.open_stream(headers("data")).await.unwrap().split();
    let mut got = 0u64;
    if down {
        tx.finish().await.unwrap();
        while let Some(Ok(chunk)) = rx.recv().await {
            got += chunk.len() as u64;
        }
        assert_eq!(got, n, "{path:?} port-forward down");
    } else {
        let chunk = Bytes::from(vec![b'x'; 32 * 1024]);
        let mut sent = 0u64;
        while sent < n {
            let len = (n - sent).min(chunk.len() as u64) as usize;
            tx.send(chunk.slice(..len)).await.unwrap();
            sent += len as u64;
        }
        tx.finish().await.unwrap();
        while let Some(Ok(_)) = rx.recv().await {}
    }
    let elapsed = started.elapsed().as_secs_f64();
    conn.close().await;
    elapsed
}

/// Milliseconds for each of `count` sequential sessions running `true` to set up and finish.
pub async fn setup_run(s: &Setup, path: Path, count: usize) -> Vec<f64> {
    let query = exec_query(&["true"], false);
    let mut times = Vec::with_capacity(count);
    for _ in 0..count {
        let t = Instant::now();
        match path {
            Path::Proxy => {
                let mut ws = ws_connect(s.proxy, &query).await;
                while let Some(Ok(m)) = ws.next().await {
                    if let Message::Close(_) = m {
                        break;
                    }
                }
            }
            Path::Direct | Path::Relay => {
                let addr = s.spdy_addr(path);
                let mut st = spdy_connect(addr, &query).await;
                if let Some(mut out) = st.stdout.take() {
                    while let Some(Ok(_)) = out.recv().await {}
                }
                finish_spdy(st).await;
            }
        }
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times
}

/// Pod services for port-forward: one sends `n` zero bytes per connection, one swallows.
pub async fn start_pod_services(n: u64) -> (u16, u16) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let source = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sink = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ports = (
        source.local_addr().unwrap().port(),
        sink.local_addr().unwrap().port(),
    );
    tokio::spawn(async move {
        while let Ok((mut c, _)) = source.accept().await {
            tokio::spawn(async move {
                let buf = vec![0u8; 64 * 1024];
                let mut left = n;
                while left > 0 {
                    let len = left.min(buf.len() as u64) as usize;
                    if c.write_all(&buf[..len]).await.is_err() {
                        return;
                    }
                    left -= len as u64;
                }
                let _ = c.shutdown().await;
            });
        }
    });
    tokio::spawn(async move {
        while let Ok((mut c, _)) = sink.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(k) = c.read(&mut buf).await {
                    if k == 0 {
                        break;
                    }
                }
                let _ = c.shutdown().await;
            });
        }
    });
    ports
}

/// A plain TCP relay to `target` (no protocol work): the floor of any extra hop.
pub async fn start_relay(target: SocketAddr) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut c, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut u = TcpStream::connect(target).await.unwrap();
                let _ = c.set_nodelay(true);
                let _ = u.set_nodelay(true);
                let _ = tokio::io::copy_bidirectional(&mut c, &mut u).await;
            });
        }
    });
    addr
}

/// Microseconds for each of `count` sequential plain GETs of a pod on one kept-alive HTTP/1.1
/// connection: the reverse-proxy path (request layers, auth, header rewriting, the pooled
/// upstream client) rather than a stream.
pub async fn get_run(s: &Setup, path: Path, count: usize) -> Vec<f64> {
    use http_body_util::{BodyExt, Empty};
    let addr = match path {
        Path::Proxy => s.proxy,
        Path::Direct => s.sim,
        Path::Relay => s.relay,
    };
    let tcp = TcpStream::connect(addr).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    let mut times = Vec::with_capacity(count);
    for _ in 0..count {
        let req = http::Request::get("/api/v1/namespaces/default/pods/web")
            .header(http::header::HOST, addr.to_string())
            .body(Empty::<Bytes>::new())
            .unwrap();
        let t = Instant::now();
        // The connection takes the next request only once it has finished the last answer's
        // body; without this wait a fast loop races it ("connection was not ready").
        sender.ready().await.unwrap();
        let resp = sender.send_request(req).await.unwrap();
        assert!(resp.status().is_success(), "GET: {}", resp.status());
        resp.into_body().collect().await.unwrap();
        times.push(t.elapsed().as_secs_f64() * 1e6);
    }
    times
}
