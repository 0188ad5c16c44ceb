//! The built-in bdev modules, one folder each: the device in `mod.rs`, its JSON-RPC methods and
//! their parameter decoding in `rpc.rs`. `fp_registry::modules` registers them.

pub mod delay;
pub mod error;
pub mod malloc;
pub mod null;
pub mod uring;
