//! Reading an agent's `/metrics/resource` (the kubelet's resource metrics, Prometheus text)
//! into one [`Batch`] of points, as metrics-server decodes it: the node's cumulative CPU and
//! working set, each container's cumulative CPU, working set and start time. Points missing a
//! value or a timestamp are dropped (a container without its start time too), so a batch only
//! holds what a rate can be computed from.

use std::collections::BTreeMap;

/// One sample of a node or a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Point {
    /// When the container (or node) started; 0 when unknown (nodes).
    pub start_ms: i64,
    /// When the CPU counter was read (Unix milliseconds, the sample's timestamp).
    pub timestamp_ms: i64,
    /// Cumulative CPU time in core-nanoseconds.
    pub cpu_ns: u64,
    /// Working set in bytes.
    pub memory: u64,
}

/// (namespace, pod)
pub type PodKey = (String, String);

/// One scrape of one node.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Batch {
    pub node: Option<Point>,
    /// Containers by pod, by container name.
    pub pods: BTreeMap<PodKey, BTreeMap<String, Point>>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Partial {
    start_ms: Option<i64>,
    cpu: Option<(u64, i64)>,
    memory: Option<(u64, i64)>,
}

impl Partial {
    fn point(self) -> Option<Point> {
        let (cpu_ns, timestamp_ms) = self.cpu?;
        let (memory, _) = self.memory?;
        Some(Point { start_ms: self.start_ms.unwrap_or(0), timestamp_ms, cpu_ns, memory })
    }
}

/// A sample line: name, labels, value, optional timestamp (ms).
type Sample<'a> = (&'a str, BTreeMap<String, String>, f64, Option<i64>);

fn sample(line: &str) -> Option<Sample<'_>> {
    let (name, rest) = match line.find(['{', ' ']) {
        Some(i) => line.split_at(i),
        None => return None,
    };
    let mut labels = BTreeMap::new();
    let rest = if let Some(body) = rest.strip_prefix('{') {
        let mut chars = body.char_indices();
        // key="value" pairs, values with \" \\ \n escapes
        let mut key = String::new();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '}' => break i + 1,
                ',' | ' ' => {}
                '=' => {
                    let (_, q) = chars.next()?;
                    if q != '"' {
                        return None;
                    }
                    let mut value = String::new();
                    loop {
                        let (_, c) = chars.next()?;
                        match c {
                            '"' => break,
                            '\\' => match chars.next()?.1 {
                                'n' => value.push('\n'),
                                other => value.push(other),
                            },
                            other => value.push(other),
                        }
                    }
                    labels.insert(std::mem::take(&mut key), value);
                }
                other => key.push(other),
            }
        };
        &body[end..]
    } else {
        rest
    };
    let mut fields = rest.split_whitespace();
    let value: f64 = match fields.next()? {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    let ts = fields.next().and_then(|t| t.parse().ok());
    Some((name, labels, value, ts))
}

fn ns_of(seconds: f64) -> Option<u64> {
    // as metrics-server: uint64(value * 1e9)
    (seconds.is_finite() && seconds >= 0.0).then_some((seconds * 1e9) as u64)
}

fn bytes_of(v: f64) -> Option<u64> {
    (v.is_finite() && v >= 0.0).then_some(v as u64)
}

/// Parses the text; unknown families and malformed lines are skipped.
pub fn parse(text: &str) -> Batch {
    let mut node = Partial::default();
    let mut containers: BTreeMap<(PodKey, String), Partial> = BTreeMap::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let Some((name, labels, value, ts)) = sample(line) else { continue };
        let container = || -> Option<(PodKey, String)> {
            let get = |k: &str| labels.get(k).filter(|v| !v.is_empty()).cloned();
            Some(((get("namespace")?, get("pod")?), get("container")?))
        };
        match name {
            "node_cpu_usage_seconds_total" => node.cpu = ns_of(value).zip(ts),
            "node_memory_working_set_bytes" => node.memory = bytes_of(value).zip(ts),
            "container_cpu_usage_seconds_total" => {
                if let (Some(k), Some(v), Some(ts)) = (container(), ns_of(value), ts) {
                    containers.entry(k).or_default().cpu = Some((v, ts));
                }
            }
            "container_memory_working_set_bytes" => {
                if let (Some(k), Some(v), Some(ts)) = (container(), bytes_of(value), ts) {
                    containers.entry(k).or_default().memory = Some((v, ts));
                }
            }
            "container_start_time_seconds" => {
                if let Some(k) = container() {
                    if value.is_finite() && value > 0.0 {
                        containers.entry(k).or_default().start_ms = Some((value * 1000.0) as i64);
                    }
                }
            }
            _ => {}
        }
    }
    let mut batch = Batch { node: node.point(), pods: BTreeMap::new() };
    for ((pod, container), p) in containers {
        if p.start_ms.is_none() {
            continue;
        }
        if let Some(point) = p.point() {
            batch.pods.entry(pod).or_default().insert(container, point);
        }
    }
    batch
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// What ferro-agent's /metrics/resource answers (the text its renderer's test expects, from
    /// containerd's answers recorded in the lab).
    pub(crate) const AGENT_TEXT: &str = "\
# HELP container_cpu_usage_seconds_total [STABLE] Cumulative cpu time consumed by the container in core-seconds
# TYPE container_cpu_usage_seconds_total counter
container_cpu_usage_seconds_total{container=\"burner\",namespace=\"top\",pod=\"burner\"} 13.927836532 1795724440629
container_cpu_usage_seconds_total{container=\"holder\",namespace=\"top\",pod=\"holder\"} 0.033904112 1795724440632
container_cpu_usage_seconds_total{container=\"idle\",namespace=\"top\",pod=\"idle\"} 0.013807825 1795724440631
container_cpu_usage_seconds_total{container=\"log\",namespace=\"top\",pod=\"idle\"} 0.001 1795724440631
# HELP container_memory_working_set_bytes [STABLE] Current working set of the container in bytes
# TYPE container_memory_working_set_bytes gauge
container_memory_working_set_bytes{container=\"burner\",namespace=\"top\",pod=\"burner\"} 225280 1795724440629
container_memory_working_set_bytes{container=\"holder\",namespace=\"top\",pod=\"holder\"} 5.1007488e+07 1795724440632
container_memory_working_set_bytes{container=\"idle\",namespace=\"top\",pod=\"idle\"} 454656 1795724440631
container_memory_working_set_bytes{container=\"log\",namespace=\"top\",pod=\"idle\"} 4096 1795724440631
# HELP container_start_time_seconds [STABLE] Start time of the container since unix epoch in seconds
# TYPE container_start_time_seconds gauge
container_start_time_seconds{container=\"burner\",namespace=\"top\",pod=\"burner\"} 1.795724426327186e+09
container_start_time_seconds{container=\"holder\",namespace=\"top\",pod=\"holder\"} 1.7957244267681177e+09
container_start_time_seconds{container=\"idle\",namespace=\"top\",pod=\"idle\"} 1.795724426522202e+09
container_start_time_seconds{container=\"log\",namespace=\"top\",pod=\"idle\"} 1.79572442653e+09
# HELP node_cpu_usage_seconds_total [STABLE] Cumulative cpu time consumed by the node in core-seconds
# TYPE node_cpu_usage_seconds_total counter
node_cpu_usage_seconds_total 68499.753009072 1795724440650
# HELP node_memory_working_set_bytes [STABLE] Current working set of the node in bytes
# TYPE node_memory_working_set_bytes gauge
node_memory_working_set_bytes 6.035972096e+09 1795724440650
# HELP pod_cpu_usage_seconds_total [STABLE] Cumulative cpu time consumed by the pod in core-seconds
# TYPE pod_cpu_usage_seconds_total counter
pod_cpu_usage_seconds_total{namespace=\"top\",pod=\"burner\"} 13.963244063 1795724440646
pod_cpu_usage_seconds_total{namespace=\"top\",pod=\"holder\"} 0.053501045 1795724440637
pod_cpu_usage_seconds_total{namespace=\"top\",pod=\"idle\"} 0.014807825 1795724440631
# HELP pod_memory_working_set_bytes [STABLE] Current working set of the pod in bytes
# TYPE pod_memory_working_set_bytes gauge
pod_memory_working_set_bytes{namespace=\"top\",pod=\"burner\"} 503808 1795724440646
pod_memory_working_set_bytes{namespace=\"top\",pod=\"holder\"} 5.1781632e+07 1795724440637
pod_memory_working_set_bytes{namespace=\"top\",pod=\"idle\"} 458752 1795724440631
# HELP resource_scrape_error [STABLE] 1 if there was an error while getting container metrics, 0 otherwise
# TYPE resource_scrape_error gauge
resource_scrape_error 0
";

    #[test]
    fn parses_the_agents_text() {
        let b = parse(AGENT_TEXT);
        let node = b.node.unwrap();
        assert_eq!(node.timestamp_ms, 1_795_724_440_650);
        // seconds * 1e9 truncated, as metrics-server converts (68499.753009072 * 1e9 is
        // 68499753009071.99... in floating point)
        assert_eq!(node.cpu_ns, 68_499_753_009_071);
        assert_eq!(node.memory, 6_035_972_096);
        assert_eq!(b.pods.len(), 3);
        let burner = b.pods[&("top".to_string(), "burner".to_string())]["burner"];
        assert_eq!(burner, Point { start_ms: 1_795_724_426_327, timestamp_ms: 1_795_724_440_629, cpu_ns: 13_927_836_532, memory: 225_280 });
        let idle = &b.pods[&("top".to_string(), "idle".to_string())];
        assert_eq!(idle.keys().collect::<Vec<_>>(), ["idle", "log"]);
        assert_eq!(b.pods[&("top".to_string(), "holder".to_string())]["holder"].memory, 51_007_488);
    }

    #[test]
    fn incomplete_points_and_odd_lines_are_dropped() {
        let text = "\
container_cpu_usage_seconds_total{container=\"a\",namespace=\"n\",pod=\"p\"} 1 1000
container_memory_working_set_bytes{container=\"a\",namespace=\"n\",pod=\"p\"} 10 1000
container_cpu_usage_seconds_total{container=\"b\",namespace=\"n\",pod=\"p\"} 1 1000
container_memory_working_set_bytes{container=\"b\",namespace=\"n\",pod=\"p\"} 10 1000
container_start_time_seconds{container=\"b\",namespace=\"n\",pod=\"p\"} 5
container_cpu_usage_seconds_total{container=\"c\",namespace=\"n\",pod=\"p\"} 1
container_memory_working_set_bytes{container=\"c\",namespace=\"n\",pod=\"p\"} 10 1000
container_start_time_seconds{container=\"c\",namespace=\"n\",pod=\"p\"} 5
container_cpu_usage_seconds_total{container=\"d\",namespace=\"n\"} 1 1000
weird line
node_cpu_usage_seconds_total 3 1000
container_start_time_seconds{container=\"q\\\"x\",namespace=\"n\",pod=\"p\"} 5
";
        let b = parse(text);
        assert_eq!(b.node, None, "no node memory: no node point");
        let p = &b.pods[&("n".to_string(), "p".to_string())];
        // a: no start time; c: no CPU timestamp; d: no pod label; q: no usage
        assert_eq!(p.keys().collect::<Vec<_>>(), ["b"]);
        assert_eq!(p["b"], Point { start_ms: 5000, timestamp_ms: 1000, cpu_ns: 1_000_000_000, memory: 10 });
        assert_eq!(parse(""), Batch::default());
    }
}
