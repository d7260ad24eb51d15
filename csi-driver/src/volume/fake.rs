//! A recording fake of the host: files, loop devices, superblocks and mounts kept in memory
//! with the semantics the engine relies on, every call recorded, and failures injectable at a
//! named operation (the crash points of the journal's recovery tests).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use super::host::{
    Content, FileInfo, FsStats, Host, HostError, MountEntry, MountSpec, PathKind, Probe,
};
use super::record::FsType;

#[derive(Debug)]
struct FakeFile {
    info: FileInfo,
    content: Content,
    /// The filesystem's size as its superblock would say.
    fs_bytes: Option<u64>,
}

#[derive(Debug, Default)]
struct State {
    files: BTreeMap<PathBuf, FakeFile>,
    dirs: BTreeMap<PathBuf, ()>,
    /// device -> backing file
    loops: BTreeMap<PathBuf, PathBuf>,
    /// device -> size the device shows
    loop_sizes: BTreeMap<PathBuf, u64>,
    next_loop: u32,
    mounts: Vec<MountEntry>,
    frozen: Vec<PathBuf>,
    calls: Vec<String>,
    fail_at: Option<String>,
    fs_available: u64,
}

/// The fake. `fs_available` is what statvfs of any path reports free.
#[derive(Debug)]
pub struct RecordingHost {
    state: Mutex<State>,
}

impl RecordingHost {
    pub fn new(fs_available: u64) -> RecordingHost {
        RecordingHost {
            state: Mutex::new(State {
                fs_available,
                ..State::default()
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every call so far, as `"op arg"` lines.
    pub fn calls(&self) -> Vec<String> {
        self.lock().calls.clone()
    }

    pub fn clear_calls(&self) {
        self.lock().calls.clear();
    }

    /// Makes the next call of `op` (as recorded: "attach", "format", ...) fail.
    pub fn fail_next(&self, op: &str) {
        self.lock().fail_at = Some(op.to_string());
    }

    pub fn files(&self) -> Vec<PathBuf> {
        self.lock().files.keys().cloned().collect()
    }

    pub fn loops(&self) -> Vec<(PathBuf, PathBuf)> {
        self.lock()
            .loops
            .iter()
            .map(|(d, f)| (d.clone(), f.clone()))
            .collect()
    }

    pub fn mount_points(&self) -> Vec<PathBuf> {
        self.lock()
            .mounts
            .iter()
            .map(|m| m.target.clone())
            .collect()
    }

    /// Directories made through the host (staging and target dirs).
    pub fn dirs(&self) -> Vec<PathBuf> {
        self.lock().dirs.keys().cloned().collect()
    }

    pub fn frozen(&self) -> Vec<PathBuf> {
        self.lock().frozen.clone()
    }

    /// Detaches every loop device behind the engine's back (`losetup -D`, a reboot).
    pub fn lose_loops(&self) {
        let mut st = self.lock();
        st.loops.clear();
        st.loop_sizes.clear();
    }

    /// Overwrites a backing file's first blocks (a test's stand-in for data written to it).
    pub fn set_content(&self, file: &Path, content: Content) {
        if let Some(f) = self.lock().files.get_mut(file) {
            if !matches!(content, Content::Fs(_)) {
                f.fs_bytes = None;
            }
            f.content = content;
        }
    }

    pub fn content(&self, file: &Path) -> Option<Content> {
        self.lock().files.get(file).map(|f| f.content.clone())
    }

    fn call(
        &self,
        op: &str,
        arg: impl std::fmt::Display,
    ) -> Result<MutexGuard<'_, State>, HostError> {
        let mut st = self.lock();
        st.calls.push(format!("{op} {arg}"));
        if st.fail_at.as_deref() == Some(op) {
            st.fail_at = None;
            return Err(HostError::Unexpected(format!("injected failure at {op}")));
        }
        Ok(st)
    }
}

fn grow_to_device(st: &mut State, device: &Path) -> Result<(), HostError> {
    let file = device_file(st, device)?;
    let size = st.loop_sizes.get(device).copied();
    if let Some(f) = st.files.get_mut(&file) {
        f.fs_bytes = size;
    }
    Ok(())
}

fn device_file(st: &State, device: &Path) -> Result<PathBuf, HostError> {
    st.loops
        .get(device)
        .cloned()
        .ok_or_else(|| HostError::Unexpected(format!("{} is not attached", device.display())))
}

impl Host for RecordingHost {
    fn file_info(&self, path: &Path) -> Result<Option<FileInfo>, HostError> {
        Ok(self.lock().files.get(path).map(|f| f.info))
    }

    fn create_file(&self, path: &Path, size: u64, thick: bool) -> Result<(), HostError> {
        let mut st = self.call("create_file", path.display())?;
        let f = st.files.entry(path.to_path_buf()).or_insert(FakeFile {
            info: FileInfo {
                size: 0,
                allocated: 0,
            },
            content: Content::Blank,
            fs_bytes: None,
        });
        f.info.size = size;
        if thick {
            f.info.allocated = size;
        }
        Ok(())
    }

    fn grow_file(&self, path: &Path, size: u64, thick: bool) -> Result<(), HostError> {
        let mut st = self.call("grow_file", format!("{} {size}", path.display()))?;
        let f = st
            .files
            .get_mut(path)
            .ok_or_else(|| HostError::Unexpected(format!("{} missing", path.display())))?;
        f.info.size = f.info.size.max(size);
        if thick {
            f.info.allocated = f.info.size;
        }
        Ok(())
    }

    fn copy_file(&self, from: &Path, to: &Path) -> Result<(), HostError> {
        let mut st = self.call("copy_file", format!("{} {}", from.display(), to.display()))?;
        let src = st
            .files
            .get(from)
            .ok_or_else(|| HostError::Unexpected(format!("{} missing", from.display())))?;
        let copy = FakeFile {
            info: src.info,
            content: src.content.clone(),
            fs_bytes: src.fs_bytes,
        };
        st.files.insert(to.to_path_buf(), copy);
        Ok(())
    }

    fn remove_file(&self, path: &Path) -> Result<(), HostError> {
        let mut st = self.call("remove_file", path.display())?;
        st.files.remove(path);
        Ok(())
    }

    fn loops_of(&self, file: &Path) -> Result<Vec<PathBuf>, HostError> {
        Ok(self
            .lock()
            .loops
            .iter()
            .filter(|(_, f)| f.as_path() == file)
            .map(|(d, _)| d.clone())
            .collect())
    }

    fn attach(&self, file: &Path) -> Result<PathBuf, HostError> {
        let mut st = self.call("attach", file.display())?;
        let size = st
            .files
            .get(file)
            .map(|f| f.info.size)
            .ok_or_else(|| HostError::Unexpected(format!("{} missing", file.display())))?;
        let dev = PathBuf::from(format!("/dev/loop{}", st.next_loop));
        st.next_loop += 1;
        st.loops.insert(dev.clone(), file.to_path_buf());
        st.loop_sizes.insert(dev.clone(), size);
        Ok(dev)
    }

    fn detach(&self, device: &Path) -> Result<(), HostError> {
        let mut st = self.call("detach", device.display())?;
        // The kernel keeps a mounted loop device (LOOP_CLR_FD only sets autoclear): a detach
        // under a mount would leave it attached, so the fake refuses it outright.
        if st.mounts.iter().any(|m| m.source == device.to_string_lossy()) {
            return Err(HostError::Unexpected(format!(
                "{} is mounted: not detached",
                device.display()
            )));
        }
        st.loops.remove(device);
        st.loop_sizes.remove(device);
        Ok(())
    }

    fn refresh(&self, device: &Path) -> Result<(), HostError> {
        let mut st = self.call("refresh", device.display())?;
        let file = device_file(&st, device)?;
        let size = st.files.get(&file).map(|f| f.info.size).unwrap_or(0);
        st.loop_sizes.insert(device.to_path_buf(), size);
        Ok(())
    }

    fn device_size(&self, device: &Path) -> Result<u64, HostError> {
        let st = self.lock();
        st.loop_sizes
            .get(device)
            .copied()
            .ok_or_else(|| HostError::Unexpected(format!("{} is not attached", device.display())))
    }

    fn probe(&self, device: &Path) -> Result<Probe, HostError> {
        let st = self.lock();
        let file = device_file(&st, device)?;
        Ok(st
            .files
            .get(&file)
            .map(|f| Probe {
                content: f.content.clone(),
                fs_bytes: f.fs_bytes,
            })
            .unwrap_or(Probe {
                content: Content::Unknown,
                fs_bytes: None,
            }))
    }

    fn format(&self, device: &Path, fs: FsType) -> Result<(), HostError> {
        let mut st = self.call("format", format!("{} {}", device.display(), fs.as_str()))?;
        let file = device_file(&st, device)?;
        let size = st.loop_sizes.get(device).copied();
        if let Some(f) = st.files.get_mut(&file) {
            f.content = Content::Fs(fs);
            f.fs_bytes = size;
        }
        Ok(())
    }

    fn mounts(&self) -> Result<Vec<MountEntry>, HostError> {
        Ok(self.lock().mounts.clone())
    }

    fn mount(&self, spec: &MountSpec) -> Result<(), HostError> {
        let (arg, entry) = match spec {
            MountSpec::Fs {
                device,
                target,
                fs,
                flags,
            } => {
                let n = device
                    .to_string_lossy()
                    .trim_start_matches("/dev/loop")
                    .to_string();
                let ro = flags.iter().flat_map(|f| f.split(',')).any(|f| f == "ro");
                let entry = MountEntry {
                    major_minor: format!("7:{n}"),
                    root: "/".into(),
                    target: target.clone(),
                    options: if ro { "ro".into() } else { "rw".into() },
                    fstype: fs.as_str().into(),
                    source: device.to_string_lossy().into_owned(),
                };
                (
                    format!("{} {} {}", device.display(), target.display(), fs.as_str()),
                    entry,
                )
            }
            MountSpec::Bind {
                source,
                target,
                readonly,
            } => {
                let st = self.lock();
                let options = if *readonly {
                    "ro".to_string()
                } else {
                    "rw".to_string()
                };
                let entry = match st.mounts.iter().find(|m| &m.target == source) {
                    Some(m) => MountEntry {
                        target: target.clone(),
                        options,
                        ..m.clone()
                    },
                    None => MountEntry {
                        major_minor: "0:5".into(),
                        root: format!(
                            "/{}",
                            source
                                .file_name()
                                .map(|n| n.to_string_lossy())
                                .unwrap_or_default()
                        ),
                        target: target.clone(),
                        options,
                        fstype: "devtmpfs".into(),
                        source: "udev".into(),
                    },
                };
                (
                    format!(
                        "bind {} {} ro={readonly}",
                        source.display(),
                        target.display()
                    ),
                    entry,
                )
            }
        };
        let mut st = self.call("mount", arg)?;
        st.mounts.push(entry);
        Ok(())
    }

    fn unmount(&self, target: &Path) -> Result<(), HostError> {
        let mut st = self.call("unmount", target.display())?;
        let at = st
            .mounts
            .iter()
            .rposition(|m| m.target == target)
            .ok_or_else(|| HostError::Unexpected(format!("{} is not mounted", target.display())))?;
        st.mounts.remove(at);
        Ok(())
    }

    fn grow_fs_offline(&self, fs: FsType, device: &Path) -> Result<(), HostError> {
        let mut st = self.call(
            "grow_fs_offline",
            format!("{} {}", fs.as_str(), device.display()),
        )?;
        grow_to_device(&mut st, device)
    }

    fn grow_fs(&self, fs: FsType, device: &Path, mountpoint: &Path) -> Result<(), HostError> {
        let mut st = self.call(
            "grow_fs",
            format!(
                "{} {} {}",
                fs.as_str(),
                device.display(),
                mountpoint.display()
            ),
        )?;
        grow_to_device(&mut st, device)
    }

    fn freeze(&self, mountpoint: &Path, frozen: bool) -> Result<(), HostError> {
        let mut st = self.call(if frozen { "freeze" } else { "thaw" }, mountpoint.display())?;
        if frozen {
            st.frozen.push(mountpoint.to_path_buf());
        } else {
            st.frozen.retain(|m| m != mountpoint);
        }
        Ok(())
    }

    fn fs_stats(&self, _path: &Path) -> Result<FsStats, HostError> {
        let st = self.lock();
        Ok(FsStats {
            total_bytes: st.fs_available,
            available_bytes: st.fs_available,
            ..FsStats::default()
        })
    }

    fn path_kind(&self, path: &Path) -> Result<Option<PathKind>, HostError> {
        let st = self.lock();
        Ok(if st.dirs.contains_key(path) {
            Some(PathKind::Dir)
        } else if st.files.contains_key(path) {
            Some(PathKind::File)
        } else {
            None
        })
    }

    fn make_dir(&self, path: &Path) -> Result<(), HostError> {
        let mut st = self.call("make_dir", path.display())?;
        st.dirs.insert(path.to_path_buf(), ());
        Ok(())
    }

    fn make_file(&self, path: &Path) -> Result<(), HostError> {
        let mut st = self.call("make_file", path.display())?;
        st.files.entry(path.to_path_buf()).or_insert(FakeFile {
            info: FileInfo {
                size: 0,
                allocated: 0,
            },
            content: Content::Blank,
            fs_bytes: None,
        });
        Ok(())
    }

    fn remove_path(&self, path: &Path) -> Result<(), HostError> {
        let mut st = self.call("remove_path", path.display())?;
        if st.mounts.iter().any(|m| m.target == path) {
            return Err(HostError::Unexpected(format!(
                "{} is a mount point (EBUSY)",
                path.display()
            )));
        }
        st.dirs.remove(path);
        st.files.remove(path);
        Ok(())
    }
}
