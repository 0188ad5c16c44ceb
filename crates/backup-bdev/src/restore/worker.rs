//! A live restore's worker thread: fetches the chunks the channels ask for (first) and the
//! copier's (in order, `parallel` at a time, at most `speed` bytes/s), each on fp-backup's
//! runtime with [`ChunkReader::read_raw_async`], whose result comes back through a lock-free
//! queue and an unpark; checks and decodes each itself (one thread hop from the runtime to
//! here, none through a blocking pool: a guest's first read of a chunk waits for all of them);
//! writes each whole to the base (a zero chunk as write-zeroes), then, in
//! batches at most [`FLUSH_AFTER`] apart, flushes the base and renames a new state file before
//! the chunks count as durable (and writes to them may go).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_queue::SegQueue;
use fp_backup::{ChunkReader, RawChunk};
use fp_bdev::iov::BounceBuf;
use fp_bdev::{sync_io, Bdev, IoChannel, IoOp, IoRequest, Iovecs};

use super::chunks::{ABSENT, DURABLE, FAILED, RESTORED};
use super::shared::{Options, Phase, Shared};
use super::state_file::StateFile;

/// Chunks restored and not yet durable are made durable (base flush, state file) at most this
/// long after the first of them: well under the 100 ms a waiting write may be held.
pub const FLUSH_AFTER: Duration = Duration::from_millis(20);
/// How many times the copier goes back over chunks that failed before it gives up.
pub const RETRY_PASSES: u32 = 3;
/// How long it waits before going back over them.
pub const RETRY_AFTER: Duration = Duration::from_secs(2);

/// The first wait before persisting again after a failed flush or state file write.
pub const PERSIST_RETRY_FIRST: Duration = Duration::from_millis(2);
/// The longest wait between two attempts: a state directory that stays full or read-only
/// costs one attempt a second, not one per loop.
pub const PERSIST_RETRY_MAX: Duration = Duration::from_secs(1);

type Fetched = (u64, bool, fp_backup::Result<RawChunk>);

/// When the worker may try to persist again: after a failure it waits [`PERSIST_RETRY_FIRST`],
/// doubling at each further failure up to [`PERSIST_RETRY_MAX`]; a success starts over.
#[derive(Debug)]
pub(super) struct Backoff {
    /// The wait after the next failure.
    next: Duration,
    /// No attempt before this.
    not_before: Option<Instant>,
}

impl Backoff {
    pub(super) fn new() -> Backoff {
        Backoff { next: PERSIST_RETRY_FIRST, not_before: None }
    }

    /// Whether an attempt may be made at `now`.
    pub(super) fn ready(&self, now: Instant) -> bool {
        self.not_before.is_none_or(|t| now >= t)
    }

    /// How long from `now` until an attempt may be made (zero when it may).
    pub(super) fn wait(&self, now: Instant) -> Duration {
        self.not_before.map_or(Duration::ZERO, |t| t.saturating_duration_since(now))
    }

    /// An attempt at `now` failed: the next waits longer (bounded); returns that wait.
    pub(super) fn failed(&mut self, now: Instant) -> Duration {
        let wait = self.next;
        self.not_before = Some(now + wait);
        self.next = (self.next * 2).min(PERSIST_RETRY_MAX);
        wait
    }

    /// An attempt succeeded: the next failure waits the first wait again.
    pub(super) fn succeeded(&mut self) {
        *self = Backoff::new();
    }
}

pub(super) struct Worker {
    shared: Arc<Shared>,
    base: Bdev,
    reader: ChunkReader,
    state_file: Arc<StateFile>,
    options: Options,
    results: Arc<SegQueue<Fetched>>,
}

/// Saves the state file: the durable chunks and `also`; errors are logged and recorded.
pub(super) fn save(shared: &Shared, file: &StateFile, also: &[u64], complete: bool) -> bool {
    let bitmap = shared.chunks.durable_bitmap(also);
    match file.save(shared.chunks.count(), &bitmap, complete) {
        Ok(()) => true,
        Err(e) => {
            let e = format!("cannot write the state file {}: {e}", file.path().display());
            log::error!("{e}");
            shared.set_error(e);
            false
        }
    }
}

impl Worker {
    pub(super) fn new(
        shared: Arc<Shared>,
        base: Bdev,
        reader: ChunkReader,
        state_file: Arc<StateFile>,
        options: Options,
    ) -> Worker {
        Worker { shared, base, reader, state_file, options, results: Arc::new(SegQueue::new()) }
    }

    /// Starts fetching chunk `i` (already FETCHING); a zero chunk needs no request (its result
    /// is never decoded: [`Worker::write`] writes zeroes).
    fn fetch(&self, i: u64, copier: bool) {
        let results = self.results.clone();
        let me = std::thread::current();
        self.reader.read_raw_async(i, move |r| {
            results.push((i, copier, r));
            me.unpark();
        });
    }

    /// Writes chunk `i` to the base: `data`, or zeroes for a zero chunk.
    fn write(
        &self,
        chan: &mut dyn IoChannel,
        bounce: &mut BounceBuf,
        i: u64,
        data: &[u8],
    ) -> Result<(), i32> {
        let m = self.reader.manifest();
        let (offset, len) = (i * m.chunk_size, m.chunk_len(i));
        let zero = m.chunks[i as usize].is_none();
        let stop = &self.shared.stop;
        let req = if zero && self.base.info().io_types.write_zeroes {
            IoRequest { tag: 0, op: IoOp::WriteZeroes, offset, len, iov: Iovecs::NONE }
        } else {
            let bytes = &mut bounce.bytes_mut()[..len as usize];
            if zero {
                bytes.fill(0);
            } else {
                bytes.copy_from_slice(data);
            }
            IoRequest { tag: 0, op: IoOp::Write, offset, len, iov: bounce.iovecs(len as usize) }
        };
        sync_io::run(chan, &req, &mut || stop.load(Ordering::Acquire))
    }

    /// Flushes the base and saves the state file with `pending`; then they are durable.
    fn persist(&self, chan: &mut dyn IoChannel, pending: &mut Vec<u64>, complete: bool) -> bool {
        if self.base.info().io_types.flush {
            let req = IoRequest { tag: 0, op: IoOp::Flush, offset: 0, len: 0, iov: Iovecs::NONE };
            match sync_io::run(chan, &req, &mut || false) {
                Ok(()) | Err(libc::EOPNOTSUPP) => {}
                Err(e) => {
                    self.shared.set_error(format!("flushing the base failed: errno {e}"));
                    return false;
                }
            }
        }
        if !save(&self.shared, &self.state_file, pending, complete) {
            return false;
        }
        for &i in pending.iter() {
            self.shared.chunks.set(i, DURABLE);
        }
        pending.clear();
        self.shared.chunks.bump();
        true
    }

    pub(super) fn run(self) {
        let shared = self.shared.clone();
        let mut chan = match self.base.open_channel() {
            Ok(c) => c,
            Err(e) => {
                shared.set_error(format!("cannot open the base: {e}"));
                shared.phase.store(Phase::Failed as u8, Ordering::Release);
                return;
            }
        };
        let m = self.reader.manifest();
        let count = m.chunks.len() as u64;
        let mut bounce = BounceBuf::zeroed(m.chunk_size as usize);
        let mut durable = shared.chunks.durable();
        let (mut cursor, mut copier_in_flight, mut in_flight) = (0u64, 0usize, 0usize);
        let mut pending: Vec<u64> = Vec::new();
        let mut pending_since = Instant::now();
        let (mut failed, mut failed_at, mut passes) = (Vec::new(), Instant::now(), 0u32);
        let mut next_start = Instant::now();
        let mut persist_backoff = Backoff::new();
        let parallel = self.options.parallel.max(1);
        while !shared.stop.load(Ordering::Acquire) {
            let mut busy = false;
            while let Some(i) = shared.demand.pop() {
                self.fetch(i, false);
                in_flight += 1;
                busy = true;
            }
            // The copier: the next absent chunks in order, within its limits.
            while copier_in_flight < parallel && cursor < count && shared.phase() == Phase::Copying {
                let now = Instant::now();
                if self.options.speed > 0 && now < next_start {
                    break;
                }
                let i = cursor;
                cursor += 1;
                if shared.chunks.claim_fetch(i) {
                    if self.options.speed > 0 {
                        let cost = Duration::from_secs_f64(m.chunk_len(i) as f64 / self.options.speed as f64);
                        next_start = next_start.max(now) + cost;
                    }
                    self.fetch(i, true);
                    copier_in_flight += 1;
                    in_flight += 1;
                    busy = true;
                }
            }
            while let Some((i, copier, result)) = self.results.pop() {
                busy = true;
                in_flight -= 1;
                if copier {
                    copier_in_flight -= 1;
                }
                let zero = m.chunks[i as usize].is_none();
                let decoded =
                    result.and_then(|raw| if zero { Ok(Vec::new()) } else { self.reader.decode(raw) });
                let written = decoded.map_err(|e| format!("chunk {i}: {e}")).and_then(|data| {
                    self.write(chan.as_mut(), &mut bounce, i, &data)
                        .map_err(|e| format!("chunk {i}: writing the base failed: errno {e}"))
                });
                match written {
                    Ok(()) => {
                        if pending.is_empty() {
                            pending_since = Instant::now();
                        }
                        shared.chunks.set(i, RESTORED);
                        pending.push(i);
                    }
                    Err(e) => {
                        log::error!("restore '{}': {e}", self.base.info().name);
                        shared.set_error(e);
                        shared.chunks.set(i, FAILED);
                        failed.push(i);
                        failed_at = Instant::now();
                    }
                }
                shared.chunks.bump();
            }
            if !pending.is_empty()
                && (pending_since.elapsed() >= FLUSH_AFTER || in_flight == 0 || pending.len() >= 256)
                && persist_backoff.ready(Instant::now())
            {
                let n = pending.len() as u64;
                if self.persist(chan.as_mut(), &mut pending, false) {
                    durable += n;
                    persist_backoff.succeeded();
                } else {
                    let wait = persist_backoff.failed(Instant::now());
                    log::warn!(
                        "restore over '{}': persisting failed; trying again in {wait:?}",
                        self.base.info().name
                    );
                }
            }
            if durable == count {
                // The file first: whoever sees `complete` finds the file saying so.
                save(&shared, &self.state_file, &[], true);
                shared.complete.store(true, Ordering::Release);
                shared.phase.store(Phase::Complete as u8, Ordering::Release);
                shared.chunks.bump();
                log::info!("restore over '{}' complete: {count} chunks", self.base.info().name);
                return;
            }
            // Chunks that failed: gone over again after a while, a bounded number of times.
            if cursor >= count
                && copier_in_flight == 0
                && !failed.is_empty()
                && failed_at.elapsed() >= RETRY_AFTER
            {
                if passes < RETRY_PASSES {
                    passes += 1;
                    cursor = failed.iter().copied().min().unwrap_or(0);
                    for i in failed.drain(..) {
                        if shared.chunks.get(i) == FAILED {
                            shared.chunks.set(i, ABSENT);
                        }
                    }
                    log::warn!(
                        "restore over '{}': trying failed chunks again (pass {passes})",
                        self.base.info().name
                    );
                } else if shared.phase() == Phase::Copying {
                    shared.phase.store(Phase::Failed as u8, Ordering::Release);
                    log::error!(
                        "restore over '{}': chunks still fail; the copier stops",
                        self.base.info().name
                    );
                }
            }
            if !busy {
                let nap = if in_flight > 0 {
                    Duration::from_millis(2)
                } else if !pending.is_empty() {
                    // Chunks to persist: soon, or when the backoff lets it (an unpark wakes
                    // the worker earlier for new demand).
                    persist_backoff.wait(Instant::now()).clamp(Duration::from_millis(2), PERSIST_RETRY_MAX)
                } else {
                    Duration::from_millis(20)
                };
                std::thread::park_timeout(nap);
            }
        }
        // Stopping: what is on the base is kept for the next start.
        if !pending.is_empty() {
            self.persist(chan.as_mut(), &mut pending, false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn persist_retries_back_off_from_2_ms_doubling_to_1_s_and_a_success_starts_over() {
        let t0 = Instant::now();
        let mut b = Backoff::new();
        assert!(b.ready(t0), "the first attempt waits for nothing");
        let waits: Vec<u64> = (0..12).map(|_| b.failed(t0).as_millis() as u64).collect();
        assert_eq!(waits, [2, 4, 8, 16, 32, 64, 128, 256, 512, 1000, 1000, 1000]);
        // After the last failure (1 s): not before it, then again.
        assert!(!b.ready(t0 + Duration::from_millis(999)));
        assert_eq!(b.wait(t0 + Duration::from_millis(400)), Duration::from_millis(600));
        assert!(b.ready(t0 + PERSIST_RETRY_MAX));
        assert_eq!(b.wait(t0 + Duration::from_secs(2)), Duration::ZERO);
        b.succeeded();
        assert!(b.ready(t0));
        assert_eq!(b.failed(t0), PERSIST_RETRY_FIRST);
        assert!(!b.ready(t0 + Duration::from_millis(1)) && b.ready(t0 + Duration::from_millis(2)));
    }
}
