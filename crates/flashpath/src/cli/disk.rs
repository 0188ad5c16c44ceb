//! `disk create|list|delete|resize`: block devices, each made by one bdev module.
//!
//! The types `disk create --type` offers are the bdev modules the daemon is built with
//! ([`MODULES`]), less those whose disks are made otherwise; a module is shown by a name for
//! people where its own says little (`ram` for `malloc`). A new module thus appears here
//! without editing the CLI: its disks are made by `bdev_<module>_create` with a name and a size.

use std::path::{Path, PathBuf};

use crate::size::{self, format_size};
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use clap::{Args, Subcommand};
use fp_registry::modules::MODULES;
use serde_json::{json, Map, Value};

use super::args::{u32_arg, u64_arg};
use super::session::{
    cell, fetch_list, one_call, out, print_json, set_given, table, u64_field, usage, whole_mib, CliError,
    Session, MIB,
};

#[derive(Debug, Subcommand)]
pub(crate) enum DiskCommand {
    /// Create a disk
    Create(DiskCreateArgs),
    /// List disks (or show one)
    List { name: Option<String> },
    /// Delete a disk
    Delete { name: String },
    /// Change a disk's size (ram, null and rbd disks, volumes; an rbd image is resized too)
    Resize {
        name: String,
        /// The new size, e.g. 2G (K/M/G/T are powers of 1024)
        #[arg(long, value_parser = size::parse_size)]
        size: u64,
    },
}

#[derive(Debug, Args)]
pub(crate) struct DiskCreateArgs {
    /// What backs the disk
    #[arg(long = "type", value_name = "TYPE", value_parser = DiskType::parser())]
    kind: DiskType,
    #[arg(long, help = "Disk name [ram: default Malloc<N>; rbd: Ceph<N>]")]
    name: Option<String>,
    /// Size, e.g. 512MiB, 1G, 4096 (K/M/G/T are powers of 1024)
    #[arg(long, value_parser = size::parse_size, conflicts_with = "num_blocks")]
    size: Option<u64>,
    /// Size in blocks
    #[arg(long, value_name = "N", value_parser = u64_arg)]
    num_blocks: Option<u64>,
    /// Block size in bytes [default: 512; file: the device's logical block size]
    #[arg(long, value_name = "BYTES", value_parser = u32_arg)]
    block_size: Option<u32>,
    /// The backing file or block device (--type file)
    #[arg(long, value_name = "FILE")]
    path: Option<PathBuf>,
    /// Use the page cache instead of O_DIRECT (--type file)
    #[arg(long)]
    no_direct: bool,
    /// The Ceph pool that holds the image (--type rbd)
    #[arg(long, value_name = "POOL")]
    pool: Option<String>,
    /// The RBD image (--type rbd)
    #[arg(long, value_name = "IMAGE")]
    image: Option<String>,
    /// A cluster added with `rbd cluster add` (--type rbd) [default: a connection of the
    /// disk's own, from /etc/ceph/ceph.conf]
    #[arg(long, value_name = "NAME")]
    cluster: Option<String>,
    /// Open the image read-only (--type rbd)
    #[arg(long)]
    read_only: bool,
}

/// How the CLI shows a module: the name `--type` takes and what it is, for `--help`.
struct Shown {
    module: &'static str,
    name: &'static str,
    about: &'static str,
}

/// The modules with a description, and a name for people where theirs says little; the rest
/// go by their own name, without one.
const SHOWN: &[Shown] = &[
    Shown { module: "null", name: "null", about: "Discards writes, reads leave buffers as they are" },
    Shown { module: "malloc", name: "ram", about: "A RAM disk" },
    Shown { module: "uring", name: "file", about: "A file or block device through io_uring" },
    Shown { module: "rbd", name: "rbd", about: "A Ceph RBD image" },
];

/// Configurable modules `disk create` does not offer: a delay disk stacks on another disk with
/// latencies this command has no options for (`flashpath rpc bdev_delay_create` makes one).
/// Modules that are not configurable (logical volumes: `volume create`) are left out too, and
/// so are remote NBD exports, which `nbd-client attach` makes (they take an address, not a size),
/// and raids, error disks and crypto disks, which are made of other disks (`raid create`,
/// `error create`, `crypto create`).
const NOT_OFFERED: &[&str] = &["delay", "crypto", "error", "nbd_client", "raid"];

/// The modules `disk create --type` offers, in [`MODULES`]' order.
fn offered() -> impl Iterator<Item = &'static str> {
    MODULES.iter().filter(|m| m.configurable() && !NOT_OFFERED.contains(&m.name())).map(|m| m.name())
}

/// A kind of disk `disk create` makes: the module that makes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DiskType {
    module: &'static str,
}

impl DiskType {
    /// The name `--type` takes.
    fn name(self) -> &'static str {
        shown(self.module).map_or(self.module, |s| s.name)
    }

    /// `--type`'s values, each with its help.
    fn parser() -> impl TypedValueParser<Value = DiskType> {
        let values = offered().map(|module| {
            let about = shown(module).map_or(String::new(), |s| format!("{} ", s.about));
            PossibleValue::new(DiskType { module }.name()).help(format!("{about}(bdev type \"{module}\")"))
        });
        PossibleValuesParser::new(values).map(|name| {
            let module = offered().find(|&module| DiskType { module }.name() == name);
            DiskType { module: module.expect("clap accepts only the names offered") }
        })
    }
}

fn shown(module: &str) -> Option<&'static Shown> {
    SHOWN.iter().find(|s| s.module == module)
}

/// The CLI's name for a driver.
fn disk_type_name(driver: &str) -> &str {
    shown(driver).map_or(driver, |s| s.name)
}

/// The bdev's driver: the one key of its `driver_specific` object.
fn driver_of(bdev: &Value) -> Option<&str> {
    bdev.get("driver_specific")?.as_object()?.keys().next().map(String::as_str)
}

pub(crate) fn run(rpc: &Path, json: bool, command: DiskCommand) -> Result<(), CliError> {
    match command {
        DiskCommand::Create(args) => disk_create(rpc, json, args),
        DiskCommand::List { name } => disk_list(rpc, json, name),
        DiskCommand::Delete { name } => disk_delete(rpc, json, &name),
        DiskCommand::Resize { name, size } => disk_resize(rpc, json, &name, size),
    }
}

/// The options only `--type rbd` takes, as (given, option).
fn rbd_options(a: &DiskCreateArgs) -> [(bool, &'static str); 4] {
    [
        (a.pool.is_some(), "--pool"),
        (a.image.is_some(), "--image"),
        (a.cluster.is_some(), "--cluster"),
        (a.read_only, "--read-only"),
    ]
}

fn disk_create(rpc: &Path, json: bool, a: DiskCreateArgs) -> Result<(), CliError> {
    if a.kind.module != "rbd" {
        if let Some((_, flag)) = rbd_options(&a).iter().find(|(given, _)| *given) {
            return Err(usage(flag, "only used with --type rbd"));
        }
    }
    let mut params = Map::new();
    match a.kind.module {
        "rbd" => return rbd_disk_create(rpc, json, a),
        "uring" => {
            if a.size.is_some() {
                return Err(usage("--size", "not used with --type file: the disk has the file's size"));
            }
            if a.num_blocks.is_some() {
                return Err(usage("--num-blocks", "not used with --type file: the disk has the file's size"));
            }
            let name = a.name.ok_or_else(|| usage("--name", "required for --type file"))?;
            let path = a.path.ok_or_else(|| usage("--path", "required for --type file"))?;
            // The daemon resolves relative paths against its own working directory, not ours.
            let path = std::path::absolute(&path).unwrap_or(path);
            params.insert("name".into(), json!(name));
            params.insert("filename".into(), json!(path));
            if let Some(bs) = a.block_size {
                params.insert("block_size".into(), json!(bs));
            }
            params.insert("direct".into(), json!(!a.no_direct));
        }
        // The others (RAM and null disks, and any module added later) take SPDK's name,
        // num_blocks and block_size.
        module => {
            let kind = a.kind.name();
            if a.path.is_some() {
                return Err(usage("--path", "only used with --type file"));
            }
            if a.no_direct {
                return Err(usage("--no-direct", "only used with --type file"));
            }
            let block_size = a.block_size.unwrap_or(512);
            let num_blocks = match (a.size, a.num_blocks) {
                (_, Some(n)) => n,
                (Some(size), None) if block_size != 0 && size % u64::from(block_size) == 0 => {
                    size / u64::from(block_size)
                }
                (Some(size), None) => {
                    return Err(usage(
                        "--size",
                        format!("{size} bytes is not a whole number of {block_size}-byte blocks"),
                    ))
                }
                (None, None) => {
                    return Err(usage("--size", format!("required for --type {kind} (or --num-blocks)")))
                }
            };
            match (&a.name, module) {
                (Some(name), _) => {
                    params.insert("name".into(), json!(name));
                }
                (None, "null") => return Err(usage("--name", "required for --type null")),
                // RAM disks without a name get SPDK's Malloc<N>.
                (None, _) => {}
            }
            params.insert("num_blocks".into(), json!(num_blocks));
            params.insert("block_size".into(), json!(block_size));
        }
    }
    let method = format!("bdev_{}_create", a.kind.module);
    // num_blocks is what the user wrote as --size or as --num-blocks.
    let flags: &'static [(&str, &str)] = if a.size.is_some() {
        &[
            ("name", "--name"),
            ("num_blocks", "--size"),
            ("block_size", "--block-size"),
            ("filename", "--path"),
        ]
    } else {
        &[
            ("name", "--name"),
            ("num_blocks", "--num-blocks"),
            ("block_size", "--block-size"),
            ("filename", "--path"),
        ]
    };
    let name = Session::connect(rpc, flags)?.call(&method, Some(Value::Object(params)))?;
    if json {
        print_json(&name);
    } else {
        out(name.as_str().unwrap_or_default());
    }
    Ok(())
}

/// `disk create --type rbd`: `bdev_rbd_create` on a registered cluster (`--cluster`) or on a
/// connection of the disk's own (the daemon's /etc/ceph/ceph.conf).
fn rbd_disk_create(rpc: &Path, json: bool, a: DiskCreateArgs) -> Result<(), CliError> {
    let sized = "not used with --type rbd: the disk has the image's size (disk resize changes it)";
    if a.size.is_some() {
        return Err(usage("--size", sized));
    }
    if a.num_blocks.is_some() {
        return Err(usage("--num-blocks", sized));
    }
    if a.path.is_some() {
        return Err(usage("--path", "only used with --type file"));
    }
    if a.no_direct {
        return Err(usage("--no-direct", "only used with --type file"));
    }
    let pool = a.pool.ok_or_else(|| usage("--pool", "required for --type rbd"))?;
    let image = a.image.ok_or_else(|| usage("--image", "required for --type rbd"))?;
    let mut params = json!({ "pool_name": pool, "rbd_name": image });
    // Without a name the daemon picks SPDK's Ceph<N>.
    set_given(&mut params, "name", a.name);
    set_given(&mut params, "cluster_name", a.cluster);
    set_given(&mut params, "block_size", a.block_size);
    if a.read_only {
        params["read_only"] = json!(true);
    }
    let flags = &[
        ("name", "--name"),
        ("pool_name", "--pool"),
        ("rbd_name", "--image"),
        ("cluster_name", "--cluster"),
        ("block_size", "--block-size"),
    ];
    one_call(rpc, json, flags, "bdev_rbd_create", params)
}

fn disk_list(rpc: &Path, json: bool, name: Option<String>) -> Result<(), CliError> {
    let Some(list) = fetch_list(rpc, json, "bdev_get_bdevs", name)? else { return Ok(()) };
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|b| {
            let driver = driver_of(b).unwrap_or("-");
            let detail = b["driver_specific"][driver]
                .as_object()
                .map(|m| {
                    m.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or(&v.to_string()))).collect()
                })
                .unwrap_or_else(Vec::new)
                .join(" ");
            let size = u64_field(b, "block_size").saturating_mul(u64_field(b, "num_blocks"));
            vec![
                cell(b, "name"),
                disk_type_name(driver).to_string(),
                format_size(size),
                cell(b, "block_size"),
                cell(b, "num_blocks"),
                cell(b, "claimed_by"),
                detail,
            ]
        })
        .collect();
    out(&table(&["NAME", "TYPE", "SIZE", "BLOCK", "BLOCKS", "USED BY", "DETAIL"], &rows));
    Ok(())
}

fn disk_delete(rpc: &Path, json: bool, name: &str) -> Result<(), CliError> {
    let mut s = Session::connect(rpc, &[("name", "NAME")])?;
    let found = s.call("bdev_get_bdevs", Some(json!({ "name": name })))?;
    let driver = found
        .get(0)
        .and_then(driver_of)
        .ok_or_else(|| CliError::Unexpected { method: "bdev_get_bdevs", result: found.clone() })?;
    let r = s.call(&format!("bdev_{driver}_delete"), Some(json!({ "name": name })))?;
    if json {
        print_json(&r);
    }
    Ok(())
}

/// `disk resize`: the resize method of the disk's module. Sizes go in MiB when whole (SPDK's
/// `new_size`), else in bytes (flashpath's `new_size_bytes`).
fn disk_resize(rpc: &Path, json: bool, name: &str, size: u64) -> Result<(), CliError> {
    let mut s = Session::connect(
        rpc,
        &[("name", "NAME"), ("new_size", "--size"), ("new_size_bytes", "--size"), ("size_in_mib", "--size")],
    )?;
    let found = s.call("bdev_get_bdevs", Some(json!({ "name": name })))?;
    let driver = found
        .get(0)
        .and_then(driver_of)
        .ok_or_else(|| CliError::Unexpected { method: "bdev_get_bdevs", result: found.clone() })?;
    let (method, params) = match driver {
        "lvol" => ("bdev_lvol_resize".to_string(), json!({ "name": name, "size_in_mib": whole_mib(size)? })),
        "null" | "malloc" | "rbd" if size % MIB == 0 => {
            (format!("bdev_{driver}_resize"), json!({ "name": name, "new_size": size / MIB }))
        }
        "null" | "malloc" | "rbd" => {
            (format!("bdev_{driver}_resize"), json!({ "name": name, "new_size_bytes": size }))
        }
        "uring" => {
            return Err(CliError::Refused {
                message: format!(
                    "disk '{name}' is a file disk, which has its file's size: grow the file, then \
                     run `flashpath rpc bdev_uring_rescan '{{\"name\": \"{name}\"}}'`"
                ),
            })
        }
        other => {
            let kind = disk_type_name(other);
            return Err(CliError::Refused {
                message: format!("disk '{name}' is a {kind} disk, which cannot be resized"),
            });
        }
    };
    let r = s.call(&method, Some(params))?;
    if json {
        print_json(&r);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_names() {
        let b = json!({"driver_specific": {"uring": {"filename": "/x"}}});
        assert_eq!(driver_of(&b), Some("uring"));
        assert_eq!(disk_type_name("uring"), "file");
        assert_eq!(disk_type_name("malloc"), "ram");
        assert_eq!(disk_type_name("null"), "null");
    }

    /// `--type` offers every configurable module but those made otherwise, each under one
    /// name, and the names for people are of modules that exist.
    #[test]
    fn types_come_from_the_modules() {
        let offered: Vec<&str> = offered().collect();
        for m in MODULES {
            let want = m.configurable() && !NOT_OFFERED.contains(&m.name());
            assert_eq!(offered.contains(&m.name()), want, "{}", m.name());
        }
        for s in SHOWN {
            assert!(MODULES.iter().any(|m| m.name() == s.module), "{} is no module", s.module);
        }
        let mut names: Vec<&str> = offered.iter().map(|&module| DiskType { module }.name()).collect();
        assert_eq!(names, ["null", "ram", "file", "rbd"]);
        names.dedup();
        assert_eq!(names.len(), offered.len());
    }
}
