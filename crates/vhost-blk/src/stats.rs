//! I/O counters, declared once: the per-queue atomics the control plane reads, the reactor's
//! local copies published once per busy round, and the per-controller sums all come from the
//! one list in `io_counters!`'s invocation below.

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! io_counters {
    ($( $(#[$doc:meta])* $name:ident, )*) => {
        /// Per-queue counters, written by the queue's reactor only (relaxed stores), read by the
        /// control plane.
        #[derive(Debug, Default)]
        pub struct QueueStats {
            $( $(#[$doc])* pub $name: AtomicU64, )*
            /// Requests taken from the ring and not yet completed (a gauge).
            pub in_flight: AtomicU64,
        }

        /// The reactor's local copies of a queue's counters.
        #[derive(Debug, Default, Clone, Copy)]
        pub(crate) struct Counters {
            $( pub(crate) $name: u64, )*
        }

        impl Counters {
            /// Stores every counter into `s` (single writer: plain relaxed stores).
            pub(crate) fn publish(&self, s: &QueueStats) {
                $( s.$name.store(self.$name, Ordering::Relaxed); )*
            }

            /// Continues from what `s` holds (a queue restarted on the same stats).
            pub(crate) fn load(s: &QueueStats) -> Counters {
                Counters { $( $name: s.$name.load(Ordering::Relaxed), )* }
            }
        }

        /// Counters for one controller, summed over its queues.
        #[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
        pub struct ControllerStats {
            $( $(#[$doc])* pub $name: u64, )*
            /// Requests taken from the rings and not yet completed, now.
            pub in_flight: u64,
        }

        impl ControllerStats {
            /// Requests completed, whatever their status.
            pub fn completed(&self) -> u64 {
                self.read_ops
                    + self.write_ops
                    + self.flush_ops
                    + self.discard_ops
                    + self.write_zeroes_ops
                    + self.get_id_ops
                    + self.io_errors
                    + self.unsupported
            }

            /// Requests completed per guest notification sent; `None` before the first one.
            pub fn requests_per_notification(&self) -> Option<f64> {
                (self.notifications > 0).then(|| self.completed() as f64 / self.notifications as f64)
            }

            /// Adds one queue's counters.
            pub fn add(&mut self, q: &QueueStats) {
                $( self.$name += q.$name.load(Ordering::Relaxed); )*
                self.in_flight += q.in_flight.load(Ordering::Relaxed);
            }
        }
    };
}

io_counters! {
    read_ops,
    write_ops,
    flush_ops,
    discard_ops,
    write_zeroes_ops,
    get_id_ops,
    bytes_read,
    bytes_written,
    /// Requests completed with VIRTIO_BLK_S_IOERR.
    io_errors,
    /// Requests completed with VIRTIO_BLK_S_UNSUPP.
    unsupported,
    /// Queues stopped because a chain could not be completed at all.
    failed_queues,
    /// Guest notifications sent (call eventfd writes).
    notifications,
    /// Guest kicks received: the kick eventfd's count, read before the queue sleeps (a driver
    /// kicks only while the queue sleeps; polling, the queue asks it not to).
    kicks,
    /// Live migration: 4 KiB pages marked in the dirty log, every write counted (data, status
    /// bytes, used ring; a page marked twice counts twice).
    logged_pages,
    /// Live migration: of those, the pages of data written by reads and GET_ID (one per
    /// 4 KiB-aligned 4 KiB read).
    logged_data_pages,
}
