//! Storage capacity tracking, as upstream's external-provisioner does it in distributed mode
//! (`--enable-capacity --node-deployment`): every node's ferro-csi publishes, for each
//! StorageClass of the driver, one CSIStorageCapacity object saying how much this node can
//! still provision, with the node's topology segment; the scheduler reads them (CSIDriver
//! `storageCapacity: true`) to place pods whose WaitForFirstConsumer claims must be
//! provisioned. [`desired`] and [`ops`] are pure; [`sync`] applies them.

use std::collections::BTreeMap;

use k8s_openapi::api::storage::v1::{CSIStorageCapacity, StorageClass};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, ResourceExt};

use crate::volume::names::{DRIVER_NAME, TOPOLOGY_KEY};

/// Upstream's labels on the objects a provisioner manages.
pub const LABEL_DRIVER: &str = "csi.storage.k8s.io/drivername";
pub const LABEL_MANAGED_BY: &str = "csi.storage.k8s.io/managed-by";

/// FNV-1a 64 (for short, stable names).
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

/// The managed-by label value of this node's objects (`external-provisioner-<node>` upstream;
/// a label value has at most 63 characters, so a long node name is hashed).
pub fn managed_by(node: &str) -> String {
    let v = format!("ferro-csi-{node}");
    if v.len() <= 63 {
        v
    } else {
        format!("ferro-csi-{:016x}", fnv(node.as_bytes()))
    }
}

/// The object's name: stable per (node, class), so that a restart finds its objects.
pub fn name(node: &str, class: &str) -> String {
    format!("csisc-{:016x}", fnv(format!("{node}\0{class}").as_bytes()))
}

/// This node's objects for the driver's classes, `available` bytes each (the driver's
/// GetCapacity does not depend on the class: thin and thick volumes come from one pool).
pub fn desired(node: &str, namespace: &str, classes: &[StorageClass], available: u64) -> Vec<CSIStorageCapacity> {
    let quantity = Quantity(k8s_semantics::quantity::binary_si(i64::try_from(available).unwrap_or(i64::MAX)));
    let mut out: Vec<CSIStorageCapacity> = classes
        .iter()
        .filter(|c| c.provisioner == DRIVER_NAME)
        .map(|c| {
            let class = c.name_any();
            CSIStorageCapacity {
                metadata: ObjectMeta {
                    name: Some(name(node, &class)),
                    namespace: Some(namespace.to_string()),
                    labels: Some(BTreeMap::from([
                        (LABEL_DRIVER.to_string(), DRIVER_NAME.to_string()),
                        (LABEL_MANAGED_BY.to_string(), managed_by(node)),
                    ])),
                    ..Default::default()
                },
                node_topology: Some(LabelSelector {
                    match_labels: Some(BTreeMap::from([(TOPOLOGY_KEY.to_string(), node.to_string())])),
                    ..Default::default()
                }),
                storage_class_name: class,
                capacity: Some(quantity.clone()),
                maximum_volume_size: Some(quantity.clone()),
            }
        })
        .collect();
    out.sort_by_key(|c| c.metadata.name.clone());
    out
}

/// One change to the published objects.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    Create(CSIStorageCapacity),
    /// Replace the existing object (its resourceVersion carried over).
    Update(CSIStorageCapacity),
    Delete(String),
}

fn same(a: &CSIStorageCapacity, b: &CSIStorageCapacity) -> bool {
    let q = |x: &Option<Quantity>| x.as_ref().map(|q| q.0.clone());
    a.storage_class_name == b.storage_class_name
        && q(&a.capacity) == q(&b.capacity)
        && q(&a.maximum_volume_size) == q(&b.maximum_volume_size)
        && a.node_topology == b.node_topology
        && a.metadata.labels == b.metadata.labels
}

/// What turns `existing` (this node's objects as listed) into `want`.
pub fn ops(want: &[CSIStorageCapacity], existing: &[CSIStorageCapacity]) -> Vec<Op> {
    let by_name: BTreeMap<String, &CSIStorageCapacity> = existing.iter().map(|c| (c.name_any(), c)).collect();
    let mut out = Vec::new();
    for w in want {
        match by_name.get(&w.name_any()) {
            None => out.push(Op::Create(w.clone())),
            Some(e) if !same(w, e) => {
                let mut u = w.clone();
                u.metadata.resource_version = e.metadata.resource_version.clone();
                out.push(Op::Update(u));
            }
            Some(_) => {}
        }
    }
    for name in by_name.keys() {
        if !want.iter().any(|w| w.name_any() == *name) {
            out.push(Op::Delete(name.clone()));
        }
    }
    out
}

/// Publishes this node's objects: lists what it published before (by label), applies [`ops`].
/// Returns how many changes it made.
pub async fn sync(
    client: &kube::Client,
    node: &str,
    namespace: &str,
    classes: &[StorageClass],
    available: u64,
) -> Result<usize, kube::Error> {
    let api: Api<CSIStorageCapacity> = Api::namespaced(client.clone(), namespace);
    let selector = format!("{LABEL_DRIVER}={DRIVER_NAME},{LABEL_MANAGED_BY}={}", managed_by(node));
    let existing = api.list(&ListParams::default().labels(&selector)).await?.items;
    let todo = ops(&desired(node, namespace, classes, available), &existing);
    for op in &todo {
        match op {
            Op::Create(c) => {
                api.create(&PostParams::default(), c).await?;
            }
            Op::Update(c) => {
                api.replace(&c.name_any(), &PostParams::default(), c).await?;
            }
            Op::Delete(n) => match api.delete(n, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e),
            },
        }
    }
    Ok(todo.len())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn class(name: &str, provisioner: &str) -> StorageClass {
        StorageClass {
            metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
            provisioner: provisioner.into(),
            ..Default::default()
        }
    }

    #[test]
    fn one_object_per_class_of_the_driver_with_the_node_topology() {
        let classes = [class("loop", DRIVER_NAME), class("fast", DRIVER_NAME), class("nfs", "nfs.csi.k8s.io")];
        let d = desired("node-a", "kube-system", &classes, 3 << 30);
        assert_eq!(d.len(), 2, "other drivers' classes are not ours");
        let c = d.iter().find(|c| c.storage_class_name == "loop").unwrap();
        assert_eq!(c.capacity.as_ref().unwrap().0, "3Gi");
        assert_eq!(c.maximum_volume_size.as_ref().unwrap().0, "3Gi");
        assert_eq!(c.metadata.namespace.as_deref(), Some("kube-system"));
        assert_eq!(
            c.node_topology.as_ref().unwrap().match_labels.as_ref().unwrap()[TOPOLOGY_KEY],
            "node-a"
        );
        assert_eq!(c.metadata.labels.as_ref().unwrap()[LABEL_MANAGED_BY], "ferro-csi-node-a");
        // Stable, distinct names per (node, class); DNS-1123 and short.
        assert_eq!(c.metadata.name, Some(name("node-a", "loop")));
        assert_ne!(name("node-a", "loop"), name("node-b", "loop"));
        assert_ne!(name("node-a", "loop"), name("node-a", "fast"));
        assert!(name("node-a", "loop").len() < 64);
        assert!(managed_by(&"n".repeat(100)).len() <= 63);
    }

    #[test]
    fn ops_create_update_and_delete_only_what_differs() {
        let classes = [class("loop", DRIVER_NAME), class("fast", DRIVER_NAME)];
        let want = desired("n", "kube-system", &classes, 1 << 30);
        assert!(matches!(ops(&want, &[]).as_slice(), [Op::Create(_), Op::Create(_)]));
        let mut existing = want.clone();
        for e in &mut existing {
            e.metadata.resource_version = Some("7".into());
        }
        assert!(ops(&want, &existing).is_empty(), "nothing changed, nothing written");
        // Less available: both updated, resourceVersion carried over.
        let less = desired("n", "kube-system", &classes, 512 << 20);
        let o = ops(&less, &existing);
        assert_eq!(o.len(), 2);
        assert!(o.iter().all(|op| matches!(op, Op::Update(c) if c.metadata.resource_version.as_deref() == Some("7") && c.capacity.as_ref().unwrap().0 == "512Mi")));
        // A class gone: its object deleted.
        let one = desired("n", "kube-system", &classes[..1], 1 << 30);
        assert_eq!(ops(&one, &existing), vec![Op::Delete(name("n", "fast"))]);
    }
}
