//! StatefulSet executor: plans with [`plan`] and applies the plan: the revision first (a
//! hash collision bumps `collisionCount`), then the pod and claim actions in order, stopping at
//! the first failure, then the status when it changed and the history beyond its limit.
//! Expectations hold a set back until the informer has seen the pods it created and deleted.

pub mod plan;

use std::sync::Arc;
use std::time::Duration;

use ferro_runtime::events::Recorder;
use ferro_runtime::{spawn_resync, spawn_workers, Change, Informer, Next, ObjectKey, WorkQueue};
use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Api, ResourceExt as _};
use serde_json::json;

use self::plan::identity::{controller_ref, parent_and_ordinal};
use self::plan::revision::RevisionStep;
use self::plan::Action;
use crate::controllers::expectations::Expectations;
use crate::controllers::explain::{ExplainError, Explanation, Subject};
use crate::controllers::history;
use crate::controllers::manager::{Informers, Options};
use crate::controllers::replicaset::controller_of;
use crate::controllers::{is_conflict, is_not_found, Error};
use crate::selector::LabelSelector;

/// What the workers share.
struct Context {
    client: kube::Client,
    sets: Arc<Informer<StatefulSet>>,
    pods: Arc<Informer<Pod>>,
    claims: Arc<Informer<PersistentVolumeClaim>>,
    revisions: Arc<Informer<ControllerRevision>>,
    exp: Arc<Expectations<ObjectKey>>,
    recorder: Recorder,
}

/// The StatefulSet controlling an object, if any.
fn owner_key<K: kube::Resource>(obj: &K) -> Option<ObjectKey> {
    let ns = obj.meta().namespace.clone();
    controller_of(obj.owner_references()).filter(|r| r.kind == "StatefulSet").map(|r| ObjectKey::new(ns.as_deref(), &r.name))
}

fn selects(set: &StatefulSet, pod: &Pod) -> bool {
    let Some(sel) = set.spec.as_ref().map(|s| &s.selector) else { return false };
    LabelSelector::from_api(sel).is_ok_and(|s| !s.is_empty() && s.matches(pod.labels()))
}

/// The sets a pod change concerns: its controller (before and after the change), or for an
/// orphan the set of its namespace whose name and selector it has (which may adopt it).
/// `in_namespace` lists a namespace's sets; it is only called for an orphan.
pub fn keys_for_pod(change: &Change<Pod>, in_namespace: impl FnOnce(&str) -> Vec<Arc<StatefulSet>>) -> Vec<ObjectKey> {
    let mut keys = Vec::new();
    match change {
        Change::Applied { old, new } => {
            match owner_key(new.as_ref()) {
                Some(k) => keys.push(k),
                None if controller_of(new.owner_references()).is_none() => {
                    let ns = new.namespace().unwrap_or_default();
                    let name = new.name_any();
                    if let Some((parent, _)) = parent_and_ordinal(&name) {
                        keys.extend(
                            in_namespace(&ns).iter().filter(|s| s.name_any() == parent && selects(s, new)).map(|s| ObjectKey::of(s.as_ref())),
                        );
                    }
                }
                None => {}
            }
            if let Some(k) = old.as_deref().and_then(owner_key) {
                if !keys.contains(&k) {
                    keys.push(k);
                }
            }
        }
        Change::Deleted(pod) => keys.extend(owner_key(pod.as_ref())),
    }
    keys
}

/// The set a claim's change concerns: the set owning it, or the set of the pod owning it
/// (whenScaled Delete); a claim of neither concerns no set.
pub fn keys_for_claim(change: &Change<PersistentVolumeClaim>) -> Vec<ObjectKey> {
    let claim = change.object();
    let ns = claim.namespace();
    let mut keys: Vec<ObjectKey> = Vec::new();
    for r in claim.owner_references() {
        let set = match r.kind.as_str() {
            "StatefulSet" => Some(r.name.as_str()),
            "Pod" => parent_and_ordinal(&r.name).map(|(p, _)| p),
            _ => None,
        };
        if let Some(set) = set {
            let k = ObjectKey::new(ns.as_deref(), set);
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
    }
    keys
}

/// The set controlling a revision.
pub fn keys_for_revision(change: &Change<ControllerRevision>) -> Vec<ObjectKey> {
    owner_key(change.object().as_ref()).into_iter().collect()
}

/// Tells the owner's expectations what a pod change shows.
fn observe(exp: &Expectations<ObjectKey>, change: &Change<Pod>) {
    if let Some(k) = owner_key(change.object().as_ref()) {
        exp.observe(&k, change);
    }
}

pub fn start(inf: &Arc<Informers>, opts: &Options) {
    let queue: WorkQueue<ObjectKey> = WorkQueue::new();
    let sets = inf.stateful_sets();
    let pods = inf.pods();
    let claims = inf.claims();
    let revisions = inf.controller_revisions();
    let exp: Arc<Expectations<ObjectKey>> = Arc::default();
    {
        let q = queue.clone();
        sets.on_change(move |c| q.add(ObjectKey::of(c.object().as_ref())));
    }
    {
        let (q, sets, exp) = (queue.clone(), sets.clone(), exp.clone());
        pods.on_change(move |c| {
            observe(&exp, c);
            for k in keys_for_pod(c, |ns| sets.list_namespace(ns)) {
                q.add(k);
            }
        });
    }
    {
        let q = queue.clone();
        claims.on_change(move |c| {
            for k in keys_for_claim(c) {
                q.add(k);
            }
        });
    }
    {
        let q = queue.clone();
        revisions.on_change(move |c| {
            for k in keys_for_revision(c) {
                q.add(k);
            }
        });
    }
    {
        let s = sets.clone();
        spawn_resync(queue.clone(), opts.resync, move || s.keys());
    }
    let client = inf.client();
    let recorder = Recorder::new(client.clone(), "statefulset-controller");
    let ctx = Arc::new(Context { client, sets, pods, claims, revisions, exp, recorder });
    {
        let ctx = ctx.clone();
        inf.explain().register("statefulset", Arc::new(move |key| Box::pin(explain(ctx.clone(), key))));
    }
    spawn_workers("statefulset", queue, 4, move |key: ObjectKey| reconcile(ctx.clone(), key));
}

/// What one sync of a set reads from the caches.
struct Observed {
    /// Revisions of the set's name and selector nobody controls: adopted before planning.
    orphans: Vec<String>,
    pods: Vec<Arc<Pod>>,
    claims: Vec<Arc<PersistentVolumeClaim>>,
    /// The revisions the set controls.
    revisions: Vec<Arc<ControllerRevision>>,
}

impl Observed {
    fn read(ctx: &Context, set: &StatefulSet) -> Self {
        let ns = set.namespace().unwrap_or_default();
        let uid = set.metadata.uid.clone().unwrap_or_default();
        let all_revisions = ctx.revisions.list_namespace(&ns);
        let orphans = plan::revision::orphans_to_adopt(set, &all_revisions.iter().map(|r| r.as_ref()).collect::<Vec<_>>());
        let revisions =
            all_revisions.into_iter().filter(|r| controller_of(r.owner_references()).is_some_and(|o| o.uid == uid)).collect();
        Observed { orphans, pods: ctx.pods.list_namespace(&ns), claims: ctx.claims.list_namespace(&ns), revisions }
    }

    fn plan(&self, set: &StatefulSet, now: jiff::Timestamp) -> plan::Plan {
        let pods: Vec<&Pod> = self.pods.iter().map(|p| p.as_ref()).collect();
        let claims: Vec<&PersistentVolumeClaim> = self.claims.iter().map(|c| c.as_ref()).collect();
        let revisions: Vec<&ControllerRevision> = self.revisions.iter().map(|r| r.as_ref()).collect();
        plan::plan(set, &pods, &claims, &revisions, now)
    }
}

/// A dry run of [`reconcile`] for one set.
async fn explain(ctx: Arc<Context>, key: ObjectKey) -> Result<Explanation, ExplainError> {
    ctx.sets.wait_synced().await;
    ctx.pods.wait_synced().await;
    ctx.claims.wait_synced().await;
    ctx.revisions.wait_synced().await;
    let set = ctx.sets.get(key.namespace.as_deref(), &key.name).ok_or_else(|| ExplainError::not_found("statefulsets.apps", &key))?;
    let obs = Observed::read(&ctx, &set);
    let now = jiff::Timestamp::now();
    let p = obs.plan(&set, now);
    let uid = set.metadata.uid.clone().unwrap_or_default();
    let mut pods: Vec<&Pod> = obs
        .pods
        .iter()
        .map(|p| p.as_ref())
        .filter(|p| plan::identity::ordinal_of(&set, p).is_some())
        .filter(|p| controller_of(p.owner_references()).is_none_or(|o| o.uid == uid))
        .collect();
    pods.sort_by_key(|p| plan::identity::ordinal_of(&set, p));
    let spec = set.spec.clone().unwrap_or_default();
    let start = plan::identity::start_ordinal(&set);
    let n = plan::identity::replicas(&set);
    let mut e = Explanation::new("statefulset", Subject::of(set.as_ref()));
    e.observed = json!({
        "pods": pods.iter().map(|p| json!({
            "name": p.name_any(),
            "state": plan::pod_state(p),
            "revision": p.labels().get(plan::identity::REVISION_LABEL).cloned().unwrap_or_default(),
        })).collect::<Vec<_>>(),
        "claims": obs.claims.iter()
            .filter(|c| c.owner_references().iter().any(|o| o.uid == uid) || pods.iter().any(|p| {
                p.spec.iter().flat_map(|s| s.volumes.iter().flatten())
                    .any(|v| v.persistent_volume_claim.as_ref().is_some_and(|c2| Some(&c2.claim_name) == c.metadata.name.as_ref()))
            }))
            .map(|c| c.name_any()).collect::<Vec<_>>(),
        "revisions": obs.revisions.iter().map(|r| json!({"name": r.name_any(), "revision": r.revision})).collect::<Vec<_>>(),
    });
    let ordinals = if n > 0 {
        format!("{}..{}", plan::identity::pod_name(&set, start), plan::identity::pod_name(&set, start + n - 1))
    } else {
        "none".to_string()
    };
    e.wants = json!({
        "replicas": n,
        "pods": ordinals,
        "podManagementPolicy": spec.pod_management_policy.as_deref().unwrap_or("OrderedReady"),
        "updateStrategy": spec.update_strategy,
        "currentRevision": p.status.current_revision,
        "updateRevision": p.status.update_revision,
    });
    if let Some(w) = ctx.exp.pending(&key) {
        e.waiting.push(w);
    }
    if !obs.orphans.is_empty() {
        e.actions.extend(obs.orphans.iter().map(|o| format!("adopt orphan ControllerRevision {o}")));
        e.waiting.push("plans the pods once its informer shows the adopted revisions".into());
        return Ok(e);
    }
    e.actions.extend(p.revision.iter().map(|r| r.describe()));
    e.actions.extend(p.actions.iter().map(|a| a.describe()));
    if p.status_changed {
        let st = &p.status;
        e.actions.push(format!(
            "write status: replicas {}, ready {}, available {}, current {}, updated {}, currentRevision {}, updateRevision {}",
            st.replicas,
            st.ready_replicas.unwrap_or(0),
            st.available_replicas.unwrap_or(0),
            st.current_replicas.unwrap_or(0),
            st.updated_replicas.unwrap_or(0),
            st.current_revision.as_deref().unwrap_or_default(),
            st.update_revision.as_deref().unwrap_or_default(),
        ));
    }
    e.actions.extend(p.delete_revisions.iter().map(|r| format!("delete ControllerRevision {r}: beyond revisionHistoryLimit")));
    e.waiting.extend(p.waiting.iter().cloned());
    Ok(e.requeue(p.requeue_after))
}

/// Look again soon: the cache has not caught up with a write yet.
const SOON: Duration = Duration::from_millis(200);

/// One pass over a StatefulSet.
#[tracing::instrument(name = "reconcile", skip_all, fields(controller = "statefulset", key = %key))]
async fn reconcile(ctx: Arc<Context>, key: ObjectKey) -> Result<Next, Error> {
    let Context { client, sets, pods, claims, revisions, exp, .. } = &*ctx;
    sets.wait_synced().await;
    pods.wait_synced().await;
    claims.wait_synced().await;
    revisions.wait_synced().await;
    let Some(set) = sets.get(key.namespace.as_deref(), &key.name) else {
        exp.forget(&key);
        return Ok(Next::Done);
    };
    if !exp.satisfied(&key) {
        return Ok(Next::Done);
    }
    let ns = key.namespace.clone().unwrap_or_default();
    let uid = set.metadata.uid.clone().unwrap_or_default();
    let obs = Observed::read(&ctx, &set);
    let rev_api: Api<ControllerRevision> = Api::namespaced(client.clone(), &ns);
    if !obs.orphans.is_empty() {
        if !may_adopt(client, &set).await? {
            return Ok(Next::Done);
        }
        for name in &obs.orphans {
            let Some(r) = revisions.get(Some(&ns), name) else { continue };
            let mut refs = r.owner_references().to_vec();
            refs.push(controller_ref(&set));
            let patch = json!({"metadata": {"ownerReferences": refs, "resourceVersion": r.resource_version()}});
            match rev_api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                Ok(_) => {}
                Err(e) if is_not_found(&e) || is_conflict(&e) => {}
                Err(e) => return Err(e.into()),
            }
        }
        // plan once the informer shows the adopted revisions
        return Ok(Next::After(SOON));
    }
    let p = obs.plan(&set, jiff::Timestamp::now());

    let set_api: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    let pod_api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let claim_api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    let set_name = set.name_any();

    match &p.revision {
        None => {}
        Some(RevisionStep::Create(cr)) => match rev_api.create(&PostParams::default(), cr).await {
            Ok(_) => {}
            Err(e) if is_conflict(&e) => {
                // ours, not in the cache yet, or a hash collision with another revision
                let existing = rev_api.get_opt(&cr.name_any()).await?;
                let ours = existing.as_ref().is_some_and(|x| {
                    controller_of(x.owner_references()).is_some_and(|o| o.uid == uid) && history::equal(x, cr)
                });
                if !ours {
                    let mut new = (*set).clone();
                    let status = new.status.get_or_insert_with(Default::default);
                    status.collision_count = Some(status.collision_count.unwrap_or(0) + 1);
                    tracing::info!(revision = %cr.name_any(), "hash collision, collisionCount bumped");
                    match set_api.replace_status(&set_name, &PostParams::default(), &new).await {
                        Ok(_) => {}
                        Err(e) if is_conflict(&e) || is_not_found(&e) => {}
                        Err(e) => return Err(e.into()),
                    }
                    return Ok(Next::After(SOON));
                }
            }
            Err(e) => return Err(e.into()),
        },
        Some(RevisionStep::Renumber { name, revision }) => {
            let patch = json!({"revision": revision});
            rev_api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        }
    }

    let mut failure: Option<kube::Error> = None;
    let mut next = p.requeue_after.map(Next::After).unwrap_or(Next::Done);
    for action in &p.actions {
        let result = apply(&ctx, &key, &set, &pod_api, &claim_api, action).await;
        match result {
            Ok(Applied::Done) => {}
            Ok(Applied::Soon) => {
                next = Next::After(SOON);
                break;
            }
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }

    if p.status_changed {
        let mut new = (*set).clone();
        new.status = Some(p.status.clone());
        match set_api.replace_status(&set_name, &PostParams::default(), &new).await {
            Ok(_) => {}
            Err(e) if is_not_found(&e) || is_conflict(&e) => next = Next::After(SOON),
            Err(e) => return Err(e.into()),
        }
    }
    if let Some(e) = failure {
        return Err(e.into());
    }
    for name in &p.delete_revisions {
        match rev_api.delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(next)
}

/// Whether the set may adopt orphans: a live read shows it is still there and not being
/// deleted (upstream's RecheckDeletionTimestamp). The cache may not show a deletion yet while
/// the garbage collector already releases the set's dependents (an orphaning delete): adopting
/// one back then would leave it owned by a set that is about to go, and collected with it.
async fn may_adopt(client: &kube::Client, set: &StatefulSet) -> Result<bool, kube::Error> {
    let api: Api<StatefulSet> = Api::namespaced(client.clone(), set.metadata.namespace.as_deref().unwrap_or_default());
    let live = api.get_opt(&set.name_any()).await?;
    Ok(live.is_some_and(|l| l.metadata.uid == set.metadata.uid && l.metadata.deletion_timestamp.is_none()))
}

/// How an action went when it did not fail.
enum Applied {
    Done,
    /// Stop here and look again soon (the cache is behind).
    Soon,
}

/// Applies one action, recording upstream's events.
async fn apply(
    ctx: &Context,
    key: &ObjectKey,
    set: &StatefulSet,
    pod_api: &Api<Pod>,
    claim_api: &Api<PersistentVolumeClaim>,
    action: &Action,
) -> Result<Applied, kube::Error> {
    let (exp, recorder) = (&ctx.exp, &ctx.recorder);
    let set_name = set.name_any();
    match action {
        Action::Adopt { name } => {
            let Some(pod) = ctx.pods.get(key.namespace.as_deref(), name) else { return Ok(Applied::Done) };
            if !may_adopt(&ctx.client, set).await? {
                return Ok(Applied::Soon);
            }
            let mut refs = pod.owner_references().to_vec();
            refs.push(controller_ref(set));
            patch_owners(pod_api, &pod, refs).await
        }
        Action::Release { name } => {
            let Some(pod) = ctx.pods.get(key.namespace.as_deref(), name) else { return Ok(Applied::Done) };
            let refs: Vec<OwnerReference> =
                pod.owner_references().iter().filter(|r| Some(&r.uid) != set.metadata.uid.as_ref()).cloned().collect();
            patch_owners(pod_api, &pod, refs).await
        }
        Action::CreateClaim { claim, pod } => {
            let cname = claim.name_any();
            match claim_api.create(&PostParams::default(), claim).await {
                Ok(_) => {
                    let msg = format!("create Claim {cname} Pod {pod} in StatefulSet {set_name} success");
                    recorder.record(set, "Normal", "SuccessfulCreate", msg);
                    Ok(Applied::Done)
                }
                // there already: what we wanted
                Err(e) if is_conflict(&e) => Ok(Applied::Done),
                Err(e) => {
                    let msg = format!("create Claim {cname} for Pod {pod} in StatefulSet {set_name} failed error: {e}");
                    recorder.record(set, "Warning", "FailedCreate", msg);
                    Err(e)
                }
            }
        }
        Action::CreatePod(pod) => {
            let pname = pod.name_any();
            exp.expect(key, 1, []);
            match pod_api.create(&PostParams::default(), pod).await {
                Ok(_) => {
                    let msg = format!("create Pod {pname} in StatefulSet {set_name} successful");
                    recorder.record(set, "Normal", "SuccessfulCreate", msg);
                    Ok(Applied::Done)
                }
                Err(e) => {
                    exp.observed_add(key);
                    if is_conflict(&e) {
                        // the pod (or its predecessor still terminating) is there already
                        return Ok(Applied::Soon);
                    }
                    let msg = format!("create Pod {pname} in StatefulSet {set_name} failed error: {e}");
                    recorder.record(set, "Warning", "FailedCreate", msg);
                    Err(e)
                }
            }
        }
        Action::DeletePod { name, uid, why } => {
            tracing::info!(pod = %name, reason = ?why, "deleting pod");
            exp.expect(key, 0, [name.clone()]);
            let dp = DeleteParams {
                preconditions: Some(Preconditions { uid: Some(uid.clone()), resource_version: None }),
                ..DeleteParams::default()
            };
            match pod_api.delete(name, &dp).await {
                Ok(_) => {
                    let msg = format!("delete Pod {name} in StatefulSet {set_name} successful");
                    recorder.record(set, "Normal", "SuccessfulDelete", msg);
                    Ok(Applied::Done)
                }
                Err(e) if is_not_found(&e) => {
                    exp.observed_delete(key, name);
                    Ok(Applied::Done)
                }
                Err(e) if is_conflict(&e) => {
                    exp.observed_delete(key, name);
                    Ok(Applied::Soon)
                }
                Err(e) => {
                    exp.observed_delete(key, name);
                    let msg = format!("delete Pod {name} in StatefulSet {set_name} failed error: {e}");
                    recorder.record(set, "Warning", "FailedDelete", msg);
                    Err(e)
                }
            }
        }
        Action::PatchPodLabels { name, labels } => {
            let patch = json!({"metadata": {"labels": labels}});
            match pod_api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                Ok(_) => {
                    recorder.record(set, "Normal", "SuccessfulUpdate", format!("update Pod {name} in StatefulSet {set_name} successful"));
                    Ok(Applied::Done)
                }
                Err(e) if is_not_found(&e) => Ok(Applied::Done),
                Err(e) => {
                    let msg = format!("update Pod {name} in StatefulSet {set_name} failed error: {e}");
                    recorder.record(set, "Warning", "FailedUpdate", msg);
                    Err(e)
                }
            }
        }
        Action::SetClaimOwners { name, owners, resource_version } => {
            let patch = json!({"metadata": {"ownerReferences": owners, "resourceVersion": resource_version}});
            match claim_api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                Ok(_) => Ok(Applied::Done),
                Err(e) if is_not_found(&e) => Ok(Applied::Done),
                Err(e) if is_conflict(&e) => Ok(Applied::Soon),
                Err(e) => Err(e),
            }
        }
        Action::Event { type_, reason, message } => {
            recorder.record(set, type_, reason, message.clone());
            Ok(Applied::Done)
        }
    }
}

/// Replaces a pod's ownerReferences, guarded by its resourceVersion.
async fn patch_owners(api: &Api<Pod>, pod: &Pod, refs: Vec<OwnerReference>) -> Result<Applied, kube::Error> {
    let patch = json!({"metadata": {"ownerReferences": refs, "resourceVersion": pod.resource_version()}});
    match api.patch(&pod.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => Ok(Applied::Done),
        Err(e) if is_not_found(&e) => Ok(Applied::Done),
        Err(e) if is_conflict(&e) => Ok(Applied::Soon),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn obj<K: serde::de::DeserializeOwned>(name: &str, labels: serde_json::Value, owners: serde_json::Value) -> Arc<K> {
        Arc::new(
            serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ns", "labels": labels, "ownerReferences": owners}}))
                .unwrap(),
        )
    }

    fn owner(kind: &str, name: &str) -> serde_json::Value {
        json!([{"apiVersion": "v1", "kind": kind, "name": name, "uid": format!("uid-{name}"), "controller": kind != "Pod"}])
    }

    fn set(name: &str, app: &str) -> Arc<StatefulSet> {
        Arc::new(
            serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ns"},
                "spec": {"selector": {"matchLabels": {"app": app}}, "template": {}}}))
            .unwrap(),
        )
    }

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new(Some("ns"), name)
    }

    fn no_candidates(_: &str) -> Vec<Arc<StatefulSet>> {
        panic!("an owned pod must not look for candidates")
    }

    #[test]
    fn a_pod_maps_to_its_set() {
        let p: Arc<Pod> = obj("web-0", json!({"app": "web"}), owner("StatefulSet", "web"));
        assert_eq!(keys_for_pod(&Change::Applied { old: None, new: p.clone() }, no_candidates), [key("web")]);
        assert_eq!(keys_for_pod(&Change::Deleted(p.clone()), no_candidates), [key("web")]);
        // released: the old owner looks again
        let released: Arc<Pod> = obj("web-0", json!({"app": "x"}), json!([]));
        assert_eq!(keys_for_pod(&Change::Applied { old: Some(p), new: released }, |_| vec![]), [key("web")]);
        // another controller's pod concerns no set
        let rs_pod: Arc<Pod> = obj("web-0", json!({"app": "web"}), owner("ReplicaSet", "web"));
        assert!(keys_for_pod(&Change::Applied { old: None, new: rs_pod }, no_candidates).is_empty());
    }

    #[test]
    fn an_orphan_maps_to_the_set_of_its_name_and_labels() {
        let orphan: Arc<Pod> = obj("web-3", json!({"app": "web"}), json!([]));
        let candidates = vec![set("web", "web"), set("db", "web"), set("web-3", "web")];
        assert_eq!(keys_for_pod(&Change::Applied { old: None, new: orphan.clone() }, |_| candidates.clone()), [key("web")]);
        let wrong_labels = vec![set("web", "other")];
        assert!(keys_for_pod(&Change::Applied { old: None, new: orphan.clone() }, |_| wrong_labels).is_empty());
        assert!(keys_for_pod(&Change::Deleted(orphan), no_candidates).is_empty());
    }

    #[test]
    fn a_claim_maps_to_its_set_or_its_pods_set() {
        let c: Arc<PersistentVolumeClaim> = obj("data-web-0", json!({}), owner("StatefulSet", "web"));
        assert_eq!(keys_for_claim(&Change::Deleted(c)), [key("web")]);
        let c: Arc<PersistentVolumeClaim> = obj("data-web-1", json!({}), owner("Pod", "web-1"));
        assert_eq!(keys_for_claim(&Change::Deleted(c)), [key("web")]);
        let c: Arc<PersistentVolumeClaim> = obj("plain", json!({}), json!([]));
        assert!(keys_for_claim(&Change::Applied { old: None, new: c }).is_empty());
    }

    #[test]
    fn a_revision_maps_to_its_set() {
        let r: Arc<ControllerRevision> = obj("web-abc", json!({}), owner("StatefulSet", "web"));
        assert_eq!(keys_for_revision(&Change::Deleted(r)), [key("web")]);
        let r: Arc<ControllerRevision> = obj("ds-abc", json!({}), owner("DaemonSet", "ds"));
        assert!(keys_for_revision(&Change::Deleted(r)).is_empty());
    }

    #[test]
    fn expectations_see_creations_and_deletions() {
        let exp: Expectations<ObjectKey> = Expectations::default();
        let p: Arc<Pod> = obj("web-0", json!({}), owner("StatefulSet", "web"));
        exp.expect(&key("web"), 1, ["web-0".to_string()]);
        observe(&exp, &Change::Applied { old: None, new: p.clone() });
        assert!(!exp.satisfied(&key("web")));
        observe(&exp, &Change::Deleted(p));
        assert!(exp.satisfied(&key("web")));
    }
}
