//! The real host: syscalls for files, mounts and statvfs, sysfs for loop devices, and the
//! standard tools where they do a job better than a reimplementation would: `losetup`
//! (LOOP_CONFIGURE, free-device races handled), `mkfs.ext4`/`mkfs.xfs`, `resize2fs`/
//! `xfs_growfs`, `fsfreeze` and `cp --reflink=auto --sparse=always`.

use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use nix::mount::{umount2, MntFlags, MsFlags};

use super::host::{
    classify, fs_bytes, parse_mountinfo, Content, FileInfo, FsStats, Host, HostError, MountEntry,
    MountSpec, PathKind, Probe, PROBE_BYTES,
};
use super::record::FsType;

/// Host paths the real host reads, passed in so tests can point them elsewhere.
#[derive(Clone, Debug)]
pub struct RealHost {
    pub mountinfo: PathBuf,
    pub sys_block: PathBuf,
}

impl Default for RealHost {
    fn default() -> RealHost {
        RealHost {
            mountinfo: "/proc/self/mountinfo".into(),
            sys_block: "/sys/block".into(),
        }
    }
}

fn run(program: &str, args: &[&str]) -> Result<String, HostError> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| HostError::io("running", Path::new(program), e))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(HostError::Command {
            command: format!("{program} {}", args.join(" ")),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap_or_default()
}

/// Splits CSI mount flags into mount(2) flags and the filesystem's data string.
pub fn split_mount_flags(flags: &[String]) -> (MsFlags, String) {
    let mut ms = MsFlags::empty();
    let mut data = Vec::new();
    for flag in flags
        .iter()
        .flat_map(|f| f.split(','))
        .filter(|f| !f.is_empty())
    {
        match flag {
            "ro" => ms |= MsFlags::MS_RDONLY,
            "rw" => ms &= !MsFlags::MS_RDONLY,
            "nosuid" => ms |= MsFlags::MS_NOSUID,
            "nodev" => ms |= MsFlags::MS_NODEV,
            "noexec" => ms |= MsFlags::MS_NOEXEC,
            "sync" => ms |= MsFlags::MS_SYNCHRONOUS,
            "dirsync" => ms |= MsFlags::MS_DIRSYNC,
            "noatime" => ms |= MsFlags::MS_NOATIME,
            "nodiratime" => ms |= MsFlags::MS_NODIRATIME,
            "relatime" => ms |= MsFlags::MS_RELATIME,
            "strictatime" => ms |= MsFlags::MS_STRICTATIME,
            "lazytime" => ms |= MsFlags::MS_LAZYTIME,
            "suid" | "dev" | "exec" | "async" | "atime" | "defaults" => {}
            other => data.push(other.to_string()),
        }
    }
    (ms, data.join(","))
}

impl RealHost {
    fn loop_backing(&self, name: &str) -> Option<PathBuf> {
        let raw = fs::read_to_string(self.sys_block.join(name).join("loop/backing_file")).ok()?;
        let raw = raw.trim_end_matches('\n');
        Some(PathBuf::from(raw.strip_suffix(" (deleted)").unwrap_or(raw)))
    }
}

impl Host for RealHost {
    fn file_info(&self, path: &Path) -> Result<Option<FileInfo>, HostError> {
        match fs::metadata(path) {
            Ok(m) => Ok(Some(FileInfo {
                size: m.len(),
                allocated: m.blocks() * 512,
            })),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(HostError::io("stat", path, e)),
        }
    }

    fn create_file(&self, path: &Path, size: u64, thick: bool) -> Result<(), HostError> {
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).map_err(|e| HostError::io("creating", dir, e))?;
        }
        let f = fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(false)
            .open(path)
            .map_err(|e| HostError::io("creating", path, e))?;
        f.set_len(size)
            .map_err(|e| HostError::io("sizing", path, e))?;
        if thick {
            allocate(&f, path, size)?;
        }
        f.sync_all().map_err(|e| HostError::io("syncing", path, e))
    }

    fn grow_file(&self, path: &Path, size: u64, thick: bool) -> Result<(), HostError> {
        let f = fs::OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(|e| HostError::io("opening", path, e))?;
        let len = f
            .metadata()
            .map_err(|e| HostError::io("stat", path, e))?
            .len();
        if size > len {
            if thick {
                allocate(&f, path, size)?;
            }
            f.set_len(size)
                .map_err(|e| HostError::io("growing", path, e))?;
        }
        f.sync_all().map_err(|e| HostError::io("syncing", path, e))
    }

    fn copy_file(&self, from: &Path, to: &Path) -> Result<(), HostError> {
        if let Some(dir) = to.parent() {
            fs::create_dir_all(dir).map_err(|e| HostError::io("creating", dir, e))?;
        }
        run("cp", &["--reflink=auto", "--sparse=always", s(from), s(to)])?;
        fs::File::open(to)
            .and_then(|f| f.sync_all())
            .map_err(|e| HostError::io("syncing", to, e))
    }

    fn remove_file(&self, path: &Path) -> Result<(), HostError> {
        match fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                Err(HostError::io("removing", path, e))
            }
            _ => Ok(()),
        }
    }

    fn loops_of(&self, file: &Path) -> Result<Vec<PathBuf>, HostError> {
        let want = fs::canonicalize(file).unwrap_or_else(|_| file.to_path_buf());
        let entries = fs::read_dir(&self.sys_block)
            .map_err(|e| HostError::io("listing", &self.sys_block, e))?;
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            // A device with autoclear set is being detached (losetup -d while something still
            // had it open): it no longer counts as the file's device.
            let clearing = fs::read_to_string(self.sys_block.join(&name).join("loop/autoclear"))
                .is_ok_and(|v| v.trim() == "1");
            if name.starts_with("loop")
                && !clearing
                && self.loop_backing(&name).as_deref() == Some(want.as_path())
            {
                out.push(PathBuf::from("/dev").join(&name));
            }
        }
        out.sort();
        Ok(out)
    }

    fn attach(&self, file: &Path) -> Result<PathBuf, HostError> {
        // Direct I/O keeps the backing file's pages out of the page cache a second time; a
        // backing filesystem that cannot do it (tmpfs) gets buffered I/O.
        let dev = run("losetup", &["--find", "--show", "--direct-io=on", s(file)])
            .or_else(|_| run("losetup", &["--find", "--show", s(file)]))?;
        Ok(PathBuf::from(dev))
    }

    fn detach(&self, device: &Path) -> Result<(), HostError> {
        run("losetup", &["--detach", s(device)]).map(drop)
    }

    fn refresh(&self, device: &Path) -> Result<(), HostError> {
        run("losetup", &["--set-capacity", s(device)]).map(drop)
    }

    fn device_size(&self, device: &Path) -> Result<u64, HostError> {
        let name = device
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let path = self.sys_block.join(name).join("size");
        let text = fs::read_to_string(&path).map_err(|e| HostError::io("reading", &path, e))?;
        text.trim()
            .parse::<u64>()
            .map(|sectors| sectors * 512)
            .map_err(|e| HostError::Unexpected(format!("{}: {e}", path.display())))
    }

    fn probe(&self, device: &Path) -> Result<Probe, HostError> {
        let mut f = fs::File::open(device).map_err(|e| HostError::io("opening", device, e))?;
        let mut head = Vec::with_capacity(PROBE_BYTES);
        (&mut f)
            .take(PROBE_BYTES as u64)
            .read_to_end(&mut head)
            .map_err(|e| HostError::io("reading", device, e))?;
        let content = classify(&head);
        let fs_bytes = match content {
            Content::Fs(fs) => fs_bytes(&head, fs),
            _ => None,
        };
        Ok(Probe { content, fs_bytes })
    }

    fn format(&self, device: &Path, fs: FsType) -> Result<(), HostError> {
        match fs {
            FsType::Ext4 => run(
                "mkfs.ext4",
                &[
                    "-q",
                    "-F",
                    "-m",
                    "0",
                    "-E",
                    "lazy_itable_init=1,lazy_journal_init=1,nodiscard",
                    s(device),
                ],
            ),
            // No -f: mkfs.xfs itself refuses a device with a signature on it.
            FsType::Xfs => run("mkfs.xfs", &["-q", "-K", s(device)]),
        }
        .map(drop)
    }

    fn mounts(&self) -> Result<Vec<MountEntry>, HostError> {
        let text = fs::read_to_string(&self.mountinfo)
            .map_err(|e| HostError::io("reading", &self.mountinfo, e))?;
        Ok(parse_mountinfo(&text))
    }

    fn mount(&self, spec: &MountSpec) -> Result<(), HostError> {
        match spec {
            MountSpec::Fs {
                device,
                target,
                fs,
                flags,
            } => {
                let (ms, data) = split_mount_flags(flags);
                let data = (!data.is_empty()).then_some(data.as_str());
                nix::mount::mount(
                    Some(device.as_path()),
                    target.as_path(),
                    Some(fs.as_str()),
                    ms,
                    data,
                )
                .map_err(|e| HostError::io("mounting on", target, e.into()))
            }
            MountSpec::Bind {
                source,
                target,
                readonly,
            } => {
                nix::mount::mount(
                    Some(source.as_path()),
                    target.as_path(),
                    None::<&str>,
                    MsFlags::MS_BIND,
                    None::<&str>,
                )
                .map_err(|e| HostError::io("bind-mounting on", target, e.into()))?;
                if *readonly {
                    let ro = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY;
                    if let Err(e) = nix::mount::mount(
                        None::<&str>,
                        target.as_path(),
                        None::<&str>,
                        ro,
                        None::<&str>,
                    ) {
                        // Leave no writable bind behind a read-only request.
                        if let Err(undo) = umount2(target.as_path(), MntFlags::empty()) {
                            tracing::error!(target = %target.display(), error = %undo, "undoing a bind mount whose read-only remount failed");
                        }
                        return Err(HostError::io("remounting read-only", target, e.into()));
                    }
                }
                Ok(())
            }
        }
    }

    fn unmount(&self, target: &Path) -> Result<(), HostError> {
        umount2(target, MntFlags::empty())
            .map_err(|e| HostError::io("unmounting", target, e.into()))
    }

    fn grow_fs_offline(&self, fs: FsType, device: &Path) -> Result<(), HostError> {
        match fs {
            FsType::Ext4 => {
                // e2fsck -p: 0 clean, 1 errors fixed; anything else is left for a human.
                let out = Command::new("e2fsck")
                    .args(["-f", "-p", s(device)])
                    .output()
                    .map_err(|e| HostError::io("running", Path::new("e2fsck"), e))?;
                if !matches!(out.status.code(), Some(0 | 1)) {
                    return Err(HostError::Command {
                        command: format!("e2fsck -f -p {}", device.display()),
                        status: out.status.to_string(),
                        stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
                    });
                }
                run("resize2fs", &[s(device)]).map(drop)
            }
            FsType::Xfs => Err(HostError::Unexpected("XFS grows only while mounted".into())),
        }
    }

    fn grow_fs(&self, fs: FsType, device: &Path, mountpoint: &Path) -> Result<(), HostError> {
        match fs {
            FsType::Ext4 => {
                if !has_capability(CAP_SYS_RESOURCE) {
                    return Err(HostError::MissingCapability(format!(
                        "growing the mounted ext4 filesystem on {} needs CAP_SYS_RESOURCE, which ferro-csi does not have: grant it (the unit does), or unstage and stage the volume to grow it offline",
                        device.display()
                    )));
                }
                run("resize2fs", &[s(device)])
            }
            FsType::Xfs => run("xfs_growfs", &["-d", s(mountpoint)]),
        }
        .map(drop)
    }

    fn freeze(&self, mountpoint: &Path, frozen: bool) -> Result<(), HostError> {
        run(
            "fsfreeze",
            &[
                if frozen { "--freeze" } else { "--unfreeze" },
                s(mountpoint),
            ],
        )
        .map(drop)
    }

    fn fs_stats(&self, path: &Path) -> Result<FsStats, HostError> {
        let v = nix::sys::statvfs::statvfs(path)
            .map_err(|e| HostError::io("statvfs", path, e.into()))?;
        let frag = v.fragment_size() as u64;
        let total = v.blocks() as u64 * frag;
        let avail = v.blocks_available() as u64 * frag;
        let free = v.blocks_free() as u64 * frag;
        Ok(FsStats {
            total_bytes: total,
            available_bytes: avail,
            used_bytes: total.saturating_sub(free),
            total_inodes: v.files() as u64,
            free_inodes: v.files_free() as u64,
            used_inodes: (v.files() as u64).saturating_sub(v.files_free() as u64),
        })
    }

    fn path_kind(&self, path: &Path) -> Result<Option<PathKind>, HostError> {
        match fs::symlink_metadata(path) {
            Ok(m) if m.is_dir() => Ok(Some(PathKind::Dir)),
            Ok(m) if m.is_file() => Ok(Some(PathKind::File)),
            Ok(_) => Ok(Some(PathKind::Other)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(HostError::io("stat", path, e)),
        }
    }

    fn make_dir(&self, path: &Path) -> Result<(), HostError> {
        fs::create_dir_all(path).map_err(|e| HostError::io("creating", path, e))
    }

    fn make_file(&self, path: &Path) -> Result<(), HostError> {
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).map_err(|e| HostError::io("creating", dir, e))?;
        }
        fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map(drop)
            .map_err(|e| HostError::io("creating", path, e))
    }

    fn remove_path(&self, path: &Path) -> Result<(), HostError> {
        let r = match fs::symlink_metadata(path) {
            Ok(m) if m.is_dir() => fs::remove_dir(path),
            Ok(_) => fs::remove_file(path),
            Err(e) => Err(e),
        };
        match r {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                Err(HostError::io("removing", path, e))
            }
            _ => Ok(()),
        }
    }
}

const CAP_SYS_RESOURCE: u32 = 24;

/// Whether this process has `cap` in its effective set (/proc/self/status CapEff).
fn has_capability(cap: u32) -> bool {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    cap_in_status(&status, cap)
}

pub fn cap_in_status(status: &str, cap: u32) -> bool {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|mask| mask & (1u64 << cap) != 0)
}

fn allocate(f: &fs::File, path: &Path, size: u64) -> Result<(), HostError> {
    nix::fcntl::fallocate(f, nix::fcntl::FallocateFlags::empty(), 0, size as i64)
        .map_err(|e| HostError::io("allocating", path, e.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_read_from_proc_status() {
        let status = "Name:\tx\nCapEff:\t000001fffeffffff\n";
        assert!(!cap_in_status(status, CAP_SYS_RESOURCE));
        assert!(cap_in_status(status, 21), "CAP_SYS_ADMIN");
        assert!(cap_in_status(
            "CapEff:\t000001ffffffffff\n",
            CAP_SYS_RESOURCE
        ));
        assert!(!cap_in_status("", 0));
    }

    #[test]
    fn mount_flags_split_into_syscall_flags_and_data() {
        let (ms, data) = split_mount_flags(&[
            "noatime,nodev".into(),
            "discard".into(),
            "ro".into(),
            "".into(),
        ]);
        assert_eq!(
            ms,
            MsFlags::MS_NOATIME | MsFlags::MS_NODEV | MsFlags::MS_RDONLY
        );
        assert_eq!(data, "discard");
        let (ms, data) = split_mount_flags(&["ro".into(), "rw".into(), "defaults".into()]);
        assert_eq!((ms, data.as_str()), (MsFlags::empty(), ""));
    }
}
