//! Volume snapshot controller (the external-snapshotter's common snapshot-controller): binds
//! VolumeSnapshots to VolumeSnapshotContents, creates the contents of dynamic snapshots, keeps
//! the snapshots' status, finalizers and events, and deletes contents with their snapshots.
//! Taking and deleting the storage snapshot is the CSI driver's side (its sidecar's job; in
//! ferro, ferro-csi's provisioner on the node that holds the volume).

pub mod plan;

use std::sync::Arc;

use api_ext::snapshot::v1::{self as snap, VolumeSnapshot, VolumeSnapshotClass, VolumeSnapshotContent};
use ferro_runtime::events::Recorder;
use ferro_runtime::{spawn_resync, spawn_workers, Change, Informer, Next, ObjectKey, WorkQueue};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt as _};
use serde_json::json;

use self::plan::Op;
use crate::controllers::explain::{ExplainError, Explanation, Subject};
use crate::controllers::manager::{Informers, Options};
use crate::controllers::{is_conflict, is_not_found, Error};

/// A snapshot changed.
pub fn keys_for_snapshot(change: &Change<VolumeSnapshot>) -> Vec<ObjectKey> {
    vec![ObjectKey::of(change.object().as_ref())]
}

/// A content changed: the snapshot its `volumeSnapshotRef` names.
pub fn keys_for_content(change: &Change<VolumeSnapshotContent>) -> Vec<ObjectKey> {
    let r = &change.object().spec.volume_snapshot_ref;
    match (r.namespace.as_deref(), r.name.as_deref()) {
        (Some(ns), Some(name)) if !ns.is_empty() && !name.is_empty() => vec![ObjectKey::new(Some(ns), name)],
        _ => Vec::new(),
    }
}

/// A claim changed: the snapshot it is restored from, and the snapshots taken of it
/// (`snapshots_of` lists the snapshots of its namespace).
pub fn keys_for_claim(change: &Change<PersistentVolumeClaim>, snapshots_of: impl FnOnce(&str) -> Vec<Arc<VolumeSnapshot>>) -> Vec<ObjectKey> {
    let claim = change.object();
    let ns = claim.namespace().unwrap_or_default();
    let mut keys: Vec<ObjectKey> = plan::restore_source(claim).map(|s| ObjectKey::new(Some(&ns), s)).into_iter().collect();
    let name = claim.name_any();
    keys.extend(
        snapshots_of(&ns)
            .iter()
            .filter(|s| s.spec.source.persistent_volume_claim_name.as_deref() == Some(name.as_str()))
            .map(|s| ObjectKey::of(s.as_ref())),
    );
    keys
}

struct Context {
    client: kube::Client,
    recorder: Recorder,
    snapshots: Arc<Informer<VolumeSnapshot>>,
    contents: Arc<Informer<VolumeSnapshotContent>>,
    classes: Arc<Informer<VolumeSnapshotClass>>,
    claims: Arc<Informer<PersistentVolumeClaim>>,
    volumes: Arc<Informer<PersistentVolume>>,
}

pub fn start(inf: &Arc<Informers>, opts: &Options) {
    let queue: WorkQueue<ObjectKey> = WorkQueue::new();
    let (snapshots, contents, classes) = (inf.volume_snapshots(), inf.volume_snapshot_contents(), inf.volume_snapshot_classes());
    let (claims, volumes) = (inf.claims(), inf.volumes());
    {
        let q = queue.clone();
        snapshots.on_change(move |c| keys_for_snapshot(c).into_iter().for_each(|k| q.add(k)));
        let q = queue.clone();
        contents.on_change(move |c| keys_for_content(c).into_iter().for_each(|k| q.add(k)));
        let q = queue.clone();
        let snaps = snapshots.clone();
        claims.on_change(move |c| {
            keys_for_claim(c, |ns| snaps.list().into_iter().filter(|s| s.namespace().as_deref() == Some(ns)).collect())
                .into_iter()
                .for_each(|k| q.add(k))
        });
        // A class appearing (or becoming the default) may unblock snapshots waiting for one.
        let q = queue.clone();
        let snaps = snapshots.clone();
        classes.on_change(move |_c: &Change<VolumeSnapshotClass>| {
            for s in snaps.list().iter().filter(|s| s.status.as_ref().and_then(|st| st.ready_to_use) != Some(true)) {
                q.add(ObjectKey::of(s.as_ref()));
            }
        });
    }
    {
        let snaps = snapshots.clone();
        spawn_resync(queue.clone(), opts.resync, move || snaps.list().iter().map(|s| ObjectKey::of(s.as_ref())).collect());
    }
    let ctx = Arc::new(Context {
        recorder: Recorder::new(inf.client(), "snapshot-controller"),
        client: inf.client(),
        snapshots,
        contents,
        classes,
        claims,
        volumes,
    });
    {
        let ctx = ctx.clone();
        inf.explain().register("volumesnapshot", Arc::new(move |key| Box::pin(explain(ctx.clone(), key))));
    }
    spawn_workers("snapshot-controller", queue, 2, move |key: ObjectKey| reconcile(ctx.clone(), key));
}

/// One pass over a VolumeSnapshot (or over the contents of one that is gone).
#[tracing::instrument(name = "reconcile", skip_all, fields(controller = "snapshot-controller", key = %key))]
async fn reconcile(ctx: Arc<Context>, key: ObjectKey) -> Result<Next, Error> {
    ctx.snapshots.wait_synced().await;
    ctx.contents.wait_synced().await;
    ctx.classes.wait_synced().await;
    ctx.claims.wait_synced().await;
    ctx.volumes.wait_synced().await;
    let ns = key.namespace.clone().unwrap_or_default();
    let Some(s) = ctx.snapshots.get(Some(&ns), &key.name) else {
        let contents = ctx.contents.list();
        let mine: Vec<&VolumeSnapshotContent> = contents
            .iter()
            .map(AsRef::as_ref)
            .filter(|c| c.spec.volume_snapshot_ref.namespace.as_deref() == Some(ns.as_str()) && c.spec.volume_snapshot_ref.name.as_deref() == Some(key.name.as_str()))
            .collect();
        let ops = plan::plan_orphaned(&mine);
        apply(&ctx, None, &ns, ops).await?;
        return Ok(Next::Done);
    };
    let ops = plan_for(&ctx, &s).0;
    apply(&ctx, Some(&s), &ns, ops).await?;
    Ok(Next::Done)
}

/// The planner's operations for a snapshot, from the caches, and whether a claim is being
/// restored from it.
fn plan_for(ctx: &Context, s: &VolumeSnapshot) -> (Vec<Op>, bool, Option<Arc<VolumeSnapshotContent>>) {
    let ns = s.namespace().unwrap_or_default();
    let name = s.name_any();
    let uid = s.metadata.uid.clone().unwrap_or_default();
    let content_name = s
        .spec
        .source
        .volume_snapshot_content_name
        .clone()
        .unwrap_or_else(|| snap::content_name_for(&uid));
    let content = ctx.contents.get(None, &content_name);
    let classes = ctx.classes.list();
    let class_refs: Vec<&VolumeSnapshotClass> = classes.iter().map(AsRef::as_ref).collect();
    let claim = s.spec.source.persistent_volume_claim_name.as_deref().and_then(|c| ctx.claims.get(Some(&ns), c));
    let volume = claim
        .as_ref()
        .and_then(|c| c.spec.as_ref())
        .and_then(|sp| sp.volume_name.as_deref())
        .filter(|v| !v.is_empty())
        .and_then(|v| ctx.volumes.get(None, v));
    let restoring = ctx
        .claims
        .list()
        .iter()
        .filter(|c| c.namespace().as_deref() == Some(ns.as_str()))
        .any(|c| plan::restore_source(c) == Some(name.as_str()) && plan::being_provisioned(c));
    let claim_busy_elsewhere = claim.as_ref().is_some_and(|c| {
        let name = c.name_any();
        ctx.snapshots.list().iter().any(|o| {
            o.metadata.uid != s.metadata.uid
                && o.namespace().as_deref() == Some(ns.as_str())
                && o.metadata.deletion_timestamp.is_none()
                && o.spec.source.persistent_volume_claim_name.as_deref() == Some(name.as_str())
                && o.status.as_ref().is_none_or(|st| st.ready_to_use != Some(true) && st.error.is_none())
        })
    });
    let inputs = plan::Inputs {
        snapshot: s,
        content: content.as_deref(),
        classes: &class_refs,
        claim: claim.as_deref(),
        volume: volume.as_deref(),
        restoring,
        claim_busy_elsewhere,
        now: Time(jiff::Timestamp::from_second(jiff::Timestamp::now().as_second()).unwrap_or_default()),
    };
    (plan::plan(&inputs), restoring, content)
}

/// A dry run of [`reconcile`] for one VolumeSnapshot.
async fn explain(ctx: Arc<Context>, key: ObjectKey) -> Result<Explanation, ExplainError> {
    ctx.snapshots.wait_synced().await;
    ctx.contents.wait_synced().await;
    ctx.classes.wait_synced().await;
    ctx.claims.wait_synced().await;
    ctx.volumes.wait_synced().await;
    let s = ctx
        .snapshots
        .get(key.namespace.as_deref(), &key.name)
        .ok_or_else(|| ExplainError::not_found("volumesnapshots.snapshot.storage.k8s.io", &key))?;
    let (ops, restoring, content) = plan_for(&ctx, &s);
    let mut e = Explanation::new("volumesnapshot", Subject::of(s.as_ref()));
    let st = s.status.clone().unwrap_or_default();
    e.observed = serde_json::json!({
        "source": s.spec.source,
        "content": content.as_ref().map(|c| serde_json::json!({
            "name": c.name_any(),
            "readyToUse": c.status.as_ref().and_then(|s| s.ready_to_use),
            "snapshotHandle": c.status.as_ref().and_then(|s| s.snapshot_handle.clone()),
        })),
        "readyToUse": st.ready_to_use,
    });
    e.wants = serde_json::json!({"class": s.spec.volume_snapshot_class_name, "readyToUse": true});
    for op in &ops {
        e.actions.push(match op {
            Op::AddFinalizers(f) => format!("add the finalizers {}", f.join(", ")),
            Op::RemoveFinalizers(f) => format!("remove the finalizers {}", f.join(", ")),
            Op::SetClass(c) => format!("set the class to {c} (the default of the claim's driver)"),
            Op::CreateContent(c) => format!("create VolumeSnapshotContent {}", c.name_any()),
            Op::BindContent { content, .. } => format!("bind the pre-provisioned VolumeSnapshotContent {content}"),
            Op::AddContentFinalizer(c) => format!("add the bound-protection finalizer to VolumeSnapshotContent {c}"),
            Op::AnnotateContentBeingDeleted(c) => format!("mark VolumeSnapshotContent {c} as being deleted"),
            Op::DeleteContent(c) => format!("delete VolumeSnapshotContent {c}"),
            Op::ClaimFinalizer { claim, add } => {
                format!("{} the pvc-as-source-protection finalizer of claim {claim}", if *add { "add" } else { "remove" })
            }
            Op::Status(_) => "write the status from the content".to_string(),
            Op::Event { warning, reason, message } => {
                format!("record {} event {reason}: {message}", if *warning { "Warning" } else { "Normal" })
            }
        });
    }
    if restoring && s.metadata.deletion_timestamp.is_some() {
        e.waiting.push("the deletion waits: a claim is being restored from this snapshot".into());
    }
    if let Some(err) = st.error.as_ref().and_then(|e| e.message.clone()) {
        e.waiting.push(format!("the snapshot failed: {err}"));
    } else if st.ready_to_use != Some(true) {
        match content.as_ref() {
            Some(c) => e.waiting.push(format!(
                "waits for the CSI driver's snapshotter to take the snapshot of VolumeSnapshotContent {}",
                c.name_any()
            )),
            None if ops.is_empty() => e.waiting.push("waits for its VolumeSnapshotContent".into()),
            None => {}
        }
    }
    Ok(e)
}

/// Applies the planner's operations in order; the first failure ends the pass (the key is
/// retried, and the next plan starts from what was done).
async fn apply(ctx: &Context, s: Option<&VolumeSnapshot>, ns: &str, ops: Vec<Op>) -> Result<(), Error> {
    let snaps: Api<VolumeSnapshot> = Api::namespaced(ctx.client.clone(), ns);
    let contents: Api<VolumeSnapshotContent> = Api::all(ctx.client.clone());
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), ns);
    let pp = PatchParams::default();
    let name = s.map(|s| s.name_any()).unwrap_or_default();
    for op in ops {
        tracing::debug!(?op, "apply");
        match op {
            Op::AddFinalizers(add) | Op::RemoveFinalizers(add) if s.is_none() || add.is_empty() => {}
            Op::AddFinalizers(add) => {
                let Some(s) = s else { continue };
                let list = plan::with_finalizers(&s.metadata, &add, &[]);
                let patch = json!({"metadata": {"resourceVersion": s.resource_version(), "finalizers": list}});
                snaps.patch(&name, &pp, &Patch::Merge(&patch)).await?;
            }
            Op::RemoveFinalizers(remove) => {
                let Some(s) = s else { continue };
                let list = plan::with_finalizers(&s.metadata, &[], &remove);
                let patch = json!({"metadata": {"resourceVersion": s.resource_version(), "finalizers": list}});
                match snaps.patch(&name, &pp, &Patch::Merge(&patch)).await {
                    Err(e) if is_not_found(&e) => {}
                    r => {
                        r?;
                    }
                }
            }
            Op::SetClass(class) => {
                snaps.patch(&name, &pp, &Patch::Merge(&json!({"spec": {"volumeSnapshotClassName": class}}))).await?;
            }
            Op::CreateContent(c) => match contents.create(&PostParams::default(), &c).await {
                Err(e) if is_conflict(&e) => {}
                r => {
                    r?;
                }
            },
            Op::BindContent { content, uid } => {
                let Some(c) = ctx.contents.get(None, &content) else { continue };
                let list = plan::with_finalizers(&c.metadata, &[snap::CONTENT_BOUND_FINALIZER], &[]);
                let patch = json!({
                    "metadata": {"resourceVersion": c.resource_version(), "finalizers": list},
                    "spec": {"volumeSnapshotRef": {"uid": uid}},
                });
                contents.patch(&content, &pp, &Patch::Merge(&patch)).await?;
            }
            Op::AddContentFinalizer(content) => {
                let Some(c) = ctx.contents.get(None, &content) else { continue };
                let list = plan::with_finalizers(&c.metadata, &[snap::CONTENT_BOUND_FINALIZER], &[]);
                let patch = json!({"metadata": {"resourceVersion": c.resource_version(), "finalizers": list}});
                contents.patch(&content, &pp, &Patch::Merge(&patch)).await?;
            }
            Op::AnnotateContentBeingDeleted(content) => {
                let patch = json!({"metadata": {"annotations": {snap::BEING_DELETED: "yes"}}});
                match contents.patch(&content, &pp, &Patch::Merge(&patch)).await {
                    Err(e) if is_not_found(&e) => {}
                    r => {
                        r?;
                    }
                }
            }
            Op::DeleteContent(content) => match contents.delete(&content, &DeleteParams::default()).await {
                Err(e) if is_not_found(&e) => {}
                r => {
                    r?;
                }
            },
            Op::ClaimFinalizer { claim, add } => {
                let Some(c) = ctx.claims.get(Some(ns), &claim) else { continue };
                let list = if add {
                    plan::with_finalizers(&c.metadata, &[snap::PVC_AS_SOURCE_FINALIZER], &[])
                } else {
                    plan::with_finalizers(&c.metadata, &[], &[snap::PVC_AS_SOURCE_FINALIZER])
                };
                let patch = json!({"metadata": {"resourceVersion": c.resource_version(), "finalizers": list}});
                claims.patch(&claim, &pp, &Patch::Merge(&patch)).await?;
            }
            Op::Status(st) => {
                snaps.patch_status(&name, &pp, &Patch::Merge(&json!({"status": st}))).await?;
            }
            Op::Event { warning, reason, message } => {
                if let Some(s) = s {
                    ctx.recorder.record(s, if warning { "Warning" } else { "Normal" }, reason, message);
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn snapshot(ns: &str, name: &str, claim: &str) -> Arc<VolumeSnapshot> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": ns, "uid": "u1"},
                "spec": {"source": {"persistentVolumeClaimName": claim}},
            }))
            .unwrap(),
        )
    }

    #[test]
    fn a_content_maps_to_the_snapshot_it_names() {
        let c: Arc<VolumeSnapshotContent> = Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": "snapcontent-u1"},
                "spec": {"volumeSnapshotRef": {"name": "s1", "namespace": "team"}, "driver": "d", "deletionPolicy": "Delete", "source": {"volumeHandle": "v"}},
            }))
            .unwrap(),
        );
        assert_eq!(keys_for_content(&Change::Applied { old: None, new: c.clone() }), vec![ObjectKey::new(Some("team"), "s1")]);
        let mut unnamed = (*c).clone();
        unnamed.spec.volume_snapshot_ref.namespace = None;
        assert!(keys_for_content(&Change::Deleted(Arc::new(unnamed))).is_empty());
    }

    #[test]
    fn a_claim_maps_to_its_snapshots_and_to_the_snapshot_it_restores() {
        let claim: Arc<PersistentVolumeClaim> = Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": "data", "namespace": "team"},
                "spec": {"dataSource": {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "nightly"}},
            }))
            .unwrap(),
        );
        let all = vec![snapshot("team", "s1", "data"), snapshot("team", "s2", "other")];
        let keys = keys_for_claim(&Change::Applied { old: None, new: claim }, |_| all.clone());
        assert_eq!(keys, vec![ObjectKey::new(Some("team"), "nightly"), ObjectKey::new(Some("team"), "s1")]);
    }
}
