//! The control device client: /dev/ublk-control and an io_uring with 128-byte SQEs, one
//! command at a time, each wait bounded.
//!
//! The kernel runs a control command on an io_uring worker (it refuses the non-blocking
//! attempt), so the submission returns at once and the wait is ours to bound. A command can
//! outlive its bound (START_DEV waits for every queue's FETCHes, STOP_DEV for the requests in
//! flight); the kernel may then still write the command's buffer, so a timed-out client is
//! leaked whole ([`Control::leak`]): its ring and buffer stay valid for the kernel, and the
//! caller opens a new client for the next command.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Duration;

use io_uring::{cqueue, opcode, squeue, types, IoUring};

use crate::uapi::{cmd, ctrl_dir, feature, CtrlCmd, DevInfo, Encoding, Params};

/// Where the kernel puts the control device.
pub const CONTROL_PATH: &str = "/dev/ublk-control";

/// Why a control command failed.
#[derive(Debug, thiserror::Error)]
pub enum CtrlError {
    /// No control device: the kernel has no `ublk_drv` (or it is not loaded).
    #[error("{path}: {source} (is the ublk_drv module loaded? `modprobe ublk_drv`)")]
    NoDevice { path: String, source: io::Error },
    /// The ring could not be made or entered.
    #[error("ublk control ring: {0}")]
    Ring(io::Error),
    /// The kernel answered the command with an error.
    #[error("ublk {command} (device {dev_id}): the kernel answered {}", errno_text(*.errno))]
    Kernel { command: &'static str, dev_id: u32, errno: i32 },
    /// No answer within the bound; the client is leaked ([`Control::leak`]).
    #[error("ublk {command} (device {dev_id}): no answer from the kernel within {bound:?}")]
    TimedOut { command: &'static str, dev_id: u32, bound: Duration },
}

impl CtrlError {
    /// The kernel's errno, for a command it refused.
    pub fn errno(&self) -> Option<i32> {
        match self {
            CtrlError::Kernel { errno, .. } => Some(*errno),
            _ => None,
        }
    }
}

fn errno_text(errno: i32) -> String {
    format!("{} (errno {errno})", io::Error::from_raw_os_error(errno))
}

/// The command's name, for errors and logs.
fn command_name(nr: u8) -> &'static str {
    match nr {
        cmd::GET_DEV_INFO => "GET_DEV_INFO",
        cmd::ADD_DEV => "ADD_DEV",
        cmd::DEL_DEV => "DEL_DEV",
        cmd::START_DEV => "START_DEV",
        cmd::STOP_DEV => "STOP_DEV",
        cmd::SET_PARAMS => "SET_PARAMS",
        cmd::GET_PARAMS => "GET_PARAMS",
        cmd::START_USER_RECOVERY => "START_USER_RECOVERY",
        cmd::END_USER_RECOVERY => "END_USER_RECOVERY",
        cmd::GET_FEATURES => "GET_FEATURES",
        cmd::UPDATE_SIZE => "UPDATE_SIZE",
        _ => "command",
    }
}

/// The kernel's `ENOTSUPP` (include/linux/errno.h), which is not in the user-space errno list.
const ENOTSUPP: i32 = 524;

/// Whether GET_FEATURES failing with `errno` means a kernel before 6.5 (no such command).
fn predates_get_features(errno: i32) -> bool {
    matches!(errno, libc::EINVAL | libc::EOPNOTSUPP | libc::ENODEV | ENOTSUPP)
}

/// The buffer a command points the kernel at: big enough for the largest (`Params`), 8-aligned.
#[repr(C, align(8))]
struct Scratch([u8; 128]);

const _: () = assert!(std::mem::size_of::<Params>() <= 128 && std::mem::size_of::<DevInfo>() <= 128);

/// A client of /dev/ublk-control.
pub struct Control {
    // The ring before the file: it is dropped first, so no command outlives the file's fd.
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    file: File,
    scratch: Box<Scratch>,
    encoding: Encoding,
    /// What GET_FEATURES offered; `None` on a kernel without it (before 6.5).
    features: Option<u64>,
}

impl Control {
    /// Opens the control device at `path` and asks the kernel what it offers: GET_FEATURES,
    /// ioctl-encoded (the only form it has); a kernel that refuses it predates 6.5 and takes
    /// the legacy command numbers.
    pub fn open(path: &Path, bound: Duration) -> Result<Control, CtrlError> {
        let mut c = Control::open_as(path, Encoding::Ioctl, None)?;
        match c.command(cmd::GET_FEATURES, u32::MAX, 8, 0, bound) {
            Ok(_) => {
                let f = u64::from_ne_bytes(c.scratch.0[..8].try_into().expect("8 bytes"));
                c.features = Some(f);
                if f & feature::CMD_IOCTL_ENCODE == 0 {
                    c.encoding = Encoding::Legacy;
                }
            }
            // Before 6.5 the command is unknown: the driver looks the device (id all ones) up
            // first (ENODEV), or refuses the number (ENOTSUPP, the kernel's 524, or EINVAL).
            Err(CtrlError::Kernel { errno, .. }) if predates_get_features(errno) => {
                c.encoding = Encoding::Legacy;
            }
            Err(e) => return Err(e),
        }
        Ok(c)
    }

    /// Reopens a client with the same encoding and features, without asking the kernel again.
    pub fn reopen(&self, path: &Path) -> Result<Control, CtrlError> {
        Control::open_as(path, self.encoding, self.features)
    }

    /// The device and a fresh ring, with what is known of the kernel.
    fn open_as(path: &Path, encoding: Encoding, features: Option<u64>) -> Result<Control, CtrlError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|source| CtrlError::NoDevice { path: path.display().to_string(), source })?;
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(4).map_err(CtrlError::Ring)?;
        Ok(Control { ring, file, scratch: Box::new(Scratch([0; 128])), encoding, features })
    }

    /// Gives the client up after a command that outlived its bound: the kernel may still write
    /// its buffer or complete on its ring, so neither is ever freed (one client per such
    /// command; they are rare and small).
    pub fn leak(self) {
        std::mem::forget(self);
    }

    pub fn encoding(&self) -> Encoding {
        self.encoding
    }

    pub fn features(&self) -> Option<u64> {
        self.features
    }

    /// ADD_DEV: `info` in, the kernel's answer (the id it chose, the flags it kept) out.
    pub fn add_dev(&mut self, info: &DevInfo, bound: Duration) -> Result<DevInfo, CtrlError> {
        let id = info.dev_id;
        self.put(info);
        self.command(cmd::ADD_DEV, id, std::mem::size_of::<DevInfo>() as u16, 0, bound)?;
        Ok(self.get::<DevInfo>())
    }

    pub fn get_dev_info(&mut self, dev_id: u32, bound: Duration) -> Result<DevInfo, CtrlError> {
        self.put(&DevInfo::default());
        self.command(cmd::GET_DEV_INFO, dev_id, std::mem::size_of::<DevInfo>() as u16, 0, bound)?;
        Ok(self.get::<DevInfo>())
    }

    pub fn set_params(&mut self, dev_id: u32, params: &Params, bound: Duration) -> Result<(), CtrlError> {
        self.put(params);
        self.command(cmd::SET_PARAMS, dev_id, params.len as u16, 0, bound).map(drop)
    }

    pub fn get_params(&mut self, dev_id: u32, bound: Duration) -> Result<Params, CtrlError> {
        let p = Params { len: std::mem::size_of::<Params>() as u32, ..Default::default() };
        self.put(&p);
        self.command(cmd::GET_PARAMS, dev_id, p.len as u16, 0, bound)?;
        Ok(self.get::<Params>())
    }

    /// START_DEV: the kernel waits for every queue's FETCHes, then adds /dev/ublkbN.
    pub fn start_dev(&mut self, dev_id: u32, pid: u32, bound: Duration) -> Result<(), CtrlError> {
        self.command(cmd::START_DEV, dev_id, 0, pid as u64, bound).map(drop)
    }

    pub fn stop_dev(&mut self, dev_id: u32, bound: Duration) -> Result<(), CtrlError> {
        self.command(cmd::STOP_DEV, dev_id, 0, 0, bound).map(drop)
    }

    pub fn del_dev(&mut self, dev_id: u32, bound: Duration) -> Result<(), CtrlError> {
        self.command(cmd::DEL_DEV, dev_id, 0, 0, bound).map(drop)
    }

    pub fn start_user_recovery(&mut self, dev_id: u32, bound: Duration) -> Result<(), CtrlError> {
        self.command(cmd::START_USER_RECOVERY, dev_id, 0, 0, bound).map(drop)
    }

    /// END_USER_RECOVERY: like START_DEV, waits for the new queues' FETCHes.
    pub fn end_user_recovery(&mut self, dev_id: u32, pid: u32, bound: Duration) -> Result<(), CtrlError> {
        self.command(cmd::END_USER_RECOVERY, dev_id, 0, pid as u64, bound).map(drop)
    }

    /// UPDATE_SIZE (`UBLK_F_UPDATE_SIZE`, Linux 6.16): the new size in sectors.
    pub fn update_size(&mut self, dev_id: u32, sectors: u64, bound: Duration) -> Result<(), CtrlError> {
        self.command(cmd::UPDATE_SIZE, dev_id, 0, sectors, bound).map(drop)
    }

    /// Copies `v` into the scratch buffer, the rest zeroed.
    fn put<T: Copy>(&mut self, v: &T) {
        let n = std::mem::size_of::<T>();
        assert!(n <= self.scratch.0.len(), "scratch holds every command's buffer");
        self.scratch.0.fill(0);
        // SAFETY: `T` is one of the uapi's plain `#[repr(C)]` structs (no padding the kernel
        // reads as data: each declares its pads as fields), `n` bytes fit the scratch buffer
        // (checked above), and the two do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(v as *const T as *const u8, self.scratch.0.as_mut_ptr(), n) };
    }

    /// Reads a `T` back from the scratch buffer.
    fn get<T: Copy + Default>(&self) -> T {
        let mut v = T::default();
        let n = std::mem::size_of::<T>();
        assert!(n <= self.scratch.0.len(), "scratch holds every command's buffer");
        // SAFETY: as in `put`; every bit pattern is a valid value of the uapi's integer-only
        // structs.
        unsafe { std::ptr::copy_nonoverlapping(self.scratch.0.as_ptr(), &mut v as *mut T as *mut u8, n) };
        v
    }

    /// Issues one command and waits at most `bound` for its completion; returns its result.
    fn command(
        &mut self,
        nr: u8,
        dev_id: u32,
        len: u16,
        data: u64,
        bound: Duration,
    ) -> Result<i32, CtrlError> {
        let command = command_name(nr);
        let c = CtrlCmd {
            dev_id,
            queue_id: u16::MAX,
            len,
            addr: if len > 0 { self.scratch.0.as_ptr() as u64 } else { 0 },
            data: [data],
            ..Default::default()
        };
        let op = self.encoding.ctrl(nr, ctrl_dir(nr));
        // GET_FEATURES exists only ioctl-encoded, whatever the others use.
        let op = if nr == cmd::GET_FEATURES { Encoding::Ioctl.ctrl(nr, ctrl_dir(nr)) } else { op };
        let sqe = opcode::UringCmd80::new(types::Fd(self.file.as_raw_fd()), op)
            .cmd(c.to_bytes())
            .build()
            .user_data(1);
        // SAFETY: the entry points the kernel at the scratch buffer (when `len` > 0), which
        // lives in its Box as long as this client does, and a client whose command is not
        // answered is leaked, never freed (`leak`); the fd is the client's own open file.
        unsafe { self.ring.submission().push(&sqe) }
            .map_err(|_| CtrlError::Ring(io::Error::other("submission queue full")))?;
        let ts = types::Timespec::new().sec(bound.as_secs()).nsec(bound.subsec_nanos());
        let args = types::SubmitArgs::new().timespec(&ts);
        loop {
            match self.ring.submitter().submit_with_args(1, &args) {
                Ok(_) => break,
                Err(e) if e.raw_os_error() == Some(libc::ETIME) => {
                    return Err(CtrlError::TimedOut { command, dev_id, bound })
                }
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => return Err(CtrlError::Ring(e)),
            }
        }
        let Some(cqe) = self.ring.completion().next() else {
            return Err(CtrlError::TimedOut { command, dev_id, bound });
        };
        let res = cqe.result();
        if res < 0 {
            return Err(CtrlError::Kernel { command, dev_id, errno: -res });
        }
        Ok(res)
    }
}
