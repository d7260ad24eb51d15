//! A real etcd (Debian's etcd-server) for one test: on 127.0.0.1 with free ports, its data in a
//! temporary directory, healthy before it is handed out (its health polled with etcdctl, no
//! fixed sleep). Drop kills exactly the process this fixture started and removes the
//! directory, also when the test fails.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Certificates of an etcd with mutual TLS, all signed by one CA.
pub struct EtcdTls {
    pub ca: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
}

pub struct Etcd {
    dir: tempfile::TempDir,
    pub client_port: u16,
    peer_port: u16,
    pub tls: Option<EtcdTls>,
    child: Option<Child>,
}

use super::free_port;

fn require_etcd() {
    for bin in ["etcd", "etcdctl"] {
        let found = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join(bin).is_file()))
            .unwrap_or(false);
        assert!(
            found,
            "{bin} is not installed: the etcd tests need Debian's etcd-server and etcd-client \
             (scripts/test.sh installs them; or apt-get install etcd-server etcd-client)"
        );
    }
}

impl Etcd {
    /// A plain-http etcd.
    pub fn start() -> Etcd {
        Etcd::start_inner(false)
    }

    /// An etcd that requires client certificates (https, --client-cert-auth).
    pub fn start_tls() -> Etcd {
        Etcd::start_inner(true)
    }

    fn start_inner(tls: bool) -> Etcd {
        require_etcd();
        // /dev/shm keeps etcd's fsyncs cheap; the data is thrown away anyway.
        let shm = Path::new("/dev/shm");
        let mut builder = tempfile::Builder::new();
        builder.prefix("ferro-etcd-test");
        let dir = if shm.is_dir() { builder.tempdir_in(shm) } else { builder.tempdir() }.unwrap();
        let tls = tls.then(|| {
            let ca = ferro_control_plane::pki::Ca::load_or_create(dir.path()).unwrap();
            let (server_cert, server_key) = ca.serving(&["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
            let (client_cert, client_key) = ca.client("ferro-control-plane", &[]).unwrap();
            let write = |name: &str, pem: &str| {
                let p = dir.path().join(name);
                std::fs::write(&p, pem).unwrap();
                p
            };
            EtcdTls {
                ca: dir.path().join("ca.crt"),
                server_cert: write("etcd-server.crt", &server_cert),
                server_key: write("etcd-server.key", &server_key),
                client_cert: write("etcd-client.crt", &client_cert),
                client_key: write("etcd-client.key", &client_key),
            }
        });
        let mut etcd = Etcd { dir, client_port: 0, peer_port: 0, tls, child: None };
        // A port taken between choosing it and etcd binding it: choose again.
        for attempt in 0.. {
            etcd.client_port = free_port();
            etcd.peer_port = free_port();
            match etcd.spawn() {
                Ok(()) => break,
                Err(log) if attempt < 3 && log.contains("address already in use") => continue,
                Err(log) => panic!("etcd did not start: {log}"),
            }
        }
        etcd
    }

    /// The member name, unique to this fixture (its directory's name): tells this etcd from
    /// another test's answering on the same port.
    fn name(&self) -> String {
        self.dir.path().file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
    }

    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// Starts etcd (again) on the same ports and data, waiting until it reports healthy;
    /// `Err(log)` when it exits first.
    fn spawn(&mut self) -> Result<(), String> {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.path().join("etcd.log")).unwrap();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let mut cmd = Command::new("etcd");
        let name = self.name();
        cmd.args(["--name", &name, "--data-dir"])
            .arg(self.dir.path().join("data"))
            .args(["--listen-client-urls", &self.url(), "--advertise-client-urls", &self.url()])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("{name}={peer}"), "--initial-cluster-state", "new"])
            .args(["--logger", "zap", "--log-outputs", "stderr", "--log-level", "warn"]);
        if let Some(tls) = &self.tls {
            cmd.arg("--cert-file").arg(&tls.server_cert).arg("--key-file").arg(&tls.server_key);
            cmd.arg("--trusted-ca-file").arg(&tls.ca).arg("--client-cert-auth");
        }
        let child = cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(log).spawn().unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                self.child = None;
                return Err(format!("etcd exited with {status}: {}", self.log()));
            }
            // healthy, and ours: another test's etcd may hold the port ours failed to bind
            if self.etcdctl(&["endpoint", "health"]).status.success() && is_member(&self.etcdctl(&["member", "list"]), &name) {
                return Ok(());
            }
            assert!(Instant::now() < deadline, "etcd did not become healthy: {}", self.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// etcdctl against this etcd (with the client certificate when TLS is on).
    pub fn etcdctl(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new("etcdctl");
        cmd.env("ETCDCTL_API", "3").args(["--endpoints", &self.url(), "--command-timeout=2s"]);
        if let Some(tls) = &self.tls {
            cmd.arg("--cacert").arg(&tls.ca).arg("--cert").arg(&tls.client_cert).arg("--key").arg(&tls.client_key);
        }
        cmd.args(args).stdin(Stdio::null()).output().unwrap()
    }

    /// etcdctl that must succeed; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.etcdctl(args);
        assert!(out.status.success(), "etcdctl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }

    /// SIGKILL to the process this fixture started.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// kill -9, then start again on the same data and ports.
    pub fn restart(&mut self) {
        self.kill9();
        if let Err(log) = self.spawn() {
            panic!("etcd did not restart: {log}");
        }
    }

    /// Flags that point ferro-control-plane at this etcd.
    pub fn flags(&self) -> Vec<String> {
        let mut f = vec!["--etcd-servers".to_string(), self.url()];
        if let Some(tls) = &self.tls {
            for (flag, path) in [("--etcd-cafile", &tls.ca), ("--etcd-certfile", &tls.client_cert), ("--etcd-keyfile", &tls.client_key)] {
                f.push(flag.to_string());
                f.push(path.to_str().unwrap().to_string());
            }
        }
        f
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A 3-member (or n-member) etcd cluster on loopback, plain http: every member with free
/// ports and its own data dir under one temporary directory. Drop kills exactly the members'
/// processes this fixture started and removes the directory.
pub struct EtcdCluster {
    dir: tempfile::TempDir,
    members: Vec<Member>,
}

struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
}

/// Whether `etcdctl member list` (simple format: `id, status, name, peers, clients, ...`)
/// names the member `name`.
fn is_member(out: &Output, name: &str) -> bool {
    out.status.success() && String::from_utf8_lossy(&out.stdout).lines().any(|l| l.split(", ").nth(2) == Some(name))
}

impl Member {
    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    fn peer(&self) -> String {
        format!("http://127.0.0.1:{}", self.peer_port)
    }
}

fn dir_name(dir: &tempfile::TempDir) -> String {
    dir.path().file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

impl EtcdCluster {
    pub fn start(n: usize) -> EtcdCluster {
        require_etcd();
        let shm = Path::new("/dev/shm");
        let mut builder = tempfile::Builder::new();
        builder.prefix("ferro-etcd-cluster-test");
        let dir = if shm.is_dir() { builder.tempdir_in(shm) } else { builder.tempdir() }.unwrap();
        let members = (0..n)
            .map(|i| Member { name: format!("{}-m{i}", dir_name(&dir)), client_port: 0, peer_port: 0, child: None })
            .collect();
        let mut c = EtcdCluster { dir, members };
        // A port taken between choosing it and a member binding it: the whole cluster again
        // on new ports (the members name each other's peer ports).
        for attempt in 0.. {
            for m in &mut c.members {
                (m.client_port, m.peer_port) = (free_port(), free_port());
            }
            for i in 0..n {
                c.spawn(i, "new");
            }
            match c.healthy(None) {
                Ok(()) => break,
                Err(log) if attempt < 3 && log.contains("address already in use") => {
                    for i in 0..n {
                        c.kill9(i);
                        let _ = std::fs::remove_dir_all(c.dir.path().join(&c.members[i].name));
                        let _ = std::fs::remove_file(c.dir.path().join(format!("{}.log", c.members[i].name)));
                    }
                }
                Err(log) => panic!("{log}"),
            }
        }
        c
    }

    fn spawn(&mut self, i: usize, state: &str) {
        let cluster: Vec<String> = self.members.iter().map(|m| format!("{}={}", m.name, m.peer())).collect();
        let m = &self.members[i];
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.path().join(format!("{}.log", m.name))).unwrap();
        let child = Command::new("etcd")
            .args(["--name", &m.name, "--data-dir"])
            .arg(self.dir.path().join(&m.name))
            .args(["--listen-client-urls", &m.url(), "--advertise-client-urls", &m.url()])
            .args(["--listen-peer-urls", &m.peer(), "--initial-advertise-peer-urls", &m.peer()])
            .args(["--initial-cluster", &cluster.join(","), "--initial-cluster-state", state])
            .args(["--initial-cluster-token", "ferro-test"])
            .args(["--logger", "zap", "--log-outputs", "stderr", "--log-level", "warn"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.members[i].child = Some(child);
    }

    /// Waits until every running member (or just `only`) reports healthy.
    fn wait_healthy(&mut self, only: Option<usize>) {
        if let Err(log) = self.healthy(only) {
            panic!("{log}");
        }
    }

    /// As [`EtcdCluster::wait_healthy`]; a member that exited or did not become healthy is
    /// an error with its log.
    fn healthy(&mut self, only: Option<usize>) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        for i in 0..self.members.len() {
            if only.is_some_and(|o| o != i) || self.members[i].child.is_none() {
                continue;
            }
            loop {
                if let Some(status) = self.members[i].child.as_mut().unwrap().try_wait().unwrap() {
                    return Err(format!("etcd member {i} exited with {status}: {}", self.log(i)));
                }
                // healthy, and this cluster's member (not another test's etcd on the port)
                if self.etcdctl_member(i, &["endpoint", "health"]).status.success()
                    && is_member(&self.etcdctl_member(i, &["member", "list"]), &self.members[i].name)
                {
                    break;
                }
                if Instant::now() >= deadline {
                    return Err(format!("etcd member {i} did not become healthy: {}", self.log(i)));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }

    pub fn log(&self, i: usize) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{}.log", self.members[i].name))).unwrap_or_default()
    }

    /// etcdctl against one member only.
    pub fn etcdctl_member(&self, i: usize, args: &[&str]) -> Output {
        Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &self.members[i].url(), "--command-timeout=2s"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// Whether member `i` is the raft leader now (`etcdctl endpoint status`).
    pub fn is_leader(&self, i: usize) -> bool {
        let out = self.etcdctl_member(i, &["endpoint", "status", "-w", "json"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let status = &v[0]["Status"];
        status["leader"].as_u64().is_some_and(|l| Some(l) == status["header"]["member_id"].as_u64())
    }

    /// SIGKILL to member `i` (the process this fixture started).
    pub fn kill9(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts a killed member again on its data and ports, waiting until it is healthy.
    pub fn restart(&mut self, i: usize) {
        self.kill9(i);
        self.spawn(i, "existing");
        self.wait_healthy(Some(i));
    }

    /// Flags that point ferro-control-plane at every member.
    pub fn flags(&self) -> Vec<String> {
        let urls: Vec<String> = self.members.iter().map(Member::url).collect();
        vec!["--etcd-servers".to_string(), urls.join(",")]
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill9(i);
        }
    }
}
