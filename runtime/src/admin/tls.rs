//! HTTPS for the admin server under `--metrics-auth`: a bearer token must
//! never cross the pod network in clear text.
//!
//! The certificate is either a mounted `kubernetes.io/tls` Secret (PEM
//! files, re-read when they change, so cert-manager's renewals take effect
//! without a restart) or, without one, self-signed at start: enough for a
//! scraper that checks identity by token and skips server verification, as
//! Prometheus does for pod targets with `insecureSkipVerify`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use crate::error::chain;

/// A client has this long to finish its handshake; a slow or silent one
/// never holds up the others (each handshake runs in its own task).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Mounted certificate files are looked at no more often than this.
const RELOAD_CHECK: Duration = Duration::from_secs(10);
/// Finished handshakes waiting for the HTTP server to take them.
const ACCEPT_BACKLOG: usize = 64;

/// Where the server's certificate comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CertSource {
    /// PEM files: the certificate chain and its private key.
    Files { cert: PathBuf, key: PathBuf },
    /// A certificate made at start for `names` (host name, `localhost`).
    SelfSigned { names: Vec<String> },
}

/// Why no TLS configuration could be made.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no PEM {what} in {path}")]
    Pem {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("{path} holds no certificate")]
    NoCertificate { path: PathBuf },
    #[error("the certificate and key cannot be used together")]
    Key(#[source] rustls::Error),
    #[error("cannot make a self-signed certificate")]
    SelfSigned(#[source] rcgen::Error),
    #[error("cannot configure TLS")]
    Config(#[source] rustls::Error),
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// The certificate chain and key of PEM files.
fn load_files(
    cert: &Path,
    key: &Path,
    provider: &CryptoProvider,
) -> Result<CertifiedKey, TlsError> {
    let cert_pem = read(cert)?;
    let chain = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsError::Pem {
            what: "certificate",
            path: cert.to_path_buf(),
            source,
        })?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate {
            path: cert.to_path_buf(),
        });
    }
    let key_pem = read(key)?;
    let key_der = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|source| TlsError::Pem {
        what: "private key",
        path: key.to_path_buf(),
        source,
    })?;
    CertifiedKey::from_der(chain, key_der, provider).map_err(TlsError::Key)
}

/// A new self-signed certificate for `names`.
fn self_signed(names: &[String], provider: &CryptoProvider) -> Result<CertifiedKey, TlsError> {
    let made = rcgen::generate_simple_self_signed(names.to_vec()).map_err(TlsError::SelfSigned)?;
    let key = PrivateKeyDer::Pkcs8(made.signing_key.serialize_der().into());
    CertifiedKey::from_der(vec![made.cert.der().clone()], key, provider).map_err(TlsError::Key)
}

/// Modification times of the two files, to notice a renewal.
fn stamps(cert: &Path, key: &Path) -> Option<(SystemTime, SystemTime)> {
    let m = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    Some((m(cert)?, m(key)?))
}

/// Reads the files' modification times, *then* runs `load`. A renewal in
/// between leaves the recorded times older than what was loaded, so the
/// next check loads once more (harmless); the other order could record the
/// renewal's times beside the old certificate and never reload it.
fn stamped<T>(
    cert: &Path,
    key: &Path,
    load: impl FnOnce() -> Result<T, TlsError>,
) -> Result<(T, Option<(SystemTime, SystemTime)>), TlsError> {
    let before = stamps(cert, key);
    Ok((load()?, before))
}

/// Serves the certificate of mounted files, re-reading them when their
/// modification times change (a Secret volume swaps its files atomically).
/// A renewal that cannot be read keeps the previous certificate, with a
/// warning, rather than breaking every scrape.
#[derive(Debug)]
struct Reloading {
    cert: PathBuf,
    key: PathBuf,
    provider: Arc<CryptoProvider>,
    state: Mutex<Loaded>,
}

#[derive(Debug)]
struct Loaded {
    checked: Instant,
    stamps: Option<(SystemTime, SystemTime)>,
    key: Arc<CertifiedKey>,
}

impl Reloading {
    fn refresh(&self, loaded: &mut Loaded) {
        loaded.checked = Instant::now();
        let now = stamps(&self.cert, &self.key);
        if now == loaded.stamps {
            return;
        }
        match load_files(&self.cert, &self.key, &self.provider) {
            Ok(key) => {
                tracing::info!(cert = %self.cert.display(), "metrics TLS certificate reloaded");
                loaded.key = Arc::new(key);
                loaded.stamps = now;
            }
            Err(e) => {
                tracing::warn!(error = %chain(&e), "keeping the previous metrics TLS certificate")
            }
        }
    }
}

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let mut loaded = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if loaded.checked.elapsed() >= RELOAD_CHECK {
            self.refresh(&mut loaded);
        }
        Some(loaded.key.clone())
    }
}

/// The server configuration of `source`: HTTP/1.1 (all the admin server
/// speaks), TLS 1.2 and 1.3 with rustls' safe defaults.
pub fn server_config(source: &CertSource) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = provider();
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Config)?
        .with_no_client_auth();
    let mut config = match source {
        CertSource::Files { cert, key } => {
            let (first, stamps) = stamped(cert, key, || load_files(cert, key, &provider))?;
            builder.with_cert_resolver(Arc::new(Reloading {
                cert: cert.clone(),
                key: key.clone(),
                provider: provider.clone(),
                state: Mutex::new(Loaded {
                    checked: Instant::now(),
                    stamps,
                    key: Arc::new(first),
                }),
            }))
        }
        CertSource::SelfSigned { names } => {
            let key = self_signed(names, &provider)?;
            builder.with_cert_resolver(Arc::new(Fixed(Arc::new(key))))
        }
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// One certificate for the life of the process (the self-signed one).
#[derive(Debug)]
struct Fixed(Arc<CertifiedKey>);

impl ResolvesServerCert for Fixed {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}

/// A listener that hands out connections whose TLS handshake is done, for
/// `axum::serve`. Handshakes run concurrently in their own tasks; failed or
/// slow ones are dropped (logged at debug: port scanners and kubelet's TCP
/// checks are not news).
pub struct TlsListener {
    incoming: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: std::io::Result<SocketAddr>,
    acceptor: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for TlsListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsListener")
            .field("local", &self.local)
            .finish_non_exhaustive()
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        // The accept loop owns the port: stop it with the server.
        self.acceptor.abort();
    }
}

impl TlsListener {
    pub fn new(listener: TcpListener, config: Arc<ServerConfig>) -> Self {
        let local = listener.local_addr();
        let (tx, incoming) = mpsc::channel(ACCEPT_BACKLOG);
        let acceptor = TlsAcceptor::from(config);
        let acceptor = tokio::spawn(async move {
            loop {
                let (tcp, peer) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of file descriptors and the like: wait
                        // instead of spinning, as axum's own loop does.
                        tracing::warn!(error = %e, "admin server cannot accept");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        continue;
                    }
                };
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        Self {
            incoming,
            local,
            acceptor,
        }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.incoming.recv().await {
            Some(conn) => conn,
            // The accept loop only ends when this listener is dropped.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        match &self.local {
            Ok(a) => Ok(*a),
            Err(e) => Err(std::io::Error::new(e.kind(), e.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_pair(dir: &Path) -> (PathBuf, PathBuf, Vec<u8>) {
        let made = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
        std::fs::write(&cert, made.cert.pem()).unwrap();
        std::fs::write(&key, made.signing_key.serialize_pem()).unwrap();
        (cert, key, made.cert.der().to_vec())
    }

    #[test]
    fn a_renewed_certificate_is_served_and_a_broken_renewal_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key, first) = write_pair(dir.path());
        let provider = provider();
        let reloading = Reloading {
            cert: cert.clone(),
            key: key.clone(),
            provider: provider.clone(),
            state: Mutex::new(Loaded {
                checked: Instant::now(),
                stamps: stamps(&cert, &key),
                key: Arc::new(load_files(&cert, &key, &provider).unwrap()),
            }),
        };
        let served = |r: &Reloading| r.state.lock().unwrap().key.cert[0].to_vec();
        assert_eq!(served(&reloading), first);

        // cert-manager renews: new files, new modification times.
        std::thread::sleep(Duration::from_millis(20));
        let (_, _, second) = write_pair(dir.path());
        reloading.refresh(&mut reloading.state.lock().unwrap());
        assert_eq!(served(&reloading), second);

        // A half-written renewal keeps the last good certificate.
        std::thread::sleep(Duration::from_millis(20));
        std::fs::write(&key, "garbage").unwrap();
        reloading.refresh(&mut reloading.state.lock().unwrap());
        assert_eq!(served(&reloading), second);
    }

    #[test]
    fn a_renewal_between_the_first_load_and_the_stamps_is_not_missed() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key, first) = write_pair(dir.path());
        let provider = provider();
        // The first load reads the files, then cert-manager renews them
        // before anything else happens.
        let mut second = Vec::new();
        let (loaded, stamps_seen) = stamped(&cert, &key, || {
            let k = load_files(&cert, &key, &provider);
            std::thread::sleep(Duration::from_millis(20));
            second = write_pair(dir.path()).2;
            k
        })
        .unwrap();
        let reloading = Reloading {
            cert: cert.clone(),
            key: key.clone(),
            provider: provider.clone(),
            state: Mutex::new(Loaded {
                checked: Instant::now(),
                stamps: stamps_seen,
                key: Arc::new(loaded),
            }),
        };
        let served = |r: &Reloading| r.state.lock().unwrap().key.cert[0].to_vec();
        assert_eq!(served(&reloading), first);
        // The next check sees the renewal.
        reloading.refresh(&mut reloading.state.lock().unwrap());
        assert_eq!(served(&reloading), second);
    }
}
