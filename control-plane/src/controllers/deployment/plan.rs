//! The Deployment planner: from a Deployment, the ReplicaSets it controls and their pods to the
//! ReplicaSet creations, updates and deletions and the status to write (upstream
//! `pkg/controller/deployment`: `syncDeployment`, `rolloutRolling`, `rolloutRecreate`, `sync`,
//! `scale`, `cleanupDeployment`, `syncRolloutStatus`).
//!
//! Pure: no I/O, no clock. The executor performs [`plan`]'s actions in order and stops at the
//! first failure (the Deployment is then requeued); see [`Action`] for each one.
//!
//! Differences from upstream, all deliberate:
//! - upstream writes some changes in several API calls within one sync (new ReplicaSet
//!   annotations, then the Deployment's revision annotation on a later sync); here one plan
//!   carries them all, in the order upstream would make them;
//! - when scaling old ReplicaSets down, an old ReplicaSet counts at most `spec.replicas`
//!   available pods (its status can lag just after a scale-down, which upstream would trust);
//! - unset fields take the API defaults (replicas 1, RollingUpdate with 25%/25%,
//!   revisionHistoryLimit 10, progressDeadlineSeconds 600), in case the server did not default
//!   them;
//! - templates are compared (ignoring the `pod-template-hash` label) on their JSON form where
//!   absent, null and empty lists, and absent and empty maps (labels, annotations, selectors,
//!   resource lists) and non-pointer structs (`resources`, `metadata`) are the same, like
//!   upstream's semantic equality.
//!
//! Proportional scaling (the Deployment's replicas change while a rollout is in progress) follows
//! upstream `scale` with the `max-replicas` annotations.
//!
//! Besides the four actions of the brief, [`Action`] has `UpdateDeploymentAnnotations` (the
//! revision annotation of the Deployment), `Event` (upstream's `ScalingReplicaSet` events) and
//! `RequeueAfter` (upstream `requeueStuckDeployment`, to notice a missed progress deadline).

use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentCondition, DeploymentStatus, ReplicaSet, ReplicaSetSpec,
};
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::Value;

use crate::controllers::replicaset::plan::controller_of;

/// The revision of a ReplicaSet, and of its Deployment (the newest ReplicaSet's).
pub const REVISION_ANNOTATION: &str = "deployment.kubernetes.io/revision";
/// Earlier revisions of a ReplicaSet that was rolled back to, comma separated.
pub const REVISION_HISTORY_ANNOTATION: &str = "deployment.kubernetes.io/revision-history";
/// The Deployment's replicas when the ReplicaSet was last scaled.
pub const DESIRED_REPLICAS_ANNOTATION: &str = "deployment.kubernetes.io/desired-replicas";
/// The Deployment's replicas plus maxSurge when the ReplicaSet was last scaled.
pub const MAX_REPLICAS_ANNOTATION: &str = "deployment.kubernetes.io/max-replicas";
/// The label that tells the ReplicaSets (and pods) of one Deployment apart.
pub const POD_TEMPLATE_HASH_LABEL: &str = "pod-template-hash";

/// Upstream `maxRevHistoryLengthInChars`.
const MAX_REV_HISTORY_LENGTH: usize = 2000;

/// Annotations of the Deployment that are not copied to its new ReplicaSet.
const ANNOTATIONS_TO_SKIP: [&str; 6] = [
    "kubectl.kubernetes.io/last-applied-configuration",
    REVISION_ANNOTATION,
    REVISION_HISTORY_ANNOTATION,
    DESIRED_REPLICAS_ANNOTATION,
    MAX_REPLICAS_ANNOTATION,
    "deprecated.deployment.rollback.to",
];

/// Condition types and reasons, as upstream.
pub mod reasons {
    /// Condition type: enough pods are available.
    pub const AVAILABLE: &str = "Available";
    /// Condition type: the rollout is progressing (or done, or stuck).
    pub const PROGRESSING: &str = "Progressing";
    /// Condition type copied from a ReplicaSet that fails to create or delete pods.
    pub const REPLICA_FAILURE: &str = "ReplicaFailure";
    /// Available True.
    pub const MINIMUM_REPLICAS_AVAILABLE: &str = "MinimumReplicasAvailable";
    /// Available False.
    pub const MINIMUM_REPLICAS_UNAVAILABLE: &str = "MinimumReplicasUnavailable";
    /// Progressing True: the new ReplicaSet was just created.
    pub const NEW_RS_CREATED: &str = "NewReplicaSetCreated";
    /// Progressing True: a new ReplicaSet was found without a prior Progressing condition.
    pub const FOUND_NEW_RS: &str = "FoundNewReplicaSet";
    /// Progressing True: pods were scaled up or down, or became ready or available.
    pub const RS_UPDATED: &str = "ReplicaSetUpdated";
    /// Progressing True: the rollout is complete.
    pub const NEW_RS_AVAILABLE: &str = "NewReplicaSetAvailable";
    /// Progressing False: no progress for progressDeadlineSeconds.
    pub const TIMED_OUT: &str = "ProgressDeadlineExceeded";
    /// Progressing False: the new ReplicaSet could not be created.
    pub const FAILED_RS_CREATE: &str = "ReplicaSetCreateError";
    /// Progressing Unknown: the Deployment is paused.
    pub const PAUSED: &str = "DeploymentPaused";
    /// Progressing Unknown: the Deployment was resumed.
    pub const RESUMED: &str = "DeploymentResumed";
}
use reasons::*;

/// One step for the executor. Perform them in order; stop at the first failure.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Create this ReplicaSet (name `"<deploy>-<hash>"`, labels and template with the
    /// `pod-template-hash` label, selector with it in matchLabels, controller ownerReference to
    /// the Deployment, revision/desired-replicas/max-replicas annotations). On AlreadyExists:
    /// if the existing ReplicaSet is controlled by this Deployment (uid) and
    /// [`equal_ignore_hash`] to its template, it is the new one (a stale cache), just requeue;
    /// otherwise write [`with_collision_count_bumped`]. On another error write
    /// [`with_failed_create_condition`].
    CreateReplicaSet(ReplicaSet),
    /// Replace this ReplicaSet (PUT; the observed object with replicas and/or annotations or
    /// minReadySeconds changed, so the resourceVersion guards against stale writes).
    UpdateReplicaSet(ReplicaSet),
    /// Delete this old ReplicaSet (history beyond revisionHistoryLimit, 0 replicas).
    DeleteReplicaSet {
        /// The ReplicaSet's name.
        name: String,
    },
    /// Set the Deployment's `metadata.annotations` to this map (today only the revision
    /// annotation changes; upstream writes it through the status subresource, a merge patch of
    /// the metadata does as well).
    UpdateDeploymentAnnotations(BTreeMap<String, String>),
    /// Write this status (only planned when it differs from the observed one).
    UpdateStatus(DeploymentStatus),
    /// Record an event on the Deployment (`ScalingReplicaSet` as upstream); may be ignored.
    Event {
        /// "Normal" or "Warning".
        type_: String,
        /// The event reason.
        reason: String,
        /// The event message.
        message: String,
    },
    /// Sync this Deployment again after this long to check the progress deadline.
    RequeueAfter(Duration),
}

// ---------------------------------------------------------------------------
// hashing and template comparison
// ---------------------------------------------------------------------------

/// Upstream `rand.SafeEncodeString` alphabet (no vowels, no confusable characters).
const SAFE_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// Keys whose value is a Go map or a non-pointer struct: absent and empty are the same there.
const EMPTY_IS_ABSENT: [&str; 10] = [
    "labels",
    "annotations",
    "nodeSelector",
    "matchLabels",
    "limits",
    "requests",
    "overhead",
    "volumeAttributes",
    "resources",
    "metadata",
];

/// The JSON form of a value with nulls, empty lists and empty Go maps removed, keys sorted.
fn normalize(v: Value, key: Option<&str>) -> Option<Value> {
    match v {
        Value::Null => None,
        Value::Array(items) => {
            let items: Vec<Value> = items
                .into_iter()
                .map(|i| normalize(i, None).unwrap_or(Value::Null))
                .collect();
            (!items.is_empty()).then_some(Value::Array(items))
        }
        Value::Object(map) => {
            let mut entries: Vec<(String, Value)> = map
                .into_iter()
                .filter_map(|(k, v)| normalize(v, Some(&k)).map(|v| (k, v)))
                .collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            if entries.is_empty() && key.is_some_and(|k| EMPTY_IS_ABSENT.contains(&k)) {
                return None;
            }
            Some(Value::Object(entries.into_iter().collect()))
        }
        other => Some(other),
    }
}

fn canonical(template: &PodTemplateSpec) -> Value {
    let v = serde_json::to_value(template).unwrap_or(Value::Null);
    normalize(v, None).unwrap_or(Value::Null)
}

fn without_hash(template: &PodTemplateSpec) -> PodTemplateSpec {
    let mut t = template.clone();
    if let Some(labels) = t.metadata.as_mut().and_then(|m| m.labels.as_mut()) {
        labels.remove(POD_TEMPLATE_HASH_LABEL);
    }
    t
}

/// Whether two pod templates are equal ignoring the `pod-template-hash` label (upstream
/// `EqualIgnoreHash`).
///
/// Fields set to `false` or `0` count as absent here: Go clients sending protobuf (kubectl
/// create) transmit non-pointer zero fields such as `stdin: false` or `hostIPC: false`, which
/// the same template sent as JSON omits, and Go's DeepEqual sees no difference between them.
pub fn equal_ignore_hash(a: &PodTemplateSpec, b: &PodTemplateSpec) -> bool {
    drop_zeros(canonical(&without_hash(a))) == drop_zeros(canonical(&without_hash(b)))
}

fn drop_zeros(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .filter(|(_, v)| !matches!(v, Value::Bool(false)) && v.as_f64() != Some(0.0))
                .map(|(k, v)| (k, drop_zeros(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.into_iter().map(drop_zeros).collect()),
        other => other,
    }
}

/// A stable hash of a pod template: FNV-1a 32 over its canonical JSON (keys sorted, nulls and
/// empty lists dropped), then the collision count as 4 little-endian bytes when set, rendered
/// like upstream's `ComputeHash` (the decimal value through `SafeEncodeString`, e.g.
/// `"7d9b8c6f5"`).
pub fn pod_template_hash(template: &PodTemplateSpec, collision_count: Option<i32>) -> String {
    let text = canonical(template).to_string();
    let mut h: u32 = 0x811c_9dc5;
    let mut feed = |bytes: &[u8]| {
        for b in bytes {
            h ^= u32::from(*b);
            h = h.wrapping_mul(0x0100_0193);
        }
    };
    feed(text.as_bytes());
    if let Some(c) = collision_count {
        feed(&c.to_le_bytes());
    }
    h.to_string()
        .bytes()
        .map(|b| char::from(SAFE_ALPHABET[usize::from(b) % SAFE_ALPHABET.len()]))
        .collect()
}

// ---------------------------------------------------------------------------
// spec helpers with API defaults
// ---------------------------------------------------------------------------

fn spec_replicas(d: &Deployment) -> i32 {
    d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1).max(0)
}

fn is_recreate(d: &Deployment) -> bool {
    d.spec
        .as_ref()
        .and_then(|s| s.strategy.as_ref())
        .and_then(|s| s.type_.as_deref())
        == Some("Recreate")
}

fn is_paused(d: &Deployment) -> bool {
    d.spec.as_ref().and_then(|s| s.paused).unwrap_or(false)
}

/// progressDeadlineSeconds, `None` when there is no deadline (`i32::MAX`).
fn progress_deadline(d: &Deployment) -> Option<i32> {
    let v = d
        .spec
        .as_ref()
        .and_then(|s| s.progress_deadline_seconds)
        .unwrap_or(600);
    (v != i32::MAX).then_some(v)
}

/// revisionHistoryLimit, `None` when unlimited (`i32::MAX`).
fn revision_history_limit(d: &Deployment) -> Option<i32> {
    let v = d
        .spec
        .as_ref()
        .and_then(|s| s.revision_history_limit)
        .unwrap_or(10);
    (v != i32::MAX).then_some(v)
}

/// Upstream `GetScaledValueFromIntOrPercent`; an invalid value counts as zero.
pub fn scaled_value(v: &IntOrString, total: i32, round_up: bool) -> i32 {
    match v {
        IntOrString::Int(i) => *i,
        IntOrString::String(s) => {
            let Some(p) = s.strip_suffix('%').and_then(|p| p.parse::<i64>().ok()) else {
                return 0;
            };
            let product = p * i64::from(total);
            let r = if round_up {
                product.div_euclid(100) + i64::from(product.rem_euclid(100) != 0)
            } else {
                product.div_euclid(100)
            };
            i32::try_from(r).unwrap_or(0)
        }
    }
}

/// Upstream `ResolveFenceposts`: (maxSurge, maxUnavailable) for `desired` replicas; surge rounds
/// up, unavailable down, and both zero makes maxUnavailable 1. Unset values are 25%.
pub fn resolve_fenceposts(
    max_surge: Option<&IntOrString>,
    max_unavailable: Option<&IntOrString>,
    desired: i32,
) -> (i32, i32) {
    let quarter = IntOrString::String("25%".to_string());
    let surge = scaled_value(max_surge.unwrap_or(&quarter), desired, true).max(0);
    let mut unavailable = scaled_value(max_unavailable.unwrap_or(&quarter), desired, false).max(0);
    if surge == 0 && unavailable == 0 {
        unavailable = 1;
    }
    (surge, unavailable)
}

fn fenceposts(d: &Deployment) -> (i32, i32) {
    let ru = d
        .spec
        .as_ref()
        .and_then(|s| s.strategy.as_ref())
        .and_then(|s| s.rolling_update.as_ref());
    resolve_fenceposts(
        ru.and_then(|r| r.max_surge.as_ref()),
        ru.and_then(|r| r.max_unavailable.as_ref()),
        spec_replicas(d),
    )
}

/// Upstream `MaxSurge`: zero for Recreate.
pub fn max_surge(d: &Deployment) -> i32 {
    if is_recreate(d) {
        0
    } else {
        fenceposts(d).0
    }
}

/// Upstream `MaxUnavailable`: zero for Recreate or zero replicas, at most the replicas.
pub fn max_unavailable(d: &Deployment) -> i32 {
    let replicas = spec_replicas(d);
    if is_recreate(d) || replicas == 0 {
        return 0;
    }
    fenceposts(d).1.min(replicas)
}

// ---------------------------------------------------------------------------
// ReplicaSet helpers
// ---------------------------------------------------------------------------

fn rs_replicas(rs: &ReplicaSet) -> i32 {
    rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)
}

fn set_rs_replicas(rs: &mut ReplicaSet, n: i32) {
    rs.spec.get_or_insert_with(Default::default).replicas = Some(n);
}

fn rs_status_replicas(rs: &ReplicaSet) -> i32 {
    rs.status.as_ref().map_or(0, |s| s.replicas)
}

fn rs_available(rs: &ReplicaSet) -> i32 {
    rs.status
        .as_ref()
        .and_then(|s| s.available_replicas)
        .unwrap_or(0)
}

fn rs_ready(rs: &ReplicaSet) -> i32 {
    rs.status
        .as_ref()
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0)
}

fn rs_name(rs: &ReplicaSet) -> String {
    rs.metadata.name.clone().unwrap_or_default()
}

fn annotation<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

/// Upstream `Revision`: 0 without the annotation, `None` when it is not an integer.
fn revision(rs: &ReplicaSet) -> Option<i64> {
    match annotation(&rs.metadata, REVISION_ANNOTATION) {
        None => Some(0),
        Some(v) => v.parse().ok(),
    }
}

fn created(rs: &ReplicaSet) -> Option<Timestamp> {
    rs.metadata.creation_timestamp.as_ref().map(|t| t.0)
}

/// Upstream `ReplicaSetsByCreationTimestamp`: oldest first, then by name.
fn by_creation_key(rs: &ReplicaSet) -> (Option<Timestamp>, String) {
    (created(rs), rs_name(rs))
}

fn template_of(rs: &ReplicaSet) -> PodTemplateSpec {
    rs.spec
        .as_ref()
        .and_then(|s| s.template.clone())
        .unwrap_or_default()
}

fn desired_annotation(rs: &ReplicaSet) -> Option<i32> {
    annotation(&rs.metadata, DESIRED_REPLICAS_ANNOTATION)?
        .parse()
        .ok()
}

fn max_replicas_annotation(rs: &ReplicaSet) -> Option<i32> {
    annotation(&rs.metadata, MAX_REPLICAS_ANNOTATION)?
        .parse()
        .ok()
}

/// Upstream `SetReplicasAnnotations`; true when something changed.
fn set_replicas_annotations(rs: &mut ReplicaSet, desired: i32, max: i32) -> bool {
    let ann = rs.metadata.annotations.get_or_insert_with(BTreeMap::new);
    let mut changed = false;
    for (k, v) in [
        (DESIRED_REPLICAS_ANNOTATION, desired.to_string()),
        (MAX_REPLICAS_ANNOTATION, max.to_string()),
    ] {
        if ann.get(k) != Some(&v) {
            ann.insert(k.to_string(), v);
            changed = true;
        }
    }
    changed
}

fn replicas_annotations_need_update(rs: &ReplicaSet, desired: i32, max: i32) -> bool {
    annotation(&rs.metadata, DESIRED_REPLICAS_ANNOTATION) != Some(desired.to_string().as_str())
        || annotation(&rs.metadata, MAX_REPLICAS_ANNOTATION) != Some(max.to_string().as_str())
}

// ---------------------------------------------------------------------------
// conditions and status
// ---------------------------------------------------------------------------

fn get_cond<'a>(status: &'a DeploymentStatus, type_: &str) -> Option<&'a DeploymentCondition> {
    status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == type_)
}

fn new_cond(
    type_: &str,
    status: &str,
    reason: &str,
    message: String,
    now: Timestamp,
) -> DeploymentCondition {
    DeploymentCondition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: Some(reason.to_string()),
        message: Some(message),
        last_update_time: Some(Time(now)),
        last_transition_time: Some(Time(now)),
    }
}

/// Upstream `SetDeploymentCondition`: no change for the same status and reason; the
/// lastTransitionTime is kept when only the reason changes; the condition moves to the end.
fn set_cond(status: &mut DeploymentStatus, mut cond: DeploymentCondition) {
    if let Some(cur) = get_cond(status, &cond.type_) {
        if cur.status == cond.status && cur.reason == cond.reason {
            return;
        }
        if cur.status == cond.status {
            cond.last_transition_time = cur.last_transition_time.clone();
        }
    }
    remove_cond(status, &cond.type_);
    status.conditions.get_or_insert_with(Vec::new).push(cond);
}

fn remove_cond(status: &mut DeploymentStatus, type_: &str) {
    if let Some(c) = status.conditions.as_mut() {
        c.retain(|c| c.type_ != type_);
    }
}

/// A status with `None` for zero counts and for empty conditions (Go's omitempty), for
/// comparisons and for writing.
pub fn normalize_status(s: &DeploymentStatus) -> DeploymentStatus {
    let nz = |v: Option<i32>| v.filter(|n| *n != 0);
    DeploymentStatus {
        available_replicas: nz(s.available_replicas),
        collision_count: s.collision_count,
        conditions: s.conditions.clone().filter(|c| !c.is_empty()),
        observed_generation: s.observed_generation.filter(|n| *n != 0),
        ready_replicas: nz(s.ready_replicas),
        replicas: nz(s.replicas),
        terminating_replicas: nz(s.terminating_replicas),
        unavailable_replicas: nz(s.unavailable_replicas),
        updated_replicas: nz(s.updated_replicas),
    }
}

/// Upstream `DeploymentComplete`.
fn deployment_complete(d: &Deployment, s: &DeploymentStatus) -> bool {
    let replicas = spec_replicas(d);
    s.updated_replicas.unwrap_or(0) == replicas
        && s.replicas.unwrap_or(0) == replicas
        && s.available_replicas.unwrap_or(0) == replicas
        && s.observed_generation.unwrap_or(0) >= d.metadata.generation.unwrap_or(0)
}

/// Upstream `DeploymentProgressing`: more updated, ready or available pods, or fewer old ones.
fn deployment_progressing(old: &DeploymentStatus, new: &DeploymentStatus) -> bool {
    let g = |v: Option<i32>| v.unwrap_or(0);
    let old_old = g(old.replicas) - g(old.updated_replicas);
    let new_old = g(new.replicas) - g(new.updated_replicas);
    g(new.updated_replicas) > g(old.updated_replicas)
        || new_old < old_old
        || g(new.ready_replicas) > g(old.ready_replicas)
        || g(new.available_replicas) > g(old.available_replicas)
}

/// Upstream `DeploymentTimedOut`.
fn deployment_timed_out(d: &Deployment, s: &DeploymentStatus, now: Timestamp) -> bool {
    let Some(deadline) = progress_deadline(d) else {
        return false;
    };
    let Some(cond) = get_cond(s, PROGRESSING) else {
        return false;
    };
    match cond.reason.as_deref() {
        Some(NEW_RS_AVAILABLE) => false,
        Some(TIMED_OUT) => true,
        _ => cond.last_update_time.as_ref().is_some_and(|Time(from)| {
            from.checked_add(SignedDuration::from_secs(i64::from(deadline)))
                .is_ok_and(|t| t < now)
        }),
    }
}

/// The status after the executor hit AlreadyExists creating the new ReplicaSet with a
/// ReplicaSet that is not this Deployment's (a hash collision): collisionCount + 1, so the next
/// plan uses another hash.
pub fn with_collision_count_bumped(d: &Deployment) -> DeploymentStatus {
    let mut s = d.status.clone().unwrap_or_default();
    s.collision_count = Some(s.collision_count.unwrap_or(0).saturating_add(1));
    s
}

/// The status after creating the new ReplicaSet failed: Progressing False
/// `ReplicaSetCreateError` (when the Deployment has a progress deadline), as upstream.
pub fn with_failed_create_condition(
    d: &Deployment,
    rs_name: &str,
    error: &str,
    now: Timestamp,
) -> DeploymentStatus {
    let mut s = d.status.clone().unwrap_or_default();
    if progress_deadline(d).is_some() {
        let msg = format!("Failed to create new replica set {rs_name:?}: {error}");
        set_cond(
            &mut s,
            new_cond(PROGRESSING, "False", FAILED_RS_CREATE, msg, now),
        );
    }
    s
}

// ---------------------------------------------------------------------------
// the planner
// ---------------------------------------------------------------------------

struct Planner<'a> {
    d: &'a Deployment,
    now: Timestamp,
    replicas: i32,
    /// Working copies of the ReplicaSets, oldest first.
    rss: Vec<ReplicaSet>,
    /// Per ReplicaSet, the index of its pending Create/Update action.
    pending: Vec<Option<usize>>,
    /// ReplicaSets created in this plan.
    created: Vec<bool>,
    actions: Vec<Action>,
    /// The Deployment's status as upstream's in-memory copy (conditions set along the way).
    status: DeploymentStatus,
    annotations: BTreeMap<String, String>,
    /// The status computed at the end, if any.
    final_status: Option<DeploymentStatus>,
    /// Whether the rollout-status path ran (for the progress requeue).
    rollout: bool,
}

/// Plans one sync of a Deployment (upstream `syncDeployment`). `rss` are the ReplicaSets it
/// controls (controller ref uid), old ones included; `pods` are the pods of those ReplicaSets
/// (only Recreate looks at them, to wait until the old pods are gone).
pub fn plan(d: &Deployment, rss: &[&ReplicaSet], pods: &[&Pod], now: Timestamp) -> Vec<Action> {
    let mut sorted: Vec<ReplicaSet> = rss.iter().map(|rs| (*rs).clone()).collect();
    sorted.sort_by_key(by_creation_key);
    let n = sorted.len();
    let mut p = Planner {
        d,
        now,
        replicas: spec_replicas(d),
        rss: sorted,
        pending: vec![None; n],
        created: vec![false; n],
        actions: Vec::new(),
        status: d.status.clone().unwrap_or_default(),
        annotations: d.metadata.annotations.clone().unwrap_or_default(),
        final_status: None,
        rollout: false,
    };

    let selector = d.spec.as_ref().map(|s| &s.selector);
    let selects_all = selector.is_none_or(|s| {
        s.match_labels.as_ref().is_none_or(BTreeMap::is_empty)
            && s.match_expressions.as_ref().is_none_or(Vec::is_empty)
    });
    if selects_all {
        // upstream: a warning event, and only observedGeneration is written
        let mut s = p.status.clone();
        let generation = d.metadata.generation.unwrap_or(0);
        if s.observed_generation.unwrap_or(0) < generation {
            s.observed_generation = Some(generation);
            p.final_status = Some(s);
        }
        p.event(
            "Warning",
            "SelectingAll",
            format!(
            "This deployment will select all pods, which is not allowed. Fix the selector: {:?}",
            d.metadata.name.as_deref().unwrap_or_default()
        ),
        );
        return p.finish();
    }

    if d.metadata.deletion_timestamp.is_some() {
        let (new, _) = p.sync_revision();
        p.sync_deployment_status(new);
        return p.finish();
    }

    p.check_paused_conditions();
    if is_paused(d) || p.is_scaling_event() {
        p.sync();
    } else if is_recreate(d) {
        p.rollout_recreate(pods);
    } else {
        p.rollout_rolling();
    }
    p.finish()
}

impl Planner<'_> {
    fn name(&self) -> &str {
        self.d.metadata.name.as_deref().unwrap_or_default()
    }

    fn max_surge(&self) -> i32 {
        max_surge(self.d)
    }

    fn event(&mut self, type_: &str, reason: &str, message: String) {
        self.actions.push(Action::Event {
            type_: type_.to_string(),
            reason: reason.to_string(),
            message,
        });
    }

    /// Record a change of `self.rss[i]` (coalesced with an earlier one in this plan).
    fn touch(&mut self, i: usize) {
        let obj = self.rss[i].clone();
        match self.pending[i] {
            Some(a) => {
                self.actions[a] = if self.created[i] {
                    Action::CreateReplicaSet(obj)
                } else {
                    Action::UpdateReplicaSet(obj)
                };
            }
            None => {
                self.pending[i] = Some(self.actions.len());
                self.actions.push(if self.created[i] {
                    Action::CreateReplicaSet(obj)
                } else {
                    Action::UpdateReplicaSet(obj)
                });
            }
        }
    }

    /// Index of the new ReplicaSet (oldest one whose template equals the Deployment's,
    /// ignoring the hash) and of the old ones.
    fn find_new_and_old(&self) -> (Option<usize>, Vec<usize>) {
        let template = self
            .d
            .spec
            .as_ref()
            .map(|s| s.template.clone())
            .unwrap_or_default();
        let new =
            (0..self.rss.len()).find(|&i| equal_ignore_hash(&template_of(&self.rss[i]), &template));
        let old = (0..self.rss.len()).filter(|&i| Some(i) != new).collect();
        (new, old)
    }

    fn max_old_revision(&self, old: &[usize]) -> i64 {
        old.iter()
            .filter_map(|&i| revision(&self.rss[i]))
            .max()
            .unwrap_or(0)
    }

    /// Upstream `getAllReplicaSetsAndSyncRevision` without creating: syncs the existing new
    /// ReplicaSet's annotations and minReadySeconds and the Deployment's revision.
    fn sync_revision(&mut self) -> (Option<usize>, Vec<usize>) {
        let (new, old) = self.find_new_and_old();
        let Some(i) = new else {
            return (None, old);
        };
        let new_revision = self.max_old_revision(&old) + 1;
        let mut rs = self.rss[i].clone();
        let annotations_changed =
            set_new_rs_annotations(self.d, &mut rs, new_revision, true, self.max_surge());
        let min_ready = self.d.spec.as_ref().and_then(|s| s.min_ready_seconds);
        let rs_min_ready = rs.spec.as_ref().and_then(|s| s.min_ready_seconds);
        if annotations_changed || min_ready.unwrap_or(0) != rs_min_ready.unwrap_or(0) {
            rs.spec
                .get_or_insert_with(Default::default)
                .min_ready_seconds = min_ready;
            self.rss[i] = rs;
            self.touch(i);
        }
        if let Some(rev) = annotation(&self.rss[i].metadata, REVISION_ANNOTATION) {
            self.annotations
                .insert(REVISION_ANNOTATION.to_string(), rev.to_string());
        }
        if progress_deadline(self.d).is_some() && get_cond(&self.status, PROGRESSING).is_none() {
            let msg = format!("Found new replica set {:?}", rs_name(&self.rss[i]));
            set_cond(
                &mut self.status,
                new_cond(PROGRESSING, "True", FOUND_NEW_RS, msg, self.now),
            );
        }
        (new, old)
    }

    /// Upstream `getNewReplicaSet` creating: `None` on a hash collision (collisionCount is
    /// bumped in the status).
    fn create_new_rs(&mut self, old: &[usize]) -> Option<usize> {
        let d = self.d;
        let spec = d.spec.clone().unwrap_or_default();
        let collision_count = self.status.collision_count;
        let hash = pod_template_hash(&spec.template, collision_count);
        let name = format!("{}-{}", self.name(), hash);

        if self.rss.iter().any(|rs| rs_name(rs) == name) {
            // ours (rss are) and not the new one, so another template: a hash collision
            self.status.collision_count = Some(collision_count.unwrap_or(0).saturating_add(1));
            return None;
        }

        let mut template = spec.template.clone();
        template
            .metadata
            .get_or_insert_with(Default::default)
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(POD_TEMPLATE_HASH_LABEL.to_string(), hash.clone());
        let mut selector = spec.selector.clone();
        selector
            .match_labels
            .get_or_insert_with(BTreeMap::new)
            .insert(POD_TEMPLATE_HASH_LABEL.to_string(), hash.clone());
        let labels = template.metadata.as_ref().and_then(|m| m.labels.clone());
        let mut rs = ReplicaSet {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: d.metadata.namespace.clone(),
                labels,
                owner_references: Some(vec![OwnerReference {
                    api_version: "apps/v1".to_string(),
                    kind: "Deployment".to_string(),
                    name: self.name().to_string(),
                    uid: d.metadata.uid.clone().unwrap_or_default(),
                    controller: Some(true),
                    block_owner_deletion: Some(true),
                }]),
                ..Default::default()
            },
            spec: Some(ReplicaSetSpec {
                replicas: Some(0),
                min_ready_seconds: spec.min_ready_seconds,
                selector,
                template: Some(template),
            }),
            status: None,
        };
        // upstream NewRSNewReplicas over the old ReplicaSets plus this one (at 0)
        let count = if is_recreate(d) {
            self.replicas
        } else {
            let current: i32 = old.iter().map(|&i| rs_replicas(&self.rss[i])).sum();
            let max_total = self.replicas + self.max_surge();
            if current >= max_total {
                0
            } else {
                (max_total - current).min(self.replicas)
            }
        };
        set_rs_replicas(&mut rs, count);
        let new_revision = self.max_old_revision(old) + 1;
        set_new_rs_annotations(d, &mut rs, new_revision, false, self.max_surge());

        self.rss.push(rs);
        self.pending.push(None);
        self.created.push(true);
        let i = self.rss.len() - 1;
        self.touch(i);
        if count > 0 {
            self.event(
                "Normal",
                "ScalingReplicaSet",
                format!("Scaled up replica set {name} from 0 to {count}"),
            );
        }
        self.annotations
            .insert(REVISION_ANNOTATION.to_string(), new_revision.to_string());
        if progress_deadline(d).is_some() {
            let msg = format!("Created new replica set {name:?}");
            set_cond(
                &mut self.status,
                new_cond(PROGRESSING, "True", NEW_RS_CREATED, msg, self.now),
            );
        }
        Some(i)
    }

    /// Upstream `checkPausedConditions`.
    fn check_paused_conditions(&mut self) {
        if progress_deadline(self.d).is_none() {
            return;
        }
        let cond = get_cond(&self.status, PROGRESSING);
        if cond.is_some_and(|c| c.reason.as_deref() == Some(TIMED_OUT)) {
            return;
        }
        let paused_cond = cond.is_some_and(|c| c.reason.as_deref() == Some(PAUSED));
        if is_paused(self.d) && !paused_cond {
            let c = new_cond(
                PROGRESSING,
                "Unknown",
                PAUSED,
                "Deployment is paused".into(),
                self.now,
            );
            set_cond(&mut self.status, c);
        } else if !is_paused(self.d) && paused_cond {
            let c = new_cond(
                PROGRESSING,
                "Unknown",
                RESUMED,
                "Deployment is resumed".into(),
                self.now,
            );
            set_cond(&mut self.status, c);
        }
    }

    /// Upstream `isScalingEvent`: an active ReplicaSet's desired-replicas annotation differs
    /// from the Deployment's replicas.
    fn is_scaling_event(&mut self) -> bool {
        let (new, old) = self.sync_revision();
        old.iter()
            .copied()
            .chain(new)
            .filter(|&i| rs_replicas(&self.rss[i]) > 0)
            .any(|i| desired_annotation(&self.rss[i]).is_some_and(|v| v != self.replicas))
    }

    /// Upstream `scaleReplicaSet`: sets the size and the replicas annotations; true when the
    /// size changed.
    fn scale_rs(&mut self, i: usize, size: i32, operation: &str) -> bool {
        let surge = self.max_surge();
        let old_size = rs_replicas(&self.rss[i]);
        let size_changed = old_size != size;
        if size_changed
            || replicas_annotations_need_update(&self.rss[i], self.replicas, self.replicas + surge)
        {
            set_rs_replicas(&mut self.rss[i], size);
            set_replicas_annotations(&mut self.rss[i], self.replicas, self.replicas + surge);
            self.touch(i);
            if size_changed {
                let name = rs_name(&self.rss[i]);
                self.event(
                    "Normal",
                    "ScalingReplicaSet",
                    format!("Scaled {operation} replica set {name} from {old_size} to {size}"),
                );
            }
        }
        size_changed
    }

    /// Upstream `scaleReplicaSetAndRecordEvent`.
    fn scale_rs_and_record(&mut self, i: usize, size: i32) -> bool {
        let cur = rs_replicas(&self.rss[i]);
        if cur == size {
            return false;
        }
        let op = if cur < size { "up" } else { "down" };
        self.scale_rs(i, size, op)
    }

    /// Upstream `sync`: scaling (and cleanup when paused), no rollout.
    fn sync(&mut self) {
        let (new, old) = self.sync_revision();
        self.scale(new, &old);
        if is_paused(self.d) {
            self.cleanup(&old);
        }
        self.sync_deployment_status(new);
    }

    /// Upstream `scale`.
    fn scale(&mut self, new: Option<usize>, old: &[usize]) {
        if let Some(i) = self.find_active_or_latest(new, old) {
            if rs_replicas(&self.rss[i]) != self.replicas {
                self.scale_rs_and_record(i, self.replicas);
            }
            return;
        }
        if new.is_some_and(|n| self.is_saturated(n)) {
            for &o in old {
                if rs_replicas(&self.rss[o]) > 0 {
                    self.scale_rs_and_record(o, 0);
                }
            }
            return;
        }
        if is_recreate(self.d) {
            return;
        }
        // proportional scaling of all active ReplicaSets
        let mut all: Vec<usize> = old
            .iter()
            .copied()
            .chain(new)
            .filter(|&i| rs_replicas(&self.rss[i]) > 0)
            .collect();
        let all_replicas: i32 = all.iter().map(|&i| rs_replicas(&self.rss[i])).sum();
        let allowed = if self.replicas > 0 {
            self.replicas + self.max_surge()
        } else {
            0
        };
        let to_add = allowed - all_replicas;
        let op = match to_add.signum() {
            1 => {
                // by size, larger first, newer first on ties
                all.sort_by_key(|&i| {
                    (
                        Reverse(rs_replicas(&self.rss[i])),
                        Reverse(by_creation_key(&self.rss[i])),
                    )
                });
                "up"
            }
            -1 => {
                all.sort_by_key(|&i| {
                    (
                        Reverse(rs_replicas(&self.rss[i])),
                        by_creation_key(&self.rss[i]),
                    )
                });
                "down"
            }
            _ => "",
        };
        let mut added = 0;
        let mut sizes: Vec<i32> = Vec::with_capacity(all.len());
        for &i in &all {
            let cur = rs_replicas(&self.rss[i]);
            if to_add != 0 {
                let proportion = self.proportion(i, to_add, added);
                sizes.push(cur + proportion);
                added += proportion;
            } else {
                sizes.push(cur);
            }
        }
        if let Some(first) = sizes.first_mut() {
            if to_add != 0 {
                *first = (*first + to_add - added).max(0);
            }
        }
        for (k, &i) in all.iter().enumerate() {
            self.scale_rs(i, sizes[k], op);
        }
    }

    /// Upstream `GetReplicaSetProportion`.
    fn proportion(&self, i: usize, to_add: i32, added: i32) -> i32 {
        let rs = &self.rss[i];
        let size = rs_replicas(rs);
        if size == 0 || to_add == 0 || to_add == added {
            return 0;
        }
        let fraction = self.fraction(rs);
        let allowed = to_add - added;
        if to_add > 0 {
            fraction.min(allowed)
        } else {
            fraction.max(allowed)
        }
    }

    /// Upstream `getReplicaSetFraction`.
    fn fraction(&self, rs: &ReplicaSet) -> i32 {
        let size = rs_replicas(rs);
        if self.replicas == 0 {
            return -size;
        }
        let max_now = self.replicas + self.max_surge();
        let before = max_replicas_annotation(rs)
            .unwrap_or_else(|| self.d.status.as_ref().and_then(|s| s.replicas).unwrap_or(0));
        if before == 0 {
            return 0;
        }
        let scaled = f64::from(size) * f64::from(max_now) / f64::from(before);
        // Go's math.Round: half away from zero
        let rounded = scaled.round();
        let rounded = if rounded > f64::from(i32::MAX) {
            i32::MAX
        } else {
            rounded as i32
        };
        rounded - size
    }

    /// Upstream `FindActiveOrLatest`.
    fn find_active_or_latest(&self, new: Option<usize>, old: &[usize]) -> Option<usize> {
        if new.is_none() && old.is_empty() {
            return None;
        }
        let mut old_sorted = old.to_vec();
        old_sorted.sort_by_key(|&i| Reverse(by_creation_key(&self.rss[i])));
        let active: Vec<usize> = old_sorted
            .iter()
            .copied()
            .chain(new)
            .filter(|&i| rs_replicas(&self.rss[i]) > 0)
            .collect();
        match active.len() {
            0 => new.or_else(|| old_sorted.first().copied()),
            1 => active.first().copied(),
            _ => None,
        }
    }

    /// Upstream `IsSaturated`.
    fn is_saturated(&self, i: usize) -> bool {
        let rs = &self.rss[i];
        let Some(desired) = desired_annotation(rs) else {
            return false;
        };
        rs_replicas(rs) == self.replicas
            && desired == self.replicas
            && rs_available(rs) == self.replicas
    }

    /// Upstream `rolloutRolling`.
    fn rollout_rolling(&mut self) {
        let (new, old) = self.sync_revision();
        let new = match new {
            Some(n) => n,
            None => match self.create_new_rs(&old) {
                Some(n) => n,
                None => {
                    // hash collision: write the bumped collisionCount, the write requeues
                    self.final_status = Some(self.status.clone());
                    return;
                }
            },
        };
        let all: Vec<usize> = old.iter().copied().chain([new]).collect();
        self.rollout = true;
        if self.reconcile_new_rs(&all, new) {
            self.sync_rollout_status(Some(new));
            return;
        }
        let active_old: Vec<usize> = old
            .iter()
            .copied()
            .filter(|&i| rs_replicas(&self.rss[i]) > 0)
            .collect();
        if self.reconcile_old_rss(&all, &active_old, new) {
            self.sync_rollout_status(Some(new));
            return;
        }
        if deployment_complete(self.d, &self.status) {
            self.cleanup(&old);
        }
        self.sync_rollout_status(Some(new));
    }

    /// Upstream `reconcileNewReplicaSet`.
    fn reconcile_new_rs(&mut self, all: &[usize], new: usize) -> bool {
        let cur = rs_replicas(&self.rss[new]);
        if cur == self.replicas {
            return false;
        }
        if cur > self.replicas {
            return self.scale_rs_and_record(new, self.replicas);
        }
        // upstream NewRSNewReplicas
        let current: i32 = all.iter().map(|&i| rs_replicas(&self.rss[i])).sum();
        let max_total = self.replicas + self.max_surge();
        if current >= max_total {
            return false;
        }
        let target = cur + (max_total - current).min(self.replicas - cur);
        self.scale_rs_and_record(new, target)
    }

    /// Upstream `reconcileOldReplicaSets`.
    fn reconcile_old_rss(&mut self, all: &[usize], old: &[usize], new: usize) -> bool {
        let old_count: i32 = old.iter().map(|&i| rs_replicas(&self.rss[i])).sum();
        if old_count == 0 {
            return false;
        }
        let all_count: i32 = all.iter().map(|&i| rs_replicas(&self.rss[i])).sum();
        let min_available = self.replicas - max_unavailable(self.d);
        let new_unavailable = rs_replicas(&self.rss[new]) - rs_available(&self.rss[new]);
        let max_scaled_down = all_count - min_available - new_unavailable;
        if max_scaled_down <= 0 {
            return false;
        }
        let cleaned = self.cleanup_unhealthy_replicas(old, max_scaled_down);
        let scaled = self.scale_down_old_for_rolling_update(all, old);
        cleaned + scaled > 0
    }

    /// Upstream `cleanupUnhealthyReplicas`: scale old ReplicaSets down by their unavailable pods.
    fn cleanup_unhealthy_replicas(&mut self, old: &[usize], max_cleanup: i32) -> i32 {
        let mut sorted = old.to_vec();
        sorted.sort_by_key(|&i| by_creation_key(&self.rss[i]));
        let mut total = 0;
        for i in sorted {
            if total >= max_cleanup {
                break;
            }
            let size = rs_replicas(&self.rss[i]);
            let available = rs_available(&self.rss[i]);
            if size == 0 || size <= available {
                continue;
            }
            let down = (max_cleanup - total).min(size - available);
            self.scale_rs_and_record(i, size - down);
            total += down;
        }
        total
    }

    /// Upstream `scaleDownOldReplicaSetsForRollingUpdate`.
    fn scale_down_old_for_rolling_update(&mut self, all: &[usize], old: &[usize]) -> i32 {
        let min_available = self.replicas - max_unavailable(self.d);
        let available: i32 = all
            .iter()
            .map(|&i| rs_available(&self.rss[i]).min(rs_replicas(&self.rss[i])))
            .sum();
        if available <= min_available {
            return 0;
        }
        let mut sorted = old.to_vec();
        sorted.sort_by_key(|&i| by_creation_key(&self.rss[i]));
        let budget = available - min_available;
        let mut total = 0;
        for i in sorted {
            if total >= budget {
                break;
            }
            let size = rs_replicas(&self.rss[i]);
            if size == 0 {
                continue;
            }
            let down = size.min(budget - total);
            self.scale_rs_and_record(i, size - down);
            total += down;
        }
        total
    }

    /// Upstream `rolloutRecreate`.
    fn rollout_recreate(&mut self, pods: &[&Pod]) {
        let (mut new, old) = self.sync_revision();
        self.rollout = true;
        let mut scaled_down = false;
        for &o in &old {
            if rs_replicas(&self.rss[o]) > 0 && self.scale_rs_and_record(o, 0) {
                scaled_down = true;
            }
        }
        if scaled_down || self.old_pods_running(new, &old, pods) {
            self.sync_rollout_status(new);
            return;
        }
        if new.is_none() {
            match self.create_new_rs(&old) {
                Some(n) => new = Some(n),
                None => {
                    self.final_status = Some(self.status.clone());
                    self.rollout = false;
                    return;
                }
            }
        }
        if let Some(n) = new {
            self.scale_rs_and_record(n, self.replicas);
        }
        if deployment_complete(self.d, &self.status) {
            self.cleanup(&old);
        }
        self.sync_rollout_status(new);
    }

    /// Upstream `oldPodsRunning`: old ReplicaSets still report pods, or a pod of an old
    /// ReplicaSet is not Succeeded/Failed (terminating ones included).
    fn old_pods_running(&self, new: Option<usize>, old: &[usize], pods: &[&Pod]) -> bool {
        if old
            .iter()
            .map(|&i| rs_status_replicas(&self.rss[i]))
            .sum::<i32>()
            > 0
        {
            return true;
        }
        let new_uid = new.and_then(|n| self.rss[n].metadata.uid.clone());
        let old_uids: Vec<&str> = old
            .iter()
            .filter_map(|&i| self.rss[i].metadata.uid.as_deref())
            .filter(|u| Some(*u) != new_uid.as_deref())
            .collect();
        pods.iter().any(|p| {
            let owned_by_old =
                controller_of(&p.metadata).is_some_and(|r| old_uids.contains(&r.uid.as_str()));
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            owned_by_old && !matches!(phase, Some("Succeeded" | "Failed"))
        })
    }

    /// Upstream `cleanupDeployment`: delete the oldest old ReplicaSets beyond the history limit
    /// that have no replicas.
    fn cleanup(&mut self, old: &[usize]) {
        let Some(limit) = revision_history_limit(self.d) else {
            return;
        };
        let mut alive: Vec<usize> = old
            .iter()
            .copied()
            .filter(|&i| self.rss[i].metadata.deletion_timestamp.is_none())
            .collect();
        let diff = i64::try_from(alive.len()).unwrap_or(i64::MAX) - i64::from(limit);
        if diff <= 0 {
            return;
        }
        alive.sort_by_key(|&i| {
            (
                revision(&self.rss[i]).unwrap_or(0),
                by_creation_key(&self.rss[i]),
            )
        });
        for &i in alive.iter().take(usize::try_from(diff).unwrap_or(0)) {
            let rs = &self.rss[i];
            let generation = rs.metadata.generation.unwrap_or(0);
            let observed = rs
                .status
                .as_ref()
                .and_then(|s| s.observed_generation)
                .unwrap_or(0);
            if rs_status_replicas(rs) != 0
                || rs_replicas(rs) != 0
                || generation > observed
                || self.pending[i].is_some()
            {
                continue;
            }
            self.actions
                .push(Action::DeleteReplicaSet { name: rs_name(rs) });
        }
    }

    /// Upstream `calculateStatus` (conditions from the in-memory status).
    fn calculate_status(&self, new: Option<usize>) -> DeploymentStatus {
        let all = 0..self.rss.len();
        let available: i32 = all.clone().map(|i| rs_available(&self.rss[i])).sum();
        let total: i32 = all.clone().map(|i| rs_replicas(&self.rss[i])).sum();
        let mut status = DeploymentStatus {
            observed_generation: self.d.metadata.generation,
            replicas: Some(all.clone().map(|i| rs_status_replicas(&self.rss[i])).sum()),
            updated_replicas: Some(new.map_or(0, |n| rs_status_replicas(&self.rss[n]))),
            ready_replicas: Some(all.map(|i| rs_ready(&self.rss[i])).sum()),
            available_replicas: Some(available),
            unavailable_replicas: Some((total - available).max(0)),
            collision_count: self.status.collision_count,
            conditions: self.status.conditions.clone(),
            terminating_replicas: None,
        };
        let cond = if available >= self.replicas - max_unavailable(self.d) {
            new_cond(
                AVAILABLE,
                "True",
                MINIMUM_REPLICAS_AVAILABLE,
                "Deployment has minimum availability.".into(),
                self.now,
            )
        } else {
            new_cond(
                AVAILABLE,
                "False",
                MINIMUM_REPLICAS_UNAVAILABLE,
                "Deployment does not have minimum availability.".into(),
                self.now,
            )
        };
        set_cond(&mut status, cond);
        status
    }

    /// Upstream `syncDeploymentStatus`.
    fn sync_deployment_status(&mut self, new: Option<usize>) {
        self.final_status = Some(self.calculate_status(new));
    }

    /// Upstream `syncRolloutStatus`: the status with the Progressing condition estimated.
    fn sync_rollout_status(&mut self, new: Option<usize>) {
        let d = self.d;
        let observed = d.status.clone().unwrap_or_default();
        let mut status = self.calculate_status(new);
        if progress_deadline(d).is_none() {
            remove_cond(&mut status, PROGRESSING);
        }
        let current = get_cond(&self.status, PROGRESSING).cloned();
        let complete_already = status.replicas == status.updated_replicas
            && current
                .as_ref()
                .is_some_and(|c| c.reason.as_deref() == Some(NEW_RS_AVAILABLE));
        let subject = match new {
            Some(n) => format!("ReplicaSet {:?}", rs_name(&self.rss[n])),
            None => format!("Deployment {:?}", self.name()),
        };
        if progress_deadline(d).is_some() && !complete_already {
            if deployment_complete(d, &status) {
                let msg = format!("{subject} has successfully progressed.");
                set_cond(
                    &mut status,
                    new_cond(PROGRESSING, "True", NEW_RS_AVAILABLE, msg, self.now),
                );
            } else if deployment_progressing(&observed, &status) {
                let msg = format!("{subject} is progressing.");
                let mut cond = new_cond(PROGRESSING, "True", RS_UPDATED, msg, self.now);
                if let Some(cur) = &current {
                    if cur.status == "True" {
                        cond.last_transition_time = cur.last_transition_time.clone();
                    }
                    remove_cond(&mut status, PROGRESSING);
                }
                set_cond(&mut status, cond);
            } else if deployment_timed_out(d, &status, self.now) {
                let msg = format!("{subject} has timed out progressing.");
                set_cond(
                    &mut status,
                    new_cond(PROGRESSING, "False", TIMED_OUT, msg, self.now),
                );
            }
        }
        match self.replica_failure(new) {
            Some(c) => set_cond(&mut status, c),
            None => remove_cond(&mut status, REPLICA_FAILURE),
        }
        self.final_status = Some(status);
    }

    /// Upstream `getReplicaFailures`: the new ReplicaSet's ReplicaFailure condition, else the
    /// first old one's.
    fn replica_failure(&self, new: Option<usize>) -> Option<DeploymentCondition> {
        let failure = |i: usize| {
            self.rss[i]
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.type_ == REPLICA_FAILURE))
                .map(|c| DeploymentCondition {
                    type_: c.type_.clone(),
                    status: c.status.clone(),
                    reason: c.reason.clone(),
                    message: c.message.clone(),
                    last_update_time: c.last_transition_time.clone(),
                    last_transition_time: c.last_transition_time.clone(),
                })
        };
        new.and_then(failure).or_else(|| {
            (0..self.rss.len())
                .filter(|&i| Some(i) != new)
                .find_map(failure)
        })
    }

    /// Upstream `requeueStuckDeployment`: when to check the progress deadline again.
    fn requeue_after(&self, status: &DeploymentStatus) -> Option<Duration> {
        let deadline = progress_deadline(self.d)?;
        let cond = get_cond(status, PROGRESSING)?;
        if deployment_complete(self.d, status) || cond.reason.as_deref() == Some(TIMED_OUT) {
            return None;
        }
        let from = cond.last_update_time.as_ref()?.0;
        let at = from
            .checked_add(SignedDuration::from_secs(i64::from(deadline)))
            .ok()?;
        let after = Duration::try_from(at.duration_since(self.now)).unwrap_or(Duration::ZERO);
        // upstream adds a second against clock skew
        Some(after + Duration::from_secs(1))
    }

    fn finish(mut self) -> Vec<Action> {
        let observed_annotations = self.d.metadata.annotations.clone().unwrap_or_default();
        if self.annotations != observed_annotations {
            self.actions.push(Action::UpdateDeploymentAnnotations(
                self.annotations.clone(),
            ));
        }
        if let Some(status) = self.final_status.take() {
            let status = normalize_status(&status);
            let observed = normalize_status(&self.d.status.clone().unwrap_or_default());
            if self.rollout {
                if let Some(after) = self.requeue_after(&status) {
                    self.actions.push(Action::RequeueAfter(after));
                }
            }
            if status != observed {
                self.actions.push(Action::UpdateStatus(status));
            }
        }
        self.actions
    }
}

/// Upstream `SetNewReplicaSetAnnotations`: copies the Deployment's annotations (but the skipped
/// ones), raises the revision (keeping the earlier one in the revision history when rolling back
/// to this ReplicaSet) and, for a ReplicaSet about to be created, sets the replicas
/// annotations. True when something changed.
fn set_new_rs_annotations(
    d: &Deployment,
    rs: &mut ReplicaSet,
    new_revision: i64,
    exists: bool,
    surge: i32,
) -> bool {
    let mut changed = false;
    let ann = rs.metadata.annotations.get_or_insert_with(BTreeMap::new);
    for (k, v) in d.metadata.annotations.iter().flatten() {
        if ANNOTATIONS_TO_SKIP.contains(&k.as_str()) || ann.get(k) == Some(v) {
            continue;
        }
        ann.insert(k.clone(), v.clone());
        changed = true;
    }
    let old_revision = ann.get(REVISION_ANNOTATION).cloned();
    let old_revision_int = match old_revision.as_deref() {
        None | Some("") => 0,
        Some(v) => match v.parse::<i64>() {
            Ok(n) => n,
            Err(_) => return false,
        },
    };
    if old_revision_int < new_revision {
        ann.insert(REVISION_ANNOTATION.to_string(), new_revision.to_string());
        changed = true;
        if let Some(old) = old_revision {
            let history = ann
                .get(REVISION_HISTORY_ANNOTATION)
                .cloned()
                .unwrap_or_default();
            if history.is_empty() {
                ann.insert(REVISION_HISTORY_ANNOTATION.to_string(), old);
            } else {
                let entries: Vec<&str> = history.split(',').collect();
                let mut total = history.len() + old.len() + 1;
                let mut start = 0;
                while total > MAX_REV_HISTORY_LENGTH && start < entries.len() {
                    total -= entries[start].len() + 1;
                    start += 1;
                }
                if total <= MAX_REV_HISTORY_LENGTH {
                    let mut kept: Vec<&str> = entries[start..].to_vec();
                    kept.push(&old);
                    ann.insert(REVISION_HISTORY_ANNOTATION.to_string(), kept.join(","));
                }
            }
        }
    }
    if !exists {
        let replicas = spec_replicas(d);
        if set_replicas_annotations(rs, replicas, replicas + surge) {
            changed = true;
        }
    }
    changed
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::controllers::replicaset::plan as rsc;
    use k8s_openapi::api::apps::v1::{DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment};
    use k8s_openapi::api::core::v1::{
        Container, EmptyDirVolumeSource, PodCondition, PodSpec, PodStatus, Volume,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1 as metav1;

    fn ts(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn template(image: &str) -> PodTemplateSpec {
        PodTemplateSpec {
            metadata: Some(ObjectMeta {
                labels: Some(labels(&[("app", "web")])),
                ..Default::default()
            }),
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "web".into(),
                    image: Some(image.into()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
        }
    }

    fn int(i: i32) -> IntOrString {
        IntOrString::Int(i)
    }

    fn pct(s: &str) -> IntOrString {
        IntOrString::String(s.into())
    }

    fn deployment(image: &str, replicas: i32) -> Deployment {
        Deployment {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("default".into()),
                uid: Some("d-uid".into()),
                generation: Some(1),
                ..Default::default()
            },
            spec: Some(DeploymentSpec {
                replicas: Some(replicas),
                selector: metav1::LabelSelector {
                    match_labels: Some(labels(&[("app", "web")])),
                    ..Default::default()
                },
                template: template(image),
                strategy: Some(DeploymentStrategy {
                    type_: Some("RollingUpdate".into()),
                    rolling_update: Some(RollingUpdateDeployment {
                        max_surge: Some(int(1)),
                        max_unavailable: Some(int(0)),
                    }),
                }),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn set_image(d: &mut Deployment, image: &str) {
        d.spec.as_mut().unwrap().template = template(image);
        d.metadata.generation = Some(d.metadata.generation.unwrap_or(0) + 1);
    }

    fn cond<'a>(d: &'a Deployment, type_: &str) -> Option<&'a DeploymentCondition> {
        get_cond(d.status.as_ref()?, type_)
    }

    /// What `kubectl rollout status` checks.
    fn rollout_status_done(d: &Deployment) -> bool {
        let s = d.status.clone().unwrap_or_default();
        let g = |v: Option<i32>| v.unwrap_or(0);
        s.observed_generation.unwrap_or(0) >= d.metadata.generation.unwrap_or(0)
            && get_cond(&s, PROGRESSING).is_none_or(|c| c.reason.as_deref() != Some(TIMED_OUT))
            && g(s.updated_replicas) >= spec_replicas(d)
            && g(s.replicas) <= g(s.updated_replicas)
            && g(s.available_replicas) >= g(s.updated_replicas)
    }

    /// An in-memory cluster: the Deployment planner, the ReplicaSet planner, and a kubelet that
    /// makes every pod ready one tick after it appears.
    struct World {
        d: Deployment,
        rss: Vec<ReplicaSet>,
        pods: Vec<Pod>,
        now: i64,
        seq: u64,
        actions: Vec<Action>,
    }

    impl World {
        fn new(d: Deployment) -> World {
            World {
                d,
                rss: Vec::new(),
                pods: Vec::new(),
                now: 0,
                seq: 0,
                actions: Vec::new(),
            }
        }

        fn next(&mut self) -> u64 {
            self.seq += 1;
            self.seq
        }

        fn rs(&self, image: &str) -> &ReplicaSet {
            self.rss
                .iter()
                .find(|rs| equal_ignore_hash(&template_of(rs), &template(image)))
                .unwrap()
        }

        fn available(&self) -> usize {
            self.pods
                .iter()
                .filter(|p| rsc::is_pod_available(p, 0, ts(self.now)))
                .count()
        }

        fn deploy_step(&mut self) -> bool {
            let owned: Vec<&ReplicaSet> = self.rss.iter().collect();
            let pods: Vec<&Pod> = self.pods.iter().collect();
            let actions = plan(&self.d, &owned, &pods, ts(self.now));
            self.actions = actions.clone();
            let mut changed = false;
            for a in actions {
                match a {
                    Action::CreateReplicaSet(mut rs) => {
                        assert!(self.rss.iter().all(|r| r.metadata.name != rs.metadata.name));
                        rs.metadata.uid = Some(format!("rs-{}", self.next()));
                        rs.metadata.creation_timestamp = Some(Time(ts(self.now)));
                        rs.metadata.generation = Some(1);
                        self.rss.push(rs);
                        changed = true;
                    }
                    Action::UpdateReplicaSet(rs) => {
                        let cur = self
                            .rss
                            .iter_mut()
                            .find(|r| r.metadata.name == rs.metadata.name)
                            .unwrap();
                        let bump = cur.spec != rs.spec;
                        let generation = cur.metadata.generation.unwrap_or(1) + i64::from(bump);
                        let status = cur.status.clone();
                        *cur = rs;
                        cur.metadata.generation = Some(generation);
                        cur.status = status;
                        changed = true;
                    }
                    Action::DeleteReplicaSet { name } => {
                        self.rss
                            .retain(|r| r.metadata.name.as_deref() != Some(&name));
                        changed = true;
                    }
                    Action::UpdateDeploymentAnnotations(a) => {
                        self.d.metadata.annotations = Some(a);
                        changed = true;
                    }
                    Action::UpdateStatus(s) => {
                        self.d.status = Some(s);
                        changed = true;
                    }
                    Action::Event { .. } | Action::RequeueAfter(_) => {}
                }
            }
            changed
        }

        fn rs_step(&mut self, check: &dyn Fn(&World)) -> bool {
            let mut changed = false;
            for i in 0..self.rss.len() {
                let rs = self.rss[i].clone();
                let pods: Vec<&Pod> = self.pods.iter().collect();
                let p = rsc::plan(&rs, &pods, ts(self.now));
                assert!(p.adopt.is_empty() && p.release.is_empty());
                for _ in 0..p.create {
                    let mut pod = rsc::pod_template(&rs);
                    let n = self.next();
                    pod.metadata.name = Some(format!(
                        "{}{n}",
                        pod.metadata.generate_name.clone().unwrap()
                    ));
                    pod.metadata.uid = Some(format!("pod-{n}"));
                    pod.metadata.creation_timestamp = Some(Time(ts(self.now)));
                    pod.status = Some(PodStatus {
                        phase: Some("Pending".into()),
                        ..Default::default()
                    });
                    self.pods.push(pod);
                    changed = true;
                }
                for name in &p.delete {
                    self.pods
                        .retain(|pod| pod.metadata.name.as_ref() != Some(name));
                    changed = true;
                }
                check(self);
                let pods: Vec<&Pod> = self.pods.iter().collect();
                let settled = rsc::plan(&rs, &pods, ts(self.now));
                if settled.status_changed {
                    self.rss[i].status = Some(settled.status);
                    changed = true;
                }
            }
            changed
        }

        fn kubelet_step(&mut self) -> bool {
            let mut changed = false;
            for pod in &mut self.pods {
                if !rsc::is_pod_ready(pod) {
                    pod.spec.get_or_insert_with(Default::default).node_name = Some("n1".into());
                    pod.status = Some(PodStatus {
                        phase: Some("Running".into()),
                        conditions: Some(vec![PodCondition {
                            type_: "Ready".into(),
                            status: "True".into(),
                            last_transition_time: Some(Time(ts(self.now))),
                            ..Default::default()
                        }]),
                        ..Default::default()
                    });
                    changed = true;
                }
            }
            changed
        }

        /// Runs all controllers until nothing changes; `check` runs after every change of pods.
        fn converge(&mut self, check: &dyn Fn(&World)) {
            for _ in 0..200 {
                let a = self.deploy_step();
                check(self);
                let b = self.rs_step(check);
                let c = self.kubelet_step();
                check(self);
                self.now += 1;
                if !a && !b && !c {
                    return;
                }
            }
            panic!("no convergence");
        }
    }

    fn no_check(_: &World) {}

    fn rolled_out(image: &str, replicas: i32) -> World {
        let mut w = World::new(deployment(image, replicas));
        w.converge(&no_check);
        w
    }

    #[test]
    fn first_sync_creates_the_new_replica_set() {
        let d = deployment("nginx:1.21", 3);
        let actions = plan(&d, &[], &[], ts(0));
        let Some(Action::CreateReplicaSet(rs)) = actions.first() else {
            panic!("{actions:?}");
        };
        let hash = pod_template_hash(&template("nginx:1.21"), None);
        assert_eq!(
            rs.metadata.name.as_deref(),
            Some(format!("web-{hash}").as_str())
        );
        assert_eq!(rs.metadata.namespace.as_deref(), Some("default"));
        let with_hash = labels(&[("app", "web"), (POD_TEMPLATE_HASH_LABEL, &hash)]);
        assert_eq!(rs.metadata.labels.as_ref(), Some(&with_hash));
        let spec = rs.spec.as_ref().unwrap();
        assert_eq!(spec.replicas, Some(3));
        assert_eq!(spec.selector.match_labels.as_ref(), Some(&with_hash));
        let tlabels = spec
            .template
            .as_ref()
            .unwrap()
            .metadata
            .as_ref()
            .unwrap()
            .labels
            .as_ref();
        assert_eq!(tlabels, Some(&with_hash));
        let owner = &rs.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("Deployment", "d-uid", Some(true))
        );
        let ann = rs.metadata.annotations.as_ref().unwrap();
        assert_eq!(ann.get(REVISION_ANNOTATION).map(String::as_str), Some("1"));
        assert_eq!(
            ann.get(DESIRED_REPLICAS_ANNOTATION).map(String::as_str),
            Some("3")
        );
        assert_eq!(
            ann.get(MAX_REPLICAS_ANNOTATION).map(String::as_str),
            Some("4")
        );
        assert!(actions.iter().any(|a| matches!(a, Action::Event { message, .. } if message == &format!("Scaled up replica set web-{hash} from 0 to 3"))));
        assert!(
            actions.contains(&Action::UpdateDeploymentAnnotations(labels(&[(
                REVISION_ANNOTATION,
                "1"
            )])))
        );
        let Some(Action::UpdateStatus(s)) = actions
            .iter()
            .find(|a| matches!(a, Action::UpdateStatus(_)))
        else {
            panic!("no status");
        };
        let progressing = get_cond(s, PROGRESSING).unwrap();
        assert_eq!(progressing.reason.as_deref(), Some(NEW_RS_CREATED));
        assert_eq!(
            get_cond(s, AVAILABLE).unwrap().reason.as_deref(),
            Some(MINIMUM_REPLICAS_UNAVAILABLE)
        );
        assert_eq!(s.observed_generation, Some(1));
    }

    #[test]
    fn initial_rollout_completes_and_satisfies_rollout_status() {
        let w = rolled_out("nginx:1.21", 3);
        assert_eq!(w.rss.len(), 1);
        assert_eq!(w.available(), 3);
        assert!(rollout_status_done(&w.d), "{:?}", w.d.status);
        let p = cond(&w.d, PROGRESSING).unwrap();
        assert_eq!(p.reason.as_deref(), Some(NEW_RS_AVAILABLE));
        assert_eq!(
            p.message.as_deref(),
            Some(
                format!(
                    "ReplicaSet {:?} has successfully progressed.",
                    rs_name(&w.rss[0])
                )
                .as_str()
            )
        );
        assert_eq!(cond(&w.d, AVAILABLE).unwrap().status, "True");
        // a resync changes nothing
        let owned: Vec<&ReplicaSet> = w.rss.iter().collect();
        let pods: Vec<&Pod> = w.pods.iter().collect();
        assert!(plan(&w.d, &owned, &pods, ts(w.now + 1000)).is_empty());
    }

    #[test]
    fn rolling_update_never_drops_below_desired_availability() {
        let mut w = rolled_out("nginx:1.21", 3);
        set_image(&mut w.d, "nginx:1.22");
        let check = |w: &World| {
            assert!(
                w.available() >= 3,
                "available {} at t={}",
                w.available(),
                w.now
            );
            assert!(w.pods.len() <= 4, "surge exceeded: {} pods", w.pods.len());
        };
        w.converge(&check);
        let old = w.rs("nginx:1.21");
        let new = w.rs("nginx:1.22");
        assert_eq!(rs_replicas(old), 0);
        assert_eq!(rs_status_replicas(old), 0);
        assert_eq!(rs_replicas(new), 3);
        assert_eq!(rs_available(new), 3);
        assert_eq!(annotation(&new.metadata, REVISION_ANNOTATION), Some("2"));
        assert_eq!(annotation(&w.d.metadata, REVISION_ANNOTATION), Some("2"));
        assert!(rollout_status_done(&w.d), "{:?}", w.d.status);
        let s = w.d.status.as_ref().unwrap();
        assert_eq!(
            (
                s.replicas,
                s.updated_replicas,
                s.available_replicas,
                s.observed_generation
            ),
            (Some(3), Some(3), Some(3), Some(2))
        );
        assert_eq!(
            cond(&w.d, PROGRESSING).unwrap().reason.as_deref(),
            Some(NEW_RS_AVAILABLE)
        );
    }

    #[test]
    fn rollback_scales_the_old_replica_set_up_and_bumps_its_revision() {
        let mut w = rolled_out("nginx:1.21", 3);
        set_image(&mut w.d, "nginx:1.22");
        w.converge(&no_check);
        let old_name = rs_name(w.rs("nginx:1.21"));
        set_image(&mut w.d, "nginx:1.21");
        w.deploy_step();
        assert!(
            !w.actions
                .iter()
                .any(|a| matches!(a, Action::CreateReplicaSet(_))),
            "{:?}",
            w.actions
        );
        let Some(Action::UpdateReplicaSet(rs)) = w.actions.first() else {
            panic!("{:?}", w.actions);
        };
        assert_eq!(rs_name(rs), old_name);
        assert_eq!(annotation(&rs.metadata, REVISION_ANNOTATION), Some("3"));
        assert_eq!(
            annotation(&rs.metadata, REVISION_HISTORY_ANNOTATION),
            Some("1")
        );
        assert_eq!(rs_replicas(rs), 1, "surge of one");
        let check = |w: &World| assert!(w.available() >= 3);
        w.converge(&check);
        assert_eq!(w.rss.len(), 2);
        assert_eq!(rs_replicas(w.rs("nginx:1.21")), 3);
        assert_eq!(rs_replicas(w.rs("nginx:1.22")), 0);
        assert_eq!(annotation(&w.d.metadata, REVISION_ANNOTATION), Some("3"));
        assert!(rollout_status_done(&w.d));
    }

    fn recreate(mut d: Deployment) -> Deployment {
        d.spec.as_mut().unwrap().strategy = Some(DeploymentStrategy {
            type_: Some("Recreate".into()),
            rolling_update: None,
        });
        d
    }

    #[test]
    fn recreate_waits_for_old_pods_to_be_gone() {
        let mut w = World::new(recreate(deployment("nginx:1.21", 3)));
        w.converge(&no_check);
        set_image(&mut w.d, "nginx:1.22");

        // 1. the old ReplicaSet goes to zero, nothing new yet
        w.deploy_step();
        assert!(!w
            .actions
            .iter()
            .any(|a| matches!(a, Action::CreateReplicaSet(_))));
        let Some(Action::UpdateReplicaSet(rs)) = w.actions.first() else {
            panic!("{:?}", w.actions);
        };
        assert_eq!(rs_replicas(rs), 0);

        // 2. its pods are terminating, and its status already says zero: still wait
        for p in &mut w.pods {
            p.metadata.deletion_timestamp = Some(Time(ts(w.now)));
        }
        w.rss[0].status = Some(Default::default());
        w.deploy_step();
        assert!(
            !w.actions
                .iter()
                .any(|a| matches!(a, Action::CreateReplicaSet(_) | Action::UpdateReplicaSet(_))),
            "{:?}",
            w.actions
        );

        // 3. pods gone: the new ReplicaSet is created at full size
        w.pods.clear();
        w.deploy_step();
        let created: Vec<&ReplicaSet> = w
            .actions
            .iter()
            .filter_map(|a| match a {
                Action::CreateReplicaSet(rs) => Some(rs),
                _ => None,
            })
            .collect();
        assert_eq!(created.len(), 1);
        assert_eq!(rs_replicas(created[0]), 3);
        assert_eq!(
            annotation(&created[0].metadata, MAX_REPLICAS_ANNOTATION),
            Some("3")
        );
        w.converge(&no_check);
        assert!(rollout_status_done(&w.d));
        assert_eq!(rs_replicas(w.rs("nginx:1.21")), 0);
    }

    #[test]
    fn fenceposts_round_surge_up_and_unavailable_down() {
        assert_eq!(
            resolve_fenceposts(Some(&pct("25%")), Some(&pct("25%")), 10),
            (3, 2)
        );
        assert_eq!(
            resolve_fenceposts(None, None, 10),
            (3, 2),
            "defaults are 25%"
        );
        assert_eq!(resolve_fenceposts(Some(&int(0)), Some(&int(0)), 10), (0, 1));
        assert_eq!(
            resolve_fenceposts(Some(&pct("0%")), Some(&pct("10%")), 5),
            (0, 1),
            "10% of 5 rounds to 0"
        );
        assert_eq!(
            resolve_fenceposts(Some(&pct("30%")), Some(&pct("30%")), 3),
            (1, 0)
        );
        assert_eq!(
            resolve_fenceposts(Some(&pct("bogus")), Some(&int(2)), 3),
            (0, 2)
        );
        let mut d = deployment("x", 2);
        d.spec
            .as_mut()
            .unwrap()
            .strategy
            .as_mut()
            .unwrap()
            .rolling_update = Some(RollingUpdateDeployment {
            max_surge: Some(int(0)),
            max_unavailable: Some(int(5)),
        });
        assert_eq!(max_unavailable(&d), 2, "capped at replicas");
        assert_eq!(max_surge(&recreate(d.clone())), 0);
        assert_eq!(max_unavailable(&recreate(d)), 0);
    }

    fn old_rs(name: &str, image: &str, revision: i64, replicas: i32, age: i64) -> ReplicaSet {
        ReplicaSet {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                uid: Some(format!("uid-{name}")),
                generation: Some(1),
                creation_timestamp: Some(Time(ts(age))),
                annotations: Some(labels(&[
                    (REVISION_ANNOTATION, &revision.to_string()),
                    (DESIRED_REPLICAS_ANNOTATION, "3"),
                    (MAX_REPLICAS_ANNOTATION, "4"),
                ])),
                ..Default::default()
            },
            spec: Some(ReplicaSetSpec {
                replicas: Some(replicas),
                template: Some(template(image)),
                ..Default::default()
            }),
            status: Some(k8s_openapi::api::apps::v1::ReplicaSetStatus {
                replicas,
                ready_replicas: Some(replicas),
                available_replicas: Some(replicas),
                observed_generation: Some(1),
                ..Default::default()
            }),
        }
    }

    fn complete_status(d: &Deployment, replicas: i32) -> DeploymentStatus {
        DeploymentStatus {
            observed_generation: d.metadata.generation,
            replicas: Some(replicas),
            updated_replicas: Some(replicas),
            ready_replicas: Some(replicas),
            available_replicas: Some(replicas),
            conditions: Some(vec![
                new_cond(
                    AVAILABLE,
                    "True",
                    MINIMUM_REPLICAS_AVAILABLE,
                    "Deployment has minimum availability.".into(),
                    ts(0),
                ),
                new_cond(PROGRESSING, "True", NEW_RS_AVAILABLE, "done".into(), ts(0)),
            ]),
            ..Default::default()
        }
    }

    #[test]
    fn revision_history_limit_deletes_the_oldest_empty_replica_sets() {
        let mut d = deployment("v5", 3);
        d.spec.as_mut().unwrap().revision_history_limit = Some(2);
        d.status = Some(complete_status(&d, 3));
        d.metadata.annotations = Some(labels(&[(REVISION_ANNOTATION, "6")]));
        let mut busy = old_rs("busy", "v0", 1, 0, 0);
        busy.status.as_mut().unwrap().replicas = 1; // pods still terminating
        let rss = [
            busy,
            old_rs("r1", "v1", 2, 0, 1),
            old_rs("r2", "v2", 3, 0, 2),
            old_rs("r3", "v3", 4, 0, 3),
            old_rs("r4", "v4", 5, 0, 4),
            old_rs("cur", "v5", 6, 3, 5),
        ];
        let refs: Vec<&ReplicaSet> = rss.iter().collect();
        let actions = plan(&d, &refs, &[], ts(100));
        let deletes: Vec<Action> = actions
            .into_iter()
            .filter(|a| matches!(a, Action::DeleteReplicaSet { .. }))
            .collect();
        assert_eq!(
            deletes,
            vec![
                Action::DeleteReplicaSet { name: "r1".into() },
                Action::DeleteReplicaSet { name: "r2".into() },
            ]
        );
    }

    #[test]
    fn paused_deployment_does_not_roll_out_but_scales() {
        let mut w = rolled_out("nginx:1.21", 3);
        w.d.spec.as_mut().unwrap().paused = Some(true);
        set_image(&mut w.d, "nginx:1.22");
        w.converge(&no_check);
        assert_eq!(w.rss.len(), 1, "no new ReplicaSet while paused");
        let p = cond(&w.d, PROGRESSING).unwrap();
        assert_eq!(
            (p.status.as_str(), p.reason.as_deref()),
            ("Unknown", Some(PAUSED))
        );
        assert_eq!(annotation(&w.d.metadata, REVISION_ANNOTATION), Some("1"));

        // scaling still applies
        w.d.spec.as_mut().unwrap().replicas = Some(5);
        w.converge(&no_check);
        assert_eq!(rs_replicas(&w.rss[0]), 5);
        assert_eq!(
            annotation(&w.rss[0].metadata, DESIRED_REPLICAS_ANNOTATION),
            Some("5")
        );

        // resume: the rollout happens
        w.d.spec.as_mut().unwrap().paused = Some(false);
        w.deploy_step();
        assert!(w
            .actions
            .iter()
            .any(|a| matches!(a, Action::CreateReplicaSet(_))));
        w.converge(&no_check);
        assert_eq!(rs_replicas(w.rs("nginx:1.22")), 5);
        assert!(rollout_status_done(&w.d));
    }

    #[test]
    fn scaling_without_rollout_scales_the_new_replica_set() {
        let mut w = rolled_out("nginx:1.21", 3);
        w.d.spec.as_mut().unwrap().replicas = Some(6);
        w.d.metadata.generation = Some(2);
        w.deploy_step();
        let Some(Action::UpdateReplicaSet(rs)) = w.actions.first() else {
            panic!("{:?}", w.actions);
        };
        assert_eq!(rs_replicas(rs), 6);
        assert_eq!(
            annotation(&rs.metadata, DESIRED_REPLICAS_ANNOTATION),
            Some("6")
        );
        assert_eq!(annotation(&rs.metadata, MAX_REPLICAS_ANNOTATION), Some("7"));
        w.converge(&no_check);
        assert_eq!(w.available(), 6);
        assert!(rollout_status_done(&w.d));
    }

    #[test]
    fn proportional_scaling_during_a_rollout() {
        let mut d = deployment("new", 20);
        d.spec
            .as_mut()
            .unwrap()
            .strategy
            .as_mut()
            .unwrap()
            .rolling_update = Some(RollingUpdateDeployment {
            max_surge: Some(pct("25%")),
            max_unavailable: Some(pct("25%")),
        });
        let mut old = old_rs("old", "old", 1, 8, 0);
        let mut new = old_rs("new", "new", 2, 5, 1);
        for rs in [&mut old, &mut new] {
            let ann = rs.metadata.annotations.as_mut().unwrap();
            ann.insert(DESIRED_REPLICAS_ANNOTATION.into(), "10".into());
            ann.insert(MAX_REPLICAS_ANNOTATION.into(), "13".into());
        }
        let actions = plan(&d, &[&old, &new], &[], ts(0));
        let sizes: BTreeMap<String, (i32, Option<String>)> = actions
            .iter()
            .filter_map(|a| match a {
                Action::UpdateReplicaSet(rs) => Some((
                    rs_name(rs),
                    (
                        rs_replicas(rs),
                        annotation(&rs.metadata, MAX_REPLICAS_ANNOTATION).map(String::from),
                    ),
                )),
                _ => None,
            })
            .collect();
        assert_eq!(sizes.get("old"), Some(&(15, Some("25".into()))));
        assert_eq!(sizes.get("new"), Some(&(10, Some("25".into()))));
    }

    #[test]
    fn progress_deadline_exceeded() {
        let mut d = deployment("v1", 3);
        d.spec.as_mut().unwrap().progress_deadline_seconds = Some(60);
        let hash = pod_template_hash(&template("v1"), None);
        let mut rs = old_rs(&format!("web-{hash}"), "v1", 1, 3, 0);
        rs.status.as_mut().unwrap().available_replicas = Some(1);
        rs.status.as_mut().unwrap().ready_replicas = Some(1);
        d.metadata.annotations = Some(labels(&[(REVISION_ANNOTATION, "1")]));
        let mut status = DeploymentStatus {
            observed_generation: Some(1),
            replicas: Some(3),
            updated_replicas: Some(3),
            ready_replicas: Some(1),
            available_replicas: Some(1),
            unavailable_replicas: Some(2),
            conditions: Some(vec![
                new_cond(
                    AVAILABLE,
                    "True",
                    MINIMUM_REPLICAS_AVAILABLE,
                    "Deployment has minimum availability.".into(),
                    ts(0),
                ),
                new_cond(PROGRESSING, "True", RS_UPDATED, "x".into(), ts(0)),
            ]),
            ..Default::default()
        };
        // max unavailable 0 with surge 1: one available of three is below the minimum
        status.conditions.as_mut().unwrap()[0] = new_cond(
            AVAILABLE,
            "False",
            MINIMUM_REPLICAS_UNAVAILABLE,
            "Deployment does not have minimum availability.".into(),
            ts(0),
        );
        d.status = Some(status);

        let early = plan(&d, &[&rs], &[], ts(30));
        assert_eq!(early, vec![Action::RequeueAfter(Duration::from_secs(31))]);

        let late = plan(&d, &[&rs], &[], ts(61));
        let Some(Action::UpdateStatus(s)) =
            late.iter().find(|a| matches!(a, Action::UpdateStatus(_)))
        else {
            panic!("{late:?}");
        };
        let p = get_cond(s, PROGRESSING).unwrap();
        assert_eq!(
            (p.status.as_str(), p.reason.as_deref()),
            ("False", Some(TIMED_OUT))
        );
        assert_eq!(
            p.message.as_deref(),
            Some(format!("ReplicaSet \"web-{hash}\" has timed out progressing.").as_str())
        );
        assert_eq!(p.last_transition_time, Some(Time(ts(61))));
        let mut timed_out = d.clone();
        timed_out.status = Some(s.clone());
        assert!(!rollout_status_done(&timed_out));
        // it stays timed out, without requeues
        assert!(plan(&timed_out, &[&rs], &[], ts(200)).is_empty());
    }

    #[test]
    fn progressing_condition_keeps_its_transition_time_while_progressing() {
        let mut w = rolled_out("nginx:1.21", 3);
        let since = cond(&w.d, PROGRESSING)
            .unwrap()
            .last_transition_time
            .clone();
        set_image(&mut w.d, "nginx:1.22");
        w.converge(&no_check);
        let p = cond(&w.d, PROGRESSING).unwrap();
        assert_eq!(
            p.last_transition_time, since,
            "status stayed True throughout"
        );
        assert!(
            p.last_update_time > since,
            "lastUpdateTime follows the progress"
        );
    }

    #[test]
    fn template_hash_is_stable_and_distinguishes_templates() {
        let a = pod_template_hash(&template("nginx:1.21"), None);
        assert_eq!(a, pod_template_hash(&template("nginx:1.21"), None));
        assert_ne!(a, pod_template_hash(&template("nginx:1.22"), None));
        assert_ne!(a, pod_template_hash(&template("nginx:1.21"), Some(1)));
        assert!(a.chars().all(|c| "bcdfghjklmnpqrstvwxz2456789".contains(c)));
        assert!((1..=10).contains(&a.len()));
        // absent and empty maps hash alike
        let mut t = template("nginx:1.21");
        t.metadata.as_mut().unwrap().annotations = Some(BTreeMap::new());
        assert_eq!(a, pod_template_hash(&t, None));
    }

    #[test]
    fn template_equality_ignores_the_hash_label_and_empty_maps() {
        let mut with_hash = template("v1");
        with_hash
            .metadata
            .as_mut()
            .unwrap()
            .labels
            .as_mut()
            .unwrap()
            .insert(POD_TEMPLATE_HASH_LABEL.into(), "abc".into());
        with_hash.metadata.as_mut().unwrap().annotations = Some(BTreeMap::new());
        assert!(equal_ignore_hash(&with_hash, &template("v1")));
        assert!(!equal_ignore_hash(&with_hash, &template("v2")));
        let mut with_empty_dir = template("v1");
        with_empty_dir.spec.as_mut().unwrap().volumes = Some(vec![Volume {
            name: "scratch".into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Default::default()
        }]);
        let mut without = with_empty_dir.clone();
        without.spec.as_mut().unwrap().volumes.as_mut().unwrap()[0].empty_dir = None;
        assert!(!equal_ignore_hash(&with_empty_dir, &without));
        // the zero fields a protobuf client sends equal their absence
        let mut zeros = template("v1");
        zeros.spec.as_mut().unwrap().host_ipc = Some(false);
        zeros.spec.as_mut().unwrap().containers[0].stdin = Some(false);
        zeros.metadata.as_mut().unwrap().generation = Some(0);
        assert!(equal_ignore_hash(&zeros, &template("v1")));
    }

    #[test]
    fn hash_collision_bumps_the_collision_count() {
        let d = deployment("v2", 3);
        let hash = pod_template_hash(&template("v2"), None);
        // an owned ReplicaSet with the new name but another template
        let squatter = old_rs(&format!("web-{hash}"), "v1", 1, 3, 0);
        let actions = plan(&d, &[&squatter], &[], ts(0));
        assert!(!actions
            .iter()
            .any(|a| matches!(a, Action::CreateReplicaSet(_))));
        let Some(Action::UpdateStatus(s)) = actions
            .iter()
            .find(|a| matches!(a, Action::UpdateStatus(_)))
        else {
            panic!("{actions:?}");
        };
        assert_eq!(s.collision_count, Some(1));
        let mut d2 = d.clone();
        d2.status = Some(s.clone());
        let actions = plan(&d2, &[&squatter], &[], ts(1));
        let Some(Action::CreateReplicaSet(rs)) = actions.first() else {
            panic!("{actions:?}");
        };
        assert_eq!(
            rs_name(rs),
            format!("web-{}", pod_template_hash(&template("v2"), Some(1)))
        );
        assert_eq!(with_collision_count_bumped(&d2).collision_count, Some(2));
    }

    #[test]
    fn deployment_annotations_are_copied_to_the_new_replica_set() {
        let mut d = deployment("v1", 1);
        d.metadata.annotations = Some(labels(&[
            ("kubernetes.io/change-cause", "first"),
            ("kubectl.kubernetes.io/last-applied-configuration", "{}"),
        ]));
        let actions = plan(&d, &[], &[], ts(0));
        let Some(Action::CreateReplicaSet(rs)) = actions.first() else {
            panic!("{actions:?}");
        };
        assert_eq!(
            annotation(&rs.metadata, "kubernetes.io/change-cause"),
            Some("first")
        );
        assert_eq!(
            annotation(
                &rs.metadata,
                "kubectl.kubernetes.io/last-applied-configuration"
            ),
            None
        );
    }

    #[test]
    fn selector_selecting_everything_only_observes_the_generation() {
        let mut d = deployment("v1", 1);
        d.spec.as_mut().unwrap().selector = Default::default();
        let actions = plan(&d, &[], &[], ts(0));
        assert!(!actions
            .iter()
            .any(|a| matches!(a, Action::CreateReplicaSet(_))));
        assert!(actions
            .iter()
            .any(|a| matches!(a, Action::UpdateStatus(s) if s.observed_generation == Some(1))));
    }

    #[test]
    fn replica_failure_of_the_new_replica_set_is_reported() {
        let mut w = rolled_out("v1", 2);
        w.rss[0].status.as_mut().unwrap().conditions =
            Some(vec![k8s_openapi::api::apps::v1::ReplicaSetCondition {
                type_: REPLICA_FAILURE.into(),
                status: "True".into(),
                reason: Some("FailedCreate".into()),
                message: Some("pods \"web-x\" is forbidden: exceeded quota".into()),
                last_transition_time: Some(Time(ts(5))),
            }]);
        w.deploy_step();
        let c = cond(&w.d, REPLICA_FAILURE).unwrap();
        assert_eq!(c.reason.as_deref(), Some("FailedCreate"));
        assert_eq!(c.last_update_time, Some(Time(ts(5))));
        w.rss[0].status.as_mut().unwrap().conditions = None;
        w.deploy_step();
        assert!(cond(&w.d, REPLICA_FAILURE).is_none());
    }

    #[test]
    fn terminating_deployment_only_updates_its_status() {
        let mut w = rolled_out("v1", 2);
        w.d.metadata.deletion_timestamp = Some(Time(ts(w.now)));
        set_image(&mut w.d, "v2");
        w.deploy_step();
        assert!(
            w.actions
                .iter()
                .all(|a| matches!(a, Action::UpdateStatus(_))),
            "{:?}",
            w.actions
        );
    }

    #[test]
    fn odd_input_does_not_panic() {
        let d = Deployment::default();
        let _ = plan(&d, &[&ReplicaSet::default()], &[&Pod::default()], ts(0));
        let mut d = deployment("v1", 0);
        d.spec.as_mut().unwrap().strategy = Some(DeploymentStrategy::default());
        let _ = plan(&d, &[&ReplicaSet::default()], &[], ts(0));
    }
}
