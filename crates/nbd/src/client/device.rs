//! The nbd_client bdev: a remote export as a [`BlockDevice`], one connection per channel.
//!
//! Creating the bdev connects once (on the RPC thread) to learn the export's size and flags;
//! that connection is kept for the first channel. Each further channel connects on the reactor
//! that opens it (bounded by the handshake timeout). A channel's socket sits in a private
//! epoll set that is the channel's completion fd: readable when replies are there, or when the
//! socket takes more of a request that did not fit. A private set rather than the socket itself,
//! because a dead socket is readable for ever and would keep waking the reactor: on a dead
//! connection the socket leaves the set, and the set stays quiet.
//!
//! A request waits for its reply [`DEFAULT_IO_TIMEOUT`] at most (`io_timeout_ms` at create):
//! a server that stops answering, or stops reading so the socket's send buffer fills, then
//! has its connection killed and every request on it completes with `EIO`, so nothing stacked
//! on the bdev (or exporting it) waits for ever. A timerfd in the epoll set wakes a reactor
//! sleeping on the channel at the deadline.

use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fp_bdev::clock::ticks;
use fp_bdev::{
    validate_geometry, BdevError, BdevInfo, BlockDevice, Capacity, IoChannel, IoOp, IoRequest, IoStatus,
    IoTypes, SubmitError,
};
use fp_conn::Interest;
use vmm_sys_util::epoll::{ControlOperation, EpollEvent, EventSet};
use vmm_sys_util::timerfd::TimerFd;

use crate::address::Address;
use crate::client::handshake::Negotiated;
use crate::client::socket::{connect, say_goodbye, still_open, ConnectError, Connected, SocketIo};
use crate::client::wire::Wire;
use crate::proto::*;

/// The module's name: its bdevs' `driver`, the `type` of its `[[bdev]]` tables.
pub const MODULE: &str = "nbd_client";

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

/// How long a request waits for its reply before its connection is declared dead, unless
/// `io_timeout_ms` says otherwise (Linux's nbd driver waits as long by default).
pub const DEFAULT_IO_TIMEOUT: Duration = Duration::from_secs(30);

/// The epoll token of a channel's timer (the socket's is 0).
const TIMER_TOKEN: u64 = 1;

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
    /// How long a request waits for its reply (zero: for ever).
    io_timeout: Duration,
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
            driver: MODULE,
            driver_specific: Some(("address".into(), detail.address.clone())),
        };
        Ok(NbdClientDevice {
            info,
            address,
            export,
            detail,
            spare: Mutex::new(Some(fd)),
            stats: Arc::new(ClientStats::default()),
            io_timeout: DEFAULT_IO_TIMEOUT,
        })
    }

    /// Sets how long a request waits for its reply on channels opened from now on; zero
    /// waits for ever.
    pub fn with_io_timeout(mut self, timeout: Duration) -> NbdClientDevice {
        self.io_timeout = timeout;
        self
    }

    /// How long a request waits for its reply.
    pub fn io_timeout(&self) -> Duration {
        self.io_timeout
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
    /// The socket in a private epoll set (the channel's completion fd), waiting for replies,
    /// and for room to send while requests wait to be written.
    interest: Interest,
    /// Fires at the wire's deadline, so a reactor asleep on the epoll set checks it.
    timer: TimerFd,
    /// The tick the timer is set for (0: disarmed).
    timer_at: u64,
    info: BdevInfo,
    address: String,
    stats: Arc<ClientStats>,
    reported: bool,
}

impl NbdClientChannel {
    fn new(dev: &NbdClientDevice, fd: OwnedFd, flags: u16) -> std::io::Result<NbdClientChannel> {
        let interest = Interest::new(fd.as_fd())?;
        let timer = TimerFd::new().map_err(|e| std::io::Error::from_raw_os_error(e.errno()))?;
        let timer_in = EpollEvent::new(EventSet::IN, TIMER_TOKEN);
        interest.epoll().ctl(ControlOperation::Add, timer.as_raw_fd(), timer_in)?;
        let mut wire = Wire::new(SocketIo(fd), flags, dev.export.max_payload());
        let rate = u128::from(ticks::tick_rate());
        let timeout = (dev.io_timeout.as_nanos() * rate / 1_000_000_000).min(u128::from(u64::MAX)) as u64;
        // A non-zero timeout of less than a tick still bounds the wait.
        wire.set_timeout(if dev.io_timeout.is_zero() { 0 } else { timeout.max(1) });
        dev.stats.connections.fetch_add(1, Ordering::Relaxed);
        Ok(NbdClientChannel {
            wire,
            interest,
            timer,
            timer_at: 0,
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
        // A dead socket reports hang-up whatever the interest, so it leaves the set.
        let _ = self.interest.epoll().ctl(ControlOperation::Delete, fd, EpollEvent::default());
        // The server learns at once that nothing more comes (a request cut off by a full send
        // buffer would otherwise leave it waiting for the rest). Nothing reads or writes the
        // socket again, so the callers' buffers are no longer touched.
        let _ = fp_sys::shutdown(self.wire.transport().0.as_fd());
        self.set_timer(0);
    }

    /// Sets the timer to fire at tick `at` (0: disarms it). Setting it also clears an expiry
    /// already signalled, so the epoll set is readable only for news.
    fn set_timer(&mut self, at: u64) {
        let now = ticks::now();
        if at == self.timer_at && (at == 0 || at > now) {
            return;
        }
        let wait = if at == 0 {
            Duration::ZERO
        } else {
            // A deadline already past still needs a non-zero time (zero disarms).
            Duration::from_nanos(ticks::ticks_to_ns(at.saturating_sub(now), ticks::tick_rate()).max(1))
        };
        let result = if at == 0 { self.timer.clear() } else { self.timer.reset(wait, None) };
        self.timer_at = if result.is_ok() { at } else { 0 };
    }
}

impl IoChannel for NbdClientChannel {
    fn submit(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        if req.op != IoOp::Flush {
            self.info.check_range(req.offset, req.len)?;
        }
        self.wire.submit(req)
    }

    fn poll(&mut self, done: &mut dyn FnMut(u32, IoStatus)) -> usize {
        if self.wire.deadline().is_some() {
            self.wire.expire(ticks::now());
        }
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
        Some(self.interest.as_raw_fd())
    }

    fn arm_completion_fd(&mut self) -> bool {
        self.wire.probe();
        self.check_dead();
        if self.wire.has_done() {
            return false;
        }
        if let Some(at) = self.wire.deadline() {
            if at <= ticks::now() {
                // Due now: the next poll kills the connection.
                return false;
            }
            self.set_timer(at);
        } else if self.timer_at != 0 {
            self.set_timer(0);
        }
        if self.wire.dead().is_none() {
            let want = if self.wire.wants_write() { EventSet::IN | EventSet::OUT } else { EventSet::IN };
            self.interest.set(want);
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
