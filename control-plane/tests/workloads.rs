//! The scheduler and the workload, endpoint, node and volume loops against the real binary,
//! with fake nodes (Node + Lease objects kept fresh by the test, pod status set by a stand-in
//! kubelet): kubectl create/scale/set image/rollout status/rollout undo, pod replacement,
//! node failure and eviction, EndpointSlices following readiness, PVC binding, a restart in the
//! middle of a rollout, and bad input.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;

use common::fake::{eventually, FakeNodes};
use common::Server;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Endpoints, Event, Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::ResourceExt as _;
use serde_json::json;

fn live(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && !matches!(p.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
}

fn image(p: &Pod) -> String {
    p.spec.as_ref().unwrap().containers[0].image.clone().unwrap_or_default()
}

async fn pods_of(api: &Api<Pod>, selector: &str) -> Vec<Pod> {
    api.list(&ListParams::default().labels(selector)).await.unwrap().items.into_iter().filter(live).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployment_rollout_scale_undo_and_pod_replacement_with_kubectl() {
    let s = Server::start();
    let client = s.client().await;
    let _nodes = FakeNodes::start(client.clone(), &["n1", "n2", "n3"], "4", "8Gi").await;
    s.ok(&["create", "deployment", "web", "--image=nginx:1.21", "--replicas=3"]);
    s.ok(&["rollout", "status", "deployment/web", "--timeout=90s"]);
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let running = pods_of(&pods, "app=web").await;
    assert_eq!(running.len(), 3);
    let spread: BTreeSet<_> = running.iter().map(|p| p.spec.as_ref().unwrap().node_name.clone().unwrap()).collect();
    assert_eq!(spread.len(), 3, "three pods spread over three empty nodes: {spread:?}");

    s.ok(&["scale", "deployment", "web", "--replicas=5"]);
    s.ok(&["rollout", "status", "deployment/web", "--timeout=90s"]);
    assert_eq!(pods_of(&pods, "app=web").await.len(), 5);

    s.ok(&["set", "image", "deployment/web", "nginx=nginx:1.22"]);
    s.ok(&["rollout", "status", "deployment/web", "--timeout=90s"]);
    let after = pods_of(&pods, "app=web").await;
    assert_eq!(after.len(), 5);
    assert!(after.iter().all(|p| image(p) == "nginx:1.22"), "all pods on 1.22");
    let rss: Api<ReplicaSet> = Api::namespaced(client.clone(), "default");
    assert_eq!(rss.list(&ListParams::default()).await.unwrap().items.len(), 2);

    s.ok(&["rollout", "undo", "deployment/web"]);
    s.ok(&["rollout", "status", "deployment/web", "--timeout=90s"]);
    let undone = pods_of(&pods, "app=web").await;
    assert_eq!(undone.len(), 5);
    assert!(undone.iter().all(|p| image(p) == "nginx:1.21"), "rollback back on 1.21");
    let sets = rss.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(sets.len(), 2, "rollback reuses the old ReplicaSet");
    let history = s.ok(&["rollout", "history", "deployment/web"]);
    assert!(history.contains('3'), "{history}");

    // a deleted pod is replaced
    let victim = undone[0].name_any();
    pods.delete(&victim, &DeleteParams::default()).await.unwrap();
    eventually("deleted pod replaced", || async {
        let now = pods_of(&pods, "app=web").await;
        (now.len() == 5 && now.iter().all(|p| p.name_any() != victim)
            && now.iter().all(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")))
        .then_some(())
    })
    .await;
    // the Deployment's status follows its ReplicaSet's, which follows the pods: it converges a
    // moment after the replacement runs, so wait for it rather than read it once
    let d: Api<Deployment> = Api::namespaced(client.clone(), "default");
    eventually("deployment status counts the replacement", || async {
        let st = d.get("web").await.unwrap().status.unwrap_or_default();
        ((st.replicas, st.updated_replicas, st.available_replicas) == (Some(5), Some(5), Some(5))).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_node_is_tainted_and_its_pods_are_recreated_elsewhere() {
    let s = Server::start_with(&["--node-monitor-grace-period", "4s"]);
    let client = s.client().await;
    let nodes = FakeNodes::start(client.clone(), &["n1", "n2"], "4", "8Gi").await;
    s.apply(
        r#"apiVersion: apps/v1
kind: Deployment
metadata: {name: app}
spec:
  replicas: 4
  selector: {matchLabels: {app: app}}
  template:
    metadata: {labels: {app: app}}
    spec:
      tolerations:
      - {key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute, tolerationSeconds: 2}
      - {key: node.kubernetes.io/not-ready, operator: Exists, effect: NoExecute, tolerationSeconds: 2}
      containers: [{name: c, image: busybox}]
"#,
    );
    s.ok(&["rollout", "status", "deployment/app", "--timeout=90s"]);
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let on_n1 = pods_of(&pods, "app=app").await.iter().filter(|p| p.spec.as_ref().unwrap().node_name.as_deref() == Some("n1")).count();
    assert!(on_n1 > 0, "the scheduler used both nodes");
    nodes.kill("n1");
    let nodes_api: Api<Node> = Api::all(client.clone());
    eventually("n1 marked unreachable", || async {
        let n = nodes_api.get("n1").await.unwrap();
        let tainted = n.spec.as_ref().and_then(|s| s.taints.as_ref()).is_some_and(|t| {
            t.iter().any(|t| t.key == "node.kubernetes.io/unreachable" && t.effect == "NoExecute")
        });
        let unknown = n.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|c| {
            c.iter().any(|c| c.type_ == "Ready" && c.status == "Unknown")
        });
        (tainted && unknown).then_some(())
    })
    .await;
    eventually("all four pods running on n2", || async {
        let now = pods_of(&pods, "app=app").await;
        let ok = now.len() == 4
            && now.iter().all(|p| {
                p.spec.as_ref().unwrap().node_name.as_deref() == Some("n2")
                    && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            });
        ok.then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_slices_follow_readiness_and_termination() {
    let s = Server::start();
    let client = s.client().await;
    let _nodes = FakeNodes::start(client.clone(), &["n1", "n2"], "4", "8Gi").await;
    s.apply(
        r#"apiVersion: v1
kind: Service
metadata: {name: api, labels: {tier: backend}}
spec:
  selector: {app: api}
  ports: [{name: web, port: 80, targetPort: http}]
---
apiVersion: v1
kind: Pod
metadata: {name: api-1, labels: {app: api}, annotations: {fake.ferro.dev/ready: "false", fake.ferro.dev/hold-termination: "true"}}
spec:
  containers: [{name: c, image: busybox, ports: [{name: http, containerPort: 8080}]}]
---
apiVersion: v1
kind: Service
metadata: {name: nobody}
spec:
  selector: {app: nothing-has-this}
  ports: [{port: 80}]
"#,
    );
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    let slice_of = |svc: &'static str| {
        let slices = slices.clone();
        async move {
            let l = slices.list(&ListParams::default().labels(&format!("kubernetes.io/service-name={svc}"))).await.unwrap().items;
            l
        }
    };
    // running but not ready
    let first = eventually("a not-ready endpoint", || async {
        let l = slice_of("api").await;
        let e = l.first()?.endpoints.first()?.clone();
        (e.conditions.as_ref()?.ready == Some(false)).then_some(l)
    })
    .await;
    assert_eq!(first.len(), 1);
    let sl = &first[0];
    assert_eq!(sl.address_type, "IPv4");
    assert_eq!(sl.ports.as_ref().unwrap()[0].port, Some(8080), "named targetPort resolved");
    assert_eq!(sl.labels().get("tier").map(String::as_str), Some("backend"));
    assert_eq!(sl.endpoints[0].target_ref.as_ref().unwrap().name.as_deref(), Some("api-1"));
    assert!(sl.endpoints[0].zone.is_some());
    // ready
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.patch("api-1", &PatchParams::default(), &Patch::Merge(&json!({"metadata": {"annotations": {"fake.ferro.dev/ready": "true"}}})))
        .await
        .unwrap();
    eventually("a ready endpoint", || async {
        let l = slice_of("api").await;
        (l.first()?.endpoints.first()?.conditions.as_ref()?.ready == Some(true)).then_some(())
    })
    .await;
    let eps: Api<Endpoints> = Api::namespaced(client.clone(), "default");
    eventually("legacy endpoints with the address", || async {
        let e = eps.get_opt("api").await.unwrap()?;
        let subset = e.subsets?.into_iter().next()?;
        (subset.addresses?.len() == 1 && subset.ports?[0].port == 8080).then_some(())
    })
    .await;
    // terminating (held by the fake kubelet)
    pods.delete("api-1", &DeleteParams::default()).await.unwrap();
    eventually("a terminating endpoint", || async {
        let l = slice_of("api").await;
        let c = l.first()?.endpoints.first()?.conditions.clone()?;
        (c.terminating == Some(true) && c.ready == Some(false)).then_some(())
    })
    .await;
    // gone
    pods.delete("api-1", &DeleteParams::default().grace_period(0)).await.unwrap();
    eventually("no endpoints left", || async {
        let l = slice_of("api").await;
        (l.len() == 1 && l[0].endpoints.is_empty()).then_some(())
    })
    .await;
    // a selector that matches nothing: one empty slice
    let none = eventually("an empty slice for a selector matching nothing", || async {
        let l = slice_of("nobody").await;
        (!l.is_empty()).then_some(l)
    })
    .await;
    assert!(none.iter().all(|s| s.endpoints.is_empty()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_binds_to_a_matching_volume() {
    let s = Server::start();
    let client = s.client().await;
    s.apply(
        r#"apiVersion: v1
kind: PersistentVolume
metadata: {name: small}
spec:
  capacity: {storage: 100Mi}
  accessModes: [ReadWriteOnce]
  storageClassName: manual
  hostPath: {path: /tmp/small}
---
apiVersion: v1
kind: PersistentVolume
metadata: {name: big}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteOnce]
  storageClassName: manual
  hostPath: {path: /tmp/big}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: manual
  resources: {requests: {storage: 500Mi}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: too-big}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: manual
  resources: {requests: {storage: 5Gi}}
"#,
    );
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let bound = eventually("claim bound", || async {
        let c = claims.get("data").await.unwrap();
        (c.status.as_ref()?.phase.as_deref() == Some("Bound")).then_some(c)
    })
    .await;
    assert_eq!(bound.spec.unwrap().volume_name.as_deref(), Some("big"), "the smallest volume that fits");
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let pv = eventually("volume bound", || async {
        let v = pvs.get("big").await.unwrap();
        (v.status.as_ref()?.phase.as_deref() == Some("Bound")).then_some(v)
    })
    .await;
    assert_eq!(pv.spec.unwrap().claim_ref.unwrap().name.as_deref(), Some("data"));
    // created Pending, made Available by the binder loop on its own pass
    eventually("the small volume available", || async {
        let v = pvs.get("small").await.unwrap();
        (v.status?.phase.as_deref() == Some("Available")).then_some(())
    })
    .await;
    let unfit = claims.get("too-big").await.unwrap();
    assert_ne!(unfit.status.and_then(|s| s.phase).as_deref(), Some("Bound"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_waiting_for_its_claim_is_scheduled_once_the_claim_binds() {
    let s = Server::start();
    let client = s.client().await;
    let _nodes = FakeNodes::start(client.clone(), &["n1"], "4", "8Gi").await;
    s.apply(
        r#"apiVersion: v1
kind: Pod
metadata: {name: user}
spec:
  containers: [{name: c, image: "busybox:1"}]
  volumes: [{name: data, persistentVolumeClaim: {claimName: later}}]
"#,
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    eventually("the pod unschedulable for its claim", || async {
        let p = pods.get("user").await.unwrap();
        let c = p.status?.conditions?.into_iter().find(|c| c.type_ == "PodScheduled")?;
        (c.status == "False" && c.reason.as_deref() == Some("Unschedulable")).then_some(())
    })
    .await;
    // the volume and the claim (an Immediate class) come later: the claim binds, and the
    // claim's change sends the pod back to the scheduler
    s.apply(
        r#"apiVersion: v1
kind: PersistentVolume
metadata: {name: disk}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteOnce]
  storageClassName: manual
  hostPath: {path: /tmp/disk}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: later}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: manual
  resources: {requests: {storage: 500Mi}}
"#,
    );
    eventually("the pod running on n1", || async {
        let p = pods.get("user").await.unwrap();
        let on_n1 = p.spec.as_ref()?.node_name.as_deref() == Some("n1");
        (on_n1 && p.status?.phase.as_deref() == Some("Running")).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_in_the_middle_of_a_rollout_converges() {
    let mut s = Server::start();
    let client = s.client().await;
    let nodes = FakeNodes::start(client.clone(), &["n1", "n2", "n3"], "8", "16Gi").await;
    s.apply(
        r#"apiVersion: apps/v1
kind: Deployment
metadata: {name: roll}
spec:
  replicas: 6
  strategy: {type: RollingUpdate, rollingUpdate: {maxSurge: 1, maxUnavailable: 0}}
  selector: {matchLabels: {app: roll}}
  template:
    metadata: {labels: {app: roll}}
    spec: {containers: [{name: c, image: "busybox:1"}]}
"#,
    );
    s.ok(&["rollout", "status", "deployment/roll", "--timeout=90s"]);
    s.ok(&["set", "image", "deployment/roll", "c=busybox:2"]);
    // stop the control plane mid-rollout, then start it again on the same store
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    s.kill9();
    drop(nodes);
    s.spawn();
    let client = s.client().await;
    let _nodes = FakeNodes::resume(client.clone(), &["n1", "n2", "n3"]).await;
    s.ok(&["rollout", "status", "deployment/roll", "--timeout=90s"]);
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let now = pods_of(&pods, "app=roll").await;
    assert_eq!(now.len(), 6);
    assert!(now.iter().all(|p| image(p) == "busybox:2"));
    let rss: Api<ReplicaSet> = Api::namespaced(client.clone(), "default");
    assert_eq!(rss.list(&ListParams::default()).await.unwrap().items.len(), 2, "no duplicate ReplicaSet after the restart");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_or_explained() {
    let s = Server::start();
    let client = s.client().await;
    let _nodes = FakeNodes::start(client.clone(), &["n1", "n2", "n3"], "2", "4Gi").await;
    // a pod that fits no node
    s.apply(
        r#"apiVersion: v1
kind: Pod
metadata: {name: huge}
spec:
  containers: [{name: c, image: busybox, resources: {requests: {cpu: "100"}}}]
"#,
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let cond = eventually("PodScheduled=False", || async {
        let p = pods.get("huge").await.unwrap();
        p.status?.conditions?.into_iter().find(|c| c.type_ == "PodScheduled" && c.status == "False")
    })
    .await;
    assert_eq!(cond.reason.as_deref(), Some("Unschedulable"));
    let msg = cond.message.unwrap();
    assert!(msg.starts_with("0/3 nodes are available: 3 Insufficient cpu."), "{msg}");
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    eventually("FailedScheduling event", || async {
        let l = events.list(&ListParams::default().fields("involvedObject.name=huge")).await.unwrap().items;
        l.iter().any(|e| e.reason.as_deref() == Some("FailedScheduling")).then_some(())
    })
    .await;
    // a Deployment whose selector does not match its template
    let out = s.kubectl_stdin(
        &["apply", "-f", "-"],
        Some(
            r#"apiVersion: apps/v1
kind: Deployment
metadata: {name: mismatch}
spec:
  selector: {matchLabels: {app: a}}
  template:
    metadata: {labels: {app: b}}
    spec: {containers: [{name: c, image: busybox}]}
"#,
        ),
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("`selector` does not match template `labels`"), "{err}");
    // conflicting ownerReferences: two controllers
    let out = s.kubectl_stdin(
        &["apply", "-f", "-"],
        Some(
            r#"apiVersion: v1
kind: ConfigMap
metadata:
  name: two-controllers
  ownerReferences:
  - {apiVersion: apps/v1, kind: ReplicaSet, name: a, uid: "1", controller: true}
  - {apiVersion: apps/v1, kind: ReplicaSet, name: b, uid: "2", controller: true}
"#,
        ),
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("Only one reference can have Controller set to true"));
}

