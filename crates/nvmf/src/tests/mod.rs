//! The target end to end inside the crate: a small NVMe/TCP host written here (`host`) against
//! a target with RAM disks on real reactors.

mod api;
mod buffers;
mod busy;
mod host;
mod hostile;
mod io;
