//! The two renderings of a [`Summary`]: `/metrics/resource` (Prometheus text as the kubelet's
//! resource metrics collector writes it) and `/stats/summary` (the Summary API's JSON,
//! stats/v1alpha1).
//!
//! The Prometheus text follows what the kubelet's registry gathers: families sorted by name,
//! each with `# HELP` (with the stability level, `[STABLE]`) and `# TYPE`, samples sorted by
//! their label values, label names in alphabetical order, values as Go's
//! `strconv.FormatFloat(v, 'g', -1, 64)`, CPU and memory samples stamped with the time of
//! their measurement in milliseconds. Families without samples are left out. The deprecated
//! `scrape_error` is hidden since Kubernetes 1.30 (deprecated in 1.29), so only
//! `resource_scrape_error` is written.

use std::fmt::Write as _;

use serde_json::{json, Map, Value};

use super::model::{ContainerStats, CpuStats, FsStats, InterfaceStats, MemoryStats, NetworkStats, PodStats, Summary};

/// A float as Go's `strconv.FormatFloat(v, 'g', -1, 64)`: the shortest digits that read back
/// as `v`, in exponent form (`1.6203776e+07`) when the decimal exponent is below -4 or 6 and
/// more (Go decides with precision 6 when printing the shortest digits).
pub fn go_float(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "+Inf".into() } else { "-Inf".into() };
    }
    if v == 0.0 {
        return if v.is_sign_negative() { "-0".into() } else { "0".into() };
    }
    // Rust's `{:e}` gives the shortest round-tripping digits: "1.6203776e7".
    let e = format!("{v:e}");
    let Some((mantissa, exp)) = e.split_once('e') else { return e };
    let Ok(exp) = exp.parse::<i32>() else { return e };
    if !(-4..6).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.unsigned_abs())
    } else {
        // Rust's `{}` prints the same shortest digits without an exponent.
        format!("{v}")
    }
}

/// A label value escaped as the text format requires.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn ms(ns: i64) -> i64 {
    ns.div_euclid(1_000_000)
}

fn seconds(core_ns: u64) -> f64 {
    // as upstream: float64(ns) / float64(time.Second)
    core_ns as f64 / 1e9
}

struct Family {
    name: &'static str,
    help: &'static str,
    kind: &'static str,
    /// (sorted label values, rendered sample line)
    samples: Vec<(Vec<String>, String)>,
}

impl Family {
    fn new(name: &'static str, kind: &'static str, help: &'static str) -> Family {
        Family { name, help, kind, samples: Vec::new() }
    }

    /// Adds a sample; `labels` in alphabetical order of their names.
    fn add(&mut self, labels: &[(&str, &str)], value: f64, time_ns: Option<i64>) {
        let mut line = String::from(self.name);
        if !labels.is_empty() {
            line.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    line.push(',');
                }
                let _ = write!(line, "{k}=\"{}\"", escape(v));
            }
            line.push('}');
        }
        let _ = write!(line, " {}", go_float(value));
        if let Some(t) = time_ns {
            let _ = write!(line, " {}", ms(t));
        }
        self.samples.push((labels.iter().map(|(_, v)| v.to_string()).collect(), line));
    }

    fn write(mut self, out: &mut String) {
        if self.samples.is_empty() {
            return;
        }
        self.samples.sort_by(|a, b| a.0.cmp(&b.0));
        let _ = writeln!(out, "# HELP {} [STABLE] {}", self.name, self.help);
        let _ = writeln!(out, "# TYPE {} {}", self.name, self.kind);
        for (_, line) in self.samples {
            out.push_str(&line);
            out.push('\n');
        }
    }
}

fn cpu_seconds(c: Option<CpuStats>) -> Option<(f64, i64)> {
    let c = c?;
    Some((seconds(c.usage_core_nano_seconds?), c.time_ns))
}

fn working_set(m: Option<MemoryStats>) -> Option<(f64, i64)> {
    let m = m?;
    Some((m.working_set_bytes? as f64, m.time_ns))
}

/// `/metrics/resource`: the node's, the pods' and the containers' CPU and memory.
pub fn resource_metrics(s: &Summary) -> String {
    let mut container_cpu =
        Family::new("container_cpu_usage_seconds_total", "counter", "Cumulative cpu time consumed by the container in core-seconds");
    let mut container_mem =
        Family::new("container_memory_working_set_bytes", "gauge", "Current working set of the container in bytes");
    let mut container_start =
        Family::new("container_start_time_seconds", "gauge", "Start time of the container since unix epoch in seconds");
    let mut node_cpu = Family::new("node_cpu_usage_seconds_total", "counter", "Cumulative cpu time consumed by the node in core-seconds");
    let mut node_mem = Family::new("node_memory_working_set_bytes", "gauge", "Current working set of the node in bytes");
    let mut pod_cpu = Family::new("pod_cpu_usage_seconds_total", "counter", "Cumulative cpu time consumed by the pod in core-seconds");
    let mut pod_mem = Family::new("pod_memory_working_set_bytes", "gauge", "Current working set of the pod in bytes");
    let mut scrape_error =
        Family::new("resource_scrape_error", "gauge", "1 if there was an error while getting container metrics, 0 otherwise");

    if let Some((v, t)) = cpu_seconds(s.node.cpu) {
        node_cpu.add(&[], v, Some(t));
    }
    if let Some((v, t)) = working_set(s.node.memory) {
        node_mem.add(&[], v, Some(t));
    }
    for p in &s.pods {
        let (ns, pod) = (p.namespace.as_str(), p.name.as_str());
        for c in &p.containers {
            let labels = [("container", c.name.as_str()), ("namespace", ns), ("pod", pod)];
            if c.start_time_ns > 0 {
                container_start.add(&labels, c.start_time_ns as f64 / 1e9, None);
            }
            if let Some((v, t)) = cpu_seconds(c.cpu) {
                container_cpu.add(&labels, v, Some(t));
            }
            if let Some((v, t)) = working_set(c.memory) {
                container_mem.add(&labels, v, Some(t));
            }
        }
        let labels = [("namespace", ns), ("pod", pod)];
        if let Some((v, t)) = cpu_seconds(p.cpu) {
            pod_cpu.add(&labels, v, Some(t));
        }
        if let Some((v, t)) = working_set(p.memory) {
            pod_mem.add(&labels, v, Some(t));
        }
    }
    scrape_error.add(&[], if s.error { 1.0 } else { 0.0 }, None);

    let mut out = String::new();
    for f in [container_cpu, container_mem, container_start, node_cpu, node_mem, pod_cpu, pod_mem, scrape_error] {
        f.write(&mut out);
    }
    out
}

/// metav1.Time: RFC 3339 in UTC with whole seconds.
pub fn rfc3339(ns: i64) -> String {
    jiff::Timestamp::from_nanosecond(i128::from(ns.div_euclid(1_000_000_000)) * 1_000_000_000)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

/// Inserts the `Some` values of `fields` into `m`.
fn put(m: &mut Map<String, Value>, fields: &[(&str, Option<u64>)]) {
    for (k, v) in fields {
        if let Some(v) = v {
            m.insert((*k).to_string(), json!(v));
        }
    }
}

fn cpu_json(c: &CpuStats) -> Value {
    let mut m = Map::new();
    m.insert("time".into(), json!(rfc3339(c.time_ns)));
    put(&mut m, &[("usageNanoCores", c.usage_nano_cores), ("usageCoreNanoSeconds", c.usage_core_nano_seconds)]);
    Value::Object(m)
}

fn memory_json(x: &MemoryStats) -> Value {
    let mut m = Map::new();
    m.insert("time".into(), json!(rfc3339(x.time_ns)));
    put(
        &mut m,
        &[
            ("availableBytes", x.available_bytes),
            ("usageBytes", x.usage_bytes),
            ("workingSetBytes", x.working_set_bytes),
            ("rssBytes", x.rss_bytes),
            ("pageFaults", x.page_faults),
            ("majorPageFaults", x.major_page_faults),
        ],
    );
    Value::Object(m)
}

fn interface_fields(m: &mut Map<String, Value>, i: &InterfaceStats) {
    m.insert("name".into(), json!(i.name));
    put(m, &[("rxBytes", i.rx_bytes), ("rxErrors", i.rx_errors), ("txBytes", i.tx_bytes), ("txErrors", i.tx_errors)]);
}

fn network_json(n: &NetworkStats) -> Value {
    let mut m = Map::new();
    m.insert("time".into(), json!(rfc3339(n.time_ns)));
    if let Some(d) = &n.default {
        interface_fields(&mut m, d);
    }
    let list: Vec<Value> = n
        .interfaces
        .iter()
        .map(|i| {
            let mut x = Map::new();
            interface_fields(&mut x, i);
            Value::Object(x)
        })
        .collect();
    if !list.is_empty() {
        m.insert("interfaces".into(), Value::Array(list));
    }
    Value::Object(m)
}

fn fs_map(f: &FsStats) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("time".into(), json!(rfc3339(f.time_ns)));
    put(
        &mut m,
        &[
            ("availableBytes", f.available_bytes),
            ("capacityBytes", f.capacity_bytes),
            ("usedBytes", f.used_bytes),
            ("inodesFree", f.inodes_free),
            ("inodes", f.inodes),
            ("inodesUsed", f.inodes_used),
        ],
    );
    m
}

fn fs_json(f: &FsStats) -> Value {
    Value::Object(fs_map(f))
}

fn container_json(c: &ContainerStats, only_cpu_and_memory: bool) -> Value {
    let mut m = Map::new();
    m.insert("name".into(), json!(c.name));
    m.insert("startTime".into(), json!(rfc3339(c.start_time_ns)));
    if let Some(x) = &c.cpu {
        m.insert("cpu".into(), cpu_json(x));
    }
    if let Some(x) = &c.memory {
        m.insert("memory".into(), memory_json(x));
    }
    if !only_cpu_and_memory {
        if let Some(x) = &c.rootfs {
            m.insert("rootfs".into(), fs_json(x));
        }
        if let Some(x) = &c.logs {
            m.insert("logs".into(), fs_json(x));
        }
    }
    Value::Object(m)
}

fn pod_json(p: &PodStats, only_cpu_and_memory: bool) -> Value {
    let mut m = Map::new();
    m.insert("podRef".into(), json!({"name": p.name, "namespace": p.namespace, "uid": p.uid}));
    m.insert("startTime".into(), json!(rfc3339(p.start_time_ns)));
    m.insert("containers".into(), Value::Array(p.containers.iter().map(|c| container_json(c, only_cpu_and_memory)).collect()));
    if let Some(x) = &p.cpu {
        m.insert("cpu".into(), cpu_json(x));
    }
    if let Some(x) = &p.memory {
        m.insert("memory".into(), memory_json(x));
    }
    if only_cpu_and_memory {
        return Value::Object(m);
    }
    if let Some(x) = &p.network {
        m.insert("network".into(), network_json(x));
    }
    if !p.volumes.is_empty() {
        let vols: Vec<Value> = p
            .volumes
            .iter()
            .map(|v| {
                let mut x = fs_map(&v.fs);
                x.insert("name".into(), json!(v.name));
                if let Some((ns, claim)) = &v.pvc {
                    x.insert("pvcRef".into(), json!({"name": claim, "namespace": ns}));
                }
                Value::Object(x)
            })
            .collect();
        m.insert("volume".into(), Value::Array(vols));
    }
    if let Some(x) = &p.ephemeral_storage {
        m.insert("ephemeral-storage".into(), fs_json(x));
    }
    if let Some(n) = p.process_count {
        m.insert("process_stats".into(), json!({"process_count": n}));
    }
    Value::Object(m)
}

/// `/stats/summary` (`only_cpu_and_memory`: the `?only_cpu_and_memory=true` form, without
/// network, file systems and volumes).
pub fn summary(s: &Summary, only_cpu_and_memory: bool) -> Value {
    let n = &s.node;
    let mut node = Map::new();
    node.insert("nodeName".into(), json!(n.node_name));
    node.insert("startTime".into(), json!(rfc3339(n.start_time_ns)));
    if let Some(x) = &n.cpu {
        node.insert("cpu".into(), cpu_json(x));
    }
    if let Some(x) = &n.memory {
        node.insert("memory".into(), memory_json(x));
    }
    if !only_cpu_and_memory {
        if let Some(x) = &n.network {
            node.insert("network".into(), network_json(x));
        }
        if let Some(x) = &n.fs {
            node.insert("fs".into(), fs_json(x));
        }
        if let Some(x) = &n.image_fs {
            node.insert("runtime".into(), json!({"imageFs": fs_json(x)}));
        }
        if let Some(r) = &n.rlimit {
            let mut m = Map::new();
            m.insert("time".into(), json!(rfc3339(r.time_ns)));
            put(&mut m, &[("maxpid", r.max_pid), ("curproc", r.num_of_running_processes)]);
            node.insert("rlimit".into(), Value::Object(m));
        }
    }
    json!({
        "node": Value::Object(node),
        "pods": s.pods.iter().map(|p| pod_json(p, only_cpu_and_memory)).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::stats::model::{self, NodeStats, RlimitStats, VolumeStats};

    #[test]
    fn floats_as_go_prints_them() {
        for (v, s) in [
            (0.0, "0"),
            (1.0, "1"),
            (-1.0, "-1"),
            (2.101286557, "2.101286557"),
            (16_203_776.0, "1.6203776e+07"),
            (123_456.0, "123456"),
            (1_234_567.0, "1.234567e+06"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1e21, "1e+21"),
            (1.7e9, "1.7e+09"),
            (1_764_180_000.123_456_7, "1.7641800001234567e+09"),
            (58.734123456, "58.734123456"),
            (f64::INFINITY, "+Inf"),
        ] {
            assert_eq!(go_float(v), s, "{v}");
        }
    }

    /// The lab's recorded CRI answers (model::tests::recorded) with a node (from the host,
    /// made up here) and a claim volume on the holder.
    fn summary_of_recorded() -> Summary {
        const T: i64 = 1_795_724_440_650_000_000;
        let mut pods = model::pods_from_cri(&model::tests::recorded());
        pods[1].volumes.push(VolumeStats {
            name: "data".into(),
            fs: FsStats { time_ns: T, used_bytes: Some(40), capacity_bytes: Some(100), ..Default::default() },
            pvc: Some(("top".into(), "data".into())),
        });
        for p in &mut pods {
            p.ephemeral_storage = model::ephemeral_of(&p.containers);
        }
        Summary {
            node: NodeStats {
                node_name: "node-a".into(),
                start_time_ns: 1_795_660_000_000_000_000,
                cpu: Some(CpuStats { time_ns: T, usage_nano_cores: Some(1_050_000_000), usage_core_nano_seconds: Some(68_499_753_009_072) }),
                memory: Some(MemoryStats { time_ns: T, working_set_bytes: Some(6_035_972_096), usage_bytes: Some(17_106_530_304), ..Default::default() }),
                network: None,
                fs: Some(FsStats { time_ns: T, capacity_bytes: Some(1 << 40), available_bytes: Some(1 << 39), ..Default::default() }),
                image_fs: None,
                rlimit: Some(RlimitStats { time_ns: T, max_pid: Some(4_194_304), num_of_running_processes: Some(412) }),
            },
            pods,
            error: false,
        }
    }

    #[test]
    fn resource_metrics_text() {
        let text = resource_metrics(&summary_of_recorded());
        let expected = "\
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
        assert_eq!(text, expected);
    }

    #[test]
    fn resource_metrics_of_an_empty_node_and_an_error() {
        let s = Summary { node: NodeStats { node_name: "n".into(), ..Default::default() }, pods: vec![], error: true };
        assert_eq!(
            resource_metrics(&s),
            "# HELP resource_scrape_error [STABLE] 1 if there was an error while getting container metrics, 0 otherwise\n\
             # TYPE resource_scrape_error gauge\nresource_scrape_error 1\n"
        );
        let mut s = summary_of_recorded();
        s.pods[0].name = "we\"ird\\".into();
        assert!(resource_metrics(&s).contains("pod=\"we\\\"ird\\\\\"}"));
    }

    #[test]
    fn summary_json() {
        let s = summary_of_recorded();
        let v = summary(&s, false);
        assert_eq!(v["node"]["nodeName"], "node-a");
        assert_eq!(v["node"]["startTime"], "2026-11-26T02:26:40Z");
        assert_eq!(v["node"]["cpu"], json!({"time": "2026-11-26T20:20:40Z", "usageNanoCores": 1_050_000_000u64, "usageCoreNanoSeconds": 68_499_753_009_072u64}));
        assert_eq!(v["node"]["memory"]["workingSetBytes"], 6_035_972_096u64);
        assert_eq!(v["node"]["rlimit"], json!({"time": "2026-11-26T20:20:40Z", "maxpid": 4_194_304, "curproc": 412}));
        assert!(v["node"].get("network").is_none(), "absent values are omitted");
        let burner = &v["pods"][0];
        assert_eq!(burner["podRef"], json!({"name": "burner", "namespace": "top", "uid": "c5f5d5cd-ea8e-4225-9b81-89339e4652e8"}));
        assert_eq!(burner["startTime"], "2026-11-26T20:20:26Z");
        let c = &burner["containers"][0];
        assert_eq!(c["name"], "burner");
        assert_eq!(c["startTime"], "2026-11-26T20:20:26Z");
        assert_eq!(c["cpu"], json!({"time": "2026-11-26T20:20:40Z", "usageNanoCores": 908_772_896, "usageCoreNanoSeconds": 13_927_836_532u64}));
        assert_eq!(
            c["memory"],
            json!({"time": "2026-11-26T20:20:40Z", "availableBytes": 0, "usageBytes": 225_280, "workingSetBytes": 225_280, "rssBytes": 57_344, "pageFaults": 741, "majorPageFaults": 0})
        );
        assert_eq!(c["rootfs"], json!({"time": "2026-11-26T20:20:35Z", "usedBytes": 28_672, "inodesUsed": 10}));
        assert_eq!(
            burner["network"],
            json!({"time": "2026-11-26T20:20:40Z", "name": "eth0", "rxBytes": 2_742, "rxErrors": 0, "txBytes": 656, "txErrors": 0,
                "interfaces": [{"name": "eth0", "rxBytes": 2_742, "rxErrors": 0, "txBytes": 656, "txErrors": 0}]})
        );
        assert_eq!(burner["process_stats"], json!({"process_count": 1}));
        assert_eq!(burner["ephemeral-storage"]["usedBytes"], 28_672);
        let holder = &v["pods"][1];
        assert_eq!(holder["memory"]["workingSetBytes"], 51_781_632);
        assert_eq!(holder["volume"][0]["name"], "data");
        assert_eq!(holder["volume"][0]["pvcRef"], json!({"name": "data", "namespace": "top"}));
        assert_eq!(holder["volume"][0]["capacityBytes"], 100);
        // only_cpu_and_memory: no network, volumes or file systems
        let small = summary(&s, true);
        assert!(small["pods"][1].get("volume").is_none());
        assert!(small["pods"][0].get("network").is_none());
        assert!(small["pods"][0]["containers"][0].get("rootfs").is_none());
        assert!(small["node"].get("fs").is_none());
        assert_eq!(small["pods"][0]["memory"]["workingSetBytes"], 503_808);
    }
}
