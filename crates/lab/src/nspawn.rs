//! A real systemd as PID 1 for the units' tests: a minimal Debian root (mmdebstrap from the
//! mirror apt uses), built once and cached under /var/cache/ferro/nspawn-root-<hash of what it
//! holds>, copied fresh for every run and booted with `systemd-nspawn -b --private-network`
//! (its own network namespace: nothing of the machine's network is touched). [`Machine`]
//! powers the container off, kills what is left and deletes the copy on drop, also when the
//! test fails.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::{require_bin, require_root, run};

/// The root's packages beyond minbase: systemd as init, the tools the units run (iptables,
/// nft, ip) and containerd with runc for the agent.
pub const PACKAGES: &[&str] = &[
    "systemd",
    "systemd-sysv",
    "dbus",
    "iproute2",
    "iptables",
    "nftables",
    "procps",
    "util-linux",
    "e2fsprogs",
    "containerd",
    "runc",
];
pub const SUITE: &str = "bookworm";
const CACHE: &str = "/var/cache/ferro";

/// FNV-1a: a cache key that stays the same across Rust versions.
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// The first Debian mirror of the host's apt sources (deb822 `URIs:` or a one-line `deb`).
pub fn apt_mirror() -> String {
    let from_deb822 = std::fs::read_to_string("/etc/apt/sources.list.d/debian.sources").ok().and_then(|s| {
        s.lines()
            .filter_map(|l| l.trim().strip_prefix("URIs:"))
            .flat_map(str::split_whitespace)
            .find(|u| !u.contains("security"))
            .map(str::to_string)
    });
    let from_list = || {
        std::fs::read_to_string("/etc/apt/sources.list").ok().and_then(|s| {
            s.lines()
                .filter_map(|l| l.trim().strip_prefix("deb "))
                .flat_map(str::split_whitespace)
                .find(|w| w.starts_with("http") && !w.contains("security"))
                .map(str::to_string)
        })
    };
    from_deb822.or_else(from_list).unwrap_or_else(|| "http://deb.debian.org/debian".into())
}

/// The cached root (built when missing): `/var/cache/ferro/nspawn-root-<hash>`, made in a
/// temp dir beside it and renamed into place whole.
pub fn cached_root() -> Result<PathBuf> {
    require_root()?;
    require_bin("mmdebstrap", "mmdebstrap")?;
    require_bin("systemd-nspawn", "systemd-container")?;
    let mirror = apt_mirror();
    let key = format!("{SUITE} minbase {} {mirror}", PACKAGES.join(","));
    let root = Path::new(CACHE).join(format!("nspawn-root-{:016x}", fnv1a(&key)));
    if root.join(".ferro-complete").exists() {
        return Ok(root);
    }
    std::fs::create_dir_all(CACHE).with_context(|| format!("creating {CACHE}"))?;
    let tmp = Path::new(CACHE).join(format!(".nspawn-root-build-{}", std::process::id()));
    let _cleanup = RemoveOnDrop(tmp.clone());
    run(Command::new("mmdebstrap")
        .args(["--variant=minbase", "--quiet"])
        .arg(format!("--include={}", PACKAGES.join(",")))
        .arg(SUITE)
        .arg(&tmp)
        .arg(&mirror))
    .context("building the nspawn root with mmdebstrap")?;
    // no fstab entries: nspawn mounts what the container needs
    std::fs::write(tmp.join("etc/fstab"), "")?;
    std::fs::write(tmp.join(".ferro-complete"), key)?;
    match std::fs::rename(&tmp, &root) {
        Ok(()) => Ok(root),
        // another run finished first: use its root
        Err(_) if root.join(".ferro-complete").exists() => Ok(root),
        Err(e) => Err(e).with_context(|| format!("renaming {} to {}", tmp.display(), root.display())),
    }
}

/// Removes a directory tree on drop.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if self.0.exists() {
            if let Err(e) = std::fs::remove_dir_all(&self.0) {
                eprintln!("removing {}: {e}", self.0.display());
            }
        }
    }
}

/// A fresh copy of a root, deleted on drop.
pub struct RootCopy {
    path: PathBuf,
    _remove: RemoveOnDrop,
}

impl RootCopy {
    /// Copies `root` to /var/tmp/<name> (attributes kept: ping's capability, modes).
    pub fn new(root: &Path, name: &str) -> Result<RootCopy> {
        let path = Path::new("/var/tmp").join(name);
        if path.exists() {
            bail!("{} exists: a previous run left it (remove it by hand)", path.display());
        }
        let copy = RootCopy { path: path.clone(), _remove: RemoveOnDrop(path.clone()) };
        run(Command::new("cp").arg("-a").arg("--reflink=auto").arg(root).arg(&path))?;
        std::fs::write(path.join("etc/hostname"), format!("{name}\n"))?;
        Ok(copy)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// A booted container: systemd as its PID 1.
pub struct Machine {
    nspawn: Child,
    /// The container's PID 1 as the host sees it.
    pub leader: u32,
    pub name: String,
    pub log: PathBuf,
}

fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| c.split_whitespace().filter_map(|p| p.parse().ok()).collect::<Vec<u32>>())
        .collect()
}

/// Polls `check` until it answers `Some`, failing after `limit` with `what`.
pub fn wait_for<T>(what: &str, limit: Duration, mut check: impl FnMut() -> Option<T>) -> Result<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check() {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("timed out after {limit:?} waiting for {what}");
        }
        crate::interrupt::sleep(Duration::from_millis(100));
    }
}

impl Machine {
    /// Boots `root` (`name` becomes its host name) and waits until systemd finished booting.
    pub fn boot(root: &Path, name: &str, log: &Path) -> Result<Machine> {
        let out = std::fs::File::create(log)?;
        let nspawn = Command::new("systemd-nspawn")
            .args(["-b", "-D"])
            .arg(root)
            .args(["-M", name, "--private-network", "--register=no", "--keep-unit", "--console=passive"])
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .context("starting systemd-nspawn")?;
        let nspawn_pid = nspawn.id();
        let mut m = Machine { nspawn, leader: 0, name: name.to_string(), log: log.to_path_buf() };
        m.leader = wait_for("the container's systemd", Duration::from_secs(30), || {
            children(nspawn_pid).into_iter().find(|c| {
                std::fs::read_to_string(format!("/proc/{c}/comm")).is_ok_and(|s| s.trim() == "systemd")
            })
        })?;
        let state = wait_for("systemd to finish booting", Duration::from_secs(60), || {
            let o = m.cmd(&["systemctl", "is-system-running"]).ok()?;
            let s = String::from_utf8_lossy(&o.stdout).trim().to_string();
            matches!(s.as_str(), "running" | "degraded").then_some(s)
        })?;
        if state == "degraded" {
            let failed = m.cmd(&["systemctl", "--failed", "--no-legend"])?;
            eprintln!("container booted degraded: {}", String::from_utf8_lossy(&failed.stdout));
        }
        Ok(m)
    }

    /// Runs a command inside the container (all its namespaces); its output, whatever the
    /// exit status.
    pub fn cmd(&self, args: &[&str]) -> Result<Output> {
        Command::new("nsenter")
            .arg("-t")
            .arg(self.leader.to_string())
            .args(["-a", "--"])
            .args(args)
            .env("SYSTEMD_PAGER", "")
            .env("SYSTEMD_COLORS", "0")
            .output()
            .with_context(|| format!("nsenter {args:?}"))
    }

    /// Runs a command inside the container, failing with its output when it fails.
    pub fn ok(&self, args: &[&str]) -> Result<String> {
        let o = self.cmd(args)?;
        if !o.status.success() {
            bail!(
                "{args:?} in {} failed ({}): {}{}",
                self.name,
                o.status,
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    }

    /// `systemctl show -p <prop> --value <unit>`.
    pub fn prop(&self, unit: &str, prop: &str) -> Result<String> {
        Ok(self.ok(&["systemctl", "show", "-p", prop, "--value", unit])?.trim().to_string())
    }

    /// Powers the container off and waits for nspawn to exit (killing it after 60 s).
    pub fn shutdown(&mut self) -> Result<()> {
        if self.nspawn.try_wait()?.is_some() {
            return Ok(());
        }
        let _ignored = self.cmd(&["systemctl", "poweroff"]);
        let nspawn = &mut self.nspawn;
        let exited = wait_for("the container to power off", Duration::from_secs(60), || nspawn.try_wait().ok().flatten());
        if exited.is_err() {
            // SIGKILL to the container's init ends its whole PID namespace
            let _ignored = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.leader as i32), nix::sys::signal::Signal::SIGKILL);
            let _ignored = self.nspawn.kill();
            let _ignored = self.nspawn.wait();
            bail!("the container did not power off within 60 s: killed");
        }
        Ok(())
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            eprintln!("stopping container {}: {e:#}", self.name);
        }
        // the console log: shown when the test failed, removed either way
        if std::thread::panicking() {
            if let Ok(text) = std::fs::read_to_string(&self.log) {
                let lines: Vec<&str> = text.lines().collect();
                eprintln!("console of {} (last lines):\n{}", self.name, lines[lines.len().saturating_sub(40)..].join("\n"));
            }
        }
        if let Err(e) = std::fs::remove_file(&self.log) {
            eprintln!("removing {}: {e}", self.log.display());
        }
    }
}
