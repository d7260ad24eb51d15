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
    // rollout status checks updated and available only: the other counts may follow a moment later
    eventually("the status counting two of everything at the current generation", || async {
        let ds = dss.get("agent").await.unwrap();
        let st = ds.status?;
        let counts = (st.desired_number_scheduled, st.current_number_scheduled, st.updated_number_scheduled, st.number_ready, st.number_available);
        (counts == (2, 2, Some(2), 2, Some(2)) && st.observed_generation == ds.metadata.generation).then_some(())
    })
    .await;
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

/// A Node no kubelet looks after (Ready, with room): the status of its pods is the test's.
async fn quiet_node(client: &kube::Client, name: &str) {
    use k8s_openapi::api::core::v1::Node;
    use kube::api::{Patch, PatchParams, PostParams};
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {"capacity": {"cpu": "4", "memory": "8Gi", "pods": "110"}, "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}}
    }))
    .unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    let now = jiff::Timestamp::now().to_string();
    let status = serde_json::json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
        "lastHeartbeatTime": now, "lastTransitionTime": now}]}});
    nodes.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_daemon_pods_are_replaced_and_a_surge_rollout_keeps_every_node_served() {
    use futures::StreamExt as _;
    use kube::api::{Patch, PatchParams};
    use kube::runtime::{watcher, WatchStreamExt as _};
    let s = Server::start_with(&["--node-monitor-grace-period", "1h"]);
    let client = s.client().await;
    let _nodes = FakeNodes::start(client.clone(), &["n1", "n2"], "4", "8Gi").await;
    quiet_node(&client, "quiet").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");

    // a failed daemon pod is deleted and replaced, each time
    s.apply(
        r#"apiVersion: apps/v1
kind: DaemonSet
metadata: {name: probe}
spec:
  selector: {matchLabels: {app: probe}}
  template:
    metadata: {labels: {app: probe}}
    spec:
      nodeSelector: {kubernetes.io/hostname: quiet}
      containers: [{name: c, image: "probe:1"}]
"#,
    );
    let mut seen = Vec::new();
    for round in 0..2 {
        let name = eventually("a probe pod bound to the quiet node", || async {
            pods.list(&ListParams::default().labels("app=probe")).await.unwrap().items.into_iter().find_map(|p| {
                let bound = p.spec.as_ref()?.node_name.as_deref() == Some("quiet");
                (bound && p.metadata.deletion_timestamp.is_none() && !seen.contains(&p.name_any())).then(|| p.name_any())
            })
        })
        .await;
        let failed = serde_json::json!({"status": {"phase": "Failed", "reason": "Crashed"}});
        pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(&failed)).await.unwrap();
        seen.push(name);
        eventually(&format!("failed pod {round} replaced"), || async {
            let l = pods.list(&ListParams::default().labels("app=probe")).await.unwrap().items;
            (l.iter().all(|p| !seen.contains(&p.name_any())) && l.iter().any(live)).then_some(())
        })
        .await;
    }
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    eventually("a FailedDaemonPod event", || async {
        let l = events.list(&ListParams::default().fields("involvedObject.name=probe")).await.unwrap().items;
        l.iter().any(|e| e.reason.as_deref() == Some("FailedDaemonPod")).then_some(())
    })
    .await;

    // a surge rollout on the two kubelet nodes: a node's old pod goes only once its new one is
    // ready, so every node keeps a ready pod throughout (read from a pod watch)
    s.ok(&["label", "nodes", "n1", "n2", "fake=yes"]);
    s.apply(
        r#"apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent}
spec:
  selector: {matchLabels: {app: agent}}
  updateStrategy: {type: RollingUpdate, rollingUpdate: {maxSurge: 1, maxUnavailable: 0}}
  template:
    metadata: {labels: {app: agent}}
    spec:
      nodeSelector: {fake: "yes"}
      containers: [{name: c, image: "agent:1"}]
"#,
    );
    s.ok(&["rollout", "status", "daemonset/agent", "--timeout=90s"]);
    wait_placement(&pods, "agent on n1 and n2", on(&["n1", "n2"], "agent:1")).await;
    let lowest = std::sync::Arc::new(std::sync::Mutex::new(usize::MAX));
    let watch = {
        let (api, lowest) = (pods.clone(), lowest.clone());
        tokio::spawn(async move {
            let mut ready: BTreeMap<String, (String, bool)> = BTreeMap::new();
            let mut listed = false;
            let cfg = watcher::Config::default().labels("app=agent");
            let mut stream = watcher::watcher(api, cfg).default_backoff().boxed();
            while let Some(Ok(ev)) = stream.next().await {
                match ev {
                    watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
                        let node = p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
                        let ok = running(&p)
                            && p.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
                        ready.insert(p.name_any(), (node, ok));
                    }
                    watcher::Event::Delete(p) => {
                        ready.remove(&p.name_any());
                    }
                    watcher::Event::Init => {
                        ready.clear();
                        listed = false;
                    }
                    watcher::Event::InitDone => listed = true,
                }
                if !listed {
                    continue;
                }
                let per_node = |n: &str| ready.values().filter(|(node, ok)| node == n && *ok).count();
                let now = per_node("n1").min(per_node("n2"));
                let mut l = lowest.lock().unwrap();
                *l = (*l).min(now);
            }
        })
    };
    eventually("the watch saw both ready pods", || async { (*lowest.lock().unwrap() != usize::MAX).then_some(()) }).await;
    s.ok(&["set", "image", "daemonset/agent", "c=agent:2"]);
    s.ok(&["rollout", "status", "daemonset/agent", "--timeout=90s"]);
    wait_placement(&pods, "agent:2 on n1 and n2", on(&["n1", "n2"], "agent:2")).await;
    watch.abort();
    assert!(*lowest.lock().unwrap() >= 1, "a node was left without a ready agent during the surge rollout");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_template_generation_annotation_counts_template_changes_only() {
    let s = Server::start();
    let client = s.client().await;
    let _nodes = FakeNodes::start(client.clone(), &["n1"], "4", "8Gi").await;
    s.apply(DS);
    let tg = || s.ok(&["get", "ds", "agent", "-o", "jsonpath={.metadata.generation} {.metadata.annotations.deprecated\\.daemonset\\.template\\.generation}"]);
    assert_eq!(tg().trim(), "1 1");
    // a spec change outside the template: generation only
    s.ok(&["patch", "ds", "agent", "--type=merge", "-p", r#"{"spec":{"minReadySeconds":3}}"#]);
    assert_eq!(tg().trim(), "2 1");
    // a client cannot set it
    s.ok(&["annotate", "ds", "agent", "--overwrite", "deprecated.daemonset.template.generation=7"]);
    assert_eq!(tg().trim(), "2 1");
    // a template change: both, and the new pods carry it
    s.ok(&["set", "image", "ds/agent", "c=busybox:2"]);
    assert_eq!(tg().trim(), "3 2");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    eventually("the new pod labelled with template generation 2", || async {
        let l = pods.list(&ListParams::default().labels("app=agent")).await.unwrap().items;
        let new: Vec<&Pod> = l.iter().filter(|p| live(p) && p.labels().get("pod-template-generation").map(String::as_str) == Some("2")).collect();
        (new.len() == 1).then_some(())
    })
    .await;
}
