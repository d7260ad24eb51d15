//! NodeMetrics and PodMetrics (metrics.k8s.io/v1beta1) as metrics-server serves them, built
//! from the stored usage and the Node and Pod objects: the object's name, namespace and labels
//! (label selectors select on them), `creationTimestamp` the time of the request, `timestamp`
//! the last sample's time, `window` the time between the two samples (a Go duration),
//! `usage.cpu` in nanocores and `usage.memory` the working set in bytes (BinarySI).

use k8s_semantics::quantity::{binary_si, Format, Quantity};
use serde_json::{json, Map, Value};

use super::store::{PodUsage, Usage};

pub const GROUP: &str = "metrics.k8s.io";
pub const VERSION: &str = "v1beta1";
pub const API_VERSION: &str = "metrics.k8s.io/v1beta1";

/// metav1.Time of Unix milliseconds: RFC 3339, whole seconds, UTC.
pub fn time_ms(ms: i64) -> String {
    jiff::Timestamp::from_millisecond(ms.div_euclid(1000) * 1000)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

/// The usage map: cpu as a nanocore quantity (`998234567n`, `200m`), memory in bytes
/// (`65744Ki`).
pub fn usage_json(u: &Usage) -> Value {
    let cpu = Quantity { mantissa: i128::from(u.cpu_nano_cores), exp10: -9, format: Format::DecimalSI };
    json!({
        "cpu": cpu.canonical(),
        "memory": binary_si(i64::try_from(u.memory_bytes).unwrap_or(i64::MAX)),
    })
}

fn window(ms: i64) -> String {
    k8s_semantics::format_go_duration(ms.saturating_mul(1_000_000))
}

/// The metadata metrics-server gives: name (and namespace), labels of the object, created now.
fn metadata(obj: &Value, now_ms: i64) -> Value {
    let mut m = Map::new();
    m.insert("name".into(), obj.pointer("/metadata/name").cloned().unwrap_or(Value::Null));
    if let Some(ns) = obj.pointer("/metadata/namespace") {
        m.insert("namespace".into(), ns.clone());
    }
    m.insert("creationTimestamp".into(), json!(time_ms(now_ms)));
    if let Some(l) = obj.pointer("/metadata/labels").filter(|l| l.as_object().is_some_and(|o| !o.is_empty())) {
        m.insert("labels".into(), l.clone());
    }
    Value::Object(m)
}

/// The NodeMetrics of `node`.
pub fn node_metrics(node: &Value, u: &Usage, now_ms: i64) -> Value {
    json!({
        "kind": "NodeMetrics",
        "apiVersion": API_VERSION,
        "metadata": metadata(node, now_ms),
        "timestamp": time_ms(u.timestamp_ms),
        "window": window(u.window_ms),
        "usage": usage_json(u),
    })
}

/// The PodMetrics of `pod`.
pub fn pod_metrics(pod: &Value, u: &PodUsage, now_ms: i64) -> Value {
    let containers: Vec<Value> = u.containers.iter().map(|(name, c)| json!({"name": name, "usage": usage_json(c)})).collect();
    json!({
        "kind": "PodMetrics",
        "apiVersion": API_VERSION,
        "metadata": metadata(pod, now_ms),
        "timestamp": time_ms(u.timestamp_ms),
        "window": window(u.window_ms),
        "containers": containers,
    })
}

/// A list of metrics objects (`NodeMetricsList`, `PodMetricsList`).
pub fn list(kind: &str, items: Vec<Value>) -> Value {
    json!({"kind": kind, "apiVersion": API_VERSION, "metadata": {}, "items": items})
}

/// Pods are reported only while Running, as metrics-server does.
pub fn is_running(pod: &Value) -> bool {
    pod.pointer("/status/phase").and_then(Value::as_str) == Some("Running")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn quantities_as_metrics_server_prints_them() {
        let u = |cpu, mem| Usage { timestamp_ms: 0, window_ms: 1, cpu_nano_cores: cpu, memory_bytes: mem };
        assert_eq!(usage_json(&u(998_234_567, 67_321_856)), json!({"cpu": "998234567n", "memory": "65744Ki"}));
        assert_eq!(usage_json(&u(200_000_000, 1000)), json!({"cpu": "200m", "memory": "1k"}));
        assert_eq!(usage_json(&u(2_000_000_000, 64 << 20)), json!({"cpu": "2", "memory": "64Mi"}));
        assert_eq!(usage_json(&u(0, 0)), json!({"cpu": "0", "memory": "0"}));
        assert_eq!(usage_json(&u(1_500, 123)), json!({"cpu": "1500n", "memory": "123"}));
    }

    #[test]
    fn node_and_pod_metrics() {
        let node = json!({"metadata": {"name": "n1", "labels": {"kubernetes.io/hostname": "n1"}, "uid": "x"}, "status": {}});
        let u = Usage { timestamp_ms: 1_764_180_015_123, window_ms: 15_003, cpu_nano_cores: 250_000_000, memory_bytes: 1 << 30 };
        assert_eq!(
            node_metrics(&node, &u, 1_764_180_020_999),
            json!({
                "kind": "NodeMetrics",
                "apiVersion": "metrics.k8s.io/v1beta1",
                "metadata": {"name": "n1", "creationTimestamp": "2025-11-26T18:00:20Z", "labels": {"kubernetes.io/hostname": "n1"}},
                "timestamp": "2025-11-26T18:00:15Z",
                "window": "15.003s",
                "usage": {"cpu": "250m", "memory": "1Gi"},
            })
        );
        let pod = json!({"metadata": {"name": "web", "namespace": "prod", "labels": {}}, "status": {"phase": "Running"}});
        let pu = PodUsage { timestamp_ms: 1_764_180_015_000, window_ms: 15_000, containers: vec![("app".into(), u), ("log".into(), Usage { cpu_nano_cores: 1_234, memory_bytes: 4096, ..u })] };
        let m = pod_metrics(&pod, &pu, 1_764_180_020_000);
        assert_eq!(m["metadata"], json!({"name": "web", "namespace": "prod", "creationTimestamp": "2025-11-26T18:00:20Z"}));
        assert_eq!(m["window"], "15s");
        assert_eq!(m["containers"], json!([
            {"name": "app", "usage": {"cpu": "250m", "memory": "1Gi"}},
            {"name": "log", "usage": {"cpu": "1234n", "memory": "4Ki"}},
        ]));
        assert_eq!(list("PodMetricsList", vec![])["metadata"], json!({}));
        assert!(is_running(&pod));
        assert!(!is_running(&json!({"status": {"phase": "Pending"}})));
    }
}
