//! Online re-encryption of a crypto bdev (cryptsetup's `reencrypt`, forward direction): a job
//! rewrites the disk hotzone by hotzone from the old key to a new one while guests use it.
//!
//! Below the boundary sectors are under the new key, from it under the old; the channels pick
//! the key per data unit (`shared.rs` has the protocol that keeps a request's keys fixed). For
//! each hotzone the job holds it (guest requests overlapping it get `Busy`), waits until no
//! channel has one in flight, reads the old ciphertext, hands its sectors' SHA-256 to the
//! [`ReencryptCheckpoint`] (durable), rewrites it under the new key, flushes, records the new
//! boundary, and only then moves the boundary. A crash inside a hotzone is repaired by
//! [`recover_hotzone`] from the stored checksums. docs/crypto.md, "Online re-encryption
//! (engine)", has the design and its choices.

mod checkpoint;
mod error;
pub(crate) mod shared;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fp_bdev::{Bdev, BdevInfo, BlockDevice};

pub use checkpoint::{
    recover_hotzone, CheckpointRecord, Hotzone, MemoryCheckpoint, Recovered, ReencryptCheckpoint,
    DEFAULT_HOTZONE, MAX_HOTZONE,
};
pub use error::ReencryptError;

use crate::{CryptoDevice, CryptoKey, CryptoLayout, XtsEngine};
use checkpoint::{sector_sums, BaseIo};
use shared::{ReencShared, Slots};

/// A job's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReencryptState {
    /// Rewriting hotzones.
    Running,
    /// Paused between hotzones ([`ReencryptJob::pause`]).
    Paused,
    /// Every sector is under the new key (the checkpoint's `finish` returned).
    Done,
    /// Stopped on an error ([`ReencryptProgress::error`]); the disk serves its mixed state
    /// (but for a hotzone left part rewritten, which fails with EIO until recovered).
    Failed,
    /// Cancelled: the disk serves its mixed state, the checkpoint has the boundary, a later
    /// start continues from it.
    Cancelled,
}

impl ReencryptState {
    const ALL: [ReencryptState; 5] = [
        ReencryptState::Running,
        ReencryptState::Paused,
        ReencryptState::Done,
        ReencryptState::Failed,
        ReencryptState::Cancelled,
    ];

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            ReencryptState::Running => "running",
            ReencryptState::Paused => "paused",
            ReencryptState::Done => "done",
            ReencryptState::Failed => "failed",
            ReencryptState::Cancelled => "cancelled",
        }
    }

    /// Whether the job is over.
    pub fn is_final(self) -> bool {
        matches!(self, ReencryptState::Done | ReencryptState::Failed | ReencryptState::Cancelled)
    }
}

/// A job's progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReencryptProgress {
    /// Its state.
    pub state: ReencryptState,
    /// Bytes of the data area under the new key (the boundary).
    pub done: u64,
    /// Bytes of the data area.
    pub total: u64,
    /// Why it failed.
    pub error: Option<String>,
}

/// A step of a hotzone, where a test may stop the job (`ReencryptOptions::hook`).
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// No channel has a request overlapping the hotzone in flight; nothing read yet.
    Quiesced,
    /// The checkpoint has the hotzone and its checksums; nothing written.
    Begun,
    /// The first half of the hotzone's sectors is written under the new key.
    HalfWritten,
    /// All of it is written and flushed; the checkpoint has not advanced.
    Written,
    /// The boundary moved past it; nothing is held (the offset is the hotzone's).
    Advanced,
}

/// A test's hook: called at each [`Step`] (it may block there); `true` stops the job on the
/// spot, as a crash would (nothing more is written or recorded, the hotzone stays held).
#[cfg(test)]
pub(crate) type Hook = Arc<dyn Fn(Step, u64) -> bool + Send + Sync>;

/// How a job runs.
#[derive(Clone)]
pub struct ReencryptOptions {
    /// Bytes rewritten per step: a multiple of the sector size, at most [`MAX_HOTZONE`].
    pub hotzone: u64,
    /// MiB per second (0: no limit); [`ReencryptJob::set_speed_limit`] changes it.
    pub speed_limit_mib_s: u64,
    /// How long guest requests overlapping a hotzone may stay in flight before the job fails
    /// (and how long a Busy base is retried).
    pub quiesce_timeout: Duration,
    #[cfg(test)]
    pub(crate) hook: Option<Hook>,
}

impl Default for ReencryptOptions {
    fn default() -> Self {
        ReencryptOptions {
            hotzone: DEFAULT_HOTZONE,
            speed_limit_mib_s: 0,
            quiesce_timeout: Duration::from_secs(60),
            #[cfg(test)]
            hook: None,
        }
    }
}

/// What the job and its handle share.
struct JobShared {
    name: String,
    state: AtomicU8,
    done: AtomicU64,
    total: AtomicU64,
    error: Mutex<Option<String>>,
    cancel: AtomicBool,
    pause: AtomicBool,
    /// Bytes per second (0: none).
    speed: AtomicU64,
}

impl JobShared {
    fn set_state(&self, s: ReencryptState) {
        self.state.store(s as u8, Ordering::SeqCst);
    }

    fn state(&self) -> ReencryptState {
        ReencryptState::ALL[usize::from(self.state.load(Ordering::SeqCst))]
    }
}

/// A running re-encryption. Dropping it cancels the job and waits for it (a hotzone being
/// rewritten is finished first).
pub struct ReencryptJob {
    shared: Arc<JobShared>,
    thread: Option<JoinHandle<()>>,
}

impl ReencryptJob {
    /// Its progress now.
    pub fn progress(&self) -> ReencryptProgress {
        let s = &self.shared;
        ReencryptProgress {
            state: s.state(),
            done: s.done.load(Ordering::SeqCst),
            total: s.total.load(Ordering::SeqCst),
            error: s.error.lock().unwrap_or_else(|p| p.into_inner()).clone(),
        }
    }

    /// Stops between hotzones until [`ReencryptJob::resume`].
    pub fn pause(&self) {
        self.shared.pause.store(true, Ordering::SeqCst);
    }

    /// Goes on after [`ReencryptJob::pause`].
    pub fn resume(&self) {
        self.shared.pause.store(false, Ordering::SeqCst);
    }

    /// Stops the job at the next hotzone boundary (the hotzone being rewritten is finished and
    /// recorded); the disk stays usable in its mixed state.
    pub fn cancel(&self) {
        self.shared.cancel.store(true, Ordering::SeqCst);
    }

    /// Sets the speed limit in MiB/s (0: none).
    pub fn set_speed_limit(&self, mib_s: u64) {
        self.shared.speed.store(mib_s.saturating_mul(1 << 20), Ordering::SeqCst);
    }

    /// Waits up to `timeout` for the job to end; its final progress if it did.
    pub fn wait(&mut self, timeout: Duration) -> Option<ReencryptProgress> {
        let deadline = Instant::now() + timeout;
        while !self.shared.state().is_final() {
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        Some(self.progress())
    }
}

impl Drop for ReencryptJob {
    fn drop(&mut self) {
        self.cancel();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Starts re-encrypting `device` to `new_key` on a thread of its own, from the boundary the
/// device has (0, or the one it was built with by [`CryptoDevice::with_reencryption`], or
/// where a cancelled job on it stopped). `checkpoint` records the progress durably. Refused
/// naming `new_key` when it is the disk's key or differs from the new key the disk is already
/// being re-encrypted to, naming `hotzone` when that is not a whole number of sectors up to
/// [`MAX_HOTZONE`]; and while another job runs on the disk or a hotzone was left part
/// rewritten (recover it on a new device).
pub fn start_reencrypt(
    device: &CryptoDevice,
    new_key: Arc<CryptoKey>,
    checkpoint: Box<dyn ReencryptCheckpoint>,
    opts: ReencryptOptions,
) -> Result<ReencryptJob, ReencryptError> {
    let layout = device.layout();
    let ss = u64::from(layout.sector_size);
    if opts.hotzone == 0 || !opts.hotzone.is_multiple_of(ss) || opts.hotzone > MAX_HOTZONE {
        return Err(ReencryptError::InvalidParam {
            field: "hotzone",
            reason: format!("{} is not a multiple of {ss} bytes from {ss} to {MAX_HOTZONE}", opts.hotzone),
        });
    }
    if device.info().size_bytes() > shared::MAX_BOUNDARY {
        return Err(ReencryptError::InvalidParam {
            field: "name",
            reason: format!(
                "'{}' is larger than the {} bytes a re-encryption covers",
                device.info().name,
                shared::MAX_BOUNDARY
            ),
        });
    }
    if new_key.same_material(device.key()) {
        return Err(ReencryptError::InvalidParam {
            field: "new_key",
            reason: format!("'{}' is the key the disk is encrypted with", new_key.name()),
        });
    }
    let reenc = device.reenc.get_or_init(|| Arc::new(ReencShared::new(new_key.clone(), 0))).clone();
    if !reenc.new_key.same_material(&new_key) {
        return Err(ReencryptError::InvalidParam {
            field: "new_key",
            reason: format!(
                "'{}' is being re-encrypted to key '{}': a job continues with that key",
                device.info().name,
                reenc.new_key.name()
            ),
        });
    }
    if reenc.hot_failed() {
        return Err(ReencryptError::InvalidParam {
            field: "name",
            reason: format!(
                "'{}' has a hotzone left part rewritten: recover it (recover_hotzone) on a new device",
                device.info().name
            ),
        });
    }
    if reenc.job_running.swap(true, Ordering::SeqCst) {
        return Err(ReencryptError::Running(device.info().name.clone()));
    }
    let shared = Arc::new(JobShared {
        name: device.info().name.clone(),
        state: AtomicU8::new(ReencryptState::Running as u8),
        done: AtomicU64::new(reenc.window().boundary),
        total: AtomicU64::new(device.info().size_bytes()),
        error: Mutex::new(None),
        cancel: AtomicBool::new(false),
        pause: AtomicBool::new(false),
        speed: AtomicU64::new(opts.speed_limit_mib_s.saturating_mul(1 << 20)),
    });
    let ctx = Copier {
        job: shared.clone(),
        reenc,
        slots: device.slots.clone(),
        base: device.base().clone(),
        info: device.info().clone(),
        layout,
        old_key: device.key().clone(),
        checkpoint,
        opts,
    };
    let thread = std::thread::Builder::new()
        .name(format!("reencrypt-{}", shared.name))
        .spawn(move || ctx.run())
        .map_err(ReencryptError::Checkpoint);
    match thread {
        Ok(t) => Ok(ReencryptJob { shared, thread: Some(t) }),
        Err(e) => {
            // The thread never ran: the state is free for another start.
            if let Some(r) = device.reenc.get() {
                r.job_running.store(false, Ordering::SeqCst);
            }
            Err(e)
        }
    }
}

/// How a run of the job ended.
enum End {
    Done,
    Cancelled,
    /// A test hook stopped it as a crash would.
    #[cfg(test)]
    Crashed,
}

/// The job's thread.
struct Copier {
    job: Arc<JobShared>,
    reenc: Arc<ReencShared>,
    slots: Arc<Slots>,
    base: Bdev,
    info: BdevInfo,
    layout: CryptoLayout,
    old_key: Arc<CryptoKey>,
    checkpoint: Box<dyn ReencryptCheckpoint>,
    opts: ReencryptOptions,
}

/// What [`Copier::wait_while_paused`] found.
enum Paused {
    /// Not paused.
    No,
    /// Paused, then resumed.
    Resumed,
    /// Cancelled (while paused or not).
    Cancelled,
}

/// Bytes copied since the speed limit in force was seen.
struct Pace {
    since: Instant,
    copied: u64,
    speed: u64,
}

/// How long the job sleeps between looks while it waits (for channels, a pause, the speed
/// limit): short beside a hotzone's copy, long enough not to spin a shared core.
const LOOK_EVERY: Duration = Duration::from_micros(200);

/// Ends a job whose thread panicked (a checkpoint that panicked, say) as failed rather than
/// leaving it `running` forever; a hotzone it held may be part rewritten, so it fails with EIO
/// until recovered.
struct PanicGuard {
    job: Arc<JobShared>,
    reenc: Arc<ReencShared>,
}

impl Drop for PanicGuard {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        if self.reenc.window().hot_len != 0 {
            self.reenc.poison();
        }
        *self.job.error.lock().unwrap_or_else(|p| p.into_inner()) = Some("the job panicked".into());
        self.reenc.job_running.store(false, Ordering::SeqCst);
        self.job.set_state(ReencryptState::Failed);
    }
}

impl Copier {
    fn run(mut self) {
        let _guard = PanicGuard { job: self.job.clone(), reenc: self.reenc.clone() };
        let result = self.copy_all();
        let state = match result {
            Ok(End::Done) => ReencryptState::Done,
            Ok(End::Cancelled) => ReencryptState::Cancelled,
            #[cfg(test)]
            Ok(End::Crashed) => {
                // As a process that died: nothing released, nothing more recorded.
                self.job.set_state(ReencryptState::Failed);
                return;
            }
            Err(e) => {
                log::warn!("re-encryption of '{}': {e}", self.job.name);
                *self.job.error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
                ReencryptState::Failed
            }
        };
        self.reenc.job_running.store(false, Ordering::SeqCst);
        self.job.set_state(state);
    }

    #[cfg(test)]
    fn hook(&self, step: Step, offset: u64) -> bool {
        self.opts.hook.as_ref().is_some_and(|h| h(step, offset))
    }

    fn copy_all(&mut self) -> Result<End, ReencryptError> {
        let ss = self.layout.sector_size as usize;
        let hot = self.opts.hotzone as usize;
        let mut io = BaseIo::open(&self.base, self.layout, hot, self.opts.quiesce_timeout)?;
        let mut buf = vec![0u8; hot];
        let mut sums = Vec::with_capacity(hot / ss);
        let mut old = XtsEngine::new(self.old_key.clone());
        let mut new = XtsEngine::new(self.reenc.new_key.clone());
        let mut pace =
            Pace { since: Instant::now(), copied: 0, speed: self.job.speed.load(Ordering::SeqCst) };
        loop {
            match self.wait_while_paused() {
                Paused::Cancelled => return Ok(End::Cancelled),
                // The pace counts from the resume: time spent paused is not credit to copy
                // faster than the limit afterwards.
                Paused::Resumed => {
                    pace = Pace {
                        since: Instant::now(),
                        copied: 0,
                        speed: self.job.speed.load(Ordering::SeqCst),
                    }
                }
                Paused::No => {}
            }
            let end = self.info.size_bytes();
            self.job.total.store(end, Ordering::SeqCst);
            let b = self.reenc.window().boundary;
            if b >= end {
                self.checkpoint.finish()?;
                return Ok(End::Done);
            }
            let len = (end - b).min(self.opts.hotzone);
            let epoch = self.reenc.hold(b, len);
            let deadline = Instant::now() + self.opts.quiesce_timeout;
            while !self.slots.quiet(epoch) {
                if self.job.cancel.load(Ordering::SeqCst) {
                    self.reenc.release();
                    return Ok(End::Cancelled);
                }
                if Instant::now() >= deadline {
                    self.reenc.release();
                    return Err(ReencryptError::QuiesceTimeout {
                        offset: b,
                        secs: self.opts.quiesce_timeout.as_secs(),
                    });
                }
                std::thread::sleep(LOOK_EVERY);
            }
            #[cfg(test)]
            if self.hook(Step::Quiesced, b) {
                return Ok(End::Crashed);
            }
            let data = &mut buf[..len as usize];
            if let Err(e) = io.read(b, data) {
                self.reenc.release();
                return Err(e);
            }
            sector_sums(data, ss, &mut sums);
            if let Err(e) = self.checkpoint.begin_hotzone(b, len, &sums) {
                self.reenc.release();
                return Err(e.into());
            }
            #[cfg(test)]
            if self.hook(Step::Begun, b) {
                return Ok(End::Crashed);
            }
            for (k, sector) in data.chunks_exact_mut(ss).enumerate() {
                let tweak = (b + (k * ss) as u64) / 512;
                old.decrypt(sector, tweak);
                new.encrypt(sector, tweak);
            }
            // Two writes, so a test can stop the job between them (a crash half way).
            let half = (data.len() / ss / 2) * ss;
            let mut written = io.write(b, &data[..half]);
            #[cfg(test)]
            if written.is_ok() && self.hook(Step::HalfWritten, b) {
                return Ok(End::Crashed);
            }
            if written.is_ok() {
                written = io.write(b + half as u64, &data[half..]).and_then(|()| io.flush());
            }
            if let Err(e) = written {
                // Part of the hotzone may be under the new key: requests there fail until the
                // hotzone is recovered from its checksums.
                self.reenc.poison();
                return Err(e);
            }
            #[cfg(test)]
            if self.hook(Step::Written, b) {
                return Ok(End::Crashed);
            }
            let recorded = self.checkpoint.advance(b + len);
            // The hotzone is all under the new key whether or not it was recorded: serve it so.
            self.reenc.publish(b + len);
            self.job.done.store(b + len, Ordering::SeqCst);
            recorded?;
            #[cfg(test)]
            if self.hook(Step::Advanced, b) {
                return Ok(End::Crashed);
            }
            pace.copied += len;
            if self.keep_to_speed(&mut pace) {
                return Ok(End::Cancelled);
            }
        }
    }

    /// Waits while the job is paused.
    fn wait_while_paused(&self) -> Paused {
        let mut waited = false;
        loop {
            if self.job.cancel.load(Ordering::SeqCst) {
                return Paused::Cancelled;
            }
            if !self.job.pause.load(Ordering::SeqCst) {
                self.job.set_state(ReencryptState::Running);
                return if waited { Paused::Resumed } else { Paused::No };
            }
            waited = true;
            self.job.set_state(ReencryptState::Paused);
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Sleeps until the bytes copied keep to the speed limit (read at each look: a new limit
    /// counts from when it was seen); true when the job is cancelled meanwhile.
    fn keep_to_speed(&self, pace: &mut Pace) -> bool {
        loop {
            if self.job.cancel.load(Ordering::SeqCst) {
                return true;
            }
            let speed = self.job.speed.load(Ordering::SeqCst);
            if speed != pace.speed {
                *pace = Pace { since: Instant::now(), copied: 0, speed };
            }
            if speed == 0 {
                return false;
            }
            let due = Duration::from_secs_f64(pace.copied as f64 / speed as f64);
            let elapsed = pace.since.elapsed();
            if elapsed >= due {
                return false;
            }
            std::thread::sleep((due - elapsed).min(Duration::from_millis(10)));
        }
    }
}

#[cfg(test)]
mod tests;
