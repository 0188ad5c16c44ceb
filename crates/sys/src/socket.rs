//! Socket options and shutdown on descriptors `std`'s socket types do not own, non-blocking
//! receives and vectored sends on them (a poller's socket), and a send with descriptors
//! attached (`SCM_RIGHTS`), which `std` has no stable call for.
//!
//! Every message goes through [`message`], the one place a `msghdr` is built and handed to
//! the kernel; the `SCM_RIGHTS` control data is written and read as plain bytes.

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use crate::fs::cvt;

/// Receives into `buf` without waiting (`MSG_DONTWAIT`): `Ok(0)` is the end of the stream, a
/// socket with nothing to read fails with `WouldBlock`.
pub fn recv_nonblocking(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    recv(fd, buf, libc::MSG_DONTWAIT)
}

/// Copies what is queued on `fd` into `buf` without consuming it (`MSG_PEEK`) or waiting
/// (`MSG_DONTWAIT`): `Ok(0)` is the end of the stream, nothing queued fails with `WouldBlock`.
pub fn peek_nonblocking(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    recv(fd, buf, libc::MSG_PEEK | libc::MSG_DONTWAIT)
}

/// `recv(2)` into one buffer with `flags`: cheaper for the kernel than a one-piece `recvmsg`.
#[inline]
fn recv(fd: BorrowedFd<'_>, buf: &mut [u8], flags: libc::c_int) -> io::Result<usize> {
    // SAFETY: `buf` is valid for writes of its length; the descriptor is borrowed, open.
    let n = cvt(unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), flags) })?;
    Ok(n as usize)
}

/// Which way a [`message`] moves the bytes its iovecs describe.
#[derive(Clone, Copy)]
enum Way {
    Send,
    Receive,
}

/// Room for the control data of one message: 64 bytes, aligned for `cmsghdr`, enough for
/// [`MAX_SEND_FDS`] descriptors. `len` is what is used: set before a send, by a receive.
#[repr(C, align(8))]
struct Control {
    bytes: [u8; 64],
    len: usize,
}

impl Control {
    fn empty() -> Control {
        Control { bytes: [0; 64], len: 0 }
    }
}

/// Sends or receives one message on `fd` with `flags`: the bytes of `iov`, and the control
/// data of `control` when given (a receive sets its `len` to what arrived). Returns the bytes
/// moved.
///
/// # Safety
/// Every iovec describes memory valid for reads (`Way::Send`) or writes (`Way::Receive`) for
/// the call's duration.
#[inline]
unsafe fn message(
    fd: BorrowedFd<'_>,
    iov: &[libc::iovec],
    mut control: Option<&mut Control>,
    way: Way,
    flags: libc::c_int,
) -> io::Result<usize> {
    // SAFETY: an all-zero msghdr is a valid empty one (no name, no control). Filled in, it
    // points at the iovecs, which the caller vouches for, and at `control`'s bytes (borrowed
    // exclusively: a receive writes them), its declared length within them, all alive for the
    // call on a borrowed, open descriptor; the kernel only writes through the iovecs and into
    // the control bytes, never to the iovecs.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = iov.as_ptr().cast_mut();
        msg.msg_iovlen = iov.len() as _;
        if let Some(c) = control.as_deref_mut() {
            let room = match way {
                Way::Send => c.len.min(c.bytes.len()),
                Way::Receive => c.bytes.len(),
            };
            if room > 0 {
                msg.msg_control = c.bytes.as_mut_ptr().cast();
                msg.msg_controllen = room as _;
            }
        }
        let n = cvt(match way {
            Way::Send => libc::sendmsg(fd.as_raw_fd(), &msg, flags),
            Way::Receive => libc::recvmsg(fd.as_raw_fd(), &mut msg, flags),
        })?;
        if let (Way::Receive, Some(c)) = (way, control) {
            c.len = msg.msg_controllen as usize;
        }
        Ok(n as usize)
    }
}

/// Receives into `bufs` in one vectored read without waiting (`recvmsg`, `MSG_DONTWAIT`):
/// `Ok(0)` is the end of the stream, a socket with nothing to read fails with `WouldBlock`. An
/// NVMe/TCP host receives a PDU's data straight into the caller's buffers this way, with its
/// staging buffer last to take the headers that follow.
pub fn recv_vectored_nonblocking(fd: BorrowedFd<'_>, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
    // SAFETY: IoSliceMut is guaranteed ABI-compatible with iovec on Unix, so the view of
    // `bufs` as iovecs (living no longer than their borrow) describes the caller's exclusive
    // slices, writable for the call.
    unsafe { recv_iovecs_nonblocking(fd, std::slice::from_raw_parts(bufs.as_ptr().cast(), bufs.len())) }
}

/// [`recv_vectored_nonblocking`] into raw iovecs: for buffers described by address and length
/// (a request's guest or bdev memory) rather than borrowed slices.
///
/// # Safety
/// Every iovec describes memory valid for writes for the call's duration.
#[inline]
pub unsafe fn recv_iovecs_nonblocking(fd: BorrowedFd<'_>, iov: &[libc::iovec]) -> io::Result<usize> {
    // SAFETY: as the caller promises.
    unsafe { message(fd, iov, None, Way::Receive, libc::MSG_DONTWAIT) }
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
    // SAFETY: IoSlice is guaranteed ABI-compatible with iovec on Unix, so the view of `bufs`
    // as iovecs (living no longer than their borrow) describes the caller's borrowed slices,
    // readable for the call.
    unsafe { send_iovecs_nonblocking(fd, std::slice::from_raw_parts(bufs.as_ptr().cast(), bufs.len())) }
}

/// [`send_vectored_nonblocking`] from raw iovecs: for buffers described by address and length
/// (a request's bdev memory, a client's queued headers) rather than borrowed slices.
///
/// # Safety
/// Every iovec describes memory valid for reads for the call's duration.
#[inline]
pub unsafe fn send_iovecs_nonblocking(fd: BorrowedFd<'_>, iov: &[libc::iovec]) -> io::Result<usize> {
    // SAFETY: as the caller promises.
    unsafe { message(fd, iov, None, Way::Send, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) }
}

/// Shuts down both directions of the socket `fd`: a thread blocked reading or writing any
/// duplicate of it returns at once.
pub fn shutdown(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: a plain call on a borrowed, open descriptor.
    cvt(unsafe { libc::shutdown(fd.as_raw_fd(), libc::SHUT_RDWR) }).map(drop)
}

/// Sets the integer socket option `level`/`name` of `fd` to `value`.
fn setsockopt(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    let len = std::mem::size_of_val(&value) as libc::socklen_t;
    // SAFETY: the kernel reads `len` bytes, the live int `value`, on a borrowed, open
    // descriptor; an option that is no int is refused (EINVAL), never overrun.
    cvt(unsafe { libc::setsockopt(fd.as_raw_fd(), level, name, (&value as *const libc::c_int).cast(), len) })
        .map(drop)
}

/// The integer socket option `level`/`name` of `fd`.
fn getsockopt(fd: BorrowedFd<'_>, level: libc::c_int, name: libc::c_int) -> io::Result<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of_val(&value) as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes, into the live int `value`, and the length
    // into `len`, on a borrowed, open descriptor; any bit pattern is a valid int.
    cvt(unsafe {
        libc::getsockopt(fd.as_raw_fd(), level, name, (&mut value as *mut libc::c_int).cast(), &mut len)
    })?;
    Ok(value)
}

/// Asks for a send buffer of `bytes` on the socket `fd` (`SO_SNDBUF`; the kernel doubles it for
/// its bookkeeping and caps it at `net.core.wmem_max`).
pub fn set_send_buffer(fd: BorrowedFd<'_>, bytes: libc::c_int) -> io::Result<()> {
    setsockopt(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, bytes)
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
    setsockopt(fd, libc::SOL_SOCKET, libc::SO_PRIORITY, priority)
}

/// Most descriptors [`send_with_fds`] attaches to one message (vhost-user's own limit is 8).
pub const MAX_SEND_FDS: usize = 8;

/// `CMSG_ALIGN`: control data is laid out in units of the kernel's `size_t`.
const fn cmsg_align(len: usize) -> usize {
    len.next_multiple_of(std::mem::size_of::<usize>())
}

const SIZE_T: usize = std::mem::size_of::<usize>();
const INT: usize = std::mem::size_of::<libc::c_int>();

/// The kernel's `struct cmsghdr` (`size_t cmsg_len; int cmsg_level; int cmsg_type;`),
/// padded: where a header's data starts (`CMSG_DATA`).
const CMSG_HEADER: usize = cmsg_align(SIZE_T + 2 * INT);

/// Sends `bytes` on the connected Unix socket `sock` as one message with the descriptors `fds`
/// attached (`SCM_RIGHTS`); returns the bytes sent. Fails with `EINVAL` for more than
/// [`MAX_SEND_FDS`] descriptors or an empty `bytes`.
pub fn send_with_fds(sock: BorrowedFd<'_>, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<usize> {
    if fds.len() > MAX_SEND_FDS || bytes.is_empty() {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let mut control = Control::empty();
    if !fds.is_empty() {
        // One SCM_RIGHTS header and its descriptors: 8 take 16 + 32 of the 64 bytes.
        let data_len = fds.len() * INT;
        let c = &mut control.bytes;
        c[..SIZE_T].copy_from_slice(&(CMSG_HEADER + data_len).to_ne_bytes());
        c[SIZE_T..SIZE_T + INT].copy_from_slice(&libc::SOL_SOCKET.to_ne_bytes());
        c[SIZE_T + INT..SIZE_T + 2 * INT].copy_from_slice(&libc::SCM_RIGHTS.to_ne_bytes());
        for (slot, fd) in c[CMSG_HEADER..].chunks_exact_mut(INT).zip(fds) {
            slot.copy_from_slice(&fd.as_raw_fd().to_ne_bytes());
        }
        control.len = cmsg_align(CMSG_HEADER + data_len);
    }
    let iov = [libc::iovec { iov_base: bytes.as_ptr().cast_mut().cast(), iov_len: bytes.len() }];
    // SAFETY: the iovec describes `bytes`, readable for the call.
    unsafe { message(sock, &iov, Some(&mut control), Way::Send, libc::MSG_NOSIGNAL) }
}

/// Receives into `data` from the Unix socket `sock` without waiting (`MSG_DONTWAIT`), leaving
/// the message queued if `peek`, with the descriptors attached to it (`SCM_RIGHTS`, installed
/// close-on-exec; Linux installs even peeked descriptors as new ones). Room is made for
/// [`MAX_SEND_FDS`] descriptors, so a peer attaching more than one is noticed (and all of them
/// closed with the result) rather than truncated.
pub fn recv_with_fds(sock: BorrowedFd<'_>, data: &mut [u8], peek: bool) -> io::Result<(usize, Vec<OwnedFd>)> {
    let iov = [libc::iovec { iov_base: data.as_mut_ptr().cast(), iov_len: data.len() }];
    let mut control = Control::empty();
    let flags = libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC | if peek { libc::MSG_PEEK } else { 0 };
    // SAFETY: the iovec describes `data`, an exclusive borrow, writable for the call.
    let n = unsafe { message(sock, &iov, Some(&mut control), Way::Receive, flags) }?;
    let mut fds = Vec::new();
    let c = &control.bytes[..control.len.min(control.bytes.len())];
    let mut at = 0;
    // The headers as CMSG_FIRSTHDR/CMSG_NXTHDR walk them: each at the aligned end of the last.
    while at + CMSG_HEADER <= c.len() {
        let field = |from: usize, len: usize| &c[at + from..at + from + len];
        let len = usize::from_ne_bytes(field(0, SIZE_T).try_into().expect("a size_t"));
        let level = libc::c_int::from_ne_bytes(field(SIZE_T, INT).try_into().expect("an int"));
        let kind = libc::c_int::from_ne_bytes(field(SIZE_T + INT, INT).try_into().expect("an int"));
        if len < CMSG_HEADER || at + len > c.len() {
            break;
        }
        if level == libc::SOL_SOCKET && kind == libc::SCM_RIGHTS {
            for raw in field(CMSG_HEADER, len - CMSG_HEADER).chunks_exact(INT) {
                let raw = libc::c_int::from_ne_bytes(raw.try_into().expect("an int"));
                // SAFETY: the kernel just installed this descriptor for us; nobody else owns it.
                fds.push(unsafe { OwnedFd::from_raw_fd(raw) });
            }
        }
        at += cmsg_align(len);
    }
    Ok((n, fds))
}

/// Whether `fd` is an `AF_UNIX` `SOCK_STREAM` socket (a peer may send any descriptor).
pub fn is_unix_stream(fd: BorrowedFd<'_>) -> bool {
    let get = |name| getsockopt(fd, libc::SOL_SOCKET, name).ok();
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

    #[test]
    fn the_most_descriptors_arrive_in_order_and_data_alone_brings_none() {
        use std::io::Write;
        let (a, b) = UnixStream::pair().unwrap();
        let pipes: Vec<_> = (0..MAX_SEND_FDS).map(|_| crate::pipe().unwrap()).collect();
        let ends: Vec<_> = pipes.iter().map(|(_, w)| w.as_fd()).collect();
        assert_eq!(send_with_fds(a.as_fd(), b"eight", &ends).unwrap(), 5);
        let mut buf = [0u8; 8];
        let (n, got) = recv_with_fds(b.as_fd(), &mut buf, false).unwrap();
        assert_eq!((&buf[..n], got.len()), (&b"eight"[..], MAX_SEND_FDS));
        for (i, (fd, (r, _))) in got.into_iter().zip(&pipes).enumerate() {
            std::fs::File::from(fd).write_all(&[i as u8]).unwrap();
            let mut one = [0u8; 1];
            std::fs::File::from(r.try_clone().unwrap()).read_exact(&mut one).unwrap();
            assert_eq!(one[0], i as u8, "descriptor {i} is the write end of pipe {i}");
        }
        assert_eq!(send_with_fds(a.as_fd(), b"bare", &[]).unwrap(), 4);
        let (n, got) = recv_with_fds(b.as_fd(), &mut buf, false).unwrap();
        assert_eq!((&buf[..n], got.len()), (&b"bare"[..], 0));
        let e = send_with_fds(a.as_fd(), b"", &[]).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "an empty message carries nothing");
    }

    #[test]
    fn options_read_back() {
        let (a, _b) = UnixStream::pair().unwrap();
        set_priority(a.as_fd(), 3).unwrap();
        assert_eq!(getsockopt(a.as_fd(), libc::SOL_SOCKET, libc::SO_PRIORITY).unwrap(), 3);
        let e =
            getsockopt(std::fs::File::open("/dev/null").unwrap().as_fd(), libc::SOL_SOCKET, libc::SO_TYPE);
        assert_eq!(e.unwrap_err().raw_os_error(), Some(libc::ENOTSOCK));
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
