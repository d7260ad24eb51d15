//! PersistentVolume binder executor: binds claims to volumes (PV claimRef first, then the
//! claim's volumeName, then both statuses, as upstream orders it so a crash in between is
//! repaired by the next pass), marks claims for dynamic provisioning, and moves volumes
//! through Available / Bound / Released per their reclaim policy.

pub mod plan;

use std::sync::Arc;
use std::time::Duration;

use ferro_runtime::events::Recorder;
use ferro_runtime::{spawn_resync, spawn_workers, Change, Informer, Next, ObjectKey, WorkQueue};
use k8s_openapi::api::core::v1::{Node, ObjectReference, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, ResourceExt as _};
use serde_json::json;

use crate::controllers::explain::{ExplainError, Explanation, Subject};
use crate::controllers::manager::{Informers, Options};
use self::plan::{ClaimAction, VolumeAction};
use crate::controllers::{is_conflict, is_not_found, Error};

/// Keys of the two kinds this loop reconciles.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Key {
    Claim(ObjectKey),
    Volume(String),
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Key::Claim(k) => write!(f, "claim {k}"),
            Key::Volume(v) => write!(f, "volume {v}"),
        }
    }
}

/// A claim and the volume it names.
pub fn keys_for_claim(pvc: &PersistentVolumeClaim) -> Vec<Key> {
    let mut keys = vec![Key::Claim(ObjectKey::of(pvc))];
    keys.extend(pvc.spec.as_ref().and_then(|s| s.volume_name.clone()).map(Key::Volume));
    keys
}

/// A volume and the claim its claimRef names; a new volume may also satisfy any claim not bound
/// yet (`claims` lists them all; it is only called for a new volume).
pub fn keys_for_volume(change: &Change<PersistentVolume>, claims: impl FnOnce() -> Vec<Arc<PersistentVolumeClaim>>) -> Vec<Key> {
    let pv = change.object();
    let mut keys = vec![Key::Volume(pv.name_any())];
    if let Some(r) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) {
        keys.push(Key::Claim(ObjectKey::new(r.namespace.as_deref(), r.name.as_deref().unwrap_or_default())));
    }
    if let Change::Applied { old: None, .. } = change {
        keys.extend(
            claims()
                .iter()
                .filter(|pvc| pvc.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound"))
                .map(|pvc| Key::Claim(ObjectKey::of(pvc.as_ref()))),
        );
    }
    keys
}

/// What the workers share.
struct Context {
    client: kube::Client,
    claims: Arc<Informer<PersistentVolumeClaim>>,
    volumes: Arc<Informer<PersistentVolume>>,
    classes: Arc<Informer<StorageClass>>,
    nodes: Arc<Informer<Node>>,
    recorder: Recorder,
}

pub fn start(inf: &Arc<Informers>, opts: &Options) {
    let queue: WorkQueue<Key> = WorkQueue::new();
    let claims = inf.claims();
    let volumes = inf.volumes();
    let classes = inf.storage_classes();
    let nodes = inf.nodes();
    {
        let q = queue.clone();
        claims.on_change(move |c| {
            for k in keys_for_claim(c.object()) {
                q.add(k);
            }
        });
    }
    {
        let (q, claims) = (queue.clone(), claims.clone());
        volumes.on_change(move |c| {
            for k in keys_for_volume(c, || claims.list()) {
                q.add(k);
            }
        });
    }
    {
        let (c, v) = (claims.clone(), volumes.clone());
        spawn_resync(queue.clone(), opts.resync.min(Duration::from_secs(15)), move || {
            c.keys().into_iter().map(Key::Claim).chain(v.keys().into_iter().map(|k| Key::Volume(k.name))).collect()
        });
    }
    let client = inf.client();
    let ctx = Arc::new(Context { recorder: Recorder::new(client.clone(), "persistentvolume-controller"), client, claims, volumes, classes, nodes });
    {
        let ctx = ctx.clone();
        inf.explain().register("persistentvolume-binder", Arc::new(move |key| Box::pin(explain(ctx.clone(), key))));
    }
    spawn_workers("persistentvolume-binder", queue, 2, move |key: Key| reconcile(ctx.clone(), key));
}

/// A dry run of the claim pass for one claim: the volume it would bind, the provisioner it
/// would ask, or why it stays Pending.
async fn explain(ctx: Arc<Context>, key: ObjectKey) -> Result<Explanation, ExplainError> {
    let Context { claims, volumes, classes, nodes, .. } = &*ctx;
    claims.wait_synced().await;
    volumes.wait_synced().await;
    classes.wait_synced().await;
    let pvc = claims.get(key.namespace.as_deref(), &key.name).ok_or_else(|| ExplainError::not_found("persistentvolumeclaims", &key))?;
    let all = volumes.list();
    let pvs: Vec<&PersistentVolume> = all.iter().map(|v| v.as_ref()).collect();
    let class_name = plan::claim_class(&pvc).to_string();
    let class = (!class_name.is_empty()).then(|| classes.get(None, &class_name)).flatten();
    let selected = pvc.annotations().get(plan::ANN_SELECTED_NODE).cloned();
    let selected_node = selected.as_deref().and_then(|n| nodes.get(None, n));
    let mut e = Explanation::new("persistentvolume-binder", Subject::of(pvc.as_ref()));
    let spec = pvc.spec.clone().unwrap_or_default();
    e.observed = json!({
        "phase": pvc.status.as_ref().and_then(|s| s.phase.clone()),
        "volumeName": spec.volume_name,
        "storageClass": class_name,
        "classExists": class.is_some(),
        "selectedNode": selected,
        "availableVolumes": pvs.iter().filter(|v| v.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Available"))
            .filter(|v| plan::volume_class(v) == class_name).map(|v| v.name_any()).collect::<Vec<_>>(),
    });
    e.wants = json!({
        "accessModes": spec.access_modes,
        "storage": spec.resources.as_ref().and_then(|r| r.requests.as_ref()).and_then(|r| r.get("storage")).map(|q| q.0.clone()),
        "provisioner": class.as_ref().map(|c| c.provisioner.clone()),
        "volumeBindingMode": class.as_ref().and_then(|c| c.volume_binding_mode.clone()).unwrap_or_else(|| "Immediate".into()),
    });
    match plan::plan_claim_on_node(&pvc, &pvs, class.as_deref(), selected_node.as_deref()) {
        ClaimAction::None => {
            if pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound") {
                e.waiting.push(format!("nothing to do: bound to {}", spec.volume_name.unwrap_or_default()));
            } else if let Some(p) = pvc.annotations().get(plan::ANN_STORAGE_PROVISIONER) {
                e.waiting.push(format!("waits for the provisioner {p} to create a volume (or for a matching volume to appear)"));
            } else {
                e.waiting.push("waits for a matching Available volume: none fits the class, size, access modes, selector and volume mode, and no provisioner is asked".into());
            }
        }
        ClaimAction::WaitForFirstConsumer => {
            e.waiting.push("waits for the first pod using it to be scheduled (WaitForFirstConsumer)".into());
        }
        ClaimAction::Bind { volume } => e.actions.push(format!("bind to PersistentVolume {volume} (claimRef first, then volumeName, then both phases Bound)")),
        ClaimAction::Provision { provisioner } => {
            e.actions.push(format!("ask the provisioner {provisioner} for a volume (volume.kubernetes.io/storage-provisioner)"))
        }
        ClaimAction::SetPhase(p) => e.actions.push(format!("set the claim's phase to {p}")),
    }
    Ok(e)
}

/// One pass over a claim (bind, provision or wait) or a volume (phase, release, reclaim).
#[tracing::instrument(name = "reconcile", skip_all, fields(controller = "persistentvolume-binder", key = %key))]
async fn reconcile(ctx: Arc<Context>, key: Key) -> Result<Next, Error> {
    let Context { client, claims, volumes, classes, nodes, recorder } = &*ctx;
    claims.wait_synced().await;
    volumes.wait_synced().await;
    classes.wait_synced().await;
    let r = match key {
        Key::Claim(k) => claim(client, recorder, claims, volumes, classes, nodes, &k).await,
        Key::Volume(v) => volume(client, claims, volumes, &v).await,
    };
    match r {
        Err(Error::Kube(e)) if is_conflict(&e) => Ok(Next::After(Duration::from_millis(200))),
        other => other,
    }
}

async fn claim(
    client: &kube::Client,
    recorder: &Recorder,
    claims: &ferro_runtime::Informer<PersistentVolumeClaim>,
    volumes: &ferro_runtime::Informer<PersistentVolume>,
    classes: &ferro_runtime::Informer<k8s_openapi::api::storage::v1::StorageClass>,
    nodes: &ferro_runtime::Informer<k8s_openapi::api::core::v1::Node>,
    key: &ObjectKey,
) -> Result<Next, Error> {
    let Some(pvc) = claims.get(key.namespace.as_deref(), &key.name) else { return Ok(Next::Done) };
    let ns = key.namespace.clone().unwrap_or_default();
    let all = volumes.list();
    let pvs: Vec<&PersistentVolume> = all.iter().map(|v| v.as_ref()).collect();
    let class = pvc.spec.as_ref().and_then(|s| s.storage_class_name.clone()).and_then(|c| classes.get(None, &c));
    let selected = pvc.annotations().get(plan::ANN_SELECTED_NODE).and_then(|n| nodes.get(None, n));
    let capi: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    let vapi: Api<PersistentVolume> = Api::all(client.clone());
    match plan::plan_claim_on_node(&pvc, &pvs, class.as_deref(), selected.as_deref()) {
        ClaimAction::None => {}
        ClaimAction::WaitForFirstConsumer => {
            // upstream's event, repeated on each sync (the recorder counts repeats)
            recorder.record(pvc.as_ref(), "Normal", "WaitForFirstConsumer", "waiting for first consumer to be created before binding".into());
            if pvc.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Pending") {
                capi.patch_status(&key.name, &PatchParams::default(), &Patch::Merge(&json!({"status": {"phase": "Pending"}}))).await?;
            }
        }
        ClaimAction::Bind { volume } => {
            let Some(pv) = volumes.get(None, &volume) else { return Ok(Next::After(Duration::from_millis(200))) };
            // 1. the volume points at the claim
            let claim_ref = ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("PersistentVolumeClaim".into()),
                namespace: Some(ns.clone()),
                name: Some(key.name.clone()),
                uid: pvc.metadata.uid.clone(),
                resource_version: pvc.resource_version(),
                ..Default::default()
            };
            let bound_ref = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()).is_some_and(|r| r.uid == pvc.metadata.uid);
            if !bound_ref {
                let patch = json!({"metadata": {"resourceVersion": pv.resource_version(), "annotations": {"pv.kubernetes.io/bound-by-controller": "yes"}}, "spec": {"claimRef": claim_ref}});
                vapi.patch(&volume, &PatchParams::default(), &Patch::Merge(&patch)).await?;
            }
            let mut phase = json!({"status": {"phase": "Bound"}});
            phase["metadata"] = json!({});
            vapi.patch_status(&volume, &PatchParams::default(), &Patch::Merge(&phase)).await?;
            // 2. the claim points at the volume
            let patch = json!({"metadata": {"resourceVersion": pvc.resource_version(), "annotations": {
                "pv.kubernetes.io/bind-completed": "yes", "pv.kubernetes.io/bound-by-controller": "yes"}},
                "spec": {"volumeName": volume}});
            let updated = capi.patch(&key.name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
            // 3. the claim's status
            let spec = pv.spec.clone().unwrap_or_default();
            let status = json!({"status": {"phase": "Bound", "accessModes": spec.access_modes, "capacity": spec.capacity}});
            let _ = updated;
            capi.patch_status(&key.name, &PatchParams::default(), &Patch::Merge(&status)).await?;
            tracing::info!(claim = %key, volume, "bound");
        }
        ClaimAction::Provision { provisioner } => {
            recorder.record(
                pvc.as_ref(),
                "Normal",
                "ExternalProvisioning",
                format!("Waiting for a volume to be created either by the external provisioner '{provisioner}' or manually by the system administrator. If volume creation is delayed, please verify that the provisioner is running and correctly registered."),
            );
            let patch = json!({"metadata": {"annotations": {
                "volume.kubernetes.io/storage-provisioner": provisioner,
                "volume.beta.kubernetes.io/storage-provisioner": provisioner}}});
            capi.patch(&key.name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
            if pvc.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Pending") {
                capi.patch_status(&key.name, &PatchParams::default(), &Patch::Merge(&json!({"status": {"phase": "Pending"}}))).await?;
            }
        }
        ClaimAction::SetPhase(phase) => {
            if pvc.status.as_ref().and_then(|s| s.phase.as_deref()) != Some(phase.as_str()) {
                capi.patch_status(&key.name, &PatchParams::default(), &Patch::Merge(&json!({"status": {"phase": phase}}))).await?;
            }
        }
    }
    Ok(Next::Done)
}

async fn volume(
    client: &kube::Client,
    claims: &ferro_runtime::Informer<PersistentVolumeClaim>,
    volumes: &ferro_runtime::Informer<PersistentVolume>,
    name: &str,
) -> Result<Next, Error> {
    let Some(pv) = volumes.get(None, name) else { return Ok(Next::Done) };
    let claim = pv
        .spec
        .as_ref()
        .and_then(|s| s.claim_ref.as_ref())
        .and_then(|r| claims.get(r.namespace.as_deref(), r.name.as_deref().unwrap_or_default()));
    let vapi: Api<PersistentVolume> = Api::all(client.clone());
    match plan::plan_volume(&pv, claim.as_deref()) {
        VolumeAction::None => {}
        VolumeAction::SetPhase(phase) => {
            if pv.status.as_ref().and_then(|s| s.phase.as_deref()) != Some(phase.as_str()) {
                let mut status = json!({"phase": phase, "reason": null, "message": null});
                if let Some((reason, message)) = plan::failure_of(&pv) {
                    status["reason"] = json!(reason);
                    status["message"] = json!(message);
                }
                vapi.patch_status(name, &PatchParams::default(), &Patch::Merge(&json!({"status": status}))).await?;
            }
        }
        VolumeAction::ClearClaimRef => {
            // a binding the controller made is undone; a user's pre-binding keeps its name
            let patch = if pv.annotations().contains_key(plan::ANN_BOUND_BY_CONTROLLER) {
                json!({"metadata": {"resourceVersion": pv.resource_version(), "annotations": {plan::ANN_BOUND_BY_CONTROLLER: null}},
                    "spec": {"claimRef": null}})
            } else {
                json!({"metadata": {"resourceVersion": pv.resource_version()}, "spec": {"claimRef": {"uid": null, "resourceVersion": null}}})
            };
            vapi.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
            vapi.patch_status(name, &PatchParams::default(), &Patch::Merge(&json!({"status": {"phase": "Available"}}))).await?;
        }
        VolumeAction::Delete => match vapi.delete(name, &DeleteParams::default()).await {
            Ok(_) => tracing::info!(volume = name, "deleted released volume (reclaim policy Delete)"),
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(e.into()),
        },
    }
    Ok(Next::Done)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn claim(name: &str, volume: Option<&str>, phase: &str) -> Arc<PersistentVolumeClaim> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "ns"},
                "spec": {"volumeName": volume},
                "status": {"phase": phase}
            }))
            .unwrap(),
        )
    }

    fn volume(claim: Option<&str>) -> Arc<PersistentVolume> {
        let claim_ref = claim.map(|c| json!({"namespace": "ns", "name": c}));
        Arc::new(serde_json::from_value(json!({"metadata": {"name": "pv1"}, "spec": {"claimRef": claim_ref}})).unwrap())
    }

    fn c(name: &str) -> Key {
        Key::Claim(ObjectKey::new(Some("ns"), name))
    }

    fn no_claims() -> Vec<Arc<PersistentVolumeClaim>> {
        panic!("only a new volume looks at every claim")
    }

    #[test]
    fn a_claim_maps_to_itself_and_its_volume() {
        assert_eq!(keys_for_claim(&claim("data", Some("pv1"), "Bound")), [c("data"), Key::Volume("pv1".into())]);
        assert_eq!(keys_for_claim(&claim("data", None, "Pending")), [c("data")]);
    }

    #[test]
    fn a_volume_maps_to_itself_and_its_claim() {
        let bound = volume(Some("data"));
        assert_eq!(keys_for_volume(&Change::Applied { old: Some(bound.clone()), new: bound.clone() }, no_claims), [
            Key::Volume("pv1".into()),
            c("data")
        ]);
        // a deleted volume: its claim is lost
        assert_eq!(keys_for_volume(&Change::Deleted(bound), no_claims), [Key::Volume("pv1".into()), c("data")]);
    }

    #[test]
    fn a_new_volume_also_maps_to_every_claim_not_bound_yet() {
        let claims = vec![claim("a", None, "Pending"), claim("b", Some("pv0"), "Bound"), claim("c", None, "Lost")];
        assert_eq!(keys_for_volume(&Change::Applied { old: None, new: volume(None) }, || claims), [
            Key::Volume("pv1".into()),
            c("a"),
            c("c")
        ]);
    }
}
