//! What the listeners serve from: the state every request shares, and the clusters behind the
//! proxy (one generation of the configuration, replaced whole when it changes, so that a
//! request routes on one consistent set and running sessions keep the cluster they started on).

use std::sync::{Arc, PoisonError, RwLock};

use crate::proxy::route::fleet::Fleet;
use crate::proxy::sessions::state::Shared;

/// The shared state and the current clusters.
#[derive(Debug)]
pub struct FrontDoor {
    shared: Arc<Shared>,
    /// Read once per request (the lock is held for a pointer copy, never across an await).
    fleet: RwLock<Arc<Fleet>>,
}

impl FrontDoor {
    /// Serves `fleet` with `shared`.
    pub fn new(shared: Arc<Shared>, fleet: Fleet) -> FrontDoor {
        in_service(&shared, &fleet);
        FrontDoor {
            shared,
            fleet: RwLock::new(Arc::new(fleet)),
        }
    }

    /// The state every request shares.
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The clusters new requests are routed among.
    pub fn fleet(&self) -> Arc<Fleet> {
        self.fleet
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Routes new requests among `fleet` from now on; requests already routed, and their
    /// sessions, keep the cluster they got.
    pub fn replace_fleet(&self, fleet: Fleet) {
        in_service(&self.shared, &fleet);
        let fleet = Arc::new(fleet);
        // The old generation is dropped after the lock is released.
        let _old = std::mem::replace(
            &mut *self.fleet.write().unwrap_or_else(PoisonError::into_inner),
            fleet,
        );
    }
}

/// What is done for a set of clusters before it serves: each cluster's metric series that must
/// exist before their first event start at 0.
fn in_service(shared: &Shared, fleet: &Fleet) {
    for cluster in fleet.clusters() {
        shared.metrics.cluster_configured(cluster.metrics_label());
    }
}
