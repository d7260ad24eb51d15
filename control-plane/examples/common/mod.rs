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
        let exe = std::env::current_exe().unwrap();
        let bin = exe.parent().unwrap().parent().unwrap().join("ferro-control-plane");
        let dir = tempfile::Builder::new().prefix(prefix).tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = std::process::Command::new(&bin)
            .args(["--data-dir", dir.path().to_str().unwrap(), "--bind-address", "127.0.0.1"])
            .args(["--secure-port", &port.to_string()])
            .args(args)
            .env("RUST_LOG", "warn")
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
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
