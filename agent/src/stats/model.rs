//! The node's and the pods' usage as the kubelet's Summary API models it (stats/v1alpha1), and
//! the pure step from CRI answers (ListPodSandbox, ListContainers, ListContainerStats,
//! ListPodSandboxStats) to pods with their containers.
//!
//! Times are Unix nanoseconds; absent values are `None` (the Summary API omits them).

use std::collections::{BTreeMap, HashMap};

use crate::cri::api;

/// CPU usage at `time_ns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CpuStats {
    pub time_ns: i64,
    /// Usage over the last sampling interval, in billionths of a core.
    pub usage_nano_cores: Option<u64>,
    /// Cumulative CPU time since the container (or node) started, in core-nanoseconds.
    pub usage_core_nano_seconds: Option<u64>,
}

/// Memory usage at `time_ns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryStats {
    pub time_ns: i64,
    pub available_bytes: Option<u64>,
    pub usage_bytes: Option<u64>,
    /// Usage minus inactive file pages: what the OOM killer and eviction look at.
    pub working_set_bytes: Option<u64>,
    pub rss_bytes: Option<u64>,
    pub page_faults: Option<u64>,
    pub major_page_faults: Option<u64>,
}

/// Counters of one network interface.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct InterfaceStats {
    pub name: String,
    pub rx_bytes: Option<u64>,
    pub rx_errors: Option<u64>,
    pub tx_bytes: Option<u64>,
    pub tx_errors: Option<u64>,
}

/// Network counters at `time_ns`: the default interface (flattened into the Summary's object)
/// and every interface.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NetworkStats {
    pub time_ns: i64,
    pub default: Option<InterfaceStats>,
    pub interfaces: Vec<InterfaceStats>,
}

/// A file system's (or a directory's) usage at `time_ns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FsStats {
    pub time_ns: i64,
    pub available_bytes: Option<u64>,
    pub capacity_bytes: Option<u64>,
    pub used_bytes: Option<u64>,
    pub inodes_free: Option<u64>,
    pub inodes: Option<u64>,
    pub inodes_used: Option<u64>,
}

/// A container of a pod.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ContainerStats {
    pub name: String,
    /// When the runtime created this container (a restart is a new container).
    pub start_time_ns: i64,
    pub cpu: Option<CpuStats>,
    pub memory: Option<MemoryStats>,
    /// The writable layer.
    pub rootfs: Option<FsStats>,
    /// The container's log directory.
    pub logs: Option<FsStats>,
}

/// A volume of a pod.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VolumeStats {
    /// The volume's name in the pod spec.
    pub name: String,
    pub fs: FsStats,
    /// (namespace, claim) for persistentVolumeClaim volumes.
    pub pvc: Option<(String, String)>,
}

/// A pod: identity from its sandbox, usage from the runtime.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodStats {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub start_time_ns: i64,
    pub containers: Vec<ContainerStats>,
    pub cpu: Option<CpuStats>,
    pub memory: Option<MemoryStats>,
    pub network: Option<NetworkStats>,
    pub volumes: Vec<VolumeStats>,
    pub ephemeral_storage: Option<FsStats>,
    pub process_count: Option<u64>,
}

/// The process limits of the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RlimitStats {
    pub time_ns: i64,
    pub max_pid: Option<u64>,
    pub num_of_running_processes: Option<u64>,
}

/// The node as a whole.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeStats {
    pub node_name: String,
    pub start_time_ns: i64,
    pub cpu: Option<CpuStats>,
    pub memory: Option<MemoryStats>,
    pub network: Option<NetworkStats>,
    /// The file system of the agent's root directory.
    pub fs: Option<FsStats>,
    /// The file system holding the runtime's images.
    pub image_fs: Option<FsStats>,
    pub rlimit: Option<RlimitStats>,
}

/// One collection: what /stats/summary and /metrics/resource render.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Summary {
    pub node: NodeStats,
    pub pods: Vec<PodStats>,
    /// Something could not be read (the runtime did not answer, /proc or the cgroup was
    /// unreadable): `resource_scrape_error` is 1.
    pub error: bool,
}

/// The CRI answers about the pods.
#[derive(Debug, Clone, Default)]
pub struct CriView {
    pub sandboxes: Vec<api::PodSandbox>,
    pub containers: Vec<api::Container>,
    pub container_stats: Vec<api::ContainerStats>,
    /// None when the runtime does not implement ListPodSandboxStats: pod usage is then the
    /// sum of its containers'.
    pub sandbox_stats: Option<Vec<api::PodSandboxStats>>,
}

fn value(v: &Option<api::UInt64Value>) -> Option<u64> {
    v.as_ref().map(|v| v.value)
}

pub fn cpu_of(c: &api::CpuUsage) -> CpuStats {
    CpuStats {
        time_ns: c.timestamp,
        usage_nano_cores: value(&c.usage_nano_cores),
        usage_core_nano_seconds: value(&c.usage_core_nano_seconds),
    }
}

pub fn memory_of(m: &api::MemoryUsage) -> MemoryStats {
    MemoryStats {
        time_ns: m.timestamp,
        available_bytes: value(&m.available_bytes),
        usage_bytes: value(&m.usage_bytes),
        working_set_bytes: value(&m.working_set_bytes),
        rss_bytes: value(&m.rss_bytes),
        page_faults: value(&m.page_faults),
        major_page_faults: value(&m.major_page_faults),
    }
}

fn interface_of(i: &api::NetworkInterfaceUsage) -> InterfaceStats {
    InterfaceStats {
        name: i.name.clone(),
        rx_bytes: value(&i.rx_bytes),
        rx_errors: value(&i.rx_errors),
        tx_bytes: value(&i.tx_bytes),
        tx_errors: value(&i.tx_errors),
    }
}

fn network_of(n: &api::NetworkUsage) -> NetworkStats {
    let default = n.default_interface.as_ref().map(interface_of);
    // The Summary lists every interface, the default one included.
    let mut interfaces: Vec<InterfaceStats> = default.iter().cloned().collect();
    interfaces.extend(n.interfaces.iter().map(interface_of));
    NetworkStats { time_ns: n.timestamp, default, interfaces }
}

fn writable_layer_of(f: &api::FilesystemUsage) -> FsStats {
    FsStats { time_ns: f.timestamp, used_bytes: value(&f.used_bytes), inodes_used: value(&f.inodes_used), ..Default::default() }
}

fn sum(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.saturating_add(b)),
        (a, b) => a.or(b),
    }
}

/// A pod's CPU as the sum of its containers' (when the runtime reports no sandbox stats).
pub fn sum_cpu(containers: &[ContainerStats]) -> Option<CpuStats> {
    containers.iter().filter_map(|c| c.cpu).reduce(|a, b| CpuStats {
        time_ns: a.time_ns.max(b.time_ns),
        usage_nano_cores: sum(a.usage_nano_cores, b.usage_nano_cores),
        usage_core_nano_seconds: sum(a.usage_core_nano_seconds, b.usage_core_nano_seconds),
    })
}

/// A pod's memory as the sum of its containers'.
pub fn sum_memory(containers: &[ContainerStats]) -> Option<MemoryStats> {
    containers.iter().filter_map(|c| c.memory).reduce(|a, b| MemoryStats {
        time_ns: a.time_ns.max(b.time_ns),
        available_bytes: None,
        usage_bytes: sum(a.usage_bytes, b.usage_bytes),
        working_set_bytes: sum(a.working_set_bytes, b.working_set_bytes),
        rss_bytes: sum(a.rss_bytes, b.rss_bytes),
        page_faults: sum(a.page_faults, b.page_faults),
        major_page_faults: sum(a.major_page_faults, b.major_page_faults),
    })
}

/// The pods of the CRI answers, sorted by namespace and name: one per pod UID (its newest
/// ready sandbox), with the running containers of that sandbox (the newest per name) and
/// their stats. Pods without a ready sandbox are left out, as upstream leaves out terminated
/// pods.
pub fn pods_from_cri(view: &CriView) -> Vec<PodStats> {
    let ready = api::PodSandboxState::SandboxReady as i32;
    let running = api::ContainerState::ContainerRunning as i32;
    let mut by_uid: BTreeMap<String, &api::PodSandbox> = BTreeMap::new();
    for sb in view.sandboxes.iter().filter(|s| s.state == ready) {
        let Some(m) = sb.metadata.as_ref() else { continue };
        match by_uid.get(&m.uid) {
            Some(old) if old.created_at >= sb.created_at => {}
            _ => {
                by_uid.insert(m.uid.clone(), sb);
            }
        }
    }
    let stats: HashMap<&str, &api::ContainerStats> = view
        .container_stats
        .iter()
        .filter_map(|s| Some((s.attributes.as_ref()?.id.as_str(), s)))
        .collect();
    let sandbox_stats: HashMap<&str, &api::PodSandboxStats> = view
        .sandbox_stats
        .iter()
        .flatten()
        .filter_map(|s| Some((s.attributes.as_ref()?.id.as_str(), s)))
        .collect();
    let mut pods: Vec<PodStats> = by_uid
        .values()
        .map(|sb| {
            let m = sb.metadata.clone().unwrap_or_default();
            // The newest running container per name.
            let mut newest: BTreeMap<&str, &api::Container> = BTreeMap::new();
            for c in view.containers.iter().filter(|c| c.pod_sandbox_id == sb.id && c.state == running) {
                let name = c.metadata.as_ref().map(|m| m.name.as_str()).unwrap_or("");
                if name.is_empty() {
                    continue;
                }
                match newest.get(name) {
                    Some(old) if old.created_at >= c.created_at => {}
                    _ => {
                        newest.insert(name, c);
                    }
                }
            }
            let containers: Vec<ContainerStats> = newest
                .iter()
                .map(|(name, c)| {
                    let s = stats.get(c.id.as_str());
                    ContainerStats {
                        name: name.to_string(),
                        start_time_ns: c.created_at,
                        cpu: s.and_then(|s| s.cpu.as_ref()).map(cpu_of),
                        memory: s.and_then(|s| s.memory.as_ref()).map(memory_of),
                        rootfs: s.and_then(|s| s.writable_layer.as_ref()).map(writable_layer_of),
                        logs: None,
                    }
                })
                .collect();
            let linux = sandbox_stats.get(sb.id.as_str()).and_then(|s| s.linux.as_ref());
            PodStats {
                namespace: m.namespace,
                name: m.name,
                uid: m.uid,
                start_time_ns: sb.created_at,
                cpu: linux.and_then(|l| l.cpu.as_ref()).map(cpu_of).or_else(|| sum_cpu(&containers)),
                memory: linux.and_then(|l| l.memory.as_ref()).map(memory_of).or_else(|| sum_memory(&containers)),
                // containerd 1.6 leaves the network's timestamp 0: the sandbox's CPU time
                network: linux.and_then(|l| {
                    let mut n = network_of(l.network.as_ref()?);
                    if n.time_ns == 0 {
                        n.time_ns = l.cpu.as_ref().map_or(0, |c| c.timestamp);
                    }
                    Some(n)
                }),
                process_count: linux.and_then(|l| l.process.as_ref()).and_then(|p| value(&p.process_count)),
                containers,
                volumes: Vec::new(),
                ephemeral_storage: None,
            }
        })
        .collect();
    pods.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    pods
}

/// The pods' claim volumes: each claim's last stats under the name of every volume of the pod
/// that mounts that claim (`pods` are the pod objects the agent runs).
pub fn claim_volumes(
    pods: &[k8s_openapi::api::core::v1::Pod],
    claims: &[crate::csi::mounter::VolumeStats],
    time_ns: i64,
) -> HashMap<String, Vec<VolumeStats>> {
    let u = |v: i64| u64::try_from(v).ok();
    let mut out: HashMap<String, Vec<VolumeStats>> = HashMap::new();
    for pod in pods {
        let (Some(uid), Some(ns)) = (pod.metadata.uid.as_ref(), pod.metadata.namespace.as_ref()) else { continue };
        for vol in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
            let Some(claim) = vol.persistent_volume_claim.as_ref().map(|c| c.claim_name.as_str()) else { continue };
            let Some(st) = claims.iter().find(|c| &c.namespace == ns && c.claim == claim) else { continue };
            out.entry(uid.clone()).or_default().push(VolumeStats {
                name: vol.name.clone(),
                fs: FsStats {
                    time_ns,
                    available_bytes: u(st.available_bytes),
                    capacity_bytes: u(st.capacity_bytes),
                    used_bytes: u(st.used_bytes),
                    inodes_free: u(st.inodes_free),
                    inodes: u(st.inodes),
                    inodes_used: u(st.inodes_used),
                },
                pvc: Some((ns.clone(), claim.to_string())),
            });
        }
    }
    out
}

/// A pod's ephemeral storage: its containers' writable layers and logs.
pub fn ephemeral_of(containers: &[ContainerStats]) -> Option<FsStats> {
    let parts: Vec<FsStats> = containers.iter().flat_map(|c| c.rootfs.into_iter().chain(c.logs)).collect();
    parts.iter().copied().reduce(|a, b| FsStats {
        time_ns: a.time_ns.max(b.time_ns),
        available_bytes: a.available_bytes.or(b.available_bytes),
        capacity_bytes: a.capacity_bytes.or(b.capacity_bytes),
        used_bytes: sum(a.used_bytes, b.used_bytes),
        inodes_free: a.inodes_free.or(b.inodes_free),
        inodes: a.inodes.or(b.inodes),
        inodes_used: sum(a.inodes_used, b.inodes_used),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod tests {
    use super::*;

    fn u(v: u64) -> Option<api::UInt64Value> {
        Some(api::UInt64Value { value: v })
    }

    fn sandbox(id: &str, ns: &str, name: &str, uid: &str, created_at: i64, ready: bool) -> api::PodSandbox {
        api::PodSandbox {
            id: id.into(),
            metadata: Some(api::PodSandboxMetadata { name: name.into(), uid: uid.into(), namespace: ns.into(), attempt: 0 }),
            state: if ready { api::PodSandboxState::SandboxReady as i32 } else { api::PodSandboxState::SandboxNotready as i32 },
            created_at,
            ..Default::default()
        }
    }

    fn container(id: &str, sandbox: &str, name: &str, created_at: i64, running: bool) -> api::Container {
        api::Container {
            id: id.into(),
            pod_sandbox_id: sandbox.into(),
            metadata: Some(api::ContainerMetadata { name: name.into(), attempt: 0 }),
            state: if running { api::ContainerState::ContainerRunning as i32 } else { api::ContainerState::ContainerExited as i32 },
            created_at,
            ..Default::default()
        }
    }

    /// ListContainerStats' entry: (timestamp, usageCoreNanoSeconds, usageNanoCores), memory
    /// (workingSet, usage, rss, pageFaults), the writable layer's (timestamp, bytes, inodes).
    fn stats(id: &str, (t, cpu_ns, nano_cores): (i64, u64, u64), (ws, usage, rss, pf): (u64, u64, u64, u64), (lt, used, inodes): (i64, u64, u64)) -> api::ContainerStats {
        api::ContainerStats {
            attributes: Some(api::ContainerAttributes { id: id.into(), ..Default::default() }),
            cpu: Some(api::CpuUsage { timestamp: t, usage_core_nano_seconds: u(cpu_ns), usage_nano_cores: u(nano_cores) }),
            memory: Some(memory(t, ws, usage, rss, pf)),
            writable_layer: Some(api::FilesystemUsage {
                timestamp: lt,
                fs_id: Some(api::FilesystemIdentifier {
                    mountpoint: "/tmp/ferro-lab-ctrd-aM9SDZ/root/io.containerd.snapshotter.v1.overlayfs".into(),
                }),
                used_bytes: u(used),
                inodes_used: u(inodes),
            }),
            swap: None,
        }
    }

    fn memory(t: i64, ws: u64, usage: u64, rss: u64, pf: u64) -> api::MemoryUsage {
        api::MemoryUsage {
            timestamp: t,
            working_set_bytes: u(ws),
            available_bytes: u(0),
            usage_bytes: u(usage),
            rss_bytes: u(rss),
            page_faults: u(pf),
            major_page_faults: u(0),
        }
    }

    /// ListPodSandboxStats' entry as containerd 1.6 gives it (its network timestamp is 0).
    fn sandbox_stats(id: &str, (t, cpu_ns, nano_cores): (i64, u64, u64), (ws, rss, pf): (u64, u64, u64), (rx, tx): (u64, u64)) -> api::PodSandboxStats {
        api::PodSandboxStats {
            attributes: Some(api::PodSandboxAttributes { id: id.into(), ..Default::default() }),
            linux: Some(api::LinuxPodSandboxStats {
                cpu: Some(api::CpuUsage { timestamp: t, usage_core_nano_seconds: u(cpu_ns), usage_nano_cores: u(nano_cores) }),
                memory: Some(memory(t, ws, ws, rss, pf)),
                network: Some(api::NetworkUsage {
                    timestamp: 0,
                    default_interface: Some(api::NetworkInterfaceUsage {
                        name: "eth0".into(),
                        rx_bytes: u(rx),
                        rx_errors: u(0),
                        tx_bytes: u(tx),
                        tx_errors: u(0),
                    }),
                    interfaces: vec![],
                }),
                process: Some(api::ProcessUsage { timestamp: t, process_count: u(1) }),
                containers: vec![],
            }),
            windows: None,
        }
    }

    /// What containerd 1.6.20 answered in the lab (agent/tests/top.rs) for a pod spinning a CPU
    /// (`burner`), an idle one and one holding 48 MiB in /dev/shm (`holder`), ids shortened.
    /// Added by hand, marked so: a stopped earlier sandbox of the holder and an exited earlier
    /// attempt of its container, a pod being torn down, a second container (`log`) in the idle
    /// pod; the idle pod's sandbox stats are left out (the sum of its containers is used).
    pub(crate) fn recorded() -> CriView {
        const LAYER: u64 = 28_672;
        CriView {
            sandboxes: vec![
                sandbox("e32b3661a9b4", "top", "burner", "c5f5d5cd-ea8e-4225-9b81-89339e4652e8", 1_795_724_426_180_098_512, true),
                sandbox("8bf85428a90b", "top", "idle", "4b8ea56c-76cd-4998-ba5f-1bee6ee372aa", 1_795_724_426_356_040_146, true),
                sandbox("670ff8ed5af5", "top", "holder", "cdb18d0e-f940-4420-8794-b71081a776c8", 1_795_724_426_570_763_633, true),
                // added: an older, stopped sandbox of the holder and a pod being torn down
                sandbox("added-old-sb", "top", "holder", "cdb18d0e-f940-4420-8794-b71081a776c8", 1_795_724_400_000_000_000, false),
                sandbox("added-gone", "top", "gone", "uid-gone", 1_795_724_420_000_000_000, false),
            ],
            containers: vec![
                container("4cd04d38d604", "e32b3661a9b4", "burner", 1_795_724_426_327_186_111, true),
                container("1f088e4d2446", "8bf85428a90b", "idle", 1_795_724_426_522_202_074, true),
                container("47f9734416ff", "670ff8ed5af5", "holder", 1_795_724_426_768_117_793, true),
                // added: the holder's exited first attempt, the idle pod's second container,
                // the torn-down pod's container
                container("added-first", "670ff8ed5af5", "holder", 1_795_724_426_600_000_000, false),
                container("added-log", "8bf85428a90b", "log", 1_795_724_426_530_000_000, true),
                container("added-x", "added-gone", "x", 1_795_724_421_000_000_000, false),
            ],
            container_stats: vec![
                stats(
                    "4cd04d38d604",
                    (1_795_724_440_629_188_765, 13_927_836_532, 908_772_896),
                    (225_280, 225_280, 57_344, 741),
                    (1_795_724_435_159_047_522, LAYER, 10),
                ),
                stats(
                    "1f088e4d2446",
                    (1_795_724_440_631_260_411, 13_807_825, 0),
                    (454_656, 454_656, 53_248, 897),
                    (1_795_724_435_150_193_647, LAYER, 10),
                ),
                stats(
                    "47f9734416ff",
                    (1_795_724_440_632_942_659, 33_904_112, 0),
                    (51_007_488, 51_007_488, 53_248, 1_072),
                    (1_795_724_435_150_619_158, LAYER, 10),
                ),
                // added
                stats("added-first", (1_795_724_440_632_942_659, 9, 0), (1, 1, 1, 1), (1_795_724_435_150_619_158, 1, 1)),
                stats("added-log", (1_795_724_440_631_260_411, 1_000_000, 0), (4_096, 4_096, 4_096, 2), (1_795_724_435_150_193_647, 4_096, 1)),
            ],
            sandbox_stats: Some(vec![
                sandbox_stats("670ff8ed5af5", (1_795_724_440_637_257_926, 53_501_045, 0), (51_781_632, 139_264, 2_177), (2_312, 586)),
                sandbox_stats("e32b3661a9b4", (1_795_724_440_646_202_796, 13_963_244_063, 892_379_649), (503_808, 143_360, 1_719), (2_742, 656)),
            ]),
        }
    }

    #[test]
    fn pods_from_recorded_cri_answers() {
        let pods = pods_from_cri(&recorded());
        let names: Vec<(&str, &str)> = pods.iter().map(|p| (p.namespace.as_str(), p.name.as_str())).collect();
        assert_eq!(names, [("top", "burner"), ("top", "holder"), ("top", "idle")], "no sandbox ready, no pod");
        let burner = &pods[0];
        assert_eq!(burner.uid, "c5f5d5cd-ea8e-4225-9b81-89339e4652e8");
        assert_eq!(burner.start_time_ns, 1_795_724_426_180_098_512);
        assert_eq!(burner.containers.len(), 1);
        assert_eq!(burner.containers[0].start_time_ns, 1_795_724_426_327_186_111, "the container's createdAt");
        assert_eq!(burner.containers[0].cpu.unwrap().usage_core_nano_seconds, Some(13_927_836_532));
        assert_eq!(burner.containers[0].rootfs.unwrap().used_bytes, Some(28_672));
        // Sandbox stats win over the sum of the containers (they include the pause process).
        assert_eq!(burner.cpu.unwrap().usage_core_nano_seconds, Some(13_963_244_063));
        assert_eq!(burner.memory.unwrap().working_set_bytes, Some(503_808));
        let net = burner.network.as_ref().unwrap();
        assert_eq!(net.default.as_ref().unwrap().name, "eth0");
        assert_eq!(net.interfaces.len(), 1);
        assert_eq!(net.time_ns, 1_795_724_440_646_202_796, "containerd's network time is 0: the sandbox's CPU time");
        assert_eq!(burner.process_count, Some(1));

        let holder = &pods[1];
        // The newest ready sandbox; the exited first attempt of the container is not reported.
        assert_eq!(holder.start_time_ns, 1_795_724_426_570_763_633);
        let c: Vec<(&str, i64)> = holder.containers.iter().map(|c| (c.name.as_str(), c.start_time_ns)).collect();
        assert_eq!(c, [("holder", 1_795_724_426_768_117_793)]);
        assert_eq!(holder.containers[0].memory.unwrap().working_set_bytes, Some(51_007_488));

        let idle = &pods[2];
        // No sandbox stats for this pod: the sum of its containers.
        assert_eq!(idle.containers.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["idle", "log"]);
        assert_eq!(idle.cpu.unwrap().usage_core_nano_seconds, Some(13_807_825 + 1_000_000));
        assert_eq!(idle.memory.unwrap().working_set_bytes, Some(454_656 + 4_096));
        assert_eq!(idle.network, None);
    }

    #[test]
    fn claim_volumes_by_pod() {
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "db", "namespace": "prod", "uid": "u1"},
            "spec": {"containers": [], "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "pg"}},
                {"name": "tmp", "emptyDir": {}}
            ]}
        }))
        .unwrap();
        let claims = vec![crate::csi::mounter::VolumeStats {
            namespace: "prod".into(),
            claim: "pg".into(),
            capacity_bytes: 100,
            available_bytes: 60,
            used_bytes: 40,
            inodes: 10,
            inodes_free: 7,
            inodes_used: 3,
            abnormal: None,
        }];
        let v = claim_volumes(&[pod], &claims, 5);
        let vols = &v["u1"];
        assert_eq!(vols.len(), 1);
        assert_eq!(vols[0].name, "data");
        assert_eq!(vols[0].pvc, Some(("prod".into(), "pg".into())));
        assert_eq!(vols[0].fs.used_bytes, Some(40));
    }
}
