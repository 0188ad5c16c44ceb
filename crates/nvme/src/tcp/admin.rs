//! The admin queue of the TCP transport: [`TcpQueue`] run one command at a time from the
//! controller's thread, registers reached by the Fabrics Property Get and Set commands, and
//! Asynchronous Event Requests left outstanding (their completions kept for
//! [`AdminQueue::poll_async_events`] when they come during another command).

use std::time::Duration;

use fp_bdev::Iovecs;
use fp_nvme_spec::fabrics::{property_get, property_set};
use fp_nvme_spec::{Cqe, Sqe};

use super::auth::{self, DhchapHost, QueueAuth};
use super::queue::{Dir, TcpQueue, AER_TAG};
use crate::cmd;
use crate::transport::{AdminData, AdminQueue};
use crate::NvmeError;

/// How long a Property Get or Set may take.
pub(crate) const PROPERTY_TIMEOUT: Duration = Duration::from_secs(5);

/// A controller's admin queue over NVMe/TCP.
pub struct TcpAdmin {
    pub(crate) q: TcpQueue,
    pub(crate) cntlid: u16,
    /// AER completions that came while another command was waited for.
    aers: Vec<Cqe>,
    /// Bytes of in-capsule data the controller takes on I/O queues (Identify Controller's
    /// IOCCSZ less the command).
    pub(crate) io_icd: u32,
    /// The largest transfer (Identify Controller's MDTS; 0 in MDTS is no limit, taken as
    /// u32::MAX here).
    pub(crate) max_transfer: u32,
}

impl TcpAdmin {
    pub(crate) fn new(q: TcpQueue, cntlid: u16) -> TcpAdmin {
        TcpAdmin { q, cntlid, aers: Vec::new(), io_icd: 0, max_transfer: u32::MAX }
    }

    /// The largest transfer one command may have on this controller, from Identify
    /// Controller's MDTS (read when the admin queue connected).
    pub fn max_transfer(&self) -> u32 {
        self.max_transfer
    }

    /// In-capsule data the controller accepts on I/O queues, in bytes.
    pub fn io_in_capsule_data(&self) -> u32 {
        self.io_icd
    }

    /// Runs a DH-HMAC-CHAP transaction on the live queue, keeping the AER completions that
    /// come meanwhile.
    pub(super) fn authenticate(&mut self, host: &DhchapHost, a: &QueueAuth<'_>) -> Result<(), NvmeError> {
        let aers = &mut self.aers;
        auth::authenticate(&mut self.q, host, a, &mut |tag: u32, cqe: &Cqe| {
            if tag == AER_TAG {
                aers.push(*cqe);
            }
        })
    }

    fn property(&mut self, sqe: Sqe, what: &'static str) -> Result<Cqe, NvmeError> {
        let cqe = self.execute(sqe, AdminData::None, PROPERTY_TIMEOUT)?;
        if !cqe.status.is_success() {
            return Err(NvmeError::Command { what, status: cqe.status });
        }
        Ok(cqe)
    }
}

impl AdminQueue for TcpAdmin {
    fn execute(&mut self, sqe: Sqe, data: AdminData<'_>, timeout: Duration) -> Result<Cqe, NvmeError> {
        let aers = &mut self.aers;
        self.q.run(&sqe, data, timeout, &mut |tag: u32, cqe: &Cqe| {
            if tag == AER_TAG {
                aers.push(*cqe);
            }
        })
    }

    fn submit_async_event_request(&mut self) -> Result<(), NvmeError> {
        self.q
            .submit_dir(&cmd::async_event_request(), Iovecs::NONE, Dir::None, AER_TAG)
            .map_err(|e| NvmeError::Gone(format!("no admin slot for an AER: {e}")))?;
        self.q.send()
    }

    fn poll_async_events(&mut self, out: &mut Vec<Cqe>) -> Result<(), NvmeError> {
        out.append(&mut self.aers);
        let mut stray = None;
        self.q.receive(&mut |tag: u32, cqe: &Cqe| {
            if tag == AER_TAG {
                out.push(*cqe);
            } else {
                stray = Some(cqe.cid);
            }
        })?;
        match stray {
            Some(cid) => {
                Err(NvmeError::Protocol(format!("admin completion of command {cid} nobody waits for")))
            }
            None => Ok(()),
        }
    }

    fn get_property(&mut self, offset: u32, eight_bytes: bool) -> Result<u64, NvmeError> {
        let cqe = self.property(property_get(offset, eight_bytes), "Property Get")?;
        let v = u64::from(cqe.dw0) | (u64::from(cqe.dw1) << 32);
        Ok(if eight_bytes { v } else { v & 0xffff_ffff })
    }

    fn set_property(&mut self, offset: u32, value: u64, eight_bytes: bool) -> Result<(), NvmeError> {
        self.property(property_set(offset, value, eight_bytes), "Property Set").map(|_| ())
    }

    fn cntlid(&self) -> u16 {
        self.cntlid
    }
}
