//! ferro-lab: fixtures the privileged tests of several components share.
//!
//! - [`images`]: test images built offline: a busybox image from Debian's busybox-static and
//!   a `pause` image holding ferro's own static pause binary (crate `ferro-pause`), each an
//!   OCI layout made with `umoci`, turned into a docker-archive with `skopeo` for
//!   `ctr images import`. No registry and no network are involved.
//! - [`interrupt`]: Ctrl-C in a program that built a lab unwinds, so every fixture's `Drop`
//!   cleans up (the benchmarks install it).
//! - [`netns`]: a network namespace guard (`ip netns add`, deleted on drop).
//! - [`containerd`]: a private containerd (its own root, state, socket and CNI dirs under a
//!   temp dir) started inside a network namespace with `ip netns exec`, stopped by pid and
//!   cleaned up on drop.
//! - [`cri`]: CRI v1 clients (k8s-cri + tonic) over the unix socket.
//! - [`storage`]: a scratch directory whose loop devices and mounts go with it.
//! - [`nspawn`]: a cached minimal Debian root booted under systemd-nspawn (systemd as PID 1,
//!   a private network), for the units' tests.
//! - [`cluster`]: the multi-node lab: a control plane and several nodes, each a network
//!   namespace with its own containerd, ferro-agent, ferro-netd and ferro-proxy.
//!
//! Nothing here touches the machine's root network namespace or the system containerd.
//! Everything needs root and the Debian packages `containerd runc umoci skopeo
//! busybox-static` (scripts/lib.sh installs them); a missing piece is an error with the
//! package to install, never a silent skip. See docs/design/lab.md.

pub mod cluster;
pub mod containerd;
pub mod cri;
pub mod images;
pub mod interrupt;
pub mod netns;
pub mod nspawn;
pub mod storage;

use std::process::{Command, Output};

use anyhow::{bail, Context, Result};

/// Runs `cmd`, failing with its stderr when it exits non-zero.
pub fn run(cmd: &mut Command) -> Result<Output> {
    let desc = format!("{cmd:?}");
    let out = cmd.output().with_context(|| format!("cannot run {desc}"))?;
    if !out.status.success() {
        bail!(
            "{desc} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(out)
}

/// Whether process `pid` holds the listening socket on 127.0.0.1:`port` (/proc/net/tcp's
/// listener inode among the process's descriptors): a port a test chose with a throwaway bind
/// may have been taken by another test's process first, which a connect alone cannot tell.
pub fn listens(pid: u32, port: u16) -> bool {
    let Ok(tcp) = std::fs::read_to_string("/proc/net/tcp") else { return false };
    let local = format!("0100007F:{port:04X}");
    let sockets: Vec<String> = tcp
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(1) == Some(&local.as_str()) && f.get(3) == Some(&"0A")).then(|| f.get(9).map(|i| format!("socket:[{i}]")))?
        })
        .collect();
    if sockets.is_empty() {
        return false;
    }
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return false };
    fds.flatten().any(|e| std::fs::read_link(e.path()).is_ok_and(|t| sockets.iter().any(|s| t.to_string_lossy() == s.as_str())))
}

/// Fails unless the effective user is root.
pub fn require_root() -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!("the lab needs root (network namespaces, mounts, containerd): run the tests as root");
    }
    Ok(())
}

/// Fails with the Debian package to install when `bin` is not on PATH.
pub fn require_bin(bin: &str, package: &str) -> Result<()> {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(bin).is_file()))
        .unwrap_or(false)
        || ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
            .iter()
            .any(|d| std::path::Path::new(d).join(bin).is_file());
    if !found {
        bail!("{bin} is not installed: apt-get install -y {package} (scripts/lib.sh installs it)");
    }
    Ok(())
}
