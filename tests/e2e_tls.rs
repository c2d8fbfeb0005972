//! TLS on the main listener: kubectl 1.33 over HTTPS through the proxy (WebSocket exec is
//! translated), ALPN h2 and http/1.1, and certificate rotation without a restart while a session
//! started before the rotation keeps running.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use common::clients::require_kubectl;
use common::harness::{run, stderr, stdout};
use common::proxy_process::ProxyProcess;
use kube_ws_proxy::sim::{SimCluster, SimConfig};
use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};

const T: Duration = Duration::from_secs(60);
/// kubectl sends a kubeconfig token only over TLS; the simulated cluster requires it, so every
/// request proves the caller's credentials went upstream unchanged.
const TOKEN: &str = "tls-test-token-5f3a";

/// A CA, and a serving certificate for 127.0.0.1 / localhost signed by it (PEM).
struct Pki {
    ca_pem: String,
    cert_pem: String,
    key_pem: String,
}

fn pki(name: &str) -> Pki {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("{name} CA"));
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let params =
        CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
    let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
    Pki {
        ca_pem: ca.pem(),
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    }
}

fn kubeconfig(dir: &Path, name: &str, server: &str, ca_pem: &str) -> std::path::PathBuf {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let path = dir.join(format!("kubeconfig-{name}"));
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    \
             certificate-authority-data: {ca}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    \
             user: u\n    namespace: default\ncurrent-context: c\nusers:\n- name: u\n  user:\n    \
             token: {TOKEN}\n"
        ),
    )
    .unwrap();
    path
}

/// The ALPN protocol the proxy picks when a client offers h2 and http/1.1, trusting `ca_pem`;
/// `None` if the handshake fails (e.g. the proxy serves a certificate of another CA).
async fn handshake(addr: std::net::SocketAddr, ca_pem: &str) -> Option<Vec<u8>> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let tls = connector.connect(name, tcp).await.ok()?;
    Some(tls.get_ref().1.alpn_protocol().unwrap_or_default().to_vec())
}

/// The simulated cluster (which asks for [`TOKEN`]), a folder, the certificate and key files
/// in it (written from the pair it returns) and the proxy in front of the cluster serving them.
async fn serve_tls() -> (
    SimCluster,
    tempfile::TempDir,
    (PathBuf, PathBuf),
    Pki,
    ProxyProcess,
) {
    let config = SimConfig {
        require_bearer_token: Some(TOKEN.into()),
        ..SimConfig::default()
    };
    let sim = SimCluster::start(config).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    let first = pki("first");
    std::fs::write(&cert, &first.cert_pem).unwrap();
    std::fs::write(&key, &first.key_pem).unwrap();
    let proxy = ProxyProcess::start(
        &sim.url(),
        &[
            "--tls-cert-file",
            cert.to_str().unwrap(),
            "--tls-private-key-file",
            key.to_str().unwrap(),
        ],
    );
    (sim, dir, (cert, key), first, proxy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_over_tls_and_certificate_rotation() {
    let Some(k) = require_kubectl("1.33") else {
        return;
    };
    let (_sim, dir, (cert, key), first, proxy) = serve_tls().await;
    let server = format!("https://127.0.0.1:{}", proxy.addr.port());

    assert_eq!(
        handshake(proxy.addr, &first.ca_pem).await.as_deref(),
        Some(&b"h2"[..])
    );

    let cfg = kubeconfig(dir.path(), "first", &server, &first.ca_pem);
    let kubectl = |args: &[&str]| {
        let mut c = std::process::Command::new(&k);
        c.arg("--kubeconfig")
            .arg(&cfg)
            .args(args)
            .env("HOME", dir.path())
            .env_remove("KUBECONFIG");
        c
    };
    let o = run(kubectl(&["exec", "web", "--", "echo", "over tls"]), None, T).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "over tls\n");
    let o = run(kubectl(&["get", "pods", "web", "-o", "name"]), None, T).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "pod/web\n");
    // The exec was translated (WebSocket in), not relayed as SPDY.
    let metrics = proxy.metrics();
    assert!(
        metrics.contains(
            r#"kube_ws_proxy_sessions_total{cluster="default",kind="exec",outcome="success"} 1"#
        ),
        "{metrics}"
    );

    // A session running across the rotation: `cat` over the first certificate's connection.
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let mut session = tokio::process::Command::new(&k)
        .arg("--kubeconfig")
        .arg(&cfg)
        .args(["exec", "-i", "web", "--", "cat"])
        .env("HOME", dir.path())
        .env_remove("KUBECONFIG")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut session_in = session.stdin.take().unwrap();
    let mut session_out = tokio::io::BufReader::new(session.stdout.take().unwrap());
    let mut line = String::new();
    session_in.write_all(b"before rotation\n").await.unwrap();
    tokio::time::timeout(T, session_out.read_line(&mut line))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(line, "before rotation\n");

    // Rotate: a certificate from another CA is served without a restart.
    let second = pki("second");
    std::fs::write(&key, &second.key_pem).unwrap();
    std::fs::write(&cert, &second.cert_pem).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while handshake(proxy.addr, &second.ca_pem).await.is_none() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "rotated certificate not served"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        handshake(proxy.addr, &first.ca_pem).await.is_none(),
        "old certificate still served"
    );
    // The session that started before the rotation still works, and ends cleanly.
    line.clear();
    session_in.write_all(b"after rotation\n").await.unwrap();
    tokio::time::timeout(T, session_out.read_line(&mut line))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(line, "after rotation\n");
    drop(session_in);
    let status = tokio::time::timeout(T, session.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(
        status.success(),
        "session across the rotation failed: {status}"
    );
    let cfg2 = kubeconfig(dir.path(), "second", &server, &second.ca_pem);
    let mut c = std::process::Command::new(&k);
    c.arg("--kubeconfig")
        .arg(&cfg2)
        .args(["exec", "web", "--", "echo", "rotated"])
        .env("HOME", dir.path());
    let o = run(c, None, T).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "rotated\n");
    assert!(proxy
        .wait_for_log("serving certificate reloaded", Duration::from_secs(1))
        .is_some());
}

/// Replaces `path` with `contents` in one step (a write to a temporary file, then a rename), so
/// the proxy never reads half a file.
fn replace(path: &Path, contents: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_copied_in_before_its_key_leaves_the_previous_pair_served() {
    let Some(k) = require_kubectl("1.33") else {
        return;
    };
    let (_sim, dir, (cert, key), first, proxy) = serve_tls().await;
    let server = format!("https://127.0.0.1:{}", proxy.addr.port());
    let exec = |cfg: &Path, word: &str| {
        let mut c = std::process::Command::new(&k);
        c.arg("--kubeconfig")
            .arg(cfg)
            .args(["exec", "web", "--", "echo", word])
            .env("HOME", dir.path())
            .env_remove("KUBECONFIG");
        c
    };
    let first_cfg = kubeconfig(dir.path(), "first", &server, &first.ca_pem);
    let o = run(exec(&first_cfg, "before"), None, T).await;
    assert!(o.status.success(), "{}", stderr(&o));

    // Half a rotation, as `cp new.crt tls.crt` does: the new certificate, the old key.
    let second = pki("second");
    replace(&cert, &second.cert_pem);
    let said = proxy
        .wait_for_log("serving certificate", Duration::from_secs(20))
        .expect("the proxy did not look at the changed files");
    // The previous pair is still served: kubectl still connects.
    let o = run(exec(&first_cfg, "half-rotated"), None, T).await;
    assert!(
        o.status.success(),
        "kubectl after the half rotation: {}",
        stderr(&o)
    );
    assert_eq!(stdout(&o), "half-rotated\n");
    assert!(said.contains("not reloaded"), "{said}");
    let metrics = proxy.metrics();
    assert!(
        metrics.contains(r#"kube_ws_proxy_serving_certificate_reloads_total{result="failed"} 1"#),
        "{metrics}"
    );

    // The key follows: the new certificate is served.
    replace(&key, &second.key_pem);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while handshake(proxy.addr, &second.ca_pem).await.is_none() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the completed pair is not served"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let second_cfg = kubeconfig(dir.path(), "second", &server, &second.ca_pem);
    let o = run(exec(&second_cfg, "rotated"), None, T).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "rotated\n");
    assert!(proxy
        .metrics()
        .contains(r#"kube_ws_proxy_serving_certificate_reloads_total{result="reloaded"} 1"#));
}
