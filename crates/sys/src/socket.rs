//! Socket options and shutdown on descriptors `std`'s socket types do not own, non-blocking
//! receives and vectored sends on them (a poller's socket), and a send with descriptors
//! attached (`SCM_RIGHTS`), which `std` has no stable call for.

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// Receives into `buf` without waiting (`MSG_DONTWAIT`): `Ok(0)` is the end of the stream, a
/// socket with nothing to read fails with `WouldBlock`.
pub fn recv_nonblocking(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for writes of its length; the descriptor is borrowed, open.
    let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Copies what is queued on `fd` into `buf` without consuming it (`MSG_PEEK`) or waiting
/// (`MSG_DONTWAIT`): `Ok(0)` is the end of the stream, nothing queued fails with `WouldBlock`.
pub fn peek_nonblocking(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for writes of its length; the descriptor is borrowed, open.
    let n = unsafe {
        libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_PEEK | libc::MSG_DONTWAIT)
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Receives into `bufs` in one vectored read without waiting (`recvmsg`, `MSG_DONTWAIT`):
/// `Ok(0)` is the end of the stream, a socket with nothing to read fails with `WouldBlock`. An
/// NVMe/TCP host receives a PDU's data straight into the caller's buffers this way, with its
/// staging buffer last to take the headers that follow.
pub fn recv_vectored_nonblocking(fd: BorrowedFd<'_>, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
    // SAFETY: IoSliceMut is guaranteed ABI-compatible with iovec on Unix; the view lives no
    // longer than the borrow of `bufs`.
    let iov: &[libc::iovec] = unsafe { std::slice::from_raw_parts(bufs.as_ptr().cast(), bufs.len()) };
    // SAFETY: the iovecs are the caller's exclusive slices, writable for the call.
    unsafe { recv_iovecs_nonblocking(fd, iov) }
}

/// [`recv_vectored_nonblocking`] into raw iovecs: for buffers described by address and length
/// (a request's guest or bdev memory) rather than borrowed slices.
///
/// # Safety
/// Every iovec describes memory valid for writes for the call's duration.
pub unsafe fn recv_iovecs_nonblocking(fd: BorrowedFd<'_>, iov: &[libc::iovec]) -> io::Result<usize> {
    // SAFETY: an all-zero msghdr is a valid empty one.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = iov.len() as _;
    // SAFETY: `msg` describes buffers the caller vouches are writable for the call's duration,
    // on a borrowed, open descriptor; the kernel only writes through the iovecs, never to them.
    let n = unsafe { libc::recvmsg(fd.as_raw_fd(), &mut msg, libc::MSG_DONTWAIT) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Fills `iov` with the bytes of `pieces` that follow the first `skip` (those a vectored send
/// already took), leaving out empty pieces; returns how many entries it filled, at most
/// `iov.len()`. A poller's replies, each a few pieces (header, data, digest), go out this way.
pub fn gather<'a>(
    pieces: impl IntoIterator<Item = &'a [u8]>,
    mut skip: usize,
    iov: &mut [IoSlice<'a>],
) -> usize {
    let mut n = 0;
    for piece in pieces {
        if n == iov.len() {
            break;
        }
        if skip >= piece.len() {
            skip -= piece.len();
            continue;
        }
        iov[n] = IoSlice::new(&piece[skip..]);
        skip = 0;
        n += 1;
    }
    n
}

/// Sends `bufs` in one vectored write without waiting (`MSG_DONTWAIT`) and without SIGPIPE
/// when the peer is gone (`MSG_NOSIGNAL`: an `EPIPE` error instead); a full socket fails with
/// `WouldBlock`.
pub fn send_vectored_nonblocking(fd: BorrowedFd<'_>, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
    // SAFETY: IoSlice is guaranteed ABI-compatible with iovec on Unix; the view lives no
    // longer than the borrow of `bufs`.
    let iov: &[libc::iovec] = unsafe { std::slice::from_raw_parts(bufs.as_ptr().cast(), bufs.len()) };
    // SAFETY: the iovecs are the caller's borrowed slices, readable for the call.
    unsafe { send_iovecs_nonblocking(fd, iov) }
}

/// [`send_vectored_nonblocking`] from raw iovecs: for buffers described by address and length
/// (a request's bdev memory, a client's queued headers) rather than borrowed slices.
///
/// # Safety
/// Every iovec describes memory valid for reads for the call's duration.
pub unsafe fn send_iovecs_nonblocking(fd: BorrowedFd<'_>, iov: &[libc::iovec]) -> io::Result<usize> {
    // SAFETY: an all-zero msghdr is a valid empty one.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = iov.len() as _;
    // SAFETY: `msg` describes buffers the caller vouches are readable for the call's duration,
    // on a borrowed, open descriptor.
    let n = unsafe { libc::sendmsg(fd.as_raw_fd(), &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Shuts down both directions of the socket `fd`: a thread blocked reading or writing any
/// duplicate of it returns at once.
pub fn shutdown(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: a plain call on a borrowed, open descriptor.
    if unsafe { libc::shutdown(fd.as_raw_fd(), libc::SHUT_RDWR) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Asks for a send buffer of `bytes` on the socket `fd` (`SO_SNDBUF`; the kernel doubles it for
/// its bookkeeping and caps it at `net.core.wmem_max`).
pub fn set_send_buffer(fd: BorrowedFd<'_>, bytes: libc::c_int) -> io::Result<()> {
    // SAFETY: a valid option value of the size given, on a borrowed, open descriptor.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&bytes as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod gather_tests {
    use super::*;

    #[test]
    fn gather_skips_what_was_sent_and_empty_pieces() {
        let (a, b, c) = (&b"abc"[..], &b""[..], &b"defg"[..]);
        let mut iov = [IoSlice::new(&[]); 4];
        assert_eq!(gather([a, b, c], 0, &mut iov), 2);
        assert_eq!((&*iov[0], &*iov[1]), (&b"abc"[..], &b"defg"[..]));
        assert_eq!(gather([a, b, c], 4, &mut iov), 1);
        assert_eq!(&*iov[0], b"efg");
        assert_eq!(gather([a, b, c], 7, &mut iov), 0);
        let mut one = [IoSlice::new(&[]); 1];
        assert_eq!(gather([a, c], 1, &mut one), 1);
        assert_eq!(&*one[0], b"bc");
    }

    #[test]
    fn vectored_receive_fills_the_pieces_in_order() {
        use std::io::Write;
        use std::os::fd::AsFd;
        let (a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
        let (mut x, mut y) = ([0u8; 3], [0u8; 8]);
        let mut bufs = [IoSliceMut::new(&mut x), IoSliceMut::new(&mut y)];
        let e = recv_vectored_nonblocking(a.as_fd(), &mut bufs).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        b.write_all(b"abcdefg").unwrap();
        assert_eq!(recv_vectored_nonblocking(a.as_fd(), &mut bufs).unwrap(), 7);
        assert_eq!((&x, &y[..4]), (b"abc", &b"defg"[..]));
        drop(b);
        assert_eq!(recv_vectored_nonblocking(a.as_fd(), &mut [IoSliceMut::new(&mut x)]).unwrap(), 0);
    }

    #[test]
    fn raw_iovecs_go_out_and_come_in_in_order() {
        use std::os::fd::AsFd;
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let (head, tail) = (*b"NBD", *b"-reply");
        let out = [
            libc::iovec { iov_base: head.as_ptr() as *mut libc::c_void, iov_len: head.len() },
            libc::iovec { iov_base: tail.as_ptr() as *mut libc::c_void, iov_len: tail.len() },
        ];
        // SAFETY: both iovecs describe the arrays above, alive for the call.
        assert_eq!(unsafe { send_iovecs_nonblocking(b.as_fd(), &out) }.unwrap(), 9);
        let (mut x, mut y) = ([0u8; 4], [0u8; 8]);
        let into = [
            libc::iovec { iov_base: x.as_mut_ptr().cast(), iov_len: x.len() },
            libc::iovec { iov_base: y.as_mut_ptr().cast(), iov_len: y.len() },
        ];
        // SAFETY: both iovecs describe the arrays above, writable and alive for the call.
        assert_eq!(unsafe { recv_iovecs_nonblocking(a.as_fd(), &into) }.unwrap(), 9);
        assert_eq!((&x, &y[..5]), (b"NBD-", &b"reply"[..]));
        // SAFETY: as above.
        let e = unsafe { recv_iovecs_nonblocking(a.as_fd(), &into) }.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        drop(a);
        // SAFETY: as above; the peer is gone, so the send fails with EPIPE instead of a SIGPIPE.
        let e = unsafe { send_iovecs_nonblocking(b.as_fd(), &out) }.unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPIPE));
    }
}

/// Sets the priority of the packets the socket `fd` sends (`SO_PRIORITY`: 0 to 6 for anyone,
/// higher with `CAP_NET_ADMIN`), which queueing disciplines and NICs may act on.
pub fn set_priority(fd: BorrowedFd<'_>, priority: libc::c_int) -> io::Result<()> {
    // SAFETY: a valid option value of the size given, on a borrowed, open descriptor.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PRIORITY,
            (&priority as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Most descriptors [`send_with_fds`] attaches to one message (vhost-user's own limit is 8).
pub const MAX_SEND_FDS: usize = 8;

/// Sends `bytes` on the connected Unix socket `sock` as one message with the descriptors `fds`
/// attached (`SCM_RIGHTS`); returns the bytes sent. Fails with `EINVAL` for more than
/// [`MAX_SEND_FDS`] descriptors or an empty `bytes`.
pub fn send_with_fds(sock: BorrowedFd<'_>, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<usize> {
    if fds.len() > MAX_SEND_FDS || bytes.is_empty() {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let raw: Vec<libc::c_int> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let fd_bytes = std::mem::size_of_val(raw.as_slice());
    // u64 words keep the control buffer aligned for `cmsghdr`.
    let mut control = [0u64; 8];
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(fd_bytes as u32) } as usize;
    let mut iov = libc::iovec { iov_base: bytes.as_ptr() as *mut libc::c_void, iov_len: bytes.len() };
    // SAFETY: an all-zero msghdr is a valid empty one.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !raw.is_empty() {
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: `control` holds `space` bytes (8 descriptors need 56 of its 64), so the first
        // header and its data lie inside it; the data is `fd_bytes` long.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(fd_bytes as u32) as _;
            std::ptr::copy_nonoverlapping(raw.as_ptr().cast::<u8>(), libc::CMSG_DATA(c), fd_bytes);
        }
    }
    // SAFETY: `msg` points at `iov` (over `bytes`) and `control`, all alive for the call.
    let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Receives into `data` from the Unix socket `sock` without waiting (`MSG_DONTWAIT`), leaving
/// the message queued if `peek`, with the descriptors attached to it (`SCM_RIGHTS`, installed
/// close-on-exec; Linux installs even peeked descriptors as new ones). Room is made for
/// [`MAX_SEND_FDS`] descriptors, so a peer attaching more than one is noticed (and all of them
/// closed with the result) rather than truncated.
pub fn recv_with_fds(sock: BorrowedFd<'_>, data: &mut [u8], peek: bool) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut iov = libc::iovec { iov_base: data.as_mut_ptr().cast(), iov_len: data.len() };
    // u64 words keep the control buffer aligned for `cmsghdr`.
    let mut control = [0u64; 8];
    // SAFETY: an all-zero msghdr is a valid empty one.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    let flags = libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC | if peek { libc::MSG_PEEK } else { 0 };
    // SAFETY: `msg` points to live buffers of the lengths it declares, on a borrowed, open
    // descriptor.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, flags) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut fds = Vec::new();
    // SAFETY: `msg` was filled by recvmsg; the CMSG macros walk its control buffer within the
    // length the kernel reported.
    let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    while !cmsg.is_null() {
        // SAFETY: a non-null header from CMSG_FIRSTHDR/NXTHDR lies inside the control buffer.
        let c = unsafe { &*cmsg };
        if c.cmsg_level == libc::SOL_SOCKET && c.cmsg_type == libc::SCM_RIGHTS {
            // SAFETY: CMSG_LEN only computes a size; CMSG_LEN(0) is the header's.
            let payload = c.cmsg_len as usize - unsafe { libc::CMSG_LEN(0) } as usize;
            for i in 0..payload / std::mem::size_of::<libc::c_int>() {
                // SAFETY: CMSG_DATA points at `payload` bytes of descriptors, read unaligned.
                let raw =
                    unsafe { std::ptr::read_unaligned((libc::CMSG_DATA(cmsg) as *const libc::c_int).add(i)) };
                // SAFETY: the kernel just installed this descriptor for us; nobody else owns it.
                fds.push(unsafe { OwnedFd::from_raw_fd(raw) });
            }
        }
        // SAFETY: as above.
        cmsg = unsafe { libc::CMSG_NXTHDR(&msg, cmsg) };
    }
    Ok((n as usize, fds))
}

/// Whether `fd` is an `AF_UNIX` `SOCK_STREAM` socket (a peer may send any descriptor).
pub fn is_unix_stream(fd: BorrowedFd<'_>) -> bool {
    let get = |opt| {
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `v` and `len` are valid for getsockopt to write an int into.
        let r = unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&mut v as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        (r == 0).then_some(v)
    };
    get(libc::SO_DOMAIN) == Some(libc::AF_UNIX) && get(libc::SO_TYPE) == Some(libc::SOCK_STREAM)
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    use super::*;

    #[test]
    fn shutdown_ends_the_peer_and_a_duplicate() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let mut dup = a.try_clone().unwrap();
        shutdown(a.as_fd()).unwrap();
        let mut buf = [0u8; 1];
        assert_eq!(b.read(&mut buf).unwrap(), 0);
        assert_eq!(dup.read(&mut buf).unwrap(), 0);
    }

    #[test]
    fn descriptors_arrive_with_the_bytes() {
        use std::io::{Seek, Write};
        use std::os::fd::{FromRawFd, OwnedFd};

        let (a, b) = UnixStream::pair().unwrap();
        let mut file = tempfile_in_tmp();
        file.write_all(b"passed").unwrap();
        assert_eq!(send_with_fds(a.as_fd(), b"hello", &[file.as_fd()]).unwrap(), 5);
        // Receive with recvmsg to see the descriptor.
        let mut data = [0u8; 16];
        let mut control = [0u64; 8];
        let mut iov = libc::iovec { iov_base: data.as_mut_ptr().cast(), iov_len: data.len() };
        // SAFETY: a zeroed msghdr pointing at live buffers.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&control) as _;
        // SAFETY: as above.
        let n = unsafe { libc::recvmsg(b.as_raw_fd(), &mut msg, 0) };
        assert_eq!(&data[..n as usize], b"hello");
        // SAFETY: the kernel filled one SCM_RIGHTS header with one descriptor, now ours.
        let got = unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            assert_eq!((*c).cmsg_type, libc::SCM_RIGHTS);
            OwnedFd::from_raw_fd(std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>()))
        };
        let mut f = std::fs::File::from(got);
        f.rewind().unwrap();
        let mut s = String::new();
        f.read_to_string(&mut s).unwrap();
        assert_eq!(s, "passed");
        let too_many = [file.as_fd(); MAX_SEND_FDS + 1];
        assert_eq!(send_with_fds(a.as_fd(), b"x", &too_many).unwrap_err().raw_os_error(), Some(libc::EINVAL));
    }

    #[test]
    fn a_peek_leaves_the_message_and_both_receives_get_its_descriptor() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut buf = [0u8; 8];
        let e = recv_with_fds(b.as_fd(), &mut buf, true).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        let (channel, _other_end) = UnixStream::pair().unwrap();
        send_with_fds(a.as_fd(), b"header", &[channel.as_fd()]).unwrap();
        assert_eq!(peek_nonblocking(b.as_fd(), &mut buf).unwrap(), 6);
        let (n, peeked) = recv_with_fds(b.as_fd(), &mut buf, true).unwrap();
        assert_eq!((n, peeked.len()), (6, 1));
        assert!(is_unix_stream(peeked[0].as_fd()), "the attached socket");
        let (n, taken) = recv_with_fds(b.as_fd(), &mut buf, false).unwrap();
        assert_eq!((&buf[..n], taken.len()), (&b"header"[..], 1), "the peek left the message queued");
        let e = peek_nonblocking(b.as_fd(), &mut buf).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock, "the receive consumed it");
        assert!(!is_unix_stream(std::fs::File::open("/dev/null").unwrap().as_fd()), "a file is no socket");
        drop(a);
        assert_eq!(peek_nonblocking(b.as_fd(), &mut buf).unwrap(), 0, "the end of the stream");
    }

    fn tempfile_in_tmp() -> std::fs::File {
        let path = std::env::temp_dir().join(format!("fp-sys-scm-{}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        f
    }

    #[test]
    fn send_buffer_grows() {
        let (a, _b) = UnixStream::pair().unwrap();
        set_send_buffer(a.as_fd(), 1 << 20).unwrap();
        let e = set_send_buffer(std::io::stdin().as_fd(), 1 << 20);
        // stdin is not a socket in most test runs; when it is, the call simply works.
        if let Err(e) = e {
            assert_eq!(e.raw_os_error(), Some(libc::ENOTSOCK));
        }
    }
}
