//! Job executor (upstream name "job"): plans with [`plan`] and applies a pass in the order the
//! planner's crash-safety needs: adopt/release, delete, create, the interim status with the
//! finished pods' uids, the tracking finalizers' removal, the final status, events. Pods whose
//! Job is gone or finished lose their tracking finalizer through a second queue (upstream's
//! orphan pod queue).

pub mod plan;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferro_runtime::events::Recorder;
use ferro_runtime::{spawn_resync, spawn_workers, Change, Informer, Next, ObjectKey, WorkQueue};
use futures::future::join_all;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt as _};
use serde_json::json;

use self::plan::failure::BackoffRecord;
use self::plan::{controller_of, has_finalizer, orphan_finalizer_removable, Observed, TRACKING_FINALIZER};
use crate::controllers::expectations::Expectations;
use crate::controllers::explain::{ExplainError, Explanation, Subject};
use crate::controllers::manager::{Informers, Options};
use crate::controllers::{is_conflict, is_not_found, Error};
use crate::selector::LabelSelector;

/// Uids of pods whose tracking finalizer this loop removed and the informer has not shown
/// without it yet (upstream `uidTrackingExpectations`): such pods are not counted again.
#[derive(Default)]
struct FinalizerExpectations {
    inner: Mutex<HashMap<ObjectKey, BTreeSet<String>>>,
}

impl FinalizerExpectations {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectKey, BTreeSet<String>>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn expect(&self, key: &ObjectKey, uids: impl IntoIterator<Item = String>) {
        self.lock().entry(key.clone()).or_default().extend(uids);
    }

    fn observed(&self, key: &ObjectKey, uid: &str) {
        let mut m = self.lock();
        if let Some(s) = m.get_mut(key) {
            s.remove(uid);
            if s.is_empty() {
                m.remove(key);
            }
        }
    }

    fn get(&self, key: &ObjectKey) -> BTreeSet<String> {
        self.lock().get(key).cloned().unwrap_or_default()
    }

    fn forget(&self, key: &ObjectKey) {
        self.lock().remove(key);
    }
}

/// What the workers share.
struct Context {
    client: kube::Client,
    jobs: Arc<Informer<Job>>,
    pods: Arc<Informer<Pod>>,
    exp: Arc<Expectations<ObjectKey>>,
    finalizers: Arc<FinalizerExpectations>,
    backoff: Mutex<HashMap<ObjectKey, BackoffRecord>>,
    recorder: Recorder,
}

/// The Job controlling a pod, if any.
fn owner_key(pod: &Pod) -> Option<ObjectKey> {
    controller_of(&pod.metadata).filter(|r| r.kind == "Job").map(|r| ObjectKey::new(pod.namespace().as_deref(), &r.name))
}

fn selects(job: &Job, pod: &Pod) -> bool {
    let Some(sel) = job.spec.as_ref().and_then(|s| s.selector.as_ref()) else { return false };
    LabelSelector::from_api(sel).is_ok_and(|s| !s.is_empty() && s.matches(pod.labels()))
}

/// The Jobs a pod change concerns: its controlling Job (before and after the change), or for
/// an orphan every Job of its namespace selecting it (one may adopt it). `in_namespace` is only
/// called for orphans.
pub fn keys_for_pod(change: &Change<Pod>, in_namespace: impl FnOnce(&str) -> Vec<Arc<Job>>) -> Vec<ObjectKey> {
    let mut keys = Vec::new();
    match change {
        Change::Applied { old, new } => {
            match owner_key(new) {
                Some(k) => keys.push(k),
                None if controller_of(&new.metadata).is_none() => {
                    let ns = new.namespace().unwrap_or_default();
                    keys.extend(in_namespace(&ns).iter().filter(|j| selects(j, new)).map(|j| ObjectKey::of(j.as_ref())));
                }
                None => {}
            }
            if let Some(k) = old.as_deref().and_then(owner_key) {
                if !keys.contains(&k) {
                    keys.push(k);
                }
            }
        }
        Change::Deleted(pod) => keys.extend(owner_key(pod)),
    }
    keys
}

/// The pod key for the orphan queue when a changed pod keeps a tracking finalizer nobody will
/// remove: no controller, or a Job controller that is gone or finished (`job` finds a Job of
/// the pod's namespace by name).
pub fn orphan_key_for_pod(change: &Change<Pod>, job: impl FnOnce(Option<&str>, &str) -> Option<Arc<Job>>) -> Option<ObjectKey> {
    let Change::Applied { new, .. } = change else { return None };
    if !has_finalizer(new) {
        return None;
    }
    let owner = controller_of(&new.metadata).filter(|r| r.kind == "Job").and_then(|r| job(new.namespace().as_deref(), &r.name));
    orphan_finalizer_removable(new, owner.as_deref()).then(|| ObjectKey::of(new.as_ref()))
}

/// Tells the owner's expectations what a pod change shows: a creation, a deletion, a finalizer
/// removal it waited for.
fn observe(exp: &Expectations<ObjectKey>, fin: &FinalizerExpectations, change: &Change<Pod>) {
    let Some(k) = owner_key(change.object()) else { return };
    exp.observe(&k, change);
    match change {
        Change::Applied { new, .. } if !has_finalizer(new) => fin.observed(&k, new.uid().as_deref().unwrap_or_default()),
        Change::Applied { .. } => {}
        Change::Deleted(pod) => fin.observed(&k, pod.uid().as_deref().unwrap_or_default()),
    }
}

pub fn start(inf: &Arc<Informers>, opts: &Options) {
    let queue: WorkQueue<ObjectKey> = WorkQueue::new();
    let orphans: WorkQueue<ObjectKey> = WorkQueue::new();
    let jobs = inf.jobs();
    let pods = inf.pods();
    let exp: Arc<Expectations<ObjectKey>> = Arc::default();
    let finalizers: Arc<FinalizerExpectations> = Arc::default();
    {
        let q = queue.clone();
        jobs.on_change(move |c| q.add(ObjectKey::of(c.object().as_ref())));
    }
    {
        let (q, o, jobs, exp, fin) = (queue.clone(), orphans.clone(), jobs.clone(), exp.clone(), finalizers.clone());
        pods.on_change(move |c| {
            observe(&exp, &fin, c);
            for k in keys_for_pod(c, |ns| jobs.list_namespace(ns)) {
                q.add(k);
            }
            if let Some(k) = orphan_key_for_pod(c, |ns, name| jobs.get(ns, name)) {
                o.add(k);
            }
        });
    }
    {
        let j = jobs.clone();
        spawn_resync(queue.clone(), opts.resync, move || j.keys());
    }
    let client = inf.client();
    let ctx = Arc::new(Context {
        recorder: Recorder::new(client.clone(), "job-controller"),
        client,
        jobs,
        pods,
        exp,
        finalizers,
        backoff: Mutex::default(),
    });
    {
        let ctx = ctx.clone();
        inf.explain().register("job", Arc::new(move |key| Box::pin(explain(ctx.clone(), key))));
    }
    {
        let ctx = ctx.clone();
        spawn_workers("job", queue, 4, move |key: ObjectKey| reconcile(ctx.clone(), key));
    }
    spawn_workers("job-orphan-pod", orphans, 1, move |key: ObjectKey| reconcile_orphan(ctx.clone(), key));
}

/// Removes the tracking finalizer (upstream's strategic merge patch).
async fn remove_finalizer(api: &Api<Pod>, name: &str) -> Result<(), kube::Error> {
    let patch = json!({"metadata": {"$deleteFromPrimitiveList/finalizers": [TRACKING_FINALIZER]}});
    match api.patch(name, &PatchParams::default(), &Patch::Strategic(&patch)).await {
        Ok(_) => Ok(()),
        Err(e) if is_not_found(&e) => Ok(()),
        Err(e) => Err(e),
    }
}

/// A dry run of [`reconcile`] for one Job.
async fn explain(ctx: Arc<Context>, key: ObjectKey) -> Result<Explanation, ExplainError> {
    ctx.jobs.wait_synced().await;
    ctx.pods.wait_synced().await;
    let job = ctx.jobs.get(key.namespace.as_deref(), &key.name).ok_or_else(|| ExplainError::not_found("jobs.batch", &key))?;
    let ns = key.namespace.clone().unwrap_or_default();
    let all = ctx.pods.list_namespace(&ns);
    let refs: Vec<&Pod> = all.iter().map(|p| p.as_ref()).collect();
    let expected = ctx.finalizers.get(&key);
    let record = ctx.backoff.lock().unwrap_or_else(|p| p.into_inner()).get(&key).copied().unwrap_or_default();
    let obs = Observed {
        pods: &refs,
        now: jiff::Timestamp::now(),
        expectations_satisfied: ctx.exp.satisfied(&key),
        expected_removals: &expected,
        backoff: record,
    };
    let p = plan::plan(&job, &obs);
    let uid = job.metadata.uid.clone().unwrap_or_default();
    let spec = job.spec.clone().unwrap_or_default();
    let mut e = Explanation::new("job", Subject::of(job.as_ref()));
    let owned: Vec<&Pod> = refs.iter().copied().filter(|p| controller_of(&p.metadata).is_some_and(|r| r.uid == uid)).collect();
    e.observed = json!({
        "pods": owned.iter().map(|p| {
            let mut o = json!({
                "name": p.name_any(),
                "phase": p.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_else(|| "Pending".into()),
                "tracked": has_finalizer(p),
            });
            if p.metadata.deletion_timestamp.is_some() {
                o["terminating"] = json!(true);
            }
            if let Some(ix) = plan::completion_index(p) {
                o["index"] = json!(ix);
            }
            o
        }).collect::<Vec<_>>(),
        "status": job.status,
    });
    e.wants = json!({
        "completions": spec.completions,
        "parallelism": spec.parallelism.unwrap_or(1),
        "completionMode": spec.completion_mode.as_deref().unwrap_or("NonIndexed"),
        "backoffLimit": spec.backoff_limit.unwrap_or(6),
        "suspend": spec.suspend.unwrap_or(false),
    });
    if let Some(w) = ctx.exp.pending(&key) {
        e.waiting.push(w);
    }
    let a = &mut e.actions;
    a.extend(p.adopt.iter().map(|n| format!("adopt orphan Pod {n} (with the tracking finalizer)")));
    a.extend(p.release.iter().map(|n| format!("release Pod {n}: it no longer matches the selector")));
    a.extend(p.delete.iter().map(|d| {
        let how = if d.remove_finalizer { ", not counted" } else { ", counted as failed" };
        format!("delete Pod {}{how}", d.name)
    }));
    a.extend(p.create.iter().map(|pod| {
        let ix = plan::completion_index(pod).map(|i| format!(" for index {i}")).unwrap_or_default();
        format!("create a Pod{ix}")
    }));
    if let Some(s) = &p.interim_status {
        a.push(format!("write status (uncounted pods recorded first): {}", summary(s)));
    }
    a.extend(p.remove_finalizers.iter().map(|(n, _)| format!("remove the tracking finalizer of Pod {n}")));
    if let Some(s) = &p.status {
        a.push(format!("write status: {}", summary(s)));
    }
    a.extend(p.events.iter().map(|ev| format!("record {} event {}: {}", ev.type_, ev.reason, ev.message)));
    e.waiting.extend(p.waiting.iter().cloned());
    Ok(e.requeue(p.requeue_after))
}

fn summary(s: &k8s_openapi::api::batch::v1::JobStatus) -> String {
    let conds: Vec<String> = s
        .conditions
        .iter()
        .flatten()
        .filter(|c| c.status == "True")
        .map(|c| c.type_.clone())
        .collect();
    let mut out = format!(
        "active {}, ready {}, terminating {}, succeeded {}, failed {}",
        s.active.unwrap_or(0),
        s.ready.unwrap_or(0),
        s.terminating.unwrap_or(0),
        s.succeeded.unwrap_or(0),
        s.failed.unwrap_or(0)
    );
    if !conds.is_empty() {
        out.push_str(&format!(", conditions {}", conds.join(", ")));
    }
    out
}

/// One pass over a Job.
#[tracing::instrument(name = "reconcile", skip_all, fields(controller = "job", key = %key))]
async fn reconcile(ctx: Arc<Context>, key: ObjectKey) -> Result<Next, Error> {
    let Context { client, jobs, pods, exp, finalizers, backoff, recorder } = &*ctx;
    jobs.wait_synced().await;
    pods.wait_synced().await;
    let ns = key.namespace.clone().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let Some(job) = jobs.get(key.namespace.as_deref(), &key.name) else {
        exp.forget(&key);
        finalizers.forget(&key);
        backoff.lock().unwrap_or_else(|p| p.into_inner()).remove(&key);
        // the Job is gone: its pods must not keep the finalizer (upstream cleans them on delete)
        let leftovers: Vec<String> = pods
            .list_namespace(&ns)
            .into_iter()
            .filter(|p| controller_of(&p.metadata).is_some_and(|r| r.kind == "Job" && r.name == key.name))
            .filter(|p| orphan_finalizer_removable(p, None))
            .map(|p| p.name_any())
            .collect();
        for name in leftovers {
            remove_finalizer(&api, &name).await?;
        }
        return Ok(Next::Done);
    };
    let satisfied = exp.satisfied(&key);
    let all = pods.list_namespace(&ns);
    let refs: Vec<&Pod> = all.iter().map(|p| p.as_ref()).collect();
    let expected = finalizers.get(&key);
    let record = backoff.lock().unwrap_or_else(|p| p.into_inner()).get(&key).copied().unwrap_or_default();
    let p = plan::plan(
        &job,
        &Observed { pods: &refs, now: jiff::Timestamp::now(), expectations_satisfied: satisfied, expected_removals: &expected, backoff: record },
    );
    let owner = plan::controller_ref(&job);
    for name in &p.adopt {
        let Some(pod) = pods.get(Some(&ns), name) else { continue };
        let mut owners = pod.owner_references().to_vec();
        owners.push(owner.clone());
        let mut fins = pod.finalizers().to_vec();
        fins.push(TRACKING_FINALIZER.into());
        let patch = json!({"metadata": {"ownerReferences": owners, "finalizers": fins, "resourceVersion": pod.resource_version()}});
        match api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => {}
            Err(e) if is_not_found(&e) || is_conflict(&e) => return Ok(Next::After(Duration::from_millis(200))),
            Err(e) => return Err(e.into()),
        }
    }
    for name in &p.release {
        let Some(pod) = pods.get(Some(&ns), name) else { continue };
        let owners: Vec<_> = pod.owner_references().iter().filter(|r| Some(&r.uid) != job.metadata.uid.as_ref()).cloned().collect();
        let patch = json!({"metadata": {"ownerReferences": owners, "resourceVersion": pod.resource_version()}});
        match api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => {}
            Err(e) if is_not_found(&e) || is_conflict(&e) => return Ok(Next::After(Duration::from_millis(200))),
            Err(e) => return Err(e.into()),
        }
    }
    let mut failure: Option<kube::Error> = None;
    if !p.delete.is_empty() {
        exp.expect(&key, 0, p.delete.iter().map(|d| d.name.clone()));
        let results = join_all(p.delete.iter().map(|d| {
            let api = api.clone();
            async move {
                if d.remove_finalizer {
                    remove_finalizer(&api, &d.name).await?;
                }
                api.delete(&d.name, &DeleteParams::default()).await.map(|_| ())
            }
        }))
        .await;
        for (d, r) in p.delete.iter().zip(results) {
            match r {
                Ok(()) => recorder.record(job.as_ref(), "Normal", "SuccessfulDelete", format!("Deleted pod: {}", d.name)),
                Err(e) if is_not_found(&e) => exp.observed_delete(&key, &d.name),
                Err(e) => {
                    exp.observed_delete(&key, &d.name);
                    recorder.record(job.as_ref(), "Warning", "FailedDelete", format!("Error deleting: {e}"));
                    failure = Some(e);
                }
            }
        }
    }
    if !p.create.is_empty() {
        exp.expect(&key, p.create.len(), []);
        // slow start: 1, 2, 4, ... so a failing template costs one request, not hundreds
        let mut left: &[Pod] = &p.create;
        let mut batch = 1usize;
        while !left.is_empty() {
            let (now, rest) = left.split_at(batch.min(left.len()));
            let pp = PostParams::default();
            let results = join_all(now.iter().map(|pod| api.create(&pp, pod))).await;
            let mut failed = false;
            for r in results {
                match r {
                    Ok(created) => recorder.record(job.as_ref(), "Normal", "SuccessfulCreate", format!("Created pod: {}", created.name_any())),
                    Err(e) => {
                        exp.observed_add(&key);
                        recorder.record(job.as_ref(), "Warning", "FailedCreate", format!("Error creating: {e}"));
                        failure = Some(e);
                        failed = true;
                    }
                }
            }
            left = rest;
            if failed {
                for _ in left {
                    exp.observed_add(&key);
                }
                break;
            }
            batch *= 2;
        }
    }
    if let Some(e) = failure {
        return Err(e.into());
    }
    let job_api: Api<Job> = Api::namespaced(client.clone(), &ns);
    let mut current = (*job).clone();
    if let Some(s) = &p.interim_status {
        current.status = Some(s.clone());
        match job_api.replace_status(&key.name, &PostParams::default(), &current).await {
            Ok(written) => current.metadata.resource_version = written.metadata.resource_version,
            Err(e) if is_not_found(&e) || is_conflict(&e) => return Ok(Next::After(Duration::from_millis(200))),
            Err(e) => return Err(e.into()),
        }
    }
    if !p.remove_finalizers.is_empty() {
        finalizers.expect(&key, p.remove_finalizers.iter().map(|(_, uid)| uid.clone()));
        let results = join_all(p.remove_finalizers.iter().map(|(name, _)| remove_finalizer(&api, name))).await;
        let mut failed = None;
        for ((_, uid), r) in p.remove_finalizers.iter().zip(results) {
            if let Err(e) = r {
                finalizers.observed(&key, uid);
                failed = Some(e);
            }
        }
        if let Some(e) = failed {
            return Err(e.into());
        }
    }
    if let Some(s) = &p.status {
        current.status = Some(s.clone());
        match job_api.replace_status(&key.name, &PostParams::default(), &current).await {
            Ok(_) => {}
            Err(e) if is_not_found(&e) || is_conflict(&e) => return Ok(Next::After(Duration::from_millis(200))),
            Err(e) => return Err(e.into()),
        }
    }
    backoff.lock().unwrap_or_else(|p| p.into_inner()).insert(key.clone(), p.backoff);
    for e in &p.events {
        recorder.record(job.as_ref(), e.type_, &e.reason, e.message.clone());
    }
    Ok(p.requeue_after.map(Next::After).unwrap_or(Next::Done))
}

/// Removes the tracking finalizer of a pod no live Job counts (upstream `syncOrphanPod`).
#[tracing::instrument(name = "reconcile", skip_all, fields(controller = "job-orphan-pod", key = %key))]
async fn reconcile_orphan(ctx: Arc<Context>, key: ObjectKey) -> Result<Next, Error> {
    ctx.jobs.wait_synced().await;
    ctx.pods.wait_synced().await;
    let Some(pod) = ctx.pods.get(key.namespace.as_deref(), &key.name) else { return Ok(Next::Done) };
    let owner = controller_of(&pod.metadata).filter(|r| r.kind == "Job").and_then(|r| ctx.jobs.get(key.namespace.as_deref(), &r.name));
    if !orphan_finalizer_removable(&pod, owner.as_deref()) {
        return Ok(Next::Done);
    }
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), key.namespace.as_deref().unwrap_or_default());
    remove_finalizer(&api, &key.name).await?;
    Ok(Next::Done)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn pod(labels: serde_json::Value, owner: Option<(&str, &str)>, finalizer: bool) -> Arc<Pod> {
        let refs: Vec<_> = owner
            .map(|(kind, name)| json!({"apiVersion": "batch/v1", "kind": kind, "name": name, "uid": format!("uid-{name}"), "controller": true}))
            .into_iter()
            .collect();
        let fins: Vec<&str> = if finalizer { vec![TRACKING_FINALIZER] } else { vec![] };
        Arc::new(
            serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "ns", "uid": "pod-uid", "labels": labels,
                "ownerReferences": refs, "finalizers": fins}}))
            .unwrap(),
        )
    }

    fn job(name: &str, selector: serde_json::Value, finished: bool) -> Arc<Job> {
        let conditions: Vec<_> = if finished { vec![json!({"type": "Complete", "status": "True"})] } else { vec![] };
        Arc::new(
            serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}")},
                "spec": {"selector": selector, "template": {}}, "status": {"conditions": conditions}}))
            .unwrap(),
        )
    }

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new(Some("ns"), name)
    }

    fn no_candidates(_: &str) -> Vec<Arc<Job>> {
        panic!("an owned pod must not look for candidates")
    }

    #[test]
    fn an_owned_pod_maps_to_its_job() {
        let p = pod(json!({}), Some(("Job", "pi")), true);
        assert_eq!(keys_for_pod(&Change::Applied { old: None, new: p.clone() }, no_candidates), [key("pi")]);
        let moved = pod(json!({}), Some(("Job", "other")), true);
        assert_eq!(keys_for_pod(&Change::Applied { old: Some(p.clone()), new: moved }, no_candidates), [key("other"), key("pi")]);
        assert_eq!(keys_for_pod(&Change::Deleted(p), no_candidates), [key("pi")]);
    }

    #[test]
    fn an_orphan_maps_to_the_jobs_selecting_it_and_other_controllers_to_none() {
        let orphan = pod(json!({"app": "a"}), None, false);
        let candidates = vec![job("a", json!({"matchLabels": {"app": "a"}}), false), job("b", json!({"matchLabels": {"app": "b"}}), false)];
        assert_eq!(keys_for_pod(&Change::Applied { old: None, new: orphan.clone() }, |_| candidates), [key("a")]);
        assert!(keys_for_pod(&Change::Deleted(orphan), no_candidates).is_empty());
        let rs_pod = pod(json!({"app": "a"}), Some(("ReplicaSet", "web")), false);
        assert!(keys_for_pod(&Change::Applied { old: None, new: rs_pod }, no_candidates).is_empty());
    }

    #[test]
    fn orphan_queue_gets_pods_whose_finalizer_nobody_removes() {
        let owned = pod(json!({}), Some(("Job", "pi")), true);
        let live = job("pi", json!({}), false);
        let applied = |p: &Arc<Pod>| Change::Applied { old: None, new: p.clone() };
        assert_eq!(orphan_key_for_pod(&applied(&owned), |_, _| Some(live.clone())), None);
        assert_eq!(orphan_key_for_pod(&applied(&owned), |_, _| None), Some(key("p")));
        assert_eq!(orphan_key_for_pod(&applied(&owned), |_, _| Some(job("pi", json!({}), true))), Some(key("p")));
        let orphan = pod(json!({}), None, true);
        assert_eq!(orphan_key_for_pod(&applied(&orphan), |_, _| panic!("no owner to look up")), Some(key("p")));
        let plain = pod(json!({}), Some(("Job", "pi")), false);
        assert_eq!(orphan_key_for_pod(&applied(&plain), |_, _| None), None);
        assert_eq!(orphan_key_for_pod(&Change::Deleted(owned), |_, _| None), None);
    }

    #[test]
    fn expectations_see_creations_deletions_and_finalizer_removals() {
        let exp: Expectations<ObjectKey> = Expectations::default();
        let fin = FinalizerExpectations::default();
        let with = pod(json!({}), Some(("Job", "pi")), true);
        exp.expect(&key("pi"), 1, ["p".to_string()]);
        fin.expect(&key("pi"), ["pod-uid".to_string()]);
        observe(&exp, &fin, &Change::Applied { old: None, new: with.clone() });
        assert!(!exp.satisfied(&key("pi")));
        assert_eq!(fin.get(&key("pi")).len(), 1, "the finalizer is still there");
        let without = pod(json!({}), Some(("Job", "pi")), false);
        observe(&exp, &fin, &Change::Applied { old: Some(with), new: without.clone() });
        assert!(fin.get(&key("pi")).is_empty());
        observe(&exp, &fin, &Change::Deleted(without));
        assert!(exp.satisfied(&key("pi")));
    }
}
