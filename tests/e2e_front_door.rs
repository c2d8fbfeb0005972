//! The production front door, end to end with kubectl 1.33: TLS on both legs (kubectl → TLS →
//! proxy → TLS → the simulated cluster), exec, cp and port-forward with the caller's token seen
//! upstream on every path; the impersonate and front-proxy auth modes with client-certificate
//! and token (TokenReview) callers; the upstream from `--in-cluster` (with a rotating token, and
//! without one in passthrough) and from `--kubeconfig`; and bad input: unauthenticated callers, caller impersonation headers,
//! untrusted and expired client certificates, a wrong upstream CA.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use common::clients::require_kubectl;
use common::harness::{run, stderr, stdout};
use common::pki::{kubeconfig, Ca, Leaf};
use common::pod_server::PodServer;
use common::proxy_process::{run_to_exit_with_env, ProxyProcess};
use common::tls_client::raw_https;
use kube_ws_proxy::sim::{
    AuthenticatedBy, SeenRequest, SimCluster, SimConfig, SimFrontProxy, SimTls, SimUser,
};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

const T: Duration = Duration::from_secs(60);
/// A developer's token: the simulated cluster knows it as user `tina` in group `dev`.
const TINA: &str = "tina-token-7d21";
/// The proxy's own service-account token (and the one it rotates to).
const PROXY_TOKEN: &str = "proxy-token-1-a9e0";
const PROXY_TOKEN_ROTATED: &str = "proxy-token-2-44c3";
const PROXY_USER: &str = "system:serviceaccount:kube-ws-proxy:kube-ws-proxy";
/// The proxy's identity when it authenticates upstream with a client certificate.
const PROXY_CERT_USER: &str = "kube-ws-proxy-cert";
/// The same, from the certificate it is rotated to.
const PROXY_CERT_USER_ROTATED: &str = "kube-ws-proxy-cert-2";
/// The CN of the front-proxy client certificate the cluster trusts.
const FRONT_PROXY_CN: &str = "kube-ws-proxy";

/// The simulated cluster behind TLS, its PKI, and a place for files.
struct Door {
    sim: SimCluster,
    dir: tempfile::TempDir,
    /// Signs the cluster's serving certificate and its users' client certificates.
    cluster_ca: Ca,
    cluster_ca_file: PathBuf,
    /// Signs the proxy's serving certificate.
    proxy_ca: Ca,
    proxy_cert: (PathBuf, PathBuf),
    /// Signs front-proxy client certificates (kube-apiserver's requestheader CA).
    front_ca: Ca,
}

impl Door {
    async fn new() -> Door {
        let cluster_ca = Ca::new("cluster");
        let proxy_ca = Ca::new("proxy");
        let front_ca = Ca::new("front-proxy");
        let serving = cluster_ca.server();
        let mut front_proxy = SimFrontProxy::new(front_ca.pem.clone());
        front_proxy.allowed_names = vec![FRONT_PROXY_CN.to_owned()];
        let user = |token: &str, name: &str, groups: &[&str]| SimUser {
            token: token.to_owned(),
            name: name.to_owned(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
        };
        let config = SimConfig {
            tls: Some(SimTls {
                cert_chain_pem: serving.cert_pem,
                private_key_pem: serving.key_pem,
                client_ca_pem: Some(cluster_ca.pem.clone()),
            }),
            users: vec![
                user(TINA, "tina", &["dev"]),
                user(PROXY_TOKEN, PROXY_USER, &["system:serviceaccounts"]),
                user(PROXY_TOKEN_ROTATED, PROXY_USER, &["system:serviceaccounts"]),
            ],
            impersonators: vec![
                PROXY_USER.to_owned(),
                PROXY_CERT_USER.to_owned(),
                PROXY_CERT_USER_ROTATED.to_owned(),
            ],
            front_proxy: Some(front_proxy),
            ..SimConfig::default()
        };
        let sim = SimCluster::start(config).await.expect("start the cluster");
        let dir = tempfile::tempdir().unwrap();
        let cluster_ca_file = cluster_ca.write(dir.path(), "cluster-ca");
        let proxy_cert = proxy_ca.server().write(dir.path(), "proxy-serving");
        Door {
            sim,
            dir,
            cluster_ca,
            cluster_ca_file,
            proxy_ca,
            proxy_cert,
            front_ca,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The proxy with listener TLS and the cluster CA for client certificates, plus `args`
    /// (the upstream source and auth mode among them).
    fn proxy(&self, args: &[String], env: &[(&str, &str)]) -> ProxyProcess {
        let mut all = vec![
            "--tls-cert-file".to_owned(),
            self.proxy_cert.0.display().to_string(),
            "--tls-private-key-file".to_owned(),
            self.proxy_cert.1.display().to_string(),
            "--client-ca-file".to_owned(),
            self.cluster_ca_file.display().to_string(),
        ];
        all.extend_from_slice(args);
        let refs: Vec<&str> = all.iter().map(String::as_str).collect();
        ProxyProcess::launch(&refs, env)
    }

    /// `--upstream` with the cluster CA.
    fn upstream_args(&self) -> Vec<String> {
        vec![
            "--upstream".to_owned(),
            self.sim.url(),
            "--upstream-ca-file".to_owned(),
            self.cluster_ca_file.display().to_string(),
        ]
    }

    /// A file holding the proxy's own token.
    fn proxy_token_file(&self) -> PathBuf {
        let path = self.path("proxy-token");
        std::fs::write(&path, format!("{PROXY_TOKEN}\n")).unwrap();
        path
    }

    /// A kubeconfig for the proxy at `proxy` with a token and/or a client certificate.
    fn caller(
        &self,
        name: &str,
        proxy: &ProxyProcess,
        token: Option<&str>,
        cert: Option<&Leaf>,
    ) -> PathBuf {
        let server = format!("https://127.0.0.1:{}", proxy.addr.port());
        kubeconfig(
            &self.path(&format!("kubeconfig-{name}")),
            &server,
            &self.proxy_ca.pem,
            token,
            cert,
        )
    }

    fn requests_since(&self, n: usize) -> Vec<SeenRequest> {
        self.sim.requests().into_iter().skip(n).collect()
    }
}

async fn kubectl(k: &Path, kubeconfig: &Path, cwd: &Path, args: &[&str]) -> Output {
    let mut c = std::process::Command::new(k);
    c.arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .current_dir(cwd)
        .env("HOME", cwd)
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null());
    run(c, None, T).await
}

async fn ok(k: &Path, kubeconfig: &Path, cwd: &Path, args: &[&str]) -> String {
    let o = kubectl(k, kubeconfig, cwd, args).await;
    assert!(o.status.success(), "kubectl {args:?}: {}", stderr(&o));
    stdout(&o)
}

async fn whoami(k: &Path, kubeconfig: &Path, cwd: &Path) -> String {
    ok(
        k,
        kubeconfig,
        cwd,
        &[
            "auth",
            "whoami",
            "-o",
            "jsonpath={.status.userInfo.username}",
        ],
    )
    .await
}

/// `kubectl port-forward` to `port`, one echo round trip through it.
async fn port_forward_echo(k: &Path, kubeconfig: &Path, cwd: &Path, port: u16) {
    let mut child = tokio::process::Command::new(k)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args([
            "port-forward",
            "--address",
            "127.0.0.1",
            "pod/web",
            &format!(":{port}"),
        ])
        .current_dir(cwd)
        .env("HOME", cwd)
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let local: u16 = tokio::time::timeout(T, async {
        loop {
            let line = lines
                .next_line()
                .await
                .unwrap()
                .expect("port-forward ended early");
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
    s.write_all(b"through the tunnel").await.unwrap();
    let mut buf = [0u8; 18];
    tokio::time::timeout(T, s.read_exact(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&buf, b"through the tunnel");
    drop(s);
    child.kill().await.unwrap();
}

/// Finished sessions of `kind`, whatever their outcome.
fn sessions(metrics: &str, kind: &str) -> u64 {
    let prefix = format!("kube_ws_proxy_sessions_total{{cluster=\"default\",kind=\"{kind}\",");
    metrics
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Whether the proxy refused the TLS session (an error, or no HTTP answer at all).
fn handshake_refused(result: Result<String, std::io::Error>) -> bool {
    result.map_or(true, |answer| !answer.starts_with("HTTP/"))
}

fn get(path: &str, extra_headers: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{extra_headers}\r\n")
}

fn self_subject_review(extra_headers: &str) -> String {
    let body = r#"{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}"#;
    format!(
        "POST /apis/authentication.k8s.io/v1/selfsubjectreviews HTTP/1.1\r\nHost: x\r\n\
         Connection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{extra_headers}\r\n{body}",
        body.len()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passthrough_tls_both_legs_exec_cp_port_forward_with_the_callers_token() {
    let Some(k) = require_kubectl("1.33") else {
        return;
    };
    let door = Door::new().await;
    let echo = PodServer::echo().await;
    let proxy = door.proxy(&door.upstream_args(), &[]);
    let kc = door.caller("tina", &proxy, Some(TINA), None);
    let cwd = door.dir.path();

    assert_eq!(
        ok(
            &k,
            &kc,
            cwd,
            &["exec", "web", "--", "echo", "over two TLS legs"]
        )
        .await,
        "over two TLS legs\n"
    );
    std::fs::write(door.path("upload.txt"), "copied through the proxy\n").unwrap();
    ok(&k, &kc, cwd, &["cp", "upload.txt", "web:uploaded.txt"]).await;
    assert_eq!(
        std::fs::read_to_string(door.sim.pod_dir("default", "web").join("uploaded.txt")).unwrap(),
        "copied through the proxy\n"
    );
    ok(&k, &kc, cwd, &["cp", "web:uploaded.txt", "downloaded.txt"]).await;
    assert_eq!(
        std::fs::read_to_string(door.path("downloaded.txt")).unwrap(),
        "copied through the proxy\n"
    );
    port_forward_echo(&k, &kc, cwd, echo.port).await;
    assert_eq!(whoami(&k, &kc, cwd).await, "tina");

    // Translated and tunnelled, not relayed.
    let m = proxy.metrics();
    // One exec, and kubectl cp's own execs (a `test -d` probe that may exit 1, then tar; cp may
    // close its side before the final status arrives), so count them whatever their outcome.
    assert!(sessions(&m, "exec") >= 3, "{m}");
    assert!(
        m.contains(r#"kube_ws_proxy_sessions_total{cluster="default",kind="portforward_tunnel""#),
        "{m}"
    );
    // Every request the cluster saw carried tina's own token and nothing added by the proxy.
    let seen = door.sim.requests();
    let paths = |suffix: &str| seen.iter().filter(|r| r.path.ends_with(suffix)).count();
    assert!(
        paths("/exec") >= 3 && paths("/portforward") >= 1,
        "{seen:#?}"
    );
    for r in &seen {
        assert_eq!(
            r.header("authorization"),
            Some(format!("Bearer {TINA}").as_str()),
            "{r:#?}"
        );
        assert_eq!(
            r.user.as_ref().map(|u| u.name.as_str()),
            Some("tina"),
            "{r:#?}"
        );
        assert!(r.header("impersonate-user").is_none() && r.header("x-remote-user").is_none());
        // Plain calls use HTTP/2 end to end (kubectl → proxy → cluster); upgrades HTTP/1.1.
        let want = if r.is_upgrade() {
            "HTTP/1.1"
        } else {
            "HTTP/2.0"
        };
        assert_eq!(r.version, want, "{r:#?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impersonate_mode_client_certificates_and_reviewed_tokens() {
    let Some(k) = require_kubectl("1.33") else {
        return;
    };
    let door = Door::new().await;
    let echo = PodServer::echo().await;
    let mut args = door.upstream_args();
    args.extend([
        "--auth-mode".to_owned(),
        "impersonate".to_owned(),
        "--upstream-token-file".to_owned(),
        door.proxy_token_file().display().to_string(),
    ]);
    let proxy = door.proxy(&args, &[]);
    let cwd = door.dir.path();

    // A client-certificate caller.
    let alice = door.cluster_ca.client("alice", Some("ops"));
    let kc = door.caller("alice", &proxy, None, Some(&alice));
    assert_eq!(whoami(&k, &kc, cwd).await, "alice");
    let env = ok(
        &k,
        &kc,
        cwd,
        &[
            "exec",
            "web",
            "--",
            "sh",
            "-c",
            "echo $SIM_USER $SIM_GROUPS",
        ],
    )
    .await;
    assert!(env.starts_with("alice ") && env.contains("ops"), "{env}");
    port_forward_echo(&k, &kc, cwd, echo.port).await;
    let seen = door.sim.requests();
    assert!(!seen.is_empty());
    for r in &seen {
        assert_eq!(
            r.authenticated_user.as_ref().map(|u| u.name.as_str()),
            Some(PROXY_USER),
            "{r:#?}"
        );
        assert!(r.impersonated, "{r:#?}");
        assert_eq!(
            r.user.as_ref().map(|u| u.name.as_str()),
            Some("alice"),
            "{r:#?}"
        );
        assert!(
            r.user.as_ref().unwrap().groups.iter().any(|g| g == "ops"),
            "{r:#?}"
        );
        assert_eq!(
            r.header("authorization"),
            Some(format!("Bearer {PROXY_TOKEN}").as_str())
        );
    }
    assert!(seen.iter().any(|r| r.path.ends_with("/portforward")));

    // A token caller: reviewed once, then served from the cache.
    let kc_tina = door.caller("tina", &proxy, Some(TINA), None);
    assert_eq!(whoami(&k, &kc_tina, cwd).await, "tina");
    let reviews = door.sim.token_reviews();
    assert!(reviews >= 1);
    assert_eq!(
        ok(
            &k,
            &kc_tina,
            cwd,
            &["exec", "web", "--", "sh", "-c", "echo $SIM_USER"]
        )
        .await,
        "tina\n"
    );
    assert_eq!(
        door.sim.token_reviews(),
        reviews,
        "the review was not cached"
    );
    // The caller's token itself never reached the cluster's request headers.
    for r in door.sim.requests() {
        assert!(r.headers.iter().all(|(_, v)| !v.contains(TINA)), "{r:#?}");
    }

    // Caller impersonation is refused by the proxy; nothing is forwarded.
    let before = door.sim.requests().len();
    let o = kubectl(&k, &kc, cwd, &["get", "pods", "--as", "root"]).await;
    assert!(!o.status.success());
    assert!(stderr(&o).contains("Impersonate"), "{}", stderr(&o));
    // Unauthenticated and bad-token callers get a 401 Status.
    let answer = raw_https(
        proxy.addr,
        &door.proxy_ca.pem,
        None,
        &get("/api/v1/namespaces/default/pods", ""),
    )
    .await
    .unwrap();
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    assert!(answer.contains(r#""reason":"Unauthorized""#), "{answer}");
    let answer = raw_https(
        proxy.addr,
        &door.proxy_ca.pem,
        None,
        &get(
            "/api/v1/namespaces/default/pods",
            "Authorization: Bearer not-a-known-token\r\n",
        ),
    )
    .await
    .unwrap();
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    // Certificates of another CA, or expired ones, fail the handshake.
    let stranger = Ca::new("stranger").client("alice", None);
    let kc_stranger = door.caller("stranger", &proxy, None, Some(&stranger));
    let o = kubectl(&k, &kc_stranger, cwd, &["get", "pods"]).await;
    // With TLS 1.3 the server's verdict on the client certificate arrives after the client's
    // handshake, so kubectl's wording varies ("unknown certificate authority", "http2: client
    // conn could not be established"); the refusal itself does not.
    assert!(!o.status.success(), "{}", stdout(&o));
    assert!(handshake_refused(
        raw_https(
            proxy.addr,
            &door.proxy_ca.pem,
            Some(&stranger),
            &get("/api", "")
        )
        .await
    ));
    let expired = door.cluster_ca.expired_client("alice");
    assert!(handshake_refused(
        raw_https(
            proxy.addr,
            &door.proxy_ca.pem,
            Some(&expired),
            &get("/api", "")
        )
        .await
    ));
    let o = kubectl(
        &k,
        &door.caller("expired", &proxy, None, Some(&expired)),
        cwd,
        &["get", "pods"],
    )
    .await;
    assert!(!o.status.success());
    // Only the proxy's own TokenReview of the unknown token reached the cluster.
    let new: Vec<_> = door
        .requests_since(before)
        .into_iter()
        .filter(|r| !r.path.ends_with("/tokenreviews"))
        .collect();
    assert!(new.is_empty(), "refused requests were forwarded: {new:#?}");
    let m = proxy.metrics();
    assert!(
        m.contains(r#"kube_ws_proxy_auth_rejections_total{cluster="default",reason="impersonation_headers"} 1"#),
        "{m}"
    );
    assert!(
        m.contains(
            r#"kube_ws_proxy_auth_rejections_total{cluster="default",reason="unauthenticated"} 2"#
        ),
        "{m}"
    );
    // No token or certificate in the proxy's log.
    for line in proxy.log_lines() {
        for secret in [TINA, PROXY_TOKEN, "BEGIN"] {
            assert!(!line.contains(secret), "secret in log: {line}");
        }
    }
    assert!(proxy
        .log_lines()
        .iter()
        .any(|l| l.contains(r#""user":"alice""#)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn front_proxy_mode_asserts_the_caller_with_request_headers() {
    let Some(k) = require_kubectl("1.33") else {
        return;
    };
    let door = Door::new().await;
    let echo = PodServer::echo().await;
    let (front_cert, front_key) = door
        .front_ca
        .client(FRONT_PROXY_CN, None)
        .write(door.dir.path(), "front-proxy");
    let mut args = door.upstream_args();
    args.extend([
        "--auth-mode".to_owned(),
        "front-proxy".to_owned(),
        "--front-proxy-client-cert-file".to_owned(),
        front_cert.display().to_string(),
        "--front-proxy-client-key-file".to_owned(),
        front_key.display().to_string(),
        "--upstream-token-file".to_owned(),
        door.proxy_token_file().display().to_string(),
        "--audit-log".to_owned(),
        door.path("audit.log").display().to_string(),
    ]);
    let proxy = door.proxy(&args, &[]);
    let cwd = door.dir.path();

    let alice = door.cluster_ca.client("alice", Some("ops"));
    let kc = door.caller("alice", &proxy, None, Some(&alice));
    assert_eq!(whoami(&k, &kc, cwd).await, "alice");
    assert_eq!(
        ok(
            &k,
            &kc,
            cwd,
            &["exec", "web", "--", "sh", "-c", "echo $SIM_USER"]
        )
        .await,
        "alice\n"
    );
    port_forward_echo(&k, &kc, cwd, echo.port).await;
    // The audit events name the caller the proxy asserted, on the exec and the tunnel.
    for path in ["translated", "tunnel"] {
        let ended = common::replay::ended_event(&door.path("audit.log"), "web", path).await;
        assert_eq!(ended["user"], "alice", "{ended}");
        assert_eq!(ended["groups"], serde_json::json!(["ops"]), "{ended}");
        assert_eq!(ended["identity_source"], "authenticated", "{ended}");
    }
    for r in door.sim.requests() {
        assert_eq!(
            r.authenticated_by,
            Some(AuthenticatedBy::FrontProxy),
            "{r:#?}"
        );
        assert_eq!(
            r.user.as_ref().map(|u| u.name.as_str()),
            Some("alice"),
            "{r:#?}"
        );
        assert!(r.header("authorization").is_none(), "{r:#?}");
        assert_eq!(r.header("x-remote-group"), Some("ops"));
    }

    // Caller copies of the identity headers are stripped.
    let answer = raw_https(
        proxy.addr,
        &door.proxy_ca.pem,
        Some(&alice),
        &self_subject_review("X-Remote-User: mallory\r\nX-Remote-Group: system:masters\r\nX-Remote-Extra-Scopes: all\r\n"),
    )
    .await
    .unwrap();
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
    assert!(answer.contains(r#""username":"alice""#), "{answer}");
    assert!(
        !answer.contains("mallory")
            && !answer.contains("system:masters")
            && !answer.contains("scopes"),
        "{answer}"
    );
    // A caller's own impersonation is authorized by the cluster against alice, who may not.
    let o = kubectl(&k, &kc, cwd, &["get", "pods", "--as", "bob"]).await;
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains(r#"User "alice" cannot impersonate"#),
        "{}",
        stderr(&o)
    );
    // A token caller, reviewed with the proxy's own token.
    let kc_tina = door.caller("tina", &proxy, Some(TINA), None);
    assert_eq!(whoami(&k, &kc_tina, cwd).await, "tina");
    assert!(door.sim.token_reviews() >= 1);
    // Nobody at all: 401.
    let answer = raw_https(
        proxy.addr,
        &door.proxy_ca.pem,
        None,
        &self_subject_review(""),
    )
    .await
    .unwrap();
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
}

/// The `ended` audit event of the session whose command starts with `first`, once written.
async fn ended_by_command(log: &Path, first: &str) -> serde_json::Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let found = text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|e| e["stage"] == "ended" && e["command"][0] == first);
        if let Some(e) = found {
            return e;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no ended event for {first}: {text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn front_proxy_events_name_whom_a_kubectl_as_caller_impersonates() {
    let Some(k33) = require_kubectl("1.33") else {
        return;
    };
    let door = Door::new().await;
    let (front_cert, front_key) = door
        .front_ca
        .client(FRONT_PROXY_CN, None)
        .write(door.dir.path(), "front-proxy");
    let audit_log = door.path("audit.log");
    let mut args = door.upstream_args();
    args.extend([
        "--auth-mode".to_owned(),
        "front-proxy".to_owned(),
        "--front-proxy-client-cert-file".to_owned(),
        front_cert.display().to_string(),
        "--front-proxy-client-key-file".to_owned(),
        front_key.display().to_string(),
        "--audit-log".to_owned(),
        audit_log.display().to_string(),
    ]);
    let proxy = door.proxy(&args, &[]);
    let cwd = door.dir.path();
    // A caller the cluster lets impersonate (by its client certificate), acting as someone
    // else: the proxy asserts the caller, the cluster authorizes the impersonation against it.
    let caller = door.cluster_ca.client(PROXY_CERT_USER, Some("admins"));
    let kc = door.caller("impersonator", &proxy, None, Some(&caller));
    let mut clients = vec![("1.33", k33, vec!["printenv", "SIM_USER"], "translated")];
    if let Some(k28) = require_kubectl("1.28") {
        clients.push((
            "1.28",
            k28,
            vec!["sh", "-c", "echo $SIM_USER"],
            "relay_spdy",
        ));
    }
    for (version, k, command, path) in clients {
        let mut argv = vec!["--as", "someone", "--as-group", "team", "exec", "web", "--"];
        argv.extend(&command);
        let out = ok(&k, &kc, cwd, &argv).await;
        assert!(out.contains("someone"), "kubectl {version}: {out}");
        let ended = ended_by_command(&audit_log, command[0]).await;
        assert_eq!(ended["protocol_path"], path, "kubectl {version}: {ended}");
        assert_eq!(ended["user"], PROXY_CERT_USER, "kubectl {version}: {ended}");
        assert_eq!(ended["groups"], serde_json::json!(["admins"]), "{ended}");
        assert_eq!(ended["identity_source"], "authenticated", "{ended}");
        let asked =
            serde_json::json!({"user": "someone", "uid": null, "groups": ["team"], "extra": {}});
        assert_eq!(
            ended["impersonated_user"], asked,
            "kubectl {version}: {ended}"
        );
        assert_eq!(ended["exit_code"], 0, "kubectl {version}: {ended}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_from_in_cluster_with_token_rotation_and_from_kubeconfig() {
    let Some(k) = require_kubectl("1.33") else {
        return;
    };
    let door = Door::new().await;
    let cwd = door.dir.path();
    let alice = door.cluster_ca.client("alice", None);

    // --in-cluster: the service address from the environment, CA and token from the
    // service-account directory.
    let sa = door.path("serviceaccount");
    std::fs::create_dir(&sa).unwrap();
    std::fs::write(sa.join("ca.crt"), &door.cluster_ca.pem).unwrap();
    std::fs::write(sa.join("token"), PROXY_TOKEN).unwrap();
    let port = door.sim.addr().port().to_string();
    let args = [
        "--in-cluster".to_owned(),
        "--service-account-dir".to_owned(),
        sa.display().to_string(),
        "--auth-mode".to_owned(),
        "impersonate".to_owned(),
    ];
    let proxy = door.proxy(
        &args,
        &[
            ("KUBERNETES_SERVICE_HOST", "127.0.0.1"),
            ("KUBERNETES_SERVICE_PORT", &port),
        ],
    );
    let kc = door.caller("alice-in-cluster", &proxy, None, Some(&alice));
    assert_eq!(whoami(&k, &kc, cwd).await, "alice");
    let last = door.sim.requests().pop().unwrap();
    assert_eq!(
        last.header("authorization"),
        Some(format!("Bearer {PROXY_TOKEN}").as_str())
    );
    // The kubelet rotates the token (written aside, renamed over): the next requests use it.
    let next = sa.join("..token.new");
    std::fs::write(&next, PROXY_TOKEN_ROTATED).unwrap();
    std::fs::rename(&next, sa.join("token")).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        assert_eq!(whoami(&k, &kc, cwd).await, "alice");
        let last = door.sim.requests().pop().unwrap();
        if last.header("authorization") == Some(format!("Bearer {PROXY_TOKEN_ROTATED}").as_str()) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "rotated token never used"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    drop(proxy);

    // --kubeconfig: server, CA and the proxy's own client certificate, all inline.
    let own = door.cluster_ca.client(PROXY_CERT_USER, None);
    let proxy_kc = kubeconfig(
        &door.path("proxy-kubeconfig"),
        &door.sim.url(),
        &door.cluster_ca.pem,
        None,
        Some(&own),
    );
    let args = [
        "--kubeconfig".to_owned(),
        proxy_kc.display().to_string(),
        "--auth-mode".to_owned(),
        "impersonate".to_owned(),
    ];
    let proxy = door.proxy(&args, &[]);
    let kc_tina = door.caller("tina-kubeconfig", &proxy, Some(TINA), None);
    let before = door.sim.requests().len();
    assert_eq!(whoami(&k, &kc_tina, cwd).await, "tina");
    assert_eq!(
        ok(
            &k,
            &kc_tina,
            cwd,
            &["exec", "web", "--", "sh", "-c", "echo $SIM_USER"]
        )
        .await,
        "tina\n"
    );
    let seen = door.requests_since(before);
    assert!(!seen.is_empty());
    for r in &seen {
        assert_eq!(
            r.authenticated_by,
            Some(AuthenticatedBy::ClientCert),
            "{r:#?}"
        );
        assert_eq!(
            r.authenticated_user.as_ref().map(|u| u.name.as_str()),
            Some(PROXY_CERT_USER)
        );
    }
    drop(proxy);

    // A wrong upstream CA: a clear error from the proxy, not a hang.
    let mut args = door.upstream_args();
    args[3] = door
        .proxy_ca
        .write(door.dir.path(), "wrong-ca")
        .display()
        .to_string();
    let proxy = door.proxy(&args, &[]);
    let kc = door.caller("wrong-ca", &proxy, Some(TINA), None);
    let o = kubectl(&k, &kc, cwd, &["get", "pods"]).await;
    assert!(!o.status.success());
    // kubectl's discovery does not print the Status it got. The Status says which step
    // failed; what TLS said (and where the upstream is) goes to the log only: the upstream has
    // authorized nothing yet, so the caller is owed no more than an unauthenticated one.
    let answer = raw_https(
        proxy.addr,
        &door.proxy_ca.pem,
        None,
        &get("/api", &format!("Authorization: Bearer {TINA}\r\n")),
    )
    .await
    .unwrap();
    assert!(answer.starts_with("HTTP/1.1 502"), "{answer}");
    assert!(
        answer.contains(
            "error trying to reach the upstream API server: \
             the TLS handshake with the upstream API server failed"
        ) && !answer.contains("UnknownIssuer"),
        "{answer}"
    );
    let logged = proxy
        .wait_for_log("upstream API server failure", Duration::from_secs(5))
        .expect("the cause is logged");
    assert!(logged.contains("UnknownIssuer"), "{logged}");
    let o = kubectl(&k, &kc, cwd, &["exec", "web", "--", "true"]).await;
    assert!(!o.status.success());
}

/// The manifests mount no service-account token where passthrough runs (it sends no
/// credentials of the proxy's own), only the cluster's CA: `--in-cluster` serves with that, and
/// an identity mode, which needs the token, refuses to start without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_cluster_without_a_mounted_token_serves_passthrough_and_refuses_identity_modes() {
    let Some(k) = require_kubectl("1.33") else {
        return;
    };
    let door = Door::new().await;
    let cwd = door.dir.path();
    let sa = door.path("serviceaccount");
    std::fs::create_dir(&sa).unwrap();
    std::fs::write(sa.join("ca.crt"), &door.cluster_ca.pem).unwrap();
    let port = door.sim.addr().port().to_string();
    let env = [
        ("KUBERNETES_SERVICE_HOST", "127.0.0.1"),
        ("KUBERNETES_SERVICE_PORT", port.as_str()),
    ];
    let in_cluster = |mode: &str| {
        ["--in-cluster", "--service-account-dir"]
            .map(str::to_owned)
            .into_iter()
            .chain([sa.display().to_string(), "--auth-mode".into(), mode.into()])
            .collect::<Vec<_>>()
    };

    // Passthrough: the caller's token upstream, verified with the mounted CA.
    let proxy = door.proxy(&in_cluster("passthrough"), &env);
    let kc = door.caller("tina-in-cluster", &proxy, Some(TINA), None);
    let before = door.sim.requests().len();
    assert_eq!(whoami(&k, &kc, cwd).await, "tina");
    let seen = door.requests_since(before);
    assert!(!seen.is_empty());
    for r in seen {
        assert_eq!(
            r.header("authorization"),
            Some(format!("Bearer {TINA}").as_str())
        );
    }
    drop(proxy);

    for mode in ["impersonate", "front-proxy"] {
        let mut args = in_cluster(mode);
        args.extend(
            [
                "--listen",
                "127.0.0.1:0",
                "--admin-listen",
                "127.0.0.1:0",
                "--front-proxy-client-cert-file",
            ]
            .map(str::to_owned),
        );
        let front = door
            .front_ca
            .client(FRONT_PROXY_CN, None)
            .write(cwd, "front");
        args.push(front.0.display().to_string());
        args.push("--front-proxy-client-key-file".into());
        args.push(front.1.display().to_string());
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, stderr) = run_to_exit_with_env(&refs, &env);
        assert_eq!(code, Some(1), "{mode}: {stderr}");
        assert!(
            stderr.contains("need the service-account token")
                && stderr.contains(&sa.join("token").display().to_string()),
            "{mode}: {stderr}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_upstream_client_certificate_is_used_without_a_restart() {
    let Some(k) = require_kubectl("1.33") else {
        return;
    };
    let door = Door::new().await;
    let cwd = door.dir.path();
    let (cert, key) = door
        .cluster_ca
        .client(PROXY_CERT_USER, None)
        .write(cwd, "own-client");
    let mut args = door.upstream_args();
    args.extend([
        "--auth-mode".to_owned(),
        "impersonate".to_owned(),
        "--upstream-client-cert-file".to_owned(),
        cert.display().to_string(),
        "--upstream-client-key-file".to_owned(),
        key.display().to_string(),
        // One upstream request per exec (no WebSocket attempt first), counted below.
        "--upstream-streaming".to_owned(),
        "spdy".to_owned(),
    ]);
    let proxy = door.proxy(&args, &[]);
    let kc = door.caller("tina", &proxy, Some(TINA), None);
    // Every exec is a new upstream connection, so a new TLS handshake.
    let exec = || {
        ok(
            &k,
            &kc,
            cwd,
            &["exec", "web", "--", "sh", "-c", "echo $SIM_USER"],
        )
    };
    let proxy_identity = |since: usize| -> Vec<String> {
        door.requests_since(since)
            .iter()
            .filter(|r| r.path.ends_with("/exec"))
            .filter_map(|r| r.authenticated_user.as_ref().map(|u| u.name.clone()))
            .collect()
    };
    let before = door.sim.requests().len();
    assert_eq!(exec().await, "tina\n");
    assert_eq!(proxy_identity(before), vec![PROXY_CERT_USER.to_owned()]);

    // Rotated in place, the way cert-manager or a kubelet-style rotation does it.
    door.cluster_ca
        .client(PROXY_CERT_USER_ROTATED, None)
        .write(cwd, "own-client");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let before = door.sim.requests().len();
        assert_eq!(exec().await, "tina\n");
        let seen = proxy_identity(before);
        if seen == vec![PROXY_CERT_USER_ROTATED.to_owned()] {
            break;
        }
        assert_eq!(seen, vec![PROXY_CERT_USER.to_owned()]);
        assert!(
            tokio::time::Instant::now() < deadline,
            "the rotated certificate was never presented; the proxy logged: {:#?}",
            proxy.log_lines()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(proxy
        .log_lines()
        .iter()
        .any(|l| l.contains("upstream client certificate reloaded")));
    // Plain requests too: the pooled connections made with the old certificate (kubectl's
    // GET of the pod before each exec) are replaced.
    let before = door.sim.requests().len();
    assert_eq!(whoami(&k, &kc, cwd).await, "tina");
    let pooled: Vec<_> = door
        .requests_since(before)
        .iter()
        .filter_map(|r| r.authenticated_user.as_ref().map(|u| u.name.clone()))
        .collect();
    assert!(!pooled.is_empty());
    assert!(
        pooled.iter().all(|u| u == PROXY_CERT_USER_ROTATED),
        "{pooled:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_review_the_proxy_cannot_make_is_a_503_not_a_pass() {
    let door = Door::new().await;
    let bad = door.path("bad-proxy-token");
    std::fs::write(&bad, "a-token-the-cluster-does-not-know").unwrap();
    let mut args = door.upstream_args();
    args.extend([
        "--auth-mode".to_owned(),
        "impersonate".to_owned(),
        "--upstream-token-file".to_owned(),
        bad.display().to_string(),
    ]);
    let proxy = door.proxy(&args, &[]);
    let answer = raw_https(
        proxy.addr,
        &door.proxy_ca.pem,
        None,
        &get("/api", &format!("Authorization: Bearer {TINA}\r\n")),
    )
    .await
    .unwrap();
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(
        answer.contains("cannot authenticate the request"),
        "{answer}"
    );
    // Only the review itself reached the cluster (and was refused there).
    let seen = door.sim.requests();
    assert!(
        seen.iter().all(|r| r.path.ends_with("/tokenreviews")),
        "{seen:#?}"
    );
    assert!(proxy
        .wait_for_log("cannot authenticate the caller", Duration::from_secs(5))
        .is_some());
    assert!(proxy
        .metrics()
        .contains(r#"kube_ws_proxy_auth_rejections_total{cluster="default",reason="authentication_unavailable"} 1"#));
}
