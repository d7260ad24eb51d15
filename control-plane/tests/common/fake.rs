//! Fake nodes for controller tests: Node objects, Leases the test keeps renewing, and a
//! stand-in kubelet that sets the status of pods bound to its nodes (Running with an IP and
//! Ready) and confirms their graceful deletion. Annotations on a pod steer it:
//! `fake.ferro.dev/ready: "false"` keeps it not ready; `fake.ferro.dev/hold-termination:
//! "true"` leaves it terminating. Pods that run to completion (Jobs): `fake.ferro.dev/exit-code:
//! "N"` makes the pod's containers exit with N at once (phase Succeeded for 0, else Failed);
//! `fake.ferro.dev/fail-first: "N"` makes the first N such pods of one controller (by owner uid,
//! in the order this kubelet starts them) exit with 1 and the others with the exit code (0 by
//! default).

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::ResourceExt as _;
use serde_json::json;

pub struct FakeNodes {
    dead: Arc<Mutex<HashSet<String>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for FakeNodes {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// A write of the stand-in kubelet, tried until it is done or the pod is gone: a kubelet that
/// gave up on one status write would leave its pod Pending for ever (no later event of the pod
/// would bring it back), and a test waiting on the pod's owner would hang without a word.
async fn persist<T, F, Fut>(what: &str, pod: &str, mut write: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    for attempt in 1.. {
        match write().await {
            Ok(_) => return,
            Err(kube::Error::Api(e)) if e.code == 404 => return,
            Err(e) if attempt < 50 => {
                eprintln!("fake kubelet: {what} of pod {pod} failed (attempt {attempt}, retrying): {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => {
                eprintln!("fake kubelet: {what} of pod {pod} failed {attempt} times, giving up: {e}");
                return;
            }
        }
    }
}

fn now_micro() -> MicroTime {
    MicroTime(jiff::Timestamp::now())
}

impl FakeNodes {
    /// Registers the nodes (each with `cpu` and `memory` allocatable, 110 pods) and starts
    /// their leases and the stand-in kubelet.
    pub async fn start(client: kube::Client, names: &[&str], cpu: &str, memory: &str) -> FakeNodes {
        let nodes: Api<Node> = Api::all(client.clone());
        let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
        for (i, name) in names.iter().enumerate() {
            let node: Node = serde_json::from_value(json!({
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "topology.kubernetes.io/zone": format!("zone-{}", i % 2)}},
                "status": {
                    "capacity": {"cpu": cpu, "memory": memory, "pods": "110"},
                    "allocatable": {"cpu": cpu, "memory": memory, "pods": "110"},
                    "addresses": [{"type": "InternalIP", "address": format!("192.168.50.{}", i + 10)}],
                }
            }))
            .unwrap();
            nodes.create(&PostParams::default(), &node).await.unwrap();
            let now = jiff::Timestamp::now().to_string();
            let status = json!({"status": {"conditions": [{
                "type": "Ready", "status": "True", "reason": "KubeletReady", "message": "fake kubelet is posting ready status",
                "lastHeartbeatTime": now, "lastTransitionTime": now}]}});
            nodes.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
            let lease: Lease = serde_json::from_value(json!({
                "metadata": {"name": name},
                "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": now_micro()}
            }))
            .unwrap();
            leases.create(&PostParams::default(), &lease).await.unwrap();
        }
        FakeNodes::resume(client, names).await
    }

    /// Starts leases and the stand-in kubelet for nodes that already exist (after a restart
    /// of the control plane).
    pub async fn resume(client: kube::Client, names: &[&str]) -> FakeNodes {
        let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
        let dead: Arc<Mutex<HashSet<String>>> = Arc::default();
        let mut tasks = Vec::new();
        // leases
        {
            let (dead, names): (_, Vec<String>) = (dead.clone(), names.iter().map(|s| s.to_string()).collect());
            let leases = leases.clone();
            tasks.push(tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    for n in &names {
                        if dead.lock().unwrap().contains(n) {
                            continue;
                        }
                        let patch = json!({"spec": {"renewTime": now_micro()}});
                        let _ = leases.patch(n, &PatchParams::default(), &Patch::Merge(&patch)).await;
                    }
                }
            }));
        }
        // kubelet
        {
            let dead = dead.clone();
            let mine: HashSet<String> = names.iter().map(|s| s.to_string()).collect();
            let pods: Api<Pod> = Api::all(client.clone());
            let client = client.clone();
            tasks.push(tokio::spawn(async move {
                let mut exits = Exits::default();
                let mut ips: BTreeMap<String, String> = BTreeMap::new();
                let mut next_ip = 2u32;
                let mut stream = watcher::watcher(pods, watcher::Config::default()).boxed();
                while let Some(ev) = stream.next().await {
                    let Ok(ev) = ev else { continue };
                    let pod = match ev {
                        watcher::Event::Apply(p) | watcher::Event::InitApply(p) => p,
                        _ => continue,
                    };
                    let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else { continue };
                    if !mine.contains(&node) || dead.lock().unwrap().contains(&node) {
                        continue;
                    }
                    let ns = pod.namespace().unwrap_or_default();
                    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
                    let ann = pod.annotations();
                    if pod.metadata.deletion_timestamp.is_some() {
                        if ann.get("fake.ferro.dev/hold-termination").map(String::as_str) != Some("true") {
                            let (name, dp) = (pod.name_any(), DeleteParams::default().grace_period(0));
                            persist("delete", &name, || api.delete(&name, &dp)).await;
                        }
                        continue;
                    }
                    let status = pod.status.clone().unwrap_or_default();
                    if Exits::steers(&pod) {
                        if !matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
                            let code = exits.code(&pod);
                            let patch = exited(&pod, code);
                            let (name, pp, patch) = (pod.name_any(), PatchParams::default(), Patch::Merge(&patch));
                            persist("exit status", &name, || api.patch_status(&name, &pp, &patch)).await;
                        }
                        continue;
                    }
                    let want_ready = ann.get("fake.ferro.dev/ready").map(String::as_str) != Some("false");
                    let ready_now = status
                        .conditions
                        .as_ref()
                        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
                        .map(|c| c.status == "True");
                    if status.phase.as_deref() == Some("Running") && ready_now == Some(want_ready) {
                        continue;
                    }
                    let uid = pod.uid().unwrap_or_default();
                    let ip = ips
                        .entry(uid)
                        .or_insert_with(|| {
                            next_ip += 1;
                            format!("10.244.{}.{}", next_ip / 250, next_ip % 250 + 2)
                        })
                        .clone();
                    let now = jiff::Timestamp::now().to_string();
                    let r = if want_ready { "True" } else { "False" };
                    let containers: Vec<_> = pod
                        .spec
                        .as_ref()
                        .map(|s| s.containers.iter().map(|c| json!({
                            "name": c.name, "image": c.image, "imageID": "", "ready": want_ready, "started": true,
                            "restartCount": 0, "state": {"running": {"startedAt": now}}})).collect())
                        .unwrap_or_default();
                    let patch = json!({"status": {
                        "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": "192.168.50.10", "startTime": now,
                        "conditions": [
                            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                            {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                            {"type": "ContainersReady", "status": r, "lastTransitionTime": now},
                            {"type": "Ready", "status": r, "lastTransitionTime": now}],
                        "containerStatuses": containers}});
                    let (name, pp, patch) = (pod.name_any(), PatchParams::default(), Patch::Merge(&patch));
                    persist("running status", &name, || api.patch_status(&name, &pp, &patch)).await;
                }
            }));
        }
        FakeNodes { dead, tasks }
    }

    /// The node's kubelet stops: no more lease renewals, pod status or deletion confirmations.
    pub fn kill(&self, node: &str) {
        self.dead.lock().unwrap().insert(node.to_string());
    }
}

/// The exit codes the fake kubelet hands out (`fake.ferro.dev/exit-code` and `fail-first`),
/// decided once per pod.
#[derive(Default)]
struct Exits {
    decided: BTreeMap<String, i32>,
    failed_per_owner: BTreeMap<String, u32>,
}

impl Exits {
    /// Whether the pod runs to completion.
    fn steers(pod: &Pod) -> bool {
        let ann = pod.annotations();
        ann.contains_key("fake.ferro.dev/exit-code") || ann.contains_key("fake.ferro.dev/fail-first")
    }

    fn code(&mut self, pod: &Pod) -> i32 {
        let ann = pod.annotations();
        let code: Option<i32> = ann.get("fake.ferro.dev/exit-code").and_then(|c| c.parse().ok());
        let fail_first: Option<u32> = ann.get("fake.ferro.dev/fail-first").and_then(|c| c.parse().ok());
        let uid = pod.uid().unwrap_or_default();
        if let Some(c) = self.decided.get(&uid) {
            return *c;
        }
        let owner = pod.owner_references().iter().find(|r| r.controller == Some(true)).map(|r| r.uid.clone()).unwrap_or_default();
        let failed = self.failed_per_owner.entry(owner).or_default();
        let c = match fail_first {
            Some(n) if *failed < n => {
                *failed += 1;
                1
            }
            _ => code.unwrap_or(0),
        };
        self.decided.insert(uid, c);
        c
    }
}

/// The status of a pod whose containers all exited with `code`.
fn exited(pod: &Pod, code: i32) -> serde_json::Value {
    let now = jiff::Timestamp::now().to_string();
    let containers: Vec<_> = pod
        .spec
        .as_ref()
        .map(|s| s.containers.iter().map(|c| json!({
            "name": c.name, "image": c.image, "imageID": "", "ready": false, "started": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": code, "reason": if code == 0 { "Completed" } else { "Error" },
                "startedAt": now, "finishedAt": now}}})).collect())
        .unwrap_or_default();
    json!({"status": {
        "phase": if code == 0 { "Succeeded" } else { "Failed" }, "hostIP": "192.168.50.10", "startTime": now,
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
            {"type": "Initialized", "status": "True", "lastTransitionTime": now},
            {"type": "ContainersReady", "status": "False", "reason": "PodCompleted", "lastTransitionTime": now},
            {"type": "Ready", "status": "False", "reason": "PodCompleted", "lastTransitionTime": now}],
        "containerStatuses": containers}})
}

/// Polls `f` until it returns Some, or panics after a generous deadline naming `what`.
pub async fn eventually<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(std::time::Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
