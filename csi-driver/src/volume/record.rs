//! The journal: one record per volume and per snapshot, written before anything is done on the
//! host and updated after each step that changes what the volume is. A record is replaced
//! atomically (written to a temporary file, synced, renamed over the old one, the directory
//! synced), so after a crash it holds either the state before a step or the state after it.
//! The record's `state` is the intent: `Creating` and `Deleting` say which operation was under
//! way, so start-up recovery knows whether to roll it back or finish it (see `engine`).

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::names::{is_snapshot_id, is_volume_id, Layout};

/// What a volume is being, or has become.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum State {
    /// CreateVolume is under way: the backing file may be missing or incomplete.
    Creating,
    /// The volume exists and can be staged.
    Ready,
    /// DeleteVolume is under way: the volume must not be staged again.
    Deleting,
}

/// Filesystems ferro-csi formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FsType {
    Ext4,
    Xfs,
}

impl FsType {
    pub fn as_str(self) -> &'static str {
        match self {
            FsType::Ext4 => "ext4",
            FsType::Xfs => "xfs",
        }
    }
}

/// Thin volumes are sparse files; thick ones have every block allocated at creation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Provisioning {
    #[default]
    Thin,
    Thick,
}

/// How the volume is consumed: as a raw block device or as a filesystem.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AccessKind {
    Block,
    Mount,
}

/// What a volume's content was made from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Source {
    Snapshot(String),
    Volume(String),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VolumeRecord {
    pub id: String,
    /// The CO's request name (idempotency key).
    pub name: String,
    /// Bytes; the backing file's size and so the device's.
    pub size: u64,
    pub provisioning: Provisioning,
    pub access: AccessKind,
    pub state: State,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<Source>,
    /// RFC 3339.
    pub created: String,
    /// Set once the volume was formatted: from then on a blank superblock means lost data, and
    /// the volume is never formatted again (the superblock is still what decides).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub formatted: Option<FsType>,
    /// The volume was made from a smaller source: its filesystem is grown to the device at
    /// the next stage.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub grow_pending: bool,
    /// The staging path while the volume is staged on this node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staged: Option<PathBuf>,
    /// Target paths it is published at.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub published: Vec<PathBuf>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub parameters: BTreeMap<String, String>,
    /// An inline volume (CSI's "Ephemeral" lifecycle): made by NodePublishVolume, staged by
    /// ferro-csi itself under its data dir, gone after NodeUnpublishVolume. Its `name` is the
    /// volume ID the CO chose. No Controller call sees it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ephemeral: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SnapshotRecord {
    pub id: String,
    pub name: String,
    pub source_volume_id: String,
    pub size: u64,
    /// Creating until the copy is complete, then Ready; Deleting while being removed.
    pub state: State,
    pub created: String,
}

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("journal {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("journal record {path} is corrupt: {source}")]
    Corrupt {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> JournalError + '_ {
    move |source| JournalError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The records under the data dir.
#[derive(Clone, Debug)]
pub struct Journal {
    layout: Layout,
}

const RECORD: &str = "record.json";

impl Journal {
    pub fn new(layout: Layout) -> Journal {
        Journal { layout }
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    pub fn volume(&self, id: &str) -> Result<Option<VolumeRecord>, JournalError> {
        read(&self.layout.volume_dir(id).join(RECORD))
    }

    pub fn put_volume(&self, rec: &VolumeRecord) -> Result<(), JournalError> {
        write(&self.layout.volume_dir(&rec.id), rec)
    }

    /// Removes the volume's directory (record and whatever else is left in it).
    pub fn remove_volume(&self, id: &str) -> Result<(), JournalError> {
        remove_dir(&self.layout.volume_dir(id))
    }

    pub fn volumes(&self) -> Result<Vec<VolumeRecord>, JournalError> {
        list(&self.layout.volumes(), is_volume_id)
    }

    pub fn snapshot(&self, id: &str) -> Result<Option<SnapshotRecord>, JournalError> {
        read(&self.layout.snapshot_dir(id).join(RECORD))
    }

    pub fn put_snapshot(&self, rec: &SnapshotRecord) -> Result<(), JournalError> {
        write(&self.layout.snapshot_dir(&rec.id), rec)
    }

    pub fn remove_snapshot(&self, id: &str) -> Result<(), JournalError> {
        remove_dir(&self.layout.snapshot_dir(id))
    }

    pub fn snapshots(&self) -> Result<Vec<SnapshotRecord>, JournalError> {
        list(&self.layout.snapshots(), is_snapshot_id)
    }
}

fn read<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<Option<T>, JournalError> {
    match fs::read(path) {
        Ok(bytes) => {
            serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|source| JournalError::Corrupt {
                    path: path.to_path_buf(),
                    source,
                })
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err(path)(e)),
    }
}

fn write<T: Serialize>(dir: &Path, rec: &T) -> Result<(), JournalError> {
    fs::create_dir_all(dir).map_err(io_err(dir))?;
    let path = dir.join(RECORD);
    let tmp = dir.join(".record.json.tmp");
    let bytes = serde_json::to_vec_pretty(rec).map_err(|source| JournalError::Corrupt {
        path: path.clone(),
        source,
    })?;
    {
        let mut f = fs::File::create(&tmp).map_err(io_err(&tmp))?;
        f.write_all(&bytes).map_err(io_err(&tmp))?;
        f.sync_all().map_err(io_err(&tmp))?;
    }
    fs::rename(&tmp, &path).map_err(io_err(&path))?;
    sync_dir(dir)?;
    if let Some(parent) = dir.parent() {
        sync_dir(parent)?;
    }
    Ok(())
}

fn sync_dir(dir: &Path) -> Result<(), JournalError> {
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))
}

fn remove_dir(dir: &Path) -> Result<(), JournalError> {
    match fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_err(dir)(e)),
    }
    match dir.parent() {
        Some(parent) => sync_dir(parent),
        None => Ok(()),
    }
}

fn list<T: for<'de> Deserialize<'de>>(
    dir: &Path,
    ours: fn(&str) -> bool,
) -> Result<Vec<T>, JournalError> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err(dir)(e)),
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io_err(dir))?;
        if let Some(name) = entry.file_name().to_str().filter(|n| ours(n)) {
            names.push(name.to_string());
        }
    }
    names.sort();
    let mut out = Vec::new();
    for name in names {
        // A directory without a record is the start of a create that crashed before its
        // record was written: recovery removes it, listing ignores it.
        if let Some(rec) = read(&dir.join(&name).join(RECORD))? {
            out.push(rec);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume::names::volume_id;

    fn record(name: &str) -> VolumeRecord {
        VolumeRecord {
            id: volume_id(name),
            name: name.into(),
            size: 1 << 20,
            provisioning: Provisioning::Thin,
            access: AccessKind::Mount,
            state: State::Creating,
            source: None,
            created: "2026-11-26T00:00:00Z".into(),
            formatted: None,
            grow_pending: false,
            staged: None,
            published: Vec::new(),
            parameters: BTreeMap::new(),
            ephemeral: false,
        }
    }

    #[test]
    fn records_round_trip_and_list_in_id_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let j = Journal::new(Layout::new(dir.path()));
        assert!(j.volumes().expect("list").is_empty());
        let mut a = record("a");
        j.put_volume(&a).expect("put");
        j.put_volume(&record("b")).expect("put");
        a.state = State::Ready;
        a.formatted = Some(FsType::Xfs);
        j.put_volume(&a).expect("replace");
        assert_eq!(j.volume(&a.id).expect("read"), Some(a.clone()));
        let text = std::fs::read_to_string(j.layout().volume_dir(&a.id).join(RECORD)).expect("read");
        assert!(!text.contains("ephemeral"), "a persistent record is written as before: {text}");
        let mut e = record("inline");
        e.ephemeral = true;
        j.put_volume(&e).expect("put");
        assert_eq!(j.volume(&e.id).expect("read"), Some(e.clone()));
        j.remove_volume(&e.id).expect("remove");
        let ids: Vec<String> = j
            .volumes()
            .expect("list")
            .into_iter()
            .map(|r| r.id)
            .collect();
        let mut want = vec![a.id.clone(), volume_id("b")];
        want.sort();
        assert_eq!(ids, want);
        j.remove_volume(&a.id).expect("remove");
        j.remove_volume(&a.id).expect("removing twice is fine");
        assert_eq!(j.volume(&a.id).expect("read"), None);
    }

    #[test]
    fn a_directory_without_record_and_foreign_names_are_not_listed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let layout = Layout::new(dir.path());
        std::fs::create_dir_all(layout.volume_dir(&volume_id("half"))).expect("mkdir");
        std::fs::create_dir_all(layout.volumes().join("lost+found")).expect("mkdir");
        assert!(Journal::new(layout).volumes().expect("list").is_empty());
    }

    #[test]
    fn a_corrupt_record_is_an_error_naming_its_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let layout = Layout::new(dir.path());
        let id = volume_id("c");
        std::fs::create_dir_all(layout.volume_dir(&id)).expect("mkdir");
        std::fs::write(layout.volume_dir(&id).join(RECORD), b"{\"id\":").expect("write");
        let err = Journal::new(layout).volume(&id).expect_err("corrupt");
        assert!(err.to_string().contains("record.json"), "{err}");
    }
}
