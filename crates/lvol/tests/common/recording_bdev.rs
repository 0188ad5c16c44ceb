//! The data-path crash simulator's block device: an in-memory image that records every write
//! (with its data) and every flush of every channel in one global order, so a test can build
//! the image a crash at any point could leave (docs/lvol-format.md, "Crash model").
//!
//! Requests are carried out inside `submit` (reads see every write submitted before) and
//! complete in the channel's next `poll`. A flush makes durable every write recorded before it;
//! it counts as completed once a `poll` has returned it, which is recorded too. The device is
//! `Send + Sync`; any thread may open channels. One mutex guards the image and the log: this is
//! a test device, not a hot path.

use std::sync::{Arc, Mutex, MutexGuard};

use fp_bdev::{
    BdevError, BdevInfo, BlockDevice, Capacity, IoChannel, IoOp, IoRequest, IoStatus, IoTypes, SubmitError,
};
use rand::seq::SliceRandom;
use rand::Rng;

/// The unit a torn write is cut in: the sector a device writes atomically at least.
pub const SECTOR: usize = 512;

/// One recorded event, in the order the device saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Write {
        offset: u64,
        data: Vec<u8>,
    },
    /// A discard or write-zeroes: the range reads back as zeroes.
    Zeroes {
        offset: u64,
        len: u64,
    },
    /// A flush was submitted: it covers every write recorded before it.
    Flush,
    /// The flush recorded at this index was returned by a channel's poll.
    FlushDone(usize),
}

struct State {
    /// The device as created.
    initial: Vec<u8>,
    /// Every write applied, in order: what reads see.
    image: Vec<u8>,
    log: Vec<Event>,
}

/// The recording device.
pub struct RecordingBdev {
    info: BdevInfo,
    state: Arc<Mutex<State>>,
}

impl RecordingBdev {
    /// A zeroed device of `num_blocks` blocks.
    pub fn new(name: &str, block_size: u32, num_blocks: u64) -> Arc<RecordingBdev> {
        RecordingBdev::from_image(name, block_size, vec![0; (num_blocks * block_size as u64) as usize])
    }

    /// A device holding `image` (a whole number of blocks), e.g. a crash image to load from.
    pub fn from_image(name: &str, block_size: u32, image: Vec<u8>) -> Arc<RecordingBdev> {
        assert!(image.len() % block_size as usize == 0, "the image is not a whole number of blocks");
        let all = IoTypes { read: true, write: true, flush: true, unmap: true, write_zeroes: true };
        Arc::new(RecordingBdev {
            info: BdevInfo {
                name: name.to_string(),
                product_name: "Recording disk".into(),
                block_size,
                capacity: Capacity::new((image.len() / block_size as usize) as u64),
                io_types: all,
                driver: "recording",
                driver_specific: None,
            },
            state: Arc::new(Mutex::new(State { initial: image.clone(), image, log: Vec::new() })),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("a test thread panicked holding the device")
    }

    /// Events recorded so far: a crash "after `position()` events" is a cut a test can name.
    pub fn position(&self) -> usize {
        self.state().log.len()
    }

    /// A copy of the events recorded so far.
    pub fn events(&self) -> Vec<Event> {
        self.state().log.clone()
    }

    /// The device's contents now (every write landed).
    pub fn image(&self) -> Vec<u8> {
        self.state().image.clone()
    }

    /// For a crash after the first `cut` events: the index of the newest flush whose completion
    /// is among them, if any. Every write recorded before it is durable.
    pub fn durable_flush(&self, cut: usize) -> Option<usize> {
        durable_flush(&self.state().log[..cut])
    }

    /// The image a crash now could leave: see [`RecordingBdev::crash_image_at`].
    pub fn crash_image(&self, rng: &mut impl Rng) -> Vec<u8> {
        self.crash_image_at(self.position(), rng)
    }

    /// The image a crash after the first `cut` events could leave: the device as created,
    /// every write recorded before the last completed flush, then a random subset of the later
    /// writes, in random order, about one in four of them torn (a random subset of its sectors).
    pub fn crash_image_at(&self, cut: usize, rng: &mut impl Rng) -> Vec<u8> {
        let state = self.state();
        let log = &state.log[..cut];
        let durable = durable_flush(log).unwrap_or(0);
        let mut image = state.initial.clone();
        for event in &log[..durable] {
            land(&mut image, event, |_| true);
        }
        let mut later: Vec<&Event> = log[durable..].iter().filter(|_| rng.gen_bool(0.5)).collect();
        later.shuffle(rng);
        for event in later {
            let torn = rng.gen_bool(0.25);
            let sectors = match event {
                Event::Write { data, .. } => data.len().div_ceil(SECTOR),
                Event::Zeroes { len, .. } => (*len as usize).div_ceil(SECTOR),
                Event::Flush | Event::FlushDone(_) => 0,
            };
            let lands: Vec<bool> = (0..sectors).map(|_| !torn || rng.gen_bool(0.5)).collect();
            land(&mut image, event, |i| lands[i]);
        }
        image
    }
}

fn durable_flush(log: &[Event]) -> Option<usize> {
    log.iter().filter_map(|e| if let Event::FlushDone(f) = e { Some(*f) } else { None }).max()
}

/// Applies a write or zeroing to `image`, only the sectors `keep` says (by index in the write);
/// flushes change nothing. A write past the image's end (the device shrank since) is cut off.
fn land(image: &mut [u8], event: &Event, keep: impl Fn(usize) -> bool) {
    let (offset, len, data) = match event {
        Event::Write { offset, data } => (*offset as usize, data.len(), Some(data)),
        Event::Zeroes { offset, len } => (*offset as usize, *len as usize, None),
        Event::Flush | Event::FlushDone(_) => return,
    };
    for (i, start) in (0..len).step_by(SECTOR).enumerate() {
        let end = (start + SECTOR).min(len);
        if !keep(i) || offset + end > image.len() {
            continue;
        }
        let to = &mut image[offset + start..offset + end];
        match data {
            Some(d) => to.copy_from_slice(&d[start..end]),
            None => to.fill(0),
        }
    }
}

impl BlockDevice for RecordingBdev {
    fn info(&self) -> &BdevInfo {
        &self.info
    }

    fn open_channel(&self) -> Result<Box<dyn IoChannel>, BdevError> {
        Ok(Box::new(RecordingChannel {
            info: self.info.clone(),
            state: Arc::clone(&self.state),
            done: Vec::new(),
        }))
    }

    /// Grows with zeroes or drops the tail (a base bdev resized under a store).
    fn resize(&self, num_blocks: u64) -> Result<(), BdevError> {
        let mut state = self.state();
        state.image.resize((num_blocks * self.info.block_size as u64) as usize, 0);
        let len = state.image.len();
        state.initial.resize(len, 0);
        self.info.capacity.set(num_blocks);
        Ok(())
    }
}

struct RecordingChannel {
    info: BdevInfo,
    state: Arc<Mutex<State>>,
    /// Requests carried out, for the next poll: (tag, status, the log index of a flush).
    done: Vec<(u32, IoStatus, Option<usize>)>,
}

impl RecordingChannel {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("a test thread panicked holding the device")
    }
}

impl IoChannel for RecordingChannel {
    fn submit(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        self.info.check_range(req.offset, req.len)?;
        let at = req.offset as usize;
        let len = req.len as usize;
        let iov: &[libc::iovec] = req.iov.as_slice();
        let mut flush = None;
        let status = match req.op {
            IoOp::Read | IoOp::Write if iov.iter().map(|v| v.iov_len).sum::<usize>() != len => {
                IoStatus::Error(libc::EINVAL)
            }
            IoOp::Read => {
                let state = self.state();
                let mut from = &state.image[at..at + len];
                for v in iov {
                    // SAFETY: the caller guarantees each iovec is writable for `iov_len` bytes and
                    // not otherwise accessed; the sum of the lengths is `len`, so `from` has them.
                    unsafe { std::ptr::copy_nonoverlapping(from.as_ptr(), v.iov_base.cast(), v.iov_len) };
                    from = &from[v.iov_len..];
                }
                IoStatus::Success
            }
            IoOp::Write => {
                let mut data = Vec::with_capacity(len);
                for v in iov {
                    // SAFETY: the caller guarantees each iovec is readable for `iov_len` bytes.
                    data.extend_from_slice(unsafe {
                        std::slice::from_raw_parts(v.iov_base.cast::<u8>(), v.iov_len)
                    });
                }
                let mut state = self.state();
                state.image[at..at + len].copy_from_slice(&data);
                state.log.push(Event::Write { offset: req.offset, data });
                IoStatus::Success
            }
            IoOp::Discard | IoOp::WriteZeroes => {
                let mut state = self.state();
                state.image[at..at + len].fill(0);
                state.log.push(Event::Zeroes { offset: req.offset, len: req.len });
                IoStatus::Success
            }
            IoOp::Flush => {
                let mut state = self.state();
                flush = Some(state.log.len());
                state.log.push(Event::Flush);
                IoStatus::Success
            }
        };
        self.done.push((req.tag, status, flush));
        Ok(())
    }

    fn poll(&mut self, done: &mut dyn FnMut(u32, IoStatus)) -> usize {
        let n = self.done.len();
        for (tag, status, flush) in std::mem::take(&mut self.done) {
            if let Some(f) = flush {
                // Recorded before the caller hears of it: whatever it does next comes later.
                self.state().log.push(Event::FlushDone(f));
            }
            done(tag, status);
        }
        n
    }

    fn in_flight(&self) -> usize {
        self.done.len()
    }
}
