//! What `nbd_start_disk`'s parameters become ([`NbdSpec`]): below the kind and its methods.

use fp_nbd::TlsFiles;

/// What to build for `nbd_start_disk`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NbdSpec {
    pub bdev_name: String,
    /// A socket path or an NBD URI ([`fp_nbd::parse_device`]).
    pub nbd_device: String,
    /// Read-only: the bdev is claimed shared, so read-only vhost controllers and other
    /// read-only exports may serve it too.
    pub readonly: bool,
    pub tls: Option<TlsFiles>,
    /// The dirty bitmaps offered as `qemu:dirty-bitmap:NAME` contexts (flashpath's `bitmaps`).
    pub bitmaps: Vec<BitmapRef>,
}

/// One entry of `bitmaps`: a bitmap of the exported bdev (`bdev` None), or of another bdev of
/// the same size (a point-in-time bdev of disk X exports X's bitmaps).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BitmapRef {
    pub bdev: Option<String>,
    pub name: String,
}
