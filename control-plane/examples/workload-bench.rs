//! Benchmark of ferro-control-plane's workload loops (issue 14), with fake nodes and a
//! stand-in kubelet.
//!
//! cargo build --release -p ferro-control-plane --example workload-bench --bin ferro-control-plane
//! ./target/release/examples/workload-bench [--nodes 100] [--sts 200] [--completions 1000]
//!     [--parallelism 100] [--cronjobs 20] [--cron-minutes 2]
//!
//! Starts the release binary on loopback with a fresh data dir and registers N Ready nodes
//! (the node monitor's grace is an hour: nobody renews their Leases). The stand-in kubelet sets
//! every bound pod Running and Ready, or, for pods labelled `bench/exit: "0"`, Succeeded with
//! a terminated container. Then, each timed from the create to the state seen by polling:
//! 1. a DaemonSet: all N daemon pods Running and Ready (`numberReady`);
//! 2. a StatefulSet of S replicas, podManagementPolicy Parallel: `readyReplicas` = S;
//! 3. a Job of C completions at parallelism P: the Complete condition;
//! 4. K CronJobs `* * * * *` for M minutes: the delay from each run's scheduled second to the
//!    moment a watch sees its Job, p50 and p99.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::apps::v1::{DaemonSet, StatefulSet};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;

use common::{arg, pct};

fn container() -> serde_json::Value {
    json!([{"name": "c", "image": "busybox", "resources": {"requests": {"cpu": "1m", "memory": "1Mi"}}}])
}

/// Polls `f` every 50 ms until it holds; returns the time since `start`.
async fn until<F, Fut>(what: &str, start: Instant, mut f: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    loop {
        if f().await {
            return start.elapsed();
        }
        assert!(start.elapsed() < Duration::from_secs(900), "{what} did not happen within 15 minutes");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::main]
async fn main() {
    let n_nodes = arg("--nodes", 100);
    let sts = arg("--sts", 200);
    let completions = arg("--completions", 1000);
    let parallelism = arg("--parallelism", 100);
    let n_cron = arg("--cronjobs", 20);
    let cron_minutes = arg("--cron-minutes", 2);
    let server = common::Server::start("ferro-workload-bench", &["--node-monitor-grace-period", "1h"]).await;
    let client = server.client.clone();
    println!(
        "ferro workload benchmark: {n_nodes} nodes; DaemonSet; StatefulSet of {sts} (Parallel); Job of {completions} at parallelism {parallelism}; {n_cron} CronJobs for {cron_minutes} min"
    );

    let nodes: Api<Node> = Api::all(client.clone());
    for i in 0..n_nodes {
        let name = format!("node-{i:03}");
        let node: Node = serde_json::from_value(json!({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}})).unwrap();
        nodes.create(&PostParams::default(), &node).await.unwrap();
        let now = jiff::Timestamp::now().to_string();
        let status = json!({"status": {
            "capacity": {"cpu": "64", "memory": "256Gi", "pods": "500"},
            "allocatable": {"cpu": "64", "memory": "256Gi", "pods": "500"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": now, "lastTransitionTime": now}]}});
        nodes.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
    }

    // The stand-in kubelet.
    let pods: Api<Pod> = Api::all(client.clone());
    let kubelet = {
        let client = client.clone();
        tokio::spawn(async move {
            let done: Arc<Mutex<std::collections::HashSet<String>>> = Arc::default();
            let mut s = kube::runtime::watcher::watcher(pods, kube::runtime::watcher::Config::default()).boxed();
            while let Some(Ok(ev)) = s.next().await {
                let kube::runtime::watcher::Event::Apply(p) = ev else { continue };
                let Some(uid) = p.metadata.uid.clone() else { continue };
                if p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none() || p.metadata.deletion_timestamp.is_some() {
                    continue;
                }
                if !done.lock().unwrap().insert(uid) {
                    continue;
                }
                let now = jiff::Timestamp::now().to_string();
                let exits = p.metadata.labels.as_ref().and_then(|l| l.get("bench/exit")).is_some();
                let status = if exits {
                    json!({"status": {"phase": "Succeeded", "containerStatuses": [{"name": "c", "image": "busybox", "imageID": "", "ready": false, "restartCount": 0,
                        "state": {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}}}],
                        "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": now}]}})
                } else {
                    json!({"status": {"phase": "Running", "podIP": "10.200.0.1", "podIPs": [{"ip": "10.200.0.1"}],
                        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}]}})
                };
                let api: Api<Pod> = Api::namespaced(client.clone(), p.metadata.namespace.as_deref().unwrap_or("default"));
                let name = p.metadata.name.clone().unwrap_or_default();
                tokio::spawn(async move {
                    let _ = api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)).await;
                });
            }
        })
    };

    // 1. DaemonSet
    let dss: Api<DaemonSet> = Api::namespaced(client.clone(), "default");
    let ds = json!({"metadata": {"name": "agent"}, "spec": {"selector": {"matchLabels": {"app": "agent"}},
        "template": {"metadata": {"labels": {"app": "agent"}}, "spec": {"containers": container()}}}});
    let start = Instant::now();
    dss.create(&PostParams::default(), &serde_json::from_value(ds).unwrap()).await.unwrap();
    let t = until("the DaemonSet", start, || async {
        dss.get("agent").await.unwrap().status.is_some_and(|s| s.number_ready == i32::try_from(n_nodes).unwrap())
    })
    .await;
    println!("DaemonSet on {n_nodes} nodes: all pods Ready after {:.2} s", t.as_secs_f64());

    // 2. StatefulSet, Parallel
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), "default");
    let set = json!({"metadata": {"name": "db"}, "spec": {"replicas": sts, "serviceName": "db", "podManagementPolicy": "Parallel",
        "selector": {"matchLabels": {"app": "db"}},
        "template": {"metadata": {"labels": {"app": "db"}}, "spec": {"containers": container()}}}});
    let start = Instant::now();
    sets.create(&PostParams::default(), &serde_json::from_value(set).unwrap()).await.unwrap();
    let t = until("the StatefulSet", start, || async {
        sets.get("db").await.unwrap().status.and_then(|s| s.ready_replicas) == Some(i32::try_from(sts).unwrap())
    })
    .await;
    println!("StatefulSet of {sts} (Parallel): all replicas Ready after {:.2} s", t.as_secs_f64());

    // 3. Job
    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    let job = json!({"metadata": {"name": "batch"}, "spec": {"completions": completions, "parallelism": parallelism,
        "template": {"metadata": {"labels": {"bench/exit": "0"}}, "spec": {"restartPolicy": "Never", "containers": container()}}}});
    let start = Instant::now();
    jobs.create(&PostParams::default(), &serde_json::from_value(job).unwrap()).await.unwrap();
    let t = until("the Job", start, || async {
        jobs.get("batch").await.unwrap().status.and_then(|s| s.conditions).is_some_and(|c| c.iter().any(|c| c.type_ == "Complete" && c.status == "True"))
    })
    .await;
    println!("Job of {completions} completions at parallelism {parallelism}: Complete after {:.2} s", t.as_secs_f64());

    // 4. CronJobs: delay from the scheduled second to the Job seen by a watch.
    let cjs: Api<CronJob> = Api::namespaced(client.clone(), "default");
    let rv = jobs.list(&ListParams::default().limit(1)).await.unwrap().metadata.resource_version.unwrap();
    let delays: Arc<Mutex<Vec<f64>>> = Arc::default();
    let watcher = {
        let (jobs, delays) = (jobs.clone(), delays.clone());
        tokio::spawn(async move {
            let mut s = jobs.watch(&WatchParams::default().timeout(290), &rv).await.unwrap().boxed();
            while let Ok(Some(ev)) = s.try_next().await {
                if let WatchEvent::Added(j) = ev {
                    let seen = jiff::Timestamp::now();
                    let Some(at) = j.metadata.annotations.as_ref().and_then(|a| a.get("batch.kubernetes.io/cronjob-scheduled-timestamp")) else {
                        continue;
                    };
                    let scheduled: jiff::Timestamp = at.parse().unwrap();
                    delays.lock().unwrap().push(seen.duration_since(scheduled).as_secs_f64() * 1000.0);
                }
            }
        })
    };
    for i in 0..n_cron {
        let cj = json!({"metadata": {"name": format!("tick-{i:02}")}, "spec": {"schedule": "* * * * *",
            "jobTemplate": {"spec": {"template": {"metadata": {"labels": {"bench/exit": "0"}}, "spec": {"restartPolicy": "Never", "containers": container()}}}}}});
        cjs.create(&PostParams::default(), &serde_json::from_value(cj).unwrap()).await.unwrap();
    }
    let wanted = n_cron * cron_minutes;
    let start = Instant::now();
    until("the CronJob runs", start, || async { delays.lock().unwrap().len() >= wanted }).await;
    watcher.abort();
    let mut d = delays.lock().unwrap().clone();
    println!(
        "{} CronJob runs ({n_cron} CronJobs x {cron_minutes} min): scheduled second -> Job seen, p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        d.len(),
        pct(&mut d, 0.5),
        pct(&mut d, 0.99),
        d.iter().copied().fold(0.0, f64::max)
    );
    kubelet.abort();
    drop(server);
}
