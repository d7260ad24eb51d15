//! A StatefulSet pod's identity and storage (upstream `stateful_set_utils.go`): ordinals and
//! names, the pod made from a template, its claims, and the owner references the claim
//! retention policy asks for.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimVolumeSource, Pod, PodTemplateSpec, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

/// The pod label carrying the pod's name.
pub const POD_NAME_LABEL: &str = "statefulset.kubernetes.io/pod-name";
/// The pod label carrying the pod's ordinal.
pub const POD_INDEX_LABEL: &str = "apps.kubernetes.io/pod-index";
/// The pod label carrying the name of the ControllerRevision the pod was made from.
pub const REVISION_LABEL: &str = "controller-revision-hash";

pub const RETAIN: &str = "Retain";
pub const DELETE: &str = "Delete";

/// The set's name.
pub fn set_name(set: &StatefulSet) -> &str {
    set.metadata.name.as_deref().unwrap_or_default()
}

/// Upstream `getParentNameAndOrdinal`: `<parent>-<ordinal>`.
pub fn parent_and_ordinal(pod_name: &str) -> Option<(&str, i32)> {
    let (parent, ord) = pod_name.rsplit_once('-')?;
    if ord.is_empty() || !ord.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((parent, ord.parse().ok()?))
}

/// The ordinal of a pod of this set, `None` when its name is not `<set>-<ordinal>`.
pub fn ordinal_of(set: &StatefulSet, pod: &Pod) -> Option<i32> {
    let name = pod.metadata.name.as_deref()?;
    parent_and_ordinal(name).filter(|(p, _)| *p == set_name(set)).map(|(_, o)| o)
}

/// `spec.ordinals.start` (0 by default).
pub fn start_ordinal(set: &StatefulSet) -> i32 {
    set.spec.as_ref().and_then(|s| s.ordinals.as_ref()).and_then(|o| o.start).unwrap_or(0).max(0)
}

/// `spec.replicas` (1 by default).
pub fn replicas(set: &StatefulSet) -> i32 {
    set.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1).max(0)
}

/// Whether an ordinal is within `[start, start + replicas)`.
pub fn in_range(set: &StatefulSet, ordinal: i32) -> bool {
    let start = start_ordinal(set);
    ordinal >= start && ordinal < start + replicas(set)
}

/// `<set>-<ordinal>`.
pub fn pod_name(set: &StatefulSet, ordinal: i32) -> String {
    format!("{}-{ordinal}", set_name(set))
}

/// `<template>-<set>-<ordinal>`.
pub fn claim_name(set: &StatefulSet, template: &str, ordinal: i32) -> String {
    format!("{template}-{}-{ordinal}", set_name(set))
}

/// The (whenDeleted, whenScaled) retention policy, Retain by default.
pub fn retention(set: &StatefulSet) -> (&str, &str) {
    let p = set.spec.as_ref().and_then(|s| s.persistent_volume_claim_retention_policy.as_ref());
    let get = |v: Option<&String>| match v.map(String::as_str) {
        Some(DELETE) => DELETE,
        _ => RETAIN,
    };
    (get(p.and_then(|p| p.when_deleted.as_ref())), get(p.and_then(|p| p.when_scaled.as_ref())))
}

fn templates(set: &StatefulSet) -> &[PersistentVolumeClaim] {
    set.spec.as_ref().and_then(|s| s.volume_claim_templates.as_deref()).unwrap_or_default()
}

/// The controller reference to the set, for pods and revisions.
pub fn controller_ref(set: &StatefulSet) -> OwnerReference {
    OwnerReference {
        api_version: "apps/v1".into(),
        kind: "StatefulSet".into(),
        name: set_name(set).to_string(),
        uid: set.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// The claims of an ordinal (upstream `getPersistentVolumeClaims`), in template order: each
/// template's metadata and spec, named `<template>-<set>-<ordinal>`, labelled with the template's
/// labels and the selector's matchLabels. Owner references per the retention policy are added
/// by [`claim_owners`] (the set's when `whenDeleted` is Delete; a pod's only once it exists).
pub fn claims_for(set: &StatefulSet, ordinal: i32) -> Vec<PersistentVolumeClaim> {
    let match_labels = set.spec.as_ref().and_then(|s| s.selector.match_labels.clone()).unwrap_or_default();
    templates(set)
        .iter()
        .map(|t| {
            let tname = t.metadata.name.clone().unwrap_or_default();
            let mut labels = t.metadata.labels.clone().unwrap_or_default();
            labels.extend(match_labels.clone());
            let mut claim = PersistentVolumeClaim {
                metadata: ObjectMeta {
                    name: Some(claim_name(set, &tname, ordinal)),
                    namespace: set.metadata.namespace.clone(),
                    labels: Some(labels),
                    annotations: t.metadata.annotations.clone(),
                    ..ObjectMeta::default()
                },
                spec: t.spec.clone(),
                status: None,
            };
            claim.metadata.owner_references = Some(claim_owners(set, &[], ordinal, None));
            claim
        })
        .collect()
}

/// The (template name, claim name) pairs of an ordinal.
pub fn claim_names(set: &StatefulSet, ordinal: i32) -> Vec<(String, String)> {
    templates(set)
        .iter()
        .map(|t| {
            let tname = t.metadata.name.clone().unwrap_or_default();
            let cname = claim_name(set, &tname, ordinal);
            (tname, cname)
        })
        .collect()
}

fn same_owner(r: &OwnerReference, kind: &str, name: &str, uid: &str) -> bool {
    r.kind == kind && r.name == name && r.uid == uid
}

/// The owner references a claim of `ordinal` should have (upstream
/// `updateClaimOwnerRefForSetAndPod`), starting from `current`: per (whenDeleted, whenScaled),
/// a reference to the set (Delete when deleted, and the pod is in range) and one to the pod
/// (Delete when scaled, and the pod is out of range); references to others are kept. `pod` is
/// the pod's (name, uid), when it exists.
pub fn claim_owners(set: &StatefulSet, current: &[OwnerReference], ordinal: i32, pod: Option<(&str, &str)>) -> Vec<OwnerReference> {
    let (when_deleted, when_scaled) = retention(set);
    let scaled_down = !in_range(set, ordinal);
    let set_uid = set.metadata.uid.clone().unwrap_or_default();
    let want_set = when_deleted == DELETE && !(when_scaled == DELETE && scaled_down);
    let want_pod = when_scaled == DELETE && scaled_down;
    let mut refs: Vec<OwnerReference> = current
        .iter()
        .filter(|r| !same_owner(r, "StatefulSet", set_name(set), &set_uid))
        .filter(|r| !pod.is_some_and(|(n, u)| same_owner(r, "Pod", n, u)))
        .cloned()
        .collect();
    let had = |kind: &str, name: &str, uid: &str| current.iter().position(|r| same_owner(r, kind, name, uid));
    // keep the order references had, appending new ones
    let mut add: Vec<(usize, OwnerReference)> = Vec::new();
    if want_set {
        let r = controller_ref(set);
        add.push((had("StatefulSet", &r.name, &r.uid).unwrap_or(usize::MAX), r));
    }
    if let (true, Some((name, uid))) = (want_pod, pod) {
        let r = OwnerReference {
            api_version: "v1".into(),
            kind: "Pod".into(),
            name: name.to_string(),
            uid: uid.to_string(),
            controller: None,
            block_owner_deletion: None,
        };
        add.push((had("Pod", name, uid).unwrap_or(usize::MAX), r));
    }
    add.sort_by_key(|(i, _)| *i);
    for (i, r) in add {
        if i == usize::MAX {
            refs.push(r);
        } else {
            refs.insert(i.min(refs.len()), r);
        }
    }
    refs
}

/// Whether a claim still belongs to an earlier pod of the same name (upstream
/// `PodClaimIsStale`): with whenScaled Delete, a reference to a pod of that name whose uid is
/// not `uid` (a pod about to be created has none) means the claim is waiting for the garbage
/// collector.
pub fn claim_is_stale(set: &StatefulSet, claim: &PersistentVolumeClaim, pod_name: &str, uid: Option<&str>) -> bool {
    if retention(set).1 == RETAIN {
        return false;
    }
    claim
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|r| r.kind == "Pod" && r.name == pod_name && Some(r.uid.as_str()) != uid)
}

/// Whether a pod has the identity of its ordinal (upstream `identityMatches`).
pub fn identity_matches(set: &StatefulSet, pod: &Pod, ordinal: i32) -> bool {
    let labels = pod.metadata.labels.as_ref();
    let name = pod.metadata.name.clone().unwrap_or_default();
    pod.metadata.namespace == set.metadata.namespace
        && labels.and_then(|l| l.get(POD_NAME_LABEL)) == Some(&name)
        && labels.and_then(|l| l.get(POD_INDEX_LABEL)) == Some(&ordinal.to_string())
}

/// The identity labels of an ordinal (upstream `updateIdentity`).
pub fn identity_labels(set: &StatefulSet, ordinal: i32) -> BTreeMap<String, String> {
    [
        (POD_NAME_LABEL.to_string(), pod_name(set, ordinal)),
        (POD_INDEX_LABEL.to_string(), ordinal.to_string()),
    ]
    .into_iter()
    .collect()
}

/// The pod of an ordinal made from a template (upstream `newStatefulSetPod` +
/// `setPodRevision`): the template's labels, annotations, finalizers and spec, name
/// `<set>-<ordinal>`, the identity labels, the revision label, hostname = the name, subdomain
/// = serviceName, one volume per claim template (replacing a template volume of the same
/// name), a controller reference to the set.
pub fn new_pod(set: &StatefulSet, template: &PodTemplateSpec, revision: &str, ordinal: i32) -> Pod {
    let tmeta = template.metadata.clone().unwrap_or_default();
    let name = pod_name(set, ordinal);
    let mut labels = tmeta.labels.unwrap_or_default();
    labels.extend(identity_labels(set, ordinal));
    labels.insert(REVISION_LABEL.to_string(), revision.to_string());
    let mut spec = template.spec.clone().unwrap_or_default();
    spec.hostname = Some(name.clone());
    spec.subdomain = set.spec.as_ref().and_then(|s| s.service_name.clone()).filter(|s| !s.is_empty());
    let claims = claim_names(set, ordinal);
    let mut volumes: Vec<Volume> = claims
        .iter()
        .map(|(tname, cname)| Volume {
            name: tname.clone(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource { claim_name: cname.clone(), read_only: None }),
            ..Volume::default()
        })
        .collect();
    volumes.extend(spec.volumes.take().unwrap_or_default().into_iter().filter(|v| !claims.iter().any(|(t, _)| *t == v.name)));
    spec.volumes = (!volumes.is_empty()).then_some(volumes);
    Pod {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: set.metadata.namespace.clone(),
            labels: Some(labels),
            annotations: tmeta.annotations,
            finalizers: tmeta.finalizers,
            owner_references: Some(vec![controller_ref(set)]),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        status: None,
    }
}
