//! Online re-encryption of an open LUKS2 disk to a new volume key: the crypto bdev's engine
//! ([`crate::start_reencrypt`], its job thread and moving boundary) with its progress kept in the
//! LUKS2 header as cryptsetup keeps its own ([`LuksCheckpoint`], through fp-luks), so that a
//! restarted daemon, or cryptsetup, resumes it.

use std::sync::Arc;

use fp_bdev::module::{ModuleError, ModuleHost};
use fp_bdev::BlockDevice;
use fp_luks::VolumeKey;
use fp_rpc::{ParamError, Params};
use serde_json::{json, Value};

use super::disk::{crypto_key, disks, luks_error, open_disk, with_passphrase, LuksDisk};
use super::io::BdevMetaIo;
use super::kdf::KdfRequest;
use crate::{start_reencrypt, CryptoDevice, ReencryptCheckpoint, ReencryptOptions, MAX_HOTZONE};

/// The crypto module's name, as the registry files its devices.
const MODULE: &str = "crypto";

/// The checkpoint of a LUKS2 disk's job: each step is a header write (fp-luks), on the job's
/// thread, through a channel of the base opened for the step (a channel stays on the thread
/// that opened it; a step per hotzone makes its opening cheap beside the hotzone's I/O).
pub(crate) struct LuksCheckpoint {
    disk: Arc<LuksDisk>,
    old: VolumeKey,
    new: VolumeKey,
}

impl LuksCheckpoint {
    pub fn new(disk: Arc<LuksDisk>, old: VolumeKey, new: VolumeKey) -> LuksCheckpoint {
        LuksCheckpoint { disk, old, new }
    }

    /// Runs `f` on the header with the base's channel, the header's lock held.
    fn with_header(
        &mut self,
        f: impl FnOnce(
            &mut fp_luks::Volume,
            &mut BdevMetaIo,
            &VolumeKey,
            &VolumeKey,
        ) -> Result<(), fp_luks::LuksError>,
    ) -> std::io::Result<()> {
        let mut io = BdevMetaIo::open(&self.disk.base).map_err(std::io::Error::other)?;
        let mut volume = self.disk.volume.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut volume, &mut io, &self.old, &self.new).map_err(|e| match e {
            fp_luks::LuksError::Io(e) => e,
            e => std::io::Error::other(e.to_string()),
        })
    }
}

impl ReencryptCheckpoint for LuksCheckpoint {
    fn begin_hotzone(
        &mut self,
        offset: u64,
        len: u64,
        old_sector_sha256: &[[u8; 32]],
    ) -> std::io::Result<()> {
        self.with_header(|v, io, _, _| v.reencryption_hotzone(io, offset, len, old_sector_sha256))
    }

    fn advance(&mut self, boundary: u64) -> std::io::Result<()> {
        self.with_header(|v, io, _, _| v.reencryption_advance(io, boundary))
    }

    fn finish(&mut self) -> std::io::Result<()> {
        self.with_header(|v, io, _, new| v.finish_reencryption(io, new))?;
        // From now on the disk has one key: a new slot wraps the new one.
        *self.disk.key.lock().unwrap_or_else(|p| p.into_inner()) = self.new.clone();
        Ok(())
    }
}

/// The crypto bdev `name` as the registry holds it.
fn device(host: &dyn ModuleHost, name: &str) -> Result<Arc<dyn std::any::Any + Send + Sync>, ModuleError> {
    host.module_device(name, MODULE, "crypto bdev")
}

/// Starts the engine on `dev` for `disk` from the header's boundary.
pub(crate) fn run_job(
    disk: &Arc<LuksDisk>,
    dev: &CryptoDevice,
    old: VolumeKey,
    new: VolumeKey,
    opts: ReencryptOptions,
) -> Result<(), ModuleError> {
    let new_key = crypto_key(&dev.info().name, "new", &new)?;
    let checkpoint = LuksCheckpoint::new(disk.clone(), old, new);
    let job = start_reencrypt(dev, new_key, Box::new(checkpoint), opts)
        .map_err(|e| ModuleError::module(libc::EINVAL, e))?;
    *disk.job.lock().unwrap_or_else(|p| p.into_inner()) = Some(job);
    Ok(())
}

/// `bdev_luks_reencrypt_start`: re-encrypts the open LUKS2 disk `name` to a new random volume
/// key while it serves I/O. `key_name` (a keyring passphrase) gets a key slot for the new key,
/// as cryptsetup re-wraps a passphrase; the old slots open the old key until the job ends,
/// when they go. `hotzone_size` (bytes, default 1 MiB) is rewritten per step; `speed_limit`
/// in MiB/s (0: none). KDF parameters as `bdev_luks_add_keyslot`.
pub(crate) fn start(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let name = p.required_str("name")?;
    let key_name = p.required_str("key_name")?;
    let hotzone = p.optional_uint("hotzone_size", MAX_HOTZONE)?.unwrap_or(crate::DEFAULT_HOTZONE);
    let speed = p.optional_uint("speed_limit", u64::from(u32::MAX))?.unwrap_or(0);
    let kdf = KdfRequest::take(&mut p)?;
    p.finish()?;
    let disk = open_disk(host, &name)?;
    if let Some(state) =
        disk.job.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(|j| j.progress().state)
    {
        let why = match state {
            s if !s.is_final() => format!("a re-encryption of '{name}' is running"),
            // The open device keeps the finished job's two keys (every sector under the new
            // one); a new job starts from a device opened with the new key alone.
            crate::ReencryptState::Done => format!(
                "'{name}' was re-encrypted since it was opened: reopen it (bdev_crypto_delete, bdev_crypto_create) to start another"
            ),
            _ => format!("'{name}' has a stopped re-encryption recorded in its header: reopen the disk to resume it"),
        };
        return Err(ParamError::new("name", why).into());
    }
    let any = device(host, &name)?;
    let dev =
        any.downcast_ref::<CryptoDevice>().ok_or_else(|| ParamError::new("name", "not a crypto bdev"))?;
    let old = disk.key.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let (new, hotzone) = {
        let mut volume = disk.volume.lock().unwrap_or_else(|p| p.into_inner());
        if volume.version() != fp_luks::Version::Luks2 {
            return Err(ParamError::new("name", "online re-encryption needs a LUKS2 volume").into());
        }
        if volume.reencryption().is_some() {
            return Err(ParamError::new("name", format!("'{name}' is being re-encrypted already")).into());
        }
        let kdf = kdf.resolve(volume.version())?;
        let mut io = BdevMetaIo::open(&disk.base)?;
        let new = with_passphrase(host, "key_name", &key_name, |pass| {
            volume.begin_reencryption(&mut io, &old, &[pass], &kdf)
        })?
        .map_err(|e| luks_error("key_name", e))?;
        // At most what the header's checksum area records, in whole sectors.
        let most = volume.reencryption().map_or(hotzone, |r| r.hotzone_max);
        let sector = u64::from(volume.sector_size());
        (new, (hotzone.min(most) / sector * sector).max(sector))
    };
    let opts = ReencryptOptions { hotzone, speed_limit_mib_s: speed, ..ReencryptOptions::default() };
    run_job(&disk, dev, old, new, opts)?;
    log::info!("LUKS disk '{name}': online re-encryption started");
    Ok(Value::Bool(true))
}

/// `bdev_luks_reencrypt_get`: the jobs (of `name`, or all): state, bytes done and total, the
/// error of a failed one.
pub(crate) fn get(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let only = p.optional_str("name")?;
    p.finish()?;
    let disks = disks(host);
    let names = match &only {
        Some(n) => {
            open_disk(host, n)?;
            vec![n.clone()]
        }
        None => disks.names(),
    };
    let mut out = Vec::new();
    for n in names {
        let Some(disk) = disks.get(&n) else { continue };
        let job = disk.job.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(j) = job.as_ref() {
            let pr = j.progress();
            out.push(json!({
                "name": n, "state": pr.state.name(), "done_bytes": pr.done, "total_bytes": pr.total,
                "error": pr.error,
            }));
        }
    }
    Ok(Value::Array(out))
}

/// `bdev_luks_reencrypt_pause`, `_resume`, `_cancel`, `_set_speed`: the job of the open disk
/// `name`. A cancelled job leaves the disk in its mixed state, recorded in the header; `_start`
/// is refused then, a reopen resumes it.
pub(crate) fn control(
    host: &dyn ModuleHost,
    mut p: Params,
    what: &'static str,
) -> Result<Value, ModuleError> {
    let name = p.required_str("name")?;
    let speed =
        if what == "speed" { Some(p.required_uint("speed_limit", u64::from(u32::MAX))?) } else { None };
    p.finish()?;
    let disk = open_disk(host, &name)?;
    let job = disk.job.lock().unwrap_or_else(|p| p.into_inner());
    let Some(j) = job.as_ref() else {
        return Err(ParamError::new("name", format!("no re-encryption job on '{name}'")).into());
    };
    match what {
        "pause" => j.pause(),
        "resume" => j.resume(),
        "cancel" => j.cancel(),
        _ => j.set_speed_limit(speed.unwrap_or(0)),
    }
    Ok(Value::Bool(true))
}

pub(crate) fn pause(host: &dyn ModuleHost, p: Params) -> Result<Value, ModuleError> {
    control(host, p, "pause")
}

pub(crate) fn resume(host: &dyn ModuleHost, p: Params) -> Result<Value, ModuleError> {
    control(host, p, "resume")
}

pub(crate) fn cancel(host: &dyn ModuleHost, p: Params) -> Result<Value, ModuleError> {
    control(host, p, "cancel")
}

pub(crate) fn set_speed(host: &dyn ModuleHost, p: Params) -> Result<Value, ModuleError> {
    control(host, p, "speed")
}
