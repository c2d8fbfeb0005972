use bytes::{Bytes, BytesMut};
use proptest::prelude::*;

use super::*;
use crate::audit::port_forward::ForwardedConnection;
use crate::spdy::codec::FrameEncoder;
use crate::spdy::frame::{Data, Frame, HeaderBlock, Ping, PingId, StreamId, SynReply, SynStream};
use crate::translate::ws::mask::apply_mask;

const UP: Direction = Direction::ClientToUpstream;
const DOWN: Direction = Direction::UpstreamToClient;

pub(super) fn syn(id: u32, streamtype: &str) -> Frame {
    let mut headers = HeaderBlock::new();
    headers.push("streamtype", streamtype);
    headers.push("port", "0");
    Frame::SynStream(SynStream::new(StreamId::new(id), headers))
}

pub(super) fn reply(id: u32) -> Frame {
    Frame::SynReply(SynReply {
        stream_id: StreamId::new(id),
        fin: false,
        headers: HeaderBlock::new(),
    })
}

pub(super) fn data(id: u32, payload: &[u8]) -> Frame {
    Frame::Data(Data {
        stream_id: StreamId::new(id),
        fin: false,
        payload: Bytes::copy_from_slice(payload),
    })
}

pub(super) fn encode(enc: &mut FrameEncoder, frames: &[Frame]) -> Vec<u8> {
    let mut out = BytesMut::new();
    for f in frames {
        enc.encode(f, &mut out).unwrap();
    }
    out.to_vec()
}

/// A kubectl-like session: the client's stream openings, the rest of its bytes and the
/// kubelet's, each side from its own encoder (its own zlib context), the way they cross a
/// relay. The kubelet answers streams it has been sent, so the openings come first.
pub(super) fn spdy_session_parts() -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let mut client = FrameEncoder::new();
    let mut server = FrameEncoder::new();
    let syns = encode(
        &mut client,
        &[
            syn(1, "error"),
            syn(3, "stdin"),
            syn(5, "stdout"),
            syn(7, "stderr"),
            syn(9, "resize"),
        ],
    );
    let up = encode(
        &mut client,
        &[
            data(9, b"{\"Width\":80,\"Height\":24}\n"),
            data(3, b"ls\n"),
            Frame::Ping(Ping { id: PingId(1) }),
            data(9, b"{\"Width\":100,"),
            data(9, b"\"Height\":30}\n"),
        ],
    );
    let down = encode(
        &mut server,
        &[
            reply(1),
            reply(3),
            reply(5),
            reply(7),
            reply(9),
            data(5, b"hello\n"),
            data(7, b"oops\n"),
            Frame::Ping(Ping { id: PingId(1) }),
            data(5, b"bye\n"),
            data(1, br#"{"metadata":{},"status":"Failure","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"3"}]}}"#),
        ],
    );
    (syns, up, down)
}

/// The whole session: the client's bytes and the kubelet's.
pub(super) fn spdy_session() -> (Vec<u8>, Vec<u8>) {
    let (syns, up, down) = spdy_session_parts();
    ([syns, up].concat(), down)
}

/// An observer that has seen the client open its streams.
fn spdy_observer_after_syns() -> (Observer, Vec<u8>, Vec<u8>) {
    let (syns, up, down) = spdy_session_parts();
    let mut o = spdy_observer();
    let mut got = Vec::new();
    o.feed(UP, &syns, &mut got).unwrap();
    assert!(got.is_empty());
    (o, up, down)
}

fn size(width: u16, height: u16) -> Observed {
    Observed::Resize(crate::translate::resize::TerminalSize { width, height })
}

fn spdy_observer() -> Observer {
    Observer::for_protocol(Some("SPDY/3.1"), Some("v4.channel.k8s.io")).unwrap()
}

pub(super) fn want_spdy() -> (Vec<Observed>, Vec<Observed>) {
    (
        vec![
            size(80, 24),
            Observed::Stdin(Bytes::from_static(b"ls\n")),
            size(100, 30),
        ],
        vec![
            Observed::Stdout(Bytes::from_static(b"hello\n")),
            Observed::Stderr(Bytes::from_static(b"oops\n")),
            Observed::Stdout(Bytes::from_static(b"bye\n")),
            Observed::Error(Bytes::from_static(br#"{"metadata":{},"status":"Failure","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"3"}]}}"#)),
        ],
    )
}

/// Feeds each direction in pieces of `chunk` bytes, alternating directions; returns what
/// each direction yielded.
pub(super) fn feed_chunked(
    o: &mut Observer,
    up: &[u8],
    down: &[u8],
    chunk: usize,
) -> (Vec<Observed>, Vec<Observed>) {
    let (mut got_up, mut got_down) = (Vec::new(), Vec::new());
    let mut ups = up.chunks(chunk);
    let mut downs = down.chunks(chunk);
    loop {
        let (u, d) = (ups.next(), downs.next());
        if u.is_none() && d.is_none() {
            break;
        }
        if let Some(u) = u {
            o.feed(UP, u, &mut got_up).unwrap();
        }
        if let Some(d) = d {
            o.feed(DOWN, d, &mut got_down).unwrap();
        }
    }
    (merge(got_up), merge(got_down))
}

/// Adjacent data events of one kind joined: how bytes are split into events is not the point.
pub(super) fn merge(events: Vec<Observed>) -> Vec<Observed> {
    let mut out: Vec<Observed> = Vec::new();
    for e in events {
        let joined = match (out.last_mut(), &e) {
            (Some(Observed::Stdin(a)), Observed::Stdin(b))
            | (Some(Observed::Stdout(a)), Observed::Stdout(b))
            | (Some(Observed::Stderr(a)), Observed::Stderr(b))
            | (Some(Observed::Error(a)), Observed::Error(b)) => {
                *a = [a.as_ref(), b.as_ref()].concat().into();
                true
            }
            _ => false,
        };
        if !joined {
            out.push(e);
        }
    }
    out
}

#[test]
fn spdy_both_directions_in_one_piece() {
    let (up, down) = spdy_session();
    let mut o = spdy_observer();
    assert_eq!(feed_chunked(&mut o, &up, &down, usize::MAX), want_spdy());
}

#[test]
fn spdy_in_every_chunk_size_interleaved() {
    for chunk in 1..40 {
        let (mut o, up, down) = spdy_observer_after_syns();
        assert_eq!(
            feed_chunked(&mut o, &up, &down, chunk),
            want_spdy(),
            "chunk {chunk}"
        );
    }
}

#[test]
fn spdy_split_at_every_byte_boundary() {
    let (up, _) = spdy_session();
    for at in 0..=up.len() {
        let mut o = spdy_observer();
        let mut got = Vec::new();
        o.feed(UP, &up[..at], &mut got).unwrap();
        o.feed(UP, &up[at..], &mut got).unwrap();
        assert_eq!(merge(got), want_spdy().0, "split at {at}");
    }
    let (_, _, down) = spdy_session_parts();
    for at in 0..=down.len() {
        let (mut o, _, _) = spdy_observer_after_syns();
        let mut got = Vec::new();
        o.feed(DOWN, &down[..at], &mut got).unwrap();
        o.feed(DOWN, &down[at..], &mut got).unwrap();
        assert_eq!(merge(got), want_spdy().1, "split at {at}");
    }
}

#[test]
fn spdy_error_stream_gives_the_exit_code() {
    let (mut o, up, down) = spdy_observer_after_syns();
    let (_, got) = feed_chunked(&mut o, &up, &down, 7);
    let mut errors = ErrorStream::default();
    for e in got {
        if let Observed::Error(b) = e {
            errors.push(&b);
        }
    }
    assert_eq!(errors.outcome(), (Some(3), Some("exit 3".to_owned())));
}

#[test]
fn spdy_data_on_unknown_streams_and_other_directions_is_not_observed() {
    let mut client = FrameEncoder::new();
    let up = encode(
        &mut client,
        &[
            syn(1, "stdout"),
            syn(3, "data"),
            data(1, b"x"),
            data(3, b"y"),
            data(5, b"z"),
        ],
    );
    let mut o = spdy_observer();
    let mut got = Vec::new();
    o.feed(UP, &up, &mut got).unwrap();
    // Only that a stream of an unknown type was opened.
    assert_eq!(
        got,
        vec![Observed::UnknownStream(
            "stream 3 has a type the proxy does not know (streamtype \"data\")".into()
        )]
    );
}

#[test]
fn spdy_garbage_stops_the_observer_once() {
    let mut o = spdy_observer();
    let mut got = Vec::new();
    // A control frame of an unknown version.
    assert!(o
        .feed(UP, &[0x80, 0x02, 0x00, 0x01, 0, 0, 0, 0], &mut got)
        .is_err());
    assert!(o.stopped());
    assert!(o.feed(UP, b"anything", &mut got).is_ok());
    assert!(got.is_empty());
}

#[test]
fn spdy_a_frame_over_the_cap_is_refused_before_it_is_buffered() {
    let mut o = spdy_observer();
    let mut got = Vec::new();
    // DATA on stream 1, 16 MiB - 1 announced.
    let err = o
        .feed(DOWN, &[0, 0, 0, 1, 0, 0xFF, 0xFF, 0xFF], &mut got)
        .unwrap_err();
    assert!(matches!(err, ObserveError::TooLarge(_)), "{err}");
}

#[test]
fn spdy_headers_out_of_order_on_one_context_fail() {
    // The kubelet's bytes decoded with a fresh context from the middle cannot be followed:
    // the observer must see every frame from the start.
    let mut server = FrameEncoder::new();
    let first = encode(&mut server, &[reply(1)]);
    let second = encode(&mut server, &[reply(3)]);
    let mut o = spdy_observer();
    let mut got = Vec::new();
    assert!(o.feed(DOWN, &second, &mut got).is_err());
    let mut o = spdy_observer();
    o.feed(DOWN, &first, &mut got).unwrap();
    o.feed(DOWN, &second, &mut got).unwrap();
}

// --- WebSocket ---

/// A frame as a client sends it (masked) or a server does (unmasked).
pub(super) fn ws_frame(opcode: u8, fin: bool, payload: &[u8], mask: Option<[u8; 4]>) -> Vec<u8> {
    let mut out = vec![if fin { 0x80 } else { 0 } | opcode];
    let m = if mask.is_some() { 0x80 } else { 0 };
    match payload.len() {
        n if n < 126 => out.push(m | n as u8),
        n if n < 65536 => {
            out.push(m | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(m | 127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    let mut body = payload.to_vec();
    if let Some(key) = mask {
        out.extend_from_slice(&key);
        apply_mask(&mut body, key);
    }
    out.extend_from_slice(&body);
    out
}

pub(super) const KEY: Option<[u8; 4]> = Some([0x12, 0x34, 0x56, 0x78]);

pub(super) fn binary_session() -> (Vec<u8>, Vec<u8>) {
    let mut up = Vec::new();
    up.extend(ws_frame(2, true, b"\x04{\"Width\":80,\"Height\":24}", KEY));
    // stdin fragmented, with a ping between the fragments.
    up.extend(ws_frame(2, false, b"\x00l", KEY));
    up.extend(ws_frame(9, true, b"are you there", KEY));
    up.extend(ws_frame(0, true, b"s\n", KEY));
    up.extend(ws_frame(
        2,
        true,
        &[&b"\x00"[..], &[b'x'; 300]].concat(),
        KEY,
    ));
    let mut down = Vec::new();
    // The channels' opening messages: their numbers alone.
    for c in 0..5u8 {
        down.extend(ws_frame(2, true, &[c], None));
    }
    down.extend(ws_frame(2, true, b"\x01hello\n", None));
    down.extend(ws_frame(2, true, b"\x02oops\n", None));
    down.extend(ws_frame(
        2,
        true,
        br#"{"metadata":{},"status":"Success"}"#
            .iter()
            .fold(vec![3u8], |mut v, b| {
                v.push(*b);
                v
            })
            .as_slice(),
        None,
    ));
    down.extend(ws_frame(8, true, &[0x03, 0xE8], None));
    (up, down)
}

pub(super) fn want_binary() -> (Vec<Observed>, Vec<Observed>) {
    (
        vec![
            size(80, 24),
            Observed::Stdin(Bytes::from([&b"ls\n"[..], &[b'x'; 300]].concat())),
        ],
        vec![
            Observed::Stdout(Bytes::from_static(b"hello\n")),
            Observed::Stderr(Bytes::from_static(b"oops\n")),
            Observed::Error(Bytes::from_static(br#"{"metadata":{},"status":"Success"}"#)),
        ],
    )
}

fn ws_observer(protocol: &str) -> Observer {
    Observer::for_protocol(Some("websocket"), Some(protocol)).unwrap()
}

#[test]
fn websocket_binary_in_every_chunk_size_interleaved() {
    let (up, down) = binary_session();
    for chunk in (1..40).chain([usize::MAX]) {
        let mut o = ws_observer("v4.channel.k8s.io");
        assert_eq!(
            feed_chunked(&mut o, &up, &down, chunk),
            want_binary(),
            "chunk {chunk}"
        );
    }
}

/// A passed-through v5 session is v4 plus the CLOSE signal (`FF 00` after stdin ends): the
/// signal carries nothing to record and is no error.
#[test]
fn websocket_v5_close_signal_is_not_observed() {
    let (mut up, down) = binary_session();
    up.extend(ws_frame(2, true, &[0xFF, 0x00], KEY));
    let mut o = ws_observer("v5.channel.k8s.io");
    assert_eq!(feed_chunked(&mut o, &up, &down, usize::MAX), want_binary());
    assert!(!o.stopped());
}

#[test]
fn websocket_split_at_every_byte_boundary() {
    let (up, down) = binary_session();
    for at in 0..=up.len() {
        let mut o = ws_observer("channel.k8s.io");
        let mut got = Vec::new();
        o.feed(UP, &up[..at], &mut got).unwrap();
        o.feed(UP, &up[at..], &mut got).unwrap();
        assert_eq!(merge(got), want_binary().0, "split at {at}");
    }
    for at in 0..=down.len() {
        let mut o = ws_observer("channel.k8s.io");
        let mut got = Vec::new();
        o.feed(DOWN, &down[..at], &mut got).unwrap();
        o.feed(DOWN, &down[at..], &mut got).unwrap();
        assert_eq!(merge(got), want_binary().1, "split at {at}");
    }
}

#[test]
fn websocket_base64_channels() {
    let mut up = Vec::new();
    up.extend(ws_frame(1, true, b"0aGk=", KEY));
    up.extend(ws_frame(1, true, b"4eyJXaWR0aCI6MTAsIkhlaWdodCI6NX0=", KEY));
    let mut down = Vec::new();
    down.extend(ws_frame(1, true, b"1", None));
    down.extend(ws_frame(1, true, b"1b3V0", None));
    down.extend(ws_frame(1, false, b"2ZX", None));
    down.extend(ws_frame(1 - 1, true, b"Jy", None));
    down.extend(ws_frame(1, true, b"3Ym9vbQ==", None));
    for chunk in (1..12).chain([usize::MAX]) {
        let mut o = ws_observer("base64.channel.k8s.io");
        let got = feed_chunked(&mut o, &up, &down, chunk);
        assert_eq!(
            got,
            (
                vec![Observed::Stdin(Bytes::from_static(b"hi")), size(10, 5)],
                vec![
                    Observed::Stdout(Bytes::from_static(b"out")),
                    Observed::Stderr(Bytes::from_static(b"err")),
                    Observed::Error(Bytes::from_static(b"boom")),
                ]
            ),
            "chunk {chunk}"
        );
    }
    let mut errors = ErrorStream::default();
    errors.push(b"boom");
    assert_eq!(errors.outcome(), (None, Some("boom".to_owned())));
}

#[test]
fn websocket_bad_base64_and_oversized_frames_stop_the_observer() {
    let mut o = ws_observer("v4.base64.channel.k8s.io");
    let mut got = Vec::new();
    assert!(o
        .feed(DOWN, &ws_frame(1, true, b"1!!!", None), &mut got)
        .is_err());
    assert!(o
        .feed(DOWN, &ws_frame(1, true, b"1b3V0", None), &mut got)
        .is_ok());
    assert!(got.is_empty());
    let mut o = ws_observer("v4.channel.k8s.io");
    let head = [0x82, 127, 0, 0, 0, 1, 0, 0, 0, 0];
    assert!(matches!(
        o.feed(DOWN, &head, &mut got),
        Err(ObserveError::TooLarge(_))
    ));
}

#[test]
fn only_channel_protocols_are_observed() {
    assert!(Observer::for_protocol(Some("websocket"), Some("portforward.k8s.io")).is_none());
    assert!(Observer::for_protocol(Some("websocket"), Some("v9.channel.k8s.io")).is_none());
    // No subprotocol, or an empty one, is `channel.k8s.io`.
    assert!(Observer::for_protocol(Some("websocket"), None).is_some());
    assert!(Observer::for_protocol(Some("websocket"), Some("")).is_some());
    assert!(Observer::for_protocol(Some("h2c"), None).is_none());
    assert!(Observer::for_protocol(None, None).is_none());
    for p in [
        "channel.k8s.io",
        "v2.channel.k8s.io",
        "v3.channel.k8s.io",
        "v4.channel.k8s.io",
        "base64.channel.k8s.io",
        "v4.base64.channel.k8s.io",
    ] {
        assert!(
            Observer::for_protocol(Some("websocket"), Some(p)).is_some(),
            "{p}"
        );
    }
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(
        chunks in proptest::collection::vec((any::<bool>(), proptest::collection::vec(any::<u8>(), 0..300)), 0..20),
        which in 0..3usize,
    ) {
        let mut o = match which {
            0 => spdy_observer(),
            1 => ws_observer("v4.channel.k8s.io"),
            _ => ws_observer("base64.channel.k8s.io"),
        };
        let mut got = Vec::new();
        let mut errors = 0;
        for (up, bytes) in chunks {
            if o.feed(if up { UP } else { DOWN }, &bytes, &mut got).is_err() {
                errors += 1;
            }
        }
        prop_assert!(errors <= 1);
    }

    #[test]
    fn valid_spdy_in_arbitrary_pieces_is_followed(cuts in proptest::collection::vec(0..2000usize, 0..10)) {
        let (mut o, up, down) = spdy_observer_after_syns();
        let mut got_up = Vec::new();
        let mut got_down = Vec::new();
        let mut cuts = cuts;
        cuts.sort_unstable();
        let mut last = 0;
        for c in cuts.iter().chain([&usize::MAX]) {
            let u = (*c).min(up.len());
            let d = (*c).min(down.len());
            if u >= last { o.feed(UP, &up[last.min(up.len())..u], &mut got_up).unwrap(); }
            if d >= last { o.feed(DOWN, &down[last.min(down.len())..d], &mut got_down).unwrap(); }
            last = *c;
        }
        prop_assert_eq!((merge(got_up), merge(got_down)), want_spdy());
    }
}

// --- Legacy WebSocket port-forward ---

/// Ports 8080 (channels 0, 1) and 9090 (channels 2, 3): the kubelet's port prefixes, then
/// 8080 carries 1000 bytes in (fragmented, a ping between) and 3 out, 9090 is refused.
fn ws_port_forward_session() -> (Vec<u8>, Vec<u8>) {
    let mut down = Vec::new();
    for (channel, port) in [(0u8, 8080u16), (1, 8080), (2, 9090), (3, 9090)] {
        let [lo, hi] = port.to_le_bytes();
        down.extend(ws_frame(2, true, &[channel, lo, hi], None));
    }
    let mut up = Vec::new();
    up.extend(ws_frame(
        2,
        false,
        &[&[0u8][..], &[b'a'; 600]].concat(),
        KEY,
    ));
    up.extend(ws_frame(9, true, b"still there?", KEY));
    up.extend(ws_frame(0, true, &[b'b'; 400], KEY));
    up.extend(ws_frame(2, true, b"\x02", KEY));
    down.extend(ws_frame(2, true, b"\x00abc", None));
    down.extend(ws_frame(
        2,
        true,
        b"\x03error forwarding port 9090 to pod 4f1c: connection refused",
        None,
    ));
    down.extend(ws_frame(8, true, &[0x03, 0xE8], None));
    (up, down)
}

fn want_ws_port_forward() -> PortForwardReport {
    PortForwardReport {
        ports: vec![8080, 9090],
        connections: vec![
            ForwardedConnection {
                port: Some(8080),
                request_id: "0".into(),
                bytes_in: 1000,
                bytes_out: 3,
                error: None,
            },
            ForwardedConnection {
                port: Some(9090),
                request_id: "1".into(),
                bytes_in: 0,
                bytes_out: 0,
                error: Some("error forwarding port 9090 to pod 4f1c: connection refused".into()),
            },
        ],
        omitted: 0,
        failure: None,
    }
}

#[test]
fn websocket_port_forward_split_at_every_byte_boundary() {
    let (up, down) = ws_port_forward_session();
    for at in 0..=up.len() {
        for down_at in [0, at.min(down.len()), down.len()] {
            let watch = PortForwardWatch::websocket(WebSocketFraming::Binary);
            watch.relayed(DOWN, &down[..down_at]);
            watch.relayed(UP, &up[..at]);
            watch.relayed(UP, &up[at..]);
            watch.relayed(DOWN, &down[down_at..]);
            assert_eq!(
                watch.finish(),
                want_ws_port_forward(),
                "split at {at}/{down_at}"
            );
        }
    }
}

#[test]
fn websocket_port_forward_in_base64() {
    use base64::Engine;
    let b64 = |channel: u8, payload: &[u8]| {
        let mut m = vec![b'0' + channel];
        m.extend(
            base64::engine::general_purpose::STANDARD
                .encode(payload)
                .bytes(),
        );
        m
    };
    let mut down = Vec::new();
    // Channel 10 (':'), the sixth port's data channel.
    for (channel, port) in [(0u8, 8080u16), (1, 8080), (10, 7000), (11, 7000)] {
        down.extend(ws_frame(1, true, &b64(channel, &port.to_le_bytes()), None));
    }
    down.extend(ws_frame(1, true, &b64(10, &[7; 70]), None));
    let mut up = Vec::new();
    up.extend(ws_frame(1, true, &b64(0, &[1; 33]), KEY));
    let watch = PortForwardWatch::websocket(WebSocketFraming::Base64);
    watch.relayed(DOWN, &down);
    watch.relayed(UP, &up);
    let report = watch.finish();
    assert_eq!(report.ports, [7000, 8080]);
    assert_eq!(report.connections.len(), 6);
    let c0 = &report.connections[0];
    assert_eq!((c0.port, c0.bytes_in, c0.bytes_out), (Some(8080), 33, 0));
    let c5 = &report.connections[5];
    assert_eq!((c5.port, c5.bytes_in, c5.bytes_out), (Some(7000), 0, 70));
    assert_eq!(report.connections[2].port, None);
}
