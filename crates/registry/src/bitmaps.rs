//! Dirty bitmaps in the registry: adding and removing them on a disk, and keeping the
//! persistent ones in the state directory (`serve --state-dir`; docs/backup.md).
//!
//! A persistent bitmap is a file `<hex bdev>.<hex name>.bitmap` there
//! ([`fp_bdev::disk::bitmap_file`]). It carries IN_USE, synced, before the bitmap can be marked
//! (at add, and at load when its bdev appears); a clean shutdown or the bdev's deletion writes
//! the bits and clears it. A file found IN_USE at load was left by a crash: its bitmap may have
//! missed writes, so it is loaded inconsistent and refuses every use but removal. A file of
//! another size, UUID or an unreadable one is never applied: it is logged and left alone.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fp_bdev::disk::bitmap_file::{BitmapFile, FLAG_INCONSISTENT, FLAG_IN_USE, FLAG_RECORDING};
use fp_bdev::disk::{BitmapError, DirtyBitmap};
use fp_bdev::{BlockDevice, Disk, Uuid};

use crate::methods::{bdev_uuid, MethodError};
use crate::{Registry, RegistryError};

const SUFFIX: &str = ".bitmap";

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

fn file_of(dir: &Path, bdev: &str, name: &str) -> PathBuf {
    dir.join(format!("{}.{}{SUFFIX}", hex(bdev), hex(name)))
}

fn uuid_of(bdev: &str) -> [u8; 16] {
    Uuid::parse(&bdev_uuid(bdev)).map_or([0; 16], |u| u.0)
}

fn io_error(path: &Path, e: std::io::Error) -> RegistryError {
    RegistryError::Bdev(fp_bdev::BdevError::Io(format!("{}: {e}", path.display())))
}

/// Writes `file` at `path` whole: a temporary file, synced, renamed over, the directory synced.
fn write_atomically(path: &Path, file: &BitmapFile) -> Result<(), RegistryError> {
    let tmp = path.with_extension("tmp");
    let write = || -> std::io::Result<()> {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(&file.encode())?;
        f.sync_all()?;
        fs::rename(&tmp, path)?;
        if let Some(dir) = path.parent() {
            fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    };
    write().map_err(|e| {
        let _ = fs::remove_file(&tmp);
        io_error(path, e)
    })
}

fn file_for(bdev: &str, b: &DirtyBitmap, flags: u32) -> BitmapFile {
    let mut flags = flags;
    if b.recording() {
        flags |= FLAG_RECORDING;
    }
    if b.inconsistent() {
        flags |= FLAG_INCONSISTENT;
    }
    BitmapFile {
        bdev: bdev.to_string(),
        name: b.name().to_string(),
        // The bitmap's own size: a bdev resized since it was made refuses the file at load.
        size: b.len(),
        uuid: uuid_of(bdev),
        granularity: b.granularity(),
        flags,
        words: b.snapshot().words().to_vec(),
    }
}

/// A refusal of the disk layer as the caller's fault in `field` (-32602 naming it), or with its
/// own code.
pub(crate) fn refused(field: &'static str, e: BitmapError) -> MethodError {
    match e {
        BitmapError::AccountingOff => MethodError::Failed { code: -libc::EOPNOTSUPP, message: e.to_string() },
        BitmapError::Exists { .. } => MethodError::Failed { code: -libc::EEXIST, message: e.to_string() },
        BitmapError::Busy { .. } => MethodError::Failed { code: -libc::EBUSY, message: e.to_string() },
        BitmapError::Invalid { field, reason } => RegistryError::Invalid { field, reason }.into(),
        other => RegistryError::Invalid { field, reason: other.to_string() }.into(),
    }
}

impl Registry {
    /// The state directory (`serve --state-dir`), if the daemon has one.
    pub fn state_dir(&self) -> Option<&Path> {
        self.options.state_dir.as_deref()
    }

    /// Adds `bitmap` to `disk` (bdev `bdev`). A persistent one needs the state directory; its
    /// file is written IN_USE before the disk marks it.
    pub fn add_dirty_bitmap(
        &self,
        bdev: &str,
        disk: &Disk,
        bitmap: DirtyBitmap,
    ) -> Result<Arc<DirtyBitmap>, MethodError> {
        if !bitmap.persistent() {
            let name = bitmap.name().to_string();
            let added = disk.add_dirty_bitmap(bitmap).map_err(|e| refused("name", e))?;
            // A new bitmap holds no changes since any backup.
            self.forget_backup_parent(bdev, &name);
            return Ok(added);
        }
        let Some(dir) = self.state_dir() else {
            let reason = "needs the daemon's state directory (serve --state-dir / state_dir)".to_string();
            return Err(RegistryError::Invalid { field: "persistent", reason }.into());
        };
        let existing = disk.dirty_bitmaps().into_iter().find(|b| b.name() == bitmap.name());
        if let Some(b) = existing.filter(|b| b.persistent() && b.granularity() == bitmap.granularity()) {
            // The state directory brought it back at the bdev's creation: a configuration file
            // that declares it adds it at every start.
            return Ok(b);
        }
        if disk.dirty_bitmaps().iter().any(|b| b.name() == bitmap.name()) {
            return Err(refused(
                "name",
                BitmapError::Exists { bdev: bdev.into(), name: bitmap.name().into() },
            ));
        }
        let path = file_of(dir, bdev, bitmap.name());
        self.forget_backup_parent(bdev, bitmap.name());
        write_atomically(&path, &file_for(bdev, &bitmap, FLAG_IN_USE))?;
        disk.add_dirty_bitmap(bitmap).map_err(|e| {
            let _ = fs::remove_file(&path);
            refused("name", e)
        })
    }

    /// Removes bitmap `name` of `disk`, and its file if it is persistent.
    pub fn remove_dirty_bitmap(&self, bdev: &str, disk: &Disk, name: &str) -> Result<(), MethodError> {
        let b = disk.remove_dirty_bitmap(name).map_err(|e| refused("name", e))?;
        self.forget_backup_parent(bdev, name);
        if let (true, Some(dir)) = (b.persistent(), self.state_dir()) {
            let path = file_of(dir, bdev, name);
            fs::remove_file(&path).map_err(|e| io_error(&path, e))?;
        }
        Ok(())
    }

    /// Writes the bits of `disk`'s persistent bitmaps and clears IN_USE (a clean shutdown, the
    /// bdev's deletion). Nothing writes to the disk any more.
    pub(crate) fn save_dirty_bitmaps(&self, bdev: &str, disk: &Disk) {
        let Some(dir) = self.state_dir() else { return };
        for b in disk.dirty_bitmaps().iter().filter(|b| b.persistent()) {
            let path = file_of(dir, bdev, b.name());
            match write_atomically(&path, &file_for(bdev, b, 0)) {
                Ok(()) => log::info!("bdev '{bdev}': dirty bitmap '{}' saved", b.name()),
                Err(e) => log::error!("bdev '{bdev}': dirty bitmap '{}' not saved: {e}", b.name()),
            }
        }
    }

    /// Every disk's persistent bitmaps saved at the daemon's clean shutdown, once `exports_stopped`
    /// (else none: an export still stopping may complete writes after the save). A disk a
    /// mirror job still copies from or to keeps IN_USE too: the job may write after the save.
    /// A file left IN_USE comes back inconsistent: a full backup, never a silent miss.
    /// `backups_left`: bdevs whose backup job did not end; their bitmaps lack the job's frozen
    /// bits and stay IN_USE too.
    pub(crate) fn save_all_dirty_bitmaps(&self, exports_stopped: bool, backups_left: &[String]) {
        let mirrored: Vec<String> = {
            let st = self.lock();
            st.bdevs
                .iter()
                .filter(|(_, e)| {
                    e.disk.mirror_job().is_some()
                        || e.claims.iter().any(|c| c.holder_kind == crate::mirror::HOLDER_KIND)
                })
                .map(|(n, _)| n.clone())
                .collect()
        };
        for (bdev, disk) in self.disks() {
            if !exports_stopped || mirrored.contains(&bdev) || backups_left.contains(&bdev) {
                for b in disk.dirty_bitmaps().iter().filter(|b| b.persistent()) {
                    log::warn!(
                        "bdev '{bdev}': dirty bitmap '{}' left in use ({}): it will come back inconsistent",
                        b.name(),
                        if backups_left.contains(&bdev) {
                            "a backup job did not end"
                        } else if exports_stopped {
                            "a mirror job still runs on the bdev"
                        } else {
                            "an export did not stop"
                        }
                    );
                }
                continue;
            }
            self.save_dirty_bitmaps(&bdev, &disk);
        }
    }

    /// Loads the persistent bitmaps of bdev `bdev`, which just appeared, before anything can
    /// write to it: each file is checked, marked IN_USE again (synced) and added.
    pub(crate) fn load_dirty_bitmaps(&self, bdev: &str, disk: &Disk) {
        let Some(dir) = self.state_dir() else { return };
        let prefix = format!("{}.", hex(bdev));
        let Ok(entries) = fs::read_dir(dir) else {
            log::error!("state directory {}: cannot be read", dir.display());
            return;
        };
        let mut paths: Vec<PathBuf> = entries
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(SUFFIX))
            })
            .collect();
        paths.sort();
        for path in paths {
            if let Err(reason) = self.load_one(bdev, disk, &path) {
                log::error!("dirty bitmap file {}: not applied to bdev '{bdev}': {reason}", path.display());
            }
        }
    }

    fn load_one(&self, bdev: &str, disk: &Disk, path: &Path) -> Result<(), String> {
        let bytes = fs::read(path).map_err(|e| e.to_string())?;
        let file = BitmapFile::parse(&bytes).map_err(|e| e.to_string())?;
        if file.bdev != bdev {
            return Err(format!("it belongs to bdev '{}'", file.bdev.escape_debug()));
        }
        let size = disk.info().size_bytes();
        if file.size != size {
            return Err(format!("size: the file is for {} bytes, the bdev has {size}", file.size));
        }
        if file.uuid != [0; 16] && file.uuid != uuid_of(bdev) {
            return Err("uuid: the file is for another bdev of this name".into());
        }
        if file_of(self.state_dir().unwrap_or(Path::new(".")), bdev, &file.name) != path {
            return Err(format!("name: '{}' is not the one in the file name", file.name.escape_debug()));
        }
        let crashed = file.flags & FLAG_IN_USE != 0;
        let b = DirtyBitmap::new(&file.name, size, file.granularity, true, file.flags & FLAG_RECORDING != 0);
        if crashed || file.flags & FLAG_INCONSISTENT != 0 {
            b.set_inconsistent();
        } else {
            b.merge_from(&file.bits());
        }
        // IN_USE again before the disk marks it: a crash from here on is seen at the next load.
        write_atomically(path, &file_for(bdev, &b, FLAG_IN_USE)).map_err(|e| e.to_string())?;
        let name = file.name.clone();
        disk.add_dirty_bitmap(b).map_err(|e| e.to_string())?;
        if crashed {
            log::warn!(
                "bdev '{bdev}': dirty bitmap '{name}' was in use when the daemon stopped uncleanly: \
                 loaded inconsistent (the next backup from it must be a full one; remove it to go on)"
            );
        } else {
            log::info!("bdev '{bdev}': dirty bitmap '{name}' loaded");
        }
        Ok(())
    }
}
