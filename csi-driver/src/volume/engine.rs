//! The volume engine: applies the planner's decisions through a [`Host`], keeps the journal,
//! and recovers after a crash. One call per volume at a time: a second call for a volume that
//! is busy gets `Aborted`, as the CSI spec asks (the CO retries). Every operation here blocks;
//! the gRPC services run them on tokio's blocking pool.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use tracing::{info, warn};

use super::host::{Host, HostError};
use super::names::Layout;
use super::plan::{mount_uses, Op, PlanError, Pool, Seen, Step};
use super::record::{Journal, JournalError, State};

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error(transparent)]
    Host(#[from] HostError),
    #[error("{what} did not settle within {steps} steps (last step: {last:?})")]
    NoProgress {
        what: &'static str,
        steps: usize,
        last: Op,
    },
}

/// How a node's engine is set up.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub node_id: String,
    pub data_dir: PathBuf,
    /// Bytes the node may provision in total.
    pub pool_size: u64,
    /// Staging and target paths must lie under one of these (kubelet's root dir).
    pub allowed_roots: Vec<PathBuf>,
}

pub struct Engine<H: Host> {
    pub(super) host: Arc<H>,
    pub(super) journal: Journal,
    pub(super) config: EngineConfig,
    busy: Mutex<HashSet<String>>,
    /// Held from the capacity check to the record that claims the space.
    pub(super) provisioning: Mutex<()>,
}

/// A volume or snapshot claimed by one call; released on drop.
pub struct Claim<'a> {
    busy: &'a Mutex<HashSet<String>>,
    key: String,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        lock(self.busy).remove(&self.key);
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Steps a node-side call may take before the engine gives up (attach, mkdir, format, mount
/// is four; a loop means the host does not do what the planner asked).
const MAX_STEPS: usize = 8;

impl<H: Host> Engine<H> {
    pub fn new(host: Arc<H>, config: EngineConfig) -> Engine<H> {
        let journal = Journal::new(Layout::new(&config.data_dir));
        Engine {
            host,
            journal,
            config,
            busy: Mutex::new(HashSet::new()),
            provisioning: Mutex::new(()),
        }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    pub fn layout(&self) -> &Layout {
        self.journal.layout()
    }

    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    pub fn host(&self) -> &H {
        &self.host
    }

    /// Claims `key` for this call, or answers `Aborted` when another call holds it.
    pub(super) fn claim(&self, key: &str) -> Result<Claim<'_>, PlanError> {
        if !lock(&self.busy).insert(key.to_string()) {
            return Err(PlanError::Aborted(format!(
                "an operation on {key} is already in progress"
            )));
        }
        Ok(Claim {
            busy: &self.busy,
            key: key.to_string(),
        })
    }

    /// The pool as it stands (configured size, free bytes of the data dir's filesystem).
    pub(super) fn pool(&self) -> Result<Pool, EngineError> {
        let stats = self.host.fs_stats(self.layout().root())?;
        Ok(Pool {
            size: self.config.pool_size,
            fs_available: stats.available_bytes,
        })
    }

    /// Bytes a new volume may take now.
    pub fn available(&self) -> Result<u64, EngineError> {
        let pool = self.pool()?;
        let volumes = self
            .journal
            .volumes()?
            .into_iter()
            .map(|r| {
                let info = self.host.file_info(&self.layout().volume_disk(&r.id))?;
                Ok((r, info))
            })
            .collect::<Result<Vec<_>, EngineError>>()?;
        let snapshots = self
            .journal
            .snapshots()?
            .into_iter()
            .map(|r| {
                let info = self.host.file_info(&self.layout().snapshot_disk(&r.id))?;
                Ok((r, info))
            })
            .collect::<Result<Vec<_>, EngineError>>()?;
        Ok(super::plan::available(pool, &volumes, &snapshots))
    }

    /// What the host shows for a volume's backing file and the path a call names.
    pub(super) fn observe(
        &self,
        disk: &Path,
        path: &Path,
        staging: Option<&Path>,
    ) -> Result<Seen, EngineError> {
        let backing = self.host.file_info(disk)?;
        let devices = self.host.loops_of(disk)?;
        if devices.len() > 1 {
            warn!(file = %disk.display(), devices = ?devices, "backing file attached more than once; using the first");
        }
        let device = devices.into_iter().next();
        let (content, fs_bytes, device_bytes) = match &device {
            Some(d) => {
                let probe = self.host.probe(d)?;
                (
                    Some(probe.content),
                    probe.fs_bytes,
                    Some(self.host.device_size(d)?),
                )
            }
            None => (None, None, None),
        };
        let mounts = self.host.mounts()?;
        let at = |p: &Path| mounts.iter().rev().find(|m| m.target == p).cloned();
        let device_users = match &device {
            Some(d) => mounts
                .iter()
                .filter(|m| mount_uses(m, d))
                .map(|m| m.target.clone())
                .collect(),
            None => Vec::new(),
        };
        Ok(Seen {
            backing,
            backing_path: disk.to_path_buf(),
            device,
            content,
            fs_bytes,
            device_bytes,
            path: self.host.path_kind(path)?,
            mount: at(path),
            staging_mount: staging.and_then(at),
            device_users,
        })
    }

    pub(super) fn exec(&self, op: &Op) -> Result<(), EngineError> {
        info!(?op, "host step");
        match op {
            Op::Attach { file } => self.host.attach(file).map(drop),
            Op::Detach { device } => self.host.detach(device),
            Op::Refresh { device } => self.host.refresh(device),
            Op::Format { device, fs } => self.host.format(device, *fs),
            Op::GrowOffline { device, fs } => self.host.grow_fs_offline(*fs, device),
            Op::MakeDir { path } => self.host.make_dir(path),
            Op::MakeFile { path } => self.host.make_file(path),
            Op::RemovePath { path } => self.host.remove_path(path),
            Op::RemoveFile { path } => self.host.remove_file(path),
            Op::Mount(spec) => self.host.mount(spec),
            Op::Unmount { target } => self.host.unmount(target),
        }
        .map_err(EngineError::from)
    }

    /// Observes, plans one step, does it, until the planner says done.
    pub(super) fn settle(
        &self,
        what: &'static str,
        disk: &Path,
        path: &Path,
        staging: Option<&Path>,
        mut next: impl FnMut(&Seen) -> Result<Step, PlanError>,
    ) -> Result<Seen, EngineError> {
        let mut last = None;
        for _ in 0..MAX_STEPS {
            let seen = self.observe(disk, path, staging)?;
            match next(&seen)? {
                Step::Done => return Ok(seen),
                Step::Do(op) => {
                    self.exec(&op)?;
                    last = Some(op);
                }
            }
        }
        Err(EngineError::NoProgress {
            what,
            steps: MAX_STEPS,
            last: last.unwrap_or(Op::MakeDir {
                path: path.to_path_buf(),
            }),
        })
    }

    /// Start-up recovery: a create or delete cut off by a crash is rolled back or finished (an
    /// inline volume's removal too: its mounts, device, staging dir, file), a directory a
    /// crash left without record is removed, and every volume the journal says is staged gets
    /// its loop device back if it lost it (a reboot, `losetup -D`). Nothing is formatted,
    /// unmounted or deleted that the journal does not say was being deleted.
    pub fn recover(&self) -> Result<RecoveryReport, EngineError> {
        let mut report = RecoveryReport::default();
        let root = self.layout().root();
        std::fs::create_dir_all(root).map_err(|e| JournalError::Io {
            path: root.to_path_buf(),
            source: e,
        })?;
        for (id, dir) in self.stray_dirs() {
            std::fs::remove_dir_all(&dir).map_err(|e| JournalError::Io { path: dir, source: e })?;
            report.strays_removed.push(id);
        }
        for rec in self.journal.volumes()? {
            let disk = self.layout().volume_disk(&rec.id);
            match rec.state {
                State::Creating => {
                    self.host.remove_file(&disk)?;
                    self.journal.remove_volume(&rec.id)?;
                    report.rolled_back.push(rec.id);
                }
                State::Deleting if rec.ephemeral => {
                    // NodeUnpublishVolume (or a failed publish's roll-back) was cut short:
                    // its targets and staging dir may still be mounted. A removal that cannot
                    // go on (a mount ferro-csi does not know uses the device) is left to the
                    // next call on the volume rather than keep ferro-csi from starting.
                    match self.remove_ephemeral(&rec) {
                        Ok(()) => report.deleted.push(rec.id),
                        Err(e) => {
                            warn!(volume = %rec.id, error = %e, "finishing the removal of an inline volume failed; the next call on it retries");
                        }
                    }
                }
                State::Deleting => {
                    for d in self.host.loops_of(&disk)? {
                        self.host.detach(&d)?;
                    }
                    self.host.remove_file(&disk)?;
                    self.journal.remove_volume(&rec.id)?;
                    report.deleted.push(rec.id);
                }
                State::Ready if rec.staged.is_some() => {
                    if self.host.file_info(&disk)?.is_none() {
                        warn!(volume = %rec.id, file = %disk.display(), "a staged volume's backing file is gone");
                        continue;
                    }
                    if self.host.loops_of(&disk)?.is_empty() {
                        let dev = self.host.attach(&disk)?;
                        info!(volume = %rec.id, device = %dev.display(), "re-attached a staged volume that lost its loop device");
                        report.reattached.push(rec.id);
                    }
                }
                State::Ready => {}
            }
        }
        for snap in self.journal.snapshots()? {
            if snap.state != State::Ready {
                self.host
                    .remove_file(&self.layout().snapshot_disk(&snap.id))?;
                self.journal.remove_snapshot(&snap.id)?;
                report.rolled_back.push(snap.id);
            }
        }
        Ok(report)
    }

    /// Object directories with no record: a create that crashed before its first record.
    fn stray_dirs(&self) -> Vec<(String, PathBuf)> {
        let mut out = Vec::new();
        for (dir, ours) in [
            (
                self.layout().volumes(),
                super::names::is_volume_id as fn(&str) -> bool,
            ),
            (self.layout().snapshots(), super::names::is_snapshot_id),
        ] {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if ours(&name) && !e.path().join("record.json").exists() {
                    out.push((name, e.path()));
                }
            }
        }
        out
    }
}

/// What start-up recovery did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    pub rolled_back: Vec<String>,
    pub deleted: Vec<String>,
    pub reattached: Vec<String>,
    pub strays_removed: Vec<String>,
}
