//! SPDY codec throughput: DATA frames with 32 KiB payloads (the copy-buffer size Kubernetes
//! uses, PROTOCOL.md §3.4) and the header-block round trip of a SYN_STREAM.
//!
//! Run with `cargo bench --bench spdy_codec`.

use bytes::{Bytes, BytesMut};
use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use kube_ws_proxy::spdy::codec::{FrameDecoder, FrameEncoder};
use kube_ws_proxy::spdy::frame::{Data, Frame, HeaderBlock, StreamId, SynStream};

const PAYLOAD: usize = 32 * 1024;
/// Frames per iteration, so per-iteration overhead does not dominate.
const FRAMES: usize = 64;

fn data_frame() -> Frame {
    Frame::Data(Data {
        stream_id: StreamId::new(5),
        fin: false,
        payload: Bytes::from(vec![0x5A; PAYLOAD]),
    })
}

fn syn_stream(id: u32) -> Frame {
    let mut headers = HeaderBlock::new();
    headers.push("streamtype", "data");
    headers.push("port", "8080");
    headers.push("requestid", (id / 4).to_string());
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

fn data(c: &mut Criterion) {
    let mut group = c.benchmark_group("data_32k");
    group.throughput(Throughput::Bytes((PAYLOAD * FRAMES) as u64));
    let frame = data_frame();
    let mut encoder = FrameEncoder::new();
    let mut out = BytesMut::with_capacity((PAYLOAD + 8) * FRAMES);

    group.bench_function("encode_copy", |b| {
        b.iter(|| {
            out.clear();
            for _ in 0..FRAMES {
                encoder.encode(black_box(&frame), &mut out).unwrap();
            }
        })
    });

    // What the session writer does for large payloads: only the head is serialised.
    group.bench_function("encode_head_only", |b| {
        b.iter(|| {
            out.clear();
            for _ in 0..FRAMES {
                FrameEncoder::encode_data_head(
                    StreamId::new(5),
                    false,
                    black_box(PAYLOAD),
                    &mut out,
                );
            }
        })
    });

    let mut wire = BytesMut::new();
    for _ in 0..FRAMES {
        encoder.encode(&frame, &mut wire).unwrap();
    }
    let wire = wire.freeze();
    group.bench_function("decode", |b| {
        let mut decoder = FrameDecoder::new();
        b.iter_batched_ref(
            || BytesMut::from(&wire[..]),
            |buf| {
                while let Some(frame) = decoder.decode(buf).unwrap() {
                    black_box(frame);
                }
            },
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

fn header_blocks(c: &mut Criterion) {
    let mut group = c.benchmark_group("syn_stream_headers");
    group.throughput(Throughput::Elements(FRAMES as u64));

    group.bench_function("encode", |b| {
        // One long-lived context, as on a connection.
        let mut encoder = FrameEncoder::new();
        let frames: Vec<Frame> = (0..FRAMES as u32).map(|i| syn_stream(2 * i + 1)).collect();
        let mut out = BytesMut::with_capacity(64 * FRAMES);
        b.iter(|| {
            out.clear();
            for frame in &frames {
                encoder.encode(black_box(frame), &mut out).unwrap();
            }
        })
    });

    group.bench_function("decode", |b| {
        // Decoding needs the matching stream from its start: each batch gets a fresh pair of
        // contexts and a fresh wire, built (unmeasured) in setup. The inflate state is
        // allocated lazily, so its allocation is part of what is measured.
        b.iter_batched_ref(
            || {
                let mut encoder = FrameEncoder::new();
                let mut wire = BytesMut::new();
                for i in 0..FRAMES as u32 {
                    encoder.encode(&syn_stream(2 * i + 1), &mut wire).unwrap();
                }
                (FrameDecoder::new(), wire)
            },
            |(decoder, wire)| {
                while let Some(frame) = decoder.decode(wire).unwrap() {
                    black_box(frame);
                }
            },
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

criterion_group!(benches, data, header_blocks);
criterion_main!(benches);
