//! Deployment executor: plans with [`plan`] (which ReplicaSets to create,
//! scale or delete, and the status) and applies the actions in order.

pub mod plan;

use std::sync::Arc;
use std::time::Duration;

use ferro_runtime::{spawn_resync, spawn_workers, Change, Informer, Next, ObjectKey, WorkQueue};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, ResourceExt as _};
use serde_json::json;

use self::plan::Action;
use ferro_runtime::events::Recorder;
use crate::controllers::replicaset::controller_of;
use crate::controllers::explain::{ExplainError, Explanation, Subject};
use crate::controllers::manager::{Informers, Options};
use crate::controllers::{is_conflict, is_not_found, Error};

/// What the workers share.
struct Context {
    client: kube::Client,
    deployments: Arc<Informer<Deployment>>,
    rss: Arc<Informer<ReplicaSet>>,
    pods: Arc<Informer<Pod>>,
    recorder: Recorder,
}

/// The Deployment controlling a ReplicaSet, if any.
pub fn keys_for_replicaset(rs: &ReplicaSet) -> Vec<ObjectKey> {
    controller_of(rs.owner_references())
        .filter(|r| r.kind == "Deployment")
        .map(|r| ObjectKey::new(rs.namespace().as_deref(), &r.name))
        .into_iter()
        .collect()
}

/// A deleted pod's Deployment (through its controlling ReplicaSet, found with `replicaset`):
/// Recreate waits for old pods to be gone. Other pod changes concern no Deployment.
pub fn keys_for_pod(change: &Change<Pod>, replicaset: impl Fn(Option<&str>, &str) -> Option<Arc<ReplicaSet>>) -> Vec<ObjectKey> {
    let Change::Deleted(pod) = change else { return Vec::new() };
    let ns = pod.namespace();
    controller_of(pod.owner_references())
        .filter(|r| r.kind == "ReplicaSet")
        .and_then(|r| replicaset(ns.as_deref(), &r.name))
        .map(|rs| keys_for_replicaset(&rs))
        .unwrap_or_default()
}

pub fn start(inf: &Arc<Informers>, opts: &Options) {
    let queue: WorkQueue<ObjectKey> = WorkQueue::new();
    let deployments = inf.deployments();
    let rss = inf.replica_sets();
    let pods = inf.pods();
    {
        let q = queue.clone();
        deployments.on_change(move |c| q.add(ObjectKey::of(c.object().as_ref())));
    }
    {
        let q = queue.clone();
        rss.on_change(move |c| {
            for k in keys_for_replicaset(c.object()) {
                q.add(k);
            }
        });
    }
    {
        // Recreate waits for old pods to be gone: a pod deletion may unblock its deployment.
        let (q, rss) = (queue.clone(), rss.clone());
        pods.on_change(move |c| {
            for k in keys_for_pod(c, |ns, name| rss.get(ns, name)) {
                q.add(k);
            }
        });
    }
    {
        let d = deployments.clone();
        spawn_resync(queue.clone(), opts.resync, move || d.keys());
    }
    let client = inf.client();
    let ctx = Arc::new(Context { recorder: Recorder::new(client.clone(), "deployment-controller"), client, deployments, rss, pods });
    {
        let ctx = ctx.clone();
        inf.explain().register("deployment", Arc::new(move |key| Box::pin(explain(ctx.clone(), key))));
    }
    spawn_workers("deployment", queue, 4, move |key: ObjectKey| reconcile(ctx.clone(), key));
}

/// The ReplicaSets a Deployment controls and their pods.
fn owned(ctx: &Context, d: &Deployment) -> (Vec<Arc<ReplicaSet>>, Vec<Arc<Pod>>) {
    let ns = d.namespace().unwrap_or_default();
    let uid = d.metadata.uid.clone().unwrap_or_default();
    let rss: Vec<Arc<ReplicaSet>> = ctx
        .rss
        .list_namespace(&ns)
        .into_iter()
        .filter(|rs| controller_of(rs.owner_references()).is_some_and(|r| r.uid == uid))
        .collect();
    let rs_uids: Vec<String> = rss.iter().filter_map(|rs| rs.metadata.uid.clone()).collect();
    let pods = ctx
        .pods
        .list_namespace(&ns)
        .into_iter()
        .filter(|p| controller_of(p.owner_references()).is_some_and(|r| rs_uids.contains(&r.uid)))
        .collect();
    (rss, pods)
}

/// A dry run of [`reconcile`] for one Deployment.
async fn explain(ctx: Arc<Context>, key: ObjectKey) -> Result<Explanation, ExplainError> {
    ctx.deployments.wait_synced().await;
    ctx.rss.wait_synced().await;
    ctx.pods.wait_synced().await;
    let d = ctx.deployments.get(key.namespace.as_deref(), &key.name).ok_or_else(|| ExplainError::not_found("deployments.apps", &key))?;
    let (rss, pods) = owned(&ctx, &d);
    let rs_refs: Vec<&ReplicaSet> = rss.iter().map(|r| r.as_ref()).collect();
    let pod_refs: Vec<&Pod> = pods.iter().map(|p| p.as_ref()).collect();
    let actions = plan::plan(&d, &rs_refs, &pod_refs, jiff::Timestamp::now());
    let spec = d.spec.clone().unwrap_or_default();
    let replicas = spec.replicas.unwrap_or(1);
    let mut e = Explanation::new("deployment", Subject::of(d.as_ref()));
    e.observed = json!({
        "replicaSets": rss.iter().map(|rs| json!({
            "name": rs.name_any(),
            "revision": rs.annotations().get("deployment.kubernetes.io/revision"),
            "replicas": rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0),
            "ready": rs.status.as_ref().and_then(|s| s.ready_replicas).unwrap_or(0),
            "available": rs.status.as_ref().and_then(|s| s.available_replicas).unwrap_or(0),
        })).collect::<Vec<_>>(),
        "status": d.status,
    });
    e.wants = json!({
        "replicas": replicas,
        "strategy": spec.strategy,
        "maxSurge": plan::max_surge(&d),
        "maxUnavailable": plan::max_unavailable(&d),
        "paused": spec.paused.unwrap_or(false),
    });
    let mut requeue = None;
    for a in &actions {
        e.actions.push(match a {
            Action::CreateReplicaSet(rs) => format!(
                "create ReplicaSet {} with {} replicas",
                rs.name_any(),
                rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0)
            ),
            Action::UpdateReplicaSet(rs) => format!(
                "update ReplicaSet {} to {} replicas",
                rs.name_any(),
                rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0)
            ),
            Action::DeleteReplicaSet { name } => format!("delete ReplicaSet {name}: beyond revisionHistoryLimit"),
            Action::UpdateDeploymentAnnotations(_) => "update the Deployment's revision annotation".to_string(),
            Action::UpdateStatus(s) => format!(
                "write status: replicas {}, updated {}, ready {}, available {}, unavailable {}",
                s.replicas.unwrap_or(0),
                s.updated_replicas.unwrap_or(0),
                s.ready_replicas.unwrap_or(0),
                s.available_replicas.unwrap_or(0),
                s.unavailable_replicas.unwrap_or(0)
            ),
            Action::Event { type_, reason, message } => format!("record {type_} event {reason}: {message}"),
            Action::RequeueAfter(d) => {
                requeue = Some(*d);
                continue;
            }
        });
    }
    let st = d.status.clone().unwrap_or_default();
    let scales = actions.iter().any(|a| matches!(a, Action::CreateReplicaSet(_) | Action::UpdateReplicaSet(_)));
    if spec.paused == Some(true) {
        e.waiting.push("the Deployment is paused: only scaling is applied, no rollout".into());
    } else if !scales && (st.updated_replicas.unwrap_or(0) < replicas || st.replicas.unwrap_or(0) > replicas) {
        e.waiting.push(format!(
            "the rollout waits for pods to become available: {} available of {replicas} wanted, {} updated; maxUnavailable {} and maxSurge {} allow no further step now",
            st.available_replicas.unwrap_or(0),
            st.updated_replicas.unwrap_or(0),
            plan::max_unavailable(&d),
            plan::max_surge(&d)
        ));
    }
    Ok(e.requeue(requeue))
}

/// One pass over a Deployment: the planner's actions in order, stopping at the first failure.
#[tracing::instrument(name = "reconcile", skip_all, fields(controller = "deployment", key = %key))]
async fn reconcile(ctx: Arc<Context>, key: ObjectKey) -> Result<Next, Error> {
    let Context { client, deployments, rss, pods, recorder } = &*ctx;
    deployments.wait_synced().await;
    rss.wait_synced().await;
    pods.wait_synced().await;
    let Some(d) = deployments.get(key.namespace.as_deref(), &key.name) else { return Ok(Next::Done) };
    let ns = key.namespace.clone().unwrap_or_default();
    let uid = d.metadata.uid.clone().unwrap_or_default();
    let (owned, owned_pods) = owned(&ctx, &d);
    let rs_refs: Vec<&ReplicaSet> = owned.iter().map(|r| r.as_ref()).collect();
    let pod_refs: Vec<&Pod> = owned_pods.iter().map(|p| p.as_ref()).collect();
    let actions = plan::plan(&d, &rs_refs, &pod_refs, jiff::Timestamp::now());
    let rs_api: Api<ReplicaSet> = Api::namespaced(client.clone(), &ns);
    let d_api: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let mut next = Next::Done;
    for action in actions {
        let result = match action {
            Action::CreateReplicaSet(rs) => {
                let name = rs.name_any();
                match rs_api.create(&PostParams::default(), &rs).await {
                    Ok(_) => Ok(()),
                    Err(e) if is_conflict(&e) => {
                        // AlreadyExists: our own ReplicaSet not yet in the cache, or a
                        // hash collision with someone else's (then bump collisionCount)
                        let existing = rs_api.get_opt(&name).await?;
                        let ours = existing.as_ref().is_some_and(|x| {
                            controller_of(x.owner_references()).is_some_and(|r| r.uid == uid)
                                && match (x.spec.as_ref().and_then(|s| s.template.as_ref()), rs.spec.as_ref().and_then(|s| s.template.as_ref())) {
                                    (Some(a), Some(b)) => plan::equal_ignore_hash(a, b),
                                    _ => false,
                                }
                        });
                        if !ours {
                            let mut new = (*d).clone();
                            new.status = Some(plan::with_collision_count_bumped(&d));
                            d_api.replace_status(&key.name, &PostParams::default(), &new).await?;
                        }
                        return Ok(Next::After(Duration::from_millis(200)));
                    }
                    Err(e) => {
                        let mut new = (*d).clone();
                        new.status = Some(plan::with_failed_create_condition(&d, &name, &e.to_string(), jiff::Timestamp::now()));
                        let _ = d_api.replace_status(&key.name, &PostParams::default(), &new).await;
                        Err(e)
                    }
                }
            }
            Action::UpdateReplicaSet(rs) => rs_api.replace(&rs.name_any(), &PostParams::default(), &rs).await.map(|_| ()),
            Action::UpdateDeploymentAnnotations(annotations) => {
                let patch = serde_json::json!({"metadata": {"annotations": annotations, "resourceVersion": d.resource_version()}});
                d_api
                    .patch(&key.name, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch))
                    .await
                    .map(|_| ())
            }
            Action::Event { type_, reason, message } => {
                recorder.record(d.as_ref(), &type_, &reason, message);
                Ok(())
            }
            Action::RequeueAfter(after) => {
                next = Next::After(after);
                Ok(())
            }
            Action::DeleteReplicaSet { name } => rs_api.delete(&name, &DeleteParams::background()).await.map(|_| ()),
            Action::UpdateStatus(status) => {
                let mut new = (*d).clone();
                new.status = Some(status);
                d_api.replace_status(&key.name, &PostParams::default(), &new).await.map(|_| ())
            }
        };
        match result {
            Ok(()) => {}
            Err(e) if is_not_found(&e) => {}
            // a stale view: look again once the informers caught up
            Err(e) if is_conflict(&e) => return Ok(Next::After(Duration::from_millis(200))),
            Err(e) => return Err(Error::from(e)),
        }
    }
    Ok(next)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn owned_by<K: serde::de::DeserializeOwned>(name: &str, owner: Option<(&str, &str)>) -> Arc<K> {
        let refs: Vec<_> = owner
            .map(|(kind, n)| json!({"apiVersion": "apps/v1", "kind": kind, "name": n, "uid": format!("uid-{n}"), "controller": true}))
            .into_iter()
            .collect();
        Arc::new(serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ns", "ownerReferences": refs}})).unwrap())
    }

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new(Some("ns"), name)
    }

    #[test]
    fn a_replicaset_maps_to_its_deployment_only() {
        let rs: Arc<ReplicaSet> = owned_by("web-1", Some(("Deployment", "web")));
        assert_eq!(keys_for_replicaset(&rs), [key("web")]);
        let orphan: Arc<ReplicaSet> = owned_by("lone", None);
        assert!(keys_for_replicaset(&orphan).is_empty());
        let other: Arc<ReplicaSet> = owned_by("x", Some(("SomethingElse", "y")));
        assert!(keys_for_replicaset(&other).is_empty());
    }

    #[test]
    fn a_deleted_pod_maps_to_its_replicasets_deployment() {
        let rs: Arc<ReplicaSet> = owned_by("web-1", Some(("Deployment", "web")));
        let lookup = |ns: Option<&str>, name: &str| (ns == Some("ns") && name == "web-1").then(|| rs.clone());
        let pod: Arc<Pod> = owned_by("p", Some(("ReplicaSet", "web-1")));
        assert_eq!(keys_for_pod(&Change::Deleted(pod.clone()), lookup), [key("web")]);
        // only deletions matter (Recreate waits for old pods to be gone)
        assert!(keys_for_pod(&Change::Applied { old: None, new: pod }, lookup).is_empty());
        // a ReplicaSet not in the cache, an orphan pod, a pod of another kind: nothing
        let gone: Arc<Pod> = owned_by("p", Some(("ReplicaSet", "web-0")));
        assert!(keys_for_pod(&Change::Deleted(gone), lookup).is_empty());
        let orphan: Arc<Pod> = owned_by("p", None);
        assert!(keys_for_pod(&Change::Deleted(orphan), lookup).is_empty());
        let job_pod: Arc<Pod> = owned_by("p", Some(("Job", "web-1")));
        assert!(keys_for_pod(&Change::Deleted(job_pod), lookup).is_empty());
    }
}
