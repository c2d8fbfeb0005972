//! The fleet as its users reach it: a kubeconfig made by the binary's own `kubeconfig`
//! subcommand from the flags the proxy runs with (a context per cluster, read by kubectl
//! itself), and real clients choosing a cluster by `--context` (kubectl 1.33 through the
//! SPDY-dropping gateway, kubectl 1.28 straight to the proxy in SPDY) or by the server's path
//! (the Python client): exec, `exec -i`, `exec -it`, cp both ways, port-forward, `logs -f`,
//! get and `get --watch` on an old SPDY-only cluster, a new one and a WebSocket-only one, each
//! reaching its own cluster and no other. The clusters run once per test.

use crate::common;
use crate::e2e_fleet::{assert_no_prefix, cluster_flags, exercise, Fleet, CLUSTERS};
use crate::e2e_python::python_at;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::clients::{python_with_kubernetes, require, require_kubectl};
use common::harness::{random_file, run, sha256_hex, stderr, stdout};
use common::proxy_process::run_to_exit;
use common::pty::run_on_pty;
use kube_ws_proxy::sim::{SimCluster, SimEvent};
use serde_json::Value;

const T: Duration = Duration::from_secs(120);

/// The kubeconfig `kube-ws-proxy kubeconfig --server SERVER` writes for the proxy's flags.
fn kubeconfig_of(f: &Fleet, server: &str, extra: &[&str]) -> PathBuf {
    let path = unique(f.dir.path().join("kubeconfig"));
    let flags = cluster_flags(&f.sims);
    let mut args = vec![
        "kubeconfig",
        "--server",
        server,
        "-o",
        path.to_str().unwrap(),
    ];
    args.extend(flags.iter().map(String::as_str));
    args.extend_from_slice(extra);
    let (code, err) = run_to_exit(&args);
    assert_eq!(code, Some(0), "kubeconfig failed: {err}");
    path
}

/// `path`, or `path` with a number after it if that is taken.
fn unique(path: PathBuf) -> PathBuf {
    (0..)
        .map(|n| PathBuf::from(format!("{}.{n}", path.display())))
        .find(|p| !p.exists())
        .unwrap()
}

/// kubectl's own reading of `kubeconfig` (`kubectl config view -o json --raw`).
async fn kubectl_view(kubectl: &Path, kubeconfig: &Path) -> Value {
    let mut c = Command::new(kubectl);
    c.args(["config", "view", "--raw", "-o", "json", "--kubeconfig"])
        .arg(kubeconfig)
        .env_remove("KUBECONFIG");
    let o = run(c, None, T).await;
    assert!(o.status.success(), "config view: {}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// kubectl's contexts in `kubeconfig`, the current one marked `*`.
async fn kubectl_contexts(kubectl: &Path, kubeconfig: &Path) -> Vec<String> {
    let mut c = Command::new(kubectl);
    c.args(["config", "get-contexts", "--kubeconfig"])
        .arg(kubeconfig)
        .env_remove("KUBECONFIG");
    let o = run(c, None, T).await;
    assert!(o.status.success(), "get-contexts: {}", stderr(&o));
    stdout(&o)
        .lines()
        .skip(1)
        .map(|l| {
            let mut words = l.split_whitespace();
            let first = words.next().unwrap();
            match first {
                "*" => format!("*{}", words.next().unwrap()),
                name => name.to_owned(),
            }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_reads_the_kubeconfig_of_the_binary() {
    let Some(k) = require_kubectl("1.33") else {
        return;
    };
    let f = Fleet::start(false).await;
    a_context_per_cluster(&f, &k).await;
    over_tls_beside_the_unnamed_upstream(&f, &k).await;
}

/// The kubeconfig of the fleet's `--cluster` flags: a cluster, an empty user and a context per
/// cluster, named after it, at the proxy's URL and the cluster's prefix.
async fn a_context_per_cluster(f: &Fleet, k: &Path) {
    let kc = kubeconfig_of(f, "http://proxy.example.com:8080/", &[]);
    assert_eq!(
        kubectl_contexts(k, &kc).await,
        ["new", "*old", "ws-only"],
        "{}",
        std::fs::read_to_string(&kc).unwrap()
    );
    let view = kubectl_view(k, &kc).await;
    assert_eq!(view["current-context"], "old", "{view}");
    for (name, _, _) in CLUSTERS {
        let of = |list: &str| -> Value {
            view[list]
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["name"] == name)
                .unwrap_or_else(|| panic!("no {list} {name}: {view}"))
                .clone()
        };
        assert_eq!(
            of("clusters")["cluster"],
            serde_json::json!({"server": format!("http://proxy.example.com:8080/clusters/{name}")})
        );
        assert_eq!(of("users")["user"], serde_json::json!({}), "{view}");
        assert_eq!(
            of("contexts")["context"],
            serde_json::json!({"cluster": name, "user": name})
        );
    }
}

/// Over TLS with the gateway's CA embedded and the unnamed upstream beside the clusters; the
/// proxy's own credentials for a cluster (a config file's) are not in it.
async fn over_tls_beside_the_unnamed_upstream(f: &Fleet, k: &Path) {
    let dir = f.dir.path();
    let ca = dir.join("gateway-ca.pem");
    std::fs::write(
        &ca,
        "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let config = dir.join("proxy.yaml");
    std::fs::write(
        &config,
        "upstream: https://10.9.9.9:6443\nclusters:\n- name: prod-eu\n  upstream: https://10.0.0.2:6443\n  \
         upstream-token-file: /etc/fleet/prod-eu/token\n  upstream-ca-file: /etc/fleet/prod-eu/ca.crt\n",
    )
    .unwrap();
    let ca_flag = format!("--certificate-authority={}", ca.display());
    let config_flag = format!("--config={}", config.display());
    let kc = kubeconfig_of(
        f,
        "https://gw.example.com/k8s",
        &[&ca_flag, &config_flag, "--tls-server-name=proxy.internal"],
    );
    let text = std::fs::read_to_string(&kc).unwrap();
    for secret in ["/etc/fleet", "10.0.0.2", "10.9.9.9"] {
        assert!(!text.contains(secret), "{secret} in {text}");
    }
    assert_eq!(
        kubectl_contexts(k, &kc).await,
        ["*default", "new", "old", "prod-eu", "ws-only"]
    );
    let view = kubectl_view(k, &kc).await;
    let clusters = view["clusters"].as_array().unwrap();
    let servers: Vec<&str> = clusters
        .iter()
        .map(|c| c["cluster"]["server"].as_str().unwrap())
        .collect();
    assert_eq!(
        servers,
        // kubectl lists them by name.
        [
            "https://gw.example.com/k8s",
            "https://gw.example.com/k8s/clusters/new",
            "https://gw.example.com/k8s/clusters/old",
            "https://gw.example.com/k8s/clusters/prod-eu",
            "https://gw.example.com/k8s/clusters/ws-only",
        ]
    );
    use base64::Engine as _;
    let pem = base64::engine::general_purpose::STANDARD.encode(std::fs::read(&ca).unwrap());
    for c in clusters {
        assert_eq!(c["cluster"]["certificate-authority-data"], pem.as_str());
        assert_eq!(c["cluster"]["tls-server-name"], "proxy.internal");
    }
}

/// One cluster of a fleet as a test's kubectl reaches it (by context, by host name): the
/// names of every cluster behind the proxy and their simulations (to check that this one alone
/// was reached), which one it is, a folder for the test's files, and how to make a kubectl
/// that reaches it.
pub(crate) struct Target<'a> {
    pub(crate) names: &'a [&'a str],
    pub(crate) sims: &'a [SimCluster],
    pub(crate) i: usize,
    pub(crate) dir: &'a Path,
    pub(crate) kubectl: &'a dyn Fn() -> Command,
}

impl Target<'_> {
    fn name(&self) -> &str {
        self.names[self.i]
    }
}

/// What every cluster has seen so far: its streaming sessions, and its API requests.
fn seen(sims: &[SimCluster]) -> Vec<(usize, usize)> {
    sims.iter()
        .map(|sim| {
            let sessions = sim
                .events()
                .iter()
                .filter(|e| matches!(e, SimEvent::SessionStarted { .. }))
                .count();
            let api = sim
                .requests()
                .iter()
                .filter(|r| r.path.starts_with("/api"))
                .count();
            (sessions, api)
        })
        .collect()
}

/// Everything kubectl does on the target cluster (exec, `exec -i`, get, port-forward,
/// `exec -it`, cp both ways, `logs -f`, `get --watch`), and that it reached that cluster
/// alone.
pub(crate) async fn everything_on(t: &Target<'_>) {
    let name = t.name();
    let before = seen(t.sims);
    exercise(name, t.kubectl).await;
    terminal(name, (t.kubectl)()).await;
    copy_both_ways(t).await;
    follow_logs(name, (t.kubectl)()).await;
    watch(t).await;
    for (j, (was, now)) in before.iter().zip(seen(t.sims)).enumerate() {
        if j == t.i {
            // exec, exec -i, port-forward, exec -it, two cp, the followed log.
            assert!(now.0 >= was.0 + 7, "{name}: sessions {was:?} -> {now:?}");
            assert!(now.1 > was.1, "{name}: requests {was:?} -> {now:?}");
        } else {
            assert_eq!(now, *was, "{} served {name}'s requests", t.names[j]);
        }
    }
}

/// [`everything_on`] cluster `i` of the fleet, chosen by its context in `kubeconfig`.
async fn by_context(f: &Fleet, i: usize, kubectl: &Path, kubeconfig: &Path) {
    let names = CLUSTERS.map(|c| c.0);
    let k = || {
        let mut c = f.kubectl(kubectl, kubeconfig);
        c.args(["--context", names[i]]);
        c
    };
    let target = Target {
        names: &names,
        sims: &f.sims,
        i,
        dir: f.dir.path(),
        kubectl: &k,
    };
    everything_on(&target).await;
}

/// `exec -it` on a terminal: the pod's terminal has the size of kubectl's.
async fn terminal(name: &str, mut c: Command) {
    c.args(["exec", "-it", "web", "--", "stty", "size"]);
    let r = tokio::task::spawn_blocking(move || run_on_pty(c, 100, 40, b"", Duration::ZERO, T))
        .await
        .unwrap();
    assert!(r.status.success(), "{name}: exec -it: {}", r.output);
    assert!(
        r.output.contains("40 100"),
        "{name}: stty size saw {:?}",
        r.output
    );
}

/// `kubectl cp` up and down, byte-exact, into the target's pod (and no other cluster's).
async fn copy_both_ways(t: &Target<'_>) {
    let name = t.name();
    let cwd = t.dir.join(format!("cp-{name}"));
    std::fs::create_dir_all(&cwd).unwrap();
    let file = format!("up-{name}.bin");
    let sha = random_file(&cwd.join(&file), 1 << 20, t.i as u64 + 1);
    let mut c = (t.kubectl)();
    c.current_dir(&cwd)
        .args(["cp", &file, &format!("web:{file}")]);
    let o = run(c, None, T).await;
    assert!(o.status.success(), "{name}: cp up: {}", stderr(&o));
    for (j, sim) in t.sims.iter().enumerate() {
        let there = sim.pod_dir("default", "web").join(&file);
        if j == t.i {
            let uploaded = std::fs::read(&there).unwrap();
            assert_eq!(sha256_hex(&uploaded), sha, "{name}: cp up differs");
        } else {
            assert!(!there.exists(), "{name}'s file reached {}", t.names[j]);
        }
    }
    let mut c = (t.kubectl)();
    c.current_dir(&cwd)
        .args(["cp", &format!("web:{file}"), "back.bin"]);
    let o = run(c, None, T).await;
    assert!(o.status.success(), "{name}: cp down: {}", stderr(&o));
    let back = std::fs::read(cwd.join("back.bin")).unwrap();
    assert_eq!(sha256_hex(&back), sha, "{name}: cp down differs");
}

/// `logs -f`: the lines after the log's first ten come only to a follower (the cluster writes
/// one every 200 ms), and the log ends when the cluster ends it (`--limit-bytes`): kubectl
/// exits on its own with every line.
async fn follow_logs(name: &str, mut c: Command) {
    // Lines 1–9 are 11 bytes, 10–13 are 12: the log ends after line 13.
    c.args(["logs", "-f", "web", "--limit-bytes=147"]);
    let o = run(c, None, T).await;
    assert!(o.status.success(), "{name}: logs -f: {}", stderr(&o));
    let want: String = (1..=13).map(|n| format!("log line {n}\n")).collect();
    assert_eq!(stdout(&o), want, "{name}");
}

/// `get --watch`: an event of the watch arrives, from the target cluster, which saw the watch.
async fn watch(t: &Target<'_>) {
    use tokio::io::AsyncBufReadExt;
    let name = t.name();
    let mut c = (t.kubectl)();
    c.args(["get", "pod", "web", "--watch-only", "-o", "name"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut c = tokio::process::Command::from(c);
    c.kill_on_drop(true);
    let mut child = c.spawn().unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(T, lines.next_line())
        .await
        .unwrap_or_else(|_| panic!("{name}: no watch event"))
        .unwrap();
    child.kill().await.unwrap();
    let err = child.wait_with_output().await.unwrap();
    assert_eq!(line.as_deref(), Some("pod/web"), "{name}: {}", stderr(&err));
    let watches = t.sims[t.i]
        .requests()
        .into_iter()
        .filter(|r| r.query.as_deref().is_some_and(|q| q.contains("watch=true")))
        .count();
    assert!(watches >= 1, "{name} saw no watch");
}

/// Every cluster kind, one after the other, by context; then no cluster saw the prefix.
async fn every_cluster_by_context(f: &Fleet, kubectl: &Path, kubeconfig: &Path) {
    for i in 0..CLUSTERS.len() {
        by_context(f, i, kubectl, kubeconfig).await;
    }
    assert_no_prefix(f);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_1_33_by_context_through_the_gateway() {
    let Some(k) = require_kubectl("1.33") else {
        return;
    };
    let f = Fleet::start(false).await;
    let kc = kubeconfig_of(&f, &format!("http://{}", f.middlebox.addr), &[]);
    every_cluster_by_context(&f, &k, &kc).await;
    assert!(f.middlebox.websockets() > 0);
    assert_eq!(f.middlebox.dropped(), 0, "kubectl fell back to SPDY");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_1_28_by_context_in_spdy() {
    let Some(k) = require_kubectl("1.28") else {
        return;
    };
    let f = Fleet::start(false).await;
    let kc = kubeconfig_of(&f, &f.proxy.url(), &[]);
    every_cluster_by_context(&f, &k, &kc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_execs_on_two_clusters_by_path() {
    let Some(py) = require(
        "python3 with the kubernetes package",
        python_with_kubernetes(),
    ) else {
        return;
    };
    let f = Fleet::start(false).await;
    let names = CLUSTERS.map(|c| c.0);
    for i in [0, 2] {
        let server = format!("http://{}/clusters/{}", f.middlebox.addr, names[i]);
        python_exec_on(&names, &f.sims, i, &py, &server, &[]).await;
    }
    assert!(f.middlebox.websockets() >= 2);
    assert_no_prefix(&f);
}

/// The Python client's v5 exec (stdin ended by the CLOSE signal, the exit code) on cluster `i`
/// of `sims`, at `server`, with the client's further `options` (`--proxy URL`): its session
/// reached that cluster, and no other cluster saw anything.
pub(crate) async fn python_exec_on(
    names: &[&str],
    sims: &[SimCluster],
    i: usize,
    py: &Path,
    server: &str,
    options: &[&str],
) {
    let name = names[i];
    let before = seen(sims);
    let mut args = options.to_vec();
    args.push("exec-v5");
    let r = python_at(server, py, &args).await;
    assert_eq!(r["subprotocol"], "v5.channel.k8s.io", "{name}: {r}");
    assert_eq!(r["stdout"], "hello from python\ndone\n", "{name}: {r}");
    assert_eq!(r["returncode"], 3, "{name}: {r}");
    for (j, (was, now)) in before.iter().zip(seen(sims)).enumerate() {
        if j == i {
            assert_eq!(now.0, was.0 + 1, "{name}: sessions");
        } else {
            assert_eq!(now, *was, "{} served {name}'s exec", names[j]);
        }
    }
}

/// The `demo` process, killed on drop.
struct Demo(std::process::Child);

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Sessions the proxy admitted for `cluster`, from its metrics.
fn admitted(metrics: &str, cluster: &str) -> u64 {
    let prefix = format!("kube_ws_proxy_sessions_admitted_total{{cluster=\"{cluster}\",");
    metrics
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_serves_three_clusters_by_context() {
    use std::io::BufRead;
    let Some(k) = require_kubectl("1.33") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("demo.kubeconfig");
    let mut child = Command::new(common::proxy_process::binary())
        .args(["demo", "--listen", "127.0.0.1:0", "--kubeconfig"])
        .arg(&kc)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = std::io::BufReader::new(child.stdout.take().unwrap());
    let demo = Demo(child);
    // What it prints, up to its last line (the kubeconfig is written by then).
    let printed = tokio::task::spawn_blocking(move || {
        let mut printed = String::new();
        for line in out.lines() {
            let line = line.unwrap();
            printed += &line;
            printed.push('\n');
            if line.starts_with("Press Ctrl-C") {
                return printed;
            }
        }
        panic!("the demo ended: {printed}");
    });
    let printed = tokio::time::timeout(T, printed).await.unwrap().unwrap();
    assert!(
        printed.contains(&format!(
            "--kubeconfig {} --context ws-only exec",
            kc.display()
        )),
        "{printed}"
    );
    assert_eq!(
        kubectl_contexts(&k, &kc).await,
        ["new", "*old", "ws-only"],
        "{printed}"
    );
    let admin: std::net::SocketAddr = printed
        .split("admin listener: http://")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no admin address in {printed}"));
    // Each context reaches its own simulated cluster (each has its own scratch folder, where
    // the pod's commands run), and the proxy counts the session for that cluster.
    let mut folders = std::collections::BTreeSet::new();
    for (name, _, _) in CLUSTERS {
        let mut c = Command::new(&k);
        c.arg("--kubeconfig")
            .arg(&kc)
            .args(["--context", name, "exec", "demo", "--", "pwd"])
            .env_remove("KUBECONFIG")
            .env("HOME", dir.path());
        let o = run(c, None, T).await;
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        folders.insert(stdout(&o));
        let (_, metrics) = common::proxy_process::http_get(admin, "/metrics");
        assert_eq!(admitted(&metrics, name), 1, "{name}: {metrics}");
    }
    assert_eq!(folders.len(), CLUSTERS.len(), "{folders:?}");
    drop(demo);
}
