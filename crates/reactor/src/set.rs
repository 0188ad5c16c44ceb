//! [`ReactorSet`]: the process's reactors, one pinned thread each.

use std::io;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::cpus::pin_to_core;
use crate::reactor::{Reactor, ReactorConfig, ReactorHandle, DEFAULT_SHUTDOWN_BOUND};

/// The running reactors of a process, one thread each, pinned.
pub struct ReactorSet {
    handles: Vec<ReactorHandle>,
    threads: Vec<JoinHandle<()>>,
}

impl ReactorSet {
    /// Starts one reactor per listed core. Fails if a core cannot be used.
    pub fn start(cores: &[usize], config: ReactorConfig) -> io::Result<ReactorSet> {
        let mut handles = Vec::new();
        let mut threads = Vec::new();
        for (id, &core) in cores.iter().enumerate() {
            let (tx, rx) = std::sync::mpsc::channel();
            let thread = std::thread::Builder::new().name(format!("reactor_{core}")).spawn(move || {
                let setup = pin_to_core(core).and_then(|_| Reactor::new(id, Some(core), config));
                match setup {
                    Ok(mut reactor) => {
                        let _ = tx.send(Ok(reactor.handle()));
                        // A reactor that died would leave every queue and channel on its core
                        // silently unserved while the process looks healthy. Fail fast instead:
                        // a supervisor restarts the daemon, and vhost-user frontends reconnect
                        // and have their in-flight requests resubmitted.
                        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            reactor.run();
                            // Pollers may own memory a backend still writes: wait for it.
                            let bound = reactor.shutdown_bound();
                            reactor.drain_held(bound);
                        }));
                        if run.is_err() {
                            log::error!("reactor on cpu {core} panicked: aborting the process");
                            std::process::abort();
                        }
                        // Drop pollers (and their queues) on this thread, where they live.
                        while let Some(slot) = reactor.pollers.pop() {
                            reactor.unwatch(&slot.fds);
                        }
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e));
                    }
                }
            })?;
            let handle = rx
                .recv()
                .map_err(|_| io::Error::other("reactor thread died during start-up"))?
                .map_err(|e| io::Error::new(e.kind(), format!("reactor on cpu {core}: {e}")))?;
            handles.push(handle);
            threads.push(thread);
        }
        Ok(ReactorSet { handles, threads })
    }

    /// One handle per reactor, in the order of the cores given to [`ReactorSet::start`].
    pub fn handles(&self) -> &[ReactorHandle] {
        &self.handles
    }

    /// [`ReactorSet::shutdown_within`] the [`DEFAULT_SHUTDOWN_BOUND`].
    pub fn shutdown(self) {
        self.shutdown_within(DEFAULT_SHUTDOWN_BOUND);
    }

    /// Stops every reactor after its current round; each then keeps polling, up to `bound`,
    /// while its pollers have requests a backend holds ([`crate::Poller::held_by_backend`]),
    /// logs what is left at the bound, drops its pollers and ends. Joins the threads: this
    /// returns within about `bound` of the last round.
    pub fn shutdown_within(mut self, bound: Duration) {
        self.stop_all(bound);
    }

    fn stop_all(&mut self, bound: Duration) {
        for h in &self.handles {
            h.send(move |r| r.request_shutdown(bound));
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for ReactorSet {
    fn drop(&mut self) {
        self.stop_all(DEFAULT_SHUTDOWN_BOUND);
    }
}
