//! A namespace as a block device: bdev `<controller>n<nsid>`, driver "nvme". Its channels are
//! [`super::channel::NvmeChannel`]s, one I/O queue pair each, generic over the transport; the
//! namespace reaches them through the controller's [`NamespaceBackend`], the one dynamic call
//! (at `open_channel`, not per I/O). A namespace reached through several controllers of one
//! subsystem (multipath) keeps every path in its [`PathSet`]; its channels are then
//! multipath channels (`bdev/multipath.rs`), one queue pair per path.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use fp_bdev::{BdevError, BdevInfo, BlockDevice, Capacity, IoChannel, IoTypes};
use serde_json::{json, Map, Value};

use crate::ctrlr::ana::{AnaState, AnaWord};
use crate::ctrlr::{ControllerData, NamespaceData};
use crate::transport::{QueueStats, TransportId};

use super::paths::{NamespaceBackend, NsParams, NsPath, PathSet};

/// One path of a namespace as `bdev_nvme_get_io_paths` shows it.
#[derive(Debug, Clone)]
pub struct PathInfo {
    /// The controller ID.
    pub cntlid: u16,
    /// The controller is enabled.
    pub enabled: bool,
    /// The namespace's ANA state through this controller (optimized for a controller that
    /// does not report ANA, as SPDK takes it).
    pub ana_state: AnaState,
    /// The controller reports ANA.
    pub ana_reporting: bool,
    /// I/O may go this way: enabled, and optimized or non-optimized (not being read again).
    pub accessible: bool,
    /// The transport ID.
    pub trid: TransportId,
}

/// One namespace of an attached controller, as a block device.
pub struct NvmeNamespace {
    info: BdevInfo,
    params: NsParams,
    /// The size the controller reports now (Identify Namespace's NSZE); the bdev's capacity
    /// follows through [`BlockDevice::resize`], which the registry calls when told.
    reported_blocks: AtomicU64,
    data: Mutex<NamespaceData>,
    /// Its paths: the controller that made it first; more when it is multipath.
    paths: Arc<PathSet>,
}

impl NvmeNamespace {
    /// Makes the bdev of namespace `nsid` described by `data` (usable: checked by the
    /// caller), on a controller whose transfer limit is `max_transfer` bytes; `enable_flush`
    /// is `bdev_nvme_set_options`' (SPDK's meaning: flush a volatile write cache or not).
    pub(crate) fn new(
        backend: Arc<dyn NamespaceBackend>,
        nsid: u32,
        data: NamespaceData,
        cdata: &ControllerData,
        max_transfer: u32,
        enable_flush: bool,
    ) -> NvmeNamespace {
        let cache = cdata.volatile_write_cache();
        let capacity = Capacity::new(data.nsze);
        let params = NsParams {
            nsid,
            block_size: data.block_size,
            capacity: capacity.clone(),
            max_transfer: max_transfer.max(data.block_size),
            volatile_cache: cache && enable_flush,
            dsm: cdata.dsm(),
            write_zeroes: cdata.write_zeroes(),
        };
        let info = BdevInfo {
            name: format!("{}n{nsid}", backend.controller_name()),
            product_name: "NVMe disk".into(),
            block_size: data.block_size,
            capacity,
            io_types: IoTypes {
                read: true,
                write: !data.write_protected,
                // Without a cache a flush is reported and completes at once (nothing to lose);
                // with one, it is reported only when it is done, so a frontend does not tell
                // its host that a flush made the data durable when it was not sent.
                flush: !cache || enable_flush,
                unmap: params.dsm && !data.write_protected,
                write_zeroes: params.write_zeroes && !data.write_protected,
            },
            driver: "nvme",
            driver_specific: None,
        };
        NvmeNamespace {
            info,
            params,
            reported_blocks: AtomicU64::new(data.nsze),
            data: Mutex::new(data),
            paths: Arc::new(PathSet::new(NsPath { id: backend.path_id(), backend })),
        }
    }

    /// The namespace ID.
    pub fn nsid(&self) -> u32 {
        self.params.nsid
    }

    /// The bdev name, `<controller>n<nsid>`.
    pub fn name(&self) -> &str {
        &self.info.name
    }

    /// The size in blocks the controller reports now (the bdev's own follows when the
    /// registry resizes it).
    pub fn reported_blocks(&self) -> u64 {
        self.reported_blocks.load(Ordering::Relaxed)
    }

    /// Identify Namespace as last read.
    pub fn data(&self) -> NamespaceData {
        *self.data.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The most bytes one command moves; larger requests are split.
    pub fn max_transfer(&self) -> u32 {
        self.params.max_transfer
    }

    /// The counters of the controller's channels summed (bounced requests, doorbells), over
    /// every path.
    pub fn stats(&self) -> QueueStats {
        self.paths
            .list()
            .iter()
            .fold(QueueStats::default(), |a, p| crate::ctrlr::shared::add_stats(a, p.backend.stats()))
    }

    /// Its paths.
    pub fn paths(&self) -> &Arc<PathSet> {
        &self.paths
    }

    /// What `bdev_nvme_get_io_paths` shows of `path`.
    pub fn path_info(&self, path: &NsPath) -> PathInfo {
        let (c, _) = path.backend.controller_data();
        let enabled = path.backend.state_word() & crate::ctrlr::shared::ST_ENABLED != 0;
        let ana = path.backend.ana(self.params.nsid);
        let word = ana.unwrap_or(AnaWord::OPTIMIZED);
        PathInfo {
            cntlid: c.cntlid,
            enabled,
            ana_state: word.state(),
            ana_reporting: ana.is_some(),
            accessible: enabled && word.accessible(),
            trid: path.backend.trid(),
        }
    }

    /// The path (controller) this namespace object came from: the first of its own set.
    pub(crate) fn own_path(&self) -> Option<NsPath> {
        self.paths.list().into_iter().next()
    }

    /// A new Identify Namespace; returns whether the size changed.
    pub(crate) fn update(&self, data: NamespaceData) -> bool {
        *self.data.lock().unwrap_or_else(|e| e.into_inner()) = data;
        self.reported_blocks.swap(data.nsze, Ordering::Relaxed) != data.nsze
    }

    /// `bdev_get_bdevs`' `driver_specific` (SPDK's shape: an `nvme` array of one entry per
    /// path, with the transport ID, the controller's data and the namespace's ID), plus the
    /// controller's queue counters.
    pub fn driver_specific(&self) -> Map<String, Value> {
        let entries = self.paths.list().iter().map(|p| self.path_entry(p)).collect();
        let mut m = Map::new();
        m.insert("nvme".into(), Value::Array(entries));
        m
    }

    /// One path's entry of [`NvmeNamespace::driver_specific`].
    fn path_entry(&self, path: &NsPath) -> Value {
        let backend = &path.backend;
        let (c, vs) = backend.controller_data();
        let s = backend.stats();
        let mut ns_data = json!({ "id": self.params.nsid, "can_share": self.paths.is_multipath() });
        // SPDK shows the state only for a controller that reports ANA.
        if let Some(word) = backend.ana(self.params.nsid) {
            ns_data["ana_state"] = json!(word.state().name());
        }
        json!({
            "trid": backend.trid(),
            "ctrlr_data": {
                "cntlid": c.cntlid,
                "vendor_id": format!("{:#06x}", c.vid),
                "model_number": c.mn,
                "serial_number": c.sn,
                "firmware_revision": c.fr,
                "subnqn": c.subnqn,
                "oacs": {
                    "security": (c.oacs & 1) != 0,
                    "format": (c.oacs & 2) != 0,
                    "firmware": (c.oacs & 4) != 0,
                    "ns_manage": (c.oacs & 8) != 0,
                },
                "multi_ctrlr": c.cmic & fp_nvme_spec::identify::CMIC_MULTI_CONTROLLER != 0,
                "ana_reporting": c.ana_reporting(),
            },
            "vs": { "nvme_version": format!("{}.{}", vs >> 16, (vs >> 8) & 0xff) },
            "ns_data": ns_data,
            "stats": s,
        })
    }
}

impl BlockDevice for NvmeNamespace {
    fn info(&self) -> &BdevInfo {
        &self.info
    }

    fn open_channel(&self) -> Result<Box<dyn IoChannel>, BdevError> {
        let first = self.paths.list().into_iter().next().ok_or_else(|| {
            BdevError::Unsupported(format!("{}: every path of the namespace was detached", self.info.name))
        })?;
        if self.paths.is_multipath() {
            first.backend.open_multipath(self.paths.clone(), &self.params)
        } else {
            first.backend.open_channel(&self.params)
        }
    }

    /// The size is the controller's: the registry calls this when the controller reported a
    /// new size ([`crate::ctrlr::NamespaceEvent::Resized`]); any other size is refused.
    fn resize(&self, num_blocks: u64) -> Result<(), BdevError> {
        let reported = self.reported_blocks();
        if num_blocks != reported {
            return Err(BdevError::Unsupported(format!(
                "an NVMe namespace has the size its controller reports ({reported} blocks)"
            )));
        }
        self.info.capacity.set(num_blocks);
        Ok(())
    }

    fn read_only(&self) -> bool {
        self.data().write_protected
    }
}

impl std::fmt::Debug for NvmeNamespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmeNamespace").field("name", &self.info.name).field("params", &self.params).finish()
    }
}
