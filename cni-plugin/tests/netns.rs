//! Privileged tests: the real ferro-cni binary against real network namespaces.
//!
//! Needs root (the suite runs as root in CI). Without root every test FAILS with a clear
//! message; none is skipped. Each test builds its own world: a "node" namespace the plugin
//! runs in (`ip netns exec`), one namespace per container, and a temp IPAM data dir. Nothing
//! is changed in the machine's root namespace; `ferro_lab::netns::NetNs` deletes the
//! namespaces on drop, also on panic.
#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use ferro_lab::netns::NetNs;
use serde_json::{json, Value};

const BRIDGE: &str = "fcbr0";
const SUBNET: &str = "10.77.0.0/24";
const GATEWAY: &str = "10.77.0.1";

fn require_root() {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let euid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or("?")
        .to_string();
    assert_eq!(
        euid, "0",
        "ferro-cni netns tests need root (CAP_NET_ADMIN + CAP_SYS_ADMIN to create network \
         namespaces); run the suite as root"
    );
}

/// A fresh namespace of a unique name, `lo` down: what a container runtime hands to the
/// plugin (ADD must bring `lo` up itself). Deleted on drop.
fn new_ns() -> NetNs {
    require_root();
    NetNs::new_bare(&NetNs::unique_name("ferro-cni-test")).unwrap()
}

/// `ip -n <ns> -j ARGS` as JSON (`[]` for no output).
fn ip_json(ns: &NetNs, args: &[&str]) -> Value {
    let mut full = vec!["-j"];
    full.extend_from_slice(args);
    let out = ns.ip(&full).unwrap();
    if out.trim().is_empty() {
        return json!([]);
    }
    serde_json::from_str(&out).unwrap()
}

/// One node: its namespace, an IPAM data dir and the network config.
struct Node {
    ns: NetNs,
    data: tempfile::TempDir,
}

impl Node {
    fn new() -> Node {
        Node {
            ns: new_ns(),
            data: tempfile::tempdir().unwrap(),
        }
    }

    fn conf(&self) -> String {
        self.conf_with(false)
    }

    fn conf_with(&self, ip_masq: bool) -> String {
        json!({
            "cniVersion": "1.0.0",
            "name": "testnet",
            "type": "ferro",
            "bridge": BRIDGE,
            "isGateway": true,
            "mtu": 1400,
            "ipMasq": ip_masq,
            "ipam": {"ranges": [[{"subnet": SUBNET}]], "dataDir": self.data.path()},
        })
        .to_string()
    }

    fn plugin(&self, command: &str, id: &str, netns: &str) -> Output {
        self.plugin_with(command, id, netns, &self.conf())
    }

    fn plugin_with(&self, command: &str, id: &str, netns: &str, conf: &str) -> Output {
        let mut child = Command::new("ip")
            .args([
                "netns",
                "exec",
                self.ns.name(),
                env!("CARGO_BIN_EXE_ferro-cni"),
            ])
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", id)
            .env("CNI_NETNS", netns)
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", "/usr/lib/cni")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let _ = child.stdin.take().unwrap().write_all(conf.as_bytes());
        child.wait_with_output().unwrap()
    }

    fn add(&self, id: &str, c: &NetNs) -> Value {
        let out = self.plugin("ADD", id, &c.path());
        assert!(
            out.status.success(),
            "ADD {id}: stdout {} stderr {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    fn del(&self, id: &str, netns: &str) {
        self.del_with(id, netns, &self.conf());
    }

    fn add_with(&self, id: &str, c: &NetNs, conf: &str) -> Value {
        let out = self.plugin_with("ADD", id, &c.path(), conf);
        assert!(
            out.status.success(),
            "ADD {id}: stdout {} stderr {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    fn del_with(&self, id: &str, netns: &str, conf: &str) {
        let out = self.plugin_with("DEL", id, netns, conf);
        assert!(
            out.status.success(),
            "DEL {id}: stdout {} stderr {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.stdout.is_empty(), "DEL prints nothing on success");
        // DEL returns with the attachment inert: the container interface (the pair itself is
        // deleted by a detached child, maybe not yet) has no address left.
        if let Some(ns) = netns.strip_prefix("/run/netns/") {
            let out = Command::new("ip")
                .args(["-n", ns, "-j", "addr", "show", "dev", "eth0"])
                .output()
                .unwrap();
            if out.status.success() && !out.stdout.iter().all(u8::is_ascii_whitespace) {
                let v: Value = serde_json::from_slice(&out.stdout).unwrap();
                let addrs = v[0]["addr_info"].as_array().cloned().unwrap_or_default();
                assert!(addrs.is_empty(), "DEL {id}: eth0 in {ns} keeps {addrs:?}");
            }
        }
    }

    /// Reserved addresses (files named after an IP) in the IPAM dir.
    fn ip_files(&self) -> Vec<String> {
        let dir: PathBuf = self.data.path().join("testnet");
        ip_files_in(&dir)
    }

    /// Links enslaved to the bridge (veth host ends).
    fn bridge_ports(&self) -> Vec<String> {
        ip_json(&self.ns, &["link", "show", "master", BRIDGE])
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["ifname"].as_str().unwrap().to_string())
            .collect()
    }

    /// `iptables -t nat -S` inside the node namespace, one rule per line.
    fn nat_rules(&self) -> Vec<String> {
        let out = Command::new("ip")
            .args([
                "netns",
                "exec",
                self.ns.name(),
                "iptables",
                "-t",
                "nat",
                "-S",
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "iptables -t nat -S in {} failed (ipMasq tests need iptables with the nf_tables \
             backend: apt-get install -y iptables; scripts/lib.sh installs it for CI): {}",
            self.ns.name(),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// nat rules and chain declarations that mention a FERRO-MASQ chain.
    fn masq_rules(&self) -> Vec<String> {
        self.nat_rules()
            .into_iter()
            .filter(|l| l.contains("FERRO-MASQ-"))
            .collect()
    }

    /// The veth links in the node namespace once every DEL's detached link reaper has
    /// finished.
    fn settled_veths(&self) -> Vec<String> {
        wait_for_reapers();
        self.veths()
    }

    /// All veth links in the node namespace.
    fn veths(&self) -> Vec<String> {
        ip_json(&self.ns, &["link", "show", "type", "veth"])
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["ifname"].as_str().unwrap().to_string())
            .collect()
    }
}

/// Pids of running `ferro-cni --reap-link` children (DEL deletes the veth pair in one).
fn reapers() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                c.split(|b| *b == 0)
                    .nth(1)
                    .is_some_and(|a| a == ferro_cni::dataplane::REAP_ARG.as_bytes())
            })
        })
        .collect()
}

/// Waits until no link reaper runs (they take milliseconds; a minute means one is stuck).
fn wait_for_reapers() {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let left = reapers();
        if left.is_empty() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "link reapers still running: {left:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn ip_files_in(dir: &Path) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
        .collect()
}

fn result_ip(result: &Value) -> String {
    let addr = result["ips"][0]["address"].as_str().unwrap();
    addr.split('/').next().unwrap().to_string()
}

fn ping_cmd() -> Vec<String> {
    for p in ["/bin/busybox", "/usr/bin/busybox"] {
        if Path::new(p).exists() {
            return vec![p.into(), "ping".into()];
        }
    }
    for p in ["/usr/bin/ping", "/bin/ping"] {
        if Path::new(p).exists() {
            return vec![p.into()];
        }
    }
    panic!("no ping on this machine: install iputils-ping (apt-get install -y iputils-ping) or busybox");
}

fn ping(from: &NetNs, ip: &str) -> bool {
    let cmd = ping_cmd();
    Command::new("ip")
        .args(["netns", "exec", from.name()])
        .args(&cmd)
        .args(["-c1", "-W1", ip])
        .output()
        .unwrap()
        .status
        .success()
}

#[test]
#[ignore = "privileged: needs root and network namespaces; run by scripts/test.sh"]
fn add_configures_container_and_result_matches() {
    let node = Node::new();
    let c = new_ns();
    let r = node.add("ctr-a", &c);
    assert_eq!(r["cniVersion"], "1.0.0");
    let ifaces = r["interfaces"].as_array().unwrap();
    assert_eq!(ifaces.len(), 3);
    assert_eq!(ifaces[0]["name"], BRIDGE);
    assert!(ifaces[1]["name"].as_str().unwrap().starts_with("veth"));
    assert_eq!(ifaces[2]["name"], "eth0");
    assert_eq!(ifaces[2]["sandbox"], c.path().as_str());
    assert_eq!(r["ips"].as_array().unwrap().len(), 1);
    assert_eq!(r["ips"][0]["interface"], 2);
    assert_eq!(r["ips"][0]["gateway"], GATEWAY);
    let ip = result_ip(&r);
    let net: ipnet::IpNet = SUBNET.parse().unwrap();
    assert!(net.contains(&ip.parse::<std::net::IpAddr>().unwrap()));
    assert_eq!(r["ips"][0]["address"], format!("{ip}/24"));
    assert_eq!(r["routes"], json!([{"dst": "0.0.0.0/0", "gw": GATEWAY}]));

    // The container side as the kernel sees it.
    let link = ip_json(&c, &["addr", "show", "dev", "eth0"]);
    let link = &link[0];
    assert_eq!(link["address"], ifaces[2]["mac"]);
    assert_eq!(link["mtu"], 1400);
    assert!(link["flags"].as_array().unwrap().contains(&json!("UP")));
    let addrs: Vec<&str> = link["addr_info"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["family"] == "inet")
        .map(|a| a["local"].as_str().unwrap())
        .collect();
    assert_eq!(addrs, vec![ip.as_str()]);
    let routes = ip_json(&c, &["route", "show", "default"]);
    assert_eq!(routes[0]["gateway"], GATEWAY);
    assert_eq!(routes[0]["dev"], "eth0");
    let lo = ip_json(&c, &["link", "show", "lo"]);
    assert!(lo[0]["flags"].as_array().unwrap().contains(&json!("UP")));

    // The node side: bridge with the gateway address, veth on it with the reported MACs.
    let br = ip_json(&node.ns, &["addr", "show", "dev", BRIDGE]);
    assert_eq!(br[0]["address"], ifaces[0]["mac"]);
    assert!(br[0]["addr_info"]
        .as_array()
        .unwrap()
        .iter()
        .any(|a| a["local"] == GATEWAY && a["prefixlen"] == 24));
    assert_eq!(
        node.bridge_ports(),
        vec![ifaces[1]["name"].as_str().unwrap()]
    );
    let veth = ip_json(
        &node.ns,
        &["link", "show", ifaces[1]["name"].as_str().unwrap()],
    );
    assert_eq!(veth[0]["address"], ifaces[1]["mac"]);
    let fwd = Command::new("ip")
        .args([
            "netns",
            "exec",
            node.ns.name(),
            "cat",
            "/proc/sys/net/ipv4/ip_forward",
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&fwd.stdout).trim(), "1");
    assert_eq!(node.ip_files(), vec![ip]);
}

#[test]
#[ignore = "privileged: needs root and network namespaces; run by scripts/test.sh"]
fn containers_ping_each_other_and_the_gateway() {
    let node = Node::new();
    let (c1, c2) = (new_ns(), new_ns());
    let ip1 = result_ip(&node.add("ctr-1", &c1));
    let ip2 = result_ip(&node.add("ctr-2", &c2));
    assert_ne!(ip1, ip2);
    assert!(ping(&c1, &ip2), "c1 cannot ping c2 at {ip2}");
    assert!(ping(&c2, &ip1), "c2 cannot ping c1 at {ip1}");
    assert!(ping(&c1, GATEWAY), "c1 cannot ping the gateway");
}

#[test]
#[ignore = "privileged: needs root and network namespaces; run by scripts/test.sh"]
fn add_twice_returns_the_same_ip() {
    let node = Node::new();
    let c = new_ns();
    let first = node.add("ctr-twice", &c);
    let second = node.add("ctr-twice", &c);
    assert_eq!(first["ips"], second["ips"]);
    assert_eq!(node.ip_files().len(), 1);
    assert_eq!(node.bridge_ports().len(), 1);
    let addrs = ip_json(&c, &["-4", "addr", "show", "dev", "eth0"]);
    assert_eq!(addrs[0]["addr_info"].as_array().unwrap().len(), 1);
}

#[test]
#[ignore = "privileged: needs root and network namespaces; run by scripts/test.sh"]
fn del_releases_ip_removes_veth_and_is_idempotent() {
    let node = Node::new();
    let c = new_ns();
    node.add("ctr-del", &c);
    assert_eq!(node.ip_files().len(), 1);
    node.del("ctr-del", &c.path());
    assert!(node.ip_files().is_empty());
    let left = node.settled_veths();
    assert!(left.is_empty(), "veth left: {left:?}");
    assert!(ip_json(&c, &["link", "show", "type", "veth"])
        .as_array()
        .unwrap()
        .is_empty());
    node.del("ctr-del", &c.path());
    // The released address is handed out again.
    let c2 = new_ns();
    node.add("ctr-del-2", &c2);
    assert_eq!(node.ip_files().len(), 1);
}

#[test]
#[ignore = "privileged: needs root and network namespaces; run by scripts/test.sh"]
fn add_right_after_del_keeps_its_new_pair_from_the_old_pairs_reaper() {
    let node = Node::new();
    let c = new_ns();
    node.add("ctr-readd", &c);
    node.del("ctr-readd", &c.path());
    // At once, while the detached child of that DEL may still be deleting the old pair.
    let r = node.add("ctr-readd", &c);
    wait_for_reapers();
    let host = node.veths();
    assert_eq!(host.len(), 1, "{host:?}");
    assert_eq!(r["interfaces"][1]["name"], host[0]);
    let addrs = ip_json(&c, &["-4", "addr", "show", "dev", "eth0"]);
    assert_eq!(addrs[0]["addr_info"][0]["local"], result_ip(&r));
    assert!(
        ping(&c, GATEWAY),
        "the re-added pod cannot reach its gateway"
    );
    node.del("ctr-readd", &c.path());
    let left = node.settled_veths();
    assert!(left.is_empty(), "veth left: {left:?}");
}

#[test]
#[ignore = "privileged: needs root and network namespaces; run by scripts/test.sh"]
fn the_link_reaper_deletes_only_the_link_it_was_given() {
    let node = Node::new();
    let c = new_ns();
    node.add("ctr-reap", &c);
    let links = ip_json(&node.ns, &["link", "show", "type", "veth"]);
    let name = links[0]["ifname"].as_str().unwrap().to_string();
    let index = links[0]["ifindex"].as_u64().unwrap().to_string();
    let reap = |args: &[&str]| {
        Command::new("ip")
            .args([
                "netns",
                "exec",
                node.ns.name(),
                env!("CARGO_BIN_EXE_ferro-cni"),
            ])
            .arg(ferro_cni::dataplane::REAP_ARG)
            .args(args)
            .output()
            .unwrap()
    };
    // Same index, another name (the index was reused): left alone.
    let out = reap(&[&index, "veth00000000"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(node.veths(), vec![name.clone()]);
    // Not an index: an error, nothing touched.
    let out = reap(&["not-a-number", &name]);
    assert!(!out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("link index"),
        "{out:?}"
    );
    assert_eq!(node.veths(), vec![name.clone()]);
    // The right pair: gone, both ends.
    let out = reap(&[&index, &name]);
    assert!(out.status.success(), "{out:?}");
    assert!(node.veths().is_empty());
    assert!(ip_json(&c, &["link", "show", "type", "veth"])
        .as_array()
        .unwrap()
        .is_empty());
    // Gone already: still success.
    assert!(reap(&[&index, &name]).status.success());
    node.del("ctr-reap", &c.path());
    assert!(node.ip_files().is_empty());
}

#[test]
#[ignore = "privileged: needs root and network namespaces; run by scripts/test.sh"]
fn del_after_the_container_netns_is_gone_succeeds() {
    let node = Node::new();
    let mut c = new_ns();
    node.add("ctr-gone", &c);
    let path = c.path();
    c.delete().unwrap();
    node.del("ctr-gone", &path);
    assert!(node.ip_files().is_empty());
    let left = node.settled_veths();
    assert!(left.is_empty(), "veth left: {left:?}");
}

#[test]
#[ignore = "privileged: needs root and network namespaces; run by scripts/test.sh"]
fn add_with_a_bad_netns_fails_and_leaves_nothing() {
    let node = Node::new();
    let out = node.plugin("ADD", "ctr-bad", "/run/netns/ferro-cni-test-does-not-exist");
    assert!(!out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["code"], 4, "{v}");
    assert_eq!(v["cniVersion"], "1.0.0");
    assert!(v["details"].as_str().unwrap().contains("CNI_NETNS"), "{v}");
    assert!(node.veths().is_empty());
    assert!(node.ip_files().is_empty());
    // A path that exists but is not a network namespace.
    let not_ns = node.data.path().join("not-a-netns");
    std::fs::write(&not_ns, "").unwrap();
    let out = node.plugin("ADD", "ctr-bad", not_ns.to_str().unwrap());
    assert!(!out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["code"], 4, "{v}");
    assert!(node.veths().is_empty());
    assert!(node.ip_files().is_empty());
}

/// Fails with a clear message when the iptables binaries are missing.
fn require_iptables() {
    for bin in ["iptables", "iptables-save", "iptables-restore"] {
        let found = Command::new(bin).arg("--version").output();
        assert!(
            found.map(|o| o.status.success()).unwrap_or(false),
            "{bin} is not installed: ipMasq tests need iptables (apt-get install -y iptables; \
             scripts/lib.sh installs it for CI)"
        );
    }
}

#[test]
#[ignore = "privileged: needs root and network namespaces; run by scripts/test.sh"]
fn ip_masq_add_installs_chain_and_jump_and_del_removes_them() {
    require_iptables();
    let node = Node::new();
    let c = new_ns();
    let conf = node.conf_with(true);
    let id = "ctr-masq";
    let ip = result_ip(&node.add_with(id, &c, &conf));
    let chain = ferro_cni::masq::chain_name("testnet", id);
    assert!(chain.len() <= 28);
    let comment = format!("--comment \"name: testnet id: {id}\"");
    let rules = node.nat_rules();
    let want = [
        format!("-N {chain}"),
        format!("-A POSTROUTING -s {ip}/32 -m comment {comment} -j {chain}"),
        format!("-A {chain} -d {SUBNET} -m comment {comment} -j ACCEPT"),
        format!("-A {chain} ! -d 224.0.0.0/4 -m comment {comment} -j MASQUERADE"),
    ];
    for w in &want {
        assert!(rules.contains(w), "missing {w:?} in {rules:#?}");
    }
    assert_eq!(node.masq_rules().len(), want.len(), "{rules:#?}");
    // A repeated ADD does not duplicate the jump or the chain's rules.
    node.add_with(id, &c, &conf);
    assert_eq!(
        node.masq_rules().len(),
        want.len(),
        "{:#?}",
        node.nat_rules()
    );
    node.del_with(id, &c.path(), &conf);
    assert!(
        node.masq_rules().is_empty(),
        "left: {:#?}",
        node.masq_rules()
    );
    node.del_with(id, &c.path(), &conf);
    assert!(node.masq_rules().is_empty());
    assert!(node.ip_files().is_empty());
    assert!(node.settled_veths().is_empty());
}

#[test]
#[ignore = "privileged: needs root and network namespaces; run by scripts/test.sh"]
fn ip_masq_failed_add_leaves_no_chain() {
    require_iptables();
    let node = Node::new();
    let c = new_ns();
    let conf = node.conf_with(true);
    // Occupy the container-side name so the veth step fails after the reservation.
    node.add_with("ctr-first", &c, &conf);
    let out = node.plugin_with("ADD", "ctr-second", &c.path(), &conf);
    assert!(!out.status.success(), "second eth0 in one netns must fail");
    let chain = ferro_cni::masq::chain_name("testnet", "ctr-second");
    let rules = node.masq_rules();
    assert!(
        !rules.iter().any(|r| r.contains(&chain)),
        "rollback left {chain}: {rules:#?}"
    );
    assert_eq!(node.ip_files().len(), 1);
    node.del_with("ctr-first", &c.path(), &conf);
    assert!(node.masq_rules().is_empty());
}

#[test]
#[ignore = "privileged: needs root and network namespaces; run by scripts/test.sh"]
fn hundred_parallel_adds_then_dels_leak_nothing() {
    parallel_adds_then_dels(false);
}

#[test]
#[ignore = "privileged: needs root and network namespaces; run by scripts/test.sh"]
fn hundred_parallel_masq_adds_then_dels_leak_nothing() {
    require_iptables();
    parallel_adds_then_dels(true);
}

fn parallel_adds_then_dels(ip_masq: bool) {
    const N: usize = 100;
    let node = Node::new();
    let conf = node.conf_with(ip_masq);
    let ctrs: Vec<NetNs> = (0..N).map(|_| new_ns()).collect();
    let ips: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = ctrs
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let node = &node;
                let conf = &conf;
                s.spawn(move || result_ip(&node.add_with(&format!("par-{i}"), c, conf)))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let unique: HashSet<&String> = ips.iter().collect();
    assert_eq!(unique.len(), N, "duplicate addresses: {ips:?}");
    assert_eq!(node.ip_files().len(), N);
    assert_eq!(node.bridge_ports().len(), N);
    if ip_masq {
        let jumps = node
            .masq_rules()
            .into_iter()
            .filter(|r| r.starts_with("-A POSTROUTING"))
            .count();
        assert_eq!(jumps, N, "{:#?}", node.masq_rules());
        let chains = node
            .masq_rules()
            .into_iter()
            .filter(|r| r.starts_with("-N FERRO-MASQ-"))
            .count();
        assert_eq!(chains, N, "{:#?}", node.masq_rules());
    }
    // Every container got its address on eth0.
    for (c, ip) in ctrs.iter().zip(&ips) {
        let addrs = ip_json(c, &["-4", "addr", "show", "dev", "eth0"]);
        assert_eq!(
            addrs[0]["addr_info"][0]["local"],
            ip.as_str(),
            "{}",
            c.name()
        );
    }
    std::thread::scope(|s| {
        for (i, c) in ctrs.iter().enumerate() {
            let node = &node;
            let conf = &conf;
            s.spawn(move || node.del_with(&format!("par-{i}"), &c.path(), conf));
        }
    });
    if ip_masq {
        assert!(
            node.masq_rules().is_empty(),
            "leaked: {:#?}",
            node.masq_rules()
        );
    }
    assert!(node.ip_files().is_empty(), "leaked: {:?}", node.ip_files());
    let left = node.settled_veths();
    assert!(left.is_empty(), "leaked: {left:?}");
    assert!(node.bridge_ports().is_empty());
    for c in &ctrs {
        let links: Vec<String> = ip_json(c, &["link", "show"])
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["ifname"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(links, vec!["lo"], "{} keeps links", c.name());
    }
}

#[test]
#[ignore = "privileged: needs root and network namespaces; run by scripts/test.sh"]
fn check_passes_after_add_and_fails_once_the_address_is_gone() {
    let node = Node::new();
    let c = new_ns();
    let result = node.add("ctr-check", &c);
    let mut conf: Value = serde_json::from_str(&node.conf()).unwrap();
    conf["prevResult"] = result;
    let conf = conf.to_string();
    let out = node.plugin_with("CHECK", "ctr-check", &c.path(), &conf);
    assert!(
        out.status.success(),
        "CHECK: {} {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout.is_empty());
    // Break the attachment inside the test container namespace only.
    let flush = Command::new("ip")
        .args(["-n", c.name(), "addr", "flush", "dev", "eth0"])
        .output()
        .unwrap();
    assert!(flush.status.success());
    let out = node.plugin_with("CHECK", "ctr-check", &c.path(), &conf);
    assert!(!out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["code"], 101, "{v}");
}

fn nat_exec(node: &Node, args: &[&str]) {
    let out = Command::new("ip")
        .args(["netns", "exec", node.ns.name(), "iptables", "-t", "nat"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "iptables {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn with_prev(conf: &str, prev: &Value) -> String {
    let mut v: Value = serde_json::from_str(conf).unwrap();
    v["prevResult"] = prev.clone();
    v.to_string()
}

#[test]
#[ignore = "privileged: needs root and network namespaces; run by scripts/test.sh"]
fn check_verifies_the_masquerade_chain() {
    require_iptables();
    let node = Node::new();
    let c = new_ns();
    let conf = node.conf_with(true);
    let id = "ctr-check-masq";
    let r = node.add_with(id, &c, &conf);
    let ip = result_ip(&r);
    let checked = with_prev(&conf, &r);
    let out = node.plugin_with("CHECK", id, &c.path(), &checked);
    assert!(
        out.status.success(),
        "CHECK: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Remove the MASQUERADE rule by hand: CHECK reports it.
    let chain = ferro_cni::masq::chain_name("testnet", id);
    nat_exec(
        &node,
        &[
            "-D",
            &chain,
            "!",
            "-d",
            "224.0.0.0/4",
            "-m",
            "comment",
            "--comment",
            &format!("name: testnet id: {id}"),
            "-j",
            "MASQUERADE",
        ],
    );
    let out = node.plugin_with("CHECK", id, &c.path(), &checked);
    assert!(!out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["code"], 101, "{v}");
    assert!(v["details"].as_str().unwrap().contains("MASQUERADE"), "{v}");
    // A repeated ADD repairs it (and replaces the veth, so its result is the new
    // prevResult); then the jump goes missing.
    let checked = with_prev(&conf, &node.add_with(id, &c, &conf));
    assert!(node
        .plugin_with("CHECK", id, &c.path(), &checked)
        .status
        .success());
    nat_exec(
        &node,
        &[
            "-D",
            "POSTROUTING",
            "-s",
            &format!("{ip}/32"),
            "-m",
            "comment",
            "--comment",
            &format!("name: testnet id: {id}"),
            "-j",
            &chain,
        ],
    );
    let out = node.plugin_with("CHECK", id, &c.path(), &checked);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["code"], 101, "{v}");
    node.del_with(id, &c.path(), &conf);
    assert!(node.masq_rules().is_empty());
}

#[test]
#[ignore = "privileged: needs root and network namespaces; run by scripts/test.sh"]
fn gc_removes_chains_addresses_and_veths_of_stale_attachments() {
    require_iptables();
    let node = Node::new();
    let (c1, c2) = (new_ns(), new_ns());
    let conf = node.conf_with(true);
    let keep_ip = result_ip(&node.add_with("ctr-keep", &c1, &conf));
    node.add_with("ctr-stale", &c2, &conf);
    // A leftover host veth of ferro's form on the bridge, and a foreign port that stays.
    node.ns
        .ip(&[
            "link",
            "add",
            "vethdeadbeef",
            "type",
            "veth",
            "peer",
            "name",
            "fcgc-p1",
        ])
        .unwrap();
    node.ns
        .ip(&[
            "link",
            "add",
            "fcgc-other",
            "type",
            "veth",
            "peer",
            "name",
            "fcgc-p2",
        ])
        .unwrap();
    for l in ["vethdeadbeef", "fcgc-other"] {
        node.ns.ip(&["link", "set", l, "master", BRIDGE]).unwrap();
    }
    // Another network's chain in the same table stays too.
    let other = ferro_cni::masq::MasqSpec::new("othernet", "x", "10.99.0.2".parse().unwrap(), 24);
    let rules = ferro_cni::masq::render_add(&other, &ferro_cni::masq::Observed::default());
    let mut child = Command::new("ip")
        .args([
            "netns",
            "exec",
            node.ns.name(),
            "iptables-restore",
            "--noflush",
        ])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(rules.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success());

    let mut gc: Value = serde_json::from_str(&conf).unwrap();
    gc["cniVersion"] = json!("1.1.0");
    gc["cni.dev/valid-attachments"] = json!([{"containerID": "ctr-keep", "ifname": "eth0"}]);
    let out = node.plugin_with("GC", "", "", &gc.to_string());
    assert!(
        out.status.success(),
        "GC: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let keep_chain = ferro_cni::masq::chain_name("testnet", "ctr-keep");
    let stale_chain = ferro_cni::masq::chain_name("testnet", "ctr-stale");
    let rules = node.masq_rules();
    assert!(rules.iter().any(|r| r.contains(&keep_chain)), "{rules:#?}");
    assert!(
        !rules.iter().any(|r| r.contains(&stale_chain)),
        "{rules:#?}"
    );
    assert!(rules.iter().any(|r| r.contains(&other.chain)), "{rules:#?}");
    assert_eq!(node.ip_files(), vec![keep_ip]);
    let mut ports = node.bridge_ports();
    ports.sort();
    let mut want = vec![
        "fcgc-other".to_string(),
        ferro_cni::plan::host_veth_name("ctr-keep", "eth0"),
    ];
    want.sort();
    assert_eq!(ports, want);
    node.del_with("ctr-keep", &c1.path(), &conf);
}

fn delegated_conf(node: &Node, range_end: &str) -> String {
    json!({
        "cniVersion": "1.0.0",
        "name": "testnet",
        "type": "ferro",
        "bridge": BRIDGE,
        "isGateway": true,
        "ipMasq": true,
        "ipam": {
            "type": "host-local",
            "ranges": [[{"subnet": SUBNET, "rangeEnd": range_end}]],
            "dataDir": node.data.path(),
        },
    })
    .to_string()
}

#[test]
#[ignore = "privileged: needs root and network namespaces; run by scripts/test.sh"]
fn delegated_host_local_ipam_add_check_del() {
    require_iptables();
    assert!(
        Path::new("/usr/lib/cni/host-local").exists(),
        "/usr/lib/cni/host-local is missing: apt-get install -y containernetworking-plugins"
    );
    let node = Node::new();
    let (c1, c2) = (new_ns(), new_ns());
    // One address in the range: the second ADD fails with host-local's own error.
    let conf = delegated_conf(&node, "10.77.0.2");
    let r = node.add_with("ctr-hl", &c1, &conf);
    let ip = result_ip(&r);
    assert_eq!(ip, "10.77.0.2");
    assert_eq!(r["ips"][0]["interface"], 2);
    assert_eq!(r["ips"][0]["gateway"], GATEWAY);
    assert_eq!(node.ip_files(), vec![ip.clone()], "host-local's file");
    assert!(ping(&c1, GATEWAY));
    assert!(node
        .masq_rules()
        .iter()
        .any(|l| l.contains(&format!("-s {ip}/32"))));
    let out = node.plugin_with("CHECK", "ctr-hl", &c1.path(), &with_prev(&conf, &r));
    assert!(
        out.status.success(),
        "CHECK: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    let out = node.plugin_with("ADD", "ctr-hl-2", &c2.path(), &conf);
    assert!(!out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    // host-local's error, passed through (its code and message), nothing left behind.
    let direct = Command::new("/usr/lib/cni/host-local")
        .env("CNI_COMMAND", "ADD")
        .env("CNI_CONTAINERID", "ctr-hl-3")
        .env("CNI_NETNS", c2.path())
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", "/usr/lib/cni")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .and_then(|mut ch| {
            ch.stdin.take().unwrap().write_all(conf.as_bytes())?;
            ch.wait_with_output()
        })
        .unwrap();
    let direct: Value = serde_json::from_slice(&direct.stdout).unwrap();
    assert_eq!(v["code"], direct["code"], "{v} vs {direct}");
    assert_eq!(v["msg"], direct["msg"], "{v} vs {direct}");
    assert_eq!(node.bridge_ports().len(), 1);

    node.del_with("ctr-hl", &c1.path(), &with_prev(&conf, &r));
    assert!(node.ip_files().is_empty(), "{:?}", node.ip_files());
    assert!(node.settled_veths().is_empty());
    assert!(node.masq_rules().is_empty(), "{:#?}", node.masq_rules());
    node.del_with("ctr-hl", &c1.path(), &conf);

    // An IPAM plugin that is not in CNI_PATH.
    let missing = conf.replace("host-local", "no-such-ipam");
    let out = node.plugin_with("ADD", "ctr-x", &c2.path(), &missing);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["code"], 5, "{v}");
    assert!(
        v["details"].as_str().unwrap().contains("no-such-ipam"),
        "{v}"
    );
}

fn ping6(from: &NetNs, ip: &str) -> bool {
    let cmd = ping_cmd();
    Command::new("ip")
        .args(["netns", "exec", from.name()])
        .args(&cmd)
        .args(["-6", "-c1", "-W1", ip])
        .output()
        .unwrap()
        .status
        .success()
}

#[test]
#[ignore = "privileged: needs root and network namespaces; run by scripts/test.sh"]
fn dual_stack_pod_gets_both_families_and_pings_both_gateways() {
    let node = Node::new();
    let (c1, c2) = (new_ns(), new_ns());
    let conf = json!({
        "cniVersion": "1.0.0",
        "name": "testnet",
        "type": "ferro",
        "bridge": BRIDGE,
        "isGateway": true,
        "ipam": {
            "ranges": [[{"subnet": SUBNET}], [{"subnet": "fd77::/64"}]],
            "dataDir": node.data.path(),
        },
    })
    .to_string();
    let r = node.add_with("ctr-ds", &c1, &conf);
    let r2 = node.add_with("ctr-ds-2", &c2, &conf);
    let ips: Vec<&str> = r["ips"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["address"].as_str().unwrap())
        .collect();
    assert_eq!(ips.len(), 2, "{r}");
    assert!(
        ips[0].starts_with("10.77.0.") && ips[0].ends_with("/24"),
        "{r}"
    );
    assert!(
        ips[1].starts_with("fd77::") && ips[1].ends_with("/64"),
        "{r}"
    );
    assert_eq!(r["ips"][1]["gateway"], "fd77::1");
    let routes = r["routes"].as_array().unwrap();
    assert!(
        routes.contains(&json!({"dst": "::/0", "gw": "fd77::1"})),
        "{r}"
    );
    let v6 = ip_json(
        &c1,
        &["-6", "addr", "show", "dev", "eth0", "scope", "global"],
    );
    assert_eq!(
        v6[0]["addr_info"][0]["local"],
        ips[1].split('/').next().unwrap()
    );
    assert!(ping(&c1, GATEWAY), "no IPv4 to the gateway");
    // Added without duplicate address detection: usable at once, never tentative.
    let peer6 = r2["ips"][1]["address"]
        .as_str()
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let global = ip_json(
        &c1,
        &["-6", "addr", "show", "dev", "eth0", "scope", "global"],
    );
    let info = &global[0]["addr_info"][0];
    assert!(info.get("tentative").is_none(), "{info}");
    assert_eq!(info["nodad"], true, "{info}");
    assert!(ping6(&c1, "fd77::1"), "no IPv6 to the gateway fd77::1");
    assert!(ping6(&c1, &peer6), "no IPv6 to {peer6}");
    assert_eq!(node.ip_files().len(), 4);
    node.del_with("ctr-ds", &c1.path(), &conf);
    node.del_with("ctr-ds-2", &c2.path(), &conf);
    assert!(node.ip_files().is_empty(), "{:?}", node.ip_files());
    assert!(node.settled_veths().is_empty());
}
