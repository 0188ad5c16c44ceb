//! Cluster connections and open images: the control-plane side of librados and librbd.
//!
//! Every call here blocks (it talks to monitors and OSDs) and runs on the control plane,
//! never on a reactor. A [`Cluster`] is one librados client; a registered cluster is shared
//! by all the bdevs naming it, which hold it by `Arc`, so its connection lives until the last
//! of them is deleted.

use std::ffi::{c_char, CString};
use std::sync::Arc;

use crate::sys::{self, ImageT, IoCtxT, Lib, RadosT};
use crate::RbdError;

/// flashpath's defaults for Ceph options, applied unless the caller's `config_param` (or a
/// bdev's `config`) sets them; they override the configuration file (librados ranks values
/// set through its API above the file). Ceph's own defaults wait forever for an OSD and 300 s
/// for a monitor: a guest would hang instead of seeing an I/O error. `rbd_cache` is off, as
/// in QEMU with `cache.direct=on`: a write is acknowledged when the OSDs have it, the guest
/// keeps its own cache, and flush has nothing to lose.
pub const DEFAULT_OPTIONS: [(&str, &str); 4] = [
    ("rados_osd_op_timeout", "30"),
    ("rados_mon_op_timeout", "30"),
    ("client_mount_timeout", "10"),
    ("rbd_cache", "false"),
];

/// How to reach a cluster: SPDK's `bdev_rbd_register_cluster` parameters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterConfig {
    /// The registered name; empty for a bdev's own connection.
    pub name: String,
    /// The Ceph user without the `client.` prefix (librados' default: admin).
    pub user_id: Option<String>,
    /// Ceph options, in the order given.
    pub config_param: Vec<(String, String)>,
    pub config_file: Option<String>,
    pub key_file: Option<String>,
    /// SPDK's `core_mask` as given, and the cores it names: librados' and librbd's threads
    /// run there (they inherit it from the thread that connects and opens images).
    pub core_mask: Option<(String, Vec<usize>)>,
}

impl ClusterConfig {
    fn what(&self) -> String {
        if self.name.is_empty() {
            "the bdev's cluster".into()
        } else {
            format!("cluster '{}'", self.name)
        }
    }
}

/// A connected librados client.
pub struct Cluster {
    handle: RadosT,
    pub config: ClusterConfig,
    pub(crate) lib: &'static Lib,
}

fn cstring(field: &'static str, value: &str) -> Result<CString, RbdError> {
    CString::new(value).map_err(|_| RbdError::Invalid { field, reason: "contains a NUL byte".into() })
}

impl Cluster {
    /// Creates the client, configures it and connects (waits up to `client_mount_timeout`).
    /// Without `config_file` and `config_param`, librados reads its default files
    /// (/etc/ceph/ceph.conf), as SPDK does.
    pub fn connect(config: ClusterConfig) -> Result<Arc<Cluster>, RbdError> {
        let cores = config.core_mask.as_ref().map(|(_, cores)| cores.clone());
        on_cores(cores.as_deref(), move || Cluster::connect_here(config))?
    }

    fn connect_here(config: ClusterConfig) -> Result<Arc<Cluster>, RbdError> {
        let lib = sys::lib().map_err(|e| RbdError::Library(e.to_string()))?;
        let user = config.user_id.as_deref().map(|u| cstring("user_id", u)).transpose()?;
        let mut handle = RadosT::NULL;
        let user_ptr = user.as_ref().map_or(std::ptr::null(), |u| u.as_ptr());
        // SAFETY: `handle` is a valid out-pointer; `user_ptr` is null or a live C string.
        let ret = unsafe { (lib.rados_create)(&mut handle, user_ptr) };
        if ret < 0 {
            return Err(RbdError::Ceph {
                what: format!("cannot create a client for {}", config.what()),
                ret: ret.into(),
            });
        }
        // From here on, dropping `cluster` shuts the handle down.
        let cluster = Cluster { handle, config, lib };
        cluster.configure()?;
        // SAFETY: a configured, not yet connected handle.
        let ret = unsafe { (lib.rados_connect)(cluster.handle) };
        if ret < 0 {
            return Err(RbdError::Ceph {
                what: format!("cannot connect to {}", cluster.config.what()),
                ret: ret.into(),
            });
        }
        Ok(Arc::new(cluster))
    }

    fn configure(&self) -> Result<(), RbdError> {
        let c = &self.config;
        let set = |field: &'static str, key: &str, value: &str| -> Result<(), RbdError> {
            let (k, v) = (cstring(field, key)?, cstring(field, value)?);
            // SAFETY: an unconnected handle and two live C strings.
            let ret = unsafe { (self.lib.rados_conf_set)(self.handle, k.as_ptr(), v.as_ptr()) };
            if ret < 0 {
                return Err(RbdError::Invalid {
                    field,
                    reason: format!("Ceph refuses {key} = '{value}': {}", sys::errno_text(ret.into())),
                });
            }
            Ok(())
        };
        if c.config_file.is_some() || c.config_param.is_empty() {
            let path = c.config_file.as_deref().map(|p| cstring("config_file", p)).transpose()?;
            let ptr: *const c_char = path.as_ref().map_or(std::ptr::null(), |p| p.as_ptr());
            // SAFETY: an unconnected handle; `ptr` is null (the default search path) or a live
            // C string.
            let ret = unsafe { (self.lib.rados_conf_read_file)(self.handle, ptr) };
            if ret < 0 {
                return Err(RbdError::Invalid {
                    field: "config_file",
                    reason: format!(
                        "cannot read {}: {}",
                        c.config_file.as_deref().unwrap_or("the default Ceph configuration"),
                        sys::errno_text(ret.into())
                    ),
                });
            }
        }
        for (key, value) in DEFAULT_OPTIONS {
            if !c.config_param.iter().any(|(k, _)| k == key) {
                set("config_param", key, value)?;
            }
        }
        if let Some(key_file) = &c.key_file {
            set("key_file", "keyring", key_file)?;
        }
        for (key, value) in &c.config_param {
            set("config_param", key, value)?;
        }
        Ok(())
    }

    /// Opens image `rbd_name` in pool `pool_name` (librbd starts its threads for the
    /// cluster at the first open, so this runs on the cluster's cores too).
    pub fn open_image(
        self: &Arc<Self>,
        pool_name: &str,
        rbd_name: &str,
        read_only: bool,
    ) -> Result<Image, RbdError> {
        let cores = self.config.core_mask.as_ref().map(|(_, cores)| cores.as_slice());
        on_cores(cores, || self.open_image_here(pool_name, rbd_name, read_only))?
    }

    fn open_image_here(
        self: &Arc<Self>,
        pool_name: &str,
        rbd_name: &str,
        read_only: bool,
    ) -> Result<Image, RbdError> {
        let lib = self.lib;
        let pool = cstring("pool_name", pool_name)?;
        let mut ioctx = IoCtxT::NULL;
        // SAFETY: a connected handle, a live C string, a valid out-pointer.
        let ret = unsafe { (lib.rados_ioctx_create)(self.handle, pool.as_ptr(), &mut ioctx) };
        if ret < 0 {
            return Err(RbdError::NotFound {
                field: "pool_name",
                reason: format!("cannot open pool '{pool_name}': {}", sys::errno_text(ret.into())),
            });
        }
        let mut image = Image { handle: ImageT::NULL, ioctx, cluster: self.clone(), lib };
        let name = cstring("rbd_name", rbd_name)?;
        let open = if read_only { lib.rbd_open_read_only } else { lib.rbd_open };
        // SAFETY: an open ioctx, a live C string, a valid out-pointer, no snapshot.
        let ret = unsafe { open(ioctx, name.as_ptr(), &mut image.handle, std::ptr::null()) };
        if ret < 0 {
            image.handle = ImageT::NULL;
            return Err(RbdError::NotFound {
                field: "rbd_name",
                reason: format!(
                    "cannot open image '{rbd_name}' in pool '{pool_name}': {}",
                    sys::errno_text(ret.into())
                ),
            });
        }
        Ok(image)
    }
}

/// Runs `f` on a thread restricted to `cores` (so the threads librados and librbd create in
/// it inherit them), or right here without a mask.
fn on_cores<R: Send>(cores: Option<&[usize]>, f: impl FnOnce() -> R + Send) -> Result<R, RbdError> {
    let Some(cores) = cores else { return Ok(f()) };
    std::thread::scope(|s| {
        s.spawn(|| {
            fp_sys::pin_thread(cores).map_err(|e| RbdError::Invalid {
                field: "core_mask",
                reason: format!("cannot run on cores {cores:?}: {e}"),
            })?;
            Ok(f())
        })
        .join()
        .expect("the connecting thread does not panic")
    })
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // SAFETY: the handle came from rados_create and every pool and image on it is closed
        // (they hold this cluster by Arc).
        unsafe { (self.lib.rados_shutdown)(self.handle) };
    }
}

/// An open image (and its pool handle).
pub struct Image {
    pub(crate) handle: ImageT,
    ioctx: IoCtxT,
    /// Keeps the connection up while the image is open.
    pub cluster: Arc<Cluster>,
    pub(crate) lib: &'static Lib,
}

impl Image {
    /// The image's size in bytes.
    pub fn size(&self) -> Result<u64, RbdError> {
        let mut size = 0u64;
        // SAFETY: an open image and a valid out-pointer.
        let ret = unsafe { (self.lib.rbd_get_size)(self.handle, &mut size) };
        if ret < 0 {
            return Err(RbdError::Ceph { what: "cannot read the image's size".into(), ret: ret.into() });
        }
        Ok(size)
    }

    /// Resizes the image to `bytes` (blocks until the cluster has it).
    pub fn resize(&self, bytes: u64) -> Result<(), RbdError> {
        // SAFETY: an open image.
        let ret = unsafe { (self.lib.rbd_resize)(self.handle, bytes) };
        if ret < 0 {
            return Err(RbdError::Ceph {
                what: format!("cannot resize the image to {bytes} bytes"),
                ret: ret.into(),
            });
        }
        Ok(())
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        // SAFETY: `handle` (when set) is an open image with no request in flight (its channels
        // are gone: they hold it by Arc and wait for their requests); `ioctx` is open and only
        // this image uses it.
        unsafe {
            if !self.handle.is_null() {
                let ret = (self.lib.rbd_close)(self.handle);
                if ret < 0 {
                    log::warn!("rbd: closing an image: {}", sys::errno_text(ret.into()));
                }
            }
            (self.lib.rados_ioctx_destroy)(self.ioctx);
        }
    }
}
