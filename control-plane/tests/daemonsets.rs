//! The DaemonSet controller against the real binary with fake nodes: one pod per eligible node
//! placed by the scheduler, following nodes that join, get tainted and leave (with PodGC
//! collecting the pods of a deleted node), a rolling update, `kubectl rollout
//! status/history/undo daemonset`, and events.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;

use common::fake::{eventually, FakeNodes};
use common::Server;
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, ListParams};
use kube::ResourceExt as _;

const DS: &str = r#"apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent}
spec:
  selector: {matchLabels: {app: agent}}
  updateStrategy: {type: RollingUpdate, rollingUpdate: {maxUnavailable: 1}}
  template:
    metadata: {labels: {app: agent}}
    spec:
      containers: [{name: c, image: "agent:1"}]
"#;

fn live(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none() && !matches!(p.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
}

fn running(p: &Pod) -> bool {
    live(p) && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// Node -> image of the running daemon pods; None while some node has two or an unbound one.
async fn placement(api: &Api<Pod>) -> Option<BTreeMap<String, String>> {
    let pods: Vec<Pod> = api.list(&ListParams::default().labels("app=agent")).await.unwrap().items.into_iter().filter(live).collect();
    let mut m = BTreeMap::new();
    for p in &pods {
        if !running(p) {
            return None;
        }
        let node = p.spec.as_ref()?.node_name.clone()?;
        let image = p.spec.as_ref()?.containers[0].image.clone().unwrap_or_default();
        if m.insert(node, image).is_some() {
            return None;
        }
    }
    Some(m)
}

fn on(nodes: &[&str], image: &str) -> BTreeMap<String, String> {
    nodes.iter().map(|n| (n.to_string(), image.to_string())).collect()
}

async fn wait_placement(api: &Api<Pod>, what: &str, want: BTreeMap<String, String>) {
    eventually(what, || {
        let want = want.clone();
        async move { (placement(api).await? == want).then_some(()) }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemonset_follows_nodes_and_rolls_out_with_kubectl() {
    let s = Server::start_with(&["--pod-gc-quarantine", "1s"]);
    let client = s.client().await;
    let first = FakeNodes::start(client.clone(), &["n1", "n2"], "4", "8Gi").await;
    s.apply(DS);
    s.ok(&["rollout", "status", "daemonset/agent", "--timeout=90s"]);
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    wait_placement(&pods, "a pod on n1 and n2", on(&["n1", "n2"], "agent:1")).await;

    // what the pods look like: bound by the scheduler through the node name affinity
    let p = pods.list(&ListParams::default().labels("app=agent")).await.unwrap().items.into_iter().find(live).unwrap();
    let labels = p.labels();
    assert!(labels.contains_key("controller-revision-hash"), "{labels:?}");
    assert_eq!(labels.get("pod-template-generation").map(String::as_str), Some("1"));
    let owner = p.owner_references().iter().find(|r| r.controller == Some(true)).unwrap();
    assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("DaemonSet", "agent"));
    let affinity = serde_json::to_value(p.spec.as_ref().unwrap().affinity.as_ref().unwrap()).unwrap();
    let node = p.spec.as_ref().unwrap().node_name.clone().unwrap();
    assert_eq!(
        affinity.pointer("/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms/0/matchFields/0"),
        Some(&serde_json::json!({"key": "metadata.name", "operator": "In", "values": [node]}))
    );
    let tolerations: Vec<String> =
        p.spec.as_ref().unwrap().tolerations.iter().flatten().filter_map(|t| t.key.clone()).collect();
    assert!(tolerations.contains(&"node.kubernetes.io/unreachable".to_string()), "{tolerations:?}");

    // a node joins
    let _second = FakeNodes::start(client.clone(), &["n3"], "4", "8Gi").await;
    wait_placement(&pods, "a pod on the new node n3", on(&["n1", "n2", "n3"], "agent:1")).await;

    // a node gets a NoExecute taint the pods do not tolerate: its pod goes
    s.ok(&["taint", "nodes", "n3", "dedicated=infra:NoExecute"]);
    wait_placement(&pods, "the pod on tainted n3 gone", on(&["n1", "n2"], "agent:1")).await;
    let dss: Api<DaemonSet> = Api::namespaced(client.clone(), "default");
    eventually("status: two desired, two available", || async {
        let st = dss.get("agent").await.unwrap().status?;
        (st.desired_number_scheduled == 2 && st.number_available == Some(2) && st.number_misscheduled == 0).then_some(())
    })
    .await;
    s.ok(&["taint", "nodes", "n3", "dedicated=infra:NoExecute-"]);
    wait_placement(&pods, "a pod on n3 again once untainted", on(&["n1", "n2", "n3"], "agent:1")).await;

    // a node leaves: its kubelet stops, the Node is deleted, PodGC collects its pod
    first.kill("n2");
    s.ok(&["delete", "node", "n2"]);
    wait_placement(&pods, "n2's pod garbage-collected", on(&["n1", "n3"], "agent:1")).await;

    // a rolling update
    s.ok(&["set", "image", "daemonset/agent", "c=agent:2"]);
    s.ok(&["rollout", "status", "daemonset/agent", "--timeout=90s"]);
    wait_placement(&pods, "all pods on agent:2", on(&["n1", "n3"], "agent:2")).await;
    let st = dss.get("agent").await.unwrap().status.unwrap();
    assert_eq!(
        (st.desired_number_scheduled, st.current_number_scheduled, st.updated_number_scheduled, st.number_ready, st.number_available),
        (2, 2, Some(2), 2, Some(2))
    );
    assert_eq!(st.observed_generation, dss.get("agent").await.unwrap().metadata.generation);
    let revs: Api<ControllerRevision> = Api::namespaced(client.clone(), "default");
    assert_eq!(revs.list(&ListParams::default().labels("app=agent")).await.unwrap().items.len(), 2);
    let history = s.ok(&["rollout", "history", "daemonset/agent"]);
    assert!(history.contains('1') && history.contains('2'), "{history}");

    // back to the first template
    s.ok(&["rollout", "undo", "daemonset/agent"]);
    s.ok(&["rollout", "status", "daemonset/agent", "--timeout=90s"]);
    wait_placement(&pods, "all pods back on agent:1", on(&["n1", "n3"], "agent:1")).await;
    let numbers: Vec<i64> = revs.list(&ListParams::default().labels("app=agent")).await.unwrap().items.iter().map(|r| r.revision).collect();
    assert_eq!(numbers.len(), 2, "the first revision is reused: {numbers:?}");
    assert!(numbers.contains(&3), "and renumbered: {numbers:?}");

    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let reasons: Vec<String> = events
        .list(&ListParams::default().fields("involvedObject.name=agent"))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|e| e.reason)
        .collect();
    assert!(reasons.iter().any(|r| r == "SuccessfulCreate") && reasons.iter().any(|r| r == "SuccessfulDelete"), "{reasons:?}");
}
