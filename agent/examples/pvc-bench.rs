//! Persistent volume startup in the lab (root; the one-node cluster of agent/tests/lab with
//! ferro-csi next to the agent): from a claim (WaitForFirstConsumer) and its pod being created
//! to the pod's container running with the volume mounted. The scheduler selects the node,
//! ferro-csi provisions (sparse file), the PV controller binds, the agent stages (loop device,
//! mkfs.ext4) and publishes, runc starts the container.
//!
//!   cargo build --release --workspace --all-targets
//!   ./target/release/examples/pvc-bench [--single 10] [--burst 100] [--size-mib 16]
//!
//! `--single`: that many claim + pod pairs one after the other (each deleted, volume included,
//! before the next): the p50 of one. `--burst`: that many pairs created at once: the time until
//! all run, volumes per second, and ferro-csi's and the agent's CPU during it. Start times are
//! taken on the client right before the create requests; ends when the watch sees the pod's
//! container running.
#![allow(clippy::unwrap_used)]

#[path = "../tests/lab/mod.rs"]
mod lab;

#[path = "bench_util/mod.rs"]
mod bench_util;

use bench_util::{arg, cpu_ticks, in_netns, pct};

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::{FutureExt as _, StreamExt as _};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::runtime::watcher;
use kube::Api;

fn running(p: &Pod) -> bool {
    let cs = p.status.as_ref().and_then(|s| s.container_statuses.as_deref()).unwrap_or_default();
    !cs.is_empty() && cs.iter().all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
}

fn objects(name: &str, size_mib: u64) -> (PersistentVolumeClaim, Pod) {
    let pvc = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "labels": {"bench": "pvc"}},
        "spec": {"storageClassName": "loop", "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": format!("{size_mib}Mi")}}}
    }))
    .unwrap();
    let pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"bench": "pvc"}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "app", "image": lab::BUSYBOX, "command": ["sleep", "3600"],
                            "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": name}}]
        }
    }))
    .unwrap();
    (pvc, pod)
}

/// Creates `names`' claims and pods at once; returns each pod's seconds to running.
async fn start_all(client: &kube::Client, names: &[String], size_mib: u64) -> Vec<f64> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let mut stream = watcher::watcher(pods.clone(), watcher::Config::default().labels("bench=pvc")).boxed();
    while let Some(ev) = stream.next().await {
        if matches!(ev, Ok(watcher::Event::InitDone)) {
            break;
        }
    }
    let mut created: BTreeMap<String, Instant> = BTreeMap::new();
    let mut tasks = Vec::new();
    for name in names {
        let (pvc, pod) = objects(name, size_mib);
        created.insert(name.clone(), Instant::now());
        let (pods, pvcs) = (pods.clone(), pvcs.clone());
        tasks.push(tokio::spawn(async move {
            pvcs.create(&PostParams::default(), &pvc).await.unwrap();
            pods.create(&PostParams::default(), &pod).await.unwrap();
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let mut done: BTreeMap<String, f64> = BTreeMap::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
    while done.len() < names.len() {
        let ev = tokio::time::timeout_at(deadline, stream.next()).await.expect("pods did not all run within 600 s");
        let Some(Ok(watcher::Event::Apply(p))) = ev else { continue };
        let name = p.metadata.name.clone().unwrap_or_default();
        if let Some(t0) = created.get(&name) {
            if running(&p) && !done.contains_key(&name) {
                done.insert(name, t0.elapsed().as_secs_f64());
            }
        }
    }
    let mut v: Vec<f64> = done.into_values().collect();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v
}

/// Deletes the bench's pods and claims and waits until their volumes are gone.
async fn clean(client: &kube::Client) -> Result<(), String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let lp = ListParams::default().labels("bench=pvc");
    pods.delete_collection(&DeleteParams::default(), &lp).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(600);
    while !pods.list(&lp).await.unwrap().items.is_empty() {
        if Instant::now() > deadline {
            return Err("bench pods not gone".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    pvcs.delete_collection(&DeleteParams::default(), &lp).await.unwrap();
    loop {
        let left = pvs.list(&ListParams::default()).await.unwrap().items;
        if left.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            let phases: Vec<String> = left
                .iter()
                .map(|v| format!("{} {:?}", v.metadata.name.clone().unwrap_or_default(), v.status.as_ref().and_then(|s| s.phase.clone())))
                .collect();
            return Err(format!("bench volumes not gone: {phases:?}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn main() {
    // Ctrl-C (or SIGTERM) unwinds: the lab, the CSI driver and its loop devices go with it.
    ferro_lab::interrupt::unwind_on_signal().unwrap();
    let singles = usize::try_from(arg("--single", 10)).unwrap();
    let burst = usize::try_from(arg("--burst", 100)).unwrap();
    let size = arg("--size-mib", 16);
    let scratch = ferro_lab::storage::Scratch::new("ferro-pvc-bench-").unwrap();
    let lab = lab::Lab::start("pvcbench");
    let mut csi = lab.start_csi(&scratch.path().join("csi"), &format!("{}Mi", (burst as u64 + 4) * size));
    lab.wait_csi_registered();
    lab.apply("apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata:\n  name: loop\nprovisioner: loop.csi.ferro.dev\nvolumeBindingMode: WaitForFirstConsumer\nreclaimPolicy: Delete\n");
    let (agent_pid, csi_pid) = (lab.agent.pid().unwrap(), csi.pid().unwrap());
    let (single, all, burst_wall, agent_cpu, csi_cpu) = in_netns(lab.ns.path(), lab.admin_kubeconfig(), move |client| {
        async move {
            let mut single = Vec::new();
            for i in 0..singles {
                single.extend(start_all(&client, &[format!("one-{i}")], size).await);
                clean(&client).await?;
            }
            single.sort_by(|a, b| a.partial_cmp(b).unwrap());
            let names: Vec<String> = (0..burst).map(|i| format!("many-{i}")).collect();
            let (a0, c0, w0) = (cpu_ticks(agent_pid), cpu_ticks(csi_pid), Instant::now());
            let all = start_all(&client, &names, size).await;
            let wall = w0.elapsed().as_secs_f64();
            let (a, c) = ((cpu_ticks(agent_pid) - a0) as f64 / 100.0, (cpu_ticks(csi_pid) - c0) as f64 / 100.0);
            clean(&client).await?;
            Ok::<_, String>((single, all, wall, a, c))
        }
        .boxed()
    })
    .unwrap_or_else(|e| {
        let csi_log = std::fs::read_to_string(lab.dir.path().join("csi.log")).unwrap_or_default();
        let tail: Vec<&str> = csi_log.lines().rev().take(40).collect();
        panic!("{e}\n{}\n--- csi.log (last lines, newest first) ---\n{}", lab.logs(), tail.join("\n"))
    });
    println!("claim (WaitForFirstConsumer, {size} MiB ext4) + pod -> container running with the volume mounted:");
    println!(
        "  one at a time, {singles} runs: p50 {:.3} s   p90 {:.3} s   max {:.3} s",
        pct(&single, 50.0),
        pct(&single, 90.0),
        single.last().copied().unwrap_or(f64::NAN)
    );
    println!(
        "  {burst} at once: all running after {burst_wall:.2} s ({:.1} volumes/s); per pod p50 {:.3} s   p99 {:.3} s",
        burst as f64 / burst_wall,
        pct(&all, 50.0),
        pct(&all, 99.0)
    );
    println!("  CPU during the burst: ferro-agent {agent_cpu:.2} s, ferro-csi {csi_cpu:.2} s (mkfs and losetup children not counted)");
    csi.kill();
}
