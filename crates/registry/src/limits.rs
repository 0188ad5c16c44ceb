//! How much the control plane lets its clients create.
//!
//! Every RPC caller can ask for bdevs and controllers, and each costs the daemon something that
//! does not grow back on its own: a controller is a thread, a listening socket and, once a
//! frontend connects, descriptors for every queue and memory region; a uring bdev holds two
//! file descriptors and an io_uring per reactor it is used on; a RAM bdev reserves address space
//! that fills with real memory as a guest writes. The limits below turn "until the process runs
//! out of threads, descriptors or memory" into a refusal with a clear error.

/// The bounds the registry enforces. `[limits]` in the configuration file sets them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Most bdevs at once, of every type (stacked delay bdevs included).
    pub max_bdevs: usize,
    /// Most exports of each kind at once: vhost-user-blk controllers, and as many NBD exports
    /// (`limits.max_exports`, formerly `max_controllers`).
    pub max_exports: usize,
    /// Largest single RAM (malloc) bdev, in bytes.
    pub max_malloc_bytes: u64,
}

/// Default for [`Limits::max_bdevs`].
///
/// Bdevs are cheap while unexported (a uring bdev is two descriptors, a null or RAM bdev none),
/// so this is a backstop against a runaway or hostile client rather than a sizing decision:
/// four times the controller default leaves room for stacked bdevs and spares behind every
/// controller. It is finite so that the registry, which `bdev_get_bdevs` serialises whole, stays
/// small.
pub const DEFAULT_MAX_BDEVS: usize = 1024;

/// Default for [`Limits::max_exports`].
///
/// Each vhost-user-blk controller owns a thread and, when its frontend connects, two eventfds
/// per queue plus one descriptor per memory region (up to 64 queues and 64 regions). 256 is more disks than
/// the VMs of one host attach in practice, while keeping the worst case in the low thousands of
/// threads and descriptors instead of whatever the process limits happen to be.
pub const DEFAULT_MAX_EXPORTS: usize = 256;

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_bdevs: DEFAULT_MAX_BDEVS,
            max_exports: DEFAULT_MAX_EXPORTS,
            max_malloc_bytes: default_max_malloc_bytes(),
        }
    }
}

/// Default for [`Limits::max_malloc_bytes`]: the machine's RAM.
///
/// A RAM bdev is mapped lazily, so its size costs nothing until a guest writes it; but a disk
/// larger than the machine can never be filled and only serves to let a guest drive the host
/// into the OOM killer. Whether the kernel refuses such a mapping depends on its overcommit
/// policy, so the registry refuses it itself. The sum over several RAM bdevs is not capped:
/// thin provisioning several smaller ones is a legitimate use.
pub fn default_max_malloc_bytes() -> u64 {
    total_ram().unwrap_or(u64::MAX)
}

/// Total RAM as `sysinfo(2)` reports it (the host's, also inside a memory-limited cgroup).
pub fn total_ram() -> Option<u64> {
    fp_sys::total_ram().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn total_ram_is_plausible() {
        let ram = total_ram().expect("sysinfo");
        assert!(ram >= 64 << 20, "{ram} bytes");
        assert_eq!(Limits::default().max_malloc_bytes, ram);
    }
}
