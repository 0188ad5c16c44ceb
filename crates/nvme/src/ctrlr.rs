//! A controller's life: [`attach`] (Identify, queues, asynchronous events, keep-alive,
//! namespaces), then a thread per controller that owns the admin queue and serves channels
//! (I/O queue pairs), timeouts (abort, reset), resets, reconnects and namespace changes, until
//! [`Controller::detach`]. docs/nvme.md, "Controllers".
//!
//! * [`options`]: `bdev_nvme_set_options` and one attach's parameters;
//! * `ana`: the namespaces' ANA states, as the channels read them;
//! * [`identify`]: the Identify fields the driver uses;
//! * `shared`: the state word channels read per poll round, and the message line;
//! * `worker`: the controller thread;
//! * [`handle`]: [`attach`] and the [`Controller`] it returns;
//! * [`info`]: `bdev_nvme_get_controllers`' shape.

pub(crate) mod ana;
pub mod handle;
pub mod identify;
pub mod info;
mod namespaces;
pub mod options;
pub(crate) mod shared;
mod worker;

pub use handle::{attach, Controller};
pub use identify::{ControllerData, NamespaceData};
pub use info::{ControllerInfo, ControllerPath};
pub use namespaces::NamespaceEvent;
pub use options::{ControllerOptions, GlobalOptions, TimeoutAction};
