//! HTTPS: the certificate and key of `[server] tls_cert` / `tls_key`, reloadable.
//!
//! Connections negotiate HTTP/2 or HTTP/1.1 by ALPN (`h2` first): over HTTP/1.1 a browser keeps
//! at most six connections per origin, so SSE streams in several tabs starve one another; over
//! HTTP/2 they share one connection. [`Tls::reload`] reads both files again (on `SIGHUP`): new
//! handshakes use the new certificate, connections already open keep theirs, and a pair that
//! cannot be loaded leaves the old one serving.

use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};

use tokio_rustls::rustls::crypto::ring::default_provider;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::TlsAcceptor;

/// The ALPN protocol of HTTP/2.
pub const H2: &[u8] = b"h2";

/// Why a certificate and key could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A file could not be read or holds no PEM of the expected kind.
    #[error("{what} {path}: {reason}")]
    File {
        /// Which of the two.
        what: TlsFile,
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The key is not one rustls can sign with, or does not belong to the certificate.
    #[error("[server] tls_key {path} does not go with tls_cert {cert}: {reason}")]
    Pair {
        /// The key file.
        path: PathBuf,
        /// The certificate file.
        cert: PathBuf,
        /// Why.
        reason: String,
    },
}

/// One of the two files of the server's TLS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsFile {
    /// `[server] tls_cert`: the certificate chain.
    Cert,
    /// `[server] tls_key`: its private key.
    Key,
}

impl TlsFile {
    /// Its key in a config, as a refusal names it: `server.tls_cert`, `server.tls_key`.
    pub fn config_key(self) -> &'static str {
        match self {
            Self::Cert => "server.tls_cert",
            Self::Key => "server.tls_key",
        }
    }
}

impl std::fmt::Display for TlsFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Cert => "[server] tls_cert",
            Self::Key => "[server] tls_key",
        })
    }
}

/// The server's TLS: an acceptor whose certificate can be replaced while it serves.
pub struct Tls {
    cert: PathBuf,
    key: PathBuf,
    current: Arc<Current>,
    acceptor: TlsAcceptor,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

/// The certificate handshakes use now.
#[derive(Debug)]
struct Current(RwLock<Arc<CertifiedKey>>);

impl ResolvesServerCert for Current {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(
            &self.0.read().unwrap_or_else(PoisonError::into_inner),
        ))
    }
}

impl Tls {
    /// TLS with the certificate chain in `cert` and the private key in `key` (PEM files).
    ///
    /// # Errors
    /// [`TlsError`]: a file is unreadable or not PEM, or the key does not match the certificate.
    pub fn load(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        let current = Arc::new(Current(RwLock::new(Arc::new(certified(cert, key)?))));
        let mut config = ServerConfig::builder_with_provider(Arc::new(default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|error| TlsError::Pair {
                path: key.to_owned(),
                cert: cert.to_owned(),
                reason: error.to_string(),
            })?
            .with_no_client_auth()
            .with_cert_resolver(Arc::clone(&current) as Arc<dyn ResolvesServerCert>);
        config.alpn_protocols = vec![H2.to_vec(), b"http/1.1".to_vec()];
        Ok(Self {
            cert: cert.to_owned(),
            key: key.to_owned(),
            current,
            acceptor: TlsAcceptor::from(Arc::new(config)),
        })
    }

    /// Reads the certificate and key again; new handshakes use them.
    ///
    /// # Errors
    /// As [`Tls::load`]; the certificate in use then stays.
    pub fn reload(&self) -> Result<(), TlsError> {
        let fresh = Arc::new(certified(&self.cert, &self.key)?);
        *self
            .current
            .0
            .write()
            .unwrap_or_else(PoisonError::into_inner) = fresh;
        Ok(())
    }

    /// Accepts TLS connections.
    pub fn acceptor(&self) -> &TlsAcceptor {
        &self.acceptor
    }
}

/// The certificate chain of `cert` with the key of `key`, checked to belong together.
fn certified(cert: &Path, key: &Path) -> Result<CertifiedKey, TlsError> {
    let file = |what, path: &Path, reason: String| TlsError::File {
        what,
        path: path.to_owned(),
        reason,
    };
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(Iterator::collect::<Result<Vec<_>, _>>)
        .map_err(|error| file(TlsFile::Cert, cert, error.to_string()))?;
    if chain.is_empty() {
        return Err(file(TlsFile::Cert, cert, "no certificate".into()));
    }
    let private = PrivateKeyDer::from_pem_file(key)
        .map_err(|error| file(TlsFile::Key, key, error.to_string()))?;
    CertifiedKey::from_der(chain, private, &default_provider()).map_err(|error| TlsError::Pair {
        path: key.to_owned(),
        cert: cert.to_owned(),
        reason: error.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed certificate for `localhost` and its P-256 key (PKCS#8), as PEM files.
    fn pair(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let (cert, key) = (
            dir.join(format!("{name}.crt")),
            dir.join(format!("{name}.key")),
        );
        let made = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        std::fs::write(&cert, made.cert.pem()).unwrap();
        std::fs::write(&key, made.key_pair.serialize_pem()).unwrap();
        (cert, key)
    }

    #[test]
    fn pairs_are_checked_and_a_bad_reload_keeps_the_old_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = pair(dir.path(), "a");
        let (_, other_key) = pair(dir.path(), "b");
        let tls = Tls::load(&cert, &key).unwrap();
        let before = tls.current.0.read().unwrap().cert.clone();

        assert!(matches!(
            Tls::load(&cert, &other_key),
            Err(TlsError::Pair { .. })
        ));
        assert!(matches!(
            Tls::load(&dir.path().join("missing.crt"), &key),
            Err(TlsError::File {
                what: TlsFile::Cert,
                ..
            })
        ));
        std::fs::write(dir.path().join("empty.crt"), "not pem").unwrap();
        assert!(matches!(
            Tls::load(&dir.path().join("empty.crt"), &key),
            Err(TlsError::File { .. })
        ));

        // A reload that fails leaves the certificate in use.
        std::fs::copy(&other_key, &key).unwrap();
        assert!(tls.reload().is_err());
        assert_eq!(tls.current.0.read().unwrap().cert, before);
        // A matching new pair is taken.
        let (cert2, key2) = pair(dir.path(), "c");
        std::fs::copy(&cert2, &cert).unwrap();
        std::fs::copy(&key2, &key).unwrap();
        tls.reload().unwrap();
        assert_ne!(tls.current.0.read().unwrap().cert, before);
    }
}
