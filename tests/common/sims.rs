//! Simulated clusters as most tests want them: of one streaming kind, everything else default.

use kube_ws_proxy::sim::{SimCluster, SimConfig, SimStreaming};

/// A simulated cluster speaking `streaming`, otherwise default (HTTP, no authentication).
pub async fn of_kind(streaming: SimStreaming) -> SimCluster {
    SimCluster::start(SimConfig {
        streaming,
        ..SimConfig::default()
    })
    .await
    .expect("start sim cluster")
}
