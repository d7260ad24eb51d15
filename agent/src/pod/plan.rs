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
//!    retried otherwise; app containers wait until all of them exited 0.
//! 4. App containers: start the missing ones; restart the dead ones per restartPolicy; kill
//!    running ones whose spec hash changed or whose liveness/startup probe failed.
//! 5. Nothing running and nothing to start: the pod is done and its sandbox is stopped.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};

use crate::pod::model::{ContainerKind, ContainerObs, ContainerState, PodRuntime, ProbeResults, SandboxState};

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
    /// Containers to start in this sync, in order: at most one init container, or app
    /// containers.
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
    Kill { id: obs.id.clone(), name: obs.name.clone(), message }
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

/// Where the init containers stand (upstream `findNextInitContainerToRun`).
#[derive(Debug)]
enum InitStep<'a> {
    /// All init containers succeeded (or there are none): on to the app containers.
    Done,
    /// One is running: nothing to do until it exits.
    Wait,
    /// This one (newest attempt given) failed.
    Failed(&'a Container, &'a ContainerObs),
    /// This one runs next (its newest attempt, if any, is Created: a start that did not happen).
    Next(&'a Container, Option<&'a ContainerObs>),
}

fn init_step<'a>(spec: &'a PodSpec, rt: &'a PodRuntime) -> InitStep<'a> {
    // Sidecar init containers (restartPolicy Always, KEP-753) are not supported: they are run
    // like regular init containers, so one that never exits holds the pod in initialization.
    let inits = spec.init_containers.as_deref().unwrap_or_default();
    let Some(first) = inits.first() else {
        return InitStep::Done;
    };
    // A running app container means initialization completed once; the init containers' own
    // records may have been garbage-collected since, and must not run again.
    if spec
        .containers
        .iter()
        .any(|c| rt.latest(ContainerKind::App, &c.name).is_some_and(|o| o.state == ContainerState::Running))
    {
        return InitStep::Done;
    }
    // The last failed one, if any.
    for c in inits.iter().rev() {
        if let Some(o) = rt.latest(ContainerKind::Init, &c.name).filter(|o| init_failed(o)) {
            return InitStep::Failed(c, o);
        }
    }
    // Otherwise, from the end: the last one that exited (successfully: failures were handled
    // above) tells which runs next. A Created attempt is skipped like a missing one (as
    // upstream), so the container is started anew.
    for (i, c) in inits.iter().enumerate().rev() {
        let Some(o) = rt.latest(ContainerKind::Init, &c.name) else {
            continue;
        };
        match o.state {
            ContainerState::Running => return InitStep::Wait,
            ContainerState::Exited => {
                return match inits.get(i + 1) {
                    None => InitStep::Done,
                    Some(next) => InitStep::Next(next, rt.latest(ContainerKind::Init, &next.name)),
                };
            }
            ContainerState::Created | ContainerState::Unknown => {}
        }
    }
    InitStep::Next(first, rt.latest(ContainerKind::Init, &first.name))
}

/// Some(attempt of the new sandbox) when the pod needs a new sandbox (upstream
/// `PodSandboxChanged`).
fn sandbox_change(spec: &PodSpec, rt: &PodRuntime) -> Option<u32> {
    let Some(newest) = rt.sandbox() else {
        return Some(0);
    };
    let next = newest.attempt.saturating_add(1);
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

    match init_step(spec, rt) {
        InitStep::Done => {}
        InitStep::Wait => return a,
        InitStep::Failed(c, obs) => {
            if policy.restarts_on_failure() {
                a.kill.extend(kill_before_replace(obs));
                a.start.push(start(&c.name, ContainerKind::Init, Some(obs)));
            } else {
                a.init_failed = true;
                a.kill_pod = true;
            }
            return a;
        }
        InitStep::Next(c, obs) => {
            a.kill.extend(obs.and_then(kill_before_replace));
            a.start.push(start(&c.name, ContainerKind::Init, obs));
            return a;
        }
    }

    // Running containers that stay.
    let mut keep = 0usize;
    for c in &spec.containers {
        let obs = rt.latest(ContainerKind::App, &c.name);
        let Some(o) = obs.filter(|o| o.state == ContainerState::Running) else {
            if should_restart(policy, obs) {
                a.kill.extend(obs.and_then(kill_before_replace));
                a.start.push(start(&c.name, ContainerKind::App, obs));
            }
            continue;
        };
        let (message, restart, now) = if o.hash != container_hash(c) {
            // Upstream restarts a changed container whatever the restart policy, at once.
            (format!("Container {} definition changed", c.name), true, true)
        } else if let Some(m) = input.probes.failed.get(&c.name) {
            // A failed liveness/startup probe is a failure of the container: it is killed
            // now and started again by a later sync once it has exited, through the
            // crash-loop backoff (which counts from its finishedAt), so a container that
            // keeps failing its probe backs off 10 s, 20 s, ... like one that keeps crashing.
            (m.strip_suffix(WILL_RESTART).unwrap_or(m).to_string(), policy.restarts_on_failure(), false)
        } else {
            keep += 1;
            continue;
        };
        if restart {
            a.kill.push(kill(o, format!("{message}{WILL_RESTART}")));
            if now {
                a.start.push(start(&c.name, ContainerKind::App, obs));
            } else {
                keep += 1;
            }
        } else {
            a.kill.push(kill(o, message));
        }
    }

    if keep == 0 && a.start.is_empty() {
        a.kill_pod = true;
        a.pod_done = true;
    }
    a
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
    if apps.is_empty() && matches!(init_step(spec, rt), InitStep::Done) {
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
                    Kill { id: "a-1".into(), name: "a".into(), message: "Container a failed liveness probe".into() };
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
}
