//! The StatefulSet controller against the real binary with fake nodes: ordered scale up and
//! down (the order read from a pod watch), identity and claims, a partitioned rolling update in
//! reverse ordinal order, `kubectl rollout status/history/undo/restart`, a kill -9 of the
//! control plane in the middle of a rollout, the claim retention policy, adoption after an
//! orphaning delete, failed pod replacement and bad input.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use common::fake::{eventually, FakeNodes};
use common::Server;
use futures::StreamExt as _;
use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet};
use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::ResourceExt as _;
use serde_json::json;

fn live(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
}

fn image(p: &Pod) -> String {
    p.spec.as_ref().unwrap().containers[0].image.clone().unwrap_or_default()
}

fn ready(p: &Pod) -> bool {
    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        && p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

async fn pods_of(api: &Api<Pod>, selector: &str) -> Vec<Pod> {
    let mut l: Vec<Pod> = api.list(&ListParams::default().labels(selector)).await.unwrap().items.into_iter().filter(live).collect();
    l.sort_by_key(|p| p.name_any());
    l
}

/// What a pod watch showed, in order; a pod is (name, uid).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Seen {
    Added(String, String),
    Ready(String, String),
    Terminating(String, String),
    Gone(String, String),
}

/// Records the pod events of a label selector from now on.
struct Recorder {
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Recorder {
    async fn start(api: Api<Pod>, selector: &str) -> Recorder {
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let cfg = watcher::Config::default().labels(selector);
        let task = {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut tx = Some(tx);
                let mut stream = watcher::watcher(api, cfg).boxed();
                while let Some(ev) = stream.next().await {
                    let Ok(ev) = ev else { continue };
                    let mut s = seen.lock().unwrap();
                    let mut note = |e: Seen| {
                        if !s.contains(&e) {
                            s.push(e);
                        }
                    };
                    match ev {
                        watcher::Event::InitDone => {
                            if let Some(tx) = tx.take() {
                                let _ = tx.send(());
                            }
                        }
                        watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
                            let id = (p.name_any(), p.uid().unwrap_or_default());
                            note(Seen::Added(id.0.clone(), id.1.clone()));
                            if ready(&p) {
                                note(Seen::Ready(id.0.clone(), id.1.clone()));
                            }
                            if p.metadata.deletion_timestamp.is_some() {
                                note(Seen::Terminating(id.0, id.1));
                            }
                        }
                        watcher::Event::Delete(p) => {
                            let id = (p.name_any(), p.uid().unwrap_or_default());
                            note(Seen::Terminating(id.0.clone(), id.1.clone()));
                            note(Seen::Gone(id.0, id.1));
                        }
                        watcher::Event::Init => {}
                    }
                }
            })
        };
        rx.await.unwrap();
        Recorder { seen, task }
    }

    fn events(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

/// The position of the first event matching `f`.
fn pos(events: &[Seen], what: &str, f: impl Fn(&Seen) -> bool) -> usize {
    events.iter().position(f).unwrap_or_else(|| panic!("never saw {what}: {events:?}"))
}

fn added(n: &str) -> impl Fn(&Seen) -> bool + '_ {
    move |e| matches!(e, Seen::Added(x, _) if x == n)
}
fn became_ready(n: &str) -> impl Fn(&Seen) -> bool + '_ {
    move |e| matches!(e, Seen::Ready(x, _) if x == n)
}
fn terminating(n: &str) -> impl Fn(&Seen) -> bool + '_ {
    move |e| matches!(e, Seen::Terminating(x, _) if x == n)
}
fn gone(n: &str) -> impl Fn(&Seen) -> bool + '_ {
    move |e| matches!(e, Seen::Gone(x, _) if x == n)
}

async fn events_of(client: &kube::Client, name: &str) -> Vec<Event> {
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    events.list(&ListParams::default().fields(&format!("involvedObject.name={name}"))).await.unwrap().items
}

const WEB: &str = r#"apiVersion: v1
kind: Service
metadata: {name: web}
spec: {clusterIP: None, selector: {app: web}, ports: [{port: 80}]}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: web}
spec:
  serviceName: web
  replicas: 0
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec: {containers: [{name: c, image: busybox}]}
  volumeClaimTemplates:
  - metadata: {name: data}
    spec: {accessModes: [ReadWriteOnce], storageClassName: manual, resources: {requests: {storage: 1Gi}}}
"#;

fn volume(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: PersistentVolume\nmetadata: {{name: {name}}}\nspec:\n  capacity: {{storage: 1Gi}}\n  accessModes: [ReadWriteOnce]\n  storageClassName: manual\n  hostPath: {{path: /tmp/{name}}}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_scale_up_and_down_with_identity_and_claims() {
    let s = Server::start();
    let client = s.client().await;
    let _nodes = FakeNodes::start(client.clone(), &["n1", "n2"], "4", "8Gi").await;
    // static volumes, bound once the pod is scheduled (WaitForFirstConsumer)
    s.apply(
        "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {name: manual}\nprovisioner: kubernetes.io/no-provisioner\nvolumeBindingMode: WaitForFirstConsumer\n",
    );
    for v in ["pv-a", "pv-b", "pv-c"] {
        s.apply(&volume(v));
    }
    s.apply(WEB);
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let rec = Recorder::start(pods.clone(), "app=web").await;

    s.ok(&["scale", "statefulset", "web", "--replicas=3"]);
    s.ok(&["rollout", "status", "statefulset/web", "--timeout=90s"]);
    let now = pods_of(&pods, "app=web").await;
    assert_eq!(now.iter().map(|p| p.name_any()).collect::<Vec<_>>(), ["web-0", "web-1", "web-2"]);
    let ev = rec.events();
    // each pod was created only once its predecessor was ready
    for i in 1..3 {
        let (prev, this) = (format!("web-{}", i - 1), format!("web-{i}"));
        assert!(pos(&ev, &this, added(&this)) > pos(&ev, &prev, became_ready(&prev)), "{this} before {prev} was ready: {ev:?}");
    }
    for (i, p) in now.iter().enumerate() {
        let spec = p.spec.as_ref().unwrap();
        assert_eq!(spec.hostname.as_deref(), Some(p.name_any().as_str()));
        assert_eq!(spec.subdomain.as_deref(), Some("web"));
        let l = p.labels();
        assert_eq!(l.get("statefulset.kubernetes.io/pod-name"), Some(&p.name_any()));
        assert_eq!(l.get("apps.kubernetes.io/pod-index"), Some(&i.to_string()));
        assert!(l.get("controller-revision-hash").is_some_and(|h| h.starts_with("web-")));
        let vol = spec.volumes.as_ref().unwrap().iter().find(|v| v.name == "data").unwrap();
        assert_eq!(vol.persistent_volume_claim.as_ref().unwrap().claim_name, format!("data-web-{i}"));
    }
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let claim_names = || async {
        let l = claims.list(&ListParams::default()).await.unwrap().items;
        l.iter().map(|c| c.name_any()).collect::<BTreeSet<_>>()
    };
    assert_eq!(claim_names().await, ["data-web-0", "data-web-1", "data-web-2"].map(String::from).into());
    // events are posted after the creates return
    eventually("the SuccessfulCreate events of web-0 and its claim", || async {
        let msgs: Vec<String> = events_of(&client, "web").await.into_iter().filter_map(|e| e.message).collect();
        (msgs.iter().any(|m| m == "create Pod web-0 in StatefulSet web successful")
            && msgs.iter().any(|m| m == "create Claim data-web-0 Pod web-0 in StatefulSet web success"))
        .then_some(())
    })
    .await;

    s.ok(&["scale", "statefulset", "web", "--replicas=1"]);
    eventually("scaled down to web-0", || async {
        let now = pods.list(&ListParams::default().labels("app=web")).await.unwrap().items;
        (now.len() == 1 && now[0].name_any() == "web-0").then_some(())
    })
    .await;
    // the recorder's watch may trail the list above
    eventually("the recorder saw web-1 go", || async { rec.events().iter().any(gone("web-1")).then_some(()) }).await;
    let ev = rec.events();
    // web-2 went first, entirely, then web-1
    assert!(pos(&ev, "web-2 gone", gone("web-2")) < pos(&ev, "web-1 terminating", terminating("web-1")), "{ev:?}");
    assert!(!ev.iter().any(terminating("web-0")));
    // the claims stay (whenScaled Retain)
    assert_eq!(claim_names().await.len(), 3);
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), "default");
    eventually("status of one replica", || async {
        let st = sets.get("web").await.unwrap().status?;
        (st.replicas == 1 && st.ready_replicas == Some(1) && st.available_replicas == Some(1)).then_some(())
    })
    .await;
    // scale up again: web-1 comes back with its old claim
    s.ok(&["scale", "statefulset", "web", "--replicas=2"]);
    s.ok(&["rollout", "status", "statefulset/web", "--timeout=90s"]);
    assert_eq!(claim_names().await.len(), 3);
}

const ROLL: &str = r#"apiVersion: apps/v1
kind: StatefulSet
metadata: {name: roll}
spec:
  serviceName: roll
  replicas: 3
  selector: {matchLabels: {app: roll}}
  template:
    metadata: {labels: {app: roll}}
    spec: {containers: [{name: c, image: "busybox:1"}]}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_rolling_update_in_reverse_order_with_rollout_status_history_undo_and_restart() {
    let s = Server::start();
    let client = s.client().await;
    let _nodes = FakeNodes::start(client.clone(), &["n1", "n2"], "4", "8Gi").await;
    s.apply(ROLL);
    s.ok(&["rollout", "status", "statefulset/roll", "--timeout=90s"]);
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let rec = Recorder::start(pods.clone(), "app=roll").await;

    s.ok(&["patch", "statefulset", "roll", "-p", r#"{"spec":{"updateStrategy":{"rollingUpdate":{"partition":2}}}}"#]);
    s.ok(&["set", "image", "statefulset/roll", "c=busybox:2"]);
    let out = s.ok(&["rollout", "status", "statefulset/roll", "--timeout=90s"]);
    assert!(out.contains("partitioned roll out complete: 1 new pods have been updated"), "{out}");
    let now = pods_of(&pods, "app=roll").await;
    assert_eq!(now.iter().map(image).collect::<Vec<_>>(), ["busybox:1", "busybox:1", "busybox:2"]);
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), "default");
    let st = sets.get("roll").await.unwrap().status.unwrap();
    assert_eq!(st.updated_replicas, Some(1));
    assert_ne!(st.current_revision, st.update_revision);

    s.ok(&["patch", "statefulset", "roll", "-p", r#"{"spec":{"updateStrategy":{"rollingUpdate":{"partition":0}}}}"#]);
    s.ok(&["rollout", "status", "statefulset/roll", "--timeout=90s"]);
    let now = eventually("all pods on busybox:2", || async {
        let now = pods_of(&pods, "app=roll").await;
        (now.len() == 3 && now.iter().all(|p| image(p) == "busybox:2" && ready(p))).then_some(now)
    })
    .await;
    assert_eq!(now.len(), 3);
    let ev = rec.events();
    // reverse ordinal order, each after its successor came back ready
    let t2 = pos(&ev, "web-2 terminating", terminating("roll-2"));
    let t1 = pos(&ev, "web-1 terminating", terminating("roll-1"));
    let t0 = pos(&ev, "web-0 terminating", terminating("roll-0"));
    assert!(t2 < t1 && t1 < t0, "{ev:?}");
    let back = |n: &'static str, after: usize| {
        ev.iter().skip(after).position(|e| matches!(e, Seen::Ready(x, _) if x == n)).map(|p| p + after)
    };
    assert!(back("roll-2", t2).unwrap() < t1, "roll-1 went before roll-2 was back: {ev:?}");
    assert!(back("roll-1", t1).unwrap() < t0, "roll-0 went before roll-1 was back: {ev:?}");
    eventually("rolling update complete in the status", || async {
        let st = sets.get("roll").await.unwrap().status?;
        (st.current_revision == st.update_revision && st.current_replicas == Some(3) && st.updated_replicas == Some(3)).then_some(())
    })
    .await;

    let history = s.ok(&["rollout", "history", "statefulset/roll"]);
    let revs: Vec<&str> = history.lines().filter_map(|l| l.split_whitespace().next()).filter(|w| w.parse::<i64>().is_ok()).collect();
    assert_eq!(revs, ["1", "2"], "{history}");
    let two = s.ok(&["rollout", "history", "statefulset/roll", "--revision=2"]);
    assert!(two.contains("busybox:2"), "{two}");

    let out = s.ok(&["rollout", "undo", "statefulset/roll"]);
    assert!(out.contains("rolled back"), "{out}");
    s.ok(&["rollout", "status", "statefulset/roll", "--timeout=90s"]);
    eventually("all pods back on busybox:1", || async {
        let now = pods_of(&pods, "app=roll").await;
        (now.len() == 3 && now.iter().all(|p| image(p) == "busybox:1" && ready(p))).then_some(())
    })
    .await;
    let history = s.ok(&["rollout", "history", "statefulset/roll"]);
    let revs: Vec<&str> = history.lines().filter_map(|l| l.split_whitespace().next()).filter(|w| w.parse::<i64>().is_ok()).collect();
    assert_eq!(revs, ["2", "3"], "the old revision was renumbered: {history}");
    let crs: Api<ControllerRevision> = Api::namespaced(client.clone(), "default");
    assert_eq!(crs.list(&ListParams::default()).await.unwrap().items.len(), 2);

    // kubectl rollout restart: a new revision, every pod replaced
    let before: BTreeSet<String> = pods_of(&pods, "app=roll").await.iter().map(|p| p.uid().unwrap()).collect();
    s.ok(&["rollout", "restart", "statefulset/roll"]);
    s.ok(&["rollout", "status", "statefulset/roll", "--timeout=90s"]);
    eventually("every pod replaced", || async {
        let now = pods_of(&pods, "app=roll").await;
        let fresh = now.iter().all(|p| !before.contains(&p.uid().unwrap()) && ready(p));
        (now.len() == 3 && fresh).then_some(())
    })
    .await;
    assert_eq!(crs.list(&ListParams::default()).await.unwrap().items.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_9_in_the_middle_of_a_rollout_converges_without_duplicates() {
    let mut s = Server::start();
    let client = s.client().await;
    let nodes = FakeNodes::start(client.clone(), &["n1", "n2"], "4", "8Gi").await;
    s.apply(ROLL);
    s.ok(&["rollout", "status", "statefulset/roll", "--timeout=90s"]);
    s.ok(&["set", "image", "statefulset/roll", "c=busybox:2"]);
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    eventually("the rollout under way", || async {
        let now = pods_of(&pods, "app=roll").await;
        now.iter().any(|p| image(p) == "busybox:2").then_some(())
    })
    .await;
    s.kill9();
    drop(nodes);
    s.spawn();
    let client = s.client().await;
    let _nodes = FakeNodes::resume(client.clone(), &["n1", "n2"]).await;
    s.ok(&["rollout", "status", "statefulset/roll", "--timeout=90s"]);
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let now = eventually("all pods on busybox:2", || async {
        let now = pods_of(&pods, "app=roll").await;
        now.iter().all(|p| image(p) == "busybox:2" && ready(p)).then_some(now)
    })
    .await;
    let all = pods.list(&ListParams::default().labels("app=roll")).await.unwrap().items;
    assert_eq!(all.iter().map(|p| p.name_any()).collect::<Vec<_>>(), ["roll-0", "roll-1", "roll-2"], "no duplicate pod");
    assert_eq!(now.len(), 3);
    let crs: Api<ControllerRevision> = Api::namespaced(client.clone(), "default");
    assert_eq!(crs.list(&ListParams::default()).await.unwrap().items.len(), 2, "no duplicate revision");
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), "default");
    eventually("status converged", || async {
        let st = sets.get("roll").await.unwrap().status?;
        (st.current_revision == st.update_revision && st.ready_replicas == Some(3)).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_pods_are_recreated_and_bad_input_is_refused() {
    let s = Server::start();
    let client = s.client().await;
    let nodes = FakeNodes::start(client.clone(), &["n1", "n2"], "4", "8Gi").await;
    s.apply(&ROLL.replace("replicas: 3", "replicas: 1"));
    s.ok(&["rollout", "status", "statefulset/roll", "--timeout=90s"]);
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let first = pods.get("roll-0").await.unwrap();
    // its kubelet stops, then the pod fails
    let node = first.spec.as_ref().unwrap().node_name.clone().unwrap();
    nodes.kill(&node);
    let failed = json!({"status": {"phase": "Failed"}});
    pods.patch_status("roll-0", &PatchParams::default(), &Patch::Merge(&failed)).await.unwrap();
    eventually("roll-0 recreated", || async {
        let p = pods.get_opt("roll-0").await.unwrap()?;
        (p.uid() != first.uid()).then_some(())
    })
    .await;
    eventually("the RecreatingFailedPod event", || async {
        let msgs: Vec<String> = events_of(&client, "roll").await.into_iter().filter_map(|e| e.message).collect();
        msgs.iter().any(|m| m == "StatefulSet default/roll is recreating failed Pod roll-0").then_some(())
    })
    .await;

    // a selector that does not select the template
    let out = s.kubectl_stdin(&["apply", "-f", "-"], Some(&ROLL.replace("name: roll}", "name: bad}").replace("labels: {app: roll}", "labels: {app: other}")));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("`selector` does not match template `labels`"), "{err}");
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), "default");
    let bad: StatefulSet = serde_yaml::from_str(&ROLL.replace("name: roll}", "name: bad}").replace("labels: {app: roll}", "labels: {app: other}")).unwrap();
    match sets.create(&PostParams::default(), &bad).await {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 422, "{e:?}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_set_with_claims_deleted_by_the_retention_policy() {
    let s = Server::start();
    let client = s.client().await;
    let _nodes = FakeNodes::start(client.clone(), &["n1", "n2"], "4", "8Gi").await;
    s.apply(
        "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {name: manual}\nprovisioner: kubernetes.io/no-provisioner\nvolumeBindingMode: WaitForFirstConsumer\n",
    );
    for v in ["pv-a", "pv-b", "pv-c"] {
        s.apply(&volume(v));
    }
    s.apply(
        &WEB.replace("replicas: 0", "replicas: 3\n  podManagementPolicy: Parallel\n  persistentVolumeClaimRetentionPolicy: {whenDeleted: Delete, whenScaled: Delete}"),
    );
    s.ok(&["rollout", "status", "statefulset/web", "--timeout=90s"]);
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    assert_eq!(pods_of(&pods, "app=web").await.len(), 3);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), "default");
    let uid = sets.get("web").await.unwrap().uid().unwrap();
    let owned_by_set = eventually("claims owned by the set", || async {
        let l = claims.list(&ListParams::default()).await.unwrap().items;
        let owned = l.iter().all(|c| c.owner_references().iter().any(|r| r.kind == "StatefulSet" && r.uid == uid));
        (l.len() == 3 && owned).then_some(l)
    })
    .await;
    assert_eq!(owned_by_set.len(), 3);

    // scaled down: the claims of the pods that went go with them
    s.ok(&["scale", "statefulset", "web", "--replicas=1"]);
    eventually("claims of web-1 and web-2 deleted", || async {
        let l = claims.list(&ListParams::default()).await.unwrap().items;
        let names: Vec<String> = l.iter().filter(|c| c.metadata.deletion_timestamp.is_none()).map(|c| c.name_any()).collect();
        (names == ["data-web-0"]).then_some(())
    })
    .await;
    assert_eq!(pods_of(&pods, "app=web").await.len(), 1);

    // the set deleted: its pods and its remaining claim go
    s.ok(&["delete", "statefulset", "web"]);
    eventually("pods and claims gone with the set", || async {
        let c = claims.list(&ListParams::default()).await.unwrap().items;
        let p = pods.list(&ListParams::default().labels("app=web")).await.unwrap().items;
        (c.is_empty() && p.is_empty()).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_recreated_after_an_orphaning_delete_adopts_its_pods_and_history() {
    let s = Server::start();
    let client = s.client().await;
    let _nodes = FakeNodes::start(client.clone(), &["n1", "n2"], "4", "8Gi").await;
    s.apply(&ROLL.replace("replicas: 3", "replicas: 2"));
    s.ok(&["rollout", "status", "statefulset/roll", "--timeout=90s"]);
    s.ok(&["set", "image", "statefulset/roll", "c=busybox:2"]);
    s.ok(&["rollout", "status", "statefulset/roll", "--timeout=90s"]);
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let before: Vec<String> = pods_of(&pods, "app=roll").await.iter().map(|p| p.uid().unwrap()).collect();
    let crs: Api<ControllerRevision> = Api::namespaced(client.clone(), "default");
    s.ok(&["delete", "statefulset", "roll", "--cascade=orphan"]);
    eventually("pods and revisions orphaned", || async {
        let p = pods.list(&ListParams::default().labels("app=roll")).await.unwrap().items;
        let r = crs.list(&ListParams::default()).await.unwrap().items;
        let orphaned = p.iter().all(|p| p.owner_references().is_empty()) && r.iter().all(|r| r.owner_references().is_empty());
        (p.len() == 2 && r.len() == 2 && orphaned).then_some(())
    })
    .await;
    s.apply(&ROLL.replace("replicas: 3", "replicas: 2").replace("busybox:1", "busybox:2"));
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), "default");
    let uid = sets.get("roll").await.unwrap().uid().unwrap();
    eventually("pods and revisions adopted", || async {
        let p = pods.list(&ListParams::default().labels("app=roll")).await.unwrap().items;
        let r = crs.list(&ListParams::default()).await.unwrap().items;
        let owned = |refs: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference]| refs.iter().any(|o| o.uid == uid);
        (p.iter().all(|p| owned(p.owner_references())) && r.iter().all(|r| owned(r.owner_references()))).then_some(())
    })
    .await;
    s.ok(&["rollout", "status", "statefulset/roll", "--timeout=90s"]);
    let after: Vec<String> = pods_of(&pods, "app=roll").await.iter().map(|p| p.uid().unwrap()).collect();
    assert_eq!(before, after, "the adopted pods kept running");
    assert_eq!(crs.list(&ListParams::default()).await.unwrap().items.len(), 2, "the history was adopted, not duplicated");
    let history = s.ok(&["rollout", "history", "statefulset/roll"]);
    let revs: Vec<&str> = history.lines().filter_map(|l| l.split_whitespace().next()).filter(|w| w.parse::<i64>().is_ok()).collect();
    assert_eq!(revs, ["1", "2"], "{history}");
}
