//! I/O counters, declared once: the per-queue atomics the control plane reads, the reactor's
//! local copies published once per busy round, and the per-controller sums all come from the
//! lists in `io_counters!`'s invocation below. The counters a read or write completion moves are
//! stored at every publication; the others only in a round that changed one of them (storing
//! all fifteen cost a busy round ~12 instructions under callgrind, paid once per I/O at QD1).

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! io_counters {
    (
        every_round { $( $(#[$hdoc:meta])* $hot:ident, )* }
        when_changed { $( $(#[$rdoc:meta])* $rare:ident, )* }
    ) => {
        /// Per-queue counters, written by the queue's reactor only (relaxed stores), read by the
        /// control plane.
        #[derive(Debug, Default)]
        pub struct QueueStats {
            $( $(#[$hdoc])* pub $hot: AtomicU64, )*
            $( $(#[$rdoc])* pub $rare: AtomicU64, )*
            /// Requests taken from the ring and not yet completed (a gauge).
            pub in_flight: AtomicU64,
        }

        /// The reactor's local copies of a queue's counters: those every completion moves,
        /// stored at every publication, and the others, reached through [`Counters::rare`]
        /// and stored only when one of them changed.
        #[derive(Debug, Default, Clone, Copy)]
        pub(crate) struct Counters {
            $( pub(crate) $hot: u64, )*
            rare: RareCounters,
            /// A counter of `rare` changed since the last publication.
            rare_changed: bool,
        }

        /// The counters a completion of a read or a write does not move.
        #[derive(Debug, Default, Clone, Copy)]
        pub(crate) struct RareCounters {
            $( pub(crate) $rare: u64, )*
        }

        impl Counters {
            /// Stores the counters into `s` (single writer: plain relaxed stores): the ones
            /// every completion moves always, the others when one of them changed.
            #[inline]
            pub(crate) fn publish(&mut self, s: &QueueStats) {
                $( s.$hot.store(self.$hot, Ordering::Relaxed); )*
                if self.rare_changed {
                    self.rare_changed = false;
                    let r = &self.rare;
                    $( s.$rare.store(r.$rare, Ordering::Relaxed); )*
                }
            }

            /// Continues from what `s` holds (a queue restarted on the same stats).
            pub(crate) fn load(s: &QueueStats) -> Counters {
                Counters {
                    $( $hot: s.$hot.load(Ordering::Relaxed), )*
                    rare: RareCounters { $( $rare: s.$rare.load(Ordering::Relaxed), )* },
                    rare_changed: false,
                }
            }
        }

        /// Counters for one controller, summed over its queues.
        #[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
        pub struct ControllerStats {
            $( $(#[$hdoc])* pub $hot: u64, )*
            $( $(#[$rdoc])* pub $rare: u64, )*
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
                $( self.$hot += q.$hot.load(Ordering::Relaxed); )*
                $( self.$rare += q.$rare.load(Ordering::Relaxed); )*
                self.in_flight += q.in_flight.load(Ordering::Relaxed);
            }
        }
    };
}

io_counters! {
    every_round {
        read_ops,
        write_ops,
        bytes_read,
        bytes_written,
    }
    when_changed {
        flush_ops,
        discard_ops,
        write_zeroes_ops,
        get_id_ops,
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
}

impl Counters {
    /// The counters a read or write completion does not move, to change: the next
    /// publication stores them.
    #[inline]
    pub(crate) fn rare(&mut self) -> &mut RareCounters {
        self.rare_changed = true;
        &mut self.rare
    }

    /// Counts a guest notification and returns the new count, which the caller stores at
    /// once (the signal goes out after the round's publication): no other publication need
    /// store the rare counters for it.
    #[inline]
    pub(crate) fn count_notification(&mut self) -> u64 {
        self.rare.notifications += 1;
        self.rare.notifications
    }
}
