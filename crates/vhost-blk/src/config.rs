//! [`ControllerConfig`]: what starting one export takes. Plain data below the controller and
//! its shared state, which both build from it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use fp_bdev::Bdev;
use fp_reactor::ReactorHandle;

use crate::HandOff;

pub struct ControllerConfig {
    pub name: String,
    pub socket_path: PathBuf,
    pub bdev: Bdev,
    pub reactors: Vec<ReactorHandle>,
    pub read_only: bool,
    pub num_queues: u16,
    /// Shared with the controller this one takes the disk over from in a migration (a new
    /// gate otherwise): see [`HandOff`].
    pub handoff: Arc<HandOff>,
    /// How long stopping a queue may take ([`crate::DEFAULT_STOP_TIMEOUT`] unless the operator
    /// says otherwise; docs/architecture.md, "Stopping a queue").
    pub stop_timeout: Duration,
}
