//! The emulated controller's admin commands: Identify (controller, namespace, active list),
//! Set/Get Features, Create/Delete I/O SQ/CQ, Asynchronous Event Request, Keep Alive, Abort,
//! Doorbell Buffer Config, Get Log Page (error, health, changed namespaces).

use std::sync::atomic::Ordering;

use fp_nvme_spec::identify as id;
use fp_nvme_spec::{self as spec, Sqe, Status};

use super::device::{Cq, Device, Outcome, Sq, PAGE};
use super::io::{segments, to_host};

/// At most this many Asynchronous Event Requests outstanding (AERL + 1).
const AER_LIMIT: usize = 4;

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
        let mut d = vec![0u8; id::IDENTIFY_LEN];
        match (sqe.cdw(10) & 0xff) as u8 {
            id::CNS_CONTROLLER => {
                let put16 = |d: &mut [u8], at: usize, v: u16| d[at..at + 2].copy_from_slice(&v.to_le_bytes());
                let put32 = |d: &mut [u8], at: usize, v: u32| d[at..at + 4].copy_from_slice(&v.to_le_bytes());
                put16(&mut d, id::IDC_VID, 0x1b36);
                d[id::IDC_SN..id::IDC_SN + id::SN_LEN].copy_from_slice(b"FLASHPATH-EMU       ");
                d[id::IDC_MN..id::IDC_MN + id::MN_LEN]
                    .copy_from_slice(format!("{:<40}", "flashpath emulated controller").as_bytes());
                d[id::IDC_FR..id::IDC_FR + id::FR_LEN].copy_from_slice(b"1.0     ");
                d[id::IDC_MDTS] = cfg.mdts;
                put16(&mut d, id::IDC_CNTLID, 1);
                put32(&mut d, id::IDC_VER, 0x0002_0000);
                let oacs = if cfg.shadow_doorbells { id::OACS_DOORBELL_BUFFER_CONFIG } else { 0 };
                put16(&mut d, id::IDC_OACS, oacs);
                d[id::IDC_ACL] = 3; // 4 aborts
                d[id::IDC_AERL] = (AER_LIMIT - 1) as u8;
                d[id::IDC_LPA] = id::LPA_EXTENDED_DATA;
                d[id::IDC_SQES] = 0x66;
                d[id::IDC_CQES] = 0x44;
                put32(&mut d, id::IDC_NN, nn);
                put16(&mut d, id::IDC_ONCS, id::ONCS_DSM | id::ONCS_WRITE_ZEROES);
                if cfg.sgl {
                    put32(&mut d, id::IDC_SGLS, id::SGLS_SUPPORTED);
                }
                d[id::IDC_SUBNQN..id::IDC_SUBNQN + 30].copy_from_slice(b"nqn.2026-11.io.flashpath:emu00");
            }
            id::CNS_NAMESPACE => {
                let nsid = sqe.nsid();
                if nsid == 0 || nsid > nn {
                    return done(Status::generic(spec::SC_INVALID_NAMESPACE));
                }
                // An inactive namespace reads as zeroes (Base 5.17.2.1).
                if let Some(n) = namespaces.iter().find(|n| n.nsid == nsid) {
                    let blocks = n.num_blocks();
                    for at in [id::IDN_NSZE, id::IDN_NCAP, id::IDN_NUSE] {
                        d[at..at + 8].copy_from_slice(&blocks.to_le_bytes());
                    }
                    // LBADS, bits 23:16 of LBA format 0.
                    d[id::IDN_LBAF0 + 2] = n.block_size.trailing_zeros() as u8;
                }
            }
            id::CNS_ACTIVE_NS_LIST => {
                let mut ids: Vec<u32> =
                    namespaces.iter().map(|n| n.nsid).filter(|&i| i > sqe.nsid()).collect();
                ids.sort_unstable();
                for (i, nsid) in ids.iter().take(id::ACTIVE_LIST_MAX).enumerate() {
                    d[i * 4..i * 4 + 4].copy_from_slice(&nsid.to_le_bytes());
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
            return done(Status::command_specific(spec::SC_COMPLETION_QUEUE_INVALID));
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
            return done(Status::command_specific(spec::SC_INVALID_QUEUE_DELETION));
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
            spec::log_page::LID_ERROR => vec![0u8; spec::log_page::ERROR_ENTRY_LEN],
            spec::log_page::LID_SMART => vec![0u8; spec::log_page::SMART_LEN],
            spec::log_page::LID_CHANGED_NS => {
                let mut changed = self.sh.changed.lock().unwrap_or_else(|e| e.into_inner());
                let mut p = vec![0u8; spec::log_page::CHANGED_NS_LEN];
                for (i, nsid) in changed.iter().take(spec::log_page::CHANGED_NS_LEN / 4).enumerate() {
                    p[i * 4..i * 4 + 4].copy_from_slice(&nsid.to_le_bytes());
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
