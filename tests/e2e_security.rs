//! Attacks on the front door that kube-ws-proxy holds against, kept in CI (SECURITY.md lists
//! them): each test is an attacker's move against the real binary over real sockets, and fails
//! on a proxy without the defence.
//!
//! - a client certificate naming two users (several CNs);
//! - connections that never send a byte: plain TCP, TLS (ALPN h2 or http/1.1), an h2c preface,
//!   and enough of them to exhaust the proxy's descriptors; idle keep-alive and HTTP/2 ones;
//! - silent connections to the admin listener, past the descriptor limit; `/readyz` floods;
//! - upgrade requests that declare a body and never send it, to hold `--max-sessions` slots;
//! - an upstream that never answers a relayed upgrade, or answers it with an endless stream;
//! - a bearer subprotocol entry on a header line that is not visible ASCII;
//! - a flood of distinct bogus tokens (each would cost a TokenReview);
//! - a forged `X-Forwarded-For`, `X-Real-Ip` or `Forwarded`;
//! - an HTTP/1.1 `CONNECT` (a tunnel, refused as HTTP/2's is);
//! - WebSocket keys that are not 16 bytes of base64;
//! - log flooding: a flood past the TokenReview rate limit, a 50 KB `Audit-ID`.

use crate::common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::bearer;
use common::clients::require_kubectl;
use common::harness::{run, stderr, stdout};
use common::pki::{kubeconfig, Ca};
use common::proxy_process::{run_to_exit, ProxyProcess};
use common::tls_client;
use common::ws_client::exec_path;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use kube_ws_proxy::sim::{SimCluster, SimConfig, SimTls, SimUser};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const T: Duration = Duration::from_secs(30);
const EXEC: &str = "/api/v1/namespaces/default/pods/web/exec";
const LOG: &str = "/api/v1/namespaces/default/pods/web/log";
const PORTFORWARD: &str = "/api/v1/namespaces/default/pods/web/portforward";
const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

async fn sim(config: SimConfig) -> SimCluster {
    SimCluster::start(config).await.expect("start the cluster")
}

/// Reads an HTTP response head (up to the blank line) within `timeout`: its status code and
/// the head as text. `None` if the connection closed first.
async fn read_head<R: AsyncRead + Unpin>(r: &mut R, timeout: Duration) -> Option<(u16, String)> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    tokio::time::timeout(timeout, async {
        while !head.ends_with(b"\r\n\r\n") {
            match r.read(&mut byte).await {
                Ok(1) => head.push(byte[0]),
                _ => return None,
            }
        }
        let text = String::from_utf8_lossy(&head).into_owned();
        let code = text.split(' ').nth(1)?.parse().ok()?;
        Some((code, text))
    })
    .await
    .expect("no response head in time")
}

/// Sends `request` on a fresh connection to `addr`; the connection stays open.
async fn send(addr: SocketAddr, request: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request).await.unwrap();
    s
}

/// How long until the peer closes `s` (EOF or reset), reading and dropping whatever it sends;
/// `None` if it is still open after `limit`.
async fn closed_after<R: AsyncRead + Unpin>(s: &mut R, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(limit, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return started.elapsed(),
                Ok(_) => {}
            }
        }
    })
    .await
    .ok()
}

fn websocket_get(path: &str, protocols: &[&[u8]], key: &str, extra: &str) -> Vec<u8> {
    let mut r = format!(
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {key}\r\n{extra}"
    )
    .into_bytes();
    for p in protocols {
        r.extend_from_slice(b"Sec-WebSocket-Protocol: ");
        r.extend_from_slice(p);
        r.extend_from_slice(b"\r\n");
    }
    r.extend_from_slice(b"\r\n");
    r
}

fn spdy_post(path: &str, extra: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\
         X-Stream-Protocol-Version: v4.channel.k8s.io\r\n{extra}\r\n"
    )
    .into_bytes()
}

/// The value of one sample of a metric family, by its label text (`reason="x"`).
fn metric(metrics: &str, family: &str, labels: &str) -> f64 {
    let prefix = format!("{family}{{{labels}}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or(0.0)
}

/// Sum of all samples of a family (every label set).
fn metric_sum(metrics: &str, family: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(family) && !l.starts_with('#'))
        .filter(|l| l[family.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

// ---------------------------------------------------------------------------------------------
// Identity
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_naming_two_users_is_refused_where_kubernetes_would_read_the_last() {
    let Some(k) = require_kubectl("1.33") else {
        return;
    };
    const PROXY_TOKEN: &str = "proxy-token-5b1e";
    const PROXY_USER: &str = "system:serviceaccount:kube-ws-proxy:kube-ws-proxy";
    let cluster_ca = Ca::new("cluster");
    let proxy_ca = Ca::new("proxy");
    let serving = cluster_ca.server();
    let cluster = sim(SimConfig {
        tls: Some(SimTls {
            cert_chain_pem: serving.cert_pem,
            private_key_pem: serving.key_pem,
            client_ca_pem: Some(cluster_ca.pem.clone()),
        }),
        users: vec![SimUser {
            token: PROXY_TOKEN.into(),
            name: PROXY_USER.into(),
            groups: vec![],
        }],
        impersonators: vec![PROXY_USER.into()],
        ..SimConfig::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let ca_file = cluster_ca.write(dir.path(), "cluster-ca");
    let (cert, key) = proxy_ca.server().write(dir.path(), "proxy");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, PROXY_TOKEN).unwrap();
    let proxy = ProxyProcess::launch(
        &[
            "--upstream",
            &cluster.url(),
            "--upstream-ca-file",
            ca_file.to_str().unwrap(),
            "--upstream-token-file",
            token_file.to_str().unwrap(),
            "--auth-mode",
            "impersonate",
            "--tls-cert-file",
            cert.to_str().unwrap(),
            "--tls-private-key-file",
            key.to_str().unwrap(),
            "--client-ca-file",
            ca_file.to_str().unwrap(),
        ],
        &[],
    );
    let whoami = |kc: std::path::PathBuf| {
        let k = k.clone();
        let home = dir.path().to_owned();
        async move {
            let mut c = std::process::Command::new(&k);
            c.arg("--kubeconfig")
                .arg(&kc)
                .args([
                    "auth",
                    "whoami",
                    "-o",
                    "jsonpath={.status.userInfo.username}",
                ])
                .env("HOME", &home)
                .env_remove("KUBECONFIG");
            run(c, None, T).await
        }
    };
    let via_proxy = format!("https://127.0.0.1:{}", proxy.addr.port());

    // CN=admin, CN=jdoe: Kubernetes' x509 authenticator (Go's parser) reads the last CN.
    let two_names = cluster_ca.client_with_common_names(&["admin", "jdoe"]);
    let direct = whoami(kubeconfig(
        &dir.path().join("direct"),
        &cluster.url(),
        &cluster_ca.pem,
        None,
        Some(&two_names),
    ))
    .await;
    assert!(direct.status.success(), "{}", stderr(&direct));
    assert_eq!(
        stdout(&direct),
        "jdoe",
        "the simulated cluster reads CNs as kube-apiserver does"
    );

    // Through the proxy: refused, not impersonated as either name.
    let reviews_before = cluster.requests().len();
    let refused = whoami(kubeconfig(
        &dir.path().join("two-names"),
        &via_proxy,
        &proxy_ca.pem,
        None,
        Some(&two_names),
    ))
    .await;
    assert!(!refused.status.success(), "{}", stdout(&refused));
    assert!(
        stderr(&refused).contains("Unauthorized"),
        "{}",
        stderr(&refused)
    );
    assert_eq!(
        cluster.requests().len(),
        reviews_before,
        "nothing reached the cluster on behalf of the ambiguous certificate"
    );
    assert!(proxy
        .wait_for_log("client certificate refused", T)
        .is_some());
    // Connection after connection with it: the warning is aggregated, not one per connection.
    for _ in 0..40 {
        let answer = tls_client::raw_https(
            proxy.addr,
            &proxy_ca.pem,
            Some(&two_names),
            "GET /api HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await
        .unwrap();
        assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    }
    let warnings = lines_with(&proxy, "client certificate refused");
    assert!(
        (1..=2).contains(&warnings.len()),
        "{} warnings: {warnings:?}",
        warnings.len()
    );
    let metrics = proxy.metrics();
    assert!(
        metric(
            &metrics,
            "kube_ws_proxy_auth_rejections_total",
            "cluster=\"default\",reason=\"ambiguous_client_certificate\""
        ) >= 1.0,
        "{metrics}"
    );

    // An ordinary certificate still works.
    let alice = cluster_ca.client("alice", Some("dev"));
    let ok = whoami(kubeconfig(
        &dir.path().join("alice"),
        &via_proxy,
        &proxy_ca.pem,
        None,
        Some(&alice),
    ))
    .await;
    assert!(ok.status.success(), "{}", stderr(&ok));
    assert_eq!(stdout(&ok), "alice");
}

// ---------------------------------------------------------------------------------------------
// Connections that hold descriptors
// ---------------------------------------------------------------------------------------------

/// A plain proxy and a TLS one, each with a 1 s request-header and 2 s idle timeout.
struct Listeners {
    _cluster: SimCluster,
    plain: ProxyProcess,
    tls: ProxyProcess,
    ca: Ca,
    _dir: tempfile::TempDir,
}

const HEADER_TIMEOUT: Duration = Duration::from_secs(1);
const IDLE_TIMEOUT: Duration = Duration::from_secs(2);

async fn listeners() -> Listeners {
    let cluster = sim(SimConfig::default()).await;
    let ca = Ca::new("proxy");
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = ca.server().write(dir.path(), "proxy");
    let timeouts = [
        "--request-header-timeout",
        "1s",
        "--idle-connection-timeout",
        "2s",
    ];
    let plain = ProxyProcess::start(&cluster.url(), &timeouts);
    let mut tls_args = timeouts.to_vec();
    tls_args.extend([
        "--tls-cert-file",
        cert.to_str().unwrap(),
        "--tls-private-key-file",
        key.to_str().unwrap(),
    ]);
    let tls = ProxyProcess::start(&cluster.url(), &tls_args);
    Listeners {
        _cluster: cluster,
        plain,
        tls,
        ca,
        _dir: dir,
    }
}

/// The proxy closed the connection about `expected` after it was made (not at once, not
/// never).
fn closed_in_time(what: &str, after: Option<Duration>, expected: Duration) {
    let after = after.unwrap_or_else(|| panic!("{what}: still open"));
    assert!(
        after >= expected.mul_f64(0.8) && after < expected + Duration::from_secs(8),
        "{what}: closed after {after:?}, expected about {expected:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_never_send_a_request_are_closed_whatever_they_speak() {
    let l = listeners().await;
    let limit = Duration::from_secs(15);

    let mut tcp = TcpStream::connect(l.plain.addr).await.unwrap();
    closed_in_time(
        "plain TCP, silent",
        closed_after(&mut tcp, limit).await,
        HEADER_TIMEOUT,
    );

    let mut h2c = TcpStream::connect(l.plain.addr).await.unwrap();
    // The HTTP/2 preface and an empty SETTINGS frame, then nothing.
    h2c.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    closed_in_time(
        "h2c preface, then silence",
        closed_after(&mut h2c, limit).await,
        HEADER_TIMEOUT,
    );

    let mut partial = TcpStream::connect(l.plain.addr).await.unwrap();
    partial.write_all(b"GET /api HTTP/1.1\r\nHo").await.unwrap();
    closed_in_time(
        "half a request head",
        closed_after(&mut partial, limit).await,
        HEADER_TIMEOUT,
    );

    for alpn in [&b"h2"[..], &b"http/1.1"[..]] {
        let what = format!(
            "TLS with ALPN {}, then silence",
            String::from_utf8_lossy(alpn)
        );
        let started = Instant::now();
        let mut tls = tls_client::connect(l.tls.addr, &l.ca.pem, None, &[alpn])
            .await
            .unwrap();
        assert_eq!(tls.get_ref().1.alpn_protocol(), Some(alpn));
        // The clock started at the accept, before the handshake.
        closed_after(&mut tls, limit)
            .await
            .unwrap_or_else(|| panic!("{what}: still open"));
        closed_in_time(&what, Some(started.elapsed()), HEADER_TIMEOUT);
    }

    // A TLS client that never starts its handshake.
    let mut no_hello = TcpStream::connect(l.tls.addr).await.unwrap();
    closed_in_time(
        "TLS listener, no ClientHello",
        closed_after(&mut no_hello, limit).await,
        HEADER_TIMEOUT,
    );

    let shed = |p: &ProxyProcess| {
        metric(
            &p.metrics(),
            "kube_ws_proxy_client_connections_closed_total",
            "reason=\"request_header_timeout\"",
        )
    };
    assert!(shed(&l.plain) >= 3.0, "{}", l.plain.metrics());
    assert!(shed(&l.tls) >= 3.0, "{}", l.tls.metrics());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_keep_alive_and_http2_connections_are_closed_but_a_quiet_watch_is_not() {
    let l = listeners().await;
    let limit = Duration::from_secs(20);

    // HTTP/1.1 keep-alive: one request, then nothing.
    let mut h1 = send(
        l.plain.addr,
        b"GET /api/v1/namespaces/default/pods HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    .await;
    let (code, _) = read_head(&mut h1, T).await.unwrap();
    assert_eq!(code, 200);
    assert!(
        closed_after(&mut h1, limit).await.is_some(),
        "idle keep-alive connection still open"
    );

    // HTTP/2 over TLS: one request, then an idle connection that gets a GOAWAY.
    let tls = tls_client::connect(l.tls.addr, &l.ca.pem, None, &[b"h2"])
        .await
        .unwrap();
    let (mut sender, conn) = hyper::client::conn::http2::handshake::<_, _, Empty<bytes::Bytes>>(
        TokioExecutor::new(),
        TokioIo::new(tls),
    )
    .await
    .unwrap();
    let conn = tokio::spawn(conn);
    let started = Instant::now();
    let resp = sender
        .send_request(
            http::Request::get("https://127.0.0.1/api/v1/namespaces/default/pods")
                .body(Empty::new())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.into_body().collect().await.unwrap();
    tokio::time::timeout(limit, conn)
        .await
        .expect("idle HTTP/2 connection still open")
        .unwrap()
        .ok();
    closed_in_time("idle HTTP/2", Some(started.elapsed()), IDLE_TIMEOUT);
    let idle = metric(
        &l.tls.metrics(),
        "kube_ws_proxy_client_connections_closed_total",
        "reason=\"idle_timeout\"",
    );
    assert!(idle >= 1.0);

    // A followed log running longer than both clocks is a request in flight: never cut.
    let mut watch = send(
        l.plain.addr,
        format!("GET {LOG}?follow=true HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes(),
    )
    .await;
    let (code, _) = read_head(&mut watch, T).await.unwrap();
    assert_eq!(code, 200);
    assert!(
        closed_after(&mut watch, IDLE_TIMEOUT * 3).await.is_none(),
        "a followed log was cut"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_cannot_starve_the_proxy_of_descriptors() {
    let cluster = sim(SimConfig::default()).await;
    // 256 descriptors, and more silent connections than that.
    let proxy = ProxyProcess::launch_with_fd_limit(
        &[
            "--upstream",
            &cluster.url(),
            "--request-header-timeout",
            "2s",
        ],
        &[],
        Some(256),
    );
    let mut silent = Vec::new();
    for _ in 0..400 {
        silent.push(TcpStream::connect(proxy.addr).await.unwrap());
    }
    // A real caller, queued behind all of them, is served once they are shed.
    let started = Instant::now();
    let mut caller = send(
        proxy.addr,
        b"GET /api/v1/namespaces/default/pods HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    let answer = read_head(&mut caller, Duration::from_secs(60)).await;
    assert_eq!(answer.map(|(c, _)| c), Some(200));
    eprintln!("served after {:?}", started.elapsed());
    // And every silent connection was closed by the proxy.
    for (i, s) in silent.iter_mut().enumerate() {
        assert!(
            closed_after(s, Duration::from_secs(30)).await.is_some(),
            "silent connection {i} still open"
        );
    }
}

/// A connection holding `pad` bytes of a request head that never ends (one endless header),
/// after `first` (a whole request, whose answer's head is read, or nothing). `None` if the
/// proxy closed it on the way.
async fn unfinished_head(addr: SocketAddr, first: Option<&[u8]>, pad: usize) -> Option<TcpStream> {
    let mut s = TcpStream::connect(addr).await.ok()?;
    if let Some(first) = first {
        s.write_all(first).await.ok()?;
        read_head(&mut s, T).await?;
    }
    s.write_all(b"GET /api/v1/namespaces/default/pods HTTP/1.1\r\nHost: x\r\nX-Pad: ")
        .await
        .ok()?;
    s.write_all(&vec![b'a'; pad]).await.ok()?;
    Some(s)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfinished_request_heads_are_bounded_all_together() {
    let Some(k) = require_kubectl("1.33") else {
        return;
    };
    let cluster = sim(SimConfig::default()).await;
    let proxy = ProxyProcess::start(
        &cluster.url(),
        &[
            "--max-pending-connections",
            "64",
            "--request-header-timeout",
            "120s",
            "--idle-connection-timeout",
            "120s",
        ],
    );
    let (rss_before, fds_before) = proxy.footprint();
    // 1,500 connections, each holding 60 KiB of a head that never ends (2,000 such heads held
    // about 128 MiB before the cap); every third first asks a whole unauthenticated request,
    // so that its unfinished head is the second on a keep-alive connection.
    const FLOOD: usize = 1500;
    let first = b"GET /version HTTP/1.1\r\nHost: x\r\n\r\n".as_slice();
    let mut held = Vec::new();
    let mut peak = (0, 0);
    for i in 0..FLOOD {
        held.extend(unfinished_head(proxy.addr, (i % 3 == 0).then_some(first), 60 * 1024).await);
        if i % 100 == 99 {
            let (rss, fds) = proxy.footprint();
            peak = (peak.0.max(rss), peak.1.max(fds));
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (rss, fds) = proxy.footprint();
    peak = (peak.0.max(rss), peak.1.max(fds));
    eprintln!(
        "before: {} KiB, {fds_before} fds; peak: {} KiB, {} fds",
        rss_before / 1024,
        peak.0 / 1024,
        peak.1
    );
    // At most 64 of them are held (plus a few being closed); the memory they hold is bounded.
    assert!(
        peak.1 <= fds_before + 64 + 16,
        "{} descriptors open",
        peak.1
    );
    let grown = peak.0.saturating_sub(rss_before);
    assert!(grown < 32 << 20, "RSS grew by {} KiB", grown / 1024);
    // The oldest were shed, each counted.
    let metrics = proxy.metrics();
    let shed = metric(
        &metrics,
        "kube_ws_proxy_client_connections_closed_total",
        "reason=\"pending_connection_limit\"",
    );
    assert!(shed >= (FLOOD - 64) as f64, "{metrics}");
    // A real kubectl gets in while the flood goes on (a new unfinished head every 5 ms).
    let flood = tokio::spawn({
        let addr = proxy.addr;
        async move {
            let mut more = Vec::new();
            loop {
                more.extend(unfinished_head(addr, None, 60 * 1024).await);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let kc = common::clients::write_kubeconfig(dir.path(), &proxy.url(), None);
    for _ in 0..3 {
        let mut c = std::process::Command::new(&k);
        c.arg("--kubeconfig")
            .arg(&kc)
            .args(["exec", "web", "--", "echo", "admitted"])
            .env("HOME", dir.path())
            .env_remove("KUBECONFIG");
        let o = run(c, None, T).await;
        assert!(o.status.success(), "{}", stderr(&o));
        assert_eq!(stdout(&o), "admitted\n");
    }
    flood.abort();
    let (_, fds) = proxy.footprint();
    assert!(fds <= fds_before + 64 + 16, "{fds} descriptors open");
}

/// Sheds the oldest connection waiting on `proxy` (its `--max-pending-connections` is 2, and
/// that connection the only one waiting): two younger ones with unfinished heads push it out.
/// Returns those two (kept open), once the shedding is counted.
async fn shed(proxy: &ProxyProcess) -> Vec<TcpStream> {
    let before = pending_sheds(proxy);
    let mut younger = Vec::new();
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        younger.push(send(proxy.addr, b"GET /version HTTP/1.1\r\nHost: x\r\n").await);
    }
    let deadline = Instant::now() + T;
    while pending_sheds(proxy) < before + 1.0 {
        assert!(Instant::now() < deadline, "nothing was shed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    younger
}

fn pending_sheds(proxy: &ProxyProcess) -> f64 {
    metric(
        &proxy.metrics(),
        "kube_ws_proxy_client_connections_closed_total",
        "reason=\"pending_connection_limit\"",
    )
}

/// One HTTP/2 frame: its type, flags, stream and payload; `None` at the connection's end.
async fn h2_frame(s: &mut TcpStream) -> Option<(u8, u8, u32, Vec<u8>)> {
    let mut head = [0u8; 9];
    s.read_exact(&mut head).await.ok()?;
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    let mut payload = vec![0u8; len];
    s.read_exact(&mut payload).await.ok()?;
    Some((head[3], head[4], stream, payload))
}

/// An HTTP/2 (h2c) connection that sent its preface and settings and got the proxy's.
async fn h2_client(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    let (kind, ..) = tokio::time::timeout(T, h2_frame(&mut s))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(kind, 4, "the proxy's SETTINGS first");
    s
}

/// Reads `s` as an HTTP/2 client that answers pings (when `answer_pings`) until the
/// connection ends: the GOAWAYs it got (last stream id, error code), and how long it took.
async fn h2_until_closed(s: &mut TcpStream, answer_pings: bool) -> (Vec<(u32, u32)>, Duration) {
    let started = Instant::now();
    let mut goaways = Vec::new();
    let read = async {
        while let Some((kind, flags, _, payload)) = h2_frame(s).await {
            match kind {
                // SETTINGS, acknowledged.
                4 if flags & 1 == 0 => {
                    let _ = s.write_all(&[0, 0, 0, 4, 1, 0, 0, 0, 0]).await;
                }
                // PING, answered.
                6 if flags & 1 == 0 && answer_pings => {
                    let mut ack = vec![0, 0, 8, 6, 1, 0, 0, 0, 0];
                    ack.extend_from_slice(&payload);
                    let _ = s.write_all(&ack).await;
                }
                7 => {
                    let last = u32::from_be_bytes(payload[0..4].try_into().unwrap()) & 0x7fff_ffff;
                    let code = u32::from_be_bytes(payload[4..8].try_into().unwrap());
                    goaways.push((last, code));
                }
                _ => {}
            }
        }
    };
    tokio::time::timeout(T, read)
        .await
        .expect("the shed connection was never closed");
    (goaways, started.elapsed())
}

/// A waiting HTTP/2 connection the proxy sheds is told so with a GOAWAY that names no stream as
/// processed (so a client knows it may retry everything), then closed; before, it was dropped
/// without a word. One that does not answer the GOAWAY's ping is cut after the grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shed_http2_connection_is_told_with_a_goaway() {
    let cluster = sim(SimConfig::default()).await;
    let proxy = ProxyProcess::start(&cluster.url(), &["--max-pending-connections", "2"]);
    for answer_pings in [true, false] {
        let mut victim = h2_client(proxy.addr).await;
        let _younger = shed(&proxy).await;
        let (goaways, took) = h2_until_closed(&mut victim, answer_pings).await;
        assert!(!goaways.is_empty(), "closed without a GOAWAY");
        let (last, code) = *goaways.last().unwrap();
        assert_eq!(code, 0, "NO_ERROR");
        if answer_pings {
            assert_eq!(last, 0, "no stream was processed: {goaways:?}");
        }
        // The grace is bounded (1 s), a client that never finishes its part included.
        assert!(took < Duration::from_secs(3), "closed after {took:?}");
        drop(_younger);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A shed HTTP/1.1 connection whose request head completes within the grace gets its answer,
/// with `Connection: close`, and is then closed; one that keeps trickling its head is cut
/// once the grace is over. Before, both were dropped without an answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shed_http1_connection_is_answered_with_connection_close_within_the_grace() {
    let cluster = sim(SimConfig::default()).await;
    let proxy = ProxyProcess::start(&cluster.url(), &["--max-pending-connections", "2"]);
    let mut victim = send(proxy.addr, b"GET /version HTTP/1.1\r\nHost: x\r\n").await;
    let younger = shed(&proxy).await;
    victim.write_all(b"\r\n").await.unwrap();
    let (code, head) = read_head(&mut victim, T)
        .await
        .expect("the shed connection was dropped without its answer");
    assert_eq!(code, 200, "{head}");
    assert!(
        head.to_ascii_lowercase().contains("connection: close"),
        "{head}"
    );
    assert!(closed_after(&mut victim, T).await.is_some());
    drop(younger);

    // A trickling head is no way to stay: cut when the grace is over.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut trickler = send(proxy.addr, b"GET /version HTTP/1.1\r\nHost: x\r\n").await;
    let _younger = shed(&proxy).await;
    let shed_at = Instant::now();
    let trickle = async {
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if trickler.write_all(b"X-A: b\r\n").await.is_err() {
                return;
            }
        }
    };
    let _ = tokio::time::timeout(T, trickle).await;
    let took = shed_at.elapsed();
    assert!(
        took < Duration::from_secs(3),
        "the trickler stayed {took:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// The admin listener
// ---------------------------------------------------------------------------------------------

/// One `GET path` on `s` (keep-alive): the status code, or `None` if the connection closed
/// before a whole answer.
async fn admin_get(s: &mut TcpStream, path: &str) -> Option<u16> {
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let (code, head) = read_head(s, T).await?;
    read_body(s, &head).await?;
    Some(code)
}

/// The `Content-Length` body that follows `head` on `s`; `None` if it does not arrive whole
/// within `T`.
async fn read_body(s: &mut TcpStream, head: &str) -> Option<Vec<u8>> {
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    tokio::time::timeout(T, s.read_exact(&mut body))
        .await
        .ok()?
        .ok()?;
    Some(body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_admin_connections_are_shed_and_cannot_starve_the_main_listener() {
    let cluster = sim(SimConfig::default()).await;
    // 256 descriptors, 8 admin connections at most, and more silent admin connections than
    // the proxy has descriptors.
    let proxy = ProxyProcess::launch_with_fd_limit(
        &[
            "--upstream",
            &cluster.url(),
            "--request-header-timeout",
            "2s",
            "--idle-connection-timeout",
            "2s",
            "--admin-max-connections",
            "8",
        ],
        &[],
        Some(256),
    );
    let mut silent = Vec::new();
    for _ in 0..400 {
        silent.push(TcpStream::connect(proxy.admin_addr).await.unwrap());
    }
    // Beyond the cap a new connection takes the place of the one idle longest: a probe gets
    // in at once, however many silent connections came before it.
    let mut beyond = TcpStream::connect(proxy.admin_addr).await.unwrap();
    assert_eq!(admin_get(&mut beyond, "/healthz").await, Some(200));
    // The main listener answers at once, not only once the admin connections are shed.
    let started = Instant::now();
    let mut caller = send(
        proxy.addr,
        b"GET /api/v1/namespaces/default/pods HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    let answer = read_head(&mut caller, Duration::from_secs(60)).await;
    assert_eq!(answer.map(|(c, _)| c), Some(200));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the main listener answered after {:?}",
        started.elapsed()
    );
    // Every silent connection is closed: shed for a newer one, or by the clock.
    for (i, s) in silent.iter_mut().enumerate() {
        assert!(
            closed_after(s, Duration::from_secs(15)).await.is_some(),
            "silent admin connection {i} still open"
        );
    }
    // Then probes get in again; an idle keep-alive one is closed after the idle timeout.
    let mut probe = TcpStream::connect(proxy.admin_addr).await.unwrap();
    assert_eq!(admin_get(&mut probe, "/healthz").await, Some(200));
    closed_in_time(
        "idle admin keep-alive",
        closed_after(&mut probe, Duration::from_secs(15)).await,
        Duration::from_secs(2),
    );
    let metrics = proxy.metrics();
    assert!(
        metric(
            &metrics,
            "kube_ws_proxy_client_connections_closed_total",
            "reason=\"admin_idle_shed\""
        ) >= 390.0,
        "{metrics}"
    );
}

/// One probe as the kubelet makes it: a new connection, `Connection: close`, one second to
/// answer (`timeoutSeconds` defaults to 1). The status code, or `None` if it failed.
async fn kubelet_probe(admin: SocketAddr, path: &str) -> Option<u16> {
    let probe = async {
        let mut s = TcpStream::connect(admin).await.ok()?;
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: {admin}\r\nUser-Agent: kube-probe/1.33\r\n\
             Accept: */*\r\nConnection: close\r\n\r\n"
        );
        s.write_all(request.as_bytes()).await.ok()?;
        let mut answer = Vec::new();
        s.read_to_end(&mut answer).await.ok()?;
        let text = String::from_utf8_lossy(&answer);
        text.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
    };
    tokio::time::timeout(Duration::from_secs(1), probe)
        .await
        .ok()
        .flatten()
}

/// A keep-alive client that asks `/healthz` every `period` (below the idle timeout, so no
/// clock ever closes it); when the proxy closes its connection it opens another at its next
/// request, as any pooled client does. Counts its answers.
async fn keep_alive_holder(admin: SocketAddr, period: Duration, answered: Arc<AtomicUsize>) {
    let mut conn: Option<TcpStream> = None;
    loop {
        if conn.is_none() {
            conn = TcpStream::connect(admin).await.ok();
        }
        if let Some(s) = conn.as_mut() {
            match admin_get(s, "/healthz").await {
                Some(_) => {
                    answered.fetch_add(1, Ordering::SeqCst);
                }
                None => conn = None,
            }
        }
        tokio::time::sleep(period).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_connections_that_fill_the_admin_listener_cannot_lock_out_probes() {
    // The finding: as many keep-alive connections as the default cap (64), each asking
    // something every second, below the 4 s idle timeout, so no clock ever closes them; then
    // kubelet probes, a new connection each.
    const HOLDERS: usize = 64;
    let cluster = sim(SimConfig::default()).await;
    let proxy = ProxyProcess::start(
        &cluster.url(),
        &[
            "--request-header-timeout",
            "4s",
            "--idle-connection-timeout",
            "4s",
        ],
    );
    let admin = proxy.admin_addr;
    let period = Duration::from_secs(1);
    let answered = Arc::new(AtomicUsize::new(0));
    let holders: Vec<_> = (0..HOLDERS)
        .map(|_| tokio::spawn(keep_alive_holder(admin, period, answered.clone())))
        .collect();
    // Every holder is in and has been answered once.
    let deadline = Instant::now() + Duration::from_secs(10);
    while answered.load(Ordering::SeqCst) < HOLDERS {
        assert!(Instant::now() < deadline, "the holders did not get in");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Kubelet-style probes, one every 150 ms for about six idle periods' worth of holder
    // requests: every one is answered.
    let mut codes = Vec::new();
    for _ in 0..40 {
        codes.push(kubelet_probe(admin, "/healthz").await);
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let failed = codes.iter().filter(|c| **c != Some(200)).count();
    assert_eq!(
        failed,
        0,
        "{failed} of {} probes failed: {codes:?}",
        codes.len()
    );
    // The holders were served on meanwhile (each probe took the place of one idle holder,
    // which came back at its next request).
    let before = answered.load(Ordering::SeqCst);
    // A period and a half on a quiet machine; a loaded one may take longer to serve them.
    let deadline = Instant::now() + Duration::from_secs(10);
    while answered.load(Ordering::SeqCst) < before + HOLDERS {
        assert!(
            Instant::now() < deadline,
            "the keep-alive clients were not served any more"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for h in holders {
        h.abort();
    }
    let metrics = proxy.metrics();
    let shed = metric(
        &metrics,
        "kube_ws_proxy_client_connections_closed_total",
        "reason=\"admin_idle_shed\"",
    );
    assert!(shed >= 1.0, "{metrics}");
    assert_eq!(
        metric(
            &metrics,
            "kube_ws_proxy_client_connections_closed_total",
            "reason=\"admin_connection_limit\""
        ),
        0.0,
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_probes_share_one_upstream_check_a_second() {
    // An upstream that counts the connections it accepts.
    let upstream = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream_addr = upstream.local_addr().unwrap();
    let accepts = Arc::new(AtomicUsize::new(0));
    let acceptor = tokio::spawn({
        let accepts = accepts.clone();
        async move {
            while upstream.accept().await.is_ok() {
                accepts.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    let proxy = ProxyProcess::start(&format!("http://{upstream_addr}"), &[]);
    let admin = proxy.admin_addr;

    // 1,000 probes, 40 keep-alive connections at a time, then 200 one after another.
    let started = Instant::now();
    let before = accepts.load(Ordering::SeqCst);
    let probes = (0..40).map(|_| async move {
        let mut s = TcpStream::connect(admin).await.unwrap();
        let mut codes = Vec::new();
        for _ in 0..25 {
            codes.push(admin_get(&mut s, "/readyz").await);
        }
        codes
    });
    let codes: Vec<_> = futures_util::future::join_all(probes)
        .await
        .into_iter()
        .flatten()
        .collect();
    assert!(codes.iter().all(|c| *c == Some(200)), "{codes:?}");
    let mut s = TcpStream::connect(admin).await.unwrap();
    for _ in 0..200 {
        assert_eq!(admin_get(&mut s, "/readyz").await, Some(200));
    }
    let dials = accepts.load(Ordering::SeqCst) - before;
    let elapsed = started.elapsed();
    eprintln!("1,200 probes in {elapsed:?}: {dials} upstream connections");
    // One check a second at most (plus one that may straddle the start).
    assert!(
        dials as u64 <= elapsed.as_secs() + 2,
        "{dials} upstream connections for 1,200 probes in {elapsed:?}"
    );

    // The upstream goes away: seen once the cached verdict is older than a second.
    acceptor.abort();
    let _ = acceptor.await;
    let gone = Instant::now();
    let mut s = TcpStream::connect(admin).await.unwrap();
    loop {
        match admin_get(&mut s, "/readyz").await {
            Some(200) => {}
            Some(503) => break,
            other => panic!("/readyz: {other:?}"),
        }
        assert!(
            gone.elapsed() < Duration::from_secs(5),
            "/readyz still ready {:?} after the upstream went away",
            gone.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!("unready after {:?}", gone.elapsed());
    assert!(gone.elapsed() < Duration::from_millis(2500));
}

/// An `https://` upstream whose TLS handshake always fails (it answers a ClientHello with a
/// plain HTTP error), and its address.
async fn upstream_that_fails_tls() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut hello = [0u8; 512];
                let _ = s.read(&mut hello).await;
                let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
            });
        }
    });
    (addr, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_says_which_step_failed_and_only_the_log_says_why() {
    let (upstream, _task) = upstream_that_fails_tls().await;
    let proxy = ProxyProcess::start(&format!("https://{upstream}"), &[]);
    let mut s = TcpStream::connect(proxy.admin_addr).await.unwrap();
    s.write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    let body = answer.split("\r\n\r\n").nth(1).unwrap();
    assert_eq!(
        body, "the TLS handshake with the upstream API server failed",
        "{answer}"
    );
    // The log has the cause: where the upstream is and what TLS said.
    let line = proxy
        .wait_for_log("upstream API server failure", Duration::from_secs(5))
        .expect("no log line for the failed readiness check");
    assert!(
        line.contains(&upstream.to_string()) && line.contains("TLS handshake"),
        "{line}"
    );
}

/// The whole answer (head and a `Content-Length` body) to `request` on a new connection.
async fn answer_to(addr: SocketAddr, request: &[u8]) -> String {
    let mut s = send(addr, request).await;
    let Some((_, head)) = read_head(&mut s, T).await else {
        return String::new();
    };
    let body = read_body(&mut s, &head).await.unwrap_or_default();
    head + &String::from_utf8_lossy(&body)
}

/// What a client hears of a v5 exec over WebSocket: the answer's status, and the Status on
/// channel 3 when the WebSocket was accepted.
async fn v5_exec_answer(addr: SocketAddr) -> String {
    let path = exec_path("web", &["true"], false, true, true);
    match common::ws_client::connect(addr, &path, "v5.channel.k8s.io").await {
        Ok((mut ws, _)) => {
            let t = common::ws_client::read_to_close(&mut ws).await;
            String::from_utf8_lossy(&t.status).into_owned()
        }
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            let body = resp.body().clone().unwrap_or_default();
            format!("{} {}", resp.status(), String::from_utf8_lossy(&body))
        }
        Err(e) => panic!("v5 exec: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_upstream_is_named_to_callers_by_kind_and_to_the_log_in_full() {
    // Passthrough: every caller is unauthenticated from the proxy's view, and the upstream has
    // authorized nothing when its dial fails. No answer may carry where the upstream is or
    // what its TLS said; the log must.
    let (upstream, _task) = upstream_that_fails_tls().await;
    let port = upstream.port().to_string();
    let reason = "the TLS handshake with the upstream API server failed";
    let exec = format!("{EXEC}?command=true&stdout=true");
    let portforward = format!("{PORTFORWARD}?ports=80");
    for mode in ["spdy", "auto", "websocket"] {
        let proxy = ProxyProcess::start(
            &format!("https://{upstream}"),
            &["--upstream-streaming", mode],
        );
        let answers = [
            (
                "plain request",
                answer_to(
                    proxy.addr,
                    b"GET /api/v1/namespaces/default/pods HTTP/1.1\r\nHost: x\r\n\r\n",
                )
                .await,
            ),
            (
                "SPDY exec (kubectl 1.30)",
                answer_to(proxy.addr, &spdy_post(&exec, "")).await,
            ),
            (
                "v4 WebSocket exec",
                answer_to(
                    proxy.addr,
                    &websocket_get(&exec, &[b"v4.channel.k8s.io"], KEY, ""),
                )
                .await,
            ),
            (
                "port-forward tunnel (kubectl 1.33)",
                answer_to(
                    proxy.addr,
                    &websocket_get(&portforward, &[b"SPDY/3.1+portforward.k8s.io"], KEY, ""),
                )
                .await,
            ),
            ("v5 exec (kubectl 1.33)", v5_exec_answer(proxy.addr).await),
        ];
        for (what, answer) in &answers {
            assert!(answer.contains(reason), "{mode}, {what}: {answer}");
            for secret in [port.as_str(), "127.0.0.1", "corrupt", "InvalidContentType"] {
                assert!(
                    !answer.contains(secret),
                    "{mode}, {what}: {secret:?} in {answer}"
                );
            }
        }
        let line = proxy
            .wait_for_log("upstream API server failure", Duration::from_secs(5))
            .expect("no log line with the cause");
        assert!(line.contains(&upstream.to_string()), "{line}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_review_that_cannot_be_made_is_logged_with_its_cause() {
    // Impersonate mode in front of an upstream whose TLS fails: the caller's token cannot be
    // reviewed. The caller hears which step failed; the log says why, and never the token.
    let (upstream, _task) = upstream_that_fails_tls().await;
    let dir = tempfile::tempdir().unwrap();
    let own = dir.path().join("proxy-token");
    std::fs::write(&own, "the-proxys-own-token").unwrap();
    let proxy = ProxyProcess::start(
        &format!("https://{upstream}"),
        &[
            "--auth-mode",
            "impersonate",
            "--upstream-token-file",
            own.to_str().unwrap(),
        ],
    );
    let token = "callers-token-8d1e";
    let answer = answer_to(
        proxy.addr,
        format!("GET /api HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n").as_bytes(),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(
        answer.contains(
            "cannot authenticate the request: the TokenReview failed: \
             the TLS handshake with the upstream API server failed"
        ),
        "{answer}"
    );
    assert!(!answer.contains(&upstream.to_string()), "{answer}");
    let line = proxy
        .wait_for_log("cannot authenticate the caller", Duration::from_secs(5))
        .expect("the failed review is logged");
    assert!(
        line.contains(&upstream.to_string()) && line.contains("TLS handshake"),
        "the cause is not logged: {line}"
    );
    for l in proxy.log_lines() {
        assert!(
            !l.contains(token) && !l.contains("the-proxys-own-token"),
            "{l}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Warnings at start, and the demo
// ---------------------------------------------------------------------------------------------

/// An address no interface here has (TEST-NET-1): the proxy says what it says about its
/// settings, then cannot bind it and exits, so nothing ever listens beyond loopback.
const NOT_HERE: &str = "192.0.2.1:0";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_in_the_clear_are_warned_about_at_start() {
    let cleartext = "bearer tokens cross the network in the clear";
    let dir = tempfile::tempdir().unwrap();
    let own = dir.path().join("token");
    std::fs::write(&own, "own").unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(Vec::<String>::new())
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let (cert_file, key_file) = (dir.path().join("fp.crt"), dir.path().join("fp.key"));
    std::fs::write(&cert_file, cert.pem()).unwrap();
    std::fs::write(&key_file, key.serialize_pem()).unwrap();
    let impersonate = [
        "--auth-mode",
        "impersonate",
        "--upstream-token-file",
        own.to_str().unwrap(),
    ];
    let front_proxy = [
        "--auth-mode",
        "front-proxy",
        "--front-proxy-client-cert-file",
        cert_file.to_str().unwrap(),
        "--front-proxy-client-key-file",
        key_file.to_str().unwrap(),
    ];
    // A plain main listener beyond loopback, in each mode.
    for mode in [
        &impersonate[..],
        &front_proxy[..],
        &["--auth-mode", "passthrough"][..],
    ] {
        let mut args = vec!["--listen", NOT_HERE, "--admin-listen", "127.0.0.1:0"];
        args.extend(["--upstream", "https://127.0.0.1:9"]);
        args.extend(mode);
        let (code, stderr) = run_to_exit(&args);
        assert_ne!(code, Some(0), "{stderr}");
        assert!(stderr.contains(cleartext), "{mode:?}: {stderr}");
    }
    // Passthrough to an http:// upstream; a plain loopback listener says nothing of itself.
    let cluster = sim(SimConfig::default()).await;
    let proxy = ProxyProcess::start(&cluster.url(), &[]);
    assert!(proxy
        .wait_for_log(
            "the upstream is plain HTTP: callers' bearer tokens travel to it in the clear",
            Duration::from_secs(5)
        )
        .is_some());
    assert!(proxy.log_lines().iter().all(|l| !l.contains(cleartext)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_beyond_loopback_needs_an_explicit_flag_and_then_warns() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("demo.kubeconfig");
    let kubeconfig = kubeconfig.to_str().unwrap();
    let (code, stderr) =
        run_to_exit(&["demo", "--listen", "0.0.0.0:0", "--kubeconfig", kubeconfig]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("--allow-remote-demo"), "{stderr}");
    assert!(
        !std::path::Path::new(kubeconfig).exists(),
        "the demo started"
    );
    let (code, stderr) = run_to_exit(&[
        "demo",
        "--listen",
        NOT_HERE,
        "--allow-remote-demo",
        "--kubeconfig",
        kubeconfig,
    ]);
    assert_ne!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("anyone who reaches it can run commands on this host"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_log_is_never_written_through_a_link_nor_left_open_to_others() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let dir = tempfile::tempdir().unwrap();
    // A link at the path (to a file the proxy's user may write: its own config, say).
    let target = dir.path().join("elsewhere");
    std::fs::write(&target, "not an audit log\n").unwrap();
    let link = dir.path().join("linked.log");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let (code, stderr) = run_to_exit(&[
        "--upstream",
        "http://127.0.0.1:9",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--audit-log",
        link.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("symbolic link"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(&target).unwrap(),
        "not an audit log\n"
    );
    // A new file is the proxy's user's alone; an existing one open to others is narrowed.
    let new = dir.path().join("new.log");
    let existing = dir.path().join("existing.log");
    std::fs::write(&existing, "").unwrap();
    std::fs::set_permissions(&existing, std::fs::Permissions::from_mode(0o644)).unwrap();
    for path in [&new, &existing] {
        let proxy = ProxyProcess::start(
            "http://127.0.0.1:9",
            &["--audit-log", path.to_str().unwrap()],
        );
        assert_eq!(mode(path), 0o600, "{}", path.display());
        drop(proxy);
    }
}

// ---------------------------------------------------------------------------------------------
// Session slots
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrade_requests_that_never_send_their_body_hold_no_session_slot() {
    let Some(k) = require_kubectl("1.28") else {
        return;
    };
    let cluster = sim(SimConfig::default()).await;
    let proxy = ProxyProcess::start(
        &cluster.url(),
        &["--max-sessions", "3", "--handshake-timeout", "3s"],
    );
    // Three SPDY upgrades that promise a body and never send it, and a WebSocket one.
    let mut holders = Vec::new();
    for _ in 0..2 {
        holders.push(send(proxy.addr, &spdy_post(EXEC, "Content-Length: 100\r\n")).await);
    }
    holders.push(
        send(
            proxy.addr,
            &websocket_get(LOG, &[b"binary.k8s.io"], KEY, "Content-Length: 100\r\n"),
        )
        .await,
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Every slot is still free: kubectl 1.28 (SPDY, relayed) runs.
    let dir = tempfile::tempdir().unwrap();
    let kc = common::clients::write_kubeconfig(dir.path(), &proxy.url(), None);
    let mut c = std::process::Command::new(&k);
    c.arg("--kubeconfig")
        .arg(&kc)
        .args(["exec", "web", "--", "echo", "admitted"])
        .env("HOME", dir.path())
        .env_remove("KUBECONFIG");
    let o = run(c, None, T).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "admitted\n");
    // The holders are answered 408 when their time is up.
    for h in &mut holders {
        let (code, head) = read_head(h, Duration::from_secs(20)).await.unwrap();
        assert_eq!(code, 408, "{head}");
    }
    let metrics = proxy.metrics();
    assert_eq!(
        metric(
            &metrics,
            "kube_ws_proxy_handshake_rejections_total",
            "cluster=\"default\",reason=\"too_many_sessions\""
        ),
        0.0,
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn upgrade_bodies_held_before_a_session_starts_share_one_bounded_budget() {
    let Some(k) = require_kubectl("1.28") else {
        return;
    };
    let cluster = sim(SimConfig::default()).await;
    // Room for two bodies of 900 KiB, not three.
    let proxy = ProxyProcess::start(
        &cluster.url(),
        &[
            "--upgrade-body-budget",
            "2097152",
            "--handshake-timeout",
            "10s",
        ],
    );
    let part = vec![b'x'; 900 * 1024];
    let mut holders = Vec::new();
    for _ in 0..2 {
        let mut h = send(proxy.addr, &spdy_post(EXEC, "Content-Length: 1048576\r\n")).await;
        h.write_all(&part).await.unwrap();
        holders.push(h);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let mut third = send(proxy.addr, &spdy_post(EXEC, "Content-Length: 1048576\r\n")).await;
    let _ = third.write_all(&part).await;
    let (code, head) = read_head(&mut third, T).await.unwrap();
    assert_eq!(code, 503, "{head}");
    assert!(
        head.to_ascii_lowercase().contains("retry-after: 1"),
        "{head}"
    );
    // Counted as a busy proxy, not as a bad request.
    let metrics = proxy.metrics();
    let rejections = "kube_ws_proxy_handshake_rejections_total";
    assert_eq!(
        metric(&metrics, rejections, "cluster=\"default\",reason=\"busy\""),
        1.0,
        "{metrics}"
    );
    assert_eq!(
        metric(
            &metrics,
            rejections,
            "cluster=\"default\",reason=\"bad_request\""
        ),
        0.0,
        "{metrics}"
    );
    // A client without a body still gets in while the two holders wait.
    let dir = tempfile::tempdir().unwrap();
    let kc = common::clients::write_kubeconfig(dir.path(), &proxy.url(), None);
    let mut c = std::process::Command::new(&k);
    c.arg("--kubeconfig")
        .arg(&kc)
        .args(["exec", "web", "--", "echo", "admitted"])
        .env("HOME", dir.path())
        .env_remove("KUBECONFIG");
    let o = run(c, None, T).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "admitted\n");
    // The holders' bytes go back to the budget when they time out: three more fit after.
    for h in &mut holders {
        let (code, head) = read_head(h, Duration::from_secs(20)).await.unwrap();
        assert_eq!(code, 408, "{head}");
    }
    drop(holders);
    let mut again = send(proxy.addr, &spdy_post(EXEC, "Content-Length: 1048576\r\n")).await;
    again.write_all(&part).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut more = send(proxy.addr, &spdy_post(EXEC, "Content-Length: 1048576\r\n")).await;
    more.write_all(&part).await.unwrap();
    // Both are still reading their bodies: no answer yet.
    let answer = tokio::time::timeout(Duration::from_millis(500), read_head(&mut more, T)).await;
    assert!(answer.is_err(), "{answer:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn where_the_proxy_authenticates_a_caller_without_credentials_is_refused_before_its_body() {
    const PROXY_TOKEN: &str = "proxy-token-body-1";
    const PROXY_USER: &str = "system:serviceaccount:kube-ws-proxy:kube-ws-proxy";
    let cluster = sim(SimConfig {
        users: vec![SimUser {
            token: PROXY_TOKEN.into(),
            name: PROXY_USER.into(),
            groups: vec![],
        }],
        impersonators: vec![PROXY_USER.into()],
        ..SimConfig::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, PROXY_TOKEN).unwrap();
    let proxy = ProxyProcess::start(
        &cluster.url(),
        &[
            "--auth-mode",
            "impersonate",
            "--upstream-token-file",
            token_file.to_str().unwrap(),
            "--handshake-timeout",
            "20s",
        ],
    );
    // A body is promised and never sent: the 401 comes at once, not the 408 after 20 s.
    let started = std::time::Instant::now();
    let mut s = send(proxy.addr, &spdy_post(EXEC, "Content-Length: 1048576\r\n")).await;
    let (code, head) = read_head(&mut s, T).await.unwrap();
    assert_eq!(code, 401, "{head}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

// ---------------------------------------------------------------------------------------------
// Upstreams that do not answer
// ---------------------------------------------------------------------------------------------

/// An upstream that accepts connections and reads them, but never answers.
async fn silent_upstream() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {}
            });
        }
    });
    addr
}

/// An upstream that answers every request with an endless chunked body, a line every 100 ms
/// (an old API server answering a WebSocket log request with a plain followed log).
async fn streaming_upstream() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if !matches!(s.read(&mut byte).await, Ok(1)) {
                        return;
                    }
                    head.push(byte[0]);
                }
                let _ = s
                    .write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\
                          Transfer-Encoding: chunked\r\n\r\n",
                    )
                    .await;
                for i in 0.. {
                    let line = format!("line {i}\n");
                    let chunk = format!("{:x}\r\n{line}\r\n", line.len());
                    if s.write_all(chunk.as_bytes()).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_wait_on_a_silent_upstream_is_bounded() {
    let upstream = silent_upstream().await;
    let proxy = ProxyProcess::start(
        &format!("http://{upstream}"),
        &["--handshake-timeout", "1s"],
    );
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        ("SPDY relay", spdy_post(EXEC, ""), 504),
        (
            "legacy WebSocket relay",
            websocket_get(
                &exec_path("web", &["true"], false, true, false),
                &[b"v4.channel.k8s.io"],
                KEY,
                "",
            ),
            504,
        ),
        // Under the default --upstream-streaming=auto the tunnel first asks with its WebSocket,
        // as a relay does, and a silent upstream is a gateway timeout there.
        (
            "port-forward tunnel",
            websocket_get(PORTFORWARD, &[b"SPDY/3.1+portforward.k8s.io"], KEY, ""),
            504,
        ),
    ];
    for (what, request, want) in cases {
        let started = Instant::now();
        let mut s = send(proxy.addr, &request).await;
        let (code, head) = read_head(&mut s, Duration::from_secs(15))
            .await
            .unwrap_or_else(|| panic!("{what}: closed without an answer"));
        assert_eq!(code, want, "{what}: {head}");
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(900) && took < Duration::from_secs(10),
            "{what}: answered after {took:?}"
        );
    }
    // Translated exec answers inside the WebSocket (a Status on channel 3), also in time.
    let started = Instant::now();
    let (mut ws, _) = common::ws_client::connect(
        proxy.addr,
        &exec_path("web", &["true"], false, true, false),
        "v5.channel.k8s.io",
    )
    .await
    .unwrap();
    let transcript = common::ws_client::read_to_close(&mut ws).await;
    let status = String::from_utf8_lossy(&transcript.status).into_owned();
    assert!(status.contains("Failure"), "{status}");
    assert!(started.elapsed() < Duration::from_secs(10));
    drop(ws);
    assert!(
        no_session_within(&proxy, Duration::from_secs(15)).await,
        "{}",
        proxy.metrics()
    );
}

/// Whether the proxy's running-session gauge drops to 0 within `limit`.
async fn no_session_within(proxy: &ProxyProcess, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if metric_sum(&proxy.metrics(), "kube_ws_proxy_sessions_active") == 0.0 {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_answer_to_a_relayed_upgrade_streams_through_and_frees_its_slot() {
    let upstream = streaming_upstream().await;
    let proxy = ProxyProcess::start(
        &format!("http://{upstream}"),
        &["--max-sessions", "1", "--handshake-timeout", "5s"],
    );
    let request = websocket_get(&format!("{LOG}?follow=true"), &[b"binary.k8s.io"], KEY, "");
    let mut first = send(proxy.addr, &request).await;
    let (code, head) = read_head(&mut first, Duration::from_secs(3)).await.unwrap();
    assert_eq!(code, 200, "{head}");
    let mut seen = Vec::new();
    let mut buf = [0u8; 256];
    tokio::time::timeout(Duration::from_secs(3), async {
        while !String::from_utf8_lossy(&seen).contains("line 2\n") {
            let n = first.read(&mut buf).await.unwrap();
            assert!(n > 0, "the stream ended");
            seen.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .expect("the answer streams as it comes");
    // While it goes on, the one session slot is free: a second request is served too.
    let mut second = send(proxy.addr, &request).await;
    let (code, head) = read_head(&mut second, Duration::from_secs(3))
        .await
        .unwrap();
    assert_eq!(code, 200, "{head}");
    let metrics = proxy.metrics();
    assert_eq!(
        metric_sum(&metrics, "kube_ws_proxy_sessions_active"),
        0.0,
        "{metrics}"
    );
}

// ---------------------------------------------------------------------------------------------
// Request smuggling through headers
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subprotocol_line_that_is_not_visible_ascii_is_refused_before_anything_is_forwarded() {
    let cluster = sim(SimConfig::default()).await;
    let proxy = ProxyProcess::start(&cluster.url(), &[]);
    let mut bad_line = bearer::entry("stolen-token").into_bytes();
    bad_line.extend_from_slice(b", v4.channel.k8s.io\xe9");
    let v5_exec = exec_path("web", &["true"], false, true, false);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "translated exec",
            websocket_get(&v5_exec, &[b"v5.channel.k8s.io", &bad_line], KEY, ""),
        ),
        (
            "tunnel",
            websocket_get(
                PORTFORWARD,
                &[b"SPDY/3.1+portforward.k8s.io", &bad_line],
                KEY,
                "",
            ),
        ),
        (
            "WebSocket relay",
            websocket_get(LOG, &[b"binary.k8s.io", &bad_line], KEY, ""),
        ),
        ("SPDY relay", {
            let mut r = spdy_post(EXEC, "");
            r.truncate(r.len() - 2);
            r.extend_from_slice(b"Sec-WebSocket-Protocol: ");
            r.extend_from_slice(&bad_line);
            r.extend_from_slice(b"\r\n\r\n");
            r
        }),
    ];
    for (what, request) in cases {
        let mut s = send(proxy.addr, &request).await;
        let (code, head) = read_head(&mut s, T).await.unwrap();
        assert_eq!(code, 400, "{what}: {head}");
        assert!(!head.contains("stolen"), "{what}: {head}");
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        cluster.requests().is_empty(),
        "forwarded: {:?}",
        cluster.requests()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_key_must_be_16_bytes_of_base64() {
    let cluster = sim(SimConfig::default()).await;
    let proxy = ProxyProcess::start(&cluster.url(), &[]);
    let v5_exec = exec_path("web", &["true"], false, true, false);
    for key in [
        "!!!!!!!!!!!!!!!!!!!!!!==",
        "AAAAAAAAAAAAAAAAAAAAAAAA",
        "short",
    ] {
        for (what, path, protocol) in [
            (
                "translated exec",
                v5_exec.as_str(),
                &b"v5.channel.k8s.io"[..],
            ),
            ("tunnel", PORTFORWARD, &b"SPDY/3.1+portforward.k8s.io"[..]),
            ("relayed log", LOG, &b"binary.k8s.io"[..]),
        ] {
            let mut s = send(proxy.addr, &websocket_get(path, &[protocol], key, "")).await;
            let (code, head) = read_head(&mut s, T).await.unwrap();
            assert_eq!(code, 400, "{what} with key {key}: {head}");
        }
    }
    assert!(cluster.requests().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callers_own_x_forwarded_for_is_replaced_unless_the_proxy_is_told_to_trust_it() {
    let cluster = sim(SimConfig::default()).await;
    // The three headers kube-apiserver (X-Forwarded-For, X-Real-Ip) or others (Forwarded) may
    // take a request's origin from.
    let forged = "X-Forwarded-For: 203.0.113.66\r\nX-Real-Ip: 203.0.113.66\r\n\
                  Forwarded: for=203.0.113.66\r\n";
    let seen = |cluster: &SimCluster, path: &str| {
        let requests = cluster.requests();
        let r = requests.iter().rev().find(|r| r.path == path).unwrap();
        ["x-forwarded-for", "x-real-ip", "forwarded"].map(|h| r.header(h).map(str::to_owned))
    };
    let kept = |v: &str| Some(v.to_owned());
    for (trust, want) in [
        (false, [kept("127.0.0.1"), None, None]),
        (
            true,
            [
                kept("203.0.113.66, 127.0.0.1"),
                kept("203.0.113.66"),
                kept("for=203.0.113.66"),
            ],
        ),
    ] {
        let flags: &[&str] = if trust {
            &["--trust-x-forwarded-for"]
        } else {
            &[]
        };
        let proxy = ProxyProcess::start(&cluster.url(), flags);
        // A plain request, a translated exec, a relayed log and a relayed SPDY exec (kubectl
        // 1.28's upgrade).
        let mut s = send(
            proxy.addr,
            format!("GET /api/v1/namespaces/default/pods HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{forged}\r\n")
                .as_bytes(),
        )
        .await;
        read_head(&mut s, T).await.unwrap();
        assert_eq!(seen(&cluster, "/api/v1/namespaces/default/pods"), want);
        let exec = exec_path("web", &["true"], false, true, false);
        let mut s = send(
            proxy.addr,
            &websocket_get(&exec, &[b"v5.channel.k8s.io"], KEY, forged),
        )
        .await;
        assert_eq!(read_head(&mut s, T).await.unwrap().0, 101);
        assert_eq!(seen(&cluster, EXEC), want, "translated exec");
        let mut s = send(
            proxy.addr,
            &websocket_get(LOG, &[b"binary.k8s.io"], KEY, forged),
        )
        .await;
        assert_eq!(read_head(&mut s, T).await.unwrap().0, 101);
        assert_eq!(seen(&cluster, LOG), want, "relayed log");
        let before = cluster.requests().len();
        let mut s = send(proxy.addr, &spdy_post(&exec, forged)).await;
        assert_eq!(read_head(&mut s, T).await.unwrap().0, 101);
        assert!(cluster.requests().len() > before);
        assert_eq!(seen(&cluster, EXEC), want, "relayed SPDY exec");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http1_connect_is_refused_as_http2s_is_and_nothing_reaches_the_upstream() {
    let cluster = sim(SimConfig::default()).await;
    let proxy = ProxyProcess::start(&cluster.url(), &[]);
    for target in ["example.com:443", "127.0.0.1:22", &cluster.url()[7..]] {
        let mut s = send(
            proxy.addr,
            format!(
                "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nAuthorization: Bearer t\r\n\r\n"
            )
            .as_bytes(),
        )
        .await;
        let (code, head) = read_head(&mut s, T).await.unwrap();
        assert_eq!(code, 405, "CONNECT {target}: {head}");
        let mut body = vec![0u8; 4096];
        let n = tokio::time::timeout(T, s.read(&mut body))
            .await
            .unwrap()
            .unwrap();
        let body = String::from_utf8_lossy(&body[..n]);
        assert!(
            body.contains("MethodNotAllowed") && body.contains("opens no tunnels"),
            "{body}"
        );
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        cluster.requests().is_empty(),
        "forwarded: {:?}",
        cluster.requests()
    );
}

// ---------------------------------------------------------------------------------------------
// TokenReview amplification
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distinct_bogus_tokens_cost_a_bounded_number_of_reviews() {
    const PROXY_TOKEN: &str = "proxy-token-77";
    const PROXY_USER: &str = "system:serviceaccount:kube-ws-proxy:kube-ws-proxy";
    const TINA: &str = "tina-token-0c4a";
    let cluster = sim(SimConfig {
        users: vec![
            SimUser {
                token: PROXY_TOKEN.into(),
                name: PROXY_USER.into(),
                groups: vec![],
            },
            SimUser {
                token: TINA.into(),
                name: "tina".into(),
                groups: vec!["dev".into()],
            },
        ],
        impersonators: vec![PROXY_USER.into()],
        ..SimConfig::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, PROXY_TOKEN).unwrap();
    let proxy = ProxyProcess::start(
        &cluster.url(),
        &[
            "--auth-mode",
            "impersonate",
            "--upstream-token-file",
            token_file.to_str().unwrap(),
            "--authentication-cache-ttl",
            "60s",
            "--token-review-rate",
            "1",
            "--token-review-burst",
            "5",
            "--token-review-max-in-flight",
            "2",
        ],
    );
    let addr = proxy.addr;
    let get = move |token: String| async move {
        let mut s = send(
            addr,
            format!(
                "GET /api/v1/namespaces/default/pods HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
                 Authorization: Bearer {token}\r\n\r\n"
            )
            .as_bytes(),
        )
        .await;
        read_head(&mut s, T).await.map(|(c, _)| c).unwrap_or(0)
    };
    // Twenty requests at once with one new token: one review.
    let before = cluster.token_reviews();
    let codes = futures_util::future::join_all((0..20).map(|_| get(TINA.to_owned()))).await;
    assert!(codes.iter().all(|c| *c == 200), "{codes:?}");
    assert_eq!(
        cluster.token_reviews() - before,
        1,
        "one review for one token"
    );

    // Sixty distinct bogus tokens from one address: the burst is reviewed, the rest refused.
    let before = cluster.token_reviews();
    let codes = futures_util::future::join_all((0..60).map(|i| get(format!("bogus-{i}")))).await;
    let reviews = cluster.token_reviews() - before;
    let limited = codes.iter().filter(|c| **c == 429).count();
    let unauthorized = codes.iter().filter(|c| **c == 401).count();
    assert!(reviews <= 10, "{reviews} reviews for 60 bogus tokens");
    assert_eq!(limited + unauthorized, 60, "{codes:?}");
    assert!(limited >= 45, "{codes:?}");
    // Meanwhile the real caller's cached identity works, and costs nothing.
    let before = cluster.token_reviews();
    assert_eq!(get(TINA.to_owned()).await, 200);
    assert_eq!(cluster.token_reviews(), before);
    let metrics = proxy.metrics();
    assert!(
        metric(
            &metrics,
            "kube_ws_proxy_auth_rejections_total",
            "cluster=\"default\",reason=\"token_review_rate_limited\""
        ) >= 45.0,
        "{metrics}"
    );
}

// ---------------------------------------------------------------------------------------------
// Log flooding
// ---------------------------------------------------------------------------------------------

/// The proxy's log lines that contain `needle`.
fn lines_with(proxy: &ProxyProcess, needle: &str) -> Vec<String> {
    proxy
        .log_lines()
        .into_iter()
        .filter(|l| l.contains(needle))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_past_the_token_review_rate_limit_logs_a_bounded_number_of_lines() {
    const PROXY_TOKEN: &str = "proxy-token-91";
    const PROXY_USER: &str = "system:serviceaccount:kube-ws-proxy:kube-ws-proxy";
    let cluster = sim(SimConfig {
        users: vec![SimUser {
            token: PROXY_TOKEN.into(),
            name: PROXY_USER.into(),
            groups: vec![],
        }],
        impersonators: vec![PROXY_USER.into()],
        ..SimConfig::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, PROXY_TOKEN).unwrap();
    let proxy = ProxyProcess::start(
        &cluster.url(),
        &[
            "--auth-mode",
            "impersonate",
            "--upstream-token-file",
            token_file.to_str().unwrap(),
            "--token-review-rate",
            "1",
            "--token-review-burst",
            "1",
        ],
    );
    let before = proxy.log_lines().len();
    // One keep-alive connection sending distinct bogus tokens as fast as it is answered, for
    // three seconds: thousands of requests, nearly all past the rate limit.
    let tcp = TcpStream::connect(proxy.addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake::<_, Empty<bytes::Bytes>>(TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    let started = Instant::now();
    let mut limited = 0u64;
    let mut sent = 0u64;
    while started.elapsed() < Duration::from_secs(3) {
        sender
            .ready()
            .await
            .expect("the proxy keeps the connection");
        let req = http::Request::get("/api/v1/namespaces/default/pods")
            .header("host", "x")
            .header("authorization", format!("Bearer bogus-{sent}"))
            .body(Empty::new())
            .unwrap();
        let resp = sender.send_request(req).await.unwrap();
        if resp.status() == 429 {
            limited += 1;
        }
        resp.into_body().collect().await.unwrap();
        sent += 1;
    }
    assert!(limited >= 200, "{limited} of {sent} refused for the rate");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let warnings = lines_with(&proxy, "cannot authenticate the caller");
    let all = proxy.log_lines().len() - before;
    assert!(
        (1..=2).contains(&warnings.len()) && all <= 5,
        "{} refusals made {all} log lines: {warnings:#?}",
        limited
    );
    // Every refusal is still counted.
    let metrics = proxy.metrics();
    assert!(
        metric(
            &metrics,
            "kube_ws_proxy_auth_rejections_total",
            "cluster=\"default\",reason=\"token_review_rate_limited\""
        ) >= limited as f64,
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_client_audit_id_is_replaced_and_never_logged() {
    let cluster = sim(SimConfig::default()).await;
    let proxy = ProxyProcess::start(&cluster.url(), &[]);
    let huge = format!("evil-{}", "x".repeat(50 * 1024));
    let extra = format!("Audit-ID: {huge}\r\n");
    let is_uuid = |head: &str| {
        head.lines()
            .find_map(|l| l.strip_prefix("audit-id: "))
            .is_some_and(|id| id.trim().len() == 36 && !id.contains("evil"))
    };
    // A plain request and a translated exec, whose end is logged in the request's span.
    let mut s = send(
        proxy.addr,
        format!("GET /api/v1/namespaces/default/pods HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{extra}\r\n")
            .as_bytes(),
    )
    .await;
    let (code, head) = read_head(&mut s, T).await.unwrap();
    assert_eq!(code, 200, "{head}");
    assert!(is_uuid(&head.to_ascii_lowercase()), "{head}");
    let exec = exec_path("web", &["true"], false, true, false);
    let mut s = send(
        proxy.addr,
        &websocket_get(&exec, &[b"v5.channel.k8s.io"], KEY, &extra),
    )
    .await;
    let (code, head) = read_head(&mut s, T).await.unwrap();
    assert_eq!(code, 101, "{head}");
    assert!(is_uuid(&head.to_ascii_lowercase()), "{head}");
    closed_after(&mut s, T).await;
    assert!(proxy
        .wait_for_log("exec session finished", T)
        .is_some_and(|l| l.contains("\"audit_id\"")));
    assert!(lines_with(&proxy, "evil-").is_empty());
    // The cluster got the proxy's ids, not the client's.
    for r in cluster.requests() {
        let id = r.header("audit-id").unwrap_or_default();
        assert_eq!(id.len(), 36, "{} {id:.80}", r.path);
    }
}
