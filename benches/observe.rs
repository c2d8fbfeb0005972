//! What following a relayed exec costs the relay: the passive observer alone
//! (`translate::observe`) on a 64 MiB stdout stream, fed in the relay's 32 KiB reads, the way
//! `RelayTap::relayed` feeds it (a fresh event list per read, the error stream's bytes kept).
//! Two scopes: everything (a recording needs every stream) and the error stream alone (the
//! audit log without a recording needs only the exit code). SPDY/3.1 (kubectl ≤ 1.30, relayed)
//! and `v5.channel.k8s.io` (passed through), both with 32 KiB DATA frames / messages.
//!
//! Run with `cargo bench --bench observe`. For instruction counts, which a busy machine does
//! not blur, one pass of one case under callgrind, counting `follow` alone:
//!
//!     OBSERVE_ONCE=spdy/error_stream valgrind --tool=callgrind --toggle-collect='*follow*' \
//!         target/release/deps/observe-<hash>

use bytes::{Bytes, BytesMut};
use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use kube_ws_proxy::spdy::codec::FrameEncoder;
use kube_ws_proxy::spdy::frame::{Data, Frame, HeaderBlock, StreamId, SynReply, SynStream};
use kube_ws_proxy::translate::observe::{Direction, ErrorStream, Observed, Observer, Scope};
use std::time::Duration;

const STDOUT: usize = 64 << 20;
const PIECE: usize = 32 * 1024;
const READ: usize = 32 * 1024;
const STATUS: &[u8] = br#"{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit code","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"3"}]}}"#;

fn syn(id: u32, streamtype: &str) -> Frame {
    let mut headers = HeaderBlock::new();
    headers.push("streamtype", streamtype);
    Frame::SynStream(SynStream {
        stream_id: StreamId::new(id),
        associated_stream_id: StreamId::ZERO,
        priority: 0,
        slot: 0,
        fin: false,
        unidirectional: false,
        headers,
    })
}

fn data(id: u32, payload: Bytes) -> Frame {
    Frame::Data(Data {
        stream_id: StreamId::new(id),
        fin: false,
        payload,
    })
}

/// A SPDY exec: the client's stream openings, the kubelet's replies, 64 MiB of stdout and
/// the error stream's Status.
fn spdy_session() -> (Vec<u8>, Vec<u8>) {
    let mut client = FrameEncoder::new();
    let mut server = FrameEncoder::new();
    let mut up = BytesMut::new();
    for (id, t) in [(1, "error"), (3, "stdin"), (5, "stdout"), (7, "stderr")] {
        client.encode(&syn(id, t), &mut up).unwrap();
    }
    let mut down = BytesMut::new();
    for id in [1, 3, 5, 7] {
        let reply = Frame::SynReply(SynReply {
            stream_id: StreamId::new(id),
            fin: false,
            headers: HeaderBlock::new(),
        });
        server.encode(&reply, &mut down).unwrap();
    }
    let piece = Bytes::from(vec![b'x'; PIECE]);
    for _ in 0..STDOUT / PIECE {
        server.encode(&data(5, piece.clone()), &mut down).unwrap();
    }
    server
        .encode(&data(1, Bytes::from_static(STATUS)), &mut down)
        .unwrap();
    (up.to_vec(), down.to_vec())
}

/// An unmasked binary message (the upstream's).
fn message(channel: u8, payload: &[u8], out: &mut Vec<u8>) {
    let len = payload.len() + 1;
    out.push(0x82);
    match len {
        0..=125 => out.push(len as u8),
        126..=65535 => {
            out.push(126);
            out.extend_from_slice(&(len as u16).to_be_bytes());
        }
        _ => {
            out.push(127);
            out.extend_from_slice(&(len as u64).to_be_bytes());
        }
    }
    out.push(channel);
    out.extend_from_slice(payload);
}

/// A v5 exec passed through: 64 MiB of stdout, then the Status on channel 3.
fn websocket_session() -> Vec<u8> {
    let mut down = Vec::with_capacity(STDOUT + STDOUT / PIECE * 8 + 1024);
    for c in 0..4 {
        message(c, b"", &mut down);
    }
    let piece = vec![b'x'; PIECE];
    for _ in 0..STDOUT / PIECE {
        message(1, &piece, &mut down);
    }
    message(3, STATUS, &mut down);
    down
}

/// What the tap does with each read.
#[inline(never)]
fn follow(observer: &mut Observer, up: &[u8], down: &[u8]) -> (Option<i32>, Option<String>) {
    let mut errors = ErrorStream::default();
    for (direction, bytes) in [
        (Direction::ClientToUpstream, up),
        (Direction::UpstreamToClient, down),
    ] {
        for read in bytes.chunks(READ) {
            let mut events = Vec::new();
            observer.feed(direction, read, &mut events).unwrap();
            for event in &events {
                if let Observed::Error(b) = event {
                    errors.push(b);
                }
            }
            black_box(events);
        }
    }
    errors.outcome()
}

const SCOPES: [(&str, Scope); 2] = [
    ("everything", Scope::Everything),
    ("error_stream", Scope::ErrorStream),
];

fn observe(c: &mut Criterion) {
    let (spdy_up, spdy_down) = spdy_session();
    let ws_down = websocket_session();
    let sessions = [
        (
            "spdy",
            "SPDY/3.1",
            "v4.channel.k8s.io",
            &spdy_up[..],
            &spdy_down[..],
        ),
        (
            "v5",
            "websocket",
            "v5.channel.k8s.io",
            &[][..],
            &ws_down[..],
        ),
    ];
    if let Ok(case) = std::env::var("OBSERVE_ONCE") {
        for (name, upgrade, protocol, up, down) in sessions {
            for (scope_name, scope) in SCOPES {
                if case == format!("{name}/{scope_name}") {
                    let mut o = Observer::with_scope(Some(upgrade), Some(protocol), scope).unwrap();
                    println!("{case}: {:?}", follow(&mut o, up, down));
                }
            }
        }
        return;
    }
    let mut group = c.benchmark_group("observe_64MiB_stdout");
    group.throughput(Throughput::Bytes(STDOUT as u64));
    group.sample_size(10);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(5));
    for (name, upgrade, protocol, up, down) in sessions {
        for (scope_name, scope) in SCOPES {
            let mut o = Observer::with_scope(Some(upgrade), Some(protocol), scope).unwrap();
            assert_eq!(follow(&mut o, up, down).0, Some(3), "{name} {scope_name}");
            group.bench_function(format!("{name}/{scope_name}"), |b| {
                b.iter(|| {
                    let mut o = Observer::with_scope(Some(upgrade), Some(protocol), scope).unwrap();
                    black_box(follow(&mut o, up, down))
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, observe);
criterion_main!(benches);
