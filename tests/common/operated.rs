//! The sessions API's rig (`/apis/kube-ws-proxy.io/v1/sessions`): a simulated cluster with
//! RBAC for the API, behind the real proxy with listener TLS and an audit log, and operators
//! who use real kubectl with their own kubeconfigs. Tests run a session as tina, then list,
//! watch and terminate it as olga (allowed everything) or vic (list and get in `team-a`).

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use crate::common::harness::stderr;
use crate::common::pki::{kubeconfig, Ca, Leaf};
use crate::common::proxy_process::ProxyProcess;
use kube_ws_proxy::sim::{SimAccessRule, SimCluster, SimConfig, SimSubject, SimUser};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

/// How long any one step may take before the test fails.
pub const T: Duration = Duration::from_secs(60);
/// tina runs sessions and may do nothing with them.
pub const TINA: &str = "tina-token-sessions-1";
/// olga may do everything with sessions, everywhere.
pub const OLGA: &str = "olga-token-sessions-2";
/// vic may list and get sessions in `team-a` only.
pub const VIC: &str = "vic-token-sessions-3";
/// The proxy's own token for the cluster.
pub const PROXY_TOKEN: &str = "proxy-token-sessions-4";
/// The proxy's own account.
pub const PROXY_USER: &str = "system:serviceaccount:kube-ws-proxy:kube-ws-proxy";
/// The API group the proxy serves.
pub const GROUP: &str = "kube-ws-proxy.io";
/// Every namespace's sessions.
pub const SESSIONS: &str = "/apis/kube-ws-proxy.io/v1/sessions";

/// One session's path, for `get --raw` and `delete --raw`.
pub fn session_path(namespace: &str, id: &str) -> String {
    format!("/apis/kube-ws-proxy.io/v1/namespaces/{namespace}/sessions/{id}")
}

/// A cluster whose RBAC lets olga do everything with sessions everywhere, and vic list and
/// get them in `team-a` only; tina (who runs sessions) may do nothing with them. Behind a
/// proxy with listener TLS (kubectl sends tokens only over TLS), an audit log (unless
/// [`Operated::start_unaudited`]), and `extra`.
pub struct Operated {
    pub sim: SimCluster,
    pub proxy: ProxyProcess,
    pub dir: tempfile::TempDir,
    pub proxy_ca: Ca,
    pub client_ca: Ca,
    pub audit_log: PathBuf,
}

impl Operated {
    /// The rig with the proxy's flags `extra` added, against an SPDY-only cluster.
    pub async fn start(extra: &[&str]) -> Operated {
        Operated::start_with(extra, |_| {}).await
    }

    /// [`Operated::start`] with the cluster's configuration changed by `sim` first (its
    /// streaming protocols, say).
    pub async fn start_with(extra: &[&str], sim: impl FnOnce(&mut SimConfig)) -> Operated {
        Operated::launch(extra, sim, true, &[]).await
    }

    /// [`Operated::start`] with the proxy's environment added to (the AWS variables of the
    /// upload tests, say).
    pub async fn start_env(extra: &[&str], env: &[(&str, &str)]) -> Operated {
        Operated::launch(extra, |_| {}, true, env).await
    }

    /// [`Operated::start`] without the audit log (so [`Operated::ended`] has nothing to read).
    pub async fn start_unaudited(extra: &[&str]) -> Operated {
        Operated::launch(extra, |_| {}, false, &[]).await
    }

    async fn launch(
        extra: &[&str],
        sim: impl FnOnce(&mut SimConfig),
        audited: bool,
        env: &[(&str, &str)],
    ) -> Operated {
        let mut config = rbac_cluster();
        sim(&mut config);
        let sim = SimCluster::start(config).await.expect("start the cluster");
        let dir = tempfile::tempdir().unwrap();
        let (proxy_ca, client_ca) = (Ca::new("proxy"), Ca::new("clients"));
        let audit_log = dir.path().join("audit.log");
        let mut args = proxy_args(&sim, dir.path(), &proxy_ca, &client_ca);
        if audited {
            args.extend(["--audit-log".to_owned(), audit_log.display().to_string()]);
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let proxy = ProxyProcess::launch(&refs, env);
        Operated {
            sim,
            proxy,
            dir,
            proxy_ca,
            client_ca,
            audit_log,
        }
    }

    /// Another replica in front of the same cluster, with the same certificates and its own
    /// audit log (`audit-NAME.log`), and the flags `extra` added.
    pub fn replica(&self, name: &str, extra: &[&str]) -> ProxyProcess {
        self.replica_env(name, extra, &[])
    }

    /// [`Operated::replica`] with the proxy's environment added to.
    pub fn replica_env(&self, name: &str, extra: &[&str], env: &[(&str, &str)]) -> ProxyProcess {
        let audit_log = self.dir.path().join(format!("audit-{name}.log"));
        let mut args = proxy_args(&self.sim, self.dir.path(), &self.proxy_ca, &self.client_ca);
        args.extend(["--audit-log".to_owned(), audit_log.display().to_string()]);
        args.extend(extra.iter().map(|s| s.to_string()));
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        ProxyProcess::launch(&refs, env)
    }

    /// A kubeconfig for `name` with a bearer `token`, for the replica `proxy`.
    pub fn kubeconfig_at(&self, proxy: &ProxyProcess, name: &str, token: &str) -> PathBuf {
        kubeconfig(
            &self.dir.path().join(format!("kubeconfig-{name}")),
            &format!("https://127.0.0.1:{}", proxy.addr.port()),
            &self.proxy_ca.pem,
            Some(token),
            None,
        )
    }

    /// The proxy's URL (https).
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.proxy.addr.port())
    }

    /// A kubeconfig for `name` with a bearer `token` or a client certificate.
    pub fn kubeconfig(&self, name: &str, token: Option<&str>, cert: Option<&Leaf>) -> PathBuf {
        kubeconfig(
            &self.dir.path().join(format!("kubeconfig-{name}")),
            &self.url(),
            &self.proxy_ca.pem,
            token,
            cert,
        )
    }

    /// kubectl `k` with kubeconfig `kc`, in the rig's directory, killed when dropped.
    pub fn kubectl_cmd(&self, k: &Path, kc: &Path) -> tokio::process::Command {
        let mut c = tokio::process::Command::new(k);
        c.arg("--kubeconfig")
            .arg(kc)
            .current_dir(self.dir.path())
            .env("HOME", self.dir.path())
            .env_remove("KUBECONFIG")
            .kill_on_drop(true);
        c
    }

    /// [`Operated::kubectl_cmd`] as a std `Command` (for [`crate::common::forward::Forward`]).
    pub fn kubectl_std(&self, k: &Path, kc: &Path) -> std::process::Command {
        let mut c = std::process::Command::new(k);
        c.arg("--kubeconfig")
            .arg(kc)
            .current_dir(self.dir.path())
            .env("HOME", self.dir.path())
            .env_remove("KUBECONFIG");
        c
    }

    /// Runs kubectl `k` as `kc` with `args` to its end.
    pub async fn kubectl(&self, k: &Path, kc: &Path, args: &[&str]) -> Output {
        let mut c = self.kubectl_cmd(k, kc);
        c.args(args).stdin(Stdio::null());
        tokio::time::timeout(T, c.output())
            .await
            .expect("kubectl finished")
            .expect("kubectl ran")
    }

    /// `kubectl get --raw PATH` as `kc`: the JSON answer, or kubectl's error text.
    pub async fn get_raw(&self, k: &Path, kc: &Path, path: &str) -> Result<Value, String> {
        let o = self.kubectl(k, kc, &["get", "--raw", path]).await;
        match o.status.success() {
            true => Ok(serde_json::from_slice(&o.stdout).expect("JSON")),
            false => Err(stderr(&o)),
        }
    }

    /// The live sessions as `kc` lists them, once `want` of them are there.
    pub async fn sessions(&self, k: &Path, kc: &Path, want: usize) -> Vec<Value> {
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

    /// The one live session as `kc` lists it, once it is there: its id and itself.
    pub async fn only_session(&self, k: &Path, kc: &Path) -> (String, Value) {
        let s = self.sessions(k, kc, 1).await.remove(0);
        (s["metadata"]["name"].as_str().unwrap().to_owned(), s)
    }

    /// Starts `kubectl exec web` as `kc` running `command`; returns once it printed its first
    /// line, which must be `started`.
    pub async fn running_exec(&self, k: &Path, kc: &Path, command: &str) -> tokio::process::Child {
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

    /// `kubectl delete --raw path` as `kc`, which must succeed.
    pub async fn delete(&self, k: &Path, kc: &Path, path: &str) {
        let done = self.kubectl(k, kc, &["delete", "--raw", path]).await;
        assert!(done.status.success(), "{}", stderr(&done));
    }

    /// Ends `session` (a running kubectl) with `kubectl delete --raw path` as `kc`: that
    /// kubectl succeeds, the session's exits non-zero; what the session's kubectl printed on
    /// stderr.
    pub async fn terminate(
        &self,
        k: &Path,
        kc: &Path,
        path: &str,
        session: tokio::process::Child,
    ) -> String {
        self.delete(k, kc, path).await;
        failed_stderr(session).await
    }

    /// The audit log's `ended` event for the session `id`, once written.
    pub async fn ended(&self, id: &str) -> Value {
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

/// Waits (20 s at most) for a terminated client to exit; it must fail. What it printed on
/// stderr (piped).
pub async fn failed_stderr(mut session: tokio::process::Child) -> String {
    let ended = tokio::time::timeout(Duration::from_secs(20), session.wait())
        .await
        .expect("the terminated session's client exits")
        .unwrap();
    assert!(!ended.success());
    let mut printed = String::new();
    let mut err = session.stderr.take().unwrap();
    err.read_to_string(&mut printed).await.unwrap();
    printed
}

/// What kube-apiserver says to a caller RBAC denies, for `verb` in `namespace` (or the
/// cluster scope).
pub fn forbidden(user: &str, verb: &str, namespace: Option<&str>) -> String {
    forbidden_one(user, verb, namespace, None)
}

/// [`forbidden`] for one session, `name`, as kube-apiserver names the object it refuses.
pub fn forbidden_one(
    user: &str,
    verb: &str,
    namespace: Option<&str>,
    name: Option<&str>,
) -> String {
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

/// The cluster: its users (tina, olga, vic and the proxy's account) and its RBAC for the
/// sessions API.
fn rbac_cluster() -> SimConfig {
    let user = |token: &str, name: &str| SimUser {
        token: token.to_owned(),
        name: name.to_owned(),
        groups: vec!["staff".to_owned()],
    };
    let all = ["list", "watch", "get", "delete"];
    SimConfig {
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
    }
}

/// The proxy's flags: the cluster with the proxy's token, listener TLS with a client CA.
fn proxy_args(sim: &SimCluster, dir: &Path, proxy_ca: &Ca, client_ca: &Ca) -> Vec<String> {
    let (cert, key) = proxy_ca.server().write(dir, "serving");
    let client_ca_file = client_ca.write(dir, "client-ca");
    let token_file = dir.join("proxy-token");
    std::fs::write(&token_file, PROXY_TOKEN).unwrap();
    let path = |p: &Path| p.display().to_string();
    vec![
        "--upstream".into(),
        sim.url(),
        "--upstream-token-file".into(),
        path(&token_file),
        "--tls-cert-file".into(),
        path(&cert),
        "--tls-private-key-file".into(),
        path(&key),
        "--client-ca-file".into(),
        path(&client_ca_file),
    ]
}
