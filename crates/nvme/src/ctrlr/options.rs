//! The knobs: process-wide ones (`bdev_nvme_set_options`, SPDK's names) and one attach's own
//! (`bdev_nvme_attach_controller`'s parameters beyond the transport ID).

use std::time::Duration;

/// What a channel does when a command has been in flight longer than
/// [`GlobalOptions::timeout_us`] (SPDK's `action_on_timeout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TimeoutAction {
    /// Log it once and keep waiting.
    #[default]
    None,
    /// Abort the command (Base 5.1) through the admin queue; if it is still in flight one
    /// timeout later, reset the controller.
    Abort,
    /// Reset the controller (its commands are resubmitted once it is back).
    Reset,
}

impl TimeoutAction {
    /// SPDK's spelling: "none", "abort", "reset".
    pub fn as_str(self) -> &'static str {
        match self {
            TimeoutAction::None => "none",
            TimeoutAction::Abort => "abort",
            TimeoutAction::Reset => "reset",
        }
    }

    /// Parses SPDK's spelling.
    pub fn parse(s: &str) -> Option<TimeoutAction> {
        match s {
            "none" => Some(TimeoutAction::None),
            "abort" => Some(TimeoutAction::Abort),
            "reset" => Some(TimeoutAction::Reset),
            _ => None,
        }
    }
}

/// `bdev_nvme_set_options`: process-wide, read by each attach (a change applies to
/// controllers attached afterwards, as in SPDK). Field names are SPDK's.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct GlobalOptions {
    /// An I/O command in flight longer than this (µs) is timed out; 0: never.
    pub timeout_us: u64,
    /// An admin command in flight longer than this (µs) fails and the controller is reset;
    /// 0: `timeout_us`, as in SPDK (see [`GlobalOptions::admin_timeout`]).
    pub timeout_admin_us: u64,
    /// What a timed-out I/O command gets.
    pub action_on_timeout: TimeoutAction,
    /// Keep Alive Timeout (Base 3.9) asked of controllers that support it (Identify
    /// Controller's KAS non-zero, and every NVMe/TCP controller); a Keep Alive command goes
    /// every half of it. 0: none.
    pub keep_alive_timeout_ms: u32,
    /// How often the controller thread looks at the admin queue for asynchronous events (µs).
    pub nvme_adminq_poll_period_us: u64,
    /// Entries of each I/O queue pair when the attach does not say (bounded by CAP.MQES + 1).
    pub io_queue_size: u16,
    /// Requests one channel accepts at once (more are refused `Busy`): a request larger than
    /// the controller's transfer limit takes one, however many commands it is split into.
    pub io_queue_requests: u32,
    /// `bdev_nvme_attach_controller`'s `ctrlr_loss_timeout_sec` when it does not say.
    pub ctrlr_loss_timeout_sec: i64,
    /// `bdev_nvme_attach_controller`'s `reconnect_delay_sec` when it does not say.
    pub reconnect_delay_sec: u32,
    /// `bdev_nvme_attach_controller`'s `fast_io_fail_timeout_sec` when it does not say.
    pub fast_io_fail_timeout_sec: u32,
    /// SPDK's `enable_flush`: on a controller with a volatile write cache, the namespaces
    /// report flush and send Flush to the controller. Off, they report no flush and a flush
    /// completes at once without a command (the cache is left to the controller).
    pub enable_flush: bool,
}

impl GlobalOptions {
    /// The bound on the driver's own admin commands when timeouts are off (`timeout_us` 0):
    /// SPDK then has no admin timeout at all, but the controller thread waits for each admin
    /// command it sends, and every wait here has a bound.
    pub const DEFAULT_ADMIN_TIMEOUT: Duration = Duration::from_secs(10);

    /// The admin command timeout, as SPDK derives it: `timeout_admin_us`, or `timeout_us`
    /// when that is 0; with both 0 (timeouts off), [`GlobalOptions::DEFAULT_ADMIN_TIMEOUT`].
    pub fn admin_timeout(&self) -> Duration {
        match (self.timeout_admin_us, self.timeout_us) {
            (0, 0) => GlobalOptions::DEFAULT_ADMIN_TIMEOUT,
            (0, io) => Duration::from_micros(io),
            (admin, _) => Duration::from_micros(admin),
        }
    }

    /// The admin queue's poll period (at least 100 µs).
    pub fn admin_poll_period(&self) -> Duration {
        Duration::from_micros(self.nvme_adminq_poll_period_us.max(100))
    }

    /// Per-attach options with this process's defaults and `name`.
    pub fn controller_options(&self, name: &str) -> ControllerOptions {
        ControllerOptions {
            name: name.to_string(),
            ctrlr_loss_timeout_sec: self.ctrlr_loss_timeout_sec,
            reconnect_delay_sec: self.reconnect_delay_sec,
            fast_io_fail_timeout_sec: self.fast_io_fail_timeout_sec,
            io_queue_depth: self.io_queue_size,
            second: Duration::from_secs(1),
        }
    }
}

impl Default for GlobalOptions {
    /// SPDK's defaults (v23.01 `bdev_nvme_set_options`), except `io_queue_size`, which is the
    /// attach's `io_queue_size` default there too.
    fn default() -> GlobalOptions {
        GlobalOptions {
            timeout_us: 0,
            timeout_admin_us: 0,
            action_on_timeout: TimeoutAction::None,
            keep_alive_timeout_ms: 10_000,
            nvme_adminq_poll_period_us: 10_000,
            io_queue_size: 128,
            io_queue_requests: 1024,
            ctrlr_loss_timeout_sec: 0,
            reconnect_delay_sec: 0,
            fast_io_fail_timeout_sec: 0,
            enable_flush: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_timeout_follows_timeout_us_when_zero() {
        let opts = |timeout_us, timeout_admin_us| GlobalOptions {
            timeout_us,
            timeout_admin_us,
            ..GlobalOptions::default()
        };
        assert_eq!(opts(2_000_000, 0).admin_timeout(), Duration::from_secs(2));
        assert_eq!(opts(2_000_000, 5_000_000).admin_timeout(), Duration::from_secs(5));
        assert_eq!(opts(0, 0).admin_timeout(), GlobalOptions::DEFAULT_ADMIN_TIMEOUT);
    }
}

/// One attach: `bdev_nvme_attach_controller`'s parameters beyond the transport ID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerOptions {
    /// The controller's name; its namespaces are the bdevs `<name>n<nsid>`.
    pub name: String,
    /// After the controller is lost (a failed reset, a lost connection), how long to keep
    /// trying to reconnect, in seconds: -1 forever, 0 not at all (one reset attempt, then the
    /// controller is failed and its namespaces removed).
    pub ctrlr_loss_timeout_sec: i64,
    /// Seconds between reconnect attempts (non-zero when `ctrlr_loss_timeout_sec` is).
    pub reconnect_delay_sec: u32,
    /// After this many seconds without the controller, I/O held for resubmission fails
    /// (`EIO`) and new I/O fails at once, while reconnecting goes on; 0: I/O waits until the
    /// controller is back or lost for good.
    pub fast_io_fail_timeout_sec: u32,
    /// Entries of each I/O queue pair (bounded by CAP.MQES + 1).
    pub io_queue_depth: u16,
    /// How long one second of the `*_sec` parameters lasts: one second, except in tests,
    /// which shrink it to check the reconnect policy in milliseconds.
    pub second: Duration,
}

impl ControllerOptions {
    /// `n` of the `*_sec` parameters' seconds.
    pub fn seconds(&self, n: u64) -> Duration {
        self.second.saturating_mul(n.min(u64::from(u32::MAX)) as u32)
    }

    /// Checks the combination SPDK checks (`bdev_nvme_check_io_error_resiliency_params`).
    pub fn validate(&self) -> Result<(), crate::NvmeError> {
        let invalid =
            |field, reason: &str| Err(crate::NvmeError::InvalidParam { field, reason: reason.into() });
        if self.name.is_empty() || self.name.contains(|c: char| c.is_control() || c == '/') {
            return invalid("name", "must be non-empty, no '/' or control characters");
        }
        if self.ctrlr_loss_timeout_sec < -1 {
            return invalid("ctrlr_loss_timeout_sec", "must be -1 (forever), 0 or a number of seconds");
        }
        if self.ctrlr_loss_timeout_sec == 0 {
            if self.reconnect_delay_sec != 0 || self.fast_io_fail_timeout_sec != 0 {
                return invalid(
                    "reconnect_delay_sec",
                    "reconnect_delay_sec and fast_io_fail_timeout_sec need a non-zero ctrlr_loss_timeout_sec",
                );
            }
            return Ok(());
        }
        if self.reconnect_delay_sec == 0 {
            return invalid("reconnect_delay_sec", "must be non-zero when ctrlr_loss_timeout_sec is");
        }
        if self.ctrlr_loss_timeout_sec > 0 {
            let loss = self.ctrlr_loss_timeout_sec as u64;
            if u64::from(self.reconnect_delay_sec) > loss {
                return invalid("reconnect_delay_sec", "must not exceed ctrlr_loss_timeout_sec");
            }
            if u64::from(self.fast_io_fail_timeout_sec) > loss {
                return invalid("fast_io_fail_timeout_sec", "must not exceed ctrlr_loss_timeout_sec");
            }
        }
        if self.fast_io_fail_timeout_sec != 0 && self.fast_io_fail_timeout_sec < self.reconnect_delay_sec {
            return invalid("fast_io_fail_timeout_sec", "must not be below reconnect_delay_sec");
        }
        if self.io_queue_depth < 2 {
            return invalid("io_queue_size", "an I/O queue needs at least 2 entries");
        }
        Ok(())
    }
}
