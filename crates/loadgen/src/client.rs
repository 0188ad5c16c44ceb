//! The client thread: [`run`] and [`hold`] validate a spec, then drive it from a thread of
//! their own (pinned when the spec says so), where the engine's loop runs.

use std::time::Duration;

use crate::engine;
use crate::{LoadError, LoadResult, LoadSpec};

/// Runs `spec` on a new client thread (pinned when `spec.cpu` is set) and returns what it
/// measured.
pub fn run(spec: &LoadSpec) -> Result<LoadResult, LoadError> {
    on_client_thread(spec, engine::run_on_this_thread)
}

/// Validates `spec`, then runs `f` on a new client thread (pinned when `spec.cpu` is set).
fn on_client_thread<T: Send + 'static>(
    spec: &LoadSpec,
    f: fn(&LoadSpec) -> Result<T, LoadError>,
) -> Result<T, LoadError> {
    spec.validate()?;
    let spec = spec.clone();
    let handle = std::thread::Builder::new()
        .name("fp-load".into())
        .spawn(move || {
            if let Some(cpu) = spec.cpu {
                pin_current_thread(cpu)?;
            }
            f(&spec)
        })
        .map_err(|source| LoadError::Os { op: "spawning the client thread", source })?;
    handle.join().map_err(|_| LoadError::Panicked)?
}

/// Connects to `spec.socket` and starts `spec.num_queues` queues (poll or completion-fd, as
/// `spec.poll_queues` says) like [`run`], then holds them for `spec.duration` without any I/O:
/// an attached but idle disk, for measuring a server's idle CPU use. Returns how long it held.
pub fn hold(spec: &LoadSpec) -> Result<Duration, LoadError> {
    on_client_thread(spec, engine::hold_on_this_thread)
}

/// Restricts the calling thread to `cpu`.
pub fn pin_current_thread(cpu: usize) -> Result<(), LoadError> {
    let max = fp_sys::CPU_SETSIZE;
    if cpu >= max {
        return Err(LoadError::InvalidSpec(format!("cpu {cpu} is beyond the {max} a cpu set holds")));
    }
    fp_sys::pin_thread(&[cpu]).map_err(|source| LoadError::Os { op: "pinning the client thread", source })
}
