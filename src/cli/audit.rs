//! The audit log of streaming sessions and the recordings of exec and attach.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::values::{parse_bytes, parse_bytes_or_zero, parse_duration};
use crate::audit::recording::RecordPolicy;
use crate::audit::upload::{StoreSettings, UploadTarget};
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

    /// Upload each recording to an S3-compatible store when its session ends.
    ///
    /// `s3://BUCKET/PREFIX`: objects are `PREFIX/CLUSTER/YYYY/MM/DD/<session id>.cast` (the
    /// cluster's folder only with named clusters, the date the session's UTC start).
    /// `--record-dir` is the spool. Credentials come from the AWS SDK's chain: the
    /// `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY` variables, the shared files and
    /// `AWS_PROFILE`, a web-identity token (IRSA), pod identity or the instance metadata.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_RECORD_UPLOAD",
        value_name = "s3://BUCKET/PREFIX"
    )]
    pub record_upload: Option<UploadTarget>,

    /// Upload the audit log's lines too, in batches of JSON lines, beside the local log.
    ///
    /// `s3://BUCKET/PREFIX`: objects are `PREFIX/YYYY/MM/DD/<UTC start>_<replica>-<n>.jsonl`.
    /// Needs `--audit-log` to name a file: batches wait for their upload in the folder
    /// `<audit log>.upload` beside it. The store's settings are `--s3-*`'s.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_AUDIT_UPLOAD",
        value_name = "s3://BUCKET/PREFIX"
    )]
    pub audit_upload: Option<UploadTarget>,

    /// How long an audit batch collects lines before it is closed and uploaded.
    ///
    /// A batch is closed at 8 MiB and when the proxy stops too.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_AUDIT_UPLOAD_INTERVAL",
        default_value = "1m",
        value_parser = parse_duration,
        value_name = "DURATION"
    )]
    pub audit_upload_interval: Duration,

    /// An S3-compatible endpoint for the uploads (MinIO, Ceph, R2, GCS); default AWS's.
    ///
    /// `https://`, or `http://` to a loopback address only.
    #[arg(long, env = "KUBE_WS_PROXY_S3_ENDPOINT", value_name = "URL")]
    pub s3_endpoint: Option<String>,

    /// The region to sign for (default: `AWS_REGION`, the profile's, else `us-east-1`).
    #[arg(long, env = "KUBE_WS_PROXY_S3_REGION", value_name = "REGION")]
    pub s3_region: Option<String>,

    /// Path-style addressing (`ENDPOINT/BUCKET/KEY`); default: on with `--s3-endpoint`.
    ///
    /// Most S3-compatible stores need it; `false` for virtual-hosted buckets.
    #[arg(long, env = "KUBE_WS_PROXY_S3_PATH_STYLE", value_name = "BOOL")]
    pub s3_path_style: Option<bool>,

    /// How long a session's end waits for its recording's upload (0: not at all).
    ///
    /// Stored within it, the session's audit `ended` event names the object; otherwise the
    /// event says `pending` and an `uploaded` event follows once it is stored.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_RECORD_UPLOAD_WAIT",
        default_value = "5s",
        value_parser = parse_duration,
        value_name = "DURATION"
    )]
    pub record_upload_wait: Duration,

    /// Recordings not yet uploaded that the spool (`--record-dir`) may hold (0: no cap).
    ///
    /// Suffixes Ki, Mi, Gi.
    /// Checked as each session starts, with `--record-upload`: at the cap, under
    /// `--record=required` new sessions are refused (503) until uploads drain the spool;
    /// under `best-effort` they run unrecorded. A running session is not cut
    /// (`--record-max-bytes` bounds it).
    #[arg(
        long,
        env = "KUBE_WS_PROXY_RECORD_SPOOL_MAX",
        default_value = "10Gi",
        value_parser = parse_bytes_or_zero,
        value_name = "BYTES"
    )]
    pub record_spool_max: u64,

    /// PEM file of the CAs that sign the store's certificate, beside the system's roots.
    #[arg(long, env = "KUBE_WS_PROXY_S3_CA_FILE", value_name = "PATH")]
    pub s3_ca_file: Option<PathBuf>,
}

impl AuditArgs {
    /// How the store of `--record-upload` is reached.
    pub fn store_settings(&self) -> StoreSettings {
        StoreSettings {
            endpoint: self.s3_endpoint.clone(),
            region: self.s3_region.clone(),
            path_style: self.s3_path_style.unwrap_or(self.s3_endpoint.is_some()),
            ca_file: self.s3_ca_file.clone(),
            static_keys: None,
        }
    }
}
