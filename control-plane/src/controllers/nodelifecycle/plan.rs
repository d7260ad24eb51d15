//! Node lifecycle planner: upstream's node lifecycle controller (`pkg/controller/nodelifecycle`)
//! reduced to lease-based health, plus the NoExecute taint manager's eviction decisions.
//!
//! [`plan_node`] marks the conditions of a node whose kubelet stopped heartbeating `Unknown` and
//! keeps the condition taints (`node.kubernetes.io/not-ready`, `unreachable`, the pressure taints
//! and `unschedulable`, NoSchedule; `not-ready` / `unreachable`, NoExecute) in line with the
//! conditions. [`plan_evictions`] decides which pods on a node the NoExecute taints evict now and
//! when to look again. [`pods_to_mark_not_ready`] is upstream's `MarkPodsNotReady`.
//!
//! Simplifications against upstream: no zone-based rate limiting or full-disruption mode, taints
//! follow the conditions as they are after this pass (upstream uses the previous pass's view, one
//! monitor period later), and a node without a Ready condition and a fresh heartbeat keeps its
//! not-ready / unreachable taints untouched.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, NodeCondition, Pod, Taint, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_semantics::scheduling::matching_tolerations;

/// Taint key for a node whose Ready condition is False.
pub const TAINT_NOT_READY: &str = "node.kubernetes.io/not-ready";
/// Taint key for a node whose Ready condition is Unknown.
pub const TAINT_UNREACHABLE: &str = "node.kubernetes.io/unreachable";
/// Taint key for a node whose MemoryPressure condition is True.
pub const TAINT_MEMORY_PRESSURE: &str = "node.kubernetes.io/memory-pressure";
/// Taint key for a node whose DiskPressure condition is True.
pub const TAINT_DISK_PRESSURE: &str = "node.kubernetes.io/disk-pressure";
/// Taint key for a node whose PIDPressure condition is True.
pub const TAINT_PID_PRESSURE: &str = "node.kubernetes.io/pid-pressure";
/// Taint key for a node whose NetworkUnavailable condition is True.
pub const TAINT_NETWORK_UNAVAILABLE: &str = "node.kubernetes.io/network-unavailable";
/// Taint key for a cordoned node (`spec.unschedulable`).
pub const TAINT_UNSCHEDULABLE: &str = "node.kubernetes.io/unschedulable";

/// The default node monitor grace period (upstream `--node-monitor-grace-period`).
pub const DEFAULT_GRACE: Duration = Duration::from_secs(40);

/// Conditions the controller marks Unknown when the kubelet goes silent (upstream
/// `nodeConditionTypes`).
const MONITORED_CONDITIONS: [&str; 4] = ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure"];

/// What the executor observed of a node's liveness.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeHealth {
    /// the last time the executor saw the node's Lease renewTime (or Node Ready heartbeat) change, by the controller's clock
    pub last_heartbeat: jiff::Timestamp,
}

/// Changes to one node. `None` fields need no write.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodePlan {
    /// The node's full new `status.conditions` when they must change (write via the status
    /// subresource).
    pub status_conditions: Option<Vec<NodeCondition>>,
    /// The node's full new `spec.taints` when they must change.
    pub taints: Option<Vec<Taint>>,
}

impl NodePlan {
    /// True when nothing needs writing.
    pub fn is_empty(&self) -> bool {
        self.status_conditions.is_none() && self.taints.is_none()
    }
}

/// Which pods of a node to evict now, and when to plan again.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EvictionPlan {
    /// Pods (namespace, name) to delete now (upstream deletes them; event `TaintManagerEviction`,
    /// "Marking for deletion Pod <ns>/<name>").
    pub evict: Vec<(String /*ns*/, String /*name*/)>,
    /// Time until the earliest toleration of a pod still on the node runs out.
    pub recheck_after: Option<Duration>,
}

fn nanos(t: jiff::Timestamp) -> i128 {
    t.as_nanosecond()
}

fn condition<'a>(conds: &'a [NodeCondition], ty: &str) -> Option<&'a NodeCondition> {
    conds.iter().find(|c| c.type_ == ty)
}

/// Plans the condition and taint updates of one node.
///
/// When `now - health.last_heartbeat > grace` the Ready, MemoryPressure, DiskPressure and
/// PIDPressure conditions become Unknown (reason `NodeStatusUnknown`, message "Kubelet stopped
/// posting node status.", lastTransitionTime `now`, lastHeartbeatTime kept; a missing condition
/// is added with reason `NodeStatusNeverUpdated`, "Kubelet never posted node status.", heartbeat
/// = the node's creationTimestamp). The taints then follow the conditions: Ready Unknown ->
/// `unreachable` NoSchedule + NoExecute, Ready False -> `not-ready` NoSchedule + NoExecute, Ready
/// True -> neither; MemoryPressure/DiskPressure/PIDPressure/NetworkUnavailable True and
/// `spec.unschedulable` -> their NoSchedule taints (upstream `doNoScheduleTaintingPass`). Taints
/// are compared by key and effect; added ones get `timeAdded = now`; all other taints are kept
/// as they are.
pub fn plan_node(
    node: &Node,
    health: &NodeHealth,
    grace: Duration,
    now: jiff::Timestamp,
) -> NodePlan {
    let old_conds: Vec<NodeCondition> = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let stale = nanos(now) - nanos(health.last_heartbeat) > grace.as_nanos() as i128;
    let mut conds = old_conds.clone();
    if stale {
        for ty in MONITORED_CONDITIONS {
            match conds.iter_mut().find(|c| c.type_ == ty) {
                None => conds.push(NodeCondition {
                    type_: ty.to_string(),
                    status: "Unknown".to_string(),
                    reason: Some("NodeStatusNeverUpdated".to_string()),
                    message: Some("Kubelet never posted node status.".to_string()),
                    last_heartbeat_time: node.metadata.creation_timestamp.clone(),
                    last_transition_time: Some(Time(now)),
                }),
                Some(c) if c.status != "Unknown" => {
                    c.status = "Unknown".to_string();
                    c.reason = Some("NodeStatusUnknown".to_string());
                    c.message = Some("Kubelet stopped posting node status.".to_string());
                    c.last_transition_time = Some(Time(now));
                }
                Some(_) => {}
            }
        }
    }
    let status_conditions = (conds != old_conds).then(|| conds.clone());

    let old_taints: Vec<Taint> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let ready = condition(&conds, "Ready").map(|c| c.status.as_str());
    // (key, effect) pairs the controller manages, and the subset wanted now
    let mut managed: Vec<(&str, &str)> = vec![
        (TAINT_MEMORY_PRESSURE, "NoSchedule"),
        (TAINT_DISK_PRESSURE, "NoSchedule"),
        (TAINT_PID_PRESSURE, "NoSchedule"),
        (TAINT_NETWORK_UNAVAILABLE, "NoSchedule"),
        (TAINT_UNSCHEDULABLE, "NoSchedule"),
    ];
    let mut wanted: Vec<(&str, &str)> = Vec::new();
    for (ty, key) in [
        ("MemoryPressure", TAINT_MEMORY_PRESSURE),
        ("DiskPressure", TAINT_DISK_PRESSURE),
        ("PIDPressure", TAINT_PID_PRESSURE),
        ("NetworkUnavailable", TAINT_NETWORK_UNAVAILABLE),
    ] {
        if condition(&conds, ty).is_some_and(|c| c.status == "True") {
            wanted.push((key, "NoSchedule"));
        }
    }
    if node
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
    {
        wanted.push((TAINT_UNSCHEDULABLE, "NoSchedule"));
    }
    if let Some(ready) = ready {
        for key in [TAINT_NOT_READY, TAINT_UNREACHABLE] {
            for effect in ["NoSchedule", "NoExecute"] {
                managed.push((key, effect));
            }
        }
        let key = match ready {
            "False" => Some(TAINT_NOT_READY),
            "Unknown" => Some(TAINT_UNREACHABLE),
            _ => None,
        };
        if let Some(key) = key {
            wanted.push((key, "NoSchedule"));
            wanted.push((key, "NoExecute"));
        }
    }
    let mut taints: Vec<Taint> = old_taints
        .iter()
        .filter(|t| {
            let k = (t.key.as_str(), t.effect.as_str());
            !managed.contains(&k) || wanted.contains(&k)
        })
        .cloned()
        .collect();
    for (key, effect) in wanted {
        if !taints.iter().any(|t| t.key == key && t.effect == effect) {
            taints.push(Taint {
                key: key.to_string(),
                effect: effect.to_string(),
                time_added: Some(Time(now)),
                value: None,
            });
        }
    }
    let taints = (taints != old_taints).then_some(taints);
    NodePlan {
        status_conditions,
        taints,
    }
}

fn pod_bound_at(pod: &Pod) -> Option<jiff::Timestamp> {
    let scheduled = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| {
            cs.iter()
                .find(|c| c.type_ == "PodScheduled" && c.status == "True")
        })
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| t.0);
    scheduled.or_else(|| pod.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

/// Plans the NoExecute taint evictions of the pods on one node (upstream taint manager).
///
/// For each pod not already terminating: if some NoExecute taint of the node is not tolerated,
/// the pod is evicted at once. Otherwise the first matching toleration of each taint is used
/// (upstream `GetMatchingTolerations`); those without `tolerationSeconds` tolerate forever, and
/// the pod is evicted at `start + tolerationSeconds` (the minimum over the taints; negative
/// counts as 0), where `start` is the taint's `timeAdded`, or the time the pod landed on the
/// node (its PodScheduled transition, else its creation) when that is later: upstream starts the
/// clock when it first sees the pod on the tainted node. A taint without `timeAdded` counts from
/// the pod's landing time. `recheck_after` is the time to the earliest deadline still ahead.
pub fn plan_evictions(node: &Node, pods: &[&Pod], now: jiff::Timestamp) -> EvictionPlan {
    let taints: Vec<&Taint> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|ts| ts.iter().filter(|t| t.effect == "NoExecute").collect())
        .unwrap_or_default();
    let mut plan = EvictionPlan::default();
    if taints.is_empty() {
        return plan;
    }
    let now_ns = nanos(now);
    let mut earliest: Option<i128> = None;
    for pod in pods {
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let key = (
            pod.metadata.namespace.clone().unwrap_or_default(),
            pod.metadata.name.clone().unwrap_or_default(),
        );
        let tolerations: &[Toleration] = pod
            .spec
            .as_ref()
            .and_then(|s| s.tolerations.as_deref())
            .unwrap_or(&[]);
        let bound = pod_bound_at(pod).map(nanos);
        let Some(matching) = matching_tolerations(taints.iter().copied(), tolerations) else {
            plan.evict.push(key);
            continue;
        };
        let mut deadline: Option<i128> = None;
        for (taint, tol) in taints.iter().zip(matching) {
            let Some(secs) = tol.toleration_seconds else {
                continue;
            };
            let added = taint.time_added.as_ref().map(|t| nanos(t.0));
            let start = match (added, bound) {
                (Some(a), Some(b)) => a.max(b),
                (Some(a), None) => a,
                (None, Some(b)) => b,
                (None, None) => now_ns,
            };
            let d = start.saturating_add(i128::from(secs.max(0)) * 1_000_000_000);
            deadline = Some(deadline.map_or(d, |x| x.min(d)));
        }
        match deadline {
            Some(d) if d <= now_ns => plan.evict.push(key),
            Some(d) => earliest = Some(earliest.map_or(d, |e| e.min(d))),
            None => {}
        }
    }
    plan.recheck_after = earliest.map(|e| {
        let ns = (e - now_ns).max(0);
        Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
    });
    plan
}

/// Pods whose Ready condition must become False because their node is no longer Ready
/// (upstream `MarkPodsNotReady`, run when the node's Ready condition leaves True and for pods
/// landing on such a node). Empty while the node is Ready (or has no Ready condition). The
/// executor sets the pod's Ready condition to status False with `lastTransitionTime = now`
/// through the status subresource and records a Warning event `NodeNotReady` "Node is not
/// ready" on the pod.
pub fn pods_to_mark_not_ready(node: &Node, pods: &[&Pod]) -> Vec<(String, String)> {
    let conds: &[NodeCondition] = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or(&[]);
    match condition(conds, "Ready") {
        Some(c) if c.status != "True" => {}
        _ => return Vec::new(),
    }
    let node_name = node.metadata.name.as_deref().unwrap_or("");
    pods.iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node_name))
        .filter(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status != "False"))
        })
        .map(|p| {
            (
                p.metadata.namespace.clone().unwrap_or_default(),
                p.metadata.name.clone().unwrap_or_default(),
            )
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeSpec, NodeStatus, PodCondition, PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn ts(s: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(1_700_000_000 + s).unwrap()
    }

    fn cond(ty: &str, status: &str, at: i64) -> NodeCondition {
        NodeCondition {
            type_: ty.into(),
            status: status.into(),
            reason: Some("KubeletReady".into()),
            message: Some("kubelet is posting ready status".into()),
            last_heartbeat_time: Some(Time(ts(at))),
            last_transition_time: Some(Time(ts(at))),
        }
    }

    fn node(ready: &str, taints: Vec<Taint>) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                creation_timestamp: Some(Time(ts(-1000))),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                taints: (!taints.is_empty()).then_some(taints),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                conditions: Some(vec![
                    cond("MemoryPressure", "False", 0),
                    cond("DiskPressure", "False", 0),
                    cond("PIDPressure", "False", 0),
                    cond("Ready", ready, 0),
                ]),
                ..Default::default()
            }),
        }
    }

    fn taint(key: &str, effect: &str, added: Option<i64>) -> Taint {
        Taint {
            key: key.into(),
            effect: effect.into(),
            time_added: added.map(|a| Time(ts(a))),
            value: None,
        }
    }

    fn keys(ts: &[Taint]) -> Vec<(String, String)> {
        let mut v: Vec<_> = ts
            .iter()
            .map(|t| (t.key.clone(), t.effect.clone()))
            .collect();
        v.sort();
        v
    }

    fn health(at: i64) -> NodeHealth {
        NodeHealth {
            last_heartbeat: ts(at),
        }
    }

    #[test]
    fn fresh_ready_node_is_left_alone() {
        let n = node("True", vec![]);
        let plan = plan_node(&n, &health(100), DEFAULT_GRACE, ts(120));
        assert!(plan.is_empty(), "{plan:?}");
        // exactly at the grace period is still fresh (upstream: After)
        let plan = plan_node(&n, &health(100), DEFAULT_GRACE, ts(140));
        assert!(plan.is_empty(), "{plan:?}");
    }

    #[test]
    fn stale_node_becomes_unknown_and_unreachable() {
        let other = Taint {
            key: "dedicated".into(),
            effect: "NoSchedule".into(),
            time_added: None,
            value: Some("gpu".into()),
        };
        let n = node("True", vec![other.clone()]);
        let plan = plan_node(&n, &health(100), DEFAULT_GRACE, ts(141));
        let conds = plan.status_conditions.unwrap();
        assert_eq!(conds.len(), 4);
        for c in &conds {
            assert_eq!(c.status, "Unknown", "{c:?}");
            assert_eq!(c.reason.as_deref(), Some("NodeStatusUnknown"));
            assert_eq!(
                c.message.as_deref(),
                Some("Kubelet stopped posting node status.")
            );
            assert_eq!(c.last_transition_time, Some(Time(ts(141))));
            assert_eq!(c.last_heartbeat_time, Some(Time(ts(0))), "heartbeat kept");
        }
        let taints = plan.taints.unwrap();
        assert_eq!(
            keys(&taints),
            vec![
                ("dedicated".into(), "NoSchedule".into()),
                (TAINT_UNREACHABLE.into(), "NoExecute".into()),
                (TAINT_UNREACHABLE.into(), "NoSchedule".into()),
            ]
        );
        assert!(taints.contains(&other), "other taints untouched");
        for t in taints.iter().filter(|t| t.key == TAINT_UNREACHABLE) {
            assert_eq!(t.time_added, Some(Time(ts(141))));
        }
    }

    #[test]
    fn already_unknown_keeps_transition_time_and_is_a_no_op() {
        let mut n = node("True", vec![]);
        let first = plan_node(&n, &health(100), DEFAULT_GRACE, ts(141));
        n.status.as_mut().unwrap().conditions = first.status_conditions;
        n.spec.as_mut().unwrap().taints = first.taints;
        let again = plan_node(&n, &health(100), DEFAULT_GRACE, ts(500));
        assert!(again.is_empty(), "{again:?}");
    }

    #[test]
    fn missing_conditions_are_added_as_never_updated() {
        let mut n = node("True", vec![]);
        n.status = None;
        let plan = plan_node(&n, &health(0), DEFAULT_GRACE, ts(100));
        let conds = plan.status_conditions.unwrap();
        assert_eq!(conds.len(), 4);
        let ready = conds.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(ready.reason.as_deref(), Some("NodeStatusNeverUpdated"));
        assert_eq!(
            ready.message.as_deref(),
            Some("Kubelet never posted node status.")
        );
        assert_eq!(ready.last_heartbeat_time, Some(Time(ts(-1000))));
        assert_eq!(ready.last_transition_time, Some(Time(ts(100))));
        assert_eq!(keys(&plan.taints.unwrap()).len(), 2);
    }

    #[test]
    fn not_ready_node_gets_not_ready_taints_replacing_unreachable() {
        let n = node(
            "False",
            vec![
                taint(TAINT_UNREACHABLE, "NoExecute", Some(10)),
                taint(TAINT_UNREACHABLE, "NoSchedule", Some(10)),
            ],
        );
        let plan = plan_node(&n, &health(100), DEFAULT_GRACE, ts(110));
        assert!(plan.status_conditions.is_none());
        assert_eq!(
            keys(&plan.taints.unwrap()),
            vec![
                (TAINT_NOT_READY.into(), "NoExecute".into()),
                (TAINT_NOT_READY.into(), "NoSchedule".into())
            ]
        );
    }

    #[test]
    fn ready_again_removes_only_the_lifecycle_taints() {
        let keep = Taint {
            key: "example.com/x".into(),
            effect: "NoExecute".into(),
            time_added: Some(Time(ts(1))),
            value: None,
        };
        let n = node(
            "True",
            vec![
                taint(TAINT_UNREACHABLE, "NoExecute", Some(10)),
                keep.clone(),
                taint(TAINT_UNREACHABLE, "NoSchedule", Some(10)),
                taint(TAINT_NOT_READY, "NoSchedule", None),
            ],
        );
        let plan = plan_node(&n, &health(100), DEFAULT_GRACE, ts(110));
        assert_eq!(plan.taints, Some(vec![keep]));
    }

    #[test]
    fn existing_taint_with_other_time_is_kept() {
        let n = node(
            "False",
            vec![
                taint(TAINT_NOT_READY, "NoExecute", Some(3)),
                taint(TAINT_NOT_READY, "NoSchedule", None),
            ],
        );
        assert!(plan_node(&n, &health(100), DEFAULT_GRACE, ts(110)).is_empty());
    }

    #[test]
    fn pressure_and_unschedulable_taints_follow_conditions() {
        let mut n = node("True", vec![]);
        n.spec.as_mut().unwrap().unschedulable = Some(true);
        n.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].status = "True".into();
        let plan = plan_node(&n, &health(100), DEFAULT_GRACE, ts(110));
        assert_eq!(
            keys(&plan.taints.unwrap()),
            vec![
                (TAINT_MEMORY_PRESSURE.into(), "NoSchedule".into()),
                (TAINT_UNSCHEDULABLE.into(), "NoSchedule".into())
            ]
        );
    }

    #[test]
    fn fresh_node_without_ready_condition_keeps_registration_taint() {
        let mut n = node("True", vec![taint(TAINT_NOT_READY, "NoSchedule", None)]);
        n.status = None;
        assert!(plan_node(&n, &health(100), DEFAULT_GRACE, ts(110)).is_empty());
    }

    fn pod(name: &str, tolerations: Vec<Toleration>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                creation_timestamp: Some(Time(ts(-500))),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some("n1".into()),
                tolerations: Some(tolerations),
                ..Default::default()
            }),
            status: Some(PodStatus {
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }
    }

    fn tol(key: &str, secs: Option<i64>) -> Toleration {
        Toleration {
            key: Some(key.into()),
            operator: Some("Exists".into()),
            effect: Some("NoExecute".into()),
            toleration_seconds: secs,
            value: None,
        }
    }

    #[test]
    fn evictions_now_later_never() {
        let n = node(
            "Unknown",
            vec![
                taint(TAINT_UNREACHABLE, "NoExecute", Some(100)),
                taint(TAINT_UNREACHABLE, "NoSchedule", Some(100)),
            ],
        );
        let bare = pod("bare", vec![]);
        let short = pod("short", vec![tol(TAINT_UNREACHABLE, Some(60))]);
        let long = pod("long", vec![tol(TAINT_UNREACHABLE, Some(300))]);
        let forever = pod("forever", vec![tol(TAINT_UNREACHABLE, None)]);
        let any = pod(
            "any",
            vec![Toleration {
                operator: Some("Exists".into()),
                ..Default::default()
            }],
        );
        let mut dying = pod("dying", vec![]);
        dying.metadata.deletion_timestamp = Some(Time(ts(150)));
        let pods = [&bare, &short, &long, &forever, &any, &dying];

        let plan = plan_evictions(&n, &pods, ts(110));
        assert_eq!(plan.evict, vec![("ns".to_string(), "bare".to_string())]);
        assert_eq!(plan.recheck_after, Some(Duration::from_secs(50)));

        let plan = plan_evictions(&n, &pods, ts(160));
        assert_eq!(
            plan.evict,
            vec![("ns".into(), "bare".into()), ("ns".into(), "short".into())]
        );
        assert_eq!(plan.recheck_after, Some(Duration::from_secs(240)));

        let plan = plan_evictions(&n, &pods, ts(400));
        assert_eq!(plan.evict.len(), 3);
        assert_eq!(plan.recheck_after, None);
    }

    #[test]
    fn minimum_over_taints_and_value_matching() {
        let mut t2 = taint("example.com/maint", "NoExecute", Some(0));
        t2.value = Some("soon".into());
        let n = node(
            "Unknown",
            vec![taint(TAINT_UNREACHABLE, "NoExecute", Some(100)), t2],
        );
        let equal = Toleration {
            key: Some("example.com/maint".into()),
            operator: Some("Equal".into()),
            value: Some("soon".into()),
            effect: None,
            toleration_seconds: Some(30),
        };
        let p = pod("p", vec![tol(TAINT_UNREACHABLE, Some(300)), equal.clone()]);
        // maint since 0 (pod landed at -500): deadline 30
        let plan = plan_evictions(&n, &[&p], ts(10));
        assert!(plan.evict.is_empty());
        assert_eq!(plan.recheck_after, Some(Duration::from_secs(20)));
        let mut wrong = equal;
        wrong.value = Some("later".into());
        let p = pod("p", vec![tol(TAINT_UNREACHABLE, Some(300)), wrong]);
        assert_eq!(plan_evictions(&n, &[&p], ts(10)).evict.len(), 1);
    }

    #[test]
    fn pod_landing_after_taint_gets_its_full_toleration() {
        let n = node(
            "Unknown",
            vec![taint(TAINT_UNREACHABLE, "NoExecute", Some(0))],
        );
        let mut p = pod("late", vec![tol(TAINT_UNREACHABLE, Some(300))]);
        p.metadata.creation_timestamp = Some(Time(ts(1000)));
        let plan = plan_evictions(&n, &[&p], ts(1100));
        assert!(plan.evict.is_empty());
        assert_eq!(plan.recheck_after, Some(Duration::from_secs(200)));
    }

    #[test]
    fn no_execute_taints_only() {
        let n = node("True", vec![taint("x", "NoSchedule", Some(0))]);
        let p = pod("p", vec![]);
        assert_eq!(plan_evictions(&n, &[&p], ts(10)), EvictionPlan::default());
    }

    #[test]
    fn mark_pods_not_ready() {
        let p = pod("p", vec![]);
        let mut other = pod("q", vec![]);
        other.spec.as_mut().unwrap().node_name = Some("n2".into());
        assert!(pods_to_mark_not_ready(&node("True", vec![]), &[&p, &other]).is_empty());
        assert_eq!(
            pods_to_mark_not_ready(&node("Unknown", vec![]), &[&p, &other]),
            vec![("ns".to_string(), "p".to_string())]
        );
    }

    #[test]
    fn not_ready_node_going_silent_becomes_unreachable() {
        let n = node(
            "False",
            vec![
                taint(TAINT_NOT_READY, "NoExecute", Some(10)),
                taint(TAINT_NOT_READY, "NoSchedule", Some(10)),
            ],
        );
        let plan = plan_node(&n, &health(0), DEFAULT_GRACE, ts(100));
        let ready = plan
            .status_conditions
            .unwrap()
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        assert_eq!(ready.status, "Unknown");
        assert_eq!(
            keys(&plan.taints.unwrap()),
            vec![
                (TAINT_UNREACHABLE.into(), "NoExecute".into()),
                (TAINT_UNREACHABLE.into(), "NoSchedule".into())
            ]
        );
    }
}
