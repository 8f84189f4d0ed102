//! A cheap metrics recorder for the `(metrics)` rows: counters and gauges are atomics,
//! a histogram is an atomic count and sum. What an exporter adds on top (buckets,
//! quantiles, scraping) is its own cost; this measures what dlm's metrics cost to emit.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use metrics::{
    Counter, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};
use parking_lot::Mutex;

/// A histogram kept as a count and a sum (in nanoseconds of the recorded seconds).
#[derive(Default)]
struct Summary {
    count: AtomicU64,
    sum_ns: AtomicU64,
}

impl HistogramFn for Summary {
    fn record(&self, value: f64) {
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_ns
            .fetch_add((value * 1e9) as u64, Ordering::Relaxed);
    }
}

/// The recorder; registration takes a mutex, emitting through a handle does not.
#[derive(Default)]
pub struct Atomics {
    counters: Mutex<BTreeMap<String, Arc<AtomicU64>>>,
    gauges: Mutex<BTreeMap<String, Arc<AtomicU64>>>,
    histograms: Mutex<BTreeMap<String, Arc<Summary>>>,
}

fn id(key: &Key) -> String {
    let labels: Vec<String> = key
        .labels()
        .map(|l| format!("{}={}", l.key(), l.value()))
        .collect();
    format!("{}{{{}}}", key.name(), labels.join(","))
}

impl Atomics {
    /// One line per metric with a value: counters, and histograms as count and mean.
    pub fn summary(&self) -> String {
        let mut out = String::new();
        for (k, v) in self.counters.lock().iter() {
            let v = v.load(Ordering::Relaxed);
            if v > 0 {
                out.push_str(&format!("  {k} {v}\n"));
            }
        }
        for (k, h) in self.histograms.lock().iter() {
            let n = h.count.load(Ordering::Relaxed);
            if n > 0 {
                let mean = h.sum_ns.load(Ordering::Relaxed) as f64 / n as f64 / 1e3;
                out.push_str(&format!("  {k} count {n}, mean {mean:.1} us\n"));
            }
        }
        out
    }
}

impl Recorder for Atomics {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.counters.lock().entry(id(key)).or_default().clone())
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.gauges.lock().entry(id(key)).or_default().clone())
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.histograms.lock().entry(id(key)).or_default().clone())
    }
}
