//! ferro's systemd units under a real systemd as PID 1 (docs/operations.md): a cached minimal
//! Debian root is copied, scripts/install.sh installs a control-plane node into it (twice: the
//! second run changes nothing), it boots under systemd-nspawn --private-network, and every unit
//! starts and reaches active through READY=1 (Type=notify), restarts after a SIGKILL of its
//! main process, and stops cleanly. An invalid config file fails its unit with the reason in
//! the journal and no endless restart loop. --uninstall removes what was installed. The
//! container and its copy are removed afterwards, also on failure.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use ferro_lab::nspawn::{cached_root, wait_for, Machine, RootCopy};

/// The units in start order: the control plane first, the node's components pointed at it.
const UNITS: &[(&str, &str)] = &[
    ("ferro-control-plane", "serving the API"),
    ("ferro-dns", "informers synced; answering"),
    ("ferro-csi", "serving CSI"),
    ("ferro-agent", "node registered"),
    ("ferro-netd", "routes programmed"),
    ("ferro-proxy", "first sync done: rules in the kernel"),
];

/// The node's address on its (container-private) underlay.
const NODE_IP: &str = "192.168.77.10";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// The binaries cargo built next to this test (target/<profile>).
fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
    for (u, _) in UNITS {
        assert!(
            dir.join(u).is_file(),
            "{} is missing: build the workspace first (cargo build --workspace --all-targets, as scripts/test.sh does)",
            dir.join(u).display()
        );
    }
    dir
}

fn install(root: &Path, args: &[&str]) -> String {
    let out = Command::new(repo().join("scripts/install.sh"))
        .arg("--root")
        .arg(root)
        .arg("--bin-dir")
        .arg(bin_dir())
        .args(args)
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "install.sh {args:?} failed: {text}");
    text
}

/// Path, mode, size and modification time of everything under the installer's places.
fn snapshot(root: &Path) -> BTreeMap<PathBuf, (u32, u64, i64, i64)> {
    use std::os::unix::fs::MetadataExt as _;
    let mut all = BTreeMap::new();
    let mut stack: Vec<PathBuf> =
        ["etc/ferro", "etc/systemd/system", "usr/local/bin", "var/lib/ferro"].iter().map(|d| root.join(d)).collect();
    while let Some(p) = stack.pop() {
        let Ok(md) = std::fs::symlink_metadata(&p) else { continue };
        all.insert(p.clone(), (md.mode(), md.size(), md.mtime(), md.mtime_nsec()));
        if md.is_dir() {
            stack.extend(std::fs::read_dir(&p).unwrap().flatten().map(|e| e.path()));
        }
    }
    all
}

fn journal(m: &Machine, unit: &str) -> String {
    m.cmd(&["journalctl", "-u", unit, "--no-pager", "-o", "cat"])
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// A host binary's real path.
fn which(bin: &str) -> PathBuf {
    let out = Command::new("sh").args(["-c", &format!("command -v {bin}")]).output().unwrap();
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(!path.is_empty(), "{bin} is not installed");
    std::fs::canonicalize(path).unwrap()
}

/// Starts a unit (systemctl start returns once READY=1 came) and checks it is active with the
/// status text its READY carried.
fn start(m: &Machine, unit: &str, status: &str) {
    if let Err(e) = m.ok(&["systemctl", "start", unit]) {
        panic!("{e:#}\njournal of {unit}:\n{}", journal(m, unit));
    }
    assert_eq!(m.prop(unit, "ActiveState").unwrap(), "active", "{unit}");
    assert_eq!(m.prop(unit, "SubState").unwrap(), "running", "{unit}");
    assert_eq!(m.prop(unit, "Type").unwrap(), "notify", "{unit}");
    assert_eq!(m.prop(unit, "StatusText").unwrap(), status, "{unit}: READY=1 came with its status");
}

/// SIGKILL to the main process: systemd restarts the unit and it becomes active again (READY).
fn kill_and_restart(m: &Machine, unit: &str) {
    let restarts: u32 = m.prop(unit, "NRestarts").unwrap().parse().unwrap();
    let pid = m.prop(unit, "MainPID").unwrap();
    assert_ne!(pid, "0", "{unit} has a main process");
    m.ok(&["kill", "-9", &pid]).unwrap();
    let r = wait_for(&format!("{unit} restarted and active again"), Duration::from_secs(120), || {
        let n: u32 = m.prop(unit, "NRestarts").ok()?.parse().ok()?;
        let state = m.prop(unit, "ActiveState").ok()?;
        let new_pid = m.prop(unit, "MainPID").ok()?;
        (n > restarts && state == "active" && new_pid != pid && new_pid != "0").then_some(())
    });
    if let Err(e) = r {
        panic!("{e:#}\njournal of {unit}:\n{}", journal(m, unit));
    }
}

fn stop(m: &Machine, unit: &str) {
    m.ok(&["systemctl", "stop", unit]).unwrap();
    assert_eq!(m.prop(unit, "ActiveState").unwrap(), "inactive", "{unit} stopped cleanly, not failed");
    assert_eq!(m.prop(unit, "Result").unwrap(), "success", "{unit}");
}

/// A unit whose config is broken fails, stays failed (no endless restarts) and says why.
/// Returns how often systemd restarted it before giving up.
fn fails_with_reason(m: &Machine, unit: &str, reason: &str) -> u32 {
    // reset-failed clears the unit's restart counter; systemd may also clear it on an explicit
    // start (it did after an earlier `systemctl enable --now` of the running unit): counted
    // from whichever is lower
    m.ok(&["systemctl", "reset-failed", unit]).unwrap();
    let before: u32 = m.prop(unit, "NRestarts").unwrap().parse().unwrap();
    let started = m.cmd(&["systemctl", "start", unit]).unwrap();
    assert!(!started.status.success(), "{unit} started with a broken config");
    wait_for(&format!("{unit} failed for good"), Duration::from_secs(120), || {
        (m.prop(unit, "ActiveState").ok()? == "failed").then_some(())
    })
    .unwrap();
    // failed means no restart is pending: systemd gave up and left the reason in the journal
    let j = journal(m, unit);
    assert!(j.contains(reason), "the journal of {unit} names the reason ({reason:?}):\n{j}");
    let after: u32 = m.prop(unit, "NRestarts").unwrap().parse().unwrap();
    if after >= before {
        after - before
    } else {
        after
    }
}

#[test]
#[ignore = "privileged: boots a Debian root under systemd-nspawn (root, mmdebstrap, systemd-container)"]
fn units_under_systemd_as_pid1() {
    bin_dir();
    let cached = cached_root().unwrap();
    let name = format!("ferro-units-{}", std::process::id());
    let copy = RootCopy::new(&cached, &name).unwrap();
    let root = copy.path();

    // the installer, twice: the second run changes nothing
    let args = ["--role", "control-plane", "--node-name", &name, "--node-ip", NODE_IP];
    let first = install(root, &args);
    assert!(first.contains("installed under"), "{first}");
    let before = snapshot(root);
    let second = install(root, &args);
    assert!(second.contains("nothing to change"), "second run: {second}");
    assert_eq!(before, snapshot(root), "the second install changed files");
    for (u, _) in UNITS {
        assert!(root.join("usr/local/bin").join(u).is_file());
        assert!(root.join("etc/systemd/system").join(format!("{u}.service")).is_file());
    }

    // a worker beside it (installed only, not booted): the node's units, none of the control
    // plane's; the agent joins with a bootstrap token (its TLS bootstrap is proven against a
    // running control plane in agent/tests/node.rs), the others get the kubeconfigs given;
    // again idempotent
    let worker = tempfile::Builder::new().prefix("ferro-units-worker-").tempdir_in("/var/tmp").unwrap();
    let kubeconfigs = root.join("etc/ferro");
    let ca = root.join("var/lib/ferro/control-plane/ca.crt");
    let token = "abcdef.0123456789abcdef";
    let server = format!("https://{NODE_IP}:6443");
    let wargs = [
        "--role", "worker", "--node-name", "worker-1", "--kubeconfig-dir", kubeconfigs.to_str().unwrap(),
        "--token", token, "--ca-file", ca.to_str().unwrap(), "--api-server", &server,
    ];
    let out = install(worker.path(), &wargs);
    assert!(out.contains("installed under"), "{out}");
    assert!(!worker.path().join("usr/local/bin/ferro-control-plane").exists(), "a worker runs no control plane");
    assert!(!worker.path().join("etc/ferro/control-plane.env").exists());
    for c in ["netd", "proxy", "dns", "csi"] {
        let given = std::fs::read(kubeconfigs.join(format!("{c}.kubeconfig"))).unwrap();
        assert_eq!(std::fs::read(worker.path().join(format!("etc/ferro/{c}.kubeconfig"))).unwrap(), given, "{c}");
    }
    assert!(!worker.path().join("etc/ferro/agent.kubeconfig").exists(), "the agent writes its own at its first start");
    let boot = worker.path().join("etc/ferro/bootstrap-agent.kubeconfig");
    let boot_text = std::fs::read_to_string(&boot).unwrap();
    assert!(boot_text.contains(&format!("token: {token}")) && boot_text.contains(&format!("server: {server}")), "{boot_text}");
    assert_eq!(std::fs::metadata(&boot).unwrap().permissions().mode() & 0o777, 0o600);
    let agent_env = std::fs::read_to_string(worker.path().join("etc/ferro/agent.env")).unwrap();
    assert!(agent_env.contains("--hostname-override worker-1"), "{agent_env}");
    assert!(agent_env.contains("--bootstrap-kubeconfig /etc/ferro/bootstrap-agent.kubeconfig"), "{agent_env}");
    for (bad, why) in [
        (vec!["--token", "not-a-token", "--ca-file", ca.to_str().unwrap(), "--api-server", &server], "--token must look like"),
        (vec!["--token", token, "--api-server", &server], "--token needs --ca-file"),
        (vec!["--token", token, "--ca-file", ca.to_str().unwrap()], "--token needs --api-server"),
    ] {
        let other = tempfile::Builder::new().prefix("ferro-units-bad-").tempdir_in("/var/tmp").unwrap();
        let out = Command::new(repo().join("scripts/install.sh"))
            .args(["--root", other.path().to_str().unwrap(), "--bin-dir", bin_dir().to_str().unwrap()])
            .args(["--role", "worker", "--node-name", "worker-2", "--kubeconfig-dir", kubeconfigs.to_str().unwrap()])
            .args(&bad)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{bad:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains(why), "{bad:?}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(!other.path().join("etc").exists(), "nothing installed for {bad:?}");
    }
    let before = snapshot(worker.path());
    assert!(install(worker.path(), &wargs).contains("nothing to change"));
    assert_eq!(before, snapshot(worker.path()), "the second worker install changed files");
    let missing = Command::new(repo().join("scripts/install.sh"))
        .args(["--root", worker.path().to_str().unwrap(), "--bin-dir", bin_dir().to_str().unwrap(), "--role", "worker"])
        .output()
        .unwrap();
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("--role worker needs --kubeconfig-dir"));
    assert!(install(worker.path(), &["--uninstall"]).contains("uninstalled"));
    assert!(!worker.path().join("usr/local/bin/ferro-agent").exists());
    assert!(!worker.path().join("etc/ferro").exists());

    let log = std::env::temp_dir().join(format!("{name}.log"));
    // kubectl (a static binary) to look at the cluster from inside
    let kubectl = which("kubectl");
    std::fs::copy(&kubectl, root.join("usr/local/bin/kubectl")).unwrap();
    let mut m = Machine::boot(root, &name, &log).unwrap();
    // The node's underlay inside the container's own network namespace (nspawn
    // --private-network gives it only lo): a veth pair holding the node IP, which netd's
    // VXLAN device and the control plane's advertise address use.
    m.ok(&["ip", "link", "add", "ferro-ul", "type", "veth", "peer", "name", "ferro-ul-peer"]).unwrap();
    m.ok(&["ip", "addr", "add", &format!("{NODE_IP}/24"), "dev", "ferro-ul"]).unwrap();
    m.ok(&["ip", "link", "set", "ferro-ul", "up"]).unwrap();
    m.ok(&["ip", "link", "set", "ferro-ul-peer", "up"]).unwrap();
    for (u, _) in UNITS {
        let unit = format!("/etc/systemd/system/{u}.service");
        m.ok(&["systemd-analyze", "verify", &unit]).unwrap();
    }
    // containerd for the agent (Debian's unit, the root's package)
    m.ok(&["systemctl", "start", "containerd.service"]).unwrap();

    for (u, status) in UNITS {
        start(&m, u, status);
    }
    // netd runs as the node (no system:masters): it published its VXLAN address on its own
    // Node, which the Node authorizer allows; the proxy's and dns's READY above needed the
    // lists their roles grant (system:node-proxier, system:ferro-dns)
    let admin = "/var/lib/ferro/control-plane/admin.kubeconfig";
    let annotation = wait_for("netd's annotation on its Node", Duration::from_secs(60), || {
        let out = m.ok(&["kubectl", "--kubeconfig", admin, "get", "node", &name, "-o", "jsonpath={.metadata.annotations.ferro\\.dev/vtep-mac}"]).ok()?;
        (!out.trim().is_empty()).then_some(out)
    });
    if let Err(e) = annotation {
        panic!("{e:#}\njournal of ferro-netd:\n{}", journal(&m, "ferro-netd"));
    }
    // a worker joining by discovery, as docs/operations.md says: the command the control
    // plane prints, run by the installer (on the host, in the machine's network namespace
    // where the API server listens); the CA comes from kube-public/cluster-info, signed for
    // the token and pinned by the hash. A wrong hash installs nothing.
    let join = m.ok(&["ferro-control-plane", "token", "create", "--print-join-command", "--data-dir", "/var/lib/ferro/control-plane"]).unwrap();
    let word_after = |flag: &str| join.split_whitespace().skip_while(|w| *w != flag).nth(1).unwrap_or_default().to_string();
    let joining = |dir: &Path, hash: &str| {
        Command::new("nsenter")
            .args(["-t", &m.leader.to_string(), "-n", "--"])
            .arg(repo().join("scripts/install.sh"))
            .args(["--root", dir.to_str().unwrap(), "--bin-dir", bin_dir().to_str().unwrap()])
            .args(["--role", "worker", "--node-name", "worker-3", "--kubeconfig-dir", kubeconfigs.to_str().unwrap()])
            .args(["--api-server", &word_after("--api-server"), "--token", &word_after("--token"), "--discovery-token-ca-cert-hash", hash])
            .output()
            .unwrap()
    };
    let other = tempfile::Builder::new().prefix("ferro-units-pin-").tempdir_in("/var/tmp").unwrap();
    let wrong = joining(other.path(), &format!("sha256:{}", "ab".repeat(32)));
    assert!(!wrong.status.success() && String::from_utf8_lossy(&wrong.stderr).contains("none of the pinned ones"), "{join}\n{}", String::from_utf8_lossy(&wrong.stderr));
    assert!(!other.path().join("etc").exists() && !other.path().join("usr").exists(), "nothing installed with a wrong hash");
    let joiner = tempfile::Builder::new().prefix("ferro-units-join-").tempdir_in("/var/tmp").unwrap();
    let out = joining(joiner.path(), &word_after("--discovery-token-ca-cert-hash"));
    assert!(out.status.success(), "{join}\n{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let boot = std::fs::read_to_string(joiner.path().join("etc/ferro/bootstrap-agent.kubeconfig")).unwrap();
    let ca_b64 = Command::new("base64").arg("-w0").arg(root.join("var/lib/ferro/control-plane/ca.crt")).output().unwrap().stdout;
    assert!(boot.contains(&format!("certificate-authority-data: {}\n", String::from_utf8_lossy(&ca_b64))), "the discovered CA is the cluster's:\n{boot}");
    assert!(install(joiner.path(), &["--uninstall"]).contains("uninstalled"));

    for (u, status) in UNITS {
        kill_and_restart(&m, u);
        assert_eq!(m.prop(u, "StatusText").unwrap(), *status, "{u} after its restart");
    }
    // an upgrade as an operator runs it on the node (under its systemd): the installer again,
    // with binaries of which only ferro-dns differs (the same program with bytes appended),
    // replaces that one and restarts ferro-dns alone; the other units keep their processes
    let upgrade = root.join("opt/ferro-upgrade");
    std::fs::create_dir_all(upgrade.join("bin")).unwrap();
    for dir in ["scripts", "systemd"] {
        let cp = Command::new("cp").arg("-r").arg(repo().join(dir)).arg(upgrade.join(dir)).status().unwrap();
        assert!(cp.success());
    }
    let link_or_copy = |from: &Path, to: &Path| {
        if std::fs::hard_link(from, to).is_err() {
            std::fs::copy(from, to).unwrap();
        }
    };
    for (u, _) in UNITS {
        let installed = root.join("usr/local/bin").join(u);
        if *u == "ferro-dns" {
            let mut bytes = std::fs::read(&installed).unwrap();
            bytes.extend_from_slice(b"\0ferro-upgrade-test");
            std::fs::write(upgrade.join("bin").join(u), bytes).unwrap();
            std::fs::set_permissions(upgrade.join("bin").join(u), std::fs::Permissions::from_mode(0o755)).unwrap();
        } else {
            link_or_copy(&installed, &upgrade.join("bin").join(u));
        }
    }
    link_or_copy(&bin_dir().join("ferro-cni"), &upgrade.join("bin/ferro-cni"));
    let pids: Vec<String> = UNITS.iter().map(|(u, _)| m.prop(u, "MainPID").unwrap()).collect();
    let mut inside = vec!["/opt/ferro-upgrade/scripts/install.sh", "--bin-dir", "/opt/ferro-upgrade/bin"];
    inside.extend_from_slice(&args);
    let out = m.ok(&inside).unwrap();
    assert!(out.contains("install /usr/local/bin/ferro-dns") && out.contains("1 change(s)"), "{out}");
    assert!(out.contains("restarting ferro-dns.service (binary or unit changed)"), "{out}");
    for ((u, status), pid) in UNITS.iter().zip(&pids) {
        let now = m.prop(u, "MainPID").unwrap();
        if *u == "ferro-dns" {
            assert_ne!(&now, pid, "ferro-dns was restarted with its new binary");
        } else {
            assert_eq!(&now, pid, "{u} was left running");
        }
        assert_eq!(m.prop(u, "ActiveState").unwrap(), "active", "{u} after the upgrade");
        assert_eq!(m.prop(u, "StatusText").unwrap(), *status, "{u} after the upgrade");
    }
    assert!(m.ok(&inside).unwrap().contains("nothing to change"), "the upgrade run again");
    std::fs::remove_dir_all(&upgrade).unwrap();

    // a stall, not a crash: ferro-dns keeps systemd's watchdog fed only while a query to its
    // own listen address is answered (every 10 s); with the address gone it stops answering,
    // systemd's watchdog kills it and Restart= brings it back, which sets the address up again.
    // A drop-in shortens WatchdogSec from 60 s to 25 s for the test (still more than two
    // liveness periods, so a healthy ferro-dns is never killed).
    let dropin = root.join("etc/systemd/system/ferro-dns.service.d");
    std::fs::create_dir_all(&dropin).unwrap();
    std::fs::write(dropin.join("watchdog-test.conf"), "[Service]\nWatchdogSec=25\n").unwrap();
    m.ok(&["systemctl", "daemon-reload"]).unwrap();
    m.ok(&["systemctl", "restart", "ferro-dns.service"]).unwrap();
    assert_eq!(m.prop("ferro-dns", "WatchdogUSec").unwrap(), "25s");
    let restarts: u32 = m.prop("ferro-dns", "NRestarts").unwrap().parse().unwrap();
    let pid = m.prop("ferro-dns", "MainPID").unwrap();
    m.ok(&["ip", "addr", "flush", "dev", "ferro-dns0"]).unwrap();
    let r = wait_for("ferro-dns restarted by its watchdog", Duration::from_secs(180), || {
        let n: u32 = m.prop("ferro-dns", "NRestarts").ok()?.parse().ok()?;
        let active = m.prop("ferro-dns", "ActiveState").ok()? == "active";
        let status = m.prop("ferro-dns", "StatusText").ok()?;
        (n > restarts && active && status == "informers synced; answering" && m.prop("ferro-dns", "MainPID").ok()? != pid).then_some(())
    });
    let text = journal(&m, "ferro-dns");
    if let Err(e) = r {
        panic!("{e:#}\njournal of ferro-dns:\n{text}");
    }
    assert!(text.contains("Watchdog timeout"), "restarted by the watchdog, not for another reason:\n{text}");
    assert!(text.contains("liveness check failed"), "the stall was its liveness check's:\n{text}");
    std::fs::remove_dir_all(&dropin).unwrap();
    m.ok(&["systemctl", "daemon-reload"]).unwrap();
    for (u, _) in UNITS.iter().rev() {
        stop(&m, u);
    }

    // invalid configuration: a bad flag in an env file (exit status 2, not restarted) and a
    // KubeletConfiguration that does not parse (a few restarts, then failed for good)
    std::fs::write(root.join("etc/ferro/proxy.env"), "FERRO_PROXY_ARGS=\"--proxy-mode bogus\"\n").unwrap();
    let restarts = fails_with_reason(&m, "ferro-proxy", "invalid value 'bogus' for '--proxy-mode");
    assert_eq!(restarts, 0, "a bad flag is not retried (RestartPreventExitStatus=2)");
    std::fs::write(root.join("etc/ferro/agent-config.yaml"), "kind: KubeletConfiguration\nmaxPods: many\n").unwrap();
    let restarts = fails_with_reason(&m, "ferro-agent", "parsing /etc/ferro/agent-config.yaml: maxPods: invalid type");
    // StartLimitBurst=5 starts in StartLimitIntervalSec=120 (the earlier starts of this test
    // count too): then systemd gives up
    assert!(restarts <= 5, "StartLimitBurst=5 ends the restarts ({restarts})");
    let result = m.prop("ferro-agent", "Result").unwrap();
    assert!(["exit-code", "start-limit-hit"].contains(&result.as_str()), "ferro-agent: {result}");

    m.shutdown().unwrap();
    drop(m);

    // --uninstall removes what the installer put there; the state stays
    let out = install(root, &["--uninstall"]);
    assert!(out.contains("uninstalled"), "{out}");
    for (u, _) in UNITS {
        assert!(!root.join("usr/local/bin").join(u).exists(), "{u} still installed");
        assert!(!root.join("etc/systemd/system").join(format!("{u}.service")).exists());
    }
    assert!(!root.join("etc/ferro").exists(), "/etc/ferro left behind");
    assert!(root.join("var/lib/ferro/control-plane").exists(), "the store stays");
}
