//! The CSI snapshotter's decisions (the external-snapshotter's csi-snapshotter sidecar), pure.
//! Snapshots are node-local like volumes: the node that holds a content's source volume (or,
//! for a pre-provisioned content, its snapshot) takes it over by writing its name in the
//! [`ANN_SNAPSHOT_NODE`] annotation (an update guarded by resourceVersion), and from then on
//! that node alone takes, checks and deletes the storage snapshot.

use std::collections::BTreeMap;

use api_ext::snapshot::v1::{self as snap, VolumeSnapshot, VolumeSnapshotContent};

use crate::volume::names::DRIVER_NAME;

/// On a VolumeSnapshotContent of this driver: the node holding its storage snapshot.
pub const ANN_SNAPSHOT_NODE: &str = "loop.csi.ferro.dev/node";

/// What to do about one content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ContentDecision {
    /// Not this node's (another driver, another node, nothing to do).
    Ignore,
    /// This node holds the source: take the content over.
    Take,
    /// CreateSnapshot `name` of `source_volume`, then write the content's status.
    Create { name: String, source_volume: String },
    /// Pre-provisioned: look the snapshot up and write the content's status.
    Check { snapshot_id: String },
    /// The request cannot be honoured as it stands: the content's status error.
    Fail(String),
    /// Delete the storage snapshot (when there is one), then release the content.
    Delete { snapshot_id: Option<String> },
    /// Policy Retain: release the content, keep the storage.
    Release,
}

fn annotation<'a>(c: &'a VolumeSnapshotContent, key: &str) -> Option<&'a str> {
    c.metadata.annotations.as_ref().and_then(|a| a.get(key)).map(String::as_str)
}

fn has_finalizer(c: &VolumeSnapshotContent) -> bool {
    c.metadata.finalizers.as_ref().is_some_and(|l| l.iter().any(|f| f == snap::CONTENT_BOUND_FINALIZER))
}

/// Decides about one content. `holds_volume` / `holds_snapshot` say whether this node's data
/// dir has the content's source volume / snapshot; `class_parameters` are its class's.
pub fn decide_content(
    c: &VolumeSnapshotContent,
    node: &str,
    holds_volume: bool,
    holds_snapshot: bool,
    class_parameters: Option<&BTreeMap<String, String>>,
) -> ContentDecision {
    if c.spec.driver != DRIVER_NAME {
        return ContentDecision::Ignore;
    }
    let source = &c.spec.source;
    match annotation(c, ANN_SNAPSHOT_NODE) {
        Some(owner) if owner != node => return ContentDecision::Ignore,
        Some(_) => {}
        None => {
            let holds = match (source.volume_handle.as_deref(), source.snapshot_handle.as_deref()) {
                (Some(_), None) => holds_volume,
                (None, Some(_)) => holds_snapshot,
                _ => false,
            };
            return if holds { ContentDecision::Take } else { ContentDecision::Ignore };
        }
    }
    let handle = c.status.as_ref().and_then(|s| s.snapshot_handle.clone());
    if c.metadata.deletion_timestamp.is_some() {
        // Upstream's shouldDelete: the snapshot is being deleted, or a pre-provisioned content
        // that was never bound.
        let unbound = c.spec.volume_snapshot_ref.uid.as_deref().is_none_or(str::is_empty);
        let should = annotation(c, snap::BEING_DELETED).is_some() || (source.snapshot_handle.is_some() && unbound);
        if !should || !has_finalizer(c) {
            return ContentDecision::Ignore;
        }
        return if c.spec.deletion_policy == snap::DELETE {
            ContentDecision::Delete { snapshot_id: handle.or_else(|| source.snapshot_handle.clone()) }
        } else {
            ContentDecision::Release
        };
    }
    if handle.is_some() && c.status.as_ref().and_then(|s| s.ready_to_use) == Some(true) {
        return ContentDecision::Ignore;
    }
    match (source.volume_handle.as_deref(), source.snapshot_handle.as_deref()) {
        (Some(volume), None) => {
            let Some(uid) = c.spec.volume_snapshot_ref.uid.as_deref().filter(|u| !u.is_empty()) else {
                return ContentDecision::Ignore;
            };
            // csi.storage.k8s.io/ keys are the sidecar's (secrets), not the driver's.
            let unknown: Vec<&String> =
                class_parameters.into_iter().flatten().map(|(k, _)| k).filter(|k| !k.starts_with("csi.storage.k8s.io/")).collect();
            if !unknown.is_empty() {
                let message = format!("unknown snapshot parameters {unknown:?} ({DRIVER_NAME} takes none)");
                let already = c.status.as_ref().and_then(|s| s.error.as_ref()).and_then(|e| e.message.as_deref()) == Some(message.as_str());
                return if already { ContentDecision::Ignore } else { ContentDecision::Fail(message) };
            }
            ContentDecision::Create { name: snap::csi_snapshot_name(uid), source_volume: volume.to_string() }
        }
        (None, Some(id)) => ContentDecision::Check { snapshot_id: id.to_string() },
        _ => ContentDecision::Ignore,
    }
}

/// A claim's snapshot source as the provisioner needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotSource {
    pub snapshot_id: String,
    pub restore_size: i64,
}

/// Resolves a claim's VolumeSnapshot data source: ready, bound to a content of this driver
/// whose storage is on this node. The error says what is missing.
pub fn snapshot_source(
    name: &str,
    snapshot: Option<&VolumeSnapshot>,
    content: Option<&VolumeSnapshotContent>,
    node: &str,
) -> Result<SnapshotSource, String> {
    let Some(s) = snapshot else {
        return Err(format!("data source VolumeSnapshot {name:?} not found"));
    };
    let status = s.status.as_ref();
    if status.and_then(|st| st.ready_to_use) != Some(true) {
        return Err(format!("data source VolumeSnapshot {name:?} is not ready to use yet"));
    }
    let Some(c) = content.filter(|c| Some(c.metadata.name.as_deref()) == status.map(|st| st.bound_volume_snapshot_content_name.as_deref()))
    else {
        return Err(format!("the VolumeSnapshotContent of VolumeSnapshot {name:?} was not found"));
    };
    if c.spec.driver != DRIVER_NAME {
        return Err(format!("VolumeSnapshot {name:?} was taken by driver {:?}, not {DRIVER_NAME}", c.spec.driver));
    }
    match annotation(c, ANN_SNAPSHOT_NODE) {
        Some(owner) if owner == node => {}
        Some(owner) => {
            return Err(format!(
                "VolumeSnapshot {name:?} is stored on node {owner:?}: a volume restored from it can only be made there"
            ))
        }
        None => return Err(format!("VolumeSnapshot {name:?} has no node holding its storage yet")),
    }
    let cs = c.status.as_ref();
    let Some(snapshot_id) = cs.and_then(|s| s.snapshot_handle.clone()) else {
        return Err(format!("VolumeSnapshot {name:?} has no snapshot handle yet"));
    };
    Ok(SnapshotSource { snapshot_id, restore_size: cs.and_then(|s| s.restore_size).unwrap_or(0) })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn content(extra: serde_json::Value) -> VolumeSnapshotContent {
        let mut v = json!({
            "metadata": {"name": "snapcontent-u1", "finalizers": [snap::CONTENT_BOUND_FINALIZER]},
            "spec": {"volumeSnapshotRef": {"name": "s1", "namespace": "team", "uid": "u1"}, "deletionPolicy": "Delete",
                     "driver": DRIVER_NAME, "source": {"volumeHandle": "loop-abc"}},
        });
        merge(&mut v, extra);
        serde_json::from_value(v).unwrap()
    }

    fn merge(a: &mut serde_json::Value, b: serde_json::Value) {
        match (a, b) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, v) in b {
                    merge(a.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (a, b) => *a = b,
        }
    }

    fn owned(extra: serde_json::Value) -> VolumeSnapshotContent {
        let mut c = content(extra);
        c.metadata.annotations.get_or_insert_with(Default::default).insert(ANN_SNAPSHOT_NODE.into(), "n1".into());
        c
    }

    #[test]
    fn the_node_holding_the_volume_takes_the_content_over_and_then_takes_the_snapshot() {
        let c = content(json!({}));
        assert_eq!(decide_content(&c, "n1", true, false, None), ContentDecision::Take);
        assert_eq!(decide_content(&c, "n2", false, false, None), ContentDecision::Ignore);
        let c = owned(json!({}));
        assert_eq!(decide_content(&c, "n2", true, false, None), ContentDecision::Ignore, "another node's");
        assert_eq!(
            decide_content(&c, "n1", true, false, None),
            ContentDecision::Create { name: "snapshot-u1".into(), source_volume: "loop-abc".into() }
        );
        let done = owned(json!({"status": {"snapshotHandle": "snap-1", "readyToUse": true}}));
        assert_eq!(decide_content(&done, "n1", true, true, None), ContentDecision::Ignore);
        let mut other = owned(json!({}));
        other.spec.driver = "other.driver".into();
        assert_eq!(decide_content(&other, "n1", true, true, None), ContentDecision::Ignore);
    }

    #[test]
    fn class_parameters_the_driver_does_not_take_fail_once() {
        let params: BTreeMap<String, String> =
            [("speed".to_string(), "fast".to_string()), ("csi.storage.k8s.io/snapshotter-secret-name".to_string(), "s".to_string())].into();
        let c = owned(json!({}));
        let d = decide_content(&c, "n1", true, false, Some(&params));
        assert_eq!(d, ContentDecision::Fail(format!("unknown snapshot parameters [\"speed\"] ({DRIVER_NAME} takes none)")));
        let ContentDecision::Fail(msg) = d else { unreachable!() };
        let failed = owned(json!({"status": {"readyToUse": false, "error": {"message": msg}}}));
        assert_eq!(decide_content(&failed, "n1", true, false, Some(&params)), ContentDecision::Ignore);
        let secrets_only: BTreeMap<String, String> = [("csi.storage.k8s.io/snapshotter-secret-name".to_string(), "s".to_string())].into();
        assert!(matches!(decide_content(&c, "n1", true, false, Some(&secrets_only)), ContentDecision::Create { .. }));
    }

    #[test]
    fn deletion_follows_the_policy_and_only_once_the_snapshot_is_being_deleted() {
        let deleting = |policy: &str, annotated: bool| {
            let mut c = owned(json!({"metadata": {"deletionTimestamp": "2026-11-26T12:00:00Z"}, "spec": {"deletionPolicy": policy},
                                     "status": {"snapshotHandle": "snap-1", "readyToUse": true}}));
            if annotated {
                c.metadata.annotations.as_mut().unwrap().insert(snap::BEING_DELETED.into(), "yes".into());
            }
            c
        };
        assert_eq!(decide_content(&deleting("Delete", true), "n1", true, true, None), ContentDecision::Delete { snapshot_id: Some("snap-1".into()) });
        assert_eq!(decide_content(&deleting("Retain", true), "n1", true, true, None), ContentDecision::Release);
        assert_eq!(decide_content(&deleting("Delete", false), "n1", true, true, None), ContentDecision::Ignore, "its snapshot still uses it");
        let mut released = deleting("Delete", true);
        released.metadata.finalizers = None;
        assert_eq!(decide_content(&released, "n1", true, true, None), ContentDecision::Ignore);
    }

    #[test]
    fn a_pre_provisioned_content_is_taken_by_the_node_holding_the_snapshot_and_checked() {
        let mut c = content(json!({"spec": {"source": {"volumeHandle": null, "snapshotHandle": "snap-9"}}}));
        assert_eq!(decide_content(&c, "n1", false, true, None), ContentDecision::Take);
        assert_eq!(decide_content(&c, "n1", true, false, None), ContentDecision::Ignore);
        c.metadata.annotations = Some([(ANN_SNAPSHOT_NODE.to_string(), "n1".to_string())].into());
        assert_eq!(decide_content(&c, "n1", false, true, None), ContentDecision::Check { snapshot_id: "snap-9".into() });
        // Deleted while never bound: the storage goes (policy Delete).
        c.spec.volume_snapshot_ref.uid = None;
        c.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH));
        assert_eq!(decide_content(&c, "n1", false, true, None), ContentDecision::Delete { snapshot_id: Some("snap-9".into()) });
    }

    #[test]
    fn a_restore_needs_a_ready_snapshot_stored_on_this_node() {
        let snapshot: VolumeSnapshot = serde_json::from_value(json!({
            "metadata": {"name": "s1", "namespace": "team"},
            "spec": {"source": {"persistentVolumeClaimName": "data"}},
            "status": {"boundVolumeSnapshotContentName": "snapcontent-u1", "readyToUse": true},
        }))
        .unwrap();
        let c = owned(json!({"status": {"snapshotHandle": "snap-1", "restoreSize": 4096, "readyToUse": true}}));
        assert_eq!(
            snapshot_source("s1", Some(&snapshot), Some(&c), "n1"),
            Ok(SnapshotSource { snapshot_id: "snap-1".into(), restore_size: 4096 })
        );
        assert!(snapshot_source("s1", None, None, "n1").unwrap_err().contains("not found"));
        assert!(snapshot_source("s1", Some(&snapshot), Some(&c), "n2").unwrap_err().contains("is stored on node \"n1\""));
        let mut not_ready = snapshot.clone();
        not_ready.status.as_mut().unwrap().ready_to_use = Some(false);
        assert!(snapshot_source("s1", Some(&not_ready), Some(&c), "n1").unwrap_err().contains("not ready"));
        assert!(snapshot_source("s1", Some(&snapshot), None, "n1").unwrap_err().contains("VolumeSnapshotContent"));
    }
}
