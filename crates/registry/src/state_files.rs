//! Files of the state directory written whole, and the hex names that make any bdev or bitmap
//! name a safe file name (persistent bitmaps, backup jobs' records).

use std::fs;
use std::io::Write;
use std::path::Path;

/// `s` as hex digits: a file name part for any name.
pub(crate) fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

/// Writes `bytes` at `path` whole: a temporary file, synced, renamed over, the directory synced.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let write = || -> std::io::Result<()> {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)?;
        if let Some(dir) = path.parent() {
            fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    };
    write().inspect_err(|_| {
        let _ = fs::remove_file(&tmp);
    })
}
