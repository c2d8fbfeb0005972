//! Keepalive and liveness (`--client-ping-interval`, `--client-ping-timeout`,
//! `--upstream-ping-interval`, `--upstream-ping-timeout`, `--stream-idle-timeout`) with real
//! clients.
//!
//! Every client goes through a gateway that drops SPDY upgrades and, like the idle-timeout
//! firewalls and load balancers of our users, cuts any connection that carried no byte in either
//! direction for [`CUT`]. kubectl's own WebSocket heartbeat (client-go pings every 5 s) is slower
//! than that, so only the proxy's pings can keep an idle session through it; each "survives"
//! test has a twin with the proxy's pings off that shows the gateway really cuts. The gateway
//! also cuts kubectl's idle keep-alive connection (the plain requests before an upgrade), as a
//! real one would; the tests count only the cuts of WebSocket connections.
//!
//! Between the proxy and the simulated cluster sits a plain relay that can be frozen (it stops
//! forwarding both ways without closing anything): an upstream that stopped answering. A frozen
//! client is a kubectl stopped with SIGSTOP (its kernel still acknowledges every byte), or the
//! gateway frozen.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::browser::Browser;
use common::clients::{chromium, require, require_kubectl, write_kubeconfig};
use common::harness::{run, stderr, stdout};
use common::middlebox::{Middlebox, Options};
use common::page_server::PageServer;
use common::pod_server::PodServer;
use common::proxy_process::ProxyProcess;
use kube_ws_proxy::sim::{SimCluster, SimConfig};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// The gateway cuts connections silent for this long (below client-go's 5 s heartbeat).
const CUT: Duration = Duration::from_secs(3);
/// How long sessions sit idle: well past [`CUT`].
const IDLE: Duration = Duration::from_secs(10);
/// Bound of every other wait.
const T: Duration = Duration::from_secs(60);
/// Generous bound for a dead peer to be noticed with an interval + timeout of 3 s.
const DETECT: Duration = Duration::from_secs(15);

const EXEC_ACTIVE: &str = r#"kube_ws_proxy_sessions_active{cluster="default",kind="exec"}"#;
const TUNNEL_ACTIVE: &str =
    r#"kube_ws_proxy_sessions_active{cluster="default",kind="portforward_tunnel"}"#;

fn total(kind: &str, outcome: &str) -> String {
    format!(
        r#"kube_ws_proxy_sessions_total{{cluster="default",kind="{kind}",outcome="{outcome}"}}"#
    )
}

/// Client → idle-cutting SPDY-dropping gateway → proxy → freezable relay → simulated cluster.
struct Stack {
    sim: SimCluster,
    /// Between the proxy and the cluster: a plain TCP relay.
    upstream: Middlebox,
    proxy: ProxyProcess,
    /// Between the clients and the proxy.
    gateway: Middlebox,
    dir: tempfile::TempDir,
    /// Through the gateway.
    kubeconfig: PathBuf,
}

impl Stack {
    async fn start(proxy_flags: &[&str]) -> Stack {
        Self::start_with(SimConfig::default(), proxy_flags).await
    }

    async fn start_with(sim_config: SimConfig, proxy_flags: &[&str]) -> Stack {
        let sim = SimCluster::start(sim_config)
            .await
            .expect("start sim cluster");
        let upstream = Middlebox::start_with(
            sim.addr(),
            Options {
                drop_spdy: false,
                idle_cut: None,
            },
        )
        .await;
        let proxy = ProxyProcess::start(&format!("http://{}", upstream.addr), proxy_flags);
        let gateway = Middlebox::start_with(
            proxy.addr,
            Options {
                drop_spdy: true,
                idle_cut: Some(CUT),
            },
        )
        .await;
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = write_kubeconfig(dir.path(), &format!("http://{}", gateway.addr), None);
        Stack {
            sim,
            upstream,
            proxy,
            gateway,
            dir,
            kubeconfig,
        }
    }

    /// kubectl through the gateway, isolated from the user's environment.
    fn kubectl(&self, bin: &Path) -> std::process::Command {
        let mut cmd = std::process::Command::new(bin);
        cmd.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .env_remove("KUBECTL_REMOTE_COMMAND_WEBSOCKETS")
            .env_remove("KUBECTL_PORT_FORWARD_WEBSOCKETS")
            .env_remove("KUBECONFIG")
            .env("HOME", self.dir.path());
        cmd
    }

    /// kubectl spawned with every stdio piped; killed on drop.
    fn spawn_kubectl(&self, bin: &Path, args: &[&str]) -> tokio::process::Child {
        let mut cmd = self.kubectl(bin);
        cmd.args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut cmd = tokio::process::Command::from(cmd);
        cmd.kill_on_drop(true);
        cmd.spawn().expect("spawn kubectl")
    }

    /// The value of one series on `/metrics` (0 when absent).
    fn metric(&self, series: &str) -> f64 {
        let text = self.proxy.metrics();
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .map(|v| v.trim().parse().expect("metric value"))
            .unwrap_or(0.0)
    }

    /// Waits until `series` reads `want`; how long that took.
    async fn wait_metric(&self, series: &str, want: f64, timeout: Duration) -> Duration {
        let start = Instant::now();
        loop {
            let v = self.metric(series);
            if v == want {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < timeout,
                "{series} is {v}, not {want}, after {timeout:?}\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The proxy's last log lines, for failure messages.
    fn logs(&self) -> String {
        let lines = self.proxy.log_lines();
        let from = lines.len().saturating_sub(30);
        format!("proxy log (tail):\n{}", lines[from..].join("\n"))
    }

    /// A pod's scratch directory, created.
    fn pod_dir(&self, pod: &str) -> PathBuf {
        let dir = self.sim.pod_dir("default", pod);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Asserts that the clients used WebSocket only (no SPDY fallback).
    fn assert_websocket_only(&self) {
        assert!(
            self.gateway.websockets() > 0,
            "no WebSocket upgrade reached the proxy"
        );
        assert_eq!(self.gateway.dropped(), 0, "the client fell back to SPDY");
    }
}

/// The pid a pod command wrote into `file` (`echo $$ > file; exec …`).
async fn wait_pid(file: &Path) -> i32 {
    let start = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(file) {
            if let Ok(pid) = text.trim().parse() {
                return pid;
            }
        }
        assert!(
            start.elapsed() < T,
            "the pod command never wrote {}",
            file.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether a process is still alive (a zombie is not).
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // "pid (comm) S …": the state follows the last ')'.
        Ok(stat) => stat
            .rsplit_once(')')
            .map(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X']))
            .unwrap_or(true),
        Err(_) => false,
    }
}

async fn wait_dead(pid: i32, timeout: Duration) -> bool {
    let start = Instant::now();
    while alive(pid) {
        if start.elapsed() > timeout {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    true
}

fn signal(child: &tokio::process::Child, sig: libc::c_int) {
    let pid = child.id().expect("kubectl still running") as libc::pid_t;
    // SAFETY: kill(2) on our own, not yet reaped child.
    let rc = unsafe { libc::kill(pid, sig) };
    assert_eq!(rc, 0, "kill({pid}, {sig})");
}

/// Waits for `child` to exit; its status, stdout and stderr.
async fn finish(child: tokio::process::Child, timeout: Duration) -> std::process::Output {
    tokio::time::timeout(timeout, child.wait_with_output())
        .await
        .expect("kubectl did not exit")
        .expect("wait for kubectl")
}

// ---------------------------------------------------------------------------------------------
// 1. kubectl exec -it, idle at a prompt.

/// `sh` on a terminal idles for [`IDLE`], then a command is typed; its output and whether
/// kubectl exited 0.
async fn idle_prompt(s: &Stack, kubectl: &Path) -> (bool, String) {
    let mut c = s.kubectl(kubectl);
    c.args(["exec", "-it", "web", "--", "sh"]);
    // The typed line echoes as `keep$((40+2))alive`; only the shell's answer reads keep42alive.
    let r = tokio::task::spawn_blocking(move || {
        common::pty::run_on_pty(c, 80, 24, b"echo keep$((40+2))alive\nexit\n", IDLE, T)
    })
    .await
    .unwrap();
    (
        r.status.success() && r.output.contains("keep42alive"),
        r.output,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_tty_idle_at_a_prompt_survives_the_idle_cutting_gateway() {
    let Some(k) = require_kubectl("1.33") else {
        return;
    };
    let s = Stack::start(&["--client-ping-interval", "1s"]).await;
    let (ok, output) = idle_prompt(&s, &k).await;
    assert!(
        ok,
        "the idle terminal session broke: {output:?}\n{}",
        s.logs()
    );
    assert_eq!(
        s.gateway.websocket_cuts(),
        0,
        "the gateway cut a streaming connection"
    );
    s.assert_websocket_only();
}

/// Without the proxy's pings the gateway cuts the same session: kubectl's own heartbeat is too
/// slow for it, so the test above proves the proxy's pings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_tty_idle_without_proxy_pings_is_cut_by_the_gateway() {
    let Some(k) = require_kubectl("1.33") else {
        return;
    };
    let s = Stack::start(&["--client-ping-interval", "0"]).await;
    let (ok, output) = idle_prompt(&s, &k).await;
    assert!(
        !ok,
        "the session survived without pings; the gateway proves nothing: {output:?}"
    );
    assert!(
        s.gateway.websocket_cuts() > 0,
        "the gateway cut nothing: {output:?}"
    );
    s.assert_websocket_only();
}

// ---------------------------------------------------------------------------------------------
// 2. kubectl port-forward, idle.

/// A running `kubectl port-forward` of one port.
struct Forward {
    child: tokio::process::Child,
    local: u16,
    stderr: Arc<Mutex<String>>,
}

impl Forward {
    async fn start(s: &Stack, kubectl: &Path, pod: &str, remote: u16) -> Forward {
        let mut child = s.spawn_kubectl(
            kubectl,
            &[
                "port-forward",
                "--address",
                "127.0.0.1",
                &format!("pod/{pod}"),
                &format!(":{remote}"),
            ],
        );
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut err_lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let sink = stderr.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = err_lines.next_line().await {
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
        let local = tokio::time::timeout(T, async {
            while let Ok(Some(line)) = out.next_line().await {
                // "Forwarding from 127.0.0.1:40123 -> 8080"
                if let Some(rest) = line.strip_prefix("Forwarding from 127.0.0.1:") {
                    let (l, _) = rest.split_once(" -> ").expect("forwarding line");
                    return Some(l.trim().parse::<u16>().unwrap());
                }
            }
            None
        })
        .await
        .expect("port-forward ready");
        let local = local.unwrap_or_else(|| {
            panic!(
                "kubectl port-forward did not start: {}",
                stderr.lock().unwrap()
            )
        });
        tokio::spawn(async move { while let Ok(Some(_)) = out.next_line().await {} });
        Forward {
            child,
            local,
            stderr,
        }
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

/// Echoes `len` bytes through the forwarded port (pod service command `E`); whether they came
/// back intact.
async fn echo(port: u16, len: usize) -> bool {
    let attempt = async {
        let s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        let (mut r, mut w) = s.into_split();
        let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let sent = data.clone();
        let writer = tokio::spawn(async move {
            w.write_u8(b'E').await?;
            w.write_all(&sent).await?;
            w.shutdown().await
        });
        let mut back = Vec::new();
        r.read_to_end(&mut back).await?;
        writer.await.unwrap()?;
        Ok::<_, std::io::Error>(back == data)
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(20), attempt).await,
        Ok(Ok(true))
    )
}

/// A forward that moved data once, then sat idle for [`IDLE`]: whether it still runs and moves
/// data.
async fn idle_forward(s: &Stack, kubectl: &Path) -> (bool, String) {
    let pod = PodServer::commands().await;
    let mut f = Forward::start(s, kubectl, "web", pod.port).await;
    // kubectl opens the tunnel at start; one echo shows it works before the silence.
    assert!(echo(f.local, 1024).await, "first echo: {}", f.stderr());
    tokio::time::sleep(IDLE).await;
    let ok = f.is_running() && echo(f.local, 64 * 1024).await;
    (ok, f.stderr())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn port_forward_idle_survives_the_idle_cutting_gateway() {
    let Some(k) = require_kubectl("1.33") else {
        return;
    };
    let s = Stack::start(&["--client-ping-interval", "1s"]).await;
    let (ok, err) = idle_forward(&s, &k).await;
    assert!(ok, "the idle forward broke: {err}\n{}", s.logs());
    assert_eq!(
        s.gateway.websocket_cuts(),
        0,
        "the gateway cut a streaming connection"
    );
    s.assert_websocket_only();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn port_forward_idle_without_proxy_pings_is_cut_by_the_gateway() {
    let Some(k) = require_kubectl("1.33") else {
        return;
    };
    let s = Stack::start(&["--client-ping-interval", "0"]).await;
    let (ok, err) = idle_forward(&s, &k).await;
    assert!(
        !ok,
        "the forward survived without pings; the gateway proves nothing"
    );
    assert!(
        s.gateway.websocket_cuts() > 0,
        "the gateway cut nothing: {err}"
    );
    s.assert_websocket_only();
}

// ---------------------------------------------------------------------------------------------
// 3. Chromium, v5 exec, idle.

/// The page's `idle-exec` scenario through the gateway; `None` without Chromium (outside CI).
async fn idle_browser_exec(s: &Stack) -> Option<serde_json::Value> {
    let chromium = require("chromium", chromium())?;
    let mut pages =
        PageServer::start(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser")).await;
    let mut url = url::Url::parse(&format!("http://{}/index.html", pages.addr)).unwrap();
    url.query_pairs_mut()
        .append_pair("proxy", &s.gateway.addr.to_string())
        .append_pair("token", "browser-token")
        .append_pair("scenario", "idle-exec")
        .append_pair("idle", &IDLE.as_millis().to_string());
    let browser = Browser::open(&chromium, url.as_str());
    let Some(report) = pages.next_result(T).await else {
        panic!(
            "the page reported nothing; chromium said:\n{}",
            browser.stderr()
        );
    };
    drop(browser);
    assert_eq!(report["ok"], true, "the page failed: {}", report["error"]);
    Some(report["result"].clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browser_exec_idle_survives_the_idle_cutting_gateway() {
    let s = Stack::start(&["--client-ping-interval", "1s"]).await;
    let Some(r) = idle_browser_exec(&s).await else {
        return;
    };
    assert_eq!(r["protocol"], "v5.channel.k8s.io", "{r}");
    assert_eq!(r["openAfterIdle"], true, "{r}\n{}", s.logs());
    assert_eq!(
        r["stdout"], "before the silence\nafter the silence\n",
        "{r}"
    );
    assert_eq!(r["status"]["status"], "Success", "{r}");
    assert_eq!(r["close"]["code"], 1000, "{r}");
    assert_eq!(
        s.gateway.websocket_cuts(),
        0,
        "the gateway cut a streaming connection"
    );
    s.assert_websocket_only();
}

/// Browsers never ping on their own: without the proxy's pings the gateway cuts the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browser_exec_idle_without_proxy_pings_is_cut_by_the_gateway() {
    let s = Stack::start(&["--client-ping-interval", "0"]).await;
    let Some(r) = idle_browser_exec(&s).await else {
        return;
    };
    assert_eq!(r["openAfterIdle"], false, "{r}");
    assert_eq!(r["stdout"], "before the silence\n", "{r}");
    assert!(
        s.gateway.websocket_cuts() > 0,
        "the gateway cut nothing: {r}"
    );
}

// ---------------------------------------------------------------------------------------------
// 4. A client that stopped answering.

/// How a kind of session shows in the proxy's metrics and log.
struct Kind {
    /// Its `sessions_active` series.
    active: &'static str,
    /// Its `kind` label.
    label: &'static str,
    /// Its log line when it ends, and how that line names a client that stopped answering.
    finished: &'static str,
    unresponsive: &'static str,
}

const TRANSLATED: Kind = Kind {
    active: EXEC_ACTIVE,
    label: "exec",
    finished: "exec session finished",
    unresponsive: "client unresponsive",
};

const PASSED_THROUGH: Kind = Kind {
    active: r#"kube_ws_proxy_sessions_active{cluster="default",kind="websocket_pass_through"}"#,
    label: "websocket_pass_through",
    finished: "relayed upgrade finished",
    unresponsive: "client_unresponsive",
};

/// Starts `kubectl exec -i` of a long sleep in `pod`, waits until the pod process runs and the
/// proxy counts the session; the kubectl child and the pod process's pid.
async fn long_exec(s: &Stack, kubectl: &Path, pod: &str) -> (tokio::process::Child, i32) {
    long_exec_of(s, kubectl, pod, &TRANSLATED).await
}

async fn long_exec_of(
    s: &Stack,
    kubectl: &Path,
    pod: &str,
    kind: &Kind,
) -> (tokio::process::Child, i32) {
    let pidfile = s.pod_dir(pod).join("sleeper.pid");
    let child = s.spawn_kubectl(
        kubectl,
        &[
            "exec",
            "-i",
            pod,
            "--",
            "sh",
            "-c",
            "echo $$ > sleeper.pid; exec sleep 1000",
        ],
    );
    let pid = wait_pid(&pidfile).await;
    assert!(alive(pid));
    s.wait_metric(kind.active, 1.0, T).await;
    (child, pid)
}

/// After the client was frozen: the session ends within [`DETECT`], counted as
/// `client_unresponsive`, logged as "client unresponsive", and the pod process is killed.
async fn assert_client_unresponsive(s: &Stack, pid: i32) {
    assert_client_unresponsive_of(s, pid, &TRANSLATED).await;
}

async fn assert_client_unresponsive_of(s: &Stack, pid: i32, kind: &Kind) {
    let took = s.wait_metric(kind.active, 0.0, DETECT).await;
    // Interval + timeout is 3 s; the client's last pong may be up to an interval older than
    // the freeze, so nothing can be detected much sooner.
    assert!(
        took >= Duration::from_secs(1),
        "the session ended {took:?} after the freeze: too soon to be liveness\n{}",
        s.logs()
    );
    assert_eq!(
        s.metric(&total(kind.label, "client_unresponsive")),
        1.0,
        "{}",
        s.proxy.metrics()
    );
    let line = s
        .proxy
        .wait_for_log(kind.finished, Duration::from_secs(5))
        .unwrap_or_else(|| panic!("no session log line\n{}", s.logs()));
    assert!(line.contains(kind.unresponsive), "{line}");
    assert!(
        wait_dead(pid, Duration::from_secs(10)).await,
        "the pod process {pid} outlived its session"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_kubectl_ends_its_exec_session() {
    let Some(k) = require_kubectl("1.33") else {
        return;
    };
    let s = Stack::start(&[
        "--client-ping-interval",
        "1s",
        "--client-ping-timeout",
        "2s",
    ])
    .await;
    let (child, pid) = long_exec(&s, &k, "frozen-client").await;
    signal(&child, libc::SIGSTOP);
    assert_client_unresponsive(&s, pid).await;
    // The proxy ended it, not the gateway (it saw the proxy's pings all along).
    assert_eq!(s.gateway.websocket_cuts(), 0);
    signal(&child, libc::SIGCONT);
    // Woken up, kubectl finds its session over.
    let o = finish(child, T).await;
    assert!(!o.status.success(), "kubectl: {}", stderr(&o));
    s.assert_websocket_only();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_gateway_ends_the_exec_session() {
    let Some(k) = require_kubectl("1.33") else {
        return;
    };
    let s = Stack::start(&[
        "--client-ping-interval",
        "1s",
        "--client-ping-timeout",
        "2s",
    ])
    .await;
    let (child, pid) = long_exec(&s, &k, "frozen-gateway").await;
    s.gateway.freeze();
    assert_client_unresponsive(&s, pid).await;
    s.gateway.thaw();
    // kubectl's heartbeat would notice only after a minute; kill it.
    drop(child);
    s.assert_websocket_only();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_kubectl_ends_its_port_forward_tunnel() {
    let Some(k) = require_kubectl("1.33") else {
        return;
    };
    let s = Stack::start(&[
        "--client-ping-interval",
        "1s",
        "--client-ping-timeout",
        "2s",
    ])
    .await;
    let pod = PodServer::commands().await;
    let f = Forward::start(&s, &k, "web", pod.port).await;
    assert!(echo(f.local, 1024).await, "first echo: {}", f.stderr());
    s.wait_metric(TUNNEL_ACTIVE, 1.0, T).await;
    signal(&f.child, libc::SIGSTOP);
    let took = s.wait_metric(TUNNEL_ACTIVE, 0.0, DETECT).await;
    assert!(took >= Duration::from_secs(1), "ended after {took:?}");
    assert_eq!(
        s.metric(&total("portforward_tunnel", "client_unresponsive")),
        1.0,
        "{}",
        s.proxy.metrics()
    );
    // The line is written just after the gauge drops: wait for it.
    let line = s
        .proxy
        .wait_for_log("tunnel finished", Duration::from_secs(5))
        .unwrap_or_else(|| panic!("no tunnel log line\n{}", s.logs()));
    assert!(line.contains("client unresponsive"), "{line}");
    assert_eq!(s.gateway.websocket_cuts(), 0);
    signal(&f.child, libc::SIGCONT);
    s.assert_websocket_only();
}

// ---------------------------------------------------------------------------------------------
// 5. An upstream that stopped answering.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_upstream_ends_the_exec_session_with_a_status() {
    let Some(k) = require_kubectl("1.33") else {
        return;
    };
    let s = Stack::start(&[
        "--client-ping-interval",
        "1s",
        "--upstream-ping-interval",
        "1s",
        "--upstream-ping-timeout",
        "2s",
    ])
    .await;
    let (child, pid) = long_exec(&s, &k, "frozen-upstream").await;
    s.upstream.freeze();
    let started = Instant::now();
    let o = finish(child, DETECT).await;
    let took = started.elapsed();
    let err = stderr(&o);
    assert!(!o.status.success(), "kubectl succeeded: {err}");
    assert!(
        err.contains("upstream stopped answering"),
        "kubectl stderr: {err}\n{}",
        s.logs()
    );
    assert!(took >= Duration::from_secs(1), "ended after {took:?}");
    s.wait_metric(EXEC_ACTIVE, 0.0, Duration::from_secs(5))
        .await;
    assert_eq!(
        s.metric(&total("exec", "upstream_unresponsive")),
        1.0,
        "{}",
        s.proxy.metrics()
    );
    // The client's side stayed up meanwhile: the gateway saw the proxy's pings.
    assert_eq!(s.gateway.websocket_cuts(), 0);
    // Once the upstream answers again it learns that the session is over: no process is left.
    s.upstream.thaw();
    assert!(
        wait_dead(pid, Duration::from_secs(20)).await,
        "the pod process {pid} outlived its session"
    );
    s.assert_websocket_only();
}

// ---------------------------------------------------------------------------------------------
// 6. --stream-idle-timeout.

const IDLE_FLAGS: &[&str] = &[
    "--stream-idle-timeout",
    "2s",
    "--client-ping-interval",
    "500ms",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_without_data_ends_after_the_idle_timeout() {
    let Some(k) = require_kubectl("1.33") else {
        return;
    };
    let s = Stack::start(IDLE_FLAGS).await;
    // stdin open and silent, nothing printed: pings only.
    let (child, pid) = long_exec(&s, &k, "idle").await;
    let started = Instant::now();
    let o = finish(child, DETECT).await;
    let took = started.elapsed();
    let err = stderr(&o);
    assert!(!o.status.success(), "kubectl succeeded: {err}");
    assert!(err.contains("idle"), "kubectl stderr: {err}\n{}", s.logs());
    assert!(took >= Duration::from_secs(1), "ended after {took:?}");
    s.wait_metric(EXEC_ACTIVE, 0.0, Duration::from_secs(5))
        .await;
    assert_eq!(
        s.metric(&total("exec", "idle_timeout")),
        1.0,
        "{}",
        s.proxy.metrics()
    );
    assert!(
        wait_dead(pid, Duration::from_secs(10)).await,
        "the pod process {pid} outlived its session"
    );
    assert_eq!(s.gateway.websocket_cuts(), 0);
    s.assert_websocket_only();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_with_steady_output_outlives_the_idle_timeout() {
    let Some(k) = require_kubectl("1.33") else {
        return;
    };
    let s = Stack::start(IDLE_FLAGS).await;
    let mut c = s.kubectl(&k);
    c.args([
        "exec",
        "busy",
        "--",
        "sh",
        "-c",
        "for i in 1 2 3 4 5 6 7 8 9 10; do echo line $i; sleep 0.5; done",
    ]);
    let started = Instant::now();
    let o = run(c, None, T).await;
    let took = started.elapsed();
    assert!(o.status.success(), "kubectl: {}\n{}", stderr(&o), s.logs());
    let want: String = (1..=10).map(|i| format!("line {i}\n")).collect();
    assert_eq!(stdout(&o), want);
    assert!(took > Duration::from_secs(4), "took only {took:?}");
    s.wait_metric(EXEC_ACTIVE, 0.0, Duration::from_secs(5))
        .await;
    assert_eq!(s.metric(&total("exec", "success")), 1.0);
    assert_eq!(s.metric(&total("exec", "idle_timeout")), 0.0);
    s.assert_websocket_only();
}

// ---------------------------------------------------------------------------------------------
// 7. --stream-idle-timeout on relayed paths, which cannot ping: a quiet relay is closed, a
// followed log is exempt (as in the kubelet).

/// kubectl 1.28 speaks SPDY, which the gateway drops: these go straight to the proxy.
fn direct_kubeconfig(s: &Stack) -> PathBuf {
    let dir = s.dir.path().join("direct");
    std::fs::create_dir_all(&dir).unwrap();
    write_kubeconfig(&dir, &s.proxy.url(), None)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relayed_spdy_exec_without_data_ends_after_the_idle_timeout() {
    let Some(k) = require_kubectl("1.28") else {
        return;
    };
    // Longer than 2 s: kubectl 1.28's own SPDY pings (every 5 s) cross the relay as data.
    let s = Stack::start(&["--stream-idle-timeout", "2s"]).await;
    let pidfile = s.pod_dir("relayed").join("sleeper.pid");
    let mut c = tokio::process::Command::new(&k);
    c.arg("--kubeconfig")
        .arg(direct_kubeconfig(&s))
        .env_remove("KUBECONFIG")
        .env("HOME", s.dir.path())
        .args([
            "exec",
            "-i",
            "relayed",
            "--",
            "sh",
            "-c",
            "echo $$ > sleeper.pid; exec sleep 1000",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let child = c.spawn().expect("spawn kubectl 1.28");
    let pid = wait_pid(&pidfile).await;
    let relay_active = r#"kube_ws_proxy_sessions_active{cluster="default",kind="spdy_relay"}"#;
    s.wait_metric(relay_active, 1.0, T).await;
    let took = s.wait_metric(relay_active, 0.0, DETECT).await;
    assert!(took >= Duration::from_secs(1), "ended after {took:?}");
    assert_eq!(
        s.metric(&total("spdy_relay", "idle_timeout")),
        1.0,
        "{}",
        s.proxy.metrics()
    );
    // kubectl ends at once. It exits 0: client-go reads an SPDY connection closed without a
    // status as success, as it does when the kubelet's own idle timeout closes it; a relay
    // cannot add a status to a protocol it does not parse.
    finish(child, Duration::from_secs(10)).await;
    assert!(
        wait_dead(pid, Duration::from_secs(10)).await,
        "the pod process {pid} outlived its session"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_relayed_websocket_exec_is_closed_but_a_quiet_followed_log_is_not() {
    use futures_util::StreamExt;
    use tokio_tungstenite::tungstenite::Message;

    let s = Stack::start(&["--stream-idle-timeout", "2s"]).await;
    // v4 exec of `cat` (relayed byte for byte) and a followed log (relayed, exempt).
    let exec = common::ws_client::exec_path("quiet", &["cat"], true, true, false);
    let (mut exec_ws, _) = common::ws_client::connect(s.proxy.addr, &exec, "v4.channel.k8s.io")
        .await
        .expect("v4 exec");
    let log = "/api/v1/namespaces/default/pods/quiet/log?follow=true";
    let (mut log_ws, _) = common::ws_client::connect(s.proxy.addr, log, "binary.k8s.io")
        .await
        .expect("followed log");
    let relay_active = r#"kube_ws_proxy_sessions_active{cluster="default",kind="websocket_relay"}"#;
    s.wait_metric(relay_active, 2.0, T).await;
    // The followed log goes quiet while the upstream is frozen, well past the idle timeout.
    let first = tokio::time::timeout(T, log_ws.next()).await.unwrap();
    assert!(matches!(first, Some(Ok(Message::Binary(_)))), "{first:?}");
    s.upstream.freeze();
    let took = s.wait_metric(relay_active, 1.0, DETECT).await;
    assert!(took >= Duration::from_secs(1), "ended after {took:?}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    s.upstream.thaw();
    assert_eq!(
        s.metric(&total("websocket_relay", "idle_timeout")),
        1.0,
        "{}",
        s.proxy.metrics()
    );
    // The exec's connection was closed.
    let end = tokio::time::timeout(T, async {
        loop {
            match exec_ws.next().await {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return,
                Some(Ok(_)) => {}
            }
        }
    })
    .await;
    assert!(end.is_ok(), "the quiet exec relay was not closed");
    // The log still streams after its quiet spell: lines keep coming, up to `log line 30`.
    let mut text = String::new();
    while !text.contains("log line 30\n") {
        match tokio::time::timeout(T, log_ws.next()).await.unwrap() {
            Some(Ok(Message::Binary(b))) => text.push_str(&String::from_utf8_lossy(&b)),
            other => panic!("the followed log ended: {other:?}; got {text:?}"),
        }
    }
    assert_eq!(s.metric(relay_active), 1.0);
}

// ---------------------------------------------------------------------------------------------
// 8. Relayed WebSockets: the pass-through to a new cluster and the legacy protocols. The relay
// copies them without parsing; its pings go between the upstream's frames.

/// A cluster that serves v5 and the tunnel itself, the proxy passing them through.
async fn pass_through_stack(flags: &[&str]) -> Stack {
    let mut all = vec!["--upstream-streaming", "websocket"];
    all.extend_from_slice(flags);
    Stack::start_with(
        SimConfig {
            streaming: kube_ws_proxy::sim::SimStreaming::New,
            ..SimConfig::default()
        },
        &all,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pass_through_exec_tty_idle_survives_the_idle_cutting_gateway() {
    let Some(k) = require_kubectl("1.33") else {
        return;
    };
    let s = pass_through_stack(&["--client-ping-interval", "1s"]).await;
    let (ok, output) = idle_prompt(&s, &k).await;
    assert!(
        ok,
        "the idle terminal session broke: {output:?}\n{}",
        s.logs()
    );
    assert_eq!(s.gateway.websocket_cuts(), 0, "the gateway cut a session");
    assert_eq!(
        s.metric(&total("websocket_pass_through", "success")),
        1.0,
        "{}",
        s.proxy.metrics()
    );
    s.assert_websocket_only();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pass_through_exec_tty_idle_without_proxy_pings_is_cut_by_the_gateway() {
    let Some(k) = require_kubectl("1.33") else {
        return;
    };
    let s = pass_through_stack(&["--client-ping-interval", "0"]).await;
    let (ok, output) = idle_prompt(&s, &k).await;
    assert!(!ok, "survived without pings: {output:?}");
    assert!(s.gateway.websocket_cuts() > 0, "the gateway cut nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pass_through_browser_exec_idle_survives_the_idle_cutting_gateway() {
    let s = pass_through_stack(&["--client-ping-interval", "1s"]).await;
    let Some(r) = idle_browser_exec(&s).await else {
        return;
    };
    assert_eq!(r["protocol"], "v5.channel.k8s.io", "{r}");
    assert_eq!(r["openAfterIdle"], true, "{r}\n{}", s.logs());
    assert_eq!(
        r["stdout"], "before the silence\nafter the silence\n",
        "{r}"
    );
    assert_eq!(r["status"]["status"], "Success", "{r}");
    assert_eq!(s.gateway.websocket_cuts(), 0, "the gateway cut a session");
    assert_eq!(s.metric(&total("websocket_pass_through", "success")), 1.0);
    s.assert_websocket_only();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_kubectl_ends_its_pass_through_session() {
    let Some(k) = require_kubectl("1.33") else {
        return;
    };
    let s = pass_through_stack(&[
        "--client-ping-interval",
        "1s",
        "--client-ping-timeout",
        "2s",
    ])
    .await;
    let (child, pid) = long_exec_of(&s, &k, "frozen-pass", &PASSED_THROUGH).await;
    signal(&child, libc::SIGSTOP);
    assert_client_unresponsive_of(&s, pid, &PASSED_THROUGH).await;
    assert_eq!(s.gateway.websocket_cuts(), 0);
    signal(&child, libc::SIGCONT);
    drop(child);
    s.assert_websocket_only();
}

/// A legacy `v4.channel.k8s.io` exec (the Python client's, relayed byte for byte) that sits
/// idle past the gateway's cut and then still carries stdin and stdout; the client answers
/// the proxy's pings as any WebSocket library does, while it waits for output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relayed_v4_exec_idle_survives_the_idle_cutting_gateway() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    for (interval, survives) in [("1s", true), ("0", false)] {
        let s = Stack::start(&["--client-ping-interval", interval]).await;
        let path = common::ws_client::exec_path("web", &["cat"], true, true, false);
        let (mut ws, resp) = common::ws_client::connect(s.gateway.addr, &path, "v4.channel.k8s.io")
            .await
            .expect("v4 upgrade");
        assert_eq!(
            resp.headers()["sec-websocket-protocol"],
            "v4.channel.k8s.io"
        );
        // Idle, reading (which answers pings), past the cut.
        let idle = tokio::time::timeout(IDLE, async {
            while let Some(m) = ws.next().await {
                if m.is_err() || matches!(m, Ok(Message::Close(_))) {
                    return;
                }
            }
        })
        .await;
        let cut_while_idle = idle.is_ok();
        let mut echoed = Vec::new();
        if !cut_while_idle
            && ws
                .send(Message::Binary(b"\x00after\n".to_vec().into()))
                .await
                .is_ok()
        {
            let _ = tokio::time::timeout(Duration::from_secs(10), async {
                while let Some(Ok(m)) = ws.next().await {
                    if let Message::Binary(d) = m {
                        if d.first() == Some(&1) {
                            echoed.extend_from_slice(&d[1..]);
                            if echoed.ends_with(b"after\n") {
                                return;
                            }
                        }
                    }
                }
            })
            .await;
        }
        if survives {
            assert!(!cut_while_idle, "the idle session was cut\n{}", s.logs());
            assert_eq!(echoed, b"after\n", "{}", s.logs());
            assert_eq!(s.gateway.websocket_cuts(), 0);
        } else {
            assert!(s.gateway.websocket_cuts() > 0, "the gateway cut nothing");
        }
    }
}
