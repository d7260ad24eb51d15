//! Persistent volume binding planner: the binding half of upstream's PV controller
//! (`pkg/controller/volume/persistentvolume`, `syncClaim` / `syncVolume`) and the volume matching
//! it shares with the scheduler (`FindMatchingVolume`).
//!
//! [`plan_claim`] decides what one claim needs (bind, provision, a phase), [`plan_volume`] what
//! one volume needs (a phase, unbinding, deletion), [`best_match`] picks the smallest fitting
//! volume for a claim, optionally on a given node (the scheduler's check).
//!
//! There are no in-tree volume plugins here: every provisioner is external (the controller only
//! annotates the claim), and provisioners named `kubernetes.io/...` (among them
//! `kubernetes.io/no-provisioner`) provision nothing.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_semantics::scheduling::NodeSelector;

use crate::controllers::quantity::{self, Milli};
use crate::selector::LabelSelector;

/// Claim annotation: the binding was completed by the controller.
pub const ANN_BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
/// Claim/volume annotation: the controller (not the user) set volumeName / claimRef.
pub const ANN_BOUND_BY_CONTROLLER: &str = "pv.kubernetes.io/bound-by-controller";
/// Claim annotation naming the provisioner asked to provision a volume for it.
pub const ANN_STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
/// The deprecated form of [`ANN_STORAGE_PROVISIONER`], still set by upstream.
pub const ANN_BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";
/// Claim annotation the scheduler sets for WaitForFirstConsumer provisioning.
pub const ANN_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// Volume annotation naming the provisioner that created it.
pub const ANN_PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
/// The deprecated class annotation, which takes precedence over `storageClassName`.
pub const ANN_BETA_STORAGE_CLASS: &str = "volume.beta.kubernetes.io/storage-class";
/// The provisioner of classes for statically created (local) volumes.
pub const NO_PROVISIONER: &str = "kubernetes.io/no-provisioner";
/// `status.reason` for a volume whose Recycle policy cannot be carried out.
pub const REASON_FAILED_RECYCLE: &str = "VolumeFailedRecycle";
/// `status.message` for a volume whose Recycle policy cannot be carried out (upstream's text
/// when no recycler plugin exists).
pub const MESSAGE_FAILED_RECYCLE: &str = "No recycler plugin found for the volume!";
/// `status.reason` for a volume with an unknown reclaim policy.
pub const REASON_UNKNOWN_RECLAIM_POLICY: &str = "VolumeUnknownReclaimPolicy";
/// `status.message` for a volume with an unknown reclaim policy.
pub const MESSAGE_UNKNOWN_RECLAIM_POLICY: &str =
    "Volume has unrecognized PersistentVolumeReclaimPolicy";

/// What one claim needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimAction {
    /// Nothing to write.
    None,
    /// bind: the executor sets pv.spec.claimRef (uid, rv), then pvc.spec.volumeName, then statuses Bound
    ///
    /// As upstream `bind()`: the volume gets `claimRef` {kind PersistentVolumeClaim, namespace,
    /// name, uid, apiVersion v1, resourceVersion} (plus annotation
    /// `pv.kubernetes.io/bound-by-controller: "yes"` when the controller set it), then phase
    /// Bound; the claim gets `spec.volumeName` (plus `bound-by-controller` when the controller set
    /// it) and annotation `pv.kubernetes.io/bind-completed: "yes"`, then status phase Bound with
    /// `capacity` and `accessModes` copied from the volume. Steps already done are skipped.
    Bind { volume: String },
    /// dynamic provisioning: set annotations volume.kubernetes.io/storage-provisioner=<provisioner> (and the deprecated volume.beta.kubernetes.io/storage-provisioner)
    ///
    /// Upstream also records a Normal event `ExternalProvisioning` "Waiting for a volume to be
    /// created either by the external provisioner '<p>' or manually by the system administrator.
    /// If volume creation is delayed, please verify that the provisioner is running and
    /// correctly registered.". Not returned again once both annotations hold the provisioner.
    Provision { provisioner: String },
    /// Set `status.phase` (e.g. "Pending" or "Lost"); only returned when it differs. For Lost
    /// upstream records a Warning event `ClaimLost` ("Bound claim has lost its
    /// PersistentVolume. Data on the volume is lost!") or `ClaimMisbound` ("Two claims are
    /// bound to the same volume, this one is bound incorrectly").
    SetPhase(String),
    /// The claim's class binds late and no node was selected yet: upstream records a Normal
    /// event `WaitForFirstConsumer` "waiting for first consumer to be created before binding"
    /// on every sync (the event recorder aggregates repeats) and keeps the claim Pending: set
    /// the phase only when it is not Pending yet. Returned on every pass while this holds.
    WaitForFirstConsumer,
}

/// What one volume needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VolumeAction {
    /// Nothing to write.
    None,
    /// Set `status.phase` (Available, Bound, Released, Failed); only returned when it differs.
    /// For Failed the executor also sets `status.reason` / `status.message`: see
    /// [`failure_of`].
    SetPhase(String),
    /// Upstream `unbindVolume`: the claim was bound to another volume. When the volume has the
    /// `pv.kubernetes.io/bound-by-controller` annotation, clear `spec.claimRef` and drop the
    /// annotation; otherwise (the user pre-bound it) keep `claimRef` but clear its `uid` and
    /// `resourceVersion`. Then set phase Available.
    ClearClaimRef,
    /// reclaim Delete, for volumes with no provisioner managing them, or tell the external provisioner by leaving it Released: follow upstream
    ///
    /// Returned for a Released (or Failed) volume with reclaim policy Delete that no provisioner
    /// created (no `pv.kubernetes.io/provisioned-by`): the executor deletes the
    /// PersistentVolume object. Volumes that a provisioner created stay Released; upstream
    /// leaves their deletion to that (external) provisioner, which deletes the storage and the
    /// object. Upstream would mark a static volume without a deleter plugin Failed instead; we
    /// have no volume plugins, so the object is simply deleted.
    Delete,
}

fn ann<'a>(
    meta: &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    key: &str,
) -> Option<&'a str> {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// The class a claim asks for (upstream `GetPersistentVolumeClaimClass`): the beta annotation,
/// else `storageClassName`, else "".
pub fn claim_class(pvc: &PersistentVolumeClaim) -> &str {
    ann(&pvc.metadata, ANN_BETA_STORAGE_CLASS)
        .or_else(|| {
            pvc.spec
                .as_ref()
                .and_then(|s| s.storage_class_name.as_deref())
        })
        .unwrap_or("")
}

/// The class of a volume (upstream `GetPersistentVolumeClass`).
pub fn volume_class(pv: &PersistentVolume) -> &str {
    ann(&pv.metadata, ANN_BETA_STORAGE_CLASS)
        .or_else(|| {
            pv.spec
                .as_ref()
                .and_then(|s| s.storage_class_name.as_deref())
        })
        .unwrap_or("")
}

fn requested(pvc: &PersistentVolumeClaim) -> Milli {
    pvc.spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .map(quantity::of)
        .unwrap_or_default()
}

fn capacity(pv: &PersistentVolume) -> Milli {
    pv.spec
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get("storage"))
        .map(quantity::of)
        .unwrap_or_default()
}

fn pv_modes(pv: &PersistentVolume) -> &[String] {
    pv.spec
        .as_ref()
        .and_then(|s| s.access_modes.as_deref())
        .unwrap_or(&[])
}

fn access_modes_fit(pvc: &PersistentVolumeClaim, pv: &PersistentVolume) -> bool {
    let have = pv_modes(pv);
    pvc.spec
        .as_ref()
        .and_then(|s| s.access_modes.as_ref())
        .is_none_or(|want| want.iter().all(|m| have.contains(m)))
}

fn volume_mode_matches(pvc: &PersistentVolumeClaim, pv: &PersistentVolume) -> bool {
    let a = pvc
        .spec
        .as_ref()
        .and_then(|s| s.volume_mode.as_deref())
        .unwrap_or("Filesystem");
    let b = pv
        .spec
        .as_ref()
        .and_then(|s| s.volume_mode.as_deref())
        .unwrap_or("Filesystem");
    a == b
}

fn pvc_ns(pvc: &PersistentVolumeClaim) -> &str {
    pvc.metadata.namespace.as_deref().unwrap_or("")
}

/// Whether the volume's claimRef names this claim (upstream `IsVolumeBoundToClaim`: same
/// namespace and name, and the uid empty or equal).
pub fn is_bound_to(pv: &PersistentVolume, pvc: &PersistentVolumeClaim) -> bool {
    let Some(r) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
        return false;
    };
    r.name.as_deref() == pvc.metadata.name.as_deref()
        && r.namespace.as_deref().unwrap_or("") == pvc_ns(pvc)
        && r.uid
            .as_deref()
            .is_none_or(|u| u.is_empty() || Some(u) == pvc.metadata.uid.as_deref())
}

fn claim_ref_uid(pv: &PersistentVolume) -> Option<&str> {
    pv.spec
        .as_ref()
        .and_then(|s| s.claim_ref.as_ref())
        .and_then(|r| r.uid.as_deref())
        .filter(|u| !u.is_empty())
}

/// Where a volume's node affinity is checked.
#[derive(Clone, Copy)]
enum NodeCheck<'a> {
    /// Not checked (the PV controller's own path).
    Skip,
    /// Against a real node's labels and name (the scheduler's path).
    Node(&'a Node),
    /// Against a node known only by name (a claim's selected-node annotation): the name and a
    /// `kubernetes.io/hostname` label equal to it.
    Name(&'a str),
}

/// Whether a volume's `spec.nodeAffinity.required` admits a node with these labels and name
/// (upstream `CheckNodeAffinity`: terms ORed, requirements ANDed; no affinity admits all).
pub fn node_affinity_matches(
    pv: &PersistentVolume,
    labels: &BTreeMap<String, String>,
    name: &str,
) -> bool {
    let Some(required) = pv
        .spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
    else {
        return true;
    };
    NodeSelector::new(required).matches(name, labels)
}

fn node_ok(pv: &PersistentVolume, node: NodeCheck<'_>) -> bool {
    match node {
        NodeCheck::Skip => true,
        NodeCheck::Node(n) => node_affinity_matches(
            pv,
            n.metadata.labels.as_ref().unwrap_or(&BTreeMap::new()),
            n.metadata.name.as_deref().unwrap_or(""),
        ),
        NodeCheck::Name(name) => node_affinity_matches(
            pv,
            &BTreeMap::from([("kubernetes.io/hostname".to_string(), name.to_string())]),
            name,
        ),
    }
}

/// Upstream `FindMatchingVolume` over the access-mode index: a volume pre-bound to the claim
/// wins (if big enough, same volume mode, not being deleted, access modes fitting, node
/// affinity fitting); otherwise the smallest Available volume with the claim's class, access
/// modes, capacity, selector, volume mode and node affinity. Late-binding claims on the PV
/// controller's path (`delay_binding` without a node) only take pre-bound volumes.
fn find_matching<'a>(
    pvc: &PersistentVolumeClaim,
    pvs: &[&'a PersistentVolume],
    node: NodeCheck<'_>,
    delay_binding: bool,
) -> Option<&'a PersistentVolume> {
    let want = requested(pvc);
    let class = claim_class(pvc);
    let selector = match pvc.spec.as_ref().and_then(|s| s.selector.as_ref()) {
        Some(s) => Some(LabelSelector::from_api(s).ok()?),
        None => None,
    };
    // upstream's controller path looks through the access-mode index from the volumes with
    // the fewest modes up, so those win over a smaller volume with more modes
    let by_modes = matches!(node, NodeCheck::Skip);
    let mut best: Option<(usize, Milli, &str, &'a PersistentVolume)> = None;
    for &pv in pvs {
        if !access_modes_fit(pvc, pv) {
            continue;
        }
        let bound_elsewhere = pv
            .spec
            .as_ref()
            .and_then(|s| s.claim_ref.as_ref())
            .is_some()
            && !is_bound_to(pv, pvc);
        if bound_elsewhere {
            continue;
        }
        let cap = capacity(pv);
        if cap < want || !volume_mode_matches(pvc, pv) || pv.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let affinity_ok = node_ok(pv, node);
        if is_bound_to(pv, pvc) {
            return affinity_ok.then_some(pv);
        }
        if matches!(node, NodeCheck::Skip) && delay_binding {
            continue;
        }
        if pv.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Available") {
            continue;
        }
        if let Some(sel) = &selector {
            if !sel.matches(pv.metadata.labels.as_ref().unwrap_or(&BTreeMap::new())) {
                continue;
            }
        }
        if volume_class(pv) != class || !affinity_ok {
            continue;
        }
        let modes = if by_modes { pv_modes(pv).len() } else { 0 };
        let name = pv.metadata.name.as_deref().unwrap_or("");
        let better = match &best {
            None => true,
            Some((m, c, n, _)) => (modes, cap, name) < (*m, *c, *n),
        };
        if better {
            best = Some((modes, cap, name, pv));
        }
    }
    best.map(|(_, _, _, pv)| pv)
}

/// The volume a claim should get: a volume pre-bound to it, else the smallest fitting Available
/// one (see the module notes). With `node`, the volume's node affinity must admit that node
/// (the scheduler's check; upstream `FindMatchingVolume` with a node).
pub fn best_match<'a>(
    pvc: &PersistentVolumeClaim,
    pvs: &[&'a PersistentVolume],
    node: Option<&Node>,
) -> Option<&'a PersistentVolume> {
    let check = node.map_or(NodeCheck::Skip, NodeCheck::Node);
    find_matching(pvc, pvs, check, false)
}

fn claim_phase(pvc: &PersistentVolumeClaim) -> Option<&str> {
    pvc.status.as_ref().and_then(|s| s.phase.as_deref())
}

fn pv_phase(pv: &PersistentVolume) -> Option<&str> {
    pv.status.as_ref().and_then(|s| s.phase.as_deref())
}

fn set_claim_phase(pvc: &PersistentVolumeClaim, phase: &str) -> ClaimAction {
    if claim_phase(pvc) == Some(phase) {
        ClaimAction::None
    } else {
        ClaimAction::SetPhase(phase.to_string())
    }
}

/// Bind, unless every step of the binding is already done.
fn bind(pvc: &PersistentVolumeClaim, pv: &PersistentVolume) -> ClaimAction {
    let name = pv.metadata.name.clone().unwrap_or_default();
    let done = is_bound_to(pv, pvc)
        && claim_ref_uid(pv).is_some()
        && pv_phase(pv) == Some("Bound")
        && pvc.spec.as_ref().and_then(|s| s.volume_name.as_deref()) == Some(name.as_str())
        && ann(&pvc.metadata, ANN_BIND_COMPLETED).is_some()
        && claim_phase(pvc) == Some("Bound");
    if done {
        ClaimAction::None
    } else {
        ClaimAction::Bind { volume: name }
    }
}

/// Whether a volume satisfies a claim that asked for it by name (upstream
/// `checkVolumeSatisfyClaim`).
fn satisfies(pv: &PersistentVolume, pvc: &PersistentVolumeClaim) -> bool {
    pv.metadata.deletion_timestamp.is_none()
        && capacity(pv).value() >= requested(pvc).value()
        && volume_class(pv) == claim_class(pvc)
        && volume_mode_matches(pvc, pv)
        && access_modes_fit(pvc, pv)
}

/// Plans one claim (upstream `syncClaim`). `pvs` are all volumes; `class` is the StorageClass
/// the claim names, if it exists.
///
/// A claim bound before (annotation `pv.kubernetes.io/bind-completed`, or phase Bound) whose
/// volume is gone, whose volumeName was cleared, or whose volume names another claim uid
/// becomes Lost; otherwise the binding is (re)completed. An unbound claim with `volumeName`
/// binds to that volume when it is unclaimed and satisfies the claim, or is pre-bound to it;
/// else it stays Pending. An unbound claim without `volumeName` binds to [`best_match`] (for
/// WaitForFirstConsumer classes: only a pre-bound volume, or, once the scheduler set
/// `volume.kubernetes.io/selected-node`, a volume whose node affinity admits that node, known
/// here only by name and `kubernetes.io/hostname`; use [`plan_claim_on_node`] with the Node to
/// check its real labels). With no match: WaitForFirstConsumer while a late-binding class has no
/// selected node, Provision when the class has a provisioner, else Pending.
pub fn plan_claim(
    pvc: &PersistentVolumeClaim,
    pvs: &[&PersistentVolume],
    class: Option<&StorageClass>,
) -> ClaimAction {
    plan_claim_on_node(pvc, pvs, class, None)
}

/// [`plan_claim`], with the Node the claim's `volume.kubernetes.io/selected-node` names (when
/// the executor has it) so a late-binding claim's volumes are checked against its labels.
pub fn plan_claim_on_node(
    pvc: &PersistentVolumeClaim,
    pvs: &[&PersistentVolume],
    class: Option<&StorageClass>,
    selected: Option<&Node>,
) -> ClaimAction {
    let find = |name: &str| {
        pvs.iter()
            .copied()
            .find(|pv| pv.metadata.name.as_deref() == Some(name))
    };
    let volume_name = pvc
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .unwrap_or("");
    let was_bound =
        ann(&pvc.metadata, ANN_BIND_COMPLETED).is_some() || claim_phase(pvc) == Some("Bound");
    if was_bound {
        if volume_name.is_empty() {
            return set_claim_phase(pvc, "Lost");
        }
        let Some(pv) = find(volume_name) else {
            return set_claim_phase(pvc, "Lost");
        };
        return match pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) {
            None => bind(pvc, pv),
            Some(r)
                if r.uid.as_deref().unwrap_or("") == pvc.metadata.uid.as_deref().unwrap_or("") =>
            {
                bind(pvc, pv)
            }
            Some(_) => set_claim_phase(pvc, "Lost"),
        };
    }
    if !volume_name.is_empty() {
        let Some(pv) = find(volume_name) else {
            return set_claim_phase(pvc, "Pending");
        };
        let claimed = pv
            .spec
            .as_ref()
            .and_then(|s| s.claim_ref.as_ref())
            .is_some();
        if !claimed {
            return if satisfies(pv, pvc) {
                bind(pvc, pv)
            } else {
                set_claim_phase(pvc, "Pending")
            };
        }
        return if is_bound_to(pv, pvc) {
            bind(pvc, pv)
        } else {
            set_claim_phase(pvc, "Pending")
        };
    }
    let delay =
        class.is_some_and(|c| c.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer"));
    let selected_node = ann(&pvc.metadata, ANN_SELECTED_NODE).filter(|n| !n.is_empty());
    let found = match (delay, selected_node) {
        (true, Some(name)) => {
            let check = match selected {
                Some(n) if n.metadata.name.as_deref() == Some(name) => NodeCheck::Node(n),
                _ => NodeCheck::Name(name),
            };
            find_matching(pvc, pvs, NodeCheck::Skip, true)
                .or_else(|| find_matching(pvc, pvs, check, false))
        }
        _ => find_matching(pvc, pvs, NodeCheck::Skip, delay),
    };
    if let Some(pv) = found {
        return bind(pvc, pv);
    }
    if delay && selected_node.is_none() {
        return ClaimAction::WaitForFirstConsumer;
    }
    if !claim_class(pvc).is_empty() {
        if let Some(c) = class {
            let p = c.provisioner.as_str();
            if !p.is_empty() && !p.starts_with("kubernetes.io/") {
                let annotated = ann(&pvc.metadata, ANN_STORAGE_PROVISIONER) == Some(p)
                    && ann(&pvc.metadata, ANN_BETA_STORAGE_PROVISIONER) == Some(p);
                return if annotated {
                    ClaimAction::None
                } else {
                    ClaimAction::Provision {
                        provisioner: p.to_string(),
                    }
                };
            }
        }
    }
    set_claim_phase(pvc, "Pending")
}

/// The `status.reason` and `status.message` to set with a Failed phase that [`plan_volume`]
/// returns for this volume (None when the failure is not one of the planner's).
pub fn failure_of(pv: &PersistentVolume) -> Option<(&'static str, &'static str)> {
    match reclaim_policy(pv) {
        "Retain" | "Delete" => None,
        "Recycle" => Some((REASON_FAILED_RECYCLE, MESSAGE_FAILED_RECYCLE)),
        _ => Some((
            REASON_UNKNOWN_RECLAIM_POLICY,
            MESSAGE_UNKNOWN_RECLAIM_POLICY,
        )),
    }
}

fn reclaim_policy(pv: &PersistentVolume) -> &str {
    pv.spec
        .as_ref()
        .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
        .unwrap_or("Retain")
}

fn set_volume_phase(pv: &PersistentVolume, phase: &str) -> VolumeAction {
    if pv_phase(pv) == Some(phase) {
        VolumeAction::None
    } else {
        VolumeAction::SetPhase(phase.to_string())
    }
}

/// Upstream: mark Released once, then `reclaimVolume` (also retried while Failed).
fn release(pv: &PersistentVolume) -> VolumeAction {
    let phase = pv_phase(pv);
    if phase != Some("Released") && phase != Some("Failed") {
        return VolumeAction::SetPhase("Released".into());
    }
    match reclaim_policy(pv) {
        "Retain" => VolumeAction::None,
        "Delete" if ann(&pv.metadata, ANN_PROVISIONED_BY).is_some() => VolumeAction::None,
        "Delete" => VolumeAction::Delete,
        _ => set_volume_phase(pv, "Failed"),
    }
}

/// Plans one volume (upstream `syncVolume`). `claim` is the claim named in claimRef, if it
/// exists.
///
/// No claimRef, or one without uid (pre-bound, waiting for the claim) -> Available. A claimRef
/// whose claim is gone or has another uid -> Released, then per reclaim policy: Retain stays
/// Released; Delete -> [`VolumeAction::Delete`], except for provisioned volumes
/// (`pv.kubernetes.io/provisioned-by`), which stay Released for their provisioner; Recycle (not
/// supported) and unknown policies -> Failed (see [`failure_of`]). Claim bound to this volume
/// -> Bound; claim not bound yet -> nothing (the claim's sync binds it); claim bound to another
/// volume -> a provisioned volume with policy Delete is released, others are unbound
/// ([`VolumeAction::ClearClaimRef`]).
pub fn plan_volume(pv: &PersistentVolume, claim: Option<&PersistentVolumeClaim>) -> VolumeAction {
    let Some(r) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
        return set_volume_phase(pv, "Available");
    };
    let Some(uid) = r.uid.as_deref().filter(|u| !u.is_empty()) else {
        return set_volume_phase(pv, "Available");
    };
    let claim = claim.filter(|c| {
        c.metadata.uid.as_deref() == Some(uid)
            && c.metadata.name == r.name
            && pvc_ns(c) == r.namespace.as_deref().unwrap_or("")
    });
    let Some(claim) = claim else {
        return release(pv);
    };
    let volume_name = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .unwrap_or("");
    if volume_name.is_empty() {
        return VolumeAction::None;
    }
    if Some(volume_name) == pv.metadata.name.as_deref() {
        return set_volume_phase(pv, "Bound");
    }
    if ann(&pv.metadata, ANN_PROVISIONED_BY).is_some() && reclaim_policy(pv) == "Delete" {
        return release(pv);
    }
    VolumeAction::ClearClaimRef
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, ObjectReference,
        PersistentVolumeClaimSpec, PersistentVolumeClaimStatus, PersistentVolumeSpec,
        PersistentVolumeStatus, VolumeNodeAffinity, VolumeResourceRequirements,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
        LabelSelector as ApiSelector, ObjectMeta, Time,
    };

    fn pv(name: &str, size: &str, class: &str) -> PersistentVolume {
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec {
                capacity: Some(BTreeMap::from([("storage".into(), Quantity(size.into()))])),
                access_modes: Some(vec!["ReadWriteOnce".into()]),
                storage_class_name: (!class.is_empty()).then(|| class.into()),
                persistent_volume_reclaim_policy: Some("Retain".into()),
                ..Default::default()
            }),
            status: Some(PersistentVolumeStatus {
                phase: Some("Available".into()),
                ..Default::default()
            }),
        }
    }

    fn pvc(name: &str, size: &str, class: Option<&str>) -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                uid: Some(format!("uid-{name}")),
                ..Default::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(vec!["ReadWriteOnce".into()]),
                resources: Some(VolumeResourceRequirements {
                    requests: Some(BTreeMap::from([("storage".into(), Quantity(size.into()))])),
                    ..Default::default()
                }),
                storage_class_name: class.map(Into::into),
                ..Default::default()
            }),
            status: Some(PersistentVolumeClaimStatus {
                phase: Some("Pending".into()),
                ..Default::default()
            }),
        }
    }

    fn claim_ref(pv: &mut PersistentVolume, name: &str, uid: Option<&str>) {
        pv.spec.as_mut().unwrap().claim_ref = Some(ObjectReference {
            kind: Some("PersistentVolumeClaim".into()),
            namespace: Some("ns".into()),
            name: Some(name.into()),
            uid: uid.map(Into::into),
            ..Default::default()
        });
    }

    fn class(name: &str, provisioner: &str, wffc: bool) -> StorageClass {
        StorageClass {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            provisioner: provisioner.into(),
            volume_binding_mode: Some(
                if wffc {
                    "WaitForFirstConsumer"
                } else {
                    "Immediate"
                }
                .into(),
            ),
            ..Default::default()
        }
    }

    fn bind_to(v: &str) -> ClaimAction {
        ClaimAction::Bind { volume: v.into() }
    }

    #[test]
    fn smallest_fit_wins() {
        let a = pv("a", "10Gi", "fast");
        let b = pv("b", "2Gi", "fast");
        let c = pv("c", "1Gi", "fast");
        let claim = pvc("c1", "1500Mi", Some("fast"));
        assert_eq!(plan_claim(&claim, &[&a, &b, &c], None), bind_to("b"));
        assert_eq!(
            best_match(&claim, &[&a, &b, &c], None)
                .unwrap()
                .metadata
                .name
                .as_deref(),
            Some("b")
        );
        let exact = pv("d", "1500Mi", "fast");
        assert_eq!(plan_claim(&claim, &[&a, &b, &exact], None), bind_to("d"));
    }

    #[test]
    fn each_criterion_filters() {
        let claim = pvc("c1", "1Gi", Some("fast"));
        let mut wrong_class = pv("class", "1Gi", "slow");
        let mut modes = pv("modes", "1Gi", "fast");
        modes.spec.as_mut().unwrap().access_modes = Some(vec!["ReadOnlyMany".into()]);
        let mut block = pv("block", "1Gi", "fast");
        block.spec.as_mut().unwrap().volume_mode = Some("Block".into());
        let mut released = pv("released", "1Gi", "fast");
        released.status.as_mut().unwrap().phase = Some("Released".into());
        let mut taken = pv("taken", "1Gi", "fast");
        claim_ref(&mut taken, "other", None);
        let mut deleting = pv("deleting", "1Gi", "fast");
        deleting.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        let small = pv("small", "1023Mi", "fast");
        let all = [
            &wrong_class,
            &modes,
            &block,
            &released,
            &taken,
            &deleting,
            &small,
        ];
        assert_eq!(best_match(&claim, &all, None), None);
        // claim asking more modes than offered fails; PV with more modes than asked fits
        modes.spec.as_mut().unwrap().access_modes =
            Some(vec!["ReadWriteOnce".into(), "ReadOnlyMany".into()]);
        assert_eq!(plan_claim(&claim, &[&modes], None), bind_to("modes"));
        // fewer modes first on the controller path, even when bigger
        let mut big_rwo = pv("big-rwo", "5Gi", "fast");
        assert_eq!(
            plan_claim(&claim, &[&modes, &big_rwo], None),
            bind_to("big-rwo")
        );
        big_rwo.spec.as_mut().unwrap().access_modes =
            Some(vec!["ReadWriteOnce".into(), "ReadWriteMany".into()]);
        assert_eq!(
            plan_claim(&claim, &[&modes, &big_rwo], None),
            bind_to("modes")
        );
        wrong_class.spec.as_mut().unwrap().storage_class_name = Some("fast".into());
        assert_eq!(plan_claim(&claim, &[&wrong_class], None), bind_to("class"));
    }

    #[test]
    fn empty_class_matches_only_classless_volumes() {
        let classless = pv("none", "1Gi", "");
        let classy = pv("fast", "1Gi", "fast");
        for claim in [pvc("c", "1Gi", Some("")), pvc("c", "1Gi", None)] {
            assert_eq!(
                plan_claim(&claim, &[&classy, &classless], None),
                bind_to("none")
            );
            assert_eq!(
                plan_claim(&claim, &[&classy], None),
                ClaimAction::None,
                "already Pending"
            );
        }
        let mut fresh = pvc("c", "1Gi", Some(""));
        fresh.status = None;
        assert_eq!(
            plan_claim(&fresh, &[&classy], None),
            ClaimAction::SetPhase("Pending".into())
        );
        // the beta annotation wins over storageClassName
        let mut annotated = pvc("c", "1Gi", Some(""));
        annotated.metadata.annotations = Some(BTreeMap::from([(
            ANN_BETA_STORAGE_CLASS.into(),
            "fast".into(),
        )]));
        assert_eq!(
            plan_claim(&annotated, &[&classy, &classless], None),
            bind_to("fast")
        );
    }

    #[test]
    fn selector_matches_volume_labels() {
        let mut claim = pvc("c", "1Gi", Some(""));
        claim.spec.as_mut().unwrap().selector = Some(ApiSelector {
            match_labels: Some(BTreeMap::from([("tier".into(), "db".into())])),
            ..Default::default()
        });
        let plain = pv("plain", "1Gi", "");
        let mut labelled = pv("labelled", "5Gi", "");
        labelled.metadata.labels = Some(BTreeMap::from([("tier".into(), "db".into())]));
        assert_eq!(
            plan_claim(&claim, &[&plain, &labelled], None),
            bind_to("labelled")
        );
        assert_eq!(plan_claim(&claim, &[&plain], None), ClaimAction::None);
    }

    #[test]
    fn pre_bound_volume_wins_both_ways() {
        // volume pre-bound to the claim (claimRef without uid) wins even over class/phase
        let mut pre = pv("pre", "10Gi", "other");
        claim_ref(&mut pre, "c", None);
        pre.status.as_mut().unwrap().phase = Some("Pending".into());
        let small = pv("small", "1Gi", "");
        let claim = pvc("c", "1Gi", Some(""));
        assert_eq!(plan_claim(&claim, &[&small, &pre], None), bind_to("pre"));
        // pre-bound to another claim: not taken
        let mut other = pv("other", "1Gi", "");
        claim_ref(&mut other, "someone", None);
        assert_eq!(plan_claim(&claim, &[&other], None), ClaimAction::None);

        // claim pre-bound to a volume (volumeName)
        let mut named = pvc("c", "1Gi", Some(""));
        named.spec.as_mut().unwrap().volume_name = Some("small".into());
        let big = pv("big", "1Gi", "");
        assert_eq!(plan_claim(&named, &[&big, &small], None), bind_to("small"));
        // ... to a volume that does not satisfy it, or is missing, or is taken: Pending
        let too_small = pv("small", "1Mi", "");
        assert_eq!(plan_claim(&named, &[&too_small], None), ClaimAction::None);
        let mut fresh = named.clone();
        fresh.status = None;
        assert_eq!(
            plan_claim(&fresh, &[], None),
            ClaimAction::SetPhase("Pending".into())
        );
        let mut taken = pv("small", "1Gi", "");
        claim_ref(&mut taken, "someone", Some("u"));
        assert_eq!(
            plan_claim(&fresh, &[&taken], None),
            ClaimAction::SetPhase("Pending".into())
        );
        // ... to a volume already claimed for it: finish the binding
        let mut mine = pv("small", "1Gi", "");
        claim_ref(&mut mine, "c", Some("uid-c"));
        assert_eq!(plan_claim(&named, &[&mine], None), bind_to("small"));
    }

    fn bound_pair() -> (PersistentVolumeClaim, PersistentVolume) {
        let mut claim = pvc("c", "1Gi", Some(""));
        claim.spec.as_mut().unwrap().volume_name = Some("v".into());
        claim.metadata.annotations =
            Some(BTreeMap::from([(ANN_BIND_COMPLETED.into(), "yes".into())]));
        claim.status.as_mut().unwrap().phase = Some("Bound".into());
        let mut vol = pv("v", "1Gi", "");
        claim_ref(&mut vol, "c", Some("uid-c"));
        vol.status.as_mut().unwrap().phase = Some("Bound".into());
        (claim, vol)
    }

    #[test]
    fn bound_claim_is_stable_and_lost_when_volume_goes() {
        let (claim, vol) = bound_pair();
        assert_eq!(plan_claim(&claim, &[&vol], None), ClaimAction::None);
        assert_eq!(plan_volume(&vol, Some(&claim)), VolumeAction::None);
        assert_eq!(
            plan_claim(&claim, &[], None),
            ClaimAction::SetPhase("Lost".into())
        );
        let mut misbound = vol.clone();
        claim_ref(&mut misbound, "c", Some("another-uid"));
        assert_eq!(
            plan_claim(&claim, &[&misbound], None),
            ClaimAction::SetPhase("Lost".into())
        );
        let mut lost = claim.clone();
        lost.status.as_mut().unwrap().phase = Some("Lost".into());
        assert_eq!(plan_claim(&lost, &[], None), ClaimAction::None);
        // volume lost its claimRef: bind again
        let mut unbound = vol.clone();
        unbound.spec.as_mut().unwrap().claim_ref = None;
        assert_eq!(plan_claim(&claim, &[&unbound], None), bind_to("v"));
        // half-done binding: bind again
        let mut half = claim.clone();
        half.status.as_mut().unwrap().phase = Some("Pending".into());
        half.metadata.annotations = None;
        assert_eq!(plan_claim(&half, &[&vol], None), bind_to("v"));
    }

    #[test]
    fn wait_for_first_consumer() {
        let wffc = class("local", NO_PROVISIONER, true);
        let mut claim = pvc("c", "1Gi", Some("local"));
        claim.status = None;
        let mut local = pv("local-n1", "1Gi", "local");
        local.spec.as_mut().unwrap().node_affinity = Some(VolumeNodeAffinity {
            required: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_expressions: Some(vec![NodeSelectorRequirement {
                        key: "kubernetes.io/hostname".into(),
                        operator: "In".into(),
                        values: Some(vec!["n1".into()]),
                    }]),
                    match_fields: None,
                }],
            }),
        });
        // no selected node: wait, do not bind
        assert_eq!(
            plan_claim(&claim, &[&local], Some(&wffc)),
            ClaimAction::WaitForFirstConsumer
        );
        claim.status = Some(PersistentVolumeClaimStatus {
            phase: Some("Pending".into()),
            ..Default::default()
        });
        assert_eq!(
            plan_claim(&claim, &[&local], Some(&wffc)),
            ClaimAction::WaitForFirstConsumer
        );
        // selected node that the volume admits: bind
        claim.metadata.annotations =
            Some(BTreeMap::from([(ANN_SELECTED_NODE.into(), "n1".into())]));
        assert_eq!(
            plan_claim(&claim, &[&local], Some(&wffc)),
            bind_to("local-n1")
        );
        // another node: no static match, no real provisioner: Pending
        claim.metadata.annotations =
            Some(BTreeMap::from([(ANN_SELECTED_NODE.into(), "n2".into())]));
        assert_eq!(
            plan_claim(&claim, &[&local], Some(&wffc)),
            ClaimAction::None
        );
        // with the Node object its labels count
        let n2 = Node {
            metadata: ObjectMeta {
                name: Some("n2".into()),
                labels: Some(BTreeMap::from([(
                    "kubernetes.io/hostname".into(),
                    "n1".into(),
                )])),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(
            plan_claim_on_node(&claim, &[&local], Some(&wffc), Some(&n2)),
            bind_to("local-n1")
        );
        assert!(best_match(&claim, &[&local], Some(&n2)).is_some());
        let mut n3 = n2.clone();
        n3.metadata.labels = None;
        assert!(best_match(&claim, &[&local], Some(&n3)).is_none());
        // with a provisioner: provision once the node is selected, wait before
        let csi = class("csi", "csi.example.com", true);
        claim.spec.as_mut().unwrap().storage_class_name = Some("csi".into());
        assert_eq!(
            plan_claim(&claim, &[&local], Some(&csi)),
            ClaimAction::Provision {
                provisioner: "csi.example.com".into()
            }
        );
        claim.metadata.annotations = None;
        claim.status = None;
        assert_eq!(
            plan_claim(&claim, &[], Some(&csi)),
            ClaimAction::WaitForFirstConsumer
        );
    }

    #[test]
    fn node_affinity_operators() {
        let mut v = pv("v", "1Gi", "");
        let term = |key: &str, op: &str, values: &[&str]| NodeSelectorTerm {
            match_expressions: Some(vec![NodeSelectorRequirement {
                key: key.into(),
                operator: op.into(),
                values: Some(values.iter().map(|s| s.to_string()).collect()),
            }]),
            match_fields: None,
        };
        v.spec.as_mut().unwrap().node_affinity = Some(VolumeNodeAffinity {
            required: Some(NodeSelector {
                node_selector_terms: vec![term("zone", "In", &["a"]), term("gen", "Gt", &["3"])],
            }),
        });
        let labels = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert!(node_affinity_matches(&v, &labels(&[("zone", "a")]), "x"));
        assert!(node_affinity_matches(&v, &labels(&[("gen", "4")]), "x"));
        assert!(!node_affinity_matches(&v, &labels(&[("gen", "3")]), "x"));
        v.spec.as_mut().unwrap().node_affinity = Some(VolumeNodeAffinity {
            required: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_expressions: None,
                    match_fields: Some(vec![NodeSelectorRequirement {
                        key: "metadata.name".into(),
                        operator: "In".into(),
                        values: Some(vec!["n1".into()]),
                    }]),
                }],
            }),
        });
        assert!(node_affinity_matches(&v, &BTreeMap::new(), "n1"));
        assert!(!node_affinity_matches(&v, &BTreeMap::new(), "n2"));
    }

    #[test]
    fn provisioning() {
        let csi = class("fast", "csi.example.com", false);
        let mut claim = pvc("c", "1Gi", Some("fast"));
        assert_eq!(
            plan_claim(&claim, &[], Some(&csi)),
            ClaimAction::Provision {
                provisioner: "csi.example.com".into()
            }
        );
        claim.metadata.annotations = Some(BTreeMap::from([
            (ANN_STORAGE_PROVISIONER.into(), "csi.example.com".into()),
            (
                ANN_BETA_STORAGE_PROVISIONER.into(),
                "csi.example.com".into(),
            ),
        ]));
        assert_eq!(plan_claim(&claim, &[], Some(&csi)), ClaimAction::None);
        // a matching static volume is preferred
        let v = pv("v", "1Gi", "fast");
        assert_eq!(plan_claim(&claim, &[&v], Some(&csi)), bind_to("v"));
        // no-provisioner and missing classes: Pending
        let none = class("fast", NO_PROVISIONER, false);
        let mut fresh = pvc("c", "1Gi", Some("fast"));
        fresh.status = None;
        assert_eq!(
            plan_claim(&fresh, &[], Some(&none)),
            ClaimAction::SetPhase("Pending".into())
        );
        assert_eq!(
            plan_claim(&fresh, &[], None),
            ClaimAction::SetPhase("Pending".into())
        );
        // the provisioned volume (pre-bound by the provisioner) then binds
        let mut made = pv("pvc-1", "1Gi", "fast");
        claim_ref(&mut made, "c", Some("uid-c"));
        made.status.as_mut().unwrap().phase = Some("Bound".into());
        assert_eq!(plan_claim(&claim, &[&made], Some(&csi)), bind_to("pvc-1"));
    }

    #[test]
    fn volume_phases() {
        let free = pv("v", "1Gi", "");
        assert_eq!(plan_volume(&free, None), VolumeAction::None);
        let mut fresh = free.clone();
        fresh.status = None;
        assert_eq!(
            plan_volume(&fresh, None),
            VolumeAction::SetPhase("Available".into())
        );
        let mut pre = fresh.clone();
        claim_ref(&mut pre, "c", None);
        assert_eq!(
            plan_volume(&pre, None),
            VolumeAction::SetPhase("Available".into())
        );
        let (claim, mut vol) = bound_pair();
        vol.status.as_mut().unwrap().phase = Some("Available".into());
        assert_eq!(
            plan_volume(&vol, Some(&claim)),
            VolumeAction::SetPhase("Bound".into())
        );
        // claim not bound yet: wait for the claim's sync
        let mut pending = claim.clone();
        pending.spec.as_mut().unwrap().volume_name = None;
        assert_eq!(plan_volume(&vol, Some(&pending)), VolumeAction::None);
        // claim bound elsewhere: unbind
        let mut elsewhere = claim.clone();
        elsewhere.spec.as_mut().unwrap().volume_name = Some("other".into());
        assert_eq!(
            plan_volume(&vol, Some(&elsewhere)),
            VolumeAction::ClearClaimRef
        );
        // ... unless provisioned for it with Delete: release for the provisioner
        vol.metadata.annotations = Some(BTreeMap::from([(
            ANN_PROVISIONED_BY.into(),
            "csi.example.com".into(),
        )]));
        vol.spec.as_mut().unwrap().persistent_volume_reclaim_policy = Some("Delete".into());
        assert_eq!(
            plan_volume(&vol, Some(&elsewhere)),
            VolumeAction::SetPhase("Released".into())
        );
    }

    #[test]
    fn release_per_reclaim_policy() {
        let (claim, bound) = bound_pair();
        let released = |policy: &str, provisioned: bool| {
            let mut v = bound.clone();
            v.spec.as_mut().unwrap().persistent_volume_reclaim_policy = Some(policy.into());
            if provisioned {
                v.metadata.annotations = Some(BTreeMap::from([(
                    ANN_PROVISIONED_BY.into(),
                    "csi.example.com".into(),
                )]));
            }
            v
        };
        for policy in ["Retain", "Delete", "Recycle"] {
            let v = released(policy, false);
            assert_eq!(
                plan_volume(&v, None),
                VolumeAction::SetPhase("Released".into()),
                "{policy}"
            );
            // a new claim with the same name is not the bound one
            let mut same_name = claim.clone();
            same_name.metadata.uid = Some("new".into());
            assert_eq!(
                plan_volume(&v, Some(&same_name)),
                VolumeAction::SetPhase("Released".into())
            );
        }
        let after = |mut v: PersistentVolume| {
            v.status.as_mut().unwrap().phase = Some("Released".into());
            plan_volume(&v, None)
        };
        assert_eq!(after(released("Retain", false)), VolumeAction::None);
        assert_eq!(after(released("Delete", false)), VolumeAction::Delete);
        assert_eq!(after(released("Delete", true)), VolumeAction::None);
        assert_eq!(
            after(released("Recycle", false)),
            VolumeAction::SetPhase("Failed".into())
        );
        assert_eq!(
            failure_of(&released("Recycle", false)),
            Some((REASON_FAILED_RECYCLE, MESSAGE_FAILED_RECYCLE))
        );
        assert_eq!(
            after(released("Bogus", false)),
            VolumeAction::SetPhase("Failed".into())
        );
        let mut failed = released("Recycle", false);
        failed.status.as_mut().unwrap().phase = Some("Failed".into());
        assert_eq!(plan_volume(&failed, None), VolumeAction::None);
    }
}
