//! The control loops against the real binary: garbage collection (background, orphan,
//! foreground), namespace deletion, default service accounts, node podCIDR allocation, and the
//! --controllers switch.
#![allow(clippy::unwrap_used)]

mod common;


use common::fake::eventually;
use common::Server;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, ServiceAccount};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

fn cm(name: &str, owner: Option<&ConfigMap>, block: bool) -> ConfigMap {
    let mut v = json!({"metadata": {"name": name}, "data": {"k": "v"}});
    if let Some(o) = owner {
        v["metadata"]["ownerReferences"] = json!([{
            "apiVersion": "v1", "kind": "ConfigMap", "name": o.metadata.name, "uid": o.metadata.uid,
            "blockOwnerDeletion": block,
        }]);
    }
    serde_json::from_value(v).unwrap()
}

async fn exists(api: &Api<ConfigMap>, name: &str) -> bool {
    api.get_opt(name).await.unwrap().is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_collector_cascades_orphans_and_deletes_in_the_foreground() {
    let s = Server::start();
    let client = s.client().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();

    // background: the dependent goes after the owner
    let owner = cms.create(&pp, &cm("owner-bg", None, false)).await.unwrap();
    cms.create(&pp, &cm("dep-bg", Some(&owner), false)).await.unwrap();
    cms.delete("owner-bg", &DeleteParams::background()).await.unwrap();
    eventually("dependent of a deleted owner removed", || async { (!exists(&cms, "dep-bg").await).then_some(()) }).await;

    // orphan: the dependent stays, without the ownerReference; the owner goes
    let owner = cms.create(&pp, &cm("owner-or", None, false)).await.unwrap();
    cms.create(&pp, &cm("dep-or", Some(&owner), false)).await.unwrap();
    cms.delete("owner-or", &DeleteParams::orphan()).await.unwrap();
    eventually("orphaning owner removed", || async { (!exists(&cms, "owner-or").await).then_some(()) }).await;
    let dep = cms.get("dep-or").await.unwrap();
    assert!(dep.metadata.owner_references.unwrap_or_default().is_empty(), "orphan keeps no owner reference");

    // foreground: the owner stays (with its finalizer) until the dependents are gone
    let owner = cms.create(&pp, &cm("owner-fg", None, false)).await.unwrap();
    let mid = cms.create(&pp, &cm("mid-fg", Some(&owner), true)).await.unwrap();
    cms.create(&pp, &cm("leaf-fg", Some(&mid), true)).await.unwrap();
    cms.delete("owner-fg", &DeleteParams::foreground()).await.unwrap();
    eventually("foreground chain removed", || async {
        let all_gone = !exists(&cms, "owner-fg").await && !exists(&cms, "mid-fg").await && !exists(&cms, "leaf-fg").await;
        all_gone.then_some(())
    })
    .await;

    // an ownerReference to an owner that never existed: the object is collected
    let ghost = cm("ghost", None, false);
    let mut dangling = cm("dangling", Some(&ghost), false);
    dangling.metadata.owner_references.as_mut().unwrap()[0].uid = "00000000-0000-0000-0000-000000000000".into();
    cms.create(&pp, &dangling).await.unwrap();
    eventually("object with a missing owner removed", || async { (!exists(&cms, "dangling").await).then_some(()) }).await;
    // one live and one missing owner: only the missing reference is dropped
    let live = cms.create(&pp, &cm("live-owner", None, false)).await.unwrap();
    let mut two = cm("two-owners", Some(&live), false);
    let mut refs = two.metadata.owner_references.clone().unwrap();
    let mut missing = refs[0].clone();
    missing.name = "gone".into();
    missing.uid = "11111111-1111-1111-1111-111111111111".into();
    refs.push(missing);
    two.metadata.owner_references = Some(refs);
    cms.create(&pp, &two).await.unwrap();
    let kept = eventually("missing owner reference dropped", || async {
        let o = cms.get("two-owners").await.unwrap();
        (o.metadata.owner_references.as_ref().map(|r| r.len()) == Some(1)).then_some(o)
    })
    .await;
    assert_eq!(kept.metadata.owner_references.unwrap()[0].name, "live-owner");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_get_a_default_service_account_and_are_emptied_on_delete() {
    let s = Server::start();
    let client = s.client().await;
    let nss: Api<Namespace> = Api::all(client.clone());
    nss.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "team"}})).unwrap())
        .await
        .unwrap();
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), "team");
    eventually("default service account", || async { sas.get_opt("default").await.unwrap() }).await;
    // the service account comes back when deleted
    sas.delete("default", &DeleteParams::default()).await.unwrap();
    eventually("default service account recreated", || async {
        sas.get_opt("default").await.unwrap().filter(|sa| sa.metadata.deletion_timestamp.is_none())
    })
    .await;

    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "team");
    for i in 0..5 {
        cms.create(&PostParams::default(), &cm(&format!("c{i}"), None, false)).await.unwrap();
    }
    nss.delete("team", &DeleteParams::default()).await.unwrap();
    eventually("namespace and its contents deleted", || async { nss.get_opt("team").await.unwrap().is_none().then_some(()) }).await;
    assert!(cms.list(&Default::default()).await.unwrap().items.is_empty());
    // kubectl sees it gone too
    let out = s.kubectl(&["get", "namespace", "team"]);
    assert!(!out.status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_get_pod_cidrs_and_disabled_loops_stay_off() {
    let s = Server::start_with(&[
        "--allocate-node-cidrs",
        "--cluster-cidr",
        "10.244.0.0/16",
        "--controllers",
        "*,-serviceaccount",
    ]);
    let client = s.client().await;
    let nodes: Api<Node> = Api::all(client.clone());
    for n in ["n1", "n2", "n3"] {
        nodes.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": n}})).unwrap()).await.unwrap();
    }
    let mut cidrs = Vec::new();
    for n in ["n1", "n2", "n3"] {
        let c = eventually("pod CIDR assigned", || async {
            nodes.get(n).await.unwrap().spec.and_then(|s| s.pod_cidr)
        })
        .await;
        assert!(c.starts_with("10.244.") && c.ends_with(".0/24"), "{c}");
        cidrs.push(c);
    }
    cidrs.sort();
    cidrs.dedup();
    assert_eq!(cidrs.len(), 3, "every node has its own subnet: {cidrs:?}");
    // The serviceaccount loop is off: the server says which loops it started (the list is
    // written once they all are), and a new namespace has no default account.
    let loops = eventually("the list of started loops in the log", || async {
        s.log().lines().find(|l| l.contains("controller loops started")).map(str::to_string)
    })
    .await;
    // Without the colours of a terminal log.
    let loops: String = loops.split('\u{1b}').map(|part| part.split_once('m').filter(|(code, _)| code.starts_with('[')).map_or(part, |(_, rest)| rest)).collect();
    let names: Vec<&str> = loops.rsplit("loops=").next().unwrap_or_default().split_whitespace().next().unwrap_or_default().split(',').collect();
    assert!(names.contains(&"nodeipam") && names.contains(&"scheduler"), "{loops}");
    assert!(!names.contains(&"serviceaccount"), "{loops}");
    let nss: Api<Namespace> = Api::all(client.clone());
    nss.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "quiet"}})).unwrap())
        .await
        .unwrap();
    let sas: Api<ServiceAccount> = Api::namespaced(client, "quiet");
    assert!(sas.get_opt("default").await.unwrap().is_none());
    // an unknown loop name is refused at start
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ferro-control-plane"))
        .args(["--data-dir", s.data_dir().to_str().unwrap(), "--controllers", "*,-schedular"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown controller"), "{}", String::from_utf8_lossy(&out.stderr));
}
