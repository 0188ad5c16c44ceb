//! File-system calls `std` does not offer: the umask, `openat` relative to a directory
//! descriptor, and a rename that never replaces.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Sets the process's file-mode creation mask to `mask` and returns the previous one.
///
/// The mask is per process: set it before starting threads that create files.
pub fn set_umask(mask: u32) -> u32 {
    // SAFETY: umask takes a plain value, has no preconditions and cannot fail.
    unsafe { libc::umask(mask as libc::mode_t) as u32 }
}

fn c_string(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// Opens `name` relative to the directory `dir` (the working directory when `None`) with
/// `flags` (`O_*`), as `openat(2)` does. A file that `O_CREAT` or `O_TMPFILE` creates gets mode
/// 0: set the mode afterwards.
pub fn openat(dir: Option<BorrowedFd<'_>>, name: &OsStr, flags: libc::c_int) -> io::Result<OwnedFd> {
    let c_name = c_string(name)?;
    let dir = dir.map_or(libc::AT_FDCWD, |d| d.as_raw_fd());
    // SAFETY: `c_name` is NUL-terminated and outlives the call; `dir` is AT_FDCWD or a borrowed
    // open descriptor; the mode argument is always passed, so O_CREAT reads a valid value.
    let fd = unsafe { libc::openat(dir, c_name.as_ptr(), flags, 0 as libc::c_uint) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: openat just returned this descriptor, and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Renames `from` to `to` unless `to` exists (`EEXIST` then), with `renameat2(2)`'s
/// `RENAME_NOREPLACE`. File systems without that flag answer `EINVAL` (kernels without
/// renameat2, `ENOSYS`): the caller decides whether a plain rename will do.
pub fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    let (from_c, to_c) = (c_string(from.as_os_str())?, c_string(to.as_os_str())?);
    // SAFETY: both paths are NUL-terminated strings that outlive the call; AT_FDCWD makes them
    // relative to the working directory as rename(2) would.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            from_c.as_ptr(),
            libc::AT_FDCWD,
            to_c.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A new pipe, close-on-exec: its read end, then its write end.
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 just returned both descriptors, and nothing else owns them.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Puts the open file description of `fd` in non-blocking mode (`O_NONBLOCK`), as every
/// duplicate of it then is.
pub fn set_nonblocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: a plain fcntl call on a borrowed, open descriptor.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above; F_SETFL takes an int argument.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::fs::File;
    use std::io::Read;
    use std::os::fd::AsFd;

    use super::*;

    #[test]
    fn a_pipe_carries_bytes_from_its_write_end_to_its_read_end() {
        use std::io::Write;
        let (r, w) = pipe().unwrap();
        File::from(w).write_all(b"through").unwrap();
        let mut got = String::new();
        File::from(r).read_to_string(&mut got).unwrap();
        assert_eq!(got, "through", "the write end closed: the read ends");
    }

    #[test]
    fn set_nonblocking_makes_an_empty_read_fail_at_once() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        set_nonblocking(a.as_fd()).unwrap();
        let e = (&a).read(&mut [0u8; 1]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
    }

    #[test]
    fn umask_round_trip() {
        let old = set_umask(0o027);
        assert_eq!(set_umask(old), 0o027);
    }

    #[test]
    fn openat_opens_beneath_a_directory_and_refuses_a_symlink_with_nofollow() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("file"), b"data").unwrap();
        std::os::unix::fs::symlink(dir.path().join("file"), dir.path().join("link")).unwrap();
        let d =
            openat(None, dir.path().as_os_str(), libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC).unwrap();
        let mut text = String::new();
        File::from(openat(Some(d.as_fd()), OsStr::new("file"), libc::O_RDONLY | libc::O_CLOEXEC).unwrap())
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text, "data");
        let e = openat(Some(d.as_fd()), OsStr::new("link"), libc::O_RDONLY | libc::O_NOFOLLOW).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ELOOP));
        let e = openat(None, OsStr::new("a\0b"), libc::O_RDONLY).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn rename_noreplace_keeps_an_existing_target() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b, c) = (dir.path().join("a"), dir.path().join("b"), dir.path().join("c"));
        std::fs::write(&a, b"a").unwrap();
        std::fs::write(&b, b"b").unwrap();
        match rename_noreplace(&a, &b) {
            // tmpfs and ext4 have the flag; a file system without it cannot tell us more.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return,
            r => assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EEXIST)),
        }
        assert_eq!(std::fs::read(&b).unwrap(), b"b");
        rename_noreplace(&a, &c).unwrap();
        assert_eq!(std::fs::read(&c).unwrap(), b"a");
        assert!(!a.exists());
    }
}
