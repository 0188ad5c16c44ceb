//! Metric families as plain data: what each export kind contributes to a Prometheus scrape
//! ([`crate::exports::ExportKind::metrics`]), built from the same method results the RPC
//! answers. The daemon's endpoint (the `flashpath` crate) encodes them; nothing here knows
//! the exposition format.

use serde_json::Value;

/// A disk's latency histogram as `bdev_get_histogram` encodes it, for the endpoint to re-bucket.
pub use fp_bdev::disk::{bucket_end, Histogram};

/// A sample's labels: names are fixed, values come from the RPC results.
pub type Labels = Vec<(&'static str, String)>;

/// Whether a family's samples only grow (counters) or go up and down (gauges).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    Counter,
    Gauge,
}

/// One metric family of counters or gauges: its samples by label set. Counter names end in
/// `_total`, as the text format's conventions ask.
#[derive(Debug, Clone)]
pub struct Family {
    pub name: &'static str,
    pub help: &'static str,
    pub kind: MetricKind,
    pub samples: Vec<(Labels, f64)>,
}

impl Family {
    pub fn counter(name: &'static str, help: &'static str) -> Family {
        Family { name, help, kind: MetricKind::Counter, samples: Vec::new() }
    }

    pub fn gauge(name: &'static str, help: &'static str) -> Family {
        Family { name, help, kind: MetricKind::Gauge, samples: Vec::new() }
    }

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
