//! Metric families as plain data: what a bdev module ([`crate::BdevModule::metrics`]) or an
//! export kind contributes to a Prometheus scrape, built from the same method results the RPC
//! answers. The daemon's endpoint (the `flashpath` crate) encodes them; nothing here knows the
//! exposition format.

use serde_json::Value;

/// What a module's or export kind's `metrics` reads through: a JSON-RPC method and its
/// parameters to the method's result, `None` when the method is missing or failed (the
/// families it feeds are then left out of that scrape).
pub type MetricsCall<'a> = &'a dyn Fn(&str, Option<Value>) -> Option<Value>;

/// A sample's labels: names are fixed, values come from the RPC results.
pub type Labels = Vec<(&'static str, String)>;

/// Whether a family's samples only grow (counters) or go up and down (gauges).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// Only grows (a count of events since the start).
    Counter,
    /// A value now (a queue depth, a state).
    Gauge,
}

/// One metric family of counters or gauges: its samples by label set. Counter names end in
/// `_total`, as the text format's conventions ask.
#[derive(Debug, Clone)]
pub struct Family {
    /// `flashpath_<subsystem>_<what>`, `_total` for a counter.
    pub name: &'static str,
    /// One line for the `# HELP` comment.
    pub help: &'static str,
    /// Counter or gauge.
    pub kind: MetricKind,
    /// One value per label set.
    pub samples: Vec<(Labels, f64)>,
}

impl Family {
    /// A counter family without samples yet.
    pub fn counter(name: &'static str, help: &'static str) -> Family {
        Family { name, help, kind: MetricKind::Counter, samples: Vec::new() }
    }

    /// A gauge family without samples yet.
    pub fn gauge(name: &'static str, help: &'static str) -> Family {
        Family { name, help, kind: MetricKind::Gauge, samples: Vec::new() }
    }

    /// Adds the sample of the label set `labels`.
    pub fn push(&mut self, labels: Labels, value: impl Into<Sample>) {
        self.samples.push((labels, value.into().0));
    }
}

/// A sample value: counts (exact up to 2^53, far beyond any counter here) and seconds.
pub struct Sample(pub f64);

impl From<u64> for Sample {
    fn from(v: u64) -> Sample {
        Sample(v as f64)
    }
}

impl From<f64> for Sample {
    fn from(v: f64) -> Sample {
        Sample(v)
    }
}

/// `v[key]` as a count, 0 when absent.
pub fn u64_at(v: &Value, key: &str) -> u64 {
    v.get(key).and_then(Value::as_u64).unwrap_or(0)
}

/// `v[key]` as a label value, empty when absent.
pub fn str_at(v: &Value, key: &str) -> String {
    v.get(key).and_then(Value::as_str).unwrap_or_default().to_string()
}

/// `v`'s elements, none when it is not an array.
pub fn array(v: &Value) -> &[Value] {
    v.as_array().map(Vec::as_slice).unwrap_or_default()
}
