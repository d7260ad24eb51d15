//! The Job planner (upstream `pkg/controller/job`, `syncJob` with the features of Kubernetes
//! 1.33 on: pod tracking finalizers, delayed terminal conditions, Indexed completion with the
//! index label, backoffLimitPerIndex, podFailurePolicy, successPolicy, podReplacementPolicy).
//!
//! Pure: the Job, the pods of its namespace, what the executor still waits for and the clock
//! in; the pods to adopt, release, create and delete, the finalizers to remove, the statuses
//! to write and the events out. The executor applies a plan in this order: adopt/release,
//! delete, create, write [`JobPlan::interim_status`] (the finished pods' uids in
//! `uncountedTerminatedPods` and an interim `FailureTarget`/`SuccessCriteriaMet` condition),
//! remove the tracking finalizers, write [`JobPlan::status`] (those pods moved into the counters,
//! the terminal condition once no pod is uncounted or terminating), record the events. A
//! failure stops the sequence; the next pass starts from what the API then shows, so a crash
//! anywhere neither loses nor double-counts a pod.
//!
//! Deliberate differences from upstream:
//! - while replacements wait for the pod-failure back-off, `status.active` keeps counting the
//!   running pods (upstream's manageJob reports 0 for that pass);
//! - events about created and deleted pods are the executor's (one per pod, upstream's text).

pub mod failure;
pub mod indexes;
#[cfg(test)]
mod tests;

use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::batch::v1::{Job, JobCondition, JobSpec, JobStatus, UncountedTerminatedPods};
use k8s_openapi::api::core::v1::{Container, EnvVar, EnvVarSource, ObjectFieldSelector, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};

use self::failure::{finished_time, match_policy, remaining_for, Action, BackoffRecord};
use self::indexes::Indexes;
use crate::selector::LabelSelector;

/// The finalizer that keeps a pod until the Job counted it.
pub const TRACKING_FINALIZER: &str = "batch.kubernetes.io/job-tracking";
/// Annotation and label with a pod's completion index.
pub const COMPLETION_INDEX: &str = "batch.kubernetes.io/job-completion-index";
/// Failed pods of the index before this one (backoffLimitPerIndex).
pub const INDEX_FAILURE_COUNT: &str = "batch.kubernetes.io/job-index-failure-count";
/// Failures of the index the pod failure policy ignored.
pub const INDEX_IGNORED_FAILURE_COUNT: &str = "batch.kubernetes.io/job-index-ignored-failure-count";
/// The environment variable with the completion index.
pub const COMPLETION_INDEX_ENV: &str = "JOB_COMPLETION_INDEX";
/// `spec.managedBy` of Jobs this controller manages (unset means the same).
pub const CONTROLLER_NAME: &str = "kubernetes.io/job-controller";
/// At most this many pods in each list of `uncountedTerminatedPods` per pass.
pub const MAX_UNCOUNTED_PODS: usize = 500;
/// At most this many pods created or deleted per pass.
pub const MAX_POD_CREATE_DELETE_PER_SYNC: usize = 500;
/// Upstream's batching delay: a requeue is never sooner than this.
pub const SYNC_BATCH_PERIOD: Duration = Duration::from_secs(1);
/// Generated names are at most this long before the random suffix.
const MAX_GENERATED_NAME_LENGTH: usize = 58;

/// What the planner sees besides the Job.
pub struct Observed<'a> {
    /// Every pod of the Job's namespace.
    pub pods: &'a [&'a Pod],
    pub now: Timestamp,
    /// Whether the informer has seen the creations and deletions of earlier passes.
    pub expectations_satisfied: bool,
    /// Uids of pods whose finalizer removal the informer has not shown yet.
    pub expected_removals: &'a BTreeSet<String>,
    /// The Job's pod-failure back-off record so far.
    pub backoff: BackoffRecord,
}

/// A pod to delete; pods removed by the controller's own choice (suspend, too many) lose their
/// finalizer first and are not counted, pods of a finished Job keep it and count as failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodDeletion {
    pub name: String,
    pub remove_finalizer: bool,
    pub ready: bool,
}

/// An event about the Job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobEvent {
    pub type_: &'static str,
    pub reason: String,
    pub message: String,
}

/// One pass over a Job.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JobPlan {
    /// Orphans matching the selector: patch in the controller reference and the finalizer.
    pub adopt: Vec<String>,
    /// Owned pods that no longer match the selector: drop the controller reference.
    pub release: Vec<String>,
    pub delete: Vec<PodDeletion>,
    /// Pods to create (generateName set).
    pub create: Vec<Pod>,
    /// Written before the finalizers are removed, when there are some to remove.
    pub interim_status: Option<JobStatus>,
    /// (name, uid) of the pods whose tracking finalizer goes.
    pub remove_finalizers: Vec<(String, String)>,
    /// The status at the end of the pass, when it differs from the Job's.
    pub status: Option<JobStatus>,
    /// Recorded once the status is written.
    pub events: Vec<JobEvent>,
    /// The back-off record to keep once the status is written.
    pub backoff: BackoffRecord,
    pub requeue_after: Option<Duration>,
    /// Why the Job goes no further now, in words (explanations).
    pub waiting: Vec<String>,
}

// ---------------------------------------------------------------------------------------------
// pods
// ---------------------------------------------------------------------------------------------

fn phase(p: &Pod) -> &str {
    p.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or_default()
}

fn uid(p: &Pod) -> &str {
    p.metadata.uid.as_deref().unwrap_or_default()
}

fn name(p: &Pod) -> &str {
    p.metadata.name.as_deref().unwrap_or_default()
}

/// Not terminating and not finished (upstream `IsPodActive`).
pub fn is_active(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none() && !matches!(phase(p), "Succeeded" | "Failed")
}

fn is_terminating(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_some() && !matches!(phase(p), "Succeeded" | "Failed")
}

fn ready_since(p: &Pod) -> Option<Option<Timestamp>> {
    let c = p.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == "Ready")?;
    (c.status == "True").then(|| c.last_transition_time.as_ref().map(|t| t.0))
}

pub fn is_ready(p: &Pod) -> bool {
    ready_since(p).is_some()
}

pub fn has_finalizer(p: &Pod) -> bool {
    p.metadata.finalizers.iter().flatten().any(|f| f == TRACKING_FINALIZER)
}

/// The completion index from the annotation, if valid.
pub fn completion_index(p: &Pod) -> Option<u32> {
    p.metadata.annotations.as_ref()?.get(COMPLETION_INDEX)?.parse::<u32>().ok()
}

fn annotation_count(p: &Pod, key: &str) -> u32 {
    p.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .and_then(|v| v.parse::<i64>().ok())
        .filter(|v| (0..=i64::from(i32::MAX)).contains(v))
        .map_or(0, |v| v as u32)
}

/// The controller reference of an object.
pub fn controller_of(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references.iter().flatten().find(|r| r.controller == Some(true))
}

/// The controller reference pointing at a Job.
pub fn controller_ref(job: &Job) -> OwnerReference {
    OwnerReference {
        api_version: "batch/v1".into(),
        kind: "Job".into(),
        name: job.metadata.name.clone().unwrap_or_default(),
        uid: job.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// Upstream `controller.ActivePods` order: the pods to remove first sort first (unscheduled,
/// pending before unknown before running, not ready, ready for a shorter time, more restarts,
/// newer).
type RemovalKey = (bool, u8, bool, Reverse<Option<Timestamp>>, Reverse<i32>, Reverse<Option<Timestamp>>);

fn removal_key(p: &Pod) -> RemovalKey {
    let scheduled = p.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_some_and(|n| !n.is_empty());
    let phase_rank = match phase(p) {
        "Pending" => 0,
        "Unknown" => 1,
        "Running" => 2,
        _ => 0,
    };
    let ready = ready_since(p);
    let restarts = p
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .map_or(0, |c| c.iter().map(|c| c.restart_count).max().unwrap_or(0));
    (
        scheduled,
        phase_rank,
        ready.is_some(),
        Reverse(ready.flatten()),
        Reverse(restarts),
        Reverse(p.metadata.creation_timestamp.as_ref().map(|t| t.0)),
    )
}

// ---------------------------------------------------------------------------------------------
// the Job
// ---------------------------------------------------------------------------------------------

fn condition<'a>(status: &'a JobStatus, type_: &str) -> Option<&'a JobCondition> {
    status.conditions.iter().flatten().find(|c| c.type_ == type_)
}

fn condition_true(status: &JobStatus, type_: &str) -> bool {
    condition(status, type_).is_some_and(|c| c.status == "True")
}

/// Whether a Job has a Complete or Failed condition that is True (upstream `IsJobFinished`).
pub fn is_finished(job: &Job) -> bool {
    job.status.as_ref().is_some_and(|s| condition_true(s, "Complete") || condition_true(s, "Failed"))
}

/// When a finished Job finished: the lastTransitionTime of its Complete or Failed condition.
pub fn finish_time(job: &Job) -> Option<Timestamp> {
    let status = job.status.as_ref()?;
    status
        .conditions
        .iter()
        .flatten()
        .find(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| t.0)
}

fn is_indexed(spec: &JobSpec) -> bool {
    spec.completion_mode.as_deref() == Some("Indexed")
}

/// Only failed pods are replaced (podReplacementPolicy Failed, which a podFailurePolicy implies).
fn only_replace_failed(spec: &JobSpec) -> bool {
    spec.pod_replacement_policy.as_deref() == Some("Failed") || spec.pod_failure_policy.is_some()
}

/// Whether a pod counts as failed: phase Failed, or (unless only failed pods are replaced)
/// deleted before it succeeded.
fn is_pod_failed(p: &Pod, spec: &JobSpec) -> bool {
    if phase(p) == "Failed" {
        return true;
    }
    !only_replace_failed(spec) && p.metadata.deletion_timestamp.is_some() && phase(p) != "Succeeded"
}

fn new_condition(type_: &str, status: &str, reason: &str, message: &str, now: Timestamp) -> JobCondition {
    JobCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()).filter(|r: &String| !r.is_empty()),
        message: Some(message.into()).filter(|m: &String| !m.is_empty()),
        last_probe_time: Some(Time(now)),
        last_transition_time: Some(Time(now)),
    }
}

/// Sets a condition's status, reason and message (a new one only when not False); whether the
/// list changed (upstream `ensureJobConditionStatus`).
fn ensure_condition(list: &mut Vec<JobCondition>, type_: &str, status: &str, reason: &str, message: &str, now: Timestamp) -> bool {
    if let Some(c) = list.iter_mut().find(|c| c.type_ == type_) {
        let same = c.status == status && c.reason.as_deref().unwrap_or_default() == reason && c.message.as_deref().unwrap_or_default() == message;
        if same {
            return false;
        }
        *c = new_condition(type_, status, reason, message, now);
        return true;
    }
    if status != "False" {
        list.push(new_condition(type_, status, reason, message, now));
        return true;
    }
    false
}

/// Zeros and empty lists as upstream's API server stores them, so statuses compare by meaning.
pub fn normalize_status(s: &JobStatus) -> JobStatus {
    let nz = |v: Option<i32>| v.filter(|n| *n != 0);
    let nonempty = |v: &Option<Vec<String>>| v.clone().filter(|l| !l.is_empty());
    let uncounted = s.uncounted_terminated_pods.as_ref();
    JobStatus {
        active: nz(s.active),
        succeeded: nz(s.succeeded),
        failed: nz(s.failed),
        completed_indexes: s.completed_indexes.clone().filter(|t| !t.is_empty()),
        conditions: s.conditions.clone().filter(|c| !c.is_empty()),
        uncounted_terminated_pods: Some(UncountedTerminatedPods {
            succeeded: uncounted.and_then(|u| nonempty(&u.succeeded)),
            failed: uncounted.and_then(|u| nonempty(&u.failed)),
        }),
        ..s.clone()
    }
}

/// A pass's view of the finish: the condition that ends the Job, once recorded.
#[derive(Clone, Debug)]
enum Finish {
    /// Failure decided; written as FailureTarget, then Failed.
    Failure { reason: String, message: String, target_recorded: bool },
    /// Success decided; written as SuccessCriteriaMet, then Complete.
    Success { reason: String, message: String },
}

const REASON_BACKOFF: &str = "BackoffLimitExceeded";
const REASON_DEADLINE: &str = "DeadlineExceeded";
const REASON_POLICY: &str = "PodFailurePolicy";
const REASON_MAX_FAILED_INDEXES: &str = "MaxFailedIndexesExceeded";
const REASON_FAILED_INDEXES: &str = "FailedIndexes";
const REASON_SUCCESS_POLICY: &str = "SuccessPolicy";
const REASON_COMPLETIONS: &str = "CompletionsReached";

fn failure(reason: &str, message: &str) -> Option<Finish> {
    Some(Finish::Failure { reason: reason.into(), message: message.into(), target_recorded: false })
}

fn to_u32(v: i64) -> u32 {
    u32::try_from(v.max(0)).unwrap_or(u32::MAX)
}

/// Plans one pass over a Job (upstream `syncJob`).
pub fn plan(job: &Job, obs: &Observed<'_>) -> JobPlan {
    let mut out = JobPlan { backoff: obs.backoff, ..JobPlan::default() };
    let spec = job.spec.clone().unwrap_or_default();
    let job_uid = job.metadata.uid.as_deref().unwrap_or_default();
    let ns = job.metadata.namespace.as_deref().unwrap_or_default();
    let in_ns = |p: &Pod| p.metadata.namespace.as_deref().unwrap_or_default() == ns;
    if let Some(m) = spec.managed_by.as_deref().filter(|m| *m != CONTROLLER_NAME) {
        out.waiting.push(format!("spec.managedBy is {m}: another controller manages this Job"));
        return out;
    }
    if is_finished(job) {
        out.waiting.push("the Job has finished: only the tracking finalizers of its pods are removed".into());
        // a finished Job's pods keep no finalizer (upstream cleans them up from the Job's update)
        out.remove_finalizers = obs
            .pods
            .iter()
            .filter(|p| in_ns(p))
            .filter(|p| controller_of(&p.metadata).is_some_and(|r| !job_uid.is_empty() && r.uid == job_uid) && has_finalizer(p))
            .map(|p| (name(p).to_string(), uid(p).to_string()))
            .collect();
        out.backoff = BackoffRecord::default();
        return out;
    }
    if spec.completion_mode.as_deref().is_some_and(|m| m != "NonIndexed" && m != "Indexed") {
        out.events.push(JobEvent {
            type_: "Warning",
            reason: "UnknownCompletionMode".into(),
            message: "Skipped Job sync because completion mode is unknown".into(),
        });
        return out;
    }
    let Some(selector) = spec.selector.as_ref().and_then(|s| LabelSelector::from_api(s).ok()) else {
        out.waiting.push("spec.selector cannot be parsed: the Job is left alone".into());
        return out;
    };
    let now = obs.now;
    let deleting = job.metadata.deletion_timestamp.is_some();
    let suspended = spec.suspend == Some(true);
    let indexed = is_indexed(&spec);
    let completions = spec.completions.map(|c| to_u32(i64::from(c)));
    let parallelism = to_u32(i64::from(spec.parallelism.unwrap_or(1)));
    let backoff_limit = i64::from(spec.backoff_limit.unwrap_or(6));
    let per_index = indexed && spec.backoff_limit_per_index.is_some();
    let per_index_limit = to_u32(i64::from(spec.backoff_limit_per_index.unwrap_or(0)));
    let valid_index = |p: &Pod| completion_index(p).filter(|ix| completions.is_some_and(|c| *ix < c));
    let policy = spec.pod_failure_policy.as_ref();
    let current = job.status.clone().unwrap_or_default();

    // claim the pods: owned and matching, plus orphans to adopt (they get the finalizer)
    let mut pods: Vec<Cow<'_, Pod>> = Vec::new();
    for &p in obs.pods.iter().filter(|p| in_ns(p)) {
        let labels = p.metadata.labels.clone().unwrap_or_default();
        let matches = !selector.is_empty() && selector.matches(&labels);
        match controller_of(&p.metadata) {
            Some(r) if !job_uid.is_empty() && r.uid == job_uid => {
                if matches {
                    pods.push(Cow::Borrowed(p));
                } else if !deleting {
                    out.release.push(name(p).to_string());
                }
            }
            Some(_) => {}
            None => {
                if matches && !deleting && p.metadata.deletion_timestamp.is_none() && !job_uid.is_empty() {
                    out.adopt.push(name(p).to_string());
                    let mut adopted = p.clone();
                    adopted.metadata.finalizers.get_or_insert_with(Vec::new).push(TRACKING_FINALIZER.into());
                    pods.push(Cow::Owned(adopted));
                }
            }
        }
    }
    let pods: Vec<&Pod> = pods.iter().map(|p| p.as_ref()).collect();

    let uncounted = current.uncounted_terminated_pods.clone().unwrap_or_default();
    let uncounted_succeeded: BTreeSet<&str> = uncounted.succeeded.iter().flatten().map(String::as_str).collect();
    let uncounted_failed: BTreeSet<&str> = uncounted.failed.iter().flatten().map(String::as_str).collect();
    let active_pods: Vec<&Pod> = pods.iter().copied().filter(|p| is_active(p)).collect();
    let mut ready = active_pods.iter().filter(|p| is_ready(p)).count();
    let mut terminating = pods.iter().filter(|p| is_terminating(p)).count();
    let mut active = active_pods.len();

    // pods that finished since the last pass
    let countable = |p: &Pod| has_finalizer(p) && !obs.expected_removals.contains(uid(p)) && (!indexed || valid_index(p).is_some());
    let new_succeeded: Vec<&Pod> =
        pods.iter().copied().filter(|p| countable(p) && !uncounted_succeeded.contains(uid(p)) && phase(p) == "Succeeded").collect();
    let new_failed: Vec<&Pod> =
        pods.iter().copied().filter(|p| countable(p) && !uncounted_failed.contains(uid(p)) && is_pod_failed(p, &spec)).collect();
    let mut succeeded = i64::from(current.succeeded.unwrap_or(0)) + new_succeeded.len() as i64 + uncounted_succeeded.len() as i64;
    let counted_new_failed = new_failed.iter().filter(|p| match_policy(policy, p).counts).count();
    let failed = i64::from(current.failed.unwrap_or(0)) + counted_new_failed as i64 + uncounted_failed.len() as i64;

    let mut status = current.clone();
    if status.start_time.is_none() && !suspended {
        status.start_time = Some(Time(now));
    }
    out.backoff = obs.backoff.updated(&new_succeeded, &new_failed);
    let mut conditions = status.conditions.clone().unwrap_or_default();

    // has the Job reached its end?
    let mut finish: Option<Finish> = condition(&current, "SuccessCriteriaMet")
        .filter(|c| c.status == "True")
        .map(|c| Finish::Success { reason: c.reason.clone().unwrap_or_default(), message: c.message.clone().unwrap_or_default() });
    if finish.is_none() {
        if let Some(t) = condition(&current, "FailureTarget").filter(|c| c.status == "True") {
            finish = Some(Finish::Failure {
                reason: t.reason.clone().unwrap_or_default(),
                message: t.message.clone().unwrap_or_default(),
                target_recorded: true,
            });
        } else if let Some(msg) = pods.iter().filter(|p| is_pod_failed(p, &spec)).find_map(|p| match_policy(policy, p).fail_job) {
            finish = failure(REASON_POLICY, &msg);
        }
    }
    let start = status.start_time.as_ref().map(|t| t.0);
    if finish.is_none() {
        if failed > backoff_limit || past_backoff_limit_on_failure(&spec, &pods, backoff_limit) {
            finish = failure(REASON_BACKOFF, "Job has reached the specified backoff limit");
        } else if let (Some(ads), Some(start), false) = (spec.active_deadline_seconds, start, suspended) {
            let deadline = Duration::from_secs(to_u32(ads).into());
            let elapsed = Duration::try_from(now.duration_since(start)).unwrap_or(Duration::ZERO);
            if elapsed >= deadline {
                finish = failure(REASON_DEADLINE, "Job was active longer than specified deadline");
            } else {
                requeue(&mut out, deadline - elapsed);
                out.waiting.push(format!(
                    "the Job fails with DeadlineExceeded in {} unless it finishes (activeDeadlineSeconds {ads})",
                    crate::controllers::explain::go_duration(deadline - elapsed)
                ));
            }
        }
    }

    let mut prev_succeeded_ix = Indexes::default();
    let mut succeeded_ix = Indexes::default();
    let mut failed_ix: Option<Indexes> = None;
    let mut delayed: BTreeMap<u32, &Pod> = BTreeMap::new();
    if let (true, Some(c)) = (indexed, completions) {
        prev_succeeded_ix = Indexes::parse(current.completed_indexes.as_deref().unwrap_or_default(), c);
        succeeded_ix = prev_succeeded_ix
            .with(pods.iter().filter(|p| phase(p) == "Succeeded" && has_finalizer(p)).filter_map(|p| valid_index(p)));
        succeeded = succeeded_ix.total() as i64;
        if per_index {
            let is_index_failed = |p: &Pod| {
                if !is_pod_failed(p, &spec) {
                    return false;
                }
                let m = match_policy(policy, p);
                if m.action == Some(Action::FailIndex) {
                    return true;
                }
                m.counts && annotation_count(p, INDEX_FAILURE_COUNT) >= per_index_limit
            };
            let f = Indexes::parse(current.failed_indexes.as_deref().unwrap_or_default(), c)
                .with(pods.iter().filter(|p| has_finalizer(p) && is_index_failed(p)).filter_map(|p| valid_index(p)));
            if finish.is_none() {
                if spec.max_failed_indexes.is_some_and(|m| f.total() as i64 > i64::from(m)) {
                    finish = failure(REASON_MAX_FAILED_INDEXES, "Job has exceeded the specified maximal number of failed indexes");
                } else if f.total() > 0 && f.total() + succeeded_ix.total() >= c as usize {
                    finish = failure(REASON_FAILED_INDEXES, "Job has failed indexes");
                }
            }
            // the last failed pod of an index waiting for its replacement keeps its finalizer,
            // so the replacement can carry the index's failure count
            let active_ix: BTreeSet<u32> = active_pods.iter().filter_map(|p| completion_index(p)).collect();
            for &p in pods.iter().filter(|p| countable(p) && is_pod_failed(p, &spec)) {
                let Some(ix) = valid_index(p) else { continue };
                if succeeded_ix.has(ix) || f.has(ix) || active_ix.contains(&ix) {
                    continue;
                }
                let later = |old: &Pod| {
                    absolute_failures(old) <= absolute_failures(p) && finished_time(p) >= finished_time(old)
                };
                if delayed.get(&ix).is_none_or(|old| later(old)) {
                    delayed.insert(ix, p);
                }
            }
            failed_ix = Some(f);
        }
        if finish.is_none() {
            if let Some(msg) = match_success_policy(&spec, c, &succeeded_ix) {
                finish = Some(Finish::Success { reason: REASON_SUCCESS_POLICY.into(), message: msg });
            }
        }
    }

    if finish.is_some() {
        // the end is decided: remove the active pods, keeping their finalizers so they count
        for p in &active_pods {
            out.delete.push(PodDeletion { name: name(p).into(), remove_finalizer: false, ready: is_ready(p) });
        }
        if !obs.expectations_satisfied {
            finish = None;
        }
        if let Some(Finish::Success { reason, .. } | Finish::Failure { reason, .. }) = &finish {
            if terminating + active > 0 {
                out.waiting.push(format!("the Job ends ({reason}) once its {} remaining pods are gone", terminating + active));
            }
        }
        terminating += active;
        active = 0;
        ready = 0;
    } else {
        let mut managed = false;
        if obs.expectations_satisfied && !deleting {
            managed = true;
            let m = Manage {
                job,
                spec: &spec,
                now,
                suspended,
                indexed,
                per_index,
                completions,
                parallelism,
                succeeded,
                succeeded_ix: &succeeded_ix,
                failed_ix: failed_ix.as_ref(),
                pods: &pods,
                active_pods: &active_pods,
                delayed: &delayed,
                backoff: out.backoff,
            };
            let r = m.run(&mut out, terminating);
            active = active + r.created - r.deleted;
            terminating += r.deleted;
            ready -= r.deleted_ready;
        }
        let complete = match completions {
            None => succeeded > 0 && active == 0,
            Some(c) => succeeded >= i64::from(c) && active == 0,
        };
        if complete {
            finish = Some(Finish::Success { reason: REASON_COMPLETIONS.into(), message: "Reached expected number of succeeded pods".into() });
        } else if managed {
            if suspended {
                // a suspended Job has no start time: resuming starts activeDeadlineSeconds
                // afresh (and the API server refuses to move the start time of a running Job)
                status.start_time = None;
                if ensure_condition(&mut conditions, "Suspended", "True", "JobSuspended", "Job suspended", now) {
                    out.events.push(JobEvent { type_: "Normal", reason: "Suspended".into(), message: "Job suspended".into() });
                }
            } else if ensure_condition(&mut conditions, "Suspended", "False", "JobResumed", "Job resumed", now) {
                out.events.push(JobEvent { type_: "Normal", reason: "Resumed".into(), message: "Job resumed".into() });
                // activeDeadlineSeconds counts continuous activity
                status.start_time = Some(Time(now));
            }
        }
    }

    // tracking: finished pods into uncountedTerminatedPods, then their finalizers go
    status.active = Some(active as i32);
    status.ready = Some(ready as i32);
    status.terminating = Some(terminating as i32);
    let with_finalizer: BTreeSet<&str> =
        pods.iter().filter(|p| has_finalizer(p) && !obs.expected_removals.contains(uid(p))).map(|p| uid(p)).collect();
    let mut unc_succeeded: Vec<String> = uncounted.succeeded.clone().unwrap_or_default();
    let mut unc_failed: Vec<String> = uncounted.failed.clone().unwrap_or_default();
    let mut succeeded_count = i64::from(status.succeeded.unwrap_or(0));
    let mut failed_count = i64::from(status.failed.unwrap_or(0));
    move_counted(&mut unc_succeeded, &mut succeeded_count, &with_finalizer);
    move_counted(&mut unc_failed, &mut failed_count, &with_finalizer);
    let mut ordered: Vec<&Pod> = pods.clone();
    if indexed {
        ordered.sort_by_key(|p| completion_index(p).map_or(-1, i64::from));
    }
    let finish_is_failure = matches!(finish, Some(Finish::Failure { .. }));
    let mut new_succeeded_ix: Vec<u32> = Vec::new();
    let mut reached_max = false;
    for &p in &ordered {
        if !has_finalizer(p) || obs.expected_removals.contains(uid(p)) {
            continue;
        }
        let considered_failed = is_pod_failed(p, &spec);
        let waits_for_replacement = valid_index(p).is_some_and(|ix| delayed.get(&ix).is_some_and(|d| uid(d) == uid(p)));
        let can_remove = deleting || finish.is_some() || phase(p) == "Succeeded" || (considered_failed && !waits_for_replacement);
        if !can_remove {
            continue;
        }
        out.remove_finalizers.push((name(p).to_string(), uid(p).to_string()));
        let u = uid(p).to_string();
        if phase(p) == "Succeeded" && !uncounted_failed.contains(u.as_str()) {
            if indexed {
                if let Some(ix) = valid_index(p).filter(|ix| !prev_succeeded_ix.has(*ix)) {
                    new_succeeded_ix.push(ix);
                }
            } else if !unc_succeeded.contains(&u) {
                unc_succeeded.push(u);
            }
        } else if (considered_failed || finish_is_failure)
            && !unc_failed.contains(&u)
            && (!indexed || valid_index(p).is_some())
            && match_policy(policy, p).counts
        {
            unc_failed.push(u);
        }
        if new_succeeded_ix.len() + unc_succeeded.len() + unc_failed.len() >= MAX_UNCOUNTED_PODS {
            reached_max = true;
            break;
        }
    }
    if indexed {
        let all = succeeded_ix.with(new_succeeded_ix);
        succeeded_count = all.total() as i64;
        status.completed_indexes = Some(all.to_string());
        if let Some(f) = &failed_ix {
            status.failed_indexes = Some(f.to_string());
        }
    }
    // interim conditions, recorded before any finalizer goes
    let final_condition = match &finish {
        Some(Finish::Failure { reason, message, target_recorded }) => {
            if !target_recorded {
                conditions.push(new_condition("FailureTarget", "True", reason, message, now));
            }
            Some(("Failed", reason.clone(), message.clone()))
        }
        Some(Finish::Success { reason, message }) => {
            if !conditions.iter().any(|c| c.type_ == "SuccessCriteriaMet" && c.status == "True") {
                conditions.push(new_condition("SuccessCriteriaMet", "True", reason, message, now));
            }
            Some(("Complete", reason.clone(), message.clone()))
        }
        None => None,
    };
    status.conditions = Some(conditions);
    status.succeeded = Some(succeeded_count as i32);
    status.failed = Some(failed_count as i32);
    status.uncounted_terminated_pods =
        Some(UncountedTerminatedPods { succeeded: Some(unc_succeeded.clone()), failed: Some(unc_failed.clone()) });
    let interim = normalize_status(&status);

    // the status once the finalizers are gone: those pods move into the counters
    let mut remaining: BTreeSet<&str> = with_finalizer.clone();
    for (_, u) in &out.remove_finalizers {
        remaining.remove(u.as_str());
    }
    move_counted(&mut unc_succeeded, &mut succeeded_count, &remaining);
    move_counted(&mut unc_failed, &mut failed_count, &remaining);
    status.succeeded = Some(succeeded_count as i32);
    status.failed = Some(failed_count as i32);
    status.uncounted_terminated_pods = Some(UncountedTerminatedPods { succeeded: Some(unc_succeeded.clone()), failed: Some(unc_failed.clone()) });
    if let Some((type_, reason, message)) = final_condition {
        if !reached_max && unc_succeeded.is_empty() && unc_failed.is_empty() && terminating == 0 {
            let list = status.conditions.get_or_insert_with(Vec::new);
            ensure_condition(list, type_, "True", &reason, &message, now);
            if type_ == "Complete" {
                status.completion_time = Some(Time(now));
                if completions.is_some_and(|c| succeeded_count > i64::from(c)) {
                    out.events.push(JobEvent {
                        type_: "Warning",
                        reason: "TooManySucceededPods".into(),
                        message: "Too many succeeded pods running after completion count reached".into(),
                    });
                }
                out.events.push(JobEvent { type_: "Normal", reason: "Completed".into(), message: "Job completed".into() });
            } else {
                out.events.push(JobEvent { type_: "Warning", reason, message });
            }
        }
    }
    let final_status = normalize_status(&status);
    let current_n = normalize_status(&current);
    if !out.remove_finalizers.is_empty() && interim != current_n {
        out.interim_status = Some(interim);
    }
    if final_status != *out.interim_status.as_ref().unwrap_or(&current_n) {
        out.status = Some(final_status);
    }
    out
}

/// Drops from an uncounted list the uids that no longer have a finalizer, adding them to the
/// counter (upstream `cleanUncountedPodsWithoutFinalizers`).
fn move_counted(list: &mut Vec<String>, counter: &mut i64, with_finalizer: &BTreeSet<&str>) {
    let before = list.len();
    list.retain(|u| with_finalizer.contains(u.as_str()));
    *counter += (before - list.len()) as i64;
}

fn absolute_failures(p: &Pod) -> u32 {
    annotation_count(p, INDEX_FAILURE_COUNT) + annotation_count(p, INDEX_IGNORED_FAILURE_COUNT)
}

fn requeue(out: &mut JobPlan, after: Duration) {
    let after = after.max(SYNC_BATCH_PERIOD);
    out.requeue_after = Some(out.requeue_after.map_or(after, |d| d.min(after)));
}

/// With restartPolicy OnFailure, the container restarts of running and pending pods count
/// against backoffLimit (upstream `pastBackoffLimitOnFailure`).
fn past_backoff_limit_on_failure(spec: &JobSpec, pods: &[&Pod], limit: i64) -> bool {
    if spec.template.spec.as_ref().and_then(|s| s.restart_policy.as_deref()) != Some("OnFailure") {
        return false;
    }
    let restarts: i64 = pods
        .iter()
        .filter(|p| matches!(phase(p), "Running" | "Pending"))
        .filter_map(|p| p.status.as_ref())
        .flat_map(|s| s.init_container_statuses.iter().flatten().chain(s.container_statuses.iter().flatten()))
        .map(|c| i64::from(c.restart_count))
        .sum();
    if limit == 0 {
        restarts > 0
    } else {
        restarts >= limit
    }
}

/// The message of the first successPolicy rule the succeeded indexes meet.
fn match_success_policy(spec: &JobSpec, completions: u32, succeeded: &Indexes) -> Option<String> {
    let policy = spec.success_policy.as_ref()?;
    if succeeded.is_empty() {
        return None;
    }
    for (i, rule) in policy.rules.iter().enumerate() {
        let count = rule.succeeded_count.map(i64::from);
        let met = match &rule.succeeded_indexes {
            Some(text) => {
                let required = Indexes::parse(text, completions);
                if required.is_empty() {
                    continue;
                }
                let contains = required.overlap(succeeded) as i64;
                contains == required.total() as i64 || count.is_some_and(|n| contains >= n)
            }
            None => count.is_some_and(|n| succeeded.total() as i64 >= n),
        };
        if met {
            return Some(format!("Matched rules at index {i}"));
        }
    }
    None
}

struct Manage<'a> {
    job: &'a Job,
    spec: &'a JobSpec,
    now: Timestamp,
    suspended: bool,
    indexed: bool,
    per_index: bool,
    completions: Option<u32>,
    parallelism: u32,
    succeeded: i64,
    succeeded_ix: &'a Indexes,
    failed_ix: Option<&'a Indexes>,
    pods: &'a [&'a Pod],
    active_pods: &'a [&'a Pod],
    delayed: &'a BTreeMap<u32, &'a Pod>,
    backoff: BackoffRecord,
}

#[derive(Default)]
struct Managed {
    created: usize,
    deleted: usize,
    deleted_ready: usize,
}

impl Manage<'_> {
    /// Upstream `manageJob`: suspend deletes every active pod; otherwise too many pods are
    /// deleted (duplicate and out-of-range indexes first), or missing ones created once the
    /// back-off allows.
    fn run(&self, out: &mut JobPlan, terminating: usize) -> Managed {
        let active = self.active_pods.len();
        if self.suspended {
            out.waiting.push("the Job is suspended (spec.suspend): no pods run until it is resumed".into());
            return self.delete(out, self.for_removal(active));
        }
        let want: i64 = match self.completions {
            None if self.succeeded > 0 => active as i64,
            None => i64::from(self.parallelism),
            Some(c) => (i64::from(c) - self.succeeded).min(i64::from(self.parallelism)).max(0),
        };
        let rm_at_least = (active as i64 - want).max(0) as usize;
        let mut rm = self.for_removal(rm_at_least);
        rm.truncate(MAX_POD_CREATE_DELETE_PER_SYNC);
        if !rm.is_empty() {
            return self.delete(out, rm);
        }
        let waiting = if only_replace_failed(self.spec) { terminating } else { 0 };
        let diff = want - waiting as i64 - active as i64;
        if waiting > 0 && want > active as i64 {
            out.waiting.push(format!(
                "{waiting} terminating pods are replaced once they are gone (podReplacementPolicy Failed)"
            ));
        }
        if diff <= 0 {
            if let Some(c) = self.completions {
                let left = i64::from(c) - self.succeeded;
                if left > active as i64 && active as i64 >= i64::from(self.parallelism) {
                    out.waiting.push(format!(
                        "{active} pods run, as many as parallelism allows; {left} completions still to go"
                    ));
                }
            }
            return Managed::default();
        }
        if !self.per_index {
            let left = self.backoff.remaining(self.now);
            if !left.is_zero() {
                requeue(out, left);
                out.waiting.push(format!(
                    "new pods wait for the failure back-off: {} left",
                    crate::controllers::explain::go_duration(left)
                ));
                return Managed::default();
            }
        }
        let diff = (diff as usize).min(MAX_POD_CREATE_DELETE_PER_SYNC);
        let indexes: Vec<Option<u32>> = match (self.indexed, self.completions) {
            (true, Some(c)) => {
                let mut busy = self.succeeded_ix.with(self.active_pods.iter().filter_map(|p| completion_index(p)));
                if only_replace_failed(self.spec) {
                    busy = busy.with(self.pods.iter().filter(|p| is_terminating(p)).filter_map(|p| completion_index(p)));
                }
                if let Some(f) = self.failed_ix {
                    busy = busy.union(f);
                }
                let mut ix = busy.first_missing(diff, c);
                if self.per_index {
                    let mut min_wait: Option<Duration> = None;
                    ix.retain(|i| {
                        let wait = self.delayed.get(i).map_or(Duration::ZERO, |p| {
                            remaining_for(absolute_failures(p) + 1, finished_time(p), self.now)
                        });
                        if !wait.is_zero() {
                            min_wait = Some(min_wait.map_or(wait, |m| m.min(wait)));
                            out.waiting.push(format!(
                                "index {i} waits for its failure back-off: {} left",
                                crate::controllers::explain::go_duration(wait)
                            ));
                        }
                        wait.is_zero()
                    });
                    if ix.is_empty() {
                        if let Some(w) = min_wait {
                            requeue(out, w);
                        }
                        return Managed::default();
                    }
                }
                ix.into_iter().map(Some).collect()
            }
            _ => vec![None; diff],
        };
        for ix in &indexes {
            out.create.push(new_pod(self.job, *ix, ix.and_then(|i| self.delayed.get(&i).copied()), self.per_index));
        }
        Managed { created: indexes.len(), ..Managed::default() }
    }

    /// Upstream `activePodsForRemoval`: for Indexed Jobs, pods without a valid index and all but
    /// one pod per index, then the least advanced pods up to `at_least`.
    fn for_removal(&self, at_least: usize) -> Vec<&Pod> {
        let mut rm: Vec<&Pod> = Vec::new();
        let mut left: Vec<&Pod> = Vec::new();
        if let (true, Some(c)) = (self.indexed, self.completions) {
            let mut by_index: BTreeMap<u32, Vec<&Pod>> = BTreeMap::new();
            for &p in self.active_pods {
                match completion_index(p).filter(|ix| *ix < c) {
                    Some(ix) => by_index.entry(ix).or_default().push(p),
                    None => rm.push(p),
                }
            }
            for (_, mut same) in by_index {
                same.sort_by_key(|p| removal_key(p));
                let keep = same.pop();
                rm.extend(same);
                left.extend(keep);
            }
        } else {
            left = self.active_pods.to_vec();
        }
        if rm.len() < at_least {
            left.sort_by_key(|p| removal_key(p));
            let more = (at_least - rm.len()).min(left.len());
            rm.extend(left.into_iter().take(more));
        }
        rm
    }

    fn delete(&self, out: &mut JobPlan, pods: Vec<&Pod>) -> Managed {
        let mut m = Managed::default();
        for p in pods {
            let ready = is_ready(p);
            out.delete.push(PodDeletion { name: name(p).into(), remove_finalizer: true, ready });
            m.deleted += 1;
            m.deleted_ready += usize::from(ready);
        }
        m
    }
}

/// A pod for the Job (upstream's pod template handling in `manageJob`): the template with the
/// tracking finalizer and a controller reference; for Indexed Jobs the index as annotation,
/// label, `JOB_COMPLETION_INDEX` and hostname `<job>-<index>`, generateName `<job>-<index>-`,
/// and with backoffLimitPerIndex the failure counts of the pod it replaces.
pub fn new_pod(job: &Job, index: Option<u32>, replaces: Option<&Pod>, per_index: bool) -> Pod {
    let job_name = job.metadata.name.clone().unwrap_or_default();
    let spec = job.spec.clone().unwrap_or_default();
    let template = spec.template.clone();
    let tmeta = template.metadata.unwrap_or_default();
    let mut pod_spec = template.spec.unwrap_or_default();
    let mut labels = tmeta.labels.unwrap_or_default();
    let mut annotations = tmeta.annotations.unwrap_or_default();
    let mut finalizers = tmeta.finalizers.unwrap_or_default();
    if !finalizers.iter().any(|f| f == TRACKING_FINALIZER) {
        finalizers.push(TRACKING_FINALIZER.into());
    }
    let mut generate_name = format!("{job_name}-");
    if is_indexed(&spec) {
        for c in pod_spec.init_containers.iter_mut().flatten().chain(pod_spec.containers.iter_mut()) {
            add_index_env(c);
        }
    }
    if let Some(ix) = index {
        annotations.insert(COMPLETION_INDEX.into(), ix.to_string());
        labels.insert(COMPLETION_INDEX.into(), ix.to_string());
        pod_spec.hostname = Some(format!("{job_name}-{ix}"));
        let suffix = format!("-{ix}-");
        let mut prefix = format!("{job_name}{suffix}");
        if prefix.len() > MAX_GENERATED_NAME_LENGTH {
            let mut cut = MAX_GENERATED_NAME_LENGTH - suffix.len();
            while !job_name.is_char_boundary(cut) {
                cut -= 1;
            }
            prefix = format!("{}{suffix}", &job_name[..cut]);
        }
        generate_name = prefix;
        if per_index {
            let (mut failures, mut ignored) = (0, 0);
            if let Some(prev) = replaces {
                failures = annotation_count(prev, INDEX_FAILURE_COUNT);
                ignored = annotation_count(prev, INDEX_IGNORED_FAILURE_COUNT);
                if match_policy(spec.pod_failure_policy.as_ref(), prev).counts {
                    failures += 1;
                } else {
                    ignored += 1;
                }
            }
            annotations.insert(INDEX_FAILURE_COUNT.into(), failures.to_string());
            if ignored > 0 {
                annotations.insert(INDEX_IGNORED_FAILURE_COUNT.into(), ignored.to_string());
            }
        }
    }
    Pod {
        metadata: ObjectMeta {
            generate_name: Some(generate_name),
            namespace: job.metadata.namespace.clone(),
            labels: Some(labels).filter(|l| !l.is_empty()),
            annotations: Some(annotations).filter(|a| !a.is_empty()),
            finalizers: Some(finalizers),
            owner_references: Some(vec![controller_ref(job)]),
            ..ObjectMeta::default()
        },
        spec: Some(pod_spec),
        status: None,
    }
}

fn add_index_env(c: &mut Container) {
    let env = c.env.get_or_insert_with(Vec::new);
    if env.iter().any(|e| e.name == COMPLETION_INDEX_ENV) {
        return;
    }
    env.push(EnvVar {
        name: COMPLETION_INDEX_ENV.into(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector { api_version: None, field_path: format!("metadata.labels['{COMPLETION_INDEX}']") }),
            ..EnvVarSource::default()
        }),
    });
}

/// Whether an orphaned pod's tracking finalizer should go (upstream `syncOrphanPod`): it has
/// the finalizer and no controller, or a Job controller that is gone (`owner` None or another
/// uid) or finished; pods of other controllers and of Jobs managed elsewhere are left alone.
pub fn orphan_finalizer_removable(pod: &Pod, owner: Option<&Job>) -> bool {
    if !has_finalizer(pod) {
        return false;
    }
    let Some(r) = controller_of(&pod.metadata) else { return true };
    if r.kind != "Job" || r.api_version != "batch/v1" {
        return false;
    }
    let Some(job) = owner.filter(|j| j.metadata.uid.as_deref() == Some(r.uid.as_str())) else { return true };
    let external = job.spec.as_ref().and_then(|s| s.managed_by.as_deref()).is_some_and(|m| m != CONTROLLER_NAME);
    !external && is_finished(job)
}
