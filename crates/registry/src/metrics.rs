//! Metric families as plain data ([`fp_bdev::metrics`], where the bdev modules find them too),
//! and a disk's latency histogram for the endpoint to re-bucket.

pub use fp_bdev::disk::{bucket_end, Histogram};
pub use fp_bdev::metrics::*;
