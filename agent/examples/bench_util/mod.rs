//! Helpers the agent's benchmark programs share: flags, CPU accounting, percentiles.
#![allow(dead_code)]

/// `--name N` from the command line, or `default`.
pub fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| v.parse().unwrap_or_else(|_| panic!("{name} takes a number")))
        .unwrap_or(default)
}

/// utime + stime of `pid` in clock ticks (USER_HZ, 100 a second on Linux).
pub fn cpu_ticks(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = s.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields after the command: state is index 0, utime 11, stime 12.
    f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0) + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
}

/// A cgroup v1 `cpuacct` group of its own for one process (moved into it, with every thread
/// it has and starts later): its CPU time in nanoseconds, where /proc's utime + stime count
/// 10 ms ticks (a 30-pod burst of the agent is some 20 ticks). Removed on drop, the process
/// moved back first. None where the machine has no cgroup v1 cpuacct hierarchy.
pub struct CpuAcct {
    dir: std::path::PathBuf,
    pid: u32,
}

impl CpuAcct {
    pub fn attach(pid: u32) -> Option<CpuAcct> {
        let root = std::path::Path::new("/sys/fs/cgroup/cpuacct");
        if !root.join("cpuacct.usage").exists() {
            return None;
        }
        let dir = root.join(format!("ferro-bench-{}-{pid}", std::process::id()));
        std::fs::create_dir(&dir).ok()?;
        let acct = CpuAcct { dir, pid };
        std::fs::write(acct.dir.join("cgroup.procs"), pid.to_string()).ok()?;
        Some(acct)
    }

    /// CPU time of the group so far, in nanoseconds.
    pub fn ns(&self) -> u64 {
        std::fs::read_to_string(self.dir.join("cpuacct.usage")).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0)
    }
}

impl Drop for CpuAcct {
    fn drop(&mut self) {
        let parent = self.dir.parent().map(|p| p.join("cgroup.procs"));
        if let Some(parent) = parent {
            let _ = std::fs::write(parent, self.pid.to_string());
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// CPU seconds of `pid`: from its cpuacct group when it has one, else from /proc in ticks.
pub fn cpu_seconds(pid: u32, acct: Option<&CpuAcct>) -> f64 {
    match acct {
        Some(a) => a.ns() as f64 / 1e9,
        None => cpu_ticks(pid) as f64 / 100.0,
    }
}

/// The `p`th percentile of sorted values (nearest rank).
pub fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Runs `job` with a client of `kubeconfig` on a thread inside the network namespace at
/// `ns_path` (the lab's: its API address is only there), on a runtime of its own, and returns
/// what it gives.
pub fn in_netns<T: Send + 'static>(
    ns_path: impl AsRef<std::path::Path> + Send + 'static,
    kubeconfig: std::path::PathBuf,
    job: impl FnOnce(kube::Client) -> futures::future::BoxFuture<'static, T> + Send + 'static,
) -> T {
    std::thread::spawn(move || {
        let f = std::fs::File::open(ns_path).unwrap();
        nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let kc = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
            let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.unwrap();
            ferro_lab::interrupt::interruptible(job(kube::Client::try_from(cfg).unwrap())).await
        })
    })
    .join()
    .unwrap()
}
