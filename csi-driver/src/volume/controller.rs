//! The controller half of the engine: volumes and snapshots made, grown, listed and removed.
//! Each writes its intent to the journal before touching the host, and on failure undoes what
//! it did, so an error leaves nothing behind and a crash leaves what `recover` cleans.

use std::collections::HashMap;

use tracing::{info, warn};

use super::engine::{lock, Engine, EngineError};
use super::host::Host;
use super::names::{is_snapshot_id, is_volume_id, snapshot_id, volume_id};
use super::plan::{self, CreateDecision, CreateWant, Params, PlanError, Use};
use super::record::{AccessKind, Provisioning, SnapshotRecord, Source, State, VolumeRecord};
use crate::proto::{CapacityRange, VolumeCapability};

/// A CreateVolume, as the service hands it over.
pub struct CreateRequest<'a> {
    pub name: &'a str,
    pub range: Option<&'a CapacityRange>,
    pub capabilities: &'a [VolumeCapability],
    pub parameters: &'a HashMap<String, String>,
    pub source: Option<Source>,
}

fn now() -> String {
    jiff::Timestamp::now().to_string()
}

impl<H: Host> Engine<H> {
    pub fn create_volume(&self, req: CreateRequest<'_>) -> Result<VolumeRecord, EngineError> {
        if req.name.is_empty() {
            return Err(PlanError::InvalidArgument("volume name missing".into()).into());
        }
        let wanted: Use = plan::capabilities(req.capabilities)?;
        let params = Params::parse(req.parameters)?;
        let min = plan::min_size(wanted.access, wanted.fs);
        let size = plan::size_for(req.range, min)?;
        let source_size = match &req.source {
            None => None,
            Some(Source::Snapshot(sid)) => Some(self.ready_snapshot(sid)?.size),
            Some(Source::Volume(vid)) => Some(self.ready_volume(vid)?.size),
        };
        if let Some(src) = source_size.filter(|s| *s > size) {
            return Err(PlanError::OutOfRange(format!(
                "the content source holds {src} bytes, more than the {size} asked for"
            ))
            .into());
        }
        let want = CreateWant {
            id: volume_id(req.name),
            name: req.name.to_string(),
            size,
            params,
            access: wanted.access,
            source: req.source,
            ephemeral: false,
        };
        let _claim = self.claim(&want.id)?;
        let existing = self.journal.volume(&want.id)?;
        let decision = plan::decide_create(existing.as_ref(), &want)?;
        self.realize(decision, &want, source_size.is_some_and(|s| s < want.size))
    }

    /// Brings a volume the planner decided on to Ready, the caller holding its claim: one that
    /// exists as it is, a half-made one finished, a new one taken from the pool
    /// (ResourceExhausted when it does not fit, nothing written), recorded `Creating`, its
    /// backing file made, recorded `Ready`; a failed fill is rolled back.
    pub(super) fn realize(
        &self,
        decision: CreateDecision,
        want: &CreateWant,
        grow_pending: bool,
    ) -> Result<VolumeRecord, EngineError> {
        let rec = match decision {
            CreateDecision::Exists(rec) => return Ok(rec),
            CreateDecision::Finish(rec) => rec,
            CreateDecision::Make => {
                let _pool = lock(&self.provisioning);
                let available = self.available()?;
                if want.size > available {
                    return Err(PlanError::ResourceExhausted(format!(
                        "node {} has {available} bytes left in its pool, the volume needs {}",
                        self.config.node_id, want.size
                    ))
                    .into());
                }
                let rec = VolumeRecord {
                    id: want.id.clone(),
                    name: want.name.clone(),
                    size: want.size,
                    provisioning: want.params.provisioning,
                    access: want.access,
                    state: State::Creating,
                    source: want.source.clone(),
                    created: now(),
                    formatted: None,
                    grow_pending,
                    staged: None,
                    published: Vec::new(),
                    parameters: want.params.to_map(),
                    ephemeral: want.ephemeral,
                };
                self.journal.put_volume(&rec)?;
                rec
            }
        };
        match self.fill(&rec) {
            Ok(()) => {
                let mut done = rec;
                done.state = State::Ready;
                self.journal.put_volume(&done)?;
                info!(volume = %done.id, name = %done.name, size = done.size, ephemeral = done.ephemeral, "volume created");
                Ok(done)
            }
            Err(e) => {
                self.roll_back_volume(&rec.id);
                Err(e)
            }
        }
    }

    /// Makes the backing file of a volume being created: empty, or a copy of its source.
    fn fill(&self, rec: &VolumeRecord) -> Result<(), EngineError> {
        let disk = self.layout().volume_disk(&rec.id);
        let thick = rec.provisioning == Provisioning::Thick;
        match &rec.source {
            None => self.host.create_file(&disk, rec.size, thick)?,
            Some(Source::Snapshot(sid)) => {
                self.host
                    .copy_file(&self.layout().snapshot_disk(sid), &disk)?;
                self.host.grow_file(&disk, rec.size, thick)?;
            }
            Some(Source::Volume(vid)) => {
                let src = self.ready_volume(vid)?;
                self.copy_consistent(&src, &disk)?;
                self.host.grow_file(&disk, rec.size, thick)?;
            }
        }
        Ok(())
    }

    /// Copies a volume's backing file with its filesystem frozen when it is mounted, so the
    /// copy is a consistent image.
    fn copy_consistent(&self, src: &VolumeRecord, to: &std::path::Path) -> Result<(), EngineError> {
        let from = self.layout().volume_disk(&src.id);
        let frozen = match (&src.staged, src.access) {
            (Some(staging), AccessKind::Mount)
                if self.host.mounts()?.iter().any(|m| &m.target == staging) =>
            {
                self.host.freeze(staging, true)?;
                Some(staging.clone())
            }
            _ => None,
        };
        let copied = self.host.copy_file(&from, to);
        if let Some(staging) = frozen {
            self.host.freeze(&staging, false)?;
        }
        copied.map_err(EngineError::from)
    }

    fn roll_back_volume(&self, id: &str) {
        let disk = self.layout().volume_disk(id);
        if let Err(e) = self.host.remove_file(&disk) {
            warn!(volume = %id, error = %e, "rolling back a failed create: the backing file stays until start-up recovery");
            return;
        }
        if let Err(e) = self.journal.remove_volume(id) {
            warn!(volume = %id, error = %e, "rolling back a failed create: the record stays until start-up recovery");
        }
    }

    /// A Ready volume of the Controller's (inline volumes are the Node's alone).
    pub(super) fn ready_volume(&self, id: &str) -> Result<VolumeRecord, EngineError> {
        let rec = is_volume_id(id)
            .then(|| self.journal.volume(id))
            .transpose()?
            .flatten();
        match rec {
            Some(r) if r.state == State::Ready && !r.ephemeral => Ok(r),
            _ => Err(PlanError::NotFound(format!("volume {id:?} does not exist")).into()),
        }
    }

    fn ready_snapshot(&self, id: &str) -> Result<SnapshotRecord, EngineError> {
        let rec = is_snapshot_id(id)
            .then(|| self.journal.snapshot(id))
            .transpose()?
            .flatten();
        match rec {
            Some(r) if r.state == State::Ready => Ok(r),
            _ => Err(PlanError::NotFound(format!("snapshot {id:?} does not exist")).into()),
        }
    }

    /// DeleteVolume: refused while the volume is staged or published; a volume that does not
    /// exist is already deleted.
    pub fn delete_volume(&self, id: &str) -> Result<(), EngineError> {
        if id.is_empty() {
            return Err(PlanError::InvalidArgument("volume id missing".into()).into());
        }
        if !is_volume_id(id) {
            return Ok(());
        }
        let _claim = self.claim(id)?;
        let Some(mut rec) = self.journal.volume(id)? else {
            return Ok(());
        };
        if rec.ephemeral {
            return Err(PlanError::FailedPrecondition(format!(
                "volume {id} is an inline volume of the Node: NodeUnpublishVolume removes it"
            ))
            .into());
        }
        let disk = self.layout().volume_disk(id);
        let devices = self.host.loops_of(&disk)?;
        let mounts = self.host.mounts()?;
        let in_use: Vec<_> = mounts
            .iter()
            .filter(|m| devices.iter().any(|d| plan::mount_uses(m, d)))
            .map(|m| m.target.display().to_string())
            .collect();
        if rec.state == State::Ready
            && (rec.staged.is_some() || !rec.published.is_empty() || !in_use.is_empty())
        {
            return Err(PlanError::FailedPrecondition(format!(
                "volume {id} is in use (staged at {:?}, published at {:?}, mounted at {in_use:?}): unstage it first",
                rec.staged, rec.published
            ))
            .into());
        }
        rec.state = State::Deleting;
        self.journal.put_volume(&rec)?;
        for d in devices {
            self.host.detach(&d)?;
        }
        self.host.remove_file(&disk)?;
        self.journal.remove_volume(id)?;
        info!(volume = %id, name = %rec.name, "volume deleted");
        Ok(())
    }

    /// ControllerExpandVolume: grows the backing file (and a loop device on it); the
    /// filesystem is grown by NodeExpandVolume. Returns the size and whether the node must act.
    pub fn expand_volume(
        &self,
        id: &str,
        range: Option<&CapacityRange>,
    ) -> Result<(u64, bool), EngineError> {
        if id.is_empty() {
            return Err(PlanError::InvalidArgument("volume id missing".into()).into());
        }
        let range =
            range.ok_or_else(|| PlanError::InvalidArgument("capacity range missing".into()))?;
        let _claim = self.claim(id)?;
        let mut rec = self.ready_volume(id)?;
        let min = plan::min_size(rec.access, rec.formatted);
        let size = plan::size_for(Some(range), min)?;
        if size > rec.size {
            let _pool = lock(&self.provisioning);
            let available = self.available()?;
            if size - rec.size > available {
                return Err(PlanError::OutOfRange(format!(
                    "growing to {size} bytes needs {} more, node {} has {available} left",
                    size - rec.size,
                    self.config.node_id
                ))
                .into());
            }
            rec.size = size;
            self.journal.put_volume(&rec)?;
        }
        // Also when the record already says so: a try before may have stopped between the
        // record and the file.
        let disk = self.layout().volume_disk(id);
        self.host
            .grow_file(&disk, rec.size, rec.provisioning == Provisioning::Thick)?;
        for d in self.host.loops_of(&disk)? {
            if self.host.device_size(&d)? < rec.size {
                self.host.refresh(&d)?;
            }
        }
        Ok((rec.size, rec.access == AccessKind::Mount))
    }

    /// The Controller's Ready volumes (ListVolumes, the provisioner's sweep): inline volumes
    /// are not listed (they count against the pool all the same).
    pub fn volumes(&self) -> Result<Vec<VolumeRecord>, EngineError> {
        Ok(self
            .journal
            .volumes()?
            .into_iter()
            .filter(|r| r.state == State::Ready && !r.ephemeral)
            .collect())
    }

    /// ValidateVolumeCapabilities: `Ok(None)` when every capability is one the volume can
    /// serve, `Ok(Some(reason))` when one is not.
    pub fn validate(
        &self,
        id: &str,
        caps: &[VolumeCapability],
        params: &HashMap<String, String>,
    ) -> Result<Option<String>, EngineError> {
        if id.is_empty() {
            return Err(PlanError::InvalidArgument("volume id missing".into()).into());
        }
        if caps.is_empty() {
            return Err(PlanError::InvalidArgument("volume capabilities missing".into()).into());
        }
        let rec = self.ready_volume(id)?;
        if let Err(e) = Params::parse(params) {
            return Ok(Some(e.to_string()));
        }
        for cap in caps {
            match plan::capability(cap) {
                Err(e) => return Ok(Some(e.to_string())),
                Ok(u) if u.access != rec.access => {
                    return Ok(Some(format!("volume was made for {:?} access", rec.access)))
                }
                Ok(u) => {
                    if let (Some(asked), Some(has)) = (u.fs, rec.formatted) {
                        if asked != has {
                            return Ok(Some(format!("volume holds {}", has.as_str())));
                        }
                    }
                }
            }
        }
        Ok(None)
    }

    pub fn create_snapshot(
        &self,
        source_id: &str,
        name: &str,
    ) -> Result<SnapshotRecord, EngineError> {
        if name.is_empty() {
            return Err(PlanError::InvalidArgument("snapshot name missing".into()).into());
        }
        if source_id.is_empty() {
            return Err(PlanError::InvalidArgument("source volume id missing".into()).into());
        }
        let id = snapshot_id(name);
        let _claim = self.claim(&id)?;
        if let Some(existing) = self.journal.snapshot(&id)? {
            if existing.source_volume_id != source_id {
                return Err(PlanError::AlreadyExists(format!(
                    "snapshot {name:?} exists of volume {}",
                    existing.source_volume_id
                ))
                .into());
            }
            if existing.state == State::Ready {
                return Ok(existing);
            }
        }
        let _source_claim = self.claim(source_id)?;
        let src = self.ready_volume(source_id)?;
        let rec = {
            let _pool = lock(&self.provisioning);
            let needs = self
                .host
                .file_info(&self.layout().volume_disk(&src.id))?
                .map(|f| f.allocated)
                .unwrap_or(0);
            let available = self.available()?;
            if needs > available {
                return Err(PlanError::ResourceExhausted(format!(
                    "the snapshot needs up to {needs} bytes, node {} has {available} left",
                    self.config.node_id
                ))
                .into());
            }
            let rec = SnapshotRecord {
                id: id.clone(),
                name: name.to_string(),
                source_volume_id: src.id.clone(),
                size: src.size,
                state: State::Creating,
                created: now(),
            };
            self.journal.put_snapshot(&rec)?;
            rec
        };
        let disk = self.layout().snapshot_disk(&id);
        if let Err(e) = self.copy_consistent(&src, &disk) {
            if self.host.remove_file(&disk).is_ok() {
                if let Err(j) = self.journal.remove_snapshot(&id) {
                    warn!(snapshot = %id, error = %j, "rolling back a failed snapshot: the record stays until start-up recovery");
                }
            }
            return Err(e);
        }
        let mut done = rec;
        done.state = State::Ready;
        self.journal.put_snapshot(&done)?;
        info!(snapshot = %id, volume = %src.id, "snapshot created");
        Ok(done)
    }

    pub fn delete_snapshot(&self, id: &str) -> Result<(), EngineError> {
        if id.is_empty() {
            return Err(PlanError::InvalidArgument("snapshot id missing".into()).into());
        }
        if !is_snapshot_id(id) {
            return Ok(());
        }
        let _claim = self.claim(id)?;
        let Some(mut rec) = self.journal.snapshot(id)? else {
            return Ok(());
        };
        rec.state = State::Deleting;
        self.journal.put_snapshot(&rec)?;
        self.host.remove_file(&self.layout().snapshot_disk(id))?;
        self.journal.remove_snapshot(id)?;
        Ok(())
    }

    pub fn snapshots(&self) -> Result<Vec<SnapshotRecord>, EngineError> {
        Ok(self
            .journal
            .snapshots()?
            .into_iter()
            .filter(|r| r.state == State::Ready)
            .collect())
    }
}

/// One page of a listing: `starting_token` is the index to start at (as the previous page's
/// `next_token` said); a token that is not one is `Aborted`, as the spec asks.
pub fn page<T: Clone>(
    items: &[T],
    max_entries: i32,
    starting_token: &str,
) -> Result<(Vec<T>, String), PlanError> {
    if max_entries < 0 {
        return Err(PlanError::InvalidArgument(format!(
            "max_entries {max_entries} is negative"
        )));
    }
    let start = if starting_token.is_empty() {
        0
    } else {
        starting_token
            .parse::<usize>()
            .ok()
            .filter(|s| *s <= items.len())
            .ok_or_else(|| {
                PlanError::Aborted(format!(
                    "starting_token {starting_token:?} is not one ferro-csi gave out"
                ))
            })?
    };
    let end = if max_entries == 0 {
        items.len()
    } else {
        (start + max_entries as usize).min(items.len())
    };
    let next = if end < items.len() {
        end.to_string()
    } else {
        String::new()
    };
    Ok((items[start..end].to_vec(), next))
}
