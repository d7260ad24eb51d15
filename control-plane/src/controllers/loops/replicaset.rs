//! ReplicaSet executor: plans with `controllers::replicaset` and applies: adopt/release by
//! patching ownerReferences, create pods in slow-start batches, delete the chosen pods, write
//! the status when it changed.

use std::sync::Arc;
use std::time::Duration;

use ferro_runtime::{spawn_resync, spawn_workers, Change, Next, ObjectKey, WorkQueue};
use futures::future::join_all;
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt as _};
use serde_json::json;

use ferro_runtime::events::Recorder;
use crate::controllers::expectations::Expectations;
use crate::controllers::manager::{Informers, Options};
use crate::controllers::replicaset as plan;
use crate::controllers::{is_conflict, is_not_found, Error};
use crate::selector::LabelSelector;

/// The controller ownerReference of an object, if any.
pub fn controller_of(refs: &[OwnerReference]) -> Option<&OwnerReference> {
    refs.iter().find(|r| r.controller == Some(true))
}

pub fn start(inf: &Arc<Informers>, opts: &Options) {
    let queue: WorkQueue<ObjectKey> = WorkQueue::new();
    let rss = inf.replica_sets();
    let pods = inf.pods();
    let exp: Arc<Expectations<ObjectKey>> = Arc::default();
    {
        let q = queue.clone();
        rss.on_change(move |c| q.add(ObjectKey::of(c.object().as_ref())));
    }
    {
        let (q, rss, exp) = (queue.clone(), rss.clone(), exp.clone());
        pods.on_change(move |c| {
            let pod = c.object();
            let ns = pod.namespace().unwrap_or_default();
            let owner = controller_of(pod.owner_references())
                .filter(|r| r.kind == "ReplicaSet")
                .map(|r| ObjectKey::new(Some(&ns), &r.name));
            match c {
                Change::Applied { old, new } => {
                    if let Some(k) = &owner {
                        if old.is_none() {
                            exp.observed_add(k);
                        }
                        if new.metadata.deletion_timestamp.is_some() {
                            exp.observed_delete(k, &new.name_any());
                        }
                        q.add(k.clone());
                    } else {
                        // an orphan: any ReplicaSet selecting it may adopt it
                        for rs in rss.list_namespace(&ns) {
                            if selects(&rs, new) {
                                q.add(ObjectKey::of(rs.as_ref()));
                            }
                        }
                    }
                    // a label change can move a pod out of its old owner's selection
                    if let Some(old) = old {
                        if let Some(r) = controller_of(old.owner_references()).filter(|r| r.kind == "ReplicaSet") {
                            q.add(ObjectKey::new(Some(&ns), &r.name));
                        }
                    }
                }
                Change::Deleted(_) => {
                    if let Some(k) = owner {
                        exp.observed_delete(&k, &pod.name_any());
                        q.add(k);
                    }
                }
            }
        });
    }
    {
        let r = rss.clone();
        spawn_resync(queue.clone(), opts.resync, move || r.keys());
    }
    let client = inf.client();
    let recorder = Recorder::new(client.clone(), "replicaset-controller");
    spawn_workers("replicaset", queue, 4, move |key: ObjectKey| {
        let (client, rss, pods, exp, recorder) = (client.clone(), rss.clone(), pods.clone(), exp.clone(), recorder.clone());
        async move {
            rss.wait_synced().await;
            pods.wait_synced().await;
            let Some(rs) = rss.get(key.namespace.as_deref(), &key.name) else {
                exp.forget(&key);
                return Ok(Next::Done);
            };
            if !exp.satisfied(&key) {
                return Ok(Next::Done);
            }
            let ns = key.namespace.clone().unwrap_or_default();
            let all = pods.list_namespace(&ns);
            let refs: Vec<&Pod> = all.iter().map(|p| p.as_ref()).collect();
            // the Deployment's other ReplicaSets rank deletions by pods per node
            let siblings: Vec<Arc<ReplicaSet>> = match controller_of(rs.owner_references()) {
                Some(owner) => rss
                    .list_namespace(&ns)
                    .into_iter()
                    .filter(|o| o.metadata.uid != rs.metadata.uid && controller_of(o.owner_references()).is_some_and(|r| r.uid == owner.uid))
                    .collect(),
                None => Vec::new(),
            };
            let sibling_refs: Vec<&ReplicaSet> = siblings.iter().map(|r| r.as_ref()).collect();
            let p = plan::plan_with_siblings(&rs, &sibling_refs, &refs, jiff::Timestamp::now());
            let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
            let owner = owner_ref(&rs);
            for name in &p.adopt {
                let Some(pod) = pods.get(Some(&ns), name) else { continue };
                let mut refs = pod.owner_references().to_vec();
                refs.push(owner.clone());
                patch_owners(&api, &pod, refs).await?;
            }
            for name in &p.release {
                let Some(pod) = pods.get(Some(&ns), name) else { continue };
                let refs: Vec<_> = pod.owner_references().iter().filter(|r| Some(&r.uid) != rs.metadata.uid.as_ref()).cloned().collect();
                patch_owners(&api, &pod, refs).await?;
            }
            let mut failure = None;
            if p.create > 0 {
                exp.expect(&key, p.create, []);
                let template = plan::pod_template(&rs);
                // slow start: 1, 2, 4, ... so a failing template costs one request, not hundreds
                let mut left = p.create;
                let mut batch = 1usize;
                while left > 0 {
                    let n = batch.min(left);
                    let pp = PostParams::default();
                    let results = join_all((0..n).map(|_| api.create(&pp, &template))).await;
                    let mut ok = 0;
                    for r in results {
                        match r {
                            Ok(_) => ok += 1,
                            Err(e) => {
                                exp.observed_add(&key);
                                failure = Some(e);
                            }
                        }
                    }
                    left -= n;
                    if ok < n {
                        for _ in 0..left {
                            exp.observed_add(&key);
                        }
                        break;
                    }
                    batch *= 2;
                }
                if p.create > 0 && failure.is_none() {
                    recorder.record(rs.as_ref(), "Normal", "SuccessfulCreate", format!("Created {} pod(s)", p.create));
                }
            }
            if !p.delete.is_empty() {
                exp.expect(&key, 0, p.delete.iter().cloned());
                let dp = DeleteParams::default();
                let results = join_all(p.delete.iter().map(|n| api.delete(n, &dp))).await;
                for (name, r) in p.delete.iter().zip(results) {
                    match r {
                        Ok(_) => {}
                        Err(e) if is_not_found(&e) => exp.observed_delete(&key, name),
                        Err(e) => {
                            exp.observed_delete(&key, name);
                            failure = Some(e);
                        }
                    }
                }
                recorder.record(rs.as_ref(), "Normal", "SuccessfulDelete", format!("Deleted {} pod(s)", p.delete.len()));
            }
            let mut status = p.status.clone();
            if let Some(e) = &failure {
                recorder.record(rs.as_ref(), "Warning", "FailedCreate", format!("Error creating: {e}"));
                status = plan::with_failure_condition(status, &format!("{e}"), jiff::Timestamp::now());
            }
            if p.status_changed || failure.is_some() {
                let mut new = (*rs).clone();
                new.status = Some(status);
                let rs_api: Api<ReplicaSet> = Api::namespaced(client.clone(), &ns);
                match rs_api.replace_status(&key.name, &PostParams::default(), &new).await {
                    Ok(_) => {}
                    Err(e) if is_not_found(&e) || is_conflict(&e) => return Ok(Next::After(Duration::from_millis(100))),
                    Err(e) => return Err(Error::from(e)),
                }
            }
            match failure {
                Some(e) => Err(Error::from(e)),
                None => Ok(p.requeue_after.map(Next::After).unwrap_or(Next::Done)),
            }
        }
    });
}

fn selects(rs: &ReplicaSet, pod: &Pod) -> bool {
    let Some(sel) = rs.spec.as_ref().map(|s| &s.selector) else { return false };
    match LabelSelector::from_api(sel) {
        Ok(s) => !s.is_empty() && s.matches(pod.labels()),
        Err(_) => false,
    }
}

pub fn owner_ref(rs: &ReplicaSet) -> OwnerReference {
    OwnerReference {
        api_version: "apps/v1".into(),
        kind: "ReplicaSet".into(),
        name: rs.name_any(),
        uid: rs.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// Replaces a pod's ownerReferences, guarded by its resourceVersion.
async fn patch_owners(api: &Api<Pod>, pod: &Pod, refs: Vec<OwnerReference>) -> Result<(), Error> {
    let patch = json!({"metadata": {"ownerReferences": refs, "resourceVersion": pod.resource_version()}});
    match api.patch(&pod.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => Ok(()),
        Err(e) if is_not_found(&e) => Ok(()),
        Err(e) => Err(e.into()),
    }
}
