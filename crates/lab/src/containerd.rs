//! A private containerd for one test, inside a network namespace the test created.
//!
//! Layout under a temp dir `D`: `D/root`, `D/state` (containerd's `root` and `state`; the
//! CRI plugin's pod netns files go to `D/state/netns` via `netns_mounts_under_state_dir`),
//! `D/containerd.sock`, `D/opt`, `D/runc` (runc's state), `D/cni/bin`, `D/cni/conf`,
//! `D/config.toml`, `D/containerd.log`.
//!
//! It is started with `ip netns exec <ns>`, which also gives it a mount namespace of its own
//! with a fresh sysfs on /sys; the wrapper script mounts the host's cgroup hierarchies again
//! there (same types and options as the fixture's own /sys/fs/cgroup, so the same
//! hierarchies) before it execs containerd. Everything containerd and its shims mount lives in
//! that mount namespace and goes away with its last process.
//!
//! Drop: SIGKILL to the container and shim processes listed in the state dir (`init.pid`,
//! `shim.pid`: processes this containerd started), SIGTERM to containerd (SIGKILL after 10 s),
//! a lazy unmount of anything still mounted under `D` in the fixture's own mount namespace,
//! then the temp dir is removed.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::netns::NetNs;
use crate::{require_bin, run};

/// What the CRI plugin is configured with.
#[derive(Debug, Clone)]
pub struct Options {
    /// The CRI plugin's `sandbox_image` (import it before the first RunPodSandbox).
    pub sandbox_image: String,
    /// CNI binaries to put in `bin_dir`: (name in bin_dir, source file). The CRI plugin also
    /// needs `loopback` there.
    pub cni_plugins: Vec<(String, PathBuf)>,
    /// Files of `conf_dir`: (file name, content).
    pub cni_configs: Vec<(String, String)>,
    /// The OCI runtime binary the runc shim runs (its `BinaryName` option, e.g. crun);
    /// `None` is runc from `PATH`.
    pub runtime_binary: Option<PathBuf>,
    /// containerd's `root` (the image filesystem the CRI plugin reports) on an ext4 of this
    /// many bytes on a loop device of its own, mounted in containerd's mount namespace only and
    /// detached at stop: a disk whose usage the test controls. `None`: the temp dir's
    /// filesystem, the host's disk.
    pub root_fs_bytes: Option<u64>,
}

/// Where a containerd keeps its things. The fixture puts everything under one temp dir
/// ([`Layout::under`]); the quick start (scripts/up.sh) splits persistent data and run-time
/// state ([`Layout::split`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    /// containerd's `root` (content, snapshots, metadata).
    pub root: PathBuf,
    /// containerd's `state` (tasks, shims' files, the CRI plugin's pod netns files).
    pub state: PathBuf,
    /// The gRPC socket; the ttrpc socket is `<socket>.ttrpc`.
    pub socket: PathBuf,
    /// The debug socket.
    pub debug_socket: PathBuf,
    /// The `opt` plugin's directory.
    pub opt: PathBuf,
    /// runc's `--root` (the runc runtime's `Root` option).
    pub runc_root: PathBuf,
    /// The CRI plugin's CNI `bin_dir` and `conf_dir`.
    pub cni_bin: PathBuf,
    pub cni_conf: PathBuf,
    /// The CRI plugin's registry `config_path` (a `hosts.toml` per registry host, see
    /// [`write_registry_hosts`]); `None` leaves the registry section out.
    pub registry_config_path: Option<PathBuf>,
}

impl Layout {
    /// Everything under `d`: `d/root`, `d/state`, `d/containerd.sock`, `d/debug.sock`, `d/opt`,
    /// `d/runc`, `d/cni/bin`, `d/cni/conf`; no registry config.
    pub fn under(d: &Path) -> Layout {
        Layout {
            root: d.join("root"),
            state: d.join("state"),
            socket: d.join("containerd.sock"),
            debug_socket: d.join("debug.sock"),
            opt: d.join("opt"),
            runc_root: d.join("runc"),
            cni_bin: d.join("cni/bin"),
            cni_conf: d.join("cni/conf"),
            registry_config_path: None,
        }
    }

    /// Persistent data under `data` (`root`, `opt`, `certs.d` as the registry config_path),
    /// run-time state under `run` (`state`, `containerd.sock`, `debug.sock`, `runc`), CNI dirs
    /// as given.
    pub fn split(data: &Path, run: &Path, cni_bin: &Path, cni_conf: &Path) -> Layout {
        Layout {
            root: data.join("root"),
            state: run.join("state"),
            socket: run.join("containerd.sock"),
            debug_socket: run.join("debug.sock"),
            opt: data.join("opt"),
            runc_root: run.join("runc"),
            cni_bin: cni_bin.to_path_buf(),
            cni_conf: cni_conf.to_path_buf(),
            registry_config_path: Some(data.join("certs.d")),
        }
    }
}

/// Renders containerd 1.6's config (version 2). Pure.
pub fn render_config(layout: &Layout, opts: &Options) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        r#"version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"

[debug]
  address = "{debug}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{image}"
  netns_mounts_under_state_dir = true
  # Without CAP_SYS_RESOURCE (as in this VM) runc cannot lower oom_score_adj to -998.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni_bin}"
    conf_dir = "{cni_conf}"
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = "{runc}"
"#,
        root = layout.root.display(),
        state = layout.state.display(),
        socket = layout.socket.display(),
        debug = layout.debug_socket.display(),
        opt = layout.opt.display(),
        cni_bin = layout.cni_bin.display(),
        cni_conf = layout.cni_conf.display(),
        runc = layout.runc_root.display(),
        image = opts.sandbox_image,
    );
    if let Some(bin) = &opts.runtime_binary {
        let _ = writeln!(s, "        BinaryName = \"{}\"", bin.display());
    }
    if let Some(path) = &layout.registry_config_path {
        let _ = write!(
            s,
            r#"  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{}"
"#,
            path.display()
        );
    }
    s
}

/// The `hosts.toml` that makes containerd pull `host` (`HOST:PORT`) over plain http. Pure.
pub fn hosts_toml(host: &str) -> String {
    format!(
        "server = \"http://{host}\"\n\n[host.\"http://{host}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
    )
}

/// Writes `<config_path>/<host>/hosts.toml` ([`hosts_toml`]) and returns its path.
pub fn write_registry_hosts(config_path: &Path, host: &str) -> Result<PathBuf> {
    if host.is_empty() || host.contains('/') || host.contains("..") {
        bail!("registry must be HOST or HOST:PORT, got {host:?}");
    }
    let dir = config_path.join(host);
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let file = dir.join("hosts.toml");
    std::fs::write(&file, hosts_toml(host)).with_context(|| format!("write {}", file.display()))?;
    Ok(file)
}

/// Shell commands that mount, in a fresh /sys, the cgroup file systems mounted at and under
/// /sys/fs/cgroup in `mountinfo` (the fixture's own view). Pure.
pub fn cgroup_mount_script(mountinfo: &str) -> String {
    let mut out = String::new();
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let Some(point) = left.split_whitespace().nth(4) else {
            continue;
        };
        if point != "/sys/fs/cgroup" && !point.starts_with("/sys/fs/cgroup/") {
            continue;
        }
        let mut r = right.split_whitespace();
        let (Some(fstype), Some(_src), Some(opts)) = (r.next(), r.next(), r.next()) else {
            continue;
        };
        let keep: Vec<&str> = opts
            .split(',')
            .filter(|o| {
                !matches!(*o, "rw" | "ro") && !o.starts_with("size=") && !o.starts_with("inode64")
            })
            .collect();
        let opts = if keep.is_empty() {
            String::new()
        } else {
            format!(" -o {}", keep.join(","))
        };
        match fstype {
            "tmpfs" | "cgroup" | "cgroup2" => {
                let _ = writeln!(
                    out,
                    "mkdir -p {point} && mount -t {fstype}{opts} {fstype} {point}"
                );
            }
            _ => {}
        }
    }
    out
}

/// The script `ip netns exec <ns> sh` runs to start containerd in the mount namespace `ip
/// netns exec` made for it: the cgroup mounts ([`cgroup_mount_script`] of `mountinfo`); with
/// `shim_dir`, a bind mount of it over `/run/containerd` (containerd 1.6 puts its shims' sockets
/// in `/run/containerd/s`, whatever its config says: the bind keeps them out of the system
/// containerd's directory, and the mount exists only in this mount namespace); then `exec
/// containerd --config <config>`. Pure.
pub fn start_script(mountinfo: &str, config: &Path, shim_dir: Option<&Path>) -> String {
    let mut s = format!("set -e\n{}", cgroup_mount_script(mountinfo));
    if let Some(dir) = shim_dir {
        let _ = writeln!(
            s,
            "mkdir -p {d} /run/containerd && mount --bind {d} /run/containerd",
            d = dir.display()
        );
    }
    let _ = writeln!(
        s,
        "exec containerd --config {} --log-level info",
        config.display()
    );
    s
}

/// A running private containerd.
pub struct Containerd {
    dir: tempfile::TempDir,
    child: Option<Child>,
    /// The loop device under `root` ([`Options::root_fs_bytes`]), detached at stop.
    root_loop: Option<String>,
}

impl Containerd {
    /// Writes the config and CNI dirs, starts containerd in `ns` and waits (up to 30 s) until
    /// its socket answers `ctr version`.
    pub fn start(ns: &NetNs, opts: &Options) -> Result<Containerd> {
        crate::require_root()?;
        require_bin("containerd", "containerd")?;
        require_bin("ctr", "containerd")?;
        require_bin("runc", "runc")?;
        require_bin("containerd-shim-runc-v2", "containerd")?;
        let dir = tempfile::Builder::new()
            .prefix("ferro-lab-ctrd-")
            .tempdir()?;
        let d = dir.path();
        for sub in ["root", "state", "opt", "runc", "cni/bin", "cni/conf"] {
            std::fs::create_dir_all(d.join(sub))?;
        }
        for (name, src) in &opts.cni_plugins {
            std::os::unix::fs::symlink(src, d.join("cni/bin").join(name))
                .with_context(|| format!("link CNI plugin {name} -> {}", src.display()))?;
        }
        for (name, text) in &opts.cni_configs {
            std::fs::write(d.join("cni/conf").join(name), text)?;
        }
        let config = d.join("config.toml");
        std::fs::write(&config, render_config(&Layout::under(d), opts))?;
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
        let mut script = start_script(&mountinfo, &config, None);
        // From here on, Drop undoes what was made (the loop device, the process).
        let mut c = Containerd { dir, child: None, root_loop: None };
        if let Some(bytes) = opts.root_fs_bytes {
            require_bin("losetup", "util-linux")?;
            require_bin("mkfs.ext4", "e2fsprogs")?;
            let img = c.dir.path().join("root.img");
            std::fs::File::create(&img)?.set_len(bytes)?;
            let out = run(Command::new("losetup").args(["--find", "--show"]).arg(&img))?;
            let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
            c.root_loop = Some(dev.clone());
            run(Command::new("mkfs.ext4").args(["-q", "-F", &dev]))?;
            // Mounted by the start script: in containerd's mount namespace only.
            let exec = script.rfind("exec containerd").context("start script without exec")?;
            script.insert_str(exec, &format!("mount {dev} {}\n", c.dir.path().join("root").display()));
        }
        let d = c.dir.path();
        std::fs::write(d.join("start.sh"), script)?;
        let log = std::fs::File::create(d.join("containerd.log"))?;
        let child = ns
            .command("sh")
            .arg(d.join("start.sh"))
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("start containerd")?;
        c.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(child) = c.child.as_mut() {
                if let Some(status) = child.try_wait()? {
                    bail!("containerd exited ({status}):\n{}", c.log());
                }
            }
            if c.socket().exists() && c.ctr(&["version"]).is_ok() {
                return Ok(c);
            }
            if Instant::now() > deadline {
                bail!("containerd did not answer within 30s:\n{}", c.log());
            }
            crate::interrupt::sleep(Duration::from_millis(100));
        }
    }

    /// The temp dir everything lives in.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The gRPC socket (CRI and containerd's own API).
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("containerd.sock")
    }

    /// containerd's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("containerd.log")).unwrap_or_default()
    }

    /// containerd's pid.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `ctr --address <socket> --namespace k8s.io ARGS`.
    pub fn ctr(&self, args: &[&str]) -> Result<String> {
        let out = run(Command::new("ctr")
            .arg("--address")
            .arg(self.socket())
            .args(["--namespace", "k8s.io"])
            .args(args))?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Imports a docker-archive or OCI tar into the `k8s.io` namespace (the CRI plugin's).
    pub fn import(&self, tar: &Path) -> Result<()> {
        self.ctr(&["images", "import", &tar.display().to_string()])
            .map(drop)
    }

    /// Pids recorded by the runc shims under the state dir (`init.pid`: container processes,
    /// `shim.pid`: the shims), containers first.
    fn runtime_pids(&self) -> Vec<i32> {
        let tasks = self.dir.path().join("state/io.containerd.runtime.v2.task");
        let mut init = Vec::new();
        let mut shims = Vec::new();
        for ns in std::fs::read_dir(&tasks).into_iter().flatten().flatten() {
            for task in std::fs::read_dir(ns.path()).into_iter().flatten().flatten() {
                for (file, list) in [("init.pid", &mut init), ("shim.pid", &mut shims)] {
                    if let Some(pid) = std::fs::read_to_string(task.path().join(file))
                        .ok()
                        .and_then(|s| s.trim().parse::<i32>().ok())
                    {
                        list.push(pid);
                    }
                }
            }
        }
        init.extend(shims);
        init
    }

    /// Shim processes started by this containerd, found by their `-address <our socket>`
    /// argument (a shim re-parents to init, and its state-dir pid file is not always there).
    fn shim_pids(&self) -> Vec<i32> {
        let socket = self.socket().display().to_string();
        let mut out = Vec::new();
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
                continue;
            };
            let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
                continue;
            };
            let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
            let is_shim = args
                .first()
                .is_some_and(|a| a.ends_with(b"containerd-shim-runc-v2"));
            let ours = args
                .windows(2)
                .any(|w| w[0] == b"-address" && w[1] == socket.as_bytes());
            if is_shim && ours {
                out.push(pid);
            }
        }
        out
    }

    /// Stops everything (see the module doc); also called by Drop.
    pub fn stop(&mut self) {
        let mut pids = self.runtime_pids();
        pids.extend(self.shim_pids());
        for pid in pids {
            if pid > 1 {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
        if let Some(mut child) = self.child.take() {
            if let Ok(pid) = i32::try_from(child.id()) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                match child.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() > deadline => {
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                    Ok(None) => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        }
        // Mounts normally die with containerd's own mount namespace; anything that reached
        // ours (under the temp dir only) is unmounted, deepest first.
        let prefix = self.dir.path().display().to_string();
        let mut mounts: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_whitespace().nth(4).map(str::to_string))
            .filter(|p| p.starts_with(&prefix))
            .collect();
        mounts.sort_by_key(|p| std::cmp::Reverse(p.len()));
        for m in mounts {
            let _ = Command::new("umount").args(["-l", &m]).output();
        }
        // Its only mount was in containerd's namespace, gone with it; were a process still
        // holding it, the kernel detaches the device when the last user goes (autoclear).
        if let Some(dev) = self.root_loop.take() {
            match Command::new("losetup").arg("--detach").arg(&dev).output() {
                Ok(o) if o.status.success() => {}
                Ok(o) => eprintln!("losetup --detach {dev}: {}", String::from_utf8_lossy(&o.stderr).trim()),
                Err(e) => eprintln!("losetup --detach {dev}: {e}"),
            }
        }
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_runtime_binary_goes_into_the_runc_options() {
        let mut opts = Options {
            sandbox_image: "registry.ferro.test/pause:1".into(),
            cni_plugins: Vec::new(),
            cni_configs: Vec::new(),
            runtime_binary: None,
            root_fs_bytes: None,
        };
        let layout = Layout::under(Path::new("/tmp/x"));
        assert!(!render_config(&layout, &opts).contains("BinaryName"));
        opts.runtime_binary = Some("/usr/bin/crun".into());
        let text = render_config(&layout, &opts);
        let table = text
            .split("[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]")
            .nth(1)
            .unwrap();
        let table = table.split("\n  [").next().unwrap();
        assert!(table.contains("Root = \"/tmp/x/runc\""), "{table}");
        assert!(table.contains("BinaryName = \"/usr/bin/crun\""), "{table}");
    }

    #[test]
    fn config_points_everything_into_the_temp_dir() {
        let opts = Options {
            sandbox_image: "registry.ferro.test/pause:1".into(),
            cni_plugins: Vec::new(),
            cni_configs: Vec::new(),
            runtime_binary: None,
            root_fs_bytes: None,
        };
        let text = render_config(&Layout::under(Path::new("/tmp/x")), &opts);
        for want in [
            "root = \"/tmp/x/root\"",
            "state = \"/tmp/x/state\"",
            "address = \"/tmp/x/containerd.sock\"",
            "sandbox_image = \"registry.ferro.test/pause:1\"",
            "bin_dir = \"/tmp/x/cni/bin\"",
            "conf_dir = \"/tmp/x/cni/conf\"",
            "Root = \"/tmp/x/runc\"",
            "netns_mounts_under_state_dir = true",
        ] {
            assert!(text.contains(want), "missing {want}:\n{text}");
        }
        assert!(!text.contains("/var/lib/containerd"));
        assert!(!text.contains("/run/containerd"));
        assert!(!text.contains("config_path"));
    }

    #[test]
    fn split_layout_with_a_registry() {
        let opts = Options {
            sandbox_image: "127.0.0.1:5000/ferro/pause:1".into(),
            cni_plugins: Vec::new(),
            cni_configs: Vec::new(),
            runtime_binary: None,
            root_fs_bytes: None,
        };
        let layout = Layout::split(
            Path::new("/var/lib/l/containerd"),
            Path::new("/run/l/containerd"),
            Path::new("/var/lib/l/cni/bin"),
            Path::new("/var/lib/l/cni/conf"),
        );
        let text = render_config(&layout, &opts);
        for want in [
            "root = \"/var/lib/l/containerd/root\"",
            "state = \"/run/l/containerd/state\"",
            "address = \"/run/l/containerd/containerd.sock\"",
            "address = \"/run/l/containerd/containerd.sock.ttrpc\"",
            "address = \"/run/l/containerd/debug.sock\"",
            "path = \"/var/lib/l/containerd/opt\"",
            "Root = \"/run/l/containerd/runc\"",
            "bin_dir = \"/var/lib/l/cni/bin\"",
            "conf_dir = \"/var/lib/l/cni/conf\"",
            "sandbox_image = \"127.0.0.1:5000/ferro/pause:1\"",
            "[plugins.\"io.containerd.grpc.v1.cri\".registry]\n    config_path = \"/var/lib/l/containerd/certs.d\"",
        ] {
            assert!(text.contains(want), "missing {want}:\n{text}");
        }
        assert!(!text.contains("/var/lib/containerd"));
        assert!(!text.contains("/run/containerd"));
    }

    #[test]
    fn hosts_toml_pulls_over_plain_http() {
        assert_eq!(
            hosts_toml("127.0.0.1:5000"),
            "server = \"http://127.0.0.1:5000\"\n\n[host.\"http://127.0.0.1:5000\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
        );
        let dir = tempfile::tempdir().unwrap();
        let file = write_registry_hosts(dir.path(), "127.0.0.1:5000").unwrap();
        assert_eq!(file, dir.path().join("127.0.0.1:5000/hosts.toml"));
        assert_eq!(
            std::fs::read_to_string(file).unwrap(),
            hosts_toml("127.0.0.1:5000")
        );
        assert!(write_registry_hosts(dir.path(), "../x").is_err());
    }

    #[test]
    fn start_script_mounts_cgroups_then_the_shim_dir_then_execs() {
        let v2 = "30 23 0:26 / /sys/fs/cgroup rw shared:9 - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(
            start_script(v2, Path::new("/d/config.toml"), None),
            "set -e\nmkdir -p /sys/fs/cgroup && mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup\n\
             exec containerd --config /d/config.toml --log-level info\n"
        );
        assert_eq!(
            start_script(v2, Path::new("/d/config.toml"), Some(Path::new("/run/l/shims"))),
            "set -e\nmkdir -p /sys/fs/cgroup && mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup\n\
             mkdir -p /run/l/shims /run/containerd && mount --bind /run/l/shims /run/containerd\n\
             exec containerd --config /d/config.toml --log-level info\n"
        );
    }

    #[test]
    fn cgroup_script_remounts_v1_hybrid_and_v2() {
        let hybrid = "\
30 23 0:26 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755,inode64
31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid shared:10 - cgroup2 cgroup2 rw,nsdelegate
32 30 0:28 / /sys/fs/cgroup/cpu,cpuacct rw shared:11 - cgroup cgroup rw,cpu,cpuacct
40 23 0:5 / /proc rw - proc proc rw
";
        assert_eq!(
            cgroup_mount_script(hybrid),
            "mkdir -p /sys/fs/cgroup && mount -t tmpfs -o mode=755 tmpfs /sys/fs/cgroup\n\
             mkdir -p /sys/fs/cgroup/unified && mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup/unified\n\
             mkdir -p /sys/fs/cgroup/cpu,cpuacct && mount -t cgroup -o cpu,cpuacct cgroup /sys/fs/cgroup/cpu,cpuacct\n"
        );
        let v2 = "30 23 0:26 / /sys/fs/cgroup rw shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n";
        assert_eq!(
            cgroup_mount_script(v2),
            "mkdir -p /sys/fs/cgroup && mount -t cgroup2 -o nsdelegate,memory_recursiveprot cgroup2 /sys/fs/cgroup\n"
        );
    }
}
