//! What the session fuzz targets share: the byte script, a paused-clock runtime reused across
//! iterations, and a WebSocket client peer that writes masked frames and reads (and checks) the
//! proxy's frames on an in-memory pipe.

#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream, ReadHalf, WriteHalf};
use tokio::runtime::Runtime;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

/// Size of each in-memory pipe: small, so backpressure and partial writes happen.
pub const PIPE: usize = 8 * 1024;

thread_local! {
    /// One runtime for every iteration: building one costs more than a whole session.
    static RUNTIME: Runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime");
}

/// Runs one iteration on the shared runtime and checks that it left no task behind.
pub fn run_case<F: std::future::Future<Output = ()>>(case: F) {
    RUNTIME.with(|rt| {
        rt.block_on(case);
        rt.block_on(async {
            // Give detached tasks (the SPDY session's close grace) their time to finish.
            for _ in 0..60 {
                if rt.metrics().num_alive_tasks() == 0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
        assert_eq!(
            rt.metrics().num_alive_tasks(),
            0,
            "tasks still alive 30 s (virtual) after the session ended"
        );
    });
}

/// Whether to print each case's outcome (`SESSION_FUZZ_DEBUG=1`, for checking the seeds).
pub fn debug() -> bool {
    static DEBUG: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *DEBUG.get_or_init(|| std::env::var_os("SESSION_FUZZ_DEBUG").is_some())
}

/// The fuzz input, read front to back; an exhausted script reads zeros.
pub struct Script<'a> {
    data: &'a [u8],
}

impl<'a> Script<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Script { data }
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    pub fn byte(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.byte(), self.byte()])
    }

    pub fn u32(&mut self) -> u32 {
        u32::from_be_bytes([self.byte(), self.byte(), self.byte(), self.byte()])
    }

    /// Up to `n` bytes (fewer at the end of the input).
    pub fn take(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.data.len());
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        head
    }

    /// A length byte (below `max`), then that many bytes.
    pub fn payload(&mut self, max: u8) -> &'a [u8] {
        let len = self.byte() % max;
        self.take(usize::from(len))
    }
}

const KEY: [u8; 4] = [0x37, 0xfa, 0x21, 0x3d];

/// A client frame: `b0` (FIN, RSV and opcode) and the payload, masked unless `unmasked`.
pub fn client_frame(b0: u8, payload: &[u8], unmasked: bool, out: &mut Vec<u8>) {
    out.push(b0);
    let mask_bit = if unmasked { 0 } else { 0x80 };
    match payload.len() {
        n @ 0..=125 => out.push(mask_bit | n as u8),
        n @ 126..=0xFFFF => {
            out.push(mask_bit | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(mask_bit | 127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    if unmasked {
        out.extend_from_slice(payload);
    } else {
        out.extend_from_slice(&KEY);
        out.extend(payload.iter().enumerate().map(|(i, b)| b ^ KEY[i % 4]));
    }
}

/// A masked client message with the FIN bit.
pub fn client_message(opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 6);
    client_frame(0x80 | opcode, payload, false, &mut out);
    out
}

/// What the client peer does with its writing side.
pub enum PeerOut {
    Bytes(Vec<u8>),
    /// Half-close: EOF to the proxy, still reading.
    Shutdown,
    /// The peer is gone: the writing half is dropped.
    Drop,
}

/// Whether the client peer reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadMode {
    Reading,
    Stalled,
    /// The client is gone: its reading half is dropped.
    Gone,
}

/// What the client peer saw from the proxy.
#[derive(Debug, Default)]
pub struct ClientLog {
    /// Data messages in order: (opcode, payload).
    pub messages: Vec<(u8, Vec<u8>)>,
    /// The proxy's close frame payload, if one came.
    pub close: Option<Vec<u8>>,
    /// Frames that came after the proxy's close frame.
    pub after_close: usize,
    /// Pings the proxy sent.
    pub pings: usize,
    /// The connection ended (EOF) while the client was reading.
    pub eof: bool,
    /// The client sent a close frame of its own (so it does not echo the proxy's).
    pub sent_close: bool,
}

/// The client end of the proxy's WebSocket.
pub struct ClientPeer {
    pub tx: mpsc::UnboundedSender<PeerOut>,
    pub mode: watch::Sender<ReadMode>,
    pub log: Arc<Mutex<ClientLog>>,
    pub tasks: Vec<JoinHandle<()>>,
    /// The client ever stopped reading or left.
    pub ever_stalled: bool,
    pub gone: bool,
    pub shut_down: bool,
    /// Everything the client sent was within RFC 6455 (nothing the proxy must reject).
    pub clean: bool,
}

impl ClientPeer {
    /// Starts the client's reader and writer on `io`. A polite client answers pings and echoes
    /// the proxy's close frame.
    pub fn start(io: DuplexStream, polite: bool) -> ClientPeer {
        let (rd, wr) = tokio::io::split(io);
        let (tx, rx) = mpsc::unbounded_channel();
        let (mode, mode_rx) = watch::channel(ReadMode::Reading);
        let log = Arc::new(Mutex::new(ClientLog::default()));
        let tasks = vec![
            tokio::spawn(peer_writer(wr, rx)),
            tokio::spawn(client_reader(rd, log.clone(), mode_rx, tx.clone(), polite)),
        ];
        ClientPeer {
            tx,
            mode,
            log,
            tasks,
            ever_stalled: false,
            gone: false,
            shut_down: false,
            clean: true,
        }
    }

    pub fn send(&self, bytes: Vec<u8>) {
        let _ = self.tx.send(PeerOut::Bytes(bytes));
    }

    pub fn set_mode(&mut self, mode: ReadMode) {
        if self.gone {
            return;
        }
        match mode {
            ReadMode::Stalled => self.ever_stalled = true,
            ReadMode::Gone => {
                self.ever_stalled = true;
                self.gone = true;
                let _ = self.tx.send(PeerOut::Drop);
            }
            ReadMode::Reading => {}
        }
        let _ = self.mode.send(mode);
    }

    pub fn shutdown(&mut self) {
        self.shut_down = true;
        let _ = self.tx.send(PeerOut::Shutdown);
    }

    /// The client read everything the proxy sent, to the end, and never stopped reading.
    pub fn healthy(&self) -> bool {
        !self.ever_stalled && !self.gone
    }
}

/// Writes what a peer (the client, or the tunnel's upstream) sends to the proxy, in order.
pub async fn peer_writer(
    mut wr: WriteHalf<DuplexStream>,
    mut rx: mpsc::UnboundedReceiver<PeerOut>,
) {
    while let Some(out) = rx.recv().await {
        match out {
            PeerOut::Bytes(b) => {
                if wr.write_all(&b).await.is_err() {
                    return;
                }
            }
            PeerOut::Drop => return,
            PeerOut::Shutdown => {
                let _ = wr.shutdown().await;
                // Keep the half until the client is gone: dropping both halves ends the pipe.
                while let Some(out) = rx.recv().await {
                    if let PeerOut::Drop = out {
                        return;
                    }
                }
                return;
            }
        }
    }
}

async fn client_reader(
    mut rd: ReadHalf<DuplexStream>,
    log: Arc<Mutex<ClientLog>>,
    mut mode: watch::Receiver<ReadMode>,
    tx: mpsc::UnboundedSender<PeerOut>,
    polite: bool,
) {
    let mut buf = Vec::with_capacity(PIPE);
    let mut chunk = [0u8; 2048];
    loop {
        let current = *mode.borrow_and_update();
        match current {
            ReadMode::Gone => return,
            ReadMode::Stalled => {
                if mode.changed().await.is_err() {
                    return;
                }
                continue;
            }
            ReadMode::Reading => {}
        }
        let n = tokio::select! {
            n = rd.read(&mut chunk) => n,
            _ = mode.changed() => continue,
        };
        let n = match n {
            Ok(0) | Err(_) => {
                log.lock().unwrap().eof = true;
                return;
            }
            Ok(n) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        while let Some((head_len, len)) = parse_server_head(&buf) {
            if buf.len() < head_len + len {
                break;
            }
            let b0 = buf[0];
            let payload = buf[head_len..head_len + len].to_vec();
            buf.drain(..head_len + len);
            // The proxy never fragments and never sets RSV bits.
            assert_eq!(
                b0 & 0xF0,
                0x80,
                "server frame with FIN unset or RSV bits: {b0:#x}"
            );
            let opcode = b0 & 0x0F;
            let mut log = log.lock().unwrap();
            if log.close.is_some() {
                log.after_close += 1;
                continue;
            }
            match opcode {
                0x1 | 0x2 => log.messages.push((opcode, payload)),
                0x8 => {
                    if polite && !log.sent_close {
                        log.sent_close = true;
                        let code = payload.get(..2).unwrap_or(&[]).to_vec();
                        let _ = tx.send(PeerOut::Bytes(client_message(0x8, &code)));
                    }
                    log.close = Some(payload);
                }
                0x9 => {
                    log.pings += 1;
                    if polite {
                        let _ = tx.send(PeerOut::Bytes(client_message(0xA, &payload)));
                    }
                }
                0xA => {}
                other => panic!("server frame with opcode {other:#x}"),
            }
        }
    }
}

/// Head length and payload length of a server frame, once its head is complete. Server frames
/// must be unmasked, and control frames short.
fn parse_server_head(buf: &[u8]) -> Option<(usize, usize)> {
    if buf.len() < 2 {
        return None;
    }
    assert_eq!(buf[1] & 0x80, 0, "masked server frame");
    let (head_len, len) = match buf[1] & 0x7F {
        126 => {
            if buf.len() < 4 {
                return None;
            }
            (4, u16::from_be_bytes([buf[2], buf[3]]) as usize)
        }
        127 => {
            if buf.len() < 10 {
                return None;
            }
            let len = u64::from_be_bytes(buf[2..10].try_into().unwrap());
            assert!(len < 1 << 31, "absurd server frame length {len}");
            (10, len as usize)
        }
        n => (2, n as usize),
    };
    if buf[0] & 0x08 != 0 {
        assert!(len <= 125, "control frame of {len} bytes");
    }
    Some((head_len, len))
}

/// One client action from the script, common to both targets. Returns false when the opcode is
/// not a client action.
pub fn client_action(op: u8, s: &mut Script<'_>, client: &mut ClientPeer) -> bool {
    match op {
        // A ping (payload up to 125 bytes allowed; up to 130 tried).
        0 => {
            let payload = s.payload(131);
            client.clean &= payload.len() <= 125;
            client.send(client_message(0x9, payload));
        }
        // An unsolicited pong.
        1 => client.send(client_message(0xA, s.payload(8))),
        // A close frame: empty, a code, a code and reason, or a malformed one byte.
        2 => {
            let payload = match s.byte() % 4 {
                0 => Vec::new(),
                1 => s.u16().to_be_bytes().to_vec(),
                2 => {
                    let mut p = s.u16().to_be_bytes().to_vec();
                    p.extend_from_slice(s.payload(16));
                    p
                }
                _ => vec![s.byte()],
            };
            // Codes and reasons may be invalid: a violation is a fair answer.
            client.clean = false;
            client.log.lock().unwrap().sent_close = true;
            client.send(client_message(0x8, &payload));
        }
        // Any frame at all: any first byte, masked or not.
        3 => {
            client.clean = false;
            let b0 = s.byte();
            let unmasked = s.byte() & 1 == 1;
            let mut out = Vec::new();
            client_frame(b0, s.payload(40), unmasked, &mut out);
            client.send(out);
        }
        // Garbage (and truncated frames).
        4 => {
            client.clean = false;
            client.send(s.payload(16).to_vec());
        }
        // A frame head announcing a huge length.
        5 => {
            client.clean = false;
            let mut out = vec![0x82, 0xFF];
            out.extend_from_slice(&s.u32().to_be_bytes());
            out.extend_from_slice(&s.u32().to_be_bytes());
            out.extend_from_slice(&KEY);
            client.send(out);
        }
        6 => client.shutdown(),
        7 => client.set_mode(ReadMode::Gone),
        8 => client.set_mode(ReadMode::Stalled),
        9 => client.set_mode(ReadMode::Reading),
        _ => return false,
    }
    true
}

/// Checks that what a peer `got` is what the script `sent` and nothing else: a prefix of it, or,
/// when the script lost track (`followed` false: the client sent raw frames or garbage, which
/// may carry data too), the same bytes as far as both go.
pub fn assert_forwarded(got: &[u8], sent: &[u8], followed: bool, what: &str) {
    if followed {
        assert!(
            sent.starts_with(got),
            "{what}: not a prefix of what was sent"
        );
    } else {
        let n = got.len().min(sent.len());
        assert_eq!(&got[..n], &sent[..n], "{what}: reordered or lost");
    }
}
