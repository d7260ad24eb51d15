//! A cluster of several nodes on one machine (the multi-node lab): ferro-control-plane in an
//! underlay namespace holding the bridge `br-under` (192.168.77.1/24), and per node a network
//! namespace (`eth0` 192.168.77.1N on that bridge) with its own containerd, ferro-agent (in
//! containerd's network and mount namespaces), ferro-netd (the VXLAN overlay, the CNI
//! conflist), ferro-proxy (iptables mode) and ferro-csi (loop.csi.ferro.dev with a pool of
//! its own size, next to the agent). The nodes register themselves, get their
//! podCIDRs from the control plane's node IPAM. The agents join as workers do: a bootstrap
//! token (`ferro-control-plane token create`) and a CSR the control plane approves and signs
//! (`system:node:<name>`); netd then uses the agent's kubeconfig (the node's identity), the
//! proxy and the CSI driver client certificates of their own (`system:kube-proxy`,
//! `system:ferro-csi`).
//!
//! Nothing is made in the root network namespace; every process is ours and ended by its pid;
//! namespaces, containerds (with their shims, runc processes and mounts), the agents' cgroup
//! roots and the temp dir go when the [`Cluster`] is dropped, also when a test fails.
//! See docs/design/lab.md ("The multi-node lab").

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::containerd::{Containerd, Options};
use crate::images::{build_images, build_static_pause, ImageTars, BUSYBOX_IMAGE, PAUSE_IMAGE};
use crate::netns::NetNs;
use crate::storage::Scratch;

/// The underlay's address of the control plane.
pub const CONTROL_PLANE_IP: &str = "192.168.77.1";
/// The pod network; each node gets a /24 of it from the control plane.
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";
const API_PORT: u16 = 6443;

/// Node `i`'s name and underlay address.
pub fn node_name(i: usize) -> String {
    format!("node{}", i + 1)
}

pub fn node_ip(i: usize) -> String {
    format!("192.168.77.{}", 11 + i)
}

/// A process of the lab, ended (SIGTERM, then SIGKILL after 10 s) by its pid when dropped.
pub struct Proc {
    child: Option<Child>,
}

impl Proc {
    fn new(child: Child) -> Proc {
        Proc { child: Some(child) }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Ends the process: SIGTERM, then SIGKILL if it is still there after 10 s.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        if let Ok(pid) = i32::try_from(child.id()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if !matches!(child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// SIGKILL: a crash, or a machine that lost power.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Where the lab's binaries are: `cargo build --workspace --all-targets` puts them next to
/// the test executables' `deps` dir.
#[derive(Debug, Clone)]
pub struct Bins {
    pub dir: PathBuf,
}

impl Bins {
    /// The binaries in `dir`, made absolute (the agent and CSI driver start through nsenter,
    /// whose mount namespace does not keep this process's working directory).
    pub fn new(dir: &Path) -> Result<Bins> {
        let dir = std::fs::canonicalize(dir).with_context(|| format!("binary dir {}", dir.display()))?;
        Ok(Bins { dir })
    }

    /// `target/<profile>` of the running test executable (`target/<profile>/deps/<test>`).
    pub fn beside_test() -> Result<Bins> {
        let exe = std::env::current_exe()?;
        let dir = exe.parent().and_then(Path::parent).context("test executable outside target/<profile>/deps")?;
        Ok(Bins { dir: dir.to_path_buf() })
    }

    pub fn get(&self, name: &str) -> Result<PathBuf> {
        let p = self.dir.join(name);
        if !p.is_file() {
            bail!("{} is missing: build the workspace first (cargo build --workspace --all-targets, as scripts/test.sh does)", p.display());
        }
        Ok(p)
    }
}

/// One node of the cluster. Drop order: the agent, netd, proxy and CSI driver (by pid),
/// containerd (with its pods), the cgroup root, the CSI driver's loop devices, the namespace.
pub struct Node {
    pub agent: Proc,
    pub netd: Proc,
    pub proxy: Proc,
    pub csi: Proc,
    pub ctrd: Containerd,
    /// ferro-csi's data dir (its pool's volumes, loop-attached): detached and removed on drop.
    pub csi_data: Scratch,
    /// ferro-csi's --pool-size.
    pub pool: String,
    pub ns: NetNs,
    pub name: String,
    pub ip: String,
    /// The node's files: kubeconfigs, agent root, IPAM, logs.
    pub dir: PathBuf,
    pub cgroup_root: String,
    agent_starts: u32,
}

impl Drop for Node {
    fn drop(&mut self) {
        self.agent.stop();
        self.netd.stop();
        self.proxy.stop();
        self.csi.stop();
        self.ctrd.stop();
        remove_cgroup_root(&self.cgroup_root);
    }
}

/// The lab. Drop order: the nodes, the control plane, the underlay namespace, the temp dir.
pub struct Cluster {
    pub nodes: Vec<Node>,
    pub cp: Proc,
    pub under: NetNs,
    bins: Bins,
    images: ImageTars,
    pub dir: tempfile::TempDir,
}

impl Cluster {
    /// The control plane and one node per entry of `pools` (that node's ferro-csi pool size,
    /// e.g. `"100Mi"`), every node Ready with its overlay, proxy and CSI driver up. `tag`
    /// keeps concurrent labs apart (namespace names), with the test process's pid.
    pub fn start(tag: &str, pools: &[&str], node_monitor_grace_period: &str) -> Result<Cluster> {
        Cluster::start_with(Bins::beside_test()?, tag, pools, node_monitor_grace_period)
    }

    /// As [`Cluster::start`], with the binaries of `bins` (`ferro-lab cluster`: the release
    /// build next to it).
    pub fn start_with(bins: Bins, tag: &str, pools: &[&str], node_monitor_grace_period: &str) -> Result<Cluster> {
        crate::require_root()?;
        crate::require_bin("kubectl", "kubernetes-client")?;
        crate::require_bin("nsenter", "util-linux")?;
        let dir = tempfile::Builder::new().prefix(&format!("ferro-cluster-{tag}-")).tempdir()?;
        let images = build_images(&dir.path().join("images"), &build_static_pause()?)?;
        let prefix = format!("fcl{tag}{}", std::process::id());
        let under = NetNs::new(&format!("{prefix}u"))?;
        under.ip(&["link", "add", "br-under", "type", "bridge"])?;
        under.ip(&["link", "set", "br-under", "up"])?;
        under.ip(&["addr", "add", &format!("{CONTROL_PLANE_IP}/24"), "dev", "br-under"])?;
        let cp_dir = dir.path().join("cp");
        let log = std::fs::File::create(dir.path().join("cp.log"))?;
        let cp = under
            .command(bins.get("ferro-control-plane")?.to_str().context("path")?)
            .arg("--data-dir")
            .arg(&cp_dir)
            .args(["--bind-address", CONTROL_PLANE_IP, "--advertise-address", CONTROL_PLANE_IP])
            .args(["--secure-port", &API_PORT.to_string()])
            .args(["--allocate-node-cidrs", "--cluster-cidr", CLUSTER_CIDR])
            .args(["--node-monitor-grace-period", node_monitor_grace_period])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("start ferro-control-plane")?;
        let mut cluster = Cluster { nodes: Vec::new(), cp: Proc::new(cp), under, bins, images, dir };
        cluster.wait("the control plane to serve", Duration::from_secs(60), |c| {
            (c.admin_kubeconfig().exists() && c.kubectl(&["get", "--raw", "/healthz"]).is_ok_and(|o| o.status.success())).then_some(())
        })?;
        for (i, pool) in pools.iter().enumerate() {
            let node = cluster.add_node(&prefix, i, pool)?;
            cluster.nodes.push(node);
        }
        for i in 0..pools.len() {
            cluster.start_node(i)?;
        }
        for i in 0..pools.len() {
            cluster.wait_node_ready(i)?;
        }
        Ok(cluster)
    }

    /// Node `i`'s namespace on the underlay, its containerd with the test images.
    fn add_node(&self, prefix: &str, i: usize, pool: &str) -> Result<Node> {
        let (name, ip) = (node_name(i), node_ip(i));
        let ns = NetNs::new(&format!("{prefix}n{}", i + 1))?;
        let port = format!("vu{}", i + 1);
        self.under.ip(&["link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", ns.name()])?;
        self.under.ip(&["link", "set", &port, "master", "br-under", "up"])?;
        ns.ip(&["addr", "add", &format!("{ip}/24"), "dev", "eth0"])?;
        ns.ip(&["link", "set", "eth0", "up"])?;
        // Locally sent packets to a ClusterIP need a route before nat OUTPUT rewrites them;
        // the underlay namespace has none further.
        ns.ip(&["route", "add", "default", "via", CONTROL_PLANE_IP])?;
        // A node routes its pods' traffic, and bridged replies pass iptables so that
        // ferro-proxy's DNAT is undone (both per namespace: the root namespace is untouched).
        ns.exec_ok(&["sysctl", "-qw", "net.ipv4.ip_forward=1"])?;
        ns.exec_ok(&["sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=1"])?;
        let dir = self.dir.path().join(&name);
        for sub in ["agent", "logs", "ipam", "run"] {
            std::fs::create_dir_all(dir.join(sub))?;
        }
        let opts = Options {
            sandbox_image: PAUSE_IMAGE.into(),
            // ferro-netd's conflist chains the reference portmap plugin (hostPort)
            cni_plugins: vec![
                ("ferro".into(), self.bins.get("ferro-cni")?),
                ("loopback".into(), "/usr/lib/cni/loopback".into()),
                ("portmap".into(), "/usr/lib/cni/portmap".into()),
            ],
            // ferro-netd writes the conflist once the node has its podCIDR
            cni_configs: Vec::new(),
            runtime_binary: None,
            root_fs_bytes: None,
        };
        let ctrd = Containerd::start(&ns, &opts)?;
        ctrd.import(&self.images.pause)?;
        ctrd.import(&self.images.busybox)?;
        let cgroup_root = format!("/{prefix}-{name}");
        let csi_data = Scratch::new(&format!("ferro-cluster-csi-{name}-"))?;
        Ok(Node {
            agent: Proc { child: None },
            netd: Proc { child: None },
            proxy: Proc { child: None },
            csi: Proc { child: None },
            ctrd,
            csi_data,
            pool: pool.to_string(),
            ns,
            name,
            ip,
            dir,
            cgroup_root,
            agent_starts: 0,
        })
    }

    /// Starts (again) node `i`'s netd, agent, proxy and CSI driver: whichever of them is not
    /// running.
    pub fn start_node(&mut self, i: usize) -> Result<()> {
        let bootstrap = self.bootstrap_kubeconfig()?;
        let proxy_kc = self.kubeconfig_for("proxy.kubeconfig", "system:kube-proxy", &[])?;
        let netd_bin = self.bins.get("ferro-netd")?;
        let agent_bin = self.bins.get("ferro-agent")?;
        let proxy_bin = self.bins.get("ferro-proxy")?;
        let csi_kc = self.kubeconfig_for("csi.kubeconfig", "system:ferro-csi", &[])?;
        let csi_bin = self.bins.get("ferro-csi")?;
        let n = &mut self.nodes[i];
        let d = n.dir.clone();
        if !n.agent.running() {
            n.agent_starts += 1;
            std::fs::write(
                d.join("agent.yaml"),
                format!(
                    "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\npodLogsDir: {}\n\
                     imageGCHighThresholdPercent: 100\nevictionHard:\n  memory.available: 100Mi\n  nodefs.available: 0%\n  nodefs.inodesFree: 0%\n",
                    d.join("logs").display()
                ),
            )?;
            let log = append(&d.join("agent.log"))?;
            let pid = n.ctrd.pid().context("containerd is not running")?.to_string();
            let child = Command::new("nsenter")
                .args(["--target", &pid, "--net", "--mount", "--"])
                .arg(&agent_bin)
                .arg("--bootstrap-kubeconfig")
                .arg(&bootstrap)
                .arg("--kubeconfig")
                .arg(d.join("kubelet.kubeconfig"))
                .args(["--hostname-override", &n.name, "--node-ip", &n.ip])
                .arg("--root-dir")
                .arg(d.join("agent"))
                .arg("--container-runtime-endpoint")
                .arg(format!("unix://{}", n.ctrd.socket().display()))
                .arg("--config")
                .arg(d.join("agent.yaml"))
                .args(["--cgroup-root", &n.cgroup_root])
                .env("RUST_LOG", "info")
                .env("NO_COLOR", "1")
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .context("start ferro-agent")?;
            n.agent = Proc::new(child);
        }
        // netd as the node, with the agent's kubeconfig (written once its CSR was signed)
        let node_kc = d.join("kubelet.kubeconfig");
        if !n.netd.running() {
            let deadline = Instant::now() + Duration::from_secs(60);
            while !node_kc.exists() {
                if Instant::now() > deadline || !n.agent.running() {
                    bail!("{}'s agent wrote no kubeconfig (TLS bootstrap):\n{}", n.name, std::fs::read_to_string(d.join("agent.log")).unwrap_or_default());
                }
                crate::interrupt::sleep(Duration::from_millis(100));
            }
            let log = append(&d.join("netd.log"))?;
            let child = n
                .ns
                .command(netd_bin.to_str().context("path")?)
                .arg("--kubeconfig")
                .arg(&node_kc)
                .args(["--hostname-override", &n.name, "--node-ip", &n.ip, "--cluster-cidr", CLUSTER_CIDR])
                .arg("--cni-conf-dir")
                .arg(n.ctrd.dir().join("cni/conf"))
                .arg("--subnet-file")
                .arg(d.join("run/subnet.env"))
                .arg("--cni-data-dir")
                .arg(d.join("ipam"))
                .env("RUST_LOG", "info")
                .env("NO_COLOR", "1")
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .context("start ferro-netd")?;
            n.netd = Proc::new(child);
        }
        if !n.proxy.running() {
            let log = append(&d.join("proxy.log"))?;
            let child = n
                .ns
                .command(proxy_bin.to_str().context("path")?)
                .arg("--kubeconfig")
                .arg(&proxy_kc)
                .args(["--hostname-override", &n.name, "--cluster-cidr", CLUSTER_CIDR])
                .args(["--healthz-bind-address", "127.0.0.1:10256", "--metrics-bind-address", "127.0.0.1:10249"])
                .env("RUST_LOG", "info")
                .env("NO_COLOR", "1")
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .context("start ferro-proxy")?;
            n.proxy = Proc::new(child);
        }
        if !n.csi.running() {
            // next to the agent, in containerd's mount namespace (it mounts the pods' volumes);
            // it registers through the agent's plugin registry
            let log = append(&d.join("csi.log"))?;
            let pid = n.ctrd.pid().context("containerd is not running")?.to_string();
            let data = n.csi_data.path().to_path_buf();
            let child = Command::new("nsenter")
                .args(["--target", &pid, "--net", "--mount", "--"])
                .arg(&csi_bin)
                .args(["--node-id", &n.name, "--pool-size", &n.pool])
                .arg("--data-dir")
                .arg(&data)
                .arg("--endpoint")
                .arg(format!("unix://{}", data.join("csi.sock").display()))
                .arg("--registration-dir")
                .arg(d.join("agent/plugins_registry"))
                .arg("--allowed-path")
                .arg(d.join("agent"))
                .arg("--kubeconfig")
                .arg(&csi_kc)
                .env("RUST_LOG", "info")
                .env("NO_COLOR", "1")
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .context("start ferro-csi")?;
            n.csi = Proc::new(child);
        }
        Ok(())
    }

    /// Until node `i` is Ready, its conflist written (the overlay knows its podCIDR), its
    /// proxy has synced once and its CSI driver is registered.
    pub fn wait_node_ready(&self, i: usize) -> Result<()> {
        let name = node_name(i);
        self.wait(&format!("{name} to be Ready"), Duration::from_secs(90), |c| {
            let out = c.kubectl(&["get", "node", &name, "-o", "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}"]).ok()?;
            (String::from_utf8_lossy(&out.stdout) == "True").then_some(())
        })?;
        let n = &self.nodes[i];
        let conflist = n.ctrd.dir().join("cni/conf/10-ferro.conflist");
        self.wait(&format!("{name}'s CNI conflist from ferro-netd"), Duration::from_secs(60), |_| conflist.exists().then_some(()))?;
        self.wait(&format!("{name}'s ferro-proxy first sync"), Duration::from_secs(60), |_| {
            let out = n.ns.command("curl").args(["-fsS", "--max-time", "5", "http://127.0.0.1:10256/healthz"]).output().ok()?;
            out.status.success().then_some(())
        })?;
        self.wait(&format!("{name}'s ferro-csi registered in its CSINode"), Duration::from_secs(60), |c| {
            let out = c.kubectl(&["get", "csinode", &name, "-o", "jsonpath={.spec.drivers[*].name}"]).ok()?;
            (String::from_utf8_lossy(&out.stdout) == "loop.csi.ferro.dev").then_some(())
        })
    }

    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.dir.path().join("cp/admin.kubeconfig")
    }

    /// A kubeconfig (made once) with a client certificate for `user` in `groups`, signed by
    /// the control plane's CA, for its underlay address.
    fn kubeconfig_for(&self, file: &str, user: &str, groups: &[&str]) -> Result<PathBuf> {
        let path = self.dir.path().join(file);
        if path.exists() {
            return Ok(path);
        }
        let mut cmd = Command::new(self.bins.get("ferro-control-plane")?);
        cmd.args(["kubeconfig", "--data-dir"]).arg(self.dir.path().join("cp")).args(["--user", user]);
        for g in groups {
            cmd.args(["--group", g]);
        }
        let out = crate::run(cmd.args(["--server", &format!("https://{CONTROL_PLANE_IP}:{API_PORT}")]))?;
        std::fs::write(&path, out.stdout)?;
        Ok(path)
    }

    /// A kubeconfig with only the API server, its CA and a bootstrap token (made once, valid
    /// for the cluster's life): what a worker is given to join.
    fn bootstrap_kubeconfig(&self) -> Result<PathBuf> {
        let path = self.dir.path().join("bootstrap.kubeconfig");
        if path.exists() {
            return Ok(path);
        }
        // it creates the token's Secret through the API: from the underlay, where the API is
        let cp = self.bins.get("ferro-control-plane")?;
        let out = crate::run(self.under.command(cp.to_str().context("path")?).args(["token", "create", "--data-dir"]).arg(self.dir.path().join("cp")))?;
        let token = String::from_utf8_lossy(&out.stdout).trim().to_string();
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: ferro\n  cluster:\n    server: https://{CONTROL_PLANE_IP}:{API_PORT}\n    certificate-authority: {}\n\
                 contexts:\n- name: boot\n  context: {{cluster: ferro, user: boot}}\ncurrent-context: boot\nusers:\n- name: boot\n  user: {{token: {token}}}\n",
                self.dir.path().join("cp/ca.crt").display()
            ),
        )?;
        Ok(path)
    }

    /// kubectl (admin) from the underlay namespace.
    pub fn kubectl(&self, args: &[&str]) -> Result<Output> {
        Ok(self.under.command("kubectl").arg("--kubeconfig").arg(self.admin_kubeconfig()).args(args).output()?)
    }

    /// kubectl that must succeed: its stdout, else an error with its stderr and the logs.
    pub fn kubectl_ok(&self, args: &[&str]) -> Result<String> {
        let out = self.kubectl(args)?;
        if !out.status.success() {
            bail!("kubectl {args:?} failed: {}\n{}", String::from_utf8_lossy(&out.stderr), self.logs());
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// kubectl apply -f - of `manifest`.
    pub fn apply(&self, manifest: &str) -> Result<()> {
        use std::io::Write as _;
        let mut child = self
            .under
            .command("kubectl")
            .arg("--kubeconfig")
            .arg(self.admin_kubeconfig())
            .args(["apply", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        child.stdin.take().context("stdin")?.write_all(manifest.as_bytes())?;
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!("kubectl apply failed: {}\n{manifest}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    }

    /// Polls `check` every 200 ms until it gives a value; on timeout, an error with the
    /// cluster's state and the end of every log.
    pub fn wait<T>(&self, what: &str, limit: Duration, mut check: impl FnMut(&Cluster) -> Option<T>) -> Result<T> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(v) = check(self) {
                return Ok(v);
            }
            if Instant::now() > deadline {
                bail!("timed out after {limit:?} waiting for {what}\n{}", self.logs());
            }
            crate::interrupt::sleep(Duration::from_millis(200));
        }
    }

    /// What a failed test shows: nodes, pods, services, events, and the end of each log.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        if let Ok(o) = self.kubectl(&["get", "nodes,pods,services,endpointslices,pvc,pv,csistoragecapacities", "-A", "-o", "wide"]) {
            out.push_str(&String::from_utf8_lossy(&o.stdout));
        }
        if let Ok(o) = self.kubectl(&["get", "events", "-A", "--sort-by=.lastTimestamp"]) {
            out.push_str(&String::from_utf8_lossy(&o.stdout));
        }
        let mut files = vec![self.dir.path().join("cp.log")];
        for n in &self.nodes {
            for f in ["agent.log", "netd.log", "proxy.log", "csi.log"] {
                files.push(n.dir.join(f));
            }
            files.push(n.ctrd.dir().join("containerd.log"));
        }
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            out.push_str(&format!("--- {} (last 25 lines) ---\n", f.display()));
            for l in &lines[lines.len().saturating_sub(25)..] {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }
}

/// A pod of the cluster as the scenarios look at it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodView {
    pub name: String,
    pub node: String,
    pub ready: bool,
}

impl Cluster {
    /// The pods of the default namespace selected by `selector` that are not being deleted.
    pub fn pods(&self, selector: &str) -> Result<Vec<PodView>> {
        let list: serde_json::Value = serde_json::from_str(&self.kubectl_ok(&["get", "pods", "-l", selector, "-o", "json"])?)?;
        Ok(list["items"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .map(|p| PodView {
                name: p["metadata"]["name"].as_str().unwrap_or_default().to_string(),
                node: p["spec"]["nodeName"].as_str().unwrap_or_default().to_string(),
                ready: pod_ready(p),
            })
            .collect())
    }

    /// `wget` of `url` from pod `pod` (within `timeout_s`): the body, or what went wrong.
    pub fn fetch(&self, pod: &str, url: &str, timeout_s: u32) -> std::result::Result<String, String> {
        // `timeout`, not wget's -T: Debian's static busybox wget crashes (SIGSEGV) with -T
        let out = self.kubectl(&["exec", pod, "--", "timeout", &timeout_s.to_string(), "wget", "-qO-", url]).map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        } else {
            Err(format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
        }
    }
}

/// Whether a pod (JSON) has its Ready condition True.
pub fn pod_ready(p: &serde_json::Value) -> bool {
    p["status"]["conditions"].as_array().is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
}

/// The command of a busybox httpd on :8080 answering with its pod's name.
const HTTPD: &str = "[sh, -c, 'mkdir -p /www && hostname > /www/index.html && exec httpd -f -p 8080 -h /www']";

/// A Deployment `name` (label app=<name>) of `replicas` httpd pods (100m CPU, 32Mi each)
/// answering with their names, tolerating an unreachable or not-ready node for
/// `toleration_seconds` (upstream's default is 300).
pub fn httpd_deployment(name: &str, replicas: u32, toleration_seconds: u32) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {name}\nspec:\n  replicas: {replicas}\n  selector: {{matchLabels: {{app: {name}}}}}\n  template:\n    metadata: {{labels: {{app: {name}}}}}\n    spec:\n      terminationGracePeriodSeconds: 1\n      tolerations:\n      - {{key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute, tolerationSeconds: {toleration_seconds}}}\n      - {{key: node.kubernetes.io/not-ready, operator: Exists, effect: NoExecute, tolerationSeconds: {toleration_seconds}}}\n      containers:\n      - name: httpd\n        image: {BUSYBOX_IMAGE}\n        imagePullPolicy: Never\n        resources: {{requests: {{cpu: 100m, memory: 32Mi}}}}\n        command: {HTTPD}\n        readinessProbe: {{tcpSocket: {{port: 8080}}, periodSeconds: 1}}\n---\napiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\nspec:\n  selector: {{app: {name}}}\n  ports:\n  - {{port: 80, targetPort: 8080}}\n"
    )
}

/// An httpd pod `name` (label app=<app> when given) pinned to `node`.
pub fn httpd_pod(name: &str, app: Option<&str>, node: &str) -> String {
    let labels = app.map(|a| format!("\n  labels: {{app: {a}}}")).unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}{labels}\nspec:\n  nodeSelector: {{kubernetes.io/hostname: {node}}}\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: httpd\n    image: {BUSYBOX_IMAGE}\n    imagePullPolicy: Never\n    command: {HTTPD}\n    readinessProbe: {{tcpSocket: {{port: 8080}}, periodSeconds: 1}}\n"
    )
}

/// A pod `name` pinned to `node` that only sleeps (the client of the scenarios).
pub fn sleeper_pod(name: &str, node: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  nodeSelector: {{kubernetes.io/hostname: {node}}}\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: {BUSYBOX_IMAGE}\n    imagePullPolicy: Never\n    command: [sleep, '3600']\n"
    )
}

fn append(path: &Path) -> Result<std::fs::File> {
    Ok(std::fs::OpenOptions::new().create(true).append(true).open(path)?)
}

/// rmdir of the cgroups runc left (empty) under an agent's --cgroup-root, deepest first, in
/// the unified hierarchy and every v1 controller.
fn remove_cgroup_root(root: &str) {
    let rel = root.trim_start_matches('/');
    if rel.is_empty() {
        return;
    }
    let mut hierarchies = vec![PathBuf::from("/sys/fs/cgroup")];
    if let Ok(entries) = std::fs::read_dir("/sys/fs/cgroup") {
        hierarchies.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
    }
    for h in hierarchies {
        rmdir_tree(&h.join(rel));
    }
}

fn rmdir_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                rmdir_tree(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}
