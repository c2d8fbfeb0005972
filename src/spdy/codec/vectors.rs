//! The conformance vectors of PROTOCOL.md §6.2, both directions, byte for byte.

use bytes::{Bytes, BytesMut};

use super::{FrameDecoder, FrameEncoder};
use crate::spdy::frame::{
    Data, Frame, GoAway, GoAwayStatus, HeaderBlock, Ping, PingId, RstStatus, RstStream, StreamId,
    SynReply, SynStream, WindowUpdate,
};

/// Parses whitespace-separated hex as written in PROTOCOL.md.
fn hex(text: &str) -> Vec<u8> {
    text.split_whitespace()
        .map(|byte| u8::from_str_radix(byte, 16).expect("hex byte"))
        .collect()
}

fn decode_one(decoder: &mut FrameDecoder, bytes: &[u8]) -> Frame {
    let mut buf = BytesMut::from(bytes);
    let frame = decoder
        .decode(&mut buf)
        .expect("valid frame")
        .expect("whole frame");
    assert!(buf.is_empty(), "frame left {} bytes", buf.len());
    frame
}

fn encode_one(frame: &Frame) -> Vec<u8> {
    let mut out = BytesMut::new();
    FrameEncoder::new().encode(frame, &mut out).unwrap();
    out.to_vec()
}

fn headers(pairs: &[(&str, &str)]) -> HeaderBlock {
    pairs.iter().copied().collect()
}

fn syn_stream(id: u32, block: HeaderBlock) -> Frame {
    Frame::SynStream(SynStream {
        stream_id: StreamId::new(id),
        associated_stream_id: StreamId::ZERO,
        priority: 0,
        slot: 0,
        fin: false,
        unidirectional: false,
        headers: block,
    })
}

const SYN_STREAM_1_ERROR: &str = "80 03 00 01 00 00 00 2A 00 00 00 01 00 00 00 00 00 00
    78 F9 E3 C6 A7 C2 62 60 60 60 04 A7 B3 92 A2 D4 C4 5C 68 51 C2 9A 5A 54 94 5F 04 00 00 00 FF FF";
const SYN_STREAM_3_STDIN: &str = "80 03 00 01 00 00 00 17 00 00 00 03 00 00 00 00 00 00
    C2 2E 55 5C 92 92 99 07 00 00 00 FF FF";
const SYN_STREAM_5_STDOUT: &str = "80 03 00 01 00 00 00 19 00 00 00 05 00 00 00 00 00 00
    C2 2A C5 56 5C 92 92 5F 5A 02 00 00 00 FF FF";
const PYTHON_FIRST_BLOCK: &str =
    "78 F9 E3 C6 A7 C2 02 A6 23 46 70 3A 2B 29 4A 4D CC 85 16 25 AC A9 A0 80 06 00 00 00 FF FF";
const SYN_REPLY_1: &str =
    "80 03 00 02 00 00 00 14 00 00 00 01 78 F9 E3 C6 A7 C2 62 60 60 60 00 00 00 00 FF FF";
const SYN_REPLY_3: &str = "80 03 00 02 00 00 00 0E 00 00 00 03 62 60 60 60 00 00 00 00 FF FF";
const PORT_FORWARD_ERROR: &str = "80 03 00 01 00 00 00 43 00 00 00 01 00 00 00 00 00 00
    78 F9 E3 C6 A7 C2 62 60 60 60 06 A7 B3 92 A2 D4 C4 5C 68 51 C2 9A 5A 54 94 5F 04 29 96 8B
    4A 40 B4 85 81 85 01 03 03 03 67 11 24 1A 33 53 18 18 18 18 0D 00 00 00 00 FF FF";

#[test]
fn three_syn_streams_share_one_context() {
    let mut decoder = FrameDecoder::new();
    for (bytes, id, value) in [
        (SYN_STREAM_1_ERROR, 1, "error"),
        (SYN_STREAM_3_STDIN, 3, "stdin"),
        (SYN_STREAM_5_STDOUT, 5, "stdout"),
    ] {
        let frame = decode_one(&mut decoder, &hex(bytes));
        assert_eq!(frame, syn_stream(id, headers(&[("streamtype", value)])));
    }
}

#[test]
fn three_syn_streams_in_one_buffer() {
    let mut buf = BytesMut::new();
    for bytes in [SYN_STREAM_1_ERROR, SYN_STREAM_3_STDIN, SYN_STREAM_5_STDOUT] {
        buf.extend_from_slice(&hex(bytes));
    }
    let mut decoder = FrameDecoder::new();
    let mut ids = Vec::new();
    while let Some(frame) = decoder.decode(&mut buf).unwrap() {
        ids.push(frame.stream_id().unwrap().get());
    }
    assert_eq!(ids, [1, 3, 5]);
    assert!(buf.is_empty());
}

#[test]
fn python_zlib_first_block_is_accepted() {
    let block = hex(PYTHON_FIRST_BLOCK);
    let mut frame = hex("80 03 00 01 00 00 00 00 00 00 00 01 00 00 00 00 00 00");
    frame[7] = (10 + block.len()) as u8;
    frame.extend_from_slice(&block);
    let decoded = decode_one(&mut FrameDecoder::new(), &frame);
    assert_eq!(decoded, syn_stream(1, headers(&[("streamtype", "error")])));
}

#[test]
fn empty_syn_replies_share_one_context() {
    let mut decoder = FrameDecoder::new();
    for (bytes, id) in [(SYN_REPLY_1, 1), (SYN_REPLY_3, 3)] {
        let frame = decode_one(&mut decoder, &hex(bytes));
        assert_eq!(
            frame,
            Frame::SynReply(SynReply {
                stream_id: StreamId::new(id),
                fin: false,
                headers: HeaderBlock::new(),
            })
        );
    }
}

#[test]
fn port_forward_error_stream() {
    let frame = decode_one(&mut FrameDecoder::new(), &hex(PORT_FORWARD_ERROR));
    let Frame::SynStream(syn) = frame else {
        panic!("not a SYN_STREAM: {frame:?}");
    };
    assert_eq!(syn.stream_id, StreamId::new(1));
    assert_eq!(syn.headers.len(), 3);
    assert_eq!(syn.headers.get("port"), Some(&b"8080"[..]));
    assert_eq!(syn.headers.get("requestid"), Some(&b"0"[..]));
    assert_eq!(syn.headers.get("streamtype"), Some(&b"error"[..]));
}

/// Fixed-layout frames: encoding gives the vector, decoding the vector gives the frame.
#[test]
fn simple_frames_both_directions() {
    let cases: Vec<(&str, Frame)> = vec![
        (
            "00 00 00 03 00 00 00 04 66 6F 6F 0A",
            Frame::Data(Data {
                stream_id: StreamId::new(3),
                fin: false,
                payload: Bytes::from_static(b"foo\n"),
            }),
        ),
        (
            "00 00 00 03 01 00 00 00",
            Frame::Data(Data {
                stream_id: StreamId::new(3),
                fin: true,
                payload: Bytes::new(),
            }),
        ),
        (
            "80 03 00 03 00 00 00 08 00 00 00 05 00 00 00 05",
            Frame::RstStream(RstStream {
                stream_id: StreamId::new(5),
                status: RstStatus::Cancel,
            }),
        ),
        (
            "80 03 00 06 00 00 00 04 00 00 00 01",
            Frame::Ping(Ping { id: PingId(1) }),
        ),
        (
            "80 03 00 07 00 00 00 08 00 00 00 00 00 00 00 00",
            Frame::GoAway(GoAway {
                last_good_stream_id: StreamId::ZERO,
                status: GoAwayStatus::Ok,
            }),
        ),
        (
            "80 03 00 09 00 00 00 08 00 00 00 01 00 01 00 00",
            Frame::WindowUpdate(WindowUpdate {
                stream_id: StreamId::new(1),
                delta: 65536,
            }),
        ),
    ];
    for (bytes, frame) in cases {
        let bytes = hex(bytes);
        assert_eq!(encode_one(&frame), bytes, "{frame:?}");
        assert_eq!(decode_one(&mut FrameDecoder::new(), &bytes), frame);
    }
}

#[test]
fn success_status_data_frame() {
    let status = br#"{"metadata":{},"status":"Success"}"#;
    let mut bytes = hex("00 00 00 01 00 00 00 22");
    bytes.extend_from_slice(status);
    let frame = Frame::Data(Data {
        stream_id: StreamId::new(1),
        fin: false,
        payload: Bytes::from_static(status),
    });
    assert_eq!(encode_one(&frame), bytes);
    assert_eq!(decode_one(&mut FrameDecoder::new(), &bytes), frame);
}

/// Our own compressed blocks: the first starts with the zlib header and dictionary id,
/// every block ends in one sync flush, and they inflate to the documented raw bytes.
#[test]
fn our_syn_streams_have_the_documented_shape() {
    let mut encoder = FrameEncoder::new();
    let mut out = BytesMut::new();
    encoder
        .encode(
            &syn_stream(1, headers(&[("streamtype", "error")])),
            &mut out,
        )
        .unwrap();
    let first_block = &out[18..];
    assert_eq!(first_block[0], 0x78);
    assert_eq!(&first_block[2..6], &[0xE3, 0xC6, 0xA7, 0xC2]);
    assert!(first_block.ends_with(&[0x00, 0x00, 0xFF, 0xFF]));
    assert_eq!(usize::from(out[7]), out.len() - 8);

    // Inflate with a plain zlib stream (not our decoder) to see the raw block.
    let mut inflate = flate2::Decompress::new(true);
    let mut raw = Vec::with_capacity(256);
    let err = inflate
        .decompress_vec(first_block, &mut raw, flate2::FlushDecompress::Sync)
        .unwrap_err();
    assert_eq!(err.needs_dictionary(), Some(0xE3C6_A7C2));
    inflate
        .set_dictionary(crate::spdy::header_block::DICTIONARY)
        .unwrap();
    let consumed = inflate.total_in() as usize;
    inflate
        .decompress_vec(
            &first_block[consumed..],
            &mut raw,
            flate2::FlushDecompress::Sync,
        )
        .unwrap();
    assert_eq!(inflate.total_in() as usize, first_block.len());
    assert_eq!(
        raw,
        hex("00 00 00 01 00 00 00 0A 73 74 72 65 61 6D 74 79 70 65 00 00 00 05 65 72 72 6F 72")
    );
    assert_eq!(&raw[8..18], b"streamtype");

    // The next block continues the stream: no second zlib header, one sync flush again.
    let mut second = BytesMut::new();
    encoder
        .encode(
            &syn_stream(3, headers(&[("streamtype", "stdin")])),
            &mut second,
        )
        .unwrap();
    let block = &second[18..];
    assert_ne!(block[0], 0x78);
    assert!(block.ends_with(&[0x00, 0x00, 0xFF, 0xFF]));
    assert_eq!(count_sync_markers(block), 1);
}

fn count_sync_markers(block: &[u8]) -> usize {
    block
        .windows(4)
        .filter(|w| *w == [0x00, 0x00, 0xFF, 0xFF])
        .count()
}

#[test]
fn many_blocks_on_one_context() {
    let mut encoder = FrameEncoder::new();
    let mut decoder = FrameDecoder::new();
    let mut wire = BytesMut::new();
    let mut sent = Vec::new();
    for i in 0..150u32 {
        let id = 2 * i + 1;
        let kind = ["error", "data"][i as usize % 2];
        let block = headers(&[
            ("streamtype", kind),
            ("port", "8080"),
            ("requestid", &(i / 2).to_string()),
        ]);
        let frame = if i % 3 == 0 {
            Frame::SynReply(SynReply {
                stream_id: StreamId::new(id),
                fin: false,
                headers: block,
            })
        } else {
            syn_stream(id, block)
        };
        let before = wire.len();
        encoder.encode(&frame, &mut wire).unwrap();
        assert!(wire.ends_with(&[0x00, 0x00, 0xFF, 0xFF]), "block {i}");
        assert_eq!(count_sync_markers(&wire[before..]), 1, "block {i}");
        sent.push(frame);
    }
    for frame in sent {
        assert_eq!(decoder.decode(&mut wire).unwrap(), Some(frame));
    }
    assert!(wire.is_empty());
}
