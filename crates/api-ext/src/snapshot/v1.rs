//! snapshot.storage.k8s.io/v1, as the external-snapshotter's `client/apis/volumesnapshot/v1`
//! defines it (field names, optionality and meaning), plus the annotations, finalizers and
//! names its controllers use.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub const GROUP: &str = "snapshot.storage.k8s.io";
pub const VERSION: &str = "v1";
pub const API_VERSION: &str = "snapshot.storage.k8s.io/v1";

/// On a VolumeSnapshotClass: the class of its driver used when a snapshot names none.
pub const IS_DEFAULT_CLASS: &str = "snapshot.storage.kubernetes.io/is-default-class";
/// On a VolumeSnapshotContent: kept while it is bound to a snapshot (removed by the sidecar
/// once the storage is deleted, or by the common controller when the policy is Retain).
pub const CONTENT_BOUND_FINALIZER: &str = "snapshot.storage.kubernetes.io/volumesnapshotcontent-bound-protection";
/// On a VolumeSnapshot: kept while a claim is being provisioned from it.
pub const SNAPSHOT_AS_SOURCE_FINALIZER: &str = "snapshot.storage.kubernetes.io/volumesnapshot-as-source-protection";
/// On a VolumeSnapshot: kept while it is bound to a content.
pub const SNAPSHOT_BOUND_FINALIZER: &str = "snapshot.storage.kubernetes.io/volumesnapshot-bound-protection";
/// On a PersistentVolumeClaim: kept while a snapshot of it is being taken.
pub const PVC_AS_SOURCE_FINALIZER: &str = "snapshot.storage.kubernetes.io/pvc-as-source-protection";
/// On a VolumeSnapshotContent: its snapshot is being deleted (value "yes").
pub const BEING_DELETED: &str = "snapshot.storage.kubernetes.io/volumesnapshot-being-deleted";
/// On a VolumeSnapshotContent: CreateSnapshot was called and has not answered yet ("yes").
pub const BEING_CREATED: &str = "snapshot.storage.kubernetes.io/volumesnapshot-being-created";

/// Delete: the storage snapshot goes with its content object; Retain: it stays.
pub const DELETE: &str = "Delete";
pub const RETAIN: &str = "Retain";

/// The content a dynamic snapshot gets: `snapcontent-<snapshot uid>`.
pub fn content_name_for(snapshot_uid: &str) -> String {
    format!("snapcontent-{snapshot_uid}")
}

/// The name CreateSnapshot is called with (the sidecar's default prefix): `snapshot-<uid>`.
pub fn csi_snapshot_name(snapshot_uid: &str) -> String {
    format!("snapshot-{snapshot_uid}")
}

macro_rules! resource {
    ($ty:ident, $kind:expr, $list:expr, $plural:expr, $scope:ty) => {
        impl k8s_openapi::Resource for $ty {
            const API_VERSION: &'static str = API_VERSION;
            const GROUP: &'static str = GROUP;
            const KIND: &'static str = $kind;
            const VERSION: &'static str = VERSION;
            const URL_PATH_SEGMENT: &'static str = $plural;
            type Scope = $scope;
        }

        impl k8s_openapi::ListableResource for $ty {
            const LIST_KIND: &'static str = $list;
        }

        impl k8s_openapi::Metadata for $ty {
            type Ty = ObjectMeta;
            fn metadata(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn metadata_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }

        impl $ty {
            fn default_api_version() -> String {
                API_VERSION.to_string()
            }
            fn default_kind() -> String {
                $kind.to_string()
            }
        }
    };
}

/// A class of snapshots: the driver that takes them, its parameters and what happens to the
/// storage snapshot when its VolumeSnapshot goes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotClass {
    #[serde(default = "VolumeSnapshotClass::default_api_version")]
    pub api_version: String,
    #[serde(default = "VolumeSnapshotClass::default_kind")]
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The CSI driver's name.
    #[serde(default)]
    pub driver: String,
    /// Opaque to Kubernetes, passed to CreateSnapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<BTreeMap<String, String>>,
    /// Delete or Retain.
    #[serde(default)]
    pub deletion_policy: String,
}

impl Default for VolumeSnapshotClass {
    fn default() -> Self {
        VolumeSnapshotClass {
            api_version: API_VERSION.into(),
            kind: "VolumeSnapshotClass".into(),
            metadata: ObjectMeta::default(),
            driver: String::new(),
            parameters: None,
            deletion_policy: String::new(),
        }
    }
}
resource!(VolumeSnapshotClass, "VolumeSnapshotClass", "VolumeSnapshotClassList", "volumesnapshotclasses", k8s_openapi::ClusterResourceScope);

/// A user's request for a snapshot of a claim, or for the use of an existing one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshot {
    #[serde(default = "VolumeSnapshot::default_api_version")]
    pub api_version: String,
    #[serde(default = "VolumeSnapshot::default_kind")]
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: VolumeSnapshotSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<VolumeSnapshotStatus>,
}

impl Default for VolumeSnapshot {
    fn default() -> Self {
        VolumeSnapshot {
            api_version: API_VERSION.into(),
            kind: "VolumeSnapshot".into(),
            metadata: ObjectMeta::default(),
            spec: VolumeSnapshotSpec::default(),
            status: None,
        }
    }
}
resource!(VolumeSnapshot, "VolumeSnapshot", "VolumeSnapshotList", "volumesnapshots", k8s_openapi::NamespaceResourceScope);

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotSpec {
    /// Exactly one of its fields: the claim to snapshot (dynamic), or the existing content
    /// to use (pre-provisioned). Immutable.
    #[serde(default)]
    pub source: VolumeSnapshotSource,
    /// The class; unset, the default class of the claim's driver.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_snapshot_class_name: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotSource {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_volume_claim_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_snapshot_content_name: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bound_volume_snapshot_content_name: Option<String>,
    /// When the storage system took the snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_to_use: Option<bool>,
    /// The minimum size of a volume restored from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_size: Option<Quantity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<VolumeSnapshotError>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_group_snapshot_name: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotError {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// The storage side of a snapshot: taken dynamically for a VolumeSnapshot, or registered by
/// an administrator for one that exists already.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotContent {
    #[serde(default = "VolumeSnapshotContent::default_api_version")]
    pub api_version: String,
    #[serde(default = "VolumeSnapshotContent::default_kind")]
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: VolumeSnapshotContentSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<VolumeSnapshotContentStatus>,
}

impl Default for VolumeSnapshotContent {
    fn default() -> Self {
        VolumeSnapshotContent {
            api_version: API_VERSION.into(),
            kind: "VolumeSnapshotContent".into(),
            metadata: ObjectMeta::default(),
            spec: VolumeSnapshotContentSpec::default(),
            status: None,
        }
    }
}
resource!(
    VolumeSnapshotContent,
    "VolumeSnapshotContent",
    "VolumeSnapshotContentList",
    "volumesnapshotcontents",
    k8s_openapi::ClusterResourceScope
);

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotContentSpec {
    /// The VolumeSnapshot it is bound to (name and namespace; uid once bound).
    #[serde(default)]
    pub volume_snapshot_ref: ObjectReference,
    /// Delete or Retain.
    #[serde(default)]
    pub deletion_policy: String,
    #[serde(default)]
    pub driver: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_snapshot_class_name: Option<String>,
    /// Exactly one: the volume to snapshot (dynamic) or the existing snapshot's handle.
    #[serde(default)]
    pub source: VolumeSnapshotContentSource,
    /// Filesystem or Block: the mode of the volume it was taken from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_volume_mode: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotContentSource {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_handle: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_handle: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotContentStatus {
    /// The CSI snapshot id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_handle: Option<String>,
    /// Nanoseconds since the epoch, as CreateSnapshot answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_time: Option<i64>,
    /// Bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_size: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_to_use: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<VolumeSnapshotError>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_group_snapshot_handle: Option<String>,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn round_trips_with_the_upstream_field_names_and_fills_api_version_and_kind() {
        let v = json!({
            "metadata": {"name": "s1", "namespace": "default"},
            "spec": {"source": {"persistentVolumeClaimName": "data"}, "volumeSnapshotClassName": "loop"},
            "status": {"boundVolumeSnapshotContentName": "snapcontent-1", "readyToUse": true, "restoreSize": "16Mi"},
        });
        let s: VolumeSnapshot = serde_json::from_value(v).unwrap();
        assert_eq!(s.spec.source.persistent_volume_claim_name.as_deref(), Some("data"));
        let out = serde_json::to_value(&s).unwrap();
        assert_eq!(out["apiVersion"], "snapshot.storage.k8s.io/v1");
        assert_eq!(out["kind"], "VolumeSnapshot");
        assert_eq!(out["status"]["restoreSize"], "16Mi");
        assert!(out["spec"]["source"].get("volumeSnapshotContentName").is_none());

        let c: VolumeSnapshotContent = serde_json::from_value(json!({
            "metadata": {"name": "c"},
            "spec": {"volumeSnapshotRef": {"name": "s1", "namespace": "default"}, "deletionPolicy": "Delete",
                     "driver": "d", "source": {"volumeHandle": "loop-1"}},
            "status": {"snapshotHandle": "snap-1", "creationTime": 1_700_000_000_000_000_000i64, "restoreSize": 16_777_216, "readyToUse": true},
            "unknownField": 1,
        }))
        .unwrap();
        let out = serde_json::to_value(&c).unwrap();
        assert_eq!(out["kind"], "VolumeSnapshotContent");
        assert_eq!(out["status"]["restoreSize"], 16_777_216);
        assert!(out.get("unknownField").is_none(), "unknown fields are dropped, as a structural schema prunes them");

        let k = VolumeSnapshotClass { driver: "d".into(), deletion_policy: DELETE.into(), ..Default::default() };
        let out = serde_json::to_value(&k).unwrap();
        assert_eq!(out["apiVersion"], "snapshot.storage.k8s.io/v1");
        assert_eq!(out["kind"], "VolumeSnapshotClass");
        assert_eq!(out["deletionPolicy"], "Delete");
    }

    #[test]
    fn names_follow_the_external_snapshotter() {
        assert_eq!(content_name_for("u-1"), "snapcontent-u-1");
        assert_eq!(csi_snapshot_name("u-1"), "snapshot-u-1");
        assert_eq!(<VolumeSnapshotContent as k8s_openapi::Resource>::URL_PATH_SEGMENT, "volumesnapshotcontents");
    }
}
