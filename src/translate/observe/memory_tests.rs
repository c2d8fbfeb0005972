//! What observers buffer is held from their session's memory, and given back.

use std::sync::Arc;

use super::tests::ws_frame;
use super::*;
use crate::session_memory::{LaneLimits, Limit, MemoryBudget};

const UP: Direction = Direction::ClientToUpstream;
const KEY: Option<[u8; 4]> = Some([1, 2, 3, 4]);

fn budget(limit: usize) -> Arc<MemoryBudget> {
    MemoryBudget::new(
        limit,
        LaneLimits {
            floor: 1000,
            cap: 1 << 20,
        },
    )
}

fn v4_observer(budget: &Arc<MemoryBudget>) -> Observer {
    Observer::for_protocol(Some("websocket"), Some("v4.channel.k8s.io"))
        .unwrap()
        .charging(budget.lane())
}

#[test]
fn an_unfinished_frame_is_held_until_it_is_complete() {
    let b = budget(1 << 20);
    let mut o = v4_observer(&b);
    let mut payload = vec![0u8];
    payload.extend_from_slice(&[7u8; 5000]);
    let frame = ws_frame(0x2, true, &payload, KEY);
    let mut out = Vec::new();
    o.feed(UP, &frame[..3000], &mut out).unwrap();
    assert_eq!(b.held(), 3000);
    o.feed(UP, &frame[3000..], &mut out).unwrap();
    assert_eq!(
        out,
        vec![Observed::Stdin(bytes::Bytes::from(vec![7u8; 5000]))]
    );
    assert_eq!((b.held(), b.in_use()), (0, 0));
}

#[test]
fn a_frame_the_budget_cannot_hold_stops_the_observer_and_gives_everything_back() {
    let b = budget(2000);
    let _hog = b.lane().try_take(1000 + 2000).unwrap();
    let mut o = v4_observer(&b);
    // A frame fed whole is followed within the call and never held; one that stays unfinished
    // past the floor is.
    let frame = ws_frame(0x2, true, &[0u8; 3000], KEY);
    o.feed(UP, &frame, &mut Vec::new()).unwrap();
    let err = o.feed(UP, &frame[..2500], &mut Vec::new()).unwrap_err();
    assert!(
        matches!(&err, ObserveError::Memory(r) if r.limit == Limit::Budget),
        "{err}"
    );
    assert!(o.stopped());
    assert_eq!(b.held(), 3000, "only the hog's");
    // Counted as a recording that failed, not as a session the budget ended.
    assert_eq!(b.sessions_ended(Limit::Budget), 0);
}

#[test]
fn a_watch_holds_an_unfinished_control_frame_and_reports_a_refusal() {
    let b = budget(0);
    let watch = PortForwardWatch::new().charging(b.lane());
    // A SPDY control frame head announcing 5,000 bytes of payload, and some of it.
    let mut head = vec![0x80, 0x03, 0x00, 0x01, 0x00, 0x00, 0x13, 0x88];
    head.extend_from_slice(&[0u8; 500]);
    watch.relayed(UP, &head);
    assert_eq!(b.held(), 508);
    watch.relayed(UP, &[0u8; 1000]);
    let report = watch.finish();
    assert!(
        report.failure.as_deref().unwrap_or("").contains("memory"),
        "{report:?}"
    );
    assert_eq!(b.held(), 0);
}
