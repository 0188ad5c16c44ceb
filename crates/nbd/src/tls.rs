//! TLS for NBD (NBD_OPT_STARTTLS, x509): the server configuration built from PEM files with
//! rustls, and optional client certificates checked against a CA.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::server::WebPkiClientVerifier;
use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// The PEM files of a TLS listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The server's certificate chain.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
    /// When set, clients must present a certificate this CA signed.
    pub ca: Option<PathBuf>,
}

/// Why the files do not make a configuration; `field` is the parameter to blame.
#[derive(Debug, thiserror::Error)]
#[error("{reason}")]
pub struct TlsError {
    pub field: &'static str,
    pub reason: String,
}

fn err(field: &'static str, reason: String) -> TlsError {
    TlsError { field, reason }
}

fn certs(field: &'static str, path: &PathBuf) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| err(field, format!("cannot read {}: {e}", path.display())))?
        .collect::<Result<_, _>>()
        .map_err(|e| err(field, format!("{}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(err(field, format!("{} holds no PEM certificate", path.display())));
    }
    Ok(certs)
}

/// Builds the rustls configuration (TLS 1.2 and 1.3, the ring provider's safe defaults).
pub fn server_config(files: &TlsFiles) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = certs("tls_cert", &files.cert)?;
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| {
        err("tls_key", format!("cannot read a PEM private key from {}: {e}", files.key.display()))
    })?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| err("tls_cert", e.to_string()))?;
    let builder = match &files.ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in certs("tls_ca", ca)? {
                roots.add(c).map_err(|e| err("tls_ca", format!("{}: {e}", ca.display())))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| err("tls_ca", e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let config = builder
        .with_single_cert(chain, key)
        .map_err(|e| err("tls_key", format!("certificate and key do not make a pair: {e}")))?;
    Ok(Arc::new(config))
}
