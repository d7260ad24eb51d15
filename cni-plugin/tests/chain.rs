//! Privileged chaining test: a conflist of ferro followed by the reference `portmap` and
//! `bandwidth` plugins (Debian's containernetworking-plugins in /usr/lib/cni), run by a small
//! conflist executor that does what libcni does: ADD in order with each plugin's result as
//! the next one's `prevResult`, `runtimeConfig` filled from the plugin's `capabilities`, DEL
//! in reverse order with the final result as `prevResult`.
//!
//! The world: a node namespace (where the plugins run), a pod namespace, and a client
//! namespace connected to the node by a veth pair. Nothing is changed in the machine's root
//! namespace; the guards delete the namespaces on drop, also on panic. Needs root (fails,
//! never skips, without it).
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::Duration;

use ferro_lab::netns::NetNs;
use serde_json::{json, Value};

const REF_DIR: &str = "/usr/lib/cni";
const BRIDGE: &str = "fcchbr0";
const HOST_PORT: u16 = 18080;
const CONTAINER_PORT: u16 = 8080;

fn require_root_and_plugins() {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let euid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or("?")
        .to_string();
    assert_eq!(
        euid, "0",
        "the chaining test builds network namespaces: run it as root"
    );
    for p in ["portmap", "bandwidth", "host-local"] {
        assert!(
            Path::new(REF_DIR).join(p).exists(),
            "{REF_DIR}/{p} is missing: apt-get install -y containernetworking-plugins \
             (scripts/lib.sh installs it)"
        );
    }
}

fn ns(tag: &str) -> NetNs {
    NetNs::new(&format!("fcchain-{tag}-{}", std::process::id())).unwrap()
}

/// The conflist executor: runs plugins in the node namespace as a runtime would.
struct Runtime<'a> {
    node: &'a NetNs,
    list: Value,
    runtime_config: Value,
}

impl Runtime<'_> {
    fn binary(ty: &str) -> String {
        if ty == "ferro" {
            env!("CARGO_BIN_EXE_ferro-cni").to_string()
        } else {
            format!("{REF_DIR}/{ty}")
        }
    }

    /// The config one plugin of the list gets (libcni's buildOneConfig).
    fn plugin_conf(&self, plugin: &Value, prev: Option<&Value>) -> Value {
        let mut conf = plugin.clone();
        conf["name"] = self.list["name"].clone();
        conf["cniVersion"] = self.list["cniVersion"].clone();
        if let Some(caps) = plugin.get("capabilities").and_then(Value::as_object) {
            let mut rc = serde_json::Map::new();
            for (k, on) in caps {
                if on == &json!(true) {
                    if let Some(v) = self.runtime_config.get(k) {
                        rc.insert(k.clone(), v.clone());
                    }
                }
            }
            if !rc.is_empty() {
                conf["runtimeConfig"] = Value::Object(rc);
            }
        }
        if let Some(p) = prev {
            conf["prevResult"] = p.clone();
        }
        conf
    }

    fn exec(&self, command: &str, id: &str, netns: &str, conf: &Value) -> Output {
        let ty = conf["type"].as_str().unwrap();
        let mut child = self
            .node
            .command(&Self::binary(ty))
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", id)
            .env("CNI_NETNS", netns)
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", REF_DIR)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let _ = child
            .stdin
            .take()
            .unwrap()
            .write_all(conf.to_string().as_bytes());
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{command} {ty}: stdout {} stderr {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    fn add(&self, id: &str, netns: &str) -> Value {
        let mut prev: Option<Value> = None;
        for plugin in self.list["plugins"].as_array().unwrap() {
            let conf = self.plugin_conf(plugin, prev.as_ref());
            let out = self.exec("ADD", id, netns, &conf);
            prev = Some(serde_json::from_slice(&out.stdout).unwrap());
        }
        prev.unwrap()
    }

    /// CHECK through the list, skipping the plugin types in `skip`.
    fn check(&self, id: &str, netns: &str, result: &Value, skip: &[&str]) {
        for plugin in self.list["plugins"].as_array().unwrap() {
            if skip.iter().any(|t| plugin["type"] == *t) {
                continue;
            }
            self.exec("CHECK", id, netns, &self.plugin_conf(plugin, Some(result)));
        }
    }

    fn del(&self, id: &str, netns: &str, result: &Value) {
        for plugin in self.list["plugins"].as_array().unwrap().iter().rev() {
            let out = self.exec("DEL", id, netns, &self.plugin_conf(plugin, Some(result)));
            assert!(out.stdout.is_empty());
        }
    }
}

fn nat_save(node: &NetNs) -> String {
    node.exec_ok(&["iptables-save", "-t", "nat"]).unwrap()
}

#[test]
#[ignore = "privileged: needs root and network namespaces; run by scripts/test.sh"]
fn ferro_portmap_bandwidth_conflist_add_check_del() {
    require_root_and_plugins();
    let node = ns("node");
    let pod = ns("pod");
    let client = ns("client");
    let data = tempfile::tempdir().unwrap();
    // The client reaches the node over its own link; nothing in the root namespace.
    node.ip(&[
        "link",
        "add",
        "fcch-n",
        "type",
        "veth",
        "peer",
        "name",
        "fcch-c",
        "netns",
        client.name(),
    ])
    .unwrap();
    node.ip(&["addr", "add", "192.168.231.1/24", "dev", "fcch-n"])
        .unwrap();
    node.ip(&["link", "set", "fcch-n", "up"]).unwrap();
    client
        .ip(&["addr", "add", "192.168.231.2/24", "dev", "fcch-c"])
        .unwrap();
    client.ip(&["link", "set", "fcch-c", "up"]).unwrap();
    client
        .ip(&["route", "add", "default", "via", "192.168.231.1"])
        .unwrap();

    let list = json!({
        "cniVersion": "1.0.0",
        "name": "chainnet",
        "plugins": [
            {"type": "ferro", "bridge": BRIDGE, "isGateway": true, "mtu": 1400,
             "ipam": {"ranges": [[{"subnet": "10.79.0.0/24"}]], "dataDir": data.path()}},
            {"type": "portmap", "capabilities": {"portMappings": true}, "snat": true},
            {"type": "bandwidth", "capabilities": {"bandwidth": true}},
        ],
    });
    let rt = Runtime {
        node: &node,
        list,
        runtime_config: json!({
            "portMappings": [{"hostPort": HOST_PORT, "containerPort": CONTAINER_PORT, "protocol": "tcp"}],
            "bandwidth": {"ingressRate": 100_000_000, "ingressBurst": 1_000_000,
                          "egressRate": 100_000_000, "egressBurst": 1_000_000},
            "unused": {"not": "asked for"},
        }),
    };
    let id = "ctr-chain";
    let result = rt.add(id, &pod.path());
    // prevResult went through both reference plugins unchanged in substance.
    let ifaces = result["interfaces"].as_array().unwrap();
    assert_eq!(ifaces[0]["name"], BRIDGE, "{result}");
    let host_veth = ifaces[1]["name"].as_str().unwrap().to_string();
    assert_eq!(host_veth, ferro_cni::plan::host_veth_name(id, "eth0"));
    assert_eq!(ifaces[2]["name"], "eth0");
    let pod_ip = result["ips"][0]["address"]
        .as_str()
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_string();
    assert!(pod_ip.starts_with("10.79.0."), "{result}");

    // portmap's DNAT rule to the pod.
    let nat = nat_save(&node);
    assert!(
        nat.contains(&format!("--to-destination {pod_ip}:{CONTAINER_PORT}")),
        "no DNAT to the pod:\n{nat}"
    );
    // bandwidth's qdiscs: tbf on the host veth (traffic towards the pod) and an ingress
    // qdisc redirecting the pod's traffic to its ifb device.
    let qdisc = node
        .exec_ok(&["tc", "qdisc", "show", "dev", &host_veth])
        .unwrap();
    assert!(qdisc.contains("tbf"), "no tbf on {host_veth}:\n{qdisc}");
    assert!(
        qdisc.contains("ingress"),
        "no ingress qdisc on {host_veth}:\n{qdisc}"
    );
    let links = node.exec_ok(&["ip", "-o", "link", "show"]).unwrap();
    assert!(
        links.contains("bwp"),
        "no ifb device of bandwidth:\n{links}"
    );

    // The forwarded port: the client connects to the node's address, the pod answers.
    let (bound_tx, bound) = std::sync::mpsc::channel();
    let listener = pod.spawn_in(move || {
        let l = TcpListener::bind(("0.0.0.0", CONTAINER_PORT)).unwrap();
        bound_tx.send(()).unwrap();
        let (mut s, peer) = l.accept().unwrap();
        s.write_all(b"hello from the pod").unwrap();
        peer
    });
    // Connect once the pod listens.
    bound.recv().unwrap();
    let reply = client
        .spawn_in(|| {
            let addr: SocketAddr = format!("192.168.231.1:{HOST_PORT}").parse().unwrap();
            let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut buf = String::new();
            s.read_to_string(&mut buf).unwrap();
            buf
        })
        .join()
        .unwrap()
        .unwrap();
    assert_eq!(reply, "hello from the pod");
    let peer = listener.join().unwrap().unwrap();
    assert_eq!(peer.ip().to_string(), "192.168.231.2", "source kept");

    // Debian's portmap 1.1.1 fails CHECK on an IPv4-only attachment (it looks for the
    // IPv6 DNAT chain too: "could not check ipv6 dnat"), whatever plugin comes before it, so
    // CHECK runs through ferro and bandwidth only.
    rt.check(id, &pod.path(), &result, &["portmap"]);

    rt.del(id, &pod.path(), &result);
    let nat = nat_save(&node);
    assert!(!nat.contains(&pod_ip), "portmap rules left:\n{nat}");
    assert!(!nat.contains("CNI-DN-"), "portmap chain left:\n{nat}");
    // DEL hands the host veth to a detached `--reap-link` child, so wait for it to go
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let links = loop {
        let links = node.exec_ok(&["ip", "-o", "link", "show"]).unwrap();
        if !links.contains(&host_veth) || std::time::Instant::now() > deadline {
            break links;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!links.contains(&host_veth), "host veth left:\n{links}");
    assert!(!links.contains("bwp"), "ifb device left:\n{links}");
    // A second DEL of the whole list is fine (idempotent everywhere).
    rt.del(id, &pod.path(), &result);
}
