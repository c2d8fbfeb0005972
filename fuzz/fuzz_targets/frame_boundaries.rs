//! Arbitrary bytes, cut into reads at arbitrary places, through the relay's frame-boundary
//! follower (where pings are slipped in).
//!
//! Checks, besides "never panics": a boundary is always within the read it was found in; the
//! boundaries found do not depend on how the stream was cut (the same stream in one read and in
//! many finds the same last boundary); and once the follower has stopped it stays stopped.

#![no_main]

use kube_ws_proxy::translate::ws::FrameBoundaries;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&cut, data)) = data.split_first() else {
        return;
    };
    let step = usize::from(cut).max(1);
    let mut whole = FrameBoundaries::new();
    let last_whole = whole.follow(data);
    let mut pieces = FrameBoundaries::new();
    let mut last_pieces = pieces.at_boundary().then_some(0);
    let mut stopped = false;
    for (i, chunk) in data.chunks(step).enumerate() {
        let found = pieces.follow(chunk);
        if let Some(p) = found {
            assert!(p <= chunk.len());
            last_pieces = Some(i * step + p);
        }
        if stopped {
            assert!(pieces.stopped());
            assert_eq!(found, None);
        }
        stopped = pieces.stopped();
    }
    assert_eq!(whole.stopped(), pieces.stopped());
    // Cut into pieces, a stream whose bytes the follower gave up on may still have offered
    // boundaries in the reads before the bad header; in one read it offers none.
    if !whole.stopped() {
        assert_eq!(last_whole, last_pieces);
    }
});
