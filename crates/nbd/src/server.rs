//! Listeners and exports, on the control plane. A listener ([`fp_conn::Listener`]) accepts
//! connections on one address and gives each a short-lived thread for the handshake (blocking
//! I/O with a timeout; the TLS handshake too); once the client picks an export with NBD_OPT_GO or
//! NBD_OPT_EXPORT_NAME, the connection (socket, TLS state, what was negotiated) moves to one of
//! the export's reactors by message and is served there by a [`ConnPoller`]. Several exports
//! may share a listener; the last one to stop closes it.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fp_bdev::Bdev;
use fp_conn::{Bound, ListenerOptions, Stream};
use fp_reactor::ReactorHandle;
use rustls::ServerConfig;

use crate::address::Address;
use crate::conn::{ConnPoller, ConnSetup};
use crate::export::{lock, ExportBitmap, ExportShared};
use crate::handshake::{ExportInfo, ExportLookup, Negotiation, Step, Transmission};
use crate::proto::*;
use crate::stats::{ConnStats, NbdStats};
use crate::tls::{server_config, TlsFiles};

/// Handshakes one listener runs at once. A connection past this closes the oldest handshake
/// still running (logged), so a flood of silent connections pins at most this many threads and
/// cannot lock out a real client, whose handshake takes a millisecond.
const MAX_HANDSHAKES: usize = 64;

/// How long a client may take over a handshake step before it is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// How long stopping an export waits for its connections' requests to finish, by default
/// ([`NbdServer::set_stop_timeout`]): requests the disk refuses as busy are retried until then
/// and answered `EIO` at it, so what is left is requests the disk took and has not completed.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// Why an export cannot start; `field` names the `nbd_start_disk` parameter to blame.
#[derive(Debug, thiserror::Error)]
#[error("{reason}")]
pub struct NbdError {
    pub field: &'static str,
    pub reason: String,
}

fn invalid(field: &'static str, reason: impl Into<String>) -> NbdError {
    NbdError { field, reason: reason.into() }
}

/// What to export, and where.
pub struct ExportSpec {
    /// The name clients ask for.
    pub name: String,
    pub bdev: Bdev,
    pub readonly: bool,
    /// Connections are spread over these, round robin.
    pub reactors: Vec<ReactorHandle>,
    pub address: Address,
    /// TLS files; every export on a listener must agree with the listener's.
    pub tls: Option<TlsFiles>,
    /// The mode a Unix socket gets once bound.
    pub socket_mode: u32,
    /// The dirty bitmaps offered as `qemu:dirty-bitmap:NAME` contexts: each of the export's
    /// size, names unique.
    pub bitmaps: Vec<ExportBitmap>,
}

/// A listener's state shared with its threads.
struct ListenerShared {
    address: Address,
    tls: Option<(TlsFiles, Arc<ServerConfig>)>,
    exports: Mutex<BTreeMap<String, Arc<ExportShared>>>,
}

impl ExportLookup for ListenerShared {
    type Export = Arc<ExportShared>;

    fn find(&self, name: &str) -> Result<(String, Arc<ExportShared>), String> {
        let exports = lock(&self.exports);
        if name.is_empty() {
            let mut it = exports.values();
            return match (it.next(), it.next()) {
                (Some(e), None) => Ok((e.name.clone(), e.clone())),
                _ => Err(format!("{} has {} exports: name one", self.address, exports.len())),
            };
        }
        exports
            .get(name)
            .map(|e| (e.name.clone(), e.clone()))
            .ok_or_else(|| format!("no export named '{name}'"))
    }

    fn names(&self) -> Vec<String> {
        lock(&self.exports).keys().cloned().collect()
    }

    fn info(&self, e: &Arc<ExportShared>) -> ExportInfo {
        let info = e.bdev.info();
        ExportInfo {
            size: info.size_bytes(),
            flags: e.flags(),
            min_block: info.block_size,
            description: format!("flashpath bdev {}", info.name),
            bitmaps: e.bitmaps.iter().map(|(b, _)| b.name.clone()).collect(),
        }
    }
}

struct Listener {
    shared: Arc<ListenerShared>,
    listener: fp_conn::Listener,
}

impl Listener {
    fn close(self) {
        self.listener.close();
        log::info!("nbd listener {} closed", self.shared.address);
    }
}

/// Every NBD listener of the daemon.
#[derive(Default, Clone)]
pub struct NbdServer {
    listeners: Arc<Mutex<BTreeMap<Address, Listener>>>,
    bounds: Arc<Bounds>,
}

/// The server's stop and close bounds, in milliseconds.
struct Bounds {
    stop_ms: AtomicU64,
    close_ms: AtomicU64,
}

impl Default for Bounds {
    fn default() -> Bounds {
        Bounds {
            stop_ms: AtomicU64::new(STOP_TIMEOUT.as_millis() as u64),
            close_ms: AtomicU64::new(crate::CLOSE_TIMEOUT.as_millis() as u64),
        }
    }
}

/// A running export; [`ExportHandle::stop`] ends it. Clones stand for the same export.
#[derive(Clone)]
pub struct ExportHandle {
    server: NbdServer,
    address: Address,
    shared: Arc<ExportShared>,
}

impl ExportHandle {
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    pub fn address(&self) -> &Address {
        &self.address
    }

    /// Connections in the transmission phase now.
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::Relaxed)
    }

    /// What its connections counted since it started (published once per busy round of each).
    pub fn stats(&self) -> NbdStats {
        self.shared.stats()
    }

    /// Takes the export off its listener (new clients no longer find it), closes the listener
    /// if it was the last, and closes its connections once their requests are answered,
    /// waiting for that at most `timeout`. `Err(n)`: `n` connections still wait for requests
    /// their disk has not completed (they close when it does); calling again waits again.
    pub fn close(&self, timeout: Duration) -> Result<(), usize> {
        let listener = {
            let mut ls = lock(&self.server.listeners);
            let empty = match ls.get(&self.address) {
                Some(l) => {
                    let mut ex = lock(&l.shared.exports);
                    ex.remove(&self.shared.name);
                    ex.is_empty()
                }
                None => false,
            };
            if empty {
                ls.remove(&self.address)
            } else {
                None
            }
        };
        if let Some(l) = listener {
            l.close();
        }
        let closed = stop_connections(&self.shared, timeout);
        if closed.is_ok() {
            // No connection reads a bitmap again: their holds end with the stop, not when the
            // last reference to the export drops on a reactor a moment later.
            for (b, _) in &self.shared.bitmaps {
                b.bitmap.release();
            }
        }
        closed
    }

    /// [`ExportHandle::close`] with the server's stop bound, for a daemon going down:
    /// connections still open after it are logged and left to close when their disk answers.
    pub fn stop(self) {
        let bound = self.server.stop_timeout();
        if let Err(n) = self.close(bound) {
            log::warn!(
                "nbd export '{}': {n} connections still wait for their disk after {bound:?}",
                self.shared.name
            );
        }
    }
}

/// Asks every connection of `export` to close once its requests are answered and waits for
/// them (those asked by an earlier call too) at most `timeout`. Requests parked on Busy are
/// retried until then; at the bound this call gives them up itself (answered `EIO`, on the
/// connections' reactors, so no second timer races it) and counts what the device still
/// holds: `Err` with how many connections wait for such requests.
fn stop_connections(export: &ExportShared, timeout: Duration) -> Result<(), usize> {
    let deadline = std::time::Instant::now() + timeout;
    let asked = export.stop_conns();
    for (reactor, id, _) in &asked {
        let id = *id;
        reactor.call(move |r| {
            if let Some(p) = r.poller_mut::<ConnPoller>(id) {
                p.request_stop(deadline);
            }
        });
    }
    loop {
        if export.closing_conns() == 0 {
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut held = 0;
    for (reactor, id, _) in export.closing_list() {
        let on_device = reactor
            .call(move |r| r.poller_mut::<ConnPoller>(id).map_or(0, |p| p.give_up_at_stop()))
            .unwrap_or(0);
        held += usize::from(on_device > 0);
    }
    if held == 0 {
        // What is left answers the requests it gave up and closes by itself.
        Ok(())
    } else {
        Err(held)
    }
}

impl NbdServer {
    pub fn new() -> NbdServer {
        NbdServer::default()
    }

    /// How long stopping an export waits for its connections (default [`STOP_TIMEOUT`]).
    pub fn set_stop_timeout(&self, t: Duration) {
        self.bounds.stop_ms.store(t.as_millis() as u64, Ordering::Relaxed);
    }

    pub fn stop_timeout(&self) -> Duration {
        Duration::from_millis(self.bounds.stop_ms.load(Ordering::Relaxed))
    }

    /// How long a closing connection keeps retrying requests its disk refuses as busy before
    /// answering them `EIO` (default [`crate::CLOSE_TIMEOUT`]); for exports started from now on.
    pub fn set_close_timeout(&self, t: Duration) {
        self.bounds.close_ms.store(t.as_millis() as u64, Ordering::Relaxed);
    }

    /// The addresses listened on now.
    pub fn listeners_now(&self) -> Vec<Address> {
        lock(&self.listeners).keys().cloned().collect()
    }

    /// Starts an export: on the listener of its address, which is opened when it is the first.
    pub fn start(&self, spec: ExportSpec) -> Result<ExportHandle, NbdError> {
        if spec.reactors.is_empty() {
            return Err(invalid("nbd_device", "the daemon has no reactor to serve connections"));
        }
        if spec.name.is_empty() || spec.name.len() > 4096 {
            return Err(invalid("nbd_device", "the export name must be 1 to 4096 bytes"));
        }
        let local = spec.address.is_local().map_err(|e| invalid("nbd_device", e))?;
        if !local && spec.tls.is_none() {
            return Err(invalid(
                "tls_cert",
                format!("{} is reachable from other hosts: it needs tls_cert and tls_key", spec.address),
            ));
        }
        let size = spec.bdev.info().size_bytes();
        for (i, b) in spec.bitmaps.iter().enumerate() {
            if b.bitmap.len() != size {
                return Err(invalid(
                    "bitmaps",
                    format!("bitmap '{}' covers {} bytes, the export has {size}", b.name, b.bitmap.len()),
                ));
            }
            if b.name.is_empty() || spec.bitmaps[..i].iter().any(|o| o.name == b.name) {
                return Err(invalid("bitmaps", format!("bitmap name '{}' is empty or given twice", b.name)));
            }
        }
        let close_timeout = Duration::from_millis(self.bounds.close_ms.load(Ordering::Relaxed));
        let export = Arc::new(ExportShared::new(
            spec.name.clone(),
            spec.bdev,
            spec.readonly,
            spec.bitmaps,
            spec.reactors,
            close_timeout,
        ));
        let mut ls = lock(&self.listeners);
        if let Some(l) = ls.get(&spec.address) {
            if l.shared.tls.as_ref().map(|t| &t.0) != spec.tls.as_ref() {
                return Err(invalid(
                    "tls_cert",
                    format!("{} already serves exports with other TLS settings", spec.address),
                ));
            }
            let mut ex = lock(&l.shared.exports);
            if ex.contains_key(&spec.name) {
                return Err(invalid(
                    "nbd_device",
                    format!("{} already exports '{}'", spec.address, spec.name),
                ));
            }
            ex.insert(spec.name.clone(), export.clone());
        } else {
            let tls = match spec.tls {
                Some(files) => {
                    let config = server_config(&files).map_err(|e| invalid(e.field, e.reason))?;
                    Some((files, config))
                }
                None => None,
            };
            let shared = Arc::new(ListenerShared {
                address: spec.address.clone(),
                tls,
                exports: Mutex::new(BTreeMap::from([(spec.name.clone(), export.clone())])),
            });
            let l = listen(shared, spec.socket_mode)?;
            ls.insert(spec.address.clone(), l);
        }
        Ok(ExportHandle { server: self.clone(), address: spec.address, shared: export })
    }
}

fn listen(shared: Arc<ListenerShared>, socket_mode: u32) -> Result<Listener, NbdError> {
    let bound = match &shared.address {
        Address::Unix(path) => {
            Bound::unix(path, socket_mode).map_err(|e| invalid("nbd_device", e.to_string()))?
        }
        Address::Tcp { .. } => {
            let addrs = shared.address.resolve().map_err(|e| invalid("nbd_device", e))?;
            Bound::tcp(&addrs)
                .map_err(|e| invalid("nbd_device", format!("cannot listen on {}: {e}", shared.address)))?
        }
    };
    let opts = ListenerOptions {
        label: format!("nbd listener {}", shared.address),
        thread_name: "nbd-listen",
        handshake_thread_name: "nbd-handshake",
        max_handshakes: MAX_HANDSHAKES,
        handshake_timeout: HANDSHAKE_TIMEOUT,
    };
    let s = shared.clone();
    let listener = fp_conn::Listener::start(bound, opts, move |stream, peer| negotiate(&s, stream, peer))
        .map_err(|e| invalid("nbd_device", format!("cannot start the listener thread: {e}")))?;
    log::info!("nbd listener on {}{}", shared.address, if shared.tls.is_some() { " (TLS)" } else { "" });
    Ok(Listener { shared, listener })
}

/// The handshake's byte stream: plain, or TLS after NBD_OPT_STARTTLS.
struct Link {
    stream: Stream,
    tls: Option<Box<rustls::ServerConnection>>,
}

impl Link {
    fn read_exact(&mut self, buf: &mut [u8]) -> io::Result<()> {
        match &mut self.tls {
            None => self.stream.read_exact(buf),
            Some(c) => rustls::Stream::new(&mut **c, &mut self.stream).read_exact(buf),
        }
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        match &mut self.tls {
            None => self.stream.write_all(buf),
            Some(c) => {
                let mut s = rustls::Stream::new(&mut **c, &mut self.stream);
                s.write_all(buf)?;
                s.flush()
            }
        }
    }
}

fn negotiate(shared: &Arc<ListenerShared>, stream: Stream, peer: &str) -> Result<(), String> {
    let mut link = Link { stream, tls: None };
    let io = |what: &str, e: io::Error| format!("{what}: {e}");
    link.write_all(&greeting()).map_err(|e| io("sending the greeting", e))?;
    let mut flags = [0u8; 4];
    link.read_exact(&mut flags).map_err(|e| io("reading the client flags", e))?;
    let mut neg = Negotiation::new(shared.tls.is_some());
    neg.client_flags(u32::from_be_bytes(flags))?;
    let mut out = Vec::new();
    let mut data = Vec::new();
    loop {
        let mut h = [0u8; OPTION_HEADER_LEN];
        link.read_exact(&mut h).map_err(|e| io("reading an option", e))?;
        let header = OptionHeader::parse(&h).ok_or("bad option magic")?;
        neg.check_header(&header)?;
        data.resize(header.length as usize, 0);
        link.read_exact(&mut data).map_err(|e| io("reading an option's data", e))?;
        out.clear();
        let step = neg.option(&**shared, header, &data, &mut out);
        match step {
            Step::Close(reason) => return Err(reason),
            Step::Abort => {
                let _ = link.write_all(&out);
                return Ok(());
            }
            Step::Continue => link.write_all(&out).map_err(|e| io("sending an option reply", e))?,
            Step::StartTls => {
                link.write_all(&out).map_err(|e| io("sending an option reply", e))?;
                let config = shared.tls.as_ref().expect("STARTTLS only on TLS listeners").1.clone();
                let mut conn = rustls::ServerConnection::new(config).map_err(|e| format!("TLS: {e}"))?;
                while conn.is_handshaking() {
                    conn.complete_io(&mut link.stream).map_err(|e| format!("TLS handshake: {e}"))?;
                }
                link.tls = Some(Box::new(conn));
                neg.tls_started();
            }
            Step::Go(t) => {
                link.write_all(&out).map_err(|e| io("sending an option reply", e))?;
                return hand_over(link, t, peer);
            }
        }
    }
}

/// Moves a negotiated connection to a reactor of its export.
fn hand_over(link: Link, t: Transmission<Arc<ExportShared>>, peer: &str) -> Result<(), String> {
    let export = t.export;
    let fd = link.stream.into_nonblocking_fd().map_err(|e| format!("socket setup: {e}"))?;
    let reactor = export.next_reactor().clone();
    let setup = ConnSetup {
        fd,
        tls: link.tls,
        export: export.clone(),
        structured: t.structured,
        allocation: t.allocation,
        bitmaps: t.bitmaps.clone(),
        peer: peer.to_string(),
    };
    log::info!(
        "nbd export '{}': {peer} connected (reactor {}, {} replies{}{})",
        export.name,
        reactor.id(),
        if t.structured { "structured" } else { "simple" },
        if t.allocation { ", base:allocation" } else { "" },
        if t.bitmaps.is_empty() { String::new() } else { format!(", {} dirty bitmap(s)", t.bitmaps.len()) }
    );
    let handle = reactor.clone();
    reactor.send(move |r| {
        let export = setup.export.clone();
        let mut conns = export.conns();
        if conns.stopping {
            log::info!("nbd export '{}': {}: export stopping; connection closed", export.name, setup.peer);
            return;
        }
        let stats = Arc::new(ConnStats::new());
        match ConnPoller::new(setup, stats.clone()) {
            Ok(p) => {
                let id = r.add_poller(Box::new(p));
                conns.add((handle, id, stats));
            }
            Err(e) => {
                log::warn!("nbd export '{}': cannot open a channel: {e}; connection closed", export.name)
            }
        }
    });
    Ok(())
}
