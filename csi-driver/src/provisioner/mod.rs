//! The provisioner: the external-provisioner's job, done by every node's ferro-csi for the
//! claims whose selected node is its own (upstream's distributed provisioning). Volumes are
//! node-local, so the node that will mount a volume is the one that makes it: no request ever
//! has to be routed to another node. Claims with an Immediate class are taken by the first node
//! whose annotation update wins. Released volumes with reclaim policy Delete are deleted by
//! the node they live on. Volumes made for claims that are gone before their PV was written
//! are swept (see [`sweep_orphans`]). The CSI snapshotter's job is here too: the node holding
//! a VolumeSnapshotContent's source takes the snapshot, writes the content's status and deletes
//! the storage snapshot with its content ([`plan::snapshot`]); claims restore from
//! VolumeSnapshots whose storage is on their node.

pub mod capacity;
pub mod plan;

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use ferro_runtime::events::Recorder;
use ferro_runtime::{spawn_resync, spawn_workers, Change, Informer, Next, ObjectKey, WorkQueue};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use serde_json::json;
use tracing::{info, info_span, warn, Instrument};

use crate::service::status;
use crate::volume::controller::CreateRequest;
use crate::volume::engine::{Engine, EngineError};
use crate::volume::host::Host;
use crate::volume::names::DRIVER_NAME;
use api_ext::snapshot::v1::{self as snap, VolumeSnapshot, VolumeSnapshotClass, VolumeSnapshotContent};
use plan::snapshot::{ContentDecision, ANN_SNAPSHOT_NODE};
use plan::{ClaimDecision, VolumeDecision, ANN_SELECTED_NODE, PV_FINALIZER};

#[derive(Debug, thiserror::Error)]
pub enum ProvisionError {
    #[error("kubernetes API: {0}")]
    Api(#[from] kube::Error),
    #[error("{0}")]
    Volume(tonic::Status),
    #[error("the engine task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Key {
    Claim(ObjectKey),
    Volume(String),
    Content(String),
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Key::Claim(k) => write!(f, "claim {k}"),
            Key::Volume(n) => write!(f, "volume {n}"),
            Key::Content(n) => write!(f, "volumesnapshotcontent {n}"),
        }
    }
}

pub struct Context<H: Host> {
    pub engine: Arc<Engine<H>>,
    pub client: kube::Client,
    pub node: String,
    pub recorder: Recorder,
    pub claims: Arc<Informer<PersistentVolumeClaim>>,
    pub volumes: Arc<Informer<PersistentVolume>>,
    pub classes: Arc<Informer<StorageClass>>,
    pub snapshots: Arc<Informer<VolumeSnapshot>>,
    pub contents: Arc<Informer<VolumeSnapshotContent>>,
    pub snapshot_classes: Arc<Informer<VolumeSnapshotClass>>,
}

fn class_name(pvc: &PersistentVolumeClaim) -> Option<String> {
    pvc.spec
        .as_ref()
        .and_then(|s| s.storage_class_name.clone())
        .or_else(|| {
            pvc.annotations()
                .get("volume.beta.kubernetes.io/storage-class")
                .cloned()
        })
}

/// Creates the driver's CSIDriver object when it does not exist (an existing one is left as
/// the cluster's administrator may have set it).
pub async fn ensure_driver_object(client: &kube::Client) -> Result<(), kube::Error> {
    let api: Api<k8s_openapi::api::storage::v1::CSIDriver> = Api::all(client.clone());
    if api.get_opt(DRIVER_NAME).await?.is_some() {
        return Ok(());
    }
    match api.create(&PostParams::default(), &plan::driver_object()).await {
        Ok(_) => {
            info!(driver = DRIVER_NAME, "created the CSIDriver object");
            Ok(())
        }
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Where and how often this node's CSIStorageCapacity objects are published
/// (external-provisioner's `--capacity-poll-interval`, default 1m; its namespace is the
/// provisioner's own, ferro's default kube-system).
#[derive(Clone, Debug)]
pub struct CapacityConfig {
    pub namespace: String,
    pub poll_interval: Duration,
}

/// Starts the informers, the workers and the resyncs (and, with `capacity`, storage capacity
/// tracking); returns once the caches are synced.
pub async fn start<H: Host>(
    engine: Arc<Engine<H>>,
    client: kube::Client,
    node: String,
    capacity: Option<CapacityConfig>,
) -> Arc<Context<H>> {
    if let Err(e) = ensure_driver_object(&client).await {
        warn!(error = %e, "cannot create the CSIDriver object; an upstream kubelet may wait for an attach step");
    }
    let ctx = Arc::new(Context {
        recorder: Recorder::new(client.clone(), "ferro-csi").with_host(&node),
        engine,
        client: client.clone(),
        node,
        claims: Informer::new(),
        volumes: Informer::new(),
        classes: Informer::new(),
        snapshots: Informer::new(),
        contents: Informer::new(),
        snapshot_classes: Informer::new(),
    });
    let queue: WorkQueue<Key> = WorkQueue::new();
    {
        let q = queue.clone();
        ctx.claims
            .on_change(move |c: &Change<PersistentVolumeClaim>| {
                q.add(Key::Claim(ObjectKey::of(c.object().as_ref())))
            });
        let q = queue.clone();
        ctx.volumes.on_change(move |c: &Change<PersistentVolume>| {
            let pv = c.object();
            q.add(Key::Volume(pv.name_any()));
            if let Some(r) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) {
                if let Some(name) = r.name.as_deref() {
                    q.add(Key::Claim(ObjectKey::new(r.namespace.as_deref(), name)));
                }
            }
        });
        let q = queue.clone();
        let claims = Arc::clone(&ctx.claims);
        ctx.classes.on_change(move |_c: &Change<StorageClass>| {
            for k in claims.keys() {
                q.add(Key::Claim(k));
            }
        });
        let q = queue.clone();
        ctx.contents.on_change(move |c: &Change<VolumeSnapshotContent>| q.add(Key::Content(c.object().name_any())));
        // A snapshot becoming ready may unblock the claims restoring from it.
        let q = queue.clone();
        let claims = Arc::clone(&ctx.claims);
        ctx.snapshots.on_change(move |c: &Change<VolumeSnapshot>| {
            let s = c.object();
            let ns = s.namespace();
            for pvc in claims.list().iter().filter(|p| p.namespace() == ns) {
                if restore_source(pvc) == Some(s.name_any().as_str()) {
                    q.add(Key::Claim(ObjectKey::of(pvc.as_ref())));
                }
            }
        });
    }
    ctx.claims
        .spawn(Api::all(client.clone()), watcher::Config::default());
    ctx.volumes
        .spawn(Api::all(client.clone()), watcher::Config::default());
    ctx.classes
        .spawn(Api::all(client.clone()), watcher::Config::default());
    ctx.snapshots.spawn(Api::all(client.clone()), watcher::Config::default());
    ctx.contents.spawn(Api::all(client.clone()), watcher::Config::default());
    ctx.snapshot_classes.spawn(Api::all(client), watcher::Config::default());
    ctx.claims.wait_synced().await;
    ctx.volumes.wait_synced().await;
    ctx.classes.wait_synced().await;
    ctx.snapshots.wait_synced().await;
    ctx.contents.wait_synced().await;
    ctx.snapshot_classes.wait_synced().await;
    let worker_ctx = Arc::clone(&ctx);
    spawn_workers("provisioner", queue.clone(), 2, move |key: Key| {
        let ctx = Arc::clone(&worker_ctx);
        async move { reconcile(ctx, key).await }
    });
    let keys_ctx = Arc::clone(&ctx);
    spawn_resync(queue, Duration::from_secs(60), move || {
        let mut keys: Vec<Key> = keys_ctx.claims.keys().into_iter().map(Key::Claim).collect();
        keys.extend(
            keys_ctx
                .volumes
                .list()
                .iter()
                .map(|pv| Key::Volume(pv.name_any())),
        );
        keys.extend(keys_ctx.contents.list().iter().map(|c| Key::Content(c.name_any())));
        keys
    });
    if let Some(cfg) = capacity {
        tokio::spawn(capacity_loop(Arc::clone(&ctx), cfg));
    }
    let sweep_ctx = Arc::clone(&ctx);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(60));
        loop {
            tick.tick().await;
            if let Err(e) = sweep_orphans(&sweep_ctx, jiff::SignedDuration::from_mins(2)).await {
                warn!(error = %e, "sweeping orphaned volumes failed");
            }
        }
    });
    ctx
}

/// Publishes this node's CSIStorageCapacity objects every poll interval and soon after a
/// StorageClass or a PersistentVolume changes (a volume made or deleted changes what is left).
async fn capacity_loop<H: Host>(ctx: Arc<Context<H>>, cfg: CapacityConfig) {
    let changed = Arc::new(tokio::sync::Notify::new());
    {
        let n = Arc::clone(&changed);
        ctx.classes.on_change(move |_c: &Change<StorageClass>| n.notify_one());
        let n = Arc::clone(&changed);
        ctx.volumes.on_change(move |_c: &Change<PersistentVolume>| n.notify_one());
    }
    let mut last_error = String::new();
    loop {
        let span = info_span!("reconcile", controller = "capacity", object = %ctx.node);
        async {
            let classes: Vec<StorageClass> = ctx.classes.list().iter().map(|c| (**c).clone()).collect();
            let available = match engine_call(&ctx, |e| e.available()).await {
                Ok(Ok(a)) => a,
                Ok(Err(s)) => {
                    warn!(status = %s, "GetCapacity failed; capacity not published");
                    return;
                }
                Err(e) => {
                    warn!(error = %e, "GetCapacity failed; capacity not published");
                    return;
                }
            };
            match capacity::sync(&ctx.client, &ctx.node, &cfg.namespace, &classes, available).await {
                Ok(0) => last_error.clear(),
                Ok(n) => {
                    last_error.clear();
                    info!(changes = n, available, "storage capacity published");
                }
                Err(e) => {
                    let msg = e.to_string();
                    if msg != last_error {
                        warn!(error = %msg, "publishing storage capacity failed; retrying");
                        last_error = msg;
                    }
                }
            }
        }
        .instrument(span)
        .await;
        tokio::select! {
            () = changed.notified() => {}
            () = tokio::time::sleep(cfg.poll_interval) => {}
        }
    }
}

/// The named reconcile: one claim or one volume, in a span carrying its key.
pub async fn reconcile<H: Host>(ctx: Arc<Context<H>>, key: Key) -> Result<Next, ProvisionError> {
    let span = info_span!("reconcile", controller = "provisioner", object = %key);
    async move {
        match &key {
            Key::Claim(k) => reconcile_claim(&ctx, k).await,
            Key::Volume(name) => reconcile_volume(&ctx, name).await,
            Key::Content(name) => reconcile_content(&ctx, name).await,
        }
    }
    .instrument(span)
    .await
}

async fn engine_call<H: Host, T: Send + 'static>(
    ctx: &Context<H>,
    f: impl FnOnce(&Engine<H>) -> Result<T, EngineError> + Send + 'static,
) -> Result<Result<T, tonic::Status>, ProvisionError> {
    let engine = Arc::clone(&ctx.engine);
    Ok(tokio::task::spawn_blocking(move || f(&engine))
        .await?
        .map_err(status))
}

async fn reconcile_claim<H: Host>(
    ctx: &Context<H>,
    key: &ObjectKey,
) -> Result<Next, ProvisionError> {
    let Some(pvc) = ctx.claims.get(key.namespace.as_deref(), &key.name) else {
        return Ok(Next::Done);
    };
    let ns = pvc.namespace().unwrap_or_default();
    let class = class_name(&pvc).and_then(|c| ctx.classes.get(None, &c));
    let pv_exists = plan::volume_name(&pvc).is_some_and(|n| ctx.volumes.get(None, &n).is_some());
    let source_volume = |claim: &str| -> Option<String> {
        let src = ctx.claims.get(Some(&ns), claim)?;
        let pv = ctx
            .volumes
            .get(None, src.spec.as_ref()?.volume_name.as_deref()?)?;
        let csi = pv.spec.as_ref()?.csi.as_ref()?;
        (csi.driver == DRIVER_NAME).then(|| csi.volume_handle.clone())
    };
    let source_snapshot = |name: &str| {
        let snapshot = ctx.snapshots.get(Some(&ns), name);
        let content = snapshot
            .as_ref()
            .and_then(|s| s.status.as_ref())
            .and_then(|st| st.bound_volume_snapshot_content_name.as_deref())
            .and_then(|c| ctx.contents.get(None, c));
        plan::snapshot::snapshot_source(name, snapshot.as_deref(), content.as_deref(), &ctx.node)
    };
    let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    let bound_pv = pvc
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .and_then(|v| ctx.volumes.get(None, v));
    if let Some(pv) = bound_pv {
        return match plan::decide_resize(&pvc, &pv, &ctx.node) {
            Some(r) => resize(ctx, &api, &pvc, &pv, r).await,
            None => Ok(Next::Done),
        };
    }
    match plan::decide_claim(&pvc, class.as_deref(), &ctx.node, pv_exists, &source_volume, &source_snapshot) {
        ClaimDecision::Ignore => Ok(Next::Done),
        ClaimDecision::Take => {
            // Guarded by resourceVersion: of several nodes, the first update wins.
            let patch = json!({"metadata": {
                "resourceVersion": pvc.resource_version(),
                "annotations": {ANN_SELECTED_NODE: ctx.node},
            }});
            match api
                .patch(
                    &pvc.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
            {
                Ok(_) => info!(node = %ctx.node, "took the immediate claim"),
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    info!("another node took the claim first")
                }
                Err(e) => return Err(e.into()),
            }
            Ok(Next::Done)
        }
        ClaimDecision::Refuse(why) => {
            ctx.recorder.record(
                pvc.as_ref(),
                "Warning",
                "ProvisioningFailed",
                format!("failed to provision volume: {why}"),
            );
            Ok(Next::Done)
        }
        ClaimDecision::Provision(req) => {
            let Some(class) = class else {
                return Ok(Next::Done);
            };
            ctx.recorder.record(
                pvc.as_ref(),
                "Normal",
                "Provisioning",
                format!(
                    "External provisioner is provisioning volume for claim \"{ns}/{}\"",
                    pvc.name_any()
                ),
            );
            let r = (*req).clone();
            let made = engine_call(ctx, move |e| {
                let range = crate::proto::CapacityRange {
                    required_bytes: r.required_bytes,
                    limit_bytes: r.limit_bytes,
                };
                e.create_volume(CreateRequest {
                    name: &r.name,
                    range: Some(&range),
                    capabilities: std::slice::from_ref(&r.capability),
                    parameters: &r.parameters,
                    source: r.source.clone(),
                })
            })
            .await?;
            let rec = match made {
                Ok(rec) => rec,
                Err(st) => {
                    ctx.recorder.record(
                        pvc.as_ref(),
                        "Warning",
                        "ProvisioningFailed",
                        format!(
                            "failed to provision volume with StorageClass {:?}: {}",
                            class.name_any(),
                            st.message()
                        ),
                    );
                    let wffc = class.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer");
                    if st.code() == tonic::Code::ResourceExhausted && wffc {
                        // Give the claim back to the scheduler: another node may have room.
                        let patch = json!({"metadata": {"annotations": {ANN_SELECTED_NODE: null}}});
                        api.patch(
                            &pvc.name_any(),
                            &PatchParams::default(),
                            &Patch::Merge(&patch),
                        )
                        .await?;
                        return Ok(Next::Done);
                    }
                    if matches!(
                        st.code(),
                        tonic::Code::InvalidArgument
                            | tonic::Code::OutOfRange
                            | tonic::Code::AlreadyExists
                    ) {
                        // Final until the claim changes.
                        return Ok(Next::Done);
                    }
                    return Err(ProvisionError::Volume(st));
                }
            };
            let context = rec
                .parameters
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let pv = plan::volume_object(
                &pvc,
                &class,
                &req,
                &rec.id,
                rec.size as i64,
                &context,
                &ctx.node,
            );
            let pvs: Api<PersistentVolume> = Api::all(ctx.client.clone());
            match pvs.create(&PostParams::default(), &pv).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
            ctx.recorder.record(
                pvc.as_ref(),
                "Normal",
                "ProvisioningSucceeded",
                format!("Successfully provisioned volume {}", req.name),
            );
            info!(volume = %rec.id, pv = %req.name, bytes = rec.size, "provisioned");
            Ok(Next::Done)
        }
    }
}

/// The external-resizer's job: ControllerExpandVolume, then the PV's capacity, then the
/// claim's status: its capacity when the driver needs nothing more, else the condition
/// FileSystemResizePending that the node's agent clears once it grew the filesystem.
async fn resize<H: Host>(
    ctx: &Context<H>,
    api: &Api<PersistentVolumeClaim>,
    pvc: &PersistentVolumeClaim,
    pv: &PersistentVolume,
    r: plan::Resize,
) -> Result<Next, ProvisionError> {
    let name = pvc.name_any();
    ctx.recorder.record(
        pvc,
        "Normal",
        "Resizing",
        format!("External resizer is resizing volume {}", pv.name_any()),
    );
    let id = r.volume_id.clone();
    let range = crate::proto::CapacityRange {
        required_bytes: r.bytes,
        limit_bytes: 0,
    };
    let (size, node_needed) =
        match engine_call(ctx, move |e| e.expand_volume(&id, Some(&range))).await? {
            Ok(v) => v,
            Err(st) => {
                ctx.recorder.record(
                    pvc,
                    "Warning",
                    "VolumeResizeFailed",
                    format!("resize volume {:?} failed: {}", pv.name_any(), st.message()),
                );
                return Err(ProvisionError::Volume(st));
            }
        };
    let quantity = k8s_semantics::quantity::binary_si(size as i64);
    let pvs: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let patch = json!({"spec": {"capacity": {"storage": quantity}}});
    pvs.patch(
        &pv.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    let mut conditions: Vec<serde_json::Value> = pvc
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| c.type_ != "Resizing" && c.type_ != "FileSystemResizePending")
        .map(|c| serde_json::to_value(c).unwrap_or_default())
        .collect();
    let status = if node_needed {
        conditions.push(json!({
            "type": "FileSystemResizePending", "status": "True",
            "lastTransitionTime": jiff::Timestamp::now().to_string(),
            "message": "Waiting for user to (re-)start a pod to finish file system resize of volume on node.",
        }));
        ctx.recorder.record(
            pvc,
            "Normal",
            "FileSystemResizeRequired",
            "Require file system resize of volume on node".into(),
        );
        json!({"status": {"conditions": conditions}})
    } else {
        ctx.recorder.record(
            pvc,
            "Normal",
            "VolumeResizeSuccessful",
            format!("resize volume {:?} finished successfully", pv.name_any()),
        );
        json!({"status": {"conditions": conditions, "capacity": {"storage": quantity}}})
    };
    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    info!(volume = %r.volume_id, bytes = size, node_expansion = node_needed, "volume expanded");
    Ok(Next::Done)
}

async fn reconcile_volume<H: Host>(ctx: &Context<H>, name: &str) -> Result<Next, ProvisionError> {
    let Some(pv) = ctx.volumes.get(None, name) else {
        return Ok(Next::Done);
    };
    let VolumeDecision::Delete { volume_id } = plan::decide_volume(&pv, &ctx.node) else {
        return Ok(Next::Done);
    };
    let id = volume_id.clone();
    if let Err(st) = engine_call(ctx, move |e| e.delete_volume(&id)).await? {
        ctx.recorder.record(
            pv.as_ref(),
            "Warning",
            "VolumeFailedDelete",
            st.message().to_string(),
        );
        return Err(ProvisionError::Volume(st));
    }
    let api: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let finalizers: Vec<String> = pv
        .finalizers()
        .iter()
        .filter(|f| *f != PV_FINALIZER)
        .cloned()
        .collect();
    if finalizers.len() != pv.finalizers().len() {
        let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": pv.resource_version()}});
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(Next::Done),
            Err(e) => return Err(e.into()),
        }
    }
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => return Err(e.into()),
    }
    info!(volume = %volume_id, "deleted the released volume");
    Ok(Next::Done)
}

/// Deletes volumes this node made for claims that no longer exist and that no PV records: a
/// claim deleted between CreateVolume and the PV's creation (or a crash between them) would
/// otherwise leak its backing file. Only volumes older than `min_age` are considered, so a
/// provisioning under way is never swept.
pub async fn sweep_orphans<H: Host>(
    ctx: &Context<H>,
    min_age: jiff::SignedDuration,
) -> Result<Vec<String>, ProvisionError> {
    let records = match engine_call(ctx, |e| e.volumes()).await? {
        Ok(r) => r,
        Err(st) => return Err(ProvisionError::Volume(st)),
    };
    let pv_names: HashSet<String> = ctx.volumes.list().iter().map(|pv| pv.name_any()).collect();
    let claim_uids: HashSet<String> = ctx.claims.list().iter().filter_map(|c| c.uid()).collect();
    let now = jiff::Timestamp::now();
    let mut swept = Vec::new();
    for rec in records {
        let Some(uid) = rec.name.strip_prefix("pvc-") else {
            continue;
        };
        let old = rec
            .created
            .parse::<jiff::Timestamp>()
            .is_ok_and(|t| now.duration_since(t) > min_age);
        if !old || pv_names.contains(&rec.name) || claim_uids.contains(uid) {
            continue;
        }
        let id = rec.id.clone();
        match engine_call(ctx, move |e| e.delete_volume(&id)).await? {
            Ok(()) => {
                warn!(volume = %rec.id, name = %rec.name, "deleted a volume whose claim and PV are gone");
                swept.push(rec.id);
            }
            Err(st) => {
                warn!(volume = %rec.id, error = %st.message(), "an orphaned volume could not be deleted")
            }
        }
    }
    Ok(swept)
}

/// The VolumeSnapshot a claim restores from (`dataSourceRef`, else `dataSource`).
fn restore_source(pvc: &PersistentVolumeClaim) -> Option<&str> {
    let spec = pvc.spec.as_ref()?;
    let r = spec
        .data_source_ref
        .as_ref()
        .map(|r| (r.api_group.as_deref(), r.kind.as_str(), r.name.as_str()))
        .or_else(|| spec.data_source.as_ref().map(|r| (r.api_group.as_deref(), r.kind.as_str(), r.name.as_str())))?;
    match r {
        (Some(snap::GROUP), "VolumeSnapshot", name) => Some(name),
        _ => None,
    }
}

/// The snapshotter's reconcile of one VolumeSnapshotContent (see [`plan::snapshot`]).
async fn reconcile_content<H: Host>(ctx: &Context<H>, name: &str) -> Result<Next, ProvisionError> {
    let Some(c) = ctx.contents.get(None, name) else {
        return Ok(Next::Done);
    };
    if c.spec.driver != DRIVER_NAME {
        return Ok(Next::Done);
    }
    let volume = c.spec.source.volume_handle.clone();
    let snapshot = c.spec.source.snapshot_handle.clone();
    let (holds_volume, holds_snapshot) = match engine_call(ctx, move |e| {
        let v = match volume {
            Some(id) if crate::volume::names::is_volume_id(&id) => e.journal().volume(&id)?.is_some(),
            _ => false,
        };
        let s = match snapshot {
            Some(id) if crate::volume::names::is_snapshot_id(&id) => e.journal().snapshot(&id)?.is_some(),
            _ => false,
        };
        Ok((v, s))
    })
    .await?
    {
        Ok(held) => held,
        Err(st) => return Err(ProvisionError::Volume(st)),
    };
    let params = c
        .spec
        .volume_snapshot_class_name
        .as_deref()
        .and_then(|k| ctx.snapshot_classes.get(None, k))
        .and_then(|k| k.parameters.clone());
    let api: Api<VolumeSnapshotContent> = Api::all(ctx.client.clone());
    let pp = PatchParams::default();
    match plan::snapshot::decide_content(&c, &ctx.node, holds_volume, holds_snapshot, params.as_ref()) {
        ContentDecision::Ignore => Ok(Next::Done),
        ContentDecision::Take => {
            let patch = json!({"metadata": {"resourceVersion": c.resource_version(), "annotations": {ANN_SNAPSHOT_NODE: ctx.node}}});
            match api.patch(name, &pp, &Patch::Merge(&patch)).await {
                Ok(_) => info!(node = %ctx.node, "took the snapshot content"),
                Err(kube::Error::Api(e)) if e.code == 409 => info!("the content changed; taking it again later"),
                Err(e) => return Err(e.into()),
            }
            Ok(Next::Done)
        }
        ContentDecision::Fail(message) => {
            ctx.recorder.record(c.as_ref(), "Warning", "SnapshotCreationFailed", message.clone());
            let status = json!({"status": {"readyToUse": false, "error": {"time": jiff::Timestamp::now().to_string(), "message": message}}});
            api.patch_status(name, &pp, &Patch::Merge(&status)).await?;
            Ok(Next::Done)
        }
        ContentDecision::Create { name: csi_name, source_volume } => {
            let source = source_volume.clone();
            let made = engine_call(ctx, move |e| e.create_snapshot(&source, &csi_name)).await?;
            match made {
                Ok(rec) => {
                    let status = content_status(&rec);
                    api.patch_status(name, &pp, &Patch::Merge(&status)).await?;
                    info!(snapshot = %rec.id, volume = %source_volume, bytes = rec.size, "snapshot taken");
                    Ok(Next::Done)
                }
                Err(st) => {
                    let message = format!("failed to take snapshot of the volume {source_volume}: {}", st.message());
                    ctx.recorder.record(c.as_ref(), "Warning", "SnapshotCreationFailed", message.clone());
                    let status = json!({"status": {"readyToUse": false, "error": {"time": jiff::Timestamp::now().to_string(), "message": message}}});
                    api.patch_status(name, &pp, &Patch::Merge(&status)).await?;
                    Err(ProvisionError::Volume(st))
                }
            }
        }
        ContentDecision::Check { snapshot_id } => {
            let id = snapshot_id.clone();
            let rec = match engine_call(ctx, move |e| Ok(e.journal().snapshot(&id)?)).await? {
                Ok(rec) => rec,
                Err(st) => return Err(ProvisionError::Volume(st)),
            };
            let status = match rec {
                Some(rec) => content_status(&rec),
                None => json!({"status": {"readyToUse": false, "error": {
                    "time": jiff::Timestamp::now().to_string(),
                    "message": format!("snapshot {snapshot_id} not found on node {}", ctx.node)}}}),
            };
            api.patch_status(name, &pp, &Patch::Merge(&status)).await?;
            Ok(Next::Done)
        }
        ContentDecision::Delete { snapshot_id } => {
            if let Some(id) = snapshot_id {
                let sid = id.clone();
                if let Err(st) = engine_call(ctx, move |e| e.delete_snapshot(&sid)).await? {
                    ctx.recorder.record(c.as_ref(), "Warning", "SnapshotDeleteError", format!("failed to delete snapshot {id}: {}", st.message()));
                    return Err(ProvisionError::Volume(st));
                }
                info!(snapshot = %id, "snapshot deleted");
            }
            release_content(&api, &c).await
        }
        ContentDecision::Release => release_content(&api, &c).await,
    }
}

/// A content's status from the snapshot record: handle, creation time (ns), size, ready.
fn content_status(rec: &crate::volume::record::SnapshotRecord) -> serde_json::Value {
    let created = rec.created.parse::<jiff::Timestamp>().map(|t| t.as_nanosecond()).unwrap_or(0);
    json!({"status": {
        "snapshotHandle": rec.id,
        "creationTime": i64::try_from(created).unwrap_or(0),
        "restoreSize": i64::try_from(rec.size).unwrap_or(i64::MAX),
        "readyToUse": rec.state == crate::volume::record::State::Ready,
        "error": null,
    }})
}

/// Removes the bound-protection finalizer so the API server lets the content go.
async fn release_content(api: &Api<VolumeSnapshotContent>, c: &VolumeSnapshotContent) -> Result<Next, ProvisionError> {
    let finalizers: Vec<&String> = c.finalizers().iter().filter(|f| *f != snap::CONTENT_BOUND_FINALIZER).collect();
    let patch = json!({"metadata": {"resourceVersion": c.resource_version(), "finalizers": finalizers}});
    match api.patch(&c.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => Ok(Next::Done),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(Next::Done),
        Err(e) => Err(e.into()),
    }
}
