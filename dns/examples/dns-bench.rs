//! ferro-dns against dnsmasq, with dnsperf, on loopback, in one run.
//!
//! Both serve the same names: `--services` ClusterIP Services (`svc-<i>.ns-<i % 10>.svc.<zone>`,
//! one address each). ferro-dns is the real serving code (model -> index -> the UDP threads of
//! `server::spawn_udp`) in this process, on 127.0.0.1:<free port>; dnsmasq (Debian's) gets a
//! hosts file with the same names and addresses (`--no-resolv --no-hosts --addn-hosts`) on
//! another free port. dnsperf asks every name as A, in a shuffled order:
//! - throughput: `dnsperf -l <seconds> -c 4 -q 100` (no rate limit): queries per second;
//! - latency: `dnsperf -v -Q <rate> -l <seconds>` (a fixed rate below both servers' maximum,
//!   so the figure is the server's answer time and not a queue of 100 outstanding queries):
//!   p50 and p99 from the per-query latencies dnsperf prints.
//!
//! Run (root is not needed; nothing leaves loopback):
//!   cargo run --release -p ferro-dns --example dns-bench -- [--services 1000] [--seconds 10] [--rate 10000]
//! Needs dnsperf and dnsmasq (`scripts/lib.sh` installs dnsperf and dnsmasq-base).

use std::io::Write as _;
use std::net::{Ipv4Addr, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use k8s_openapi::api::core::v1::Service;

use ferro_dns::answer::Options;
use ferro_dns::handler::{Handler, Published};
use ferro_dns::model::{service_records, Index, Zone};

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn arg(name: &str, default: u64) -> anyhow::Result<u64> {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == name) {
        Some(i) => args.get(i + 1).with_context(|| format!("{name} needs a value"))?.parse().with_context(|| format!("{name}: not a number")),
        None => Ok(default),
    }
}

fn free_udp_port() -> anyhow::Result<u16> {
    Ok(UdpSocket::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn ip_of(i: u64) -> Ipv4Addr {
    Ipv4Addr::new(10, 96, (i / 250) as u8, (i % 250 + 1) as u8)
}

/// Waits until `port` answers `name` (dnsmasq starting).
fn wait_answering(port: u16, name: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let out = Command::new("dnsperf").args(["-s", "127.0.0.1", "-p", &port.to_string(), "-n", "1", "-t", "1"]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn();
        if let Ok(mut c) = out {
            if let Some(mut i) = c.stdin.take() {
                writeln!(i, "{name} A")?;
            }
            let o = c.wait_with_output()?;
            if String::from_utf8_lossy(&o.stdout).contains("Queries completed:    1 ") {
                return Ok(());
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("nothing answers {name} on 127.0.0.1:{port}")
}

struct Figures {
    qps: f64,
    lost: String,
    p50_us: f64,
    p99_us: f64,
    latency_answers: usize,
}

fn run_dnsperf(port: u16, data: &std::path::Path, seconds: u64, rate: u64) -> anyhow::Result<Figures> {
    let p = port.to_string();
    let l = seconds.to_string();
    let d = data.to_str().context("data path")?;
    let out = Command::new("dnsperf").args(["-s", "127.0.0.1", "-p", &p, "-d", d, "-l", &l, "-c", "4", "-q", "100"]).output().context("running dnsperf")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let field = |key: &str| text.lines().find_map(|line| line.trim().strip_prefix(key).map(|v| v.trim().to_string()));
    let qps: f64 = field("Queries per second:").context("no 'Queries per second' in dnsperf's output")?.parse()?;
    let lost = field("Queries lost:").unwrap_or_default();
    let out = Command::new("dnsperf")
        .args(["-s", "127.0.0.1", "-p", &p, "-d", d, "-l", &(seconds / 2).max(2).to_string(), "-Q", &rate.to_string(), "-v"])
        .output()
        .context("running dnsperf -v")?;
    // "> NOERROR svc-1.ns-1.svc.cluster.local A 0.000081"
    let mut lat: Vec<f64> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("> "))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .collect();
    if lat.is_empty() {
        bail!("dnsperf -v printed no latencies");
    }
    lat.sort_by(f64::total_cmp);
    let pct = |p: f64| lat[((lat.len() as f64 * p).ceil() as usize).clamp(1, lat.len()) - 1] * 1e6;
    Ok(Figures { qps, lost, p50_us: pct(0.50), p99_us: pct(0.99), latency_answers: lat.len() })
}

fn main() -> anyhow::Result<()> {
    let services = arg("--services", 1000)?;
    let seconds = arg("--seconds", 10)?;
    let rate = arg("--rate", 10_000)?;
    for bin in ["dnsperf", "dnsmasq"] {
        if Command::new("sh").args(["-c", &format!("command -v {bin}")]).output()?.stdout.is_empty() {
            bail!("{bin} is missing: apt-get install dnsperf dnsmasq-base (scripts/lib.sh installs them)");
        }
    }
    let dir = tempfile::tempdir()?;
    let zone = Zone::new("cluster.local", 5, vec![])?;
    let mut all = Vec::new();
    let mut hosts = String::new();
    let mut names = Vec::new();
    for i in 0..services {
        let (name, ns) = (format!("svc-{i}"), format!("ns-{}", i % 10));
        let svc: Service = serde_json::from_value(serde_json::json!({"metadata": {"name": name, "namespace": ns},
            "spec": {"clusterIP": ip_of(i).to_string(), "ports": [{"name": "http", "port": 80}]}}))?;
        all.push(service_records(&zone, &svc, &[])?);
        let fqdn = format!("{name}.{ns}.svc.cluster.local");
        hosts.push_str(&format!("{} {fqdn}\n", ip_of(i)));
        names.push(fqdn);
    }
    // a shuffled order, the same for both
    use rand::seq::SliceRandom as _;
    use rand::SeedableRng as _;
    names.shuffle(&mut rand::rngs::StdRng::seed_from_u64(7));
    let data = dir.path().join("queries.txt");
    std::fs::write(&data, names.iter().map(|n| format!("{n} A\n")).collect::<String>())?;
    std::fs::write(dir.path().join("hosts"), hosts)?;

    // ferro-dns: the serving code of the binary, in this process
    let index = Index::build(&zone, 1, all.iter());
    let handler = Arc::new(Handler { index: Arc::new(Published::new(index)), opts: Options { forward: false }, upstream: None });
    let sock = UdpSocket::bind("127.0.0.1:0")?;
    let ferro_port = sock.local_addr()?.port();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    let stop = Arc::new(AtomicBool::new(false));
    let threads = ferro_dns::server::spawn_udp(sock, 2, handler, rt.handle().clone(), stop.clone())?;

    // dnsmasq with the same names
    let dnsmasq_port = free_udp_port()?;
    let _dnsmasq = Killed(
        Command::new("dnsmasq")
            .args(["--keep-in-foreground", "--no-resolv", "--no-hosts", "--bind-interfaces", "--listen-address=127.0.0.1", "--pid-file=", "--user=root"])
            .arg(format!("--port={dnsmasq_port}"))
            .arg(format!("--addn-hosts={}", dir.path().join("hosts").display()))
            .arg("--cache-size=10000")
            .arg("--local=/cluster.local/")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting dnsmasq")?,
    );
    wait_answering(dnsmasq_port, &names[0])?;
    wait_answering(ferro_port, &names[0])?;

    println!("{services} Services, every name asked as A in a shuffled order; dnsperf 4 clients, 100 outstanding, {seconds} s; latency at {rate} queries/s");
    println!("{:<10} {:>12} {:>14} {:>10} {:>10} {:>10}", "server", "queries/s", "lost", "p50 µs", "p99 µs", "answers");
    let mut rows = Vec::new();
    for (who, port) in [("ferro-dns", ferro_port), ("dnsmasq", dnsmasq_port)] {
        let f = run_dnsperf(port, &data, seconds, rate)?;
        println!("{who:<10} {:>12.0} {:>14} {:>10.0} {:>10.0} {:>10}", f.qps, f.lost, f.p50_us, f.p99_us, f.latency_answers);
        rows.push(f);
    }
    println!(
        "ferro-dns / dnsmasq queries per second: {:.2}; ferro-dns p99 {:.0} µs ({})",
        rows[0].qps / rows[1].qps,
        rows[0].p99_us,
        if rows[0].p99_us < 1000.0 { "< 1 ms" } else { ">= 1 ms" }
    );
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    Ok(())
}
