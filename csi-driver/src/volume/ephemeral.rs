//! Inline volumes on the node (CSI's "Ephemeral" lifecycle mode): NodePublishVolume makes the
//! volume through the journal and the pool as CreateVolume does, stages it at ferro-csi's own
//! staging dir (`<data dir>/staging/<id>`) and binds it to the target; NodeUnpublishVolume
//! records the intent (`Deleting`) and then takes everything away step by step, so a crash
//! anywhere is finished by the next call or by start-up recovery. The decisions are
//! `plan::ephemeral`'s.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use tracing::{info, warn};

use super::engine::{Engine, EngineError};
use super::host::Host;
use super::names::ephemeral_volume_id;
use super::node::allowed;
use super::plan::ephemeral::{self, EphemeralDecision, PathSeen, RemovalSeen};
use super::plan::{self, Op, PlanError, Step};
use super::record::{State, VolumeRecord};
use crate::proto::VolumeCapability;

/// Steps a removal may take besides two per target: unmount the staging dir, detach, remove
/// the staging dir, remove the file; a loop means the host does not do what was asked.
const REMOVAL_STEPS: usize = 8;

impl<H: Host> Engine<H> {
    /// The inline volume the CO's volume ID names, if there is one.
    pub(super) fn ephemeral_record(
        &self,
        handle: &str,
    ) -> Result<Option<VolumeRecord>, EngineError> {
        if handle.is_empty() {
            return Ok(None);
        }
        Ok(self
            .journal
            .volume(&ephemeral_volume_id(handle))?
            .filter(|r| r.ephemeral && r.name == handle))
    }

    /// NodePublishVolume of an inline volume: make it (or find it), stage it, bind it to the
    /// target. A publish that fails for a volume no publish has completed for yet (nothing a
    /// pod wrote is in it) takes the volume away again, so a CO that gives up after an error
    /// leaves nothing behind.
    pub fn publish_ephemeral(
        &self,
        handle: &str,
        target: &str,
        cap: Option<&VolumeCapability>,
        readonly: bool,
        context: &HashMap<String, String>,
    ) -> Result<(), EngineError> {
        let target = allowed(target, "target path", &self.config.allowed_roots)?;
        let cap =
            cap.ok_or_else(|| PlanError::InvalidArgument("volume capability missing".into()))?;
        let want = ephemeral::ephemeral_want(handle, context, cap, readonly)?;
        let id = want.create.id.clone();
        let _claim = self.claim(&id)?;
        let existing = self.journal.volume(&id)?;
        let decision = match ephemeral::decide_ephemeral(existing.as_ref(), &want)? {
            EphemeralDecision::RemoveFirst(rec) => {
                self.remove_ephemeral(&rec)?;
                plan::decide_create(None, &want.create)?
            }
            EphemeralDecision::Create(d) => d,
        };
        let rec = self.realize(decision, &want.create, false)?;
        let never_published = rec.published.is_empty();
        let staging = self.layout().staging_dir(&id);
        let published = self
            .stage_at(&rec, &want.wanted, &staging)
            .and_then(|rec| self.publish_at(rec, &want.wanted, readonly, target, Some(&staging)));
        if let Err(e) = published {
            if never_published {
                self.roll_back_ephemeral(&id, target);
            }
            return Err(e);
        }
        info!(volume = %id, handle = %handle, target = %target.display(), "inline volume published");
        Ok(())
    }

    /// NodeUnpublishVolume of an inline volume: the target goes, and with it the volume
    /// unless another target still holds it.
    pub(super) fn unpublish_ephemeral(
        &self,
        rec: VolumeRecord,
        target: &Path,
    ) -> Result<(), EngineError> {
        let _claim = self.claim(&rec.id)?;
        // Read again under the claim: a call that held it may have changed or removed it.
        let Some(mut rec) = self.journal.volume(&rec.id)?.filter(|r| r.ephemeral) else {
            return self.unpublish_gone(&rec.name, target);
        };
        let mount_points: Vec<PathBuf> =
            self.host.mounts()?.into_iter().map(|m| m.target).collect();
        if !ephemeral::unpublish_removes(&rec, target, &mount_points) {
            let disk = self.layout().volume_disk(&rec.id);
            self.settle("NodeUnpublishVolume", &disk, target, None, |seen| {
                Ok(plan::unpublish_step(target, seen))
            })?;
            rec.published.retain(|p| p != target);
            self.journal.put_volume(&rec)?;
            return Ok(());
        }
        self.mark_removing(&mut rec, target)?;
        self.remove_ephemeral(&rec)
    }

    /// A NodeUnpublishVolume for an ID that names nothing of ferro-csi's.
    pub(super) fn unpublish_gone(&self, handle: &str, target: &Path) -> Result<(), EngineError> {
        let mounted = self.host.mounts()?.iter().any(|m| m.target == target);
        ephemeral::unpublish_gone(handle, target, mounted)?;
        Ok(())
    }

    /// Records the intent to remove (the target among the ones to undo) before anything is
    /// taken away.
    fn mark_removing(&self, rec: &mut VolumeRecord, target: &Path) -> Result<(), EngineError> {
        let mut changed = rec.state != State::Deleting;
        if !rec.published.iter().any(|p| p == target) {
            rec.published.push(target.to_path_buf());
            changed = true;
        }
        if changed {
            rec.state = State::Deleting;
            self.journal.put_volume(rec)?;
        }
        Ok(())
    }

    /// Takes a failed first publish's volume away again; what cannot be done now is left
    /// `Deleting` for the next call or start-up recovery.
    fn roll_back_ephemeral(&self, id: &str, target: &Path) {
        let undone = self
            .journal
            .volume(id)
            .map_err(EngineError::from)
            .and_then(|rec| {
                let Some(mut rec) = rec else { return Ok(()) };
                self.mark_removing(&mut rec, target)?;
                self.remove_ephemeral(&rec)
            });
        match undone {
            Ok(()) => info!(volume = %id, "rolled back the inline volume of a failed publish"),
            Err(e) => {
                warn!(volume = %id, error = %e, "rolling back a failed publish: the next call on the volume or start-up recovery finishes it")
            }
        }
    }

    /// What the host shows of an inline volume being removed.
    fn observe_removal(&self, rec: &VolumeRecord) -> Result<RemovalSeen, EngineError> {
        let disk = self.layout().volume_disk(&rec.id);
        let staging = self.layout().staging_dir(&rec.id);
        let mounts = self.host.mounts()?;
        let device = self.host.loops_of(&disk)?.into_iter().next();
        let device_users = match &device {
            Some(d) => mounts
                .iter()
                .filter(|m| plan::mount_uses(m, d))
                .map(|m| m.target.clone())
                .collect(),
            None => Vec::new(),
        };
        let path_seen = |path: &Path| -> Result<PathSeen, EngineError> {
            Ok(PathSeen {
                path: path.to_path_buf(),
                kind: self.host.path_kind(path)?,
                mounted: mounts.iter().any(|m| m.target == path),
            })
        };
        Ok(RemovalSeen {
            backing: self.host.file_info(&disk)?.is_some(),
            device,
            device_users,
            targets: rec
                .published
                .iter()
                .map(|t| path_seen(t))
                .collect::<Result<_, _>>()?,
            staging: path_seen(&staging)?,
        })
    }

    /// Removes an inline volume recorded `Deleting`: targets, staging mount, loop device,
    /// staging dir, backing file, then the record. Idempotent; resumes wherever a try before
    /// it stopped.
    pub(super) fn remove_ephemeral(&self, rec: &VolumeRecord) -> Result<(), EngineError> {
        let disk = self.layout().volume_disk(&rec.id);
        let steps = REMOVAL_STEPS + 2 * rec.published.len();
        let mut last = None;
        for _ in 0..steps {
            let seen = self.observe_removal(rec)?;
            match ephemeral::removal_step(&disk, &seen)? {
                Step::Done => {
                    self.journal.remove_volume(&rec.id)?;
                    info!(volume = %rec.id, handle = %rec.name, "inline volume removed");
                    return Ok(());
                }
                Step::Do(op) => {
                    self.exec(&op)?;
                    last = Some(op);
                }
            }
        }
        Err(EngineError::NoProgress {
            what: "removing an inline volume",
            steps,
            last: last.unwrap_or(Op::RemoveFile { path: disk }),
        })
    }
}

#[cfg(test)]
mod tests;
