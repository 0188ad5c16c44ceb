//! LUKS volumes on the crypto bdev: the header (crate `fp-luks`) read and written on a base
//! through [`BdevMetaIo`], the volume key kept in the daemon for the open disk's key-slot
//! changes, and the RPC methods that format, open, inspect and change them (docs/crypto.md,
//! "LUKS volumes").
//!
//! Header work runs on the RPC's control thread, never on a reactor: a key slot's KDF takes
//! as long as its parameters say (seconds, at cryptsetup's defaults), and the header I/O waits.

mod io;
mod kdf;
pub(crate) mod methods;
mod reencrypt;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use fp_bdev::{Bdev, BdevError, ModuleHost};
use fp_luks::{LuksError, Volume, VolumeKey};

use crate::ReencryptJob;

pub use io::BdevMetaIo;
pub(crate) use methods::{add_keyslot, format, get_header, open_luks, remove_keyslot, test_key};
pub(crate) use reencrypt::{
    cancel as reencrypt_cancel, get as reencrypt_get, pause as reencrypt_pause, resume as reencrypt_resume,
    set_speed as reencrypt_set_speed, start as reencrypt_start,
};

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
