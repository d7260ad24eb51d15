//! Benchmark of ferro-control-plane: write throughput, list latency, watch delay, RSS.
//!
//! cargo build --release -p ferro-control-plane --example apiserver-bench --bin ferro-control-plane
//! ./target/release/examples/apiserver-bench [--pods 10000] [--concurrency 16] [--watchers 100] [--etcd-members 3] [--floor-shapes]
//!
//! Starts the release binary on loopback with a fresh data dir, then:
//! 1. creates N pods with a kube-rs client, C requests in flight: writes/s;
//! 2. lists all pods (5 times): latency of each;
//! 3. opens W watches on pods, creates 500 more pods one at a time (each write timed), and
//!    reports p50/p99 of the delay from the start of a write to its event at each watcher;
//! 4. prints the server's RSS;
//! 5. on etcd, the floor: etcd's own put rate (and with --floor-shapes, a ferro create's
//!    transaction alone and with a prefix watcher) and etcd's CPU per write.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;

use common::{arg, cpu_secs, pct};

fn pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "bench", "tier": "web"}},
        "spec": {"containers": [{"name": "app", "image": "registry.local/busybox:1.36",
            "command": ["sh", "-c", "sleep 3600"], "ports": [{"containerPort": 80}],
            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}
    }))
    .unwrap()
}

fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

/// How the floor writes: etcd's plain put (the floor), and the two things a ferro
/// create adds on etcd's side, to tell apart where etcd's extra CPU per ferro write goes.
#[derive(Clone, Copy)]
enum Shape {
    /// `put`
    Put,
    /// a transaction: `create_revision == 0` then `put`, else a keys-only get (a ferro create)
    Txn,
    /// the same transaction with a watcher on the prefix taking every event (a ferro create
    /// with its watch cache fed)
    TxnWatched,
}

impl Shape {
    fn name(self) -> &'static str {
        match self {
            Shape::Put => "put",
            Shape::Txn => "txn(create_revision = 0; put)",
            Shape::TxnWatched => "txn(create_revision = 0; put) + a prefix watcher",
        }
    }
}

/// etcd's own write rate: `n` values of `size` bytes (a stored pod's), `conc` in flight, through
/// etcd-client as ferro uses it, written as `shape` says under a prefix of their own.
/// With `rate`, the writes start no faster than that many per second (etcd batches less at a
/// lower rate: this tells that part of its CPU per write from the rest).
async fn etcd_floor(urls: &[String], n: usize, conc: usize, size: usize, shape: Shape, prefix: &str, rate: Option<f64>) {
    use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp, WatchOptions};
    let client = etcd_client::Client::connect(urls, None).await.unwrap();
    let value = std::sync::Arc::new(vec![b'x'; size]);
    // the watcher drains every event until it has seen all n
    let watcher = match shape {
        Shape::TxnWatched => {
            let mut stream = client.watch_client().watch(prefix, Some(WatchOptions::new().with_prefix())).await.unwrap();
            Some(tokio::spawn(async move {
                let mut seen = 0;
                while seen < n {
                    let resp = stream.message().await.unwrap().unwrap();
                    seen += resp.events().len();
                }
            }))
        }
        _ => None,
    };
    let start = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let mut kv = client.kv_client();
            let value = value.clone();
            let key = format!("{prefix}p{i:05}");
            let at = rate.map(|r| tokio::time::Instant::from_std(start) + Duration::from_secs_f64(i as f64 / r));
            async move {
                if let Some(at) = at {
                    tokio::time::sleep_until(at).await;
                }
                match shape {
                    Shape::Put => {
                        kv.put(key, value.as_slice().to_vec(), None).await.unwrap();
                    }
                    Shape::Txn | Shape::TxnWatched => {
                        let txn = Txn::new()
                            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
                            .and_then([TxnOp::put(key.as_str(), value.as_slice().to_vec(), None)])
                            .or_else([TxnOp::get(key.as_str(), Some(GetOptions::new().with_keys_only()))]);
                        assert!(kv.txn(txn).await.unwrap().succeeded());
                    }
                }
            }
        })
        .buffer_unordered(conc)
        .for_each(|_| async {})
        .await;
    if let Some(w) = watcher {
        w.await.unwrap();
    }
    let secs = start.elapsed().as_secs_f64();
    let paced = rate.map(|r| format!(", started at most {r:.0}/s")).unwrap_or_default();
    println!(
        "floor: etcd {}{paced} of {n} values of {} bytes, {conc} in flight: {secs:.2} s, {:.0} writes/s",
        shape.name(),
        value.len(),
        n as f64 / secs
    );
}

#[tokio::main]
async fn main() {
    let n = arg("--pods", 10_000);
    let conc = arg("--concurrency", 16);
    let watchers = arg("--watchers", 100);
    // --etcd-members N: on an N-member etcd cluster on loopback (Debian's etcd-server), with
    // etcd's own put rate through the same client crate as the floor; 0: the embedded store.
    let members = arg("--etcd-members", 0);
    let etcd = (members > 0).then(|| common::EtcdCluster::start(members));
    let mut args: Vec<String> = vec!["--controllers=".into()];
    if let Some(e) = &etcd {
        println!("backend: etcd, {members} members on loopback ({})", e.urls.join(","));
        args.push(format!("--etcd-servers={}", e.urls.join(",")));
    } else {
        println!("backend: the embedded store");
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // The API server alone: no scheduler writing statuses of these node-less pods.
    let server = common::Server::start("ferro-bench", &args).await;
    let client = server.client.clone();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    println!("ferro-control-plane benchmark: {n} pods, {conc} concurrent writers, {watchers} watchers");
    println!("idle RSS: {:.1} MiB", rss_mib(server.child.id()));

    // 1. writes, and the CPU each process spent on them
    let etcd_pids: Vec<String> = etcd.as_ref().map(|e| e.pids().iter().map(u32::to_string).collect()).unwrap_or_default();
    let server_pid = server.child.id().to_string();
    let cpu = || -> [f64; 3] {
        [cpu_secs(&server_pid), etcd_pids.iter().map(|p| cpu_secs(p)).sum(), cpu_secs("self")]
    };
    let cpu0 = cpu();
    let start = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let pods = pods.clone();
            async move { pods.create(&PostParams::default(), &pod(&format!("p{i:05}"))).await.unwrap() }
        })
        .buffer_unordered(conc)
        .for_each(|_| async {})
        .await;
    let secs = start.elapsed().as_secs_f64();
    println!("create {n} pods: {secs:.2} s, {:.0} writes/s", n as f64 / secs);
    let cpu1 = cpu();
    let per_write = |i: usize| (cpu1[i] - cpu0[i]) * 1e6 / n as f64;
    println!(
        "CPU per write: ferro-control-plane {:.0} µs, etcd (all members) {:.0} µs, this client {:.0} µs; machine {} cores",
        per_write(0),
        per_write(1),
        per_write(2),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    );

    // 2. list
    let mut lists = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let l = pods.list(&ListParams::default()).await.unwrap();
        assert_eq!(l.items.len(), n);
        lists.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    println!("list {n} pods (kube-rs, incl. decoding): min {:.0} ms, median {:.0} ms", pct(&mut lists.clone(), 0.0), pct(&mut lists, 0.5));
    // the same list as bytes (the server's part and the transfer, without the client's decoding)
    let mut raw = Vec::new();
    let mut size = 0;
    for _ in 0..5 {
        let req = http::Request::get("/api/v1/namespaces/default/pods").body(Vec::new()).unwrap();
        let t = Instant::now();
        let body = client.request_text(req).await.unwrap();
        raw.push(t.elapsed().as_secs_f64() * 1000.0);
        size = body.len();
    }
    println!(
        "list {n} pods (the response's {:.1} MiB as text, no decoding): min {:.0} ms, median {:.0} ms",
        size as f64 / 1048576.0,
        pct(&mut raw.clone(), 0.0),
        pct(&mut raw, 0.5)
    );
    println!("RSS with {n} pods: {:.1} MiB", rss_mib(server.child.id()));

    // 3. watch delay
    let sent: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let delays: Arc<Mutex<Vec<f64>>> = Arc::default();
    let rv = pods.list(&ListParams::default().limit(1)).await.unwrap().metadata.resource_version.unwrap();
    let writes = 500;
    let mut handles = Vec::new();
    for _ in 0..watchers {
        let pods = pods.clone();
        let sent = sent.clone();
        let delays = delays.clone();
        let rv = rv.clone();
        handles.push(tokio::spawn(async move {
            let mut s = pods.watch(&WatchParams::default().timeout(120), &rv).await.unwrap().boxed();
            let mut got = 0;
            while let Some(ev) = s.try_next().await.unwrap() {
                if let WatchEvent::Added(p) = ev {
                    let name = p.metadata.name.unwrap();
                    if let Some(t0) = sent.lock().unwrap().get(&name).copied() {
                        delays.lock().unwrap().push(t0.elapsed().as_secs_f64() * 1000.0);
                    }
                    got += 1;
                    if got == writes {
                        return;
                    }
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for i in 0..writes {
        let name = format!("w{i:04}");
        sent.lock().unwrap().insert(name.clone(), Instant::now());
        pods.create(&PostParams::default(), &pod(&name)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    for h in handles {
        h.await.unwrap();
    }
    let mut d = delays.lock().unwrap().clone();
    println!(
        "watch delay, write start -> event ({} samples, {watchers} watchers): p50 {:.1} ms, p99 {:.1} ms",
        d.len(),
        pct(&mut d, 0.5),
        pct(&mut d, 0.99)
    );
    println!("RSS at the end: {:.1} MiB", rss_mib(server.child.id()));
    if let Some(e) = &etcd {
        // the floor, with values the size of a pod as ferro stored it
        let stored = serde_json::to_vec(&pods.get("p00000").await.unwrap()).unwrap().len();
        // --floor-shapes: also a ferro create's transaction, and that with a watcher
        let shapes: &[Shape] = if std::env::args().any(|a| a == "--floor-shapes") {
            // the put again last: what the growing database alone changed
            &[Shape::Put, Shape::Txn, Shape::TxnWatched, Shape::Put]
        } else {
            &[Shape::Put]
        };
        let ferro_rate = n as f64 / secs;
        let mut runs: Vec<(Shape, Option<f64>)> = shapes.iter().map(|&s| (s, None)).collect();
        if shapes.len() > 1 {
            // and a ferro create's shape at ferro's own write rate
            runs.push((Shape::TxnWatched, Some(ferro_rate)));
        }
        for (k, &(shape, rate)) in runs.iter().enumerate() {
            let (etcd0, self0) = (etcd_pids.iter().map(|p| cpu_secs(p)).sum::<f64>(), cpu_secs("self"));
            etcd_floor(&e.urls, n, conc, stored, shape, &format!("/floor{k}/"), rate).await;
            let (etcd1, self1) = (etcd_pids.iter().map(|p| cpu_secs(p)).sum::<f64>(), cpu_secs("self"));
            println!(
                "floor CPU per write ({}{}): etcd (all members) {:.0} µs, this client {:.0} µs",
                shape.name(),
                if rate.is_some() { ", paced" } else { "" },
                (etcd1 - etcd0) * 1e6 / n as f64,
                (self1 - self0) * 1e6 / n as f64
            );
        }
    }
    drop(server);
}
