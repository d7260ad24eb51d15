//! The node's own usage from the kernel, as the kubelet's cAdvisor reads it for the root
//! cgroup: CPU time and memory of the root cgroup (cgroup v1: `cpuacct.usage`,
//! `memory.usage_in_bytes` and `memory.stat`; v2: `cpu.stat` and /proc/meminfo), working set =
//! usage - inactive_file, network counters from /proc/net/dev, the boot time from /proc/stat.
//!
//! The parsers are pure; [`read`] takes the paths (normally /proc and /sys/fs/cgroup) so tests
//! point it at a temp dir.

use std::path::Path;

use super::model::{CpuStats, InterfaceStats, MemoryStats, NetworkStats};

/// The interface whose counters are the node's and the pods' default (upstream's
/// `eth0`); the others are listed too.
pub const DEFAULT_INTERFACE: &str = "eth0";

/// `key value` lines (memory.stat, cpu.stat) as a lookup.
fn field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        (it.next()? == key).then(|| it.next()?.parse().ok()).flatten()
    })
}

/// `Key:   value kB` lines of /proc/meminfo, in bytes.
fn meminfo_bytes(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(key)?.strip_prefix(':')?;
        let mut it = rest.split_whitespace();
        let v: u64 = it.next()?.parse().ok()?;
        Some(if it.next() == Some("kB") { v.saturating_mul(1024) } else { v })
    })
}

/// The boot time of /proc/stat (`btime`, Unix seconds) in nanoseconds.
pub fn boot_time_ns(proc_stat: &str) -> Option<i64> {
    let secs = field(proc_stat, "btime")?;
    i64::try_from(secs).ok()?.checked_mul(1_000_000_000)
}

/// CPU time of every CPU from the `cpu` line of /proc/stat (user, nice, system, irq, softirq,
/// steal; idle and iowait are not usage), in nanoseconds for a clock tick of `hz`.
pub fn proc_stat_cpu_ns(proc_stat: &str, hz: u64) -> Option<u64> {
    let line = proc_stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    let ticks = [0usize, 1, 2, 5, 6, 7].iter().filter_map(|i| v.get(*i)).sum::<u64>();
    Some(ticks.saturating_mul(1_000_000_000 / hz.max(1)))
}

/// The root cgroup's memory on cgroup v1: usage, working set (usage minus
/// `total_inactive_file`), rss and page faults from `memory.usage_in_bytes` and `memory.stat`.
pub fn memory_v1(usage_in_bytes: &str, memory_stat: &str, total: Option<u64>, time_ns: i64) -> Option<MemoryStats> {
    let usage: u64 = usage_in_bytes.trim().parse().ok()?;
    let inactive = field(memory_stat, "total_inactive_file").unwrap_or(0);
    let ws = usage.saturating_sub(inactive);
    Some(MemoryStats {
        time_ns,
        available_bytes: total.map(|t| t.saturating_sub(ws)),
        usage_bytes: Some(usage),
        working_set_bytes: Some(ws),
        rss_bytes: field(memory_stat, "total_rss"),
        page_faults: field(memory_stat, "total_pgfault"),
        major_page_faults: field(memory_stat, "total_pgmajfault"),
    })
}

/// The node's memory where the root cgroup has no usage file (cgroup v2): usage is MemTotal -
/// MemFree, the working set that minus Inactive(file), as cAdvisor computes the root's.
pub fn memory_meminfo(meminfo: &str, time_ns: i64) -> Option<MemoryStats> {
    let total = meminfo_bytes(meminfo, "MemTotal")?;
    let free = meminfo_bytes(meminfo, "MemFree")?;
    let usage = total.saturating_sub(free);
    let inactive = meminfo_bytes(meminfo, "Inactive(file)").unwrap_or(0);
    let ws = usage.saturating_sub(inactive);
    Some(MemoryStats {
        time_ns,
        available_bytes: Some(total.saturating_sub(ws)),
        usage_bytes: Some(usage),
        working_set_bytes: Some(ws),
        rss_bytes: meminfo_bytes(meminfo, "AnonPages"),
        page_faults: None,
        major_page_faults: None,
    })
}

/// /proc/net/dev: the counters of every interface except loopback and the host ends of pod
/// veths (as cAdvisor leaves them out); the default one is [`DEFAULT_INTERFACE`].
pub fn network(net_dev: &str, time_ns: i64) -> NetworkStats {
    let mut interfaces = Vec::new();
    for line in net_dev.lines().skip(2) {
        let Some((name, rest)) = line.split_once(':') else { continue };
        let name = name.trim();
        if name == "lo" || name.starts_with("veth") {
            continue;
        }
        let v: Vec<u64> = rest.split_whitespace().filter_map(|x| x.parse().ok()).collect();
        if v.len() < 16 {
            continue;
        }
        interfaces.push(InterfaceStats {
            name: name.to_string(),
            rx_bytes: Some(v[0]),
            rx_errors: Some(v[2]),
            tx_bytes: Some(v[8]),
            tx_errors: Some(v[10]),
        });
    }
    let default = interfaces.iter().find(|i| i.name == DEFAULT_INTERFACE).cloned();
    NetworkStats { time_ns, default, interfaces }
}

/// What [`read`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Host {
    pub start_time_ns: i64,
    pub cpu: Option<CpuStats>,
    pub memory: Option<MemoryStats>,
    pub network: Option<NetworkStats>,
}

/// Reads the node at `now_ns`: `proc` is /proc, `cgroup` the cgroup mount (/sys/fs/cgroup).
/// Missing pieces stay `None`; `usage_nano_cores` is left to the caller (it needs the
/// previous sample).
pub fn read(proc: &Path, cgroup: &Path, now_ns: i64) -> Host {
    let stat = std::fs::read_to_string(proc.join("stat")).unwrap_or_default();
    let meminfo = std::fs::read_to_string(proc.join("meminfo")).unwrap_or_default();
    let text = |p: &Path| std::fs::read_to_string(p).ok();
    // cgroup v1 (hybrid here): cpuacct and memory hierarchies at their mounts.
    let v1_cpu = text(&cgroup.join("cpuacct/cpuacct.usage"))
        .or_else(|| text(&cgroup.join("cpu,cpuacct/cpuacct.usage")))
        .and_then(|t| t.trim().parse::<u64>().ok());
    // cgroup v2: cpu.stat of the root (usage_usec).
    let v2_cpu = || text(&cgroup.join("cpu.stat")).and_then(|t| field(&t, "usage_usec")).map(|us| us.saturating_mul(1000));
    let cpu_ns = v1_cpu.or_else(v2_cpu).or_else(|| proc_stat_cpu_ns(&stat, 100));
    let total = meminfo_bytes(&meminfo, "MemTotal");
    let memory = match (text(&cgroup.join("memory/memory.usage_in_bytes")), text(&cgroup.join("memory/memory.stat"))) {
        (Some(u), Some(s)) => memory_v1(&u, &s, total, now_ns),
        _ => memory_meminfo(&meminfo, now_ns),
    };
    let network = text(&proc.join("net/dev")).map(|t| network(&t, now_ns));
    Host {
        start_time_ns: boot_time_ns(&stat).unwrap_or(0),
        cpu: cpu_ns.map(|ns| CpuStats { time_ns: now_ns, usage_nano_cores: None, usage_core_nano_seconds: Some(ns) }),
        memory,
        network,
    }
}

/// Usage in nanocores between two cumulative samples (time, core-ns); None when the counter
/// went back or no time passed.
pub fn nano_cores(prev: (i64, u64), now: (i64, u64)) -> Option<u64> {
    let dt = u64::try_from(now.0.checked_sub(prev.0)?).ok().filter(|d| *d > 0)?;
    let used = now.1.checked_sub(prev.1)?;
    u64::try_from(u128::from(used) * 1_000_000_000 / u128::from(dt)).ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const STAT: &str = "cpu  5258584 157878 1339925 5027297 130217 0 25256 5128 0 0\n\
        cpu0 2629292 78939 669962 2513648 65108 0 12628 2564 0 0\n\
        intr 1 2 3\nctxt 123\nbtime 1764100000\nprocesses 4242\n";

    #[test]
    fn proc_stat() {
        assert_eq!(boot_time_ns(STAT), Some(1_764_100_000_000_000_000));
        let ticks = 5_258_584u64 + 157_878 + 1_339_925 + 25_256 + 5_128;
        assert_eq!(proc_stat_cpu_ns(STAT, 100), Some(ticks * 10_000_000));
        assert_eq!(boot_time_ns("cpu 1 2 3\n"), None);
    }

    #[test]
    fn memory_of_the_root_cgroup_v1() {
        let stat = "cache 13352960\nrss 9809920\ninactive_file 98304\ntotal_cache 17087729664\ntotal_rss 18927616\n\
            total_inactive_file 11070558208\ntotal_pgfault 123\ntotal_pgmajfault 4\n";
        let m = memory_v1("17106530304\n", stat, Some(24 << 30), 7).unwrap();
        assert_eq!(m.usage_bytes, Some(17_106_530_304));
        // working set = usage - total_inactive_file (not the root's own inactive_file)
        assert_eq!(m.working_set_bytes, Some(17_106_530_304 - 11_070_558_208));
        assert_eq!(m.available_bytes, Some((24u64 << 30) - (17_106_530_304 - 11_070_558_208)));
        assert_eq!((m.rss_bytes, m.page_faults, m.major_page_faults), (Some(18_927_616), Some(123), Some(4)));
        assert_eq!(m.time_ns, 7);
        assert_eq!(memory_v1("x", stat, None, 0), None);
    }

    #[test]
    fn memory_from_meminfo() {
        let mi = "MemTotal:       25165824 kB\nMemFree:         1048576 kB\nMemAvailable:   9000000 kB\n\
            AnonPages:        524288 kB\nInactive(file):  4194304 kB\n";
        let m = memory_meminfo(mi, 1).unwrap();
        let usage = (25_165_824u64 - 1_048_576) * 1024;
        assert_eq!(m.usage_bytes, Some(usage));
        assert_eq!(m.working_set_bytes, Some(usage - 4_194_304 * 1024));
        assert_eq!(m.rss_bytes, Some(524_288 * 1024));
    }

    #[test]
    fn net_dev() {
        let text = "Inter-|   Receive                                                |  Transmit\n \
            face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    \
            lo:    1000      10    0    0    0     0          0         0     1000      10    0    0    0     0       0          0\n  \
            eth0: 5000      50    1    0    0     0          0         0     7000      70    2    0    0     0       0          0\n\
            vethabc: 1 1 0 0 0 0 0 0 1 1 0 0 0 0 0 0\n  \
            cni0: 300 3 0 0 0 0 0 0 400 4 0 0 0 0 0 0\n";
        let n = network(text, 9);
        let names: Vec<&str> = n.interfaces.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, ["eth0", "cni0"]);
        let d = n.default.unwrap();
        assert_eq!((d.rx_bytes, d.rx_errors, d.tx_bytes, d.tx_errors), (Some(5000), Some(1), Some(7000), Some(2)));
    }

    #[test]
    fn reads_a_v1_tree_and_falls_back() {
        let dir = tempfile::tempdir().unwrap();
        let proc = dir.path().join("proc");
        let cg = dir.path().join("cgroup");
        std::fs::create_dir_all(proc.join("net")).unwrap();
        std::fs::create_dir_all(cg.join("cpuacct")).unwrap();
        std::fs::create_dir_all(cg.join("memory")).unwrap();
        std::fs::write(proc.join("stat"), STAT).unwrap();
        std::fs::write(proc.join("meminfo"), "MemTotal: 1000 kB\nMemFree: 100 kB\n").unwrap();
        std::fs::write(cg.join("cpuacct/cpuacct.usage"), "68499753009072\n").unwrap();
        std::fs::write(cg.join("memory/memory.usage_in_bytes"), "512000\n").unwrap();
        std::fs::write(cg.join("memory/memory.stat"), "total_inactive_file 12000\n").unwrap();
        let h = read(&proc, &cg, 42);
        assert_eq!(h.start_time_ns, 1_764_100_000_000_000_000);
        assert_eq!(h.cpu.unwrap().usage_core_nano_seconds, Some(68_499_753_009_072));
        assert_eq!(h.memory.unwrap().working_set_bytes, Some(500_000));
        assert_eq!(h.memory.unwrap().available_bytes, Some(1_024_000 - 500_000));
        assert_eq!(h.network, None);
        // No cgroup files: /proc/stat and /proc/meminfo.
        std::fs::remove_dir_all(&cg).unwrap();
        let h = read(&proc, &cg, 42);
        assert!(h.cpu.unwrap().usage_core_nano_seconds.unwrap() > 0);
        assert_eq!(h.memory.unwrap().usage_bytes, Some(900 * 1024));
    }

    #[test]
    fn rates() {
        assert_eq!(nano_cores((0, 0), (1_000_000_000, 500_000_000)), Some(500_000_000));
        assert_eq!(nano_cores((0, 0), (2_000_000_000, 3_000_000_000)), Some(1_500_000_000));
        assert_eq!(nano_cores((5, 10), (5, 20)), None, "no time passed");
        assert_eq!(nano_cores((0, 10), (1_000, 5)), None, "counter went back");
    }
}
