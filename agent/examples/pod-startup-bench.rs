//! Pod startup latency and the agent's footprint, in the lab (root; the same one-node cluster
//! as agent/tests/pods.rs: ferro-control-plane, containerd 1.6 + runc, ferro-cni, ferro-agent).
//!
//!   cargo build --release --workspace --all-targets
//!   ./target/release/examples/pod-startup-bench [--pods 30] [--idle-seconds 20] [--oci-runtime /usr/bin/crun]
//!
//! `--oci-runtime` makes containerd's runc shim run another OCI runtime binary (its
//! `BinaryName` option) instead of runc.
//!
//! Latency follows the upstream SLI: from the pod's creation to the watch observing all its
//! containers started (image already present). creationTimestamp has a resolution of one
//! second, so the start is taken on the client, right before the create request is sent; the
//! pods are created concurrently (a burst). Footprint: the agent's RSS (VmRSS) and its CPU
//! (utime + stime from /proc/<pid>/stat) over an idle window, with 0 and with N pods running.
#![allow(clippy::unwrap_used)]

#[path = "../tests/lab/mod.rs"]
mod lab;

#[path = "bench_util/mod.rs"]
mod bench_util;

use bench_util::{arg, cpu_ticks, pct};

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
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
    std::thread::sleep(window);
    let used = (cpu_ticks(pid) - t0) as f64 / ticks_per_s;
    (rss_kib(pid), 100.0 * used / start.elapsed().as_secs_f64())
}

fn all_started(p: &Pod) -> bool {
    let Some(st) = p.status.as_ref() else { return false };
    let n = p.spec.as_ref().map(|s| s.containers.len()).unwrap_or(0);
    let cs = st.container_statuses.as_deref().unwrap_or_default();
    cs.len() == n && cs.iter().all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
}

async fn burst(client: kube::Client, n: usize) -> Vec<f64> {
    let pods: kube::Api<Pod> = kube::Api::namespaced(client.clone(), "default");
    let mut stream = watcher::watcher(pods.clone(), watcher::Config::default()).boxed();
    // Wait until the watch is established (the initial list is done).
    while let Some(ev) = stream.next().await {
        if matches!(ev, Ok(watcher::Event::InitDone)) {
            break;
        }
    }
    let mut created: BTreeMap<String, Instant> = BTreeMap::new();
    let mut tasks = Vec::new();
    for i in 0..n {
        let name = format!("burst-{i}");
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name},
            "spec": {"terminationGracePeriodSeconds": 1, "containers": [{"name": "app", "image": lab::BUSYBOX, "command": ["sleep", "3600"]}]}
        }))
        .unwrap();
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
        if let Some(t0) = created.get(&name) {
            if all_started(&p) && !latencies.contains_key(&name) {
                latencies.insert(name, t0.elapsed().as_secs_f64());
            }
        }
    }
    let mut v: Vec<f64> = latencies.into_values().collect();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v
}

fn main() {
    let n = usize::try_from(arg("--pods", 30)).unwrap();
    let idle = Duration::from_secs(arg("--idle-seconds", 20));
    let args: Vec<String> = std::env::args().collect();
    let runtime = args
        .iter()
        .position(|a| a == "--oci-runtime")
        .map(|i| std::path::PathBuf::from(args.get(i + 1).expect("--oci-runtime takes a path")));
    println!("OCI runtime: {}", runtime.as_ref().map_or("runc".into(), |p| p.display().to_string()));
    let lab = lab::Lab::start_full("bench", lab::NO_IMAGE_GC, runtime);
    let pid = lab.agent.pid().unwrap();
    std::thread::sleep(Duration::from_secs(5));
    let (rss0, cpu0) = footprint(pid, idle);

    let ctrd_pid = lab.ctrd.pid().unwrap();
    let (agent_t0, ctrd_t0, wall0) = (cpu_ticks(pid), cpu_ticks(ctrd_pid), Instant::now());
    // The client lives in the lab namespace: a thread that entered it runs the runtime.
    let ns_path = lab.ns.path();
    let kubeconfig = lab.admin_kubeconfig();
    let latencies = std::thread::spawn(move || {
        let f = std::fs::File::open(ns_path).unwrap();
        nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let kc = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
            let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.unwrap();
            burst(kube::Client::try_from(cfg).unwrap(), n).await
        })
    })
    .join()
    .unwrap();
    let burst_wall = wall0.elapsed().as_secs_f64();
    let agent_cpu = (cpu_ticks(pid) - agent_t0) as f64 / 100.0;
    let ctrd_cpu = (cpu_ticks(ctrd_pid) - ctrd_t0) as f64 / 100.0;
    std::thread::sleep(Duration::from_secs(5));
    let (rss_n, cpu_n) = footprint(pid, idle);

    println!("pod startup latency, {n} pods created at once on one node (image present):");
    println!(
        "  p50 {:.3} s   p90 {:.3} s   p99 {:.3} s   max {:.3} s",
        pct(&latencies, 50.0),
        pct(&latencies, 90.0),
        pct(&latencies, 99.0),
        latencies.last().copied().unwrap_or(f64::NAN)
    );
    println!(
        "CPU during the burst ({burst_wall:.2} s wall): ferro-agent {agent_cpu:.2} s, containerd {ctrd_cpu:.2} s (shims, runc and the CNI plugin not counted)"
    );
    println!("ferro-agent footprint (idle window of {} s):", idle.as_secs());
    println!("  0 pods:  RSS {:.1} MiB   CPU {:.2} % of a core", rss0 as f64 / 1024.0, cpu0);
    println!("  {n} pods: RSS {:.1} MiB   CPU {:.2} % of a core", rss_n as f64 / 1024.0, cpu_n);
    if let Ok(path) = std::env::var("FERRO_BENCH_AGENT_LOG") {
        std::fs::write(path, lab.agent_log()).unwrap();
    }
    lab.kubectl_ok(&["delete", "pods", "--all", "--wait=true", "--timeout=120s"]);
}
