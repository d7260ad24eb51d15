//! PodDisruptionBudgets against the real binary with fake nodes: the disruption loop keeps the
//! budget's status, the eviction subresource grants what it allows and answers upstream's 429
//! beyond, and `kubectl drain` waits for the budget instead of taking every pod at once.
#![allow(clippy::unwrap_used)]

mod common;

use common::fake::{eventually, FakeNodes};
use common::Server;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, EvictParams, ListParams};
use kube::ResourceExt as _;

async fn ready_web(pods: &Api<Pod>) -> Vec<Pod> {
    pods.list(&ListParams::default().labels("app=web"))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| p.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_allows_one_eviction_at_a_time_and_drain_respects_it() {
    let s = Server::start();
    let client = s.client().await;
    let _nodes = FakeNodes::start(client.clone(), &["n1", "n2"], "8", "16Gi").await;
    s.ok(&["create", "deployment", "web", "--image=nginx", "--replicas=3"]);
    s.ok(&["rollout", "status", "deployment/web", "--timeout=90s"]);
    s.ok(&["create", "poddisruptionbudget", "web", "--selector=app=web", "--max-unavailable=1"]);
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), "default");
    let status = eventually("the budget's status", || async {
        let st = pdbs.get("web").await.unwrap().status?;
        (st.expected_pods == 3 && st.current_healthy == 3 && st.disruptions_allowed == 1).then_some(st)
    })
    .await;
    assert_eq!(status.desired_healthy, 2);
    assert_eq!(status.conditions.unwrap()[0].reason, "SufficientPods");
    // kubectl shows upstream's columns.
    let table = s.ok(&["get", "pdb", "web"]);
    assert!(table.contains("MAX UNAVAILABLE") && table.contains("ALLOWED DISRUPTIONS"), "{table}");

    // Bare pods (nothing replaces them) under a budget of minAvailable 2: one eviction is
    // granted, the next is refused with upstream's 429 and the budget's words.
    for i in 1..=3 {
        s.ok(&["run", &format!("solo-{i}"), "--image=nginx", "--labels=app=solo"]);
    }
    s.ok(&["create", "poddisruptionbudget", "solo", "--selector=app=solo", "--min-available=2"]);
    eventually("the solo budget's status", || async {
        let st = pdbs.get("solo").await.unwrap().status?;
        (st.expected_pods == 3 && st.current_healthy == 3 && st.disruptions_allowed == 1).then_some(())
    })
    .await;
    // kube's client would retry the 429 for minutes: this one answers it at once.
    let pods: Api<Pod> = Api::namespaced(s.client_without_retries().await, "default");
    pods.evict("solo-1", &EvictParams::default()).await.unwrap();
    let err = pods.evict("solo-2", &EvictParams::default()).await.unwrap_err();
    let kube::Error::Api(status) = err else { panic!("{err:?}") };
    assert_eq!(status.code, 429, "{status:?}");
    assert_eq!(status.message, "Cannot evict pod as it would violate the pod's disruption budget.");
    assert!(pods.get_opt("solo-2").await.unwrap().is_some_and(|p| p.metadata.deletion_timestamp.is_none()));
    eventually("the budget seeing the eviction", || async {
        let st = pdbs.get("solo").await.unwrap().status?;
        (st.current_healthy == 2 && st.disruptions_allowed == 0).then_some(())
    })
    .await;

    // The bare pods go (drain would refuse them without --force).
    s.ok(&["delete", "pod", "solo-2", "solo-3", "--wait=true", "--timeout=60s"]);

    // Drain a node: kubectl retries the refused evictions until replacements are ready.
    let out = s.ok(&["drain", "n1", "--ignore-daemonsets", "--timeout=120s"]);
    assert!(out.contains("node/n1 drained"), "{out}");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let left: Vec<String> = pods
        .list(&ListParams::default().labels("app=web"))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none() && p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some("n1"))
        .map(|p| p.name_any())
        .collect();
    assert!(left.is_empty(), "pods left on n1: {left:?}");
    eventually("three ready web pods on n2", || async { (ready_web(&pods).await.len() == 3).then_some(()) }).await;

    // Bad input: both minAvailable and maxUnavailable.
    let out = s.kubectl_stdin(
        &["apply", "-f", "-"],
        Some("apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata:\n  name: bad\nspec:\n  minAvailable: 1\n  maxUnavailable: 1\n  selector:\n    matchLabels:\n      app: web\n"),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("minAvailable and maxUnavailable cannot be both set"), "{err}");
}
