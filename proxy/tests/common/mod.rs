//! A node in network namespaces for the privileged tests: the node namespace (where the
//! proxy's rules go) with a bridge, pod namespaces on it serving HTTP with busybox httpd (the
//! answer names the pod; /cgi-bin/ip answers the client's address), and a client namespace
//! outside the node on a veth (for NodePorts and external IPs). Everything is created under
//! names with this process's pid and removed on drop, also when the test fails.
#![allow(clippy::unwrap_used, dead_code)]

use std::net::IpAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use ferro_lab::netns::NetNs;
use ferro_lab::run;
use ferro_proxy::error::ExecError;
use ferro_proxy::exec::{Host, Runner};

pub const NODE_IP: &str = "192.168.77.1";
pub const CLIENT_IP: &str = "192.168.77.2";
pub const GATEWAY: &str = "10.244.0.1";
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";

/// Runs kernel tools inside one namespace (`ip netns exec`), for the real backends.
#[derive(Clone)]
pub struct InNs(pub String);

impl Runner for InNs {
    fn run(&mut self, program: &str, args: &[&str], stdin: Option<&str>) -> Result<String, ExecError> {
        let mut full = vec!["netns", "exec", self.0.as_str(), program];
        full.extend_from_slice(args);
        Host.run("ip", &full, stdin)
    }
}

/// A request that got no answer: curl's exit code and message.
#[derive(Debug, Clone)]
pub struct Failure {
    pub code: i32,
    pub text: String,
}

pub struct Pod {
    pub ns: NetNs,
    pub ip: String,
    pub name: String,
    httpd: Option<Child>,
    _dir: tempfile::TempDir,
}

impl Drop for Pod {
    fn drop(&mut self) {
        if let Some(mut c) = self.httpd.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub struct World {
    pub tag: String,
    pub node: NetNs,
    pub client: NetNs,
    pub pods: Vec<Pod>,
}

fn ip(ns: &str, args: &[&str]) -> Result<()> {
    let mut c = Command::new("ip");
    c.args(["-n", ns]).args(args);
    run(&mut c).map(drop)
}

impl World {
    /// A node namespace with `pods` pods (10.244.0.11, .12, ...) on bridge `br0`, and a
    /// client at 192.168.77.2 reaching the node at 192.168.77.1.
    pub fn new(tag: &str, pods: usize) -> Result<World> {
        ferro_lab::require_root()?;
        ferro_lab::require_bin("busybox", "busybox-static")?;
        ferro_lab::require_bin("curl", "curl")?;
        let tag = format!("fpx-{tag}-{}", std::process::id());
        let node = NetNs::new(&format!("{tag}-n"))?;
        let client = NetNs::new(&format!("{tag}-c"))?;
        let n = node.name().to_string();
        let mut world = World { tag: tag.clone(), node, client, pods: Vec::new() };
        let sysctl = |ns: &str, key: &str, v: &str| -> Result<()> {
            run(Command::new("ip").args(["netns", "exec", ns, "sysctl", "-qw", &format!("{key}={v}")])).map(drop)
        };
        sysctl(&n, "net.ipv4.ip_forward", "1")?;
        // bridged pod-to-pod replies must pass conntrack for Service DNAT (as on a real node)
        sysctl(&n, "net.bridge.bridge-nf-call-iptables", "1")?;
        ip(&n, &["link", "add", "br0", "type", "bridge"])?;
        ip(&n, &["addr", "add", &format!("{GATEWAY}/24"), "dev", "br0"])?;
        ip(&n, &["link", "set", "br0", "up"])?;
        // client <-> node
        let c = world.client.name().to_string();
        ip(&n, &["link", "add", "uplink", "type", "veth", "peer", "name", "eth0", "netns", &c])?;
        ip(&n, &["addr", "add", &format!("{NODE_IP}/24"), "dev", "uplink"])?;
        ip(&n, &["link", "set", "uplink", "up"])?;
        ip(&c, &["addr", "add", &format!("{CLIENT_IP}/24"), "dev", "eth0"])?;
        ip(&c, &["link", "set", "eth0", "up"])?;
        ip(&c, &["route", "add", "default", "via", NODE_IP])?;
        for i in 0..pods {
            world.add_pod(i)?;
        }
        Ok(world)
    }

    fn add_pod(&mut self, i: usize) -> Result<()> {
        let n = self.node.name().to_string();
        let name = format!("pod{i}");
        let ns = NetNs::new(&format!("{}-p{i}", self.tag))?;
        let p = ns.name().to_string();
        let addr = format!("10.244.0.{}", 11 + i);
        let host_if = format!("veth{i}");
        ip(&n, &["link", "add", &host_if, "type", "veth", "peer", "name", "eth0", "netns", &p])?;
        ip(&n, &["link", "set", &host_if, "master", "br0"])?;
        ip(&n, &["link", "set", &host_if, "type", "bridge_slave", "hairpin", "on"])?;
        ip(&n, &["link", "set", &host_if, "up"])?;
        ip(&p, &["addr", "add", &format!("{addr}/24"), "dev", "eth0"])?;
        ip(&p, &["link", "set", "eth0", "up"])?;
        ip(&p, &["route", "add", "default", "via", GATEWAY])?;
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join("index.html"), &name)?;
        std::fs::create_dir(dir.path().join("cgi-bin"))?;
        let cgi = dir.path().join("cgi-bin/ip");
        std::fs::write(&cgi, "#!/bin/sh\nprintf 'Content-Type: text/plain\\r\\n\\r\\n%s' \"$REMOTE_ADDR\"\n")?;
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&cgi, std::fs::Permissions::from_mode(0o755))?;
        let httpd = Command::new("ip")
            .args(["netns", "exec", &p, "busybox", "httpd", "-f", "-p", "8080", "-h"])
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting busybox httpd")?;
        let pod = Pod { ns, ip: addr, name, httpd: Some(httpd), _dir: dir };
        // wait until it answers on its own address
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if self.get_from(pod.ns.name(), &format!("http://{}:8080/", pod.ip)).is_ok() {
                break;
            }
            if Instant::now() > deadline {
                bail!("httpd in {} did not answer", pod.name);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.pods.push(pod);
        Ok(())
    }

    pub fn runner(&self) -> InNs {
        InNs(self.node.name().to_string())
    }

    /// `curl url` from namespace `ns` (5 s at most): the body, or the failure (curl's exit
    /// code: 7 refused or unreachable at once, 28 timed out). busybox wget crashes inside
    /// network namespaces on this Debian release, so curl it is.
    pub fn get_from(&self, ns: &str, url: &str) -> std::result::Result<String, Failure> {
        let out = Command::new("ip")
            .args(["netns", "exec", ns, "curl", "-sS", "--max-time", "5", url])
            .output()
            .map_err(|e| Failure { code: -1, text: e.to_string() })?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        } else {
            Err(Failure {
                code: out.status.code().unwrap_or(-1),
                text: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            })
        }
    }

    pub fn from_pod(&self, i: usize, url: &str) -> std::result::Result<String, Failure> {
        self.get_from(self.pods[i].ns.name(), url)
    }

    pub fn from_node(&self, url: &str) -> std::result::Result<String, Failure> {
        self.get_from(self.node.name(), url)
    }

    pub fn from_client(&self, url: &str) -> std::result::Result<String, Failure> {
        self.get_from(self.client.name(), url)
    }

    /// The client address a pod's /cgi-bin/ip saw (busybox httpd reports IPv4 clients as
    /// "[::ffff:a.b.c.d]").
    pub fn remote_ip(body: &str) -> String {
        body.trim_start_matches("[::ffff:").trim_start_matches('[').trim_end_matches(']').to_string()
    }

    /// The node's local addresses (for the tracers' `addrtype LOCAL`).
    pub fn node_local_ips(&self) -> Vec<IpAddr> {
        [GATEWAY, NODE_IP, "127.0.0.1"].iter().map(|s| s.parse().unwrap()).collect()
    }
}
