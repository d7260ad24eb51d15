//! Node IPAM (upstream's range allocator, `--allocate-node-cidrs`): each Node without a
//! podCIDR gets the first free subnet of `--node-cidr-mask-size` from `--cluster-cidr`.

pub mod plan;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use ferro_runtime::{spawn_resync, spawn_workers, Change, Informer, Next, WorkQueue};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt as _};
use serde_json::json;

use crate::controllers::explain::{ExplainError, Explanation, Subject};
use crate::controllers::manager::{Informers, Options};
use self::plan::first_free;
use crate::controllers::{is_not_found, Error};

/// A node without a podCIDR (the only ones this loop has work for).
pub fn keys_for_node(change: &Change<Node>) -> Vec<String> {
    match change {
        Change::Applied { new, .. } if new.spec.as_ref().and_then(|s| s.pod_cidr.as_ref()).is_none() => vec![new.name_any()],
        _ => Vec::new(),
    }
}

/// What the workers share.
struct Context {
    client: kube::Client,
    nodes: Arc<Informer<Node>>,
    /// Assignments this process made, until the informer shows them (avoids handing a subnet
    /// out twice while the watch lags behind the patch).
    assigned: Mutex<BTreeMap<String, IpNet>>,
    cluster: IpNet,
    prefix: u8,
}

pub fn start(inf: &Arc<Informers>, opts: &Options) {
    let Some(cluster) = opts.cluster_cidr else {
        tracing::warn!("--allocate-node-cidrs without --cluster-cidr: node IPAM is off");
        return;
    };
    let prefix = opts.node_cidr_mask_size;
    let queue: WorkQueue<String> = WorkQueue::new();
    let nodes = inf.nodes();
    {
        let q = queue.clone();
        nodes.on_change(move |c| {
            for k in keys_for_node(c) {
                q.add(k);
            }
        });
    }
    {
        let n = nodes.clone();
        spawn_resync(queue.clone(), opts.resync, move || n.list().iter().map(|n| n.name_any()).collect());
    }
    let ctx = Arc::new(Context { client: inf.client(), nodes, assigned: Mutex::default(), cluster, prefix });
    {
        let ctx = ctx.clone();
        inf.explain().register("nodeipam", Arc::new(move |key| Box::pin(explain(ctx.clone(), key.name))));
    }
    spawn_workers("nodeipam", queue, 1, move |name: String| reconcile(ctx.clone(), name));
}

/// The pod CIDRs the nodes hold.
fn used_cidrs(nodes: &Informer<Node>) -> BTreeSet<IpNet> {
    let mut used = BTreeSet::new();
    for n in nodes.list() {
        let spec = n.spec.clone().unwrap_or_default();
        for c in spec.pod_cidrs.unwrap_or_default().into_iter().chain(spec.pod_cidr) {
            if let Ok(net) = c.parse::<IpNet>() {
                used.insert(net);
            }
        }
    }
    used
}

/// A dry run of [`reconcile`] for one node: its pod CIDR, or the one it would get.
async fn explain(ctx: Arc<Context>, name: String) -> Result<Explanation, ExplainError> {
    ctx.nodes.wait_synced().await;
    let node = ctx.nodes.get(None, &name).ok_or_else(|| ExplainError::NotFound { resource: "nodes".into(), name: name.clone() })?;
    let mut e = Explanation::new("nodeipam", Subject::of(node.as_ref()));
    let have = node.spec.as_ref().and_then(|s| s.pod_cidr.clone());
    e.observed = json!({"podCIDR": have});
    e.wants = json!({"clusterCIDR": ctx.cluster.to_string(), "nodeCIDRMaskSize": ctx.prefix});
    if have.is_some() {
        e.waiting.push("nothing to do: the node has its pod CIDR".into());
        return Ok(e);
    }
    let mut used = used_cidrs(&ctx.nodes);
    used.extend(ctx.assigned.lock().unwrap_or_else(|p| p.into_inner()).iter().filter(|(n, _)| **n != name).map(|(_, c)| *c));
    match first_free(ctx.cluster, ctx.prefix, &used) {
        Some(c) => e.actions.push(format!("set spec.podCIDR(s) to {c}")),
        None => e.waiting.push(format!("no free /{} left in the cluster CIDR {}", ctx.prefix, ctx.cluster)),
    }
    Ok(e)
}

/// One pass over a node: give it the first free subnet unless it has one.
#[tracing::instrument(name = "reconcile", skip_all, fields(controller = "nodeipam", key = %name))]
async fn reconcile(ctx: Arc<Context>, name: String) -> Result<Next, Error> {
    let Context { client, nodes, assigned, cluster, prefix } = &*ctx;
    let (cluster, prefix) = (*cluster, *prefix);
    nodes.wait_synced().await;
    let Some(node) = nodes.get(None, &name) else { return Ok(Next::Done) };
    if node.spec.as_ref().and_then(|s| s.pod_cidr.as_ref()).is_some() {
        return Ok(Next::Done);
    }
    // What is taken, from a live list rather than the cache: an assignment whose response was
    // lost, or one the cache has not shown yet, must never be handed out twice.
    let live = Api::<Node>::all(client.clone()).list(&Default::default()).await?;
    if live.items.iter().any(|n| n.name_any() == name && n.spec.as_ref().and_then(|s| s.pod_cidr.as_ref()).is_some()) {
        return Ok(Next::Done);
    }
    let mut used: BTreeSet<IpNet> = live
        .items
        .iter()
        .flat_map(|n| {
            let spec = n.spec.clone().unwrap_or_default();
            spec.pod_cidrs.unwrap_or_default().into_iter().chain(spec.pod_cidr)
        })
        .filter_map(|c| c.parse::<IpNet>().ok())
        .collect();
    let pending = {
        let mut a = assigned.lock().unwrap_or_else(|p| p.into_inner());
        // forget assignments the informer reflects now, and nodes that are gone
        a.retain(|n, _| {
            nodes.get(None, n).is_some_and(|node| node.spec.as_ref().and_then(|s| s.pod_cidr.as_ref()).is_none())
        });
        a.clone()
    };
    used.extend(pending.iter().filter(|(n, _)| **n != name).map(|(_, c)| *c));
    let Some(cidr) = first_free(cluster, prefix, &used) else {
        return Err(Error::Other(format!("no free /{prefix} left in cluster CIDR {cluster} for node {name}")));
    };
    let patch = json!({"spec": {"podCIDR": cidr.to_string(), "podCIDRs": [cidr.to_string()]}});
    match Api::<Node>::all(client.clone()).patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => {
            tracing::info!(node = name, %cidr, "assigned pod CIDR");
            assigned.lock().unwrap_or_else(|p| p.into_inner()).insert(name, cidr);
            Ok(Next::Done)
        }
        Err(e) if is_not_found(&e) => Ok(Next::Done),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn node(pod_cidr: Option<&str>) -> Arc<Node> {
        Arc::new(serde_json::from_value(json!({"metadata": {"name": "n1"}, "spec": {"podCIDR": pod_cidr}})).unwrap())
    }

    #[test]
    fn only_a_node_without_a_pod_cidr_is_a_key() {
        assert_eq!(keys_for_node(&Change::Applied { old: None, new: node(None) }), ["n1"]);
        assert!(keys_for_node(&Change::Applied { old: None, new: node(Some("10.244.0.0/24")) }).is_empty());
        assert!(keys_for_node(&Change::Deleted(node(None))).is_empty());
    }
}
