//! TLS on a secure listener (`secure_channel`): the hosts' PSKs (`nvmf_subsystem_add_host`'s
//! `psk`) and the handshake thread's PSK lookup over them.
//!
//! As SPDK, a secure listener takes TLS 1.3 only: the host's PSK identity names the host and
//! the subsystem, the lookup answers the retained PSK configured for that pair on a
//! subsystem reachable at this listener, and the Connect that follows must name that very
//! pair. A host with a PSK may still connect in the clear through a listener that is not
//! secure (as SPDK: the PSK matters on secure listeners only).

use std::sync::{Arc, Mutex, Weak};

use fp_crypto::tls::{nvme_lookup, ConfiguredPsk, PskError, PskIdentity, RetainedPsk, TlsSession};

use crate::model::SubsystemKind;
use crate::options::ListenAddress;
use crate::state::TargetInner;
use crate::subsystem::lock;

/// A host's TLS PSK on one subsystem: the keyring key it came from (what the target
/// reports) and the retained PSK derived from it for the host.
#[derive(Clone)]
pub struct HostPsk {
    /// The keyring key name (shown as `psk`, never the key).
    pub key_name: String,
    retained: RetainedPsk,
}

impl std::fmt::Debug for HostPsk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostPsk").field("key_name", &self.key_name).finish_non_exhaustive()
    }
}

impl HostPsk {
    /// The PSK of `hostnqn` from `interchange` (`NVMeTLSkey-1:hh:...:`, the keyring key
    /// `key_name`'s text), its retained PSK derived as libnvme derives it.
    pub fn from_interchange(key_name: &str, interchange: &str, hostnqn: &str) -> Result<HostPsk, PskError> {
        let configured = ConfiguredPsk::parse(interchange.trim())?;
        Ok(HostPsk { key_name: key_name.to_string(), retained: configured.retained(hostnqn)? })
    }

    /// A PSK already retained for the host.
    pub fn retained(key_name: &str, retained: RetainedPsk) -> HostPsk {
        HostPsk { key_name: key_name.to_string(), retained }
    }
}

/// The retained PSK of `hostnqn` on `subnqn`, if that subsystem is reachable through `listen`
/// and lists the host with a PSK.
fn retained_psk(
    target: &TargetInner,
    listen: &ListenAddress,
    hostnqn: &str,
    subnqn: &str,
) -> Option<RetainedPsk> {
    let sub = target.subsystem(subnqn)?;
    if sub.kind != SubsystemKind::Nvme {
        return None;
    }
    let st = lock(&sub.state);
    if st.deleted || !st.listeners.contains(listen) || !st.hosts.contains(hostnqn) {
        return None;
    }
    st.host_psks.get(hostnqn).map(|p| p.retained.clone())
}

/// The host NQN the last PSK identity a session looked up named (for the log of a refusal).
pub(crate) type OfferedHost = Arc<Mutex<Option<String>>>;

/// A server session for a connection on the secure listener `listen`, and where its lookup
/// notes the host an identity named.
pub(crate) fn server_session(
    target: &Weak<TargetInner>,
    listen: &ListenAddress,
) -> Result<(TlsSession, OfferedHost), fp_crypto::tls::TlsError> {
    let (target, listen) = (target.clone(), listen.clone());
    let offered = OfferedHost::default();
    let noted = offered.clone();
    let session = TlsSession::server(nvme_lookup(move |hostnqn, subnqn| {
        *lock(&noted) = Some(hostnqn.to_string());
        let t: Arc<TargetInner> = target.upgrade()?;
        retained_psk(&t, &listen, hostnqn, subnqn)
    }))?;
    Ok((session, offered))
}

/// The host and subsystem NQNs of the PSK identity a session accepted.
pub(crate) fn identity_pair(session: &TlsSession) -> Option<(String, String)> {
    let id = PskIdentity::parse(session.accepted_identity()?).ok()?;
    Some((id.hostnqn().to_string(), id.subnqn().to_string()))
}
