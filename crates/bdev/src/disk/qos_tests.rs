//! QoS through the disk layer, on this thread's fake clock: two channels (two reactors' queues)
//! share a disk's limit; held requests are never failed or lost; limits change under load;
//! groups share by weight; the statistics count the waits. Exact and untimed.

use super::*;
use crate::clock::ticks::fake;
use crate::qos::{BurstLimit, ThrottleConfig};

/// A flooding client of one channel: keeps `depth` requests in flight.
struct Flood {
    ch: Box<dyn IoChannel>,
    free: Vec<u32>,
    done: u64,
    op: IoOp,
    len: u64,
    /// Submit nothing new (an idle member).
    paused: bool,
}

impl Flood {
    fn new(disk: &Disk, depth: u32, op: IoOp, len: u64) -> Flood {
        Flood { ch: disk.open().unwrap(), free: (0..depth).collect(), done: 0, op, len, paused: false }
    }

    /// Submits whatever is free, then polls once; every completion must be a success.
    fn step(&mut self) {
        while !self.paused {
            let Some(tag) = self.free.pop() else { break };
            submit(&mut self.ch, req(tag, self.op, self.len))
                .expect("a request over a limit waits, never fails");
        }
        let (free, done) = (&mut self.free, &mut self.done);
        self.ch.poll(&mut |tag, status| {
            assert_eq!(status, IoStatus::Success);
            free.push(tag);
            *done += 1;
        });
    }
}

/// Ticks per second of the layer's clock.
fn rate() -> u64 {
    ticks::tick_rate()
}

/// Runs `floods` in rotation from second `from` to `to` in steps of 10 µs of fake time, calling
/// `each` at every step; returns what each completed.
fn run_with(floods: &mut [Flood], from: f64, to: f64, mut each: impl FnMut(u64, &mut [Flood])) -> Vec<u64> {
    let before: Vec<u64> = floods.iter().map(|f| f.done).collect();
    let (start, end, step) = ((from * rate() as f64) as u64, (to * rate() as f64) as u64, rate() / 100_000);
    let (mut t, mut rotation) = (start, 0x9e37_79b9_7f4a_7c15u64);
    while t < end {
        fake::set(Some(t));
        each(t - start, floods);
        // Each round starts with a channel picked at random: reactors are not phase-locked, so
        // none is always first to see a limit's next grant (a fixed rotation would lock onto
        // the grant period).
        rotation ^= rotation << 13;
        rotation ^= rotation >> 7;
        rotation ^= rotation << 17;
        let k = floods.len();
        for j in 0..k {
            floods[(j + rotation as usize) % k].step();
        }
        t += step;
    }
    floods.iter().zip(before).map(|(f, b)| f.done - b).collect()
}

fn run(floods: &mut [Flood], from: f64, to: f64) -> Vec<u64> {
    run_with(floods, from, to, |_, _| {})
}

fn null_disk(name: &str) -> Disk {
    Disk::new(Arc::new(NullDevice::new(name, 512, 1 << 20).unwrap()), true)
}

fn iops(n: u64) -> QosLimits {
    QosLimits { rw_ios_per_sec: n, ..QosLimits::default() }
}

/// Polls until every held request went and completed (no new submissions).
fn drain(floods: &mut [Flood]) {
    for f in floods.iter_mut() {
        f.paused = true;
    }
    for _ in 0..3 {
        floods.iter_mut().for_each(Flood::step);
    }
}

#[test]
fn two_channels_share_one_disk_limit_and_the_waits_are_counted() {
    fake::set(Some(0));
    let disk = null_disk("q0");
    disk.set_qos_limits(iops(1_000)).unwrap();
    let mut f = [Flood::new(&disk, 8, IoOp::Read, 4096), Flood::new(&disk, 8, IoOp::Write, 4096)];
    let n = run(&mut f, 0.0, 1.0);
    let total = n[0] + n[1];
    // The limit's bound from idle: r*W + r*tolerance (2 ms) + one grant per channel.
    assert!((990..=1_004).contains(&total), "{n:?}");
    assert!(n[0].abs_diff(n[1]) <= 100, "the two channels share evenly: {n:?}");
    // Held requests are in flight: each channel keeps its 8.
    let s = disk.stats();
    assert_eq!(s.queue_depth, 16);
    assert!(s.qos.queued > 0 && s.qos.queued <= 16, "{:?}", s.qos);
    assert!(s.qos.queued_total >= total - 20, "nearly every request waited: {:?}", s.qos);
    assert!(s.qos.wait_ticks > s.qos.queued_total * rate() / 1_000, "each waited over a ms: {:?}", s.qos);
    let throttled = s.qos.throttled_ticks as f64 / rate() as f64;
    assert!((1.9..=2.0).contains(&throttled), "both channels throttled the whole second: {throttled}");
    // Removing the limit drains the held requests at the next poll; none is lost.
    disk.set_qos_limits(QosLimits::default()).unwrap();
    drain(&mut f);
    assert_eq!(f[0].free.len() + f[1].free.len(), 16);
    let s = disk.stats();
    assert_eq!((s.queue_depth, s.qos.queued), (0, 0));
    assert_eq!(s.op(IoOp::Read).ops + s.op(IoOp::Write).ops, f[0].done + f[1].done);
    fake::set(None);
}

#[test]
fn a_limit_changed_a_hundred_times_under_load_holds_and_loses_nothing() {
    fake::set(Some(0));
    let disk = null_disk("q1");
    disk.set_qos_limits(iops(2_000)).unwrap();
    let mut f = [Flood::new(&disk, 16, IoOp::Read, 4096), Flood::new(&disk, 16, IoOp::Read, 4096)];
    let ten_ms = rate() / 100;
    let mut changes = 0;
    let n = run_with(&mut f, 0.0, 1.0, |t, _| {
        if t > 0 && t % ten_ms < rate() / 100_000 {
            changes += 1;
            let limit = if changes % 2 == 1 { 5_000 } else { 2_000 };
            disk.set_qos_limits(iops(limit)).unwrap();
        }
    });
    assert_eq!(changes, 99);
    // 50 slices of 10 ms at 2,000/s and 50 at 5,000/s.
    let total = n[0] + n[1];
    assert!((3_400..=3_600).contains(&total), "{n:?}");
    assert_eq!(disk.qos_limits(), iops(5_000));
    disk.set_qos_limits(QosLimits::default()).unwrap();
    drain(&mut f);
    assert_eq!(disk.stats().queue_depth, 0, "every held request went");
    fake::set(None);
}

#[test]
fn a_byte_limit_holds_large_requests_behind_their_turn() {
    fake::set(Some(0));
    let disk = null_disk("q2");
    disk.set_qos_limits(QosLimits { w_mbytes_per_sec: 8, ..QosLimits::default() }).unwrap();
    let mut f = [Flood::new(&disk, 4, IoOp::Write, 128 * 1024), Flood::new(&disk, 4, IoOp::Read, 4096)];
    let n = run(&mut f, 0.0, 1.0);
    // 8 MiB/s of 128 KiB writes is 64 a second; reads are not limited.
    assert!((63..=67).contains(&n[0]), "{n:?}");
    assert!(n[1] > 10_000, "{n:?}");
    fake::set(None);
}

#[test]
fn busy_after_admission_is_held_not_returned_and_not_counted_as_a_qos_wait() {
    fake::set(Some(0));
    let (disk, script) = scripted();
    disk.set_qos_limits(iops(100_000)).unwrap();
    let mut ch = disk.open().unwrap();
    reap(&mut ch); // applies the limit
    script.lock().unwrap().busy = true;
    submit(&mut ch, req(5, IoOp::Read, 512)).unwrap();
    assert_eq!(ch.in_flight(), 1);
    assert_eq!(reap(&mut ch), [], "still busy");
    script.lock().unwrap().busy = false;
    assert_eq!(reap(&mut ch), [(5, IoStatus::Success)]);
    assert_eq!(disk.stats().qos.queued_total, 0);
    fake::set(None);
}

#[test]
fn a_held_request_the_device_then_refuses_completes_with_its_error() {
    fake::set(Some(0));
    let disk = null_disk("q3");
    disk.set_qos_limits(iops(1_000)).unwrap();
    let mut ch = disk.open().unwrap();
    reap(&mut ch);
    // Spend the tolerance, then one out of range waits and fails when its turn comes.
    let mut tag = 0;
    loop {
        submit(&mut ch, req(tag, IoOp::Read, 512)).unwrap();
        if ch.in_flight() > reap(&mut ch).len() {
            break;
        }
        tag += 1;
    }
    submit(&mut ch, IoRequest { offset: 1 << 40, ..req(999, IoOp::Read, 512) }).unwrap();
    fake::set(Some(rate()));
    let mut got = reap(&mut ch);
    got.sort_by_key(|c| c.0);
    assert_eq!(got, [(tag, IoStatus::Success), (999, IoStatus::Error(libc::EINVAL))]);
    assert_eq!(ch.in_flight(), 0);
    assert_eq!(disk.stats().errno[libc::EINVAL as usize], 1);
    fake::set(None);
}

fn group(name: &str, config: ThrottleConfig) -> Arc<QosGroup> {
    let g = Arc::new(QosGroup::new(name, rate()));
    g.set(config, ticks::now()).unwrap();
    g
}

fn iops_total(avg: u64, max: u64, max_length: u64) -> ThrottleConfig {
    ThrottleConfig { iops_total: BurstLimit { avg, max, max_length }, ..ThrottleConfig::default() }
}

fn within(got: u64, want: u64, pct: u64) -> bool {
    got * 100 >= want * (100 - pct) && got * 100 <= want * (100 + pct)
}

#[test]
fn a_group_shares_its_limit_by_weight_and_gives_an_idle_members_share_away() {
    fake::set(Some(0));
    let (a, b) = (null_disk("a"), null_disk("b"));
    let g = group("tenants", iops_total(10_000, 0, 0));
    a.join_qos_group(&g, 3).unwrap();
    b.join_qos_group(&g, 1).unwrap();
    let mut f = [Flood::new(&a, 16, IoOp::Read, 4096), Flood::new(&b, 16, IoOp::Read, 4096)];
    run(&mut f, 0.0, 0.1);
    let n = run(&mut f, 0.1, 1.1);
    assert!(within(n[0], 7_500, 3) && within(n[1], 2_500, 3), "3:1 of 10 K: {n:?}");
    f[1].paused = true;
    run(&mut f, 1.1, 1.2);
    let n = run(&mut f, 1.2, 2.2);
    assert!(within(n[0], 10_000, 3), "B idle, A takes it all: {n:?}");
    let (_, weight, share) = a.qos_group().unwrap();
    assert_eq!(weight, 3);
    assert!(share >= 9_000, "{share}");
    fake::set(None);
}

#[test]
fn weights_hold_through_a_burst_and_after_it() {
    fake::set(Some(0));
    let (a, b) = (null_disk("a"), null_disk("b"));
    // 2,000 average, 8,000 for 1 s.
    let g = group("burst", iops_total(2_000, 8_000, 1));
    a.join_qos_group(&g, 3).unwrap();
    b.join_qos_group(&g, 1).unwrap();
    let mut f = [Flood::new(&a, 16, IoOp::Read, 4096), Flood::new(&b, 16, IoOp::Read, 4096)];
    let burst = run(&mut f, 0.0, 1.0);
    let total = burst[0] + burst[1];
    assert!(within(total, 8_000, 5), "the ceiling for the burst's length: {burst:?}");
    run(&mut f, 1.0, 1.5);
    let n = run(&mut f, 1.5, 3.5);
    assert!(within(n[0] + n[1], 4_000, 3), "then the average: {n:?}");
    assert!(within(n[0], 3_000, 5) && within(n[1], 1_000, 5), "by weight: {n:?}");
    fake::set(None);
}

#[test]
fn a_disk_in_a_group_and_with_its_own_limit_gets_the_tighter() {
    fake::set(Some(0));
    let a = null_disk("a");
    let g = group("g", iops_total(10_000, 0, 0));
    a.join_qos_group(&g, 1).unwrap();
    a.set_qos_limits(iops(2_000)).unwrap();
    let mut f = [Flood::new(&a, 8, IoOp::Read, 4096)];
    let n = run(&mut f, 0.0, 1.0);
    // The group's share starts at 1/s until its first slice (10 ms) ends.
    assert!((1_975..=2_006).contains(&n[0]), "{n:?}");
    a.leave_qos_group("g").unwrap();
    a.set_qos_limits(QosLimits::default()).unwrap();
    let n = run(&mut f, 1.0, 1.01);
    assert!(n[0] > 500, "no limit any more: {n:?}");
    fake::set(None);
}

#[test]
fn settings_are_refused_with_a_reason_and_change_nothing() {
    let off = Disk::new(Arc::new(NullDevice::new("off", 512, 8).unwrap()), false);
    assert_eq!(off.set_qos_limits(iops(5_000)), Err(DiskQosError::AccountingOff));
    let g = group("g", iops_total(10_000, 0, 0));
    assert_eq!(off.join_qos_group(&g, 1), Err(DiskQosError::AccountingOff));
    let d = null_disk("d");
    let e = d.set_qos_limits(iops(999)).unwrap_err();
    assert!(e.to_string().starts_with("rw_ios_per_sec: 999 is below the minimum of 1000"), "{e}");
    assert!(d.qos_limits().is_empty());
    d.join_qos_group(&g, 2).unwrap();
    let h = group("h", iops_total(10_000, 0, 0));
    assert_eq!(d.join_qos_group(&h, 1), Err(DiskQosError::InGroup("g".into())));
    assert_eq!(d.leave_qos_group("h"), Err(DiskQosError::NotInGroup("h".into())));
    assert!(matches!(d.set_qos_weight("g", 0), Err(DiskQosError::Qos(_))));
    assert_eq!(d.qos_group().unwrap().1, 2);
    // A deleted disk's place is free again: 64 members join after many came and went.
    drop(d);
    for i in 0..100 {
        let d = null_disk(&format!("d{i}"));
        d.join_qos_group(&g, 1).unwrap();
    }
}

#[test]
fn a_light_member_that_bunches_its_requests_does_not_wait_beside_a_flooder() {
    fake::set(Some(0));
    let (a, b) = (null_disk("a"), null_disk("b"));
    let g = group("g", iops_total(20_000, 0, 0));
    a.join_qos_group(&g, 1).unwrap();
    b.join_qos_group(&g, 1).unwrap();
    // B: three requests at once every 3 ms (1,000 a second, as a paced guest after a pause).
    let mut f = [Flood::new(&a, 32, IoOp::Read, 4096), Flood::new(&b, 3, IoOp::Read, 4096)];
    let (every, step) = (rate() * 3 / 1000, rate() / 100_000);
    let bunch = |t: u64, f: &mut [Flood]| f[1].paused = t % every >= step;
    run_with(&mut f, 0.0, 0.2, bunch);
    b.reset(ResetMode::All);
    let n = run_with(&mut f, 0.2, 1.2, bunch);
    assert!(within(n[1], 1_000, 1), "B got what it asked: {n:?}");
    assert!(within(n[0], 20_000 - 1_125, 1), "A got the rest but B's headroom: {n:?}");
    let waited = b.stats().qos.queued_total;
    // Without the light member's headroom (a slice) 6 waited here; with it, none.
    assert!(waited <= 2, "B's bunches went at once ({waited} of {} waited)", n[1]);
    fake::set(None);
}
