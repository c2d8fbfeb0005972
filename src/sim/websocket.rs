//! The legacy WebSocket protocols an old kubelet serves itself (PROTOCOL.md §1.2–§1.8): the
//! x/net-style handshake, channel framing (binary and base64), and exec/attach sessions.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use bytes::{BufMut, Bytes, BytesMut};
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use http::{HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;
use tokio_util::sync::CancellationToken;

use super::exec::{self, ExecIo, Target, CHANNEL_DEPTH};
use super::kill::KillSwitch;
use super::resize::SizeDecoder;
use super::response::{bare, empty, Body};
use super::status::Status;
use super::subprotocols::{offered_subprotocols, BEARER_PROTOCOL_PREFIX};
use super::{Inner, SimEvent, Transport};

/// The upgraded connection type every WebSocket session runs on.
pub(crate) type Ws = WebSocketStream<TokioIo<Upgraded>>;

/// After our Close frame, how long we wait for the client's before closing TCP.
const CLOSE_WAIT: Duration = Duration::from_secs(2);
/// Largest inbound frame/message (x/net's `DefaultMaxPayloadBytes`).
const MAX_PAYLOAD: usize = 32 << 20;

/// How payloads are framed on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// Binary messages, payload prefixed by the channel byte.
    Binary,
    /// Text messages: `'0' + channel`, then standard base64 of the payload.
    Base64,
}

/// One supported subprotocol: its name (`""` = none offered), framing, whether the status
/// is JSON (v4, v5) rather than text-on-failure (v1), and whether the client may half-close a
/// channel with the v5 CLOSE signal (channel 255).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Protocol {
    pub name: &'static str,
    pub framing: Framing,
    pub v4: bool,
    pub close_signal: bool,
}

/// v5 as kube-apiserver's translator serves it: v4 plus the CLOSE signal, binary only.
pub(crate) const V5: Protocol = Protocol {
    name: super::streaming::V5_PROTOCOL,
    framing: Framing::Binary,
    v4: true,
    close_signal: true,
};

/// The v5 CLOSE signal's channel byte (PROTOCOL.md §1.4).
const CLOSE_SIGNAL: u8 = 255;
/// Channels of an exec/attach session (stdin, stdout, stderr, error, resize).
const EXEC_CHANNELS: u8 = 5;

pub(crate) const EXEC_PROTOCOLS: [Protocol; 5] = [
    Protocol {
        name: "",
        framing: Framing::Binary,
        v4: false,
        close_signal: false,
    },
    Protocol {
        name: "channel.k8s.io",
        framing: Framing::Binary,
        v4: false,
        close_signal: false,
    },
    Protocol {
        name: "base64.channel.k8s.io",
        framing: Framing::Base64,
        v4: false,
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

/// Checks a WebSocket upgrade like x/net's server and picks the first client-offered protocol
/// we support. Returns the 101 response, or the refusal (405, 400, bare 403).
// The refusal is the response itself; it is built once per failed request.
#[allow(clippy::result_large_err)]
pub(crate) fn handshake(
    req: &Request<Incoming>,
    supported: &[Protocol],
) -> Result<(Response<Body>, Protocol), Response<Body>> {
    if req.method() != Method::GET {
        return Err(bare(StatusCode::METHOD_NOT_ALLOWED));
    }
    let headers = req.headers();
    let connection_upgrade = headers
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    let key = headers.get(http::header::SEC_WEBSOCKET_KEY);
    if !connection_upgrade || key.is_none() {
        return Err(bare(StatusCode::BAD_REQUEST));
    }
    if headers
        .get(http::header::SEC_WEBSOCKET_VERSION)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        != Some("13")
    {
        let mut resp = bare(StatusCode::BAD_REQUEST);
        resp.headers_mut().insert(
            http::header::SEC_WEBSOCKET_VERSION,
            HeaderValue::from_static("13"),
        );
        return Err(resp);
    }
    // The authenticator consumes the bearer entry; it is never a protocol choice.
    let mut offered: Vec<String> = offered_subprotocols(headers)
        .into_iter()
        .filter(|p| !p.starts_with(BEARER_PROTOCOL_PREFIX))
        .collect();
    if offered.is_empty() {
        offered.push(String::new());
    }
    let chosen = offered
        .iter()
        .find_map(|o| supported.iter().find(|p| p.name == o))
        .copied();
    let Some(protocol) = chosen else {
        return Err(bare(StatusCode::FORBIDDEN));
    };
    let accept = derive_accept_key(key.map(|k| k.as_bytes()).unwrap_or_default());
    let mut resp = Response::new(empty());
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = resp.headers_mut();
    h.insert(http::header::UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(
        http::header::CONNECTION,
        HeaderValue::from_static("Upgrade"),
    );
    if let Ok(v) = HeaderValue::from_str(&accept) {
        h.insert(http::header::SEC_WEBSOCKET_ACCEPT, v);
    }
    if !protocol.name.is_empty() {
        h.insert(
            http::header::SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_static(protocol.name),
        );
    }
    Ok((resp, protocol))
}

/// Turns the upgraded connection into a server-side WebSocket.
pub(crate) async fn accept(upgraded: Upgraded) -> Ws {
    let config = WebSocketConfig::default()
        .max_message_size(Some(MAX_PAYLOAD))
        .max_frame_size(Some(MAX_PAYLOAD));
    WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, Some(config)).await
}

/// What the writer task sends.
#[derive(Debug)]
pub(crate) enum Out {
    /// Payload on a channel.
    Data(u8, Bytes),
    /// Payload without a channel byte (log streams).
    Raw(Bytes),
    /// Close 1000, then stop.
    Close,
}

fn encode(framing: Framing, out: Out) -> Message {
    let b64 = &base64::engine::general_purpose::STANDARD;
    match (framing, out) {
        (Framing::Binary, Out::Data(ch, data)) => {
            let mut buf = BytesMut::with_capacity(data.len() + 1);
            buf.put_u8(ch);
            buf.extend_from_slice(&data);
            Message::Binary(buf.freeze())
        }
        (Framing::Base64, Out::Data(ch, data)) => {
            let mut s = String::with_capacity(data.len() * 4 / 3 + 5);
            s.push(char::from(b'0'.wrapping_add(ch)));
            b64.encode_string(&data, &mut s);
            Message::text(s)
        }
        (Framing::Binary, Out::Raw(data)) => Message::Binary(data),
        (Framing::Base64, Out::Raw(data)) => Message::text(b64.encode(&data)),
        (_, Out::Close) => Message::Close(Some(CloseFrame {
            code: CloseCode::Normal,
            reason: "".into(),
        })),
    }
}

/// Decodes a client message into (channel, payload); `None` for control frames, empty
/// messages and undecodable base64 (dropped, as the kubelet does).
pub(crate) fn decode(framing: Framing, msg: &Message) -> Option<(u8, Bytes)> {
    let data: &[u8] = match msg {
        Message::Binary(b) => b,
        Message::Text(t) => t.as_bytes(),
        _ => return None,
    };
    let (&first, rest) = data.split_first()?;
    match framing {
        Framing::Binary => Some((first, Bytes::copy_from_slice(rest))),
        Framing::Base64 => {
            let payload = base64::engine::general_purpose::STANDARD
                .decode(rest)
                .ok()?;
            Some((first.wrapping_sub(b'0'), Bytes::from(payload)))
        }
    }
}

/// The writer task: encodes and sends until `Close` (sent) or the channel ends. Returns whether
/// everything was written.
pub(crate) fn spawn_writer(
    mut sink: SplitSink<Ws, Message>,
    framing: Framing,
    mut rx: mpsc::Receiver<Out>,
) -> JoinHandle<bool> {
    tokio::spawn(async move {
        while let Some(out) = rx.recv().await {
            let close = matches!(out, Out::Close);
            if sink.send(encode(framing, out)).await.is_err() {
                return false;
            }
            if close {
                return true;
            }
        }
        let _ = sink.flush().await;
        true
    })
}

/// After the writer sent Close: wait (bounded) for the reader to see the client's Close/EOF, so
/// the kernel never answers late client frames with a reset that truncates output.
pub(crate) async fn finish(writer: JoinHandle<bool>, reader: JoinHandle<()>) {
    let _ = tokio::time::timeout(CLOSE_WAIT, writer).await;
    let abort = reader.abort_handle();
    if tokio::time::timeout(CLOSE_WAIT, reader).await.is_err() {
        abort.abort();
    }
}

/// Whether the client offers `v5.channel.k8s.io` (the bearer entry aside): a new API server
/// routes such a request to its translator, which accepts nothing else.
pub(crate) fn offers_v5(headers: &http::HeaderMap) -> bool {
    offered_subprotocols(headers)
        .iter()
        .any(|p| p == super::streaming::V5_PROTOCOL)
}

/// The protocols a WebSocket exec/attach request is served with: v5 alone when the cluster
/// translates and the client offers it, else the kubelet's legacy set.
fn exec_protocols(inner: &Inner, req: &Request<Incoming>) -> &'static [Protocol] {
    if inner.config.streaming.accepts_websocket_streaming() && offers_v5(req.headers()) {
        std::slice::from_ref(&V5)
    } else {
        &EXEC_PROTOCOLS
    }
}

/// The lowest channel the server writes to, where the ready message goes.
fn ready_channel(target: &Target) -> u8 {
    if target.stdout {
        1
    } else if target.stderr {
        2
    } else {
        3
    }
}

/// Handles a WebSocket exec/attach request: handshake now, session in the background.
pub(crate) async fn exec(
    inner: Arc<Inner>,
    kill: KillSwitch,
    mut req: Request<Incoming>,
    target: Target,
) -> Response<Body> {
    let (resp, protocol) = match handshake(&req, exec_protocols(&inner, &req)) {
        Ok(ok) => ok,
        Err(refusal) => return refusal,
    };
    let on_upgrade = hyper::upgrade::on(&mut req);
    let session = inner.next_session();
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
            kind: target.kind,
            transport: Transport::WebSocket,
            protocol: protocol.name.to_string(),
            namespace: target.namespace.clone(),
            pod: target.pod.clone(),
        });
        let ws = accept(upgraded).await;
        let reason = exec_session(&inner, ws, protocol, &target, &kill, session).await;
        inner.event(SimEvent::SessionEnded {
            session,
            reason: reason.to_string(),
        });
    });
    resp
}

/// A v5 request the translator accepted but the kubelet refused: kube-apiserver accepts the
/// WebSocket first, so the refusal arrives as a Status on channel 3 (after the ready message),
/// then Close 1000.
pub(crate) async fn exec_refused(
    inner: Arc<Inner>,
    mut req: Request<Incoming>,
    target: Target,
    status: Status,
) -> Response<Body> {
    let (resp, protocol) = match handshake(&req, std::slice::from_ref(&V5)) {
        Ok(ok) => ok,
        Err(refusal) => return refusal,
    };
    let on_upgrade = hyper::upgrade::on(&mut req);
    let session = inner.next_session();
    tokio::spawn(async move {
        let Ok(upgraded) = on_upgrade.await else {
            return;
        };
        inner.event(SimEvent::SessionStarted {
            session,
            kind: target.kind,
            transport: Transport::WebSocket,
            protocol: protocol.name.to_string(),
            namespace: target.namespace.clone(),
            pod: target.pod.clone(),
        });
        let (sink, mut stream) = accept(upgraded).await.split();
        let (out_tx, out_rx) = mpsc::channel::<Out>(CHANNEL_DEPTH);
        let writer = spawn_writer(sink, protocol.framing, out_rx);
        let reader = tokio::spawn(async move { while let Some(Ok(_)) = stream.next().await {} });
        let _ = out_tx
            .send(Out::Data(ready_channel(&target), Bytes::new()))
            .await;
        let _ = out_tx
            .send(Out::Data(3, Bytes::from(status.to_json_bytes())))
            .await;
        let _ = out_tx.send(Out::Close).await;
        drop(out_tx);
        finish(writer, reader).await;
        inner.event(SimEvent::SessionEnded {
            session,
            reason: "upstream refused".to_string(),
        });
    });
    resp
}

/// The session's order: the ready message, the client's channels to the container side and
/// back, run, then the status and Close. Returns why it ended.
async fn exec_session(
    inner: &Arc<Inner>,
    ws: Ws,
    protocol: Protocol,
    target: &Target,
    kill: &KillSwitch,
    session: u64,
) -> &'static str {
    let (sink, stream) = ws.split();
    let (out_tx, out_rx) = mpsc::channel::<Out>(CHANNEL_DEPTH);
    let writer = spawn_writer(sink, protocol.framing, out_rx);
    let cancel = inner.shutdown.child_token();
    let _cancel_on_exit = cancel.clone().drop_guard();

    // Ready message: empty payload on the lowest writable channel.
    let _ = out_tx
        .send(Out::Data(ready_channel(target), Bytes::new()))
        .await;

    let mut io = ExecIo::default();
    let reader = spawn_exec_reader(stream, protocol, target, &mut io, &cancel);
    let forwarders = spawn_output_forwarders(target, &mut io, &out_tx, kill, &cancel);

    let status = exec::run(inner, session, target, io, &cancel).await;
    for f in forwarders {
        let _ = f.await;
    }
    let Some(status) = status.filter(|_| !cancel.is_cancelled()) else {
        reader.abort();
        writer.abort();
        if target.dying {
            kill.kill();
            return "dying pod";
        }
        return if inner.shutdown.is_cancelled() {
            "shutdown"
        } else {
            "client gone"
        };
    };
    if let Some(p) = status.error_channel_payload(protocol.v4) {
        let _ = out_tx.send(Out::Data(3, Bytes::from(p))).await;
    }
    let _ = out_tx.send(Out::Close).await;
    drop(out_tx);
    finish(writer, reader).await;
    "completed"
}

/// Reads the client's messages into the session's stdin and resize channels (those the
/// target asks for); the client going away cancels the session.
fn spawn_exec_reader(
    mut stream: SplitStream<Ws>,
    protocol: Protocol,
    target: &Target,
    io: &mut ExecIo,
    cancel: &CancellationToken,
) -> JoinHandle<()> {
    let stdin_tx = target.stdin.then(|| {
        let (tx, rx) = mpsc::channel(CHANNEL_DEPTH);
        io.stdin = Some(rx);
        tx
    });
    let resize_tx = target.tty.then(|| {
        let (tx, rx) = mpsc::channel(CHANNEL_DEPTH);
        io.resize = Some(rx);
        tx
    });
    let cancel = cancel.clone();
    tokio::spawn(async move {
        read_exec(&mut stream, protocol, stdin_tx, resize_tx).await;
        // The client went away (or answered our Close): nothing more to do for it.
        cancel.cancel();
        // Keep polling so tungstenite can flush its Close reply.
        while let Some(Ok(_)) = stream.next().await {}
    })
}

/// One task per output the target asks for (stdout on channel 1, stderr on 2), copying it
/// to the writer.
fn spawn_output_forwarders(
    target: &Target,
    io: &mut ExecIo,
    out_tx: &mpsc::Sender<Out>,
    kill: &KillSwitch,
    cancel: &CancellationToken,
) -> Vec<JoinHandle<()>> {
    let mut forwarders = Vec::new();
    for (channel, wanted) in [(1u8, target.stdout), (2u8, target.stderr)] {
        if !wanted {
            continue;
        }
        let (tx, rx) = mpsc::channel::<Bytes>(CHANNEL_DEPTH);
        if channel == 1 {
            io.stdout = Some(tx);
        } else {
            io.stderr = Some(tx);
        }
        let dying = target.dying.then(|| (kill.clone(), cancel.clone()));
        forwarders.push(tokio::spawn(forward_output(
            rx,
            out_tx.clone(),
            channel,
            dying,
        )));
    }
    forwarders
}

/// Process output → its channel. A `dying-*` pod drops the connection after the first chunk.
async fn forward_output(
    mut rx: mpsc::Receiver<Bytes>,
    out_tx: mpsc::Sender<Out>,
    channel: u8,
    dying: Option<(KillSwitch, CancellationToken)>,
) {
    while let Some(chunk) = rx.recv().await {
        if out_tx.send(Out::Data(channel, chunk)).await.is_err() {
            continue;
        }
        if let Some((kill, cancel)) = &dying {
            tokio::time::sleep(Duration::from_millis(100)).await;
            kill.kill();
            cancel.cancel();
            return;
        }
    }
}

/// Client messages of an exec/attach session: stdin (channel 0) and resize (channel 4); other
/// channels are ignored. With v5, `FF <ch>` half-closes stdin (the process sees EOF) or ends
/// resizing, and a malformed CLOSE signal ends the session as the reference server does.
/// Returns when the client closes or the connection ends.
async fn read_exec(
    stream: &mut SplitStream<Ws>,
    protocol: Protocol,
    mut stdin: Option<mpsc::Sender<Bytes>>,
    mut resize: Option<mpsc::Sender<(u16, u16)>>,
) {
    let mut sizes = SizeDecoder::default();
    while let Some(msg) = stream.next().await {
        let msg = match msg {
            Ok(Message::Close(_)) | Err(_) => return,
            Ok(m) => m,
        };
        let Some((channel, payload)) = decode(protocol.framing, &msg) else {
            continue;
        };
        if protocol.close_signal && channel == CLOSE_SIGNAL {
            match payload.as_ref() {
                [0] => stdin = None,
                [4] => resize = None,
                [c] if *c < EXEC_CHANNELS => {}
                _ => return,
            }
            continue;
        }
        match channel {
            0 => {
                if let Some(tx) = &stdin {
                    if !payload.is_empty() && tx.send(payload).await.is_err() {
                        stdin = None;
                    }
                }
            }
            4 => {
                if let Some(tx) = &resize {
                    for size in sizes.push(&payload) {
                        if tx.send(size).await.is_err() {
                            resize = None;
                            break;
                        }
                    }
                }
            }
            _ => {}
        }
    }
}
