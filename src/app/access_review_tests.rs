//! The sessions API's authorization as the proxy wires it for each auth mode, against a
//! simulated cluster over HTTP: the cluster is built from command-line flags as `serve`
//! builds it, and its `access_reviews` asked as the sessions API asks them.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;

use clap::Parser;
use http::header::{self, HeaderMap};
use http::StatusCode;
use http_body_util::BodyExt;

use crate::cli::Cli;
use crate::proxy::auth::access_attributes::RECORDING_SUBRESOURCE;
use crate::proxy::auth::access_review::answer;
use crate::proxy::auth::{AccessAttributes, AccessReviewError, Caller, Identity, SessionVerb};
use crate::proxy::route::cluster::Cluster;
use crate::proxy::sessions::registry::Sessions;
use crate::sim::{SimAccessRule, SimCluster, SimConfig, SimReviewKind, SimSubject, SimUser};

const PROXY_USER: &str = "kube-ws-proxy";
const PROXY_TOKEN: &str = "proxy-token";
const GROUP: &str = "kube-ws-proxy.io";
const LOCAL: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

fn user(token: &str, name: &str, groups: &[&str]) -> SimUser {
    SimUser {
        token: token.into(),
        name: name.into(),
        groups: groups.iter().map(|g| g.to_string()).collect(),
    }
}

/// Alice views sessions everywhere; the team-a admins (carol) do anything with them in
/// team-a; bob may do nothing.
fn policy() -> Vec<SimAccessRule> {
    vec![
        SimAccessRule::cluster_wide(
            SimSubject::User("alice".into()),
            GROUP,
            &["sessions"],
            &["list", "watch", "get"],
        ),
        SimAccessRule::cluster_wide(
            SimSubject::Group("team-a-admins".into()),
            GROUP,
            &["sessions", "sessions/recording"],
            &["*"],
        )
        .in_namespace("team-a"),
    ]
}

async fn sim() -> SimCluster {
    SimCluster::start(SimConfig {
        users: vec![
            user(PROXY_TOKEN, PROXY_USER, &[]),
            user("alice-token", "alice", &["dev"]),
            user("bob-token", "bob", &[]),
            user("carol-token", "carol", &["team-a-admins"]),
        ],
        access_reviewers: vec![PROXY_USER.into()],
        access_policy: policy(),
        ..SimConfig::default()
    })
    .await
    .unwrap()
}

/// The unnamed cluster `serve` builds from `flags` (the proxy's token always given: in
/// passthrough it must not be used).
fn cluster(url: &str, mode: &str, dir: &Path, flags: &[&str]) -> Arc<Cluster> {
    let token = dir.join("token");
    std::fs::write(&token, PROXY_TOKEN).unwrap();
    let mut argv = vec![
        "kube-ws-proxy".to_owned(),
        "--upstream".into(),
        url.into(),
        "--auth-mode".into(),
        mode.into(),
        "--upstream-token-file".into(),
        token.display().to_string(),
    ];
    argv.extend(flags.iter().map(|f| f.to_string()));
    if mode == "front-proxy" {
        let (cert, key) = front_proxy_certificate(dir);
        argv.extend([
            "--front-proxy-client-cert-file".into(),
            cert,
            "--front-proxy-client-key-file".into(),
            key,
        ]);
    }
    let args = Cli::try_parse_from(argv).unwrap().serve;
    let (fleet, _) = super::clusters::fleet_from_args(&args, &Sessions::new(None)).unwrap();
    fleet.unnamed().unwrap().clone()
}

fn front_proxy_certificate(dir: &Path) -> (String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec![]).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "front-proxy");
    let cert = params.self_signed(&key).unwrap();
    let (c, k) = (dir.join("fp.crt"), dir.join("fp.key"));
    std::fs::write(&c, cert.pem()).unwrap();
    std::fs::write(&k, key.serialize_pem()).unwrap();
    (c.display().to_string(), k.display().to_string())
}

fn identified(name: &str, groups: &[&str]) -> Caller {
    let groups = groups.iter().map(|g| g.to_string()).collect();
    Caller::Identified {
        identity: Arc::new(Identity::new(name, groups, BTreeMap::new()).unwrap()),
        impersonating: None,
        address: LOCAL,
    }
}

fn passthrough() -> Caller {
    Caller::Passthrough {
        bearer: None,
        impersonating: None,
        address: LOCAL,
    }
}

fn bearer(token: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(
        header::AUTHORIZATION,
        format!("Bearer {token}").parse().unwrap(),
    );
    h
}

fn list(namespace: Option<&str>) -> AccessAttributes {
    AccessAttributes {
        verb: SessionVerb::List,
        namespace: namespace.map(str::to_owned),
        subresource: None,
        name: None,
    }
}

fn on_session(verb: SessionVerb, ns: &str, sub: Option<&'static str>) -> AccessAttributes {
    AccessAttributes {
        verb,
        namespace: Some(ns.into()),
        subresource: sub,
        name: Some("s-1".into()),
    }
}

async fn body(resp: http::Response<crate::proxy::wire::body::ProxyBody>) -> (StatusCode, String) {
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}

/// Impersonate and front-proxy modes: SubjectAccessReviews made with the proxy's own
/// credentials about the caller; allowed, denied (kube-apiserver's 403), cached.
#[tokio::test]
async fn identified_callers_are_reviewed_with_the_proxys_credentials() {
    for mode in ["impersonate", "front-proxy"] {
        let sim = sim().await;
        let dir = tempfile::tempdir().unwrap();
        let cluster = cluster(&sim.url(), mode, dir.path(), &[]);
        let reviews = &cluster.access_reviews;
        let alice = identified("alice", &["dev"]);
        let none = HeaderMap::new();
        for _ in 0..2 {
            let d = reviews.authorize(&alice, &none, &list(None)).await.unwrap();
            assert!(d.allowed, "{mode}: {d:?}");
            assert!(answer(&Ok(d), &list(None)).is_none());
        }
        // Two calls, one review: the second came from the cache.
        let seen = sim.access_reviews();
        assert_eq!(seen.len(), 1, "{mode}: {seen:?}");
        assert_eq!(seen[0].kind, SimReviewKind::Subject);
        assert_eq!(seen[0].made_by, PROXY_USER);
        assert_eq!(seen[0].subject.name, "alice");
        assert!(seen[0].subject.groups.contains(&"dev".to_owned()));
        assert_eq!(
            (
                seen[0].verb.as_str(),
                seen[0].resource.as_str(),
                seen[0].group.as_str()
            ),
            ("list", "sessions", GROUP)
        );

        let attrs = on_session(SessionVerb::Delete, "team-a", None);
        let outcome = reviews.authorize(&alice, &none, &attrs).await;
        assert!(!outcome.as_ref().unwrap().allowed, "{mode}");
        let (code, text) = body(answer(&outcome, &attrs).unwrap()).await;
        assert_eq!(code, StatusCode::FORBIDDEN);
        assert!(
            text.contains(r#""message":"sessions.kube-ws-proxy.io \"s-1\" is forbidden: User \"alice\" cannot delete resource \"sessions\" in API group \"kube-ws-proxy.io\" in the namespace \"team-a\"""#),
            "{mode}: {text}"
        );
        sim.shutdown().await;
    }
}

/// A namespace admin (a RoleBinding in team-a) ends and replays sessions there, nowhere else;
/// a viewer without `get` on `sessions/recording` does not see output.
#[tokio::test]
async fn a_namespace_admin_acts_in_their_namespace_only() {
    let sim = sim().await;
    let dir = tempfile::tempdir().unwrap();
    let cluster = cluster(&sim.url(), "impersonate", dir.path(), &[]);
    let reviews = &cluster.access_reviews;
    let carol = identified("carol", &["team-a-admins"]);
    let none = HeaderMap::new();
    let allowed = |attrs: AccessAttributes, caller: Caller| {
        let none = none.clone();
        async move {
            reviews
                .authorize(&caller, &none, &attrs)
                .await
                .unwrap()
                .allowed
        }
    };
    assert!(
        allowed(
            on_session(SessionVerb::Delete, "team-a", None),
            carol.clone()
        )
        .await
    );
    let recording = on_session(SessionVerb::Get, "team-a", Some(RECORDING_SUBRESOURCE));
    assert!(allowed(recording.clone(), carol.clone()).await);
    assert!(
        !allowed(
            on_session(SessionVerb::Delete, "team-b", None),
            carol.clone()
        )
        .await
    );
    assert!(!allowed(list(None), carol.clone()).await);
    assert!(!allowed(recording, identified("alice", &["dev"])).await);
    sim.shutdown().await;
}

/// Passthrough: SelfSubjectAccessReviews with the caller's own token; the proxy's token never
/// goes to the authorization API; a denial names the caller as the cluster knows them.
#[tokio::test]
async fn passthrough_callers_are_reviewed_with_their_own_credentials() {
    let sim = sim().await;
    let dir = tempfile::tempdir().unwrap();
    let cluster = cluster(&sim.url(), "passthrough", dir.path(), &[]);
    let reviews = &cluster.access_reviews;
    let caller = passthrough();
    for _ in 0..2 {
        let d = reviews
            .authorize(&caller, &bearer("alice-token"), &list(Some("team-a")))
            .await
            .unwrap();
        assert!(d.allowed, "{d:?}");
    }
    let attrs = list(Some("team-a"));
    let outcome = reviews
        .authorize(&caller, &bearer("bob-token"), &attrs)
        .await;
    let (code, text) = body(answer(&outcome, &attrs).unwrap()).await;
    assert_eq!(code, StatusCode::FORBIDDEN);
    assert!(
        text.contains(r#"sessions.kube-ws-proxy.io is forbidden: User \"bob\" cannot list resource \"sessions\" in API group \"kube-ws-proxy.io\" in the namespace \"team-a\""#),
        "{text}"
    );
    // A token the cluster does not know: 401, as any of its requests would get.
    let unknown = reviews
        .authorize(&caller, &bearer("nobody"), &attrs)
        .await
        .unwrap_err();
    assert!(matches!(unknown, AccessReviewError::Unauthenticated));
    assert_eq!(unknown.response().status(), StatusCode::UNAUTHORIZED);

    let seen = sim.access_reviews();
    let made_by: Vec<_> = seen.iter().map(|r| (r.kind, r.made_by.as_str())).collect();
    assert_eq!(
        made_by,
        [
            (SimReviewKind::SelfSubject, "alice"),
            (SimReviewKind::SelfSubject, "bob")
        ]
    );
    let own = format!("Bearer {PROXY_TOKEN}");
    let proxys = sim
        .requests()
        .into_iter()
        .filter(|r| r.header("authorization") == Some(own.as_str()));
    assert_eq!(proxys.count(), 0, "the proxy's token was used");
    sim.shutdown().await;
}

/// A cluster that cannot decide never allows: the proxy lacking `create
/// subjectaccessreviews`, and the upstream gone, are 503 Statuses.
#[tokio::test]
async fn a_review_that_fails_is_not_allowed() {
    let sim = SimCluster::start(SimConfig {
        users: vec![user(PROXY_TOKEN, PROXY_USER, &[])],
        access_policy: policy(),
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let without_rbac = cluster(&sim.url(), "impersonate", dir.path(), &[]);
    let alice = identified("alice", &["dev"]);
    let attrs = list(None);
    let refused = without_rbac
        .access_reviews
        .authorize(&alice, &HeaderMap::new(), &attrs)
        .await;
    let Err(e @ AccessReviewError::Refused { .. }) = &refused else {
        panic!("{refused:?}")
    };
    assert!(e.to_string().contains("cannot create resource"), "{e}");
    let (code, text) = body(answer(&refused, &attrs).unwrap()).await;
    assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
    assert!(text.contains("refused with HTTP 403"), "{text}");
    // What the API server said about the proxy's credentials stays in the log.
    assert!(!text.contains("cannot create resource"), "{text}");

    let url = sim.url();
    sim.shutdown().await;
    let gone = cluster(&url, "passthrough", dir.path(), &[]);
    let failed = gone
        .access_reviews
        .authorize(&passthrough(), &bearer("alice-token"), &attrs)
        .await;
    assert!(
        matches!(failed, Err(AccessReviewError::Request { .. })),
        "{failed:?}"
    );
    assert_eq!(
        answer(&failed, &attrs).unwrap().status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
}

/// Reviews are charged to the caller's address with the TokenReview budget: past the burst,
/// 429 with Retry-After; cached decisions cost nothing.
#[tokio::test]
async fn reviews_are_bounded_per_caller() {
    let sim = sim().await;
    let dir = tempfile::tempdir().unwrap();
    let flags = ["--token-review-burst", "2", "--token-review-rate", "0.01"];
    let cluster = cluster(&sim.url(), "impersonate", dir.path(), &flags);
    let reviews = &cluster.access_reviews;
    let alice = identified("alice", &["dev"]);
    let none = HeaderMap::new();
    for ns in ["a", "b"] {
        assert!(reviews
            .authorize(&alice, &none, &list(Some(ns)))
            .await
            .is_ok());
    }
    let limited = reviews.authorize(&alice, &none, &list(Some("c"))).await;
    assert!(matches!(limited, Err(AccessReviewError::RateLimited)));
    let resp = answer(&limited, &list(Some("c"))).unwrap();
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(resp.headers()[header::RETRY_AFTER], "1");
    // Still answered from the cache.
    assert!(
        reviews
            .authorize(&alice, &none, &list(Some("a")))
            .await
            .unwrap()
            .allowed
    );
    // Another address has its own budget.
    let elsewhere = Caller::Identified {
        identity: Arc::new(Identity::new("alice", vec!["dev".into()], BTreeMap::new()).unwrap()),
        impersonating: None,
        address: "10.0.0.9".parse().unwrap(),
    };
    assert!(reviews
        .authorize(&elsewhere, &none, &list(Some("c")))
        .await
        .is_ok());
    assert_eq!(sim.access_reviews().len(), 3);
    sim.shutdown().await;
}
