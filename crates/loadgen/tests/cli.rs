//! `fp-load`'s command line without a device: bad multi-disk arguments give a one-line
//! message naming the disk and the key, exit status 2, and connect to nothing.

use std::process::{Command, Output};

fn fp_load(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fp-load")).args(args).output().expect("running fp-load")
}

/// Exit status 2 and one line on stderr containing every one of `want`.
fn refused(args: &[&str], want: &[&str]) {
    let out = fp_load(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert!(out.stdout.is_empty(), "{args:?} printed {:?}", String::from_utf8_lossy(&out.stdout));
    for w in want {
        assert!(err.contains(w), "{args:?}: {w:?} not in {err:?}");
    }
}

#[test]
fn bad_disks_are_refused_with_the_key_named() {
    refused(&["--disk", "socket=/nonexistent/a,qd=deep"], &["--disk 'socket=/nonexistent/a,qd=deep'", "qd:"]);
    refused(&["--disk", "socket=/nonexistent/a", "--disk", "qd=4"], &["--disk 'qd=4'", "socket: missing"]);
    refused(&["--disk", "socket=/nonexistent/a,colour=red"], &["colour: unknown key"]);
    refused(&["--disk", "socket=/nonexistent/a,qd=0"], &["queue depth 0"]);
    // The global options are the defaults of every disk, and are checked there.
    refused(&["--bs", "1000", "--disk", "socket=/nonexistent/a"], &["block size 1000"]);
    let out = fp_load(&["--disk", "socket=x,qd=deep"]);
    assert_eq!(String::from_utf8_lossy(&out.stderr).lines().count(), 1, "one line: {out:?}");
}

#[test]
fn a_socket_and_disks_do_not_mix_and_one_is_needed() {
    let out = fp_load(&["--socket", "/nonexistent/a", "--disk", "socket=/nonexistent/b"]);
    assert_eq!(out.status.code(), Some(2));
    let out = fp_load(&["--qd", "4"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--socket"));
}

#[test]
fn job_files_name_the_line() {
    let dir = std::env::temp_dir().join(format!("fp-load-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let job = dir.join("noisy.job");
    std::fs::write(&job, "# noisy neighbour\nsocket=/nonexistent/a,qd=128\n\nsocket=/nonexistent/b,bs=4q\n")
        .unwrap();
    let j = job.to_str().unwrap();
    refused(&["--job", j], &["noisy.job line 4", "bs:"]);
    std::fs::write(&job, "# nothing\n\n").unwrap();
    refused(&["--job", j], &["no disks"]);
    refused(&["--job", dir.join("missing.job").to_str().unwrap()], &["missing.job"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_disk_that_cannot_connect_is_named() {
    let out =
        fp_load(&["--time", "100ms", "--disk", "socket=/nonexistent/a", "--disk", "socket=/nonexistent/b"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("disk 0 (/nonexistent/a)") && err.contains("connect"), "{err}");
}

#[test]
fn a_timeline_needs_a_positive_interval_that_the_run_does_not_dwarf() {
    refused(
        &["--timeline", "0s", "--disk", "socket=/nonexistent/a"],
        &["timeline interval must be positive"],
    );
    refused(
        &["--time", "10m", "--timeline", "0.1ms", "--disk", "socket=/nonexistent/a"],
        &["6000000 intervals"],
    );
    refused(&["--timeline", "soon", "--disk", "socket=/nonexistent/a"], &["--timeline"]);
}
