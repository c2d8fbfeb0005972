//! What a reload does to the named clusters: each cluster of the new configuration whose spec
//! is the live one's is kept as it is (the same value: its pools, review caches, `auto` memory
//! and readiness go on); one that is new or whose spec changed is built; one that left, or was
//! rebuilt, is retired (its running sessions finish on it).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::proxy::route::cluster::{Cluster, ClusterName};

/// A serving cluster and the spec it was built from.
#[derive(Debug)]
pub(super) struct Live<S> {
    pub spec: S,
    pub cluster: Arc<Cluster>,
}

/// The names a reload added, removed, changed (rebuilt) and kept.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Change {
    pub added: Vec<ClusterName>,
    pub removed: Vec<ClusterName>,
    pub changed: Vec<ClusterName>,
    pub kept: Vec<ClusterName>,
}

/// The named clusters after a reload, and the clusters it retired.
#[derive(Debug)]
pub(super) struct Next<S> {
    pub clusters: BTreeMap<ClusterName, Live<S>>,
    pub retired: Vec<Arc<Cluster>>,
    pub change: Change,
}

/// The clusters `wanted` asks for, given the `live` ones: kept where the spec is unchanged,
/// made with `build` otherwise. The first cluster that cannot be built fails it all (nothing
/// is retired then: the live clusters go on serving).
pub(super) fn next<S: PartialEq, E>(
    live: &BTreeMap<ClusterName, Live<S>>,
    wanted: BTreeMap<ClusterName, S>,
    mut build: impl FnMut(&S) -> Result<Cluster, E>,
) -> Result<Next<S>, E> {
    let mut change = Change::default();
    let mut clusters = BTreeMap::new();
    let mut retired = Vec::new();
    for (name, spec) in wanted {
        let cluster = match live.get(&name) {
            Some(old) if old.spec == spec => {
                change.kept.push(name.clone());
                old.cluster.clone()
            }
            Some(old) => {
                let cluster = Arc::new(build(&spec)?);
                change.changed.push(name.clone());
                retired.push(old.cluster.clone());
                cluster
            }
            None => {
                let cluster = Arc::new(build(&spec)?);
                change.added.push(name.clone());
                cluster
            }
        };
        clusters.insert(name, Live { spec, cluster });
    }
    for (name, old) in live {
        if !clusters.contains_key(name) {
            change.removed.push(name.clone());
            retired.push(old.cluster.clone());
        }
    }
    Ok(Next {
        clusters,
        retired,
        change,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::auth::Authenticator;
    use crate::proxy::upstream::endpoint::{Upstream, UpstreamTls};

    /// A spec: the cluster's upstream URL.
    fn build(name: &ClusterName, url: &str) -> Result<Cluster, String> {
        if url.is_empty() {
            return Err(format!("cluster {name}: no upstream"));
        }
        let upstream =
            Upstream::from_url(url, UpstreamTls::default()).map_err(|e| e.to_string())?;
        Ok(Cluster::new(
            Some(name.clone()),
            upstream,
            Authenticator::passthrough(),
            Default::default(),
        ))
    }

    fn name(n: &str) -> ClusterName {
        ClusterName::parse(n).unwrap()
    }

    fn wanted(specs: &[(&str, &str)]) -> BTreeMap<ClusterName, String> {
        specs
            .iter()
            .map(|(n, url)| (name(n), (*url).to_owned()))
            .collect()
    }

    /// Applies `specs` to `live`, counting the clusters built.
    fn apply(
        live: &BTreeMap<ClusterName, Live<String>>,
        specs: &[(&str, &str)],
    ) -> (Result<Next<String>, String>, Vec<String>) {
        let mut built = Vec::new();
        let next = next(live, wanted(specs), |url: &String| {
            built.push(url.clone());
            let n = specs.iter().find(|(_, u)| u == url).unwrap().0;
            build(&name(n), url)
        });
        (next, built)
    }

    fn start() -> BTreeMap<ClusterName, Live<String>> {
        let (first, built) = apply(
            &BTreeMap::new(),
            &[("a", "http://127.0.0.1:1"), ("b", "http://127.0.0.1:2")],
        );
        assert_eq!(built.len(), 2);
        let first = first.unwrap();
        assert_eq!(first.change.added, [name("a"), name("b")]);
        assert!(first.retired.is_empty());
        first.clusters
    }

    #[test]
    fn added_removed_changed_and_kept() {
        let live = start();
        let (next, built) = apply(
            &live,
            &[
                ("a", "http://127.0.0.1:1"),
                ("c", "http://127.0.0.1:3"),
                ("d", "http://127.0.0.1:4"),
            ],
        );
        let next = next.unwrap();
        assert_eq!(built, ["http://127.0.0.1:3", "http://127.0.0.1:4"]);
        assert_eq!(
            next.change,
            Change {
                added: vec![name("c"), name("d")],
                removed: vec![name("b")],
                changed: vec![],
                kept: vec![name("a")],
            }
        );
        // The unchanged cluster is the very same value: nothing it holds starts over.
        assert!(Arc::ptr_eq(
            &next.clusters[&name("a")].cluster,
            &live[&name("a")].cluster
        ));
        assert_eq!(next.retired.len(), 1);
        assert!(Arc::ptr_eq(&next.retired[0], &live[&name("b")].cluster));
    }

    #[test]
    fn a_changed_spec_is_rebuilt_and_the_old_cluster_retired() {
        let live = start();
        let (next, built) = apply(
            &live,
            &[("a", "http://127.0.0.1:1"), ("b", "http://127.0.0.1:20")],
        );
        let next = next.unwrap();
        assert_eq!(built, ["http://127.0.0.1:20"]);
        assert_eq!(next.change.changed, [name("b")]);
        assert_eq!(next.change.kept, [name("a")]);
        let b = &next.clusters[&name("b")].cluster;
        assert!(!Arc::ptr_eq(b, &live[&name("b")].cluster));
        assert_eq!(b.upstream.to_string(), "http://127.0.0.1:20");
        assert!(Arc::ptr_eq(&next.retired[0], &live[&name("b")].cluster));
    }

    #[test]
    fn one_cluster_that_cannot_be_built_fails_the_reload() {
        let live = start();
        let (next, _) = apply(&live, &[("a", "http://127.0.0.1:1"), ("c", "")]);
        assert_eq!(next.unwrap_err(), "cluster c: no upstream");
    }

    #[test]
    fn the_same_configuration_keeps_everything() {
        let live = start();
        let (next, built) = apply(
            &live,
            &[("a", "http://127.0.0.1:1"), ("b", "http://127.0.0.1:2")],
        );
        let next = next.unwrap();
        assert!(built.is_empty());
        assert_eq!(next.change.kept, [name("a"), name("b")]);
        assert!(next.retired.is_empty());
    }
}
