//! Signals taken synchronously: a set of signals blocked in every thread and collected with
//! `sigwait(2)`, so no handler ever runs on a reactor thread.

use std::io;

use crate::fs::cvt;

/// A set of signals (`sigset_t`).
#[derive(Clone, Copy)]
pub struct SignalSet(libc::sigset_t);

impl std::fmt::Debug for SignalSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SignalSet")
    }
}

impl SignalSet {
    /// The set of `signals` (`SIGTERM`, ...). An invalid signal number is `EINVAL`.
    pub fn new(signals: &[libc::c_int]) -> io::Result<SignalSet> {
        // SAFETY: sigset_t is plain data (all zeroes is a valid value), which sigemptyset then
        // initialises properly; sigaddset adds to that initialised, writable set and checks
        // `sig` itself.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for &sig in signals {
                cvt(libc::sigaddset(&mut set, sig))?;
            }
            Ok(SignalSet(set))
        }
    }

    /// Blocks the set's signals in the calling thread, and so in every thread it starts
    /// afterwards: they stay pending until [`SignalSet::wait`] collects them.
    pub fn block(&self) -> io::Result<()> {
        self.mask(libc::SIG_BLOCK)
    }

    /// Unblocks the set's signals in the calling thread.
    pub fn unblock(&self) -> io::Result<()> {
        self.mask(libc::SIG_UNBLOCK)
    }

    fn mask(&self, how: libc::c_int) -> io::Result<()> {
        // SAFETY: the set is initialised; a null old-set pointer is allowed.
        let rc = unsafe { libc::pthread_sigmask(how, &self.0, std::ptr::null_mut()) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok(())
    }

    /// Waits for one of the set's signals, which must be blocked (see [`SignalSet::block`]),
    /// and returns it.
    pub fn wait(&self) -> io::Result<libc::c_int> {
        let mut sig: libc::c_int = 0;
        loop {
            // SAFETY: the set is initialised; `sig` is writable.
            match unsafe { libc::sigwait(&self.0, &mut sig) } {
                0 => return Ok(sig),
                libc::EINTR => continue,
                e => return Err(io::Error::from_raw_os_error(e)),
            }
        }
    }
}

/// Sends `sig` to the calling thread (`raise(3)`).
pub fn raise(sig: libc::c_int) -> io::Result<()> {
    // SAFETY: raise takes plain values; what the signal does is the disposition's business.
    cvt(unsafe { libc::raise(sig) }).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blocked_signal_raised_is_collected_by_wait() {
        // On a thread of its own: the mask is per thread, and SIGUSR1 unblocked would kill the
        // test process.
        std::thread::spawn(|| {
            let set = SignalSet::new(&[libc::SIGUSR1]).unwrap();
            set.block().unwrap();
            raise(libc::SIGUSR1).unwrap();
            assert_eq!(set.wait().unwrap(), libc::SIGUSR1);
            set.unblock().unwrap();
        })
        .join()
        .unwrap();
    }

    #[test]
    fn an_invalid_signal_is_refused() {
        assert_eq!(SignalSet::new(&[-1]).unwrap_err().raw_os_error(), Some(libc::EINVAL));
    }
}
