//! What one cluster of a fleet does never reaches another's: its callers are reviewed by the
//! cluster their request goes to (TokenReview in impersonate mode, SelfSubjectReview in
//! passthrough with the audit log), so a token valid on one cluster only is refused on the
//! other; `--upstream-streaming auto` learns each cluster's path for that cluster alone; and a
//! cluster that accepts connections and never answers holds only its own requests, while
//! another cluster's plain requests and execs complete.

use crate::common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::bearer;
use common::clients::{require_kubectl, write_kubeconfig};
use common::harness::{run, stderr, stdout};
use common::middlebox::Middlebox;
use common::proxy_process::ProxyProcess;
use common::ws_client;
use kube_ws_proxy::sim::{SimCluster, SimConfig, SimStreaming, SimUser};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::e2e_fleet::{audit_events, Fleet, CLUSTERS};

const T: Duration = Duration::from_secs(120);
/// Valid on the clusters of side A only, side B only.
const ALICE: &str = "alice-token-on-a";
const BOB: &str = "bob-token-on-b";

/// A cluster knowing `caller` (token, name) and the proxy's own `proxy` (token, name), which
/// may impersonate.
async fn reviewing_sim(caller: (&str, &str), proxy: (&str, &str)) -> SimCluster {
    let user = |(token, name): (&str, &str)| SimUser {
        token: token.to_owned(),
        name: name.to_owned(),
        groups: Vec::new(),
    };
    SimCluster::start(SimConfig {
        users: vec![user(caller), user(proxy)],
        impersonators: vec![proxy.1.to_owned()],
        ..SimConfig::default()
    })
    .await
    .expect("start sim cluster")
}

/// A v5 `echo hi` on `cluster` with `token` in the subprotocol: its stdout, or the status the
/// handshake was refused with.
async fn exec(addr: SocketAddr, cluster: &str, token: &str) -> Result<Vec<u8>, u16> {
    let path = format!(
        "/clusters/{cluster}{}",
        ws_client::exec_path("web", &["echo", "hi"], false, true, false)
    );
    let protocols = format!("v5.channel.k8s.io, {}", bearer::entry(token));
    match ws_client::connect(addr, &path, &protocols).await {
        Ok((mut ws, _)) => Ok(ws_client::read_to_close(&mut ws).await.stdout),
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => Err(r.status().as_u16()),
        Err(e) => panic!("{cluster}: {e}"),
    }
}

/// A plain GET of a pod on `cluster` with `token`: the status.
async fn get(addr: SocketAddr, cluster: &str, token: &str) -> u16 {
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "GET /clusters/{cluster}/api/v1/namespaces/default/pods/web HTTP/1.1\r\nHost: x\r\n\
         Authorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tcp.read_to_end(&mut answer).await.unwrap();
    let answer = String::from_utf8_lossy(&answer);
    // 0: no answer (the proxy went away with the test).
    let code = answer.split(' ').nth(1).and_then(|c| c.parse().ok());
    code.unwrap_or(0)
}

/// SelfSubjectReviews `sim` answered.
fn self_reviews(sim: &SimCluster) -> usize {
    let reviews = sim.requests();
    let reviews = reviews.iter();
    reviews
        .filter(|r| r.path.ends_with("/selfsubjectreviews"))
        .count()
}

/// Exec requests `sim` saw.
fn execs(sim: &SimCluster) -> usize {
    sim.requests()
        .iter()
        .filter(|r| r.path.ends_with("/exec"))
        .count()
}

/// The proxy's config file entry for cluster `name` at `sim`: impersonating with `token`
/// (a file in `dir`), or passing its callers' credentials through.
fn entry(dir: &Path, name: &str, sim: &SimCluster, token: Option<&str>) -> String {
    let mut e = format!("- name: {name}\n  upstream: {}\n", sim.url());
    match token {
        Some(token) => {
            let file = dir.join(format!("{name}.token"));
            std::fs::write(&file, token).unwrap();
            e.push_str(&format!(
                "  auth-mode: impersonate\n  upstream-token-file: {}\n",
                file.display()
            ));
        }
        None => e.push_str("  auth-mode: passthrough\n"),
    }
    e
}

/// Impersonate mode: `a` and `b` each review with their own TokenReview, in either order of
/// a positive and a negative answer, so neither a shared cache nor a shared reviewer passes.
async fn token_reviews_go_to_the_requests_cluster(
    addr: SocketAddr,
    a: &SimCluster,
    b: &SimCluster,
) {
    assert_eq!(get(addr, "a", ALICE).await, 200);
    assert_eq!(exec(addr, "a", ALICE).await, Ok(b"hi\n".to_vec()));
    let reviewed_at_a = a.token_reviews();
    assert!(reviewed_at_a >= 1, "a reviewed nothing");
    assert_eq!(b.token_reviews(), 0, "b reviewed a's caller");
    // Alice, just accepted at a, is b's to judge: b does not know her.
    assert_eq!(get(addr, "b", ALICE).await, 401, "b took a's token");
    assert_eq!(exec(addr, "b", ALICE).await, Err(401), "b took a's token");
    assert!(b.token_reviews() >= 1, "b did not review");
    assert_eq!(exec(addr, "b", BOB).await, Ok(b"hi\n".to_vec()));
    assert_eq!(get(addr, "b", BOB).await, 200);
    assert_eq!(a.token_reviews(), reviewed_at_a, "a reviewed b's requests");
    // Bob, just accepted at b, is refused at a, by a.
    let reviewed_at_b = b.token_reviews();
    assert_eq!(get(addr, "a", BOB).await, 401, "a took b's token");
    assert_eq!(a.token_reviews(), reviewed_at_a + 1);
    assert_eq!(b.token_reviews(), reviewed_at_b, "b reviewed a's request");
    // What reached each cluster came from the proxy's credentials for it, as its own caller.
    for (sim, proxy, caller) in [(a, "proxy-a", "alice"), (b, "proxy-b", "bob")] {
        for r in sim.requests() {
            let who = r.authenticated_user.as_ref().map(|u| u.name.as_str());
            assert_eq!(who, Some(proxy), "{proxy}'s cluster: {} by {who:?}", r.path);
            if !r.path.ends_with("/tokenreviews") {
                let user = r.user.as_ref().map(|u| u.name.as_str());
                assert_eq!(user, Some(caller), "{}", r.path);
            }
        }
    }
}

/// Passthrough with the audit log: each caller's SelfSubjectReview is asked of the cluster the
/// session goes to; one that cluster does not authenticate is refused before its exec is sent.
async fn self_reviews_go_to_the_requests_cluster(
    addr: SocketAddr,
    pa: &SimCluster,
    pb: &SimCluster,
) {
    assert_eq!(exec(addr, "pa", ALICE).await, Ok(b"hi\n".to_vec()));
    let asked_pa = self_reviews(pa);
    assert!(asked_pa >= 1, "pa was not asked");
    assert!(pb.requests().is_empty(), "pb saw a's session");
    // Alice's review at pa (cached there) says nothing of her at pb.
    assert_eq!(exec(addr, "pb", ALICE).await, Err(401), "pb took a's token");
    assert_eq!(self_reviews(pb), 1, "pb was not asked");
    assert_eq!(execs(pb), 0, "an unauthenticated exec went to pb");
    assert_eq!(exec(addr, "pb", BOB).await, Ok(b"hi\n".to_vec()));
    let execs_at_pa = execs(pa);
    assert_eq!(exec(addr, "pa", BOB).await, Err(401), "pa took b's token");
    assert_eq!(execs(pa), execs_at_pa, "an unauthenticated exec went to pa");
    assert_eq!(self_reviews(pa), asked_pa + 1);
    assert_eq!(self_reviews(pb), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_callers_review_is_made_by_the_cluster_the_request_goes_to() {
    let a = reviewing_sim((ALICE, "alice"), ("proxy-token-of-a", "proxy-a")).await;
    let b = reviewing_sim((BOB, "bob"), ("proxy-token-of-b", "proxy-b")).await;
    let pa = reviewing_sim((ALICE, "alice"), ("unused-token-of-pa", "nobody-a")).await;
    let pb = reviewing_sim((BOB, "bob"), ("unused-token-of-pb", "nobody-b")).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    let audit = dir.path().join("audit.log");
    let d = dir.path();
    std::fs::write(
        &config,
        format!(
            "clusters:\n{}{}{}{}",
            entry(d, "a", &a, Some("proxy-token-of-a")),
            entry(d, "b", &b, Some("proxy-token-of-b")),
            entry(d, "pa", &pa, None),
            entry(d, "pb", &pb, None),
        ),
    )
    .unwrap();
    let proxy = ProxyProcess::launch(
        &[
            "--config",
            config.to_str().unwrap(),
            "--audit-log",
            audit.to_str().unwrap(),
        ],
        &[],
    );
    token_reviews_go_to_the_requests_cluster(proxy.addr, &a, &b).await;
    self_reviews_go_to_the_requests_cluster(proxy.addr, &pa, &pb).await;
    // Each passthrough session's audited identity is the one its own cluster gave.
    let events = audit_events(&audit, 4).await;
    for (cluster, user) in [("a", "alice"), ("b", "bob"), ("pa", "alice"), ("pb", "bob")] {
        let ended: Vec<&Value> = events
            .iter()
            .filter(|e| e["cluster"] == cluster && e["stage"] == "ended")
            .collect();
        assert_eq!(ended.len(), 1, "{cluster}: {events:#?}");
        assert_eq!(ended[0]["user"], user, "{}", ended[0]);
    }
}

/// Upgrade requests `sim` saw offering v5 or the tunnel (WebSocket), or SPDY.
fn upgrades(sim: &SimCluster, websocket: bool) -> usize {
    sim.requests()
        .iter()
        .filter(|r| match websocket {
            true => r
                .header("sec-websocket-protocol")
                .is_some_and(|p| p.contains("v5.channel.k8s.io")),
            false => r
                .header("upgrade")
                .is_some_and(|u| u.eq_ignore_ascii_case("SPDY/3.1")),
        })
        .count()
}

/// kubectl 1.33 execs through the SPDY-dropping gateway, round after round, on an old, a new
/// and a WebSocket-only cluster, all three `auto`: each session takes its own cluster's path,
/// whatever the session before it (on another cluster) taught the proxy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_detection_is_remembered_per_cluster() {
    let Some(k) = require_kubectl("1.33") else {
        return;
    };
    let f = Fleet::start_with(false, |dir| {
        let audit = dir.join("audit.log");
        vec!["--audit-log".to_owned(), audit.display().to_string()]
    })
    .await;
    let audit = f.dir.path().join("audit.log");
    let paths = ["translated", "pass_through", "pass_through"];
    let mut ended = 0;
    for round in 0..3 {
        for (i, (name, _, _)) in CLUSTERS.iter().enumerate() {
            let kubeconfig = f.kubeconfig(i, true);
            let mut c = f.kubectl(&k, &kubeconfig);
            c.args(["exec", "web", "--", "echo", &format!("{name} {round}")]);
            let o = run(c, None, T).await;
            assert!(o.status.success(), "{name} {round}: {}", stderr(&o));
            assert_eq!(stdout(&o), format!("{name} {round}\n"));
            ended += 1;
            let events = audit_events(&audit, ended).await;
            let last = events.iter().rev().find(|e| e["stage"] == "ended").unwrap();
            assert_eq!(last["cluster"], *name, "{last}");
            assert_eq!(last["protocol_path"], paths[i], "{name} {round}: {last}");
        }
    }
    assert_eq!(f.middlebox.dropped(), 0, "kubectl fell back to SPDY");
    // The old cluster was asked in WebSocket once, at its first session; the new ones never
    // in SPDY.
    assert_eq!(
        upgrades(&f.sims[0], true),
        1,
        "old: the fallback was paid again"
    );
    assert_eq!(upgrades(&f.sims[0], false), 3);
    for sim in &f.sims[1..] {
        assert_eq!(upgrades(sim, false), 0, "a new cluster was asked in SPDY");
        assert_eq!(upgrades(sim, true), 3);
    }
}

/// An API server that accepts every connection, reads each request head and never answers:
/// the request lines it holds.
struct Hung {
    addr: SocketAddr,
    held: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Hung {
    async fn start() -> Hung {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let held = Arc::new(Mutex::new(Vec::new()));
        let record = held.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut tcp, _)) = listener.accept().await {
                let record = record.clone();
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match tcp.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let line = String::from_utf8_lossy(&head);
                    let line = line.lines().next().unwrap_or("").to_owned();
                    record.lock().unwrap().push(line);
                    // Hold the connection, answering nothing, until the proxy lets go.
                    while matches!(tcp.read(&mut buf).await, Ok(n) if n > 0) {}
                });
            }
        });
        Hung { addr, held, task }
    }

    /// How many held requests' lines contain `what`.
    fn holding(&self, what: &str) -> usize {
        let held = self.held.lock().unwrap();
        held.iter().filter(|l| l.contains(what)).count()
    }
}

impl Drop for Hung {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The hung cluster's requests: GETs of pods and a v5 exec, each waiting.
const HUNG_GETS: usize = 16;

/// While a cluster that never answers holds many plain requests and an exec, the healthy
/// cluster beside it serves plain requests, raw and kubectl execs (1.33 through the gateway),
/// a `kubectl get` and a port-forward; all of them complete while every request of the hung
/// cluster is still waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_cluster_does_not_hold_up_the_others() {
    let Some(k) = require_kubectl("1.33") else {
        return;
    };
    let hung = Hung::start().await;
    let healthy = common::sims::of_kind(SimStreaming::SpdyOnly).await;
    let (hung_flag, healthy_flag) = (
        format!("hung=http://{}", hung.addr),
        format!("healthy={}", healthy.url()),
    );
    // Long enough that the hung exec is still waiting when the test looks.
    let flags = ["--cluster", &hung_flag, "--cluster", &healthy_flag];
    let proxy = ProxyProcess::launch(
        &[&flags[..], &["--handshake-timeout", "300s"]].concat(),
        &[],
    );
    let addr = proxy.addr;
    let mut waiting: Vec<tokio::task::JoinHandle<()>> = (0..HUNG_GETS)
        .map(|_| {
            tokio::spawn(async move {
                get(addr, "hung", "any").await;
            })
        })
        .collect();
    waiting.push(tokio::spawn(async move {
        let _ = exec(addr, "hung", "any").await;
    }));
    // Every one of them has reached the hung cluster and waits there.
    let deadline = tokio::time::Instant::now() + T;
    while hung.holding("/pods/web ") < HUNG_GETS || hung.holding("/pods/web/exec") < 1 {
        let held = hung.held.lock().unwrap().clone();
        assert!(
            tokio::time::Instant::now() < deadline,
            "the hung cluster got only some of its requests (others queued behind them?): {held:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    tokio::time::timeout(T, serve_the_healthy_cluster(&proxy, &k, &healthy))
        .await
        .expect("the healthy cluster was held up by the hung one");

    // Everything the healthy cluster was asked completed; the hung cluster's requests are
    // all still waiting.
    for w in &waiting {
        assert!(!w.is_finished(), "a request to the hung cluster ended");
    }
    assert!(healthy
        .requests()
        .iter()
        .all(|r| !r.path.starts_with("/clusters")));
    for w in waiting {
        w.abort();
    }
}

/// Plain GETs, a raw v5 exec, kubectl execs (1.33 through the gateway), a `kubectl get` and a
/// port-forward on the healthy cluster, each completing.
async fn serve_the_healthy_cluster(proxy: &ProxyProcess, k: &Path, healthy: &SimCluster) {
    for _ in 0..HUNG_GETS {
        assert_eq!(get(proxy.addr, "healthy", "any").await, 200);
    }
    assert_eq!(
        exec(proxy.addr, "healthy", "any").await,
        Ok(b"hi\n".to_vec())
    );
    let middlebox = Middlebox::start(proxy.addr).await;
    let dir = tempfile::tempdir().unwrap();
    let server = format!("http://{}/clusters/healthy", middlebox.addr);
    let kubeconfig = write_kubeconfig(dir.path(), &server, None);
    let kubectl = || {
        let mut c = std::process::Command::new(k);
        c.arg("--kubeconfig")
            .arg(&kubeconfig)
            .env_remove("KUBECTL_REMOTE_COMMAND_WEBSOCKETS")
            .env_remove("KUBECTL_PORT_FORWARD_WEBSOCKETS")
            .env_remove("KUBECONFIG")
            .env("HOME", dir.path());
        c
    };
    crate::e2e_fleet::exercise("healthy", &kubectl).await;
    assert!(middlebox.websockets() > 0);
    assert_eq!(middlebox.dropped(), 0, "kubectl fell back to SPDY");
    assert!(execs(healthy) >= 3, "the healthy cluster served no exec");
}
