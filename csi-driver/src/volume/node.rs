//! The node half of the engine: staging (attach, format when blank, mount), publishing (bind
//! mounts), their undoing, online growth and usage. Each call settles step by step from fresh
//! observations, so it is idempotent and resumes wherever a try before it stopped.

use std::collections::HashMap;
use std::path::Path;

use super::engine::{Engine, EngineError};
use super::host::{Content, FsStats, Host};
use super::names::is_volume_id;
use super::plan::{self, ephemeral, PlanError};
use super::record::{AccessKind, FsType, State, VolumeRecord};
use crate::proto::VolumeCapability;

/// The health of a volume as NodeGetVolumeStats reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Condition {
    pub abnormal: bool,
    pub message: String,
}

/// Usage of a volume: a filesystem's bytes and inodes, or a block device's size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Usage {
    Fs(FsStats),
    Block { total_bytes: u64 },
}

fn required<'a>(value: &'a str, what: &str) -> Result<&'a Path, PlanError> {
    if value.is_empty() {
        Err(PlanError::InvalidArgument(format!("{what} missing")))
    } else {
        Ok(Path::new(value))
    }
}

/// A staging or target path the CO hands over: absolute, without `.`/`..` components, and
/// under one of the directories the driver was told the CO uses (kubelet's root dir).
pub fn allowed<'a>(
    value: &'a str,
    what: &str,
    roots: &[std::path::PathBuf],
) -> Result<&'a Path, PlanError> {
    use std::path::Component;
    let path = required(value, what)?;
    let plain = path.is_absolute()
        && path
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    if !plain {
        return Err(PlanError::InvalidArgument(format!(
            "{what} {value:?} must be an absolute path without . or .. components"
        )));
    }
    if !roots.iter().any(|r| path.starts_with(r) && path != r) {
        return Err(PlanError::InvalidArgument(format!(
            "{what} {value:?} is outside the directories ferro-csi serves ({roots:?})"
        )));
    }
    Ok(path)
}

impl<H: Host> Engine<H> {
    /// The record of a (persistent) volume a node call names: NotFound when there is none.
    /// An inline volume is named by the CO's ID, never by the ID ferro-csi keeps it under.
    fn node_volume(&self, id: &str) -> Result<VolumeRecord, EngineError> {
        if id.is_empty() {
            return Err(PlanError::InvalidArgument("volume id missing".into()).into());
        }
        let rec = is_volume_id(id)
            .then(|| self.journal.volume(id))
            .transpose()?
            .flatten()
            .filter(|r| !r.ephemeral);
        match rec {
            Some(r) if r.state == State::Ready => Ok(r),
            Some(r) => {
                Err(PlanError::FailedPrecondition(format!("volume {id} is {:?}", r.state)).into())
            }
            None => Err(PlanError::NotFound(format!(
                "volume {id:?} does not exist on node {}",
                self.config.node_id
            ))
            .into()),
        }
    }

    /// What the host shows at a volume path NodeExpandVolume or NodeGetVolumeStats names;
    /// NotFound when nothing is there.
    fn observe_volume_path(&self, disk: &Path, path: &Path) -> Result<super::plan::Seen, EngineError> {
        let seen = self.observe(disk, path, None)?;
        if seen.path.is_none() {
            return Err(PlanError::NotFound(format!("volume path {} does not exist", path.display())).into());
        }
        Ok(seen)
    }

    pub fn stage(
        &self,
        id: &str,
        staging: &str,
        cap: Option<&VolumeCapability>,
    ) -> Result<(), EngineError> {
        let staging = allowed(staging, "staging target path", &self.config.allowed_roots)?;
        let cap =
            cap.ok_or_else(|| PlanError::InvalidArgument("volume capability missing".into()))?;
        let rec = self.node_volume(id)?;
        let wanted = plan::capability(cap)?;
        let _claim = self.claim(id)?;
        self.stage_at(&rec, &wanted, staging).map(drop)
    }

    /// Stages `rec` at a checked `staging` path, the caller holding its claim; records where
    /// and with what filesystem. Returns the record as it is now.
    pub(super) fn stage_at(
        &self,
        rec: &VolumeRecord,
        wanted: &plan::Use,
        staging: &Path,
    ) -> Result<VolumeRecord, EngineError> {
        let disk = self.layout().volume_disk(&rec.id);
        let seen = self.settle("NodeStageVolume", &disk, staging, None, |seen| {
            plan::stage_step(rec, wanted, staging, seen)
        })?;
        let mut updated = rec.clone();
        updated.staged = Some(staging.to_path_buf());
        if let Some(Content::Fs(fs)) = seen.content {
            updated.formatted = Some(fs);
            // ext4 was grown offline by the planner before mounting; XFS grows only mounted.
            if rec.grow_pending && fs == FsType::Xfs {
                if let Some(device) = &seen.device {
                    self.host.grow_fs(fs, device, staging)?;
                }
            }
            updated.grow_pending = false;
        }
        if &updated != rec {
            self.journal.put_volume(&updated)?;
        }
        Ok(updated)
    }

    pub fn unstage(&self, id: &str, staging: &str) -> Result<(), EngineError> {
        let staging = allowed(staging, "staging target path", &self.config.allowed_roots)?;
        let rec = self.node_volume(id)?;
        let _claim = self.claim(id)?;
        let disk = self.layout().volume_disk(id);
        self.settle("NodeUnstageVolume", &disk, staging, None, |seen| {
            plan::unstage_step(staging, seen)
        })?;
        if rec.staged.is_some() {
            let mut updated = rec;
            updated.staged = None;
            self.journal.put_volume(&updated)?;
        }
        Ok(())
    }

    pub fn publish(
        &self,
        id: &str,
        staging: &str,
        target: &str,
        cap: Option<&VolumeCapability>,
        readonly: bool,
    ) -> Result<(), EngineError> {
        let target = allowed(target, "target path", &self.config.allowed_roots)?;
        let cap =
            cap.ok_or_else(|| PlanError::InvalidArgument("volume capability missing".into()))?;
        let rec = self.node_volume(id)?;
        let wanted = plan::capability(cap)?;
        let staging = match rec.access {
            AccessKind::Mount => Some(allowed(
                staging,
                "staging target path",
                &self.config.allowed_roots,
            )?),
            AccessKind::Block => None,
        };
        let _claim = self.claim(id)?;
        self.publish_at(rec, &wanted, readonly, target, staging)
    }

    /// Publishes `rec` at a checked `target` (from its staging mount, or its device node for a
    /// block volume), the caller holding its claim; records the target.
    pub(super) fn publish_at(
        &self,
        rec: VolumeRecord,
        wanted: &plan::Use,
        readonly: bool,
        target: &Path,
        staging: Option<&Path>,
    ) -> Result<(), EngineError> {
        let disk = self.layout().volume_disk(&rec.id);
        self.settle("NodePublishVolume", &disk, target, staging, |seen| {
            plan::publish_step(&rec, wanted, readonly, target, seen)
        })?;
        if !rec.published.iter().any(|p| p == target) {
            let mut updated = rec;
            updated.published.push(target.to_path_buf());
            self.journal.put_volume(&updated)?;
        }
        Ok(())
    }

    /// NodePublishVolume: an inline volume when the volume context says so
    /// (`csi.storage.k8s.io/ephemeral: "true"`), else a persistent volume staged before.
    pub fn node_publish(
        &self,
        id: &str,
        staging: &str,
        target: &str,
        cap: Option<&VolumeCapability>,
        readonly: bool,
        context: &HashMap<String, String>,
    ) -> Result<(), EngineError> {
        if ephemeral::is_ephemeral(context)? {
            return self.publish_ephemeral(id, target, cap, readonly, context);
        }
        self.publish(id, staging, target, cap, readonly)
    }

    /// NodeUnpublishVolume: an inline volume's takes the whole volume away; an ID that names
    /// nothing and is not shaped like a CreateVolume's is an inline volume already gone.
    pub fn unpublish(&self, id: &str, target: &str) -> Result<(), EngineError> {
        let target = allowed(target, "target path", &self.config.allowed_roots)?;
        if let Some(rec) = self.ephemeral_record(id)? {
            return self.unpublish_ephemeral(rec, target);
        }
        if !id.is_empty() && !is_volume_id(id) {
            return self.unpublish_gone(id, target);
        }
        let rec = self.node_volume(id)?;
        let _claim = self.claim(id)?;
        let disk = self.layout().volume_disk(id);
        self.settle("NodeUnpublishVolume", &disk, target, None, |seen| {
            Ok(plan::unpublish_step(target, seen))
        })?;
        if rec.published.iter().any(|p| p == target) {
            let mut updated = rec;
            updated.published.retain(|p| p != target);
            self.journal.put_volume(&updated)?;
        }
        Ok(())
    }

    /// NodeExpandVolume: the loop device takes the backing file's size, then the filesystem
    /// mounted at `volume_path` grows online. Returns the volume's size.
    pub fn node_expand(&self, id: &str, volume_path: &str) -> Result<u64, EngineError> {
        let path = allowed(volume_path, "volume path", &self.config.allowed_roots)?;
        let rec = self.node_volume(id)?;
        let _claim = self.claim(id)?;
        let disk = self.layout().volume_disk(id);
        let seen = self.observe_volume_path(&disk, path)?;
        let device = seen.device.ok_or_else(|| {
            PlanError::FailedPrecondition(format!(
                "volume {id} has no loop device: it is not staged"
            ))
        })?;
        let file_size = seen.backing.map(|f| f.size).unwrap_or(0);
        if self.host.device_size(&device)? < file_size {
            self.host.refresh(&device)?;
        }
        if rec.access == AccessKind::Mount {
            let mount = seen.mount.ok_or_else(|| {
                PlanError::FailedPrecondition(format!(
                    "{} is not a mount of volume {id}",
                    path.display()
                ))
            })?;
            let fs = match seen.content {
                Some(Content::Fs(fs)) => fs,
                _ => rec.formatted.unwrap_or(FsType::Ext4),
            };
            self.host.grow_fs(fs, &device, &mount.target)?;
        }
        Ok(file_size)
    }

    /// NodeGetVolumeStats: usage at `volume_path`, and the volume's condition (abnormal when
    /// its backing file or, while staged, its loop device is gone).
    pub fn stats(&self, id: &str, volume_path: &str) -> Result<(Usage, Condition), EngineError> {
        let path = allowed(volume_path, "volume path", &self.config.allowed_roots)?;
        let rec = match self.ephemeral_record(id)? {
            Some(r) if r.state == State::Ready => r,
            Some(r) => {
                return Err(PlanError::FailedPrecondition(format!(
                    "inline volume {id:?} is {:?}",
                    r.state
                ))
                .into())
            }
            None => self.node_volume(id)?,
        };
        let disk = self.layout().volume_disk(&rec.id);
        let seen = self.observe_volume_path(&disk, path)?;
        let condition = match (&seen.backing, &seen.device) {
            (None, _) => Condition { abnormal: true, message: format!("backing file {} is gone", disk.display()) },
            (Some(_), None) if rec.staged.is_some() => Condition {
                abnormal: true,
                message: "the loop device vanished; the next NodeStageVolume or a ferro-csi restart re-attaches it".into(),
            },
            _ => Condition { abnormal: false, message: "volume is healthy".into() },
        };
        let usage = match rec.access {
            AccessKind::Mount => Usage::Fs(self.host.fs_stats(path)?),
            AccessKind::Block => Usage::Block {
                total_bytes: seen.backing.map(|f| f.size).unwrap_or(rec.size),
            },
        };
        Ok((usage, condition))
    }
}
