//! The LUKS methods (flashpath's own: SPDK has no LUKS). A passphrase is a keyring key
//! (`keyring_file_add_key`): its file's bytes, exactly as cryptsetup's `--key-file` reads
//! them. Answers name slots, KDFs and sizes, never a passphrase or a key.

use fp_bdev::module::{ClaimType, ModuleError, ModuleHost};
use fp_bdev::{Bdev, BdevError};
use fp_luks::{FormatOptions, Kdf, KeyslotInfo, Version, Volume, VolumeKey};
use fp_rpc::{ParamError, Params};
use serde_json::{json, Value};

use super::disk::{
    crypto_key, disks, luks_error, open_disk, unlock_bounded, unlock_reencryption_bounded, with_passphrase,
    LuksDisk,
};
use super::io::BdevMetaIo;
use super::kdf::KdfRequest;
use crate::{recover_hotzone, CryptoDevice, CryptoLayout, Hotzone};

/// The claim holder kind while a method works on a base no crypto bdev holds.
const HOLDER: &str = "luks";

/// `base` claimed exclusively for the length of `f` (nobody writes it while its header
/// changes), then given back.
fn with_claimed_base<R>(
    host: &dyn ModuleHost,
    base: &str,
    f: impl FnOnce(&Bdev) -> Result<R, ModuleError>,
) -> Result<R, ModuleError> {
    let name = host.bdev_name(base).unwrap_or_else(|| base.to_string());
    let bdev = host.claim(&name, HOLDER, &name, ClaimType::ExclusiveWrite)?;
    let r = f(&bdev);
    host.release_claim(&name, HOLDER, &name);
    r
}

fn meta_io(bdev: &Bdev) -> Result<BdevMetaIo, BdevError> {
    BdevMetaIo::open(bdev)
}

/// `bdev_luks_format`: writes a new LUKS volume on `base_bdev_name` (not in use) with one key
/// slot opened by keyring key `key_name`; returns its UUID. A base that already holds a LUKS
/// header is refused unless `force` (cryptsetup asks before it overwrites one).
pub(crate) fn format(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let base = p.required_str("base_bdev_name")?;
    let key_name = p.required_str("key_name")?;
    let version = match p.optional_str("type")?.as_deref() {
        None | Some("luks2") => Version::Luks2,
        Some("luks1") => Version::Luks1,
        Some(other) => {
            return Err(ParamError::new("type", format!("'{}': luks2 or luks1", other.escape_debug())).into())
        }
    };
    let cipher = p.optional_str("cipher")?.unwrap_or_else(|| "aes-xts-plain64".into());
    let key_bits = p.optional_uint("key_size", 512)?.unwrap_or(512) as u32;
    let sector_size = p.optional_uint("sector_size", 4096)?.map(|v| v as u32);
    let label = p.optional_str("label")?;
    let uuid = p.optional_str("uuid")?;
    let force = p.optional_bool("force")?.unwrap_or(false);
    let kdf = KdfRequest::take(&mut p)?;
    p.finish()?;
    if cipher != "aes-xts-plain64" {
        return Err(
            ParamError::new("cipher", format!("'{}': only aes-xts-plain64", cipher.escape_debug())).into()
        );
    }
    if key_bits != 256 && key_bits != 512 {
        return Err(ParamError::new(
            "key_size",
            format!("{key_bits}: 256 or 512 bits (AES-128 or AES-256 XTS)"),
        )
        .into());
    }
    with_claimed_base(host, &base, |bdev| {
        let block = bdev.info().block_size;
        let sector_size = match (version, sector_size) {
            (Version::Luks1, None | Some(512)) => 512,
            (Version::Luks1, Some(s)) => {
                return Err(
                    ParamError::new("sector_size", format!("{s}: LUKS1 has 512-byte sectors only")).into()
                )
            }
            (Version::Luks2, None) => block.max(4096),
            (Version::Luks2, Some(s)) => s,
        };
        if !(512..=4096).contains(&sector_size) || !sector_size.is_power_of_two() || sector_size < block {
            return Err(ParamError::new(
                "sector_size",
                format!("{sector_size}: a power of two from 512 to 4096, and at least the base's {block}-byte blocks"),
            )
            .into());
        }
        let mut io = meta_io(bdev)?;
        if !force && Volume::load(&mut io).is_ok() {
            return Err(ParamError::new(
                "base_bdev_name",
                format!(
                    "'{base}' already holds a LUKS header: give force to overwrite it (its data is lost)"
                ),
            )
            .into());
        }
        // Measured only once the request is known to go ahead.
        let kdf = kdf.resolve(version)?;
        let opts = FormatOptions { version, cipher, key_bits, sector_size, kdf, label, uuid };
        let (volume, _key) =
            with_passphrase(host, "key_name", &key_name, |pass| fp_luks::format(&mut io, &opts, pass))?
                .map_err(|e| luks_error("base_bdev_name", e))?;
        log::info!("'{base}' formatted as a {} volume {}", version_name(version), volume.uuid());
        Ok(Value::from(volume.uuid()))
    })
}

/// Opens the LUKS volume on `base` with keyring key `key_name` (trying `slot`, or every
/// slot) for `bdev_crypto_create`: the crypto bdev `name` over its data segment, and the
/// open disk kept for key-slot changes. Claims nothing itself: the caller's `add_bdev` does.
/// A volume part way through a re-encryption opens with both its keys, its interrupted
/// hotzone repaired first; [`resume_after_open`] then continues the job.
pub(crate) fn open_luks(
    host: &dyn ModuleHost,
    name: &str,
    base: Bdev,
    key_name: &str,
    slot: Option<u32>,
) -> Result<CryptoDevice, ModuleError> {
    let mut io = meta_io(&base)?;
    let mut volume = Volume::load(&mut io).map_err(|e| luks_error("base_bdev_name", e))?;
    if volume.cipher() != "aes-xts-plain64" {
        return Err(ParamError::new(
            "base_bdev_name",
            format!("the volume's cipher is {}: only aes-xts-plain64 is served", volume.cipher()),
        )
        .into());
    }
    let layout = CryptoLayout { data_offset: volume.data_offset(), sector_size: volume.sector_size() };
    if volume.reencryption().is_some_and(|r| r.finished) {
        // Every sector is under the new key already: the job's last header write is all that
        // is left (a crash between the two); then the volume opens as any other.
        let (_, new) = with_passphrase(host, "luks_key_name", key_name, |pass| {
            unlock_reencryption_bounded(&volume, &mut io, pass)
        })?
        .map_err(|e| luks_error("luks_key_name", e))?;
        volume.finish_reencryption(&mut io, &new).map_err(|e| luks_error("base_bdev_name", e))?;
    }
    let (dev, key, opened_by, resume) = if volume.reencryption().is_some() {
        let (old, new) = with_passphrase(host, "luks_key_name", key_name, |pass| {
            unlock_reencryption_bounded(&volume, &mut io, pass)
        })?
        .map_err(|e| luks_error("luks_key_name", e))?;
        let old_key = crypto_key(name, "old", &old)?;
        let new_key = crypto_key(name, "new", &new)?;
        // The engine takes a hotzone's checksums per sector; cryptsetup per block of its
        // device (4096 bytes on most), whatever the sector size. A job it recorded in other
        // units is switched to sectors, as cryptsetup itself switches a resumed job to its own;
        // a hotzone it left half rewritten in those units is for `cryptsetup repair`.
        if let Some(r) = volume.reencryption().filter(|r| r.checksum_block != layout.sector_size) {
            if r.hotzone.is_some() {
                return Err(ParamError::new(
                    "base_bdev_name",
                    format!(
                        "an interrupted re-encryption step recorded in {}-byte blocks: run `cryptsetup repair` on the volume first",
                        r.checksum_block
                    ),
                )
                .into());
            }
            volume
                .reencryption_set_checksum_block(&mut io, (&old, &new), layout.sector_size)
                .map_err(|e| luks_error("base_bdev_name", e))?;
        }
        if let Some((offset, len, sums)) =
            volume.reencryption_recovery(&mut io).map_err(|e| luks_error("base_bdev_name", e))?
        {
            let hotzone = Hotzone { offset, len, old_sector_sha256: sums };
            let found = recover_hotzone(&base, layout, &old_key, &new_key, &hotzone)
                .map_err(|e| ModuleError::module(libc::EIO, e))?;
            volume
                .reencryption_advance(&mut io, offset + len)
                .map_err(|e| luks_error("base_bdev_name", e))?;
            log::info!(
                "LUKS disk '{name}': interrupted hotzone at {offset} repaired ({} sectors rewritten, {} already new)",
                found.rewritten,
                found.already_new
            );
        }
        let boundary = volume.reencryption().map_or(0, |r| r.boundary);
        let dev = CryptoDevice::with_reencryption(name, base.clone(), old_key, new_key, layout, boundary)?;
        log::info!(
            "LUKS volume {} on '{}' is being re-encrypted: {boundary} bytes done",
            volume.uuid(),
            base.info().name
        );
        (dev, old.clone(), 0, Some((old, new)))
    } else {
        let (key, opened_by) = with_passphrase(host, "luks_key_name", key_name, |pass| {
            unlock_bounded(&volume, &mut io, pass, slot)
        })?
        .map_err(|e| luks_error("luks_key_name", e))?;
        let dev = CryptoDevice::with_layout(name, base.clone(), crypto_key(name, "key", &key)?, layout)?;
        (dev, key, opened_by, None)
    };
    log::info!("LUKS volume {} on '{}' opened with key slot {opened_by}", volume.uuid(), base.info().name);
    disks(host).insert(
        name,
        LuksDisk {
            base,
            volume: std::sync::Mutex::new(volume),
            key: std::sync::Mutex::new(key),
            opened_by,
            job: std::sync::Mutex::new(None),
            resume: std::sync::Mutex::new(resume),
        },
    );
    Ok(dev)
}

/// Continues, on the registered crypto bdev `name`, the re-encryption its header recorded.
pub(crate) fn resume_after_open(host: &dyn ModuleHost, name: &str) -> Result<(), ModuleError> {
    let Some(disk) = disks(host).get(name) else { return Ok(()) };
    let Some((old, new)) = disk.resume.lock().unwrap_or_else(|p| p.into_inner()).take() else {
        return Ok(());
    };
    let any = host.module_device(name, "crypto", "crypto bdev")?;
    let dev =
        any.downcast_ref::<CryptoDevice>().ok_or_else(|| ParamError::new("name", "not a crypto bdev"))?;
    super::reencrypt::run_job(&disk, dev, old, new, crate::ReencryptOptions::default())?;
    log::info!("LUKS disk '{name}': re-encryption resumed");
    Ok(())
}

fn version_name(v: Version) -> &'static str {
    match v {
        Version::Luks1 => "luks1",
        Version::Luks2 => "luks2",
    }
}

fn kdf_json(kdf: &Kdf) -> Value {
    match kdf {
        Kdf::Pbkdf2 { hash, iterations } => json!({"type": "pbkdf2", "hash": hash, "iterations": iterations}),
        Kdf::Argon2 { id, time, memory_kib, parallel } => json!({
            "type": if *id { "argon2id" } else { "argon2i" },
            "time": time, "memory": memory_kib, "cpus": parallel,
        }),
    }
}

fn slot_json(s: &KeyslotInfo) -> Value {
    json!({"key_slot": s.slot, "key_size": s.key_bits, "kdf": kdf_json(&s.kdf), "priority": s.priority})
}

fn header_json(v: &Volume, size: u64) -> Value {
    json!({
        "type": version_name(v.version()),
        "uuid": v.uuid(),
        "label": v.label(),
        "cipher": v.cipher(),
        "key_size": v.key_bits(),
        "sector_size": v.sector_size(),
        "data_offset": v.data_offset(),
        "data_size": v.data_size(size),
        "keyslots": v.keyslots().iter().map(slot_json).collect::<Vec<_>>(),
    })
}

/// The header a request names: of the open LUKS disk `name` (as last written, with the slot
/// that opened it), or read now from `base_bdev_name` (which may be in use by anything: this
/// only reads). Returns the base, the header and the opening slot.
fn named_header(
    host: &dyn ModuleHost,
    name: Option<String>,
    base: Option<String>,
) -> Result<(Bdev, Volume, Option<u32>), ModuleError> {
    match (name, base) {
        (Some(name), None) => {
            let disk = open_disk(host, &name)?;
            let v = disk.volume.lock().unwrap_or_else(|p| p.into_inner()).clone();
            Ok((disk.base.clone(), v, Some(disk.opened_by)))
        }
        (None, Some(base)) => {
            let (bdev, _) = host
                .bdev(&base)
                .ok_or_else(|| ParamError::new("base_bdev_name", format!("no bdev '{base}'")))?;
            let mut io = meta_io(&bdev)?;
            let v = Volume::load(&mut io).map_err(|e| luks_error("base_bdev_name", e))?;
            Ok((bdev, v, None))
        }
        _ => Err(ParamError::new("name", "give name (an open LUKS disk) or base_bdev_name, not both").into()),
    }
}

/// `bdev_luks_get_header`: the header of the open LUKS disk `name`, or of `base_bdev_name`,
/// as cryptsetup's `luksDump` shows it, without digests or salts.
pub(crate) fn get_header(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let name = p.optional_str("name")?;
    let base = p.optional_str("base_bdev_name")?;
    p.finish()?;
    let (bdev, v, opened_by) = named_header(host, name, base)?;
    let mut out = header_json(&v, bdev.info().size_bytes());
    if let Some(slot) = opened_by {
        out["opened_by"] = Value::from(slot);
    }
    Ok(out)
}

/// `bdev_luks_test_key`: which key slot keyring key `key_name` opens (cryptsetup's
/// `open --test-passphrase`), on the open disk `name` or on `base_bdev_name`; `key_slot`
/// tries that slot only.
pub(crate) fn test_key(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let name = p.optional_str("name")?;
    let base = p.optional_str("base_bdev_name")?;
    let key_name = p.required_str("key_name")?;
    let slot = p.optional_uint("key_slot", 31)?.map(|v| v as u32);
    p.finish()?;
    let (bdev, volume, _) = named_header(host, name, base)?;
    let mut io = meta_io(&bdev)?;
    let (_key, opened) =
        with_passphrase(host, "key_name", &key_name, |pass| unlock_bounded(&volume, &mut io, pass, slot))?
            .map_err(|e| luks_error("key_name", e))?;
    Ok(Value::from(opened))
}

/// `bdev_luks_add_keyslot`: a new key slot on the open disk `name`, opened by keyring key
/// `key_name`, wrapping the disk's own volume key (which never leaves the daemon); `key_slot`
/// picks the slot, else the first free one. Returns the slot.
pub(crate) fn add_keyslot(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let name = p.required_str("name")?;
    let key_name = p.required_str("key_name")?;
    let slot = p.optional_uint("key_slot", 31)?.map(|v| v as u32);
    let kdf = KdfRequest::take(&mut p)?;
    p.finish()?;
    let disk = open_disk(host, &name)?;
    let mut volume = disk.volume.lock().unwrap_or_else(|p| p.into_inner());
    let kdf = kdf.resolve(volume.version())?;
    let mut io = meta_io(&disk.base)?;
    let key = disk.key.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let key: &VolumeKey = &key;
    let added = with_passphrase(host, "key_name", &key_name, |pass| {
        volume.add_keyslot(&mut io, key, pass, slot, &kdf)
    })?
    .map_err(|e| luks_error("key_slot", e))?;
    log::info!("LUKS disk '{name}': key slot {added} added");
    Ok(Value::from(added))
}

/// `bdev_luks_remove_keyslot`: wipes key slot `key_slot` of the open disk `name` (cryptsetup's
/// `luksKillSlot`); the last slot is refused (the volume would never open again).
pub(crate) fn remove_keyslot(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let name = p.required_str("name")?;
    let slot = p.required_uint("key_slot", 31)? as u32;
    p.finish()?;
    let disk = open_disk(host, &name)?;
    let mut volume = disk.volume.lock().unwrap_or_else(|p| p.into_inner());
    let mut io = meta_io(&disk.base)?;
    volume.remove_keyslot(&mut io, slot).map_err(|e| luks_error("key_slot", e))?;
    log::info!("LUKS disk '{name}': key slot {slot} removed");
    Ok(Value::Bool(true))
}
