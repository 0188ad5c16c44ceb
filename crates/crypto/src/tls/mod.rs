//! NVMe/TCP's TLS (NVMe/TCP Transport 1.1 §3.6): TLS 1.3 with an external pre-shared key.
//!
//! * [`psk`]: the PSK rules: the interchange format (`NVMeTLSkey-1:hh:...:`), the retained
//!   PSK, the PSK identity (`NVMe0R01 <hostnqn> <subnqn>`, and version 1 with the PSK digest)
//!   and the TLS PSK derived from them, as libnvme (nvme-cli) derives them for the kernel's
//!   keyring;
//! * [`TlsSession`]: a non-blocking TLS 1.3 client or server over memory on OpenSSL's libssl,
//!   loaded at run time (rustls has no external PSKs);
//! * [`TlsStream`]: a session on a socket, received and sent through as the socket itself is
//!   (non-blocking on a reactor, blocking on a handshake thread);
//! * [`nvme_lookup`]: a server's PSK lookup from the host entries of a subsystem: the identity a
//!   host offers is parsed and checked, and the TLS PSK derived from the retained PSK configured
//!   for that host and subsystem.
//!
//! Nothing cryptographic is written here: the derivations are RustCrypto's HKDF and HMAC, the
//! handshake and records OpenSSL's.

pub mod psk;
mod session;
mod stream;

#[cfg(test)]
mod stream_tests;
#[cfg(test)]
mod tests;

pub use psk::{
    ConfiguredPsk, Derivation, IdentityError, IdentityVersion, PskError, PskHash, PskIdentity, RetainedPsk,
};
pub use session::{
    tls_available, HandshakeState, PskLookup, TlsError, TlsErrorKind, TlsPsk, TlsSession, BUF,
};
pub use stream::{Blocking, HandshakeError, TlsStream};

/// A server's PSK lookup for NVMe/TCP: `retained(hostnqn, subnqn)` answers the retained PSK
/// configured for that host on that subsystem (`None`: none). An identity that does not parse,
/// names a pair without a PSK, has another hash or (version 1) another digest is unknown; the
/// identity's reason is logged, never the key.
pub fn nvme_lookup<F>(mut retained: F) -> PskLookup
where
    F: FnMut(&str, &str) -> Option<RetainedPsk> + Send + 'static,
{
    Box::new(move |offered: &[u8]| {
        let identity = match PskIdentity::parse(offered) {
            Ok(i) => i,
            Err(e) => {
                log::info!("TLS: refused a PSK identity: {e}");
                return None;
            }
        };
        let Some(psk) = retained(identity.hostnqn(), identity.subnqn()) else {
            log::info!("TLS: no PSK for host {} on {}", identity.hostnqn(), identity.subnqn());
            return None;
        };
        if !psk.matches(&identity) {
            log::info!(
                "TLS: the PSK identity of host {} on {} is not its PSK's",
                identity.hostnqn(),
                identity.subnqn()
            );
            return None;
        }
        let key = psk.tls_psk(&identity).ok()?;
        Some(TlsPsk { hash: identity.hash(), key })
    })
}
