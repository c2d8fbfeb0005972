//! The WebSocket halves against a hand-rolled client on an in-memory pipe.

use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncWriteExt, DuplexStream};

use super::frame::OpCode;
use super::test_client::{masked, server_frames};
use super::*;

type Pair = (
    DuplexStream,
    WsReader<ReadHalf<DuplexStream>>,
    WsWriter<WriteHalf<DuplexStream>>,
);

fn pair(pipe: usize, max: usize) -> Pair {
    pair_with(pipe, max, None)
}

fn pair_with(pipe: usize, max: usize, keepalive: Option<Keepalive>) -> Pair {
    let (client, server) = tokio::io::duplex(pipe);
    let (rd, wr) = WebSocket::new(
        server,
        Config {
            max_message_size: max,
            keepalive,
            memory: None,
        },
    )
    .split();
    (client, rd, wr)
}

const KEEPALIVE: Keepalive = Keepalive {
    interval: Duration::from_secs(30),
    timeout: Some(Duration::from_secs(10)),
};

#[tokio::test(start_paused = true)]
async fn a_keepalive_ping_is_due_every_interval() {
    let (mut client, _rd, mut wr) = pair_with(4096, 1024, Some(KEEPALIVE));
    let start = tokio::time::Instant::now();
    for round in 1..=3u32 {
        wr.control_due().await;
        assert_eq!(start.elapsed(), KEEPALIVE.interval * round);
        wr.flush().await.unwrap();
        // An empty ping: 0x89 0x00.
        assert_eq!(
            server_frames(&mut client, 1).await,
            vec![(OpCode::Ping, vec![])]
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_keepalive_ping_goes_out_behind_queued_output() {
    let (mut client, _rd, mut wr) = pair_with(4096, 1024, Some(KEEPALIVE));
    wr.control_due().await;
    wr.queue_binary(&[1], Bytes::from_static(b"out")).unwrap();
    wr.flush().await.unwrap();
    assert_eq!(
        server_frames(&mut client, 2).await,
        vec![
            (OpCode::Binary, b"\x01out".to_vec()),
            (OpCode::Ping, vec![])
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_client_that_answers_is_not_lost_and_one_that_stops_is() {
    let (mut client, mut rd, mut wr) = pair_with(1 << 16, 1024, Some(KEEPALIVE));
    let liveness = rd.liveness();
    let lost = tokio::spawn(async move { liveness.lost().await });
    // The session's reader waits for the client all along.
    tokio::spawn(async move { while let Some(Ok(_)) = rd.next().await {} });
    let pinger = tokio::spawn(async move {
        loop {
            wr.control_due().await;
            if wr.flush().await.is_err() {
                return;
            }
        }
    });
    // Ten minutes of answered pings.
    for _ in 0..20 {
        let frames = server_frames(&mut client, 1).await;
        assert_eq!(frames, vec![(OpCode::Ping, vec![])]);
        client.write_all(&masked(0x8A, b"")).await.unwrap();
    }
    assert!(!lost.is_finished());
    // Then the client stops answering (it stays connected).
    let stopped = tokio::time::Instant::now();
    let silent = lost.await.unwrap();
    let allowed = KEEPALIVE.silence_allowed().unwrap();
    assert!(silent >= allowed);
    let took = stopped.elapsed();
    assert!(
        took > KEEPALIVE.timeout.unwrap() && took <= allowed,
        "{took:?}"
    );
    pinger.abort();
}

#[tokio::test(start_paused = true)]
async fn without_keepalive_no_ping_is_ever_due() {
    let (_client, _rd, mut wr) = pair(4096, 1024);
    assert!(
        tokio::time::timeout(Duration::from_secs(24 * 3600), wr.control_due())
            .await
            .is_err()
    );
}

#[tokio::test]
async fn messages_of_every_length_encoding() {
    let (mut client, mut rd, _wr) = pair(1 << 20, 1 << 20);
    let sizes = [0usize, 1, 125, 126, 0xFFFF, 0x10000, 300_000];
    for &n in &sizes {
        let payload: Vec<u8> = (0..n).map(|i| i as u8).collect();
        client.write_all(&masked(0x82, &payload)).await.unwrap();
        assert_eq!(
            rd.next().await.unwrap().unwrap(),
            Incoming::Binary(payload.into())
        );
    }
}

#[tokio::test]
async fn many_small_frames_in_one_read_and_one_frame_over_many_reads() {
    // A 16-byte pipe makes every large frame arrive in pieces.
    let (client, mut rd, _wr) = pair(16, 1 << 20);
    let (_, mut client_wr) = tokio::io::split(client);
    let big: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    let mut wire = Vec::new();
    for i in 0..50u8 {
        wire.extend(masked(0x82, &[0, i]));
    }
    wire.extend(masked(0x82, &big));
    tokio::spawn(async move { client_wr.write_all(&wire).await.unwrap() });
    for i in 0..50u8 {
        assert_eq!(
            rd.next().await.unwrap().unwrap(),
            Incoming::Binary(vec![0, i].into())
        );
    }
    assert_eq!(
        rd.next().await.unwrap().unwrap(),
        Incoming::Binary(big.into())
    );
}

#[tokio::test]
async fn a_pending_data_frame_is_told_apart_from_a_control_frame() {
    let (mut client, mut rd, _wr) = pair(4096, 1024);
    assert!(!rd.data_frame_pending());
    let mut wire = masked(0x82, b"a");
    wire.extend(masked(0x82, b"b"));
    wire.extend(masked(0x89, b"p"));
    client.write_all(&wire).await.unwrap();
    assert_eq!(
        rd.next().await.unwrap().unwrap(),
        Incoming::Binary(Bytes::from_static(b"a"))
    );
    assert!(rd.data_frame_pending());
    assert_eq!(
        rd.next().await.unwrap().unwrap(),
        Incoming::Binary(Bytes::from_static(b"b"))
    );
    assert!(!rd.data_frame_pending(), "a ping is next");
}

#[tokio::test]
async fn a_data_frame_arriving_is_one_begun_and_no_longer_than_the_limit() {
    let (mut client, mut rd, _wr) = pair(4096, 1024);
    assert!(!rd.data_frame_arriving(1024), "nothing is here");
    let mut wire = masked(0x82, b"a");
    wire.extend(masked(0x82, b"bc"));
    wire.extend(masked(0x89, b"p"));
    wire.extend(masked(0x02, b"frag"));
    wire.extend(masked(0x80, b"ment"));
    // The head and one byte of one more message.
    wire.extend_from_slice(&masked(0x82, b"xyz")[..7]);
    client.write_all(&wire).await.unwrap();
    assert_eq!(
        rd.next().await.unwrap().unwrap(),
        Incoming::Binary(Bytes::from_static(b"a"))
    );
    assert!(rd.data_frame_arriving(2));
    assert!(!rd.data_frame_arriving(1), "longer than the limit");
    rd.next().await.unwrap().unwrap();
    assert!(!rd.data_frame_arriving(1024), "a ping is next");
    assert_eq!(
        rd.next().await.unwrap().unwrap(),
        Incoming::Binary(Bytes::from_static(b"fragment"))
    );
    assert!(rd.data_frame_pending());
    assert!(rd.data_frame_arriving(3), "only half a message is here");
    assert!(!rd.data_frame_arriving(2), "longer than the limit");
}

#[tokio::test]
async fn a_frame_whose_length_is_not_here_yet_counts_as_arriving() {
    let (mut client, mut rd, _wr) = pair(4096, 1024);
    let mut wire = masked(0x82, b"a");
    wire.push(0x82);
    client.write_all(&wire).await.unwrap();
    assert_eq!(
        rd.next().await.unwrap().unwrap(),
        Incoming::Binary(Bytes::from_static(b"a"))
    );
    assert!(rd.data_frame_arriving(0));
}

#[tokio::test]
async fn text_is_checked_to_be_utf8() {
    let (mut client, mut rd, _wr) = pair(4096, 1024);
    client
        .write_all(&masked(0x81, "\u{0}héllo".as_bytes()))
        .await
        .unwrap();
    assert_eq!(
        rd.next().await.unwrap().unwrap(),
        Incoming::Text(Bytes::from("\u{0}héllo"))
    );
    client.write_all(&masked(0x81, b"\x00\xff")).await.unwrap();
    let err = rd.next().await.unwrap().unwrap_err();
    assert!(matches!(err, Error::InvalidUtf8));
    assert_eq!(err.close_code(), Some(CloseCode::INVALID_DATA));
    assert!(rd.next().await.is_none(), "nothing after an error");
}

#[tokio::test]
async fn fragments_are_reassembled_around_a_ping() {
    let (mut client, mut rd, mut wr) = pair(4096, 1024);
    let mut wire = masked(0x02, b"\x00fra");
    wire.extend(masked(0x00, b"gme"));
    wire.extend(masked(0x89, b"mid"));
    wire.extend(masked(0x80, b"nted"));
    client.write_all(&wire).await.unwrap();
    assert_eq!(
        rd.next().await.unwrap().unwrap(),
        Incoming::Binary(Bytes::from_static(b"\x00fragmented"))
    );
    tokio::time::timeout(Duration::from_secs(5), wr.control_due())
        .await
        .expect("the ping is reported");
    wr.flush().await.unwrap();
    assert_eq!(
        server_frames(&mut client, 1).await,
        vec![(OpCode::Pong, b"mid".to_vec())]
    );
}

#[tokio::test]
async fn protocol_violations_end_reading() {
    let cases: [(Vec<u8>, CloseCode); 6] = [
        // Unmasked client frame.
        (vec![0x82, 0x01, 0x00], CloseCode::PROTOCOL),
        // Continuation without a message.
        (masked(0x80, b"x"), CloseCode::PROTOCOL),
        // A new message inside a fragmented one.
        (
            [masked(0x02, b"a"), masked(0x82, b"b")].concat(),
            CloseCode::PROTOCOL,
        ),
        // A frame longer than the limit is refused from its head alone.
        (vec![0x82, 0xFE, 0x04, 0x01, 1, 2, 3, 4], CloseCode::TOO_BIG),
        // Fragments adding up to more than the limit.
        (
            [masked(0x02, &[0; 600]), masked(0x80, &[0; 600])].concat(),
            CloseCode::TOO_BIG,
        ),
        // A reserved close code.
        (masked(0x88, &[0x03, 0xed]), CloseCode::PROTOCOL),
    ];
    for (wire, code) in cases {
        let (mut client, mut rd, _wr) = pair(4096, 1024);
        client.write_all(&wire).await.unwrap();
        let err = rd.next().await.unwrap().unwrap_err();
        assert_eq!(err.close_code(), Some(code), "{err}");
        assert!(rd.next().await.is_none());
    }
}

#[tokio::test]
async fn close_frame_ends_the_stream_and_eof_is_the_end_too() {
    let (mut client, mut rd, _wr) = pair(4096, 1024);
    client
        .write_all(&masked(0x88, b"\x03\xe8bye"))
        .await
        .unwrap();
    assert_eq!(
        rd.next().await.unwrap().unwrap(),
        Incoming::Close(Some(CloseFrame::new(CloseCode::NORMAL, "bye")))
    );
    assert!(rd.next().await.is_none());

    let (mut client, mut rd, _wr) = pair(4096, 1024);
    // Half a frame, then the client is gone.
    client
        .write_all(&masked(0x82, b"abcdef")[..4])
        .await
        .unwrap();
    drop(client);
    assert!(rd.next().await.is_none());
}

#[tokio::test]
async fn queued_messages_go_out_whole_through_partial_writes() {
    // An 8-byte pipe: every write is partial.
    let (mut client, _rd, mut wr) = pair(8, 1024);
    let big = Bytes::from((0..70_000u32).map(|i| i as u8).collect::<Vec<u8>>());
    let reader = tokio::spawn(async move { server_frames(&mut client, 4).await });
    wr.queue_binary(&[1], Bytes::from_static(b"small")).unwrap();
    wr.queue_binary(&[2], big.clone()).unwrap();
    wr.queue_binary(&[3], Bytes::new()).unwrap();
    assert_eq!(wr.queued(), 2 + 6 + 10 + 70_001 + 2 + 1);
    wr.close(Some(CloseFrame::new(CloseCode::NORMAL, "")))
        .await
        .unwrap();
    assert_eq!(wr.queued(), 0);
    let frames = reader.await.unwrap();
    let mut expected_big = vec![2u8];
    expected_big.extend_from_slice(&big);
    assert_eq!(
        frames,
        vec![
            (OpCode::Binary, b"\x01small".to_vec()),
            (OpCode::Binary, expected_big),
            (OpCode::Binary, vec![3]),
            (OpCode::Close, vec![0x03, 0xe8]),
        ]
    );
    assert!(matches!(
        wr.queue_binary(&[1], Bytes::new()),
        Err(Error::Closed)
    ));
}

#[tokio::test]
async fn an_interrupted_flush_never_cuts_a_frame() {
    let (mut client, _rd, mut wr) = pair(1024, 1024);
    let big = Bytes::from(vec![7u8; 10_000]);
    wr.queue_binary(&[1], big.clone()).unwrap();
    // The pipe takes 1 KiB, then the flush waits: drop it there.
    let cut = tokio::time::timeout(Duration::from_millis(50), wr.flush()).await;
    assert!(cut.is_err());
    let reader = tokio::spawn(async move { server_frames(&mut client, 2).await });
    wr.send_binary(&[2], Bytes::from_static(b"next"))
        .await
        .unwrap();
    let frames = reader.await.unwrap();
    assert_eq!(frames[0].1.len(), 10_001);
    assert_eq!(frames[1], (OpCode::Binary, b"\x02next".to_vec()));
}

#[tokio::test]
async fn no_pong_after_close() {
    let (mut client, mut rd, mut wr) = pair(4096, 1024);
    wr.close(None).await.unwrap();
    client.write_all(&masked(0x89, b"late")).await.unwrap();
    client.write_all(&masked(0x88, b"")).await.unwrap();
    assert_eq!(rd.next().await.unwrap().unwrap(), Incoming::Close(None));
    assert!(
        tokio::time::timeout(Duration::from_millis(50), wr.control_due())
            .await
            .is_err()
    );
    assert_eq!(
        server_frames(&mut client, 1).await,
        vec![(OpCode::Close, vec![])]
    );
}
