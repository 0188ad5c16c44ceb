//! The rbd module: SPDK's `bdev_rbd_register_cluster`, `bdev_rbd_unregister_cluster`,
//! `bdev_rbd_get_clusters_info`, `bdev_rbd_create`, `bdev_rbd_delete` and `bdev_rbd_resize`,
//! with SPDK's parameters.
//!
//! Connecting and opening block the control plane's RPC thread (up to
//! `client_mount_timeout`, 10 s by default), never a reactor. A registered cluster is one
//! librados client shared by every bdev naming it; a bdev without `cluster_name` has its own.

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};

use fp_bdev::module::{
    delete_method, resize_method, BdevModule, ConfigTable, ModuleError, ModuleHost, ModuleMethodFn, NewBdev,
    U32_MAX,
};
use fp_bdev::{BdevInfo, BlockDevice};
use fp_rpc::{Neutral, ParamError, Params};
use serde_json::{json, Map, Value};

use crate::device::MODULE;
use crate::{Cluster, ClusterConfig, RbdDetail, RbdDevice, RbdError};

/// SPDK's default block size for `bdev_rbd_create`.
const DEFAULT_BLOCK_SIZE: u64 = 512;

/// The rbd module.
pub struct RbdModule;

/// The module's state in one registry: the registered clusters by name, and the bdevs made
/// (to close their images at shutdown).
#[derive(Default)]
struct State {
    clusters: Mutex<BTreeMap<String, Arc<Cluster>>>,
    bdevs: Mutex<Vec<Weak<RbdDevice>>>,
}

fn state(host: &dyn ModuleHost) -> Arc<dyn Any + Send + Sync> {
    host.module_state(MODULE, &|| Arc::new(State::default()))
}

fn with_clusters<R>(host: &dyn ModuleHost, f: impl FnOnce(&mut BTreeMap<String, Arc<Cluster>>) -> R) -> R {
    let state = state(host);
    let state = state.downcast_ref::<State>().expect("the rbd module's state");
    let mut map = state.clusters.lock().unwrap_or_else(|p| p.into_inner());
    f(&mut map)
}

fn with_bdevs<R>(host: &dyn ModuleHost, f: impl FnOnce(&mut Vec<Weak<RbdDevice>>) -> R) -> R {
    let state = state(host);
    let state = state.downcast_ref::<State>().expect("the rbd module's state");
    let mut list = state.bdevs.lock().unwrap_or_else(|p| p.into_inner());
    f(&mut list)
}

/// Invalid and not-found parameters become the JSON-RPC "invalid params" error naming the
/// field; the rest (a cluster that does not answer, librbd missing) keep their own errno.
fn rbd_error(e: RbdError) -> ModuleError {
    match e {
        RbdError::Invalid { field, reason } | RbdError::NotFound { field, reason } => {
            ParamError::new(field, reason).into()
        }
        // The JSON-RPC code stays EIO (`RbdError::errno` is what the data path reports).
        other => ModuleError::module(-libc::EIO, other),
    }
}

/// The module's configuration file tables ([`BdevModule::config_tables`]).
const CONFIG_TABLES: &[ConfigTable] = &[ConfigTable::array("rbd_cluster", "bdev_rbd_register_cluster")];

impl BdevModule for RbdModule {
    fn name(&self) -> &'static str {
        MODULE
    }

    /// Each `[[rbd_cluster]]`: `bdev_rbd_register_cluster`, before the bdevs that name it.
    fn config_tables(&self) -> &'static [ConfigTable] {
        CONFIG_TABLES
    }

    fn methods(&self) -> &'static [(&'static str, ModuleMethodFn)] {
        &[
            ("bdev_rbd_register_cluster", register_cluster),
            ("bdev_rbd_unregister_cluster", unregister_cluster),
            ("bdev_rbd_get_clusters_info", get_clusters_info),
            ("bdev_rbd_create", create),
            ("bdev_rbd_delete", |h, p| delete_method(h, p, MODULE)),
            ("bdev_rbd_resize", |h, p| resize_method(h, p, MODULE, "rbd bdev")),
        ]
    }

    fn driver_specific(&self, _info: &BdevInfo, device: &(dyn Any + Send + Sync)) -> Map<String, Value> {
        let Some(dev) = device.downcast_ref::<RbdDevice>() else {
            return Map::new();
        };
        let d = &dev.detail;
        let mut m = Map::new();
        m.insert("pool_name".into(), json!(d.pool_name));
        m.insert("rbd_name".into(), json!(d.rbd_name));
        if let Some(c) = &d.cluster_name {
            m.insert("cluster_name".into(), json!(c));
        }
        if let Some(u) = &d.user_id {
            m.insert("user_id".into(), json!(u));
        }
        if d.cluster_name.is_none() {
            m.insert("config".into(), str_map(&dev.cluster().config.config_param));
        }
        m.insert("read_only".into(), json!(d.read_only));
        m
    }

    /// Deletes the rbd bdevs (the exports on them are gone by now), which closes their
    /// images: a clean stop releases each image's exclusive lock and header watch at once,
    /// so the next daemon opening the image does not wait for them to time out. Then drops
    /// the shared connections.
    fn shutdown(&self, host: &dyn ModuleHost) {
        let names: Vec<String> = with_bdevs(host, std::mem::take)
            .iter()
            .filter_map(Weak::upgrade)
            .map(|d| d.info().name.clone())
            .collect();
        for name in names {
            if let Err(e) = host.delete_bdev(&name, MODULE) {
                log::warn!("rbd bdev {name}: not closed at shutdown: {e}");
            }
        }
        with_clusters(host, |map| map.clear());
    }
}

fn str_map(pairs: &[(String, String)]) -> Value {
    Value::Object(pairs.iter().map(|(k, v)| (k.clone(), Value::from(v.as_str()))).collect())
}

/// `bdev_rbd_register_cluster`: connects and keeps the connection under `name`.
fn register_cluster(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let name = p.required_str("name")?;
    let user_id = p.optional_str("user_id")?;
    let config_param = p.optional_str_map("config_param")?.unwrap_or_default();
    let config_file = p.optional_str("config_file")?;
    let key_file = p.optional_str("key_file")?;
    let core_mask = p.optional_str("core_mask")?;
    p.finish()?;
    let core_mask = core_mask
        .map(|m| fp_reactor::parse_cpumask(&m).map(|cores| (m, cores)))
        .transpose()
        .map_err(|e| ParamError::new("core_mask", e))?;
    let config =
        ClusterConfig { name: name.clone(), user_id, config_param, config_file, key_file, core_mask };
    if name.is_empty() || name.contains(|c: char| c.is_control()) {
        return Err(ParamError::new("name", "must be a non-empty name without control characters").into());
    }
    let taken = |map: &mut BTreeMap<String, Arc<Cluster>>| map.contains_key(&name);
    if with_clusters(host, taken) {
        return Err(ParamError::new("name", format!("cluster '{name}' is already registered")).into());
    }
    // Connect without holding the list: a silent monitor takes client_mount_timeout.
    let cluster = Cluster::connect(config).map_err(rbd_error)?;
    with_clusters(host, |map| {
        if map.contains_key(&name) {
            return Err(ParamError::new("name", format!("cluster '{name}' is already registered")).into());
        }
        map.insert(name.clone(), cluster);
        Ok(Value::from(name.as_str()))
    })
}

/// `bdev_rbd_unregister_cluster`: refused while a bdev uses the cluster.
fn unregister_cluster(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let name = p.required_str("name")?;
    p.finish()?;
    with_clusters(host, |map| {
        let Some(cluster) = map.get(&name) else {
            return Err(ParamError::new("name", format!("no registered cluster '{name}'")).into());
        };
        // The list holds one count; each image on it one more.
        let users = Arc::strong_count(cluster) - 1;
        if users > 0 {
            return Err(ParamError::new(
                "name",
                format!("cluster '{name}' is used by {users} rbd bdev(s); delete them first"),
            )
            .into());
        }
        map.remove(&name);
        Ok(Value::Bool(true))
    })
}

fn cluster_info(c: &ClusterConfig) -> Value {
    let mut m = Map::new();
    m.insert("cluster_name".into(), json!(c.name));
    if let Some(u) = &c.user_id {
        m.insert("user_id".into(), json!(u));
    }
    if !c.config_param.is_empty() {
        m.insert("config_param".into(), str_map(&c.config_param));
    }
    if let Some(f) = &c.config_file {
        m.insert("config_file".into(), json!(f));
    }
    if let Some(f) = &c.key_file {
        m.insert("key_file".into(), json!(f));
    }
    if let Some((mask, _)) = &c.core_mask {
        m.insert("core_mask".into(), json!(mask));
    }
    Value::Object(m)
}

/// `bdev_rbd_get_clusters_info`: one cluster's registration (`name`), or all of them.
fn get_clusters_info(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let name = p.optional_str("name")?;
    p.finish()?;
    with_clusters(host, |map| match name {
        Some(name) => map
            .get(&name)
            .map(|c| cluster_info(&c.config))
            .ok_or_else(|| ParamError::new("name", format!("no registered cluster '{name}'")).into()),
        None => Ok(Value::Array(map.values().map(|c| cluster_info(&c.config)).collect())),
    })
}

/// `bdev_rbd_create`: opens the image and adds the bdev; returns its name.
fn create(host: &dyn ModuleHost, mut p: Params) -> Result<Value, ModuleError> {
    let name = p.optional_str("name")?;
    let pool_name = p.required_str("pool_name")?;
    let rbd_name = p.required_str("rbd_name")?;
    let block_size = p.optional_uint("block_size", U32_MAX)?.unwrap_or(DEFAULT_BLOCK_SIZE) as u32;
    let user_id = p.optional_str("user_id")?;
    let config = p.optional_str_map("config")?;
    let cluster_name = p.optional_str("cluster_name")?;
    let read_only = p.optional_bool("read_only")?.unwrap_or(false);
    p.spdk_only(&[("uuid", Neutral::Absent)])?;
    p.finish()?;
    let name = match name {
        Some(n) => n,
        None => (0..).map(|i| format!("Ceph{i}")).find(|n| !host.bdev_exists(n)).expect("a free name"),
    };
    host.check_new_bdev(&name)?;
    let cluster = match &cluster_name {
        Some(c) => {
            if user_id.is_some() || config.is_some() {
                let field = if user_id.is_some() { "user_id" } else { "config" };
                return Err(ParamError::new(
                    field,
                    "give either cluster_name (a registered cluster) or user_id/config (the bdev's own connection)",
                )
                .into());
            }
            with_clusters(host, |map| map.get(c).cloned())
                .ok_or_else(|| ParamError::new("cluster_name", format!("no registered cluster '{c}'")))?
        }
        None => Cluster::connect(ClusterConfig {
            name: String::new(),
            user_id: user_id.clone(),
            config_param: config.unwrap_or_default(),
            config_file: None,
            key_file: None,
            core_mask: None,
        })
        .map_err(rbd_error)?,
    };
    let image = cluster.open_image(&pool_name, &rbd_name, read_only).map_err(rbd_error)?;
    let detail = RbdDetail { pool_name, rbd_name, cluster_name, user_id, read_only };
    let dev = Arc::new(RbdDevice::new(&name, block_size, image, detail)?);
    let weak = Arc::downgrade(&dev);
    let name = host.add_bdev(MODULE, NewBdev::new(dev))?;
    with_bdevs(host, |list| {
        list.retain(|w| w.strong_count() > 0);
        list.push(weak);
    });
    Ok(Value::from(name))
}
