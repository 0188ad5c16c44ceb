//! What the bdev modules call ([`ModuleHost`]): the registry's bdev map, its claims, its limits
//! and its export directories, and the dispatch of the modules' JSON-RPC methods.

use std::any::Any;
use std::path::Path;
use std::sync::{Arc, Weak};

use fp_bdev::module::{
    BackgroundJob, BackgroundPoll, BackgroundStart, FileOpener, ModuleError, ModuleHost, NewBdev,
};
use fp_bdev::{Bdev, BdevError, ClaimType};
use fp_rpc::Params;
use serde_json::Value;

use crate::bdevs::{check_malloc_size, holders};
use crate::state::BdevEntry;
use crate::{export_dirs, modules, Claim, ExportDirs, Registry, RegistryError};

impl Registry {
    /// Runs the module method `method` (`bdev_malloc_create`, ...); `None` when no module has
    /// it.
    pub fn call_module(&self, method: &str, params: Option<Value>) -> Option<Result<Value, RegistryError>> {
        let (_, f) = modules::MODULES.iter().flat_map(|m| m.methods()).find(|(name, _)| *name == method)?;
        Some(Params::new(params).map_err(RegistryError::from).and_then(|p| Ok(f(self, p)?)))
    }

    /// The modules' method names.
    pub fn module_methods(&self) -> impl Iterator<Item = &'static str> {
        modules::MODULES.iter().flat_map(|m| m.methods()).map(|(name, _)| *name)
    }
}

/// The registry's errors travel through a module's method boxed, and come back out here.
impl From<ModuleError> for RegistryError {
    fn from(e: ModuleError) -> RegistryError {
        match e {
            ModuleError::Param(p) => RegistryError::Param(p),
            ModuleError::Bdev(b) => RegistryError::Bdev(b),
            ModuleError::Host(h) => match h.downcast::<RegistryError>() {
                Ok(e) => *e,
                // Only the registry makes host errors; anything else is reported as an I/O error.
                Err(other) => RegistryError::Module { errno: -libc::EIO, source: other },
            },
            ModuleError::Module { errno, source } => RegistryError::Module { errno, source },
        }
    }
}

/// A module's background job on its reactor.
struct BackgroundPoller(Box<dyn BackgroundJob>);

impl fp_reactor::Poller for BackgroundPoller {
    fn poll(&mut self) -> fp_reactor::PollStatus {
        match self.0.poll() {
            BackgroundPoll::Busy => fp_reactor::PollStatus::Busy,
            BackgroundPoll::Idle => fp_reactor::PollStatus::Idle,
            BackgroundPoll::Finished => fp_reactor::PollStatus::Finished,
        }
    }

    fn has_pending(&self) -> bool {
        self.0.has_pending()
    }
}

fn host(e: RegistryError) -> ModuleError {
    ModuleError::Host(Box::new(e))
}

impl ModuleHost for Registry {
    fn state_dir(&self) -> Option<std::path::PathBuf> {
        self.options.state_dir.clone()
    }

    fn shutdown_deadline(&self) -> Option<std::time::Instant> {
        *self.shutdown_deadline.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn check_new_bdev(&self, name: &str) -> Result<(), ModuleError> {
        let st = self.lock();
        if st.name_taken(name) {
            return Err(host(RegistryError::AlreadyExists { kind: "bdev", name: name.into() }));
        }
        st.room_for_bdev(name, &self.options.limits).map_err(host)
    }

    fn add_bdev(&self, module: &'static str, new: NewBdev) -> Result<String, ModuleError> {
        let name = new.bdev.info().name.clone();
        let mut st = self.lock();
        for n in std::iter::once(&name).chain(&new.aliases) {
            if st.name_taken(n) {
                return Err(host(RegistryError::AlreadyExists { kind: "bdev", name: n.clone() }));
            }
        }
        st.room_for_bdev(&name, &self.options.limits).map_err(host)?;
        for (base, claim_type) in &new.claims {
            let entry = st
                .entry(base)
                .ok_or_else(|| host(RegistryError::NotFound { kind: "bdev", name: base.clone() }))?;
            entry.check_claim(base, *claim_type).map_err(host)?;
        }
        for (base, claim_type) in &new.claims {
            if let Some(entry) = st.entry_mut(base) {
                entry.claims.push(Claim {
                    holder: name.clone(),
                    holder_kind: "bdev",
                    claim_type: *claim_type,
                });
            }
        }
        log::info!("bdev '{name}' created ({module}, {} bytes)", new.bdev.info().size_bytes());
        let bases =
            new.claims.into_iter().filter_map(|(base, _)| st.canonical(&base).map(String::from)).collect();
        let disk = fp_bdev::Disk::new(new.bdev.clone(), self.options.iostat);
        // Before anything can open it: its persistent bitmaps mark from its first write on.
        self.load_dirty_bitmaps(&name, &disk);
        for alias in &new.aliases {
            st.aliases.insert(alias.clone(), name.clone());
        }
        let aliases = new.aliases.clone();
        let entry = BdevEntry {
            bdev: new.bdev,
            disk,
            module,
            device: new.device,
            claims: Vec::new(),
            bases,
            aliases: new.aliases,
        };
        st.bdevs.insert(name.clone(), entry);
        drop(st);
        // Outside the lock: a module that finds its metadata on the new bdev adds bdevs of its
        // own (an lvstore's volumes). Unless auto-examine is off (crate::examine).
        if self.examine_gate().examines(&name, aliases.iter()) {
            for m in modules::MODULES {
                m.examine(self, &name, module);
            }
        }
        Ok(name)
    }

    fn claimable(&self, name: &str, claim_type: ClaimType) -> Result<Bdev, ModuleError> {
        let st = self.lock();
        let entry = st
            .entry(name)
            .ok_or_else(|| host(RegistryError::NotFound { kind: "bdev", name: name.into() }))?;
        entry.check_claim(name, claim_type).map_err(host)?;
        // Through the disk, so the base's statistics count what a stacked bdev sends it.
        Ok(Arc::new(entry.disk.clone()))
    }

    fn bdev_exists(&self, name: &str) -> bool {
        self.lock().name_taken(name)
    }

    fn bdev_name(&self, name: &str) -> Option<String> {
        self.lock().canonical(name).map(String::from)
    }

    fn set_aliases(&self, name: &str, aliases: Vec<String>) -> Result<(), ModuleError> {
        let mut st = self.lock();
        let name = st
            .canonical(name)
            .ok_or_else(|| host(RegistryError::NotFound { kind: "bdev", name: name.into() }))?
            .to_string();
        for a in &aliases {
            if st.canonical(a).is_some_and(|owner| owner != name) || *a == name {
                return Err(host(RegistryError::AlreadyExists { kind: "bdev", name: a.clone() }));
            }
        }
        let entry = st.bdevs.get_mut(&name).expect("canonical names exist");
        let old = std::mem::replace(&mut entry.aliases, aliases.clone());
        for a in old {
            st.aliases.remove(&a);
        }
        for a in aliases {
            st.aliases.insert(a, name.clone());
        }
        Ok(())
    }

    fn bdev(&self, name: &str) -> Option<(Bdev, &'static str)> {
        let st = self.lock();
        st.entry(name).map(|e| (Arc::new(e.disk.clone()) as Bdev, e.module))
    }

    fn claim(
        &self,
        name: &str,
        holder_kind: &'static str,
        holder: &str,
        claim_type: ClaimType,
    ) -> Result<Bdev, ModuleError> {
        let mut st = self.lock();
        let entry = st
            .entry_mut(name)
            .ok_or_else(|| host(RegistryError::NotFound { kind: "bdev", name: name.into() }))?;
        entry.check_claim(name, claim_type).map_err(host)?;
        entry.claims.push(Claim { holder: holder.into(), holder_kind, claim_type });
        Ok(Arc::new(entry.disk.clone()))
    }

    fn release_claim(&self, name: &str, holder_kind: &'static str, holder: &str) {
        self.lock().release(name, holder_kind, holder);
    }

    fn module_state(
        &self,
        module: &'static str,
        init: &dyn Fn() -> Arc<dyn Any + Send + Sync>,
    ) -> Arc<dyn Any + Send + Sync> {
        let mut states = self.module_states.lock().unwrap_or_else(|p| p.into_inner());
        states.entry(module).or_insert_with(init).clone()
    }

    fn module_device(
        &self,
        name: &str,
        module: &'static str,
        kind: &'static str,
    ) -> Result<Arc<dyn Any + Send + Sync>, ModuleError> {
        let st = self.lock();
        match st.entry(name) {
            Some(e) if e.module == module => Ok(e.device.clone()),
            _ => Err(host(RegistryError::NotFound { kind, name: name.into() })),
        }
    }

    fn delete_bdev(&self, name: &str, module: &'static str) -> Result<(), ModuleError> {
        Registry::delete_bdev(self, name, Some(module)).map_err(host)
    }

    fn block_size(&self, name: &str) -> Result<u32, ModuleError> {
        let st = self.lock();
        st.entry(name)
            .map(|e| e.bdev.info().block_size)
            .ok_or_else(|| host(RegistryError::NotFound { kind: "bdev", name: name.into() }))
    }

    fn resize_bdev(&self, name: &str, module: &'static str, num_blocks: u64) -> Result<(), ModuleError> {
        let st = self.lock();
        let entry = match st.entry(name) {
            Some(e) if e.module == module => e,
            _ => return Err(host(RegistryError::NotFound { kind: "bdev", name: name.into() })),
        };
        let from = entry.bdev.info().num_blocks();
        if num_blocks < from {
            // A fleece's base is not claimed (its export writes it), but its view keeps the old
            // size: shrinking would cut the point in time.
            let fleece = || entry.disk.fleece_name().map(|f| format!("fleece {f}"));
            if let Some(by) = holders(&entry.claims).or_else(fleece) {
                return Err(host(RegistryError::ShrinkInUse { name: name.into(), by, from, to: num_blocks }));
            }
        }
        // Stacked bdevs may change size with this one (a delay bdev shares its base's): tell the
        // holders of every bdev whose size changed.
        let before: Vec<u64> = st.bdevs.values().map(|e| e.bdev.info().num_blocks()).collect();
        entry.bdev.resize(num_blocks)?;
        let mut resized = Vec::new();
        for ((bdev, e), was) in st.bdevs.iter().zip(before) {
            let info = e.bdev.info();
            if info.num_blocks() == was {
                continue;
            }
            log::info!("bdev '{bdev}' resized from {was} to {} blocks", info.num_blocks());
            for export in st.exports.values().filter(|x| st.canonical(&x.bdev) == Some(bdev)) {
                export.export.resized(info.size_bytes());
            }
            resized.push((e.disk.clone(), info.num_blocks()));
        }
        // The disks' subscribers, outside the registry's lock (a callback may call back in).
        drop(st);
        for (disk, num_blocks) in resized {
            disk.notify(&fp_bdev::DiskEvent::Resized { num_blocks });
        }
        Ok(())
    }

    fn memory_limit(&self) -> u64 {
        self.options.limits.max_malloc_bytes
    }

    fn check_memory_size(&self, name: &str, block_size: u32, num_blocks: u64) -> Result<(), ModuleError> {
        check_malloc_size(name, block_size, num_blocks, &self.options.limits).map_err(host)
    }

    fn start_background(&self, start: BackgroundStart) -> bool {
        let Some(reactor) = self.reactors.last().cloned() else { return false };
        reactor.send(move |r| {
            r.add_poller(Box::new(BackgroundPoller(start())));
        });
        true
    }

    fn weak_handle(&self) -> Option<Weak<dyn ModuleHost + Send + Sync>> {
        let me: Weak<dyn ModuleHost + Send + Sync> = self.me.clone();
        Some(me)
    }

    fn file_opener(&self, filename: &Path) -> Result<FileOpener, ModuleError> {
        match &self.options.export_dirs {
            None => {
                let path = filename.to_path_buf();
                Ok(Box::new(move |direct| fp_bdev::uring::open_file(&path, direct)))
            }
            Some(exports) => exported_opener(exports, filename).map_err(host),
        }
    }
}

/// Opens `filename`, which must lead inside `exports` (see the `export_dirs` module).
fn exported_opener(exports: &ExportDirs, filename: &Path) -> Result<FileOpener, RegistryError> {
    let beneath = exports.locate(filename).map_err(|refusal| match refusal {
        export_dirs::Refusal::Outside => RegistryError::NotAllowed {
            field: "filename",
            reason: format!("'{}' is outside the allowed export directories", filename.display()),
        },
        export_dirs::Refusal::Unresolved(source) => {
            RegistryError::Bdev(BdevError::Open { path: filename.display().to_string(), source })
        }
    })?;
    // The device opens the file twice (buffered and O_DIRECT); both opens must reach the same
    // file, or a swap inside the export directory between them would split the disk in two.
    let first = std::cell::Cell::new(None);
    Ok(Box::new(move |direct: bool| {
        let file = beneath.open(direct)?;
        let id = export_dirs::file_id(&file)?;
        match first.get() {
            None => first.set(Some(id)),
            Some(seen) if seen != id => {
                return Err(std::io::Error::other("it was replaced by another file while being opened"))
            }
            Some(_) => {}
        }
        Ok(file)
    }))
}
