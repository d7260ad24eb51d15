//! Privileged end-to-end test of ferro-netd: a lab of network namespaces built by the test.
//!
//! - an underlay namespace with a bridge `br-under` (192.168.77.1/24) where
//!   ferro-control-plane listens;
//! - three node namespaces, each with `eth0` on that bridge (192.168.77.1{1,2,3}/24), each
//!   running the real `ferro-netd`;
//! - two pod namespaces per node, wired by the real `ferro-cni` binary with the conflist
//!   ferro-netd wrote.
//!
//! Nothing is changed in the machine's root namespace. Processes are killed by pid and
//! namespaces deleted by their guards' Drop, also when an assertion fails. Needs root: without
//! it the test FAILS with a clear message.
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{IpAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ferro_lab::netns::NetNs;
use serde_json::Value;

const KUBECTL: &str = "kubectl";

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
        "the ferro-netd overlay tests need root (they build network namespaces); run the suite \
         as root"
    );
}

/// Whether a netlink socket of process `pid` in `ns` has joined a multicast group.
fn subscribed(ns: &NetNs, pid: u32) -> bool {
    let table = ns.exec_ok(&["cat", "/proc/net/netlink"]).unwrap_or_default();
    table.lines().skip(1).any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() > 3 && f[2] == pid.to_string() && u64::from_str_radix(f[3], 16).is_ok_and(|g| g != 0)
    })
}

/// Polls `f` until it returns true or `secs` pass; panics with `what` and `diag()`.
fn wait_for(secs: u64, what: &str, mut f: impl FnMut() -> bool, diag: impl Fn() -> String) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        if Instant::now() > deadline {
            panic!("timed out after {secs}s waiting for {what}\n{}", diag());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A process started by the test (inside a namespace with `ip netns exec`, which execs, so
/// the pid is the program's); killed by pid on drop.
struct Proc {
    child: Child,
}

impl Proc {
    fn spawn(ns: &NetNs, args: &[&str], log: &Path, env: &[(&str, &str)]) -> Proc {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        let mut cmd = ns.command(args[0]);
        cmd.args(&args[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {args:?}: {e}"));
        Proc { child }
    }

    fn spawn_stdout(ns: &NetNs, args: &[&str], out: &Path) -> Proc {
        let f = std::fs::File::create(out).unwrap();
        let child = ns
            .command(args[0])
            .args(&args[1..])
            .stdin(Stdio::null())
            .stdout(f)
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        Proc { child }
    }

    fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// SIGTERM by pid and wait; returns whether it exited successfully.
    fn terminate(mut self) -> bool {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).output();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st.success();
            }
            if Instant::now() > deadline {
                return false; // Drop kills it.
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn control_plane_binary() -> PathBuf {
    // <target>/debug/deps/overlay-<hash> -> <target>/debug/ferro-control-plane
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(Path::parent).unwrap();
    let bin = dir.join("ferro-control-plane");
    assert!(
        bin.exists(),
        "{} is missing: build the workspace first (cargo build --workspace --all-targets; \
         scripts/test.sh does)",
        bin.display()
    );
    bin
}

const NETD: &str = env!("CARGO_BIN_EXE_ferro-netd");
const CNI: &str = env!("CARGO_BIN_EXE_ferro-cni");

struct NodeDirs {
    conf_dir: PathBuf,
    subnet_file: PathBuf,
    data_dir: PathBuf,
}

/// The lab. Fields drop in order: processes, then pods, nodes, underlay, temp dir.
struct Lab {
    netd: Vec<Option<Proc>>,
    _cp: Proc,
    pods: Vec<NetNs>,
    nodes: Vec<NetNs>,
    under: NetNs,
    dirs: Vec<NodeDirs>,
    dir: tempfile::TempDir,
}

fn node_ip(i: usize) -> String {
    format!("192.168.77.{}", 11 + i)
}
fn node_name(i: usize) -> String {
    format!("node{}", i + 1)
}

impl Lab {
    fn new(tag: &str, nodes: usize) -> Lab {
        require_root();
        let cp_bin = control_plane_binary();
        let dir = tempfile::Builder::new()
            .prefix("ferro-netd-lab")
            .tempdir()
            .unwrap();
        let prefix = format!("fnd{tag}{}", std::process::id());
        let under = NetNs::new(&format!("{prefix}u")).unwrap();
        under
            .ip(&["link", "add", "br-under", "type", "bridge"])
            .unwrap();
        under.ip(&["link", "set", "br-under", "up"]).unwrap();
        under
            .ip(&["addr", "add", "192.168.77.1/24", "dev", "br-under"])
            .unwrap();
        let mut ns_nodes = Vec::new();
        let mut dirs = Vec::new();
        for i in 0..nodes {
            let n = NetNs::new(&format!("{prefix}n{}", i + 1)).unwrap();
            let port = format!("vu{}", i + 1);
            under
                .ip(&[
                    "link",
                    "add",
                    &port,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    "eth0",
                    "netns",
                    n.name(),
                ])
                .unwrap();
            under
                .ip(&["link", "set", &port, "master", "br-under", "up"])
                .unwrap();
            n.ip(&["addr", "add", &format!("{}/24", node_ip(i)), "dev", "eth0"])
                .unwrap();
            n.ip(&["link", "set", "eth0", "up"]).unwrap();
            ns_nodes.push(n);
            let base = dir.path().join(node_name(i));
            dirs.push(NodeDirs {
                conf_dir: base.join("net.d"),
                subnet_file: base.join("run/subnet.env"),
                data_dir: base.join("ipam"),
            });
            std::fs::create_dir_all(&base).unwrap();
        }
        let cp_dir = dir.path().join("cp");
        let cp = Proc::spawn(
            &under,
            &[
                cp_bin.to_str().unwrap(),
                "--data-dir",
                cp_dir.to_str().unwrap(),
                "--bind-address",
                "192.168.77.1",
                "--advertise-address",
                "192.168.77.1",
                "--secure-port",
                "6443",
            ],
            &dir.path().join("cp.log"),
            &[("RUST_LOG", "info")],
        );
        let lab = Lab {
            netd: (0..nodes).map(|_| None).collect(),
            _cp: cp,
            pods: Vec::new(),
            nodes: ns_nodes,
            under,
            dirs,
            dir,
        };
        let kc = lab.kubeconfig();
        wait_for(
            60,
            "ferro-control-plane to serve",
            || {
                kc.exists()
                    && lab
                        .under
                        .exec(&[
                            KUBECTL,
                            "--kubeconfig",
                            kc.to_str().unwrap(),
                            "get",
                            "nodes",
                        ])
                        .unwrap()
                        .status
                        .success()
            },
            || lab.file("cp.log"),
        );
        lab
    }

    fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("cp/admin.kubeconfig")
    }

    fn file(&self, rel: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(rel)).unwrap_or_default()
    }

    fn netd_log(&self, i: usize) -> String {
        self.file(&format!("{}/netd.log", node_name(i)))
    }

    fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> String {
        let kc = self.kubeconfig();
        let mut child = self
            .under
            .command(KUBECTL)
            .arg("--kubeconfig")
            .arg(&kc)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl must be installed");
        let mut stdin_pipe = child.stdin.take().unwrap();
        if let Some(s) = stdin {
            stdin_pipe.write_all(s.as_bytes()).unwrap();
        }
        drop(stdin_pipe);
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn create_node(&self, name: &str, pod_cidr: &str, annotations: &[(&str, &str)]) {
        let ann: serde_json::Map<String, Value> = annotations
            .iter()
            .map(|(k, v)| (k.to_string(), Value::from(*v)))
            .collect();
        let node = serde_json::json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": ann},
            "spec": {"podCIDR": pod_cidr, "podCIDRs": [pod_cidr]},
        });
        self.kubectl(&["create", "-f", "-"], Some(&node.to_string()));
    }

    fn start_netd(&mut self, i: usize) {
        self.start_netd_with(i, &[]);
    }

    fn start_netd_with(&mut self, i: usize, extra: &[&str]) {
        let d = &self.dirs[i];
        let log = self.dir.path().join(format!("{}/netd.log", node_name(i)));
        let kc = self.kubeconfig();
        let (name, ip) = (node_name(i), node_ip(i));
        let mut args = vec![
            NETD,
            "--kubeconfig",
            kc.to_str().unwrap(),
            "--hostname-override",
            &name,
            "--cni-conf-dir",
            d.conf_dir.to_str().unwrap(),
            "--subnet-file",
            d.subnet_file.to_str().unwrap(),
            "--cni-data-dir",
            d.data_dir.to_str().unwrap(),
            "--node-ip",
            &ip,
            "--cluster-cidr",
            "10.244.0.0/16",
            "--resync-period",
            "2s",
        ];
        args.extend_from_slice(extra);
        let p = Proc::spawn(&self.nodes[i], &args, &log, &[("RUST_LOG", "info")]);
        self.netd[i] = Some(p);
    }

    fn conflist(&self, i: usize) -> Option<Value> {
        let text = std::fs::read_to_string(self.dirs[i].conf_dir.join("10-ferro.conflist")).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// CNI ADD of a new pod namespace on node `i`, with the ferro entry of the conflist
    /// ferro-netd wrote; returns the pod's namespace index in `pods` and its address.
    fn add_pod(&mut self, i: usize, p: usize) -> (usize, IpAddr) {
        let list = self.conflist(i).unwrap();
        let mut conf = list["plugins"][0].clone();
        conf["cniVersion"] = list["cniVersion"].clone();
        conf["name"] = list["name"].clone();
        let pod = NetNs::new(&format!("{}p{}", self.nodes[i].name(), p + 1)).unwrap();
        let id = format!("{}-pod{}", node_name(i), p + 1);
        let mut child = self.nodes[i]
            .command(CNI)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("CNI_COMMAND", "ADD")
            .env("CNI_CONTAINERID", &id)
            .env("CNI_NETNS", pod.path())
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", "/usr/lib/cni")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(conf.to_string().as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "ferro-cni ADD {id}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let result: Value = serde_json::from_slice(&out.stdout).unwrap();
        let ip: IpAddr = result["ips"][0]["address"]
            .as_str()
            .unwrap()
            .split('/')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        self.pods.push(pod);
        (self.pods.len() - 1, ip)
    }

    fn routes(&self, i: usize) -> String {
        self.nodes[i]
            .ip(&["route", "show", "proto", "147"])
            .unwrap()
    }
    fn neigh(&self, i: usize) -> String {
        self.nodes[i]
            .ip(&["neigh", "show", "dev", "ferro.vxlan"])
            .unwrap()
    }
    fn fdb(&self, i: usize) -> String {
        self.nodes[i]
            .exec_ok(&["bridge", "fdb", "show", "dev", "ferro.vxlan"])
            .unwrap()
    }
    fn state(&self, i: usize) -> String {
        format!(
            "--- {} routes:\n{}--- neigh:\n{}--- fdb:\n{}--- netd log:\n{}",
            node_name(i),
            self.routes(i),
            self.neigh(i),
            self.fdb(i),
            self.netd_log(i)
        )
    }
}

fn ping(from: &NetNs, to: IpAddr) -> bool {
    from.exec(&["ping", "-c1", "-W2", &to.to_string()])
        .unwrap()
        .status
        .success()
}

#[test]
#[ignore = "privileged: needs root and network namespaces; run by scripts/test.sh"]
fn overlay_connects_pods_across_nodes_and_converges() {
    let mut lab = Lab::new("o", 3);
    let t0 = Instant::now();

    // Nodes, as the control plane (or a kubelet + node IPAM) would have them, plus two
    // malformed ones that must be skipped without harming the others.
    for i in 0..3 {
        lab.create_node(&node_name(i), &format!("10.244.{}.0/24", i + 1), &[]);
    }
    lab.create_node(
        "bad-cidr",
        "10.244.300.0/24",
        &[
            ("ferro.dev/vtep-mac", "02:00:00:00:00:09"),
            ("ferro.dev/public-ip", "192.168.77.99"),
        ],
    );
    lab.create_node(
        "bad-mac",
        "10.244.10.0/24",
        &[
            ("ferro.dev/vtep-mac", "zz:zz"),
            ("ferro.dev/public-ip", "192.168.77.98"),
        ],
    );
    for i in 0..3 {
        lab.start_netd(i);
    }

    // Conflists, subnet files, annotations.
    for i in 0..3 {
        wait_for(
            60,
            &format!("the conflist of {}", node_name(i)),
            || lab.conflist(i).is_some(),
            || lab.state(i),
        );
        let list = lab.conflist(i).unwrap();
        assert_eq!(list["plugins"][0]["type"], "ferro");
        assert_eq!(list["plugins"][0]["mtu"], 1450);
        assert_eq!(list["plugins"][1]["type"], "portmap");
        let subnet = std::fs::read_to_string(&lab.dirs[i].subnet_file).unwrap();
        assert_eq!(
            subnet,
            format!("FERRO_SUBNET=10.244.{}.0/24\nFERRO_MTU=1450\n", i + 1)
        );
    }
    // netd patches the annotations after it wrote the files above: wait for them
    let node2 = || -> Value {
        serde_json::from_str(&lab.kubectl(&["get", "node", "node2", "-o", "json"], None)).unwrap()
    };
    wait_for(
        60,
        "node2's overlay annotations",
        || node2()["metadata"]["annotations"]["ferro.dev/vtep-mac"].is_string(),
        || node2()["metadata"].to_string(),
    );
    let node_json = node2();
    let ann = &node_json["metadata"]["annotations"];
    assert_eq!(ann["ferro.dev/public-ip"], "192.168.77.12");
    let mac2 = ann["ferro.dev/vtep-mac"].as_str().unwrap().to_string();
    let link2 = lab.nodes[1]
        .ip(&["-j", "link", "show", "ferro.vxlan"])
        .unwrap();
    assert!(
        link2.contains(&mac2),
        "annotation {mac2} is not the device's MAC: {link2}"
    );

    // The VXLAN device as specified.
    let details = lab.nodes[0]
        .ip(&["-d", "addr", "show", "ferro.vxlan"])
        .unwrap();
    for want in [
        "vxlan id 1",
        "local 192.168.77.11",
        "dev eth0",
        "dstport 8472",
        "nolearning",
        "mtu 1450",
        "inet 10.244.1.0/32",
    ] {
        assert!(
            details.contains(want),
            "ferro.vxlan lacks {want:?}: {details}"
        );
    }

    // Every node has entries for the two others, and only for them.
    for i in 0..3 {
        wait_for(
            60,
            &format!("{} to have routes to both peers", node_name(i)),
            || {
                let r = lab.routes(i);
                (0..3).filter(|j| *j != i).all(|j| {
                    r.contains(&format!(
                        "10.244.{}.0/24 via 10.244.{}.0 dev ferro.vxlan",
                        j + 1,
                        j + 1
                    ))
                })
            },
            || lab.state(i),
        );
        let r = lab.routes(i);
        assert_eq!(r.lines().count(), 2, "{r}");
        assert!(r.contains("onlink"), "{r}");
        let fdb = lab.fdb(i);
        for j in (0..3).filter(|j| *j != i) {
            assert!(
                fdb.contains(&format!("dst {} ", node_ip(j)))
                    || fdb.contains(&format!("dst {}\n", node_ip(j))),
                "{fdb}"
            );
            assert!(
                lab.neigh(i).contains(&format!("10.244.{}.0 lladdr", j + 1)),
                "{}",
                lab.neigh(i)
            );
        }
        assert_eq!(
            fdb.lines().filter(|l| l.contains("dst")).count(),
            2,
            "{fdb}"
        );
    }
    // The malformed nodes are reported and skipped.
    wait_for(
        30,
        "a log line for each malformed node",
        || {
            let log = lab.netd_log(0);
            log.contains("skipping node") && log.contains("bad-cidr") && log.contains("bad-mac")
        },
        || lab.netd_log(0),
    );

    // Masquerade chain: present once, with the expected rules.
    let nat = lab.nodes[0]
        .exec_ok(&["iptables-save", "-t", "nat"])
        .unwrap();
    assert!(
        nat.contains("-A FERRO-NETD-MASQ -s 10.244.1.0/24 -d 10.244.0.0/16 -j RETURN"),
        "{nat}"
    );
    assert!(
        nat.contains(
            "-A FERRO-NETD-MASQ -s 10.244.1.0/24 ! -d 224.0.0.0/4 -j MASQUERADE --random-fully"
        ),
        "{nat}"
    );
    assert_eq!(
        nat.lines()
            .filter(|l| l.starts_with("-A POSTROUTING") && l.ends_with("-j FERRO-NETD-MASQ"))
            .count(),
        1,
        "{nat}"
    );

    // Pods: two per node, through the real ferro-cni.
    let mut pods = Vec::new();
    for i in 0..3 {
        for p in 0..2 {
            pods.push((i, lab.add_pod(i, p)));
        }
    }
    for (i, (a, _)) in &pods {
        for (j, (_, ip)) in &pods {
            let from = &lab.pods[*a];
            let mut ok = false;
            for _ in 0..5 {
                if ping(from, *ip) {
                    ok = true;
                    break;
                }
            }
            assert!(
                ok,
                "pod on {} cannot ping {ip} on {}\n{}\n{}",
                node_name(*i),
                node_name(*j),
                lab.state(*i),
                lab.state(*j)
            );
        }
    }
    // A pod reaches the underlay (outside the cluster CIDR) only because it is masqueraded:
    // the underlay namespace has no route back to 10.244.0.0/16.
    assert!(
        ping(&lab.pods[pods[0].1 .0], "192.168.77.1".parse().unwrap()),
        "pod -> underlay (masqueraded) failed"
    );

    // TCP across nodes, with the client's pod address preserved (no masquerade inside the
    // cluster CIDR).
    {
        let (srv_ns, srv_ip) = pods[4].1; // node3, pod 1
        let (cli_ns, cli_ip) = pods[0].1; // node1, pod 1
        let (tx, rx) = std::sync::mpsc::channel();
        let server = lab.pods[srv_ns].spawn_in(move || {
            let l = TcpListener::bind((srv_ip, 8080)).unwrap();
            tx.send(()).unwrap();
            let (mut s, peer) = l.accept().unwrap();
            let mut buf = [0u8; 5];
            s.read_exact(&mut buf).unwrap();
            s.write_all(b"world").unwrap();
            (peer.ip(), buf)
        });
        rx.recv_timeout(Duration::from_secs(10)).unwrap();
        let client = lab.pods[cli_ns].spawn_in(move || {
            let mut s = TcpStream::connect_timeout(&(srv_ip, 8080).into(), Duration::from_secs(10))
                .unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s.write_all(b"hello").unwrap();
            let mut buf = [0u8; 5];
            s.read_exact(&mut buf).unwrap();
            buf
        });
        assert_eq!(&client.join().unwrap().unwrap(), b"world");
        let (peer, got) = server.join().unwrap().unwrap();
        assert_eq!(&got, b"hello");
        assert_eq!(
            peer, cli_ip,
            "pod-to-pod traffic must keep the pod's source address"
        );
    }

    // An FDB entry deleted by hand comes back at the next resync.
    let dst2 = node_ip(1);
    lab.nodes[0]
        .exec_ok(&[
            "bridge",
            "fdb",
            "del",
            &mac2,
            "dev",
            "ferro.vxlan",
            "dst",
            &dst2,
        ])
        .unwrap();
    assert!(!lab.fdb(0).contains(&mac2), "{}", lab.fdb(0));
    wait_for(
        30,
        "the deleted FDB entry to be restored",
        || lab.fdb(0).contains(&mac2),
        || lab.state(0),
    );
    // So does a route.
    lab.nodes[0].ip(&["route", "del", "10.244.2.0/24"]).unwrap();
    wait_for(
        30,
        "the deleted route to be restored",
        || lab.routes(0).contains("10.244.2.0/24"),
        || lab.state(0),
    );

    // Restart of ferro-netd on node1: SIGTERM leaves the dataplane, the new process converges
    // without deleting or re-adding anything (watched with `ip monitor` / `bridge monitor`).
    let routes_before = lab.routes(0);
    let neigh_before = lab.neigh(0);
    let mon_dir = lab.dir.path().to_path_buf();
    let ip_mon = Proc::spawn_stdout(
        &lab.nodes[0],
        &["ip", "monitor", "route", "neigh"],
        &mon_dir.join("ip-monitor.txt"),
    );
    let br_mon = Proc::spawn_stdout(
        &lab.nodes[0],
        &["bridge", "monitor", "fdb"],
        &mon_dir.join("bridge-monitor.txt"),
    );
    // Both monitors listen once their netlink sockets joined multicast groups (a socket whose
    // port id is the monitor's pid with non-zero Groups in the namespace's /proc/net/netlink).
    wait_for(
        10,
        "the monitors to subscribe",
        || [&ip_mon, &br_mon].iter().all(|m| subscribed(&lab.nodes[0], m.child.id())),
        || lab.nodes[0].exec_ok(&["cat", "/proc/net/netlink"]).unwrap_or_default(),
    );
    let old = lab.netd[0].take().unwrap();
    assert!(
        old.terminate(),
        "ferro-netd did not exit cleanly on SIGTERM\n{}",
        lab.netd_log(0)
    );
    assert!(lab.netd_log(0).contains("the dataplane stays in place"));
    assert_eq!(
        lab.routes(0),
        routes_before,
        "SIGTERM must leave the routes"
    );
    let log_len = lab.netd_log(0).len();
    lab.start_netd(0);
    wait_for(
        60,
        "two reconciles of the restarted ferro-netd",
        || lab.netd_log(0)[log_len..].matches("reconciled").count() >= 2,
        || lab.state(0),
    );
    let after = lab.netd_log(0)[log_len..].to_string();
    for line in after.lines().filter(|l| l.contains("reconciled")) {
        assert!(
            line.contains("applied=0"),
            "the restarted netd changed the kernel: {line}\n{after}"
        );
    }
    assert!(
        !after.contains("masquerade rules applied"),
        "masquerade rules rewritten after restart:\n{after}"
    );
    assert!(
        !after.contains("wrote"),
        "files rewritten after restart:\n{after}"
    );
    drop(ip_mon);
    drop(br_mon);
    let ip_events = std::fs::read_to_string(mon_dir.join("ip-monitor.txt")).unwrap();
    let br_events = std::fs::read_to_string(mon_dir.join("bridge-monitor.txt")).unwrap();
    let touched: Vec<&str> = ip_events
        .lines()
        .chain(br_events.lines())
        .filter(|l| l.contains("ferro.vxlan") || l.contains("10.244."))
        .collect();
    assert!(
        touched.is_empty(),
        "restart touched owned entries: {touched:?}"
    );
    assert_eq!(lab.routes(0), routes_before);
    assert_eq!(lab.neigh(0), neigh_before);
    for (j, (_, ip)) in pods.iter().skip(2) {
        assert!(
            ping(&lab.pods[pods[0].1 .0], *ip),
            "after restart, node1 pod -> {ip} on {}",
            node_name(*j)
        );
    }

    // Node 3 leaves: its entries disappear from nodes 1 and 2.
    lab.kubectl(&["delete", "node", "node3", "--wait=false"], None);
    for i in 0..2 {
        wait_for(
            30,
            &format!("{} to drop node3's entries", node_name(i)),
            || {
                !lab.routes(i).contains("10.244.3.0/24")
                    && !lab.neigh(i).contains("10.244.3.0 ")
                    && !lab.fdb(i).contains(&node_ip(2))
            },
            || lab.state(i),
        );
        // The other peer stays.
        assert!(
            lab.routes(i).contains(&format!("10.244.{}.0/24", 2 - i)),
            "{}",
            lab.state(i)
        );
    }
    assert!(
        ping(&lab.pods[pods[0].1 .0], pods[2].1 .1),
        "node1 -> node2 after node3 left"
    );
    for p in lab.netd.iter_mut().flatten() {
        assert!(p.running(), "a ferro-netd exited");
    }
    eprintln!("overlay lab done in {:?}", t0.elapsed());
}

#[test]
#[ignore = "privileged: needs root and network namespaces; run by scripts/test.sh"]
fn direct_routing_between_nodes_on_one_subnet() {
    let mut lab = Lab::new("d", 2);
    for i in 0..2 {
        lab.create_node(&node_name(i), &format!("10.244.{}.0/24", i + 1), &[]);
        lab.start_netd_with(i, &["--direct-routing"]);
    }
    for i in 0..2 {
        let peer = 1 - i;
        let want = format!("10.244.{}.0/24 via {} dev eth0", peer + 1, node_ip(peer));
        wait_for(
            60,
            &format!("{} to route directly to its peer", node_name(i)),
            || lab.routes(i).contains(&want),
            || lab.state(i),
        );
        // No overlay entries for a directly routed peer.
        assert!(!lab.fdb(i).contains("dst"), "{}", lab.state(i));
        assert!(!lab.neigh(i).contains("lladdr"), "{}", lab.state(i));
        wait_for(
            30,
            "the conflist",
            || lab.conflist(i).is_some(),
            || lab.state(i),
        );
    }
    let (a, _) = lab.add_pod(0, 0);
    let (_, ip_b) = lab.add_pod(1, 0);
    let mut ok = false;
    for _ in 0..5 {
        if ping(&lab.pods[a], ip_b) {
            ok = true;
            break;
        }
    }
    assert!(
        ok,
        "pod on node1 cannot ping {ip_b} on node2 (direct routing)\n{}\n{}",
        lab.state(0),
        lab.state(1)
    );
}

#[test]
#[ignore = "privileged: needs root and network namespaces; run by scripts/test.sh"]
fn unreachable_api_server_is_retried_with_backoff_not_a_crash_loop() {
    require_root();
    let dir = tempfile::Builder::new()
        .prefix("ferro-netd-bad")
        .tempdir()
        .unwrap();
    let ns = NetNs::new(&format!("fndb{}", std::process::id())).unwrap();
    // Nothing listens on port 1 in the fresh namespace.
    let kc = dir.path().join("kubeconfig");
    std::fs::write(
        &kc,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\n    insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n",
    )
    .unwrap();
    let conf_dir = dir.path().join("net.d");
    let log = dir.path().join("netd.log");
    let mut p = Proc::spawn(
        &ns,
        &[
            NETD,
            "--kubeconfig",
            kc.to_str().unwrap(),
            "--hostname-override",
            "node1",
            "--cni-conf-dir",
            conf_dir.to_str().unwrap(),
            "--subnet-file",
            dir.path().join("subnet.env").to_str().unwrap(),
            "--resync-period",
            "1s",
        ],
        &log,
        &[("RUST_LOG", "info")],
    );
    // Four failed attempts of the Node watch, then the times the log gives them: a back-off
    // spaces them out (kube's default: 0.8 s, doubling), a crash loop or a tight retry would
    // not. Only a lower bound on the spacing is asserted: a slow machine only widens it.
    let retry_times = || -> Vec<jiff::Timestamp> {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        text.lines()
            .map(strip_ansi)
            .filter(|l| l.contains("watch failed; retrying") && l.contains("Node"))
            .filter_map(|l| l.split_whitespace().next().and_then(|t| t.parse().ok()))
            .collect()
    };
    wait_for(120, "four failed Node watch attempts", || retry_times().len() >= 4, || {
        std::fs::read_to_string(&log).unwrap_or_default()
    });
    assert!(
        p.running(),
        "ferro-netd exited: {}",
        std::fs::read_to_string(&log).unwrap()
    );
    let times = retry_times();
    let spread = times[3].duration_since(times[0]);
    assert!(
        spread >= jiff::SignedDuration::from_secs(2),
        "4 attempts within {spread:?}: the retry is not backing off\n{}",
        std::fs::read_to_string(&log).unwrap()
    );
    assert!(!conf_dir.exists(), "nothing is written without a node");
    assert!(p.terminate(), "no clean exit on SIGTERM");

    // A kubeconfig that does not exist: a clear error and a non-zero exit.
    let out = ns
        .exec(&[
            NETD,
            "--kubeconfig",
            "/nonexistent/kubeconfig",
            "--hostname-override",
            "node1",
            "--cni-conf-dir",
            conf_dir.to_str().unwrap(),
        ])
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/kubeconfig"), "{err}");

    // A bad flag: clap's or the validation's message, non-zero exit, nothing touched.
    let out = ns
        .exec(&[NETD, "--vxlan-id", "0", "--hostname-override", "node1"])
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--vxlan-id"));
}

/// `line` without its ANSI colour sequences (`ESC [ ... m`).
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}
