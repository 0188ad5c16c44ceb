//! The raid bdev: a [`BlockDevice`] over the raid's shared state. It describes the raid and
//! opens the level's channel; everything that changes the raid goes through its owner
//! (owner.rs), never through the device.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use arc_swap::{ArcSwap, ArcSwapOption};
use crossbeam_queue::ArrayQueue;
use fp_bdev::Uuid;
use fp_bdev::{BdevError, BdevInfo, BlockDevice, Capacity, IoChannel, IoTypes};

use crate::channel::{ConcatMap, Raid0Map, Raid1Channel, SplitChannel};
use crate::format;
use crate::intent::IntentMap;
use crate::shared::{Layout, ProcessStats, RaidCounters, RaidShared, SlotView};
use crate::{RaidError, RaidLevel, SlotState};

/// Failure reports a raid's channels may have queued for the owner at once.
pub const FAILURE_QUEUE: usize = 1024;

/// What a raid is made of, for [`RaidDevice::new`] (from `bdev_raid_create` or a superblock).
#[derive(Clone)]
pub struct RaidSpec {
    pub name: String,
    pub uuid: Uuid,
    pub level: RaidLevel,
    /// raid0's strip size in bytes; 0 for the others.
    pub strip_bytes: u64,
    /// Whether the bases carry a superblock (and raid1 a bitmap).
    pub superblock: bool,
    pub block_size: u32,
    /// Where data starts on every base, in bytes.
    pub data_offset: u64,
    /// The slots, in order; the bases' data region sizes (bytes past `data_offset`).
    pub slots: Vec<SlotView>,
    pub base_data_bytes: Vec<u64>,
    /// raid1's bitmap chunk in bytes (0 picks [`crate::format::bitmap_chunk_bytes`]).
    pub chunk_bytes: u64,
}

/// Makes a fresh raid id (random, RFC 4122 version 4).
pub fn new_uuid() -> Uuid {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    Uuid(b)
}

/// A raid bdev.
pub struct RaidDevice {
    shared: Arc<RaidShared>,
    uuid: Uuid,
    superblock: bool,
}

impl RaidDevice {
    /// Builds the shared state and the device of `spec`; the layout published is `spec.slots`.
    pub fn new(spec: RaidSpec) -> Result<RaidDevice, RaidError> {
        let n = spec.slots.len();
        if n == 0 || n > format::MAX_SLOTS || spec.base_data_bytes.len() != n {
            return Err(RaidError::InvalidParam {
                field: "base_bdevs",
                reason: format!("{n} bases: a raid has 1 to {}", format::MAX_SLOTS),
            });
        }
        if spec.level == RaidLevel::Raid0 && !spec.strip_bytes.is_power_of_two() {
            let reason = format!("{} bytes is not a power of two", spec.strip_bytes);
            return Err(RaidError::InvalidParam { field: "strip_size_kb", reason });
        }
        let mut spec = spec;
        if spec.level == RaidLevel::Concat && spec.strip_bytes > 0 {
            // As SPDK: each base contributes whole strips.
            let strip = spec.strip_bytes;
            spec.base_data_bytes.iter_mut().for_each(|b| *b = *b / strip * strip);
        }
        let bytes = format::raid_bytes(spec.level, &spec.base_data_bytes, spec.block_size, spec.strip_bytes);
        let bs = u64::from(spec.block_size);
        fp_bdev::validate_geometry(&spec.name, spec.block_size, bytes / bs).map_err(|e| match e {
            BdevError::InvalidParam { field: "num_blocks", .. } => RaidError::InvalidParam {
                field: "base_bdevs",
                reason: format!("the bases leave no room for data ({bytes} bytes)"),
            },
            e => RaidError::Bdev(e),
        })?;
        let bases: Vec<_> = spec.slots.iter().filter_map(|s| s.bdev.as_ref()).collect();
        let all = |f: fn(&IoTypes) -> bool| !bases.is_empty() && bases.iter().all(|b| f(&b.info().io_types));
        let io_types = IoTypes {
            read: true,
            write: true,
            flush: bases.iter().any(|b| b.info().io_types.flush),
            unmap: all(|t| t.unmap),
            write_zeroes: all(|t| t.write_zeroes),
        };
        let info = BdevInfo {
            name: spec.name.clone(),
            product_name: "Raid Volume".into(),
            block_size: spec.block_size,
            capacity: Capacity::new(bytes / bs),
            io_types,
            driver: "raid",
            driver_specific: None,
        };
        let intent = (spec.level == RaidLevel::Raid1).then(|| {
            let chunk =
                if spec.chunk_bytes == 0 { format::bitmap_chunk_bytes(bytes) } else { spec.chunk_bytes };
            IntentMap::new(bytes, chunk, spec.superblock)
        });
        let layout = Layout { slots: spec.slots, data_offset: spec.data_offset };
        let shared = RaidShared {
            info,
            level: spec.level,
            strip_bytes: if spec.level == RaidLevel::Raid1 { 0 } else { spec.strip_bytes },
            base_data_bytes: spec.base_data_bytes,
            layout: ArcSwap::from_pointee(layout),
            epoch: AtomicU64::new(1),
            intent,
            failures: ArrayQueue::new(FAILURE_QUEUE),
            owner_waker: ArcSwapOption::empty(),
            process: ProcessStats::default(),
            counters: RaidCounters::default(),
            channels: std::sync::Mutex::new(Vec::new()),
            channels_changed: std::sync::atomic::AtomicU64::new(0),
            leaving: std::sync::Mutex::new(Vec::new()),
            stopping: std::sync::Mutex::new(None),
        };
        Ok(RaidDevice { shared: Arc::new(shared), uuid: spec.uuid, superblock: spec.superblock })
    }

    /// What the channels and the owner share.
    pub fn shared(&self) -> &Arc<RaidShared> {
        &self.shared
    }

    /// The raid's id.
    pub fn uuid(&self) -> Uuid {
        self.uuid
    }

    /// Whether the bases carry a superblock.
    pub fn superblock(&self) -> bool {
        self.superblock
    }

    /// Slots in a state for which `f` holds.
    pub fn count_slots(&self, f: impl Fn(SlotState) -> bool) -> usize {
        self.shared.layout().slots.iter().filter(|s| f(s.state)).count()
    }
}

impl BlockDevice for RaidDevice {
    fn info(&self) -> &BdevInfo {
        &self.shared.info
    }

    fn open_channel(&self) -> Result<Box<dyn IoChannel>, BdevError> {
        let shared = self.shared.clone();
        Ok(match shared.level {
            RaidLevel::Raid1 => Box::new(Raid1Channel::new(shared)),
            RaidLevel::Raid0 => {
                let map = Raid0Map::new(shared.base_data_bytes.len(), shared.strip_bytes);
                Box::new(SplitChannel::new(shared, map))
            }
            RaidLevel::Concat => {
                let bs = u64::from(shared.info.block_size);
                let sizes: Vec<u64> = shared.base_data_bytes.iter().map(|s| s / bs * bs).collect();
                Box::new(SplitChannel::new(shared, ConcatMap::new(&sizes)))
            }
        })
    }
}
