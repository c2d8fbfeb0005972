//! The audit log of streaming sessions and the recordings of exec and attach.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::values::{parse_bytes, parse_bytes_or_zero, parse_duration};
use crate::audit::recording::RecordPolicy;
use crate::audit::upload::{
    Encryption, EncryptionError, SseAlgorithm, StoreSettings, UploadTarget,
};
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

    /// Server-side encryption the store must apply to every object the proxy writes.
    ///
    /// `AES256` (SSE-S3), `aws:kms` (SSE-KMS) or `aws:kms:dsse` (DSSE-KMS), sent with each
    /// recording's and audit batch's upload; default: none asked, the bucket's default applies.
    /// A bucket policy that denies unencrypted uploads then refuses nothing of the proxy's.
    #[arg(
        long,
        env = "KUBE_WS_PROXY_S3_SSE",
        value_enum,
        value_name = "ALGORITHM"
    )]
    pub s3_sse: Option<SseAlgorithm>,

    /// The KMS key for `--s3-sse aws:kms` or `aws:kms:dsse`: a key id, ARN, alias or alias ARN.
    ///
    /// Default: the account's AWS-managed key for S3. Refused with `AES256` and without
    /// `--s3-sse`. The proxy's credentials need `kms:GenerateDataKey` on it (and `kms:Decrypt`
    /// for multipart uploads and for the sessions API to read recordings back).
    #[arg(
        long,
        env = "KUBE_WS_PROXY_S3_SSE_KMS_KEY_ID",
        value_name = "KEY",
        requires = "s3_sse"
    )]
    pub s3_sse_kms_key_id: Option<String>,
}

impl AuditArgs {
    /// How the store of `--record-upload` and `--audit-upload` is reached, and what it is asked
    /// to do with each object; an error if `--s3-sse` and `--s3-sse-kms-key-id` disagree.
    pub fn store_settings(&self) -> Result<StoreSettings, EncryptionError> {
        Ok(StoreSettings {
            endpoint: self.s3_endpoint.clone(),
            region: self.s3_region.clone(),
            path_style: self.s3_path_style.unwrap_or(self.s3_endpoint.is_some()),
            ca_file: self.s3_ca_file.clone(),
            static_keys: None,
            encryption: Encryption::from_flags(self.s3_sse, self.s3_sse_kms_key_id.as_deref())?,
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::Cli;

    const ARN: &str = "arn:aws:kms:us-east-1:111122223333:key/evidence";

    fn parsed(flags: &[&str]) -> Result<AuditArgs, clap::Error> {
        let argv = ["kube-ws-proxy", "--upstream", "http://127.0.0.1:1"]
            .iter()
            .chain(flags);
        Cli::try_parse_from(argv).map(|cli| cli.serve.audit)
    }

    #[test]
    fn s3_sse_takes_s3_s_three_names_and_a_kms_key() {
        assert_eq!(
            parsed(&[]).unwrap().store_settings().unwrap().encryption,
            None
        );
        for (name, want) in [
            ("AES256", Encryption::S3Managed),
            ("aws:kms", Encryption::Kms(None)),
            ("aws:kms:dsse", Encryption::DualLayerKms(None)),
        ] {
            let settings = parsed(&["--s3-sse", name])
                .unwrap()
                .store_settings()
                .unwrap();
            assert_eq!(settings.encryption, Some(want), "{name}");
        }
        let kms = parsed(&["--s3-sse", "aws:kms", "--s3-sse-kms-key-id", ARN]).unwrap();
        assert_eq!(
            kms.store_settings().unwrap().encryption,
            Some(Encryption::Kms(Some(ARN.into())))
        );
        let dsse = parsed(&[
            "--s3-sse=aws:kms:dsse",
            "--s3-sse-kms-key-id=alias/evidence",
        ]);
        assert_eq!(
            dsse.unwrap().store_settings().unwrap().encryption,
            Some(Encryption::DualLayerKms(Some("alias/evidence".into())))
        );
        // Other spellings are S3's errors waiting to happen: refused by the parser.
        for bad in ["aes256", "kms", "aws:kms:", "SSE-C", ""] {
            assert!(parsed(&["--s3-sse", bad]).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_kms_key_without_a_kms_algorithm_is_refused() {
        // Alone: the parser refuses it, naming the flag it needs.
        let alone = parsed(&["--s3-sse-kms-key-id", ARN]).unwrap_err();
        assert_eq!(
            alone.kind(),
            clap::error::ErrorKind::MissingRequiredArgument
        );
        assert!(alone.to_string().contains("--s3-sse"), "{alone}");
        // With AES256: refused at start, before any store is reached.
        let aes = parsed(&["--s3-sse", "AES256", "--s3-sse-kms-key-id", ARN]).unwrap();
        let refused = aes.store_settings().unwrap_err();
        assert_eq!(refused, EncryptionError::KeyWithAes256);
        assert!(refused.to_string().contains("aws:kms"), "{refused}");
        let empty = parsed(&["--s3-sse", "aws:kms", "--s3-sse-kms-key-id", ""]).unwrap();
        assert_eq!(
            empty.store_settings().unwrap_err(),
            EncryptionError::EmptyKey
        );
    }
}
