//! Kubernetes `metav1.Status` with Go's field order and `omitempty` rules, so the bytes we
//! write equal what kube-apiserver writes (PROTOCOL.md §1.6).

use serde::{Deserialize, Serialize};

/// `metav1.Status`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    /// Always present (as `{}`) in Go's output.
    #[serde(default)]
    pub metadata: ListMeta,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub status: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<StatusDetails>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub code: i32,
}

/// `metav1.ListMeta`, kept opaque apart from the fields a Status may carry.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListMeta {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub self_link: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub resource_version: String,
}

/// `metav1.StatusDetails`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusDetails {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub group: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub causes: Vec<StatusCause>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub retry_after_seconds: i32,
}

/// `metav1.StatusCause`; Go's `Type` field is serialized as `reason`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct StatusCause {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub field: String,
}

fn is_zero(v: &i32) -> bool {
    *v == 0
}

/// `status` of a successful operation.
pub const SUCCESS: &str = "Success";
/// `status` of a failed operation.
pub const FAILURE: &str = "Failure";
/// Reason of a command that exited non-zero.
pub const NON_ZERO_EXIT_CODE: &str = "NonZeroExitCode";
/// Cause reason carrying the exit code.
pub const EXIT_CODE_CAUSE: &str = "ExitCode";

impl Status {
    /// `{"metadata":{},"status":"Success"}`.
    pub fn success() -> Status {
        Status {
            status: SUCCESS.into(),
            ..Status::default()
        }
    }

    /// What kube-apiserver's translator writes for exit code `code` (no HTTP code).
    pub fn non_zero_exit(code: u8) -> Status {
        Status {
            status: FAILURE.into(),
            message: format!(
                "command terminated with non-zero exit code: command terminated with exit code {code}"
            ),
            reason: NON_ZERO_EXIT_CODE.into(),
            details: Some(StatusDetails {
                causes: vec![StatusCause {
                    reason: EXIT_CODE_CAUSE.into(),
                    message: code.to_string(),
                    ..StatusCause::default()
                }],
                ..StatusDetails::default()
            }),
            ..Status::default()
        }
    }

    /// Go's `NewInternalError(err)`.
    pub fn internal_error(msg: &str) -> Status {
        Status {
            status: FAILURE.into(),
            message: format!("Internal error occurred: {msg}"),
            reason: "InternalError".into(),
            details: Some(StatusDetails {
                causes: vec![StatusCause {
                    message: msg.into(),
                    ..StatusCause::default()
                }],
                ..StatusDetails::default()
            }),
            code: 500,
            ..Status::default()
        }
    }

    /// A Failure with an HTTP code, a reason and a message, as an API server answers errors.
    pub fn failure(code: u16, reason: &str, message: String) -> Status {
        Status {
            kind: "Status".into(),
            api_version: "v1".into(),
            status: FAILURE.into(),
            message,
            reason: reason.into(),
            code: i32::from(code),
            ..Status::default()
        }
    }

    /// The JSON bytes.
    pub fn to_json_bytes(&self) -> Vec<u8> {
        // Serializing plain strings and integers cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The exit code a client derives from this status: 0 for Success, N for NonZeroExitCode.
    pub fn exit_code(&self) -> Option<u8> {
        if self.status == SUCCESS {
            return Some(0);
        }
        if self.reason != NON_ZERO_EXIT_CODE {
            return None;
        }
        self.details
            .as_ref()?
            .causes
            .iter()
            .find(|c| c.reason == EXIT_CODE_CAUSE)
            .and_then(|c| c.message.parse().ok())
    }

    /// A short description for logs: `Success`, `exit 3`, or the reason.
    pub fn summary(&self) -> String {
        match self.exit_code() {
            Some(0) => "Success".into(),
            Some(n) => format!("exit {n}"),
            None if self.reason.is_empty() => self.status.clone(),
            None => self.reason.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn success_bytes_are_exact() {
        let json = Status::success().to_json_bytes();
        assert_eq!(json, br#"{"metadata":{},"status":"Success"}"#);
        assert_eq!(json.len(), 34);
    }

    #[test]
    fn non_zero_exit_bytes_are_exact() {
        let json = Status::non_zero_exit(2).to_json_bytes();
        let want = br#"{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit code: command terminated with exit code 2","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"2"}]}}"#;
        assert_eq!(
            String::from_utf8(json.clone()).unwrap(),
            String::from_utf8(want.to_vec()).unwrap()
        );
        assert_eq!(json.len(), 212);
    }

    #[test]
    fn internal_error_matches_go() {
        let json = Status::internal_error("boom").to_json_bytes();
        assert_eq!(
            String::from_utf8(json).unwrap(),
            r#"{"metadata":{},"status":"Failure","message":"Internal error occurred: boom","reason":"InternalError","details":{"causes":[{"message":"boom"}]},"code":500}"#
        );
    }

    #[test]
    fn exit_codes() {
        assert_eq!(Status::success().exit_code(), Some(0));
        assert_eq!(Status::non_zero_exit(255).exit_code(), Some(255));
        assert_eq!(Status::internal_error("x").exit_code(), None);
        assert_eq!(Status::non_zero_exit(3).summary(), "exit 3");
    }
}
