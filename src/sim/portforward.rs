//! Port-forward as a kubelet serves it: SPDY `portforward.k8s.io` (PROTOCOL.md §3.6) and the
//! legacy WebSocket protocol with `ports=` (§2.2). Every forwarded connection dials
//! `127.0.0.1:<port>` on this machine.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::exec::{CHANNEL_DEPTH, CHUNK};
use super::kill::KillSwitch;
use super::query::Query;
use super::response::{text_response, Body};
use super::spdy::{self as spdy_server, PORT_FORWARD_VERSIONS, STREAM_CREATION_TIMEOUT};
use super::websocket::{self, Framing, Out, Protocol};
use super::{Inner, SessionKind, SimEvent, Transport};
use crate::spdy::kube_headers::{PortForwardStream, StreamHeaders};
use crate::spdy::proto::{IncomingStream, SendStream, Stream};

/// How long dialing the local port may take.
const DIAL_TIMEOUT: Duration = Duration::from_secs(5);

const WS_PROTOCOLS: [Protocol; 3] = [
    Protocol {
        name: "",
        framing: Framing::Binary,
        v4: true,
        close_signal: false,
    },
    Protocol {
        name: "v4.channel.k8s.io",
        framing: Framing::Binary,
        v4: true,
        close_signal: false,
    },
    Protocol {
        name: "v4.base64.channel.k8s.io",
        framing: Framing::Base64,
        v4: true,
        close_signal: false,
    },
];

/// Shared facts of one port-forward session.
#[derive(Clone)]
struct PfContext {
    inner: Arc<Inner>,
    session: u64,
    pod: String,
    dying: bool,
    kill: KillSwitch,
    cancel: CancellationToken,
}

impl PfContext {
    /// Drops the connection of a `dying-*` pod (after the data had a moment to leave).
    async fn die(&self) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        self.kill.kill();
        self.cancel.cancel();
    }

    fn dial_error(&self, port: u16, e: &std::io::Error) -> String {
        let cause = match e.kind() {
            std::io::ErrorKind::ConnectionRefused => {
                format!("dial tcp4 127.0.0.1:{port}: connect: connection refused")
            }
            std::io::ErrorKind::TimedOut => format!("dial tcp4 127.0.0.1:{port}: i/o timeout"),
            _ => format!("dial tcp4 127.0.0.1:{port}: {e}"),
        };
        format!(
            "error forwarding port {port} to pod {}, uid : {cause}",
            self.pod
        )
    }

    async fn dial(&self, port: u16) -> Result<TcpStream, String> {
        let res = match tokio::time::timeout(DIAL_TIMEOUT, TcpStream::connect(("127.0.0.1", port)))
            .await
        {
            Ok(r) => r,
            Err(_) => Err(std::io::ErrorKind::TimedOut.into()),
        };
        self.inner.event(SimEvent::PortForwardDialed {
            session: self.session,
            port,
            ok: res.is_ok(),
        });
        res.map_err(|e| self.dial_error(port, &e))
    }
}

// ---------------------------------------------------------------------------------------------
// SPDY

/// Handles a SPDY port-forward upgrade request.
pub(crate) fn spdy(
    inner: Arc<Inner>,
    kill: KillSwitch,
    mut req: Request<Incoming>,
    ns: &str,
    pod: &str,
) -> Response<Body> {
    let version = match spdy_server::negotiate(req.headers(), &PORT_FORWARD_VERSIONS) {
        Ok(v) => v,
        Err(resp) => return resp,
    };
    let on_upgrade = hyper::upgrade::on(&mut req);
    let session = inner.next_session();
    let (ns, pod) = (ns.to_string(), pod.to_string());
    let protocol = version.clone();
    tokio::spawn(async move {
        let upgraded = match on_upgrade.await {
            Ok(u) => u,
            Err(e) => {
                tracing::debug!(error = %e, "SPDY upgrade failed");
                return;
            }
        };
        inner.event(SimEvent::SessionStarted {
            session,
            kind: SessionKind::PortForward,
            transport: Transport::Spdy,
            protocol,
            namespace: ns,
            pod: pod.clone(),
        });
        let ctx = PfContext {
            cancel: inner.shutdown.child_token(),
            inner: inner.clone(),
            session,
            dying: pod.starts_with("dying-"),
            pod,
            kill,
        };
        let reason = spdy_session(&ctx, TokioIo::new(upgraded)).await;
        ctx.cancel.cancel();
        inner.event(SimEvent::SessionEnded {
            session,
            reason: reason.to_string(),
        });
    });
    spdy_server::switching_protocols(&version)
}

/// Handles a tunnel request (`SPDY/3.1+portforward.k8s.io` over WebSocket) on a cluster that
/// serves it: the same SPDY server as [`spdy`], over the WebSocket's bytes.
pub(crate) fn tunnel(
    inner: Arc<Inner>,
    kill: KillSwitch,
    req: Request<Incoming>,
    ns: &str,
    pod: &str,
) -> Response<Body> {
    serve_websocket(
        inner,
        kill,
        req,
        std::slice::from_ref(&super::tunnel::TUNNEL),
        (ns, pod),
        |ctx, ws, _| async move { spdy_session(&ctx, super::tunnel::bridge(ws)).await },
    )
}

/// The WebSocket side both port-forward flavours share: the handshake, then in the
/// background the upgrade, the session's start and end events around `run`.
fn serve_websocket<F, Fut>(
    inner: Arc<Inner>,
    kill: KillSwitch,
    mut req: Request<Incoming>,
    supported: &[websocket::Protocol],
    (ns, pod): (&str, &str),
    run: F,
) -> Response<Body>
where
    F: FnOnce(PfContext, websocket::Ws, websocket::Protocol) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = &'static str> + Send,
{
    let (resp, protocol) = match websocket::handshake(&req, supported) {
        Ok(ok) => ok,
        Err(refusal) => return refusal,
    };
    let on_upgrade = hyper::upgrade::on(&mut req);
    let session = inner.next_session();
    let (ns, pod) = (ns.to_string(), pod.to_string());
    tokio::spawn(async move {
        let upgraded = match on_upgrade.await {
            Ok(u) => u,
            Err(e) => {
                tracing::debug!(error = %e, "WebSocket upgrade failed");
                return;
            }
        };
        inner.event(SimEvent::SessionStarted {
            session,
            kind: SessionKind::PortForward,
            transport: Transport::WebSocket,
            protocol: protocol.name.to_string(),
            namespace: ns,
            pod: pod.clone(),
        });
        let ctx = PfContext {
            cancel: inner.shutdown.child_token(),
            inner: inner.clone(),
            session,
            dying: pod.starts_with("dying-"),
            pod,
            kill,
        };
        let cancel = ctx.cancel.clone();
        let reason = run(ctx, websocket::accept(upgraded).await, protocol).await;
        cancel.cancel();
        inner.event(SimEvent::SessionEnded {
            session,
            reason: reason.to_string(),
        });
    });
    resp
}

/// A request's streams while they arrive.
struct Pending {
    port: u16,
    /// Only our direction matters: the client half-closes its side at once.
    error: Option<SendStream>,
    data: Option<Stream>,
    since: tokio::time::Instant,
}

async fn spdy_session<T>(ctx: &PfContext, io: T) -> &'static str
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let (conn, mut incoming) = spdy_server::server_session(io);
    spdy_server::watch_peer(&conn, &ctx.cancel);
    let mut pending: HashMap<Vec<u8>, Pending> = HashMap::new();
    let mut pairs = JoinSet::new();
    let mut sweep = tokio::time::interval(Duration::from_secs(1));
    let reason = loop {
        tokio::select! {
            s = incoming.accept() => {
                let Some(s) = s else { break "client gone" };
                let Some((kind, port, request)) = validate(&s) else {
                    s.reject().await;
                    continue;
                };
                let request_id = String::from_utf8_lossy(&request).into_owned();
                let is_error = kind == PortForwardStream::Error;
                let stream = match s.accept().await {
                    Ok(stream) => stream,
                    Err(_) => break "client gone",
                };
                let entry = pending.entry(request.clone()).or_insert_with(|| Pending {
                    port,
                    error: None,
                    data: None,
                    since: tokio::time::Instant::now(),
                });
                let taken = if is_error { entry.error.is_some() } else { entry.data.is_some() };
                if taken {
                    let kind = if is_error { "error" } else { "data" };
                    let msg = format!(
                        "error processing stream for request {request_id}: {kind} stream already assigned"
                    );
                    if let Some(err) = entry.error.as_mut() {
                        let _ = err.send(Bytes::from(msg)).await;
                    }
                    continue;
                }
                if is_error {
                    entry.error = Some(stream.split().0);
                } else {
                    // The kubelet forwards to the port the data stream names.
                    entry.port = port;
                    entry.data = Some(stream);
                }
                if entry.error.is_some() && entry.data.is_some() {
                    if let Some(p) = pending.remove(&request) {
                        if let (Some(error), Some(data)) = (p.error, p.data) {
                            pairs.spawn(forward_spdy_pair(ctx.clone(), p.port, error, data));
                        }
                    }
                }
            }
            _ = sweep.tick() => {
                let now = tokio::time::Instant::now();
                let expired: Vec<Vec<u8>> = pending
                    .iter()
                    .filter(|(_, p)| now.duration_since(p.since) >= STREAM_CREATION_TIMEOUT)
                    .map(|(id, _)| id.clone())
                    .collect();
                for id in expired {
                    if let Some(p) = pending.remove(&id) {
                        if let Some(mut send) = p.error {
                            let id = String::from_utf8_lossy(&id);
                            let msg = format!("(conn=sim-{}, request={id}) timed out waiting for streams", ctx.session);
                            let _ = send.send(Bytes::from(msg)).await;
                            let _ = send.finish().await;
                        }
                        if let Some(data) = p.data {
                            let (mut send, _recv) = data.split();
                            send.reset().await;
                        }
                    }
                }
            }
            Some(_) = pairs.join_next(), if !pairs.is_empty() => {}
            _ = ctx.cancel.cancelled() => {
                break if ctx.dying && !ctx.inner.shutdown.is_cancelled() { "dying pod" }
                    else if ctx.inner.shutdown.is_cancelled() { "shutdown" }
                    else { "client gone" };
            }
        }
    };
    if reason == "dying pod" {
        ctx.kill.kill();
    } else {
        conn.close().await;
    }
    pairs.shutdown().await;
    reason
}

/// `streamtype` (error|data), `port` (uint16 > 0) and `requestid` (or the legacy derivation
/// from the stream id), read as the kubelet reads them; `None` means reject.
fn validate(s: &IncomingStream) -> Option<(PortForwardStream, u16, Vec<u8>)> {
    let headers = StreamHeaders::read(s.headers());
    let kind = headers.port_forward()?;
    let port = headers.port()?;
    Some((
        kind,
        port,
        headers.port_forward_request(s.id()).into_owned(),
    ))
}

async fn forward_spdy_pair(ctx: PfContext, port: u16, mut err_send: SendStream, data: Stream) {
    let (mut data_send, mut data_recv) = data.split();
    let tcp = tokio::select! {
        r = ctx.dial(port) => r,
        _ = ctx.cancel.cancelled() => return,
    };
    let tcp = match tcp {
        Ok(t) => t,
        Err(msg) => {
            // The text, then the end of both streams (kubelet ≥ 1.32 resets them; a FIN keeps
            // the text ahead of the end, see the module notes).
            let _ = err_send.send(Bytes::from(msg)).await;
            let _ = err_send.finish().await;
            data_send.reset().await;
            return;
        }
    };
    let (mut sock_r, mut sock_w) = tcp.into_split();
    let mut to_pod = 0u64;
    let mut from_pod = 0u64;
    let up = async {
        // Client → pod. FIN → half-close towards the pod; RST or a lost session → abort.
        loop {
            match data_recv.recv().await {
                Some(Ok(chunk)) => {
                    to_pod += chunk.len() as u64;
                    if sock_w.write_all(&chunk).await.is_err() {
                        return true;
                    }
                }
                Some(Err(_)) => return true,
                None => {
                    if data_recv.was_reset() {
                        return true;
                    }
                    let _ = sock_w.shutdown().await;
                    return false;
                }
            }
        }
    };
    let down = async {
        // Pod → client until the pod closes; then FIN on data.
        let mut buf = vec![0u8; CHUNK];
        let mut first = true;
        loop {
            match sock_r.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    from_pod += n as u64;
                    if data_send
                        .send(Bytes::copy_from_slice(&buf[..n]))
                        .await
                        .is_err()
                    {
                        return;
                    }
                    if ctx.dying && first {
                        ctx.die().await;
                        return;
                    }
                    first = false;
                }
            }
        }
        let _ = data_send.finish().await;
    };
    {
        tokio::pin!(up, down);
        let mut up_done = false;
        let mut down_done = false;
        while !(up_done && down_done) {
            tokio::select! {
                aborted = &mut up, if !up_done => {
                    up_done = true;
                    if aborted {
                        break;
                    }
                }
                _ = &mut down, if !down_done => {
                    down_done = true;
                    // The pod side is finished: end the error stream so the client collects it.
                    let _ = err_send.finish().await;
                }
                _ = ctx.cancel.cancelled() => break,
            }
        }
    }
    let _ = err_send.finish().await;
    ctx.inner.event(SimEvent::PortForwardClosed {
        session: ctx.session,
        port,
        bytes_to_pod: to_pod,
        bytes_from_pod: from_pod,
    });
}

// ---------------------------------------------------------------------------------------------
// Legacy WebSocket

fn parse_ports(query: &Query) -> Result<Vec<u16>, String> {
    let mut ports = Vec::new();
    for value in query.all("ports").chain(query.all("port")) {
        for p in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let port: u16 = p
                .parse()
                .map_err(|_| format!("unable to parse \"{p}\" as a port: invalid syntax"))?;
            if port == 0 {
                return Err(format!("port \"{p}\" must be > 0"));
            }
            ports.push(port);
        }
    }
    if ports.is_empty() {
        return Err("query parameter \"port\" is required".into());
    }
    Ok(ports)
}

/// Handles a legacy WebSocket port-forward request.
pub(crate) async fn websocket(
    inner: Arc<Inner>,
    kill: KillSwitch,
    req: Request<Incoming>,
    query: &Query,
    ns: &str,
    pod: &str,
) -> Response<Body> {
    let ports = match parse_ports(query) {
        Ok(p) => p,
        Err(msg) => return text_response(StatusCode::BAD_REQUEST, &msg),
    };
    serve_websocket(
        inner,
        kill,
        req,
        &WS_PROTOCOLS,
        (ns, pod),
        move |ctx, ws, protocol| async move { ws_session(&ctx, ws, protocol.framing, ports).await },
    )
}

async fn ws_session(
    ctx: &PfContext,
    ws: websocket::Ws,
    framing: Framing,
    ports: Vec<u16>,
) -> &'static str {
    let (sink, mut stream) = ws.split();
    let (out_tx, out_rx) = mpsc::channel::<Out>(CHANNEL_DEPTH);
    let writer = websocket::spawn_writer(sink, framing, out_rx);
    let mut to_pod_txs = Vec::with_capacity(ports.len());
    let mut tasks = JoinSet::new();
    for (i, &port) in ports.iter().enumerate() {
        let data_ch = (2 * i) as u8;
        let le = Bytes::copy_from_slice(&port.to_le_bytes());
        let _ = out_tx.send(Out::Data(data_ch, le.clone())).await;
        let _ = out_tx.send(Out::Data(data_ch.wrapping_add(1), le)).await;
        let (tx, rx) = mpsc::channel::<Bytes>(CHANNEL_DEPTH);
        to_pod_txs.push(tx);
        tasks.spawn(forward_ws_port(
            ctx.clone(),
            port,
            data_ch,
            rx,
            out_tx.clone(),
        ));
    }
    let reader = {
        let cancel = ctx.cancel.clone();
        tokio::spawn(async move {
            while let Some(msg) = stream.next().await {
                let msg = match msg {
                    Ok(tokio_tungstenite::tungstenite::Message::Close(_)) | Err(_) => break,
                    Ok(m) => m,
                };
                let Some((channel, payload)) = websocket::decode(framing, &msg) else {
                    continue;
                };
                // Even channels carry data to the pod; odd (error) channels are server → client.
                let idx = usize::from(channel / 2);
                if channel % 2 == 0 && !payload.is_empty() {
                    if let Some(tx) = to_pod_txs.get(idx) {
                        let _ = tx.send(payload).await;
                    }
                }
            }
            cancel.cancel();
            while let Some(Ok(_)) = stream.next().await {}
        })
    };
    // Every port finished (or the client left): Close 1000.
    let all_done = async { while tasks.join_next().await.is_some() {} };
    let reason = tokio::select! {
        _ = all_done => "completed",
        _ = ctx.cancel.cancelled() => {
            if ctx.dying && !ctx.inner.shutdown.is_cancelled() { "dying pod" }
            else if ctx.inner.shutdown.is_cancelled() { "shutdown" }
            else { "client gone" }
        }
    };
    if reason == "completed" {
        let _ = out_tx.send(Out::Close).await;
        drop(out_tx);
        websocket::finish(writer, reader).await;
    } else {
        if reason == "dying pod" {
            ctx.kill.kill();
        }
        reader.abort();
        writer.abort();
    }
    reason
}

async fn forward_ws_port(
    ctx: PfContext,
    port: u16,
    data_ch: u8,
    mut to_pod: mpsc::Receiver<Bytes>,
    out: mpsc::Sender<Out>,
) {
    let tcp = tokio::select! {
        r = ctx.dial(port) => r,
        _ = ctx.cancel.cancelled() => return,
    };
    let tcp = match tcp {
        Ok(t) => t,
        Err(msg) => {
            let _ = out
                .send(Out::Data(data_ch.wrapping_add(1), Bytes::from(msg)))
                .await;
            return;
        }
    };
    let (mut sock_r, mut sock_w) = tcp.into_split();
    let mut to = 0u64;
    let mut from = 0u64;
    let up = async {
        while let Some(chunk) = to_pod.recv().await {
            to += chunk.len() as u64;
            if sock_w.write_all(&chunk).await.is_err() {
                break;
            }
        }
        // Nothing more will come from the client (no half-close exists in this protocol);
        // wait here so the pod side is not shut down early.
        std::future::pending::<()>().await;
    };
    let down = async {
        let mut buf = vec![0u8; CHUNK];
        let mut first = true;
        loop {
            match sock_r.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    from += n as u64;
                    if out
                        .send(Out::Data(data_ch, Bytes::copy_from_slice(&buf[..n])))
                        .await
                        .is_err()
                    {
                        break;
                    }
                    if ctx.dying && first {
                        ctx.die().await;
                        break;
                    }
                    first = false;
                }
            }
        }
    };
    // The port is finished when the pod side closes (what the runtime's copy loop does).
    tokio::select! {
        _ = up => {}
        _ = down => {}
        _ = ctx.cancel.cancelled() => {}
    }
    ctx.inner.event(SimEvent::PortForwardClosed {
        session: ctx.session,
        port,
        bytes_to_pod: to,
        bytes_from_pod: from,
    });
}
