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
#[derive(Debug, Clone, PartialEq, Eq)]
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
        let text = match std::fs::read(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let loaded = parse(&text, &self.identity, chunks).map_err(|why| {
            std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{}: {why}", self.path.display()))
        })?;
        if loaded.is_none() {
            log::warn!(
                "{}: another restore's state; this one starts from the beginning",
                self.path.display()
            );
        }
        Ok(loaded)
    }

    /// Removes the file (and a temporary one a crash left), durably: the folder is synced, so a
    /// crash after it does not bring the file back. A missing file is no error.
    pub fn remove(&self) -> std::io::Result<()> {
        for path in [self.path.with_extension("json.tmp"), self.path.clone()] {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        if let Some(dir) = self.path.parent() {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    }

    /// Replaces the file: `bitmap` (durable chunks), `complete`.
    pub fn save(&self, chunks: u64, bitmap: &[u8], complete: bool) -> std::io::Result<()> {
        let body = encode(&self.identity, chunks, bitmap, complete);
        let tmp = self.path.with_extension("json.tmp");
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&body)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, &self.path)?;
        if let Some(dir) = self.path.parent() {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    }
}

/// A state file's bytes: `bitmap` (bit `i % 8` of byte `i / 8`: chunk `i` is durable).
pub fn encode(id: &Identity, chunks: u64, bitmap: &[u8], complete: bool) -> Vec<u8> {
    let body = json!({
        "version": VERSION,
        "name": id.name, "store": id.store, "bdev": id.disk, "backup_id": id.backup_id,
        "size": id.size, "chunks": chunks, "complete": complete, "restored": hex(bitmap),
    });
    body.to_string().into_bytes()
}

/// Parses a state file's bytes (whatever a crash or another hand left): `Ok(None)` when it is
/// another restore's (another identity or chunk count), an error when it is not a state file
/// of this version; the bitmap returned holds exactly `chunks` bits' bytes.
pub fn parse(bytes: &[u8], identity: &Identity, chunks: u64) -> Result<Option<Loaded>, String> {
    let v: Value = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    if v["version"].as_u64() != Some(VERSION) {
        return Err("not a version 1 restore state file".into());
    }
    let id = identity;
    let same = v["name"] == id.name.as_str()
        && v["store"] == id.store.as_str()
        && v["bdev"] == id.disk.as_str()
        && v["backup_id"] == id.backup_id.as_str()
        && v["size"].as_u64() == Some(id.size)
        && v["chunks"].as_u64() == Some(chunks);
    if !same {
        return Ok(None);
    }
    let bitmap = v["restored"].as_str().and_then(unhex).ok_or("restored is not hex")?;
    if bitmap.len() as u64 != chunks.div_ceil(8) {
        return Err("restored has the wrong length".into());
    }
    if !chunks.is_multiple_of(8) && bitmap.last().is_some_and(|b| b >> (chunks % 8) != 0) {
        return Err("restored marks chunks past the end".into());
    }
    let complete = match &v["complete"] {
        Value::Bool(b) => *b,
        _ => return Err("complete is not true or false".into()),
    };
    Ok(Some(Loaded { bitmap, complete }))
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
        f.remove().unwrap();
        assert!(f.load(10).unwrap().is_none() && !f.path().exists());
        f.remove().unwrap();
    }
}
