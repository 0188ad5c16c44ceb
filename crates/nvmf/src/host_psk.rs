//! A host's TLS PSK on a subsystem (`nvmf_subsystem_add_host`'s `psk`): a plain type the
//! subsystem's state holds and the secure listener's lookup reads (tcp/tls.rs).

use fp_crypto::tls::{ConfiguredPsk, PskError, RetainedPsk};

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

    /// The retained PSK the handshake's lookup derives the TLS PSK from.
    pub(crate) fn retained_psk(&self) -> &RetainedPsk {
        &self.retained
    }
}
