//! The common snapshot controller's decisions (the external-snapshotter's snapshot-controller),
//! pure: from a VolumeSnapshot and what it refers to, the operations that bring it and its
//! VolumeSnapshotContent to where they should be.
//!
//! - Dynamic (`spec.source.persistentVolumeClaimName`): the claim must be bound to a CSI
//!   volume; the class is the snapshot's or the default class of the volume's driver (written
//!   back into the spec); the content `snapcontent-<uid>` is created pointing at the volume
//!   (the driver's sidecar, in ferro the CSI driver itself, takes the snapshot and fills the
//!   content's status); the claim carries `pvc-as-source-protection` until the snapshot is
//!   ready or fails.
//! - Pre-provisioned (`spec.source.volumeSnapshotContentName`): the content must name this
//!   snapshot; binding writes the snapshot's uid into it.
//! - Either way the snapshot's status follows its content's, with upstream's events
//!   (CreatingSnapshot, SnapshotCreated, SnapshotReady), finalizers as upstream (on the
//!   snapshot while it is bound or may be a restore's source, on the content while bound).
//! - Deletion: refused (finalizer kept) while a claim is being provisioned from the snapshot;
//!   otherwise the content is marked `volumesnapshot-being-deleted` and, with policy Delete,
//!   deleted (the sidecar deletes the storage and lets it go), then the finalizers go.

use api_ext::snapshot::v1::{
    self as snap, VolumeSnapshot, VolumeSnapshotClass, VolumeSnapshotContent, VolumeSnapshotContentSource,
    VolumeSnapshotContentSpec, VolumeSnapshotError, VolumeSnapshotStatus,
};
use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

/// One change to make, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// Add these finalizers to the snapshot.
    AddFinalizers(Vec<&'static str>),
    /// Remove these finalizers from the snapshot.
    RemoveFinalizers(Vec<&'static str>),
    /// Write the class chosen by default into `spec.volumeSnapshotClassName`.
    SetClass(String),
    CreateContent(Box<VolumeSnapshotContent>),
    /// Pre-provisioned: write the snapshot's uid into the content's `volumeSnapshotRef`.
    BindContent { content: String, uid: String },
    AddContentFinalizer(String),
    AnnotateContentBeingDeleted(String),
    DeleteContent(String),
    /// Add (true) or remove the `pvc-as-source-protection` finalizer of the source claim.
    ClaimFinalizer { claim: String, add: bool },
    Status(VolumeSnapshotStatus),
    Event { warning: bool, reason: &'static str, message: String },
}

/// What the planner sees of one VolumeSnapshot's world.
pub struct Inputs<'a> {
    pub snapshot: &'a VolumeSnapshot,
    /// The content it is (or will be) bound to: the pre-provisioned one it names, or
    /// `snapcontent-<uid>` for a dynamic one.
    pub content: Option<&'a VolumeSnapshotContent>,
    pub classes: &'a [&'a VolumeSnapshotClass],
    /// Dynamic: the source claim, and the volume it is bound to.
    pub claim: Option<&'a PersistentVolumeClaim>,
    pub volume: Option<&'a PersistentVolume>,
    /// A claim is being provisioned from this snapshot (not bound yet).
    pub restoring: bool,
    /// Another live snapshot of the same claim is still being taken (its claim finalizer
    /// stays).
    pub claim_busy_elsewhere: bool,
    /// Now, for status times.
    pub now: Time,
}

fn has_finalizer(meta: &ObjectMeta, f: &str) -> bool {
    meta.finalizers.as_ref().is_some_and(|l| l.iter().any(|x| x == f))
}

fn annotated(meta: &ObjectMeta, key: &str) -> bool {
    meta.annotations.as_ref().is_some_and(|a| a.contains_key(key))
}

fn key_of(s: &VolumeSnapshot) -> String {
    format!("{}/{}", s.metadata.namespace.as_deref().unwrap_or_default(), s.metadata.name.as_deref().unwrap_or_default())
}

/// Whether the content's `volumeSnapshotRef` names this snapshot (namespace and name, and the
/// uid once one is written).
pub fn content_points_to(c: &VolumeSnapshotContent, s: &VolumeSnapshot) -> bool {
    let r = &c.spec.volume_snapshot_ref;
    r.name == s.metadata.name
        && r.namespace == s.metadata.namespace
        && r.uid.as_deref().is_none_or(|u| u.is_empty() || Some(u) == s.metadata.uid.as_deref())
}

/// Chooses the class: the named one, or the single default one of `driver`.
pub fn choose_class<'a>(
    named: Option<&str>,
    driver: &str,
    classes: &[&'a VolumeSnapshotClass],
) -> Result<&'a VolumeSnapshotClass, String> {
    if let Some(name) = named {
        return classes
            .iter()
            .copied()
            .find(|c| c.metadata.name.as_deref() == Some(name))
            .ok_or_else(|| format!("failed to retrieve snapshot class {name:?}: volumesnapshotclass.snapshot.storage.k8s.io {name:?} not found"));
    }
    let defaults: Vec<&VolumeSnapshotClass> = classes
        .iter()
        .copied()
        .filter(|c| c.driver == driver)
        .filter(|c| c.metadata.annotations.as_ref().and_then(|a| a.get(snap::IS_DEFAULT_CLASS)).map(String::as_str) == Some("true"))
        .collect();
    match defaults.as_slice() {
        [one] => Ok(one),
        [] => Err(format!("cannot find default snapshot class for driver {driver:?}")),
        many => Err(format!("{} default snapshot classes exist for driver {driver:?}", many.len())),
    }
}

/// The snapshot's status as its content says it should be.
pub fn status_from_content(c: &VolumeSnapshotContent, previous: Option<&VolumeSnapshotStatus>) -> VolumeSnapshotStatus {
    let cs = c.status.as_ref();
    let creation_time = cs
        .and_then(|s| s.creation_time)
        .and_then(|ns| jiff::Timestamp::from_nanosecond(i128::from(ns)).ok())
        // metav1.Time has second precision on the wire.
        .and_then(|t| jiff::Timestamp::from_second(t.as_second()).ok())
        .map(Time);
    VolumeSnapshotStatus {
        bound_volume_snapshot_content_name: c.metadata.name.clone(),
        creation_time,
        ready_to_use: Some(cs.and_then(|s| s.ready_to_use).unwrap_or(false)),
        restore_size: cs
            .and_then(|s| s.restore_size)
            .map(|b| Quantity(k8s_semantics::quantity::binary_si(b))),
        error: cs.and_then(|s| s.error.clone()).or_else(|| {
            // An error the controller wrote itself stays until the content says otherwise.
            previous.and_then(|p| p.error.clone()).filter(|_| cs.is_none_or(|s| s.snapshot_handle.is_none()))
        }),
        volume_group_snapshot_name: previous.and_then(|p| p.volume_group_snapshot_name.clone()),
    }
}

fn error_status(previous: Option<&VolumeSnapshotStatus>, message: &str, now: &Time) -> VolumeSnapshotStatus {
    let mut st = previous.cloned().unwrap_or_default();
    if st.error.as_ref().and_then(|e| e.message.as_deref()) != Some(message) {
        st.error = Some(VolumeSnapshotError { time: Some(now.clone()), message: Some(message.to_string()) });
    }
    if st.ready_to_use.is_none() {
        st.ready_to_use = Some(false);
    }
    st
}

/// A failure the snapshot records in its status, with a Warning event.
fn fail(ops: &mut Vec<Op>, s: &VolumeSnapshot, reason: &'static str, message: String, now: &Time) {
    let st = error_status(s.status.as_ref(), &message, now);
    if s.status.as_ref() != Some(&st) {
        ops.push(Op::Status(st));
        ops.push(Op::Event { warning: true, reason, message });
    }
}

/// Decides about one VolumeSnapshot.
pub fn plan(i: &Inputs<'_>) -> Vec<Op> {
    let s = i.snapshot;
    let mut ops = Vec::new();
    let Some(uid) = s.metadata.uid.clone() else { return ops };
    let key = key_of(s);
    let content = i.content.filter(|c| content_points_to(c, s));

    if s.metadata.deletion_timestamp.is_some() {
        if i.restoring {
            // Upstream keeps the source-protection finalizer while a claim is restored from it.
            return ops;
        }
        if let Some(c) = content {
            let name = c.metadata.name.clone().unwrap_or_default();
            if !annotated(&c.metadata, snap::BEING_DELETED) {
                ops.push(Op::AnnotateContentBeingDeleted(name.clone()));
            }
            if c.spec.deletion_policy == snap::DELETE && c.metadata.deletion_timestamp.is_none() {
                ops.push(Op::DeleteContent(name));
            }
        }
        if let Some(claim) = i.claim {
            if has_finalizer(&claim.metadata, snap::PVC_AS_SOURCE_FINALIZER) && !i.claim_busy_elsewhere {
                ops.push(Op::ClaimFinalizer { claim: claim.metadata.name.clone().unwrap_or_default(), add: false });
            }
        }
        let ours: Vec<&'static str> = [snap::SNAPSHOT_AS_SOURCE_FINALIZER, snap::SNAPSHOT_BOUND_FINALIZER]
            .into_iter()
            .filter(|f| has_finalizer(&s.metadata, f))
            .collect();
        if !ours.is_empty() {
            ops.push(Op::RemoveFinalizers(ours));
        }
        return ops;
    }

    let mut add = Vec::new();
    if !has_finalizer(&s.metadata, snap::SNAPSHOT_AS_SOURCE_FINALIZER) {
        add.push(snap::SNAPSHOT_AS_SOURCE_FINALIZER);
    }
    if content.is_some_and(|c| c.spec.deletion_policy == snap::DELETE) && !has_finalizer(&s.metadata, snap::SNAPSHOT_BOUND_FINALIZER) {
        add.push(snap::SNAPSHOT_BOUND_FINALIZER);
    }
    if !add.is_empty() {
        ops.push(Op::AddFinalizers(add));
    }

    let source = &s.spec.source;
    match (source.persistent_volume_claim_name.as_deref(), source.volume_snapshot_content_name.as_deref()) {
        (Some(claim_name), None) => match content {
            Some(c) => follow_content(&mut ops, i, c, Some(claim_name)),
            None if i.content.is_some() => fail(
                &mut ops,
                s,
                "SnapshotContentMismatch",
                format!("VolumeSnapshotContent {} does not belong to snapshot {key}", snap::content_name_for(&uid)),
                &i.now,
            ),
            None => {
                if s.status.as_ref().and_then(|st| st.bound_volume_snapshot_content_name.as_deref()).is_some() {
                    fail(&mut ops, s, "SnapshotContentMissing", "VolumeSnapshotContent is missing".into(), &i.now);
                    return ops;
                }
                create_content(&mut ops, i, &uid, claim_name);
            }
        },
        (None, Some(content_name)) => match i.content {
            None => fail(
                &mut ops,
                s,
                "SnapshotContentMissing",
                format!("VolumeSnapshotContent {content_name:?} not found"),
                &i.now,
            ),
            Some(c) if !content_points_to(c, s) => fail(
                &mut ops,
                s,
                "SnapshotContentMismatch",
                format!("VolumeSnapshotContent {content_name:?} is bound to another snapshot or names another one in its volumeSnapshotRef"),
                &i.now,
            ),
            Some(c) => {
                let unbound = c.spec.volume_snapshot_ref.uid.as_deref().is_none_or(str::is_empty);
                if unbound {
                    ops.push(Op::BindContent { content: content_name.to_string(), uid: uid.clone() });
                } else if !has_finalizer(&c.metadata, snap::CONTENT_BOUND_FINALIZER) && c.metadata.deletion_timestamp.is_none() {
                    ops.push(Op::AddContentFinalizer(content_name.to_string()));
                }
                follow_content(&mut ops, i, c, None);
            }
        },
        // Validation refuses both or neither; nothing to do with such an object.
        _ => {}
    }
    ops
}

/// Dynamic snapshot without its content yet: check the claim, the volume and the class, then
/// create the content.
fn create_content(ops: &mut Vec<Op>, i: &Inputs<'_>, uid: &str, claim_name: &str) {
    let s = i.snapshot;
    let ns = s.metadata.namespace.clone().unwrap_or_default();
    let Some(claim) = i.claim else {
        let msg = format!("failed to take snapshot of claim {ns}/{claim_name}: persistentvolumeclaim {claim_name:?} not found");
        fail(ops, s, "SnapshotContentCreationFailed", msg, &i.now);
        return;
    };
    if claim.metadata.deletion_timestamp.is_some() {
        let msg = format!("failed to take snapshot of claim {ns}/{claim_name}: the claim is being deleted");
        fail(ops, s, "SnapshotContentCreationFailed", msg, &i.now);
        return;
    }
    let csi = i.volume.and_then(|v| v.spec.as_ref()).and_then(|s| s.csi.as_ref());
    let Some(csi) = csi else {
        let msg = if claim.spec.as_ref().and_then(|s| s.volume_name.as_deref()).is_none_or(str::is_empty) {
            format!("the PVC {claim_name} is not yet bound to a PV, will not attempt to take a snapshot")
        } else {
            format!("the volume of claim {ns}/{claim_name} is not a CSI volume: it cannot be snapshotted")
        };
        fail(ops, s, "SnapshotContentCreationFailed", msg, &i.now);
        return;
    };
    let class = match choose_class(s.spec.volume_snapshot_class_name.as_deref(), &csi.driver, i.classes) {
        Ok(c) => c,
        Err(msg) => {
            fail(ops, s, "SnapshotContentCreationFailed", format!("failed to take snapshot of claim {ns}/{claim_name}: {msg}"), &i.now);
            return;
        }
    };
    if class.driver != csi.driver {
        let msg = format!(
            "snapshot class {:?} is for driver {:?}, the volume of claim {ns}/{claim_name} is {:?}'s",
            class.metadata.name.as_deref().unwrap_or_default(),
            class.driver,
            csi.driver
        );
        fail(ops, s, "SnapshotContentCreationFailed", msg, &i.now);
        return;
    }
    let class_name = class.metadata.name.clone().unwrap_or_default();
    if s.spec.volume_snapshot_class_name.is_none() {
        ops.push(Op::SetClass(class_name.clone()));
    }
    if !has_finalizer(&claim.metadata, snap::PVC_AS_SOURCE_FINALIZER) {
        ops.push(Op::ClaimFinalizer { claim: claim_name.to_string(), add: true });
    }
    let name = snap::content_name_for(uid);
    let content = VolumeSnapshotContent {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            finalizers: Some(vec![snap::CONTENT_BOUND_FINALIZER.into()]),
            ..Default::default()
        },
        spec: VolumeSnapshotContentSpec {
            volume_snapshot_ref: ObjectReference {
                api_version: Some(snap::API_VERSION.into()),
                kind: Some("VolumeSnapshot".into()),
                name: s.metadata.name.clone(),
                namespace: s.metadata.namespace.clone(),
                uid: Some(uid.to_string()),
                resource_version: s.metadata.resource_version.clone(),
                field_path: None,
            },
            deletion_policy: class.deletion_policy.clone(),
            driver: csi.driver.clone(),
            volume_snapshot_class_name: Some(class_name),
            source: VolumeSnapshotContentSource { volume_handle: Some(csi.volume_handle.clone()), snapshot_handle: None },
            source_volume_mode: Some(
                i.volume.and_then(|v| v.spec.as_ref()).and_then(|s| s.volume_mode.clone()).unwrap_or_else(|| "Filesystem".into()),
            ),
        },
        ..Default::default()
    };
    ops.push(Op::CreateContent(Box::new(content)));
    ops.push(Op::Event {
        warning: false,
        reason: "CreatingSnapshot",
        message: format!("Waiting for a snapshot {} to be created by the CSI driver.", key_of(s)),
    });
    let st = VolumeSnapshotStatus {
        bound_volume_snapshot_content_name: Some(name),
        ready_to_use: Some(false),
        ..s.status.clone().unwrap_or_default()
    };
    if s.status.as_ref() != Some(&st) {
        ops.push(Op::Status(st));
    }
}

/// The snapshot's status from its content, the events of its transitions, and the claim's
/// finalizer released once the snapshot is taken (or failed).
fn follow_content(ops: &mut Vec<Op>, i: &Inputs<'_>, c: &VolumeSnapshotContent, claim_name: Option<&str>) {
    let s = i.snapshot;
    let st = status_from_content(c, s.status.as_ref());
    let was = s.status.as_ref();
    if was != Some(&st) {
        let key = key_of(s);
        if st.creation_time.is_some() && was.and_then(|w| w.creation_time.as_ref()).is_none() {
            ops.push(Op::Event {
                warning: false,
                reason: "SnapshotCreated",
                message: format!("Snapshot {key} was successfully created by the CSI driver."),
            });
        }
        if st.ready_to_use == Some(true) && was.and_then(|w| w.ready_to_use) != Some(true) {
            ops.push(Op::Event { warning: false, reason: "SnapshotReady", message: format!("Snapshot {key} is ready to use.") });
        }
        if let Some(msg) = st.error.as_ref().and_then(|e| e.message.clone()) {
            if was.and_then(|w| w.error.as_ref()).and_then(|e| e.message.as_deref()) != Some(msg.as_str()) {
                ops.push(Op::Event { warning: true, reason: "SnapshotCreationFailed", message: msg });
            }
        }
        ops.push(Op::Status(st.clone()));
    }
    let settled = st.ready_to_use == Some(true) || st.error.is_some();
    if let (Some(name), Some(claim)) = (claim_name, i.claim) {
        if settled && has_finalizer(&claim.metadata, snap::PVC_AS_SOURCE_FINALIZER) && !i.claim_busy_elsewhere {
            ops.push(Op::ClaimFinalizer { claim: name.to_string(), add: false });
        }
    }
}

/// A snapshot that is gone (deleted without this controller seeing it through, or its
/// finalizers removed by hand): its bound contents are marked and, with policy Delete, deleted.
pub fn plan_orphaned(contents: &[&VolumeSnapshotContent]) -> Vec<Op> {
    let mut ops = Vec::new();
    for c in contents {
        let bound = c.spec.volume_snapshot_ref.uid.as_deref().is_some_and(|u| !u.is_empty());
        if !bound || c.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let name = c.metadata.name.clone().unwrap_or_default();
        if !annotated(&c.metadata, snap::BEING_DELETED) {
            ops.push(Op::AnnotateContentBeingDeleted(name.clone()));
        }
        if c.spec.deletion_policy == snap::DELETE {
            ops.push(Op::DeleteContent(name));
        }
    }
    ops
}

/// The snapshot a claim restores from (`dataSourceRef`, else `dataSource`), if any.
pub fn restore_source(claim: &PersistentVolumeClaim) -> Option<&str> {
    let spec = claim.spec.as_ref()?;
    let from_ref = spec
        .data_source_ref
        .as_ref()
        .map(|r| (r.api_group.as_deref(), r.kind.as_str(), r.name.as_str()));
    let from_source = spec.data_source.as_ref().map(|r| (r.api_group.as_deref(), r.kind.as_str(), r.name.as_str()));
    match from_ref.or(from_source)? {
        (Some(snap::GROUP), "VolumeSnapshot", name) => Some(name),
        _ => None,
    }
}

/// Whether a claim is still being provisioned (no volume bound yet) and alive.
pub fn being_provisioned(claim: &PersistentVolumeClaim) -> bool {
    claim.metadata.deletion_timestamp.is_none()
        && claim.spec.as_ref().and_then(|s| s.volume_name.as_deref()).is_none_or(str::is_empty)
}

/// `meta`'s finalizers with `add` appended (once) and `remove` taken out: the list a merge
/// patch writes.
pub fn with_finalizers(meta: &ObjectMeta, add: &[&str], remove: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = meta.finalizers.clone().unwrap_or_default();
    out.retain(|f| !remove.contains(&f.as_str()));
    for f in add {
        if !out.iter().any(|x| x == f) {
            out.push((*f).to_string());
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn now() -> Time {
        Time(jiff::Timestamp::from_second(1_800_000_000).unwrap())
    }

    fn snapshot(v: serde_json::Value) -> VolumeSnapshot {
        let mut base = json!({"metadata": {"name": "s1", "namespace": "team", "uid": "u1", "resourceVersion": "5"}});
        merge(&mut base, v);
        serde_json::from_value(base).unwrap()
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

    fn dynamic() -> VolumeSnapshot {
        snapshot(json!({"spec": {"source": {"persistentVolumeClaimName": "data"}}}))
    }

    fn claim(finalizers: &[&str]) -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "data", "namespace": "team", "finalizers": finalizers},
            "spec": {"volumeName": "pvc-1", "accessModes": ["ReadWriteOnce"]},
        }))
        .unwrap()
    }

    fn volume() -> PersistentVolume {
        serde_json::from_value(json!({
            "metadata": {"name": "pvc-1"},
            "spec": {"csi": {"driver": "loop.csi.ferro.dev", "volumeHandle": "loop-abc"}, "volumeMode": "Filesystem"},
        }))
        .unwrap()
    }

    fn class(name: &str, driver: &str, default: bool, policy: &str) -> VolumeSnapshotClass {
        let mut c = VolumeSnapshotClass { driver: driver.into(), deletion_policy: policy.into(), ..Default::default() };
        c.metadata.name = Some(name.into());
        if default {
            c.metadata.annotations = Some([(snap::IS_DEFAULT_CLASS.to_string(), "true".to_string())].into());
        }
        c
    }

    fn content(status: serde_json::Value) -> VolumeSnapshotContent {
        let mut base = json!({
            "metadata": {"name": "snapcontent-u1", "finalizers": [snap::CONTENT_BOUND_FINALIZER]},
            "spec": {"volumeSnapshotRef": {"name": "s1", "namespace": "team", "uid": "u1"}, "deletionPolicy": "Delete",
                     "driver": "loop.csi.ferro.dev", "volumeSnapshotClassName": "loop", "source": {"volumeHandle": "loop-abc"}},
        });
        merge(&mut base, json!({"status": status}));
        serde_json::from_value(base).unwrap()
    }

    fn inputs<'a>(
        s: &'a VolumeSnapshot,
        c: Option<&'a VolumeSnapshotContent>,
        classes: &'a [&'a VolumeSnapshotClass],
        pvc: Option<&'a PersistentVolumeClaim>,
        pv: Option<&'a PersistentVolume>,
    ) -> Inputs<'a> {
        Inputs { snapshot: s, content: c, classes, claim: pvc, volume: pv, restoring: false, claim_busy_elsewhere: false, now: now() }
    }

    #[test]
    fn a_dynamic_snapshot_gets_the_default_class_a_content_and_protects_its_claim() {
        let s = dynamic();
        let (pvc, pv) = (claim(&[]), volume());
        let (k, other) = (class("loop", "loop.csi.ferro.dev", true, "Delete"), class("x", "other.driver", true, "Retain"));
        let ops = plan(&inputs(&s, None, &[&other, &k], Some(&pvc), Some(&pv)));
        assert_eq!(ops[0], Op::AddFinalizers(vec![snap::SNAPSHOT_AS_SOURCE_FINALIZER]));
        assert_eq!(ops[1], Op::SetClass("loop".into()));
        assert_eq!(ops[2], Op::ClaimFinalizer { claim: "data".into(), add: true });
        let Op::CreateContent(c) = &ops[3] else { panic!("{ops:?}") };
        assert_eq!(c.metadata.name.as_deref(), Some("snapcontent-u1"));
        assert_eq!(c.metadata.finalizers, Some(vec![snap::CONTENT_BOUND_FINALIZER.to_string()]));
        assert_eq!(c.spec.source.volume_handle.as_deref(), Some("loop-abc"));
        assert_eq!(c.spec.driver, "loop.csi.ferro.dev");
        assert_eq!(c.spec.deletion_policy, "Delete");
        assert_eq!(c.spec.volume_snapshot_ref.uid.as_deref(), Some("u1"));
        assert_eq!(c.spec.volume_snapshot_ref.namespace.as_deref(), Some("team"));
        assert_eq!(c.spec.source_volume_mode.as_deref(), Some("Filesystem"));
        assert!(matches!(&ops[4], Op::Event { warning: false, reason: "CreatingSnapshot", message } if message == "Waiting for a snapshot team/s1 to be created by the CSI driver."));
        let Op::Status(st) = &ops[5] else { panic!("{ops:?}") };
        assert_eq!(st.bound_volume_snapshot_content_name.as_deref(), Some("snapcontent-u1"));
        assert_eq!(st.ready_to_use, Some(false));
        assert_eq!(ops.len(), 6);
    }

    #[test]
    fn the_status_follows_the_content_with_upstreams_events_and_the_claim_is_released() {
        let mut s = dynamic();
        s.metadata.finalizers = Some(vec![snap::SNAPSHOT_AS_SOURCE_FINALIZER.into(), snap::SNAPSHOT_BOUND_FINALIZER.into()]);
        s.spec.volume_snapshot_class_name = Some("loop".into());
        s.status = Some(VolumeSnapshotStatus { bound_volume_snapshot_content_name: Some("snapcontent-u1".into()), ready_to_use: Some(false), ..Default::default() });
        let pvc = claim(&[snap::PVC_AS_SOURCE_FINALIZER]);
        let pv = volume();
        // Not taken yet: nothing changes, the claim stays protected.
        let c = content(json!(null));
        assert_eq!(plan(&inputs(&s, Some(&c), &[], Some(&pvc), Some(&pv))), vec![]);
        // Taken and ready.
        let c = content(json!({"snapshotHandle": "snap-1", "creationTime": 1_800_000_000_123_456_789i64, "restoreSize": 16_777_216, "readyToUse": true}));
        let ops = plan(&inputs(&s, Some(&c), &[], Some(&pvc), Some(&pv)));
        let reasons: Vec<&str> = ops.iter().filter_map(|o| if let Op::Event { reason, .. } = o { Some(*reason) } else { None }).collect();
        assert_eq!(reasons, ["SnapshotCreated", "SnapshotReady"]);
        let st = ops.iter().find_map(|o| if let Op::Status(st) = o { Some(st.clone()) } else { None }).unwrap();
        assert_eq!(st.ready_to_use, Some(true));
        assert_eq!(st.restore_size, Some(Quantity("16Mi".into())));
        assert_eq!(st.creation_time, Some(Time(jiff::Timestamp::from_second(1_800_000_000).unwrap())));
        assert_eq!(ops.last(), Some(&Op::ClaimFinalizer { claim: "data".into(), add: false }));
        // Once written, the same content changes nothing (no repeated events).
        s.status = Some(st);
        let pvc = claim(&[]);
        assert_eq!(plan(&inputs(&s, Some(&c), &[], Some(&pvc), Some(&pv))), vec![]);
    }

    #[test]
    fn a_driver_error_on_the_content_is_the_snapshots_error_and_releases_the_claim() {
        let mut s = dynamic();
        s.metadata.finalizers = Some(vec![snap::SNAPSHOT_AS_SOURCE_FINALIZER.into(), snap::SNAPSHOT_BOUND_FINALIZER.into()]);
        let pvc = claim(&[snap::PVC_AS_SOURCE_FINALIZER]);
        let c = content(json!({"readyToUse": false, "error": {"message": "unknown snapshot parameters [\"speed\"]"}}));
        let ops = plan(&inputs(&s, Some(&c), &[], Some(&pvc), Some(&volume())));
        assert!(ops.iter().any(|o| matches!(o, Op::Event { warning: true, reason: "SnapshotCreationFailed", message } if message.contains("speed"))), "{ops:?}");
        assert_eq!(ops.last(), Some(&Op::ClaimFinalizer { claim: "data".into(), add: false }));
    }

    #[test]
    fn what_a_dynamic_snapshot_cannot_be_taken_from_is_said_in_its_status() {
        let s = dynamic();
        let k = class("loop", "loop.csi.ferro.dev", false, "Delete");
        let error_of = |ops: Vec<Op>| -> String {
            ops.iter().find_map(|o| if let Op::Status(st) = o { st.error.as_ref()?.message.clone() } else { None }).unwrap_or_default()
        };
        assert!(error_of(plan(&inputs(&s, None, &[&k], None, None))).contains("persistentvolumeclaim \"data\" not found"));
        let unbound: PersistentVolumeClaim = serde_json::from_value(json!({"metadata": {"name": "data", "namespace": "team"}, "spec": {}})).unwrap();
        assert_eq!(
            error_of(plan(&inputs(&s, None, &[&k], Some(&unbound), None))),
            "the PVC data is not yet bound to a PV, will not attempt to take a snapshot"
        );
        let pvc = claim(&[]);
        let pv = volume();
        assert!(error_of(plan(&inputs(&s, None, &[&k], Some(&pvc), Some(&pv)))).contains("cannot find default snapshot class for driver \"loop.csi.ferro.dev\""));
        let (a, b) = (class("a", "loop.csi.ferro.dev", true, "Delete"), class("b", "loop.csi.ferro.dev", true, "Delete"));
        assert!(error_of(plan(&inputs(&s, None, &[&a, &b], Some(&pvc), Some(&pv)))).contains("2 default snapshot classes exist"));
        let mut named = dynamic();
        named.spec.volume_snapshot_class_name = Some("missing".into());
        assert!(error_of(plan(&inputs(&named, None, &[&k], Some(&pvc), Some(&pv)))).contains("\"missing\" not found"));
        named.spec.volume_snapshot_class_name = Some("x".into());
        let x = class("x", "other.driver", false, "Delete");
        assert!(error_of(plan(&inputs(&named, None, &[&x], Some(&pvc), Some(&pv)))).contains("is for driver \"other.driver\""));
        // Nothing else is done (no content, no claim finalizer) and the error is written once.
        let ops = plan(&inputs(&named, None, &[&x], Some(&pvc), Some(&pv)));
        assert!(!ops.iter().any(|o| matches!(o, Op::CreateContent(_) | Op::ClaimFinalizer { .. })), "{ops:?}");
        let mut failed = named.clone();
        failed.metadata.finalizers = Some(vec![snap::SNAPSHOT_AS_SOURCE_FINALIZER.into()]);
        failed.status = ops.iter().find_map(|o| if let Op::Status(st) = o { Some(st.clone()) } else { None });
        assert_eq!(plan(&inputs(&failed, None, &[&x], Some(&pvc), Some(&pv))), vec![]);
    }

    #[test]
    fn a_pre_provisioned_content_is_bound_by_uid_and_one_naming_another_snapshot_is_refused() {
        let s = snapshot(json!({"spec": {"source": {"volumeSnapshotContentName": "imported"}}}));
        let mut c = content(json!({"snapshotHandle": "snap-9", "restoreSize": 1024, "readyToUse": true}));
        c.metadata.name = Some("imported".into());
        c.metadata.finalizers = None;
        c.spec.volume_snapshot_ref.uid = None;
        c.spec.deletion_policy = "Retain".into();
        c.spec.source = VolumeSnapshotContentSource { volume_handle: None, snapshot_handle: Some("snap-9".into()) };
        let ops = plan(&inputs(&s, Some(&c), &[], None, None));
        assert!(ops.contains(&Op::BindContent { content: "imported".into(), uid: "u1".into() }), "{ops:?}");
        // Retain: no bound finalizer on the snapshot.
        assert_eq!(ops[0], Op::AddFinalizers(vec![snap::SNAPSHOT_AS_SOURCE_FINALIZER]));
        let st = ops.iter().find_map(|o| if let Op::Status(st) = o { Some(st.clone()) } else { None }).unwrap();
        assert_eq!(st.bound_volume_snapshot_content_name.as_deref(), Some("imported"));
        assert_eq!(st.restore_size, Some(Quantity("1Ki".into())));

        let mut theirs = c.clone();
        theirs.spec.volume_snapshot_ref.name = Some("someone-else".into());
        let ops = plan(&inputs(&s, Some(&theirs), &[], None, None));
        assert!(ops.iter().any(|o| matches!(o, Op::Event { reason: "SnapshotContentMismatch", .. })), "{ops:?}");
        assert!(!ops.iter().any(|o| matches!(o, Op::BindContent { .. })));
        let ops = plan(&inputs(&s, None, &[], None, None));
        assert!(ops.iter().any(|o| matches!(o, Op::Event { reason: "SnapshotContentMissing", .. })), "{ops:?}");
    }

    #[test]
    fn deletion_waits_for_restores_then_deletes_a_delete_policy_content_and_drops_the_finalizers() {
        let mut s = dynamic();
        s.metadata.deletion_timestamp = Some(now());
        s.metadata.finalizers = Some(vec![snap::SNAPSHOT_AS_SOURCE_FINALIZER.into(), snap::SNAPSHOT_BOUND_FINALIZER.into()]);
        let c = content(json!({"snapshotHandle": "snap-1", "readyToUse": true}));
        let pvc = claim(&[]);
        let mut i = inputs(&s, Some(&c), &[], Some(&pvc), None);
        i.restoring = true;
        assert_eq!(plan(&i), vec![]);
        i.restoring = false;
        assert_eq!(
            plan(&i),
            vec![
                Op::AnnotateContentBeingDeleted("snapcontent-u1".into()),
                Op::DeleteContent("snapcontent-u1".into()),
                Op::RemoveFinalizers(vec![snap::SNAPSHOT_AS_SOURCE_FINALIZER, snap::SNAPSHOT_BOUND_FINALIZER]),
            ]
        );
        let mut retained = c.clone();
        retained.spec.deletion_policy = "Retain".into();
        let ops = plan(&inputs(&s, Some(&retained), &[], Some(&pvc), None));
        assert!(!ops.iter().any(|o| matches!(o, Op::DeleteContent(_))), "{ops:?}");
        assert!(ops.contains(&Op::AnnotateContentBeingDeleted("snapcontent-u1".into())));
    }

    #[test]
    fn contents_of_a_vanished_snapshot_are_deleted_per_their_policy() {
        let c = content(json!(null));
        let mut retained = content(json!(null));
        retained.metadata.name = Some("kept".into());
        retained.spec.deletion_policy = "Retain".into();
        let mut unbound = content(json!(null));
        unbound.metadata.name = Some("unbound".into());
        unbound.spec.volume_snapshot_ref.uid = None;
        assert_eq!(
            plan_orphaned(&[&c, &retained, &unbound]),
            vec![
                Op::AnnotateContentBeingDeleted("snapcontent-u1".into()),
                Op::DeleteContent("snapcontent-u1".into()),
                Op::AnnotateContentBeingDeleted("kept".into()),
            ]
        );
    }

    #[test]
    fn restore_sources_come_from_data_source_ref_first() {
        let c: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": "r"},
            "spec": {"dataSource": {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "a"},
                     "dataSourceRef": {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "b"}},
        }))
        .unwrap();
        assert_eq!(restore_source(&c), Some("b"));
        let clone: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": "r"}, "spec": {"dataSource": {"kind": "PersistentVolumeClaim", "name": "a"}},
        }))
        .unwrap();
        assert_eq!(restore_source(&clone), None);
        assert!(being_provisioned(&clone));
    }
}
