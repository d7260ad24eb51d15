//! The TTL-after-finished planner (upstream `pkg/controller/ttlafterfinished`): when a finished
//! Job with `ttlSecondsAfterFinished` expires. Pure: the Job and the clock in, a decision out.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;

use crate::controllers::job::plan::{finish_time, is_finished};

/// What to do with a Job now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ttl {
    /// No TTL, not finished, or already being deleted.
    Skip,
    /// Look again after this long.
    After(Duration),
    /// Delete it (after checking a fresh copy).
    Expired,
}

/// Why a finished Job's expiry cannot be computed (upstream returns an error and retries).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum TtlError {
    #[error("unable to find the time when the Job {0} finished")]
    NoFinishTime(String),
}

/// Whether the loop cares about a Job at all (upstream `needsCleanup`, for the handlers).
pub fn needs_cleanup(job: &Job) -> bool {
    job.metadata.deletion_timestamp.is_none()
        && job.spec.as_ref().and_then(|s| s.ttl_seconds_after_finished).is_some()
        && is_finished(job)
}

/// Upstream `processTTL`: the time left until the Job's TTL after its finish runs out.
/// A finish in the future (clock skew) only postpones the cleanup.
pub fn decide(job: &Job, now: Timestamp) -> Result<Ttl, TtlError> {
    if !needs_cleanup(job) {
        return Ok(Ttl::Skip);
    }
    let ttl = job.spec.as_ref().and_then(|s| s.ttl_seconds_after_finished).unwrap_or(0).max(0);
    let name = format!(
        "{}/{}",
        job.metadata.namespace.as_deref().unwrap_or_default(),
        job.metadata.name.as_deref().unwrap_or_default()
    );
    let finished = finish_time(job).ok_or(TtlError::NoFinishTime(name))?;
    let expire_at = finished.checked_add(jiff::SignedDuration::from_secs(i64::from(ttl))).unwrap_or(finished);
    if now >= expire_at {
        return Ok(Ttl::Expired);
    }
    Ok(Ttl::After(Duration::try_from(expire_at.duration_since(now)).unwrap_or(Duration::ZERO)))
}

/// Whether the finish time lies in the future (a warning upstream logs).
pub fn finished_in_future(job: &Job, now: Timestamp) -> bool {
    finish_time(job).is_some_and(|t| t > now)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn job(ttl: Option<i32>, condition: Option<(&str, &str, Option<i64>)>) -> Job {
        let conditions: Vec<_> = condition
            .map(|(t, s, at)| {
                let mut c = json!({"type": t, "status": s});
                if let Some(at) = at {
                    c["lastTransitionTime"] = json!(ts(at).to_string());
                }
                c
            })
            .into_iter()
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": "pi", "namespace": "ns"},
            "spec": {"ttlSecondsAfterFinished": ttl, "template": {}},
            "status": {"conditions": conditions}
        }))
        .unwrap()
    }

    #[test]
    fn a_finished_job_expires_ttl_seconds_after_its_finish() {
        let j = job(Some(100), Some(("Complete", "True", Some(10))));
        assert_eq!(decide(&j, ts(50)), Ok(Ttl::After(Duration::from_secs(60))));
        assert_eq!(decide(&j, ts(110)), Ok(Ttl::Expired));
        assert_eq!(decide(&j, ts(500)), Ok(Ttl::Expired));
        let failed = job(Some(0), Some(("Failed", "True", Some(10))));
        assert_eq!(decide(&failed, ts(10)), Ok(Ttl::Expired), "ttl 0: at once");
    }

    #[test]
    fn jobs_without_ttl_unfinished_or_deleting_are_skipped() {
        assert_eq!(decide(&job(None, Some(("Complete", "True", Some(10)))), ts(500)), Ok(Ttl::Skip));
        assert_eq!(decide(&job(Some(1), None), ts(500)), Ok(Ttl::Skip));
        assert_eq!(decide(&job(Some(1), Some(("Complete", "False", Some(1)))), ts(500)), Ok(Ttl::Skip));
        assert_eq!(decide(&job(Some(1), Some(("SuccessCriteriaMet", "True", Some(1)))), ts(500)), Ok(Ttl::Skip));
        let mut deleting = job(Some(1), Some(("Complete", "True", Some(1))));
        deleting.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(ts(2)));
        assert_eq!(decide(&deleting, ts(500)), Ok(Ttl::Skip));
        assert!(!needs_cleanup(&deleting));
    }

    #[test]
    fn a_missing_finish_time_is_an_error_and_a_future_one_postpones() {
        assert_eq!(decide(&job(Some(1), Some(("Complete", "True", None))), ts(5)), Err(TtlError::NoFinishTime("ns/pi".into())));
        let future = job(Some(10), Some(("Complete", "True", Some(100))));
        assert!(finished_in_future(&future, ts(0)));
        assert_eq!(decide(&future, ts(0)), Ok(Ttl::After(Duration::from_secs(110))));
    }
}
