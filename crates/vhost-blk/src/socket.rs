//! The controller's Unix socket and its control-plane thread: binding and naming the socket,
//! accepting one frontend at a time, framing its messages for `vhost`'s parser, and the backend
//! channel that carries config-change notifications.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vhost::vhost_user::message::{FrontendReq, VhostUserLog};
use vhost::vhost_user::{BackendReqHandler, VhostUserBackendReqHandlerMut};

use crate::connection::Connection;
use crate::state::{ControllerState, StopSignal};
use crate::Error;

/// Controller names become socket file names.
pub fn validate_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 100
        && name != "."
        && name != ".."
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    if ok {
        Ok(())
    } else {
        Err(format!("'{name}' must be 1-100 characters of A-Z a-z 0-9 . _ -"))
    }
}

/// Back-off after a failed accept (e.g. out of fds) so the thread does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// A frontend that sends part of a message and stalls is disconnected after this long.
const MESSAGE_TIMEOUT: Duration = Duration::from_secs(5);

pub(crate) fn bind(path: &std::path::Path) -> Result<UnixListener, Error> {
    let err = |source| Error::Listen { path: path.to_path_buf(), source };
    // A socket file left by a previous run (crash, kill -9) would make bind fail; replace it,
    // but never delete anything that is not a socket.
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        if meta.file_type().is_socket() {
            if UnixStream::connect(path).is_ok() {
                return Err(err(std::io::Error::new(
                    std::io::ErrorKind::AddrInUse,
                    "another process is serving this socket",
                )));
            }
            std::fs::remove_file(path).map_err(err)?;
        } else {
            return Err(err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "a non-socket file is in the way",
            )));
        }
    }
    let listener = UnixListener::bind(path).map_err(err)?;
    listener.set_nonblocking(true).map_err(err)?;
    Ok(listener)
}

/// What [`wait_fd`] saw first.
#[derive(Debug, PartialEq, Eq)]
enum Waited {
    /// `fd` has one of the events asked for (or an error or hang-up, which the next I/O call
    /// on it reports).
    Ready,
    /// The controller is being stopped.
    Stopped,
    /// The deadline passed first.
    TimedOut,
}

/// Waits until `fd` has one of `events`, the controller is stopped, or `deadline` (if any)
/// passes. The control thread waits on nothing else, so an idle controller never wakes up.
fn wait_fd(
    fd: BorrowedFd<'_>,
    events: libc::c_short,
    stop: &StopSignal,
    deadline: Option<Instant>,
) -> Waited {
    let mut pfds = [
        libc::pollfd { fd: fd.as_raw_fd(), events, revents: 0 },
        libc::pollfd { fd: stop.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 },
    ];
    loop {
        let timeout = match deadline {
            None => None,
            Some(d) => match d.checked_duration_since(Instant::now()) {
                Some(left) if !left.is_zero() => Some(left),
                _ => return Waited::TimedOut,
            },
        };
        if let Err(e) = fp_sys::poll(&mut pfds, timeout) {
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            // poll only fails on bad arguments or no memory: treat as a stop.
            return Waited::Stopped;
        }
        if pfds[1].revents != 0 {
            return Waited::Stopped;
        }
        if pfds[0].revents != 0 {
            return Waited::Ready;
        }
    }
}

/// Waits until `fd` is readable or the controller is stopped. Returns false on stop.
fn wait_readable(fd: BorrowedFd<'_>, stop: &StopSignal) -> bool {
    wait_fd(fd, libc::POLLIN, stop, None) == Waited::Ready
}

/// The controller's control-plane thread: one connection at a time.
pub(crate) fn serve(listener: UnixListener, shared: Arc<ControllerState>) {
    while wait_readable(listener.as_fd(), &shared.stop) {
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => {
                log::warn!("{}: accept failed: {e}", shared.name);
                std::thread::sleep(ACCEPT_BACKOFF);
                continue;
            }
        };
        log::info!("{}: frontend connected", shared.name);
        shared.connected.store(true, Ordering::Relaxed);
        let reason = run_connection(stream, &shared);
        shared.connected.store(false, Ordering::Relaxed);
        log::info!("{}: frontend disconnected: {reason}", shared.name);
    }
}

/// What is queued on a vhost-user socket.
#[derive(Debug, PartialEq, Eq)]
enum Queued {
    /// At least one whole message (header and the body its size field declares), with its
    /// request code.
    Message(u32),
    /// Part of a message.
    Partial,
    /// The peer closed the connection.
    Closed,
}

/// vhost-user message header: request u32, flags u32, size u32 (vhost-user.rst, "Message
/// format").
const HEADER_SIZE: usize = 12;
/// Bodies larger than this are refused by the parser anyway; peeking further is pointless.
const MAX_PEEK: usize = HEADER_SIZE + 4096;

/// Peeks at the socket without consuming anything (file descriptors attached to the message
/// stay queued for the real read).
fn peek_queued(sock: &UnixStream) -> std::io::Result<Queued> {
    let mut buf = [0u8; MAX_PEEK];
    let n = match fp_sys::peek_nonblocking(sock.as_fd(), &mut buf) {
        Ok(n) => n,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(Queued::Partial),
        Err(e) => return Err(e),
    };
    if n == 0 {
        return Ok(Queued::Closed);
    }
    if n < HEADER_SIZE {
        return Ok(Queued::Partial);
    }
    let size = u32::from_le_bytes([buf[8], buf[9], buf[10], buf[11]]) as usize;
    // An oversized body is complete as far as we care: the parser rejects it.
    if n >= HEADER_SIZE + size.min(MAX_PEEK - HEADER_SIZE) {
        Ok(Queued::Message(u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]])))
    } else {
        Ok(Queued::Partial)
    }
}

/// `vhost`'s request reader blocks until a whole message has arrived (and retries through
/// receive time-outs), so it is only called once a whole message is queued; a peer that leaves
/// a message unfinished for [`MESSAGE_TIMEOUT`] is dropped.
/// Returns the message's request code.
fn wait_for_message(sock: &UnixStream, stop: &StopSignal) -> Result<u32, String> {
    let mut partial_since: Option<Instant> = None;
    loop {
        if !wait_readable(sock.as_fd(), stop) {
            return Err("controller is being deleted".into());
        }
        match peek_queued(sock) {
            Ok(Queued::Message(request)) => return wait_reply_room(sock, stop).map(|()| request),
            Ok(Queued::Closed) => return Err("frontend closed the connection".into()),
            Ok(Queued::Partial) => {
                let since = *partial_since.get_or_insert_with(Instant::now);
                if since.elapsed() > MESSAGE_TIMEOUT {
                    return Err(format!("frontend left a message unfinished for {MESSAGE_TIMEOUT:?}"));
                }
                // The socket stays readable while a partial message sits in it; wait a little
                // for the rest instead of spinning.
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(format!("socket error: {e}")),
        }
    }
}

/// Waits until a reply can be written without blocking. `vhost` writes replies on the blocking
/// socket and retries a write that times out, so a frontend that sends requests without
/// reading the replies would, once the socket is full, block this thread for good, and the
/// controller could not even be deleted. A frontend that leaves no room for a reply for
/// [`MESSAGE_TIMEOUT`] is dropped instead. A Unix stream socket reports writable only while at
/// most a quarter of its send buffer is used, far more room than the largest reply (4 KiB).
fn wait_reply_room(sock: &UnixStream, stop: &StopSignal) -> Result<(), String> {
    // An error or hang-up also counts as ready: the reply's write then reports it.
    match wait_fd(sock.as_fd(), libc::POLLOUT, stop, Some(Instant::now() + MESSAGE_TIMEOUT)) {
        Waited::Ready => Ok(()),
        Waited::Stopped => Err("controller is being deleted".into()),
        Waited::TimedOut => Err(format!("frontend has not read its replies for {MESSAGE_TIMEOUT:?}")),
    }
}

fn run_connection(stream: UnixStream, shared: &Arc<ControllerState>) -> String {
    if let Err(e) = stream.set_nonblocking(false) {
        return format!("cannot configure socket: {e}");
    }
    // `vhost`'s handler takes the stream; this copy of it (the same socket) is how the
    // connection peeks, waits and serves the messages it answers itself.
    let sock = match stream.try_clone() {
        Ok(s) => s,
        Err(e) => return format!("cannot configure socket: {e}"),
    };
    let conn = Arc::new(Mutex::new(Connection::new(shared.clone())));
    let mut handler = BackendReqHandler::from_stream(stream, conn.clone());
    let reason = loop {
        let request = match wait_for_message(&sock, &shared.stop) {
            Ok(r) => r,
            Err(reason) => break reason,
        };
        if let Err(reason) = serve_message(&sock, request, &mut handler, &conn, shared) {
            break reason;
        }
    };
    conn.lock().unwrap_or_else(|p| p.into_inner()).stop_all();
    *shared.backend_channel() = None;
    reason
}

/// Serves one whole queued message whose request code is `request`. An error (with its reason)
/// ends the connection.
fn serve_message(
    sock: &UnixStream,
    request: u32,
    handler: &mut BackendReqHandler<Mutex<Connection>>,
    conn: &Mutex<Connection>,
    shared: &ControllerState,
) -> Result<(), String> {
    match request {
        SET_BACKEND_REQ_FD => {
            // `vhost` keeps the channel it builds from this message to itself and cannot send
            // a config change on it, so keep a copy of the fd, peeked before `vhost` reads it.
            match peek_attached_socket(sock) {
                Ok(channel) => *shared.backend_channel() = channel,
                Err(e) => log::warn!("{}: cannot keep the backend channel: {e}", shared.name),
            }
        }
        SET_LOG_BASE => return serve_set_log_base(sock, conn),
        SET_VRING_ENABLE => return serve_set_vring_enable(sock, conn),
        _ => {}
    }
    match handler.handle_request() {
        Ok(()) => Ok(()),
        Err(vhost::vhost_user::Error::Disconnected) => Err("frontend closed the connection".into()),
        Err(e) => Err(format!("protocol error in {}: {e}", request_name(request))),
    }
}

/// The request's name for a log line (vhost-user.rst's, without the VHOST_USER_ prefix).
fn request_name(request: u32) -> String {
    match FrontendReq::try_from(request) {
        Ok(r) => format!("{r:?}"),
        Err(_) => format!("unknown request {request}"),
    }
}

/// [`serve_message`] for the `vhost_messages` fuzz target, which writes each message whole
/// into its end of the socket before calling this with (a copy of) the other end. Not API.
#[doc(hidden)]
pub fn serve_message_for_fuzzing(
    sock: &UnixStream,
    handler: &mut BackendReqHandler<Mutex<Connection>>,
    conn: &Mutex<Connection>,
) -> Result<(), String> {
    let request = match peek_queued(sock) {
        Ok(Queued::Message(request)) => request,
        other => return Err(format!("no whole message queued: {other:?}")),
    };
    let shared = conn.lock().unwrap_or_else(|p| p.into_inner()).shared().clone();
    serve_message(sock, request, handler, conn, &shared)
}

/// VHOST_USER_SET_LOG_BASE's request code.
const SET_LOG_BASE: u32 = 6;
/// `VhostUserLog`: mmap_size and mmap_offset, two u64.
const LOG_BODY_SIZE: usize = 16;
/// A reply's header flags: version 1 and the REPLY bit (vhost-user.rst, "Header").
const HEADER_FLAGS_REPLY: u32 = 0x1 | 0x4;

/// Serves SET_LOG_BASE here rather than in `vhost`, whose handler (0.18) answers it with the
/// request's 16-byte body echoed. vhost-user.rst lists SET_LOG_BASE among the requests that
/// need a reply when LOG_SHMFD is negotiated, with "reply payload: N/A": a header with size 0,
/// as QEMU and other back-ends (DPDK) exchange it. QEMU waits for that reply before it frees
/// the old log, so it is sent only once the queues log into the new one.
fn serve_set_log_base(sock: &UnixStream, conn: &Mutex<Connection>) -> Result<(), String> {
    let mut msg = [0u8; HEADER_SIZE + LOG_BODY_SIZE];
    let (n, mut fds) = fp_sys::recv_with_fds(sock.as_fd(), &mut msg[..HEADER_SIZE], false)
        .map_err(|e| format!("socket error: {e}"))?;
    let word = |i: usize| u32::from_le_bytes([msg[i], msg[i + 1], msg[i + 2], msg[i + 3]]);
    let size = word(8) as usize;
    if n != HEADER_SIZE || word(4) & 0x3 != 0x1 || size != LOG_BODY_SIZE {
        return Err(format!("protocol error: malformed SET_LOG_BASE (flags {:#x}, size {size})", word(4)));
    }
    // The whole message is queued (`wait_for_message`); the body follows the header.
    let mut stream = sock;
    std::io::Read::read_exact(&mut stream, &mut msg[HEADER_SIZE..])
        .map_err(|e| format!("socket error: {e}"))?;
    let (Some(file), true) = (fds.pop(), fds.is_empty()) else {
        return Err("protocol error: SET_LOG_BASE needs exactly one fd".into());
    };
    let body = |i: usize| u64::from_le_bytes(msg[i..i + 8].try_into().expect("8 bytes"));
    let log = VhostUserLog::new(body(HEADER_SIZE), body(HEADER_SIZE + 8));
    {
        let mut conn = conn.lock().unwrap_or_else(|p| p.into_inner());
        if !conn.log_shmfd_negotiated() {
            return Err("protocol error: SET_LOG_BASE without VHOST_USER_PROTOCOL_F_LOG_SHMFD".into());
        }
        conn.set_log_base(&log, std::fs::File::from(file))
            .map_err(|e| format!("SET_LOG_BASE refused: {e}"))?;
    }
    let mut reply = [0u8; HEADER_SIZE];
    reply[0..4].copy_from_slice(&SET_LOG_BASE.to_le_bytes());
    reply[4..8].copy_from_slice(&HEADER_FLAGS_REPLY.to_le_bytes());
    std::io::Write::write_all(&mut stream, &reply).map_err(|e| format!("socket error: {e}"))
}

/// VHOST_USER_SET_VRING_ENABLE's request code.
const SET_VRING_ENABLE: u32 = 18;
/// `VhostUserVringState`: index and num, two u32.
const VRING_STATE_SIZE: usize = 8;
/// A request's NEED_REPLY header flag (vhost-user.rst, "Header").
const HEADER_FLAG_NEED_REPLY: u32 = 0x8;

/// Serves SET_VRING_ENABLE here rather than in `vhost`, whose handler (0.18) refuses any value
/// but 0 and 1 before the message reaches [`Connection`], and closes the connection.
/// vhost-user.rst says "1 to enable, 0 to disable"; the deployed back-ends (DPDK's and SPDK's
/// rte_vhost, QEMU's libvhost-user) read any non-zero value as enable, and SPDK's virtio-user
/// front-end depends on it: it enables each ring with the ring's size as the value. So does
/// this back-end: non-zero enables, zero disables. The acknowledgement is `vhost`'s: with
/// REPLY_ACK negotiated and NEED_REPLY set, a u64 that is 0 on success.
fn serve_set_vring_enable(sock: &UnixStream, conn: &Mutex<Connection>) -> Result<(), String> {
    let mut msg = [0u8; HEADER_SIZE + VRING_STATE_SIZE];
    let (n, fds) = fp_sys::recv_with_fds(sock.as_fd(), &mut msg[..HEADER_SIZE], false)
        .map_err(|e| format!("socket error: {e}"))?;
    let word = |m: &[u8], i: usize| u32::from_le_bytes([m[i], m[i + 1], m[i + 2], m[i + 3]]);
    let (flags, size) = (word(&msg, 4), word(&msg, 8) as usize);
    if n != HEADER_SIZE || flags & 0x3 != 0x1 || size != VRING_STATE_SIZE {
        return Err(format!("protocol error: malformed SET_VRING_ENABLE (flags {flags:#x}, size {size})"));
    }
    if !fds.is_empty() {
        return Err("protocol error: SET_VRING_ENABLE carries no fds".into());
    }
    // The whole message is queued (`wait_for_message`); the body follows the header.
    let mut stream = sock;
    std::io::Read::read_exact(&mut stream, &mut msg[HEADER_SIZE..])
        .map_err(|e| format!("socket error: {e}"))?;
    let (index, num) = (word(&msg, HEADER_SIZE), word(&msg, HEADER_SIZE + 4));
    let (result, ack) = {
        let mut conn = conn.lock().unwrap_or_else(|p| p.into_inner());
        if !conn.protocol_features_negotiated() {
            return Err("protocol error: SET_VRING_ENABLE without VHOST_USER_F_PROTOCOL_FEATURES".into());
        }
        let ack = flags & HEADER_FLAG_NEED_REPLY != 0 && conn.reply_ack_negotiated();
        (conn.set_vring_enable(index, num != 0), ack)
    };
    if ack {
        let mut reply = [0u8; HEADER_SIZE + 8];
        reply[0..4].copy_from_slice(&SET_VRING_ENABLE.to_le_bytes());
        reply[4..8].copy_from_slice(&HEADER_FLAGS_REPLY.to_le_bytes());
        reply[8..12].copy_from_slice(&8u32.to_le_bytes());
        reply[12..20].copy_from_slice(&u64::from(result.is_err()).to_le_bytes());
        std::io::Write::write_all(&mut stream, &reply).map_err(|e| format!("socket error: {e}"))?;
    }
    result.map_err(|e| format!("SET_VRING_ENABLE of queue {index} ({num}) refused: {e}"))
}

/// VHOST_USER_SET_BACKEND_REQ_FD's request code (vhost-user.rst, "Front-end message types").
const SET_BACKEND_REQ_FD: u32 = 21;
/// VHOST_USER_BACKEND_CONFIG_CHANGE_MSG's request code ("Back-end message types").
const BACKEND_CONFIG_CHANGE_MSG: u32 = 2;
/// The header flags of a backend message: protocol version 1, no reply wanted. A reply must not
/// be asked for: QEMU answers a config change by reading the config space on the main socket
/// first, which this controller's thread must be free to serve.
const HEADER_FLAGS_VERSION_1: u32 = 0x1;

/// Sends VHOST_USER_BACKEND_CONFIG_CHANGE_MSG (a header without body) on the backend channel.
pub(crate) fn notify_config_change(stream: &mut UnixStream) -> std::io::Result<()> {
    use std::io::Write;
    let mut msg = [0u8; HEADER_SIZE];
    msg[0..4].copy_from_slice(&BACKEND_CONFIG_CHANGE_MSG.to_le_bytes());
    msg[4..8].copy_from_slice(&HEADER_FLAGS_VERSION_1.to_le_bytes());
    // The socket is non-blocking: a frontend that never reads its backend channel gets an
    // error here, not a stuck caller.
    stream.write_all(&msg)
}

/// Peeks at the message at the head of `sock` and returns a copy of the single Unix stream
/// socket attached to it, leaving the message (and its own copy of the descriptor) queued.
fn peek_attached_socket(sock: &UnixStream) -> std::io::Result<Option<UnixStream>> {
    let mut data = [0u8; HEADER_SIZE];
    let (_, mut fds) = fp_sys::recv_with_fds(sock.as_fd(), &mut data, true)?;
    if fds.len() != 1 {
        // `vhost` refuses the message itself; the copies are closed here.
        return Ok(None);
    }
    let stream = UnixStream::from(fds.pop().expect("one fd"));
    if !fp_sys::is_unix_stream(stream.as_fd()) {
        // `vhost` refuses the message too.
        return Ok(None);
    }
    stream.set_nonblocking(true)?;
    Ok(Some(stream))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controller_names_are_safe_file_names() {
        assert!(validate_name("vhost.0").is_ok());
        assert!(validate_name("disk-1_a").is_ok());
        for bad in ["", ".", "..", "a/b", "a b", &"x".repeat(101)] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
    }
}
