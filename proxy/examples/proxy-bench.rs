//! ferro-proxy's sync benchmark (a program that prints figures; no assertions): N Services ×
//! M endpoints, in a network namespace of its own, for iptables and nftables mode:
//!
//! - cold sync: an empty namespace -> every rule in the kernel, through the real backend
//!   (address listing, iptables-save, render, one restore / one nft transaction);
//! - the floor, in the same run: the kernel tool alone loading the very text ferro rendered
//!   (`iptables-restore --noflush < file` / `nft -f file`) into another empty namespace;
//! - one change: a Service's endpoint replaced, then the partial sync, K times (p50/p99);
//! - a full sync over the loaded table (the periodic one, or the first after a restart or a
//!   drift), and, for iptables, what listing the nat table with `iptables-save` costs (the
//!   full sync's read before it used `iptables -S` of the built-in chains and the netlink
//!   chain dump; `--no-save` skips it: minutes at 10,000 Services);
//! - the smallest change's floor on the loaded table: a netlink commit of an empty chain, of a
//!   chain with one jump (the kernel re-validates the table's jump graph), and in iptables
//!   mode `iptables-restore --noflush` of one chain;
//! - CPU (user+system of this process and its children) per sync, and this process's peak RSS.
//!
//! `--no-floor` skips the floor's second load and `--no-full` the full sync (each minutes in
//! iptables mode at 10,000 Services).
//!
//! The model is built in memory (the informer path is not included: see docs/performance.md).
//!
//! `cargo run --release -p ferro-proxy --example proxy-bench -- [--services 10000]
//!  [--endpoints 10] [--changes 100] [--mode iptables|nftables|both]` (as root).
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ferro_lab::netns::NetNs;
use ferro_proxy::controller::Backend;
use ferro_proxy::error::ExecError;
use ferro_proxy::exec::{Host, Runner};
use ferro_proxy::iptables::backend::IptablesBackend;
use ferro_proxy::model::{Endpoint, Family, FamilyModel, NodeInfo, Protocol, ServiceEntry, ServicePort, ServicePortName};
use ferro_proxy::nftables::backend::NftBackend;

/// Moves the calling thread into a namespace (its children are spawned there), as ferro-proxy
/// runs inside the node's namespace: no `ip netns exec` per tool call.
fn enter(ns: &NetNs) {
    let f = std::fs::File::open(ns.path()).unwrap();
    nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
}

/// Records the last stdin given to the restore tool (the text the floor loads).
struct Capture<R: Runner> {
    inner: R,
    last: std::sync::Arc<std::sync::Mutex<String>>,
}

impl<R: Runner> Runner for Capture<R> {
    fn run(&mut self, program: &str, args: &[&str], stdin: Option<&str>) -> Result<String, ExecError> {
        if let Some(t) = stdin {
            *self.last.lock().unwrap() = t.to_string();
        }
        self.inner.run(program, args, stdin)
    }
}

fn arg(name: &str, default: &str) -> String {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned()).unwrap_or_else(|| default.to_string())
}

fn endpoint(i: u32) -> Endpoint {
    Endpoint {
        ip: std::net::IpAddr::V4(std::net::Ipv4Addr::from(0x0af4_0000u32 + i)),
        port: 8080,
        ready: true,
        serving: true,
        terminating: false,
        local: i.is_multiple_of(7),
        zone: None,
        zone_hints: BTreeSet::new(),
    }
}

fn model(services: u32, endpoints: u32) -> FamilyModel {
    let mut m = FamilyModel { family: Family::V4, services: Default::default() };
    for s in 0..services {
        let name = ServicePortName { namespace: format!("ns{}", s % 50).into(), name: format!("svc{s}").into(), port: "http".into(), protocol: Protocol::Tcp };
        let port = ServicePort {
            name: name.clone(),
            cluster_ip: std::net::IpAddr::V4(std::net::Ipv4Addr::from(0x0a60_0000u32 + s + 1)),
            port: 80,
            protocol: Protocol::Tcp,
            node_port: if s % 10 == 0 { 30000 + (s / 10) as u16 % 2768 } else { 0 },
            external_ips: vec![],
            load_balancer_ips: vec![],
            load_balancer_source_ranges: vec![],
            affinity_seconds: None,
            external_policy_local: false,
            internal_policy_local: false,
            health_check_node_port: 0,
            topology_aware: false,
        };
        let eps = (0..endpoints).map(|e| endpoint(s * endpoints + e + 1)).collect();
        m.services.insert(name, std::sync::Arc::new(ServiceEntry { port, endpoints: eps }));
    }
    m
}

#[derive(Clone, Copy)]
struct Cpu(Duration);

fn cpu() -> Cpu {
    use nix::sys::resource::{getrusage, UsageWho};
    let tv = |t: nix::sys::time::TimeVal| Duration::from_secs(t.tv_sec() as u64) + Duration::from_micros(t.tv_usec() as u64);
    let a = getrusage(UsageWho::RUSAGE_SELF).unwrap();
    let b = getrusage(UsageWho::RUSAGE_CHILDREN).unwrap();
    Cpu(tv(a.user_time()) + tv(a.system_time()) + tv(b.user_time()) + tv(b.system_time()))
}

fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|k| k.parse::<f64>().ok())
        .map(|k| k / 1024.0)
        .unwrap_or(0.0)
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn load_floor(mode: &str, text: &str, tag: &str) -> Duration {
    let ns = NetNs::new(&format!("fpx-bench-floor-{tag}-{}", std::process::id())).unwrap();
    let file = std::env::temp_dir().join(format!("fpx-bench-{}.txt", std::process::id()));
    std::fs::write(&file, text).unwrap();
    let mode = mode.to_string();
    let file2 = file.clone();
    let took = std::thread::scope(|s| {
        s.spawn(|| {
            enter(&ns);
            let mut c = match mode.as_str() {
                "iptables" => {
                    let mut c = Command::new("iptables-restore");
                    c.args(["-w", "--noflush"]).stdin(std::fs::File::open(&file2).unwrap());
                    c
                }
                _ => {
                    let mut c = Command::new("nft");
                    c.arg("-f").arg(&file2);
                    c
                }
            };
            c.stdout(Stdio::null());
            let t = Instant::now();
            let st = c.status().unwrap();
            let took = t.elapsed();
            assert!(st.success(), "floor load failed");
            took
        })
        .join()
        .unwrap()
    });
    let _ = std::fs::remove_file(&file);
    took
}


fn run(mode: &str, services: u32, endpoints: u32, changes: usize) {
    let ns = NetNs::new(&format!("fpx-bench-{mode}-{}", std::process::id())).unwrap();
    std::thread::scope(|s| s.spawn(|| run_in(&ns, mode, services, endpoints, changes)).join().unwrap());
}

fn run_in(ns: &NetNs, mode: &str, services: u32, endpoints: u32, changes: usize) {
    enter(ns);
    let last = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let runner = Capture { inner: Host, last: last.clone() };
    let cidrs = vec!["10.244.0.0/16".parse().unwrap()];
    let mut backend: Box<dyn Backend> = match mode {
        "iptables" => Box::new(IptablesBackend::new(runner, Box::new(ferro_proxy::nfcount::Netlink::new()), cidrs, false, vec![])),
        // as ferro-proxy runs it: partial syncs through netlink (proxy/src/backend.rs)
        _ => Box::new(
            NftBackend::new(runner, Box::new(ferro_proxy::nfcount::Netlink::new()), cidrs, false, vec![])
                .with_writer(Box::new(ferro_proxy::nftables::netlink::Kernel::new(None))),
        ),
    };
    let node = NodeInfo { name: "bench".into(), zone: None };
    let mut m = model(services, endpoints);
    let c0 = cpu();
    let t = Instant::now();
    backend.sync(std::slice::from_ref(&m), &node, true).unwrap();
    let cold = t.elapsed();
    let cold_cpu = cpu().0 - c0.0;
    let text = last.lock().unwrap().clone();
    let floor = (!std::env::args().any(|a| a == "--no-floor")).then(|| load_floor(mode, &text, mode));
    let mut times = Vec::with_capacity(changes);
    let c1 = cpu();
    for k in 0..changes {
        let s = (k as u64 * 7919 % services as u64) as usize;
        let entry = m.services.values_mut().nth(s).unwrap();
        let fresh = endpoint(services * endpoints + 1 + k as u32);
        std::sync::Arc::make_mut(entry).endpoints[k % endpoints as usize] = fresh;
        let t = Instant::now();
        let rep = backend.sync(std::slice::from_ref(&m), &node, false).unwrap();
        times.push(t.elapsed());
        assert!(!rep.full);
    }
    let change_cpu = (cpu().0 - c1.0) / changes.max(1) as u32;
    let (p50, p99) = (pct(&mut times, 0.5), pct(&mut times, 0.99));
    commit_floors(mode);
    if std::env::args().any(|a| a == "--no-full") {
        print_summary(mode, services, endpoints, cold, floor, cold_cpu, p50, p99, change_cpu, text.len());
        return;
    }
    let c2 = cpu();
    let t = Instant::now();
    let rep = backend.sync(std::slice::from_ref(&m), &node, true).unwrap();
    assert!(rep.full);
    let full = t.elapsed();
    let full_cpu = cpu().0 - c2.0;
    let save = (mode == "iptables" && !std::env::args().any(|a| a == "--no-save")).then(|| {
        let t = Instant::now();
        let out = Command::new("iptables-save").args(["-t", "nat"]).stdout(Stdio::null()).status().unwrap();
        assert!(out.success(), "iptables-save failed");
        t.elapsed()
    });
    println!(
        "{mode:9} full sync over the loaded table {}, cpu {}{}",
        ms(full),
        ms(full_cpu),
        save.map(|d| format!("; iptables-save -t nat alone {}", ms(d))).unwrap_or_default()
    );
    print_summary(mode, services, endpoints, cold, floor, cold_cpu, p50, p99, change_cpu, text.len());
}

#[allow(clippy::too_many_arguments)]
fn print_summary(
    mode: &str,
    services: u32,
    endpoints: u32,
    cold: Duration,
    floor: Option<Duration>,
    cold_cpu: Duration,
    p50: Duration,
    p99: Duration,
    change_cpu: Duration,
    text_len: usize,
) {
    let floor = floor.map_or("floor not measured".to_string(), |f| format!("floor {}: {:.2}x", ms(f), cold.as_secs_f64() / f.as_secs_f64()));
    println!(
        "{mode:9} {services} svc x {endpoints} ep: cold sync {} ({floor}), cpu {}; one change p50 {} p99 {}, cpu/change {}; restore text {:.1} MiB",
        ms(cold),
        ms(cold_cpu),
        ms(p50),
        ms(p99),
        ms(change_cpu),
        text_len as f64 / 1048576.0
    );
}

/// What the kernel (and, in iptables mode, the tool) alone takes for the smallest change, on
/// the table as loaded, in this run: a netlink commit that adds an empty chain (nothing for the
/// kernel to validate), one that adds a chain with one `jump` rule (nf_tables re-validates
/// the table's whole jump graph from its base chains at such a commit: an endpoint change
/// always adds a jump or a dnat), and in iptables mode `iptables-restore --noflush` of a text
/// declaring one chain (the tool fetches the table first). Each probe is undone at once; the
/// medians of `PROBES` rounds are printed.
fn commit_floors(mode: &str) {
    use ferro_proxy::nftables::netlink::{Kernel, NftWriter, Op};
    use ferro_proxy::nftables::rule::Rule;
    const PROBES: usize = 15;
    let (table, target) = if mode == "iptables" { ("nat", "KUBE-MARK-MASQ") } else { ("kube-proxy", ferro_proxy::nftables::rule::MARK_CHAIN) };
    let mut k = Kernel::new(None);
    let probe = "ferro-bench-probe".to_string();
    let mut time = |ops: Vec<Op>| {
        let t = Instant::now();
        k.apply(Family::V4, table, &ops).unwrap();
        let took = t.elapsed();
        k.apply(Family::V4, table, &[Op::FlushChain(probe.clone()), Op::DeleteChain(probe.clone())]).unwrap();
        took
    };
    let mut empty: Vec<Duration> = (0..PROBES).map(|_| time(vec![Op::AddChain(probe.clone())])).collect();
    let mut jump: Vec<Duration> = (0..PROBES)
        .map(|_| time(vec![Op::AddChain(probe.clone()), Op::AddRule { chain: probe.clone(), rule: Rule::Jump(target.into()) }]))
        .collect();
    let tool = (mode == "iptables").then(|| {
        let mut v: Vec<Duration> = (0..PROBES)
            .map(|_| {
                let t = Instant::now();
                let mut c = Command::new("iptables-restore").args(["-w", "--noflush"]).stdin(Stdio::piped()).spawn().unwrap();
                std::io::Write::write_all(c.stdin.as_mut().unwrap(), b"*nat\n:FERRO-BENCH-PROBE - [0:0]\nCOMMIT\n").unwrap();
                assert!(c.wait().unwrap().success(), "iptables-restore of the probe failed");
                let took = t.elapsed();
                let st = Command::new("iptables").args(["-w", "-t", "nat", "-X", "FERRO-BENCH-PROBE"]).status().unwrap();
                assert!(st.success(), "iptables -X of the probe failed");
                took
            })
            .collect();
        pct(&mut v, 0.5)
    });
    println!(
        "{mode:9} smallest change on this table (median of {PROBES}): netlink commit of an empty chain {}, of a chain with one jump {}{}",
        ms(pct(&mut empty, 0.5)),
        ms(pct(&mut jump, 0.5)),
        tool.map(|d| format!(", iptables-restore --noflush of one chain {}", ms(d))).unwrap_or_default()
    );
}

fn main() {
    ferro_lab::require_root().unwrap();
    // iptables-save overflows the default 8 MiB stack at 110,000 chains (as ferro-proxy does)
    ferro_proxy::exec::raise_tool_stack_limit().unwrap();
    let services: u32 = arg("--services", "10000").parse().unwrap();
    let endpoints: u32 = arg("--endpoints", "10").parse().unwrap();
    let changes: usize = arg("--changes", "100").parse().unwrap();
    let mode = arg("--mode", "both");
    for m in ["iptables", "nftables"] {
        if mode == "both" || mode == m {
            run(m, services, endpoints, changes);
        }
    }
    println!("peak RSS of this process (models, states, texts): {:.0} MiB", peak_rss_mib());
}
