//! The crash simulator: bases that record every write and flush in one order across the
//! raid, so a test can build the images a crash at any point could leave (docs/raid-format.md,
//! "Crash model"): on each base, every write before that base's last completed flush, plus any
//! subset of its later writes landed, some of them torn (only their first sectors written).
//!
//! Public so that tests elsewhere (the io helper's assembly) can replay the same crashes.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use crate::meta_io::{BaseIo, MemBase};

/// One recorded operation of one base.
#[derive(Debug, Clone)]
pub enum SimOp {
    Write { offset: u64, data: Vec<u8> },
    Flush,
}

/// The raid-wide log: (base id, operation), in the order they completed.
pub type SimLog = Rc<RefCell<Vec<(usize, SimOp)>>>;

/// A base in memory that records its writes and flushes in the shared log. `fail` makes its
/// requests fail with EIO (and records nothing), as a base that went away.
pub struct SimBase {
    pub id: usize,
    current: MemBase,
    log: SimLog,
    pub fail: Rc<Cell<bool>>,
}

impl SimBase {
    /// Base `id`, zeroed, of `bytes` bytes, recording into `log`.
    pub fn new(id: usize, bytes: u64, log: SimLog) -> SimBase {
        SimBase { id, current: MemBase::new(bytes), log, fail: Rc::new(Cell::new(false)) }
    }
}

impl BaseIo for SimBase {
    fn size_bytes(&self) -> u64 {
        self.current.size_bytes()
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), i32> {
        self.current.fail = self.fail.get();
        self.current.read_at(offset, buf)
    }

    fn write_at(&mut self, offset: u64, buf: &[u8]) -> Result<(), i32> {
        self.current.fail = self.fail.get();
        self.current.write_at(offset, buf)?;
        self.log.borrow_mut().push((self.id, SimOp::Write { offset, data: buf.to_vec() }));
        Ok(())
    }

    fn flush(&mut self) -> Result<(), i32> {
        self.current.fail = self.fail.get();
        self.current.flush()?;
        self.log.borrow_mut().push((self.id, SimOp::Flush));
        Ok(())
    }
}

/// Which of a base's writes after its last flush land in a crash image.
#[derive(Debug, Clone, Copy)]
pub enum Landing {
    /// None of them.
    None,
    /// All of them, whole.
    All,
    /// Those whose bit is set in the mask (by their order after the flush), whole.
    Mask(u64),
    /// All of them, but each torn: only its first `n` bytes.
    Torn(usize),
}

/// Walks a log crash point by crash point, keeping each base's durable image (everything up
/// to its last flush) and its writes since, so the images of every point cost one pass.
pub struct Replay<'a> {
    log: &'a [(usize, SimOp)],
    completed: usize,
    durable: Vec<Vec<u8>>,
    pending: Vec<Vec<&'a SimOp>>,
}

fn apply(image: &mut [u8], op: &SimOp, n: usize) {
    if let SimOp::Write { offset, data } = op {
        let n = n.min(data.len());
        image[*offset as usize..*offset as usize + n].copy_from_slice(&data[..n]);
    }
}

impl<'a> Replay<'a> {
    /// Before the first operation of `log`, over `bases` zeroed bases of `bytes` bytes.
    pub fn new(log: &'a [(usize, SimOp)], bases: usize, bytes: u64) -> Replay<'a> {
        Replay {
            log,
            completed: 0,
            durable: vec![vec![0; bytes as usize]; bases],
            pending: vec![Vec::new(); bases],
        }
    }

    /// How many operations completed at this crash point.
    pub fn completed(&self) -> usize {
        self.completed
    }

    /// Writes completed but not yet flushed, over all bases.
    pub fn unflushed(&self) -> usize {
        self.pending.iter().map(Vec::len).sum()
    }

    /// Moves to the next crash point; false at the end of the log.
    pub fn advance(&mut self) -> bool {
        let Some((id, op)) = self.log.get(self.completed) else { return false };
        self.completed += 1;
        match op {
            SimOp::Flush => {
                for w in std::mem::take(&mut self.pending[*id]) {
                    apply(&mut self.durable[*id], w, usize::MAX);
                }
            }
            w => self.pending[*id].push(w),
        }
        true
    }

    /// The image base `id` holds after a crash here.
    pub fn image(&self, id: usize, landing: Landing) -> Vec<u8> {
        let mut image = self.durable[id].clone();
        for (i, op) in self.pending[id].iter().enumerate() {
            match landing {
                Landing::None => {}
                Landing::All => apply(&mut image, op, usize::MAX),
                Landing::Mask(m) if i < 64 && m & (1 << i) != 0 => apply(&mut image, op, usize::MAX),
                Landing::Mask(_) => {}
                Landing::Torn(n) => apply(&mut image, op, n),
            }
        }
        image
    }
}

#[cfg(test)]
mod tests;
