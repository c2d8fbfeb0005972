//! What the client sees on channel 3 for what happened upstream (PROTOCOL.md §4.3), with one
//! deliberate deviation: an upstream that vanished without a status is a Failure, not Success.

use super::protocol::UpstreamVersion;
use super::status::{Status, EXIT_CODE_CAUSE, FAILURE, NON_ZERO_EXIT_CODE, SUCCESS};

/// Text of our deviation from the reference (which reports Success here).
pub const NO_STATUS_MESSAGE: &str = "the upstream closed the session before reporting a status";

/// Maps the complete contents of the upstream `error` stream to the Status for the client.
/// `ended_cleanly` is false when the connection died instead of the stream ending by FIN/RST.
pub fn from_upstream_error_stream(
    version: UpstreamVersion,
    bytes: &[u8],
    ended_cleanly: bool,
) -> Status {
    if bytes.is_empty() {
        // v4+ always write a status; v1–v3 write nothing on success — unless the connection died.
        return if version.json_status() || !ended_cleanly {
            Status::internal_error(NO_STATUS_MESSAGE)
        } else {
            Status::success()
        };
    }
    if !version.json_status() {
        let text = String::from_utf8_lossy(bytes);
        return Status::internal_error(&format!("error executing remote command: {}", text.trim()));
    }
    let upstream: Status = match serde_json::from_slice(bytes) {
        Ok(s) => s,
        Err(e) => {
            return Status::internal_error(&format!(
                "error stream protocol error: {e} in {:?}",
                String::from_utf8_lossy(bytes)
            ))
        }
    };
    match upstream.status.as_str() {
        SUCCESS => Status::success(),
        FAILURE if upstream.reason == NON_ZERO_EXIT_CODE => {
            let cause = upstream
                .details
                .as_ref()
                .and_then(|d| d.causes.iter().find(|c| c.reason == EXIT_CODE_CAUSE));
            match cause.map(|c| c.message.parse::<u8>()) {
                Some(Ok(code)) => Status::non_zero_exit(code),
                Some(Err(e)) => Status::internal_error(&format!(
                    "error stream protocol error: invalid exit code value {:?}: {e}",
                    cause.map(|c| c.message.as_str()).unwrap_or("")
                )),
                None => Status::internal_error(
                    "error stream protocol error: no ExitCode cause in a NonZeroExitCode status",
                ),
            }
        }
        FAILURE => Status::internal_error(&upstream.message),
        _ => Status::internal_error("error stream protocol error: unknown error"),
    }
}

/// The Status for an upstream that refused the upgrade: its own Status if the body is one,
/// otherwise an InternalError carrying the body text (what client-go reports).
pub fn from_upgrade_refusal(code: u16, content_type: Option<&str>, body: &[u8]) -> Status {
    let json_like = content_type.is_some_and(|c| c.contains("json"))
        || body.first().is_some_and(|b| *b == b'{');
    if json_like {
        if let Ok(status) = serde_json::from_slice::<Status>(body) {
            if status.kind == "Status" || !status.status.is_empty() {
                return status;
            }
        }
    }
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    let text = if text.is_empty() {
        format!("HTTP {code}")
    } else {
        text.to_owned()
    };
    Status::internal_error(&format!("unable to upgrade connection: {text}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const V4: UpstreamVersion = UpstreamVersion::V4;

    #[test]
    fn v4_statuses() {
        assert_eq!(
            from_upstream_error_stream(V4, br#"{"metadata":{},"status":"Success"}"#, true),
            Status::success()
        );
        let kubelet = br#"{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit code: error executing command [sh -c exit 2], exit code 2","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"2"}]}}"#;
        assert_eq!(
            from_upstream_error_stream(V4, kubelet, true),
            Status::non_zero_exit(2)
        );
        let internal = br#"{"metadata":{},"status":"Failure","message":"error executing command in container: boom","reason":"InternalError","code":500}"#;
        let s = from_upstream_error_stream(V4, internal, true);
        assert_eq!(
            s.message,
            "Internal error occurred: error executing command in container: boom"
        );
        assert_eq!(s.code, 500);
    }

    #[test]
    fn missing_status_is_a_failure() {
        let s = from_upstream_error_stream(V4, b"", false);
        assert_eq!(s.reason, "InternalError");
        assert!(s.message.contains(NO_STATUS_MESSAGE));
        assert_eq!(
            from_upstream_error_stream(V4, b"", true).reason,
            "InternalError"
        );
        assert_eq!(
            from_upstream_error_stream(UpstreamVersion::V3, b"", true),
            Status::success()
        );
    }

    #[test]
    fn bad_exit_codes_and_old_versions() {
        let bad = br#"{"status":"Failure","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"300"}]}}"#;
        assert!(from_upstream_error_stream(V4, bad, true)
            .message
            .contains("protocol error"));
        let s = from_upstream_error_stream(UpstreamVersion::V2, b"oops\n", true);
        assert_eq!(
            s.message,
            "Internal error occurred: error executing remote command: oops"
        );
        assert!(from_upstream_error_stream(V4, b"not json", true)
            .message
            .contains("protocol error"));
    }

    #[test]
    fn refusals() {
        let forbidden = br#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"pods \"x\" is forbidden","reason":"Forbidden","details":{"name":"x","kind":"pods"},"code":403}"#;
        let s = from_upgrade_refusal(403, Some("application/json"), forbidden);
        assert_eq!(s.code, 403);
        assert_eq!(s.reason, "Forbidden");
        assert_eq!(s.to_json_bytes(), forbidden.to_vec());
        let s = from_upgrade_refusal(
            500,
            Some("text/plain"),
            b"container runtime is not responding\n",
        );
        assert_eq!(
            s.message,
            "Internal error occurred: unable to upgrade connection: container runtime is not responding"
        );
        assert!(from_upgrade_refusal(502, None, b"")
            .message
            .contains("HTTP 502"));
    }
}
