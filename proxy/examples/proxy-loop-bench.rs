//! ferro-proxy's in-process sync loop benchmark (a program that prints figures; no
//! assertions): the real sync loop (`controller::run`: informer listing, the model cache, the
//! mode's backend rendering against its committed state, the conntrack planner) over N
//! Services × M endpoints held in informers, with the kernel replaced by discarding fakes (no
//! `nft`, no `iptables-restore`, no netlink), so it measures ferro-proxy's own work per sync
//! and needs no root:
//!
//! - cold sync: the first (full) sync's wall time and CPU;
//! - one change: an EndpointSlice's endpoint replaced in the informer (as a watch event
//!   would), timed to the end of the partial sync it causes, K times (p50/p99), and the
//!   process's CPU per change;
//! - peak RSS.
//!
//! `cargo run --release -p ferro-proxy --example proxy-loop-bench -- [--services 10000]
//!  [--endpoints 10] [--changes 200] [--mode iptables|nftables|both] [--udp-every 0]
//!  [--kernel] [--exit-after-cold-sync]` (`--udp-every K`: every K-th Service is UDP, so the conntrack planner has
//! work; `--kernel`, as root, nftables only: the real kernel in a network namespace of its
//! own — `nft -f` for the cold sync, the netlink batches for the changes — to split the CPU of
//! a change between ferro-proxy (user) and the kernel (system); `--exit-after-cold-sync`: exit
//! right after the cold sync, so a heap profiler such as heaptrack reports everything live
//! then as leaked, by allocation site).
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferro_proxy::conntrack::{Conntrack, Flows};
use ferro_proxy::controller::{self, Backend, Inputs, LoopConfig, Progress};
use ferro_proxy::error::{ConntrackError, ExecError};
use ferro_proxy::exec::Runner;
use ferro_proxy::health::Health;
use ferro_proxy::metrics::Metrics;
use ferro_proxy::model::Family;
use ferro_proxy::nftables::netlink::{BatchError, NftWriter, Op};
use ferro_runtime::Informer;
use ferro_proxy::slim::Service;
use k8s_openapi::api::core::v1::Node;
use ferro_proxy::slim::EndpointSlice;
use kube::runtime::watcher::Event;
use serde_json::json;

fn arg(name: &str, default: &str) -> String {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned()).unwrap_or_else(|| default.to_string())
}

/// The kernel tools, discarded: every call succeeds with no output.
struct Discard;

impl Runner for Discard {
    fn run(&mut self, _program: &str, _args: &[&str], _stdin: Option<&str>) -> Result<String, ExecError> {
        Ok(String::new())
    }
}

/// The netlink writer, counting operations.
struct Count(Arc<Mutex<usize>>);

impl NftWriter for Count {
    fn apply(&mut self, _family: Family, _table: &str, ops: &[Op]) -> Result<(), BatchError> {
        *self.0.lock().unwrap() += ops.len();
        Ok(())
    }
}

struct NoConntrack;

impl Conntrack for NoConntrack {
    fn delete(&mut self, _flows: &Flows) -> Result<usize, ConntrackError> {
        Ok(0)
    }
}

fn rv() -> String {
    static RV: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    RV.fetch_add(1, std::sync::atomic::Ordering::SeqCst).to_string()
}

fn protocol(i: u32, udp_every: u32) -> &'static str {
    if udp_every > 0 && i.is_multiple_of(udp_every) { "UDP" } else { "TCP" }
}

fn service(i: u32, udp_every: u32) -> Service {
    let ip = std::net::Ipv4Addr::from(0x0a60_0000u32 + i + 1);
    serde_json::from_value(json!({
        "metadata": {"namespace": format!("ns{}", i % 50), "name": format!("svc-{i}"), "resourceVersion": rv()},
        "spec": {"clusterIP": ip.to_string(), "clusterIPs": [ip.to_string()],
                 "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": protocol(i, udp_every)}]},
    }))
    .unwrap()
}

fn slice(i: u32, m: u32, first: Option<std::net::Ipv4Addr>, udp_every: u32) -> EndpointSlice {
    let eps: Vec<_> = (0..m)
        .map(|j| {
            let ip = match (j, first) {
                (0, Some(ip)) => ip,
                _ => std::net::Ipv4Addr::from(0x0a80_0000u32 + i * 16 + j),
            };
            json!({"addresses": [ip.to_string()], "conditions": {"ready": true}, "nodeName": if j % 7 == 0 { "bench-node" } else { "other" }})
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": {"namespace": format!("ns{}", i % 50), "name": format!("svc-{i}-1"), "resourceVersion": rv(),
                     "labels": {"kubernetes.io/service-name": format!("svc-{i}")}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": protocol(i, udp_every)}],
        "endpoints": eps,
    }))
    .unwrap()
}

/// (user + system, system) CPU of this process.
#[derive(Clone, Copy)]
struct Cpu(Duration, Duration);

fn cpu() -> Cpu {
    use nix::sys::resource::{getrusage, UsageWho};
    let tv = |t: nix::sys::time::TimeVal| Duration::from_secs(t.tv_sec() as u64) + Duration::from_micros(t.tv_usec() as u64);
    let a = getrusage(UsageWho::RUSAGE_SELF).unwrap();
    Cpu(tv(a.user_time()) + tv(a.system_time()), tv(a.system_time()))
}

fn status_mib(key: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|k| k.parse::<f64>().ok())
        .map(|k| k / 1024.0)
        .unwrap_or(0.0)
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[(((v.len() as f64 - 1.0) * p).round() as usize).min(v.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

async fn run(mode: &str, n: u32, m: u32, changes: usize, udp_every: u32) {
    let inputs = Inputs {
        services: Informer::with_transform(ferro_proxy::slim::service),
        slices: Informer::with_transform(ferro_proxy::slim::endpoint_slice),
        nodes: Informer::with_transform(ferro_proxy::slim::node),
    };
    let t = Instant::now();
    let mut buf = None;
    inputs.services.inject(Event::Init, &mut buf);
    for i in 0..n {
        inputs.services.inject(Event::InitApply(service(i, udp_every)), &mut buf);
    }
    inputs.services.inject(Event::InitDone, &mut buf);
    let mut buf = None;
    inputs.slices.inject(Event::Init, &mut buf);
    for i in 0..n {
        inputs.slices.inject(Event::InitApply(slice(i, m, None, udp_every)), &mut buf);
    }
    inputs.slices.inject(Event::InitDone, &mut buf);
    let mut buf = None;
    inputs.nodes.inject(Event::Init, &mut buf);
    inputs.nodes.inject(Event::InitApply(serde_json::from_value::<Node>(json!({"metadata": {"name": "bench-node", "resourceVersion": "1"}})).unwrap()), &mut buf);
    inputs.nodes.inject(Event::InitDone, &mut buf);
    let made = t.elapsed();
    println!("RSS with the objects only: {:.0} MiB", status_mib("VmRSS:"));

    let cidrs = vec!["10.244.0.0/16".parse().unwrap()];
    let ops = Arc::new(Mutex::new(0usize));
    let kernel = std::env::args().any(|a| a == "--kernel");
    let backend: Box<dyn Backend> = match mode {
        "nftables" if kernel => Box::new(
            ferro_proxy::nftables::backend::NftBackend::new(ferro_proxy::exec::Host, Box::new(ferro_proxy::nfcount::Netlink::new()), cidrs, false, vec![])
                .with_writer(Box::new(ferro_proxy::nftables::netlink::Kernel::new(None))),
        ),
        "iptables" => Box::new(ferro_proxy::iptables::backend::IptablesBackend::new(
            Discard,
            Box::new(ferro_proxy::nfcount::Fake(|_, _, _| Some(2))),
            cidrs,
            false,
            vec![],
        )),
        _ => Box::new(
            ferro_proxy::nftables::backend::NftBackend::new(Discard, Box::new(ferro_proxy::nfcount::Fake(|_, _, _| Some(2))), cidrs, false, vec![])
                .with_writer(Box::new(Count(ops.clone()))),
        ),
    };
    let notify = Arc::new(tokio::sync::Notify::new());
    let metrics = Arc::new(Metrics::default());
    let health = Arc::new(Health::new(Duration::from_secs(30), vec![Family::V4]));
    let triggers = controller::watch_changes(&inputs, notify.clone(), metrics.clone(), health.clone());
    let (tx, mut rx) = tokio::sync::watch::channel(Progress::default());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let cfg = LoopConfig {
        node_name: "bench-node".into(),
        families: vec![Family::V4],
        sync_period: Duration::from_secs(3600),
        min_sync_period: Duration::ZERO,
        full_sync_period: Duration::from_secs(36000),
        drift_check_period: Duration::from_secs(3600),
    };
    let c0 = cpu();
    let t0 = Instant::now();
    let task = tokio::spawn(controller::run(cfg, inputs.clone(), backend, NoConntrack, health, metrics, notify, triggers, tx, |_| {}, async move {
        let _ = stop_rx.await;
    }));
    rx.wait_for(|p| p.syncs >= 1).await.unwrap();
    let (cold, cold_cpu) = (t0.elapsed(), cpu().0 - c0.0);
    let rss_cold = status_mib("VmRSS:");
    if std::env::args().any(|a| a == "--exit-after-cold-sync") {
        // For a heap profiler: what is live now is reported as leaked, by allocation site.
        println!("{mode}: cold sync {}, RSS after it {rss_cold:.0} MiB; exiting", ms(cold));
        std::process::exit(0);
    }
    let mut lat = Vec::with_capacity(changes);
    let c1 = cpu();
    for k in 0..changes {
        let i = 1 + (k as u32 * 97) % (n - 1);
        let fresh = std::net::Ipv4Addr::from(0x0a40_0000u32 + k as u32);
        let s = slice(i, m, Some(fresh), udp_every);
        let before = rx.borrow().syncs;
        let t = Instant::now();
        let mut buf = None;
        inputs.slices.inject(Event::Apply(s), &mut buf);
        rx.wait_for(|p| p.syncs > before).await.unwrap();
        lat.push(t.elapsed());
    }
    let per_change = (cpu().0 - c1.0) / changes.max(1) as u32;
    let per_change_sys = (cpu().1 - c1.1) / changes.max(1) as u32;
    let failures = rx.borrow().failures;
    drop(stop_tx);
    let _ = task.await;
    println!(
        "{mode:9} {n} svc x {m} ep (objects made in {:.1} s): cold sync {} (cpu {}), RSS after it {:.0} MiB; one change p50 {} / p99 {}, cpu/change {} (system {}); netlink ops {}, failures {failures}",
        made.as_secs_f64(),
        ms(cold),
        ms(cold_cpu),
        rss_cold,
        ms(pct(&mut lat, 0.5)),
        ms(pct(&mut lat, 0.99)),
        ms(per_change),
        ms(per_change_sys),
        ops.lock().unwrap(),
    );
}

fn main() {
    let n: u32 = arg("--services", "10000").parse().unwrap();
    let m: u32 = arg("--endpoints", "10").parse().unwrap();
    let changes: usize = arg("--changes", "200").parse().unwrap();
    let udp_every: u32 = arg("--udp-every", "0").parse().unwrap();
    let mode = arg("--mode", "both");
    // --kernel: this process (its threads, started below, and the tools they run) in a
    // network namespace of its own, removed at the end
    let _ns = std::env::args().any(|a| a == "--kernel").then(|| {
        ferro_lab::require_root().unwrap();
        let ns = ferro_lab::netns::NetNs::new(&format!("fpx-loopb-{}", std::process::id())).unwrap();
        let f = std::fs::File::open(ns.path()).unwrap();
        nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        ns
    });
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    for md in ["iptables", "nftables"] {
        if mode == "both" || mode == md {
            rt.block_on(run(md, n, m, changes, udp_every));
        }
    }
    println!("peak RSS of this process: {:.0} MiB", status_mib("VmHWM:"));
}
