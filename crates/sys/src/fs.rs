//! File-system calls `std` does not offer: the umask, `openat` relative to a directory
//! descriptor, a rename that never replaces, anonymous memory files; and the two steps every
//! call of this crate shares: [`cvt`] (a -1 return is `errno`) and [`owned_fd`] (a new
//! descriptor becomes an `OwnedFd`).

use std::ffi::{CStr, CString, OsStr};
use std::fs::File;
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

/// A libc return value as a result: a negative one (-1) means the call failed and set the
/// thread's `errno`.
#[inline]
pub(crate) fn cvt<T: Default + PartialOrd>(ret: T) -> io::Result<T> {
    if ret < T::default() {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Takes ownership of the descriptor a call that creates one (`openat`, `eventfd`, an ioctl
/// returning a new fd, ...) returned, or its `errno` when it returned -1.
///
/// # Safety
/// A non-negative `fd` is a descriptor the call just created: open, and owned by nothing else.
pub(crate) unsafe fn owned_fd(fd: libc::c_int) -> io::Result<OwnedFd> {
    let fd = cvt(fd)?;
    // SAFETY: as the caller promises.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
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
    // openat returns a new descriptor or -1.
    unsafe { owned_fd(libc::openat(dir, c_name.as_ptr(), flags, 0 as libc::c_uint)) }
}

/// Renames `from` to `to` unless `to` exists (`EEXIST` then), with `renameat2(2)`'s
/// `RENAME_NOREPLACE`. File systems without that flag answer `EINVAL` (kernels without
/// renameat2, `ENOSYS`): the caller decides whether a plain rename will do.
pub fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    let (from_c, to_c) = (c_string(from.as_os_str())?, c_string(to.as_os_str())?);
    // SAFETY: both paths are NUL-terminated strings that outlive the call; AT_FDCWD makes them
    // relative to the working directory as rename(2) would.
    cvt(unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            from_c.as_ptr(),
            libc::AT_FDCWD,
            to_c.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    })
    .map(drop)
}

/// A new pipe, close-on-exec: its read end, then its write end.
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [-1; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes; on success both are new and
    // nothing else owns them (on failure neither is written and the first error returns).
    unsafe {
        cvt(libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC))?;
        Ok((owned_fd(fds[0])?, owned_fd(fds[1])?))
    }
}

/// A new anonymous memory file (`memfd_create(2)`, close-on-exec) named `name` for
/// `/proc/PID/fd`: memory to share with another process by passing its descriptor.
pub fn memfd(name: &CStr) -> io::Result<File> {
    // SAFETY: `name` is NUL-terminated and outlives the call; memfd_create returns a new
    // descriptor or -1.
    unsafe { owned_fd(libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC)) }.map(File::from)
}

/// Puts the open file description of `fd` in non-blocking mode (`O_NONBLOCK`), as every
/// duplicate of it then is.
pub fn set_nonblocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    let fcntl = |cmd, arg: libc::c_int| {
        // SAFETY: F_GETFL and F_SETFL take an int argument (F_GETFL ignores it) and touch no
        // memory of ours; the descriptor is borrowed, open.
        cvt(unsafe { libc::fcntl(fd.as_raw_fd(), cmd, arg) })
    };
    let flags = fcntl(libc::F_GETFL, 0)?;
    fcntl(libc::F_SETFL, flags | libc::O_NONBLOCK).map(drop)
}

#[cfg(test)]
mod tests {
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
    fn a_memfd_holds_what_is_written_and_closes_on_exec() {
        use std::io::{Seek, Write};
        let mut f = memfd(c"fp-sys-test").unwrap();
        f.write_all(b"in memory").unwrap();
        f.rewind().unwrap();
        let mut got = String::new();
        f.read_to_string(&mut got).unwrap();
        assert_eq!(got, "in memory");
        // SAFETY: F_GETFD on an open descriptor this test owns.
        let flags = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETFD) };
        assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
        assert!(std::fs::read_link(format!("/proc/self/fd/{}", f.as_raw_fd()))
            .unwrap()
            .to_string_lossy()
            .contains("memfd:fp-sys-test"));
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
