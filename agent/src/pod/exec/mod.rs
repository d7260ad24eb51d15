//! The pod workers: the executor that turns the pure decisions of [`plan`], [`status`],
//! [`spec`] and [`volume`] into CRI calls and API writes.
//!
//! One work queue keyed by pod UID (ferro-runtime's client-go style queue: a key is synced by
//! one worker at a time, so each pod has in effect its own worker). A pod is queued when its
//! API object changes, when the relist of the runtime (upstream's PLEG: one ListContainers and
//! one ListPodSandbox every second) sees one of its containers or sandboxes change state,
//! when a probe result flips, and again after every sync (a resync period, shorter while a
//! backoff or an init container is pending). Every sync is level-triggered: it observes the
//! runtime, plans, acts, observes again and writes the status if it changed.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
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
use crate::pod::volume;

mod observe;
mod start;
mod stop;

pub use observe::termination_message;
pub use stop::{remove_cgroup_tree, remove_pod_cgroups};

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
    Volume(#[from] volume::VolumeError),
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
    /// Evicted: the grace period its containers get, and the DisruptionTarget message.
    evicted: Option<(i64, String)>,
    /// The volumes of the finished pod were released (unmounted, emptyDirs removed).
    volumes_released: bool,
    /// The newest sandbox's id and addresses, as PodSandboxStatus gave them (a sandbox keeps
    /// its addresses for its life: later observations do not ask again).
    sandbox_network: Option<SandboxNetwork>,
}

#[derive(Debug, Clone)]
struct SandboxNetwork {
    id: String,
    ip: Option<String>,
    additional_ips: Vec<String>,
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
    /// The pods the runtime may hold anything for (a pod outside it is observed without a
    /// CRI call).
    census: Mutex<observe::Census>,
    crash_backoff: Mutex<Backoff>,
    pull_backoff: Mutex<Backoff>,
    probes: ProbeManager,
    queue: WorkQueue<String>,
    events: Option<ferro_runtime::events::Recorder>,
    /// Mounts persistentVolumeClaim volumes through CSI drivers (set once by main).
    csi: std::sync::OnceLock<Arc<crate::csi::mounter::CsiMounter>>,
    /// The runtime relist task (ended by [`PodWorkers::stop`]).
    relist: Mutex<Option<tokio::task::AbortHandle>>,
    /// The node's pressure conditions as the eviction manager last decided (admission).
    pressure: Mutex<admission::NodePressure>,
    /// Set by [`PodWorkers::start`]: the pod sources have been read (upstream's
    /// sourcesReady), every pod of the node is known.
    started: tokio::sync::watch::Sender<bool>,
    /// The cluster's Services (the service-link environment), set once by main.
    services: std::sync::OnceLock<Arc<ferro_runtime::Informer<k8s_openapi::api::core::v1::Service>>>,
    /// Service account tokens of projected volumes.
    tokens: crate::pod::token::TokenManager,
    /// The ConfigMaps and Secrets pods refer to, from watches (set once by main; without them
    /// each sync GETs them: upstream's `Get` strategy).
    config_maps: std::sync::OnceLock<crate::pod::objects::ObjectCache<k8s_openapi::api::core::v1::ConfigMap>>,
    secrets: std::sync::OnceLock<crate::pod::objects::ObjectCache<k8s_openapi::api::core::v1::Secret>>,
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
            census: Mutex::new(observe::Census::default()),
            crash_backoff: Mutex::new(Backoff::new(backoff::INITIAL, backoff::MAX)),
            pull_backoff: Mutex::new(Backoff::new(backoff::INITIAL, backoff::MAX)),
            probes,
            queue: queue.clone(),
            events,
            csi: std::sync::OnceLock::new(),
            relist: Mutex::new(None),
            pressure: Mutex::new(admission::NodePressure::default()),
            started: tokio::sync::watch::Sender::new(false),
            services: std::sync::OnceLock::new(),
            tokens: crate::pod::token::TokenManager::default(),
            config_maps: std::sync::OnceLock::new(),
            secrets: std::sync::OnceLock::new(),
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
        self.inner.started.send_replace(true);
    }

    /// Until [`PodWorkers::start`] ran: main starts the workers once the API's pods have been
    /// listed, so the eviction manager does not rank (and evict) pods before it knows them all.
    pub async fn wait_started(&self) {
        let mut rx = self.inner.started.subscribe();
        // the sender lives as long as self
        let _ = rx.wait_for(|s| *s).await;
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

    /// Hands the workers an informer of every Service (once), read for the service-link
    /// environment instead of a list per pod start.
    pub fn set_services(&self, informer: Arc<ferro_runtime::Informer<k8s_openapi::api::core::v1::Service>>) {
        if self.inner.services.set(informer).is_err() {
            tracing::warn!("the Services informer was set twice; keeping the first");
        }
    }

    /// Read the ConfigMaps and Secrets pods refer to from these caches (upstream's `Watch`
    /// strategy) instead of a GET per sync.
    pub fn set_object_caches(
        &self,
        config_maps: crate::pod::objects::ObjectCache<k8s_openapi::api::core::v1::ConfigMap>,
        secrets: crate::pod::objects::ObjectCache<k8s_openapi::api::core::v1::Secret>,
    ) {
        if self.inner.config_maps.set(config_maps).is_err() || self.inner.secrets.set(secrets).is_err() {
            tracing::warn!("the object caches were set twice; keeping the first");
        }
    }

    /// The node's allocatable memory (bytes), as admission counts it.
    pub fn allocatable_memory(&self) -> i64 {
        self.inner.cfg.allocatable_memory
    }

    /// The node's pressure conditions, for admission (set by the eviction manager).
    pub fn set_pressure(&self, p: admission::NodePressure) {
        *self.inner.pressure.lock().unwrap_or_else(|p| p.into_inner()) = p;
    }

    /// Evicts pod `uid` (the eviction manager's decision): it fails with reason Evicted and
    /// `message`, gets the DisruptionTarget condition, and its containers are stopped with
    /// `grace_seconds`. False when the pod is unknown or already ending.
    pub fn evict(&self, uid: &str, message: &str, grace_seconds: i64) -> bool {
        let Some(pod) = self.inner.desired.read().unwrap_or_else(|p| p.into_inner()).get(uid).map(|(p, _)| p.clone())
        else {
            return false;
        };
        let fresh = self.with_state(uid, |s| {
            if s.failed.is_some() {
                return false;
            }
            s.failed = Some(("Evicted".into(), message.to_string()));
            s.evicted = Some((grace_seconds, message.to_string()));
            true
        });
        if fresh {
            tracing::warn!(pod = %pod_label(&pod), grace_seconds, %message, "evicting pod");
            self.event(&pod, "Warning", "Evicted", message.to_string());
            self.inner.queue.add(uid.to_string());
        }
        fresh
    }

    /// How many containers of pod `uid` ran at the last look at the runtime.
    pub fn running_containers(&self, uid: &str) -> usize {
        self.inner.observed.read().unwrap_or_else(|p| p.into_inner()).get(uid).map_or(0, |o| o.running().count())
    }

    /// The pods that may run and are not ending (for the eviction manager), with the status the
    /// agent wrote last.
    pub fn active_pods(&self) -> Vec<Pod> {
        let desired = self.inner.desired.read().unwrap_or_else(|p| p.into_inner());
        let states = self.inner.states.lock().unwrap_or_else(|p| p.into_inner());
        desired
            .iter()
            .filter_map(|(uid, (pod, _))| {
                let st = states.get(uid);
                if st.is_some_and(|s| s.failed.is_some() || matches!(s.admitted, Some(Err(_)))) {
                    return None;
                }
                let mut p = (**pod).clone();
                if let Some(last) = st.and_then(|s| s.last_status.clone()) {
                    p.status = Some(last);
                }
                Some(p)
            })
            .collect()
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
        let label = pod_label(&pod);
        let pod = Arc::new(pod);
        let previous =
            self.inner.desired.write().unwrap_or_else(|p| p.into_inner()).insert(uid.clone(), (pod.clone(), source));
        let sync = match &previous {
            None => {
                // Upstream's "SyncLoop ADD".
                tracing::info!(pod = %label, uid = %uid, ?source, "pod added");
                true
            }
            // a status-only change (most often the echo of this agent's own write) is stored
            // without a sync, as upstream's RECONCILE
            Some((old, old_source)) => *old_source != source || plan::update_needs_sync(old, &pod),
        };
        if sync {
            self.inner.queue.add(uid);
        }
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
        for uid in volume::pod_uids_on_disk(&self.inner.cfg.root_dir) {
            uids.insert(uid);
        }
        for uid in uids {
            self.inner.queue.add(uid);
        }
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
        let pressure = *self.inner.pressure.lock().unwrap_or_else(|p| p.into_inner());
        admission::admit(pod, &admitted, &room, pressure)
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
        let (failed, previous, evicted) =
            self.with_state(uid, |s| (s.failed.clone(), s.last_status.clone(), s.evicted.clone()));
        let mut st = status::compute(&StatusInput {
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
        if let Some((_, message)) = evicted {
            status::disruption_target(&mut st, "TerminationByKubelet", &message, self.now_ns());
        }
        let finished = matches!(st.phase.as_deref(), Some("Succeeded" | "Failed"));
        // activeDeadlineSeconds counts from the status's startTime, which the first sync only
        // now sets: look again when the deadline passes (no other sync may come before the
        // periodic one).
        if !terminating {
            match deadline::active_deadline(&pod, st.start_time.as_ref(), self.now_ns()) {
                Deadline::In(d) => next = next.min(d),
                Deadline::Exceeded => next = Duration::ZERO,
                Deadline::None => {}
            }
        }
        self.write_status(uid, &pod, source, st).await?;

        // Deleted in the API and everything stopped: the final delete with grace 0.
        let all_stopped = observed.running().next().is_none()
            && observed.sandboxes.iter().all(|s| s.state == SandboxState::NotReady);
        if deleting && all_stopped && source == Source::Api {
            self.finalize_deletion(uid, &pod).await?;
            return Ok(Next::After(Duration::from_secs(5)));
        }
        // A finished pod's volumes are released as upstream's volume manager does for
        // terminated pods: unmounted, CSI volumes unpublished and unstaged, emptyDirs removed
        // (what relieves the disk pressure an evicted pod caused). Its logs stay.
        if finished && all_stopped && !self.with_state(uid, |s| s.volumes_released) {
            if let Some(csi) = self.inner.csi.get() {
                csi.teardown(uid).await?;
            }
            volume::release(&self.inner.cfg.root_dir, uid)?;
            self.with_state(uid, |s| s.volumes_released = true);
            tracing::info!(pod = %pod_label(&pod), "released the volumes of a finished pod");
        }
        // ConfigMap/Secret/downward API contents are refreshed on every sync (execute already
        // set the volumes up when it started something in this one).
        let volumes_done = actions.create_sandbox || !actions.start.is_empty();
        if !terminating && !volumes_done && !observed.sandboxes.is_empty() {
            if let Err(e) = volume::setup(
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
        tracing::debug!(pod = %pod_label(&pod), "pod synced");
        Ok(Next::After(next))
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
        // Static pods: the status goes to the mirror pod (same name, its own UID).
        let patch = if source == Source::File {
            serde_json::json!({"status": st})
        } else {
            serde_json::json!({"metadata": {"uid": uid}, "status": st})
        };
        // The answer (the whole pod) is not decoded: nothing here reads it, and the watch
        // brings the pod anyway.
        let request = kube::core::Request::new(<Pod as kube::Resource>::url_path(&(), Some(&ns))).patch_subresource(
            "status",
            pod.metadata.name.as_deref().unwrap_or(""),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        );
        let written = match request {
            Ok(request) => client.request_text(request).await,
            Err(e) => Err(kube::Error::BuildRequest(e)),
        };
        match written {
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

    fn volume_stats(&self) -> Vec<crate::csi::mounter::VolumeStats> {
        self.inner.csi.get().map(|c| c.stats.lock().unwrap_or_else(|p| p.into_inner()).clone()).unwrap_or_default()
    }
}

