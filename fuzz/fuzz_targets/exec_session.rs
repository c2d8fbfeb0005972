//! The exec/attach translator (`remote_command::open_streams`, `run` and `refuse`, as the exec
//! handler calls them) driven in-process by an interleaved script of client and upstream events:
//! a v5.channel.k8s.io WebSocket client and an SPDY/3.1 kubelet on in-memory pipes, the clock
//! paused so that timers (pings, idle and drain timeouts) fire as soon as nothing else can run.
//!
//! Input: two option bytes (streams, tty, upstream version, keepalives, idle timeout, SYN_REPLYs
//! by hand, which peer ends it), then operations, one opcode byte each with its arguments.
//!
//! Checks, besides "never panics":
//! - the session always ends once the script is over and one side leaves or finishes, or the
//!   proxy shuts down (even with a client that stopped reading): no hang, bounded in virtual
//!   time, and no task left behind;
//! - the proxy's frames are well formed (final, unmasked, nothing after its close frame);
//! - the client's channel 1/2 bytes are a prefix of what the kubelet sent on stdout/stderr, and
//!   all of it when the command completed against a well-behaved kubelet and a reading client;
//! - the kubelet's stdin bytes are a prefix of the client's channel 0 bytes before its CLOSE
//!   (up to the first raw frame or garbage the script sends: those may carry channel 0 too);
//! - `Outcome`: a status exactly for the ends that promise one; a reading client got that very
//!   status on channel 3, then Close 1000; a protocol violation is answered by an error close;
//!   `bytes_out` is what a reading client got; a polite client is never "unresponsive".

#![no_main]

mod session_harness;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kube_ws_proxy::spdy::codec::FrameEncoder;
use kube_ws_proxy::spdy::frame::{Frame, HeaderBlock, StreamId, SynReply};
use kube_ws_proxy::spdy::proto::{Config as SpdyConfig, Connection};
use kube_ws_proxy::translate::exec_options::{ExecOptions, StreamKind};
use kube_ws_proxy::translate::protocol::UpstreamVersion;
use kube_ws_proxy::translate::remote_command::{
    open_streams, refuse, run, Outcome, SessionEndKind, SessionLimits,
};
use kube_ws_proxy::translate::status::Status;
use kube_ws_proxy::translate::status_mapping::from_upstream_error_stream;
use kube_ws_proxy::translate::ws::{Config as WsConfig, Keepalive, WebSocket};
use libfuzzer_sys::fuzz_target;
use session_harness::{
    assert_forwarded, client_action, client_message, peer_writer, run_case, ClientPeer, PeerOut,
    ReadMode, Script, PIPE,
};
use tokio::io::{AsyncReadExt, DuplexStream, ReadHalf};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// What the exec handler allows for opening the streams (its handshake timeout).
const HANDSHAKE: Duration = Duration::from_secs(10);
/// SYN_REPLY frames prepared in advance (a session opens at most five streams).
const REPLIES: usize = 8;
/// A stream id the proxy never opens: DATA there is for no stream.
const NO_STREAM: u32 = 101;

fuzz_target!(|data: &[u8]| {
    run_case(exec_case(data));
});

/// SYN_REPLY frames with empty header blocks, compressed in sequence by one context as a
/// kubelet would send them; the stream id (outside the compressed block) is patched in.
fn replies() -> &'static [Vec<u8>] {
    static REPLY_FRAMES: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    REPLY_FRAMES.get_or_init(|| {
        let mut enc = FrameEncoder::new();
        (0..REPLIES)
            .map(|i| {
                let mut dst = BytesMut::new();
                let mut headers = HeaderBlock::new();
                if i == 0 {
                    headers.push("x-stream-protocol-version", "v4.channel.k8s.io");
                }
                let frame = Frame::SynReply(SynReply {
                    stream_id: StreamId::new(1),
                    fin: false,
                    headers,
                });
                enc.encode(&frame, &mut dst).expect("encode SYN_REPLY");
                dst.to_vec()
            })
            .collect()
    })
}

fn control(kind: u16, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + payload.len());
    out.extend_from_slice(&(0x8003u16).to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    out.push(flags);
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    out.extend_from_slice(payload);
    out
}

fn data_frame(id: u32, fin: bool, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + payload.len());
    out.extend_from_slice(&(id & 0x7FFF_FFFF).to_be_bytes());
    out.push(u8::from(fin));
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    out.extend_from_slice(payload);
    out
}

/// The kubelet's view of the session.
#[derive(Default)]
struct UpLog {
    /// SYN_STREAMs in order: (id, kind).
    streams: Vec<(u32, StreamKind)>,
    /// SYN_REPLYs sent (each uses the next prepared frame).
    replies: usize,
    replied: Vec<u32>,
    /// DATA the proxy sent per stream.
    received: HashMap<u32, Vec<u8>>,
    /// Streams the proxy finished (FIN) or reset.
    fin_from_proxy: Vec<u32>,
    data_after_fin: bool,
    /// DATA the kubelet sent per stream while the stream existed for both sides.
    sent: HashMap<u32, Vec<u8>>,
    /// Streams the kubelet ended (FIN) or reset: nothing after counts.
    ended_by_kubelet: Vec<u32>,
    eof: bool,
}

impl UpLog {
    fn id_of(&self, kind: StreamKind) -> Option<u32> {
        self.streams
            .iter()
            .find(|(_, k)| *k == kind)
            .map(|(id, _)| *id)
    }

    fn sent_on(&self, kind: StreamKind) -> &[u8] {
        self.id_of(kind)
            .and_then(|id| self.sent.get(&id))
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    fn received_on(&self, kind: StreamKind) -> &[u8] {
        self.id_of(kind)
            .and_then(|id| self.received.get(&id))
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    /// Sends the next SYN_REPLY for `id`, if the proxy opened it and one is left.
    fn reply(&mut self, id: u32, fin: bool, tx: &mpsc::UnboundedSender<PeerOut>) {
        if self.replies >= REPLIES || self.replied.contains(&id) {
            return;
        }
        let mut frame = replies()[self.replies].clone();
        self.replies += 1;
        frame[8..12].copy_from_slice(&id.to_be_bytes());
        if fin {
            frame[4] |= 1;
            self.ended_by_kubelet.push(id);
        }
        self.replied.push(id);
        let _ = tx.send(PeerOut::Bytes(frame));
    }

    /// DATA on `id`, noted as sent while the stream is open both ways.
    fn data(&mut self, id: u32, fin: bool, payload: &[u8], tx: &mpsc::UnboundedSender<PeerOut>) {
        let opened = self.streams.iter().any(|(s, _)| *s == id);
        if opened && !self.ended_by_kubelet.contains(&id) {
            self.sent.entry(id).or_default().extend_from_slice(payload);
        }
        if fin {
            self.ended_by_kubelet.push(id);
        }
        let _ = tx.send(PeerOut::Bytes(data_frame(id, fin, payload)));
    }
}

struct Kubelet {
    tx: mpsc::UnboundedSender<PeerOut>,
    log: Arc<Mutex<UpLog>>,
    /// Every frame the kubelet sent was well formed and meant for a stream in its state.
    well_behaved: bool,
    shut_down: bool,
}

impl Kubelet {
    /// The id of the `n`th stream of the session (or one the proxy never opened).
    fn stream(&self, n: u8) -> u32 {
        let log = self.log.lock().unwrap();
        log.streams
            .get(usize::from(n % 6))
            .map(|(id, _)| *id)
            .unwrap_or(NO_STREAM)
    }

    fn kind(&self, kind: StreamKind) -> u32 {
        self.log.lock().unwrap().id_of(kind).unwrap_or(NO_STREAM)
    }

    fn send(&mut self, bytes: Vec<u8>) {
        let _ = self.tx.send(PeerOut::Bytes(bytes));
    }

    fn data(&mut self, id: u32, fin: bool, payload: &[u8]) {
        let mut log = self.log.lock().unwrap();
        if !log.replied.contains(&id) || log.ended_by_kubelet.contains(&id) {
            self.well_behaved = false;
        }
        log.data(id, fin, payload, &self.tx);
    }

    /// The command ends: outputs finished, the status written, the error stream finished.
    fn finish(&mut self, status: &[u8]) {
        for kind in [StreamKind::Stdout, StreamKind::Stderr] {
            let id = self.kind(kind);
            if id != NO_STREAM {
                self.data(id, true, b"");
            }
        }
        let id = self.kind(StreamKind::Error);
        if id != NO_STREAM {
            self.data(id, true, status);
        }
    }
}

/// Reads the proxy's frames: notes streams and data, answers SYN_STREAMs and pings when told to.
async fn kubelet_reader(
    mut rd: ReadHalf<DuplexStream>,
    log: Arc<Mutex<UpLog>>,
    tx: mpsc::UnboundedSender<PeerOut>,
    kinds: Vec<StreamKind>,
    auto_reply: bool,
    auto_pong: bool,
) {
    let mut buf = Vec::with_capacity(PIPE);
    let mut chunk = [0u8; 2048];
    loop {
        let n = match rd.read(&mut chunk).await {
            Ok(0) | Err(_) => {
                log.lock().unwrap().eof = true;
                return;
            }
            Ok(n) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        while buf.len() >= 8 {
            let len = u32::from_be_bytes([0, buf[5], buf[6], buf[7]]) as usize;
            if buf.len() < 8 + len {
                break;
            }
            let frame: Vec<u8> = buf.drain(..8 + len).collect();
            let flags = frame[4];
            let body = &frame[8..];
            let mut log = log.lock().unwrap();
            if frame[0] & 0x80 == 0 {
                let id = u32::from_be_bytes(frame[..4].try_into().unwrap());
                if log.fin_from_proxy.contains(&id) {
                    log.data_after_fin = true;
                }
                log.received.entry(id).or_default().extend_from_slice(body);
                if flags & 1 != 0 {
                    log.fin_from_proxy.push(id);
                }
                continue;
            }
            assert_eq!(&frame[..2], &[0x80, 0x03], "SPDY version");
            let kind = u16::from_be_bytes([frame[2], frame[3]]);
            match kind {
                // SYN_STREAM: the next stream of the set, in order, odd ids.
                1 => {
                    let id = u32::from_be_bytes(body[..4].try_into().unwrap());
                    let n = log.streams.len();
                    assert!(n < kinds.len(), "more streams than the session needs");
                    assert_eq!(id, 2 * n as u32 + 1, "stream ids in order");
                    log.streams.push((id, kinds[n]));
                    if auto_reply {
                        log.reply(id, false, &tx);
                    }
                }
                // RST_STREAM from the proxy.
                3 => {
                    let id = u32::from_be_bytes(body[..4].try_into().unwrap());
                    log.fin_from_proxy.push(id);
                }
                // PING: answer the proxy's own (odd) pings.
                6 => {
                    let id = u32::from_be_bytes(body[..4].try_into().unwrap());
                    if auto_pong && id % 2 == 1 {
                        let _ = tx.send(PeerOut::Bytes(frame.clone()));
                    }
                }
                // GOAWAY, anything else: noted by nothing.
                _ => {}
            }
        }
    }
}

/// A Status on the error stream: well-formed ones a kubelet writes, and broken ones.
fn status_bytes(s: &mut Script<'_>) -> Vec<u8> {
    match s.byte() % 6 {
        0 => br#"{"metadata":{},"status":"Success"}"#.to_vec(),
        1 => format!(
            r#"{{"metadata":{{}},"status":"Failure","message":"command terminated with non-zero exit code: error executing command [sh], exit code {0}","reason":"NonZeroExitCode","details":{{"causes":[{{"reason":"ExitCode","message":"{0}"}}]}}}}"#,
            s.u16() % 300
        )
        .into_bytes(),
        2 => br#"{"metadata":{},"status":"Failure","message":"container not found","reason":"InternalError"}"#.to_vec(),
        3 => br#"{"status":"Failure","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"x"}]}}"#.to_vec(),
        4 => {
            // A valid one cut short.
            let full = br#"{"metadata":{},"status":"Success"}"#;
            full[..usize::from(s.byte()) % full.len()].to_vec()
        }
        _ => s.payload(48).to_vec(),
    }
}

/// Output: up to 199 bytes of the input, or a generated burst of up to 14 KiB.
fn output_bytes(s: &mut Script<'_>) -> Vec<u8> {
    let n = s.byte();
    if n < 200 {
        return s.take(usize::from(n)).to_vec();
    }
    let fill = s.byte();
    (0..usize::from(n - 199) * 256)
        .map(|i| fill.wrapping_add(i as u8))
        .collect()
}

/// A resize message's JSON: well-formed, several at once, or garbage.
fn resize_bytes(s: &mut Script<'_>) -> Vec<u8> {
    match s.byte() % 4 {
        0 => format!(r#"{{"Width":{},"Height":{}}}"#, s.u16(), s.u16()).into_bytes(),
        1 => format!(
            r#"{{"Width":{},"Height":{}}}{{"Width":{},"Height":{}}}"#,
            s.u16(),
            s.u16(),
            s.byte(),
            s.byte()
        )
        .into_bytes(),
        2 => format!(r#"{{"Width":{}"#, s.u32()).into_bytes(),
        _ => s.payload(32).to_vec(),
    }
}

async fn exec_case(data: &[u8]) {
    let mut s = Script::new(data);
    let (a, b) = (s.byte(), s.byte());
    let options = ExecOptions {
        stdin: a & 1 != 0,
        stdout: a & 2 != 0,
        stderr: a & 4 != 0,
        tty: a & 8 != 0,
        ..ExecOptions::default()
    };
    let version = [
        UpstreamVersion::V5,
        UpstreamVersion::V4,
        UpstreamVersion::V3,
        UpstreamVersion::V2,
        UpstreamVersion::V1,
    ][usize::from((a >> 4) & 7) % 5];
    let client_keepalive = (a & 0x80 != 0).then_some(Keepalive {
        interval: Duration::from_secs(30),
        timeout: Some(Duration::from_secs(10)),
    });
    let limits = SessionLimits {
        stdin_queue_messages: 2,
        close_drain_timeout: Duration::from_secs(10),
        idle_timeout: (b & 1 != 0).then_some(Duration::from_secs(60)),
    };
    let spdy = SpdyConfig {
        ping_interval: (b & 2 != 0).then_some(Duration::from_secs(5)),
        ping_timeout: (b & 4 != 0).then_some(Duration::from_secs(15)),
        stream_inbox_bytes: 1024,
        ..SpdyConfig::default()
    };
    let auto_reply = b & 8 == 0;
    let kubelet_pongs = b & 16 == 0;
    let polite = b & 32 == 0;
    let ending = b >> 6;

    let (client_io, server_io) = tokio::io::duplex(PIPE);
    let (proxy_up, kubelet_io) = tokio::io::duplex(PIPE);
    let mut client = ClientPeer::start(client_io, polite);
    let (up_tx, up_rx) = mpsc::unbounded_channel();
    let up_log = Arc::new(Mutex::new(UpLog::default()));
    let kinds = options.upstream_streams(version);
    let (kr, kw) = tokio::io::split(kubelet_io);
    let mut tasks = vec![
        tokio::spawn(peer_writer(kw, up_rx)),
        tokio::spawn(kubelet_reader(
            kr,
            up_log.clone(),
            up_tx.clone(),
            kinds.clone(),
            auto_reply,
            kubelet_pongs,
        )),
    ];
    let mut kubelet = Kubelet {
        tx: up_tx,
        log: up_log.clone(),
        well_behaved: true,
        shut_down: false,
    };

    let ws = WebSocket::new(
        server_io,
        WsConfig {
            max_message_size: 1024,
            keepalive: client_keepalive,
            memory: None,
        },
    );
    let stop = CancellationToken::new();
    let session = {
        let options = options.clone();
        // The session's own signal, fired when the proxy's is.
        let stop = kube_ws_proxy::session_stop::SessionStop::child_of(&stop);
        let limits = limits.clone();
        tokio::spawn(async move {
            let ready = options.ready_channel();
            let conn = Connection::client(proxy_up, Bytes::new(), spdy);
            // As the exec handler does: a setup failure is answered as a refused session.
            let opened =
                tokio::time::timeout(HANDSHAKE, open_streams(conn.clone(), version, &options))
                    .await;
            match opened {
                Ok(Ok(streams)) => {
                    let traffic = kube_ws_proxy::session_traffic::SessionTraffic::new();
                    run(ws, streams, ready, options.tty, &limits, stop, None, &traffic).await
                },
                Ok(Err(e)) => {
                    conn.close().await;
                    let status = Status::internal_error(&format!("error creating streams: {e}"));
                    refuse(ws, ready, status, &limits).await
                }
                Err(_) => {
                    conn.close().await;
                    refuse(ws, ready, Status::internal_error("timeout"), &limits).await
                }
            }
        })
    };

    // What the client sent on channel 0 before closing stdin.
    let mut stdin_sent = Vec::new();
    let mut stdin_closed = false;
    // The client sent bytes the script does not follow (any frame, garbage): channel 0 data
    // may have been among them, so only what came before can be checked.
    let mut stdin_unfollowed = false;
    // The client stayed within the protocol (no frame the proxy must reject).
    let mut client_clean = true;

    while !s.is_empty() && !session.is_finished() {
        let op = s.byte();
        match op % 32 {
            // Client events 0..=9 (pings, closes, raw frames, garbage, leaving, stalling).
            n @ 0..=9 => {
                client_action(n, &mut s, &mut client);
                stdin_unfollowed |= matches!(n, 3 | 4);
            }
            // stdin on channel 0.
            10 | 11 => {
                let payload = s.payload(64);
                if op % 32 == 11 && std::str::from_utf8(payload).is_err() {
                    // Not UTF-8 in a text message: 1007 is the right answer.
                    client_clean = false;
                }
                if !stdin_closed && !stdin_unfollowed {
                    stdin_sent.extend_from_slice(payload);
                }
                let mut msg = vec![0];
                msg.extend_from_slice(payload);
                // Text messages carry channels too (the Python client's stdin).
                client.send(client_message(if op % 32 == 10 { 0x2 } else { 0x1 }, &msg));
            }
            // Any channel byte, any payload.
            12 => {
                let channel = s.byte();
                if channel > 4 && channel != 255 {
                    client_clean = false;
                }
                let mut msg = vec![channel];
                msg.extend_from_slice(s.payload(16));
                if channel == 0 && !stdin_closed && !stdin_unfollowed {
                    stdin_sent.extend_from_slice(&msg[1..]);
                }
                if channel == 255 {
                    // A close signal of any shape: whatever it closes, stdin stops counting.
                    stdin_closed = true;
                    client_clean = false;
                }
                client.send(client_message(0x2, &msg));
            }
            // A terminal size on channel 4.
            13 => {
                let mut msg = vec![4];
                msg.extend(resize_bytes(&mut s));
                client.send(client_message(0x2, &msg));
            }
            // The v5 CLOSE signal, for any channel there is.
            14 => {
                let channel = s.byte() % 5;
                if channel == 0 {
                    stdin_closed = true;
                }
                client.send(client_message(0x2, &[255, channel]));
            }
            // A message in fragments, with a ping between them.
            15 => {
                let payload = s.payload(48);
                let mut msg = vec![0];
                msg.extend_from_slice(payload);
                if !stdin_closed && !stdin_unfollowed {
                    stdin_sent.extend_from_slice(payload);
                }
                let cut = usize::from(s.byte()) % msg.len();
                let mut out = Vec::new();
                session_harness::client_frame(0x02, &msg[..cut], false, &mut out);
                session_harness::client_frame(0x89, b"mid", false, &mut out);
                session_harness::client_frame(0x80, &msg[cut..], false, &mut out);
                client.send(out);
            }
            // The kubelet: SYN_REPLY for the nth stream (maybe with FIN).
            16 => {
                let n = s.byte();
                let id = kubelet.stream(n);
                let mut log = kubelet.log.lock().unwrap();
                if id == NO_STREAM || log.replied.contains(&id) {
                    kubelet.well_behaved = false;
                }
                log.reply(id, n & 0x80 != 0, &kubelet.tx);
            }
            // DATA on the nth stream.
            17 | 18 => {
                let n = s.byte();
                let id = kubelet.stream(n);
                let payload = s.payload(128);
                kubelet.data(id, n & 0x80 != 0, payload);
            }
            // stdout / stderr by kind (the common case): bytes of the input, or a burst that
            // fills the pipes.
            19 | 20 => {
                let kind = if op % 32 == 19 {
                    StreamKind::Stdout
                } else {
                    StreamKind::Stderr
                };
                let payload = output_bytes(&mut s);
                let id = kubelet.kind(kind);
                kubelet.data(id, false, &payload);
            }
            // A status on the error stream, maybe finished.
            21 => {
                let status = status_bytes(&mut s);
                let fin = s.byte() & 1 == 1;
                let id = kubelet.kind(StreamKind::Error);
                kubelet.data(id, fin, &status);
            }
            // RST_STREAM with any status.
            22 => {
                let id = kubelet.stream(s.byte());
                let status = u32::from(s.byte() % 13);
                kubelet.well_behaved = false;
                kubelet.log.lock().unwrap().ended_by_kubelet.push(id);
                let mut body = id.to_be_bytes().to_vec();
                body.extend_from_slice(&status.to_be_bytes());
                kubelet.send(control(3, 0, &body));
            }
            // GOAWAY.
            23 => {
                kubelet.well_behaved = false;
                let mut body = u32::from(s.byte() % 12).to_be_bytes().to_vec();
                body.extend_from_slice(&u32::from(s.byte() % 3).to_be_bytes());
                kubelet.send(control(7, 0, &body));
            }
            // PING from the kubelet (even ids are its own; odd ones pose as answers).
            24 => {
                let id = u32::from(s.byte());
                if id == 0 {
                    kubelet.well_behaved = false;
                }
                kubelet.send(control(6, 0, &id.to_be_bytes()));
            }
            // Any control frame: WINDOW_UPDATE, SETTINGS, HEADERS, unknown types, bad lengths.
            25 => {
                let kind = u16::from(s.byte() % 12);
                let flags = s.byte();
                let body = s.payload(24).to_vec();
                kubelet.well_behaved = false;
                kubelet.send(control(kind, flags, &body));
            }
            // Garbage bytes on the connection.
            26 => {
                kubelet.well_behaved = false;
                kubelet.send(s.payload(24).to_vec());
            }
            // The kubelet hangs up.
            27 => {
                kubelet.well_behaved = false;
                kubelet.shut_down = true;
                let _ = kubelet.tx.send(PeerOut::Shutdown);
            }
            // The command finishes with a status.
            28 => {
                let status = status_bytes(&mut s);
                kubelet.finish(&status);
            }
            // Time passes (up to ~25 s: pings, timeouts).
            29 => tokio::time::sleep(Duration::from_millis(u64::from(s.byte()) * 100)).await,
            30 => {
                for _ in 0..s.byte() % 8 {
                    tokio::task::yield_now().await;
                }
            }
            // The proxy shuts down.
            _ => stop.cancel(),
        }
        tokio::task::yield_now().await;
    }

    // The end: the client reads again (except when the proxy shuts down: a drain must end a
    // session whatever its client does), time passes, then one side leaves or finishes.
    if ending != 3 {
        client.set_mode(ReadMode::Reading);
    }
    let mut session = session;
    let mut ended = tokio::time::timeout(Duration::from_secs(30), &mut session)
        .await
        .ok();
    if ended.is_none() {
        match ending {
            0 => client.set_mode(ReadMode::Gone),
            1 => {
                kubelet.finish(br#"{"metadata":{},"status":"Success"}"#);
                // After a garbled frame the proxy cannot see the end: the kubelet then hangs
                // up, as a kubelet does once the command is over.
                ended = tokio::time::timeout(Duration::from_secs(30), &mut session)
                    .await
                    .ok();
                if ended.is_none() {
                    kubelet.well_behaved = false;
                    let _ = kubelet.tx.send(PeerOut::Shutdown);
                }
            }
            2 => {
                kubelet.well_behaved = false;
                let _ = kubelet.tx.send(PeerOut::Shutdown);
            }
            _ => stop.cancel(),
        }
        if ended.is_none() {
            ended = Some(
                tokio::time::timeout(Duration::from_secs(120), &mut session)
                    .await
                    .unwrap_or_else(|_| {
                        panic!("the session did not end within 120 s (virtual) of the ending ({ending})")
                    }),
            );
        }
    }
    let outcome = ended.expect("ended").expect("session task");

    // The harness's own tasks end once the proxy's pipe ends are gone.
    drop(kubelet.tx);
    let client_clean = client_clean && client.clean;
    let client_healthy = client.healthy() && !client.shut_down;
    let client_log = client.log.clone();
    tasks.append(&mut client.tasks);
    drop(client);
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("a peer's pipe never ended: the proxy kept it open")
            .expect("peer task");
    }

    check(
        &outcome,
        &client_log.lock().unwrap(),
        &up_log.lock().unwrap(),
        Ctx {
            version,
            options: &options,
            client_healthy,
            client_clean,
            polite,
            kubelet_well_behaved: kubelet.well_behaved,
            stdin_sent: &stdin_sent,
            stdin_unfollowed,
        },
    );
}

struct Ctx<'a> {
    version: UpstreamVersion,
    options: &'a ExecOptions,
    client_healthy: bool,
    client_clean: bool,
    polite: bool,
    kubelet_well_behaved: bool,
    stdin_sent: &'a [u8],
    /// `stdin_sent` ends where the client sent bytes the script does not follow.
    stdin_unfollowed: bool,
}

fn check(outcome: &Outcome, client: &session_harness::ClientLog, up: &UpLog, ctx: Ctx<'_>) {
    if session_harness::debug() {
        eprintln!(
            "outcome: {outcome:?}\nclient: {client:?}\nkubelet: streams {:?} got {:?} sent {:?}",
            up.streams, up.received, up.sent
        );
    }
    assert_eq!(
        client.after_close, 0,
        "frames after the proxy's close frame"
    );
    assert!(!up.data_after_fin, "stdin DATA after the proxy's FIN");
    let with_status = matches!(
        outcome.end,
        SessionEndKind::Completed
            | SessionEndKind::UpstreamRefused
            | SessionEndKind::Drained
            | SessionEndKind::UpstreamUnresponsive
            | SessionEndKind::IdleTimeout
            | SessionEndKind::RecordingFailed
    );
    assert_eq!(
        outcome.status.is_some(),
        with_status,
        "a status exactly when the end promises one: {outcome:?}"
    );

    // Split what the client got by channel.
    let ready = ctx.options.ready_channel().as_byte();
    let (mut stdout, mut stderr, mut statuses) = (Vec::new(), Vec::new(), Vec::new());
    for (i, (opcode, payload)) in client.messages.iter().enumerate() {
        assert_eq!(*opcode, 0x2, "text message to the client");
        if i == 0 {
            assert_eq!(
                payload.as_slice(),
                &[ready],
                "the first message is the ready one"
            );
            continue;
        }
        match payload.split_first() {
            Some((1, rest)) => stdout.extend_from_slice(rest),
            Some((2, rest)) => stderr.extend_from_slice(rest),
            Some((3, rest)) => statuses.push(rest.to_vec()),
            other => panic!("message on an unexpected channel: {other:?}"),
        }
    }
    assert!(statuses.len() <= 1, "more than one status");
    if let Some(status) = statuses.first() {
        let sent = outcome
            .status
            .as_ref()
            .expect("a status went out: Outcome says so");
        assert_eq!(
            status,
            &sent.to_json_bytes(),
            "channel 3 carries Outcome.status"
        );
    }

    // Outputs: in order, nothing invented.
    let sent_out = up.sent_on(StreamKind::Stdout);
    let sent_err = up.sent_on(StreamKind::Stderr);
    assert!(
        sent_out.starts_with(&stdout),
        "stdout is not a prefix of what the kubelet sent"
    );
    assert!(
        sent_err.starts_with(&stderr),
        "stderr is not a prefix of what the kubelet sent"
    );
    assert!(outcome.bytes_out >= (stdout.len() + stderr.len()) as u64);

    // stdin: in order, nothing invented, nothing after CLOSE.
    let stdin_up = up.received_on(StreamKind::Stdin);
    assert_forwarded(
        stdin_up,
        ctx.stdin_sent,
        !ctx.stdin_unfollowed,
        "the kubelet's stdin",
    );
    assert!(outcome.bytes_in >= stdin_up.len() as u64);

    if ctx.client_healthy {
        assert_eq!(
            outcome.bytes_out,
            (stdout.len() + stderr.len()) as u64,
            "bytes_out is what a reading client got"
        );
        if with_status {
            assert_eq!(
                statuses.len(),
                1,
                "a reading client gets the status: {outcome:?}"
            );
            let close = client
                .close
                .as_ref()
                .expect("a close frame after the status");
            assert_eq!(
                close.get(..2),
                Some(&[0x03, 0xe8][..]),
                "Close 1000 after the status"
            );
        }
        if outcome.end == SessionEndKind::ClientViolation {
            let close = client
                .close
                .as_ref()
                .expect("a violation is answered by a close frame");
            let code = u16::from_be_bytes([close[0], close[1]]);
            assert!(
                matches!(code, 1002 | 1007 | 1009),
                "violation close code {code}"
            );
        }
        if ctx.polite {
            assert_ne!(
                outcome.end,
                SessionEndKind::ClientUnresponsive,
                "a client answering every ping was declared unresponsive"
            );
        }
        if ctx.client_clean {
            assert_ne!(
                outcome.end,
                SessionEndKind::ClientViolation,
                "a client within the protocol was closed for a violation"
            );
        }
    }

    // A command that completed against a kubelet that did everything right, with a client
    // that read everything: all output arrived, and the status is the kubelet's.
    if outcome.end == SessionEndKind::Completed && ctx.kubelet_well_behaved && ctx.client_healthy {
        assert_eq!(stdout, sent_out, "stdout lost");
        assert_eq!(stderr, sent_err, "stderr lost");
        let error_id = up.id_of(StreamKind::Error);
        if error_id.is_some_and(|id| up.ended_by_kubelet.contains(&id)) {
            let want = from_upstream_error_stream(ctx.version, up.sent_on(StreamKind::Error), true);
            assert_eq!(outcome.status.as_ref(), Some(&want), "the kubelet's status");
        }
    }
}
