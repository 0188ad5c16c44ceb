//! The ublk kernel interface, written from include/uapi/linux/ublk_cmd.h and
//! Documentation/block/ublk.rst: control and I/O command numbers, feature flags, device states,
//! and the `#[repr(C)]` structures the kernel reads and writes, each with its size checked at
//! compile time. Section names below are the header's own comments.
//!
//! Nothing here touches the kernel; [`crate::sys`] does.

/// "Admin commands": the legacy numbers (the ioctl-encoded ones carry them in their low byte).
pub mod cmd {
    pub const GET_DEV_INFO: u8 = 0x02;
    pub const ADD_DEV: u8 = 0x04;
    pub const DEL_DEV: u8 = 0x05;
    pub const START_DEV: u8 = 0x06;
    pub const STOP_DEV: u8 = 0x07;
    pub const SET_PARAMS: u8 = 0x08;
    pub const GET_PARAMS: u8 = 0x09;
    pub const START_USER_RECOVERY: u8 = 0x10;
    pub const END_USER_RECOVERY: u8 = 0x11;
    /// Only ever ioctl-encoded (`UBLK_U_CMD_GET_FEATURES`, Linux 6.5).
    pub const GET_FEATURES: u8 = 0x13;
    /// Only ever ioctl-encoded (`UBLK_U_CMD_UPDATE_SIZE`, with `UBLK_F_UPDATE_SIZE`).
    pub const UPDATE_SIZE: u8 = 0x15;
}

/// "IO commands": the legacy numbers of the commands a queue issues on /dev/ublkcN.
pub mod io_cmd {
    pub const FETCH_REQ: u8 = 0x20;
    pub const COMMIT_AND_FETCH_REQ: u8 = 0x21;
}

/// The direction bits of Linux's `_IOC` encoding (asm-generic/ioctl.h): the ublk commands are
/// `_IOR` (kernel writes the caller's buffer) or `_IOWR`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    Read,
    ReadWrite,
}

/// `_IOR('u', nr, T)` / `_IOWR('u', nr, T)`: nr in bits 0-7, type 'u' in 8-15, size in 16-29,
/// direction in 30-31 (write = 1, read = 2).
pub const fn ioc(dir: Dir, nr: u8, size: usize) -> u32 {
    let d: u32 = match dir {
        Dir::Read => 2,
        Dir::ReadWrite => 3,
    };
    (d << 30) | ((size as u32 & 0x3fff) << 16) | ((b'u' as u32) << 8) | nr as u32
}

/// Which way a command number is written: ioctl-encoded (every kernel since 6.5 and the only
/// form a kernel built without `CONFIG_BLKDEV_UBLK_LEGACY_OPCODES` takes) or the legacy bare
/// number (6.0 to 6.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Encoding {
    Ioctl,
    Legacy,
}

impl Encoding {
    /// A control command's `cmd_op` (`UBLK_U_CMD_*` or `UBLK_CMD_*`).
    pub const fn ctrl(self, nr: u8, dir: Dir) -> u32 {
        match self {
            Encoding::Ioctl => ioc(dir, nr, std::mem::size_of::<CtrlCmd>()),
            Encoding::Legacy => nr as u32,
        }
    }

    /// An I/O command's `cmd_op` (`UBLK_U_IO_*`, always `_IOWR`, or `UBLK_IO_*`).
    pub const fn io(self, nr: u8) -> u32 {
        match self {
            Encoding::Ioctl => ioc(Dir::ReadWrite, nr, std::mem::size_of::<IoCmd>()),
            Encoding::Legacy => nr as u32,
        }
    }
}

/// The direction each control command is declared with in the header.
pub const fn ctrl_dir(nr: u8) -> Dir {
    match nr {
        cmd::GET_DEV_INFO | cmd::GET_PARAMS | cmd::GET_FEATURES => Dir::Read,
        _ => Dir::ReadWrite,
    }
}

/// Feature flags (`UBLK_F_*`): asked for in ADD_DEV's `flags`, offered by GET_FEATURES.
pub mod feature {
    pub const SUPPORT_ZERO_COPY: u64 = 1 << 0;
    pub const URING_CMD_COMP_IN_TASK: u64 = 1 << 1;
    pub const NEED_GET_DATA: u64 = 1 << 2;
    pub const USER_RECOVERY: u64 = 1 << 3;
    pub const USER_RECOVERY_REISSUE: u64 = 1 << 4;
    pub const UNPRIVILEGED_DEV: u64 = 1 << 5;
    pub const CMD_IOCTL_ENCODE: u64 = 1 << 6;
    pub const USER_COPY: u64 = 1 << 7;
    pub const ZONED: u64 = 1 << 8;
    pub const USER_RECOVERY_FAIL_IO: u64 = 1 << 9;
    pub const UPDATE_SIZE: u64 = 1 << 10;
    pub const AUTO_BUF_REG: u64 = 1 << 11;
    pub const QUIESCE: u64 = 1 << 12;
    pub const PER_IO_DAEMON: u64 = 1 << 13;

    /// Their names, for `ublk_get_disks` and errors; bits beyond these are reported by number.
    pub const NAMES: &[(u64, &str)] = &[
        (SUPPORT_ZERO_COPY, "zero_copy"),
        (URING_CMD_COMP_IN_TASK, "comp_in_task"),
        (NEED_GET_DATA, "need_get_data"),
        (USER_RECOVERY, "user_recovery"),
        (USER_RECOVERY_REISSUE, "user_recovery_reissue"),
        (UNPRIVILEGED_DEV, "unprivileged_dev"),
        (CMD_IOCTL_ENCODE, "cmd_ioctl_encode"),
        (USER_COPY, "user_copy"),
        (ZONED, "zoned"),
        (USER_RECOVERY_FAIL_IO, "user_recovery_fail_io"),
        (UPDATE_SIZE, "update_size"),
        (AUTO_BUF_REG, "auto_buf_reg"),
        (QUIESCE, "quiesce"),
        (PER_IO_DAEMON, "per_io_daemon"),
    ];

    /// The names of the bits set in `flags`, unknown bits as `bitN`.
    pub fn names(flags: u64) -> Vec<String> {
        (0..64)
            .map(|b| 1u64 << b)
            .filter(|bit| flags & bit != 0)
            .map(|bit| match NAMES.iter().find(|(f, _)| *f == bit) {
                Some((_, n)) => (*n).to_string(),
                None => format!("bit{}", bit.trailing_zeros()),
            })
            .collect()
    }
}

/// "device state" (`UBLK_S_DEV_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DevState {
    Dead,
    Live,
    Quiesced,
    FailIo,
    Unknown(u16),
}

impl DevState {
    pub fn from_raw(v: u16) -> DevState {
        match v {
            0 => DevState::Dead,
            1 => DevState::Live,
            2 => DevState::Quiesced,
            3 => DevState::FailIo,
            n => DevState::Unknown(n),
        }
    }
}

/// `UBLK_IO_RES_ABORT`: the only completion result that means "do not fetch again".
pub const IO_RES_ABORT: i32 = -libc::ENODEV;
/// `UBLK_IO_RES_OK`.
pub const IO_RES_OK: i32 = 0;

/// `UBLK_MAX_QUEUE_DEPTH`: tags are 16 bits, the driver allows 4096 per queue.
pub const MAX_QUEUE_DEPTH: u16 = 4096;
/// `UBLK_MAX_NR_QUEUES` (12 bits of queue id).
pub const MAX_NR_QUEUES: u16 = 4096;
/// `UBLKSRV_CMD_BUF_OFFSET`: where queue 0's descriptors start in /dev/ublkcN's mmap space.
pub const CMD_BUF_OFFSET: u64 = 0;

/// "IO ops" (`UBLK_IO_OP_*`) and the flags above them in `op_flags`.
pub mod op {
    pub const READ: u8 = 0;
    pub const WRITE: u8 = 1;
    pub const FLUSH: u8 = 2;
    pub const DISCARD: u8 = 3;
    pub const WRITE_SAME: u8 = 4;
    pub const WRITE_ZEROES: u8 = 5;
    /// `UBLK_IO_F_FUA`, in `op_flags` (bit 13).
    pub const F_FUA: u32 = 1 << 13;
    /// `UBLK_IO_F_NOUNMAP` (bit 15): write-zeroes that must not deallocate.
    pub const F_NOUNMAP: u32 = 1 << 15;
}

/// `struct ublksrv_ctrl_cmd`: the 32 bytes a control command carries in the SQE's command area.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CtrlCmd {
    pub dev_id: u32,
    /// `-1` (all ones) when the command is not for one queue.
    pub queue_id: u16,
    /// The length of the buffer at `addr`.
    pub len: u16,
    pub addr: u64,
    /// Inline data (START_DEV: the daemon's pid; UPDATE_SIZE: sectors).
    pub data: [u64; 1],
    pub dev_path_len: u16,
    pub pad: u16,
    pub reserved: u32,
}

/// `struct ublksrv_ctrl_dev_info`: ADD_DEV's in/out buffer, GET_DEV_INFO's answer.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DevInfo {
    pub nr_hw_queues: u16,
    pub queue_depth: u16,
    pub state: u16,
    pub pad0: u16,
    pub max_io_buf_bytes: u32,
    pub dev_id: u32,
    pub ublksrv_pid: i32,
    pub pad1: u32,
    pub flags: u64,
    pub ublksrv_flags: u64,
    pub owner_uid: u32,
    pub owner_gid: u32,
    pub reserved1: u64,
    pub reserved2: u64,
}

/// `struct ublksrv_io_desc`: one tag's request, written by the kernel into the mmap'd array.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoDesc {
    /// The op in bits 0-7, flags in 8-31.
    pub op_flags: u32,
    pub nr_sectors: u32,
    pub start_sector: u64,
    pub addr: u64,
}

impl IoDesc {
    pub fn op(&self) -> u8 {
        (self.op_flags & 0xff) as u8
    }
}

/// `struct ublksrv_io_cmd`: the 16 bytes an I/O command carries in a 64-byte SQE.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoCmd {
    pub q_id: u16,
    pub tag: u16,
    /// COMMIT's result: bytes done, or a negative errno.
    pub result: i32,
    /// FETCH's buffer address in the daemon (unused with `UBLK_F_USER_COPY`).
    pub addr: u64,
}

impl IoCmd {
    /// Its bytes as the SQE's command area holds them (native endian, as the kernel reads them).
    pub fn to_bytes(self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0..2].copy_from_slice(&self.q_id.to_ne_bytes());
        b[2..4].copy_from_slice(&self.tag.to_ne_bytes());
        b[4..8].copy_from_slice(&self.result.to_ne_bytes());
        b[8..16].copy_from_slice(&self.addr.to_ne_bytes());
        b
    }
}

impl CtrlCmd {
    /// Its bytes at the start of the SQE128's 80-byte command area.
    pub fn to_bytes(self) -> [u8; 80] {
        let mut b = [0u8; 80];
        b[0..4].copy_from_slice(&self.dev_id.to_ne_bytes());
        b[4..6].copy_from_slice(&self.queue_id.to_ne_bytes());
        b[6..8].copy_from_slice(&self.len.to_ne_bytes());
        b[8..16].copy_from_slice(&self.addr.to_ne_bytes());
        b[16..24].copy_from_slice(&self.data[0].to_ne_bytes());
        b[24..26].copy_from_slice(&self.dev_path_len.to_ne_bytes());
        b
    }
}

/// `UBLK_ATTR_*` of [`ParamBasic::attrs`].
pub mod attr {
    pub const READ_ONLY: u32 = 1 << 0;
    pub const ROTATIONAL: u32 = 1 << 1;
    pub const VOLATILE_CACHE: u32 = 1 << 2;
    pub const FUA: u32 = 1 << 3;
}

/// `UBLK_PARAM_TYPE_*` of [`Params::types`].
pub mod param_type {
    pub const BASIC: u32 = 1 << 0;
    pub const DISCARD: u32 = 1 << 1;
    pub const DEVT: u32 = 1 << 2;
}

/// `struct ublk_param_basic`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ParamBasic {
    pub attrs: u32,
    pub logical_bs_shift: u8,
    pub physical_bs_shift: u8,
    pub io_opt_shift: u8,
    pub io_min_shift: u8,
    pub max_sectors: u32,
    pub chunk_sectors: u32,
    pub dev_sectors: u64,
    pub virt_boundary_mask: u64,
}

/// `struct ublk_param_discard`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ParamDiscard {
    pub discard_alignment: u32,
    pub discard_granularity: u32,
    pub max_discard_sectors: u32,
    pub max_write_zeroes_sectors: u32,
    pub max_discard_segments: u16,
    pub reserved0: u16,
}

/// `struct ublk_param_devt` (read-only: the kernel fills it in GET_PARAMS).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ParamDevt {
    pub char_major: u32,
    pub char_minor: u32,
    pub disk_major: u32,
    pub disk_minor: u32,
}

/// `struct ublk_param_zoned`: never set here, present so the prefix of `struct ublk_params`
/// up to it has the header's layout.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ParamZoned {
    pub max_open_zones: u32,
    pub max_active_zones: u32,
    pub max_zone_append_sectors: u32,
    pub reserved: [u8; 20],
}

/// `struct ublk_params` as Linux 6.12 has it (basic, discard, devt, zoned). Later kernels
/// append members (dma, seg, integrity); the kernel copies `len` bytes and `types` says which
/// members are meant, so this prefix is understood by every kernel since 6.0.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Params {
    pub len: u32,
    pub types: u32,
    pub basic: ParamBasic,
    pub discard: ParamDiscard,
    pub devt: ParamDevt,
    pub zoned: ParamZoned,
}

// The header's sizes: a mismatch would have the kernel read the wrong fields.
const _: () = assert!(std::mem::size_of::<CtrlCmd>() == 32);
const _: () = assert!(std::mem::size_of::<DevInfo>() == 64);
const _: () = assert!(std::mem::size_of::<IoDesc>() == 24);
const _: () = assert!(std::mem::size_of::<IoCmd>() == 16);
const _: () = assert!(std::mem::size_of::<ParamBasic>() == 32);
const _: () = assert!(std::mem::size_of::<ParamDiscard>() == 20);
const _: () = assert!(std::mem::size_of::<ParamDevt>() == 16);
const _: () = assert!(std::mem::size_of::<ParamZoned>() == 32);
const _: () = assert!(std::mem::offset_of!(Params, basic) == 8);
const _: () = assert!(std::mem::offset_of!(Params, discard) == 40);
const _: () = assert!(std::mem::offset_of!(Params, devt) == 60);
const _: () = assert!(std::mem::offset_of!(Params, zoned) == 76);
const _: () = assert!(std::mem::size_of::<Params>() == 112);

/// Where queue `q`'s descriptor array starts in /dev/ublkcN's mmap space: each queue has room
/// for [`MAX_QUEUE_DEPTH`] descriptors, rounded up to pages.
pub fn desc_offset(q: u16, page_size: usize) -> u64 {
    let per_queue = MAX_QUEUE_DEPTH as usize * std::mem::size_of::<IoDesc>();
    let per_queue = per_queue.div_ceil(page_size) * page_size;
    CMD_BUF_OFFSET + q as u64 * per_queue as u64
}

/// The length to map for `depth` descriptors.
pub fn desc_len(depth: u16, page_size: usize) -> usize {
    (depth as usize * std::mem::size_of::<IoDesc>()).div_ceil(page_size) * page_size
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The header's values, as the kernel's _IOR/_IOWR compute them.
    #[test]
    fn ioctl_encoding_matches_the_kernel_macros() {
        // _IOR('u', 0x13, 32 bytes) = 0x80207513
        assert_eq!(Encoding::Ioctl.ctrl(cmd::GET_FEATURES, ctrl_dir(cmd::GET_FEATURES)), 0x8020_7513);
        // _IOWR('u', 0x04, 32 bytes) = 0xc0207504
        assert_eq!(Encoding::Ioctl.ctrl(cmd::ADD_DEV, ctrl_dir(cmd::ADD_DEV)), 0xc020_7504);
        assert_eq!(Encoding::Ioctl.ctrl(cmd::GET_DEV_INFO, ctrl_dir(cmd::GET_DEV_INFO)), 0x8020_7502);
        // _IOWR('u', 0x20, 16 bytes) = 0xc0107520
        assert_eq!(Encoding::Ioctl.io(io_cmd::FETCH_REQ), 0xc010_7520);
        assert_eq!(Encoding::Ioctl.io(io_cmd::COMMIT_AND_FETCH_REQ), 0xc010_7521);
        assert_eq!(Encoding::Legacy.ctrl(cmd::START_DEV, Dir::ReadWrite), 0x06);
        assert_eq!(Encoding::Legacy.io(io_cmd::FETCH_REQ), 0x20);
    }

    #[test]
    fn command_bytes_follow_the_struct_layout() {
        let c = IoCmd { q_id: 3, tag: 0x102, result: -5, addr: 0x1122_3344_5566_7788 };
        let b = c.to_bytes();
        assert_eq!(u16::from_ne_bytes([b[0], b[1]]), 3);
        assert_eq!(u16::from_ne_bytes([b[2], b[3]]), 0x102);
        assert_eq!(i32::from_ne_bytes(b[4..8].try_into().unwrap()), -5);
        assert_eq!(u64::from_ne_bytes(b[8..16].try_into().unwrap()), 0x1122_3344_5566_7788);
        let c = CtrlCmd { dev_id: 7, queue_id: u16::MAX, len: 64, addr: 9, data: [42], ..Default::default() };
        let b = c.to_bytes();
        assert_eq!(u32::from_ne_bytes(b[0..4].try_into().unwrap()), 7);
        assert_eq!(u16::from_ne_bytes([b[4], b[5]]), u16::MAX);
        assert_eq!(u16::from_ne_bytes([b[6], b[7]]), 64);
        assert_eq!(u64::from_ne_bytes(b[16..24].try_into().unwrap()), 42);
        assert!(b[32..].iter().all(|&x| x == 0));
    }

    #[test]
    fn descriptor_offsets_leave_room_for_the_deepest_queue() {
        // 4096 tags x 24 bytes = 96 KiB per queue, already page aligned.
        assert_eq!(desc_offset(0, 4096), 0);
        assert_eq!(desc_offset(2, 4096), 2 * 98304);
        assert_eq!(desc_len(128, 4096), 4096);
        assert_eq!(desc_len(171, 4096), 8192);
    }

    #[test]
    fn feature_names_name_unknown_bits_by_number() {
        let n = feature::names(feature::USER_RECOVERY | feature::CMD_IOCTL_ENCODE | (1 << 40));
        assert_eq!(n, vec!["user_recovery", "cmd_ioctl_encode", "bit40"]);
    }
}
