//! The control plane's Prometheus /metrics in upstream's names: requests by verb, resource,
//! scope and code with their latency, stored objects per resource, the loops' work queues and
//! the scheduler's attempts. Admin only (403 for others).
#![allow(clippy::unwrap_used)]

mod common;

use common::fake::{eventually, FakeNodes};
use common::Server;

/// The value of the first sample line starting with `prefix` (name plus labels).
fn sample(text: &str, prefix: &str) -> Option<f64> {
    text.lines().find(|l| l.starts_with(prefix)).and_then(|l| l.rsplit(' ').next()).and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_requests_objects_queues_and_scheduling() {
    let s = Server::start();
    let client = s.client().await;
    let _nodes = FakeNodes::start(client.clone(), &["n1"], "4", "8Gi").await;
    s.ok(&["create", "configmap", "c1", "--from-literal=a=b"]);
    s.ok(&["run", "p1", "--image=busybox:1", "--restart=Never"]);
    let text = eventually("the pod scheduled and counted", || async {
        let t = s.ok(&["get", "--raw", "/metrics"]);
        (sample(&t, "scheduler_schedule_attempts_total{profile=\"default-scheduler\",result=\"scheduled\"}")? >= 1.0).then_some(t)
    })
    .await;
    let created = sample(
        &text,
        "apiserver_request_total{code=\"201\",component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"configmaps\",scope=\"namespace\",subresource=\"\",verb=\"POST\",version=\"v1\"}",
    );
    // (the root CA publisher creates a ConfigMap in every namespace too)
    assert!(created.is_some_and(|n| n >= 1.0), "{text}");
    assert!(
        sample(&text, "apiserver_request_duration_seconds_count{component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"configmaps\",scope=\"namespace\",subresource=\"\",verb=\"POST\",version=\"v1\"}")
            .is_some_and(|n| n >= 1.0),
        "{text}"
    );
    assert!(text.contains("# TYPE apiserver_request_duration_seconds histogram"));
    assert_eq!(sample(&text, "apiserver_storage_objects{resource=\"configmaps\"}").map(|n| n >= 1.0), Some(true), "{text}");
    assert_eq!(sample(&text, "apiserver_storage_objects{resource=\"pods\"}"), Some(1.0), "{text}");
    assert!(sample(&text, "workqueue_adds_total{name=\"scheduler\"}").unwrap() >= 1.0, "{text}");
    assert!(sample(&text, "workqueue_work_duration_seconds_count{name=\"scheduler\"}").unwrap() >= 1.0, "{text}");
    assert!(text.contains("workqueue_depth{name=\"deployment\"}"), "{text}");
    assert!(sample(&text, "scheduler_pod_scheduling_duration_seconds_count{attempts=\"1\"}").unwrap() >= 1.0, "{text}");
    // a 404 is counted with its code, a get of one object has scope resource
    assert!(!s.kubectl(&["get", "configmap", "nope"]).status.success());
    s.ok(&["get", "configmap", "c1"]);
    let text = s.ok(&["get", "--raw", "/metrics"]);
    assert!(text.contains("apiserver_request_total{code=\"404\",component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"configmaps\",scope=\"resource\",subresource=\"\",verb=\"GET\",version=\"v1\"} 1"), "{text}");

    // not for everyone
    let kc = s.cert_kubeconfig("jane", &[]);
    let out = std::process::Command::new("kubectl").arg("--kubeconfig").arg(&kc).args(["get", "--raw", "/metrics"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("Forbidden") || String::from_utf8_lossy(&out.stderr).contains("forbidden"), "{}", String::from_utf8_lossy(&out.stderr));
}
