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

/// Opens `volume` with `passphrase` (slot `slot`, or every slot in cryptsetup's order), never
/// running a slot's KDF beyond what this daemon bounds ([`super::kdf::too_costly`]): such a
/// slot is skipped, and named in the error when nothing else opens.
pub(crate) fn unlock_bounded(
    volume: &Volume,
    io: &mut dyn fp_luks::MetaIo,
    passphrase: &[u8],
    slot: Option<u32>,
) -> Result<(VolumeKey, u32), LuksError> {
    let slots = volume.keyslots();
    let costly = costly_slots(volume);
    if costly.is_empty() {
        return volume.unlock(io, passphrase, slot);
    }
    if let Some(n) = slot {
        if let Some(c) = costly.iter().find(|(s, _)| *s == n) {
            return Err(refusal(c));
        }
        return volume.unlock(io, passphrase, Some(n));
    }
    // cryptsetup's order: "prefer" slots, then "normal" ones; "ignore" ones only when named.
    let rank = |p: &Option<String>| match p.as_deref() {
        Some("prefer") => 0,
        Some("ignore") => 2,
        _ => 1,
    };
    let mut order: Vec<&fp_luks::KeyslotInfo> = slots.iter().filter(|s| rank(&s.priority) < 2).collect();
    order.sort_by_key(|s| (rank(&s.priority), s.slot));
    for s in order {
        if costly.iter().any(|(n, _)| *n == s.slot) {
            continue;
        }
        match volume.unlock(io, passphrase, Some(s.slot)) {
            Err(LuksError::WrongPassphrase) => continue,
            r => return r,
        }
    }
    Err(refusal(&costly[0]))
}

/// The old and the new key of a volume in re-encryption, never running a slot's KDF beyond
/// what this daemon bounds, as [`unlock_bounded`]: such a slot is skipped, and named in the
/// error when the passphrase opens nothing else.
pub(crate) fn unlock_reencryption_bounded(
    volume: &Volume,
    io: &mut dyn fp_luks::MetaIo,
    passphrase: &[u8],
) -> Result<(VolumeKey, VolumeKey), LuksError> {
    let costly = costly_slots(volume);
    let usable = |n: u32| !costly.iter().any(|(s, _)| *s == n);
    match volume.unlock_reencryption_with(io, passphrase, &usable) {
        Err(LuksError::WrongPassphrase) if !costly.is_empty() => Err(refusal(&costly[0])),
        r => r,
    }
}

/// The volume's key slots whose KDF this daemon does not run, with the reason.
fn costly_slots(volume: &Volume) -> Vec<(u32, String)> {
    volume.keyslots().iter().filter_map(|s| super::kdf::too_costly(&s.kdf).map(|why| (s.slot, why))).collect()
}

fn refusal((n, why): &(u32, String)) -> LuksError {
    LuksError::Unsupported { what: "key slot", value: format!("{n} asks for {why}") }
}
