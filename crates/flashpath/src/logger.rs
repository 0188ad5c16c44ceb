//! A minimal stderr logger: `[seconds since start] LEVEL target: message`, one write per line so
//! lines from reactor, RPC and main threads do not interleave.

use std::io::Write;
use std::sync::OnceLock;
use std::time::Instant;

use log::{LevelFilter, Log, Metadata, Record};

struct StderrLogger {
    start: Instant,
}

impl Log for StderrLogger {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let t = self.start.elapsed();
        let line = format!(
            "[{:>5}.{:06}] {:<5} {}: {}\n",
            t.as_secs(),
            t.subsec_micros(),
            record.level(),
            record.target(),
            record.args()
        );
        // Nothing sensible to do if stderr is gone.
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }

    fn flush(&self) {}
}

static LOGGER: OnceLock<StderrLogger> = OnceLock::new();

/// Parses a level name as `--log-level` and `RUST_LOG` take it.
pub fn parse_level(s: &str) -> Result<LevelFilter, String> {
    s.trim()
        .parse::<LevelFilter>()
        .map_err(|_| format!("'{s}' is not a log level (accepted: off, error, warn, info, debug, trace)"))
}

/// Installs the logger. `level` wins over `RUST_LOG`, which wins over `default`.
pub fn init(level: Option<LevelFilter>, default: LevelFilter) {
    let from_env = std::env::var("RUST_LOG").ok().and_then(|v| parse_level(&v).ok());
    let level = level.or(from_env).unwrap_or(default);
    let logger = LOGGER.get_or_init(|| StderrLogger { start: Instant::now() });
    if log::set_logger(logger).is_ok() {
        log::set_max_level(level);
    }
}
