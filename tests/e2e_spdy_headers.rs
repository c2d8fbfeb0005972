//! Relayed SPDY sessions whose streams carry headers as a Go client can write them (issue 35,
//! finding 2): `streamtype: stdout\0` is what Go's spdystream writes for the two values
//! `stdout` and `""`, and the kubelet reads it as stdout (the first value). kubectl never
//! sends such headers, so a raw SPDY client (ours) opens the streams, through the proxy, to
//! the simulated cluster, which reads them as the kubelet does (tests/spdy_header_differential
//! proves that reading against Go's). The recording must have what the streams carried, the
//! audit event the exit code and the forwarded port; a stream whose type the proxy does not
//! know ends a `--record=required` session and is named in a best-effort one's event.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method};
use kube_ws_proxy::spdy::frame::HeaderBlock;
use kube_ws_proxy::spdy::proto::{Config, Connection, RecvStream, Stream};
use kube_ws_proxy::spdy::upgrade::{upgrade, UpgradeRequest};
use serde_json::Value;
use tokio::net::TcpStream;

use crate::common::pod_server::PodServer;
use crate::e2e_recording::{events, Recorded};

const T: Duration = Duration::from_secs(60);

/// A SPDY session through the proxy at `addr` to `path`, offering `protocol`.
async fn spdy(addr: SocketAddr, path: &str, protocol: &str) -> Connection {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let request = UpgradeRequest {
        method: Method::POST,
        path_and_query: path.to_owned(),
        host: addr.to_string(),
        headers: HeaderMap::new(),
        protocols: vec![protocol.to_owned()],
    };
    let up = upgrade(tcp, &request).await.expect("upgrade to SPDY/3.1");
    assert_eq!(up.protocol.as_deref(), Some(protocol));
    Connection::client(up.io, up.leftover, Config::default())
}

fn headers(pairs: &[(&str, &[u8])]) -> HeaderBlock {
    pairs.iter().map(|(n, v)| (*n, *v)).collect()
}

async fn open(conn: &Connection, pairs: &[(&str, &[u8])]) -> Stream {
    tokio::time::timeout(T, conn.open_stream(headers(pairs)))
        .await
        .expect("the stream is answered")
        .expect("the stream opens")
}

async fn drain(rx: &mut RecvStream) -> Vec<u8> {
    let mut all = Vec::new();
    while let Some(chunk) = tokio::time::timeout(T, rx.recv()).await.unwrap() {
        all.extend_from_slice(&chunk.unwrap());
    }
    all
}

fn exec_path(pod: &str, script: &str, stdin: bool) -> String {
    let script: String = url::form_urlencoded::byte_serialize(script.as_bytes()).collect();
    format!(
        "/api/v1/namespaces/default/pods/{pod}/exec?command=sh&command=-c&command={script}\
         &stdin={stdin}&stdout=true&stderr=true"
    )
}

/// What a recording's events of `kind` (`o`, `i`) carried, joined.
fn recorded(events: &[Value], kind: &str) -> String {
    events
        .iter()
        .filter(|e| e[1] == kind)
        .map(|e| e[2].as_str().unwrap())
        .collect()
}

/// Every stream typed `name\0`, as Go writes the values `name` and `""`: the kubelet serves
/// them, and the recording has all of it (stdin too, with `--record-stdin`), the audit event
/// the exit code. A fifth stream whose type reads as empty (`\0stdout`: the kubelet ignores
/// it) is named in the best-effort event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_typed_with_a_nul_are_recorded_with_their_exit_code() {
    let r = Recorded::start(&["--record", "best-effort", "--record-stdin"]).await;
    let script = "read line; echo \"got $line\"; echo oops >&2; exit 3";
    let conn = spdy(
        r.proxy.addr,
        &exec_path("nul-streams", script, true),
        "v4.channel.k8s.io",
    )
    .await;
    let (_, mut error) = open(&conn, &[("streamtype", b"error\0")]).await.split();
    // Before the set is complete, so that the cluster answers it (and ignores it).
    let _unknown = open(&conn, &[("streamtype", b"\0stdout")]).await;
    let (mut stdin, _) = open(&conn, &[("streamtype", b"stdin\0")]).await.split();
    let (_, mut stdout) = open(&conn, &[("streamtype", b"stdout\0")]).await.split();
    let (_, mut stderr) = open(&conn, &[("streamtype", b"stderr\0")]).await.split();
    stdin.send(Bytes::from_static(b"typed\n")).await.unwrap();
    stdin.finish().await.unwrap();
    assert_eq!(drain(&mut stdout).await, b"got typed\n");
    assert_eq!(drain(&mut stderr).await, b"oops\n");
    let status: Value = serde_json::from_slice(&drain(&mut error).await).unwrap();
    assert_eq!(status["reason"], "NonZeroExitCode", "{status}");
    conn.close().await;

    let ended = r.ended("nul-streams").await;
    assert_eq!(ended["protocol_path"], "relay_spdy", "{ended}");
    assert_eq!(ended["exit_code"], 3, "{ended}");
    assert_eq!(
        ended["recording_error"], "stream 3 has a type the proxy does not know (streamtype \"\")",
        "{ended}"
    );
    let (_, events) = events(&r.recording(&ended));
    let output = recorded(&events, "o");
    assert!(output.contains("got typed"), "{events:?}");
    assert!(output.contains("oops"), "{events:?}");
    assert_eq!(recorded(&events, "i"), "typed\n", "{events:?}");
}

/// Under `--record=required` the same streams are recorded, and the session goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_required_streams_typed_with_a_nul_are_recorded() {
    let r = Recorded::start(&["--record", "required"]).await;
    let conn = spdy(
        r.proxy.addr,
        &exec_path("nul-required", "echo out; echo err >&2; exit 4", false),
        "v4.channel.k8s.io",
    )
    .await;
    let (_, mut error) = open(&conn, &[("streamtype", b"error\0")]).await.split();
    let (_, mut stdout) = open(&conn, &[("streamtype", b"stdout\0x")]).await.split();
    let (_, mut stderr) = open(&conn, &[("streamtype", b"stderr\0")]).await.split();
    assert_eq!(drain(&mut stdout).await, b"out\n");
    assert_eq!(drain(&mut stderr).await, b"err\n");
    drain(&mut error).await;
    conn.close().await;
    let ended = r.ended("nul-required").await;
    assert_eq!(ended["exit_code"], 4, "{ended}");
    assert_eq!(ended["recording_error"], Value::Null, "{ended}");
    let (_, events) = events(&r.recording(&ended));
    let output = recorded(&events, "o");
    assert!(
        output.contains("out") && output.contains("err"),
        "{events:?}"
    );
}

/// Under `--record=required` a stream whose type the proxy does not know ends the session
/// before it reaches the cluster, with a Status saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_required_a_stream_of_unknown_type_ends_the_session() {
    let r = Recorded::start(&["--record", "required"]).await;
    let conn = spdy(
        r.proxy.addr,
        &exec_path("unknown-required", "echo never", false),
        "v4.channel.k8s.io",
    )
    .await;
    let (_, mut error) = open(&conn, &[("streamtype", b"error")]).await.split();
    // Never answered: the proxy does not pass it on.
    let conn = std::sync::Arc::new(conn);
    let opener = {
        let conn = conn.clone();
        tokio::spawn(async move {
            conn.open_stream(headers(&[("streamtype", b"stdout2")]))
                .await
        })
    };
    let said = drain(&mut error).await;
    let status: Value = serde_json::from_slice(&said).unwrap_or_else(|_| {
        panic!(
            "no Status from the proxy on the error stream, only {:?}",
            String::from_utf8_lossy(&said)
        )
    });
    let message = status["message"].as_str().unwrap();
    assert!(
        message.contains("stream 3 has a type the proxy does not know (streamtype \"stdout2\")")
            && message.contains("--record=required"),
        "{status}"
    );
    conn.close().await;
    opener.abort();
    let ended = r.ended("unknown-required").await;
    assert!(
        ended["recording_error"]
            .as_str()
            .is_some_and(|e| e.contains("streamtype \"stdout2\"")),
        "{ended}"
    );
    assert_eq!(ended["exit_code"], Value::Null, "{ended}");
}

/// A port-forward stream whose port is `8080\0junk` (Go's writer, for the values `8080` and
/// `junk`) is forwarded to 8080: the audit event names that port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_with_a_nul_is_audited_as_the_port_forwarded_to() {
    let r = Recorded::start(&["--record", "best-effort"]).await;
    let pod = PodServer::echo().await;
    let port = format!("{}\0junk", pod.port);
    let conn = spdy(
        r.proxy.addr,
        "/api/v1/namespaces/default/pods/nul-port/portforward",
        "portforward.k8s.io",
    )
    .await;
    let stream = |ty: &'static [u8]| {
        headers(&[
            ("streamtype", ty),
            ("port", port.as_bytes()),
            ("requestid", b"0"),
        ])
    };
    let _error = conn.open_stream(stream(b"error")).await.unwrap();
    let (mut tx, mut rx) = conn.open_stream(stream(b"data")).await.unwrap().split();
    tx.send(Bytes::from_static(b"ping")).await.unwrap();
    tx.finish().await.unwrap();
    assert_eq!(drain(&mut rx).await, b"ping");
    conn.close().await;

    let ended = r.ended("nul-port").await;
    assert_eq!(ended["protocol_path"], "relay_spdy", "{ended}");
    assert_eq!(ended["ports"], serde_json::json!([pod.port]), "{ended}");
    let connections = ended["connections"].as_array().expect("a list");
    assert_eq!(connections.len(), 1, "{ended}");
    assert_eq!(connections[0]["port"], pod.port, "{ended}");
    assert_eq!(connections[0]["bytes_in"], 4, "{ended}");
    assert_eq!(connections[0]["bytes_out"], 4, "{ended}");
}
