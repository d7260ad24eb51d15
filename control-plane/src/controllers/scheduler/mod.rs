//! Scheduler executor: a cache of nodes and the pods bound or assumed on them (kept by the
//! informers' change handlers, so a decision never scans all pods), one decision at a time
//! from the pending queue, and the binding sent in the background with the pod "assumed" on
//! its node meanwhile (upstream's assume cache), released again if the binding fails.

pub mod filter;
pub mod plan;
pub mod score;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ferro_runtime::{spawn_resync, spawn_workers, Change, Informer, Next, ObjectKey, WorkQueue};
use k8s_openapi::api::core::v1::{Binding, Node, ObjectReference, PersistentVolume, PersistentVolumeClaim, Pod, PodCondition};
use k8s_openapi::api::storage::v1::{CSIDriver, CSIStorageCapacity, StorageClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt as _};
use serde_json::json;

use ferro_runtime::events::Recorder;
use crate::controllers::explain::{ExplainError, Explanation, Subject};
use crate::controllers::manager::{Informers, Options};
use self::plan::{NodeInfo, VolumeView};
use crate::controllers::{is_conflict, is_not_found, Error};

pub const SCHEDULER_NAME: &str = plan::DEFAULT_SCHEDULER_NAME;

#[derive(Default)]
struct Cache {
    nodes: BTreeMap<String, NodeInfo>,
    /// pods accounted on a node: uid -> (node, pod as accounted)
    accounted: HashMap<String, (String, Arc<Pod>)>,
    /// pods whose binding is in flight
    assumed: HashSet<String>,
    /// pods that fit nowhere, retried when the cluster changes
    unschedulable: HashSet<ObjectKey>,
}

impl Cache {
    fn account(&mut self, uid: &str, node: &str, pod: Arc<Pod>) {
        if let Some((n, p)) = self.accounted.get(uid) {
            if n == node {
                return;
            }
            let (n, p) = (n.clone(), p.clone());
            if let Some(info) = self.nodes.get_mut(&n) {
                info.remove_pod(&p);
            }
        }
        if let Some(info) = self.nodes.get_mut(node) {
            info.add_pod(&pod);
        }
        self.accounted.insert(uid.to_string(), (node.to_string(), pod));
    }

    fn unaccount(&mut self, uid: &str) {
        if let Some((n, p)) = self.accounted.remove(uid) {
            if let Some(info) = self.nodes.get_mut(&n) {
                info.remove_pod(&p);
            }
        }
    }
}

struct Shared {
    cache: Mutex<Cache>,
}

impl Shared {
    fn cache(&self) -> MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn terminal(pod: &Pod) -> bool {
    matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
}

/// A pod waiting for this scheduler. (Pods that fit nowhere are retried from the cache's
/// `unschedulable` set when nodes or bound pods change, not through this mapper.)
pub fn keys_for_pod(change: &Change<Pod>) -> Vec<ObjectKey> {
    match change {
        Change::Applied { new, .. } if plan::is_pending(new, SCHEDULER_NAME) => vec![ObjectKey::of(new.as_ref())],
        _ => Vec::new(),
    }
}

/// What the workers share.
struct Context {
    client: kube::Client,
    pods: Arc<Informer<Pod>>,
    nodes: Arc<Informer<Node>>,
    claims: Arc<Informer<PersistentVolumeClaim>>,
    volumes: Arc<Informer<PersistentVolume>>,
    classes: Arc<Informer<StorageClass>>,
    drivers: Arc<Informer<CSIDriver>>,
    capacities: Arc<Informer<CSIStorageCapacity>>,
    shared: Arc<Shared>,
    recorder: Recorder,
    /// To retry a pod whose binding failed.
    queue: WorkQueue<ObjectKey>,
}

/// The unschedulable pods a claim change concerns, taken out of the set: those of the claim's
/// namespace (a pod only uses claims of its own namespace).
pub fn take_unschedulable_in(unschedulable: &mut HashSet<ObjectKey>, namespace: Option<&str>) -> Vec<ObjectKey> {
    let mut keys: Vec<ObjectKey> = unschedulable.iter().filter(|k| k.namespace.as_deref() == namespace).cloned().collect();
    keys.sort_by(|a, b| a.name.cmp(&b.name));
    for k in &keys {
        unschedulable.remove(k);
    }
    keys
}

pub fn start(inf: &Arc<Informers>, opts: &Options) {
    let queue: WorkQueue<ObjectKey> = WorkQueue::new();
    let pods = inf.pods();
    let nodes = inf.nodes();
    let claims = inf.claims();
    let volumes = inf.volumes();
    let classes = inf.storage_classes();
    let drivers = inf.csi_drivers();
    let capacities = inf.storage_capacities();

    let shared = Arc::new(Shared { cache: Mutex::default() });
    let retry_unschedulable = {
        let (s, q) = (shared.clone(), queue.clone());
        move || {
            let keys: Vec<ObjectKey> = s.cache().unschedulable.drain().collect();
            for k in keys {
                q.add(k);
            }
        }
    };
    {
        // More capacity published (or a driver changed) may make an unschedulable pod fit;
        // so may a volume or class appearing or changing (upstream's queueing hints for
        // PersistentVolume and StorageClass events).
        let (r1, r2, r3, r4) =
            (retry_unschedulable.clone(), retry_unschedulable.clone(), retry_unschedulable.clone(), retry_unschedulable.clone());
        capacities.on_change(move |_| r1());
        drivers.on_change(move |_| r2());
        volumes.on_change(move |_| r3());
        classes.on_change(move |_| r4());
    }
    {
        // A claim created, bound or changed: the unschedulable pods of its namespace are
        // looked at again (an Immediate claim bound after its pod was found unschedulable).
        let (s, q) = (shared.clone(), queue.clone());
        claims.on_change(move |c| {
            let ns = c.object().metadata.namespace.clone();
            let keys = take_unschedulable_in(&mut s.cache().unschedulable, ns.as_deref());
            for k in keys {
                q.add(k);
            }
        });
    }
    {
        let (s, retry) = (shared.clone(), retry_unschedulable.clone());
        nodes.on_change(move |c| {
            {
                let mut cache = s.cache();
                match c {
                    Change::Applied { new, .. } => {
                        let name = new.name_any();
                        match cache.nodes.get_mut(&name) {
                            Some(info) => info.set_node(new.clone()),
                            None => {
                                let mut info = NodeInfo::new(new.clone());
                                for (n, p) in cache.accounted.values() {
                                    if *n == name {
                                        info.add_pod(p);
                                    }
                                }
                                cache.nodes.insert(name, info);
                            }
                        }
                    }
                    Change::Deleted(old) => {
                        cache.nodes.remove(&old.name_any());
                    }
                }
            }
            retry();
        });
    }
    {
        let (s, q, retry) = (shared.clone(), queue.clone(), retry_unschedulable.clone());
        pods.on_change(move |c| {
            let pod = c.object();
            let uid = pod.uid().unwrap_or_default();
            let node = pod.spec.as_ref().and_then(|sp| sp.node_name.clone());
            match c {
                Change::Applied { new, .. } => {
                    for k in keys_for_pod(c) {
                        q.add(k);
                    }
                    let mut cache = s.cache();
                    match node {
                        Some(n) if !terminal(new) => {
                            cache.assumed.remove(&uid);
                            cache.account(&uid, &n, new.clone());
                        }
                        _ if terminal(new) => {
                            cache.unaccount(&uid);
                            drop(cache);
                            retry();
                        }
                        _ => {}
                    }
                }
                Change::Deleted(_) => {
                    let mut cache = s.cache();
                    cache.unaccount(&uid);
                    cache.assumed.remove(&uid);
                    cache.unschedulable.remove(&ObjectKey::of(pod.as_ref()));
                    drop(cache);
                    if node.is_some() {
                        retry();
                    }
                }
            }
        });
    }
    {
        let p = pods.clone();
        spawn_resync(queue.clone(), opts.resync.min(Duration::from_secs(60)), move || {
            p.list().iter().filter(|p| plan::is_pending(p, SCHEDULER_NAME)).map(|p| ObjectKey::of(p.as_ref())).collect()
        });
    }
    let client = inf.client();
    let ctx = Arc::new(Context {
        recorder: Recorder::new(client.clone(), SCHEDULER_NAME),
        client,
        pods,
        nodes,
        claims,
        volumes,
        classes,
        drivers,
        capacities,
        shared,
        queue: queue.clone(),
    });
    {
        let ctx = ctx.clone();
        inf.explain().register("scheduler", Arc::new(move |key| Box::pin(explain(ctx.clone(), key))));
    }
    spawn_workers("scheduler", queue, 1, move |key: ObjectKey| reconcile(ctx.clone(), key));
}

/// A dry run of [`reconcile`] for one pod: every node's filter verdict, the node it would
/// take, or why it fits nowhere.
async fn explain(ctx: Arc<Context>, key: ObjectKey) -> Result<Explanation, ExplainError> {
    let Context { pods, claims, volumes, classes, drivers, capacities, shared, .. } = &*ctx;
    pods.wait_synced().await;
    ctx.nodes.wait_synced().await;
    claims.wait_synced().await;
    volumes.wait_synced().await;
    classes.wait_synced().await;
    drivers.wait_synced().await;
    capacities.wait_synced().await;
    let pod = pods.get(key.namespace.as_deref(), &key.name).ok_or_else(|| ExplainError::not_found("pods", &key))?;
    let mut e = Explanation::new("scheduler", Subject::of(pod.as_ref()));
    let spec = pod.spec.clone().unwrap_or_default();
    e.wants = json!({
        "schedulerName": spec.scheduler_name.as_deref().unwrap_or(SCHEDULER_NAME),
        "nodeName": spec.node_name,
    });
    if !plan::is_pending(&pod, SCHEDULER_NAME) {
        e.waiting.push(match spec.node_name.as_deref() {
            Some(n) if !n.is_empty() => format!("nothing to do: the pod is bound to node {n}"),
            _ if spec.scheduler_name.as_deref().is_some_and(|s| s != SCHEDULER_NAME) => {
                format!("nothing to do: the pod is for the scheduler {:?}", spec.scheduler_name.as_deref().unwrap_or_default())
            }
            _ => "nothing to do: the pod is terminating or finished".to_string(),
        });
        return Ok(e);
    }
    let all_volumes = volumes.list();
    let claim_of = |ns: &str, name: &str| -> Option<Arc<PersistentVolumeClaim>> { claims.get(Some(ns), name) };
    let class_of = |name: &str| classes.get(None, name);
    let all_capacities = capacities.list();
    let driver_of = |name: &str| drivers.get(None, name);
    let view = VolumeView { claims: &claim_of, volumes: &all_volumes, class: &class_of, driver: &driver_of, capacities: &all_capacities };
    let cache = shared.cache();
    let uid = pod.uid().unwrap_or_default();
    let infos: Vec<&NodeInfo> = cache.nodes.values().collect();
    e.observed = match plan::filter_each(&pod, &infos, &view) {
        Ok(verdicts) => json!({"nodes": verdicts.iter().map(|(n, reasons)| {
            if reasons.is_empty() { json!({"name": n, "fits": true}) } else { json!({"name": n, "fits": false, "reasons": reasons}) }
        }).collect::<Vec<_>>()}),
        Err(why) => json!({"claims": why}),
    };
    if cache.assumed.contains(&uid) {
        e.waiting.push("the pod is assumed on its node; the binding (and its claims' provisioning) is in progress".into());
        return Ok(e);
    }
    match plan::schedule(&pod, &infos, &view) {
        Ok(d) => {
            if !d.select_node_for_claims.is_empty() {
                e.actions.push(format!(
                    "select node {} for the claims {} and wait until they are bound",
                    d.node,
                    d.select_node_for_claims.join(", ")
                ));
            }
            e.actions.push(format!("bind the pod to node {}", d.node));
        }
        Err(u) => {
            e.actions.push(format!("set PodScheduled False (Unschedulable): {}", u.message));
            e.waiting.push(format!("{} (looked at again when nodes, bound pods, claims, volumes, classes or storage capacities change)", u.message));
        }
    }
    Ok(e)
}

/// One scheduling decision for a pending pod: assume it on the chosen node and bind it in the
/// background, or mark it unschedulable.
#[tracing::instrument(name = "reconcile", skip_all, fields(controller = "scheduler", key = %key))]
async fn reconcile(ctx: Arc<Context>, key: ObjectKey) -> Result<Next, Error> {
    let Context { client, pods, nodes, claims, volumes, classes, drivers, capacities, shared, recorder, queue } = &*ctx;
    for i in [
        pods.is_synced(),
        nodes.is_synced(),
        claims.is_synced(),
        volumes.is_synced(),
        classes.is_synced(),
        drivers.is_synced(),
        capacities.is_synced(),
    ] {
        if !i {
            return Ok(Next::After(Duration::from_millis(100)));
        }
    }
    let Some(pod) = pods.get(key.namespace.as_deref(), &key.name) else {
        forget_attempts(&key.to_string());
        return Ok(Next::Done);
    };
    if !plan::is_pending(&pod, SCHEDULER_NAME) {
        forget_attempts(&key.to_string());
        return Ok(Next::Done);
    }
    let uid = pod.uid().unwrap_or_default();
    let attempt_started = std::time::Instant::now();
    let decision = {
        let all_volumes = volumes.list();
        let claim_of = |ns: &str, name: &str| -> Option<Arc<PersistentVolumeClaim>> { claims.get(Some(ns), name) };
        let class_of = |name: &str| classes.get(None, name);
        let all_capacities = capacities.list();
        let driver_of = |name: &str| drivers.get(None, name);
        let view = VolumeView {
            claims: &claim_of,
            volumes: &all_volumes,
            class: &class_of,
            driver: &driver_of,
            capacities: &all_capacities,
        };
        let mut cache = shared.cache();
        if cache.assumed.contains(&uid) {
            return Ok(Next::Done);
        }
        let infos: Vec<&NodeInfo> = cache.nodes.values().collect();
        match plan::schedule(&pod, &infos, &view) {
            Ok(d) => {
                let mut assumed = (*pod).clone();
                assumed.spec.get_or_insert_with(Default::default).node_name = Some(d.node.clone());
                cache.account(&uid, &d.node, Arc::new(assumed));
                cache.assumed.insert(uid.clone());
                cache.unschedulable.remove(&key);
                Ok(d)
            }
            Err(u) => {
                cache.unschedulable.insert(key.clone());
                Err(u)
            }
        }
    };
    let ns = key.namespace.clone().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    match decision {
        Ok(d) => {
            let (client, recorder, shared, queue) = (client.clone(), recorder.clone(), shared.clone(), queue.clone());
            let claims = claims.clone();
            tokio::spawn(async move {
                let r = bind(&client, &api, &claims, &pod, &d.node, &d.select_node_for_claims).await;
                let attempts = attempt_done(&key.to_string(), r.is_ok());
                let result = if r.is_ok() { "scheduled" } else { "error" };
                crate::metrics::SCHEDULE_ATTEMPTS.inc(&[SCHEDULER_NAME, result]);
                crate::metrics::ATTEMPT_DURATION.observe(&[SCHEDULER_NAME, result], attempt_started.elapsed().as_secs_f64());
                if r.is_ok() {
                    if let Some(created) = pod.metadata.creation_timestamp.as_ref() {
                        let since = jiff::Timestamp::now().duration_since(created.0).as_secs_f64().max(0.0);
                        crate::metrics::POD_SCHEDULING_DURATION.observe(&[&attempts.min(15).to_string()], since);
                    }
                }
                match r {
                    Ok(()) => recorder.record(
                        pod.as_ref(),
                        "Normal",
                        "Scheduled",
                        format!("Successfully assigned {}/{} to {}", ns, pod.name_any(), d.node),
                    ),
                    Err(e) => {
                        tracing::info!(pod = %key, node = d.node, error = %e, "binding failed; will retry");
                        let mut cache = shared.cache();
                        cache.assumed.remove(&uid);
                        cache.unaccount(&uid);
                        drop(cache);
                        queue.add_rate_limited(key);
                    }
                }
            });
            Ok(Next::Done)
        }
        Err(u) => {
            attempt_done(&key.to_string(), false);
            crate::metrics::SCHEDULE_ATTEMPTS.inc(&[SCHEDULER_NAME, "unschedulable"]);
            crate::metrics::ATTEMPT_DURATION.observe(&[SCHEDULER_NAME, "unschedulable"], attempt_started.elapsed().as_secs_f64());
            mark_unschedulable(&api, &pod, &u.message).await?;
            recorder.record(pod.as_ref(), "Warning", "FailedScheduling", u.message.clone());
            // retried on cluster changes; and at the latest after 5 minutes, like upstream
            Ok(Next::After(Duration::from_secs(300)))
        }
    }
}

/// Attempts per pod (by namespace/name) so far (the `attempts` label of
/// scheduler_pod_scheduling_duration_seconds); forgotten once the pod is bound or gone.
static ATTEMPTS: std::sync::LazyLock<std::sync::Mutex<HashMap<String, u32>>> = std::sync::LazyLock::new(Default::default);

/// Counts an attempt for the pod; returns how many it took when it ended in a binding.
fn attempt_done(pod: &str, bound: bool) -> u32 {
    let mut a = ATTEMPTS.lock().unwrap_or_else(|p| p.into_inner());
    let n = {
        let e = a.entry(pod.to_string()).or_insert(0);
        *e += 1;
        *e
    };
    if bound {
        a.remove(pod);
    }
    n
}

fn forget_attempts(pod: &str) {
    ATTEMPTS.lock().unwrap_or_else(|p| p.into_inner()).remove(pod);
}

/// Upstream's bindTimeoutSeconds: how long PreBind waits for the pod's claims to be bound.
const BIND_TIMEOUT: Duration = Duration::from_secs(600);

/// PreBind (VolumeBinding) and Bind: the claims to provision get the selected-node annotation,
/// then the binding waits until every one of them is bound (provisioned for this node), as
/// upstream's scheduler does, so the pod reaches its node with its volumes ready; a claim whose
/// annotation goes away (the provisioner gave up on this node) or the timeout fails the
/// binding, and the pod is scheduled again.
async fn bind(
    client: &kube::Client,
    api: &Api<Pod>,
    claim_cache: &Informer<PersistentVolumeClaim>,
    pod: &Pod,
    node: &str,
    claims: &[String],
) -> Result<(), Error> {
    let ns = pod.namespace().unwrap_or_default();
    let capi: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    for c in claims {
        let patch = json!({"metadata": {"annotations": {"volume.kubernetes.io/selected-node": node}}});
        capi.patch(c, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    }
    let deadline = tokio::time::Instant::now() + BIND_TIMEOUT;
    let mut seen_selected: std::collections::BTreeSet<&str> = std::collections::BTreeSet::new();
    loop {
        let mut pending = Vec::new();
        for c in claims {
            let Some(pvc) = claim_cache.get(Some(&ns), c) else {
                return Err(Error::Other(format!("claim {ns}/{c} is gone")));
            };
            if pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound") {
                continue;
            }
            let selected = pvc.metadata.annotations.as_ref().and_then(|a| a.get(plan::SELECTED_NODE_ANNOTATION));
            // The informer may not show the annotation just written yet; once it did, its
            // removal (or another node in it) is the provisioner asking for rescheduling.
            match selected {
                Some(n) if n == node => {
                    seen_selected.insert(c.as_str());
                }
                Some(_) => return Err(Error::Other(format!("claim {ns}/{c} was selected for another node"))),
                None if seen_selected.contains(c.as_str()) => {
                    return Err(Error::Other(format!("the provisioner gave claim {ns}/{c} up on node {node}")));
                }
                None => {}
            }
            pending.push(c.as_str());
        }
        if pending.is_empty() {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::Other(format!("timed out waiting for the claims {pending:?} to be bound")));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let binding = Binding {
        metadata: ObjectMeta { name: Some(pod.name_any()), namespace: Some(ns.clone()), uid: pod.uid(), ..Default::default() },
        target: ObjectReference { api_version: Some("v1".into()), kind: Some("Node".into()), name: Some(node.to_string()), ..Default::default() },
    };
    match api.create_subresource::<Binding, serde_json::Value>("binding", &pod.name_any(), &PostParams::default(), &binding).await {
        Ok(_) => Ok(()),
        Err(e) if is_not_found(&e) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Sets PodScheduled=False/Unschedulable with the message, unless it already says so.
async fn mark_unschedulable(api: &Api<Pod>, pod: &Pod, message: &str) -> Result<(), Error> {
    let current = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled"));
    if current.is_some_and(|c| c.status == "False" && c.reason.as_deref() == Some("Unschedulable") && c.message.as_deref() == Some(message)) {
        return Ok(());
    }
    let mut conditions: Vec<PodCondition> = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c.type_ != "PodScheduled")
        .collect();
    conditions.push(PodCondition {
        type_: "PodScheduled".into(),
        status: "False".into(),
        reason: Some("Unschedulable".into()),
        message: Some(message.to_string()),
        last_transition_time: Some(Time(jiff::Timestamp::now())),
        last_probe_time: None,
        ..Default::default()
    });
    let patch = json!({"status": {"conditions": conditions}});
    match api.patch_status(&pod.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => Ok(()),
        Err(e) if is_not_found(&e) || is_conflict(&e) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_change_retries_the_unschedulable_pods_of_its_namespace() {
        let mut set: HashSet<ObjectKey> =
            [("a", "web-1"), ("a", "web-0"), ("b", "db-0")].iter().map(|(ns, n)| ObjectKey::new(Some(ns), n)).collect();
        let keys = take_unschedulable_in(&mut set, Some("a"));
        assert_eq!(keys, [ObjectKey::new(Some("a"), "web-0"), ObjectKey::new(Some("a"), "web-1")]);
        assert_eq!(set.into_iter().collect::<Vec<_>>(), [ObjectKey::new(Some("b"), "db-0")]);
    }

    fn pod(spec: serde_json::Value) -> Arc<Pod> {
        Arc::new(serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "ns"}, "spec": spec})).unwrap())
    }

    #[test]
    fn only_a_pod_pending_for_this_scheduler_is_a_key() {
        let pending = pod(json!({"containers": []}));
        assert_eq!(keys_for_pod(&Change::Applied { old: None, new: pending.clone() }), [ObjectKey::new(Some("ns"), "p")]);
        let bound = pod(json!({"containers": [], "nodeName": "n1"}));
        assert!(keys_for_pod(&Change::Applied { old: Some(pending.clone()), new: bound }).is_empty());
        let other = pod(json!({"containers": [], "schedulerName": "someone-else"}));
        assert!(keys_for_pod(&Change::Applied { old: None, new: other }).is_empty());
        assert!(keys_for_pod(&Change::Deleted(pending)).is_empty());
    }
}
