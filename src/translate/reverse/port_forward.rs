//! The reverse port-forward (PROTOCOL.md §2.1 the other way round): kubectl ≤ 1.30 speaks
//! SPDY/3.1 `portforward.k8s.io` on its upgraded connection; a WebSocket-only upstream takes the
//! same SPDY session inside `SPDY/3.1+portforward.k8s.io` binary messages, which its tunnel
//! handler copies to the kubelet unparsed. The SPDY session is end to end (kubectl ↔ kubelet),
//! so nothing is terminated here: each client read becomes one binary message, each upstream
//! message's payload goes to the client as it is. Message boundaries mean nothing either way.
//! Both sides end together (no half-close), as in kube-apiserver's tunnel.

use crate::session_stop::SessionStop;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use futures_util::{Sink, SinkExt, Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::WebSocketStream;

use crate::activity_clock::ActivityClock;
use crate::read_sizer::ReadSizer;
use crate::session_traffic::SessionTraffic;
use crate::translate::observe::{Direction, PortForwardWatch};
use crate::translate::tunnel::{TunnelEnd, TunnelOutcome};
use crate::translate::CLOSE_WAIT;

/// Relays until either side ends (or `stop`, or `idle_timeout` without a byte either way), then
/// closes both: Close 1000 upstream, shutdown to the client. With a `watch` (the audit log's),
/// the SPDY bytes of both directions are shown to it as they pass. What goes each way is
/// counted on `traffic`, once per message, and the outcome reports those counts.
pub async fn run<C, U>(
    client: C,
    upstream: WebSocketStream<U>,
    stop: SessionStop,
    idle_timeout: Option<Duration>,
    watch: Option<&PortForwardWatch>,
    traffic: &SessionTraffic,
) -> TunnelOutcome
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let started = Instant::now();
    let (mut client_read, mut client_write) = tokio::io::split(client);
    let (mut sink, mut source) = upstream.split();
    let activity = ActivityClock::new();
    let ended_by = {
        let up = relay_up(&mut client_read, &mut sink, traffic, &activity, watch);
        let down = relay_down(&mut source, &mut client_write, traffic, &activity, watch);
        tokio::select! {
            end = up => end,
            end = down => end,
            () = stop.stopped() => TunnelEnd::stopped(&stop),
            _ = activity.quiet_for_limit(idle_timeout) => TunnelEnd::IdleTimeout,
        }
    };
    let _ = client_write.shutdown().await;
    let upstream = match sink.reunite(source) {
        Ok(ws) => ws,
        Err(_) => unreachable!("the halves of one WebSocket"),
    };
    close_upstream(upstream, ended_by).await;
    let (bytes_up, bytes_down) = traffic.moved();
    TunnelOutcome::since(started, bytes_up, bytes_down, ended_by)
}

/// Client to upstream: each client read as one binary message, until either side ends.
async fn relay_up<R, S>(
    client_read: &mut R,
    sink: &mut S,
    traffic: &SessionTraffic,
    activity: &ActivityClock,
    watch: Option<&PortForwardWatch>,
) -> TunnelEnd
where
    R: AsyncRead + Unpin,
    S: Sink<Message> + Unpin,
{
    // Reads of up to 64 KiB while data flows, each sent as one message; a quiet connection
    // parks on a small buffer again, as the tunnel's reader does.
    let mut sizer = ReadSizer::new(0);
    let mut buf = BytesMut::new();
    loop {
        let want = sizer.prepare(&mut buf, None);
        match client_read.read_buf(&mut buf).await {
            Ok(0) | Err(_) => return TunnelEnd::Client,
            Ok(n) => {
                activity.touch();
                sizer.observe(n, want, None);
                let msg = buf.split().freeze();
                if let Some(watch) = watch {
                    watch.relayed(Direction::ClientToUpstream, &msg);
                }
                if sink.send(Message::Binary(msg)).await.is_err() {
                    return TunnelEnd::Upstream;
                }
                traffic.from_client(n);
            }
        }
    }
}

/// Upstream to client: each binary message's payload as it is, until either side ends.
async fn relay_down<S, W>(
    source: &mut S,
    client_write: &mut W,
    traffic: &SessionTraffic,
    activity: &ActivityClock,
    watch: Option<&PortForwardWatch>,
) -> TunnelEnd
where
    S: Stream<Item = Result<Message, WsError>> + Unpin,
    W: AsyncWrite + Unpin,
{
    while let Some(msg) = source.next().await {
        let data = match msg {
            Ok(Message::Binary(data)) => data,
            // The tunnel is binary only; a text message ends it, as in client-go.
            Ok(Message::Text(_) | Message::Close(_)) | Err(_) => break,
            Ok(_) => continue,
        };
        activity.touch();
        if let Some(watch) = watch {
            watch.relayed(Direction::UpstreamToClient, &data);
        }
        if client_write.write_all(&data).await.is_err() {
            return TunnelEnd::Client;
        }
        traffic.to_client(data.len());
    }
    TunnelEnd::Upstream
}

/// The closing handshake with the upstream (1001 when the proxy drains, else 1000), waiting
/// for its Close at most [`CLOSE_WAIT`].
async fn close_upstream<U>(mut upstream: WebSocketStream<U>, ended_by: TunnelEnd)
where
    U: AsyncRead + AsyncWrite + Unpin,
{
    let frame = CloseFrame {
        code: if matches!(ended_by, TunnelEnd::Drained | TunnelEnd::Terminated) {
            CloseCode::Away
        } else {
            CloseCode::Normal
        },
        reason: "".into(),
    };
    let _ = tokio::time::timeout(CLOSE_WAIT, async {
        if upstream.close(Some(frame)).await.is_ok() {
            while let Some(Ok(_)) = upstream.next().await {}
        }
    })
    .await;
}
