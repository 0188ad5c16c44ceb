//! `flashpath top`: a live view of the daemon, one refresh a second.
//!
//! Each refresh takes one sample over the RPC socket (`bdev_get_iostat`, `bdev_get_histogram`
//! for disks with histograms enabled, `framework_get_reactors`); rates are the difference of
//! two consecutive samples over the time between them. QOS shows the requests a disk's QoS
//! limit holds back now and the share of the interval it throttled. A daemon without
//! `bdev_get_iostat` is shown from its vhost controllers' counters instead (no latency or QoS
//! then). NVMe-oF subsystems get a panel of their own from `nvmf_get_stats` (connected
//! controllers and queue pairs now, IOPS and MB/s over their namespaces). `q`, Esc or Ctrl-C
//! quits.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::Path;
use std::time::{Duration, Instant};

use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Row, Table};
use ratatui::Frame;
use serde_json::{json, Value};

use super::session::{CliError, Session};

/// One disk's counters at one instant.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DiskCounters {
    pub read_ops: u64,
    pub write_ops: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Summed latency of reads and writes, in seconds (`None` without the bdev layer).
    pub latency_s: Option<f64>,
    pub queue_depth: u64,
    pub errors: u64,
    /// Requests waiting for the disk's QoS limit now (among `queue_depth`).
    pub qos_queued: u64,
    /// Time the disk's channels held a request back for QoS, summed over channels, in seconds
    /// (`None` without the bdev layer).
    pub qos_throttled_s: Option<f64>,
    /// From the disk's latency histogram, when it is enabled.
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
}

/// One reactor's time counters at one instant, in nanoseconds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReactorCounters {
    pub lcore: u64,
    pub busy_ns: u64,
    pub idle_ns: u64,
    pub sleeping: bool,
}

/// One vhost controller's notification counters at one instant.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ControllerCounters {
    pub completed: u64,
    pub notifications: u64,
    pub kicks: u64,
}

/// One NVMe-oF subsystem at one instant: what is connected now, and its namespaces' counters
/// added up.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SubsystemCounters {
    pub controllers: u64,
    pub qpairs: u64,
    pub read_ops: u64,
    pub write_ops: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub errors: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub at: Instant,
    pub disks: BTreeMap<String, DiskCounters>,
    pub reactors: Vec<ReactorCounters>,
    pub controllers: BTreeMap<String, ControllerCounters>,
    /// NVMe-oF subsystems by NQN.
    pub subsystems: BTreeMap<String, SubsystemCounters>,
}

/// One subsystem's line: what is connected, and per-second rates over the interval.
#[derive(Debug, Clone, PartialEq)]
pub struct SubsystemRow {
    pub nqn: String,
    pub controllers: u64,
    pub qpairs: u64,
    pub iops: f64,
    pub mbps: f64,
    pub errors: u64,
}

/// `row(name, now, before, secs)` for each entry of `cur` (picked by `of`), `before` being its
/// entry in `prev`, or zero for one new since; `secs` is the interval, never zero.
fn rows_between<C: Default, R>(
    prev: &Sample,
    cur: &Sample,
    of: impl Fn(&Sample) -> &BTreeMap<String, C>,
    row: impl Fn(&String, &C, &C, f64) -> R,
) -> Vec<R> {
    let secs = cur.at.duration_since(prev.at).as_secs_f64().max(1e-6);
    let zero = C::default();
    of(cur).iter().map(|(name, c)| row(name, c, of(prev).get(name).unwrap_or(&zero), secs)).collect()
}

/// Per-second rates between two samples; a subsystem new in `cur` counts from zero.
pub fn subsystem_rows(prev: &Sample, cur: &Sample) -> Vec<SubsystemRow> {
    rows_between(
        prev,
        cur,
        |s| &s.subsystems,
        |nqn, c, p, secs| {
            let d = |f: fn(&SubsystemCounters) -> u64| f(c).saturating_sub(f(p)) as f64;
            SubsystemRow {
                nqn: nqn.clone(),
                controllers: c.controllers,
                qpairs: c.qpairs,
                iops: (d(|x| x.read_ops) + d(|x| x.write_ops)) / secs,
                mbps: (d(|x| x.bytes_read) + d(|x| x.bytes_written)) / secs / 1e6,
                errors: c.errors,
            }
        },
    )
}

/// Subsystems from `nvmf_get_stats`.
pub fn subsystems_from(stats: &Value) -> BTreeMap<String, SubsystemCounters> {
    list(&stats["subsystems"])
        .iter()
        .map(|s| {
            let mut c = SubsystemCounters {
                controllers: u64_at(s, "controllers"),
                qpairs: u64_at(s, "qpairs"),
                ..SubsystemCounters::default()
            };
            for ns in list(&s["namespaces"]) {
                c.read_ops += u64_at(ns, "read_ops");
                c.write_ops += u64_at(ns, "write_ops");
                c.bytes_read += u64_at(ns, "bytes_read");
                c.bytes_written += u64_at(ns, "bytes_written");
                c.errors += u64_at(ns, "errors");
            }
            (s["nqn"].as_str().unwrap_or_default().to_string(), c)
        })
        .collect()
}

/// One controller's line: per-second rates over the interval.
#[derive(Debug, Clone, PartialEq)]
pub struct ControllerRow {
    pub name: String,
    pub iops: f64,
    pub notifications: f64,
    pub kicks: f64,
    /// Requests completed per notification in the interval; `None` without notifications.
    pub requests_per_notification: Option<f64>,
}

/// Per-second notification rates between two samples; a controller new in `cur` counts from
/// zero.
pub fn controller_rows(prev: &Sample, cur: &Sample) -> Vec<ControllerRow> {
    rows_between(
        prev,
        cur,
        |s| &s.controllers,
        |name, c, p, secs| {
            let completed = c.completed.saturating_sub(p.completed) as f64;
            let notifications = c.notifications.saturating_sub(p.notifications) as f64;
            ControllerRow {
                name: name.clone(),
                iops: completed / secs,
                notifications: notifications / secs,
                kicks: c.kicks.saturating_sub(p.kicks) as f64 / secs,
                requests_per_notification: (notifications > 0.0).then(|| completed / notifications),
            }
        },
    )
}

/// Controllers from `vhost_get_controllers`.
pub fn controllers_from(ctrls: &Value) -> BTreeMap<String, ControllerCounters> {
    list(ctrls)
        .iter()
        .map(|c| {
            let st = &c["stats"];
            let counters = ControllerCounters {
                completed: u64_at(st, "completed"),
                notifications: u64_at(st, "notifications"),
                kicks: u64_at(st, "kicks"),
            };
            (c["ctrlr"].as_str().unwrap_or_default().to_string(), counters)
        })
        .collect()
}

/// One disk's line on the screen.
#[derive(Debug, Clone, PartialEq)]
pub struct DiskRow {
    pub name: String,
    pub read_iops: f64,
    pub write_iops: f64,
    pub read_mbps: f64,
    pub write_mbps: f64,
    /// Mean latency of the I/Os completed in the interval.
    pub avg_us: Option<f64>,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub queue_depth: u64,
    pub errors: u64,
    pub qos_queued: u64,
    /// The share of the interval the disk's channels spent throttled by QoS, in percent of
    /// one channel (two channels throttled throughout show 200).
    pub qos_throttled_pct: Option<f64>,
}

/// Per-second rates between two samples; a disk new in `cur` counts from zero.
pub fn disk_rows(prev: &Sample, cur: &Sample) -> Vec<DiskRow> {
    rows_between(
        prev,
        cur,
        |s| &s.disks,
        |name, c, p, secs| {
            let d = |f: fn(&DiskCounters) -> u64| f(c).saturating_sub(f(p)) as f64;
            let ops = d(|x| x.read_ops) + d(|x| x.write_ops);
            let avg_us = match (c.latency_s, p.latency_s) {
                (Some(now), before) if ops > 0.0 => Some((now - before.unwrap_or(0.0)) / ops * 1e6),
                _ => None,
            };
            // A reset between the samples counts from zero, as the other counters do.
            let qos_throttled_pct =
                c.qos_throttled_s.map(|now| (now - p.qos_throttled_s.unwrap_or(0.0)).max(0.0) / secs * 100.0);
            DiskRow {
                name: name.clone(),
                read_iops: d(|x| x.read_ops) / secs,
                write_iops: d(|x| x.write_ops) / secs,
                read_mbps: d(|x| x.bytes_read) / secs / 1e6,
                write_mbps: d(|x| x.bytes_written) / secs / 1e6,
                avg_us,
                p50_us: c.p50_us,
                p99_us: c.p99_us,
                queue_depth: c.queue_depth,
                errors: c.errors,
                qos_queued: c.qos_queued,
                qos_throttled_pct,
            }
        },
    )
}

/// Each reactor's busy share of the interval, in percent.
pub fn reactor_busy(prev: &Sample, cur: &Sample) -> Vec<(u64, f64, bool)> {
    cur.reactors
        .iter()
        .map(|r| {
            let p = prev.reactors.iter().find(|x| x.lcore == r.lcore);
            let busy = r.busy_ns.saturating_sub(p.map_or(0, |x| x.busy_ns)) as f64;
            let idle = r.idle_ns.saturating_sub(p.map_or(0, |x| x.idle_ns)) as f64;
            let pct = if busy + idle > 0.0 { 100.0 * busy / (busy + idle) } else { 0.0 };
            (r.lcore, pct, r.sleeping)
        })
        .collect()
}

fn u64_at(v: &Value, key: &str) -> u64 {
    v.get(key).and_then(Value::as_u64).unwrap_or(0)
}

fn list(v: &Value) -> &[Value] {
    v.as_array().map(Vec::as_slice).unwrap_or_default()
}

/// A percentile from `bdev_get_histogram`'s `percentiles_us`, written as `"p99"` or `"99"`.
fn percentile(h: &Value, p: &str) -> Option<f64> {
    let pcts = h.get("percentiles_us")?;
    pcts.get(format!("p{p}")).or_else(|| pcts.get(p)).and_then(Value::as_f64)
}

/// Disks from `bdev_get_iostat` (SPDK's shape).
pub fn disks_from_iostat(io: &Value) -> BTreeMap<String, DiskCounters> {
    let tick_rate = crate::metrics::tick_rate(io);
    list(&io["bdevs"])
        .iter()
        .map(|b| {
            let ticks = u64_at(b, "read_latency_ticks") + u64_at(b, "write_latency_ticks");
            let c = DiskCounters {
                read_ops: u64_at(b, "num_read_ops"),
                write_ops: u64_at(b, "num_write_ops"),
                bytes_read: u64_at(b, "bytes_read"),
                bytes_written: u64_at(b, "bytes_written"),
                latency_s: Some(ticks as f64 / tick_rate),
                queue_depth: u64_at(b, "queue_depth"),
                errors: crate::metrics::io_error_total(b),
                qos_queued: u64_at(b, "qos_queued"),
                qos_throttled_s: Some(u64_at(b, "qos_throttled_ticks") as f64 / tick_rate),
                p50_us: None,
                p99_us: None,
            };
            (b["name"].as_str().unwrap_or_default().to_string(), c)
        })
        .collect()
}

/// Disks from `vhost_get_controllers`: each controller's counters added to its disk's.
pub fn disks_from_controllers(ctrls: &Value) -> BTreeMap<String, DiskCounters> {
    let mut disks: BTreeMap<String, DiskCounters> = BTreeMap::new();
    for c in list(ctrls) {
        let name = c["backend_specific"]["block"]["bdev"].as_str().unwrap_or_default().to_string();
        let st = &c["stats"];
        let d = disks.entry(name).or_default();
        d.read_ops += u64_at(st, "read_ops");
        d.write_ops += u64_at(st, "write_ops");
        d.bytes_read += u64_at(st, "bytes_read");
        d.bytes_written += u64_at(st, "bytes_written");
        d.queue_depth += u64_at(st, "in_flight");
        d.errors += u64_at(st, "io_errors");
    }
    disks
}

pub fn reactors_from(r: &Value) -> Vec<ReactorCounters> {
    list(&r["reactors"])
        .iter()
        .map(|x| ReactorCounters {
            lcore: u64_at(x, "lcore"),
            busy_ns: u64_at(x, "busy"),
            idle_ns: u64_at(x, "idle"),
            sleeping: x["in_interrupt"].as_bool() == Some(true),
        })
        .collect()
}

/// Every disk's counters now, with percentiles where histograms are enabled.
pub fn disk_counters(s: &mut Session) -> Result<BTreeMap<String, DiskCounters>, CliError> {
    let mut disks = match s.call("bdev_get_iostat", None) {
        Ok(io) => disks_from_iostat(&io),
        // A daemon without the bdev layer's statistics: what its controllers counted.
        Err(CliError::Refused { .. }) => disks_from_controllers(&s.call("vhost_get_controllers", None)?),
        Err(e) => return Err(e),
    };
    for (name, d) in disks.iter_mut() {
        // Disks without an enabled histogram refuse; they show no percentiles.
        if let Ok(h) = s.call("bdev_get_histogram", Some(json!({ "name": name }))) {
            d.p50_us = percentile(&h, "50");
            d.p99_us = percentile(&h, "99");
        }
    }
    Ok(disks)
}

/// Takes one sample from the daemon.
fn sample(s: &mut Session) -> Result<Sample, CliError> {
    let disks = disk_counters(s)?;
    let reactors = reactors_from(&s.call("framework_get_reactors", None)?);
    let controllers = controllers_from(&s.call("vhost_get_controllers", None)?);
    // A daemon without the NVMe-oF target has no subsystems to show.
    let subsystems = match s.call("nvmf_get_stats", None) {
        Ok(stats) => subsystems_from(&stats),
        Err(CliError::Refused { .. }) => BTreeMap::new(),
        Err(e) => return Err(e),
    };
    Ok(Sample { at: Instant::now(), disks, reactors, controllers, subsystems })
}

fn us(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_string(), |x| format!("{x:.1}"))
}

/// The QOS cell: requests waiting for the limit now / share of the interval throttled; `-`
/// without the bdev layer, which counts QoS.
fn qos_cell(d: &DiskRow) -> String {
    d.qos_throttled_pct.map_or_else(|| "-".to_string(), |pct| format!("{}/{pct:.0}%", d.qos_queued))
}

/// A column as wide as its widest cell or its header, plus a gap.
fn column_width(cells: impl Iterator<Item = usize>, header: &str) -> u16 {
    cells.max().unwrap_or(0).max(header.len()) as u16 + 2
}

fn draw(
    f: &mut Frame,
    rpc: &Path,
    disks: &[DiskRow],
    ctrls: &[ControllerRow],
    subsystems: &[SubsystemRow],
    reactors: &[(u64, f64, bool)],
) {
    let panel = |rows: usize| if rows == 0 { 0 } else { rows as u16 + 3 };
    let [title, disk_area, ctrl_area, nvmf_area, reactor_area] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(disks.len() as u16 + 3),
        Constraint::Length(panel(ctrls.len())),
        Constraint::Length(panel(subsystems.len())),
        Constraint::Length(reactors.len() as u16 + 3),
    ])
    .areas(f.area());
    f.render_widget(Line::from(format!("flashpath top  rpc {}  refresh 1 s  q quits", rpc.display())), title);
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let qos: Vec<String> = disks.iter().map(qos_cell).collect();
    let rows = disks.iter().zip(&qos).map(|(d, qos)| {
        Row::new(vec![
            d.name.clone(),
            format!("{:.0}", d.read_iops),
            format!("{:.0}", d.write_iops),
            format!("{:.2}", d.read_mbps),
            format!("{:.2}", d.write_mbps),
            us(d.avg_us),
            us(d.p50_us),
            us(d.p99_us),
            d.queue_depth.to_string(),
            qos.clone(),
            d.errors.to_string(),
        ])
    });
    let name_width = column_width(disks.iter().map(|d| d.name.chars().count()), "DISK");
    let qos_width = column_width(qos.iter().map(String::len), "QOS");
    let widths = [
        Constraint::Length(name_width),
        Constraint::Length(9),
        Constraint::Length(9),
        Constraint::Length(9),
        Constraint::Length(9),
        Constraint::Length(9),
        Constraint::Length(9),
        Constraint::Length(9),
        Constraint::Length(5),
        Constraint::Length(qos_width),
        Constraint::Length(6),
    ];
    let header =
        ["DISK", "READ/s", "WRITE/s", "RMB/s", "WMB/s", "AVG us", "P50 us", "P99 us", "QD", "QOS", "ERR"];
    f.render_widget(
        Table::new(rows, widths)
            .header(Row::new(header).style(bold))
            .block(Block::bordered().title(" disks ")),
        disk_area,
    );
    let rows = ctrls.iter().map(|c| {
        Row::new(vec![
            c.name.clone(),
            format!("{:.0}", c.iops),
            format!("{:.0}", c.notifications),
            format!("{:.0}", c.kicks),
            c.requests_per_notification.map_or_else(|| "-".to_string(), |r| format!("{r:.1}")),
        ])
    });
    let widths = [
        Constraint::Length(column_width(ctrls.iter().map(|c| c.name.chars().count()), "CONTROLLER")),
        Constraint::Length(10),
        Constraint::Length(10),
        Constraint::Length(10),
        Constraint::Length(10),
    ];
    let header = ["CONTROLLER", "IO/s", "NOTIFY/s", "KICKS/s", "IO/NOTIFY"];
    f.render_widget(
        Table::new(rows, widths)
            .header(Row::new(header).style(bold))
            .block(Block::bordered().title(" guest notifications ")),
        ctrl_area,
    );
    let rows = subsystems.iter().map(|s| {
        Row::new(vec![
            s.nqn.clone(),
            s.controllers.to_string(),
            s.qpairs.to_string(),
            format!("{:.0}", s.iops),
            format!("{:.2}", s.mbps),
            s.errors.to_string(),
        ])
    });
    let widths = [
        Constraint::Length(column_width(subsystems.iter().map(|s| s.nqn.chars().count()), "SUBSYSTEM")),
        Constraint::Length(7),
        Constraint::Length(7),
        Constraint::Length(10),
        Constraint::Length(9),
        Constraint::Length(6),
    ];
    let header = ["SUBSYSTEM", "CTRLRS", "QPAIRS", "IO/s", "MB/s", "ERR"];
    f.render_widget(
        Table::new(rows, widths)
            .header(Row::new(header).style(bold))
            .block(Block::bordered().title(" nvmf subsystems ")),
        nvmf_area,
    );
    let rows = reactors.iter().map(|(lcore, pct, sleeping)| {
        let state = if *sleeping { "sleeping" } else { "polling" };
        Row::new(vec![lcore.to_string(), format!("{pct:.1}"), state.to_string()])
    });
    let widths = [Constraint::Length(6), Constraint::Length(7), Constraint::Length(10)];
    f.render_widget(
        Table::new(rows, widths)
            .header(Row::new(["CORE", "BUSY%", "STATE"]).style(bold))
            .block(Block::bordered().title(" reactors ")),
        reactor_area,
    );
}

/// How often the screen refreshes.
const REFRESH: Duration = Duration::from_secs(1);

pub fn run(rpc: &Path) -> Result<(), CliError> {
    let mut session = Session::connect(rpc, &[("name", "NAME")])?;
    let mut prev = sample(&mut session)?;
    // Output piped: a one-line error rather than escape codes into the pipe. (crossterm would
    // still find the controlling terminal for its input through /dev/tty.)
    if !std::io::stdout().is_terminal() {
        return Err(CliError::Terminal(std::io::Error::other("standard output is not a terminal")));
    }
    let mut terminal = ratatui::try_init().map_err(CliError::Terminal)?;
    let outcome = (|| -> Result<(), CliError> {
        // The first frame shows totals-free zeroes until the first interval has passed.
        let mut disks = disk_rows(&prev, &prev);
        let mut ctrls = controller_rows(&prev, &prev);
        let mut subsystems = subsystem_rows(&prev, &prev);
        let mut reactors = reactor_busy(&prev, &prev);
        let mut next = Instant::now() + REFRESH;
        loop {
            terminal
                .draw(|f| draw(f, rpc, &disks, &ctrls, &subsystems, &reactors))
                .map_err(CliError::Terminal)?;
            let wait = next.saturating_duration_since(Instant::now());
            if event::poll(wait).map_err(CliError::Terminal)? {
                if let Event::Key(k) = event::read().map_err(CliError::Terminal)? {
                    let ctrl_c = k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL);
                    if k.kind == KeyEventKind::Press
                        && (k.code == KeyCode::Char('q') || k.code == KeyCode::Esc || ctrl_c)
                    {
                        return Ok(());
                    }
                }
                continue;
            }
            let cur = sample(&mut session)?;
            disks = disk_rows(&prev, &cur);
            ctrls = controller_rows(&prev, &cur);
            subsystems = subsystem_rows(&prev, &cur);
            reactors = reactor_busy(&prev, &cur);
            prev = cur;
            next = Instant::now() + REFRESH;
        }
    })();
    ratatui::restore();
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_come_from_consecutive_samples() {
        let t0 = Instant::now();
        let io = |reads: u64, ticks: u64| {
            json!({"tick_rate": 1_000_000u64, "bdevs": [{"name": "d0", "num_read_ops": reads,
                "bytes_read": reads * 4096, "read_latency_ticks": ticks, "queue_depth": 4, "io_error": {"EIO": 1}}]})
        };
        let prev = Sample {
            at: t0,
            disks: disks_from_iostat(&io(100, 1000)),
            reactors: vec![],
            controllers: BTreeMap::new(),
            subsystems: BTreeMap::new(),
        };
        let cur = Sample {
            at: t0 + Duration::from_secs(2),
            disks: disks_from_iostat(&io(300, 3000)),
            reactors: vec![],
            controllers: BTreeMap::new(),
            subsystems: BTreeMap::new(),
        };
        let rows = disk_rows(&prev, &cur);
        assert_eq!(rows.len(), 1);
        let r = &rows[0];
        assert_eq!(r.read_iops, 100.0);
        assert_eq!(r.read_mbps, 200.0 * 4096.0 / 2.0 / 1e6);
        // 2000 ticks at 1 MHz over 200 I/Os: 10 µs each.
        assert!((r.avg_us.unwrap() - 10.0).abs() < 1e-9, "{r:?}");
        assert_eq!((r.queue_depth, r.errors), (4, 1));
        // No limit: nothing held back, shown as numbers (the bdev layer counts QoS).
        assert_eq!((r.qos_queued, r.qos_throttled_pct), (0, Some(0.0)));
        assert_eq!(qos_cell(r), "0/0%");
    }

    /// QOS: requests waiting now, and the throttled time's share of the interval, summed over
    /// channels (two channels throttled for most of it exceed 100 %).
    #[test]
    fn qos_share_of_the_interval() {
        let t0 = Instant::now();
        let io = |queued: u64, throttled_ticks: u64| {
            json!({"tick_rate": 1_000_000u64, "bdevs": [{"name": "d0", "qos_queued": queued,
                "qos_queued_total": 999, "qos_throttled_ticks": throttled_ticks}]})
        };
        let at = |secs: u64, v: Value| Sample {
            at: t0 + Duration::from_secs(secs),
            disks: disks_from_iostat(&v),
            reactors: vec![],
            controllers: BTreeMap::new(),
            subsystems: BTreeMap::new(),
        };
        let (prev, cur) = (at(0, io(0, 250_000)), at(2, io(12, 750_000)));
        assert_eq!(cur.disks["d0"].qos_queued, 12);
        assert_eq!(cur.disks["d0"].qos_throttled_s, Some(0.75));
        let r = &disk_rows(&prev, &cur)[0];
        // 0.5 s throttled over 2 s.
        assert_eq!((r.qos_queued, r.qos_throttled_pct), (12, Some(25.0)));
        assert_eq!(qos_cell(r), "12/25%");
        let r = &disk_rows(&cur, &at(3, io(3, 2_350_000)))[0];
        assert_eq!(qos_cell(r), "3/160%");
        // A reset in between counts from zero rather than going negative.
        let r = &disk_rows(&cur, &at(3, io(0, 0)))[0];
        assert_eq!(qos_cell(r), "0/0%");
        assert_eq!(column_width(["0/0%".len(), "3/160%".len()].into_iter(), "QOS"), 8);
        assert_eq!(column_width(std::iter::empty(), "QOS"), 5);
    }

    #[test]
    fn reactor_busy_share_of_the_interval() {
        let t0 = Instant::now();
        let r = |busy, idle| ReactorCounters { lcore: 3, busy_ns: busy, idle_ns: idle, sleeping: false };
        let prev = Sample {
            at: t0,
            disks: BTreeMap::new(),
            reactors: vec![r(1000, 1000)],
            controllers: BTreeMap::new(),
            subsystems: BTreeMap::new(),
        };
        let cur = Sample {
            at: t0,
            disks: BTreeMap::new(),
            reactors: vec![r(4000, 2000)],
            controllers: BTreeMap::new(),
            subsystems: BTreeMap::new(),
        };
        assert_eq!(reactor_busy(&prev, &cur), [(3, 75.0, false)]);
    }

    #[test]
    fn controllers_add_up_per_disk() {
        let c = json!([
            {"backend_specific": {"block": {"bdev": "d0"}}, "stats": {"read_ops": 2, "in_flight": 1}},
            {"backend_specific": {"block": {"bdev": "d0"}}, "stats": {"read_ops": 3, "in_flight": 2}},
        ]);
        let d = &disks_from_controllers(&c)["d0"];
        assert_eq!((d.read_ops, d.queue_depth, d.latency_s), (5, 3, None));
        let rows = disk_rows(
            &Sample {
                at: Instant::now(),
                disks: BTreeMap::new(),
                reactors: vec![],
                controllers: BTreeMap::new(),
                subsystems: BTreeMap::new(),
            },
            &Sample {
                at: Instant::now(),
                disks: disks_from_controllers(&c),
                reactors: vec![],
                controllers: BTreeMap::new(),
                subsystems: BTreeMap::new(),
            },
        );
        // Controllers know nothing of QoS: no number rather than a made-up zero.
        assert_eq!(qos_cell(&rows[0]), "-");
    }

    #[test]
    fn notification_rates_and_requests_per_notification_come_from_the_interval() {
        let c = |completed: u64, notifications: u64, kicks: u64| json!([{"ctrlr": "vhost.0", "stats": {"completed": completed, "notifications": notifications, "kicks": kicks}}]);
        let t0 = Instant::now();
        let at = |secs: u64, v: Value| Sample {
            at: t0 + Duration::from_secs(secs),
            disks: BTreeMap::new(),
            reactors: vec![],
            controllers: controllers_from(&v),
            subsystems: BTreeMap::new(),
        };
        // Before: 1000 requests over 10 notifications; in the 2 s after, 6400 more over 100.
        let rows = controller_rows(&at(0, c(1000, 10, 4)), &at(2, c(7400, 110, 24)));
        assert_eq!(rows.len(), 1);
        let r = &rows[0];
        assert_eq!((r.name.as_str(), r.iops, r.notifications, r.kicks), ("vhost.0", 3200.0, 50.0, 10.0));
        assert_eq!(r.requests_per_notification, Some(64.0));
        // No notification in the interval: no ratio rather than a division by zero.
        let idle = controller_rows(&at(2, c(7400, 110, 24)), &at(3, c(7400, 110, 24)));
        assert_eq!(idle[0].requests_per_notification, None);
    }

    #[test]
    fn subsystem_rates_add_up_their_namespaces() {
        let stats = |reads: u64, writes: u64| {
            json!({"subsystems": [{"nqn": "nqn.2016-06.io.spdk:cnode1", "controllers": 1, "qpairs": 3,
                "namespaces": [
                    {"nsid": 1, "read_ops": reads, "write_ops": 0, "bytes_read": reads * 4096,
                     "bytes_written": 0, "other_ops": 5, "errors": 1},
                    {"nsid": 2, "read_ops": 0, "write_ops": writes, "bytes_read": 0,
                     "bytes_written": writes * 512, "other_ops": 0, "errors": 2}]}]})
        };
        let t0 = Instant::now();
        let at = |secs: u64, v: Value| Sample {
            at: t0 + Duration::from_secs(secs),
            disks: BTreeMap::new(),
            reactors: vec![],
            controllers: BTreeMap::new(),
            subsystems: subsystems_from(&v),
        };
        let rows = subsystem_rows(&at(0, stats(100, 10)), &at(2, stats(2100, 2010)));
        assert_eq!(rows.len(), 1);
        let r = &rows[0];
        assert_eq!(
            (r.nqn.as_str(), r.controllers, r.qpairs, r.errors),
            ("nqn.2016-06.io.spdk:cnode1", 1, 3, 3)
        );
        // 2000 reads and 2000 writes in 2 s.
        assert_eq!(r.iops, 2000.0);
        assert_eq!(r.mbps, (2000.0 * 4096.0 + 2000.0 * 512.0) / 2.0 / 1e6);
        // A subsystem new in the second sample counts from zero.
        let new = subsystem_rows(&at(0, json!({"subsystems": []})), &at(1, stats(10, 0)));
        assert_eq!(new[0].iops, 10.0);
    }
}
