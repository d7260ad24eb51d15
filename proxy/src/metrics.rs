//! The figures ferro-proxy exports on /metrics, with upstream kube-proxy's metric names, in the
//! Prometheus text format.

use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Duration;

/// A Prometheus histogram with fixed buckets.
#[derive(Debug, Clone)]
pub struct Histogram {
    bounds: Vec<f64>,
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    pub fn new(bounds: Vec<f64>) -> Histogram {
        let n = bounds.len();
        Histogram { bounds, counts: vec![0; n], sum: 0.0, count: 0 }
    }

    /// Upstream's ExponentialBuckets(start, factor, count).
    pub fn exponential(start: f64, factor: f64, count: usize) -> Histogram {
        Histogram::new((0..count).map(|i| start * factor.powi(i as i32)).collect())
    }

    pub fn observe(&mut self, v: f64) {
        for (b, c) in self.bounds.iter().zip(self.counts.iter_mut()) {
            if v <= *b {
                *c += 1;
            }
        }
        self.sum += v;
        self.count += 1;
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    fn write(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {c}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}", self.sum);
        let _ = writeln!(out, "{name}_count {}", self.count);
    }
}

/// Upstream's buckets for network programming latency (0.25 s to 5 min).
fn network_programming_buckets() -> Vec<f64> {
    let mut b = vec![0.25, 0.5];
    b.extend((1..=59).map(f64::from));
    b.extend((0..12).map(|i| 60.0 + 5.0 * f64::from(i)));
    b.extend((0..7).map(|i| 120.0 + 30.0 * f64::from(i)));
    b
}

#[derive(Debug)]
struct Inner {
    sync: Histogram,
    sync_full: Histogram,
    sync_partial: Histogram,
    network_programming: Histogram,
    last_sync_timestamp: f64,
    last_queued_timestamp: f64,
    restore_failures: u64,
    endpoint_changes_total: u64,
    service_changes_total: u64,
    endpoint_changes_pending: u64,
    service_changes_pending: u64,
    rules_total: Vec<(String, u64)>,
    no_local_endpoints: [u64; 2],
    healthz: [u64; 2],
    livez: [u64; 2],
}

/// Every metric, behind one lock (updated once per sync, read per scrape).
#[derive(Debug)]
pub struct Metrics(Mutex<Inner>);

impl Default for Metrics {
    fn default() -> Self {
        Metrics(Mutex::new(Inner {
            sync: Histogram::exponential(0.001, 2.0, 15),
            sync_full: Histogram::exponential(0.001, 2.0, 15),
            sync_partial: Histogram::exponential(0.001, 2.0, 15),
            network_programming: Histogram::new(network_programming_buckets()),
            last_sync_timestamp: 0.0,
            last_queued_timestamp: 0.0,
            restore_failures: 0,
            endpoint_changes_total: 0,
            service_changes_total: 0,
            endpoint_changes_pending: 0,
            service_changes_pending: 0,
            rules_total: Vec::new(),
            no_local_endpoints: [0; 2],
            healthz: [0; 2],
            livez: [0; 2],
        }))
    }
}

fn unix_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

impl Metrics {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A sync finished: its duration, whether it was full, the rules written per table.
    pub fn synced(&self, took: Duration, full: bool, rules: Vec<(String, u64)>) {
        let mut m = self.lock();
        let s = took.as_secs_f64();
        m.sync.observe(s);
        if full {
            m.sync_full.observe(s);
        } else {
            m.sync_partial.observe(s);
        }
        m.last_sync_timestamp = unix_now();
        m.endpoint_changes_pending = 0;
        m.service_changes_pending = 0;
        m.rules_total = rules;
    }

    pub fn restore_failed(&self) {
        self.lock().restore_failures += 1;
    }

    /// A change was queued for the next sync.
    pub fn queued(&self, endpoints: bool) {
        let mut m = self.lock();
        m.last_queued_timestamp = unix_now();
        if endpoints {
            m.endpoint_changes_total += 1;
            m.endpoint_changes_pending += 1;
        } else {
            m.service_changes_total += 1;
            m.service_changes_pending += 1;
        }
    }

    /// From an EndpointSlice's last-change-trigger-time to its rules in the kernel.
    pub fn network_programming(&self, latency: Duration) {
        self.lock().network_programming.observe(latency.as_secs_f64());
    }

    /// Service ports with a Local policy and no local endpoint, by policy (internal, external).
    pub fn no_local_endpoints(&self, internal: u64, external: u64) {
        self.lock().no_local_endpoints = [internal, external];
    }

    /// A /healthz or /livez answer (200 or 503).
    pub fn health_answer(&self, livez: bool, ok: bool) {
        let mut m = self.lock();
        let i = usize::from(!ok);
        if livez {
            m.livez[i] += 1;
        } else {
            m.healthz[i] += 1;
        }
    }

    /// Full syncs recorded so far plus partial ones (tests wait on this).
    pub fn syncs(&self) -> u64 {
        self.lock().sync.count()
    }

    /// The Prometheus text.
    pub fn render(&self) -> String {
        let m = self.lock();
        let mut out = String::with_capacity(8192);
        m.sync.write(&mut out, "kubeproxy_sync_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds");
        m.sync_full.write(&mut out, "kubeproxy_sync_full_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds for full resyncs");
        m.sync_partial.write(&mut out, "kubeproxy_sync_partial_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds for partial resyncs");
        m.network_programming.write(&mut out, "kubeproxy_network_programming_duration_seconds", "In Cluster Network Programming Latency in seconds");
        let gauges = [
            ("kubeproxy_sync_proxy_rules_last_timestamp_seconds", "The last time proxy rules were successfully synced", m.last_sync_timestamp),
            ("kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds", "The last time a sync of proxy rules was queued", m.last_queued_timestamp),
            ("kubeproxy_sync_proxy_rules_endpoint_changes_pending", "Pending proxy rules Endpoint changes", m.endpoint_changes_pending as f64),
            ("kubeproxy_sync_proxy_rules_service_changes_pending", "Pending proxy rules Service changes", m.service_changes_pending as f64),
        ];
        for (name, help, v) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        }
        let counters = [
            ("kubeproxy_sync_proxy_rules_endpoint_changes_total", "Cumulative proxy rules Endpoint changes", m.endpoint_changes_total),
            ("kubeproxy_sync_proxy_rules_service_changes_total", "Cumulative proxy rules Service changes", m.service_changes_total),
            ("kubeproxy_sync_proxy_rules_iptables_restore_failures_total", "Cumulative proxy iptables restore failures", m.restore_failures),
        ];
        for (name, help, v) in counters {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
        }
        let name = "kubeproxy_sync_proxy_rules_no_local_endpoints_total";
        let _ = writeln!(out, "# HELP {name} Number of services with a Local traffic policy and no endpoints\n# TYPE {name} gauge");
        let _ = writeln!(out, "{name}{{traffic_policy=\"internal\"}} {}", m.no_local_endpoints[0]);
        let _ = writeln!(out, "{name}{{traffic_policy=\"external\"}} {}", m.no_local_endpoints[1]);
        if !m.rules_total.is_empty() {
            let name = "kubeproxy_sync_proxy_rules_iptables_total";
            let _ = writeln!(out, "# HELP {name} Total number of iptables rules owned by kube-proxy\n# TYPE {name} gauge");
            for (table, n) in &m.rules_total {
                let _ = writeln!(out, "{name}{{table=\"{table}\"}} {n}");
            }
        }
        for (name, v) in [("kubeproxy_proxy_healthz_total", m.healthz), ("kubeproxy_proxy_livez_total", m.livez)] {
            let _ = writeln!(out, "# HELP {name} Cumulative proxy healthz HTTP status\n# TYPE {name} counter");
            let _ = writeln!(out, "{name}{{code=\"200\"}} {}\n{name}{{code=\"503\"}} {}", v[0], v[1]);
        }
        out
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative() {
        let mut h = Histogram::new(vec![1.0, 2.0]);
        h.observe(0.5);
        h.observe(1.5);
        h.observe(9.0);
        let mut out = String::new();
        h.write(&mut out, "x", "help");
        assert!(out.contains("x_bucket{le=\"1\"} 1\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"2\"} 2\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"+Inf\"} 3\n"), "{out}");
        assert!(out.contains("x_sum 11\n"), "{out}");
    }

    #[test]
    fn upstream_names_are_exported() {
        let m = Metrics::default();
        m.queued(true);
        m.synced(Duration::from_millis(3), true, vec![("nat".into(), 12)]);
        m.synced(Duration::from_millis(1), false, vec![("nat".into(), 12)]);
        let text = m.render();
        for name in [
            "kubeproxy_sync_proxy_rules_duration_seconds_count 2",
            "kubeproxy_sync_full_proxy_rules_duration_seconds_count 1",
            "kubeproxy_sync_partial_proxy_rules_duration_seconds_count 1",
            "kubeproxy_network_programming_duration_seconds_count 0",
            "kubeproxy_sync_proxy_rules_endpoint_changes_total 1",
            "kubeproxy_sync_proxy_rules_endpoint_changes_pending 0",
            "kubeproxy_sync_proxy_rules_iptables_total{table=\"nat\"} 12",
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds ",
        ] {
            assert!(text.contains(name), "{name} missing from\n{text}");
        }
        assert_eq!(m.syncs(), 2);
    }
}
