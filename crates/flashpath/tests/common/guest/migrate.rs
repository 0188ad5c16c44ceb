//! Live migration of a guest between two QEMUs over QMP, as an orchestrator does it
//! (docs/migration.md; QEMU's docs/devel/migration/main.rst): the destination was started with
//! `-incoming defer` on the same image, kernel line and devices; it listens on a Unix socket
//! (`migrate-incoming`), the source sends (`migrate`), and `query-migrate` is polled until the
//! status wanted. The numbers QEMU reports (total time, downtime, RAM sent) are logged.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::Vm;

/// Bound on one migration, from `migrate` to the status waited for.
pub const MIGRATION_TIMEOUT: Duration = Duration::from_secs(90);
/// Bandwidth given to a migration on loopback unless [`MigrationOpts::max_bandwidth`] says
/// otherwise: QEMU's default (128 MiB/s) would make RAM the slowest part of the test.
const FAST: u64 = 8 << 30;

/// How a migration runs.
#[derive(Debug, Clone, Default)]
pub struct MigrationOpts {
    /// Capability `pause-before-switchover`: the source stops at `pre-switchover`, with the VM
    /// paused and its rings stopped, until `migrate-continue` (the mirror case completes its job
    /// there).
    pub pause_before_switchover: bool,
    /// `max-bandwidth` in bytes per second; a low one keeps the migration `active` long enough
    /// to cancel it.
    pub max_bandwidth: Option<u64>,
}

/// What `query-migrate` reported at the end.
#[derive(Debug, Clone)]
pub struct MigrationStats {
    pub status: String,
    /// `total-time`, ms.
    pub total_ms: u64,
    /// `downtime`, ms: the VM was paused this long at the switch-over.
    pub downtime_ms: u64,
    /// `setup-time`, ms.
    pub setup_ms: u64,
    /// RAM bytes sent.
    pub ram_bytes: u64,
    /// From `migrate` to completion, measured here.
    pub wall: Duration,
}

/// A migration under way from one VM to another.
pub struct Migration {
    label: String,
    socket: PathBuf,
    started: Instant,
}

impl Migration {
    /// Points `dst` (started with `incoming`) at a new socket in `dir`, sets `opts` on `src`
    /// and starts the migration. `label` names it in messages and in the socket's name.
    pub fn start(src: &mut Vm, dst: &mut Vm, dir: &Path, label: &str, opts: &MigrationOpts) -> Migration {
        let socket = dir.join(format!("mig-{label}.sock"));
        let _ = std::fs::remove_file(&socket);
        let uri = format!("unix:{}", socket.display());
        dst.qmp().run("migrate-incoming", json!({"uri": uri}));
        let capability =
            |on: bool| json!({"capabilities": [{"capability": "pause-before-switchover", "state": on}]});
        src.qmp().run("migrate-set-capabilities", capability(opts.pause_before_switchover));
        src.qmp().run("migrate-set-parameters", json!({"max-bandwidth": opts.max_bandwidth.unwrap_or(FAST)}));
        // migrate-incoming returns once the destination listens, so the socket exists.
        let started = Instant::now();
        if let Err(e) = src.qmp().execute("migrate", json!({"uri": uri})) {
            panic!("migration {label}: QMP migrate refused: {e}");
        }
        Migration { label: label.into(), socket, started }
    }

    /// Polls the source's `query-migrate` until its status is one of `wanted` and returns the
    /// reply. Panics on `failed` or `cancelled` (unless wanted) and after [`MIGRATION_TIMEOUT`].
    pub fn wait(&self, src: &mut Vm, wanted: &[&str]) -> Value {
        let until = self.started + MIGRATION_TIMEOUT;
        loop {
            let q = src.qmp().run("query-migrate", json!({}));
            let status = q["status"].as_str().unwrap_or("none");
            if wanted.contains(&status) {
                return q;
            }
            if status == "failed" || status == "cancelled" {
                panic!(
                    "migration {}: {status} ({}) while waiting for {wanted:?}; query-migrate: {q}",
                    self.label,
                    q["error-desc"].as_str().unwrap_or("no error-desc")
                );
            }
            if Instant::now() > until {
                panic!("migration {}: still {status} after {MIGRATION_TIMEOUT:?}: {q}", self.label);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// [`Migration::complete`], then quits the source.
    pub fn finish(self, src: &mut Vm, dst: &mut Vm) -> MigrationStats {
        let stats = self.complete(src, dst);
        quit(src);
        stats
    }

    /// Waits for `completed`, logs QEMU's figures and waits until the destination runs. The
    /// source stays, paused in `postmigrate`.
    pub fn complete(self, src: &mut Vm, dst: &mut Vm) -> MigrationStats {
        let q = self.wait(src, &["completed"]);
        let wall = self.started.elapsed();
        let n = |k: &str| q[k].as_u64().unwrap_or(0);
        let stats = MigrationStats {
            status: "completed".into(),
            total_ms: n("total-time"),
            downtime_ms: n("downtime"),
            setup_ms: n("setup-time"),
            ram_bytes: q["ram"]["transferred"].as_u64().unwrap_or(0),
            wall,
        };
        eprintln!(
            "migration {}: completed: total-time {} ms, downtime {} ms, setup {} ms, RAM sent {:.1} MiB \
             ({} dirty syncs); {:.2?} from migrate to completion",
            self.label,
            stats.total_ms,
            stats.downtime_ms,
            stats.setup_ms,
            stats.ram_bytes as f64 / (1 << 20) as f64,
            q["ram"]["dirty-sync-count"],
            wall
        );
        wait_running(dst, &self.label);
        let _ = std::fs::remove_file(&self.socket);
        stats
    }

    /// `migrate-continue` from `pre-switchover` (with [`MigrationOpts::pause_before_switchover`]):
    /// the switch-over goes ahead.
    pub fn continue_switchover(&self, src: &mut Vm) {
        src.qmp().run("migrate-continue", json!({"state": "pre-switchover"}));
    }

    /// `migrate_cancel` on the source; waits for `cancelled` and for the source to run again.
    /// The destination is killed (its incoming migration failed).
    pub fn cancel(self, src: &mut Vm, dst: &mut Vm) {
        src.qmp().run("migrate_cancel", json!({}));
        self.wait(src, &["cancelled"]);
        eprintln!("migration {}: cancelled after {:.2?}", self.label, self.started.elapsed());
        wait_running(src, &self.label);
        dst.kill();
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Waits until `vm`'s `query-status` says `running` (10 s at most).
pub fn wait_running(vm: &mut Vm, label: &str) {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let s = vm.qmp().run("query-status", json!({}));
        if s["status"] == "running" {
            return;
        }
        assert!(Instant::now() < until, "migration {label}: {} is {s} after 10 s, not running", vm.name());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// QMP `quit`, then waits for QEMU to exit.
pub fn quit(vm: &mut Vm) {
    // QEMU may close the connection before or after its reply.
    let _ = vm.qmp().execute("quit", json!({}));
    vm.wait_exit(super::EXIT_TIMEOUT);
}

/// Starts a migration and waits for it to complete (see [`Migration::finish`]).
pub fn migrate(src: &mut Vm, dst: &mut Vm, dir: &Path, label: &str) -> MigrationStats {
    Migration::start(src, dst, dir, label, &MigrationOpts::default()).finish(src, dst)
}
