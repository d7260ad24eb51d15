//! Deployment executor: plans with `controllers::deployment` (which ReplicaSets to create,
//! scale or delete, and the status) and applies the actions in order.

use std::sync::Arc;
use std::time::Duration;

use ferro_runtime::{spawn_resync, spawn_workers, Next, ObjectKey, WorkQueue};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, ResourceExt as _};

use crate::controllers::deployment::{self as plan, Action};
use ferro_runtime::events::Recorder;
use crate::controllers::loops::replicaset::controller_of;
use crate::controllers::manager::{Informers, Options};
use crate::controllers::{is_conflict, is_not_found, Error};

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
            let rs = c.object();
            if let Some(r) = controller_of(rs.owner_references()).filter(|r| r.kind == "Deployment") {
                q.add(ObjectKey::new(rs.namespace().as_deref(), &r.name));
            }
        });
    }
    {
        // Recreate waits for old pods to be gone: a pod deletion may unblock its deployment.
        let (q, rss) = (queue.clone(), rss.clone());
        pods.on_change(move |c| {
            if let ferro_runtime::Change::Deleted(pod) = c {
                let ns = pod.namespace();
                if let Some(r) = controller_of(pod.owner_references()).filter(|r| r.kind == "ReplicaSet") {
                    if let Some(rs) = rss.get(ns.as_deref(), &r.name) {
                        if let Some(d) = controller_of(rs.owner_references()).filter(|r| r.kind == "Deployment") {
                            q.add(ObjectKey::new(ns.as_deref(), &d.name));
                        }
                    }
                }
            }
        });
    }
    {
        let d = deployments.clone();
        spawn_resync(queue.clone(), opts.resync, move || d.keys());
    }
    let client = inf.client();
    let recorder = Recorder::new(client.clone(), "deployment-controller");
    spawn_workers("deployment", queue, 4, move |key: ObjectKey| {
        let (client, deployments, rss, pods, recorder) =
            (client.clone(), deployments.clone(), rss.clone(), pods.clone(), recorder.clone());
        async move {
            deployments.wait_synced().await;
            rss.wait_synced().await;
            pods.wait_synced().await;
            let Some(d) = deployments.get(key.namespace.as_deref(), &key.name) else { return Ok(Next::Done) };
            let ns = key.namespace.clone().unwrap_or_default();
            let uid = d.metadata.uid.clone().unwrap_or_default();
            let owned: Vec<Arc<ReplicaSet>> = rss
                .list_namespace(&ns)
                .into_iter()
                .filter(|rs| controller_of(rs.owner_references()).is_some_and(|r| r.uid == uid))
                .collect();
            let rs_uids: Vec<String> = owned.iter().filter_map(|rs| rs.metadata.uid.clone()).collect();
            let owned_pods: Vec<Arc<Pod>> = pods
                .list_namespace(&ns)
                .into_iter()
                .filter(|p| controller_of(p.owner_references()).is_some_and(|r| rs_uids.contains(&r.uid)))
                .collect();
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
    });
}
