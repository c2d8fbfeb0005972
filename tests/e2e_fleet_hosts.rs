//! Routing by host name (`--cluster-host-suffix kube.example.com`): real clients reach three
//! simulated clusters of different kinds (an old SPDY-only one, a new one, a WebSocket-only
//! one) as `a.kube.example.com`, `b.kube.example.com` and `ws-only.kube.example.com`, through
//! an HTTP proxy (kubeconfig's `proxy-url`, the Python client's `proxy`: a forward proxy in the
//! test tunnels every name to the proxy on 127.0.0.1, so nothing resolves the names and
//! /etc/hosts is left alone). kubectl does on each cluster what it does by path (exec,
//! `exec -i`, `exec -it`, cp both ways, port-forward, `logs -f`, get, `get --watch`; the
//! helpers of `e2e_fleet_kubectl`), each reaching its own cluster and no other. Over TLS
//! (kubectl 1.28, SPDY), each cluster's certificate is chosen by SNI: `a` has its own
//! (`--tls-sni-cert`, from a CA only a's kubeconfig trusts) and the others get the wildcard
//! serving certificate (from another CA, the only one their kubeconfigs trust), so a wrong
//! choice fails the handshake. In plain HTTP (kubectl 1.33, the Python client) the forward
//! proxy hands every connection to the SPDY-dropping gateway, which sees the bytes: plain calls
//! arrive in absolute form (`GET http://a.kube.example.com:PORT/...`), upgrades in tunnels. A
//! raw client checks that a request naming another cluster than its connection's SNI is
//! refused with 421, over HTTP/1.1 and HTTP/2 (connection coalescing, RFC 8441 WebSockets too),
//! and that a host-named cluster gets its path as it is.

use crate::common;
use crate::e2e_fleet_kubectl::{everything_on, python_exec_on, Target};

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use bytes::Bytes;
use common::clients::{python_with_kubernetes, require, require_kubectl};
use common::connect_proxy::ConnectProxy;
use common::h2_ws::H2Connection;
use common::middlebox::Middlebox;
use common::pki::{b64, Ca};
use common::proxy_process::ProxyProcess;
use common::tls_client::connect_as;
use common::ws_client;
use futures_util::StreamExt;
use kube_ws_proxy::sim::{SimCluster, SimConfig, SimStreaming};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;

const SUFFIX: &str = "kube.example.com";

/// The clusters: name and kind.
const CLUSTERS: [(&str, SimStreaming); 3] = [
    ("a", SimStreaming::SpdyOnly),
    ("b", SimStreaming::New),
    ("ws-only", SimStreaming::WebSocketOnly),
];

/// Three clusters behind one proxy routing by host name, reached through a forward proxy.
struct Hosts {
    sims: Vec<SimCluster>,
    proxy: ProxyProcess,
    /// Where kubeconfig's `proxy-url` points.
    forward: ConnectProxy,
    /// In plain HTTP, the SPDY-dropping gateway between the forward proxy and the proxy.
    gateway: Option<Middlebox>,
    /// Over TLS: the CA of a's own certificate, and the CA of the wildcard one.
    cas: Option<(Ca, Ca)>,
    dir: tempfile::TempDir,
}

impl Hosts {
    async fn start(tls: bool) -> Hosts {
        let dir = tempfile::tempdir().unwrap();
        let mut sims = Vec::new();
        let mut args = vec!["--cluster-host-suffix".to_owned(), SUFFIX.to_owned()];
        for (name, streaming) in CLUSTERS {
            let sim = SimCluster::start(SimConfig {
                streaming,
                ..SimConfig::default()
            })
            .await
            .expect("start sim cluster");
            args.extend(["--cluster".to_owned(), format!("{name}={}", sim.url())]);
            sims.push(sim);
        }
        let cas = tls.then(|| (Ca::new("cluster a"), Ca::new("fleet")));
        if let Some((ca_a, ca_fleet)) = &cas {
            let (wild_cert, wild_key) = ca_fleet
                .server_for(&[&format!("*.{SUFFIX}")])
                .write(dir.path(), "wildcard");
            let (a_cert, a_key) = ca_a
                .server_for(&[&format!("a.{SUFFIX}")])
                .write(dir.path(), "a");
            for (flag, value) in [
                ("--tls-cert-file", wild_cert.display().to_string()),
                ("--tls-private-key-file", wild_key.display().to_string()),
                (
                    "--tls-sni-cert",
                    format!("a={},{}", a_cert.display(), a_key.display()),
                ),
            ] {
                args.extend([flag.to_owned(), value]);
            }
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let proxy = ProxyProcess::launch(&args, &[]);
        let gateway = match tls {
            true => None,
            false => Some(Middlebox::start(proxy.addr).await),
        };
        let entry = gateway.as_ref().map_or(proxy.addr, |g| g.addr);
        let forward = ConnectProxy::start(entry).await;
        Hosts {
            sims,
            proxy,
            forward,
            gateway,
            cas,
            dir,
        }
    }

    /// A kubeconfig for cluster `name` at its host name (the proxy's port), through the
    /// forward proxy; over TLS trusting only the CA of the certificate it must be served. With
    /// a token (the clusters take any): kubectl 1.28 asks for a password without credentials.
    fn kubeconfig(&self, name: &str) -> PathBuf {
        let ca = self.ca_of(name).map_or(String::new(), |ca| {
            format!("    certificate-authority-data: {}\n", b64(&ca.pem))
        });
        let server = self.server(name);
        let path = self.dir.path().join(format!("{name}.kubeconfig"));
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: {name}\n  cluster:\n    \
                 server: {server}\n    proxy-url: http://{forward}\n{ca}contexts:\n- name: {name}\n  \
                 context:\n    cluster: {name}\n    user: u\n    namespace: default\n\
                 current-context: {name}\nusers:\n- name: u\n  user:\n    token: token-of-{name}\n",
                forward = self.forward.addr,
            ),
        )
        .unwrap();
        path
    }

    /// Cluster `name`'s server URL: its host name, at the proxy's port.
    fn server(&self, name: &str) -> String {
        let scheme = if self.cas.is_some() { "https" } else { "http" };
        format!("{scheme}://{name}.{SUFFIX}:{}", self.proxy.addr.port())
    }

    /// Over TLS, the only CA a client of cluster `name` trusts: a's own for a, else the
    /// wildcard's.
    fn ca_of(&self, name: &str) -> Option<&Ca> {
        let (ca_a, ca_fleet) = self.cas.as_ref()?;
        Some(if name == "a" { ca_a } else { ca_fleet })
    }

    fn kubectl(&self, bin: &Path, kubeconfig: &Path) -> Command {
        let mut cmd = Command::new(bin);
        cmd.arg("--kubeconfig")
            .arg(kubeconfig)
            .env_remove("KUBECTL_REMOTE_COMMAND_WEBSOCKETS")
            .env_remove("KUBECTL_PORT_FORWARD_WEBSOCKETS")
            .env_remove("KUBECONFIG")
            .env_remove("HTTPS_PROXY")
            .env_remove("HTTP_PROXY")
            .env_remove("NO_PROXY")
            .env("HOME", self.dir.path());
        cmd
    }
}

/// Everything kubectl does (exec, `exec -i`, get, port-forward, `exec -it`, cp both ways,
/// `logs -f`, `get --watch`) on cluster `i` by its host name, as by path: it reaches that
/// cluster and no other, and kubectl named it by host to the forward proxy.
async fn by_host_name(h: &Hosts, i: usize, kubectl: &Path) {
    let names = CLUSTERS.map(|c| c.0);
    let kubeconfig = h.kubeconfig(names[i]);
    let k = || h.kubectl(kubectl, &kubeconfig);
    let target = Target {
        names: &names,
        sims: &h.sims,
        i,
        dir: h.dir.path(),
        kubectl: &k,
    };
    everything_on(&target).await;
    let asked = h.forward.requests();
    let host = format!("{}.{SUFFIX}:", names[i]);
    assert!(asked.iter().any(|r| r.contains(&host)), "{asked:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_1_28_streams_to_each_cluster_by_host_name_with_its_sni_certificate() {
    let Some(k) = require_kubectl("1.28") else {
        return;
    };
    let h = Hosts::start(true).await;
    for i in 0..CLUSTERS.len() {
        by_host_name(&h, i, &k).await;
    }
    // Each kubeconfig trusted one CA only, so each handshake got its own certificate; and the
    // other choice would have failed: a is not served the wildcard, b not a's certificate.
    let (ca_a, ca_fleet) = h.cas.as_ref().unwrap();
    let addr = h.proxy.addr;
    let a_host = format!("a.{SUFFIX}");
    let b_host = format!("b.{SUFFIX}");
    assert!(connect_as(addr, &a_host, &ca_fleet.pem, None, &[])
        .await
        .is_err());
    assert!(connect_as(addr, &b_host, &ca_a.pem, None, &[])
        .await
        .is_err());
    assert!(connect_as(addr, &a_host, &ca_a.pem, None, &[])
        .await
        .is_ok());
    assert!(connect_as(addr, &b_host, &ca_fleet.pem, None, &[])
        .await
        .is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_1_33_streams_by_host_name_through_the_gateway() {
    let Some(k) = require_kubectl("1.33") else {
        return;
    };
    let h = Hosts::start(false).await;
    for i in 0..CLUSTERS.len() {
        by_host_name(&h, i, &k).await;
    }
    // Every session (port-forward's tunnel too) was a WebSocket through the SPDY-dropping
    // gateway: six on each cluster (exec, `exec -i`, port-forward, `exec -it`, two cp).
    let gateway = h.gateway.as_ref().unwrap();
    assert!(gateway.websockets() >= 18, "{}", gateway.websockets());
    assert_eq!(gateway.dropped(), 0, "kubectl fell back to SPDY");
    // Plain calls came in absolute form, naming their host in the target.
    let asked = h.forward.requests();
    for (name, _) in CLUSTERS {
        let absolute = format!("GET http://{name}.{SUFFIX}:{}/", h.proxy.addr.port());
        assert!(asked.iter().any(|r| r.starts_with(&absolute)), "{asked:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_execs_by_host_name_through_its_http_proxy_and_over_tls() {
    let Some(py) = require(
        "python3 with the kubernetes package",
        python_with_kubernetes(),
    ) else {
        return;
    };
    for tls in [false, true] {
        let h = Hosts::start(tls).await;
        python_on_each_cluster(&h, &py).await;
    }
}

/// The Python client's exec on each cluster by its host name, through its own proxy setting:
/// its WebSocket is a CONNECT tunnel to the host name, and the exec request names it in
/// `Host` (over TLS, in SNI too, trusting only the CA of the certificate that name must get),
/// as the client makes them.
async fn python_on_each_cluster(h: &Hosts, py: &Path) {
    let names = CLUSTERS.map(|c| c.0);
    let proxy = format!("http://{}", h.forward.addr);
    for (i, name) in names.iter().enumerate() {
        let mut options = vec!["--proxy".to_owned(), proxy.clone()];
        if let Some(ca) = h.ca_of(name) {
            let file = h.dir.path().join(format!("{name}-ca.pem"));
            std::fs::write(&file, &ca.pem).unwrap();
            options.extend(["--ca".to_owned(), file.display().to_string()]);
        }
        let options: Vec<&str> = options.iter().map(String::as_str).collect();
        let server = h.server(name);
        python_exec_on(&names, &h.sims, i, py, &server, &options).await;
        let tunnel = format!("CONNECT {name}.{SUFFIX}:{}", h.proxy.addr.port());
        let asked = h.forward.requests();
        assert!(asked.contains(&tunnel), "{tunnel}: {asked:?}");
    }
    if let Some(gateway) = &h.gateway {
        assert!(gateway.websockets() >= 3, "{}", gateway.websockets());
        assert_eq!(gateway.dropped(), 0);
    }
}

/// The status code of `request` sent over a TLS connection made for `sni`.
async fn status_over(addr: SocketAddr, sni: &str, ca: &Ca, request: &str) -> (u16, String) {
    let mut tls = connect_as(addr, sni, &ca.pem, None, &[b"http/1.1"])
        .await
        .unwrap();
    tls.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let _ = tls.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let code = answer.split(' ').nth(1).and_then(|c| c.parse().ok());
    (code.unwrap_or(0), answer)
}

/// The status of a GET of `uri` on an HTTP/2 connection made for `sni`.
async fn h2_status(addr: SocketAddr, sni: &str, ca: &Ca, uris: &[String]) -> Vec<u16> {
    let tls = connect_as(addr, sni, &ca.pem, None, &[b"h2"])
        .await
        .unwrap();
    let (mut send, conn) = h2::client::Builder::new()
        .handshake::<_, Bytes>(tls)
        .await
        .unwrap();
    let driver = tokio::spawn(conn);
    let mut codes = Vec::new();
    for uri in uris {
        let req = http::Request::get(uri.as_str()).body(()).unwrap();
        send = send.ready().await.unwrap();
        let (resp, _) = send.send_request(req, true).unwrap();
        codes.push(resp.await.unwrap().status().as_u16());
    }
    driver.abort();
    codes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_clusters_request_on_a_connection_made_for_one_is_misdirected() {
    let h = Hosts::start(true).await;
    let (ca_a, ca_fleet) = h.cas.as_ref().unwrap();
    let addr = h.proxy.addr;
    let get = |host: &str, path: &str| {
        format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")
    };
    let a = format!("a.{SUFFIX}");
    let pods = "/api/v1/namespaces/default/pods/web";
    let before: Vec<usize> = h.sims.iter().map(|s| s.requests().len()).collect();
    // HTTP/1.1: made for a, asking for b (or for no cluster's name): 421.
    for host in [
        format!("b.{SUFFIX}"),
        "proxy.example.com".into(),
        "127.0.0.1".into(),
    ] {
        let (code, answer) = status_over(addr, &a, ca_a, &get(&host, pods)).await;
        assert_eq!(code, 421, "{host}: {answer}");
        assert!(!answer.contains("b.kube"), "{answer}");
    }
    // Made for a, asking for a (any spelling): served by a, its path as it is.
    let (code, answer) = status_over(addr, &a, ca_a, &get("A.Kube.Example.COM.:443", pods)).await;
    assert_eq!(code, 200, "{answer}");
    let (code, _) = status_over(addr, &a, ca_a, &get(&a, "/clusters/b/api")).await;
    assert_eq!(code, 404, "a's own path /clusters/b/api is a's to answer");
    // An unknown name under the suffix is no cluster, and odd hosts are refused.
    let c = format!("c.{SUFFIX}");
    let (code, answer) = status_over(addr, &c, ca_fleet, &get(&c, pods)).await;
    assert_eq!(code, 404, "{answer}");
    let (code, _) = status_over(addr, &c, ca_fleet, &get("a%2ekube.example.com", pods)).await;
    assert_eq!(code, 400);
    // HTTP/2: a connection made for a, reused for b (coalescing) is told to go elsewhere.
    let codes = h2_status(
        addr,
        &a,
        ca_a,
        &[
            format!("https://b.{SUFFIX}{pods}"),
            format!("https://{a}{pods}"),
        ],
    )
    .await;
    assert_eq!(codes, [421, 200]);
    websocket_over_h2(addr, &a, ca_a).await;
    // b never saw a request; a saw its own (its three plain ones, and the exec: asked first as
    // a WebSocket under `auto`, then in SPDY), one with the `/clusters/b/` path as sent.
    let after: Vec<usize> = h.sims.iter().map(|s| s.requests().len()).collect();
    assert_eq!(after[1], before[1], "b was reached");
    assert!(after[0] >= before[0] + 4, "{before:?} -> {after:?}");
    assert!(h.sims[0]
        .requests()
        .iter()
        .any(|r| r.path == "/clusters/b/api"));
    let misdirected = h
        .proxy
        .metric(r#"kube_ws_proxy_handshake_rejections_total{cluster="",reason="misdirected"}"#);
    assert_eq!(misdirected, Some(5.0));
}

/// RFC 8441: on an HTTP/2 connection made for a, a WebSocket exec whose `:authority` names b
/// is misdirected; one naming a runs on a.
async fn websocket_over_h2(addr: SocketAddr, a: &str, ca: &Ca) {
    let mut h2 = H2Connection::connect_as(addr, a, &ca.pem, 65_535, 1 << 20).await;
    assert!(h2.extended_connect_enabled());
    let path = ws_client::exec_path("web", &["echo", "on-a"], false, true, true);
    h2.set_authority(format!("b.{SUFFIX}:{}", addr.port()));
    let refused = h2.websocket(&path, "v5.channel.k8s.io").await.err();
    assert_eq!(refused.map(|r| r.status.as_u16()), Some(421));
    h2.set_authority(format!("{a}:{}", addr.port()));
    let (mut ws, _) = h2.websocket(&path, "v5.channel.k8s.io").await.unwrap();
    // The session's stdout (channel 1) until the cluster closes it.
    let mut stdout: Vec<u8> = Vec::new();
    while let Some(Ok(message)) = ws.next().await {
        match message {
            Message::Binary(data) if data.first() == Some(&1) => {
                stdout.extend_from_slice(&data[1..])
            }
            Message::Close(_) => break,
            _ => {}
        }
    }
    assert_eq!(stdout, b"on-a\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clusters_own_certificate_is_reloaded_when_its_files_change() {
    let h = Hosts::start(true).await;
    let addr = h.proxy.addr;
    let a = format!("a.{SUFFIX}");
    let rotated = Ca::new("cluster a, rotated");
    assert!(connect_as(addr, &a, &rotated.pem, None, &[]).await.is_err());
    // The key first, then the certificate: a pair that does not match is not taken meanwhile.
    let leaf = rotated.server_for(&[&a]);
    std::fs::write(h.dir.path().join("a.key"), &leaf.key_pem).unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (ca_a, _) = h.cas.as_ref().unwrap();
    assert!(connect_as(addr, &a, &ca_a.pem, None, &[]).await.is_ok());
    std::fs::write(h.dir.path().join("a.crt"), &leaf.cert_pem).unwrap();
    let mut served = false;
    for _ in 0..50 {
        if connect_as(addr, &a, &rotated.pem, None, &[]).await.is_ok() {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(served, "a's rotated certificate was not served");
    // The failed reload is counted by the reload task, which may run after the listener
    // already serves the new certificate: read the counter a while.
    let series = r#"kube_ws_proxy_serving_certificate_reloads_total{result="failed"}"#;
    let mut failed = h.proxy.metric(series);
    for _ in 0..50 {
        if failed >= Some(1.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        failed = h.proxy.metric(series);
    }
    assert!(failed >= Some(1.0), "{failed:?}");
    // b still gets the wildcard.
    let (_, ca_fleet) = h.cas.as_ref().unwrap();
    assert!(
        connect_as(addr, &format!("b.{SUFFIX}"), &ca_fleet.pem, None, &[])
            .await
            .is_ok()
    );
}
