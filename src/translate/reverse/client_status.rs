//! The status a SPDY client is given at the end of a reverse-translated session, and how its
//! `error` stream carries it for the negotiated version (PROTOCOL.md §1.6, §3.5): v4 a JSON
//! Status, always; v1–v3 the message text, on failure only.
//!
//! A v5 upstream's Status is already what a v4 client decodes (same JSON, same exit-code cause),
//! so it is passed on byte for byte; only when the upstream wrote none, or something that is
//! not a Status, does the proxy write its own.

use bytes::Bytes;

use crate::translate::protocol::UpstreamVersion;
use crate::translate::status::{Status, SUCCESS};
use crate::translate::status_mapping::NO_STATUS_MESSAGE;

/// The outcome of a session as the SPDY client will see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientStatus {
    /// The status, decoded (for logs, metrics and the audit's exit code).
    pub status: Status,
    /// The upstream's own bytes, when they were a Status.
    raw: Option<Bytes>,
}

impl ClientStatus {
    /// From what the upstream wrote on channel 3 by the time the session ended. A v5 server
    /// always writes a Status, so none at all is a failure, however the upstream closed.
    pub fn from_upstream(bytes: &[u8]) -> ClientStatus {
        if bytes.is_empty() {
            return ClientStatus::proxy(Status::internal_error(NO_STATUS_MESSAGE));
        }
        match serde_json::from_slice::<Status>(bytes) {
            Ok(status) if !status.status.is_empty() => ClientStatus {
                status,
                raw: Some(Bytes::copy_from_slice(bytes)),
            },
            Ok(_) => ClientStatus::proxy(Status::internal_error(&format!(
                "error stream protocol error: no status in {:?}",
                String::from_utf8_lossy(bytes)
            ))),
            Err(e) => ClientStatus::proxy(Status::internal_error(&format!(
                "error stream protocol error: {e} in {:?}",
                String::from_utf8_lossy(bytes)
            ))),
        }
    }

    /// A status the proxy decided on (shutdown, idle timeout, an upstream that went silent).
    pub fn proxy(status: Status) -> ClientStatus {
        ClientStatus { status, raw: None }
    }

    /// What to write on the client's `error` stream for `version`; `None`: nothing (v1–v3
    /// success).
    pub fn error_stream_payload(&self, version: UpstreamVersion) -> Option<Bytes> {
        if version.json_status() {
            return Some(
                self.raw
                    .clone()
                    .unwrap_or_else(|| Bytes::from(self.status.to_json_bytes())),
            );
        }
        if self.status.status == SUCCESS {
            return None;
        }
        Some(Bytes::from(self.status.message.clone().into_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SUCCESS_JSON: &[u8] = br#"{"metadata":{},"status":"Success"}"#;
    const EXIT_3: &[u8] = br#"{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit code: command terminated with exit code 3","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"3"}]}}"#;

    #[test]
    fn v4_gets_the_upstream_bytes() {
        let s = ClientStatus::from_upstream(SUCCESS_JSON);
        assert_eq!(s.status, Status::success());
        assert_eq!(
            s.error_stream_payload(UpstreamVersion::V4).unwrap(),
            SUCCESS_JSON
        );
        let s = ClientStatus::from_upstream(EXIT_3);
        assert_eq!(s.status.exit_code(), Some(3));
        assert_eq!(s.error_stream_payload(UpstreamVersion::V4).unwrap(), EXIT_3);
        // A Status with fields of its own (an API server's Forbidden, say) is kept whole.
        let forbidden = br#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"no","reason":"Forbidden","code":403}"#;
        let s = ClientStatus::from_upstream(forbidden);
        assert_eq!(
            s.error_stream_payload(UpstreamVersion::V4).unwrap(),
            &forbidden[..]
        );
    }

    #[test]
    fn older_versions_get_text_on_failure_only() {
        for v in [
            UpstreamVersion::V1,
            UpstreamVersion::V2,
            UpstreamVersion::V3,
        ] {
            assert_eq!(
                ClientStatus::from_upstream(SUCCESS_JSON).error_stream_payload(v),
                None
            );
            assert_eq!(
                ClientStatus::from_upstream(EXIT_3)
                    .error_stream_payload(v)
                    .unwrap(),
                "command terminated with non-zero exit code: command terminated with exit code 3"
            );
        }
    }

    #[test]
    fn no_status_or_garbage_is_a_failure() {
        let s = ClientStatus::from_upstream(b"");
        assert_eq!(s.status.reason, "InternalError");
        assert!(s.status.message.contains(NO_STATUS_MESSAGE));
        let json = s.error_stream_payload(UpstreamVersion::V4).unwrap();
        assert_eq!(json, Bytes::from(s.status.to_json_bytes()));
        // v1–v3 clients are told too: a failure is never silent.
        assert!(s.error_stream_payload(UpstreamVersion::V2).is_some());
        let s = ClientStatus::from_upstream(b"{\"status\":");
        assert!(s.status.message.contains("protocol error"));
        let s = ClientStatus::from_upstream(b"{}");
        assert!(s.status.message.contains("no status"));
    }

    #[test]
    fn proxy_statuses_are_encoded_like_go() {
        let s = ClientStatus::proxy(Status::failure(504, "Timeout", "idle".into()));
        assert_eq!(
            s.error_stream_payload(UpstreamVersion::V4).unwrap(),
            Bytes::from(s.status.to_json_bytes())
        );
        assert_eq!(s.error_stream_payload(UpstreamVersion::V3).unwrap(), "idle");
    }

    proptest! {
        #[test]
        fn any_bytes_give_a_status_for_every_version(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let s = ClientStatus::from_upstream(&bytes);
            prop_assert!(s.error_stream_payload(UpstreamVersion::V4).is_some());
            for v in [UpstreamVersion::V1, UpstreamVersion::V2, UpstreamVersion::V3] {
                prop_assert_eq!(s.error_stream_payload(v).is_none(), s.status.status == SUCCESS);
            }
        }
    }
}
