//! `metav1.Status` bodies as an old API server and kubelet write them (PROTOCOL.md §1.6, §4.3).
//!
//! Private to the simulator on purpose: it reproduces the *kubelet's* wording (which differs
//! from the apiserver translator's), plus the HTTP error bodies of the API server.

use serde::Serialize;

/// One `metav1.Status`. Field order follows the Go struct, so the JSON matches Go's encoder.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Status {
    #[serde(skip_serializing_if = "Option::is_none")]
    kind: Option<&'static str>,
    #[serde(rename = "apiVersion", skip_serializing_if = "Option::is_none")]
    api_version: Option<&'static str>,
    metadata: Empty,
    status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    details: Option<Details>,
    #[serde(skip_serializing_if = "Option::is_none")]
    code: Option<u16>,
}

#[derive(Debug, Clone, Serialize)]
struct Empty {}

#[derive(Debug, Clone, Default, Serialize)]
struct Details {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    kind: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    causes: Vec<Cause>,
}

#[derive(Debug, Clone, Serialize)]
struct Cause {
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'static str>,
    message: String,
}

impl Status {
    /// `{"metadata":{},"status":"Success"}`.
    pub(crate) fn success() -> Self {
        Status {
            kind: None,
            api_version: None,
            metadata: Empty {},
            status: "Success",
            message: None,
            reason: None,
            details: None,
            code: None,
        }
    }

    /// The kubelet's status for a command that exited with `code` (KL `remotecommand/exec.go`,
    /// containerd's "error executing command %v, exit code %d").
    pub(crate) fn non_zero_exit(argv: &[String], code: i32) -> Self {
        Status {
            message: Some(format!(
                "command terminated with non-zero exit code: error executing command [{}], exit code {code}",
                argv.join(" ")
            )),
            reason: Some("NonZeroExitCode"),
            details: Some(Details {
                causes: vec![Cause {
                    reason: Some("ExitCode"),
                    message: code.to_string(),
                }],
                ..Default::default()
            }),
            ..Self::failure()
        }
    }

    /// `apierrors.NewInternalError(err)`: what the kubelet writes when the runtime could not run
    /// the command at all.
    pub(crate) fn internal_error(err: &str) -> Self {
        Status {
            message: Some(format!("Internal error occurred: {err}")),
            reason: Some("InternalError"),
            details: Some(Details {
                causes: vec![Cause {
                    reason: None,
                    message: err.to_string(),
                }],
                ..Default::default()
            }),
            code: Some(500),
            ..Self::failure()
        }
    }

    /// An API server error body (`kind: Status`), e.g. 404 NotFound or 403 Forbidden.
    pub(crate) fn api_error(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Status {
            kind: Some("Status"),
            api_version: Some("v1"),
            message: Some(message.into()),
            reason: Some(reason),
            details: None,
            code: Some(code),
            ..Self::failure()
        }
    }

    /// Adds `details.name` / `details.kind` (API errors about a named object).
    pub(crate) fn with_object(mut self, name: &str, kind: &str) -> Self {
        let details = self.details.get_or_insert_with(Details::default);
        details.name = Some(name.to_string());
        details.kind = Some(kind.to_string());
        self
    }

    fn failure() -> Self {
        Status {
            status: "Failure",
            ..Self::success()
        }
    }

    pub(crate) fn is_success(&self) -> bool {
        self.status == "Success"
    }

    /// The message text (what v1–v3 protocols write on failure).
    pub(crate) fn message(&self) -> &str {
        self.message.as_deref().unwrap_or("")
    }

    /// The JSON bytes exactly as Go's `encoding/json` would produce them (HTML-safe escaping of
    /// `<`, `>` and `&`, which can only occur inside strings).
    pub(crate) fn to_json_bytes(&self) -> Vec<u8> {
        let raw = serde_json::to_string(self).unwrap_or_default();
        go_html_escape(&raw).into_bytes()
    }

    /// What the error channel carries at the end of a session: the Status JSON from v4 on
    /// (`json`), before that the message of a failure and nothing for success.
    pub(crate) fn error_channel_payload(&self, json: bool) -> Option<Vec<u8>> {
        if json {
            Some(self.to_json_bytes())
        } else if !self.is_success() {
            Some(self.message().as_bytes().to_vec())
        } else {
            None
        }
    }
}

/// Go's `encoding/json` escapes `<`, `>`, `&` (and U+2028/U+2029) inside strings.
pub(crate) fn go_html_escape(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn success_bytes() {
        assert_eq!(
            Status::success().to_json_bytes(),
            br#"{"metadata":{},"status":"Success"}"#
        );
    }

    #[test]
    fn kubelet_exit_2_bytes() {
        let argv: Vec<String> = ["sh", "-c", "exit 2"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let json = String::from_utf8(Status::non_zero_exit(&argv, 2).to_json_bytes()).unwrap();
        assert_eq!(
            json,
            r#"{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit code: error executing command [sh -c exit 2], exit code 2","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"2"}]}}"#
        );
    }

    #[test]
    fn internal_error_shape() {
        let json = String::from_utf8(Status::internal_error("boom <x>").to_json_bytes()).unwrap();
        assert_eq!(
            json,
            r#"{"metadata":{},"status":"Failure","message":"Internal error occurred: boom \u003cx\u003e","reason":"InternalError","details":{"causes":[{"message":"boom \u003cx\u003e"}]},"code":500}"#
        );
    }

    #[test]
    fn api_error_shape() {
        let json = String::from_utf8(
            Status::api_error(404, "NotFound", "nope")
                .with_object("x", "pods")
                .to_json_bytes(),
        )
        .unwrap();
        assert_eq!(
            json,
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"nope","reason":"NotFound","details":{"name":"x","kind":"pods"},"code":404}"#
        );
    }
}
