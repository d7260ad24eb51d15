//! Persistent volumes end to end in the lab: ferro-csi (driver, provisioner, registration)
//! next to ferro-agent in containerd's namespaces; a pod with a WaitForFirstConsumer claim is
//! scheduled, its volume provisioned, staged and published, the pod writes to it; the data
//! survives the pod's deletion and is read by a new pod; deleting the claim removes the volume,
//! its loop device and its backing file. Driven by kubectl. Needs root and the lab's packages.
#![allow(clippy::unwrap_used)]

mod lab;

use std::time::Duration;

use ferro_lab::storage::Scratch;
use lab::{Lab, BUSYBOX};
use serde_json::Value;

const MIN: Duration = Duration::from_secs(60);

fn phase(p: &Value) -> &str {
    p["status"]["phase"].as_str().unwrap_or("")
}

fn pod_with_claim(name: &str, claim: &str, script: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  terminationGracePeriodSeconds: 1\n  securityContext:\n    fsGroup: 2000\n  volumes:\n  - name: data\n    persistentVolumeClaim:\n      claimName: {claim}\n  containers:\n  - name: app\n    image: {BUSYBOX}\n    command: [\"sh\", \"-c\", {script:?}]\n    volumeMounts:\n    - {{name: data, mountPath: /data}}\n"
    )
}

/// Mount points under `dir` as containerd's mount namespace sees them.
fn mounts_under(lab: &Lab, dir: &std::path::Path) -> Vec<String> {
    let pid = lab.ctrd.pid().unwrap();
    let text = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    text.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|t| t.starts_with(dir.to_str().unwrap()))
        .map(String::from)
        .collect()
}

#[test]
#[ignore = "privileged: needs root, containerd and loop devices; run by scripts/test.sh"]
fn a_claimed_volume_is_provisioned_mounted_and_outlives_its_pod() {
    // Declared first, dropped last: after the lab (and its mount namespace) is gone, any loop
    // device left on a backing file under it is detached.
    let scratch = Scratch::new("ferro-agent-csi-").unwrap();
    let mut lab = Lab::start("csi");
    let data = scratch.path().join("csi");
    let mut csi = lab.start_csi(&data, "1Gi");
    let csi_log_path = lab.dir.path().join("csi.log");
    let csi_log = || std::fs::read_to_string(&csi_log_path).unwrap_or_default();
    lab.wait_csi_registered();
    lab.apply("apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata:\n  name: loop\nprovisioner: loop.csi.ferro.dev\nvolumeBindingMode: WaitForFirstConsumer\nreclaimPolicy: Delete\n");
    lab.apply("apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: data\nspec:\n  storageClassName: loop\n  accessModes: [ReadWriteOnce]\n  resources:\n    requests:\n      storage: 64Mi\n");
    lab.apply(&pod_with_claim("writer", "data", "echo kept > /data/f && sleep 3600"));
    lab.wait_pod("writer", "Running", MIN, |p| phase(p) == "Running");
    let out = lab.kubectl_ok(&["exec", "writer", "--", "cat", "/data/f"]);
    assert_eq!(out.trim(), "kept");
    // A filesystem of the volume's size, owned by the pod's fsGroup.
    let df = lab.kubectl_ok(&["exec", "writer", "--", "sh", "-c", "df -k /data | tail -1; stat -c %g /data"]);
    assert!(df.contains("/data"), "{df}");
    assert!(df.trim().ends_with("2000"), "fsGroup not applied: {df}");
    // kubelet_volume_stats_* from the driver's NodeGetVolumeStats, labelled by the claim.
    let gauge = |m: &str, name: &str| -> Option<i64> {
        let key = format!("{name}{{namespace=\"default\",persistentvolumeclaim=\"data\"}} ");
        m.lines().find_map(|l| l.strip_prefix(key.as_str()))?.trim().parse().ok()
    };
    let m = lab.wait("the claim's volume stats in the agent's metrics", MIN, |l| {
        let m = l.agent_metrics();
        gauge(&m, "kubelet_volume_stats_used_bytes").is_some_and(|u| u > 0).then_some(m)
    });
    let (cap, avail, used) = (
        gauge(&m, "kubelet_volume_stats_capacity_bytes").unwrap(),
        gauge(&m, "kubelet_volume_stats_available_bytes").unwrap(),
        gauge(&m, "kubelet_volume_stats_used_bytes").unwrap(),
    );
    assert!(cap > 32 << 20 && cap <= 64 << 20 && avail < cap && used < cap, "{m}");
    assert!(gauge(&m, "kubelet_volume_stats_inodes").unwrap() > 0, "{m}");
    assert_eq!(gauge(&m, "kubelet_volume_stats_health_status_abnormal"), Some(0), "{m}");
    let agent_root = lab.dir.path().join("agent");
    let mounts = mounts_under(&lab, &agent_root);
    assert!(mounts.iter().any(|m| m.ends_with("/globalmount")), "{mounts:?}");
    assert!(mounts.iter().any(|m| m.contains("/volumes/kubernetes.io~csi/") && m.ends_with("/mount")), "{mounts:?}");

    // kill -9 of the agent, then of ferro-csi, while the pod uses the volume: nothing changes
    // for the pod; the restarted ones take over (the agent re-registers the driver from its
    // socket, ferro-csi finds its volumes in its journal).
    lab.agent.kill();
    lab.start_agent();
    csi.kill();
    let mut csi = lab.start_csi(&data, "1Gi");
    lab.wait("the restarted agent to sync the pod", MIN, |l| {
        let out = l.kubectl(&["exec", "writer", "--", "sh", "-c", "echo more >> /data/f && cat /data/f"]);
        (String::from_utf8_lossy(&out.stdout) == "kept\nmore\n").then_some(())
    });
    let p = lab.pod("writer").unwrap();
    assert_eq!(p["status"]["containerStatuses"][0]["restartCount"], 0, "the restarts touched the container");

    // The pod goes: its volume is unpublished and unstaged, the data stays.
    lab.kubectl_ok(&["delete", "pod", "writer", "--wait=true", "--timeout=60s"]);
    lab.wait("the volume unstaged", MIN, |l| mounts_under(l, &agent_root).is_empty().then_some(()));
    // Detached at unstage (the kernel lets a device go at its last close: wait for it).
    lab.wait("the loop device detached", MIN, |_| scratch.loops().is_empty().then_some(()));
    lab.apply(&pod_with_claim("reader", "data", "cat /data/f; sleep 3600"));
    lab.wait_pod("reader", "Running", MIN, |p| phase(p) == "Running");
    assert_eq!(lab.kubectl_ok(&["exec", "reader", "--", "cat", "/data/f"]), "kept\nmore\n", "{}", csi_log());
    lab.kubectl_ok(&["delete", "pod", "reader", "--wait=true", "--timeout=60s"]);

    // The claim goes: the volume, its loop device and backing file go (reclaim policy Delete).
    lab.kubectl_ok(&["delete", "pvc", "data", "--wait=false"]);
    lab.wait("the PV deleted", MIN, |l| {
        let out = l.kubectl(&["get", "pv", "-o", "name"]);
        String::from_utf8_lossy(&out.stdout).trim().is_empty().then_some(())
    });
    let volumes: Vec<_> = std::fs::read_dir(data.join("volumes")).unwrap().flatten().collect();
    assert!(volumes.is_empty(), "volumes left: {volumes:?}\n{}", csi_log());
    assert!(mounts_under(&lab, &agent_root).is_empty());
    lab.wait_nothing_left();
    csi.kill();
}

#[test]
#[ignore = "privileged: needs root, containerd and loop devices; run by scripts/test.sh"]
fn a_claim_grown_while_its_pod_runs_grows_the_mounted_filesystem() {
    let scratch = Scratch::new("ferro-agent-csi-grow-").unwrap();
    let lab = Lab::start("csigrow");
    let mut csi = lab.start_csi(&scratch.path().join("csi"), "2Gi");
    lab.wait_csi_registered();
    // XFS: it grows online with CAP_SYS_ADMIN alone (ext4 online growth needs
    // CAP_SYS_RESOURCE, which this machine's root lacks; ext4 then grows at the next stage).
    lab.apply("apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata:\n  name: loop-xfs\nprovisioner: loop.csi.ferro.dev\nvolumeBindingMode: WaitForFirstConsumer\nallowVolumeExpansion: true\nparameters:\n  csi.storage.k8s.io/fstype: xfs\n");
    lab.apply("apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: grow\nspec:\n  storageClassName: loop-xfs\n  accessModes: [ReadWriteOnce]\n  resources:\n    requests:\n      storage: 300Mi\n");
    lab.apply(&pod_with_claim("app", "grow", "echo before > /data/f && sleep 3600"));
    lab.wait_pod("app", "Running", MIN, |p| phase(p) == "Running");
    let size_kib = |l: &Lab| -> u64 {
        let out = l.kubectl_ok(&["exec", "app", "--", "sh", "-c", "df -k /data | tail -1"]);
        out.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or(0)
    };
    let before = size_kib(&lab);
    assert!(before > 200 * 1024 && before < 300 * 1024, "{before} KiB");
    lab.kubectl_ok(&["patch", "pvc", "grow", "--type=merge", "-p", r#"{"spec":{"resources":{"requests":{"storage":"600Mi"}}}}"#]);
    lab.wait("the claim's status to say 600Mi", MIN, |l| {
        let out = l.kubectl(&["get", "pvc", "grow", "-o", "jsonpath={.status.capacity.storage} {.status.conditions[*].type}"]);
        (String::from_utf8_lossy(&out.stdout).trim() == "600Mi").then_some(())
    });
    let after = size_kib(&lab);
    assert!(after > 500 * 1024, "the mounted filesystem did not grow: {before} -> {after} KiB");
    assert_eq!(lab.kubectl_ok(&["exec", "app", "--", "cat", "/data/f"]).trim(), "before");
    let pv = lab.kubectl_ok(&["get", "pvc", "grow", "-o", "jsonpath={.spec.volumeName}"]);
    assert_eq!(lab.kubectl_ok(&["get", "pv", &pv, "-o", "jsonpath={.spec.capacity.storage}"]), "600Mi");
    let p = lab.pod("app").unwrap();
    assert_eq!(p["status"]["containerStatuses"][0]["restartCount"], 0);
    lab.kubectl_ok(&["delete", "pod", "app", "--wait=true", "--timeout=60s"]);
    lab.kubectl_ok(&["delete", "pvc", "grow", "--wait=false"]);
    lab.wait("the PV deleted", MIN, |l| {
        let out = l.kubectl(&["get", "pv", "-o", "name"]);
        String::from_utf8_lossy(&out.stdout).trim().is_empty().then_some(())
    });
    lab.wait_nothing_left();
    csi.kill();
}

#[test]
#[ignore = "privileged: needs root, containerd and loop devices; run by scripts/test.sh"]
fn a_raw_block_claim_is_a_block_device_in_the_container() {
    let scratch = Scratch::new("ferro-agent-csi-block-").unwrap();
    let lab = Lab::start("csiblock");
    let mut csi = lab.start_csi(&scratch.path().join("csi"), "1Gi");
    lab.wait_csi_registered();
    lab.apply("apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata:\n  name: loop\nprovisioner: loop.csi.ferro.dev\nvolumeBindingMode: WaitForFirstConsumer\n");
    lab.apply("apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: raw\nspec:\n  storageClassName: loop\n  volumeMode: Block\n  accessModes: [ReadWriteOnce]\n  resources:\n    requests:\n      storage: 8Mi\n");
    lab.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: raw\nspec:\n  terminationGracePeriodSeconds: 1\n  volumes:\n  - name: dev\n    persistentVolumeClaim: {{claimName: raw}}\n  containers:\n  - name: app\n    image: {BUSYBOX}\n    command: [\"sh\", \"-c\", \"echo raw-bytes | dd of=/dev/xvda bs=512 conv=sync 2>/dev/null && sleep 3600\"]\n    volumeDevices:\n    - {{name: dev, devicePath: /dev/xvda}}\n"
    ));
    lab.wait_pod("raw", "Running", MIN, |p| phase(p) == "Running");
    // Through sh: the image links few applets, busybox's sh runs all of them.
    let kind = lab.kubectl_ok(&["exec", "raw", "--", "sh", "-c", "stat -c %F /dev/xvda"]);
    assert_eq!(kind.trim(), "block special file");
    let size = lab.kubectl_ok(&["exec", "raw", "--", "sh", "-c", "wc -c < /dev/xvda"]);
    assert_eq!(size.trim(), (8u64 << 20).to_string());
    let head = lab.kubectl_ok(&["exec", "raw", "--", "sh", "-c", "head -c 9 /dev/xvda"]);
    assert_eq!(head, "raw-bytes");
    lab.kubectl_ok(&["delete", "pod", "raw", "--wait=true", "--timeout=60s"]);
    // The agent unpublishes and unstages as it cleans the pod up (after the API object goes).
    lab.wait("the loop device detached", MIN, |_| scratch.loops().is_empty().then_some(()));
    // The bytes are on the volume (its backing file), no filesystem was made.
    let disk = std::fs::read_dir(scratch.path().join("csi/volumes")).unwrap().flatten().next().unwrap().path().join("disk.img");
    let mut buf = [0u8; 9];
    std::io::Read::read_exact(&mut std::fs::File::open(&disk).unwrap(), &mut buf).unwrap();
    assert_eq!(&buf, b"raw-bytes");
    lab.kubectl_ok(&["delete", "pvc", "raw", "--wait=false"]);
    lab.wait("the PV deleted", MIN, |l| {
        let out = l.kubectl(&["get", "pv", "-o", "name"]);
        String::from_utf8_lossy(&out.stdout).trim().is_empty().then_some(())
    });
    lab.wait_nothing_left();
    csi.kill();
}
