//! `pods/{pod}/log`: plain HTTP (chunked with `follow`) and WebSocket (`binary.k8s.io`,
//! `base64.binary.k8s.io`, none; PROTOCOL.md Appendix B).
//!
//! The log of every container is `log line 1` … `log line 10`; with `follow=true` one more line
//! follows every 200 ms until `log line 300` or until the client goes away. Over plain HTTP,
//! `limitBytes` ends it after that many bytes, as the kubelet does.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures_util::StreamExt;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::{Frame, Incoming};
use tokio::sync::mpsc;

use super::objects::rfc3339;
use super::query::Query;
use super::response::{full, status_response, Body};
use super::status::Status;
use super::websocket::{self, Framing, Out, Protocol};
use super::{Inner, SessionKind, SimEvent, Transport};

/// Lines every log starts with.
const INITIAL_LINES: u32 = 10;
/// Last line a followed log reaches.
const FOLLOW_LIMIT: u32 = 300;
/// Pause between followed lines.
const FOLLOW_PERIOD: Duration = Duration::from_millis(200);

const WS_PROTOCOLS: [Protocol; 3] = [
    Protocol {
        name: "",
        framing: Framing::Binary,
        v4: false,
        close_signal: false,
    },
    Protocol {
        name: "binary.k8s.io",
        framing: Framing::Binary,
        v4: false,
        close_signal: false,
    },
    Protocol {
        name: "base64.binary.k8s.io",
        framing: Framing::Base64,
        v4: false,
        close_signal: false,
    },
];

#[derive(Debug, Clone, Copy)]
struct LogOptions {
    follow: bool,
    /// First line to emit (after `tailLines`).
    first: u32,
    timestamps: bool,
    /// `limitBytes`: the log ends after this many bytes (plain HTTP).
    limit: Option<usize>,
}

impl LogOptions {
    /// `follow`, `tailLines` and `timestamps` of the request.
    fn from_query(query: &Query) -> Self {
        let tail = query
            .first("tailLines")
            .and_then(|t| t.parse::<i64>().ok())
            .filter(|t| *t >= 0);
        let first = match tail {
            Some(t) => (INITIAL_LINES + 1)
                .saturating_sub(u32::try_from(t).unwrap_or(u32::MAX))
                .max(1),
            None => 1,
        };
        LogOptions {
            follow: query.flag("follow"),
            first: if tail == Some(0) {
                INITIAL_LINES + 1
            } else {
                first
            },
            timestamps: query.flag("timestamps"),
            limit: query
                .first("limitBytes")
                .and_then(|l| l.parse::<usize>().ok())
                .filter(|l| *l > 0),
        }
    }

    fn line(&self, n: u32) -> Bytes {
        let text = if self.timestamps {
            format!("{} log line {n}\n", rfc3339(SystemTime::now()))
        } else {
            format!("log line {n}\n")
        };
        Bytes::from(text)
    }

    fn last(&self) -> u32 {
        if self.follow {
            FOLLOW_LIMIT
        } else {
            INITIAL_LINES
        }
    }

    /// Whether line `n` is emitted at once (part of the existing log) or after a pause.
    fn immediate(&self, n: u32) -> bool {
        n <= INITIAL_LINES
    }
}

/// A response body fed from a channel; the client going away drops the receiver.
pub(crate) struct ChannelBody {
    pub(crate) rx: mpsc::Receiver<Bytes>,
}

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.rx.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b))))
    }
}

/// Serves one log request: over a WebSocket when the request upgrades, else as plain text
/// (streamed with `follow`).
pub(crate) async fn serve(
    inner: Arc<Inner>,
    mut req: Request<Incoming>,
    query: &Query,
    ns: &str,
    pod: &str,
    container: &str,
) -> Response<Body> {
    if query.flag("previous") {
        return status_response(
            &Status::api_error(
                400,
                "BadRequest",
                format!("previous terminated container \"{container}\" in pod \"{pod}\" not found"),
            ),
            400,
        );
    }
    let opts = LogOptions::from_query(query);
    let session = inner.next_session();
    let started = |transport, protocol: &str| SimEvent::SessionStarted {
        session,
        kind: SessionKind::Log,
        transport,
        protocol: protocol.to_string(),
        namespace: ns.to_string(),
        pod: pod.to_string(),
    };
    let is_ws = req
        .headers()
        .get_all(http::header::UPGRADE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.to_ascii_lowercase().contains("websocket"));
    if is_ws {
        let (resp, protocol) = match websocket::handshake(&req, &WS_PROTOCOLS) {
            Ok(ok) => ok,
            Err(refusal) => return refusal,
        };
        let on_upgrade = hyper::upgrade::on(&mut req);
        inner.event(started(Transport::WebSocket, protocol.name));
        spawn_ws_log(inner, on_upgrade, protocol.framing, opts, session);
        return resp;
    }
    inner.event(started(Transport::Http, ""));
    let body = if opts.follow {
        followed_body(inner, opts, session)
    } else {
        whole_body(&inner, opts, session)
    };
    let mut resp = Response::new(body);
    *resp.status_mut() = StatusCode::OK;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain"),
    );
    resp
}

/// Once the upgrade completes, the log over the WebSocket; then the session's end.
fn spawn_ws_log(
    inner: Arc<Inner>,
    on_upgrade: hyper::upgrade::OnUpgrade,
    framing: Framing,
    opts: LogOptions,
    session: u64,
) {
    tokio::spawn(async move {
        let reason = match on_upgrade.await {
            Ok(upgraded) => {
                let ws = websocket::accept(upgraded).await;
                ws_log(&inner, ws, framing, opts).await
            }
            Err(_) => "upgrade failed",
        };
        inner.event(SimEvent::SessionEnded {
            session,
            reason: reason.to_string(),
        });
    });
}

/// A followed log: the lines fed to the body as they come, until the last, the client
/// going away or shutdown.
fn followed_body(inner: Arc<Inner>, opts: LogOptions, session: u64) -> Body {
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(async move {
        let mut reason = "completed";
        let mut room = opts.limit.unwrap_or(usize::MAX);
        for n in opts.first..=opts.last() {
            if !opts.immediate(n) {
                tokio::select! {
                    _ = tokio::time::sleep(FOLLOW_PERIOD) => {}
                    _ = inner.shutdown.cancelled() => { reason = "shutdown"; break; }
                }
            }
            let mut line = opts.line(n);
            line.truncate(room);
            room -= line.len();
            if tx.send(line).await.is_err() {
                reason = "client gone";
                break;
            }
            if room == 0 {
                break;
            }
        }
        inner.event(SimEvent::SessionEnded {
            session,
            reason: reason.to_string(),
        });
    });
    ChannelBody { rx }.boxed_unsync()
}

/// A log that is not followed: all its lines at once.
fn whole_body(inner: &Inner, opts: LogOptions, session: u64) -> Body {
    let mut text = Vec::new();
    for n in opts.first..=opts.last() {
        text.extend_from_slice(&opts.line(n));
    }
    text.truncate(opts.limit.unwrap_or(usize::MAX));
    inner.event(SimEvent::SessionEnded {
        session,
        reason: "completed".into(),
    });
    full(text)
}

async fn ws_log(
    inner: &Arc<Inner>,
    ws: websocket::Ws,
    framing: Framing,
    opts: LogOptions,
) -> &'static str {
    let (sink, mut stream) = ws.split();
    let (out_tx, out_rx) = mpsc::channel::<Out>(4);
    let writer = websocket::spawn_writer(sink, framing, out_rx);
    let cancel = inner.shutdown.child_token();
    // One-way stream: client messages are ignored; its Close or EOF ends the session.
    let reader = {
        let cancel = cancel.clone();
        tokio::spawn(async move {
            while let Some(Ok(msg)) = stream.next().await {
                if msg.is_close() {
                    break;
                }
            }
            cancel.cancel();
            while let Some(Ok(_)) = stream.next().await {}
        })
    };
    for n in opts.first..=opts.last() {
        if !opts.immediate(n) {
            tokio::select! {
                _ = tokio::time::sleep(FOLLOW_PERIOD) => {}
                _ = cancel.cancelled() => break,
            }
        }
        if cancel.is_cancelled() || out_tx.send(Out::Raw(opts.line(n))).await.is_err() {
            break;
        }
    }
    if cancel.is_cancelled() {
        reader.abort();
        writer.abort();
        return if inner.shutdown.is_cancelled() {
            "shutdown"
        } else {
            "client gone"
        };
    }
    let _ = out_tx.send(Out::Close).await;
    drop(out_tx);
    websocket::finish(writer, reader).await;
    "completed"
}
