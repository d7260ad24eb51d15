//! A one-node cluster in a network namespace for the agent's lab tests: ferro-control-plane
//! (scheduler and controllers included) on 127.0.0.1 inside the namespace, a private
//! containerd 1.6 (ferro-lab fixture) with ferro-cni as its CNI plugin, the offline busybox
//! and pause images imported, and ferro-agent running inside containerd's network and mount
//! namespaces (entered with nsenter, so tmpfs volumes the agent mounts are the ones runc sees).
//! kubectl runs inside the namespace with the admin kubeconfig.
//!
//! Drop stops the agent, containerd (with its containers), the control plane, removes the
//! pod cgroups under the lab's own cgroup root, the namespace and the temp dirs.
#![allow(dead_code, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use ferro_lab::containerd::{Containerd, Options};
use ferro_lab::netns::NetNs;

pub const SUBNET: &str = "10.88.0.0/24";
pub const NODE: &str = "lab-node";
pub const BUSYBOX: &str = ferro_lab::images::BUSYBOX_IMAGE;
pub const API_PORT: u16 = 6443;
/// The API server's address for pods: on the lab namespace's `lo` (the node's own address, as
/// a real node's would be on its NIC), served and advertised by the control plane, so the
/// `kubernetes` Service's endpoints name it and a pod's request to the Service's ClusterIP,
/// DNATed by ferro-proxy in the node's namespace, arrives (127.0.0.1 would not: it is the
/// pod's own loopback, and the node drops a DNAT to it from another interface).
pub const API_ADDRESS: &str = "10.87.0.1";
/// The lab's agent root dir is on the test machine's disk, which can be more than 99% full
/// while a fresh clone builds next to other trees (upstream's default nodefs.available<10%, or
/// even 1%, would taint the node with disk-pressure and nothing would schedule: a CI run failed
/// so). The disk signals are off (`0%`, as upstream's) unless a test sets its own thresholds;
/// the eviction tests do, on filesystems of their own.
pub const EVICTION: &str = "evictionHard:\n  memory.available: 100Mi\n  nodefs.available: 0%\n  nodefs.inodesFree: 0%\n";
/// The KubeletConfiguration line that turns image GC off (upstream: high threshold 100).
pub const NO_IMAGE_GC: &str = "imageGCHighThresholdPercent: 100\n";

/// `text` without ANSI colour sequences (the agent's log is coloured).
pub fn plain(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The ferro-agent binary: cargo's for tests; next to the examples dir for the benchmark.
pub fn agent_bin() -> PathBuf {
    match option_env!("CARGO_BIN_EXE_ferro-agent") {
        Some(p) => PathBuf::from(p),
        None => std::env::current_exe().unwrap().parent().unwrap().parent().unwrap().join("ferro-agent"),
    }
}

/// A binary built next to ferro-agent (`cargo build --workspace --all-targets`).
pub fn sibling_bin(name: &str) -> PathBuf {
    let agent = agent_bin();
    let bin = agent.parent().unwrap().join(name);
    assert!(
        bin.exists(),
        "{} is missing: build the workspace first (cargo build --workspace --all-targets, as scripts/test.sh does)",
        bin.display()
    );
    bin
}

/// A free port in the current thread's network namespace.
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// ferro-control-plane, built next to ferro-agent.
pub fn control_plane_bin() -> PathBuf {
    sibling_bin("ferro-control-plane")
}

/// Deletes the network namespaces named `<prefix><pid>` whose process is gone.
fn remove_dead_leftovers(prefix: &str) {
    let Ok(entries) = std::fs::read_dir("/run/netns") else { return };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix(prefix).and_then(|p| p.parse::<u32>().ok()) else { continue };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = Command::new("ip").args(["netns", "del", &name]).output();
        }
    }
}

/// A child process killed (by its pid) when dropped.
pub struct Proc(pub Option<Child>);

impl Proc {
    pub fn kill(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.0.as_ref().map(Child::id)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The offline test images, built under `work` (removed with the lab's temp dir).
/// The lab's two test images: built here (the static pause through cargo, busybox from the
/// host's busybox-static), or taken from `$FERRO_LAB_IMAGES` (the directory `ferro-lab images
/// --out` wrote) where there is no workspace to build in, as for the benchmark inside a VM
/// (vagrant/pod-startup-bench.sh).
fn images(work: &std::path::Path) -> ferro_lab::images::ImageTars {
    if let Some(dir) = std::env::var_os("FERRO_LAB_IMAGES") {
        return ferro_lab::images::ImageTars::prebuilt(std::path::Path::new(&dir)).unwrap();
    }
    let pause = ferro_lab::images::build_static_pause().unwrap();
    ferro_lab::images::build_images(work, &pause).unwrap()
}

pub struct Lab {
    // Drop order: agent, containerd, control plane, namespace, dirs.
    pub agent: Proc,
    pub ctrd: Containerd,
    pub cp: Proc,
    pub ns: NetNs,
    pub dir: tempfile::TempDir,
    pub cgroup_root: String,
    pub agent_logs: u32,
    /// The agent's RUST_LOG.
    pub agent_rust_log: &'static str,
    /// The agent's --root-dir from the next [`Lab::start_agent`] (default `<dir>/agent`).
    pub agent_root: Option<PathBuf>,
    /// Extra flags for ferro-agent, used from the next [`Lab::start_agent`].
    pub agent_args: Vec<String>,
}

impl Lab {
    /// Everything up, the node Ready. `tag` names the namespace (unique per test).
    ///
    /// Image GC is off ([`NO_IMAGE_GC`]): the lab's images are imported offline and cannot be
    /// pulled again, and on a host whose disk is over the default 85% the agent would remove
    /// busybox between pods.
    /// Waits until containerd has no container left, then checks that no pod address is still
    /// reserved in ferro-cni's IPAM dir.
    pub fn wait_nothing_left(&self) {
        self.wait("the sandboxes to be removed", Duration::from_secs(60), |l| {
            let out = l.ctrd.ctr(&["containers", "ls", "-q"]).unwrap();
            out.trim().is_empty().then_some(())
        });
        let ipam = std::fs::read_dir(self.dir.path().join("ipam/ferro-lab")).unwrap();
        let leaked: Vec<String> = ipam
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("10."))
            .collect();
        assert!(leaked.is_empty(), "addresses still allocated: {leaked:?}");
    }

    pub fn start(tag: &str) -> Lab {
        Self::start_with(tag, NO_IMAGE_GC)
    }

    /// As [`Lab::start`], with `extra_config` (YAML lines) appended to the agent's
    /// KubeletConfiguration.
    pub fn start_with(tag: &str, extra_config: &str) -> Lab {
        Self::start_full(tag, extra_config, None)
    }

    /// As [`Lab::start_with`], with containerd's runc shim running `runtime_binary` (e.g.
    /// crun) instead of runc.
    pub fn start_full(tag: &str, extra_config: &str, runtime_binary: Option<PathBuf>) -> Lab {
        Self::start_on(tag, extra_config, runtime_binary, None)
    }

    /// As [`Lab::start_full`], with containerd's root (the image filesystem) on an ext4 of
    /// `root_fs_bytes` of its own when given, so that its usage does not depend on the host's
    /// disk.
    pub fn start_on(tag: &str, extra_config: &str, runtime_binary: Option<PathBuf>, root_fs_bytes: Option<u64>) -> Lab {
        Self::start_logging(tag, extra_config, runtime_binary, root_fs_bytes, "info,ferro_agent=debug")
    }

    /// As [`Lab::start_on`], with the agent's RUST_LOG `agent_log` (the tests' labs log the
    /// agent at debug; installed, it logs at info: the systemd unit sets no RUST_LOG).
    pub fn start_logging(
        tag: &str,
        extra_config: &str,
        runtime_binary: Option<PathBuf>,
        root_fs_bytes: Option<u64>,
        agent_log: &'static str,
    ) -> Lab {
        ferro_lab::require_root().unwrap();
        ferro_lab::require_bin("nsenter", "util-linux").unwrap();
        ferro_lab::require_bin("kubectl", "kubernetes-client").unwrap();
        let dir = tempfile::Builder::new().prefix(&format!("ferro-agent-lab-{tag}-")).tempdir().unwrap();
        let d = dir.path();
        for sub in ["cp", "agent", "logs", "manifests", "ipam", "host", "images"] {
            std::fs::create_dir_all(d.join(sub)).unwrap();
        }
        let tars = images(&d.join("images"));
        // The pid keeps concurrent runs (two checkouts testing at once) out of each other's
        // namespace; leftovers of runs that died are removed by their dead pid.
        remove_dead_leftovers(&format!("ferro-al-{tag}-"));
        let ns = NetNs::new(&format!("ferro-al-{tag}-{}", std::process::id())).unwrap();
        ns.ip(&["addr", "add", &format!("{API_ADDRESS}/32"), "dev", "lo"]).unwrap();

        let cp = Proc(None);

        // containerd with ferro-cni.
        let conflist = serde_json::json!({
            "cniVersion": "1.0.0",
            "name": "ferro-lab",
            "plugins": [{
                "type": "ferro", "bridge": "ferro0", "isGateway": true, "ipMasq": false,
                "ipam": {"ranges": [[{"subnet": SUBNET}]], "dataDir": d.join("ipam")},
            }],
        });
        let opts = Options {
            sandbox_image: ferro_lab::images::PAUSE_IMAGE.into(),
            cni_plugins: vec![
                ("ferro".into(), sibling_bin("ferro-cni")),
                ("loopback".into(), "/usr/lib/cni/loopback".into()),
            ],
            cni_configs: vec![("10-ferro.conflist".into(), conflist.to_string())],
            runtime_binary,
            root_fs_bytes,
        };
        let ctrd = Containerd::start(&ns, &opts).unwrap();
        ctrd.import(&tars.pause).unwrap();
        ctrd.import(&tars.busybox).unwrap();

        let cgroup_root = format!("/ferro-lab-{tag}-{}", std::process::id());
        let mut lab = Lab { agent: Proc(None), ctrd, cp, ns, dir, cgroup_root, agent_logs: 0, agent_rust_log: agent_log, agent_args: Vec::new(), agent_root: None };
        lab.start_cp();
        let kubeconfig = lab.node_kubeconfig();
        lab.write_agent_config(extra_config);
        let _ = kubeconfig;
        lab.start_agent();
        lab.wait("the node to be Ready", Duration::from_secs(60), |l| {
            let out = l.kubectl(&["get", "node", NODE, "-o", "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}"]);
            (String::from_utf8_lossy(&out.stdout) == "True").then_some(())
        });
        lab
    }

    /// (Re)writes the agent's KubeletConfiguration: the lab's settings plus `extra_config`
    /// (YAML lines); a restarted agent ([`Lab::start_agent`]) reads it.
    pub fn write_agent_config(&self, extra_config: &str) {
        std::fs::write(
            self.dir.path().join("agent.yaml"),
            format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\npodCIDR: {SUBNET}\npodLogsDir: {}\nstaticPodPath: {}\nvolumeStatsAggPeriod: 2s\n{}{extra_config}",
                self.dir.path().join("logs").display(),
                self.dir.path().join("manifests").display(),
                // The lab's thresholds unless the extra lines set their own.
                if extra_config.contains("evictionHard:") { "" } else { EVICTION }
            ),
        )
        .unwrap();
    }

    /// Starts ferro-control-plane (again, on the same data dir) and waits until it serves.
    pub fn start_cp(&mut self) {
        let d = self.dir.path();
        let cp_log = std::fs::OpenOptions::new().create(true).append(true).open(d.join("cp.log")).unwrap();
        let cp = self
            .ns
            .command(sibling_bin("ferro-control-plane").to_str().unwrap())
            .arg("--data-dir")
            .arg(d.join("cp"))
            .args(["--bind-address", "127.0.0.1", "--bind-address", API_ADDRESS, "--advertise-address", API_ADDRESS])
            .args(["--secure-port", &API_PORT.to_string()])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(cp_log)
            .spawn()
            .unwrap();
        self.cp = Proc(Some(cp));
        self.wait_api();
    }

    fn wait_api(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if self.admin_kubeconfig().exists() {
                let out = self.kubectl(&["get", "--raw", "/healthz"]);
                if out.status.success() {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "control plane did not start: {}", self.cp_log());
            ferro_lab::interrupt::sleep(Duration::from_millis(100));
        }
    }

    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.dir.path().join("cp/admin.kubeconfig")
    }

    pub fn node_kubeconfig(&self) -> PathBuf {
        self.kubeconfig_for("node.kubeconfig", &format!("system:node:{NODE}"), &["system:nodes"])
    }

    /// ferro-csi's own identity (user system:ferro-csi, bound to the ClusterRole of the same
    /// name), as install.sh gives it.
    pub fn csi_kubeconfig(&self) -> PathBuf {
        self.kubeconfig_for("csi.kubeconfig", "system:ferro-csi", &[])
    }

    /// A kubeconfig `file` (in the lab's dir, made once) with a client certificate for `user`
    /// in `groups`, signed by the control plane's CA (`ferro-control-plane kubeconfig`).
    fn kubeconfig_for(&self, file: &str, user: &str, groups: &[&str]) -> PathBuf {
        let path = self.dir.path().join(file);
        if path.exists() {
            return path;
        }
        let mut cmd = Command::new(sibling_bin("ferro-control-plane"));
        cmd.args(["kubeconfig", "--data-dir", self.dir.path().join("cp").to_str().unwrap()]).args(["--user", user]);
        for g in groups {
            cmd.args(["--group", g]);
        }
        let out = cmd.args(["--server", &format!("https://127.0.0.1:{API_PORT}")]).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        std::fs::write(&path, out.stdout).unwrap();
        path
    }

    /// The API server refused ferro-csi nothing (csi.log): its ClusterRole covers what it does.
    pub fn assert_csi_refused_nothing(&self) {
        let text = std::fs::read_to_string(self.dir.path().join("csi.log")).unwrap_or_default();
        let refused: Vec<&str> = text.lines().filter(|l| l.to_lowercase().contains("forbidden")).collect();
        assert!(refused.is_empty(), "ferro-csi was refused requests:\n{}", refused.join("\n"));
    }

    /// Starts ferro-agent (again) in containerd's network and mount namespaces.
    pub fn start_agent(&mut self) {
        self.agent_logs += 1;
        let log = std::fs::File::create(self.dir.path().join(format!("agent{}.log", self.agent_logs))).unwrap();
        let pid = self.ctrd.pid().unwrap().to_string();
        let child = Command::new("nsenter")
            .args(["--target", &pid, "--net", "--mount", "--"])
            .arg(agent_bin())
            .arg("--kubeconfig")
            .arg(self.node_kubeconfig())
            .args(["--hostname-override", NODE, "--node-ip", "127.0.0.1"])
            .arg("--root-dir")
            .arg(self.agent_root.clone().unwrap_or_else(|| self.dir.path().join("agent")))
            .arg("--container-runtime-endpoint")
            .arg(format!("unix://{}", self.ctrd.socket().display()))
            .arg("--config")
            .arg(self.dir.path().join("agent.yaml"))
            .args(["--cgroup-root", &self.cgroup_root])
            .args(&self.agent_args)
            .env("RUST_LOG", self.agent_rust_log)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.agent = Proc(Some(child));
    }

    /// The agent's /metrics (:10250, with the control plane's kubelet-client certificate).
    pub fn agent_metrics(&self) -> String {
        let cp = self.dir.path().join("cp");
        let out = self
            .ns
            .command("curl")
            .args(["-sk", "--max-time", "10", "--cert"])
            .arg(cp.join("kubelet-client.crt"))
            .arg("--key")
            .arg(cp.join("kubelet-client.key"))
            .arg("https://127.0.0.1:10250/metrics")
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The API server's apiserver_request_total summed by "<verb> <resource>[/<subresource>]"
    /// (every client, every code).
    pub fn api_requests(&self) -> std::collections::BTreeMap<String, f64> {
        let out = self.kubectl(&["get", "--raw", "/metrics"]);
        assert!(out.status.success(), "reading the API's metrics: {}", String::from_utf8_lossy(&out.stderr));
        let mut counts = std::collections::BTreeMap::new();
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let Some(rest) = line.strip_prefix("apiserver_request_total{") else { continue };
            let Some((labels, value)) = rest.rsplit_once("} ") else { continue };
            let label = |name: &str| {
                labels
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(&format!("{name}=\"")))
                    .map(|v| v.trim_end_matches('"').to_string())
                    .unwrap_or_default()
            };
            let sub = label("subresource");
            let key = format!("{} {}{}", label("verb"), label("resource"), if sub.is_empty() { String::new() } else { format!("/{sub}") });
            *counts.entry(key).or_default() += value.trim().parse::<f64>().unwrap_or(0.0);
        }
        counts
    }

    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.ns
            .command("kubectl")
            .arg("--kubeconfig")
            .arg(self.admin_kubeconfig())
            .args(args)
            .output()
            .unwrap()
    }

    /// kubectl with `input` on its stdin.
    pub fn kubectl_stdin(&self, args: &[&str], input: &str) -> Output {
        use std::io::Write as _;
        let mut child = self
            .ns
            .command("kubectl")
            .arg("--kubeconfig")
            .arg(self.admin_kubeconfig())
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        child.wait_with_output().unwrap()
    }

    /// kubectl that must succeed; its stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(out.status.success(), "kubectl {args:?} failed: {}\n{}", String::from_utf8_lossy(&out.stderr), self.logs());
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// kubectl apply -f - with `manifest` (YAML or JSON).
    pub fn apply(&self, manifest: &str) {
        use std::io::Write as _;
        let mut child = self
            .ns
            .command("kubectl")
            .arg("--kubeconfig")
            .arg(self.admin_kubeconfig())
            .args(["apply", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(manifest.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "kubectl apply failed: {}\n{manifest}", String::from_utf8_lossy(&out.stderr));
    }

    /// The pod as JSON (None when it does not exist).
    pub fn pod(&self, name: &str) -> Option<serde_json::Value> {
        let out = self.kubectl(&["get", "pod", name, "-o", "json"]);
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    /// Polls `f` every 250 ms until it returns Some, failing with the logs after `limit`.
    pub fn wait<T>(&self, what: &str, limit: Duration, mut f: impl FnMut(&Lab) -> Option<T>) -> T {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(v) = f(self) {
                return v;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}\n{}", self.logs());
            ferro_lab::interrupt::sleep(Duration::from_millis(250));
        }
    }

    /// Waits until the pod's JSON satisfies `f`.
    pub fn wait_pod(&self, name: &str, what: &str, limit: Duration, f: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
        self.wait(&format!("pod {name}: {what}"), limit, |l| l.pod(name).filter(|p| f(p)))
    }

    pub fn agent_log(&self) -> String {
        (1..=self.agent_logs)
            .map(|i| std::fs::read_to_string(self.dir.path().join(format!("agent{i}.log"))).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n--- agent restarted ---\n")
    }

    pub fn cp_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("cp.log")).unwrap_or_default()
    }

    fn tail(s: &str, n: usize) -> String {
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    pub fn logs(&self) -> String {
        let state = self.kubectl(&["get", "nodes,pods,events", "-A", "-o", "wide"]);
        // Panics and errors anywhere in the control plane's and the agent's logs (a tail can
        // miss them: a backtrace alone is longer than the tail).
        let notable = |log: &str| {
            let lines: Vec<&str> = log.lines().collect();
            let mut out = Vec::new();
            for (i, l) in lines.iter().enumerate() {
                if l.contains("panicked at") || l.contains(" ERROR ") || l.contains("ERROR\u{1b}") {
                    out.extend(lines[i..(i + 2).min(lines.len())].iter().copied());
                }
            }
            out.truncate(60);
            out.join("\n")
        };
        format!(
            "--- kubectl get nodes,pods,events ---\n{}{}\n--- agent log (tail) ---\n{}\n--- containerd log (tail) ---\n{}\n--- control plane log (tail) ---\n{}\n--- panics and errors (control plane, agent) ---\n{}\n{}",
            String::from_utf8_lossy(&state.stdout),
            String::from_utf8_lossy(&state.stderr),
            Self::tail(&self.agent_log(), 120),
            Self::tail(&self.ctrd.log(), 40),
            Self::tail(&self.cp_log(), 30),
            notable(&self.cp_log()),
            notable(&self.agent_log())
        )
    }

    /// Starts ferro-csi (driver, provisioner, registration with the agent) in containerd's
    /// network and mount namespaces, as the agent runs, so the volumes it mounts are the ones
    /// runc sees; its data dir is `data`, its log `<lab dir>/csi.log` (appended).
    pub fn start_csi(&self, data: &Path, pool: &str) -> Proc {
        let pid = self.ctrd.pid().unwrap().to_string();
        let agent_root = self.dir.path().join("agent");
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.path().join("csi.log")).unwrap();
        Proc(Some(
            Command::new("nsenter")
                .args(["--target", &pid, "--net", "--mount", "--"])
                .arg(sibling_bin("ferro-csi"))
                .args(["--node-id", NODE, "--pool-size", pool])
                .arg("--data-dir")
                .arg(data)
                .arg("--endpoint")
                .arg(format!("unix://{}", data.join("csi.sock").display()))
                .arg("--registration-dir")
                .arg(agent_root.join("plugins_registry"))
                .arg("--allowed-path")
                .arg(&agent_root)
                .arg("--kubeconfig")
                .arg(self.csi_kubeconfig())
                .env("RUST_LOG", "info")
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap(),
        ))
    }

    /// Waits until the agent has registered ferro-csi in the node's CSINode.
    pub fn wait_csi_registered(&self) {
        self.wait("ferro-csi registered in CSINode", Duration::from_secs(60), |l| {
            let out = l.kubectl(&["get", "csinode", NODE, "-o", "jsonpath={.spec.drivers[*].name}"]);
            (String::from_utf8_lossy(&out.stdout) == "loop.csi.ferro.dev").then_some(())
        });
    }

    /// ferro-proxy (the node's kube-proxy) in the lab namespace in `mode` (iptables or
    /// nftables), with the node's credentials; its log is `<lab dir>/proxy.log` (appended).
    /// Returns once its first sync is done (/healthz).
    pub fn start_proxy(&self, mode: &str) -> Proc {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.path().join("proxy.log")).unwrap();
        let child = self
            .ns
            .command(sibling_bin("ferro-proxy").to_str().unwrap())
            .arg("--kubeconfig")
            .arg(self.node_kubeconfig())
            .args(["--hostname-override", NODE, "--proxy-mode", mode, "--cluster-cidr", "10.88.0.0/16"])
            // Pod-to-Service traffic whose endpoint is on the same bridge comes back through the
            // node only when it is masqueraded (no br_netfilter here): upstream's flag for that.
            .arg("--masquerade-all")
            .args(["--healthz-bind-address", "127.0.0.1:10256", "--metrics-bind-address", "127.0.0.1:10249"])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let p = Proc(Some(child));
        self.wait("ferro-proxy's first sync", Duration::from_secs(60), |l| {
            let out = l.ns.command("curl").args(["-s", "--max-time", "2", "http://127.0.0.1:10256/healthz"]).output().ok()?;
            // /healthz answers (503, then 200) before the first sync; lastUpdated stays at Go's
            // zero time until the rules reached the kernel
            let body = String::from_utf8_lossy(&out.stdout);
            (body.contains("\"lastUpdated\"") && !body.contains("0001-01-01")).then_some(())
        });
        p
    }

    /// ferro-proxy's log.
    pub fn proxy_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("proxy.log")).unwrap_or_default()
    }

    /// Makes the demo operator's image from its static binary `bin`
    /// ([`ferro_lab::images::build_static_demo_operator`]) and imports it into the node's
    /// containerd as [`ferro_lab::images::DEMO_OPERATOR_IMAGE`].
    pub fn import_demo_operator(&self, bin: &Path) {
        let work = self.dir.path().join("images");
        let tar = ferro_lab::images::demo_operator_image(&work, bin).unwrap();
        self.ctrd.import(&tar).unwrap();
    }

    /// A host directory pods can mount with hostPath to hand results back.
    pub fn host_dir(&self) -> PathBuf {
        self.dir.path().join("host")
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.agent.kill();
        self.ctrd.stop();
        self.cp.kill();
        // The pod cgroups runc left empty under this lab's own cgroup root.
        let rel = self.cgroup_root.trim_start_matches('/');
        let mut hierarchies = vec![PathBuf::from("/sys/fs/cgroup")];
        if let Ok(entries) = std::fs::read_dir("/sys/fs/cgroup") {
            hierarchies.extend(entries.flatten().map(|e| e.path()));
        }
        for h in hierarchies {
            let root = h.join(rel);
            if !rel.is_empty() && root.is_dir() {
                ferro_agent::pod::exec::remove_cgroup_tree(&root);
            }
        }
    }
}
