//! The last two samples of every node and container, and the usage they give, with
//! metrics-server's rules (its storage package):
//!
//! - A scrape round replaces everything: a node or pod missing from it has no metrics until it
//!   is back.
//! - A new point becomes `last`; the old `last` becomes `prev` when the new point is newer.
//!   When the agent answered the same sample again, the older `prev` is kept.
//! - A container that restarted (its start time is not before the stored sample) has no
//!   `prev`: no usage until the next scrape. A container that started between 10 s and one
//!   resolution (15 s) before its first sample gets a `prev` of zero CPU at its start time, so
//!   it has usage after one scrape.
//! - CPU usage is the counter's increase over the window between the two samples, in
//!   nanocores; a counter that went back (a reset) gives no usage for that node or container.
//!   Memory is the last working set.
//! - A pod has metrics when every container it reported has two samples; its timestamp and
//!   window are those of its earliest container sample.

use std::collections::BTreeMap;

use super::parse::{Batch, Point, PodKey};

/// metrics-server's minimum age of a fresh container for a zero-CPU start point.
const FRESH_CONTAINER_MIN_MS: i64 = 10_000;

/// The usage from two samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// The last sample's time (Unix ms).
    pub timestamp_ms: i64,
    /// Between the two samples.
    pub window_ms: i64,
    pub cpu_nano_cores: u64,
    pub memory_bytes: u64,
}

/// A pod's containers' usage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodUsage {
    pub timestamp_ms: i64,
    pub window_ms: i64,
    /// (container name, usage), sorted by name.
    pub containers: Vec<(String, Usage)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Pair {
    last: Point,
    prev: Option<Point>,
}

/// The stored samples.
#[derive(Debug, Clone, Default)]
pub struct Store {
    /// The scrape period (metrics-server's --metric-resolution).
    resolution_ms: i64,
    nodes: BTreeMap<String, Pair>,
    pods: BTreeMap<PodKey, BTreeMap<String, Pair>>,
}

/// `new` after `old` when nothing restarted.
fn follow(new: Point, old: Option<&Pair>) -> Option<Point> {
    let old = old?;
    if new.timestamp_ms > old.last.timestamp_ms {
        Some(old.last)
    } else {
        old.prev.filter(|p| p.timestamp_ms < new.timestamp_ms)
    }
}

/// The usage between `prev` and `last`; None for a counter that went back or no window.
pub fn usage(last: Point, prev: Point) -> Option<Usage> {
    if last.start_ms < prev.start_ms {
        return None;
    }
    let window_ms = last.timestamp_ms.checked_sub(prev.timestamp_ms).filter(|w| *w > 0)?;
    let used = last.cpu_ns.checked_sub(prev.cpu_ns)?;
    let nano_cores = u128::from(used) * 1000 / u128::try_from(window_ms).ok()?;
    Some(Usage {
        timestamp_ms: last.timestamp_ms,
        window_ms,
        cpu_nano_cores: u64::try_from(nano_cores).unwrap_or(u64::MAX),
        memory_bytes: last.memory,
    })
}

impl Store {
    pub fn new(resolution_ms: i64) -> Store {
        Store { resolution_ms, ..Default::default() }
    }

    /// Stores one scrape round: the batch of every node that answered.
    pub fn store(&mut self, round: &BTreeMap<String, Batch>) {
        let mut nodes = BTreeMap::new();
        let mut pods: BTreeMap<PodKey, BTreeMap<String, Pair>> = BTreeMap::new();
        for (name, batch) in round {
            if let Some(new) = batch.node {
                nodes.insert(name.clone(), Pair { last: new, prev: follow(new, self.nodes.get(name)) });
            }
            for (pod, containers) in &batch.pods {
                if pods.contains_key(pod) {
                    tracing::warn!(namespace = %pod.0, pod = %pod.1, node = %name, "the pod is reported by two nodes; keeping the first");
                    continue;
                }
                let old = self.pods.get(pod);
                let mut out = BTreeMap::new();
                for (c, new) in containers {
                    let age = new.timestamp_ms - new.start_ms;
                    let prev = if new.start_ms < new.timestamp_ms && age < self.resolution_ms && age >= FRESH_CONTAINER_MIN_MS {
                        // started within the last resolution: from zero at its start
                        Some(Point { timestamp_ms: new.start_ms, cpu_ns: 0, ..*new })
                    } else {
                        old.and_then(|o| o.get(c))
                            .filter(|o| new.start_ms < o.last.timestamp_ms)
                            .and_then(|o| follow(*new, Some(o)))
                    };
                    out.insert(c.clone(), Pair { last: *new, prev });
                }
                pods.insert(pod.clone(), out);
            }
        }
        self.nodes = nodes;
        self.pods = pods;
    }

    /// The node's usage, once it has two samples.
    pub fn node(&self, name: &str) -> Option<Usage> {
        let p = self.nodes.get(name)?;
        usage(p.last, p.prev?)
    }

    /// The pod's usage, once every container it reported has two samples.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<PodUsage> {
        let containers = self.pods.get(&(namespace.to_string(), name.to_string()))?;
        let mut out = Vec::new();
        let mut earliest: Option<Usage> = None;
        for (c, pair) in containers {
            let prev = pair.prev?;
            // A reset counter leaves this container out, not the pod.
            let Some(u) = usage(pair.last, prev) else { continue };
            if earliest.is_none_or(|e| u.timestamp_ms < e.timestamp_ms) {
                earliest = Some(u);
            }
            out.push((c.clone(), u));
        }
        let e = earliest?;
        Some(PodUsage { timestamp_ms: e.timestamp_ms, window_ms: e.window_ms, containers: out })
    }

    /// The pods that have samples (for listing).
    pub fn pod_keys(&self) -> impl Iterator<Item = &PodKey> {
        self.pods.keys()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const RES: i64 = 15_000;

    fn p(start_ms: i64, timestamp_ms: i64, cpu_ns: u64, memory: u64) -> Point {
        Point { start_ms, timestamp_ms, cpu_ns, memory }
    }

    fn round(node: Option<Point>, containers: &[(&str, &str, Point)]) -> BTreeMap<String, Batch> {
        let mut b = Batch { node, pods: BTreeMap::new() };
        for (pod, c, point) in containers {
            b.pods.entry(("ns".to_string(), pod.to_string())).or_default().insert(c.to_string(), *point);
        }
        BTreeMap::from([("n1".to_string(), b)])
    }

    #[test]
    fn rates_from_two_samples() {
        let mut s = Store::new(RES);
        s.store(&round(Some(p(0, 100_000, 10_000_000_000, 500)), &[("web", "app", p(1_000, 100_000, 1_000_000_000, 7))]));
        assert_eq!(s.node("n1"), None, "one sample: no rate yet");
        assert_eq!(s.pod("ns", "web"), None);
        // 15 s later: the node used 3 s of CPU (200m), the container 1.5 s (100m).
        s.store(&round(Some(p(0, 115_000, 13_000_000_000, 600)), &[("web", "app", p(1_000, 115_000, 2_500_000_000, 9))]));
        assert_eq!(s.node("n1"), Some(Usage { timestamp_ms: 115_000, window_ms: 15_000, cpu_nano_cores: 200_000_000, memory_bytes: 600 }));
        let pod = s.pod("ns", "web").unwrap();
        assert_eq!((pod.timestamp_ms, pod.window_ms), (115_000, 15_000));
        assert_eq!(pod.containers, vec![("app".to_string(), Usage { timestamp_ms: 115_000, window_ms: 15_000, cpu_nano_cores: 100_000_000, memory_bytes: 9 })]);
        // The same sample answered again (the agent's cache): the window stays.
        s.store(&round(Some(p(0, 115_000, 13_000_000_000, 650)), &[("web", "app", p(1_000, 115_000, 2_500_000_000, 9))]));
        assert_eq!(s.node("n1").unwrap().window_ms, 15_000);
        assert_eq!(s.node("n1").unwrap().memory_bytes, 650);
        assert_eq!(s.pod("ns", "web").unwrap().window_ms, 15_000);
    }

    #[test]
    fn a_counter_reset_gives_no_usage_until_the_next_sample() {
        let mut s = Store::new(RES);
        s.store(&round(Some(p(0, 100_000, 50_000_000_000, 1)), &[]));
        s.store(&round(Some(p(0, 115_000, 1_000_000_000, 1)), &[]));
        assert_eq!(s.node("n1"), None, "the counter went back (the node rebooted)");
        s.store(&round(Some(p(0, 130_000, 4_000_000_000, 1)), &[]));
        assert_eq!(s.node("n1").unwrap().cpu_nano_cores, 200_000_000);
    }

    #[test]
    fn a_restarted_container_waits_for_two_samples_of_the_new_one() {
        let mut s = Store::new(RES);
        s.store(&round(None, &[("web", "app", p(1_000, 100_000, 9_000_000_000, 5))]));
        s.store(&round(None, &[("web", "app", p(1_000, 115_000, 10_000_000_000, 5))]));
        assert!(s.pod("ns", "web").is_some());
        // Restarted 2 s before the scrape (a new container: its counter starts again).
        s.store(&round(None, &[("web", "app", p(128_000, 130_000, 100_000_000, 5))]));
        assert_eq!(s.pod("ns", "web"), None, "no prev for a restarted container");
        s.store(&round(None, &[("web", "app", p(128_000, 145_000, 1_600_000_000, 5))]));
        assert_eq!(s.pod("ns", "web").unwrap().containers[0].1.cpu_nano_cores, 100_000_000);
    }

    #[test]
    fn a_fresh_container_counts_from_its_start() {
        let mut s = Store::new(RES);
        // Started 12 s before its first sample: usage at once, over 12 s from zero.
        s.store(&round(None, &[("web", "app", p(88_000, 100_000, 1_200_000_000, 5))]));
        let u = s.pod("ns", "web").unwrap();
        assert_eq!((u.window_ms, u.containers[0].1.cpu_nano_cores), (12_000, 100_000_000));
        // Started 5 s before: too short a window.
        let mut s = Store::new(RES);
        s.store(&round(None, &[("web", "app", p(95_000, 100_000, 500_000_000, 5))]));
        assert_eq!(s.pod("ns", "web"), None);
    }

    #[test]
    fn a_pod_needs_all_its_containers_and_disappears_with_its_node() {
        let mut s = Store::new(RES);
        s.store(&round(None, &[("web", "app", p(1_000, 100_000, 1_000_000_000, 5))]));
        s.store(&round(
            None,
            &[("web", "app", p(1_000, 115_000, 2_000_000_000, 5)), ("web", "sidecar", p(1_000, 115_000, 1, 5))],
        ));
        assert_eq!(s.pod("ns", "web"), None, "the sidecar has one sample");
        s.store(&round(
            None,
            &[("web", "app", p(1_000, 130_000, 3_000_000_000, 5)), ("web", "sidecar", p(1_000, 129_000, 1, 5))],
        ));
        let u = s.pod("ns", "web").unwrap();
        assert_eq!(u.containers.len(), 2);
        assert_eq!((u.timestamp_ms, u.window_ms), (129_000, 14_000), "the earliest container sample");
        s.store(&BTreeMap::new());
        assert_eq!(s.pod("ns", "web"), None, "the node did not answer this round");
        assert_eq!(s.pod_keys().count(), 0);
    }

    #[test]
    fn usage_arithmetic() {
        assert_eq!(usage(p(0, 10, 5, 1), p(0, 10, 1, 1)), None, "no window");
        assert_eq!(usage(p(0, 20, 5, 1), p(5, 10, 1, 1)), None, "start time went back");
        let u = usage(p(0, 2_000, 3_000_000_000, 1), p(0, 1_000, 1_000_000_000, 1)).unwrap();
        assert_eq!(u.cpu_nano_cores, 2_000_000_000, "two cores");
    }
}
