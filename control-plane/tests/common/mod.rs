//! A running ferro-control-plane binary on loopback, with kubectl and kube-rs clients.
//!
//! With `FERRO_TEST_STORE=etcd` every server keeps its objects in an etcd of its own (started
//! on loopback by [`etcd::Etcd`], removed with the server) instead of the embedded store: the
//! same tests then run against the etcd backend (scripts/test.sh runs that pass).
#![allow(dead_code, clippy::unwrap_used)]

pub mod etcd;
pub mod fake;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub struct Server {
    pub dir: tempfile::TempDir,
    pub port: u16,
    extra_args: Vec<String>,
    child: Option<Child>,
    /// The etcd this server stores into (`FERRO_TEST_STORE=etcd`); dropped after the server.
    pub etcd: Option<etcd::Etcd>,
}

/// The backend the tests run against: `FERRO_TEST_STORE` = `embedded` (the default) or `etcd`.
pub fn etcd_backend() -> bool {
    match std::env::var("FERRO_TEST_STORE").as_deref() {
        Ok("etcd") => true,
        Ok("embedded") | Ok("") | Err(_) => false,
        Ok(other) => panic!("FERRO_TEST_STORE={other}: expected embedded or etcd"),
    }
}

/// What replicas share of the data dir (docs/operations.md).
pub const SHARED_FILES: &[&str] = &["ca.crt", "ca.key", "tokens.csv", "sa.key"];

/// Leader election timings of test servers on etcd: a server restarted by a test waits for the
/// lease of its previous (killed) process to expire, so these are short.
pub const FAST_ELECTION: &[&str] = &[
    "--leader-elect-lease-duration",
    "4s",
    "--leader-elect-renew-deadline",
    "3s",
    "--leader-elect-retry-period",
    "500ms",
];

use ferro_lab::listens;

/// A port on 127.0.0.1 nothing listens on now, chosen outside the kernel's ephemeral range
/// (`net.ipv4.ip_local_port_range`): a port asked of the kernel with bind(0) comes from that
/// range, which every outgoing connection's local port also comes from, so a server (or etcd
/// member) killed and started again on its port could find it taken by any client's
/// connection in between. Below the range only a listener chosen the same way can collide, and
/// the fixtures choose again when their first bind fails.
pub fn free_port() -> u16 {
    use std::hash::{BuildHasher as _, Hasher as _};
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|l| l.parse::<u16>().ok()))
        .unwrap_or(32768);
    // 10000.. below the range (when the range leaves room): no well-known service there
    let (from, to) = if low > 12000 { (10000u16, low) } else { (0, 0) };
    for _ in 0..1000 {
        if to == 0 {
            break;
        }
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(N.fetch_add(1, Ordering::Relaxed));
        h.write_u32(std::process::id());
        let port = from + (h.finish() % u64::from(to - from)) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl Server {
    pub fn start() -> Server {
        Server::start_with(&[])
    }

    /// Starts with extra command-line flags.
    pub fn start_with(args: &[&str]) -> Server {
        let dir = tempfile::Builder::new().prefix("ferro-cp-test").tempdir().unwrap();
        let extra_args = args.iter().map(|a| a.to_string()).collect();
        let etcd = etcd_backend().then(etcd::Etcd::start);
        let mut s = Server { dir, port: free_port(), extra_args, child: None, etcd };
        s.first_spawn();
        s
    }

    /// One of several replicas on a shared etcd (the etcd is the caller's). `peer`: a replica
    /// started before, whose CA and token file this one copies into its data dir before its
    /// first start, as docs/operations.md has operators do.
    pub fn replica(etcd: &etcd::Etcd, peer: Option<&Server>, args: &[&str]) -> Server {
        Server::replica_with(etcd.flags(), peer, args)
    }

    /// [`Server::replica`] with the etcd flags given (e.g. an [`etcd::EtcdCluster`]'s).
    pub fn replica_with(etcd_flags: Vec<String>, peer: Option<&Server>, args: &[&str]) -> Server {
        let dir = tempfile::Builder::new().prefix("ferro-cp-test").tempdir().unwrap();
        if let Some(peer) = peer {
            for f in SHARED_FILES {
                std::fs::copy(peer.data_dir().join(f), dir.path().join(f)).unwrap();
            }
        }
        let mut extra_args: Vec<String> = etcd_flags;
        extra_args.extend(args.iter().map(|a| a.to_string()));
        let mut s = Server { dir, port: free_port(), extra_args, child: None, etcd: None };
        s.first_spawn();
        s
    }

    pub fn data_dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("admin.kubeconfig")
    }

    /// Starts the binary (again) on the same data dir and port, waiting until it serves.
    pub fn spawn(&mut self) {
        if let Err(e) = self.try_spawn() {
            panic!("{e}");
        }
    }

    /// The first start: a port `free_port` handed out may be taken by another test's server
    /// before this one binds it; then again on another port (admin.kubeconfig is rewritten
    /// at every start).
    fn first_spawn(&mut self) {
        for _ in 0..5 {
            match self.try_spawn() {
                Ok(()) => return,
                Err(e) if e.contains("in use") => self.port = free_port(),
                Err(e) => panic!("{e}"),
            }
        }
        panic!("no free port in 5 attempts: {}", self.log());
    }

    fn try_spawn(&mut self) -> Result<(), String> {
        let logged = self.log().len();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("server.log"))
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_ferro-control-plane"))
            .args(["--data-dir", self.dir.path().to_str().unwrap()])
            .args(["--bind-address", "127.0.0.1", "--secure-port", &self.port.to_string()])
            .args(["--service-node-port-range", "30000-30100", "--watch-history", "500"])
            .args(self.etcd.iter().flat_map(|e| e.flags()))
            .args(self.etcd.iter().flat_map(|_| FAST_ELECTION))
            .args(&self.extra_args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let pid = child.id();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            // this process's listener, not whichever server took the port
            if self.kubeconfig().exists() && listens(pid, self.port) {
                return Ok(());
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                self.child = None;
                let log = self.log();
                return Err(format!("server exited with {status}: {}", log.get(logged..).unwrap_or(&log)));
            }
            assert!(Instant::now() < deadline, "server did not start: {}", self.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// SIGKILL, as a crash.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, as systemd stops a unit; waits for the exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().expect("the server is running");
        let sent = Command::new("kill").args(["-TERM", &c.id().to_string()]).status().unwrap();
        assert!(sent.success());
        c.wait().unwrap()
    }

    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_stdin(args, None)
    }

    pub fn kubectl_stdin(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut cmd = Command::new("kubectl");
        cmd.arg("--kubeconfig").arg(self.kubeconfig()).args(args);
        cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("kubectl must be installed");
        if let Some(input) = stdin {
            use std::io::Write as _;
            child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        }
        child.wait_with_output().unwrap()
    }

    /// kubectl that must succeed; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// `kubectl wait --for=<condition> <kind>/<name>` in the default namespace; when it times
    /// out, the panic shows what would explain it: the object, the pods, what the controller
    /// loop `explain` would do for it (/debug/controllers), and the end of the server's log.
    pub fn wait_explained(&self, condition: &str, object: &str, explain: &str, timeout: &str) {
        let out = self.kubectl(&["wait", &format!("--for={condition}"), object, &format!("--timeout={timeout}")]);
        if out.status.success() {
            return;
        }
        let show = |args: &[&str]| {
            let o = self.kubectl(args);
            format!("$ kubectl {}\n{}{}", args.join(" "), String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
        };
        let name = object.rsplit('/').next().unwrap_or(object);
        let raw = format!("/debug/controllers/{explain}/default/{name}?format=text");
        let log = self.log();
        let tail: Vec<&str> = log.lines().rev().take(80).collect::<Vec<_>>().into_iter().rev().collect();
        panic!(
            "kubectl wait --for={condition} {object} failed: {}\n{}\n{}\n{}\n--- server log (tail) ---\n{}",
            String::from_utf8_lossy(&out.stderr),
            show(&["get", object, "-o", "yaml"]),
            show(&["get", "pods", "-o", "custom-columns=NAME:.metadata.name,PHASE:.status.phase,NODE:.spec.nodeName,FINALIZERS:.metadata.finalizers,DELETING:.metadata.deletionTimestamp,CREATED:.metadata.creationTimestamp"]),
            show(&["get", "--raw", &raw]),
            tail.join("\n")
        );
    }

    pub fn apply(&self, yaml: &str) -> String {
        let out = self.kubectl_stdin(&["apply", "-f", "-"], Some(yaml));
        assert!(out.status.success(), "apply failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }

    /// A kubeconfig with a client certificate for `user` in `groups`.
    pub fn cert_kubeconfig(&self, user: &str, groups: &[&str]) -> PathBuf {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferro-control-plane"));
        cmd.args(["kubeconfig", "--data-dir", self.dir.path().to_str().unwrap(), "--user", user]);
        cmd.args(["--server", &format!("https://127.0.0.1:{}", self.port)]);
        for g in groups {
            cmd.args(["--group", g]);
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let path = self.dir.path().join(format!("{}.kubeconfig", user.replace(':', "_")));
        std::fs::write(&path, out.stdout).unwrap();
        path
    }

    pub async fn client(&self) -> kube::Client {
        client_for(&self.kubeconfig()).await
    }

    /// Waits for the serviceaccount loop's `default` ServiceAccount in `namespace`: pods there
    /// are refused until it exists (ServiceAccount admission, as upstream's), and the loops
    /// start only once this server leads (on etcd, after a leader election).
    pub async fn default_service_account(&self, namespace: &str) {
        let sas: kube::Api<k8s_openapi::api::core::v1::ServiceAccount> = kube::Api::namespaced(self.client().await, namespace);
        let last_error = std::sync::Mutex::new(String::new());
        let found = tokio::time::timeout(Duration::from_secs(90), async {
            loop {
                match sas.get_opt("default").await {
                    Ok(Some(sa)) => return sa,
                    Ok(None) => *last_error.lock().unwrap() = "not found".into(),
                    Err(e) => *last_error.lock().unwrap() = e.to_string(),
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
        .await;
        // the server's log says why the serviceaccount loop did not make it
        if found.is_err() {
            let log = self.log();
            let lines: Vec<&str> = log.lines().collect();
            panic!(
                "no default ServiceAccount in {namespace} after 90 s (last answer: {}); the server log's end:\n{}",
                last_error.lock().unwrap(),
                lines[lines.len().saturating_sub(150)..].join("\n")
            );
        }
    }

    /// A client that returns a 429 at once (kube's default layer retries 429s for minutes).
    pub async fn client_without_retries(&self) -> kube::Client {
        let kc = kube::config::Kubeconfig::read_from(self.kubeconfig()).unwrap();
        let mut cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.unwrap();
        cfg.default_retry = false;
        kube::Client::try_from(cfg).unwrap()
    }
}

pub async fn client_for(path: &Path) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(path).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.unwrap();
    kube::Client::try_from(cfg).unwrap()
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A TLS connection to the server (verifying its certificate against the cluster CA) and the
/// admin's bearer token, for tests that speak raw HTTP/1.1.
pub async fn raw_tls(s: &Server) -> (tokio_rustls::client::TlsStream<tokio::net::TcpStream>, String) {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, ServerName};
    let ca = std::fs::read(s.data_dir().join("ca.crt")).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(&ca).unwrap()).unwrap();
    let cfg = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", s.port)).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(cfg))
        .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
        .await
        .unwrap();
    let kc = std::fs::read_to_string(s.kubeconfig()).unwrap();
    let token = kc.lines().find_map(|l| l.trim().strip_prefix("token: ")).unwrap().to_string();
    (tls, token)
}

/// Reads an HTTP/1.1 response head.
pub async fn read_head<R: tokio::io::AsyncRead + Unpin>(r: &mut R) -> String {
    use tokio::io::AsyncReadExt as _;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        r.read_exact(&mut byte).await.unwrap();
        head.push(byte[0]);
    }
    String::from_utf8(head).unwrap()
}
