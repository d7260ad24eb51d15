//! kubelet's CSI volume mounting. persistentVolumeClaim volumes: claim -> bound PV -> the
//! registered driver -> NodeStageVolume at the volume's global mount -> NodePublishVolume at
//! the pod's volume dir. Inline `csi:` volumes (lifecycle mode "Ephemeral", only for drivers
//! whose CSIDriver lists it): no stage, NodePublishVolume of the handle
//! `csi-<sha256(pod uid + volume name)>` with the volume's attributes. Upstream's paths:
//!
//! ```text
//! <root>/plugins/kubernetes.io/csi/<driver>/<sha256(volume handle)>/globalmount   staging
//! <root>/pods/<uid>/volumes/kubernetes.io~csi/<pv or volume name>/mount           target
//! <root>/pods/<uid>/volumes/kubernetes.io~csi/<pv or volume name>/vol_data.json   what to undo
//! ```
//!
//! vol_data.json is written before the volume is staged or published, so teardown (also after
//! an agent restart, from the files alone) always knows what to unpublish and unstage. A
//! persistent volume is unstaged when no other pod's vol_data.json names it. With the
//! CSIDriver's podInfoOnMount the volume context carries the pod's name, namespace, uid,
//! service account and whether the volume is ephemeral, as upstream. [`plan_mount`],
//! [`plan_inline`], [`check_lifecycle_mode`] and [`pod_info`] are pure.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use csi_proto::csi::node_client::NodeClient;
use csi_proto::csi::node_service_capability::rpc::Type as NodeRpc;
use csi_proto::csi::node_service_capability::Type as NodeCapType;
use csi_proto::csi::volume_capability::access_mode::Mode;
use csi_proto::csi::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use csi_proto::csi::{
    CapacityRange, NodeExpandVolumeRequest, NodeGetCapabilitiesRequest, NodePublishVolumeRequest,
    NodeStageVolumeRequest, NodeUnpublishVolumeRequest, NodeUnstageVolumeRequest, VolumeCapability,
};
use k8s_openapi::api::core::v1::{CSIVolumeSource, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::CSIDriver;
use kube::api::{Patch, PatchParams};
use kube::Api;
use serde::{Deserialize, Serialize};
use tracing::{debug, info, warn};

use super::registry::{channel, Drivers, RegistryError};
use crate::pod::volume::ownership::{self, ChangePolicy};
use crate::pod::volume::VolumePath;

/// The plugin directory name of CSI volumes in a pod's volume dir.
pub const CSI_DIR: &str = "kubernetes.io~csi";
const VOL_DATA: &str = "vol_data.json";
/// The lifecycle mode of a persistentVolumeClaim's CSI volume.
pub const PERSISTENT: &str = "Persistent";
/// The lifecycle mode of an inline `csi:` volume.
pub const EPHEMERAL: &str = "Ephemeral";
/// The volume context keys of podInfoOnMount (upstream's).
pub const POD_NAME_KEY: &str = "csi.storage.k8s.io/pod.name";
pub const POD_NAMESPACE_KEY: &str = "csi.storage.k8s.io/pod.namespace";
pub const POD_UID_KEY: &str = "csi.storage.k8s.io/pod.uid";
pub const SERVICE_ACCOUNT_KEY: &str = "csi.storage.k8s.io/serviceAccount.name";
pub const EPHEMERAL_KEY: &str = "csi.storage.k8s.io/ephemeral";

#[derive(Debug, thiserror::Error)]
pub enum CsiError {
    #[error("persistentvolumeclaim {0:?} not found")]
    ClaimNotFound(String),
    #[error("PVC {claim} has non-bound phase ({phase:?}) or empty pvc.Spec.VolumeName ({volume:?})")]
    ClaimNotBound { claim: String, phase: String, volume: String },
    #[error("persistentvolume {0:?} not found")]
    VolumeNotFound(String),
    #[error("persistent volume {0:?} is not a CSI volume: the agent mounts CSI persistent volumes only")]
    NotCsi(String),
    #[error("driver name {0} not found in the list of registered CSI drivers")]
    DriverNotRegistered(String),
    #[error("persistentVolumeClaim and csi volumes need the API server (the agent runs without --kubeconfig)")]
    NoApi,
    /// The driver does not offer the volume's lifecycle mode (upstream's NewMounter check).
    #[error("MountVolume.NewMounter initialization failed for volume {volume:?} : volume mode {mode:?} not supported by driver {driver} ({})", supported_text(.supported))]
    LifecycleMode { volume: String, driver: String, mode: String, supported: Option<Vec<String>> },
    #[error("volume {0:?}: the claim's and the persistent volume's volumeMode differ")]
    ModeMismatch(String),
    #[error("{call} failed for volume {volume:?}: {}", status.message())]
    Rpc { call: &'static str, volume: String, status: tonic::Status },
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error("kubernetes API: {0}")]
    Api(#[from] kube::Error),
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Volume(#[from] crate::pod::volume::VolumeError),
}

/// What a driver supports, as upstream words it.
fn supported_text(supported: &Option<Vec<String>>) -> String {
    match supported {
        Some(modes) => format!("only supports {}", go_quoted(modes)),
        None => "no CSIDriver object".to_string(),
    }
}

/// A list as Go's `%q` prints a string slice: `["Persistent" "Ephemeral"]`.
fn go_quoted(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|i| format!("{i:?}")).collect();
    format!("[{}]", quoted.join(" "))
}

fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> CsiError {
    let path = path.to_path_buf();
    move |source| CsiError::Io { op, path, source }
}

/// What teardown needs, as upstream's vol_data.json (ferro adds the staging path).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolData {
    pub driver_name: String,
    pub volume_handle: String,
    #[serde(rename = "specVolID")]
    pub spec_vol_id: String,
    pub node_name: String,
    pub volume_lifecycle_mode: String,
    /// Where a persistent volume is staged (empty for an inline volume: never staged).
    #[serde(default, skip_serializing_if = "path_is_empty")]
    pub staging_path: PathBuf,
    /// "Block" for a raw block volume (published as a device node at `<dir>/dev`), else a
    /// filesystem published at `<dir>/mount`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub volume_mode: String,
}

fn path_is_empty(p: &Path) -> bool {
    p.as_os_str().is_empty()
}

impl VolData {
    /// Whether this is an inline (ephemeral) volume: published only, never staged.
    pub fn is_ephemeral(&self) -> bool {
        self.volume_lifecycle_mode == EPHEMERAL
    }

    /// Where the volume is published, given its directory.
    pub fn target_in(&self, dir: &Path) -> PathBuf {
        dir.join(if self.volume_mode == "Block" { "dev" } else { "mount" })
    }
}

/// One CSI volume of a pod (a persistentVolumeClaim's or an inline one), planned.
#[derive(Clone, Debug, PartialEq)]
pub struct MountPlan {
    pub volume: String,
    pub data: VolData,
    pub target: PathBuf,
    pub capability: VolumeCapability,
    pub readonly: bool,
    /// The volume's attributes: NodeStageVolume's context, and NodePublishVolume's under
    /// [`MountPlan::pod_info`].
    pub volume_context: std::collections::HashMap<String, String>,
    pub fs_type: String,
    /// podInfoOnMount's keys ([`pod_info`]), for NodePublishVolume only, as upstream.
    pub pod_info: BTreeMap<String, String>,
}

impl MountPlan {
    /// NodePublishVolume's volume context: the attributes, the pod info over them.
    pub fn publish_context(&self) -> std::collections::HashMap<String, String> {
        let mut ctx = self.volume_context.clone();
        ctx.extend(self.pod_info.iter().map(|(k, v)| (k.clone(), v.clone())));
        ctx
    }
}

fn hex_sha256(s: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, s.as_bytes());
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// `<root>/plugins/kubernetes.io/csi/<driver>/<sha256(handle)>/globalmount`
pub fn staging_path(root: &Path, driver: &str, handle: &str) -> PathBuf {
    root.join("plugins/kubernetes.io/csi").join(driver).join(hex_sha256(handle)).join("globalmount")
}

/// `<root>/pods/<uid>/volumes/kubernetes.io~csi`
pub fn pod_csi_dir(root: &Path, uid: &str) -> PathBuf {
    root.join("pods").join(uid).join("volumes").join(CSI_DIR)
}

/// Plans one claim volume from its bound claim and volume.
pub fn plan_mount(
    root: &Path,
    uid: &str,
    node: &str,
    volume: &str,
    claim_readonly: bool,
    pvc: &PersistentVolumeClaim,
    pv: &PersistentVolume,
) -> Result<MountPlan, CsiError> {
    let pv_name = pv.metadata.name.clone().unwrap_or_default();
    let spec = pv.spec.as_ref().ok_or_else(|| CsiError::NotCsi(pv_name.clone()))?;
    let csi = spec.csi.as_ref().ok_or_else(|| CsiError::NotCsi(pv_name.clone()))?;
    let block = spec.volume_mode.as_deref() == Some("Block");
    if block != (pvc.spec.as_ref().and_then(|s| s.volume_mode.as_deref()) == Some("Block")) && pvc.spec.is_some() {
        return Err(CsiError::ModeMismatch(volume.to_string()));
    }
    let modes = spec.access_modes.clone().unwrap_or_default();
    let mode = if modes.iter().any(|m| m == "ReadWriteOncePod") {
        Mode::SingleNodeSingleWriter
    } else if modes.iter().any(|m| m == "ReadWriteOnce") || modes.is_empty() {
        Mode::SingleNodeWriter
    } else if modes.iter().any(|m| m == "ReadWriteMany") {
        Mode::MultiNodeMultiWriter
    } else {
        Mode::MultiNodeReaderOnly
    };
    let fs_type = csi.fs_type.clone().unwrap_or_default();
    let access_type = if block {
        AccessType::Block(BlockVolume {})
    } else {
        AccessType::Mount(MountVolume {
            fs_type: fs_type.clone(),
            mount_flags: spec.mount_options.clone().unwrap_or_default(),
            volume_mount_group: String::new(),
        })
    };
    let capability = VolumeCapability { access_type: Some(access_type), access_mode: Some(AccessMode { mode: mode as i32 }) };
    let dir = pod_csi_dir(root, uid).join(&pv_name);
    let volume_mode = if block { "Block".to_string() } else { String::new() };
    Ok(MountPlan {
        volume: volume.to_string(),
        data: VolData {
            driver_name: csi.driver.clone(),
            volume_handle: csi.volume_handle.clone(),
            spec_vol_id: pv_name,
            node_name: node.to_string(),
            volume_lifecycle_mode: PERSISTENT.into(),
            staging_path: staging_path(root, &csi.driver, &csi.volume_handle),
            volume_mode: volume_mode.clone(),
        },
        target: dir.join(if block { "dev" } else { "mount" }),
        capability,
        readonly: claim_readonly || csi.read_only == Some(true),
        volume_context: csi.volume_attributes.clone().unwrap_or_default().into_iter().collect(),
        fs_type,
        pod_info: BTreeMap::new(),
    })
}

/// upstream's makeVolumeHandle: an inline volume's handle, `csi-` + hex SHA-256 of the pod's
/// UID followed by the volume's name.
pub fn inline_handle(pod_uid: &str, volume: &str) -> String {
    format!("csi-{}", hex_sha256(&format!("{pod_uid}{volume}")))
}

/// upstream's supportsVolumeLifecycleMode: the driver's CSIDriver must list the mode in
/// `volumeLifecycleModes` (["Persistent"] when unset, as the API server defaults it); a
/// driver without a CSIDriver object supports Persistent only.
pub fn check_lifecycle_mode(volume: &str, driver_name: &str, driver: Option<&CSIDriver>, mode: &str) -> Result<(), CsiError> {
    let err = |supported| CsiError::LifecycleMode {
        volume: volume.to_string(),
        driver: driver_name.to_string(),
        mode: mode.to_string(),
        supported,
    };
    let Some(driver) = driver else {
        return if mode == PERSISTENT { Ok(()) } else { Err(err(None)) };
    };
    let modes = driver.spec.volume_lifecycle_modes.clone().unwrap_or_else(|| vec![PERSISTENT.to_string()]);
    if modes.iter().any(|m| m == mode) {
        Ok(())
    } else {
        Err(err(Some(modes)))
    }
}

/// upstream's podAttributes: with the CSIDriver's podInfoOnMount, the pod's name, namespace,
/// uid, service account name and whether the volume is ephemeral go into the volume context
/// (over any attribute of the same key); nothing otherwise, or without a CSIDriver object.
pub fn pod_info(pod: &Pod, driver: Option<&CSIDriver>, ephemeral: bool) -> BTreeMap<String, String> {
    if driver.and_then(|d| d.spec.pod_info_on_mount) != Some(true) {
        return BTreeMap::new();
    }
    BTreeMap::from([
        (POD_NAME_KEY.to_string(), pod.metadata.name.clone().unwrap_or_default()),
        (POD_NAMESPACE_KEY.to_string(), pod.metadata.namespace.clone().unwrap_or_default()),
        (POD_UID_KEY.to_string(), pod.metadata.uid.clone().unwrap_or_default()),
        (
            SERVICE_ACCOUNT_KEY.to_string(),
            pod.spec.as_ref().and_then(|s| s.service_account_name.clone()).unwrap_or_default(),
        ),
        (EPHEMERAL_KEY.to_string(), ephemeral.to_string()),
    ])
}

/// Plans one inline `csi:` volume as upstream's csi mounter does for the Ephemeral mode: the
/// handle from the pod's UID and the volume's name, no staging, published at
/// `.../kubernetes.io~csi/<volume>/mount` as a filesystem (upstream always asks
/// ReadWriteOnce, so SINGLE_NODE_WRITER) with the volume's fsType, read-only when it says so,
/// its volumeAttributes as the volume context (pod info is added by [`pod_info`]).
pub fn plan_inline(root: &Path, uid: &str, node: &str, volume: &str, csi: &CSIVolumeSource) -> MountPlan {
    let fs_type = csi.fs_type.clone().unwrap_or_default();
    let capability = VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs_type.clone(),
            mount_flags: Vec::new(),
            volume_mount_group: String::new(),
        })),
        access_mode: Some(AccessMode { mode: Mode::SingleNodeWriter as i32 }),
    };
    let dir = pod_csi_dir(root, uid).join(volume);
    MountPlan {
        volume: volume.to_string(),
        data: VolData {
            driver_name: csi.driver.clone(),
            volume_handle: inline_handle(uid, volume),
            spec_vol_id: volume.to_string(),
            node_name: node.to_string(),
            volume_lifecycle_mode: EPHEMERAL.into(),
            staging_path: PathBuf::new(),
            volume_mode: String::new(),
        },
        target: dir.join("mount"),
        capability,
        readonly: csi.read_only == Some(true),
        volume_context: csi.volume_attributes.clone().unwrap_or_default().into_iter().collect(),
        fs_type,
        pod_info: BTreeMap::new(),
    }
}

/// Whether the kubelet applies the pod's fsGroup to a CSI volume, per its CSIDriver's
/// fsGroupPolicy (upstream's default, ReadWriteOnceWithFSType, when the driver has no object):
/// `File` always, `None` never, the default when the volume has an fsType and a
/// single-node-writer access mode. Never for raw block or read-only volumes.
pub fn applies_fs_group(policy: Option<&str>, plan: &MountPlan) -> bool {
    if plan.data.volume_mode == "Block" || plan.readonly {
        return false;
    }
    match policy.unwrap_or("ReadWriteOnceWithFSType") {
        "File" => true,
        "None" => false,
        _ => {
            let mode = plan.capability.access_mode.as_ref().map(|m| m.mode());
            !plan.fs_type.is_empty() && matches!(mode, Some(Mode::SingleNodeWriter | Mode::SingleNodeSingleWriter))
        }
    }
}

/// upstream's isFinalError: whether a failed CSI call surely left nothing in progress. The
/// codes a call may still be working under (cancelled, timed out, unavailable, exhausted,
/// aborted) are not final.
pub fn is_final(code: tonic::Code) -> bool {
    use tonic::Code;
    !matches!(
        code,
        Code::Cancelled | Code::DeadlineExceeded | Code::Unavailable | Code::ResourceExhausted | Code::Aborted
    )
}

/// upstream's removeMountDir: the target (only when it is an empty directory, not a mount
/// point: removing a mount point fails), then vol_data.json and the volume's dir. Failures
/// leave the files for the pod's teardown.
fn remove_mount_dir(target: &Path) {
    match std::fs::remove_dir(target) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            debug!(path = %target.display(), error = %e, "keeping a mount dir after a failed publish");
            return;
        }
    }
    let Some(dir) = target.parent() else { return };
    for (what, result) in [("vol_data.json", std::fs::remove_file(dir.join(VOL_DATA))), ("volume dir", std::fs::remove_dir(dir))] {
        if let Err(e) = result.or_else(|e| if e.kind() == std::io::ErrorKind::NotFound { Ok(()) } else { Err(e) }) {
            debug!(dir = %dir.display(), error = %e, "removing the {what} after a failed publish");
        }
    }
}

/// Mounts and unmounts the pods' CSI volumes.
pub struct CsiMounter {
    pub root: PathBuf,
    pub node: String,
    pub drivers: Arc<Drivers>,
    pub client: Option<kube::Client>,
    /// The last NodeGetVolumeStats of every published claim (the kubelet_volume_stats_*
    /// metrics), refreshed by [`CsiMounter::stats_loop`].
    pub stats: std::sync::Mutex<Vec<VolumeStats>>,
}

/// One claim's volume as NodeGetVolumeStats reports it (upstream's kubelet_volume_stats_*).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VolumeStats {
    pub namespace: String,
    pub claim: String,
    pub capacity_bytes: i64,
    pub available_bytes: i64,
    pub used_bytes: i64,
    pub inodes: i64,
    pub inodes_free: i64,
    pub inodes_used: i64,
    /// The driver's VolumeCondition: Some(true) when it reports the volume abnormal.
    pub abnormal: Option<bool>,
}

/// The usage of a NodeGetVolumeStats answer as [`VolumeStats`] (claim names aside).
pub fn stats_of(resp: &csi_proto::csi::NodeGetVolumeStatsResponse) -> VolumeStats {
    use csi_proto::csi::volume_usage::Unit;
    let mut v = VolumeStats { abnormal: resp.volume_condition.as_ref().map(|c| c.abnormal), ..Default::default() };
    for u in &resp.usage {
        match u.unit() {
            Unit::Bytes => (v.capacity_bytes, v.available_bytes, v.used_bytes) = (u.total, u.available, u.used),
            Unit::Inodes => (v.inodes, v.inodes_free, v.inodes_used) = (u.total, u.available, u.used),
            Unit::Unknown => {}
        }
    }
    v
}

fn rpc(call: &'static str, volume: &str) -> impl FnOnce(tonic::Status) -> CsiError {
    let volume = volume.to_string();
    move |status| CsiError::Rpc { call, volume, status }
}

impl CsiMounter {
    async fn node_client(&self, driver: &str) -> Result<NodeClient<tonic::transport::Channel>, CsiError> {
        let d = self.drivers.get(driver).ok_or_else(|| CsiError::DriverNotRegistered(driver.to_string()))?;
        Ok(NodeClient::new(channel(&d.endpoint).await?))
    }

    /// Sets up every CSI volume of `pod` (persistentVolumeClaim and inline `csi:` volumes);
    /// returns their host paths by volume name. Idempotent (the CSI calls are).
    pub async fn setup(&self, pod: &Pod) -> Result<BTreeMap<String, VolumePath>, CsiError> {
        let mut out = BTreeMap::new();
        let volumes: Vec<_> = pod
            .spec
            .iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .filter(|v| v.persistent_volume_claim.is_some() || v.csi.is_some())
            .collect();
        if volumes.is_empty() {
            return Ok(out);
        }
        let client = self.client.clone().ok_or(CsiError::NoApi)?;
        let ns = pod.metadata.namespace.clone().unwrap_or_else(|| "default".into());
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let fs_group = pod.spec.as_ref().and_then(|s| s.security_context.as_ref()).and_then(|sc| sc.fs_group);
        let policy = match pod
            .spec
            .as_ref()
            .and_then(|s| s.security_context.as_ref())
            .and_then(|sc| sc.fs_group_change_policy.as_deref())
        {
            Some("OnRootMismatch") => ChangePolicy::OnRootMismatch,
            _ => ChangePolicy::Always,
        };
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
        let pvs: Api<PersistentVolume> = Api::all(client.clone());
        let csi_drivers: Api<CSIDriver> = Api::all(client);
        // The CSIDriver objects, read once per setup (upstream reads them from an informer).
        let mut drivers: BTreeMap<String, Option<CSIDriver>> = BTreeMap::new();
        for v in volumes {
            let (mut plan, ephemeral) = if let Some(src) = &v.persistent_volume_claim {
                let pvc = pvcs.get_opt(&src.claim_name).await?.ok_or_else(|| CsiError::ClaimNotFound(src.claim_name.clone()))?;
                let phase = pvc.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
                let pv_name = pvc.spec.as_ref().and_then(|s| s.volume_name.clone()).unwrap_or_default();
                if phase != "Bound" || pv_name.is_empty() {
                    return Err(CsiError::ClaimNotBound { claim: format!("{ns}/{}", src.claim_name), phase, volume: pv_name });
                }
                let pv = pvs.get_opt(&pv_name).await?.ok_or_else(|| CsiError::VolumeNotFound(pv_name.clone()))?;
                (plan_mount(&self.root, &uid, &self.node, &v.name, src.read_only == Some(true), &pvc, &pv)?, false)
            } else if let Some(csi) = &v.csi {
                (plan_inline(&self.root, &uid, &self.node, &v.name, csi), true)
            } else {
                continue;
            };
            let name = plan.data.driver_name.clone();
            if !drivers.contains_key(&name) {
                let d = csi_drivers.get_opt(&name).await?;
                drivers.insert(name.clone(), d);
            }
            let driver = drivers.get(&name).and_then(Option::as_ref);
            if ephemeral {
                // Before anything is written for the volume: nothing to undo when refused.
                check_lifecycle_mode(&v.name, &name, driver, EPHEMERAL)?;
            }
            plan.pod_info = pod_info(pod, driver, ephemeral);
            self.mount(&plan).await?;
            if let Some(gid) = fs_group.and_then(|g| u32::try_from(g).ok()) {
                let driver_policy = driver.and_then(|d| d.spec.fs_group_policy.as_deref());
                if applies_fs_group(driver_policy, &plan) {
                    ownership::set_volume_ownership(&plan.target, gid, policy, false)?;
                }
            }
            out.insert(v.name.clone(), VolumePath { host_path: plan.target.clone(), read_only: plan.readonly });
        }
        Ok(out)
    }

    async fn mount(&self, plan: &MountPlan) -> Result<(), CsiError> {
        let mut node = self.node_client(&plan.data.driver_name).await?;
        let dir = plan.target.parent().unwrap_or(&plan.target).to_path_buf();
        std::fs::create_dir_all(&dir).map_err(io("create directory", &dir))?;
        let data_file = dir.join(VOL_DATA);
        let json = serde_json::to_vec(&plan.data).map_err(|e| io("encode", &data_file)(std::io::Error::other(e)))?;
        std::fs::write(&data_file, json).map_err(io("write", &data_file))?;
        // An inline volume is never staged (upstream's csi mounter for the Ephemeral mode).
        let stages = !plan.data.is_ephemeral() && {
            let caps =
                node.node_get_capabilities(NodeGetCapabilitiesRequest {}).await.map_err(rpc("NodeGetCapabilities", &plan.volume))?;
            caps.into_inner().capabilities.iter().any(|c| {
                matches!(&c.r#type, Some(NodeCapType::Rpc(r)) if r.r#type == NodeRpc::StageUnstageVolume as i32)
            })
        };
        let staging = if stages {
            let staging = &plan.data.staging_path;
            std::fs::create_dir_all(staging).map_err(io("create directory", staging))?;
            node.node_stage_volume(NodeStageVolumeRequest {
                volume_id: plan.data.volume_handle.clone(),
                staging_target_path: staging.to_string_lossy().into_owned(),
                volume_capability: Some(plan.capability.clone()),
                volume_context: plan.volume_context.clone(),
                ..Default::default()
            })
            .await
            .map_err(rpc("MountVolume.MountDevice (NodeStageVolume)", &plan.volume))?;
            staging.to_string_lossy().into_owned()
        } else {
            String::new()
        };
        let published = node
            .node_publish_volume(NodePublishVolumeRequest {
                volume_id: plan.data.volume_handle.clone(),
                staging_target_path: staging,
                target_path: plan.target.to_string_lossy().into_owned(),
                volume_capability: Some(plan.capability.clone()),
                readonly: plan.readonly,
                volume_context: plan.publish_context(),
                ..Default::default()
            })
            .await;
        if let Err(status) = &published {
            // As upstream's SetUpAt: after a final error the driver holds nothing at the
            // target, so the mount dir and vol_data.json go (teardown then has nothing to
            // unpublish). Only for an inline volume: a persistent volume's vol_data.json is
            // also the agent's record of its staging.
            if plan.data.is_ephemeral() && is_final(status.code()) {
                remove_mount_dir(&plan.target);
            }
        }
        published.map_err(rpc("MountVolume.SetUp (NodePublishVolume)", &plan.volume))?;
        Ok(())
    }

    /// Unpublishes every CSI volume of the pod (from its vol_data.json files), and unstages
    /// each persistent one no other pod on the node still uses (an inline volume is never
    /// staged: its NodeUnpublishVolume is all). The pod's CSI dir is gone afterwards.
    pub async fn teardown(&self, uid: &str) -> Result<(), CsiError> {
        let dir = pod_csi_dir(&self.root, uid);
        for (vol_dir, data) in read_vol_data(&dir) {
            let mut node = self.node_client(&data.driver_name).await?;
            let target = data.target_in(&vol_dir);
            node.node_unpublish_volume(NodeUnpublishVolumeRequest {
                volume_id: data.volume_handle.clone(),
                target_path: target.to_string_lossy().into_owned(),
            })
            .await
            .map_err(rpc("UnmountVolume.TearDown (NodeUnpublishVolume)", &data.spec_vol_id))?;
            if !data.is_ephemeral() && !self.in_use_elsewhere(uid, &data.volume_handle) && data.staging_path.exists() {
                node.node_unstage_volume(NodeUnstageVolumeRequest {
                    volume_id: data.volume_handle.clone(),
                    staging_target_path: data.staging_path.to_string_lossy().into_owned(),
                })
                .await
                .map_err(rpc("UnmountDevice (NodeUnstageVolume)", &data.spec_vol_id))?;
                // kubelet removes the global mount dir and its per-volume parent.
                for d in [Some(data.staging_path.as_path()), data.staging_path.parent()].into_iter().flatten() {
                    let _ignored_if_not_empty = std::fs::remove_dir(d);
                }
                info!(volume = %data.spec_vol_id, "volume unstaged");
            }
            // Only now: until the volume is unstaged, vol_data.json is what brings the next
            // try back here (a failed unstage, e.g. Aborted while the driver is busy with the
            // volume, is retried by the next cleanup of the pod).
            let data_file = vol_dir.join(VOL_DATA);
            std::fs::remove_file(&data_file).map_err(io("remove", &data_file))?;
            match std::fs::remove_dir(&vol_dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io("remove", &vol_dir)(e)),
                _ => {}
            }
        }
        match std::fs::remove_dir(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io("remove", &dir)(e)),
            _ => Ok(()),
        }
    }

    /// kubelet's half of volume expansion: every published volume whose claim waits for its
    /// filesystem to grow (condition FileSystemResizePending, or a PV larger than the claim's
    /// status capacity) gets NodeExpandVolume on one of its mounts, then the claim's status
    /// says the new capacity. Returns the PVs it grew.
    pub async fn expand_published(&self) -> Result<Vec<String>, CsiError> {
        let Some(client) = self.client.clone() else { return Ok(Vec::new()) };
        let mut seen = std::collections::BTreeSet::new();
        let mut grown = Vec::new();
        let Ok(pods) = std::fs::read_dir(self.root.join("pods")) else { return Ok(grown) };
        let pvs: Api<PersistentVolume> = Api::all(client.clone());
        for pod in pods.flatten() {
            let uid = pod.file_name().to_string_lossy().into_owned();
            for (vol_dir, data) in read_vol_data(&pod.path().join("volumes").join(CSI_DIR)) {
                // Claims only: an inline volume has no claim to grow or report.
                if data.is_ephemeral() || !seen.insert(data.spec_vol_id.clone()) {
                    continue;
                }
                let Some(pv) = pvs.get_opt(&data.spec_vol_id).await? else { continue };
                let Some(claim) = pv.spec.as_ref().and_then(|s| s.claim_ref.clone()) else { continue };
                let (Some(ns), Some(name)) = (claim.namespace, claim.name) else { continue };
                let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
                let Some(pvc) = pvcs.get_opt(&name).await? else { continue };
                let bytes = |q: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>| {
                    q.and_then(|q| k8s_semantics::quantity::scaled(&q.0, 1)).unwrap_or(0)
                };
                let pv_capacity = pv.spec.as_ref().and_then(|s| s.capacity.as_ref()).and_then(|c| c.get("storage"));
                let status = pvc.status.clone().unwrap_or_default();
                let pending = status.conditions.iter().flatten().any(|c| c.type_ == "FileSystemResizePending" && c.status == "True");
                let smaller = bytes(status.capacity.as_ref().and_then(|c| c.get("storage"))) < bytes(pv_capacity);
                if !(pending || smaller) || pv_capacity.is_none() {
                    continue;
                }
                let plan = plan_mount(&self.root, &uid, &self.node, &data.spec_vol_id, false, &pvc, &pv)?;
                let mut node = self.node_client(&data.driver_name).await?;
                let required = i64::try_from(bytes(pv_capacity)).unwrap_or(i64::MAX);
                node.node_expand_volume(NodeExpandVolumeRequest {
                    volume_id: data.volume_handle.clone(),
                    volume_path: data.target_in(&vol_dir).to_string_lossy().into_owned(),
                    staging_target_path: data.staging_path.to_string_lossy().into_owned(),
                    capacity_range: Some(CapacityRange { required_bytes: required, limit_bytes: 0 }),
                    volume_capability: Some(plan.capability),
                    ..Default::default()
                })
                .await
                .map_err(rpc("MountVolume.NodeExpandVolume", &data.spec_vol_id))?;
                let conditions: Vec<_> =
                    status.conditions.iter().flatten().filter(|c| c.type_ != "FileSystemResizePending").cloned().collect();
                let patch = serde_json::json!({"status": {"capacity": {"storage": pv_capacity}, "conditions": conditions}});
                pvcs.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
                info!(volume = %data.spec_vol_id, claim = %format!("{ns}/{name}"), bytes = required, "filesystem expanded");
                grown.push(data.spec_vol_id.clone());
            }
        }
        Ok(grown)
    }

    /// NodeGetVolumeStats of every published claim volume (once per volume), with its claim's
    /// namespace and name from its PV. Volumes whose driver does not answer are left out.
    pub async fn collect_stats(&self) -> Result<Vec<VolumeStats>, CsiError> {
        let Some(client) = self.client.clone() else { return Ok(Vec::new()) };
        let mut seen = std::collections::BTreeSet::new();
        let mut out = Vec::new();
        let Ok(pods) = std::fs::read_dir(self.root.join("pods")) else { return Ok(out) };
        let pvs: Api<PersistentVolume> = Api::all(client);
        for pod in pods.flatten() {
            for (vol_dir, data) in read_vol_data(&pod.path().join("volumes").join(CSI_DIR)) {
                // Claims only: an inline volume has no claim to grow or report.
                if data.is_ephemeral() || !seen.insert(data.spec_vol_id.clone()) {
                    continue;
                }
                let Some(pv) = pvs.get_opt(&data.spec_vol_id).await? else { continue };
                let Some(claim) = pv.spec.as_ref().and_then(|s| s.claim_ref.clone()) else { continue };
                let (Some(namespace), Some(name)) = (claim.namespace, claim.name) else { continue };
                let mut node = self.node_client(&data.driver_name).await?;
                let req = csi_proto::csi::NodeGetVolumeStatsRequest {
                    volume_id: data.volume_handle.clone(),
                    volume_path: data.target_in(&vol_dir).to_string_lossy().into_owned(),
                    staging_target_path: data.staging_path.to_string_lossy().into_owned(),
                };
                match node.node_get_volume_stats(req).await {
                    Ok(resp) => out.push(VolumeStats { namespace, claim: name, ..stats_of(resp.get_ref()) }),
                    Err(status) => {
                        debug!(volume = %data.spec_vol_id, %status, "NodeGetVolumeStats failed");
                    }
                }
            }
        }
        out.sort_by(|a, b| (&a.namespace, &a.claim).cmp(&(&b.namespace, &b.claim)));
        Ok(out)
    }

    /// Refreshes [`CsiMounter::stats`] every `period` (upstream's volumeStatsAggPeriod),
    /// forever.
    pub async fn stats_loop(self: Arc<Self>, period: std::time::Duration) {
        let mut tick = tokio::time::interval(period);
        loop {
            tick.tick().await;
            match self.collect_stats().await {
                Ok(v) => *self.stats.lock().unwrap_or_else(|p| p.into_inner()) = v,
                Err(e) => debug!(error = %e, "collecting volume stats failed; retrying"),
            }
        }
    }

    /// Runs [`CsiMounter::expand_published`] every `period`, forever.
    pub async fn expansion_loop(self: Arc<Self>, period: std::time::Duration) {
        let mut tick = tokio::time::interval(period);
        let mut last_error = String::new();
        loop {
            tick.tick().await;
            match self.expand_published().await {
                Ok(_) => last_error.clear(),
                Err(e) => {
                    let msg = e.to_string();
                    if msg != last_error {
                        warn!(error = %msg, "volume expansion failed; retrying");
                        last_error = msg;
                    }
                }
            }
        }
    }

    /// Whether a pod other than `uid` has a vol_data.json naming `handle`.
    fn in_use_elsewhere(&self, uid: &str, handle: &str) -> bool {
        let Ok(pods) = std::fs::read_dir(self.root.join("pods")) else { return false };
        pods.flatten()
            .filter(|p| p.file_name().to_str() != Some(uid))
            .any(|p| read_vol_data(&p.path().join("volumes").join(CSI_DIR)).iter().any(|(_, d)| d.volume_handle == handle))
    }
}

/// The CSI volume dirs under a pod's CSI dir that carry a readable vol_data.json.
pub fn read_vol_data(dir: &Path) -> Vec<(PathBuf, VolData)> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut out: Vec<(PathBuf, VolData)> = entries
        .flatten()
        .filter_map(|e| {
            let bytes = std::fs::read(e.path().join(VOL_DATA)).ok()?;
            let data: VolData = serde_json::from_slice(&bytes).ok()?;
            Some((e.path(), data))
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volume_stats_from_a_node_get_volume_stats_answer() {
        use csi_proto::csi::{volume_usage::Unit, NodeGetVolumeStatsResponse, VolumeCondition, VolumeUsage};
        let resp = NodeGetVolumeStatsResponse {
            usage: vec![
                VolumeUsage { available: 60, total: 100, used: 40, unit: Unit::Bytes as i32 },
                VolumeUsage { available: 7, total: 10, used: 3, unit: Unit::Inodes as i32 },
            ],
            volume_condition: Some(VolumeCondition { abnormal: true, message: "backing file gone".into() }),
        };
        let v = stats_of(&resp);
        assert_eq!(
            (v.capacity_bytes, v.available_bytes, v.used_bytes, v.inodes, v.inodes_free, v.inodes_used, v.abnormal),
            (100, 60, 40, 10, 7, 3, Some(true))
        );
        assert_eq!(stats_of(&NodeGetVolumeStatsResponse::default()).abnormal, None);
    }
    use k8s_openapi::api::core::v1::{CSIPersistentVolumeSource, PersistentVolumeSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pv(modes: &[&str], mode: Option<&str>) -> PersistentVolume {
        PersistentVolume {
            metadata: ObjectMeta { name: Some("pvc-1".into()), ..Default::default() },
            spec: Some(PersistentVolumeSpec {
                access_modes: Some(modes.iter().map(|m| m.to_string()).collect()),
                csi: Some(CSIPersistentVolumeSource {
                    driver: "loop.csi.ferro.dev".into(),
                    volume_handle: "loop-abc".into(),
                    fs_type: Some("xfs".into()),
                    volume_attributes: Some(BTreeMap::from([("provisioning".to_string(), "thin".to_string())])),
                    ..Default::default()
                }),
                mount_options: Some(vec!["noatime".into()]),
                volume_mode: mode.map(String::from),
                ..Default::default()
            }),
            status: None,
        }
    }

    #[test]
    fn paths_and_capability_follow_upstream() {
        let root = Path::new("/var/lib/kubelet");
        let p = plan_mount(root, "u1", "n1", "data", false, &PersistentVolumeClaim::default(), &pv(&["ReadWriteOnce"], None)).expect("plan");
        assert_eq!(p.target, PathBuf::from("/var/lib/kubelet/pods/u1/volumes/kubernetes.io~csi/pvc-1/mount"));
        let staging = p.data.staging_path.to_string_lossy().into_owned();
        assert!(staging.starts_with("/var/lib/kubelet/plugins/kubernetes.io/csi/loop.csi.ferro.dev/"), "{staging}");
        assert!(staging.ends_with("/globalmount"));
        assert_eq!(staging.split('/').nth_back(1).map(str::len), Some(64), "sha256 of the handle");
        assert_eq!(p.capability.access_mode.map(|m| m.mode), Some(Mode::SingleNodeWriter as i32));
        match p.capability.access_type {
            Some(AccessType::Mount(m)) => assert_eq!((m.fs_type.as_str(), m.mount_flags), ("xfs", vec!["noatime".to_string()])),
            other => panic!("{other:?}"),
        }
        assert_eq!(p.volume_context.get("provisioning").map(String::as_str), Some("thin"));
        assert!(!p.readonly);
        let ro = plan_mount(root, "u1", "n1", "data", true, &PersistentVolumeClaim::default(), &pv(&["ReadWriteOncePod"], None)).expect("plan");
        assert!(ro.readonly);
        assert_eq!(ro.capability.access_mode.map(|m| m.mode), Some(Mode::SingleNodeSingleWriter as i32));
    }

    #[test]
    fn fs_group_follows_the_drivers_policy() {
        let root = Path::new("/r");
        let rwo = plan_mount(root, "u", "n", "v", false, &PersistentVolumeClaim::default(), &pv(&["ReadWriteOnce"], None)).expect("plan");
        assert!(applies_fs_group(None, &rwo), "default policy, RWO with fsType");
        assert!(applies_fs_group(Some("ReadWriteOnceWithFSType"), &rwo));
        assert!(!applies_fs_group(Some("None"), &rwo));
        let rox = plan_mount(root, "u", "n", "v", false, &PersistentVolumeClaim::default(), &pv(&["ReadOnlyMany"], None)).expect("plan");
        assert!(!applies_fs_group(None, &rox), "not a single-node writer");
        assert!(applies_fs_group(Some("File"), &rox));
        let ro = plan_mount(root, "u", "n", "v", true, &PersistentVolumeClaim::default(), &pv(&["ReadWriteOnce"], None)).expect("plan");
        assert!(!applies_fs_group(Some("File"), &ro), "read-only");
    }

    #[test]
    fn volumes_the_agent_cannot_mount_say_why() {
        let root = Path::new("/r");
        let mut not_csi = pv(&["ReadWriteOnce"], None);
        not_csi.spec.as_mut().expect("spec").csi = None;
        let e = plan_mount(root, "u", "n", "v", false, &PersistentVolumeClaim::default(), &not_csi).expect_err("not csi");
        assert!(e.to_string().contains("not a CSI volume"), "{e}");
        let claim_fs = PersistentVolumeClaim { spec: Some(Default::default()), ..Default::default() };
        let e = plan_mount(root, "u", "n", "v", false, &claim_fs, &pv(&["ReadWriteOnce"], Some("Block"))).expect_err("modes differ");
        assert!(e.to_string().contains("volumeMode"), "{e}");
    }

    #[test]
    fn a_raw_block_volume_is_published_as_a_device_node() {
        let claim = PersistentVolumeClaim {
            spec: Some(k8s_openapi::api::core::v1::PersistentVolumeClaimSpec { volume_mode: Some("Block".into()), ..Default::default() }),
            ..Default::default()
        };
        let p = plan_mount(Path::new("/r"), "u", "n", "v", false, &claim, &pv(&["ReadWriteOnce"], Some("Block"))).expect("plan");
        assert_eq!(p.target, PathBuf::from("/r/pods/u/volumes/kubernetes.io~csi/pvc-1/dev"));
        assert!(matches!(p.capability.access_type, Some(AccessType::Block(_))));
        assert_eq!(p.data.volume_mode, "Block");
        assert_eq!(p.data.target_in(Path::new("/d")), PathBuf::from("/d/dev"));
    }

    fn csi_driver(modes: Option<&[&str]>, pod_info: Option<bool>) -> CSIDriver {
        CSIDriver {
            metadata: ObjectMeta { name: Some("loop.csi.ferro.dev".into()), ..Default::default() },
            spec: k8s_openapi::api::storage::v1::CSIDriverSpec {
                volume_lifecycle_modes: modes.map(|m| m.iter().map(|s| s.to_string()).collect()),
                pod_info_on_mount: pod_info,
                ..Default::default()
            },
        }
    }

    fn inline_pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "app", "namespace": "team", "uid": "5b2e7a4c-1f3d-4e6a-9c8b-0d1e2f3a4b5c"},
            "spec": {"serviceAccountName": "builder", "containers": [{"name": "c"}], "volumes": [
                {"name": "scratch", "csi": {"driver": "loop.csi.ferro.dev", "fsType": "xfs", "readOnly": true,
                 "volumeAttributes": {"size": "64Mi", "csi.storage.k8s.io/pod.name": "spoofed"}}}
            ]}
        }))
        .expect("pod")
    }

    fn inline_source(pod: &Pod) -> CSIVolumeSource {
        pod.spec.as_ref().and_then(|s| s.volumes.as_ref()).and_then(|v| v[0].csi.clone()).expect("csi source")
    }

    #[test]
    fn an_inline_volume_has_upstreams_handle_and_paths_and_no_staging() {
        let pod = inline_pod();
        let uid = pod.metadata.uid.clone().expect("uid");
        let h = inline_handle(&uid, "scratch");
        // sha256("5b2e7a4c-1f3d-4e6a-9c8b-0d1e2f3a4b5c" + "scratch"), as upstream's makeVolumeHandle.
        assert_eq!(h, "csi-9cc49c22540d9590fc7bdacc4fa608fca8b3ca3c2cd0e4dedcdb174984d93faf");
        assert_ne!(h, inline_handle(&uid, "other"));
        let p = plan_inline(Path::new("/var/lib/kubelet"), &uid, "n1", "scratch", &inline_source(&pod));
        assert_eq!(
            p.target,
            PathBuf::from(format!("/var/lib/kubelet/pods/{uid}/volumes/kubernetes.io~csi/scratch/mount"))
        );
        assert_eq!(p.data.volume_handle, h);
        assert_eq!(p.data.spec_vol_id, "scratch");
        assert_eq!(p.data.volume_lifecycle_mode, "Ephemeral");
        assert!(p.data.is_ephemeral());
        assert_eq!(p.data.staging_path, PathBuf::new(), "never staged");
        assert!(p.readonly, "csi.readOnly");
        assert_eq!(p.capability.access_mode.map(|m| m.mode), Some(Mode::SingleNodeWriter as i32));
        match &p.capability.access_type {
            Some(AccessType::Mount(m)) => assert_eq!((m.fs_type.as_str(), m.mount_flags.len()), ("xfs", 0)),
            other => panic!("{other:?}"),
        }
        assert_eq!(p.volume_context.get("size").map(String::as_str), Some("64Mi"));
        // vol_data.json: upstream's keys, no staging path, round-tripping.
        let json = serde_json::to_value(&p.data).expect("json");
        assert_eq!(json["volumeLifecycleMode"], "Ephemeral");
        assert_eq!(json["volumeHandle"], h.as_str());
        assert_eq!(json["specVolID"], "scratch");
        assert!(json.get("stagingPath").is_none(), "{json}");
        let back: VolData = serde_json::from_value(json).expect("read back");
        assert_eq!(back, p.data);
    }

    #[test]
    fn pod_info_goes_into_the_publish_context_only_with_pod_info_on_mount() {
        let pod = inline_pod();
        let uid = pod.metadata.uid.clone().expect("uid");
        let with = csi_driver(Some(&["Persistent", "Ephemeral"]), Some(true));
        let info = pod_info(&pod, Some(&with), true);
        let want: BTreeMap<String, String> = [
            ("csi.storage.k8s.io/pod.name", "app"),
            ("csi.storage.k8s.io/pod.namespace", "team"),
            ("csi.storage.k8s.io/pod.uid", uid.as_str()),
            ("csi.storage.k8s.io/serviceAccount.name", "builder"),
            ("csi.storage.k8s.io/ephemeral", "true"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(info, want);
        assert_eq!(pod_info(&pod, Some(&with), false)["csi.storage.k8s.io/ephemeral"], "false", "a persistent volume's");
        assert!(pod_info(&pod, Some(&csi_driver(None, Some(false))), true).is_empty());
        assert!(pod_info(&pod, Some(&csi_driver(None, None)), true).is_empty());
        assert!(pod_info(&pod, None, true).is_empty(), "no CSIDriver object: no pod info");
        let mut p = plan_inline(Path::new("/r"), &uid, "n1", "scratch", &inline_source(&pod));
        p.pod_info = info;
        let ctx = p.publish_context();
        assert_eq!(ctx["size"], "64Mi");
        assert_eq!(ctx["csi.storage.k8s.io/pod.name"], "app", "pod info over an attribute of the same key");
        assert_eq!(ctx["csi.storage.k8s.io/ephemeral"], "true");
        assert_eq!(p.volume_context["csi.storage.k8s.io/pod.name"], "spoofed", "NodeStage's context is the attributes");
    }

    #[test]
    fn the_ephemeral_mode_needs_a_csidriver_that_lists_it() {
        let both = csi_driver(Some(&["Persistent", "Ephemeral"]), Some(true));
        assert!(check_lifecycle_mode("v", "loop.csi.ferro.dev", Some(&both), EPHEMERAL).is_ok());
        assert!(check_lifecycle_mode("v", "loop.csi.ferro.dev", Some(&both), PERSISTENT).is_ok());
        let persistent = csi_driver(Some(&["Persistent"]), None);
        let e = check_lifecycle_mode("v", "d.example", Some(&persistent), EPHEMERAL).expect_err("persistent only");
        assert_eq!(
            e.to_string(),
            "MountVolume.NewMounter initialization failed for volume \"v\" : volume mode \"Ephemeral\" not supported by driver d.example (only supports [\"Persistent\"])"
        );
        let defaulted = csi_driver(None, None);
        let e = check_lifecycle_mode("v", "d.example", Some(&defaulted), EPHEMERAL).expect_err("defaulted");
        assert!(e.to_string().ends_with("(only supports [\"Persistent\"])"), "{e}");
        let inline_only = csi_driver(Some(&["Ephemeral"]), None);
        let e = check_lifecycle_mode("v", "d.example", Some(&inline_only), PERSISTENT).expect_err("ephemeral only");
        assert!(e.to_string().contains("volume mode \"Persistent\" not supported by driver d.example (only supports [\"Ephemeral\"])"), "{e}");
        assert!(check_lifecycle_mode("v", "none.example", None, PERSISTENT).is_ok(), "no object: persistent is fine");
        let e = check_lifecycle_mode("v", "none.example", None, EPHEMERAL).expect_err("no object");
        assert!(e.to_string().ends_with("volume mode \"Ephemeral\" not supported by driver none.example (no CSIDriver object)"), "{e}");
        assert_eq!(go_quoted(&["Persistent".into(), "Ephemeral".into()]), "[\"Persistent\" \"Ephemeral\"]");
    }

    #[test]
    fn a_final_publish_error_of_an_inline_volume_removes_its_dir() {
        use tonic::Code;
        for code in [Code::InvalidArgument, Code::NotFound, Code::AlreadyExists, Code::Internal, Code::FailedPrecondition] {
            assert!(is_final(code), "{code:?}");
        }
        for code in [Code::Cancelled, Code::DeadlineExceeded, Code::Unavailable, Code::ResourceExhausted, Code::Aborted] {
            assert!(!is_final(code), "{code:?}");
        }
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("scratch");
        std::fs::create_dir_all(dir.join("mount")).expect("mkdir");
        std::fs::write(dir.join(VOL_DATA), b"{}").expect("vol_data");
        remove_mount_dir(&dir.join("mount"));
        assert!(!dir.exists(), "mount dir, vol_data.json and volume dir removed");
        remove_mount_dir(&dir.join("mount"));
        // Something in the target (a mount point would refuse the same way): all kept.
        std::fs::create_dir_all(dir.join("mount")).expect("mkdir");
        std::fs::write(dir.join("mount/f"), b"x").expect("file");
        std::fs::write(dir.join(VOL_DATA), b"{}").expect("vol_data");
        remove_mount_dir(&dir.join("mount"));
        assert!(dir.join(VOL_DATA).exists() && dir.join("mount/f").exists());
    }

    #[test]
    fn fs_group_on_an_inline_volume_follows_its_fs_type_and_the_policy() {
        let mut src = inline_source(&inline_pod());
        src.read_only = None;
        let p = plan_inline(Path::new("/r"), "u", "n", "scratch", &src);
        assert!(applies_fs_group(Some("ReadWriteOnceWithFSType"), &p), "RWO with an fsType, as upstream");
        src.fs_type = None;
        let no_fs = plan_inline(Path::new("/r"), "u", "n", "scratch", &src);
        assert!(!applies_fs_group(None, &no_fs), "no fsType: not under the default policy");
        assert!(applies_fs_group(Some("File"), &no_fs));
        src.read_only = Some(true);
        assert!(!applies_fs_group(Some("File"), &plan_inline(Path::new("/r"), "u", "n", "scratch", &src)));
    }

    #[test]
    fn vol_data_round_trips_with_upstreams_keys() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = VolData {
            driver_name: "loop.csi.ferro.dev".into(),
            volume_handle: "loop-abc".into(),
            spec_vol_id: "pvc-1".into(),
            node_name: "n1".into(),
            volume_lifecycle_mode: "Persistent".into(),
            staging_path: "/r/plugins/x/globalmount".into(),
            volume_mode: String::new(),
        };
        let json = serde_json::to_value(&d).expect("json");
        assert_eq!(json["specVolID"], "pvc-1");
        assert_eq!(json["driverName"], "loop.csi.ferro.dev");
        std::fs::create_dir_all(dir.path().join("pvc-1")).expect("mkdir");
        std::fs::write(dir.path().join("pvc-1").join(VOL_DATA), json.to_string()).expect("write");
        std::fs::create_dir_all(dir.path().join("junk")).expect("mkdir");
        assert_eq!(read_vol_data(dir.path()), vec![(dir.path().join("pvc-1"), d)]);
    }
}
