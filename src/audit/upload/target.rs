//! Where uploads go: `s3://BUCKET/PREFIX` read once at start, and the object key of each
//! recording under it (`PREFIX/CLUSTER/YYYY/MM/DD/<session id>.cast`).

use std::fmt;
use std::str::FromStr;
use std::time::SystemTime;

/// A bucket and a key prefix in an S3-compatible store (`--record-upload`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadTarget {
    bucket: String,
    /// Without leading or trailing `/`; empty for the bucket's root.
    prefix: String,
}

/// Why an `s3://` address was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("{0:?} is not an s3://BUCKET[/PREFIX] address")]
    NotS3(String),
    #[error(
        "{0:?} is not an S3 bucket name (3 to 63 lowercase letters, digits, '.' and '-', \
         starting and ending with a letter or digit)"
    )]
    Bucket(String),
    #[error("the prefix {0:?} has an empty, '.' or '..' segment, or a character outside printable ASCII")]
    Prefix(String),
}

impl FromStr for UploadTarget {
    type Err = TargetError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let rest = s
            .strip_prefix("s3://")
            .ok_or_else(|| TargetError::NotS3(s.to_owned()))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if !valid_bucket(bucket) {
            return Err(TargetError::Bucket(bucket.to_owned()));
        }
        let prefix = prefix.trim_matches('/');
        if !prefix.is_empty() && !valid_prefix(prefix) {
            return Err(TargetError::Prefix(prefix.to_owned()));
        }
        Ok(Self {
            bucket: bucket.to_owned(),
            prefix: prefix.to_owned(),
        })
    }
}

impl fmt::Display for UploadTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s3://{}", self.bucket)?;
        if !self.prefix.is_empty() {
            write!(f, "/{}", self.prefix)?;
        }
        Ok(())
    }
}

impl UploadTarget {
    /// The bucket's name.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The key prefix, without leading or trailing `/` (empty: the bucket's root).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The key of a session's recording: `PREFIX/CLUSTER/YYYY/MM/DD/<session id>.cast`, the
    /// cluster's folder only when the proxy names its clusters, the date the session's UTC
    /// start, so that a bucket's listing by day (and a lifecycle rule by prefix) works.
    pub fn recording_key(
        &self,
        cluster: Option<&str>,
        started: SystemTime,
        session_id: &str,
    ) -> String {
        let (y, m, d) = crate::timestamp::utc_date(started);
        let mut key = String::with_capacity(self.prefix.len() + 64);
        for segment in [self.prefix.as_str(), cluster.unwrap_or("")] {
            if !segment.is_empty() {
                key.push_str(segment);
                key.push('/');
            }
        }
        key.push_str(&format!("{y:04}/{m:02}/{d:02}/{session_id}.cast"));
        key
    }

    /// The key of an audit batch named `name`: `PREFIX/YYYY/MM/DD/<name>`, the date the
    /// batch's UTC start.
    pub fn audit_key(&self, started: SystemTime, name: &str) -> String {
        let (y, m, d) = crate::timestamp::utc_date(started);
        let mut key = String::with_capacity(self.prefix.len() + name.len() + 12);
        if !self.prefix.is_empty() {
            key.push_str(&self.prefix);
            key.push('/');
        }
        key.push_str(&format!("{y:04}/{m:02}/{d:02}/{name}"));
        key
    }

    /// `s3://BUCKET/KEY`: how audit events and logs name a stored object.
    pub fn object_url(&self, key: &str) -> String {
        format!("s3://{}/{key}", self.bucket)
    }
}

/// S3's rules for bucket names (the virtual-host-safe ones every S3-compatible store takes).
fn valid_bucket(b: &str) -> bool {
    let edge = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    (3..=63).contains(&b.len())
        && b.bytes().all(|c| edge(c) || c == b'.' || c == b'-')
        && edge(b.as_bytes()[0])
        && edge(b.as_bytes()[b.len() - 1])
        && !b.contains("..")
}

/// A prefix whose segments are names: no empty, `.` or `..` segment (stores and their
/// consoles treat those differently), printable ASCII only (keys are signed as given).
fn valid_prefix(p: &str) -> bool {
    p.len() <= 512
        && p.bytes().all(|c| c.is_ascii_graphic())
        && p.split('/').all(|s| !s.is_empty() && s != "." && s != "..")
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    fn target(s: &str) -> UploadTarget {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn parses_bucket_and_prefix() {
        let t = target("s3://evidence/recordings/prod");
        assert_eq!((t.bucket(), t.prefix()), ("evidence", "recordings/prod"));
        assert_eq!(t.to_string(), "s3://evidence/recordings/prod");
        let t = target("s3://evidence/recordings/");
        assert_eq!(t.prefix(), "recordings");
        for root in ["s3://evidence", "s3://evidence/", "s3://evidence//"] {
            let t = target(root);
            assert_eq!((t.bucket(), t.prefix()), ("evidence", ""), "{root}");
            assert_eq!(t.to_string(), "s3://evidence");
        }
    }

    #[test]
    fn refuses_what_is_not_an_s3_address() {
        for bad in ["evidence", "http://evidence/x", "S3://evidence", ""] {
            assert!(
                matches!(bad.parse::<UploadTarget>(), Err(TargetError::NotS3(_))),
                "{bad}"
            );
        }
        for bad in [
            "s3://",
            "s3://ab",
            "s3://Evidence",
            "s3://-evidence",
            "s3://evidence-",
            "s3://evi..dence",
            "s3://evi_dence",
            &format!("s3://{}", "a".repeat(64)),
        ] {
            assert!(
                matches!(bad.parse::<UploadTarget>(), Err(TargetError::Bucket(_))),
                "{bad}"
            );
        }
        for bad in [
            "s3://evidence/a//b",
            "s3://evidence/a/../b",
            "s3://evidence/a/./b",
            "s3://evidence/a b",
        ] {
            assert!(
                matches!(bad.parse::<UploadTarget>(), Err(TargetError::Prefix(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn recording_keys_are_dated_by_the_utc_start() {
        // 2026-11-28T23:59:59Z and one second later, the next UTC day.
        let before_midnight = UNIX_EPOCH + Duration::from_secs(1_795_910_399);
        let midnight = before_midnight + Duration::from_secs(1);
        let t = target("s3://evidence/rec");
        assert_eq!(
            t.recording_key(Some("prod"), before_midnight, "r1-7"),
            "rec/prod/2026/11/28/r1-7.cast"
        );
        assert_eq!(
            t.recording_key(Some("prod"), midnight, "r1-7"),
            "rec/prod/2026/11/29/r1-7.cast"
        );
        assert_eq!(
            t.recording_key(None, midnight, "r1-7"),
            "rec/2026/11/29/r1-7.cast"
        );
        let root = target("s3://evidence");
        assert_eq!(
            root.recording_key(None, midnight, "r1-7"),
            "2026/11/29/r1-7.cast"
        );
        assert_eq!(
            root.recording_key(Some("edge"), midnight, "r1-7"),
            "edge/2026/11/29/r1-7.cast"
        );
        assert_eq!(
            target("s3://evidence/audit").audit_key(midnight, "20261129T000000Z_ab-1.jsonl"),
            "audit/2026/11/29/20261129T000000Z_ab-1.jsonl"
        );
        assert_eq!(
            t.object_url("rec/2026/11/29/r1-7.cast"),
            "s3://evidence/rec/2026/11/29/r1-7.cast"
        );
    }
}
