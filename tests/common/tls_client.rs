//! A raw TLS client for the proxy's listener: the ALPN offered, an optional client
//! certificate, and the stream itself, for tests that speak HTTP by hand.

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use super::pki::Leaf;

/// A TLS session with `addr` (127.0.0.1), trusting `ca_pem`, offering `alpn`, presenting
/// `client` if given.
pub async fn connect(
    addr: std::net::SocketAddr,
    ca_pem: &str,
    client: Option<&Leaf>,
    alpn: &[&[u8]],
) -> std::io::Result<TlsStream<TcpStream>> {
    connect_as(addr, "127.0.0.1", ca_pem, client, alpn).await
}

/// [`connect`], asking for (SNI) and verifying the certificate of `server_name`.
pub async fn connect_as(
    addr: std::net::SocketAddr,
    server_name: &str,
    ca_pem: &str,
    client: Option<&Leaf>,
    alpn: &[&[u8]],
) -> std::io::Result<TlsStream<TcpStream>> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut config = match client {
        Some(leaf) => {
            let chain: Vec<_> = CertificateDer::pem_slice_iter(leaf.cert_pem.as_bytes())
                .map(Result::unwrap)
                .collect();
            let key = PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let name = ServerName::try_from(server_name.to_owned()).unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
}

/// One HTTP/1.1 request over TLS, the whole answer as text, or `Err` if the handshake fails.
pub async fn raw_https(
    addr: std::net::SocketAddr,
    ca_pem: &str,
    client: Option<&Leaf>,
    request: &str,
) -> std::io::Result<String> {
    let mut tls = connect(addr, ca_pem, client, &[b"http/1.1"]).await?;
    tls.write_all(request.as_bytes()).await?;
    let mut answer = Vec::new();
    tls.read_to_end(&mut answer).await?;
    Ok(String::from_utf8_lossy(&answer).into_owned())
}
