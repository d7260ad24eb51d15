//! Pod failures: the pod failure policy's rules, when a pod finished, and the exponential
//! back-off before failed pods are replaced (upstream `pod_failure_policy.go` and
//! `backoff_utils.go`).

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::batch::v1::{PodFailurePolicy, PodFailurePolicyOnExitCodesRequirement};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};

/// The first back-off after a pod failure (upstream `DefaultJobPodFailureBackOff`).
pub const POD_FAILURE_BACKOFF: Duration = Duration::from_secs(10);
/// The longest back-off (upstream `MaxJobPodFailureBackOff`, ten minutes since Kubernetes 1.26;
/// the documentation's "six minutes" is the older value).
pub const MAX_POD_FAILURE_BACKOFF: Duration = Duration::from_secs(600);

/// The action of the pod failure policy rule a failed pod matched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    FailJob,
    FailIndex,
    Ignore,
    Count,
}

/// What the pod failure policy says about a failed pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyMatch {
    /// The job's failure message when a FailJob rule matched.
    pub fail_job: Option<String>,
    /// Whether the failure counts towards backoffLimit (and backoffLimitPerIndex).
    pub counts: bool,
    pub action: Option<Action>,
}

impl PolicyMatch {
    const NO_RULE: PolicyMatch = PolicyMatch { fail_job: None, counts: true, action: None };
}

/// Matches a failed pod against the rules in order (upstream `matchPodFailurePolicy`).
pub fn match_policy(policy: Option<&PodFailurePolicy>, pod: &Pod) -> PolicyMatch {
    let Some(policy) = policy else { return PolicyMatch::NO_RULE };
    let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let status = pod.status.clone().unwrap_or_default();
    for (i, rule) in policy.rules.iter().enumerate() {
        let action = match rule.action.as_str() {
            "FailJob" => Action::FailJob,
            "FailIndex" => Action::FailIndex,
            "Ignore" => Action::Ignore,
            "Count" => Action::Count,
            _ => continue,
        };
        let message = if let Some(req) = &rule.on_exit_codes {
            let containers = status.container_statuses.iter().flatten().chain(status.init_container_statuses.iter().flatten());
            let Some((c, code)) = containers.filter_map(|c| exit_code_match(c, req).map(|code| (c, code))).next() else { continue };
            format!("Container {} for pod {ns}/{name} failed with exit code {code} matching {} rule at index {i}", c.name, rule.action)
        } else if let Some(patterns) = &rule.on_pod_conditions {
            let hit = status
                .conditions
                .iter()
                .flatten()
                .find(|c| patterns.iter().any(|p| p.type_ == c.type_ && p.status == c.status));
            let Some(cond) = hit else { continue };
            format!("Pod {ns}/{name} has condition {} matching {} rule at index {i}", cond.type_, rule.action)
        } else {
            continue;
        };
        return match action {
            Action::Ignore => PolicyMatch { fail_job: None, counts: false, action: Some(action) },
            Action::FailJob => PolicyMatch { fail_job: Some(message), counts: true, action: Some(action) },
            _ => PolicyMatch { fail_job: None, counts: true, action: Some(action) },
        };
    }
    PolicyMatch::NO_RULE
}

/// The exit code of a terminated container (non-zero, of the named container if one is named)
/// that satisfies the requirement.
fn exit_code_match(c: &ContainerStatus, req: &PodFailurePolicyOnExitCodesRequirement) -> Option<i32> {
    let code = c.state.as_ref()?.terminated.as_ref()?.exit_code;
    if code == 0 || req.container_name.as_ref().is_some_and(|n| *n != c.name) {
        return None;
    }
    let listed = req.values.contains(&code);
    match req.operator.as_str() {
        "In" if listed => Some(code),
        "NotIn" if !listed => Some(code),
        _ => None,
    }
}

/// When a pod finished: the latest container finish time when every container terminated,
/// else its Ready=False transition, else its deletion time minus the grace period, else its
/// creation (upstream `getFinishedTime`).
pub fn finished_time(pod: &Pod) -> Option<Timestamp> {
    let status = pod.status.as_ref();
    let containers: Vec<&ContainerStatus> = status.and_then(|s| s.container_statuses.as_ref()).map(|v| v.iter().collect()).unwrap_or_default();
    if !containers.is_empty() {
        let ends: Option<Vec<Timestamp>> = containers
            .iter()
            .map(|c| c.state.as_ref()?.terminated.as_ref()?.finished_at.as_ref().map(|t| t.0))
            .collect();
        if let Some(max) = ends.and_then(|e| e.into_iter().max()) {
            return Some(max);
        }
    }
    let ready_false = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .filter(|c| c.status == "False")
        .and_then(|c| c.last_transition_time.as_ref());
    if let Some(t) = ready_false {
        return Some(t.0);
    }
    if let Some(d) = &pod.metadata.deletion_timestamp {
        let grace = pod.metadata.deletion_grace_period_seconds.unwrap_or(0);
        return d.0.checked_sub(jiff::SignedDuration::from_secs(grace)).ok();
    }
    pod.metadata.creation_timestamp.as_ref().map(|t| t.0)
}

/// Failures since the last success, for the Job's pod-level back-off (upstream
/// `backoffRecord`). The executor keeps one per Job in memory, as upstream does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackoffRecord {
    pub failures_after_last_success: u32,
    pub last_failure: Option<Timestamp>,
}

impl BackoffRecord {
    /// The record after the pods that newly finished (upstream `newBackoffRecord`): a success
    /// resets it, only failures after the latest success count.
    pub fn updated(self, new_succeeded: &[&Pod], new_failed: &[&Pod]) -> BackoffRecord {
        let mut failed: Vec<Timestamp> = new_failed.iter().filter_map(|p| finished_time(p)).collect();
        failed.sort();
        let last_success = new_succeeded.iter().filter_map(|p| finished_time(p)).max();
        match last_success {
            None if failed.is_empty() => self,
            None => BackoffRecord {
                failures_after_last_success: self.failures_after_last_success + failed.len() as u32,
                last_failure: failed.last().copied(),
            },
            Some(success) => {
                let after: Vec<Timestamp> = failed.into_iter().filter(|t| *t > success).collect();
                BackoffRecord { failures_after_last_success: after.len() as u32, last_failure: after.last().copied() }
            }
        }
    }

    /// How long replacements still have to wait.
    pub fn remaining(&self, now: Timestamp) -> Duration {
        remaining_for(self.failures_after_last_success, self.last_failure, now)
    }
}

/// The back-off of the nth consecutive failure: 10 s doubling up to the cap.
pub fn backoff_delay(failures: u32) -> Duration {
    let mut d = POD_FAILURE_BACKOFF;
    for _ in 1..failures {
        d = d.saturating_mul(2);
        if d >= MAX_POD_FAILURE_BACKOFF {
            return MAX_POD_FAILURE_BACKOFF;
        }
    }
    d
}

/// The time left before a replacement after `failures` failures, the last at `last`.
pub fn remaining_for(failures: u32, last: Option<Timestamp>, now: Timestamp) -> Duration {
    let Some(last) = last else { return Duration::ZERO };
    if failures == 0 {
        return Duration::ZERO;
    }
    let delay = backoff_delay(failures);
    let elapsed = Duration::try_from(now.duration_since(last)).unwrap_or(Duration::ZERO);
    delay.saturating_sub(elapsed)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn failed_pod(name: &str, code: i32, finished: i64) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "creationTimestamp": ts(0).to_string()},
            "status": {"phase": "Failed", "containerStatuses": [{
                "name": "main", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": code, "finishedAt": ts(finished).to_string()}}}]}
        }))
        .unwrap()
    }

    fn policy(v: serde_json::Value) -> PodFailurePolicy {
        serde_json::from_value(json!({ "rules": v })).unwrap()
    }

    #[test]
    fn back_off_doubles_from_ten_seconds_up_to_the_cap() {
        let secs: Vec<u64> = (1..=9).map(|n| backoff_delay(n).as_secs()).collect();
        assert_eq!(secs, [10, 20, 40, 80, 160, 320, 600, 600, 600]);
        assert_eq!(remaining_for(2, Some(ts(0)), ts(5)), Duration::from_secs(15));
        assert_eq!(remaining_for(2, Some(ts(0)), ts(25)), Duration::ZERO);
        assert_eq!(remaining_for(0, Some(ts(0)), ts(0)), Duration::ZERO);
    }

    #[test]
    fn a_success_resets_the_record() {
        let f1 = failed_pod("f1", 1, 10);
        let f2 = failed_pod("f2", 1, 30);
        let mut ok = failed_pod("ok", 0, 20);
        ok.status.as_mut().unwrap().phase = Some("Succeeded".into());
        let r = BackoffRecord::default().updated(&[], &[&f1]);
        assert_eq!(r, BackoffRecord { failures_after_last_success: 1, last_failure: Some(ts(10)) });
        let r = r.updated(&[], &[&f2]);
        assert_eq!(r.failures_after_last_success, 2);
        // the success at 20 wipes f1 (10) but not f2 (30)
        let r = BackoffRecord::default().updated(&[&ok], &[&f1, &f2]);
        assert_eq!(r, BackoffRecord { failures_after_last_success: 1, last_failure: Some(ts(30)) });
        assert_eq!(r.remaining(ts(35)), Duration::from_secs(5));
    }

    #[test]
    fn exit_code_rules_match_in_order() {
        let p = policy(json!([
            {"action": "Ignore", "onExitCodes": {"operator": "In", "values": [42]}},
            {"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "NotIn", "values": [0, 1]}},
            {"action": "Count", "onExitCodes": {"operator": "In", "values": [1]}},
        ]));
        let ignored = match_policy(Some(&p), &failed_pod("a", 42, 1));
        assert_eq!((ignored.counts, ignored.action), (false, Some(Action::Ignore)));
        let fatal = match_policy(Some(&p), &failed_pod("b", 3, 1));
        assert_eq!(fatal.action, Some(Action::FailJob));
        assert_eq!(
            fatal.fail_job.as_deref(),
            Some("Container main for pod ns/b failed with exit code 3 matching FailJob rule at index 1")
        );
        let counted = match_policy(Some(&p), &failed_pod("c", 1, 1));
        assert_eq!((counted.counts, counted.action), (true, Some(Action::Count)));
        assert_eq!(match_policy(None, &failed_pod("d", 3, 1)), PolicyMatch::NO_RULE);
    }

    #[test]
    fn condition_rules_match_pod_conditions() {
        let p = policy(json!([{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                              {"action": "FailJob", "onPodConditions": [{"type": "ConfigIssue", "status": "True"}]}]));
        let mut pod = failed_pod("e", 137, 1);
        pod.status.as_mut().unwrap().conditions =
            Some(vec![serde_json::from_value(json!({"type": "DisruptionTarget", "status": "True"})).unwrap()]);
        assert_eq!(match_policy(Some(&p), &pod).action, Some(Action::Ignore));
        pod.status.as_mut().unwrap().conditions =
            Some(vec![serde_json::from_value(json!({"type": "ConfigIssue", "status": "True"})).unwrap()]);
        assert_eq!(
            match_policy(Some(&p), &pod).fail_job.as_deref(),
            Some("Pod ns/e has condition ConfigIssue matching FailJob rule at index 1")
        );
    }

    #[test]
    fn finished_time_falls_back_in_upstream_order() {
        assert_eq!(finished_time(&failed_pod("a", 1, 7)), Some(ts(7)));
        let mut p = failed_pod("b", 1, 7);
        p.status.as_mut().unwrap().container_statuses = None;
        p.status.as_mut().unwrap().conditions =
            Some(vec![serde_json::from_value(json!({"type": "Ready", "status": "False", "lastTransitionTime": ts(5).to_string()})).unwrap()]);
        assert_eq!(finished_time(&p), Some(ts(5)));
        p.status.as_mut().unwrap().conditions = None;
        p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(ts(40)));
        p.metadata.deletion_grace_period_seconds = Some(30);
        assert_eq!(finished_time(&p), Some(ts(10)));
        p.metadata.deletion_timestamp = None;
        assert_eq!(finished_time(&p), Some(ts(0)));
    }
}
