//! What following a recording (`GET …/sessions/ID/recording?follow=true`) costs the session
//! being followed: a recorded exec session's bulk output through the real proxy with nobody
//! following its recording, with one fast follower (a raw HTTPS client that reads as fast as
//! it can), and with one stalled follower (it opens the follow, reads the answer's head and
//! nothing more), interleaved round by round (none, fast, stalled, none, …).
//!
//!     cargo bench --bench recording_follow -- [--bytes 268435456] [--rounds 5]
//!         [--only none,fast,stalled] [--policy best-effort|required] [--compare-bin PATH]
//!
//! The rig is the sessions API's (tests/common/operated.rs): a simulated cluster with RBAC for
//! the API, the proxy with listener TLS and `--record`, tina running the session with kubectl
//! 1.33 (`kubectl exec -i`, its stdout read and counted by the bench), olga following. The
//! session waits for a line on stdin before it prints, so the follower is in place before the
//! first byte: the time is from that line to the last byte of stdout. The proxy's CPU is read
//! from `/proc` from that line until the recording stops growing (the writer's thread counts
//! too), and in the fast case includes what the follower's reading costs the proxy.
//!
//! `--compare-bin PATH` adds a case: nobody follows, through another build of the proxy (the
//! commit before the recording subresource, say), to see what publishing the writer's
//! progress costs when nobody follows. `KUBE_WS_PROXY_BENCH_BIN` replaces the proxy under test.
//!
//! `--callgrind` counts the proxy's instructions under valgrind's callgrind instead (they do not
//! depend on the machine's load, as times do): per case a fresh proxy process runs one session
//! of `--bytes / 8`, another one of `--bytes` (64 MiB by default), and the difference per GiB
//! is the marginal cost of the output, free of start-up and of the follower's opening.
//!
//! The recording is removed just before each run, so a new file reuses the page cache the old
//! one freed (see the recording bench). Not a test: nothing here asserts on time.

#[allow(dead_code)]
#[path = "../tests/common/pki.rs"]
mod pki;

#[allow(dead_code)]
#[path = "../tests/common/tls_client.rs"]
mod tls_client;

#[path = "common/process.rs"]
mod process;

#[allow(dead_code)]
#[path = "../tests/common/clients.rs"]
mod clients;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use kube_ws_proxy::sim::{SimAccessRule, SimCluster, SimConfig, SimSubject, SimUser};
use process::cpu_seconds;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

const TINA: &str = "tina-token-follow-1";
const OLGA: &str = "olga-token-follow-2";
const PROXY_TOKEN: &str = "proxy-token-follow-3";
const PROXY_USER: &str = "system:serviceaccount:kube-ws-proxy:kube-ws-proxy";
const SESSIONS: &str = "/apis/kube-ws-proxy.io/v1/sessions";

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

/// Who follows the session's recording.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Follower {
    None,
    Fast,
    Stalled,
}

/// One case of a round: a follower, through the proxy under test or the other build.
#[derive(Debug, Clone, Copy)]
struct Case {
    name: &'static str,
    follower: Follower,
    other_build: bool,
}

/// A cluster where tina runs sessions and olga may read every session and its recording.
fn cluster() -> SimConfig {
    let user = |token: &str, name: &str| SimUser {
        token: token.to_owned(),
        name: name.to_owned(),
        groups: vec!["staff".to_owned()],
    };
    SimConfig {
        users: vec![
            user(TINA, "tina"),
            user(OLGA, "olga"),
            user(PROXY_TOKEN, PROXY_USER),
        ],
        impersonators: vec![PROXY_USER.to_owned()],
        access_reviewers: vec![PROXY_USER.to_owned()],
        access_policy: vec![SimAccessRule::cluster_wide(
            SimSubject::User("olga".into()),
            "kube-ws-proxy.io",
            &["sessions", "sessions/recording"],
            &["list", "watch", "get"],
        )],
        // Benchmarks measure the proxy: the cluster starts commands at once.
        exec_start_delay: Duration::ZERO,
        ..SimConfig::default()
    }
}

/// A proxy process (`bin`) recording into `records`; killed on drop.
struct Proxy {
    child: std::process::Child,
    addr: SocketAddr,
    records: tempfile::TempDir,
    tina: PathBuf,
    olga: PathBuf,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proxy {
    /// SIGTERM (a graceful stop, so callgrind writes its profile) and wait for the exit.
    fn stop(mut self) {
        // SAFETY: kill has no memory preconditions; the pid is our own child's.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.child.wait().unwrap();
        assert!(status.success(), "proxy exited with {status}");
    }
}

/// The instructions a callgrind profile counted in the whole process (its `totals:` or
/// `summary:` line).
fn callgrind_total(file: &Path) -> u64 {
    let text = std::fs::read_to_string(file)
        .unwrap_or_else(|e| panic!("no callgrind output at {}: {e}", file.display()));
    text.lines()
        .find_map(|l| {
            l.strip_prefix("totals:")
                .or_else(|| l.strip_prefix("summary:"))
        })
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("a callgrind total")
}

/// The rig's files: the CA the proxy serves under and its flags' files.
struct Rig {
    dir: tempfile::TempDir,
    ca: pki::Ca,
    upstream: String,
}

impl Rig {
    /// Starts `bin` with `--record policy` (under callgrind, writing its profile to
    /// `callgrind`, if given), and writes tina's and olga's kubeconfigs for it.
    async fn proxy(&self, bin: &str, name: &str, policy: &str, callgrind: Option<&Path>) -> Proxy {
        let dir = self.dir.path();
        let (cert, key) = self.ca.server().write(dir, &format!("serving-{name}"));
        let token_file = dir.join("proxy-token");
        std::fs::write(&token_file, PROXY_TOKEN).unwrap();
        let records = tempfile::tempdir().unwrap();
        let port = process::free_port();
        let path = |p: &Path| p.display().to_string();
        let mut command = match callgrind {
            Some(out) => {
                let mut c = std::process::Command::new("valgrind");
                c.args(["--tool=callgrind", "--quiet"])
                    .arg(format!("--callgrind-out-file={}", out.display()))
                    .arg(bin);
                c
            }
            None => std::process::Command::new(bin),
        };
        let child = command
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--admin-listen", "127.0.0.1:0", "--log-format", "json"])
            .args(["--upstream", &self.upstream])
            .args(["--upstream-token-file", &path(&token_file)])
            .args(["--tls-cert-file", &path(&cert)])
            .args(["--tls-private-key-file", &path(&key)])
            .args(["--record", policy, "--record-dir", &path(records.path())])
            .env("RUST_LOG", "warn")
            .spawn()
            .unwrap();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        while TcpStream::connect(addr).await.is_err() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let server = format!("https://{addr}");
        let kc = |who: &str, token: &str| {
            let file = dir.join(format!("kubeconfig-{name}-{who}"));
            pki::kubeconfig(&file, &server, &self.ca.pem, Some(token), None)
        };
        Proxy {
            tina: kc("tina", TINA),
            olga: kc("olga", OLGA),
            child,
            addr,
            records,
        }
    }
}

/// kubectl `k` as `kc`, with no kubeconfig but the one named.
fn kubectl(k: &Path, kc: &Path) -> tokio::process::Command {
    let mut c = tokio::process::Command::new(k);
    c.arg("--kubeconfig")
        .arg(kc)
        .env_remove("KUBECONFIG")
        .kill_on_drop(true);
    c
}

/// The id of the one live session, once it is listed.
async fn only_session(k: &Path, p: &Proxy) -> String {
    loop {
        let out = kubectl(k, &p.olga)
            .args(["get", "--raw", SESSIONS])
            .output()
            .await
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        if let Some(one) = list["items"].as_array().and_then(|i| i.first()) {
            return one["metadata"]["name"].as_str().unwrap().to_owned();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Opens `?follow=true` on session `id`'s recording as olga (the server closes the connection
/// after the answer): the stream, its answer's head read.
async fn open_follow(p: &Proxy, ca: &str, id: &str) -> FollowStream {
    let mut tls = tls_client::connect(p.addr, ca, None, &[b"http/1.1"])
        .await
        .unwrap();
    let path = format!("/apis/kube-ws-proxy.io/v1/namespaces/default/sessions/{id}/recording");
    let request = format!(
        "GET {path}?follow=true HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {OLGA}\r\nConnection: close\r\n\r\n"
    );
    tls.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(tls.read(&mut byte).await.unwrap(), 1, "the answer's head");
        head.push(byte[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    tls
}

/// A follower's connection.
type FollowStream = tokio_rustls::client::TlsStream<TcpStream>;

/// What one run measured: seconds from the go line to the last byte, proxy CPU seconds.
struct Run {
    seconds: f64,
    cpu: f64,
}

/// One recorded session printing `n` bytes of `command`, followed as `follower` says.
async fn run(k: &Path, p: &Proxy, ca: &str, command: &str, n: u64, follower: Follower) -> Run {
    for e in std::fs::read_dir(p.records.path()).unwrap() {
        std::fs::remove_file(e.unwrap().path()).unwrap();
    }
    let mut session = kubectl(k, &p.tina)
        .args(["exec", "-i", "web", "--", "sh", "-c"])
        // It ends when told (after the bench has all its output), not when its output is in
        // the pipe: the simulated cluster drains a finished process's output for 2 s only,
        // too short for a proxy under callgrind.
        .arg(format!("read go; {command}; read done"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let id = only_session(k, p).await;
    let mut stalled = None;
    let mut fast = None;
    match follower {
        Follower::None => {}
        Follower::Stalled => stalled = Some(open_follow(p, ca, &id).await),
        Follower::Fast => {
            let mut tls = open_follow(p, ca, &id).await;
            fast = Some(tokio::spawn(async move {
                let mut buf = vec![0u8; 256 * 1024];
                let mut got = 0u64;
                while let Ok(len @ 1..) = tls.read(&mut buf).await {
                    got += len as u64;
                }
                got
            }));
        }
    }
    let cpu0 = cpu_seconds(p.child.id());
    let started = Instant::now();
    let mut stdin = session.stdin.take().unwrap();
    stdin.write_all(b"go\n").await.unwrap();
    let mut stdout = BufReader::with_capacity(256 * 1024, session.stdout.take().unwrap());
    let mut got = 0u64;
    while got < n {
        let len = stdout.fill_buf().await.unwrap().len();
        assert!(len > 0, "the session's stdout ended at {got} of {n} bytes");
        got += len as u64;
        stdout.consume(len);
    }
    let seconds = started.elapsed().as_secs_f64();
    stdin.write_all(b"done\n").await.unwrap();
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).await.unwrap();
    assert_eq!(got + rest.len() as u64, n, "the session's stdout");
    assert!(session.wait().await.unwrap().success());
    // The writer finishes on its own thread: wait for the file to stop growing.
    let mut last = u64::MAX;
    loop {
        let size: u64 = std::fs::read_dir(p.records.path())
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum();
        if size == last {
            break;
        }
        last = size;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    if let Some(fast) = fast {
        let read = fast.await.unwrap();
        assert!(read > last, "the fast follower read {read} of {last}");
    }
    let cpu = cpu_seconds(p.child.id()) - cpu0;
    drop(stalled);
    Run { seconds, cpu }
}

/// `--callgrind`: for each case, a fresh proxy under callgrind runs one session of `small`
/// bytes, another one of `large`; the difference in the proxy's instructions per GiB of
/// output is the marginal cost, free of start-up, session setup and the follower's opening.
#[allow(clippy::too_many_arguments)]
async fn callgrind_runs(
    rig: &Rig,
    k: &Path,
    bins: [&str; 2],
    cases: &[Case],
    policy: &str,
    large: u64,
    rounds: usize,
) {
    let small = large / 8;
    let command = |n: u64| {
        format!(
            "yes 'drwxr-xr-x  2 kube kube  4096 Nov 25 01:02 a-directory-listing-line' | head -c {n}"
        )
    };
    println!("callgrind: {small} and {large} bytes per case, {rounds} rounds, --record {policy}");
    let mut per_gib = vec![Vec::new(); cases.len()];
    for round in 1..=rounds {
        for (i, case) in cases.iter().enumerate() {
            let mut total = [0u64; 2];
            for (j, n) in [small, large].into_iter().enumerate() {
                let out = rig.dir.path().join(format!("callgrind-{i}-{j}.out"));
                let bin = bins[usize::from(case.other_build)];
                let p = rig.proxy(bin, "callgrind", policy, Some(&out)).await;
                run(k, &p, &rig.ca.pem, &command(n), n, case.follower).await;
                p.stop();
                total[j] = callgrind_total(&out);
            }
            let gib = (large - small) as f64 / (1u64 << 30) as f64;
            per_gib[i].push((total[1] - total[0]) as f64 / gib);
        }
        println!("round {round} done");
    }
    println!("\n| case | proxy instructions per GiB of output (each round) |");
    println!("|---|---|");
    for (i, case) in cases.iter().enumerate() {
        let each: Vec<String> = per_gib[i]
            .iter()
            .map(|v| format!("{:.2}G", v / 1e9))
            .collect();
        println!("| {} | {} |", case.name, each.join(", "));
    }
}

/// Median, min and max of `v`.
fn spread(v: &mut [f64]) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn main() {
    let bytes: u64 = arg("--bytes")
        .and_then(|v| v.parse().ok())
        .unwrap_or(256 << 20);
    let rounds: usize = arg("--rounds").and_then(|v| v.parse().ok()).unwrap_or(5);
    let policy = arg("--policy").unwrap_or_else(|| "best-effort".to_owned());
    let k = clients::kubectl("1.33").expect("kubectl 1.33 not found");
    let mut cases = vec![
        Case {
            name: "nobody follows",
            follower: Follower::None,
            other_build: false,
        },
        Case {
            name: "one fast follower",
            follower: Follower::Fast,
            other_build: false,
        },
        Case {
            name: "one stalled follower",
            follower: Follower::Stalled,
            other_build: false,
        },
    ];
    if let Some(only) = arg("--only") {
        let keep = |c: &Case| match c.follower {
            Follower::None => only.contains("none"),
            Follower::Fast => only.contains("fast"),
            Follower::Stalled => only.contains("stalled"),
        };
        cases.retain(keep);
    }
    let other_bin = arg("--compare-bin");
    if other_bin.is_some() {
        cases.push(Case {
            name: "nobody follows, --compare-bin",
            follower: Follower::None,
            other_build: true,
        });
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let sim = SimCluster::start(cluster()).await.unwrap();
        let rig = Rig {
            dir: tempfile::tempdir().unwrap(),
            ca: pki::Ca::new("bench"),
            upstream: sim.url(),
        };
        let bin = std::env::var("KUBE_WS_PROXY_BENCH_BIN")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_kube-ws-proxy").to_owned());
        if std::env::args().any(|a| a == "--callgrind") {
            let other = other_bin.as_deref().unwrap_or(&bin);
            let large = arg("--bytes").and_then(|v| v.parse().ok()).unwrap_or(64 << 20);
            let rounds = arg("--rounds").and_then(|v| v.parse().ok()).unwrap_or(1);
            callgrind_runs(&rig, &k, [&bin, other], &cases, &policy, large, rounds).await;
            return;
        }
        let main = rig.proxy(&bin, "main", &policy, None).await;
        let other = match &other_bin {
            Some(b) => Some(rig.proxy(b, "other", &policy, None).await),
            None => None,
        };
        let command = format!(
            "yes 'drwxr-xr-x  2 kube kube  4096 Nov 25 01:02 a-directory-listing-line' | head -c {bytes}"
        );
        println!(
            "exec stdout of text, {bytes} bytes per run, {rounds} rounds, kubectl 1.33, --record {policy}"
        );
        let mut times = vec![Vec::new(); cases.len()];
        let mut cpus = vec![Vec::new(); cases.len()];
        // Round 0 is a warm-up, not counted.
        for round in 0..=rounds {
            for (i, case) in cases.iter().enumerate() {
                let p = match case.other_build {
                    true => other.as_ref().unwrap(),
                    false => &main,
                };
                let r = run(&k, p, &rig.ca.pem, &command, bytes, case.follower).await;
                if round > 0 {
                    times[i].push(r.seconds);
                    cpus[i].push(r.cpu);
                }
            }
            println!("round {round} done{}", if round == 0 { " (warm-up)" } else { "" });
        }
        let mib = bytes as f64 / (1 << 20) as f64;
        let gib = bytes as f64 / (1u64 << 30) as f64;
        println!("\n| case | MiB/s, median (min–max) | proxy CPU s/GiB, median (min–max) |");
        println!("|---|---|---|");
        for (i, case) in cases.iter().enumerate() {
            let (t, t_min, t_max) = spread(&mut times[i]);
            let (c, c_min, c_max) = spread(&mut cpus[i]);
            println!(
                "| {} | {:.0} ({:.0}–{:.0}) | {:.2} ({:.2}–{:.2}) |",
                case.name,
                mib / t,
                mib / t_max,
                mib / t_min,
                c / gib,
                c_min / gib,
                c_max / gib,
            );
        }
    });
}
