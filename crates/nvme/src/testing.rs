//! For tests of multipath and TLS (this crate's and the daemon's, feature `testing`):
//! [`Relay`], a TCP relay standing for one network path to a target, which a test cuts and
//! restores; [`TlsTerminator`], a TLS server in front of a plain NVMe/TCP target.

use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fp_crypto::tls::{nvme_lookup, ConfiguredPsk, TlsSession, TlsStream};

/// A TCP relay on a loopback port of its own to a target's port: one path. Cutting it closes
/// every connection through it and closes new ones as soon as they are accepted (a host's
/// reconnect fails); restoring it lets connections through again.
pub struct Relay {
    port: u16,
    open: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
}

impl Relay {
    /// A relay to `127.0.0.1:to`, its accept loop on a thread of its own (for the process's
    /// life).
    pub fn start(to: u16) -> std::io::Result<Relay> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let open = Arc::new(AtomicBool::new(true));
        let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (o, c) = (open.clone(), conns.clone());
        std::thread::Builder::new().name(format!("relay-{port}")).spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if !o.load(Ordering::SeqCst) {
                    // A cut path: accepted and closed at once.
                    drop(client);
                    continue;
                }
                if let Err(e) = relay(client, to, &c) {
                    log::warn!("relay {port}: {e}");
                }
            }
        })?;
        Ok(Relay { port, open, conns })
    }

    /// The relay's port: the path's address.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Cuts the path.
    pub fn cut(&self) {
        self.open.store(false, Ordering::SeqCst);
        for s in self.conns.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Restores the path.
    pub fn restore(&self) {
        self.open.store(true, Ordering::SeqCst);
    }
}

/// Copies between `client` and a new connection to port `to`, both ways, each on a thread.
fn relay(client: TcpStream, to: u16, conns: &Mutex<Vec<TcpStream>>) -> std::io::Result<()> {
    let server = TcpStream::connect(("127.0.0.1", to))?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    conns.lock().unwrap_or_else(|e| e.into_inner()).extend([client.try_clone()?, server.try_clone()?]);
    for (mut from, mut to) in [(client.try_clone()?, server.try_clone()?), (server, client)] {
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            while let Ok(n @ 1..) = from.read(&mut buf) {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            let _ = from.shutdown(Shutdown::Both);
            let _ = to.shutdown(Shutdown::Both);
        });
    }
    Ok(())
}

/// A TLS terminator on a loopback port of its own in front of a plain NVMe/TCP target's port:
/// each connection accepted runs a TLS 1.3 server whose PSK lookup takes the identity a host
/// offers and derives its PSK from the configured PSK the terminator holds (for every host and
/// subsystem), then relays the plaintext to the target over a connection of its own.
pub struct TlsTerminator {
    port: u16,
    key: Arc<Mutex<Option<ConfiguredPsk>>>,
    seen: Arc<Seen>,
}

/// What the terminator's connections saw.
#[derive(Default)]
struct Seen {
    /// The identities of the handshakes done, in order.
    identities: Mutex<Vec<String>>,
    /// Handshakes refused.
    refused: AtomicUsize,
}

impl TlsTerminator {
    /// A terminator to `127.0.0.1:to` holding `key` (`None`: no PSK for any host), its accept
    /// loop on a thread of its own (for the process's life).
    pub fn start(to: u16, key: Option<ConfiguredPsk>) -> io::Result<TlsTerminator> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let key = Arc::new(Mutex::new(key));
        let seen = Arc::new(Seen::default());
        let (k, s) = (key.clone(), seen.clone());
        std::thread::Builder::new().name(format!("tls-{port}")).spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let (key, s) = (k.lock().unwrap_or_else(|e| e.into_inner()).clone(), s.clone());
                std::thread::spawn(move || {
                    if let Err(e) = terminate(conn, to, key, &s) {
                        log::info!("TLS terminator {port}: {e}");
                    }
                });
            }
        })?;
        Ok(TlsTerminator { port, key, seen })
    }

    /// The terminator's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The configured PSK of the connections accepted from now on.
    pub fn set_key(&self, key: Option<ConfiguredPsk>) {
        *self.key.lock().unwrap_or_else(|e| e.into_inner()) = key;
    }

    /// The identities hosts shook hands with, in order.
    pub fn identities(&self) -> Vec<String> {
        self.seen.identities.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// How many handshakes it refused.
    pub fn refused(&self) -> usize {
        self.seen.refused.load(Ordering::SeqCst)
    }
}

/// One connection: the handshake (its socket's timeouts bound it), then plaintext relayed both
/// ways on this thread until either side closes.
fn terminate(mut conn: TcpStream, to: u16, key: Option<ConfiguredPsk>, seen: &Seen) -> io::Result<()> {
    let lookup = nvme_lookup(move |host, _subnqn| key.as_ref().and_then(|k| k.retained(host).ok()));
    let mut tls = TlsStream::new(TlsSession::server(lookup).map_err(io::Error::other)?);
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    conn.set_nodelay(true)?;
    if let Err(e) = tls.blocking(&mut conn).handshake() {
        // The blocking handshake returns before the session's alert went out: it goes now, so
        // that the host learns why.
        let _ = tls.flush(conn.as_fd());
        seen.refused.fetch_add(1, Ordering::SeqCst);
        return Err(io::Error::other(e));
    }
    let id = tls.session().accepted_identity().map(|i| String::from_utf8_lossy(i).into_owned());
    seen.identities.lock().unwrap_or_else(|e| e.into_inner()).push(id.unwrap_or_default());
    let plain = TcpStream::connect(("127.0.0.1", to))?;
    plain.set_nodelay(true)?;
    let mut plain_out = plain.try_clone()?;
    let (a, b) = (conn.as_fd(), plain.as_fd());
    let mut buf = vec![0u8; 256 << 10];
    let retry = |e: &io::Error| e.kind() == io::ErrorKind::WouldBlock;
    loop {
        let mut moved = false;
        // Host to target: decrypted, written whole to the plain socket.
        match tls.recv(a, &mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => {
                plain_out.write_all(&buf[..n])?;
                moved = true;
            }
            Err(e) if retry(&e) => {}
            Err(e) => return Err(e),
        }
        // Target to host: every byte taken by the session, its ciphertext flushed below.
        match fp_sys::recv_nonblocking(b, &mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => {
                let mut at = 0;
                while at < n {
                    match tls.send_vectored(a, &[IoSlice::new(&buf[at..n])]) {
                        Ok(k) => at += k,
                        Err(e) if retry(&e) => std::thread::yield_now(),
                        Err(e) => return Err(e),
                    }
                }
                moved = true;
            }
            Err(e) if retry(&e) => {}
            Err(e) => return Err(e),
        }
        tls.flush(a)?;
        if !moved && !tls.has_received() {
            fp_sys::wait_readable(&[a.as_raw_fd(), b.as_raw_fd()], Some(Duration::from_millis(5)))?;
        }
    }
}
