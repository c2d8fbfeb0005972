//! The port-forward tunnel (`SPDY/3.1+portforward.k8s.io`, PROTOCOL.md §2.1): an SPDY session
//! carried inside binary WebSocket messages, relayed to an upstream SPDY connection without
//! parsing it. Message boundaries mean nothing: kubectl writes one SPDY frame as several tiny
//! messages.

use crate::session_stop::SessionStop;
use std::io::IoSlice;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::observe::{Direction, PortForwardWatch};
use super::tunnel_stop::{end_messages, operator_ended, SpdyEdges};
use super::ws::{CloseCode, CloseFrame, Incoming, WebSocket, WsReader, WsWriter};
use super::CLOSE_WAIT;
use crate::activity_clock::ActivityClock;
use crate::read_sizer::ReadSizer;
use crate::session_traffic::SessionTraffic;

/// Most client bytes gathered into one upstream write.
const BATCH_BYTES: usize = 64 * 1024;
/// Most client messages gathered into one upstream write (kubectl: three per SPDY frame).
const BATCH_PARTS: usize = 16;

/// Byte counts and the reason a tunnel ended.
#[derive(Debug, Clone)]
pub struct TunnelOutcome {
    /// Bytes from the client to the upstream.
    pub bytes_up: u64,
    /// Bytes from the upstream to the client.
    pub bytes_down: u64,
    /// Which side ended first.
    pub ended_by: TunnelEnd,
    pub duration: Duration,
}

/// Which side ended the tunnel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TunnelEnd {
    Client,
    Upstream,
    /// The client sent something that is not a binary message.
    ClientViolation,
    /// The proxy shut down (drain timeout passed).
    Drained,
    /// An operator ended it (the sessions API).
    Terminated,
    /// The client stopped answering pings.
    ClientUnresponsive,
    /// No byte went either way for the idle timeout.
    IdleTimeout,
}

impl TunnelEnd {
    /// Why a tunnel whose `stop` fired ended: an operator's termination, else a drain.
    pub fn stopped(stop: &SessionStop) -> TunnelEnd {
        match stop.termination() {
            Some(_) => TunnelEnd::Terminated,
            None => TunnelEnd::Drained,
        }
    }

    /// How the session log says it.
    pub fn describe(self) -> &'static str {
        match self {
            TunnelEnd::Client => "client",
            TunnelEnd::Upstream => "upstream",
            TunnelEnd::ClientViolation => "client protocol violation",
            TunnelEnd::Drained => "drained",
            TunnelEnd::Terminated => "terminated",
            TunnelEnd::ClientUnresponsive => "client unresponsive",
            TunnelEnd::IdleTimeout => "idle timeout",
        }
    }
}

impl TunnelOutcome {
    /// The outcome of a tunnel `started` then, ending now.
    pub(crate) fn since(
        started: Instant,
        bytes_up: u64,
        bytes_down: u64,
        ended_by: TunnelEnd,
    ) -> TunnelOutcome {
        TunnelOutcome {
            bytes_up,
            bytes_down,
            ended_by,
            duration: started.elapsed(),
        }
    }
}

/// What the client said last, which decides the Close it gets.
#[derive(Debug, Default)]
enum ClientLast {
    #[default]
    Nothing,
    /// Its Close (with this frame, if any): echoed.
    Closed(Option<CloseFrame>),
    /// It broke the tunnel's protocol: closed with this.
    Violation(CloseFrame),
}

/// Relays until either side ends, then closes both: Close 1000 to the client, shutdown to the
/// upstream. `leftover` are bytes the upstream sent right after its 101.
/// `stop` ends the tunnel early: a drain with Close 1001 to the client; an operator's
/// termination with Close 1008 saying who and why, after (with a `watch`, which knows the
/// forwarded connections) the message on each open connection's error stream and at most
/// [`CLOSE_WAIT`] for the client to close ([`super::tunnel_stop`]);
/// `idle_timeout` ends a tunnel that carried no byte either way for that long (the client's
/// pings do not count). A client that stops answering the WebSocket's keepalive pings ends it
/// too, without a closing handshake. With a `watch` (the audit log's), the SPDY bytes of both
/// directions are shown to it as they pass. What goes each way is counted on `traffic`, once
/// per write, and the outcome reports those counts.
pub async fn run<S, U>(
    ws: WebSocket<S>,
    upstream: U,
    leftover: Bytes,
    stop: SessionStop,
    idle_timeout: Option<Duration>,
    watch: Option<&PortForwardWatch>,
    traffic: &SessionTraffic,
) -> TunnelOutcome
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    U: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let started = Instant::now();
    let (mut reader, mut writer) = ws.split();
    let liveness = reader.liveness();
    let (mut up_read, mut up_write) = tokio::io::split(upstream);
    let mut client_last = ClientLast::Nothing;
    // When a byte last went either way.
    let activity = ActivityClock::new();
    // With the watch the down direction tells the open connections of a termination itself.
    let tells = watch.map(|w| (w, &stop));
    let ended_by = {
        let down = relay_down(
            &mut up_read,
            &mut writer,
            leftover,
            traffic,
            &activity,
            tells,
        );
        let up = relay_up(
            &mut reader,
            &mut up_write,
            traffic,
            &mut client_last,
            &activity,
            watch,
        );
        tokio::pin!(up);
        tokio::select! {
            down = down => match down {
                Down::Ended => TunnelEnd::Upstream,
                Down::Terminated { told } => {
                    if told {
                        // The client's turn to close (kubectl does once it read the frames).
                        let _ = tokio::time::timeout(CLOSE_WAIT, &mut up).await;
                    }
                    TunnelEnd::Terminated
                }
            },
            end = &mut up => end,
            () = cut_by(&stop, tells.is_some()) => TunnelEnd::stopped(&stop),
            _ = liveness.lost() => TunnelEnd::ClientUnresponsive,
            _ = activity.quiet_for_limit(idle_timeout) => TunnelEnd::IdleTimeout,
        }
    };
    let _ = up_write.shutdown().await;
    close_client(&mut reader, &mut writer, client_last, ended_by, &stop).await;
    let (bytes_up, bytes_down) = traffic.moved();
    TunnelOutcome::since(started, bytes_up, bytes_down, ended_by)
}

/// Resolves when the session's stop must cut the tunnel: at once on a drain, or without the
/// down direction telling the client itself (`told`); otherwise once the telling should have
/// been done (the frame under way finished, the client's close: [`CLOSE_WAIT`] each), so that
/// a client that reads nothing is cut all the same.
async fn cut_by(stop: &SessionStop, told: bool) {
    stop.stopped().await;
    if told && stop.termination().is_some() {
        tokio::time::sleep(2 * CLOSE_WAIT).await;
    }
}

/// How the down direction ended.
enum Down {
    /// The upstream ended, or the client cannot be written to.
    Ended,
    /// An operator terminated the session; `told`: the client's open connections were told.
    Terminated { told: bool },
}

/// Upstream to client: `leftover` first, then each upstream read as one message, until the
/// upstream ends or the client cannot be written to. Keepalive pings and pongs go out between
/// reads. With `tells` (the audit's watch and the session's stop), the upstream's SPDY frames
/// are followed, and a termination is told to the client's open connections between two of
/// them.
async fn relay_down<R, W>(
    up_read: &mut R,
    writer: &mut WsWriter<W>,
    leftover: Bytes,
    traffic: &SessionTraffic,
    activity: &ActivityClock,
    tells: Option<(&PortForwardWatch, &SessionStop)>,
) -> Down
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let watch = tells.map(|(w, _)| w);
    let mut edges = tells.map(|_| SpdyEdges::default());
    if !leftover.is_empty() {
        traffic.to_client(leftover.len());
        if let Some(watch) = watch {
            watch.relayed(Direction::UpstreamToClient, &leftover);
        }
        if let Some(edges) = edges.as_mut() {
            edges.follow(&leftover);
        }
        if writer.send_binary(&[], leftover).await.is_err() {
            return Down::Ended;
        }
    }
    // Reads of up to 64 KiB while data flows (kube-apiserver's tunnel uses 32 KiB; 64 KiB
    // halves the reads and writes here and the messages kubectl has to take apart, and
    // kubectl's reader takes messages of any size); a quiet tunnel parks on a small buffer.
    // Nothing of a message outlives its write, so no slack is kept beyond a read.
    let mut sizer = ReadSizer::new(0);
    let mut buf = BytesMut::new();
    loop {
        // Each message is written from this buffer and dropped before the next read, so the
        // reserve reuses the same allocation.
        let want = sizer.prepare(&mut buf, None);
        tokio::select! {
            read = up_read.read_buf(&mut buf) => match read {
                Ok(0) | Err(_) => return Down::Ended,
                Ok(n) => {
                    traffic.to_client(n);
                    activity.touch();
                    sizer.observe(n, want, None);
                    let msg = buf.split().freeze();
                    if let Some(watch) = watch {
                        watch.relayed(Direction::UpstreamToClient, &msg);
                    }
                    if let Some(edges) = edges.as_mut() {
                        edges.follow(&msg);
                    }
                    if writer.send_binary(&[], msg).await.is_err() {
                        return Down::Ended;
                    }
                }
            },
            // Flushing sends the pong or the keepalive ping.
            () = writer.control_due() => {
                if writer.flush().await.is_err() {
                    return Down::Ended;
                }
            }
            () = operator_ended(tells.map(|(_, stop)| stop)) => {
                let (Some((watch, stop)), Some(edges)) = (tells, edges.as_mut()) else {
                    return Down::Ended;
                };
                let told = tell_terminated(up_read, writer, edges, watch, stop).await;
                return Down::Terminated { told };
            }
        }
    }
}

/// Tells the client's open connections that an operator terminated the session: the frame it
/// has begun finished first (what more the upstream sends of it, within [`CLOSE_WAIT`]), then
/// the proxy's frames. Whether they went; where they cannot, the Close alone says it.
async fn tell_terminated<R, W>(
    up_read: &mut R,
    writer: &mut WsWriter<W>,
    edges: &mut SpdyEdges,
    watch: &PortForwardWatch,
    stop: &SessionStop,
) -> bool
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let finished = tokio::time::timeout(CLOSE_WAIT, async {
        let mut buf = BytesMut::with_capacity(16 * 1024);
        while !edges.at_boundary() {
            buf.clear();
            match up_read.read_buf(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(_) => {}
            }
            // The rest of the read (frames after it) is the upstream's last word: dropped.
            let rest = buf.split_to(edges.finishing(&buf)).freeze();
            watch.relayed(Direction::UpstreamToClient, &rest);
            edges.follow(&rest);
            if writer.send_binary(&[], rest).await.is_err() {
                return false;
            }
        }
        true
    })
    .await;
    if finished != Ok(true) {
        return false;
    }
    let message = stop.termination().map(|t| t.message()).unwrap_or_default();
    // None when no connection is open (or the watch stopped following): the Close says it.
    let messages = end_messages(watch, &message);
    for frames in &messages {
        if writer.send_binary(&[], frames.clone()).await.is_err() {
            return false;
        }
    }
    !messages.is_empty()
}

/// Client to upstream, until the client ends (its Close, a violation, its connection gone) or
/// the upstream cannot be written to. What the client said last is kept in `client_last` as
/// soon as it is known, before anything held back is written.
///
/// Messages go upstream together, in one vectored write of up to `BATCH_BYTES`: those already
/// read, and those whose first bytes are already here (the client is in the middle of sending
/// them). kubectl sends each SPDY frame as three messages (the head in two 4-byte halves, then
/// the payload), which would otherwise be three writes, and a busy 64 KiB read holds two
/// frames. Nothing waits for a client that has not started its next message, nor for the rest
/// of a message larger than a batch.
async fn relay_up<R, W>(
    reader: &mut WsReader<R>,
    up_write: &mut W,
    traffic: &SessionTraffic,
    client_last: &mut ClientLast,
    activity: &ActivityClock,
    watch: Option<&PortForwardWatch>,
) -> TunnelEnd
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut batch = Batch::new();
    let end = loop {
        let Some(msg) = reader.next().await else {
            break TunnelEnd::Client;
        };
        match msg {
            Ok(Incoming::Binary(data)) => {
                activity.touch();
                if let Some(watch) = watch {
                    watch.relayed(Direction::ClientToUpstream, &data);
                }
                batch.push(data);
                // A message already read is "arriving" too: `next` returns it at once.
                if !batch.is_full() && reader.data_frame_arriving(BATCH_BYTES as u64) {
                    continue;
                }
                match batch.write_to(up_write).await {
                    Ok(n) => traffic.from_client(n),
                    Err(_) => return TunnelEnd::Upstream,
                }
            }
            Ok(Incoming::Close(frame)) => {
                *client_last = ClientLast::Closed(frame);
                break TunnelEnd::Client;
            }
            Ok(Incoming::Text(_)) => {
                *client_last = ClientLast::Violation(CloseFrame::new(
                    CloseCode::PROTOCOL,
                    "the tunnel carries binary messages only",
                ));
                break TunnelEnd::ClientViolation;
            }
            Err(e) => {
                if let Some(code) = e.close_code() {
                    *client_last = ClientLast::Violation(CloseFrame::new(code, e.to_string()));
                    break TunnelEnd::ClientViolation;
                }
                break TunnelEnd::Client;
            }
        }
    };
    // What was held back still goes upstream.
    if let Ok(n) = batch.write_to(up_write).await {
        traffic.from_client(n);
    }
    end
}

/// Ends the client's side: its own Close echoed, or ours (the reason the tunnel ended) with a
/// moment for its answer so the socket ends cleanly; never waiting long on a client that does
/// not read, and nothing for one that answers nothing.
async fn close_client<R, W>(
    reader: &mut WsReader<R>,
    writer: &mut WsWriter<W>,
    client_last: ClientLast,
    ended_by: TunnelEnd,
    stop: &SessionStop,
) where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    if ended_by == TunnelEnd::ClientUnresponsive {
        return;
    }
    let close = match (client_last, ended_by) {
        // The client closed: echoing its code completes the handshake, nothing to wait for.
        (ClientLast::Closed(frame), _) => {
            let reply = frame.map(|f| CloseFrame::new(f.code, ""));
            let _ = tokio::time::timeout(CLOSE_WAIT, writer.close(reply)).await;
            return;
        }
        (ClientLast::Violation(frame), _) => frame,
        (ClientLast::Nothing, TunnelEnd::Drained) => CloseFrame::new(
            CloseCode::AWAY,
            "kube-ws-proxy is shutting down, or the cluster left its configuration",
        ),
        // The close reason's 123 bytes are all the client will see of who and why.
        (ClientLast::Nothing, TunnelEnd::Terminated) => CloseFrame::new(
            CloseCode::POLICY,
            stop.termination().map(|t| t.message()).unwrap_or_default(),
        ),
        (ClientLast::Nothing, TunnelEnd::IdleTimeout) => CloseFrame::new(
            CloseCode::NORMAL,
            "idle: no data either way for the stream idle timeout (kube-ws-proxy)",
        ),
        (ClientLast::Nothing, _) => CloseFrame::new(CloseCode::NORMAL, ""),
    };
    let _ = tokio::time::timeout(CLOSE_WAIT, async {
        if writer.close(Some(close)).await.is_ok() {
            reader.drain().await;
        }
    })
    .await;
}

/// Client messages waiting to go upstream in one write, as the read buffer's own slices.
struct Batch {
    parts: [Bytes; BATCH_PARTS],
    count: usize,
    bytes: usize,
}

impl Batch {
    fn new() -> Self {
        Batch {
            parts: Default::default(),
            count: 0,
            bytes: 0,
        }
    }

    fn push(&mut self, data: Bytes) {
        // An empty message has nothing for upstream (and would make an empty write).
        if data.is_empty() {
            return;
        }
        self.bytes += data.len();
        self.parts[self.count] = data;
        self.count += 1;
    }

    /// No room for another message.
    fn is_full(&self) -> bool {
        self.count == BATCH_PARTS || self.bytes >= BATCH_BYTES
    }

    /// Writes everything waiting (vectored, nothing copied) and empties the batch. Returns the
    /// bytes written.
    async fn write_to<W: AsyncWrite + Unpin>(&mut self, io: &mut W) -> std::io::Result<usize> {
        let total = self.bytes;
        let mut first = 0;
        while first < self.count {
            let mut slices = [IoSlice::new(&[]); BATCH_PARTS];
            for (slice, part) in slices.iter_mut().zip(&self.parts[first..self.count]) {
                *slice = IoSlice::new(part);
            }
            let mut n = io.write_vectored(&slices[..self.count - first]).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            // Drop what went out; a part written in half keeps its rest.
            while n > 0 {
                let part = &mut self.parts[first];
                let k = n.min(part.len());
                part.advance(k);
                n -= k;
                if part.is_empty() {
                    first += 1;
                }
            }
            while first < self.count && self.parts[first].is_empty() {
                first += 1;
            }
        }
        for part in &mut self.parts[..self.count] {
            *part = Bytes::new();
        }
        self.count = 0;
        self.bytes = 0;
        Ok(total)
    }
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::{Context, Poll};

    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
    use tokio::task::JoinHandle;

    use super::*;
    use crate::spdy::frame::FLAG_FIN;
    use crate::translate::ws::frame::OpCode;
    use crate::translate::ws::test_client::{masked, server_frames};
    use crate::translate::ws::Config;

    /// The proxy's end of the upstream connection, counting its writes (vectored ones count
    /// once, as on a socket).
    struct CountingWrites {
        inner: DuplexStream,
        writes: Arc<AtomicUsize>,
    }

    impl AsyncRead for CountingWrites {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.inner).poll_read(cx, buf)
        }
    }

    impl AsyncWrite for CountingWrites {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            let res = Pin::new(&mut self.inner).poll_write(cx, buf);
            if let Poll::Ready(Ok(n)) = res {
                if n > 0 {
                    self.writes.fetch_add(1, Ordering::SeqCst);
                }
            }
            res
        }

        fn poll_write_vectored(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> Poll<std::io::Result<usize>> {
            let joined: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).collect();
            self.poll_write(cx, &joined)
        }

        fn is_write_vectored(&self) -> bool {
            true
        }

        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.inner).poll_flush(cx)
        }

        fn poll_shutdown(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.inner).poll_shutdown(cx)
        }
    }

    /// A tunnel between an in-memory client and an in-memory upstream peer; the counter says
    /// how many writes went upstream.
    fn start() -> (
        DuplexStream,
        DuplexStream,
        JoinHandle<TunnelOutcome>,
        Arc<AtomicUsize>,
    ) {
        start_with_upstream_pipe(1 << 20)
    }

    /// [`start`] with an upstream pipe of `pipe` bytes (a small one makes writes partial).
    fn start_with_upstream_pipe(
        pipe: usize,
    ) -> (
        DuplexStream,
        DuplexStream,
        JoinHandle<TunnelOutcome>,
        Arc<AtomicUsize>,
    ) {
        let (client, server) = tokio::io::duplex(1 << 20);
        let (ours, upstream) = tokio::io::duplex(pipe);
        let writes = Arc::new(AtomicUsize::new(0));
        let ours = CountingWrites {
            inner: ours,
            writes: writes.clone(),
        };
        let ws = WebSocket::new(
            server,
            Config {
                max_message_size: 1 << 20,
                keepalive: None,
                memory: None,
            },
        );
        let task = tokio::spawn(async move {
            let traffic = SessionTraffic::new();
            let stop = crate::session_stop::SessionStop::default();
            run(ws, ours, Bytes::new(), stop, None, None, &traffic).await
        });
        (client, upstream, task, writes)
    }

    /// The client's SYN_STREAMs of one forwarded connection (error stream 1, data stream 3).
    fn connection_opened() -> Vec<u8> {
        use crate::spdy::codec::FrameEncoder;
        use crate::spdy::frame::{Frame, HeaderBlock, StreamId, SynStream};
        let mut enc = FrameEncoder::new();
        let mut out = BytesMut::new();
        for (id, kind) in [(1, "error"), (3, "data")] {
            let mut headers = HeaderBlock::new();
            headers.push("streamtype", kind);
            headers.push("port", "80");
            headers.push("requestid", "0");
            let frame = Frame::SynStream(SynStream::new(StreamId::new(id), headers));
            enc.encode(&frame, &mut out).unwrap();
        }
        out.to_vec()
    }

    #[tokio::test(start_paused = true)]
    async fn a_termination_is_told_between_two_frames_on_each_open_connection() {
        let (mut client, server) = tokio::io::duplex(1 << 20);
        let (ours, mut upstream) = tokio::io::duplex(1 << 20);
        let ws = WebSocket::new(
            server,
            Config {
                max_message_size: 1 << 20,
                keepalive: None,
                memory: None,
            },
        );
        let stop = SessionStop::default();
        let watch = PortForwardWatch::new();
        let task = {
            let stop = stop.clone();
            tokio::spawn(async move {
                let traffic = SessionTraffic::new();
                run(ws, ours, Bytes::new(), stop, None, Some(&watch), &traffic).await
            })
        };
        client
            .write_all(&masked(0x82, &connection_opened()))
            .await
            .unwrap();
        let mut opened = vec![0; connection_opened().len()];
        upstream.read_exact(&mut opened).await.unwrap();
        // The upstream is inside a DATA frame of 5 bytes on the data stream when it ends.
        upstream
            .write_all(&[0, 0, 0, 3, 0, 0, 0, 5, b'a', b'b'])
            .await
            .unwrap();
        assert_eq!(server_frames(&mut client, 1).await[0].1.len(), 10);
        stop.terminate(crate::session_stop::Termination {
            by: "olga".into(),
            reason: "enough".into(),
        });
        // The tunnel sees the termination before the upstream's next bytes.
        tokio::time::sleep(Duration::from_millis(10)).await;
        // The frame's rest goes; what follows it does not, the proxy's frames do.
        upstream
            .write_all(b"cde\0\0\0\x03\0\0\0\x01z")
            .await
            .unwrap();
        let frames = server_frames(&mut client, 3).await;
        assert_eq!(frames[0], (OpCode::Binary, b"cde".to_vec()));
        let told = b"kube-ws-proxy ended the session: terminated by olga: enough";
        let mut end = vec![0, 0, 0, 1, FLAG_FIN, 0, 0, told.len() as u8];
        end.extend_from_slice(told);
        end.extend_from_slice(&[0, 0, 0, 3, FLAG_FIN, 0, 0, 0]);
        assert_eq!(frames[1], (OpCode::Binary, end));
        // The client did not close within the 2 s: the Close says it all the same.
        assert_eq!(frames[2].0, OpCode::Close);
        assert_eq!(&frames[2].1[..2], &1008u16.to_be_bytes());
        assert_eq!(task.await.unwrap().ended_by, TunnelEnd::Terminated);
    }

    /// A client that reads nothing holds the tunnel's telling up: it is cut all the same.
    #[tokio::test(start_paused = true)]
    async fn a_terminated_tunnel_whose_client_reads_nothing_is_cut() {
        let (mut client, server) = tokio::io::duplex(256);
        let (ours, mut upstream) = tokio::io::duplex(1 << 20);
        let ws = WebSocket::new(
            server,
            Config {
                max_message_size: 1 << 20,
                keepalive: None,
                memory: None,
            },
        );
        let stop = SessionStop::default();
        let watch = PortForwardWatch::new();
        let task = {
            let stop = stop.clone();
            tokio::spawn(async move {
                let traffic = SessionTraffic::new();
                run(ws, ours, Bytes::new(), stop, None, Some(&watch), &traffic).await
            })
        };
        client
            .write_all(&masked(0x82, &connection_opened()))
            .await
            .unwrap();
        let mut opened = vec![0; connection_opened().len()];
        upstream.read_exact(&mut opened).await.unwrap();
        // More than the client's pipe holds, in whole frames; the client reads none of it.
        let mut frame = vec![0, 0, 0, 3, 0, 0, 0x10, 0];
        frame.resize(8 + 0x1000, b'x');
        for _ in 0..4 {
            upstream.write_all(&frame).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        stop.terminate(crate::session_stop::Termination {
            by: "olga".into(),
            reason: String::new(),
        });
        // Time is paused: only the tunnel's own timers move it.
        // At most: the telling (2 × CLOSE_WAIT), then the Close (CLOSE_WAIT).
        let outcome = tokio::time::timeout(4 * CLOSE_WAIT, task)
            .await
            .expect("cut once the telling should have been done")
            .unwrap();
        assert_eq!(outcome.ended_by, TunnelEnd::Terminated);
    }

    #[tokio::test]
    async fn kubectl_style_frames_go_upstream_whole_and_in_order() {
        let (mut client, mut upstream, task, writes) = start();
        // Per SPDY frame: the head in two 4-byte messages, then the payload.
        let mut wire = Vec::new();
        let mut expected = Vec::new();
        for i in 0..3u8 {
            let head = [i; 8];
            let payload = vec![i; 10_000];
            wire.extend(masked(0x82, &head[..4]));
            wire.extend(masked(0x82, &head[4..]));
            wire.extend(masked(0x82, &payload));
            expected.extend_from_slice(&head);
            expected.extend_from_slice(&payload);
        }
        wire.extend(masked(0x88, b"\x03\xe8"));
        client.write_all(&wire).await.unwrap();
        let mut got = Vec::new();
        upstream.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, expected);
        // The first read is small (an idle tunnel's), so the first frame goes alone; the other
        // two arrive in one read and go upstream together.
        assert_eq!(
            writes.load(Ordering::SeqCst),
            2,
            "frames are written whole and together"
        );
        let outcome = task.await.unwrap();
        assert_eq!(outcome.ended_by, TunnelEnd::Client);
        assert_eq!(outcome.bytes_up, expected.len() as u64);
        // The client's close is answered with its code.
        assert_eq!(
            server_frames(&mut client, 1).await,
            vec![(OpCode::Close, vec![0x03, 0xe8])]
        );
    }

    #[tokio::test]
    async fn a_message_still_arriving_goes_upstream_with_the_one_before_it() {
        let (mut client, mut upstream, _task, writes) = start();
        let second = masked(0x82, &[2u8; 300]);
        let mut wire = masked(0x82, &[1u8; 100]);
        wire.extend_from_slice(&second[..150]);
        client.write_all(&wire).await.unwrap();
        // The tunnel holds the first message while the second is on its way.
        tokio::task::yield_now().await;
        client.write_all(&second[150..]).await.unwrap();
        let mut got = vec![0u8; 400];
        upstream.read_exact(&mut got).await.unwrap();
        assert_eq!(&got[..100], &[1u8; 100][..]);
        assert_eq!(&got[100..], &[2u8; 300][..]);
        assert_eq!(writes.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn many_messages_in_one_read_go_upstream_in_bounded_batches() {
        let (mut client, mut upstream, task, writes) = start();
        let mut wire = masked(0x82, b"");
        for i in 0..40u8 {
            wire.extend(masked(0x82, &[i]));
        }
        wire.extend(masked(0x88, b"\x03\xe8"));
        client.write_all(&wire).await.unwrap();
        let mut got = Vec::new();
        upstream.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, (0..40u8).collect::<Vec<_>>());
        // 16 messages per write at most; the empty message writes nothing.
        assert_eq!(writes.load(Ordering::SeqCst), 3);
        assert_eq!(task.await.unwrap().bytes_up, 40);
    }

    #[tokio::test]
    async fn a_batch_survives_partial_writes() {
        // Upstream takes 1,000 bytes at a time.
        let (mut client, mut upstream, task, _) = start_with_upstream_pipe(1000);
        let mut wire = Vec::new();
        let mut expected = Vec::new();
        for i in 0..6u8 {
            let payload: Vec<u8> = (0..3000u32).map(|j| (j as u8) ^ i).collect();
            wire.extend(masked(0x82, &payload));
            expected.extend(payload);
        }
        wire.extend(masked(0x88, b"\x03\xe8"));
        client.write_all(&wire).await.unwrap();
        let mut got = Vec::new();
        upstream.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, expected);
        assert_eq!(task.await.unwrap().bytes_up, expected.len() as u64);
    }

    #[tokio::test]
    async fn a_small_message_before_a_ping_is_not_held_back() {
        let (mut client, mut upstream, _task, _) = start();
        let mut wire = masked(0x82, b"x");
        wire.extend(masked(0x89, b"p"));
        client.write_all(&wire).await.unwrap();
        let mut got = [0u8; 1];
        tokio::time::timeout(Duration::from_secs(5), upstream.read_exact(&mut got))
            .await
            .expect("the message was held back")
            .unwrap();
        assert_eq!(&got, b"x");
        assert_eq!(
            server_frames(&mut client, 1).await,
            vec![(OpCode::Pong, b"p".to_vec())]
        );
    }

    #[tokio::test]
    async fn nothing_waits_for_the_rest_of_a_message_larger_than_a_batch() {
        let (mut client, mut upstream, _task, _) = start();
        let big = masked(0x82, &vec![7u8; BATCH_BYTES + 1]);
        let mut wire = masked(0x82, b"first");
        wire.extend_from_slice(&big[..100]);
        client.write_all(&wire).await.unwrap();
        let mut got = [0u8; 5];
        tokio::time::timeout(Duration::from_secs(5), upstream.read_exact(&mut got))
            .await
            .expect("the message was held back")
            .unwrap();
        assert_eq!(&got, b"first");
        client.write_all(&big[100..]).await.unwrap();
        let mut rest = vec![0u8; BATCH_BYTES + 1];
        upstream.read_exact(&mut rest).await.unwrap();
        assert!(rest.iter().all(|&b| b == 7));
    }

    #[tokio::test]
    async fn held_bytes_go_upstream_when_the_client_disappears() {
        let (mut client, mut upstream, task, _) = start();
        // A small message, then the first bytes of another one, then the client is gone.
        let mut wire = masked(0x82, b"x");
        wire.extend_from_slice(&masked(0x82, b"yz")[..3]);
        client.write_all(&wire).await.unwrap();
        drop(client);
        let mut got = Vec::new();
        upstream.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"x");
        assert_eq!(task.await.unwrap().ended_by, TunnelEnd::Client);
    }
}
