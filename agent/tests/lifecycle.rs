//! The pod lifecycle of ferro-agent's pod workers against the recording fake runtime
//! ([`FakeCri`]) on tokio's paused clock: init containers, sidecars, restarts and their
//! back-off, restart policies, probes' effects, termination order and preStop hooks, image
//! pulls, recovery after a restart of the agent, clean-up. No root, no containerd, no network
//! namespace: part of plain `cargo test`. The same behaviours are proven against containerd in
//! tests/pods.rs (privileged tier).
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ferro_agent::clock::Clock;
use ferro_agent::cri::fake::{Call, FakeCri, Run};
use ferro_agent::pod::spec::{CgroupDriver, NodeContext};
use ferro_agent::pod::exec::{PodWorkers, Source, WorkerConfig};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodStatus};
use serde_json::{json, Value};

const IMAGE: &str = "registry.test/busybox:1.36";
const UNUSED: &str = "registry.test/unused:1";
const PAUSE: &str = "registry.test/pause:3.9";
const GIB: i64 = 1 << 30;

struct Node {
    fake: Arc<FakeCri>,
    clock: Clock,
    dir: tempfile::TempDir,
}

impl Node {
    fn new() -> Node {
        let clock = Clock::tokio();
        let fake = Arc::new(FakeCri::new(clock.clone()));
        fake.add_image(IMAGE);
        Node { fake, clock, dir: tempfile::tempdir().unwrap() }
    }

    /// A started set of pod workers on this node (a second call is the agent after a restart).
    fn agent(&self) -> PodWorkers {
        let cfg = WorkerConfig {
            root_dir: self.dir.path().join("root"),
            node: NodeContext {
                node_name: "node-a".into(),
                host_ips: vec!["10.0.0.1".into()],
                cluster_dns: vec!["10.96.0.10".into()],
                cluster_domain: "cluster.local".into(),
                cgroup_driver: CgroupDriver::Systemd,
                pod_log_root: self.dir.path().join("logs"),
                allocatable_cpu_milli: 2000,
                allocatable_memory: 4 * GIB,
                memory_capacity: 4 * GIB,
            },
            resync: Duration::from_secs(60),
            workers: 4,
            max_pods: 110,
            allocatable_cpu_milli: 2000,
            allocatable_memory: 4 * GIB,
            cgroup_root: String::new(),
            clock: self.clock.clone(),
        };
        let w = PodWorkers::new(cfg, "fake".into(), self.fake.clone(), None);
        w.start();
        w
    }

    fn now(&self) -> i64 {
        self.clock.now_ns()
    }

    /// A node with an unused image and a sandbox image besides busybox, whose image
    /// filesystem is a directory on the node's own file system.
    fn with_images() -> Node {
        let node = Node::new();
        node.fake.add_image(UNUSED);
        node.fake.add_image(PAUSE);
        node.fake.set_sandbox_image(PAUSE);
        let image_fs = node.dir.path().join("containerd");
        std::fs::create_dir_all(&image_fs).unwrap();
        node.fake.set_image_fs(&image_fs);
        node
    }

    /// The image collector with periodic GC off (the node-level reclaim still runs, as
    /// upstream's) and no minimum age.
    fn image_gc_off(&self) -> ferro_agent::pod::imagegc::Shared {
        let cfg = ferro_agent::pod::imagegc::ImageGcConfig {
            high_threshold_percent: 100,
            low_threshold_percent: 80,
            min_age: Duration::ZERO,
            max_age: Duration::ZERO,
            period: Duration::from_secs(300),
        };
        ferro_agent::pod::imagegc::ImageGc::new(self.fake.clone(), cfg, None).shared()
    }

    /// A /proc for the eviction manager: 4 GiB of memory, `available_kib` of it available.
    fn fake_proc(&self, available_kib: u64) -> std::path::PathBuf {
        let proc = self.dir.path().join("proc");
        std::fs::create_dir_all(proc.join("sys/kernel")).unwrap();
        std::fs::write(proc.join("meminfo"), format!("MemTotal:        4194304 kB\nMemAvailable:    {available_kib} kB\n")).unwrap();
        std::fs::write(proc.join("sys/kernel/pid_max"), "4194304\n").unwrap();
        std::fs::write(proc.join("loadavg"), "0.00 0.00 0.00 1/120 999\n").unwrap();
        proc
    }

    /// The eviction manager of this node with one hard threshold, and the node health it
    /// publishes.
    fn eviction_manager(
        &self,
        w: &PodWorkers,
        hard: (ferro_agent::eviction::plan::Signal, ferro_agent::eviction::plan::Threshold),
        proc: std::path::PathBuf,
        image_gc: Option<ferro_agent::pod::imagegc::Shared>,
    ) -> (ferro_agent::eviction::run::Manager, tokio::sync::watch::Receiver<ferro_agent::node::Health>) {
        use ferro_agent::eviction::{plan, run};
        let (health, watch) = tokio::sync::watch::channel(ferro_agent::node::Health::default());
        let manager = run::Manager {
            config: plan::Config { hard: std::collections::BTreeMap::from([hard]), ..plan::Config::default() },
            proc,
            root_dir: self.dir.path().join("root"),
            pod_log_root: self.dir.path().join("logs"),
            workers: w.clone(),
            cri: self.fake.clone(),
            health: Arc::new(health),
            clock: self.clock.clone(),
            period: run::MONITORING_PERIOD,
            cgroup_fs: self.dir.path().join("cgroup"),
            cgroup_root: String::new(),
            image_gc,
        };
        (manager, watch)
    }
}

fn pod(name: &str, spec: Value) -> Pod {
    let mut spec = spec;
    spec["nodeName"] = json!("node-a");
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
        "spec": spec,
    }))
    .unwrap()
}

fn container(name: &str) -> Value {
    json!({"name": name, "image": IMAGE, "imagePullPolicy": "IfNotPresent"})
}

/// Waits (on tokio's clock, which the test has paused: waiting costs no real time) until
/// `f` holds; fails after ten minutes of the paused clock.
async fn until(what: &str, mut f: impl FnMut() -> bool) {
    let limit = tokio::time::Instant::now() + Duration::from_secs(600);
    while !f() {
        assert!(tokio::time::Instant::now() < limit, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Lets the paused clock run for `d` (to show that something does not happen).
async fn idle(d: Duration) {
    tokio::time::sleep(d).await;
}

fn status(w: &PodWorkers, name: &str) -> PodStatus {
    w.last_status(&format!("uid-{name}")).unwrap_or_default()
}

fn phase(w: &PodWorkers, name: &str) -> String {
    status(w, name).phase.unwrap_or_default()
}

fn app_status(w: &PodWorkers, pod: &str, c: &str) -> Option<ContainerStatus> {
    status(w, pod).container_statuses?.into_iter().find(|s| s.name == c)
}

fn init_status(w: &PodWorkers, pod: &str, c: &str) -> Option<ContainerStatus> {
    status(w, pod).init_container_statuses?.into_iter().find(|s| s.name == c)
}

fn condition(w: &PodWorkers, pod: &str, t: &str) -> Option<String> {
    status(w, pod).conditions?.into_iter().find(|c| c.type_ == t).map(|c| c.status)
}

/// Index of the first call matching `f`.
fn position(calls: &[Call], f: impl Fn(&Call) -> bool) -> usize {
    calls.iter().position(f).unwrap_or_else(|| panic!("no such call in {calls:#?}"))
}

fn is_start(c: &Call, name: &str) -> bool {
    matches!(c, Call::StartContainer { container, .. } if container == name)
}

fn is_stop(c: &Call, name: &str) -> bool {
    matches!(c, Call::StopContainer { container, .. } if container == name)
}

/// Marks `p` deleted now with its grace period (what the API server does on a delete).
fn deleted(mut p: Pod, now_ns: i64, grace: i64) -> Pod {
    let secs = now_ns / 1_000_000_000;
    p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        jiff::Timestamp::from_second(secs).unwrap(),
    ));
    p.metadata.deletion_grace_period_seconds = Some(grace);
    p
}

#[tokio::test(start_paused = true)]
async fn init_containers_run_one_at_a_time_then_the_app_containers() {
    let node = Node::new();
    node.fake.set_run("migrate", Run::Exit { code: 0, after: Duration::from_secs(5) });
    node.fake.set_run("warm", Run::Exit { code: 0, after: Duration::from_secs(3) });
    let w = node.agent();
    w.upsert(
        pod("web", json!({"initContainers": [container("migrate"), container("warm")], "containers": [container("app"), container("log")]})),
        Source::Api,
    );
    until("both app containers running", || node.fake.running("web") == ["app", "log"]).await;
    until("phase Running", || phase(&w, "web") == "Running").await;

    let calls = node.fake.calls_at();
    let at = |f: &dyn Fn(&Call) -> bool| calls.iter().find(|(_, c)| f(c)).map(|(t, _)| *t).unwrap();
    let migrate = at(&|c| is_start(c, "migrate"));
    let warm = at(&|c| is_start(c, "warm"));
    let app = at(&|c| is_start(c, "app"));
    let log = at(&|c| is_start(c, "log"));
    // Each waits for the one before to exit 0.
    assert!(warm >= migrate + 5_000_000_000, "warm started {} ns after migrate", warm - migrate);
    assert!(app >= warm + 3_000_000_000 && log >= warm + 3_000_000_000);
    assert_eq!(node.fake.starts("web", "migrate"), 1);
    assert_eq!(node.fake.starts("web", "warm"), 1);

    let m = init_status(&w, "web", "migrate").unwrap();
    let t = m.state.unwrap().terminated.unwrap();
    assert_eq!((t.exit_code, t.reason.as_deref()), (0, Some("Completed")));
    assert_eq!(condition(&w, "web", "Initialized").as_deref(), Some("True"));
    assert_eq!(condition(&w, "web", "Ready").as_deref(), Some("True"));
    let app = app_status(&w, "web", "app").unwrap();
    assert!(app.ready && app.state.unwrap().running.is_some());
    assert!(app.container_id.unwrap().starts_with("fake://"));
    assert_eq!(status(&w, "web").pod_ip.as_deref().map(|ip| ip.starts_with("10.88.")), Some(true));
}

#[tokio::test(start_paused = true)]
async fn a_failing_init_container_is_retried_and_holds_the_apps_back() {
    let node = Node::new();
    node.fake.set_run("wait-db", Run::Exit { code: 1, after: Duration::from_secs(1) });
    let w = node.agent();
    w.upsert(pod("api", json!({"initContainers": [container("wait-db")], "containers": [container("app")]})), Source::Api);
    until("wait-db restarted twice", || node.fake.starts("api", "wait-db") >= 3).await;
    assert_eq!(node.fake.starts("api", "app"), 0, "app containers wait for init containers");
    assert_eq!(phase(&w, "api"), "Pending");
    assert_eq!(condition(&w, "api", "Initialized").as_deref(), Some("False"));
    // Now it succeeds: the app starts.
    node.fake.set_run("wait-db", Run::Exit { code: 0, after: Duration::from_secs(1) });
    until("app running", || node.fake.running("api") == ["app"]).await;
    assert!(init_status(&w, "api", "wait-db").unwrap().restart_count >= 2);
}

#[tokio::test(start_paused = true)]
async fn crashing_containers_restart_with_doubling_back_off() {
    let node = Node::new();
    node.fake.set_run("crash", Run::Exit { code: 2, after: Duration::from_secs(1) });
    let w = node.agent();
    w.upsert(pod("loop", json!({"containers": [container("crash")]})), Source::Api);
    until("five starts", || node.fake.starts("loop", "crash") >= 5).await;
    let starts: Vec<i64> = node
        .fake
        .calls_at()
        .into_iter()
        .filter(|(_, c)| is_start(c, "crash"))
        .map(|(t, _)| t)
        .collect();
    // Start k+1 comes the back-off after the k-th exit (1 s after its start): none after the
    // first exit, then 10 s, 20 s, 40 s (upstream's 10 s doubling up to 5 min). The worker
    // notices an exit within the relist period (1 s).
    let backoffs = [0, 10, 20, 40];
    for (k, b) in backoffs.iter().enumerate() {
        let gap = Duration::from_nanos(u64::try_from(starts[k + 1] - starts[k]).unwrap());
        let least = Duration::from_secs(1 + b);
        assert!(gap >= least && gap <= least + Duration::from_secs(2), "restart {}: {gap:?} after the start before, expected {least:?}..+2s", k + 1);
    }
    // While it waits: CrashLoopBackOff, with the restart count and the last exit.
    until("CrashLoopBackOff", || {
        app_status(&w, "loop", "crash")
            .and_then(|s| s.state)
            .and_then(|s| s.waiting)
            .is_some_and(|wt| wt.reason.as_deref() == Some("CrashLoopBackOff"))
    })
    .await;
    let s = app_status(&w, "loop", "crash").unwrap();
    let msg = s.state.unwrap().waiting.unwrap().message.unwrap();
    assert!(msg.starts_with("back-off ") && msg.contains("restarting failed container=crash pod=loop_default(uid-loop)"), "{msg}");
    assert!(s.restart_count >= 4, "{}", s.restart_count);
    assert_eq!(s.last_state.unwrap().terminated.unwrap().exit_code, 2);
    assert_eq!(phase(&w, "loop"), "Running");
}

#[tokio::test(start_paused = true)]
async fn restart_policies_never_and_on_failure() {
    let node = Node::new();
    node.fake.set_run("fails", Run::Exit { code: 3, after: Duration::from_secs(2) });
    node.fake.set_run("succeeds", Run::Exit { code: 0, after: Duration::from_secs(2) });
    let w = node.agent();
    w.upsert(pod("never", json!({"restartPolicy": "Never", "containers": [container("fails")]})), Source::Api);
    w.upsert(pod("onfail", json!({"restartPolicy": "OnFailure", "containers": [container("succeeds")]})), Source::Api);
    w.upsert(pod("onfail-crash", json!({"restartPolicy": "OnFailure", "containers": [container("fails")]})), Source::Api);
    until("never: Failed", || phase(&w, "never") == "Failed").await;
    until("onfail: Succeeded", || phase(&w, "onfail") == "Succeeded").await;
    until("onfail-crash restarted", || node.fake.starts("onfail-crash", "fails") >= 2).await;
    idle(Duration::from_secs(120)).await;
    assert_eq!(node.fake.starts("never", "fails"), 1, "restartPolicy Never runs a container once");
    assert_eq!(node.fake.starts("onfail", "succeeds"), 1, "OnFailure does not restart a success");
    assert_eq!(phase(&w, "never"), "Failed");
    assert_eq!(phase(&w, "onfail"), "Succeeded");
    assert_eq!(phase(&w, "onfail-crash"), "Running");
    let t = app_status(&w, "never", "fails").unwrap().state.unwrap().terminated.unwrap();
    assert_eq!((t.exit_code, t.reason.as_deref()), (3, Some("Error")));
    // A finished pod's sandbox is stopped (its IP kept in the status).
    let calls = node.fake.calls();
    assert!(calls.contains(&Call::StopSandbox { pod: "never".into() }), "{calls:#?}");
    assert!(status(&w, "never").pod_ip.is_some());
}

#[tokio::test(start_paused = true)]
async fn sidecars_start_in_order_keep_running_and_stop_after_the_apps() {
    let node = Node::new();
    node.fake.set_run("setup", Run::Exit { code: 0, after: Duration::from_secs(2) });
    let w = node.agent();
    let mut proxy = container("proxy");
    proxy["restartPolicy"] = json!("Always");
    let mut app = container("app");
    app["lifecycle"] = json!({"preStop": {"exec": {"command": ["sh", "-c", "drain"]}}});
    let p = pod("mesh", json!({"terminationGracePeriodSeconds": 30, "initContainers": [proxy, container("setup")], "containers": [app]}));
    w.upsert(p.clone(), Source::Api);
    until("app and sidecar running", || node.fake.running("mesh") == ["app", "proxy"]).await;
    let calls = node.fake.calls();
    // The sidecar starts first; the next init container runs next to it; the apps after both.
    assert!(position(&calls, |c| is_start(c, "proxy")) < position(&calls, |c| is_start(c, "setup")));
    assert!(position(&calls, |c| is_start(c, "setup")) < position(&calls, |c| is_start(c, "app")));
    until("Running and Ready", || phase(&w, "mesh") == "Running" && condition(&w, "mesh", "Ready").as_deref() == Some("True")).await;

    // A crashed sidecar is restarted whatever the pod's restartPolicy.
    assert!(node.fake.exit("mesh", "proxy", 137));
    until("sidecar restarted", || node.fake.starts("mesh", "proxy") == 2).await;

    // Deletion: the app's preStop hook, the app stopped with the grace left, then the sidecar,
    // then the sandbox.
    let t0 = node.now();
    w.upsert(deleted(p, t0, 30), Source::Api);
    until("everything stopped", || node.fake.running("mesh").is_empty()).await;
    until("sandbox stopped", || node.fake.calls().contains(&Call::StopSandbox { pod: "mesh".into() })).await;
    let calls = node.fake.calls();
    let hook = position(&calls, |c| matches!(c, Call::ExecSync { container, cmd, .. } if container == "app" && cmd == &["sh", "-c", "drain"]));
    let stop_app = position(&calls, |c| is_stop(c, "app"));
    let stop_proxy = position(&calls, |c| is_stop(c, "proxy"));
    let stop_sandbox = position(&calls, |c| *c == Call::StopSandbox { pod: "mesh".into() });
    assert!(hook < stop_app && stop_app < stop_proxy && stop_proxy < stop_sandbox, "{calls:#?}");
    let Call::StopContainer { grace, .. } = &calls[stop_app] else { unreachable!() };
    assert!((28..=30).contains(grace), "the app gets what is left of 30 s: {grace}");
    assert_eq!(node.fake.starts("mesh", "proxy"), 2, "a terminating pod's sidecar is not restarted");
}

#[tokio::test(start_paused = true)]
async fn a_failing_liveness_probe_restarts_the_container_and_readiness_gates_ready() {
    let node = Node::new();
    let healthy = Arc::new(AtomicBool::new(true));
    let ready = Arc::new(AtomicBool::new(false));
    {
        let (healthy, ready) = (healthy.clone(), ready.clone());
        node.fake.set_exec(move |_, cmd| {
            let ok = match cmd.first().map(String::as_str) {
                Some("live") => healthy.load(Ordering::SeqCst),
                Some("ready") => ready.load(Ordering::SeqCst),
                _ => true,
            };
            (i32::from(!ok), Vec::new())
        });
    }
    let w = node.agent();
    let mut c = container("srv");
    c["livenessProbe"] = json!({"exec": {"command": ["live"]}, "periodSeconds": 2, "failureThreshold": 3});
    c["readinessProbe"] = json!({"exec": {"command": ["ready"]}, "periodSeconds": 1});
    w.upsert(pod("probed", json!({"terminationGracePeriodSeconds": 10, "containers": [c]})), Source::Api);
    until("running", || node.fake.running("probed") == ["srv"]).await;
    until("phase Running", || phase(&w, "probed") == "Running").await;
    idle(Duration::from_secs(5)).await;
    assert_eq!(condition(&w, "probed", "Ready").as_deref(), Some("False"), "not ready before its readiness probe passes");
    ready.store(true, Ordering::SeqCst);
    until("Ready", || condition(&w, "probed", "Ready").as_deref() == Some("True")).await;
    assert_eq!(node.fake.starts("probed", "srv"), 1);

    healthy.store(false, Ordering::SeqCst);
    until("restarted", || node.fake.starts("probed", "srv") == 2).await;
    healthy.store(true, Ordering::SeqCst);
    let calls = node.fake.calls_at();
    let first_fail = calls.iter().filter(|(_, c)| matches!(c, Call::ExecSync { cmd, .. } if cmd == &["live"])).count();
    assert!(first_fail >= 3, "three failed runs before the kill");
    let (_, stop) = calls.iter().find(|(_, c)| is_stop(c, "srv")).unwrap();
    assert_eq!(*stop, Call::StopContainer { pod: "probed".into(), container: "srv".into(), grace: 10 });
    until("restart counted", || app_status(&w, "probed", "srv").is_some_and(|s| s.restart_count == 1)).await;
    idle(Duration::from_secs(30)).await;
    assert_eq!(node.fake.starts("probed", "srv"), 2, "healthy again: no further restarts");
}

#[tokio::test(start_paused = true)]
async fn a_liveness_probe_with_its_own_grace_period_kills_with_it() {
    let node = Node::new();
    let healthy = Arc::new(AtomicBool::new(true));
    {
        let healthy = healthy.clone();
        node.fake.set_exec(move |_, _| (i32::from(!healthy.load(Ordering::SeqCst)), Vec::new()));
    }
    let w = node.agent();
    let mut c = container("srv");
    c["livenessProbe"] = json!({"exec": {"command": ["live"]}, "periodSeconds": 1, "failureThreshold": 1, "terminationGracePeriodSeconds": 4});
    w.upsert(pod("quick", json!({"terminationGracePeriodSeconds": 60, "containers": [c]})), Source::Api);
    until("running", || node.fake.running("quick") == ["srv"]).await;
    healthy.store(false, Ordering::SeqCst);
    until("killed", || node.fake.calls().iter().any(|c| is_stop(c, "srv"))).await;
    healthy.store(true, Ordering::SeqCst);
    let calls = node.fake.calls();
    let stop = calls.iter().find(|c| is_stop(c, "srv")).unwrap();
    assert_eq!(*stop, Call::StopContainer { pod: "quick".into(), container: "srv".into(), grace: 4 }, "the probe's 4 s, not the pod's 60 s");
}

#[tokio::test(start_paused = true)]
async fn images_are_pulled_per_policy_and_failed_pulls_back_off() {
    let node = Node::new();
    let w = node.agent();
    let mut c = container("app");
    c["image"] = json!("registry.test/new:1");
    w.upsert(pod("pull", json!({"containers": [c]})), Source::Api);
    until("running after a pull", || node.fake.running("pull") == ["app"]).await;
    assert!(node.fake.calls().contains(&Call::PullImage { image: "registry.test/new:1".into() }));

    // Present and IfNotPresent: no pull. Never and absent: ErrImageNeverPull.
    let mut never = container("app");
    never["image"] = json!("registry.test/absent:1");
    never["imagePullPolicy"] = json!("Never");
    w.upsert(pod("never", json!({"containers": [never]})), Source::Api);
    until("ErrImageNeverPull", || {
        app_status(&w, "never", "app")
            .and_then(|s| s.state?.waiting?.reason)
            .as_deref()
            == Some("ErrImageNeverPull")
    })
    .await;

    // A pull that fails: ErrImagePull, then ImagePullBackOff; retried later; runs once it works.
    node.fake.fail_pulls("registry.test/broken:1", "manifest unknown");
    let mut broken = container("app");
    broken["image"] = json!("registry.test/broken:1");
    w.upsert(pod("broken", json!({"containers": [broken]})), Source::Api);
    let reason = |w: &PodWorkers| app_status(w, "broken", "app").and_then(|s| s.state?.waiting?.reason);
    until("ErrImagePull", || reason(&w).as_deref() == Some("ErrImagePull")).await;
    until("ImagePullBackOff", || reason(&w).as_deref() == Some("ImagePullBackOff")).await;
    let pulls = || node.fake.calls().iter().filter(|c| **c == Call::PullImage { image: "registry.test/broken:1".into() }).count();
    until("pulled again", || pulls() >= 2).await;
    assert_eq!(node.fake.starts("never", "app") + node.fake.starts("broken", "app"), 0);
}

/// The watch brings back every status the agent writes: such a status-only change is stored
/// without a sync (upstream's RECONCILE), while a change of the labels or the spec syncs the
/// pod (observed again through ListPodSandbox, counted by the fake).
#[tokio::test(start_paused = true)]
async fn a_status_only_update_is_stored_without_a_sync_and_a_label_change_syncs() {
    let node = Node::new();
    let w = node.agent();
    let p = pod("quiet", json!({"containers": [container("app")]}));
    w.upsert(p.clone(), Source::Api);
    until("phase Running", || phase(&w, "quiet") == "Running").await;
    idle(Duration::from_secs(5)).await;
    let observations = || node.fake.sandbox_lists_with("io.kubernetes.pod.uid", "uid-quiet");
    let settled = observations();
    idle(Duration::from_secs(5)).await;
    assert_eq!(observations(), settled, "the pod was observed again with nothing changed");

    // the echo of the agent's own status write: a new resourceVersion and the status
    let mut echo = p.clone();
    echo.metadata.resource_version = Some("42".into());
    echo.status = Some(status(&w, "quiet"));
    w.upsert(echo.clone(), Source::Api);
    idle(Duration::from_secs(5)).await;
    assert_eq!(observations(), settled, "a status-only change synced the pod");
    assert_eq!(w.pods()[0].metadata.resource_version.as_deref(), Some("42"), "the new copy is stored");

    let mut labelled = echo;
    labelled.metadata.labels = Some([("tier".to_string(), "web".to_string())].into());
    w.upsert(labelled, Source::Api);
    until("a sync after the label change", || observations() > settled).await;
}

/// activeDeadlineSeconds counts from the startTime the pod's first sync writes: the pod fails
/// with DeadlineExceeded when it passes, not at the next periodic sync (60 s) — the first sync
/// is the only one a quiet pod gets before then.
#[tokio::test(start_paused = true)]
async fn an_active_deadline_ends_the_pod_when_it_passes_not_at_the_next_periodic_sync() {
    let node = Node::new();
    let w = node.agent();
    w.upsert(pod("short", json!({"activeDeadlineSeconds": 3, "containers": [container("app")]})), Source::Api);
    until("phase Running", || phase(&w, "short") == "Running").await;
    let started = tokio::time::Instant::now();
    until("DeadlineExceeded", || phase(&w, "short") == "Failed").await;
    assert_eq!(status(&w, "short").reason.as_deref(), Some("DeadlineExceeded"));
    let waited = started.elapsed();
    assert!(waited < Duration::from_secs(30), "failed only after {waited:?} of the paused clock: at a periodic sync, not at the deadline");
}

/// The relist sees the sandbox and container a sync started; that sync observed them running
/// and wrote the status: the pod is not synced (observed) a second time for them. An exit the
/// sync did not see still syncs it.
#[tokio::test(start_paused = true)]
async fn the_relist_does_not_sync_a_pod_again_for_what_its_sync_started_and_saw() {
    let node = Node::new();
    let w = node.agent();
    w.upsert(pod("once", json!({"containers": [container("app")]})), Source::Api);
    until("phase Running", || phase(&w, "once") == "Running").await;
    let observations = || node.fake.sandbox_lists_with("io.kubernetes.pod.uid", "uid-once");
    let settled = observations();
    idle(Duration::from_secs(5)).await;
    assert_eq!(observations(), settled, "the relist synced the pod for its own start");
    node.fake.exit("once", "app", 0);
    until("a sync after the exit", || observations() > settled).await;
}

/// A sidecar, then the next init container once the sidecar runs, then the app once the init
/// container is done: each without waiting for the periodic sync (the pod's containers all run
/// between the steps, so no relist queues it).
#[tokio::test(start_paused = true)]
async fn sidecar_init_and_app_start_one_after_the_other_without_waiting_for_the_periodic_sync() {
    let node = Node::new();
    node.fake.set_run("setup", Run::Exit { code: 0, after: Duration::from_secs(2) });
    let w = node.agent();
    let mut proxy = container("proxy");
    proxy["restartPolicy"] = json!("Always");
    let t0 = tokio::time::Instant::now();
    w.upsert(pod("chain", json!({"initContainers": [proxy, container("setup")], "containers": [container("app")]})), Source::Api);
    until("app and sidecar running", || node.fake.running("chain") == ["app", "proxy"]).await;
    let waited = t0.elapsed();
    assert!(waited < Duration::from_secs(30), "the app ran only after {waited:?} of the paused clock (setup takes 2 s)");
}

/// A container that exits as soon as it started (before the sync that started it observes it)
/// is restarted by the next sync the relist queues, not at the periodic one.
#[tokio::test(start_paused = true)]
async fn a_container_that_exits_at_once_is_restarted_without_waiting_for_the_periodic_sync() {
    let node = Node::new();
    node.fake.set_run("flash", Run::Exit { code: 1, after: Duration::ZERO });
    let w = node.agent();
    w.upsert(pod("flash", json!({"containers": [container("flash")]})), Source::Api);
    until("started once", || node.fake.starts("flash", "flash") >= 1).await;
    let t0 = tokio::time::Instant::now();
    until("started again", || node.fake.starts("flash", "flash") >= 2).await;
    // the first crash-loop back-off is 10 s; the periodic sync would come after 60 s
    let waited = t0.elapsed();
    assert!(waited < Duration::from_secs(30), "restarted only after {waited:?} of the paused clock");
}

#[tokio::test(start_paused = true)]
async fn a_restarted_agent_adopts_running_containers_without_restarting_them() {
    let node = Node::new();
    let first = node.agent();
    let p = pod("keep", json!({"containers": [container("app")]}));
    first.upsert(p.clone(), Source::Api);
    until("running", || first.last_status("uid-keep").is_some_and(|s| s.phase.as_deref() == Some("Running"))).await;
    let written = first.last_status("uid-keep").unwrap();
    first.stop();

    // The new agent gets the pod from the API, with the status the first one wrote.
    let second = node.agent();
    let mut p = p;
    p.status = Some(written.clone());
    second.upsert(p, Source::Api);
    second.queue_all().await;
    idle(Duration::from_secs(30)).await;
    assert_eq!(node.fake.starts("keep", "app"), 1);
    assert!(!node.fake.calls().iter().any(|c| is_stop(c, "app") || matches!(c, Call::RunSandbox { attempt: 1.., .. })));
    assert_eq!(node.fake.running("keep"), ["app"]);
    // Nothing changed, so nothing to write: the status it would write equals the first one's.
    let s = second.last_status("uid-keep").unwrap_or(written.clone());
    assert_eq!(s.start_time, written.start_time);
    assert_eq!(s.container_statuses, written.container_statuses);
}

/// A pod the runtime has never held (the agent listed the runtime since it started, and
/// created nothing for it) is not looked up before its first start: one observation, after
/// the start. The sandbox's addresses come from the one PodSandboxStatus after
/// RunPodSandbox; later observations do not ask again. The sync that started it sees what it
/// created (the pod is Running before the next relist could queue it).
#[tokio::test(start_paused = true)]
async fn a_new_pod_is_observed_once_its_sandbox_exists_and_its_addresses_are_asked_once() {
    let node = Node::new();
    let w = node.agent();
    idle(Duration::from_millis(1500)).await;
    let statuses = node.fake.sandbox_statuses();
    let p = pod("fresh", json!({"containers": [container("app")]}));
    let t0 = tokio::time::Instant::now();
    w.upsert(p.clone(), Source::Api);
    until("phase Running", || phase(&w, "fresh") == "Running").await;
    let waited = t0.elapsed();
    assert!(waited < Duration::from_millis(400), "Running only after {waited:?} of the paused clock: not from the sync that started it");
    let observations = || node.fake.sandbox_lists_with("io.kubernetes.pod.uid", "uid-fresh");
    assert_eq!(observations(), 1, "observed before anything was created for it");
    assert_eq!(node.fake.sandbox_statuses() - statuses, 1);
    assert_eq!(status(&w, "fresh").pod_ip.as_deref().map(|ip| !ip.is_empty()), Some(true), "{:?}", status(&w, "fresh"));

    let mut labelled = p;
    labelled.metadata.labels = Some([("tier".to_string(), "web".to_string())].into());
    w.upsert(labelled, Source::Api);
    until("a sync after the label change", || observations() > 1).await;
    assert_eq!(node.fake.sandbox_statuses() - statuses, 1, "the addresses were asked again");
}

#[tokio::test(start_paused = true)]
async fn a_pod_gone_from_the_node_is_stopped_and_removed() {
    let node = Node::new();
    let w = node.agent();
    w.upsert(pod("gone", json!({"containers": [container("a"), container("b")]})), Source::Api);
    until("running", || node.fake.running("gone") == ["a", "b"]).await;
    let pod_dir = node.dir.path().join("root/pods/uid-gone");
    assert!(pod_dir.exists());
    w.remove("uid-gone");
    until("containers and sandbox removed", || node.fake.objects() == (0, 0)).await;
    until("pod directory removed", || !pod_dir.exists()).await;
    let calls = node.fake.calls();
    assert!(position(&calls, |c| is_stop(c, "a")) < position(&calls, |c| matches!(c, Call::RemoveSandbox { .. })));
}

#[tokio::test(start_paused = true)]
async fn a_container_that_cannot_start_reports_why_and_is_retried() {
    let node = Node::new();
    node.fake.set_run("bad", Run::FailStart { message: "exec: \"nope\": executable file not found in $PATH".into() });
    let w = node.agent();
    w.upsert(pod("bad", json!({"containers": [container("bad")]})), Source::Api);
    until("RunContainerError or back-off", || {
        app_status(&w, "bad", "bad")
            .and_then(|s| s.state?.waiting?.reason)
            .is_some_and(|r| r == "RunContainerError" || r == "CrashLoopBackOff")
    })
    .await;
    until("retried", || node.fake.starts("bad", "bad") >= 2).await;
    let s = app_status(&w, "bad", "bad").unwrap();
    let last = s.last_state.and_then(|l| l.terminated).or_else(|| s.state.and_then(|st| st.terminated));
    assert!(last.is_some_and(|t| t.exit_code == 128), "the failed start shows as exit 128");
}

#[tokio::test(start_paused = true)]
async fn an_evicted_pod_fails_with_the_disruption_target_and_releases_its_volumes() {
    let node = Node::new();
    let w = node.agent();
    let mut c = container("app");
    c["volumeMounts"] = json!([{"name": "data", "mountPath": "/data"}]);
    let spec = json!({"terminationGracePeriodSeconds": 30, "volumes": [{"name": "data", "emptyDir": {}}], "containers": [c]});
    w.upsert(pod("hog", spec), Source::Api);
    until("running", || node.fake.running("hog") == ["app"]).await;
    let volumes = node.dir.path().join("root/pods/uid-hog/volumes");
    assert!(volumes.join("kubernetes.io~empty-dir/data").is_dir());
    let message = "The node was low on resource: ephemeral-storage. Threshold quantity: 1Gi, available: 10Mi. ";
    assert!(w.evict("uid-hog", message, 1));
    assert!(!w.evict("uid-hog", "again", 1), "a pod is evicted once");
    assert!(!w.evict("uid-nobody", message, 1));
    until("stopped", || node.fake.running("hog").is_empty()).await;
    until("Failed", || phase(&w, "hog") == "Failed").await;
    let st = status(&w, "hog");
    assert_eq!((st.reason.as_deref(), st.message.as_deref()), (Some("Evicted"), Some(message)));
    let dt = st.conditions.unwrap().into_iter().find(|c| c.type_ == "DisruptionTarget").unwrap();
    assert_eq!((dt.status.as_str(), dt.reason.as_deref(), dt.message.as_deref()), ("True", Some("TerminationByKubelet"), Some(message)));
    // Stopped with the eviction's grace period (1 s, raised to upstream's minimum of 2 s for a
    // StopContainer), not the pod's 30 s; never restarted.
    assert!(node.fake.calls().contains(&Call::StopContainer { pod: "hog".into(), container: "app".into(), grace: 2 }));
    until("volumes released", || !volumes.exists()).await;
    idle(Duration::from_secs(60)).await;
    assert_eq!(node.fake.starts("hog", "app"), 1);
    assert!(w.active_pods().iter().all(|p| p.metadata.name.as_deref() != Some("hog")));

    // Under memory pressure a BestEffort pod is refused; a Burstable one runs.
    w.set_pressure(ferro_agent::pod::plan::admission::NodePressure { memory: true, ..Default::default() });
    w.upsert(pod("late", json!({"containers": [container("app")]})), Source::Api);
    let mut burst = container("app");
    burst["resources"] = json!({"requests": {"memory": "10Mi"}});
    w.upsert(pod("burst", json!({"containers": [burst]})), Source::Api);
    until("late refused", || phase(&w, "late") == "Failed").await;
    let st = status(&w, "late");
    assert_eq!((st.reason.as_deref(), st.message.as_deref()), (Some("Evicted"), Some("Pod was rejected: The node had condition: [MemoryPressure]. ")));
    until("burst running", || node.fake.running("burst") == ["app"]).await;
    assert_eq!(node.fake.starts("late", "app"), 0);
}

/// imagefs.available met: the unused images are removed first (not the running pod's, not the
/// sandbox image), the image filesystem observed again; still starved (a 100 % threshold
/// cannot be relieved), so the pod is evicted for imagefs.available after all.
#[tokio::test(start_paused = true)]
async fn disk_pressure_removes_unused_images_before_evicting() {
    use ferro_agent::eviction::plan;
    let node = Node::with_images();
    let w = node.agent();
    w.upsert(pod("writer", json!({"containers": [container("writer")]})), Source::Api);
    node.fake.set_usage("writer", 10 << 20, 200 << 20);
    until("writer running", || node.fake.running("writer") == ["writer"]).await;

    let proc = node.fake_proc(2097152);
    std::fs::create_dir_all(node.dir.path().join("root")).unwrap();
    let image_gc = Some(node.image_gc_off());
    let (mut manager, watch) =
        node.eviction_manager(&w, (plan::Signal::ImagefsAvailable, plan::Threshold::Percent(100.0)), proc, image_gc);
    let d = manager.round(&mut plan::State::default()).await.unwrap();
    assert!(d.disk_pressure && watch.borrow().disk_pressure);
    assert_eq!(d.reclaim, Some(plan::Signal::ImagefsAvailable));
    let removed: Vec<String> = node
        .fake
        .calls()
        .into_iter()
        .filter_map(|c| match c {
            Call::RemoveImage { image } => Some(image),
            _ => None,
        })
        .collect();
    assert_eq!(removed.len(), 1, "only the unused image goes: {removed:?}");
    let left: Vec<String> = {
        use ferro_agent::cri::Cri as _;
        node.fake.list_images().await.unwrap().into_iter().flat_map(|i| i.repo_tags).collect()
    };
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(left.iter().any(|t| t == IMAGE) && left.iter().any(|t| t == PAUSE), "in use and the sandbox image stay: {left:?}");
    let e = d.evict.expect("a 100 % threshold stays met: the pod is evicted after the reclaim");
    assert_eq!((e.name.as_str(), e.signal), ("writer", plan::Signal::ImagefsAvailable));
    // On a shared image filesystem the pod counts its writable layer (200Mi) with its logs and
    // volumes (a few KiB of directories).
    let using_ki: u64 = e
        .message
        .split("Pod was using ")
        .nth(1)
        .and_then(|r| r.split("Ki,").next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{}", e.message));
    assert!(e.message.starts_with("The node was low on resource: ephemeral-storage. "), "{}", e.message);
    assert!((200 << 10..201 << 10).contains(&using_ki), "{}", e.message);
    until("writer evicted", || phase(&w, "writer") == "Failed").await;
}

/// nodefs.available met on a node whose images share the node's file system: the node-level
/// reclaim removes the containers and sandbox of the finished pod (with their logs) first,
/// then the unused image; the running pod's container stays. Still starved (a 100 % threshold
/// cannot be relieved), the running pod is evicted after all. The finished pod keeps its
/// status, its terminated container included.
#[tokio::test(start_paused = true)]
async fn disk_pressure_removes_the_containers_of_finished_pods_before_evicting() {
    use ferro_agent::eviction::plan;
    let node = Node::with_images();
    node.fake.set_run("quick", Run::Exit { code: 0, after: Duration::from_secs(1) });
    let w = node.agent();
    w.upsert(pod("done", json!({"restartPolicy": "Never", "containers": [container("quick")]})), Source::Api);
    w.upsert(pod("writer", json!({"containers": [container("writer")]})), Source::Api);
    until("done succeeded, writer running", || phase(&w, "done") == "Succeeded" && node.fake.running("writer") == ["writer"]).await;
    let log = node.dir.path().join("logs/default_done_uid-done/quick/0.log");
    std::fs::create_dir_all(log.parent().unwrap()).unwrap();
    std::fs::write(&log, "done\n").unwrap();

    let proc = node.fake_proc(2097152);
    std::fs::create_dir_all(node.dir.path().join("root")).unwrap();
    let image_gc = Some(node.image_gc_off());
    let (mut manager, _watch) =
        node.eviction_manager(&w, (plan::Signal::NodefsAvailable, plan::Threshold::Percent(100.0)), proc, image_gc);
    let before = node.fake.calls().len();
    let d = manager.round(&mut plan::State::default()).await.unwrap();
    assert_eq!(d.reclaim, Some(plan::Signal::NodefsAvailable));
    let calls: Vec<Call> = node.fake.calls().split_off(before);
    let at = |c: &Call| calls.iter().position(|x| x == c);
    let container_gone = at(&Call::RemoveContainer { pod: "done".into(), container: "quick".into() });
    let image_gone = calls.iter().position(|c| matches!(c, Call::RemoveImage { .. }));
    assert!(container_gone.is_some() && at(&Call::RemoveSandbox { pod: "done".into() }).is_some(), "{calls:#?}");
    assert!(container_gone < image_gone, "containers first, then images: {calls:#?}");
    assert!(
        !calls.iter().any(|c| matches!(c, Call::RemoveContainer { pod, .. } | Call::RemoveSandbox { pod } if pod == "writer")),
        "the running pod keeps its containers: {calls:#?}"
    );
    assert!(!log.exists(), "the removed container's log goes with it");
    let left: Vec<String> = {
        use ferro_agent::cri::Cri as _;
        node.fake.list_images().await.unwrap().into_iter().flat_map(|i| i.repo_tags).collect()
    };
    assert_eq!(left, [IMAGE, PAUSE], "the unused image went, the running pod's and the sandbox image stay");
    let e = d.evict.expect("a 100 % threshold stays met: the running pod is evicted after the reclaim");
    assert_eq!((e.name.as_str(), e.signal), ("writer", plan::Signal::NodefsAvailable));
    until("writer evicted", || phase(&w, "writer") == "Failed").await;
    // the finished pod, synced again with nothing left in the runtime, keeps its status
    idle(Duration::from_secs(120)).await;
    assert_eq!(phase(&w, "done"), "Succeeded");
    let t = app_status(&w, "done", "quick").unwrap().state.unwrap().terminated.unwrap();
    assert_eq!(t.exit_code, 0);
}

#[tokio::test(start_paused = true)]
async fn the_eviction_manager_evicts_the_pod_using_the_most_memory_above_its_request() {
    use ferro_agent::eviction::plan;
    let node = Node::new();
    let w = node.agent();
    let mut small = container("small");
    small["resources"] = json!({"requests": {"memory": "64Mi"}});
    w.upsert(pod("small", json!({"containers": [small]})), Source::Api);
    w.upsert(pod("big", json!({"containers": [container("big")]})), Source::Api);
    node.fake.set_usage("small", 100 << 20, 0);
    node.fake.set_usage("big", 300 << 20, 0);
    until("both running", || node.fake.running("small") == ["small"] && node.fake.running("big") == ["big"]).await;

    // A /proc whose MemAvailable is 50Mi: below upstream's 100Mi default.
    let proc = node.fake_proc(51200);
    let (mut manager, watch) =
        node.eviction_manager(&w, (plan::Signal::MemoryAvailable, plan::Threshold::Quantity(100 << 20)), proc.clone(), None);
    let mut state = plan::State::default();
    let d = manager.round(&mut state).await.unwrap();
    assert!(d.memory_pressure && !d.disk_pressure);
    assert!(watch.borrow().memory_pressure, "the node status gets MemoryPressure");
    let e = d.evict.unwrap();
    // big: 300Mi above a request of 0; small: 36Mi above 64Mi.
    assert_eq!(e.name, "big");
    assert_eq!(e.message, "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. Pod was using 300Mi, request is 0, has larger consumption of memory. ");
    until("big evicted", || phase(&w, "big") == "Failed").await;
    assert_eq!(status(&w, "big").reason.as_deref(), Some("Evicted"));
    assert_eq!(node.fake.running("small"), ["small"]);

    // Memory back: the condition holds for the transition period (5 min), then clears.
    std::fs::write(proc.join("meminfo"), "MemTotal:        4194304 kB\nMemAvailable:    2097152 kB\n").unwrap();
    let d = manager.round(&mut state).await.unwrap();
    assert!(d.memory_pressure && d.evict.is_none());
    idle(Duration::from_secs(301)).await;
    let d = manager.round(&mut state).await.unwrap();
    assert!(!d.memory_pressure);
    assert!(!watch.borrow().memory_pressure);
    assert_eq!(node.fake.running("small"), ["small"]);
}

/// allocatableMemory.available (enforceNodeAllocatable [pods]): the node has memory to spare,
/// but the pods together use more than the node's allocatable memory (4 GiB here) allows: the
/// pod most above its request is evicted, as upstream's.
#[tokio::test(start_paused = true)]
async fn pods_using_more_than_allocatable_memory_are_evicted_while_the_node_has_memory_to_spare() {
    use ferro_agent::eviction::plan;
    let node = Node::new();
    let w = node.agent();
    w.upsert(pod("hog", json!({"containers": [container("hog")]})), Source::Api);
    w.upsert(pod("quiet", json!({"containers": [container("quiet")]})), Source::Api);
    node.fake.set_usage("hog", 3900 << 20, 0);
    node.fake.set_usage("quiet", 100 << 20, 0);
    until("both running", || node.fake.running("hog") == ["hog"] && node.fake.running("quiet") == ["quiet"]).await;

    // /proc: 3 GiB available (the node is fine); the pods use 4000Mi of 4096Mi allocatable.
    let proc = node.fake_proc(3 << 20);
    let (mut manager, watch) =
        node.eviction_manager(&w, (plan::Signal::AllocatableMemoryAvailable, plan::Threshold::Quantity(100 << 20)), proc, None);
    let mut state = plan::State::default();
    let d = manager.round(&mut state).await.unwrap();
    assert!(d.memory_pressure, "{:?}", d.met);
    assert!(watch.borrow().memory_pressure);
    let e = d.evict.unwrap();
    assert_eq!((e.name.as_str(), e.signal), ("hog", plan::Signal::AllocatableMemoryAvailable));
    assert_eq!(e.message, "The node was low on resource: memory. Threshold quantity: 100Mi, available: 96Mi. Pod was using 3900Mi, request is 0, has larger consumption of memory. ");
    until("hog evicted", || phase(&w, "hog") == "Failed").await;
    assert_eq!(status(&w, "hog").reason.as_deref(), Some("Evicted"));

    // The hog's usage is gone with it: room again, nothing more evicted.
    node.fake.set_usage("hog", 0, 0);
    let d = manager.round(&mut state).await.unwrap();
    assert!(d.evict.is_none());
    assert_eq!(node.fake.running("quiet"), ["quiet"]);
}
