//! Codec behaviour: partial input, limits, release of the zlib contexts, typed errors.

use bytes::{Bytes, BytesMut};

use super::{FrameDecoder, FrameEncoder};
use crate::spdy::frame::{
    Data, Frame, FrameError, HeaderBlock, Headers, Ping, PingId, StreamId, SynReply, SynStream,
    MAX_FRAME_LEN,
};
use crate::spdy::header_block::{BlockKind, HeaderBlockError, HeaderEncoder};

fn syn_stream(id: u32, pairs: &[(&str, &str)]) -> Frame {
    Frame::SynStream(SynStream {
        stream_id: StreamId::new(id),
        associated_stream_id: StreamId::ZERO,
        priority: 0,
        slot: 0,
        fin: false,
        unidirectional: false,
        headers: pairs.iter().copied().collect(),
    })
}

fn encode(frames: &[Frame]) -> BytesMut {
    let mut encoder = FrameEncoder::new();
    let mut out = BytesMut::new();
    for frame in frames {
        encoder.encode(frame, &mut out).unwrap();
    }
    out
}

fn decode_err(bytes: &[u8]) -> FrameError {
    FrameDecoder::new()
        .decode(&mut BytesMut::from(bytes))
        .expect_err("must be refused")
}

/// A SYN_STREAM for stream 1 whose header block is `raw`, compressed on a fresh context: lets
/// tests put blocks on the wire that our encoder would refuse to produce.
fn syn_stream_with_raw_block(raw: &[u8]) -> Vec<u8> {
    let mut deflate = flate2::Compress::new(flate2::Compression::best(), true);
    deflate
        .set_dictionary(crate::spdy::header_block::DICTIONARY)
        .unwrap();
    let mut block = Vec::with_capacity(raw.len() + 64);
    deflate
        .compress_vec(raw, &mut block, flate2::FlushCompress::Sync)
        .unwrap();
    assert_eq!(deflate.total_in() as usize, raw.len());
    with_block(&block)
}

fn with_block(block: &[u8]) -> Vec<u8> {
    let mut frame = vec![
        0x80, 0x03, 0x00, 0x01, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0,
    ];
    let len = (10 + block.len()) as u32;
    frame[5..8].copy_from_slice(&len.to_be_bytes()[1..]);
    frame.extend_from_slice(block);
    frame
}

fn raw_block(pairs: &[(&str, &str)]) -> Vec<u8> {
    let mut out = (pairs.len() as u32).to_be_bytes().to_vec();
    for (n, v) in pairs {
        out.extend_from_slice(&(n.len() as u32).to_be_bytes());
        out.extend_from_slice(n.as_bytes());
        out.extend_from_slice(&(v.len() as u32).to_be_bytes());
        out.extend_from_slice(v.as_bytes());
    }
    out
}

#[test]
fn waits_for_whole_frames_without_consuming() {
    let wire = encode(&[
        syn_stream(1, &[("streamtype", "error")]),
        Frame::Data(Data {
            stream_id: StreamId::new(1),
            fin: true,
            payload: Bytes::from_static(b"hello"),
        }),
    ]);
    // Feed the bytes in every possible pair of pieces.
    for split in 0..wire.len() {
        let mut decoder = FrameDecoder::new();
        let mut buf = BytesMut::from(&wire[..split]);
        let mut frames = Vec::new();
        while let Some(frame) = decoder.decode(&mut buf).unwrap() {
            frames.push(frame);
        }
        let pending = buf.len();
        buf.extend_from_slice(&wire[split..]);
        while let Some(frame) = decoder.decode(&mut buf).unwrap() {
            frames.push(frame);
        }
        assert_eq!(frames.len(), 2, "split at {split}");
        assert!(buf.is_empty());
        assert!(pending <= split);
    }
}

#[test]
fn partial_frame_reserves_the_rest() {
    let mut buf = BytesMut::with_capacity(16);
    buf.extend_from_slice(&[0, 0, 0, 1, 0, 0x01, 0x00, 0x00, 1, 2]);
    assert_eq!(FrameDecoder::new().decode(&mut buf).unwrap(), None);
    assert_eq!(buf.len(), 10);
    assert!(buf.capacity() >= 8 + 0x10000);
}

#[test]
fn bytes_missing_counts_to_the_frame_boundary() {
    let frame = [0, 0, 0, 1, 0, 0, 0, 4, b'a', b'b', b'c', b'd'];
    assert_eq!(
        FrameDecoder::bytes_missing(&frame[..7]),
        None,
        "head incomplete"
    );
    assert_eq!(FrameDecoder::bytes_missing(&frame[..8]), Some(4));
    assert_eq!(FrameDecoder::bytes_missing(&frame[..11]), Some(1));
    assert_eq!(FrameDecoder::bytes_missing(&frame), None, "whole frame");
    let mut more = frame.to_vec();
    more.extend_from_slice(&frame[..3]);
    assert_eq!(
        FrameDecoder::bytes_missing(&more),
        None,
        "whole frame and more"
    );
}

#[test]
fn data_payload_is_zero_copy() {
    let mut buf = BytesMut::new();
    FrameEncoder::encode_data_head(StreamId::new(3), false, 1000, &mut buf);
    buf.resize(8 + 1000, b'a');
    buf.extend_from_slice(&[0xAA]);
    let start = buf.as_ptr() as usize;
    let Some(Frame::Data(data)) = FrameDecoder::new().decode(&mut buf).unwrap() else {
        panic!("expected DATA");
    };
    assert_eq!(&data.payload[..], &[b'a'; 1000][..]);
    assert_eq!(
        data.payload.as_ptr() as usize,
        start + 8,
        "payload points into the read buffer"
    );
    assert_eq!(&buf[..], &[0xAA]);
}

#[test]
fn small_data_payload_is_copied_and_the_buffer_stays_unshared() {
    let mut buf = BytesMut::new();
    buf.extend_from_slice(&[0, 0, 0, 3, 0, 0, 0, 4, b'a', b'b', b'c', b'd', 0xAA]);
    let start = buf.as_ptr() as usize;
    let Some(Frame::Data(data)) = FrameDecoder::new().decode(&mut buf).unwrap() else {
        panic!("expected DATA");
    };
    assert_eq!(&data.payload[..], b"abcd");
    assert_ne!(data.payload.as_ptr() as usize, start + 8);
    assert_eq!(&buf[..], &[0xAA]);
    // Still the only owner of its allocation: room is reclaimed in place, not reallocated.
    let cap = buf.capacity();
    buf.clear();
    buf.reserve(cap + 1);
    assert_eq!(buf.as_ptr() as usize, start);
}

#[test]
fn largest_data_frame_is_accepted() {
    let mut wire = BytesMut::new();
    FrameEncoder::encode_data_head(StreamId::new(1), false, MAX_FRAME_LEN, &mut wire);
    wire.resize(8 + MAX_FRAME_LEN, 7);
    let Some(Frame::Data(data)) = FrameDecoder::new().decode(&mut wire).unwrap() else {
        panic!("expected DATA");
    };
    assert_eq!(data.payload.len(), 16 * 1024 * 1024 - 1);
}

#[test]
fn data_head_for_vectored_writes() {
    let mut head = BytesMut::new();
    FrameEncoder::encode_data_head(StreamId::new(3), true, 0x012345, &mut head);
    assert_eq!(&head[..], &[0, 0, 0, 3, 1, 0x01, 0x23, 0x45]);
}

#[test]
#[should_panic(expected = "24-bit")]
fn data_head_refuses_oversized_payloads() {
    FrameEncoder::encode_data_head(
        StreamId::new(3),
        false,
        MAX_FRAME_LEN + 1,
        &mut BytesMut::new(),
    );
}

#[test]
fn oversized_data_frame_is_refused_by_encode() {
    let frame = Frame::Data(Data {
        stream_id: StreamId::new(1),
        fin: false,
        payload: Bytes::from(vec![0; MAX_FRAME_LEN + 1]),
    });
    let mut out = BytesMut::new();
    let err = FrameEncoder::new().encode(&frame, &mut out).unwrap_err();
    assert_eq!(err, FrameError::FrameTooLarge(MAX_FRAME_LEN + 1));
    assert!(out.is_empty());
}

#[test]
fn control_frame_limit() {
    // A PING claiming 2 MiB is refused from its header alone.
    let err = decode_err(&[0x80, 0x03, 0x00, 0x06, 0x00, 0x20, 0x00, 0x00]);
    assert_eq!(err, FrameError::FrameTooLarge(0x20_0000));
    let mut small = FrameDecoder::with_limits(100, 1024);
    let wire = [0x80, 0x03, 0x00, 0x04, 0x00, 0x00, 0x00, 0x65];
    assert_eq!(
        small.decode(&mut BytesMut::from(&wire[..])),
        Err(FrameError::FrameTooLarge(101))
    );
}

#[test]
fn unknown_and_unsupported_frames() {
    assert_eq!(
        decode_err(&[0x80, 0x03, 0x00, 0x0A, 0, 0, 0, 0]),
        FrameError::UnknownControlType(10)
    );
    assert_eq!(
        decode_err(&[0x80, 0x03, 0x00, 0x05, 0, 0, 0, 0]),
        FrameError::UnknownControlType(5)
    );
    assert_eq!(
        decode_err(&[0x80, 0x02, 0x00, 0x06, 0, 0, 0, 4, 0, 0, 0, 1]),
        FrameError::UnsupportedVersion(2)
    );
}

#[test]
fn bad_lengths() {
    let cases: &[(&[u8], &str, u32)] = &[
        (&[0x80, 3, 0, 6, 0, 0, 0, 3, 0, 0, 1], "PING", 3),
        (&[0x80, 3, 0, 6, 0, 0, 0, 5, 0, 0, 0, 1, 0], "PING", 5),
        (&[0x80, 3, 0, 7, 0, 0, 0, 4, 0, 0, 0, 0], "GOAWAY", 4),
        (&[0x80, 3, 0, 9, 0, 0, 0, 4, 0, 0, 0, 1], "WINDOW_UPDATE", 4),
        (&[0x80, 3, 0, 3, 0, 0, 0, 4, 0, 0, 0, 1], "RST_STREAM", 4),
        (
            &[0x80, 3, 0, 3, 0, 0, 0, 9, 0, 0, 0, 1, 0, 0, 0, 5, 0],
            "RST_STREAM",
            9,
        ),
        (&[0x80, 3, 0, 1, 0, 0, 0, 2, 0, 1], "SYN_STREAM", 2),
        (&[0x80, 3, 0, 2, 0, 0, 0, 2, 0, 1], "SYN_REPLY", 2),
        (&[0x80, 3, 0, 4, 0, 0, 0, 4, 0, 0, 0, 1], "SETTINGS", 4),
    ];
    for &(bytes, ty, length) in cases {
        assert_eq!(
            decode_err(bytes),
            FrameError::BadLength { ty, length },
            "{ty}"
        );
    }
}

#[test]
fn zero_ids_and_bad_flags() {
    assert_eq!(
        decode_err(&[0, 0, 0, 0, 0, 0, 0, 1, 9]),
        FrameError::ZeroStreamId("DATA")
    );
    // Refused from the header alone, before the payload arrives.
    assert_eq!(
        decode_err(&[0, 0, 0, 0, 0, 0, 1, 0]),
        FrameError::ZeroStreamId("DATA")
    );
    assert_eq!(
        decode_err(&[0x80, 3, 0, 3, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 5]),
        FrameError::ZeroStreamId("RST_STREAM")
    );
    assert_eq!(
        decode_err(&[0x80, 3, 0, 3, 0, 0, 0, 8, 0, 0, 0, 1, 0, 0, 0, 0]),
        FrameError::ZeroRstStatus
    );
    assert_eq!(
        decode_err(&[0x80, 3, 0, 6, 0, 0, 0, 4, 0, 0, 0, 0]),
        FrameError::ZeroPingId
    );
    assert_eq!(
        decode_err(&[0x80, 3, 0, 6, 1, 0, 0, 4, 0, 0, 0, 1]),
        FrameError::BadFlags {
            ty: "PING",
            flags: 1
        }
    );
    assert_eq!(
        decode_err(&[0x80, 3, 0, 7, 1, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0]),
        FrameError::BadFlags {
            ty: "GOAWAY",
            flags: 1
        }
    );
    assert_eq!(
        decode_err(&[0x80, 3, 0, 9, 2, 0, 0, 8, 0, 0, 0, 1, 0, 0, 0, 1]),
        FrameError::BadFlags {
            ty: "WINDOW_UPDATE",
            flags: 2
        }
    );
    let empty_reply = [0x80, 3, 0, 2, 0, 0, 0, 4, 0, 0, 0, 0];
    assert_eq!(
        decode_err(&empty_reply),
        FrameError::ZeroStreamId("SYN_REPLY")
    );
    let empty_syn = [0x80, 3, 0, 1, 0, 0, 0, 10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    assert_eq!(
        decode_err(&empty_syn),
        FrameError::ZeroStreamId("SYN_STREAM")
    );
    let empty_headers = [0x80, 3, 0, 8, 0, 0, 0, 4, 0, 0, 0, 0];
    assert_eq!(
        decode_err(&empty_headers),
        FrameError::ZeroStreamId("HEADERS")
    );
}

/// What spdystream refuses, our own sessions refuse: a name that is not lowercase, a duplicate
/// its check sees (only names that are their own `http.Header` key), a hop-by-hop name.
#[test]
fn header_rule_violations() {
    let header_err =
        |pairs: &[(&str, &str)]| match decode_err(&syn_stream_with_raw_block(&raw_block(pairs))) {
            FrameError::HeaderBlock(e) => e,
            other => panic!("not a header block error: {other:?}"),
        };
    assert_eq!(
        header_err(&[("StreamType", "error")]),
        HeaderBlockError::UppercaseName("streamtype".into())
    );
    assert_eq!(
        header_err(&[("8080", "1"), ("8080", "2")]),
        HeaderBlockError::DuplicateName("8080".into())
    );
    for name in [
        "connection",
        "host",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
    ] {
        assert_eq!(
            header_err(&[(name, "x")]),
            HeaderBlockError::ForbiddenName {
                name: name.into(),
                kind: BlockKind::SynStream
            }
        );
    }
}

/// What spdystream accepts, every decoder reads as it does: a repeated `streamtype` (its
/// duplicate check misses it), an empty name, values with NULs.
#[test]
fn blocks_spdystream_accepts_are_read_as_it_reads_them() {
    let frame = syn_stream_with_raw_block(&raw_block(&[
        ("streamtype", "stdout\0"),
        ("port", "1"),
        ("streamtype", "stderr"),
        ("", "x"),
    ]));
    for mut decoder in [
        FrameDecoder::new(),
        FrameDecoder::following(1 << 20, 1 << 16),
    ] {
        let Some(Frame::SynStream(syn)) = decoder.decode(&mut BytesMut::from(&frame[..])).unwrap()
        else {
            panic!("a SYN_STREAM");
        };
        assert_eq!(syn.headers.get("streamtype"), Some(&b"stdout"[..]));
        assert_eq!(syn.headers.get_all("streamtype").count(), 3);
        assert_eq!(syn.headers.get(""), Some(&b"x"[..]));
    }
}

/// An observer's decoder reads what spdystream refuses, as spdystream read it before refusing.
#[test]
fn a_following_decoder_reads_what_spdystream_refuses() {
    for pairs in [
        &[("StreamType", "stdout")][..],
        &[("streamtype", "stdout"), ("host", "x")],
        &[("streamtype", "stdout"), ("1", "a"), ("1", "b")],
    ] {
        let frame = syn_stream_with_raw_block(&raw_block(pairs));
        assert!(matches!(decode_err(&frame), FrameError::HeaderBlock(_)));
        let decoded = FrameDecoder::following(1 << 20, 1 << 16)
            .decode(&mut BytesMut::from(&frame[..]))
            .unwrap();
        let Some(Frame::SynStream(syn)) = decoded else {
            panic!("a SYN_STREAM");
        };
        assert_eq!(
            syn.headers.get("streamtype"),
            Some(&b"stdout"[..]),
            "{pairs:?}"
        );
    }
    // A layout it cannot follow still fails.
    let mut raw = raw_block(&[("streamtype", "stdout")]);
    raw.push(0);
    let frame = syn_stream_with_raw_block(&raw);
    assert!(FrameDecoder::following(1 << 20, 1 << 16)
        .decode(&mut BytesMut::from(&frame[..]))
        .is_err());
}

#[test]
fn zlib_bomb_is_refused() {
    // 1 MiB of one repeated byte compresses to about a kilobyte.
    let value = "a".repeat(1 << 20);
    let frame = syn_stream_with_raw_block(&raw_block(&[("bomb", &value)]));
    assert!(frame.len() < 8 * 1024, "compressed to {}", frame.len());
    let err = decode_err(&frame);
    assert_eq!(
        err,
        FrameError::HeaderBlock(HeaderBlockError::DecompressedTooLarge { limit: 64 * 1024 })
    );
    // The same frame passes with a large enough limit.
    let mut generous = FrameDecoder::with_limits(1 << 20, 2 << 20);
    assert!(generous
        .decode(&mut BytesMut::from(&frame[..]))
        .unwrap()
        .is_some());
}

#[test]
fn garbage_zlib_is_refused() {
    let err = decode_err(&with_block(&[
        0x78, 0xF9, 0xE3, 0xC6, 0xA7, 0xC2, 0xFF, 0xFF, 0xFF, 0xFF,
    ]));
    assert!(
        matches!(err, FrameError::HeaderBlock(HeaderBlockError::Corrupt(_))),
        "{err:?}"
    );
    let err = decode_err(&with_block(b"not zlib at all"));
    assert!(
        matches!(err, FrameError::HeaderBlock(HeaderBlockError::Corrupt(_))),
        "{err:?}"
    );
}

#[test]
fn bytes_after_the_zlib_stream_end_are_refused() {
    // A block that finishes its zlib stream and then carries one more byte.
    let mut deflate = flate2::Compress::new(flate2::Compression::best(), true);
    deflate
        .set_dictionary(crate::spdy::header_block::DICTIONARY)
        .unwrap();
    let mut block = Vec::with_capacity(128);
    deflate
        .compress_vec(&raw_block(&[]), &mut block, flate2::FlushCompress::Finish)
        .unwrap();
    block.push(0);
    let err = decode_err(&with_block(&block));
    assert_eq!(err, FrameError::HeaderBlock(HeaderBlockError::StreamEnded));
}

#[test]
fn truncated_block_is_refused() {
    // Our own block, cut before its sync flush: the pairs cannot all be inflated.
    let mut encoder = HeaderEncoder::new();
    let mut block = BytesMut::new();
    let pairs: HeaderBlock = [("streamtype", "error")].into_iter().collect();
    encoder.encode(&pairs, &mut block).unwrap();
    let err = decode_err(&with_block(&block[..block.len() - 10]));
    assert!(matches!(err, FrameError::HeaderBlock(_)), "{err:?}");
}

#[test]
fn release_on_the_decoder() {
    let wire = encode(&[
        syn_stream(1, &[("streamtype", "error")]),
        Frame::Headers(Headers {
            stream_id: StreamId::new(1),
            fin: false,
            headers: [("x", "y")].into_iter().collect(),
        }),
        Frame::SynReply(SynReply {
            stream_id: StreamId::new(1),
            fin: false,
            headers: HeaderBlock::new(),
        }),
    ]);
    let mut decoder = FrameDecoder::new();
    let mut buf = wire;
    assert!(!decoder.header_context_allocated());
    assert!(matches!(
        decoder.decode(&mut buf).unwrap(),
        Some(Frame::SynStream(_))
    ));
    assert!(decoder.header_context_allocated());
    decoder.release_header_context();
    assert!(!decoder.header_context_allocated());
    let Some(Frame::Headers(headers)) = decoder.decode(&mut buf).unwrap() else {
        panic!("expected HEADERS");
    };
    assert!(headers.headers.is_empty());
    assert_eq!(headers.stream_id, StreamId::new(1));
    assert_eq!(
        decoder.decode(&mut buf),
        Err(FrameError::HeaderContextReleased)
    );

    // Frames without header blocks still decode.
    let mut ping = BytesMut::from(&[0x80, 3, 0, 6, 0, 0, 0, 4, 0, 0, 0, 2][..]);
    assert_eq!(
        decoder.decode(&mut ping).unwrap(),
        Some(Frame::Ping(Ping { id: PingId(2) }))
    );
}

#[test]
fn release_on_the_encoder() {
    let mut encoder = FrameEncoder::new();
    let mut out = BytesMut::new();
    assert!(!encoder.header_context_allocated());
    encoder
        .encode(&syn_stream(1, &[("streamtype", "error")]), &mut out)
        .unwrap();
    assert!(encoder.header_context_allocated());
    encoder.release_header_context();
    assert!(!encoder.header_context_allocated());
    let before = out.len();
    for frame in [
        syn_stream(3, &[]),
        Frame::SynReply(SynReply {
            stream_id: StreamId::new(2),
            fin: false,
            headers: HeaderBlock::new(),
        }),
        Frame::Headers(Headers {
            stream_id: StreamId::new(1),
            fin: false,
            headers: HeaderBlock::new(),
        }),
    ] {
        assert_eq!(
            encoder.encode(&frame, &mut out),
            Err(FrameError::HeaderContextReleased)
        );
    }
    assert_eq!(out.len(), before);
    encoder
        .encode(&Frame::Ping(Ping { id: PingId(1) }), &mut out)
        .unwrap();
}

#[test]
fn encoder_refuses_what_the_peer_would_refuse() {
    let mut encoder = FrameEncoder::new();
    let mut out = BytesMut::new();
    let err = encoder
        .encode(&syn_stream(1, &[("Host", "example")]), &mut out)
        .unwrap_err();
    assert_eq!(
        err,
        FrameError::HeaderBlock(HeaderBlockError::ForbiddenName {
            name: "host".into(),
            kind: BlockKind::SynStream
        })
    );
    assert_eq!(
        encoder.encode(&syn_stream(0, &[]), &mut out),
        Err(FrameError::ZeroStreamId("SYN_STREAM"))
    );
    assert_eq!(
        encoder.encode(&Frame::Ping(Ping { id: PingId(0) }), &mut out),
        Err(FrameError::ZeroPingId)
    );
    assert!(out.is_empty());
    // None of the refusals touched the deflate context: the next block is still the first.
    assert!(!encoder.header_context_allocated());
    encoder
        .encode(&syn_stream(1, &[("streamtype", "error")]), &mut out)
        .unwrap();
    assert_eq!(&out[18..20], &[0x78, 0xF9]);
    let decoded = FrameDecoder::new().decode(&mut out).unwrap();
    assert_eq!(decoded, Some(syn_stream(1, &[("streamtype", "error")])));
}
