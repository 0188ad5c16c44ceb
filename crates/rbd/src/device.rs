//! The rbd bdev: an open image as a [`BlockDevice`].

use std::sync::Arc;

use fp_bdev::{validate_geometry, BdevError, BdevInfo, BlockDevice, Capacity, IoChannel, IoTypes};

use crate::channel::RbdChannel;
use crate::image::Image;
use crate::RbdError;

/// The module's name: its bdevs' `driver`, the `type` of its `[[bdev]]` tables.
pub const MODULE: &str = "rbd";

/// What `bdev_get_bdevs` reports of an rbd bdev.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RbdDetail {
    pub pool_name: String,
    pub rbd_name: String,
    /// The registered cluster it uses, if any (else its own connection).
    pub cluster_name: Option<String>,
    pub user_id: Option<String>,
    pub read_only: bool,
}

/// An rbd bdev.
pub struct RbdDevice {
    info: BdevInfo,
    image: Arc<Image>,
    pub detail: RbdDetail,
}

impl RbdDevice {
    /// A bdev over `image`, its size the image's rounded down to whole blocks.
    pub fn new(name: &str, block_size: u32, image: Image, detail: RbdDetail) -> Result<RbdDevice, BdevError> {
        let size = image.size().map_err(|e| BdevError::Unsupported(e.to_string()))?;
        let num_blocks = size / u64::from(block_size.max(1));
        validate_geometry(name, block_size, num_blocks).map_err(|e| match e {
            BdevError::InvalidParam { field: "num_blocks", .. } => BdevError::InvalidParam {
                field: "rbd_name",
                reason: format!("the image's {size} bytes hold no whole block of {block_size} bytes"),
            },
            other => other,
        })?;
        let writable = !detail.read_only;
        let info = BdevInfo {
            name: name.to_string(),
            product_name: "Ceph Rbd Disk".into(),
            block_size,
            capacity: Capacity::new(num_blocks),
            io_types: IoTypes {
                read: true,
                write: writable,
                flush: true,
                unmap: writable,
                write_zeroes: writable,
            },
            driver: MODULE,
            driver_specific: Some(("rbd_name".into(), format!("{}/{}", detail.pool_name, detail.rbd_name))),
        };
        Ok(RbdDevice { info, image: Arc::new(image), detail })
    }

    /// The image's size in bytes now (it may have been resized by another client).
    pub fn image_size(&self) -> Result<u64, RbdError> {
        self.image.size()
    }

    /// The cluster connection the image uses.
    pub fn cluster(&self) -> &Arc<crate::Cluster> {
        &self.image.cluster
    }
}

impl BlockDevice for RbdDevice {
    fn info(&self) -> &BdevInfo {
        &self.info
    }

    fn open_channel(&self) -> Result<Box<dyn IoChannel>, BdevError> {
        Ok(Box::new(RbdChannel::new(self.info.clone(), self.image.clone(), self.detail.read_only)?))
    }

    /// Resizes the image first, then the bdev: a guest never sees blocks the image lacks.
    fn resize(&self, num_blocks: u64) -> Result<(), BdevError> {
        validate_geometry(&self.info.name, self.info.block_size, num_blocks)?;
        if self.detail.read_only {
            return Err(BdevError::Unsupported(format!("rbd bdev {} is read-only", self.info.name)));
        }
        self.image
            .resize(num_blocks * u64::from(self.info.block_size))
            .map_err(|e| BdevError::Unsupported(e.to_string()))?;
        self.info.capacity.set(num_blocks);
        Ok(())
    }

    // `block_status` keeps the trait's default (all data): the image's allocation is known only
    // through `rbd_diff_iterate2`, a round trip to the OSDs, and the call runs on a reactor.
}
