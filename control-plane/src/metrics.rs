//! The control plane's Prometheus `/metrics`, in upstream's names: the API server's requests
//! (apiserver_request_total, apiserver_request_duration_seconds), its stored objects
//! (apiserver_storage_objects), the work queues of the loops running in this process
//! (workqueue_*), and the scheduler's attempts and latency.

use ferro_runtime::metrics::{CounterVec, HistogramVec};

use crate::api::Api;

/// apiserver_request_duration_seconds' buckets as upstream's.
const REQUEST_BUCKETS: &[f64] = &[
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0,
];

pub static REQUESTS: CounterVec = CounterVec::new(
    "apiserver_request_total",
    "[STABLE] Counter of apiserver requests broken out for each verb, dry run value, group, version, resource, scope, component, and HTTP response code.",
    &["code", "component", "dry_run", "group", "resource", "scope", "subresource", "verb", "version"],
);

pub static REQUEST_DURATION: HistogramVec = HistogramVec::new(
    "apiserver_request_duration_seconds",
    "[STABLE] Response latency distribution in seconds for each verb, dry run value, group, version, resource, subresource, scope and component.",
    &["component", "dry_run", "group", "resource", "scope", "subresource", "verb", "version"],
    REQUEST_BUCKETS,
);

/// apiserver_watch_cache_consistent_read_total{fallback, resource, success}: consistent reads
/// (no resourceVersion) on the etcd store, answered from the watch cache or, when it did not
/// catch up with etcd in time, from etcd.
pub static CONSISTENT_READS: CounterVec = CounterVec::new(
    "apiserver_watch_cache_consistent_read_total",
    "[ALPHA] Counter for consistent reads from cache.",
    &["fallback", "resource", "success"],
);

/// scheduler_schedule_attempts_total{profile, result}: scheduled, unschedulable, error.
pub static SCHEDULE_ATTEMPTS: CounterVec = CounterVec::new(
    "scheduler_schedule_attempts_total",
    "[STABLE] Number of attempts to schedule pods, by the result. 'unschedulable' means a pod could not be scheduled, while 'error' means an internal scheduler problem.",
    &["profile", "result"],
);

const SCHEDULING_BUCKETS: &[f64] = &[0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024, 2.048, 4.096, 8.192, 16.384];

/// scheduler_scheduling_attempt_duration_seconds{profile, result}: one attempt's latency.
pub static ATTEMPT_DURATION: HistogramVec = HistogramVec::new(
    "scheduler_scheduling_attempt_duration_seconds",
    "[STABLE] Scheduling attempt latency in seconds (scheduling algorithm + binding)",
    &["profile", "result"],
    SCHEDULING_BUCKETS,
);

const POD_SCHEDULING_BUCKETS: &[f64] = &[0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92, 163.84, 327.68, 655.36, 1310.72, 2621.44, 5242.88];

/// scheduler_pod_scheduling_duration_seconds{attempts}: from the pod's creation to its binding.
pub static POD_SCHEDULING_DURATION: HistogramVec = HistogramVec::new(
    "scheduler_pod_scheduling_duration_seconds",
    "[STABLE] E2e latency for a pod being scheduled which may include multiple scheduling attempts.",
    &["attempts"],
    POD_SCHEDULING_BUCKETS,
);

/// Records one request. `verb` is upstream's canonical verb (GET, LIST, WATCH, POST, PUT,
/// PATCH, APPLY, DELETE, DELETECOLLECTION, CONNECT).
#[allow(clippy::too_many_arguments)]
pub fn record_request(verb: &str, group: &str, version: &str, resource: &str, subresource: &str, scope: &str, dry_run: bool, code: u16, seconds: f64) {
    let dry = if dry_run { "All" } else { "" };
    let code = code.to_string();
    REQUESTS.inc(&[&code, "apiserver", dry, group, resource, scope, subresource, verb, version]);
    // watches and connections last as long as the client wants: upstream leaves them out
    if verb != "WATCH" && verb != "CONNECT" {
        REQUEST_DURATION.observe(&["apiserver", dry, group, resource, scope, subresource, verb, version], seconds);
    }
}

/// Upstream's canonical verb of a request.
pub fn canonical_verb(method: &str, api_verb: &str, apply: bool) -> &'static str {
    match (method, api_verb) {
        (_, "watch") => "WATCH",
        (_, "list") => "LIST",
        (_, "deletecollection") => "DELETECOLLECTION",
        ("PATCH", _) if apply => "APPLY",
        ("GET", _) => "GET",
        ("POST", _) => "POST",
        ("PUT", _) => "PUT",
        ("PATCH", _) => "PATCH",
        ("DELETE", _) => "DELETE",
        _ => "CONNECT",
    }
}

/// The whole `/metrics` text.
pub async fn render(api: &Api) -> String {
    let mut out = String::new();
    REQUESTS.render(&mut out);
    REQUEST_DURATION.render(&mut out);
    out.push_str("# HELP apiserver_storage_objects [STABLE] Number of stored objects at the time of last check split by kind.\n");
    out.push_str("# TYPE apiserver_storage_objects gauge\n");
    let mut seen = std::collections::HashSet::new();
    for r in crate::resources::all() {
        let prefix = r.prefix(None);
        if !seen.insert(prefix.clone()) {
            continue;
        }
        let n = api.store.list(&prefix).await.map(|l| l.records.len() as i64).unwrap_or(-1);
        out.push_str(&format!("apiserver_storage_objects{{resource=\"{}\"}} {n}\n", r.group_resource()));
    }
    CONSISTENT_READS.render(&mut out);
    ferro_runtime::metrics::render_queues(&mut out);
    SCHEDULE_ATTEMPTS.render(&mut out);
    ATTEMPT_DURATION.render(&mut out);
    POD_SCHEDULING_DURATION.render(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_verbs() {
        assert_eq!(canonical_verb("GET", "list", false), "LIST");
        assert_eq!(canonical_verb("GET", "watch", false), "WATCH");
        assert_eq!(canonical_verb("GET", "get", false), "GET");
        assert_eq!(canonical_verb("PATCH", "patch", true), "APPLY");
        assert_eq!(canonical_verb("PATCH", "patch", false), "PATCH");
        assert_eq!(canonical_verb("POST", "create", false), "POST");
        assert_eq!(canonical_verb("DELETE", "deletecollection", false), "DELETECOLLECTION");
    }
}
