//! Server-side printing of `snapshot.storage.k8s.io/v1`. Upstream serves these kinds from
//! CustomResourceDefinitions, so the columns are the CRDs' additionalPrinterColumns (Name, the
//! columns, Age) and the cells are what the CRD table convertor makes of them: the JSONPath's
//! value as is (null when absent, which kubectl prints as an empty cell), `date` columns as the
//! time since that date.

use super::*;

const fn crd_col(name: &'static str, type_: &'static str, description: &'static str) -> Column {
    col(name, type_, description)
}

const CRD_AGE: Column = crd_col("Age", "date", "");

pub(super) const VOLUME_SNAPSHOT_CLASS_COLUMNS: &[Column] = &[
    NAME,
    crd_col("Driver", "string", ""),
    crd_col("DeletionPolicy", "string", "Determines whether a VolumeSnapshotContent created through the VolumeSnapshotClass should be deleted when its bound VolumeSnapshot is deleted."),
    CRD_AGE,
];

pub(super) const VOLUME_SNAPSHOT_COLUMNS: &[Column] = &[
    NAME,
    crd_col("ReadyToUse", "boolean", "Indicates if the snapshot is ready to be used to restore a volume."),
    crd_col("SourcePVC", "string", "If a new snapshot needs to be created, this contains the name of the source PVC from which this snapshot was (or will be) created."),
    crd_col("SourceSnapshotContent", "string", "If a snapshot already exists, this contains the name of the existing VolumeSnapshotContent object representing the existing snapshot."),
    crd_col("RestoreSize", "string", "Represents the minimum size of volume required to rehydrate from this snapshot."),
    crd_col("SnapshotClass", "string", "The name of the VolumeSnapshotClass requested by the VolumeSnapshot."),
    crd_col("SnapshotContent", "string", "Name of the VolumeSnapshotContent object to which the VolumeSnapshot object intends to bind to. Please note that verification of binding actually requires checking both VolumeSnapshot and VolumeSnapshotContent to ensure both are pointing at each other. Binding MUST be verified prior to usage of this object."),
    crd_col("CreationTime", "date", "Timestamp when the point-in-time snapshot was taken by the underlying storage system."),
    CRD_AGE,
];

pub(super) const VOLUME_SNAPSHOT_CONTENT_COLUMNS: &[Column] = &[
    NAME,
    crd_col("ReadyToUse", "boolean", "Indicates if a snapshot is ready to be used to restore a volume."),
    crd_col("RestoreSize", "integer", "Represents the complete size of the snapshot in bytes"),
    crd_col("DeletionPolicy", "string", "Determines whether this VolumeSnapshotContent and its physical snapshot on the underlying storage system should be deleted when its bound VolumeSnapshot is deleted."),
    crd_col("Driver", "string", "Name of the CSI driver used to create the physical snapshot on the underlying storage system."),
    crd_col("VolumeSnapshotClass", "string", "Name of the VolumeSnapshotClass to which this snapshot belongs."),
    crd_col("VolumeSnapshot", "string", "Name of the VolumeSnapshot object to which this VolumeSnapshotContent object is bound."),
    crd_col("VolumeSnapshotNamespace", "string", "Namespace of the VolumeSnapshot object to which this VolumeSnapshotContent object is bound."),
    CRD_AGE,
];

/// The value at `path`, null when absent (an empty cell).
fn raw(obj: &Value, path: &[&str]) -> Value {
    at(obj, path).cloned().unwrap_or(Value::Null)
}

/// A `date` column: the time since, null when absent.
fn since(obj: &Value, path: &[&str], now: Timestamp) -> Value {
    match at(obj, path) {
        Some(v) => Value::String(translate_timestamp_since(Some(v), now)),
        None => Value::Null,
    }
}

pub(super) fn volume_snapshot_class_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    vec![name(obj), raw(obj, &["driver"]), raw(obj, &["deletionPolicy"]), since(obj, &["metadata", "creationTimestamp"], now)]
}

pub(super) fn volume_snapshot_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    vec![
        name(obj),
        raw(obj, &["status", "readyToUse"]),
        raw(obj, &["spec", "source", "persistentVolumeClaimName"]),
        raw(obj, &["spec", "source", "volumeSnapshotContentName"]),
        raw(obj, &["status", "restoreSize"]),
        raw(obj, &["spec", "volumeSnapshotClassName"]),
        raw(obj, &["status", "boundVolumeSnapshotContentName"]),
        since(obj, &["status", "creationTime"], now),
        since(obj, &["metadata", "creationTimestamp"], now),
    ]
}

pub(super) fn volume_snapshot_content_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    vec![
        name(obj),
        raw(obj, &["status", "readyToUse"]),
        raw(obj, &["status", "restoreSize"]),
        raw(obj, &["spec", "deletionPolicy"]),
        raw(obj, &["spec", "driver"]),
        raw(obj, &["spec", "volumeSnapshotClassName"]),
        raw(obj, &["spec", "volumeSnapshotRef", "name"]),
        raw(obj, &["spec", "volumeSnapshotRef", "namespace"]),
        since(obj, &["metadata", "creationTimestamp"], now),
    ]
}
