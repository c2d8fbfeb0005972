//! Arbitrary bytes, both ways, into the passive observer of relayed sessions (SPDY/3.1, binary
//! and base64 WebSocket channel protocols), in both scopes: everything (recordings) and the
//! error stream alone (the exit code for the audit log).
//!
//! Checks, besides "never panics": at most one error, and nothing observed once stopped; the
//! error-stream observer yields only the error stream; where the full observer follows the
//! bytes to their end it does too, with the same error stream; where the full one stopped,
//! it saw at least what the full one saw.

#![no_main]

use kube_ws_proxy::translate::observe::{Direction, Observed, Observer, Scope};
use libfuzzer_sys::fuzz_target;

/// One observer and what it found.
struct Followed {
    observer: Observer,
    errors: usize,
    error_stream: Vec<u8>,
}

impl Followed {
    fn new(upgrade: &str, protocol: &str, scope: Scope) -> Followed {
        Followed {
            observer: Observer::with_scope(Some(upgrade), Some(protocol), scope).unwrap(),
            errors: 0,
            error_stream: Vec::new(),
        }
    }

    fn feed(&mut self, direction: Direction, bytes: &[u8], error_stream_only: bool) {
        let mut events = Vec::new();
        let was_stopped = self.observer.stopped();
        let result = self.observer.feed(direction, bytes, &mut events);
        if was_stopped {
            assert!(result.is_ok() && events.is_empty());
        }
        if result.is_err() {
            self.errors += 1;
            assert!(self.observer.stopped());
        }
        for event in events {
            match event {
                Observed::Error(b) => self.error_stream.extend_from_slice(&b),
                other => assert!(!error_stream_only, "{other:?} from an error-stream observer"),
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&select, mut data)) = data.split_first() else {
        return;
    };
    let (upgrade, protocol) = match select % 3 {
        0 => ("SPDY/3.1", "v4.channel.k8s.io"),
        1 => ("websocket", "v4.channel.k8s.io"),
        _ => ("websocket", "base64.channel.k8s.io"),
    };
    let mut full = Followed::new(upgrade, protocol, Scope::Everything);
    let mut lean = Followed::new(upgrade, protocol, Scope::ErrorStream);
    // Each piece: one byte (top bit: direction, low bits: length), then that many bytes.
    while let Some((&head, rest)) = data.split_first() {
        let len = usize::from(head & 0x7F).min(rest.len());
        let direction = if head & 0x80 == 0 {
            Direction::ClientToUpstream
        } else {
            Direction::UpstreamToClient
        };
        full.feed(direction, &rest[..len], false);
        lean.feed(direction, &rest[..len], true);
        data = &rest[len..];
    }
    assert!(full.errors <= 1 && lean.errors <= 1);
    if full.observer.stopped() {
        assert!(lean.error_stream.starts_with(&full.error_stream));
    } else {
        assert!(!lean.observer.stopped());
        assert_eq!(lean.error_stream, full.error_stream);
    }
});
