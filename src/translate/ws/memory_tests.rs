//! The reader's share of its session's memory: every path takes it and gives it back.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncWriteExt, DuplexStream, ReadHalf};

use super::test_client::masked;
use super::{CloseCode, Config, Error, Incoming, WebSocket, WsReader};
use crate::session_memory::{LaneLimits, Limit, MemoryBudget};

const FLOOR: usize = 1000;
const CAP: usize = 10_000;

fn budget(limit: usize) -> Arc<MemoryBudget> {
    MemoryBudget::new(
        limit,
        LaneLimits {
            floor: FLOOR,
            cap: CAP,
        },
    )
}

fn reader(
    budget: &Arc<MemoryBudget>,
    max: usize,
) -> (DuplexStream, WsReader<ReadHalf<DuplexStream>>) {
    let (client, server) = tokio::io::duplex(1 << 20);
    let config = Config {
        max_message_size: max,
        keepalive: None,
        memory: Some(budget.clone()),
    };
    let (rd, _wr) = WebSocket::new(server, config).split();
    (client, rd)
}

async fn next(rd: &mut WsReader<ReadHalf<DuplexStream>>) -> Result<Incoming, Error> {
    tokio::time::timeout(Duration::from_secs(5), rd.next())
        .await
        .expect("a message")
        .expect("not the end")
}

fn binary(msg: Incoming) -> Bytes {
    match msg {
        Incoming::Binary(b) => b,
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_message_holds_its_bytes_until_its_last_piece_is_dropped() {
    let b = budget(1 << 20);
    let (mut client, mut rd) = reader(&b, 1 << 20);
    client.write_all(&masked(0x82, &[5u8; 5000])).await.unwrap();
    let msg = binary(next(&mut rd).await.unwrap());
    assert_eq!(msg.len(), 5000);
    let with_message = b.held();
    assert!(with_message >= 5000, "{with_message}");
    let tail = msg.slice(4000..);
    drop(msg);
    assert_eq!(b.held(), with_message, "a slice still holds it");
    drop(tail);
    assert_eq!(b.held(), with_message - 5000);
    drop(rd);
    assert_eq!((b.held(), b.in_use()), (0, 0));
}

#[tokio::test]
async fn a_frame_past_the_sessions_cap_is_refused_from_its_head() {
    let b = budget(1 << 20);
    let (mut client, mut rd) = reader(&b, 1 << 20);
    // Only the head and a little of a 20,000-byte frame: refused before the rest comes.
    let frame = masked(0x82, &[1u8; 20_000]);
    client.write_all(&frame[..100]).await.unwrap();
    let err = next(&mut rd).await.unwrap_err();
    assert!(
        matches!(&err, Error::Memory(r) if r.limit == Limit::Session),
        "{err}"
    );
    assert_eq!(err.close_code(), Some(CloseCode::TOO_BIG));
    assert!(err.to_string().len() <= 123);
    assert_eq!(b.sessions_ended(Limit::Session), 1);
    drop(rd);
    assert_eq!(b.held(), 0);
}

#[tokio::test]
async fn when_the_budget_is_spent_a_large_frame_is_refused_and_small_ones_still_flow() {
    let b = budget(4000);
    let hog = b.lane().try_take(FLOOR + 4000).unwrap();
    let (mut client, mut rd) = reader(&b, 1 << 20);
    for i in 0..20u8 {
        client.write_all(&masked(0x82, &[i; 300])).await.unwrap();
        assert_eq!(binary(next(&mut rd).await.unwrap())[..], [i; 300][..]);
    }
    client.write_all(&masked(0x82, &[9u8; 3000])).await.unwrap();
    let err = next(&mut rd).await.unwrap_err();
    assert!(
        matches!(&err, Error::Memory(r) if r.limit == Limit::Budget),
        "{err}"
    );
    assert_eq!(b.sessions_ended(Limit::Budget), 1);
    drop((rd, hog));
    assert_eq!((b.held(), b.in_use()), (0, 0));
}

#[tokio::test]
async fn reading_waits_while_the_lane_is_full_and_goes_on_when_a_message_is_dropped() {
    // No budget at all: the floor (1,000 bytes) is all the lane has.
    let b = budget(0);
    let (mut client, mut rd) = reader(&b, 1 << 20);
    for i in 0..4u8 {
        client.write_all(&masked(0x82, &[i; 400])).await.unwrap();
    }
    let first = binary(next(&mut rd).await.unwrap());
    let second = binary(next(&mut rd).await.unwrap());
    // 800 held by the two messages: the rest cannot come in while they are.
    let waiting = tokio::time::timeout(Duration::from_millis(100), rd.next()).await;
    assert!(waiting.is_err(), "reading waits for room");
    drop(first);
    assert_eq!(binary(next(&mut rd).await.unwrap())[..], [2u8; 400][..]);
    drop(second);
    assert_eq!(binary(next(&mut rd).await.unwrap())[..], [3u8; 400][..]);
    assert!(b.held() <= FLOOR);
}

#[tokio::test]
async fn a_reader_dropped_in_the_middle_of_a_message_gives_everything_back() {
    let b = budget(1 << 20);
    let (mut client, mut rd) = reader(&b, 1 << 20);
    // Half of a large frame, then the second fragment of a fragmented message's start.
    let frame = masked(0x82, &[1u8; 8000]);
    client.write_all(&frame[..4000]).await.unwrap();
    assert!(tokio::time::timeout(Duration::from_millis(100), rd.next())
        .await
        .is_err());
    assert!(b.held() >= 8000, "the whole frame is held: {}", b.held());
    drop(rd);
    assert_eq!((b.held(), b.in_use()), (0, 0));

    let (mut client, mut rd) = reader(&b, 1 << 20);
    client.write_all(&masked(0x02, &[1u8; 3000])).await.unwrap();
    client.write_all(&masked(0x00, &[2u8; 3000])).await.unwrap();
    assert!(tokio::time::timeout(Duration::from_millis(100), rd.next())
        .await
        .is_err());
    assert!(b.held() >= 6000);
    drop(rd);
    assert_eq!((b.held(), b.in_use()), (0, 0));
}

#[tokio::test]
async fn a_fragmented_message_is_held_whole_and_refused_from_the_head_that_takes_it_too_far() {
    let b = budget(1 << 20);
    let (mut client, mut rd) = reader(&b, 7000);
    client.write_all(&masked(0x02, &[1u8; 3000])).await.unwrap();
    client.write_all(&masked(0x80, &[2u8; 3000])).await.unwrap();
    let msg = binary(next(&mut rd).await.unwrap());
    assert_eq!(msg.len(), 6000);
    let held = b.held();
    drop(msg);
    assert_eq!(b.held(), held - 6000);
    // Past --max-message-size: refused from the continuation's head alone.
    client.write_all(&masked(0x02, &[1u8; 4000])).await.unwrap();
    client
        .write_all(&masked(0x80, &[2u8; 4000])[..20])
        .await
        .unwrap();
    let err = next(&mut rd).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::TooLarge {
                size: 8000,
                max: 7000
            }
        ),
        "{err}"
    );
    drop(rd);
    assert_eq!(b.held(), 0);
}
