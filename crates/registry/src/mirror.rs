//! The registry's mirror jobs (`fp_bdev::mirror`): starting one (checks, the target's claim,
//! the copier's poller on a reactor), listing, completing, cancelling. A job's target is
//! claimed `exclusive_write` by `mirror <job>` until the job is over; its source cannot be
//! deleted while the job is attached to it (`Registry::delete_bdev` asks the disk). Claims of
//! jobs that ended are released the next time the registry is locked, so no caller ever sees
//! a claim outlive its job for long. docs/mirror.md tells the story.

use std::sync::Arc;
use std::time::Duration;

use fp_bdev::copy_share::CopyShare;
use fp_bdev::mirror::{
    CopierPoll, CopyMode, MirrorCopier, MirrorError, MirrorJob, MirrorOptions, MirrorStatus,
};
use fp_bdev::{Bdev, ClaimType};
use fp_reactor::{PollStatus, Poller};

use crate::state::{Claim, MirrorEntry, State};
use crate::{Registry, RegistryError};

/// The claim holder's kind for mirror jobs.
pub(crate) const HOLDER_KIND: &str = "mirror";

/// How long `bdev_mirror_complete` and `bdev_mirror_cancel` wait for the job to end.
pub const MIRROR_WAIT: Duration = Duration::from_secs(60);

/// What `bdev_mirror_start` asks for.
#[derive(Debug, Clone)]
pub struct MirrorSpec {
    pub source: String,
    pub target: String,
    /// Defaults to the source's name.
    pub job_id: Option<String>,
    pub granularity: Option<u64>,
    /// The copy's speed limit in bytes per second; 0: none.
    pub speed: u64,
    /// The copy's share (percent, 1 to 100) of the source's requests in flight while the
    /// guest has some; `None`: the guest-first default.
    pub weight: Option<u64>,
    /// QEMU's `copy-mode`: "background" (the default) or "write-blocking".
    pub copy_mode: Option<String>,
}

fn holder(job_id: &str) -> String {
    format!("mirror {job_id}")
}

impl State {
    /// Releases the target claims of jobs that ended.
    pub(crate) fn reap_mirrors(&mut self) {
        let mut ended = Vec::new();
        for (id, e) in self.mirrors.iter_mut() {
            if !e.released && e.job.state().is_final() {
                e.released = true;
                ended.push((e.job.target().to_string(), holder(id)));
            }
        }
        for (target, holder) in ended {
            self.release(&target, HOLDER_KIND, &holder);
        }
    }
}

/// A mirror refusal as the registry reports it, naming the RPC field at fault.
fn mirror_error(e: MirrorError) -> RegistryError {
    match e {
        MirrorError::Invalid { field, reason } => RegistryError::Invalid { field, reason },
        MirrorError::AccountingOff(_) => RegistryError::NotAllowed { field: "source", reason: e.to_string() },
        MirrorError::SourceBusy { bdev, job } => RegistryError::InUse { name: bdev, by: holder(&job) },
        MirrorError::WrongState { .. } => RegistryError::NotNow(e.to_string()),
    }
}

/// The copier on its reactor.
struct CopierPoller(MirrorCopier);

impl Poller for CopierPoller {
    fn poll(&mut self) -> PollStatus {
        match self.0.poll() {
            CopierPoll::Busy => PollStatus::Busy,
            CopierPoll::Idle => PollStatus::Idle,
            CopierPoll::Finished => PollStatus::Finished,
        }
    }

    /// The copier waits on other reactors' channels and on its own I/O: it keeps its reactor
    /// polling until the job ends.
    fn has_pending(&self) -> bool {
        self.0.has_pending()
    }
}

impl Registry {
    /// `bdev_mirror_start`: attaches a job copying `source` to `target`; returns its id.
    pub fn mirror_start(&self, spec: MirrorSpec) -> Result<String, RegistryError> {
        let mut st = self.lock();
        let not_found = |name: &str| RegistryError::NotFound { kind: "bdev", name: name.into() };
        let source = st.canonical(&spec.source).ok_or_else(|| not_found(&spec.source))?.to_string();
        let target = st.canonical(&spec.target).ok_or_else(|| not_found(&spec.target))?.to_string();
        if source == target {
            let reason = format!("'{}' is the source itself", spec.target);
            return Err(RegistryError::Invalid { field: "target", reason });
        }
        let job_id = spec.job_id.unwrap_or_else(|| source.clone());
        if job_id.is_empty() {
            return Err(RegistryError::Invalid { field: "job_id", reason: "must not be empty".into() });
        }
        if st.mirrors.get(&job_id).is_some_and(|e| !e.job.state().is_final()) {
            return Err(RegistryError::AlreadyExists { kind: "mirror job", name: job_id });
        }
        let t = &st.bdevs[&target];
        t.check_claim(&target, ClaimType::ExclusiveWrite)?;
        let target_bdev: Bdev = Arc::new(t.disk.clone());
        let source_disk = st.bdevs[&source].disk.clone();
        let Some(reactor) = self.reactors.last().cloned() else {
            return Err(RegistryError::NotAllowed {
                field: "source",
                reason: "the daemon has no reactor to copy on".into(),
            });
        };
        let share = match spec.weight {
            None => CopyShare::default(),
            Some(w) => CopyShare::new(w)
                .map_err(|e| RegistryError::Invalid { field: "weight", reason: e.to_string() })?,
        };
        let copy_mode = match spec.copy_mode.as_deref() {
            None => CopyMode::default(),
            Some(name) => CopyMode::from_name(name).ok_or_else(|| RegistryError::Invalid {
                field: "copy_mode",
                reason: format!("'{name}' is not one of {}", CopyMode::NAMES.join(", ")),
            })?,
        };
        let options = MirrorOptions {
            job_id: job_id.clone(),
            granularity: spec.granularity,
            speed: spec.speed,
            share,
            copy_mode,
        };
        let (job, start) = MirrorJob::start(&source_disk, target_bdev, options).map_err(mirror_error)?;
        if let Some(t) = st.bdevs.get_mut(&target) {
            t.claims.push(Claim {
                holder: holder(&job_id),
                holder_kind: HOLDER_KIND,
                claim_type: ClaimType::ExclusiveWrite,
            });
        }
        st.mirrors.insert(job_id.clone(), MirrorEntry { job, released: false });
        drop(st);
        let wake: Vec<_> = self.reactors.clone();
        reactor.send(move |r| {
            // Wakes the reactors of the source's channels, and their parked pollers, so that
            // idle channels take up each change.
            let waker = Box::new(move || {
                for h in &wake {
                    h.send(|r| r.unpark_all());
                }
            });
            r.add_poller(Box::new(CopierPoller(start.open(Some(waker)))));
        });
        log::info!("mirror job '{job_id}' started: '{source}' to '{target}'");
        Ok(job_id)
    }

    fn mirror_job(&self, job_id: &str) -> Result<MirrorJob, RegistryError> {
        self.lock()
            .mirrors
            .get(job_id)
            .map(|e| e.job.clone())
            .ok_or_else(|| RegistryError::NotFound { kind: "mirror job", name: job_id.into() })
    }

    /// `bdev_mirror_get_jobs`: every job (those that ended too, until dismissed), or one.
    pub fn mirror_jobs(&self, job_id: Option<&str>) -> Result<Vec<MirrorStatus>, RegistryError> {
        match job_id {
            Some(id) => Ok(vec![self.mirror_job(id)?.status()]),
            None => Ok(self.lock().mirrors.values().map(|e| e.job.status()).collect()),
        }
    }

    /// `bdev_mirror_set_speed`: changes a running job's copy speed limit (0: none).
    pub fn mirror_set_speed(&self, job_id: &str, speed: u64) -> Result<(), RegistryError> {
        let job = self.mirror_job(job_id)?;
        if job.state().is_final() {
            return Err(RegistryError::NotNow(format!(
                "mirror job '{job_id}' is {}: it is over",
                job.state().name()
            )));
        }
        job.set_speed(speed);
        log::info!("mirror job '{job_id}': speed limit {speed} bytes/s (0: none)");
        Ok(())
    }

    /// `bdev_mirror_complete`: asks a ready job to complete and waits (up to `wait`) until it
    /// has: the target then holds what the source held, and is no longer claimed.
    pub fn mirror_complete(&self, job_id: &str, wait: Duration) -> Result<MirrorStatus, RegistryError> {
        let job = self.mirror_job(job_id)?;
        job.complete().map_err(mirror_error)?;
        self.mirror_wait(&job, wait)
    }

    /// `bdev_mirror_cancel`: cancels a job and waits until it let go of both disks; a job that
    /// already ended is dismissed (no longer listed).
    pub fn mirror_cancel(&self, job_id: &str, wait: Duration) -> Result<MirrorStatus, RegistryError> {
        let job = self.mirror_job(job_id)?;
        if job.state().is_final() {
            let mut st = self.lock();
            st.mirrors.remove(job_id);
            log::info!("mirror job '{job_id}' dismissed");
            return Ok(job.status());
        }
        job.cancel().map_err(mirror_error)?;
        self.mirror_wait(&job, wait)
    }

    fn mirror_wait(&self, job: &MirrorJob, wait: Duration) -> Result<MirrorStatus, RegistryError> {
        let state = job.wait(wait);
        // Releases the target's claim now, before the caller moves on to use it.
        drop(self.lock());
        if state.is_final() {
            return Ok(job.status());
        }
        let s = job.status();
        Err(RegistryError::NotNow(
            format!(
                "mirror job '{}' is still {} after {} s ({} bytes dirty, {} in flight); it goes on: see bdev_mirror_get_jobs",
                s.job_id,
                s.state.name(),
                wait.as_secs(),
                s.dirty_bytes,
                s.in_flight
            ),
        ))
    }

    /// The job attached to bdev `name` as its source, if any (deletion refuses it).
    pub(crate) fn mirror_on(st: &State, name: &str) -> Option<String> {
        st.bdevs.get(name).and_then(|e| e.disk.mirror_job())
    }
}

#[cfg(test)]
#[path = "mirror_tests.rs"]
mod tests;
