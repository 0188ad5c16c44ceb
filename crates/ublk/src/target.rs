//! ublk devices' lives, on the control plane's threads (never a reactor): the target holds the
//! control device client and the reactors the queues run on; [`Target::start_disk`] adds a
//! device, sets its parameters, puts its queues on reactors (each fetches its tags there),
//! then starts it; [`Target::recover_disk`] takes over a device whose daemon died;
//! [`Target::stop_disk`] stops and deletes one.
//!
//! START_DEV and END_USER_RECOVERY wait in the kernel for every queue's FETCHes, so they are
//! issued once the queues are up, from the calling thread, each bounded.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use fp_bdev::Bdev;
use fp_reactor::ReactorHandle;

use crate::poller::{QueuePoller, QueueShared, QueueStats};
use crate::sys::{Control, CtrlError, QueueRing};
use crate::uapi::{attr, feature, param_type, DevInfo, DevState, Encoding, ParamBasic, ParamDiscard, Params};

/// SPDK's defaults: one queue of 128 tags.
pub const DEFAULT_NUM_QUEUES: u16 = 1;
pub const DEFAULT_QUEUE_DEPTH: u16 = 128;
/// SPDK's bound on queues per device.
pub const MAX_NUM_QUEUES: u16 = 32;
/// The kernel's bound on tags per queue.
pub const MAX_QUEUE_DEPTH: u16 = crate::uapi::MAX_QUEUE_DEPTH;
/// The largest request the device takes, and each tag's buffer (the kernel splits larger
/// ones). Virtual memory: a tag's pages are touched only when a request that large comes.
pub const IO_BUF_BYTES: u32 = 512 * 1024;
/// How long a control command (and a queue's setup on its reactor) may take.
pub const CTRL_BOUND: Duration = Duration::from_secs(30);
/// How long /dev/ublkcN may take to appear after ADD_DEV (devtmpfs adds it at once; udev
/// may rename or set permissions a moment later).
const CDEV_BOUND: Duration = Duration::from_secs(10);

/// Why a target or disk operation failed.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error(transparent)]
    Control(#[from] CtrlError),
    #[error("{field}: {reason}")]
    Invalid { field: &'static str, reason: String },
    #[error(
        "ublk device id {0} is in use (a device whose daemon died is taken over with ublk_recover_disk)"
    )]
    InUse(u32),
    #[error("the kernel's ublk driver lacks {missing} (it offers: {offered})")]
    MissingFeature { missing: String, offered: String },
    #[error("{0}")]
    Setup(String),
}

/// What to start.
pub struct StartSpec {
    /// The device id (N of /dev/ublkbN); `None` lets the kernel pick.
    pub id: Option<u32>,
    pub bdev: Bdev,
    pub num_queues: u16,
    pub queue_depth: u16,
    /// `Some(true)`: user recovery is required; `Some(false)`: not wanted; `None`: used when
    /// the kernel offers it.
    pub user_recovery: Option<bool>,
}

/// A device this daemon serves.
pub struct UblkDisk {
    pub id: u32,
    pub bdev_name: String,
    pub num_queues: u16,
    pub queue_depth: u16,
    /// The flags the kernel kept for the device.
    pub flags: u64,
    /// Taken over from a daemon that died (`ublk_recover_disk`).
    pub recovered: bool,
    queues: Vec<Arc<QueueShared>>,
}

/// What `ublk_get_disks` shows of one.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DiskInfo {
    pub ublk_id: u32,
    pub bdev_name: String,
    pub id: u32,
    pub num_queues: u16,
    pub queue_depth: u16,
    pub ublk_device: String,
    /// flashpath's: how request data moves (`kernel_copy`: the kernel copies between the block
    /// request and the tag's buffer).
    pub copy_mode: &'static str,
    pub user_recovery: bool,
    pub recovery_reissue: bool,
    /// Whether a bdev resize reaches the device (UPDATE_SIZE); otherwise it needs a stop/start.
    pub live_resize: bool,
    pub recovered: bool,
    pub features: Vec<String>,
    pub stats: QueueStats,
}

impl UblkDisk {
    pub fn info(&self) -> DiskInfo {
        let mut stats = QueueStats::default();
        for q in &self.queues {
            stats.add(q);
        }
        DiskInfo {
            ublk_id: self.id,
            bdev_name: self.bdev_name.clone(),
            id: self.id,
            num_queues: self.num_queues,
            queue_depth: self.queue_depth,
            ublk_device: format!("/dev/ublkb{}", self.id),
            copy_mode: "kernel_copy",
            user_recovery: self.flags & feature::USER_RECOVERY != 0,
            recovery_reissue: self.flags & feature::USER_RECOVERY_REISSUE != 0,
            live_resize: self.flags & feature::UPDATE_SIZE != 0,
            recovered: self.recovered,
            features: feature::names(self.flags),
            stats,
        }
    }
}

/// The ublk target: the control device client and the reactors the queues run on.
pub struct Target {
    control_path: PathBuf,
    dev_dir: PathBuf,
    control: Mutex<Control>,
    reactors: Vec<ReactorHandle>,
    next: AtomicUsize,
    bound: Duration,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Target {
    /// Opens the control device (`ublk_create_target`) and detects what the kernel offers.
    pub fn create(
        control_path: &Path,
        reactors: Vec<ReactorHandle>,
        bound: Duration,
    ) -> Result<Target, TargetError> {
        if reactors.is_empty() {
            return Err(TargetError::Invalid { field: "cpumask", reason: "selects no reactor".into() });
        }
        let control = Control::open(control_path, bound)?;
        log::info!(
            "ublk target: {} ({} commands), features: {}",
            control_path.display(),
            match control.encoding() {
                Encoding::Ioctl => "ioctl-encoded",
                Encoding::Legacy => "legacy",
            },
            control
                .features()
                .map_or("unknown (no GET_FEATURES: Linux before 6.5)".into(), |f| feature::names(f)
                    .join(","))
        );
        Ok(Target {
            dev_dir: control_path.parent().unwrap_or(Path::new("/dev")).to_path_buf(),
            control_path: control_path.to_path_buf(),
            control: Mutex::new(control),
            reactors,
            next: AtomicUsize::new(0),
            bound,
        })
    }

    /// What GET_FEATURES offered; `None` before Linux 6.5.
    pub fn features(&self) -> Option<u64> {
        lock(&self.control).features()
    }

    pub fn encoding(&self) -> Encoding {
        lock(&self.control).encoding()
    }

    pub fn reactor_count(&self) -> usize {
        self.reactors.len()
    }

    /// Runs one command; a client whose command outlived its bound is leaked and replaced.
    fn ctrl<R>(&self, f: impl FnOnce(&mut Control) -> Result<R, CtrlError>) -> Result<R, CtrlError> {
        let mut c = lock(&self.control);
        let r = f(&mut c);
        if matches!(r, Err(CtrlError::TimedOut { .. })) {
            match c.reopen(&self.control_path) {
                Ok(fresh) => std::mem::replace(&mut *c, fresh).leak(),
                Err(e) => log::error!("ublk target: cannot reopen the control device: {e}"),
            }
        }
        r
    }

    /// Adds a device for `spec.bdev`, puts its queues on reactors and starts it.
    pub fn start_disk(&self, spec: StartSpec) -> Result<UblkDisk, TargetError> {
        check_geometry(spec.num_queues, spec.queue_depth)?;
        let flags = wanted_flags(self.features(), self.encoding(), spec.user_recovery)?;
        let bi = spec.bdev.info();
        let want = DevInfo {
            nr_hw_queues: spec.num_queues,
            queue_depth: spec.queue_depth,
            max_io_buf_bytes: IO_BUF_BYTES,
            dev_id: spec.id.unwrap_or(u32::MAX),
            ublksrv_pid: std::process::id() as i32,
            flags,
            ..Default::default()
        };
        let info = self.ctrl(|c| c.add_dev(&want, self.bound)).map_err(|e| match (e.errno(), spec.id) {
            (Some(libc::EEXIST), Some(id)) => TargetError::InUse(id),
            _ => TargetError::Control(e),
        })?;
        let id = info.dev_id;
        log::info!(
            "ublk device {id}: added for bdev '{}' ({} queue(s) of {} tags, flags {})",
            bi.name,
            info.nr_hw_queues,
            info.queue_depth,
            feature::names(info.flags).join(",")
        );
        let mut queues = Vec::new();
        let r = (|| {
            // The kernel drops flags it does not know (ADD_DEV masks them): one it dropped
            // that was asked for is a refusal, never a silent difference.
            let dropped = flags & !info.flags & !feature::CMD_IOCTL_ENCODE;
            if dropped != 0 {
                return Err(TargetError::MissingFeature {
                    missing: feature::names(dropped).join(", "),
                    offered: feature::names(info.flags).join(", "),
                });
            }
            let params = params_for(&spec.bdev, info.max_io_buf_bytes);
            self.ctrl(|c| c.set_params(id, &params, self.bound))?;
            queues = self.start_queues(id, &info, &spec.bdev)?;
            self.ctrl(|c| c.start_dev(id, std::process::id(), self.bound))?;
            Ok(())
        })();
        if let Err(e) = r {
            self.tear_down(id, &queues);
            return Err(e);
        }
        log::info!("ublk device {id}: started as /dev/ublkb{id} (bdev '{}')", bi.name);
        Ok(UblkDisk {
            id,
            bdev_name: bi.name.clone(),
            num_queues: info.nr_hw_queues,
            queue_depth: info.queue_depth,
            flags: info.flags,
            recovered: false,
            queues,
        })
    }

    /// Takes over device `id`, whose daemon died, for `bdev` (`ublk_recover_disk`): its
    /// held requests complete once the new queues fetched their tags.
    pub fn recover_disk(&self, id: u32, bdev: Bdev) -> Result<UblkDisk, TargetError> {
        log::info!("ublk device {id}: recovering for bdev '{}'", bdev.info().name);
        let info = self.ctrl(|c| c.get_dev_info(id, self.bound))?;
        if info.flags & feature::USER_RECOVERY == 0 {
            return Err(TargetError::Invalid {
                field: "ublk_id",
                reason: format!("ublk device {id} was added without user_recovery; it cannot be recovered"),
            });
        }
        match DevState::from_raw(info.state) {
            DevState::Quiesced | DevState::FailIo => {}
            s => {
                return Err(TargetError::Invalid {
                    field: "ublk_id",
                    reason: format!(
                        "ublk device {id} is {s:?} (daemon pid {}), not waiting for recovery",
                        info.ublksrv_pid
                    ),
                })
            }
        }
        let params = self.ctrl(|c| c.get_params(id, self.bound))?;
        let size = bdev.info().size_bytes();
        if params.types & param_type::BASIC != 0 && params.basic.dev_sectors.saturating_mul(512) > size {
            return Err(TargetError::Invalid {
                field: "bdev_name",
                reason: format!(
                    "bdev '{}' has {size} bytes; ublk device {id} has {}",
                    bdev.info().name,
                    params.basic.dev_sectors * 512
                ),
            });
        }
        self.ctrl(|c| c.start_user_recovery(id, self.bound))?;
        let queues = self.start_queues(id, &info, &bdev)?;
        log::info!("ublk device {id}: {} queue(s) fetched their tags; ending the recovery", queues.len());
        if let Err(e) = self.ctrl(|c| c.end_user_recovery(id, std::process::id(), self.bound)) {
            self.quit_queues(&queues);
            return Err(e.into());
        }
        log::info!(
            "ublk device {id}: recovered (bdev '{}'); its held requests are reissued",
            bdev.info().name
        );
        Ok(UblkDisk {
            id,
            bdev_name: bdev.info().name.clone(),
            num_queues: info.nr_hw_queues,
            queue_depth: info.queue_depth,
            flags: info.flags,
            recovered: true,
            queues,
        })
    }

    /// Opens /dev/ublkcN (waiting, bounded, for it to appear) and starts each queue on its
    /// reactor, spread as vhost queues are: queue i on reactor (first + i) % n.
    fn start_queues(
        &self,
        id: u32,
        info: &DevInfo,
        bdev: &Bdev,
    ) -> Result<Vec<Arc<QueueShared>>, TargetError> {
        let path = self.dev_dir.join(format!("ublkc{id}"));
        let deadline = Instant::now() + CDEV_BOUND;
        let cdev = loop {
            match OpenOptions::new().read(true).write(true).open(&path) {
                Ok(f) => break Arc::new(f),
                Err(e) if Instant::now() < deadline && e.kind() == std::io::ErrorKind::NotFound => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Err(e) => return Err(TargetError::Setup(format!("{}: {e}", path.display()))),
            }
        };
        let first = self.next.fetch_add(info.nr_hw_queues as usize, Ordering::Relaxed);
        let encoding = self.encoding();
        let mut queues = Vec::new();
        for q in 0..info.nr_hw_queues {
            let reactor = &self.reactors[(first + q as usize) % self.reactors.len()];
            let shared = Arc::new(QueueShared::default());
            let (cdev, bdev, sh) = (cdev.clone(), bdev.clone(), shared.clone());
            let (depth, buf) = (info.queue_depth, info.max_io_buf_bytes as usize);
            let name = format!("ublk device {id} queue {q}");
            let r = reactor.call_within(self.bound, move |r| {
                let ring = QueueRing::new(cdev as Arc<File>, q, depth, buf, encoding)
                    .map_err(|e| format!("{name}: setting up its ring: {e}"))?;
                let p = QueuePoller::new(ring, bdev, sh, name)?;
                r.add_poller(Box::new(p));
                Ok::<(), String>(())
            });
            match r {
                Some(Ok(())) => queues.push(shared),
                Some(Err(e)) => {
                    self.quit_queues(&queues);
                    return Err(TargetError::Setup(e));
                }
                None => {
                    self.quit_queues(&queues);
                    return Err(TargetError::Setup(format!(
                        "ublk device {id} queue {q}: reactor {} did not answer within {:?}",
                        reactor.id(),
                        self.bound
                    )));
                }
            }
        }
        Ok(queues)
    }

    /// Tells queues to leave their reactors once the bdev returned their requests.
    fn quit_queues(&self, queues: &[Arc<QueueShared>]) {
        for q in queues {
            q.quit.store(true, Ordering::Release);
            q.give_up_parked.store(true, Ordering::Release);
        }
    }

    /// After a failed start: the queues go, the device is deleted.
    fn tear_down(&self, id: u32, queues: &[Arc<QueueShared>]) {
        self.quit_queues(queues);
        wait_finished(queues, self.bound);
        if let Err(e) = self.ctrl(|c| c.del_dev(id, self.bound)) {
            log::warn!("ublk device {id}: deleting it after a failed start: {e}");
        }
    }

    /// Stops device `disk` (the kernel removes /dev/ublkbN once the requests in flight are
    /// answered, then aborts the queues' fetches), waits up to `bound` for its queues to
    /// leave their reactors, and deletes it.
    pub fn stop_disk(&self, disk: &UblkDisk, bound: Duration) -> Result<(), TargetError> {
        let id = disk.id;
        // The kernel answers STOP_DEV once the requests in flight are done: a bdev holding one
        // keeps it waiting past the bound. The device then goes when they complete (the
        // command stays with the kernel); a second stop finds it stopped and deletes it.
        match self.ctrl(|c| c.stop_dev(id, bound)) {
            Ok(()) => {}
            Err(CtrlError::TimedOut { .. }) => {
                return Err(TargetError::Setup(format!(
                    "ublk device {id}: the kernel still waits for requests in flight on bdev '{}' \
                     after {bound:?}; /dev/ublkb{id} goes once they complete (stop it again then to \
                     delete the device)",
                    disk.bdev_name
                )))
            }
            Err(e) => return Err(e.into()),
        }
        if !wait_finished(&disk.queues, bound / 2) {
            // Requests the bdev holds back as busy are given up, then the queues go anyway.
            self.quit_queues(&disk.queues);
            if !wait_finished(&disk.queues, bound / 2) {
                return Err(TargetError::Setup(format!(
                    "ublk device {id}: stopped, but its queues still wait for requests bdev '{}' has \
                     not completed after {bound:?}; it is deleted when they finish (stop it again)",
                    disk.bdev_name
                )));
            }
        }
        self.ctrl(|c| c.del_dev(id, self.bound))?;
        log::info!("ublk device {id}: stopped and deleted (bdev '{}')", disk.bdev_name);
        Ok(())
    }

    /// The bdev now has `size_bytes`: pushed to the device with UPDATE_SIZE where the kernel
    /// has it (Linux 6.16); otherwise the device keeps its size until a stop and start.
    pub fn resize(&self, disk: &UblkDisk, size_bytes: u64) -> Result<bool, TargetError> {
        if disk.flags & feature::UPDATE_SIZE == 0 {
            return Ok(false);
        }
        self.ctrl(|c| c.update_size(disk.id, size_bytes / 512, self.bound))?;
        Ok(true)
    }
}

/// The flags ADD_DEV asks for, from what GET_FEATURES `offered` (`None`: a kernel before 6.5,
/// which is asked for nothing optional but recovery when `user_recovery` says so) and whether
/// user recovery is required, refused or (`None`) used when offered. A required feature the
/// kernel does not offer is a refusal naming it.
pub fn wanted_flags(
    offered: Option<u64>,
    encoding: Encoding,
    user_recovery: Option<bool>,
) -> Result<u64, TargetError> {
    let has = |f: u64| offered.is_some_and(|o| o & f != 0);
    let mut flags = 0u64;
    if encoding == Encoding::Ioctl {
        flags |= feature::CMD_IOCTL_ENCODE;
    }
    let recovery = match user_recovery {
        Some(true) if offered.is_some() && !has(feature::USER_RECOVERY) => {
            return Err(TargetError::MissingFeature {
                missing: "user_recovery".into(),
                offered: offered.map_or("unknown".to_string(), |f| feature::names(f).join(", ")),
            })
        }
        Some(want) => want,
        None => has(feature::USER_RECOVERY),
    };
    if recovery {
        flags |= feature::USER_RECOVERY;
        // Requests in flight when the daemon dies are reissued to the next one, rather than
        // failed: what the page cache or a file system wrote is not lost.
        if has(feature::USER_RECOVERY_REISSUE) {
            flags |= feature::USER_RECOVERY_REISSUE;
        }
    }
    if has(feature::UPDATE_SIZE) {
        flags |= feature::UPDATE_SIZE;
    }
    Ok(flags)
}

/// Queue count and depth within SPDK's and the kernel's bounds.
pub fn check_geometry(num_queues: u16, queue_depth: u16) -> Result<(), TargetError> {
    if num_queues == 0 || num_queues > MAX_NUM_QUEUES {
        return Err(TargetError::Invalid {
            field: "num_queues",
            reason: format!("{num_queues} is not between 1 and {MAX_NUM_QUEUES}"),
        });
    }
    if queue_depth == 0 || queue_depth > MAX_QUEUE_DEPTH {
        return Err(TargetError::Invalid {
            field: "queue_depth",
            reason: format!("{queue_depth} is not between 1 and {MAX_QUEUE_DEPTH}"),
        });
    }
    Ok(())
}

/// Waits up to `bound` for every queue to leave its reactor.
fn wait_finished(queues: &[Arc<QueueShared>], bound: Duration) -> bool {
    let deadline = Instant::now() + bound;
    loop {
        if queues.iter().all(|q| q.finished.load(Ordering::Acquire)) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The device's parameters for `bdev`: its block size and size; a volatile cache with FUA, so
/// the kernel sends flushes and FUA writes; discard and write-zeroes when the bdev takes them.
pub fn params_for(bdev: &Bdev, max_io_buf_bytes: u32) -> Params {
    let bi = bdev.info();
    let shift = bi.block_size.trailing_zeros() as u8;
    let mut attrs = attr::VOLATILE_CACHE | attr::FUA;
    if bdev.read_only() {
        attrs |= attr::READ_ONLY;
    }
    let mut p = Params {
        len: std::mem::size_of::<Params>() as u32,
        types: param_type::BASIC,
        basic: ParamBasic {
            attrs,
            logical_bs_shift: shift,
            physical_bs_shift: shift,
            io_opt_shift: shift,
            io_min_shift: shift,
            max_sectors: max_io_buf_bytes >> 9,
            chunk_sectors: 0,
            dev_sectors: bi.size_bytes() >> 9,
            virt_boundary_mask: 0,
        },
        ..Default::default()
    };
    // 1 GiB per discard or write-zeroes request: bdevs split nothing themselves.
    let max = (1u32 << 30) >> 9;
    if bi.io_types.unmap || bi.io_types.write_zeroes {
        p.types |= param_type::DISCARD;
        p.discard = ParamDiscard {
            discard_alignment: 0,
            discard_granularity: bi.block_size,
            max_discard_sectors: if bi.io_types.unmap { max } else { 0 },
            max_write_zeroes_sectors: if bi.io_types.write_zeroes { max } else { 0 },
            max_discard_segments: 1,
            reserved0: 0,
        };
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn features_are_asked_for_only_when_offered_and_a_required_one_missing_is_refused() {
        use feature::*;
        // Debian's 6.12, as the guest test found it.
        let k612 = URING_CMD_COMP_IN_TASK
            | NEED_GET_DATA
            | USER_RECOVERY
            | USER_RECOVERY_REISSUE
            | UNPRIVILEGED_DEV
            | CMD_IOCTL_ENCODE
            | USER_COPY
            | ZONED;
        let f = wanted_flags(Some(k612), Encoding::Ioctl, None).unwrap();
        assert_eq!(f, CMD_IOCTL_ENCODE | USER_RECOVERY | USER_RECOVERY_REISSUE);
        assert_eq!(wanted_flags(Some(k612), Encoding::Ioctl, Some(false)).unwrap(), CMD_IOCTL_ENCODE);
        // 6.16's resize is used where offered.
        let f = wanted_flags(Some(k612 | UPDATE_SIZE), Encoding::Ioctl, None).unwrap();
        assert_eq!(f & UPDATE_SIZE, UPDATE_SIZE);
        // A kernel without recovery: not asked for by default, refused by name when required.
        let bare = CMD_IOCTL_ENCODE;
        assert_eq!(wanted_flags(Some(bare), Encoding::Ioctl, None).unwrap(), CMD_IOCTL_ENCODE);
        let e = wanted_flags(Some(bare), Encoding::Ioctl, Some(true)).unwrap_err().to_string();
        assert_eq!(e, "the kernel's ublk driver lacks user_recovery (it offers: cmd_ioctl_encode)");
        // Before 6.5 (no GET_FEATURES): legacy numbers, recovery only when asked for.
        assert_eq!(wanted_flags(None, Encoding::Legacy, None).unwrap(), 0);
        assert_eq!(wanted_flags(None, Encoding::Legacy, Some(true)).unwrap(), USER_RECOVERY);
    }

    #[test]
    fn queue_count_and_depth_are_bounded() {
        assert!(check_geometry(1, 128).is_ok());
        assert!(check_geometry(32, 4096).is_ok());
        let e = check_geometry(0, 128).unwrap_err().to_string();
        assert_eq!(e, "num_queues: 0 is not between 1 and 32");
        assert!(check_geometry(33, 128).unwrap_err().to_string().starts_with("num_queues"));
        assert!(check_geometry(1, 0).unwrap_err().to_string().starts_with("queue_depth"));
        assert_eq!(
            check_geometry(1, 4097).unwrap_err().to_string(),
            "queue_depth: 4097 is not between 1 and 4096"
        );
    }

    #[test]
    fn parameters_follow_the_bdev() {
        let bdev: Bdev = Arc::new(fp_bdev::RamDevice::new("r", 4096, 256).unwrap());
        let p = params_for(&bdev, IO_BUF_BYTES);
        assert_eq!(p.basic.logical_bs_shift, 12);
        assert_eq!(p.basic.dev_sectors, 256 * 8);
        assert_eq!(p.basic.max_sectors, 1024);
        assert_eq!(p.basic.attrs & attr::VOLATILE_CACHE, attr::VOLATILE_CACHE);
        assert_eq!(p.basic.attrs & attr::READ_ONLY, 0);
        assert_eq!(p.len, 112);
    }

    #[test]
    fn a_missing_control_device_is_named_in_one_line() {
        let dir = std::env::temp_dir().join(format!("fp-ublk-none-{}", std::process::id()));
        let path = dir.join("ublk-control");
        let e = Control::open(&path, Duration::from_secs(1)).err().expect("no such device").to_string();
        assert!(e.contains(&path.display().to_string()), "{e}");
        assert!(e.contains("ublk_drv"), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }
}
