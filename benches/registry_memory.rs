//! What the registry of live sessions holds per idle session: a counting global allocator
//! measures the bytes that listing N sessions adds (the entry, its traffic counter, the map's
//! node), with each session's `SessionInfo` made beforehand, as its audit trail makes it and the
//! registry shares it. Not a timing benchmark.
//!
//!     cargo bench --bench registry_memory -- [SESSIONS]      (default: 10000)

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Arc;

use kube_ws_proxy::audit::{HttpVersion, IdentitySource, ProtocolPath, SessionInfo, Verb};
use kube_ws_proxy::proxy::sessions::registry::live::{LiveSession, LiveSessions};
use kube_ws_proxy::session_stop::SessionStop;
use kube_ws_proxy::session_traffic::SessionTraffic;

/// Bytes allocated and not yet freed.
static LIVE: AtomicIsize = AtomicIsize::new(0);

struct Counting;

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// An exec session's info, as a kubectl exec's audit trail has it.
fn info(n: u64) -> Arc<SessionInfo> {
    Arc::new(SessionInfo {
        session_id: kube_ws_proxy::audit::instance::session_id(n),
        cluster: None,
        verb: Verb::Exec,
        namespace: "team-a".into(),
        pod: format!("web-{n}"),
        container: Some("app".into()),
        node: None,
        command: vec!["sh".into(), "-c".into(), "cat".into()],
        tty: true,
        stdin: true,
        ports: vec![],
        user: Some("alice@example.com".into()),
        groups: vec!["system:authenticated".into(), "dev".into()],
        identity_source: IdentitySource::SelfSubjectReview,
        impersonated_user: None,
        client_address: "10.1.2.3:50000".into(),
        http_version: HttpVersion::Http11,
        protocol_path: ProtocolPath::Translated,
        protocol: Some("v5.channel.k8s.io".into()),
        recording: None,
        audit_id: Some("5f0c6a52-1d2e-4c3b-9a8f-0e1d2c3b4a59".into()),
        charged_to: None,
    })
}

fn main() {
    let n: u64 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(10_000);
    let live = Arc::new(LiveSessions::default());
    let made: Vec<_> = (1..=n).map(|i| (info(i), SessionStop::default())).collect();
    let info_bytes = LIVE.load(Ordering::Relaxed);
    let mut listings = Vec::with_capacity(n as usize);
    let before = LIVE.load(Ordering::Relaxed);
    for (i, (info, stop)) in made.iter().enumerate() {
        let traffic = Arc::new(SessionTraffic::new());
        let session = LiveSession::new(i as u64 + 1, info.clone(), traffic, stop.clone());
        listings.push(live.list(session));
    }
    let after = LIVE.load(Ordering::Relaxed);
    // The listings' own vector is the bench's, not the registry's.
    let held = after - before;
    println!(
        "{n} idle sessions listed: the registry adds {:.0} bytes per session \
         (each session's SessionInfo and stop signal, made beforehand and shared: {:.0} bytes)",
        held as f64 / n as f64,
        info_bytes as f64 / n as f64,
    );
    drop(listings);
    assert!(live.is_empty());
}
