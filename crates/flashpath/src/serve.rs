//! `flashpath serve`: reactors, the target, the start-up configuration, the RPC server, and an
//! orderly stop on SIGTERM or SIGINT.
//!
//! Signals are blocked before any thread starts, so every thread inherits the mask and the
//! signals stay pending until the main thread collects them with `sigwait`: no handler runs on a
//! reactor, and no extra thread is needed.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use fp_reactor::sys::{self, first_allowed_cpu, SignalSet};
use fp_reactor::{ReactorConfig, ReactorSet};
use fp_registry::exports::all_options;
use fp_registry::exports::{KindOptions, OptionError, OptionValue};
use fp_registry::{ExportDirError, ExportDirs, Limits, Registry, RegistryOptions, DEFAULT_SOCKET_MODE};
use fp_rpc::{Handler, RpcServer};

use crate::config::{ConfigError, ConfigFile};
use crate::metrics::{self, MetricsError, MetricsServer};
use crate::{DEFAULT_RPC_SOCKET, DEFAULT_VHOST_DIR};

/// `serve`'s settings as given on the command line; `None` falls back to the config file, then
/// to the built-in default.
#[derive(Debug, Default)]
pub struct ServeOptions {
    pub cpus: Option<String>,
    pub rpc: Option<PathBuf>,
    pub vhost_dir: Option<PathBuf>,
    pub config: Option<PathBuf>,
    pub idle_window_us: Option<u64>,
    /// `--export-dir`, given at least once.
    pub export_dirs: Option<Vec<PathBuf>>,
    /// `--metrics`: where to serve Prometheus metrics (off when `None`).
    pub metrics: Option<String>,
    /// `--no-iostat`.
    pub no_iostat: bool,
    /// `--state-dir`: where persistent dirty bitmaps are kept.
    pub state_dir: Option<PathBuf>,
    /// The export kinds' option flags given (`--nbd-stop-timeout-ms`), by flag without its
    /// dashes ([`fp_registry::exports::KindOption::flag`]); not yet checked against the range.
    pub kind_flags: BTreeMap<&'static str, OptionValue>,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("config error: {0}")]
    Config(#[from] ConfigError),
    #[error("--cpus: {0}")]
    Cpus(String),
    #[error("cannot find a CPU this process may run on: {0}")]
    Affinity(#[source] io::Error),
    #[error("cannot create the vhost directory {}: {source}", path.display())]
    VhostDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot start reactors on cpus {cpus}: {source}")]
    Reactors {
        cpus: String,
        #[source]
        source: io::Error,
    },
    /// `setting` is where the directories came from: the flag or the config key.
    #[error("{setting}: {source}")]
    ExportDir {
        setting: &'static str,
        #[source]
        source: ExportDirError,
    },
    #[error("state directory {}: {reason}", path.display())]
    StateDir { path: PathBuf, reason: String },
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    #[error("cannot start the RPC server: {0}")]
    Rpc(#[source] io::Error),
    #[error("cannot set up signal handling: {0}")]
    Signals(#[source] io::Error),
    /// An export kind's option flag was refused.
    #[error("--{flag}: {reason}")]
    KindOption {
        flag: &'static str,
        #[source]
        reason: OptionError,
    },
}

/// What `serve` ends up running with.
#[derive(Debug, PartialEq, Eq)]
pub struct Settings {
    pub cpus: Vec<usize>,
    pub rpc: PathBuf,
    pub vhost_dir: PathBuf,
    pub idle_window: Duration,
    pub limits: Limits,
    pub socket_mode: u32,
    /// The export directories as given, and the setting they came from.
    pub export_dirs: Option<(Vec<PathBuf>, &'static str)>,
    /// Per-disk I/O statistics are counted (`fp_registry::RegistryOptions::iostat`).
    pub iostat: bool,
    /// Where persistent dirty bitmaps are kept, if anywhere.
    pub state_dir: Option<PathBuf>,
    /// The export kinds' options given, each from its flag, else its table
    /// (`fp_registry::RegistryOptions::kind_options`); the others keep their defaults.
    pub kind_options: KindOptions,
}

/// The export kinds' options: each flag given (checked here) over the file's value (checked
/// when it was read).
fn kind_options(opts: &ServeOptions, config: &ConfigFile) -> Result<KindOptions, ServeError> {
    let mut options = config.kind_options.clone();
    for option in all_options() {
        let Some(flag) = option.flag else { continue };
        if let Some(&value) = opts.kind_flags.get(flag) {
            let value = option.check(value).map_err(|reason| ServeError::KindOption { flag, reason })?;
            options.set(option.table, option.key, value);
        }
    }
    Ok(options)
}

/// Merges flags over the config file over defaults.
pub fn resolve(opts: &ServeOptions, config: &ConfigFile) -> Result<Settings, ServeError> {
    let cpus = match (&opts.cpus, &config.reactor.cpus) {
        (Some(flag), _) => fp_reactor::parse_cpu_list(flag).map_err(ServeError::Cpus)?,
        (None, Some(cfg)) => fp_reactor::parse_cpu_list(cfg).map_err(ConfigError::Cpus)?,
        (None, None) => vec![first_allowed_cpu().map_err(ServeError::Affinity)?],
    };
    let idle_window = opts
        .idle_window_us
        .or(config.reactor.idle_window_us)
        .map_or(fp_reactor::DEFAULT_IDLE_WINDOW, Duration::from_micros);
    let kind_options = kind_options(opts, config)?;
    Ok(Settings {
        cpus,
        rpc: opts.rpc.clone().or_else(|| config.rpc.clone()).unwrap_or_else(|| DEFAULT_RPC_SOCKET.into()),
        vhost_dir: opts
            .vhost_dir
            .clone()
            .or_else(|| config.vhost_dir.clone())
            .unwrap_or_else(|| DEFAULT_VHOST_DIR.into()),
        idle_window,
        limits: config.limits.limits(),
        socket_mode: config.security.socket_mode.unwrap_or(DEFAULT_SOCKET_MODE),
        export_dirs: match (&opts.export_dirs, &config.security.export_dirs) {
            (Some(flag), _) => Some((flag.clone(), "--export-dir")),
            (None, Some(cfg)) => Some((cfg.clone(), "security.export_dirs")),
            (None, None) => None,
        },
        iostat: !opts.no_iostat && config.stats.iostat.unwrap_or(true),
        state_dir: opts.state_dir.clone().or_else(|| config.state_dir.clone()),
        kind_options,
    })
}

/// The signals that stop the daemon.
const STOP_SIGNALS: [libc::c_int; 2] = [libc::SIGTERM, libc::SIGINT];

/// Blocks the stop signals in the calling thread (and so in every thread it starts later).
fn block_stop_signals() -> io::Result<SignalSet> {
    let set = SignalSet::new(&STOP_SIGNALS)?;
    set.block()?;
    Ok(set)
}

/// Waits for one of the blocked stop signals; returns its name.
fn wait_stop_signal(set: &SignalSet) -> io::Result<&'static str> {
    loop {
        match set.wait()? {
            libc::SIGTERM => return Ok("SIGTERM"),
            libc::SIGINT => return Ok("SIGINT"),
            _ => continue,
        }
    }
}

fn format_cpus(cpus: &[usize]) -> String {
    cpus.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(",")
}

/// Runs the daemon until SIGTERM or SIGINT.
pub fn run(opts: &ServeOptions) -> Result<(), ServeError> {
    // Everything the daemon creates (sockets, the vhost directory) is its user's alone from the
    // moment it exists; modes meant to be wider are set explicitly afterwards. The umask is
    // per process, so it is set here, before any thread exists that could be creating a file.
    sys::set_umask(0o077);
    let config = match &opts.config {
        Some(path) => ConfigFile::load(path)?,
        None => ConfigFile::default(),
    };
    let settings = resolve(opts, &config)?;
    let export_dirs = match &settings.export_dirs {
        Some((dirs, setting)) => {
            Some(ExportDirs::new(dirs).map_err(|source| ServeError::ExportDir { setting, source })?)
        }
        None => None,
    };
    // A bad address is refused before anything starts.
    let metrics_addr = match (&opts.metrics, &config.metrics) {
        (Some(flag), _) => Some((metrics::parse_addr(flag, "--metrics")?, "--metrics")),
        (None, Some(cfg)) => Some((metrics::parse_addr(cfg, "metrics")?, "metrics")),
        (None, None) => None,
    };
    if let Some(dir) = &settings.state_dir {
        // Refused before anything starts: a persistent bitmap could not be kept.
        if !dir.is_dir() {
            return Err(ServeError::StateDir {
                path: dir.clone(),
                reason: "not an existing directory".into(),
            });
        }
    }
    let signals = block_stop_signals().map_err(ServeError::Signals)?;
    create_vhost_dir(&settings.vhost_dir, settings.socket_mode)?;

    let reactors = ReactorSet::start(&settings.cpus, ReactorConfig { idle_window: settings.idle_window })
        .map_err(|source| ServeError::Reactors { cpus: format_cpus(&settings.cpus), source })?;
    let options = RegistryOptions {
        limits: settings.limits.clone(),
        socket_mode: settings.socket_mode,
        export_dirs,
        iostat: settings.iostat,
        kind_options: settings.kind_options.clone(),
        state_dir: settings.state_dir.clone(),
    };
    let registry = Registry::with_options(reactors.handles().to_vec(), &settings.vhost_dir, options);
    let started = config.apply(&registry).map_err(ServeError::from).and_then(|_| {
        // The jobs a stopped daemon left, once their bdevs, bitmaps and stores are back.
        registry.resume_backup_jobs();
        let m = registry.clone();
        let handler: Handler = Arc::new(move |method, params| m.call(method, params).map_err(|e| e.to_rpc()));
        let server = RpcServer::start(&settings.rpc, handler).map_err(ServeError::Rpc)?;
        // The endpoint reads through the same methods the RPC server runs.
        let m = registry.clone();
        let source: metrics::Source = Arc::new(move |method, params| m.call(method, params).ok());
        match metrics_addr.as_ref().map(|(a, setting)| MetricsServer::start(a, setting, source)).transpose() {
            Ok(exporter) => Ok((server, exporter)),
            Err(e) => {
                server.stop();
                Err(e.into())
            }
        }
    });
    let (server, exporter) = match started {
        Ok(s) => s,
        Err(e) => {
            // Undo what the configuration created (controller sockets) before reporting.
            registry.shutdown();
            reactors.shutdown();
            return Err(e);
        }
    };
    eprintln!(
        "flashpath v{} ready: rpc {} vhost-dir {} reactors on cpus {}",
        env!("CARGO_PKG_VERSION"),
        settings.rpc.display(),
        settings.vhost_dir.display(),
        format_cpus(&settings.cpus)
    );
    if let Some(e) = &exporter {
        eprintln!("flashpath metrics at {}", e.addr());
    }

    let outcome = wait_stop_signal(&signals);
    let signalled = std::time::Instant::now();
    match &outcome {
        Ok(name) => log::info!("{name} received, shutting down"),
        Err(e) => log::error!("waiting for signals failed ({e}), shutting down"),
    }
    // Stop taking requests first, so nothing creates a controller while they are torn down.
    server.stop();
    if let Some(e) = exporter {
        e.stop();
    }
    // Every export stops at once, within about one stop bound however many are stuck
    // (Registry::shutdown); those still stopping at its deadline are logged and left behind.
    let left = registry.shutdown();
    // A queue that did not stop in time (its disk still holds requests) waits on its reactor
    // for them, so that guest memory is not unmapped under the disk: up to the daemon's stop
    // bound once more (Registry::daemon_stop_bound: `[vhost] stop_timeout_ms` unless the NVMe-oF
    // drain is shorter), but never past the one shutdown deadline. The floor lets every reactor finish the round it
    // is in and log what it drops.
    let left_of_deadline =
        (signalled + registry.shutdown_bound()).saturating_duration_since(std::time::Instant::now());
    reactors.shutdown_within(registry.daemon_stop_bound().min(left_of_deadline).max(REACTOR_DRAIN_FLOOR));
    if !left.is_empty() {
        log::warn!("exiting with the stop of {} export(s) unfinished: {}", left.len(), left.join(", "));
    }
    log::info!("stopped");
    outcome.map(|_| ()).map_err(ServeError::Signals)
}

/// Creates the vhost directory (and missing parents) with [`vhost_dir_mode`]; an existing one is
/// The least the reactors wait at shutdown for requests a disk still holds, when the exports'
/// stops used up the shutdown's deadline.
const REACTOR_DRAIN_FLOOR: std::time::Duration = std::time::Duration::from_millis(200);

/// the operator's and keeps its mode.
fn create_vhost_dir(path: &Path, socket_mode: u32) -> Result<(), ServeError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let err = |source| ServeError::VhostDir { path: path.to_path_buf(), source };
    match std::fs::metadata(path) {
        Ok(meta) => {
            let mode = meta.permissions().mode();
            // Whoever may write the directory may replace a socket in it with their own, which
            // the next guest then connects to. The sticky bit stops them deleting ours.
            if mode & 0o022 != 0 && mode & 0o1000 == 0 {
                log::warn!(
                    "vhost directory {} has mode {:o}: other users may replace its sockets",
                    path.display(),
                    mode & 0o7777
                );
            }
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(vhost_dir_mode(socket_mode))
                .create(path)
                .map_err(err)?;
            // The umask (077) narrowed what mkdir applied; set the intended mode on the leaf.
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(vhost_dir_mode(socket_mode)))
                .map_err(err)
        }
        Err(e) => Err(err(e)),
    }
}

/// 0700, plus search permission for the group or for others when the sockets grant them access:
/// they cannot reach a socket in a directory they cannot enter.
fn vhost_dir_mode(socket_mode: u32) -> u32 {
    let group = if socket_mode & 0o070 != 0 { 0o010 } else { 0 };
    let other = if socket_mode & 0o007 != 0 { 0o001 } else { 0 };
    0o700 | group | other
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value `options` give `table.key`: as given, else the kind's default.
    fn value(options: &KindOptions, table: &str, key: &str) -> OptionValue {
        let declared = all_options().find(|o| o.table == table && o.key == key).expect("a declared option");
        options.value_of(declared)
    }

    /// The milliseconds option `table.key` of `settings`.
    fn millis(settings: &Settings, table: &str, key: &str) -> Duration {
        match value(&settings.kind_options, table, key) {
            OptionValue::Millis(ms) => Duration::from_millis(ms),
            other => panic!("{table}.{key} is {other:?}"),
        }
    }

    /// `--FLAG MS` for each of `flags`.
    fn flags(flags: &[(&'static str, u64)]) -> BTreeMap<&'static str, OptionValue> {
        flags.iter().map(|&(f, ms)| (f, OptionValue::Millis(ms))).collect()
    }

    #[test]
    fn flags_override_config_over_defaults() {
        let config = ConfigFile::parse(
            "rpc = \"/c.sock\"\nvhost_dir = \"/c\"\n[reactor]\ncpus = \"2-3\"\nidle_window_us = 7\n",
            Path::new("c.toml"),
        )
        .unwrap();
        let from_config = resolve(&ServeOptions::default(), &config).unwrap();
        assert_eq!(
            from_config,
            Settings {
                cpus: vec![2, 3],
                rpc: "/c.sock".into(),
                vhost_dir: "/c".into(),
                idle_window: Duration::from_micros(7),
                limits: Limits::default(),
                socket_mode: 0o600,
                export_dirs: None,
                iostat: true,
                state_dir: None,
                kind_options: KindOptions::default(),
            }
        );
        let opts = ServeOptions {
            cpus: Some("0x1".into()),
            rpc: Some("/f.sock".into()),
            vhost_dir: Some("/f".into()),
            config: None,
            idle_window_us: Some(9),
            export_dirs: None,
            metrics: None,
            no_iostat: true,
            ..ServeOptions::default()
        };
        let from_flags = resolve(&opts, &config).unwrap();
        assert_eq!(from_flags.cpus, [0]);
        assert_eq!(from_flags.rpc, Path::new("/f.sock"));
        assert_eq!(from_flags.vhost_dir, Path::new("/f"));
        assert_eq!(from_flags.idle_window, Duration::from_micros(9));
        assert!(!from_flags.iostat, "--no-iostat");

        let defaults = resolve(&ServeOptions::default(), &ConfigFile::default()).unwrap();
        assert_eq!(defaults.cpus, [first_allowed_cpu().unwrap()]);
        assert_eq!(defaults.rpc, Path::new(DEFAULT_RPC_SOCKET));
        assert_eq!(defaults.vhost_dir, Path::new(DEFAULT_VHOST_DIR));
        assert!(defaults.iostat, "statistics are on by default");
        let off: ConfigFile = toml::from_str("[stats]\niostat = false\n").unwrap();
        assert!(!resolve(&ServeOptions::default(), &off).unwrap().iostat, "[stats] iostat = false");
        assert_eq!(defaults.idle_window, fp_reactor::DEFAULT_IDLE_WINDOW);
    }

    #[test]
    fn nvmf_remote_listeners_come_from_the_security_table() {
        let config =
            ConfigFile::parse("[security]\nnvmf_allow_remote = true\n", Path::new("c.toml")).unwrap();
        let settings = resolve(&ServeOptions::default(), &config).unwrap();
        assert_eq!(value(&settings.kind_options, "security", "nvmf_allow_remote"), OptionValue::Bool(true));
        let e = ConfigFile::parse("[security]\nnvmf_allow_remote = 1\n", Path::new("c.toml")).unwrap_err();
        assert!(e.to_string().starts_with("c.toml:2:"), "{e}");
    }

    #[test]
    fn export_dir_flags_replace_the_config_list() {
        let config =
            ConfigFile::parse("[security]\nexport_dirs = [\"/a\", \"/b\"]\n", Path::new("c.toml")).unwrap();
        let from_config = resolve(&ServeOptions::default(), &config).unwrap();
        assert_eq!(from_config.export_dirs, Some((vec!["/a".into(), "/b".into()], "security.export_dirs")));
        let opts = ServeOptions { export_dirs: Some(vec!["/f".into()]), ..ServeOptions::default() };
        assert_eq!(resolve(&opts, &config).unwrap().export_dirs, Some((vec!["/f".into()], "--export-dir")));
        let none = resolve(&ServeOptions::default(), &ConfigFile::default()).unwrap();
        assert_eq!(none.export_dirs, None);
    }

    #[test]
    fn vhost_dir_is_created_private_and_an_existing_one_kept() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        let new = dir.path().join("a/vhost");
        create_vhost_dir(&new, 0o600).unwrap();
        assert_eq!(mode(&new), 0o700);
        let shared = dir.path().join("shared");
        create_vhost_dir(&shared, 0o660).unwrap();
        assert_eq!(mode(&shared), 0o710);
        std::fs::set_permissions(&new, std::fs::Permissions::from_mode(0o755)).unwrap();
        create_vhost_dir(&new, 0o600).unwrap();
        assert_eq!(mode(&new), 0o755);
        assert_eq!(vhost_dir_mode(0o606), 0o701);
    }

    #[test]
    fn the_vhost_stop_bound_comes_from_the_flag_over_the_vhost_table() {
        let config = ConfigFile::parse("[vhost]\nstop_timeout_ms = 750\n", Path::new("c.toml")).unwrap();
        assert_eq!(value(&config.kind_options, "vhost", "stop_timeout_ms"), OptionValue::Millis(750));
        assert_eq!(
            millis(&resolve(&ServeOptions::default(), &config).unwrap(), "vhost", "stop_timeout_ms"),
            Duration::from_millis(750)
        );
        let opts = ServeOptions {
            kind_flags: flags(&[("vhost-stop-timeout-ms", 20_000)]),
            ..ServeOptions::default()
        };
        assert_eq!(
            millis(&resolve(&opts, &config).unwrap(), "vhost", "stop_timeout_ms"),
            Duration::from_secs(20)
        );
        let none = resolve(&ServeOptions::default(), &ConfigFile::default()).unwrap();
        assert_eq!(millis(&none, "vhost", "stop_timeout_ms"), Duration::from_millis(5000));
        for ms in [0, 600_001] {
            let text = format!("[vhost]\nstop_timeout_ms = {ms}\n");
            let e = ConfigFile::parse(&text, Path::new("c.toml")).unwrap_err().to_string();
            assert_eq!(e, format!("vhost.stop_timeout_ms: {ms} is not between 1 and 600000"));
            let opts = ServeOptions {
                kind_flags: flags(&[("vhost-stop-timeout-ms", ms)]),
                ..ServeOptions::default()
            };
            let e = resolve(&opts, &ConfigFile::default()).unwrap_err().to_string();
            assert_eq!(e, format!("--vhost-stop-timeout-ms: {ms} is not between 1 and 600000"));
        }
        let e =
            ConfigFile::parse("[vhost]\nstop_timeout = 5\n", Path::new("c.toml")).unwrap_err().to_string();
        assert!(e.starts_with("c.toml:2:1: unknown field `stop_timeout`"), "{e}");
    }

    #[test]
    fn the_nvmf_and_nbd_bounds_come_from_their_flags_over_their_tables() {
        let text = "[nvmf]\ndrain_timeout_ms = 700\nclose_timeout_ms = 800\n\
                    [nbd]\nstop_timeout_ms = 900\nclose_timeout_ms = 1000\n";
        let config = ConfigFile::parse(text, Path::new("c.toml")).unwrap();
        let s = resolve(&ServeOptions::default(), &config).unwrap();
        let ms = Duration::from_millis;
        assert_eq!(
            (
                millis(&s, "nvmf", "drain_timeout_ms"),
                millis(&s, "nvmf", "close_timeout_ms"),
                millis(&s, "nbd", "stop_timeout_ms"),
                millis(&s, "nbd", "close_timeout_ms")
            ),
            (ms(700), ms(800), ms(900), ms(1000))
        );
        let opts = ServeOptions {
            kind_flags: flags(&[
                ("nvmf-drain-timeout-ms", 70),
                ("nvmf-close-timeout-ms", 80),
                ("nbd-stop-timeout-ms", 90),
                ("nbd-close-timeout-ms", 100),
            ]),
            ..ServeOptions::default()
        };
        let s = resolve(&opts, &config).unwrap();
        assert_eq!(
            (
                millis(&s, "nvmf", "drain_timeout_ms"),
                millis(&s, "nvmf", "close_timeout_ms"),
                millis(&s, "nbd", "stop_timeout_ms"),
                millis(&s, "nbd", "close_timeout_ms")
            ),
            (ms(70), ms(80), ms(90), ms(100))
        );
        let d = resolve(&ServeOptions::default(), &ConfigFile::default()).unwrap();
        assert_eq!(
            (
                millis(&d, "nvmf", "drain_timeout_ms"),
                millis(&d, "nvmf", "close_timeout_ms"),
                millis(&d, "nbd", "stop_timeout_ms"),
                millis(&d, "nbd", "close_timeout_ms")
            ),
            (ms(5000), ms(5000), ms(5000), ms(5000))
        );
        for ms in [0, 600_001] {
            for (table, key) in [
                ("nvmf", "drain_timeout_ms"),
                ("nvmf", "close_timeout_ms"),
                ("nbd", "stop_timeout_ms"),
                ("nbd", "close_timeout_ms"),
            ] {
                let text = format!("[{table}]\n{key} = {ms}\n");
                let e = ConfigFile::parse(&text, Path::new("c.toml")).unwrap_err().to_string();
                assert_eq!(e, format!("{table}.{key}: {ms} is not between 1 and 600000"));
            }
            let opts = ServeOptions {
                kind_flags: flags(&[("nbd-close-timeout-ms", ms)]),
                ..ServeOptions::default()
            };
            let e = resolve(&opts, &ConfigFile::default()).unwrap_err().to_string();
            assert_eq!(e, format!("--nbd-close-timeout-ms: {ms} is not between 1 and 600000"));
            let opts = ServeOptions {
                kind_flags: flags(&[("nvmf-drain-timeout-ms", ms)]),
                ..ServeOptions::default()
            };
            let e = resolve(&opts, &ConfigFile::default()).unwrap_err().to_string();
            assert_eq!(e, format!("--nvmf-drain-timeout-ms: {ms} is not between 1 and 600000"));
        }
        let e = ConfigFile::parse("[nbd]\nstop_timeout = 5\n", Path::new("c.toml")).unwrap_err().to_string();
        assert!(e.starts_with("c.toml:2:1: unknown field `stop_timeout`"), "{e}");
    }

    #[test]
    fn bad_cpus_name_their_source() {
        let opts = ServeOptions { cpus: Some("x".into()), ..ServeOptions::default() };
        let e = resolve(&opts, &ConfigFile::default()).unwrap_err().to_string();
        assert!(e.starts_with("--cpus: 'x' is not a cpu number"), "{e}");
    }
}
