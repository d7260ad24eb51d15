//! ferro-csi's provisioner against the real ferro-control-plane, driven with kubectl: a claim
//! whose pod the scheduler places on the node is provisioned and bound, a claim too big for the
//! pool is refused with an event and given back to the scheduler, an Immediate claim is taken
//! and bound, and deleting a claim deletes its volume and backing file. The control plane and
//! ferro-csi run in a network namespace of the test's own (loopback only).
//! Privileged: run by the README's test command (`--include-ignored`).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ferro_lab::netns::NetNs;
use ferro_lab::storage::Scratch;

const NODE: &str = "node-a";

struct Proc(Option<Child>);

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn workspace_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("exe");
    let bin = exe
        .parent()
        .and_then(|p| p.parent())
        .expect("target dir")
        .join(name);
    assert!(
        bin.exists(),
        "{} is missing: build the workspace first (cargo build --workspace --all-targets)",
        bin.display()
    );
    bin
}

/// Dropped in field order: ferro-csi, the control plane, the namespace, the scratch dir.
struct Cluster {
    csi: Proc,
    _cp: Proc,
    ns: NetNs,
    scratch: Scratch,
}

impl Cluster {
    fn start(tag: &str) -> Result<Cluster> {
        ferro_lab::require_bin("kubectl", "kubernetes-client")?;
        let scratch = Scratch::new(&format!("ferro-csi-{tag}-"))?;
        let ns = NetNs::new(&format!("fcsi-{tag}"))?;
        let log = std::fs::File::create(scratch.path().join("control-plane.log"))?;
        let cp = Command::new("ip")
            .args(["netns", "exec", ns.name()])
            .arg(workspace_bin("ferro-control-plane"))
            .arg("--data-dir")
            .arg(scratch.path().join("cp"))
            .args([
                "--bind-address",
                "127.0.0.1",
                "--secure-port",
                "6443",
                "--controllers",
                "*",
            ])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting ferro-control-plane")?;
        let mut c = Cluster {
            csi: Proc(None),
            _cp: Proc(Some(cp)),
            ns,
            scratch,
        };
        let kc = c.kubeconfig();
        c.wait("the API server", || {
            kc.exists() && c.kubectl(&["get", "--raw", "/readyz"]).is_ok()
        })?;
        c.start_csi()?;
        Ok(c)
    }

    fn kubeconfig(&self) -> PathBuf {
        self.scratch.path().join("cp/admin.kubeconfig")
    }

    /// ferro-csi's own identity (user system:ferro-csi, bound to the ClusterRole of the same
    /// name), as install.sh gives it: not the admin's.
    fn csi_kubeconfig(&self) -> Result<PathBuf> {
        let path = self.scratch.path().join("csi.kubeconfig");
        if !path.exists() {
            let out = Command::new(workspace_bin("ferro-control-plane"))
                .arg("kubeconfig")
                .arg("--data-dir")
                .arg(self.scratch.path().join("cp"))
                .args(["--user", "system:ferro-csi", "--server", "https://127.0.0.1:6443"])
                .output()?;
            if !out.status.success() {
                bail!("ferro-control-plane kubeconfig: {}", String::from_utf8_lossy(&out.stderr));
            }
            std::fs::write(&path, out.stdout)?;
        }
        Ok(path)
    }

    /// ferro-csi was refused nothing by the API server: its ClusterRole covers what it does.
    fn assert_nothing_forbidden(&self) {
        let text = std::fs::read_to_string(self.scratch.path().join("csi.log")).unwrap_or_default();
        let refused: Vec<&str> = text.lines().filter(|l| l.to_lowercase().contains("forbidden")).collect();
        assert!(refused.is_empty(), "ferro-csi was refused requests:\n{}", refused.join("\n"));
    }

    fn data(&self) -> PathBuf {
        self.scratch.path().join("data")
    }

    fn start_csi(&mut self) -> Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.scratch.path().join("csi.log"))?;
        // nsenter --net keeps the machine's mounts (ip netns exec would give a private /sys).
        let child = Command::new("nsenter")
            .arg(format!("--net={}", self.ns.path()))
            .arg(env!("CARGO_BIN_EXE_ferro-csi"))
            .args(["--node-id", NODE, "--pool-size", "1Gi", "--capacity-poll-interval", "2s"])
            .arg("--data-dir")
            .arg(self.data())
            .arg("--endpoint")
            .arg(format!(
                "unix://{}",
                self.scratch.path().join("csi.sock").display()
            ))
            .arg("--allowed-path")
            .arg(self.scratch.path().join("kubelet"))
            .arg("--kubeconfig")
            .arg(self.csi_kubeconfig()?)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting ferro-csi")?;
        self.csi = Proc(Some(child));
        let sock = self.scratch.path().join("csi.sock");
        self.wait("ferro-csi's socket", || sock.exists())
    }

    fn wait(&self, what: &str, mut cond: impl FnMut() -> bool) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(90);
        while !cond() {
            if Instant::now() > deadline {
                bail!("timed out waiting for {what}\n--- csi.log ---\n{}\n--- control-plane.log ---\n{}", self.log("csi.log"), self.log("control-plane.log"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    fn log(&self, name: &str) -> String {
        let text = std::fs::read_to_string(self.scratch.path().join(name)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    fn kubectl_stdin(&self, args: &[&str], stdin: Option<&str>) -> Result<String> {
        use std::io::Write as _;
        let mut child = Command::new("ip")
            .args(["netns", "exec", self.ns.name(), "kubectl", "--kubeconfig"])
            .arg(self.kubeconfig())
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(text.as_bytes())?;
        }
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!("kubectl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn kubectl(&self, args: &[&str]) -> Result<String> {
        self.kubectl_stdin(args, None)
    }

    fn apply(&self, yaml: &str) -> Result<String> {
        self.kubectl_stdin(&["apply", "-f", "-"], Some(yaml))
    }

    fn get(&self, what: &[&str], path: &str) -> String {
        let mut args = vec!["get"];
        args.extend_from_slice(what);
        let jp = format!("jsonpath={path}");
        args.extend_from_slice(&["-o", &jp]);
        self.kubectl(&args).unwrap_or_default()
    }

    fn disks(&self) -> Vec<PathBuf> {
        let Ok(entries) = std::fs::read_dir(self.data().join("volumes")) else {
            return Vec::new();
        };
        entries
            .flatten()
            .map(|e| e.path().join("disk.img"))
            .filter(|p| p.exists())
            .collect()
    }
}

fn storage_class(name: &str, mode: &str) -> String {
    format!(
        "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata:\n  name: {name}\nprovisioner: loop.csi.ferro.dev\nreclaimPolicy: Delete\nvolumeBindingMode: {mode}\nallowVolumeExpansion: true\n"
    )
}

fn claim(name: &str, class: &str, size: &str) -> String {
    format!(
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: {name}\nspec:\n  storageClassName: {class}\n  accessModes: [ReadWriteOnce]\n  resources:\n    requests:\n      storage: {size}\n"
    )
}

fn pod_with(name: &str, claim: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  tolerations: [{{operator: Exists}}]\n  containers:\n  - name: c\n    image: busybox\n    volumeMounts:\n    - name: v\n      mountPath: /data\n  volumes:\n  - name: v\n    persistentVolumeClaim:\n      claimName: {claim}\n"
    )
}

fn register_node(c: &Cluster) -> Result<()> {
    c.apply(&format!(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: {NODE}\n  labels:\n    kubernetes.io/hostname: {NODE}\n    topology.loop.csi.ferro.dev/node: {NODE}\n"
    ))?;
    let status = r#"{"status":{"capacity":{"cpu":"4","memory":"8Gi","pods":"110"},"allocatable":{"cpu":"4","memory":"8Gi","pods":"110"},"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady","message":"test"}]}}"#;
    c.kubectl(&[
        "patch",
        "node",
        NODE,
        "--subresource=status",
        "--type=merge",
        "-p",
        status,
    ])?;
    Ok(())
}

#[test]
#[ignore = "privileged: a network namespace, ferro-control-plane and ferro-csi"]
fn claims_are_provisioned_on_the_selected_node_and_deleted_with_their_claim() -> Result<()> {
    let c = Cluster::start("prov")?;
    register_node(&c)?;
    c.wait("the CSIDriver object", || c.get(&["csidriver", "loop.csi.ferro.dev"], "{.spec.attachRequired}") == "false")?;
    c.apply(&storage_class("loop", "WaitForFirstConsumer"))?;
    // Storage capacity tracking: one CSIStorageCapacity for the class, with the node's
    // topology and what the pool still holds.
    assert_eq!(c.get(&["csidriver", "loop.csi.ferro.dev"], "{.spec.storageCapacity}"), "true");
    let capacity = |class: &str| {
        c.kubectl(&[
            "get",
            "csistoragecapacities",
            "-n",
            "kube-system",
            "-o",
            &format!("jsonpath={{.items[?(@.storageClassName==\"{class}\")].capacity}}"),
        ])
        .unwrap_or_default()
    };
    c.wait("the class's CSIStorageCapacity", || capacity("loop") == "1Gi")?;
    let topology = c.kubectl(&["get", "csistoragecapacities", "-n", "kube-system", "-o", "jsonpath={.items[0].nodeTopology.matchLabels}"])?;
    assert!(topology.contains("topology.loop.csi.ferro.dev/node") && topology.contains(NODE), "{topology}");
    c.apply(&claim("data", "loop", "100Mi"))?;
    // No consumer yet: WaitForFirstConsumer leaves the claim alone.
    c.wait("the claim to wait for its consumer", || {
        c.kubectl(&[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=data",
            "-o",
            "jsonpath={.items[*].reason}",
        ])
        .is_ok_and(|r| r.contains("WaitForFirstConsumer"))
    })?;
    assert!(c.disks().is_empty(), "nothing provisioned before the pod");
    c.apply(&pod_with("app", "data"))?;
    c.wait("claim data Bound", || {
        c.get(&["pvc", "data"], "{.status.phase}") == "Bound"
    })?;
    let pv = c.get(&["pvc", "data"], "{.spec.volumeName}");
    let uid = c.get(&["pvc", "data"], "{.metadata.uid}");
    assert_eq!(pv, format!("pvc-{uid}"));
    assert_eq!(
        c.get(&["pv", &pv], "{.spec.csi.driver}"),
        "loop.csi.ferro.dev"
    );
    assert_eq!(
        c.get(
            &["pv", &pv],
            "{.spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[0].values[0]}"
        ),
        NODE
    );
    assert_eq!(
        c.get(&["pv", &pv], "{.spec.capacity.storage}"),
        (100u64 << 20).to_string()
    );
    assert_eq!(
        c.get(&["pv", &pv], "{.metadata.finalizers[0]}"),
        "external-provisioner.volume.kubernetes.io/finalizer"
    );
    let disks = c.disks();
    assert_eq!(disks.len(), 1, "{disks:?}");
    // The volume made counts against the published capacity.
    c.wait("the capacity to shrink by the volume", || capacity("loop") == "924Mi")?;
    assert_eq!(std::fs::metadata(&disks[0])?.len(), 100 << 20);
    let events = c.kubectl(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=data",
        "-o",
        "jsonpath={.items[*].reason}",
    ])?;
    assert!(events.contains("ProvisioningSucceeded"), "{events}");

    // More than the pool holds. WaitForFirstConsumer: the scheduler reads the published
    // capacity and keeps the pod off the node; nothing is asked of the driver.
    c.apply(&claim("big", "loop", "5Gi"))?;
    c.apply(&pod_with("big-app", "big"))?;
    c.wait("big-app unschedulable for want of storage", || {
        c.get(&["pod", "big-app"], "{.status.conditions[?(@.type==\"PodScheduled\")].message}")
            .contains("node(s) did not have enough free storage")
    })?;
    assert_eq!(c.get(&["pvc", "big"], "{.status.phase}"), "Pending");
    // Immediate (no scheduler): the driver refuses it with an event, the claim stays Pending.
    c.apply(&storage_class("loop-now", "Immediate"))?;
    c.apply(&claim("big-now", "loop-now", "5Gi"))?;
    c.wait("ProvisioningFailed on claim big-now", || {
        c.kubectl(&[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=big-now,reason=ProvisioningFailed",
            "-o",
            "jsonpath={.items[*].message}",
        ])
        .is_ok_and(|m| m.contains("bytes left in its pool"))
    })?;
    assert_eq!(c.get(&["pvc", "big-now"], "{.status.phase}"), "Pending");
    assert_eq!(c.disks().len(), 1, "nothing created for the refused claims");
    c.kubectl(&["delete", "pvc", "big-now", "--wait=false"])?;

    // Immediate: taken by the only node and bound without a consumer.
    c.apply(&claim("now", "loop-now", "20Mi"))?;
    c.wait("claim now Bound", || {
        c.get(&["pvc", "now"], "{.status.phase}") == "Bound"
    })?;
    assert_eq!(
        c.get(
            &["pvc", "now"],
            "{.metadata.annotations.volume\\.kubernetes\\.io/selected-node}"
        ),
        NODE
    );
    assert_eq!(c.disks().len(), 2);

    // A clone: a claim whose data source is claim "now" gets a copy of its volume.
    let now_pv = c.get(&["pvc", "now"], "{.spec.volumeName}");
    let now_handle = c.get(&["pv", &now_pv], "{.spec.csi.volumeHandle}");
    let now_disk = c.data().join("volumes").join(&now_handle).join("disk.img");
    {
        use std::io::Write as _;
        let mut f = std::fs::OpenOptions::new().write(true).open(&now_disk)?;
        f.write_all(b"cloned bytes")?;
        f.sync_all()?;
    }
    c.apply("apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: copy\nspec:\n  storageClassName: loop-now\n  accessModes: [ReadWriteOnce]\n  dataSource: {kind: PersistentVolumeClaim, name: now}\n  resources:\n    requests:\n      storage: 40Mi\n")?;
    c.wait("claim copy Bound", || c.get(&["pvc", "copy"], "{.status.phase}") == "Bound")?;
    let copy_pv = c.get(&["pvc", "copy"], "{.spec.volumeName}");
    let copy_disk = c.data().join("volumes").join(c.get(&["pv", &copy_pv], "{.spec.csi.volumeHandle}")).join("disk.img");
    let head = std::fs::read(&copy_disk)?;
    assert_eq!(&head[..12], b"cloned bytes", "the clone carries the source's data");
    assert_eq!(std::fs::metadata(&copy_disk)?.len(), 40 << 20, "grown to the clone's size");
    assert_eq!(c.disks().len(), 3);

    // Deleting the claims deletes the volumes (reclaim policy Delete), backing files included.
    c.kubectl(&[
        "delete",
        "pod",
        "app",
        "big-app",
        "--grace-period=0",
        "--force",
        "--wait=false",
    ])?;
    c.kubectl(&["delete", "pvc", "data", "now", "big", "copy", "--wait=false"])?;
    c.wait("both volumes gone", || {
        c.kubectl(&["get", "pv", "-o", "name"])
            .is_ok_and(|o| o.trim().is_empty())
    })?;
    c.wait("the backing files removed", || c.disks().is_empty())?;
    let left: Vec<_> = std::fs::read_dir(c.data().join("volumes"))?
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "journal records left: {left:?}");
    c.assert_nothing_forbidden();
    Ok(())
}
