//! Node IPAM (upstream's range allocator, `--allocate-node-cidrs`): each Node without a
//! podCIDR gets the first free subnet of `--node-cidr-mask-size` from `--cluster-cidr`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use ferro_runtime::{spawn_resync, spawn_workers, Change, Next, WorkQueue};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt as _};
use serde_json::json;

use crate::controllers::manager::{Informers, Options};
use crate::controllers::{is_not_found, Error};

/// The first subnet of `prefix` bits inside `cluster` that is not in `used`.
pub fn first_free(cluster: IpNet, prefix: u8, used: &BTreeSet<IpNet>) -> Option<IpNet> {
    let subnets = cluster.subnets(prefix).ok()?;
    // bounded: a /8 split into /24s is 65,536 candidates, checked against a set
    subnets.take(1 << 20).find(|s| !used.iter().any(|u| u.contains(&s.network()) || s.contains(&u.network())))
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
            if let Change::Applied { new, .. } = c {
                if new.spec.as_ref().and_then(|s| s.pod_cidr.as_ref()).is_none() {
                    q.add(new.name_any());
                }
            }
        });
    }
    {
        let n = nodes.clone();
        spawn_resync(queue.clone(), opts.resync, move || n.list().iter().map(|n| n.name_any()).collect());
    }
    // Assignments this process made, until the informer shows them (avoids handing a subnet
    // out twice while the watch lags behind the patch).
    let assigned: Arc<Mutex<BTreeMap<String, IpNet>>> = Arc::default();
    let client = inf.client();
    spawn_workers("nodeipam", queue, 1, move |name: String| {
        let (client, nodes, assigned) = (client.clone(), nodes.clone(), assigned.clone());
        async move {
            nodes.wait_synced().await;
            let Some(node) = nodes.get(None, &name) else { return Ok(Next::Done) };
            if node.spec.as_ref().and_then(|s| s.pod_cidr.as_ref()).is_some() {
                return Ok(Next::Done);
            }
            let mut used: BTreeSet<IpNet> = BTreeSet::new();
            for n in nodes.list() {
                let spec = n.spec.clone().unwrap_or_default();
                for c in spec.pod_cidrs.unwrap_or_default().into_iter().chain(spec.pod_cidr) {
                    if let Ok(net) = c.parse::<IpNet>() {
                        used.insert(net);
                    }
                }
            }
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
            match Api::<Node>::all(client).patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                Ok(_) => {
                    tracing::info!(node = name, %cidr, "assigned pod CIDR");
                    assigned.lock().unwrap_or_else(|p| p.into_inner()).insert(name, cidr);
                    Ok(Next::Done)
                }
                Err(e) if is_not_found(&e) => Ok(Next::Done),
                Err(e) => Err(e.into()),
            }
        }
    });
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn hands_out_the_first_free_subnet() {
        let cluster: IpNet = "10.244.0.0/16".parse().unwrap();
        let mut used = BTreeSet::new();
        assert_eq!(first_free(cluster, 24, &used).unwrap().to_string(), "10.244.0.0/24");
        used.insert("10.244.0.0/24".parse().unwrap());
        used.insert("10.244.2.0/24".parse().unwrap());
        assert_eq!(first_free(cluster, 24, &used).unwrap().to_string(), "10.244.1.0/24");
        // a larger subnet in use blocks the ones it covers
        used.insert("10.244.0.0/22".parse().unwrap());
        assert_eq!(first_free(cluster, 24, &used).unwrap().to_string(), "10.244.4.0/24");
        let small: IpNet = "10.0.0.0/23".parse().unwrap();
        let full: BTreeSet<IpNet> = ["10.0.0.0/24", "10.0.1.0/24"].iter().map(|s| s.parse().unwrap()).collect();
        assert!(first_free(small, 24, &full).is_none());
    }
}
