//! Streaming throughput and latency, side by side, in one interleaved run (A B C A B C …):
//!
//! * `proxy`: a v5 WebSocket client → kube-ws-proxy (release binary) → the simulated SPDY-only
//!   cluster (what kubectl 1.31+ does through the proxy);
//! * `direct`: an SPDY/3.1 client straight to the simulated cluster (what kubectl ≤ 1.30 does);
//! * `relay`: the same SPDY client through a plain TCP relay (the floor of any extra hop).
//!
//! Measured: exec stdout (`head -c N /dev/zero`), exec stdin (`cat > /dev/null`), and 1-byte
//! echo round trips through `cat` (p50/p99), session setup and teardown, and plain GETs
//! (the reverse-proxy path, p50/p99). Medians of the rounds and ratios to `direct`
//! are printed with the targets from the benchmarks issue.
//!
//!     cargo bench --bench streaming -- [--bytes 1073741824] [--rounds 5] [--echoes 2000]
//!     cargo bench --bench streaming -- --smoke      (seconds; what CI may run)
//!
//! `KUBE_WS_PROXY_BENCH_BIN=path` runs another build of the proxy (to compare two commits with
//! the same harness).
//!
//! With `--pass-through` the cluster is a new one (`SimStreaming::New`) and the proxy runs with
//! `--upstream-streaming websocket`; the same v5 / tunnel client then goes three ways: through
//! the proxy (passed through), straight to the cluster (direct), and through the plain TCP
//! relay (the floor of any extra hop).
//!
//! Not a test: nothing here asserts on time.

// The tests' WebSocket helpers (the tunnel byte-stream adapter among them).
#[allow(dead_code)]
#[path = "../tests/common/ws_client.rs"]
mod ws_client;

#[path = "common/workloads.rs"]
mod workloads;

#[path = "common/process.rs"]
mod process;

use std::net::SocketAddr;
use std::time::Duration;

use kube_ws_proxy::sim::{SimCluster, SimConfig, SimStreaming};
use process::cpu_seconds;
use tokio::net::TcpStream;
use workloads::{
    echo_run, get_run, pf_run, setup_run, start_pod_services, start_relay, stdin_run, stdout_run,
    Path, Setup, PATHS,
};

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn main() {
    let smoke = std::env::args().any(|a| a == "--smoke");
    if std::env::args().any(|a| a == "--pass-through") {
        return pass_through_main(smoke);
    }
    let bytes: u64 = arg("--bytes")
        .and_then(|v| v.parse().ok())
        .unwrap_or(if smoke { 8 << 20 } else { 1 << 30 });
    let rounds: usize = arg("--rounds")
        .and_then(|v| v.parse().ok())
        .unwrap_or(if smoke { 1 } else { 5 });
    let echoes: usize = arg("--echoes")
        .and_then(|v| v.parse().ok())
        .unwrap_or(if smoke { 50 } else { 2000 });
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
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let bin = std::env::var("KUBE_WS_PROXY_BENCH_BIN")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_kube-ws-proxy").to_owned());
        let mut proxy = std::process::Command::new(bin)
            .args(["--listen", &format!("127.0.0.1:{port}"), "--admin-listen", "127.0.0.1:0"])
            .args(["--upstream", &sim.url(), "--log-format", "json"])
            .env("RUST_LOG", "warn")
            .spawn()
            .unwrap();
        let proxy_addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        while TcpStream::connect(proxy_addr).await.is_err() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let (pod_source, pod_sink) = start_pod_services(bytes).await;
        let s = Setup {
            proxy: proxy_addr,
            sim: sim.addr(),
            relay: start_relay(sim.addr()).await,
            pod_source,
            pod_sink,
        };
        println!("bytes per transfer: {bytes}, rounds: {rounds}, echoes per round: {echoes}");

        let setups: usize = if smoke { 10 } else { 200 };
        let mut out_t = vec![Vec::new(); 3];
        let mut in_t = vec![Vec::new(); 3];
        let mut pf_down = vec![Vec::new(); 3];
        let mut pf_up = vec![Vec::new(); 3];
        let mut rtt = vec![Vec::new(); 3];
        let mut setup = vec![Vec::new(); 3];
        let mut gets = vec![Vec::new(); 3];
        let mut proxy_cpu = 0.0;
        let mut proxy_bytes = 0u64;
        for round in 0..rounds {
            for (i, &p) in PATHS.iter().enumerate() {
                let cpu0 = cpu_seconds(proxy.id());
                out_t[i].push(stdout_run(&s, p, bytes).await);
                in_t[i].push(stdin_run(&s, p, bytes).await);
                pf_down[i].push(pf_run(&s, p, bytes, true).await);
                pf_up[i].push(pf_run(&s, p, bytes, false).await);
                if p == Path::Proxy {
                    proxy_cpu += cpu_seconds(proxy.id()) - cpu0;
                    proxy_bytes += 4 * bytes;
                }
                rtt[i].extend(echo_run(&s, p, echoes).await);
                setup[i].extend(setup_run(&s, p, setups).await);
                gets[i].extend(get_run(&s, p, echoes).await);
            }
            println!("round {} done", round + 1);
        }
        let mib = bytes as f64 / (1 << 20) as f64;
        println!("\n| measure | proxy (WebSocket) | direct SPDY | SPDY via TCP relay | proxy / direct | target |");
        println!("|---|---|---|---|---|---|");
        for (name, t) in [
            ("exec stdout", &mut out_t),
            ("exec stdin", &mut in_t),
            ("port-forward down", &mut pf_down),
            ("port-forward up", &mut pf_up),
        ] {
            let m: Vec<f64> = t.iter_mut().map(|v| median(v)).collect();
            let ratio = m[0] / m[1];
            println!(
                "| {name} {mib:.0} MiB, median s | {:.3} ({:.0} MiB/s) | {:.3} ({:.0} MiB/s) | {:.3} ({:.0} MiB/s) | {ratio:.2}× | ≤ 1.10× {} |",
                m[0], mib / m[0], m[1], mib / m[1], m[2], mib / m[2],
                if ratio <= 1.10 { "met" } else { "NOT met" }
            );
        }
        let p50: Vec<f64> = rtt.iter_mut().map(|v| percentile(v, 0.50)).collect();
        let p99: Vec<f64> = rtt.iter_mut().map(|v| percentile(v, 0.99)).collect();
        println!("| 1-byte echo p50, µs | {:.0} | {:.0} | {:.0} | +{:.0} µs | |", p50[0], p50[1], p50[2], p50[0] - p50[1]);
        let added = p99[0] - p99[1];
        println!(
            "| 1-byte echo p99, µs | {:.0} | {:.0} | {:.0} | +{added:.0} µs | added ≤ 200 µs {} |",
            p99[0], p99[1], p99[2],
            if added <= 200.0 { "met" } else { "NOT met" }
        );
        let s50: Vec<f64> = setup.iter_mut().map(|v| percentile(v, 0.50)).collect();
        let s99: Vec<f64> = setup.iter_mut().map(|v| percentile(v, 0.99)).collect();
        println!(
            "| exec session setup+teardown p50, ms ({:.0}/s sequential) | {:.2} | {:.2} | {:.2} | {:.2}× | |",
            1e3 / s50[0], s50[0], s50[1], s50[2], s50[0] / s50[1]
        );
        println!("| exec session setup+teardown p99, ms | {:.2} | {:.2} | {:.2} | | |", s99[0], s99[1], s99[2]);
        let g50: Vec<f64> = gets.iter_mut().map(|v| percentile(v, 0.50)).collect();
        let g99: Vec<f64> = gets.iter_mut().map(|v| percentile(v, 0.99)).collect();
        println!(
            "| plain GET p50, µs | {:.0} | {:.0} | {:.0} | +{:.0} µs | |",
            g50[0], g50[1], g50[2], g50[0] - g50[1]
        );
        println!("| plain GET p99, µs | {:.0} | {:.0} | {:.0} | +{:.0} µs | |", g99[0], g99[1], g99[2], g99[0] - g99[1]);
        let gb = proxy_bytes as f64 / 1e9;
        println!(
            "\nproxy CPU: {proxy_cpu:.2} s for {gb:.2} GB relayed through it = {:.2} CPU s/GB",
            proxy_cpu / gb
        );
        let _ = proxy.kill();
        let _ = proxy.wait();
        sim.shutdown().await;
    });
}

/// `--pass-through`: the v5 / tunnel client through the pass-through proxy, straight to a new
/// cluster, and through a plain TCP relay, interleaved.
fn pass_through_main(smoke: bool) {
    let bytes: u64 = arg("--bytes")
        .and_then(|v| v.parse().ok())
        .unwrap_or(if smoke { 8 << 20 } else { 1 << 30 });
    let rounds: usize = arg("--rounds")
        .and_then(|v| v.parse().ok())
        .unwrap_or(if smoke { 1 } else { 5 });
    let echoes: usize = arg("--echoes")
        .and_then(|v| v.parse().ok())
        .unwrap_or(if smoke { 50 } else { 2000 });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let sim = SimCluster::start(SimConfig {
            streaming: SimStreaming::New,
            exec_start_delay: std::time::Duration::ZERO,
            ..SimConfig::default()
        })
        .await
        .unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut proxy = std::process::Command::new(env!("CARGO_BIN_EXE_kube-ws-proxy"))
            .args(["--listen", &format!("127.0.0.1:{port}"), "--admin-listen", "127.0.0.1:0"])
            .args(["--upstream", &sim.url(), "--log-format", "json"])
            .args(["--upstream-streaming", "websocket"])
            .env("RUST_LOG", "warn")
            .spawn()
            .unwrap();
        let proxy_addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        while TcpStream::connect(proxy_addr).await.is_err() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let (pod_source, pod_sink) = start_pod_services(bytes).await;
        let relay = start_relay(sim.addr()).await;
        // The v5 / tunnel client (`Path::Proxy`) pointed at each of the three entry points.
        let entry = |addr| Setup {
            proxy: addr,
            sim: sim.addr(),
            relay,
            pod_source,
            pod_sink,
        };
        let setups = [entry(proxy_addr), entry(sim.addr()), entry(relay)];
        println!("bytes per transfer: {bytes}, rounds: {rounds}, echoes per round: {echoes}");
        let mut times = vec![vec![Vec::new(); 3]; 4];
        let mut rtt = vec![Vec::new(); 3];
        let mut proxy_cpu = 0.0;
        let mut proxy_bytes = 0u64;
        for round in 0..rounds {
            for (i, s) in setups.iter().enumerate() {
                let cpu0 = cpu_seconds(proxy.id());
                times[0][i].push(stdout_run(s, Path::Proxy, bytes).await);
                times[1][i].push(stdin_run(s, Path::Proxy, bytes).await);
                times[2][i].push(pf_run(s, Path::Proxy, bytes, true).await);
                times[3][i].push(pf_run(s, Path::Proxy, bytes, false).await);
                if i == 0 {
                    proxy_cpu += cpu_seconds(proxy.id()) - cpu0;
                    proxy_bytes += 4 * bytes;
                }
                rtt[i].extend(echo_run(s, Path::Proxy, echoes).await);
            }
            println!("round {} done", round + 1);
        }
        let mib = bytes as f64 / (1 << 20) as f64;
        println!("\n| measure | pass-through proxy | direct (no proxy) | TCP relay | proxy / direct | proxy / relay |");
        println!("|---|---|---|---|---|---|");
        for (name, t) in ["exec stdout", "exec stdin", "port-forward down", "port-forward up"]
            .into_iter()
            .zip(times.iter_mut())
        {
            let m: Vec<f64> = t.iter_mut().map(|v| median(v)).collect();
            println!(
                "| {name} {mib:.0} MiB, median s | {:.3} ({:.0} MiB/s) | {:.3} ({:.0} MiB/s) | {:.3} ({:.0} MiB/s) | {:.2}× | {:.2}× |",
                m[0], mib / m[0], m[1], mib / m[1], m[2], mib / m[2], m[0] / m[1], m[0] / m[2]
            );
        }
        let p50: Vec<f64> = rtt.iter_mut().map(|v| percentile(v, 0.50)).collect();
        let p99: Vec<f64> = rtt.iter_mut().map(|v| percentile(v, 0.99)).collect();
        println!("| 1-byte echo p50, µs | {:.0} | {:.0} | {:.0} | +{:.0} µs | |", p50[0], p50[1], p50[2], p50[0] - p50[1]);
        println!("| 1-byte echo p99, µs | {:.0} | {:.0} | {:.0} | +{:.0} µs | |", p99[0], p99[1], p99[2], p99[0] - p99[1]);
        let gb = proxy_bytes as f64 / 1e9;
        println!(
            "\nproxy CPU: {proxy_cpu:.2} s for {gb:.2} GB passed through it = {:.2} CPU s/GB",
            proxy_cpu / gb
        );
        let _ = proxy.kill();
        let _ = proxy.wait();
        sim.shutdown().await;
    });
}
