//! Server-side encryption of every object the proxy writes (`--s3-sse`,
//! `--s3-sse-kms-key-id`): a security team can require it of the proxy instead of trusting the
//! bucket's default. Only the flags' meaning lives here; `store.rs` turns it into the SDK's
//! request fields.

/// `--s3-sse`: the server-side encryption the store applies to each object, as S3 names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SseAlgorithm {
    /// SSE-S3: keys the store manages.
    #[value(name = "AES256")]
    Aes256,
    /// SSE-KMS: a KMS key, `--s3-sse-kms-key-id`'s or the account's default for S3.
    #[value(name = "aws:kms")]
    AwsKms,
    /// DSSE-KMS: two layers of encryption, under a KMS key as with `aws:kms`.
    #[value(name = "aws:kms:dsse")]
    AwsKmsDsse,
}

/// The server-side encryption asked of the store for each object: one of S3's three, with the
/// KMS key only where a KMS key means something (the flags' other combinations are refused).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Encryption {
    /// SSE-S3 (`AES256`).
    S3Managed,
    /// SSE-KMS (`aws:kms`) under this key; `None`: the account's default key for S3.
    Kms(Option<String>),
    /// DSSE-KMS (`aws:kms:dsse`) under this key; `None`: the account's default key for S3.
    DualLayerKms(Option<String>),
}

/// Why `--s3-sse` and `--s3-sse-kms-key-id` do not go together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncryptionError {
    #[error("--s3-sse-kms-key-id needs --s3-sse aws:kms or aws:kms:dsse")]
    KeyWithoutSse,
    #[error(
        "--s3-sse-kms-key-id names a KMS key, but --s3-sse AES256 uses keys the store manages \
         (use --s3-sse aws:kms or aws:kms:dsse for a KMS key)"
    )]
    KeyWithAes256,
    #[error("--s3-sse-kms-key-id is empty")]
    EmptyKey,
}

impl Encryption {
    /// The encryption the flags ask for; `None`: the bucket's default (no flag given).
    pub fn from_flags(
        algorithm: Option<SseAlgorithm>,
        kms_key_id: Option<&str>,
    ) -> Result<Option<Self>, EncryptionError> {
        // Said before the combination: an empty key id is a mistake whatever comes with it
        // (an unset variable in a manifest), and S3 would take it as "the default key".
        let key = match kms_key_id.map(str::trim) {
            Some("") => return Err(EncryptionError::EmptyKey),
            key => key.map(str::to_owned),
        };
        Ok(match (algorithm, key) {
            (None, None) => None,
            (None, Some(_)) => return Err(EncryptionError::KeyWithoutSse),
            (Some(SseAlgorithm::Aes256), Some(_)) => return Err(EncryptionError::KeyWithAes256),
            (Some(SseAlgorithm::Aes256), None) => Some(Self::S3Managed),
            (Some(SseAlgorithm::AwsKms), key) => Some(Self::Kms(key)),
            (Some(SseAlgorithm::AwsKmsDsse), key) => Some(Self::DualLayerKms(key)),
        })
    }

    /// S3's name of the algorithm (`x-amz-server-side-encryption`).
    pub fn algorithm(&self) -> &'static str {
        match self {
            Self::S3Managed => "AES256",
            Self::Kms(_) => "aws:kms",
            Self::DualLayerKms(_) => "aws:kms:dsse",
        }
    }

    /// The KMS key named, if any (`x-amz-server-side-encryption-aws-kms-key-id`).
    pub fn kms_key_id(&self) -> Option<&str> {
        match self {
            Self::S3Managed => None,
            Self::Kms(key) | Self::DualLayerKms(key) => key.as_deref(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use SseAlgorithm::*;

    #[test]
    fn each_algorithm_alone_is_taken() {
        assert_eq!(Encryption::from_flags(None, None), Ok(None));
        assert_eq!(
            Encryption::from_flags(Some(Aes256), None),
            Ok(Some(Encryption::S3Managed))
        );
        assert_eq!(
            Encryption::from_flags(Some(AwsKms), None),
            Ok(Some(Encryption::Kms(None)))
        );
        assert_eq!(
            Encryption::from_flags(Some(AwsKmsDsse), None),
            Ok(Some(Encryption::DualLayerKms(None)))
        );
    }

    #[test]
    fn a_kms_key_goes_with_the_kms_algorithms_only() {
        let arn = "arn:aws:kms:eu-west-1:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab";
        let kms = Encryption::from_flags(Some(AwsKms), Some(arn))
            .unwrap()
            .unwrap();
        assert_eq!(kms, Encryption::Kms(Some(arn.into())));
        assert_eq!((kms.algorithm(), kms.kms_key_id()), ("aws:kms", Some(arn)));
        let dsse = Encryption::from_flags(Some(AwsKmsDsse), Some(" alias/evidence "))
            .unwrap()
            .unwrap();
        assert_eq!(
            (dsse.algorithm(), dsse.kms_key_id()),
            ("aws:kms:dsse", Some("alias/evidence"))
        );
        assert_eq!(
            Encryption::from_flags(Some(Aes256), Some(arn)),
            Err(EncryptionError::KeyWithAes256)
        );
        assert_eq!(
            Encryption::from_flags(None, Some(arn)),
            Err(EncryptionError::KeyWithoutSse)
        );
        for empty in ["", "  "] {
            assert_eq!(
                Encryption::from_flags(Some(AwsKms), Some(empty)),
                Err(EncryptionError::EmptyKey),
                "{empty:?}"
            );
        }
    }

    #[test]
    fn s3_managed_names_no_key() {
        let aes = Encryption::S3Managed;
        assert_eq!((aes.algorithm(), aes.kms_key_id()), ("AES256", None));
    }
}
