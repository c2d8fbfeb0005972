//! The sessions API (`/apis/kube-ws-proxy.io/v1/sessions`) with real kubectl on both sides:
//! kubectl 1.33 runs a session, operators use `kubectl get --raw` and `kubectl delete --raw`
//! with their own kubeconfigs, and the simulated cluster decides with its RBAC policy
//! (SelfSubjectAccessReviews with the caller's token in passthrough mode,
//! SubjectAccessReviews with the proxy's in impersonate mode). A terminated session's kubectl
//! prints who ended it and why and exits non-zero; its audit `ended` event names them; the
//! pod's process ends.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use common::clients::require_kubectl;
use common::harness::stderr;
use common::pki::{kubeconfig, Ca, Leaf};
use common::proxy_process::ProxyProcess;
use kube_ws_proxy::sim::{
    SimAccessRule, SimCluster, SimConfig, SimEvent, SimReviewKind, SimSubject, SimUser,
};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};

const T: Duration = Duration::from_secs(60);
const TINA: &str = "tina-token-sessions-1";
const OLGA: &str = "olga-token-sessions-2";
const VIC: &str = "vic-token-sessions-3";
const PROXY_TOKEN: &str = "proxy-token-sessions-4";
const PROXY_USER: &str = "system:serviceaccount:kube-ws-proxy:kube-ws-proxy";
const GROUP: &str = "kube-ws-proxy.io";
const SESSIONS: &str = "/apis/kube-ws-proxy.io/v1/sessions";

/// A cluster whose RBAC lets olga do everything with sessions everywhere, and vic list and
/// get them in `team-a` only; tina (who runs sessions) may do nothing with them. Behind a
/// proxy with listener TLS (kubectl sends tokens only over TLS), an audit log, and `extra`.
struct Operated {
    sim: SimCluster,
    proxy: ProxyProcess,
    dir: tempfile::TempDir,
    proxy_ca: Ca,
    client_ca: Ca,
    audit_log: PathBuf,
}

impl Operated {
    async fn start(extra: &[&str]) -> Operated {
        let user = |token: &str, name: &str| SimUser {
            token: token.to_owned(),
            name: name.to_owned(),
            groups: vec!["staff".to_owned()],
        };
        let all = ["list", "watch", "get", "delete"];
        let sim = SimCluster::start(SimConfig {
            users: vec![
                user(TINA, "tina"),
                user(OLGA, "olga"),
                user(VIC, "vic"),
                user(PROXY_TOKEN, PROXY_USER),
            ],
            impersonators: vec![PROXY_USER.to_owned()],
            access_reviewers: vec![PROXY_USER.to_owned()],
            access_policy: vec![
                SimAccessRule::cluster_wide(
                    SimSubject::User("olga".into()),
                    GROUP,
                    &["sessions", "sessions/recording"],
                    &all,
                ),
                SimAccessRule::cluster_wide(
                    SimSubject::User("vic".into()),
                    GROUP,
                    &["sessions"],
                    &["list", "get"],
                )
                .in_namespace("team-a"),
            ],
            ..SimConfig::default()
        })
        .await
        .expect("start the cluster");
        let dir = tempfile::tempdir().unwrap();
        let (proxy_ca, client_ca) = (Ca::new("proxy"), Ca::new("clients"));
        let (cert, key) = proxy_ca.server().write(dir.path(), "serving");
        let client_ca_file = client_ca.write(dir.path(), "client-ca");
        let token_file = dir.path().join("proxy-token");
        std::fs::write(&token_file, PROXY_TOKEN).unwrap();
        let audit_log = dir.path().join("audit.log");
        let mut args: Vec<String> = [
            "--upstream",
            &sim.url(),
            "--upstream-token-file",
            &token_file.display().to_string(),
            "--tls-cert-file",
            &cert.display().to_string(),
            "--tls-private-key-file",
            &key.display().to_string(),
            "--client-ca-file",
            &client_ca_file.display().to_string(),
            "--audit-log",
            &audit_log.display().to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let proxy = ProxyProcess::launch(&refs, &[]);
        Operated {
            sim,
            proxy,
            dir,
            proxy_ca,
            client_ca,
            audit_log,
        }
    }

    /// A kubeconfig for `name` with a bearer `token` or a client certificate.
    fn kubeconfig(&self, name: &str, token: Option<&str>, cert: Option<&Leaf>) -> PathBuf {
        kubeconfig(
            &self.dir.path().join(format!("kubeconfig-{name}")),
            &format!("https://127.0.0.1:{}", self.proxy.addr.port()),
            &self.proxy_ca.pem,
            token,
            cert,
        )
    }

    fn kubectl_cmd(&self, k: &Path, kc: &Path) -> tokio::process::Command {
        let mut c = tokio::process::Command::new(k);
        c.arg("--kubeconfig")
            .arg(kc)
            .current_dir(self.dir.path())
            .env("HOME", self.dir.path())
            .env_remove("KUBECONFIG")
            .kill_on_drop(true);
        c
    }

    async fn kubectl(&self, k: &Path, kc: &Path, args: &[&str]) -> Output {
        let mut c = self.kubectl_cmd(k, kc);
        c.args(args).stdin(Stdio::null());
        tokio::time::timeout(T, c.output())
            .await
            .expect("kubectl finished")
            .expect("kubectl ran")
    }

    /// `kubectl get --raw PATH` as `kc`: the JSON answer, or kubectl's error text.
    async fn get_raw(&self, k: &Path, kc: &Path, path: &str) -> Result<Value, String> {
        let o = self.kubectl(k, kc, &["get", "--raw", path]).await;
        match o.status.success() {
            true => Ok(serde_json::from_slice(&o.stdout).expect("JSON")),
            false => Err(stderr(&o)),
        }
    }

    /// The live sessions as `kc` lists them, once `want` of them are there.
    async fn sessions(&self, k: &Path, kc: &Path, want: usize) -> Vec<Value> {
        let deadline = tokio::time::Instant::now() + T;
        loop {
            let list = self.get_raw(k, kc, SESSIONS).await.expect("listed");
            assert_eq!(list["kind"], "SessionList", "{list}");
            let items = list["items"].as_array().unwrap().clone();
            if items.len() == want {
                return items;
            }
            assert!(tokio::time::Instant::now() < deadline, "{list}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Starts `kubectl exec web` as `kc` running `command`; returns once it printed its first line.
    async fn running_exec(&self, k: &Path, kc: &Path, command: &str) -> tokio::process::Child {
        let mut c = self.kubectl_cmd(k, kc);
        c.args(["exec", "web", "--", "sh", "-c", command])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = tokio::time::timeout(T, lines.next_line())
            .await
            .expect("the session started")
            .unwrap();
        assert_eq!(first.as_deref(), Some("started"));
        child
    }

    /// Ends `session` (a running kubectl) with `kubectl delete --raw path` as `kc`: that
    /// kubectl succeeds, the session's exits non-zero; what the session's kubectl printed on
    /// stderr.
    async fn terminate(
        &self,
        k: &Path,
        kc: &Path,
        path: &str,
        mut session: tokio::process::Child,
    ) -> String {
        use tokio::io::AsyncReadExt;
        let done = self.kubectl(k, kc, &["delete", "--raw", path]).await;
        assert!(done.status.success(), "{}", stderr(&done));
        let ended = tokio::time::timeout(Duration::from_secs(20), session.wait())
            .await
            .expect("the terminated session's kubectl exits")
            .unwrap();
        assert!(!ended.success());
        let mut printed = String::new();
        let mut err = session.stderr.take().unwrap();
        err.read_to_string(&mut printed).await.unwrap();
        printed
    }

    /// The audit log's `ended` event for the session `id`, once written.
    async fn ended(&self, id: &str) -> Value {
        let deadline = tokio::time::Instant::now() + T;
        loop {
            let text = std::fs::read_to_string(&self.audit_log).unwrap_or_default();
            if let Some(e) = text
                .lines()
                .map(|l| serde_json::from_str::<Value>(l).unwrap())
                .find(|e| e["stage"] == "ended" && e["session_id"] == id)
            {
                return e;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no ended event for {id}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// What kube-apiserver says to a caller RBAC denies, for `verb` in `namespace` (or the
/// cluster scope).
fn forbidden(user: &str, verb: &str, namespace: Option<&str>) -> String {
    forbidden_one(user, verb, namespace, None)
}

/// [`forbidden`] for one session, `name`, as kube-apiserver names the object it refuses.
fn forbidden_one(user: &str, verb: &str, namespace: Option<&str>, name: Option<&str>) -> String {
    let scope = match namespace {
        Some(ns) => format!("in the namespace \"{ns}\""),
        None => "at the cluster scope".to_owned(),
    };
    let name = name.map(|n| format!(" \"{n}\"")).unwrap_or_default();
    format!(
        "sessions.kube-ws-proxy.io{name} is forbidden: User \"{user}\" cannot {verb} resource \
         \"sessions\" in API group \"kube-ws-proxy.io\" {scope}"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passthrough_operators_list_and_terminate_under_the_clusters_rbac() {
    let Some(k33) = require_kubectl("1.33") else {
        return;
    };
    let o = Operated::start(&[]).await;
    let (tina, olga, vic) = (
        o.kubeconfig("tina", Some(TINA), None),
        o.kubeconfig("olga", Some(OLGA), None),
        o.kubeconfig("vic", Some(VIC), None),
    );
    let session = o.running_exec(&k33, &tina, "echo started; sleep 50").await;

    // olga sees it, with who runs what where.
    let items = o.sessions(&k33, &olga, 1).await;
    let s = &items[0];
    let id = s["metadata"]["name"].as_str().unwrap().to_owned();
    assert_eq!(s["metadata"]["namespace"], "default", "{s}");
    assert_eq!(s["spec"]["user"], "tina", "{s}");
    assert_eq!(s["spec"]["pod"], "web", "{s}");
    assert_eq!(s["spec"]["verb"], "exec", "{s}");
    assert_eq!(s["spec"]["protocolPath"], "translated", "{s}");
    let one = format!("/apis/kube-ws-proxy.io/v1/namespaces/default/sessions/{id}");
    assert_eq!(
        o.get_raw(&k33, &olga, &one).await.unwrap()["metadata"]["name"],
        id
    );

    // vic may list only team-a; tina may not list, nor end her own session.
    let denied = o.get_raw(&k33, &vic, SESSIONS).await.unwrap_err();
    assert!(denied.contains(&forbidden("vic", "list", None)), "{denied}");
    let team_a = "/apis/kube-ws-proxy.io/v1/namespaces/team-a/sessions";
    let listed = o.get_raw(&k33, &vic, team_a).await.unwrap();
    assert_eq!(listed["items"], serde_json::json!([]), "{listed}");
    let denied = o.get_raw(&k33, &tina, SESSIONS).await.unwrap_err();
    assert!(
        denied.contains(&forbidden("tina", "list", None)),
        "{denied}"
    );
    let refused = o.kubectl(&k33, &tina, &["delete", "--raw", &one]).await;
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains(&forbidden_one("tina", "delete", Some("default"), Some(&id))),
        "{}",
        stderr(&refused)
    );

    // olga ends it: tina's kubectl is told who and why and fails; the pod's process ends.
    let reason = format!("{one}?reason=incident-42");
    let printed = o.terminate(&k33, &olga, &reason, session).await;
    assert!(
        printed.contains("terminated by olga: incident-42"),
        "{printed}"
    );
    let event = o.ended(&id).await;
    assert_eq!(event["outcome"], "terminated", "{event}");
    assert_eq!(event["terminated_by"], "olga", "{event}");
    assert_eq!(event["termination_reason"], "incident-42", "{event}");
    o.sim
        .wait_for_event(T, |e| matches!(e, SimEvent::ProcessExited { .. }))
        .await
        .expect("the pod's process ended");
    assert!(o.sessions(&k33, &olga, 0).await.is_empty());
    let gone = o.get_raw(&k33, &olga, &one).await.unwrap_err();
    assert!(gone.contains("not found"), "{gone}");

    // Every review was the caller's own: the proxy spent no privilege of its own.
    let reviews = o.sim.access_reviews();
    assert!(!reviews.is_empty());
    for r in &reviews {
        assert_eq!(r.kind, SimReviewKind::SelfSubject, "{r:?}");
        assert_ne!(r.made_by, PROXY_USER, "{r:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impersonate_mode_asks_the_cluster_about_the_authenticated_caller() {
    let Some(k33) = require_kubectl("1.33") else {
        return;
    };
    let o = Operated::start(&["--auth-mode", "impersonate"]).await;
    let olga = o.kubeconfig("olga", None, Some(&o.client_ca.client("olga", None)));
    let tina = o.kubeconfig("tina", None, Some(&o.client_ca.client("tina", None)));
    let session = o.running_exec(&k33, &tina, "echo started; sleep 50").await;
    let items = o.sessions(&k33, &olga, 1).await;
    assert_eq!(items[0]["spec"]["user"], "tina", "{}", items[0]);
    let denied = o.get_raw(&k33, &tina, SESSIONS).await.unwrap_err();
    assert!(
        denied.contains(&forbidden("tina", "list", None)),
        "{denied}"
    );
    let id = items[0]["metadata"]["name"].as_str().unwrap();
    let one = format!("/apis/kube-ws-proxy.io/v1/namespaces/default/sessions/{id}");
    o.terminate(&k33, &olga, &one, session).await;
    assert_eq!(o.ended(id).await["terminated_by"], "olga");
    // SubjectAccessReviews, made by the proxy's own account about the caller.
    let reviews = o.sim.access_reviews();
    assert!(reviews.iter().any(|r| r.subject.name == "olga"));
    for r in &reviews {
        assert_eq!(r.kind, SimReviewKind::Subject, "{r:?}");
        assert_eq!(r.made_by, PROXY_USER, "{r:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_shows_sessions_come_and_go() {
    let Some(k33) = require_kubectl("1.33") else {
        return;
    };
    let o = Operated::start(&[]).await;
    let (tina, olga) = (
        o.kubeconfig("tina", Some(TINA), None),
        o.kubeconfig("olga", Some(OLGA), None),
    );
    let mut watch = o.kubectl_cmd(&k33, &olga);
    watch
        .args([
            "get",
            "--raw",
            &format!("{SESSIONS}?watch=true&timeoutSeconds=20"),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    let mut watch = watch.spawn().unwrap();
    let mut events = BufReader::new(watch.stdout.take().unwrap()).lines();
    // The watch is there before the session (its list is empty), then sees it start and end.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let out = o
        .kubectl(&k33, &tina, &["exec", "web", "--", "echo", "hi"])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let line = tokio::time::timeout(T, events.next_line())
            .await
            .expect("an event")
            .unwrap()
            .expect("the watch goes on");
        let e: Value = serde_json::from_str(&line).unwrap();
        seen.push((
            e["type"].as_str().unwrap().to_owned(),
            e["object"]["spec"]["user"].clone(),
        ));
    }
    assert_eq!(
        seen,
        [
            ("ADDED".to_owned(), Value::from("tina")),
            ("DELETED".to_owned(), Value::from("tina"))
        ]
    );
    let _ = watch.kill().await;
}
