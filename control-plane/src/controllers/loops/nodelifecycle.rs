//! Node lifecycle executor: tracks when each node last renewed its Lease (by this
//! controller's clock, so clock skew does not matter), marks silent nodes Unknown and taints
//! them, removes the taints when they return, and evicts pods from NoExecute-tainted nodes
//! per their tolerations (taint manager).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferro_runtime::{spawn_workers, Change, Next, WorkQueue};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt as _};
use serde_json::json;

use ferro_runtime::events::Recorder;
use crate::controllers::manager::{Informers, Options};
use crate::controllers::nodelifecycle::{self as plan, NodeHealth};
use crate::controllers::{is_conflict, is_not_found, Error};

/// How often every node is looked at (upstream's --node-monitor-period).
const MONITOR_PERIOD: Duration = Duration::from_secs(5);

type Health = Arc<Mutex<HashMap<String, jiff::Timestamp>>>;

fn beat(health: &Health, node: &str) {
    health.lock().unwrap_or_else(|p| p.into_inner()).insert(node.to_string(), jiff::Timestamp::now());
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
            let Change::Applied { old, new } = c else { return };
            if new.namespace().as_deref() != Some("kube-node-lease") {
                return;
            }
            let renew = |l: &k8s_openapi::api::coordination::v1::Lease| l.spec.as_ref().and_then(|s| s.renew_time.clone());
            if old.as_ref().map(|o| renew(o)) != Some(renew(new)) {
                beat(&h, &new.name_any());
                q.add(new.name_any());
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
                q.add(new.name_any());
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
    let grace = opts.node_monitor_grace_period;
    let client = inf.client();
    let recorder = Recorder::new(client.clone(), "node-controller");
    spawn_workers("nodelifecycle", queue, 2, move |name: String| {
        let (client, nodes, pods, health, recorder) = (client.clone(), nodes.clone(), pods.clone(), health.clone(), recorder.clone());
        async move {
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
    });
}
