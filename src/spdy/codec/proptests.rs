//! Property tests: every frame type survives encode → decode on shared contexts, in any
//! chunking, and arbitrary input never panics the decoder.

use bytes::{Bytes, BytesMut};
use proptest::collection::{btree_map, vec};
use proptest::prelude::*;

use super::{FrameDecoder, FrameEncoder};
use crate::spdy::frame::{
    Data, Frame, GoAway, GoAwayStatus, HeaderBlock, Headers, Ping, PingId, RstStatus, RstStream,
    Setting, Settings, StreamId, SynReply, SynStream, WindowUpdate,
};
use crate::spdy::header_block::BlockKind;

fn stream_id() -> impl Strategy<Value = StreamId> {
    (1..=0x7FFF_FFFFu32).prop_map(StreamId::new)
}

fn any_stream_id() -> impl Strategy<Value = StreamId> {
    (0..=0x7FFF_FFFFu32).prop_map(StreamId::new)
}

/// Lowercase, unique names that no frame type forbids, in random order; values may hold NUL
/// (several values) and any Unicode.
fn header_block() -> impl Strategy<Value = HeaderBlock> {
    btree_map(
        "[a-z][a-z0-9-]{0,12}",
        "\\PC{0,16}|[a-z]{0,3}\u{0}[a-z]{0,3}",
        0..6,
    )
    .prop_map(|map| {
        map.into_iter()
            .filter(|(name, _)| !BlockKind::SynStream.forbids(name))
            .collect::<Vec<_>>()
    })
    .prop_shuffle()
    .prop_map(|pairs| pairs.into_iter().collect())
}

fn frame() -> impl Strategy<Value = Frame> {
    prop_oneof![
        (stream_id(), any::<bool>(), vec(any::<u8>(), 0..64)).prop_map(
            |(stream_id, fin, payload)| {
                Frame::Data(Data {
                    stream_id,
                    fin,
                    payload: Bytes::from(payload),
                })
            }
        ),
        (
            stream_id(),
            any_stream_id(),
            0..=7u8,
            any::<u8>(),
            any::<bool>(),
            any::<bool>(),
            header_block()
        )
            .prop_map(
                |(
                    stream_id,
                    associated_stream_id,
                    priority,
                    slot,
                    fin,
                    unidirectional,
                    headers,
                )| {
                    Frame::SynStream(SynStream {
                        stream_id,
                        associated_stream_id,
                        priority,
                        slot,
                        fin,
                        unidirectional,
                        headers,
                    })
                }
            ),
        (stream_id(), any::<bool>(), header_block()).prop_map(|(stream_id, fin, headers)| {
            Frame::SynReply(SynReply {
                stream_id,
                fin,
                headers,
            })
        }),
        (stream_id(), 1..=20u32).prop_map(|(stream_id, code)| Frame::RstStream(RstStream {
            stream_id,
            status: RstStatus::from_code(code),
        })),
        (
            any::<bool>(),
            vec((any::<u8>(), 0..=0x00FF_FFFFu32, any::<u32>()), 0..5)
        )
            .prop_map(|(clear, entries)| Frame::Settings(Settings {
                clear,
                entries: entries
                    .into_iter()
                    .map(|(flags, id, value)| Setting { flags, id, value })
                    .collect(),
            })),
        (1..=u32::MAX).prop_map(|id| Frame::Ping(Ping { id: PingId(id) })),
        (any_stream_id(), any::<u32>()).prop_map(|(last, code)| Frame::GoAway(GoAway {
            last_good_stream_id: last,
            status: GoAwayStatus::from_code(code),
        })),
        (stream_id(), any::<bool>(), header_block()).prop_map(|(stream_id, fin, headers)| {
            Frame::Headers(Headers {
                stream_id,
                fin,
                headers,
            })
        }),
        (any_stream_id(), 1..=0x7FFF_FFFFu32)
            .prop_map(|(stream_id, delta)| Frame::WindowUpdate(WindowUpdate { stream_id, delta })),
    ]
}

/// Splits `wire` at the given points and feeds the pieces one by one, collecting frames.
fn decode_in_pieces(wire: &[u8], cuts: &[usize]) -> Vec<Frame> {
    let mut decoder = FrameDecoder::new();
    let mut buf = BytesMut::new();
    let mut frames = Vec::new();
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (wire.len() + 1)).collect();
    cuts.sort_unstable();
    cuts.push(wire.len());
    let mut from = 0;
    for cut in cuts {
        buf.extend_from_slice(&wire[from..cut]);
        from = cut;
        while let Some(frame) = decoder.decode(&mut buf).expect("valid wire") {
            frames.push(frame);
        }
    }
    assert!(buf.is_empty());
    frames
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn single_frame_round_trips(frame in frame()) {
        let mut wire = BytesMut::new();
        FrameEncoder::new().encode(&frame, &mut wire).unwrap();
        let decoded = FrameDecoder::new().decode(&mut wire).unwrap();
        prop_assert_eq!(decoded, Some(frame));
        prop_assert!(wire.is_empty());
    }

    #[test]
    fn sequences_round_trip_on_shared_contexts(
        frames in vec(frame(), 1..24),
        cuts in vec(any::<usize>(), 0..6),
    ) {
        let mut encoder = FrameEncoder::new();
        let mut wire = BytesMut::new();
        for frame in &frames {
            encoder.encode(frame, &mut wire).unwrap();
        }
        prop_assert_eq!(decode_in_pieces(&wire, &cuts), frames);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in vec(any::<u8>(), 0..512)) {
        let mut decoder = FrameDecoder::new();
        let mut buf = BytesMut::from(&bytes[..]);
        while let Ok(Some(_)) = decoder.decode(&mut buf) {}
    }

    #[test]
    fn corrupted_wire_never_panics(
        frames in vec(frame(), 1..8),
        flips in vec((any::<usize>(), any::<u8>()), 1..8),
    ) {
        let mut encoder = FrameEncoder::new();
        let mut wire = BytesMut::new();
        for frame in &frames {
            encoder.encode(frame, &mut wire).unwrap();
        }
        for (at, xor) in flips {
            let at = at % wire.len();
            wire[at] ^= xor;
        }
        let mut decoder = FrameDecoder::new();
        while let Ok(Some(_)) = decoder.decode(&mut wire) {}
    }
}
