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
    lab.assert_csi_refused_nothing();
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
    lab.assert_csi_refused_nothing();
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
    lab.assert_csi_refused_nothing();
    csi.kill();
}

/// The `kubectl get -o jsonpath` of one object, trimmed.
fn field(lab: &Lab, what: &[&str], path: &str) -> String {
    let mut args: Vec<&str> = vec!["get"];
    args.extend_from_slice(what);
    let jp = format!("jsonpath={path}");
    args.extend_from_slice(&["-o", &jp]);
    String::from_utf8_lossy(&lab.kubectl(&args).stdout).trim().to_string()
}

#[test]
#[ignore = "privileged: needs root, containerd and loop devices; run by scripts/test.sh"]
fn a_snapshot_of_a_claim_restores_into_a_new_claim_with_the_data_of_that_moment() {
    let scratch = Scratch::new("ferro-agent-csi-snap-").unwrap();
    let lab = Lab::start("csisnap");
    let data = scratch.path().join("csi");
    let mut csi = lab.start_csi(&data, "1Gi");
    let csi_log_path = lab.dir.path().join("csi.log");
    let csi_log = || std::fs::read_to_string(&csi_log_path).unwrap_or_default();
    lab.wait_csi_registered();
    lab.apply("apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata:\n  name: loop\nprovisioner: loop.csi.ferro.dev\nvolumeBindingMode: WaitForFirstConsumer\nreclaimPolicy: Delete\n");
    lab.apply("apiVersion: snapshot.storage.k8s.io/v1\nkind: VolumeSnapshotClass\nmetadata:\n  name: loop\n  annotations:\n    snapshot.storage.kubernetes.io/is-default-class: \"true\"\ndriver: loop.csi.ferro.dev\ndeletionPolicy: Delete\n");
    lab.apply("apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: data\nspec:\n  storageClassName: loop\n  accessModes: [ReadWriteOnce]\n  resources:\n    requests:\n      storage: 64Mi\n");
    lab.apply(&pod_with_claim("writer", "data", "echo at-snapshot > /data/f && sync && sleep 3600"));
    lab.wait_pod("writer", "Running", MIN, |p| phase(p) == "Running");
    lab.wait("the file written", MIN, |l| {
        let out = l.kubectl(&["exec", "writer", "--", "cat", "/data/f"]);
        (String::from_utf8_lossy(&out.stdout) == "at-snapshot\n").then_some(())
    });

    // Bad input first: both sources: refused by the API with the CRD rule's message,
    // nothing stored.
    let both = lab.kubectl_stdin(
        &["apply", "-f", "-"],
        "apiVersion: snapshot.storage.k8s.io/v1\nkind: VolumeSnapshot\nmetadata:\n  name: bad\nspec:\n  source:\n    persistentVolumeClaimName: data\n    volumeSnapshotContentName: x\n",
    );
    let err = String::from_utf8_lossy(&both.stderr);
    assert!(!both.status.success() && err.contains("Exactly one of persistentVolumeClaimName and volumeSnapshotContentName should be specified"), "{err}");
    // A snapshot of a claim that does not exist says so in its status and an event.
    lab.apply("apiVersion: snapshot.storage.k8s.io/v1\nkind: VolumeSnapshot\nmetadata:\n  name: orphan\nspec:\n  source:\n    persistentVolumeClaimName: nothing\n");
    lab.wait("the missing claim in the snapshot's status", MIN, |l| {
        field(l, &["volumesnapshot", "orphan"], "{.status.error.message}").contains("persistentvolumeclaim \"nothing\" not found").then_some(())
    });

    // The snapshot: the default class, a content taken by this node, ready.
    lab.apply("apiVersion: snapshot.storage.k8s.io/v1\nkind: VolumeSnapshot\nmetadata:\n  name: s1\nspec:\n  source:\n    persistentVolumeClaimName: data\n");
    lab.wait("the snapshot ready to use", MIN, |l| (field(l, &["volumesnapshot", "s1"], "{.status.readyToUse}") == "true").then_some(()));
    let uid = field(&lab, &["volumesnapshot", "s1"], "{.metadata.uid}");
    let content = format!("snapcontent-{uid}");
    assert_eq!(field(&lab, &["volumesnapshot", "s1"], "{.spec.volumeSnapshotClassName}"), "loop");
    assert_eq!(field(&lab, &["volumesnapshot", "s1"], "{.status.boundVolumeSnapshotContentName}"), content);
    assert_eq!(field(&lab, &["volumesnapshot", "s1"], "{.status.restoreSize}"), "64Mi");
    let handle = field(&lab, &["volumesnapshotcontent", &content], "{.status.snapshotHandle}");
    assert!(handle.starts_with("snap-"), "{handle}");
    assert_eq!(field(&lab, &["vsc", &content], "{.metadata.annotations.loop\\.csi\\.ferro\\.dev/node}"), lab::NODE);
    assert!(data.join("snapshots").join(&handle).join("disk.img").is_file(), "{}", csi_log());
    // kubectl get prints the CRDs' columns.
    let table = lab::plain(&lab.kubectl_ok(&["get", "vs", "s1"]));
    let header: Vec<&str> = table.lines().next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(header, ["NAME", "READYTOUSE", "SOURCEPVC", "SOURCESNAPSHOTCONTENT", "RESTORESIZE", "SNAPSHOTCLASS", "SNAPSHOTCONTENT", "CREATIONTIME", "AGE"]);
    let row: Vec<&str> = table.lines().nth(1).unwrap_or_default().split_whitespace().collect();
    assert_eq!(&row[..6], ["s1", "true", "data", "64Mi", "loop", content.as_str()], "{table}");
    // events are posted after the status they tell of: wait for the last one
    lab.wait("the snapshot's three events", MIN, |l| {
        let events = String::from_utf8_lossy(
            &l.kubectl(&["get", "events", "--field-selector", "involvedObject.name=s1", "-o", "jsonpath={.items[*].reason}"]).stdout,
        )
        .into_owned();
        ["CreatingSnapshot", "SnapshotCreated", "SnapshotReady"].iter().all(|r| events.contains(r)).then_some(())
    });
    // The claim was protected only while the snapshot was being taken.
    lab.wait("the claim's snapshot finalizer gone", MIN, |l| {
        (!field(l, &["pvc", "data"], "{.metadata.finalizers}").contains("pvc-as-source-protection")).then_some(())
    });

    // Written after the snapshot: not in what is restored.
    lab.kubectl_ok(&["exec", "writer", "--", "sh", "-c", "echo after >> /data/f"]);
    let restore = |name: &str, size: &str| {
        format!("apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: {name}\nspec:\n  storageClassName: loop\n  accessModes: [ReadWriteOnce]\n  resources:\n    requests:\n      storage: {size}\n  dataSource:\n    apiGroup: snapshot.storage.k8s.io\n    kind: VolumeSnapshot\n    name: s1\n")
    };
    lab.apply(&restore("restored", "128Mi"));
    lab.apply(&pod_with_claim("reader", "restored", "sleep 3600"));
    lab.wait_pod("reader", "Running", MIN, |p| phase(p) == "Running");
    assert_eq!(lab.kubectl_ok(&["exec", "reader", "--", "cat", "/data/f"]), "at-snapshot\n", "{}", csi_log());
    // Restored into a larger volume: the filesystem was grown to it.
    let df = lab.kubectl_ok(&["exec", "reader", "--", "sh", "-c", "df -k /data | tail -1"]);
    let kib: u64 = df.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or(0);
    assert!(kib > 100 * 1024, "{df}");

    // A restore smaller than the snapshot is refused with upstream's words, and stays Pending.
    lab.apply(&restore("small", "32Mi"));
    lab.apply(&pod_with_claim("small-reader", "small", "sleep 3600"));
    lab.wait("the small restore refused", MIN, |l| {
        let ev = l.kubectl_ok(&["get", "events", "--field-selector", "involvedObject.name=small", "-o", "jsonpath={.items[*].message}"]);
        ev.contains("requested volume size 33554432 is less than the size 67108864 for the source snapshot s1").then_some(())
    });
    assert_eq!(field(&lab, &["pvc", "small"], "{.status.phase}"), "Pending");
    lab.kubectl_ok(&["delete", "pod", "small-reader", "--wait=true", "--timeout=60s"]);
    lab.kubectl_ok(&["delete", "pvc", "small", "--wait=true", "--timeout=60s"]);

    // Deleting the snapshot (policy Delete) deletes its content and the storage snapshot; the
    // restored claim keeps its data.
    lab.kubectl_ok(&["delete", "volumesnapshot", "s1", "orphan", "--wait=true", "--timeout=60s"]);
    lab.wait("the content deleted", MIN, |l| {
        let out = l.kubectl(&["get", "volumesnapshotcontents", "-o", "name"]);
        String::from_utf8_lossy(&out.stdout).trim().is_empty().then_some(())
    });
    assert!(!data.join("snapshots").join(&handle).exists(), "{}", csi_log());
    assert_eq!(lab.kubectl_ok(&["exec", "reader", "--", "cat", "/data/f"]), "at-snapshot\n");

    for pod in ["writer", "reader"] {
        lab.kubectl_ok(&["delete", "pod", pod, "--wait=true", "--timeout=60s"]);
    }
    lab.kubectl_ok(&["delete", "pvc", "data", "restored", "--wait=false"]);
    lab.wait("the PVs deleted", MIN, |l| {
        let out = l.kubectl(&["get", "pv", "-o", "name"]);
        String::from_utf8_lossy(&out.stdout).trim().is_empty().then_some(())
    });
    let volumes: Vec<_> = std::fs::read_dir(data.join("volumes")).unwrap().flatten().collect();
    assert!(volumes.is_empty(), "volumes left: {volumes:?}\n{}", csi_log());
    lab.wait_nothing_left();
    lab.assert_csi_refused_nothing();
    csi.kill();
}

/// The workload loops on a real node: a StatefulSet behind a headless Service with a claim per
/// ordinal (provisioned by ferro-csi), stable names and data across a pod's re-creation, and a
/// Job that runs to completion, all through kubectl.
#[test]
#[ignore = "privileged: needs root, containerd and loop devices; run by scripts/test.sh"]
fn a_stateful_set_keeps_its_claims_and_a_job_completes_on_a_real_node() {
    let scratch = Scratch::new("ferro-agent-csi-sts-").unwrap();
    let lab = Lab::start("csists");
    let data = scratch.path().join("csi");
    let mut csi = lab.start_csi(&data, "1Gi");
    lab.wait_csi_registered();
    lab.apply("apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata:\n  name: loop\nprovisioner: loop.csi.ferro.dev\nvolumeBindingMode: WaitForFirstConsumer\nreclaimPolicy: Delete\n");
    lab.apply("apiVersion: v1\nkind: Service\nmetadata:\n  name: web\nspec:\n  clusterIP: None\n  selector:\n    app: web\n  ports:\n  - port: 80\n");
    lab.apply(&format!(
        "apiVersion: apps/v1\nkind: StatefulSet\nmetadata:\n  name: web\nspec:\n  serviceName: web\n  replicas: 2\n  selector:\n    matchLabels:\n      app: web\n  template:\n    metadata:\n      labels:\n        app: web\n    spec:\n      terminationGracePeriodSeconds: 1\n      containers:\n      - name: app\n        image: {BUSYBOX}\n        command: [sh, -c, 'hostname >> /data/starts; exec sleep 3600']\n        volumeMounts:\n        - {{name: data, mountPath: /data}}\n  volumeClaimTemplates:\n  - metadata:\n      name: data\n    spec:\n      storageClassName: loop\n      accessModes: [ReadWriteOnce]\n      resources:\n        requests:\n          storage: 16Mi\n"
    ));
    let out = lab.kubectl_ok(&["rollout", "status", "statefulset/web", "--timeout=120s"]);
    assert!(out.contains("2 pods at revision") || out.contains("roll out complete"), "{out}");
    for ordinal in 0..2 {
        let pod = format!("web-{ordinal}");
        assert_eq!(field(&lab, &["pvc", &format!("data-web-{ordinal}")], "{.status.phase}"), "Bound");
        assert_eq!(lab.kubectl_ok(&["exec", &pod, "--", "cat", "/data/starts"]), format!("{pod}\n"));
        assert_eq!(field(&lab, &["pod", &pod], "{.spec.subdomain}"), "web");
    }
    // OrderedReady: web-1 was created after web-0.
    let created = |p: &str| field(&lab, &["pod", p], "{.metadata.creationTimestamp}");
    assert!(created("web-0") <= created("web-1"));
    // web-0 deleted: the same name comes back with the same claim and its data.
    let uid = field(&lab, &["pod", "web-0"], "{.metadata.uid}");
    lab.kubectl_ok(&["delete", "pod", "web-0", "--wait=true", "--timeout=60s"]);
    lab.wait("web-0 back and running", MIN, |l| {
        let p = l.pod("web-0")?;
        (p["metadata"]["uid"] != uid.as_str() && phase(&p) == "Running").then_some(())
    });
    lab.wait("web-0's second start on its volume", MIN, |l| {
        let out = l.kubectl(&["exec", "web-0", "--", "cat", "/data/starts"]);
        (String::from_utf8_lossy(&out.stdout) == "web-0\nweb-0\n").then_some(())
    });

    // A Job: its pod runs to completion on the node, the Job completes.
    lab.kubectl_ok(&["create", "job", "hello", &format!("--image={BUSYBOX}"), "--", "sh", "-c", "echo hello from a job"]);
    lab.kubectl_ok(&["wait", "--for=condition=complete", "job/hello", "--timeout=120s"]);
    assert_eq!(field(&lab, &["job", "hello"], "{.status.succeeded}"), "1");
    assert_eq!(lab.kubectl_ok(&["logs", "job/hello"]).trim(), "hello from a job");

    // Clean up: the set, its claims (their volumes go), the Job and its pod.
    lab.kubectl_ok(&["delete", "job", "hello", "--wait=true", "--timeout=60s"]);
    lab.kubectl_ok(&["delete", "statefulset", "web", "--wait=true", "--timeout=60s"]);
    lab.wait("the set's pods gone", MIN, |l| {
        let out = l.kubectl(&["get", "pods", "-o", "name"]);
        String::from_utf8_lossy(&out.stdout).trim().is_empty().then_some(())
    });
    lab.kubectl_ok(&["delete", "pvc", "data-web-0", "data-web-1", "--wait=false"]);
    lab.wait("the PVs deleted", MIN, |l| {
        let out = l.kubectl(&["get", "pv", "-o", "name"]);
        String::from_utf8_lossy(&out.stdout).trim().is_empty().then_some(())
    });
    lab.wait_nothing_left();
    lab.assert_csi_refused_nothing();
    csi.kill();
}
