//! DaemonSet executor: brings the ControllerRevisions up to date ([`plan::plan_history`]),
//! plans the pods with [`plan::plan`] and applies: adopt/release pods, delete, create daemon
//! pods in slow-start batches (the scheduler binds them through their node name affinity),
//! write the status, delete old revisions. Expectations hold a DaemonSet back until the informer
//! saw its own creations and deletions; a per-node back-off (1 s doubling to 15 min, upstream's
//! `failedPodsBackoff`) paces the replacement of failed pods.

pub mod plan;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferro_runtime::events::Recorder;
use ferro_runtime::{spawn_resync, spawn_workers, Change, Informer, Next, ObjectKey, WorkQueue};
use futures::future::join_all;
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Resource, ResourceExt as _};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::json;

use crate::controllers::expectations::Expectations;
use crate::controllers::explain::{ExplainError, Explanation, Subject};
use crate::controllers::manager::{Informers, Options};
use crate::controllers::replicaset::controller_of;
use crate::controllers::{is_conflict, is_not_found, Error};
use crate::selector::LabelSelector;

const BACKOFF_INITIAL: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(15 * 60);

/// Upstream's `flowcontrol.Backoff` for failed daemon pods, keyed by DaemonSet uid and node.
#[derive(Default)]
struct Backoff {
    entries: Mutex<HashMap<String, (Duration, Instant)>>,
}

impl Backoff {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Duration, Instant)>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How long a failed pod on the node must still wait, if it must.
    fn remaining(&self, key: &str, now: Instant) -> Option<Duration> {
        let (backoff, last) = *self.lock().get(key)?;
        let since = now.saturating_duration_since(last);
        (since < backoff).then(|| backoff - since)
    }

    /// A failed pod was deleted: the next one waits twice as long (afresh after a quiet spell).
    fn step(&self, key: &str, now: Instant) {
        let mut m = self.lock();
        // entries quiet for long are forgotten (upstream's Backoff.GC), so the map does not
        // grow with every DaemonSet and node that ever had a failed pod
        m.retain(|_, (_, last)| now.saturating_duration_since(*last) <= 2 * BACKOFF_MAX);
        let next = match m.get(key) {
            Some((b, last)) if now.saturating_duration_since(*last) <= 2 * BACKOFF_MAX => (*b * 2).min(BACKOFF_MAX),
            _ => BACKOFF_INITIAL,
        };
        m.insert(key.to_string(), (next, now));
    }
}

fn backoff_key(ds: &DaemonSet, node: &str) -> String {
    format!("{}/{node}", ds.metadata.uid.as_deref().unwrap_or_default())
}

/// What the workers share.
struct Context {
    client: kube::Client,
    dss: Arc<Informer<DaemonSet>>,
    pods: Arc<Informer<Pod>>,
    nodes: Arc<Informer<Node>>,
    revisions: Arc<Informer<ControllerRevision>>,
    exp: Arc<Expectations<ObjectKey>>,
    backoff: Backoff,
    recorder: Recorder,
}

/// The DaemonSet controlling an object, if any.
fn owner_key<K: Resource>(obj: &K) -> Option<ObjectKey> {
    let ns = obj.meta().namespace.clone().unwrap_or_default();
    controller_of(obj.owner_references()).filter(|r| r.kind == "DaemonSet").map(|r| ObjectKey::new(Some(&ns), &r.name))
}

fn selects(ds: &DaemonSet, labels: &std::collections::BTreeMap<String, String>) -> bool {
    let Some(sel) = ds.spec.as_ref().map(|s| &s.selector) else { return false };
    LabelSelector::from_api(sel).is_ok_and(|s| !s.is_empty() && s.matches(labels))
}

/// The DaemonSets a pod or revision change concerns: its controller (before and after the
/// change), or for an orphan every DaemonSet of its namespace selecting it. `in_namespace` is
/// only called for an orphan.
pub fn keys_for_owned<K: Resource>(change: &Change<K>, in_namespace: impl FnOnce(&str) -> Vec<Arc<DaemonSet>>) -> Vec<ObjectKey> {
    let mut keys = Vec::new();
    match change {
        Change::Applied { old, new } => {
            match owner_key(new.as_ref()) {
                Some(k) => keys.push(k),
                None if controller_of(new.owner_references()).is_none() => {
                    let ns = new.meta().namespace.clone().unwrap_or_default();
                    keys.extend(in_namespace(&ns).iter().filter(|ds| selects(ds, new.labels())).map(|ds| ObjectKey::of(ds.as_ref())));
                }
                None => {}
            }
            keys.extend(old.as_deref().and_then(owner_key).filter(|k| !keys.contains(k)));
        }
        Change::Deleted(obj) => keys.extend(owner_key(obj.as_ref())),
    }
    keys
}

/// The DaemonSets a node change concerns (upstream `addNode`, `updateNode`, `deleteNode`): a
/// new node those that should run there; a changed node those whose answer (should run, should
/// keep running) changed; a deleted node every DaemonSet.
pub fn keys_for_node(change: &Change<Node>, all: &[Arc<DaemonSet>]) -> Vec<ObjectKey> {
    let key = |ds: &Arc<DaemonSet>| ObjectKey::of(ds.as_ref());
    match change {
        Change::Applied { old: None, new } => all.iter().filter(|ds| plan::should_run(new, ds).0).map(key).collect(),
        Change::Applied { old: Some(old), new } => {
            let relevant = |n: &Node| (n.metadata.labels.clone(), n.spec.as_ref().map(|s| (s.taints.clone(), s.unschedulable)));
            if relevant(old) == relevant(new) {
                return Vec::new();
            }
            all.iter().filter(|ds| plan::should_run(old, ds) != plan::should_run(new, ds)).map(key).collect()
        }
        Change::Deleted(_) => all.iter().map(key).collect(),
    }
}

/// Tells the owner's expectations what a pod change shows.
fn observe(exp: &Expectations<ObjectKey>, change: &Change<Pod>) {
    if let Some(k) = owner_key(change.object().as_ref()) {
        exp.observe(&k, change);
    }
}

pub fn start(inf: &Arc<Informers>, opts: &Options) {
    let queue: WorkQueue<ObjectKey> = WorkQueue::new();
    let dss = inf.daemon_sets();
    let pods = inf.pods();
    let nodes = inf.nodes();
    let revisions = inf.controller_revisions();
    let exp: Arc<Expectations<ObjectKey>> = Arc::default();
    {
        let q = queue.clone();
        dss.on_change(move |c| q.add(ObjectKey::of(c.object().as_ref())));
    }
    {
        let (q, dss, exp) = (queue.clone(), dss.clone(), exp.clone());
        pods.on_change(move |c| {
            observe(&exp, c);
            for k in keys_for_owned(c, |ns| dss.list_namespace(ns)) {
                q.add(k);
            }
        });
    }
    {
        let (q, dss) = (queue.clone(), dss.clone());
        revisions.on_change(move |c| {
            for k in keys_for_owned(c, |ns| dss.list_namespace(ns)) {
                q.add(k);
            }
        });
    }
    {
        let (q, dss) = (queue.clone(), dss.clone());
        nodes.on_change(move |c| {
            for k in keys_for_node(c, &dss.list()) {
                q.add(k);
            }
        });
    }
    {
        let d = dss.clone();
        spawn_resync(queue.clone(), opts.resync, move || d.keys());
    }
    let client = inf.client();
    let ctx = Arc::new(Context {
        recorder: Recorder::new(client.clone(), "daemonset-controller"),
        client,
        dss,
        pods,
        nodes,
        revisions,
        exp,
        backoff: Backoff::default(),
    });
    {
        let ctx = ctx.clone();
        inf.explain().register("daemonset", Arc::new(move |key| Box::pin(explain(ctx.clone(), key))));
    }
    spawn_workers("daemonset", queue, 2, move |key: ObjectKey| reconcile(ctx.clone(), key));
}

/// The pod plan of a DaemonSet on the loop's state (expectations, failed-pod back-off).
fn plan_pods(ctx: &Context, key: &ObjectKey, ds: &DaemonSet, nodes: &[Arc<Node>], pods: &[&Pod], hash: &str, now: Instant) -> plan::DsPlan {
    let node_refs: Vec<&Node> = nodes.iter().map(|n| n.as_ref()).collect();
    let in_backoff = |node: &str| ctx.backoff.remaining(&backoff_key(ds, node), now);
    plan::plan(&plan::Input {
        ds,
        nodes: &node_refs,
        pods,
        hash,
        now: jiff::Timestamp::now(),
        expectations_satisfied: ctx.exp.satisfied(key),
        backoff: &in_backoff,
    })
}

/// A dry run of [`reconcile`] for one DaemonSet.
async fn explain(ctx: Arc<Context>, key: ObjectKey) -> Result<Explanation, ExplainError> {
    ctx.dss.wait_synced().await;
    ctx.pods.wait_synced().await;
    ctx.nodes.wait_synced().await;
    ctx.revisions.wait_synced().await;
    let ds = ctx.dss.get(key.namespace.as_deref(), &key.name).ok_or_else(|| ExplainError::not_found("daemonsets.apps", &key))?;
    let ns = key.namespace.clone().unwrap_or_default();
    let all_pods = ctx.pods.list_namespace(&ns);
    let pod_refs: Vec<&Pod> = all_pods.iter().map(|p| p.as_ref()).collect();
    let all_revs = ctx.revisions.list_namespace(&ns);
    let rev_refs: Vec<&ControllerRevision> = all_revs.iter().map(|r| r.as_ref()).collect();
    let h = plan::plan_history(&ds, &rev_refs, &pod_refs);
    let all_nodes = ctx.nodes.list();
    let p = plan_pods(&ctx, &key, &ds, &all_nodes, &pod_refs, &h.hash, Instant::now());
    let uid = ds.metadata.uid.clone().unwrap_or_default();
    let eligibility = plan::Eligibility::of(&ds);
    let mut e = Explanation::new("daemonset", Subject::of(ds.as_ref()));
    let owned: Vec<&Pod> =
        pod_refs.iter().copied().filter(|p| controller_of(p.owner_references()).is_some_and(|o| o.uid == uid)).collect();
    e.observed = json!({
        "nodes": all_nodes.iter().map(|n| {
            let name = n.name_any();
            let pods: Vec<String> = owned.iter().filter(|p| plan::target_node(p).as_deref() == Some(name.as_str())).map(|p| {
                let updated = if plan::is_pod_updated(p, &h.hash, &ds) { "updated" } else { "old revision" };
                let phase = p.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_else(|| "Pending".into());
                let gone = if p.metadata.deletion_timestamp.is_some() { ", terminating" } else { "" };
                format!("{} ({phase}, {updated}{gone})", p.name_any())
            }).collect();
            let mut o = json!({"name": name, "pods": pods});
            if let Some(why) = eligibility.why_not(n) {
                o["notEligible"] = json!(why);
            }
            o
        }).collect::<Vec<_>>(),
        "revisionHash": h.hash,
    });
    let eligible: Vec<String> = all_nodes.iter().filter(|n| eligibility.check(n).0).map(|n| n.name_any()).collect();
    let spec = ds.spec.clone().unwrap_or_default();
    e.wants = json!({
        "nodes": eligible,
        "revisionHash": h.hash,
        "updateStrategy": spec.update_strategy,
    });
    if let Some(w) = ctx.exp.pending(&key) {
        e.waiting.push(w);
    }
    let a = &mut e.actions;
    a.extend(h.adopt.iter().map(|r| format!("adopt orphan ControllerRevision {r}")));
    a.extend(h.release.iter().map(|r| format!("release ControllerRevision {r}")));
    a.extend(h.label.iter().map(|r| format!("label ControllerRevision {r} with its hash")));
    a.extend(h.create.iter().map(|c| format!("create ControllerRevision {} (revision {})", c.name_any(), c.revision)));
    a.extend(h.bump.iter().map(|(n, r)| format!("renumber ControllerRevision {n} to revision {r}: the template went back to it")));
    a.extend(h.relabel.iter().map(|n| format!("relabel Pod {n} with hash {}", h.hash)));
    a.extend(h.duplicates.iter().map(|n| format!("delete duplicate ControllerRevision {n}")));
    a.extend(p.adopt.iter().map(|n| format!("adopt orphan Pod {n}")));
    a.extend(p.release.iter().map(|n| format!("release Pod {n}: it no longer matches the selector")));
    a.extend(p.delete.iter().map(|n| {
        let failed = p.failed.iter().find(|(f, _)| f == n).map(|(_, node)| format!(": it failed on node {node}")).unwrap_or_default();
        format!("delete Pod {n}{failed}")
    }));
    a.extend(p.create_on.iter().map(|n| format!("create a daemon pod for node {n}")));
    if p.status_changed {
        let st = &p.status;
        a.push(format!(
            "write status: desired {}, current {}, ready {}, updated {}, available {}, misscheduled {}",
            st.desired_number_scheduled,
            st.current_number_scheduled,
            st.number_ready,
            st.updated_number_scheduled.unwrap_or(0),
            st.number_available.unwrap_or(0),
            st.number_misscheduled,
        ));
    }
    a.extend(h.cleanup.iter().map(|n| format!("delete ControllerRevision {n}: beyond revisionHistoryLimit")));
    e.waiting.extend(p.waiting.iter().cloned());
    Ok(e.requeue(p.requeue_after))
}

/// Replaces an object's ownerReferences, guarded by its resourceVersion.
async fn patch_owners<K>(api: &Api<K>, obj: &K, refs: Vec<OwnerReference>) -> Result<(), Error>
where
    K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    let patch = json!({"metadata": {"ownerReferences": refs, "resourceVersion": obj.resource_version()}});
    match api.patch(&obj.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => Ok(()),
        Err(e) if is_not_found(&e) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn without(refs: &[OwnerReference], uid: Option<&String>) -> Vec<OwnerReference> {
    refs.iter().filter(|r| Some(&r.uid) != uid).cloned().collect()
}

/// One pass over a DaemonSet: revisions, pods, status, old revisions.
#[tracing::instrument(name = "reconcile", skip_all, fields(controller = "daemonset", key = %key))]
async fn reconcile(ctx: Arc<Context>, key: ObjectKey) -> Result<Next, Error> {
    let Context { client, dss, pods, nodes, revisions, exp, backoff, recorder } = &*ctx;
    dss.wait_synced().await;
    pods.wait_synced().await;
    nodes.wait_synced().await;
    revisions.wait_synced().await;
    let Some(ds) = dss.get(key.namespace.as_deref(), &key.name) else {
        exp.forget(&key);
        return Ok(Next::Done);
    };
    if ds.metadata.deletion_timestamp.is_some() {
        return Ok(Next::Done);
    }
    let selector = ds.spec.as_ref().map(|s| s.selector.clone()).unwrap_or_default();
    if LabelSelector::from_api(&selector).map_or(true, |s| s.is_empty()) {
        recorder.record(ds.as_ref(), "Warning", "SelectingAll", "This daemon set is selecting all pods. A non-empty selector is required.".into());
        return Ok(Next::Done);
    }
    let ns = key.namespace.clone().unwrap_or_default();
    let pod_api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let cr_api: Api<ControllerRevision> = Api::namespaced(client.clone(), &ns);
    let ds_api: Api<DaemonSet> = Api::namespaced(client.clone(), &ns);
    let owner = plan::controller_ref(&ds);

    // revisions
    let all_pods = pods.list_namespace(&ns);
    let pod_refs: Vec<&Pod> = all_pods.iter().map(|p| p.as_ref()).collect();
    let all_revs = revisions.list_namespace(&ns);
    let rev_refs: Vec<&ControllerRevision> = all_revs.iter().map(|r| r.as_ref()).collect();
    let h = plan::plan_history(&ds, &rev_refs, &pod_refs);
    let rev = |name: &str| all_revs.iter().find(|r| r.metadata.name.as_deref() == Some(name)).cloned();
    for name in &h.adopt {
        if let Some(cr) = rev(name) {
            let mut refs = cr.owner_references().to_vec();
            refs.push(owner.clone());
            patch_owners(&cr_api, cr.as_ref(), refs).await?;
        }
    }
    for name in &h.release {
        if let Some(cr) = rev(name) {
            patch_owners(&cr_api, cr.as_ref(), without(cr.owner_references(), ds.metadata.uid.as_ref())).await?;
        }
    }
    for name in &h.label {
        let patch = json!({"metadata": {"labels": {plan::REVISION_HASH_LABEL: name}}});
        cr_api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    }
    if let Some(cr) = &h.create {
        let name = cr.name_any();
        match cr_api.create(&PostParams::default(), cr).await {
            Ok(_) => {}
            Err(e) if is_conflict(&e) => {
                // ours, not in the cache yet; or another template's: a new collision count
                let existing = cr_api.get_opt(&name).await?;
                if !existing.as_ref().is_some_and(|x| plan::matches_revision(&ds, x)) {
                    let mut new = (*ds).clone();
                    new.status = Some(plan::with_collision_count_bumped(&ds));
                    match ds_api.replace_status(&key.name, &PostParams::default(), &new).await {
                        Ok(_) => {}
                        Err(e) if is_conflict(&e) || is_not_found(&e) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                return Ok(Next::After(Duration::from_millis(200)));
            }
            Err(e) => return Err(e.into()),
        }
    }
    if let Some((name, revision)) = &h.bump {
        let patch = json!({"revision": revision});
        cr_api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    }
    for name in &h.relabel {
        let patch = json!({"metadata": {"labels": {plan::REVISION_HASH_LABEL: h.hash}}});
        match pod_api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => {}
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(e.into()),
        }
    }
    for name in &h.duplicates {
        match cr_api.delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(e.into()),
        }
    }

    // pods
    let now = Instant::now();
    let p = plan_pods(&ctx, &key, &ds, &nodes.list(), &pod_refs, &h.hash, now);
    let pod = |name: &str| all_pods.iter().find(|p| p.metadata.name.as_deref() == Some(name)).cloned();
    for name in &p.adopt {
        if let Some(pod) = pod(name) {
            let mut refs = pod.owner_references().to_vec();
            refs.push(owner.clone());
            patch_owners(&pod_api, pod.as_ref(), refs).await?;
        }
    }
    for name in &p.release {
        if let Some(pod) = pod(name) {
            patch_owners(&pod_api, pod.as_ref(), without(pod.owner_references(), ds.metadata.uid.as_ref())).await?;
        }
    }
    for (name, node) in &p.failed {
        backoff.step(&backoff_key(&ds, node), now);
        recorder.record(ds.as_ref(), "Warning", "FailedDaemonPod", format!("Found failed daemon pod {ns}/{name} on node {node}, will try to kill it"));
    }
    let mut failure: Option<kube::Error> = None;
    if !p.create_on.is_empty() || !p.delete.is_empty() {
        exp.expect(&key, p.create_on.len(), p.delete.iter().cloned());
    }
    if !p.delete.is_empty() {
        let dp = DeleteParams::default();
        let results = join_all(p.delete.iter().map(|n| pod_api.delete(n, &dp))).await;
        for (name, r) in p.delete.iter().zip(results) {
            match r {
                Ok(_) => recorder.record(ds.as_ref(), "Normal", "SuccessfulDelete", format!("Deleted pod: {name}")),
                Err(e) if is_not_found(&e) => exp.observed_delete(&key, name),
                Err(e) => {
                    exp.observed_delete(&key, name);
                    recorder.record(ds.as_ref(), "Warning", "FailedDelete", format!("Error deleting: {e}"));
                    failure = Some(e);
                }
            }
        }
    }
    // slow start: 1, 2, 4, ... so a failing template costs one request, not one per node
    let mut left: &[String] = &p.create_on;
    let mut batch = 1usize;
    while !left.is_empty() {
        let (now_nodes, rest) = left.split_at(batch.min(left.len()));
        let pp = PostParams::default();
        let new_pods: Vec<Pod> = now_nodes.iter().map(|n| plan::daemon_pod(&ds, n, &h.hash)).collect();
        let results = join_all(new_pods.iter().map(|pod| pod_api.create(&pp, pod))).await;
        let mut ok = true;
        for r in results {
            match r {
                Ok(created) => recorder.record(ds.as_ref(), "Normal", "SuccessfulCreate", format!("Created pod: {}", created.name_any())),
                Err(e) => {
                    exp.observed_add(&key);
                    recorder.record(ds.as_ref(), "Warning", "FailedCreate", format!("Error creating: {e}"));
                    failure = Some(e);
                    ok = false;
                }
            }
        }
        left = rest;
        if !ok {
            for _ in left {
                exp.observed_add(&key);
            }
            break;
        }
        batch *= 2;
    }

    // status
    if p.status_changed {
        let mut new = (*ds).clone();
        new.status = Some(p.status.clone());
        match ds_api.replace_status(&key.name, &PostParams::default(), &new).await {
            Ok(_) => {}
            Err(e) if is_not_found(&e) || is_conflict(&e) => return Ok(Next::After(Duration::from_millis(100))),
            Err(e) => return Err(e.into()),
        }
    }

    // old revisions beyond the history limit
    for name in &h.cleanup {
        match cr_api.delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(e.into()),
        }
    }
    match failure {
        Some(e) => Err(e.into()),
        None => Ok(p.requeue_after.map(Next::After).unwrap_or(Next::Done)),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_failed_pod_back_off_doubles_and_forgets_quiet_entries() {
        let b = Backoff::default();
        let t0 = Instant::now();
        b.step("ds/n1", t0);
        assert_eq!(b.remaining("ds/n1", t0), Some(BACKOFF_INITIAL));
        b.step("ds/n1", t0);
        assert_eq!(b.remaining("ds/n1", t0), Some(2 * BACKOFF_INITIAL));
        // much later, another node's failure: the quiet entry is gone
        let later = t0 + 2 * BACKOFF_MAX + Duration::from_secs(1);
        b.step("ds/n2", later);
        assert_eq!(b.lock().len(), 1);
        assert_eq!(b.remaining("ds/n1", later), None);
    }

    fn owned<K: DeserializeOwned>(labels: serde_json::Value, owner: Option<(&str, &str)>) -> Arc<K> {
        let refs: Vec<_> = owner
            .map(|(kind, name)| json!({"apiVersion": "apps/v1", "kind": kind, "name": name, "uid": format!("uid-{name}"), "controller": true}))
            .into_iter()
            .collect();
        Arc::new(serde_json::from_value(json!({"metadata": {"name": "x", "namespace": "ns", "labels": labels, "ownerReferences": refs}})).unwrap())
    }

    fn ds(name: &str, spec: serde_json::Value) -> Arc<DaemonSet> {
        let mut v = json!({"metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}")},
                           "spec": {"selector": {"matchLabels": {"app": name}},
                                    "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "c"}]}}}});
        json_patch::merge(&mut v, &spec);
        Arc::new(serde_json::from_value(v).unwrap())
    }

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new(Some("ns"), name)
    }

    fn never(_: &str) -> Vec<Arc<DaemonSet>> {
        panic!("an owned object must not look for candidates")
    }

    #[test]
    fn pods_and_revisions_map_to_their_daemonset_or_the_ones_selecting_an_orphan() {
        let p: Arc<Pod> = owned(json!({"app": "a"}), Some(("DaemonSet", "a")));
        assert_eq!(keys_for_owned(&Change::Applied { old: None, new: p.clone() }, never), [key("a")]);
        assert_eq!(keys_for_owned(&Change::Deleted(p), never), [key("a")]);
        let cr: Arc<ControllerRevision> = owned(json!({"app": "a"}), Some(("DaemonSet", "a")));
        assert_eq!(keys_for_owned(&Change::Applied { old: None, new: cr }, never), [key("a")]);
        let orphan: Arc<Pod> = owned(json!({"app": "a"}), None);
        let all = vec![ds("a", json!({})), ds("b", json!({}))];
        assert_eq!(keys_for_owned(&Change::Applied { old: None, new: orphan.clone() }, |_| all.clone()), [key("a")]);
        assert!(keys_for_owned(&Change::Deleted(orphan), never).is_empty());
        // another controller's pod concerns no DaemonSet
        let rs_pod: Arc<Pod> = owned(json!({"app": "a"}), Some(("ReplicaSet", "a")));
        assert!(keys_for_owned(&Change::Applied { old: None, new: rs_pod }, never).is_empty());
    }

    #[test]
    fn node_changes_map_to_the_daemonsets_whose_answer_changed() {
        let node = |labels: serde_json::Value, taints: serde_json::Value| -> Arc<Node> {
            Arc::new(serde_json::from_value(json!({"metadata": {"name": "n", "labels": labels}, "spec": {"taints": taints}})).unwrap())
        };
        let all = vec![ds("every", json!({})), ds("gpu", json!({"spec": {"template": {"spec": {"nodeSelector": {"gpu": "yes"}}}}}))];
        let plain = node(json!({}), json!([]));
        assert_eq!(keys_for_node(&Change::Applied { old: None, new: plain.clone() }, &all), [key("every")]);
        let gpu = node(json!({"gpu": "yes"}), json!([]));
        assert_eq!(keys_for_node(&Change::Applied { old: Some(plain.clone()), new: gpu.clone() }, &all), [key("gpu")]);
        // a status-only update concerns nobody
        assert!(keys_for_node(&Change::Applied { old: Some(gpu.clone()), new: gpu.clone() }, &all).is_empty());
        let tainted = node(json!({"gpu": "yes"}), json!([{"key": "k", "effect": "NoExecute"}]));
        assert_eq!(keys_for_node(&Change::Applied { old: Some(gpu), new: tainted }, &all), [key("every"), key("gpu")]);
        assert_eq!(keys_for_node(&Change::Deleted(plain), &all), [key("every"), key("gpu")]);
    }

    #[test]
    fn failed_pod_back_off_doubles_per_node() {
        let b = Backoff::default();
        let t0 = Instant::now();
        assert_eq!(b.remaining("n", t0), None);
        b.step("n", t0);
        assert_eq!(b.remaining("n", t0), Some(BACKOFF_INITIAL));
        assert_eq!(b.remaining("n", t0 + BACKOFF_INITIAL), None);
        b.step("n", t0 + BACKOFF_INITIAL);
        assert_eq!(b.remaining("n", t0 + BACKOFF_INITIAL), Some(2 * BACKOFF_INITIAL));
        assert_eq!(b.remaining("other", t0), None);
    }
}
