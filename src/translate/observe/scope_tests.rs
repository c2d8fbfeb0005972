//! [`Scope::ErrorStream`]: the same error stream as [`Scope::Everything`] finds, whatever the
//! session and however its bytes are cut, with every other stream's payload passed over.

use base64::Engine;
use bytes::Bytes;
use proptest::prelude::*;

use super::tests::{
    binary_session, data, encode, feed_chunked, merge, reply, spdy_session, syn, want_binary,
    want_spdy, ws_frame, KEY,
};
use super::*;
use crate::spdy::codec::FrameEncoder;
use crate::spdy::frame::{Frame, Ping, PingId};

const UP: Direction = Direction::ClientToUpstream;
const DOWN: Direction = Direction::UpstreamToClient;

fn error_only(upgrade: &str, protocol: &str) -> Observer {
    Observer::with_scope(Some(upgrade), Some(protocol), Scope::ErrorStream).unwrap()
}

/// What a full observer's events leave for an error-stream one: the error stream's.
fn errors_of(events: Vec<Observed>) -> Vec<Observed> {
    events
        .into_iter()
        .filter(|e| matches!(e, Observed::Error(_)))
        .collect()
}

#[test]
fn spdy_error_stream_only_in_every_chunk_size() {
    let (up, down) = spdy_session();
    let (_, want_down) = want_spdy();
    for chunk in (1..40).chain([usize::MAX]) {
        let mut o = error_only("SPDY/3.1", "v4.channel.k8s.io");
        let got = feed_chunked(&mut o, &up, &down, chunk);
        assert_eq!(got, (vec![], errors_of(want_down.clone())), "chunk {chunk}");
    }
}

#[test]
fn websocket_error_stream_only_in_every_chunk_size() {
    let (up, down) = binary_session();
    let (_, want_down) = want_binary();
    for chunk in (1..40).chain([usize::MAX]) {
        let mut o = error_only("websocket", "v4.channel.k8s.io");
        let got = feed_chunked(&mut o, &up, &down, chunk);
        assert_eq!(got, (vec![], errors_of(want_down.clone())), "chunk {chunk}");
    }
}

/// Output larger than an observer buffers goes by unread: the full observer gives up on it,
/// the error-stream one does not look at it and still finds the exit code after it.
#[test]
fn output_larger_than_the_frame_buffer_passes_by() {
    let status = br#"{"metadata":{},"status":"Failure","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"7"}]}}"#;
    let big = vec![b'o'; 2 * MAX_FRAME];

    let mut client = FrameEncoder::new();
    let mut server = FrameEncoder::new();
    let up = encode(&mut client, &[syn(1, "error"), syn(5, "stdout")]);
    let down = encode(
        &mut server,
        &[data(5, &big[..MAX_FRAME + 1]), data(1, status)],
    );
    let mut lean = error_only("SPDY/3.1", "v4.channel.k8s.io");
    let mut full = Observer::for_protocol(Some("SPDY/3.1"), Some("v4.channel.k8s.io")).unwrap();
    let mut got = Vec::new();
    lean.feed(UP, &up, &mut got).unwrap();
    full.feed(UP, &up, &mut got).unwrap();
    for piece in down.chunks(32 * 1024) {
        lean.feed(DOWN, piece, &mut got).unwrap();
    }
    assert!(matches!(
        full.feed(DOWN, &down, &mut Vec::new()),
        Err(ObserveError::TooLarge(_))
    ));
    assert_eq!(got, vec![Observed::Error(Bytes::from_static(status))]);

    let mut down = ws_frame(2, true, &[&[1u8][..], &big].concat(), None);
    down.extend(ws_frame(2, true, &[&[3u8][..], status].concat(), None));
    let up = ws_frame(2, true, &[&[0u8][..], &big].concat(), KEY);
    let mut lean = error_only("websocket", "v5.channel.k8s.io");
    let mut got = Vec::new();
    for (u, d) in up.chunks(32 * 1024).zip(down.chunks(32 * 1024)) {
        lean.feed(UP, u, &mut got).unwrap();
        lean.feed(DOWN, d, &mut got).unwrap();
    }
    assert_eq!(got, vec![Observed::Error(Bytes::from_static(status))]);
}

/// The error channel's message fragmented, its first fragment empty, a ping between, the
/// server masking its frames (no server does, but the observer unmasks whatever comes).
#[test]
fn a_fragmented_masked_error_message_is_found() {
    let mut down = Vec::new();
    down.extend(ws_frame(2, false, b"", Some([9, 8, 7, 6])));
    down.extend(ws_frame(9, true, b"ping", None));
    down.extend(ws_frame(0, false, b"\x03{\"sta", Some([1, 2, 3, 4])));
    down.extend(ws_frame(0, true, b"tus\":\"Success\"}", Some([5, 6, 7, 8])));
    // Stdout, fragmented, its channel in the second fragment.
    down.extend(ws_frame(2, false, b"", None));
    down.extend(ws_frame(0, true, b"\x01out", Some([4, 4, 4, 4])));
    for chunk in (1..30).chain([usize::MAX]) {
        let mut o = error_only("websocket", "v4.channel.k8s.io");
        let (_, got) = feed_chunked(&mut o, &[], &down, chunk);
        assert_eq!(
            got,
            vec![Observed::Error(Bytes::from_static(
                br#"{"status":"Success"}"#
            ))],
            "chunk {chunk}"
        );
    }
}

#[test]
fn base64_error_stream_only() {
    let b64 = |c: u8, p: &[u8]| {
        let mut m = vec![b'0' + c];
        m.extend(base64::engine::general_purpose::STANDARD.encode(p).bytes());
        m
    };
    let mut down = ws_frame(1, true, &b64(1, b"out"), None);
    down.extend(ws_frame(1, true, &b64(3, b"boom"), None));
    // Not base64 on stdout: the full observer stops there; this one never reads it.
    down.extend(ws_frame(1, true, b"1!!!", None));
    let up = ws_frame(1, true, &b64(0, b"in"), KEY);
    let mut o = error_only("websocket", "base64.channel.k8s.io");
    let got = feed_chunked(&mut o, &up, &down, 3);
    assert_eq!(
        got,
        (vec![], vec![Observed::Error(Bytes::from_static(b"boom"))])
    );
    assert!(!o.stopped());
}

#[test]
fn framing_errors_still_stop_it() {
    for (frames, what) in [
        (
            ws_frame(0, true, b"\x01x", None),
            "a continuation outside a message",
        ),
        (
            [
                ws_frame(2, false, b"\x01x", None),
                ws_frame(2, true, b"\x01y", None),
            ]
            .concat(),
            "a new message inside one",
        ),
    ] {
        let mut o = error_only("websocket", "v4.channel.k8s.io");
        assert!(o.feed(DOWN, &frames, &mut Vec::new()).is_err(), "{what}");
        assert!(o.stopped());
    }
    // A SPDY header block out of its context is still a failure: control frames are followed.
    let mut server = FrameEncoder::new();
    let _ = encode(&mut server, &[reply(1)]);
    let second = encode(&mut server, &[reply(3)]);
    let mut o = error_only("SPDY/3.1", "v4.channel.k8s.io");
    assert!(o.feed(DOWN, &second, &mut Vec::new()).is_err());
}

/// A message of a session: its channel, payload length, fragments, a ping before the last
/// fragment, masked or not.
#[derive(Debug, Clone)]
struct Message {
    channel: u8,
    len: usize,
    fragments: usize,
    ping: bool,
    masked: bool,
}

fn message() -> impl Strategy<Value = Message> {
    (
        prop::sample::select(vec![0u8, 1, 2, 3, 3, 4, 255]),
        prop_oneof![0..20usize, 0..3000usize],
        1..4usize,
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(channel, len, fragments, ping, masked)| Message {
            channel,
            len,
            fragments,
            ping,
            masked,
        })
}

/// The frames of `m` as `framing` writes it; the client sends stdin, the close signal and
/// terminal sizes, the upstream the rest.
fn frames(m: &Message, framing: WebSocketFraming, up: bool, seed: usize) -> Vec<u8> {
    let payload: Vec<u8> = (0..m.len).map(|i| (i * 31 + seed) as u8).collect();
    let message = match (up, m.channel, framing) {
        (true, 4, _) => {
            let json = br#"{"Width":80,"Height":24}"#;
            match framing {
                WebSocketFraming::Binary => [&[4u8][..], json].concat(),
                WebSocketFraming::Base64 => {
                    let mut v = vec![b'4'];
                    v.extend(
                        base64::engine::general_purpose::STANDARD
                            .encode(json)
                            .bytes(),
                    );
                    v
                }
            }
        }
        (true, 255, WebSocketFraming::Binary) => vec![255, 0],
        (true, _, WebSocketFraming::Binary) => [&[0u8][..], &payload].concat(),
        (false, c, WebSocketFraming::Binary) => [&[c][..], &payload].concat(),
        (_, c, WebSocketFraming::Base64) => {
            let c = if up { 0 } else { c.min(9) };
            let mut v = vec![b'0' + c];
            v.extend(
                base64::engine::general_purpose::STANDARD
                    .encode(&payload)
                    .bytes(),
            );
            v
        }
    };
    let opcode = match framing {
        WebSocketFraming::Binary => 2,
        WebSocketFraming::Base64 => 1,
    };
    let mask = (up || m.masked).then_some([seed as u8, 0x5A, (seed >> 8) as u8, 0xC3]);
    let mut out = Vec::new();
    let n = message.len();
    for f in 0..m.fragments {
        let (a, b) = (n * f / m.fragments, n * (f + 1) / m.fragments);
        let last = f + 1 == m.fragments;
        if last && m.ping && f > 0 {
            out.extend(ws_frame(9, true, b"ping", mask));
        }
        out.extend(ws_frame(
            if f == 0 { opcode } else { 0 },
            last,
            &message[a..b],
            mask,
        ));
    }
    out
}

/// A SPDY remote-command session: the client opens the five streams, then DATA frames on
/// `down` streams (1 error, 5 stdout, 7 stderr, 11 unopened), stdin and sizes up.
fn spdy_frames(down: &[(u32, usize)], up: &[usize]) -> (Vec<u8>, Vec<u8>) {
    let mut client = FrameEncoder::new();
    let mut server = FrameEncoder::new();
    let mut c = vec![
        syn(1, "error"),
        syn(3, "stdin"),
        syn(5, "stdout"),
        syn(7, "stderr"),
        syn(9, "resize"),
    ];
    for (i, len) in up.iter().enumerate() {
        c.push(data(3, &vec![i as u8; *len]));
        c.push(data(9, b"{\"Width\":80,\"Height\":24}\n"));
    }
    let mut s: Vec<Frame> = (1..=9).step_by(2).map(reply).collect();
    for (i, (stream, len)) in down.iter().enumerate() {
        let payload: Vec<u8> = (0..*len).map(|j| (i + j * 7) as u8).collect();
        s.push(data(*stream, &payload));
        if i % 3 == 0 {
            s.push(Frame::Ping(Ping {
                id: PingId(i as u32 * 2 + 1),
            }));
        }
    }
    (encode(&mut client, &c), encode(&mut server, &s))
}

/// Feeds `up` and `down` to `o` in the pieces `cuts` make, alternating; the events and
/// whether it stopped.
fn feed_cut(o: &mut Observer, up: &[u8], down: &[u8], cuts: &[usize]) -> (Vec<Observed>, bool) {
    let mut events = Vec::new();
    let mut failed = false;
    let (mut u, mut d) = (0, 0);
    let mut cut = cuts.iter().cycle();
    while u < up.len() || d < down.len() {
        let n = *cut.next().unwrap();
        let ue = (u + n).min(up.len());
        failed |= o.feed(UP, &up[u..ue], &mut events).is_err();
        u = ue;
        let de = (d + n).min(down.len());
        failed |= o.feed(DOWN, &down[d..de], &mut events).is_err();
        d = de;
    }
    (events, failed)
}

/// The error stream's bytes and the outcome they give.
fn error_bytes(events: &[Observed]) -> (Vec<u8>, (Option<i32>, Option<String>)) {
    let mut bytes = Vec::new();
    let mut stream = ErrorStream::default();
    for e in events {
        if let Observed::Error(b) = e {
            bytes.extend_from_slice(b);
            stream.push(b);
        }
    }
    (bytes, stream.outcome())
}

/// Both scopes on the same bytes cut the same way: the error-stream one yields nothing but
/// the error stream, exactly the full one's, and neither stops.
fn assert_same_error_stream(
    upgrade: &str,
    protocol: &str,
    up: &[u8],
    down: &[u8],
    cuts: &[usize],
) -> Result<(), TestCaseError> {
    let mut full = Observer::for_protocol(Some(upgrade), Some(protocol)).unwrap();
    let mut lean = error_only(upgrade, protocol);
    let (full_events, full_failed) = feed_cut(&mut full, up, down, cuts);
    let (lean_events, lean_failed) = feed_cut(&mut lean, up, down, cuts);
    prop_assert!(!full_failed && !lean_failed);
    prop_assert!(lean_events.iter().all(|e| matches!(e, Observed::Error(_))));
    prop_assert_eq!(
        merge(errors_of(full_events.clone())),
        merge(lean_events.clone())
    );
    prop_assert_eq!(error_bytes(&full_events), error_bytes(&lean_events));
    Ok(())
}

proptest! {
    #[test]
    fn websocket_scopes_agree_on_the_error_stream(
        down in prop::collection::vec(message(), 0..12),
        up in prop::collection::vec(message(), 0..6),
        base64 in any::<bool>(),
        cuts in prop::collection::vec(1..5000usize, 1..20),
    ) {
        let (framing, protocol) = if base64 {
            (WebSocketFraming::Base64, "v4.base64.channel.k8s.io")
        } else {
            (WebSocketFraming::Binary, "v5.channel.k8s.io")
        };
        let down: Vec<u8> = down.iter().enumerate().flat_map(|(i, m)| frames(m, framing, false, i)).collect();
        let up: Vec<u8> = up.iter().enumerate().flat_map(|(i, m)| frames(m, framing, true, i)).collect();
        assert_same_error_stream("websocket", protocol, &up, &down, &cuts)?;
    }

    #[test]
    fn spdy_scopes_agree_on_the_error_stream(
        down in prop::collection::vec((prop::sample::select(vec![1u32, 1, 5, 7, 11]), 0..4000usize), 0..12),
        up in prop::collection::vec(0..3000usize, 0..5),
        cuts in prop::collection::vec(1..5000usize, 1..20),
    ) {
        let (up, down) = spdy_frames(&down, &up);
        assert_same_error_stream("SPDY/3.1", "v4.channel.k8s.io", &up, &down, &cuts)?;
    }

    /// On bytes that need not be a session: where the full observer follows to the end, so
    /// does the error-stream one, with the same error stream; where the full one stops, the
    /// error-stream one saw at least what it saw; it never stops where the full one did not.
    #[test]
    fn on_arbitrary_bytes_the_error_stream_one_sees_at_least_as_much(
        chunks in prop::collection::vec((any::<bool>(), prop::collection::vec(any::<u8>(), 0..300)), 0..20),
        which in 0..3usize,
    ) {
        let (upgrade, protocol) = match which {
            0 => ("SPDY/3.1", "v4.channel.k8s.io"),
            1 => ("websocket", "v4.channel.k8s.io"),
            _ => ("websocket", "base64.channel.k8s.io"),
        };
        let mut full = Observer::for_protocol(Some(upgrade), Some(protocol)).unwrap();
        let mut lean = error_only(upgrade, protocol);
        let (mut full_events, mut lean_events) = (Vec::new(), Vec::new());
        for (up, bytes) in &chunks {
            let direction = if *up { UP } else { DOWN };
            let _ = full.feed(direction, bytes, &mut full_events);
            let _ = lean.feed(direction, bytes, &mut lean_events);
        }
        let (full_bytes, _) = error_bytes(&full_events);
        let (lean_bytes, _) = error_bytes(&lean_events);
        if full.stopped() {
            prop_assert!(lean_bytes.starts_with(&full_bytes));
        } else {
            prop_assert!(!lean.stopped());
            prop_assert_eq!(full_bytes, lean_bytes);
        }
    }
}
