//! The S3-compatible store: the only file that names the AWS SDK. A [`Store`] puts a closed
//! spool file under a key (one PUT up to [`PART_SIZE`], a multipart upload above it), and
//! sorts failures into the reasons the metrics and the retry schedule use.
//!
//! Credentials come from the SDK's default chain only (the AWS environment variables, the
//! shared config and credentials files and `AWS_PROFILE`, a web-identity token for IRSA, pod
//! identity, the instance metadata), never from a flag: a secret on a command line is in every
//! process listing. The HTTP client is the SDK's own on rustls with the `ring` provider, the
//! house's one provider (tests/dependency_policy.rs keeps aws-lc and OpenSSL out).

use std::path::{Path, PathBuf};
use std::time::Duration;

use aws_config::meta::region::RegionProviderChain;
use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, Region};
use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::config::Credentials;
use aws_sdk_s3::config::{
    RequestChecksumCalculation, ResponseChecksumValidation, SharedHttpClient,
};
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::{ByteStream, Length};
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart, ServerSideEncryption};
use aws_sdk_s3::Client;
use aws_smithy_http_client::tls;

use super::encryption::Encryption;
use super::target::UploadTarget;

/// Files up to this size go in one PUT; larger ones in parts of this size (S3's smallest
/// part is 5 MiB, its most parts 10,000: 8 MiB parts reach 78 GiB).
pub const PART_SIZE: u64 = 8 << 20;

/// The region signed for when neither a flag, the environment nor a profile names one: an
/// S3-compatible store that ignores regions (MinIO, Ceph) still needs one in the signature.
const FALLBACK_REGION: &str = "us-east-1";

/// How the store is reached, beside the `s3://` target (`--s3-*` flags).
#[derive(Debug, Clone, Default)]
pub struct StoreSettings {
    /// An S3-compatible endpoint (`https://minio.example:9000`); `None`: AWS's own, by region.
    pub endpoint: Option<String>,
    /// The region to sign for; `None`: the SDK's chain (`AWS_REGION`, the profile, IMDS).
    pub region: Option<String>,
    /// Path-style addressing (`ENDPOINT/BUCKET/KEY`), which most S3-compatible stores need.
    pub path_style: bool,
    /// PEM file of the CAs that sign the endpoint's certificate, beside the system's roots.
    pub ca_file: Option<PathBuf>,
    /// An access key id and secret to use instead of the SDK's chain: for embedders and the
    /// tests; the command line has no flag for it (a secret in a flag is in every process
    /// listing).
    pub static_keys: Option<(String, String)>,
    /// The server-side encryption asked for each object written (`--s3-sse`); `None`: the
    /// bucket's default.
    pub encryption: Option<Encryption>,
}

/// Why the store could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum StoreSetupError {
    #[error("--s3-endpoint {0:?}: not an http:// or https:// URL")]
    Endpoint(String),
    #[error(
        "--s3-endpoint {0}: plain http is only for a loopback endpoint (tests, a local gateway)"
    )]
    PlainHttp(String),
    #[error("--s3-ca-file {path}: {reason}")]
    Ca { path: PathBuf, reason: String },
}

/// Why one upload attempt failed, as the metrics count it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureReason {
    /// The store could not be reached (refused, reset, DNS, TLS).
    Connect,
    /// The store did not answer in time.
    Timeout,
    /// The store said no (403 bad credentials or policy, 404 no bucket): a configuration
    /// problem, retried all the same (it may be fixed while the files wait).
    Status4xx,
    /// The store failed (500, 503 SlowDown).
    Status5xx,
    /// The request could not be made: no credentials found, a region or endpoint problem.
    Request,
    /// The spool file could not be read.
    File,
}

impl FailureReason {
    /// Every reason.
    pub const ALL: [FailureReason; 6] = [
        Self::Connect,
        Self::Timeout,
        Self::Status4xx,
        Self::Status5xx,
        Self::Request,
        Self::File,
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Connect => "connect",
            Self::Timeout => "timeout",
            Self::Status4xx => "status_4xx",
            Self::Status5xx => "status_5xx",
            Self::Request => "request",
            Self::File => "file",
        }
    }
}

/// A failed store operation: why (for the metrics and the retry schedule) and what the store
/// or the SDK said (for the log).
#[derive(Debug, thiserror::Error)]
#[error("{}: {message}", reason.label())]
pub struct StoreError {
    /// Why, as counted.
    pub reason: FailureReason,
    /// What the store or the SDK said.
    pub message: String,
}

impl StoreError {
    fn file(path: &Path, e: impl std::fmt::Display) -> Self {
        Self {
            reason: FailureReason::File,
            message: format!("{}: {e}", path.display()),
        }
    }
}

/// Sorts an SDK error into a [`StoreError`].
fn sorted<E>(op: &str, e: SdkError<E, HttpResponse>) -> StoreError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    let reason = match &e {
        SdkError::TimeoutError(_) => FailureReason::Timeout,
        SdkError::DispatchFailure(d) if d.is_timeout() => FailureReason::Timeout,
        SdkError::DispatchFailure(d) if d.is_io() || d.is_other() => FailureReason::Connect,
        SdkError::DispatchFailure(_) | SdkError::ConstructionFailure(_) => FailureReason::Request,
        SdkError::ServiceError(s) if s.raw().status().is_client_error() => FailureReason::Status4xx,
        SdkError::ResponseError(_) | SdkError::ServiceError(_) => FailureReason::Status5xx,
        _ => FailureReason::Request,
    };
    let detail = match e.as_service_error() {
        Some(s) => format!(
            "{} {}",
            s.code().unwrap_or("error"),
            s.message().unwrap_or_default()
        ),
        None => aws_smithy_types::error::display::DisplayErrorContext(&e).to_string(),
    };
    StoreError {
        reason,
        message: format!("{op}: {detail}"),
    }
}

/// A bucket in an S3-compatible store, and the client that reaches it.
#[derive(Clone, Debug)]
pub struct Store {
    client: Client,
    target: UploadTarget,
    /// The store is reached over TLS, which already guards the payload's integrity: the
    /// payload is not hashed for the signature (S3's `UNSIGNED-PAYLOAD`), which would read
    /// each file twice. Plain http (loopback only) signs it.
    unsigned_payload: bool,
    /// Sent with every PutObject and CreateMultipartUpload (a multipart object's parts take
    /// its upload's): S3's algorithm and, with KMS, the key.
    sse: Option<ServerSideEncryption>,
    sse_kms_key_id: Option<String>,
}

impl Store {
    /// The client for `target`, its credentials and region from the SDK's chain unless
    /// `settings` names them. Makes no request (the store may come up after the proxy).
    pub async fn new(
        target: UploadTarget,
        settings: &StoreSettings,
    ) -> Result<Self, StoreSetupError> {
        let endpoint = settings
            .endpoint
            .as_deref()
            .map(checked_endpoint)
            .transpose()?;
        let unsigned_payload = endpoint
            .as_deref()
            .is_none_or(|e| e.starts_with("https://"));
        let http = http_client(settings.ca_file.as_deref())?;
        let region = RegionProviderChain::first_try(settings.region.clone().map(Region::new))
            .or_default_provider()
            .or_else(Region::new(FALLBACK_REGION));
        let timeouts = TimeoutConfig::builder()
            .connect_timeout(Duration::from_secs(5))
            .read_timeout(Duration::from_secs(60))
            .build();
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .http_client(http)
            .region(region)
            .timeout_config(timeouts);
        if let Some((id, secret)) = &settings.static_keys {
            loader = loader.credentials_provider(Credentials::new(
                id.clone(),
                secret.clone(),
                None,
                None,
                "kube-ws-proxy static keys",
            ));
        }
        let shared = loader.load().await;
        let mut config = aws_sdk_s3::config::Builder::from(&shared)
            .force_path_style(settings.path_style)
            // Checksums only where S3 requires them: S3-compatible stores differ in what
            // they take of the newer trailing-checksum encoding.
            .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
            .response_checksum_validation(ResponseChecksumValidation::WhenRequired);
        if let Some(endpoint) = endpoint {
            config = config.endpoint_url(endpoint);
        }
        let encryption = settings.encryption.as_ref();
        Ok(Self {
            client: Client::from_conf(config.build()),
            target,
            unsigned_payload,
            sse: encryption.map(sdk_algorithm),
            sse_kms_key_id: encryption.and_then(|e| e.kms_key_id().map(str::to_owned)),
        })
    }

    /// Where objects go.
    pub fn target(&self) -> &UploadTarget {
        &self.target
    }

    /// Whether the bucket is there and the credentials reach it (`HeadBucket`).
    pub async fn check(&self) -> Result<(), StoreError> {
        self.client
            .head_bucket()
            .bucket(self.target.bucket())
            .send()
            .await
            .map(drop)
            .map_err(|e| sorted("HeadBucket", e))
    }

    /// Creates the bucket (tests, and first-time setups of a local store).
    pub async fn create_bucket(&self) -> Result<(), StoreError> {
        self.client
            .create_bucket()
            .bucket(self.target.bucket())
            .send()
            .await
            .map(drop)
            .map_err(|e| sorted("CreateBucket", e))
    }

    /// Stores the file at `path` under `key`, as it is now; its length in bytes.
    pub async fn put_file(&self, key: &str, path: &Path) -> Result<u64, StoreError> {
        let len = tokio::fs::metadata(path)
            .await
            .map_err(|e| StoreError::file(path, e))?
            .len();
        if len <= PART_SIZE {
            let body = file_range(path, 0, len).await?;
            let put = self
                .client
                .put_object()
                .bucket(self.target.bucket())
                .key(key)
                .content_length(len as i64)
                .set_server_side_encryption(self.sse.clone())
                .set_ssekms_key_id(self.sse_kms_key_id.clone())
                .body(body)
                .customize();
            let put = if self.unsigned_payload {
                put.disable_payload_signing()
            } else {
                put
            };
            put.send().await.map_err(|e| sorted("PutObject", e))?;
        } else {
            self.put_parts(key, path, len).await?;
        }
        Ok(len)
    }

    /// A multipart upload of `len` bytes of `path`; aborted if a part fails, so that the
    /// store keeps no orphaned parts of an attempt that is going to be retried whole.
    async fn put_parts(&self, key: &str, path: &Path, len: u64) -> Result<(), StoreError> {
        let bucket = self.target.bucket();
        let created = self
            .client
            .create_multipart_upload()
            .bucket(bucket)
            .key(key)
            .set_server_side_encryption(self.sse.clone())
            .set_ssekms_key_id(self.sse_kms_key_id.clone())
            .send()
            .await
            .map_err(|e| sorted("CreateMultipartUpload", e))?;
        let upload_id = created.upload_id().unwrap_or_default().to_owned();
        match self.send_parts(key, path, len, &upload_id).await {
            Ok(parts) => self
                .client
                .complete_multipart_upload()
                .bucket(bucket)
                .key(key)
                .upload_id(&upload_id)
                .multipart_upload(
                    CompletedMultipartUpload::builder()
                        .set_parts(Some(parts))
                        .build(),
                )
                .send()
                .await
                .map(drop)
                .map_err(|e| sorted("CompleteMultipartUpload", e)),
            Err(e) => {
                // Best effort: a store that is down now will not take the abort either; its
                // lifecycle rule for incomplete uploads (docs) removes those parts.
                let _ = self
                    .client
                    .abort_multipart_upload()
                    .bucket(bucket)
                    .key(key)
                    .upload_id(&upload_id)
                    .send()
                    .await;
                Err(e)
            }
        }
    }

    /// Sends the parts one after another (one file's upload holds one part's request at a
    /// time; the uploader runs a few files at once).
    async fn send_parts(
        &self,
        key: &str,
        path: &Path,
        len: u64,
        upload_id: &str,
    ) -> Result<Vec<CompletedPart>, StoreError> {
        let mut parts = Vec::with_capacity(len.div_ceil(PART_SIZE) as usize);
        let mut offset = 0;
        while offset < len {
            let size = PART_SIZE.min(len - offset);
            let number = parts.len() as i32 + 1;
            let part = self
                .client
                .upload_part()
                .bucket(self.target.bucket())
                .key(key)
                .upload_id(upload_id)
                .part_number(number)
                .content_length(size as i64)
                .body(file_range(path, offset, size).await?)
                .customize();
            let part = if self.unsigned_payload {
                part.disable_payload_signing()
            } else {
                part
            };
            let sent = part.send().await.map_err(|e| sorted("UploadPart", e))?;
            parts.push(
                CompletedPart::builder()
                    .part_number(number)
                    .set_e_tag(sent.e_tag().map(str::to_owned))
                    .build(),
            );
            offset += size;
        }
        Ok(parts)
    }

    /// The keys under `prefix` and their sizes (tests and operators' checks).
    pub async fn list(&self, prefix: &str) -> Result<Vec<(String, u64)>, StoreError> {
        let mut found = Vec::new();
        let mut pages = self
            .client
            .list_objects_v2()
            .bucket(self.target.bucket())
            .prefix(prefix)
            .into_paginator()
            .send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| sorted("ListObjectsV2", e))?;
            for o in page.contents() {
                let size = o.size().unwrap_or(0).max(0) as u64;
                found.push((o.key().unwrap_or_default().to_owned(), size));
            }
        }
        Ok(found)
    }

    /// Deletes the object at `key` (tests and benchmarks that empty their store).
    pub async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.client
            .delete_object()
            .bucket(self.target.bucket())
            .key(key)
            .send()
            .await
            .map(drop)
            .map_err(|e| sorted("DeleteObject", e))
    }

    /// The server-side encryption the store reports for the object at `key` (`HeadObject`):
    /// S3's algorithm and the KMS key, as the store names them (tests and operators' checks).
    pub async fn encryption_of(
        &self,
        key: &str,
    ) -> Result<(Option<String>, Option<String>), StoreError> {
        let head = self
            .client
            .head_object()
            .bucket(self.target.bucket())
            .key(key)
            .send()
            .await
            .map_err(|e| sorted("HeadObject", e))?;
        Ok((
            head.server_side_encryption().map(|s| s.as_str().to_owned()),
            head.ssekms_key_id().map(str::to_owned),
        ))
    }

    /// The whole object at `key` (tests: objects they compare with their spool files).
    pub async fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        let got = self
            .client
            .get_object()
            .bucket(self.target.bucket())
            .key(key)
            .send()
            .await
            .map_err(|e| sorted("GetObject", e))?;
        let body = got.body.collect().await.map_err(|e| StoreError {
            reason: FailureReason::Connect,
            message: format!("GetObject {key}: {e}"),
        })?;
        Ok(body.into_bytes().to_vec())
    }
}

impl Store {
    /// Sends the object at `key` into `to` chunk by chunk, as fast as `to` takes them (a
    /// reader of a recording that is no longer in the spool); stops early if `to` closes.
    pub async fn send_object(
        &self,
        key: &str,
        to: tokio::sync::mpsc::Sender<bytes::Bytes>,
    ) -> Result<(), StoreError> {
        let mut got = self
            .client
            .get_object()
            .bucket(self.target.bucket())
            .key(key)
            .send()
            .await
            .map_err(|e| sorted("GetObject", e))?;
        while let Some(chunk) = got.body.next().await {
            let chunk = chunk.map_err(|e| StoreError {
                reason: FailureReason::Connect,
                message: format!("GetObject {key}: {e}"),
            })?;
            if to.send(chunk).await.is_err() {
                break;
            }
        }
        Ok(())
    }
}

/// How much of a file one read takes. Each read is a trip to tokio's blocking pool: the SDK's
/// 64 KiB made one every 64 KiB, whose hand-overs cost more than the reads (BENCHMARKS.md,
/// "Uploading recordings"). At most [`super::uploader::CONCURRENT_UPLOADS`] are read at once.
const READ_BUFFER: usize = 512 * 1024;

/// `len` bytes of `path` from `offset`, read as the SDK sends them (and again on its retry),
/// [`READ_BUFFER`] at a time.
async fn file_range(path: &Path, offset: u64, len: u64) -> Result<ByteStream, StoreError> {
    ByteStream::read_from()
        .path(path)
        .buffer_size(READ_BUFFER)
        .offset(offset)
        .length(Length::Exact(len))
        .build()
        .await
        .map_err(|e| StoreError::file(path, e))
}

/// The SDK's name for the algorithm of `encryption`.
fn sdk_algorithm(encryption: &Encryption) -> ServerSideEncryption {
    match encryption {
        Encryption::S3Managed => ServerSideEncryption::Aes256,
        Encryption::Kms(_) => ServerSideEncryption::AwsKms,
        Encryption::DualLayerKms(_) => ServerSideEncryption::AwsKmsDsse,
    }
}

/// The endpoint, if it is an http(s) URL; plain http only to a loopback address.
fn checked_endpoint(endpoint: &str) -> Result<String, StoreSetupError> {
    let url = url::Url::parse(endpoint).map_err(|_| StoreSetupError::Endpoint(endpoint.into()))?;
    match url.scheme() {
        "https" => Ok(endpoint.trim_end_matches('/').to_owned()),
        "http" if is_loopback(&url) => Ok(endpoint.trim_end_matches('/').to_owned()),
        "http" => Err(StoreSetupError::PlainHttp(endpoint.into())),
        _ => Err(StoreSetupError::Endpoint(endpoint.into())),
    }
}

fn is_loopback(url: &url::Url) -> bool {
    match url.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        None => false,
    }
}

/// The SDK's HTTP client on rustls with `ring`, trusting the system's roots and `ca_file`.
fn http_client(ca_file: Option<&Path>) -> Result<SharedHttpClient, StoreSetupError> {
    let mut trust = tls::TrustStore::default();
    if let Some(path) = ca_file {
        let pem = std::fs::read(path).map_err(|e| StoreSetupError::Ca {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        trust = trust.with_pem_certificate(pem);
    }
    let context = tls::TlsContext::builder()
        .with_trust_store(trust)
        .build()
        .map_err(|e| StoreSetupError::Ca {
            path: ca_file.map(Path::to_owned).unwrap_or_default(),
            reason: e.to_string(),
        })?;
    Ok(aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(
            tls::rustls_provider::CryptoMode::Ring,
        ))
        .tls_context(context)
        .build_https())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sdk_sends_each_algorithm_under_s3_s_name() {
        for e in [
            Encryption::S3Managed,
            Encryption::Kms(None),
            Encryption::DualLayerKms(Some("k".into())),
        ] {
            assert_eq!(sdk_algorithm(&e).as_str(), e.algorithm());
        }
    }

    #[test]
    fn endpoints_are_https_or_loopback_http() {
        assert_eq!(
            checked_endpoint("https://minio.example:9000/").unwrap(),
            "https://minio.example:9000"
        );
        for ok in [
            "http://127.0.0.1:9000",
            "http://[::1]:9000",
            "http://localhost:9000",
        ] {
            assert!(checked_endpoint(ok).is_ok(), "{ok}");
        }
        assert!(matches!(
            checked_endpoint("http://minio.example:9000"),
            Err(StoreSetupError::PlainHttp(_))
        ));
        for bad in ["minio.example:9000", "ftp://minio.example", "not a url"] {
            assert!(
                matches!(checked_endpoint(bad), Err(StoreSetupError::Endpoint(_))),
                "{bad}"
            );
        }
    }
}
