//! A live restore's state file, `<state_dir>/backup_restore/<name>.json`: which backup it
//! restores (the identity a restart must match) and which chunks are on the base for good.
//! Written whole, atomically: a temporary file, fsync, rename over the old one, fsync of the
//! directory; a crash leaves the old file or the new one, never a mix.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

/// The format's version.
const VERSION: u64 = 1;

/// What a state file must match to be taken up by a create: the same restore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The restore bdev's name.
    pub name: String,
    /// The store's name.
    pub store: String,
    /// The backed-up disk's name.
    pub disk: String,
    /// The backup's id.
    pub backup_id: String,
    /// The disk's size in bytes.
    pub size: u64,
}

/// The file of one restore.
pub struct StateFile {
    path: PathBuf,
    identity: Identity,
}

/// What a loaded file says: the durable chunks (a bitmap) and whether it was complete.
pub struct Loaded {
    /// Bit `i % 8` of byte `i / 8`: chunk `i` is on the base.
    pub bitmap: Vec<u8>,
    /// Every chunk was.
    pub complete: bool,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
}

impl StateFile {
    /// The file of restore `identity` in `state_dir` (its folder is made when missing).
    pub fn new(state_dir: &Path, identity: Identity) -> std::io::Result<StateFile> {
        let dir = state_dir.join("backup_restore");
        std::fs::create_dir_all(&dir)?;
        let path = dir.join(format!("{}.json", identity.name));
        Ok(StateFile { path, identity })
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's content when it is this restore's (same identity, `chunks` chunks); `None`
    /// when there is no file or it is another restore's (which the first save replaces).
    pub fn load(&self, chunks: u64) -> std::io::Result<Option<Loaded>> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let bad = |why: &str| {
            std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{}: {why}", self.path.display()))
        };
        let v: Value = serde_json::from_str(&text).map_err(|e| bad(&e.to_string()))?;
        if v["version"].as_u64() != Some(VERSION) {
            return Err(bad("unknown version"));
        }
        let id = &self.identity;
        let same = v["name"] == id.name.as_str()
            && v["store"] == id.store.as_str()
            && v["bdev"] == id.disk.as_str()
            && v["backup_id"] == id.backup_id.as_str()
            && v["size"].as_u64() == Some(id.size)
            && v["chunks"].as_u64() == Some(chunks);
        if !same {
            log::warn!(
                "{}: another restore's state; this one starts from the beginning",
                self.path.display()
            );
            return Ok(None);
        }
        let bitmap = v["restored"].as_str().and_then(unhex).ok_or_else(|| bad("restored is not hex"))?;
        if bitmap.len() as u64 != chunks.div_ceil(8) {
            return Err(bad("restored has the wrong length"));
        }
        Ok(Some(Loaded { bitmap, complete: v["complete"].as_bool().unwrap_or(false) }))
    }

    /// Replaces the file: `bitmap` (durable chunks), `complete`.
    pub fn save(&self, chunks: u64, bitmap: &[u8], complete: bool) -> std::io::Result<()> {
        let id = &self.identity;
        let body = json!({
            "version": VERSION,
            "name": id.name, "store": id.store, "bdev": id.disk, "backup_id": id.backup_id,
            "size": id.size, "chunks": chunks, "complete": complete, "restored": hex(bitmap),
        });
        let tmp = self.path.with_extension("json.tmp");
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(body.to_string().as_bytes())?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, &self.path)?;
        if let Some(dir) = self.path.parent() {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    }

    /// Removes the file (a deleted restore's).
    pub fn remove(&self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(id: &str) -> Identity {
        Identity {
            name: "r".into(),
            store: "s".into(),
            disk: "vm".into(),
            backup_id: id.into(),
            size: 10 << 16,
        }
    }

    #[test]
    fn a_saved_state_loads_back_for_the_same_restore_only() {
        let dir = tempfile::tempdir().unwrap();
        let f = StateFile::new(dir.path(), identity("a")).unwrap();
        assert!(f.load(10).unwrap().is_none());
        f.save(10, &[0b101, 0b10], false).unwrap();
        let l = f.load(10).unwrap().unwrap();
        assert_eq!((l.bitmap, l.complete), (vec![0b101, 0b10], false));
        let other = StateFile::new(dir.path(), identity("b")).unwrap();
        assert!(other.load(10).unwrap().is_none());
        assert!(f.load(11).unwrap().is_none());
        f.save(10, &[0xff, 0x03], true).unwrap();
        assert!(f.load(10).unwrap().unwrap().complete);
    }
}
