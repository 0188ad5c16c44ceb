//! For tests of multipath (this crate's and the daemon's, feature `testing`): [`Relay`], a
//! TCP relay standing for one network path to a target, which a test cuts and restores.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

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
