//! The v5 channel messages the reverse translator exchanges with a WebSocket upstream
//! (PROTOCOL.md §1.3, §1.4, §1.7), as pure functions: what a server message means, and the exact
//! bytes of what a client sends (stdin, the CLOSE signal, terminal sizes).

use bytes::{BufMut, Bytes, BytesMut};

use crate::translate::channel::Channel;
use crate::translate::close_signal::CloseSignal;
use crate::translate::resize::TerminalSize;

/// What one binary message from the upstream carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerMessage {
    /// Output for the client's stdout stream.
    Stdout(Bytes),
    /// Output for the client's stderr stream.
    Stderr(Bytes),
    /// (Part of) the Status on channel 3.
    Status(Bytes),
    /// Nothing to pass on: an empty message, the empty "ready" message, or a channel a server
    /// does not write (0, 4, 255, unknown), which client-go discards too.
    Ignored,
}

/// Reads one binary message from the upstream. The payload is not copied.
pub fn decode_server(mut msg: Bytes) -> ServerMessage {
    let Some(&first) = msg.first() else {
        return ServerMessage::Ignored;
    };
    let payload = msg.split_off(1);
    if payload.is_empty() {
        // The ready message (an empty payload on the lowest writable channel).
        return ServerMessage::Ignored;
    }
    match Channel::from_byte(first) {
        Some(Channel::Stdout) => ServerMessage::Stdout(payload),
        Some(Channel::Stderr) => ServerMessage::Stderr(payload),
        Some(Channel::Error) => ServerMessage::Status(payload),
        Some(Channel::Stdin | Channel::Resize) | None => ServerMessage::Ignored,
    }
}

/// Prefixes `payload` with `channel`: one allocation for the message, the payload copied once.
fn with_channel(channel: Channel, payload: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(1 + payload.len());
    out.put_u8(channel.as_byte());
    out.extend_from_slice(payload);
    out.freeze()
}

/// A stdin message: `00` + data.
pub fn stdin(data: &[u8]) -> Bytes {
    with_channel(Channel::Stdin, data)
}

/// The CLOSE signal for stdin, `FF 00`: stdin reached EOF.
pub fn close_stdin() -> Bytes {
    Bytes::copy_from_slice(&CloseSignal::new(Channel::Stdin).encode())
}

/// A terminal size on channel 4, as kubectl sends it: `04` + `{"Width":W,"Height":H}\n`.
pub fn resize(size: TerminalSize) -> Bytes {
    let mut json = Vec::with_capacity(40);
    json.push(Channel::Resize.as_byte());
    size.encode_json(&mut json);
    Bytes::from(json)
}

/// Collects the Status bytes of channel 3 (they may come in several messages), bounded.
#[derive(Debug, Default)]
pub struct StatusBytes {
    bytes: BytesMut,
}

/// More than any Status an API server writes; the rest is dropped.
pub const MAX_STATUS_BYTES: usize = 64 * 1024;

impl StatusBytes {
    /// Appends a channel-3 payload, up to [`MAX_STATUS_BYTES`] in all.
    pub fn push(&mut self, payload: &[u8]) {
        let room = MAX_STATUS_BYTES.saturating_sub(self.bytes.len());
        self.bytes
            .extend_from_slice(&payload[..payload.len().min(room)]);
    }

    /// Everything collected.
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn server_vectors() {
        // PROTOCOL.md §6.1: ready `01`, stdout `01 hello\n`, status `03 {...}`.
        assert_eq!(
            decode_server(Bytes::from_static(&[0x01])),
            ServerMessage::Ignored
        );
        assert_eq!(
            decode_server(Bytes::from_static(b"\x01hello\n")),
            ServerMessage::Stdout(Bytes::from_static(b"hello\n"))
        );
        assert_eq!(
            decode_server(Bytes::from_static(b"\x02oops")),
            ServerMessage::Stderr(Bytes::from_static(b"oops"))
        );
        let status = b"\x03{\"metadata\":{},\"status\":\"Success\"}";
        assert_eq!(
            decode_server(Bytes::from_static(status)),
            ServerMessage::Status(Bytes::from_static(&status[1..]))
        );
        for ignored in [
            &b""[..],
            b"\x00abc",
            b"\x04{}",
            b"\xff\x00",
            b"\x07x",
            b"\x03",
        ] {
            assert_eq!(
                decode_server(Bytes::copy_from_slice(ignored)),
                ServerMessage::Ignored,
                "{ignored:?}"
            );
        }
    }

    #[test]
    fn client_vectors() {
        // PROTOCOL.md §6.1, unmasked payloads.
        assert_eq!(&stdin(b"ls\n")[..], [0x00, 0x6C, 0x73, 0x0A]);
        assert_eq!(&close_stdin()[..], [0xFF, 0x00]);
        assert_eq!(
            &resize(TerminalSize {
                width: 80,
                height: 24
            })[..],
            b"\x04{\"Width\":80,\"Height\":24}\n"
        );
        assert_eq!(&stdin(b"")[..], [0x00]);
    }

    #[test]
    fn status_bytes_are_bounded() {
        let mut s = StatusBytes::default();
        s.push(b"{\"a\":");
        s.push(b"1}");
        assert_eq!(s.as_slice(), b"{\"a\":1}");
        s.push(&vec![b' '; MAX_STATUS_BYTES]);
        assert_eq!(s.as_slice().len(), MAX_STATUS_BYTES);
    }

    proptest! {
        #[test]
        fn decode_keeps_every_output_byte(channel in any::<u8>(), payload in proptest::collection::vec(any::<u8>(), 0..300)) {
            let mut msg = vec![channel];
            msg.extend_from_slice(&payload);
            let got = decode_server(Bytes::from(msg));
            let want = match (channel, payload.is_empty()) {
                (_, true) => ServerMessage::Ignored,
                (1, false) => ServerMessage::Stdout(Bytes::from(payload.clone())),
                (2, false) => ServerMessage::Stderr(Bytes::from(payload.clone())),
                (3, false) => ServerMessage::Status(Bytes::from(payload.clone())),
                _ => ServerMessage::Ignored,
            };
            prop_assert_eq!(got, want);
        }

        #[test]
        fn stdin_round_trips(data in proptest::collection::vec(any::<u8>(), 0..300)) {
            let msg = stdin(&data);
            prop_assert_eq!(msg[0], 0);
            prop_assert_eq!(&msg[1..], &data[..]);
        }
    }
}
