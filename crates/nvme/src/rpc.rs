//! The bdev_nvme module and its methods (control).
