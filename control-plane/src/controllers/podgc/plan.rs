//! The pod garbage collector's planner (upstream `pkg/controller/podgc`): which pods to force
//! delete and why.
//!
//! - terminated pods (phase neither Pending, Running nor Unknown) beyond the
//!   `--terminated-pod-gc-threshold`, evicted ones first, then the oldest, then by name;
//! - terminating pods on a node that is not Ready and has the `node.kubernetes.io/out-of-service`
//!   taint (the kubelet there will never confirm the deletion);
//! - pods bound to a node that no longer exists (once the executor confirmed it, after a
//!   quarantine): they get the `DisruptionTarget` condition, reason `DeletionByPodGC`;
//! - terminating pods that were never scheduled.
//!
//! Every deletion is forced (grace period 0); a pod not yet Succeeded or Failed is first moved to
//! phase Failed ([`Deletion::status_patch`]), as upstream does, so whoever watches it (a Job)
//! sees it fail rather than vanish.
//!
//! Pure: no I/O, no clock (the condition's transition time is passed in).

use std::cmp::Ordering;
use std::collections::BTreeSet;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::{json, Value};

/// Upstream's `--terminated-pod-gc-threshold` default.
pub const DEFAULT_THRESHOLD: usize = 12_500;
/// How long a node must stay missing before its pods go (upstream `quarantineTime`).
pub const QUARANTINE: Duration = Duration::from_secs(40);
/// How often everything is looked at again (upstream `gcCheckPeriod`).
pub const GC_PERIOD: Duration = Duration::from_secs(20);
/// The taint an administrator puts on a node known to be down for good.
pub const OUT_OF_SERVICE_TAINT: &str = "node.kubernetes.io/out-of-service";
/// The condition PodGC sets on the pods of a node that is gone.
pub const DISRUPTION_TARGET: &str = "DisruptionTarget";
pub const DELETION_BY_POD_GC: &str = "DeletionByPodGC";
pub const NODE_GONE_MESSAGE: &str = "PodGC: node no longer exists";

/// Why a pod is collected (upstream's metric labels).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    Terminated,
    TerminatingOutOfService,
    Orphaned,
    TerminatingUnscheduled,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Terminated => "PodGCReasonTerminated",
            Reason::TerminatingOutOfService => "PodGCReasonTerminatingOutOfService",
            Reason::Orphaned => "PodGCReasonOrphaned",
            Reason::TerminatingUnscheduled => "PodGCReasonTerminatingUnscheduled",
        }
    }
}

/// One pod to force delete.
#[derive(Clone, Debug, PartialEq)]
pub struct Deletion {
    pub namespace: String,
    pub name: String,
    /// The deletion's precondition: a pod of the same name created since is left alone.
    pub uid: Option<String>,
    pub reason: Reason,
    /// A strategic merge patch of the status to send first (phase Failed and, for orphans, the
    /// DisruptionTarget condition); None when the pod already finished.
    pub status_patch: Option<Value>,
}

fn phase(pod: &Pod) -> &str {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("")
}

fn node_name(pod: &Pod) -> &str {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).unwrap_or("")
}

/// Upstream `isPodTerminated`: any phase but Pending, Running and Unknown.
pub fn is_terminated(pod: &Pod) -> bool {
    !matches!(phase(pod), "Pending" | "Running" | "Unknown")
}

/// Upstream `isPodTerminating`.
pub fn is_terminating(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

/// Upstream `eviction.PodIsEvicted`: Failed with reason Evicted.
fn is_evicted(pod: &Pod) -> bool {
    phase(pod) == "Failed" && pod.status.as_ref().and_then(|s| s.reason.as_deref()) == Some("Evicted")
}

/// Upstream `byEvictionAndCreationTimestamp`: evicted pods first, then the oldest, then by name.
fn by_eviction_and_creation(a: &&Pod, b: &&Pod) -> Ordering {
    is_evicted(b)
        .cmp(&is_evicted(a))
        .then_with(|| {
            let t = |p: &Pod| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
            t(a).cmp(&t(b))
        })
        .then_with(|| a.metadata.name.cmp(&b.metadata.name))
}

/// The deletion of a pod for a reason; `now` stamps the DisruptionTarget condition.
pub fn deletion(pod: &Pod, reason: Reason, now: Timestamp) -> Deletion {
    let status_patch = (!matches!(phase(pod), "Succeeded" | "Failed")).then(|| {
        let mut status = json!({"phase": "Failed"});
        if reason == Reason::Orphaned {
            status["conditions"] = json!([{
                "type": DISRUPTION_TARGET,
                "status": "True",
                "reason": DELETION_BY_POD_GC,
                "message": NODE_GONE_MESSAGE,
                "lastTransitionTime": now.to_string(),
            }]);
        }
        json!({"status": status})
    });
    Deletion {
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        name: pod.metadata.name.clone().unwrap_or_default(),
        uid: pod.metadata.uid.clone(),
        reason,
        status_patch,
    }
}

/// Upstream `gcTerminated`: the terminated pods beyond `threshold` (0 turns this off), evicted
/// ones first, then the oldest.
pub fn terminated(pods: &[&Pod], threshold: usize, now: Timestamp) -> Vec<Deletion> {
    if threshold == 0 {
        return Vec::new();
    }
    let mut done: Vec<&Pod> = pods.iter().copied().filter(|p| is_terminated(p)).collect();
    let Some(excess) = done.len().checked_sub(threshold).filter(|n| *n > 0) else {
        return Vec::new();
    };
    done.sort_by(by_eviction_and_creation);
    done.into_iter().take(excess).map(|p| deletion(p, Reason::Terminated, now)).collect()
}

fn is_node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True")
}

/// Whether the node is one whose terminating pods PodGC finishes (upstream `gcTerminating`):
/// not Ready and tainted `node.kubernetes.io/out-of-service` (any effect; the documented one is
/// NoExecute).
pub fn is_out_of_service(node: &Node) -> bool {
    !is_node_ready(node)
        && node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == OUT_OF_SERVICE_TAINT))
}

/// The terminating pods bound to an out-of-service node, in upstream's order.
pub fn out_of_service(node: &Node, pods: &[&Pod], now: Timestamp) -> Vec<Deletion> {
    if !is_out_of_service(node) {
        return Vec::new();
    }
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let mut victims: Vec<&Pod> = pods.iter().copied().filter(|p| is_terminating(p) && node_name(p) == name).collect();
    victims.sort_by(by_eviction_and_creation);
    victims.into_iter().map(|p| deletion(p, Reason::TerminatingOutOfService, now)).collect()
}

/// Upstream `gcOrphaned` for one node confirmed gone: every pod bound to it.
pub fn orphaned(pods: &[&Pod], node: &str, now: Timestamp) -> Vec<Deletion> {
    pods.iter().copied().filter(|p| node_name(p) == node).map(|p| deletion(p, Reason::Orphaned, now)).collect()
}

/// Upstream `gcUnscheduledTerminating`: a terminating pod never bound to a node.
pub fn unscheduled_terminating(pod: &Pod, now: Timestamp) -> Option<Deletion> {
    (is_terminating(pod) && node_name(pod).is_empty()).then(|| deletion(pod, Reason::TerminatingUnscheduled, now))
}

/// The nodes pods are bound to that `known` does not know (candidates for the quarantine).
pub fn missing_nodes<'a>(pods: &[&'a Pod], known: impl Fn(&str) -> bool) -> BTreeSet<&'a str> {
    pods.iter().map(|p| node_name(p)).filter(|n| !n.is_empty() && !known(n)).collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn ts(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }

    fn pod(name: &str, node: &str, phase: &str, created: i64) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"), "creationTimestamp": ts(created).to_string()},
            "spec": {"nodeName": node, "containers": [{"name": "c"}]},
            "status": {"phase": phase}
        }))
        .unwrap()
    }

    fn terminating(mut p: Pod) -> Pod {
        p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(ts(50)));
        p
    }

    fn node(name: &str, ready: &str, taints: Value) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"taints": taints},
            "status": {"conditions": [{"type": "Ready", "status": ready}]}
        }))
        .unwrap()
    }

    fn names(d: &[Deletion]) -> Vec<&str> {
        d.iter().map(|d| d.name.as_str()).collect()
    }

    #[test]
    fn terminated_pods_beyond_the_threshold_go_evicted_then_oldest_first() {
        let mut evicted = pod("evicted", "n1", "Failed", 30);
        evicted.status.as_mut().unwrap().reason = Some("Evicted".into());
        let pods = [
            pod("running", "n1", "Running", 0),
            pod("pending", "n1", "Pending", 0),
            pod("unknown", "n1", "Unknown", 0),
            pod("done-b", "n1", "Succeeded", 10),
            pod("done-a", "n1", "Succeeded", 10),
            pod("failed-new", "n1", "Failed", 40),
            pod("failed-old", "n1", "Failed", 5),
            evicted,
        ];
        let refs: Vec<&Pod> = pods.iter().collect();
        // five terminated, threshold 2: three go
        let d = terminated(&refs, 2, ts(100));
        assert_eq!(names(&d), ["evicted", "failed-old", "done-a"]);
        assert!(d.iter().all(|d| d.reason == Reason::Terminated && d.status_patch.is_none()));
        assert_eq!(d[0].uid.as_deref(), Some("uid-evicted"));
        assert!(terminated(&refs, 5, ts(100)).is_empty());
        assert!(terminated(&refs, 0, ts(100)).is_empty(), "0 turns the threshold off");
    }

    #[test]
    fn terminating_pods_on_an_out_of_service_node_go() {
        let oos = serde_json::json!([{"key": OUT_OF_SERVICE_TAINT, "value": "nodeshutdown", "effect": "NoExecute"}]);
        let pods = [
            terminating(pod("stuck-b", "down", "Running", 20)),
            terminating(pod("stuck-a", "down", "Running", 10)),
            pod("running", "down", "Running", 0),
            terminating(pod("elsewhere", "up", "Running", 0)),
        ];
        let refs: Vec<&Pod> = pods.iter().collect();
        let d = out_of_service(&node("down", "Unknown", oos.clone()), &refs, ts(100));
        assert_eq!(names(&d), ["stuck-a", "stuck-b"]);
        assert_eq!(d[0].reason, Reason::TerminatingOutOfService);
        assert_eq!(d[0].status_patch, Some(json!({"status": {"phase": "Failed"}})));
        // a Ready node, or a node without the taint: nothing
        assert!(out_of_service(&node("down", "True", oos), &refs, ts(100)).is_empty());
        assert!(out_of_service(&node("down", "False", json!([{"key": "other", "effect": "NoExecute"}])), &refs, ts(100)).is_empty());
    }

    #[test]
    fn pods_of_a_node_that_is_gone_are_failed_with_a_disruption_target_condition() {
        let pods = [pod("a", "gone", "Running", 0), pod("b", "gone", "Succeeded", 0), pod("c", "here", "Running", 0), pod("d", "", "Pending", 0)];
        let refs: Vec<&Pod> = pods.iter().collect();
        let d = orphaned(&refs, "gone", ts(100));
        assert_eq!(names(&d), ["a", "b"]);
        assert_eq!(
            d[0].status_patch,
            Some(json!({"status": {"phase": "Failed", "conditions": [{
                "type": "DisruptionTarget", "status": "True", "reason": "DeletionByPodGC",
                "message": "PodGC: node no longer exists", "lastTransitionTime": ts(100).to_string()}]}}))
        );
        assert_eq!(d[1].status_patch, None, "a finished pod keeps its phase");
        let missing = missing_nodes(&refs, |n| n == "here");
        assert_eq!(missing.into_iter().collect::<Vec<_>>(), ["gone"]);
    }

    #[test]
    fn unscheduled_terminating_pods_go() {
        let d = unscheduled_terminating(&terminating(pod("p", "", "Pending", 0)), ts(1)).unwrap();
        assert_eq!((d.name.as_str(), d.reason), ("p", Reason::TerminatingUnscheduled));
        assert_eq!(d.status_patch, Some(json!({"status": {"phase": "Failed"}})));
        assert!(unscheduled_terminating(&pod("p", "", "Pending", 0), ts(1)).is_none());
        assert!(unscheduled_terminating(&terminating(pod("p", "n1", "Running", 0)), ts(1)).is_none());
    }
}
