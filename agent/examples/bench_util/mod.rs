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
            job(kube::Client::try_from(cfg).unwrap()).await
        })
    })
    .join()
    .unwrap()
}
