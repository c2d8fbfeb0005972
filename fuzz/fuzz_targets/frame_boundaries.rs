//! Arbitrary bytes, cut into reads at arbitrary places, through the relay's one follower of
//! the upstream's frames ([`FrameCursor`]: where keepalive pings are slipped in and where a
//! session under `--record=required` is ended), for SPDY and WebSocket framing, passing every
//! byte on (pings alone) and holding heads back (`--record=required`).
//!
//! Checks, besides "never panics": what a read passes on and its boundary are within the
//! read; a cursor that holds heads back never lets a read end inside one, and one that passes
//! every byte does; the boundaries found do not depend on how the stream was cut (the same
//! stream in one read and in many finds the same last boundary, and the same frame owed);
//! and once the cursor has stopped it stays stopped, offering no boundary.

#![no_main]

use kube_ws_proxy::proxy::sessions::relay::frames::{FrameCursor, Framing};
use libfuzzer_sys::fuzz_target;

/// A cursor that passes every byte on, fed `data` whole and in reads of `step` bytes.
fn passing(framing: Framing, data: &[u8], step: usize) {
    let mut whole = FrameCursor::new(framing);
    let followed = whole.follow(data);
    assert_eq!(followed.pass, data.len());
    let last_whole = followed.boundary;
    let mut pieces = FrameCursor::new(framing);
    let mut last_pieces = pieces.at_boundary().then_some(0);
    let mut stopped = false;
    for (i, chunk) in data.chunks(step).enumerate() {
        let found = pieces.follow(chunk);
        assert_eq!(found.pass, chunk.len());
        if let Some(p) = found.boundary {
            assert!(p <= chunk.len());
            last_pieces = Some(i * step + p);
        }
        if stopped {
            assert!(pieces.stopped());
            assert_eq!(found.boundary, None);
        }
        stopped = pieces.stopped();
    }
    assert_eq!(whole.stopped(), pieces.stopped());
    // Cut into pieces, a stream whose bytes the follower gave up on may still have offered
    // boundaries in the reads before the bad header; in one read it offers none.
    if !whole.stopped() {
        assert_eq!(last_whole, last_pieces);
        assert_eq!(whole.owed(), pieces.owed());
    }
}

/// A cursor that holds heads back, fed `data` as the relay feeds it: reads of up to `step`
/// new bytes after what the last read kept back.
fn holding(framing: Framing, data: &[u8], step: usize) {
    let mut whole = FrameCursor::holding_heads(framing);
    let passed_whole = whole.follow(data).pass;
    let mut pieces = FrameCursor::holding_heads(framing);
    let (mut sent, mut read) = (0, 0);
    while read < data.len() {
        read = (read + step).min(data.len());
        let found = pieces.follow(&data[sent..read]);
        assert!(found.pass <= read - sent);
        if let Some(p) = found.boundary {
            assert!(p <= found.pass);
        }
        sent += found.pass;
    }
    // What a whole read passes on, reads passed on too: all but an unfinished last head.
    assert_eq!(sent, passed_whole);
    assert_eq!(whole.stopped(), pieces.stopped());
    if !whole.stopped() {
        assert_eq!(whole.owed(), pieces.owed());
        assert_eq!(whole.at_boundary(), pieces.at_boundary());
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&cut, data)) = data.split_first() else {
        return;
    };
    let step = usize::from(cut).max(1);
    for framing in [Framing::WebSocket, Framing::Spdy] {
        passing(framing, data, step);
        holding(framing, data, step);
    }
});
