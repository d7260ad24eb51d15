//! Pod-to-pod TCP throughput and latency: across the VXLAN overlay between two nodes versus
//! over the bridge on one node (and the bare underlay between the two nodes as a baseline).
//!
//! ```sh
//! cargo build --release -p ferro-cni --bin ferro-cni --example overlay-bench
//! ./target/release/examples/overlay-bench            # as root; --seconds 5 --rr 5000
//! ```
//!
//! The world, all in namespaces named `fcob-*` (deleted on exit, also on panic, and at start
//! if a crashed run left them), nothing in the machine's root namespace:
//! - `fcob-under`: bridge `br-under`; `fcob-node1`/`fcob-node2` each have `eth0` on it
//!   (192.168.78.11/24, .12/24, MTU 1500);
//! - on each node the dataplane ferro-netd programs, set up here with `ip`/`bridge` commands
//!   (same entries, no API server needed): `ferro.vxlan` (VNI 1, port 8472, nolearning,
//!   MTU 1450, VTEP address = pod CIDR network /32), the peer's FDB entry, permanent
//!   neighbour and `<peer pod CIDR> via <peer VTEP> onlink` route;
//! - pods wired by the real ferro-cni binary (bridge `ferro0`, MTU 1450, `podCIDR`
//!   10.81.<node>.0/24): `a` and `b` on node 1, `c` on node 2.
//!
//! Measures, from pod `a`: to `b` (bridge) and to `c` (overlay), and node 1 -> node 2 over the
//! underlay: iperf3 TCP throughput (one stream, `--seconds`, receiver's figure) with the
//! sender's mean TCP RTT under load; idle ICMP RTT (`ping -c 200 -i 0.005`); and TCP
//! request/response latency (1-byte ping-pong on one connection, `--rr` round trips, p50/p99),
//! done by threads of this program that entered the namespaces with setns.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

type Res<T> = Result<T, String>;

const PREFIX: &str = "fcob-";

fn sh(args: &[&str]) -> Res<String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{args:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn ns_sh(ns: &str, args: &[&str]) -> Res<String> {
    let mut full = vec!["ip", "netns", "exec", ns];
    full.extend_from_slice(args);
    sh(&full)
}

struct World {
    names: Vec<String>,
}

impl Drop for World {
    fn drop(&mut self) {
        for n in self.names.iter().rev() {
            let _ = Command::new("ip").args(["netns", "del", n]).output();
        }
    }
}

fn cleanup_leftovers() {
    if let Ok(list) = sh(&["ip", "netns", "list"]) {
        for l in list.lines() {
            if let Some(name) = l.split_whitespace().next() {
                if name.starts_with(PREFIX) {
                    let _ = Command::new("ip").args(["netns", "del", name]).output();
                }
            }
        }
    }
}

fn add_ns(world: &mut World, name: &str) -> Res<String> {
    let n = format!("{PREFIX}{name}");
    sh(&["ip", "netns", "add", &n])?;
    world.names.push(n.clone());
    sh(&["ip", "-n", &n, "link", "set", "lo", "up"])?;
    Ok(n)
}

fn ferro_bin() -> Res<PathBuf> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let bin = exe
        .parent()
        .and_then(|p| p.parent())
        .map(|d| d.join("ferro-cni"))
        .ok_or("cannot locate the target dir")?;
    if !bin.is_file() {
        return Err(format!(
            "{} is missing: cargo build --release -p ferro-cni --bin ferro-cni",
            bin.display()
        ));
    }
    Ok(bin)
}

fn cni_add(bin: &PathBuf, node: &str, pod: &str, n: u8, data: &std::path::Path) -> Res<String> {
    let conf = json!({
        "cniVersion": "1.0.0", "name": "obnet", "type": "ferro", "bridge": "ferro0",
        "isGateway": true, "mtu": 1450, "podCIDR": format!("10.81.{n}.0/24"),
        "ipam": {"dataDir": data.join(node)},
    });
    let mut child = Command::new("ip")
        .args(["netns", "exec", node])
        .arg(bin)
        .env("CNI_COMMAND", "ADD")
        .env("CNI_CONTAINERID", pod)
        .env("CNI_NETNS", format!("/run/netns/{pod}"))
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", "/usr/lib/cni")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    child
        .stdin
        .take()
        .ok_or("stdin")?
        .write_all(conf.to_string().as_bytes())
        .map_err(|e| e.to_string())?;
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "ADD {pod}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let v: Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
    v["ips"][0]["address"]
        .as_str()
        .and_then(|a| a.split('/').next())
        .map(str::to_string)
        .ok_or_else(|| format!("no ip in {v}"))
}

fn mac_of(ns: &str, dev: &str) -> Res<String> {
    let v: Value = serde_json::from_str(&sh(&["ip", "-n", ns, "-j", "link", "show", dev])?)
        .map_err(|e| e.to_string())?;
    v[0]["address"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| format!("no mac on {dev}"))
}

fn build(world: &mut World, data: &std::path::Path) -> Res<[(String, String); 4]> {
    let bin = ferro_bin()?;
    let under = add_ns(world, "under")?;
    sh(&[
        "ip", "-n", &under, "link", "add", "br-under", "type", "bridge",
    ])?;
    sh(&["ip", "-n", &under, "link", "set", "br-under", "up"])?;
    let mut nodes = Vec::new();
    for n in 1..=2u8 {
        let node = add_ns(world, &format!("node{n}"))?;
        let up = format!("ob-up{n}");
        sh(&[
            "ip", "-n", &under, "link", "add", &up, "type", "veth", "peer", "name", "eth0",
            "netns", &node,
        ])?;
        sh(&[
            "ip", "-n", &under, "link", "set", &up, "master", "br-under", "up",
        ])?;
        let addr = format!("192.168.78.1{n}/24");
        sh(&["ip", "-n", &node, "addr", "add", &addr, "dev", "eth0"])?;
        sh(&["ip", "-n", &node, "link", "set", "eth0", "up"])?;
        sh(&[
            "ip",
            "-n",
            &node,
            "link",
            "add",
            "ferro.vxlan",
            "type",
            "vxlan",
            "id",
            "1",
            "local",
            &format!("192.168.78.1{n}"),
            "dev",
            "eth0",
            "dstport",
            "8472",
            "nolearning",
        ])?;
        sh(&[
            "ip",
            "-n",
            &node,
            "link",
            "set",
            "ferro.vxlan",
            "mtu",
            "1450",
            "up",
        ])?;
        sh(&[
            "ip",
            "-n",
            &node,
            "addr",
            "add",
            &format!("10.81.{n}.0/32"),
            "dev",
            "ferro.vxlan",
        ])?;
        nodes.push(node);
    }
    for (i, node) in nodes.iter().enumerate() {
        let j = 1 - i;
        let peer_n = j + 1;
        let peer_mac = mac_of(&nodes[j], "ferro.vxlan")?;
        sh(&[
            "bridge",
            "-n",
            node,
            "fdb",
            "append",
            &peer_mac,
            "dev",
            "ferro.vxlan",
            "dst",
            &format!("192.168.78.1{peer_n}"),
            "self",
            "permanent",
        ])?;
        let vtep = format!("10.81.{peer_n}.0");
        sh(&[
            "ip",
            "-n",
            node,
            "neigh",
            "replace",
            &vtep,
            "lladdr",
            &peer_mac,
            "dev",
            "ferro.vxlan",
            "nud",
            "permanent",
        ])?;
        sh(&[
            "ip",
            "-n",
            node,
            "route",
            "replace",
            &format!("10.81.{peer_n}.0/24"),
            "via",
            &vtep,
            "dev",
            "ferro.vxlan",
            "onlink",
        ])?;
    }
    let mut pods = Vec::new();
    for (name, n) in [("a", 1u8), ("b", 1), ("c", 2)] {
        let pod = add_ns(world, name)?;
        let ip = cni_add(&bin, &nodes[usize::from(n - 1)], &pod, n, data)?;
        pods.push((pod, ip));
    }
    let node1 = (nodes[0].clone(), "192.168.78.11".to_string());
    let node2 = (nodes[1].clone(), "192.168.78.12".to_string());
    let [a, b, c]: [(String, String); 3] = pods.try_into().map_err(|_| "pods")?;
    // Warm up ARP/neighbours both ways.
    for (from, to) in [(&a, &b.1), (&a, &c.1), (&node1, &node2.1)] {
        ns_sh(&from.0, &["ping", "-c", "2", "-W", "2", to])?;
    }
    // The fourth slot is node 2 (the underlay server); node 1 is the client by name.
    Ok([a, b, c, node2])
}

struct Figures {
    gbps: f64,
    load_rtt_us: f64,
    ping_avg_ms: f64,
    rr_p50_us: f64,
    rr_p99_us: f64,
}

fn iperf(client_ns: &str, server_ns: &str, server_ip: &str, secs: u32) -> Res<(f64, f64)> {
    let mut server = Command::new("ip")
        .args([
            "netns", "exec", server_ns, "iperf3", "-s", "-1", "-p", "5399",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("iperf3 (apt-get install -y iperf3): {e}"))?;
    std::thread::sleep(Duration::from_millis(300));
    let out = ns_sh(
        client_ns,
        &[
            "iperf3",
            "-c",
            server_ip,
            "-p",
            "5399",
            "-t",
            &secs.to_string(),
            "-J",
        ],
    );
    let _ = server.wait();
    let v: Value = serde_json::from_str(&out?).map_err(|e| e.to_string())?;
    let bps = v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .ok_or("no throughput in iperf3's output")?;
    let rtt = v["end"]["streams"][0]["sender"]["mean_rtt"]
        .as_f64()
        .unwrap_or(f64::NAN);
    Ok((bps / 1e9, rtt))
}

fn ping_avg(from: &str, to: &str) -> Res<f64> {
    let out = ns_sh(from, &["ping", "-q", "-c", "200", "-i", "0.005", to])?;
    // rtt min/avg/max/mdev = 0.030/0.045/0.120/0.010 ms
    out.lines()
        .find(|l| l.contains("min/avg/max"))
        .and_then(|l| l.split('=').nth(1))
        .and_then(|v| v.trim().split('/').nth(1))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("cannot parse ping output: {out}"))
}

fn in_ns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> Res<T> {
    let file = std::fs::File::open(format!("/run/netns/{ns}")).map_err(|e| e.to_string())?;
    std::thread::spawn(move || {
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(|e| e.to_string())?;
        Ok(f())
    })
    .join()
    .map_err(|_| "thread panicked".to_string())?
}

fn request_response(
    client_ns: &str,
    server_ns: &str,
    server_ip: &str,
    n: usize,
) -> Res<(f64, f64)> {
    let file = std::fs::File::open(format!("/run/netns/{server_ns}")).map_err(|e| e.to_string())?;
    let (tx, rx) = std::sync::mpsc::channel();
    let server = std::thread::spawn(move || -> Res<()> {
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(|e| e.to_string())?;
        let l = TcpListener::bind(("0.0.0.0", 5400)).map_err(|e| e.to_string())?;
        let _ = tx.send(());
        let (mut s, _) = l.accept().map_err(|e| e.to_string())?;
        s.set_nodelay(true).map_err(|e| e.to_string())?;
        let mut b = [0u8; 1];
        while s.read_exact(&mut b).is_ok() {
            if s.write_all(&b).is_err() {
                break;
            }
        }
        Ok(())
    });
    rx.recv_timeout(Duration::from_secs(5))
        .map_err(|_| "server did not start")?;
    let ip = server_ip.to_string();
    let mut samples = in_ns(client_ns, move || -> Res<Vec<f64>> {
        let mut s = TcpStream::connect((ip.as_str(), 5400)).map_err(|e| e.to_string())?;
        s.set_nodelay(true).map_err(|e| e.to_string())?;
        let mut b = [7u8; 1];
        let mut out = Vec::with_capacity(n);
        for i in 0..n + 100 {
            let t = Instant::now();
            s.write_all(&b).map_err(|e| e.to_string())?;
            s.read_exact(&mut b).map_err(|e| e.to_string())?;
            if i >= 100 {
                out.push(t.elapsed().as_secs_f64() * 1e6);
            }
        }
        Ok(out)
    })??;
    let _ = server.join();
    samples.sort_by(f64::total_cmp);
    let pct = |p: f64| samples[((samples.len() as f64 * p) as usize).min(samples.len() - 1)];
    Ok((pct(0.50), pct(0.99)))
}

fn measure(client: &str, server_ns: &str, server_ip: &str, secs: u32, rr: usize) -> Res<Figures> {
    let (gbps, load_rtt_us) = iperf(client, server_ns, server_ip, secs)?;
    let ping_avg_ms = ping_avg(client, server_ip)?;
    let (rr_p50_us, rr_p99_us) = request_response(client, server_ns, server_ip, rr)?;
    Ok(Figures {
        gbps,
        load_rtt_us,
        ping_avg_ms,
        rr_p50_us,
        rr_p99_us,
    })
}

fn run(secs: u32, rr: usize) -> Res<()> {
    let data = tempfile::tempdir().map_err(|e| e.to_string())?;
    let mut world = World { names: Vec::new() };
    let [a, b, c, node2] = build(&mut world, data.path())?;
    let node1 = format!("{PREFIX}node1");
    println!(
        "pods: a {} (node 1), b {} (node 1), c {} (node 2)",
        a.1, b.1, c.1
    );
    println!(
        "| path | TCP throughput (Gbit/s) | TCP RTT under load (µs) | ping avg (ms) | TCP 1-byte request/response p50 (µs) | p99 (µs) |"
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    for (label, client, server) in [
        ("pod a -> pod b, same node (bridge)", &a.0, &b),
        ("pod a -> pod c, other node (VXLAN overlay)", &a.0, &c),
        (
            "node 1 -> node 2 (underlay veth + bridge, no overlay)",
            &node1,
            &node2,
        ),
    ] {
        let f = measure(client, &server.0, &server.1, secs, rr)?;
        println!(
            "| {label} | {:.2} | {:.0} | {:.3} | {:.1} | {:.1} |",
            f.gbps, f.load_rtt_us, f.ping_avg_ms, f.rr_p50_us, f.rr_p99_us
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let get = |flag: &str, default: usize| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let secs = u32::try_from(get("--seconds", 5)).unwrap_or(5);
    let rr = get("--rr", 5000);
    cleanup_leftovers();
    match run(secs, rr) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("overlay-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
