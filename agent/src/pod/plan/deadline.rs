//! Time limits of a pod: `activeDeadlineSeconds` counted from `status.startTime` (upstream's
//! activeDeadlineHandler) and the grace periods of a stop.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// Where a pod stands against its activeDeadlineSeconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deadline {
    /// No deadline, or no start time yet.
    None,
    /// Passes in this long (plus a little, so the sync after it is past it).
    In(Duration),
    Exceeded,
}

/// Upstream's reason and message for a pod past its deadline.
pub const DEADLINE_REASON: &str = "DeadlineExceeded";
pub const DEADLINE_MESSAGE: &str = "Pod was active on the node longer than the specified deadline";

/// The pod's deadline at `now_ns` (Unix ns), counted from `start_time` (the status' startTime:
/// the one the agent wrote last, else the API's).
pub fn active_deadline(pod: &Pod, start_time: Option<&Time>, now_ns: i64) -> Deadline {
    let (Some(deadline), Some(start)) = (pod.spec.as_ref().and_then(|s| s.active_deadline_seconds), start_time) else {
        return Deadline::None;
    };
    let started: i64 = start.0.as_nanosecond().try_into().unwrap_or(0);
    let left = started.saturating_add(deadline.saturating_mul(1_000_000_000)).saturating_sub(now_ns);
    if left <= 0 {
        Deadline::Exceeded
    } else {
        Deadline::In(Duration::from_nanos(left.unsigned_abs()) + Duration::from_millis(100))
    }
}

/// The pod's grace period in seconds: the deletion's, else the spec's, else 30.
pub fn grace_seconds(pod: &Pod) -> i64 {
    pod.metadata
        .deletion_grace_period_seconds
        .or_else(|| pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds))
        .unwrap_or(30)
}

/// What `used_secs` leave of a grace period of `grace` seconds: at least 2 s (upstream's
/// minimum), except that a grace period of 0 stays 0.
pub fn grace_left(grace: i64, used_secs: u64) -> i64 {
    let used = i64::try_from(used_secs).unwrap_or(i64::MAX);
    if grace == 0 {
        0
    } else {
        grace.saturating_sub(used).max(2)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    const T0: i64 = 1_700_000_000_000_000_000;

    fn pod(deadline: Option<i64>, started: bool) -> Pod {
        let mut p = json!({"metadata": {"name": "p"}, "spec": {"containers": []}});
        if let Some(d) = deadline {
            p["spec"]["activeDeadlineSeconds"] = json!(d);
        }
        if started {
            p["status"] = json!({"startTime": "2023-11-14T22:13:20Z"});
        }
        serde_json::from_value(p).unwrap()
    }

    fn deadline_of(p: &Pod, now: i64) -> Deadline {
        active_deadline(p, p.status.as_ref().and_then(|s| s.start_time.as_ref()), now)
    }

    #[test]
    fn deadline_counts_from_the_start_time() {
        assert_eq!(deadline_of(&pod(None, true), T0), Deadline::None);
        assert_eq!(deadline_of(&pod(Some(10), false), T0), Deadline::None);
        assert_eq!(deadline_of(&pod(Some(10), true), T0), Deadline::In(Duration::from_millis(10_100)));
        assert_eq!(deadline_of(&pod(Some(10), true), T0 + 9_000_000_000), Deadline::In(Duration::from_millis(1_100)));
        assert_eq!(deadline_of(&pod(Some(10), true), T0 + 10_000_000_000), Deadline::Exceeded);
        assert_eq!(deadline_of(&pod(Some(i64::MAX), true), T0), Deadline::In(Duration::from_nanos(i64::MAX.unsigned_abs() - T0.unsigned_abs()) + Duration::from_millis(100)));
    }

    #[test]
    fn grace_periods() {
        let mut p = pod(None, false);
        assert_eq!(grace_seconds(&p), 30);
        p.spec.as_mut().unwrap().termination_grace_period_seconds = Some(5);
        assert_eq!(grace_seconds(&p), 5);
        p.metadata.deletion_grace_period_seconds = Some(0);
        assert_eq!(grace_seconds(&p), 0);
        assert_eq!(grace_left(30, 10), 20);
        assert_eq!(grace_left(30, 29), 2, "at least 2 s");
        assert_eq!(grace_left(0, 0), 0, "0 stays 0");
        assert_eq!(grace_left(5, u64::MAX), 2);
    }
}
