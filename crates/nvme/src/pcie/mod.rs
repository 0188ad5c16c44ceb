//! The PCIe transport (NVMe over PCIe, Base 3.1 and 4): queues in DMA memory, doorbells in
//! BAR0, over any [`PciFunction`].
//!
//! * [`function`]: the [`PciFunction`] trait, its mapped [`Bar`], and [`DmaMemory`];
//! * [`transport`]: [`PcieTransport`]: controller enable, queue creation, shutdown;
//! * [`admin`]: the admin queue; [`queue`]: an I/O queue pair; [`ring`]: the rings and
//!   (shadow) doorbells both use; [`prp`]: PRP lists and SGLs;
//! * [`vfio`]: a real function bound to vfio-pci (type1 container and group);

pub mod admin;
pub mod function;
pub mod prp;
pub mod queue;
pub mod ring;
pub mod transport;
pub mod vfio;

pub use admin::PcieAdmin;
pub use function::{Bar, DmaMemory, PciFunction};
pub use queue::PcieIoQueue;
pub use transport::{PcieOptions, PcieTransport};
