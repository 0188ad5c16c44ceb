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

type Fetched = (u64, bool, fp_backup::Result<RawChunk>);

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
            {
                let n = pending.len() as u64;
                if self.persist(chan.as_mut(), &mut pending, false) {
                    durable += n;
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
                let nap = if in_flight > 0 || !pending.is_empty() { 2 } else { 20 };
                std::thread::park_timeout(Duration::from_millis(nap));
            }
        }
        // Stopping: what is on the base is kept for the next start.
        if !pending.is_empty() {
            self.persist(chan.as_mut(), &mut pending, false);
        }
    }
}
