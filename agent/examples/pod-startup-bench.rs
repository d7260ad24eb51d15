//! Pod startup latency and the agent's footprint, in the lab (root; the same one-node cluster
//! as agent/tests/pods.rs: ferro-control-plane, containerd 1.6 + runc, ferro-cni, ferro-agent).
//!
//!   cargo build --release --workspace --all-targets
//!   ./target/release/examples/pod-startup-bench [--pods 30] [--idle-seconds 20] [--rounds R]
//!       [--oci-runtime /usr/bin/crun] [--agent-log info,ferro_agent=debug] [--lab-fs ext4]
//!
//! `--lab-fs ext4` puts the whole lab (the agent's root and pod log dirs, containerd's root and
//! state, the control plane's data) on a fresh ext4 made with mkfs.ext4's defaults (with a
//! journal, as Debian installs its root), loop-mounted under /var/tmp and removed at the end;
//! without it the lab lives in $TMPDIR (/tmp) on whatever this machine has there. The choice
//! matters on an ext4 without a journal: its inode allocator skips, one by one, the inodes
//! freed in the last seconds (minutes while their inode table block is dirty), so every
//! directory and file a pod start creates costs more after each round of deleted pods.
//!
//! `--oci-runtime` makes containerd's runc shim run another OCI runtime binary (its
//! `BinaryName` option) instead of runc. The agent logs at info, as installed, unless
//! `--agent-log` gives another RUST_LOG filter.
//!
//! The floor: first, in the same lab, the same N pods are created straight through CRI by this
//! program (RunPodSandbox, CreateContainer, StartContainer per pod, all N at once, image
//! present, the same containerd and CNI), without API server or agent; their latencies (from
//! the first call to StartContainer's answer) are what the runtime alone costs on this machine.
//! ferro's figures are then put next to them as ratios, and each ferro pod's path is broken
//! down (created -> scheduled -> the agent has the pod -> first CRI call -> container started ->
//! status observed) from the watch and the agent's log.
//!
//! Latency follows the upstream SLI: from the pod's creation to the watch observing all its
//! containers started (image already present). creationTimestamp has a resolution of one
//! second, so the start is taken on the client, right before the create request is sent; the
//! pods are created concurrently (a burst); `--rounds R` repeats the ferro burst R times and
//! prints each round's figures with their medians. Footprint: the agent's RSS (VmRSS) and its CPU
//! (utime + stime from /proc/<pid>/stat) over an idle window, with 0 and with N pods running.
#![allow(clippy::unwrap_used)]

#[path = "../tests/lab/mod.rs"]
mod lab;

#[path = "bench_util/mod.rs"]
mod bench_util;

use bench_util::{arg, cpu_ticks, in_netns, pct};

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_cri::v1 as api;

use futures::{FutureExt as _, StreamExt as _};
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;

fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// The agent's (the nsenter child's) pid: nsenter execs the agent, so the pid is the agent's.
fn footprint(pid: u32, window: Duration) -> (u64, f64) {
    let ticks_per_s = 100.0; // USER_HZ on Linux
    let t0 = cpu_ticks(pid);
    let start = Instant::now();
    ferro_lab::interrupt::sleep(window);
    let used = (cpu_ticks(pid) - t0) as f64 / ticks_per_s;
    (rss_kib(pid), 100.0 * used / start.elapsed().as_secs_f64())
}

fn all_started(p: &Pod) -> bool {
    let Some(st) = p.status.as_ref() else { return false };
    let n = p.spec.as_ref().map(|s| s.containers.len()).unwrap_or(0);
    let cs = st.container_statuses.as_deref().unwrap_or_default();
    cs.len() == n && cs.iter().all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
}

fn unix_ns(t: SystemTime) -> i64 {
    i64::try_from(t.duration_since(UNIX_EPOCH).unwrap().as_nanos()).unwrap()
}

/// The floor: `n` pods straight through CRI at once (sandbox, container, start each), timed
/// from the first call to StartContainer's answer; then removed.
async fn floor(socket: PathBuf, n: usize, cgroup_root: String, logs: PathBuf) -> Vec<f64> {
    let (rt, _) = ferro_lab::cri::connect(&socket).await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..n {
        let mut rt = rt.clone();
        let (cgroup_root, logs) = (cgroup_root.clone(), logs.clone());
        tasks.push(tokio::spawn(async move {
            let t0 = Instant::now();
            let sandbox_config = api::PodSandboxConfig {
                metadata: Some(api::PodSandboxMetadata {
                    name: format!("floor-{i}"),
                    uid: format!("f100{i:04}-0000-4000-8000-000000000000"),
                    namespace: "floor".into(),
                    attempt: 0,
                }),
                hostname: format!("floor-{i}"),
                log_directory: logs.join(format!("floor-{i}")).display().to_string(),
                linux: Some(api::LinuxPodSandboxConfig {
                    cgroup_parent: format!("{cgroup_root}/floor/pod{i}"),
                    ..Default::default()
                }),
                ..Default::default()
            };
            let sandbox = rt
                .run_pod_sandbox(api::RunPodSandboxRequest { config: Some(sandbox_config.clone()), runtime_handler: String::new() })
                .await
                .unwrap()
                .into_inner()
                .pod_sandbox_id;
            let container = rt
                .create_container(api::CreateContainerRequest {
                    pod_sandbox_id: sandbox.clone(),
                    config: Some(api::ContainerConfig {
                        metadata: Some(api::ContainerMetadata { name: "app".into(), attempt: 0 }),
                        image: Some(api::ImageSpec { image: lab::BUSYBOX.into(), ..Default::default() }),
                        command: vec!["sleep".into(), "3600".into()],
                        log_path: "app/0.log".into(),
                        linux: Some(api::LinuxContainerConfig::default()),
                        ..Default::default()
                    }),
                    sandbox_config: Some(sandbox_config),
                })
                .await
                .unwrap()
                .into_inner()
                .container_id;
            rt.start_container(api::StartContainerRequest { container_id: container }).await.unwrap();
            (t0.elapsed().as_secs_f64(), sandbox)
        }));
    }
    latencies_then_remove(rt, tasks).await
}

/// Each floor pod's latency (sorted) once all have started; then their sandboxes are removed.
async fn latencies_then_remove(
    mut rt: api::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>,
    tasks: Vec<tokio::task::JoinHandle<(f64, String)>>,
) -> Vec<f64> {
    let mut out = Vec::new();
    let mut sandboxes = Vec::new();
    for t in tasks {
        let (l, sb) = t.await.unwrap();
        out.push(l);
        sandboxes.push(sb);
    }
    for sb in sandboxes {
        rt.stop_pod_sandbox(api::StopPodSandboxRequest { pod_sandbox_id: sb.clone() }).await.unwrap();
        rt.remove_pod_sandbox(api::RemovePodSandboxRequest { pod_sandbox_id: sb }).await.unwrap();
    }
    out.sort_by(|a, b| a.partial_cmp(b).unwrap());
    out
}

/// The floor again with the pods ferro runs: the same Pod objects as the API admitted them
/// (the ServiceAccount's projected token volume included), and the sandbox and container
/// configs the agent makes of them (`ferro_agent::pod::spec`: DNS, hostname, labels and
/// annotations, cgroup parent, the environment with the service links, /etc/hosts, the
/// termination-log file and the volume's bind mount, the security context); the CRI calls the
/// configs need are made too (PodSandboxStatus for the pod IP /etc/hosts names; one
/// ImageStatus for the image's user, before the clock starts). Timed as [`floor`].
async fn floor_as_agent(socket: PathBuf, pods: Vec<Pod>, services: Vec<k8s_openapi::api::core::v1::Service>, cgroup_root: String, dir: PathBuf) -> Vec<f64> {
    use ferro_agent::pod::spec;
    let (rt, image_client) = ferro_lab::cri::connect(&socket).await.unwrap();
    let image = {
        let mut ic = image_client.clone();
        ic.image_status(api::ImageStatusRequest { image: Some(api::ImageSpec { image: lab::BUSYBOX.into(), ..Default::default() }), verbose: false })
            .await
            .unwrap()
            .into_inner()
            .image
    };
    let image_user = spec::ImageUser::of(image.as_ref());
    let ctx = spec::NodeContext {
        node_name: lab::NODE.into(),
        host_ips: vec![lab::API_ADDRESS.into()],
        cluster_dns: Vec::new(),
        cluster_domain: "cluster.local".into(),
        cgroup_driver: spec::CgroupDriver::Cgroupfs,
        pod_log_root: dir.join("logs"),
        allocatable_cpu_milli: 2000,
        allocatable_memory: 4 << 30,
        memory_capacity: 4 << 30,
    };
    let objects = ferro_agent::pod::model::Objects { services, ..Default::default() };
    let mut tasks = Vec::new();
    for pod in pods {
        let (mut rt, ctx, objects, image_user, cgroup_root, dir) =
            (rt.clone(), ctx.clone(), objects.clone(), image_user.clone(), cgroup_root.clone(), dir.clone());
        tasks.push(tokio::spawn(async move {
            let t0 = Instant::now();
            let uid = pod.metadata.uid.clone().unwrap();
            let pod_dir = dir.join("pods").join(&uid);
            // The pod's volumes as the agent lays them out (content does not matter to the
            // runtime: a bind mount of a directory of three files).
            let mut vols = BTreeMap::new();
            for v in pod.spec.as_ref().unwrap().volumes.iter().flatten() {
                let path = pod_dir.join("volumes").join(&v.name);
                std::fs::create_dir_all(&path).unwrap();
                for f in ["token", "ca.crt", "namespace"] {
                    std::fs::write(path.join(f), "x").unwrap();
                }
                vols.insert(v.name.clone(), spec::VolumePath { host_path: path, read_only: v.projected.is_some() });
            }
            let mut sandbox_config = spec::sandbox_config(&pod, 0, &ctx).unwrap();
            // Without the agent's own label: the lab's agent would stop these as not its pods'.
            sandbox_config.labels.remove(ferro_agent::pod::model::LABEL_MANAGED_BY);
            if let Some(l) = sandbox_config.linux.as_mut() {
                l.cgroup_parent = format!("{cgroup_root}{}", l.cgroup_parent);
            }
            std::fs::create_dir_all(spec::pod_log_dir(&pod, &ctx)).unwrap();
            let sandbox = rt
                .run_pod_sandbox(api::RunPodSandboxRequest { config: Some(sandbox_config.clone()), runtime_handler: String::new() })
                .await
                .unwrap()
                .into_inner()
                .pod_sandbox_id;
            let status = rt
                .pod_sandbox_status(api::PodSandboxStatusRequest { pod_sandbox_id: sandbox.clone(), verbose: false })
                .await
                .unwrap()
                .into_inner();
            let ips: Vec<String> = status.status.and_then(|s| s.network).map(|n| vec![n.ip]).unwrap_or_default();
            let hosts = pod_dir.join("etc-hosts");
            std::fs::write(&hosts, spec::hosts_file(&pod, &ips, &ctx)).unwrap();
            let c = &pod.spec.as_ref().unwrap().containers[0];
            let env = spec::resolve_env(&pod, c, &objects, &ips, &ctx).unwrap();
            let term = pod_dir.join("containers").join(&c.name);
            std::fs::create_dir_all(&term).unwrap();
            let term = term.join("0");
            std::fs::write(&term, b"").unwrap();
            let mounts = spec::container_mounts(c, &vols, &env, Some(&hosts), Some(&term)).unwrap();
            let hash = ferro_agent::pod::plan::container_hash(c);
            let mut config = spec::container_config(&pod, c, ferro_agent::pod::model::ContainerKind::App, 0, 0, hash, env, mounts, &image_user, &ctx).unwrap();
            config.labels.remove(ferro_agent::pod::model::LABEL_MANAGED_BY);
            let container = rt
                .create_container(api::CreateContainerRequest { pod_sandbox_id: sandbox.clone(), config: Some(config), sandbox_config: Some(sandbox_config) })
                .await
                .unwrap()
                .into_inner()
                .container_id;
            rt.start_container(api::StartContainerRequest { container_id: container }).await.unwrap();
            (t0.elapsed().as_secs_f64(), sandbox)
        }));
    }
    latencies_then_remove(rt, tasks).await
}

/// A fresh ext4 (mkfs.ext4's defaults: with a journal) on a loop device, mounted in a scratch
/// dir under /var/tmp and made $TMPDIR, where every lab dir is created. Dropping the scratch
/// unmounts it, detaches the loop device and removes the dir, also after a panic.
fn lab_fs_ext4() -> ferro_lab::storage::Scratch {
    let scratch = ferro_lab::storage::Scratch::new("ferro-bench-fs-").unwrap();
    let (img, mnt) = (scratch.path().join("fs.img"), scratch.path().join("mnt"));
    std::fs::File::create(&img).unwrap().set_len(16 << 30).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    let run = |cmd: &mut std::process::Command| {
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    run(std::process::Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&img));
    run(std::process::Command::new("mount").args(["-o", "loop"]).arg(&img).arg(&mnt));
    std::fs::set_permissions(&mnt, std::os::unix::fs::PermissionsExt::from_mode(0o1777)).unwrap();
    // Set at the start of main, before this program starts any thread.
    std::env::set_var("TMPDIR", &mnt);
    scratch
}

/// The type of the filesystem holding `path`, and whether an ext4 there has a journal.
fn fs_of(path: &std::path::Path) -> String {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mounts") else { return "unknown".into() };
    let Some((dev, fstype)) = mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f.len() > 2 && path.starts_with(f[1])).then(|| (f[1].len(), f[0], f[2]))
        })
        .max_by_key(|(len, _, _)| *len)
        .map(|(_, dev, fstype)| (dev, fstype))
    else {
        return "unknown".into();
    };
    if fstype != "ext4" {
        return fstype.to_string();
    }
    // jbd2 lists a journal of its own (/proc/fs/jbd2/<dev>-<inode>) only for an ext4 with one.
    let name = dev.trim_start_matches("/dev/");
    let journaled = std::fs::read_dir("/proc/fs/jbd2")
        .map(|d| d.flatten().any(|e| e.file_name().to_string_lossy().starts_with(&format!("{name}-"))))
        .unwrap_or(false);
    format!("ext4, {}", if journaled { "with a journal" } else { "without a journal" })
}

/// CLOCK_MONOTONIC in seconds: the clock `perf record -k CLOCK_MONOTONIC` stamps samples with.
fn monotonic() -> f64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).unwrap();
    t.tv_sec() as f64 + t.tv_nsec() as f64 / 1e9
}

/// With FERRO_BENCH_WINDOWS set, a burst's window on CLOCK_MONOTONIC goes to stderr, to cut a
/// profile of the agent (`perf record -k CLOCK_MONOTONIC -p <agent>`) down to the bursts.
fn window(start: f64) {
    if std::env::var_os("FERRO_BENCH_WINDOWS").is_some() {
        eprintln!("burst window (CLOCK_MONOTONIC): {start:.6} {:.6}", monotonic());
    }
}

/// The burst's pod `name` (ferro's pods and the agent-config floor's are the same).
fn bench_pod(name: &str, node: Option<&str>) -> Pod {
    let mut spec = serde_json::json!({"terminationGracePeriodSeconds": 1, "containers": [{"name": "app", "image": lab::BUSYBOX, "command": ["sleep", "3600"]}]});
    if let Some(n) = node {
        spec["nodeName"] = serde_json::json!(n);
    }
    serde_json::from_value(serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})).unwrap()
}

/// What the client saw of one pod (Unix ns).
#[derive(Debug, Default, Clone)]
struct Seen {
    created: i64,
    scheduled: Option<i64>,
    started: Option<i64>,
}

/// The time (Unix ns) of the agent's first log line with `message` about pod `default/<name>`,
/// for every pod (ANSI colours stripped).
fn agent_times(log: &str, message: &str) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    for raw in log.lines() {
        let mut line = String::with_capacity(raw.len());
        let mut chars = raw.chars();
        while let Some(c) = chars.next() {
            if c == '\u{1b}' {
                for d in chars.by_ref() {
                    if d == 'm' {
                        break;
                    }
                }
            } else {
                line.push(c);
            }
        }
        if !line.contains(message) {
            continue;
        }
        let Some(pod) = line.split_whitespace().find_map(|w| w.strip_prefix("pod=default/")) else { continue };
        let Some(ts) = line.split_whitespace().next().and_then(|t| t.parse::<jiff::Timestamp>().ok()) else { continue };
        let ns = i64::try_from(ts.as_nanosecond()).unwrap();
        out.entry(pod.to_string()).or_insert(ns);
    }
    out
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    pct(&v, 50.0)
}

async fn burst(client: kube::Client, n: usize) -> (Vec<f64>, BTreeMap<String, Seen>) {
    let pods: kube::Api<Pod> = kube::Api::namespaced(client.clone(), "default");
    let mut stream = watcher::watcher(pods.clone(), watcher::Config::default()).boxed();
    // Wait until the watch is established (the initial list is done).
    while let Some(ev) = stream.next().await {
        if matches!(ev, Ok(watcher::Event::InitDone)) {
            break;
        }
    }
    let mut created: BTreeMap<String, Instant> = BTreeMap::new();
    let mut seen: BTreeMap<String, Seen> = BTreeMap::new();
    let mut tasks = Vec::new();
    for i in 0..n {
        let name = format!("burst-{i}");
        let pod = bench_pod(&name, None);
        seen.insert(name.clone(), Seen { created: unix_ns(SystemTime::now()), ..Default::default() });
        created.insert(name, Instant::now());
        let pods = pods.clone();
        tasks.push(tokio::spawn(async move { pods.create(&Default::default(), &pod).await.unwrap() }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let mut latencies: BTreeMap<String, f64> = BTreeMap::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    while latencies.len() < n {
        let ev = tokio::time::timeout_at(deadline, stream.next()).await.expect("pods did not all start within 300 s");
        let Some(Ok(watcher::Event::Apply(p))) = ev else { continue };
        let name = p.metadata.name.clone().unwrap_or_default();
        let now = unix_ns(SystemTime::now());
        if let Some(s) = seen.get_mut(&name) {
            if p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some() {
                s.scheduled.get_or_insert(now);
            }
        }
        if let Some(t0) = created.get(&name) {
            if all_started(&p) && !latencies.contains_key(&name) {
                latencies.insert(name.clone(), t0.elapsed().as_secs_f64());
                if let Some(s) = seen.get_mut(&name) {
                    s.started = Some(now);
                }
            }
        }
    }
    let mut v: Vec<f64> = latencies.into_values().collect();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (v, seen)
}

fn main() {
    // Ctrl-C (or SIGTERM) unwinds: the lab's processes, namespace, mounts and files go with it.
    ferro_lab::interrupt::unwind_on_signal().unwrap();
    let n = usize::try_from(arg("--pods", 30)).unwrap();
    let idle = Duration::from_secs(arg("--idle-seconds", 20));
    let args: Vec<String> = std::env::args().collect();
    let runtime = args
        .iter()
        .position(|a| a == "--oci-runtime")
        .map(|i| std::path::PathBuf::from(args.get(i + 1).expect("--oci-runtime takes a path")));
    println!("OCI runtime: {}", runtime.as_ref().map_or("runc".into(), |p| p.display().to_string()));
    // The agent logs as installed (info: the systemd unit sets no RUST_LOG) unless
    // `--agent-log FILTER` says otherwise (the tests' labs use "info,ferro_agent=debug").
    let agent_log: &'static str = args
        .iter()
        .position(|a| a == "--agent-log")
        .map_or("info", |i| Box::leak(args.get(i + 1).expect("--agent-log takes a filter").clone().into_boxed_str()));
    println!("agent log filter: {agent_log}");
    // Declared before the lab: dropped (unmounted, its loop device detached) after it.
    let _lab_fs = match args.iter().position(|a| a == "--lab-fs").map(|i| args.get(i + 1).map(String::as_str)) {
        None => {
            println!("lab filesystem: {} ({})", std::env::temp_dir().display(), fs_of(&std::env::temp_dir()));
            None
        }
        Some(Some("ext4")) => {
            let fs = lab_fs_ext4();
            println!("lab filesystem: {} (a fresh ext4 with a journal)", std::env::temp_dir().display());
            Some(fs)
        }
        Some(other) => panic!("--lab-fs takes ext4, not {other:?}"),
    };
    let lab = lab::Lab::start_logging("bench", lab::NO_IMAGE_GC, runtime, None, agent_log);
    let pid = lab.agent.pid().unwrap();
    ferro_lab::interrupt::sleep(Duration::from_secs(5));
    let (rss0, cpu0) = footprint(pid, idle);

    // The floor, in the same lab, before ferro's burst.
    let ctrd_pid = lab.ctrd.pid().unwrap();
    // The agent's CPU in nanoseconds where the machine has cgroup v1 cpuacct (else ticks).
    let acct = bench_util::CpuAcct::attach(pid);
    println!("agent CPU counted by {}", if acct.is_some() { "a cpuacct cgroup of its own (ns)" } else { "/proc/<pid>/stat (10 ms ticks)" });
    let ctrd_f0 = cpu_ticks(ctrd_pid);
    let floor_wall0 = Instant::now();
    let floor_latencies = {
        let (socket, cg, logs) = (lab.ctrd.socket(), lab.cgroup_root.clone(), lab.dir.path().join("floor-logs"));
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(ferro_lab::interrupt::interruptible(floor(socket, n, cg, logs)))
    };
    let floor_wall = floor_wall0.elapsed().as_secs_f64();
    let floor_ctrd_cpu = (cpu_ticks(ctrd_pid) - ctrd_f0) as f64 / 100.0;
    ferro_lab::interrupt::sleep(Duration::from_secs(5));

    // The client lives in the lab namespace: a thread that entered it runs the runtime.
    let (ns_path, kubeconfig) = (lab.ns.path(), lab.admin_kubeconfig());

    // The floor with the agent's configs: the same pods as the API admits them (bound to a
    // node that does not exist, so no agent runs them), the default namespace's Services.
    let (floor_pods, services) = in_netns(ns_path.clone(), kubeconfig.clone(), move |client| {
        async move {
            let pods: kube::Api<Pod> = kube::Api::namespaced(client.clone(), "default");
            let mut made = Vec::new();
            for i in 0..n {
                made.push(pods.create(&Default::default(), &bench_pod(&format!("floor-{i}"), Some("floor-nowhere"))).await.unwrap());
            }
            let services: kube::Api<k8s_openapi::api::core::v1::Service> = kube::Api::namespaced(client, "default");
            let services = services.list(&Default::default()).await.unwrap().items;
            for p in &made {
                pods.delete(p.metadata.name.as_deref().unwrap(), &kube::api::DeleteParams::default().grace_period(0)).await.unwrap();
            }
            (made, services)
        }
        .boxed()
    });
    let floor2_wall0 = Instant::now();
    let floor2_latencies = {
        let (socket, cg, dir) = (lab.ctrd.socket(), lab.cgroup_root.clone(), lab.dir.path().join("floor-agent"));
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(ferro_lab::interrupt::interruptible(floor_as_agent(socket, floor_pods, services, cg, dir)))
    };
    let floor2_wall = floor2_wall0.elapsed().as_secs_f64();
    ferro_lab::interrupt::sleep(Duration::from_secs(5));

    let requests0 = lab.api_requests();
    let (agent_t0, ctrd_t0, wall0) = (bench_util::cpu_seconds(pid, acct.as_ref()), cpu_ticks(ctrd_pid), Instant::now());
    let mark0 = monotonic();
    let (latencies, seen) = in_netns(ns_path, kubeconfig, move |client| burst(client, n).boxed());
    let burst_wall = wall0.elapsed().as_secs_f64();
    window(mark0);
    let agent_cpu = bench_util::cpu_seconds(pid, acct.as_ref()) - agent_t0;
    let ctrd_cpu = (cpu_ticks(ctrd_pid) - ctrd_t0) as f64 / 100.0;
    let mut requests = lab.api_requests();
    for (k, v) in &requests0 {
        *requests.entry(k.clone()).or_default() -= v;
    }
    ferro_lab::interrupt::sleep(Duration::from_secs(5));
    let (rss_n, cpu_n) = footprint(pid, idle);

    println!("pod startup latency, {n} pods created at once on one node (image present):");
    let row = |what: &str, v: &[f64]| {
        println!(
            "  {what:<28} p50 {:.3} s   p90 {:.3} s   p99 {:.3} s   max {:.3} s",
            pct(v, 50.0),
            pct(v, 90.0),
            pct(v, 99.0),
            v.last().copied().unwrap_or(f64::NAN)
        )
    };
    row("floor (CRI only, bare):", &floor_latencies);
    row("floor (CRI only, agent's):", &floor2_latencies);
    row("ferro (API, scheduler, agent):", &latencies);
    println!(
        "  ferro / bare floor: p50 {:.2}x   p99 {:.2}x   (floor burst {floor_wall:.2} s wall, containerd {floor_ctrd_cpu:.2} CPU-s)",
        pct(&latencies, 50.0) / pct(&floor_latencies, 50.0),
        pct(&latencies, 99.0) / pct(&floor_latencies, 99.0)
    );
    println!(
        "  ferro / floor with the agent's configs: p50 {:.2}x   p99 {:.2}x   (floor burst {floor2_wall:.2} s wall)",
        pct(&latencies, 50.0) / pct(&floor2_latencies, 50.0),
        pct(&latencies, 99.0) / pct(&floor2_latencies, 99.0)
    );
    // Where a ferro pod's time goes (medians over the pods; client and agent share the clock).
    let log = lab.agent_log();
    let (added, first_cri, started) =
        (agent_times(&log, "pod added"), agent_times(&log, "creating pod sandbox"), agent_times(&log, "started container"));
    let mut steps: [Vec<f64>; 5] = Default::default();
    for (name, s) in &seen {
        let (Some(sched), Some(done)) = (s.scheduled, s.started) else { continue };
        let (Some(a), Some(c), Some(st)) = (added.get(name), first_cri.get(name), started.get(name)) else { continue };
        let ms = |from: i64, to: i64| (to - from) as f64 / 1e6;
        steps[0].push(ms(s.created, sched));
        steps[1].push(ms(sched, *a));
        steps[2].push(ms(*a, *c));
        steps[3].push(ms(*c, *st));
        steps[4].push(ms(*st, done));
    }
    println!("  breakdown of a ferro pod (median ms over {} pods):", steps[0].len());
    for (i, what) in [
        "created -> scheduled (API + scheduler, seen by watch)",
        "scheduled -> the agent has the pod",
        "the agent has the pod -> RunPodSandbox",
        "RunPodSandbox -> container started",
        "container started -> running status seen by watch",
    ]
    .iter()
    .enumerate()
    {
        println!("    {what:<56} {:8.1}", median(steps[i].clone()));
    }
    println!(
        "CPU during the burst ({burst_wall:.2} s wall): ferro-agent {agent_cpu:.3} s ({:.2} ms per pod), containerd {ctrd_cpu:.2} s (shims, runc and the CNI plugin not counted)",
        agent_cpu * 1000.0 / n as f64
    );
    let per_pod: Vec<String> = requests
        .iter()
        .filter(|(_, v)| **v > 0.0)
        .map(|(k, v)| format!("{k} {:.1}", v / n as f64))
        .collect();
    println!("API requests during the burst, per pod (every client): {}", per_pod.join(", "));
    println!("ferro-agent footprint (idle window of {} s):", idle.as_secs());
    println!("  0 pods:  RSS {:.1} MiB   CPU {:.2} % of a core", rss0 as f64 / 1024.0, cpu0);
    println!("  {n} pods: RSS {:.1} MiB   CPU {:.2} % of a core", rss_n as f64 / 1024.0, cpu_n);
    if let Ok(path) = std::env::var("FERRO_BENCH_AGENT_LOG") {
        std::fs::write(path, lab.agent_log()).unwrap();
    }
    lab.kubectl_ok(&["delete", "pods", "--all", "--wait=true", "--timeout=120s"]);

    // Further rounds (--rounds): the same burst again once the previous pods are gone, for
    // figures that one run's noise does not decide (CPU from /proc in 10 ms ticks, two cores
    // shared with the runtime).
    let rounds = usize::try_from(arg("--rounds", 1)).unwrap().max(1);
    if rounds > 1 {
        let floor2_p50 = pct(&floor2_latencies, 50.0);
        let floor2_p99 = pct(&floor2_latencies, 99.0);
        let mut cpu_per_pod = vec![agent_cpu * 1000.0 / n as f64];
        let mut ratio_p50 = vec![pct(&latencies, 50.0) / floor2_p50];
        let mut ratio_p99 = vec![pct(&latencies, 99.0) / floor2_p99];
        for _ in 1..rounds {
            wait_pods_gone(&lab);
            ferro_lab::interrupt::sleep(Duration::from_secs(5));
            let t0 = bench_util::cpu_seconds(pid, acct.as_ref());
            let (ns_path, kubeconfig) = (lab.ns.path(), lab.admin_kubeconfig());
            let mark0 = monotonic();
            let (lat, _) = in_netns(ns_path, kubeconfig, move |client| burst(client, n).boxed());
            window(mark0);
            cpu_per_pod.push((bench_util::cpu_seconds(pid, acct.as_ref()) - t0) * 1000.0 / n as f64);
            ratio_p50.push(pct(&lat, 50.0) / floor2_p50);
            ratio_p99.push(pct(&lat, 99.0) / floor2_p99);
            lab.kubectl_ok(&["delete", "pods", "--all", "--wait=true", "--timeout=120s"]);
        }
        let list = |v: &[f64], digits: usize| v.iter().map(|x| format!("{x:.digits$}")).collect::<Vec<_>>().join(", ");
        println!("{rounds} rounds of the ferro burst (the floors measured once):");
        println!("  agent CPU per pod: {} ms   median {:.2} ms", list(&cpu_per_pod, 2), median(cpu_per_pod.clone()));
        println!(
            "  ferro / floor with the agent's configs: p50 {}   median {:.2}x;   p99 {}   median {:.2}x",
            list(&ratio_p50, 2),
            median(ratio_p50.clone()),
            list(&ratio_p99, 2),
            median(ratio_p99.clone())
        );
    }
}

/// Waits until the agent has removed every pod's sandbox (the API objects go first).
fn wait_pods_gone(lab: &lab::Lab) {
    let socket = lab.ctrd.socket();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(ferro_lab::interrupt::interruptible(async move {
        let (mut cri, _) = ferro_lab::cri::connect(&socket).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            let left = cri.list_pod_sandbox(api::ListPodSandboxRequest { filter: None }).await.unwrap().into_inner().items.len();
            if left == 0 {
                return;
            }
            assert!(Instant::now() < deadline, "{left} sandboxes of the previous round still there after 300 s");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }));
}
