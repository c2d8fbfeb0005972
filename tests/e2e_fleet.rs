//! One proxy in front of three simulated clusters of different kinds (an old SPDY-only one, a
//! new one, a WebSocket-only one), each under `/clusters/NAME/`: real kubectls (1.33 through the
//! SPDY-dropping gateway, 1.28 straight to the proxy in SPDY) exec, port-forward and get on
//! every cluster, and no cluster sees another's sessions or the prefix; with a token per
//! cluster (sent as a browser sends it, in the WebSocket subprotocol, and as a header: kubectl
//! sends a kubeconfig token only over TLS), no cluster ever sees another's; unknown names and
//! path tricks reach no cluster and make no metric series; readiness is per cluster, on
//! `/readyz` and in `kube_ws_proxy_upstream_ready`; audit events, recordings (a folder per
//! cluster) and the log lines of sessions and upstream failures name their cluster.

use crate::common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::bearer;
use common::clients::{require_asciinema, require_kubectl, write_kubeconfig};
use common::forward::{self, Forward};
use common::harness::{run, stderr, stdout};
use common::middlebox::Middlebox;
use common::pod_server::PodServer;
use common::proxy_process::ProxyProcess;
use common::replay::replay;
use common::ws_client;
use kube_ws_proxy::sim::{SimCluster, SimConfig, SimEvent, SimStreaming};
use serde_json::Value;

const T: Duration = Duration::from_secs(120);

/// The clusters: name, kind, token.
pub(crate) const CLUSTERS: [(&str, SimStreaming, &str); 3] = [
    ("old", SimStreaming::SpdyOnly, "token-of-old"),
    ("new", SimStreaming::New, "token-of-new"),
    ("ws-only", SimStreaming::WebSocketOnly, "token-of-ws-only"),
];

pub(crate) struct Fleet {
    pub(crate) sims: Vec<SimCluster>,
    pub(crate) proxy: ProxyProcess,
    pub(crate) middlebox: Middlebox,
    pub(crate) dir: tempfile::TempDir,
}

impl Fleet {
    /// The three clusters behind one proxy; each requires its own token when `tokens`.
    pub(crate) async fn start(tokens: bool) -> Fleet {
        Fleet::start_with(tokens, |_| Vec::new()).await
    }

    /// [`Fleet::start`], with the proxy's further flags from `extra` (given the test's folder).
    pub(crate) async fn start_with(
        tokens: bool,
        extra: impl FnOnce(&Path) -> Vec<String>,
    ) -> Fleet {
        Fleet::start_env(tokens, extra, &[]).await
    }

    /// [`Fleet::start_with`], with the proxy's environment added to.
    pub(crate) async fn start_env(
        tokens: bool,
        extra: impl FnOnce(&Path) -> Vec<String>,
        env: &[(&str, &str)],
    ) -> Fleet {
        let dir = tempfile::tempdir().unwrap();
        let mut sims = Vec::new();
        for (_, streaming, token) in CLUSTERS {
            let sim = SimCluster::start(SimConfig {
                streaming,
                require_bearer_token: tokens.then(|| token.to_owned()),
                ..SimConfig::default()
            })
            .await
            .expect("start sim cluster");
            sims.push(sim);
        }
        let flags = cluster_flags(&sims);
        let mut args: Vec<&str> = flags.iter().map(String::as_str).collect();
        let extra = extra(dir.path());
        args.extend(extra.iter().map(String::as_str));
        let proxy = ProxyProcess::launch(&args, env);
        let middlebox = Middlebox::start(proxy.addr).await;
        Fleet {
            sims,
            proxy,
            middlebox,
            dir,
        }
    }

    /// A kubeconfig for cluster `i`, through the gateway (WebSocket only) or straight to the
    /// proxy.
    pub(crate) fn kubeconfig(&self, i: usize, via_gateway: bool) -> PathBuf {
        let name = CLUSTERS[i].0;
        let entry = if via_gateway {
            format!("http://{}", self.middlebox.addr)
        } else {
            self.proxy.url()
        };
        let dir = self.dir.path().join(format!("{name}-{via_gateway}"));
        std::fs::create_dir_all(&dir).unwrap();
        write_kubeconfig(&dir, &format!("{entry}/clusters/{name}"), None)
    }

    pub(crate) fn kubectl(&self, bin: &Path, kubeconfig: &Path) -> Command {
        let mut cmd = Command::new(bin);
        cmd.arg("--kubeconfig")
            .arg(kubeconfig)
            .env_remove("KUBECTL_REMOTE_COMMAND_WEBSOCKETS")
            .env_remove("KUBECTL_PORT_FORWARD_WEBSOCKETS")
            .env_remove("KUBECONFIG")
            .env("HOME", self.dir.path());
        cmd
    }

    /// Streaming sessions cluster `i` served.
    pub(crate) fn sessions(&self, i: usize) -> usize {
        self.sims[i]
            .events()
            .iter()
            .filter(|e| matches!(e, SimEvent::SessionStarted { .. }))
            .count()
    }
}

/// The proxy's flags for the clusters `sims` run: `--cluster NAME=URL` for each.
pub(crate) fn cluster_flags(sims: &[SimCluster]) -> Vec<String> {
    CLUSTERS
        .iter()
        .zip(sims)
        .flat_map(|((name, _, _), sim)| ["--cluster".to_owned(), format!("{name}={}", sim.url())])
        .collect()
}

/// exec (output, stdin, exit code), get and port-forward on cluster `name`, each kubectl made
/// by `k` (which says how to reach that cluster); what each cluster served is counted by the
/// caller.
pub(crate) async fn exercise(name: &str, k: &dyn Fn() -> Command) {
    let mut c = k();
    c.args(["exec", "web", "--", "echo", name]);
    let o = run(c, None, T).await;
    assert!(o.status.success(), "{name}: exec failed: {}", stderr(&o));
    assert_eq!(stdout(&o), format!("{name}\n"));

    let mut c = k();
    c.args(["exec", "-i", "web", "--", "sh", "-c", "cat; exit 3"]);
    let o = run(c, Some(b"in\n".to_vec()), T).await;
    assert_eq!(o.status.code(), Some(3), "{name}: {}", stderr(&o));
    assert_eq!(stdout(&o), "in\n");

    let mut c = k();
    c.args(["get", "pod", "web", "-o", "name"]);
    let o = run(c, None, T).await;
    assert!(o.status.success(), "{name}: get failed: {}", stderr(&o));
    assert_eq!(stdout(&o), "pod/web\n");

    let pod = PodServer::commands().await;
    let fwd = Forward::start(k(), "web", &[pod.port]).await;
    assert!(
        fwd.ready(),
        "{name}: port-forward did not start: {}",
        fwd.stderr()
    );
    forward::echo(fwd.port(pod.port), 1 << 20).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_1_33_streams_to_each_cluster_through_the_gateway() {
    let Some(k) = require_kubectl("1.33") else {
        return;
    };
    let f = Fleet::start(false).await;
    for (i, (name, _, _)) in CLUSTERS.iter().enumerate() {
        let before: Vec<usize> = (0..CLUSTERS.len()).map(|j| f.sessions(j)).collect();
        let kubeconfig = f.kubeconfig(i, true);
        exercise(name, &|| f.kubectl(&k, &kubeconfig)).await;
        // Its sessions reached it, and no other cluster.
        for (j, was) in before.iter().enumerate() {
            let now = f.sessions(j);
            if j == i {
                assert!(now >= was + 3, "{name}: {was} -> {now}");
            } else {
                assert_eq!(now, *was, "{} served {name}'s session", CLUSTERS[j].0);
            }
        }
    }
    assert!(f.middlebox.websockets() > 0);
    assert_eq!(f.middlebox.dropped(), 0, "kubectl fell back to SPDY");
    assert_no_prefix(&f);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_1_28_speaks_spdy_to_each_cluster() {
    let Some(k) = require_kubectl("1.28") else {
        return;
    };
    let f = Fleet::start(false).await;
    for (i, (name, _, _)) in CLUSTERS.iter().enumerate() {
        let before = f.sessions(i);
        let kubeconfig = f.kubeconfig(i, false);
        exercise(name, &|| f.kubectl(&k, &kubeconfig)).await;
        assert!(f.sessions(i) >= before + 3);
    }
    assert_no_prefix(&f);
}

/// No request a cluster saw carried the cluster prefix.
pub(crate) fn assert_no_prefix(f: &Fleet) {
    for (i, sim) in f.sims.iter().enumerate() {
        for r in sim.requests() {
            assert!(
                !r.path.starts_with("/clusters"),
                "{}: {}",
                CLUSTERS[i].0,
                r.path
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_cluster_sees_only_its_own_token() {
    let f = Fleet::start(true).await;
    for (i, (name, _, token)) in CLUSTERS.iter().enumerate() {
        // A plain call with the token as a header.
        let (code, body) = get(f.proxy.addr, &format!("/clusters/{name}/version"), token);
        assert_eq!(code, 200, "{name}: {body}");
        // A v5 exec with the token in the subprotocol, as a browser sends it.
        let path = format!(
            "/clusters/{name}{}",
            ws_client::exec_path("web", &["echo", name], false, true, true)
        );
        let protocols = format!("v5.channel.k8s.io, {}", bearer::entry(token));
        let (mut ws, _) = ws_client::connect(f.proxy.addr, &path, &protocols)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let t = ws_client::read_to_close(&mut ws).await;
        assert_eq!(t.stdout, format!("{name}\n").as_bytes(), "{name}: {t:?}");
        assert!(f.sessions(i) >= 1, "{name} served no session");
        // Another cluster's token is refused there, by that cluster.
        let other = CLUSTERS[(i + 1) % CLUSTERS.len()].2;
        let (code, _) = get(f.proxy.addr, &format!("/clusters/{name}/version"), other);
        assert_eq!(code, 401, "{name} accepted another cluster's token");
    }
    assert_isolated(&f);
}

/// Every request a cluster saw carried its own token (or, the one refusal each test makes,
/// the next cluster's, which the test sent there itself), and no cluster prefix.
fn assert_isolated(f: &Fleet) {
    for (i, sim) in f.sims.iter().enumerate() {
        let (name, _, token) = CLUSTERS[i];
        let sent_here = CLUSTERS[(i + 1) % CLUSTERS.len()].2;
        let requests = sim.requests();
        assert!(!requests.is_empty(), "{name} saw nothing");
        for r in requests {
            let seen = r.header("authorization").unwrap_or("");
            let own = seen == format!("Bearer {token}");
            let probe = seen == format!("Bearer {sent_here}") && r.path == "/version";
            assert!(own || probe, "{name} saw {seen:?} on {}", r.path);
            // No token of a third cluster, ever.
            for (other, _, t) in CLUSTERS {
                if t != token && t != sent_here {
                    assert!(!seen.contains(t), "{name} saw {other}'s token");
                }
            }
            assert!(
                !r.path.starts_with("/clusters"),
                "{name} saw the prefix: {}",
                r.path
            );
        }
    }
}

/// The status line and body of a raw HTTP/1.1 GET of `target` (sent byte for byte).
fn get(addr: SocketAddr, target: &str, token: &str) -> (u16, String) {
    let mut tcp = TcpStream::connect(addr).unwrap();
    write!(
        tcp,
        "GET {target} HTTP/1.1\r\nHost: proxy\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = Vec::new();
    tcp.read_to_end(&mut answer).unwrap();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let code = answer
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (code, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_names_and_path_tricks_reach_no_cluster() {
    let f = Fleet::start(true).await;
    let addr = f.proxy.addr;
    // A plain request by prefix works, with the prefix taken off.
    let (code, body) = get(addr, "/clusters/new/version", "token-of-new");
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("gitVersion"), "{body}");
    let seen: Vec<usize> = f.sims.iter().map(|s| s.requests().len()).collect();
    for (target, want) in [
        ("/clusters/nope/api", 404),
        ("/clusters/OLD/api", 404),
        ("/clusters/", 404),
        ("/api/v1/namespaces/default/pods/web", 404),
        ("/clusters/old/../new/api", 400),
        ("/clusters/old%2F..%2Fnew/api", 400),
        ("/clusters/%6Fld/api", 400),
        ("/%63lusters/old/api", 400),
        ("/clusters/old%2Fapi", 400),
        ("//clusters/old/api", 400),
        (
            "/clusters/new/api/v1/namespaces/default/pods/web/%2E%2E/exec?command=id",
            400,
        ),
    ] {
        let (code, body) = get(addr, target, "token-of-old");
        assert_eq!(code, want, "{target}: {body}");
        let status: serde_json::Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("{target}: not a Status ({e}): {body}"));
        assert_eq!(status["kind"], "Status", "{target}");
        // The answer names no cluster.
        for (name, _, _) in CLUSTERS {
            assert!(
                !body.contains(&format!("\"{name}\"")) && !body.contains(&format!(" {name} ")),
                "{target} named {name}: {body}"
            );
        }
    }
    let after: Vec<usize> = f.sims.iter().map(|s| s.requests().len()).collect();
    assert_eq!(seen, after, "a refused request reached a cluster");
    // No name a request carried became a metric label: the refusals count without a cluster.
    let metrics = f.proxy.metrics();
    let mut clusters = cluster_labels(&metrics);
    assert!(
        clusters.remove(""),
        "unrouted refusals not counted: {metrics}"
    );
    assert_eq!(
        clusters,
        ["new", "old", "ws-only"].map(String::from).into(),
        "{metrics}"
    );
    for (reason, count) in [("unknown_cluster", 4), ("bad_request", 7)] {
        let series = format!(
            "kube_ws_proxy_handshake_rejections_total{{cluster=\"\",reason=\"{reason}\"}} {count}"
        );
        assert!(metrics.contains(&series), "no {series} in {metrics}");
    }
}

/// Every value of the `cluster` label on a `/metrics` answer.
fn cluster_labels(metrics: &str) -> std::collections::BTreeSet<String> {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once("cluster=\"")?.1.split_once('"'))
        .map(|(value, _)| value.to_owned())
        .collect()
}

/// A GET on the admin listener.
fn admin(f: &Fleet, target: &str) -> (u16, String) {
    get(f.proxy.admin_addr, target, "")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_is_per_cluster_and_the_clusters_page_lists_them() {
    let f = Fleet::start(false).await;
    assert_eq!(admin(&f, "/readyz").0, 200);
    assert_eq!(admin(&f, "/readyz?cluster=ws-only").0, 200);
    assert_eq!(admin(&f, "/readyz?cluster=nope").0, 404);
    let (code, body) = admin(&f, "/clusters");
    assert_eq!(code, 200);
    let page: serde_json::Value = serde_json::from_str(&body).unwrap();
    let names: Vec<&str> = page["clusters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["new", "old", "ws-only"]);
    assert!(page["clusters"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c["ready"] == true));
    for (name, _, _) in CLUSTERS {
        let ready = format!("kube_ws_proxy_upstream_ready{{cluster=\"{name}\"}} 1");
        assert!(f.proxy.metrics().contains(&ready), "no {ready}");
    }
    // One cluster gone: only it is unready, and /readyz says which.
    let Fleet {
        mut sims,
        proxy,
        middlebox: _middlebox,
        dir: _dir,
    } = f;
    sims.remove(1).shutdown().await;
    // The gauge follows without any probe: the proxy checks every cluster every 10 s.
    let gone = r#"kube_ws_proxy_upstream_ready{cluster="new"} 0"#;
    let deadline = std::time::Instant::now() + Duration::from_secs(25);
    while !proxy.metrics().contains(gone) {
        assert!(std::time::Instant::now() < deadline, "never {gone}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let metrics = proxy.metrics();
    for name in ["old", "ws-only"] {
        let ready = format!("kube_ws_proxy_upstream_ready{{cluster=\"{name}\"}} 1");
        assert!(metrics.contains(&ready), "no {ready} in {metrics}");
    }
    let f = |target: &str| get(proxy.admin_addr, target, "");
    // The last verdict answers for a second.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let (code, body) = f("/readyz");
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("cluster new:"), "{body}");
    assert!(
        !body.contains("cluster old") && !body.contains("ws-only"),
        "{body}"
    );
    assert_eq!(f("/readyz?cluster=old").0, 200);
    assert_eq!(f("/readyz?cluster=new").0, 503);
}

/// Every JSON line of the proxy's log.
fn json_lines(proxy: &ProxyProcess) -> Vec<Value> {
    proxy
        .log_lines()
        .iter()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The cluster a JSON log line names, in its span or the spans it is in.
fn line_cluster(line: &Value) -> Option<&str> {
    let spans = line["spans"].as_array().into_iter().flatten();
    std::iter::once(&line["span"])
        .chain(spans)
        .find_map(|span| span["cluster"].as_str())
}

/// The audit log's events, once `ended` events number `ended`.
pub(crate) async fn audit_events(path: &Path, ended: usize) -> Vec<Value> {
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let events: Vec<Value> = std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        if events.iter().filter(|e| e["stage"] == "ended").count() >= ended {
            return events;
        }
        assert!(tokio::time::Instant::now() < deadline, "{events:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_events_recordings_and_log_lines_name_their_cluster() {
    let Some(asciinema) = require_asciinema() else {
        return;
    };
    let f = Fleet::start_with(false, |dir| {
        let (records, audit) = (dir.join("recordings"), dir.join("audit.log"));
        std::fs::create_dir(&records).unwrap();
        // A fourth cluster, whose API server is gone: nothing listens at its address.
        let gone = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let gone = format!("gone=http://{}", gone.local_addr().unwrap());
        let flags = [
            "--cluster",
            &gone,
            "--audit-log",
            audit.to_str().unwrap(),
            "--record",
            "best-effort",
            "--record-dir",
            records.to_str().unwrap(),
        ];
        flags.map(String::from).to_vec()
    })
    .await;
    // An exec on each cluster: translated to SPDY for the old one, passed through to the others.
    for (name, _, _) in CLUSTERS {
        let path = format!(
            "/clusters/{name}{}",
            ws_client::exec_path("web", &["echo", name], false, true, true)
        );
        let (mut ws, _) = ws_client::connect(f.proxy.addr, &path, "v5.channel.k8s.io")
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let t = ws_client::read_to_close(&mut ws).await;
        assert_eq!(t.stdout, format!("{name}\n").as_bytes(), "{name}: {t:?}");
    }
    let events = audit_events(&f.dir.path().join("audit.log"), CLUSTERS.len()).await;
    let records = f.dir.path().join("recordings");
    // Each session's log id, by the cluster its events name.
    let mut session_cluster = std::collections::BTreeMap::new();
    for (name, _, _) in CLUSTERS {
        let of_cluster: Vec<&Value> = events.iter().filter(|e| e["cluster"] == name).collect();
        let stages: Vec<&str> = of_cluster
            .iter()
            .map(|e| e["stage"].as_str().unwrap())
            .collect();
        assert_eq!(stages, ["started", "ended"], "{name}: {events:#?}");
        let ended = of_cluster[1];
        assert_eq!(ended["recording_error"], Value::Null, "{ended}");
        // Its recording: in the cluster's folder, titled with it, replaying what was shown.
        let recording = PathBuf::from(ended["recording"].as_str().expect("a recording"));
        assert_eq!(
            recording.parent(),
            Some(records.join(name).as_path()),
            "{ended}"
        );
        let text = std::fs::read_to_string(&recording).unwrap();
        let header: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        let title = header["title"].as_str().unwrap();
        assert!(title.ends_with(&format!(" in cluster {name}")), "{title}");
        let asciinema = asciinema.clone();
        let replayed = tokio::task::spawn_blocking(move || replay(&asciinema, &recording))
            .await
            .unwrap();
        assert_eq!(replayed, format!("{name}\n"), "{name}");
        let id = ended["session_id"].as_str().unwrap();
        let number: u64 = id.rsplit('-').next().unwrap().parse().unwrap();
        session_cluster.insert(number, name);
    }
    // Nothing is left at the top of --record-dir: the unnamed upstream's place.
    let top: Vec<_> = std::fs::read_dir(&records)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    assert!(top.is_empty(), "{top:?}");
    // Every line of a session names the session's cluster; each cluster's sessions logged some.
    let lines = json_lines(&f.proxy);
    let mut logged = std::collections::BTreeSet::new();
    for line in lines.iter().filter(|l| l["fields"]["session"].is_u64()) {
        let session = line["fields"]["session"].as_u64().unwrap();
        let Some(cluster) = session_cluster.get(&session) else {
            continue;
        };
        assert_eq!(line_cluster(line), Some(*cluster), "{line}");
        logged.insert(*cluster);
    }
    let all: std::collections::BTreeSet<&str> = CLUSTERS.iter().map(|c| c.0).collect();
    assert_eq!(logged, all, "{lines:#?}");
    // An upstream failure names the cluster it came from: a plain call to the cluster whose
    // API server is gone answers 502, and the failure is logged (by it, or by the readiness
    // check if that came first: such lines are logged once per 10 s).
    let (code, body) = get(f.proxy.addr, "/clusters/gone/version", "");
    assert_eq!(code, 502, "{body}");
    let failures = || -> Vec<Value> {
        json_lines(&f.proxy)
            .into_iter()
            .filter(|l| l["fields"]["message"] == "upstream API server failure")
            .collect()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while failures().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "no upstream failure logged"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for line in &failures() {
        assert_eq!(line_cluster(line), Some("gone"), "{line}");
    }
}
