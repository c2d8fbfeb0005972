//! The port-forward tunnel passed through: its WebSocket frames taken off, its SPDY followed.

use proptest::prelude::*;

use super::port_forward_tests::{session, want};
use super::tests::{ws_frame, KEY};
use super::*;

const UP: Direction = Direction::ClientToUpstream;
const DOWN: Direction = Direction::UpstreamToClient;

/// The client's bytes as kubectl's tunnel writes them: every write of its SPDY framer one
/// masked binary message, so a frame is several tiny messages (2, 2, 4, 4, 4, 1, 1, n bytes
/// for a SYN_STREAM); here in pieces of those sizes, with a fragmented message and a ping
/// between its fragments now and then.
fn client_messages(spdy: &[u8]) -> Vec<u8> {
    let sizes = [2, 2, 4, 4, 4, 1, 1, 700];
    let mut out = Vec::new();
    let mut at = 0;
    for (i, size) in sizes.iter().cycle().enumerate() {
        if at >= spdy.len() {
            break;
        }
        let piece = &spdy[at..(at + size).min(spdy.len())];
        at += piece.len();
        let key = Some([i as u8, 0x33, 0x7E, (i * 3) as u8]);
        if i % 5 == 4 && piece.len() > 1 {
            let half = piece.len() / 2;
            out.extend(ws_frame(2, false, &piece[..half], key));
            out.extend(ws_frame(9, true, b"ping", key));
            out.extend(ws_frame(0, true, &piece[half..], KEY));
        } else {
            out.extend(ws_frame(2, true, piece, key));
        }
    }
    out
}

/// The upstream's bytes as kube-apiserver's tunnel writes them: every read (up to 32 KiB) of
/// the kubelet's SPDY one unmasked binary message.
fn upstream_messages(spdy: &[u8], read: usize) -> Vec<u8> {
    spdy.chunks(read)
        .flat_map(|c| ws_frame(2, true, c, None))
        .collect()
}

/// The tunnel of `session(big)`: the client's bytes and the upstream's.
fn tunnel(big: usize, read: usize) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let (syns, up, down) = session(big);
    let mut down = upstream_messages(&down, read);
    // Close 1000 at the end.
    down.extend(ws_frame(8, true, &[0x03, 0xE8], None));
    (client_messages(&syns), client_messages(&up), down)
}

#[test]
fn tunnel_connections_in_one_piece() {
    let (syns, up, down) = tunnel(70_000, 32 * 1024);
    let watch = PortForwardWatch::tunnel();
    watch.relayed(UP, &syns);
    watch.relayed(UP, &up);
    watch.relayed(DOWN, &down);
    assert_eq!(watch.finish(), want(70_000));
}

#[test]
fn tunnel_split_at_every_byte_boundary() {
    let (syns, up, down) = tunnel(100, 37);
    let up = [syns, up].concat();
    for at in 0..=up.len() {
        for down_at in [0, at.min(down.len()), down.len()] {
            let watch = PortForwardWatch::tunnel();
            watch.relayed(UP, &up[..at]);
            watch.relayed(UP, &up[at..]);
            watch.relayed(DOWN, &down[..down_at]);
            watch.relayed(DOWN, &down[down_at..]);
            assert_eq!(watch.finish(), want(100), "split at {at}/{down_at}");
        }
    }
}

#[test]
fn tunnel_in_every_chunk_size_interleaved() {
    let (syns, up, down) = tunnel(5_000, 1_000);
    for chunk in 1..40 {
        let watch = PortForwardWatch::tunnel();
        watch.relayed(UP, &syns);
        let mut ups = up.chunks(chunk);
        let mut downs = down.chunks(chunk);
        loop {
            let (u, d) = (ups.next(), downs.next());
            if u.is_none() && d.is_none() {
                break;
            }
            if let Some(u) = u {
                watch.relayed(UP, u);
            }
            if let Some(d) = d {
                watch.relayed(DOWN, d);
            }
        }
        assert_eq!(watch.finish(), want(5_000), "chunk {chunk}");
    }
}

/// A masked payload far larger than the piece unmasked at a time, cut at odd places: the key
/// stays in step.
#[test]
fn tunnel_large_masked_messages_in_odd_pieces() {
    let (syns, up, down) = session(10);
    let client: Vec<u8> = [syns, up].concat();
    let bytes = ws_frame(2, true, &client, Some([0xA1, 0xB2, 0xC3, 0xD4]));
    for cut in [1, 3, 4097, 5001, bytes.len()] {
        let watch = PortForwardWatch::tunnel();
        for piece in bytes.chunks(cut) {
            watch.relayed(UP, piece);
        }
        watch.relayed(DOWN, &upstream_messages(&down, 32 * 1024));
        assert_eq!(watch.finish(), want(10), "cut {cut}");
    }
}

#[test]
fn a_text_message_stops_the_watch_and_keeps_what_it_saw() {
    let (syns, _, _) = tunnel(10, 32 * 1024);
    let watch = PortForwardWatch::tunnel();
    watch.relayed(UP, &syns);
    watch.relayed(DOWN, &ws_frame(1, true, b"not spdy", None));
    // Nothing more is looked at.
    watch.relayed(UP, &ws_frame(2, true, b"\x80\x03\x00\x07garbage", KEY));
    let report = watch.finish();
    assert_eq!(report.ports, [8080, 9090]);
    assert_eq!(report.connections.len(), 2);
    assert!(
        report.failure.as_deref().unwrap().contains("text message"),
        "{report:?}"
    );
}

#[test]
fn out_of_order_frames_stop_the_watch() {
    for bytes in [
        ws_frame(0, true, b"x", None),
        [
            ws_frame(2, false, b"x", None),
            ws_frame(2, true, b"y", None),
        ]
        .concat(),
        // A reserved bit: an extension no tunnel negotiates.
        vec![0xC2, 0x00],
    ] {
        let watch = PortForwardWatch::tunnel();
        watch.relayed(DOWN, &bytes);
        assert!(watch.finish().failure.is_some());
    }
}

proptest! {
    /// However the messages are sized and the reads are cut, the report is the SPDY
    /// session's.
    #[test]
    fn tunnel_in_arbitrary_messages_and_reads(
        read in 1..5000usize,
        cuts in prop::collection::vec(1..3000usize, 1..12),
    ) {
        let (syns, up, down) = tunnel(9_000, read);
        let watch = PortForwardWatch::tunnel();
        let mut cut = cuts.iter().cycle();
        // The kubelet answers streams it has been sent: the openings go first.
        let mut s = 0;
        while s < syns.len() {
            let e = (s + *cut.next().unwrap()).min(syns.len());
            watch.relayed(UP, &syns[s..e]);
            s = e;
        }
        let (mut u, mut d) = (0, 0);
        while u < up.len() || d < down.len() {
            let n = *cut.next().unwrap();
            let ue = (u + n).min(up.len());
            watch.relayed(UP, &up[u..ue]);
            u = ue;
            let de = (d + n).min(down.len());
            watch.relayed(DOWN, &down[d..de]);
            d = de;
        }
        prop_assert_eq!(watch.finish(), want(9_000));
    }
}
