//! Benchmark of ferro-control-plane's scheduler and workload loops, with fake nodes.
//!
//! cargo build --release -p ferro-control-plane --example scheduler-bench --bin ferro-control-plane
//! ./target/release/examples/scheduler-bench [--nodes 100] [--pods 5000] [--replicas 1000]
//!
//! Starts the release binary on loopback with a fresh data dir, registers N Ready nodes, then:
//! 1. creates P pending pods (16 writers) and watches them: pods bound per second (first
//!    create to last binding) and p50/p99 of creation -> binding as seen by the watch;
//! 2. deletes them, creates a Service and a Deployment of R replicas, and with a stand-in
//!    kubelet (sets each bound pod Running + Ready with an IP) measures the time until all R
//!    pods exist, and until the Service's EndpointSlices list R ready endpoints.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;

use common::{arg, pct};

fn pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "sched"}},
        "spec": {"containers": [{"name": "app", "image": "busybox",
            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}
    }))
    .unwrap()
}

#[tokio::main]
async fn main() {
    let n_nodes = arg("--nodes", 100);
    let n_pods = arg("--pods", 5000);
    let replicas = arg("--replicas", 1000);
    let server = common::Server::start("ferro-sched-bench", &[]).await;
    let client = server.client.clone();
    println!("ferro scheduler benchmark: {n_nodes} nodes, {n_pods} pods, deployment of {replicas}");

    let nodes: Api<Node> = Api::all(client.clone());
    for i in 0..n_nodes {
        let name = format!("node-{i:03}");
        let node: Node = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        nodes.create(&PostParams::default(), &node).await.unwrap();
        let now = jiff::Timestamp::now().to_string();
        let status = json!({"status": {
            "capacity": {"cpu": "32", "memory": "128Gi", "pods": "110"},
            "allocatable": {"cpu": "32", "memory": "128Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": now, "lastTransitionTime": now}]}});
        nodes.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
    }

    // 1. scheduling throughput and latency
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let created: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let latencies: Arc<Mutex<Vec<f64>>> = Arc::default();
    let rv = pods.list(&ListParams::default().limit(1)).await.unwrap().metadata.resource_version.unwrap();
    let watcher = {
        let (pods, created, latencies) = (pods.clone(), created.clone(), latencies.clone());
        tokio::spawn(async move {
            let mut s = pods.watch(&WatchParams::default().timeout(600), &rv).await.unwrap().boxed();
            let mut bound = 0;
            let mut last = Instant::now();
            while let Some(ev) = s.try_next().await.unwrap() {
                if let WatchEvent::Modified(p) = ev {
                    if p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none() {
                        continue;
                    }
                    let name = p.metadata.name.unwrap();
                    if let Some(t0) = created.lock().unwrap().remove(&name) {
                        latencies.lock().unwrap().push(t0.elapsed().as_secs_f64() * 1000.0);
                        bound += 1;
                        last = Instant::now();
                        if bound == n_pods {
                            return last;
                        }
                    }
                }
            }
            last
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let start = Instant::now();
    futures::stream::iter(0..n_pods)
        .map(|i| {
            let (pods, created) = (pods.clone(), created.clone());
            async move {
                let name = format!("p{i:05}");
                created.lock().unwrap().insert(name.clone(), Instant::now());
                pods.create(&PostParams::default(), &pod(&name)).await.unwrap();
            }
        })
        .buffer_unordered(16)
        .for_each(|_| async {})
        .await;
    let create_secs = start.elapsed().as_secs_f64();
    let last = watcher.await.unwrap();
    let secs = last.duration_since(start).as_secs_f64();
    let mut l = latencies.lock().unwrap().clone();
    println!("created {n_pods} pods in {create_secs:.2} s");
    println!(
        "scheduled {} pods in {secs:.2} s: {:.0} pods/s; creation -> binding p50 {:.0} ms, p99 {:.0} ms",
        l.len(),
        l.len() as f64 / secs,
        pct(&mut l, 0.5),
        pct(&mut l, 0.99)
    );
    pods.delete_collection(&DeleteParams::default().grace_period(0), &ListParams::default().labels("app=sched")).await.unwrap();

    // 2. a deployment and its endpoint slices, with a stand-in kubelet
    let kubelet = {
        let pods = pods.clone();
        tokio::spawn(async move {
            let mut n = 0u32;
            let mut s = kube::runtime::watcher::watcher(pods.clone(), kube::runtime::watcher::Config::default().labels("app=deploy")).boxed();
            while let Some(Ok(ev)) = s.next().await {
                let kube::runtime::watcher::Event::Apply(p) = ev else { continue };
                if p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none()
                    || p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                {
                    continue;
                }
                n += 1;
                let ip = format!("10.{}.{}.{}", 100 + n / 65536, (n / 256) % 256, n % 256);
                let now = jiff::Timestamp::now().to_string();
                let patch = json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                    "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}]}});
                let pods = pods.clone();
                let name = p.metadata.name.clone().unwrap();
                tokio::spawn(async move {
                    let _ = pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await;
                });
            }
        })
    };
    let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "deploy"},
        "spec": {"selector": {"app": "deploy"}, "ports": [{"port": 80}]}});
    Api::<k8s_openapi::api::core::v1::Service>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &serde_json::from_value(svc).unwrap())
        .await
        .unwrap();
    let dep = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "deploy"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "deploy"}},
            "template": {"metadata": {"labels": {"app": "deploy"}},
                "spec": {"containers": [{"name": "c", "image": "busybox", "resources": {"requests": {"cpu": "10m"}}}]}}}});
    let start = Instant::now();
    Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &serde_json::from_value(dep).unwrap())
        .await
        .unwrap();
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    let mut all_created = None;
    loop {
        if all_created.is_none() {
            let l = pods.list(&ListParams::default().labels("app=deploy")).await.unwrap();
            if l.items.len() >= replicas {
                all_created = Some(start.elapsed());
            }
        }
        let ready: usize = slices
            .list(&ListParams::default().labels("kubernetes.io/service-name=deploy"))
            .await
            .unwrap()
            .items
            .iter()
            .map(|s| s.endpoints.iter().filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true)).count())
            .sum();
        if ready >= replicas {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(600), "deployment did not converge ({ready}/{replicas} ready endpoints)");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let total = start.elapsed();
    println!(
        "deployment of {replicas}: all pods created after {:.2} s; EndpointSlices list {replicas} ready endpoints after {:.2} s",
        all_created.unwrap_or(total).as_secs_f64(),
        total.as_secs_f64()
    );
    kubelet.abort();
    drop(server);
}
