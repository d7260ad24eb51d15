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
        // a node has a default route (locally sent packets to a ClusterIP need one before the
        // nat OUTPUT chain rewrites them); here it points at the client namespace
        ip(&n, &["route", "add", "default", "via", CLIENT_IP])?;
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

    pub fn get_in_pod(&self, i: usize, url: &str) -> std::result::Result<String, Failure> {
        self.get_from(self.pods[i].ns.name(), url)
    }

    pub fn get_in_node(&self, url: &str) -> std::result::Result<String, Failure> {
        self.get_from(self.node.name(), url)
    }

    pub fn get_in_client(&self, url: &str) -> std::result::Result<String, Failure> {
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

/// A process killed (by its pid) when dropped.
pub struct Proc(pub Option<Child>);

impl Proc {
    pub fn kill(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A binary of the workspace built next to this test's (`cargo build --workspace
/// --all-targets`, as scripts/test.sh does).
pub fn workspace_bin(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let bin = exe.parent().unwrap().parent().unwrap().join(name);
    assert!(bin.exists(), "{} is missing: build the workspace first (cargo build --workspace --all-targets)", bin.display());
    bin
}

/// ferro-control-plane inside the node namespace on 127.0.0.1:6443, and ferro-proxy (the real
/// binary) in the same namespace against it. Drop stops both (proxy first), then the world.
pub struct Cluster {
    pub proxy: Proc,
    pub cp: Proc,
    pub dir: tempfile::TempDir,
    pub world: World,
    pub mode: String,
}

impl Cluster {
    pub fn new(tag: &str, pods: usize, mode: &str) -> Result<Cluster> {
        let world = World::new(tag, pods)?;
        ferro_lab::require_bin("kubectl", "kubernetes-client")?;
        let dir = tempfile::Builder::new().prefix("ferro-proxy-e2e").tempdir()?;
        let log = std::fs::File::create(dir.path().join("control-plane.log"))?;
        let cp = Command::new("ip")
            .args(["netns", "exec", world.node.name()])
            .arg(workspace_bin("ferro-control-plane"))
            .arg("--data-dir")
            .arg(dir.path().join("cp"))
            .args(["--bind-address", "127.0.0.1", "--secure-port", "6443", "--service-node-port-range", "30000-30100"])
            .args(["--controllers", "*"])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting ferro-control-plane")?;
        let mut c = Cluster { proxy: Proc(None), cp: Proc(Some(cp)), dir, world, mode: mode.to_string() };
        let kubeconfig = c.kubeconfig();
        c.wait("the API server", Duration::from_secs(60), || kubeconfig.exists() && c.kubectl(&["get", "--raw", "/readyz"]).is_ok())?;
        // the node object the proxy reads its zone from
        c.apply(&format!(
            "apiVersion: v1\nkind: Node\nmetadata:\n  name: {NODE}\n  labels:\n    topology.kubernetes.io/zone: z1\n"
        ))?;
        c.start_proxy(&[])?;
        Ok(c)
    }

    pub fn kubeconfig(&self) -> std::path::PathBuf {
        self.dir.path().join("cp/admin.kubeconfig")
    }

    /// (Re)starts ferro-proxy with extra flags and waits for its first sync (/healthz shows a lastUpdated).
    pub fn start_proxy(&mut self, extra: &[&str]) -> Result<()> {
        self.proxy.kill();
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.path().join("proxy.log"))?;
        let child = Command::new("ip")
            .args(["netns", "exec", self.world.node.name()])
            .arg(env!("CARGO_BIN_EXE_ferro-proxy"))
            .arg("--kubeconfig")
            .arg(self.kubeconfig())
            .args(["--hostname-override", NODE, "--proxy-mode", &self.mode, "--cluster-cidr", CLUSTER_CIDR])
            .args(["--healthz-bind-address", "127.0.0.1:10256", "--metrics-bind-address", "127.0.0.1:10249"])
            .args(extra)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting ferro-proxy")?;
        self.proxy = Proc(Some(child));
        // /healthz answers before the first sync (curl without -f takes a 503 too); lastUpdated
        // stays at Go's zero time until the rules reached the kernel
        self.wait("ferro-proxy's first sync (/healthz lastUpdated set)", Duration::from_secs(60), || {
            self.world
                .get_in_node("http://127.0.0.1:10256/healthz")
                .is_ok_and(|b| b.contains("\"lastUpdated\"") && !b.contains("0001-01-01"))
        })
    }

    /// Polls `cond` every 50 ms until it holds or `timeout` passes (then fails with the logs).
    pub fn wait(&self, what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if cond() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("timed out waiting for {what}\n--- proxy.log ---\n{}", self.log("proxy.log"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log(&self, name: &str) -> String {
        let text = std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(60)..].join("\n")
    }

    pub fn kubectl_stdin(&self, args: &[&str], stdin: Option<&str>) -> Result<String> {
        use std::io::Write as _;
        let mut child = Command::new("ip")
            .args(["netns", "exec", self.world.node.name(), "kubectl", "--kubeconfig"])
            .arg(self.kubeconfig())
            .args(args)
            .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(text.as_bytes())?;
        }
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!("kubectl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        self.kubectl_stdin(args, None)
    }

    pub fn apply(&self, yaml: &str) -> Result<String> {
        self.kubectl_stdin(&["apply", "-f", "-"], Some(yaml))
    }

    /// A selector-less Service with a hand-made EndpointSlice of the given pods (indexes into
    /// the world's pods, with their ready flag); returns the ClusterIP.
    pub fn service(&self, name: &str, spec_extra: &str, endpoints: &[(usize, bool)]) -> Result<String> {
        self.apply(&format!(
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  ports:\n  - name: http\n    port: 80\n    targetPort: 8080\n    protocol: TCP\n{spec_extra}"
        ))?;
        self.endpoints(name, endpoints)?;
        let ip = self.kubectl(&["get", "service", name, "-o", "jsonpath={.spec.clusterIP}"])?;
        Ok(ip.trim().to_string())
    }

    /// Replaces the Service's hand-made EndpointSlice.
    pub fn endpoints(&self, name: &str, endpoints: &[(usize, bool)]) -> Result<()> {
        let mut eps = String::new();
        for (i, ready) in endpoints {
            eps.push_str(&format!(
                "- addresses: [\"{}\"]\n  conditions: {{ready: {ready}, serving: {ready}, terminating: false}}\n  nodeName: {NODE}\n",
                self.world.pods[*i].ip
            ));
        }
        let eps = if eps.is_empty() { "endpoints: []\n".to_string() } else { format!("endpoints:\n{eps}") };
        self.apply(&format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-manual\n  namespace: default\n  labels:\n    kubernetes.io/service-name: {name}\n    endpointslice.kubernetes.io/managed-by: ferro-proxy-test\naddressType: IPv4\nports:\n- name: http\n  port: 8080\n  protocol: TCP\n{eps}"
        ))
        .map(drop)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.proxy.kill();
        self.cp.kill();
        // the world (namespaces, pods) drops after this
    }
}

pub const NODE: &str = "proxy-node";
