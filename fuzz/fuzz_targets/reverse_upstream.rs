//! Arbitrary messages from a v5 "upstream" into the reverse translator's pure parts: each
//! message decoded, channel-3 payloads collected, the result turned into what every
//! remote-command version's client gets on its error stream.
//!
//! The input is cut into messages by length bytes: `len, message[len], len, message[len]…`.
//! Checks, besides "never panics": stdout and stderr carry exactly the payloads of channels 1
//! and 2; a v4 client always gets a status; a v1–v3 client gets nothing exactly when the
//! status is Success.

#![no_main]

use bytes::Bytes;
use kube_ws_proxy::translate::protocol::UpstreamVersion;
use kube_ws_proxy::translate::reverse::client_status::ClientStatus;
use kube_ws_proxy::translate::reverse::v5_message::{decode_server, ServerMessage, StatusBytes};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut rest = data;
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let (mut want_out, mut want_err) = (Vec::new(), Vec::new());
    let mut status = StatusBytes::default();
    while let Some((&len, tail)) = rest.split_first() {
        let len = usize::from(len).min(tail.len());
        let (msg, tail) = tail.split_at(len);
        rest = tail;
        match msg {
            [1, payload @ ..] => want_out.extend_from_slice(payload),
            [2, payload @ ..] => want_err.extend_from_slice(payload),
            _ => {}
        }
        match decode_server(Bytes::copy_from_slice(msg)) {
            ServerMessage::Stdout(b) => stdout.extend_from_slice(&b),
            ServerMessage::Stderr(b) => stderr.extend_from_slice(&b),
            ServerMessage::Status(b) => status.push(&b),
            ServerMessage::Ignored => {}
        }
    }
    assert_eq!(stdout, want_out);
    assert_eq!(stderr, want_err);
    let result = ClientStatus::from_upstream(status.as_slice());
    assert!(result.error_stream_payload(UpstreamVersion::V4).is_some());
    for v in [UpstreamVersion::V1, UpstreamVersion::V2, UpstreamVersion::V3] {
        assert_eq!(
            result.error_stream_payload(v).is_none(),
            result.status.status == "Success"
        );
    }
});
