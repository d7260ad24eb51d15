//! The pod status the agent reports: phase, container statuses, conditions, IPs and start time,
//! computed from the pod as the API has it, what the runtime holds for it ([`PodRuntime`]),
//! the probe results and why containers wait. Pure: no I/O, the caller passes `now`.
//!
//! The semantics are upstream's (kubelet `generateAPIPodStatus`, `getPhase`,
//! `convertToAPIContainerStatuses`, the condition generators and the status manager's
//! transition-time handling), so `kubectl` and controllers see what they expect:
//!
//! - Every spec container gets a status. A container without any attempt in the runtime
//!   waits with `ContainerCreating`, or `PodInitializing` when the pod has init containers
//!   (upstream uses that default for init and app containers alike). When the runtime no
//!   longer holds a container whose previous status was terminated, that status is kept.
//! - App container statuses are sorted by name, init container statuses follow the spec.
//! - A pod whose status is Succeeded or Failed never leaves that phase.
//! - Conditions not owned by the kubelet (readiness gates, DisruptionTarget...) are kept as
//!   they are; the kubelet-owned ones are recomputed and keep their lastTransitionTime while
//!   their status does not change.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{
    Container, ContainerState as ApiState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, HostIP, Pod, PodCondition, PodIP, PodSpec, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::model::{
    is_sidecar, qos_class, ContainerKind, ContainerObs, ContainerState, PodRuntime, ProbeResults, SandboxState, Waiting,
};

pub const PHASE_PENDING: &str = "Pending";
pub const PHASE_RUNNING: &str = "Running";
pub const PHASE_SUCCEEDED: &str = "Succeeded";
pub const PHASE_FAILED: &str = "Failed";

pub const CONDITION_POD_SCHEDULED: &str = "PodScheduled";
pub const CONDITION_READY_TO_START: &str = "PodReadyToStartContainers";
pub const CONDITION_INITIALIZED: &str = "Initialized";
pub const CONDITION_CONTAINERS_READY: &str = "ContainersReady";
pub const CONDITION_READY: &str = "Ready";

/// The condition types the kubelet owns (and recomputes on every status).
const KUBELET_CONDITIONS: [&str; 5] = [
    CONDITION_POD_SCHEDULED,
    CONDITION_READY,
    CONDITION_INITIALIZED,
    CONDITION_CONTAINERS_READY,
    CONDITION_READY_TO_START,
];

/// Default waiting reasons.
pub const REASON_CONTAINER_CREATING: &str = "ContainerCreating";
pub const REASON_POD_INITIALIZING: &str = "PodInitializing";
/// A container the runtime lost track of (upstream's ContainerStatusUnknown, exit code 137).
pub const REASON_STATUS_UNKNOWN: &str = "ContainerStatusUnknown";

/// Everything the status computation looks at for one pod.
pub struct StatusInput<'a> {
    /// The pod as the API has it (its current status included).
    pub pod: &'a Pod,
    pub runtime: &'a PodRuntime,
    pub probes: &'a ProbeResults,
    /// Why containers wait, from the last sync (by container name; init and app names are
    /// unique in a pod).
    pub waiting: &'a BTreeMap<String, Waiting>,
    /// "containerd" -> containerID "containerd://<id>".
    pub runtime_name: &'a str,
    pub host_ips: &'a [String],
    /// Unix ns; used for startTime (when unset) and condition transition times.
    pub now: i64,
    /// Set when the executor decided the pod is terminal: Some(("DeadlineExceeded", msg)) for
    /// activeDeadlineSeconds, or the reason of an eviction. Gives phase Failed with that
    /// reason/message.
    pub failed: Option<(String, String)>,
    /// The status the agent wrote last for this pod, if any: the base to compute from, as
    /// upstream's status manager prefers its own copy to the API's (which may lag behind). The
    /// conditions the agent does not own still come from the API's copy.
    pub previous: Option<&'a PodStatus>,
}

/// A Kubernetes `Time` from unix nanoseconds, truncated to whole seconds as the API stores
/// it (so that a status read back from the API compares equal to a recomputed one).
pub fn rfc3339(ns: i64) -> Time {
    let secs = ns.div_euclid(1_000_000_000);
    Time(jiff::Timestamp::from_second(secs).unwrap_or(jiff::Timestamp::UNIX_EPOCH))
}

/// The pod status for `input`.
pub fn compute(input: &StatusInput) -> PodStatus {
    let pod = input.pod;
    let default_spec = PodSpec::default();
    let spec = pod.spec.as_ref().unwrap_or(&default_spec);
    let old = base_status(pod.status.as_ref(), input.previous);
    let ctx = Ctx {
        runtime: input.runtime,
        probes: input.probes,
        waiting: input.waiting,
        runtime_name: input.runtime_name,
        restart_policy: spec.restart_policy.as_deref().unwrap_or("Always"),
        deleting: pod.metadata.deletion_timestamp.is_some(),
        has_init: spec.init_containers.as_ref().is_some_and(|v| !v.is_empty()),
    };
    let init = ctx.statuses(spec.init_containers.as_deref().unwrap_or_default(), ContainerKind::Init, &old);
    let app = ctx.statuses(&spec.containers, ContainerKind::App, &old);

    let pod_is_terminal = input.failed.is_some() || ctx.deleting;
    let mut phase = get_phase(spec, &init, &app, pod_is_terminal);
    let old_phase = old.phase.as_deref();
    // The reason and message belong to the phase: kept while it does not change.
    let (mut reason, mut message) = if old_phase == Some(phase) {
        (old.reason.clone(), old.message.clone())
    } else {
        (None, None)
    };
    if let Some((r, m)) = &input.failed {
        phase = PHASE_FAILED;
        reason = non_empty(r);
        message = non_empty(m);
    }
    if let Some(terminal) = old_phase.and_then(terminal_phase) {
        if phase != terminal {
            phase = terminal;
            reason = old.reason.clone();
            message = old.message.clone();
        }
    }

    let conditions = conditions(input, spec, &old, &init, &app, phase);

    let host_network = spec.host_network == Some(true);
    let mut pod_ips = if host_network { Vec::new() } else { sandbox_ips(input.runtime, input.host_ips) };
    if pod_ips.is_empty() && host_network {
        pod_ips = input.host_ips.iter().take(2).cloned().collect();
    }

    let mut s = old.clone();
    s.phase = Some(phase.to_string());
    s.reason = reason;
    s.message = message;
    s.conditions = Some(conditions);
    s.init_container_statuses = (!init.is_empty()).then_some(init);
    s.container_statuses = (!app.is_empty()).then_some(app);
    // A terminal pod whose sandbox is gone keeps the IPs it had.
    if !pod_ips.is_empty() || terminal_phase(phase).is_none() {
        s.pod_ip = pod_ips.first().cloned();
        s.pod_ips = (!pod_ips.is_empty()).then(|| pod_ips.into_iter().map(|ip| PodIP { ip }).collect());
    }
    if let Some(first) = input.host_ips.first() {
        s.host_ip = Some(first.clone());
        s.host_ips = Some(input.host_ips.iter().take(2).map(|ip| HostIP { ip: ip.clone() }).collect());
    }
    if s.start_time.is_none() {
        s.start_time = Some(rfc3339(input.now));
    }
    s.qos_class = Some(qos_class(pod).as_str().to_string());
    s
}

/// The status to compute from: the agent's last written one when there is one, with the
/// conditions it does not own taken from the API's copy (the control plane may have added
/// them since); else the API's.
fn base_status(api: Option<&PodStatus>, previous: Option<&PodStatus>) -> PodStatus {
    let Some(prev) = previous else {
        return api.cloned().unwrap_or_default();
    };
    let mut old = prev.clone();
    let ours = prev.conditions.iter().flatten().filter(|c| KUBELET_CONDITIONS.contains(&c.type_.as_str()));
    let theirs = api
        .and_then(|a| a.conditions.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| !KUBELET_CONDITIONS.contains(&c.type_.as_str()));
    let merged: Vec<PodCondition> = theirs.chain(ours).cloned().collect();
    old.conditions = (!merged.is_empty()).then_some(merged);
    old
}

/// Adds upstream's DisruptionTarget condition (True, `reason`, `message`) unless the status has
/// it already.
pub fn disruption_target(s: &mut PodStatus, reason: &str, message: &str, now: i64) {
    let conditions = s.conditions.get_or_insert_with(Vec::new);
    if conditions.iter().any(|c| c.type_ == "DisruptionTarget" && c.status == "True") {
        return;
    }
    conditions.retain(|c| c.type_ != "DisruptionTarget");
    conditions.push(PodCondition {
        type_: "DisruptionTarget".into(),
        status: "True".into(),
        reason: non_empty(reason),
        message: non_empty(message),
        last_transition_time: Some(rfc3339(now)),
        ..Default::default()
    });
}

/// The status of a pod the agent refused at admission: phase Failed with `reason` (e.g.
/// "OutOfcpu", "OutOfmemory", "UnexpectedAdmissionError") and the message upstream writes,
/// "Pod was rejected: <message>" (the prefix is not doubled when `message` has it already).
/// Existing conditions and startTime are kept; startTime is set to `now` when missing.
pub fn rejected(pod: &Pod, reason: &str, message: &str, now: i64) -> PodStatus {
    const PREFIX: &str = "Pod was rejected: ";
    let mut s = pod.status.clone().unwrap_or_default();
    s.phase = Some(PHASE_FAILED.to_string());
    s.reason = non_empty(reason);
    s.message = Some(if message.starts_with(PREFIX) { message.to_string() } else { format!("{PREFIX}{message}") });
    s.qos_class = Some(qos_class(pod).as_str().to_string());
    if s.start_time.is_none() {
        s.start_time = Some(rfc3339(now));
    }
    s
}

/// Whether `new` differs from `old` in anything but condition lastProbeTime. Fields the API
/// server drops when empty (empty strings, empty lists, nulls) count as absent, so a status
/// read back from the API compares equal to the one that was written.
pub fn changed(old: Option<&PodStatus>, new: &PodStatus) -> bool {
    let Some(old) = old else {
        return true;
    };
    match (normalized(old), normalized(new)) {
        (Ok(a), Ok(b)) => a != b,
        _ => old != new,
    }
}

/// The pod's phase (upstream getPhase) from what the runtime holds, without probe results:
/// Pending / Running / Succeeded / Failed. A pod whose status is already terminal keeps its
/// phase; a pod being deleted whose containers have all stopped is terminal.
pub fn phase(pod: &Pod, runtime: &PodRuntime) -> &'static str {
    let default_spec = PodSpec::default();
    let spec = pod.spec.as_ref().unwrap_or(&default_spec);
    let old = pod.status.clone().unwrap_or_default();
    if let Some(terminal) = old.phase.as_deref().and_then(terminal_phase) {
        return terminal;
    }
    let probes = ProbeResults::default();
    let waiting = BTreeMap::new();
    let ctx = Ctx {
        runtime,
        probes: &probes,
        waiting: &waiting,
        runtime_name: "",
        restart_policy: spec.restart_policy.as_deref().unwrap_or("Always"),
        deleting: pod.metadata.deletion_timestamp.is_some(),
        has_init: spec.init_containers.as_ref().is_some_and(|v| !v.is_empty()),
    };
    let init = ctx.statuses(spec.init_containers.as_deref().unwrap_or_default(), ContainerKind::Init, &old);
    let app = ctx.statuses(&spec.containers, ContainerKind::App, &old);
    get_phase(spec, &init, &app, ctx.deleting)
}

fn terminal_phase(p: &str) -> Option<&'static str> {
    match p {
        PHASE_SUCCEEDED => Some(PHASE_SUCCEEDED),
        PHASE_FAILED => Some(PHASE_FAILED),
        _ => None,
    }
}

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

fn time_opt(ns: i64) -> Option<Time> {
    (ns > 0).then(|| rfc3339(ns))
}

/// An init container with restartPolicy Always (a sidecar).
fn restartable(c: &Container, kind: ContainerKind) -> bool {
    kind == ContainerKind::Init && is_sidecar(c)
}

fn waiting_state(reason: &str, message: &str) -> ApiState {
    ApiState {
        waiting: Some(ContainerStateWaiting { reason: non_empty(reason), message: non_empty(message) }),
        ..Default::default()
    }
}

fn running(s: &ContainerStatus) -> bool {
    s.state.as_ref().is_some_and(|st| st.running.is_some())
}

fn terminated(s: &ContainerStatus) -> Option<&ContainerStateTerminated> {
    s.state.as_ref().and_then(|st| st.terminated.as_ref())
}

fn last_terminated(s: &ContainerStatus) -> Option<&ContainerStateTerminated> {
    s.last_state.as_ref().and_then(|st| st.terminated.as_ref())
}

fn waiting(s: &ContainerStatus) -> bool {
    s.state.as_ref().is_some_and(|st| st.waiting.is_some())
}

/// What the container statuses are built from.
struct Ctx<'a> {
    runtime: &'a PodRuntime,
    probes: &'a ProbeResults,
    waiting: &'a BTreeMap<String, Waiting>,
    runtime_name: &'a str,
    restart_policy: &'a str,
    deleting: bool,
    has_init: bool,
}

impl Ctx<'_> {
    fn container_id(&self, id: &str) -> String {
        format!("{}://{}", self.runtime_name, id)
    }

    /// The API state of one attempt, and the restart count when it has to be derived from the
    /// old status (a container the runtime reports in an unknown state after it was running).
    fn state_of(&self, o: &ContainerObs, old: Option<&ContainerStatus>) -> (ApiState, Option<i32>) {
        match o.state {
            ContainerState::Running => (
                ApiState {
                    running: Some(ContainerStateRunning { started_at: time_opt(o.started_at) }),
                    ..Default::default()
                },
                None,
            ),
            ContainerState::Exited => {
                let reason = if !o.reason.is_empty() {
                    o.reason.clone()
                } else if o.exit_code == 0 {
                    "Completed".to_string()
                } else {
                    "Error".to_string()
                };
                let t = ContainerStateTerminated {
                    exit_code: o.exit_code,
                    reason: Some(reason),
                    message: non_empty(&o.message),
                    started_at: time_opt(o.started_at),
                    finished_at: time_opt(o.finished_at),
                    container_id: Some(self.container_id(&o.id)),
                    signal: None,
                };
                (ApiState { terminated: Some(t), ..Default::default() }, None)
            }
            ContainerState::Unknown if old.is_some_and(running) => {
                let t = ContainerStateTerminated {
                    exit_code: 137,
                    reason: Some(REASON_STATUS_UNKNOWN.to_string()),
                    message: Some("The container could not be located when the pod was terminated".to_string()),
                    ..Default::default()
                };
                let restarts = old.map(|s| s.restart_count.saturating_add(1));
                (ApiState { terminated: Some(t), ..Default::default() }, restarts)
            }
            // Created, or unknown: "waiting to be running", without a reason (upstream).
            ContainerState::Created | ContainerState::Unknown => {
                (ApiState { waiting: Some(ContainerStateWaiting::default()), ..Default::default() }, None)
            }
        }
    }

    /// Upstream ShouldContainerBeRestarted: whether the next sync (re)starts the container.
    fn should_restart(&self, c: &Container, kind: ContainerKind, latest: Option<&ContainerObs>) -> bool {
        if self.deleting {
            return false;
        }
        let Some(l) = latest else {
            return true;
        };
        match l.state {
            ContainerState::Running => false,
            ContainerState::Created | ContainerState::Unknown => true,
            ContainerState::Exited => {
                if restartable(c, kind) {
                    return true;
                }
                match self.restart_policy {
                    "Never" => false,
                    "OnFailure" => l.exit_code != 0,
                    _ => true,
                }
            }
        }
    }

    fn statuses(&self, containers: &[Container], kind: ContainerKind, old: &PodStatus) -> Vec<ContainerStatus> {
        let old_list = match kind {
            ContainerKind::Init => old.init_container_statuses.as_deref(),
            ContainerKind::App => old.container_statuses.as_deref(),
        }
        .unwrap_or_default();
        let mut out: Vec<ContainerStatus> = containers
            .iter()
            .map(|c| self.status(c, kind, old_list.iter().find(|s| s.name == c.name)))
            .collect();
        if kind == ContainerKind::App {
            out.sort_by(|a, b| a.name.cmp(&b.name));
        }
        out
    }

    fn status(&self, c: &Container, kind: ContainerKind, old: Option<&ContainerStatus>) -> ContainerStatus {
        let default_reason = if self.has_init { REASON_POD_INITIALIZING } else { REASON_CONTAINER_CREATING };
        let latest = self.runtime.latest(kind, &c.name);
        let image = c.image.clone().unwrap_or_default();
        let mut s = match latest {
            Some(l) => {
                let (state, restarts) = self.state_of(l, old);
                let last_state = self.runtime.previous(kind, &c.name).map(|p| self.state_of(p, old).0);
                ContainerStatus {
                    name: c.name.clone(),
                    image,
                    image_id: l.image_ref.clone(),
                    container_id: Some(self.container_id(&l.id)),
                    restart_count: restarts.unwrap_or(i32::try_from(l.restart_count).unwrap_or(i32::MAX)),
                    state: Some(state),
                    last_state,
                    ..Default::default()
                }
            }
            None => self.status_without_attempt(c, image, old, default_reason),
        };

        // A container the next sync starts again shows why it waits (image pull errors,
        // CrashLoopBackOff...); a terminated state becomes its lastState.
        let init_succeeded = kind == ContainerKind::Init
            && !restartable(c, kind)
            && latest.is_some_and(|l| l.state == ContainerState::Exited && l.exit_code == 0);
        if !init_succeeded && self.should_restart(c, kind, latest) {
            if let Some(w) = self.waiting.get(&c.name) {
                if s.state.as_ref().is_some_and(|st| st.terminated.is_some()) {
                    s.last_state = s.state.take();
                }
                s.state = Some(waiting_state(&w.reason, &w.message));
            }
        }

        let is_running = running(&s);
        if kind == ContainerKind::Init && !restartable(c, kind) {
            s.started = Some(is_running);
            s.ready = terminated(&s).is_some_and(|t| t.exit_code == 0);
        } else {
            let startup_ok = c.startup_probe.is_none() || self.probes.startup.get(&c.name) == Some(&true);
            let readiness_ok = c.readiness_probe.is_none() || self.probes.readiness.get(&c.name) == Some(&true);
            let started = is_running && startup_ok;
            s.started = Some(started);
            s.ready = started && readiness_ok;
        }
        s
    }

    /// The status of a container the runtime holds no attempt of: waiting, keeping what the old
    /// status knew (a terminated state stays; a container that was running and vanished gets
    /// a ContainerStatusUnknown lastState so that the pod does not fall back to Pending).
    fn status_without_attempt(
        &self,
        c: &Container,
        image: String,
        old: Option<&ContainerStatus>,
        default_reason: &str,
    ) -> ContainerStatus {
        let mut s = ContainerStatus {
            name: c.name.clone(),
            image,
            state: Some(waiting_state(default_reason, "")),
            ..Default::default()
        };
        let Some(o) = old else {
            return s;
        };
        if terminated(o).is_some() {
            return o.clone();
        }
        s.restart_count = o.restart_count;
        s.last_state = o.last_state.clone();
        if running(o) && last_terminated(&s).is_none() {
            s.last_state = Some(ApiState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: 137,
                    reason: Some(REASON_STATUS_UNKNOWN.to_string()),
                    message: Some(
                        "The container could not be located when the pod was deleted.  The container used to be Running"
                            .to_string(),
                    ),
                    ..Default::default()
                }),
                ..Default::default()
            });
            if !self.deleting {
                s.restart_count = s.restart_count.saturating_add(1);
            }
        }
        s
    }
}

/// Upstream getPhase over the computed container statuses.
fn get_phase(spec: &PodSpec, init: &[ContainerStatus], app: &[ContainerStatus], pod_is_terminal: bool) -> &'static str {
    let mut pending_init = 0;
    let mut failed_init = 0;
    let (mut unknown, mut running_n, mut waiting_n, mut stopped, mut succeeded) = (0, 0, 0, 0, 0);
    let init_containers = spec.init_containers.as_deref().unwrap_or_default();

    for c in init_containers {
        let Some(s) = by_name(init, &c.name) else {
            if restartable(c, ContainerKind::Init) {
                unknown += 1;
            } else {
                pending_init += 1;
            }
            continue;
        };
        if restartable(c, ContainerKind::Init) {
            if running(s) {
                if s.started != Some(true) {
                    pending_init += 1;
                }
                running_n += 1;
            } else if terminated(s).is_some() {
                // A stopped sidecar does not count for the phase.
            } else if waiting(s) {
                if last_terminated(s).is_none() {
                    pending_init += 1;
                    waiting_n += 1;
                }
            } else {
                pending_init += 1;
                unknown += 1;
            }
            continue;
        }
        if running(s) {
            pending_init += 1;
        } else if let Some(t) = terminated(s) {
            if t.exit_code != 0 {
                failed_init += 1;
            }
        } else if waiting(s) {
            match last_terminated(s) {
                Some(t) if t.exit_code != 0 => failed_init += 1,
                Some(_) => {}
                None => pending_init += 1,
            }
        } else {
            pending_init += 1;
        }
    }

    for c in &spec.containers {
        let Some(s) = by_name(app, &c.name) else {
            unknown += 1;
            continue;
        };
        if running(s) {
            running_n += 1;
        } else if let Some(t) = terminated(s) {
            stopped += 1;
            if t.exit_code == 0 {
                succeeded += 1;
            }
        } else if waiting(s) {
            if last_terminated(s).is_some() {
                stopped += 1;
            } else {
                waiting_n += 1;
            }
        } else {
            unknown += 1;
        }
    }

    let policy = spec.restart_policy.as_deref().unwrap_or("Always");
    if failed_init > 0 && policy == "Never" {
        return PHASE_FAILED;
    }
    if (pending_init > 0 && !any_regular_started(app)) || waiting_n > 0 {
        return PHASE_PENDING;
    }
    if running_n > 0 && unknown == 0 {
        return PHASE_RUNNING;
    }
    if running_n == 0 && stopped > 0 && unknown == 0 {
        if pod_is_terminal {
            return if stopped == succeeded { PHASE_SUCCEEDED } else { PHASE_FAILED };
        }
        if policy == "Always" {
            return PHASE_RUNNING;
        }
        if stopped == succeeded {
            return PHASE_SUCCEEDED;
        }
        if policy == "Never" {
            return PHASE_FAILED;
        }
        return PHASE_RUNNING;
    }
    PHASE_PENDING
}

fn by_name<'a>(list: &'a [ContainerStatus], name: &str) -> Option<&'a ContainerStatus> {
    list.iter().find(|s| s.name == name)
}

/// Whether any app container has run (running or terminated).
fn any_regular_started(app: &[ContainerStatus]) -> bool {
    app.iter().any(|s| running(s) || terminated(s).is_some())
}

fn condition(type_: &str, ok: bool, reason: Option<&str>, message: Option<String>) -> PodCondition {
    PodCondition {
        type_: type_.to_string(),
        status: if ok { "True" } else { "False" }.to_string(),
        reason: reason.map(str::to_string),
        message,
        ..Default::default()
    }
}

/// Go's `%s` of a string slice: "[a b]".
fn go_list(names: &[String]) -> String {
    format!("[{}]", names.join(" "))
}

/// The conditions: those the kubelet does not own as they were, then PodReadyToStartContainers,
/// Initialized, Ready, ContainersReady and PodScheduled (upstream's order).
fn conditions(
    input: &StatusInput,
    spec: &PodSpec,
    old: &PodStatus,
    init: &[ContainerStatus],
    app: &[ContainerStatus],
    phase: &str,
) -> Vec<PodCondition> {
    let old_conditions = old.conditions.as_deref().unwrap_or_default();
    let mut out: Vec<PodCondition> =
        old_conditions.iter().filter(|c| !KUBELET_CONDITIONS.contains(&c.type_.as_str())).cloned().collect();

    let ready_to_start = condition(CONDITION_READY_TO_START, sandbox_ready(spec, input.runtime), None, None);
    let initialized = initialized_condition(spec, init, app, phase);
    let containers_ready = containers_ready_condition(spec, init, app, phase);
    let ready = ready_condition(spec, &out, &containers_ready);
    let scheduled = condition(CONDITION_POD_SCHEDULED, true, None, None);

    for mut c in [ready_to_start, initialized, ready, containers_ready, scheduled] {
        let previous = old_conditions.iter().find(|o| o.type_ == c.type_);
        c.last_transition_time = match previous {
            Some(p) if p.status == c.status && p.last_transition_time.is_some() => p.last_transition_time.clone(),
            _ => Some(rfc3339(input.now)),
        };
        out.push(c);
    }
    out
}

/// Upstream: ready to start containers when no new sandbox is needed: exactly one ready
/// sandbox, the newest, with an IP unless the pod uses the host network.
fn sandbox_ready(spec: &PodSpec, runtime: &PodRuntime) -> bool {
    let ready = runtime.sandboxes.iter().filter(|s| s.state == SandboxState::Ready).count();
    let Some(newest) = runtime.sandbox() else {
        return false;
    };
    ready == 1
        && newest.state == SandboxState::Ready
        && (spec.host_network == Some(true) || newest.ip.as_deref().is_some_and(|ip| !ip.is_empty()))
}

fn initialized_condition(spec: &PodSpec, init: &[ContainerStatus], app: &[ContainerStatus], phase: &str) -> PodCondition {
    let mut unknown = Vec::new();
    let mut incomplete = Vec::new();
    for c in spec.init_containers.as_deref().unwrap_or_default() {
        let Some(s) = init.iter().find(|s| s.name == c.name) else {
            unknown.push(c.name.clone());
            continue;
        };
        let done = if restartable(c, ContainerKind::Init) { s.started == Some(true) } else { s.ready };
        if !done {
            incomplete.push(c.name.clone());
        }
    }
    if phase == PHASE_SUCCEEDED && unknown.is_empty() {
        return condition(CONDITION_INITIALIZED, true, Some("PodCompleted"), None);
    }
    if any_regular_started(app) {
        return condition(CONDITION_INITIALIZED, true, None, None);
    }
    let mut msgs = Vec::new();
    if !unknown.is_empty() {
        msgs.push(format!("containers with unknown status: {}", go_list(&unknown)));
    }
    if !incomplete.is_empty() {
        msgs.push(format!("containers with incomplete status: {}", go_list(&incomplete)));
    }
    if msgs.is_empty() {
        condition(CONDITION_INITIALIZED, true, None, None)
    } else {
        condition(CONDITION_INITIALIZED, false, Some("ContainersNotInitialized"), Some(msgs.join(", ")))
    }
}

fn containers_ready_condition(
    spec: &PodSpec,
    init: &[ContainerStatus],
    app: &[ContainerStatus],
    phase: &str,
) -> PodCondition {
    let mut unknown = Vec::new();
    let mut unready = Vec::new();
    let sidecars = spec.init_containers.as_deref().unwrap_or_default().iter().filter(|c| restartable(c, ContainerKind::Init));
    let checks = sidecars.map(|c| (c, init)).chain(spec.containers.iter().map(|c| (c, app)));
    for (c, list) in checks {
        match list.iter().find(|s| s.name == c.name) {
            Some(s) if s.ready => {}
            Some(_) => unready.push(c.name.clone()),
            None => unknown.push(c.name.clone()),
        }
    }
    if (phase == PHASE_SUCCEEDED && unknown.is_empty()) || phase == PHASE_FAILED {
        return condition(CONDITION_CONTAINERS_READY, false, Some("PodCompleted"), None);
    }
    let mut msgs = Vec::new();
    if !unknown.is_empty() {
        msgs.push(format!("containers with unknown status: {}", go_list(&unknown)));
    }
    if !unready.is_empty() {
        msgs.push(format!("containers with unready status: {}", go_list(&unready)));
    }
    if msgs.is_empty() {
        condition(CONDITION_CONTAINERS_READY, true, None, None)
    } else {
        condition(CONDITION_CONTAINERS_READY, false, Some("ContainersNotReady"), Some(msgs.join(", ")))
    }
}

/// Ready: ContainersReady, then every readiness gate's condition True.
fn ready_condition(spec: &PodSpec, conditions: &[PodCondition], containers_ready: &PodCondition) -> PodCondition {
    if containers_ready.status != "True" {
        let mut c = containers_ready.clone();
        c.type_ = CONDITION_READY.to_string();
        return c;
    }
    let mut msgs = Vec::new();
    for gate in spec.readiness_gates.as_deref().unwrap_or_default() {
        let t = &gate.condition_type;
        match conditions.iter().find(|c| &c.type_ == t) {
            None => msgs.push(format!("corresponding condition of pod readiness gate \"{t}\" does not exist.")),
            Some(c) if c.status != "True" => {
                msgs.push(format!("the status of pod readiness gate \"{t}\" is not \"True\", but {}", c.status))
            }
            Some(_) => {}
        }
    }
    if msgs.is_empty() {
        condition(CONDITION_READY, true, None, None)
    } else {
        condition(CONDITION_READY, false, Some("ReadinessGatesNotReady"), Some(msgs.join(", ")))
    }
}

/// The newest sandbox's IPs when it is ready, ordered as upstream does: the first IP of the
/// node's primary family (the family of the first host IP; IPv4 when unknown), then the first
/// of the other family. Unparseable addresses are dropped.
fn sandbox_ips(runtime: &PodRuntime, host_ips: &[String]) -> Vec<String> {
    let Some(sb) = runtime.sandbox().filter(|s| s.state == SandboxState::Ready) else {
        return Vec::new();
    };
    let all: Vec<IpAddr> =
        sb.ip.iter().chain(sb.additional_ips.iter()).filter_map(|s| s.parse::<IpAddr>().ok()).collect();
    let primary_v6 = host_ips.first().and_then(|h| h.parse::<IpAddr>().ok()).is_some_and(|ip| ip.is_ipv6());
    let first = all.iter().find(|ip| ip.is_ipv6() == primary_v6);
    let second = all.iter().find(|ip| ip.is_ipv6() != primary_v6);
    first.into_iter().chain(second).map(|ip| ip.to_string()).collect()
}

/// The status as JSON without lastProbeTime and without what the API server drops when empty.
fn normalized(s: &PodStatus) -> Result<serde_json::Value, serde_json::Error> {
    let mut s = s.clone();
    for c in s.conditions.iter_mut().flatten() {
        c.last_probe_time = None;
    }
    let mut v = serde_json::to_value(&s)?;
    prune(&mut v);
    Ok(v)
}

/// Removes nulls, empty strings and empty lists from objects; returns whether `v` itself is
/// one of those. Empty objects stay (`waiting: {}` means something).
fn prune(v: &mut serde_json::Value) -> bool {
    use serde_json::Value;
    match v {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => {
            for x in a.iter_mut() {
                prune(x);
            }
            a.is_empty()
        }
        Value::Object(m) => {
            m.retain(|_, x| !prune(x));
            false
        }
        _ => false,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::pod::model::Sandbox;
    use serde_json::json;

    const SEC: i64 = 1_000_000_000;
    const NOW: i64 = 1_800_000_000 * SEC + 123;
    const T0: &str = "2026-01-01T00:00:00Z";

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    fn one(policy: &str) -> Pod {
        pod(json!({"metadata":{"name":"p","namespace":"ns","uid":"u"},
            "spec":{"restartPolicy":policy,"containers":[{"name":"app","image":"nginx"}]}}))
    }

    fn with_init(policy: &str) -> Pod {
        pod(json!({"metadata":{"name":"p","namespace":"ns","uid":"u"},
            "spec":{"restartPolicy":policy,"initContainers":[{"name":"i1","image":"busybox"},{"name":"i2","image":"busybox"}],
                "containers":[{"name":"app","image":"nginx"}]}}))
    }

    fn with_status(mut p: Pod, status: serde_json::Value) -> Pod {
        p.status = Some(serde_json::from_value(status).unwrap());
        p
    }

    fn sandbox(ip: Option<&str>, extra: &[&str]) -> Sandbox {
        Sandbox {
            id: "sb1".into(),
            attempt: 0,
            state: SandboxState::Ready,
            created_at: SEC,
            ip: ip.map(str::to_string),
            additional_ips: extra.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn obs(name: &str, kind: ContainerKind, attempt: u32, state: ContainerState, exit_code: i32) -> ContainerObs {
        let base = 1_700_000_000 * SEC + i64::from(attempt) * 100 * SEC;
        let finished = matches!(state, ContainerState::Exited);
        ContainerObs {
            id: format!("{name}-{attempt}"),
            sandbox_id: "sb1".into(),
            name: name.into(),
            kind,
            attempt,
            state,
            created_at: base,
            started_at: if state == ContainerState::Created { 0 } else { base + SEC + 500 },
            finished_at: if finished { base + 50 * SEC } else { 0 },
            exit_code,
            reason: String::new(),
            message: String::new(),
            image: "img".into(),
            image_ref: "sha256:abc".into(),
            hash: 1,
            restart_count: attempt,
        }
    }

    fn app(name: &str, attempt: u32, state: ContainerState, exit_code: i32) -> ContainerObs {
        obs(name, ContainerKind::App, attempt, state, exit_code)
    }

    fn init(name: &str, attempt: u32, state: ContainerState, exit_code: i32) -> ContainerObs {
        obs(name, ContainerKind::Init, attempt, state, exit_code)
    }

    /// `containers` newest first, as the model keeps them.
    fn rt(sandboxes: Vec<Sandbox>, containers: Vec<ContainerObs>) -> PodRuntime {
        PodRuntime { uid: "u".into(), name: "p".into(), namespace: "ns".into(), sandboxes, containers }
    }

    fn running_rt() -> PodRuntime {
        rt(vec![sandbox(Some("10.0.0.5"), &[])], vec![app("app", 0, ContainerState::Running, 0)])
    }

    #[derive(Default)]
    struct In {
        probes: ProbeResults,
        waiting: BTreeMap<String, Waiting>,
        failed: Option<(String, String)>,
        host_ips: Vec<String>,
        now: i64,
    }

    impl In {
        fn new() -> Self {
            In { host_ips: vec!["192.168.1.10".into()], now: NOW, ..Default::default() }
        }
        fn wait(mut self, name: &str, reason: &str, message: &str) -> Self {
            self.waiting.insert(name.into(), Waiting { reason: reason.into(), message: message.into() });
            self
        }
        fn run(&self, pod: &Pod, runtime: &PodRuntime) -> PodStatus {
            compute(&StatusInput {
                pod,
                runtime,
                probes: &self.probes,
                waiting: &self.waiting,
                runtime_name: "containerd",
                host_ips: &self.host_ips,
                now: self.now,
                failed: self.failed.clone(),
                previous: None,
            })
        }
    }

    fn run(pod: &Pod, runtime: &PodRuntime) -> PodStatus {
        In::new().run(pod, runtime)
    }

    fn cond<'a>(s: &'a PodStatus, t: &str) -> &'a PodCondition {
        s.conditions.as_ref().unwrap().iter().find(|c| c.type_ == t).unwrap()
    }

    fn check(s: &PodStatus, t: &str, status: &str, reason: Option<&str>, message: Option<&str>) {
        let c = cond(s, t);
        assert_eq!(
            (c.status.as_str(), c.reason.as_deref(), c.message.as_deref()),
            (status, reason, message),
            "condition {t}"
        );
    }

    fn cs<'a>(s: &'a PodStatus, name: &str) -> &'a ContainerStatus {
        s.container_statuses.as_ref().unwrap().iter().find(|c| c.name == name).unwrap()
    }

    fn ics<'a>(s: &'a PodStatus, name: &str) -> &'a ContainerStatus {
        s.init_container_statuses.as_ref().unwrap().iter().find(|c| c.name == name).unwrap()
    }

    fn waiting_reason(c: &ContainerStatus) -> Option<&str> {
        c.state.as_ref()?.waiting.as_ref()?.reason.as_deref()
    }

    fn term(st: &Option<ApiState>) -> &ContainerStateTerminated {
        st.as_ref().unwrap().terminated.as_ref().unwrap()
    }

    /// The status as the API would return it (JSON round trip).
    fn round_trip(s: &PodStatus) -> PodStatus {
        serde_json::from_value(serde_json::to_value(s).unwrap()).unwrap()
    }

    #[test]
    fn pending_without_sandbox() {
        let s = run(&one("Always"), &PodRuntime::default());
        assert_eq!(s.phase.as_deref(), Some("Pending"));
        let c = cs(&s, "app");
        assert_eq!(waiting_reason(c), Some("ContainerCreating"));
        assert_eq!((c.container_id.as_deref(), c.image.as_str(), c.image_id.as_str()), (None, "nginx", ""));
        assert_eq!((c.ready, c.started, c.restart_count), (false, Some(false), 0));
        assert!(s.init_container_statuses.is_none());
        check(&s, "PodReadyToStartContainers", "False", None, None);
        check(&s, "Initialized", "True", None, None);
        check(&s, "ContainersReady", "False", Some("ContainersNotReady"), Some("containers with unready status: [app]"));
        check(&s, "Ready", "False", Some("ContainersNotReady"), Some("containers with unready status: [app]"));
        check(&s, "PodScheduled", "True", None, None);
        let types: Vec<&str> = s.conditions.as_ref().unwrap().iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, ["PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled"]);
        assert_eq!(s.start_time, Some(rfc3339(NOW)));
        assert_eq!(s.qos_class.as_deref(), Some("BestEffort"));
        assert_eq!(s.pod_ip, None);
        assert_eq!(s.host_ip.as_deref(), Some("192.168.1.10"));
        assert_eq!(s.host_ips.as_ref().unwrap()[0].ip, "192.168.1.10");
        assert_eq!(phase(&one("Always"), &PodRuntime::default()), "Pending");
    }

    #[test]
    fn container_creating_with_ready_sandbox() {
        let s = run(&one("Always"), &rt(vec![sandbox(Some("10.0.0.5"), &[])], vec![]));
        assert_eq!(s.phase.as_deref(), Some("Pending"));
        assert_eq!(waiting_reason(cs(&s, "app")), Some("ContainerCreating"));
        check(&s, "PodReadyToStartContainers", "True", None, None);
        assert_eq!(s.pod_ip.as_deref(), Some("10.0.0.5"));
    }

    #[test]
    fn created_container_waits_without_reason() {
        let s = run(&one("Always"), &rt(vec![sandbox(Some("10.0.0.5"), &[])], vec![app("app", 0, ContainerState::Created, 0)]));
        let c = cs(&s, "app");
        assert_eq!(c.state.as_ref().unwrap().waiting, Some(ContainerStateWaiting::default()));
        assert_eq!(c.container_id.as_deref(), Some("containerd://app-0"));
        assert_eq!(s.phase.as_deref(), Some("Pending"));
    }

    #[test]
    fn sandbox_not_ready_has_no_ips() {
        let mut sb = sandbox(Some("10.0.0.5"), &[]);
        sb.state = SandboxState::NotReady;
        let s = run(&one("Always"), &rt(vec![sandbox(None, &[]), sb.clone()], vec![]));
        check(&s, "PodReadyToStartContainers", "False", None, None);
        let s = run(&one("Always"), &rt(vec![sb], vec![]));
        check(&s, "PodReadyToStartContainers", "False", None, None);
        assert_eq!((s.pod_ip, s.pod_ips), (None, None));
    }

    #[test]
    fn pod_initializing_while_init_runs() {
        let r = rt(vec![sandbox(Some("10.0.0.5"), &[])], vec![init("i1", 0, ContainerState::Running, 0)]);
        let s = run(&with_init("Always"), &r);
        assert_eq!(s.phase.as_deref(), Some("Pending"));
        let i1 = ics(&s, "i1");
        assert!(i1.state.as_ref().unwrap().running.is_some());
        assert_eq!((i1.started, i1.ready), (Some(true), false));
        // Upstream's default for containers without an attempt in a pod with init containers.
        assert_eq!(waiting_reason(ics(&s, "i2")), Some("PodInitializing"));
        assert_eq!(waiting_reason(cs(&s, "app")), Some("PodInitializing"));
        let names: Vec<&str> = s.init_container_statuses.as_ref().unwrap().iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["i1", "i2"]);
        assert_eq!(phase(&with_init("Always"), &r), "Pending");
        check(&s, "Initialized", "False", Some("ContainersNotInitialized"), Some("containers with incomplete status: [i1 i2]"));
        check(&s, "Ready", "False", Some("ContainersNotReady"), Some("containers with unready status: [app]"));
    }

    #[test]
    fn init_done_then_running() {
        let r = rt(
            vec![sandbox(Some("10.0.0.5"), &[])],
            vec![
                app("app", 0, ContainerState::Running, 0),
                init("i2", 0, ContainerState::Exited, 0),
                init("i1", 0, ContainerState::Exited, 0),
            ],
        );
        let s = run(&with_init("Always"), &r);
        assert_eq!(s.phase.as_deref(), Some("Running"));
        for name in ["i1", "i2"] {
            let i = ics(&s, name);
            assert_eq!((i.ready, i.started), (true, Some(false)));
            let t = term(&i.state);
            assert_eq!((t.exit_code, t.reason.as_deref()), (0, Some("Completed")));
            assert_eq!(t.container_id.as_deref(), Some(format!("containerd://{name}-0").as_str()));
        }
        let c = cs(&s, "app");
        assert_eq!((c.ready, c.started), (true, Some(true)));
        assert_eq!(c.container_id.as_deref(), Some("containerd://app-0"));
        assert_eq!(c.image_id, "sha256:abc");
        assert_eq!(c.image, "nginx");
        let started = c.state.as_ref().unwrap().running.as_ref().unwrap().started_at.clone();
        assert_eq!(started, Some(rfc3339(1_700_000_001 * SEC)));
        for t in ["PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready", "PodScheduled"] {
            check(&s, t, "True", None, None);
        }
    }

    #[test]
    fn init_waiting_for_next_attempt() {
        // i1 failed and is retried (Always): the pod stays Pending, i1 waits with lastState.
        let r = rt(vec![sandbox(Some("10.0.0.5"), &[])], vec![init("i1", 0, ContainerState::Exited, 1)]);
        let s = In::new().wait("i1", "CrashLoopBackOff", "back-off 10s").run(&with_init("Always"), &r);
        assert_eq!(s.phase.as_deref(), Some("Pending"));
        let i1 = ics(&s, "i1");
        assert_eq!(waiting_reason(i1), Some("CrashLoopBackOff"));
        assert_eq!(term(&i1.last_state).exit_code, 1);
        assert!(!i1.ready);
    }

    #[test]
    fn init_failed_under_never_fails_the_pod() {
        let r = rt(vec![sandbox(Some("10.0.0.5"), &[])], vec![init("i1", 0, ContainerState::Exited, 2)]);
        // A waiting entry is ignored: under Never the init container is not restarted.
        let s = In::new().wait("i1", "CrashLoopBackOff", "").run(&with_init("Never"), &r);
        assert_eq!(s.phase.as_deref(), Some("Failed"));
        let t = term(&ics(&s, "i1").state);
        assert_eq!((t.exit_code, t.reason.as_deref()), (2, Some("Error")));
        check(&s, "Ready", "False", Some("PodCompleted"), None);
        check(&s, "ContainersReady", "False", Some("PodCompleted"), None);
        assert_eq!(phase(&with_init("Never"), &r), "Failed");
    }

    #[test]
    fn readiness_probe_gates_ready() {
        let p = pod(json!({"metadata":{"name":"p"},"spec":{"containers":[
            {"name":"web","image":"nginx","readinessProbe":{"httpGet":{"port":80}}},
            {"name":"a-side","image":"busybox"}]}}));
        let r = rt(
            vec![sandbox(Some("10.0.0.5"), &[])],
            vec![app("web", 0, ContainerState::Running, 0), app("a-side", 0, ContainerState::Running, 0)],
        );
        let mut input = In::new();
        let s = input.run(&p, &r);
        assert_eq!(s.phase.as_deref(), Some("Running"));
        // App statuses are sorted by name, as upstream does.
        let names: Vec<&str> = s.container_statuses.as_ref().unwrap().iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["a-side", "web"]);
        assert_eq!((cs(&s, "web").ready, cs(&s, "web").started), (false, Some(true)));
        assert!(cs(&s, "a-side").ready);
        check(&s, "ContainersReady", "False", Some("ContainersNotReady"), Some("containers with unready status: [web]"));
        check(&s, "Ready", "False", Some("ContainersNotReady"), Some("containers with unready status: [web]"));

        input.probes.readiness.insert("web".into(), false);
        let s = input.run(&p, &r);
        assert!(!cs(&s, "web").ready);

        input.probes.readiness.insert("web".into(), true);
        let s = input.run(&p, &r);
        assert!(cs(&s, "web").ready);
        check(&s, "Ready", "True", None, None);
        check(&s, "ContainersReady", "True", None, None);
    }

    #[test]
    fn startup_probe_gates_started_and_ready() {
        let p = pod(json!({"metadata":{"name":"p"},"spec":{"containers":[
            {"name":"app","image":"nginx","startupProbe":{"exec":{"command":["true"]}}}]}}));
        let mut input = In::new();
        let s = input.run(&p, &running_rt());
        assert_eq!((cs(&s, "app").started, cs(&s, "app").ready), (Some(false), false));
        input.probes.startup.insert("app".into(), true);
        let s = input.run(&p, &running_rt());
        assert_eq!((cs(&s, "app").started, cs(&s, "app").ready), (Some(true), true));
    }

    #[test]
    fn readiness_gates() {
        let p = pod(json!({"metadata":{"name":"p"},"spec":{
            "readinessGates":[{"conditionType":"example.com/lb"}],
            "containers":[{"name":"app","image":"nginx"}]}}));
        let s = run(&p, &running_rt());
        check(&s, "ContainersReady", "True", None, None);
        check(
            &s,
            "Ready",
            "False",
            Some("ReadinessGatesNotReady"),
            Some("corresponding condition of pod readiness gate \"example.com/lb\" does not exist."),
        );

        let p = with_status(p, json!({"conditions":[{"type":"example.com/lb","status":"False","lastTransitionTime":T0}]}));
        let s = run(&p, &running_rt());
        check(
            &s,
            "Ready",
            "False",
            Some("ReadinessGatesNotReady"),
            Some("the status of pod readiness gate \"example.com/lb\" is not \"True\", but False"),
        );

        let p = with_status(p, json!({"conditions":[{"type":"example.com/lb","status":"True","lastTransitionTime":T0}]}));
        let s = run(&p, &running_rt());
        check(&s, "Ready", "True", None, None);
        // The gate condition is kept as the controller wrote it, first.
        let gate = &s.conditions.as_ref().unwrap()[0];
        assert_eq!((gate.type_.as_str(), gate.last_transition_time.clone()), ("example.com/lb", Some(Time(T0.parse().unwrap()))));
    }

    #[test]
    fn crash_loop_back_off_with_last_state() {
        let mut latest = app("app", 3, ContainerState::Exited, 1);
        latest.message = "boom".into();
        let r = rt(vec![sandbox(Some("10.0.0.5"), &[])], vec![latest, app("app", 2, ContainerState::Exited, 1)]);
        let s = In::new().wait("app", "CrashLoopBackOff", "back-off 40s restarting failed container=app").run(&one("Always"), &r);
        assert_eq!(s.phase.as_deref(), Some("Running"));
        let c = cs(&s, "app");
        assert_eq!(waiting_reason(c), Some("CrashLoopBackOff"));
        assert_eq!(
            c.state.as_ref().unwrap().waiting.as_ref().unwrap().message.as_deref(),
            Some("back-off 40s restarting failed container=app")
        );
        assert_eq!(c.restart_count, 3);
        assert_eq!(c.container_id.as_deref(), Some("containerd://app-3"));
        let t = term(&c.last_state);
        assert_eq!((t.exit_code, t.reason.as_deref(), t.message.as_deref()), (1, Some("Error"), Some("boom")));
        assert_eq!(t.container_id.as_deref(), Some("containerd://app-3"));
        assert!(!c.ready);
        check(&s, "Ready", "False", Some("ContainersNotReady"), Some("containers with unready status: [app]"));
    }

    #[test]
    fn exited_without_waiting_entry_shows_terminated() {
        let r = rt(vec![sandbox(Some("10.0.0.5"), &[])], vec![app("app", 0, ContainerState::Exited, 1)]);
        let s = run(&one("Always"), &r);
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert_eq!(term(&cs(&s, "app").state).exit_code, 1);
        assert!(cs(&s, "app").last_state.is_none());
    }

    #[test]
    fn running_again_shows_previous_attempt_as_last_state() {
        let mut prev = app("app", 0, ContainerState::Exited, 137);
        prev.reason = "OOMKilled".into();
        let r = rt(vec![sandbox(Some("10.0.0.5"), &[])], vec![app("app", 1, ContainerState::Running, 0), prev]);
        let s = run(&one("Always"), &r);
        let c = cs(&s, "app");
        assert!(c.state.as_ref().unwrap().running.is_some());
        assert_eq!(c.restart_count, 1);
        let t = term(&c.last_state);
        assert_eq!((t.exit_code, t.reason.as_deref()), (137, Some("OOMKilled")));
        assert_eq!(t.finished_at, Some(rfc3339(1_700_000_050 * SEC)));
        assert!(c.ready);
    }

    #[test]
    fn oom_killed_under_never_fails() {
        let mut o = app("app", 0, ContainerState::Exited, 137);
        o.reason = "OOMKilled".into();
        let s = run(&one("Never"), &rt(vec![sandbox(Some("10.0.0.5"), &[])], vec![o]));
        assert_eq!(s.phase.as_deref(), Some("Failed"));
        let t = term(&cs(&s, "app").state);
        assert_eq!((t.exit_code, t.reason.as_deref()), (137, Some("OOMKilled")));
    }

    #[test]
    fn completed_under_never_and_on_failure_succeeds() {
        let r = rt(vec![sandbox(Some("10.0.0.5"), &[])], vec![app("app", 0, ContainerState::Exited, 0)]);
        for policy in ["Never", "OnFailure"] {
            let s = run(&one(policy), &r);
            assert_eq!(s.phase.as_deref(), Some("Succeeded"), "{policy}");
            assert_eq!(term(&cs(&s, "app").state).reason.as_deref(), Some("Completed"));
            check(&s, "Ready", "False", Some("PodCompleted"), None);
            check(&s, "ContainersReady", "False", Some("PodCompleted"), None);
            check(&s, "Initialized", "True", Some("PodCompleted"), None);
            assert_eq!(phase(&one(policy), &r), "Succeeded");
        }
    }

    #[test]
    fn failed_under_never_running_under_on_failure() {
        let r = rt(vec![sandbox(Some("10.0.0.5"), &[])], vec![app("app", 0, ContainerState::Exited, 3)]);
        assert_eq!(run(&one("Never"), &r).phase.as_deref(), Some("Failed"));
        assert_eq!(phase(&one("Never"), &r), "Failed");
        // OnFailure restarts it.
        let s = In::new().wait("app", "CrashLoopBackOff", "").run(&one("OnFailure"), &r);
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert_eq!(waiting_reason(cs(&s, "app")), Some("CrashLoopBackOff"));
        assert_eq!(phase(&one("OnFailure"), &r), "Running");
    }

    #[test]
    fn always_keeps_running_after_exit() {
        let r = rt(vec![sandbox(Some("10.0.0.5"), &[])], vec![app("app", 0, ContainerState::Exited, 0)]);
        assert_eq!(run(&one("Always"), &r).phase.as_deref(), Some("Running"));
        assert_eq!(phase(&one("Always"), &r), "Running");
    }

    #[test]
    fn deleted_pod_with_stopped_containers_is_terminal() {
        let mut p = one("Always");
        p.metadata.deletion_timestamp = Some(Time(T0.parse().unwrap()));
        let r = rt(vec![], vec![app("app", 0, ContainerState::Exited, 0)]);
        assert_eq!(run(&p, &r).phase.as_deref(), Some("Succeeded"));
        let r = rt(vec![], vec![app("app", 0, ContainerState::Exited, 143)]);
        let s = In::new().wait("app", "CrashLoopBackOff", "").run(&p, &r);
        assert_eq!(s.phase.as_deref(), Some("Failed"));
        // Being deleted: no restart, so no waiting state.
        assert_eq!(term(&cs(&s, "app").state).exit_code, 143);
    }

    #[test]
    fn terminal_phase_never_reverts() {
        let r = rt(vec![sandbox(Some("10.0.0.5"), &[])], vec![app("app", 0, ContainerState::Exited, 0)]);
        let first = run(&one("Never"), &r);
        assert_eq!(first.phase.as_deref(), Some("Succeeded"));
        // The runtime forgot everything (garbage collected): the pod stays Succeeded and keeps
        // the container's terminated state and its IP.
        let p = with_status(one("Never"), serde_json::to_value(round_trip(&first)).unwrap());
        let s = run(&p, &PodRuntime::default());
        assert_eq!(s.phase.as_deref(), Some("Succeeded"));
        assert_eq!(term(&cs(&s, "app").state).reason.as_deref(), Some("Completed"));
        assert_eq!(s.pod_ip.as_deref(), Some("10.0.0.5"));
        assert_eq!(s.container_statuses, round_trip(&first).container_statuses);
        // Only the sandbox went away.
        check(&s, "PodReadyToStartContainers", "False", None, None);
        // Even a running container does not bring a Failed pod back.
        let p = with_status(one("Always"), json!({"phase":"Failed","reason":"Evicted","message":"low on memory"}));
        let s = run(&p, &running_rt());
        assert_eq!((s.phase.as_deref(), s.reason.as_deref()), (Some("Failed"), Some("Evicted")));
        assert_eq!(s.message.as_deref(), Some("low on memory"));
        assert_eq!(phase(&p, &running_rt()), "Failed");
    }

    #[test]
    fn deadline_exceeded() {
        let mut input = In::new();
        input.failed = Some(("DeadlineExceeded".into(), "Pod was active on the node longer than the specified deadline".into()));
        let p = with_status(one("Always"), json!({"phase":"Running"}));
        let s = input.run(&p, &running_rt());
        assert_eq!(s.phase.as_deref(), Some("Failed"));
        assert_eq!(s.reason.as_deref(), Some("DeadlineExceeded"));
        assert_eq!(s.message.as_deref(), Some("Pod was active on the node longer than the specified deadline"));
        check(&s, "Ready", "False", Some("PodCompleted"), None);
        // Once Failed, the reason stays on the following computations.
        let p = with_status(one("Always"), serde_json::to_value(&s).unwrap());
        let s2 = run(&p, &rt(vec![], vec![app("app", 0, ContainerState::Exited, 137)]));
        assert_eq!((s2.phase.as_deref(), s2.reason.as_deref()), (Some("Failed"), Some("DeadlineExceeded")));
    }

    #[test]
    fn reason_kept_while_phase_unchanged_and_cleared_on_change() {
        let p = with_status(one("Always"), json!({"phase":"Running","reason":"R","message":"M"}));
        let s = run(&p, &running_rt());
        assert_eq!((s.reason.as_deref(), s.message.as_deref()), (Some("R"), Some("M")));
        let p = with_status(one("Always"), json!({"phase":"Pending","reason":"R","message":"M"}));
        let s = run(&p, &running_rt());
        assert_eq!((s.reason, s.message), (None, None));
    }

    #[test]
    fn changed_ignores_identical_recompute_and_probe_time() {
        let p = one("Always");
        let first = In::new().run(&p, &running_rt());
        assert!(changed(None, &first));
        // Written, read back, recomputed later: nothing changed.
        let stored = round_trip(&first);
        let p = with_status(p, serde_json::to_value(&stored).unwrap());
        let mut later = In::new();
        later.now = NOW + 3600 * SEC;
        let again = later.run(&p, &running_rt());
        assert!(!changed(Some(&stored), &again));
        assert_eq!(again.start_time, first.start_time);

        let mut probed = again.clone();
        for c in probed.conditions.iter_mut().flatten() {
            c.last_probe_time = Some(rfc3339(NOW + 7 * SEC));
        }
        assert!(!changed(Some(&again), &probed));

        // Empty strings and lists the API server drops count as absent.
        let mut sparse = again.clone();
        sparse.message = Some(String::new());
        sparse.ephemeral_container_statuses = Some(vec![]);
        assert!(!changed(Some(&again), &sparse));

        let mut other = again.clone();
        other.phase = Some("Failed".into());
        assert!(changed(Some(&again), &other));
        let mut probes = ProbeResults::default();
        probes.readiness.insert("app".into(), false);
        let p2 = pod(json!({"metadata":{"name":"p"},"spec":{"containers":[{"name":"app","image":"nginx","readinessProbe":{"exec":{"command":["x"]}}}]}}));
        let mut input = In::new();
        input.probes = probes;
        assert!(changed(Some(&again), &input.run(&with_status(p2, serde_json::to_value(&stored).unwrap()), &running_rt())));
    }

    #[test]
    fn transition_times_preserved_while_status_unchanged() {
        let p = with_status(
            one("Always"),
            json!({"startTime":T0,"conditions":[
                {"type":"Ready","status":"True","lastTransitionTime":T0},
                {"type":"PodScheduled","status":"True","lastTransitionTime":T0},
                {"type":"Initialized","status":"False","lastTransitionTime":T0}]}),
        );
        let s = run(&p, &running_rt());
        let t0 = Some(Time(T0.parse().unwrap()));
        assert_eq!(cond(&s, "Ready").last_transition_time, t0);
        assert_eq!(cond(&s, "PodScheduled").last_transition_time, t0);
        assert_eq!(cond(&s, "Initialized").last_transition_time, Some(rfc3339(NOW)));
        assert_eq!(cond(&s, "ContainersReady").last_transition_time, Some(rfc3339(NOW)));
        assert_eq!(s.start_time, t0);

        // Ready goes False: a new transition time.
        let s = run(&p, &rt(vec![sandbox(Some("10.0.0.5"), &[])], vec![]));
        assert_eq!(cond(&s, "Ready").last_transition_time, Some(rfc3339(NOW)));
        // Times are whole seconds, as the API stores them.
        assert_eq!(rfc3339(NOW), Time("2027-01-15T08:00:00Z".parse().unwrap()));
    }

    #[test]
    fn dual_stack_pod_ips() {
        let r = rt(vec![sandbox(Some("10.0.0.5"), &["fd00::5", "10.0.0.6"])], vec![]);
        let s = run(&one("Always"), &r);
        assert_eq!(s.pod_ip.as_deref(), Some("10.0.0.5"));
        let ips: Vec<&str> = s.pod_ips.as_ref().unwrap().iter().map(|i| i.ip.as_str()).collect();
        assert_eq!(ips, ["10.0.0.5", "fd00::5"]);
        // An IPv6-primary node lists the IPv6 address first.
        let mut input = In::new();
        input.host_ips = vec!["fd00::1".into(), "192.168.1.10".into()];
        let s = input.run(&one("Always"), &r);
        assert_eq!(s.pod_ip.as_deref(), Some("fd00::5"));
        let ips: Vec<&str> = s.pod_ips.as_ref().unwrap().iter().map(|i| i.ip.as_str()).collect();
        assert_eq!(ips, ["fd00::5", "10.0.0.5"]);
        let hosts: Vec<&str> = s.host_ips.as_ref().unwrap().iter().map(|i| i.ip.as_str()).collect();
        assert_eq!((s.host_ip.as_deref(), hosts), (Some("fd00::1"), vec!["fd00::1", "192.168.1.10"]));
    }

    #[test]
    fn host_network_uses_host_ips() {
        let p = pod(json!({"metadata":{"name":"p"},"spec":{"hostNetwork":true,"containers":[{"name":"app","image":"nginx"}]}}));
        let mut input = In::new();
        input.host_ips = vec!["192.168.1.10".into(), "fd00::10".into()];
        let s = input.run(&p, &rt(vec![sandbox(None, &[])], vec![app("app", 0, ContainerState::Running, 0)]));
        assert_eq!(s.pod_ip.as_deref(), Some("192.168.1.10"));
        let ips: Vec<&str> = s.pod_ips.as_ref().unwrap().iter().map(|i| i.ip.as_str()).collect();
        assert_eq!(ips, ["192.168.1.10", "fd00::10"]);
        check(&s, "PodReadyToStartContainers", "True", None, None);
        assert_eq!(s.phase.as_deref(), Some("Running"));
    }

    #[test]
    fn waiting_reason_for_container_never_started() {
        let r = rt(vec![sandbox(Some("10.0.0.5"), &[])], vec![]);
        let s = In::new().wait("app", "ErrImagePull", "pull access denied").run(&one("Always"), &r);
        let c = cs(&s, "app");
        assert_eq!(waiting_reason(c), Some("ErrImagePull"));
        assert_eq!(c.state.as_ref().unwrap().waiting.as_ref().unwrap().message.as_deref(), Some("pull access denied"));
        assert!(c.last_state.is_none());
        assert_eq!(s.phase.as_deref(), Some("Pending"));
    }

    #[test]
    fn vanished_running_container_gets_unknown_last_state() {
        let p = with_status(
            one("Always"),
            json!({"phase":"Running","containerStatuses":[{"name":"app","image":"nginx","imageID":"x","ready":true,
                "restartCount":2,"state":{"running":{"startedAt":T0}}}]}),
        );
        let s = run(&p, &rt(vec![sandbox(Some("10.0.0.5"), &[])], vec![]));
        let c = cs(&s, "app");
        assert_eq!(waiting_reason(c), Some("ContainerCreating"));
        let t = term(&c.last_state);
        assert_eq!((t.exit_code, t.reason.as_deref()), (137, Some("ContainerStatusUnknown")));
        assert_eq!(c.restart_count, 3);
        // Stopped, not waiting: the pod does not go back to Pending.
        assert_eq!(s.phase.as_deref(), Some("Running"));
    }

    #[test]
    fn unknown_state_after_running_is_terminated() {
        let p = with_status(
            one("Never"),
            json!({"phase":"Running","containerStatuses":[{"name":"app","image":"nginx","imageID":"x","ready":true,
                "restartCount":0,"state":{"running":{"startedAt":T0}}}]}),
        );
        let s = run(&p, &rt(vec![sandbox(Some("10.0.0.5"), &[])], vec![app("app", 0, ContainerState::Unknown, 0)]));
        let t = term(&cs(&s, "app").state);
        assert_eq!((t.exit_code, t.reason.as_deref()), (137, Some("ContainerStatusUnknown")));
        assert_eq!(s.phase.as_deref(), Some("Failed"));
    }

    #[test]
    fn sidecar_init_container() {
        let p = pod(json!({"metadata":{"name":"p"},"spec":{
            "initContainers":[{"name":"side","image":"envoy","restartPolicy":"Always"}],
            "containers":[{"name":"app","image":"nginx"}]}}));
        let r = rt(vec![sandbox(Some("10.0.0.5"), &[])], vec![init("side", 0, ContainerState::Running, 0)]);
        let s = run(&p, &r);
        assert_eq!(s.phase.as_deref(), Some("Pending"));
        check(&s, "Initialized", "True", None, None);
        assert_eq!((ics(&s, "side").started, ics(&s, "side").ready), (Some(true), true));
        let r = rt(
            vec![sandbox(Some("10.0.0.5"), &[])],
            vec![app("app", 0, ContainerState::Running, 0), init("side", 0, ContainerState::Running, 0)],
        );
        let s = run(&p, &r);
        assert_eq!(s.phase.as_deref(), Some("Running"));
        check(&s, "Ready", "True", None, None);
    }

    /// A pod with sidecar "side" (startup and readiness probes), regular init container "init"
    /// and app container "app".
    fn with_sidecar(policy: &str) -> Pod {
        pod(json!({"metadata":{"name":"p","namespace":"ns","uid":"u"},"spec":{"restartPolicy":policy,
            "initContainers":[
                {"name":"side","image":"busybox","restartPolicy":"Always",
                 "startupProbe":{"exec":{"command":["true"]}},"readinessProbe":{"exec":{"command":["true"]}}},
                {"name":"init","image":"busybox"}],
            "containers":[{"name":"app","image":"busybox"}]}}))
    }

    #[test]
    fn sidecar_not_started_holds_initialization() {
        let p = with_sidecar("Always");
        let r = rt(vec![sandbox(Some("10.0.0.5"), &[])], vec![init("side", 0, ContainerState::Running, 0)]);
        let s = run(&p, &r);
        assert_eq!(s.phase.as_deref(), Some("Pending"));
        assert!(ics(&s, "side").state.as_ref().unwrap().running.is_some());
        assert_eq!((ics(&s, "side").started, ics(&s, "side").ready), (Some(false), false));
        assert_eq!(waiting_reason(ics(&s, "init")), Some("PodInitializing"));
        assert_eq!(waiting_reason(cs(&s, "app")), Some("PodInitializing"));
        check(
            &s,
            "Initialized",
            "False",
            Some("ContainersNotInitialized"),
            Some("containers with incomplete status: [side init]"),
        );
        check(
            &s,
            "ContainersReady",
            "False",
            Some("ContainersNotReady"),
            Some("containers with unready status: [side app]"),
        );
    }

    #[test]
    fn started_sidecar_and_completed_init_make_the_pod_initialized_and_its_readiness_counts() {
        let p = with_sidecar("Always");
        let r = rt(
            vec![sandbox(Some("10.0.0.5"), &[])],
            vec![
                app("app", 0, ContainerState::Running, 0),
                init("init", 0, ContainerState::Exited, 0),
                init("side", 0, ContainerState::Running, 0),
            ],
        );
        let mut input = In::new();
        input.probes.startup.insert("side".into(), true);
        let s = input.run(&p, &r);
        assert_eq!(s.phase.as_deref(), Some("Running"));
        check(&s, "Initialized", "True", None, None);
        // Started but its readiness probe has not succeeded: the pod is not ready.
        assert_eq!((ics(&s, "side").started, ics(&s, "side").ready), (Some(true), false));
        check(
            &s,
            "ContainersReady",
            "False",
            Some("ContainersNotReady"),
            Some("containers with unready status: [side]"),
        );
        check(&s, "Ready", "False", Some("ContainersNotReady"), Some("containers with unready status: [side]"));
        input.probes.readiness.insert("side".into(), true);
        let s = input.run(&p, &r);
        assert!(ics(&s, "side").ready);
        check(&s, "Ready", "True", None, None);
    }

    #[test]
    fn sidecar_restarting_after_initialization_keeps_the_pod_running_and_initialized() {
        let p = with_sidecar("Never");
        let mut dead = init("side", 1, ContainerState::Exited, 137);
        dead.reason = "Error".into();
        let r = rt(
            vec![sandbox(Some("10.0.0.5"), &[])],
            vec![app("app", 0, ContainerState::Running, 0), init("init", 0, ContainerState::Exited, 0), dead],
        );
        let mut input = In::new().wait("side", "CrashLoopBackOff", "back-off 10s restarting failed container=side");
        input.probes.readiness.insert("side".into(), true);
        let s = input.run(&p, &r);
        assert_eq!(s.phase.as_deref(), Some("Running"));
        check(&s, "Initialized", "True", None, None);
        let side = ics(&s, "side");
        assert_eq!(waiting_reason(side), Some("CrashLoopBackOff"));
        assert_eq!((side.restart_count, term(&side.last_state).exit_code), (1, 137));
        assert_eq!((side.started, side.ready), (Some(false), false));
        check(&s, "Ready", "False", Some("ContainersNotReady"), Some("containers with unready status: [side]"));
    }

    #[test]
    fn sidecar_exit_codes_do_not_decide_the_phase() {
        // (app exit code, sidecar exit code, phase): the sidecar is stopped once the app is done.
        for (app_code, side_code, phase) in [(0, 137, "Succeeded"), (0, 1, "Succeeded"), (1, 0, "Failed")] {
            let p = with_sidecar("Never");
            let r = rt(
                vec![sandbox(Some("10.0.0.5"), &[])],
                vec![
                    app("app", 0, ContainerState::Exited, app_code),
                    init("init", 0, ContainerState::Exited, 0),
                    init("side", 0, ContainerState::Exited, side_code),
                ],
            );
            let s = run(&p, &r);
            assert_eq!(s.phase.as_deref(), Some(phase), "{app_code} {side_code}");
            assert_eq!(term(&ics(&s, "side").state).exit_code, side_code);
            if phase == "Succeeded" {
                check(&s, "Initialized", "True", Some("PodCompleted"), None);
            }
            check(&s, "ContainersReady", "False", Some("PodCompleted"), None);
        }
        // While the app container runs on, a stopped sidecar does not end the pod.
        let p = with_sidecar("Never");
        let r = rt(
            vec![sandbox(Some("10.0.0.5"), &[])],
            vec![app("app", 0, ContainerState::Running, 0), init("side", 0, ContainerState::Exited, 0)],
        );
        assert_eq!(run(&p, &r).phase.as_deref(), Some("Running"));
    }

    #[test]
    fn keeps_fields_it_does_not_own() {
        let p = with_status(
            one("Always"),
            json!({"nominatedNodeName":"n1","conditions":[{"type":"DisruptionTarget","status":"True","reason":"EvictionByEvictionAPI"}]}),
        );
        let s = run(&p, &running_rt());
        assert_eq!(s.nominated_node_name.as_deref(), Some("n1"));
        check(&s, "DisruptionTarget", "True", Some("EvictionByEvictionAPI"), None);
    }

    #[test]
    fn qos_class_from_spec() {
        let p = pod(json!({"metadata":{"name":"p"},"spec":{"containers":[{"name":"app","image":"nginx",
            "resources":{"limits":{"cpu":"1","memory":"1Gi"}}}]}}));
        assert_eq!(run(&p, &running_rt()).qos_class.as_deref(), Some("Guaranteed"));
    }

    #[test]
    fn rejected_pod() {
        let p = with_status(
            one("Always"),
            json!({"startTime":T0,"conditions":[{"type":"PodScheduled","status":"True","lastTransitionTime":T0}]}),
        );
        let s = rejected(&p, "OutOfcpu", "Node didn't have enough resource: cpu, requested: 2000, used: 0, capacity: 1000", NOW);
        assert_eq!((s.phase.as_deref(), s.reason.as_deref()), (Some("Failed"), Some("OutOfcpu")));
        assert_eq!(
            s.message.as_deref(),
            Some("Pod was rejected: Node didn't have enough resource: cpu, requested: 2000, used: 0, capacity: 1000")
        );
        assert_eq!(s.start_time, Some(Time(T0.parse().unwrap())));
        check(&s, "PodScheduled", "True", None, None);
        assert_eq!(s.qos_class.as_deref(), Some("BestEffort"));
        let s = rejected(&one("Always"), "UnexpectedAdmissionError", "Pod was rejected: x", NOW);
        assert_eq!(s.message.as_deref(), Some("Pod was rejected: x"));
        assert_eq!(s.start_time, Some(rfc3339(NOW)));
        assert_eq!(phase(&with_status(one("Always"), serde_json::to_value(&s).unwrap()), &running_rt()), "Failed");
    }
}
