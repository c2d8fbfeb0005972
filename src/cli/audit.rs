//! The audit log of streaming sessions and the recordings of exec and attach.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::values::{parse_bytes, parse_bytes_or_zero, parse_duration};
use crate::audit::recording::RecordPolicy;
use crate::proxy::route::kubelet::NodeProxySessions;

/// Audit and recording.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Audit and recording")]
pub struct AuditArgs {
    /// Audit log of streaming sessions: a file, or `-` for stdout. Off by default.
    ///
    /// One JSON line when each session starts and one when it ends: exec, attach, cp,
    /// port-forward and followed logs, on every path.
    #[arg(long, env = "KUBE_WS_PROXY_AUDIT_LOG", value_name = "PATH")]
    pub audit_log: Option<String>,

    /// Rotate the audit log file before it grows past this size (suffixes Ki, Mi, Gi).
    #[arg(
        long,
        env = "KUBE_WS_PROXY_AUDIT_LOG_MAX_SIZE",
        default_value = "100Mi",
        value_parser = parse_bytes,
        value_name = "BYTES"
    )]
    pub audit_log_max_size: u64,

    /// Rotated audit log files to keep.
    ///
    /// `PATH.1` is the newest; 0: the file is emptied instead.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_AUDIT_LOG_MAX_BACKUPS",
        default_value_t = 5,
        value_name = "COUNT"
    )]
    pub audit_log_max_backups: usize,

    /// Refused sessions one caller address may have audited in a row (then 429 for a while).
    ///
    /// A session the upstream refuses (or whose client never completes its upgrade) has
    /// written its audit events; each costs its address one of these, and one comes back
    /// every `--audit-refusal-refill`. Once they are spent the proxy refuses the address's
    /// streaming sessions itself (429), without asking the upstream or writing their events;
    /// one `refused` event a minute counts them. Sessions the upstream opens cost nothing.
    /// Addresses are IPv4 addresses and IPv6 /64s (`X-Forwarded-For`'s with
    /// `--trust-x-forwarded-for`).
    #[arg(
        long,
        env = "KUBE_WS_PROXY_AUDIT_REFUSAL_BURST",
        default_value_t = 30,
        value_name = "COUNT"
    )]
    pub audit_refusal_burst: u32,

    /// How often a caller address gets one more refused session back (`--audit-refusal-burst`).
    #[arg(
        long,
        env = "KUBE_WS_PROXY_AUDIT_REFUSAL_REFILL",
        default_value = "10s",
        value_parser = parse_duration,
        value_name = "DURATION"
    )]
    pub audit_refusal_refill: Duration,

    /// Kubelet exec, attach, portForward and run through `nodes/{node}/proxy`: refuse or audit.
    ///
    /// `refuse`: 403, before anything goes upstream. `audit`: served as the sessions they are,
    /// audited with the node named and recorded. They reach the kubelet's own API, past the
    /// pod's `exec` RBAC, admission and the API server's audit of a pod exec; no kubectl
    /// command uses them.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_NODE_PROXY_SESSIONS",
        value_enum,
        default_value_t = NodeProxySessions::Refuse
    )]
    pub node_proxy_sessions: NodeProxySessions,

    /// Record exec and attach sessions as asciicast v2 files in `--record-dir`.
    #[arg(long, env = "KUBE_WS_PROXY_RECORD", value_enum, default_value_t = RecordPolicy::Off)]
    pub record: RecordPolicy,

    /// Where recordings go, one file per session (`<UTC start>_<session id>.cast`).
    #[arg(long, env = "KUBE_WS_PROXY_RECORD_DIR", value_name = "DIR")]
    pub record_dir: Option<PathBuf>,

    /// Record what clients type too (input events).
    ///
    /// Off by default: stdin can hold passwords.
    #[arg(long, env = "KUBE_WS_PROXY_RECORD_STDIN")]
    pub record_stdin: bool,

    /// Free space `--record-dir`'s filesystem must keep for a recording to start (0: no check).
    ///
    /// A session whose recording would start below it is refused under `--record=required`
    /// and goes on unrecorded under `best-effort`, so a nearly full disk is found before a
    /// session starts rather than in its middle. Suffixes Ki, Mi, Gi.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_RECORD_MIN_FREE",
        default_value = "64Mi",
        value_parser = parse_bytes_or_zero,
        value_name = "BYTES"
    )]
    pub record_min_free: u64,

    /// The most a recording's file may hold (0: no cap). Suffixes Ki, Mi, Gi.
    ///
    /// The event that reaches it is the last one recorded; a marker event then says the
    /// recording stopped, and the session goes on unrecorded. Its audit `ended` event says
    /// the recording was cut (`recording_truncated`) and how many session bytes were left
    /// out, so that a 10 GiB `kubectl cp` cannot fill the recordings' disk.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_RECORD_MAX_BYTES",
        default_value = "0",
        value_parser = parse_bytes_or_zero,
        value_name = "BYTES"
    )]
    pub record_max_bytes: u64,
}
