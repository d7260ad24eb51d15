//! The CSINode object and the Node's topology labels for the registered drivers, pure (upstream
//! kubelet's nodeinfomanager): one `spec.drivers` entry per driver with its node ID and topology
//! keys, owned by the Node; each topology segment a Node label.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, CSINodeSpec, VolumeNodeResources};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

/// What a driver told the agent about this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverInfo {
    pub name: String,
    pub node_id: String,
    pub topology: BTreeMap<String, String>,
    /// NodeGetInfo's max_volumes_per_node (0: no limit).
    pub max_volumes: i64,
}

fn entry(d: &DriverInfo) -> CSINodeDriver {
    CSINodeDriver {
        name: d.name.clone(),
        node_id: d.node_id.clone(),
        topology_keys: Some(d.topology.keys().cloned().collect()),
        allocatable: (d.max_volumes > 0)
            .then(|| VolumeNodeResources { count: i32::try_from(d.max_volumes).ok() }),
    }
}

/// The CSINode with `d` registered, or `None` when `existing` already says so.
pub fn with_driver(existing: Option<&CSINode>, node: &Node, d: &DriverInfo) -> Option<CSINode> {
    let mut out = existing.cloned().unwrap_or_else(|| CSINode {
        metadata: ObjectMeta {
            name: node.metadata.name.clone(),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: node.metadata.name.clone().unwrap_or_default(),
                uid: node.metadata.uid.clone().unwrap_or_default(),
                ..Default::default()
            }]),
            ..Default::default()
        },
        spec: CSINodeSpec { drivers: Vec::new() },
    });
    let want = entry(d);
    match out.spec.drivers.iter_mut().find(|e| e.name == d.name) {
        Some(e) if *e == want => return None,
        Some(e) => *e = want,
        None => out.spec.drivers.push(want),
    }
    Some(out)
}

/// The CSINode without driver `name`, or `None` when it has no such entry.
pub fn without_driver(existing: &CSINode, name: &str) -> Option<CSINode> {
    if !existing.spec.drivers.iter().any(|e| e.name == name) {
        return None;
    }
    let mut out = existing.clone();
    out.spec.drivers.retain(|e| e.name != name);
    Some(out)
}

/// Labels the Node lacks for the driver's topology (kubelet adds each segment as a label).
pub fn missing_labels(node: &Node, d: &DriverInfo) -> BTreeMap<String, String> {
    let have = node.metadata.labels.clone().unwrap_or_default();
    d.topology.iter().filter(|(k, v)| have.get(*k) != Some(*v)).map(|(k, v)| (k.clone(), v.clone())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                uid: Some("uid-1".into()),
                labels: Some(BTreeMap::from([("kubernetes.io/hostname".to_string(), "n1".to_string())])),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn driver(id: &str) -> DriverInfo {
        DriverInfo {
            name: "loop.csi.ferro.dev".into(),
            node_id: id.into(),
            topology: BTreeMap::from([("topology.loop.csi.ferro.dev/node".to_string(), id.to_string())]),
            max_volumes: 0,
        }
    }

    #[test]
    fn a_new_csinode_is_owned_by_the_node_and_lists_the_driver() {
        let c = with_driver(None, &node(), &driver("n1")).expect("created");
        assert_eq!(c.metadata.name.as_deref(), Some("n1"));
        assert_eq!(c.metadata.owner_references.as_ref().map(|o| o[0].uid.as_str()), Some("uid-1"));
        assert_eq!(c.spec.drivers.len(), 1);
        assert_eq!(c.spec.drivers[0].node_id, "n1");
        assert_eq!(c.spec.drivers[0].topology_keys, Some(vec!["topology.loop.csi.ferro.dev/node".to_string()]));
        assert_eq!(c.spec.drivers[0].allocatable, None);
    }

    #[test]
    fn registering_again_changes_nothing_and_a_new_node_id_replaces_the_entry() {
        let c = with_driver(None, &node(), &driver("n1")).expect("created");
        assert_eq!(with_driver(Some(&c), &node(), &driver("n1")), None);
        let moved = with_driver(Some(&c), &node(), &driver("n1-b")).expect("changed");
        assert_eq!(moved.spec.drivers.len(), 1);
        assert_eq!(moved.spec.drivers[0].node_id, "n1-b");
        let mut other = driver("x");
        other.name = "other.csi".into();
        other.max_volumes = 16;
        let two = with_driver(Some(&moved), &node(), &other).expect("added");
        assert_eq!(two.spec.drivers.len(), 2);
        assert_eq!(two.spec.drivers[1].allocatable.as_ref().and_then(|a| a.count), Some(16));
        let back = without_driver(&two, "other.csi").expect("removed");
        assert_eq!(back.spec.drivers.len(), 1);
        assert_eq!(without_driver(&back, "other.csi"), None);
    }

    #[test]
    fn only_missing_or_different_topology_labels_are_added() {
        assert_eq!(missing_labels(&node(), &driver("n1")).len(), 1);
        let mut labelled = node();
        labelled.metadata.labels.as_mut().expect("labels").insert("topology.loop.csi.ferro.dev/node".into(), "n1".into());
        assert!(missing_labels(&labelled, &driver("n1")).is_empty());
        assert_eq!(missing_labels(&labelled, &driver("n2")).get("topology.loop.csi.ferro.dev/node").map(String::as_str), Some("n2"));
    }
}
