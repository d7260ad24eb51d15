//! Pod garbage collector executor (upstream's PodGC): force deletes the pods [`plan`] names,
//! first moving unfinished ones to phase Failed through the status.
//!
//! Upstream looks at every pod every 20 s; here the same pass runs every [`plan::GC_PERIOD`]
//! (the resync) and changes queue the one part they concern, so a pod stuck on a deleted node
//! goes once the quarantine is over rather than at the next pass:
//! - `terminated`: the terminated pods beyond the threshold (a pod finished);
//! - `node/<name>`: a node's out-of-service pods, or, when the node is missing, its pods once
//!   it stayed missing for the quarantine and a live read confirmed it (upstream's quarantine
//!   queue and `checkIfNodeExists`);
//! - `pod/<ns>/<name>`: a terminating pod never scheduled or on an out-of-service node.
//!
//! The time each node was first seen missing is the state this loop keeps; after a restart the
//! quarantine starts again.

pub mod plan;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferro_runtime::{spawn_resync, spawn_workers, Change, Informer, Next, ObjectKey, WorkQueue};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Api, ResourceExt as _};

use self::plan::Deletion;
use crate::controllers::explain::{ExplainError, Explanation, Subject};
use crate::controllers::manager::{Informers, Options};
use crate::controllers::{is_conflict, is_not_found, Error};

/// What one reconcile looks at.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    /// The terminated pods beyond the threshold.
    Terminated,
    /// A node's pods: out of service, or the node is gone.
    Node(String),
    /// One terminating pod.
    Pod(ObjectKey),
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Key::Terminated => f.write_str("terminated"),
            Key::Node(n) => write!(f, "node/{n}"),
            Key::Pod(k) => write!(f, "pod/{k}"),
        }
    }
}

fn bound_node(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).filter(|n| !n.is_empty())
}

/// What a pod change concerns: it finished (the threshold), it is terminating (unscheduled, or
/// maybe on an out-of-service node), it is bound to a node `node_known` does not know (the
/// quarantine starts).
pub fn keys_for_pod(change: &Change<Pod>, node_known: impl Fn(&str) -> bool) -> Vec<Key> {
    let Change::Applied { old, new } = change else { return Vec::new() };
    let mut keys = Vec::new();
    if plan::is_terminated(new) && old.as_deref().is_none_or(|o| !plan::is_terminated(o)) {
        keys.push(Key::Terminated);
    }
    if plan::is_terminating(new) {
        keys.push(Key::Pod(ObjectKey::of(new.as_ref())));
    }
    if let Some(n) = bound_node(new).filter(|n| !node_known(n)) {
        keys.push(Key::Node(n.to_string()));
    }
    keys
}

/// A deleted node (its pods go after the quarantine) or one out of service.
pub fn keys_for_node(change: &Change<Node>) -> Vec<Key> {
    match change {
        Change::Deleted(n) => vec![Key::Node(n.name_any())],
        Change::Applied { new, .. } if plan::is_out_of_service(new) => vec![Key::Node(new.name_any())],
        Change::Applied { .. } => Vec::new(),
    }
}

/// The periodic pass: the threshold, every terminating pod, every out-of-service or missing
/// node.
pub fn keys_for_resync(pods: &[&Pod], nodes: &[&Node], node_known: impl Fn(&str) -> bool) -> Vec<Key> {
    let mut keys = vec![Key::Terminated];
    keys.extend(pods.iter().filter(|p| plan::is_terminating(p)).map(|p| Key::Pod(ObjectKey::of(*p))));
    keys.extend(nodes.iter().filter(|n| plan::is_out_of_service(n)).map(|n| Key::Node(n.name_any())));
    keys.extend(plan::missing_nodes(pods, node_known).into_iter().map(|n| Key::Node(n.to_string())));
    keys
}

/// What the workers share.
struct Context {
    client: kube::Client,
    pods: Arc<Informer<Pod>>,
    nodes: Arc<Informer<Node>>,
    threshold: usize,
    quarantine: Duration,
    /// When each missing node was first seen missing.
    missing: Mutex<HashMap<String, Instant>>,
}

impl Context {
    fn missing(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.missing.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub fn start(inf: &Arc<Informers>, opts: &Options) {
    let queue: WorkQueue<Key> = WorkQueue::new();
    let pods = inf.pods();
    let nodes = inf.nodes();
    {
        let (q, nodes) = (queue.clone(), nodes.clone());
        pods.on_change(move |c| {
            for k in keys_for_pod(c, |n| nodes.get(None, n).is_some()) {
                q.add(k);
            }
        });
    }
    {
        let q = queue.clone();
        nodes.on_change(move |c| {
            for k in keys_for_node(c) {
                q.add(k);
            }
        });
    }
    {
        let (p, n) = (pods.clone(), nodes.clone());
        spawn_resync(queue.clone(), plan::GC_PERIOD, move || {
            let all_pods = p.list();
            let all_nodes = n.list();
            let pod_refs: Vec<&Pod> = all_pods.iter().map(|p| p.as_ref()).collect();
            let node_refs: Vec<&Node> = all_nodes.iter().map(|n| n.as_ref()).collect();
            keys_for_resync(&pod_refs, &node_refs, |name| n.get(None, name).is_some())
        });
    }
    let ctx = Arc::new(Context {
        client: inf.client(),
        pods,
        nodes,
        threshold: opts.terminated_pod_gc_threshold,
        quarantine: opts.pod_gc_quarantine,
        missing: Mutex::default(),
    });
    {
        let ctx = ctx.clone();
        inf.explain().register("podgc", Arc::new(move |key| Box::pin(explain(ctx.clone(), key))));
    }
    spawn_workers("podgc", queue, 2, move |key: Key| reconcile(ctx.clone(), key));
}

/// A dry run of the rules for one pod: whether PodGC would force delete it now, and why not.
async fn explain(ctx: Arc<Context>, key: ObjectKey) -> Result<Explanation, ExplainError> {
    ctx.pods.wait_synced().await;
    ctx.nodes.wait_synced().await;
    let pod = ctx.pods.get(key.namespace.as_deref(), &key.name).ok_or_else(|| ExplainError::not_found("pods", &key))?;
    let now = jiff::Timestamp::now();
    let mut e = Explanation::new("podgc", Subject::of(pod.as_ref()));
    let node = bound_node(&pod).map(str::to_string);
    let node_obj = node.as_deref().and_then(|n| ctx.nodes.get(None, n));
    e.observed = serde_json::json!({
        "phase": pod.status.as_ref().and_then(|s| s.phase.clone()),
        "terminating": plan::is_terminating(&pod),
        "node": node,
        "nodeExists": node_obj.is_some(),
        "nodeOutOfService": node_obj.as_deref().is_some_and(plan::is_out_of_service),
    });
    let all = ctx.pods.list();
    let refs: Vec<&Pod> = all.iter().map(|p| p.as_ref()).collect();
    let terminated_total = refs.iter().filter(|p| plan::is_terminated(p)).count();
    e.wants = serde_json::json!({"terminatedPodGCThreshold": ctx.threshold, "terminatedPods": terminated_total});
    let uid = pod.metadata.uid.clone();
    let mut deletions: Vec<plan::Deletion> = Vec::new();
    if let Some(d) = plan::unscheduled_terminating(&pod, now) {
        deletions.push(d);
    }
    if let Some(n) = &node_obj {
        deletions.extend(plan::out_of_service(n, &[pod.as_ref()], now));
    }
    if plan::is_terminated(&pod) && ctx.threshold > 0 {
        deletions.extend(plan::terminated(&refs, ctx.threshold, now).into_iter().filter(|d| d.uid == uid));
    }
    if let (Some(n), None) = (&node, &node_obj) {
        let missing_for = ctx.missing().get(n).map(|t| t.elapsed());
        match missing_for {
            Some(d) if d >= ctx.quarantine => deletions.extend(plan::orphaned(&[pod.as_ref()], n, now)),
            Some(d) => e.waiting.push(format!(
                "its node {n} is gone; the pod is force deleted once the node has been missing for {} ({} to go)",
                crate::controllers::explain::go_duration(ctx.quarantine),
                crate::controllers::explain::go_duration(ctx.quarantine - d)
            )),
            None => e.waiting.push(format!(
                "its node {n} is gone; the pod is force deleted after a quarantine of {}",
                crate::controllers::explain::go_duration(ctx.quarantine)
            )),
        }
    }
    for d in &deletions {
        let patch = if d.status_patch.is_some() { "set phase Failed, then " } else { "" };
        e.actions.push(format!("{patch}force delete the pod ({})", d.reason.as_str()));
    }
    if deletions.is_empty() && e.waiting.is_empty() {
        e.waiting.push(if plan::is_terminated(&pod) {
            if ctx.threshold == 0 {
                "nothing to do: the pod is terminated and --terminated-pod-gc-threshold is 0 (keep all)".to_string()
            } else {
                format!(
                    "nothing to do: {terminated_total} terminated pods, within --terminated-pod-gc-threshold {}",
                    ctx.threshold
                )
            }
        } else {
            "nothing to do: the pod is neither terminated beyond the threshold, nor terminating unscheduled or on an out-of-service node, nor on a node that is gone".to_string()
        });
    }
    Ok(e)
}

/// One part of the pass: the pods the key's rule collects, force deleted.
#[tracing::instrument(name = "reconcile", skip_all, fields(controller = "podgc", key = %key))]
async fn reconcile(ctx: Arc<Context>, key: Key) -> Result<Next, Error> {
    ctx.pods.wait_synced().await;
    ctx.nodes.wait_synced().await;
    let now = jiff::Timestamp::now();
    let deletions = match &key {
        Key::Terminated => {
            if ctx.threshold == 0 {
                return Ok(Next::Done);
            }
            let all = ctx.pods.list();
            let refs: Vec<&Pod> = all.iter().map(|p| p.as_ref()).collect();
            plan::terminated(&refs, ctx.threshold, now)
        }
        Key::Pod(k) => {
            let Some(pod) = ctx.pods.get(k.namespace.as_deref(), &k.name) else { return Ok(Next::Done) };
            match (plan::unscheduled_terminating(&pod, now), bound_node(&pod)) {
                (Some(d), _) => vec![d],
                (None, Some(n)) => match ctx.nodes.get(None, n) {
                    Some(node) => plan::out_of_service(&node, &[pod.as_ref()], now),
                    None => Vec::new(),
                },
                (None, None) => Vec::new(),
            }
        }
        Key::Node(name) => match ctx.nodes.get(None, name) {
            Some(node) => {
                ctx.missing().remove(name);
                if !plan::is_out_of_service(&node) {
                    return Ok(Next::Done);
                }
                let all = ctx.pods.list();
                let refs: Vec<&Pod> = all.iter().map(|p| p.as_ref()).collect();
                plan::out_of_service(&node, &refs, now)
            }
            None => {
                let since = *ctx.missing().entry(name.clone()).or_insert_with(Instant::now);
                let waited = since.elapsed();
                if waited < ctx.quarantine {
                    return Ok(Next::After(ctx.quarantine - waited));
                }
                // the informer may lag: only a live read says the node is really gone
                let api: Api<Node> = Api::all(ctx.client.clone());
                if api.get_opt(name).await?.is_some() {
                    ctx.missing().remove(name);
                    return Ok(Next::Done);
                }
                ctx.missing().remove(name);
                let all = ctx.pods.list();
                let refs: Vec<&Pod> = all.iter().map(|p| p.as_ref()).collect();
                plan::orphaned(&refs, name, now)
            }
        },
    };
    let mut failure = None;
    for d in &deletions {
        if let Err(e) = force_delete(&ctx.client, d).await {
            tracing::warn!(pod = %format!("{}/{}", d.namespace, d.name), reason = d.reason.as_str(), error = %e, "force deletion failed");
            failure = Some(e);
        }
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(Next::Done),
    }
}

/// Upstream `markFailedAndDeletePodWithCondition`: phase Failed (and the condition) through
/// the status, then a deletion with grace period 0. A pod already gone, or replaced by one of
/// the same name, is done.
async fn force_delete(client: &kube::Client, d: &Deletion) -> Result<(), Error> {
    let api: Api<Pod> = Api::namespaced(client.clone(), &d.namespace);
    tracing::info!(pod = %format!("{}/{}", d.namespace, d.name), reason = d.reason.as_str(), "PodGC is force deleting Pod");
    if let Some(patch) = &d.status_patch {
        match api.patch_status(&d.name, &PatchParams::default(), &Patch::Strategic(patch)).await {
            Ok(_) => {}
            Err(e) if is_not_found(&e) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    }
    let mut dp = DeleteParams::default().grace_period(0);
    dp.preconditions = d.uid.clone().map(|uid| Preconditions { uid: Some(uid), resource_version: None });
    match api.delete(&d.name, &dp).await {
        Ok(_) => Ok(()),
        Err(e) if is_not_found(&e) || is_conflict(&e) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(node: &str, phase: &str, terminating: bool) -> Arc<Pod> {
        let mut p: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"nodeName": node, "containers": [{"name": "c"}]},
            "status": {"phase": phase}
        }))
        .unwrap();
        if terminating {
            p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH));
        }
        Arc::new(p)
    }

    fn node(name: &str, ready: &str, taints: serde_json::Value) -> Arc<Node> {
        Arc::new(
            serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"taints": taints},
                                          "status": {"conditions": [{"type": "Ready", "status": ready}]}}))
            .unwrap(),
        )
    }

    fn pod_key() -> Key {
        Key::Pod(ObjectKey::new(Some("ns"), "p"))
    }

    #[test]
    fn a_pod_change_maps_to_the_rules_it_concerns() {
        let known = |n: &str| n == "n1";
        let running = pod("n1", "Running", false);
        assert!(keys_for_pod(&Change::Applied { old: None, new: running.clone() }, known).is_empty());
        // it finished: the threshold, once
        let done = pod("n1", "Succeeded", false);
        assert_eq!(keys_for_pod(&Change::Applied { old: Some(running.clone()), new: done.clone() }, known), [Key::Terminated]);
        assert!(keys_for_pod(&Change::Applied { old: Some(done.clone()), new: done }, known).is_empty());
        // terminating
        let leaving = pod("n1", "Running", true);
        assert_eq!(keys_for_pod(&Change::Applied { old: Some(running), new: leaving.clone() }, known), [pod_key()]);
        // bound to a node nobody knows
        let lost = pod("gone", "Running", false);
        assert_eq!(keys_for_pod(&Change::Applied { old: None, new: lost }, known), [Key::Node("gone".into())]);
        // a deleted pod concerns nothing
        assert!(keys_for_pod(&Change::Deleted(leaving), known).is_empty());
    }

    #[test]
    fn a_node_change_maps_to_the_node_when_deleted_or_out_of_service() {
        let oos = json!([{"key": plan::OUT_OF_SERVICE_TAINT, "effect": "NoExecute"}]);
        assert_eq!(keys_for_node(&Change::Deleted(node("n1", "True", json!([])))), [Key::Node("n1".into())]);
        assert!(keys_for_node(&Change::Applied { old: None, new: node("n1", "True", json!([])) }).is_empty());
        assert!(keys_for_node(&Change::Applied { old: None, new: node("n1", "True", oos.clone()) }).is_empty());
        assert_eq!(keys_for_node(&Change::Applied { old: None, new: node("n1", "Unknown", oos) }), [Key::Node("n1".into())]);
    }

    #[test]
    fn the_periodic_pass_covers_every_rule() {
        let oos = json!([{"key": plan::OUT_OF_SERVICE_TAINT, "effect": "NoExecute"}]);
        let pods = [pod("n1", "Running", false), pod("n1", "Running", true), pod("gone", "Running", false)];
        let nodes = [node("n1", "False", oos), node("n2", "True", json!([]))];
        let pod_refs: Vec<&Pod> = pods.iter().map(|p| p.as_ref()).collect();
        let node_refs: Vec<&Node> = nodes.iter().map(|n| n.as_ref()).collect();
        let keys = keys_for_resync(&pod_refs, &node_refs, |n| n == "n1" || n == "n2");
        assert_eq!(keys, [Key::Terminated, pod_key(), Key::Node("n1".into()), Key::Node("gone".into())]);
        assert_eq!(Key::Node("gone".into()).to_string(), "node/gone");
        assert_eq!(pod_key().to_string(), "pod/ns/p");
    }
}
