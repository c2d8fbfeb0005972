//! An operator ends a live session (`kubectl delete --raw …/sessions/ID?reason=…`) on every
//! path the proxy serves, each with a real client: its client is told "terminated by olga:
//! incident-7" in a Status (or, for a port-forward, on its connections' error streams) and
//! fails, the pod's process (or forwarding) ends, the audit `ended` event names who and why,
//! and the session leaves the list. The translated path is in e2e_sessions_api.rs.
//!
//! - relayed SPDY: kubectl 1.27 (SPDY only), SPDY upstream;
//! - relayed legacy WebSocket: the Python client's `v4.channel.k8s.io` exec;
//! - pass-through: kubectl 1.33's v5 exec to a cluster that serves v5 itself;
//! - the port-forward tunnel: kubectl 1.33's port-forward;
//! - RFC 8441: a v5 exec on an HTTP/2 stream (extended CONNECT), translated and passed
//!   through.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Stdio;

use base64::Engine;
use common::clients::{python_with_kubernetes, require, require_kubectl};
use common::forward::Forward;
use common::h2_ws::H2Connection;
use common::operated::{failed_stderr, session_path, Operated, OLGA, T, TINA};
use common::pod_server::PodServer;
use futures_util::StreamExt;
use kube_ws_proxy::sim::{SimEvent, SimStreaming};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio_tungstenite::tungstenite::Message;

const REASON: &str = "incident-7";
/// What every terminated client is told.
const TOLD: &str = "kube-ws-proxy ended the session: terminated by olga: incident-7";

/// Ends the one live session, which must have taken `path` (its `protocolPath`), as olga with
/// kubectl 1.33; its id.
async fn terminate_the_session(o: &Operated, k33: &Path, path: &str) -> String {
    let olga = o.kubeconfig("olga", Some(OLGA), None);
    let (id, s) = o.only_session(k33, &olga).await;
    assert_eq!(s["spec"]["protocolPath"], path, "{s}");
    let delete = format!("{}?reason={REASON}", session_path("default", &id));
    o.delete(k33, &olga, &delete).await;
    id
}

/// The session `id` ended as olga's termination: its audit `ended` event names her and her
/// reason, and it is no longer listed.
async fn ended_by_olga(o: &Operated, k33: &Path, id: &str) {
    let e = o.ended(id).await;
    assert_eq!(e["outcome"], "terminated", "{e}");
    assert_eq!(e["ended_by"], "terminated", "{e}");
    assert_eq!(e["terminated_by"], "olga", "{e}");
    assert_eq!(e["termination_reason"], REASON, "{e}");
    let olga = o.kubeconfig("olga", Some(OLGA), None);
    assert!(o.sessions(k33, &olga, 0).await.is_empty());
}

/// The pod's exec'd process ended.
async fn process_ended(o: &Operated) {
    o.sim
        .wait_for_event(T, |e| matches!(e, SimEvent::ProcessExited { .. }))
        .await
        .expect("the pod's process ended");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relayed_spdy_kubectl_is_told_on_the_error_stream() {
    let (Some(k33), Some(k27)) = (require_kubectl("1.33"), require_kubectl("1.27")) else {
        return;
    };
    let o = Operated::start(&[]).await;
    let tina = o.kubeconfig("tina", Some(TINA), None);
    let session = o.running_exec(&k27, &tina, "echo started; sleep 50").await;
    let id = terminate_the_session(&o, &k33, "relay_spdy").await;
    let printed = failed_stderr(session).await;
    assert!(printed.contains(TOLD), "{printed}");
    process_ended(&o).await;
    ended_by_olga(&o, &k33, &id).await;
}

/// Without the audit log (or a recording) nothing follows a relayed session's frames: a
/// terminate cuts it (docs/sessions-api.md says so), and kubectl ≤ 1.30 is told nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_audit_log_a_relayed_session_is_cut() {
    let (Some(k33), Some(k27)) = (require_kubectl("1.33"), require_kubectl("1.27")) else {
        return;
    };
    let o = Operated::start_unaudited(&[]).await;
    let tina = o.kubeconfig("tina", Some(TINA), None);
    let mut session = o.running_exec(&k27, &tina, "echo started; sleep 50").await;
    terminate_the_session(&o, &k33, "relay_spdy").await;
    tokio::time::timeout(T, session.wait())
        .await
        .expect("the cut session's kubectl exits")
        .unwrap();
    let mut printed = String::new();
    session
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut printed)
        .await
        .unwrap();
    assert!(!printed.contains("terminated by"), "{printed}");
    process_ended(&o).await;
    let olga = o.kubeconfig("olga", Some(OLGA), None);
    assert!(o.sessions(&k33, &olga, 0).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passed_through_v5_kubectl_is_told_on_channel_3() {
    let Some(k33) = require_kubectl("1.33") else {
        return;
    };
    let o = Operated::start_with(&["--upstream-streaming", "websocket"], |sim| {
        sim.streaming = SimStreaming::New;
    })
    .await;
    let tina = o.kubeconfig("tina", Some(TINA), None);
    let session = o.running_exec(&k33, &tina, "echo started; sleep 50").await;
    let id = terminate_the_session(&o, &k33, "pass_through").await;
    let printed = failed_stderr(session).await;
    assert!(printed.contains(TOLD), "{printed}");
    process_ended(&o).await;
    ended_by_olga(&o, &k33, &id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relayed_v4_websocket_python_client_gets_the_status() {
    let (Some(k33), Some(py)) = (
        require_kubectl("1.33"),
        require(
            "python3 with the kubernetes package",
            python_with_kubernetes(),
        ),
    ) else {
        return;
    };
    let o = Operated::start(&[]).await;
    let ca = o.proxy_ca.write(o.dir.path(), "proxy-ca");
    let mut client = python(&py, &o.url(), &ca, "exec-v4-until-ended");
    let mut out = BufReader::new(client.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(T, out.next_line())
        .await
        .expect("started");
    assert_eq!(first.unwrap().as_deref(), Some("started"));
    let id = terminate_the_session(&o, &k33, "relay_websocket").await;
    let result = tokio::time::timeout(T, out.next_line())
        .await
        .expect("the client ended")
        .unwrap()
        .expect("its result");
    let result: Value = serde_json::from_str(&result).unwrap();
    assert_eq!(result["subprotocol"], "v4.channel.k8s.io", "{result}");
    let status: Value = serde_json::from_str(result["error"].as_str().unwrap()).unwrap();
    assert_eq!(status["status"], "Failure", "{status}");
    assert_eq!(status["reason"], "Forbidden", "{status}");
    assert_eq!(status["message"], TOLD, "{status}");
    process_ended(&o).await;
    ended_by_olga(&o, &k33, &id).await;
}

/// The Python client script in `mode` against the proxy at `server` as tina.
fn python(py: &Path, server: &str, ca: &Path, mode: &str) -> tokio::process::Child {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/k8s_client.py");
    let mut c = tokio::process::Command::new(py);
    c.arg(script)
        .arg(server)
        .args(["--token", TINA, "--ca"])
        .arg(ca)
        .arg(mode)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true);
    c.spawn().expect("the python client runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tunnelled_port_forward_is_told_on_each_connections_error_stream() {
    let Some(k33) = require_kubectl("1.33") else {
        return;
    };
    let o = Operated::start(&[]).await;
    let pod = PodServer::echo().await;
    let tina = o.kubeconfig("tina", Some(TINA), None);
    let mut forward = Forward::start(o.kubectl_std(&k33, &tina), "web", &[pod.port]).await;
    assert!(forward.ready(), "{}", forward.stderr());
    // A forwarded connection, open while the session is ended.
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", forward.port(pod.port)))
        .await
        .unwrap();
    conn.write_all(b"ping").await.unwrap();
    let mut echoed = [0; 4];
    conn.read_exact(&mut echoed).await.unwrap();
    let id = terminate_the_session(&o, &k33, "tunnel").await;
    // The connection ends; kubectl says why and fails.
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(T, conn.read_to_end(&mut rest)).await;
    let status = forward.exit_status(T).await.expect("kubectl exits");
    assert!(!status.success());
    let printed = forward
        .stderr_once(|s| s.contains("lost connection to pod"))
        .await;
    assert!(printed.contains(TOLD), "{printed}");
    o.sim
        .wait_for_event(T, |e| matches!(e, SimEvent::SessionEnded { .. }))
        .await
        .expect("the pod's forwarding ended");
    ended_by_olga(&o, &k33, &id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_rfc_8441_websocket_gets_the_status_translated() {
    let Some(k33) = require_kubectl("1.33") else {
        return;
    };
    let o = Operated::start(&[]).await;
    rfc_8441_exec_is_told(&o, &k33, "translated").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_rfc_8441_websocket_gets_the_status_passed_through() {
    let Some(k33) = require_kubectl("1.33") else {
        return;
    };
    let o = Operated::start_with(&["--upstream-streaming", "websocket"], |sim| {
        sim.streaming = SimStreaming::New;
    })
    .await;
    rfc_8441_exec_is_told(&o, &k33, "pass_through").await;
}

/// A v5 exec on an HTTP/2 stream (tina's token in the bearer subprotocol entry), terminated
/// while it runs on `path`: channel 3 carries the Status before the Close.
async fn rfc_8441_exec_is_told(o: &Operated, k33: &Path, path: &str) {
    let conn = H2Connection::connect(o.proxy.addr, &o.proxy_ca.pem, 1 << 20, 16 << 20).await;
    let token = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(TINA);
    let protocols = format!("v5.channel.k8s.io, base64url.bearer.authorization.k8s.io.{token}");
    let exec = "/api/v1/namespaces/default/pods/web/exec?command=sh&command=-c\
                &command=echo%20started%3B%20sleep%2050&stdout=true&stderr=true";
    let (mut ws, chosen) = conn.websocket(exec, &protocols).await.expect("v5 over h2");
    assert_eq!(chosen, "v5.channel.k8s.io");
    let mut stdout = Vec::new();
    while !stdout.ends_with(b"started\n") {
        match tokio::time::timeout(T, ws.next()).await.expect("output") {
            Some(Ok(Message::Binary(m))) if m.first() == Some(&1) => stdout.extend(&m[1..]),
            Some(Ok(_)) => {}
            other => panic!("the session ended early: {other:?}"),
        }
    }
    let id = terminate_the_session(o, k33, path).await;
    let mut error = Vec::new();
    while let Some(Ok(m)) = tokio::time::timeout(T, ws.next()).await.expect("the end") {
        match m {
            Message::Binary(m) if m.first() == Some(&3) => error.extend(&m[1..]),
            Message::Close(_) => break,
            _ => {}
        }
    }
    // Reading on sends the Close's answer, which the proxy waits for before it finishes.
    while let Ok(Some(_)) = tokio::time::timeout(T, ws.next()).await {}
    // The stream ends with the client's side of it (an HTTP/2 client that keeps it open is
    // waited for until --close-drain-timeout).
    drop((ws, conn));
    let status: Value = serde_json::from_slice(&error).expect("a Status on channel 3");
    assert_eq!(status["status"], "Failure", "{status}");
    assert_eq!(status["message"], TOLD, "{status}");
    process_ended(o).await;
    ended_by_olga(o, k33, &id).await;
}
