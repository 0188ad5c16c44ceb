//! CPU affinity of the calling thread: pinning reactors, client threads and librados' threads,
//! and finding where `taskset` lets the process run.

use std::io;

use crate::fs::cvt;

/// How many CPUs a `cpu_set_t` can name: the limit on any CPU number given to [`pin_thread`].
pub const CPU_SETSIZE: usize = libc::CPU_SETSIZE as usize;

/// A `cpu_set_t` as the kernel reads it: a bitmap in words, CPU `c` bit `c % BITS` of word
/// `c / BITS` (glibc's `CPU_SET` layout), so no macro is needed to fill or read it.
type CpuMask = [libc::c_ulong; CPU_SETSIZE / libc::c_ulong::BITS as usize];

const WORD_BITS: usize = libc::c_ulong::BITS as usize;

/// Restricts the calling thread to `cores`; threads it creates afterwards inherit that.
///
/// A core at or beyond [`CPU_SETSIZE`] is refused with [`io::ErrorKind::InvalidInput`]; a core
/// the process may not use (outside its cgroup or `taskset` mask, or offline) is refused by the
/// kernel (`EINVAL`).
pub fn pin_thread(cores: &[usize]) -> io::Result<()> {
    let mut set: CpuMask = [0; CPU_SETSIZE / WORD_BITS];
    for &core in cores {
        if core >= CPU_SETSIZE {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("cpu {core} is out of range")));
        }
        set[core / WORD_BITS] |= 1 << (core % WORD_BITS);
    }
    // SAFETY: pid 0 is the calling thread; the kernel reads the size passed, all of `set` (a
    // cpu_set_t's size and alignment: an array of the same words).
    cvt(unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), set.as_ptr().cast()) }).map(drop)
}

/// The CPUs the calling thread may run on, in ascending order.
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    let mut set: CpuMask = [0; CPU_SETSIZE / WORD_BITS];
    // SAFETY: pid 0 is the calling thread; the kernel writes at most the size passed, all of
    // `set` (a cpu_set_t's size and alignment), and any bits are valid words.
    cvt(unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), set.as_mut_ptr().cast()) })?;
    Ok((0..CPU_SETSIZE).filter(|&c| set[c / WORD_BITS] & (1 << (c % WORD_BITS)) != 0).collect())
}

/// The CPU the calling thread is running on now (`sched_getcpu`), `None` if the kernel cannot
/// say. A hint: the thread may move right after.
pub fn current_cpu() -> Option<usize> {
    // SAFETY: sched_getcpu takes nothing and returns a number or -1.
    let cpu = unsafe { libc::sched_getcpu() };
    usize::try_from(cpu).ok()
}

/// The lowest-numbered CPU the calling thread may run on (what `taskset` allows).
pub fn first_allowed_cpu() -> io::Result<usize> {
    allowed_cpus()?.first().copied().ok_or_else(|| io::Error::other("the affinity mask is empty"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_current_cpu_is_one_the_thread_may_run_on() {
        let cpu = std::thread::spawn(|| {
            let allowed = first_allowed_cpu().unwrap();
            pin_thread(&[allowed]).unwrap();
            (allowed, current_cpu())
        })
        .join()
        .unwrap();
        assert_eq!(cpu.1, Some(cpu.0), "a thread pinned to one CPU runs on it");
    }

    #[test]
    fn pinning_to_an_allowed_cpu_reads_back() {
        let cpu = first_allowed_cpu().unwrap();
        // On a thread of its own, so the test harness's thread keeps its mask.
        let after = std::thread::spawn(move || {
            pin_thread(&[cpu]).unwrap();
            allowed_cpus().unwrap()
        })
        .join()
        .unwrap();
        assert_eq!(after, [cpu]);
    }

    #[test]
    fn a_cpu_beyond_the_set_is_refused() {
        let e = pin_thread(&[CPU_SETSIZE]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }
}
