//! The emulated controller's admin commands: Identify (controller, namespace, active list),
//! Set/Get Features, Create/Delete I/O SQ/CQ, Asynchronous Event Request, Keep Alive, Abort,
//! Doorbell Buffer Config, Get Log Page (error, health, changed namespaces).

use std::sync::atomic::Ordering;

use fp_nvme_spec::{self as spec, Sqe, Status};

use super::device::{Cq, Device, Outcome, Sq, PAGE};
use super::io::{segments, to_host};

/// At most this many Asynchronous Event Requests outstanding (AERL + 1).
const AER_LIMIT: usize = 4;
/// Completion Queue Invalid (Base Figure 97).
const SC_COMPLETION_QUEUE_INVALID: u8 = 0x00;
/// Invalid Queue Deletion.
const SC_INVALID_QUEUE_DELETION: u8 = 0x0C;

fn done(status: Status) -> Outcome {
    Outcome::Done(status, 0)
}

fn ok(dw0: u32) -> Outcome {
    Outcome::Done(Status::SUCCESS, dw0)
}

impl Device {
    /// Executes an admin command.
    pub(crate) fn admin(&mut self, sqe: &Sqe) -> Outcome {
        if sqe.psdt() != 0 {
            // Admin commands use PRPs (Base 4.1.2: SGLs are for I/O commands on PCIe).
            return done(Status::generic(spec::SC_INVALID_FIELD));
        }
        match sqe.opcode() {
            spec::ADMIN_IDENTIFY => self.identify(sqe),
            spec::ADMIN_SET_FEATURES | spec::ADMIN_GET_FEATURES => self.features(sqe),
            spec::ADMIN_CREATE_IO_CQ => self.create_cq(sqe),
            spec::ADMIN_CREATE_IO_SQ => self.create_sq(sqe),
            spec::ADMIN_DELETE_IO_SQ => self.delete_sq(sqe),
            spec::ADMIN_DELETE_IO_CQ => self.delete_cq(sqe),
            spec::ADMIN_ASYNC_EVENT_REQUEST => {
                if self.aers.len() >= AER_LIMIT {
                    return done(Status::command_specific(spec::SC_ASYNC_EVENT_LIMIT_EXCEEDED));
                }
                self.aers.push(sqe.cid());
                Outcome::Later
            }
            spec::ADMIN_KEEP_ALIVE => {
                self.sh.keep_alives.fetch_add(1, Ordering::Relaxed);
                ok(0)
            }
            spec::ADMIN_ABORT => self.abort(sqe),
            spec::ADMIN_DOORBELL_BUFFER_CONFIG => self.doorbell_buffer_config(sqe),
            spec::ADMIN_GET_LOG_PAGE => self.log_page(sqe),
            _ => done(Status::generic(spec::SC_INVALID_OPCODE)),
        }
    }

    fn reply(&self, sqe: &Sqe, data: &[u8]) -> Outcome {
        match segments(sqe, data.len()) {
            Ok(segs) => {
                to_host(&segs, data);
                ok(0)
            }
            Err(s) => done(s),
        }
    }

    fn identify(&mut self, sqe: &Sqe) -> Outcome {
        let cfg = &self.sh.cfg;
        let namespaces = self.sh.namespaces.lock().unwrap_or_else(|e| e.into_inner());
        let nn =
            cfg.namespaces.iter().map(|n| n.nsid).chain(namespaces.iter().map(|n| n.nsid)).max().unwrap_or(1);
        let mut d = vec![0u8; 4096];
        match (sqe.cdw(10) & 0xff) as u8 {
            spec::identify::CNS_CONTROLLER => {
                d[0..2].copy_from_slice(&0x1b36u16.to_le_bytes());
                d[4..24].copy_from_slice(b"FLASHPATH-EMU       ");
                d[24..64].copy_from_slice(format!("{:<40}", "flashpath emulated controller").as_bytes());
                d[64..72].copy_from_slice(b"1.0     ");
                d[77] = cfg.mdts;
                d[78..80].copy_from_slice(&1u16.to_le_bytes());
                d[80..84].copy_from_slice(&0x0002_0000u32.to_le_bytes());
                let oacs: u16 = if cfg.shadow_doorbells { 1 << 8 } else { 0 };
                d[256..258].copy_from_slice(&oacs.to_le_bytes());
                d[258] = 3; // ACL: 4 aborts
                d[259] = (AER_LIMIT - 1) as u8;
                d[261] = 1 << 2; // LPA: extended data for Get Log Page
                d[512] = 0x66; // SQES
                d[513] = 0x44; // CQES
                d[516..520].copy_from_slice(&nn.to_le_bytes());
                d[520..522].copy_from_slice(&((1u16 << 2) | (1 << 3)).to_le_bytes()); // ONCS: DSM, Write Zeroes
                if cfg.sgl {
                    d[536..540].copy_from_slice(&1u32.to_le_bytes());
                }
                d[768..768 + 30].copy_from_slice(b"nqn.2026-11.io.flashpath:emu00");
            }
            spec::identify::CNS_NAMESPACE => {
                let nsid = sqe.nsid();
                if nsid == 0 || nsid > nn {
                    return done(Status::generic(spec::SC_INVALID_NAMESPACE));
                }
                // An inactive namespace reads as zeroes (Base 5.17.2.1).
                if let Some(n) = namespaces.iter().find(|n| n.nsid == nsid) {
                    let blocks = n.num_blocks();
                    for at in [0, 8, 16] {
                        d[at..at + 8].copy_from_slice(&blocks.to_le_bytes());
                    }
                    d[128 + 2] = n.block_size.trailing_zeros() as u8;
                }
            }
            spec::identify::CNS_ACTIVE_NS_LIST => {
                let mut ids: Vec<u32> =
                    namespaces.iter().map(|n| n.nsid).filter(|&i| i > sqe.nsid()).collect();
                ids.sort_unstable();
                for (i, id) in ids.iter().take(1024).enumerate() {
                    d[i * 4..i * 4 + 4].copy_from_slice(&id.to_le_bytes());
                }
            }
            _ => return done(Status::generic(spec::SC_INVALID_FIELD)),
        }
        drop(namespaces);
        self.reply(sqe, &d)
    }

    fn features(&mut self, sqe: &Sqe) -> Outcome {
        let fid = (sqe.cdw(10) & 0xff) as u8;
        let set = sqe.opcode() == spec::ADMIN_SET_FEATURES;
        if fid == spec::features::FID_NUMBER_OF_QUEUES {
            let n = u32::from(self.sh.cfg.io_queues.max(1) - 1);
            return ok(n | (n << 16));
        }
        if set {
            self.features[fid as usize] = sqe.cdw(11);
        }
        ok(self.features[fid as usize])
    }

    fn queue_params(&self, sqe: &Sqe) -> Result<(u16, u16, u64), Outcome> {
        let qid = sqe.cdw(10) as u16;
        let size = (sqe.cdw(10) >> 16) + 1;
        let iova = u64::from_le_bytes(sqe.0[24..32].try_into().expect("eight bytes"));
        if qid == 0 || qid as usize >= self.sqs.len() {
            return Err(done(Status::command_specific(spec::SC_INVALID_QUEUE_IDENTIFIER)));
        }
        if size < 2 || size > u32::from(self.sh.cfg.max_queue_entries) {
            return Err(done(Status::command_specific(spec::SC_INVALID_QUEUE_SIZE)));
        }
        // Physically contiguous (PC) is all the emulation takes, page aligned.
        if sqe.cdw(11) & 1 == 0 || iova % PAGE != 0 {
            return Err(done(Status::generic(spec::SC_INVALID_FIELD)));
        }
        Ok((qid, size as u16, iova))
    }

    fn create_cq(&mut self, sqe: &Sqe) -> Outcome {
        let (qid, size, iova) = match self.queue_params(sqe) {
            Ok(p) => p,
            Err(o) => return o,
        };
        if self.cqs[qid as usize].is_some() {
            return done(Status::command_specific(spec::SC_INVALID_QUEUE_IDENTIFIER));
        }
        self.cqs[qid as usize] = Some(Cq { iova, size, tail: 0, phase: true, shadow: self.dbbuf.is_some() });
        self.quiet_cq_event(qid);
        ok(0)
    }

    fn create_sq(&mut self, sqe: &Sqe) -> Outcome {
        let (qid, size, iova) = match self.queue_params(sqe) {
            Ok(p) => p,
            Err(o) => return o,
        };
        let cqid = (sqe.cdw(11) >> 16) as u16;
        if cqid == 0 || self.cqs.get(cqid as usize).and_then(Option::as_ref).is_none() {
            return done(Status::command_specific(SC_COMPLETION_QUEUE_INVALID));
        }
        if self.sqs[qid as usize].is_some() {
            return done(Status::command_specific(spec::SC_INVALID_QUEUE_IDENTIFIER));
        }
        self.sqs[qid as usize] = Some(Sq { iova, size, head: 0, cqid, shadow: self.dbbuf.is_some() });
        ok(0)
    }

    fn delete_sq(&mut self, sqe: &Sqe) -> Outcome {
        let qid = sqe.cdw(10) as u16;
        match self.sqs.get_mut(qid as usize) {
            Some(q @ Some(_)) if qid != 0 => {
                *q = None;
                self.held.retain(|h| h.sqid != qid);
                ok(0)
            }
            _ => done(Status::command_specific(spec::SC_INVALID_QUEUE_IDENTIFIER)),
        }
    }

    fn delete_cq(&mut self, sqe: &Sqe) -> Outcome {
        let qid = sqe.cdw(10) as u16;
        if self.sqs.iter().flatten().any(|s| s.cqid == qid) && qid != 0 {
            return done(Status::command_specific(SC_INVALID_QUEUE_DELETION));
        }
        match self.cqs.get_mut(qid as usize) {
            Some(q @ Some(_)) if qid != 0 => {
                *q = None;
                ok(0)
            }
            _ => done(Status::command_specific(spec::SC_INVALID_QUEUE_IDENTIFIER)),
        }
    }

    /// Abort (Base 5.1): a held command completes with Command Abort Requested; dword 0 bit 0
    /// clear says it was aborted.
    fn abort(&mut self, sqe: &Sqe) -> Outcome {
        let sqid = sqe.cdw(10) as u16;
        let cid = (sqe.cdw(10) >> 16) as u16;
        let Some(i) = self.held.iter().position(|h| h.sqid == sqid && h.cid == cid) else {
            return ok(1);
        };
        self.held.remove(i);
        self.sh.aborts.fetch_add(1, Ordering::Relaxed);
        let head = self.sqs.get(sqid as usize).and_then(Option::as_ref).map_or(0, |s| s.head);
        self.post(sqid, cid, Status::generic(spec::SC_ABORT_REQUESTED), 0, head, false);
        ok(0)
    }

    fn doorbell_buffer_config(&mut self, sqe: &Sqe) -> Outcome {
        if !self.sh.cfg.shadow_doorbells {
            return done(Status::generic(spec::SC_INVALID_OPCODE));
        }
        let prp = |at: usize| u64::from_le_bytes(sqe.0[at..at + 8].try_into().expect("eight bytes"));
        let (shadow, events) = (prp(24), prp(32));
        if shadow % PAGE != 0 || events % PAGE != 0 || shadow == 0 || events == 0 {
            return done(Status::generic(spec::SC_INVALID_FIELD));
        }
        self.dbbuf = Some((shadow, events));
        self.sh.dbbuf_configs.fetch_add(1, Ordering::Relaxed);
        ok(0)
    }

    fn log_page(&mut self, sqe: &Sqe) -> Outcome {
        let lid = (sqe.cdw(10) & 0xff) as u8;
        let numd = (sqe.cdw(10) >> 16) | ((sqe.cdw(11) & 0xffff) << 16);
        let len = (numd as usize + 1) * 4;
        let offset = u64::from(sqe.cdw(12)) | (u64::from(sqe.cdw(13)) << 32);
        if len > 64 * 1024 {
            return done(Status::generic(spec::SC_INVALID_FIELD));
        }
        let mut page = match lid {
            spec::log_page::LID_ERROR => vec![0u8; 64],
            spec::log_page::LID_SMART => vec![0u8; 512],
            spec::log_page::LID_CHANGED_NS => {
                let mut changed = self.sh.changed.lock().unwrap_or_else(|e| e.into_inner());
                let mut p = vec![0u8; 4096];
                for (i, id) in changed.iter().take(1024).enumerate() {
                    p[i * 4..i * 4 + 4].copy_from_slice(&id.to_le_bytes());
                }
                // Reading the log clears it (Retain Asynchronous Event is not kept here).
                changed.clear();
                p
            }
            _ => return done(Status::command_specific(spec::SC_INVALID_LOG_PAGE)),
        };
        let start = (offset as usize).min(page.len());
        page.drain(..start);
        page.resize(len, 0);
        self.reply(sqe, &page)
    }
}
