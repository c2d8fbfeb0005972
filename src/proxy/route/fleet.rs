//! The clusters behind one proxy, and the pick per request: by its host name when that is
//! `NAME.SUFFIX` under `--cluster-host-suffix` ([`by_host`](super::by_host)), its path then
//! going as it is (no prefix is read); else by its `/clusters/NAME/` prefix
//! ([`cluster_prefix`]), which is removed before the request goes on, or the unnamed upstream
//! of `--upstream`/`--kubeconfig`/`--in-cluster` for a request without one.
//!
//! A proxy with no named cluster routes exactly as a single-upstream proxy always has: every
//! target goes to its one upstream as read. With named clusters, a target the prefix reading
//! refuses is answered 400, and one naming no configured cluster 404, with a Status that names
//! no other cluster.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::by_host::HostUnrouted;
use super::cluster::{Cluster, ClusterName, DEFAULT_CLUSTER};
use crate::request::cluster_prefix::{self, ClusterPrefix, PrefixRefusal};
use crate::request::target::{RequestTarget, TargetError};

/// The configured clusters (one generation of the configuration).
#[derive(Debug, Default)]
pub struct Fleet {
    /// The upstream of requests without a cluster prefix, if there is one.
    default: Option<Arc<Cluster>>,
    /// The named clusters.
    named: BTreeMap<ClusterName, Arc<Cluster>>,
}

/// Why a fleet cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FleetError {
    /// Two clusters with one name.
    #[error("cluster {0:?} is configured twice")]
    Duplicate(String),
    /// Neither an unnamed upstream nor a named cluster.
    #[error("no cluster is configured")]
    Empty,
    /// A cluster named `default` beside the unnamed upstream, whose name in metrics, logs,
    /// audit events and `/readyz?cluster=` is `default` too: the two could not be told apart.
    #[error(
        "a cluster named {0:?} beside --upstream/--kubeconfig/--in-cluster: that name is the \
         unnamed upstream's in metrics, logs and audit events; name the cluster otherwise"
    )]
    DefaultTaken(&'static str),
}

/// Where a request goes: its cluster, and the target to send there.
#[derive(Debug)]
pub struct Routed {
    /// The cluster.
    pub cluster: Arc<Cluster>,
    /// The target without the cluster prefix, when it had one: `rewritten` is the path and
    /// query to send instead of the request's own.
    pub target: RequestTarget,
    /// The path and query as sent, minus the prefix; `None` when nothing was removed.
    pub rewritten: Option<String>,
}

/// Why a request is routed nowhere.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unrouted {
    /// The target's prefix is refused (400).
    #[error("{0}: the request is not routed to any cluster")]
    Refused(PrefixRefusal),
    /// The name is not a configured cluster (404).
    #[error("no such cluster")]
    UnknownCluster,
    /// The target names no cluster and there is no unnamed upstream (404).
    #[error("this proxy serves clusters under /clusters/NAME/")]
    NoCluster,
    /// The target without the prefix cannot be read (400).
    #[error(transparent)]
    Target(#[from] TargetError),
    /// The request's host cannot be read (400), or names another cluster than its
    /// connection's TLS server name (421).
    #[error(transparent)]
    Host(#[from] HostUnrouted),
}

impl Fleet {
    /// The unnamed upstream (if any) and the named clusters.
    pub fn new(
        default: Option<Cluster>,
        named: impl IntoIterator<Item = Cluster>,
    ) -> Result<Fleet, FleetError> {
        Fleet::of_shared(default.map(Arc::new), named.into_iter().map(Arc::new))
    }

    /// As [`Fleet::new`], with clusters that may serve in another generation too (a reload
    /// keeps those it did not change).
    pub fn of_shared(
        default: Option<Arc<Cluster>>,
        named: impl IntoIterator<Item = Arc<Cluster>>,
    ) -> Result<Fleet, FleetError> {
        let mut fleet = Fleet {
            default,
            named: BTreeMap::new(),
        };
        for cluster in named {
            let name = cluster.name.clone().expect("a named cluster has a name");
            if fleet.named.insert(name.clone(), cluster).is_some() {
                return Err(FleetError::Duplicate(name.to_string()));
            }
        }
        if fleet.default.is_none() && fleet.named.is_empty() {
            return Err(FleetError::Empty);
        }
        if fleet.default.is_some()
            && fleet
                .named
                .keys()
                .any(|name| name.as_str() == DEFAULT_CLUSTER)
        {
            return Err(FleetError::DefaultTaken(DEFAULT_CLUSTER));
        }
        Ok(fleet)
    }

    /// The upstream of requests without a cluster prefix, if there is one.
    pub fn unnamed(&self) -> Option<&Arc<Cluster>> {
        self.default.as_ref()
    }

    /// Where the request with path `raw_path` and query `query` as sent, read as `target`,
    /// goes; `by_host` is the cluster name its host gives (`NAME.SUFFIX`), if it gives one.
    pub fn route(
        &self,
        by_host: Option<&str>,
        raw_path: &str,
        query: Option<&str>,
        target: RequestTarget,
    ) -> Result<Routed, Unrouted> {
        if let Some(name) = by_host {
            // The host names the cluster; the path is all the cluster's own.
            return Ok(Routed {
                cluster: self.named_cluster(name)?.clone(),
                target,
                rewritten: None,
            });
        }
        let unprefixed = |target| match &self.default {
            Some(cluster) => Ok(Routed {
                cluster: cluster.clone(),
                target,
                rewritten: None,
            }),
            None => Err(Unrouted::NoCluster),
        };
        if self.named.is_empty() {
            return unprefixed(target);
        }
        match cluster_prefix::read(raw_path, &target) {
            ClusterPrefix::Unprefixed => unprefixed(target),
            ClusterPrefix::Refused(why) => Err(Unrouted::Refused(why)),
            ClusterPrefix::Named { name, rest } => {
                let cluster = self.named_cluster(name)?;
                let path = if rest.is_empty() { "/" } else { rest };
                let target = RequestTarget::parse(path, query)?;
                let rewritten = match query {
                    Some(q) => format!("{path}?{q}"),
                    None => path.to_owned(),
                };
                Ok(Routed {
                    cluster: cluster.clone(),
                    target,
                    rewritten: Some(rewritten),
                })
            }
        }
    }

    /// The named cluster `name`, or the refusal of an unknown one.
    fn named_cluster(&self, name: &str) -> Result<&Arc<Cluster>, Unrouted> {
        ClusterName::parse(name)
            .ok()
            .and_then(|name| self.named.get(&name))
            .ok_or(Unrouted::UnknownCluster)
    }

    /// Every cluster: the unnamed one first, then the named ones by name.
    pub fn clusters(&self) -> impl Iterator<Item = &Arc<Cluster>> {
        self.default.iter().chain(self.named.values())
    }

    /// The cluster named `name` ([`DEFAULT_CLUSTER`](super::cluster::DEFAULT_CLUSTER) for the
    /// unnamed one).
    pub fn get(&self, name: &str) -> Option<&Arc<Cluster>> {
        self.clusters().find(|c| c.label() == name)
    }

    /// Whether clusters are named (requests then carry a `/clusters/NAME/` prefix).
    pub fn is_named(&self) -> bool {
        !self.named.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::auth::Authenticator;
    use crate::proxy::upstream::endpoint::{Upstream, UpstreamTls};
    use crate::proxy::upstream::streaming::UpstreamStreaming;

    fn cluster(name: Option<&str>, url: &str) -> Cluster {
        Cluster::new(
            name.map(|n| ClusterName::parse(n).unwrap()),
            Upstream::from_url(url, UpstreamTls::default()).unwrap(),
            Authenticator::passthrough(),
            UpstreamStreaming::default(),
        )
    }

    fn route(fleet: &Fleet, pq: &str) -> Result<(String, String, Option<String>), Unrouted> {
        let (path, query) = match pq.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (pq, None),
        };
        let target = RequestTarget::parse(path, query)?;
        fleet.route(None, path, query, target).map(|r| {
            (
                r.cluster.label().to_owned(),
                r.target.canonical().to_owned(),
                r.rewritten,
            )
        })
    }

    #[test]
    fn one_upstream_routes_everything_as_read() {
        let fleet = Fleet::new(Some(cluster(None, "http://127.0.0.1:1")), []).unwrap();
        for pq in ["/api", "/clusters/a/api", "/clusters/a/../b"] {
            let (name, _, rewritten) = route(&fleet, pq).unwrap();
            assert_eq!((name.as_str(), rewritten), ("default", None), "{pq}");
        }
    }

    #[test]
    fn named_clusters_take_their_prefix_off() {
        let fleet = Fleet::new(
            None,
            [
                cluster(Some("a"), "http://127.0.0.1:1"),
                cluster(Some("b"), "http://127.0.0.1:2"),
            ],
        )
        .unwrap();
        assert_eq!(
            route(
                &fleet,
                "/clusters/b/api/v1/namespaces/x/pods/p/exec?command=id"
            )
            .unwrap(),
            (
                "b".to_owned(),
                "/api/v1/namespaces/x/pods/p/exec?command=id".to_owned(),
                Some("/api/v1/namespaces/x/pods/p/exec?command=id".to_owned())
            )
        );
        assert_eq!(route(&fleet, "/clusters/a").unwrap().1, "/");
        assert_eq!(route(&fleet, "/api"), Err(Unrouted::NoCluster));
        for unknown in [
            "/clusters/c/api",
            "/clusters/A/api",
            "/clusters/",
            "/clusters",
        ] {
            assert_eq!(
                route(&fleet, unknown),
                Err(Unrouted::UnknownCluster),
                "{unknown}"
            );
        }
        assert!(matches!(
            route(&fleet, "/clusters/a/../b/api"),
            Err(Unrouted::Refused(PrefixRefusal::DotSegment))
        ));
    }

    #[test]
    fn an_unnamed_upstream_serves_beside_named_ones() {
        let fleet = Fleet::new(
            Some(cluster(None, "http://127.0.0.1:1")),
            [cluster(Some("a"), "http://127.0.0.1:2")],
        )
        .unwrap();
        assert_eq!(route(&fleet, "/api").unwrap().0, "default");
        assert_eq!(route(&fleet, "/clusters/a/api").unwrap().0, "a");
    }

    #[test]
    fn names_are_unique() {
        let twice = Fleet::new(
            None,
            [
                cluster(Some("a"), "http://127.0.0.1:1"),
                cluster(Some("a"), "http://127.0.0.1:2"),
            ],
        );
        assert_eq!(twice.err(), Some(FleetError::Duplicate("a".into())));
        assert_eq!(Fleet::new(None, []).err(), Some(FleetError::Empty));
    }

    #[test]
    fn default_is_the_unnamed_upstreams_name_when_there_is_one() {
        let beside = Fleet::new(
            Some(cluster(None, "http://127.0.0.1:1")),
            [cluster(Some("default"), "http://127.0.0.1:2")],
        );
        assert_eq!(
            beside.err(),
            Some(FleetError::DefaultTaken(DEFAULT_CLUSTER))
        );
        // Without an unnamed upstream the name is free.
        let alone = Fleet::new(None, [cluster(Some("default"), "http://127.0.0.1:2")]).unwrap();
        assert_eq!(route(&alone, "/clusters/default/api").unwrap().0, "default");
    }

    #[test]
    fn a_host_named_cluster_takes_the_path_as_it_is() {
        let fleet = Fleet::new(
            Some(cluster(None, "http://127.0.0.1:1")),
            [
                cluster(Some("a"), "http://127.0.0.1:2"),
                cluster(Some("b"), "http://127.0.0.1:3"),
            ],
        )
        .unwrap();
        let by_host = |host: Option<&str>, pq: &str| {
            let target = RequestTarget::parse_path_and_query(pq).unwrap();
            fleet
                .route(host, pq, None, target)
                .map(|r| (r.cluster.label().to_owned(), r.rewritten))
        };
        // No prefix is read on a host that names a cluster: `/clusters/b/` is a's own path.
        assert_eq!(by_host(Some("a"), "/api"), Ok(("a".into(), None)));
        assert_eq!(
            by_host(Some("a"), "/clusters/b/api"),
            Ok(("a".into(), None))
        );
        assert_eq!(
            by_host(Some("a"), "/clusters/a/../b/api"),
            Ok(("a".into(), None))
        );
        // An unknown name under the suffix is unknown, never the unnamed upstream.
        assert_eq!(by_host(Some("c"), "/api"), Err(Unrouted::UnknownCluster));
        assert_eq!(
            by_host(Some("default"), "/api"),
            Err(Unrouted::UnknownCluster)
        );
        // A host that names no cluster: the path decides.
        assert_eq!(by_host(None, "/api"), Ok(("default".into(), None)));
        assert_eq!(
            by_host(None, "/clusters/b/api"),
            Ok(("b".into(), Some("/api".into())))
        );
    }
}
