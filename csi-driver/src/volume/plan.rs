//! Every decision of the volume engine, as pure functions of what was asked and what was seen:
//! sizes, StorageClass parameters, capabilities, whether a CreateVolume is new, a retry or a
//! conflict, how much of the pool is left, and the next step of staging, publishing and their
//! undoing. The node-side steps are planned one at a time from a fresh observation of the host
//! (`*_step(want, seen) -> Step`), so a call interrupted at any point resumes from what is
//! really there, and a device is formatted only when its own superblock says it is blank.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::proto::volume_capability::access_mode::Mode;
use crate::proto::volume_capability::AccessType;
use crate::proto::{CapacityRange, VolumeCapability};

use super::host::{Content, FileInfo, MountEntry, MountSpec, PathKind};
use super::record::{
    AccessKind, FsType, Provisioning, SnapshotRecord, Source, State, VolumeRecord,
};

pub mod ephemeral;

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;
/// The size of a volume whose request names none (the spec lets the plugin choose).
pub const DEFAULT_SIZE: u64 = GIB;

/// Why a request cannot be done; each maps to the gRPC code the CSI spec names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    OutOfRange(String),
    #[error("{0}")]
    ResourceExhausted(String),
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    Aborted(String),
}

/// The smallest volume ferro-csi makes for a use: mkfs.xfs refuses less than 300 MiB, an ext4
/// below 16 MiB has no room for a journal.
pub fn min_size(access: AccessKind, fs: Option<FsType>) -> u64 {
    match (access, fs) {
        (AccessKind::Block, _) => MIB,
        (AccessKind::Mount, Some(FsType::Xfs)) => 300 * MIB,
        (AccessKind::Mount, _) => 16 * MIB,
    }
}

/// The size to make for a capacity range: at least the required bytes and `min`, rounded up to
/// whole MiB, never above the limit.
pub fn size_for(range: Option<&CapacityRange>, min: u64) -> Result<u64, PlanError> {
    let (required, limit) = range
        .map(|r| (r.required_bytes, r.limit_bytes))
        .unwrap_or((0, 0));
    if required < 0 || limit < 0 {
        return Err(PlanError::OutOfRange(format!(
            "capacity range must not be negative (required {required}, limit {limit})"
        )));
    }
    let (required, limit) = (required as u64, limit as u64);
    if limit != 0 && required > limit {
        return Err(PlanError::OutOfRange(format!(
            "required bytes {required} exceed limit bytes {limit}"
        )));
    }
    let wanted = if required == 0 && limit == 0 {
        DEFAULT_SIZE
    } else {
        required
    };
    let size = wanted.max(min).div_ceil(MIB) * MIB;
    if limit != 0 && size > limit {
        return Err(PlanError::OutOfRange(format!(
            "limit bytes {limit} are below the smallest volume ferro-csi can make here ({size} bytes: whole MiB, at least {min})"
        )));
    }
    Ok(size)
}

/// StorageClass parameters ferro-csi knows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Params {
    pub provisioning: Provisioning,
}

/// The parameter naming thin or thick provisioning.
pub const PARAM_PROVISIONING: &str = "provisioning";

impl Params {
    /// Unknown keys are refused, except the `csi.storage.k8s.io/` keys provisioners pass along
    /// (PVC name and namespace, secrets' names), which carry no meaning for the volume.
    pub fn parse(params: &std::collections::HashMap<String, String>) -> Result<Params, PlanError> {
        let mut out = Params::default();
        let mut keys: Vec<&String> = params.keys().collect();
        keys.sort();
        for key in keys {
            let value = &params[key];
            match key.as_str() {
                PARAM_PROVISIONING => {
                    out.provisioning = match value.as_str() {
                        "thin" => Provisioning::Thin,
                        "thick" => Provisioning::Thick,
                        other => {
                            return Err(PlanError::InvalidArgument(format!(
                                "parameter {PARAM_PROVISIONING}: {other:?} is neither \"thin\" nor \"thick\""
                            )))
                        }
                    }
                }
                k if k.starts_with("csi.storage.k8s.io/") => {}
                other => {
                    return Err(PlanError::InvalidArgument(format!(
                        "unknown parameter {other:?} (ferro-csi knows {PARAM_PROVISIONING:?})"
                    )))
                }
            }
        }
        Ok(out)
    }

    /// What the record keeps (and ListVolumes reports in the volume context).
    pub fn to_map(&self) -> BTreeMap<String, String> {
        let v = match self.provisioning {
            Provisioning::Thin => "thin",
            Provisioning::Thick => "thick",
        };
        BTreeMap::from([(PARAM_PROVISIONING.to_string(), v.to_string())])
    }
}

/// One capability, checked: how the volume is used and, for a mount, with what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Use {
    pub access: AccessKind,
    /// The filesystem asked for; `None` when the CO left fs_type empty (ext4 then).
    pub fs: Option<FsType>,
    pub flags: Vec<String>,
    /// The access mode allows no writer.
    pub reader_only: bool,
}

impl Use {
    pub fn fs_or_default(&self) -> FsType {
        self.fs.unwrap_or(FsType::Ext4)
    }
}

pub fn parse_fs(fs: &str) -> Result<Option<FsType>, PlanError> {
    match fs {
        "" => Ok(None),
        "ext4" => Ok(Some(FsType::Ext4)),
        "xfs" => Ok(Some(FsType::Xfs)),
        other => Err(PlanError::InvalidArgument(format!(
            "fsType {other:?} is not supported (ext4 or xfs)"
        ))),
    }
}

/// Checks one capability. A node-local volume can be used on one node only, so only the
/// SINGLE_NODE_* modes are honoured.
pub fn capability(cap: &VolumeCapability) -> Result<Use, PlanError> {
    let mode = cap
        .access_mode
        .as_ref()
        .ok_or_else(|| PlanError::InvalidArgument("volume capability has no access mode".into()))?
        .mode();
    let reader_only = match mode {
        Mode::SingleNodeWriter | Mode::SingleNodeSingleWriter | Mode::SingleNodeMultiWriter => {
            false
        }
        Mode::SingleNodeReaderOnly => true,
        Mode::MultiNodeReaderOnly | Mode::MultiNodeSingleWriter | Mode::MultiNodeMultiWriter => {
            return Err(PlanError::InvalidArgument(format!(
                "access mode {} cannot be honoured: a loop volume lives on one node",
                mode.as_str_name()
            )))
        }
        Mode::Unknown => {
            return Err(PlanError::InvalidArgument("access mode UNKNOWN".into()));
        }
    };
    match &cap.access_type {
        Some(AccessType::Block(_)) => Ok(Use {
            access: AccessKind::Block,
            fs: None,
            flags: Vec::new(),
            reader_only,
        }),
        Some(AccessType::Mount(m)) => Ok(Use {
            access: AccessKind::Mount,
            fs: parse_fs(&m.fs_type)?,
            flags: m.mount_flags.clone(),
            reader_only,
        }),
        None => Err(PlanError::InvalidArgument(
            "volume capability has neither block nor mount access type".into(),
        )),
    }
}

/// The capabilities of a CreateVolume: at least one, all of one access type and filesystem.
pub fn capabilities(caps: &[VolumeCapability]) -> Result<Use, PlanError> {
    let mut uses = caps.iter().map(capability);
    let first = uses
        .next()
        .ok_or_else(|| PlanError::InvalidArgument("volume capabilities missing".into()))??;
    for u in uses {
        let u = u?;
        if u.access != first.access || (u.fs.is_some() && first.fs.is_some() && u.fs != first.fs) {
            return Err(PlanError::InvalidArgument(
                "volume capabilities disagree on access type or fsType".into(),
            ));
        }
    }
    Ok(first)
}

/// A CreateVolume, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreateWant {
    pub id: String,
    pub name: String,
    pub size: u64,
    pub params: Params,
    pub access: AccessKind,
    pub source: Option<Source>,
    /// An inline volume made by NodePublishVolume ([`ephemeral`]).
    pub ephemeral: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CreateDecision {
    /// The volume exists as asked: answer with it.
    Exists(VolumeRecord),
    /// A try before stopped half-way: finish it.
    Finish(VolumeRecord),
    /// Nothing of it exists.
    Make,
}

pub fn decide_create(
    existing: Option<&VolumeRecord>,
    want: &CreateWant,
) -> Result<CreateDecision, PlanError> {
    let Some(rec) = existing else {
        return Ok(CreateDecision::Make);
    };
    if rec.name != want.name {
        // 128 bits of SHA-256 collided, or someone wrote a record by hand.
        return Err(PlanError::AlreadyExists(format!(
            "volume id {} belongs to name {:?}",
            rec.id, rec.name
        )));
    }
    let mut diffs = Vec::new();
    if rec.size != want.size {
        diffs.push(format!("size {} (asked {})", rec.size, want.size));
    }
    if rec.access != want.access {
        diffs.push(format!("access {:?} (asked {:?})", rec.access, want.access));
    }
    if rec.provisioning != want.params.provisioning {
        diffs.push(format!(
            "provisioning {:?} (asked {:?})",
            rec.provisioning, want.params.provisioning
        ));
    }
    if rec.ephemeral != want.ephemeral {
        diffs.push(format!(
            "ephemeral {} (asked {})",
            rec.ephemeral, want.ephemeral
        ));
    }
    if rec.source != want.source {
        diffs.push(format!(
            "content source {:?} (asked {:?})",
            rec.source, want.source
        ));
    }
    if !diffs.is_empty() {
        return Err(PlanError::AlreadyExists(format!(
            "volume {:?} exists with {}",
            want.name,
            diffs.join(", ")
        )));
    }
    match rec.state {
        State::Ready => Ok(CreateDecision::Exists(rec.clone())),
        State::Creating => Ok(CreateDecision::Finish(rec.clone())),
        State::Deleting => Err(PlanError::Aborted(format!(
            "volume {:?} is being deleted",
            want.name
        ))),
    }
}

/// The pool a node provisions from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pool {
    /// The configured pool size in bytes.
    pub size: u64,
    /// Bytes free for the data dir's filesystem (statvfs f_bavail).
    pub fs_available: u64,
}

/// Bytes a new volume may still take: what the configured pool has not promised yet, and no
/// more than the disk can really hold once every thin volume is filled to its size.
pub fn available(
    pool: Pool,
    volumes: &[(VolumeRecord, Option<FileInfo>)],
    snapshots: &[(SnapshotRecord, Option<FileInfo>)],
) -> u64 {
    let promised: u64 = volumes.iter().map(|(r, _)| r.size).sum::<u64>()
        + snapshots
            .iter()
            .map(|(_, f)| f.map(|f| f.allocated).unwrap_or(0))
            .sum::<u64>();
    let unallocated: u64 = volumes
        .iter()
        .map(|(r, f)| r.size.saturating_sub(f.map(|f| f.allocated).unwrap_or(0)))
        .sum();
    pool.size
        .saturating_sub(promised)
        .min(pool.fs_available.saturating_sub(unallocated))
}

/// One host operation of a node-side step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Attach {
        file: PathBuf,
    },
    Detach {
        device: PathBuf,
    },
    Refresh {
        device: PathBuf,
    },
    Format {
        device: PathBuf,
        fs: FsType,
    },
    /// Grows an unmounted ext4 filesystem to its device (after a restore into a larger volume
    /// or an expansion while unstaged).
    GrowOffline {
        device: PathBuf,
        fs: FsType,
    },
    MakeDir {
        path: PathBuf,
    },
    MakeFile {
        path: PathBuf,
    },
    RemovePath {
        path: PathBuf,
    },
    /// Removes a backing file (an inline volume's, at NodeUnpublishVolume).
    RemoveFile {
        path: PathBuf,
    },
    Mount(MountSpec),
    Unmount {
        target: PathBuf,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    Do(Op),
    Done,
}

/// What the engine saw on the host for one volume and one path.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    pub backing: Option<FileInfo>,
    pub backing_path: PathBuf,
    pub device: Option<PathBuf>,
    /// The device's content, probed when a device is attached.
    pub content: Option<Content>,
    /// The size its filesystem's superblock records.
    pub fs_bytes: Option<u64>,
    /// The attached device's size.
    pub device_bytes: Option<u64>,
    /// What is at the path the call names (staging or target path).
    pub path: Option<PathKind>,
    /// The mount at that path, if any.
    pub mount: Option<MountEntry>,
    /// The mount at the staging path, when the call is a publish.
    pub staging_mount: Option<MountEntry>,
    /// Mount points that still use the device (its filesystem or a bind of its node).
    pub device_users: Vec<PathBuf>,
}

fn device_name(device: &Path) -> String {
    device
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Whether `m` is a mount of `device`: its filesystem, or a bind of its device node.
pub fn mount_uses(m: &MountEntry, device: &Path) -> bool {
    m.source == device.to_string_lossy()
        || (m.root == format!("/{}", device_name(device)) && m.fstype == "devtmpfs")
}

/// Slack below which a filesystem counts as filling its device: resize2fs leaves out a last
/// block group too small to hold its own metadata.
const GROW_SLACK: u64 = 4 * MIB;

fn smaller_than_device(seen: &Seen) -> bool {
    matches!((seen.fs_bytes, seen.device_bytes), (Some(fs), Some(dev)) if fs + GROW_SLACK <= dev)
}

/// A volume is staged and published only as what it was made for (block or filesystem).
fn same_access(rec: &VolumeRecord, want: &Use) -> Result<(), PlanError> {
    if want.access == rec.access {
        return Ok(());
    }
    Err(PlanError::InvalidArgument(format!(
        "volume {} was made for {:?} access, the capability asks {:?}",
        rec.id, rec.access, want.access
    )))
}

/// NodeStageVolume's next step.
pub fn stage_step(
    rec: &VolumeRecord,
    want: &Use,
    staging: &Path,
    seen: &Seen,
) -> Result<Step, PlanError> {
    same_access(rec, want)?;
    if seen.backing.is_none() {
        return Err(PlanError::FailedPrecondition(format!(
            "the backing file {} of volume {} is gone",
            seen.backing_path.display(),
            rec.id
        )));
    }
    let Some(device) = &seen.device else {
        return Ok(Step::Do(Op::Attach {
            file: seen.backing_path.clone(),
        }));
    };
    if rec.access == AccessKind::Block {
        return Ok(Step::Done);
    }
    match seen.path {
        None => {
            return Ok(Step::Do(Op::MakeDir {
                path: staging.to_path_buf(),
            }))
        }
        Some(PathKind::Dir) => {}
        Some(_) => {
            return Err(PlanError::FailedPrecondition(format!(
                "staging path {} is not a directory",
                staging.display()
            )))
        }
    }
    if let Some(m) = &seen.mount {
        return if m.source == device.to_string_lossy() {
            Ok(Step::Done)
        } else {
            Err(PlanError::AlreadyExists(format!(
                "staging path {} already holds a mount of {}",
                staging.display(),
                m.source
            )))
        };
    }
    let fs = want.fs_or_default();
    match seen.content.as_ref().unwrap_or(&Content::Unknown) {
        Content::Blank => match rec.formatted {
            None => Ok(Step::Do(Op::Format { device: device.clone(), fs })),
            Some(was) => Err(PlanError::FailedPrecondition(format!(
                "volume {} was formatted {} but {} shows no filesystem now: refusing to format it again",
                rec.id,
                was.as_str(),
                device.display()
            ))),
        },
        Content::Fs(FsType::Ext4) if fs == FsType::Ext4 && smaller_than_device(seen) => {
            Ok(Step::Do(Op::GrowOffline { device: device.clone(), fs }))
        }
        Content::Fs(found) if *found == fs => Ok(Step::Do(Op::Mount(MountSpec::Fs {
            device: device.clone(),
            target: staging.to_path_buf(),
            fs,
            flags: want.flags.clone(),
        }))),
        Content::Fs(found) => Err(PlanError::FailedPrecondition(format!(
            "volume {} holds {}, the capability asks {}: it is not formatted again",
            rec.id,
            found.as_str(),
            fs.as_str()
        ))),
        Content::Other(what) => Err(PlanError::FailedPrecondition(format!(
            "volume {} holds {what}: refusing to format it",
            rec.id
        ))),
        Content::Unknown => Err(PlanError::FailedPrecondition(format!(
            "volume {} holds data without a filesystem ferro-csi knows: refusing to format it",
            rec.id
        ))),
    }
}

/// NodeUnstageVolume's next step: unmount the staging path, then detach the device once
/// nothing uses it.
pub fn unstage_step(staging: &Path, seen: &Seen) -> Result<Step, PlanError> {
    if seen.mount.is_some() {
        return Ok(Step::Do(Op::Unmount {
            target: staging.to_path_buf(),
        }));
    }
    if let Some(device) = &seen.device {
        if let Some(user) = seen.device_users.first() {
            return Err(PlanError::FailedPrecondition(format!(
                "{} is still mounted at {}: unpublish it first",
                device.display(),
                user.display()
            )));
        }
        return Ok(Step::Do(Op::Detach {
            device: device.clone(),
        }));
    }
    Ok(Step::Done)
}

enum Ours {
    SameFs(String),
    Device(PathBuf),
}

impl Ours {
    fn is(&self, m: &MountEntry) -> bool {
        match self {
            Ours::SameFs(major_minor) => &m.major_minor == major_minor,
            Ours::Device(device) => mount_uses(m, device),
        }
    }
}

/// NodePublishVolume's next step.
pub fn publish_step(
    rec: &VolumeRecord,
    want: &Use,
    readonly: bool,
    target: &Path,
    seen: &Seen,
) -> Result<Step, PlanError> {
    same_access(rec, want)?;
    let readonly = readonly || want.reader_only;
    // A mount at the target is ours when it is the staged filesystem (same device numbers)
    // or, for a block volume, a bind of the loop device's node.
    let (source, ours): (PathBuf, Ours) = match rec.access {
        AccessKind::Mount => {
            let Some(staged) = &seen.staging_mount else {
                return Err(PlanError::FailedPrecondition(format!(
                    "volume {} is not staged: call NodeStageVolume first",
                    rec.id
                )));
            };
            (
                staged.target.clone(),
                Ours::SameFs(staged.major_minor.clone()),
            )
        }
        AccessKind::Block => {
            let Some(device) = seen.device.clone() else {
                return Err(PlanError::FailedPrecondition(format!(
                    "volume {} has no loop device: call NodeStageVolume first",
                    rec.id
                )));
            };
            (device.clone(), Ours::Device(device))
        }
    };
    if let Some(m) = &seen.mount {
        return if ours.is(m) && m.read_only() == readonly {
            Ok(Step::Done)
        } else {
            Err(PlanError::AlreadyExists(format!(
                "target path {} is already published ({}, {}), incompatibly with this request",
                target.display(),
                m.source,
                m.options
            )))
        };
    }
    match (rec.access, seen.path) {
        (AccessKind::Mount, None) => {
            return Ok(Step::Do(Op::MakeDir {
                path: target.to_path_buf(),
            }))
        }
        (AccessKind::Block, None) => {
            return Ok(Step::Do(Op::MakeFile {
                path: target.to_path_buf(),
            }))
        }
        (AccessKind::Mount, Some(PathKind::Dir)) | (AccessKind::Block, Some(PathKind::File)) => {}
        (_, Some(kind)) => {
            return Err(PlanError::FailedPrecondition(format!(
                "target path {} is a {kind:?}, not what {:?} access publishes on",
                target.display(),
                rec.access
            )))
        }
    }
    Ok(Step::Do(Op::Mount(MountSpec::Bind {
        source,
        target: target.to_path_buf(),
        readonly,
    })))
}

/// NodeUnpublishVolume's next step: unmount the target, then remove what publishing made.
pub fn unpublish_step(target: &Path, seen: &Seen) -> Step {
    if seen.mount.is_some() {
        Step::Do(Op::Unmount {
            target: target.to_path_buf(),
        })
    } else if seen.path.is_some() {
        Step::Do(Op::RemovePath {
            path: target.to_path_buf(),
        })
    } else {
        Step::Done
    }
}

#[cfg(test)]
mod tests;
