//! The ReplicaSet planner: from a ReplicaSet and the pods of its namespace to the pods to create,
//! delete, adopt and release, and the status to write (upstream `pkg/controller/replicaset`).
//!
//! Pure: no I/O, no clock. The executor creates pods from [`pod_template`], deletes the pods named
//! in [`RsPlan::delete`] in that order, patches owner references for adoption and release, and
//! writes [`RsPlan::status`] when [`RsPlan::status_changed`].
//!
//! Differences from upstream, all deliberate:
//! - a ReplicaSet whose selector is empty adopts nothing (upstream's validation forbids such a
//!   selector; were one stored, upstream would adopt every orphan of the namespace);
//! - in the deletion ranking, pods ready (or created) within the same logarithmic time bucket
//!   are ordered by restart count before their uid (upstream orders by uid first); this keeps the
//!   ranking a total order;
//! - "related pods" for the co-location rank are the pods matching this ReplicaSet's selector
//!   (and its siblings' when the executor passes them to [`plan_with_siblings`]).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::apps::v1::{ReplicaSet, ReplicaSetCondition, ReplicaSetStatus};
use k8s_openapi::api::core::v1::{Pod, PodCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as metav1;
use metav1::{ObjectMeta, OwnerReference, Time};

use crate::selector::LabelSelector;

/// Upstream's `burstReplicas`: at most this many pods are created or deleted per sync.
pub const BURST_REPLICAS: usize = 500;

/// The annotation whose integer value makes a pod cheaper (lower) or dearer to delete.
pub const POD_DELETION_COST_ANNOTATION: &str = "controller.kubernetes.io/pod-deletion-cost";

/// The ReplicaSet condition type the executor sets when creating or deleting pods fails.
pub const REPLICA_FAILURE: &str = "ReplicaFailure";

/// The reason of the [`REPLICA_FAILURE`] condition after a failed pod creation.
pub const FAILED_CREATE_REASON: &str = "FailedCreate";

/// The reason of the [`REPLICA_FAILURE`] condition after a failed pod deletion.
pub const FAILED_DELETE_REASON: &str = "FailedDelete";

/// What the ReplicaSet controller should do for one ReplicaSet.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RsPlan {
    /// Pods to create from [`pod_template`] (the executor creates them with generateName
    /// `"<rs-name>-"`, the template's labels/annotations/spec, and a controller ownerReference
    /// with blockOwnerDeletion to the ReplicaSet).
    pub create: usize,
    /// Names of pods to delete, best candidates first.
    pub delete: Vec<String>,
    /// Pods matching the selector without a controller ownerReference: adopt (the executor
    /// patches in the ownerReference from [`controller_ref`]).
    pub adopt: Vec<String>,
    /// Pods owned (controller ref uid == rs uid) that no longer match the selector: release
    /// (the executor removes the ownerReference).
    pub release: Vec<String>,
    /// The status to write if it differs from the current one (see `status_changed`). It assumes
    /// the creations and deletions succeed, so it carries no `ReplicaFailure` condition; on a
    /// failure, write [`with_failure_condition`] of it instead.
    pub status: ReplicaSetStatus,
    /// Whether `status` differs from the observed status (ignoring `None` versus zero).
    pub status_changed: bool,
    /// Sync again after this long: a ready pod will become available once `minReadySeconds`
    /// have passed (upstream requeues after `minReadySeconds`).
    pub requeue_after: Option<Duration>,
}

/// The controller ownerReference of an object, if any.
pub fn controller_of(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
}

/// The controller ownerReference pointing at a ReplicaSet (for pods it creates or adopts).
pub fn controller_ref(rs: &ReplicaSet) -> OwnerReference {
    OwnerReference {
        api_version: "apps/v1".to_string(),
        kind: "ReplicaSet".to_string(),
        name: rs.metadata.name.clone().unwrap_or_default(),
        uid: rs.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// The pod to create for a ReplicaSet (upstream `GetPodFromTemplate`): generateName
/// `"<rs-name>-"`, the template's labels, annotations, finalizers and spec, the ReplicaSet's
/// namespace and a controller ownerReference to it.
pub fn pod_template(rs: &ReplicaSet) -> Pod {
    let template = rs.spec.as_ref().and_then(|s| s.template.as_ref());
    let tmeta = template.and_then(|t| t.metadata.as_ref());
    Pod {
        metadata: ObjectMeta {
            generate_name: Some(format!(
                "{}-",
                rs.metadata.name.as_deref().unwrap_or_default()
            )),
            namespace: rs.metadata.namespace.clone(),
            labels: tmeta.and_then(|m| m.labels.clone()),
            annotations: tmeta.and_then(|m| m.annotations.clone()),
            finalizers: tmeta.and_then(|m| m.finalizers.clone()),
            owner_references: Some(vec![controller_ref(rs)]),
            ..ObjectMeta::default()
        },
        spec: template.and_then(|t| t.spec.clone()),
        status: None,
    }
}

/// Whether a pod counts towards a ReplicaSet: not terminating and not in phase Succeeded or
/// Failed (upstream `IsPodActive`).
pub fn is_pod_active(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    pod.metadata.deletion_timestamp.is_none()
        && phase != Some("Succeeded")
        && phase != Some("Failed")
}

fn ready_condition(pod: &Pod) -> Option<&PodCondition> {
    pod.status
        .as_ref()?
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Ready")
}

/// Whether the pod's Ready condition is True (upstream `IsPodReady`).
pub fn is_pod_ready(pod: &Pod) -> bool {
    ready_condition(pod).is_some_and(|c| c.status == "True")
}

/// Whether a pod is available: ready, and ready for more than `min_ready_seconds` according to
/// the Ready condition's lastTransitionTime (upstream `IsPodAvailable`; with a positive
/// `min_ready_seconds` a missing transition time means not available).
pub fn is_pod_available(pod: &Pod, min_ready_seconds: i32, now: Timestamp) -> bool {
    if !is_pod_ready(pod) {
        return false;
    }
    if min_ready_seconds <= 0 {
        return true;
    }
    match ready_condition(pod).and_then(|c| c.last_transition_time.as_ref()) {
        Some(Time(t)) => {
            let deadline = t.checked_add(jiff::SignedDuration::from_secs(i64::from(
                min_ready_seconds,
            )));
            deadline.is_ok_and(|d| d < now)
        }
        None => false,
    }
}

/// How long until a ready pod becomes available, `None` when it is not ready or already
/// available.
fn time_to_available(pod: &Pod, min_ready_seconds: i32, now: Timestamp) -> Option<Duration> {
    if min_ready_seconds <= 0 || !is_pod_ready(pod) || is_pod_available(pod, min_ready_seconds, now)
    {
        return None;
    }
    let min_ready = Duration::from_secs(u64::try_from(min_ready_seconds).unwrap_or(0));
    let Some(Time(since)) = ready_condition(pod).and_then(|c| c.last_transition_time.as_ref())
    else {
        return Some(min_ready);
    };
    let elapsed = now.duration_since(*since);
    let elapsed = Duration::try_from(elapsed).unwrap_or(Duration::ZERO);
    // available once strictly past the deadline: add a second of margin
    Some(min_ready.saturating_sub(elapsed) + Duration::from_secs(1))
}

/// A ReplicaSet's selector, `None` when it cannot be parsed.
fn parse_selector(sel: &metav1::LabelSelector) -> Option<LabelSelector> {
    LabelSelector::from_api(sel).ok()
}

fn labels_of(meta: &ObjectMeta) -> BTreeMap<String, String> {
    meta.labels.clone().unwrap_or_default()
}

fn same_namespace(a: &ObjectMeta, b: &ObjectMeta) -> bool {
    a.namespace.as_deref().unwrap_or_default() == b.namespace.as_deref().unwrap_or_default()
}

/// Plans one sync of a ReplicaSet given every pod of its namespace (upstream `syncReplicaSet`).
/// See [`plan_with_siblings`]; this one ranks co-located pods by this ReplicaSet's pods only.
pub fn plan(rs: &ReplicaSet, pods: &[&Pod], now: Timestamp) -> RsPlan {
    plan_with_siblings(rs, &[], pods, now)
}

/// Plans one sync of a ReplicaSet. `siblings` are the other ReplicaSets with the same controller
/// (the Deployment's other ReplicaSets): their pods count as "related" when ranking pods for
/// deletion, so that a pod sharing its node with more pods of the Deployment goes first.
///
/// An unparsable selector plans nothing (upstream returns an error before claiming).
pub fn plan_with_siblings(
    rs: &ReplicaSet,
    siblings: &[&ReplicaSet],
    pods: &[&Pod],
    now: Timestamp,
) -> RsPlan {
    let spec = rs.spec.clone().unwrap_or_default();
    let current = rs.status.clone().unwrap_or_default();
    let Some(selector) = parse_selector(&spec.selector) else {
        return RsPlan {
            status: current,
            ..RsPlan::default()
        };
    };
    let rs_uid = rs.metadata.uid.as_deref().unwrap_or_default();
    let rs_terminating = rs.metadata.deletion_timestamp.is_some();
    let min_ready = spec.min_ready_seconds.unwrap_or(0);

    // claim: owned and matching pods, plus orphans to adopt (upstream ClaimPods over active pods)
    let mut claimed: Vec<&Pod> = Vec::new();
    let mut adopt = Vec::new();
    let mut release = Vec::new();
    for &pod in pods {
        if !same_namespace(&rs.metadata, &pod.metadata) || !is_pod_active(pod) {
            continue;
        }
        let labels = labels_of(&pod.metadata);
        let matches = selector.matches(&labels);
        let name = pod.metadata.name.clone().unwrap_or_default();
        match controller_of(&pod.metadata) {
            Some(owner) => {
                if rs_uid.is_empty() || owner.uid != rs_uid {
                    continue; // another controller's pod
                }
                if matches {
                    claimed.push(pod);
                } else if !rs_terminating {
                    release.push(name);
                }
            }
            None => {
                if matches && !selector.is_empty() && !rs_terminating && !rs_uid.is_empty() {
                    adopt.push(name);
                    claimed.push(pod);
                }
            }
        }
    }

    let replicas = usize::try_from(spec.replicas.unwrap_or(1)).unwrap_or(0);
    let mut create = 0;
    let mut delete = Vec::new();
    if !rs_terminating {
        if claimed.len() < replicas {
            create = (replicas - claimed.len()).min(BURST_REPLICAS);
        } else if claimed.len() > replicas {
            let n = (claimed.len() - replicas).min(BURST_REPLICAS);
            let related = related_pods(rs, siblings, pods, &selector);
            delete = pods_to_delete(&claimed, &related, n, now);
        }
    }

    let status = calculate_status(rs, &claimed, min_ready, now);
    let status_changed = normalize_status(&current) != normalize_status(&status);
    let requeue_after = claimed
        .iter()
        .filter_map(|p| time_to_available(p, min_ready, now))
        .min();
    RsPlan {
        create,
        delete,
        adopt,
        release,
        status,
        status_changed,
        requeue_after,
    }
}

/// Upstream `getIndirectlyRelatedPods`: the pods matching the selector of any ReplicaSet with the
/// same controller; none when the ReplicaSet has no controller.
fn related_pods<'a>(
    rs: &ReplicaSet,
    siblings: &[&ReplicaSet],
    pods: &[&'a Pod],
    own: &LabelSelector,
) -> Vec<&'a Pod> {
    let Some(owner) = controller_of(&rs.metadata) else {
        return Vec::new();
    };
    let mut selectors = vec![own.clone()];
    for s in siblings {
        let same_owner = controller_of(&s.metadata).is_some_and(|o| o.uid == owner.uid);
        if same_owner && s.metadata.uid != rs.metadata.uid {
            if let Some(sel) = s.spec.as_ref().and_then(|sp| parse_selector(&sp.selector)) {
                if !sel.is_empty() {
                    selectors.push(sel);
                }
            }
        }
    }
    pods.iter()
        .copied()
        .filter(|p| same_namespace(&rs.metadata, &p.metadata))
        .filter(|p| {
            let labels = labels_of(&p.metadata);
            selectors.iter().any(|s| s.matches(&labels))
        })
        .collect()
}

/// The sort key of upstream's `ActivePodsWithRanks`: smaller keys are deleted first.
type DeletionKey = (
    bool,           // 1. unassigned < assigned
    u8,             // 2. Pending < Unknown < Running
    bool,           // 3. not ready < ready
    i32,            // 4. lower pod-deletion-cost first
    Reverse<usize>, // 5. more co-located related pods first
    (bool, i64),    // 6. ready for a shorter time first (logarithmic buckets)
    Reverse<i32>,   // 7. more restarts (regular containers) first
    Reverse<i32>,   //    then more restarts of sidecars
    (bool, i64),    // 8. newer first (logarithmic buckets)
    String,         //    uid
    String,         //    name
);

/// The names of the `n` pods to delete, best candidates first (upstream `getPodsToDelete`).
fn pods_to_delete(claimed: &[&Pod], related: &[&Pod], n: usize, now: Timestamp) -> Vec<String> {
    let mut on_node: BTreeMap<&str, usize> = BTreeMap::new();
    for p in related.iter().filter(|p| is_pod_active(p)) {
        *on_node.entry(node_name(p)).or_default() += 1;
    }
    let mut keyed: Vec<(DeletionKey, &Pod)> = claimed
        .iter()
        .map(|&p| {
            (
                deletion_key(p, on_node.get(node_name(p)).copied().unwrap_or(0), now),
                p,
            )
        })
        .collect();
    keyed.sort_by(|a, b| a.0.cmp(&b.0));
    keyed
        .into_iter()
        .take(n)
        .map(|(_, p)| p.metadata.name.clone().unwrap_or_default())
        .collect()
}

fn node_name(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or_default()
}

fn deletion_key(pod: &Pod, rank: usize, now: Timestamp) -> DeletionKey {
    let status = pod.status.as_ref();
    let phase = match status.and_then(|s| s.phase.as_deref()) {
        Some("Unknown") => 1,
        Some("Running") => 2,
        _ => 0,
    };
    let ready = is_pod_ready(pod);
    let ready_since = if ready {
        ready_condition(pod).and_then(|c| c.last_transition_time.as_ref())
    } else {
        None
    };
    let (regular, sidecar) = max_container_restarts(pod);
    (
        !node_name(pod).is_empty(),
        phase,
        ready,
        deletion_cost(pod),
        Reverse(rank),
        time_key(ready_since, now),
        Reverse(regular),
        Reverse(sidecar),
        time_key(pod.metadata.creation_timestamp.as_ref(), now),
        pod.metadata.uid.clone().unwrap_or_default(),
        pod.metadata.name.clone().unwrap_or_default(),
    )
}

/// Zero times first, then by upstream's `logarithmicRankDiff` bucket (floor of log2 of the age
/// in nanoseconds, -1 when not in the past): younger first.
fn time_key(t: Option<&Time>, now: Timestamp) -> (bool, i64) {
    match t {
        None => (false, 0),
        Some(Time(t)) => {
            let age = now.duration_since(*t).as_nanos();
            let bucket = if age > 0 {
                127 - i64::from(age.leading_zeros())
            } else {
                -1
            };
            (true, bucket)
        }
    }
}

/// The pod's deletion cost annotation; zero when absent or invalid (upstream
/// `GetDeletionCostFromPodAnnotations` errors are ignored by the ranking).
fn deletion_cost(pod: &Pod) -> i32 {
    let Some(v) = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(POD_DELETION_COST_ANNOTATION))
    else {
        return 0;
    };
    let first_ok = v.starts_with('-') || v.starts_with(|c: char| c.is_ascii_digit());
    if !first_ok {
        return 0;
    }
    v.parse::<i32>().unwrap_or(0)
}

/// The highest restart count among regular containers and among sidecars (restartable init
/// containers).
fn max_container_restarts(pod: &Pod) -> (i32, i32) {
    let Some(status) = pod.status.as_ref() else {
        return (0, 0);
    };
    let regular = status
        .container_statuses
        .iter()
        .flatten()
        .map(|c| c.restart_count)
        .max()
        .unwrap_or(0)
        .max(0);
    let sidecars: BTreeSet<&str> = pod
        .spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten())
        .filter(|c| c.restart_policy.as_deref() == Some("Always"))
        .map(|c| c.name.as_str())
        .collect();
    let sidecar = status
        .init_container_statuses
        .iter()
        .flatten()
        .filter(|c| sidecars.contains(c.name.as_str()))
        .map(|c| c.restart_count)
        .max()
        .unwrap_or(0)
        .max(0);
    (regular, sidecar)
}

fn count_i32(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

fn nonzero(n: i32) -> Option<i32> {
    (n != 0).then_some(n)
}

/// Upstream `calculateStatus` over the claimed pods, without a `ReplicaFailure` condition.
fn calculate_status(
    rs: &ReplicaSet,
    claimed: &[&Pod],
    min_ready: i32,
    now: Timestamp,
) -> ReplicaSetStatus {
    let template_labels: BTreeMap<String, String> = rs
        .spec
        .as_ref()
        .and_then(|s| s.template.as_ref())
        .and_then(|t| t.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    let mut fully_labeled = 0;
    let mut ready = 0;
    let mut available = 0;
    for pod in claimed {
        let labels = labels_of(&pod.metadata);
        if template_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
        {
            fully_labeled += 1;
        }
        if is_pod_ready(pod) {
            ready += 1;
            if is_pod_available(pod, min_ready, now) {
                available += 1;
            }
        }
    }
    let conditions: Vec<ReplicaSetCondition> = rs
        .status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .filter(|c| c.type_ != REPLICA_FAILURE)
        .cloned()
        .collect();
    ReplicaSetStatus {
        replicas: count_i32(claimed.len()),
        fully_labeled_replicas: nonzero(count_i32(fully_labeled)),
        ready_replicas: nonzero(count_i32(ready)),
        available_replicas: nonzero(count_i32(available)),
        observed_generation: rs.metadata.generation.filter(|g| *g != 0),
        conditions: (!conditions.is_empty()).then_some(conditions),
        terminating_replicas: None,
    }
}

/// A status with `None` for zero counts and for empty conditions, for comparisons.
pub fn normalize_status(s: &ReplicaSetStatus) -> ReplicaSetStatus {
    ReplicaSetStatus {
        replicas: s.replicas,
        fully_labeled_replicas: s.fully_labeled_replicas.filter(|n| *n != 0),
        ready_replicas: s.ready_replicas.filter(|n| *n != 0),
        available_replicas: s.available_replicas.filter(|n| *n != 0),
        observed_generation: s.observed_generation.filter(|n| *n != 0),
        conditions: s.conditions.clone().filter(|c| !c.is_empty()),
        terminating_replicas: s.terminating_replicas.filter(|n| *n != 0),
    }
}

/// The status with a `ReplicaFailure` condition (reason `FailedCreate`) for a failed pod
/// creation; see [`with_failure_condition_reason`].
pub fn with_failure_condition(
    status: ReplicaSetStatus,
    message: &str,
    now: Timestamp,
) -> ReplicaSetStatus {
    with_failure_condition_reason(status, FAILED_CREATE_REASON, message, now)
}

/// The status with a `ReplicaFailure` condition (status True, the given reason and message,
/// lastTransitionTime `now`). As upstream, an existing `ReplicaFailure` condition is kept as is.
pub fn with_failure_condition_reason(
    mut status: ReplicaSetStatus,
    reason: &str,
    message: &str,
    now: Timestamp,
) -> ReplicaSetStatus {
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    if conditions.iter().any(|c| c.type_ == REPLICA_FAILURE) {
        return status;
    }
    conditions.push(ReplicaSetCondition {
        type_: REPLICA_FAILURE.to_string(),
        status: "True".to_string(),
        reason: Some(reason.to_string()),
        message: Some(message.to_string()),
        last_transition_time: Some(Time(now)),
    });
    status
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::ReplicaSetSpec;
    use k8s_openapi::api::core::v1::{
        Container, ContainerStatus, PodSpec, PodStatus, PodTemplateSpec,
    };

    pub(crate) fn ts(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn rs(replicas: i32) -> ReplicaSet {
        ReplicaSet {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("default".into()),
                uid: Some("rs-uid".into()),
                generation: Some(2),
                ..Default::default()
            },
            spec: Some(ReplicaSetSpec {
                replicas: Some(replicas),
                selector: metav1::LabelSelector {
                    match_labels: Some(labels(&[("app", "web")])),
                    ..Default::default()
                },
                template: Some(PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some(labels(&[("app", "web"), ("tier", "front")])),
                        annotations: Some(labels(&[("note", "x")])),
                        ..Default::default()
                    }),
                    spec: Some(PodSpec {
                        containers: vec![Container {
                            name: "c".into(),
                            image: Some("nginx".into()),
                            ..Default::default()
                        }],
                        ..Default::default()
                    }),
                }),
                ..Default::default()
            }),
            status: None,
        }
    }

    /// A pod of the RS (owned), running and ready since `ready_since` when given.
    fn pod(name: &str, created: i64) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                uid: Some(format!("uid-{name}")),
                labels: Some(labels(&[("app", "web"), ("tier", "front")])),
                creation_timestamp: Some(Time(ts(created))),
                owner_references: Some(vec![controller_ref(&rs(1))]),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some("n1".into()),
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some("Running".into()),
                ..Default::default()
            }),
        }
    }

    fn ready(mut p: Pod, since: i64) -> Pod {
        let st = p.status.get_or_insert_with(Default::default);
        st.phase = Some("Running".into());
        st.conditions = Some(vec![PodCondition {
            type_: "Ready".into(),
            status: "True".into(),
            last_transition_time: Some(Time(ts(since))),
            ..Default::default()
        }]);
        p
    }

    fn orphan(mut p: Pod) -> Pod {
        p.metadata.owner_references = None;
        p
    }

    fn unscheduled(mut p: Pod) -> Pod {
        p.spec.as_mut().unwrap().node_name = None;
        p.status.as_mut().unwrap().phase = Some("Pending".into());
        p
    }

    fn refs(pods: &[Pod]) -> Vec<&Pod> {
        pods.iter().collect()
    }

    #[test]
    fn creates_missing_pods() {
        let pods = vec![ready(pod("a", 0), 1), ready(pod("b", 0), 1)];
        let p = plan(&rs(3), &refs(&pods), ts(100));
        assert_eq!(p.create, 1);
        assert!(p.delete.is_empty() && p.adopt.is_empty() && p.release.is_empty());
        assert_eq!(p.status.replicas, 2);
        assert_eq!(p.status.ready_replicas, Some(2));
        assert!(p.status_changed);
    }

    #[test]
    fn creation_is_capped_at_burst_replicas() {
        let p = plan(&rs(2000), &[], ts(0));
        assert_eq!(p.create, BURST_REPLICAS);
    }

    #[test]
    fn adopts_orphans_and_deletes_the_worst_pods() {
        let now = 10_000;
        let pods = vec![
            ready(pod("owned-old", 0), 10),
            ready(pod("owned-mid", 100), 110),
            ready(pod("owned-new", 5_000), 5_010),
            orphan(unscheduled(pod("orphan-unscheduled", 9_000))),
            orphan(pod("orphan-notready", 9_000)),
            orphan(ready(pod("orphan-ready-new", 9_900), 9_990)),
            orphan(ready(pod("orphan-ready-old", 20), 30)),
        ];
        let p = plan(&rs(3), &refs(&pods), ts(now));
        let mut adopted = p.adopt.clone();
        adopted.sort();
        assert_eq!(
            adopted,
            vec![
                "orphan-notready",
                "orphan-ready-new",
                "orphan-ready-old",
                "orphan-unscheduled"
            ]
        );
        assert_eq!(p.create, 0);
        assert_eq!(
            p.delete,
            vec![
                "orphan-unscheduled",
                "orphan-notready",
                "orphan-ready-new",
                "owned-new"
            ]
        );
        assert_eq!(p.status.replicas, 7);
    }

    #[test]
    fn pods_of_other_controllers_are_ignored() {
        let mut other = pod("other", 0);
        other.metadata.owner_references.as_mut().unwrap()[0].uid = "someone-else".into();
        let pods = vec![other, pod("mine", 0)];
        let p = plan(&rs(1), &refs(&pods), ts(10));
        assert_eq!(p.create, 0);
        assert!(p.delete.is_empty() && p.adopt.is_empty() && p.release.is_empty());
        assert_eq!(p.status.replicas, 1);
    }

    #[test]
    fn owned_pods_that_no_longer_match_are_released() {
        let mut relabeled = pod("relabeled", 0);
        relabeled.metadata.labels = Some(labels(&[("app", "debug")]));
        let pods = vec![relabeled, pod("kept", 0)];
        let p = plan(&rs(2), &refs(&pods), ts(10));
        assert_eq!(p.release, vec!["relabeled"]);
        assert_eq!(p.create, 1);
        assert_eq!(p.status.replicas, 1);
    }

    #[test]
    fn terminating_and_finished_pods_are_not_counted() {
        let mut terminating = pod("terminating", 0);
        terminating.metadata.deletion_timestamp = Some(Time(ts(5)));
        let mut done = pod("done", 0);
        done.status.as_mut().unwrap().phase = Some("Succeeded".into());
        let mut failed = orphan(pod("failed", 0));
        failed.status.as_mut().unwrap().phase = Some("Failed".into());
        let pods = vec![terminating, done, failed, pod("alive", 0)];
        let p = plan(&rs(2), &refs(&pods), ts(10));
        assert_eq!(p.create, 1);
        assert!(p.adopt.is_empty());
        assert_eq!(p.status.replicas, 1);
    }

    #[test]
    fn terminating_replica_set_neither_creates_nor_adopts() {
        let mut r = rs(3);
        r.metadata.deletion_timestamp = Some(Time(ts(1)));
        let pods = vec![orphan(pod("orphan", 0))];
        let p = plan(&r, &refs(&pods), ts(10));
        assert_eq!(p.create, 0);
        assert!(p.adopt.is_empty() && p.delete.is_empty());
    }

    #[test]
    fn availability_waits_for_min_ready_seconds() {
        let p = ready(pod("a", 0), 100);
        assert!(is_pod_available(&p, 0, ts(100)));
        assert!(!is_pod_available(&p, 10, ts(105)));
        assert!(
            !is_pod_available(&p, 10, ts(110)),
            "strictly after the deadline"
        );
        assert!(is_pod_available(&p, 10, ts(111)));
        assert!(!is_pod_available(&pod("b", 0), 0, ts(200)), "not ready");

        let mut r = rs(1);
        r.spec.as_mut().unwrap().min_ready_seconds = Some(10);
        let pods = vec![p];
        let plan_now = plan(&r, &refs(&pods), ts(105));
        assert_eq!(plan_now.status.ready_replicas, Some(1));
        assert_eq!(plan_now.status.available_replicas, None);
        assert_eq!(plan_now.requeue_after, Some(Duration::from_secs(6)));
        let later = plan(&r, &refs(&pods), ts(111));
        assert_eq!(later.status.available_replicas, Some(1));
        assert_eq!(later.requeue_after, None);
    }

    #[test]
    fn status_counts() {
        let mut partial = ready(pod("partial", 0), 1);
        partial.metadata.labels = Some(labels(&[("app", "web")]));
        let mut r = rs(3);
        r.status = Some(ReplicaSetStatus {
            replicas: 3,
            conditions: Some(vec![ReplicaSetCondition {
                type_: REPLICA_FAILURE.into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        let pods = vec![partial, ready(pod("b", 0), 1), pod("c", 0)];
        let p = plan(&r, &refs(&pods), ts(100));
        assert_eq!(
            p.status,
            ReplicaSetStatus {
                replicas: 3,
                fully_labeled_replicas: Some(2),
                ready_replicas: Some(2),
                available_replicas: Some(2),
                observed_generation: Some(2),
                conditions: None,
                terminating_replicas: None,
            }
        );
        assert!(p.status_changed);
        let mut same = r.clone();
        same.status = Some(p.status.clone());
        assert!(!plan(&same, &refs(&pods), ts(100)).status_changed);
    }

    #[test]
    fn failure_condition_is_added_once() {
        let s = with_failure_condition(ReplicaSetStatus::default(), "quota exceeded", ts(1));
        let c = &s.conditions.as_ref().unwrap()[0];
        assert_eq!(c.type_, "ReplicaFailure");
        assert_eq!(c.reason.as_deref(), Some("FailedCreate"));
        assert_eq!(c.message.as_deref(), Some("quota exceeded"));
        let again = with_failure_condition(s.clone(), "other", ts(2));
        assert_eq!(again, s);
    }

    #[test]
    fn pending_pods_are_deleted_before_running_ones() {
        let mut pending = pod("pending", 0);
        pending.status.as_mut().unwrap().phase = Some("Pending".into());
        let mut unknown = pod("unknown", 0);
        unknown.status.as_mut().unwrap().phase = Some("Unknown".into());
        let pods = vec![pod("running", 50), unknown, pending];
        let p = plan(&rs(1), &refs(&pods), ts(100));
        assert_eq!(p.delete, vec!["pending", "unknown"]);
    }

    #[test]
    fn deletion_ranking_details() {
        // ready for a shorter time first
        let pods = vec![ready(pod("long", 0), 10), ready(pod("short", 0), 9_000)];
        assert_eq!(plan(&rs(1), &refs(&pods), ts(10_000)).delete, vec!["short"]);
        // more restarts first
        let mut crashy = pod("crashy", 0);
        crashy.status.as_mut().unwrap().container_statuses = Some(vec![ContainerStatus {
            name: "c".into(),
            restart_count: 4,
            ..Default::default()
        }]);
        let pods = vec![pod("calm", 0), crashy];
        assert_eq!(plan(&rs(1), &refs(&pods), ts(100)).delete, vec!["crashy"]);
        // lower deletion cost first
        let mut cheap = pod("cheap", 0);
        cheap.metadata.annotations = Some(labels(&[(POD_DELETION_COST_ANNOTATION, "-5")]));
        let pods = vec![pod("normal", 50), cheap];
        assert_eq!(plan(&rs(1), &refs(&pods), ts(100)).delete, vec!["cheap"]);
        // doubled up on a node first
        let mut alone = pod("alone", 0);
        alone.spec.as_mut().unwrap().node_name = Some("n2".into());
        let pods = vec![alone, pod("crowded1", 0), pod("crowded2", 0)];
        let mut owned = rs(2);
        owned.metadata.owner_references = Some(vec![OwnerReference {
            controller: Some(true),
            uid: "deploy".into(),
            ..Default::default()
        }]);
        assert_eq!(plan(&owned, &refs(&pods), ts(100)).delete, vec!["crowded1"]);
    }

    #[test]
    fn pod_template_carries_template_and_owner() {
        let p = pod_template(&rs(1));
        assert_eq!(p.metadata.generate_name.as_deref(), Some("web-"));
        assert_eq!(p.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(
            p.metadata.labels,
            Some(labels(&[("app", "web"), ("tier", "front")]))
        );
        assert_eq!(p.metadata.annotations, Some(labels(&[("note", "x")])));
        let owner = &p.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (
                owner.kind.as_str(),
                owner.uid.as_str(),
                owner.controller,
                owner.block_owner_deletion
            ),
            ("ReplicaSet", "rs-uid", Some(true), Some(true))
        );
        assert_eq!(
            p.spec.unwrap().containers[0].image.as_deref(),
            Some("nginx")
        );
    }

    #[test]
    fn odd_input_does_not_panic() {
        let bare = ReplicaSet::default();
        let p = plan(&bare, &[&Pod::default()], ts(0));
        assert_eq!(
            p.create, 1,
            "replicas default to 1, the orphan cannot be adopted"
        );
        let mut bad = rs(1);
        bad.spec.as_mut().unwrap().selector.match_expressions =
            Some(vec![metav1::LabelSelectorRequirement {
                key: "a".into(),
                operator: "Bogus".into(),
                values: None,
            }]);
        assert_eq!(plan(&bad, &[], ts(0)).create, 0);
    }
}
