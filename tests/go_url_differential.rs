//! The proxy's reading of a request target against Go's own: a real Go `net/http` server
//! (tests/interop/go_front, built in the test run) answers each generated request with what it
//! read (decoded path, the query pairs `url.ParseQuery` kept, the first-value options
//! kube-apiserver takes), and [`RequestTarget`] must read the same, refuse what Go's server
//! refuses, and produce a canonical form Go reads exactly as it read the original; and a
//! `nodes/{node}/proxy` request must reach the same kubelet call (node, pod, container, command,
//! streams) as Go's reading of kube-apiserver's node proxy and the kubelet's routes (go_front
//! emulates them with Go's own `net/url`, `strings` and `path.Join`). [`cluster_prefix`] checks
//! the cluster a `/clusters/NAME/...` target is routed to against the same readings.
//!
//! Without `go` the test is skipped with a note, unless `CI` is set, where that is a failure.

mod cluster_prefix;
mod request_host;

use crate::common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::OnceLock;

use common::go_front::{self, GoFront};
use kube_ws_proxy::request::go_url::slice_to_bool;
use kube_ws_proxy::request::target::RequestTarget;
use kube_ws_proxy::translate::exec_options::ExecOptions;
use proptest::prelude::*;
use serde_json::Value;

/// go_front in `reads` mode: every answer is what Go read of the request.
struct GoReads(GoFront);

impl GoReads {
    /// What Go read of `target`: `None` when Go's server refused it with 400.
    fn read(&self, target: &str) -> Option<Value> {
        let mut tcp = TcpStream::connect(self.0.addr).unwrap();
        write!(
            tcp,
            "GET {target} HTTP/1.1\r\nHost: go\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut answer = Vec::new();
        tcp.read_to_end(&mut answer).unwrap();
        let answer = String::from_utf8_lossy(&answer);
        let (head, body) = answer.split_once("\r\n\r\n").expect("an HTTP answer");
        match head.split(' ').nth(1) {
            Some("200") => Some(serde_json::from_str(body).expect("JSON reading")),
            Some("400") => None,
            other => panic!("Go answered {other:?} to {target:?}: {answer}"),
        }
    }
}

/// Go's reading without what path-normalizing fronts would see: those views depend on the bytes
/// as sent, which the canonical form changes on purpose (cluster_prefix checks them).
fn without_fronts(mut reading: Value) -> Value {
    reading.as_object_mut().unwrap().remove("fronts");
    reading
}

fn go_reads() -> Option<&'static GoReads> {
    static SERVER: OnceLock<Option<GoReads>> = OnceLock::new();
    SERVER
        .get_or_init(|| go_front::binary().map(|b| GoReads(GoFront::start(b, &["reads"]))))
        .as_ref()
}

/// Our reading in the shape of Go's answer: the decoded path, the kept pairs grouped by key.
fn ours_as_go(target: &RequestTarget) -> (String, Value) {
    let mut grouped: BTreeMap<Vec<u8>, Vec<String>> = BTreeMap::new();
    for (k, v) in target.query() {
        grouped
            .entry(k.as_bytes().to_vec())
            .or_default()
            .push(hex(v.as_bytes()));
    }
    let query = grouped
        .into_iter()
        .map(|(k, vs)| serde_json::json!([hex(&k), vs]))
        .collect();
    (hex(target.path().as_bytes()), Value::Array(query))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Pieces a generated target is made of: what changes a reading (escapes good and bad, `+`,
/// `;`, `&`, `=`, encoded slashes, non-ASCII) around names that matter.
fn piece(query: bool) -> impl Strategy<Value = String> {
    let mut pieces = vec![
        "/", "exec", "%65xec", "%65", "web", "pods", "%2F", "%2f", "%", "%z", "%zz", "%4", "%00",
        "%FF", "%C3%A9", "é", "+", ";", "%3B", "&", "=", "%3D", "%26", "a", "Z", "0", "~", ".",
        "..", "%25", "%2", "5", "x%", "?", "#", "*", "%20", "!", "$", "'", "(", ",", ":", "@",
    ];
    if query {
        pieces.extend([
            "command=",
            "container=",
            "tty=",
            "stdin=",
            "follow=",
            "false",
            "FALSE",
            "0",
            "1",
            "true",
            "&command=",
            "&container=",
            "%63ommand=",
            "&&",
        ]);
    }
    prop::sample::select(pieces).prop_map(str::to_owned)
}

fn generated_target() -> impl Strategy<Value = String> {
    let prefix = prop::sample::select(vec![
        "/",
        "/api/v1/namespaces/default/pods/web/",
        "/api/v1/namespaces/de%66ault/pods/",
    ]);
    let path = prop::collection::vec(piece(false), 0..8);
    let query = prop::option::of(prop::collection::vec(piece(true), 0..12));
    (prefix, path, query).prop_map(|(prefix, path, query)| {
        let mut target = format!("{prefix}{}", path.concat());
        if let Some(q) = query {
            target.push('?');
            target.push_str(&q.concat());
        }
        target
    })
}

/// Compares one target; `Err` says how the readings differ.
fn compare(go: &GoReads, sent: &str) -> Result<(), TestCaseError> {
    // What hyper hands the proxy (it refuses some targets itself, and those never reach us).
    let Ok(uri) = sent.parse::<http::Uri>() else {
        return Ok(());
    };
    let pq = uri.path_and_query().map(|pq| pq.as_str()).unwrap_or("/");
    let go_read = go.read(pq);
    let ours = RequestTarget::parse(uri.path(), uri.query());
    let (go_read, ours) = match (go_read, ours) {
        (None, Err(_)) => return Ok(()),
        (Some(g), Ok(o)) => (g, o),
        (g, o) => {
            return Err(TestCaseError::fail(format!(
                "{pq:?}: Go read {g:?}, we read {o:?}"
            )))
        }
    };
    // What the proxy sends upstream in place of the original: Go reads exactly the same.
    let canonical = go.read(ours.canonical()).map(without_fronts);
    let go_read = without_fronts(go_read);
    prop_assert_eq!(
        canonical.as_ref(),
        Some(&go_read),
        "Go's reading of the canonical form {:?} of {:?}",
        ours.canonical(),
        pq
    );
    if !ours.is_utf8() {
        // Read lossily, and refused if it is a streaming request (server.rs): only the
        // canonical form must be exact.
        return Ok(());
    }
    let (path_hex, query) = ours_as_go(&ours);
    prop_assert_eq!(
        &go_read["path_hex"],
        &Value::String(path_hex),
        "path of {:?}",
        pq
    );
    prop_assert_eq!(&go_read["query"], &query, "query of {:?}", pq);
    // The options as kube-apiserver converts them, from the same reading.
    let options = ExecOptions::from_query(uri.query().unwrap_or(""));
    prop_assert_eq!(
        go_read["container"].as_str().unwrap(),
        options.container.as_deref().unwrap_or(""),
        "container of {:?}",
        pq
    );
    let commands: Vec<String> =
        serde_json::from_value(go_read["command"].clone()).unwrap_or_default();
    prop_assert_eq!(&commands, &options.command, "command of {:?}", pq);
    prop_assert_eq!(go_read["tty"].as_bool().unwrap(), options.tty);
    prop_assert_eq!(go_read["stdin"].as_bool().unwrap(), options.stdin);
    prop_assert_eq!(
        go_read["follow"].as_bool().unwrap(),
        slice_to_bool(ours.first("follow"))
    );
    Ok(())
}

#[test]
fn readings_of_known_targets_match_go() {
    let Some(go) = go_reads() else { return };
    for target in [
        "/api/v1/namespaces/default/pods/web/exec?command=sh&command=-c&command=echo+hi&container=main&stdin=true&stdout=true&tty=true",
        "/api/v1/namespaces/de%66ault/pods/web/%65xec?command=id&container=sidecar&container=main",
        "/api/v1/namespaces/default/pods/web/exec?command=echo+a;rm+x&command=ls",
        "/api/v1/namespaces/default/pods/web/exec?command=%zz&command=ok&tty=&tty=false",
        "/api/v1/namespaces/default/pods/web/%6Cog?follow=yes",
        "/api/v1/namespaces/default/pods/web%2Fexec",
        "/api/%zz",
        "/api/%",
        "/a%2",
        "/%FF?%FE=%FD",
    ] {
        compare(go, target).unwrap();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn readings_of_generated_targets_match_go(target in generated_target()) {
        let Some(go) = go_reads() else { return Ok(()) };
        compare(go, &target)?;
    }
}

/// Pieces of a generated `nodes/{node}/proxy` target: node ids with schemes and ports, the
/// kubelet's calls in and out of case, dot segments, doubled and encoded slashes.
fn kubelet_piece() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "/",
        "//",
        "sim-node",
        "w:10250",
        "https:w:1",
        "ftp:w:1",
        "a:b:c:d",
        ":1",
        "proxy",
        "exec",
        "%65xec",
        "attach",
        "portForward",
        "portforward",
        "run",
        "Exec",
        "ns",
        "pod",
        "uid",
        "c",
        ".",
        "..",
        "%2F",
        "%2E%2E",
        "x",
        "%zz",
    ])
    .prop_map(str::to_owned)
}

fn kubelet_query_piece() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "command=",
        "&command=",
        "input=",
        "&output=",
        "&error=",
        "&tty=",
        "1",
        "0",
        "true",
        "id",
        "+",
        "&",
        ";",
        "%31",
    ])
    .prop_map(str::to_owned)
}

fn generated_kubelet_target() -> impl Strategy<Value = String> {
    let prefix = prop::sample::select(vec![
        "/api/v1/nodes/sim-node/proxy/",
        "/api/v1/nodes/",
        "/api/v1/nodes/w:10250/proxy/exec/",
        "/api/v1/nodes/w/proxy/portForward/",
    ]);
    let path = prop::collection::vec(kubelet_piece(), 0..10);
    let query = prop::collection::vec(kubelet_query_piece(), 0..10);
    (prefix, path, query)
        .prop_map(|(prefix, path, query)| format!("{prefix}{}?{}", path.join("/"), query.concat()))
}

/// Compares the kubelet call Go's node proxy and kubelet make of `sent` with ours.
fn compare_kubelet(go: &GoReads, sent: &str) -> Result<(), TestCaseError> {
    use kube_ws_proxy::proxy::route::kubelet::kubelet_call;
    use kube_ws_proxy::proxy::route::stream_request::StreamTarget;

    let Ok(uri) = sent.parse::<http::Uri>() else {
        return Ok(());
    };
    let pq = uri.path_and_query().map(|pq| pq.as_str()).unwrap_or("/");
    let (Some(go_read), Ok(ours)) = (go.read(pq), RequestTarget::parse(uri.path(), uri.query()))
    else {
        return Ok(());
    };
    if !ours.is_utf8() {
        return Ok(());
    }
    let get = http::Method::GET;
    let call = kubelet_call(&get, &ours);
    let go_call = &go_read["kubelet"];
    prop_assert_eq!(
        call.is_some(),
        !go_call.is_null(),
        "{:?}: Go read {}",
        pq,
        go_call
    );
    let Some(call) = call else { return Ok(()) };
    let target = StreamTarget::read(&get, &ours);
    let call_name = match call.call {
        kube_ws_proxy::request::node::KubeletCall::Exec => "exec",
        kube_ws_proxy::request::node::KubeletCall::Attach => "attach",
        kube_ws_proxy::request::node::KubeletCall::PortForward => "portForward",
        kube_ws_proxy::request::node::KubeletCall::Run => "run",
    };
    let ours_json = serde_json::json!({
        "call": call_name,
        "node": call.node,
        "namespace": call.namespace,
        "pod": call.pod,
        "uid": call.uid.unwrap_or_default(),
        "container": call.container.unwrap_or_default(),
        "command": target.options.command,
        "input": target.options.stdin,
        "output": target.options.stdout,
        "error": target.options.stderr,
        "tty": target.options.tty,
    });
    let mut go_json = go_call.clone();
    if go_json["command"].is_null() {
        go_json["command"] = serde_json::json!([]);
    }
    prop_assert_eq!(&ours_json, &go_json, "{:?}", pq);
    prop_assert_eq!(target.node.as_deref(), go_call["node"].as_str());
    Ok(())
}

#[test]
fn kubelet_readings_match_go() {
    let Some(go) = go_reads() else { return };
    for target in [
        "/api/v1/nodes/sim-node/proxy/exec/default/web/main?command=id&command=-u&output=1&tty=1",
        "/api/v1/nodes/https:w:10250/proxy/attach/ns/p/uid/c?input=1&input=0&error=true",
        "/api/v1/nodes/w/proxy/x/../exec/ns/p/c/?command=ls",
        "/api/v1/nodes/w/proxy//portForward//ns/./p?port=80",
        "/api/v1/nodes/w/proxy/%65xec/ns/p%2Fuid/c",
        "/api/v1/nodes/w/proxy/exec/ns/../../../c",
        "/api/v1/nodes/ftp:w:1/proxy/exec/ns/p/c",
        "/api/v1/nodes/w/proxy/run/ns/p/c?cmd=id",
        "/api/v1/namespaces/n/pods/p/proxy/api/v1/nodes/w/proxy/exec/ns/p/c",
    ] {
        compare_kubelet(go, target).unwrap();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn kubelet_readings_of_generated_targets_match_go(target in generated_kubelet_target()) {
        let Some(go) = go_reads() else { return Ok(()) };
        compare_kubelet(go, &target)?;
    }
}
