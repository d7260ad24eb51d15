//! The decisions of inline volumes (CSI's "Ephemeral" lifecycle mode, a pod's `volumes[].csi`
//! in Kubernetes): a NodePublishVolume whose volume context says
//! `csi.storage.k8s.io/ephemeral: "true"` makes a node-local volume for the volume ID the CO
//! chose, ferro-csi stages it at a staging dir of its own and binds it to the target path;
//! NodeUnpublishVolume takes all of it away again (target, staging mount, loop device,
//! backing file, record). The volume goes through the same journal and pool as a
//! CreateVolume's. Pure: the engine (`volume/ephemeral.rs`) observes the host and applies
//! the steps decided here.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::{
    capability, decide_create, min_size, size_for, CreateDecision, CreateWant, Op, Params,
    PlanError, Step, Use, PARAM_PROVISIONING,
};
use crate::proto::{CapacityRange, VolumeCapability};
use crate::volume::host::PathKind;
use crate::volume::names::ephemeral_volume_id;
use crate::volume::record::{AccessKind, State, VolumeRecord};

/// The volume context key kubelet sets (with the CSIDriver's podInfoOnMount) to say whether
/// the volume is an inline one ("true") or a persistent one ("false").
pub const CONTEXT_EPHEMERAL: &str = "csi.storage.k8s.io/ephemeral";
/// The volume attribute giving an inline volume's size, as a Kubernetes quantity (`64Mi`).
pub const ATTR_SIZE: &str = "size";
/// The size of an inline volume whose attributes name none: the size a CreateVolume without
/// a capacity range gets (1 GiB, thin: it takes pool, not disk, until it is written).
pub const DEFAULT_EPHEMERAL_SIZE: u64 = super::DEFAULT_SIZE;
/// Prefix of the keys kubelet adds to the volume context (pod name, namespace, uid, service
/// account, ephemeral): they carry no meaning for the volume.
const KUBELET_PREFIX: &str = "csi.storage.k8s.io/";

/// Whether a NodePublishVolume is for an inline volume: its volume context says so.
pub fn is_ephemeral(context: &HashMap<String, String>) -> Result<bool, PlanError> {
    match context.get(CONTEXT_EPHEMERAL).map(String::as_str) {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(other) => Err(PlanError::InvalidArgument(format!(
            "volume context {CONTEXT_EPHEMERAL}: {other:?} is neither \"true\" nor \"false\""
        ))),
    }
}

/// An inline volume's NodePublishVolume, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EphemeralWant {
    /// The volume ID the CO chose (the record's name).
    pub handle: String,
    /// The volume to make (its ID is [`ephemeral_volume_id`] of the handle).
    pub create: CreateWant,
    /// The capability: a filesystem, its type and mount flags.
    pub wanted: Use,
    pub readonly: bool,
}

/// Parses the `size` attribute with Kubernetes' quantity rules: a positive number of bytes
/// (a fraction of a byte rounds up, as upstream's Value).
fn parse_size(value: &str) -> Result<u64, PlanError> {
    let bad =
        |why: String| PlanError::InvalidArgument(format!("volume attribute {ATTR_SIZE}: {why}"));
    let q = k8s_semantics::quantity::Quantity::parse(value).map_err(|e| bad(e.to_string()))?;
    match q.value() {
        Some(v) if v > 0 && v <= i128::from(i64::MAX) => Ok(v as u64),
        Some(_) => Err(bad(format!("{value:?} is not a positive number of bytes"))),
        None => Err(bad(format!("{value:?} is too large"))),
    }
}

/// Checks an inline volume's NodePublishVolume: the CO's volume ID, a mount capability (an
/// inline volume is a filesystem), and the volume attributes ferro-csi knows: `size` (a
/// quantity; [`DEFAULT_EPHEMERAL_SIZE`] when absent) and `provisioning` (thin or thick, as
/// the StorageClass parameter). The keys kubelet adds (`csi.storage.k8s.io/...`) are ignored;
/// any other key is refused, so a typo is not silently a default.
pub fn ephemeral_want(
    handle: &str,
    context: &HashMap<String, String>,
    cap: &VolumeCapability,
    readonly: bool,
) -> Result<EphemeralWant, PlanError> {
    if handle.is_empty() {
        return Err(PlanError::InvalidArgument("volume id missing".into()));
    }
    let wanted = capability(cap)?;
    if wanted.access != AccessKind::Mount {
        return Err(PlanError::InvalidArgument(
            "an inline (ephemeral) volume is a filesystem: block access is not offered".into(),
        ));
    }
    let mut size = None;
    let mut params = HashMap::new();
    let mut keys: Vec<&String> = context.keys().collect();
    keys.sort();
    for key in keys {
        let value = &context[key];
        match key.as_str() {
            ATTR_SIZE => size = Some(parse_size(value)?),
            PARAM_PROVISIONING => {
                params.insert(key.clone(), value.clone());
            }
            k if k.starts_with(KUBELET_PREFIX) => {}
            other => {
                return Err(PlanError::InvalidArgument(format!(
                    "unknown volume attribute {other:?} (ferro-csi knows {ATTR_SIZE:?} and {PARAM_PROVISIONING:?})"
                )))
            }
        }
    }
    let params = Params::parse(&params)?;
    let required = size.unwrap_or(DEFAULT_EPHEMERAL_SIZE);
    let range = CapacityRange {
        required_bytes: i64::try_from(required).unwrap_or(i64::MAX),
        limit_bytes: 0,
    };
    let size = size_for(Some(&range), min_size(AccessKind::Mount, wanted.fs))?;
    Ok(EphemeralWant {
        handle: handle.to_string(),
        create: CreateWant {
            id: ephemeral_volume_id(handle),
            name: handle.to_string(),
            size,
            params,
            access: AccessKind::Mount,
            source: None,
            ephemeral: true,
        },
        wanted,
        readonly,
    })
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EphemeralDecision {
    /// A removal (NodeUnpublishVolume, or a failed publish's roll-back) was cut short: finish
    /// it, then make the volume anew.
    RemoveFirst(VolumeRecord),
    /// Make, finish or reuse the volume, as for a CreateVolume.
    Create(CreateDecision),
}

/// What to do with the record found under an inline volume's ID. A second publish of the
/// same volume reuses it; a different size, provisioning or filesystem is AlreadyExists.
pub fn decide_ephemeral(
    existing: Option<&VolumeRecord>,
    want: &EphemeralWant,
) -> Result<EphemeralDecision, PlanError> {
    if let Some(rec) = existing.filter(|r| r.ephemeral && r.name == want.handle) {
        if rec.state == State::Deleting {
            return Ok(EphemeralDecision::RemoveFirst(rec.clone()));
        }
        let asked = want.wanted.fs_or_default();
        if let Some(has) = rec.formatted.filter(|has| *has != asked) {
            return Err(PlanError::AlreadyExists(format!(
                "inline volume {:?} exists with fsType {} (asked {})",
                want.handle,
                has.as_str(),
                asked.as_str()
            )));
        }
    }
    decide_create(existing, &want.create).map(EphemeralDecision::Create)
}

/// Whether a NodeUnpublishVolume of an inline volume at `target` removes the volume: yes,
/// unless another target its record names still holds a mount (`mount_points`: every mount
/// point on the host now); a removal already under way is finished.
pub fn unpublish_removes(rec: &VolumeRecord, target: &Path, mount_points: &[PathBuf]) -> bool {
    rec.state == State::Deleting
        || !rec
            .published
            .iter()
            .any(|p| p != target && mount_points.contains(p))
}

/// A NodeUnpublishVolume for a volume ID that names nothing of ferro-csi's, not shaped like
/// a CreateVolume's ID: an inline volume an earlier call removed (its answer lost), so the
/// call succeeds, as the spec's idempotency asks, unless something is mounted at the target
/// (that is not ferro-csi's to unmount).
pub fn unpublish_gone(handle: &str, target: &Path, target_mounted: bool) -> Result<(), PlanError> {
    if target_mounted {
        return Err(PlanError::NotFound(format!(
            "volume {handle:?} does not exist, and {} holds a mount ferro-csi does not know",
            target.display()
        )));
    }
    Ok(())
}

/// A path the removal of an inline volume looks at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathSeen {
    pub path: PathBuf,
    pub kind: Option<PathKind>,
    /// Something is mounted on it.
    pub mounted: bool,
}

/// What the host shows of an inline volume being removed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemovalSeen {
    pub backing: bool,
    pub device: Option<PathBuf>,
    /// Mount points that still use the device.
    pub device_users: Vec<PathBuf>,
    /// The target paths it was published at.
    pub targets: Vec<PathSeen>,
    /// ferro-csi's staging dir for it.
    pub staging: PathSeen,
}

/// The next step of removing an inline volume, in the order that never pulls anything from
/// under a user: unmount the targets and remove them, unmount the staging dir, detach the
/// loop device once nothing mounts it, remove the staging dir, then the backing file (the
/// engine removes the record when this says done). Each step is decided from a fresh
/// observation, so a removal cut short anywhere resumes where it stopped.
pub fn removal_step(disk: &Path, seen: &RemovalSeen) -> Result<Step, PlanError> {
    if let Some(t) = seen.targets.iter().find(|t| t.mounted) {
        return Ok(Step::Do(Op::Unmount {
            target: t.path.clone(),
        }));
    }
    if let Some(t) = seen.targets.iter().find(|t| t.kind.is_some()) {
        return Ok(Step::Do(Op::RemovePath {
            path: t.path.clone(),
        }));
    }
    if seen.staging.mounted {
        return Ok(Step::Do(Op::Unmount {
            target: seen.staging.path.clone(),
        }));
    }
    if let Some(device) = &seen.device {
        if let Some(user) = seen.device_users.first() {
            return Err(PlanError::FailedPrecondition(format!(
                "{} is still mounted at {}, which ferro-csi did not publish: not detaching it",
                device.display(),
                user.display()
            )));
        }
        return Ok(Step::Do(Op::Detach {
            device: device.clone(),
        }));
    }
    if seen.staging.kind.is_some() {
        return Ok(Step::Do(Op::RemovePath {
            path: seen.staging.path.clone(),
        }));
    }
    if seen.backing {
        return Ok(Step::Do(Op::RemoveFile {
            path: disk.to_path_buf(),
        }));
    }
    Ok(Step::Done)
}

#[cfg(test)]
mod tests;
