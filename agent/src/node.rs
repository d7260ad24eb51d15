//! The Node object this agent registers and reports, built by pure functions from host facts.
//!
//! Reading the host ([`HostFacts::read`]) takes its paths as arguments so tests point it at a
//! temp dir; everything else here is pure.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;

use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeStatus, NodeSystemInfo,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

pub const KUBELET_VERSION: &str = "v1.33.0-ferro";

/// Facts about the host that go into the Node.
#[derive(Debug, Clone, PartialEq)]
pub struct HostFacts {
    pub hostname: String,
    pub cpus: u32,
    pub memory_ki: u64,
    pub ephemeral_storage_bytes: u64,
    pub kernel_version: String,
    pub os_image: String,
    /// (interface name, address) of the host's interfaces.
    pub interfaces: Vec<(String, IpAddr)>,
}

#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("reading {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("no MemTotal in {0}")]
    MemTotal(String),
    #[error("cannot parse the cpu list {0:?}")]
    CpuList(String),
    #[error("statvfs {path}")]
    Statvfs {
        path: String,
        #[source]
        source: nix::Error,
    },
}

fn read(path: &Path) -> Result<String, HostError> {
    std::fs::read_to_string(path).map_err(|source| HostError::Read { path: path.display().to_string(), source })
}

impl HostFacts {
    /// Reads the host: `proc` is normally /proc, `sys` /sys, `os_release` /etc/os-release.
    pub fn read(proc: &Path, sys: &Path, os_release: &Path, root_dir: &Path) -> Result<Self, HostError> {
        let hostname = read(&proc.join("sys/kernel/hostname"))?.trim().to_string();
        let cpu_path = sys.join("devices/system/cpu/online");
        let cpus = parse_cpu_list(read(&cpu_path)?.trim())
            .ok_or_else(|| HostError::CpuList(cpu_path.display().to_string()))?;
        let meminfo = proc.join("meminfo");
        let memory_ki =
            parse_meminfo(&read(&meminfo)?).ok_or_else(|| HostError::MemTotal(meminfo.display().to_string()))?;
        let st = nix::sys::statvfs::statvfs(root_dir)
            .map_err(|source| HostError::Statvfs { path: root_dir.display().to_string(), source })?;
        #[allow(clippy::useless_conversion)]
        let ephemeral_storage_bytes = u64::from(st.blocks()).saturating_mul(u64::from(st.fragment_size()));
        let kernel_version = read(&proc.join("sys/kernel/osrelease"))?.trim().to_string();
        let os_image = std::fs::read_to_string(os_release)
            .ok()
            .and_then(|t| parse_os_release(&t))
            .unwrap_or_else(|| "Linux".to_string());
        Ok(HostFacts {
            hostname,
            cpus,
            memory_ki,
            ephemeral_storage_bytes,
            kernel_version,
            os_image,
            interfaces: parse_fib_trie(&read(&proc.join("net/fib_trie"))?),
        })
    }
}

/// The local IPv4 addresses of /proc/net/fib_trie (the host's network namespace), in order,
/// without duplicates. Interface names are not in that file, so they are left empty.
pub fn parse_fib_trie(text: &str) -> Vec<(String, IpAddr)> {
    let mut out: Vec<(String, IpAddr)> = Vec::new();
    let mut last: Option<IpAddr> = None;
    for line in text.lines() {
        let t = line.trim();
        if let Some(ip) = t.strip_prefix("|-- ") {
            last = ip.trim().parse().ok();
        } else if t.starts_with("/32 host LOCAL") {
            if let Some(ip) = last {
                if !out.iter().any(|(_, a)| *a == ip) {
                    out.push((String::new(), ip));
                }
            }
        }
    }
    out
}

/// Counts the CPUs of a kernel cpu list such as "0-3,6,8-9".
pub fn parse_cpu_list(s: &str) -> Option<u32> {
    let mut n = 0u32;
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.parse().ok()?, b.parse().ok()?);
                n += b.checked_sub(a)? + 1;
            }
            None => {
                part.parse::<u32>().ok()?;
                n += 1;
            }
        }
    }
    (n > 0).then_some(n)
}

/// The node-level eviction signals (see [`crate::eviction`]). memory.available is the kernel's
/// MemAvailable (upstream: capacity minus the root cgroup's working set; MemAvailable is the
/// same idea without cgroup accounting); nodefs is the file system of the agent's root dir;
/// pid.available is pid_max minus the processes that exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Signals {
    pub memory_available: u64,
    /// MemTotal (for percentage thresholds).
    pub memory_capacity: u64,
    pub nodefs_available: u64,
    pub nodefs_capacity: u64,
    pub nodefs_inodes_free: u64,
    pub nodefs_inodes: u64,
    pub pid_available: u64,
    pub pid_capacity: u64,
}

impl Signals {
    /// Reads MemAvailable from `<proc>/meminfo` and statvfs of `root_dir` (the node fs).
    pub fn read(proc: &Path, root_dir: &Path) -> Option<Signals> {
        let meminfo = std::fs::read_to_string(proc.join("meminfo")).ok()?;
        let field = |name: &str| {
            meminfo
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
        };
        let kib = field("MemAvailable:")?;
        let total = field("MemTotal:")?;
        let st = nix::sys::statvfs::statvfs(root_dir).ok()?;
        #[allow(clippy::useless_conversion)]
        let frag = u64::from(st.fragment_size());
        let (pid_max, procs) = parse_pids(
            &std::fs::read_to_string(proc.join("sys/kernel/pid_max")).ok()?,
            &std::fs::read_to_string(proc.join("loadavg")).ok()?,
        )?;
        #[allow(clippy::useless_conversion)]
        Some(Signals {
            pid_available: pid_max.saturating_sub(procs),
            pid_capacity: pid_max,
            memory_available: kib.saturating_mul(1024),
            memory_capacity: total.saturating_mul(1024),
            nodefs_available: u64::from(st.blocks_available()).saturating_mul(frag),
            nodefs_capacity: u64::from(st.blocks()).saturating_mul(frag),
            nodefs_inodes_free: u64::from(st.files_available()),
            nodefs_inodes: u64::from(st.files()),
        })
    }

    /// The signals as the eviction manager's observations.
    pub fn observations(&self) -> crate::eviction::plan::Observations {
        use crate::eviction::plan::{Observation, Signal};
        let o = |available, capacity| Observation { available, capacity };
        std::collections::BTreeMap::from([
            (Signal::MemoryAvailable, o(self.memory_available, self.memory_capacity)),
            (Signal::NodefsAvailable, o(self.nodefs_available, self.nodefs_capacity)),
            (Signal::NodefsInodesFree, o(self.nodefs_inodes_free, self.nodefs_inodes)),
            (Signal::PidAvailable, o(self.pid_available, self.pid_capacity)),
        ])
    }
}

/// pid_max and the number of processes (the total of /proc/loadavg's fourth field).
pub fn parse_pids(pid_max: &str, loadavg: &str) -> Option<(u64, u64)> {
    let max: u64 = pid_max.trim().parse().ok()?;
    let total: u64 = loadavg.split_whitespace().nth(3)?.split('/').nth(1)?.parse().ok()?;
    Some((max, total))
}

pub fn parse_meminfo(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// PRETTY_NAME of /etc/os-release.
pub fn parse_os_release(text: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim().trim_matches('"').trim_matches('\'').to_string())
}

/// Rust's architecture name as Go's GOARCH, which Kubernetes labels use.
pub fn go_arch(rust_arch: &str) -> &str {
    match rust_arch {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        "riscv64" => "riscv64",
        "s390x" => "s390x",
        other => other,
    }
}

/// The InternalIP: the configured one, else the first non-loopback IPv4 address.
pub fn pick_internal_ip(node_ip: Option<IpAddr>, interfaces: &[(String, IpAddr)]) -> Option<IpAddr> {
    node_ip.or_else(|| {
        interfaces
            .iter()
            .map(|(_, ip)| *ip)
            .find(|ip| matches!(ip, IpAddr::V4(v4) if !v4.is_loopback() && !v4.is_link_local() && !v4.is_unspecified()))
    })
}

/// What the node is to report, apart from times.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeInput {
    pub name: String,
    pub node_ip: Option<IpAddr>,
    pub max_pods: i64,
    pub port: u16,
    pub container_runtime_version: String,
    pub pod_cidr: Option<String>,
}

/// Inputs of the node conditions.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Health {
    /// Whether the runtime answered its last Status call (false: "container runtime is down").
    pub runtime_ready: bool,
    /// The RuntimeReady condition (as [`RuntimeCondition`]'s Display, or `<nil>`) when it is not
    /// true.
    pub runtime_error: Option<String>,
    /// The NetworkReady condition (as [`RuntimeCondition`]'s Display, or `<nil>`) when it is not
    /// true.
    pub network_error: Option<String>,
    /// `<runtimeName>://<runtimeVersion>` once the runtime has answered Version.
    pub runtime_version: Option<String>,
    pub memory_pressure: bool,
    pub disk_pressure: bool,
    pub pid_pressure: bool,
}

/// One condition of the CRI runtime's Status (runtime.v1 RuntimeCondition).
#[derive(Debug, Clone, PartialEq)]
pub struct RuntimeCondition {
    pub type_: String,
    pub status: bool,
    pub reason: String,
    pub message: String,
}

impl std::fmt::Display for RuntimeCondition {
    /// As upstream's kubecontainer.RuntimeCondition.String().
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}={} reason:{} message:{}", self.type_, self.status, self.reason, self.message)
    }
}

/// The health from the runtime's Status conditions, `None` when the runtime could not be
/// reached. As upstream's updateRuntimeUp: a missing or false RuntimeReady / NetworkReady
/// condition is an error (a missing one printed as Go's `<nil>`).
pub fn runtime_health(conditions: Option<&[RuntimeCondition]>) -> Health {
    let Some(conditions) = conditions else {
        return Health::default();
    };
    let error = |ty: &str| match conditions.iter().find(|c| c.type_ == ty) {
        Some(c) if c.status => None,
        Some(c) => Some(c.to_string()),
        None => Some("<nil>".to_string()),
    };
    Health {
        runtime_ready: true,
        runtime_error: error("RuntimeReady"),
        network_error: error("NetworkReady"),
        ..Default::default()
    }
}

/// Joins errors as Go's utilerrors.NewAggregate(...).Error(): one as is, several deduplicated
/// and bracketed, `[a, b]`.
fn aggregate(errors: &[String]) -> String {
    let mut seen: Vec<&str> = Vec::new();
    for e in errors {
        if !seen.contains(&e.as_str()) {
            seen.push(e);
        }
    }
    if seen.len() == 1 {
        seen.join("")
    } else {
        format!("[{}]", seen.join(", "))
    }
}

/// The Node as registered (metadata, spec and status), with conditions at `now`.
pub fn build_node(input: &NodeInput, facts: &HostFacts, health: &Health, now: &Time) -> Node {
    let arch = go_arch(std::env::consts::ARCH);
    let labels = default_labels(&input.name, arch);
    Node {
        metadata: ObjectMeta { name: Some(input.name.clone()), labels: Some(labels), ..Default::default() },
        spec: input.pod_cidr.as_ref().map(|c| k8s_openapi::api::core::v1::NodeSpec {
            pod_cidr: Some(c.clone()),
            pod_cidrs: Some(vec![c.clone()]),
            ..Default::default()
        }),
        status: Some(build_status(input, facts, arch, health, &[], now)),
    }
}

pub fn default_labels(name: &str, arch: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("kubernetes.io/hostname".to_string(), name.to_string()),
        ("kubernetes.io/os".to_string(), "linux".to_string()),
        ("kubernetes.io/arch".to_string(), arch.to_string()),
        ("beta.kubernetes.io/os".to_string(), "linux".to_string()),
        ("beta.kubernetes.io/arch".to_string(), arch.to_string()),
    ])
}

/// The node status; `previous` conditions keep their transition times when unchanged.
pub fn build_status(
    input: &NodeInput,
    facts: &HostFacts,
    arch: &str,
    health: &Health,
    previous: &[NodeCondition],
    now: &Time,
) -> NodeStatus {
    let resources = BTreeMap::from([
        ("cpu".to_string(), Quantity(facts.cpus.to_string())),
        ("memory".to_string(), Quantity(format!("{}Ki", facts.memory_ki))),
        ("pods".to_string(), Quantity(input.max_pods.to_string())),
        ("ephemeral-storage".to_string(), Quantity(facts.ephemeral_storage_bytes.to_string())),
    ]);
    let mut addresses = Vec::new();
    if let Some(ip) = pick_internal_ip(input.node_ip, &facts.interfaces) {
        addresses.push(NodeAddress { type_: "InternalIP".into(), address: ip.to_string() });
    }
    addresses.push(NodeAddress { type_: "Hostname".into(), address: input.name.clone() });
    NodeStatus {
        capacity: Some(resources.clone()),
        allocatable: Some(resources),
        addresses: Some(addresses),
        conditions: Some(conditions(health, previous, now)),
        daemon_endpoints: Some(NodeDaemonEndpoints {
            kubelet_endpoint: Some(DaemonEndpoint { port: i32::from(input.port) }),
        }),
        node_info: Some(NodeSystemInfo {
            architecture: arch.to_string(),
            kernel_version: facts.kernel_version.clone(),
            os_image: facts.os_image.clone(),
            operating_system: "linux".into(),
            kubelet_version: KUBELET_VERSION.into(),
            container_runtime_version: health
                .runtime_version
                .clone()
                .unwrap_or_else(|| input.container_runtime_version.clone()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The four node conditions, as upstream's setters compute them.
pub fn conditions(health: &Health, previous: &[NodeCondition], now: &Time) -> Vec<NodeCondition> {
    let mut errors = Vec::new();
    if !health.runtime_ready {
        errors.push("container runtime is down".to_string());
    } else if let Some(e) = &health.runtime_error {
        errors.push(format!("container runtime not ready: {e}"));
    }
    if let Some(e) = &health.network_error {
        errors.push(format!("container runtime network not ready: {e}"));
    }
    let ready = if errors.is_empty() {
        ("True", "KubeletReady", "kubelet is posting ready status".to_string())
    } else {
        ("False", "KubeletNotReady", aggregate(&errors))
    };
    let pressure = |p: bool, yes: (&str, &str), no: (&str, &str)| {
        let (reason, msg) = if p { yes } else { no };
        (if p { "True" } else { "False" }, reason.to_string(), msg.to_string())
    };
    let mem = pressure(
        health.memory_pressure,
        ("KubeletHasInsufficientMemory", "kubelet has insufficient memory available"),
        ("KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
    );
    let disk = pressure(
        health.disk_pressure,
        ("KubeletHasDiskPressure", "kubelet has disk pressure"),
        ("KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
    );
    let pid = pressure(
        health.pid_pressure,
        ("KubeletHasInsufficientPID", "kubelet has insufficient PID available"),
        ("KubeletHasSufficientPID", "kubelet has sufficient PID available"),
    );
    let all = [
        ("MemoryPressure", mem.0, mem.1, mem.2),
        ("DiskPressure", disk.0, disk.1, disk.2),
        ("PIDPressure", pid.0, pid.1, pid.2),
        ("Ready", ready.0, ready.1.to_string(), ready.2),
    ];
    all.into_iter()
        .map(|(type_, status, reason, message)| {
            let transition = previous
                .iter()
                .find(|c| c.type_ == type_ && c.status == status)
                .and_then(|c| c.last_transition_time.clone())
                .unwrap_or_else(|| now.clone());
            NodeCondition {
                type_: type_.to_string(),
                status: status.to_string(),
                reason: Some(reason),
                message: Some(message),
                last_heartbeat_time: Some(now.clone()),
                last_transition_time: Some(transition),
            }
        })
        .collect()
}

/// Whether `new` differs from `old` in anything but heartbeat times (so must be posted now).
pub fn status_changed(old: &NodeStatus, new: &NodeStatus) -> bool {
    let strip = |s: &NodeStatus| {
        let mut s = s.clone();
        for c in s.conditions.iter_mut().flatten() {
            c.last_heartbeat_time = None;
        }
        s
    };
    strip(old) != strip(new)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn eviction_signals() {
        assert_eq!(parse_pids("4194304\n", "0.50 0.40 0.30 2/345 6789\n"), Some((4194304, 345)));
        assert_eq!(parse_pids("x", "0.50 0.40 0.30 2/345 6789"), None);
        let s = Signals { memory_available: 1, memory_capacity: 2, pid_available: 3, pid_capacity: 4, ..Default::default() };
        let o = s.observations();
        use crate::eviction::plan::Signal;
        assert_eq!((o[&Signal::MemoryAvailable].available, o[&Signal::PidAvailable].capacity), (1, 4));
        let here = Signals::read(Path::new("/proc"), Path::new("/")).unwrap();
        assert!(here.memory_available > 0 && here.nodefs_capacity > 0);
    }

    fn t(s: &str) -> Time {
        Time(s.parse().unwrap())
    }

    fn facts() -> HostFacts {
        HostFacts {
            hostname: "host".into(),
            cpus: 4,
            memory_ki: 8_000_000,
            ephemeral_storage_bytes: 1 << 30,
            kernel_version: "6.1.0-test".into(),
            os_image: "Debian GNU/Linux 12 (bookworm)".into(),
            interfaces: vec![
                ("lo".into(), "127.0.0.1".parse().unwrap()),
                ("eth0".into(), "fe80::1".parse().unwrap()),
                ("eth0".into(), "169.254.1.1".parse().unwrap()),
                ("eth0".into(), "10.1.2.3".parse().unwrap()),
                ("eth1".into(), "10.9.9.9".parse().unwrap()),
            ],
        }
    }

    fn input() -> NodeInput {
        NodeInput {
            name: "node-a".into(),
            node_ip: None,
            max_pods: 110,
            port: 10250,
            container_runtime_version: "unknown".into(),
            pod_cidr: None,
        }
    }

    #[test]
    fn parsers() {
        assert_eq!(parse_cpu_list("0-3"), Some(4));
        assert_eq!(parse_cpu_list("0-3,6,8-9"), Some(7));
        assert_eq!(parse_cpu_list("0"), Some(1));
        assert_eq!(parse_cpu_list(""), None);
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_meminfo("MemTotal:       16318480 kB\nMemFree: 1 kB\n"), Some(16318480));
        assert_eq!(parse_meminfo("MemFree: 1 kB\n"), None);
        assert_eq!(
            parse_os_release("NAME=\"Debian\"\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n").as_deref(),
            Some("Debian GNU/Linux 12 (bookworm)")
        );
        assert_eq!(go_arch("x86_64"), "amd64");
        assert_eq!(go_arch("aarch64"), "arm64");
    }

    #[test]
    fn internal_ip() {
        assert_eq!(pick_internal_ip(None, &facts().interfaces), Some("10.1.2.3".parse().unwrap()));
        let given = "192.168.1.1".parse().unwrap();
        assert_eq!(pick_internal_ip(Some(given), &facts().interfaces), Some(given));
        assert_eq!(pick_internal_ip(None, &[("lo".into(), "127.0.0.1".parse().unwrap())]), None);
    }

    #[test]
    fn node_object() {
        let now = t("2026-01-01T00:00:00Z");
        let n = build_node(&input(), &facts(), &Health { runtime_ready: true, ..Default::default() }, &now);
        let labels = n.metadata.labels.unwrap();
        assert_eq!(labels["kubernetes.io/hostname"], "node-a");
        assert_eq!(labels["kubernetes.io/os"], "linux");
        assert_eq!(labels["kubernetes.io/arch"], go_arch(std::env::consts::ARCH));
        let st = n.status.unwrap();
        let cap = st.capacity.unwrap();
        assert_eq!(cap["cpu"].0, "4");
        assert_eq!(cap["memory"].0, "8000000Ki");
        assert_eq!(cap["pods"].0, "110");
        assert_eq!(cap["ephemeral-storage"].0, (1u64 << 30).to_string());
        assert_eq!(st.allocatable.unwrap()["cpu"].0, "4");
        let addrs = st.addresses.unwrap();
        assert_eq!(addrs[0].type_, "InternalIP");
        assert_eq!(addrs[0].address, "10.1.2.3");
        assert_eq!(addrs[1].type_, "Hostname");
        assert_eq!(addrs[1].address, "node-a");
        let info = st.node_info.unwrap();
        assert_eq!(info.kubelet_version, KUBELET_VERSION);
        assert_eq!(info.kernel_version, "6.1.0-test");
        assert_eq!(info.os_image, "Debian GNU/Linux 12 (bookworm)");
        assert_eq!(info.container_runtime_version, "unknown");
        assert_eq!(st.daemon_endpoints.unwrap().kubelet_endpoint.unwrap().port, 10250);
        let ready = st.conditions.unwrap().into_iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(ready.status, "True");
        assert_eq!(ready.reason.as_deref(), Some("KubeletReady"));
    }

    #[test]
    fn conditions_reasons() {
        let now = t("2026-01-01T00:00:00Z");
        let c = conditions(&Health::default(), &[], &now);
        let get = |ty: &str| c.iter().find(|c| c.type_ == ty).unwrap().clone();
        assert_eq!(get("Ready").status, "False");
        assert_eq!(get("Ready").reason.as_deref(), Some("KubeletNotReady"));
        assert_eq!(get("Ready").message.as_deref(), Some("container runtime is down"));
        assert_eq!(get("MemoryPressure").reason.as_deref(), Some("KubeletHasSufficientMemory"));
        assert_eq!(get("DiskPressure").reason.as_deref(), Some("KubeletHasNoDiskPressure"));
        assert_eq!(get("PIDPressure").reason.as_deref(), Some("KubeletHasSufficientPID"));
        let h = Health {
            runtime_ready: true,
            network_error: Some("NetworkReady=false reason:NetworkPluginNotReady message:cni not initialized".into()),
            memory_pressure: true,
            disk_pressure: true,
            pid_pressure: true,
            ..Default::default()
        };
        let c = conditions(&h, &[], &now);
        let get = |ty: &str| c.iter().find(|c| c.type_ == ty).unwrap().clone();
        assert_eq!(
            get("Ready").message.as_deref(),
            Some("container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:cni not initialized")
        );
        assert_eq!(get("MemoryPressure").status, "True");
        assert_eq!(get("MemoryPressure").reason.as_deref(), Some("KubeletHasInsufficientMemory"));
        assert_eq!(get("DiskPressure").reason.as_deref(), Some("KubeletHasDiskPressure"));
        assert_eq!(get("PIDPressure").reason.as_deref(), Some("KubeletHasInsufficientPID"));
    }

    fn cond(ty: &str, status: bool, reason: &str, message: &str) -> RuntimeCondition {
        RuntimeCondition { type_: ty.into(), status, reason: reason.into(), message: message.into() }
    }

    fn ready_of(h: &Health) -> (String, String, String) {
        let c = conditions(h, &[], &t("2026-01-01T00:00:00Z"));
        let r = c.into_iter().find(|c| c.type_ == "Ready").unwrap();
        (r.status, r.reason.unwrap(), r.message.unwrap())
    }

    #[test]
    fn ready_from_runtime_status() {
        // Unreachable.
        let (st, reason, msg) = ready_of(&runtime_health(None));
        assert_eq!((st.as_str(), reason.as_str(), msg.as_str()), ("False", "KubeletNotReady", "container runtime is down"));
        // Both ready.
        let ok = [cond("RuntimeReady", true, "", ""), cond("NetworkReady", true, "", "")];
        let h = runtime_health(Some(&ok));
        assert_eq!(h.runtime_error, None);
        assert_eq!(h.network_error, None);
        let (st, reason, msg) = ready_of(&h);
        assert_eq!((st.as_str(), reason.as_str(), msg.as_str()), ("True", "KubeletReady", "kubelet is posting ready status"));
        // containerd without a CNI config, as upstream's kubelet reports it.
        let no_cni = [
            cond("RuntimeReady", true, "", ""),
            cond("NetworkReady", false, "NetworkPluginNotReady", "Network plugin returns error: cni plugin not initialized"),
        ];
        let (st, reason, msg) = ready_of(&runtime_health(Some(&no_cni)));
        assert_eq!(st, "False");
        assert_eq!(reason, "KubeletNotReady");
        assert_eq!(
            msg,
            "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized"
        );
        // Runtime not ready and no network condition at all: both errors, aggregated as Go does.
        let rt_down = [cond("RuntimeReady", false, "Starting", "still starting")];
        let (st, _, msg) = ready_of(&runtime_health(Some(&rt_down)));
        assert_eq!(st, "False");
        assert_eq!(
            msg,
            "[container runtime not ready: RuntimeReady=false reason:Starting message:still starting, container runtime network not ready: <nil>]"
        );
    }

    #[test]
    fn runtime_version_overrides_input() {
        let now = t("2026-01-01T00:00:00Z");
        let h = Health { runtime_version: Some("containerd://1.6.20".into()), ..Default::default() };
        let st = build_status(&input(), &facts(), "amd64", &h, &[], &now);
        assert_eq!(st.node_info.unwrap().container_runtime_version, "containerd://1.6.20");
    }

    #[test]
    fn transition_times() {
        let t0 = t("2026-01-01T00:00:00Z");
        let t1 = t("2026-01-01T00:00:10Z");
        let t2 = t("2026-01-01T00:00:20Z");
        let down = conditions(&Health::default(), &[], &t0);
        let still_down = conditions(&Health::default(), &down, &t1);
        let ready = |c: &[NodeCondition]| c.iter().find(|c| c.type_ == "Ready").unwrap().clone();
        assert_eq!(ready(&still_down).last_transition_time, Some(t0.clone()));
        assert_eq!(ready(&still_down).last_heartbeat_time, Some(t1.clone()));
        let up = conditions(&Health { runtime_ready: true, ..Default::default() }, &still_down, &t2);
        assert_eq!(ready(&up).last_transition_time, Some(t2.clone()));
        let mem = up.iter().find(|c| c.type_ == "MemoryPressure").unwrap();
        assert_eq!(mem.last_transition_time, Some(t0));
    }

    #[test]
    fn change_detection_ignores_heartbeats() {
        let t0 = t("2026-01-01T00:00:00Z");
        let t1 = t("2026-01-01T00:00:10Z");
        let arch = "amd64";
        let h = Health::default();
        let a = build_status(&input(), &facts(), arch, &h, &[], &t0);
        let b = build_status(&input(), &facts(), arch, &h, a.conditions.as_deref().unwrap_or(&[]), &t1);
        assert!(!status_changed(&a, &b));
        let up = Health { runtime_ready: true, ..Default::default() };
        let c = build_status(&input(), &facts(), arch, &up, a.conditions.as_deref().unwrap_or(&[]), &t1);
        assert!(status_changed(&a, &c));
    }

    #[test]
    fn reads_host_from_paths() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path();
        std::fs::create_dir_all(p.join("proc/sys/kernel")).unwrap();
        std::fs::create_dir_all(p.join("sys/devices/system/cpu")).unwrap();
        std::fs::write(p.join("proc/sys/kernel/hostname"), "h1\n").unwrap();
        std::fs::write(p.join("proc/sys/kernel/osrelease"), "6.1.0-x\n").unwrap();
        std::fs::write(p.join("proc/meminfo"), "MemTotal: 1024 kB\n").unwrap();
        std::fs::write(p.join("sys/devices/system/cpu/online"), "0-1\n").unwrap();
        std::fs::write(p.join("os-release"), "PRETTY_NAME=\"Test OS\"\n").unwrap();
        std::fs::create_dir_all(p.join("proc/net")).unwrap();
        std::fs::write(p.join("proc/net/fib_trie"), FIB_TRIE).unwrap();
        let f = HostFacts::read(&p.join("proc"), &p.join("sys"), &p.join("os-release"), p).unwrap();
        assert_eq!(f.hostname, "h1");
        assert_eq!(f.cpus, 2);
        assert_eq!(f.memory_ki, 1024);
        assert_eq!(f.kernel_version, "6.1.0-x");
        assert_eq!(f.os_image, "Test OS");
        assert!(f.ephemeral_storage_bytes > 0);
        assert_eq!(pick_internal_ip(None, &f.interfaces), Some("10.0.2.15".parse().unwrap()));
    }

    const FIB_TRIE: &str = "Main:
  +-- 0.0.0.0/0 3 0 5
     |-- 0.0.0.0
        /0 universe UNICAST
     +-- 127.0.0.0/8 2 0 2
        +-- 127.0.0.0/31 1 0 0
           |-- 127.0.0.0
              /8 host LOCAL
           |-- 127.0.0.1
              /32 host LOCAL
        |-- 127.255.255.255
           /32 link BROADCAST
     |-- 10.0.2.0
        /24 link UNICAST
     |-- 10.0.2.15
        /32 host LOCAL
Local:
  +-- 0.0.0.0/0 3 0 5
     |-- 127.0.0.1
        /32 host LOCAL
     |-- 10.0.2.15
        /32 host LOCAL
";

    #[test]
    fn fib_trie() {
        let ips: Vec<IpAddr> = parse_fib_trie(FIB_TRIE).into_iter().map(|(_, ip)| ip).collect();
        assert_eq!(ips, vec!["127.0.0.1".parse::<IpAddr>().unwrap(), "10.0.2.15".parse().unwrap()]);
    }
}
