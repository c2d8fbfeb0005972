//! The simulated cluster on its own: it really is SPDY-only (so tests through the proxy prove
//! translation), serves discovery and reads, and refuses to listen anywhere but loopback.

use crate::common;

use std::time::Duration;

use common::clients::require_kubectl;
use common::harness::{run, stderr, stdout};
use common::middlebox::Middlebox;
use kube_ws_proxy::sim::{SimCluster, SimConfig};

const T: Duration = Duration::from_secs(60);

fn kubectl(k: &std::path::Path, dir: &std::path::Path, server: &str) -> std::process::Command {
    let kubeconfig = common::clients::write_kubeconfig(dir, server, None);
    let mut cmd = std::process::Command::new(k);
    cmd.arg("--kubeconfig")
        .arg(kubeconfig)
        .env("HOME", dir)
        .env_remove("KUBECONFIG");
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_1_33_needs_spdy_to_reach_it() {
    let Some(k) = require_kubectl("1.33") else {
        return;
    };
    let sim = SimCluster::start(SimConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();

    // Directly: the WebSocket attempt is refused with 403, kubectl falls back to SPDY.
    let mut c = kubectl(&k, dir.path(), &sim.url());
    c.args(["exec", "web", "--", "echo", "via spdy"]);
    let o = run(c, None, T).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "via spdy\n");

    // Behind the SPDY-dropping gateway, without the proxy: nothing works.
    let gateway = Middlebox::start(sim.addr()).await;
    let mut c = kubectl(&k, dir.path(), &format!("http://{}", gateway.addr));
    c.args(["exec", "web", "--", "echo", "never"]);
    let o = run(c, None, T).await;
    assert!(!o.status.success());
    assert!(gateway.websockets() > 0 && gateway.dropped() > 0);

    let mut c = kubectl(&k, dir.path(), &sim.url());
    c.args([
        "get",
        "pods",
        "web",
        "-o",
        "jsonpath={.status.phase} {.spec.containers[*].name}",
    ]);
    let o = run(c, None, T).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "Running main sidecar");
    sim.shutdown().await;
}

#[tokio::test]
async fn refuses_non_loopback_addresses() {
    let config = SimConfig {
        listen: "0.0.0.0:0".parse().unwrap(),
        ..SimConfig::default()
    };
    assert!(SimCluster::start(config).await.is_err());
}

/// A test run starts hundreds of clusters, and most are simply dropped at the test's end (or by
/// a panic): each must take its pods' files with it, or a full run fills the disk.
#[tokio::test]
async fn a_dropped_cluster_removes_its_own_scratch_directory_but_not_a_given_one() {
    let sim = SimCluster::start(SimConfig::default()).await.unwrap();
    let pod = sim.pod_dir("default", "web");
    std::fs::create_dir_all(&pod).unwrap();
    std::fs::write(pod.join("big.bin"), vec![7u8; 1 << 20]).unwrap();
    let scratch = sim.scratch_dir().to_path_buf();
    drop(sim);
    assert!(!scratch.exists(), "{} left behind", scratch.display());

    let given = tempfile::tempdir().unwrap();
    let sim = SimCluster::start(SimConfig {
        scratch_dir: Some(given.path().to_path_buf()),
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let pod = sim.pod_dir("default", "web");
    std::fs::create_dir_all(&pod).unwrap();
    std::fs::write(pod.join("kept.txt"), b"kept").unwrap();
    drop(sim);
    assert_eq!(std::fs::read(pod.join("kept.txt")).unwrap(), b"kept");
}

/// A watch of one pod starts with its `ADDED` and goes on with `MODIFIED` events, the resource
/// version going up; a followed log ends after `limitBytes`.
#[tokio::test]
async fn it_serves_watches_and_ends_a_log_at_limit_bytes() {
    use std::io::{BufRead, BufReader, Read, Write};
    let sim = SimCluster::start(SimConfig::default()).await.unwrap();
    let addr = sim.addr();
    let events = tokio::task::spawn_blocking(move || {
        let mut tcp = std::net::TcpStream::connect(addr).unwrap();
        tcp.set_read_timeout(Some(T)).unwrap();
        write!(
            tcp,
            "GET /api/v1/namespaces/default/pods?watch=true&fieldSelector=metadata.name%3Dweb \
             HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        .unwrap();
        // Chunked: a size line, then the event, each on a line of its own.
        let lines = BufReader::new(tcp).lines().map(Result::unwrap);
        lines
            .filter(|l| l.starts_with('{'))
            .take(3)
            .map(|l| serde_json::from_str::<serde_json::Value>(&l).unwrap())
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    let seen: Vec<(&str, &str, &str)> = events
        .iter()
        .map(|e| {
            let m = &e["object"]["metadata"];
            let (kind, name, version) = (&e["type"], &m["name"], &m["resourceVersion"]);
            (
                kind.as_str().unwrap(),
                name.as_str().unwrap(),
                version.as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("ADDED", "web", "1"),
            ("MODIFIED", "web", "2"),
            ("MODIFIED", "web", "3")
        ]
    );
    let log = tokio::task::spawn_blocking(move || {
        let mut tcp = std::net::TcpStream::connect(addr).unwrap();
        tcp.set_read_timeout(Some(T)).unwrap();
        write!(
            tcp,
            "GET /api/v1/namespaces/default/pods/web/log?follow=true&limitBytes=140 HTTP/1.0\r\n\r\n"
        )
        .unwrap();
        let mut all = String::new();
        tcp.read_to_string(&mut all).unwrap();
        all.split_once("\r\n\r\n").unwrap().1.to_owned()
    })
    .await
    .unwrap();
    let lines: String = (1..=13).map(|n| format!("log line {n}\n")).collect();
    assert_eq!(log, lines[..140]);
    sim.shutdown().await;
}
