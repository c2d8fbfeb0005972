//! What recording exec sessions (`--record`) costs: exec stdout throughput through a proxy
//! that records and one that does not, interleaved (A B A B …), for terminal-like text and for
//! NUL bytes (the worst case for asciicast: each becomes a six-character JSON escape). The
//! recording proxy writes its files to a temporary directory on the same disk. Idle memory with
//! recording on is measured by the idle-memory bench (`--recording-both`).
//!
//!     cargo bench --bench recording -- [--bytes 268435456] [--rounds 5] [--only text|NUL]
//!         [--client kubectl] [--fresh-pages] [--policy best-effort|required]
//!
//! `--policy required` records with `--record required`, where output reaches the client only
//! within 64 KiB of what the recording has written (the default is `best-effort`, which never
//! waits for the writer). Recording's cost is judged by the proxy's CPU seconds per GiB; the
//! wall-clock ratio is shown but is no target (on 2 shared cores the file write itself is the
//! floor).
//!
//! Page cache: a round's recording is removed just before the next recorded run, so the new
//! file's page cache reuses the pages the old one freed, as on a node whose memory is in use
//! (its page cache comes from reclaimed pages). A first round that is not counted leaves the
//! first such file. `--fresh-pages` removes each recording right after its run instead, so by
//! the next recorded run its pages are free memory again: on a virtual machine that reports
//! free pages to its host (virtio-balloon free page reporting, as this project's machines do)
//! every page of the next file is then faulted in afresh by the host, which costs the kernel
//! several times the copy itself (`dd` of 1 GiB: 0.22 CPU s when it reuses just-freed pages,
//! 1.3–1.9 s after a few seconds' pause).
//!
//! The client is the project's own WebSocket client by default, which reads as fast as the
//! proxy sends: the worst case for a recorder. `--client kubectl` runs kubectl 1.33 instead
//! (`kubectl exec`, translated to SPDY), its stdout read and counted by the bench: what a user
//! sees. Its times include kubectl's start (reading its kubeconfig, getting the pod), the same
//! for both proxies.
//!
//! `--echo` measures what recording does to a person typing instead: one terminal session
//! (tty) echoes a byte through `cat` every 20 ms while `--bulk` other sessions (4 by default)
//! pour out text as fast as they can, through each proxy in turn; it reports the echo's round
//! trips. A recording proxy whose writer is behind makes sessions wait for its byte budget,
//! and an echo must not wait behind the others' bulk output. (The recording proxy's writer
//! rests after each write while someone types: `recording::typing`.)
//!
//!     cargo bench --bench recording -- --echo [--bulk 4] [--rounds 3] [--only NUL]
//!
//! `--upload` adds a third proxy that records and uploads each recording once its session ends
//! (`--record-upload` to moto's S3-compatible server, started by the bench as the tests start
//! it: `MOTO_SERVER`, else scripts/install-test-deps.sh's venv). Its CPU is read once the
//! recording has left the spool (stored, then removed), so it includes reading the file back,
//! signing and sending it; the store is emptied after each run. Plain HTTP to loopback: the
//! SDK then signs the payload's SHA-256, reading the file twice; `--upload-tls` serves the
//! store over TLS (a CA of the bench's own, `--s3-ca-file`), as a production store is reached,
//! where the payload is not hashed (TLS guards it) but encrypted.
//!
//! `KUBE_WS_PROXY_BENCH_BIN` runs another build of the proxy (both the recording one and the
//! one that does not record), for a before/after comparison.
//!
//! Not a test: nothing here asserts on time.

#[allow(dead_code)]
#[path = "../tests/common/ws_client.rs"]
mod ws_client;

#[allow(dead_code)]
#[path = "common/workloads.rs"]
mod workloads;

#[path = "common/process.rs"]
mod process;

#[allow(dead_code)]
#[path = "../tests/common/clients.rs"]
mod clients;

#[allow(dead_code)]
#[path = "../tests/common/s3.rs"]
mod s3;

#[allow(dead_code)]
#[path = "../tests/common/pki.rs"]
mod pki;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use kube_ws_proxy::sim::{SimCluster, SimConfig};
use process::cpu_seconds;
use tokio::net::TcpStream;

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// A proxy process in front of `upstream` with `extra` flags; killed on drop.
struct Proxy {
    child: std::process::Child,
    addr: SocketAddr,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn proxy(upstream: &str, extra: &[&str]) -> Proxy {
    proxy_env(upstream, extra, &[]).await
}

/// [`proxy`] with its environment added to.
async fn proxy_env(upstream: &str, extra: &[&str], env: &[(&str, &str)]) -> Proxy {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // Another build of the proxy (a before/after comparison) may be named instead.
    let bin = std::env::var("KUBE_WS_PROXY_BENCH_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_kube-ws-proxy").to_owned());
    let child = std::process::Command::new(bin)
        .args([
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .args(["--upstream", upstream, "--log-format", "json"])
        .args(extra)
        .envs(env.iter().copied())
        .env("RUST_LOG", "warn")
        .spawn()
        .unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    while TcpStream::connect(addr).await.is_err() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Proxy { child, addr }
}

/// Seconds for `kubectl exec` of `command` through `proxy` to deliver `n` bytes of stdout.
async fn kubectl_stdout_run(kubectl: &Path, kubeconfig: &Path, command: &[&str], n: u64) -> f64 {
    use tokio::io::AsyncReadExt;
    let started = Instant::now();
    let mut child = tokio::process::Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["exec", "web", "--"])
        .args(command)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start kubectl");
    let mut stdout = child.stdout.take().unwrap();
    let mut buf = vec![0u8; 256 * 1024];
    let mut got = 0u64;
    loop {
        match stdout.read(&mut buf).await.unwrap() {
            0 => break,
            len => got += len as u64,
        }
    }
    let status = child.wait().await.unwrap();
    assert!(status.success(), "kubectl exec {command:?}: {status}");
    assert_eq!(got, n, "kubectl stdout of {command:?}");
    started.elapsed().as_secs_f64()
}

/// A shell command printing `n` bytes of terminal-like text (`ls -l` lines).
fn text_command(n: u64) -> String {
    format!(
        "yes 'drwxr-xr-x  2 kube kube  4096 Nov 25 01:02 a-directory-listing-line' | head -c {n}"
    )
}

/// Removes the recordings in `dir`.
fn remove_all(dir: &Path) {
    for e in std::fs::read_dir(dir).unwrap() {
        std::fs::remove_file(e.unwrap().path()).unwrap();
    }
}

/// Percentile `p` (0–100) of sorted `v`.
fn percentile(v: &[f64], p: f64) -> f64 {
    v[((v.len() - 1) as f64 * p / 100.0).round() as usize]
}

/// `--echo`: round trips of a 1-byte echo every 20 ms while `bulk` sessions print `text`
/// (64 MiB each, again and again), through each proxy in turn, `rounds` times.
async fn echo_under_load(
    proxies: [&Proxy; 2],
    bulk: usize,
    rounds: usize,
    remove_recordings: impl Fn(),
) {
    const ECHOES: usize = 250;
    const BULK_BYTES: u64 = 64 << 20;
    // `--only NUL`: NUL bytes, six times their size once recorded, keep the writer behind.
    let nul = arg("--only").is_some_and(|o| o.starts_with("NUL"));
    let command = match nul {
        true => format!("head -c {BULK_BYTES} /dev/zero"),
        false => text_command(BULK_BYTES),
    };
    let kind = if nul { "NUL bytes" } else { "text" };
    println!("echo every 20 ms, {ECHOES} per run, beside {bulk} sessions of bulk output ({kind})");
    let mut rtts = [Vec::new(), Vec::new()];
    let mut bulk_rate = [Vec::new(), Vec::new()];
    for round in 1..=rounds {
        for (i, p) in proxies.iter().enumerate() {
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let moved = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
            let mut tasks = Vec::new();
            for _ in 0..bulk {
                let (stop, moved, addr) = (stop.clone(), moved.clone(), p.addr);
                let command = ["sh".to_owned(), "-c".to_owned(), command.clone()];
                tasks.push(tokio::spawn(async move {
                    let command: Vec<&str> = command.iter().map(String::as_str).collect();
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        workloads::proxy_stdout_run(addr, &command, BULK_BYTES).await;
                        moved.fetch_add(BULK_BYTES, std::sync::atomic::Ordering::Relaxed);
                    }
                }));
            }
            // Let the bulk sessions fill whatever they fill first.
            tokio::time::sleep(Duration::from_secs(1)).await;
            let (moved0, started) = (
                moved.load(std::sync::atomic::Ordering::Relaxed),
                Instant::now(),
            );
            rtts[i].extend(
                workloads::proxy_echo_run(p.addr, ECHOES, Duration::from_millis(20), true).await,
            );
            let during = moved.load(std::sync::atomic::Ordering::Relaxed) - moved0;
            bulk_rate[i].push(during as f64 / (1 << 20) as f64 / started.elapsed().as_secs_f64());
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            for t in tasks {
                t.await.unwrap();
            }
            if i == 1 {
                remove_recordings();
            }
        }
        println!("round {round} done");
    }
    println!("\n| proxy | echo round trip p50 / p90 / p99 / max, ms | bulk output meanwhile, MiB/s (per run) |");
    println!("|---|---|---|");
    for (i, name) in ["not recording", "recording"].iter().enumerate() {
        let v = &mut rtts[i];
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let ms = |p: f64| percentile(v, p) / 1000.0;
        let rates: Vec<String> = bulk_rate[i].iter().map(|r| format!("{r:.0}")).collect();
        println!(
            "| {name} | {:.1} / {:.1} / {:.1} / {:.1} | {} |",
            ms(50.0),
            ms(90.0),
            ms(99.0),
            ms(100.0),
            rates.join(", ")
        );
    }
}

fn main() {
    let bytes: u64 = arg("--bytes")
        .and_then(|v| v.parse().ok())
        .unwrap_or(256 << 20);
    let rounds: usize = arg("--rounds").and_then(|v| v.parse().ok()).unwrap_or(5);
    let kubectl: Option<PathBuf> = match arg("--client").as_deref() {
        None | Some("websocket") => None,
        Some("kubectl") => Some(clients::kubectl("1.33").expect("kubectl 1.33 not found")),
        Some(other) => panic!("unknown --client {other}: websocket or kubectl"),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let sim = SimCluster::start(SimConfig {
            // Benchmarks measure the proxy: the cluster starts commands at once.
            exec_start_delay: std::time::Duration::ZERO,
            ..SimConfig::default()
        }).await.unwrap();
        let records = tempfile::tempdir().unwrap();
        let plain = proxy(&sim.url(), &[]).await;
        let policy = arg("--policy").unwrap_or_else(|| "best-effort".to_owned());
        let recording = proxy(
            &sim.url(),
            &[
                "--record",
                &policy,
                "--record-dir",
                &records.path().display().to_string(),
            ],
        )
        .await;
        let tls = std::env::args().any(|a| a == "--upload-tls");
        let uploads = tls || std::env::args().any(|a| a == "--upload");
        let spool = tempfile::tempdir().unwrap();
        let store = match uploads {
            true => Some(UploadStore::start(tls).await),
            false => None,
        };
        let uploading = match &store {
            Some(store) => {
                let spool_dir = spool.path().display().to_string();
                let mut flags = vec![
                    "--record",
                    &policy,
                    "--record-dir",
                    &spool_dir,
                    "--record-upload",
                    "s3://bench/rec",
                    "--s3-endpoint",
                    &store.endpoint,
                    "--record-upload-wait",
                    "0s",
                ];
                let ca = store.ca_file.as_ref().map(|p| p.display().to_string());
                if let Some(ca) = &ca {
                    flags.extend(["--s3-ca-file", ca]);
                }
                Some(proxy_env(&sim.url(), &flags, &s3::AWS_ENV).await)
            }
            None => None,
        };
        let kubeconfig_dir = tempfile::tempdir().unwrap();
        let kubeconfig = |p: &Proxy, name: &str| {
            let path = kubeconfig_dir.path().join(name);
            let server = format!("http://{}", p.addr);
            std::fs::write(&path, kube_ws_proxy::demo::kubeconfig(&server, None)).unwrap();
            path
        };
        let mut kubeconfigs = vec![kubeconfig(&plain, "plain"), kubeconfig(&recording, "recording")];
        let mut proxies = vec![&plain, &recording];
        if let Some(u) = &uploading {
            kubeconfigs.push(kubeconfig(u, "uploading"));
            proxies.push(u);
        }
        let n = bytes.to_string();
        let text = text_command(bytes);
        let mut workloads: Vec<(&str, Vec<&str>)> = vec![
            ("text", vec!["sh", "-c", &text]),
            ("NUL bytes", vec!["head", "-c", &n, "/dev/zero"]),
        ];
        // One of them alone (to profile it): `--only text` or `--only NUL`.
        if let Some(only) = arg("--only") {
            workloads.retain(|(name, _)| name.starts_with(&only));
        }
        let client = match &kubectl {
            Some(k) => format!("kubectl exec ({})", k.display()),
            None => "the project's WebSocket client".to_owned(),
        };
        if std::env::args().any(|a| a == "--echo") {
            let bulk = arg("--bulk").and_then(|v| v.parse().ok()).unwrap_or(4);
            let remove = || remove_all(records.path());
            echo_under_load([&plain, &recording], bulk, rounds, remove).await;
            return;
        }
        let fresh_pages = std::env::args().any(|a| a == "--fresh-pages");
        println!(
            "bytes per transfer: {bytes}, rounds: {rounds}, client: {client}, --record {policy}, page cache: {}",
            if fresh_pages { "fresh pages" } else { "recycled pages" }
        );
        let mut times = vec![[Vec::new(), Vec::new(), Vec::new()]; workloads.len()];
        let mut cpu = vec![[0.0f64; 3]; workloads.len()];
        let mut file_bytes = vec![0u64; workloads.len()];
        let remove_recordings = || remove_all(records.path());
        // Round 0 is a warm-up, not counted.
        for round in 0..=rounds {
            let counted = round > 0;
            for (w, (_, command)) in workloads.iter().enumerate() {
                for (i, p) in proxies.iter().enumerate() {
                    if i == 1 && !fresh_pages {
                        remove_recordings();
                    }
                    let cpu0 = cpu_seconds(p.child.id());
                    let took = match &kubectl {
                        Some(k) => kubectl_stdout_run(k, &kubeconfigs[i], command, bytes).await,
                        None => workloads::proxy_stdout_run(p.addr, command, bytes).await,
                    };
                    if i == 1 {
                        // The writer finishes on its own thread; its CPU counts too, so wait
                        // for the file to stop growing before reading the proxy's CPU.
                        let mut last = u64::MAX;
                        loop {
                            let size: u64 = std::fs::read_dir(records.path())
                                .unwrap()
                                .map(|e| e.unwrap().metadata().unwrap().len())
                                .sum();
                            if size == last {
                                file_bytes[w] = size;
                                break;
                            }
                            last = size;
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                    }
                    if counted {
                        times[w][i].push(took);
                    }
                    if i == 2 {
                        // Stored and removed from the spool: the upload's CPU is in.
                        while std::fs::read_dir(spool.path()).unwrap().next().is_some() {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        if counted {
                            cpu[w][i] += cpu_seconds(p.child.id()) - cpu0;
                        }
                        store.as_ref().unwrap().empty().await;
                    } else if counted {
                        cpu[w][i] += cpu_seconds(p.child.id()) - cpu0;
                    }
                    if i == 1 && fresh_pages {
                        remove_recordings();
                    }
                }
            }
            println!("round {round} done{}", if counted { "" } else { " (warm-up)" });
        }
        remove_recordings();
        let mib = bytes as f64 / (1 << 20) as f64;
        let gib = (bytes * rounds as u64) as f64 / (1u64 << 30) as f64;
        println!("\n| exec stdout, {mib:.0} MiB | not recorded, median s | recorded, median s | recorded / not | proxy CPU s/GiB, not recorded → recorded | recording's CPU s/GiB | recording file |");
        println!("|---|---|---|---|---|---|---|");
        for (w, (name, _)) in workloads.iter().enumerate() {
            let off = median(&mut times[w][0]);
            let on = median(&mut times[w][1]);
            let ratio = on / off;
            println!(
                "| {name} | {off:.3} ({:.0} MiB/s) | {on:.3} ({:.0} MiB/s) | {ratio:.2}× | {:.2} → {:.2} | +{:.2} | {:.0} MiB |",
                mib / off,
                mib / on,
                cpu[w][0] / gib,
                cpu[w][1] / gib,
                (cpu[w][1] - cpu[w][0]) / gib,
                file_bytes[w] as f64 / (1 << 20) as f64,
            );
        }
        if uploading.is_some() {
            println!("\n| exec stdout, {mib:.0} MiB | recorded and uploaded, median s | proxy CPU s/GiB, recorded → recorded and uploaded | the upload's CPU s/GiB of output | per GiB of recording file |");
            println!("|---|---|---|---|---|");
            for (w, (name, _)) in workloads.iter().enumerate() {
                let up = median(&mut times[w][2]);
                let added = (cpu[w][2] - cpu[w][1]) / gib;
                let file_gib = (file_bytes[w] * rounds as u64) as f64 / (1u64 << 30) as f64;
                println!(
                    "| {name} | {up:.3} ({:.0} MiB/s) | {:.2} → {:.2} | +{added:.2} | +{:.2} |",
                    mib / up,
                    cpu[w][1] / gib,
                    cpu[w][2] / gib,
                    (cpu[w][2] - cpu[w][1]) / file_gib,
                );
            }
        }
    });
}

/// moto's server with the bench's bucket, emptied between runs (it keeps objects in memory).
struct UploadStore {
    /// Kept running (killed on drop).
    _server: s3::S3Server,
    endpoint: String,
    /// With TLS: the CA of its certificate.
    ca_file: Option<PathBuf>,
    _certs: tempfile::TempDir,
}

impl UploadStore {
    async fn start(tls: bool) -> UploadStore {
        let moto = clients::require_moto().expect("moto_server (scripts/install-test-deps.sh)");
        let certs = tempfile::tempdir().unwrap();
        let (server, endpoint, ca_file) = if tls {
            let ca = pki::Ca::new("bench store");
            let (cert, key) = ca.server().write(certs.path(), "store");
            let ca_file = ca.write(certs.path(), "store-ca");
            let server = s3::S3Server::start_tls(&moto, (&cert, &key)).await;
            let endpoint = format!("https://{}", server.addr);
            (server, endpoint, Some(ca_file))
        } else {
            let server = s3::S3Server::start(&moto).await;
            let endpoint = server.endpoint();
            (server, endpoint, None)
        };
        let store = UploadStore {
            _server: server,
            endpoint,
            ca_file,
            _certs: certs,
        };
        store.bucket().await;
        store
    }

    async fn bucket(&self) {
        let s = s3::store_trusting(&self.endpoint, "s3://bench/rec", self.ca_file.as_deref()).await;
        s.create_bucket().await.expect("make the bucket");
    }

    /// Deletes every object (moto keeps them in memory).
    async fn empty(&self) {
        let s = s3::store_trusting(&self.endpoint, "s3://bench/rec", self.ca_file.as_deref()).await;
        for (key, _) in s.list("").await.unwrap() {
            s.delete(&key).await.unwrap();
        }
    }
}
