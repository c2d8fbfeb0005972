//! The proxy's own client certificate to the upstream (`--upstream-client-cert-file`, the
//! front-proxy certificate, a kubeconfig's `client-certificate`), re-read when its files change
//! so a rotated certificate is used by the next connection without a restart. Connections
//! already open keep the certificate they were made with; the pooled client watches
//! [`ReloadingClientCert::generation`] to replace its own.
//!
//! A resumed TLS session carries the identity of the handshake it resumes, without sending the
//! certificate again, and rustls asks for a certificate only on a full handshake. So the same
//! value is also the connection's session store: every handshake looks there first, which is
//! where the files are checked, and the tickets are forgotten when the certificate changes.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use rustls::client::{
    ClientSessionMemoryCache, ClientSessionStore, ResolvesClientCert, Tls12ClientSessionValue,
    Tls13ClientSessionValue,
};
use rustls::pki_types::ServerName;
use rustls::sign::CertifiedKey;
use rustls::{NamedGroup, SignatureScheme};
use tracing::{info, warn};

use super::error::UpstreamError;
use super::pem::{key_pair, Pem};

/// Checking the files costs two `stat` calls; done at most this often, when a connection is
/// being made.
const CHECK_EVERY: Duration = Duration::from_secs(1);
/// Sessions remembered for resumption (rustls' default).
const SESSIONS: usize = 256;
/// After a new pair is loaded, no session is remembered for this long: a handshake that began
/// with the old pair may still finish, and its ticket would resume the old identity. Longer
/// than any dial timeout in practice (the default is 10 s).
const NO_TICKETS_AFTER_RELOAD: Duration = Duration::from_secs(60);

/// A certificate chain and key from PEM files or inline data; file-backed ones follow changes.
#[derive(Debug)]
pub struct ReloadingClientCert {
    cert: Pem,
    key: Pem,
    state: Mutex<State>,
    check_every: Duration,
    /// Session tickets from handshakes made with the current pair.
    tickets: RwLock<Arc<ClientSessionMemoryCache>>,
    /// How many times the pair was replaced.
    generation: AtomicU64,
}

#[derive(Debug)]
struct State {
    current: Arc<CertifiedKey>,
    /// Modification times of the files the current pair was read from.
    seen: Option<(SystemTime, SystemTime)>,
    checked: Instant,
    /// When the current pair replaced an earlier one.
    reloaded: Option<Instant>,
}

impl ReloadingClientCert {
    /// Reads the pair now: a missing file, bad PEM or a key that does not match the certificate
    /// is an error at start.
    pub fn new(cert: Pem, key: Pem) -> Result<Self, UpstreamError> {
        Self::with_check_interval(cert, key, CHECK_EVERY)
    }

    fn with_check_interval(
        cert: Pem,
        key: Pem,
        check_every: Duration,
    ) -> Result<Self, UpstreamError> {
        let seen = modified(&cert, &key);
        let current = key_pair(&cert, &key)?;
        Ok(ReloadingClientCert {
            cert,
            key,
            state: Mutex::new(State {
                current,
                seen,
                checked: Instant::now(),
                reloaded: None,
            }),
            check_every,
            tickets: RwLock::new(Arc::new(ClientSessionMemoryCache::new(SESSIONS))),
            generation: AtomicU64::new(0),
        })
    }

    /// How many times the pair was replaced so far, after looking for a new one: a pool of
    /// long-lived connections made with an older pair should be replaced.
    pub fn generation(&self) -> u64 {
        self.refresh();
        self.generation.load(Ordering::Acquire)
    }

    /// Re-reads the pair if its files changed since the last look (at most one look per
    /// interval). A pair that fails to load (say the certificate was written before its key)
    /// keeps the previous one, and is tried again at the next look.
    fn refresh(&self) -> Arc<CertifiedKey> {
        // Held only for this synchronous check, never across an await.
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.checked.elapsed() >= self.check_every {
            state.checked = Instant::now();
            let now = modified(&self.cert, &self.key);
            if now.is_some() && now != state.seen {
                match key_pair(&self.cert, &self.key) {
                    Ok(pair) => {
                        state.current = pair;
                        state.seen = now;
                        state.reloaded = Some(Instant::now());
                        *self.tickets.write().unwrap_or_else(|e| e.into_inner()) =
                            Arc::new(ClientSessionMemoryCache::new(SESSIONS));
                        self.generation.fetch_add(1, Ordering::AcqRel);
                        info!(cert = %self.cert.describe(), "upstream client certificate reloaded");
                    }
                    Err(e) => warn!(error = %e, "upstream client certificate not reloaded"),
                }
            }
        }
        state.current.clone()
    }

    /// The tickets of the current pair, after looking for a new one.
    fn tickets(&self) -> Arc<ClientSessionMemoryCache> {
        self.refresh();
        self.tickets
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Whether a session a handshake just brought may be kept: not right after a reload, when
    /// it may come from a handshake made with the old pair.
    fn keeps_sessions(&self) -> bool {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state
            .reloaded
            .is_none_or(|at| at.elapsed() >= NO_TICKETS_AFTER_RELOAD)
    }

    /// The tickets of the current pair, for storing what a handshake brought.
    fn current_tickets(&self) -> Arc<ClientSessionMemoryCache> {
        self.tickets
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl ResolvesClientCert for ReloadingClientCert {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.refresh())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// Lookups happen at the start of every handshake, so they look for a new pair first.
impl ClientSessionStore for ReloadingClientCert {
    fn set_kx_hint(&self, server_name: ServerName<'static>, group: NamedGroup) {
        self.current_tickets().set_kx_hint(server_name, group)
    }

    fn kx_hint(&self, server_name: &ServerName<'_>) -> Option<NamedGroup> {
        self.tickets().kx_hint(server_name)
    }

    fn set_tls12_session(&self, server_name: ServerName<'static>, value: Tls12ClientSessionValue) {
        if self.keeps_sessions() {
            self.current_tickets().set_tls12_session(server_name, value)
        }
    }

    fn tls12_session(&self, server_name: &ServerName<'_>) -> Option<Tls12ClientSessionValue> {
        self.tickets().tls12_session(server_name)
    }

    fn remove_tls12_session(&self, server_name: &ServerName<'static>) {
        self.current_tickets().remove_tls12_session(server_name)
    }

    fn insert_tls13_ticket(
        &self,
        server_name: ServerName<'static>,
        value: Tls13ClientSessionValue,
    ) {
        if self.keeps_sessions() {
            self.current_tickets()
                .insert_tls13_ticket(server_name, value)
        }
    }

    fn take_tls13_ticket(
        &self,
        server_name: &ServerName<'static>,
    ) -> Option<Tls13ClientSessionValue> {
        self.tickets().take_tls13_ticket(server_name)
    }
}

fn path(pem: &Pem) -> Option<&PathBuf> {
    match pem {
        Pem::File(p) => Some(p),
        Pem::Data(_) => None,
    }
}

/// Modification times of both files; `None` for inline data (which never changes) or a file
/// that cannot be read right now.
fn modified(cert: &Pem, key: &Pem) -> Option<(SystemTime, SystemTime)> {
    let m = |p: &PathBuf| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    Some((m(path(cert)?)?, m(path(key)?)?))
}

#[cfg(test)]
mod tests {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;

    use super::*;

    fn leaf(cn: &str) -> (String, String) {
        let mut params = rcgen::CertificateParams::new(vec![]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn write(dir: &std::path::Path, (cert, key): &(String, String)) -> (Pem, Pem) {
        let (c, k) = (dir.join("client.crt"), dir.join("client.key"));
        std::fs::write(&c, cert).unwrap();
        std::fs::write(&k, key).unwrap();
        (Pem::File(c), Pem::File(k))
    }

    fn der(pem: &str) -> Vec<u8> {
        CertificateDer::from_pem_slice(pem.as_bytes())
            .unwrap()
            .to_vec()
    }

    fn presented(r: &ReloadingClientCert) -> Vec<u8> {
        r.resolve(&[], &[]).unwrap().cert[0].to_vec()
    }

    /// Moves both files' modification times, as a rotation at a later second would.
    fn touch_later(cert: &Pem, key: &Pem, secs: u64) {
        for p in [path(cert).unwrap(), path(key).unwrap()] {
            let f = std::fs::File::options().write(true).open(p).unwrap();
            f.set_modified(SystemTime::now() + Duration::from_secs(secs))
                .unwrap();
        }
    }

    #[test]
    fn a_rotated_pair_is_presented_by_the_next_connection() {
        let dir = tempfile::tempdir().unwrap();
        let first = leaf("proxy-a");
        let (cert, key) = write(dir.path(), &first);
        let r = ReloadingClientCert::with_check_interval(cert.clone(), key.clone(), Duration::ZERO)
            .unwrap();
        assert_eq!(presented(&r), der(&first.0));
        assert_eq!(r.generation(), 0);
        let second = leaf("proxy-b");
        write(dir.path(), &second);
        touch_later(&cert, &key, 5);
        assert_eq!(presented(&r), der(&second.0));
        assert_eq!(r.generation(), 1);
    }

    #[test]
    fn a_half_written_rotation_keeps_the_old_pair_until_it_is_complete() {
        let dir = tempfile::tempdir().unwrap();
        let first = leaf("proxy-a");
        let (cert, key) = write(dir.path(), &first);
        let r = ReloadingClientCert::with_check_interval(cert.clone(), key.clone(), Duration::ZERO)
            .unwrap();
        // The new certificate is there, its key not yet: they do not match.
        let second = leaf("proxy-b");
        std::fs::write(path(&cert).unwrap(), &second.0).unwrap();
        touch_later(&cert, &key, 5);
        assert_eq!(presented(&r), der(&first.0));
        std::fs::write(path(&key).unwrap(), &second.1).unwrap();
        touch_later(&cert, &key, 10);
        assert_eq!(presented(&r), der(&second.0));
    }

    #[test]
    fn a_handshake_looking_for_a_ticket_finds_the_rotation_and_none_of_the_old_tickets() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = write(dir.path(), &leaf("proxy-a"));
        let r = ReloadingClientCert::with_check_interval(cert.clone(), key.clone(), Duration::ZERO)
            .unwrap();
        assert!(r.keeps_sessions());
        let name = ServerName::try_from("cluster.example").unwrap();
        r.set_kx_hint(name.clone(), NamedGroup::X25519);
        assert_eq!(r.kx_hint(&name), Some(NamedGroup::X25519));
        let second = leaf("proxy-b");
        write(dir.path(), &second);
        touch_later(&cert, &key, 5);
        assert_eq!(r.kx_hint(&name), None, "remembered from the old pair");
        assert!(
            !r.keeps_sessions(),
            "a session now may be from the old pair"
        );
        let state = r.state.lock().unwrap();
        assert_eq!(state.current.cert[0].to_vec(), der(&second.0));
    }

    #[test]
    fn files_are_checked_at_most_once_per_interval() {
        let dir = tempfile::tempdir().unwrap();
        let first = leaf("proxy-a");
        let (cert, key) = write(dir.path(), &first);
        let r = ReloadingClientCert::with_check_interval(
            cert.clone(),
            key.clone(),
            Duration::from_secs(3600),
        )
        .unwrap();
        write(dir.path(), &leaf("proxy-b"));
        touch_later(&cert, &key, 5);
        assert_eq!(presented(&r), der(&first.0));
    }

    #[test]
    fn inline_data_and_bad_pairs() {
        let first = leaf("proxy-a");
        let r = ReloadingClientCert::new(
            Pem::Data(first.0.clone().into_bytes()),
            Pem::Data(first.1.clone().into_bytes()),
        )
        .unwrap();
        assert_eq!(presented(&r), der(&first.0));
        let other = leaf("proxy-b");
        let mismatched = ReloadingClientCert::new(
            Pem::Data(first.0.into_bytes()),
            Pem::Data(other.1.into_bytes()),
        );
        assert!(mismatched.is_err());
        let missing = ReloadingClientCert::new(
            Pem::File("/nonexistent/client.crt".into()),
            Pem::File("/nonexistent/client.key".into()),
        );
        assert!(matches!(missing, Err(UpstreamError::File { .. })));
    }
}
