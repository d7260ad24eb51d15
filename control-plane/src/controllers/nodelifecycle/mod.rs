//! Node lifecycle executor: tracks when each node last renewed its Lease (by this
//! controller's clock, so clock skew does not matter), marks silent nodes Unknown and taints
//! them, removes the taints when they return, and evicts pods from NoExecute-tainted nodes
//! per their tolerations (taint manager).

pub mod plan;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferro_runtime::{spawn_workers, Change, Informer, Next, WorkQueue};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt as _};
use serde_json::json;

use ferro_runtime::events::Recorder;
use crate::controllers::explain::{ExplainError, Explanation, Subject};
use crate::controllers::manager::{Informers, Options};
use self::plan::NodeHealth;
use crate::controllers::{is_conflict, is_not_found, Error};

/// How often every node is looked at (upstream's --node-monitor-period).
const MONITOR_PERIOD: Duration = Duration::from_secs(5);

type Health = Arc<Mutex<HashMap<String, jiff::Timestamp>>>;

fn beat(health: &Health, node: &str) {
    health.lock().unwrap_or_else(|p| p.into_inner()).insert(node.to_string(), jiff::Timestamp::now());
}

/// A node lease whose renewTime moved (a heartbeat: the node is looked at again).
pub fn keys_for_lease(change: &Change<Lease>) -> Vec<String> {
    let Change::Applied { old, new } = change else { return Vec::new() };
    if new.namespace().as_deref() != Some("kube-node-lease") {
        return Vec::new();
    }
    let renew = |l: &Lease| l.spec.as_ref().and_then(|s| s.renew_time.clone());
    if old.as_ref().map(|o| renew(o)) != Some(renew(new)) {
        vec![new.name_any()]
    } else {
        Vec::new()
    }
}

/// A node created or changed; a deleted one has nothing left to reconcile.
pub fn keys_for_node(change: &Change<Node>) -> Vec<String> {
    match change {
        Change::Applied { new, .. } => vec![new.name_any()],
        Change::Deleted(_) => Vec::new(),
    }
}

/// What the workers share.
struct Context {
    client: kube::Client,
    nodes: Arc<Informer<Node>>,
    pods: Arc<Informer<Pod>>,
    health: Health,
    recorder: Recorder,
    grace: Duration,
}

pub fn start(inf: &Arc<Informers>, opts: &Options) {
    let queue: WorkQueue<String> = WorkQueue::new();
    let nodes = inf.nodes();
    let leases = inf.leases();
    let pods = inf.pods();
    let health: Health = Arc::default();
    {
        let (q, h) = (queue.clone(), health.clone());
        leases.on_change(move |c| {
            for k in keys_for_lease(c) {
                beat(&h, &k);
                q.add(k);
            }
        });
    }
    {
        let (q, h) = (queue.clone(), health.clone());
        nodes.on_change(move |c| match c {
            Change::Applied { old, new } => {
                let hb = |n: &Node| {
                    n.status.as_ref().and_then(|s| s.conditions.as_ref()).and_then(|cs| {
                        cs.iter().find(|c| c.type_ == "Ready").and_then(|c| c.last_heartbeat_time.clone())
                    })
                };
                let known = h.lock().unwrap_or_else(|p| p.into_inner()).contains_key(&new.name_any());
                if !known || old.as_ref().map(|o| hb(o)) != Some(hb(new)) && hb(new).is_some() {
                    beat(&h, &new.name_any());
                }
                for k in keys_for_node(c) {
                    q.add(k);
                }
            }
            Change::Deleted(n) => {
                h.lock().unwrap_or_else(|p| p.into_inner()).remove(&n.name_any());
            }
        });
    }
    {
        let (q, n) = (queue.clone(), nodes.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(MONITOR_PERIOD);
            loop {
                tick.tick().await;
                for k in n.keys() {
                    q.add(k.name);
                }
            }
        });
    }
    let client = inf.client();
    let ctx = Arc::new(Context {
        recorder: Recorder::new(client.clone(), "node-controller"),
        client,
        nodes,
        pods,
        health,
        grace: opts.node_monitor_grace_period,
    });
    {
        let ctx = ctx.clone();
        inf.explain().register("nodelifecycle", Arc::new(move |key| Box::pin(explain(ctx.clone(), key.name))));
    }
    spawn_workers("nodelifecycle", queue, 2, move |name: String| reconcile(ctx.clone(), name));
}

/// A dry run of [`reconcile`] for one node: its heartbeat against the grace period, the
/// condition and taint writes, and the pods a NoExecute taint would evict now or later.
async fn explain(ctx: Arc<Context>, name: String) -> Result<Explanation, ExplainError> {
    let Context { nodes, pods, health, grace, .. } = &*ctx;
    nodes.wait_synced().await;
    pods.wait_synced().await;
    let node = nodes.get(None, &name).ok_or_else(|| ExplainError::NotFound { resource: "nodes".into(), name: name.clone() })?;
    let now = jiff::Timestamp::now();
    let last = health.lock().unwrap_or_else(|p| p.into_inner()).get(&name).copied().unwrap_or(now);
    let p = plan::plan_node(&node, &NodeHealth { last_heartbeat: last }, *grace, now);
    let since = std::time::Duration::try_from(now.duration_since(last)).unwrap_or_default();
    let go = crate::controllers::explain::go_duration;
    let mut e = Explanation::new("nodelifecycle", Subject::of(node.as_ref()));
    let ready = node.status.as_ref().and_then(|s| s.conditions.as_ref()).and_then(|c| c.iter().find(|c| c.type_ == "Ready")).map(|c| c.status.clone());
    let taints: Vec<String> = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default().iter().map(|t| format!("{}:{}", t.key, t.effect)).collect();
    e.observed = json!({"lastHeartbeatAgo": go(since), "ready": ready, "taints": taints});
    e.wants = json!({"nodeMonitorGracePeriod": go(*grace)});
    if let Some(c) = &p.status_conditions {
        let s: Vec<String> = c.iter().map(|c| format!("{}={}", c.type_, c.status)).collect();
        e.actions.push(format!("write the conditions {}", s.join(", ")));
    }
    if let Some(t) = &p.taints {
        let s: Vec<String> = t.iter().map(|t| format!("{}:{}", t.key, t.effect)).collect();
        e.actions.push(format!("set the taints to [{}]", s.join(", ")));
    }
    if since <= *grace {
        e.waiting.push(format!("the node is marked unreachable if no heartbeat comes within {}", go(*grace - since)));
    }
    let on_node: Vec<Arc<Pod>> =
        pods.list().into_iter().filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(name.as_str())).collect();
    let refs: Vec<&Pod> = on_node.iter().map(|p| p.as_ref()).collect();
    for (ns, pod) in plan::pods_to_mark_not_ready(&node, &refs) {
        e.actions.push(format!("mark Pod {ns}/{pod} not ready"));
    }
    let ev = plan::plan_evictions(&node, &refs, now);
    for (ns, pod) in &ev.evict {
        e.actions.push(format!("evict Pod {ns}/{pod}: it does not tolerate the node's NoExecute taints (any longer)"));
    }
    if let Some(d) = ev.recheck_after {
        e.waiting.push(format!("the next pod's toleration of the NoExecute taints runs out in {}", go(d)));
    }
    Ok(e.requeue(ev.recheck_after))
}

/// One pass over a node: its Ready condition and taints from its heartbeats, then (on a
/// NoExecute-tainted node) its pods marked not ready and evicted per their tolerations.
#[tracing::instrument(name = "reconcile", skip_all, fields(controller = "nodelifecycle", key = %name))]
async fn reconcile(ctx: Arc<Context>, name: String) -> Result<Next, Error> {
    let Context { client, nodes, pods, health, recorder, grace } = &*ctx;
    let grace = *grace;
    nodes.wait_synced().await;
    pods.wait_synced().await;
    let Some(node) = nodes.get(None, &name) else { return Ok(Next::Done) };
    let now = jiff::Timestamp::now();
    let last = *health.lock().unwrap_or_else(|p| p.into_inner()).entry(name.clone()).or_insert(now);
    let p = plan::plan_node(&node, &NodeHealth { last_heartbeat: last }, grace, now);
    let api: Api<Node> = Api::all(client.clone());
    if let Some(conditions) = p.status_conditions {
        let unknown = conditions.iter().any(|c| c.type_ == "Ready" && c.status == "Unknown");
        let mut new = (*node).clone();
        new.status.get_or_insert_with(Default::default).conditions = Some(conditions);
        match api.replace_status(&name, &PostParams::default(), &new).await {
            Ok(_) if unknown => {
                recorder.record(node.as_ref(), "Normal", "NodeNotReady", format!("Node {name} status is now: NodeNotReady"))
            }
            Ok(_) => {}
            Err(e) if is_not_found(&e) => return Ok(Next::Done),
            Err(e) if is_conflict(&e) => return Ok(Next::After(Duration::from_millis(200))),
            Err(e) => return Err(Error::from(e)),
        }
    }
    if let Some(taints) = p.taints {
        let patch = json!({"metadata": {"resourceVersion": node.resource_version()}, "spec": {"taints": taints}});
        match api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => {}
            Err(e) if is_not_found(&e) => return Ok(Next::Done),
            Err(e) if is_conflict(&e) => return Ok(Next::After(Duration::from_millis(200))),
            Err(e) => return Err(Error::from(e)),
        }
        // evictions are planned against the node as written; look again at once
        return Ok(Next::After(Duration::from_millis(50)));
    }
    let no_execute = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.effect == "NoExecute"));
    if !no_execute {
        return Ok(Next::Done);
    }
    let on_node: Vec<Arc<Pod>> = pods
        .list()
        .into_iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(name.as_str()))
        .collect();
    let refs: Vec<&Pod> = on_node.iter().map(|p| p.as_ref()).collect();
    // pods of a node that stopped reporting are not ready (upstream MarkPodsNotReady),
    // so Services stop sending them traffic before any eviction
    for (ns, pod) in plan::pods_to_mark_not_ready(&node, &refs) {
        let Some(p) = on_node.iter().find(|p| p.name_any() == pod && p.namespace().as_deref() == Some(ns.as_str())) else { continue };
        let conditions: Vec<_> = p
            .status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|mut c| {
                if c.type_ == "Ready" && c.status != "False" {
                    c.status = "False".into();
                    c.reason = None;
                    c.last_transition_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now));
                }
                c
            })
            .collect();
        let papi: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let patch = json!({"status": {"conditions": conditions}});
        match papi.patch_status(&pod, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => {}
            Err(e) if is_not_found(&e) || is_conflict(&e) => {}
            Err(e) => return Err(Error::from(e)),
        }
    }
    let ev = plan::plan_evictions(&node, &refs, now);
    for (ns, pod) in &ev.evict {
        let papi: Api<Pod> = Api::namespaced(client.clone(), ns);
        match papi.delete(pod, &DeleteParams::default()).await {
            Ok(_) => {
                if let Some(p) = on_node.iter().find(|p| p.name_any() == *pod && p.namespace().as_deref() == Some(ns)) {
                    recorder.record(p.as_ref(), "Normal", "TaintManagerEviction", format!("Marking for deletion Pod {ns}/{pod}"));
                }
            }
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(Error::from(e)),
        }
    }
    Ok(match ev.recheck_after {
        Some(d) => Next::After(d),
        None => Next::Done,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn lease(namespace: &str, renew: &str) -> Arc<Lease> {
        Arc::new(
            serde_json::from_value(json!({"metadata": {"name": "n1", "namespace": namespace}, "spec": {"renewTime": renew}})).unwrap(),
        )
    }

    #[test]
    fn a_node_lease_renewal_is_a_key() {
        let first = lease("kube-node-lease", "2024-01-01T00:00:00.000000Z");
        let renewed = lease("kube-node-lease", "2024-01-01T00:00:10.000000Z");
        assert_eq!(keys_for_lease(&Change::Applied { old: None, new: first.clone() }), ["n1"]);
        assert_eq!(keys_for_lease(&Change::Applied { old: Some(first.clone()), new: renewed }), ["n1"]);
        // an update that did not renew it is no heartbeat
        assert!(keys_for_lease(&Change::Applied { old: Some(first.clone()), new: first.clone() }).is_empty());
        // leases elsewhere (leader election) and deletions are not node heartbeats
        let other = lease("kube-system", "2024-01-01T00:00:00.000000Z");
        assert!(keys_for_lease(&Change::Applied { old: None, new: other }).is_empty());
        assert!(keys_for_lease(&Change::Deleted(first)).is_empty());
    }

    #[test]
    fn a_node_change_is_a_key_and_a_deletion_is_not() {
        let node: Arc<Node> = Arc::new(serde_json::from_value(json!({"metadata": {"name": "n1"}})).unwrap());
        assert_eq!(keys_for_node(&Change::Applied { old: None, new: node.clone() }), ["n1"]);
        assert!(keys_for_node(&Change::Deleted(node)).is_empty());
    }
}
