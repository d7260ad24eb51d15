//! The eviction manager's loop: observe, decide ([`super::plan::decide`]), apply.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

use super::plan::{self, Config, Decision, Observation, Observations, PodUsage, Signal, State};
use crate::clock::Clock;
use crate::cri::Cri;
use crate::node::Health;
use crate::pod::exec::PodWorkers;
use crate::pod::imagegc;
use crate::pod::model;
use crate::pod::plan::admission::NodePressure;
use crate::pod::volume;

/// Upstream's evictionMonitoringPeriod.
pub const MONITORING_PERIOD: Duration = Duration::from_secs(10);
/// How long the node-level reclaim waits at most for what it removed to show as free space
/// (the runtime frees a removed container's writable layer asynchronously).
pub const RECLAIM_SETTLE: Duration = Duration::from_secs(3);
/// How long a round waits at most for an evicted pod's containers and volumes to go
/// (upstream's podCleanupTimeout).
pub const CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the manager reads the node and the pods.
pub struct Manager {
    pub config: Config,
    /// /proc.
    pub proc: PathBuf,
    /// The agent's root dir (nodefs and the pods' volumes).
    pub root_dir: PathBuf,
    /// /var/log/pods.
    pub pod_log_root: PathBuf,
    pub workers: PodWorkers,
    pub cri: Arc<dyn Cri>,
    /// The node health the status loop publishes; the manager owns its pressure fields.
    pub health: Arc<tokio::sync::watch::Sender<Health>>,
    pub clock: Clock,
    pub period: Duration,
    /// The cgroup mount (/sys/fs/cgroup) and the agent's --cgroup-root, where the pods'
    /// cgroups are (their process counts rank pods under PID pressure).
    pub cgroup_fs: PathBuf,
    pub cgroup_root: String,
    /// The image collector shared with the periodic image GC: unused images are removed
    /// before a pod is evicted for disk pressure (None: only the containers of finished pods
    /// are).
    pub image_gc: Option<imagegc::Shared>,
}

/// The image filesystem as the runtime names it (CRI ImageFsInfo), measured by statvfs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageFs {
    pub available: Observation,
    pub inodes_free: Observation,
    /// On a file system of its own, not the node's (the agent's root dir's).
    pub dedicated: bool,
}

impl ImageFs {
    /// statvfs of `mountpoint`; dedicated when its device is not `node_dev`'s.
    pub fn measure(mountpoint: &Path, node_dev: u64) -> Option<ImageFs> {
        let st = nix::sys::statvfs::statvfs(mountpoint).ok()?;
        let dev = std::fs::metadata(mountpoint).ok()?.dev();
        #[allow(clippy::useless_conversion)]
        let frag = u64::from(st.fragment_size());
        #[allow(clippy::useless_conversion)]
        Some(ImageFs {
            available: Observation {
                available: u64::from(st.blocks_available()).saturating_mul(frag),
                capacity: u64::from(st.blocks()).saturating_mul(frag),
            },
            inodes_free: Observation { available: u64::from(st.files_available()), capacity: u64::from(st.files()) },
            dedicated: dev != node_dev,
        })
    }
}

/// What a pod's containers use, from CRI ListContainerStats.
#[derive(Debug, Clone, Copy, Default)]
struct RuntimeUsage {
    working_set: u64,
    layer_bytes: u64,
    layer_inodes: u64,
}

/// The processes (tasks, as upstream's pids.current) in pod `uid`'s cgroup: the unified
/// hierarchy's or the v1 pids controller's `pids.current` of the pod cgroup (cgroupfs layout
/// `<root>/kubepods[/<qos>]/pod<uid>`, systemd layout `kubepods[-<qos>]-pod<uid_>.slice`);
/// without one, the processes listed in `cgroup.procs` through the pod's cgroup tree. 0 when
/// the pod has no cgroup (yet).
pub fn pod_processes(cgroup_fs: &Path, root: &str, uid: &str) -> u64 {
    let rel = root.trim_start_matches('/');
    let slice_uid = uid.replace('-', "_");
    for hierarchy in [cgroup_fs.to_path_buf(), cgroup_fs.join("pids")] {
        let base = if rel.is_empty() { hierarchy.clone() } else { hierarchy.join(rel) };
        let mut candidates = Vec::new();
        for qos in ["", "burstable", "besteffort"] {
            let kubepods = base.join("kubepods");
            candidates.push(if qos.is_empty() { kubepods.join(format!("pod{uid}")) } else { kubepods.join(qos).join(format!("pod{uid}")) });
            let slices = base.join("kubepods.slice");
            candidates.push(if qos.is_empty() {
                slices.join(format!("kubepods-pod{slice_uid}.slice"))
            } else {
                slices.join(format!("kubepods-{qos}.slice")).join(format!("kubepods-{qos}-pod{slice_uid}.slice"))
            });
        }
        if let Some(dir) = candidates.into_iter().find(|d| d.is_dir()) {
            if let Some(n) = std::fs::read_to_string(dir.join("pids.current")).ok().and_then(|t| t.trim().parse().ok()) {
                return n;
            }
            return procs_in_tree(&dir);
        }
    }
    0
}

fn procs_in_tree(dir: &Path) -> u64 {
    let own = std::fs::read_to_string(dir.join("cgroup.procs")).map(|t| t.lines().filter(|l| !l.trim().is_empty()).count() as u64).unwrap_or(0);
    let children: u64 = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| procs_in_tree(&e.path()))
        .sum();
    own.saturating_add(children)
}

/// Bytes (allocated blocks, as `du`) and inodes under `dir` on the file system `dev`
/// (mounts below it, such as a memory-backed emptyDir, are not counted).
pub fn dir_usage(dir: &Path, dev: u64) -> (u64, u64) {
    let Ok(meta) = std::fs::symlink_metadata(dir) else {
        return (0, 0);
    };
    if meta.dev() != dev {
        return (0, 0);
    }
    let (mut bytes, mut inodes) = (meta.blocks().saturating_mul(512), 1u64);
    if meta.is_dir() {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let (b, i) = dir_usage(&entry.path(), dev);
            bytes = bytes.saturating_add(b);
            inodes = inodes.saturating_add(i);
        }
    }
    (bytes, inodes)
}

/// Memory working set and writable-layer bytes and inodes of each pod's running containers,
/// by pod UID.
async fn runtime_usage(cri: &dyn Cri) -> HashMap<String, RuntimeUsage> {
    let selector = HashMap::from([(model::LABEL_MANAGED_BY.to_string(), model::MANAGED_BY.to_string())]);
    let mut out: HashMap<String, RuntimeUsage> = HashMap::new();
    match cri.list_container_stats(selector).await {
        Ok(stats) => {
            for s in stats {
                let Some(uid) = s.attributes.as_ref().and_then(|a| a.labels.get(model::LABEL_POD_UID)).cloned() else {
                    continue;
                };
                let ws = s.memory.and_then(|m| m.working_set_bytes).map_or(0, |v| v.value);
                let layer = s.writable_layer.as_ref().and_then(|w| w.used_bytes.as_ref()).map_or(0, |v| v.value);
                let inodes = s.writable_layer.as_ref().and_then(|w| w.inodes_used.as_ref()).map_or(0, |v| v.value);
                let e = out.entry(uid).or_default();
                e.working_set = e.working_set.saturating_add(ws);
                e.layer_bytes = e.layer_bytes.saturating_add(layer);
                e.layer_inodes = e.layer_inodes.saturating_add(inodes);
            }
        }
        Err(e) => tracing::debug!(error = %e, "container stats unavailable; memory usage counts as 0"),
    }
    out
}

impl Manager {
    /// Runs rounds forever.
    pub async fn run(mut self) {
        // No ranking before every pod of the node is known (a pod listed a moment later could
        // be the one to go, or a finished one whose containers would have been enough).
        self.workers.wait_started().await;
        let mut state = State::default();
        loop {
            let decision = self.round(&mut state).await;
            if let Some(e) = decision.and_then(|d| d.evict) {
                self.wait_for_cleanup(&e.uid).await;
            }
            tokio::time::sleep(self.period).await;
        }
    }

    /// The node's signals now (None when /proc or the root dir cannot be read): /proc, statvfs
    /// of the root dir (nodefs) and of the image filesystem the runtime names (imagefs; left
    /// out while the runtime does not answer), and whether that one is dedicated.
    async fn observe(&self, node_dev: u64) -> Option<(Observations, bool)> {
        let mut obs = crate::node::Signals::read(&self.proc, &self.root_dir).map(|s| s.observations())?;
        let image_fs = match self.cri.image_fs_info().await {
            Ok(list) => list
                .first()
                .and_then(|f| f.fs_id.as_ref())
                .and_then(|id| ImageFs::measure(Path::new(&id.mountpoint), node_dev)),
            Err(e) => {
                tracing::debug!(error = %e, "image filesystem unknown; imagefs signals not observed");
                None
            }
        };
        let dedicated = image_fs.is_some_and(|f| f.dedicated);
        if let Some(f) = image_fs {
            obs.insert(Signal::ImagefsAvailable, f.available);
            obs.insert(Signal::ImagefsInodesFree, f.inodes_free);
        }
        Some((obs, dedicated))
    }

    /// One round: observe, decide, publish the conditions, reclaim unused images first when
    /// the signal is a disk one, evict at most one pod.
    pub async fn round(&mut self, state: &mut State) -> Option<Decision> {
        let dev = std::fs::metadata(&self.root_dir).map(|m| m.dev()).ok()?;
        let (obs, dedicated) = self.observe(dev).await?;
        let pods = self.workers.active_pods();
        let runtime = runtime_usage(self.cri.as_ref()).await;
        let mut obs = obs;
        if self.config.hard.contains_key(&Signal::AllocatableMemoryAvailable) || self.config.soft.contains_key(&Signal::AllocatableMemoryAvailable) {
            let pods_working_set = runtime.values().fold(0u64, |n, r| n.saturating_add(r.working_set));
            let allocatable = u64::try_from(self.workers.allocatable_memory()).unwrap_or(0);
            obs.insert(Signal::AllocatableMemoryAvailable, plan::allocatable_memory(allocatable, pods_working_set));
        }
        let usages: Vec<PodUsage> = pods.iter().map(|p| self.usage(p, &runtime, dev, dedicated)).collect();
        let mut d = plan::decide(&self.config, state, &obs, &usages, self.clock.now_ns());
        let pressure = NodePressure { memory: d.memory_pressure, disk: d.disk_pressure, pid: d.pid_pressure };
        self.workers.set_pressure(pressure);
        self.health.send_if_modified(|h| {
            let changed = (h.memory_pressure, h.disk_pressure, h.pid_pressure) != (pressure.memory, pressure.disk, pressure.pid);
            if changed {
                tracing::info!(memory = pressure.memory, disk = pressure.disk, pid = pressure.pid, met = ?d.met.iter().map(|(s, hard)| format!("{}{}", s.as_str(), if *hard { "" } else { " (soft)" })).collect::<Vec<_>>(), "node pressure changed");
                h.memory_pressure = pressure.memory;
                h.disk_pressure = pressure.disk;
                h.pid_pressure = pressure.pid;
            }
            changed
        });
        if let Some(signal) = d.reclaim {
            // As upstream: relieved by the node-level reclaim, no pod is evicted this round.
            let resource = signal.resource();
            if self.reclaim_node_level(signal, dedicated, dev, resource).await {
                tracing::info!(signal = signal.as_str(), resource, "able to reduce resource pressure without evicting pods");
                d.evict = None;
            }
        }
        if let Some(e) = &d.evict {
            tracing::warn!(pod = %format!("{}/{}", e.namespace, e.name), signal = e.signal.as_str(), "eviction threshold met");
            self.workers.evict(&e.uid, &e.message, e.grace_seconds);
        }
        Some(d)
    }

    /// Upstream's reclaimNodeLevelResources for `signal`: removes the containers of finished
    /// pods, then the unused images (on a dedicated image filesystem the nodefs signals remove
    /// containers only: images are not on that file system), observes again and says whether
    /// `resource` is no longer starved.
    async fn reclaim_node_level(&self, signal: Signal, dedicated: bool, dev: u64, resource: &str) -> bool {
        match self.workers.remove_dead_containers().await {
            Ok(removed) => tracing::info!(signal = signal.as_str(), removed, "node-level reclaim: containers of finished pods removed"),
            Err(e) => {
                tracing::warn!(signal = signal.as_str(), error = %e, "node-level reclaim of containers failed");
                return false;
            }
        }
        let images = !dedicated || matches!(signal, Signal::ImagefsAvailable | Signal::ImagefsInodesFree);
        if let Some(gc) = self.image_gc.as_ref().filter(|_| images) {
            match gc.lock().await.delete_unused().await {
                Ok(freed) => tracing::info!(signal = signal.as_str(), freed, "node-level reclaim: unused images removed"),
                Err(e) => {
                    tracing::warn!(signal = signal.as_str(), error = %e, "node-level reclaim of images failed");
                    return false;
                }
            }
        }
        // What a removed container held is freed by the runtime's garbage collection a moment
        // later (containerd removes a snapshot's files after the call returns): observed again
        // until relieved, for a short while, before a pod pays for it.
        let settle = tokio::time::Instant::now() + RECLAIM_SETTLE;
        loop {
            let Some((obs, _)) = self.observe(dev).await else { return false };
            if !plan::starved(&self.config, &obs, resource) {
                return true;
            }
            if tokio::time::Instant::now() >= settle {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn usage<'a>(&self, pod: &'a Pod, runtime: &HashMap<String, RuntimeUsage>, dev: u64, dedicated: bool) -> PodUsage<'a> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let r = runtime.get(&uid).copied().unwrap_or_default();
        // Disk: the pod's volumes on the node's file system (emptyDirs) and its logs.
        let (vb, vi) = dir_usage(&volume::pod_dir(&self.root_dir, &uid).join("volumes"), dev);
        let logs = self.pod_log_root.join(format!(
            "{}_{}_{uid}",
            pod.metadata.namespace.as_deref().unwrap_or("default"),
            pod.metadata.name.as_deref().unwrap_or("")
        ));
        let (lb, li) = dir_usage(&logs, dev);
        let processes = pod_processes(&self.cgroup_fs, &self.cgroup_root, &uid);
        // Upstream's ranking: on a dedicated image filesystem nodefs counts volumes and logs,
        // imagefs the writable layers; on a shared one both count everything.
        let (local, local_inodes) = (vb.saturating_add(lb), vi.saturating_add(li));
        let (disk, inodes, imagefs_disk, imagefs_inodes) = if dedicated {
            (local, local_inodes, r.layer_bytes, r.layer_inodes)
        } else {
            let all = local.saturating_add(r.layer_bytes);
            let all_inodes = local_inodes.saturating_add(r.layer_inodes);
            (all, all_inodes, all, all_inodes)
        };
        PodUsage { pod, memory: r.working_set, disk, inodes, imagefs_disk, imagefs_inodes, processes }
    }

    /// After an eviction: until the pod's containers have stopped and its volumes are released,
    /// at most [`CLEANUP_TIMEOUT`] (upstream's waitForPodsCleanup).
    async fn wait_for_cleanup(&self, uid: &str) {
        let deadline = tokio::time::Instant::now() + CLEANUP_TIMEOUT;
        let volumes = volume::pod_dir(&self.root_dir, uid).join("volumes");
        while tokio::time::Instant::now() < deadline {
            let running = self.workers.running_containers(uid);
            if running == 0 && !volumes.exists() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        tracing::warn!(uid, "the evicted pod was not cleaned up within 30 s");
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    #[test]
    fn pod_processes_from_pids_current_or_the_procs_of_the_tree() {
        let fs = tempfile::tempdir().unwrap();
        let c = fs.path();
        // unified hierarchy, cgroupfs layout under a cgroup root, pids controller on
        write(&c.join("lab/kubepods/burstable/poda-1/pids.current"), "23\n");
        write(&c.join("lab/kubepods/burstable/poda-1/ctr/cgroup.procs"), "1\n2\n");
        assert_eq!(pod_processes(c, "/lab", "a-1"), 23);
        // no pids.current: the processes of every cgroup below the pod's
        write(&c.join("lab/kubepods/podb-2/cgroup.procs"), "");
        write(&c.join("lab/kubepods/podb-2/sandbox/cgroup.procs"), "10\n");
        write(&c.join("lab/kubepods/podb-2/app/cgroup.procs"), "11\n12\n13\n");
        assert_eq!(pod_processes(c, "/lab", "b-2"), 4);
        // systemd layout, no cgroup root
        write(&c.join("kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podc_3.slice/pids.current"), "7");
        assert_eq!(pod_processes(c, "", "c-3"), 7);
        // v1: the pids controller's hierarchy
        write(&c.join("pids/kubepods/podd-4/pids.current"), "5");
        assert_eq!(pod_processes(c, "", "d-4"), 5);
        // a pod without a cgroup
        assert_eq!(pod_processes(c, "/lab", "gone"), 0);
    }
}
