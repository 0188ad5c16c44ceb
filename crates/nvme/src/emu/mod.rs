//! The emulated NVMe controller (emu): queues in memory, a thread as the device.
