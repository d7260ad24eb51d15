//! Resource usage of the node and its pods, as the kubelet serves it on :10250:
//! `/stats/summary` (the Summary API) and `/metrics/resource` (what metrics-server and
//! ferro-control-plane's metrics.k8s.io scrape).
//!
//! - [`model`]: the Summary API's model and the pure step from CRI answers to pods.
//! - [`host`]: the node from /proc and the root cgroup (pure parsers, paths passed in).
//! - [`render`]: the Prometheus text and the Summary JSON (pure).
//! - [`Provider`]: one collection per request: ListPodSandbox, ListContainers,
//!   ListContainerStats and ListPodSandboxStats through the [`Cri`] trait (containerd
//!   computes the containers' nanocores), the node's files, statvfs of the file systems.
//!   It keeps the node's previous CPU sample to give the node's nanocores.

pub mod host;
pub mod model;
pub mod render;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;

use crate::cri::{api, Cri};
use crate::pod::model as pod_model;
use model::{FsStats, NodeStats, RlimitStats, Summary};

/// Where the provider reads the node.
#[derive(Debug, Clone)]
pub struct StatsConfig {
    pub node_name: String,
    /// /proc
    pub proc_root: PathBuf,
    /// The cgroup mount (/sys/fs/cgroup).
    pub cgroup_root: PathBuf,
    /// The agent's root dir: its file system is the node's `fs`.
    pub root_dir: PathBuf,
    /// /var/log/pods: the containers' `logs`.
    pub pod_log_root: PathBuf,
}

/// Collects [`Summary`]s.
pub struct Provider {
    cfg: StatsConfig,
    cri: Arc<dyn Cri>,
    /// The node's last (time, cumulative CPU) sample.
    last_node_cpu: Mutex<Option<(i64, u64)>>,
}

fn statvfs(path: &Path, time_ns: i64) -> Option<FsStats> {
    let st = nix::sys::statvfs::statvfs(path).ok()?;
    #[allow(clippy::useless_conversion)]
    let frag = u64::from(st.fragment_size());
    #[allow(clippy::useless_conversion)]
    let (blocks, avail, free) = (u64::from(st.blocks()), u64::from(st.blocks_available()), u64::from(st.blocks_free()));
    #[allow(clippy::useless_conversion)]
    let (files, files_free) = (u64::from(st.files()), u64::from(st.files_free()));
    Some(FsStats {
        time_ns,
        available_bytes: Some(avail.saturating_mul(frag)),
        capacity_bytes: Some(blocks.saturating_mul(frag)),
        used_bytes: Some(blocks.saturating_sub(free).saturating_mul(frag)),
        inodes_free: Some(files_free),
        inodes: Some(files),
        inodes_used: Some(files.saturating_sub(files_free)),
    })
}

fn now_ns() -> i64 {
    i64::try_from(jiff::Timestamp::now().as_nanosecond()).unwrap_or(0)
}

impl Provider {
    pub fn new(cfg: StatsConfig, cri: Arc<dyn Cri>) -> Provider {
        Provider { cfg, cri, last_node_cpu: Mutex::new(None) }
    }

    /// One collection. `pods` are the pod objects the agent runs (for their claims' volumes),
    /// `claims` the claims' last volume stats.
    pub async fn collect(&self, pods: &[Pod], claims: &[crate::csi::mounter::VolumeStats]) -> Summary {
        let selector = HashMap::from([(pod_model::LABEL_MANAGED_BY.to_string(), pod_model::MANAGED_BY.to_string())]);
        let mut error = false;
        let mut fail = |what: &str, e: &crate::cri::CriError| {
            tracing::warn!(error = %e, "{what} failed; the resource metrics are incomplete");
            error = true;
        };
        let cri = self.cri.as_ref();
        let (sandboxes, containers, container_stats, sandbox_stats, image_fs) = tokio::join!(
            cri.list_sandboxes(selector.clone()),
            cri.list_containers(selector.clone()),
            cri.list_container_stats(selector.clone()),
            cri.list_pod_sandbox_stats(selector),
            cri.image_fs_info(),
        );
        let mut view = model::CriView::default();
        match sandboxes {
            Ok(s) => view.sandboxes = s,
            Err(e) => fail("ListPodSandbox", &e),
        }
        match containers {
            Ok(c) => view.containers = c,
            Err(e) => fail("ListContainers", &e),
        }
        match container_stats {
            Ok(c) => view.container_stats = c,
            Err(e) => fail("ListContainerStats", &e),
        }
        match sandbox_stats {
            Ok(s) => view.sandbox_stats = Some(s),
            Err(e) if e.code() == Some(tonic::Code::Unimplemented) => {}
            Err(e) => fail("ListPodSandboxStats", &e),
        }
        let image_fs = match image_fs {
            Ok(fs) => fs,
            Err(e) => {
                tracing::debug!(error = %e, "ImageFsInfo failed; no imageFs in the summary");
                Vec::new()
            }
        };
        let now = now_ns();
        let claim_volumes = model::claim_volumes(pods, claims, now);
        let cfg = self.cfg.clone();
        let files = tokio::task::spawn_blocking(move || {
            let pods = model::pods_from_cri(&view);
            let host = host::read(&cfg.proc_root, &cfg.cgroup_root, now);
            (with_files(&cfg, pods, &image_fs, now), host, image_fs_stats(&image_fs, now), node_fs(&cfg, now))
        })
        .await;
        let Ok((mut pod_stats, host, image_fs, (fs, rlimit))) = files else {
            return Summary { node: NodeStats { node_name: self.cfg.node_name.clone(), ..Default::default() }, pods: Vec::new(), error: true };
        };
        for p in &mut pod_stats {
            if let Some(v) = claim_volumes.get(&p.uid) {
                p.volumes = v.clone();
            }
        }
        let mut cpu = host.cpu;
        if let Some(c) = cpu.as_mut() {
            if let (Some(total), Ok(mut last)) = (c.usage_core_nano_seconds, self.last_node_cpu.lock()) {
                let prev = *last;
                c.usage_nano_cores = prev.and_then(|prev| host::nano_cores(prev, (c.time_ns, total)));
                *last = Some((c.time_ns, total));
            }
        }
        if host.cpu.is_none() || host.memory.is_none() {
            error = true;
        }
        Summary {
            node: NodeStats {
                node_name: self.cfg.node_name.clone(),
                start_time_ns: host.start_time_ns,
                cpu,
                memory: host.memory,
                network: host.network,
                fs,
                image_fs,
                rlimit,
            },
            pods: pod_stats,
            error,
        }
    }
}

/// The containers' log directories and writable layers' file systems, and the pods'
/// ephemeral storage (blocking: directory walks and statvfs).
fn with_files(cfg: &StatsConfig, mut pods: Vec<model::PodStats>, image_fs: &[api::FilesystemUsage], now: i64) -> Vec<model::PodStats> {
    use std::os::unix::fs::MetadataExt as _;
    let logs_fs = statvfs(&cfg.pod_log_root, now);
    let logs_dev = std::fs::metadata(&cfg.pod_log_root).map(|m| m.dev()).ok();
    let layer_fs = image_fs.first().and_then(|f| f.fs_id.as_ref()).and_then(|id| statvfs(Path::new(&id.mountpoint), now));
    for p in &mut pods {
        let dir = cfg.pod_log_root.join(format!("{}_{}_{}", p.namespace, p.name, p.uid));
        for c in &mut p.containers {
            if let (Some(dev), Some(fs)) = (logs_dev, logs_fs) {
                let (bytes, inodes) = crate::eviction::run::dir_usage(&dir.join(&c.name), dev);
                c.logs = Some(FsStats { used_bytes: Some(bytes), inodes_used: Some(inodes), ..fs });
            }
            if let (Some(rootfs), Some(fs)) = (c.rootfs.as_mut(), layer_fs) {
                rootfs.capacity_bytes = fs.capacity_bytes;
                rootfs.available_bytes = fs.available_bytes;
                rootfs.inodes = fs.inodes;
                rootfs.inodes_free = fs.inodes_free;
            }
        }
        p.ephemeral_storage = model::ephemeral_of(&p.containers);
    }
    pods
}

/// The runtime's image file system: its usage from ImageFsInfo, its size from statvfs.
fn image_fs_stats(image_fs: &[api::FilesystemUsage], now: i64) -> Option<FsStats> {
    let f = image_fs.first()?;
    let mut fs = f.fs_id.as_ref().and_then(|id| statvfs(Path::new(&id.mountpoint), now)).unwrap_or(FsStats { time_ns: now, ..Default::default() });
    fs.used_bytes = f.used_bytes.as_ref().map(|v| v.value);
    fs.inodes_used = f.inodes_used.as_ref().map(|v| v.value).or(fs.inodes_used);
    Some(fs)
}

/// The node file system (of the root dir) and the process limits.
fn node_fs(cfg: &StatsConfig, now: i64) -> (Option<FsStats>, Option<RlimitStats>) {
    let fs = statvfs(&cfg.root_dir, now);
    let read = |p: &str| std::fs::read_to_string(cfg.proc_root.join(p)).ok();
    let rlimit = match (read("sys/kernel/pid_max"), read("loadavg")) {
        (Some(max), Some(load)) => crate::node::parse_pids(&max, &load)
            .map(|(max, procs)| RlimitStats { time_ns: now, max_pid: Some(max), num_of_running_processes: Some(procs) }),
        _ => None,
    };
    (fs, rlimit)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::clock::Clock;
    use crate::cri::fake::FakeCri;

    #[tokio::test]
    async fn collects_through_the_runtime() {
        let dir = tempfile::tempdir().unwrap();
        let fake = Arc::new(FakeCri::new(Clock::System));
        let cfg = StatsConfig {
            node_name: "node-a".into(),
            proc_root: PathBuf::from("/proc"),
            cgroup_root: dir.path().join("no-cgroup"),
            root_dir: dir.path().to_path_buf(),
            pod_log_root: dir.path().join("logs"),
        };
        let p = Provider::new(cfg, fake.clone());
        let s = p.collect(&[], &[]).await;
        assert!(!s.error, "an empty runtime and a readable /proc are no error");
        assert!(s.pods.is_empty());
        assert_eq!(s.node.node_name, "node-a");
        let cpu = s.node.cpu.unwrap();
        assert!(cpu.usage_core_nano_seconds.unwrap() > 0);
        assert_eq!(cpu.usage_nano_cores, None, "no previous sample yet");
        assert!(s.node.memory.unwrap().working_set_bytes.unwrap() > 0);
        assert!(s.node.fs.unwrap().capacity_bytes.unwrap() > 0);
        assert!(s.node.rlimit.unwrap().max_pid.unwrap() > 0);
        // The second collection has the node's rate.
        let s = p.collect(&[], &[]).await;
        assert!(s.node.cpu.unwrap().usage_nano_cores.is_some());

        // A pod the runtime runs: its container's CPU and memory; the pod's the sum of its
        // containers' (the fake has no ListPodSandboxStats).
        let labels = HashMap::from([(pod_model::LABEL_MANAGED_BY.to_string(), pod_model::MANAGED_BY.to_string())]);
        let sb_cfg = api::PodSandboxConfig {
            metadata: Some(api::PodSandboxMetadata { name: "web".into(), uid: "u1".into(), namespace: "ns".into(), attempt: 0 }),
            labels: labels.clone(),
            ..Default::default()
        };
        fake.add_image("busybox");
        let sb = fake.run_sandbox(sb_cfg.clone()).await.unwrap();
        let c_cfg = api::ContainerConfig {
            metadata: Some(api::ContainerMetadata { name: "app".into(), attempt: 0 }),
            image: Some(api::ImageSpec { image: "busybox".into(), ..Default::default() }),
            labels,
            ..Default::default()
        };
        let c = fake.create_container(&sb, c_cfg, sb_cfg).await.unwrap();
        fake.start_container(&c).await.unwrap();
        fake.set_cpu("app", 5_000_000_000);
        fake.set_usage("app", 1 << 20, 4096);
        let s = p.collect(&[], &[]).await;
        assert!(!s.error);
        assert_eq!(s.pods.len(), 1);
        let pod = &s.pods[0];
        assert_eq!((pod.namespace.as_str(), pod.name.as_str(), pod.uid.as_str()), ("ns", "web", "u1"));
        assert_eq!(pod.containers[0].cpu.unwrap().usage_core_nano_seconds, Some(5_000_000_000));
        assert_eq!(pod.containers[0].rootfs.unwrap().used_bytes, Some(4096));
        assert_eq!(pod.memory.unwrap().working_set_bytes, Some(1 << 20));
        assert_eq!(pod.ephemeral_storage.unwrap().used_bytes, Some(4096), "no log dir: the writable layer");
        let text = render::resource_metrics(&s);
        assert!(text.contains("container_cpu_usage_seconds_total{container=\"app\",namespace=\"ns\",pod=\"web\"} 5 "), "{text}");
    }
}
