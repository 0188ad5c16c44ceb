//! A PCI function bound to vfio-pci: the container and group, BAR0, DMA mapping. (vfio)
