//! The upstream API server (or kubelet): where it is, how to reach it over TCP or TLS, and a
//! pooled client for plain requests. Upgrades always go over fresh HTTP/1.1 connections (ALPN
//! `http/1.1` only): SPDY and the relayed WebSocket protocols are HTTP/1.1 upgrades.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;
use tracing::warn;

use super::client_cert::ReloadingClientCert;
pub use super::error::UpstreamError;
pub(crate) use super::pem::read_certs;
pub use super::pem::Pem;
use crate::proxy::wire::body::ProxyBody;
use crate::proxy::wire::maybe_tls::MaybeTls;

/// The pooled client for plain (non-upgrade) requests.
pub type HttpClient = Client<UpstreamConnector, ProxyBody>;

/// TLS options for the upstream connection.
#[derive(Debug, Clone, Default)]
pub struct UpstreamTls {
    /// CA bundle; the web PKI roots when absent.
    pub ca: Option<Pem>,
    /// Accept any certificate (insecure; warned about loudly).
    pub insecure_skip_verify: bool,
    /// Client certificate chain and key presented to the upstream.
    pub client_cert: Option<(Pem, Pem)>,
    /// Name to verify instead of the URL's host.
    pub server_name: Option<String>,
}

/// Where and how to reach the upstream.
#[derive(Clone)]
pub struct Upstream {
    host: String,
    port: u16,
    base_path: String,
    /// TLS with ALPN `http/1.1` for upgrades, if the URL is https.
    tls: Option<(TlsConnector, ServerName<'static>)>,
    /// TLS with ALPN `h2` and `http/1.1` for the pooled client's plain requests.
    pooled_tls: Option<TlsConnector>,
    /// The proxy's own client certificate, if it presents one.
    client_cert: Option<Arc<ReloadingClientCert>>,
    dial_timeout: Duration,
    /// TCP keepalive idle time on every connection (`--tcp-keepalive`).
    tcp_keepalive: Option<Duration>,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("base_path", &self.base_path)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl std::fmt::Display for Upstream {
    /// The upstream as a URL (`https://10.0.0.1:6443/base`), for logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        write!(f, "{scheme}://{}{}", self.authority(), self.base_path)
    }
}

impl Upstream {
    /// Parses `http://host[:port][/base]` or `https://…`.
    pub fn from_url(url: &str, tls: UpstreamTls) -> Result<Upstream, UpstreamError> {
        let bad = |why: &str| UpstreamError::InvalidUrl(url.to_owned(), why.to_owned());
        let parsed = url::Url::parse(url).map_err(|e| bad(&e.to_string()))?;
        let https = match parsed.scheme() {
            "http" => false,
            "https" => true,
            _ => return Err(bad("scheme must be http or https")),
        };
        let host = parsed.host_str().ok_or_else(|| bad("no host"))?.to_owned();
        let port = parsed
            .port_or_known_default()
            .ok_or_else(|| bad("no port"))?;
        let base_path = parsed.path().trim_end_matches('/').to_owned();
        let tls = if https {
            let name = tls.server_name.clone().unwrap_or_else(|| {
                host.trim_start_matches('[')
                    .trim_end_matches(']')
                    .to_owned()
            });
            let server_name = ServerName::try_from(name.clone())
                .map_err(|e| UpstreamError::TlsConfig(format!("server name {name:?}: {e}")))?;
            let (config, client_cert) = client_config(&tls, vec![b"http/1.1".to_vec()])?;
            let mut pooled = config.clone();
            pooled.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
            (
                Some((TlsConnector::from(Arc::new(config)), server_name)),
                Some(TlsConnector::from(Arc::new(pooled))),
                client_cert,
            )
        } else {
            (None, None, None)
        };
        let (tls, pooled_tls, client_cert) = tls;
        Ok(Upstream {
            host,
            port,
            base_path,
            tls,
            pooled_tls,
            client_cert,
            dial_timeout: Duration::from_secs(10),
            tcp_keepalive: None,
        })
    }

    /// Turns TCP keepalive on for every connection to the upstream (`None`: off).
    pub fn with_tcp_keepalive(mut self, idle: Option<Duration>) -> Self {
        self.tcp_keepalive = idle;
        self
    }

    /// Sets how long dialling (TCP and TLS) may take.
    pub fn with_dial_timeout(mut self, timeout: Duration) -> Self {
        self.dial_timeout = timeout;
        self
    }

    /// The `Host` header value.
    pub fn authority(&self) -> String {
        let default = if self.tls.is_some() { 443 } else { 80 };
        if self.port == default {
            self.host.clone()
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// `path_and_query` below the upstream's base path.
    pub fn join_path(&self, path_and_query: &str) -> String {
        format!("{}{}", self.base_path, path_and_query)
    }

    /// Whether the upstream is reached over TLS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The upstream URI for a request path (for the pooled client).
    pub fn uri(&self, path_and_query: &str) -> Result<Uri, http::Error> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        Uri::builder()
            .scheme(scheme)
            .authority(self.authority())
            .path_and_query(self.join_path(path_and_query))
            .build()
    }

    /// A fresh connection for an upgrade (TCP, then TLS with ALPN `http/1.1` if https).
    pub async fn connect_raw(&self) -> Result<UpstreamIo, UpstreamError> {
        self.connect(self.tls.as_ref().map(|(c, _)| c)).await
    }

    /// A fresh connection for the pooled client: HTTP/2 when the upstream offers it.
    async fn connect_pooled(&self) -> Result<UpstreamIo, UpstreamError> {
        self.connect(self.pooled_tls.as_ref()).await
    }

    async fn connect(&self, connector: Option<&TlsConnector>) -> Result<UpstreamIo, UpstreamError> {
        let addr = format!("{}:{}", self.host, self.port);
        let dial = async {
            let host = self.host.trim_start_matches('[').trim_end_matches(']');
            let tcp = TcpStream::connect((host, self.port))
                .await
                .map_err(|source| UpstreamError::Dial {
                    addr: addr.clone(),
                    source,
                })?;
            let _ = tcp.set_nodelay(true);
            if let Some(idle) = self.tcp_keepalive {
                crate::proxy::wire::tcp_keepalive::enable(&tcp, idle);
            }
            match (connector, &self.tls) {
                (Some(connector), Some((_, name))) => connector
                    .connect(name.clone(), tcp)
                    .await
                    .map(|s| UpstreamIo::Tls(Box::new(s)))
                    .map_err(|source| UpstreamError::Tls {
                        addr: addr.clone(),
                        source,
                    }),
                _ => Ok(UpstreamIo::Plain(tcp)),
            }
        };
        tokio::time::timeout(self.dial_timeout, dial)
            .await
            .map_err(|_| UpstreamError::Timeout(addr.clone()))?
    }

    /// A pooled client for plain requests to this upstream.
    pub fn http_client(&self) -> HttpClient {
        Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .build(UpstreamConnector {
                upstream: Arc::new(self.clone()),
            })
    }

    /// A pooled client that is replaced, with its connections, when the proxy's client
    /// certificate is: a busy HTTP/2 connection would otherwise present the old certificate
    /// for as long as it lives (and the API server checks a certificate's validity on every
    /// request).
    pub fn pooled_client(&self) -> PooledClient {
        PooledClient {
            current: std::sync::RwLock::new((self.credentials_generation(), self.http_client())),
            upstream: self.clone(),
        }
    }

    /// Changes whenever the proxy's client certificate was replaced (0 without one).
    fn credentials_generation(&self) -> u64 {
        self.client_cert.as_ref().map_or(0, |c| c.generation())
    }
}

/// The pooled client of [`Upstream::pooled_client`].
#[derive(Debug)]
pub struct PooledClient {
    upstream: Upstream,
    /// The client, and the certificate generation its connections were made with.
    current: std::sync::RwLock<(u64, HttpClient)>,
}

impl PooledClient {
    /// The client to send a request with (a cheap handle on the shared pool).
    pub fn get(&self) -> HttpClient {
        let generation = self.upstream.credentials_generation();
        {
            // Locks are held for these few lines only, never across an await.
            let current = self.current.read().unwrap_or_else(|e| e.into_inner());
            if current.0 == generation {
                return current.1.clone();
            }
        }
        let mut current = self.current.write().unwrap_or_else(|e| e.into_inner());
        if current.0 != generation {
            // Requests in flight finish on the old connections, which close when they are done.
            *current = (generation, self.upstream.http_client());
        }
        current.1.clone()
    }
}

/// Builds the rustls client configuration (ring provider, chosen explicitly), and the reloading
/// client certificate in it, if any.
fn client_config(
    tls: &UpstreamTls,
    alpn: Vec<Vec<u8>>,
) -> Result<(rustls::ClientConfig, Option<Arc<ReloadingClientCert>>), UpstreamError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| UpstreamError::TlsConfig(e.to_string()))?;
    let builder = if tls.insecure_skip_verify {
        warn!("upstream TLS verification is DISABLED (--upstream-insecure-skip-tls-verify): anyone on the path can impersonate the API server");
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(insecure::AcceptAny(provider)))
    } else {
        let mut roots = rustls::RootCertStore::empty();
        match &tls.ca {
            Some(pem) => {
                let certs = read_certs(pem)?;
                for cert in certs {
                    roots.add(cert).map_err(|e| {
                        UpstreamError::TlsConfig(format!("{}: {e}", pem.describe()))
                    })?;
                }
            }
            None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        }
        builder.with_root_certificates(roots)
    };
    let (mut config, client_cert) = match &tls.client_cert {
        Some((cert, key)) => {
            let pair = Arc::new(ReloadingClientCert::new(cert.clone(), key.clone())?);
            let mut config = builder.with_client_cert_resolver(pair.clone());
            // Also the session store: see the module's doc.
            config.resumption = rustls::client::Resumption::store(pair.clone());
            (config, Some(pair))
        }
        None => (builder.with_no_client_auth(), None),
    };
    config.alpn_protocols = alpn;
    Ok((config, client_cert))
}

mod insecure {
    use std::sync::Arc;

    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    use rustls::{DigitallySignedStruct, Error, SignatureScheme};

    /// Accepts any certificate, but still checks handshake signatures.
    #[derive(Debug)]
    pub(super) struct AcceptAny(pub Arc<CryptoProvider>);

    impl ServerCertVerifier for AcceptAny {
        fn verify_server_cert(
            &self,
            _: &CertificateDer<'_>,
            _: &[CertificateDer<'_>],
            _: &ServerName<'_>,
            _: &[u8],
            _: UnixTime,
        ) -> Result<ServerCertVerified, Error> {
            Ok(ServerCertVerified::assertion())
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, Error> {
            verify_tls12_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, Error> {
            verify_tls13_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }
}

/// A connection to the upstream, plain or TLS.
pub type UpstreamIo = MaybeTls<TlsStream<TcpStream>>;

/// Connects the pooled client to the upstream, whatever host the request URI names.
#[derive(Clone, Debug)]
pub struct UpstreamConnector {
    upstream: Arc<Upstream>,
}

/// The pooled client's view of a connection.
pub struct PooledIo(TokioIo<UpstreamIo>);

impl Connection for PooledIo {
    fn connected(&self) -> Connected {
        let h2 = match self.0.inner() {
            UpstreamIo::Tls(tls) => tls.get_ref().1.alpn_protocol() == Some(b"h2"),
            UpstreamIo::Plain(_) => false,
        };
        if h2 {
            Connected::new().negotiated_h2()
        } else {
            Connected::new()
        }
    }
}

impl hyper::rt::Read for PooledIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for PooledIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

impl tower_service::Service<Uri> for UpstreamConnector {
    type Response = PooledIo;
    type Error = UpstreamError;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<PooledIo, UpstreamError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Uri) -> Self::Future {
        let upstream = self.upstream.clone();
        Box::pin(async move { Ok(PooledIo(TokioIo::new(upstream.connect_pooled().await?))) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let u = Upstream::from_url("http://127.0.0.1:6443", UpstreamTls::default()).unwrap();
        assert_eq!(u.authority(), "127.0.0.1:6443");
        assert_eq!(u.join_path("/api?x=1"), "/api?x=1");
        let u = Upstream::from_url("https://k8s.example/base/", UpstreamTls::default()).unwrap();
        assert_eq!(u.authority(), "k8s.example");
        assert_eq!(u.join_path("/api"), "/base/api");
        assert!(u.is_tls());
        assert_eq!(u.to_string(), "https://k8s.example/base");
        assert!(Upstream::from_url("ftp://x", UpstreamTls::default()).is_err());
        assert!(Upstream::from_url("not a url", UpstreamTls::default()).is_err());
    }
}
