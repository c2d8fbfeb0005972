//! The simulated cluster as an authenticating API server: HTTPS, x509 client certificates,
//! request-header (front-proxy) authentication, bearer tokens, impersonation, TokenReview and
//! SelfSubjectReview; the identity reaches exec'd processes over SPDY and WebSocket on TLS;
//! kubectl 1.33 `auth whoami` and `exec` against it.

use crate::common;

use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use common::clients::require_kubectl;
use common::harness::{run, stderr, stdout};
use common::pki::{Ca, Leaf};
use futures_util::StreamExt;
use http::{HeaderMap, HeaderName, HeaderValue, Method};
use kube_ws_proxy::sim::{
    AuthenticatedBy, SimCluster, SimConfig, SimFrontProxy, SimIdentity, SimStartError, SimTls,
    SimUser, AUTHENTICATED_GROUP,
};
use kube_ws_proxy::spdy::frame::HeaderBlock;
use kube_ws_proxy::spdy::proto::{Config, Connection, RecvStream};
use kube_ws_proxy::spdy::upgrade::{read_body, read_response_head, upgrade, UpgradeRequest};
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

const T: Duration = Duration::from_secs(60);
const TINA: &str = "tina-token-3c9e";
const ADMIN: &str = "admin-token-81fa";

/// The cluster's CAs and a cluster that trusts them.
struct Setup {
    sim: SimCluster,
    server_ca: Ca,
    client_ca: Ca,
    front_proxy_ca: Ca,
}

async fn setup() -> Setup {
    let server_ca = Ca::new("serving");
    let client_ca = Ca::new("client");
    let front_proxy_ca = Ca::new("front-proxy");
    let serving = server_ca.server();
    let config = SimConfig {
        tls: Some(SimTls {
            cert_chain_pem: serving.cert_pem,
            private_key_pem: serving.key_pem,
            client_ca_pem: Some(client_ca.pem.clone()),
        }),
        users: vec![
            SimUser {
                token: TINA.into(),
                name: "tina".into(),
                groups: vec!["dev".into()],
            },
            SimUser {
                token: ADMIN.into(),
                name: "admin".into(),
                groups: vec!["system:masters".into()],
            },
        ],
        impersonators: vec!["admin".into()],
        front_proxy: Some(SimFrontProxy {
            allowed_names: vec!["front-proxy".into()],
            ..SimFrontProxy::new(front_proxy_ca.pem.clone())
        }),
        ..SimConfig::default()
    };
    Setup {
        sim: SimCluster::start(config).await.unwrap(),
        server_ca,
        client_ca,
        front_proxy_ca,
    }
}

// ---------------------------------------------------------------------------------------------
// A raw HTTPS client.

/// TLS to the cluster, trusting its CA, offering `alpn`, presenting `client` if given.
async fn tls(
    s: &Setup,
    client: Option<&Leaf>,
    alpn: &[&[u8]],
) -> std::io::Result<TlsStream<TcpStream>> {
    common::tls_client::connect(s.sim.addr(), &s.server_ca.pem, client, alpn).await
}

fn header_map(headers: &[(&str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (n, v) in headers {
        map.append(
            HeaderName::from_bytes(n.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    map
}

/// One HTTP/1.1 request; the status and the body (JSON, or a JSON string for other bodies).
async fn request(
    s: &Setup,
    client: Option<&Leaf>,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> std::io::Result<(u16, Value)> {
    let mut lines = Vec::new();
    for (n, v) in headers {
        lines.extend_from_slice(format!("{n}: {v}\r\n").as_bytes());
    }
    request_raw(s, client, method, path, &lines, body).await
}

/// [`request`] with header lines given as bytes (`Name: value\r\n` each), any bytes at all.
async fn request_raw(
    s: &Setup,
    client: Option<&Leaf>,
    method: &str,
    path: &str,
    header_lines: &[u8],
    body: &str,
) -> std::io::Result<(u16, Value)> {
    let mut io = tls(s, client, &[b"http/1.1"]).await?;
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    )
    .into_bytes();
    head.extend_from_slice(header_lines);
    head.extend_from_slice(b"\r\n");
    head.extend_from_slice(body.as_bytes());
    io.write_all(&head).await?;
    io.flush().await?;
    let (resp, rest) = read_response_head(&mut io)
        .await
        .map_err(std::io::Error::other)?;
    let body = read_body(&mut io, &resp.headers, rest, 1 << 20)
        .await
        .map_err(std::io::Error::other)?;
    let value = serde_json::from_slice(&body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
    Ok((resp.status.as_u16(), value))
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// `POST selfsubjectreviews`: the status code and `status.userInfo`.
async fn whoami(s: &Setup, client: Option<&Leaf>, headers: &[(&str, &str)]) -> (u16, Value) {
    let (code, body) = request(
        s,
        client,
        "POST",
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        headers,
        r#"{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}"#,
    )
    .await
    .unwrap();
    if code == 201 {
        assert_eq!(body["kind"], "SelfSubjectReview", "{body}");
        (code, body["status"]["userInfo"].clone())
    } else {
        (code, body)
    }
}

fn groups(groups: &[&str]) -> Vec<String> {
    groups.iter().map(|g| g.to_string()).collect()
}

// ---------------------------------------------------------------------------------------------
// Authentication and impersonation over HTTPS.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_with_client_certificates_and_an_untrusted_one() {
    let s = setup().await;
    assert!(
        s.sim.url().starts_with("https://127.0.0.1:"),
        "{}",
        s.sim.url()
    );

    // ALPN: h2 for those who offer it, http/1.1 otherwise.
    let io = tls(&s, None, &[b"h2", b"http/1.1"]).await.unwrap();
    assert_eq!(io.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));

    // Without credentials: 401 Status, on every path.
    for path in [
        "/version",
        "/healthz",
        "/api/v1/namespaces/default/pods/p/exec",
    ] {
        let (code, body) = request(&s, None, "GET", path, &[], "").await.unwrap();
        assert_eq!(code, 401, "{path}: {body}");
        assert_eq!(body["reason"], "Unauthorized");
    }
    let last = s.sim.requests().pop().unwrap();
    assert_eq!(
        (last.user, last.authenticated_by, last.impersonated),
        (None, None, false)
    );

    // A client certificate of the client CA: user = CN, groups = O.
    let carol = s.client_ca.client_in_groups("carol", &["dev", "ops"]);
    let (code, info) = whoami(&s, Some(&carol), &[]).await;
    assert_eq!(code, 201, "{info}");
    assert_eq!(info["username"], "carol");
    assert_eq!(info["groups"], json!(["dev", "ops", AUTHENTICATED_GROUP]));
    let seen = s.sim.requests().pop().unwrap();
    assert_eq!(seen.authenticated_by, Some(AuthenticatedBy::ClientCert));
    assert_eq!(
        seen.user,
        Some(SimIdentity {
            name: "carol".into(),
            groups: groups(&["dev", "ops", AUTHENTICATED_GROUP]),
            extra: Default::default(),
        })
    );
    let (code, _) = request(&s, Some(&carol), "GET", "/version", &[], "")
        .await
        .unwrap();
    assert_eq!(code, 200);

    // A certificate from a CA the cluster does not know fails the handshake: no answer.
    let rogue = Ca::new("rogue").client_in_groups("carol", &["dev"]);
    let refused = request(&s, Some(&rogue), "GET", "/version", &[], "").await;
    assert!(refused.is_err(), "{refused:?}");

    s.sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn front_proxy_headers_count_only_with_the_front_proxy_certificate() {
    let s = setup().await;
    let remote = [
        ("X-Remote-User", "fp-alice"),
        ("X-Remote-Group", "g1"),
        ("X-Remote-Group", "g2"),
        ("X-Remote-Extra-Scopes", "read"),
        ("X-Remote-Extra-Scopes", "write"),
        ("X-Remote-Extra-Acme.com%2FTeam", "blue"),
    ];

    let front = s.front_proxy_ca.client_in_groups("front-proxy", &[]);
    let (code, info) = whoami(&s, Some(&front), &remote).await;
    assert_eq!(code, 201, "{info}");
    assert_eq!(info["username"], "fp-alice");
    assert_eq!(info["groups"], json!(["g1", "g2", AUTHENTICATED_GROUP]));
    assert_eq!(
        info["extra"],
        json!({"scopes": ["read", "write"], "acme.com/team": ["blue"]})
    );
    let seen = s.sim.requests().pop().unwrap();
    assert_eq!(seen.authenticated_by, Some(AuthenticatedBy::FrontProxy));
    assert_eq!(seen.header("x-remote-user"), Some("fp-alice"));

    // The front proxy's certificate without a user header: that authenticator does not
    // apply, and the certificate is no client-CA certificate either.
    let (code, _) = whoami(&s, Some(&front), &[("X-Remote-Group", "g1")]).await;
    assert_eq!(code, 401);
    let auth = bearer(TINA);
    let (code, info) = whoami(
        &s,
        Some(&front),
        &[("X-Remote-Group", "g1"), ("Authorization", &auth)],
    )
    .await;
    assert_eq!((code, info["username"].as_str()), (201, Some("tina")));

    // X-Remote-* without the front-proxy certificate are ignored: a token...
    let mut with_token = remote.to_vec();
    with_token.push(("Authorization", &auth));
    let (code, info) = whoami(&s, None, &with_token).await;
    assert_eq!(code, 201);
    assert_eq!(info["username"], "tina");
    assert_eq!(info["groups"], json!(["dev", AUTHENTICATED_GROUP]));
    assert!(info.get("extra").is_none(), "{info}");
    // ... a client-CA certificate (even one named like the front proxy) ...
    let lookalike = s.client_ca.client_in_groups("front-proxy", &[]);
    let (code, info) = whoami(&s, Some(&lookalike), &remote).await;
    assert_eq!(
        (code, info["username"].as_str()),
        (201, Some("front-proxy"))
    );
    // ... or nothing at all.
    let (code, _) = whoami(&s, None, &remote).await;
    assert_eq!(code, 401);

    // A front-proxy CA certificate whose CN is not allowed is not trusted.
    let intruder = s.front_proxy_ca.client_in_groups("intruder", &[]);
    let (code, _) = whoami(&s, Some(&intruder), &remote).await;
    assert_eq!(code, 401);
    s.sim.shutdown().await;
}

/// `POST selfsubjectreviews` with raw header lines: the status code and `status.userInfo`.
async fn whoami_raw(s: &Setup, client: Option<&Leaf>, header_lines: &[u8]) -> (u16, Value) {
    let (code, body) = request_raw(
        s,
        client,
        "POST",
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        header_lines,
        r#"{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}"#,
    )
    .await
    .unwrap();
    (code, body["status"]["userInfo"].clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_headers_with_bytes_above_0x7f_count_as_go_reads_them() {
    // Go's net/http keeps such bytes in the header's string and `Header.Get` returns them, so
    // kube-apiserver impersonates "josé" and trusts a front proxy's "zoë"; bytes that are not
    // UTF-8 show as U+FFFD in its JSON.
    let s = setup().await;
    let admin = bearer(ADMIN);
    let mut lines = format!("Authorization: {admin}\r\n").into_bytes();
    lines.extend_from_slice("Impersonate-User: jos\u{e9}\r\n".as_bytes());
    lines.extend_from_slice(b"Impersonate-Group: \xe9quipe\r\n");
    lines.extend_from_slice("Impersonate-Extra-Site: Z\u{fc}rich\r\n".as_bytes());
    let (code, info) = whoami_raw(&s, None, &lines).await;
    assert_eq!(code, 201, "{info}");
    assert_eq!(
        info,
        json!({"username": "jos\u{e9}", "groups": ["\u{fffd}quipe", AUTHENTICATED_GROUP], "extra": {"site": ["Z\u{fc}rich"]}})
    );
    let seen = s.sim.requests().pop().unwrap();
    assert!(seen.impersonated);
    assert_eq!(seen.authenticated_user.unwrap().name, "admin");

    // The same bytes from a caller who may not impersonate: refused, not ignored.
    let mut lines = format!("Authorization: {}\r\n", bearer(TINA)).into_bytes();
    lines.extend_from_slice(b"Impersonate-User: \xe9ve\r\n");
    let (code, _) = whoami_raw(&s, None, &lines).await;
    assert_eq!(code, 403);

    // Request-header authentication from the front proxy.
    let front = s.front_proxy_ca.client_in_groups("front-proxy", &[]);
    let mut lines = "X-Remote-User: zo\u{eb}\r\n".as_bytes().to_vec();
    lines.extend_from_slice(b"X-Remote-Group: r\xf4le\r\n");
    lines.extend_from_slice("X-Remote-Extra-Team: caf\u{e9}\r\n".as_bytes());
    let (code, info) = whoami_raw(&s, Some(&front), &lines).await;
    assert_eq!(code, 201, "{info}");
    assert_eq!(
        info,
        json!({"username": "zo\u{eb}", "groups": ["r\u{fffd}le", AUTHENTICATED_GROUP], "extra": {"team": ["caf\u{e9}"]}})
    );
    let (code, _) = whoami_raw(&s, Some(&front), b"X-Remote-User: \xff\r\n").await;
    assert_eq!(
        code, 201,
        "a user of one byte that is not UTF-8 is still a user"
    );
    s.sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_impersonation_and_token_reviews() {
    let s = setup().await;
    let tina = bearer(TINA);
    let admin = bearer(ADMIN);

    let (code, info) = whoami(&s, None, &[("Authorization", &tina)]).await;
    assert_eq!(code, 201);
    assert_eq!(info["username"], "tina");
    assert_eq!(info["groups"], json!(["dev", AUTHENTICATED_GROUP]));
    let seen = s.sim.requests().pop().unwrap();
    assert_eq!(seen.authenticated_by, Some(AuthenticatedBy::Token));
    assert!(!seen.impersonated);
    let (code, _) = whoami(&s, None, &[("Authorization", "Bearer wrong")]).await;
    assert_eq!(code, 401);

    // An impersonator acts as someone else.
    let (code, info) = whoami(
        &s,
        None,
        &[
            ("Authorization", &admin),
            ("Impersonate-User", "alice"),
            ("Impersonate-Group", "qa"),
            ("Impersonate-Group", "eu"),
            ("Impersonate-Extra-Reason%20Code", "audit"),
        ],
    )
    .await;
    assert_eq!(code, 201, "{info}");
    assert_eq!(
        info,
        json!({"username": "alice", "groups": ["qa", "eu", AUTHENTICATED_GROUP], "extra": {"reason code": ["audit"]}})
    );
    let seen = s.sim.requests().pop().unwrap();
    assert!(seen.impersonated);
    assert_eq!(seen.user.unwrap().name, "alice");
    assert_eq!(seen.authenticated_user.unwrap().name, "admin");
    assert_eq!(seen.authenticated_by, Some(AuthenticatedBy::Token));

    // Anyone else is refused with kube-apiserver's wording.
    let (code, status) = whoami(
        &s,
        None,
        &[("Authorization", &tina), ("Impersonate-User", "alice")],
    )
    .await;
    assert_eq!(code, 403);
    assert_eq!(status["kind"], "Status");
    assert_eq!(status["reason"], "Forbidden");
    assert_eq!(
        status["message"],
        r#"users "alice" is forbidden: User "tina" cannot impersonate resource "users" in API group "" at the cluster scope"#
    );
    assert_eq!(status["details"], json!({"name": "alice", "kind": "users"}));
    let seen = s.sim.requests().pop().unwrap();
    assert_eq!(seen.user, None);
    assert_eq!(seen.authenticated_user.unwrap().name, "tina");

    // Groups without a user: 400.
    let (code, status) = whoami(
        &s,
        None,
        &[("Authorization", &admin), ("Impersonate-Group", "qa")],
    )
    .await;
    assert_eq!(code, 400, "{status}");
    assert_eq!(status["reason"], "BadRequest");

    // TokenReview: known and unknown tokens, counted.
    assert_eq!(s.sim.token_reviews(), 0);
    let review = |token: &str| {
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}})
            .to_string()
    };
    let path = "/apis/authentication.k8s.io/v1/tokenreviews";
    let (code, body) = request(
        &s,
        None,
        "POST",
        path,
        &[("Authorization", &admin)],
        &review(TINA),
    )
    .await
    .unwrap();
    assert_eq!(code, 201, "{body}");
    assert_eq!(body["kind"], "TokenReview");
    assert_eq!(body["spec"]["token"], TINA);
    assert_eq!(
        body["status"],
        json!({"authenticated": true, "user": {"username": "tina", "groups": ["dev", AUTHENTICATED_GROUP]}})
    );
    let (code, body) = request(
        &s,
        None,
        "POST",
        path,
        &[("Authorization", &admin)],
        &review("nope"),
    )
    .await
    .unwrap();
    assert_eq!(code, 201);
    assert_eq!(body["status"]["authenticated"], false);
    assert!(body["status"]["error"].as_str().is_some(), "{body}");
    assert_eq!(s.sim.token_reviews(), 2);
    // The caller must be authenticated itself.
    let (code, _) = request(&s, None, "POST", path, &[], &review(TINA))
        .await
        .unwrap();
    assert_eq!(code, 401);
    assert_eq!(s.sim.token_reviews(), 2);

    // Discovery lists the group.
    let (code, body) = request(&s, None, "GET", "/apis", &[("Authorization", &tina)], "")
        .await
        .unwrap();
    assert_eq!(code, 200);
    assert_eq!(body["groups"][0]["name"], "authentication.k8s.io");
    s.sim.shutdown().await;
}

#[tokio::test]
async fn configuration_errors() {
    let fp = SimConfig {
        front_proxy: Some(SimFrontProxy::new(Ca::new("fp").pem.clone())),
        ..SimConfig::default()
    };
    assert!(matches!(
        SimCluster::start(fp).await,
        Err(SimStartError::FrontProxyWithoutTls)
    ));
    let bad = SimConfig {
        tls: Some(SimTls {
            cert_chain_pem: "not pem".into(),
            private_key_pem: String::new(),
            client_ca_pem: None,
        }),
        ..SimConfig::default()
    };
    assert!(matches!(
        SimCluster::start(bad).await,
        Err(SimStartError::Tls(_))
    ));
}

// ---------------------------------------------------------------------------------------------
// The identity inside exec'd processes; streaming over TLS.

fn exec_query(script: &str) -> String {
    let enc: String = url::form_urlencoded::byte_serialize(script.as_bytes()).collect();
    format!("command=sh&command=-c&command={enc}&stdout=true")
}

/// An exec over SPDY/3.1 on TLS: stdout and the status.
async fn spdy_exec(
    s: &Setup,
    client: Option<&Leaf>,
    headers: &[(&str, &str)],
    script: &str,
) -> (String, Value) {
    let io = tls(s, client, &[b"http/1.1"]).await.unwrap();
    let req = UpgradeRequest {
        method: Method::POST,
        path_and_query: format!(
            "/api/v1/namespaces/default/pods/web/exec?{}",
            exec_query(script)
        ),
        host: s.sim.addr().to_string(),
        headers: header_map(headers),
        protocols: vec!["v4.channel.k8s.io".into()],
    };
    let up = upgrade(io, &req).await.unwrap();
    assert_eq!(up.protocol.as_deref(), Some("v4.channel.k8s.io"));
    let conn = Connection::client(up.io, up.leftover, Config::default());
    let open = |kind: &str| {
        let mut h = HeaderBlock::new();
        h.push("streamtype", kind);
        h
    };
    let (_, mut error) = conn.open_stream(open("error")).await.unwrap().split();
    let (_, mut out) = conn.open_stream(open("stdout")).await.unwrap().split();
    let stdout = String::from_utf8(drain(&mut out).await).unwrap();
    let status = serde_json::from_slice(&drain(&mut error).await).unwrap();
    conn.close().await;
    (stdout, status)
}

async fn drain(rx: &mut RecvStream) -> Vec<u8> {
    let mut all = Vec::new();
    while let Some(chunk) = tokio::time::timeout(T, rx.recv()).await.unwrap() {
        all.extend_from_slice(&chunk.unwrap());
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_and_port_forward_over_tls_carry_the_identity() {
    let s = setup().await;
    let script = "echo \"$SIM_USER|$SIM_GROUPS\"";

    // SPDY, client certificate.
    let carol = s.client_ca.client_in_groups("carol", &["dev", "ops"]);
    let (out, status) = spdy_exec(&s, Some(&carol), &[], script).await;
    assert_eq!(out, "carol|dev,ops,system:authenticated\n");
    assert_eq!(status["status"], "Success");

    // SPDY, token plus impersonation: the process runs as the impersonated user.
    let admin = bearer(ADMIN);
    let (out, _) = spdy_exec(
        &s,
        None,
        &[
            ("Authorization", &admin),
            ("Impersonate-User", "alice"),
            ("Impersonate-Group", "qa"),
        ],
        script,
    )
    .await;
    assert_eq!(out, "alice|qa,system:authenticated\n");

    // Legacy WebSocket, token in the bearer subprotocol entry.
    let io = tls(&s, None, &[b"http/1.1"]).await.unwrap();
    let mut req = format!(
        "wss://{}/api/v1/namespaces/default/pods/web/exec?{}",
        s.sim.addr(),
        exec_query(script)
    )
    .into_client_request()
    .unwrap();
    let token = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(TINA);
    req.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        format!("v4.channel.k8s.io, base64url.bearer.authorization.k8s.io.{token}")
            .parse()
            .unwrap(),
    );
    let (mut ws, resp) = tokio_tungstenite::client_async(req, io).await.unwrap();
    assert_eq!(
        resp.headers()["sec-websocket-protocol"],
        "v4.channel.k8s.io"
    );
    let mut out = Vec::new();
    let mut status = Vec::new();
    while let Some(msg) = tokio::time::timeout(T, ws.next()).await.unwrap() {
        match msg.unwrap() {
            Message::Binary(d) if d.first() == Some(&1) => out.extend_from_slice(&d[1..]),
            Message::Binary(d) if d.first() == Some(&3) => status.extend_from_slice(&d[1..]),
            Message::Close(_) => break,
            _ => {}
        }
    }
    assert_eq!(
        String::from_utf8(out).unwrap(),
        "tina|dev,system:authenticated\n"
    );
    let status: Value = serde_json::from_slice(&status).unwrap();
    assert_eq!(status["status"], "Success");

    // Port-forward over SPDY on TLS.
    let pod = common::pod_server::PodServer::echo().await;
    let io = tls(&s, Some(&carol), &[b"http/1.1"]).await.unwrap();
    let req = UpgradeRequest {
        method: Method::POST,
        path_and_query: "/api/v1/namespaces/default/pods/web/portforward".into(),
        host: s.sim.addr().to_string(),
        headers: HeaderMap::new(),
        protocols: vec!["portforward.k8s.io".into()],
    };
    let up = upgrade(io, &req).await.unwrap();
    let conn = Connection::client(up.io, up.leftover, Config::default());
    let open = |kind: &str| {
        let mut h = HeaderBlock::new();
        h.push("streamtype", kind);
        h.push("port", pod.port.to_string());
        h.push("requestid", "0");
        h
    };
    let _error = conn.open_stream(open("error")).await.unwrap();
    let (mut tx, mut rx) = conn.open_stream(open("data")).await.unwrap().split();
    tx.send(Bytes::from_static(b"through tls")).await.unwrap();
    tx.finish().await.unwrap();
    assert_eq!(drain(&mut rx).await, b"through tls");
    conn.close().await;
    s.sim.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// kubectl 1.33.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_1_33_whoami_and_exec_over_tls() {
    let Some(k) = require_kubectl("1.33") else {
        return;
    };
    let s = setup().await;
    let dir = tempfile::tempdir().unwrap();
    let ca = base64::engine::general_purpose::STANDARD.encode(s.server_ca.pem.clone());
    let cfg = dir.path().join("kubeconfig");
    std::fs::write(
        &cfg,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    \
             certificate-authority-data: {ca}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    \
             user: u\n    namespace: default\ncurrent-context: c\nusers:\n- name: u\n  user:\n    \
             token: {TINA}\n",
            s.sim.url()
        ),
    )
    .unwrap();
    let kubectl = |cfg: &std::path::Path, args: &[&str]| {
        let mut c = std::process::Command::new(&k);
        c.arg("--kubeconfig")
            .arg(cfg)
            .args(args)
            .env("HOME", dir.path())
            .env_remove("KUBECONFIG");
        c
    };

    let o = run(kubectl(&cfg, &["auth", "whoami", "-o", "json"]), None, T).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let review: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(review["status"]["userInfo"]["username"], "tina");
    assert_eq!(
        review["status"]["userInfo"]["groups"],
        json!(["dev", AUTHENTICATED_GROUP])
    );
    let o = run(kubectl(&cfg, &["auth", "whoami"]), None, T).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("tina"), "{}", stdout(&o));

    // Exec: kubectl's WebSocket attempt is refused, it falls back to SPDY, over TLS.
    let o = run(
        kubectl(
            &cfg,
            &[
                "exec",
                "web",
                "--",
                "sh",
                "-c",
                "echo \"$SIM_USER|$SIM_GROUPS\"",
            ],
        ),
        None,
        T,
    )
    .await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "tina|dev,system:authenticated\n");

    // The cluster's own kubeconfig works too (serving chain as the CA, the first user's token).
    let own = dir.path().join("own-kubeconfig");
    std::fs::write(&own, s.sim.kubeconfig()).unwrap();
    let o = run(kubectl(&own, &["get", "pod", "web", "-o", "name"]), None, T).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "pod/web\n");
    s.sim.shutdown().await;
}
