//! The PCIe transport (NVMe over PCIe, Base 3.1 and 4): queues in DMA memory, doorbells in
//! BAR0, over any [`PciFunction`].
//!
//! * [`function`]: the [`PciFunction`] trait, its mapped [`Bar`], and [`DmaMemory`];
//! * [`vfio`]: a real function bound to vfio-pci (type1 container and group);

pub mod function;
pub mod vfio;

pub use function::{Bar, DmaMemory, PciFunction};
