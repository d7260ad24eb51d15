//! Helpers shared by the benchmark programs.
#![allow(dead_code, clippy::unwrap_used)]

/// The value after `name` on the command line, or `default`.
pub fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The `p` percentile (0..=1) of `v` (sorted in place); NaN when empty.
pub fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    if v.is_empty() {
        return f64::NAN;
    }
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// The ferro-control-plane binary built next to this example, serving on a free loopback
/// port with a fresh data dir; killed (by its pid) when dropped.
pub struct Server {
    pub child: std::process::Child,
    pub client: kube::Client,
    _dir: tempfile::TempDir,
}

impl Server {
    /// Starts it with `args` added (RUST_LOG=warn) and waits until it answers.
    pub async fn start(prefix: &str, args: &[&str]) -> Server {
        Server::start_replica(prefix, args, None, None).await
    }

    /// [`Server::start`] as another replica of `peer` (its CA, keys and token file copied into
    /// the fresh data dir, as docs/operations.md lays out replicas); with `log`, logging at
    /// that level to server.log in the data dir instead of warnings to stderr.
    pub async fn start_replica(prefix: &str, args: &[&str], peer: Option<&Server>, log: Option<&str>) -> Server {
        let exe = std::env::current_exe().unwrap();
        let bin = exe.parent().unwrap().parent().unwrap().join("ferro-control-plane");
        let dir = tempfile::Builder::new().prefix(prefix).tempdir().unwrap();
        if let Some(peer) = peer {
            for f in ["ca.crt", "ca.key", "tokens.csv", "sa.key"] {
                std::fs::copy(peer._dir.path().join(f), dir.path().join(f)).unwrap();
            }
        }
        let stderr = match log {
            Some(_) => std::process::Stdio::from(std::fs::File::create(dir.path().join("server.log")).unwrap()),
            None => std::process::Stdio::inherit(),
        };
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = std::process::Command::new(&bin)
            .args(["--data-dir", dir.path().to_str().unwrap(), "--bind-address", "127.0.0.1"])
            .args(["--secure-port", &port.to_string()])
            .args(args)
            .env("RUST_LOG", log.unwrap_or("warn"))
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
        let kc = dir.path().join("admin.kubeconfig");
        while !(kc.exists() && std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()) {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let cfg = kube::Config::from_custom_kubeconfig(kube::config::Kubeconfig::read_from(&kc).unwrap(), &Default::default())
            .await
            .unwrap();
        let client = kube::Client::try_from(cfg).unwrap();
        Server { child, client, _dir: dir }
    }

    /// What it logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("server.log")).unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An etcd cluster of Debian's etcd-server on loopback (data in /dev/shm when there is one,
/// as the tests run it); every member killed (by pid) and its data removed when dropped.
pub struct EtcdCluster {
    children: Vec<std::process::Child>,
    pub urls: Vec<String>,
    _dir: tempfile::TempDir,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl EtcdCluster {
    pub fn start(n: usize) -> EtcdCluster {
        let shm = std::path::Path::new("/dev/shm");
        let mut b = tempfile::Builder::new();
        b.prefix("ferro-bench-etcd");
        let dir = if shm.is_dir() { b.tempdir_in(shm) } else { b.tempdir() }.unwrap();
        let ports: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
        let cluster: Vec<String> = ports.iter().enumerate().map(|(i, (_, p))| format!("m{i}=http://127.0.0.1:{p}")).collect();
        let mut children = Vec::new();
        let mut urls = Vec::new();
        for (i, (c, p)) in ports.iter().enumerate() {
            let url = format!("http://127.0.0.1:{c}");
            let child = std::process::Command::new("etcd")
                .args(["--name", &format!("m{i}"), "--data-dir"])
                .arg(dir.path().join(format!("m{i}")))
                .args(["--listen-client-urls", &url, "--advertise-client-urls", &url])
                .args(["--listen-peer-urls", &format!("http://127.0.0.1:{p}"), "--initial-advertise-peer-urls", &format!("http://127.0.0.1:{p}")])
                .args(["--initial-cluster", &cluster.join(","), "--initial-cluster-state", "new", "--initial-cluster-token", "ferro-bench"])
                .args(["--logger", "zap", "--log-outputs", "stderr", "--log-level", "error"])
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("etcd (Debian's etcd-server) must be installed");
            children.push(child);
            urls.push(url);
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        for u in &urls {
            while !std::process::Command::new("etcdctl").args(["--endpoints", u, "endpoint", "health"]).env("ETCDCTL_API", "3").output().map(|o| o.status.success()).unwrap_or(false) {
                assert!(std::time::Instant::now() < deadline, "etcd at {u} did not become healthy");
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        }
        EtcdCluster { children, urls, _dir: dir }
    }
}

impl EtcdCluster {
    /// The members' process ids (for CPU accounting).
    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().map(|c| c.id()).collect()
    }
}

/// CPU time (user + system) a process has used so far, in seconds ("self" for this one).
pub fn cpu_secs(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // fields after the command name in parentheses: utime and stime are the 14th and 15th
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    static HZ: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    let hz = *HZ.get_or_init(|| {
        let out = std::process::Command::new("getconf").arg("CLK_TCK").output().expect("getconf");
        String::from_utf8_lossy(&out.stdout).trim().parse().expect("CLK_TCK")
    });
    (ticks(11) + ticks(12)) / hz
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
