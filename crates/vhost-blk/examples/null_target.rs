//! A minimal target for profiling the data path without the daemon around it: one reactor on
//! core 0 serving a null (or RAM, with `ram`) bdev at the socket given as the first argument.
//! Runs until stdin closes. Usage: `null_target /tmp/x.sock [ram] [queues]`.

use std::io::Read;
use std::sync::Arc;

use fp_bdev::{Bdev, NullDevice, RamDevice};
use fp_reactor::{ReactorConfig, ReactorSet};
use fp_vhost_blk::{BlkController, ControllerConfig};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).expect("usage: null_target SOCKET [ram] [queues]");
    let bdev: Bdev = if args.get(2).map(String::as_str) == Some("ram") {
        Arc::new(RamDevice::new("ram0", 512, 1 << 21).unwrap())
    } else {
        Arc::new(NullDevice::new("null0", 512, 1 << 21).unwrap())
    };
    let queues = args.get(3).and_then(|q| q.parse().ok()).unwrap_or(1);
    // FP_IDLE_US overrides the idle window, for measuring its effect.
    let mut config = ReactorConfig::default();
    if let Some(us) = std::env::var("FP_IDLE_US").ok().and_then(|v| v.parse().ok()) {
        config.idle_window = std::time::Duration::from_micros(us);
    }
    let reactors = ReactorSet::start(&[0], config).unwrap();
    let ctrl = BlkController::start(ControllerConfig {
        name: "prof".into(),
        socket_path: path.into(),
        bdev,
        reactors: reactors.handles().to_vec(),
        read_only: false,
        num_queues: queues,
        handoff: fp_vhost_blk::HandOff::new(),
        stop_timeout: fp_vhost_blk::DEFAULT_STOP_TIMEOUT,
    })
    .unwrap();
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    let snap = reactors.handles()[0].stats().snapshot();
    eprintln!(
        "reactor: busy {} ns, idle {} ns, sleep {} ns, sleeps {}",
        snap.busy_ns, snap.idle_ns, snap.sleep_ns, snap.sleeps
    );
    eprintln!("{:?}", ctrl.info().stats);
    ctrl.stop();
    reactors.shutdown();
}
