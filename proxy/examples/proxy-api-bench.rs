//! ferro-proxy's end-to-end benchmark (a program that prints figures; no assertions): the real
//! ferro-control-plane and the real ferro-proxy binary in a network namespace of their own,
//! N Services × M endpoints made through the API, for iptables and nftables mode:
//!
//! - cold start: ferro-proxy started -> its first sync done (/healthz), and the sync itself
//!   as the proxy's metrics report it;
//! - ferro-proxy's RSS (VmRSS / VmHWM) after the cold sync and after the changes;
//! - one change: an EndpointSlice's endpoint replaced through the API, timed from just before
//!   the write to the new endpoint's chain present in the kernel (polled through the netlink
//!   rule probe, which costs the same at any table size), K times 1.1 s apart (past
//!   minSyncPeriod, so no change waits for the rate limit) (p50/p99), and the proxy's CPU per
//!   change;
//! - the data path: new TCP connections from the node to the 1st and to the Nth Service's
//!   ClusterIP (both Services' endpoints are addresses of one pod namespace that accepts),
//!   p50/p99 of connect();
//! - the floor of the cold sync, in the same run: the node namespace's rules as the kernel
//!   tool lists them once the proxy is stopped (`iptables-save`, `nft list table`), loaded by
//!   the tool alone into an empty namespace (`iptables-restore`, `nft -f`), timed (`--no-floor`
//!   leaves it out).
//!
//! `cargo build --release -p ferro-control-plane -p ferro-proxy --bins --example proxy-api-bench
//!  && ./target/release/examples/proxy-api-bench [--services 10000] [--endpoints 10]
//!  [--changes 100] [--mode iptables|nftables|both] [--no-floor]` (as root; everything it
//!  makes is removed).
#![allow(clippy::unwrap_used)]

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ferro_lab::netns::NetNs;
use ferro_proxy::model::{Endpoint, Family, Protocol, ServicePortName};
use ferro_proxy::nfcount::{Netlink, RuleCounter};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

const POD_GW: &str = "10.244.0.1";

fn arg(name: &str, default: &str) -> String {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned()).unwrap_or_else(|| default.to_string())
}

fn enter(path: &str) {
    let f = std::fs::File::open(path).unwrap();
    nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
}

fn sh(args: &[&str]) {
    let st = Command::new(args[0]).args(&args[1..]).status().unwrap();
    assert!(st.success(), "{args:?}");
}

/// A child process killed (by its pid) when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn release_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let bin = exe.parent().unwrap().parent().unwrap().join(name);
    assert!(bin.exists(), "{} missing: cargo build --release -p ferro-control-plane -p ferro-proxy --bins", bin.display());
    bin
}

/// The endpoint addresses of Service i: the pod's addresses for the first and the last
/// Service (they answer), made-up ones elsewhere.
fn endpoint_ip(i: u32, j: u32, n: u32) -> Ipv4Addr {
    if i == 0 || i == n - 1 {
        Ipv4Addr::new(10, 244, 0, 11 + j as u8)
    } else {
        Ipv4Addr::from(0x0a80_0000u32 + i * 16 + j)
    }
}

fn slice(i: u32, ips: &[Ipv4Addr]) -> EndpointSlice {
    let eps: Vec<_> = ips.iter().map(|ip| json!({"addresses": [ip.to_string()], "conditions": {"ready": true}, "nodeName": "bench-node"})).collect();
    serde_json::from_value(json!({
        "metadata": {"name": format!("svc-{i}-1"), "namespace": "default", "labels": {"kubernetes.io/service-name": format!("svc-{i}")}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": eps,
    }))
    .unwrap()
}

fn spn(i: u32) -> ServicePortName {
    ServicePortName { namespace: "default".into(), name: format!("svc-{i}").into(), port: "http".into(), protocol: Protocol::Tcp }
}

fn ep(ip: Ipv4Addr) -> Endpoint {
    Endpoint { ip: ip.into(), port: 8080, ready: true, serving: true, terminating: false, local: false, zone: None, zone_hints: Default::default() }
}

/// The chain a new endpoint gets, and where it lives.
fn endpoint_chain(mode: &str, i: u32, ip: Ipv4Addr) -> (&'static str, String) {
    match mode {
        "iptables" => ("nat", ferro_proxy::names::sep_chain(&spn(i), &ep(ip))),
        _ => ("kube-proxy", ferro_proxy::nftables::rules::endpoint_chain(&spn(i), &ep(ip))),
    }
}

fn status_kib(pid: u32, key: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// utime + stime of a process, in clock ticks converted to a Duration.
fn cpu_of(pid: u32) -> Duration {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = s.rsplit_once(") ").map(|x| x.1).unwrap_or_default();
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0) + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100) as u64;
    Duration::from_micros(ticks * 1_000_000 / hz)
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn us(d: Duration) -> String {
    format!("{:.0} µs", d.as_secs_f64() * 1e6)
}

fn metric(body: &str, name: &str) -> Option<f64> {
    body.lines().find(|l| l.starts_with(name) && l[name.len()..].starts_with(' ')).and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse().ok())
}

fn http_get(addr: &str, path: &str) -> Option<String> {
    use std::io::{Read as _, Write as _};
    let mut s = TcpStream::connect_timeout(&addr.parse().ok()?, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    body.contains(" 200 ").then_some(body)
}

/// Polls `cond` every `every` until it holds; the time it took.
fn wait_until(what: &str, timeout: Duration, every: Duration, mut cond: impl FnMut() -> bool) -> Duration {
    let t = Instant::now();
    while !cond() {
        assert!(t.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(every);
    }
    t.elapsed()
}

/// connect() latencies to `addr`, `n` new connections.
fn connects(addr: SocketAddr, n: usize) -> Vec<Duration> {
    (0..n)
        .map(|_| {
            let t = Instant::now();
            let s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap();
            let d = t.elapsed();
            drop(s);
            d
        })
        .collect()
}

fn run(mode: &str, n: u32, m: u32, changes: usize, dir: &Path) {
    let tag = format!("fpx-apib-{}-{}", &mode[..3], std::process::id());
    let node = NetNs::new(&format!("{tag}-n")).unwrap();
    let pod = NetNs::new(&format!("{tag}-p")).unwrap();
    let (nn, pn) = (node.name().to_string(), pod.name().to_string());
    sh(&["ip", "-n", &nn, "link", "add", "pod0h", "type", "veth", "peer", "name", "eth0", "netns", &pn]);
    sh(&["ip", "-n", &nn, "addr", "add", &format!("{POD_GW}/24"), "dev", "pod0h"]);
    sh(&["ip", "-n", &nn, "link", "set", "pod0h", "up"]);
    sh(&["ip", "-n", &nn, "route", "add", "default", "dev", "pod0h"]);
    for j in 0..m {
        sh(&["ip", "-n", &pn, "addr", "add", &format!("10.244.0.{}/24", 11 + j), "dev", "eth0"]);
    }
    sh(&["ip", "-n", &pn, "link", "set", "eth0", "up"]);
    sh(&["ip", "-n", &pn, "route", "add", "default", "via", POD_GW]);
    // the pod: accepts and closes, on a thread inside its namespace
    let pod_path = pod.path();
    std::thread::spawn(move || {
        enter(&pod_path);
        let l = TcpListener::bind("0.0.0.0:8080").unwrap();
        for c in l.incoming() {
            drop(c);
        }
    });
    // this thread and everything it spawns from here on: inside the node namespace
    let node_path = node.path();
    let result = std::thread::spawn({
        let mode = mode.to_string();
        let dir = dir.to_path_buf();
        move || {
            enter(&node_path);
            measure(&mode, n, m, changes, &dir)
        }
    })
    .join();
    drop(pod);
    drop(node);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

fn measure(mode: &str, n: u32, m: u32, changes: usize, dir: &Path) {
    let data = dir.join(format!("cp-{mode}"));
    let cp_log = std::fs::File::create(dir.join(format!("control-plane-{mode}.log"))).unwrap();
    let _cp = Proc(
        Command::new(release_bin("ferro-control-plane"))
            .arg("--data-dir")
            .arg(&data)
            .args(["--bind-address", "127.0.0.1", "--secure-port", "6443", "--controllers", "*"])
            .stdout(Stdio::null())
            .stderr(cp_log)
            .spawn()
            .unwrap(),
    );
    let kubeconfig = data.join("admin.kubeconfig");
    wait_until("the control plane's kubeconfig", Duration::from_secs(60), Duration::from_millis(50), || kubeconfig.exists());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let client = rt.block_on(async {
        let kc = kube::config::Kubeconfig::read_from(&kubeconfig).unwrap();
        let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.unwrap();
        kube::Client::try_from(cfg).unwrap()
    });
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    let t = Instant::now();
    rt.block_on(async {
        loop {
            if services.list(&Default::default()).await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
        nodes.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "bench-node"}})).unwrap()).await.unwrap();
        futures::stream::iter(0..n)
            .map(|i| {
                let (services, slices) = (services.clone(), slices.clone());
                async move {
                    let svc: Service = serde_json::from_value(json!({
                        "metadata": {"name": format!("svc-{i}")},
                        "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]},
                    }))
                    .unwrap();
                    services.create(&PostParams::default(), &svc).await.unwrap();
                    let ips: Vec<Ipv4Addr> = (0..m).map(|j| endpoint_ip(i, j, n)).collect();
                    slices.create(&PostParams::default(), &slice(i, &ips)).await.unwrap();
                }
            })
            .buffer_unordered(32)
            .collect::<Vec<()>>()
            .await;
    });
    let made = t.elapsed();
    let vip = |i: u32| -> Ipv4Addr {
        let s = rt.block_on(services.get(&format!("svc-{i}"))).unwrap();
        s.spec.unwrap().cluster_ip.unwrap().parse().unwrap()
    };
    let (first_vip, last_vip) = (vip(0), vip(n - 1));

    // the proxy
    let proxy_log = std::fs::File::create(dir.join(format!("proxy-{mode}.log"))).unwrap();
    let proxy = Proc(
        Command::new(release_bin("ferro-proxy"))
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["--hostname-override", "bench-node", "--proxy-mode", mode, "--cluster-cidr", "10.244.0.0/16"])
            .args(["--healthz-bind-address", "127.0.0.1:10256", "--metrics-bind-address", "127.0.0.1:10249"])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(proxy_log)
            .spawn()
            .unwrap(),
    );
    let pid = proxy.0.id();
    // polled every 100 ms: a tighter poll of /healthz takes CPU from the sync it waits for
    let cold = wait_until("the first sync", Duration::from_secs(1800), Duration::from_millis(100), || {
        http_get("127.0.0.1:10256", "/healthz").is_some_and(|b| b.contains("lastUpdated"))
    });
    let metrics = http_get("127.0.0.1:10249", "/metrics").unwrap_or_default();
    let full_sync = metric(&metrics, "kubeproxy_sync_full_proxy_rules_duration_seconds_sum").unwrap_or(f64::NAN);
    let (rss_cold, hwm_cold) = (status_kib(pid, "VmRSS:"), status_kib(pid, "VmHWM:"));

    // data path, before the changes
    let mut to_first = connects(SocketAddr::new(first_vip.into(), 80), 300);
    let mut to_last = connects(SocketAddr::new(last_vip.into(), 80), 300);

    // one change at a time: an endpoint of Service i replaced
    let mut probe = Netlink::new();
    let mut lat = Vec::with_capacity(changes);
    let cpu0 = cpu_of(pid);
    // the cold sync counts as the first write: a change within minSyncPeriod of it waits
    let mut last_write: Option<Instant> = Some(Instant::now());
    for k in 0..changes {
        // changes further apart than minSyncPeriod (1 s): each is synced as it arrives, not
        // held back by the rate limit (a burst inside one period is one sync, by design)
        if let Some(t) = last_write {
            std::thread::sleep(Duration::from_millis(1100).saturating_sub(t.elapsed()));
        }
        let i = 1 + (k as u32 * 97) % (n - 2);
        let new_ip = Ipv4Addr::from(0x0a40_0000u32 + k as u32);
        let mut ips: Vec<Ipv4Addr> = (0..m).map(|j| endpoint_ip(i, j, n)).collect();
        ips[0] = new_ip;
        let (table, chain) = endpoint_chain(mode, i, new_ip);
        let patch = json!({"endpoints": slice(i, &ips).endpoints});
        let t0 = Instant::now();
        last_write = Some(t0);
        rt.block_on(slices.patch(&format!("svc-{i}-1"), &PatchParams::default(), &Patch::Merge(&patch))).unwrap();
        wait_until("the new endpoint's chain", Duration::from_secs(60), Duration::from_millis(5), || {
            probe.count(Family::V4, table, &chain).ok().flatten().is_some_and(|c| c > 0)
        });
        lat.push(t0.elapsed());
    }
    let cpu = cpu_of(pid).saturating_sub(cpu0);
    let (rss, hwm) = (status_kib(pid, "VmRSS:"), status_kib(pid, "VmHWM:"));
    drop(proxy);

    println!("mode {mode}: {n} Services × {m} endpoints (made through the API in {:.1} s)", made.as_secs_f64());
    println!("  cold start: proxy started -> first sync done {:.2} s (the full sync itself: {full_sync:.2} s)", cold.as_secs_f64());
    println!("  ferro-proxy RSS after the cold sync {:.1} MiB (peak {:.1} MiB)", rss_cold as f64 / 1024.0, hwm_cold as f64 / 1024.0);
    println!(
        "  one change, API write -> rule in the kernel: p50 {} / p99 {} over {changes}; proxy CPU per change {}",
        ms(pct(&mut lat, 0.5)),
        ms(pct(&mut lat, 0.99)),
        ms(cpu / changes.max(1) as u32)
    );
    println!("  ferro-proxy RSS after the changes {:.1} MiB (peak {:.1} MiB)", rss as f64 / 1024.0, hwm as f64 / 1024.0);
    println!(
        "  new connection to the 1st Service: p50 {} / p99 {}; to the {n}th: p50 {} / p99 {}",
        us(pct(&mut to_first, 0.5)),
        us(pct(&mut to_first, 0.99)),
        us(pct(&mut to_last, 0.5)),
        us(pct(&mut to_last, 0.99))
    );
    if !std::env::args().any(|a| a == "--no-floor") {
        let (took, bytes) = floor(mode, dir);
        println!(
            "  floor: the tool alone loads the same rules ({:.1} MiB of text) into an empty namespace in {:.2} s; cold sync / floor {:.2}x",
            bytes as f64 / 1048576.0,
            took.as_secs_f64(),
            full_sync / took.as_secs_f64()
        );
    }
}

/// The cold sync's floor: the rules in this thread's (the node's) namespace, listed by the
/// mode's tool, then loaded by the tool alone into an empty namespace of their own; the time
/// of the load, and the text's size.
fn floor(mode: &str, dir: &Path) -> (Duration, usize) {
    let save = |args: &[&str]| -> String {
        let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
        assert!(out.status.success(), "{args:?}: {} {}", out.status, String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let (text, load): (String, &[&str]) = match mode {
        "iptables" => (format!("{}{}", save(&["iptables-save", "-t", "filter"]), save(&["iptables-save", "-t", "nat"])), &["iptables-restore", "-w"]),
        _ => (save(&["nft", "list", "table", "ip", "kube-proxy"]), &["nft", "-f"]),
    };
    let file = dir.join(format!("floor-{mode}.rules"));
    std::fs::write(&file, &text).unwrap();
    let ns = NetNs::new(&NetNs::unique_name("fpx-apib-floor")).unwrap();
    let mut cmd = ns.command(load[0]);
    cmd.args(&load[1..]);
    if mode == "nftables" {
        cmd.arg(&file);
    } else {
        cmd.stdin(std::fs::File::open(&file).unwrap());
    }
    let t = Instant::now();
    let out = cmd.output().unwrap();
    // (the listing itself is not timed: iptables-save of 110,000 chains takes minutes)
    let took = t.elapsed();
    assert!(out.status.success(), "{load:?} in {}: {}", ns.name(), String::from_utf8_lossy(&out.stderr));
    drop(ns);
    (took, text.len())
}

fn main() {
    assert!(nix::unistd::geteuid().is_root(), "run as root: the benchmark builds network namespaces");
    // iptables-save of the floor's listing needs the stack ferro-proxy gives its tools
    ferro_proxy::exec::raise_tool_stack_limit().unwrap();
    let n: u32 = arg("--services", "10000").parse().unwrap();
    let m: u32 = arg("--endpoints", "10").parse().unwrap();
    let changes: usize = arg("--changes", "100").parse().unwrap();
    assert!(n >= 3 && (1..=16).contains(&m), "--services at least 3, --endpoints 1..16");
    let dir = tempfile::Builder::new().prefix("ferro-proxy-api-bench").tempdir().unwrap();
    let modes: Vec<&str> = match arg("--mode", "both").as_str() {
        "both" => vec!["iptables", "nftables"],
        "iptables" => vec!["iptables"],
        "nftables" => vec!["nftables"],
        other => panic!("--mode {other}?"),
    };
    for mode in modes {
        run(mode, n, m, changes, dir.path());
    }
}
