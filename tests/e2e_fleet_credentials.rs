//! Credentials never cross clusters: three TLS clusters behind one proxy, all three trusting
//! the same client CA, so that a certificate presented to the wrong cluster would be accepted
//! and seen there. `a` and `b` run in impersonate mode, each with the proxy's own client
//! certificate for it (CN `proxy-for-a`, `proxy-for-b`); `c` in passthrough, with none. A
//! caller's plain request and v5 exec (translated to SPDY, a new upstream connection each) go
//! to each cluster; each cluster sees only its own certificate (or, for `c`, none: only the
//! caller's token), and every request as the caller.

use crate::common;

use std::time::Duration;

use common::pki::Ca;
use common::proxy_process::ProxyProcess;
use common::ws_client;
use futures_util::StreamExt;
use kube_ws_proxy::sim::{AuthenticatedBy, SimCluster, SimConfig, SimTls, SimUser};
use tokio_tungstenite::tungstenite::Message;

const T: Duration = Duration::from_secs(30);
const TINA: &str = "tina-token-5c81";

async fn tls_sim(ca: &Ca) -> SimCluster {
    let serving = ca.server();
    SimCluster::start(SimConfig {
        tls: Some(SimTls {
            cert_chain_pem: serving.cert_pem,
            private_key_pem: serving.key_pem,
            client_ca_pem: Some(ca.pem.clone()),
        }),
        users: vec![SimUser {
            token: TINA.to_owned(),
            name: "tina".to_owned(),
            groups: vec!["dev".to_owned()],
        }],
        impersonators: vec!["proxy-for-a".to_owned(), "proxy-for-b".to_owned()],
        ..SimConfig::default()
    })
    .await
    .expect("start sim cluster")
}

/// A v5 `echo` on `cluster` as tina: its stdout.
async fn exec(proxy: &ProxyProcess, cluster: &str) -> Vec<u8> {
    let path = format!(
        "/clusters/{cluster}{}",
        ws_client::exec_path("web", &["echo", "hi"], false, true, false)
    );
    let protocols = format!("v5.channel.k8s.io, {}", common::bearer::entry(TINA));
    let (mut ws, _) = ws_client::connect(proxy.addr, &path, &protocols)
        .await
        .unwrap_or_else(|e| panic!("{cluster}: {e}"));
    let mut out = Vec::new();
    while let Some(msg) = tokio::time::timeout(T, ws.next()).await.unwrap() {
        match msg {
            Ok(Message::Binary(b)) if b.first() == Some(&1) => out.extend_from_slice(&b[1..]),
            Ok(Message::Close(_)) | Err(_) => break,
            Ok(_) => {}
        }
    }
    out
}

/// A plain GET on `cluster` as tina: the status.
fn get(proxy: &ProxyProcess, cluster: &str) -> u16 {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(proxy.addr).unwrap();
    write!(
        s,
        "GET /clusters/{cluster}/api/v1/namespaces/default/pods/web HTTP/1.1\r\nHost: x\r\n\
         Authorization: Bearer {TINA}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    answer.split(' ').nth(1).unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_cluster_sees_only_its_own_client_certificate() {
    let ca = Ca::new("fleet clusters");
    let sims = [tls_sim(&ca).await, tls_sim(&ca).await, tls_sim(&ca).await];
    let dir = tempfile::tempdir().unwrap();
    let ca_file = ca.write(dir.path(), "clusters-ca");
    let (a_cert, a_key) = ca.client("proxy-for-a", None).write(dir.path(), "a");
    let (b_cert, b_key) = ca.client("proxy-for-b", None).write(dir.path(), "b");
    let entry =
        |name: &str, sim: &SimCluster, own: Option<(&std::path::Path, &std::path::Path)>| {
            let mut e = format!(
            "- name: {name}\n  upstream: {}\n  upstream-ca-file: {}\n  upstream-streaming: spdy\n",
            sim.url(),
            ca_file.display()
        );
            match own {
                Some((cert, key)) => e.push_str(&format!(
                    "  auth-mode: impersonate\n  upstream-client-cert-file: {}\n  \
                 upstream-client-key-file: {}\n",
                    cert.display(),
                    key.display()
                )),
                None => e.push_str("  auth-mode: passthrough\n"),
            }
            e
        };
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "clusters:\n{}{}{}",
            entry("a", &sims[0], Some((&a_cert, &a_key))),
            entry("b", &sims[1], Some((&b_cert, &b_key))),
            entry("c", &sims[2], None),
        ),
    )
    .unwrap();
    let proxy = ProxyProcess::launch(&["--config", config.to_str().unwrap()], &[]);

    for cluster in ["a", "b", "c"] {
        assert_eq!(get(&proxy, cluster), 200, "{cluster}: GET");
        assert_eq!(exec(&proxy, cluster).await, b"hi\n", "{cluster}: exec");
    }

    for (sim, own) in sims
        .iter()
        .zip([Some("proxy-for-a"), Some("proxy-for-b"), None])
    {
        let requests = sim.requests();
        assert!(
            requests.iter().any(|r| r.path.ends_with("/exec")),
            "{own:?}: no exec"
        );
        for r in &requests {
            let by_cert = r.authenticated_by == Some(AuthenticatedBy::ClientCert);
            let who = r.authenticated_user.as_ref().map(|u| u.name.as_str());
            match own {
                // Every request of an impersonating cluster made with its own certificate.
                Some(own) => assert!(by_cert && who == Some(own), "{own}: {} by {who:?}", r.path),
                // Passthrough: the caller's own token, never a certificate of the proxy's.
                None => assert!(
                    !by_cert && r.authenticated_by == Some(AuthenticatedBy::Token),
                    "c: {} by {:?} as {who:?}",
                    r.path,
                    r.authenticated_by
                ),
            }
            if !r.path.contains("tokenreviews") {
                let user = r.user.as_ref().map(|u| u.name.as_str());
                assert_eq!(user, Some("tina"), "{own:?}: {} acted as {user:?}", r.path);
            }
        }
    }
}
