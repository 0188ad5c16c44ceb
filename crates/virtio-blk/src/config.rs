//! virtio-blk feature bits (§5.2.3) and device configuration layout (§5.2.4).
//!
//! The configuration structure is little-endian on the wire (§5.2.4, "all
//! fields are little-endian"); [`config_space`] stores every multi-byte field
//! with `to_le()`, so [`VirtioBlkConfig::to_bytes`] is the exact byte image a
//! vhost-user `GET_CONFIG` returns, whatever the host endianness.
//!
//! We lay out the fields up to and including `unused1` (60 bytes). The later
//! secure-erase and zoned fields belong to features we never offer
//! (`VIRTIO_BLK_F_SECURE_ERASE`, `VIRTIO_BLK_F_ZONED`); a driver cannot
//! legitimately read them, and a front-end reading past the end should get
//! zeroes.

use crate::{DiskParams, SECTOR_SIZE, SEG_MAX};

pub use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_F_BLK_SIZE, VIRTIO_BLK_F_DISCARD, VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_MQ, VIRTIO_BLK_F_RO,
    VIRTIO_BLK_F_SEG_MAX, VIRTIO_BLK_F_WRITE_ZEROES,
};
pub use virtio_bindings::virtio_config::{VIRTIO_F_RING_PACKED, VIRTIO_F_VERSION_1};
pub use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};

/// Size of [`VirtioBlkConfig`] in bytes.
pub const VIRTIO_BLK_CONFIG_SIZE: usize = 60;

/// `struct virtio_blk_geometry` (§5.2.4).
#[repr(C, packed)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VirtioBlkGeometry {
    /// Cylinders (le16).
    pub cylinders: u16,
    /// Heads.
    pub heads: u8,
    /// Sectors per track.
    pub sectors: u8,
}

/// `struct virtio_blk_topology` (§5.2.4).
#[repr(C, packed)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VirtioBlkTopology {
    /// Number of logical blocks per physical block, log2.
    pub physical_block_exp: u8,
    /// Offset of the first aligned logical block.
    pub alignment_offset: u8,
    /// Suggested minimum I/O size, in blocks (le16).
    pub min_io_size: u16,
    /// Optimal (suggested maximum) I/O size, in blocks (le32).
    pub opt_io_size: u32,
}

/// `struct virtio_blk_config` (§5.2.4) through `unused1`. Multi-byte fields hold
/// little-endian values.
#[repr(C, packed)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VirtioBlkConfig {
    /// Capacity in 512-byte sectors (offset 0).
    pub capacity: u64,
    /// Max size of one segment (`VIRTIO_BLK_F_SIZE_MAX`, not offered) (offset 8).
    pub size_max: u32,
    /// Max data segments per request (`VIRTIO_BLK_F_SEG_MAX`) (offset 12).
    pub seg_max: u32,
    /// Legacy geometry (`VIRTIO_BLK_F_GEOMETRY`, not offered) (offset 16).
    pub geometry: VirtioBlkGeometry,
    /// Logical block size (`VIRTIO_BLK_F_BLK_SIZE`) (offset 20).
    pub blk_size: u32,
    /// I/O topology (`VIRTIO_BLK_F_TOPOLOGY`, not offered) (offset 24).
    pub topology: VirtioBlkTopology,
    /// Cache mode (`VIRTIO_BLK_F_CONFIG_WCE`, not offered) (offset 32).
    pub writeback: u8,
    /// Padding (offset 33).
    pub unused0: u8,
    /// Number of request queues (`VIRTIO_BLK_F_MQ`) (offset 34).
    pub num_queues: u16,
    /// Max sectors of one discard segment (offset 36).
    pub max_discard_sectors: u32,
    /// Max discard segments per request (offset 40).
    pub max_discard_seg: u32,
    /// Discard alignment, in sectors (offset 44).
    pub discard_sector_alignment: u32,
    /// Max sectors of one write-zeroes segment (offset 48).
    pub max_write_zeroes_sectors: u32,
    /// Max write-zeroes segments per request (offset 52).
    pub max_write_zeroes_seg: u32,
    /// Whether write zeroes with the unmap flag may deallocate (offset 56).
    pub write_zeroes_may_unmap: u8,
    /// Padding (offset 57).
    pub unused1: [u8; 3],
}

const _: () = assert!(std::mem::size_of::<VirtioBlkConfig>() == VIRTIO_BLK_CONFIG_SIZE);
const _: () = assert!(std::mem::size_of::<VirtioBlkGeometry>() == 4);
const _: () = assert!(std::mem::size_of::<VirtioBlkTopology>() == 8);

impl VirtioBlkConfig {
    /// The configuration space as bytes (little-endian wire format): the fields in order, each
    /// as stored (already little-endian).
    pub fn to_bytes(&self) -> [u8; VIRTIO_BLK_CONFIG_SIZE] {
        // Copies out of the packed struct: no reference to an unaligned field.
        let (g, t) = (self.geometry, self.topology);
        let mut out = [0u8; VIRTIO_BLK_CONFIG_SIZE];
        let mut at = 0;
        let mut put = |bytes: &[u8]| {
            out[at..at + bytes.len()].copy_from_slice(bytes);
            at += bytes.len();
        };
        put(&{ self.capacity }.to_ne_bytes());
        put(&{ self.size_max }.to_ne_bytes());
        put(&{ self.seg_max }.to_ne_bytes());
        put(&{ g.cylinders }.to_ne_bytes());
        put(&[g.heads, g.sectors]);
        put(&{ self.blk_size }.to_ne_bytes());
        put(&[t.physical_block_exp, t.alignment_offset]);
        put(&{ t.min_io_size }.to_ne_bytes());
        put(&{ t.opt_io_size }.to_ne_bytes());
        put(&[self.writeback, self.unused0]);
        put(&{ self.num_queues }.to_ne_bytes());
        put(&{ self.max_discard_sectors }.to_ne_bytes());
        put(&{ self.max_discard_seg }.to_ne_bytes());
        put(&{ self.discard_sector_alignment }.to_ne_bytes());
        put(&{ self.max_write_zeroes_sectors }.to_ne_bytes());
        put(&{ self.max_write_zeroes_seg }.to_ne_bytes());
        put(&[self.write_zeroes_may_unmap]);
        put(&self.unused1);
        debug_assert_eq!(at, VIRTIO_BLK_CONFIG_SIZE);
        out
    }
}

/// Features offered by the device (§5.2.3, §6): `VIRTIO_F_VERSION_1`,
/// `VIRTIO_RING_F_EVENT_IDX`, `VIRTIO_RING_F_INDIRECT_DESC`, `SEG_MAX`,
/// `BLK_SIZE`, `MQ`; `FLUSH`, `DISCARD`, `WRITE_ZEROES` per the disk flags and
/// `RO` only for a read-only disk. (vhost-user protocol-level bits such as
/// `VHOST_USER_F_PROTOCOL_FEATURES` are the back-end's business.)
pub fn device_features(disk: &DiskParams) -> u64 {
    let bit = |b: u32| 1u64 << b;
    let mut f = bit(VIRTIO_F_VERSION_1)
        | bit(VIRTIO_RING_F_EVENT_IDX)
        | bit(VIRTIO_RING_F_INDIRECT_DESC)
        | bit(VIRTIO_F_RING_PACKED)
        | bit(VIRTIO_BLK_F_SEG_MAX)
        | bit(VIRTIO_BLK_F_BLK_SIZE)
        | bit(VIRTIO_BLK_F_MQ);
    if disk.read_only {
        f |= bit(VIRTIO_BLK_F_RO);
    }
    if disk.flush {
        f |= bit(VIRTIO_BLK_F_FLUSH);
    }
    if disk.discard {
        f |= bit(VIRTIO_BLK_F_DISCARD);
    }
    if disk.write_zeroes {
        f |= bit(VIRTIO_BLK_F_WRITE_ZEROES);
    }
    f
}

/// Build the configuration space (§5.2.4) for `disk` with `num_queues` request queues.
///
/// * `seg_max` = [`SEG_MAX`], `blk_size` = the effective block size;
/// * `writeback` = 1 when flush is offered (the value a driver assumes without
///   `CONFIG_WCE`);
/// * discard / write-zeroes limits: one segment per request, at most
///   `max_*_sectors` sectors (0 in [`DiskParams`] → `u32::MAX`), discard
///   alignment = one logical block; the fields are zero when the feature is
///   not offered; `write_zeroes_may_unmap` = 1 when discard is offered too.
pub fn config_space(disk: &DiskParams, num_queues: u16) -> VirtioBlkConfig {
    let bs = disk.effective_block_size();
    let unlimited = |v: u32| if v == 0 { u32::MAX } else { v };
    let mut c = VirtioBlkConfig {
        capacity: disk.capacity_sectors.to_le(),
        seg_max: SEG_MAX.to_le(),
        blk_size: bs.to_le(),
        writeback: u8::from(disk.flush),
        num_queues: num_queues.to_le(),
        ..Default::default()
    };
    if disk.discard {
        c.max_discard_sectors = unlimited(disk.max_discard_sectors).to_le();
        c.max_discard_seg = 1u32.to_le();
        c.discard_sector_alignment = (bs / SECTOR_SIZE as u32).to_le();
    }
    if disk.write_zeroes {
        c.max_write_zeroes_sectors = unlimited(disk.max_write_zeroes_sectors).to_le();
        c.max_write_zeroes_seg = 1u32.to_le();
        c.write_zeroes_may_unmap = u8::from(disk.discard);
    }
    c
}
