//! A scratch directory for storage tests: loop devices and mounts made under it are removed
//! with it, also when the test fails (on drop: mounts under it unmounted deepest first, loop
//! devices whose backing file lies under it detached, then the directory removed).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

pub struct Scratch {
    dir: tempfile::TempDir,
}

impl Scratch {
    /// A fresh directory under /var/tmp (a disk-backed filesystem: loop devices get direct
    /// I/O there, unlike on a tmpfs /tmp).
    pub fn new(prefix: &str) -> Result<Scratch> {
        crate::require_root()?;
        crate::require_bin("losetup", "util-linux")?;
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir_in("/var/tmp")
            .context("creating a scratch dir under /var/tmp")?;
        Ok(Scratch { dir })
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Mount points under the scratch dir, deepest first.
    pub fn mounts(&self) -> Vec<PathBuf> {
        let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut out: Vec<PathBuf> = text
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .map(|t| PathBuf::from(t.replace("\\040", " ")))
            .filter(|t| t.starts_with(self.path()))
            .collect();
        out.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        out
    }

    /// Loop devices whose backing file lies under the scratch dir.
    pub fn loops(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        let Ok(entries) = std::fs::read_dir("/sys/block") else {
            return out;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.starts_with("loop") {
                continue;
            }
            let Ok(backing) = std::fs::read_to_string(e.path().join("loop/backing_file")) else {
                continue;
            };
            if Path::new(backing.trim_end().trim_end_matches(" (deleted)")).starts_with(self.path())
            {
                out.push(PathBuf::from("/dev").join(name));
            }
        }
        out.sort();
        out
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        for m in self.mounts() {
            if let Err(e) = nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH) {
                eprintln!("scratch clean-up: unmounting {}: {e}", m.display());
            }
        }
        for d in self.loops() {
            match Command::new("losetup").arg("--detach").arg(&d).output() {
                Ok(o) if o.status.success() => {}
                Ok(o) => eprintln!(
                    "scratch clean-up: losetup -d {}: {}",
                    d.display(),
                    String::from_utf8_lossy(&o.stderr)
                ),
                Err(e) => eprintln!("scratch clean-up: losetup -d {}: {e}", d.display()),
            }
        }
    }
}
