//! The session reader's share of its session's memory: taken for what it reads, carried by each
//! DATA payload, given back on every path.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::AsyncWriteExt;

use super::tests::{headers, quiet, watched_tcp, RawPeer};
use super::*;
use crate::session_memory::{LaneLimits, Limit, MemoryBudget};
use crate::spdy::codec::FrameEncoder;
use crate::spdy::frame::{Data, Frame, GoAwayStatus, StreamId};

const FLOOR: usize = 1000;
const CAP: usize = 50_000;

fn budget(limit: usize) -> Arc<MemoryBudget> {
    MemoryBudget::new(
        limit,
        LaneLimits {
            floor: FLOOR,
            cap: CAP,
        },
    )
}

fn data(id: StreamId, payload: Vec<u8>) -> Frame {
    Frame::Data(Data {
        stream_id: id,
        fin: false,
        payload: Bytes::from(payload),
    })
}

/// Our client with `budget`, a raw peer, and one stream the peer accepted.
async fn session(budget: &Arc<MemoryBudget>) -> (Connection, RawPeer, RecvStream, StreamId) {
    let (a, b) = tokio::io::duplex(1 << 20);
    let config = Config {
        memory: Some(budget.clone()),
        ..quiet()
    };
    let client = Connection::client(a, Bytes::new(), config);
    let mut peer = RawPeer::new(b);
    let open = tokio::spawn({
        let c = client.clone();
        async move { c.open_stream(headers("stdout")).await }
    });
    let id = peer.accept().await;
    let (_tx, rx) = open.await.unwrap().unwrap().split();
    (client, peer, rx, id)
}

async fn recv(rx: &mut RecvStream) -> Bytes {
    tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("data")
        .expect("open")
        .expect("no error")
}

#[tokio::test]
async fn each_payload_holds_its_bytes_until_it_is_dropped() {
    let b = budget(1 << 20);
    let (client, mut peer, mut rx, id) = session(&b).await;
    peer.write(data(id, vec![3; 5000])).await;
    let got = recv(&mut rx).await;
    assert_eq!(got.len(), 5000);
    let with_payload = b.held();
    assert!(with_payload >= 5000, "{with_payload}");
    drop(got);
    assert_eq!(b.held(), with_payload - 5000);
    client.close().await;
    drop((client, rx));
    tokio::time::timeout(Duration::from_secs(5), async {
        while b.held() != 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("everything given back once the session is gone");
}

#[tokio::test]
async fn a_frame_past_the_cap_ends_the_session_from_its_head() {
    let b = budget(1 << 20);
    let (client, mut peer, mut rx, id) = session(&b).await;
    // The head and a little of a frame larger than the cap: the session ends before the rest.
    let mut wire = bytes::BytesMut::new();
    FrameEncoder::new()
        .encode(&data(id, vec![1; CAP + 1]), &mut wire)
        .unwrap();
    peer.io.write_all(&wire[..100]).await.unwrap();
    let end = tokio::time::timeout(Duration::from_secs(5), client.closed())
        .await
        .unwrap();
    assert!(
        matches!(&end, SessionEnd::Memory(r) if r.limit == Limit::Session),
        "{end}"
    );
    assert_eq!(
        peer.read().await,
        Some(Frame::GoAway(crate::spdy::frame::GoAway {
            last_good_stream_id: StreamId::ZERO,
            status: GoAwayStatus::InternalError,
        }))
    );
    assert!(matches!(rx.recv().await, Some(Err(_)) | None));
    assert_eq!(b.sessions_ended(Limit::Session), 1);
}

#[tokio::test]
async fn with_the_budget_spent_a_large_frame_ends_the_session_and_small_ones_flow() {
    let b = budget(2000);
    let _hog = b.lane().try_take(FLOOR + 2000).unwrap();
    let (client, mut peer, mut rx, id) = session(&b).await;
    for i in 0..30u8 {
        peer.write(data(id, vec![i; 300])).await;
        assert_eq!(recv(&mut rx).await, Bytes::from(vec![i; 300]));
    }
    peer.write(data(id, vec![9; 3000])).await;
    let end = tokio::time::timeout(Duration::from_secs(5), client.closed())
        .await
        .unwrap();
    assert!(
        matches!(&end, SessionEnd::Memory(r) if r.limit == Limit::Budget),
        "{end}"
    );
}

#[tokio::test]
async fn reading_waits_for_room_while_the_payloads_are_held() {
    let b = budget(0);
    let (client, mut peer, mut rx, id) = session(&b).await;
    for i in 0..4u8 {
        peer.write(data(id, vec![i; 400])).await;
    }
    let first = recv(&mut rx).await;
    let second = recv(&mut rx).await;
    assert!(
        tokio::time::timeout(Duration::from_millis(100), rx.recv())
            .await
            .is_err(),
        "the floor is full: reading waits"
    );
    drop(first);
    assert_eq!(recv(&mut rx).await, Bytes::from(vec![2u8; 400]));
    drop(second);
    assert_eq!(recv(&mut rx).await, Bytes::from(vec![3u8; 400]));
    assert!(client.end_reason().is_none());
}

/// A reader waiting for room in its memory lane (the payloads it passed on still held) watches
/// its socket meanwhile, as it does parked on a full inbox: the peer's reset behind data not
/// yet read tells the stream it is cut at once, and every byte sent before it still arrives.
#[tokio::test]
async fn a_reader_waiting_for_room_sees_the_peer_hang_up() {
    const FRAMES: usize = 20;
    let config = Config {
        memory: Some(budget(0)),
        ..quiet()
    };
    let (client, mut peer) = watched_tcp(config).await;
    // Each small frame leaves at once: a reset drops what the peer has not sent yet.
    peer.io.set_nodelay(true).unwrap();
    let opening = tokio::spawn(async move { client.open_stream(headers("stdout")).await });
    let id = peer.accept().await;
    let (_tx, mut rx) = opening.await.unwrap().unwrap().split();
    for i in 0..FRAMES {
        peer.write(data(id, vec![i as u8; 400])).await;
    }
    // Two payloads held fill the lane's floor: the reader waits for room.
    let held = [recv(&mut rx).await, recv(&mut rx).await];
    // A zero linger makes the close a reset.
    peer.io.set_zero_linger().unwrap();
    drop(peer);
    tokio::time::timeout(Duration::from_secs(2), rx.cut())
        .await
        .expect("the reset is seen while the reader waits for room");
    let mut got = held.iter().map(Bytes::len).sum::<usize>();
    drop(held);
    while let Some(Ok(chunk)) = rx.recv().await {
        got += chunk.len();
    }
    assert_eq!(got, FRAMES * 400);
}
