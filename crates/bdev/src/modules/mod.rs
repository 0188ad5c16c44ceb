//! The built-in bdev modules, one folder each: the device and its RPC methods.

pub mod delay;
pub mod malloc;
pub mod null;
pub mod uring;
