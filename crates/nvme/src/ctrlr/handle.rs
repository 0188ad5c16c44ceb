//! The controller as its users see it: [`attach`] brings one up on its own thread and returns
//! a [`Controller`], type-erased over the transport (the module keeps a list of them; only
//! channels are generic, where it matters).

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::bdev::NvmeNamespace;
use crate::transport::{QueueStats, Transport};
use crate::NvmeError;

use super::identify::ControllerData;
use super::info::{ControllerInfo, ControllerPath};
use super::namespaces::{lock_ns, NamespaceEvent, NsMap};
use super::options::{ControllerOptions, GlobalOptions};
use super::shared::*;
use super::worker::Worker;

/// An attached controller.
pub trait Controller: Send + Sync {
    /// Its name (`bdev_nvme_attach_controller`'s `name`).
    fn name(&self) -> &str;

    /// Its namespaces with bdevs now.
    fn namespaces(&self) -> Vec<Arc<NvmeNamespace>>;

    /// Its identity as a path of its namespaces (unique in the process; multipath).
    fn path_id(&self) -> u64;

    /// `bdev_nvme_get_controllers`' entry.
    fn info(&self) -> ControllerInfo;

    /// Identify Controller as last read.
    fn controller_data(&self) -> ControllerData;

    /// The I/O queues' counters summed over every channel, open or closed.
    fn stats(&self) -> QueueStats;

    /// Resets the controller and waits for the outcome (`bdev_nvme_reset_controller`). I/O in
    /// flight is resubmitted after it, not failed.
    fn reset(&self) -> Result<(), NvmeError>;

    /// Replaces the DH-HMAC-CHAP keys (`bdev_nvme_set_keys`; none clears a key) and, with a
    /// host key, authenticates the controller again: the admin queue in band, then every I/O
    /// queue by connecting it anew (its I/O resubmitted, not failed). Waits for the admin
    /// queue's outcome; a failure resets the controller, whose reconnects use the new keys.
    fn set_keys(
        &self,
        key: Option<fp_crypto::dhchap::DhchapSecret>,
        ctrlr_key: Option<fp_crypto::dhchap::DhchapSecret>,
    ) -> Result<(), NvmeError>;

    /// Shuts the controller down and stops its thread. Channels still open fail their I/O;
    /// the caller deletes the namespaces' bdevs first. Idempotent.
    fn detach(&self);
}

/// Attaches the controller `transport` reaches: connects its admin queue, brings it up and
/// finds its namespaces, on a new thread that then serves it. `events` hears of namespace
/// changes after this returns (the initial namespaces are [`Controller::namespaces`]).
pub fn attach<T: Transport>(
    transport: T,
    opts: ControllerOptions,
    global: GlobalOptions,
    events: Box<dyn Fn(NamespaceEvent) + Send + Sync>,
) -> Result<Arc<dyn Controller>, NvmeError> {
    opts.validate()?;
    let (tx, rx) = mpsc::channel();
    let shared = Arc::new(Shared::new(transport, opts, global, tx));
    let namespaces: NsMap = Arc::default();
    let mut worker = Worker::new(shared.clone(), rx, namespaces.clone(), events);
    let (ready_tx, ready_rx) = mpsc::sync_channel(1);
    let name = shared.opts.name.clone();
    let thread = std::thread::Builder::new()
        .name(format!("nvme-{name}"))
        .spawn(move || {
            let r = worker.attach();
            let ok = r.is_ok();
            let _ = ready_tx.send(r);
            if ok {
                worker.run();
            }
        })
        .map_err(|e| NvmeError::io("starting the controller thread", e))?;
    let r =
        ready_rx.recv().unwrap_or_else(|_| Err(NvmeError::Gone(format!("controller {name}'s thread died"))));
    if let Err(e) = r {
        let _ = thread.join();
        return Err(e);
    }
    log::info!("nvme {name}: attached ({} namespaces)", lock_ns(&namespaces).len());
    Ok(Arc::new(Handle { shared, namespaces, thread: Mutex::new(Some(thread)) }))
}

/// The [`Controller`] of one transport.
struct Handle<T: Transport> {
    shared: Arc<Shared<T>>,
    namespaces: NsMap,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl<T: Transport> Controller for Handle<T> {
    fn name(&self) -> &str {
        &self.shared.opts.name
    }

    fn namespaces(&self) -> Vec<Arc<NvmeNamespace>> {
        lock_ns(&self.namespaces).values().cloned().collect()
    }

    fn path_id(&self) -> u64 {
        self.shared.path_id
    }

    fn info(&self) -> ControllerInfo {
        let st = self.shared.state();
        let state = if st & ST_DELETING != 0 {
            "deleting"
        } else if st & ST_FAILED != 0 {
            "failed"
        } else if st & ST_ENABLED != 0 {
            "enabled"
        } else if self.shared.snapshot().last_error.is_some() {
            "reconnect_is_delayed"
        } else {
            "resetting"
        };
        let s = self.shared.snapshot().clone();
        let path = ControllerPath {
            state,
            trid: self.shared.transport.trid(),
            cntlid: s.cntlid,
            host: self.shared.transport.host(),
            generation: generation(st),
            resets: s.resets,
            reconnect_attempts: s.reconnect_attempts,
            aborts: s.aborts,
            async_events: s.async_events,
            io_queues: s.io_queues,
            max_io_queues: s.max_io_queues,
            io_queue_depth: s.io_queue_depth,
            max_transfer: s.max_transfer,
            namespaces: lock_ns(&self.namespaces).keys().copied().collect(),
            stats: self.shared.stats(),
            last_error: s.last_error,
        };
        ControllerInfo { name: self.shared.opts.name.clone(), ctrlrs: vec![path] }
    }

    fn controller_data(&self) -> ControllerData {
        self.shared.snapshot().cdata.clone()
    }

    fn stats(&self) -> QueueStats {
        self.shared.stats()
    }

    fn reset(&self) -> Result<(), NvmeError> {
        let (tx, rx) = mpsc::sync_channel(1);
        if !self.shared.send(Msg::Reset { state: None, reply: Some(tx) }) {
            return Err(NvmeError::Gone(format!("controller {} is detached", self.shared.opts.name)));
        }
        rx.recv().unwrap_or_else(|_| {
            Err(NvmeError::Gone(format!("controller {} is detached", self.shared.opts.name)))
        })
    }

    fn set_keys(
        &self,
        key: Option<fp_crypto::dhchap::DhchapSecret>,
        ctrlr_key: Option<fp_crypto::dhchap::DhchapSecret>,
    ) -> Result<(), NvmeError> {
        let detached = || NvmeError::Gone(format!("controller {} is detached", self.shared.opts.name));
        let (reply, rx) = mpsc::sync_channel(1);
        if !self.shared.send(Msg::SetKeys { key, ctrlr_key, reply }) {
            return Err(detached());
        }
        rx.recv().unwrap_or_else(|_| Err(detached()))
    }

    fn detach(&self) {
        let Some(thread) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() else { return };
        let (tx, rx) = mpsc::sync_channel(1);
        if self.shared.send(Msg::Detach { reply: tx }) {
            let _ = rx.recv();
        }
        let _ = thread.join();
        log::info!("nvme {}: detached", self.shared.opts.name);
    }
}

impl<T: Transport> Drop for Handle<T> {
    fn drop(&mut self) {
        self.detach();
    }
}
