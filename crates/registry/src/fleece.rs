//! The registry's fleeces (`fp_bdev::fleece`): a read-only bdev presenting a base as it was
//! when `bdev_fleece_create` returned, its old contents copied to a target before the guest
//! changes them. The fleece bdev claims its target `exclusive_write` (so a target in use is
//! refused, and the target cannot be deleted under it); its base is not claimed (the guest's
//! export keeps writing it) but cannot be deleted while the fleece is attached
//! (`Registry::delete_bdev` asks the disk). A fleece bdev that is claimed (exported) cannot be
//! deleted, as any stacked bdev. docs/backup.md, "Point-in-time view (fleecing)".

use std::sync::Arc;
use std::time::{Duration, Instant};

use fp_bdev::disk::FleeceAttachError;
use fp_bdev::fleece::{check_granularity, FleeceDevice, FleeceShared, DEFAULT_FLEECE_GRANULARITY};
use fp_bdev::{ClaimType, Disk, ModuleHost, NewBdev};

use crate::bdevs::holders;
use crate::state::Claim;
use crate::{Registry, RegistryError};

/// The module name fleece bdevs are registered under (`driver`).
pub(crate) const FLEECE_MODULE: &str = "fleece";

/// How long create and delete wait for every channel of the base to take the change up. A
/// channel acknowledges at its next poll, once what it had in flight from before is done: a
/// live reactor does so within microseconds; an idle one is woken.
pub const FLEECE_ATTACH_WAIT: Duration = Duration::from_secs(30);

/// What `bdev_fleece_create` asks for.
#[derive(Debug, Clone)]
pub struct FleeceSpec {
    pub name: String,
    pub base_bdev: String,
    pub target_bdev: String,
    pub granularity: Option<u64>,
}

fn invalid(field: &'static str, reason: String) -> RegistryError {
    RegistryError::Invalid { field, reason }
}

impl Registry {
    /// `bdev_fleece_create`: returns once every channel of the base copies before it writes;
    /// the new bdev shows the base as it was then.
    pub fn fleece_create(&self, spec: FleeceSpec) -> Result<String, RegistryError> {
        let (shared, base_disk) = {
            let mut st = self.lock();
            if spec.name.is_empty() {
                return Err(invalid("name", "must not be empty".into()));
            }
            if st.name_taken(&spec.name) {
                return Err(invalid("name", format!("bdev '{}' already exists", spec.name)));
            }
            let base_name = st
                .canonical(&spec.base_bdev)
                .ok_or_else(|| invalid("base_bdev", format!("bdev '{}' does not exist", spec.base_bdev)))?
                .to_string();
            let target_name = st
                .canonical(&spec.target_bdev)
                .ok_or_else(|| invalid("target_bdev", format!("bdev '{}' does not exist", spec.target_bdev)))?
                .to_string();
            if base_name == target_name {
                return Err(invalid("target_bdev", format!("'{}' is the base itself", spec.target_bdev)));
            }
            let base = &st.bdevs[&base_name];
            let target = &st.bdevs[&target_name];
            let (b, t) = (base.bdev.info(), target.bdev.info());
            if t.size_bytes() < b.size_bytes() {
                return Err(invalid(
                    "target_bdev",
                    format!(
                        "'{target_name}' has {} bytes, fewer than the {} of '{base_name}'",
                        t.size_bytes(),
                        b.size_bytes()
                    ),
                ));
            }
            if b.size_bytes() == 0 {
                return Err(invalid("base_bdev", format!("'{base_name}' is empty")));
            }
            if let Some(by) = holders(&target.claims) {
                return Err(invalid("target_bdev", format!("'{target_name}' is in use by '{by}'")));
            }
            if let Some(f) = base.disk.fleece_name() {
                return Err(invalid("base_bdev", format!("'{base_name}' already has a fleece, '{f}'")));
            }
            if let Some(job) = base.disk.mirror_job() {
                return Err(invalid(
                    "base_bdev",
                    format!("'{base_name}' is the source of mirror job '{job}' (both would hook its writes)"),
                ));
            }
            if base.module == FLEECE_MODULE {
                return Err(invalid("base_bdev", format!("'{base_name}' is a fleece itself (read-only)")));
            }
            let granularity = spec.granularity.unwrap_or(DEFAULT_FLEECE_GRANULARITY);
            let block = b.block_size.max(t.block_size);
            check_granularity(granularity, block).map_err(|e| invalid("granularity", e))?;
            let shared = Arc::new(FleeceShared::new(
                &spec.name,
                &base_name,
                base.disk.bdev().clone(),
                &target_name,
                Arc::new(target.disk.clone()),
                granularity,
            ));
            let base_disk = base.disk.clone();
            // Claimed now, under the same lock as the checks: copies may write the target as
            // soon as the channels attach, before the fleece bdev exists.
            if let Some(t) = st.bdevs.get_mut(&target_name) {
                t.claims.push(Claim {
                    holder: spec.name.clone(),
                    holder_kind: "bdev",
                    claim_type: ClaimType::ExclusiveWrite,
                });
            }
            (shared, base_disk)
        };
        let release_target = |shared: &FleeceShared| {
            self.lock().release(&shared.target_name, "bdev", &shared.name);
        };
        let epoch = base_disk.attach_fleece(&shared).map_err(|e| match e {
            FleeceAttachError::AccountingOff(_) => {
                RegistryError::NotAllowed { field: "base_bdev", reason: e.to_string() }
            }
            _ => invalid("base_bdev", e.to_string()),
        })?;
        if let Err(e) = self.wait_channels(&base_disk, epoch) {
            let epoch = base_disk.detach_fleece(&shared);
            // Released only once the channels let go (their copies write the target).
            if self.wait_channels(&base_disk, epoch).is_ok() {
                release_target(&shared);
            }
            shared.end();
            return Err(e);
        }
        let dev = Arc::new(FleeceDevice::new(shared.clone()));
        // The target's claim is the one taken above: `fleece_delete` releases it.
        let added = ModuleHost::add_bdev(self, FLEECE_MODULE, NewBdev::new(dev));
        match added {
            Ok(name) => {
                log::info!(
                    "fleece '{name}': '{}' as it is now, old contents copied to '{}' ({} bytes a chunk)",
                    shared.base_name,
                    shared.target_name,
                    shared.granularity
                );
                Ok(name)
            }
            Err(e) => {
                // The name was taken meanwhile: let go of the base again.
                let epoch = base_disk.detach_fleece(&shared);
                if self.wait_channels(&base_disk, epoch).is_ok() {
                    release_target(&shared);
                }
                shared.end();
                Err(invalid("name", e.to_string()))
            }
        }
    }

    /// `bdev_fleece_delete`: the base's writes stop copying, then the bdev goes and the target
    /// is released. Refused while the fleece bdev is claimed (exported).
    pub fn fleece_delete(&self, name: &str) -> Result<(), RegistryError> {
        let (shared, base_disk) = {
            let st = self.lock();
            let e = st
                .entry(name)
                .filter(|e| e.module == FLEECE_MODULE)
                .ok_or_else(|| RegistryError::NotFound { kind: "fleece", name: name.into() })?;
            if let Some(by) = holders(&e.claims) {
                return Err(RegistryError::InUse { name: name.into(), by });
            }
            let dev = e
                .device
                .clone()
                .downcast::<FleeceDevice>()
                .map_err(|_| RegistryError::NotFound { kind: "fleece", name: name.into() })?;
            let shared = dev.shared().clone();
            let base = st.entry(&shared.base_name).map(|b| b.disk.clone());
            (shared, base)
        };
        shared.end();
        if let Some(disk) = &base_disk {
            let epoch = disk.detach_fleece(&shared);
            self.wait_channels(disk, epoch)?;
        }
        self.delete_bdev(name, Some(FLEECE_MODULE))?;
        self.lock().release(&shared.target_name, "bdev", &shared.name);
        log::info!(
            "fleece '{name}' of '{}' deleted ({} chunks copied)",
            shared.base_name,
            shared.copied_chunks()
        );
        Ok(())
    }

    /// Waits (bounded) until every live channel of `disk` acknowledged hook epoch `epoch`,
    /// waking the reactors so that idle channels look.
    fn wait_channels(&self, disk: &Disk, epoch: u64) -> Result<(), RegistryError> {
        let deadline = Instant::now() + FLEECE_ATTACH_WAIT;
        let mut wake_at = Instant::now();
        loop {
            if disk.fleece_acked(epoch) {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(RegistryError::NotNow(format!(
                    "the channels of '{}' did not take the fleece up within {} s",
                    disk.bdev().info().name,
                    FLEECE_ATTACH_WAIT.as_secs()
                )));
            }
            if now >= wake_at {
                for h in &self.reactors {
                    h.send(|r| r.unpark_all());
                }
                wake_at = now + Duration::from_millis(50);
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// The fleece attached to bdev `name` as its base, if any (deletion refuses it).
    pub(crate) fn fleece_on(st: &crate::state::State, name: &str) -> Option<String> {
        st.bdevs.get(name).and_then(|e| e.disk.fleece_name())
    }
}
