//! How a relayed exec/attach is ended by the proxy when its recording fails under
//! `--record=required`, or an operator terminates it (the sessions API): at a frame boundary ([`FrameCursor`]), with what a kubelet sends at
//! the end of a failed stream, so that the client prints why and fails.
//!
//! - SPDY/3.1: the Status as a DATA frame on the error stream the client opened, with FIN,
//!   then an empty DATA frame with FIN on stdout and stderr (the streams kubectl waits to end
//!   before it reads the error stream). DATA frames carry no header block, so nothing touches
//!   the upstream's zlib context; no GOAWAY, which would make spdystream drop frames it has
//!   read and not yet handled: the client closes the connection once it has read them.
//! - WebSocket channel protocols: a message on channel 3 (binary, or `3` and base64 in a text
//!   message), then a Close with 1000 (normal closure), as kube-apiserver and the kubelet end
//!   a failed v4 or v5 stream and as the translated path does.
//!
//! v4 and later carry a `metav1.Status` on the error channel; the older protocols its message
//! as text.

use base64::Engine;

use super::frames::{FrameCursor, Framing};
use crate::session_stop::Termination;
use crate::spdy::frame::FLAG_FIN;
use crate::translate::channel::Channel;
use crate::translate::observe::{RemoteCommandStreams, WebSocketFraming};
use crate::translate::status::Status;
use crate::translate::ws::frame::{FrameHead, OpCode, MAX_HEAD_LEN};
use crate::translate::ws::CloseCode;

/// The Status kube-apiserver sends for a stream that failed (`InternalError`, 500), saying
/// that the session's recording failed (`why`) and that the proxy ended it. The translated
/// path sends the same.
pub fn recording_failed(why: &str) -> Status {
    Status::failure(
        500,
        "InternalError",
        format!(
            "kube-ws-proxy ended the session: its recording failed ({why}) and recordings are \
             required (--record=required)"
        ),
    )
}

/// The Status a session an operator terminated ends with (`Forbidden`, 403, saying who and
/// why), as on the translated path.
pub fn terminated(termination: &Termination) -> Status {
    Status::failure(403, "Forbidden", termination.message())
}

/// What the error channel of a protocol carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorFormat {
    /// v4 and later: a `metav1.Status`.
    Status,
    /// `channel.k8s.io` to v3: the error's message, as text.
    Text,
}

impl ErrorFormat {
    fn of(protocol: Option<&str>) -> ErrorFormat {
        match protocol.map(str::trim) {
            Some(p) if p.starts_with("v4.") || p.starts_with("v5.") => ErrorFormat::Status,
            _ => ErrorFormat::Text,
        }
    }

    fn payload(self, status: &Status) -> Vec<u8> {
        match self {
            ErrorFormat::Status => status.to_json_bytes(),
            ErrorFormat::Text => status.message.clone().into_bytes(),
        }
    }
}

/// How a relayed remote-command session of one protocol is ended by the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// SPDY/3.1 remote command.
    Spdy(ErrorFormat),
    /// A WebSocket channel protocol.
    WebSocket(WebSocketFraming, ErrorFormat),
}

/// The bytes that end a session, and whether the connection to the client may then be
/// half-closed at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndFrames {
    pub bytes: Vec<u8>,
    /// WebSocket: after a Close, yes. SPDY: no; the client closes once it has read them
    /// (spdystream drops frames still queued when its connection reads EOF).
    pub half_close: bool,
}

impl Ending {
    /// The ending of a session the upstream answered with `upgrade` and `protocol` (its
    /// `Sec-WebSocket-Protocol` or `X-Stream-Protocol-Version`); `None` for one that is not a
    /// remote-command protocol the proxy can end.
    pub fn for_protocol(upgrade: Option<&str>, protocol: Option<&str>) -> Option<Ending> {
        let upgrade = upgrade?.trim();
        let format = ErrorFormat::of(protocol);
        if upgrade.eq_ignore_ascii_case("SPDY/3.1") {
            return Some(Ending::Spdy(format));
        }
        if !upgrade.eq_ignore_ascii_case("websocket") {
            return None;
        }
        let framing = match protocol.map(str::trim).filter(|p| !p.is_empty()) {
            None => WebSocketFraming::Binary,
            Some(name) => WebSocketFraming::from_subprotocol(name)?,
        };
        Some(Ending::WebSocket(framing, format))
    }

    /// How the upstream's frames are followed.
    pub fn framing(self) -> Framing {
        match self {
            Ending::Spdy(_) => Framing::Spdy,
            Ending::WebSocket(..) => Framing::WebSocket,
        }
    }

    /// The frames that end the session with `status`, to go where `cursor` stands; `None`
    /// when nothing of ours may go there (inside a frame, after the upstream began closing,
    /// in a stream not understood) or there is nothing to say it on.
    pub fn frames(
        self,
        status: &Status,
        cursor: &FrameCursor,
        streams: RemoteCommandStreams,
    ) -> Option<EndFrames> {
        if !cursor.at_boundary() {
            return None;
        }
        let frames = match self {
            Ending::Spdy(format) => EndFrames {
                bytes: spdy_frames(&format.payload(status), cursor, streams),
                half_close: false,
            },
            Ending::WebSocket(framing, format) => EndFrames {
                bytes: websocket_frames(framing, &format.payload(status), cursor.in_message()),
                half_close: true,
            },
        };
        (!frames.bytes.is_empty()).then_some(frames)
    }
}

/// DATA frames: `payload` with FIN on the error stream, FIN on stdout and stderr; on each
/// only if the upstream has not ended it.
fn spdy_frames(payload: &[u8], cursor: &FrameCursor, streams: RemoteCommandStreams) -> Vec<u8> {
    let mut out = Vec::new();
    let open = |id: Option<u32>| id.filter(|id| !cursor.finished(*id));
    if let Some(error) = open(streams.error) {
        spdy_data(error, payload, &mut out);
    }
    for output in [streams.stdout, streams.stderr] {
        if let Some(id) = open(output) {
            spdy_data(id, &[], &mut out);
        }
    }
    out
}

/// A SPDY DATA frame with FIN: stream id (control bit clear), flags, 24-bit length, payload.
fn spdy_data(stream: u32, payload: &[u8], out: &mut Vec<u8>) {
    // A Status is a few hundred bytes: far below the 24-bit limit.
    let len = payload.len().min(0x00FF_FFFF) as u32;
    out.extend_from_slice(&(stream & 0x7FFF_FFFF).to_be_bytes());
    out.push(FLAG_FIN);
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.extend_from_slice(&payload[..len as usize]);
}

/// The error channel's message (unless a message of the upstream's is unfinished: one of
/// ours cannot go between its fragments) and a Close.
fn websocket_frames(framing: WebSocketFraming, payload: &[u8], in_message: bool) -> Vec<u8> {
    let mut out = Vec::new();
    let close = if in_message {
        // Kubernetes servers never fragment; a Close may go between fragments, a message not.
        close_payload(CloseCode(1011), "ended by kube-ws-proxy")
    } else {
        let channel = Channel::Error.as_byte();
        match framing {
            WebSocketFraming::Binary => {
                let mut message = Vec::with_capacity(payload.len() + 1);
                message.push(channel);
                message.extend_from_slice(payload);
                server_frame(OpCode::Binary, &message, &mut out);
            }
            WebSocketFraming::Base64 => {
                let mut message = vec![b'0' + channel];
                message.extend_from_slice(
                    base64::engine::general_purpose::STANDARD
                        .encode(payload)
                        .as_bytes(),
                );
                server_frame(OpCode::Text, &message, &mut out);
            }
        }
        close_payload(CloseCode::NORMAL, "")
    };
    server_frame(OpCode::Close, &close, &mut out);
    out
}

fn close_payload(code: CloseCode, reason: &str) -> Vec<u8> {
    let mut p = code.0.to_be_bytes().to_vec();
    p.extend_from_slice(reason.as_bytes());
    p
}

/// An unmasked, final frame, as a server sends it.
fn server_frame(opcode: OpCode, payload: &[u8], out: &mut Vec<u8>) {
    let mut head = [0u8; MAX_HEAD_LEN];
    let n = FrameHead::encode_server(opcode, payload.len(), &mut head);
    out.extend_from_slice(&head[..n]);
    out.extend_from_slice(payload);
}

#[cfg(test)]
mod tests {
    use super::*;

    const WHY: &str = "No space left on device (os error 28)";

    fn json(status: &Status) -> Vec<u8> {
        status.to_json_bytes()
    }

    #[test]
    fn the_status_is_what_kube_apiserver_sends_for_a_failed_stream() {
        assert_eq!(
            String::from_utf8(json(&recording_failed(WHY))).unwrap(),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"kube-ws-proxy ended the session: its recording failed (No space left on device (os error 28)) and recordings are required (--record=required)","reason":"InternalError","code":500}"#
        );
    }

    fn streams() -> RemoteCommandStreams {
        RemoteCommandStreams {
            error: Some(1),
            stdout: Some(5),
            stderr: Some(7),
        }
    }

    #[test]
    fn spdy_the_status_on_the_error_stream_then_fin_on_the_outputs() {
        let status = recording_failed(WHY);
        let ending = Ending::for_protocol(Some("SPDY/3.1"), Some("v4.channel.k8s.io")).unwrap();
        let cursor = FrameCursor::holding_heads(Framing::Spdy);
        let end = ending.frames(&status, &cursor, streams()).unwrap();
        let payload = json(&status);
        let mut expected = vec![0, 0, 0, 1, 0x01, 0, 0, payload.len() as u8];
        // The payload is between 256 and 64 KiB: the 24-bit length's middle byte too.
        expected[6] = (payload.len() >> 8) as u8;
        expected.extend_from_slice(&payload);
        expected.extend_from_slice(&[0, 0, 0, 5, 0x01, 0, 0, 0]);
        expected.extend_from_slice(&[0, 0, 0, 7, 0x01, 0, 0, 0]);
        assert_eq!(end.bytes, expected);
        assert!(!end.half_close);
    }

    #[test]
    fn spdy_streams_the_upstream_ended_are_left_alone() {
        let status = recording_failed(WHY);
        let ending = Ending::for_protocol(Some("SPDY/3.1"), Some("v4.channel.k8s.io")).unwrap();
        let mut cursor = FrameCursor::holding_heads(Framing::Spdy);
        // The upstream ended stdout (an empty DATA frame with FIN).
        assert_eq!(cursor.follow(&[0, 0, 0, 5, 0x01, 0, 0, 0]).pass, 8);
        let end = ending.frames(&status, &cursor, streams()).unwrap();
        assert!(!end.bytes.windows(5).any(|w| w == [0, 0, 0, 5, 0x01]));
        assert!(end.bytes.ends_with(&[0, 0, 0, 7, 0x01, 0, 0, 0]));
    }

    /// Streams the upstream ended with a control frame (SYN_REPLY with FIN, RST_STREAM) get
    /// nothing of ours either: spdystream ends a stream on those as on a DATA frame's FIN.
    #[test]
    fn spdy_streams_the_upstream_reset_or_answered_with_fin_are_left_alone() {
        let status = recording_failed(WHY);
        let ending = Ending::for_protocol(Some("SPDY/3.1"), Some("v4.channel.k8s.io")).unwrap();
        let mut cursor = FrameCursor::holding_heads(Framing::Spdy);
        // SYN_REPLY with FIN on stdout (an empty block after the stream id), RST_STREAM on
        // the error stream.
        let reply_fin = [0x80, 3, 0, 2, 0x01, 0, 0, 4, 0, 0, 0, 5];
        let rst = [0x80, 3, 0, 3, 0, 0, 0, 8, 0, 0, 0, 1, 0, 0, 0, 5];
        assert_eq!(cursor.follow(&[&reply_fin[..], &rst].concat()).pass, 28);
        let end = ending.frames(&status, &cursor, streams()).unwrap();
        assert_eq!(end.bytes, [0, 0, 0, 7, 0x01, 0, 0, 0]);
    }

    #[test]
    fn old_spdy_protocols_get_the_message_as_text() {
        let status = recording_failed(WHY);
        let ending = Ending::for_protocol(Some("SPDY/3.1"), Some("v3.channel.k8s.io")).unwrap();
        let cursor = FrameCursor::holding_heads(Framing::Spdy);
        let end = ending.frames(&status, &cursor, streams()).unwrap();
        let text = status.message.as_bytes();
        assert_eq!(&end.bytes[8..8 + text.len()], text);
    }

    #[test]
    fn nothing_goes_inside_a_frame_or_after_the_upstream_closed() {
        let status = recording_failed(WHY);
        let spdy = Ending::for_protocol(Some("SPDY/3.1"), Some("v4.channel.k8s.io")).unwrap();
        let mut cursor = FrameCursor::holding_heads(Framing::Spdy);
        cursor.follow(&[0, 0, 0, 5, 0, 0, 0, 10, b'x']);
        assert_eq!(spdy.frames(&status, &cursor, streams()), None);
        let v5 = Ending::for_protocol(Some("websocket"), Some("v5.channel.k8s.io")).unwrap();
        let mut cursor = FrameCursor::holding_heads(Framing::WebSocket);
        cursor.follow(&[0x88, 0]);
        assert_eq!(v5.frames(&status, &cursor, streams()), None);
    }

    #[test]
    fn v4_and_v5_a_binary_message_on_channel_3_then_a_normal_close() {
        let status = recording_failed(WHY);
        let payload = json(&status);
        for protocol in ["v4.channel.k8s.io", "v5.channel.k8s.io"] {
            let ending = Ending::for_protocol(Some("websocket"), Some(protocol)).unwrap();
            let cursor = FrameCursor::holding_heads(Framing::WebSocket);
            let end = ending.frames(&status, &cursor, streams()).unwrap();
            let len = payload.len() + 1;
            let mut expected = vec![0x82, 126, (len >> 8) as u8, len as u8, 3];
            expected.extend_from_slice(&payload);
            expected.extend_from_slice(&[0x88, 2, 0x03, 0xe8]);
            assert_eq!(end.bytes, expected, "{protocol}");
            assert!(end.half_close);
        }
    }

    #[test]
    fn base64_a_text_message_on_channel_3() {
        let status = recording_failed(WHY);
        let ending =
            Ending::for_protocol(Some("websocket"), Some("v4.base64.channel.k8s.io")).unwrap();
        let cursor = FrameCursor::holding_heads(Framing::WebSocket);
        let end = ending.frames(&status, &cursor, streams()).unwrap();
        let encoded = base64::engine::general_purpose::STANDARD.encode(json(&status));
        let len = encoded.len() + 1;
        let mut expected = vec![0x81, 126, (len >> 8) as u8, len as u8, b'3'];
        expected.extend_from_slice(encoded.as_bytes());
        expected.extend_from_slice(&[0x88, 2, 0x03, 0xe8]);
        assert_eq!(end.bytes, expected);
    }

    #[test]
    fn between_fragments_only_a_close_goes() {
        let status = recording_failed(WHY);
        let ending = Ending::for_protocol(Some("websocket"), Some("v4.channel.k8s.io")).unwrap();
        let mut cursor = FrameCursor::holding_heads(Framing::WebSocket);
        cursor.follow(&[0x02, 1, 1]);
        let end = ending.frames(&status, &cursor, streams()).unwrap();
        let mut expected = vec![0x88, 24, 0x03, 0xf3];
        expected.extend_from_slice(b"ended by kube-ws-proxy");
        assert_eq!(end.bytes, expected);
    }

    #[test]
    fn only_remote_command_protocols_are_ended() {
        assert!(Ending::for_protocol(Some("websocket"), Some("portforward.k8s.io")).is_none());
        assert!(Ending::for_protocol(Some("h2c"), None).is_none());
        assert_eq!(
            Ending::for_protocol(Some("websocket"), Some("")),
            Some(Ending::WebSocket(
                WebSocketFraming::Binary,
                ErrorFormat::Text
            ))
        );
    }
}
