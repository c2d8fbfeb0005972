//! Arbitrary bytes, both ways, into the passive observer of relayed sessions (SPDY/3.1, binary
//! and base64 WebSocket channel protocols).
//!
//! Checks, besides "never panics": at most one error, and nothing observed once stopped.

#![no_main]

use kube_ws_proxy::translate::observe::{Direction, Observer};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&select, mut data)) = data.split_first() else {
        return;
    };
    let (upgrade, protocol) = match select % 3 {
        0 => ("SPDY/3.1", "v4.channel.k8s.io"),
        1 => ("websocket", "v4.channel.k8s.io"),
        _ => ("websocket", "base64.channel.k8s.io"),
    };
    let mut observer = Observer::for_protocol(Some(upgrade), Some(protocol)).unwrap();
    let mut errors = 0;
    // Each piece: one byte (top bit: direction, low bits: length), then that many bytes.
    while let Some((&head, rest)) = data.split_first() {
        let len = usize::from(head & 0x7F).min(rest.len());
        let direction = if head & 0x80 == 0 {
            Direction::ClientToUpstream
        } else {
            Direction::UpstreamToClient
        };
        let mut events = Vec::new();
        let was_stopped = observer.stopped();
        let result = observer.feed(direction, &rest[..len], &mut events);
        if was_stopped {
            assert!(result.is_ok() && events.is_empty());
        }
        if result.is_err() {
            errors += 1;
            assert!(observer.stopped());
        }
        data = &rest[len..];
    }
    assert!(errors <= 1);
});
