//! The host a request names ([`request_host`]) against Go's: what Go's `net/http` server takes
//! as the request's host (`Request.Host`) for the same bytes, an origin-form or absolute-form
//! target with zero, one or two `Host` headers. Wherever the proxy reads a host name (the one
//! a cluster could be routed by), Go read the same host, compared as gateways compare hosts
//! (case, port, one trailing dot); and wherever Go's server refuses the request, the proxy
//! reads no host name. The proxy refuses more than Go does (odd bytes, a target and a `Host`
//! header that disagree, where Go silently takes the target's): that is allowed, never the
//! other way round.

use std::io::{Read, Write};
use std::net::TcpStream;

use kube_ws_proxy::request::host::{request_host, Host};
use proptest::prelude::*;
use serde_json::Value;

use super::{go_reads, GoReads};

/// What Go's server takes as the host of `target` sent with `hosts` (one `Host` header each):
/// `None` when it refuses the request with 400.
fn go_host(go: &GoReads, target: &str, hosts: &[String]) -> Option<String> {
    let mut tcp = TcpStream::connect(go.0.addr).unwrap();
    let mut head = format!("GET {target} HTTP/1.1\r\n");
    for host in hosts {
        head.push_str(&format!("Host: {host}\r\n"));
    }
    head.push_str("Connection: close\r\n\r\n");
    tcp.write_all(head.as_bytes()).unwrap();
    let mut answer = Vec::new();
    tcp.read_to_end(&mut answer).unwrap();
    let answer = String::from_utf8_lossy(&answer);
    let (status, body) = answer.split_once("\r\n\r\n").expect("an HTTP answer");
    match status.split(' ').nth(1) {
        Some("200") => {
            let reading: Value = serde_json::from_str(body).expect("JSON reading");
            Some(reading["host"].as_str().unwrap().to_owned())
        }
        Some("400") => None,
        other => panic!("Go answered {other:?} to {target:?} with {hosts:?}"),
    }
}

/// A host as gateways compare it: lower case, without port and one trailing dot.
fn compared(host: &str) -> String {
    let name = match host.rfind(':') {
        Some(colon) if !host.ends_with(']') => &host[..colon],
        _ => host,
    };
    name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase()
}

/// Compares one request; `Err` says how the readings differ.
fn compare(go: &GoReads, target: &str, hosts: &[String]) -> Result<(), TestCaseError> {
    // What hyper hands the proxy: it refuses some targets and header values itself.
    let Ok(uri) = target.parse::<http::Uri>() else {
        return Ok(());
    };
    if hosts
        .iter()
        .any(|h| http::HeaderValue::from_bytes(h.as_bytes()).is_err())
    {
        return Ok(());
    }
    let authority = uri.authority().map(|a| a.as_str().as_bytes());
    let ours = request_host(authority, hosts.iter().map(|h| h.as_bytes()), true);
    let Ok(Some(Host::Name(name))) = ours else {
        return Ok(());
    };
    let go_read = go_host(go, target, hosts);
    prop_assert_eq!(
        go_read.as_deref().map(compared),
        Some(name.to_string()),
        "{:?} with Host {:?}: Go took {:?}",
        target,
        hosts,
        go_read
    );
    Ok(())
}

#[test]
fn go_takes_the_absolute_targets_host_which_the_proxy_refuses_unless_they_agree() {
    let Some(go) = go_reads() else { return };
    let hosts = |h: &[&str]| h.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    // Go: the target's authority wins over the Host header (RFC 9112 §3.2.2).
    assert_eq!(
        go_host(
            go,
            "http://a.kube.example.com/api",
            &hosts(&["b.kube.example.com"])
        ),
        Some("a.kube.example.com".into())
    );
    // The proxy: a front routing by the header would pick b, so neither is picked.
    let b = [&b"b.kube.example.com"[..]];
    assert!(request_host(Some(b"a.kube.example.com"), b.into_iter(), true).is_err());
    // Go refuses two Host headers, and an HTTP/1.1 request without one (absolute form too);
    // so does the proxy.
    assert_eq!(go_host(go, "/api", &hosts(&["a.k", "a.k"])), None);
    assert_eq!(go_host(go, "/api", &[]), None);
    assert_eq!(go_host(go, "http://a.k/api", &[]), None);
    assert!(request_host(Some(b"a.k"), std::iter::empty(), true).is_err());
    for (target, host) in [
        ("/api", "A.Kube.Example.com.:8443"),
        ("http://a.kube.example.com:1/api", "a.kube.example.com:1"),
        ("http://A.KUBE.example.com./api", "a.kube.example.com"),
        ("/api", "127.0.0.1:6443"),
    ] {
        compare(go, target, &hosts(&[host])).unwrap();
    }
}

/// Pieces of generated hosts: what changes a reading (case, ports, dots, escapes, user info,
/// IP literals, non-ASCII) around names that matter.
fn host_piece() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "a", "A", "b", "kube", ".", "..", "-", ":", ":80", ":x", "%2e", "%41", "_", "@", "[", "]",
        "[::1]", "::1", "\u{e9}", "xn--", "example", "com", " ", "*", "!", "~", "0",
    ])
    .prop_map(str::to_owned)
}

fn generated_host() -> impl Strategy<Value = String> {
    prop::collection::vec(host_piece(), 0..8).prop_map(|p| p.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1500, ..ProptestConfig::default() })]

    #[test]
    fn hosts_the_proxy_reads_are_the_hosts_go_reads(
        absolute in prop::option::of(generated_host()),
        hosts in prop::collection::vec(generated_host(), 0..3),
    ) {
        let Some(go) = go_reads() else { return Ok(()) };
        let target = match &absolute {
            Some(authority) => format!("http://{authority}/api"),
            None => "/api".to_owned(),
        };
        compare(go, &target, &hosts)?;
    }
}
