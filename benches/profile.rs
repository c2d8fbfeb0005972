//! Instruction counts of the proxy's streaming hot path, under valgrind's callgrind: repeatable
//! on a busy machine, where wall time is not. For each workload the release proxy binary runs
//! twice under callgrind (a fresh process each time), once with a small and once with a large
//! transfer; the difference divided by the difference in size is the marginal cost per MiB (per
//! echo round trip), free of start-up and session setup. The simulated cluster and the clients
//! run natively in this process, so only the proxy is counted.
//!
//! Workloads: `stdout` (exec stdout, SPDY → WebSocket v5), `stdin` (exec stdin, WebSocket v5 →
//! SPDY), `pf-down` / `pf-up` (port-forward through the tunnel), `echo` (1-byte round trips
//! through `cat`), `sessions` (sequential exec sessions running `true`: the marginal cost of
//! one session's setup and teardown, request parsing and classification included).
//!
//!     cargo bench --bench profile -- [--bytes 268435456] [--echoes 2000] [--sessions 400] \
//!         [--only stdout,stdin,pf-down,pf-up,echo,sessions] [--out target/profile] \
//!         [--proxy-args "--audit-log /tmp/audit.log"]
//!
//! `KUBE_WS_PROXY_BENCH_BIN=path` profiles another build of the proxy (to compare two commits
//! with the same harness); `--proxy-args` adds flags to the proxy's command line.
//!
//! With `--sim-streaming new --upstream-streaming websocket` the cluster serves v5 and the
//! tunnel itself and the proxy passes them through (no framing work): the same workloads then
//! measure the pass-through.
//!
//! The large runs' profiles stay in `--out` for `callgrind_annotate`. Besides instructions (Ir)
//! callgrind counts system calls (`--collect-systime`), which shows what batching saves: the
//! kernel's own work is not in Ir.

#[allow(dead_code)]
#[path = "../tests/common/ws_client.rs"]
mod ws_client;

#[allow(dead_code)]
#[path = "common/workloads.rs"]
mod workloads;

use std::net::SocketAddr;
use std::path::{Path as FsPath, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use kube_ws_proxy::sim::{SimCluster, SimConfig, SimStreaming};
use tokio::net::TcpStream;
use workloads::{
    echo_run, pf_run, setup_run, start_pod_services, stdin_run, stdout_run, Path, Setup,
};

const WORKLOADS: [&str; 6] = ["stdout", "stdin", "pf-down", "pf-up", "echo", "sessions"];

/// What one callgrind run counted in the whole proxy process.
#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    /// All instructions.
    instructions: u64,
    /// Instructions in libc's memcpy/memmove/memset. Under valgrind a `rep movsb`/`rep stosb`
    /// counts once per byte, so this is close to the number of bytes copied or zeroed.
    string_ops: u64,
    /// System calls, without `clock_gettime` (a vDSO call outside valgrind, not a syscall).
    syscalls: u64,
    /// Calls to malloc, calloc and realloc.
    allocations: u64,
}

/// Sums a callgrind output file: self costs per function (calls' inclusive costs skipped),
/// with the name compression of the format (`fn=(id) name`, later `fn=(id)`).
fn read_counts(file: &FsPath) -> Counts {
    let text = std::fs::read_to_string(file)
        .unwrap_or_else(|e| panic!("no callgrind output at {}: {e}", file.display()));
    let mut events: Vec<String> = Vec::new();
    let mut names: std::collections::HashMap<String, String> = Default::default();
    // Resolves `(id) name` / `(id)` to the name, remembering new ids.
    let mut resolve = |spec: &str| -> String {
        let spec = spec.trim();
        match spec.strip_prefix('(').and_then(|r| r.split_once(')')) {
            Some((id, rest)) if !rest.trim().is_empty() => {
                names.insert(id.to_owned(), rest.trim().to_owned());
                rest.trim().to_owned()
            }
            Some((id, _)) => names.get(id).cloned().unwrap_or_default(),
            None => spec.to_owned(),
        }
    };
    let mut counts = Counts::default();
    let mut current = String::new();
    let mut callee = String::new();
    let mut call_cost_next = false;
    for line in text.lines() {
        if let Some(e) = line.strip_prefix("events:") {
            events = e.split_whitespace().map(str::to_owned).collect();
        } else if let Some(f) = line.strip_prefix("fn=") {
            current = resolve(f);
        } else if let Some(f) = line.strip_prefix("cfn=") {
            callee = resolve(f);
        } else if let Some(c) = line.strip_prefix("calls=") {
            call_cost_next = true;
            if matches!(callee.as_str(), "malloc" | "calloc" | "realloc") {
                let n: u64 = c.split_whitespace().next().unwrap().parse().unwrap();
                counts.allocations += n;
            }
        } else if line.starts_with(|c: char| c.is_ascii_digit() || "+-*".contains(c)) {
            if std::mem::take(&mut call_cost_next) {
                continue;
            }
            let values = line
                .split_whitespace()
                .skip(1)
                .map(|v| v.parse::<u64>().unwrap());
            for (event, value) in events.iter().zip(values) {
                match event.as_str() {
                    "Ir" => {
                        counts.instructions += value;
                        if current.starts_with("__mem") {
                            counts.string_ops += value;
                        }
                    }
                    "sysCount" if !current.starts_with("clock_gettime") => counts.syscalls += value,
                    _ => {}
                }
            }
        }
    }
    counts
}

/// Starts the proxy under callgrind, writing its profile to `out`, and waits until it listens.
async fn start_proxy(upstream: &str, streaming: &str, out: &FsPath) -> (Child, SocketAddr) {
    let bin = std::env::var("KUBE_WS_PROXY_BENCH_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_kube-ws-proxy").to_owned());
    let extra = arg("--proxy-args").unwrap_or_default();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("valgrind")
        .args(["--tool=callgrind", "--collect-systime=yes", "--quiet"])
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(bin)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--admin-listen", "127.0.0.1:0", "--upstream", upstream])
        .args(["--log-format", "json", "--upstream-streaming", streaming])
        .args(extra.split_whitespace())
        .env("RUST_LOG", "warn")
        .spawn()
        .expect("valgrind must be installed (apt-get install valgrind)");
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while TcpStream::connect(addr).await.is_err() {
        assert!(
            Instant::now() < deadline,
            "proxy under valgrind never listened"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (child, addr)
}

/// SIGTERM (a graceful stop, so callgrind writes its profile) and wait for the exit.
fn stop_proxy(mut child: Child) {
    // SAFETY: kill has no memory preconditions; the pid is our own child's.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert!(status.success(), "proxy exited with {status}");
}

/// One proxy process under callgrind running `workload` once at `size` (bytes, or echoes).
async fn profile_run(
    sim: &SimCluster,
    streaming: &str,
    workload: &str,
    size: u64,
    out: &FsPath,
) -> Counts {
    let (pod_source, pod_sink) = start_pod_services(size).await;
    let (child, proxy) = start_proxy(&sim.url(), streaming, out).await;
    let s = Setup {
        proxy,
        sim: sim.addr(),
        relay: sim.addr(),
        pod_source,
        pod_sink,
    };
    match workload {
        "stdout" => {
            stdout_run(&s, Path::Proxy, size).await;
        }
        "stdin" => {
            stdin_run(&s, Path::Proxy, size).await;
        }
        "pf-down" => {
            pf_run(&s, Path::Proxy, size, true).await;
        }
        "pf-up" => {
            pf_run(&s, Path::Proxy, size, false).await;
        }
        "echo" => {
            echo_run(&s, Path::Proxy, size as usize).await;
        }
        "sessions" => {
            setup_run(&s, Path::Proxy, size as usize).await;
        }
        other => panic!("unknown workload {other}"),
    }
    // Let the session's teardown finish before the stop, so it is counted in both runs alike.
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop_proxy(child);
    read_counts(out)
}

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn main() {
    let bytes: u64 = arg("--bytes")
        .and_then(|v| v.parse().ok())
        .unwrap_or(256 << 20);
    let echoes: u64 = arg("--echoes").and_then(|v| v.parse().ok()).unwrap_or(2000);
    let sessions: u64 = arg("--sessions")
        .and_then(|v| v.parse().ok())
        .unwrap_or(400);
    let only = arg("--only").unwrap_or_else(|| WORKLOADS.join(","));
    let out_dir = PathBuf::from(arg("--out").unwrap_or_else(|| "target/profile".into()));
    let sim_streaming: SimStreaming = arg("--sim-streaming")
        .map(|v| v.parse().unwrap())
        .unwrap_or_default();
    let streaming = arg("--upstream-streaming").unwrap_or_else(|| "auto".into());
    std::fs::create_dir_all(&out_dir).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let sim = SimCluster::start(SimConfig {
            streaming: sim_streaming,
            exec_start_delay: std::time::Duration::ZERO,
            ..SimConfig::default()
        })
        .await
        .unwrap();
        println!("cluster: {sim_streaming}, --upstream-streaming {streaming}");
        println!(
            "Per MiB relayed (per round trip for echo, per session for sessions), from the difference between the runs:\n"
        );
        println!(
            "| workload | runs | Ir | of which memcpy/memset | other Ir | syscalls | allocations |"
        );
        println!("|---|---|---|---|---|---|---|");
        for workload in only.split(',') {
            // Bytes in MiB units; echoes counted one by one.
            let (large, unit) = match workload {
                "echo" => (echoes, 1.0),
                "sessions" => (sessions, 1.0),
                _ => (bytes, (1u64 << 20) as f64),
            };
            let small = large / 8;
            let path = |size: u64| out_dir.join(format!("callgrind.{workload}.{size}"));
            let a = profile_run(&sim, &streaming, workload, small, &path(small)).await;
            let b = profile_run(&sim, &streaming, workload, large, &path(large)).await;
            let units = (large - small) as f64 / unit;
            let per = |x: u64, y: u64| (y as f64 - x as f64) / units;
            println!(
                "| {workload} | {} | {:.0} | {:.0} | {:.0} | {:.1} | {:.1} |",
                if workload == "echo" {
                    format!("{small}, {large} echoes")
                } else if workload == "sessions" {
                    format!("{small}, {large} sessions")
                } else {
                    format!("{}, {} MiB", small >> 20, large >> 20)
                },
                per(a.instructions, b.instructions),
                per(a.string_ops, b.string_ops),
                per(a.instructions - a.string_ops, b.instructions - b.string_ops),
                per(a.syscalls, b.syscalls),
                per(a.allocations, b.allocations),
            );
        }
        println!(
            "\nprofiles: {}/callgrind.<workload>.<size>",
            out_dir.display()
        );
        sim.shutdown().await;
    });
}
