//! The kubelet's own API through `nodes/{node}/proxy` (issue 35): an exec over the legacy v4
//! WebSocket protocol and a `run`, with `--node-proxy-sessions=audit`, are audited with the
//! node named and recorded; by default (`refuse`) they get a 403 Status and never reach the
//! cluster. kubectl cannot exec through the node proxy, so a raw client asks, as a script with
//! `nodes/proxy` rights would.
//!
//! The new setting is given through the environment, which an older build ignores: there
//! the exec is relayed unaudited and unrecorded, and these tests fail.

use crate::common;

use std::io::{Read, Write};
use std::time::Duration;

use common::proxy_process::ProxyProcess;
use common::ws_client::{connect, read_to_close};
use kube_ws_proxy::sim::{SimCluster, SimConfig};
use serde_json::Value;

const T: Duration = Duration::from_secs(30);
const EXEC: &str =
    "/api/v1/nodes/sim-node/proxy/exec/default/web/main?command=echo&command=node+hi&output=1";

struct NodeProxy {
    sim: SimCluster,
    proxy: ProxyProcess,
    dir: tempfile::TempDir,
}

impl NodeProxy {
    /// The simulated cluster (no authentication) and a proxy auditing and recording
    /// (`--record required`), with `--node-proxy-sessions` as `setting` says (`None`: the
    /// default).
    async fn start(setting: Option<&str>) -> NodeProxy {
        let sim = SimCluster::start(SimConfig::default()).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (log, casts) = (dir.path().join("audit.log"), dir.path().join("casts"));
        std::fs::create_dir(&casts).unwrap();
        let env: Vec<(&str, &str)> = setting
            .map(|s| ("KUBE_WS_PROXY_NODE_PROXY_SESSIONS", s))
            .into_iter()
            .collect();
        let proxy = ProxyProcess::launch(
            &[
                "--upstream",
                &sim.url(),
                "--audit-log",
                &log.display().to_string(),
                "--record",
                "required",
                "--record-dir",
                &casts.display().to_string(),
            ],
            &env,
        );
        NodeProxy { sim, proxy, dir }
    }

    fn events(&self) -> Vec<Value> {
        std::fs::read_to_string(self.dir.path().join("audit.log"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// The `started` and `ended` events of the one session, once both are written.
    async fn pair(&self) -> (Value, Value) {
        let deadline = tokio::time::Instant::now() + T;
        loop {
            let events = self.events();
            if events.len() >= 2 || tokio::time::Instant::now() > deadline {
                assert_eq!(events.len(), 2, "{events:#?}");
                return (events[0].clone(), events[1].clone());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The text of the one recording.
    fn recording(&self) -> String {
        let casts: Vec<_> = std::fs::read_dir(self.dir.path().join("casts"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(casts.len(), 1, "{casts:?}");
        std::fs::read_to_string(&casts[0]).unwrap()
    }

    /// Whether the cluster saw any request through the node proxy.
    fn cluster_was_asked(&self) -> bool {
        self.sim
            .requests()
            .iter()
            .any(|r| r.path.starts_with("/api/v1/nodes/"))
    }
}

/// A `run` of `echo ran here` through the node proxy, its command in a form body; the whole
/// answer.
async fn run(addr: std::net::SocketAddr) -> String {
    tokio::task::spawn_blocking(move || run_blocking(addr))
        .await
        .unwrap()
}

fn run_blocking(addr: std::net::SocketAddr) -> String {
    let body = "cmd=echo+ran+here";
    let mut tcp = std::net::TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(T)).unwrap();
    write!(
        tcp,
        "POST /api/v1/nodes/https:sim-node:10250/proxy/run/default/web/main HTTP/1.1\r\n\
         Host: x\r\nContent-Type: application/x-www-form-urlencoded\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    tcp.read_to_string(&mut answer).unwrap();
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubelet_exec_through_the_node_proxy_is_audited_with_its_node_and_recorded() {
    let n = NodeProxy::start(Some("audit")).await;
    let (mut ws, _) = connect(n.proxy.addr, EXEC, "v4.channel.k8s.io")
        .await
        .expect("the kubelet's exec is served");
    let t = tokio::time::timeout(T, read_to_close(&mut ws))
        .await
        .unwrap();
    drop(ws);
    assert_eq!(String::from_utf8_lossy(&t.stdout), "node hi\n");
    let (start, end) = n.pair().await;
    assert_eq!(start["verb"], "exec", "{start}");
    assert_eq!(start["node"], "sim-node", "{start}");
    assert_eq!(start["namespace"], "default", "{start}");
    assert_eq!(start["pod"], "web", "{start}");
    assert_eq!(start["container"], "main", "{start}");
    assert_eq!(start["command"], serde_json::json!(["echo", "node hi"]));
    assert_eq!(start["protocol_path"], "relay_websocket", "{start}");
    assert!(start["recording"].is_string(), "{start}");
    assert_eq!(end["node"], "sim-node", "{end}");
    assert_eq!(end["exit_code"], 0, "{end}");
    assert_eq!(end["recording_error"], Value::Null, "{end}");
    let cast = n.recording();
    assert!(cast.contains("node hi"), "{cast}");
    assert!(
        cast.lines().next().unwrap().contains("on node sim-node"),
        "{cast}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubelet_run_through_the_node_proxy_is_audited_and_its_output_recorded() {
    let n = NodeProxy::start(Some("audit")).await;
    let answer = run(n.proxy.addr).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("ran here\n"), "{answer}");
    let (start, end) = n.pair().await;
    assert_eq!(start["verb"], "run", "{start}");
    assert_eq!(start["node"], "sim-node", "{start}");
    assert_eq!(start["command"], serde_json::json!(["echo", "ran", "here"]));
    assert_eq!(start["protocol_path"], "http", "{start}");
    assert_eq!(end["outcome"], "success", "{end}");
    assert_eq!(end["bytes_out"], 9, "{end}");
    assert!(n.recording().contains("ran here"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_sessions_are_refused_by_default_before_anything_goes_upstream() {
    let n = NodeProxy::start(None).await;
    match connect(n.proxy.addr, EXEC, "v4.channel.k8s.io").await {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            assert_eq!(resp.status(), 403);
            let body = String::from_utf8_lossy(resp.body().as_deref().unwrap_or_default());
            assert!(body.contains("\"kind\":\"Status\""), "{body}");
            assert!(body.contains("--node-proxy-sessions"), "{body}");
        }
        other => panic!("not refused: {:?}", other.map(|(_, r)| r.status())),
    }
    let answer = run(n.proxy.addr).await;
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    assert!(
        !n.cluster_was_asked(),
        "a kubelet session reached the cluster"
    );
    assert!(n.events().is_empty(), "{:#?}", n.events());
    assert!(n
        .proxy
        .metrics()
        .contains(r#"kube_ws_proxy_handshake_rejections_total{cluster="default",reason="node_proxy_session"} 2"#));
    // The node proxy's other paths (metrics, stats, logs) go on as before.
    let mut tcp = std::net::TcpStream::connect(n.proxy.addr).unwrap();
    write!(
        tcp,
        "GET /api/v1/nodes/sim-node/proxy/metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    tcp.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");
    assert!(n.cluster_was_asked(), "the plain request was forwarded");
}
