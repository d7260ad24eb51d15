//! ferro-cni against the reference plugins (Debian's containernetworking-plugins: `bridge` with
//! `host-local` IPAM), same config, same kind of namespaces, same run.
//!
//! ```sh
//! cargo run --release -p ferro-cni --example cni-bench            # as root
//! cargo run --release -p ferro-cni --example cni-bench -- --pods 100 --parallel 50 --rounds 3
//! ```
//!
//! Method (see docs/performance.md, section ferro-cni):
//! - Nothing happens in the machine's root network namespace. For each plugin the program
//!   creates a "node" namespace and the container namespaces (untimed), all named
//!   `fcbench-*`, once for all rounds (deleting namespaces starts kernel clean-up work that
//!   would slow down the next plugin's run); a guard deletes them on drop (also on panic), and
//!   leftovers of a crashed run are deleted at start, by exact name.
//! - The timed loop runs *inside* the node namespace: the program re-executes itself once per
//!   plugin as `ip netns exec <node> <self> --inner ...`, so each plugin call is a plain
//!   spawn + wait from a process already in the node namespace, as a runtime does it (the
//!   cost of `ip netns exec` itself is paid once per plugin, outside the timings).
//! - One untimed warm-up ADD + DEL per plugin first, so the bridge exists and the binaries
//!   are in the page cache; then N sequential ADDs (each timed from spawn to exit, config
//!   written on stdin), N sequential DELs, then P parallel ADDs (wall time from the first
//!   spawn to the last exit) and P parallel DELs, also timed until the last veth of the node
//!   namespace is gone ("par DEL gone": ferro-cni's DEL leaves the deletion of the pair to a
//!   detached child, so its DEL exits before the kernel has finished).
//! - CPU time per call (user + system, mean over the sequential calls) from the rusage of the
//!   waited-for children; the inner process is a child subreaper, so ferro-cni's detached link
//!   reapers become its children and their CPU counts in DEL's.
//! - `--rounds` (default 3) repeats everything, alternating which plugin goes first; the table
//!   gives each figure's median over the rounds (ratios: the median of the rounds' ratios), as
//!   this VM's speed drifts by tens of percent between runs.
//! - Every ADD must exit 0 and return an IP; every DEL must exit 0. At the end: no veth left
//!   in the node namespace, no interface but `lo` in the container namespaces, and no
//!   reservation file in the IPAM data dir.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

type Res<T> = Result<T, String>;

const PREFIX: &str = "fcbench-";
const BRIDGE: &str = "fcbbr0";
const SUBNET: &str = "10.78.0.0/16";
const NETWORK: &str = "benchnet";
const REF_DIR: &str = "/usr/lib/cni";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let outcome = if args.first().map(String::as_str) == Some("--inner") {
        inner(&args[1..])
    } else {
        outer(&args)
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cni-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

// ---------------------------------------------------------------- options

fn opt<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

fn opt_num(args: &[String], name: &str, default: usize) -> Res<usize> {
    match opt(args, name) {
        None => Ok(default),
        Some(v) => v
            .parse()
            .map_err(|e| format!("{name} {v}: {e}"))
            .and_then(|n: usize| {
                if n == 0 {
                    Err(format!("{name} must be > 0"))
                } else {
                    Ok(n)
                }
            }),
    }
}

// ---------------------------------------------------------------- namespaces

fn run(cmd: &mut Command) -> Res<std::process::Output> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(out)
}

/// A network namespace this program created; deleted on drop.
struct Ns {
    name: String,
}

impl Ns {
    fn new(name: String) -> Res<Ns> {
        run(Command::new("ip").args(["netns", "add", &name]))?;
        Ok(Ns { name })
    }

    /// Interface names in this namespace (`ip -n NS -j link show ARGS`).
    fn links(&self, args: &[&str]) -> Res<Vec<String>> {
        let out = run(Command::new("ip")
            .args(["-n", &self.name, "-j", "link", "show"])
            .args(args))?;
        if out.stdout.iter().all(u8::is_ascii_whitespace) {
            return Ok(Vec::new());
        }
        let v: Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
        Ok(v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|l| l["ifname"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default())
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// Deletes namespaces left by a crashed run: each `fcbench-*` name, by its exact name.
fn clean_leftovers() -> Res<()> {
    let out = run(Command::new("ip").args(["netns", "list"]))?;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        if name.starts_with(PREFIX) {
            eprintln!("cni-bench: deleting leftover namespace {name}");
            run(Command::new("ip").args(["netns", "del", name]))?;
        }
    }
    Ok(())
}

fn require_root() -> Res<()> {
    let status = std::fs::read_to_string("/proc/self/status").map_err(|e| e.to_string())?;
    let euid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or("?");
    if euid != "0" {
        return Err("must run as root (creates network namespaces)".into());
    }
    Ok(())
}

// ---------------------------------------------------------------- plugins

struct Plugin {
    label: &'static str,
    /// `ferro` or `ref`: the namespace name part.
    key: &'static str,
    bin: PathBuf,
}

fn conf(plugin_key: &str, data_dir: &Path) -> String {
    let (ty, ipam) = if plugin_key == "ferro" {
        (
            "ferro",
            json!({"ranges": [[{"subnet": SUBNET}]], "dataDir": data_dir}),
        )
    } else {
        (
            "bridge",
            json!({"type": "host-local", "ranges": [[{"subnet": SUBNET}]], "dataDir": data_dir}),
        )
    };
    json!({
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "type": ty,
        "bridge": BRIDGE,
        "isGateway": true,
        "mtu": 1400,
        "ipam": ipam,
    })
    .to_string()
}

/// The ferro-cni binary: `--ferro PATH`, or built next to this example (under `cargo run`,
/// `cargo build --release -p ferro-cni --bin ferro-cni` first, so it is never stale).
fn ferro_bin(args: &[String]) -> Res<PathBuf> {
    if let Some(p) = opt(args, "--ferro") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    // target/<profile>/examples/cni-bench -> target/<profile>/ferro-cni
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .ok_or("cannot locate the target dir")?;
    if let Ok(cargo) = std::env::var("CARGO") {
        let profile = dir
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("release");
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-q", "-p", "ferro-cni", "--bin", "ferro-cni"]);
        if profile == "release" {
            cmd.arg("--release");
        }
        let status = cmd.status().map_err(|e| e.to_string())?;
        if !status.success() {
            return Err(format!("{cmd:?}: {status}"));
        }
    }
    let bin = dir.join("ferro-cni");
    if !bin.exists() {
        return Err(format!(
            "{} not found: run `cargo build --release -p ferro-cni` or pass --ferro PATH",
            bin.display()
        ));
    }
    Ok(bin)
}

// ---------------------------------------------------------------- outer

#[derive(Default)]
struct Figures {
    add: Vec<f64>,
    del: Vec<f64>,
    par_add: f64,
    par_del: f64,
    /// From the first parallel DEL's spawn until no veth is left in the node namespace.
    par_del_gone: f64,
    /// CPU (user + system) per sequential call, ms.
    add_cpu: f64,
    del_cpu: f64,
}

fn outer(args: &[String]) -> Res<()> {
    require_root()?;
    let pods = opt_num(args, "--pods", 100)?;
    let parallel = opt_num(args, "--parallel", 50)?;
    if pods.max(parallel) > 60_000 {
        return Err("at most 60000 pods".into());
    }
    let ref_bridge = PathBuf::from(REF_DIR).join("bridge");
    if !ref_bridge.exists() || !Path::new(REF_DIR).join("host-local").exists() {
        return Err(format!(
            "{REF_DIR}/bridge and host-local not found: apt-get install -y containernetworking-plugins"
        ));
    }
    let plugins = [
        Plugin {
            label: "ferro-cni",
            key: "ferro",
            bin: ferro_bin(args)?,
        },
        Plugin {
            label: "reference bridge+host-local",
            key: "ref",
            bin: ref_bridge,
        },
    ];
    let rounds = opt_num(args, "--rounds", 3)?;
    clean_leftovers()?;
    // Rounds alternate which plugin goes first, so a slow stretch of the machine does not
    // land on one plugin only; every figure below is the median over the rounds.
    let worlds = [
        World::new(&plugins[0], pods, parallel)?,
        World::new(&plugins[1], pods, parallel)?,
    ];
    let mut runs: Vec<[Summary; 2]> = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        let mut got: [Option<Summary>; 2] = [None, None];
        for i in order {
            let p = &plugins[i];
            eprintln!("cni-bench: round {} of {rounds}: {} ({})", round + 1, p.label, p.bin.display());
            got[i] = Some(Summary::of(&bench_plugin(p, &worlds[i], pods, parallel)?));
        }
        let [Some(fe), Some(re)] = got else {
            return Err("a plugin was not run".into());
        };
        println!(
            "round {}: ADD p50 {:.2} / {:.2} ms = {:.3}, DEL p50 {:.2} / {:.2} ms = {:.3}, \
             CPU per ADD {:.2} / {:.2} ms = {:.3}",
            round + 1,
            fe.0[0],
            re.0[0],
            fe.0[0] / re.0[0],
            fe.0[3],
            re.0[3],
            fe.0[3] / re.0[3],
            fe.0[9],
            re.0[9],
            fe.0[9] / re.0[9]
        );
        runs.push([fe, re]);
    }

    println!();
    println!(
        "{pods} sequential pods, {parallel} parallel, median of {rounds} rounds; times in ms \
         (spawn to exit of the plugin binary); CPU = user + system per sequential call, DEL's \
         with its detached reaper"
    );
    let cols = [
        "ADD p50", "ADD p99", "ADD mean", "DEL p50", "DEL p99", "DEL mean", "par ADD", "par DEL",
        "par DEL gone", "CPU ADD", "CPU DEL",
    ];
    let mut header = format!("{:<28}", "plugin");
    for c in cols {
        header.push_str(&format!(" {c:>9}"));
    }
    println!("{header}");
    let row = |label: &str, values: [f64; 11], prec: usize| {
        let mut line = format!("{label:<28}");
        for v in values {
            line.push_str(&format!(" {v:>9.prec$}"));
        }
        println!("{line}");
    };
    let median_of = |f: &dyn Fn(&[Summary; 2]) -> f64| -> f64 {
        pct(&runs.iter().map(f).collect::<Vec<f64>>(), 50.0)
    };
    for (i, p) in plugins.iter().enumerate() {
        row(p.label, std::array::from_fn(|c| median_of(&|r| r[i].0[c])), 2);
    }
    let ratios: [f64; 11] = std::array::from_fn(|c| median_of(&|r| r[0].0[c] / r[1].0[c]));
    row("ratio ferro/reference", ratios, 3);
    let goal = |name: &str, r: f64| {
        println!(
            "goal {name} <= 0.25 of reference (median of the rounds' p50 ratios): {:.3} -> {}",
            r,
            if r <= 0.25 { "met" } else { "NOT met" }
        );
    };
    goal("ADD", ratios[0]);
    goal("DEL", ratios[3]);
    println!("leak check (every round): no veth left, container namespaces empty, IPAM dirs empty: ok");
    Ok(())
}

/// One plugin's figures in one round, in the table's column order.
struct Summary([f64; 11]);

impl Summary {
    fn of(f: &Figures) -> Summary {
        Summary([
            pct(&f.add, 50.0),
            pct(&f.add, 99.0),
            mean(&f.add),
            pct(&f.del, 50.0),
            pct(&f.del, 99.0),
            mean(&f.del),
            f.par_add,
            f.par_del,
            f.par_del_gone,
            f.add_cpu,
            f.del_cpu,
        ])
    }
}

/// A plugin's node namespace and container namespaces, kept for all rounds: deleting
/// namespaces sets the kernel's cleanup work going (under the rtnl lock), which would slow
/// down whichever plugin runs next.
struct World {
    node: Ns,
    ctrs: Vec<Ns>,
}

impl World {
    fn new(p: &Plugin, pods: usize, parallel: usize) -> Res<World> {
        let node = Ns::new(format!("{PREFIX}{}-node", p.key))?;
        let count = pods.max(parallel);
        let mut ctrs = Vec::with_capacity(count + 1);
        for i in 0..=count {
            // the last one is the warm-up's
            ctrs.push(Ns::new(format!("{PREFIX}{}-c{i}", p.key))?);
        }
        Ok(World { node, ctrs })
    }
}

/// One round of one plugin, with a fresh IPAM data dir; the world's namespaces must be as
/// the previous round left them (checked empty by it).
fn bench_plugin(p: &Plugin, w: &World, pods: usize, parallel: usize) -> Res<Figures> {
    let (node, ctrs) = (&w.node, &w.ctrs);
    let count = pods.max(parallel);
    let data = tempfile::Builder::new()
        .prefix("fcbench-ipam-")
        .tempdir()
        .map_err(|e| e.to_string())?;
    let conf_file = data.path().join("conf.json");
    let data_dir = data.path().join("ipam");
    std::fs::write(&conf_file, conf(p.key, &data_dir)).map_err(|e| e.to_string())?;

    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let out = Command::new("ip")
        .args(["netns", "exec", &node.name])
        .arg(&exe)
        .arg("--inner")
        .arg("--plugin")
        .arg(&p.bin)
        .arg("--conf")
        .arg(&conf_file)
        .args(["--ns-prefix", &format!("/run/netns/{PREFIX}{}-c", p.key)])
        .args(["--pods", &pods.to_string()])
        .args(["--parallel", &parallel.to_string()])
        .args(["--warmup", &count.to_string()])
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!("{}: inner run failed: {}", p.label, out.status));
    }
    let v: Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("{}: inner output: {e}", p.label))?;
    let list = |k: &str| -> Vec<f64> {
        v[k].as_array()
            .map(|a| a.iter().filter_map(Value::as_f64).collect())
            .unwrap_or_default()
    };
    let figures = Figures {
        add: list("add_ms"),
        del: list("del_ms"),
        par_add: v["par_add_ms"].as_f64().unwrap_or(f64::NAN),
        par_del: v["par_del_ms"].as_f64().unwrap_or(f64::NAN),
        par_del_gone: v["par_del_gone_ms"].as_f64().unwrap_or(f64::NAN),
        add_cpu: v["add_cpu_ms"].as_f64().unwrap_or(f64::NAN),
        del_cpu: v["del_cpu_ms"].as_f64().unwrap_or(f64::NAN),
    };
    if figures.add.len() != pods || figures.del.len() != pods {
        return Err(format!("{}: inner output incomplete", p.label));
    }

    // Leak check.
    let veths = node.links(&["type", "veth"])?;
    if !veths.is_empty() {
        return Err(format!("{}: veths left in the node: {veths:?}", p.label));
    }
    for c in ctrs {
        let links: Vec<String> = c.links(&[])?.into_iter().filter(|l| l != "lo").collect();
        if !links.is_empty() {
            return Err(format!("{}: links left in {}: {links:?}", p.label, c.name));
        }
    }
    let ips = ip_files(&data_dir.join(NETWORK))?;
    if !ips.is_empty() {
        return Err(format!("{}: reservations left: {ips:?}", p.label));
    }
    Ok(figures)
}

fn ip_files(dir: &Path) -> Res<Vec<String>> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for e in rd {
        let name = e.map_err(|e| e.to_string())?.file_name();
        let name = name.to_string_lossy();
        if name.parse::<IpAddr>().is_ok() {
            out.push(name.into_owned());
        }
    }
    Ok(out)
}

fn pct(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    // nearest rank
    let rank = ((p / 100.0) * s.len() as f64).ceil() as usize;
    s[rank.clamp(1, s.len()) - 1]
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

// ---------------------------------------------------------------- inner (in the node netns)

struct Inner {
    plugin: PathBuf,
    conf: Vec<u8>,
    ns_prefix: String,
}

impl Inner {
    fn call(&self, command: &str, i: usize) -> Res<(Duration, Vec<u8>)> {
        let id = format!("fcbench-ctr-{i}");
        let netns = format!("{}{i}", self.ns_prefix);
        let start = Instant::now();
        let mut child = Command::new(&self.plugin)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", &id)
            .env("CNI_NETNS", &netns)
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", REF_DIR)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", self.plugin.display()))?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(&self.conf)
                .map_err(|e| format!("{command} {id}: stdin: {e}"))?;
        }
        let out = child
            .wait_with_output()
            .map_err(|e| format!("{command} {id}: {e}"))?;
        let took = start.elapsed();
        if !out.status.success() {
            return Err(format!(
                "{command} {id}: {}: stdout {} stderr {}",
                out.status,
                String::from_utf8_lossy(&out.stdout).trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok((took, out.stdout))
    }

    fn add(&self, i: usize) -> Res<f64> {
        let (took, stdout) = self.call("ADD", i)?;
        let v: Value = serde_json::from_slice(&stdout)
            .map_err(|e| format!("ADD {i}: result is not JSON: {e}"))?;
        let ip = v["ips"][0]["address"]
            .as_str()
            .and_then(|a| a.split('/').next())
            .and_then(|a| a.parse::<IpAddr>().ok());
        if ip.is_none() {
            return Err(format!("ADD {i}: no IP in the result: {v}"));
        }
        Ok(ms(took))
    }

    fn del(&self, i: usize) -> Res<f64> {
        let (took, _) = self.call("DEL", i)?;
        Ok(ms(took))
    }

    /// Wall time for `f(0..n)` all at once, one thread per call.
    fn parallel(&self, n: usize, f: fn(&Inner, usize) -> Res<f64>) -> Res<f64> {
        let start = Instant::now();
        let results: Vec<Res<f64>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..n).map(|i| s.spawn(move || f(self, i))).collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err("thread panicked".into())))
                .collect()
        });
        let wall = ms(start.elapsed());
        for r in results {
            r?;
        }
        Ok(wall)
    }
}

fn inner(args: &[String]) -> Res<()> {
    let plugin = PathBuf::from(opt(args, "--plugin").ok_or("--plugin")?);
    let conf_path = opt(args, "--conf").ok_or("--conf")?;
    let conf = std::fs::read(conf_path).map_err(|e| format!("{conf_path}: {e}"))?;
    let ns_prefix = opt(args, "--ns-prefix").ok_or("--ns-prefix")?.to_string();
    let pods = opt_num(args, "--pods", 100)?;
    let parallel = opt_num(args, "--parallel", 50)?;
    let warmup = opt_num(args, "--warmup", pods)?;
    let b = Inner {
        plugin,
        conf,
        ns_prefix,
    };

    // Orphans (ferro-cni's link reapers) become this process's children, for their CPU time.
    nix::sys::prctl::set_child_subreaper(true).map_err(|e| format!("PR_SET_CHILD_SUBREAPER: {e}"))?;
    // Untimed: the bridge is created, binaries are in the page cache.
    b.add(warmup)?;
    b.del(warmup)?;
    wait_veths_gone()?;
    reap_orphans()?;

    let cpu0 = children_cpu_ms()?;
    let add = (0..pods).map(|i| b.add(i)).collect::<Res<Vec<f64>>>()?;
    let cpu1 = children_cpu_ms()?;
    let del = (0..pods).map(|i| b.del(i)).collect::<Res<Vec<f64>>>()?;
    wait_veths_gone()?;
    reap_orphans()?;
    let cpu2 = children_cpu_ms()?;
    let par_add = b.parallel(parallel, Inner::add)?;
    let start = Instant::now();
    let par_del = b.parallel(parallel, Inner::del)?;
    wait_veths_gone()?;
    let par_del_gone = ms(start.elapsed());
    reap_orphans()?;
    let n = pods as f64;
    println!(
        "{}",
        json!({"add_ms": add, "del_ms": del, "par_add_ms": par_add, "par_del_ms": par_del,
               "par_del_gone_ms": par_del_gone,
               "add_cpu_ms": (cpu1 - cpu0) / n, "del_cpu_ms": (cpu2 - cpu1) / n})
    );
    Ok(())
}

/// User + system time of all waited-for descendants so far, ms.
fn children_cpu_ms() -> Res<f64> {
    use nix::sys::resource::{getrusage, UsageWho};
    let u = getrusage(UsageWho::RUSAGE_CHILDREN).map_err(|e| format!("getrusage: {e}"))?;
    let tv = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 * 1000.0 + t.tv_usec() as f64 / 1000.0;
    Ok(tv(u.user_time()) + tv(u.system_time()))
}

/// Waits for every child left (orphaned link reapers reparented to this subreaper); the
/// plugin calls themselves were waited for already.
fn reap_orphans() -> Res<()> {
    use nix::errno::Errno;
    loop {
        match nix::sys::wait::waitpid(None, None) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(Errno::ECHILD) => return Ok(()),
            Err(e) => return Err(format!("waitpid: {e}")),
        }
    }
}

/// Waits until the node namespace has no veth left (`ip netns exec` mounted a sysfs of that
/// namespace for this process). A plugin may finish deleting the pairs after its DEL exited
/// (ferro-cni does it in a detached child).
fn wait_veths_gone() -> Res<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = std::fs::read_dir("/sys/class/net")
            .map_err(|e| format!("/sys/class/net: {e}"))?
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with("veth"))
            .count();
        if left == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("{left} veths still there a minute after DEL"));
        }
        std::thread::sleep(Duration::from_micros(500));
    }
}
