use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::*;

const FLOOR: usize = 100;
const CAP: usize = 1000;

fn budget(limit: usize) -> Arc<MemoryBudget> {
    MemoryBudget::new(
        limit,
        LaneLimits {
            floor: FLOOR,
            cap: CAP,
        },
    )
}

/// Whether `fut` is still waiting after a moment.
async fn waits<F: std::future::Future>(fut: F) -> bool {
    tokio::time::timeout(Duration::from_millis(50), fut)
        .await
        .is_err()
}

#[test]
fn the_floor_needs_no_budget_and_beyond_it_the_lane_borrows() {
    let b = budget(500);
    let lane = b.lane();
    let a = lane.try_take(FLOOR).unwrap();
    assert_eq!((b.in_use(), b.held(), lane.held()), (0, FLOOR, FLOOR));
    let more = lane.try_take(300).unwrap();
    assert_eq!((b.in_use(), b.held()), (300, 400));
    // Given back in any order, the borrowed part first.
    drop(a);
    assert_eq!((b.in_use(), b.held()), (200, 300));
    drop(more);
    assert_eq!((b.in_use(), b.held(), lane.held()), (0, 0, 0));
}

#[test]
fn past_the_cap_or_the_budget_a_lane_is_refused() {
    let b = budget(500);
    let lane = b.lane();
    let r = lane.try_take(CAP + 1).unwrap_err();
    assert_eq!((r.limit, r.allowed), (Limit::Session, CAP));
    let _held = lane.try_take(FLOOR + 500).unwrap();
    let r = lane.try_take(1).unwrap_err();
    assert_eq!((r.limit, r.allowed), (Limit::Budget, 500));
    // Another lane still has its floor.
    let other = b.lane();
    let _f = other.try_take(FLOOR).unwrap();
    assert_eq!(other.try_take(1).unwrap_err().limit, Limit::Budget);
    // try_take counts no ended session: its caller decides.
    assert_eq!(b.sessions_ended(Limit::Budget), 0);
    assert!(r.to_string().len() <= 123, "{r}");
}

#[tokio::test]
async fn grow_to_refuses_at_once_past_the_cap_or_the_budget_and_counts_the_session() {
    let b = budget(500);
    let lane = b.lane();
    // 300 held: the floor's 100 and 200 borrowed.
    let mut frame = lane.try_take(300).unwrap();
    // Past the cap, counting what is held already: refused, nothing taken.
    let r = frame.grow_to(CAP + 1).await.unwrap_err();
    assert_eq!(
        (r.limit, r.wanted, r.allowed),
        (Limit::Session, CAP + 1, CAP)
    );
    // Another lane borrows the rest of the budget.
    let other = b.lane().try_take(FLOOR + 300).unwrap();
    let r = frame.grow_to(301).await.unwrap_err();
    assert_eq!((r.limit, r.wanted, r.allowed), (Limit::Budget, 301, 500));
    assert_eq!(b.sessions_ended(Limit::Session), 1);
    assert_eq!(b.sessions_ended(Limit::Budget), 1);
    assert_eq!((frame.len(), lane.held()), (300, 300));
    // What fits is granted.
    drop(other);
    frame.grow_to(600).await.unwrap();
    assert_eq!((frame.len(), lane.held(), b.in_use()), (600, 600, 500));
    // The cap counts what the caller holds already, once.
    let big = MemoryBudget::new(1 << 20, b.lane_limits());
    let mut at_cap = big.lane().try_take(CAP - 10).unwrap();
    at_cap.grow_to(CAP).await.unwrap();
    assert_eq!(at_cap.len(), CAP);
}

#[tokio::test]
async fn a_counting_handle_shares_the_bytes_and_tells_its_own_ends() {
    let b = budget(500);
    let told = Arc::new(std::sync::Mutex::new(Vec::new()));
    let counted = b.counting({
        let told = told.clone();
        move |limit| told.lock().unwrap().push(limit)
    });
    // One pool: what the counted handle's lane borrows, the budget lends.
    let hog = b.lane().try_take(FLOOR + 400).unwrap();
    let lane = counted.lane();
    let mut frame = lane.try_take(FLOOR + 100).unwrap();
    assert_eq!(
        (b.in_use(), counted.in_use(), counted.held()),
        (500, 500, 700)
    );
    assert_eq!(
        frame.grow_to(FLOOR + 101).await.unwrap_err().limit,
        Limit::Budget
    );
    assert_eq!(
        frame.grow_to(CAP + 1).await.unwrap_err().limit,
        Limit::Session
    );
    // The ends of the plain handle's lanes are not its.
    let _ = b.lane().none().grow_to(CAP + 1).await;
    assert_eq!(*told.lock().unwrap(), [Limit::Budget, Limit::Session]);
    // Both count in the budget's totals.
    assert_eq!(b.sessions_ended(Limit::Session), 2);
    assert_eq!(counted.sessions_ended(Limit::Budget), 1);
    // What both give back returns to the one pool.
    drop(frame);
    drop(hog);
    assert_eq!((b.in_use(), b.held()), (0, 0));
}

#[tokio::test]
async fn grow_to_waits_for_the_lanes_other_bytes_to_go_on() {
    let b = budget(10_000);
    let lane = b.lane();
    let queued = lane.try_take(600).unwrap();
    let waiting = tokio::spawn({
        let lane = lane.clone();
        async move {
            let mut frame = lane.none();
            frame.grow_to(600).await.map(|()| frame)
        }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        !waiting.is_finished(),
        "600 + 600 is past the cap: it waits"
    );
    drop(queued);
    let h = waiting.await.unwrap().unwrap();
    assert_eq!((h.len(), lane.held()), (600, 600));
}

#[tokio::test]
async fn take_room_gives_what_there_is_and_waits_when_there_is_none() {
    let b = budget(200);
    let lane = b.lane();
    // Floor 100 and budget 200: at most 300.
    let first = lane.take_room(250).await;
    assert_eq!(first.len(), 250);
    let second = lane.take_room(250).await;
    assert_eq!(second.len(), 50);
    assert!(waits(lane.take_room(10)).await);
    // Woken by its own bytes going on.
    let waiting = tokio::spawn({
        let lane = lane.clone();
        async move { lane.take_room(10).await.len() }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    drop(second);
    assert_eq!(waiting.await.unwrap(), 10);
    drop(first);
    assert_eq!(b.held(), 0);
}

#[tokio::test]
async fn take_room_is_woken_by_other_lanes_giving_back() {
    let b = budget(100);
    let hog = b.lane().try_take(FLOOR + 100).unwrap();
    let lane = b.lane();
    let _floor = lane.take_room(FLOOR).await;
    let waiting = tokio::spawn({
        let lane = lane.clone();
        async move { lane.take_room(40).await }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(!waiting.is_finished());
    drop(hog);
    let room = waiting.await.unwrap();
    assert_eq!((room.len(), b.in_use()), (40, 40));
}

#[tokio::test]
async fn a_wait_given_up_holds_nothing() {
    let b = budget(0);
    let lane = b.lane();
    let _floor = lane.try_take(FLOOR).unwrap();
    assert!(waits(lane.take_room(10)).await);
    assert!(
        waits(async {
            let mut frame = lane.none();
            let _ = frame.grow_to(CAP - FLOOR + 1).await;
        })
        .await
    );
    assert_eq!((lane.held(), b.held(), b.in_use()), (FLOOR, FLOOR, 0));
}

#[test]
fn held_bytes_split_absorb_and_shrink() {
    let b = budget(10_000);
    let lane = b.lane();
    let mut h = lane.try_take(500).unwrap();
    let part = h.split_off(200);
    assert_eq!((h.len(), part.len(), lane.held()), (300, 200, 500));
    drop(part);
    assert_eq!(lane.held(), 300);
    let mut all = lane.none();
    all.absorb(h);
    assert_eq!((all.len(), lane.held()), (300, 300));
    all.shrink_to(120);
    assert_eq!((all.len(), lane.held(), b.in_use()), (120, 120, 20));
    // Splitting more than is held moves what there is.
    let rest = all.split_off(1_000);
    assert_eq!((all.len(), rest.len()), (0, 120));
    drop(rest);
    assert_eq!((b.held(), b.in_use()), (0, 0));
}

#[test]
fn charged_bytes_give_their_memory_back_when_the_last_piece_drops() {
    let b = budget(10_000);
    let lane = b.lane();
    let bytes = charged(Bytes::from(vec![7u8; 300]), lane.try_take(300).unwrap());
    assert_eq!(&bytes[..], &[7u8; 300][..]);
    let mut head = bytes.slice(..10);
    let clone = bytes.clone();
    drop(bytes);
    let tail = clone.slice(290..);
    drop(clone);
    assert_eq!(lane.held(), 300, "slices still hold it");
    head.clear();
    drop(head);
    assert_eq!(lane.held(), 300);
    drop(tail);
    assert_eq!((lane.held(), b.held()), (0, 0));
    // Nothing held: the bytes as they were.
    let plain = charged(Bytes::from_static(b"x"), lane.none());
    assert_eq!(plain, Bytes::from_static(b"x"));
}
