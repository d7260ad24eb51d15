//! The disruption controller's arithmetic (upstream's pkg/controller/disruption), pure: from a
//! PodDisruptionBudget, the pods it selects and the scale of their controllers, its status.
//!
//! - `minAvailable` as a number: the expected pods are the selected pods, the desired healthy
//!   count is the number.
//! - `maxUnavailable`, or `minAvailable` as a percentage: the expected pods are the sum of the
//!   scales (`spec.replicas`) of the pods' controllers (ReplicaSet, StatefulSet,
//!   ReplicationController; a Deployment through its ReplicaSets), percentages rounded up;
//!   a selected pod without such a controller makes the budget fail safe (nothing allowed).
//! - Healthy: Ready, not being deleted, not already in `disruptedPods` (an eviction the API
//!   server granted that the pod's deletion has not yet shown; entries expire after 2 minutes).
//! - disruptionsAllowed = max(currentHealthy - desiredHealthy, 0); condition DisruptionAllowed
//!   (SufficientPods / InsufficientPods, SyncFailed when the scale is unknown).

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::selector::LabelSelector;

/// How long an eviction counts as a disruption before the pod's deletion shows.
pub const DELETION_TIMEOUT_SECS: i64 = 120;

/// A pod's controller, as the budget needs it to find the scale.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ControllerRef {
    pub kind: String,
    pub name: String,
    pub uid: String,
}

/// The outcome: the status to write and when to look again (an expiring disrupted pod).
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    pub status: PodDisruptionBudgetStatus,
    pub recheck_at: Option<Timestamp>,
}

pub fn pod_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Whether the budget selects the pod (policy/v1: an empty selector selects every pod of the
/// namespace; a selector that does not parse selects none).
pub fn selects(pdb: &PodDisruptionBudget, pod: &Pod) -> bool {
    if pod.metadata.namespace != pdb.metadata.namespace {
        return false;
    }
    let Some(sel) = pdb.spec.as_ref().and_then(|s| s.selector.as_ref()) else { return true };
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    LabelSelector::from_api(sel).is_ok_and(|s| s.matches(&labels))
}

/// `v` of `total`, percentages rounded up (upstream's GetScaledValueFromIntOrPercent with
/// roundUp).
pub fn scaled(v: &IntOrString, total: i32) -> Option<i32> {
    match v {
        IntOrString::Int(n) => Some(*n),
        IntOrString::String(s) => {
            let pct: i64 = s.strip_suffix('%')?.parse().ok()?;
            let total = i64::from(total);
            i32::try_from((pct * total + 99) / 100).ok()
        }
    }
}

/// Computes the status. `controller_of` gives a pod's controller, `scale_of` its scale.
pub fn status(
    pdb: &PodDisruptionBudget,
    pods: &[&Pod],
    controller_of: &dyn Fn(&Pod) -> Option<ControllerRef>,
    scale_of: &dyn Fn(&ControllerRef) -> Option<i32>,
    now: Timestamp,
) -> Outcome {
    let spec = pdb.spec.clone().unwrap_or_default();
    let selected: Vec<&Pod> = pods.iter().copied().filter(|p| selects(pdb, p)).collect();
    let previous = pdb.status.clone().unwrap_or_default();
    let generation = pdb.metadata.generation;

    // Disrupted pods that still count: the pod exists, is not being deleted, the entry is young.
    let mut disrupted: BTreeMap<String, Time> = BTreeMap::new();
    let mut recheck_at: Option<Timestamp> = None;
    for (name, at) in previous.disrupted_pods.clone().unwrap_or_default() {
        let expires = at.0.checked_add(jiff::SignedDuration::from_secs(DELETION_TIMEOUT_SECS)).unwrap_or(at.0);
        let alive = selected.iter().any(|p| p.metadata.name.as_deref() == Some(name.as_str()) && p.metadata.deletion_timestamp.is_none());
        if alive && expires > now {
            recheck_at = Some(recheck_at.map_or(expires, |r: Timestamp| r.min(expires)));
            disrupted.insert(name, at);
        }
    }
    let healthy = selected
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| !disrupted.contains_key(p.metadata.name.as_deref().unwrap_or_default()))
        .filter(|p| pod_ready(p))
        .count();
    let current_healthy = i32::try_from(healthy).unwrap_or(i32::MAX);

    let by_count = matches!(spec.min_available, Some(IntOrString::Int(_))) && spec.max_unavailable.is_none();
    let expected: Result<i32, String> = if by_count || (spec.min_available.is_none() && spec.max_unavailable.is_none()) {
        Ok(i32::try_from(selected.len()).unwrap_or(i32::MAX))
    } else {
        let mut controllers = BTreeSet::new();
        let mut missing = None;
        for p in &selected {
            match controller_of(p) {
                Some(c) => {
                    controllers.insert(c);
                }
                None => missing = p.metadata.name.clone(),
            }
        }
        match missing {
            Some(pod) => Err(format!("found no controllers for pod {pod:?}")),
            None => controllers
                .iter()
                .map(|c| scale_of(c).ok_or_else(|| format!("no scale for {} {:?}", c.kind, c.name)))
                .sum::<Result<i32, String>>(),
        }
    };
    let (expected_pods, desired, failure) = match expected {
        Err(why) => (0, 0, Some(why)),
        Ok(expected) => {
            let desired = match (&spec.min_available, &spec.max_unavailable) {
                (_, Some(max)) => expected - scaled(max, expected).unwrap_or(0),
                (Some(min), None) => scaled(min, expected).unwrap_or(0),
                (None, None) => 0,
            };
            (expected, desired.max(0), None)
        }
    };
    let allowed = if failure.is_some() { 0 } else { (current_healthy - desired).max(0) };
    let (cond_status, reason, message) = match (&failure, allowed > 0) {
        (Some(why), _) => ("False", "SyncFailed", why.clone()),
        (None, true) => ("True", "SufficientPods", String::new()),
        (None, false) => ("False", "InsufficientPods", String::new()),
    };
    let old_cond = previous.conditions.as_ref().and_then(|cs| cs.iter().find(|c| c.type_ == "DisruptionAllowed"));
    let transition = match old_cond {
        Some(c) if c.status == cond_status => c.last_transition_time.clone(),
        _ => Time(now),
    };
    let status = PodDisruptionBudgetStatus {
        observed_generation: generation,
        current_healthy,
        desired_healthy: desired,
        expected_pods,
        disruptions_allowed: allowed,
        disrupted_pods: if disrupted.is_empty() { None } else { Some(disrupted) },
        conditions: Some(vec![Condition {
            type_: "DisruptionAllowed".into(),
            status: cond_status.into(),
            reason: reason.into(),
            message,
            observed_generation: generation,
            last_transition_time: transition,
        }]),
    };
    Outcome { status, recheck_at }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn pdb(spec: serde_json::Value, status: serde_json::Value) -> PodDisruptionBudget {
        serde_json::from_value(json!({"metadata": {"name": "web", "namespace": "ns", "generation": 2},
                                      "spec": spec, "status": status}))
        .unwrap()
    }

    fn pod(name: &str, ready: bool, owner: Option<&str>) -> Pod {
        let mut v = json!({"metadata": {"name": name, "namespace": "ns", "labels": {"app": "web"}},
                           "status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}});
        if let Some(o) = owner {
            v["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": o, "uid": o, "controller": true}]);
        }
        serde_json::from_value(v).unwrap()
    }

    fn owner(p: &Pod) -> Option<ControllerRef> {
        let r = p.metadata.owner_references.as_ref()?.first()?;
        Some(ControllerRef { kind: r.kind.clone(), name: r.name.clone(), uid: r.uid.clone() })
    }

    const NOW: &str = "2026-11-26T12:00:00Z";

    #[test]
    fn min_available_as_a_number_counts_the_selected_pods() {
        let pods = [pod("a", true, None), pod("b", true, None), pod("c", false, None)];
        let refs: Vec<&Pod> = pods.iter().collect();
        let o = status(&pdb(json!({"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}), json!({})), &refs, &owner, &|_| None, t(NOW));
        let s = o.status;
        assert_eq!((s.expected_pods, s.current_healthy, s.desired_healthy, s.disruptions_allowed), (3, 2, 1, 1));
        assert_eq!(s.observed_generation, Some(2));
        let c = &s.conditions.unwrap()[0];
        assert_eq!((c.type_.as_str(), c.status.as_str(), c.reason.as_str()), ("DisruptionAllowed", "True", "SufficientPods"));
    }

    #[test]
    fn percentages_and_max_unavailable_use_the_controllers_scale_rounded_up() {
        let pods = [pod("a", true, Some("rs1")), pod("b", true, Some("rs1")), pod("c", true, Some("rs1"))];
        let refs: Vec<&Pod> = pods.iter().collect();
        let scale = |_: &ControllerRef| Some(4);
        // 4 expected, 50% available rounded up = 2 desired, 3 healthy: 1 allowed.
        let s = status(&pdb(json!({"minAvailable": "50%"}), json!({})), &refs, &owner, &scale, t(NOW)).status;
        assert_eq!((s.expected_pods, s.desired_healthy, s.disruptions_allowed), (4, 2, 1));
        // maxUnavailable 1 of 4: 3 desired, 3 healthy: none allowed.
        let s = status(&pdb(json!({"maxUnavailable": 1}), json!({})), &refs, &owner, &scale, t(NOW)).status;
        assert_eq!((s.desired_healthy, s.disruptions_allowed), (3, 0));
        assert_eq!(s.conditions.unwrap()[0].reason, "InsufficientPods");
        // maxUnavailable 30% of 4 = 2 (rounded up): 2 desired, 1 allowed.
        let s = status(&pdb(json!({"maxUnavailable": "30%"}), json!({})), &refs, &owner, &scale, t(NOW)).status;
        assert_eq!((s.desired_healthy, s.disruptions_allowed), (2, 1));
        // A pod without a controller: fail safe.
        let orphans = [pod("x", true, None)];
        let s = status(&pdb(json!({"maxUnavailable": 1}), json!({})), &[&orphans[0]], &owner, &scale, t(NOW)).status;
        assert_eq!(s.disruptions_allowed, 0);
        assert_eq!(s.conditions.unwrap()[0].reason, "SyncFailed");
    }

    #[test]
    fn disrupted_pods_do_not_count_as_healthy_until_they_expire() {
        let pods = [pod("a", true, None), pod("b", true, None)];
        let refs: Vec<&Pod> = pods.iter().collect();
        let budget = pdb(json!({"minAvailable": 1}), json!({"disruptedPods": {"a": "2026-11-26T11:59:00Z", "gone": "2026-11-26T11:59:00Z"}}));
        let o = status(&budget, &refs, &owner, &|_| None, t(NOW));
        assert_eq!((o.status.current_healthy, o.status.disruptions_allowed), (1, 0));
        assert_eq!(o.status.disrupted_pods.as_ref().unwrap().keys().collect::<Vec<_>>(), ["a"], "entries of missing pods go");
        assert_eq!(o.recheck_at, Some(t("2026-11-26T12:01:00Z")));
        // Two minutes later the entry expired: a is healthy again.
        let o = status(&budget, &refs, &owner, &|_| None, t("2026-11-26T12:01:01Z"));
        assert_eq!((o.status.current_healthy, o.status.disruptions_allowed, o.status.disrupted_pods), (2, 1, None));
    }

    #[test]
    fn scaled_rounds_percentages_up() {
        assert_eq!(scaled(&IntOrString::String("50%".into()), 3), Some(2));
        assert_eq!(scaled(&IntOrString::String("0%".into()), 3), Some(0));
        assert_eq!(scaled(&IntOrString::Int(2), 3), Some(2));
        assert_eq!(scaled(&IntOrString::String("x".into()), 3), None);
    }
}
