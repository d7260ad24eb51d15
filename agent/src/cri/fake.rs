//! [`FakeCri`]: an in-memory container runtime behind the [`Cri`] trait, for tests of the pod
//! workers without root, containerd or a network namespace.
//!
//! It keeps sandboxes, containers and images as a CRI runtime reports them (ids, metadata,
//! labels, annotations, states, timestamps, exit codes), moves containers through created ->
//! running -> exited, and records every call that changes something ([`Call`]) so a test can
//! assert what the agent did and in which order. What a container does once started is
//! scripted per container name ([`Run`]); a container that exits on its own does so when the
//! clock passes its start time plus its run time, so on tokio's paused clock (with
//! [`Clock::tokio`]) a test controls exactly when.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{api, Cri, CriError};
use crate::clock::Clock;

/// What a started container does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Run {
    /// Runs until stopped.
    Forever,
    /// Exits with `code` after running for `after`.
    Exit { code: i32, after: Duration },
    /// StartContainer fails with `message` (as a missing command does): the container is left
    /// exited with code 128, reason StartError.
    FailStart { message: String },
}

/// A call that changed the runtime, named by pod and container name (ids are the runtime's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    RunSandbox { pod: String, attempt: u32 },
    StopSandbox { pod: String },
    RemoveSandbox { pod: String },
    CreateContainer { pod: String, container: String, attempt: u32 },
    StartContainer { pod: String, container: String },
    StopContainer { pod: String, container: String, grace: i64 },
    RemoveContainer { pod: String, container: String },
    ExecSync { pod: String, container: String, cmd: Vec<String> },
    PullImage { image: String },
    RemoveImage { image: String },
}

/// The answer to an ExecSync: exit code and output, from the container name and command.
pub type ExecFn = Arc<dyn Fn(&str, &[String]) -> (i32, Vec<u8>) + Send + Sync>;

#[derive(Debug, Clone)]
struct FakeSandbox {
    config: api::PodSandboxConfig,
    ready: bool,
    created_at: i64,
    ip: String,
}

#[derive(Debug, Clone)]
struct FakeContainer {
    sandbox_id: String,
    config: api::ContainerConfig,
    state: api::ContainerState,
    created_at: i64,
    started_at: i64,
    finished_at: i64,
    exit_code: i32,
    reason: String,
    message: String,
    /// When it exits on its own (set at start from its [`Run`]).
    exits: Option<(i64, i32)>,
}

#[derive(Default)]
struct State {
    next_id: u64,
    sandboxes: BTreeMap<String, FakeSandbox>,
    containers: BTreeMap<String, FakeContainer>,
    images: BTreeMap<String, api::Image>,
    runs: HashMap<String, Run>,
    pull_failures: BTreeMap<String, String>,
    exec: Option<ExecFn>,
    /// Working set and writable-layer bytes per container name (ListContainerStats).
    usage: HashMap<String, (u64, u64)>,
    /// Cumulative CPU core-nanoseconds per container name (ListContainerStats).
    cpu: HashMap<String, u64>,
    /// Every call with the clock's time when it was made.
    calls: Vec<(i64, Call)>,
    /// ListPodSandbox calls per label selector (the reads are not in `calls`): one per
    /// observation of a pod, whose selector names its UID.
    sandbox_lists: HashMap<Vec<(String, String)>, usize>,
    /// PodSandboxStatus calls (reads, not in `calls` either).
    sandbox_statuses: usize,
    /// The image filesystem's mountpoint ImageFsInfo names (/var/lib/containerd unless set).
    image_fs: Option<String>,
    /// The sandbox image the Status info's config names (none unless set).
    sandbox_image: Option<String>,
}

/// The in-memory runtime. Cheap to share: wrap it in an `Arc` and hand a clone to the agent.
pub struct FakeCri {
    clock: Clock,
    state: Mutex<State>,
}

fn not_found(what: &'static str, id: &str) -> CriError {
    CriError::Call(what, tonic::Status::not_found(format!("an object with id {id:?} does not exist")))
}

fn matches(labels: &HashMap<String, String>, selector: &HashMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn pod_name(sb: Option<&FakeSandbox>) -> String {
    sb.and_then(|s| s.config.metadata.as_ref()).map(|m| m.name.clone()).unwrap_or_default()
}

fn container_name(c: &FakeContainer) -> String {
    c.config.metadata.as_ref().map(|m| m.name.clone()).unwrap_or_default()
}

impl FakeCri {
    pub fn new(clock: Clock) -> Self {
        FakeCri { clock, state: Mutex::new(State::default()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        // Containers whose run time is over have exited.
        let now = self.clock.now_ns();
        for c in s.containers.values_mut() {
            if let (api::ContainerState::ContainerRunning, Some((at, code))) = (c.state, c.exits) {
                if at <= now {
                    c.state = api::ContainerState::ContainerExited;
                    c.finished_at = at;
                    c.exit_code = code;
                    c.reason = if code == 0 { "Completed".into() } else { "Error".into() };
                }
            }
        }
        s
    }

    /// An image present on the node.
    pub fn add_image(&self, image: &str) {
        let mut s = self.lock();
        let id = format!("sha256:{:064x}", s.images.len() + 1);
        s.images.insert(
            image.to_string(),
            api::Image { id, repo_tags: vec![image.to_string()], size: 1 << 20, ..Default::default() },
        );
    }

    /// The mountpoint ImageFsInfo names from now on.
    pub fn set_image_fs(&self, mountpoint: &std::path::Path) {
        self.lock().image_fs = Some(mountpoint.display().to_string());
    }

    /// The sandbox image the runtime's Status info names (as containerd's `sandboxImage`).
    pub fn set_sandbox_image(&self, image: &str) {
        self.lock().sandbox_image = Some(image.to_string());
    }

    /// Pulls of `image` fail with `message`.
    pub fn fail_pulls(&self, image: &str, message: &str) {
        self.lock().pull_failures.insert(image.to_string(), message.to_string());
    }

    /// What containers named `name` (in any pod) do once started.
    pub fn set_run(&self, name: &str, run: Run) {
        self.lock().runs.insert(name.to_string(), run);
    }

    /// How ExecSync (probes, hooks) answers; exit 0 with no output when unset.
    pub fn set_exec(&self, f: impl Fn(&str, &[String]) -> (i32, Vec<u8>) + Send + Sync + 'static) {
        self.lock().exec = Some(Arc::new(f));
    }

    /// What ListContainerStats reports for containers named `name`: working set and
    /// writable-layer bytes.
    pub fn set_usage(&self, name: &str, working_set: u64, writable_layer: u64) {
        self.lock().usage.insert(name.to_string(), (working_set, writable_layer));
    }

    /// What ListContainerStats reports as the cumulative CPU time of containers named `name`.
    pub fn set_cpu(&self, name: &str, usage_core_nano_seconds: u64) {
        self.lock().cpu.insert(name.to_string(), usage_core_nano_seconds);
    }

    /// The running container `name` of pod `pod` exits now with `code` (a crash, an OOM kill).
    /// False when no such container is running.
    pub fn exit(&self, pod: &str, name: &str, code: i32) -> bool {
        let now = self.clock.now_ns();
        let mut s = self.lock();
        let sandboxes = s.sandboxes.clone();
        let Some(c) = s.containers.values_mut().find(|c| {
            c.state == api::ContainerState::ContainerRunning
                && container_name(c) == name
                && pod_name(sandboxes.get(&c.sandbox_id)) == pod
        }) else {
            return false;
        };
        c.state = api::ContainerState::ContainerExited;
        c.finished_at = now;
        c.exit_code = code;
        c.reason = if code == 0 { "Completed".into() } else { "Error".into() };
        true
    }

    /// How many ListPodSandbox calls so far had a selector with label `key` = `value` (e.g.
    /// the pod UID label: how often the agent observed that pod).
    pub fn sandbox_lists_with(&self, key: &str, value: &str) -> usize {
        let s = self.lock();
        s.sandbox_lists.iter().filter(|(sel, _)| sel.iter().any(|(k, v)| k == key && v == value)).map(|(_, n)| n).sum()
    }

    /// How many PodSandboxStatus calls so far.
    pub fn sandbox_statuses(&self) -> usize {
        self.lock().sandbox_statuses
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.lock().calls.iter().map(|(_, c)| c.clone()).collect()
    }

    /// Every call so far with the time (Unix ns of the fake's clock) it was made.
    pub fn calls_at(&self) -> Vec<(i64, Call)> {
        self.lock().calls.clone()
    }

    /// How many times container `name` of pod `pod` was started.
    pub fn starts(&self, pod: &str, name: &str) -> usize {
        self.calls()
            .iter()
            .filter(|c| matches!(c, Call::StartContainer { pod: p, container } if p == pod && container == name))
            .count()
    }

    /// The containers of pod `pod` that are running now, by name (sorted).
    pub fn running(&self, pod: &str) -> Vec<String> {
        let s = self.lock();
        let mut out: Vec<String> = s
            .containers
            .values()
            .filter(|c| c.state == api::ContainerState::ContainerRunning)
            .filter(|c| pod_name(s.sandboxes.get(&c.sandbox_id)) == pod)
            .map(container_name)
            .collect();
        out.sort();
        out
    }

    /// The number of sandboxes and containers the runtime holds (for "everything removed").
    pub fn objects(&self) -> (usize, usize) {
        let s = self.lock();
        (s.sandboxes.len(), s.containers.len())
    }

    fn record(&self, s: &mut State, call: Call) {
        s.calls.push((self.clock.now_ns(), call));
    }

    fn next_id(s: &mut State, prefix: &str) -> String {
        s.next_id += 1;
        format!("{prefix}{:012x}", s.next_id)
    }

    fn stop(c: &mut FakeContainer, now: i64) {
        if c.state == api::ContainerState::ContainerRunning {
            c.state = api::ContainerState::ContainerExited;
            c.finished_at = now;
            // The process ended by SIGTERM, as a shell's child does.
            c.exit_code = 143;
            c.reason = "Error".into();
        } else if c.state == api::ContainerState::ContainerCreated {
            c.state = api::ContainerState::ContainerExited;
        }
    }

    fn sandbox_status_of(id: &str, sb: &FakeSandbox) -> api::PodSandboxStatus {
        api::PodSandboxStatus {
            id: id.to_string(),
            metadata: sb.config.metadata.clone(),
            state: if sb.ready {
                api::PodSandboxState::SandboxReady as i32
            } else {
                api::PodSandboxState::SandboxNotready as i32
            },
            created_at: sb.created_at,
            network: Some(api::PodSandboxNetworkStatus { ip: sb.ip.clone(), additional_ips: Vec::new() }),
            labels: sb.config.labels.clone(),
            annotations: sb.config.annotations.clone(),
            ..Default::default()
        }
    }
}

fn host_network(config: &api::PodSandboxConfig) -> bool {
    config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.namespace_options.as_ref())
        .is_some_and(|n| n.network == api::NamespaceMode::Node as i32)
}

#[async_trait::async_trait]
impl Cri for FakeCri {
    async fn list_sandboxes(&self, labels: HashMap<String, String>) -> Result<Vec<api::PodSandbox>, CriError> {
        let mut s = self.lock();
        let mut key: Vec<(String, String)> = labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        key.sort();
        *s.sandbox_lists.entry(key).or_default() += 1;
        Ok(s.sandboxes
            .iter()
            .filter(|(_, sb)| matches(&sb.config.labels, &labels))
            .map(|(id, sb)| {
                let st = Self::sandbox_status_of(id, sb);
                api::PodSandbox {
                    id: id.clone(),
                    metadata: st.metadata,
                    state: st.state,
                    created_at: st.created_at,
                    labels: st.labels,
                    annotations: st.annotations,
                    runtime_handler: String::new(),
                }
            })
            .collect())
    }

    async fn sandbox_status(&self, id: &str) -> Result<Option<api::PodSandboxStatus>, CriError> {
        let mut s = self.lock();
        s.sandbox_statuses += 1;
        let sb = s.sandboxes.get(id).ok_or_else(|| not_found("PodSandboxStatus", id))?;
        Ok(Some(Self::sandbox_status_of(id, sb)))
    }

    async fn list_containers(&self, labels: HashMap<String, String>) -> Result<Vec<api::Container>, CriError> {
        let s = self.lock();
        Ok(s.containers
            .iter()
            .filter(|(_, c)| matches(&c.config.labels, &labels))
            .map(|(id, c)| api::Container {
                id: id.clone(),
                pod_sandbox_id: c.sandbox_id.clone(),
                metadata: c.config.metadata.clone(),
                image: c.config.image.clone(),
                image_ref: c.config.image.as_ref().map(|i| i.image.clone()).unwrap_or_default(),
                state: c.state as i32,
                created_at: c.created_at,
                labels: c.config.labels.clone(),
                annotations: c.config.annotations.clone(),
                image_id: String::new(),
            })
            .collect())
    }

    async fn container_status(&self, id: &str) -> Result<Option<api::ContainerStatus>, CriError> {
        let s = self.lock();
        let c = s.containers.get(id).ok_or_else(|| not_found("ContainerStatus", id))?;
        Ok(Some(api::ContainerStatus {
            id: id.to_string(),
            metadata: c.config.metadata.clone(),
            state: c.state as i32,
            created_at: c.created_at,
            started_at: c.started_at,
            finished_at: c.finished_at,
            exit_code: c.exit_code,
            image: c.config.image.clone(),
            image_ref: c.config.image.as_ref().map(|i| i.image.clone()).unwrap_or_default(),
            reason: c.reason.clone(),
            message: c.message.clone(),
            labels: c.config.labels.clone(),
            annotations: c.config.annotations.clone(),
            log_path: c.config.log_path.clone(),
            ..Default::default()
        }))
    }

    async fn run_sandbox(&self, config: api::PodSandboxConfig) -> Result<String, CriError> {
        let now = self.clock.now_ns();
        let mut s = self.lock();
        let id = Self::next_id(&mut s, "sb");
        let ip = if host_network(&config) { String::new() } else { format!("10.88.{}.{}", (s.next_id >> 8) & 255, s.next_id & 255) };
        let attempt = config.metadata.as_ref().map_or(0, |m| m.attempt);
        let pod = config.metadata.as_ref().map(|m| m.name.clone()).unwrap_or_default();
        self.record(&mut s, Call::RunSandbox { pod, attempt });
        s.sandboxes.insert(id.clone(), FakeSandbox { config, ready: true, created_at: now, ip });
        Ok(id)
    }

    async fn stop_sandbox(&self, id: &str) -> Result<(), CriError> {
        let now = self.clock.now_ns();
        let mut s = self.lock();
        let Some(sb) = s.sandboxes.get_mut(id) else {
            return Err(not_found("StopPodSandbox", id));
        };
        sb.ready = false;
        let pod = pod_name(Some(sb));
        for c in s.containers.values_mut().filter(|c| c.sandbox_id == id) {
            Self::stop(c, now);
        }
        self.record(&mut s, Call::StopSandbox { pod });
        Ok(())
    }

    async fn remove_sandbox(&self, id: &str) -> Result<(), CriError> {
        let mut s = self.lock();
        // Removing what is gone is success (CRI: idempotent).
        let Some(sb) = s.sandboxes.remove(id) else {
            return Ok(());
        };
        s.containers.retain(|_, c| c.sandbox_id != id);
        self.record(&mut s, Call::RemoveSandbox { pod: pod_name(Some(&sb)) });
        Ok(())
    }

    async fn create_container(
        &self,
        sandbox_id: &str,
        config: api::ContainerConfig,
        _sandbox_config: api::PodSandboxConfig,
    ) -> Result<String, CriError> {
        let now = self.clock.now_ns();
        let mut s = self.lock();
        let Some(sb) = s.sandboxes.get(sandbox_id) else {
            return Err(not_found("CreateContainer", sandbox_id));
        };
        if !sb.ready {
            return Err(CriError::Call(
                "CreateContainer",
                tonic::Status::failed_precondition(format!("sandbox {sandbox_id} is not ready")),
            ));
        }
        let image = config.image.as_ref().map(|i| i.image.clone()).unwrap_or_default();
        if !s.images.contains_key(&image) {
            return Err(CriError::Call("CreateContainer", tonic::Status::not_found(format!("image {image:?} not found"))));
        }
        let pod = pod_name(Some(sb));
        let id = Self::next_id(&mut s, "c");
        let (container, attempt) = config.metadata.as_ref().map(|m| (m.name.clone(), m.attempt)).unwrap_or_default();
        self.record(&mut s, Call::CreateContainer { pod, container, attempt });
        s.containers.insert(
            id.clone(),
            FakeContainer {
                sandbox_id: sandbox_id.to_string(),
                config,
                state: api::ContainerState::ContainerCreated,
                created_at: now,
                started_at: 0,
                finished_at: 0,
                exit_code: 0,
                reason: String::new(),
                message: String::new(),
                exits: None,
            },
        );
        Ok(id)
    }

    async fn start_container(&self, id: &str) -> Result<(), CriError> {
        let now = self.clock.now_ns();
        let mut s = self.lock();
        let Some(c) = s.containers.get(id) else {
            return Err(not_found("StartContainer", id));
        };
        let name = container_name(c);
        let pod = pod_name(s.sandboxes.get(&c.sandbox_id));
        let run = s.runs.get(&name).cloned().unwrap_or(Run::Forever);
        self.record(&mut s, Call::StartContainer { pod, container: name });
        let Some(c) = s.containers.get_mut(id) else {
            return Err(not_found("StartContainer", id));
        };
        if c.state != api::ContainerState::ContainerCreated {
            return Err(CriError::Call(
                "StartContainer",
                tonic::Status::failed_precondition(format!("container {id} is not in created state")),
            ));
        }
        match run {
            Run::FailStart { message } => {
                c.state = api::ContainerState::ContainerExited;
                c.started_at = now;
                c.finished_at = now;
                c.exit_code = 128;
                c.reason = "StartError".into();
                c.message = message.clone();
                Err(CriError::Call("StartContainer", tonic::Status::unknown(message)))
            }
            Run::Forever => {
                c.state = api::ContainerState::ContainerRunning;
                c.started_at = now;
                Ok(())
            }
            Run::Exit { code, after } => {
                c.state = api::ContainerState::ContainerRunning;
                c.started_at = now;
                c.exits = Some((now.saturating_add(i64::try_from(after.as_nanos()).unwrap_or(i64::MAX)), code));
                Ok(())
            }
        }
    }

    async fn stop_container(&self, id: &str, grace_seconds: i64) -> Result<(), CriError> {
        let now = self.clock.now_ns();
        let mut s = self.lock();
        let Some(c) = s.containers.get(id) else {
            return Err(not_found("StopContainer", id));
        };
        let (pod, container) = (pod_name(s.sandboxes.get(&c.sandbox_id)), container_name(c));
        self.record(&mut s, Call::StopContainer { pod, container, grace: grace_seconds });
        if let Some(c) = s.containers.get_mut(id) {
            Self::stop(c, now);
        }
        Ok(())
    }

    async fn remove_container(&self, id: &str) -> Result<(), CriError> {
        let mut s = self.lock();
        let Some(c) = s.containers.remove(id) else {
            return Ok(());
        };
        let (pod, container) = (pod_name(s.sandboxes.get(&c.sandbox_id)), container_name(&c));
        self.record(&mut s, Call::RemoveContainer { pod, container });
        Ok(())
    }

    async fn exec_sync(&self, id: &str, cmd: Vec<String>, _timeout: Duration) -> Result<(i32, Vec<u8>), CriError> {
        let mut s = self.lock();
        let Some(c) = s.containers.get(id) else {
            return Err(not_found("ExecSync", id));
        };
        if c.state != api::ContainerState::ContainerRunning {
            return Err(CriError::Call(
                "ExecSync",
                tonic::Status::failed_precondition(format!("container {id} is not running")),
            ));
        }
        let (pod, container) = (pod_name(s.sandboxes.get(&c.sandbox_id)), container_name(c));
        let exec = s.exec.clone();
        self.record(&mut s, Call::ExecSync { pod, container: container.clone(), cmd: cmd.clone() });
        drop(s);
        Ok(exec.map_or((0, Vec::new()), |f| f(&container, &cmd)))
    }

    async fn image_status(&self, image: &str) -> Result<Option<api::Image>, CriError> {
        Ok(self.lock().images.get(image).cloned())
    }

    async fn pull_image(&self, image: &str, _sandbox: Option<api::PodSandboxConfig>) -> Result<String, CriError> {
        let failure = {
            let mut s = self.lock();
            self.record(&mut s, Call::PullImage { image: image.to_string() });
            s.pull_failures.get(image).cloned()
        };
        if let Some(m) = failure {
            return Err(CriError::Call("PullImage", tonic::Status::unknown(m)));
        }
        self.add_image(image);
        Ok(image.to_string())
    }

    async fn list_images(&self) -> Result<Vec<api::Image>, CriError> {
        Ok(self.lock().images.values().cloned().collect())
    }

    async fn remove_image(&self, image: &str) -> Result<(), CriError> {
        let mut s = self.lock();
        let names: BTreeSet<String> =
            s.images.iter().filter(|(n, i)| n.as_str() == image || i.id == image).map(|(n, _)| n.clone()).collect();
        for n in &names {
            s.images.remove(n);
        }
        self.record(&mut s, Call::RemoveImage { image: image.to_string() });
        Ok(())
    }

    async fn image_fs_info(&self) -> Result<Vec<api::FilesystemUsage>, CriError> {
        let s = self.lock();
        let used: u64 = s.images.values().map(|i| i.size).sum();
        Ok(vec![api::FilesystemUsage {
            timestamp: self.clock.now_ns(),
            fs_id: Some(api::FilesystemIdentifier {
                mountpoint: s.image_fs.clone().unwrap_or_else(|| "/var/lib/containerd".into()),
            }),
            used_bytes: Some(api::UInt64Value { value: used }),
            inodes_used: None,
        }])
    }

    async fn status_info(&self) -> Result<HashMap<String, String>, CriError> {
        Ok(match &self.lock().sandbox_image {
            Some(image) => HashMap::from([("config".to_string(), serde_json::json!({ "sandboxImage": image }).to_string())]),
            None => HashMap::new(),
        })
    }

    async fn list_container_stats(&self, labels: HashMap<String, String>) -> Result<Vec<api::ContainerStats>, CriError> {
        let now = self.clock.now_ns();
        let s = self.lock();
        Ok(s.containers
            .iter()
            .filter(|(_, c)| c.state == api::ContainerState::ContainerRunning && matches(&c.config.labels, &labels))
            .map(|(id, c)| {
                let (ws, layer) = s.usage.get(&container_name(c)).copied().unwrap_or_default();
                api::ContainerStats {
                    attributes: Some(api::ContainerAttributes {
                        id: id.clone(),
                        metadata: c.config.metadata.clone(),
                        labels: c.config.labels.clone(),
                        annotations: c.config.annotations.clone(),
                    }),
                    cpu: s.cpu.get(&container_name(c)).map(|ns| api::CpuUsage {
                        timestamp: now,
                        usage_core_nano_seconds: Some(api::UInt64Value { value: *ns }),
                        usage_nano_cores: None,
                    }),
                    memory: Some(api::MemoryUsage {
                        timestamp: now,
                        working_set_bytes: Some(api::UInt64Value { value: ws }),
                        ..Default::default()
                    }),
                    writable_layer: Some(api::FilesystemUsage {
                        timestamp: now,
                        used_bytes: Some(api::UInt64Value { value: layer }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }
            })
            .collect())
    }

    /// Unimplemented, as a runtime without the RPC answers (the caller then sums the
    /// containers' usage).
    async fn list_pod_sandbox_stats(&self, _labels: HashMap<String, String>) -> Result<Vec<api::PodSandboxStats>, CriError> {
        Err(CriError::Call("ListPodSandboxStats", tonic::Status::unimplemented("ListPodSandboxStats is not implemented")))
    }
}
