//! The house's one TLS provider: rustls on `ring`. The S3 client's default features would
//! bring aws-lc-rs (and its C build), and other crates OpenSSL or native-tls; a feature
//! change anywhere in the tree must not bring them back unnoticed. Reads Cargo.lock.

const FORBIDDEN: [&str; 5] = [
    "aws-lc-rs",
    "aws-lc-sys",
    "aws-lc-fips-sys",
    "openssl-sys",
    "native-tls",
];

#[test]
fn no_second_tls_provider_is_in_the_lock_file() {
    let lock = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.lock"))
        .expect("Cargo.lock");
    let packages: Vec<&str> = lock
        .lines()
        .filter_map(|l| l.strip_prefix("name = \""))
        .filter_map(|l| l.strip_suffix('"'))
        .collect();
    assert!(packages.contains(&"ring"), "ring is the provider");
    assert!(packages.contains(&"aws-sdk-s3"), "the S3 client is locked");
    for name in FORBIDDEN {
        assert!(!packages.contains(&name), "{name} is in Cargo.lock");
    }
}
