//! The proxy reads a streaming request as kube-apiserver will act on it (SECURITY.md, security
//! round 2 findings 1 and 3). Real kubectl 1.28 (SPDY, relayed) and 1.33 (v5 through the
//! SPDY-dropping gateway, translated) behind a relay that rewrites their request line as an
//! attacker would, a proxy with the audit log and `--record required`, and behind the proxy a
//! Go `net/http` reverse proxy (tests/interop/go_front) standing in for kube-apiserver's HTTP
//! stack: it acts on Go's reading of each request and says what it read. Every exec that runs
//! must be audited and recorded, with the command and container Go read.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::clients::{require_kubectl, write_kubeconfig};
use common::go_front::{self, GoFront};
use common::harness::{run, stderr, stdout};
use common::middlebox::Middlebox;
use common::proxy_process::ProxyProcess;
use common::rewriter::Rewriter;
use kube_ws_proxy::sim::{SimCluster, SimConfig};
use serde_json::Value;

const T: Duration = Duration::from_secs(60);

/// kubectl → rewriter → (gateway) → proxy (audit, recordings required) → Go front → cluster.
struct Setup {
    _sim: SimCluster,
    front: GoFront,
    proxy: ProxyProcess,
    _gateway: Middlebox,
    _rewriters: (Rewriter, Rewriter),
    dir: tempfile::TempDir,
    audit: PathBuf,
    /// kubectl 1.33's way in: rewriter, then the SPDY-dropping gateway.
    websocket: PathBuf,
    /// kubectl 1.28's way in: rewriter, then the proxy.
    spdy: PathBuf,
}

impl Setup {
    async fn start(rewrite: fn(&str) -> String) -> Option<Setup> {
        let binary = go_front::binary()?;
        let sim = SimCluster::start(SimConfig::default()).await.unwrap();
        let sim_addr = sim.url().trim_start_matches("http://").to_owned();
        let front = GoFront::start(binary, &["front", &sim_addr]);
        let dir = tempfile::tempdir().unwrap();
        let records = dir.path().join("recordings");
        std::fs::create_dir(&records).unwrap();
        let audit = dir.path().join("audit.log");
        let proxy = ProxyProcess::start(
            &format!("http://{}", front.addr),
            &[
                "--audit-log",
                audit.to_str().unwrap(),
                "--record",
                "required",
                "--record-dir",
                records.to_str().unwrap(),
                "--upstream-streaming",
                "spdy",
            ],
        );
        let gateway = Middlebox::start(proxy.addr).await;
        let via_gateway = Rewriter::start(gateway.addr, rewrite).await;
        let direct = Rewriter::start(proxy.addr, rewrite).await;
        let kubeconfig = |name: &str, addr: std::net::SocketAddr| {
            let d = dir.path().join(name);
            std::fs::create_dir(&d).unwrap();
            write_kubeconfig(&d, &format!("http://{addr}"), None)
        };
        let websocket = kubeconfig("websocket", via_gateway.addr);
        let spdy = kubeconfig("spdy", direct.addr);
        Some(Setup {
            _sim: sim,
            front,
            proxy,
            _gateway: gateway,
            _rewriters: (via_gateway, direct),
            dir,
            audit,
            websocket,
            spdy,
        })
    }

    fn kubectl(&self, bin: &Path, kubeconfig: &Path) -> Command {
        let mut c = Command::new(bin);
        c.arg("--kubeconfig")
            .arg(kubeconfig)
            .env("HOME", self.dir.path())
            .env_remove("KUBECONFIG")
            .env_remove("KUBECTL_REMOTE_COMMAND_WEBSOCKETS");
        c
    }

    /// The audit's `ended` event for `pod`, once written.
    async fn ended(&self, pod: &str) -> Value {
        let deadline = tokio::time::Instant::now() + T;
        loop {
            let text = std::fs::read_to_string(&self.audit).unwrap_or_default();
            let found = text
                .lines()
                .map(|l| serde_json::from_str::<Value>(l).expect("audit lines are JSON"))
                .find(|e| e["stage"] == "ended" && e["pod"] == pod);
            if let Some(e) = found {
                return e;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no ended event for {pod}; the proxy's log: {:?}",
                self.proxy.log_lines()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// What the Go front read of the last exec request for `pod`.
    fn go_read_exec(&self, pod: &str) -> Value {
        let suffix = format!("/pods/{pod}/exec");
        self.front
            .readings
            .lock()
            .unwrap()
            .iter()
            .rev()
            .find(|r| r["path"].as_str().is_some_and(|p| p.ends_with(&suffix)))
            .cloned()
            .unwrap_or_else(|| panic!("no exec for {pod} reached the Go front"))
    }

    /// The recording `ended` names, whole the moment the event is seen.
    fn recording(&self, ended: &Value) -> String {
        let (_, text) = common::replay::complete_recording(ended);
        assert!(text.contains("\"o\""), "{text}");
        text
    }
}

/// Asserts that the audit event says what the Go front (the API server) read and ran.
fn assert_audited_as_go_read(ended: &Value, go: &Value, namespace: &str) {
    assert_eq!(ended["verb"], "exec", "{ended}");
    assert_eq!(ended["namespace"], namespace, "{ended}");
    assert_eq!(
        ended["command"], go["command"],
        "audit {ended}\nGo read {go}"
    );
    assert_eq!(
        ended["container"], go["container"],
        "audit {ended}\nGo read {go}"
    );
    assert_eq!(ended["recording_error"], Value::Null, "{ended}");
}

/// `/exec?` becomes `/%65xec?` and the namespace `de%66ault`: the same exec to Go.
fn encode_exec(line: &str) -> String {
    if !line.contains("/exec?") {
        return line.to_owned();
    }
    line.replace("/exec?", "/%65xec?")
        .replace("/namespaces/default/", "/namespaces/de%66ault/")
}

#[tokio::test(flavor = "multi_thread")]
async fn percent_encoded_execs_are_audited_and_recorded_as_the_exec_that_runs() {
    let (Some(k133), Some(k128)) = (require_kubectl("1.33"), require_kubectl("1.28")) else {
        return;
    };
    let Some(s) = Setup::start(encode_exec).await else {
        return;
    };
    for (kubectl, kubeconfig, pod, path) in [
        (&k133, &s.websocket, "enc-ws", "translated"),
        (&k128, &s.spdy, "enc-spdy", "relay_spdy"),
    ] {
        let mut c = s.kubectl(kubectl, kubeconfig);
        c.args([
            "exec",
            "-i",
            pod,
            "-c",
            "main",
            "--",
            "sh",
            "-c",
            "cat; echo ran-$CONTAINER_NAME",
        ]);
        let o = run(c, Some(b"typed\n".to_vec()), T).await;
        assert!(o.status.success(), "{pod}: {}", stderr(&o));
        assert_eq!(stdout(&o), "typed\nran-main\n", "{pod}");
        let go = s.go_read_exec(pod);
        let ended = s.ended(pod).await;
        assert_eq!(ended["protocol_path"], path, "{ended}");
        assert_eq!(ended["pod"], pod, "{ended}");
        assert_eq!(ended["exit_code"], 0, "{ended}");
        assert_audited_as_go_read(&ended, &go, "default");
        let recording = s.recording(&ended);
        assert!(recording.contains("ran-main"), "{recording}");
    }
}

/// Adds what Go reads differently from a naive reader: a first `container`, a pair with `;`
/// and one with a bad escape (both dropped by Go).
fn smuggle_options(line: &str) -> String {
    if !line.contains("/exec?") {
        return line.to_owned();
    }
    line.replace(
        "/exec?",
        "/exec?container=sidecar&command=rm+-rf+x;&command=%zz&",
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn the_audit_names_the_container_and_command_the_api_server_reads() {
    let (Some(k133), Some(k128)) = (require_kubectl("1.33"), require_kubectl("1.28")) else {
        return;
    };
    let Some(s) = Setup::start(smuggle_options).await else {
        return;
    };
    for (kubectl, kubeconfig, pod) in [
        (&k133, &s.websocket, "opt-ws"),
        (&k128, &s.spdy, "opt-spdy"),
    ] {
        let mut c = s.kubectl(kubectl, kubeconfig);
        c.args([
            "exec",
            pod,
            "-c",
            "main",
            "--",
            "sh",
            "-c",
            "echo in-$CONTAINER_NAME",
        ]);
        let o = run(c, None, T).await;
        assert!(o.status.success(), "{pod}: {}", stderr(&o));
        // Go took the first container, and the command without the dropped pairs.
        assert_eq!(stdout(&o), "in-sidecar\n", "{pod}");
        let go = s.go_read_exec(pod);
        assert_eq!(go["container"], "sidecar");
        assert_eq!(
            go["command"],
            serde_json::json!(["sh", "-c", "echo in-$CONTAINER_NAME"])
        );
        let ended = s.ended(pod).await;
        assert_audited_as_go_read(&ended, &go, "default");
        let recording = s.recording(&ended);
        let header = recording.lines().next().unwrap();
        assert!(
            header.contains("(sidecar)"),
            "the recording's title: {header}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_path_go_cannot_decode_is_refused_with_a_status() {
    let Some(s) = Setup::start(|l| l.to_owned()).await else {
        return;
    };
    let client = raw_get(s.proxy.addr, "/api/v1/namespaces/default/pods/web/%zzexec").await;
    assert!(client.starts_with("HTTP/1.1 400"), "{client}");
    assert!(client.contains("\"kind\":\"Status\""), "{client}");
    // Nothing reached the API server's HTTP stack.
    assert!(s.front.readings.lock().unwrap().is_empty());
}

/// One raw HTTP/1.1 GET; the whole answer as text.
async fn raw_get(addr: std::net::SocketAddr, target: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(
        format!("GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(T, tcp.read_to_end(&mut answer))
        .await
        .unwrap()
        .unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

/// A WebSocket upgrade of `target` offering `protocol`; the status of the answer.
async fn websocket_status(addr: std::net::SocketAddr, target: &str, protocol: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "GET {target} HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
         Sec-WebSocket-Protocol: {protocol}\r\n\r\n"
    );
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match tokio::time::timeout(T, tcp.read(&mut byte)).await {
            Ok(Ok(1)) => head.push(byte[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_spdy_tunnel_is_opened_only_for_port_forward() {
    let Some(s) = Setup::start(|l| l.to_owned()).await else {
        return;
    };
    // kube-apiserver tunnels only port-forward; a tunnel to exec would carry a SPDY exec inside
    // the WebSocket that nobody records. It goes upstream as the WebSocket it is, and the
    // cluster refuses it.
    let exec = "/api/v1/namespaces/default/pods/tunnelled/exec?command=echo&command=unrecorded&stdout=true";
    let head = websocket_status(s.proxy.addr, exec, "SPDY/3.1+v4.channel.k8s.io").await;
    assert!(!head.starts_with("HTTP/1.1 101"), "{head}");
    // Port-forward still gets its tunnel.
    let pf = "/api/v1/namespaces/default/pods/web/portforward";
    let head = websocket_status(s.proxy.addr, pf, "SPDY/3.1+portforward.k8s.io").await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
}
