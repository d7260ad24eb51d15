//! What one sync of a pod worker must do, decided from the pod spec and what the runtime holds:
//! the upstream kubelet's `computePodActions` (kuberuntime_manager.go) as a pure function.
//! [`plan`] returns [`Actions`]; the pod worker executes them (kill first, then sandbox, then
//! starts, each start subject to the crash-loop backoff of [`crate::pod::backoff`]).
//!
//! Decisions, in order:
//! 1. `terminating`: stop the pod, nothing else.
//! 2. The sandbox must be (re)created (none; the newest is not ready; more than one is ready;
//!    the newest has no IP and the pod is not hostNetwork): stop whatever is left and create a
//!    new one, then start the first init container, or else every app container that should run.
//!    Not for a restartPolicy Never pod whose containers were already created (upstream: it
//!    must not run twice) nor when every container is done: then the pod is done.
//! 3. Init containers, in spec order, one at a time: a failure is terminal under Never and is
//!    retried otherwise; app containers wait until all of them exited 0. A sidecar (an init
//!    container with `restartPolicy: Always`, KEP-753) counts as done once it has started
//!    (running, and its startup probe, if any, succeeded): the next one starts while it keeps
//!    running. Sidecars are restarted whenever they exit, whatever the pod's restartPolicy,
//!    also after initialization; a failed startup/liveness probe or a changed spec kills them.
//! 4. App containers: start the missing ones; restart the dead ones per restartPolicy; kill
//!    running ones whose spec hash changed or whose liveness/startup probe failed.
//! 5. No app container running and none to start: the pod is done and stopped, sidecars
//!    included (they are not restarted then).
//!
//! The other decisions of a sync are here too, each pure: whether the pod is admitted
//! ([`admission`]), its deadline and grace periods ([`deadline`]), what a start does about the
//! image ([`image`]); the crash-loop and pull back-off is [`crate::pod::backoff`].

pub mod admission;
pub mod deadline;
pub mod image;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};

use crate::pod::model::{
    is_sidecar, ContainerKind, ContainerObs, ContainerState, PodRuntime, ProbeResults, SandboxState,
};

/// Whether a changed copy of a known pod (`old` -> `new`, from the same source) needs a sync,
/// as upstream's pod config decides (`checkAndUpdatePod`): a change of the spec, the labels,
/// the annotations, the deletion timestamp or grace period does (an UPDATE); a change of the
/// status alone does not (a RECONCILE: the stored copy is replaced, nothing runs), since it is
/// most often the echo of the agent's own status write, unless the pod has readiness gates
/// (their conditions, set by others, go into the Ready condition the agent computes:
/// upstream's `NeedToReconcilePodReadiness`). The resourceVersion and managedFields change
/// with every write and are not looked at.
pub fn update_needs_sync(old: &Pod, new: &Pod) -> bool {
    let (om, nm) = (&old.metadata, &new.metadata);
    if old.spec != new.spec
        || om.labels != nm.labels
        || om.annotations != nm.annotations
        || om.deletion_timestamp != nm.deletion_timestamp
        || om.deletion_grace_period_seconds != nm.deletion_grace_period_seconds
        || om.uid != nm.uid
    {
        return true;
    }
    old.status != new.status
        && new.spec.as_ref().and_then(|s| s.readiness_gates.as_ref()).is_some_and(|g| !g.is_empty())
}

/// FNV-1a 64 over `bytes`.
fn fnv1a64(bytes: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes.iter().fold(OFFSET, |h, b| (h ^ u64::from(*b)).wrapping_mul(PRIME))
}

/// Stable hash of a container's spec (FNV-1a 64 over serde_json::to_vec of the k8s-openapi
/// Container; identical across runs and processes). Changing the image changes it.
///
/// k8s-openapi serializes struct fields in a fixed order and maps as BTreeMaps, so the bytes
/// are deterministic. A k8s-openapi upgrade that changes the encoding changes every hash (and
/// restarts running containers), which the golden test in this module catches.
pub fn container_hash(c: &Container) -> u64 {
    // Serializing a Container cannot fail (no non-string map keys); an empty input would
    // only make every container hash alike.
    fnv1a64(&serde_json::to_vec(c).unwrap_or_default())
}

pub struct PlanInput<'a> {
    pub pod: &'a Pod,
    pub runtime: &'a PodRuntime,
    pub probes: &'a ProbeResults,
    /// The pod must stop (deletionTimestamp set, evicted, activeDeadlineSeconds exceeded,
    /// removed from the node, rejected): the executor decides.
    pub terminating: bool,
}

/// A container to stop (without stopping the pod).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kill {
    /// The runtime's container id.
    pub id: String,
    /// The container's name in the spec.
    pub name: String,
    /// Why (for the event and the log), as upstream words it.
    pub message: String,
    /// The grace period of the stop when not the pod's: a failed probe's own
    /// terminationGracePeriodSeconds.
    pub grace: Option<i64>,
}

/// A container to create and start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Start {
    pub name: String,
    pub kind: ContainerKind,
    /// restart count the new container gets (annotation): previous attempt's restart_count+1,
    /// 0 for the first
    pub restart_count: u32,
    /// CRI attempt number (previous attempt + 1, 0 for the first)
    pub attempt: u32,
    /// the previous attempt's finished_at (0 if none) and how long it ran, for the executor's
    /// backoff check. 0 also when the previous attempt is running (killed in this sync) or never
    /// started: upstream applies no backoff then.
    pub previous_finished_at: i64,
    pub previous_ran_for: Duration,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Actions {
    /// Stop every running container and the sandbox (terminating, terminal pod, or the sandbox
    /// must be recreated).
    pub kill_pod: bool,
    pub create_sandbox: bool,
    /// The sandbox to use when not creating one (newest, ready). None when creating one or when
    /// the pod has none; when the pod is stopped it names the newest sandbox.
    pub sandbox_id: Option<String>,
    /// Attempt number of the sandbox to create (newest attempt + 1, 0 for the first); 0 when
    /// not creating one.
    pub sandbox_attempt: u32,
    /// Containers to stop without stopping the pod (failed liveness/startup, spec hash changed,
    /// a created-but-never-started or unknown-state container about to be replaced...).
    pub kill: Vec<Kill>,
    /// Containers to start in this sync, in order: init containers (the next one in line and
    /// sidecars to restart) in spec order, then app containers.
    pub start: Vec<Start>,
    /// An init container failed and restartPolicy is Never: the pod is Failed (executor kills
    /// the pod). `pod_done` stays false: this flag is the terminal signal for that case.
    pub init_failed: bool,
    /// Every container has finished and none will be restarted (restartPolicy Never, or
    /// OnFailure with all succeeded): the pod is terminal.
    pub pod_done: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RestartPolicy {
    Always,
    OnFailure,
    Never,
}

impl RestartPolicy {
    fn of(spec: &PodSpec) -> Self {
        match spec.restart_policy.as_deref() {
            Some("Never") => RestartPolicy::Never,
            Some("OnFailure") => RestartPolicy::OnFailure,
            // The API server defaults it to Always.
            _ => RestartPolicy::Always,
        }
    }

    /// Upstream `shouldRestartOnFailure`.
    fn restarts_on_failure(self) -> bool {
        self != RestartPolicy::Never
    }
}

const WILL_RESTART: &str = ", will be restarted";

/// The Start for the next attempt of `name`, following `previous` (its newest attempt).
fn start(name: &str, kind: ContainerKind, previous: Option<&ContainerObs>) -> Start {
    match previous {
        None => Start {
            name: name.to_string(),
            kind,
            restart_count: 0,
            attempt: 0,
            previous_finished_at: 0,
            previous_ran_for: Duration::ZERO,
        },
        Some(p) => {
            let ran = if p.started_at > 0 && p.finished_at > p.started_at {
                u64::try_from(p.finished_at - p.started_at).map(Duration::from_nanos).unwrap_or(Duration::ZERO)
            } else {
                Duration::ZERO
            };
            Start {
                name: name.to_string(),
                kind,
                restart_count: p.restart_count.saturating_add(1),
                attempt: p.attempt.saturating_add(1),
                previous_finished_at: if p.state == ContainerState::Exited { p.finished_at } else { 0 },
                previous_ran_for: ran,
            }
        }
    }
}

fn kill(obs: &ContainerObs, message: String) -> Kill {
    Kill { id: obs.id.clone(), name: obs.name.clone(), message, grace: None }
}

/// The kill of a container whose liveness or startup probe failed, with that probe's grace
/// period when it sets one.
fn probe_kill(obs: &ContainerObs, message: String, probes: &ProbeResults) -> Kill {
    Kill { grace: probes.failed_grace.get(&obs.name).copied(), ..kill(obs, message) }
}

/// The kill that precedes replacing a container that is not running but may hold resources
/// (Created: never started, e.g. a start that failed; Unknown: may still run). None otherwise.
fn kill_before_replace(obs: &ContainerObs) -> Option<Kill> {
    match obs.state {
        ContainerState::Created => {
            Some(kill(obs, format!("Container {} was created but not started, will be recreated", obs.name)))
        }
        ContainerState::Unknown => {
            Some(kill(obs, "Container is in \"Unknown\" state, try killing it before restart".to_string()))
        }
        ContainerState::Running | ContainerState::Exited => None,
    }
}

/// Whether the newest attempt of `name` exited 0 (upstream `containerSucceeded`).
fn succeeded(obs: Option<&ContainerObs>) -> bool {
    obs.is_some_and(|o| o.state == ContainerState::Exited && o.exit_code == 0)
}

/// Upstream `isInitContainerFailed`.
fn init_failed(obs: &ContainerObs) -> bool {
    match obs.state {
        ContainerState::Exited => obs.exit_code != 0 || obs.reason == "OOMKilled",
        ContainerState::Unknown => true,
        ContainerState::Created | ContainerState::Running => false,
    }
}

/// Upstream `ShouldContainerBeRestarted` for a container that is not running (terminating is
/// handled before).
fn should_restart(policy: RestartPolicy, obs: Option<&ContainerObs>) -> bool {
    let Some(o) = obs else {
        return true;
    };
    match o.state {
        ContainerState::Running => false,
        // Never ran (or may not run): always replaced, whatever the policy.
        ContainerState::Created | ContainerState::Unknown => true,
        ContainerState::Exited => match policy {
            RestartPolicy::Always => true,
            RestartPolicy::OnFailure => o.exit_code != 0,
            RestartPolicy::Never => false,
        },
    }
}

/// What the init containers need (upstream `computeInitContainerActions`, SidecarContainers on).
#[derive(Debug, Default)]
struct InitActions {
    /// Every regular init container exited 0 and every sidecar has started (or an app container
    /// was created or runs): the app containers may run.
    initialized: bool,
    /// A regular init container failed and restartPolicy is Never: the pod is Failed.
    failed: bool,
    kill: Vec<Kill>,
    /// Init containers to start, in spec order: the next one in line and sidecars to restart.
    start: Vec<Start>,
}

/// A sidecar's kill message from the probe manager's ("Container s failed liveness probe, will
/// be restarted"), as upstream words it for init containers ("Init container s failed liveness
/// probe").
fn sidecar_probe_message(m: &str) -> String {
    let m = m.strip_suffix(WILL_RESTART).unwrap_or(m);
    match m.strip_prefix("Container ") {
        Some(rest) => format!("Init container {rest}"),
        None => m.to_string(),
    }
}

/// Walks the init containers from the last one back (completed ones may have been removed from
/// the runtime; the furthest one with a record tells where initialization stands), as upstream:
/// - the furthest regular init container that exited 0 (or a sidecar that has started) lets the
///   next one start; the last one doing so completes initialization;
/// - a regular init container that failed is restarted, or fails the pod under Never;
/// - once a container further on has a record (or an app container was created), the regular
///   init containers before it are done with, while sidecars are kept running: restarted
///   whenever they exited (whatever the pod's restartPolicy, through the crash-loop backoff),
///   replaced when their spec changed, killed when their startup or liveness probe failed (and
///   started again by a later sync, through the backoff, as app containers are).
fn init_actions(spec: &PodSpec, rt: &PodRuntime, probes: &ProbeResults, policy: RestartPolicy) -> InitActions {
    let mut out = InitActions::default();
    let inits = spec.init_containers.as_deref().unwrap_or_default();
    if inits.is_empty() {
        out.initialized = true;
        return out;
    }
    // A created or running app container means initialization completed once; the init
    // containers' own records may have been garbage-collected since, and only sidecars run
    // again. (Exited ones do not count: after a reboot every container has exited and the new
    // sandbox is not initialized.)
    out.initialized = spec.containers.iter().any(|c| {
        rt.latest(ContainerKind::App, &c.name)
            .is_some_and(|o| matches!(o.state, ContainerState::Created | ContainerState::Running))
    });
    let mut previously = out.initialized;
    let last = inits.len() - 1;
    // Collected from the end, reversed at the end.
    let mut starts: Vec<Start> = Vec::new();
    let next_start = |i: usize| {
        inits.get(i + 1).map(|n| start(&n.name, ContainerKind::Init, rt.latest(ContainerKind::Init, &n.name)))
    };
    for (i, c) in inits.iter().enumerate().rev() {
        let sidecar = is_sidecar(c);
        let Some(o) = rt.latest(ContainerKind::Init, &c.name) else {
            // A sidecar without any record after initialization: its records were removed.
            if previously && sidecar {
                starts.push(start(&c.name, ContainerKind::Init, None));
            }
            continue;
        };
        if previously && !sidecar {
            continue;
        }
        match o.state {
            // Its start did not happen: a new attempt replaces it.
            ContainerState::Created => {
                out.kill.extend(kill_before_replace(o));
                starts.push(start(&c.name, ContainerKind::Init, Some(o)));
            }
            ContainerState::Running if sidecar => {
                let started = c.startup_probe.is_none() || probes.startup.get(&c.name) == Some(&true);
                let failed_probe = probes.failed.get(&c.name);
                if !started {
                    // Wait for its startup probe; a failed one kills it.
                    if let Some(m) = failed_probe {
                        out.kill.push(probe_kill(o, sidecar_probe_message(m), probes));
                    }
                } else {
                    if i == last {
                        out.initialized = true;
                    } else if !previously {
                        starts.extend(next_start(i));
                    }
                    if o.hash != container_hash(c) {
                        out.kill.push(kill(o, format!("Init container {} definition changed", c.name)));
                        starts.push(start(&c.name, ContainerKind::Init, Some(o)));
                    } else if let Some(m) = failed_probe {
                        out.kill.push(probe_kill(o, sidecar_probe_message(m), probes));
                    }
                }
            }
            // A regular init container at work: wait for it.
            ContainerState::Running => {}
            ContainerState::Exited if sidecar => starts.push(start(&c.name, ContainerKind::Init, Some(o))),
            ContainerState::Exited | ContainerState::Unknown if !sidecar && init_failed(o) => {
                if !policy.restarts_on_failure() {
                    return InitActions { failed: true, ..InitActions::default() };
                }
                out.kill.extend(kill_before_replace(o));
                starts.push(start(&c.name, ContainerKind::Init, Some(o)));
            }
            ContainerState::Exited => {
                if i == last {
                    out.initialized = true;
                } else {
                    starts.extend(next_start(i));
                }
            }
            // A sidecar in an unknown state (a regular one counts as failed, above).
            ContainerState::Unknown => {
                out.kill.extend(kill_before_replace(o));
                starts.push(start(&c.name, ContainerKind::Init, Some(o)));
            }
        }
        previously = true;
    }
    // Nothing ran yet: the first one.
    if !previously {
        starts.push(start(&inits[0].name, ContainerKind::Init, rt.latest(ContainerKind::Init, &inits[0].name)));
    }
    starts.reverse();
    out.start = starts;
    out
}

/// Whether an app container was ever created in the runtime (upstream
/// `hasAnyRegularContainerCreated`): then the init containers completed once.
fn any_app_container_created(spec: &PodSpec, rt: &PodRuntime) -> bool {
    spec.containers
        .iter()
        .any(|c| rt.latest(ContainerKind::App, &c.name).is_some_and(|o| o.state != ContainerState::Unknown))
}

/// Some(attempt of the new sandbox) when the pod needs a new sandbox (upstream
/// `PodSandboxChanged`).
fn sandbox_change(spec: &PodSpec, rt: &PodRuntime) -> Option<u32> {
    let Some(newest) = rt.sandbox() else {
        return Some(0);
    };
    // The next attempt comes after every attempt the runtime still holds, not only the newest
    // by creation time: containerd keeps a sandbox whose RunPodSandbox failed (its CNI ADD,
    // say) with its name reserved until it is removed, and such a sandbox can sort before an
    // older one (its creation time unset or equal); reusing its attempt is refused with `name
    // ... is reserved` on every retry.
    let next = rt.sandboxes.iter().map(|s| s.attempt).max().unwrap_or(newest.attempt).saturating_add(1);
    let ready = rt.sandboxes.iter().filter(|s| s.state == SandboxState::Ready).count();
    if ready > 1 || newest.state != SandboxState::Ready {
        return Some(next);
    }
    let host_network = spec.host_network == Some(true);
    if !host_network && newest.ip.as_deref().is_none_or(str::is_empty) {
        return Some(next);
    }
    None
}

/// The actions of one sync of `input.pod`.
pub fn plan(input: &PlanInput) -> Actions {
    let rt = input.runtime;
    let newest_sandbox = rt.sandbox().map(|s| s.id.clone());
    let mut a = Actions::default();

    let spec = match input.pod.spec.as_ref() {
        Some(spec) if !input.terminating => spec,
        // Terminating, or a pod without a spec (cannot come from the API server): stop it.
        _ => {
            a.kill_pod = true;
            a.sandbox_id = newest_sandbox;
            return a;
        }
    };
    let policy = RestartPolicy::of(spec);

    if let Some(attempt) = sandbox_change(spec, rt) {
        return plan_new_sandbox(spec, rt, policy, attempt);
    }
    a.sandbox_id = newest_sandbox;

    let init = init_actions(spec, rt, input.probes, policy);
    if init.failed {
        a.init_failed = true;
        a.kill_pod = true;
        return a;
    }
    if !init.initialized {
        a.kill = init.kill;
        a.start = init.start;
        return a;
    }

    // Running app containers that stay; the app containers' kills and starts.
    let mut keep = 0usize;
    let mut kills = Vec::new();
    let mut starts = Vec::new();
    for c in &spec.containers {
        let obs = rt.latest(ContainerKind::App, &c.name);
        let Some(o) = obs.filter(|o| o.state == ContainerState::Running) else {
            if should_restart(policy, obs) {
                kills.extend(obs.and_then(kill_before_replace));
                starts.push(start(&c.name, ContainerKind::App, obs));
            }
            continue;
        };
        let (message, restart, now, probe) = if o.hash != container_hash(c) {
            // Upstream restarts a changed container whatever the restart policy, at once.
            (format!("Container {} definition changed", c.name), true, true, false)
        } else if let Some(m) = input.probes.failed.get(&c.name) {
            // A failed liveness/startup probe is a failure of the container: it is killed
            // now and started again by a later sync once it has exited, through the
            // crash-loop backoff (which counts from its finishedAt), so a container that
            // keeps failing its probe backs off 10 s, 20 s, ... like one that keeps crashing.
            (m.strip_suffix(WILL_RESTART).unwrap_or(m).to_string(), policy.restarts_on_failure(), false, true)
        } else {
            keep += 1;
            continue;
        };
        let make = |message: String| if probe { probe_kill(o, message, input.probes) } else { kill(o, message) };
        if restart {
            kills.push(make(format!("{message}{WILL_RESTART}")));
            if now {
                starts.push(start(&c.name, ContainerKind::App, obs));
            } else {
                keep += 1;
            }
        } else {
            kills.push(make(message));
        }
    }

    if keep == 0 && starts.is_empty() {
        // No app container runs or will run: the pod is done, and its sidecars are stopped
        // with it rather than restarted (they do not keep a pod alive).
        a.kill = kills;
        a.kill_pod = true;
        a.pod_done = true;
        return a;
    }
    // Sidecars (init containers) first, as upstream starts them before the app containers.
    a.kill = init.kill;
    a.kill.extend(kills);
    a.start = init.start;
    a.start.extend(starts);
    a
}

/// The order in which a pod's running containers are stopped (upstream's termination ordering
/// with sidecars): first every container that is not a sidecar, all at once; then the sidecars
/// one at a time, in reverse order of their declaration, so that a sidecar outlives the app
/// containers and the sidecars declared after it.
pub fn termination_order<'a>(
    spec: Option<&PodSpec>,
    running: &[&'a ContainerObs],
) -> (Vec<&'a ContainerObs>, Vec<&'a ContainerObs>) {
    let inits = spec.and_then(|s| s.init_containers.as_deref()).unwrap_or_default();
    // Spec index of a running container that is a sidecar.
    let sidecar_index = |o: &ContainerObs| {
        (o.kind == ContainerKind::Init).then(|| inits.iter().position(|c| c.name == o.name && is_sidecar(c))).flatten()
    };
    let (mut sidecars, first): (Vec<&ContainerObs>, Vec<&ContainerObs>) =
        running.iter().copied().partition(|o| sidecar_index(o).is_some());
    sidecars.sort_by_key(|o| std::cmp::Reverse(sidecar_index(o)));
    (first, sidecars)
}

/// The sandbox must be (re)created with `attempt`.
fn plan_new_sandbox(spec: &PodSpec, rt: &PodRuntime, policy: RestartPolicy, attempt: u32) -> Actions {
    let mut a = Actions::default();
    // Stop what is left of the old sandbox(es): running containers, and the sandbox itself so
    // that its network is torn down (stopping a stopped sandbox is harmless).
    let stop_old = rt.sandbox().is_some() || rt.running().next().is_some();
    let done = |mut a: Actions| {
        a.kill_pod = true;
        a.pod_done = true;
        a.sandbox_id = rt.sandbox().map(|s| s.id.clone());
        a
    };

    // Upstream: a Never pod that already had a sandbox with containers is not run again. With
    // no containers yet, creating the sandbox is retried.
    if policy == RestartPolicy::Never && rt.sandbox().is_some() && !rt.containers.is_empty() {
        return done(a);
    }

    let apps: Vec<Start> = spec
        .containers
        .iter()
        .filter(|c| !(policy == RestartPolicy::OnFailure && succeeded(rt.latest(ContainerKind::App, &c.name))))
        .map(|c| start(&c.name, ContainerKind::App, rt.latest(ContainerKind::App, &c.name)))
        .collect();
    // Nothing to start and initialization completed once: no new sandbox for nothing.
    if apps.is_empty() && any_app_container_created(spec, rt) {
        return done(a);
    }

    a.kill_pod = stop_old;
    a.create_sandbox = true;
    a.sandbox_attempt = attempt;
    // The init containers all run again in the new sandbox, from the first.
    a.start = match spec.init_containers.as_deref().and_then(<[Container]>::first) {
        Some(first) => vec![start(&first.name, ContainerKind::Init, rt.latest(ContainerKind::Init, &first.name))],
        None => apps,
    };
    a
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::pod::model::Sandbox;
    use ContainerKind::{App, Init};
    use ContainerState::{Created, Exited, Running, Unknown};

    const S: i64 = 1_000_000_000;

    fn pod_with(policy: &str, inits: &[&str], apps: &[&str], host_network: bool) -> Pod {
        let c = |n: &&str| serde_json::json!({"name": n, "image": format!("img-{n}")});
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "uid-1"},
            "spec": {
                "restartPolicy": policy,
                "hostNetwork": host_network,
                "initContainers": inits.iter().map(c).collect::<Vec<_>>(),
                "containers": apps.iter().map(c).collect::<Vec<_>>(),
            }
        }))
        .unwrap()
    }

    fn pod(policy: &str, inits: &[&str], apps: &[&str]) -> Pod {
        pod_with(policy, inits, apps, false)
    }

    #[test]
    fn only_spec_metadata_and_gated_status_changes_need_a_sync() {
        use k8s_openapi::api::core::v1::{PodReadinessGate, PodStatus};
        let old = pod("Always", &[], &["app"]);
        let mut echo = old.clone();
        echo.metadata.resource_version = Some("7".into());
        echo.metadata.managed_fields = Some(vec![Default::default()]);
        echo.status = Some(PodStatus { phase: Some("Running".into()), ..Default::default() });
        assert!(!update_needs_sync(&old, &echo), "a status-only change is a reconcile");
        assert!(!update_needs_sync(&old, &old.clone()));
        let changed = |f: &dyn Fn(&mut Pod)| {
            let mut p = echo.clone();
            f(&mut p);
            update_needs_sync(&echo, &p)
        };
        assert!(changed(&|p| p.spec.as_mut().unwrap().containers[0].image = Some("img-2".into())));
        assert!(changed(&|p| p.metadata.labels = Some([("a".to_string(), "b".to_string())].into())));
        assert!(changed(&|p| p.metadata.annotations = Some([("a".to_string(), "b".to_string())].into())));
        assert!(changed(&|p| p.metadata.deletion_grace_period_seconds = Some(30)));
        assert!(changed(&|p| {
            p.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH))
        }));
        assert!(!changed(&|p| p.status.as_mut().unwrap().phase = Some("Failed".into())));
        // with a readiness gate, others' conditions go into Ready: a status change syncs
        let mut gated = echo.clone();
        gated.spec.as_mut().unwrap().readiness_gates =
            Some(vec![PodReadinessGate { condition_type: "example.com/lb".into() }]);
        let mut set = gated.clone();
        set.status.as_mut().unwrap().conditions = Some(vec![Default::default()]);
        assert!(update_needs_sync(&gated, &set));
        assert!(!update_needs_sync(&gated, &gated.clone()));
    }

    fn spec_container<'a>(pod: &'a Pod, kind: ContainerKind, name: &str) -> &'a Container {
        let spec = pod.spec.as_ref().unwrap();
        let list = match kind {
            Init => spec.init_containers.as_deref().unwrap(),
            App => &spec.containers,
        };
        list.iter().find(|c| c.name == name).unwrap()
    }

    fn sandbox(id: &str, attempt: u32, ready: bool) -> Sandbox {
        Sandbox {
            id: id.to_string(),
            attempt,
            state: if ready { SandboxState::Ready } else { SandboxState::NotReady },
            created_at: S,
            ip: Some("10.0.0.5".to_string()),
            additional_ips: vec![],
        }
    }

    /// An attempt of container `name` of `pod`, with the current spec hash; finished attempts
    /// ran 5 s and finished at 100 s + attempt.
    fn obs(
        pod: &Pod,
        kind: ContainerKind,
        name: &str,
        attempt: u32,
        state: ContainerState,
        exit_code: i32,
    ) -> ContainerObs {
        let finished = state == Exited;
        let started = state != Created;
        let end = (100 + i64::from(attempt)) * S;
        ContainerObs {
            id: format!("{name}-{attempt}"),
            sandbox_id: "sb".to_string(),
            name: name.to_string(),
            kind,
            attempt,
            state,
            created_at: end - 6 * S,
            started_at: if started { end - 5 * S } else { 0 },
            finished_at: if finished { end } else { 0 },
            exit_code,
            reason: String::new(),
            message: String::new(),
            image: format!("img-{name}"),
            image_ref: String::new(),
            hash: container_hash(spec_container(pod, kind, name)),
            restart_count: attempt,
        }
    }

    /// The runtime with one ready sandbox "sb" (attempt 0) and `containers`, newest first.
    fn rt(containers: Vec<ContainerObs>) -> PodRuntime {
        rt_with(vec![sandbox("sb", 0, true)], containers)
    }

    fn rt_with(sandboxes: Vec<Sandbox>, containers: Vec<ContainerObs>) -> PodRuntime {
        PodRuntime { uid: "uid-1".into(), name: "p".into(), namespace: "ns".into(), sandboxes, containers }
    }

    fn run(pod: &Pod, runtime: &PodRuntime) -> Actions {
        plan(&PlanInput { pod, runtime, probes: &ProbeResults::default(), terminating: false })
    }

    fn run_probes(pod: &Pod, runtime: &PodRuntime, probes: &ProbeResults) -> Actions {
        plan(&PlanInput { pod, runtime, probes, terminating: false })
    }

    fn first(name: &str, kind: ContainerKind) -> Start {
        start(name, kind, None)
    }

    fn names(starts: &[Start]) -> Vec<(&str, ContainerKind)> {
        starts.iter().map(|s| (s.name.as_str(), s.kind)).collect()
    }

    fn kill_ids(a: &Actions) -> Vec<&str> {
        a.kill.iter().map(|k| k.id.as_str()).collect()
    }

    /// Actions that keep everything as it is in sandbox "sb".
    fn steady() -> Actions {
        Actions { sandbox_id: Some("sb".into()), ..Actions::default() }
    }

    #[test]
    fn fnv_reference_values() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn container_hash_is_stable_and_follows_the_spec() {
        let c: Container = serde_json::from_value(serde_json::json!({"name": "app", "image": "nginx:1.27"})).unwrap();
        // Golden: the same bytes in every process and version of ferro-agent.
        assert_eq!(serde_json::to_string(&c).unwrap(), r#"{"image":"nginx:1.27","name":"app"}"#);
        assert_eq!(container_hash(&c), fnv1a64(br#"{"image":"nginx:1.27","name":"app"}"#));
        assert_eq!(container_hash(&c), container_hash(&c.clone()));
        let mut other = c.clone();
        other.image = Some("nginx:1.28".into());
        assert_ne!(container_hash(&c), container_hash(&other));
        let mut env = c.clone();
        env.args = Some(vec!["-v".into()]);
        assert_ne!(container_hash(&c), container_hash(&env));
    }

    #[test]
    fn first_sync_creates_the_sandbox_and_starts_the_first_init_container() {
        let p = pod("Always", &["i1", "i2"], &["a", "b"]);
        let a = run(&p, &PodRuntime::default());
        assert_eq!(
            a,
            Actions { create_sandbox: true, sandbox_attempt: 0, start: vec![first("i1", Init)], ..Actions::default() }
        );
    }

    #[test]
    fn first_sync_without_init_containers_starts_every_app_container_in_order() {
        for policy in ["Always", "OnFailure", "Never"] {
            let p = pod(policy, &[], &["a", "b", "c"]);
            let a = run(&p, &PodRuntime::default());
            assert!(a.create_sandbox && !a.kill_pod, "{policy}");
            assert_eq!(a.start, vec![first("a", App), first("b", App), first("c", App)], "{policy}");
        }
    }

    #[test]
    fn sandbox_without_containers_starts_everything() {
        let p = pod("Always", &[], &["a", "b"]);
        let a = run(&p, &rt(vec![]));
        assert_eq!(a, Actions { start: vec![first("a", App), first("b", App)], ..steady() });
    }

    #[test]
    fn init_containers_run_one_at_a_time_in_order() {
        let p = pod("Always", &["i1", "i2", "i3"], &["a"]);
        let i1_ok = obs(&p, Init, "i1", 0, Exited, 0);
        let i2_ok = obs(&p, Init, "i2", 0, Exited, 0);

        // Nothing ran in the sandbox yet.
        assert_eq!(run(&p, &rt(vec![])), Actions { start: vec![first("i1", Init)], ..steady() });
        // i1 running: wait.
        assert_eq!(run(&p, &rt(vec![obs(&p, Init, "i1", 0, Running, 0)])), steady());
        // i1 done: i2.
        assert_eq!(run(&p, &rt(vec![i1_ok.clone()])), Actions { start: vec![first("i2", Init)], ..steady() });
        // i2 running.
        assert_eq!(run(&p, &rt(vec![obs(&p, Init, "i2", 0, Running, 0), i1_ok.clone()])), steady());
        // i1 and i2 done: i3.
        let a = run(&p, &rt(vec![i2_ok.clone(), i1_ok.clone()]));
        assert_eq!(names(&a.start), [("i3", Init)]);
        // All done: the app containers.
        let a = run(&p, &rt(vec![obs(&p, Init, "i3", 0, Exited, 0), i2_ok, i1_ok]));
        assert_eq!(a, Actions { start: vec![first("a", App)], ..steady() });
    }

    #[test]
    fn init_failure_per_restart_policy() {
        for (policy, restarts) in [("Never", false), ("OnFailure", true), ("Always", true)] {
            let p = pod(policy, &["i1", "i2"], &["a"]);
            let failed = obs(&p, Init, "i2", 2, Exited, 1);
            let runtime = rt(vec![failed.clone(), obs(&p, Init, "i1", 0, Exited, 0)]);
            let a = run(&p, &runtime);
            if restarts {
                let want = Start {
                    name: "i2".into(),
                    kind: Init,
                    restart_count: 3,
                    attempt: 3,
                    previous_finished_at: failed.finished_at,
                    previous_ran_for: Duration::from_secs(5),
                };
                assert_eq!(a, Actions { start: vec![want], ..steady() }, "{policy}");
            } else {
                assert_eq!(a, Actions { init_failed: true, kill_pod: true, ..steady() }, "{policy}");
            }
            assert!(!a.pod_done, "{policy}");
        }
    }

    #[test]
    fn init_container_oom_killed_with_exit_0_is_a_failure() {
        let p = pod("Never", &["i1"], &["a"]);
        let mut oom = obs(&p, Init, "i1", 0, Exited, 0);
        oom.reason = "OOMKilled".into();
        let a = run(&p, &rt(vec![oom]));
        assert!(a.init_failed && a.kill_pod && a.start.is_empty());
    }

    #[test]
    fn init_container_created_or_unknown_is_killed_and_started_anew() {
        let p = pod("Always", &["i1", "i2"], &["a"]);
        let i1_ok = obs(&p, Init, "i1", 0, Exited, 0);
        // Created: its start did not happen; a new attempt replaces it.
        let a = run(&p, &rt(vec![obs(&p, Init, "i2", 0, Created, 0), i1_ok.clone()]));
        assert_eq!(kill_ids(&a), ["i2-0"]);
        assert_eq!(a.start, vec![Start { restart_count: 1, attempt: 1, ..first("i2", Init) }]);
        // Unknown counts as failed: killed, and restarted unless Never.
        let a = run(&p, &rt(vec![obs(&p, Init, "i2", 0, Unknown, 0), i1_ok.clone()]));
        assert_eq!(kill_ids(&a), ["i2-0"]);
        assert_eq!(names(&a.start), [("i2", Init)]);
        let never = pod("Never", &["i1", "i2"], &["a"]);
        let a = run(&never, &rt(vec![obs(&never, Init, "i2", 0, Unknown, 0), i1_ok]));
        assert!(a.init_failed && a.kill_pod && a.start.is_empty());
    }

    #[test]
    fn running_app_container_means_initialized_even_without_init_records() {
        let p = pod("Always", &["i1"], &["a"]);
        let a = run(&p, &rt(vec![obs(&p, App, "a", 0, Running, 0)]));
        assert_eq!(a, steady());
    }

    #[test]
    fn running_containers_are_kept() {
        let p = pod("Never", &[], &["a", "b"]);
        let a = run(&p, &rt(vec![obs(&p, App, "b", 0, Running, 0), obs(&p, App, "a", 0, Running, 0)]));
        assert_eq!(a, steady());
    }

    #[test]
    fn exited_app_container_restart_per_policy() {
        // (policy, exit code, restarted)
        let table = [
            ("Always", 0, true),
            ("Always", 1, true),
            ("OnFailure", 0, false),
            ("OnFailure", 137, true),
            ("Never", 0, false),
            ("Never", 1, false),
        ];
        for (policy, code, restarted) in table {
            let p = pod(policy, &[], &["a", "b"]);
            let exited = obs(&p, App, "a", 4, Exited, code);
            let runtime = rt(vec![obs(&p, App, "b", 0, Running, 0), exited.clone()]);
            let a = run(&p, &runtime);
            let want = if restarted {
                let s = Start {
                    name: "a".into(),
                    kind: App,
                    restart_count: 5,
                    attempt: 5,
                    previous_finished_at: exited.finished_at,
                    previous_ran_for: Duration::from_secs(5),
                };
                Actions { start: vec![s], ..steady() }
            } else {
                // b still runs: the pod is not done.
                steady()
            };
            assert_eq!(a, want, "{policy} exit {code}");
        }
    }

    #[test]
    fn all_containers_finished_makes_the_pod_done() {
        // (policy, exit codes of a and b, done)
        let table = [
            ("Never", [0, 0], true),
            ("Never", [0, 1], true),
            ("OnFailure", [0, 0], true),
            ("OnFailure", [0, 1], false),
            ("Always", [0, 0], false),
        ];
        for (policy, [ea, eb], done) in table {
            let p = pod(policy, &["i1"], &["a", "b"]);
            let runtime = rt(vec![
                obs(&p, App, "b", 0, Exited, eb),
                obs(&p, App, "a", 0, Exited, ea),
                obs(&p, Init, "i1", 0, Exited, 0),
            ]);
            let a = run(&p, &runtime);
            assert_eq!(a.pod_done, done, "{policy} {ea} {eb}");
            assert_eq!(a.kill_pod, done, "{policy} {ea} {eb}");
            assert_eq!(a.start.is_empty(), done, "{policy} {ea} {eb}");
            assert!(!a.create_sandbox && a.kill.is_empty());
        }
    }

    #[test]
    fn pod_is_not_done_while_init_containers_work() {
        let p = pod("Never", &["i1"], &["a"]);
        let a = run(&p, &rt(vec![obs(&p, Init, "i1", 0, Running, 0)]));
        assert!(!a.pod_done && !a.kill_pod);
    }

    #[test]
    fn a_failed_probe_with_its_own_grace_period_kills_with_it() {
        let p = pod("Always", &[], &["a"]);
        let running = obs(&p, App, "a", 0, Running, 0);
        let mut probes = ProbeResults::default();
        probes.failed.insert("a".into(), "Container a failed liveness probe, will be restarted".into());
        probes.failed_grace.insert("a".into(), 3);
        let a = run_probes(&p, &rt(vec![running]), &probes);
        assert_eq!(a.kill.len(), 1);
        assert_eq!(a.kill[0].grace, Some(3));
    }

    #[test]
    fn liveness_failure_kills_and_restarts_unless_never() {
        for (policy, restarts) in [("Always", true), ("OnFailure", true), ("Never", false)] {
            let p = pod(policy, &[], &["a"]);
            let running = obs(&p, App, "a", 1, Running, 0);
            let mut probes = ProbeResults::default();
            probes.failed.insert("a".into(), "Container a failed liveness probe, will be restarted".into());
            let a = run_probes(&p, &rt(vec![running]), &probes);
            if restarts {
                let k = Kill {
                    id: "a-1".into(),
                    name: "a".into(),
                    message: "Container a failed liveness probe, will be restarted".into(),
                    grace: None,
                };
                // Killed now; started by a later sync once it has exited (with the backoff).
                assert_eq!(a, Actions { kill: vec![k], ..steady() }, "{policy}");
                let mut dead = obs(&p, App, "a", 1, Exited, 137);
                dead.finished_at = 5_000_000_000;
                let next = run_probes(&p, &rt(vec![dead.clone()]), &ProbeResults::default());
                assert_eq!(next.start.len(), 1, "{policy}");
                assert_eq!(next.start[0].previous_finished_at, dead.finished_at, "{policy}");
            } else {
                let k =
                    Kill { id: "a-1".into(), name: "a".into(), message: "Container a failed liveness probe".into(), grace: None };
                // Nothing left to run: the pod is done.
                assert_eq!(a, Actions { kill: vec![k], kill_pod: true, pod_done: true, ..steady() }, "{policy}");
            }
        }
    }

    #[test]
    fn startup_probe_failure_message_gets_the_restart_suffix() {
        let p = pod("Always", &[], &["a"]);
        let mut probes = ProbeResults::default();
        probes.failed.insert("a".into(), "Container a failed startup probe".into());
        let a = run_probes(&p, &rt(vec![obs(&p, App, "a", 0, Running, 0)]), &probes);
        assert_eq!(a.kill[0].message, "Container a failed startup probe, will be restarted");
        assert!(a.start.is_empty() && !a.pod_done, "{a:?}");
    }

    #[test]
    fn probe_failure_of_a_container_that_is_not_running_is_ignored() {
        let p = pod("Never", &[], &["a", "b"]);
        let mut probes = ProbeResults::default();
        probes.failed.insert("a".into(), "Container a failed liveness probe, will be restarted".into());
        let runtime = rt(vec![obs(&p, App, "b", 0, Running, 0), obs(&p, App, "a", 0, Exited, 1)]);
        assert_eq!(run_probes(&p, &runtime, &probes), steady());
    }

    #[test]
    fn spec_change_restarts_the_container_whatever_the_policy() {
        for policy in ["Always", "OnFailure", "Never"] {
            let old = pod(policy, &[], &["a", "b"]);
            let mut new = old.clone();
            new.spec.as_mut().unwrap().containers[0].image = Some("img-a:v2".into());
            let runtime = rt(vec![obs(&old, App, "b", 0, Running, 0), obs(&old, App, "a", 0, Running, 0)]);
            // A failed probe too: the spec change wins (one kill, upstream's message).
            let mut probes = ProbeResults::default();
            probes.failed.insert("a".into(), "Container a failed liveness probe, will be restarted".into());
            let a = run_probes(&new, &runtime, &probes);
            let k = Kill {
                id: "a-0".into(),
                name: "a".into(),
                message: "Container a definition changed, will be restarted".into(),
                grace: None,
            };
            let s = Start { restart_count: 1, attempt: 1, ..first("a", App) };
            assert_eq!(a, Actions { kill: vec![k], start: vec![s], ..steady() }, "{policy}");
        }
    }

    #[test]
    fn created_or_unknown_app_container_is_replaced_whatever_the_policy() {
        for policy in ["Always", "OnFailure", "Never"] {
            for state in [Created, Unknown] {
                let p = pod(policy, &[], &["a"]);
                let a = run(&p, &rt(vec![obs(&p, App, "a", 0, state, 0)]));
                assert_eq!(kill_ids(&a), ["a-0"], "{policy} {state:?}");
                assert_eq!(
                    a.start,
                    vec![Start { restart_count: 1, attempt: 1, ..first("a", App) }],
                    "{policy} {state:?}"
                );
                assert!(!a.kill_pod && !a.pod_done);
            }
        }
    }

    #[test]
    fn missing_app_container_is_started_next_to_running_ones() {
        let p = pod("Never", &[], &["a", "b"]);
        let a = run(&p, &rt(vec![obs(&p, App, "a", 0, Running, 0)]));
        assert_eq!(a, Actions { start: vec![first("b", App)], ..steady() });
    }

    #[test]
    fn dead_sandbox_is_recreated_with_the_next_attempt() {
        let p = pod("Always", &[], &["a", "b"]);
        let runtime = rt_with(
            vec![sandbox("sb2", 2, false), sandbox("sb1", 1, false)],
            vec![obs(&p, App, "b", 3, Running, 0), obs(&p, App, "a", 3, Exited, 2)],
        );
        let a = run(&p, &runtime);
        assert_eq!(
            a,
            Actions {
                kill_pod: true,
                create_sandbox: true,
                sandbox_attempt: 3,
                start: vec![
                    Start {
                        restart_count: 4,
                        attempt: 4,
                        previous_finished_at: 103 * S,
                        previous_ran_for: Duration::from_secs(5),
                        ..first("a", App)
                    },
                    Start { restart_count: 4, attempt: 4, ..first("b", App) },
                ],
                ..Actions::default()
            }
        );
    }

    #[test]
    fn a_new_sandbox_takes_an_attempt_after_every_one_the_runtime_holds() {
        // the sandbox of a failed RunPodSandbox (attempt 1) listed after the older attempt 0
        let p = pod("Always", &[], &["a"]);
        let runtime = rt_with(vec![sandbox("sb0", 0, false), sandbox("sb1", 1, false)], vec![]);
        let a = run(&p, &runtime);
        assert!(a.create_sandbox);
        assert_eq!(a.sandbox_attempt, 2);
    }

    #[test]
    fn new_sandbox_reruns_init_containers_from_the_first() {
        let p = pod("OnFailure", &["i1", "i2"], &["a"]);
        let runtime = rt_with(
            vec![sandbox("sb", 0, false)],
            vec![
                obs(&p, App, "a", 0, Running, 0),
                obs(&p, Init, "i2", 0, Exited, 0),
                obs(&p, Init, "i1", 0, Exited, 0),
            ],
        );
        let a = run(&p, &runtime);
        assert!(a.kill_pod && a.create_sandbox);
        assert_eq!(a.sandbox_attempt, 1);
        assert_eq!(a.sandbox_id, None);
        assert_eq!(
            a.start,
            vec![Start {
                restart_count: 1,
                attempt: 1,
                previous_finished_at: 100 * S,
                previous_ran_for: Duration::from_secs(5),
                ..first("i1", Init)
            }]
        );
    }

    #[test]
    fn new_sandbox_under_on_failure_skips_succeeded_containers() {
        let p = pod("OnFailure", &[], &["a", "b"]);
        let runtime = rt_with(
            vec![sandbox("sb", 0, false)],
            vec![obs(&p, App, "b", 0, Exited, 1), obs(&p, App, "a", 0, Exited, 0)],
        );
        let a = run(&p, &runtime);
        assert!(a.create_sandbox);
        assert_eq!(names(&a.start), [("b", App)]);

        // All succeeded: no new sandbox, the pod is done.
        let runtime = rt_with(
            vec![sandbox("sb", 0, false)],
            vec![obs(&p, App, "b", 0, Exited, 0), obs(&p, App, "a", 0, Exited, 0)],
        );
        let a = run(&p, &runtime);
        assert_eq!(a, Actions { kill_pod: true, pod_done: true, ..steady() });
    }

    #[test]
    fn never_pod_with_a_dead_sandbox_is_not_run_again() {
        let p = pod("Never", &[], &["a"]);
        let runtime = rt_with(vec![sandbox("sb", 0, false)], vec![obs(&p, App, "a", 0, Running, 0)]);
        assert_eq!(run(&p, &runtime), Actions { kill_pod: true, pod_done: true, ..steady() });
        // Init containers only (the app never started): also done.
        let p = pod("Never", &["i1"], &["a"]);
        let runtime = rt_with(vec![sandbox("sb", 0, false)], vec![obs(&p, Init, "i1", 0, Running, 0)]);
        assert_eq!(run(&p, &runtime), Actions { kill_pod: true, pod_done: true, ..steady() });
    }

    #[test]
    fn never_pod_whose_sandbox_died_before_any_container_is_retried() {
        let p = pod("Never", &[], &["a"]);
        let a = run(&p, &rt_with(vec![sandbox("sb", 0, false)], vec![]));
        assert_eq!(
            a,
            Actions {
                kill_pod: true,
                create_sandbox: true,
                sandbox_attempt: 1,
                start: vec![first("a", App)],
                ..Actions::default()
            }
        );
    }

    #[test]
    fn terminating_only_stops_the_pod() {
        let p = pod("Always", &["i1"], &["a"]);
        for runtime in [
            PodRuntime::default(),
            rt(vec![obs(&p, App, "a", 0, Exited, 1)]),
            rt_with(vec![sandbox("sb", 0, false)], vec![obs(&p, App, "a", 0, Running, 0)]),
        ] {
            let a =
                plan(&PlanInput { pod: &p, runtime: &runtime, probes: &ProbeResults::default(), terminating: true });
            let want =
                Actions { kill_pod: true, sandbox_id: runtime.sandbox().map(|s| s.id.clone()), ..Actions::default() };
            assert_eq!(a, want);
        }
    }

    #[test]
    fn sandbox_without_ip_is_fine_only_for_host_network_pods() {
        for ip in [None, Some(String::new())] {
            let mut sb = sandbox("sb", 0, true);
            sb.ip = ip.clone();
            let host = pod_with("Always", &[], &["a"], true);
            let runtime = rt_with(vec![sb.clone()], vec![obs(&host, App, "a", 0, Running, 0)]);
            assert_eq!(run(&host, &runtime), steady(), "{ip:?}");

            let pod_net = pod_with("Always", &[], &["a"], false);
            let runtime = rt_with(vec![sb], vec![obs(&pod_net, App, "a", 0, Running, 0)]);
            let a = run(&pod_net, &runtime);
            assert!(a.kill_pod && a.create_sandbox, "{ip:?}");
            assert_eq!(a.sandbox_attempt, 1);
        }
    }

    #[test]
    fn two_ready_sandboxes_are_replaced() {
        let p = pod("Always", &[], &["a"]);
        let runtime = rt_with(vec![sandbox("sb5", 5, true), sandbox("sb4", 4, true)], vec![]);
        let a = run(&p, &runtime);
        assert!(a.kill_pod && a.create_sandbox);
        assert_eq!(a.sandbox_attempt, 6);
    }

    #[test]
    fn ready_newest_sandbox_is_used() {
        let p = pod("Always", &[], &["a"]);
        let runtime =
            rt_with(vec![sandbox("sb5", 5, true), sandbox("sb4", 4, false)], vec![obs(&p, App, "a", 0, Running, 0)]);
        assert_eq!(run(&p, &runtime), Actions { sandbox_id: Some("sb5".into()), ..Actions::default() });
    }

    #[test]
    fn restart_policy_defaults_to_always() {
        let mut p = pod("Always", &[], &["a"]);
        p.spec.as_mut().unwrap().restart_policy = None;
        let a = run(&p, &rt(vec![obs(&p, App, "a", 0, Exited, 0)]));
        assert_eq!(names(&a.start), [("a", App)]);
    }

    /// `pod` with init containers `names` made sidecars (restartPolicy Always); those in
    /// `startup` get an exec startup probe.
    fn sidecars(mut pod: Pod, names: &[&str], startup: &[&str]) -> Pod {
        for c in pod.spec.as_mut().unwrap().init_containers.iter_mut().flatten() {
            if names.contains(&c.name.as_str()) {
                c.restart_policy = Some("Always".into());
            }
            if startup.contains(&c.name.as_str()) {
                c.startup_probe =
                    Some(serde_json::from_value(serde_json::json!({"exec": {"command": ["true"]}})).unwrap());
            }
        }
        pod
    }

    fn restarted(o: &ContainerObs) -> Start {
        start(&o.name, o.kind, Some(o))
    }

    #[test]
    fn started_sidecar_lets_the_next_init_container_start() {
        for policy in ["Always", "OnFailure", "Never"] {
            let p = sidecars(pod(policy, &["s", "i2"], &["a"]), &["s"], &[]);
            let s_up = obs(&p, Init, "s", 0, Running, 0);
            let i2_ok = obs(&p, Init, "i2", 0, Exited, 0);
            // First sync: the sidecar first.
            let a = run(&p, &PodRuntime::default());
            assert_eq!(a.start, vec![first("s", Init)], "{policy}");
            // Running (no startup probe: started): i2 next, while it keeps running.
            assert_eq!(run(&p, &rt(vec![s_up.clone()])), Actions { start: vec![first("i2", Init)], ..steady() });
            // i2 at work: wait.
            let a = run(&p, &rt(vec![obs(&p, Init, "i2", 0, Running, 0), s_up.clone()]));
            assert_eq!(a, steady(), "{policy}");
            // i2 done: the app containers, the sidecar untouched.
            let a = run(&p, &rt(vec![i2_ok.clone(), s_up.clone()]));
            assert_eq!(a, Actions { start: vec![first("a", App)], ..steady() }, "{policy}");
            // Everything runs: nothing to do.
            let a = run(&p, &rt(vec![obs(&p, App, "a", 0, Running, 0), i2_ok, s_up]));
            assert_eq!(a, steady(), "{policy}");
        }
    }

    #[test]
    fn sidecar_as_last_init_container_completes_initialization_once_started() {
        let p = sidecars(pod("Always", &["i1", "s"], &["a", "b"]), &["s"], &["s"]);
        let i1_ok = obs(&p, Init, "i1", 0, Exited, 0);
        let s_up = obs(&p, Init, "s", 0, Running, 0);
        assert_eq!(run(&p, &rt(vec![i1_ok.clone()])), Actions { start: vec![first("s", Init)], ..steady() });
        // Not started yet (startup probe without a verdict): wait.
        assert_eq!(run(&p, &rt(vec![s_up.clone(), i1_ok.clone()])), steady());
        let mut probes = ProbeResults::default();
        probes.startup.insert("s".into(), true);
        let a = run_probes(&p, &rt(vec![s_up, i1_ok]), &probes);
        assert_eq!(a, Actions { start: vec![first("a", App), first("b", App)], ..steady() });
    }

    #[test]
    fn sidecar_waits_for_its_startup_probe() {
        let p = sidecars(pod("Always", &["s", "i2"], &["a"]), &["s"], &["s"]);
        let runtime = rt(vec![obs(&p, Init, "s", 0, Running, 0)]);
        // No verdict yet: nothing starts.
        assert_eq!(run(&p, &runtime), steady());
        // Succeeded: i2.
        let mut probes = ProbeResults::default();
        probes.startup.insert("s".into(), true);
        assert_eq!(run_probes(&p, &runtime, &probes), Actions { start: vec![first("i2", Init)], ..steady() });
        // Failed: killed (upstream's message), started again by a later sync through the backoff.
        let mut probes = ProbeResults::default();
        probes.failed.insert("s".into(), "Container s failed startup probe, will be restarted".into());
        let k = Kill { id: "s-0".into(), name: "s".into(), message: "Init container s failed startup probe".into(), grace: None };
        assert_eq!(run_probes(&p, &runtime, &probes), Actions { kill: vec![k], ..steady() });
        let dead = obs(&p, Init, "s", 0, Exited, 137);
        let a = run(&p, &rt(vec![dead.clone()]));
        assert_eq!(a, Actions { start: vec![restarted(&dead)], ..steady() });
        assert_eq!(a.start[0].previous_finished_at, 100 * S);
        assert!(!a.init_failed && !a.kill_pod);
    }

    #[test]
    fn exited_sidecar_is_restarted_with_backoff_whatever_the_policy() {
        for policy in ["Always", "OnFailure", "Never"] {
            for code in [0, 1] {
                let p = sidecars(pod(policy, &["s", "i2"], &["a"]), &["s"], &[]);
                let dead = obs(&p, Init, "s", 2, Exited, code);
                let want = Start {
                    name: "s".into(),
                    kind: Init,
                    restart_count: 3,
                    attempt: 3,
                    previous_finished_at: 102 * S,
                    previous_ran_for: Duration::from_secs(5),
                };
                // During initialization (i2 at work): restarted, i2 left alone, no pod failure.
                let a = run(&p, &rt(vec![obs(&p, Init, "i2", 0, Running, 0), dead.clone()]));
                assert_eq!(a, Actions { start: vec![want.clone()], ..steady() }, "{policy} {code}");
                // Before i2 ever ran: restarted, i2 waits for it to have started.
                let a = run(&p, &rt(vec![dead.clone()]));
                assert_eq!(a, Actions { start: vec![want.clone()], ..steady() }, "{policy} {code}");
                // After initialization: restarted, the app container untouched.
                let runtime =
                    rt(vec![obs(&p, App, "a", 0, Running, 0), obs(&p, Init, "i2", 0, Exited, 0), dead.clone()]);
                let a = run(&p, &runtime);
                assert_eq!(a, Actions { start: vec![want], ..steady() }, "{policy} {code}");
            }
        }
    }

    #[test]
    fn sidecar_in_created_or_unknown_state_is_replaced() {
        for state in [Created, Unknown] {
            let p = sidecars(pod("Never", &["s"], &["a"]), &["s"], &[]);
            let o = obs(&p, Init, "s", 0, state, 0);
            let a = run(&p, &rt(vec![obs(&p, App, "a", 0, Running, 0), o.clone()]));
            assert_eq!(kill_ids(&a), ["s-0"], "{state:?}");
            assert_eq!(a.start, vec![restarted(&o)], "{state:?}");
            assert!(!a.init_failed && !a.kill_pod && !a.pod_done, "{state:?}");
        }
    }

    #[test]
    fn sidecar_liveness_failure_kills_it_and_a_later_sync_restarts_it() {
        let p = sidecars(pod("Never", &["s"], &["a"]), &["s"], &[]);
        let app = obs(&p, App, "a", 0, Running, 0);
        let mut probes = ProbeResults::default();
        probes.failed.insert("s".into(), "Container s failed liveness probe, will be restarted".into());
        let a = run_probes(&p, &rt(vec![app.clone(), obs(&p, Init, "s", 1, Running, 0)]), &probes);
        let k = Kill { id: "s-1".into(), name: "s".into(), message: "Init container s failed liveness probe".into(), grace: None };
        assert_eq!(a, Actions { kill: vec![k], ..steady() });
        let dead = obs(&p, Init, "s", 1, Exited, 137);
        let a = run(&p, &rt(vec![app, dead.clone()]));
        assert_eq!(a, Actions { start: vec![restarted(&dead)], ..steady() });
        assert_eq!(a.start[0].previous_finished_at, dead.finished_at);
    }

    #[test]
    fn sidecar_spec_change_replaces_it_at_once() {
        let old = sidecars(pod("Always", &["s"], &["a"]), &["s"], &[]);
        let mut new = old.clone();
        new.spec.as_mut().unwrap().init_containers.as_mut().unwrap()[0].image = Some("img-s:v2".into());
        let running = obs(&old, Init, "s", 0, Running, 0);
        let a = run(&new, &rt(vec![obs(&old, App, "a", 0, Running, 0), running.clone()]));
        let k = Kill { id: "s-0".into(), name: "s".into(), message: "Init container s definition changed".into(), grace: None };
        assert_eq!(a, Actions { kill: vec![k], start: vec![restarted(&running)], ..steady() });
    }

    #[test]
    fn sidecar_restarts_before_the_app_containers_when_everything_exited() {
        // As upstream: exited app containers do not show that the pod was initialized (after a
        // reboot everything has exited), so the sidecar must have started again first.
        let p = sidecars(pod("Always", &["s"], &["a"]), &["s"], &[]);
        let s_dead = obs(&p, Init, "s", 0, Exited, 1);
        let a_dead = obs(&p, App, "a", 0, Exited, 1);
        let a = run(&p, &rt(vec![a_dead.clone(), s_dead.clone()]));
        assert_eq!(a, Actions { start: vec![restarted(&s_dead)], ..steady() });
        let a = run(&p, &rt(vec![obs(&p, Init, "s", 1, Running, 0), a_dead.clone(), s_dead]));
        assert_eq!(a, Actions { start: vec![restarted(&a_dead)], ..steady() });
    }

    #[test]
    fn sidecar_without_records_after_initialization_is_started_again() {
        // Container GC (or a lost runtime state) removed the init containers' records while the
        // app container runs: the sidecar runs again, the regular init container does not.
        let p = sidecars(pod("Always", &["s", "i2"], &["a"]), &["s"], &[]);
        let a = run(&p, &rt(vec![obs(&p, App, "a", 0, Running, 0)]));
        assert_eq!(a, Actions { start: vec![first("s", Init)], ..steady() });
    }

    #[test]
    fn agent_restart_with_sidecar_and_app_running_changes_nothing() {
        // After a restart the probe results are empty: the sidecar's startup probe has no verdict
        // yet, which must not hold or restart anything once the app container runs.
        let p = sidecars(pod("Never", &["s1", "i2", "s3"], &["a"]), &["s1", "s3"], &["s1", "s3"]);
        let full = rt(vec![
            obs(&p, App, "a", 0, Running, 0),
            obs(&p, Init, "s3", 0, Running, 0),
            obs(&p, Init, "i2", 0, Exited, 0),
            obs(&p, Init, "s1", 0, Running, 0),
        ]);
        assert_eq!(run(&p, &full), steady());
        // i2's record garbage-collected: still nothing.
        let gc = rt(vec![
            obs(&p, App, "a", 0, Running, 0),
            obs(&p, Init, "s3", 0, Running, 0),
            obs(&p, Init, "s1", 0, Running, 0),
        ]);
        assert_eq!(run(&p, &gc), steady());
    }

    #[test]
    fn pod_is_done_when_its_app_containers_are_and_sidecars_are_stopped() {
        for (policy, code, done) in
            [("Never", 0, true), ("Never", 1, true), ("OnFailure", 0, true), ("OnFailure", 1, false)]
        {
            let p = sidecars(pod(policy, &["s", "i2"], &["a"]), &["s"], &[]);
            let app = obs(&p, App, "a", 0, Exited, code);
            let i2_ok = obs(&p, Init, "i2", 0, Exited, 0);
            // The sidecar still runs, or has exited (it is not restarted then).
            for s in [obs(&p, Init, "s", 0, Running, 0), obs(&p, Init, "s", 0, Exited, 1)] {
                let a = run(&p, &rt(vec![app.clone(), i2_ok.clone(), s.clone()]));
                if done {
                    assert_eq!(
                        a,
                        Actions { kill_pod: true, pod_done: true, ..steady() },
                        "{policy} {code} {:?}",
                        s.state
                    );
                } else {
                    assert!(a.start.iter().any(|st| st.name == "a"), "{policy} {code}");
                    assert!(!a.kill_pod && !a.pod_done);
                }
            }
        }
    }

    #[test]
    fn regular_init_failure_under_never_fails_the_pod_with_sidecars_running() {
        let p = sidecars(pod("Never", &["s", "i2"], &["a"]), &["s"], &[]);
        let runtime = rt(vec![obs(&p, Init, "i2", 0, Exited, 3), obs(&p, Init, "s", 0, Running, 0)]);
        assert_eq!(run(&p, &runtime), Actions { init_failed: true, kill_pod: true, ..steady() });
    }

    #[test]
    fn new_sandbox_starts_again_from_the_first_sidecar() {
        let p = sidecars(pod("Always", &["s", "i2"], &["a"]), &["s"], &[]);
        let s_old = obs(&p, Init, "s", 0, Exited, 137);
        let runtime = rt_with(vec![sandbox("sb", 0, false)], vec![obs(&p, App, "a", 0, Exited, 137), s_old.clone()]);
        let a = run(&p, &runtime);
        assert!(a.kill_pod && a.create_sandbox);
        assert_eq!(a.start, vec![restarted(&s_old)]);
    }

    #[test]
    fn termination_stops_app_containers_first_then_sidecars_in_reverse_order() {
        let p = sidecars(pod("Always", &["s1", "i2", "s3", "s4"], &["a", "b"]), &["s1", "s3", "s4"], &[]);
        let all = [
            obs(&p, Init, "s3", 0, Running, 0),
            obs(&p, App, "a", 0, Running, 0),
            obs(&p, Init, "s1", 0, Running, 0),
            obs(&p, Init, "i2", 0, Running, 0),
            obs(&p, Init, "s4", 0, Running, 0),
            obs(&p, App, "b", 0, Running, 0),
        ];
        let running: Vec<&ContainerObs> = all.iter().collect();
        let (first, sidecars) = termination_order(p.spec.as_ref(), &running);
        let ids = |v: &[&ContainerObs]| v.iter().map(|o| o.name.clone()).collect::<Vec<_>>();
        assert_eq!(ids(&first), ["a", "i2", "b"]);
        assert_eq!(ids(&sidecars), ["s4", "s3", "s1"]);
        // Without a spec (or without sidecars) everything goes at once.
        let (first, sidecars) = termination_order(None, &running);
        assert_eq!(first.len(), 6);
        assert!(sidecars.is_empty());
    }
}
