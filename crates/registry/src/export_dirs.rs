//! Export directories: where the files behind file-backed (uring) bdevs may be.
//!
//! Without them the daemon opens any path its user can. With them, a path is first resolved
//! (`realpath`: symlinks followed, `.` and `..` applied) and must then lie inside one of the
//! directories, compared component by component so `/srv/disks2` is not inside `/srv/disks`.
//!
//! A check on the resolved path alone would leave a race: between the check and the open,
//! whoever may write inside an export directory could replace a directory on the path with a
//! symlink to `/etc`. So the file is not opened by that path. The export directory is opened,
//! then each component of the resolved path below it with `openat(O_NOFOLLOW)`, directories as
//! `O_PATH`: a component that has become a symlink since the check fails to open instead of
//! being followed, and `..` never occurs in a resolved path. That is what `openat2`'s
//! `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS` does, done with calls every kernel and seccomp
//! profile allows.
//!
//! The export directories themselves, and the directories above them, are the operator's and
//! are trusted; so are mounts inside them. A hard link inside an export directory is a file of
//! that directory (the kernel's `protected_hardlinks` keeps users from linking files they could
//! not open themselves).

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

/// An export directory that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("{}: {source}", path.display())]
pub struct ExportDirError {
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

/// The directories file-backed bdevs may be opened from. See the module docs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportDirs {
    /// Each directory as configured, made absolute, and as resolved.
    dirs: Vec<(PathBuf, PathBuf)>,
}

/// A path found inside an export directory, ready to be opened.
#[derive(Debug)]
pub struct Beneath {
    root: PathBuf,
    /// The resolved path below `root`: plain names only.
    rel: PathBuf,
}

/// Why a path may not be opened.
#[derive(Debug)]
pub enum Refusal {
    /// It leads outside every export directory.
    Outside,
    /// It could not be resolved (it does not exist, say) though it names a place inside one.
    Unresolved(io::Error),
}

impl ExportDirs {
    /// Resolves each directory; each must exist and be a directory. An empty list allows no
    /// path at all.
    pub fn new(dirs: &[PathBuf]) -> Result<ExportDirs, ExportDirError> {
        let resolve = |dir: &PathBuf| {
            let err = |source| ExportDirError { path: dir.clone(), source };
            let real = std::fs::canonicalize(dir).map_err(err)?;
            if !std::fs::metadata(&real).map_err(err)?.is_dir() {
                return Err(err(io::Error::from_raw_os_error(libc::ENOTDIR)));
            }
            Ok((lexical_absolute(dir).map_err(err)?, real))
        };
        Ok(ExportDirs { dirs: dirs.iter().map(resolve).collect::<Result<_, _>>()? })
    }

    /// The directories as resolved.
    pub fn resolved(&self) -> impl Iterator<Item = &Path> {
        self.dirs.iter().map(|(_, real)| real.as_path())
    }

    /// Where `requested` leads, if that is inside an export directory.
    pub fn locate(&self, requested: &Path) -> Result<Beneath, Refusal> {
        let real = match std::fs::canonicalize(requested) {
            Ok(real) => real,
            // Nothing to resolve: say "outside" unless the path as written is inside, so the
            // answer for a path outside does not tell whether it exists.
            Err(e) => {
                let written = lexical_absolute(requested).map_err(Refusal::Unresolved)?;
                let inside = self
                    .dirs
                    .iter()
                    .any(|(given, real)| written.starts_with(given) || written.starts_with(real));
                return Err(if inside { Refusal::Unresolved(e) } else { Refusal::Outside });
            }
        };
        let (root, rel) = self
            .dirs
            .iter()
            .find_map(|(_, root)| real.strip_prefix(root).ok().map(|rel| (root, rel)))
            .ok_or(Refusal::Outside)?;
        Ok(Beneath { root: root.clone(), rel: rel.to_path_buf() })
    }
}

impl Beneath {
    /// Opens the file read-write (with `O_DIRECT` when `direct`) without following any symlink
    /// below the export directory. See the module docs.
    pub fn open(&self, direct: bool) -> io::Result<File> {
        let mut names = Vec::new();
        for c in self.rel.components() {
            match c {
                Component::Normal(name) => names.push(name),
                // A resolved path has no others; refuse rather than interpret one.
                _ => return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a resolved path")),
            }
        }
        let Some((file_name, dirs)) = names.split_last() else {
            return Err(io::Error::from_raw_os_error(libc::EISDIR));
        };
        let path_only = libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC;
        let mut dir = fp_sys::openat(None, self.root.as_os_str(), path_only)?;
        for name in dirs {
            dir = fp_sys::openat(Some(dir.as_fd()), name, path_only | libc::O_NOFOLLOW).map_err(changed)?;
            // O_PATH | O_NOFOLLOW on a symlink would open the link itself; make sure it did not.
            let meta = File::from(dir.try_clone()?).metadata()?;
            if !meta.is_dir() {
                return Err(changed(io::Error::from_raw_os_error(libc::ENOTDIR)));
            }
        }
        let direct = if direct { libc::O_DIRECT } else { 0 };
        let file = fp_sys::openat(
            Some(dir.as_fd()),
            file_name,
            libc::O_RDWR | libc::O_NOFOLLOW | libc::O_CLOEXEC | direct,
        )
        .map_err(changed)?;
        Ok(File::from(file))
    }
}

/// A component that was a plain directory or file when the path was resolved is now a symlink
/// (ELOOP, or ENOTDIR where a directory was expected): say so instead of the bare errno.
fn changed(e: io::Error) -> io::Error {
    match e.raw_os_error() {
        Some(libc::ELOOP) | Some(libc::ENOTDIR) => {
            io::Error::new(e.kind(), format!("it changed while being opened (now a symlink): {e}"))
        }
        _ => e,
    }
}

/// `path` made absolute against the working directory, `.` and `..` applied as text.
fn lexical_absolute(path: &Path) -> io::Result<PathBuf> {
    let mut out = PathBuf::new();
    for c in std::path::absolute(path)?.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    Ok(out)
}

/// The device and inode of an open file, to tell whether two opens reached the same file.
pub(crate) fn file_id(file: &File) -> io::Result<(u64, u64)> {
    let meta = file.metadata()?;
    Ok((meta.dev(), meta.ino()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A temporary directory, resolved, holding each of `dirs` with a small file `file` in it.
    fn tree(dirs: &[&str], file: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        for d in dirs {
            std::fs::create_dir_all(root.join(d)).unwrap();
            std::fs::write(root.join(d).join(file), b"x").unwrap();
        }
        (dir, root)
    }

    #[test]
    fn walk_refuses_a_symlink_in_any_component() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::create_dir(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/disk.img"), [0u8; 4096]).unwrap();
        std::os::unix::fs::symlink(root.join("sub"), root.join("link")).unwrap();
        std::os::unix::fs::symlink(root.join("sub/disk.img"), root.join("sub/alias.img")).unwrap();
        let open = |rel: &str| Beneath { root: root.clone(), rel: rel.into() }.open(false);
        open("sub/disk.img").unwrap();
        // What a swap after the check would leave: a symlink where a directory or the file was.
        for rel in ["link/disk.img", "sub/alias.img", "link"] {
            let e = open(rel).unwrap_err();
            assert!(e.to_string().contains("changed while being opened"), "{rel}: {e}");
        }
        for rel in ["sub/../sub/disk.img", "./sub/disk.img"] {
            assert_eq!(open(rel).unwrap_err().kind(), io::ErrorKind::InvalidInput, "{rel}");
        }
        assert_eq!(open("").unwrap_err().raw_os_error(), Some(libc::EISDIR));
    }

    /// The race the walk exists for: the path is checked, then a directory on it is swapped for
    /// a symlink to a directory outside holding a file of the same name.
    #[test]
    fn a_swap_after_the_check_cannot_escape() {
        let (_dir, root) = tree(&["exports/sub", "outside"], "disk.img");
        let exports = ExportDirs::new(&[root.join("exports")]).unwrap();
        let checked = exports.locate(&root.join("exports/sub/disk.img")).unwrap();
        checked.open(false).unwrap();
        std::fs::rename(root.join("exports/sub"), root.join("exports/old")).unwrap();
        std::os::unix::fs::symlink(root.join("outside"), root.join("exports/sub")).unwrap();
        let e = checked.open(false).unwrap_err();
        assert!(e.to_string().contains("changed while being opened"), "{e}");
        // Checked afresh, the path is now outside.
        assert!(matches!(exports.locate(&root.join("exports/sub/disk.img")), Err(Refusal::Outside)));
    }

    #[test]
    fn locate_compares_whole_components() {
        let (_dir, root) = tree(&["disks", "disks2"], "a.img");
        let exports = ExportDirs::new(&[root.join("disks")]).unwrap();
        assert_eq!(exports.locate(&root.join("disks/a.img")).unwrap().rel, Path::new("a.img"));
        assert!(matches!(exports.locate(&root.join("disks2/a.img")), Err(Refusal::Outside)));
        // Missing: inside says why, outside only says outside.
        assert!(matches!(exports.locate(&root.join("disks/none.img")), Err(Refusal::Unresolved(_))));
        assert!(matches!(exports.locate(&root.join("disks2/none.img")), Err(Refusal::Outside)));
        assert!(matches!(exports.locate(&root.join("disks/../disks2/none.img")), Err(Refusal::Outside)));
    }

    #[test]
    fn export_dirs_must_be_existing_directories() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        let e = ExportDirs::new(std::slice::from_ref(&file)).unwrap_err();
        assert_eq!(e.source.raw_os_error(), Some(libc::ENOTDIR), "{e}");
        let e = ExportDirs::new(&[dir.path().join("missing")]).unwrap_err();
        assert!(e.to_string().starts_with(&format!("{}: ", dir.path().join("missing").display())), "{e}");
        assert_eq!(ExportDirs::new(&[]).unwrap().resolved().count(), 0);
    }
}
