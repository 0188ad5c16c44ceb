//! What a transport gives the controller code: an admin queue, run from the controller's
//! control-plane thread, and I/O queue pairs, each polled by one reactor. The PCIe transport
//! (`pcie`) and the TCP transport (`tcp`) implement these; `ctrlr` and `bdev` know only them.
//!
//! The queue-pair logic both transports share (command ids, the tags behind them, submission
//! times for timeouts, refusing completions for commands not in flight) is [`crate::cid`].

use std::time::Duration;

use fp_bdev::{Iovecs, SubmitError};
use fp_crypto::dhchap::DhchapSecret;
use fp_nvme_spec::{Cqe, Sqe, Status};

use crate::NvmeError;

/// The data of an admin command. The transport moves it (PCIe: through DMA memory of its own;
/// TCP: in the capsule or in data PDUs), so callers hand plain slices.
pub enum AdminData<'a> {
    /// No data.
    None,
    /// The controller fills this (Identify, Get Log Page, Get Features with data).
    FromDevice(&'a mut [u8]),
    /// The controller reads this (Set Features with data).
    ToDevice(&'a [u8]),
}

/// How the controller code reaches one controller. Made by `bdev_nvme_attach_controller` from
/// its transport ID; used again for every reconnect and reset.
pub trait Transport: Send + Sync + 'static {
    /// The admin queue this transport makes.
    type Admin: AdminQueue;
    /// The I/O queue pairs this transport makes.
    type Io: IoQueue;

    /// SPDK's `trtype`: "PCIe" or "TCP".
    fn trtype(&self) -> &'static str;

    /// SPDK's `traddr` (a PCI address, an IP address), for `bdev_nvme_get_controllers`.
    fn traddr(&self) -> String;

    /// The whole transport ID as `bdev_nvme_get_controllers` shows it; by default `trtype`
    /// and `traddr` alone (a TCP transport adds `adrfam`, `trsvcid`, `subnqn`).
    fn trid(&self) -> TransportId {
        TransportId { trtype: self.trtype().to_string(), traddr: self.traddr(), ..TransportId::default() }
    }

    /// The host's identity on the controller (NVMe-oF: the host NQN and the local address
    /// and port of the admin connection), for `bdev_nvme_get_controllers`' `host`.
    fn host(&self) -> HostId {
        HostId::default()
    }

    /// The transport's own bound on one command's data in bytes, besides the controller's
    /// MDTS (PCIe: what one PRP list page and one bounce buffer hold). The channel splits
    /// requests above the smaller of the two.
    fn max_transfer(&self) -> u32 {
        u32::MAX
    }

    /// Connects the admin queue (`depth` entries) and enables the controller: afterwards
    /// CSTS.RDY is 1 and Identify works. PCIe (Base 3.5.1): CC.EN=0 and wait for RDY=0,
    /// AQA/ASQ/ACQ, CC with the queue entry sizes and EN=1, wait for RDY=1 within CAP.TO.
    /// TCP: a connection, ICReq/ICResp, Fabrics Connect of queue 0, then the same CC/CSTS
    /// steps through Property Set/Get. Called again after a reset or a lost connection.
    fn connect_admin(&self, depth: u16, timeout: Duration) -> Result<Self::Admin, NvmeError>;

    /// Makes I/O queue pair `qid` (1-based) with `depth` entries. PCIe: Create I/O Completion
    /// Queue then Create I/O Submission Queue through `admin` (Base 5.4, 5.5); TCP: a
    /// connection and a Fabrics Connect of `qid` with the admin queue's controller ID. The
    /// queue is then moved to the reactor that polls it.
    fn connect_io(&self, admin: &mut Self::Admin, qid: u16, depth: u16) -> Result<Self::Io, NvmeError>;

    /// Deletes I/O queue pair `qid` on the controller (PCIe: Delete I/O Submission Queue, then
    /// Completion Queue; TCP: nothing, closing the queue's connection is enough). The queue
    /// has been drained by its reactor (nothing in flight) and handed back to the controller
    /// thread, which drops it only after this returns: the device stops using the queue's
    /// memory before that memory is freed.
    fn disconnect_io(&self, admin: &mut Self::Admin, qid: u16) -> Result<(), NvmeError>;

    /// Shuts the controller down cleanly (CC.SHN normal, wait for CSTS.SHST complete) before
    /// a detach. Best effort: a controller already gone is not an error worth reporting.
    fn shutdown(&self, admin: &mut Self::Admin, timeout: Duration);

    /// Replaces the in-band authentication keys (`bdev_nvme_set_keys`): later connects use
    /// them. None of a key clears it. Only NVMe over Fabrics authenticates.
    fn set_dhchap_keys(
        &self,
        _key: Option<DhchapSecret>,
        _ctrlr_key: Option<DhchapSecret>,
    ) -> Result<(), NvmeError> {
        Err(NvmeError::Unsupported(format!(
            "{} controllers do not authenticate (DH-HMAC-CHAP)",
            self.trtype()
        )))
    }

    /// Authenticates the live admin queue again with the keys now (in band).
    fn reauthenticate_admin(&self, _admin: &mut Self::Admin, _timeout: Duration) -> Result<(), NvmeError> {
        Err(NvmeError::Unsupported(format!(
            "{} controllers do not authenticate (DH-HMAC-CHAP)",
            self.trtype()
        )))
    }

    /// Makes every live I/O queue authenticate again with the keys now (in band, each on its
    /// reactor) and waits up to `timeout` for the outcomes of `queues` of them; the first
    /// failure is the error (its queue fails).
    fn reauthenticate_io(&self, _queues: usize, _timeout: Duration) -> Result<(), NvmeError> {
        Err(NvmeError::Unsupported(format!(
            "{} controllers do not authenticate (DH-HMAC-CHAP)",
            self.trtype()
        )))
    }
}

/// SPDK's transport ID, as `bdev_nvme_get_controllers` shows it (`trid`); empty fields are
/// left out.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct TransportId {
    /// "PCIe" or "TCP".
    pub trtype: String,
    /// "IPv4" or "IPv6" (TCP).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adrfam: Option<String>,
    /// The PCI address or the IP address.
    pub traddr: String,
    /// The port (TCP).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trsvcid: Option<String>,
    /// The subsystem NQN (TCP).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subnqn: Option<String>,
}

/// The host's side of a controller association (`bdev_nvme_get_controllers`' `host`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct HostId {
    /// The host NQN.
    pub nqn: String,
    /// The local address.
    pub addr: String,
    /// The local port.
    pub svcid: String,
}

/// A controller's admin queue. Lives on the controller's control-plane thread: commands are
/// run one at a time to completion, except Asynchronous Event Requests, which stay
/// outstanding and complete through [`AdminQueue::poll_async_events`].
pub trait AdminQueue: Send {
    /// Runs `sqe` (the queue sets its command id and data pointer) and waits up to `timeout`
    /// for its completion. An error status is returned as the completion, not as an error;
    /// `Err` means no completion came ([`NvmeError::Timeout`]) or the queue died.
    fn execute(&mut self, sqe: Sqe, data: AdminData<'_>, timeout: Duration) -> Result<Cqe, NvmeError>;

    /// Submits an Asynchronous Event Request (Base 5.2) that stays outstanding.
    fn submit_async_event_request(&mut self) -> Result<(), NvmeError>;

    /// Reaps completions without waiting: those of Asynchronous Event Requests are appended to
    /// `out` (any other completion here is a protocol violation).
    fn poll_async_events(&mut self, out: &mut Vec<Cqe>) -> Result<(), NvmeError>;

    /// Reads a controller register (PCIe: BAR0; TCP: the Fabrics Property Get command): 4 or
    /// 8 bytes at `offset` ([`fp_nvme_spec::registers`]).
    fn get_property(&mut self, offset: u32, eight_bytes: bool) -> Result<u64, NvmeError>;

    /// Writes a controller register (PCIe: BAR0; TCP: Property Set).
    fn set_property(&mut self, offset: u32, value: u64, eight_bytes: bool) -> Result<(), NvmeError>;

    /// The controller ID (Identify Controller's CNTLID; on TCP, Connect's answer).
    fn cntlid(&self) -> u16;
}

/// Counters an I/O queue keeps, read by its owner (the channel) for statistics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct QueueStats {
    /// Commands submitted.
    pub submitted: u64,
    /// Completions reaped.
    pub completed: u64,
    /// Doorbell writes (PCIe, both queues; skipped ones with shadow doorbells not counted) or
    /// send calls (TCP).
    pub doorbells: u64,
    /// Requests whose data was copied through the queue's own DMA memory because the
    /// caller's buffer was not registered ([`fp_bdev::dma`]) or not describable by PRPs.
    pub bounced: u64,
}

/// One I/O queue pair, owned and polled by one reactor (a channel). Made on the control plane
/// by [`Transport::connect_io`] and moved to the reactor: no locks inside.
pub trait IoQueue: Send {
    /// The queue's ID (1-based).
    fn qid(&self) -> u16;

    /// Queues one command: `sqe` carries the opcode, namespace and command dwords; the queue
    /// sets the command ID and the data pointer (PRPs, an SGL, or the transport's own data
    /// transfer) from `iov`, which may be empty. `tag` comes back with the completion. Not
    /// sent before [`IoQueue::flush`]. [`SubmitError::Busy`] when no slot is free.
    ///
    /// The buffers `iov` describes stay valid until the completion is returned by
    /// [`IoQueue::poll`] or the tag by [`IoQueue::drain`] (what [`Iovecs`] vouch for); the
    /// iovec array itself is read only during the call (the queue keeps a copy), so a caller
    /// may reuse the array it cut a command's iovecs into for the next command.
    fn submit(&mut self, sqe: &Sqe, iov: Iovecs, tag: u32) -> Result<(), SubmitError>;

    /// Sends what was queued since the last flush: one doorbell write (PCIe), one `sendmsg`
    /// (TCP). Called once per poll round.
    fn flush(&mut self);

    /// Reaps completions, appending `(tag, status)` for each; returns how many. `Err` means the
    /// queue is dead (the connection was lost, the device is gone, or it broke the protocol:
    /// [`NvmeError::Protocol`]); nothing in flight will complete, and the caller takes the tags
    /// back with [`IoQueue::drain`].
    fn poll(&mut self, out: &mut Vec<(u32, Status)>) -> Result<usize, NvmeError>;

    /// Commands submitted and not yet completed.
    fn in_flight(&self) -> usize;

    /// The command IDs and tags of commands in flight that were submitted before tick
    /// `submitted_before` ([`fp_bdev::clock::ticks`]), for the timeout path (abort, reset).
    fn expired(&self, submitted_before: u64, out: &mut Vec<(u16, u32)>);

    /// Forgets every command in flight, appending their tags to `out`: after a reset or a lost
    /// connection nothing will complete them. The queue is not used again.
    fn drain(&mut self, out: &mut Vec<u32>);

    /// The queue's counters.
    fn stats(&self) -> QueueStats;
}

/// What the controller code needs to know of a transport's limits once the admin queue is up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The largest transfer of one command in bytes (Identify Controller's MDTS, or the
    /// transport's own bound); larger requests are split by the channel.
    pub max_transfer: u32,
    /// The most entries an I/O queue may have (CAP.MQES + 1; on TCP the target's bound).
    pub max_queue_entries: u16,
}

/// How long one register wait may take before giving up: CAP.TO in units of 500 ms (Base
/// 3.1.3.1), at least one unit.
pub fn ready_timeout(cap: u64) -> Duration {
    Duration::from_millis(500 * ((cap >> 24) & 0xff).max(1))
}
