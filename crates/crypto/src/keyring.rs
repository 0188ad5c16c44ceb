//! The daemon's keyring (SPDK's `keyring_*`): named keys read from owner-only files
//! (`keyring_file_add_key`), kept for the whole daemon. Any bdev module or export asks it for a
//! key by name through [`keyring`] (NVMe/TCP TLS and DH-HMAC-CHAP will); the crypto module only
//! serves its RPC methods.
//!
//! Key material lives only in [`Zeroizing`] buffers; nothing here implements a `Debug` that
//! shows it, no error message quotes it, and `keyring_get_keys` lists names and paths only.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use fp_bdev::{BdevError, ModuleHost};
use zeroize::Zeroizing;

use crate::keys::invalid;

/// The largest key file accepted (a key, not a document).
const MAX_KEY_FILE: u64 = 4096;

/// The name the keyring is kept under among the registry's module states: one per daemon,
/// whichever module or export asks first.
const STATE: &str = "keyring";

/// The daemon's keyring, made on first use. Every caller of one registry gets the same one.
pub fn keyring(host: &dyn ModuleHost) -> Arc<Keyring> {
    let state = host.module_state(STATE, &|| Arc::new(Keyring::default()));
    state.downcast::<Keyring>().unwrap_or_else(|_| panic!("the '{STATE}' state is a Keyring"))
}

/// A key read from a file by `keyring_file_add_key`.
pub struct FileKey {
    /// The file it was read from.
    pub path: String,
    material: Zeroizing<Vec<u8>>,
}

/// The path and length only, never the key.
impl std::fmt::Debug for FileKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileKey").field("path", &self.path).field("len", &self.material.len()).finish()
    }
}

impl FileKey {
    /// Reads `path`: absolute, reached without a symlink in any component, a regular file,
    /// owner-only (`mode & 0o077 == 0`), 1 byte to 4 KiB (what is read is bounded too, not
    /// only what the file's size says). Errors name `path`.
    pub fn read(path: &str) -> Result<FileKey, BdevError> {
        if !Path::new(path).is_absolute() {
            return Err(invalid("path", "must be an absolute path"));
        }
        let mut file = open_without_symlinks(path)?;
        // The open file's own metadata: what is read is what was checked.
        let meta = file.metadata().map_err(|e| invalid("path", format!("cannot stat {path}: {e}")))?;
        if !meta.is_file() {
            return Err(invalid("path", format!("{path} is not a regular file")));
        }
        if meta.mode() & 0o077 != 0 {
            return Err(invalid(
                "path",
                format!(
                    "{path} has mode {:o}: a key file must be owner-only (chmod 600)",
                    meta.mode() & 0o777
                ),
            ));
        }
        if meta.len() == 0 || meta.len() > MAX_KEY_FILE {
            return Err(invalid(
                "path",
                format!("{path} holds {} bytes: 1 to {MAX_KEY_FILE} expected", meta.len()),
            ));
        }
        let material = read_key_material(&mut file, path)?;
        Ok(FileKey { path: path.to_string(), material })
    }

    /// The key's length in bytes.
    pub fn len(&self) -> usize {
        self.material.len()
    }

    /// Whether the key is empty (never: an empty file is refused).
    pub fn is_empty(&self) -> bool {
        self.material.is_empty()
    }

    /// Runs `f` on the key's bytes (never copied out: the caller's use ends with `f`).
    pub fn with_material<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        f(&self.material)
    }
}

/// Reads a key file's content, at most [`MAX_KEY_FILE`] bytes: a file that grew since its
/// size was checked (or whose size says less than it holds) is refused, not read to its end.
/// Errors name `path`.
pub(crate) fn read_key_material(from: &mut dyn Read, path: &str) -> Result<Zeroizing<Vec<u8>>, BdevError> {
    let mut material = Zeroizing::new(Vec::with_capacity(MAX_KEY_FILE as usize + 1));
    from.take(MAX_KEY_FILE + 1)
        .read_to_end(&mut material)
        .map_err(|e| invalid("path", format!("cannot read {path}: {e}")))?;
    match material.len() as u64 {
        0 => Err(invalid("path", format!("{path} is empty: 1 to {MAX_KEY_FILE} bytes expected"))),
        n if n > MAX_KEY_FILE => Err(invalid(
            "path",
            format!("{path} holds more than {MAX_KEY_FILE} bytes: 1 to {MAX_KEY_FILE} expected"),
        )),
        _ => Ok(material),
    }
}

/// Opens the absolute `path` for reading one component at a time from `/`, each with
/// `openat(O_NOFOLLOW)` (directories as `O_PATH`): a symlink anywhere in the path, a
/// directory's included, is refused rather than followed (what `openat2`'s
/// `RESOLVE_NO_SYMLINKS` does, with calls every kernel allows). `..` steps back to the
/// directory already opened, never through a link. The file is opened non-blocking, so a FIFO
/// put there does not hang the call (it is then refused as not a regular file).
fn open_without_symlinks(path: &str) -> Result<std::fs::File, BdevError> {
    use std::os::fd::AsFd;
    use std::path::Component;
    let cannot = |e: std::io::Error| invalid("path", format!("cannot open {path}: {e}"));
    let names: Vec<&std::ffi::OsStr> = Path::new(path)
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n),
            Component::ParentDir => Some(std::ffi::OsStr::new("..")),
            _ => None,
        })
        .collect();
    let Some((last, dirs)) = names.split_last() else {
        return Err(invalid("path", format!("{path} names no file")));
    };
    let dir_flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    let mut dir = fp_sys::openat(None, std::ffi::OsStr::new("/"), dir_flags).map_err(cannot)?;
    let mut walked = std::path::PathBuf::from("/");
    let symlink = |walked: &Path, e: std::io::Error| {
        // ELOOP (the last component) or ENOTDIR (a directory's): say which when it is a link.
        if walked.symlink_metadata().is_ok_and(|m| m.file_type().is_symlink()) {
            invalid(
                "path",
                format!(
                    "{path}: {} is a symbolic link; key files are not read through one",
                    walked.display()
                ),
            )
        } else {
            cannot(e)
        }
    };
    for name in dirs {
        walked.push(name);
        dir = fp_sys::openat(Some(dir.as_fd()), name, dir_flags).map_err(|e| symlink(&walked, e))?;
    }
    walked.push(last);
    let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK;
    let fd = fp_sys::openat(Some(dir.as_fd()), last, flags).map_err(|e| symlink(&walked, e))?;
    Ok(std::fs::File::from(fd))
}

/// Named file keys, one set per daemon ([`keyring`]).
#[derive(Default)]
pub struct Keyring {
    keys: Mutex<BTreeMap<String, Arc<FileKey>>>,
}

impl Keyring {
    /// Adds a keyring file key; refuses a name taken.
    pub fn add_file_key(&self, name: &str, key: FileKey) -> Result<(), BdevError> {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        if keys.contains_key(name) {
            return Err(invalid("name", format!("a key named '{name}' is in the keyring")));
        }
        keys.insert(name.to_string(), Arc::new(key));
        Ok(())
    }

    /// Removes a keyring file key. A holder of it (from [`Keyring::key`]) keeps its copy
    /// until it lets go, as SPDK's keyring keeps a removed key for its users.
    pub fn remove_file_key(&self, name: &str) -> Result<(), BdevError> {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        keys.remove(name)
            .map(drop)
            .ok_or_else(|| invalid("name", format!("no key named '{name}' in the keyring")))
    }

    /// The key `name`, for whoever needs one (field `key` in the error).
    pub fn key(&self, name: &str) -> Result<Arc<FileKey>, BdevError> {
        let keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        keys.get(name).cloned().ok_or_else(|| invalid("key", format!("no key named '{name}' in the keyring")))
    }

    /// Each key's name and the file it was read from, by name.
    pub fn list(&self) -> Vec<(String, String)> {
        let keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        keys.iter().map(|(name, k)| (name.clone(), k.path.clone())).collect()
    }
}
