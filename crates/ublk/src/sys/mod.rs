//! The one part of fp-ublk that talks to the kernel, and the only part with `unsafe`: the
//! control device's io_uring (`ctrl.rs`: 128-byte SQEs, `IORING_OP_URING_CMD`, a buffer the
//! kernel reads or writes after the submission returns) and a queue (`queue.rs`: /dev/ublkcN's
//! mmap'd descriptor array, the tags' buffers the kernel copies request data into and out of,
//! and the 64-byte-SQE ring of FETCH and COMMIT_AND_FETCH commands). Everything above works
//! through their safe APIs.

mod ctrl;
mod queue;

pub use ctrl::{Control, CtrlError, CONTROL_PATH};
pub use queue::QueueRing;
