//! The observer reads a stream's headers as the kubelet does (issue 35, finding 2): the first
//! NUL-separated part of a value, a repeated name's first value, any bytes; a block the
//! kubelet refuses is read as it read it before refusing.

use bytes::Bytes;

use super::tests::{data, encode, feed_chunked, merge, reply, want_spdy};
use super::*;
use crate::spdy::codec::FrameEncoder;
use crate::spdy::frame::{Frame, HeaderBlock, StreamId, SynStream};
use crate::spdy::header_block::DICTIONARY;

const UP: Direction = Direction::ClientToUpstream;
const DOWN: Direction = Direction::UpstreamToClient;

fn syn_with(id: u32, headers: HeaderBlock) -> Frame {
    Frame::SynStream(SynStream::new(StreamId::new(id), headers))
}

fn streamtype(id: u32, value: &[u8]) -> Frame {
    syn_with(id, [("streamtype", value)].into_iter().collect())
}

/// A client that writes SYN_STREAMs of raw blocks (any names, repeated ones too), compressed
/// on one zlib stream as a real client's are.
struct RawClient(flate2::Compress);

impl RawClient {
    fn new() -> RawClient {
        let mut deflate = flate2::Compress::new(flate2::Compression::default(), true);
        deflate.set_dictionary(DICTIONARY).unwrap();
        RawClient(deflate)
    }

    fn syn(&mut self, id: u32, pairs: &[(&[u8], &[u8])]) -> Vec<u8> {
        let mut raw = (pairs.len() as u32).to_be_bytes().to_vec();
        for (n, v) in pairs {
            for part in [n, v] {
                raw.extend_from_slice(&(part.len() as u32).to_be_bytes());
                raw.extend_from_slice(part);
            }
        }
        let mut block = Vec::with_capacity(raw.len() + 64);
        self.0
            .compress_vec(&raw, &mut block, flate2::FlushCompress::Sync)
            .unwrap();
        let len = 10 + block.len();
        let mut frame = vec![
            0x80,
            3,
            0,
            1,
            0,
            (len >> 16) as u8,
            (len >> 8) as u8,
            len as u8,
        ];
        frame.extend_from_slice(&id.to_be_bytes());
        frame.extend_from_slice(&[0; 6]);
        frame.extend_from_slice(&block);
        frame
    }
}

/// The kubelet's side of the usual session (stdout, stderr, the exit code), and the client's
/// resize and stdin, on streams 1 (error), 3 (stdin), 5 (stdout), 7 (stderr), 9 (resize).
fn usual_rest() -> (Vec<u8>, Vec<u8>) {
    let (_, up, down) = super::tests::spdy_session_parts();
    (up, down)
}

fn observer() -> Observer {
    Observer::for_protocol(Some("SPDY/3.1"), Some("v4.channel.k8s.io")).unwrap()
}

#[test]
fn stream_types_with_a_nul_are_the_kubelets_types() {
    let mut client = FrameEncoder::new();
    let syns = encode(
        &mut client,
        &[
            streamtype(1, b"error\0"),
            streamtype(3, b"stdin\0"),
            streamtype(5, b"stdout\0"),
            streamtype(7, b"stderr\0junk"),
            streamtype(9, b"resize\0\xff"),
        ],
    );
    let (up, down) = usual_rest();
    let mut o = observer();
    let mut got = Vec::new();
    o.feed(UP, &syns, &mut got).unwrap();
    assert_eq!(
        (feed_chunked(&mut o, &up, &down, 7)),
        want_spdy(),
        "everything the kubelet was sent and sent back is seen"
    );
    assert_eq!(
        o.spdy_streams(),
        Some(RemoteCommandStreams {
            error: Some(1),
            stdout: Some(5),
            stderr: Some(7),
        })
    );
}

#[test]
fn repeated_and_unusual_names_are_read_as_go_reads_them() {
    let mut raw = RawClient::new();
    let syns = [
        // Go files both under `Streamtype`: its duplicate check misses them, Get takes the first.
        raw.syn(1, &[(b"streamtype", b"error"), (b"streamtype", b"stdout")]),
        raw.syn(3, &[(b"streamtype", b"stdin\0"), (b"x", b"\xff\xfe")]),
        // Refused by spdystream (the kubelet's connection ends there), read all the same.
        raw.syn(5, &[(b"StreamType", b"stdout")]),
        raw.syn(7, &[(b"", b""), (b"streamtype", b"stderr"), (b"", b"")]),
        raw.syn(9, &[(b"streamtype", b"resize"), (b"host", b"x")]),
    ]
    .concat();
    let (up, down) = usual_rest();
    let mut o = observer();
    let mut got = Vec::new();
    o.feed(UP, &syns, &mut got).unwrap();
    assert_eq!(feed_chunked(&mut o, &up, &down, 1000), want_spdy());
}

/// Streams of types the kubelet does not know either: nothing on them is observed, and each
/// is reported (a required recording ends the session on it).
#[test]
fn streams_the_kubelet_does_not_know_carry_nothing_observed() {
    let mut client = FrameEncoder::new();
    let syns = encode(
        &mut client,
        &[
            streamtype(1, b"\0error"),
            streamtype(3, b"Stdout"),
            streamtype(5, b"stdout "),
            syn_with(7, HeaderBlock::new()),
        ],
    );
    let mut server = FrameEncoder::new();
    let down = encode(
        &mut server,
        &[
            reply(1),
            data(1, b"x"),
            data(3, b"x"),
            data(5, b"x"),
            data(7, b"x"),
        ],
    );
    let mut o = observer();
    let mut got = Vec::new();
    o.feed(UP, &syns, &mut got).unwrap();
    let unknown = |id: u32, ty: &str| {
        Observed::UnknownStream(format!(
            "stream {id} has a type the proxy does not know (streamtype \"{ty}\")"
        ))
    };
    assert_eq!(
        got,
        [
            unknown(1, ""),
            unknown(3, "Stdout"),
            unknown(5, "stdout "),
            unknown(7, "")
        ]
    );
    got.clear();
    o.feed(DOWN, &down, &mut got).unwrap();
    assert!(got.is_empty(), "{got:?}");
    // A long type is quoted in part, escaped.
    let mut client = FrameEncoder::new();
    let long = [b'\xff'; 100];
    let syn = encode(&mut client, &[streamtype(1, &long)]);
    let mut got = Vec::new();
    observer().feed(UP, &syn, &mut got).unwrap();
    let Some(Observed::UnknownStream(why)) = got.first() else {
        panic!("{got:?}");
    };
    assert_eq!(why.matches("\\xff").count(), 64, "{why}");
    assert!(why.ends_with("\\xff...\")"), "{why}");
}

#[test]
fn the_error_stream_alone_is_found_by_its_first_part() {
    let mut client = FrameEncoder::new();
    let syns = encode(
        &mut client,
        &[streamtype(1, b"error\0"), streamtype(5, b"stdout")],
    );
    let mut server = FrameEncoder::new();
    let status = br#"{"metadata":{},"status":"Success"}"#;
    let down = encode(&mut server, &[reply(1), data(5, b"out"), data(1, status)]);
    let mut o = Observer::with_scope(
        Some("SPDY/3.1"),
        Some("v4.channel.k8s.io"),
        Scope::ErrorStream,
    )
    .unwrap();
    let mut got = Vec::new();
    o.feed(UP, &syns, &mut got).unwrap();
    o.feed(DOWN, &down, &mut got).unwrap();
    assert_eq!(merge(got), [Observed::Error(Bytes::from_static(status))]);
}

/// A block the observer cannot read (too large for it to inflate) stops it with an error:
/// the relay then says the session could not be followed (and ends it under
/// `--record=required`), never records it as an unknown stream.
#[test]
fn a_block_it_cannot_read_is_an_error() {
    let mut client = FrameEncoder::new();
    let pad = vec![b'a'; 20 * 1024];
    let headers: HeaderBlock = [("streamtype", &b"stdout"[..]), ("x-pad", &pad)]
        .into_iter()
        .collect();
    let syns = encode(&mut client, &[syn_with(1, headers)]);
    let mut o = observer();
    let err = o.feed(UP, &syns, &mut Vec::new()).unwrap_err();
    assert!(matches!(err, ObserveError::Spdy(_)), "{err:?}");
    assert!(o.stopped());
}

mod port_forward {
    use super::*;
    use crate::audit::port_forward::ForwardedConnection;

    fn stream(id: u32, ty: &[u8], port: &[u8], request: &[u8]) -> Frame {
        syn_with(
            id,
            [("streamtype", ty), ("port", port), ("requestid", request)]
                .into_iter()
                .collect(),
        )
    }

    fn observe(frames: &[Frame], data_on: u32) -> PortForwardReport {
        let mut client = FrameEncoder::new();
        let mut bytes = encode(&mut client, frames);
        bytes.extend(encode(&mut client, &[data(data_on, b"abc")]));
        let watch = PortForwardWatch::new();
        watch.relayed(UP, &bytes);
        watch.finish()
    }

    fn connection(port: Option<u16>, request: &str, bytes_in: u64) -> ForwardedConnection {
        ForwardedConnection {
            port,
            request_id: request.into(),
            bytes_in,
            bytes_out: 0,
            error: None,
        }
    }

    /// One connection's error and data streams, with these ports and request ids.
    fn pair(ports: [&[u8]; 2], requests: [&[u8]; 2]) -> PortForwardReport {
        observe(
            &[
                stream(1, b"error", ports[0], requests[0]),
                stream(3, b"data\0", ports[1], requests[1]),
            ],
            3,
        )
    }

    #[test]
    fn a_port_with_a_nul_is_the_port_forwarded_to() {
        let report = pair([b"8080\0junk"; 2], [b"0", b"0\0x"]);
        assert_eq!(report.ports, [8080]);
        assert_eq!(report.connections, [connection(Some(8080), "0", 3)]);
    }

    #[test]
    fn the_data_streams_port_is_the_one_forwarded_to() {
        let report = pair([b"22", b"8080"], [b"7"; 2]);
        assert_eq!(report.ports, [8080]);
        assert_eq!(report.connections, [connection(Some(8080), "7", 3)]);
    }

    #[test]
    fn ports_the_kubelet_would_not_parse_are_no_ports() {
        for port in [&b"+8080"[..], b"8080 ", b"0", b"65536", b""] {
            let report = pair([port; 2], [b"0"; 2]);
            assert!(report.ports.is_empty(), "{port:?}");
            assert_eq!(report.connections, [connection(None, "0", 3)], "{port:?}");
        }
    }

    #[test]
    fn without_a_request_id_streams_pair_as_the_kubelet_pairs_them() {
        // The error stream's id names the pair; its data stream is 2 further on.
        let report = pair([b"80"; 2], [b"", b"\0ignored"]);
        assert_eq!(report.connections, [connection(Some(80), "1", 3)]);
    }
}
