//! The pod workers: the executor that turns the pure decisions of [`plan`], [`status`],
//! [`spec`] and [`volumes`] into CRI calls and API writes.
//!
//! One work queue keyed by pod UID (ferro-runtime's client-go style queue: a key is synced by
//! one worker at a time, so each pod has in effect its own worker). A pod is queued when its
//! API object changes, when the relist of the runtime (upstream's PLEG: one ListContainers and
//! one ListPodSandbox every second) sees one of its containers or sandboxes change state,
//! when a probe result flips, and again after every sync (a resync period, shorter while a
//! backoff or an init container is pending). Every sync is level-triggered: it observes the
//! runtime, plans, acts, observes again and writes the status if it changed.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::time::Instant;

use k8s_openapi::api::core::v1::{Container, Pod, PodStatus};
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use ferro_runtime::{Next, WorkQueue};

use crate::clock::Clock;
use crate::cri::{self, Cri, CriError};
use crate::pod::backoff::{self, Backoff};
use crate::pod::model::{
    self, ContainerKind, ContainerObs, ContainerState, Objects, PodRuntime, Sandbox, SandboxState,
    Waiting,
};
use crate::pod::plan::admission::{self, Rejection, Room};
use crate::pod::plan::deadline::{self, grace_left, grace_seconds, Deadline};
use crate::pod::plan::image::{self as image_plan, ImageStep};
use crate::pod::plan::{self, Actions, PlanInput, Start};
use crate::pod::hooks;
use crate::pod::probe::{self, ProbeManager, Target};
use crate::pod::spec::{self, NodeContext};
use crate::pod::status::{self, StatusInput};
use crate::pod::volumes;

/// Why a sync of a pod failed (it is retried with the queue's back-off).
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error(transparent)]
    Cri(#[from] CriError),
    #[error("RunPodSandbox: {0}")]
    Sandbox(String),
    #[error(transparent)]
    Spec(#[from] spec::SpecError),
    #[error(transparent)]
    Volume(#[from] volumes::VolumeError),
    #[error(transparent)]
    Csi(#[from] crate::csi::mounter::CsiError),
    #[error("{what} {}: {source}", path.display())]
    File { what: &'static str, path: PathBuf, source: std::io::Error },
    #[error("{what}: {source}")]
    Api { what: &'static str, source: kube::Error },
}

fn file_error<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> SyncError + 'a {
    move |source| SyncError::File { what, path: path.to_path_buf(), source }
}

/// Where a pod came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Api,
    /// A static pod from --pod-manifest-path (its status goes to the mirror pod, if any).
    File,
}

/// What the executor needs to know about the node.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub root_dir: PathBuf,
    pub node: NodeContext,
    /// How long between two syncs of a pod with nothing pending.
    pub resync: Duration,
    /// Parallel pod syncs.
    pub workers: usize,
    pub max_pods: usize,
    pub allocatable_cpu_milli: i64,
    pub allocatable_memory: i64,
    /// Prefix of the pod cgroups (--cgroup-root), "" for the root.
    pub cgroup_root: String,
    /// The wall clock (the system's; tokio's in tests on paused time).
    pub clock: Clock,
}

/// The agent's own state of one pod, beyond what the runtime and the API hold.
#[derive(Debug, Default)]
struct PodState {
    waiting: BTreeMap<String, Waiting>,
    /// The status last written (or read from the API).
    last_status: Option<PodStatus>,
    /// Admission decided: Ok (runs) or Err((reason, message)) (rejected, phase Failed).
    admitted: Option<Result<(), Rejection>>,
    /// When the agent first saw the pod being deleted (for the remaining grace period).
    deletion_seen: Option<Instant>,
    /// Set when the pod's deadline passed or it was evicted: (reason, message).
    failed: Option<(String, String)>,
    /// The final status was written and the API object deleted.
    finalized: bool,
}

struct Inner {
    cfg: WorkerConfig,
    runtime_name: String,
    rt: Arc<dyn Cri>,
    kube: Option<kube::Client>,
    desired: RwLock<BTreeMap<String, (Arc<Pod>, Source)>>,
    states: Mutex<BTreeMap<String, PodState>>,
    /// The last runtime view of each pod (for the server and the relist).
    observed: RwLock<BTreeMap<String, PodRuntime>>,
    crash_backoff: Mutex<Backoff>,
    pull_backoff: Mutex<Backoff>,
    probes: ProbeManager,
    queue: WorkQueue<String>,
    events: Option<ferro_runtime::events::Recorder>,
    /// Mounts persistentVolumeClaim volumes through CSI drivers (set once by main).
    csi: std::sync::OnceLock<Arc<crate::csi::mounter::CsiMounter>>,
    /// The runtime relist task (ended by [`PodWorkers::stop`]).
    relist: Mutex<Option<tokio::task::AbortHandle>>,
}

/// The pod workers of this node.
#[derive(Clone)]
pub struct PodWorkers {
    inner: Arc<Inner>,
}

/// CRI ExecSync for probes and hooks.
struct CriExec {
    rt: Arc<dyn Cri>,
}

impl probe::Exec for CriExec {
    fn exec_sync(
        &self,
        container_id: &str,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(i32, Vec<u8>), String>> + Send>> {
        let rt = self.rt.clone();
        let id = container_id.to_string();
        Box::pin(async move { rt.exec_sync(&id, cmd, timeout).await.map_err(|e| e.message()) })
    }
}

fn uid_of(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

fn pod_label(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or("")
    )
}

fn managed() -> HashMap<String, String> {
    HashMap::from([(model::LABEL_MANAGED_BY.to_string(), model::MANAGED_BY.to_string())])
}

fn sandbox_state(s: i32) -> SandboxState {
    if s == cri::api::PodSandboxState::SandboxReady as i32 {
        SandboxState::Ready
    } else {
        SandboxState::NotReady
    }
}

fn container_state(s: i32) -> ContainerState {
    match cri::api::ContainerState::try_from(s) {
        Ok(cri::api::ContainerState::ContainerCreated) => ContainerState::Created,
        Ok(cri::api::ContainerState::ContainerRunning) => ContainerState::Running,
        Ok(cri::api::ContainerState::ContainerExited) => ContainerState::Exited,
        _ => ContainerState::Unknown,
    }
}

fn spec_container<'a>(pod: &'a Pod, kind: ContainerKind, name: &str) -> Option<&'a Container> {
    let spec = pod.spec.as_ref()?;
    match kind {
        ContainerKind::App => spec.containers.iter().find(|c| c.name == name),
        ContainerKind::Init => spec.init_containers.iter().flatten().find(|c| c.name == name),
    }
}

impl PodWorkers {
    /// Hands the workers the CSI mounter for persistentVolumeClaim volumes (once).
    pub fn set_csi(&self, mounter: Arc<crate::csi::mounter::CsiMounter>) {
        if self.inner.csi.set(mounter).is_err() {
            tracing::warn!("the CSI mounter was set twice; keeping the first");
        }
    }

    pub fn new(cfg: WorkerConfig, runtime_name: String, rt: Arc<dyn Cri>, kube: Option<kube::Client>) -> Self {
        let events = kube
            .as_ref()
            .map(|c| ferro_runtime::events::Recorder::new(c.clone(), "kubelet").with_host(&cfg.node.node_name));
        let (notify_tx, mut notify_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        let (failure_tx, mut failure_rx) = tokio::sync::mpsc::unbounded_channel::<probe::ProbeFailure>();
        let exec: Arc<dyn probe::Exec> = Arc::new(CriExec { rt: rt.clone() });
        let probes = ProbeManager::new(exec, notify_tx).with_failures(failure_tx).with_clock(cfg.clock.clone());
        let queue = WorkQueue::new();
        let inner = Arc::new(Inner {
            cfg,
            runtime_name,
            rt,
            kube,
            desired: RwLock::new(BTreeMap::new()),
            states: Mutex::new(BTreeMap::new()),
            observed: RwLock::new(BTreeMap::new()),
            crash_backoff: Mutex::new(Backoff::new(backoff::INITIAL, backoff::MAX)),
            pull_backoff: Mutex::new(Backoff::new(backoff::INITIAL, backoff::MAX)),
            probes,
            queue: queue.clone(),
            events,
            csi: std::sync::OnceLock::new(),
            relist: Mutex::new(None),
        });
        tokio::spawn(async move {
            while let Some(uid) = notify_rx.recv().await {
                queue.add(uid);
            }
        });
        // Upstream's Unhealthy events, one per failed probe run (repeats are counted).
        let weak = Arc::downgrade(&inner);
        tokio::spawn(async move {
            while let Some(f) = failure_rx.recv().await {
                let Some(inner) = weak.upgrade() else { break };
                let pod = inner.desired.read().unwrap_or_else(|p| p.into_inner()).get(&f.pod_uid).map(|(p, _)| p.clone());
                if let (Some(pod), Some(r)) = (pod, inner.events.as_ref()) {
                    r.record(pod.as_ref(), "Warning", "Unhealthy", f.event_message());
                }
            }
        });
        PodWorkers { inner }
    }

    /// Starts the workers and the runtime relist.
    pub fn start(&self) {
        let this = self.clone();
        ferro_runtime::spawn_workers("pod", self.inner.queue.clone(), self.inner.cfg.workers, move |uid: String| {
            let this = this.clone();
            async move { this.sync(&uid).await }
        });
        let this = self.clone();
        let relist = tokio::spawn(async move { this.relist_loop().await });
        *self.inner.relist.lock().unwrap_or_else(|p| p.into_inner()) = Some(relist.abort_handle());
    }

    /// Stops the workers, the relist and the probes (what a restart of the agent ends); the
    /// containers keep running. Syncs under way finish.
    pub fn stop(&self) {
        self.inner.queue.shut_down();
        if let Some(h) = self.inner.relist.lock().unwrap_or_else(|p| p.into_inner()).take() {
            h.abort();
        }
        let uids: Vec<String> = self.inner.desired.read().unwrap_or_else(|p| p.into_inner()).keys().cloned().collect();
        for uid in uids {
            self.inner.probes.remove_pod(&uid);
        }
    }

    /// The status last written for pod `uid` (or, without an API client, the one that would
    /// have been written).
    pub fn last_status(&self, uid: &str) -> Option<PodStatus> {
        self.inner.states.lock().unwrap_or_else(|p| p.into_inner()).get(uid).and_then(|s| s.last_status.clone())
    }

    /// A pod was added or changed (from the API or the manifest dir).
    pub fn upsert(&self, pod: Pod, source: Source) {
        let uid = uid_of(&pod);
        if uid.is_empty() {
            return;
        }
        self.inner.desired.write().unwrap_or_else(|p| p.into_inner()).insert(uid.clone(), (Arc::new(pod), source));
        self.inner.queue.add(uid);
    }

    /// A pod is gone from its source: its containers are stopped and everything removed.
    pub fn remove(&self, uid: &str) {
        self.inner.desired.write().unwrap_or_else(|p| p.into_inner()).remove(uid);
        self.inner.queue.add(uid.to_string());
    }

    /// The UIDs of the desired pods of `source`.
    pub fn uids(&self, source: Source) -> Vec<String> {
        let d = self.inner.desired.read().unwrap_or_else(|p| p.into_inner());
        d.iter().filter(|(_, (_, s))| *s == source).map(|(k, _)| k.clone()).collect()
    }

    /// Every pod the agent runs (for the server's /pods).
    pub fn pods(&self) -> Vec<Pod> {
        let d = self.inner.desired.read().unwrap_or_else(|p| p.into_inner());
        d.values().map(|(p, _)| (**p).clone()).collect()
    }

    /// The runtime view of a pod by namespace and name.
    pub fn runtime_of(&self, namespace: &str, name: &str) -> Option<(Arc<Pod>, PodRuntime)> {
        let d = self.inner.desired.read().unwrap_or_else(|p| p.into_inner());
        let (uid, (pod, _)) = d.iter().find(|(_, (p, _))| {
            p.metadata.namespace.as_deref() == Some(namespace) && p.metadata.name.as_deref() == Some(name)
        })?;
        let o = self.inner.observed.read().unwrap_or_else(|p| p.into_inner());
        Some((pod.clone(), o.get(uid).cloned().unwrap_or_default()))
    }

    /// Queues every known pod and every pod the runtime holds (after a restart: orphans).
    pub async fn queue_all(&self) {
        let mut uids: BTreeSet<String> =
            self.inner.desired.read().unwrap_or_else(|p| p.into_inner()).keys().cloned().collect();
        let rt = self.inner.rt.clone();
        if let Ok(sbs) = rt.list_sandboxes(managed()).await {
            uids.extend(sbs.iter().filter_map(|s| s.labels.get(model::LABEL_POD_UID).cloned()));
        }
        for uid in volumes::pod_uids_on_disk(&self.inner.cfg.root_dir) {
            uids.insert(uid);
        }
        for uid in uids {
            self.inner.queue.add(uid);
        }
    }

    /// Upstream's PLEG: relist containers and sandboxes every second and queue the pods whose
    /// state changed.
    async fn relist_loop(&self) {
        let mut last: BTreeMap<String, (String, i32)> = BTreeMap::new();
        let rt = self.inner.rt.clone();
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let (Ok(cs), Ok(sbs)) = (rt.list_containers(managed()).await, rt.list_sandboxes(managed()).await) else {
                continue;
            };
            let mut now: BTreeMap<String, (String, i32)> = BTreeMap::new();
            for c in &cs {
                if let Some(uid) = c.labels.get(model::LABEL_POD_UID) {
                    now.insert(c.id.clone(), (uid.clone(), c.state));
                }
            }
            for s in &sbs {
                if let Some(uid) = s.labels.get(model::LABEL_POD_UID) {
                    now.insert(s.id.clone(), (uid.clone(), 100 + s.state));
                }
            }
            let mut changed: BTreeSet<String> = BTreeSet::new();
            for (id, v) in &now {
                if last.get(id) != Some(v) {
                    changed.insert(v.0.clone());
                }
            }
            for (id, v) in &last {
                if !now.contains_key(id) {
                    changed.insert(v.0.clone());
                }
            }
            for uid in changed {
                self.inner.queue.add(uid);
            }
            last = now;
        }
    }

    /// Everything the runtime holds for pod `uid`, newest first.
    async fn observe(&self, uid: &str) -> Result<PodRuntime, CriError> {
        let rt = self.inner.rt.clone();
        let sel = HashMap::from([
            (model::LABEL_POD_UID.to_string(), uid.to_string()),
            (model::LABEL_MANAGED_BY.to_string(), model::MANAGED_BY.to_string()),
        ]);
        let mut out = PodRuntime { uid: uid.to_string(), ..Default::default() };
        let mut sbs = rt.list_sandboxes(sel.clone()).await?;
        sbs.sort_by_key(|s| std::cmp::Reverse(s.created_at));
        for (i, s) in sbs.iter().enumerate() {
            let md = s.metadata.clone().unwrap_or_default();
            out.name = md.name.clone();
            out.namespace = md.namespace.clone();
            let state = sandbox_state(s.state);
            let (mut ip, mut additional) = (None, Vec::new());
            if i == 0 && state == SandboxState::Ready {
                if let Some(st) = rt.sandbox_status(&s.id).await? {
                    if let Some(n) = st.network {
                        ip = Some(n.ip).filter(|x| !x.is_empty());
                        additional = n.additional_ips.into_iter().map(|p| p.ip).collect();
                    }
                }
            }
            out.sandboxes.push(Sandbox {
                id: s.id.clone(),
                attempt: md.attempt,
                state,
                created_at: s.created_at,
                ip,
                additional_ips: additional,
            });
        }
        let mut cs = rt.list_containers(sel).await?;
        cs.sort_by_key(|c| std::cmp::Reverse(c.created_at));
        for c in cs {
            let Some(st) = (match rt.container_status(&c.id).await {
                Ok(s) => s,
                Err(e) if e.is_not_found() => None,
                Err(e) => return Err(e),
            }) else {
                continue;
            };
            let md = c.metadata.clone().unwrap_or_default();
            let kind = if c.annotations.get(model::ANN_CONTAINER_TYPE).map(String::as_str) == Some("init") {
                ContainerKind::Init
            } else {
                ContainerKind::App
            };
            let name = c.labels.get(model::LABEL_CONTAINER_NAME).cloned().unwrap_or(md.name.clone());
            let restart_count: u32 =
                c.annotations.get(model::ANN_RESTART_COUNT).and_then(|h| h.parse().ok()).unwrap_or(0);
            let mut message = st.message;
            if container_state(st.state) == ContainerState::Exited {
                let fallback = c.annotations.get(model::ANN_TERMINATION_MESSAGE_POLICY).map(String::as_str)
                    == Some("FallbackToLogsOnError");
                let log = self
                    .inner
                    .cfg
                    .node
                    .pod_log_root
                    .join(format!("{}_{}_{uid}", out.namespace, out.name))
                    .join(&name)
                    .join(format!("{restart_count}.log"));
                let term = volumes::pod_dir(&self.inner.cfg.root_dir, uid)
                    .join("containers")
                    .join(&name)
                    .join(restart_count.to_string());
                if let Some(m) = termination_message(&term, fallback && st.exit_code != 0, &log) {
                    message = m;
                }
            }
            out.containers.push(ContainerObs {
                id: c.id.clone(),
                sandbox_id: c.pod_sandbox_id.clone(),
                name,
                kind,
                attempt: md.attempt,
                state: container_state(st.state),
                created_at: st.created_at,
                started_at: st.started_at,
                finished_at: st.finished_at,
                exit_code: st.exit_code,
                reason: st.reason,
                message,
                image: st.image.map(|i| i.image).unwrap_or_default(),
                image_ref: st.image_ref,
                hash: c.annotations.get(model::ANN_CONTAINER_HASH).and_then(|h| h.parse().ok()).unwrap_or(0),
                restart_count,
            });
        }
        Ok(out)
    }

    /// Records an Event about the pod (Normal or Warning), as the upstream kubelet does.
    fn event(&self, pod: &Pod, type_: &str, reason: &str, message: String) {
        if let Some(r) = self.inner.events.as_ref() {
            r.record(pod, type_, reason, message);
        }
    }

    fn now_ns(&self) -> i64 {
        self.inner.cfg.clock.now_ns()
    }

    fn with_state<T>(&self, uid: &str, f: impl FnOnce(&mut PodState) -> T) -> T {
        let mut s = self.inner.states.lock().unwrap_or_else(|p| p.into_inner());
        f(s.entry(uid.to_string()).or_default())
    }

    /// Admission as upstream ([`admission::admit`]) against the pods admitted before that
    /// have not finished.
    fn admit(&self, uid: &str, pod: &Pod, running: bool) -> Result<(), Rejection> {
        if running {
            // Already running (the agent restarted): it was admitted before.
            return Ok(());
        }
        let states = self.inner.states.lock().unwrap_or_else(|p| p.into_inner());
        let desired = self.inner.desired.read().unwrap_or_else(|p| p.into_inner());
        let admitted: Vec<&Pod> = desired
            .iter()
            .filter(|(u, _)| u.as_str() != uid)
            .filter(|(u, _)| matches!(states.get(u.as_str()).and_then(|s| s.admitted.as_ref()), Some(Ok(()))))
            .map(|(_, (p, _))| p.as_ref())
            .filter(|p| {
                !matches!(p.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
            })
            .collect();
        let room = Room {
            max_pods: self.inner.cfg.max_pods,
            allocatable_cpu_milli: self.inner.cfg.allocatable_cpu_milli,
            allocatable_memory: self.inner.cfg.allocatable_memory,
        };
        admission::admit(pod, &admitted, &room)
    }

    /// Fetches the ConfigMaps and Secrets the pod refers to (absent ones are left out).
    async fn objects(&self, pod: &Pod, with_services: bool) -> Objects {
        let mut out = Objects::default();
        let Some(client) = self.inner.kube.clone() else {
            return out;
        };
        let ns = pod.metadata.namespace.clone().unwrap_or_else(|| "default".into());
        let refs = model::references(pod);
        let cms: kube::Api<k8s_openapi::api::core::v1::ConfigMap> = kube::Api::namespaced(client.clone(), &ns);
        for n in refs.config_maps {
            if let Ok(Some(cm)) = cms.get_opt(&n).await {
                out.config_maps.insert(n, cm);
            }
        }
        let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> = kube::Api::namespaced(client.clone(), &ns);
        for n in refs.secrets {
            if let Ok(Some(s)) = secrets.get_opt(&n).await {
                out.secrets.insert(n, s);
            }
        }
        // Service links: the namespace's Services unless enableServiceLinks is false, and the
        // API server's `kubernetes` Service always.
        use k8s_openapi::api::core::v1::Service;
        if !with_services {
            return out;
        }
        if pod.spec.as_ref().and_then(|s| s.enable_service_links) != Some(false) {
            let svcs: kube::Api<Service> = kube::Api::namespaced(client.clone(), &ns);
            if let Ok(list) = svcs.list(&Default::default()).await {
                out.services.extend(list.items);
            }
        }
        if ns != "default" || pod.spec.as_ref().and_then(|s| s.enable_service_links) == Some(false) {
            let def: kube::Api<Service> = kube::Api::namespaced(client, "default");
            if let Ok(Some(s)) = def.get_opt("kubernetes").await {
                out.services.push(s);
            }
        }
        out
    }

    /// One sync of pod `uid`.
    async fn sync(&self, uid: &str) -> Result<Next, SyncError> {
        let desired = self.inner.desired.read().unwrap_or_else(|p| p.into_inner()).get(uid).cloned();
        let observed = self.observe(uid).await?;
        let Some((pod, source)) = desired else {
            return self.cleanup(uid, &observed).await.map(|_| Next::Done);
        };
        let any_running = observed.running().next().is_some();
        // Admission, once.
        let admission = self.with_state(uid, |s| s.admitted.clone());
        let admission = match admission {
            Some(a) => a,
            None => {
                let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
                let a = if matches!(phase.as_deref(), Some("Succeeded" | "Failed")) {
                    Ok(())
                } else {
                    self.admit(uid, &pod, any_running)
                };
                if let Err(r) = &a {
                    tracing::warn!(pod = %pod_label(&pod), reason = %r.reason, message = %r.message, "pod rejected");
                }
                self.with_state(uid, |s| s.admitted = Some(a.clone()));
                a
            }
        };
        if let Err(r) = admission {
            let st = status::rejected(&pod, &r.reason, &r.message, self.now_ns());
            self.write_status(uid, &pod, source, st).await?;
            // Nothing ever ran: a deletion is final at once.
            if pod.metadata.deletion_timestamp.is_some() && source == Source::Api {
                self.finalize_deletion(uid, &pod).await?;
            }
            return Ok(Next::Done);
        }

        // Terminating: deletion, deadline.
        let deleting = pod.metadata.deletion_timestamp.is_some();
        if deleting {
            self.with_state(uid, |s| {
                s.deletion_seen.get_or_insert_with(Instant::now);
            });
        }
        let last = self.with_state(uid, |s| s.last_status.clone());
        let start_time = last.as_ref().or(pod.status.as_ref()).and_then(|s| s.start_time.as_ref());
        let deadline_in = match deadline::active_deadline(&pod, start_time, self.now_ns()) {
            Deadline::In(d) => Some(d),
            Deadline::None => None,
            Deadline::Exceeded => {
                self.with_state(uid, |s| {
                    s.failed.get_or_insert_with(|| {
                        (deadline::DEADLINE_REASON.into(), deadline::DEADLINE_MESSAGE.into())
                    });
                });
                None
            }
        };
        let failed = self.with_state(uid, |s| s.failed.clone());
        // Terminal by the status the agent wrote last, else the API's copy.
        let terminal_phase = matches!(
            last.as_ref().or(pod.status.as_ref()).and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        );
        let terminating = deleting || failed.is_some() || terminal_phase;

        let probes = self.inner.probes.results(uid);
        let actions = plan::plan(&PlanInput { pod: &pod, runtime: &observed, probes: &probes, terminating });
        let mut next = self.inner.cfg.resync.min(deadline_in.unwrap_or(Duration::MAX));
        if actions.kill_pod || actions.create_sandbox || !actions.kill.is_empty() || !actions.start.is_empty() {
            tracing::debug!(pod = %pod_label(&pod), ?actions, "actions");
        }
        // Services only matter for the environment of containers being started.
        let objects = self.objects(&pod, !actions.start.is_empty()).await;
        if let Some(n) = self.execute(uid, &pod, &observed, &actions, &objects).await? {
            next = next.min(n);
        }
        self.gc_containers(&observed).await;

        // Observe again (unless nothing was done), probes, status.
        let did_nothing = !actions.kill_pod && !actions.create_sandbox && actions.kill.is_empty() && actions.start.is_empty();
        let observed = if did_nothing {
            observed
        } else {
            self.observe(uid).await?
        };
        let pod_ip = observed.sandbox().and_then(|s| s.ip.clone());
        // The newest attempts of running app containers and init containers (the probe manager
        // probes the sidecars among them).
        let running: Vec<(String, String, i64)> = observed
            .containers
            .iter()
            .filter(|c| c.state == ContainerState::Running)
            .filter(|c| observed.latest(c.kind, &c.name).map(|l| l.id == c.id).unwrap_or(false))
            .map(|c| (c.name.clone(), c.id.clone(), c.started_at))
            .collect();
        if terminating {
            self.inner.probes.remove_pod(uid);
        } else {
            self.inner.probes.sync(&pod, pod_ip.clone(), &running);
        }
        self.inner.observed.write().unwrap_or_else(|p| p.into_inner()).insert(uid.to_string(), observed.clone());
        let probes = self.inner.probes.results(uid);
        let waiting = self.with_state(uid, |s| s.waiting.clone());
        let (failed, previous) = self.with_state(uid, |s| (s.failed.clone(), s.last_status.clone()));
        let st = status::compute(&StatusInput {
            pod: &pod,
            runtime: &observed,
            probes: &probes,
            waiting: &waiting,
            runtime_name: &self.inner.runtime_name,
            host_ips: &self.inner.cfg.node.host_ips,
            now: self.now_ns(),
            failed,
            previous: previous.as_ref(),
        });
        self.write_status(uid, &pod, source, st).await?;

        // Deleted in the API and everything stopped: the final delete with grace 0.
        let all_stopped = observed.running().next().is_none()
            && observed.sandboxes.iter().all(|s| s.state == SandboxState::NotReady);
        if deleting && all_stopped && source == Source::Api {
            self.finalize_deletion(uid, &pod).await?;
            return Ok(Next::After(Duration::from_secs(5)));
        }
        // ConfigMap/Secret/downward API contents are refreshed on every sync (execute already
        // set the volumes up when it started something in this one).
        let volumes_done = actions.create_sandbox || !actions.start.is_empty();
        if !terminating && !volumes_done && !observed.sandboxes.is_empty() {
            if let Err(e) = volumes::setup(
                &self.inner.cfg.root_dir,
                &pod,
                &objects,
                self.inner.cfg.allocatable_cpu_milli,
                self.inner.cfg.allocatable_memory,
            ) {
                // The running containers keep the contents they have; the next sync tries again.
                tracing::warn!(pod = %pod_label(&pod), error = %e, "refreshing volumes failed");
                self.event(&pod, "Warning", "FailedMount", format!("MountVolume.SetUp failed: {e}"));
            }
        }
        Ok(Next::After(next))
    }

    /// A volume could not be set up: FailedMount, and every container waits in ContainerCreating
    /// saying why.
    fn mount_failed(&self, uid: &str, pod: &Pod, msg: &str) {
        tracing::warn!(pod = %pod_label(pod), error = %msg, "volume setup failed");
        self.event(pod, "Warning", "FailedMount", msg.to_string());
        self.with_state(uid, |s| {
            for c in pod.spec.iter().flat_map(|s| s.containers.iter().chain(s.init_containers.iter().flatten())) {
                s.waiting.insert(
                    c.name.clone(),
                    Waiting { reason: "ContainerCreating".into(), message: format!("MountVolume.SetUp failed: {msg}") },
                );
            }
        });
    }

    /// The pod's persistentVolumeClaim volumes, staged and published through their CSI driver.
    /// On error: the message and how soon to try again (soon while the claim is being bound or
    /// the driver registered, which takes a moment after the pod is scheduled; the scheduler
    /// does not wait for the binding as upstream's does).
    async fn csi_setup(&self, pod: &Pod) -> Result<BTreeMap<String, volumes::VolumePath>, (String, Duration)> {
        use crate::csi::mounter::CsiError;
        let has_claims = pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()).any(|v| v.persistent_volume_claim.is_some());
        if !has_claims {
            return Ok(BTreeMap::new());
        }
        match self.inner.csi.get() {
            Some(csi) => csi.setup(pod).await.map_err(|e| {
                let soon = match e {
                    CsiError::ClaimNotBound { .. } | CsiError::DriverNotRegistered(_) | CsiError::VolumeNotFound(_) => {
                        Duration::from_millis(200)
                    }
                    _ => Duration::from_secs(2),
                };
                (e.to_string(), soon)
            }),
            None => Err((CsiError::NoApi.to_string(), Duration::from_secs(2))),
        }
    }

    /// Carries out `actions`; returns how soon to look again when something is pending.
    async fn execute(
        &self,
        uid: &str,
        pod: &Pod,
        observed: &PodRuntime,
        actions: &Actions,
        objects: &Objects,
    ) -> Result<Option<Duration>, SyncError> {
        let rt = self.inner.rt.clone();
        let mut soon: Option<Duration> = None;
        if actions.kill_pod {
            self.kill_pod(uid, pod, observed).await?;
        }
        for k in &actions.kill {
            tracing::info!(pod = %pod_label(pod), container = %k.name, message = %k.message, "killing container");
            self.event(pod, "Normal", "Killing", k.message.clone());
            let grace = grace_seconds(pod);
            let t0 = Instant::now();
            if let Some(c) = observed.containers.iter().find(|c| c.id == k.id) {
                let pod_ip = observed.sandbox().and_then(|s| s.ip.clone());
                self.pre_stop(pod, c, pod_ip, grace).await;
            }
            let left = grace_left(grace, t0.elapsed().as_secs());
            CriError::gone_ok(rt.stop_container(&k.id, left).await)?;
        }
        if actions.kill_pod && !actions.create_sandbox {
            return Ok(None);
        }
        if actions.start.is_empty() && !actions.create_sandbox {
            return Ok(None);
        }
        // Volumes before the sandbox, as upstream: CSI (persistentVolumeClaim) ones first.
        let csi_vols = match self.csi_setup(pod).await {
            Ok(v) => v,
            Err((msg, soon)) => {
                self.mount_failed(uid, pod, &msg);
                return Ok(Some(soon));
            }
        };
        let vols = match volumes::setup(
            &self.inner.cfg.root_dir,
            pod,
            objects,
            self.inner.cfg.allocatable_cpu_milli,
            self.inner.cfg.allocatable_memory,
        ) {
            Ok(mut v) => {
                v.extend(csi_vols);
                v
            }
            Err(e) => {
                let msg = e.to_string();
                self.mount_failed(uid, pod, &msg);
                return Ok(Some(Duration::from_secs(2)));
            }
        };
        let mut sandbox_config =
            spec::sandbox_config(pod, actions.sandbox_attempt, &self.inner.cfg.node)?;
        if self.inner.cfg.node.cgroup_driver == spec::CgroupDriver::Cgroupfs && !self.inner.cfg.cgroup_root.is_empty() {
            if let Some(l) = sandbox_config.linux.as_mut() {
                l.cgroup_parent = format!("{}{}", self.inner.cfg.cgroup_root, l.cgroup_parent);
            }
        }
        let pod_dir = volumes::pod_dir(&self.inner.cfg.root_dir, uid);
        let (sandbox_id, pod_ips) = if actions.create_sandbox {
            let log_dir = spec::pod_log_dir(pod, &self.inner.cfg.node);
            std::fs::create_dir_all(&log_dir).map_err(file_error("creating", &log_dir))?;
            tracing::info!(pod = %pod_label(pod), attempt = actions.sandbox_attempt, "creating pod sandbox");
            let id = match rt.run_sandbox(sandbox_config.clone()).await {
                Ok(id) => id,
                Err(e) => {
                    let msg = e.message();
                    self.event(pod, "Warning", "FailedCreatePodSandBox", format!("Failed to create pod sandbox: {msg}"));
                    self.with_state(uid, |s| {
                        for c in pod.spec.iter().flat_map(|s| s.containers.iter()) {
                            s.waiting.insert(c.name.clone(), Waiting { reason: "ContainerCreating".into(), message: format!("Failed to create pod sandbox: {msg}") });
                        }
                    });
                    return Err(SyncError::Sandbox(msg));
                }
            };
            let st = rt.sandbox_status(&id).await?;
            let ips: Vec<String> = st
                .and_then(|s| s.network)
                .map(|n| std::iter::once(n.ip).chain(n.additional_ips.into_iter().map(|p| p.ip)).filter(|i| !i.is_empty()).collect())
                .unwrap_or_default();
            (id, ips)
        } else {
            let Some(id) = actions.sandbox_id.clone() else {
                return Ok(None);
            };
            let sb = observed.sandboxes.iter().find(|s| s.id == id);
            let ips = sb
                .map(|s| s.ip.iter().cloned().chain(s.additional_ips.iter().cloned()).collect())
                .unwrap_or_default();
            (id, ips)
        };
        let host_network = pod.spec.as_ref().and_then(|s| s.host_network).unwrap_or(false);
        let hosts_path = pod_dir.join("etc-hosts");
        let hosts = if host_network {
            None
        } else {
            let content = spec::hosts_file(pod, &pod_ips, &self.inner.cfg.node);
            std::fs::write(&hosts_path, content).map_err(file_error("writing", &hosts_path))?;
            Some(hosts_path.as_path())
        };
        for start in &actions.start {
            if let Some(d) = self.start_container(uid, pod, start, &sandbox_id, &sandbox_config, &vols, hosts, &pod_ips, objects).await? {
                soon = Some(soon.map_or(d, |s: Duration| s.min(d)));
            }
            if start.kind == ContainerKind::Init {
                soon = Some(soon.map_or(Duration::from_secs(1), |s| s.min(Duration::from_secs(1))));
            }
        }
        Ok(soon)
    }

    #[allow(clippy::too_many_arguments)]
    async fn start_container(
        &self,
        uid: &str,
        pod: &Pod,
        start: &Start,
        sandbox_id: &str,
        sandbox_config: &cri::api::PodSandboxConfig,
        vols: &BTreeMap<String, volumes::VolumePath>,
        hosts: Option<&Path>,
        pod_ips: &[String],
        objects: &Objects,
    ) -> Result<Option<Duration>, SyncError> {
        let Some(c) = spec_container(pod, start.kind, &start.name) else {
            return Ok(None);
        };
        let rt = self.inner.rt.clone();
        let hash = plan::container_hash(c);
        let name = c.name.clone();
        let set_waiting = |reason: &str, message: String| {
            self.with_state(uid, |s| {
                s.waiting.insert(name.clone(), Waiting { reason: reason.into(), message });
            })
        };
        // Crash-loop backoff.
        let key = backoff::container_key(uid, &c.name, hash);
        if start.previous_finished_at > 0 {
            let now = self.now_ns();
            let mut b = self.inner.crash_backoff.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(rem) = b.in_backoff(&key, start.previous_finished_at, now) {
                let cur = b.current(&key).unwrap_or(backoff::INITIAL);
                drop(b);
                self.event(pod, "Warning", "BackOff", format!("Back-off restarting failed container {} in pod {}", c.name, pod_label(pod)));
                set_waiting(
                    "CrashLoopBackOff",
                    format!(
                        "back-off {} restarting failed container={} pod={}_{}({uid})",
                        humanize(cur),
                        c.name,
                        pod.metadata.name.as_deref().unwrap_or(""),
                        pod.metadata.namespace.as_deref().unwrap_or("")
                    ),
                );
                return Ok(Some(rem));
            }
            b.next(&key, start.previous_finished_at, start.previous_ran_for);
        }
        // Image.
        let image = c.image.clone().unwrap_or_default();
        // One ImageStatus: whether to pull, and (unless a pull follows) the image's user. (No
        // name, nothing to ask: image_step refuses it.)
        let mut status =
            if image.is_empty() { None } else { rt.image_status(&image).await? };
        let present = status.is_some();
        let must_pull = match image_plan::image_step(&image, image_plan::pull_policy(c), present) {
            ImageStep::Pull => true,
            ImageStep::UsePresent => false,
            ImageStep::Invalid(msg) => {
                set_waiting("InvalidImageName", msg);
                return Ok(None);
            }
            ImageStep::NeverPullAbsent(msg) => {
                set_waiting("ErrImageNeverPull", msg);
                return Ok(Some(Duration::from_secs(5)));
            }
        };
        if must_pull {
            let pkey = format!("pull/{uid}/{image}");
            let now = self.now_ns();
            {
                let b = self.inner.pull_backoff.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(rem) = b.in_backoff(&pkey, now, now) {
                    drop(b);
                    self.event(pod, "Normal", "BackOff", format!("Back-off pulling image {image:?}"));
                    set_waiting("ImagePullBackOff", format!("Back-off pulling image {image:?}"));
                    return Ok(Some(rem));
                }
            }
            tracing::info!(pod = %pod_label(pod), %image, "pulling image");
            self.event(pod, "Normal", "Pulling", format!("Pulling image {image:?}"));
            let started = Instant::now();
            if let Err(e) = rt.pull_image(&image, Some(sandbox_config.clone())).await {
                self.event(pod, "Warning", "Failed", format!("Failed to pull image {image:?}: {}", e.message()));
                if present {
                    tracing::warn!(%image, error = %e, "pull failed; using the image present on the node");
                } else {
                    let mut b = self.inner.pull_backoff.lock().unwrap_or_else(|p| p.into_inner());
                    b.next(&pkey, now, Duration::ZERO);
                    let rem = b.current(&pkey).unwrap_or(backoff::INITIAL);
                    drop(b);
                    set_waiting("ErrImagePull", format!("failed to pull image {image:?}: {}", e.message()));
                    return Ok(Some(rem));
                }
            } else {
                self.inner.pull_backoff.lock().unwrap_or_else(|p| p.into_inner()).reset(&pkey);
                // The pulled image's user (upstream's getImageUser asks ImageStatus too).
                status = match rt.image_status(&image).await {
                    Ok(s) => s,
                    Err(e) => {
                        set_waiting("CreateContainerConfigError", e.message());
                        return Ok(Some(Duration::from_secs(5)));
                    }
                };
                self.event(
                    pod,
                    "Normal",
                    "Pulled",
                    format!("Successfully pulled image {image:?} in {:.3}s", started.elapsed().as_secs_f64()),
                );
            }
        } else if start.restart_count == 0 {
            self.event(pod, "Normal", "Pulled", format!("Container image {image:?} already present on machine"));
        }
        // Config.
        let env = match spec::resolve_env(pod, c, objects, pod_ips, &self.inner.cfg.node) {
            Ok(e) => e,
            Err(e) => {
                self.event(pod, "Warning", "Failed", format!("Error: {e}"));
                set_waiting("CreateContainerConfigError", e.to_string());
                return Ok(Some(Duration::from_secs(5)));
            }
        };
        let term_dir = volumes::pod_dir(&self.inner.cfg.root_dir, uid).join("containers").join(&c.name);
        std::fs::create_dir_all(&term_dir).map_err(file_error("creating", &term_dir))?;
        let term_file = term_dir.join(format!("{}", start.restart_count));
        std::fs::write(&term_file, b"").map_err(file_error("creating", &term_file))?;
        let spec_vols: BTreeMap<String, spec::VolumePath> = vols
            .iter()
            .map(|(k, v)| (k.clone(), spec::VolumePath { host_path: v.host_path.clone(), read_only: v.read_only }))
            .collect();
        let mounts = match spec::container_mounts(c, &spec_vols, &env, hosts, Some(&term_file)) {
            Ok(m) => m,
            Err(e) => {
                self.event(pod, "Warning", "Failed", format!("Error: {e}"));
                set_waiting("CreateContainerConfigError", e.to_string());
                return Ok(Some(Duration::from_secs(5)));
            }
        };
        let image_user = spec::ImageUser::of(status.as_ref());
        let devices = match spec::container_devices(c, &spec_vols) {
            Ok(d) => d,
            Err(e) => {
                self.event(pod, "Warning", "Failed", format!("Error: {e}"));
                set_waiting("CreateContainerConfigError", e.to_string());
                return Ok(Some(Duration::from_secs(5)));
            }
        };
        let config = match spec::container_config(pod, c, start.kind, start.attempt, start.restart_count, hash, env, mounts, &image_user, &self.inner.cfg.node) {
            Ok(mut cfg) => {
                cfg.devices = devices;
                cfg
            }
            Err(e) => {
                self.event(pod, "Warning", "Failed", format!("Error: {e}"));
                set_waiting("CreateContainerConfigError", e.to_string());
                return Ok(Some(Duration::from_secs(5)));
            }
        };
        tracing::info!(pod = %pod_label(pod), container = %c.name, attempt = start.attempt, "creating container");
        let id = match rt.create_container(sandbox_id, config, sandbox_config.clone()).await {
            Ok(id) => id,
            Err(e) => {
                self.event(pod, "Warning", "Failed", format!("Error: {}", e.message()));
                set_waiting("CreateContainerError", e.message());
                return Ok(Some(Duration::from_secs(5)));
            }
        };
        self.event(pod, "Normal", "Created", format!("Created container: {}", c.name));
        if let Err(e) = rt.start_container(&id).await {
            self.event(pod, "Warning", "Failed", format!("Error: {}", e.message()));
            // The container exists but did not start (e.g. the command does not exist): its
            // exited status carries the runtime's reason; the waiting reason says why.
            set_waiting("RunContainerError", e.message());
            return Ok(Some(Duration::from_secs(1)));
        }
        self.with_state(uid, |s| {
            s.waiting.remove(&c.name);
        });
        self.event(pod, "Normal", "Started", format!("Started container {}", c.name));
        // postStart hook.
        if let Some(h) = c.lifecycle.as_ref().and_then(|l| l.post_start.as_ref()) {
            let target = Target { pod_ip: pod_ips.first().cloned(), container_id: id.clone(), ports: c.ports.clone().unwrap_or_default() };
            let exec = CriExec { rt: self.inner.rt.clone() };
            if let Err(msg) = hooks::run_handler(h, &target, &exec, Duration::from_secs(grace_seconds(pod).max(2).unsigned_abs())).await {
                tracing::warn!(pod = %pod_label(pod), container = %c.name, error = %msg, "postStart hook failed; killing the container");
                if let Err(e) = CriError::gone_ok(rt.stop_container(&id, 2).await) {
                    tracing::warn!(pod = %pod_label(pod), container = %c.name, error = %e, "stopping after a failed postStart hook");
                }
                set_waiting("PostStartHookError", msg);
            }
        }
        Ok(None)
    }

    /// Container GC as upstream with MaxPerPodContainer=1: of each container, the newest
    /// attempt and one dead attempt before it are kept, older exited ones are removed; sandboxes
    /// other than the newest are removed once they hold no containers.
    async fn gc_containers(&self, observed: &PodRuntime) {
        let rt = self.inner.rt.clone();
        let mut seen: BTreeMap<(bool, &str), usize> = BTreeMap::new();
        let mut kept_sandboxes: BTreeSet<&str> = observed.sandbox().map(|s| s.id.as_str()).into_iter().collect();
        for c in &observed.containers {
            let n = seen.entry((c.kind == ContainerKind::Init, c.name.as_str())).or_insert(0);
            *n += 1;
            if *n > 2 && c.state == ContainerState::Exited {
                if let Err(e) = rt.remove_container(&c.id).await {
                    tracing::debug!(container = %c.id, error = %e, "container gc");
                }
            } else {
                kept_sandboxes.insert(c.sandbox_id.as_str());
            }
        }
        for s in &observed.sandboxes {
            if !kept_sandboxes.contains(s.id.as_str()) && s.state == SandboxState::NotReady {
                if let Err(e) = rt.remove_sandbox(&s.id).await {
                    tracing::debug!(sandbox = %s.id, error = %e, "sandbox gc");
                }
            }
        }
    }

    /// Stops every running container (preStop hooks first, whatever ends the pod: deletion, a
    /// finished restartPolicy Never pod's sidecars, activeDeadlineSeconds) and every ready
    /// sandbox. The app containers (and any other container that is not a sidecar)
    /// are stopped first, all at once; then the sidecars one at a time in reverse order of their
    /// declaration, each with what is left of the grace period (at least 2 s). The sidecars'
    /// preStop hooks run at the start, next to the app containers' ones (as upstream).
    async fn kill_pod(&self, uid: &str, pod: &Pod, observed: &PodRuntime) -> Result<(), SyncError> {
        let grace = grace_seconds(pod);
        let elapsed = self.with_state(uid, |s| s.deletion_seen.map(|t| t.elapsed().as_secs())).unwrap_or(0);
        let remaining = grace_left(grace, elapsed);
        let running: Vec<&ContainerObs> = observed.running().collect();
        let (first, sidecars) = plan::termination_order(pod.spec.as_ref(), &running);
        let pod_ip = observed.sandbox().and_then(|s| s.ip.clone());
        let t0 = Instant::now();
        // What is left of the grace period when a container's turn comes.
        let left = || grace_left(remaining, t0.elapsed().as_secs());
        let apps = futures::future::join_all(first.iter().map(|c| {
            let pod_ip = pod_ip.clone();
            async move {
                self.pre_stop(pod, c, pod_ip, remaining).await;
                self.stop_in_pod(pod, c, left()).await
            }
        }));
        let sidecar_hooks = futures::future::join_all(
            sidecars.iter().map(|c| self.pre_stop(pod, c, pod_ip.clone(), remaining)),
        );
        let (results, _) = futures::future::join(apps, sidecar_hooks).await;
        for r in results {
            r?;
        }
        for c in &sidecars {
            self.stop_in_pod(pod, c, left()).await?;
        }
        let rt = self.inner.rt.clone();
        for s in observed.sandboxes.iter().filter(|s| s.state == SandboxState::Ready) {
            tracing::info!(pod = %pod_label(pod), sandbox = %s.id, "stopping pod sandbox");
            CriError::gone_ok(rt.stop_sandbox(&s.id).await)?;
        }
        Ok(())
    }

    /// Runs container `c`'s preStop hook, if it has one, for at most `remaining` seconds. As
    /// upstream's killContainer, before every stop of a running container with a grace period
    /// (none when it is 0).
    async fn pre_stop(&self, pod: &Pod, c: &ContainerObs, pod_ip: Option<String>, remaining: i64) {
        if remaining <= 0 {
            return;
        }
        let Some(spec) = spec_container(pod, c.kind, &c.name) else {
            return;
        };
        let Some(h) = spec.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref()) else {
            return;
        };
        let target = Target { pod_ip, container_id: c.id.clone(), ports: spec.ports.clone().unwrap_or_default() };
        let exec = CriExec { rt: self.inner.rt.clone() };
        tracing::info!(pod = %pod_label(pod), container = %c.name, "running preStop hook");
        if let Err(e) = hooks::run_handler(h, &target, &exec, Duration::from_secs(remaining.unsigned_abs())).await {
            tracing::warn!(pod = %pod_label(pod), container = %c.name, error = %e, "preStop hook failed");
        }
    }

    /// StopContainer for container `c` of `pod` with `grace` seconds.
    async fn stop_in_pod(&self, pod: &Pod, c: &ContainerObs, grace: i64) -> Result<(), SyncError> {
        let rt = self.inner.rt.clone();
        tracing::info!(pod = %pod_label(pod), container = %c.name, grace, "stopping container");
        self.event(pod, "Normal", "Killing", format!("Stopping container {}", c.name));
        Ok(CriError::gone_ok(rt.stop_container(&c.id, grace).await)?)
    }

    /// The pod is deleted in the API and stopped here: write the final status and delete the
    /// object with grace 0 (uid precondition), as upstream's status manager.
    async fn finalize_deletion(&self, uid: &str, pod: &Pod) -> Result<(), SyncError> {
        if self.with_state(uid, |s| s.finalized) {
            return Ok(());
        }
        let Some(client) = self.inner.kube.clone() else {
            return Ok(());
        };
        let ns = pod.metadata.namespace.clone().unwrap_or_else(|| "default".into());
        let api: kube::Api<Pod> = kube::Api::namespaced(client, &ns);
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions { uid: Some(uid.to_string()), resource_version: None }),
            ..Default::default()
        };
        match api.delete(pod.metadata.name.as_deref().unwrap_or(""), &dp).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
            Err(source) => return Err(SyncError::Api { what: "deleting pod", source }),
        }
        tracing::info!(pod = %pod_label(pod), "pod terminated and deleted");
        self.with_state(uid, |s| s.finalized = true);
        Ok(())
    }

    /// Pod `uid` is no longer wanted: stop and remove its containers and sandboxes, unmount its
    /// volumes, forget it.
    async fn cleanup(&self, uid: &str, observed: &PodRuntime) -> Result<(), SyncError> {
        let rt = self.inner.rt.clone();
        self.inner.probes.remove_pod(uid);
        if !observed.containers.is_empty() || !observed.sandboxes.is_empty() {
            tracing::info!(uid = %uid, pod = %format!("{}/{}", observed.namespace, observed.name), "removing a pod that is no longer bound here");
        }
        for c in &observed.containers {
            if c.state == ContainerState::Running {
                CriError::gone_ok(rt.stop_container(&c.id, 2).await)?;
            }
            CriError::gone_ok(rt.remove_container(&c.id).await)?;
        }
        for s in &observed.sandboxes {
            CriError::gone_ok(rt.stop_sandbox(&s.id).await)?;
            CriError::gone_ok(rt.remove_sandbox(&s.id).await)?;
        }
        // CSI volumes through their driver first (unpublish, unstage), then the rest.
        if let Some(csi) = self.inner.csi.get() {
            csi.teardown(uid).await?;
        }
        volumes::teardown(&self.inner.cfg.root_dir, uid)?;
        if !observed.name.is_empty() {
            let logs = self.inner.cfg.node.pod_log_root.join(format!("{}_{}_{uid}", observed.namespace, observed.name));
            match std::fs::remove_dir_all(&logs) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    tracing::warn!(dir = %logs.display(), error = %e, "removing the pod's logs");
                }
                _ => {}
            }
        }
        if self.inner.cfg.node.cgroup_driver == spec::CgroupDriver::Cgroupfs {
            remove_pod_cgroups(Path::new("/sys/fs/cgroup"), &self.inner.cfg.cgroup_root, uid);
        }
        self.inner.states.lock().unwrap_or_else(|p| p.into_inner()).remove(uid);
        self.inner.observed.write().unwrap_or_else(|p| p.into_inner()).remove(uid);
        Ok(())
    }

    /// Writes `st` through the status subresource when it differs from what was last written.
    async fn write_status(&self, uid: &str, pod: &Pod, source: Source, st: PodStatus) -> Result<(), SyncError> {
        let last = self.with_state(uid, |s| s.last_status.clone()).or_else(|| pod.status.clone());
        if !status::changed(last.as_ref(), &st) {
            return Ok(());
        }
        let Some(client) = self.inner.kube.clone() else {
            self.with_state(uid, |s| s.last_status = Some(st));
            return Ok(());
        };
        let ns = pod.metadata.namespace.clone().unwrap_or_else(|| "default".into());
        let api: kube::Api<Pod> = kube::Api::namespaced(client, &ns);
        // Static pods: the status goes to the mirror pod (same name, its own UID).
        let patch = if source == Source::File {
            serde_json::json!({"status": st})
        } else {
            serde_json::json!({"metadata": {"uid": uid}, "status": st})
        };
        match api.patch_status(pod.metadata.name.as_deref().unwrap_or(""), &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => {
                self.with_state(uid, |s| s.last_status = Some(st));
                Ok(())
            }
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            Err(source) => Err(SyncError::Api { what: "writing pod status", source }),
        }
    }
}

/// What the :10250 server needs: the pods, and the CRI ids and log files of their containers.
impl crate::server::Lookup for PodWorkers {
    fn pods(&self) -> Vec<Pod> {
        PodWorkers::pods(self)
    }

    fn container(&self, namespace: &str, pod: &str, container: &str) -> Option<crate::server::ContainerRef> {
        let (p, rt) = self.runtime_of(namespace, pod)?;
        let kind = if p.spec.as_ref()?.containers.iter().any(|c| c.name == container) {
            ContainerKind::App
        } else {
            ContainerKind::Init
        };
        let latest = rt.latest(kind, container)?;
        let dir = spec::pod_log_dir(&p, &self.inner.cfg.node).join(container);
        let previous = rt.previous(kind, container);
        Some(crate::server::ContainerRef {
            id: latest.id.clone(),
            log_path: dir.join(format!("{}.log", latest.restart_count)),
            previous_log_path: previous.map(|c| dir.join(format!("{}.log", c.restart_count))),
            running: latest.state == ContainerState::Running,
        })
    }

    fn sandbox(&self, namespace: &str, pod: &str) -> Option<String> {
        let (_, rt) = self.runtime_of(namespace, pod)?;
        rt.sandbox().filter(|s| s.state == SandboxState::Ready).map(|s| s.id.clone())
    }
}

/// The termination message of an exited container: the file it wrote at its
/// terminationMessagePath (at most 4096 bytes), or with FallbackToLogsOnError and a failure,
/// the end of its log (at most 80 lines / 2048 bytes), as upstream.
pub fn termination_message(file: &Path, fallback_to_log: bool, log: &Path) -> Option<String> {
    if let Ok(b) = std::fs::read(file) {
        let b = &b[..b.len().min(4096)];
        if !b.is_empty() {
            return Some(String::from_utf8_lossy(b).into_owned());
        }
    }
    if !fallback_to_log {
        return None;
    }
    let text = std::fs::read_to_string(log).ok()?;
    // CRI log lines: "<time> <stream> <P|F> <content>"; P parts join the next record.
    let mut lines: Vec<String> = Vec::new();
    let mut partial = String::new();
    for l in text.lines() {
        let mut it = l.splitn(4, ' ');
        let (_, _, tag, content) = (it.next(), it.next(), it.next(), it.next().unwrap_or(""));
        partial.push_str(content);
        if tag != Some("P") {
            lines.push(std::mem::take(&mut partial));
        }
    }
    let tail = lines[lines.len().saturating_sub(80)..].join("\n");
    let start = tail.len().saturating_sub(2048);
    let start = (start..=tail.len()).find(|i| tail.is_char_boundary(*i)).unwrap_or(tail.len());
    let msg = tail[start..].to_string();
    (!msg.is_empty()).then_some(msg)
}

/// Removes the (empty) cgroup directories of pod `uid` that the runtime created under
/// `<root>/kubepods` with the cgroupfs driver, in every hierarchy (cgroup v1 controllers or the
/// v2 unified tree). Best effort: a cgroup still holding a process stays.
pub fn remove_pod_cgroups(cgroup_fs: &Path, root: &str, uid: &str) {
    let rel = root.trim_start_matches('/');
    let mut hierarchies = vec![cgroup_fs.to_path_buf()];
    if let Ok(entries) = std::fs::read_dir(cgroup_fs) {
        hierarchies.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
    }
    for h in hierarchies {
        let base = if rel.is_empty() { h.join("kubepods") } else { h.join(rel).join("kubepods") };
        for qos in ["", "burstable", "besteffort"] {
            let dir = if qos.is_empty() { base.join(format!("pod{uid}")) } else { base.join(qos).join(format!("pod{uid}")) };
            if dir.is_dir() {
                remove_cgroup_tree(&dir);
            }
        }
    }
}

/// rmdir of a cgroup directory and its sub-cgroups, deepest first.
pub fn remove_cgroup_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&e.path());
            }
        }
    }
    if let Err(e) = std::fs::remove_dir(dir) {
        tracing::debug!(cgroup = %dir.display(), error = %e, "cgroup not removed");
    }
}

/// "10s", "1m20s", "5m0s" as Go prints durations in the backoff message.
fn humanize(d: Duration) -> String {
    let s = d.as_secs();
    if s < 60 {
        format!("{s}s")
    } else {
        format!("{}m{}s", s / 60, s % 60)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn termination_messages() {
        let d = tempfile::tempdir().unwrap();
        let file = d.path().join("0");
        let log = d.path().join("0.log");
        std::fs::write(&log, "2026-01-01T00:00:00.1Z stdout P part\n2026-01-01T00:00:00.2Z stdout F ial\n2026-01-01T00:00:00.3Z stderr F boom\n").unwrap();
        assert_eq!(termination_message(&file, false, &log), None);
        assert_eq!(termination_message(&file, true, &log).as_deref(), Some("partial\nboom"));
        std::fs::write(&file, "bye").unwrap();
        assert_eq!(termination_message(&file, true, &log).as_deref(), Some("bye"));
        std::fs::write(&file, "x".repeat(5000)).unwrap();
        assert_eq!(termination_message(&file, false, &log).unwrap().len(), 4096);
    }

    #[test]
    fn backoff_message_durations() {
        assert_eq!(humanize(Duration::from_secs(10)), "10s");
        assert_eq!(humanize(Duration::from_secs(80)), "1m20s");
        assert_eq!(humanize(Duration::from_secs(300)), "5m0s");
    }
}
