//! Changing the fleet without a restart: the `--config` file is read again when what it holds
//! changes (looked at every [`POLL`], which also follows a ConfigMap's symlink swap) and on
//! SIGHUP. Its clusters (`clusters:`, and `cluster:` unless the command line gives
//! `--cluster`) serve new requests from then on; an unchanged cluster is kept as it is
//! ([`fleet_change`](super::fleet_change)); the sessions of a cluster that left or changed
//! finish on it, and are ended after `--drain-timeout` as a shutdown ends them.
//!
//! Every other setting is the one the proxy started with: one the file changed is named in a
//! warning as needing a restart. The unnamed upstream comes from flags and stays. A file that
//! cannot be used (unreadable, unparseable, an unknown key, a bad or duplicate name, a cluster
//! that cannot be built) is refused with a warning, and the configuration serving goes on.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{signal, Signal, SignalKind};
use tracing::{info, warn};

use super::clusters::{self, ClusterSpec};
use super::fleet_change::{self, Change, Live, Next};
use crate::cli::{ConfigOrigin, FileSettings, ServeArgs};
use crate::config_file;
use crate::proxy::listen::front_door::FrontDoor;
use crate::proxy::route::cluster::{Cluster, ClusterName};
use crate::proxy::route::fleet::Fleet;

/// How often the file is looked at.
const POLL: Duration = Duration::from_secs(2);

/// Reads the config file again and applies its clusters.
pub(super) struct Reloader {
    front: Arc<FrontDoor>,
    /// The settings the proxy started with: all but the clusters stay as they are.
    args: ServeArgs,
    origin: ConfigOrigin,
    path: PathBuf,
    /// The named clusters serving, with their specs.
    live: BTreeMap<ClusterName, Live<ClusterSpec>>,
    /// The configuration's generation: 1 at start, one more per reload that succeeded.
    generation: u64,
    /// SIGHUP, caught from the start on (`None` if it cannot be).
    hangup: Option<Signal>,
}

/// A reload that can be applied: the new clusters, and the settings the file changed that
/// only a restart applies.
struct Accepted {
    fleet: Fleet,
    next: Next<ClusterSpec>,
    needs_restart: Vec<String>,
}

impl Reloader {
    /// A reloader of `args`' config file, whose named clusters `specs` made the fleet `front`
    /// serves; `None` without a config file. SIGHUP reloads from now on, rather than stopping
    /// the process.
    pub(super) fn new(
        front: Arc<FrontDoor>,
        args: &ServeArgs,
        specs: BTreeMap<ClusterName, ClusterSpec>,
    ) -> Option<Reloader> {
        let origin = args.process.config_origin.clone()?;
        let path = args.process.config.clone()?;
        let fleet = front.fleet();
        let live = specs
            .into_iter()
            .map(|(name, spec)| {
                let cluster = fleet
                    .get(name.as_str())
                    .expect("the fleet was built from these specs")
                    .clone();
                (name, Live { spec, cluster })
            })
            .collect();
        let hangup = signal(SignalKind::hangup())
            .map_err(|e| warn!(error = %e, "SIGHUP cannot be caught: the config file is reloaded only when it changes"))
            .ok();
        Some(Reloader {
            front,
            args: args.clone(),
            origin,
            path,
            live,
            generation: 1,
            hangup,
        })
    }

    /// Reloads on SIGHUP, and when the file has changed and reads the same twice in a row (a
    /// file being written is taken once it is whole), until the task is aborted.
    pub(super) async fn run(mut self) {
        let mut hangup = self.hangup.take();
        let mut applied = Some(self.origin.file_digest);
        let mut last = applied;
        loop {
            let hung_up = async {
                let signalled = match &mut hangup {
                    Some(signals) => signals.recv().await.is_some(),
                    None => false,
                };
                if !signalled {
                    // No SIGHUP handler, or the runtime is going away: nothing will come.
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                () = hung_up => {
                    applied = self.file_digest();
                    last = applied;
                    self.reload("SIGHUP");
                }
                () = tokio::time::sleep(POLL) => {
                    let now = self.file_digest();
                    if now != applied && now == last {
                        applied = now;
                        self.reload("the config file changed");
                    }
                    last = now;
                }
            }
        }
    }

    fn file_digest(&self) -> Option<u64> {
        std::fs::read(&self.path)
            .ok()
            .map(|bytes| config_file::digest(&bytes))
    }

    /// Reads the file and applies its clusters, or refuses it.
    fn reload(&mut self, trigger: &'static str) {
        let metrics = self.front.shared().metrics.clone();
        let accepted = match self.read() {
            Ok(accepted) => accepted,
            Err(why) => {
                metrics.config_reload(false);
                warn!(
                    trigger,
                    config = %self.path.display(),
                    generation = self.generation,
                    error = %why,
                    "configuration not reloaded: the previous configuration still serves"
                );
                return;
            }
        };
        self.front.replace_fleet(accepted.fleet);
        self.generation += 1;
        metrics.config_reload(true);
        metrics.config_generation(self.generation);
        let Next {
            clusters,
            retired,
            change,
        } = accepted.next;
        self.live = clusters;
        log_change(trigger, self.generation, &change);
        if !accepted.needs_restart.is_empty() {
            warn!(
                generation = self.generation,
                settings = %accepted.needs_restart.join(","),
                "the config file changed settings other than the clusters: they take effect \
                 only at a restart (the running ones stay)"
            );
        }
        for cluster in retired {
            retire(cluster, self.args.process.drain_timeout);
        }
    }

    /// The file's clusters, built where they are new or changed.
    fn read(&self) -> Result<Accepted, String> {
        let new = config_file::reread(&self.origin)
            .map_err(|e| e.to_string())?
            .serve;
        let wanted = clusters::named_specs(
            &self.args,
            &new.upstream.clusters,
            &new.upstream.file_clusters,
        )
        .map_err(|e| e.to_string())?;
        let sessions = &self.front.shared().sessions;
        let next = fleet_change::next(&self.live, wanted, |spec| {
            clusters::build(spec, &self.args, sessions.cluster_stop())
        })
        .map_err(|e| e.to_string())?;
        let fleet = Fleet::of_shared(
            self.front.fleet().unnamed().cloned(),
            next.clusters.values().map(|live| live.cluster.clone()),
        )
        .map_err(|e| e.to_string())?;
        let new_settings = new
            .process
            .config_origin
            .map(|origin| origin.file_settings)
            .unwrap_or_default();
        Ok(Accepted {
            fleet,
            next,
            needs_restart: changed_settings(&self.origin.file_settings, &new_settings),
        })
    }
}

/// The keys whose values differ between the settings the proxy runs with and the file's.
fn changed_settings(running: &FileSettings, file: &FileSettings) -> Vec<String> {
    let keys: BTreeSet<&String> = running.keys().chain(file.keys()).collect();
    keys.into_iter()
        .filter(|key| running.get(*key) != file.get(*key))
        .cloned()
        .collect()
}

fn log_change(trigger: &'static str, generation: u64, change: &Change) {
    let names = |names: &[ClusterName]| {
        names
            .iter()
            .map(ClusterName::as_str)
            .collect::<Vec<_>>()
            .join(",")
    };
    info!(
        trigger,
        generation,
        added = %names(&change.added),
        removed = %names(&change.removed),
        changed = %names(&change.changed),
        kept = %names(&change.kept),
        "configuration reloaded: new requests are routed among its clusters"
    );
}

/// A cluster that left the configuration (or was rebuilt): its running sessions, and those of
/// requests routed to it just before the reload, go on until `drain_timeout`, then are ended as
/// a shutdown ends them.
fn retire(cluster: Arc<Cluster>, drain_timeout: Duration) {
    let running = cluster.active_sessions();
    if running > 0 {
        info!(
            cluster = cluster.label(),
            sessions = running,
            timeout_s = drain_timeout.as_secs_f64(),
            "a cluster that left the configuration is draining: its sessions finish on it"
        );
    }
    tokio::spawn(async move {
        tokio::time::sleep(drain_timeout).await;
        let running = cluster.active_sessions();
        if running > 0 {
            info!(
                cluster = cluster.label(),
                sessions = running,
                "drain timeout of a cluster that left the configuration: ending its sessions"
            );
        }
        cluster.stop_sessions();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_changed_added_or_removed_need_a_restart() {
        let map = |pairs: &[(&str, &str)]| -> FileSettings {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), vec![(*v).to_owned()]))
                .collect()
        };
        let running = map(&[("drain-timeout", "5s"), ("listen", "a"), ("auth-mode", "x")]);
        let file = map(&[
            ("drain-timeout", "5s"),
            ("listen", "b"),
            ("max-sessions", "3"),
        ]);
        assert_eq!(
            changed_settings(&running, &file),
            ["auth-mode", "listen", "max-sessions"]
        );
        assert!(changed_settings(&running, &running).is_empty());
    }

    /// A proxy's front door and reloader, from `yaml` as its config file.
    fn reloader(dir: &std::path::Path, yaml: &str) -> Reloader {
        use crate::proxy::sessions::state::Shared;
        let path = dir.join("config.yaml");
        std::fs::write(&path, yaml).unwrap();
        let argv = [
            "kube-ws-proxy".to_owned(),
            format!("--config={}", path.display()),
        ];
        let args = config_file::parse_args(argv).unwrap().serve;
        let shared = Shared::default();
        let (fleet, specs) = clusters::fleet_from_args(&args, &shared.sessions).unwrap();
        let front = Arc::new(FrontDoor::new(Arc::new(shared), fleet));
        Reloader::new(front, &args, specs).unwrap()
    }

    fn names(r: &Reloader) -> Vec<String> {
        let fleet = r.front.fleet();
        fleet.clusters().map(|c| c.label().to_owned()).collect()
    }

    fn metric(r: &Reloader, line: &str) -> bool {
        let text = String::from_utf8(r.front.shared().metrics.render()).unwrap();
        text.lines().any(|l| l == line)
    }

    #[tokio::test]
    async fn a_reload_applies_the_files_clusters_and_refuses_a_bad_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = reloader(
            dir.path(),
            "drain-timeout: 1s\ncluster: [a=http://127.0.0.1:1]\nclusters:\n\
             - name: b\n  upstream: http://127.0.0.1:2\n",
        );
        assert_eq!(names(&r), ["a", "b"]);
        assert!(metric(&r, "kube_ws_proxy_config_generation 1"));
        let a = r.front.fleet().get("a").unwrap().clone();
        let b = r.front.fleet().get("b").unwrap().clone();
        std::fs::write(
            &r.path,
            "drain-timeout: 1s\ncluster: [a=http://127.0.0.1:1]\nclusters:\n\
             - name: c\n  upstream: http://127.0.0.1:3\n",
        )
        .unwrap();
        r.reload("test");
        assert_eq!(names(&r), ["a", "c"]);
        assert!(Arc::ptr_eq(r.front.fleet().get("a").unwrap(), &a));
        assert!(metric(&r, "kube_ws_proxy_config_generation 2"));
        assert!(metric(
            &r,
            r#"kube_ws_proxy_config_reloads_total{result="ok"} 1"#
        ));
        // b left: its sessions are ended after the drain timeout.
        assert!(!b.stop_token().is_cancelled());
        tokio::time::timeout(Duration::from_secs(5), b.stop_token().cancelled())
            .await
            .expect("b's sessions told to stop after the drain timeout");
        assert!(!a.stop_token().is_cancelled());

        for bad in [
            "clusters: [\n",
            "clusters:\n- name: c\n  upstream: http://127.0.0.1:3\n  upstream-tokn-file: /t\n",
            "clusters:\n- name: C\n  upstream: http://127.0.0.1:3\n",
            "cluster: [c=http://127.0.0.1:4]\nclusters:\n- name: c\n  upstream: http://127.0.0.1:3\n",
            "clusters:\n- name: c\n  upstream: https://127.0.0.1:3\n  upstream-ca-file: /nonexistent/ca.crt\n",
            "clusters: []\n",
            "listen-nowhere: true\n",
        ] {
            std::fs::write(&r.path, bad).unwrap();
            r.reload("test");
            assert_eq!(names(&r), ["a", "c"], "{bad}");
        }
        assert!(metric(&r, "kube_ws_proxy_config_generation 2"));
        assert!(metric(
            &r,
            r#"kube_ws_proxy_config_reloads_total{result="failed"} 7"#
        ));
    }
}
