//! Validation of writes to `jobs/status` (upstream `ValidateJobStatusUpdate` with the checks its
//! strategy enables since Jobs may be managed by other controllers, `spec.managedBy`): the
//! status must describe a possible Job (no Complete and Failed together, a completionTime only
//! when Complete, counters never negative, ...) and move only forward (terminal conditions
//! stay, counters do not decrease, completionTime and startTime do not change).
//!
//! As upstream, a check on the status alone only fails when the write changes what it looks
//! at: a Job already stored in a bad state can still get unrelated status updates (upstream
//! enables each `Reject*` option only when a field it looks at changes).

use serde_json::Value;

use crate::validation::{FieldError, FieldErrorKind};

fn invalid(field: &str, detail: &str) -> FieldError {
    FieldError { kind: FieldErrorKind::Invalid, field: field.to_string(), value: None, detail: detail.to_string() }
}

fn invalid_value(field: &str, value: &Value, detail: &str) -> FieldError {
    FieldError::invalid(field, value.clone(), detail)
}

fn cond_true(job: &Value, t: &str) -> bool {
    job.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| cs.iter().any(|c| c.get("type").and_then(Value::as_str) == Some(t) && c.get("status").and_then(Value::as_str) == Some("True")))
}

fn int(job: &Value, field: &str) -> i64 {
    job.pointer(&format!("/status/{field}")).and_then(Value::as_i64).unwrap_or(0)
}

fn status_field<'a>(job: &'a Value, field: &str) -> Option<&'a Value> {
    job.pointer(&format!("/status/{field}")).filter(|v| !v.is_null())
}

fn time(job: &Value, field: &str) -> Option<jiff::Timestamp> {
    status_field(job, field).and_then(Value::as_str).and_then(|s| s.parse().ok())
}

/// What changed between the stored and the written status: upstream enables most checks only
/// when a field they look at changes (`getStatusValidationOptions` with JobManagedBy).
struct Changed {
    finished: bool,
    complete: bool,
    failed: bool,
    failure_target: bool,
    completed_indexes: bool,
    failed_indexes: bool,
    active: bool,
    start_time: bool,
    completion_time: bool,
    uncounted: bool,
}

fn finished(job: &Value) -> bool {
    cond_true(job, "Complete") || cond_true(job, "Failed")
}

fn changed(old: &Value, new: &Value) -> Changed {
    let field = |f: &str| status_field(old, f) != status_field(new, f);
    Changed {
        finished: finished(old) != finished(new),
        complete: cond_true(old, "Complete") != cond_true(new, "Complete"),
        failed: cond_true(old, "Failed") != cond_true(new, "Failed"),
        failure_target: cond_true(old, "FailureTarget") != cond_true(new, "FailureTarget"),
        completed_indexes: field("completedIndexes"),
        failed_indexes: field("failedIndexes"),
        active: int(old, "active") != int(new, "active"),
        start_time: time(old, "startTime") != time(new, "startTime"),
        completion_time: time(old, "completionTime") != time(new, "completionTime"),
        uncounted: field("uncountedTerminatedPods"),
    }
}

/// Upstream `validateJobStatus`, each gated check only when its fields changed.
fn status_errors(job: &Value, c: &Changed) -> Vec<FieldError> {
    let mut errs = Vec::new();
    for f in ["active", "succeeded", "failed", "ready", "terminating"] {
        if let Some(v) = status_field(job, f).and_then(Value::as_i64).filter(|v| *v < 0) {
            errs.push(FieldError::invalid(format!("status.{f}"), v, "must be greater than or equal to 0"));
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    for list in ["succeeded", "failed"] {
        let items = job.pointer(&format!("/status/uncountedTerminatedPods/{list}")).and_then(Value::as_array).cloned().unwrap_or_default();
        for (i, uid) in items.iter().enumerate() {
            let field = format!("status.uncountedTerminatedPods.{list}[{i}]");
            let u = uid.as_str().unwrap_or_default();
            if u.is_empty() {
                errs.push(FieldError::invalid(field, u, "must not be empty"));
            } else if !seen.insert(u.to_string()) {
                errs.push(FieldError::duplicate(field, u));
            }
        }
    }
    let complete = cond_true(job, "Complete");
    let failed = cond_true(job, "Failed");
    let failure_target = cond_true(job, "FailureTarget");
    let criteria_met = cond_true(job, "SuccessCriteriaMet");
    let finished = complete || failed;
    if complete && failed && (c.complete || c.failed) {
        errs.push(invalid("status.conditions", "cannot set Complete=True and Failed=true conditions"));
    }
    if complete && failure_target && (c.complete || c.failure_target) {
        errs.push(invalid("status.conditions", "cannot set Complete=True and FailureTarget=true conditions"));
    }
    let completion = status_field(job, "completionTime");
    if let (Some(t), false, true) = (completion, complete, c.complete || c.completion_time) {
        errs.push(invalid_value("status.completionTime", t, "cannot set completionTime when there is no Complete=True condition"));
    }
    if completion.is_none() && complete && (c.complete || c.completion_time) {
        errs.push(FieldError::required("status.completionTime", "completionTime is required for Complete jobs"));
    }
    if let (Some(start), Some(end), true) = (time(job, "startTime"), time(job, "completionTime"), c.start_time || c.completion_time) {
        if end < start {
            errs.push(invalid_value(
                "status.completionTime",
                completion.unwrap_or(&Value::Null),
                "completionTime cannot be set before startTime",
            ));
        }
    }
    if finished && int(job, "active") > 0 && (c.finished || c.active) {
        errs.push(FieldError::invalid("status.active", int(job, "active"), "active>0 is invalid for finished job"));
    }
    if finished && status_field(job, "startTime").is_none() && (c.finished || c.start_time) {
        errs.push(FieldError::required("status.startTime", "startTime is required for finished job"));
    }
    let uncounted = ["succeeded", "failed"]
        .iter()
        .map(|l| job.pointer(&format!("/status/uncountedTerminatedPods/{l}")).and_then(Value::as_array).map_or(0, Vec::len))
        .sum::<usize>();
    if finished && uncounted > 0 && (c.finished || c.uncounted) {
        errs.push(invalid_value(
            "status.uncountedTerminatedPods",
            status_field(job, "uncountedTerminatedPods").unwrap_or(&Value::Null),
            "uncountedTerminatedPods needs to be empty for finished job",
        ));
    }
    let indexed = job.pointer("/spec/completionMode").and_then(Value::as_str) == Some("Indexed");
    if let Some(ci) = status_field(job, "completedIndexes").and_then(Value::as_str).filter(|s| !s.is_empty()) {
        if !indexed && c.completed_indexes {
            errs.push(FieldError::invalid(
                "status.completedIndexes",
                ci,
                "cannot set non-empty completedIndexes when non-indexed completion mode",
            ));
        }
    }
    if let Some(fi) = status_field(job, "failedIndexes") {
        if job.pointer("/spec/backoffLimitPerIndex").is_none_or(Value::is_null) && c.failed_indexes {
            errs.push(invalid_value("status.failedIndexes", fi, "cannot set non-null failedIndexes when backoffLimitPerIndex is null"));
        }
    }
    if criteria_met && failed {
        errs.push(invalid("status.conditions", "cannot set SuccessCriteriaMet=True and Failed=true conditions"));
    }
    if criteria_met && failure_target {
        errs.push(invalid("status.conditions", "cannot set SuccessCriteriaMet=True and FailureTarget=true conditions"));
    }
    if job.pointer("/spec/successPolicy").is_some_and(|p| !p.is_null()) && !criteria_met && complete {
        errs.push(invalid("status.conditions", "cannot set Complete=True for Job with SuccessPolicy unless SuccessCriteriaMet=True"));
    }
    errs
}

/// The errors of a write of `new` over `old` to `jobs/status`.
pub fn validate_update(old: &Value, new: &Value) -> Vec<FieldError> {
    let c = changed(old, new);
    let mut errs = status_errors(new, &c);
    for t in ["Failed", "Complete", "FailureTarget"] {
        if cond_true(old, t) && !cond_true(new, t) {
            errs.push(invalid("status.conditions", &format!("cannot disable the terminal {t}=True condition")));
        }
    }
    let indexed = new.pointer("/spec/completionMode").and_then(Value::as_str) == Some("Indexed");
    let scalable = indexed && new.pointer("/spec/completions").is_some() && new.pointer("/spec/completions") == new.pointer("/spec/parallelism");
    if int(new, "succeeded") < int(old, "succeeded") && !scalable {
        errs.push(FieldError::invalid("status.succeeded", int(new, "succeeded"), "cannot decrease the succeeded counter"));
    }
    if int(new, "failed") < int(old, "failed") {
        errs.push(FieldError::invalid("status.failed", int(new, "failed"), "cannot decrease the failed counter"));
    }
    if let (Some(n), Some(_), true) = (status_field(new, "completionTime"), status_field(old, "completionTime"), c.completion_time) {
        errs.push(invalid_value("status.completionTime", n, "completionTime cannot be mutated"));
    }
    let suspended = new.pointer("/spec/suspend").and_then(Value::as_bool).unwrap_or(false);
    if status_field(old, "startTime").is_some() && c.start_time && !suspended {
        errs.push(FieldError::required("status.startTime", "startTime cannot be removed for unsuspended job"));
    }
    if cond_true(old, "SuccessCriteriaMet") && !cond_true(new, "SuccessCriteriaMet") {
        errs.push(invalid("status.conditions", "cannot disable the SuccessCriteriaMet=True condition"));
    }
    if cond_true(old, "Complete") && !cond_true(old, "SuccessCriteriaMet") && cond_true(new, "SuccessCriteriaMet") {
        errs.push(invalid("status.conditions", "cannot set SuccessCriteriaMet=True for Job already has Complete=true conditions"));
    }
    errs
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn job(status: Value) -> Value {
        json!({"spec": {"completions": 1}, "status": status})
    }

    fn messages(old: Value, new: Value) -> Vec<String> {
        validate_update(&job(old), &job(new)).iter().map(FieldError::message).collect()
    }

    fn cond(t: &str) -> Value {
        json!({"type": t, "status": "True"})
    }

    #[test]
    fn the_controllers_own_steps_pass() {
        let running = json!({"startTime": "2026-01-01T00:00:00Z", "active": 1, "ready": 1});
        let criteria = json!({"startTime": "2026-01-01T00:00:00Z", "succeeded": 1, "conditions": [cond("SuccessCriteriaMet")]});
        let complete = json!({"startTime": "2026-01-01T00:00:00Z", "completionTime": "2026-01-01T00:01:00Z", "succeeded": 1,
                              "conditions": [cond("SuccessCriteriaMet"), cond("Complete")]});
        assert!(messages(json!({}), running.clone()).is_empty());
        assert!(messages(running, criteria.clone()).is_empty());
        assert!(messages(criteria, complete).is_empty());
        let target = json!({"startTime": "2026-01-01T00:00:00Z", "failed": 7, "conditions": [cond("FailureTarget")]});
        let failed = json!({"startTime": "2026-01-01T00:00:00Z", "failed": 7, "conditions": [cond("FailureTarget"), cond("Failed")]});
        assert!(messages(target, failed).is_empty());
    }

    #[test]
    fn impossible_states_and_backward_steps_are_refused_with_upstreams_words() {
        let start = "2026-01-01T00:00:00Z";
        assert_eq!(
            messages(json!({"startTime": start}), json!({"startTime": start, "completionTime": "2026-01-01T00:01:00Z",
                "conditions": [cond("Complete"), cond("Failed")]})),
            ["status.conditions: Invalid value: cannot set Complete=True and Failed=true conditions"]
        );
        assert_eq!(
            messages(json!({"startTime": start}), json!({"startTime": start, "conditions": [cond("Complete")]})),
            ["status.completionTime: Required value: completionTime is required for Complete jobs"]
        );
        assert_eq!(
            messages(json!({"startTime": start}), json!({"startTime": start, "completionTime": "2026-01-01T00:01:00Z"})),
            ["status.completionTime: Invalid value: \"2026-01-01T00:01:00Z\": cannot set completionTime when there is no Complete=True condition"]
        );
        let done = json!({"startTime": start, "completionTime": "2026-01-01T00:01:00Z", "succeeded": 2,
                          "conditions": [cond("SuccessCriteriaMet"), cond("Complete")]});
        assert_eq!(
            messages(done.clone(), json!({"startTime": start, "succeeded": 1})),
            [
                "status.conditions: Invalid value: cannot disable the terminal Complete=True condition",
                "status.succeeded: Invalid value: 1: cannot decrease the succeeded counter",
                "status.conditions: Invalid value: cannot disable the SuccessCriteriaMet=True condition",
            ]
        );
        let mut moved = done.clone();
        moved["completionTime"] = json!("2026-01-01T00:02:00Z");
        assert_eq!(messages(done, moved), ["status.completionTime: Invalid value: \"2026-01-01T00:02:00Z\": completionTime cannot be mutated"]);
        assert_eq!(
            messages(json!({"active": 1}), json!({"active": -1})),
            ["status.active: Invalid value: -1: must be greater than or equal to 0"]
        );
        assert_eq!(
            messages(json!({"startTime": start}), json!({})),
            ["status.startTime: Required value: startTime cannot be removed for unsuspended job"]
        );
    }

    #[test]
    fn a_job_stored_in_a_bad_state_still_takes_unrelated_updates() {
        let bad = json!({"startTime": "2026-01-01T00:00:00Z", "completionTime": "2026-01-01T00:01:00Z", "active": 2,
                         "conditions": [cond("Complete"), cond("Failed")]});
        let mut more = bad.clone();
        more["succeeded"] = json!(1);
        assert!(messages(bad, more).is_empty());
    }
}
