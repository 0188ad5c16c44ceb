//! Process-wide fixtures shared by the targets that drive the daemon's control plane
//! (`config_file`, `vhost_messages`): reactors and a private scratch directory. libFuzzer runs
//! every input in one process, so both are created once and live until the process exits.
#![allow(dead_code)] // each target uses a subset

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use fp_reactor::{ReactorConfig, ReactorHandle, ReactorSet};

/// Reactors on CPUs 0 and 1 (or 0 alone on a one-CPU machine). Two, so that queue placement
/// and `cpumask` selection have a choice; they sleep while no queue has work, so an input that
/// starts none costs them nothing.
pub fn reactors() -> &'static [ReactorHandle] {
    static SET: OnceLock<ReactorSet> = OnceLock::new();
    SET.get_or_init(|| {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()).min(2);
        let cores: Vec<usize> = (0..cpus).collect();
        ReactorSet::start(&cores, ReactorConfig::default())
            .or_else(|_| ReactorSet::start(&[0], ReactorConfig::default()))
            .expect("start reactors")
    })
    .handles()
}

/// An empty directory of this process's own under the system temp dir, removed and created
/// afresh the first time (a pid can be reused by a later run).
pub fn scratch_dir(target: &str) -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("fp-fuzz-{target}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).expect("create scratch directory");
        dir
    })
}

/// `FP_FUZZ_TRACE=1` makes a target print what each input reaches.
pub fn trace() -> bool {
    static TRACE: OnceLock<bool> = OnceLock::new();
    *TRACE.get_or_init(|| std::env::var_os("FP_FUZZ_TRACE").is_some_and(|v| v == "1"))
}
