//! Prometheus metrics in upstream's names, kept in process-wide families and rendered in the
//! text exposition format (0.0.4).
//!
//! - [`Histogram`] with fixed buckets, lock-free to observe;
//! - [`CounterVec`] / [`HistogramVec`]: families keyed by their label values;
//! - the work queues' families (client-go's `workqueue_*`), filled by [`crate::WorkQueue`] once
//!   [`crate::spawn_workers`] names the queue.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

/// A histogram with fixed upper bounds (seconds, usually).
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    count: AtomicU64,
    /// The sum in nanounits, so that it can be added atomically.
    sum_nanos: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum_nanos: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, v: f64) {
        if let Some(i) = self.bounds.iter().position(|b| v <= *b) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_nanos.fetch_add((v.max(0.0) * 1e9) as u64, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Appends `<name>_bucket{labels,le=..}`, `_sum`, `_count` lines.
    pub fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0;
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            cumulative += c.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{}\"}} {cumulative}", fmt_float(*b));
        }
        let count = self.count();
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {count}");
        let braces = if labels.is_empty() { String::new() } else { format!("{{{labels}}}") };
        let _ = writeln!(out, "{name}_sum{braces} {}", fmt_float(self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9));
        let _ = writeln!(out, "{name}_count{braces} {count}");
    }
}

fn fmt_float(f: f64) -> String {
    if f.fract() == 0.0 && f.abs() < 1e15 {
        format!("{}", f as i64)
    } else {
        format!("{f}")
    }
}

/// Escapes a label value (backslash, quote, newline).
pub fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// `a="x",b="y"` from names and values.
pub fn labels(names: &[&str], values: &[String]) -> String {
    names.iter().zip(values).map(|(n, v)| format!("{n}=\"{}\"", escape(v))).collect::<Vec<_>>().join(",")
}

/// A counter family.
pub struct CounterVec {
    pub name: &'static str,
    pub help: &'static str,
    pub label_names: &'static [&'static str],
    values: Mutex<BTreeMap<Vec<String>, u64>>,
}

impl CounterVec {
    pub const fn new(name: &'static str, help: &'static str, label_names: &'static [&'static str]) -> CounterVec {
        CounterVec { name, help, label_names, values: Mutex::new(BTreeMap::new()) }
    }

    pub fn inc(&self, values: &[&str]) {
        self.add(values, 1);
    }

    pub fn add(&self, values: &[&str], n: u64) {
        let key: Vec<String> = values.iter().map(|v| v.to_string()).collect();
        *self.values.lock().unwrap_or_else(|p| p.into_inner()).entry(key).or_insert(0) += n;
    }

    pub fn get(&self, values: &[&str]) -> u64 {
        let key: Vec<String> = values.iter().map(|v| v.to_string()).collect();
        self.values.lock().unwrap_or_else(|p| p.into_inner()).get(&key).copied().unwrap_or(0)
    }

    pub fn render(&self, out: &mut String) {
        let _ = writeln!(out, "# HELP {} {}", self.name, self.help);
        let _ = writeln!(out, "# TYPE {} counter", self.name);
        for (k, v) in self.values.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let _ = writeln!(out, "{}{{{}}} {v}", self.name, labels(self.label_names, k));
        }
    }
}

/// A histogram family.
pub struct HistogramVec {
    pub name: &'static str,
    pub help: &'static str,
    pub label_names: &'static [&'static str],
    pub bounds: &'static [f64],
    values: Mutex<BTreeMap<Vec<String>, Arc<Histogram>>>,
}

impl HistogramVec {
    pub const fn new(name: &'static str, help: &'static str, label_names: &'static [&'static str], bounds: &'static [f64]) -> HistogramVec {
        HistogramVec { name, help, label_names, bounds, values: Mutex::new(BTreeMap::new()) }
    }

    pub fn with(&self, values: &[&str]) -> Arc<Histogram> {
        let key: Vec<String> = values.iter().map(|v| v.to_string()).collect();
        self.values.lock().unwrap_or_else(|p| p.into_inner()).entry(key).or_insert_with(|| Arc::new(Histogram::new(self.bounds))).clone()
    }

    pub fn observe(&self, values: &[&str], v: f64) {
        self.with(values).observe(v);
    }

    pub fn render(&self, out: &mut String) {
        let _ = writeln!(out, "# HELP {} {}", self.name, self.help);
        let _ = writeln!(out, "# TYPE {} histogram", self.name);
        for (k, h) in self.values.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            h.render(out, self.name, &labels(self.label_names, k));
        }
    }
}

/// client-go's work queue duration buckets: 10 ns to 1000 s, powers of ten.
pub const QUEUE_BUCKETS: &[f64] = &[1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0, 1000.0];

/// The metrics of one named work queue.
pub struct QueueMetrics {
    pub adds: AtomicU64,
    pub retries: AtomicU64,
    pub queue_duration: Histogram,
    pub work_duration: Histogram,
    depth: Mutex<Option<Box<dyn Fn() -> usize + Send + Sync>>>,
}

static QUEUES: LazyLock<Mutex<BTreeMap<&'static str, Arc<QueueMetrics>>>> = LazyLock::new(Default::default);

/// The metrics of the queue named `name` (created on first use).
pub fn queue(name: &'static str) -> Arc<QueueMetrics> {
    QUEUES
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(name)
        .or_insert_with(|| {
            Arc::new(QueueMetrics {
                adds: AtomicU64::new(0),
                retries: AtomicU64::new(0),
                queue_duration: Histogram::new(QUEUE_BUCKETS),
                work_duration: Histogram::new(QUEUE_BUCKETS),
                depth: Mutex::new(None),
            })
        })
        .clone()
}

impl QueueMetrics {
    pub fn set_depth(&self, f: impl Fn() -> usize + Send + Sync + 'static) {
        *self.depth.lock().unwrap_or_else(|p| p.into_inner()) = Some(Box::new(f));
    }

    fn depth(&self) -> usize {
        self.depth.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(|f| f()).unwrap_or(0)
    }
}

/// client-go's `workqueue_*` families for every named queue.
pub fn render_queues(out: &mut String) {
    let queues: Vec<(&'static str, Arc<QueueMetrics>)> = QUEUES.lock().unwrap_or_else(|p| p.into_inner()).iter().map(|(k, v)| (*k, v.clone())).collect();
    if queues.is_empty() {
        return;
    }
    let _ = writeln!(out, "# HELP workqueue_depth Current depth of workqueue");
    let _ = writeln!(out, "# TYPE workqueue_depth gauge");
    for (n, q) in &queues {
        let _ = writeln!(out, "workqueue_depth{{name=\"{n}\"}} {}", q.depth());
    }
    let _ = writeln!(out, "# HELP workqueue_adds_total Total number of adds handled by workqueue");
    let _ = writeln!(out, "# TYPE workqueue_adds_total counter");
    for (n, q) in &queues {
        let _ = writeln!(out, "workqueue_adds_total{{name=\"{n}\"}} {}", q.adds.load(Ordering::Relaxed));
    }
    let _ = writeln!(out, "# HELP workqueue_retries_total Total number of retries handled by workqueue");
    let _ = writeln!(out, "# TYPE workqueue_retries_total counter");
    for (n, q) in &queues {
        let _ = writeln!(out, "workqueue_retries_total{{name=\"{n}\"}} {}", q.retries.load(Ordering::Relaxed));
    }
    let _ = writeln!(out, "# HELP workqueue_queue_duration_seconds How long in seconds an item stays in workqueue before being requested.");
    let _ = writeln!(out, "# TYPE workqueue_queue_duration_seconds histogram");
    for (n, q) in &queues {
        q.queue_duration.render(out, "workqueue_queue_duration_seconds", &format!("name=\"{n}\""));
    }
    let _ = writeln!(out, "# HELP workqueue_work_duration_seconds How long in seconds processing an item from workqueue takes.");
    let _ = writeln!(out, "# TYPE workqueue_work_duration_seconds histogram");
    for (n, q) in &queues {
        q.work_duration.render(out, "workqueue_work_duration_seconds", &format!("name=\"{n}\""));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_render_cumulative_buckets() {
        static B: &[f64] = &[0.1, 1.0];
        let h = Histogram::new(B);
        h.observe(0.05);
        h.observe(0.5);
        h.observe(5.0);
        let mut s = String::new();
        h.render(&mut s, "x_seconds", "verb=\"GET\"");
        assert_eq!(
            s,
            "x_seconds_bucket{verb=\"GET\",le=\"0.1\"} 1\nx_seconds_bucket{verb=\"GET\",le=\"1\"} 2\nx_seconds_bucket{verb=\"GET\",le=\"+Inf\"} 3\nx_seconds_sum{verb=\"GET\"} 5.55\nx_seconds_count{verb=\"GET\"} 3\n"
        );
    }

    #[test]
    fn counters_render_per_label_set() {
        static C: CounterVec = CounterVec::new("t_total", "help", &["code", "verb"]);
        C.inc(&["200", "GET"]);
        C.inc(&["200", "GET"]);
        C.inc(&["404", "GET"]);
        let mut s = String::new();
        C.render(&mut s);
        assert!(s.contains("t_total{code=\"200\",verb=\"GET\"} 2\n"), "{s}");
        assert!(s.contains("t_total{code=\"404\",verb=\"GET\"} 1\n"), "{s}");
        assert_eq!(escape("a\"b\\"), "a\\\"b\\\\");
    }
}
