//! The open LUKS disks the crypto module keeps (one per LUKS crypto bdev: its header, the key a
//! new slot wraps, its re-encryption job), and what every LUKS method does first: find the disk,
//! read a passphrase from the keyring, name a header error by the request's field.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use fp_bdev::module::{ModuleError, ModuleHost};
use fp_bdev::{Bdev, BdevError};
use fp_luks::{LuksError, Volume, VolumeKey};
use fp_rpc::ParamError;

use crate::keyring::keyring;
use crate::keys::invalid;
use crate::{CryptoKey, ReencryptJob};

/// The module state's name: the open LUKS disks.
const STATE: &str = "crypto-luks";

/// An open LUKS disk: its header as last written and the key that opens it. The key stays in
/// the daemon (it is what a new key slot wraps); nothing answers it.
pub(crate) struct LuksDisk {
    /// The base holding the header (claimed by the crypto bdev).
    pub base: Bdev,
    /// The header as last read or written; one key-slot change at a time.
    pub volume: Mutex<Volume>,
    /// The volume key a new slot wraps (the new one once a re-encryption is done).
    pub key: Mutex<VolumeKey>,
    /// The slot that opened it.
    pub opened_by: u32,
    /// The online re-encryption job, running or ended.
    pub job: Mutex<Option<ReencryptJob>>,
    /// The old and new keys of a re-encryption found in the header at open, for the job
    /// [`resume_after_open`] starts once the bdev is registered.
    pub resume: Mutex<Option<(VolumeKey, VolumeKey)>>,
}

/// The open LUKS disks by crypto bdev name.
#[derive(Default)]
pub(crate) struct LuksDisks(Mutex<BTreeMap<String, Arc<LuksDisk>>>);

impl LuksDisks {
    pub fn get(&self, name: &str) -> Option<Arc<LuksDisk>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).get(name).cloned()
    }

    pub fn insert(&self, name: &str, disk: LuksDisk) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).insert(name.to_string(), Arc::new(disk));
    }

    /// Forgets disk `name`; its job, if one runs, is cancelled and waited for (the hotzone
    /// being rewritten is finished and recorded first).
    pub fn remove(&self, name: &str) {
        let disk = self.0.lock().unwrap_or_else(|p| p.into_inner()).remove(name);
        if let Some(d) = disk {
            let job = d.job.lock().unwrap_or_else(|p| p.into_inner()).take();
            drop(job);
        }
    }

    /// The open disks' names.
    pub fn names(&self) -> Vec<String> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).keys().cloned().collect()
    }
}

/// The registry's open LUKS disks.
pub(crate) fn disks(host: &dyn ModuleHost) -> Arc<LuksDisks> {
    let state = host.module_state(STATE, &|| Arc::new(LuksDisks::default()));
    state.downcast::<LuksDisks>().unwrap_or_else(|_| panic!("the '{STATE}' state is LuksDisks"))
}

/// A header library error as the bdev layer reports it, naming `field` (the RPC parameter
/// the caller gave: the base, the key, the slot).
pub(crate) fn luks_error(field: &'static str, e: LuksError) -> BdevError {
    match e {
        LuksError::Io(io) => BdevError::Io(format!("LUKS header I/O failed: {io}")),
        e => BdevError::InvalidParam { field, reason: e.to_string() },
    }
}

/// Runs `f` with the passphrase of keyring key `name` (the request's `field`).
pub(crate) fn with_passphrase<R>(
    host: &dyn ModuleHost,
    field: &'static str,
    name: &str,
    f: impl FnOnce(&[u8]) -> R,
) -> Result<R, BdevError> {
    let key =
        keyring(host).key(name).map_err(|_| invalid(field, format!("no keyring key named '{name}'")))?;
    Ok(key.with_material(f))
}

/// The open LUKS disk `name` (the request's `name`).
pub(crate) fn open_disk(host: &dyn ModuleHost, name: &str) -> Result<Arc<LuksDisk>, ModuleError> {
    let name = host.bdev_name(name).unwrap_or_else(|| name.to_string());
    disks(host)
        .get(&name)
        .ok_or_else(|| ParamError::new("name", format!("'{name}' is not an open LUKS crypto bdev")).into())
}

/// A crypto key named after the disk from a volume key's halves.
pub(crate) fn crypto_key(name: &str, what: &str, key: &VolumeKey) -> Result<Arc<CryptoKey>, ModuleError> {
    let bytes = key.as_bytes();
    let (k1, k2) = bytes.split_at(bytes.len() / 2);
    Ok(Arc::new(CryptoKey::new(&format!("luks:{name}:{what}"), k1, k2)?))
}
