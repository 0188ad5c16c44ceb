//! The bdev_nvme module: SPDK's `bdev_nvme_attach_controller`, `bdev_nvme_detach_controller`,
//! `bdev_nvme_get_controllers`, `bdev_nvme_reset_controller` and `bdev_nvme_set_options`, with
//! SPDK's parameters (docs/nvme.md).
//!
//! * [`params`]: the methods' parameters, decoded and checked before anything is connected.

pub mod params;

pub use params::{
    Address, AddressFamily, AttachParams, OnTimeout, Options, OptionsParams, Reconnect, Trtype,
};
