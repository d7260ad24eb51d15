//! A pod's volumes on the host: what the agent prepares before the pod's containers start and
//! removes when the pod is gone.
//!
//! ```text
//! <root>/pods/<uid>/
//!   containers/                                  (the executor writes here)
//!   volumes/kubernetes.io~empty-dir/<name>/      0777 directory; tmpfs for medium Memory
//!   volumes/kubernetes.io~configmap/<name>/      atomic-writer payload
//!   volumes/kubernetes.io~secret/<name>/         tmpfs + atomic-writer payload
//!   volumes/kubernetes.io~downward-api/<name>/   tmpfs + atomic-writer payload
//!   volumes/kubernetes.io~projected/<name>/      tmpfs + atomic-writer payload
//!   plugins/kubernetes.io~empty-dir/<name>/ready an emptyDir's setup is complete
//! ```
//!
//! hostPath volumes have no directory here: the host path is checked (and created for the
//! `*OrCreate` types) and handed to the runtime as is. As upstream, secret, downwardAPI and
//! projected volumes live on tmpfs (a projection may hold secrets) sized like a memory-backed
//! emptyDir: min(node allocatable memory, the pod's memory limit when every container has one,
//! emptyDir.sizeLimit).
//!
//! With the pod's fsGroup, volumes get its group as upstream's SetVolumeOwnership gives it (see
//! [`ownership`]): an emptyDir once, when it is set up (until its `ready` marker exists,
//! or when its tmpfs had to be mounted again); the atomic-writer volumes on every new payload.
//!
//! [`validate`] is pure and runs at admission; [`setup`] is idempotent and runs on every sync
//! (a changed ConfigMap or Secret is swapped in atomically, see [`atomic_writer`]);
//! [`teardown`] unmounts what is mounted under the pod directory and removes it.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::fs;
use std::io::ErrorKind;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, DownwardAPIVolumeFile, KeyToPath, Pod, Volume};
use nix::mount::{mount, umount2, MntFlags, MsFlags};

pub mod atomic_writer;
pub mod ownership;

use atomic_writer::{write_payload, FileProjection};
use super::model::Objects;
use ownership::ChangePolicy;

/// Where the mounts of this process are listed.
pub const MOUNTINFO: &str = "/proc/self/mountinfo";

const EMPTY_DIR: &str = "kubernetes.io~empty-dir";
const CONFIG_MAP: &str = "kubernetes.io~configmap";
const SECRET: &str = "kubernetes.io~secret";
const DOWNWARD_API: &str = "kubernetes.io~downward-api";
const PROJECTED: &str = "kubernetes.io~projected";
/// The marker of a completely set up emptyDir, in its plugin directory (upstream's ready file).
const READY: &str = "ready";

/// Upstream's default file mode for configMap, secret, downwardAPI and projected volumes.
const DEFAULT_MODE: u32 = 0o644;

/// Errors of volume validation, setup and teardown. The messages are meant for pod events and
/// status, so they are complete on their own (an I/O error's cause is part of the message).
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("volume {volume:?}: {kind} volumes are not supported yet")]
    NotSupportedYet { volume: String, kind: &'static str },
    #[error("volume {volume:?}: unknown or unsupported volume type")]
    UnknownType { volume: String },
    #[error("volume {volume:?}: more than one volume source ({sources})")]
    MultipleSources { volume: String, sources: String },
    #[error("volume {volume:?}: duplicate volume name")]
    DuplicateName { volume: String },
    #[error("volume {volume:?}: {reason}")]
    Invalid { volume: String, reason: String },
    #[error("invalid pod uid {0:?}")]
    InvalidUid(String),
    /// An error setting up one volume, worded as upstream's FailedMount event.
    #[error("MountVolume.SetUp failed for volume {volume:?} : {error}")]
    SetUp { volume: String, error: Box<VolumeError> },
    #[error("configmap {0:?} not found")]
    ConfigMapNotFound(String),
    #[error("secret {0:?} not found")]
    SecretNotFound(String),
    #[error("configmap {name:?} has no key {key:?}")]
    ConfigMapKey { name: String, key: String },
    #[error("secret {name:?} has no key {key:?}")]
    SecretKey { name: String, key: String },
    #[error("hostPath type check failed: {} is not a {what}", path.display())]
    HostPathType { path: PathBuf, what: &'static str },
    #[error("{0:?} is an invalid hostPath type")]
    HostPathTypeInvalid(String),
    #[error("serviceAccountToken projection needs a token")]
    NoToken,
    #[error("downwardAPI: {0}")]
    DownwardApi(String),
    #[error("invalid path {path:?}: {reason}")]
    BadPath { path: String, reason: &'static str },
    #[error("{} exists and is not a symlink", .0.display())]
    NotSymlink(PathBuf),
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("mount tmpfs on {}: {source}", path.display())]
    Mount {
        path: PathBuf,
        #[source]
        source: nix::Error,
    },
    #[error("unmount {}: {source}", path.display())]
    Unmount {
        path: PathBuf,
        #[source]
        source: nix::Error,
    },
    #[error("{} is still mounted, not removing the pod directory", .0.display())]
    StillMounted(PathBuf),
}

impl VolumeError {
    /// The volume the error is about, when it is about one.
    pub fn volume(&self) -> Option<&str> {
        match self {
            VolumeError::NotSupportedYet { volume, .. }
            | VolumeError::UnknownType { volume }
            | VolumeError::MultipleSources { volume, .. }
            | VolumeError::DuplicateName { volume }
            | VolumeError::Invalid { volume, .. }
            | VolumeError::SetUp { volume, .. } => Some(volume),
            _ => None,
        }
    }
}

fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> VolumeError {
    let path = path.to_path_buf();
    move |source| VolumeError::Io { op, path, source }
}

/// A prepared volume: the host path the runtime mounts into containers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumePath {
    pub host_path: PathBuf,
    /// True for volumes the kubelet owns the contents of (configMap, secret, downwardAPI,
    /// projected): containers always get them read-only.
    pub read_only: bool,
}

/// `<root>/pods/<uid>`
pub fn pod_dir(root: &Path, uid: &str) -> PathBuf {
    root.join("pods").join(uid)
}

fn check_uid(uid: &str) -> Result<(), VolumeError> {
    if uid.is_empty() || uid == "." || uid == ".." || uid.contains('/') || uid.contains('\0') {
        return Err(VolumeError::InvalidUid(uid.to_string()));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Validation (pure)

/// The volume sources set on `v`, by API field name.
fn sources(v: &Volume) -> Vec<&'static str> {
    let all = [
        ("emptyDir", v.empty_dir.is_some()),
        ("hostPath", v.host_path.is_some()),
        ("configMap", v.config_map.is_some()),
        ("secret", v.secret.is_some()),
        ("downwardAPI", v.downward_api.is_some()),
        ("projected", v.projected.is_some()),
        ("persistentVolumeClaim", v.persistent_volume_claim.is_some()),
        ("csi", v.csi.is_some()),
        ("ephemeral", v.ephemeral.is_some()),
        ("image", v.image.is_some()),
        ("nfs", v.nfs.is_some()),
        ("iscsi", v.iscsi.is_some()),
        ("fc", v.fc.is_some()),
        ("rbd", v.rbd.is_some()),
        ("cephfs", v.cephfs.is_some()),
        ("glusterfs", v.glusterfs.is_some()),
        ("gitRepo", v.git_repo.is_some()),
        ("flexVolume", v.flex_volume.is_some()),
        ("awsElasticBlockStore", v.aws_elastic_block_store.is_some()),
        ("azureDisk", v.azure_disk.is_some()),
        ("azureFile", v.azure_file.is_some()),
        ("cinder", v.cinder.is_some()),
        ("flocker", v.flocker.is_some()),
        ("gcePersistentDisk", v.gce_persistent_disk.is_some()),
        ("photonPersistentDisk", v.photon_persistent_disk.is_some()),
        ("portworxVolume", v.portworx_volume.is_some()),
        ("quobyte", v.quobyte.is_some()),
        ("scaleIO", v.scale_io.is_some()),
        ("storageos", v.storageos.is_some()),
        ("vsphereVolume", v.vsphere_volume.is_some()),
    ];
    all.into_iter().filter(|(_, set)| *set).map(|(name, _)| name).collect()
}

const SUPPORTED: [&str; 8] =
    ["emptyDir", "hostPath", "configMap", "secret", "downwardAPI", "projected", "persistentVolumeClaim", "csi"];

const HOST_PATH_TYPES: [&str; 8] =
    ["", "DirectoryOrCreate", "Directory", "FileOrCreate", "File", "Socket", "CharDevice", "BlockDevice"];

/// Checks the pod's volumes before anything is created on the host: unique names, exactly one
/// supported source each, and the parts of each source the agent can check without the objects
/// it refers to (paths, modes, hostPath type, downward API fields).
pub fn validate(pod: &Pod) -> Result<(), VolumeError> {
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(());
    };
    let mut names = BTreeSet::new();
    for v in spec.volumes.iter().flatten() {
        if !names.insert(v.name.as_str()) {
            return Err(VolumeError::DuplicateName { volume: v.name.clone() });
        }
        let set = sources(v);
        match set.as_slice() {
            [] => return Err(VolumeError::UnknownType { volume: v.name.clone() }),
            [kind] if !SUPPORTED.contains(kind) => {
                return Err(VolumeError::NotSupportedYet { volume: v.name.clone(), kind })
            }
            [_] => {}
            many => return Err(VolumeError::MultipleSources { volume: v.name.clone(), sources: many.join(", ") }),
        }
        validate_source(pod, v).map_err(|reason| VolumeError::Invalid { volume: v.name.clone(), reason })?;
    }
    Ok(())
}

fn validate_source(pod: &Pod, v: &Volume) -> Result<(), String> {
    if let Some(c) = &v.persistent_volume_claim {
        if c.claim_name.is_empty() {
            return Err("persistentVolumeClaim.claimName is empty".into());
        }
    }
    if let Some(c) = &v.csi {
        if c.driver.is_empty() {
            return Err("csi.driver is empty".into());
        }
        // Upstream reads the Secret and hands it to NodePublishVolume; the agent does not
        // fetch node publish secrets (and ferro-control-plane's Node authorizer does not
        // relate a node to them): refused rather than published without them.
        if c.node_publish_secret_ref.is_some() {
            return Err("csi.nodePublishSecretRef is not supported yet".into());
        }
    }
    if let Some(ed) = &v.empty_dir {
        match ed.medium.as_deref().unwrap_or("") {
            "" | "Memory" => {}
            other => return Err(format!("emptyDir medium {other:?} is not supported")),
        }
        if let Some(q) = &ed.size_limit {
            nonneg(&q.0, 1).ok_or_else(|| format!("invalid emptyDir sizeLimit {:?}", q.0))?;
        }
    }
    if let Some(hp) = &v.host_path {
        if !hp.path.starts_with('/') {
            return Err(format!("hostPath path {:?} must be absolute", hp.path));
        }
        if hp.path.split('/').any(|c| c == "..") {
            return Err(format!("hostPath path {:?} must not contain '..'", hp.path));
        }
        let ty = hp.type_.as_deref().unwrap_or("");
        if !HOST_PATH_TYPES.contains(&ty) {
            return Err(format!("{ty:?} is an invalid hostPath type"));
        }
    }
    if let Some(cm) = &v.config_map {
        check_mode(cm.default_mode)?;
        check_items(cm.items.as_deref())?;
    }
    if let Some(s) = &v.secret {
        check_mode(s.default_mode)?;
        check_items(s.items.as_deref())?;
    }
    if let Some(d) = &v.downward_api {
        check_mode(d.default_mode)?;
        for item in d.items.iter().flatten() {
            check_downward_item(pod, item)?;
        }
    }
    if let Some(p) = &v.projected {
        check_mode(p.default_mode)?;
        for (i, src) in p.sources.iter().flatten().enumerate() {
            let mut kinds = Vec::new();
            if let Some(cm) = &src.config_map {
                kinds.push("configMap");
                check_items(cm.items.as_deref())?;
            }
            if let Some(s) = &src.secret {
                kinds.push("secret");
                check_items(s.items.as_deref())?;
            }
            if let Some(d) = &src.downward_api {
                kinds.push("downwardAPI");
                for item in d.items.iter().flatten() {
                    check_downward_item(pod, item)?;
                }
            }
            if let Some(t) = &src.service_account_token {
                kinds.push("serviceAccountToken");
                atomic_writer::validate_path(&t.path).map_err(|e| e.to_string())?;
            }
            if src.cluster_trust_bundle.is_some() {
                return Err("clusterTrustBundle projections are not supported yet".into());
            }
            match kinds.len() {
                0 => return Err(format!("projected source {i} has no known source")),
                1 => {}
                _ => return Err(format!("projected source {i} has more than one source ({})", kinds.join(", "))),
            }
        }
    }
    Ok(())
}

fn check_mode(mode: Option<i32>) -> Result<(), String> {
    match mode {
        Some(m) if !(0..=0o777).contains(&m) => Err(format!("mode {m:#o} must be between 0 and 0777")),
        _ => Ok(()),
    }
}

fn check_items(items: Option<&[KeyToPath]>) -> Result<(), String> {
    for item in items.into_iter().flatten() {
        check_mode(item.mode)?;
        atomic_writer::validate_path(&item.path).map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn check_downward_item(pod: &Pod, item: &DownwardAPIVolumeFile) -> Result<(), String> {
    check_mode(item.mode)?;
    atomic_writer::validate_path(&item.path).map_err(|e| e.to_string())?;
    match (&item.field_ref, &item.resource_field_ref) {
        (Some(f), None) => field_value(pod, &f.field_path).map(|_| ()).map_err(|e| e.to_string()),
        (None, Some(r)) => {
            container_for(pod, r.container_name.as_deref()).map_err(|e| e.to_string())?;
            if !RESOURCES.contains(&r.resource.as_str()) {
                return Err(format!("downwardAPI: unsupported resource {:?}", r.resource));
            }
            if let Some(d) = &r.divisor {
                if nonneg(&d.0, 1000).is_none_or(|m| m == 0) {
                    return Err(format!("downwardAPI: invalid divisor {:?}", d.0));
                }
            }
            Ok(())
        }
        _ => Err(format!("downwardAPI item {:?} needs exactly one of fieldRef and resourceFieldRef", item.path)),
    }
}

// ---------------------------------------------------------------------------------------------
// Setup

/// Prepares every volume of `pod` under `root`. Idempotent; called on every sync. Returns the
/// host paths by volume name. Runs [`validate`] first (its errors as they are), and needs
/// `metadata.uid` ([`VolumeError::InvalidUid`] otherwise). The first failing volume stops the
/// setup as [`VolumeError::SetUp`] naming it; volumes already prepared stay (a later sync or
/// [`teardown`] deals with them). Not for concurrent calls on the same pod: the pod's worker
/// serializes them.
pub fn setup(
    root: &Path,
    pod: &Pod,
    objects: &Objects,
    node_allocatable_cpu_milli: i64,
    node_allocatable_memory: i64,
) -> Result<BTreeMap<String, VolumePath>, VolumeError> {
    validate(pod)?;
    let uid = pod.metadata.uid.as_deref().unwrap_or("");
    check_uid(uid)?;
    let dir = pod_dir(root, uid);
    let containers = dir.join("containers");
    fs::create_dir_all(&containers).map_err(io("create directory", &containers))?;
    let dir = fs::canonicalize(&dir).map_err(io("resolve", &dir))?;
    // API validation keeps fsGroup within 0..=2147483647.
    let fs_group = pod
        .spec
        .as_ref()
        .and_then(|s| s.security_context.as_ref())
        .and_then(|sc| sc.fs_group)
        .and_then(|g| u32::try_from(g).ok());
    let mut ctx = Ctx {
        pod,
        objects,
        fs_group,
        volumes: dir.join("volumes"),
        plugins: dir.join("plugins"),
        cpu_milli: node_allocatable_cpu_milli,
        memory: node_allocatable_memory,
    };
    let mut out = BTreeMap::new();
    // persistentVolumeClaim and inline csi volumes are the CSI mounter's (crate::csi::mounter),
    // async.
    for v in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()).filter(|v| !is_csi(v)) {
        let path = ctx
            .setup_one(v)
            .map_err(|error| VolumeError::SetUp { volume: v.name.clone(), error: Box::new(error) })?;
        out.insert(v.name.clone(), path);
    }
    Ok(out)
}

/// Whether a volume is set up through a CSI driver (crate::csi::mounter): a claim's, or an
/// inline `csi:` volume.
pub fn is_csi(v: &Volume) -> bool {
    v.persistent_volume_claim.is_some() || v.csi.is_some()
}

struct Ctx<'a> {
    pod: &'a Pod,
    objects: &'a Objects,
    /// The pod's fsGroup.
    fs_group: Option<u32>,
    /// `<pod dir>/volumes`, canonical (compared with mount points).
    volumes: PathBuf,
    /// `<pod dir>/plugins`: per-volume state of the agent (the emptyDir ready markers).
    plugins: PathBuf,
    cpu_milli: i64,
    memory: i64,
}

/// Whether `dir` is a mount point: its device is not its parent's (what `mountpoint(1)` checks
/// first). The tmpfs mounts a pod's volumes get always differ from the directory they cover;
/// two stats instead of reading and parsing /proc/self/mountinfo, whose size grows with every
/// container and pod on the node, at each sync of each pod.
fn is_mount_point(dir: &Path) -> Result<bool, VolumeError> {
    let own = fs::symlink_metadata(dir).map_err(io("stat", dir))?;
    let parent = dir.parent().unwrap_or(dir);
    let up = fs::symlink_metadata(parent).map_err(io("stat", parent))?;
    Ok(own.dev() != up.dev())
}

impl Ctx<'_> {
    fn setup_one(&mut self, v: &Volume) -> Result<VolumePath, VolumeError> {
        if let Some(ed) = &v.empty_dir {
            let dir = self.volume_dir(EMPTY_DIR, &v.name)?;
            let mut mounted_now = false;
            if ed.medium.as_deref() == Some("Memory") {
                let limit = ed.size_limit.as_ref().and_then(|q| nonneg(&q.0, 1));
                mounted_now = self.ensure_tmpfs(&dir, limit)?;
            }
            // As upstream: ownership once, when the volume is set up; its ready marker is
            // written after, so a setup cut short is done again.
            let meta = self.plugins.join(EMPTY_DIR).join(&v.name);
            let ready = meta.join(READY);
            if mounted_now || !ready.exists() {
                if let Some(gid) = self.fs_group {
                    ownership::set_volume_ownership(&dir, gid, ChangePolicy::Always, false)?;
                }
                fs::create_dir_all(&meta).map_err(io("create directory", &meta))?;
                fs::write(&ready, b"").map_err(io("write", &ready))?;
            }
            return Ok(VolumePath { host_path: dir, read_only: false });
        }
        if let Some(hp) = &v.host_path {
            let path = PathBuf::from(&hp.path);
            check_host_path(&path, hp.type_.as_deref().unwrap_or(""))?;
            return Ok(VolumePath { host_path: path, read_only: false });
        }
        let (plugin, payload) = if let Some(cm) = &v.config_map {
            let mode = default_mode(cm.default_mode);
            let payload = self.config_map_payload(&cm.name, cm.items.as_deref(), cm.optional, mode)?;
            (CONFIG_MAP, payload)
        } else if let Some(s) = &v.secret {
            let mode = default_mode(s.default_mode);
            let name = s.secret_name.as_deref().unwrap_or("");
            (SECRET, self.secret_payload(name, s.items.as_deref(), s.optional, mode)?)
        } else if let Some(d) = &v.downward_api {
            let mode = default_mode(d.default_mode);
            (DOWNWARD_API, self.downward_payload(d.items.as_deref().unwrap_or_default(), mode)?)
        } else if let Some(p) = &v.projected {
            (PROJECTED, self.projected_payload(p)?)
        } else {
            // validate() has ruled this out.
            return Err(VolumeError::UnknownType { volume: v.name.clone() });
        };
        let dir = self.volume_dir(plugin, &v.name)?;
        if plugin != CONFIG_MAP {
            self.ensure_tmpfs(&dir, None)?;
        }
        write_payload(&dir, &payload, self.fs_group)?;
        Ok(VolumePath { host_path: dir, read_only: true })
    }

    /// `<pod dir>/volumes/<plugin>/<name>`, created 0777 (as upstream) when missing.
    fn volume_dir(&self, plugin: &str, name: &str) -> Result<PathBuf, VolumeError> {
        let dir = self.volumes.join(plugin).join(name);
        if let Some(parent) = dir.parent() {
            fs::DirBuilder::new().recursive(true).mode(0o750).create(parent).map_err(io("create directory", parent))?;
        }
        match fs::DirBuilder::new().mode(0o777).create(&dir) {
            Ok(()) => {
                fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).map_err(io("chmod", &dir))?;
            }
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io("create directory", &dir)(e)),
        }
        Ok(dir)
    }

    /// Mounts a tmpfs on `dir` unless one is mounted there already; true when it mounted one.
    /// Size: the smallest of `size_limit`, the pod's memory limit and the node's allocatable
    /// memory (upstream's sizing of memory-backed volumes); no size option when none is known.
    fn ensure_tmpfs(&mut self, dir: &Path, size_limit: Option<i128>) -> Result<bool, VolumeError> {
        if is_mount_point(dir)? {
            return Ok(false);
        }
        let size = [size_limit, pod_memory_limit(self.pod), (self.memory > 0).then_some(i128::from(self.memory))]
            .into_iter()
            .flatten()
            .filter(|s| *s > 0)
            .min();
        let options = size.map(|s| format!("size={s}"));
        mount(Some("tmpfs"), dir, Some("tmpfs"), MsFlags::empty(), options.as_deref())
            .map_err(|source| VolumeError::Mount { path: dir.to_path_buf(), source })?;
        Ok(true)
    }

    fn config_map_payload(
        &self,
        name: &str,
        items: Option<&[KeyToPath]>,
        optional: Option<bool>,
        mode: u32,
    ) -> Result<BTreeMap<String, FileProjection>, VolumeError> {
        let data = self.objects.config_maps.get(name).map(|cm| {
            let mut m: BTreeMap<String, Vec<u8>> = BTreeMap::new();
            for (k, v) in cm.data.iter().flatten() {
                m.insert(k.clone(), v.as_bytes().to_vec());
            }
            for (k, v) in cm.binary_data.iter().flatten() {
                m.insert(k.clone(), v.0.clone());
            }
            m
        });
        key_payload(data, items, optional.unwrap_or(false), mode, || VolumeError::ConfigMapNotFound(name.into()), |key| {
            VolumeError::ConfigMapKey { name: name.into(), key: key.into() }
        })
    }

    fn secret_payload(
        &self,
        name: &str,
        items: Option<&[KeyToPath]>,
        optional: Option<bool>,
        mode: u32,
    ) -> Result<BTreeMap<String, FileProjection>, VolumeError> {
        let data = self.objects.secrets.get(name).map(|s| {
            s.data.iter().flatten().map(|(k, v)| (k.clone(), v.0.clone())).collect::<BTreeMap<_, _>>()
        });
        key_payload(data, items, optional.unwrap_or(false), mode, || VolumeError::SecretNotFound(name.into()), |key| {
            VolumeError::SecretKey { name: name.into(), key: key.into() }
        })
    }

    fn downward_payload(
        &self,
        items: &[DownwardAPIVolumeFile],
        mode: u32,
    ) -> Result<BTreeMap<String, FileProjection>, VolumeError> {
        let mut out = BTreeMap::new();
        for item in items {
            let data = if let Some(f) = &item.field_ref {
                field_value(self.pod, &f.field_path)?
            } else if let Some(r) = &item.resource_field_ref {
                let c = container_for(self.pod, r.container_name.as_deref())?;
                let divisor = r.divisor.as_ref().map(|q| q.0.as_str());
                resource_value(c, &r.resource, divisor, self.cpu_milli, self.memory)?
            } else {
                return Err(VolumeError::DownwardApi(format!("item {:?} has no fieldRef or resourceFieldRef", item.path)));
            };
            let mode = item.mode.map(to_mode).unwrap_or(mode);
            out.insert(item.path.clone(), FileProjection { data: data.into_bytes(), mode });
        }
        Ok(out)
    }

    fn projected_payload(
        &self,
        p: &k8s_openapi::api::core::v1::ProjectedVolumeSource,
    ) -> Result<BTreeMap<String, FileProjection>, VolumeError> {
        let mode = default_mode(p.default_mode);
        let mut out = BTreeMap::new();
        for src in p.sources.iter().flatten() {
            if let Some(cm) = &src.config_map {
                out.extend(self.config_map_payload(&cm.name, cm.items.as_deref(), cm.optional, mode)?);
            }
            if let Some(s) = &src.secret {
                out.extend(self.secret_payload(&s.name, s.items.as_deref(), s.optional, mode)?);
            }
            if let Some(d) = &src.downward_api {
                out.extend(self.downward_payload(d.items.as_deref().unwrap_or_default(), mode)?);
            }
            if let Some(t) = &src.service_account_token {
                let token = self.objects.service_account_token.as_ref().ok_or(VolumeError::NoToken)?;
                // As upstream: with an fsGroup the token is 0600, which the ownership step
                // makes 0640 (readable by the group, not by everyone as defaultMode 0644 is).
                let mode = if self.fs_group.is_some() { 0o600 } else { mode };
                out.insert(t.path.clone(), FileProjection { data: token.as_bytes().to_vec(), mode });
            }
        }
        Ok(out)
    }
}

fn to_mode(m: i32) -> u32 {
    u32::try_from(m).unwrap_or(DEFAULT_MODE) & 0o777
}

fn default_mode(m: Option<i32>) -> u32 {
    m.map(to_mode).unwrap_or(DEFAULT_MODE)
}

/// The files of a configMap/secret source: every key (path = key, `mode`) or just `items`.
/// `data` None: the object does not exist.
fn key_payload(
    data: Option<BTreeMap<String, Vec<u8>>>,
    items: Option<&[KeyToPath]>,
    optional: bool,
    mode: u32,
    not_found: impl FnOnce() -> VolumeError,
    missing_key: impl Fn(&str) -> VolumeError,
) -> Result<BTreeMap<String, FileProjection>, VolumeError> {
    let Some(data) = data else {
        return if optional { Ok(BTreeMap::new()) } else { Err(not_found()) };
    };
    let mut out = BTreeMap::new();
    match items {
        Some(items) if !items.is_empty() => {
            for item in items {
                match data.get(&item.key) {
                    Some(bytes) => {
                        let mode = item.mode.map(to_mode).unwrap_or(mode);
                        out.insert(item.path.clone(), FileProjection { data: bytes.clone(), mode });
                    }
                    None if optional => {}
                    None => return Err(missing_key(&item.key)),
                }
            }
        }
        _ => {
            for (key, bytes) in data {
                out.insert(key, FileProjection { data: bytes, mode });
            }
        }
    }
    Ok(out)
}

fn check_host_path(path: &Path, ty: &str) -> Result<(), VolumeError> {
    let meta = match fs::metadata(path) {
        Ok(m) => Some(m),
        Err(e) if e.kind() == ErrorKind::NotFound => None,
        Err(e) => return Err(io("stat", path)(e)),
    };
    let fail = |what| Err(VolumeError::HostPathType { path: path.to_path_buf(), what });
    let ft = meta.as_ref().map(|m| m.file_type());
    match ty {
        "" => Ok(()),
        "DirectoryOrCreate" if meta.is_none() => {
            fs::DirBuilder::new().recursive(true).mode(0o755).create(path).map_err(io("create directory", path))
        }
        "DirectoryOrCreate" | "Directory" if ft.is_some_and(|t| t.is_dir()) => Ok(()),
        "DirectoryOrCreate" | "Directory" => fail("directory"),
        // As upstream, FileOrCreate does not create the parent directory.
        "FileOrCreate" if meta.is_none() => fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .open(path)
            .map(drop)
            .map_err(io("create file", path)),
        "FileOrCreate" | "File" if ft.is_some_and(|t| t.is_file()) => Ok(()),
        "FileOrCreate" | "File" => fail("file"),
        "Socket" if ft.is_some_and(|t| t.is_socket()) => Ok(()),
        "Socket" => fail("socket file"),
        "CharDevice" if ft.is_some_and(|t| t.is_char_device()) => Ok(()),
        "CharDevice" => fail("character device"),
        "BlockDevice" if ft.is_some_and(|t| t.is_block_device()) => Ok(()),
        "BlockDevice" => fail("block device"),
        other => Err(VolumeError::HostPathTypeInvalid(other.to_string())),
    }
}

// ---------------------------------------------------------------------------------------------
// Downward API (pure)

/// One downward API fieldRef as a file's contents.
fn field_value(pod: &Pod, field_path: &str) -> Result<String, VolumeError> {
    let m = &pod.metadata;
    let subscript = |prefix: &str| {
        field_path
            .strip_prefix(prefix)
            .and_then(|rest| rest.strip_prefix("['"))
            .and_then(|rest| rest.strip_suffix("']"))
            .map(str::to_string)
    };
    Ok(match field_path {
        "metadata.name" => m.name.clone().unwrap_or_default(),
        "metadata.namespace" => m.namespace.clone().unwrap_or_default(),
        "metadata.uid" => m.uid.clone().unwrap_or_default(),
        "metadata.labels" => format_map(m.labels.as_ref()),
        "metadata.annotations" => format_map(m.annotations.as_ref()),
        _ => {
            if let Some(key) = subscript("metadata.labels") {
                m.labels.as_ref().and_then(|l| l.get(&key)).cloned().unwrap_or_default()
            } else if let Some(key) = subscript("metadata.annotations") {
                m.annotations.as_ref().and_then(|a| a.get(&key)).cloned().unwrap_or_default()
            } else {
                return Err(VolumeError::DownwardApi(format!("unsupported fieldPath {field_path:?}")));
            }
        }
    })
}

/// Labels or annotations as upstream writes them: one `key="value"` line per entry, sorted by
/// key, the value quoted as Go's %q, no newline after the last line.
pub fn format_map(map: Option<&BTreeMap<String, String>>) -> String {
    map.into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", go_quote(v)))
        .collect::<Vec<_>>()
        .join("\n")
}

pub use k8s_semantics::quote::go_quote;

const RESOURCES: [&str; 6] = [
    "limits.cpu",
    "limits.memory",
    "limits.ephemeral-storage",
    "requests.cpu",
    "requests.memory",
    "requests.ephemeral-storage",
];

fn container_for<'p>(pod: &'p Pod, name: Option<&str>) -> Result<&'p Container, VolumeError> {
    let name = name.filter(|n| !n.is_empty()).ok_or_else(|| {
        VolumeError::DownwardApi("resourceFieldRef needs containerName in a volume".into())
    })?;
    pod.spec
        .iter()
        .flat_map(|s| s.containers.iter().chain(s.init_containers.iter().flatten()))
        .find(|c| c.name == name)
        .ok_or_else(|| VolumeError::DownwardApi(format!("container {name:?} not found")))
}

/// A resourceFieldRef as a file's contents:
/// [`k8s_semantics::resources::container_resource_value`] with the node's allocatable cpu and
/// memory for unset limits.
fn resource_value(
    c: &Container,
    resource: &str,
    divisor: Option<&str>,
    node_cpu_milli: i64,
    node_memory: i64,
) -> Result<String, VolumeError> {
    use k8s_semantics::resources::{container_resource_value, NodeAllocatable, ResourceFieldError as E};
    let node = NodeAllocatable { cpu_milli: node_cpu_milli, memory: node_memory, ephemeral_storage: None };
    container_resource_value(c, resource, divisor, &node).map_err(|e| {
        VolumeError::DownwardApi(match e {
            E::Unsupported(_) => format!("unsupported resource {resource:?}"),
            E::InvalidQuantity { quantity, .. } => format!("invalid quantity {quantity:?} for {resource}"),
            E::UnknownNodeValue(_) => format!(
                "container {:?} has no {resource} and the node's allocatable ephemeral storage is not known",
                c.name
            ),
        })
    })
}

/// A non-negative quantity times `scale`, rounded up (scale 1: upstream's Value, 1000: its
/// MilliValue); None when it does not parse or is negative.
fn nonneg(s: &str, scale: i128) -> Option<i128> {
    k8s_semantics::quantity::scaled(s, scale).filter(|v| *v >= 0)
}

/// The pod's memory limit as upstream's pod cgroup has it: known only when every container
/// (init included) has one; the sum over app containers, or the largest init container's when
/// that is larger.
fn pod_memory_limit(pod: &Pod) -> Option<i128> {
    let spec = pod.spec.as_ref()?;
    let limit = |c: &Container| {
        c.resources
            .as_ref()
            .and_then(|r| r.limits.as_ref())
            .and_then(|l| l.get("memory"))
            .and_then(|q| nonneg(&q.0, 1))
            .filter(|v| *v > 0)
    };
    let mut sum = 0i128;
    for c in &spec.containers {
        sum += limit(c)?;
    }
    let mut init_max = 0i128;
    for c in spec.init_containers.iter().flatten() {
        init_max = init_max.max(limit(c)?);
    }
    Some(sum.max(init_max))
}

// ---------------------------------------------------------------------------------------------
// Mounts and teardown

/// One line of /proc/self/mountinfo: the mount point and the filesystem type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    pub mount_point: PathBuf,
    pub fs_type: String,
}

fn read_mountinfo() -> Result<String, VolumeError> {
    fs::read_to_string(MOUNTINFO).map_err(io("read", Path::new(MOUNTINFO)))
}

/// Parses mountinfo text (in order, later mounts last). Mount points have their octal escapes
/// (`\040` for a space) decoded.
pub fn mount_points(mountinfo: &str) -> Vec<MountEntry> {
    let mut out = Vec::new();
    for line in mountinfo.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(mp) = fields.get(4) else {
            continue;
        };
        let fs_type = fields
            .iter()
            .position(|f| *f == "-")
            .and_then(|i| fields.get(i + 1))
            .map(|s| s.to_string())
            .unwrap_or_default();
        out.push(MountEntry { mount_point: PathBuf::from(unescape_octal(mp)), fs_type });
    }
    out
}

fn unescape_octal(s: &str) -> OsString {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|d| (b'0'..=b'7').contains(d)) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    OsString::from_vec(out)
}

/// Mount points at or under `dir`, in the order to unmount them: deepest first, and of mounts
/// on the same point, the latest first.
fn mounts_under(mountinfo: &str, dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> =
        mount_points(mountinfo).into_iter().rev().map(|m| m.mount_point).filter(|p| p.starts_with(dir)).collect();
    v.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    v
}

/// Unmounts everything mounted at or under `dir` (a plain unmount, then a lazy one).
fn unmount_all_under(dir: &Path) -> Result<(), VolumeError> {
    for mp in mounts_under(&read_mountinfo()?, dir) {
        if umount2(&mp, MntFlags::empty()).is_err() {
            match umount2(&mp, MntFlags::MNT_DETACH) {
                // EINVAL: not a mount point (any more), e.g. gone with a parent detached before.
                Ok(()) | Err(nix::Error::EINVAL) => {}
                Err(source) => return Err(VolumeError::Unmount { path: mp, source }),
            }
        }
    }
    Ok(())
}

/// Unmounts every mount under the pod's directory (deepest first) and removes the directory.
/// Nothing to do when it does not exist. Refuses to remove anything while a mount remains.
pub fn teardown(root: &Path, uid: &str) -> Result<(), VolumeError> {
    check_uid(uid)?;
    unmount_and_remove(&pod_dir(root, uid))
}

/// Unmounts everything mounted at or under `dir` (deepest first) and removes it. Nothing to do
/// when it does not exist; refuses to remove anything while a mount remains.
fn unmount_and_remove(dir: &Path) -> Result<(), VolumeError> {
    let dir = match fs::canonicalize(dir) {
        Ok(d) => d,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io("resolve", dir)(e)),
    };
    unmount_all_under(&dir)?;
    if let Some(left) = mounts_under(&read_mountinfo()?, &dir).into_iter().next() {
        return Err(VolumeError::StillMounted(left));
    }
    fs::remove_dir_all(&dir).map_err(io("remove", &dir))
}

/// Releases the volumes of a finished pod: unmounts everything under its `volumes/` and
/// `plugins/` directories and removes them (emptyDirs with their contents); the rest of the pod
/// directory (termination messages) stays until [`teardown`].
pub fn release(root: &Path, uid: &str) -> Result<(), VolumeError> {
    check_uid(uid)?;
    for sub in ["volumes", "plugins"] {
        unmount_and_remove(&pod_dir(root, uid).join(sub))?;
    }
    Ok(())
}

/// UIDs that have a pod directory under `<root>/pods`, sorted (for orphan cleanup after a
/// restart). Empty when there is no such directory.
pub fn pod_uids_on_disk(root: &Path) -> Vec<String> {
    let Ok(entries) = fs::read_dir(root.join("pods")) else {
        return Vec::new();
    };
    let mut uids: Vec<String> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    uids.sort();
    uids
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::os::unix::fs::symlink;

    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    use k8s_openapi::ByteString;
    use serde_json::json;

    use super::atomic_writer::DATA_DIR;
    use super::*;

    /// A temporary root for pod directories. Drop unmounts whatever is still mounted under it
    /// (also when a test fails) before the temporary directory is removed.
    struct Root {
        tmp: tempfile::TempDir,
    }

    impl Root {
        fn new() -> Root {
            assert!(
                nix::unistd::geteuid().is_root(),
                "the volume tests mount tmpfs and create device nodes: run them as root"
            );
            Root { tmp: tempfile::tempdir().unwrap() }
        }

        fn path(&self) -> &Path {
            self.tmp.path()
        }

        /// tmpfs mounts under the root, by canonical mount point.
        fn tmpfs_mounts(&self) -> Vec<PathBuf> {
            let root = fs::canonicalize(self.path()).unwrap();
            mount_points(&read_mountinfo().unwrap())
                .into_iter()
                .filter(|m| m.fs_type == "tmpfs" && m.mount_point.starts_with(&root))
                .map(|m| m.mount_point)
                .collect()
        }
    }

    impl Drop for Root {
        fn drop(&mut self) {
            if let Ok(root) = fs::canonicalize(self.tmp.path()) {
                if let Ok(info) = read_mountinfo() {
                    for mp in mounts_under(&info, &root) {
                        let _ = umount2(&mp, MntFlags::MNT_DETACH);
                    }
                }
            }
        }
    }

    fn pod(volumes: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "prod", "uid": "u-1",
                "labels": {"app": "web", "tier": "front"},
                "annotations": {"note": "say \"hi\"\n\tbye", "a": "é\u{200b}"}},
            "spec": {
                "containers": [{"name": "app", "resources": {
                    "limits": {"memory": "64Mi", "cpu": "500m"}, "requests": {"cpu": "250m"}}},
                    {"name": "side"}],
                "initContainers": [{"name": "init", "resources": {"limits": {"cpu": "1.5"}}}],
                "volumes": volumes
            }
        }))
        .unwrap()
    }

    fn config_map(name: &str, data: serde_json::Value) -> (String, ConfigMap) {
        let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": name}, "data": data})).unwrap();
        (name.to_string(), cm)
    }

    fn secret(name: &str, data: &[(&str, &[u8])]) -> (String, Secret) {
        let mut s = Secret::default();
        s.metadata.name = Some(name.to_string());
        s.data = Some(data.iter().map(|(k, v)| (k.to_string(), ByteString(v.to_vec()))).collect());
        (name.to_string(), s)
    }

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    fn read(path: &Path) -> String {
        fs::read_to_string(path).unwrap()
    }

    fn setup_err(root: &Path, pod: &Pod, objects: &Objects) -> String {
        setup(root, pod, objects, 4000, 1 << 30).unwrap_err().to_string()
    }

    #[test]
    fn validate_messages() {
        let cases = [
            (json!([{"name": "x", "persistentVolumeClaim": {"claimName": ""}}]),
             "volume \"x\": persistentVolumeClaim.claimName is empty"),
            (json!([{"name": "x", "csi": {"driver": ""}}]), "volume \"x\": csi.driver is empty"),
            (json!([{"name": "x", "csi": {"driver": "d", "nodePublishSecretRef": {"name": "s"}}}]),
             "volume \"x\": csi.nodePublishSecretRef is not supported yet"),
            (json!([{"name": "x", "ephemeral": {}}]), "volume \"x\": ephemeral volumes are not supported yet"),
            (json!([{"name": "x", "nfs": {"server": "s", "path": "/"}}]), "volume \"x\": nfs volumes are not supported yet"),
            // An unknown type arrives with no source set (k8s-openapi drops unknown fields).
            (json!([{"name": "x", "fancyNewType": {}}]), "volume \"x\": unknown or unsupported volume type"),
            (json!([{"name": "x", "emptyDir": {}, "hostPath": {"path": "/a"}}]),
             "volume \"x\": more than one volume source (emptyDir, hostPath)"),
            (json!([{"name": "x", "emptyDir": {}}, {"name": "x", "emptyDir": {}}]), "volume \"x\": duplicate volume name"),
            (json!([{"name": "x", "hostPath": {"path": "rel"}}]), "volume \"x\": hostPath path \"rel\" must be absolute"),
            (json!([{"name": "x", "hostPath": {"path": "/a", "type": "Dir"}}]), "volume \"x\": \"Dir\" is an invalid hostPath type"),
            (json!([{"name": "x", "emptyDir": {"medium": "HugePages"}}]),
             "volume \"x\": emptyDir medium \"HugePages\" is not supported"),
            (json!([{"name": "x", "configMap": {"name": "c", "items": [{"key": "k", "path": "../k"}]}}]),
             "volume \"x\": invalid path \"../k\": must not contain '..'"),
            (json!([{"name": "x", "secret": {"secretName": "s", "defaultMode": 4095}}]),
             "volume \"x\": mode 0o7777 must be between 0 and 0777"),
            (json!([{"name": "x", "downwardAPI": {"items": [{"path": "n", "fieldRef": {"fieldPath": "spec.nodeName"}}]}}]),
             "volume \"x\": downwardAPI: unsupported fieldPath \"spec.nodeName\""),
            (json!([{"name": "x", "downwardAPI": {"items": [{"path": "n", "resourceFieldRef": {"containerName": "nope", "resource": "limits.cpu"}}]}}]),
             "volume \"x\": downwardAPI: container \"nope\" not found"),
            (json!([{"name": "x", "downwardAPI": {"items": [{"path": "n", "resourceFieldRef": {"containerName": "app", "resource": "limits.gpu"}}]}}]),
             "volume \"x\": downwardAPI: unsupported resource \"limits.gpu\""),
            (json!([{"name": "x", "projected": {"sources": [{"clusterTrustBundle": {"path": "b"}}]}}]),
             "volume \"x\": clusterTrustBundle projections are not supported yet"),
            (json!([{"name": "x", "projected": {"sources": [{"configMap": {"name": "c"}, "secret": {"name": "s"}}]}}]),
             "volume \"x\": projected source 0 has more than one source (configMap, secret)"),
        ];
        for (volumes, want) in cases {
            let err = validate(&pod(volumes.clone())).unwrap_err();
            assert_eq!(err.to_string(), want, "{volumes}");
            assert_eq!(err.volume(), Some("x"));
        }
        validate(&pod(json!([
            {"name": "a", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
            {"name": "b", "hostPath": {"path": "/x", "type": "DirectoryOrCreate"}},
            {"name": "c", "configMap": {"name": "c", "items": [{"key": "k", "path": "d/k", "mode": 256}]}},
            {"name": "d", "downwardAPI": {"items": [{"path": "l", "fieldRef": {"fieldPath": "metadata.labels['app']"}}]}},
            {"name": "e", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}},
            {"name": "f", "csi": {"driver": "loop.csi.ferro.dev", "volumeAttributes": {"size": "64Mi"}}}
        ])))
        .unwrap();
    }

    #[test]
    #[ignore = "privileged: needs root (chown, tmpfs and bind mounts); run by scripts/test.sh"]
    fn empty_dir_layout_and_idempotence() {
        let root = Root::new();
        let p = pod(json!([{"name": "scratch", "emptyDir": {}}]));
        let out = setup(root.path(), &p, &Objects::default(), 4000, 1 << 30).unwrap();
        let dir = pod_dir(root.path(), "u-1");
        let want = fs::canonicalize(&dir).unwrap().join("volumes/kubernetes.io~empty-dir/scratch");
        assert_eq!(out["scratch"], VolumePath { host_path: want.clone(), read_only: false });
        assert_eq!(mode(&want), 0o777);
        assert!(dir.join("containers").is_dir());
        fs::write(want.join("data"), "kept").unwrap();
        let again = setup(root.path(), &p, &Objects::default(), 4000, 1 << 30).unwrap();
        assert_eq!(again, out);
        assert_eq!(read(&want.join("data")), "kept");
        assert!(root.tmpfs_mounts().is_empty(), "a disk emptyDir is not a mount");
        assert_eq!(pod_uids_on_disk(root.path()), ["u-1"]);
        teardown(root.path(), "u-1").unwrap();
        assert!(!dir.exists());
        assert!(pod_uids_on_disk(root.path()).is_empty());
    }

    #[test]
    #[ignore = "privileged: needs root (chown, tmpfs and bind mounts); run by scripts/test.sh"]
    fn memory_empty_dir_is_tmpfs_mounted_once() {
        let root = Root::new();
        let p = pod(json!([{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
                           {"name": "big", "emptyDir": {"medium": "Memory"}}]));
        let out = setup(root.path(), &p, &Objects::default(), 4000, 1 << 30).unwrap();
        let shm = &out["shm"].host_path;
        let big = &out["big"].host_path;
        let mut mounts = root.tmpfs_mounts();
        mounts.sort();
        let mut want = vec![shm.clone(), big.clone()];
        want.sort();
        assert_eq!(mounts, want);
        // sizeLimit 1Mi; without one the pod's memory limit (all containers must have one:
        // "side" has none) or else node allocatable (1Gi here).
        let size = |p: &Path| {
            let st = nix::sys::statvfs::statvfs(p).unwrap();
            st.blocks() as u64 * st.fragment_size() as u64
        };
        assert_eq!(size(shm), 1 << 20);
        assert_eq!(size(big), 1 << 30);
        fs::write(shm.join("f"), "x").unwrap();

        // A second sync mounts nothing again.
        setup(root.path(), &p, &Objects::default(), 4000, 1 << 30).unwrap();
        assert_eq!(root.tmpfs_mounts().len(), 2);
        assert_eq!(read(&shm.join("f")), "x");

        teardown(root.path(), "u-1").unwrap();
        assert!(root.tmpfs_mounts().is_empty());
        assert!(!pod_dir(root.path(), "u-1").exists());
        // Tearing down what is gone is fine.
        teardown(root.path(), "u-1").unwrap();
    }

    #[test]
    #[ignore = "privileged: needs root (chown, tmpfs and bind mounts); run by scripts/test.sh"]
    fn tmpfs_sized_by_pod_memory_limit() {
        let root = Root::new();
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"uid": "u-2"},
            "spec": {"containers": [
                {"name": "a", "resources": {"limits": {"memory": "2Mi"}}},
                {"name": "b", "resources": {"limits": {"memory": "1Mi"}}}],
                "volumes": [{"name": "m", "emptyDir": {"medium": "Memory"}},
                            {"name": "l", "emptyDir": {"medium": "Memory", "sizeLimit": "8Mi"}}]}
        }))
        .unwrap();
        let out = setup(root.path(), &p, &Objects::default(), 4000, 1 << 30).unwrap();
        for v in ["m", "l"] {
            let st = nix::sys::statvfs::statvfs(&out[v].host_path).unwrap();
            assert_eq!(st.blocks() as u64 * st.fragment_size() as u64, 3 << 20, "{v}");
        }
        teardown(root.path(), "u-2").unwrap();
    }

    #[test]
    #[ignore = "privileged: needs root (chown, tmpfs and bind mounts); run by scripts/test.sh"]
    fn config_map_all_keys_items_and_modes() {
        let root = Root::new();
        let mut cm = config_map("cm", json!({"a": "1", "b": "2"})).1;
        cm.binary_data = Some([("bin".to_string(), ByteString(vec![0, 1, 2]))].into());
        let objects = Objects { config_maps: [("cm".to_string(), cm)].into(), ..Default::default() };
        let p = pod(json!([
            {"name": "all", "configMap": {"name": "cm"}},
            {"name": "strict", "configMap": {"name": "cm", "defaultMode": 0o400}},
            {"name": "some", "configMap": {"name": "cm", "items": [
                {"key": "a", "path": "conf/deep/a.txt"}, {"key": "b", "path": "b.sh", "mode": 0o755}]}}
        ]));
        let out = setup(root.path(), &p, &objects, 4000, 1 << 30).unwrap();
        let all = &out["all"];
        assert!(all.read_only);
        assert!(all.host_path.ends_with("volumes/kubernetes.io~configmap/all"));
        assert_eq!(read(&all.host_path.join("a")), "1");
        assert_eq!(fs::read(all.host_path.join("bin")).unwrap(), [0, 1, 2]);
        assert_eq!(mode(&all.host_path.join("a")), 0o644);
        assert_eq!(mode(&all.host_path), 0o777);
        assert_eq!(mode(&out["strict"].host_path.join("b")), 0o400);
        let some = &out["some"].host_path;
        assert_eq!(read(&some.join("conf/deep/a.txt")), "1");
        assert_eq!(fs::read_link(some.join("conf")).unwrap(), Path::new("..data/conf"));
        assert_eq!(mode(&some.join("conf/deep/a.txt")), 0o644);
        assert_eq!(mode(&some.join("b.sh")), 0o755);
        assert!(!some.join("bin").exists(), "items select keys");
        assert!(root.tmpfs_mounts().is_empty(), "configMap volumes are on disk");
        teardown(root.path(), "u-1").unwrap();
    }

    #[test]
    #[ignore = "privileged: needs root (chown, tmpfs and bind mounts); run by scripts/test.sh"]
    fn config_map_optional_semantics() {
        let root = Root::new();
        let none = Objects::default();
        let optional = pod(json!([{"name": "v", "configMap": {"name": "cm", "optional": true}}]));
        let out = setup(root.path(), &optional, &none, 4000, 1 << 30).unwrap();
        let dir = &out["v"].host_path;
        assert!(dir.join(DATA_DIR).exists());
        let visible: Vec<_> = fs::read_dir(dir).unwrap().flatten().filter(|e| !e.file_name().to_string_lossy().starts_with("..")).collect();
        assert!(visible.is_empty(), "a missing optional configmap gives an empty volume");

        let required = pod(json!([{"name": "v", "configMap": {"name": "cm"}}]));
        let err = setup(root.path(), &required, &none, 4000, 1 << 30).unwrap_err();
        assert_eq!(err.to_string(), "MountVolume.SetUp failed for volume \"v\" : configmap \"cm\" not found");
        assert_eq!(err.volume(), Some("v"));
        let VolumeError::SetUp { error, .. } = err else { panic!() };
        assert!(matches!(*error, VolumeError::ConfigMapNotFound(ref n) if n == "cm"));

        let objects = Objects { config_maps: [config_map("cm", json!({"a": "1"}))].into(), ..Default::default() };
        let missing_key = pod(json!([{"name": "v", "configMap": {"name": "cm", "items": [{"key": "zz", "path": "z"}]}}]));
        assert!(setup_err(root.path(), &missing_key, &objects).ends_with("configmap \"cm\" has no key \"zz\""));
        let missing_key_opt = pod(json!([{"name": "v", "configMap": {"name": "cm", "optional": true,
            "items": [{"key": "zz", "path": "z"}, {"key": "a", "path": "a"}]}}]));
        let out = setup(root.path(), &missing_key_opt, &objects, 4000, 1 << 30).unwrap();
        assert_eq!(read(&out["v"].host_path.join("a")), "1");
        assert!(!out["v"].host_path.join("z").exists());
        teardown(root.path(), "u-1").unwrap();
    }

    #[test]
    #[ignore = "privileged: needs root (chown, tmpfs and bind mounts); run by scripts/test.sh"]
    fn config_map_refresh_swaps_data() {
        let root = Root::new();
        let p = pod(json!([{"name": "v", "configMap": {"name": "cm"}}]));
        let v1 = Objects { config_maps: [config_map("cm", json!({"a": "1", "old": "x"}))].into(), ..Default::default() };
        let dir = setup(root.path(), &p, &v1, 4000, 1 << 30).unwrap()["v"].host_path.clone();
        let ts1 = fs::read_link(dir.join(DATA_DIR)).unwrap();

        // Unchanged: the same payload directory.
        setup(root.path(), &p, &v1, 4000, 1 << 30).unwrap();
        assert_eq!(fs::read_link(dir.join(DATA_DIR)).unwrap(), ts1);

        let v2 = Objects { config_maps: [config_map("cm", json!({"a": "2", "new": "y"}))].into(), ..Default::default() };
        setup(root.path(), &p, &v2, 4000, 1 << 30).unwrap();
        let ts2 = fs::read_link(dir.join(DATA_DIR)).unwrap();
        assert_ne!(ts1, ts2);
        assert!(!dir.join(&ts1).exists());
        assert_eq!(read(&dir.join("a")), "2");
        assert_eq!(read(&dir.join("new")), "y");
        assert!(fs::symlink_metadata(dir.join("old")).is_err());
        teardown(root.path(), "u-1").unwrap();
    }

    #[test]
    #[ignore = "privileged: needs root (chown, tmpfs and bind mounts); run by scripts/test.sh"]
    fn secret_on_tmpfs_and_teardown() {
        let root = Root::new();
        let objects = Objects { secrets: [secret("s", &[("user", b"admin"), ("pw", b"\x00hunter2")])].into(), ..Default::default() };
        let p = pod(json!([
            {"name": "creds", "secret": {"secretName": "s", "defaultMode": 0o440}},
            {"name": "pw", "secret": {"secretName": "s", "items": [{"key": "pw", "path": "p/w", "mode": 0o400}]}},
            {"name": "gone", "secret": {"secretName": "nope", "optional": true}}
        ]));
        let out = setup(root.path(), &p, &objects, 4000, 1 << 30).unwrap();
        let creds = &out["creds"];
        assert!(creds.read_only);
        assert!(creds.host_path.ends_with("volumes/kubernetes.io~secret/creds"));
        assert_eq!(read(&creds.host_path.join("user")), "admin");
        assert_eq!(mode(&creds.host_path.join("user")), 0o440);
        assert_eq!(fs::read(out["pw"].host_path.join("p/w")).unwrap(), b"\x00hunter2");
        assert_eq!(mode(&out["pw"].host_path.join("p/w")), 0o400);
        let mut mounts = root.tmpfs_mounts();
        mounts.sort();
        let mut want: Vec<PathBuf> = out.values().map(|v| v.host_path.clone()).collect();
        want.sort();
        assert_eq!(mounts, want, "every secret volume is a tmpfs");

        setup(root.path(), &p, &objects, 4000, 1 << 30).unwrap();
        assert_eq!(root.tmpfs_mounts().len(), 3, "mounted once");

        let missing = pod(json!([{"name": "creds", "secret": {"secretName": "other"}}]));
        assert_eq!(
            setup_err(root.path(), &missing, &objects),
            "MountVolume.SetUp failed for volume \"creds\" : secret \"other\" not found"
        );
        let missing_key = pod(json!([{"name": "creds", "secret": {"secretName": "s", "items": [{"key": "k", "path": "k"}]}}]));
        assert!(setup_err(root.path(), &missing_key, &objects).ends_with("secret \"s\" has no key \"k\""));

        teardown(root.path(), "u-1").unwrap();
        assert!(root.tmpfs_mounts().is_empty());
        assert!(!pod_dir(root.path(), "u-1").exists());
    }

    #[test]
    #[ignore = "privileged: needs root (chown, tmpfs and bind mounts); run by scripts/test.sh"]
    fn teardown_nested_mounts_deepest_first() {
        let root = Root::new();
        let p = pod(json!([{"name": "m", "emptyDir": {"medium": "Memory"}}]));
        let out = setup(root.path(), &p, &Objects::default(), 4000, 1 << 30).unwrap();
        let inner = out["m"].host_path.join("inner");
        fs::create_dir(&inner).unwrap();
        mount(Some("tmpfs"), &inner, Some("tmpfs"), MsFlags::empty(), Some("size=1m")).unwrap();
        // A second tmpfs stacked on the same point.
        mount(Some("tmpfs"), &inner, Some("tmpfs"), MsFlags::empty(), Some("size=1m")).unwrap();
        assert_eq!(root.tmpfs_mounts().len(), 3);
        let order = mounts_under(&read_mountinfo().unwrap(), &fs::canonicalize(root.path()).unwrap());
        assert_eq!(order, [inner.clone(), inner, out["m"].host_path.clone()]);
        teardown(root.path(), "u-1").unwrap();
        assert!(root.tmpfs_mounts().is_empty());
        assert!(!pod_dir(root.path(), "u-1").exists());
    }

    #[test]
    #[ignore = "privileged: needs root (chown, tmpfs and bind mounts); run by scripts/test.sh"]
    fn downward_api_files() {
        let root = Root::new();
        let p = pod(json!([{"name": "info", "downwardAPI": {"defaultMode": 0o600, "items": [
            {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
            {"path": "ns", "fieldRef": {"fieldPath": "metadata.namespace"}},
            {"path": "uid", "fieldRef": {"fieldPath": "metadata.uid"}, "mode": 0o444},
            {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
            {"path": "meta/annotations", "fieldRef": {"fieldPath": "metadata.annotations"}},
            {"path": "app", "fieldRef": {"fieldPath": "metadata.labels['app']"}},
            {"path": "cpu_limit", "resourceFieldRef": {"containerName": "app", "resource": "limits.cpu", "divisor": "1m"}},
            {"path": "cpu_limit_cores", "resourceFieldRef": {"containerName": "app", "resource": "limits.cpu"}},
            {"path": "cpu_request", "resourceFieldRef": {"containerName": "app", "resource": "requests.cpu", "divisor": "1m"}},
            {"path": "mem_limit", "resourceFieldRef": {"containerName": "app", "resource": "limits.memory", "divisor": "1Mi"}},
            {"path": "mem_request", "resourceFieldRef": {"containerName": "app", "resource": "requests.memory"}},
            {"path": "side_cpu", "resourceFieldRef": {"containerName": "side", "resource": "limits.cpu", "divisor": "1m"}},
            {"path": "side_mem", "resourceFieldRef": {"containerName": "side", "resource": "limits.memory"}},
            {"path": "init_cpu", "resourceFieldRef": {"containerName": "init", "resource": "limits.cpu"}}
        ]}}]));
        let out = setup(root.path(), &p, &Objects::default(), 4000, 1 << 30).unwrap();
        let d = &out["info"].host_path;
        assert!(out["info"].read_only);
        assert!(d.ends_with("volumes/kubernetes.io~downward-api/info"));
        assert_eq!(root.tmpfs_mounts(), std::slice::from_ref(d));
        let f = |n: &str| read(&d.join(n));
        assert_eq!(f("name"), "web");
        assert_eq!(f("ns"), "prod");
        assert_eq!(f("uid"), "u-1");
        assert_eq!(f("labels"), "app=\"web\"\ntier=\"front\"");
        assert_eq!(f("meta/annotations"), "a=\"é\\u200b\"\nnote=\"say \\\"hi\\\"\\n\\tbye\"");
        assert_eq!(f("app"), "web");
        assert_eq!(f("cpu_limit"), "500");
        assert_eq!(f("cpu_limit_cores"), "1", "rounded up");
        assert_eq!(f("cpu_request"), "250");
        assert_eq!(f("mem_limit"), "64");
        assert_eq!(f("mem_request"), "67108864", "an unset request is the limit");
        assert_eq!(f("side_cpu"), "4000", "an unset limit is node allocatable");
        assert_eq!(f("side_mem"), (1u64 << 30).to_string());
        assert_eq!(f("init_cpu"), "2");
        assert_eq!(mode(&d.join("name")), 0o600);
        assert_eq!(mode(&d.join("uid")), 0o444);

        // Labels change: the file follows on the next sync.
        let mut p2 = p.clone();
        p2.metadata.labels.as_mut().unwrap().insert("tier".into(), "back".into());
        setup(root.path(), &p2, &Objects::default(), 4000, 1 << 30).unwrap();
        assert_eq!(f("labels"), "app=\"web\"\ntier=\"back\"");
        teardown(root.path(), "u-1").unwrap();
    }

    #[test]
    #[ignore = "privileged: needs root (chown, tmpfs and bind mounts); run by scripts/test.sh"]
    fn projected_sources() {
        let root = Root::new();
        let objects = Objects {
            config_maps: [config_map("ca", json!({"ca.crt": "CERT", "other": "o"}))].into(),
            secrets: [secret("s", &[("key", b"K")])].into(),
            service_account_token: Some("tok".into()),
            services: Vec::new(),
        };
        let p = pod(json!([{"name": "kube-api-access", "projected": {"defaultMode": 0o420, "sources": [
            {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
            {"configMap": {"name": "ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
            {"secret": {"name": "s", "items": [{"key": "key", "path": "tls/key", "mode": 0o400}]}},
            {"secret": {"name": "absent", "optional": true}}
        ]}}]));
        let out = setup(root.path(), &p, &objects, 4000, 1 << 30).unwrap();
        let d = &out["kube-api-access"].host_path;
        assert!(out["kube-api-access"].read_only);
        assert!(d.ends_with("volumes/kubernetes.io~projected/kube-api-access"));
        assert_eq!(root.tmpfs_mounts(), std::slice::from_ref(d));
        assert_eq!(read(&d.join("token")), "tok");
        assert_eq!(read(&d.join("ca.crt")), "CERT");
        assert_eq!(read(&d.join("namespace")), "prod");
        assert_eq!(read(&d.join("tls/key")), "K");
        assert!(!d.join("other").exists());
        assert_eq!(mode(&d.join("token")), 0o420);
        assert_eq!(mode(&d.join("tls/key")), 0o400);

        // A rotated token is swapped in.
        let rotated = Objects { service_account_token: Some("tok2".into()), ..objects.clone() };
        setup(root.path(), &p, &rotated, 4000, 1 << 30).unwrap();
        assert_eq!(read(&d.join("token")), "tok2");

        let no_token = Objects { service_account_token: None, ..objects.clone() };
        assert_eq!(
            setup_err(root.path(), &p, &no_token),
            "MountVolume.SetUp failed for volume \"kube-api-access\" : serviceAccountToken projection needs a token"
        );
        let no_cm = Objects { config_maps: BTreeMap::new(), ..objects };
        assert!(setup_err(root.path(), &p, &no_cm).ends_with("configmap \"ca\" not found"));
        teardown(root.path(), "u-1").unwrap();
        assert!(root.tmpfs_mounts().is_empty());
    }

    #[test]
    #[ignore = "privileged: needs root (chown, tmpfs and bind mounts); run by scripts/test.sh"]
    fn host_path_type_checks() {
        use nix::sys::stat::{makedev, mknod, Mode, SFlag};
        let root = Root::new();
        let base = root.path().join("host");
        fs::create_dir(&base).unwrap();
        let file = base.join("file");
        fs::write(&file, "x").unwrap();
        let sock = base.join("sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let chr = base.join("null");
        mknod(&chr, SFlag::S_IFCHR, Mode::from_bits_truncate(0o600), makedev(1, 3)).unwrap();
        let blk = base.join("loop");
        mknod(&blk, SFlag::S_IFBLK, Mode::from_bits_truncate(0o600), makedev(7, 0)).unwrap();
        let link = base.join("link-to-dir");
        symlink(&base, &link).unwrap();

        let check = |path: &Path, ty: &str| -> Result<(), String> {
            let p = pod(json!([{"name": "h", "hostPath": {"path": path, "type": ty}}]));
            setup(root.path(), &p, &Objects::default(), 4000, 1 << 30)
                .map(|out| assert_eq!(out["h"], VolumePath { host_path: path.to_path_buf(), read_only: false }))
                .map_err(|e| e.to_string())
        };
        let failed = |path: &Path, what: &str| {
            format!("MountVolume.SetUp failed for volume \"h\" : hostPath type check failed: {} is not a {what}", path.display())
        };

        // "" checks nothing, not even existence.
        check(&base.join("absent"), "").unwrap();
        assert!(!base.join("absent").exists());

        let created = base.join("a/b/c");
        check(&created, "DirectoryOrCreate").unwrap();
        assert!(created.is_dir());
        assert_eq!(mode(&created) & 0o755, 0o755);
        check(&created, "DirectoryOrCreate").unwrap();
        assert_eq!(check(&file, "DirectoryOrCreate").unwrap_err(), failed(&file, "directory"));

        check(&base, "Directory").unwrap();
        check(&link, "Directory").unwrap();
        assert_eq!(check(&file, "Directory").unwrap_err(), failed(&file, "directory"));
        assert_eq!(check(&base.join("nope"), "Directory").unwrap_err(), failed(&base.join("nope"), "directory"));

        let new_file = base.join("new-file");
        check(&new_file, "FileOrCreate").unwrap();
        assert!(new_file.is_file());
        assert_eq!(fs::metadata(&new_file).unwrap().len(), 0);
        assert_eq!(mode(&new_file) & !0o022, 0o644 & !0o022);
        fs::write(&new_file, "keep").unwrap();
        check(&new_file, "FileOrCreate").unwrap();
        assert_eq!(read(&new_file), "keep");
        let orphan = base.join("no-parent/f");
        assert!(check(&orphan, "FileOrCreate").unwrap_err().contains("create file"), "the parent is not created");
        assert_eq!(check(&base, "FileOrCreate").unwrap_err(), failed(&base, "file"));

        check(&file, "File").unwrap();
        assert_eq!(check(&base, "File").unwrap_err(), failed(&base, "file"));
        check(&sock, "Socket").unwrap();
        assert_eq!(check(&file, "Socket").unwrap_err(), failed(&file, "socket file"));
        check(&chr, "CharDevice").unwrap();
        assert_eq!(check(&file, "CharDevice").unwrap_err(), failed(&file, "character device"));
        check(&blk, "BlockDevice").unwrap();
        assert_eq!(check(&chr, "BlockDevice").unwrap_err(), failed(&chr, "block device"));
        teardown(root.path(), "u-1").unwrap();
        assert!(file.exists(), "teardown never touches host paths");
    }

    #[test]
    #[ignore = "privileged: needs root (chown, tmpfs and bind mounts); run by scripts/test.sh"]
    fn fs_group_ownership() {
        use std::os::unix::fs::MetadataExt;
        let root = Root::new();
        let host = root.path().join("host");
        fs::create_dir(&host).unwrap();
        let objects = Objects {
            config_maps: [config_map("cm", json!({"a": "1", "b": "2"}))].into(),
            secrets: [secret("s", &[("pw", b"x")])].into(),
            service_account_token: Some("tok".into()),
            services: Vec::new(),
        };
        let mut p = pod(json!([
            {"name": "scratch", "emptyDir": {}},
            {"name": "shm", "emptyDir": {"medium": "Memory"}},
            {"name": "cm", "configMap": {"name": "cm", "items": [{"key": "a", "path": "a", "mode": 0o400}, {"key": "b", "path": "d/b"}]}},
            {"name": "sec", "secret": {"secretName": "s", "defaultMode": 0o600}},
            {"name": "api", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}},
            {"name": "host", "hostPath": {"path": host.to_str().unwrap()}}
        ]));
        p.spec.as_mut().unwrap().security_context =
            Some(serde_json::from_value(json!({"fsGroup": 2000, "fsGroupChangePolicy": "OnRootMismatch"})).unwrap());
        let out = setup(root.path(), &p, &objects, 4000, 1 << 30).unwrap();
        let gm = |p: &Path| {
            let m = fs::metadata(p).unwrap();
            (m.gid(), m.mode() & 0o7777)
        };
        let scratch = &out["scratch"].host_path;
        assert_eq!(gm(scratch), (2000, 0o2777), "group-writable with setgid");
        assert_eq!(gm(&out["shm"].host_path), (2000, 0o3777), "the tmpfs root keeps its sticky bit");
        let cm = &out["cm"].host_path;
        assert_eq!(gm(cm).0, 2000);
        assert_eq!(gm(&cm.join("a")), (2000, 0o440), "group read added to the item's mode");
        assert_eq!(gm(&cm.join("d/b")), (2000, 0o644));
        assert_eq!(gm(&cm.join("d")), (2000, 0o2755));
        assert_eq!(fs::symlink_metadata(cm.join("a")).unwrap().gid(), 2000, "the user-visible link");
        assert_eq!(gm(&out["sec"].host_path.join("pw")), (2000, 0o640));
        assert_eq!(gm(&out["api"].host_path.join("token")), (2000, 0o640), "the token is 0600 before the group bits");
        assert_eq!(gm(&host).0, 0, "hostPath volumes are never touched");

        // The emptyDir is done once: what was made in it later is left as it is.
        fs::write(scratch.join("mine"), "x").unwrap();
        std::os::unix::fs::chown(scratch.join("mine"), None, Some(0)).unwrap();
        fs::set_permissions(scratch.join("mine"), fs::Permissions::from_mode(0o600)).unwrap();
        setup(root.path(), &p, &objects, 4000, 1 << 30).unwrap();
        assert_eq!(gm(&scratch.join("mine")), (0, 0o600));
        assert!(pod_dir(root.path(), "u-1").join("plugins/kubernetes.io~empty-dir/scratch/ready").exists());

        // A new ConfigMap payload keeps the ownership.
        let v2 = Objects { config_maps: [config_map("cm", json!({"a": "3", "b": "4"}))].into(), ..objects.clone() };
        setup(root.path(), &p, &v2, 4000, 1 << 30).unwrap();
        assert_eq!(read(&cm.join("a")), "3");
        assert_eq!(gm(&cm.join("a")), (2000, 0o440));
        assert_eq!(fs::symlink_metadata(cm.join(DATA_DIR)).unwrap().gid(), 2000);

        // Without an fsGroup nothing changes group.
        teardown(root.path(), "u-1").unwrap();
        p.spec.as_mut().unwrap().security_context = None;
        let out = setup(root.path(), &p, &objects, 4000, 1 << 30).unwrap();
        assert_eq!(gm(&out["scratch"].host_path), (0, 0o777));
        assert_eq!(gm(&out["cm"].host_path.join("a")), (0, 0o400));
        assert_eq!(gm(&out["api"].host_path.join("token")), (0, 0o644));
        teardown(root.path(), "u-1").unwrap();
    }

    #[test]
    #[ignore = "privileged: needs root (chown, tmpfs and bind mounts); run by scripts/test.sh"]
    fn teardown_guards_and_uids_on_disk() {
        let root = Root::new();
        assert!(pod_uids_on_disk(root.path()).is_empty());
        for uid in ["a", "b"] {
            fs::create_dir_all(pod_dir(root.path(), uid).join("volumes")).unwrap();
        }
        fs::write(root.path().join("pods/not-a-dir"), "").unwrap();
        assert_eq!(pod_uids_on_disk(root.path()), ["a", "b"]);
        for bad in ["", ".", "..", "a/b"] {
            assert!(matches!(teardown(root.path(), bad), Err(VolumeError::InvalidUid(_))), "{bad:?}");
        }
        assert!(pod_dir(root.path(), "a").exists());
        teardown(root.path(), "a").unwrap();
        assert_eq!(pod_uids_on_disk(root.path()), ["b"]);
        let mut no_uid = pod(json!([]));
        no_uid.metadata.uid = None;
        assert!(matches!(setup(root.path(), &no_uid, &Objects::default(), 0, 0), Err(VolumeError::InvalidUid(_))));
    }

    #[test]
    fn go_quoting() {
        assert_eq!(go_quote("plain"), "\"plain\"");
        assert_eq!(go_quote("a\"b\\c"), "\"a\\\"b\\\\c\"");
        assert_eq!(go_quote("\x07\x08\x0c\n\r\t\x0b\x01\x7f"), "\"\\a\\b\\f\\n\\r\\t\\v\\x01\\x7f\"");
        assert_eq!(go_quote("héllo 世界"), "\"héllo 世界\"");
        assert_eq!(go_quote("\u{85}\u{a0}\u{feff}\u{10ffff}"), "\"\\u0085\\u00a0\\ufeff\\U0010ffff\"");
        let m: BTreeMap<String, String> = [("b".into(), "2".into()), ("a".into(), "x y".into())].into();
        assert_eq!(format_map(Some(&m)), "a=\"x y\"\nb=\"2\"");
        assert_eq!(format_map(None), "");
    }

    #[test]
    fn quantities_exact() {
        assert_eq!(nonneg("100m", 1000), Some(100));
        assert_eq!(nonneg("0.1", 1000), Some(100));
        assert_eq!(nonneg("1.5", 1000), Some(1500));
        assert_eq!(nonneg("1n", 1000), Some(1), "rounded up");
        assert_eq!(nonneg("1Gi", 1), Some(1 << 30));
        assert_eq!(nonneg("1.5Ki", 1), Some(1536));
        assert_eq!(nonneg("1e3", 1), Some(1000));
        assert_eq!(nonneg("1E", 1), Some(10i128.pow(18)));
        assert_eq!(nonneg("129M", 1), Some(129_000_000));
        assert_eq!(nonneg("1m", 1), Some(1), "rounded up");
        for bad in ["", "x", "1Q", "-1", "1e99", "."] {
            assert_eq!(nonneg(bad, 1), None, "{bad:?}");
        }
    }

    #[test]
    fn mountinfo_parsing() {
        let text = "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n\
                    40 22 0:50 / /var/lib/a\\040b rw shared:9 - tmpfs tmpfs rw,size=1024k\n\
                    41 40 0:51 / /var/lib/a\\040b/c\\134d rw - tmpfs tmpfs rw\n\
                    42 22 0:52 / /var/lib/ab rw - tmpfs tmpfs rw\n";
        let m = mount_points(text);
        assert_eq!(m[1], MountEntry { mount_point: "/var/lib/a b".into(), fs_type: "tmpfs".into() });
        assert_eq!(m[2].mount_point, Path::new("/var/lib/a b/c\\d"));
        // Component-wise prefix: /var/lib/ab is not under /var/lib/a.
        assert_eq!(mounts_under(text, Path::new("/var/lib/a b")), [PathBuf::from("/var/lib/a b/c\\d"), "/var/lib/a b".into()]);
        assert!(mounts_under(text, Path::new("/var/lib/a")).is_empty());
    }
}
