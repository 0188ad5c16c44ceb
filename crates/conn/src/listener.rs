//! Listening sockets and their handshakes, on the control plane. A listener thread accepts
//! connections on one address (a Unix socket, or every TCP address a name resolves to) and
//! gives each a short-lived thread for its handshake, every read and write of it bounded by
//! [`ListenerOptions::handshake_timeout`]. At most [`ListenerOptions::max_handshakes`] run at
//! once: one more shuts the oldest down (logged), so a flood of silent connections pins that
//! many threads at most and cannot lock out a real client, whose handshake takes a
//! millisecond. The handshake itself (the protocol's) is the caller's: it ends by handing the
//! socket, non-blocking ([`Stream::into_nonblocking_fd`]), to a reactor.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// Why a listening socket could not be made.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// Something other than a dead daemon's socket file is at the path.
    #[error("{} exists and is in use", .0.display())]
    InUse(PathBuf),
    /// The socket file's mode could not be set (the file is removed again).
    #[error("cannot set the mode of {}: {source}", path.display())]
    Mode {
        /// The socket file.
        path: PathBuf,
        /// What `chmod` said.
        source: io::Error,
    },
    /// The bind (or making the socket non-blocking) failed.
    #[error("cannot listen on {what}: {source}")]
    Bind {
        /// The address, as given.
        what: String,
        /// What the system said.
        source: io::Error,
    },
}

/// A bound, non-blocking listening socket (or several: one per TCP address of a name).
pub enum Bound {
    /// A Unix socket; its file is removed when the listener closes.
    Unix(UnixListener, PathBuf),
    /// TCP sockets.
    Tcp(Vec<TcpListener>),
}

impl Bound {
    /// Binds the Unix socket `path` and gives its file `mode`. A socket file left by a daemon
    /// that died is replaced; anything else at the path is not.
    pub fn unix(path: &Path, mode: u32) -> Result<Bound, BindError> {
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            if !meta.file_type().is_socket() || UnixStream::connect(path).is_ok() {
                return Err(BindError::InUse(path.to_path_buf()));
            }
            let _ = std::fs::remove_file(path);
        }
        let bind_err = |source| BindError::Bind { what: path.display().to_string(), source };
        let l = UnixListener::bind(path).map_err(bind_err)?;
        if let Err(source) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)) {
            let _ = std::fs::remove_file(path);
            return Err(BindError::Mode { path: path.to_path_buf(), source });
        }
        l.set_nonblocking(true).map_err(bind_err)?;
        Ok(Bound::Unix(l, path.to_path_buf()))
    }

    /// Binds every address of `addrs`.
    pub fn tcp(addrs: &[SocketAddr]) -> io::Result<Bound> {
        let mut ls = Vec::with_capacity(addrs.len());
        for a in addrs {
            let l = TcpListener::bind(a)?;
            l.set_nonblocking(true)?;
            ls.push(l);
        }
        Ok(Bound::Tcp(ls))
    }
}

/// A connection's socket during its handshake: blocking, every read and write bounded.
pub enum Stream {
    /// Accepted on a Unix socket.
    Unix(UnixStream),
    /// Accepted on TCP (`TCP_NODELAY` set: small requests go out at once).
    Tcp(TcpStream),
}

impl Stream {
    /// Bounds every read and write (`None`: no bound).
    pub fn set_timeouts(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Unix(s) => {
                s.set_read_timeout(t)?;
                s.set_write_timeout(t)
            }
            Stream::Tcp(s) => {
                s.set_read_timeout(t)?;
                s.set_write_timeout(t)
            }
        }
    }

    /// A duplicate of the socket (to shut it down from another thread).
    pub fn dup_fd(&self) -> io::Result<OwnedFd> {
        Ok(match self {
            Stream::Unix(s) => s.try_clone()?.into(),
            Stream::Tcp(s) => s.try_clone()?.into(),
        })
    }

    /// The socket for a poller: no timeouts, non-blocking.
    pub fn into_nonblocking_fd(self) -> io::Result<OwnedFd> {
        self.set_timeouts(None)?;
        Ok(match self {
            Stream::Unix(s) => {
                s.set_nonblocking(true)?;
                s.into()
            }
            Stream::Tcp(s) => {
                s.set_nonblocking(true)?;
                s.into()
            }
        })
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(buf),
            Stream::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(buf),
            Stream::Tcp(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// How a listener runs.
#[derive(Debug, Clone)]
pub struct ListenerOptions {
    /// What its log lines start with ("nbd listener /run/nbd.sock").
    pub label: String,
    /// The accept thread's name.
    pub thread_name: &'static str,
    /// Each handshake thread's name.
    pub handshake_thread_name: &'static str,
    /// Handshakes running at once at most.
    pub max_handshakes: usize,
    /// How long one read or write of a handshake may take.
    pub handshake_timeout: Duration,
}

/// The handshakes running on a listener, oldest first, each with a duplicate of its socket
/// (to shut it down when it must make room) and its peer.
#[derive(Default)]
struct Handshakes {
    next_id: u64,
    running: VecDeque<(u64, OwnedFd, String)>,
}

/// What the accept thread and the handshake threads share.
struct Shared<H> {
    opts: ListenerOptions,
    handshakes: Mutex<Handshakes>,
    handshake: H,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A running listener; [`Listener::close`] (or dropping it) stops accepting, waits for the
/// accept thread and removes a Unix socket's file. Handshakes already running finish.
pub struct Listener {
    stop: EventFd,
    thread: Option<JoinHandle<()>>,
    unix_path: Option<PathBuf>,
}

impl Listener {
    /// Starts accepting on `bound`. Each connection's `handshake(stream, peer)` runs on a
    /// thread of its own; an `Err` is the reason the connection closed, logged.
    pub fn start<H>(bound: Bound, opts: ListenerOptions, handshake: H) -> io::Result<Listener>
    where
        H: Fn(Stream, &str) -> Result<(), String> + Send + Sync + 'static,
    {
        let stop = EventFd::new(EFD_NONBLOCK)?;
        let stop_fd = stop.try_clone()?;
        let unix_path = match &bound {
            Bound::Unix(_, p) => Some(p.clone()),
            Bound::Tcp(_) => None,
        };
        let name = opts.thread_name;
        let shared = Arc::new(Shared { opts, handshakes: Mutex::new(Handshakes::default()), handshake });
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || accept_loop(bound, stop_fd, shared))?;
        Ok(Listener { stop, thread: Some(thread), unix_path })
    }

    /// Stops it (as dropping it does).
    pub fn close(self) {}
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = self.stop.write(1);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(path) = &self.unix_path {
            let _ = std::fs::remove_file(path);
        }
    }
}

fn accept_loop<H>(bound: Bound, stop: EventFd, shared: Arc<Shared<H>>)
where
    H: Fn(Stream, &str) -> Result<(), String> + Send + Sync + 'static,
{
    let label = &shared.opts.label;
    let mut fds = vec![stop.as_raw_fd()];
    match &bound {
        Bound::Unix(l, _) => fds.push(l.as_raw_fd()),
        Bound::Tcp(ls) => fds.extend(ls.iter().map(|l| l.as_raw_fd())),
    }
    loop {
        let ready = match fp_sys::wait_readable(&fds, None) {
            Ok(ready) => ready,
            Err(e) => return log::error!("{label}: poll failed: {e}"),
        };
        if ready[0] {
            return;
        }
        for i in 1..fds.len() {
            if !ready[i] {
                continue;
            }
            let accepted = match &bound {
                Bound::Unix(l, _) => l.accept().map(|(s, _)| (Stream::Unix(s), "unix client".to_string())),
                Bound::Tcp(ls) => ls[i - 1].accept().map(|(s, peer)| {
                    let _ = s.set_nodelay(true);
                    (Stream::Tcp(s), peer.to_string())
                }),
            };
            match accepted {
                Ok((stream, peer)) => start_handshake(&shared, stream, peer),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => log::warn!("{label}: accept: {e}"),
            }
        }
    }
}

fn start_handshake<H>(shared: &Arc<Shared<H>>, stream: Stream, peer: String)
where
    H: Fn(Stream, &str) -> Result<(), String> + Send + Sync + 'static,
{
    let (label, max) = (&shared.opts.label, shared.opts.max_handshakes);
    let dup = match stream.dup_fd() {
        Ok(fd) => fd,
        Err(e) => return log::warn!("{label}: {peer}: cannot duplicate the socket: {e}"),
    };
    let id = {
        let mut h = lock(&shared.handshakes);
        if h.running.len() >= max {
            if let Some((_, fd, oldest)) = h.running.pop_front() {
                log::warn!("{label}: {oldest}: handshake closed to make room ({max} running)");
                // Its thread's next read or write on the socket fails and the thread ends.
                let _ = fp_sys::shutdown(fd.as_fd());
            }
        }
        h.next_id += 1;
        let id = h.next_id;
        h.running.push_back((id, dup, peer.clone()));
        id
    };
    let s = shared.clone();
    let spawned =
        std::thread::Builder::new().name(shared.opts.handshake_thread_name.into()).spawn(move || {
            let result = match stream.set_timeouts(Some(s.opts.handshake_timeout)) {
                Ok(()) => (s.handshake)(stream, &peer),
                Err(e) => Err(format!("socket setup: {e}")),
            };
            lock(&s.handshakes).running.retain(|h| h.0 != id);
            if let Err(reason) = result {
                log::warn!("{}: {peer}: {reason}; connection closed", s.opts.label);
            }
        });
    if let Err(e) = spawned {
        lock(&shared.handshakes).running.retain(|h| h.0 != id);
        log::warn!("{label}: cannot start a handshake thread: {e}");
    }
}
