//! `serve`: runs the daemon ([`crate::serve`]) with the options of its command line.

use std::path::PathBuf;
use std::process::ExitCode;

use std::collections::BTreeMap;

use crate::serve;
use clap::{Arg, ArgAction, ArgMatches, Args, Command, FromArgMatches};
use fp_registry::exports::all_options;
use fp_registry::exports::{OptionType, OptionValue};

use super::args::u64_arg;

#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// Cores to run reactors on: "0", "0-3", "0,2" or a hex mask "0x3" [default: the first CPU
    /// this process may use]
    #[arg(long, value_name = "LIST")]
    cpus: Option<String>,
    /// Directory for the vhost-user sockets, created if missing [default: /var/tmp/flashpath]
    #[arg(long, value_name = "DIR")]
    vhost_dir: Option<PathBuf>,
    /// TOML file declaring bdevs and controllers to create at start-up
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// How long a reactor keeps polling after its last work before it sleeps [default: 200]
    #[arg(long, value_name = "N", value_parser = u64_arg)]
    idle_window_us: Option<u64>,
    /// Only open file disks inside DIR (repeatable; replaces the config file's
    /// security.export_dirs) [default: any path]
    #[arg(long = "export-dir", value_name = "DIR")]
    export_dirs: Vec<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics: a loopback HOST:PORT such as
    /// 127.0.0.1:9111, or unix:PATH [default: off]
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
    /// Do not count per-disk I/O statistics (bdev_get_iostat, histograms): the frontends use the
    /// backends' channels directly (replaces the config file's stats.iostat)
    #[arg(long)]
    no_iostat: bool,
    /// Keep persistent dirty bitmaps in DIR, which must exist (replaces the config file's
    /// state_dir) [default: none; persistent bitmaps are refused]
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// The export kinds' options (`--nbd-stop-timeout-ms`, ...), built from their declarations.
    #[command(flatten)]
    kind_flags: KindFlags,
}

/// Runs the daemon until it is told to stop; `rpc` is the global `--rpc`.
pub(crate) fn run(args: ServeArgs, rpc: Option<PathBuf>) -> ExitCode {
    let opts = serve::ServeOptions {
        cpus: args.cpus,
        rpc,
        vhost_dir: args.vhost_dir,
        config: args.config,
        idle_window_us: args.idle_window_us,
        export_dirs: (!args.export_dirs.is_empty()).then_some(args.export_dirs),
        metrics: args.metrics,
        no_iostat: args.no_iostat,
        state_dir: args.state_dir,
        kind_flags: args.kind_flags.0,
    };
    match serve::run(&opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e @ serve::ServeError::Config(_)) => {
            // Already reads "config error: ...".
            eprintln!("{e}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The flags of the export kinds' options ([`fp_registry::ExportKind::options`]), one per
/// option that declares one, with its help and default: clap derives flags at compile time, so
/// these are built here from the kinds' list, and a kind's new option needs no change here.
/// Values are checked against the option's range when the daemon resolves them, so the error
/// names the flag as the file's names the key.
#[derive(Debug, Default)]
struct KindFlags(BTreeMap<&'static str, OptionValue>);

impl Args for KindFlags {
    fn augment_args(cmd: Command) -> Command {
        all_options().fold(cmd, |cmd, option| {
            let Some(flag) = option.flag else { return cmd };
            let arg = Arg::new(flag).long(flag);
            cmd.arg(match option.value {
                OptionType::Millis { default, .. } => arg
                    .value_name("MS")
                    .value_parser(u64_arg)
                    .help(format!("{} [default: {default}]", option.help)),
                OptionType::Bool { .. } => arg.action(ArgAction::SetTrue).help(option.help),
            })
        })
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

impl FromArgMatches for KindFlags {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let mut flags = KindFlags::default();
        flags.update_from_arg_matches(matches)?;
        Ok(flags)
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        for option in all_options() {
            let Some(flag) = option.flag else { continue };
            let value = match option.value {
                OptionType::Millis { .. } => matches.get_one::<u64>(flag).map(|&ms| OptionValue::Millis(ms)),
                OptionType::Bool { .. } => matches.get_flag(flag).then_some(OptionValue::Bool(true)),
            };
            if let Some(value) = value {
                self.0.insert(flag, value);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every declared option with a flag is a flag of `serve`, read back as its kind's value:
    /// a number given after it, or a switch given alone.
    #[test]
    fn each_declared_flag_is_built_and_read() {
        let cmd = KindFlags::augment_args(Command::new("serve"));
        let mut argv = vec!["serve".to_string()];
        let mut expected = BTreeMap::new();
        for (n, option) in all_options().enumerate() {
            let Some(flag) = option.flag else { continue };
            assert!(cmd.get_arguments().any(|a| a.get_long() == Some(flag)), "--{flag} missing");
            argv.push(format!("--{flag}"));
            let value = match option.value {
                OptionType::Bool { .. } => OptionValue::Bool(true),
                OptionType::Millis { .. } => {
                    argv.push((n + 10).to_string());
                    OptionValue::Millis(n as u64 + 10)
                }
            };
            expected.insert(flag, value);
        }
        assert!(expected.len() >= 5, "the vhost, nbd and nvmf flags: {expected:?}");
        let matches = cmd.try_get_matches_from(argv).unwrap();
        assert_eq!(KindFlags::from_arg_matches(&matches).unwrap().0, expected);
    }
}
