//! The provisioner's decisions, pure: whether a claim is this node's to provision (upstream's
//! external-provisioner in distributed mode, `--node-deployment`: every node's driver
//! provisions the claims whose selected node is its own), what to ask CreateVolume for, the
//! PersistentVolume that records the result, and whether a released volume is this node's to
//! delete.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    ObjectReference, PersistentVolume, PersistentVolumeClaim, PersistentVolumeSpec,
    VolumeNodeAffinity,
};
use k8s_openapi::api::storage::v1::{CSIDriver, CSIDriverSpec, StorageClass};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::proto::volume_capability::access_mode::Mode;
use crate::proto::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use crate::proto::VolumeCapability;
use crate::volume::names::{DRIVER_NAME, TOPOLOGY_KEY};
use crate::volume::record::Source;

/// Claim annotation naming the provisioner (set by the PV controller).
pub const ANN_STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
pub const ANN_BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";
/// Claim annotation the scheduler sets to the node a WaitForFirstConsumer claim must be on.
pub const ANN_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// Volume annotation naming the provisioner that made it.
pub const ANN_PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
/// The finalizer upstream's external-provisioner puts on the volumes it made: the volume
/// object stays until the storage behind it is deleted.
pub const PV_FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";
/// StorageClass parameter naming the filesystem (upstream's key).
pub const PARAM_FSTYPE: &str = "csi.storage.k8s.io/fstype";
/// The filesystem when the class names none.
pub const DEFAULT_FSTYPE: &str = "ext4";

/// The CSIDriver object describing ferro-csi to the cluster: no attach step (volumes are
/// node-local: an upstream kubelet must not wait for a VolumeAttachment), pod info on mount
/// (its `csi.storage.k8s.io/ephemeral` key tells inline volumes apart), fsGroup applied by
/// the kubelet for ReadWriteOnce volumes with an fsType, persistent and inline (ephemeral)
/// volumes, storage capacity published (see [`super::capacity`]).
pub fn driver_object() -> CSIDriver {
    CSIDriver {
        metadata: ObjectMeta { name: Some(DRIVER_NAME.into()), ..Default::default() },
        spec: CSIDriverSpec {
            attach_required: Some(false),
            pod_info_on_mount: Some(true),
            fs_group_policy: Some("ReadWriteOnceWithFSType".into()),
            volume_lifecycle_modes: Some(vec!["Persistent".into(), "Ephemeral".into()]),
            storage_capacity: Some(true),
            requires_republish: Some(false),
            ..Default::default()
        },
    }
}

/// What to do about one claim.
#[derive(Clone, Debug, PartialEq)]
pub enum ClaimDecision {
    /// Not this node's to provision (another provisioner, bound, another node, done).
    Ignore,
    /// An Immediate claim no node has taken yet: take it by setting the selected-node
    /// annotation to this node (an update guarded by resourceVersion: one node wins).
    Take,
    /// Provision it.
    Provision(Box<VolumeRequest>),
    /// It can never be provisioned as it stands: say why (an event), until it changes.
    Refuse(String),
}

/// The CreateVolume a claim asks for.
#[derive(Clone, Debug, PartialEq)]
pub struct VolumeRequest {
    /// The PersistentVolume's name and the CreateVolume name: `pvc-<claim uid>`.
    pub name: String,
    pub required_bytes: i64,
    pub limit_bytes: i64,
    pub capability: VolumeCapability,
    pub parameters: HashMap<String, String>,
    pub source: Option<Source>,
}

fn ann<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

fn bytes(q: &Quantity) -> Result<i64, String> {
    let v = k8s_semantics::quantity::Quantity::parse(&q.0)
        .map_err(|e| format!("storage quantity {:?}: {e}", q.0))?
        .value()
        .ok_or_else(|| format!("storage quantity {:?} is out of range", q.0))?;
    i64::try_from(v).map_err(|_| format!("storage quantity {:?} is out of range", q.0))
}

/// The PV name of a claim (upstream: `pvc-<uid>`).
pub fn volume_name(pvc: &PersistentVolumeClaim) -> Option<String> {
    pvc.metadata.uid.as_ref().map(|uid| format!("pvc-{uid}"))
}

/// Whether the class is this driver's.
pub fn is_ours(class: &StorageClass) -> bool {
    class.provisioner == DRIVER_NAME
}

/// Decides about one claim. `pv_exists` says whether the claim's PV (`pvc-<uid>`) exists;
/// `source_volume` resolves a PersistentVolumeClaim data source (same namespace) to the
/// volume handle of the PV it is bound to, when that PV is this driver's; `source_snapshot`
/// resolves a VolumeSnapshot data source (see [`snapshot::snapshot_source`]).
pub fn decide_claim(
    pvc: &PersistentVolumeClaim,
    class: Option<&StorageClass>,
    node: &str,
    pv_exists: bool,
    source_volume: &dyn Fn(&str) -> Option<String>,
    source_snapshot: &dyn Fn(&str) -> Result<snapshot::SnapshotSource, String>,
) -> ClaimDecision {
    let Some(class) = class.filter(|c| is_ours(c)) else {
        return ClaimDecision::Ignore;
    };
    let Some(spec) = pvc.spec.as_ref() else {
        return ClaimDecision::Ignore;
    };
    if pvc.metadata.deletion_timestamp.is_some()
        || spec.volume_name.as_deref().is_some_and(|v| !v.is_empty())
    {
        return ClaimDecision::Ignore;
    }
    let asked = ann(&pvc.metadata, ANN_STORAGE_PROVISIONER)
        .or_else(|| ann(&pvc.metadata, ANN_BETA_STORAGE_PROVISIONER));
    if asked != Some(DRIVER_NAME) {
        // The PV controller has not handed the claim to a provisioner (yet).
        return ClaimDecision::Ignore;
    }
    let wffc = class.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer");
    match ann(&pvc.metadata, ANN_SELECTED_NODE) {
        Some(n) if n == node => {}
        Some(_) => return ClaimDecision::Ignore,
        None if wffc => return ClaimDecision::Ignore,
        None => {
            return if pv_exists {
                ClaimDecision::Ignore
            } else {
                ClaimDecision::Take
            }
        }
    }
    if pv_exists {
        return ClaimDecision::Ignore;
    }
    let Some(name) = volume_name(pvc) else {
        return ClaimDecision::Ignore;
    };
    let resources = spec.resources.as_ref();
    let Some(request) = resources
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
    else {
        return ClaimDecision::Refuse("the claim requests no storage".into());
    };
    let required_bytes = match bytes(request) {
        Ok(b) if b > 0 => b,
        Ok(_) => return ClaimDecision::Refuse("the claim requests no storage (0 bytes)".into()),
        Err(e) => return ClaimDecision::Refuse(e),
    };
    let limit_bytes = match resources
        .and_then(|r| r.limits.as_ref())
        .and_then(|l| l.get("storage"))
        .map(bytes)
    {
        None => 0,
        Some(Ok(b)) => b,
        Some(Err(e)) => return ClaimDecision::Refuse(e),
    };
    let modes = spec.access_modes.clone().unwrap_or_default();
    let mode = match modes.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        [] | ["ReadWriteOnce"] => Mode::SingleNodeWriter,
        ["ReadWriteOncePod"] => Mode::SingleNodeSingleWriter,
        ["ReadOnlyMany"] => Mode::MultiNodeReaderOnly,
        ["ReadWriteMany"] => Mode::MultiNodeMultiWriter,
        other => {
            return ClaimDecision::Refuse(format!(
                "access modes {other:?}: {DRIVER_NAME} volumes take one of ReadWriteOnce or ReadWriteOncePod"
            ))
        }
    };
    let params = class.parameters.clone().unwrap_or_default();
    let access_type = if spec.volume_mode.as_deref() == Some("Block") {
        AccessType::Block(BlockVolume {})
    } else {
        AccessType::Mount(MountVolume {
            fs_type: params
                .get(PARAM_FSTYPE)
                .cloned()
                .unwrap_or_else(|| DEFAULT_FSTYPE.into()),
            mount_flags: class.mount_options.clone().unwrap_or_default(),
            volume_mount_group: String::new(),
        })
    };
    let source = match spec
        .data_source_ref
        .as_ref()
        .map(|r| (r.api_group.as_deref(), r.kind.as_str(), r.name.as_str()))
        .or_else(|| {
            spec.data_source
                .as_ref()
                .map(|r| (r.api_group.as_deref(), r.kind.as_str(), r.name.as_str()))
        }) {
        None => None,
        Some((None | Some(""), "PersistentVolumeClaim", claim)) => match source_volume(claim) {
            Some(handle) => Some(Source::Volume(handle)),
            None => {
                return ClaimDecision::Refuse(format!(
                    "data source claim {claim:?} is not bound to a {DRIVER_NAME} volume"
                ))
            }
        },
        Some((Some(api_ext::snapshot::v1::GROUP), "VolumeSnapshot", name)) => match source_snapshot(name) {
            Ok(s) if s.restore_size > required_bytes => {
                // Upstream's external-provisioner, word for word.
                return ClaimDecision::Refuse(format!(
                    "requested volume size {required_bytes} is less than the size {} for the source snapshot {name}",
                    s.restore_size
                ));
            }
            Ok(s) => Some(Source::Snapshot(s.snapshot_id)),
            Err(why) => return ClaimDecision::Refuse(why),
        },
        Some((group, kind, _)) => {
            return ClaimDecision::Refuse(format!(
            "data source {}/{kind} is not supported (a PersistentVolumeClaim or a VolumeSnapshot of this driver is)",
            group.unwrap_or("")
        ))
        }
    };
    let parameters = params
        .into_iter()
        .filter(|(k, _)| !k.starts_with("csi.storage.k8s.io/"))
        .collect();
    ClaimDecision::Provision(Box::new(VolumeRequest {
        name,
        required_bytes,
        limit_bytes,
        capability: VolumeCapability {
            access_type: Some(access_type),
            access_mode: Some(AccessMode { mode: mode as i32 }),
        },
        parameters,
        source,
    }))
}

/// The PersistentVolume recording a volume made for a claim: pre-bound to the claim (the PV
/// controller completes the binding), pinned to this node.
pub fn volume_object(
    pvc: &PersistentVolumeClaim,
    class: &StorageClass,
    req: &VolumeRequest,
    volume_id: &str,
    capacity_bytes: i64,
    volume_context: &HashMap<String, String>,
    node: &str,
) -> PersistentVolume {
    let spec = pvc.spec.clone().unwrap_or_default();
    let fs_type = match &req.capability.access_type {
        Some(AccessType::Mount(m)) => Some(m.fs_type.clone()),
        _ => None,
    };
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(req.name.clone()),
            annotations: Some(BTreeMap::from([(
                ANN_PROVISIONED_BY.to_string(),
                DRIVER_NAME.to_string(),
            )])),
            finalizers: Some(vec![PV_FINALIZER.to_string()]),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            access_modes: Some(
                spec.access_modes
                    .clone()
                    .unwrap_or_else(|| vec!["ReadWriteOnce".into()]),
            ),
            capacity: Some(BTreeMap::from([(
                "storage".to_string(),
                Quantity(capacity_bytes.to_string()),
            )])),
            claim_ref: Some(ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("PersistentVolumeClaim".into()),
                namespace: pvc.metadata.namespace.clone(),
                name: pvc.metadata.name.clone(),
                uid: pvc.metadata.uid.clone(),
                resource_version: pvc.metadata.resource_version.clone(),
                ..Default::default()
            }),
            csi: Some(CSIPersistentVolumeSource {
                driver: DRIVER_NAME.into(),
                volume_handle: volume_id.into(),
                fs_type,
                volume_attributes: Some(
                    volume_context
                        .iter()
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect(),
                ),
                ..Default::default()
            }),
            mount_options: class.mount_options.clone(),
            node_affinity: Some(VolumeNodeAffinity {
                required: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_expressions: Some(vec![NodeSelectorRequirement {
                            key: TOPOLOGY_KEY.into(),
                            operator: "In".into(),
                            values: Some(vec![node.to_string()]),
                        }]),
                        ..Default::default()
                    }],
                }),
            }),
            persistent_volume_reclaim_policy: Some(
                class
                    .reclaim_policy
                    .clone()
                    .unwrap_or_else(|| "Delete".into()),
            ),
            storage_class_name: class.metadata.name.clone(),
            volume_mode: spec
                .volume_mode
                .clone()
                .or_else(|| Some("Filesystem".into())),
            ..Default::default()
        }),
        status: None,
    }
}

/// A bound claim asking for more than its volume has: ControllerExpandVolume to `bytes`
/// (the external-resizer's job).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resize {
    pub volume_id: String,
    pub bytes: i64,
}

/// Whether the claim, bound to `pv`, asks this node's driver for a larger volume.
pub fn decide_resize(
    pvc: &PersistentVolumeClaim,
    pv: &PersistentVolume,
    node: &str,
) -> Option<Resize> {
    let spec = pv.spec.as_ref()?;
    let csi = spec.csi.as_ref().filter(|c| c.driver == DRIVER_NAME)?;
    if volume_node(pv) != Some(node)
        || pvc.spec.as_ref()?.volume_name.as_deref() != pv.metadata.name.as_deref()
    {
        return None;
    }
    let asked = bytes(
        pvc.spec
            .as_ref()?
            .resources
            .as_ref()?
            .requests
            .as_ref()?
            .get("storage")?,
    )
    .ok()?;
    let has = bytes(spec.capacity.as_ref()?.get("storage")?).ok()?;
    (asked > has).then(|| Resize {
        volume_id: csi.volume_handle.clone(),
        bytes: asked,
    })
}

/// What to do about one PersistentVolume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VolumeDecision {
    Ignore,
    /// Released with reclaim policy Delete: delete the storage, then the object.
    Delete {
        volume_id: String,
    },
}

/// The node a volume of this driver is pinned to.
pub fn volume_node(pv: &PersistentVolume) -> Option<&str> {
    let terms = &pv
        .spec
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required
        .as_ref()?
        .node_selector_terms;
    terms
        .iter()
        .flat_map(|t| t.match_expressions.iter().flatten())
        .find_map(|r| {
            (r.key == TOPOLOGY_KEY && r.operator == "In")
                .then(|| r.values.as_ref()?.first().map(String::as_str))
                .flatten()
        })
}

pub fn decide_volume(pv: &PersistentVolume, node: &str) -> VolumeDecision {
    let Some(spec) = pv.spec.as_ref() else {
        return VolumeDecision::Ignore;
    };
    let Some(csi) = spec.csi.as_ref().filter(|c| c.driver == DRIVER_NAME) else {
        return VolumeDecision::Ignore;
    };
    if ann(&pv.metadata, ANN_PROVISIONED_BY) != Some(DRIVER_NAME) || volume_node(pv) != Some(node) {
        return VolumeDecision::Ignore;
    }
    let released = pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released");
    let delete = spec.persistent_volume_reclaim_policy.as_deref() == Some("Delete");
    if released && delete {
        VolumeDecision::Delete {
            volume_id: csi.volume_handle.clone(),
        }
    } else {
        VolumeDecision::Ignore
    }
}

#[cfg(test)]
mod tests;

pub mod snapshot;
