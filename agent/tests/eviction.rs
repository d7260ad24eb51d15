//! Node-pressure eviction in the lab (real ferro-control-plane, containerd + runc, ferro-agent).
//! Disk: the agent's root dir on a small loop-mounted ext4, a pod filling its emptyDir until the
//! node's file system crosses the nodefs.available threshold (nothing of the machine's own disk
//! is at risk: the file system is a 64 MiB file under /var/tmp). Memory: a memory.available
//! threshold set 400 MiB below what the machine has available when the test starts, crossed by
//! a pod filling an 800 MiB memory-backed emptyDir. Needs root.
#![allow(clippy::unwrap_used)]

mod lab;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use lab::{Lab, BUSYBOX};
use serde_json::Value;

const MIN: Duration = Duration::from_secs(60);

fn ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A mount made inside containerd's mount namespace (where the agent and runc run), undone on
/// drop while containerd still runs.
struct NsMount {
    pid: String,
    path: PathBuf,
}

impl NsMount {
    fn new(pid: u32, dev: &str, path: &Path) -> NsMount {
        let pid = pid.to_string();
        ok(Command::new("nsenter").args(["--target", &pid, "--mount", "--", "mount", dev]).arg(path));
        NsMount { pid, path: path.to_path_buf() }
    }
}

impl Drop for NsMount {
    fn drop(&mut self) {
        let out = Command::new("nsenter").args(["--target", &self.pid, "--mount", "--", "umount", "-l"]).arg(&self.path).output();
        if !out.is_ok_and(|o| o.status.success()) {
            eprintln!("unmounting {} in containerd's mount namespace failed", self.path.display());
        }
    }
}

fn condition(obj: &Value, t: &str) -> Option<String> {
    obj["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == t)?["status"].as_str().map(str::to_string)
}

#[test]
#[ignore = "privileged: needs root, containerd and loop devices; run by scripts/test.sh"]
fn disk_pressure_evicts_the_pod_filling_the_node_file_system() {
    let mut lab = Lab::start("evict");
    // Declared after the lab: dropped (unmounted, detached) before it, while containerd runs.
    let scratch = ferro_lab::storage::Scratch::new("ferro-evict-").unwrap();
    let img = scratch.path().join("nodefs.img");
    std::fs::File::create(&img).unwrap().set_len(64 << 20).unwrap();
    let dev = ok(Command::new("losetup").args(["--find", "--show"]).arg(&img));
    ok(Command::new("mkfs.ext4").args(["-q", "-F", &dev]));
    let root = scratch.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let _mounted = NsMount::new(lab.ctrd.pid().unwrap(), &dev, &root);

    // The agent again, on that file system, with a threshold the filler crosses.
    lab.agent.kill();
    lab.write_agent_config("evictionHard:\n  nodefs.available: 30%\nevictionPressureTransitionPeriod: 5s\n");
    lab.agent_root = Some(root.clone());
    lab.start_agent();
    lab.wait("the node Ready again", MIN, |l| {
        let n: Value = serde_json::from_str(&l.kubectl_ok(&["get", "node", lab::NODE, "-o", "json"])).ok()?;
        (condition(&n, "Ready").as_deref() == Some("True") && condition(&n, "DiskPressure").as_deref() == Some("False")).then_some(())
    });

    let pod = |name: &str, script: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  terminationGracePeriodSeconds: 5\n  volumes:\n  - name: data\n    emptyDir: {{}}\n  containers:\n  - name: app\n    image: {BUSYBOX}\n    command: [sh, -c, '{script}']\n    volumeMounts:\n    - {{name: data, mountPath: /data}}\n"
        )
    };
    lab.apply(&pod("bystander", "echo here > /data/x; exec sleep 3600"));
    lab.wait_pod("bystander", "Running", MIN, |p| p["status"]["phase"] == "Running");
    lab.apply(&pod("filler", "dd if=/dev/zero of=/data/fill bs=1M count=40; exec sleep 3600"));

    let evicted = lab.wait_pod("filler", "evicted", Duration::from_secs(120), |p| p["status"]["phase"] == "Failed");
    let st = &evicted["status"];
    assert_eq!(st["reason"], "Evicted", "{st}");
    let msg = st["message"].as_str().unwrap();
    assert!(msg.starts_with("The node was low on resource: ephemeral-storage. Threshold quantity: "), "{msg}");
    assert!(msg.contains("Pod was using ") && msg.contains("has larger consumption of ephemeral-storage"), "{msg}");
    let dt = st["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "DisruptionTarget").cloned();
    let dt = dt.unwrap_or_else(|| panic!("no DisruptionTarget condition: {st}"));
    assert_eq!((dt["status"].as_str(), dt["reason"].as_str()), (Some("True"), Some("TerminationByKubelet")));
    let log = lab::plain(&lab.agent_log());
    assert!(log.lines().any(|l| l.contains("node pressure changed") && l.contains("disk=true")), "no DiskPressure\n{log}");

    // The evicted pod's emptyDir is released, which relieves the pressure; the condition clears
    // after the transition period; the bystander kept running.
    let uid = evicted["metadata"]["uid"].as_str().unwrap().to_string();
    lab.wait("the evicted pod's volumes released", MIN, |_| (!root.join("pods").join(&uid).join("volumes").exists()).then_some(()));
    lab.wait("DiskPressure False again", MIN, |l| {
        let n: Value = serde_json::from_str(&l.kubectl_ok(&["get", "node", lab::NODE, "-o", "json"])).ok()?;
        (condition(&n, "DiskPressure").as_deref() == Some("False")).then_some(())
    });
    let b = lab.pod("bystander").unwrap();
    assert_eq!(b["status"]["phase"], "Running", "{}", b["status"]);
    assert_eq!(b["status"]["containerStatuses"][0]["restartCount"], 0);
    lab.kubectl_ok(&["delete", "pod", "bystander", "filler", "--wait=true", "--timeout=60s"]);
    lab.wait("no containers left", MIN, |l| l.ctrd.ctr(&["containers", "ls", "-q"]).unwrap().trim().is_empty().then_some(()));
}

fn mem_available_mib() -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kib: u64 = text.lines().find_map(|l| l.strip_prefix("MemAvailable:")).unwrap().trim().trim_end_matches("kB").trim().parse().unwrap();
    kib / 1024
}

#[test]
#[ignore = "privileged: needs root and containerd; run by scripts/test.sh"]
fn memory_pressure_evicts_the_pod_holding_the_most_memory() {
    let mut lab = Lab::start("evictmem");
    // A memory.available threshold 1.5 GiB below what the machine has available now: a pod
    // holding 3 GiB (a memory-backed emptyDir it fills) crosses it; the machine keeps all but
    // those 3 GiB. The margin is what other processes may take meanwhile without a pressure
    // of their own evicting the bystander (a build next to the suite took 400 MiB once).
    let threshold = mem_available_mib().saturating_sub(1536);
    lab.agent.kill();
    lab.write_agent_config(&format!("evictionHard:\n  memory.available: {threshold}Mi\nevictionPressureTransitionPeriod: 5s\n"));
    lab.start_agent();
    let node_condition = |l: &Lab, t: &str| {
        let n: Value = serde_json::from_str(&l.kubectl_ok(&["get", "node", lab::NODE, "-o", "json"])).ok()?;
        condition(&n, t)
    };
    lab.wait("the node Ready without MemoryPressure", MIN, |l| {
        (node_condition(l, "Ready").as_deref() == Some("True") && node_condition(l, "MemoryPressure").as_deref() == Some("False")).then_some(())
    });
    lab.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: bystander\nspec:\n  terminationGracePeriodSeconds: 5\n  containers:\n  - name: app\n    image: {BUSYBOX}\n    command: [sleep, '3600']\n    resources:\n      requests: {{memory: 64Mi}}\n"
    ));
    lab.wait_pod("bystander", "Running", MIN, |p| p["status"]["phase"] == "Running");
    lab.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: hog\nspec:\n  terminationGracePeriodSeconds: 5\n  volumes:\n  - name: mem\n    emptyDir: {{medium: Memory, sizeLimit: 4Gi}}\n  containers:\n  - name: app\n    image: {BUSYBOX}\n    command: [sh, -c, 'dd if=/dev/zero of=/mem/fill bs=1M count=3072; exec sleep 3600']\n    volumeMounts:\n    - {{name: mem, mountPath: /mem}}\n"
    ));
    let evicted = lab.wait_pod("hog", "evicted", Duration::from_secs(120), |p| p["status"]["phase"] == "Failed");
    let st = &evicted["status"];
    assert_eq!(st["reason"], "Evicted", "{st}");
    let msg = st["message"].as_str().unwrap();
    assert!(msg.starts_with("The node was low on resource: memory. Threshold quantity: "), "{msg}");
    assert!(msg.contains("has larger consumption of memory"), "{msg}");
    let log = lab::plain(&lab.agent_log());
    assert!(log.lines().any(|l| l.contains("node pressure changed") && l.contains("memory=true")), "no MemoryPressure\n{log}");
    // The hog's tmpfs goes with its volumes; the pressure clears after the transition period.
    lab.wait("MemoryPressure False again", MIN, |l| (node_condition(l, "MemoryPressure").as_deref() == Some("False")).then_some(()));
    let b = lab.pod("bystander").unwrap();
    assert_eq!(b["status"]["phase"], "Running", "{}", b["status"]);
    assert_eq!(b["status"]["containerStatuses"][0]["restartCount"], 0);
    lab.kubectl_ok(&["delete", "pod", "bystander", "hog", "--wait=true", "--timeout=60s"]);
    lab.wait("no containers left", MIN, |l| l.ctrd.ctr(&["containers", "ls", "-q"]).unwrap().trim().is_empty().then_some(()));
}

/// PID pressure: a pid.available threshold of pid_max (met whatever the machine runs, never by
/// the machine's own processes at risk) set once two BestEffort pods of equal priority run;
/// the pod with more processes (counted in its cgroup) is evicted first, with upstream's
/// message, and the node shows PIDPressure. The busy pod is the one the agent would take last
/// without the counts (equal pods keep the order of their UIDs, smallest first).
#[test]
#[ignore = "privileged: needs root and containerd; run by scripts/test.sh"]
fn pid_pressure_evicts_the_pod_with_the_most_processes_first() {
    let mut lab = Lab::start("evictpid");
    let pod = |name: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: app\n    image: {BUSYBOX}\n    command: [sleep, '3600']\n"
        )
    };
    let mut uids = Vec::new();
    for name in ["one", "two"] {
        lab.apply(&pod(name));
        let p = lab.wait_pod(name, "Running", MIN, |p| p["status"]["phase"] == "Running");
        uids.push((p["metadata"]["uid"].as_str().unwrap().to_string(), name));
    }
    uids.sort();
    let (busy, quiet) = (uids[1].1, uids[0].1);
    // 20 more processes in the busy pod: they outlive the exec's shell, and hold none of its
    // streams (else the exec would not end)
    lab.kubectl_ok(&["exec", busy, "--", "sh", "-c", "for i in $(seq 20); do sleep 3600 </dev/null >/dev/null 2>&1 & done"]);
    let procs = lab.kubectl_ok(&["exec", busy, "--", "sh", "-c", "ps -o comm | grep -c sleep"]);
    assert!(procs.trim().parse::<u32>().unwrap() >= 21, "{procs}");

    lab.agent.kill();
    // a threshold of pid_max itself: met while any process exists (100% would switch the
    // signal off, as upstream's)
    let pid_max = std::fs::read_to_string("/proc/sys/kernel/pid_max").unwrap();
    lab.write_agent_config(&format!("evictionHard:\n  pid.available: \"{}\"\nevictionPressureTransitionPeriod: 5s\n", pid_max.trim()));
    lab.start_agent();
    let evicted = lab.wait_pod(busy, "evicted", Duration::from_secs(120), |p| p["status"]["phase"] == "Failed");
    let st = &evicted["status"];
    assert_eq!(st["reason"], "Evicted", "{st}");
    let msg = st["message"].as_str().unwrap();
    assert!(msg.starts_with("The node was low on resource: pids. Threshold quantity: "), "{msg}");
    // the node's status is written by its own loop (every 10 s, or at once when the
    // eviction manager reports a change): it can come after the eviction's pod status
    lab.wait("PIDPressure True on the node", MIN, |l| {
        let node: Value = serde_json::from_str(&l.kubectl_ok(&["get", "node", lab::NODE, "-o", "json"])).ok()?;
        (condition(&node, "PIDPressure").as_deref() == Some("True")).then_some(())
    });
    // the quiet pod went after the busy one, if at all yet (one pod per round, the next round
    // after the evicted pod's cleanup): by the times of their DisruptionTarget conditions
    let since = |p: &Value| {
        p["status"]["conditions"].as_array().and_then(|cs| cs.iter().find(|c| c["type"] == "DisruptionTarget")).and_then(|c| c["lastTransitionTime"].as_str().map(str::to_string))
    };
    let busy_at = since(&evicted).unwrap_or_else(|| panic!("no DisruptionTarget on {busy}: {st}"));
    if let Some(quiet_at) = lab.pod(quiet).as_ref().and_then(since) {
        assert!(quiet_at >= busy_at, "{quiet} evicted at {quiet_at}, before {busy} at {busy_at}");
    }
    let log = lab::plain(&lab.agent_log());
    assert!(log.lines().any(|l| l.contains("node pressure changed") && l.contains("pid=true")), "no PIDPressure\n{log}");
    lab.kubectl_ok(&["delete", "pod", "one", "two", "--wait=true", "--timeout=60s"]);
    lab.wait("no containers left", MIN, |l| l.ctrd.ctr(&["containers", "ls", "-q"]).unwrap().trim().is_empty().then_some(()));
}

/// Bytes available on containerd's root (the image filesystem, mounted in containerd's mount
/// namespace only), as statvfs says: `stat -f` run there.
fn image_fs_available(lab: &Lab) -> u64 {
    let pid = lab.ctrd.pid().unwrap().to_string();
    let root = lab.ctrd.dir().join("root");
    let out = ok(Command::new("nsenter").args(["--target", &pid, "--mount", "--", "stat", "-f", "-c", "%a %S"]).arg(&root));
    let mut f = out.split_whitespace().map(|n| n.parse::<u64>().unwrap());
    f.next().unwrap() * f.next().unwrap()
}

/// `ctr images ls -q` of the CRI namespace.
fn image_names(lab: &Lab) -> Vec<String> {
    lab.ctrd.ctr(&["images", "ls", "-q"]).unwrap().lines().map(str::to_string).collect()
}

/// imagefs.available on a dedicated image filesystem (containerd's root on 256 MiB of its own,
/// the agent's root dir on the host's): a threshold between what is available with an unused
/// 40 MiB image and without it. The agent removes the unused image before evicting anything
/// (upstream's node-level reclaim, with periodic image GC off), sees the pressure relieved and
/// evicts no pod; busybox (in use) and pause (the sandbox image) stay, DiskPressure was set.
#[test]
#[ignore = "privileged: needs root, containerd and loop devices; run by scripts/test.sh"]
fn image_pressure_removes_unused_images_instead_of_evicting() {
    const UNUSED: &str = "registry.ferro.test/filler:1";
    let mut lab = Lab::start_on("evictimg", lab::NO_IMAGE_GC, None, Some(256 << 20));
    lab.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: keep\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: app\n    image: {BUSYBOX}\n    imagePullPolicy: Never\n    command: [sleep, '3600']\n"
    ));
    let pod = lab.wait_pod("keep", "Running", MIN, |p| p["status"]["phase"] == "Running");
    let container = pod["status"]["containerStatuses"][0]["containerID"].as_str().unwrap().to_string();

    // An image nobody uses, of 40 MiB of random bytes (its layer does not compress).
    let before = image_fs_available(&lab);
    let work = lab.dir.path().join("images").join("filler");
    let rootfs = work.join("rootfs");
    std::fs::create_dir_all(&rootfs).unwrap();
    let mut random = std::io::Read::take(std::fs::File::open("/dev/urandom").unwrap(), 40 << 20);
    std::io::copy(&mut random, &mut std::fs::File::create(rootfs.join("filler.bin")).unwrap()).unwrap();
    let tar = ferro_lab::images::image(&work, "filler", &rootfs, &["/nothing"], &[], UNUSED).unwrap();
    lab.ctrd.import(&tar).unwrap();
    let with_image = image_fs_available(&lab);
    assert!(before > with_image + (40 << 20), "the image takes at least 40 MiB: {before} -> {with_image}");
    // Met with the image, not without it (what it takes, halved, as the margin either way).
    let threshold = with_image + (before - with_image) / 2;

    lab.agent.kill();
    lab.write_agent_config(&format!(
        "imageGCHighThresholdPercent: 100\nimageMinimumGCAge: 0s\nevictionHard:\n  imagefs.available: \"{threshold}\"\n"
    ));
    lab.start_agent();
    lab.wait("the unused image to be removed", Duration::from_secs(120), |l| (!image_names(l).iter().any(|n| n == UNUSED)).then_some(()));
    lab.wait("the agent to find the pressure relieved", MIN, |l| {
        lab::plain(&l.agent_log()).contains("able to reduce resource pressure without evicting pods").then_some(())
    });
    let log = lab::plain(&lab.agent_log());
    assert!(log.lines().any(|l| l.contains("removed unused image to relieve disk pressure") && l.contains(UNUSED)), "{log}");
    assert!(log.lines().any(|l| l.contains("node pressure changed") && l.contains("disk=true")), "no DiskPressure\n{log}");
    assert!(!log.contains("eviction threshold met"), "no pod is evicted\n{log}");
    assert!(image_fs_available(&lab) > threshold, "relieved on the file system too");
    let names = image_names(&lab);
    assert!(names.iter().any(|n| n == BUSYBOX) && names.iter().any(|n| n == ferro_lab::images::PAUSE_IMAGE), "{names:?}");
    // The threshold was met: DiskPressure, held for the transition period (5 min).
    lab.wait("DiskPressure on the node", MIN, |l| {
        let n: Value = serde_json::from_str(&l.kubectl_ok(&["get", "node", lab::NODE, "-o", "json"])).ok()?;
        (condition(&n, "DiskPressure").as_deref() == Some("True")).then_some(())
    });
    let pod = lab.pod("keep").unwrap();
    assert_eq!(pod["status"]["phase"], "Running", "{}", pod["status"]);
    assert_eq!(pod["status"]["containerStatuses"][0]["containerID"], container.as_str());
    assert_eq!(pod["status"]["containerStatuses"][0]["restartCount"], 0);
    lab.kubectl_ok(&["delete", "pod", "keep", "--wait=true", "--timeout=60s"]);
    lab.wait("no containers left", MIN, |l| l.ctrd.ctr(&["containers", "ls", "-q"]).unwrap().trim().is_empty().then_some(()));
}

/// imagefs.available on a dedicated image filesystem (containerd's root on 256 MiB of its own)
/// where the space went to a finished pod: its container wrote 40 MiB of random bytes into its
/// writable layer and exited 0. The threshold sits between what is available with that dead
/// container and without it. The agent removes the finished pod's container and sandbox
/// before evicting anything (upstream's node-level reclaim, DeleteAllUnusedContainers), sees
/// the pressure relieved and evicts no pod: the running pod keeps its container, the finished
/// pod stays Succeeded with its terminated container's status.
#[test]
#[ignore = "privileged: needs root, containerd and loop devices; run by scripts/test.sh"]
fn disk_pressure_removes_the_containers_of_finished_pods_instead_of_evicting() {
    let mut lab = Lab::start_on("evictctr", lab::NO_IMAGE_GC, None, Some(256 << 20));
    lab.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: keep\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: app\n    image: {BUSYBOX}\n    imagePullPolicy: Never\n    command: [sleep, '3600']\n"
    ));
    let pod = lab.wait_pod("keep", "Running", MIN, |p| p["status"]["phase"] == "Running");
    let kept = pod["status"]["containerStatuses"][0]["containerID"].as_str().unwrap().to_string();
    let before = image_fs_available(&lab);
    lab.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: done\nspec:\n  restartPolicy: Never\n  containers:\n  - name: fill\n    image: {BUSYBOX}\n    imagePullPolicy: Never\n    command: [sh, -c, 'head -c 41943040 /dev/urandom > /filler.bin']\n"
    ));
    let done = lab.wait_pod("done", "Succeeded", MIN, |p| p["status"]["phase"] == "Succeeded");
    let dead = done["status"]["containerStatuses"][0]["containerID"].as_str().unwrap().trim_start_matches("containerd://").to_string();
    let with_dead = image_fs_available(&lab);
    assert!(before > with_dead + (40 << 20), "the dead container's layer takes at least 40 MiB: {before} -> {with_dead}");
    let threshold = with_dead + (before - with_dead) / 2;

    lab.agent.kill();
    lab.write_agent_config(&format!("imageGCHighThresholdPercent: 100\nevictionHard:\n  imagefs.available: \"{threshold}\"\n"));
    lab.start_agent();
    lab.wait("the agent to find the pressure relieved", Duration::from_secs(120), |l| {
        lab::plain(&l.agent_log()).contains("able to reduce resource pressure without evicting pods").then_some(())
    });
    let log = lab::plain(&lab.agent_log());
    assert!(log.lines().any(|l| l.contains("removed the containers of a finished pod") && l.contains("default/done")), "{log}");
    assert!(!log.contains("eviction threshold met"), "no pod is evicted\n{log}");
    let containers = lab.ctrd.ctr(&["containers", "ls", "-q"]).unwrap();
    assert!(!containers.contains(&dead), "the dead container is gone: {containers}");
    assert!(containers.contains(kept.trim_start_matches("containerd://")), "the running one stays: {containers}");
    assert!(image_fs_available(&lab) > threshold, "relieved on the file system too");
    let names = image_names(&lab);
    assert!(names.iter().any(|n| n == BUSYBOX), "no image was needed: {names:?}");
    let pod = lab.pod("keep").unwrap();
    assert_eq!(pod["status"]["phase"], "Running", "{}", pod["status"]);
    assert_eq!(pod["status"]["containerStatuses"][0]["containerID"], kept.as_str());
    let done = lab.pod("done").unwrap();
    assert_eq!(done["status"]["phase"], "Succeeded", "{}", done["status"]);
    let term = &done["status"]["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(term["exitCode"], 0, "{}", done["status"]);
    lab.kubectl_ok(&["delete", "pod", "keep", "done", "--wait=true", "--timeout=60s"]);
    lab.wait("no containers left", MIN, |l| l.ctrd.ctr(&["containers", "ls", "-q"]).unwrap().trim().is_empty().then_some(()));
}
