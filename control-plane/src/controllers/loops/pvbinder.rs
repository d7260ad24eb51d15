//! PersistentVolume binder executor: binds claims to volumes (PV claimRef first, then the
//! claim's volumeName, then both statuses, as upstream orders it so a crash in between is
//! repaired by the next pass), marks claims for dynamic provisioning, and moves volumes
//! through Available / Bound / Released per their reclaim policy.

use std::sync::Arc;
use std::time::Duration;

use ferro_runtime::events::Recorder;
use ferro_runtime::{spawn_resync, spawn_workers, Next, ObjectKey, WorkQueue};
use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume, PersistentVolumeClaim};
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, ResourceExt as _};
use serde_json::json;

use crate::controllers::manager::{Informers, Options};
use crate::controllers::pvbinder::{self as plan, ClaimAction, VolumeAction};
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

pub fn start(inf: &Arc<Informers>, opts: &Options) {
    let queue: WorkQueue<Key> = WorkQueue::new();
    let claims = inf.claims();
    let volumes = inf.volumes();
    let classes = inf.storage_classes();
    let nodes = inf.nodes();
    {
        let q = queue.clone();
        claims.on_change(move |c| {
            let pvc = c.object();
            q.add(Key::Claim(ObjectKey::of(pvc.as_ref())));
            if let Some(v) = pvc.spec.as_ref().and_then(|s| s.volume_name.clone()) {
                q.add(Key::Volume(v));
            }
        });
    }
    {
        let q = queue.clone();
        volumes.on_change(move |c| {
            let pv = c.object();
            q.add(Key::Volume(pv.name_any()));
            if let Some(r) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) {
                q.add(Key::Claim(ObjectKey::new(r.namespace.as_deref(), r.name.as_deref().unwrap_or_default())));
            }
        });
    }
    {
        // a new volume may satisfy a pending claim
        let (q, claims2) = (queue.clone(), claims.clone());
        volumes.on_change(move |c| {
            if let ferro_runtime::Change::Applied { old: None, .. } = c {
                for pvc in claims2.list() {
                    if pvc.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound") {
                        q.add(Key::Claim(ObjectKey::of(pvc.as_ref())));
                    }
                }
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
    let recorder = Recorder::new(client.clone(), "persistentvolume-controller");
    spawn_workers("persistentvolume-binder", queue, 2, move |key: Key| {
        let (client, claims, volumes, classes, nodes, recorder) =
            (client.clone(), claims.clone(), volumes.clone(), classes.clone(), nodes.clone(), recorder.clone());
        async move {
            claims.wait_synced().await;
            volumes.wait_synced().await;
            classes.wait_synced().await;
            let r = match key {
                Key::Claim(k) => claim(&client, &recorder, &claims, &volumes, &classes, &nodes, &k).await,
                Key::Volume(v) => volume(&client, &claims, &volumes, &v).await,
            };
            match r {
                Err(Error::Kube(e)) if is_conflict(&e) => Ok(Next::After(Duration::from_millis(200))),
                other => other,
            }
        }
    });
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
