//! Recordings to object storage (`--record-upload s3://BUCKET/PREFIX`): a replica's disk is
//! the spool, the store is where the evidence stays.
//!
//! - [`target`]: the `s3://` address, and the key of each recording under it.
//! - [`store`]: the S3-compatible store (the only file that names the AWS SDK).
//! - [`encryption`]: the server-side encryption asked for each object (`--s3-sse`).
//! - [`audit_batches`]: the audit log's lines in batches (`--audit-upload`).
//! - [`pending`]: the restart scan: recordings an earlier run left in the spool.
//! - [`spool`]: the spool's size, against `--record-spool-max`.
//! - [`uploader`]: closed spool files to the store, retried until stored.

pub mod audit_batches;
pub mod encryption;
pub mod pending;
pub mod spool;
pub mod store;
pub mod target;
pub mod uploader;

pub use audit_batches::AuditBatches;
pub use encryption::{Encryption, EncryptionError, SseAlgorithm};
pub use spool::{SpoolCap, SpoolUsage};
pub use store::{FailureReason, Store, StoreError, StoreSettings, StoreSetupError, PART_SIZE};
pub use target::{TargetError, UploadTarget};
pub use uploader::{Stored, UploadCounters, UploadJob, UploadKind, UploadState, Uploader};
