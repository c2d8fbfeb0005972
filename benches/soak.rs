//! Soak with fault injection: a churning mix of sessions through the proxy (a separate process,
//! as deployed) into the simulated cluster (a separate process too, so it can be killed and
//! frozen), for a given time, every session checking its bytes end to end and its exit code
//! (benches/common/soak_sessions.rs; `kubectl cp`'s tar archives among them). Meanwhile faults
//! are injected on a schedule, and the proxy's memory, descriptors, threads, runtime tasks and
//! `sessions_active` are sampled every second.
//!
//!     cargo bench --bench soak -- [--duration 3600] [--sessions 200] [--fault-every 30]
//!         [--faults upstream-kill,client-vanish,upstream-freeze,relay-delay,relay-stall,
//!                   client-stall,relay-reset,relay-truncate | none] [--bound 60] [--max-drift 5]
//!         [--audit] [--upload]
//!     cargo bench --bench soak -- --smoke        # 30 s, 12 sessions, a fault every 3 s (CI)
//!
//! `--audit` runs the proxy as security teams do: with the audit log (rotated every MiB
//! under load) and every exec recorded (`--record best-effort`). Every audit line must be JSON,
//! every started session must have its `ended` event, every recording must be valid asciicast
//! to its last line and named by an `ended` event, and no recording may fail (the disk is not
//! full). Recordings are checked and removed as sessions end (benches/common/soak_audit.rs).
//!
//! `--upload` (implies `--audit`; run by hand, not in CI) has the proxy upload its recordings
//! and audit batches to an S3-compatible store: moto's server (scripts/install-test-deps.sh;
//! `MOTO_SERVER` or its cache path) behind a forwarder, and adds the fault `store-restart`
//! (the forwarder down for 6 s, then up). Recordings are then checked as objects fetched from
//! the store, and at the end every one must be stored, the spool empty, and the audit batches
//! the log's lines.
//!
//! Faults, in turn: the cluster killed (SIGKILL) and restarted; the cluster frozen (SIGSTOP,
//! SIGCONT); a relay between proxy and cluster that delays every read by 50 ms, stops
//! forwarding, resets every connection (RST) or closes them mid-stream (FIN); a client that
//! vanishes mid-session (RST, no close frame); a client that stops reading mid-download. Each
//! lasts 6 s where it has a length; sessions in flight during one (plus 2 s) may fail. Each
//! fault has a bound (`Fault::bound`): 1 s where connections close or reset, the keepalive's
//! ping interval + timeout (5 s) where the cluster or a client stops answering. A session the
//! fault breaks must end within twice its bound (after the fault, or after its own start if
//! later), and a client fault's victim must be noticed and its pod process killed within twice
//! the bound too. The report says, per fault, how the sessions it broke ended (the HTTP
//! status, Status, close code or cut stream their client got) and how long the slowest took.
//! At the end the proxy is killed (SIGKILL) under load: every client must end promptly, and a
//! restarted proxy must serve at once.
//!
//! It fails (exit 1) when a session that no fault touched lost or changed a byte or got the
//! wrong exit code; when a session a fault touched got wrong bytes or a wrong exit code
//! without an error (silent corruption); when a session a fault broke ended later than twice
//! that fault's bound; when any session (touched or not) outlived `--bound`; when a vanished or
//! stalled client's pod process outlived twice its bound; when `sessions_active` does not
//! return to 0 or descriptors or runtime tasks are left behind; or (runs of 5 minutes and more) when the
//! proxy's memory grows more than `--max-drift` percent from the second quarter of the run to
//! the last.

#[allow(dead_code)]
#[path = "../tests/common/ws_client.rs"]
mod ws_client;

#[path = "common/process.rs"]
mod process;

#[path = "common/fault_relay.rs"]
mod fault_relay;

#[path = "common/soak_sessions.rs"]
mod soak_sessions;

#[path = "common/soak_audit.rs"]
mod soak_audit;

#[allow(dead_code)]
#[path = "../tests/common/s3.rs"]
mod s3;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fault_relay::{FaultRelay, RelayMode};
use futures_util::StreamExt;
use process::{free_port, open_fds, raise_fd_limit, rss_kib};
use soak_sessions::{Ending, Failure, Rng, Work, MIX};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

/// Client keepalive and upstream liveness of the proxy under test: a dead peer is noticed
/// within interval + timeout.
const PING_INTERVAL: Duration = Duration::from_secs(2);
const PING_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a fault lasts (freeze, stall), and how long after it sessions may still feel it.
const FAULT_LENGTH: Duration = Duration::from_secs(6);
const SETTLE: Duration = Duration::from_secs(2);

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

/// The faults, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Fault {
    UpstreamKill,
    UpstreamFreeze,
    RelayStall,
    RelayReset,
    RelayTruncate,
    RelayDelay,
    ClientVanish,
    ClientStall,
    /// `--upload`'s: the store unreachable (the forwarder in front of it down), then back.
    StoreRestart,
}

impl Fault {
    const ALL: [Fault; 8] = [
        Fault::UpstreamKill,
        Fault::ClientVanish,
        Fault::UpstreamFreeze,
        Fault::RelayDelay,
        Fault::RelayStall,
        Fault::ClientStall,
        Fault::RelayReset,
        Fault::RelayTruncate,
    ];

    fn name(self) -> &'static str {
        match self {
            Fault::UpstreamKill => "upstream-kill",
            Fault::UpstreamFreeze => "upstream-freeze",
            Fault::RelayStall => "relay-stall",
            Fault::RelayReset => "relay-reset",
            Fault::RelayTruncate => "relay-truncate",
            Fault::RelayDelay => "relay-delay",
            Fault::ClientVanish => "client-vanish",
            Fault::ClientStall => "client-stall",
            Fault::StoreRestart => "store-restart",
        }
    }

    /// How soon after the fault (or after its own start, if later) a session it breaks must
    /// end, by what the proxy promises: a closed or reset connection is seen at once; a frozen
    /// or stalled upstream by the upstream keepalive (ping interval + timeout) or, for an
    /// upgrade in flight, the handshake timeout (the same 5 s here); a vanished or stalled
    /// client by the client keepalive. The soak fails past twice this.
    fn bound(self) -> Duration {
        match self {
            // A store down touches no session (uploads wait): the bound is never used.
            Fault::UpstreamKill
            | Fault::RelayReset
            | Fault::RelayTruncate
            | Fault::StoreRestart => Duration::from_secs(1),
            Fault::UpstreamFreeze
            | Fault::RelayStall
            | Fault::RelayDelay
            | Fault::ClientVanish
            | Fault::ClientStall => PING_INTERVAL + PING_TIMEOUT,
        }
    }

    /// Whether it touches every session in flight (upstream and relay faults) rather than only
    /// its own victim.
    fn touches_everyone(self) -> bool {
        !matches!(
            self,
            Fault::ClientVanish | Fault::ClientStall | Fault::StoreRestart
        )
    }
}

/// One finished session.
struct Record {
    work: Work,
    start: Instant,
    end: Instant,
    result: Result<u64, Failure>,
    /// Outlived its bound (cancelled then).
    hung: bool,
}

/// One injected fault: when everyone could feel it.
struct Window {
    fault: Fault,
    start: Instant,
    end: Instant,
    /// For client faults: whether the victim's session and pod process ended in time.
    victim_ok: Option<Result<Duration, String>>,
}

/// One sample of the proxy.
#[derive(Clone, Copy)]
struct Sample {
    at: Duration,
    rss_kib: u64,
    fds: usize,
    threads: u64,
    /// Tasks alive on the proxy's runtime (its `kube_ws_proxy_runtime_tasks_alive`).
    tasks: f64,
    active: f64,
    /// With `--upload`: the oldest pending upload's age, seconds (the larger of the kinds).
    pending_age: f64,
}

/// The simulated cluster as its own process on a fixed port.
struct Cluster {
    port: u16,
    /// Its `TMPDIR`, where it keeps its pods' directories: the soak's own, removed at the end,
    /// since a cluster killed with SIGKILL cannot remove them itself.
    scratch: std::path::PathBuf,
    child: Child,
}

impl Cluster {
    fn start(port: u16, scratch: &std::path::Path) -> Cluster {
        let child = Command::new(env!("CARGO_BIN_EXE_kube-ws-proxy"))
            .args([
                "sim-cluster",
                "--exec-start-delay",
                "0",
                "--listen",
                &format!("127.0.0.1:{port}"),
            ])
            .env("TMPDIR", scratch)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the simulated cluster");
        wait_listening(port);
        Cluster {
            port,
            scratch: scratch.to_owned(),
            child,
        }
    }

    fn signal(&self, sig: libc::c_int) {
        // SAFETY: a plain kill(2) on our own child.
        unsafe {
            libc::kill(self.child.id() as i32, sig);
        }
    }

    fn kill_and_restart(&mut self, down_for: Duration) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::thread::sleep(down_for);
        *self = Cluster::start(self.port, &self.scratch.clone());
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.signal(libc::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The proxy under test, on fixed ports so that a restart serves the same address.
struct Proxy {
    addr: SocketAddr,
    admin: SocketAddr,
    upstream: SocketAddr,
    log: std::path::PathBuf,
    /// Arguments beyond the soak's own (`--audit`'s), and environment (`--upload`'s).
    extra: Vec<String>,
    env: Vec<(String, String)>,
    child: Child,
}

impl Proxy {
    fn start(
        addr: SocketAddr,
        admin: SocketAddr,
        upstream: SocketAddr,
        log: &std::path::Path,
        extra: &[String],
        env: &[(String, String)],
    ) -> Proxy {
        let ms = |d: Duration| format!("{}ms", d.as_millis());
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        // KUBE_WS_PROXY_BENCH_BIN: soak another build of the proxy (the cluster stays this one).
        let bin = std::env::var("KUBE_WS_PROXY_BENCH_BIN")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_kube-ws-proxy").to_owned());
        let child = Command::new(bin)
            .args([
                "--listen",
                &addr.to_string(),
                "--admin-listen",
                &admin.to_string(),
            ])
            .args([
                "--upstream",
                &format!("http://{upstream}"),
                "--log-format",
                "json",
            ])
            .args(["--client-ping-interval", &ms(PING_INTERVAL)])
            .args(["--client-ping-timeout", &ms(PING_TIMEOUT)])
            .args(["--upstream-ping-interval", &ms(PING_INTERVAL)])
            .args(["--upstream-ping-timeout", &ms(PING_TIMEOUT)])
            .args(["--handshake-timeout", "5s", "--max-sessions", "100000"])
            .args(extra)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("start kube-ws-proxy");
        wait_listening(addr.port());
        Proxy {
            addr,
            admin,
            upstream,
            log: log.to_owned(),
            extra: extra.to_vec(),
            env: env.to_vec(),
            child,
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A metric's value summed over its label sets.
    fn metric_sum(&self, name: &str) -> f64 {
        use std::io::{Read, Write};
        let Ok(mut s) = std::net::TcpStream::connect(self.admin) else {
            return f64::NAN;
        };
        let _ = write!(
            s,
            "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        );
        let mut text = String::new();
        let _ = s.read_to_string(&mut text);
        text.lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn restart(&mut self) {
        self.kill();
        *self = Proxy::start(
            self.addr,
            self.admin,
            self.upstream,
            &self.log,
            &self.extra,
            &self.env,
        );
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.kill();
    }
}

fn wait_listening(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn threads(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Whether a process still runs (a zombie does not).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            let state = s[s.rfind(')').map_or(0, |i| i + 2)..].chars().next();
            state != Some('Z')
        })
        .unwrap_or(false)
}

/// An echo service for the port-forwards.
async fn echo_service() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((c, _)) = l.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = c.into_split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
    port
}

/// A victim of a client fault: a v5 exec whose pod process prints its pid first; the
/// WebSocket and that pid.
async fn victim(proxy: SocketAddr, command: &str) -> Result<(ws_client::Ws, i32), String> {
    let script = format!("echo $$; exec {command}");
    let path = ws_client::exec_path("soak", &["sh", "-c", &script], true, true, false);
    let (mut ws, _) = ws_client::connect(proxy, &path, "v5.channel.k8s.io")
        .await
        .map_err(|e| format!("upgrade: {e}"))?;
    let mut out = Vec::new();
    while !out.contains(&b'\n') {
        match tokio::time::timeout(Duration::from_secs(10), ws.next()).await {
            Ok(Some(Ok(tokio_tungstenite::tungstenite::Message::Binary(d))))
                if d.first() == Some(&1) =>
            {
                out.extend_from_slice(&d[1..])
            }
            Ok(Some(Ok(_))) => {}
            other => return Err(format!("no pid: {other:?}")),
        }
    }
    let line = String::from_utf8_lossy(&out);
    let pid = line
        .lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .ok_or_else(|| format!("no pid in {line:?}"))?;
    Ok((ws, pid))
}

/// Waits until `pid` is gone; how long that took.
async fn wait_gone(pid: i32, bound: Duration) -> Result<Duration, String> {
    let start = Instant::now();
    while alive(pid) {
        if start.elapsed() > bound {
            return Err(format!("pod process {pid} still runs after {bound:?}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(start.elapsed())
}

/// Injects one fault; for a client fault, checks that its victim was cleaned up.
async fn inject(
    fault: Fault,
    cluster: &Arc<Mutex<Cluster>>,
    relay: &FaultRelay,
    store: Option<&s3::Forwarder>,
    proxy: SocketAddr,
) -> Option<Result<Duration, String>> {
    let detect = 2 * fault.bound();
    match fault {
        Fault::UpstreamKill => {
            let cluster = cluster.clone();
            tokio::task::spawn_blocking(move || {
                cluster
                    .lock()
                    .unwrap()
                    .kill_and_restart(Duration::from_secs(2))
            })
            .await
            .unwrap();
            None
        }
        Fault::UpstreamFreeze => {
            cluster.lock().unwrap().signal(libc::SIGSTOP);
            tokio::time::sleep(FAULT_LENGTH).await;
            cluster.lock().unwrap().signal(libc::SIGCONT);
            None
        }
        Fault::RelayStall => {
            relay.set(RelayMode::Stall);
            tokio::time::sleep(FAULT_LENGTH).await;
            relay.set(RelayMode::Pass);
            None
        }
        Fault::RelayReset => {
            relay.reset_all();
            None
        }
        Fault::StoreRestart => {
            if let Some(store) = store {
                store.down();
                tokio::time::sleep(FAULT_LENGTH).await;
                store.up();
            }
            None
        }
        Fault::RelayTruncate => {
            relay.truncate_all();
            None
        }
        Fault::RelayDelay => {
            relay.set(RelayMode::Delay(Duration::from_millis(50)));
            tokio::time::sleep(FAULT_LENGTH).await;
            relay.set(RelayMode::Pass);
            None
        }
        Fault::ClientVanish => Some(
            async {
                let (ws, pid) = victim(proxy, "cat").await?;
                // RST, no close frame: a client process killed or a laptop gone.
                ws.get_ref().set_zero_linger().map_err(|e| e.to_string())?;
                drop(ws);
                wait_gone(pid, detect).await
            }
            .await,
        ),
        Fault::ClientStall => Some(
            async {
                let (ws, pid) = victim(proxy, "head -c 4000000000 /dev/zero").await?;
                // Holds the connection open and reads nothing more: its pongs stop too.
                let gone = wait_gone(pid, detect).await;
                drop(ws);
                gone
            }
            .await,
        ),
    }
}

/// moto's server: `MOTO_SERVER`, else where scripts/install-test-deps.sh puts it.
fn moto_server() -> std::path::PathBuf {
    std::env::var_os("MOTO_SERVER")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            let home = std::path::PathBuf::from(std::env::var_os("HOME")?);
            Some(home.join(".cache/kube-ws-proxy/moto/bin/moto_server"))
        })
        .filter(|p| p.is_file())
        .expect("--upload needs moto_server: run scripts/install-test-deps.sh or set MOTO_SERVER")
}

fn median(v: &mut [u64]) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    v[v.len() / 2]
}

fn main() {
    let smoke = std::env::args().any(|a| a == "--smoke");
    let duration = Duration::from_secs(
        arg("--duration")
            .and_then(|v| v.parse().ok())
            .unwrap_or(if smoke { 30 } else { 600 }),
    );
    let sessions: usize = arg("--sessions")
        .and_then(|v| v.parse().ok())
        .unwrap_or(if smoke { 12 } else { 200 });
    let fault_every = Duration::from_secs(
        arg("--fault-every")
            .and_then(|v| v.parse().ok())
            .unwrap_or(if smoke { 3 } else { 30 }),
    );
    let upload = std::env::args().any(|a| a == "--upload");
    let faults: Vec<Fault> = match arg("--faults") {
        Some(list) if list == "none" => Vec::new(),
        Some(list) => list
            .split(',')
            .map(|n| {
                *Fault::ALL
                    .iter()
                    .chain(upload.then_some(&Fault::StoreRestart))
                    .find(|f| f.name() == n)
                    .unwrap_or_else(|| panic!("unknown fault {n}"))
            })
            .collect(),
        // The store's restart second, so that the smoke run has it too.
        None if upload => {
            let mut all = Fault::ALL.to_vec();
            all.insert(1, Fault::StoreRestart);
            all
        }
        None => Fault::ALL.to_vec(),
    };
    let bound = Duration::from_secs(arg("--bound").and_then(|v| v.parse().ok()).unwrap_or(60));
    let max_drift: f64 = arg("--max-drift")
        .and_then(|v| v.parse().ok())
        .unwrap_or(5.0);
    let audited = upload || std::env::args().any(|a| a == "--audit");
    raise_fd_limit();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let cluster_scratch = tempfile::tempdir().unwrap();
    let scratch = cluster_scratch.path().to_owned();
    let failed = rt.block_on(async move {
        let cluster = Arc::new(Mutex::new(Cluster::start(free_port(), &scratch)));
        let sim_addr: SocketAddr = format!("127.0.0.1:{}", cluster.lock().unwrap().port).parse().unwrap();
        let relay = FaultRelay::start(sim_addr).await;
        // SOAK_KEEP_LOGS=1: keep the proxy's log (and the audit directory) to read after a failure.
        let keep = std::env::var_os("SOAK_KEEP_LOGS").is_some();
        let dir = tempfile::Builder::new().disable_cleanup(keep).tempdir().unwrap();
        if keep {
            println!("proxy log and audit directory kept in {}", dir.path().display());
        }
        let log = dir.path().join("proxy.log");
        let proxy_addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let audit_dir = dir.path().join("audit");
        // `--upload`: moto, the forwarder the faults take down in front of it, the bucket.
        let (_moto, store_forwarder, uploads) = if upload {
            let server = s3::S3Server::start(&moto_server()).await;
            let forwarder = Arc::new(s3::Forwarder::start(server.addr).await);
            let target = format!("s3://{}", soak_audit::BUCKET);
            let store = s3::bucket(&server.endpoint(), &target).await;
            let uploads = soak_audit::Uploads { store: Arc::new(store), server: server.addr };
            (Some(server), Some(forwarder), Some(uploads))
        } else {
            (None, None, None)
        };
        let audit = audited.then(|| soak_audit::Audit::start(&audit_dir, uploads.clone()));
        let mut extra = if audited { soak_audit::Audit::proxy_args(&audit_dir) } else { Vec::new() };
        let mut env = Vec::new();
        if let Some(f) = &store_forwarder {
            extra.extend(soak_audit::Uploads::proxy_args(&f.endpoint()));
            env.extend(s3::AWS_ENV.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        }
        let proxy = Arc::new(Mutex::new(Proxy::start(proxy_addr, admin, relay.addr, &log, &extra, &env)));
        let pid = proxy.lock().unwrap().pid();
        let pod_echo = echo_service().await;
        println!(
            "soak: {duration:?}, {sessions} sessions at once, faults every {fault_every:?}: {}{}",
            faults.iter().map(|f| f.name()).collect::<Vec<_>>().join(","),
            match (audited, upload) {
                (_, true) => "; audit log and recordings on, uploaded to a store",
                (true, false) => "; audit log and recordings on",
                _ => "",
            }
        );

        // Warm-up: one of each, then the baseline of an idle proxy.
        let mut rng = Rng::new(1);
        for work in MIX {
            if let Err(e) = soak_sessions::run(work, proxy_addr, pod_echo, &mut rng).await {
                panic!("warm-up {}: {e}", work.name());
            }
        }
        let active = |p: &Arc<Mutex<Proxy>>| p.lock().unwrap().metric_sum("kube_ws_proxy_sessions_active");
        let wait_idle = |p: Arc<Mutex<Proxy>>| async move {
            let start = Instant::now();
            while active(&p) != 0.0 && start.elapsed() < Duration::from_secs(30) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            active(&p)
        };
        wait_idle(proxy.clone()).await;
        let baseline_fds = open_fds(pid);
        let tasks = |p: &Arc<Mutex<Proxy>>| p.lock().unwrap().metric_sum("kube_ws_proxy_runtime_tasks_alive");
        let baseline_tasks = tasks(&proxy);
        let baseline_rss = rss_kib(pid);

        let started = Instant::now();
        let stop_at = started + duration;
        let records = Arc::new(Mutex::new(Vec::<Record>::new()));
        let windows = Arc::new(Mutex::new(Vec::<Window>::new()));
        let samples = Arc::new(Mutex::new(Vec::<Sample>::new()));

        let sampler = {
            let samples = samples.clone();
            let proxy = proxy.clone();
            tokio::spawn(async move {
                while Instant::now() < stop_at {
                    // One lock at a time: a guard in the literal would live to its end.
                    let tasks = proxy.lock().unwrap().metric_sum("kube_ws_proxy_runtime_tasks_alive");
                    let active = proxy.lock().unwrap().metric_sum("kube_ws_proxy_sessions_active");
                    let pending_age = if upload {
                        let age = |kind: &str| {
                            proxy.lock().unwrap().metric_sum(&format!(
                                "kube_ws_proxy_upload_oldest_pending_seconds{{kind=\"{kind}\"}}"
                            ))
                        };
                        age("recording").max(age("audit"))
                    } else {
                        0.0
                    };
                    let sample = Sample {
                        at: started.elapsed(),
                        rss_kib: rss_kib(pid),
                        fds: open_fds(pid),
                        threads: threads(pid),
                        tasks,
                        active,
                        pending_age,
                    };
                    samples.lock().unwrap().push(sample);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            })
        };
        let injector = {
            let windows = windows.clone();
            let cluster = cluster.clone();
            let relay = relay.clone();
            let faults = faults.clone();
            let store = store_forwarder.clone();
            tokio::spawn(async move {
                if faults.is_empty() || fault_every.is_zero() {
                    return;
                }
                let mut next = faults.iter().cycle();
                loop {
                    tokio::time::sleep(fault_every).await;
                    if Instant::now() + FAULT_LENGTH + SETTLE >= stop_at {
                        return;
                    }
                    let fault = *next.next().unwrap();
                    let start = Instant::now();
                    let victim_ok =
                        inject(fault, &cluster, &relay, store.as_deref(), proxy_addr).await;
                    windows.lock().unwrap().push(Window {
                        fault,
                        start,
                        end: Instant::now(),
                        victim_ok,
                    });
                }
            })
        };
        let workers: Vec<_> = (0..sessions)
            .map(|w| {
                let records = records.clone();
                tokio::spawn(async move {
                    let mut rng = Rng::new(1000 + w as u64);
                    let mut i = w;
                    while Instant::now() < stop_at {
                        let work = MIX[i % MIX.len()];
                        i += 1;
                        let start = Instant::now();
                        let run = soak_sessions::run(work, proxy_addr, pod_echo, &mut rng);
                        let (result, hung) = match tokio::time::timeout(bound, run).await {
                            Ok(r) => (r, false),
                            Err(_) => (
                                Err(Failure {
                                    ending: Ending::Dropped,
                                    detail: format!("still running after {bound:?}"),
                                }),
                                true,
                            ),
                        };
                        let failed = result.is_err();
                        records.lock().unwrap().push(Record {
                            work,
                            start,
                            end: Instant::now(),
                            result,
                            hung,
                        });
                        // A failed session (a fault) is not retried at once in a tight loop.
                        if failed {
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                    }
                })
            })
            .collect();
        for w in workers {
            w.await.unwrap();
        }
        injector.await.unwrap();
        sampler.await.unwrap();
        let ran_for = started.elapsed();
        let left_active = wait_idle(proxy.clone()).await;
        // With uploads, the uploader holds a task per file until it is stored: those the
        // last store restart delayed wait for their retry.
        if upload {
            let pending = |p: &Arc<Mutex<Proxy>>| {
                p.lock().unwrap().metric_sum("kube_ws_proxy_upload_pending_files")
            };
            let start = Instant::now();
            while pending(&proxy) != 0.0 && start.elapsed() < Duration::from_secs(60) {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        // Idle pooled connections to the cluster may still be open; give them back first.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let end_fds = open_fds(pid);
        let end_tasks = tasks(&proxy);
        let end_rss = rss_kib(pid);
        // Once the proxy's memory trim (every 10 s by default) has run since the load ended.
        tokio::time::sleep(Duration::from_secs(10)).await;
        let settled_rss = rss_kib(pid);
        // Before the proxy is killed: a killed proxy leaves its sessions without `ended`.
        let audited = match audit {
            Some(a) => {
                // With uploads, a file that failed during the last store restart waits for its
                // retry (its backoff doubles from 1 s).
                let wait = Duration::from_secs(if upload { 60 } else { 15 });
                let metric = |name: &str| proxy.lock().unwrap().metric_sum(name);
                Some(a.finish(wait, metric).await)
            }
            None => None,
        };

        // The proxy killed under load: every client ends promptly, a restart serves at once.
        let kill = kill_under_load(&proxy, pod_echo).await;

        // The verdict.
        let records = std::mem::take(&mut *records.lock().unwrap());
        let windows = std::mem::take(&mut *windows.lock().unwrap());
        let samples = std::mem::take(&mut *samples.lock().unwrap());
        // The fault a session felt: of those in flight while it ran (or just before it
        // started), the last to begin before it ended.
        let hit_by = |r: &Record| {
            windows
                .iter()
                .filter(|w| {
                    w.fault.touches_everyone() && r.start <= w.end + SETTLE && r.end >= w.start
                })
                .max_by_key(|w| w.start)
        };
        let mut by_work: BTreeMap<&str, (u64, u64, u64, u64)> = BTreeMap::new();
        let mut lost = Vec::new();
        let mut hung = Vec::new();
        let mut silent = Vec::new();
        let mut slow = Vec::new();
        let mut bytes = 0u64;
        /// Per fault: sessions it touched that finished exact, those that failed by how they
        /// ended, the longest a failed one took to end after the fault (or its own start), and
        /// how many failed ones took more than 1 s and more than 2 s.
        #[derive(Default)]
        struct Felt {
            exact: u64,
            failed: BTreeMap<String, u64>,
            slowest: Duration,
            over_1s: u64,
            over_2s: u64,
        }
        let mut felt: BTreeMap<Fault, Felt> = BTreeMap::new();
        for r in &records {
            let e = by_work.entry(r.work.name()).or_default();
            e.0 += 1;
            let window = hit_by(r);
            match (&r.result, window) {
                (Ok(b), _) => {
                    e.1 += 1;
                    bytes += b;
                    if let Some(w) = window {
                        felt.entry(w.fault).or_default().exact += 1;
                    }
                }
                (Err(err), Some(w)) => {
                    e.2 += 1;
                    let f = felt.entry(w.fault).or_default();
                    *f.failed.entry(err.ending.label()).or_default() += 1;
                    let took = r.end.saturating_duration_since(w.start.max(r.start));
                    f.slowest = f.slowest.max(took);
                    f.over_1s += u64::from(took > Duration::from_secs(1));
                    f.over_2s += u64::from(took > Duration::from_secs(2));
                    let at = r.start - started;
                    if !err.ending.explained() {
                        silent.push(format!("{} at {at:?} ({}): {err}", r.work.name(), w.fault.name()));
                    }
                    if took > 2 * w.fault.bound() {
                        slow.push(format!(
                            "{} at {at:?} ended {:.1} s after {} (bound {:?}): {err}",
                            r.work.name(),
                            took.as_secs_f64(),
                            w.fault.name(),
                            w.fault.bound()
                        ));
                    }
                }
                (Err(err), None) => {
                    e.3 += 1;
                    lost.push(format!("{} at {:?}: {err}", r.work.name(), r.start - started));
                }
            }
            if r.hung {
                hung.push(format!("{} at {:?}", r.work.name(), r.start - started));
            }
        }
        println!("\n| session | run | ok | failed, touched by a fault | failed, untouched |");
        println!("|---|---|---|---|---|");
        for (name, (n, ok, hit, bad)) in &by_work {
            println!("| {name} | {n} | {ok} | {hit} | {bad} |");
        }
        let mut fault_counts: BTreeMap<Fault, (u64, Vec<String>)> = BTreeMap::new();
        let mut victims_failed = Vec::new();
        for w in &windows {
            let e = fault_counts.entry(w.fault).or_default();
            e.0 += 1;
            match &w.victim_ok {
                Some(Ok(took)) => e.1.push(format!("{:.1}", took.as_secs_f64())),
                Some(Err(err)) => victims_failed.push(format!("{}: {err}", w.fault.name())),
                None => {}
            }
        }
        println!("\n| fault | injected | bound | touched, exact | touched, failed: how they ended | slowest failed end after the fault | failed ended > 1 s, > 2 s after it | victim's pod process gone after |");
        println!("|---|---|---|---|---|---|---|---|");
        for (fault, (n, took)) in &fault_counts {
            let f = felt.remove(fault).unwrap_or_default();
            let how = f
                .failed
                .iter()
                .map(|(label, n)| format!("{n} × {label}"))
                .collect::<Vec<_>>()
                .join("; ");
            let slowest = if f.failed.is_empty() {
                "–".to_string()
            } else {
                format!("{:.1} s", f.slowest.as_secs_f64())
            };
            let victims = if took.is_empty() {
                "–".to_string()
            } else {
                format!("{} s", took.join(", "))
            };
            println!(
                "| {} | {n} | {:?} | {} | {} | {slowest} | {}, {} | {victims} |",
                fault.name(),
                fault.bound(),
                f.exact,
                if how.is_empty() { "–".into() } else { how },
                f.over_1s,
                f.over_2s,
            );
        }
        let quarter = |from: f64, to: f64| {
            let mut v: Vec<u64> = samples
                .iter()
                .filter(|s| {
                    let f = s.at.as_secs_f64() / ran_for.as_secs_f64();
                    f >= from && f < to
                })
                .map(|s| s.rss_kib)
                .collect();
            median(&mut v)
        };
        let (rss_q2, rss_q4) = (quarter(0.25, 0.5), quarter(0.75, 1.01));
        // The trend over the run, a tenth at a time: a leak climbs steadily, an allocator
        // settling steps up and stays.
        let tenths: Vec<String> = (0..10)
            .map(|t| format!("{}", quarter(t as f64 / 10.0, (t + 1) as f64 / 10.0 + 0.001)))
            .collect();
        let drift = if rss_q2 > 0 {
            100.0 * (rss_q4 as f64 - rss_q2 as f64) / rss_q2 as f64
        } else {
            0.0
        };
        let max_fds = samples.iter().map(|s| s.fds).max().unwrap_or(0);
        let max_threads = samples.iter().map(|s| s.threads).max().unwrap_or(0);
        let max_tasks = samples.iter().map(|s| s.tasks).fold(0.0, f64::max);
        let max_active = samples.iter().map(|s| s.active as u64).max().unwrap_or(0);
        println!("\n| proxy | value |");
        println!("|---|---|");
        println!("| ran for | {:.0} s |", ran_for.as_secs_f64());
        println!("| sessions | {} ({:.1}/s), {:.1} GB checked |", records.len(), records.len() as f64 / ran_for.as_secs_f64(), bytes as f64 / 1e9);
        println!("| sessions active, most | {max_active} |");
        println!("| RSS idle before → idle after (2 s, 12 s) | {baseline_rss} → {end_rss}, {settled_rss} KiB |");
        println!("| RSS median, 2nd quarter → last quarter | {rss_q2} → {rss_q4} KiB ({drift:+.1}%) |");
        println!("| RSS median per tenth of the run, KiB | {} |", tenths.join(" → "));
        println!("| descriptors idle before → idle after (most under load) | {baseline_fds} → {end_fds} ({max_fds}) |");
        println!("| threads, most | {max_threads} |");
        if upload {
            let max_age = samples.iter().map(|s| s.pending_age).fold(0.0, f64::max);
            println!("| oldest pending upload, most | {max_age:.0} s |");
        }
        println!("| runtime tasks idle before → idle after (most under load) | {baseline_tasks} → {end_tasks} ({max_tasks}) |");
        println!("| sessions_active after the run | {left_active} |");
        println!("| proxy SIGKILLed under load | {} |", match &kill {
            Ok(r) => r.clone(),
            Err(e) => format!("FAILED: {e}"),
        });

        let mut failures = Vec::new();
        if !lost.is_empty() {
            failures.push(format!("{} untouched sessions failed: {lost:#?}", lost.len()));
        }
        if !silent.is_empty() {
            failures.push(format!("{} sessions got wrong bytes without an error: {silent:#?}", silent.len()));
        }
        if !slow.is_empty() {
            failures.push(format!("{} failed sessions outlived twice their fault's bound: {slow:#?}", slow.len()));
        }
        if !hung.is_empty() {
            failures.push(format!("{} sessions outlived {bound:?}: {hung:?}", hung.len()));
        }
        if !victims_failed.is_empty() {
            failures.push(format!("victims not cleaned up: {victims_failed:?}"));
        }
        if left_active != 0.0 {
            failures.push(format!("sessions_active is {left_active} after the run"));
        }
        // Slack: the pool's idle connections to the cluster, the admin connection.
        // Slack as for descriptors: a pooled connection holds a task too.
        if end_tasks.is_nan() || end_tasks > baseline_tasks + 16.0 {
            failures.push(format!("runtime tasks: {baseline_tasks} before, {end_tasks} after"));
        }
        if end_fds > baseline_fds + 16 {
            failures.push(format!("descriptors: {baseline_fds} before, {end_fds} after"));
        }
        if ran_for >= Duration::from_secs(300) && drift > max_drift && rss_q4 > rss_q2 + 4096 {
            failures.push(format!("memory grew {drift:+.1}% from the 2nd quarter to the last"));
        }
        if let Err(e) = &kill {
            failures.push(format!("kill -9 under load: {e}"));
        }
        if let Some(verdict) = &audited {
            failures.extend(verdict.report());
        }
        for f in &failures {
            println!("FAILED: {f}");
        }
        if failures.is_empty() {
            println!("\nsoak passed");
        }
        !failures.is_empty()
    });
    soak_sessions::remove_tar_fixture();
    drop(cluster_scratch);
    if failed {
        std::process::exit(1);
    }
}

/// Kills the proxy with SIGKILL while sessions run (idle `cat` execs, a port-forward moving
/// data): every client must see its session end within a few seconds (no hang), and the
/// restarted proxy must serve a session at once.
async fn kill_under_load(proxy: &Arc<Mutex<Proxy>>, pod_echo: u16) -> Result<String, String> {
    let addr = proxy.lock().unwrap().addr;
    let mut clients = Vec::new();
    for _ in 0..8 {
        let (ws, _pid) = victim(addr, "cat").await?;
        clients.push(ws);
    }
    // A forwarded connection in the middle of a transfer.
    let tunnel = tokio::spawn(async move {
        let mut rng = Rng::new(7);
        let _ = soak_sessions::run(Work::PortForward, addr, pod_echo, &mut rng).await;
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.lock().unwrap().kill();
    let killed = Instant::now();
    let ends = clients.into_iter().map(|mut ws| async move {
        tokio::time::timeout(Duration::from_secs(5), async {
            while let Some(Ok(_)) = ws.next().await {}
        })
        .await
    });
    let ended = futures_util::future::join_all(ends).await;
    let hung = ended.iter().filter(|e| e.is_err()).count();
    if hung > 0 {
        return Err(format!(
            "{hung} of 8 clients still waiting 5 s after the kill"
        ));
    }
    if tokio::time::timeout(Duration::from_secs(5), tunnel)
        .await
        .is_err()
    {
        return Err("the port-forward client still waiting 5 s after the kill".into());
    }
    let all_ended = killed.elapsed();
    let p = proxy.clone();
    tokio::task::spawn_blocking(move || p.lock().unwrap().restart())
        .await
        .unwrap();
    let restarted = Instant::now();
    let mut rng = Rng::new(8);
    soak_sessions::run(Work::Stdout, addr, pod_echo, &mut rng)
        .await
        .map_err(|e| format!("first session after the restart: {e}"))?;
    soak_sessions::run(Work::PortForward, addr, pod_echo, &mut rng)
        .await
        .map_err(|e| format!("first port-forward after the restart: {e}"))?;
    Ok(format!(
        "8 execs and a port-forward ended within {:.2} s; restarted and served in {:.2} s",
        all_ended.as_secs_f64(),
        restarted.elapsed().as_secs_f64()
    ))
}
