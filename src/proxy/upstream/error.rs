//! Why the upstream could not be described or reached: its own file, because both the upstream
//! connector and the reloading client certificate report it.

use std::io;
use std::path::PathBuf;

/// Why the upstream could not be described or reached.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("invalid upstream URL {0:?}: {1}")]
    InvalidUrl(String, String),
    #[error("cannot read {path}: {source}")]
    File { path: PathBuf, source: io::Error },
    #[error("invalid TLS configuration: {0}")]
    TlsConfig(String),
    #[error("cannot connect to {addr}: {source}")]
    Dial { addr: String, source: io::Error },
    #[error("timed out connecting to {0}")]
    Timeout(String),
    #[error("TLS handshake with {addr} failed: {source}")]
    Tls { addr: String, source: io::Error },
}
