//! `--upstream-streaming auto|spdy|websocket` against each simulated cluster mode (SpdyOnly,
//! New, WebSocketOnly), with real kubectls through the SPDY-dropping gateway. Which path a
//! session took is read from the cluster (did it serve a v5 / tunnel WebSocket or SPDY?), from
//! the proxy's metrics (`websocket_pass_through` vs `exec` / `portforward_tunnel`) and, where
//! the audit log is on, from its `protocol_path`.
//!
//! Expected failures: `spdy` against a WebSocket-only path (the cluster's 400 to the SPDY
//! upgrade arrives as an InternalError Status), `websocket` against an old cluster (a
//! BadGateway Status naming the setting).

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::clients::require_kubectl;
use common::exec_suite::{attach, basics, copy_files, tty_size};
use common::forward::{self, Forward};
use common::harness::{run, stderr, stdout, Harness};
use common::pod_server::PodServer;
use kube_ws_proxy::sim::{SimConfig, SimEvent, SimStreaming, Transport};

const T: Duration = Duration::from_secs(120);

async fn harness(streaming: SimStreaming, setting: &str, extra: &[&str]) -> Harness {
    let mut flags = vec!["--upstream-streaming", setting];
    flags.extend_from_slice(extra);
    Harness::start_with(
        SimConfig {
            streaming,
            ..SimConfig::default()
        },
        &flags,
    )
    .await
}

/// `(transport, protocol)` of every session the cluster served.
fn sessions(h: &Harness) -> Vec<(Transport, String)> {
    h.sim
        .events()
        .into_iter()
        .filter_map(|e| match e {
            SimEvent::SessionStarted {
                transport,
                protocol,
                ..
            } => Some((transport, protocol)),
            _ => None,
        })
        .collect()
}

/// Upgrade requests the cluster saw that offered `v5.channel.k8s.io` or the tunnel.
fn websocket_streaming_requests(h: &Harness) -> usize {
    h.sim
        .requests()
        .iter()
        .filter(|r| {
            r.header("sec-websocket-protocol").is_some_and(|p| {
                p.contains("v5.channel.k8s.io") || p.contains("SPDY/3.1+portforward.k8s.io")
            })
        })
        .count()
}

/// The sessions_total value for a kind label, summed over outcomes.
fn sessions_total(h: &Harness, kind: &str) -> u64 {
    h.proxy
        .metrics()
        .lines()
        .filter(|l| l.starts_with("kube_ws_proxy_sessions_total{"))
        .filter(|l| l.contains(&format!("kind=\"{kind}\"")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

fn assert_no_spdy_fallback(h: &Harness) {
    assert!(
        h.middlebox.websockets() > 0,
        "no WebSocket reached the proxy"
    );
    assert_eq!(h.middlebox.dropped(), 0, "kubectl fell back to SPDY");
}

/// Every session the cluster served was v5 or the tunnel over WebSocket: passed through.
fn assert_passed_through(h: &Harness) {
    let s = sessions(h);
    assert!(!s.is_empty());
    for (transport, protocol) in &s {
        assert_eq!(*transport, Transport::WebSocket, "{s:?}");
        assert!(
            protocol == "v5.channel.k8s.io" || protocol == "SPDY/3.1+portforward.k8s.io",
            "{s:?}"
        );
    }
    assert!(sessions_total(h, "websocket_pass_through") > 0);
    assert_eq!(sessions_total(h, "exec"), 0);
    assert_eq!(sessions_total(h, "portforward_tunnel"), 0);
}

/// Every session the cluster served was SPDY: translated.
fn assert_translated(h: &Harness) {
    let s = sessions(h);
    assert!(!s.is_empty());
    assert!(s.iter().all(|(t, _)| *t == Transport::Spdy), "{s:?}");
    assert_eq!(sessions_total(h, "websocket_pass_through"), 0);
}

async fn port_forward(h: &Harness, kubectl: &Path) {
    let pod = PodServer::commands().await;
    let f = Forward::start(h.kubectl(kubectl, &h.via_gateway), "web", &[pod.port]).await;
    assert!(f.ready(), "port-forward did not start: {}", f.stderr());
    forward::echo(f.port(pod.port), 4 << 20).await;
    forward::echo(f.port(pod.port), 1).await;
}

/// exec (output, exit codes, stderr, stdin EOF), tty size, cp, attach, port-forward.
async fn full_suite(h: &Harness, kubectl: &Path) {
    basics(h, kubectl, &h.via_gateway).await;
    tty_size(h, kubectl, &h.via_gateway).await;
    copy_files(h, kubectl, &h.via_gateway).await;
    attach(h, kubectl, &h.via_gateway).await;
    port_forward(h, kubectl).await;
    assert_no_spdy_fallback(h);
}

macro_rules! passes_through {
    ($name:ident, $minor:literal, $mode:expr, $setting:literal) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let Some(k) = require_kubectl($minor) else {
                return;
            };
            let h = harness($mode, $setting, &[]).await;
            full_suite(&h, &k).await;
            assert_passed_through(&h);
        }
    };
}

passes_through!(
    new_cluster_auto_kubectl_1_33,
    "1.33",
    SimStreaming::New,
    "auto"
);
passes_through!(
    new_cluster_auto_kubectl_1_32,
    "1.32",
    SimStreaming::New,
    "auto"
);
passes_through!(
    new_cluster_auto_kubectl_1_31,
    "1.31",
    SimStreaming::New,
    "auto"
);
passes_through!(
    new_cluster_websocket_kubectl_1_33,
    "1.33",
    SimStreaming::New,
    "websocket"
);
passes_through!(
    websocket_only_cluster_auto_kubectl_1_33,
    "1.33",
    SimStreaming::WebSocketOnly,
    "auto"
);
passes_through!(
    websocket_only_cluster_websocket_kubectl_1_31,
    "1.31",
    SimStreaming::WebSocketOnly,
    "websocket"
);

macro_rules! translates {
    ($name:ident, $minor:literal, $mode:expr, $setting:literal) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let Some(k) = require_kubectl($minor) else {
                return;
            };
            let h = harness($mode, $setting, &[]).await;
            full_suite(&h, &k).await;
            assert_translated(&h);
        }
    };
}

translates!(
    old_cluster_auto_kubectl_1_33,
    "1.33",
    SimStreaming::SpdyOnly,
    "auto"
);
translates!(
    old_cluster_auto_kubectl_1_31,
    "1.31",
    SimStreaming::SpdyOnly,
    "auto"
);
translates!(
    old_cluster_spdy_kubectl_1_32,
    "1.32",
    SimStreaming::SpdyOnly,
    "spdy"
);
translates!(
    new_cluster_spdy_kubectl_1_33,
    "1.33",
    SimStreaming::New,
    "spdy"
);

/// `auto` against an old cluster pays the fallback once: the first v5 session and the first
/// tunnel ask with WebSocket, everything after goes straight to SPDY; the decision is logged
/// once per family.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_remembers_an_old_cluster() {
    let Some(k) = require_kubectl("1.33") else {
        return;
    };
    let h = harness(SimStreaming::SpdyOnly, "auto", &[]).await;
    for i in 0..3 {
        let mut c = h.kubectl(&k, &h.via_gateway);
        c.args(["exec", "web", "--", "echo", &format!("session {i}")]);
        let o = run(c, None, T).await;
        assert!(o.status.success(), "{}", stderr(&o));
        assert_eq!(stdout(&o), format!("session {i}\n"));
    }
    assert_eq!(
        websocket_streaming_requests(&h),
        1,
        "the fallback was paid again"
    );
    port_forward(&h, &k).await;
    port_forward(&h, &k).await;
    assert_eq!(websocket_streaming_requests(&h), 2);
    assert_no_spdy_fallback(&h);
    assert_translated(&h);
    let logs = h.proxy.log_lines();
    let decided = logs
        .iter()
        .filter(|l| l.contains("upstream does not speak WebSocket streaming: translating to SPDY"))
        .count();
    assert_eq!(decided, 2, "one decision per family: {logs:#?}");
    assert!(!logs.iter().any(|l| l.contains("passing through")));
}

/// `auto` against a new cluster logs its decision once and never asks with SPDY.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_logs_pass_through_once() {
    let Some(k) = require_kubectl("1.33") else {
        return;
    };
    let h = harness(SimStreaming::New, "auto", &[]).await;
    for _ in 0..2 {
        let mut c = h.kubectl(&k, &h.via_gateway);
        c.args(["exec", "web", "--", "true"]);
        let o = run(c, None, T).await;
        assert!(o.status.success(), "{}", stderr(&o));
    }
    assert!(!h.sim.requests().iter().any(|r| r
        .header("upgrade")
        .is_some_and(|u| u.eq_ignore_ascii_case("SPDY/3.1"))));
    let decided = h
        .proxy
        .log_lines()
        .iter()
        .filter(|l| l.contains("upstream speaks WebSocket streaming: passing through"))
        .count();
    assert_eq!(decided, 1);
}

/// The cluster's own refusals are delivered under auto, never retried with SPDY.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_delivers_the_clusters_refusal() {
    let Some(k) = require_kubectl("1.33") else {
        return;
    };
    let h = harness(SimStreaming::New, "auto", &[]).await;
    let mut c = h.kubectl(&k, &h.via_gateway);
    c.args(["exec", "forbidden-pod", "--", "true"]);
    let o = run(c, None, T).await;
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("is forbidden"), "{}", stderr(&o));
    assert_no_spdy_fallback(&h);
    assert!(!h.sim.requests().iter().any(|r| r
        .header("upgrade")
        .is_some_and(|u| u.eq_ignore_ascii_case("SPDY/3.1"))));
    // Not learned as an old cluster: the next session still passes through.
    let mut c = h.kubectl(&k, &h.via_gateway);
    c.args(["exec", "web", "--", "echo", "still"]);
    let o = run(c, None, T).await;
    assert_eq!(stdout(&o), "still\n", "{}", stderr(&o));
    assert_passed_through(&h);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_against_an_old_cluster_fails_clearly() {
    let Some(k) = require_kubectl("1.33") else {
        return;
    };
    let h = harness(SimStreaming::SpdyOnly, "websocket", &[]).await;
    let mut c = h.kubectl(&k, &h.via_gateway);
    c.args(["exec", "web", "--", "echo", "never"]);
    let o = run(c, None, T).await;
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("--upstream-streaming=websocket"),
        "{}",
        stderr(&o)
    );
    // Reported inside the WebSocket: no SPDY retry reached the gateway.
    assert_no_spdy_fallback(&h);
    assert!(sessions(&h).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spdy_against_a_websocket_only_cluster_fails_clearly() {
    let Some(k) = require_kubectl("1.33") else {
        return;
    };
    let h = harness(SimStreaming::WebSocketOnly, "spdy", &[]).await;
    let mut c = h.kubectl(&k, &h.via_gateway);
    c.args(["exec", "web", "--", "echo", "never"]);
    let o = run(c, None, T).await;
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("SPDY upgrades are not allowed"),
        "{}",
        stderr(&o)
    );
    assert_no_spdy_fallback(&h);
    assert!(sessions(&h).is_empty());
}

/// SPDY clients (kubectl 1.28 exec, 1.27 and 1.28 port-forward, straight to the proxy) keep
/// being relayed against old and new clusters under `auto`, and work under `websocket`, where
/// they are translated the other way. kubectl 1.30
/// already tries v5 for exec and 1.31 the tunnel for port-forward.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spdy_clients_are_still_relayed() {
    let (Some(k27), Some(k28)) = (require_kubectl("1.27"), require_kubectl("1.28")) else {
        return;
    };
    for (mode, setting) in [
        (SimStreaming::SpdyOnly, "auto"),
        (SimStreaming::New, "auto"),
        (SimStreaming::New, "websocket"),
    ] {
        let h = harness(mode, setting, &[]).await;
        let mut c = h.kubectl(&k28, &h.direct);
        c.args(["exec", "-i", "web", "--", "sh", "-c", "cat; exit 4"]);
        let o = run(c, Some(b"relayed\n".to_vec()), T).await;
        assert_eq!(
            o.status.code(),
            Some(4),
            "{mode:?} {setting}: {}",
            stderr(&o)
        );
        assert_eq!(stdout(&o), "relayed\n");
        for k in [&k27, &k28] {
            let pod = PodServer::commands().await;
            let f = Forward::start(h.kubectl(k, &h.direct), "web", &[pod.port]).await;
            assert!(f.ready(), "port-forward did not start: {}", f.stderr());
            forward::echo(f.port(pod.port), 1 << 20).await;
        }
        // Counted when a session ends: the port-forwards end as their kubectl is killed.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while setting != "websocket"
            && sessions_total(&h, "spdy_relay") < 3
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // `websocket` says the upstream takes WebSockets only: SPDY clients are translated
        // the other way (tests/e2e_reverse.rs), never relayed.
        let relayed = if setting == "websocket" { 0 } else { 3 };
        if relayed == 0 {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        assert_eq!(
            sessions_total(&h, "spdy_relay"),
            relayed,
            "{mode:?} {setting}"
        );
        assert_eq!(sessions_total(&h, "websocket_pass_through"), 0);
    }
}

/// The audit log names the path: `pass_through` for a session passed to a new cluster,
/// `translated` after auto fell back against an old one. The pass-through is recorded by
/// following its v5 channels (as relays are), which is also where its exit code comes from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_names_the_path() {
    let Some(k) = require_kubectl("1.33") else {
        return;
    };
    for (mode, path) in [
        (SimStreaming::New, "pass_through"),
        (SimStreaming::SpdyOnly, "translated"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("audit.log");
        let log_arg = log.display().to_string();
        let casts = dir.path().join("casts");
        std::fs::create_dir_all(&casts).unwrap();
        let casts_arg = casts.display().to_string();
        let flags = [
            "--audit-log",
            &log_arg,
            "--record",
            "best-effort",
            "--record-dir",
            &casts_arg,
        ];
        let h = harness(mode, "auto", &flags).await;
        let mut c = h.kubectl(&k, &h.via_gateway);
        c.args([
            "exec",
            "audited-pod",
            "--",
            "sh",
            "-c",
            "echo recorded; exit 6",
        ]);
        let o = run(c, None, T).await;
        assert_eq!(o.status.code(), Some(6), "{}", stderr(&o));
        let ended = common::replay::ended_event(&log, "audited-pod", path).await;
        assert_eq!(ended["exit_code"], 6, "{ended}");
        let (_, text) = common::replay::complete_recording(&ended);
        assert!(text.contains("recorded"), "{text}");
    }
}

// ---- issue #28: nobody can poison `auto` for other users ----------------------------------

/// One raw HTTP/1.1 request to `addr` (what no kubectl sends); the answer's status code and
/// as much of the rest as arrives within two seconds.
async fn raw_request(addr: std::net::SocketAddr, head: String) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    let mut buf = [0u8; 16 * 1024];
    while let Ok(Ok(n)) = tokio::time::timeout_at(deadline, tcp.read(&mut buf)).await {
        if n == 0 {
            break;
        }
        answer.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&answer).into_owned();
    let code = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, text)
}

/// A v5 exec or tunnel WebSocket upgrade for `path`.
fn websocket_upgrade(path: &str, protocol: &str) -> String {
    format!(
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
         Sec-WebSocket-Protocol: {protocol}\r\n\r\n"
    )
}

/// A SPDY upgrade (kubectl ≤ 1.30's) for `path`.
fn spdy_upgrade(path: &str, protocol: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\
         X-Stream-Protocol-Version: {protocol}\r\nContent-Length: 0\r\n\r\n"
    )
}

const EXEC_Q: &str = "exec?command=true&stdout=true&stderr=true";

/// What an unauthenticated stranger can send to make the upstream answer something that is not
/// a Status: a bad `%zz` escape on every streaming request, WebSocket and SPDY (Go's server
/// answers it in plain text; the proxy now refuses it itself with a Status, before anything goes
/// upstream), and a crash-looping pod's plain-text kubelet error on every path.
async fn poison(h: &Harness) {
    let addr = h.proxy.addr;
    let pods = "/api/v1/namespaces/default/pods";
    let bad = [
        websocket_upgrade(&format!("{pods}/bad%zz/{EXEC_Q}"), "v5.channel.k8s.io"),
        websocket_upgrade(
            &format!("{pods}/bad%zz/portforward"),
            "SPDY/3.1+portforward.k8s.io",
        ),
        spdy_upgrade(&format!("{pods}/bad%zz/{EXEC_Q}"), "v4.channel.k8s.io"),
        spdy_upgrade(&format!("{pods}/bad%zz/portforward"), "portforward.k8s.io"),
        websocket_upgrade(
            &format!("{pods}/error500-crashloop/portforward"),
            "SPDY/3.1+portforward.k8s.io",
        ),
        spdy_upgrade(
            &format!("{pods}/error500-crashloop/{EXEC_Q}"),
            "v4.channel.k8s.io",
        ),
        websocket_upgrade(
            &format!("{pods}/error500-crashloop/{EXEC_Q}"),
            "v5.channel.k8s.io",
        ),
        spdy_upgrade(
            &format!("{pods}/error500-crashloop/portforward"),
            "portforward.k8s.io",
        ),
    ];
    for (i, head) in bad.into_iter().enumerate() {
        let (code, answer) = raw_request(addr, head).await;
        match i {
            // A path Go cannot decode is refused by the proxy itself, as Go's server refuses
            // it (a 400 Status): it never reaches the upstream.
            0..=3 => {
                assert_eq!(code, 400, "{answer}");
                assert!(answer.contains("\"kind\":\"Status\""), "{answer}");
            }
            // The kubelet's plain-text errors on every path.
            _ => assert_ne!(code, 0, "no answer"),
        }
    }
}

/// kubectl 1.33 exec through the SPDY-dropping gateway, and kubectl 1.28 exec straight.
async fn both_kubectls_exec(h: &Harness, k33: &Path, k28: &Path, what: &str) {
    let mut c = h.kubectl(k33, &h.via_gateway);
    c.args(["exec", "web", "--", "echo", "from 1.33"]);
    let o = run(c, None, T).await;
    assert_eq!(stdout(&o), "from 1.33\n", "{what}: {}", stderr(&o));
    let mut c = h.kubectl(k28, &h.direct);
    c.args(["exec", "-i", "web", "--", "sh", "-c", "cat; exit 3"]);
    let o = run(c, Some(b"from 1.28\n".to_vec()), T).await;
    assert_eq!(o.status.code(), Some(3), "{what}: {}", stderr(&o));
    assert_eq!(stdout(&o), "from 1.28\n", "{what}");
}

/// Requests whose upstream answers are not Statuses teach `auto` nothing: afterwards kubectl
/// 1.33 (exec, port-forward through the gateway) and kubectl 1.28 (exec, port-forward) work on
/// every cluster kind they worked on before. On the old code each such answer made `auto`
/// remember the other path for everyone: 1.33 then failed on the WebSocket-only cluster and
/// 1.28 on the old one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_that_are_not_statuses_do_not_change_the_path_for_others() {
    let (Some(k33), Some(k28)) = (require_kubectl("1.33"), require_kubectl("1.28")) else {
        return;
    };
    for mode in [
        SimStreaming::WebSocketOnly,
        SimStreaming::SpdyOnly,
        SimStreaming::New,
    ] {
        let h = harness(mode, "auto", &[]).await;
        poison(&h).await;
        let logs = h.proxy.log_lines();
        assert!(
            !logs.iter().any(|l| l.contains("translating to SPDY")),
            "{mode:?}: learned from a refusal: {logs:#?}"
        );
        both_kubectls_exec(&h, &k33, &k28, &format!("{mode:?}")).await;
        port_forward(&h, &k33).await;
        assert_no_spdy_fallback(&h);
        let pod = PodServer::commands().await;
        let f = Forward::start(h.kubectl(&k28, &h.direct), "web", &[pod.port]).await;
        assert!(f.ready(), "{mode:?}: 1.28 port-forward: {}", f.stderr());
        forward::echo(f.port(pod.port), 1 << 16).await;
    }
}

/// A Status larger than 64 KiB (an admission webhook's long denial) is the cluster's answer:
/// kubectl 1.33 and 1.28 print all of it, and the next caller's session is unchanged. On the
/// old code it was cut at 64 KiB, no longer parsed as a Status, retried on the other path
/// (whose answer kubectl printed instead) and that path remembered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_larger_than_64_kib_is_delivered_whole_and_teaches_nothing() {
    let (Some(k33), Some(k28)) = (require_kubectl("1.33"), require_kubectl("1.28")) else {
        return;
    };
    for mode in [SimStreaming::WebSocketOnly, SimStreaming::SpdyOnly] {
        let h = harness(mode, "auto", &[]).await;
        for (k, kubeconfig) in [(&k33, &h.via_gateway), (&k28, &h.direct)] {
            let mut c = h.kubectl(k, kubeconfig);
            c.args(["exec", "denied-pod", "--", "true"]);
            let o = run(c, None, T).await;
            let err = stderr(&o);
            assert_eq!(o.status.code(), Some(1), "{mode:?} {k:?}: {err}");
            assert!(err.contains("admission webhook"), "{mode:?} {k:?}: {err}");
            assert!(err.contains("end of denial"), "{mode:?} {k:?}: cut: {err}");
            assert!(err.len() > 64 * 1024, "{mode:?} {k:?}: {}", err.len());
        }
        let logs = h.proxy.log_lines();
        assert!(
            !logs.iter().any(|l| l.contains("translating")),
            "{mode:?}: learned from a Status: {logs:#?}"
        );
        both_kubectls_exec(&h, &k33, &k28, &format!("{mode:?}")).await;
        assert_no_spdy_fallback(&h);
    }
}

/// A TCP relay whose target can be switched: the cluster behind one address is replaced.
struct Switch {
    addr: std::net::SocketAddr,
    target: std::sync::Arc<std::sync::Mutex<std::net::SocketAddr>>,
}

impl Switch {
    async fn start(target: std::net::SocketAddr) -> Switch {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let target = std::sync::Arc::new(std::sync::Mutex::new(target));
        let current = target.clone();
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let to = *current.lock().unwrap();
                tokio::spawn(async move {
                    if let Ok(mut out) = tokio::net::TcpStream::connect(to).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                    }
                });
            }
        });
        Switch { addr, target }
    }

    fn to(&self, target: std::net::SocketAddr) {
        *self.target.lock().unwrap() = target;
    }
}

/// Upgrade requests of one kind a cluster saw: `websocket` (v5 or the tunnel) or SPDY.
fn upgrades_seen(sim: &kube_ws_proxy::sim::SimCluster, websocket: bool) -> usize {
    sim.requests()
        .iter()
        .filter(|r| {
            if websocket {
                r.header("sec-websocket-protocol")
                    .is_some_and(|p| p.contains("v5.channel.k8s.io"))
            } else {
                r.header("upgrade")
                    .is_some_and(|u| u.eq_ignore_ascii_case("SPDY/3.1"))
            }
        })
        .count()
}

/// A remembered path that stops working (the cluster behind the address changed) is tried
/// once, forgotten, and the client's own path asked in the same session: kubectl never sees
/// the change, and the next session goes straight to the path that works. On the old code the
/// remembered path kept being used until the memory expired: kubectl 1.28 failed on the old
/// cluster, kubectl 1.33 on the WebSocket-only one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remembered_path_that_stops_working_is_retried_once_and_forgotten() {
    let (Some(k33), Some(k28)) = (require_kubectl("1.33"), require_kubectl("1.28")) else {
        return;
    };
    let start = |streaming| {
        kube_ws_proxy::sim::SimCluster::start(SimConfig {
            streaming,
            ..SimConfig::default()
        })
    };
    let old = start(SimStreaming::SpdyOnly).await.unwrap();
    let ws_only = start(SimStreaming::WebSocketOnly).await.unwrap();
    let switch = Switch::start(ws_only.addr()).await;
    let proxy = common::proxy_process::ProxyProcess::start(
        &format!("http://{}", switch.addr),
        &["--upstream-streaming", "auto"],
    );
    let middlebox = common::middlebox::Middlebox::start(proxy.addr).await;
    let dir = tempfile::tempdir().unwrap();
    let (gw, direct) = (dir.path().join("gw"), dir.path().join("direct"));
    std::fs::create_dir_all(&gw).unwrap();
    std::fs::create_dir_all(&direct).unwrap();
    let via_gateway =
        common::clients::write_kubeconfig(&gw, &format!("http://{}", middlebox.addr), None);
    let direct = common::clients::write_kubeconfig(&direct, &proxy.url(), None);
    let h = Harness {
        sim: old,
        proxy,
        middlebox,
        dir,
        via_gateway,
        direct,
    };
    // WebSocket-only: kubectl 1.28's SPDY is learned to go to the reverse translator.
    both_kubectls_exec(&h, &k33, &k28, "websocket-only").await;
    // The cluster is replaced by an old one: the remembered reverse translator fails once.
    switch.to(h.sim.addr());
    both_kubectls_exec(&h, &k33, &k28, "old, reverse remembered").await;
    both_kubectls_exec(&h, &k33, &k28, "old").await;
    assert_eq!(upgrades_seen(&h.sim, true), 2, "v5 asked once per client");
    // And back: the remembered SPDY translation fails once.
    switch.to(ws_only.addr());
    let spdy_before = upgrades_seen(&ws_only, false);
    both_kubectls_exec(&h, &k33, &k28, "websocket-only, SPDY remembered").await;
    both_kubectls_exec(&h, &k33, &k28, "websocket-only").await;
    assert_eq!(
        upgrades_seen(&ws_only, false) - spdy_before,
        2,
        "SPDY asked once per client"
    );
    let forgotten = h
        .proxy
        .log_lines()
        .iter()
        .filter(|l| l.contains("the remembered upstream path refused a session: forgotten"))
        .count();
    assert_eq!(forgotten, 2);
    assert_no_spdy_fallback(&h);
}

/// A tunnel the upstream refuses under `websocket` is counted as a passed-through session that
/// ended with an upstream error, as a refused passed-through exec is: every session kind ends
/// on one path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_passed_through_tunnel_counts_as_a_session() {
    let h = harness(SimStreaming::New, "websocket", &[]).await;
    let path = "/api/v1/namespaces/default/pods/error500-crashloop/portforward";
    let head = websocket_upgrade(path, "SPDY/3.1+portforward.k8s.io");
    let (code, answer) = raw_request(h.proxy.addr, head).await;
    // The kubelet's plain-text 500 is no Status: the proxy says what it means instead.
    assert_eq!(code, 502, "{answer}");
    assert!(
        answer.contains("--upstream-streaming=websocket"),
        "{answer}"
    );
    assert_eq!(sessions_total(&h, "websocket_pass_through"), 1);
    let metrics = h.proxy.metrics();
    assert!(
        metrics.contains(
            r#"kube_ws_proxy_sessions_total{cluster="default",kind="websocket_pass_through",outcome="upstream_error"} 1"#
        ),
        "{metrics}"
    );
}
