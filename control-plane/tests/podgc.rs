//! The pod garbage collector against the real binary with fake nodes: the pods of a deleted
//! node go (also one stuck Terminating), marked Failed with the DisruptionTarget condition
//! first; a terminating pod on an out-of-service node goes; terminated pods beyond the
//! threshold go, oldest first.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use common::fake::{eventually, FakeNodes};
use common::Server;
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{watcher, WatchStreamExt as _};
use kube::ResourceExt as _;
use serde_json::json;

fn pod(name: &str, node: Option<&str>) -> Pod {
    let mut spec = json!({"containers": [{"name": "c", "image": "busybox"}], "restartPolicy": "Never"});
    match node {
        Some(n) => spec["nodeName"] = json!(n),
        // nobody schedules it: it stays unbound
        None => spec["schedulerName"] = json!("nobody"),
    }
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap()
}

/// Aborts the task when dropped (also when the test fails).
struct Abort(tokio::task::JoinHandle<()>);

impl Drop for Abort {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The last state of every pod deleted from now on, by name.
fn record_deletions(api: Api<Pod>) -> (Arc<Mutex<BTreeMap<String, Pod>>>, Abort) {
    let seen: Arc<Mutex<BTreeMap<String, Pod>>> = Arc::default();
    let s = seen.clone();
    let task = tokio::spawn(async move {
        let mut stream = watcher::watcher(api, watcher::Config::default()).default_backoff().boxed();
        while let Some(ev) = stream.next().await {
            if let Ok(watcher::Event::Delete(p)) = ev {
                s.lock().unwrap().insert(p.name_any(), p);
            }
        }
    });
    (seen, Abort(task))
}

async fn gone(api: &Api<Pod>, name: &str) -> bool {
    api.get_opt(name).await.unwrap().is_none()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_of_deleted_and_out_of_service_nodes_and_old_terminated_pods_are_collected() {
    let s = Server::start_with(&["--pod-gc-quarantine", "1s", "--terminated-pod-gc-threshold", "2", "--node-monitor-grace-period", "3s"]);
    let client = s.client().await;
    let nodes = FakeNodes::start(client.clone(), &["n1", "n2", "n3"], "4", "8Gi").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let (deleted, _watch) = record_deletions(pods.clone());
    let pp = PostParams::default();
    for (name, node) in [("on-n2", "n2"), ("also-on-n2", "n2"), ("on-n3", "n3"), ("on-n1", "n1")] {
        pods.create(&pp, &pod(name, Some(node))).await.unwrap();
    }
    eventually("the pods running", || async {
        let l = pods.list(&ListParams::default()).await.unwrap().items;
        (l.iter().filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")).count() == 4).then_some(())
    })
    .await;

    // n2 dies; its pod is deleted but stays Terminating, as nothing confirms it
    nodes.kill("n2");
    pods.delete("on-n2", &DeleteParams::default()).await.unwrap();
    assert!(pods.get("on-n2").await.unwrap().metadata.deletion_timestamp.is_some());
    // the Node goes: after the quarantine its pods go too
    let node_api: Api<Node> = Api::all(client.clone());
    node_api.delete("n2", &DeleteParams::default()).await.unwrap();
    eventually("the terminating pod of deleted n2 gone", || async { gone(&pods, "on-n2").await.then_some(()) }).await;
    eventually("the running pod of deleted n2 gone", || async { gone(&pods, "also-on-n2").await.then_some(()) }).await;
    // the running one was failed first (the terminating one too, but ferro-control-plane
    // completes the deletion of a terminating pod without finalizers at any write)
    let last = eventually("its deletion seen", || async { deleted.lock().unwrap().get("also-on-n2").cloned() }).await;
    let st = last.status.unwrap();
    assert_eq!(st.phase.as_deref(), Some("Failed"));
    let cond = st.conditions.unwrap().into_iter().find(|c| c.type_ == "DisruptionTarget").unwrap();
    assert_eq!((cond.status.as_str(), cond.reason.as_deref()), ("True", Some("DeletionByPodGC")));
    assert_eq!(cond.message.as_deref(), Some("PodGC: node no longer exists"));

    // n3 dies and is declared out of service: its terminating pod goes, the node stays
    nodes.kill("n3");
    pods.delete("on-n3", &DeleteParams::default()).await.unwrap();
    eventually("n3 not ready", || async {
        let n = node_api.get("n3").await.unwrap();
        let ready = n.status?.conditions?.into_iter().find(|c| c.type_ == "Ready")?;
        (ready.status != "True").then_some(())
    })
    .await;
    s.ok(&["taint", "nodes", "n3", "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"]);
    eventually("the terminating pod of out-of-service n3 gone", || async { gone(&pods, "on-n3").await.then_some(()) }).await;
    assert!(node_api.get_opt("n3").await.unwrap().is_some());

    // terminated pods beyond the threshold of 2: the oldest go
    for i in 1..=4 {
        let name = format!("done-{i}");
        pods.create(&pp, &pod(&name, None)).await.unwrap();
        let patch = json!({"status": {"phase": "Succeeded"}});
        pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    }
    eventually("two terminated pods left, the newest", || async {
        let mut names: Vec<String> = pods
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|p| p.name_any().starts_with("done-"))
            .map(|p| p.name_any())
            .collect();
        names.sort();
        (names == ["done-3", "done-4"]).then_some(())
    })
    .await;
    // the running pod on the healthy node was never touched
    assert!(pods.get("on-n1").await.unwrap().metadata.deletion_timestamp.is_none());
}
