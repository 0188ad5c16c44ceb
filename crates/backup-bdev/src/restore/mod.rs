//! The live-restore bdev: a bdev of a backup's disk size that serves the backup at once while
//! a worker thread copies it onto a local base bdev (docs/backup.md, "Live restore").
//!
//! * [`chunks`]: each chunk's state, the rules of when a request may go to the base.
//! * `channel`: the reactor side: pass-through or park.
//! * `shared`: what both sides share (the chunk states, the queue of chunks asked for).
//! * `worker`: the thread that fetches chunks (on fp-backup's runtime, never blocking a
//!   reactor), writes them to the base, flushes, and keeps the state file ([`state_file`]).

mod channel;
pub mod chunks;
mod shared;
pub mod state_file;
mod worker;

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;

use crossbeam_queue::SegQueue;
use fp_backup::ChunkReader;
use fp_bdev::{Bdev, BdevError, BdevInfo, BlockDevice, Capacity, IoChannel};

use chunks::ChunkStates;
use state_file::StateFile;

use shared::Shared;
pub use shared::{Options, Phase, PARK_BOUND};

/// What `driver_specific.backup_restore` shows.
pub struct Status {
    /// The store's name.
    pub store: String,
    /// The backed-up disk.
    pub disk: String,
    /// The backup's id.
    pub backup_id: String,
    /// Chunks in all.
    pub chunks: u64,
    /// Chunks on the base for good.
    pub restored: u64,
    /// The phase.
    pub phase: Phase,
    /// The last error.
    pub error: Option<String>,
}

/// A live-restore bdev.
pub struct RestoreDevice {
    info: BdevInfo,
    base: Bdev,
    shared: Arc<Shared>,
    store_name: String,
    disk: String,
    backup_id: String,
    state_file: Arc<StateFile>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl RestoreDevice {
    /// A restore bdev `name` of `reader`'s backup over `base` (already checked large enough),
    /// taking up `state_file`'s restored set when it is this restore's. Starts the worker.
    pub fn start(
        name: &str,
        base: Bdev,
        store_name: &str,
        reader: ChunkReader,
        state_file: StateFile,
        options: Options,
    ) -> Result<RestoreDevice, BdevError> {
        let m = reader.manifest();
        let (chunk_size, disk_size) = (m.chunk_size, m.disk_size);
        let (disk, backup_id) = (m.disk.clone(), m.id.clone());
        let count = m.chunks.len() as u64;
        let b = base.info();
        let block_size = b.block_size;
        let loaded = state_file.load(count).map_err(|e| BdevError::InvalidParam {
            field: "name",
            reason: format!("cannot read the restore's state file: {e}"),
        })?;
        let bitmap = loaded.as_ref().map(|l| l.bitmap.clone()).unwrap_or_default();
        let durable = |i: u64| bitmap.get(i as usize / 8).is_some_and(|b| b & (1 << (i % 8)) != 0);
        let chunks = ChunkStates::new(count, chunk_size, durable);
        let complete = chunks.durable() == count;
        let shared = Arc::new(Shared {
            chunks,
            demand: SegQueue::new(),
            worker: OnceLock::new(),
            complete: AtomicBool::new(complete),
            phase: AtomicU8::new(if complete { Phase::Complete as u8 } else { Phase::Copying as u8 }),
            stop: AtomicBool::new(false),
            error: Mutex::new(None),
            read_ahead: options.read_ahead,
        });
        let info = BdevInfo {
            name: name.to_string(),
            product_name: "backup restore".into(),
            block_size,
            capacity: Capacity::new(disk_size / u64::from(block_size)),
            io_types: b.io_types,
            driver: "backup_restore",
            driver_specific: None,
        };
        let state_file = Arc::new(state_file);
        if complete {
            if !loaded.as_ref().is_some_and(|l| l.complete) {
                worker::save(&shared, &state_file, &[], true);
            }
            log::info!("restore '{name}': every chunk is on '{}' already: a pass-through", b.name);
        }
        let handle = if complete {
            None
        } else {
            let w = worker::Worker::new(shared.clone(), base.clone(), reader, state_file.clone(), options);
            let thread = std::thread::Builder::new()
                .name(format!("fp-restore-{name}"))
                .spawn(move || w.run())
                .map_err(|e| BdevError::InvalidParam {
                    field: "name",
                    reason: format!("cannot start its thread: {e}"),
                })?;
            let _ = shared.worker.set(thread.thread().clone());
            Some(thread)
        };
        Ok(RestoreDevice {
            info,
            base,
            shared,
            store_name: store_name.to_string(),
            disk,
            backup_id,
            state_file,
            worker: Mutex::new(handle),
        })
    }

    /// What `driver_specific.backup_restore` shows.
    pub fn status(&self) -> Status {
        Status {
            store: self.store_name.clone(),
            disk: self.disk.clone(),
            backup_id: self.backup_id.clone(),
            chunks: self.shared.chunks.count(),
            restored: self.shared.chunks.durable(),
            phase: self.shared.phase(),
            error: self.shared.error.lock().unwrap_or_else(|p| p.into_inner()).clone(),
        }
    }

    /// The base bdev's name.
    pub fn base_name(&self) -> &str {
        &self.base.info().name
    }

    /// Stops the worker (it saves what is on the base first) and waits for it.
    fn stop(&self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake_worker();
        if let Some(h) = self.worker.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = h.join();
        }
    }

    /// The restore's state file (a complete restore's is kept after a delete).
    pub fn state_path(&self) -> &std::path::Path {
        self.state_file.path()
    }

    /// An explicit delete, once the bdev is gone: stops the worker, then, unless the restore
    /// is complete, removes its state file, so that a later create of the same name fetches
    /// every chunk again rather than resuming from a set of chunks the base may no longer
    /// hold (the operator may have written to the base, or restore another backup onto it).
    /// Returns whether the file was removed. A complete restore's file stays: a create of the
    /// same restore (its table left in the configuration file) is then a pass-through and
    /// never writes the backup over what the guest wrote since. A daemon stop does not come
    /// here: it keeps the file, and the next start resumes.
    pub fn abandon(&self) -> std::io::Result<bool> {
        self.stop();
        if self.shared.is_complete() {
            return Ok(false);
        }
        self.state_file.remove()?;
        Ok(true)
    }
}

impl Drop for RestoreDevice {
    fn drop(&mut self) {
        self.stop();
    }
}

impl BlockDevice for RestoreDevice {
    fn info(&self) -> &BdevInfo {
        &self.info
    }

    fn open_channel(&self) -> Result<Box<dyn IoChannel>, BdevError> {
        Ok(Box::new(channel::RestoreChannel::new(
            self.shared.clone(),
            self.base.open_channel()?,
            self.info.clone(),
        )))
    }
}
