//! Ctrl-C in the middle of building a lab (ferro_lab::interrupt): `ferro-lab cluster` gets a
//! SIGINT while its node is being started and removes what it had made: its processes, network
//! namespaces, mounts, loop devices and directories. Needs root; run by scripts/test.sh.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// The entries of `dir` whose name starts with `prefix`.
fn entries(dir: &str, prefix: &str) -> BTreeSet<PathBuf> {
    std::fs::read_dir(dir)
        .map(|d| d.flatten().filter(|e| e.file_name().to_string_lossy().starts_with(prefix)).map(|e| e.path()).collect())
        .unwrap_or_default()
}

fn netns_names() -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| l.split_whitespace().next()).map(String::from).collect()
}

/// Every live process below `root` (by parent pid), `root` excluded.
fn descendants(root: u32) -> BTreeSet<u32> {
    let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            // pid (comm) state ppid ...: comm may hold spaces, so split after its ')'
            let ppid = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()?;
            Some((pid, ppid))
        })
        .collect();
    let mut found = BTreeSet::from([root]);
    loop {
        let before = found.len();
        for (pid, ppid) in &parents {
            if found.contains(ppid) {
                found.insert(*pid);
            }
        }
        if found.len() == before {
            found.remove(&root);
            return found;
        }
    }
}

/// Whether `pid` is a live process (a zombie counts as gone).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next()) != Some("Z"))
}

fn mounts_under(dirs: &BTreeSet<PathBuf>) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| dirs.iter().any(|d| Path::new(m).starts_with(d)))
        .map(String::from)
        .collect()
}

fn loops_under(dirs: &BTreeSet<PathBuf>) -> Vec<String> {
    let out = Command::new("losetup").args(["--list", "--noheadings", "--output", "NAME,BACK-FILE"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.split_whitespace().nth(1).is_some_and(|f| dirs.iter().any(|d| Path::new(f).starts_with(d))))
        .map(String::from)
        .collect()
}

#[test]
#[ignore = "privileged: needs root, containerd and the workspace's binaries; run by scripts/test.sh"]
fn sigint_while_the_lab_starts_removes_what_it_made() {
    ferro_lab::require_root().unwrap();
    let tmp = std::env::temp_dir().display().to_string();
    let (dirs0, scratch0) = (entries(&tmp, "ferro-cluster-cli-"), entries("/var/tmp", "ferro-cluster-csi-node1-"));
    let out = tempfile::NamedTempFile::new().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_ferro-lab"))
        .args(["cluster", "--nodes", "1", "--pool-size", "64Mi"])
        .stdin(Stdio::null())
        .stdout(out.reopen().unwrap())
        .stderr(out.reopen().unwrap())
        .spawn()
        .unwrap();
    let pid = child.id();
    let log = || std::fs::read_to_string(out.path()).unwrap_or_default();
    // Ends the child if the test fails before it did.
    struct Reap(u32);
    impl Drop for Reap {
        fn drop(&mut self) {
            if std::thread::panicking() {
                let _ = kill(Pid::from_raw(i32::try_from(self.0).unwrap()), Signal::SIGKILL);
            }
        }
    }
    let _reap = Reap(pid);

    // The moment: the node's namespace exists, its ferro-csi pool is made (a loop device
    // mounted under /var/tmp), its containerd or agent is starting.
    let node_ns = format!("fclcli{pid}n1");
    let deadline = Instant::now() + Duration::from_secs(300);
    let (dirs, scratch) = loop {
        let dirs: BTreeSet<PathBuf> = entries(&tmp, "ferro-cluster-cli-").difference(&dirs0).cloned().collect();
        let scratch: BTreeSet<PathBuf> = entries("/var/tmp", "ferro-cluster-csi-node1-").difference(&scratch0).cloned().collect();
        if netns_names().contains(&node_ns) && !scratch.is_empty() && !dirs.is_empty() {
            break (dirs, scratch);
        }
        assert!(child.try_wait().unwrap().is_none(), "ferro-lab ended before the node started:\n{}", log());
        assert!(Instant::now() < deadline, "the node's namespace and pool never appeared:\n{}", log());
        std::thread::sleep(Duration::from_millis(50));
    };
    let procs = descendants(pid);
    assert!(!procs.is_empty(), "the control plane runs below ferro-lab");
    kill(Pid::from_raw(i32::try_from(pid).unwrap()), Signal::SIGINT).unwrap();

    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "ferro-lab still running 120 s after SIGINT:\n{}", log());
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = log();
    // interrupted during the start (the lab's next wait panics) or, if the start had just
    // finished, while waiting for the signal: both remove everything
    assert!(
        text.contains("interrupted by SIGINT") || text.contains("SIGINT: stopping the cluster"),
        "{status}:\n{text}"
    );
    let ours = |n: &String| n.starts_with(&format!("fclcli{pid}"));
    assert!(!netns_names().iter().any(ours), "namespaces left: {:?}\n{text}", netns_names());
    let left: Vec<u32> = procs.iter().copied().filter(|p| alive(*p)).collect();
    assert!(left.is_empty(), "processes left: {left:?}\n{text}");
    let made: BTreeSet<PathBuf> = dirs.union(&scratch).cloned().collect();
    assert_eq!(mounts_under(&made), Vec::<String>::new(), "{text}");
    assert_eq!(loops_under(&made), Vec::<String>::new(), "{text}");
    let remaining: Vec<&PathBuf> = made.iter().filter(|d| d.exists()).collect();
    assert!(remaining.is_empty(), "directories left: {remaining:?}\n{text}");
}
