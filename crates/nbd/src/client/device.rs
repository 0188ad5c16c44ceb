//! The nbd_client bdev: a remote export as a [`BlockDevice`], one connection per channel.
//!
//! Creating the bdev connects once (on the RPC thread) to learn the export's size and flags;
//! that connection is kept for the first channel. Each further channel connects on the reactor
//! that opens it (bounded by the handshake timeout). A channel's socket sits in a private
//! epoll set that is the channel's completion fd: readable when replies are there, or when the
//! socket takes more of a request that did not fit. A private set rather than the socket itself,
//! because a dead socket is readable for ever and would keep waking the reactor: on a dead
//! connection the socket leaves the set, and the set stays quiet.

use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use fp_bdev::{
    validate_geometry, BdevError, BdevInfo, BlockDevice, Capacity, IoChannel, IoOp, IoRequest, IoStatus,
    IoTypes, SubmitError,
};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};

use crate::address::Address;
use crate::client::handshake::Negotiated;
use crate::client::socket::{connect, say_goodbye, still_open, ConnectError, Connected, SocketIo};
use crate::client::wire::Wire;
use crate::proto::*;

/// What `bdev_get_bdevs` reports of an nbd_client bdev, and what it was made with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NbdClientDetail {
    /// The address as given (socket path or URI).
    pub address: String,
    /// The export's name ("" for the server's default).
    pub export_name: String,
    /// Writes refused: the server's read-only flag, or asked for at create.
    pub read_only: bool,
}

/// Counters all channels of one device share (control-plane reads only).
#[derive(Debug, Default)]
pub struct ClientStats {
    /// Connections open now (channels).
    pub connections: AtomicUsize,
    /// Connections that died (server gone, protocol violation, I/O error).
    pub connections_lost: AtomicU64,
}

/// An nbd_client bdev.
pub struct NbdClientDevice {
    info: BdevInfo,
    address: Address,
    export: Negotiated,
    pub detail: NbdClientDetail,
    /// The create-time connection, for the first channel.
    spare: Mutex<Option<OwnedFd>>,
    pub stats: Arc<ClientStats>,
}

impl NbdClientDevice {
    /// Connects to `address`, negotiates `export_name`, and builds the bdev. `block_size`
    /// `None` takes the server's minimum block size (at least 512).
    pub fn connect(
        name: &str,
        address: Address,
        detail: NbdClientDetail,
        block_size: Option<u32>,
    ) -> Result<NbdClientDevice, BdevError> {
        let Connected { fd, export } = connect(&address, &detail.export_name).map_err(connect_error)?;
        NbdClientDevice::new(name, address, detail, block_size, fd, export)
    }

    /// The bdev over a negotiated connection.
    pub fn new(
        name: &str,
        address: Address,
        mut detail: NbdClientDetail,
        block_size: Option<u32>,
        fd: OwnedFd,
        export: Negotiated,
    ) -> Result<NbdClientDevice, BdevError> {
        let server_min = export.block_size.map_or(1, |b| b.min);
        let block_size = block_size.unwrap_or(server_min.max(512));
        if block_size < server_min {
            return Err(BdevError::InvalidParam {
                field: "block_size",
                reason: format!("{block_size} is below the server's minimum block size {server_min}"),
            });
        }
        let num_blocks = export.size / u64::from(block_size.max(1));
        validate_geometry(name, block_size, num_blocks).map_err(|e| match e {
            BdevError::InvalidParam { field: "num_blocks", .. } => BdevError::InvalidParam {
                field: "address",
                reason: format!(
                    "the export's {} bytes hold no whole block of {block_size} bytes",
                    export.size
                ),
            },
            other => other,
        })?;
        if !export.size.is_multiple_of(u64::from(block_size)) {
            log::warn!(
                "nbd_client bdev {name}: the export's last {} bytes are not a whole block and are left out",
                export.size % u64::from(block_size)
            );
        }
        detail.read_only |= export.read_only();
        let writable = !detail.read_only;
        let info = BdevInfo {
            name: name.to_string(),
            product_name: "NBD client disk".into(),
            block_size,
            capacity: Capacity::new(num_blocks),
            io_types: IoTypes {
                read: true,
                write: writable,
                flush: export.has(TFLAG_SEND_FLUSH),
                unmap: writable && export.has(TFLAG_SEND_TRIM),
                write_zeroes: writable && export.has(TFLAG_SEND_WRITE_ZEROES),
            },
            driver: crate::client::rpc::MODULE,
            driver_specific: Some(("address".into(), detail.address.clone())),
        };
        Ok(NbdClientDevice {
            info,
            address,
            export,
            detail,
            spare: Mutex::new(Some(fd)),
            stats: Arc::new(ClientStats::default()),
        })
    }

    /// What the server told at create: size, flags, block sizes.
    pub fn export(&self) -> &Negotiated {
        &self.export
    }

    /// The largest read or write one request may carry (bytes).
    pub fn max_transfer(&self) -> u32 {
        self.export.max_payload()
    }

    /// A connection for a new channel: the spare one, or a fresh one that must show the same
    /// export (a server restarted with another disk behind the name is refused).
    fn connection(&self) -> Result<OwnedFd, BdevError> {
        if let Some(fd) = self.spare.lock().unwrap_or_else(|p| p.into_inner()).take() {
            // The server may have closed it while nobody used it (an idle timeout, a restart).
            if still_open(fd.as_fd()) {
                return Ok(fd);
            }
        }
        let Connected { fd, export } =
            connect(&self.address, &self.detail.export_name).map_err(connect_error)?;
        if export.size != self.export.size || export.flags != self.export.flags {
            return Err(BdevError::Unsupported(format!(
                "nbd_client bdev {}: the export changed (now {} bytes, flags {:#x}; was {} bytes, flags {:#x})",
                self.info.name, export.size, export.flags, self.export.size, self.export.flags
            )));
        }
        if !export.has(TFLAG_CAN_MULTI_CONN) {
            log::warn!(
                "nbd_client bdev {}: a second connection to a server without multi-conn: a flush on one \
                 connection may not cover writes completed on another",
                self.info.name
            );
        }
        Ok(fd)
    }
}

fn connect_error(e: ConnectError) -> BdevError {
    match e {
        ConnectError::Handshake { .. } | ConnectError::Connect { .. } => {
            BdevError::InvalidParam { field: "address", reason: e.to_string() }
        }
    }
}

impl BlockDevice for NbdClientDevice {
    fn info(&self) -> &BdevInfo {
        &self.info
    }

    fn open_channel(&self) -> Result<Box<dyn IoChannel>, BdevError> {
        let fd = self.connection()?;
        let mut flags = self.export.flags;
        if self.detail.read_only {
            flags |= TFLAG_READ_ONLY;
        }
        let channel = NbdClientChannel::new(self, fd, flags).map_err(|e| {
            BdevError::Unsupported(format!("nbd_client bdev {}: epoll set: {e}", self.info.name))
        })?;
        Ok(Box::new(channel))
    }

    fn read_only(&self) -> bool {
        self.detail.read_only
    }
}

impl Drop for NbdClientDevice {
    fn drop(&mut self) {
        if let Some(fd) = self.spare.get_mut().unwrap_or_else(|p| p.into_inner()).take() {
            say_goodbye(fd.as_fd());
        }
    }
}

/// One connection, driven from its reactor's polls.
pub struct NbdClientChannel {
    wire: Wire<SocketIo>,
    epoll: Epoll,
    /// The epoll set's interest in the socket; empty once the socket left the set.
    interest: EventSet,
    info: BdevInfo,
    address: String,
    stats: Arc<ClientStats>,
    reported: bool,
}

impl NbdClientChannel {
    fn new(dev: &NbdClientDevice, fd: OwnedFd, flags: u16) -> std::io::Result<NbdClientChannel> {
        let epoll = Epoll::new()?;
        epoll.ctl(ControlOperation::Add, fd.as_raw_fd(), EpollEvent::new(EventSet::IN, 0))?;
        dev.stats.connections.fetch_add(1, Ordering::Relaxed);
        Ok(NbdClientChannel {
            wire: Wire::new(SocketIo(fd), flags, dev.export.max_payload()),
            epoll,
            interest: EventSet::IN,
            info: dev.info.clone(),
            address: dev.detail.address.clone(),
            stats: dev.stats.clone(),
            reported: false,
        })
    }

    /// Once the connection died: one log line, and the socket leaves the epoll set.
    fn check_dead(&mut self) {
        if self.reported {
            return;
        }
        let Some(why) = self.wire.dead() else { return };
        log::error!(
            "nbd_client bdev {}: connection to {} lost ({why}); its requests fail with EIO until the bdev is \
             deleted and created again",
            self.info.name,
            self.address
        );
        self.reported = true;
        self.stats.connections_lost.fetch_add(1, Ordering::Relaxed);
        let fd = self.wire.transport().fd();
        let _ = self.epoll.ctl(ControlOperation::Delete, fd, EpollEvent::default());
        self.interest = EventSet::empty();
    }
}

impl IoChannel for NbdClientChannel {
    unsafe fn submit(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        if req.op != IoOp::Flush {
            self.info.check_range(req.offset, req.len)?;
        }
        // SAFETY: the caller's contract, passed on.
        unsafe { self.wire.submit(req) }
    }

    fn poll(&mut self, done: &mut dyn FnMut(u32, IoStatus)) -> usize {
        let n = self.wire.poll(done);
        if self.wire.dead().is_some() {
            self.check_dead();
        }
        n
    }

    fn in_flight(&self) -> usize {
        self.wire.in_flight()
    }

    fn completion_fd(&self) -> Option<RawFd> {
        Some(self.epoll.as_raw_fd())
    }

    fn arm_completion_fd(&mut self) -> bool {
        self.wire.probe();
        self.check_dead();
        if self.wire.has_done() {
            return false;
        }
        if self.wire.dead().is_none() {
            let want = if self.wire.wants_write() { EventSet::IN | EventSet::OUT } else { EventSet::IN };
            if want != self.interest {
                let fd = self.wire.transport().fd();
                if self.epoll.ctl(ControlOperation::Modify, fd, EpollEvent::new(want, 0)).is_err() {
                    // Without the interest the sleep might miss the socket: keep polling.
                    return false;
                }
                self.interest = want;
            }
        }
        true
    }

    fn sleeps_in_flight(&self) -> bool {
        true
    }
}

impl Drop for NbdClientChannel {
    fn drop(&mut self) {
        self.stats.connections.fetch_sub(1, Ordering::Relaxed);
        if self.wire.dead().is_none() && self.wire.in_flight() == 0 {
            say_goodbye(self.wire.transport().0.as_fd());
        }
    }
}
