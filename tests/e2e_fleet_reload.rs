//! Changing the fleet without a restart: the proxy started with `--config` listing clusters
//! follows the file (a ConfigMap's symlink swap, a rename) and SIGHUP. New requests go to the
//! new clusters at once, a removed cluster's name is a 404, a session running on it goes on
//! until the drain timeout and then ends with a Status; a broken file is refused and the
//! clusters serving go on; `/metrics` says which generation serves and counts the reloads.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tokio_tungstenite::tungstenite::Message;

use common::clients::{require_kubectl, write_kubeconfig};
use common::harness::{run, stderr, stdout};
use common::middlebox::Middlebox;
use common::proxy_process::{http_get, ProxyProcess};
use common::sims::of_kind as sim;
use common::ws_client::{self, Ws};
use kube_ws_proxy::sim::{SimCluster, SimStreaming};

const T: Duration = Duration::from_secs(60);

/// How long a removed cluster's sessions may go on.
const DRAIN: Duration = Duration::from_secs(5);

/// A config file as a ConfigMap volume holds it: `config.yaml` is a symlink to
/// `..data/config.yaml`, and `..data` a symlink to the current version's folder, replaced by a
/// rename when the ConfigMap changes.
struct ConfigMapVolume {
    dir: PathBuf,
    version: usize,
}

impl ConfigMapVolume {
    fn new(dir: &Path, text: &str) -> ConfigMapVolume {
        let mut volume = ConfigMapVolume {
            dir: dir.to_owned(),
            version: 0,
        };
        volume.write(text);
        std::os::unix::fs::symlink("..data/config.yaml", volume.path()).unwrap();
        volume
    }

    fn path(&self) -> PathBuf {
        self.dir.join("config.yaml")
    }

    /// A new version, swapped in at once.
    fn write(&mut self, text: &str) {
        self.version += 1;
        let version = format!("..v{}", self.version);
        std::fs::create_dir(self.dir.join(&version)).unwrap();
        std::fs::write(self.dir.join(&version).join("config.yaml"), text).unwrap();
        let staged = self.dir.join("..data_tmp");
        std::os::unix::fs::symlink(&version, &staged).unwrap();
        std::fs::rename(staged, self.dir.join("..data")).unwrap();
    }
}

/// Replaces `path` with `text` as an editor or a config tool does: a new file renamed over it.
fn replace(path: &Path, text: &str) {
    let staged = path.with_extension("tmp");
    std::fs::write(&staged, text).unwrap();
    std::fs::rename(staged, path).unwrap();
}

/// `clusters:` with each `(name, key, value)`: `upstream: URL` or `kubeconfig: FILE`.
fn clusters(entries: &[(&str, &str, &str)]) -> String {
    let mut yaml = String::from("clusters:\n");
    for (name, key, value) in entries {
        yaml.push_str(&format!("- name: {name}\n  {key}: {value}\n"));
    }
    yaml
}

/// Waits until `/metrics` shows `series` at `value`.
async fn until_metric(proxy: &ProxyProcess, series: &str, value: f64) {
    let deadline = Instant::now() + T;
    loop {
        let now = proxy.metric(series);
        if now == Some(value) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{series} is {now:?}, not {value}; log:\n{}",
            proxy.log_lines().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The status code of a plain GET of `/version` on cluster `name`.
fn version(proxy: &ProxyProcess, name: &str) -> u16 {
    http_get(proxy.addr, &format!("/clusters/{name}/version")).0
}

/// Sends `line` on the session's stdin and waits for it on its stdout (`cat` runs there).
async fn echo(ws: &mut Ws, line: &str) {
    let mut message = vec![0u8];
    message.extend_from_slice(line.as_bytes());
    ws_client::send(ws, &message).await;
    let mut out = Vec::new();
    while out != line.as_bytes() {
        match tokio::time::timeout(T, ws.next())
            .await
            .expect("stdout in time")
        {
            Some(Ok(Message::Binary(b))) if b.first() == Some(&1) => out.extend_from_slice(&b[1..]),
            Some(Ok(Message::Binary(_) | Message::Ping(_) | Message::Pong(_))) => {}
            other => panic!("the session ended: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_cluster_drains_and_an_added_one_serves_at_once() {
    let Some(kubectl) = require_kubectl("1.33") else {
        return;
    };
    let (a, b, c) = (
        sim(SimStreaming::SpdyOnly).await,
        sim(SimStreaming::SpdyOnly).await,
        sim(SimStreaming::New).await,
    );
    let dir = tempfile::tempdir().unwrap();
    let mut volume = ConfigMapVolume::new(
        dir.path(),
        &clusters(&[("a", "upstream", &a.url()), ("b", "upstream", &b.url())]),
    );
    let config = volume.path();
    let drain = format!("{}s", DRAIN.as_secs());
    let proxy = ProxyProcess::launch(
        &[
            "--config",
            config.to_str().unwrap(),
            "--drain-timeout",
            &drain,
        ],
        &[],
    );
    assert_eq!(proxy.metric("kube_ws_proxy_config_generation"), Some(1.0));
    assert_eq!((version(&proxy, "a"), version(&proxy, "c")), (200, 404));

    // A session on b: `cat`, translated to SPDY (b is an old cluster).
    let exec = ws_client::exec_path("web", &["cat"], true, true, false);
    let (mut on_b, _) = ws_client::connect(
        proxy.addr,
        &format!("/clusters/b{exec}"),
        "v5.channel.k8s.io",
    )
    .await
    .unwrap();
    echo(&mut on_b, "before\n").await;

    // The ConfigMap changes: b leaves, c comes.
    let written = Instant::now();
    volume.write(&clusters(&[
        ("a", "upstream", &a.url()),
        ("c", "upstream", &c.url()),
    ]));
    until_metric(&proxy, "kube_ws_proxy_config_generation", 2.0).await;
    assert_eq!(
        proxy.metric(r#"kube_ws_proxy_config_reloads_total{result="ok"}"#),
        Some(1.0)
    );
    let b_seen = b.requests().len();
    // An added cluster's series that must exist before their first event start at 0, as those
    // of the clusters configured at start do.
    assert_eq!(
        proxy.metric(r#"kube_ws_proxy_recording_failures_total{cluster="c"}"#),
        Some(0.0)
    );
    assert_eq!(version(&proxy, "c"), 200);
    assert_eq!(version(&proxy, "a"), 200);
    assert_eq!(version(&proxy, "b"), 404, "b's new requests");
    let refused = ws_client::connect(
        proxy.addr,
        &format!("/clusters/b{exec}"),
        "v5.channel.k8s.io",
    )
    .await;
    assert!(refused.is_err(), "a new session on b was admitted");
    assert_eq!(
        b.requests().len(),
        b_seen,
        "a request reached the removed b"
    );
    // The session on b goes on.
    echo(&mut on_b, "after the reload\n").await;

    kubectl_execs_through_the_gateway(&kubectl, &proxy, dir.path(), "c").await;
    ended_by_the_drain(&mut on_b, written).await;
    assert_logged_change(&proxy, 2, ("c", "b", "a"));
    // The admin listener knows the new fleet.
    let ready = |name: &str| http_get(proxy.admin_addr, &format!("/readyz?cluster={name}")).0;
    assert_eq!((ready("a"), ready("b"), ready("c")), (200, 404, 200));
}

/// kubectl through the SPDY-dropping gateway execs on cluster `name`.
async fn kubectl_execs_through_the_gateway(
    kubectl: &Path,
    proxy: &ProxyProcess,
    dir: &Path,
    name: &str,
) {
    let middlebox = Middlebox::start(proxy.addr).await;
    let server = format!("http://{}/clusters/{name}", middlebox.addr);
    let kubeconfig = write_kubeconfig(dir, &server, None);
    let mut cmd = std::process::Command::new(kubectl);
    cmd.arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["exec", "web", "--", "echo", name])
        .env_remove("KUBECTL_REMOTE_COMMAND_WEBSOCKETS")
        .env_remove("KUBECONFIG")
        .env("HOME", dir);
    let out = run(cmd, None, T).await;
    assert!(
        out.status.success(),
        "kubectl exec on {name}: {}",
        stderr(&out)
    );
    assert_eq!(stdout(&out), format!("{name}\n"));
    assert!(middlebox.websockets() > 0);
    assert_eq!(middlebox.dropped(), 0, "kubectl fell back to SPDY");
}

/// The session ends with a Status and Close, as a shutdown ends it, and not before the drain
/// timeout has passed since the file was `written`.
async fn ended_by_the_drain(ws: &mut Ws, written: Instant) {
    let ended = tokio::time::timeout(T, ws_client::read_to_close(ws))
        .await
        .expect("the session ended after the drain timeout");
    assert!(
        written.elapsed() >= DRAIN,
        "the session ended {:?} after the file changed, before the drain timeout",
        written.elapsed()
    );
    let status: serde_json::Value =
        serde_json::from_slice(&ended.status).expect("a Status on channel 3");
    assert_eq!(status["status"], "Failure", "{status}");
    assert_eq!(status["reason"], "ServiceUnavailable", "{status}");
    assert_eq!(ended.close.map(|c| u16::from(c.code)), Some(1000));
}

/// The reload to `generation` is logged with the clusters it `(added, removed, kept)`.
fn assert_logged_change(
    proxy: &ProxyProcess,
    generation: u64,
    (added, removed, kept): (&str, &str, &str),
) {
    let logged = proxy
        .wait_for_log("configuration reloaded", T)
        .expect("the reload is logged");
    let line: serde_json::Value = serde_json::from_str(&logged).unwrap();
    let fields = &line["fields"];
    assert_eq!(
        (
            &fields["generation"],
            &fields["added"],
            &fields["removed"],
            &fields["kept"]
        ),
        (
            &generation.into(),
            &added.into(),
            &removed.into(),
            &kept.into()
        ),
        "{logged}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_and_a_broken_file_is_refused() {
    let (a, b1, b2) = (
        sim(SimStreaming::SpdyOnly).await,
        sim(SimStreaming::SpdyOnly).await,
        sim(SimStreaming::New).await,
    );
    let dir = tempfile::tempdir().unwrap();
    // b is given by a kubeconfig: SIGHUP rebuilds a cluster whose kubeconfig changed, though
    // the config file did not.
    let b_dir = dir.path().join("b");
    std::fs::create_dir(&b_dir).unwrap();
    let b_kubeconfig = write_kubeconfig(&b_dir, &b1.url(), None);
    let good = clusters(&[
        ("a", "upstream", &a.url()),
        ("b", "kubeconfig", b_kubeconfig.to_str().unwrap()),
    ]);
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, &good).unwrap();
    let proxy = ProxyProcess::launch(&["--config", config.to_str().unwrap()], &[]);
    assert_eq!(version(&proxy, "b"), 200);
    let seen = |sim: &SimCluster| sim.requests().len();
    let (b1_seen, b2_seen) = (seen(&b1), seen(&b2));

    write_kubeconfig(&b_dir, &b2.url(), None);
    proxy.hangup();
    until_metric(&proxy, "kube_ws_proxy_config_generation", 2.0).await;
    assert_eq!(version(&proxy, "b"), 200);
    assert_eq!(
        (seen(&b1), seen(&b2)),
        (b1_seen, b2_seen + 1),
        "b now goes to b2"
    );
    let logged = proxy.wait_for_log("configuration reloaded", T).unwrap();
    assert!(
        logged.contains(r#""trigger":"SIGHUP""#) && logged.contains(r#""changed":"b""#),
        "{logged}"
    );

    // Broken files, each refused: a and b serve on, the generation stays.
    let missing_ca = format!(
        "clusters:\n- name: a\n  upstream: https://127.0.0.1:1\n  upstream-ca-file: {}\n",
        dir.path().join("no-such-ca.crt").display()
    );
    for (i, broken) in [
        format!(
            "{good}- name: c\n  upstream: {}\n  upstream-tokn-file: /t\n",
            a.url()
        ),
        missing_ca,
        format!("{good}- name: A\n  upstream: {}\n", a.url()),
        format!("{good}- name: a\n  upstream: {}\n", b1.url()),
        "clusters: [\n".to_owned(),
    ]
    .iter()
    .enumerate()
    {
        replace(&config, broken);
        let failed = r#"kube_ws_proxy_config_reloads_total{result="failed"}"#;
        until_metric(&proxy, failed, (i + 1) as f64).await;
        assert_eq!(proxy.metric("kube_ws_proxy_config_generation"), Some(2.0));
        assert_eq!(
            (version(&proxy, "a"), version(&proxy, "b")),
            (200, 200),
            "{broken}"
        );
    }
    let refused = proxy.wait_for_log("configuration not reloaded", T).unwrap();
    assert!(refused.contains("WARN"), "{refused}");

    // A good file again, with a setting only a restart applies: the clusters reload, the
    // setting is named.
    replace(&config, &format!("max-sessions: 3\n{good}"));
    until_metric(&proxy, "kube_ws_proxy_config_generation", 3.0).await;
    let restart = proxy.wait_for_log("only at a restart", T).unwrap();
    assert!(restart.contains("max-sessions"), "{restart}");
    assert_eq!(
        proxy.metric(r#"kube_ws_proxy_config_reloads_total{result="ok"}"#),
        Some(2.0)
    );
}
