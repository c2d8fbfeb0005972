//! Session audit (`--audit-log`) with real clients on every path: kubectl 1.33 exec, cp,
//! port-forward and `logs -f` (translated, tunnel, plain HTTP), kubectl 1.28 exec (relayed
//! SPDY), a v4 WebSocket exec (relayed), each with its `started` and `ended` events and the
//! caller's identity: asked of the cluster with the caller's own token in passthrough mode,
//! the authenticated certificate in impersonate mode; a `kubectl --as` caller's impersonated
//! identity beside its own. Port-forwards through the tunnel
//! (kubectl 1.33), the tunnel passed through to a cluster that serves it (kubectl 1.33),
//! relayed SPDY (kubectl 1.28) and the relayed legacy WebSocket protocol list each forwarded
//! connection's port and exact bytes.
//!
//! kubectl sends a kubeconfig token only over TLS, so the proxy listens with TLS here and
//! kubectl talks to it directly; each event's `protocol_path` shows which path was taken.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use common::clients::require_kubectl;
use common::harness::stderr;
use common::pki::{kubeconfig, Ca, Leaf};
use common::proxy_process::ProxyProcess;
use kube_ws_proxy::sim::{SimCluster, SimConfig, SimStreaming, SimUser};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

const T: Duration = Duration::from_secs(60);
pub(crate) const TINA: &str = "tina-token-audit-5e1";
const PROXY_TOKEN: &str = "proxy-token-audit-77a";
const PROXY_USER: &str = "system:serviceaccount:kube-ws-proxy:kube-ws-proxy";

/// The simulated cluster (plain HTTP, tokens), a proxy with listener TLS writing an audit log.
pub(crate) struct Audited {
    pub(crate) sim: SimCluster,
    pub(crate) proxy: ProxyProcess,
    pub(crate) dir: tempfile::TempDir,
    pub(crate) proxy_ca: Ca,
    client_ca: Ca,
    pub(crate) audit_log: PathBuf,
}

impl Audited {
    pub(crate) async fn start(extra: &[&str]) -> Audited {
        Audited::start_with(SimStreaming::SpdyOnly, extra).await
    }

    /// [`Audited::start`] against a cluster that streams as `streaming` says.
    async fn start_with(streaming: SimStreaming, extra: &[&str]) -> Audited {
        Audited::launch(streaming, extra, &[]).await
    }

    /// [`Audited::start_with`], with extra environment variables for the proxy.
    pub(crate) async fn launch(
        streaming: SimStreaming,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Audited {
        let user = |token: &str, name: &str, groups: &[&str]| SimUser {
            token: token.to_owned(),
            name: name.to_owned(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
        };
        let sim = SimCluster::start(SimConfig {
            users: vec![
                user(TINA, "tina", &["dev"]),
                user(PROXY_TOKEN, PROXY_USER, &["system:serviceaccounts"]),
            ],
            impersonators: vec![PROXY_USER.to_owned()],
            streaming,
            ..SimConfig::default()
        })
        .await
        .expect("start the cluster");
        let dir = tempfile::tempdir().unwrap();
        let proxy_ca = Ca::new("proxy");
        let client_ca = Ca::new("clients");
        let (cert, key) = proxy_ca.server().write(dir.path(), "serving");
        let client_ca_file = client_ca.write(dir.path(), "client-ca");
        let token_file = dir.path().join("proxy-token");
        std::fs::write(&token_file, PROXY_TOKEN).unwrap();
        let audit_log = dir.path().join("audit.log");
        let mut args: Vec<String> = [
            "--upstream",
            &sim.url(),
            "--upstream-token-file",
            &token_file.display().to_string(),
            "--tls-cert-file",
            &cert.display().to_string(),
            "--tls-private-key-file",
            &key.display().to_string(),
            "--client-ca-file",
            &client_ca_file.display().to_string(),
            "--audit-log",
            &audit_log.display().to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let proxy = ProxyProcess::launch(&refs, env);
        Audited {
            sim,
            proxy,
            dir,
            proxy_ca,
            client_ca,
            audit_log,
        }
    }

    pub(crate) fn kubeconfig(
        &self,
        name: &str,
        token: Option<&str>,
        cert: Option<&Leaf>,
    ) -> PathBuf {
        kubeconfig(
            &self.dir.path().join(format!("kubeconfig-{name}")),
            &format!("https://127.0.0.1:{}", self.proxy.addr.port()),
            &self.proxy_ca.pem,
            token,
            cert,
        )
    }

    fn events(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.audit_log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("an audit line is JSON"))
            .collect()
    }

    /// Waits for the `ended` event of the session whose `started` event matches `pick`; both.
    pub(crate) async fn pair(&self, pick: impl Fn(&Value) -> bool) -> (Value, Value) {
        let deadline = tokio::time::Instant::now() + T;
        loop {
            let events = self.events();
            if let Some(start) = events.iter().find(|e| e["stage"] == "started" && pick(e)) {
                let id = &start["session_id"];
                if let Some(end) = events
                    .iter()
                    .find(|e| e["stage"] == "ended" && &e["session_id"] == id)
                {
                    self.assert_audit_id(start, end);
                    return (start.clone(), end.clone());
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no matching start/end pair in the audit log:\n{}",
                serde_json::to_string_pretty(&events).unwrap()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Audited {
    /// The session's `audit_id` is the `Audit-ID` its request reached the cluster with, so the
    /// API server's audit log and ours name the same request.
    fn assert_audit_id(&self, start: &Value, end: &Value) {
        let id = start["audit_id"].as_str().unwrap_or_default();
        assert!(!id.is_empty(), "no audit_id in {start}");
        assert_eq!(start["audit_id"], end["audit_id"], "{start} / {end}");
        let pod_path = format!("/pods/{}/", start["pod"].as_str().unwrap());
        let seen = self.sim.requests();
        assert!(
            seen.iter()
                .any(|r| r.path.contains(&pod_path) && r.header("audit-id") == Some(id)),
            "the cluster saw no request for {pod_path} with Audit-ID {id}: {:?}",
            seen.iter()
                .map(|r| (r.path.as_str(), r.header("audit-id")))
                .collect::<Vec<_>>()
        );
    }
}

fn kubectl_cmd(k: &Path, kubeconfig: &Path, cwd: &Path) -> tokio::process::Command {
    let mut c = tokio::process::Command::new(k);
    c.arg("--kubeconfig")
        .arg(kubeconfig)
        .current_dir(cwd)
        .env("HOME", cwd)
        .env_remove("KUBECONFIG")
        .env_remove("KUBECTL_REMOTE_COMMAND_WEBSOCKETS")
        .env_remove("KUBECTL_PORT_FORWARD_WEBSOCKETS")
        .kill_on_drop(true);
    c
}

async fn kubectl(k: &Path, kubeconfig: &Path, cwd: &Path, args: &[&str]) -> Output {
    let mut c = kubectl_cmd(k, kubeconfig, cwd);
    c.args(args).stdin(Stdio::null());
    tokio::time::timeout(T, c.output())
        .await
        .expect("kubectl finished")
        .expect("kubectl ran")
}

/// The fields every event carries, the same in both events of a session.
fn assert_common(start: &Value, end: &Value, verb: &str, path: &str) {
    for field in [
        "session_id",
        "verb",
        "namespace",
        "pod",
        "container",
        "command",
        "tty",
        "user",
        "groups",
        "identity_source",
        "client_address",
        "http_version",
    ] {
        assert!(start.get(field).is_some(), "no {field} in {start}");
        assert_eq!(start[field], end[field], "{field} differs: {start} / {end}");
    }
    assert_eq!(start["verb"], verb, "{start}");
    // Every proxy here runs `--upstream-streaming auto`, where the upstream's answers decide the
    // path of an exec, attach or port-forward after its `started` event: that event says
    // `auto`, the `ended` event names the path taken.
    let decided_by_auto = matches!(
        path,
        "translated" | "tunnel" | "pass_through" | "reverse_translated" | "relay_spdy"
    );
    let started_path = if decided_by_auto { "auto" } else { path };
    assert_eq!(start["protocol_path"], started_path, "{start}");
    assert_eq!(end["protocol_path"], path, "{end}");
    assert_eq!(start["namespace"], "default", "{start}");
    assert!(
        start["client_address"]
            .as_str()
            .unwrap()
            .starts_with("127.0.0.1:"),
        "{start}"
    );
    for field in [
        "bytes_in",
        "bytes_out",
        "duration_ms",
        "outcome",
        "ended_by",
    ] {
        assert!(end.get(field).is_some(), "no {field} in {end}");
    }
    assert!(start["time"].as_str().unwrap().ends_with('Z'), "{start}");
}

fn assert_tina(start: &Value) {
    assert_eq!(start["user"], "tina", "{start}");
    assert!(
        start["groups"]
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g == "dev"),
        "{start}"
    );
    assert_eq!(start["identity_source"], "self_subject_review", "{start}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passthrough_exec_cp_port_forward_and_logs_are_audited_with_the_reviewed_identity() {
    let (Some(k33), Some(k28)) = (require_kubectl("1.33"), require_kubectl("1.28")) else {
        return;
    };
    let a = Audited::start(&[]).await;
    let kc = a.kubeconfig("tina", Some(TINA), None);
    let cwd = a.dir.path();

    // Translated exec with an exit code.
    let o = kubectl(
        &k33,
        &kc,
        cwd,
        &["exec", "web", "--", "sh", "-c", "echo hi; exit 3"],
    )
    .await;
    assert_eq!(o.status.code(), Some(3), "kubectl: {}", stderr(&o));
    let (start, end) = a.pair(|e| e["command"][2] == "echo hi; exit 3").await;
    assert_common(&start, &end, "exec", "translated");
    assert_tina(&start);
    assert_eq!(start["pod"], "web");
    // The path, and with it the protocol, is decided after the `started` event.
    assert_eq!(start["protocol"], serde_json::Value::Null, "{start}");
    assert_eq!(end["protocol"], "v5.channel.k8s.io", "{end}");
    // kubectl's upgrades are HTTP/1.1 (its TLS offers only http/1.1 for them).
    assert_eq!(start["http_version"], "HTTP/1.1", "{start}");
    assert_eq!(end["exit_code"], 3, "{end}");
    assert_eq!(end["bytes_out"], 3, "{end}");
    assert_eq!(end["outcome"], "non_zero_exit", "{end}");

    // cp is an exec of tar.
    std::fs::write(cwd.join("note.txt"), "copied\n").unwrap();
    let o = kubectl(&k33, &kc, cwd, &["cp", "note.txt", "web:note.txt"]).await;
    assert!(o.status.success(), "kubectl cp: {}", stderr(&o));
    let (start, end) = a.pair(|e| e["command"][0] == "tar").await;
    assert_common(&start, &end, "exec", "translated");
    assert_tina(&start);
    assert_eq!(end["exit_code"], 0, "{end}");
    assert!(end["bytes_in"].as_u64().unwrap() > 0, "{end}");

    // kubectl 1.28 speaks SPDY: relayed.
    let o = kubectl(
        &k28,
        &kc,
        cwd,
        &["exec", "old", "--", "sh", "-c", "echo relayed; exit 4"],
    )
    .await;
    assert_eq!(o.status.code(), Some(4), "kubectl 1.28: {}", stderr(&o));
    let (start, end) = a.pair(|e| e["pod"] == "old").await;
    assert_common(&start, &end, "exec", "relay_spdy");
    assert_tina(&start);
    assert_eq!(start["http_version"], "HTTP/1.1", "{start}");
    assert!(
        end["protocol"].as_str().unwrap().starts_with("SPDY/3.1"),
        "{end}"
    );
    assert_eq!(end["outcome"], "non_zero_exit", "{end}");
    // Followed for its exit code (its error stream alone) though nothing is recorded.
    assert_eq!(end["exit_code"], 4, "{end}");
    assert_eq!(end["recording"], Value::Null, "{end}");
    assert!(end["bytes_out"].as_u64().unwrap() > 0, "{end}");

    // Port-forward: the tunnel.
    let echo = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let echo_port = echo.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = echo.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    let mut pf = kubectl_cmd(&k33, &kc, cwd);
    pf.args([
        "port-forward",
        "--address",
        "127.0.0.1",
        "pod/db",
        &format!(":{echo_port}"),
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = pf.spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let local: u16 = tokio::time::timeout(T, async {
        loop {
            let line = lines
                .next_line()
                .await
                .unwrap()
                .expect("port-forward ended");
            if let Some(rest) = line.strip_prefix("Forwarding from 127.0.0.1:") {
                return rest.split(' ').next().unwrap().parse().unwrap();
            }
        }
    })
    .await
    .expect("port-forward ready");
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", local))
        .await
        .unwrap();
    s.write_all(b"audited tunnel").await.unwrap();
    let mut buf = [0u8; 14];
    tokio::time::timeout(T, s.read_exact(&mut buf))
        .await
        .unwrap()
        .unwrap();
    drop(s);
    child.kill().await.unwrap();
    let (start, end) = a.pair(|e| e["pod"] == "db").await;
    assert_common(&start, &end, "portforward", "tunnel");
    assert_tina(&start);
    assert!(
        end["protocol"]
            .as_str()
            .unwrap()
            .contains("portforward.k8s.io"),
        "{end}"
    );
    assert!(end["bytes_in"].as_u64().unwrap() > 14, "{end}");

    // A followed log over plain HTTP, until the client goes.
    let mut logs = kubectl_cmd(&k33, &kc, cwd);
    logs.args(["logs", "-f", "logger"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = logs.spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    tokio::time::timeout(T, async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line == "log line 12" {
                return;
            }
        }
        panic!("the log ended early");
    })
    .await
    .expect("followed lines");
    child.kill().await.unwrap();
    let (start, end) = a.pair(|e| e["pod"] == "logger").await;
    assert_common(&start, &end, "log", "http");
    assert_tina(&start);
    // A plain request: client-go takes the h2 the TLS listener offers.
    assert_eq!(start["http_version"], "HTTP/2", "{start}");
    assert_eq!(end["ended_by"], "client gone", "{end}");
    assert!(end["bytes_out"].as_u64().unwrap() > 100, "{end}");

    // Every start has its end, and nothing was dropped.
    let events = a.events();
    let starts = events.iter().filter(|e| e["stage"] == "started").count();
    let ends = events.iter().filter(|e| e["stage"] == "ended").count();
    assert_eq!(starts, ends, "{events:#?}");
    let metrics = a.proxy.metrics();
    assert!(
        metrics.contains("kube_ws_proxy_audit_events_dropped_total 0"),
        "{metrics}"
    );
}

/// A server on 127.0.0.1 whose every connection says how much it moves: the client's first 8
/// bytes are two big-endian u32, the bytes the client sends in all (those 8 included) and the
/// bytes the server answers with. It reads them all, answers, and closes.
async fn counting_server() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = [0u8; 8];
                if s.read_exact(&mut head).await.is_err() {
                    return;
                }
                let [a, b, c, d, e, f, g, h] = head;
                let sent = u32::from_be_bytes([a, b, c, d]) as usize;
                let answer = u32::from_be_bytes([e, f, g, h]) as usize;
                let mut rest = vec![0u8; sent.saturating_sub(head.len())];
                if s.read_exact(&mut rest).await.is_err() {
                    return;
                }
                let _ = s.write_all(&vec![b'r'; answer]).await;
                let _ = s.shutdown().await;
            });
        }
    });
    port
}

/// One connection through the forwarded `local` port that moves exactly `sent` bytes to the
/// counting server and `answer` bytes back.
async fn exchange(local: u16, sent: u32, answer: u32) {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", local))
        .await
        .unwrap();
    let mut msg = vec![b's'; sent as usize];
    msg[..4].copy_from_slice(&sent.to_be_bytes());
    msg[4..8].copy_from_slice(&answer.to_be_bytes());
    s.write_all(&msg).await.unwrap();
    let mut got = vec![0u8; answer as usize];
    tokio::time::timeout(T, s.read_exact(&mut got))
        .await
        .expect("the answer in time")
        .expect("the whole answer");
    assert!(got.iter().all(|&b| b == b'r'));
}

/// Runs `kubectl port-forward pod/<pod>` to both remote ports, makes one connection through
/// each (`1000`/`70000` bytes through the first, `20`/`5` through the second), stops kubectl
/// and checks the session's events list both connections with their exact bytes.
async fn forward_two_connections(a: &Audited, k: &Path, kc: &Path, pod: &str, path: &str) {
    let ports = [counting_server().await, counting_server().await];
    let mut pf = kubectl_cmd(k, kc, a.dir.path());
    pf.args([
        "port-forward",
        "--address",
        "127.0.0.1",
        &format!("pod/{pod}"),
    ])
    .args(ports.iter().map(|p| format!(":{p}")))
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = pf.spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // "Forwarding from 127.0.0.1:<local> -> <remote>", once per port.
    let mut local = [0u16; 2];
    tokio::time::timeout(T, async {
        let mut found = 0;
        while found < 2 {
            let line = lines
                .next_line()
                .await
                .unwrap()
                .expect("port-forward ended");
            let Some(rest) = line.strip_prefix("Forwarding from 127.0.0.1:") else {
                continue;
            };
            let (l, r) = rest.split_once(" -> ").expect("local -> remote");
            let remote: u16 = r.trim().parse().unwrap();
            let i = ports
                .iter()
                .position(|&p| p == remote)
                .expect("a port asked for");
            local[i] = l.parse().unwrap();
            found += 1;
        }
    })
    .await
    .expect("port-forward ready");
    exchange(local[0], 1000, 70_000).await;
    exchange(local[1], 20, 5).await;
    child.kill().await.unwrap();

    let (start, end) = a.pair(|e| e["pod"] == pod).await;
    assert_common(&start, &end, "portforward", path);
    assert_tina(&start);
    // The request names no ports; the session's streams did.
    assert_eq!(start["ports"], serde_json::json!([]), "{start}");
    let mut sorted = ports;
    sorted.sort_unstable();
    assert_eq!(end["ports"], serde_json::json!(sorted), "{end}");
    let connections = end["connections"].as_array().expect("a list");
    assert_eq!(connections.len(), 2, "{end}");
    for (port, bytes_in, bytes_out) in [(ports[0], 1000, 70_000), (ports[1], 20, 5)] {
        let c = connections
            .iter()
            .find(|c| c["port"] == port)
            .unwrap_or_else(|| panic!("no connection to {port}: {end}"));
        assert_eq!(c["bytes_in"], bytes_in, "{c}");
        assert_eq!(c["bytes_out"], bytes_out, "{c}");
        assert_eq!(c["error"], Value::Null, "{c}");
        assert!(c["request_id"].is_string(), "{c}");
    }
    assert_ne!(connections[0]["request_id"], connections[1]["request_id"]);
    assert_eq!(end["connections_omitted"], 0, "{end}");
    assert_eq!(end["connections_error"], Value::Null, "{end}");
    // The session's raw bytes include the SPDY framing around the payloads.
    assert!(end["bytes_in"].as_u64().unwrap() > 1020, "{end}");
    assert!(end["bytes_out"].as_u64().unwrap() > 70_005, "{end}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn port_forward_connections_are_listed_with_their_ports_and_bytes() {
    let (Some(k33), Some(k28)) = (require_kubectl("1.33"), require_kubectl("1.28")) else {
        return;
    };
    let a = Audited::start(&[]).await;
    let kc = a.kubeconfig("tina", Some(TINA), None);
    forward_two_connections(&a, &k33, &kc, "db-tunnel", "tunnel").await;
    forward_two_connections(&a, &k28, &kc, "db-spdy", "relay_spdy").await;
    // Other sessions carry the field too, empty.
    let o = kubectl(&k33, &kc, a.dir.path(), &["exec", "web", "--", "true"]).await;
    assert!(o.status.success(), "kubectl: {}", stderr(&o));
    let (_, end) = a.pair(|e| e["pod"] == "web").await;
    assert_eq!(end["connections"], serde_json::json!([]), "{end}");
}

/// A cluster that serves the tunnel itself gets kubectl 1.33's tunnel passed through unchanged
/// (`--upstream-streaming auto`); the proxy follows the SPDY inside its WebSocket frames, so
/// the session's event lists the connections as on the other paths.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_passed_through_tunnel_lists_its_connections_with_their_ports_and_bytes() {
    let Some(k33) = require_kubectl("1.33") else {
        return;
    };
    let a = Audited::start_with(SimStreaming::New, &[]).await;
    let kc = a.kubeconfig("tina", Some(TINA), None);
    forward_two_connections(&a, &k33, &kc, "db-pass", "pass_through").await;
    // An exec passed through is followed for its exit code alone (nothing is recorded).
    let o = kubectl(
        &k33,
        &kc,
        a.dir.path(),
        &["exec", "web-pass", "--", "sh", "-c", "echo passed; exit 5"],
    )
    .await;
    assert_eq!(o.status.code(), Some(5), "kubectl: {}", stderr(&o));
    let (start, end) = a.pair(|e| e["pod"] == "web-pass").await;
    assert_common(&start, &end, "exec", "pass_through");
    assert_eq!(end["exit_code"], 5, "{end}");
    assert_eq!(end["outcome"], "non_zero_exit", "{end}");
    assert_eq!(end["recording"], Value::Null, "{end}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relayed_websocket_exec_is_audited_with_the_callers_token() {
    use futures_util::StreamExt;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;

    // No TLS needed for a raw client: it sends its token over plain HTTP.
    let sim = SimCluster::start(SimConfig {
        users: vec![SimUser {
            token: TINA.to_owned(),
            name: "tina".to_owned(),
            groups: vec!["dev".to_owned()],
        }],
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("audit.log");
    let proxy = ProxyProcess::start(&sim.url(), &["--audit-log", &log.display().to_string()]);
    let path = common::ws_client::exec_path("v4pod", &["echo", "relayed v4"], false, true, false);
    let mut req = format!("ws://{}{path}", proxy.addr)
        .into_client_request()
        .unwrap();
    req.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        "v4.channel.k8s.io".parse().unwrap(),
    );
    req.headers_mut()
        .insert("Authorization", format!("Bearer {TINA}").parse().unwrap());
    let tcp = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let (mut ws, _) = tokio_tungstenite::client_async(req, tcp).await.unwrap();
    tokio::time::timeout(T, async { while let Some(Ok(_)) = ws.next().await {} })
        .await
        .unwrap();
    // The relay ends when both directions have: the client's too.
    drop(ws);
    let deadline = tokio::time::Instant::now() + T;
    let events = loop {
        let events: Vec<Value> = std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        if events.len() >= 2 || tokio::time::Instant::now() > deadline {
            break events;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(events.len(), 2, "{events:#?}");
    let (start, end) = (&events[0], &events[1]);
    assert_common(start, end, "exec", "relay_websocket");
    assert_tina(start);
    // The relayed protocol is the upstream's choice: known once it answered, after the
    // `started` event.
    assert_eq!(start["protocol"], serde_json::Value::Null, "{start}");
    assert_eq!(end["protocol"], "v4.channel.k8s.io", "{end}");
    assert_eq!(start["command"], serde_json::json!(["echo", "relayed v4"]));
    assert!(end["bytes_out"].as_u64().unwrap() > 0, "{end}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_websocket_port_forward_lists_its_port_and_bytes() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    use tokio_tungstenite::tungstenite::Message;

    let sim = SimCluster::start(SimConfig {
        users: vec![SimUser {
            token: TINA.to_owned(),
            name: "tina".to_owned(),
            groups: vec!["dev".to_owned()],
        }],
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("audit.log");
    let proxy = ProxyProcess::start(&sim.url(), &["--audit-log", &log.display().to_string()]);
    let port = counting_server().await;
    let mut req = format!(
        "ws://{}/api/v1/namespaces/default/pods/db-legacy/portforward?ports={port}",
        proxy.addr
    )
    .into_client_request()
    .unwrap();
    req.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        "v4.channel.k8s.io".parse().unwrap(),
    );
    req.headers_mut()
        .insert("Authorization", format!("Bearer {TINA}").parse().unwrap());
    let tcp = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let (mut ws, _) = tokio_tungstenite::client_async(req, tcp).await.unwrap();
    // 1000 bytes in (the counting server's header first), 3000 back on channel 0.
    let (sent, answer) = (1000u32, 3000u32);
    let mut msg = vec![0u8];
    msg.extend(sent.to_be_bytes());
    msg.extend(answer.to_be_bytes());
    msg.resize(1 + sent as usize, b's');
    ws.send(Message::Binary(msg.into())).await.unwrap();
    let mut got = 0usize;
    let mut prefixes = 0;
    tokio::time::timeout(T, async {
        while got < answer as usize {
            let Some(Ok(Message::Binary(data))) = ws.next().await else {
                panic!("the session ended early");
            };
            match data.first() {
                // Each channel's first message is the port.
                _ if prefixes < 2 => {
                    assert_eq!(&data[1..], port.to_le_bytes());
                    prefixes += 1;
                }
                Some(0) => got += data.len() - 1,
                other => panic!("unexpected message on {other:?}"),
            }
        }
    })
    .await
    .expect("the answer in time");
    assert_eq!(got, answer as usize);
    let _ = ws.close(None).await;
    drop(ws);
    let deadline = tokio::time::Instant::now() + T;
    let events = loop {
        let events: Vec<Value> = std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        if events.len() >= 2 || tokio::time::Instant::now() > deadline {
            break events;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(events.len(), 2, "{events:#?}");
    let (start, end) = (&events[0], &events[1]);
    assert_common(start, end, "portforward", "relay_websocket");
    assert_eq!(start["ports"], serde_json::json!([port]), "{start}");
    assert_eq!(end["ports"], serde_json::json!([port]), "{end}");
    assert_eq!(
        end["connections"],
        serde_json::json!([{
            "port": port,
            "request_id": "0",
            "bytes_in": sent,
            "bytes_out": answer,
            "error": null,
        }]),
        "{end}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impersonate_mode_events_carry_the_authenticated_caller() {
    let Some(k33) = require_kubectl("1.33") else {
        return;
    };
    let a = Audited::start(&["--auth-mode", "impersonate"]).await;
    let alice = a.client_ca.client_in_groups("alice", &["ops", "oncall"]);
    let kc = a.kubeconfig("alice", None, Some(&alice));
    let o = kubectl(&k33, &kc, a.dir.path(), &["exec", "web", "--", "true"]).await;
    assert!(o.status.success(), "kubectl: {}", stderr(&o));
    let (start, end) = a.pair(|e| e["pod"] == "web").await;
    assert_common(&start, &end, "exec", "translated");
    assert_eq!(start["user"], "alice", "{start}");
    assert_eq!(
        start["groups"],
        serde_json::json!(["ops", "oncall"]),
        "{start}"
    );
    assert_eq!(start["identity_source"], "authenticated", "{start}");
    assert_eq!(end["exit_code"], 0, "{end}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passthrough_events_name_whom_a_kubectl_as_caller_impersonates() {
    let Some(k33) = require_kubectl("1.33") else {
        return;
    };
    let a = Audited::start(&[]).await;
    // The proxy's service account may impersonate on the simulated cluster.
    let admin = a.kubeconfig("admin", Some(PROXY_TOKEN), None);
    let o = kubectl(
        &k33,
        &admin,
        a.dir.path(),
        &[
            "--as",
            "someone",
            "--as-group",
            "team",
            "exec",
            "web",
            "--",
            "printenv",
            "SIM_USER",
        ],
    )
    .await;
    assert!(o.status.success(), "kubectl: {}", stderr(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "someone");
    let (start, end) = a.pair(|e| e["command"][0] == "printenv").await;
    assert_common(&start, &end, "exec", "translated");
    // Who the caller is (its own credentials), and whom it acted as.
    assert_eq!(start["user"], PROXY_USER, "{start}");
    assert_eq!(start["identity_source"], "self_subject_review", "{start}");
    let asked =
        serde_json::json!({"user": "someone", "uid": null, "groups": ["team"], "extra": {}});
    assert_eq!(start["impersonated_user"], asked, "{start}");
    assert_eq!(end["impersonated_user"], asked, "{end}");
    assert_eq!(end["exit_code"], 0, "{end}");

    let tina = a.kubeconfig("tina", Some(TINA), None);
    // Without --as the field is null.
    let o = kubectl(&k33, &tina, a.dir.path(), &["exec", "web", "--", "true"]).await;
    assert!(o.status.success(), "kubectl: {}", stderr(&o));
    let (start, _) = a
        .pair(|e| {
            e["user"] == "tina"
                && e["command"] == serde_json::json!(["true"])
                && e["impersonated_user"].is_null()
        })
        .await;
    assert!(start.get("impersonated_user").is_some(), "{start}");
}

#[test]
fn an_audit_log_that_cannot_be_opened_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_kube-ws-proxy"))
        .args([
            "--upstream",
            "http://127.0.0.1:1",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--audit-log",
        ])
        .arg(dir.path().join("no/such/dir/audit.log"))
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("cannot open the audit log"), "{err}");
}
