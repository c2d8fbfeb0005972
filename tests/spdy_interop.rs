//! Interop: our SPDY/3.1 client (`kube_ws_proxy::spdy`) against a foreign server built on Go's
//! spdystream, the library Kubernetes itself uses (tests/interop/spdy_peer/main.go).
//!
//! The Go peer is built once per test binary with the Debian-packaged spdystream sources (GOPATH
//! mode, offline). Each test starts its own peer process, reads `LISTEN <addr>` from its stdout,
//! upgrades a TCP connection with our HTTP/1.1 handshake and drives one scenario, chosen by the
//! `scenario` header of the SYN_STREAM.
//!
//! Without `go` or the spdystream sources the tests are skipped with a note, unless `CI` is
//! `true` or `1`, where that is a failure. `KUBE_WS_PROXY_GO` names the go binary to use and
//! `KUBE_WS_PROXY_GOPATH` the GOPATH holding spdystream (default `/usr/share/gocode`).

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Method};
use kube_ws_proxy::spdy::frame::{HeaderBlock, RstStatus};
use kube_ws_proxy::spdy::proto::{Config, Connection, Error, RecvStream, SessionEnd};
use kube_ws_proxy::spdy::upgrade::{upgrade, UpgradeRequest};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

const MIB: usize = 1024 * 1024;
/// Period of the Go peer's download pattern: byte `i` is `i % 251`.
const CYCLE: usize = 251;
/// The Go peer writes downloads in writes of this size, one DATA frame each.
const PEER_CHUNK: usize = 4 * MIB;
/// Time limit for every scenario but the 1 GiB download.
const LIMIT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------
// Building and starting the Go peer.

fn ci() -> bool {
    matches!(std::env::var("CI").as_deref(), Ok("true") | Ok("1"))
}

/// Skips (returns `None`) with a note, or panics under CI.
fn unavailable(why: &str) -> Option<PathBuf> {
    if ci() {
        panic!("spdy interop test cannot run: {why} (required because CI is set)");
    }
    eprintln!("note: skipping spdy interop test: {why}");
    None
}

/// The built peer, or `None` if the tests are to be skipped. Built once per test binary.
pub(crate) fn peer_binary() -> Option<&'static Path> {
    static PEER: OnceLock<Option<PathBuf>> = OnceLock::new();
    PEER.get_or_init(build_peer).as_deref()
}

fn build_peer() -> Option<PathBuf> {
    let go = std::env::var_os("KUBE_WS_PROXY_GO").unwrap_or_else(|| "go".into());
    let gopath = std::env::var_os("KUBE_WS_PROXY_GOPATH")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/share/gocode"));
    let library = gopath.join("src/github.com/moby/spdystream/connection.go");
    if !library.is_file() {
        return unavailable(&format!(
            "spdystream sources not found at {} (Debian: golang-github-docker-spdystream-dev)",
            library.display()
        ));
    }
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/spdy_peer");
    let out_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("spdy_interop");
    let binary = out_dir.join("spdy_peer");
    // Built under a per-process name and renamed into place, so concurrent test runs never
    // write into an executable another run is starting.
    let fresh = out_dir.join(format!("spdy_peer.{}", std::process::id()));
    let started = Instant::now();
    let output = std::process::Command::new(&go)
        .arg("build")
        .arg("-o")
        .arg(&fresh)
        .arg(".")
        .current_dir(&source)
        // GOPATH mode against the packaged sources: no module download, no network.
        .env("GO111MODULE", "off")
        .env("GOPATH", &gopath)
        .env("GOCACHE", out_dir.join("gocache"))
        .env("GOFLAGS", "")
        .env("GOPROXY", "off")
        .env("GOTOOLCHAIN", "local")
        .output();
    match output {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            unavailable(&format!("{} not found", go.to_string_lossy()))
        }
        Err(e) => panic!("running {}: {e}", go.to_string_lossy()),
        Ok(o) if !o.status.success() => panic!(
            "building the Go spdystream peer failed ({}):\n{}{}",
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
        Ok(_) => {
            std::fs::rename(&fresh, &binary).expect("moving the built Go peer into place");
            eprintln!("built Go spdystream peer in {:?}", started.elapsed());
            Some(binary)
        }
    }
}

/// A running Go peer; killed when dropped (and it exits by itself once its stdin closes).
struct Peer {
    addr: SocketAddr,
    _child: Child,
}

impl Peer {
    /// Starts a peer, or `None` if the tests are skipped.
    async fn start() -> Option<Peer> {
        let binary = tokio::task::spawn_blocking(peer_binary)
            .await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))?;
        let mut child = Command::new(binary)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("starting the Go peer");
        let stdout = child.stdout.take().unwrap();
        let line = tokio::time::timeout(
            Duration::from_secs(10),
            BufReader::new(stdout).lines().next_line(),
        )
        .await
        .expect("Go peer did not print LISTEN within 10 s")
        .expect("reading the Go peer's stdout")
        .expect("Go peer exited before printing LISTEN");
        let addr = line
            .strip_prefix("LISTEN ")
            .and_then(|a| a.trim().parse().ok())
            .unwrap_or_else(|| panic!("unexpected first line from the Go peer: {line:?}"));
        Some(Peer {
            addr,
            _child: child,
        })
    }

    /// A new TCP connection, upgraded to SPDY/3.1, with a client session on it.
    async fn connect(&self) -> Connection {
        let tcp = TcpStream::connect(self.addr).await.unwrap();
        tcp.set_nodelay(true).unwrap();
        let request = UpgradeRequest {
            method: Method::POST,
            path_and_query: "/api/v1/namespaces/default/pods/interop/exec?command=true".into(),
            host: self.addr.to_string(),
            headers: HeaderMap::new(),
            protocols: vec!["v4.channel.k8s.io".into(), "v3.channel.k8s.io".into()],
        };
        let upgraded = upgrade(tcp, &request).await.expect("upgrade to SPDY/3.1");
        assert_eq!(upgraded.protocol.as_deref(), Some("v4.channel.k8s.io"));
        // Default config: our periodic pings run against spdystream throughout.
        Connection::client(upgraded.io, upgraded.leftover, Config::default())
    }
}

/// Starts a peer or returns from the test (skip).
macro_rules! peer_or_skip {
    () => {
        match Peer::start().await {
            Some(peer) => peer,
            None => return,
        }
    };
}

// ---------------------------------------------------------------------------------------------
// Helpers.

async fn within<T>(limit: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, fut).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: did not finish within {limit:?}"),
    }
}

fn scenario(name: &str) -> HeaderBlock {
    let mut h = HeaderBlock::new();
    h.push("scenario", name);
    h
}

/// Everything until the stream ends; a session error fails the test.
async fn read_all(rx: &mut RecvStream) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(chunk) = rx.recv().await {
        out.extend_from_slice(&chunk.expect("stream ended with a session error"));
    }
    out
}

/// Deterministic pseudo-random bytes (xorshift64*), different for every seed.
fn random_bytes(state: &mut u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        *state ^= *state >> 12;
        *state ^= *state << 25;
        *state ^= *state >> 27;
        out.extend_from_slice(&state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(len);
    out
}

fn pattern_block() -> &'static [u8] {
    static BLOCK: OnceLock<Vec<u8>> = OnceLock::new();
    BLOCK.get_or_init(|| (0..64 * 1024 + CYCLE).map(|i| (i % CYCLE) as u8).collect())
}

/// Checks that `data` is the download pattern starting at absolute offset `pos`.
fn check_pattern(pos: u64, data: &[u8]) {
    let block = pattern_block();
    let mut off = 0;
    while off < data.len() {
        let start = ((pos + off as u64) % CYCLE as u64) as usize;
        let n = (data.len() - off).min(block.len() - CYCLE);
        if data[off..off + n] != block[start..start + n] {
            let bad = (0..n).find(|&i| data[off + i] != block[start + i]).unwrap();
            panic!(
                "download pattern broken at byte {}: got {}, want {}",
                pos + (off + bad) as u64,
                data[off + bad],
                block[start + bad]
            );
        }
        off += n;
    }
}

struct Downloaded {
    bytes: u64,
    largest_chunk: usize,
    was_reset: bool,
    elapsed: Duration,
}

/// Downloads `total` bytes from the peer, checking the pattern as it arrives (nothing is kept).
async fn download(conn: &Connection, total: u64) -> Downloaded {
    let mut headers = scenario("download");
    headers.push("bytes", total.to_string());
    let started = Instant::now();
    let stream = conn.open_stream(headers).await.expect("open download");
    let (_tx, mut rx) = stream.split();
    let mut pos = 0u64;
    let mut largest_chunk = 0;
    while let Some(chunk) = rx.recv().await {
        let chunk = chunk.expect("download ended with a session error");
        check_pattern(pos, &chunk);
        largest_chunk = largest_chunk.max(chunk.len());
        pos += chunk.len() as u64;
        assert!(pos <= total, "more bytes than asked for");
    }
    Downloaded {
        bytes: pos,
        largest_chunk,
        was_reset: rx.was_reset(),
        elapsed: started.elapsed(),
    }
}

/// Sends `data` on a new echo stream in `piece`-sized sends, finishes, and returns what came
/// back. Sending and receiving run concurrently: without flow control, an echo whose reader
/// waits for the writer would stall both sides once the socket buffers fill.
async fn echo(conn: &Connection, headers: HeaderBlock, data: Bytes, piece: usize) -> Vec<u8> {
    let stream = conn.open_stream(headers).await.expect("open echo");
    let (mut tx, mut rx) = stream.split();
    let sender = tokio::spawn(async move {
        let mut rest = data;
        while !rest.is_empty() {
            let part = rest.split_to(rest.len().min(piece));
            tx.send(part).await.expect("echo send");
        }
        tx.finish().await.expect("echo finish");
    });
    let got = read_all(&mut rx).await;
    sender.await.unwrap();
    assert!(!rx.was_reset(), "echo stream was reset");
    got
}

// ---------------------------------------------------------------------------------------------
// Scenarios.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_round_trip_with_half_close() {
    let peer = peer_or_skip!();
    within(LIMIT, "echo", async {
        let conn = peer.connect().await;
        let stream = conn.open_stream(scenario("echo")).await.unwrap();
        // spdystream's SYN_REPLY reflects our headers: its compressed block decodes.
        assert_eq!(stream.headers().get("scenario"), Some(&b"echo"[..]));
        let (mut tx, mut rx) = stream.split();
        tx.send(Bytes::from_static(b"hello ")).await.unwrap();
        tx.send(Bytes::from_static(b"world")).await.unwrap();
        tx.finish().await.unwrap();
        assert_eq!(read_all(&mut rx).await, b"hello world");
        assert!(!rx.was_reset());

        // A larger payload in uneven pieces on a second stream of the same session.
        let data = Bytes::from(random_bytes(&mut 7, 3 * MIB + 123));
        let got = echo(&conn, scenario("echo"), data.clone(), 100_003).await;
        assert!(got == data, "echoed bytes differ");
        assert!(conn.end_reason().is_none(), "{:?}", conn.end_reason());
        conn.close().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_echo_streams() {
    let peer = peer_or_skip!();
    within(LIMIT, "concurrent echo", async {
        let conn = peer.connect().await;
        let mut tasks = Vec::new();
        for i in 0..8u64 {
            let conn = conn.clone();
            tasks.push(tokio::spawn(async move {
                let data = Bytes::from(random_bytes(&mut (i + 100), 2 * MIB + i as usize));
                let got = echo(&conn, scenario("echo"), data.clone(), 64 * 1024).await;
                assert!(got == data, "stream {i}: echoed bytes differ");
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert!(conn.end_reason().is_none(), "{:?}", conn.end_reason());
        conn.close().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn download_64_mib_verified() {
    let peer = peer_or_skip!();
    within(LIMIT, "64 MiB download", async {
        let conn = peer.connect().await;
        let total = 64 * MIB as u64;
        let d = download(&conn, total).await;
        assert_eq!(d.bytes, total);
        assert!(!d.was_reset, "download ended with a reset");
        // spdystream sent 4 MiB DATA frames; each arrives whole.
        assert_eq!(d.largest_chunk, PEER_CHUNK);
        eprintln!("64 MiB download in {:?}", d.elapsed);
        conn.close().await;
    })
    .await;
}

/// spdystream never sends WINDOW_UPDATE: a client honouring the 64 KiB initial window would
/// stall here. 1 GiB is streamed and checked without being held in memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn download_1_gib_without_stall() {
    let peer = peer_or_skip!();
    within(Duration::from_secs(300), "1 GiB download", async {
        let conn = peer.connect().await;
        let total = 1024 * MIB as u64;
        let d = download(&conn, total).await;
        assert_eq!(d.bytes, total);
        assert!(!d.was_reset, "download ended with a reset");
        eprintln!(
            "1 GiB download in {:?} ({:.0} MiB/s)",
            d.elapsed,
            1024.0 / d.elapsed.as_secs_f64()
        );
        // The session is still healthy afterwards.
        within(Duration::from_secs(10), "ping after download", conn.ping())
            .await
            .unwrap();
        conn.close().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upload_256_mib_checksum_matches() {
    let peer = peer_or_skip!();
    within(LIMIT, "256 MiB upload", async {
        let conn = peer.connect().await;
        let total = 256 * MIB;
        let stream = conn.open_stream(scenario("upload")).await.unwrap();
        let (mut tx, mut rx) = stream.split();
        let started = Instant::now();
        let mut hasher = Sha256::new();
        let mut state = 0x5eed_u64;
        let mut sent = 0;
        let mut i = 0;
        while sent < total {
            // Mostly uneven 1 MiB pieces; one 20 MiB send is split into a maximum-size
            // (16 MiB - 1) DATA frame and the rest.
            let want = if i == 3 { 20 * MIB } else { MIB - 13 };
            let piece = Bytes::from(random_bytes(&mut state, want.min(total - sent)));
            hasher.update(&piece);
            sent += piece.len();
            tx.send(piece).await.unwrap();
            i += 1;
        }
        tx.finish().await.unwrap();
        let answer = String::from_utf8(read_all(&mut rx).await).unwrap();
        let want = format!("{total} {:x}", hasher.finalize());
        assert_eq!(answer, want, "Go's count and sha256 differ from ours");
        assert!(!rx.was_reset());
        eprintln!("256 MiB upload in {:?}", started.elapsed());
        conn.close().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_after_data() {
    let peer = peer_or_skip!();
    within(LIMIT, "reset", async {
        let conn = peer.connect().await;
        let stream = conn.open_stream(scenario("reset")).await.unwrap();
        let (_tx, mut rx) = stream.split();
        // Data sent before the RST_STREAM is delivered, then the stream ends as reset.
        assert_eq!(read_all(&mut rx).await, b"before-reset");
        assert!(rx.was_reset(), "stream should report the peer's reset");
        // Only the stream ended, not the session.
        let got = echo(&conn, scenario("echo"), Bytes::from_static(b"still up"), 64).await;
        assert_eq!(got, b"still up");
        conn.close().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_scenario_is_refused() {
    let peer = peer_or_skip!();
    within(LIMIT, "refused stream", async {
        let conn = peer.connect().await;
        match conn.open_stream(scenario("no-such-scenario")).await {
            Err(Error::StreamReset(RstStatus::RefusedStream)) => {}
            other => panic!("expected RST_STREAM REFUSED_STREAM, got {other:?}"),
        }
        let got = echo(
            &conn,
            scenario("echo"),
            Bytes::from_static(b"after refusal"),
            64,
        )
        .await;
        assert_eq!(got, b"after refusal");
        conn.close().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pings_in_both_directions() {
    let peer = peer_or_skip!();
    within(LIMIT, "pings", async {
        let conn = peer.connect().await;
        // spdystream pings us (even id) and reports whether our echo came back.
        let stream = conn.open_stream(scenario("ping")).await.unwrap();
        let (_tx, mut rx) = stream.split();
        let answer = String::from_utf8(read_all(&mut rx).await).unwrap();
        assert_eq!(answer, "pong-ok");
        // And spdystream answers ours (odd ids).
        for _ in 0..3 {
            let rtt = within(Duration::from_secs(10), "our ping", conn.ping())
                .await
                .expect("ping to spdystream");
            assert!(rtt < Duration::from_secs(5), "rtt {rtt:?}");
        }
        conn.close().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn goaway_from_peer() {
    let peer = peer_or_skip!();
    within(LIMIT, "goaway", async {
        let conn = peer.connect().await;
        let stream = conn.open_stream(scenario("goaway")).await.unwrap();
        let (mut tx, mut rx) = stream.split();
        assert_eq!(read_all(&mut rx).await, b"bye");
        assert!(!rx.was_reset(), "the stream was finished before GOAWAY");

        // GOAWAY follows the FIN on the wire; our reader may not have handled it yet.
        let deadline = Instant::now() + Duration::from_secs(5);
        while !conn.is_going_away() {
            assert!(Instant::now() < deadline, "GOAWAY not seen within 5 s");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }

        // No new streams after GOAWAY: an error at once, not a wait for a SYN_REPLY.
        match within(
            Duration::from_secs(5),
            "open after GOAWAY",
            conn.open_stream(scenario("echo")),
        )
        .await
        {
            Err(Error::GoingAway(_) | Error::SessionClosed(_)) => {}
            other => panic!("open_stream after GOAWAY: {other:?}"),
        }

        // Our FIN ends spdystream's last stream, so it closes the socket: a clean end.
        tx.finish().await.unwrap();
        let end = within(Duration::from_secs(15), "session end", conn.closed()).await;
        assert!(
            matches!(end, SessionEnd::GoAway(_)),
            "session ended with {end:?}"
        );
        assert!(end.is_clean());
    })
    .await;
}

/// SPDY/3 compresses every header block of a session with one zlib stream. Our compressor uses
/// a small (2^10) window; Go's standard inflater must accept it block after block, and ours
/// must inflate Go's replies the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_compression_across_many_streams() {
    let peer = peer_or_skip!();
    within(LIMIT, "header compression", async {
        let conn = peer.connect().await;
        let token = "x".repeat(600);
        for i in 0..50 {
            let mut headers = scenario("echo");
            headers.push("streamtype", ["stdin", "stdout", "stderr", "error"][i % 4]);
            headers.push("seq", i.to_string());
            headers.push("x-token", format!("{token}{i}"));
            if i % 7 == 0 {
                // A second value for one name (NUL-joined on the wire).
                headers.push("x-multi", "a");
                headers.push("x-multi", format!("b{i}"));
            }
            let stream = conn.open_stream(headers).await.unwrap();
            let reply = stream.headers();
            assert_eq!(
                reply.get("seq"),
                Some(i.to_string().as_bytes()),
                "stream {i}"
            );
            assert_eq!(reply.get("x-token"), Some(format!("{token}{i}").as_bytes()));
            if i % 7 == 0 {
                let multi: Vec<&[u8]> = reply.get_all("x-multi").collect();
                assert_eq!(multi, [&b"a"[..], format!("b{i}").as_bytes()], "stream {i}");
            }
            let (mut tx, mut rx) = stream.split();
            let payload = format!("payload {i}");
            tx.send(Bytes::from(payload.clone())).await.unwrap();
            tx.finish().await.unwrap();
            assert_eq!(read_all(&mut rx).await, payload.as_bytes());
        }
        assert!(conn.end_reason().is_none(), "{:?}", conn.end_reason());
        conn.close().await;
    })
    .await;
}

/// `release_header_contexts` drops zlib state once no more streams will be opened; streams
/// already open keep working in both directions, and so do pings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_survive_header_context_release() {
    let peer = peer_or_skip!();
    within(LIMIT, "header context release", async {
        let conn = peer.connect().await;
        let mut echoes = Vec::new();
        for _ in 0..3 {
            echoes.push(conn.open_stream(scenario("echo")).await.unwrap());
        }
        let mut headers = scenario("download");
        headers.push("bytes", (16 * MIB).to_string());
        let download = conn.open_stream(headers).await.unwrap();

        conn.release_header_contexts();

        let mut tasks = Vec::new();
        for (i, stream) in echoes.into_iter().enumerate() {
            tasks.push(tokio::spawn(async move {
                let (mut tx, mut rx) = stream.split();
                let data = Bytes::from(random_bytes(&mut (i as u64 + 900), MIB));
                let expected = data.clone();
                let reader = tokio::spawn(async move { read_all(&mut rx).await });
                tx.send(data).await.unwrap();
                tx.finish().await.unwrap();
                assert!(reader.await.unwrap() == expected, "echo {i} differs");
            }));
        }
        let (_tx, mut rx) = download.split();
        let mut pos = 0u64;
        while let Some(chunk) = rx.recv().await {
            let chunk = chunk.unwrap();
            check_pattern(pos, &chunk);
            pos += chunk.len() as u64;
        }
        assert_eq!(pos, 16 * MIB as u64);
        assert!(!rx.was_reset());
        for t in tasks {
            t.await.unwrap();
        }
        within(Duration::from_secs(10), "ping after release", conn.ping())
            .await
            .unwrap();
        assert!(conn.end_reason().is_none(), "{:?}", conn.end_reason());
        conn.close().await;
    })
    .await;
}
