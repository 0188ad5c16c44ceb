//! SPDK's own client (`spdk-rpc`, the Python package `spdk` 26.9) drives the lvol methods of
//! issue 26 against the daemon, with SPDK's argument syntax: `bdev_lvol_set_parent`,
//! `bdev_lvol_set_parent_bdev`, `bdev_lvol_clone_bdev`, `bdev_lvol_start_shallow_copy` with
//! `bdev_lvol_check_shallow_copy`, and `bdev_get_iostat --names`. (Longhorn's
//! `bdev_lvol_get_fragmap` is not in SPDK's client; crates/registry/tests/lvol_methods.rs covers
//! it.) The data these methods move is checked there too, in process; here what counts is that
//! SPDK's client and the daemon agree on names, shapes and errors.
//!
//! spdk-rpc is found as tests/spdk_rpc.rs finds it: FLASHPATH_SPDK_RPC, else
//! `<target>/spdk-venv/bin/spdk-rpc`.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::Daemon;
use serde_json::Value;

/// spdk-rpc and the daemon's socket.
struct Client {
    exe: PathBuf,
    sock: PathBuf,
}

impl Client {
    fn new(d: &Daemon) -> Client {
        let exe = std::env::var_os("FLASHPATH_SPDK_RPC").map(PathBuf::from).unwrap_or_else(|| {
            let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| {
                Path::new(env!("CARGO_TARGET_TMPDIR")).parent().expect("target dir").to_path_buf()
            });
            target.join("spdk-venv/bin/spdk-rpc")
        });
        assert!(exe.is_file(), "no spdk-rpc at {} (`./run test` installs it)", exe.display());
        Client { exe, sock: d.rpc.clone() }
    }

    /// `spdk-rpc -s <sock> <args>`: whether it succeeded, and its stdout.
    fn call(&self, args: &[&str]) -> (bool, String) {
        let out = Command::new(&self.exe)
            .arg("-s")
            .arg(&self.sock)
            .args(["-t", "30"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", self.exe.display()));
        let stdout = String::from_utf8_lossy(&out.stdout).trim_end().to_string();
        let stderr = String::from_utf8_lossy(&out.stderr);
        (out.status.success(), format!("{stdout}{}", if out.status.success() { "".into() } else { stderr }))
    }

    fn ok(&self, args: &[&str]) -> String {
        let (ok, out) = self.call(args);
        assert!(ok, "spdk-rpc {} failed:\n{out}", args.join(" "));
        out
    }

    fn json(&self, args: &[&str]) -> Value {
        let out = self.ok(args);
        serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("spdk-rpc {}: not JSON ({e}):\n{out}", args.join(" ")))
    }

    /// Asserts the call failed, with the daemon's message naming `field`.
    fn refused(&self, args: &[&str], field: &str) {
        let (ok, out) = self.call(args);
        assert!(!ok, "spdk-rpc {} succeeded:\n{out}", args.join(" "));
        assert!(
            out.contains(&format!("{field}: ")),
            "spdk-rpc {}: the error does not name {field}:\n{out}",
            args.join(" ")
        );
    }

    fn lvol(&self, name: &str) -> Value {
        let all = self.json(&["bdev_lvol_get_lvols"]);
        all.as_array()
            .unwrap()
            .iter()
            .find(|l| l["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("{name}: {all}"))
    }
}

#[test]
fn set_parent_clone_bdev_and_shallow_copy_through_spdk_rpc() {
    let d = Daemon::start("0");
    let rpc = Client::new(&d);
    rpc.ok(&["bdev_malloc_create", "-b", "Base", "64", "4096"]);
    rpc.ok(&["bdev_lvol_create_lvstore", "-c", "1048576", "Base", "lvs0"]);
    rpc.ok(&["bdev_lvol_create", "-l", "lvs0", "-t", "v", "4"]);
    rpc.ok(&["bdev_lvol_snapshot", "lvs0/v", "snap"]);
    rpc.ok(&["bdev_lvol_create", "-l", "lvs0", "-t", "w", "4"]);

    // set_parent: a thin volume becomes a clone of a snapshot of its size.
    rpc.ok(&["bdev_lvol_set_parent", "lvs0/w", "lvs0/snap"]);
    assert_eq!(rpc.lvol("w")["is_clone"], true);
    rpc.refused(&["bdev_lvol_set_parent", "lvs0/w", "lvs0/snap"], "parent_name");
    rpc.ok(&["bdev_lvol_create", "-l", "lvs0", "thick", "4"]);
    rpc.refused(&["bdev_lvol_set_parent", "lvs0/thick", "lvs0/snap"], "lvol_name");

    // An external snapshot: a malloc bdev cloned, and given to a thin volume as its parent.
    rpc.ok(&["bdev_malloc_create", "-b", "Golden", "4", "4096"]);
    let clone = rpc.ok(&["bdev_lvol_clone_bdev", "Golden", "lvs0", "eclone"]);
    assert_eq!(rpc.json(&["bdev_get_bdevs", "-b", "lvs0/eclone"])[0]["name"], clone.as_str());
    let e = rpc.lvol("eclone");
    assert_eq!((e["is_esnap_clone"].as_bool(), e["is_degraded"].as_bool()), (Some(true), Some(false)));
    rpc.ok(&["bdev_lvol_create", "-l", "lvs0", "-t", "x", "4"]);
    rpc.ok(&["bdev_lvol_set_parent_bdev", "lvs0/x", "Golden"]);
    assert_eq!(rpc.lvol("x")["is_esnap_clone"], true);
    rpc.refused(&["bdev_lvol_set_parent_bdev", "lvs0/thick", "Golden"], "lvol_name");
    rpc.refused(&["bdev_lvol_clone_bdev", "Nope", "lvs0", "c2"], "bdev");

    // Shallow copy of a read-only volume to another bdev, polled to its end.
    rpc.ok(&["bdev_malloc_create", "-b", "Dst", "8", "4096"]);
    rpc.refused(&["bdev_lvol_start_shallow_copy", "lvs0/w", "Dst"], "src_lvol_name");
    rpc.ok(&["bdev_lvol_set_read_only", "lvs0/w"]);
    let started = rpc.json(&["bdev_lvol_start_shallow_copy", "lvs0/w", "Dst"]);
    let id = started["operation_id"].as_u64().expect("an operation id").to_string();
    let t = Instant::now();
    let status = loop {
        let s = rpc.json(&["bdev_lvol_check_shallow_copy", &id]);
        if s["state"] != "in progress" {
            break s;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "{s}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status["state"], "complete", "{status}");
    assert_eq!(status["total_clusters"], status["copied_clusters"]);
    rpc.refused(&["bdev_lvol_check_shallow_copy", "4242"], "operation_id");

    // bdev_get_iostat with SPDK 26's --names; an unknown name is an error naming the field.
    let io = rpc.json(&["bdev_get_iostat", "--names", "Base,lvs0/w"]);
    assert_eq!(io["bdevs"].as_array().map(Vec::len), Some(2), "{io}");
    rpc.refused(&["bdev_get_iostat", "--names", "Base,Nope"], "names");
}
