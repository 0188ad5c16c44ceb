//! The hand-off rule for two controllers on one disk during a live migration.
//!
//! When source and destination VM are served by one daemon (docs/migration.md, case "same
//! daemon"), the destination controller is created beside the source's with `migrate_from` and
//! the two share one [`HandOff`]. QEMU stops the source's rings (GET_VRING_BASE, which drains
//! them) before the destination VM starts its own, so at any moment at most one of the two
//! controllers has running queues: that controller alone writes the disk. The gate enforces it:
//! a queue may start only while no queue of the *other* controller runs; a start that breaks the
//! rule is refused with a message naming the controller that holds the disk. When the source
//! resumes after a failed migration, the destination never started and the source takes the
//! disk back the same way.
//!
//! A running queue holds its controller's share of the gate as a [`HandOffHold`], released
//! when the queue no longer touches the disk: when its stop ends, or, for a queue still
//! waiting past its stop's bound for requests the bdev holds, when the last of them completes.

use std::sync::{Arc, Mutex};

/// Who may run queues on a disk shared for a migration. One per controller, shared with its
/// `migrate_from` partner.
#[derive(Debug, Default)]
pub struct HandOff {
    holder: Mutex<Option<Holder>>,
}

#[derive(Debug)]
struct Holder {
    controller: Arc<str>,
    running: usize,
}

impl HandOff {
    /// A gate for a controller that shares its disk with nobody yet.
    pub fn new() -> Arc<HandOff> {
        Arc::new(HandOff::default())
    }

    /// Takes the disk for one more running queue of `controller`; `Err` names the controller
    /// whose queues run.
    pub fn start_queue(&self, controller: &Arc<str>) -> Result<(), Arc<str>> {
        let mut h = self.holder.lock().unwrap_or_else(|p| p.into_inner());
        match h.as_mut() {
            Some(held) if held.controller == *controller => held.running += 1,
            Some(held) => return Err(held.controller.clone()),
            None => *h = Some(Holder { controller: controller.clone(), running: 1 }),
        }
        Ok(())
    }

    /// [`HandOff::start_queue`], released when the returned hold is dropped.
    pub fn hold(gate: &Arc<HandOff>, controller: &Arc<str>) -> Result<HandOffHold, Arc<str>> {
        gate.start_queue(controller)?;
        Ok(HandOffHold { gate: gate.clone(), controller: controller.clone() })
    }

    /// One queue of `controller` stopped; the disk is free once none runs.
    pub fn stop_queue(&self, controller: &Arc<str>) {
        let mut h = self.holder.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(held) = h.as_mut() {
            if held.controller == *controller {
                held.running = held.running.saturating_sub(1);
                if held.running == 0 {
                    *h = None;
                }
            }
        }
    }
}

/// One running queue's share of a [`HandOff`]; dropping it stops the queue on the gate.
#[derive(Debug)]
pub struct HandOffHold {
    gate: Arc<HandOff>,
    controller: Arc<str>,
}

impl Drop for HandOffHold {
    fn drop(&mut self) {
        self.gate.stop_queue(&self.controller);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_one_controller_runs_queues_at_a_time() {
        let gate = HandOff::new();
        let (src, dst): (Arc<str>, Arc<str>) = ("src".into(), "dst".into());
        gate.start_queue(&src).unwrap();
        gate.start_queue(&src).unwrap();
        assert_eq!(gate.start_queue(&dst).unwrap_err(), src, "the source runs two queues");
        gate.stop_queue(&src);
        assert!(gate.start_queue(&dst).is_err(), "one source queue still runs");
        gate.stop_queue(&dst); // not the holder: changes nothing
        gate.stop_queue(&src);
        gate.start_queue(&dst).unwrap();
        assert_eq!(gate.start_queue(&src).unwrap_err(), dst, "the destination holds the disk now");
        gate.stop_queue(&dst);
        gate.start_queue(&src).unwrap();
    }

    #[test]
    fn a_hold_releases_its_share_when_dropped() {
        let gate = HandOff::new();
        let (src, dst): (Arc<str>, Arc<str>) = ("src".into(), "dst".into());
        let first = HandOff::hold(&gate, &src).unwrap();
        let second = HandOff::hold(&gate, &src).unwrap();
        assert_eq!(HandOff::hold(&gate, &dst).unwrap_err(), src);
        drop(first);
        assert!(HandOff::hold(&gate, &dst).is_err(), "one source queue still holds the disk");
        drop(second);
        let _dst = HandOff::hold(&gate, &dst).unwrap();
    }
}
