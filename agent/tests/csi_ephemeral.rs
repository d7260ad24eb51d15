//! Inline CSI volumes (a pod's `volumes[].csi`, lifecycle mode "Ephemeral") end to end in the
//! lab: ferro-csi (driver, provisioner that writes its CSIDriver object, registration) next
//! to ferro-agent in containerd's namespaces. A pod with an inline volume of
//! loop.csi.ferro.dev gets a fresh filesystem of the asked size (with its fsGroup), keeps it
//! across an agent restart, and deleting the pod removes the volume's mounts, loop device and
//! backing file. A driver whose CSIDriver does not list Ephemeral, and attributes the driver
//! does not know, leave the pod in ContainerCreating with a FailedMount event saying why.
//! Driven by kubectl. Needs root and the lab's packages.
#![allow(clippy::unwrap_used)]

mod lab;

use std::path::{Path, PathBuf};
use std::time::Duration;

use ferro_lab::storage::Scratch;
use lab::{Lab, BUSYBOX};
use serde_json::Value;

const MIN: Duration = Duration::from_secs(60);

fn phase(p: &Value) -> &str {
    p["status"]["phase"].as_str().unwrap_or("")
}

/// A pod with one inline volume `scratch` of `driver` mounted at /data.
fn inline_pod(name: &str, driver: &str, attributes: &str, script: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  terminationGracePeriodSeconds: 1\n  securityContext:\n    fsGroup: 2000\n  volumes:\n  - name: scratch\n    csi:\n      driver: {driver}\n      fsType: ext4\n      volumeAttributes: {attributes}\n  containers:\n  - name: app\n    image: {BUSYBOX}\n    command: [\"sh\", \"-c\", {script:?}]\n    volumeMounts:\n    - {{name: scratch, mountPath: /data}}\n"
    )
}

/// Mount points under `dir` as containerd's mount namespace (the agent's and ferro-csi's)
/// sees them.
fn mounts_under(lab: &Lab, dir: &Path) -> Vec<String> {
    let pid = lab.ctrd.pid().unwrap();
    let text = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    text.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|t| t.starts_with(dir.to_str().unwrap()))
        .map(String::from)
        .collect()
}

fn entries(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir).map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default()
}

/// The messages of the FailedMount events about pod `name`.
fn failed_mounts(lab: &Lab, name: &str) -> String {
    let selector = format!("involvedObject.name={name},reason=FailedMount");
    let out = lab.kubectl(&["get", "events", "--field-selector", &selector, "-o", "jsonpath={.items[*].message}"]);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits until pod `name` has a FailedMount event containing `want`, then checks that it
/// waits in ContainerCreating with nothing started.
fn waits_with_failed_mount(lab: &Lab, name: &str, want: &str) {
    lab.wait(&format!("a FailedMount event of {name} saying {want:?}"), MIN, |l| {
        failed_mounts(l, name).contains(want).then_some(())
    });
    // the event is posted before the sync writes the pod's status: wait for that too
    let p = lab.wait_pod(name, &format!("{name} waiting with {want:?}"), MIN, |p| {
        p["status"]["containerStatuses"][0]["state"]["waiting"]["message"].as_str().unwrap_or("").contains(want)
    });
    assert_eq!(phase(&p), "Pending", "{}", p["status"]);
    let waiting = &p["status"]["containerStatuses"][0]["state"]["waiting"];
    assert_eq!(waiting["reason"], "ContainerCreating", "{}", p["status"]);
    assert!(waiting["message"].as_str().unwrap_or("").contains(want), "{}", p["status"]);
}

#[test]
#[ignore = "privileged: needs root, containerd and loop devices; run by scripts/test.sh"]
fn an_inline_volume_lives_and_dies_with_its_pod() {
    // Declared first, dropped last: after the lab (and its mount namespace) is gone, any loop
    // device left on a backing file under it is detached.
    let scratch = Scratch::new("ferro-agent-csi-eph-").unwrap();
    let mut lab = Lab::start("csieph");
    let data = scratch.path().join("csi");
    let mut csi = lab.start_csi(&data, "1Gi");
    let csi_log_path = lab.dir.path().join("csi.log");
    let csi_log = || std::fs::read_to_string(&csi_log_path).unwrap_or_default();
    lab.wait_csi_registered();
    // ferro-csi's provisioner writes its CSIDriver object at start: Ephemeral among its modes.
    lab.wait("the CSIDriver to list the Ephemeral mode", MIN, |l| {
        let out = l.kubectl(&["get", "csidriver", "loop.csi.ferro.dev", "-o", "jsonpath={.spec.volumeLifecycleModes}"]);
        String::from_utf8_lossy(&out.stdout).contains("Ephemeral").then_some(())
    });

    lab.apply(&inline_pod("inline", "loop.csi.ferro.dev", "{size: 64Mi}", "echo kept > /data/f && sleep 3600"));
    lab.wait_pod("inline", "Running", MIN, |p| phase(p) == "Running");
    assert_eq!(lab.kubectl_ok(&["exec", "inline", "--", "cat", "/data/f"]).trim(), "kept");
    // A filesystem of the asked size, owned by the pod's fsGroup (fsType set, RWO: the
    // driver's ReadWriteOnceWithFSType policy applies it).
    let df = lab.kubectl_ok(&["exec", "inline", "--", "sh", "-c", "df -k /data | tail -1; stat -c %g /data"]);
    let size_kib: u64 = df.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or(0);
    assert!(size_kib > 32 * 1024 && size_kib <= 64 * 1024, "{df}");
    assert!(df.trim().ends_with("2000"), "fsGroup not applied: {df}");

    // The driver keeps it under the ID of the handle upstream's kubelet would choose, its
    // record says it is an inline volume; one loop device, no staging by the agent.
    let uid = lab.kubectl_ok(&["get", "pod", "inline", "-o", "jsonpath={.metadata.uid}"]);
    let handle = ferro_agent::csi::mounter::inline_handle(uid.trim(), "scratch");
    let volumes = entries(&data.join("volumes"));
    assert_eq!(volumes.len(), 1, "{volumes:?}\n{}", csi_log());
    let record: Value = serde_json::from_str(&std::fs::read_to_string(volumes[0].join("record.json")).unwrap()).unwrap();
    assert_eq!(record["name"], handle.as_str(), "{record}");
    assert_eq!(record["ephemeral"], true, "{record}");
    assert_eq!(record["size"], 64u64 << 20, "{record}");
    assert_eq!(scratch.loops().len(), 1);
    let agent_root = lab.dir.path().join("agent");
    let vol_dir = agent_root.join(format!("pods/{}/volumes/kubernetes.io~csi/scratch", uid.trim()));
    let vol_data: Value = serde_json::from_str(&std::fs::read_to_string(vol_dir.join("vol_data.json")).unwrap()).unwrap();
    assert_eq!(vol_data["volumeLifecycleMode"], "Ephemeral", "{vol_data}");
    assert_eq!(vol_data["volumeHandle"], handle.as_str(), "{vol_data}");
    let mounts = mounts_under(&lab, &agent_root);
    assert!(mounts.contains(&vol_dir.join("mount").to_string_lossy().into_owned()), "{mounts:?}");
    assert!(!mounts.iter().any(|m| m.ends_with("/globalmount")), "an inline volume is not staged by the agent: {mounts:?}");

    // kill -9 of the agent while the pod runs: the restarted one takes over from the files
    // (the volume stays, the pod keeps writing to it).
    lab.agent.kill();
    lab.start_agent();
    lab.wait("the restarted agent to serve the pod", MIN, |l| {
        let out = l.kubectl(&["exec", "inline", "--", "sh", "-c", "echo more >> /data/f && cat /data/f"]);
        (String::from_utf8_lossy(&out.stdout) == "kept\nmore\n").then_some(())
    });
    assert_eq!(lab.pod("inline").unwrap()["status"]["containerStatuses"][0]["restartCount"], 0);
    assert_eq!(entries(&data.join("volumes")).len(), 1);

    // The pod goes: NodeUnpublishVolume takes the whole volume with it.
    lab.kubectl_ok(&["delete", "pod", "inline", "--wait=true", "--timeout=60s"]);
    lab.wait("the inline volume's mounts gone", MIN, |l| mounts_under(l, &agent_root).is_empty().then_some(()));
    lab.wait("the inline volume's backing file removed", MIN, |_| {
        entries(&data.join("volumes")).is_empty().then_some(())
    });
    // Detached before the file went (the kernel lets a device go at its last close).
    lab.wait("the loop device detached", MIN, |_| scratch.loops().is_empty().then_some(()));
    assert!(entries(&data.join("staging")).is_empty(), "{:?}", entries(&data.join("staging")));
    assert!(mounts_under(&lab, &data).is_empty(), "{:?}", mounts_under(&lab, &data));
    lab.wait("the pod's directory removed", MIN, |_| (!vol_dir.exists()).then_some(()));

    // A driver whose CSIDriver lists Persistent only: upstream's refusal, the pod waits.
    lab.apply("apiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata:\n  name: persistent.csi.example\nspec:\n  attachRequired: false\n  volumeLifecycleModes: [Persistent]\n");
    lab.apply(&inline_pod("persistentonly", "persistent.csi.example", "{}", "sleep 3600"));
    waits_with_failed_mount(
        &lab,
        "persistentonly",
        "volume mode \"Ephemeral\" not supported by driver persistent.csi.example (only supports [\"Persistent\"])",
    );
    // Attributes ferro-csi does not know: its InvalidArgument, nothing made.
    lab.apply(&inline_pod("badattr", "loop.csi.ferro.dev", "{size: 64Mi, colour: blue}", "sleep 3600"));
    waits_with_failed_mount(&lab, "badattr", "unknown volume attribute \"colour\"");
    assert!(entries(&data.join("volumes")).is_empty(), "{:?}", entries(&data.join("volumes")));
    assert!(scratch.loops().is_empty());

    let refused: Vec<PathBuf> = ["persistentonly", "badattr"]
        .iter()
        .map(|p| {
            let uid = lab.kubectl_ok(&["get", "pod", p, "-o", "jsonpath={.metadata.uid}"]);
            agent_root.join("pods").join(uid.trim())
        })
        .collect();
    lab.kubectl_ok(&["delete", "pod", "persistentonly", "badattr", "--wait=true", "--timeout=60s"]);
    lab.wait("the refused pods' directories removed", MIN, |_| {
        refused.iter().all(|d| !d.exists()).then_some(())
    });
    assert!(mounts_under(&lab, &agent_root).is_empty());
    lab.wait_nothing_left();
    lab.assert_csi_refused_nothing();
    csi.kill();
}
