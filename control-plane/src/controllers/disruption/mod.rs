//! Disruption controller executor (upstream's "disruption"): keeps every PodDisruptionBudget's
//! status (expected, healthy, desired, allowed disruptions, disrupted pods, the
//! DisruptionAllowed condition) from the pods it selects and their controllers' scale. The API
//! server's eviction subresource reads that status to grant or refuse evictions.

pub mod plan;

use std::sync::Arc;
use std::time::Duration;

use ferro_runtime::{spawn_resync, spawn_workers, Change, Informer, Next, ObjectKey, WorkQueue};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt as _};
use serde_json::json;

use self::plan::ControllerRef;
use crate::controllers::explain::{ExplainError, Explanation, Subject};
use crate::controllers::manager::{Informers, Options};
use crate::controllers::replicaset::controller_of;
use crate::controllers::{is_not_found, Error};

/// A budget changed.
pub fn keys_for_pdb(change: &Change<PodDisruptionBudget>) -> Vec<ObjectKey> {
    vec![ObjectKey::of(change.object().as_ref())]
}

/// A pod changed: the budgets of its namespace that select it (before or after the change).
pub fn keys_for_pod(change: &Change<Pod>, pdbs: &[Arc<PodDisruptionBudget>]) -> Vec<ObjectKey> {
    let (old, new) = match change {
        Change::Applied { old, new } => (old.clone(), Some(new.clone())),
        Change::Deleted(p) => (None, Some(p.clone())),
    };
    pdbs.iter()
        .filter(|b| [&old, &new].into_iter().flatten().any(|p| plan::selects(b, p)))
        .map(|b| ObjectKey::of(b.as_ref()))
        .collect()
}

struct Context {
    client: kube::Client,
    pdbs: Arc<Informer<PodDisruptionBudget>>,
    pods: Arc<Informer<Pod>>,
    replica_sets: Arc<Informer<ReplicaSet>>,
    deployments: Arc<Informer<Deployment>>,
    stateful_sets: Arc<Informer<StatefulSet>>,
}

pub fn start(inf: &Arc<Informers>, opts: &Options) {
    let queue: WorkQueue<ObjectKey> = WorkQueue::new();
    let pdbs = inf.pod_disruption_budgets();
    let pods = inf.pods();
    {
        let q = queue.clone();
        pdbs.on_change(move |c| keys_for_pdb(c).into_iter().for_each(|k| q.add(k)));
        let (q, budgets) = (queue.clone(), pdbs.clone());
        pods.on_change(move |c| keys_for_pod(c, &budgets.list()).into_iter().for_each(|k| q.add(k)));
        // A controller's scale changed: the budgets of its namespace.
        let all_in = |q: WorkQueue<ObjectKey>, budgets: Arc<Informer<PodDisruptionBudget>>| {
            move |ns: Option<String>| {
                for b in budgets.list().iter().filter(|b| b.namespace() == ns) {
                    q.add(ObjectKey::of(b.as_ref()));
                }
            }
        };
        let f = all_in(queue.clone(), pdbs.clone());
        inf.replica_sets().on_change(move |c: &Change<ReplicaSet>| f(c.object().namespace()));
        let f = all_in(queue.clone(), pdbs.clone());
        inf.deployments().on_change(move |c: &Change<Deployment>| f(c.object().namespace()));
        let f = all_in(queue.clone(), pdbs.clone());
        inf.stateful_sets().on_change(move |c: &Change<StatefulSet>| f(c.object().namespace()));
        let budgets = pdbs.clone();
        spawn_resync(queue.clone(), opts.resync, move || budgets.list().iter().map(|b| ObjectKey::of(b.as_ref())).collect());
    }
    let ctx = Arc::new(Context {
        client: inf.client(),
        pdbs,
        pods,
        replica_sets: inf.replica_sets(),
        deployments: inf.deployments(),
        stateful_sets: inf.stateful_sets(),
    });
    {
        let ctx = ctx.clone();
        inf.explain().register("disruption", Arc::new(move |key| Box::pin(explain(ctx.clone(), key))));
    }
    spawn_workers("disruption", queue, 1, move |key: ObjectKey| reconcile(ctx.clone(), key));
}

/// The controller whose scale counts for a pod: a ReplicaSet's Deployment when it has one, else
/// the ReplicaSet, or a StatefulSet.
fn scale_owner(ctx: &Context, pod: &Pod) -> Option<ControllerRef> {
    let ns = pod.namespace();
    let r = controller_of(pod.owner_references())?;
    match r.kind.as_str() {
        "ReplicaSet" => {
            let rs = ctx.replica_sets.get(ns.as_deref(), &r.name).filter(|rs| rs.metadata.uid.as_deref() == Some(r.uid.as_str()))?;
            match controller_of(rs.owner_references()).filter(|d| d.kind == "Deployment") {
                Some(d) => Some(ControllerRef { kind: "Deployment".into(), name: d.name.clone(), uid: d.uid.clone() }),
                None => Some(ControllerRef { kind: "ReplicaSet".into(), name: r.name.clone(), uid: r.uid.clone() }),
            }
        }
        "StatefulSet" => Some(ControllerRef { kind: r.kind.clone(), name: r.name.clone(), uid: r.uid.clone() }),
        _ => None,
    }
}

fn scale(ctx: &Context, ns: Option<&str>, c: &ControllerRef) -> Option<i32> {
    let uid = Some(c.uid.as_str());
    match c.kind.as_str() {
        "Deployment" => ctx.deployments.get(ns, &c.name).filter(|d| d.metadata.uid.as_deref() == uid).map(|d| d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)),
        "ReplicaSet" => ctx.replica_sets.get(ns, &c.name).filter(|d| d.metadata.uid.as_deref() == uid).map(|d| d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)),
        "StatefulSet" => ctx.stateful_sets.get(ns, &c.name).filter(|d| d.metadata.uid.as_deref() == uid).map(|d| d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)),
        _ => None,
    }
}

/// A budget, the pods of its namespace and the status the planner computes from them, once
/// the caches are synced; None when the budget is gone.
async fn observe(ctx: &Context, key: &ObjectKey) -> Option<(Arc<PodDisruptionBudget>, Vec<Arc<Pod>>, plan::Outcome, jiff::Timestamp)> {
    ctx.pdbs.wait_synced().await;
    ctx.pods.wait_synced().await;
    ctx.replica_sets.wait_synced().await;
    ctx.deployments.wait_synced().await;
    ctx.stateful_sets.wait_synced().await;
    let ns = key.namespace.clone().unwrap_or_default();
    let pdb = ctx.pdbs.get(Some(&ns), &key.name)?;
    let pods: Vec<Arc<Pod>> = ctx.pods.list().into_iter().filter(|p| p.namespace().as_deref() == Some(ns.as_str())).collect();
    let refs: Vec<&Pod> = pods.iter().map(AsRef::as_ref).collect();
    let now = jiff::Timestamp::now();
    let outcome = plan::status(&pdb, &refs, &|p| scale_owner(ctx, p), &|c| scale(ctx, Some(&ns), c), now);
    Some((pdb, pods, outcome, now))
}

/// A dry run of [`reconcile`] for one budget: its arithmetic, and why evictions are refused.
async fn explain(ctx: Arc<Context>, key: ObjectKey) -> Result<Explanation, ExplainError> {
    let (pdb, pods, outcome, now) = observe(&ctx, &key).await.ok_or_else(|| ExplainError::not_found("poddisruptionbudgets.policy", &key))?;
    let in_ns: Vec<&Pod> = pods.iter().map(AsRef::as_ref).collect();
    let st = &outcome.status;
    let mut e = Explanation::new("disruption", Subject::of(pdb.as_ref()));
    let disrupted = st.disrupted_pods.clone().unwrap_or_default();
    e.observed = json!({
        "pods": in_ns.iter().filter(|p| plan::selects(&pdb, p)).map(|p| {
            let name = p.name_any();
            let state = if p.metadata.deletion_timestamp.is_some() {
                "terminating"
            } else if disrupted.contains_key(&name) {
                "evicted, deletion not seen yet"
            } else if plan::pod_ready(p) {
                "healthy"
            } else {
                "not ready"
            };
            json!({"name": name, "state": state})
        }).collect::<Vec<_>>(),
    });
    let spec = pdb.spec.clone().unwrap_or_default();
    e.wants = json!({
        "minAvailable": spec.min_available,
        "maxUnavailable": spec.max_unavailable,
        "expectedPods": st.expected_pods,
        "desiredHealthy": st.desired_healthy,
        "currentHealthy": st.current_healthy,
        "disruptionsAllowed": st.disruptions_allowed,
    });
    let current = pdb.status.clone().unwrap_or_default();
    let same = |a: &k8s_openapi::api::policy::v1::PodDisruptionBudgetStatus| {
        (a.current_healthy, a.desired_healthy, a.expected_pods, a.disruptions_allowed, a.disrupted_pods.clone().unwrap_or_default())
    };
    if same(&current) != same(st) {
        e.actions.push(format!(
            "write status: currentHealthy {}, desiredHealthy {}, expectedPods {}, disruptionsAllowed {}",
            st.current_healthy, st.desired_healthy, st.expected_pods, st.disruptions_allowed
        ));
    }
    let failed = st.conditions.iter().flatten().find(|c| c.type_ == "DisruptionAllowed" && c.reason == "SyncFailed");
    if let Some(c) = failed {
        e.waiting.push(format!("evictions are refused: the budget cannot be computed ({})", c.message));
    } else if st.disruptions_allowed == 0 {
        e.waiting.push(format!(
            "evictions are refused: {} healthy pods, {} must stay healthy",
            st.current_healthy, st.desired_healthy
        ));
    }
    let after = outcome.recheck_at.map(|at| Duration::try_from(at.duration_since(now)).unwrap_or(Duration::ZERO));
    Ok(e.requeue(after))
}

/// One pass over a budget: its status, written when it changed.
#[tracing::instrument(name = "reconcile", skip_all, fields(controller = "disruption", key = %key))]
async fn reconcile(ctx: Arc<Context>, key: ObjectKey) -> Result<Next, Error> {
    let Some((pdb, _, outcome, now)) = observe(&ctx, &key).await else { return Ok(Next::Done) };
    let ns = key.namespace.clone().unwrap_or_default();
    let mut next = Next::Done;
    if let Some(at) = outcome.recheck_at {
        let left = at.duration_since(now);
        next = Next::After(Duration::try_from(left).unwrap_or(Duration::ZERO) + Duration::from_millis(100));
    }
    let current = pdb.status.clone().unwrap_or_default();
    let mut wanted = outcome.status;
    // An unchanged condition keeps its time: compare without it.
    if current.conditions.as_ref().map(|c| c.iter().map(|c| (&c.type_, &c.status, &c.reason)).collect::<Vec<_>>())
        == wanted.conditions.as_ref().map(|c| c.iter().map(|c| (&c.type_, &c.status, &c.reason)).collect::<Vec<_>>())
    {
        wanted.conditions.clone_from(&current.conditions);
    }
    if current == wanted {
        return Ok(next);
    }
    let api: Api<PodDisruptionBudget> = Api::namespaced(ctx.client.clone(), &ns);
    // The whole status with the resourceVersion read: an eviction that changed it since
    // (disruptedPods, disruptionsAllowed) makes this write fail and the pass run again.
    let patch = json!({"metadata": {"resourceVersion": pdb.resource_version()}, "status": wanted});
    match api.patch_status(&key.name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Err(e) if is_not_found(&e) => Ok(Next::Done),
        Err(e) => Err(e.into()),
        Ok(_) => Ok(next),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_maps_to_the_budgets_selecting_it_before_or_after_its_change() {
        let pdb = |name: &str, app: &str| -> Arc<PodDisruptionBudget> {
            Arc::new(serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ns"}, "spec": {"selector": {"matchLabels": {"app": app}}}})).unwrap())
        };
        let pod = |app: &str| -> Arc<Pod> { Arc::new(serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "ns", "labels": {"app": app}}})).unwrap()) };
        let budgets = vec![pdb("web", "web"), pdb("db", "db")];
        let keys = keys_for_pod(&Change::Applied { old: Some(pod("web")), new: pod("db") }, &budgets);
        assert_eq!(keys, vec![ObjectKey::new(Some("ns"), "web"), ObjectKey::new(Some("ns"), "db")]);
        assert_eq!(keys_for_pod(&Change::Deleted(pod("web")), &budgets), vec![ObjectKey::new(Some("ns"), "web")]);
    }
}
