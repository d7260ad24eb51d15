//! The CronJob controller's decisions (upstream's cronjob_controllerv2), pure: from a CronJob,
//! the Jobs it owns and the time, what to create, delete, write and when to look again.
//!
//! - `status.active` lists the owned Jobs not finished; a Job that finished since the last
//!   look gets a SawCompletedJob event, a successful one moves `lastSuccessfulTime`.
//! - Finished Jobs beyond successfulJobsHistoryLimit / failedJobsHistoryLimit are deleted,
//!   oldest first.
//! - The schedule is read in `spec.timeZone` (else UTC); the run due is the most recent
//!   scheduled time after `lastScheduleTime` (else the creation time), not before
//!   `now - startingDeadlineSeconds`; more than 100 missed times is upstream's
//!   TooManyMissedTimes warning (and only the latest runs). A run is a Job named
//!   `<cronjob>-<scheduled time in minutes since the epoch>`: the name makes a run happen once,
//!   across restarts of the controller, since a second create of it is refused.
//! - concurrencyPolicy Forbid skips the run while a Job is active (JobAlreadyActive; it starts
//!   late once the active one finishes, unless the starting deadline passed), Replace deletes
//!   the active Jobs first, Allow runs them side by side. suspend stops new runs.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use k8s_semantics::cron::{time_zone, Schedule};

/// Upstream's limit before it stops counting missed start times.
pub const MAX_MISSED: usize = 100;
/// The annotation of a Job run by a CronJob: its scheduled time (RFC 3339, in the zone).
pub const SCHEDULED_TIMESTAMP: &str = "batch.kubernetes.io/cronjob-scheduled-timestamp";

#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// Delete this Job (background propagation).
    DeleteJob { name: String, reason: &'static str },
    /// Create the Job of the run scheduled at `scheduled`, then record it in the status (and a
    /// SuccessfulCreate event when this create made it: another instance may have been first).
    CreateJob { job: Box<Job>, scheduled: Timestamp },
    /// Write `status.active`, `lastScheduleTime` and `lastSuccessfulTime`.
    Status { active: Vec<ObjectReference>, last_schedule: Option<Timestamp>, last_successful: Option<Timestamp> },
    Event { warning: bool, reason: &'static str, message: String },
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    pub ops: Vec<Op>,
    /// When to look again (the next scheduled time), if ever.
    pub wake_at: Option<Timestamp>,
    /// Why no run starts now, in words (explanations).
    pub waiting: Vec<String>,
}

fn condition_true(job: &Job, t: &str) -> bool {
    job.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == t && c.status == "True"))
}

/// Finished: Complete or Failed (`Some(true)` for success).
pub fn finished(job: &Job) -> Option<bool> {
    if condition_true(job, "Complete") {
        Some(true)
    } else if condition_true(job, "Failed") {
        Some(false)
    } else {
        None
    }
}

pub fn reference(job: &Job) -> ObjectReference {
    ObjectReference {
        api_version: Some("batch/v1".into()),
        kind: Some("Job".into()),
        name: job.metadata.name.clone(),
        namespace: job.metadata.namespace.clone(),
        uid: job.metadata.uid.clone(),
        resource_version: job.metadata.resource_version.clone(),
        field_path: None,
    }
}

/// The Job of a run: `<cronjob>-<minutes since the epoch>`.
pub fn job_name(cron_job: &str, scheduled: Timestamp) -> String {
    format!("{cron_job}-{}", scheduled.as_second().div_euclid(60))
}

/// The Job for the run scheduled at `scheduled` (shown in `zone`), as upstream builds it from
/// the template: its labels and annotations, the scheduled-time annotation, an owner
/// reference to the CronJob.
pub fn job_for(cj: &CronJob, scheduled: Timestamp, zone: &jiff::tz::TimeZone) -> Job {
    let name = cj.metadata.name.clone().unwrap_or_default();
    let template = cj.spec.as_ref().map(|s| s.job_template.clone()).unwrap_or_default();
    let meta = template.metadata.unwrap_or_default();
    let mut annotations: BTreeMap<String, String> = meta.annotations.unwrap_or_default();
    annotations.insert(
        SCHEDULED_TIMESTAMP.into(),
        scheduled.to_zoned(zone.clone()).strftime("%Y-%m-%dT%H:%M:%S%:z").to_string().replace("+00:00", "Z"),
    );
    Job {
        metadata: ObjectMeta {
            name: Some(job_name(&name, scheduled)),
            namespace: cj.metadata.namespace.clone(),
            labels: meta.labels,
            annotations: Some(annotations),
            owner_references: Some(vec![OwnerReference {
                api_version: "batch/v1".into(),
                kind: "CronJob".into(),
                name,
                uid: cj.metadata.uid.clone().unwrap_or_default(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..Default::default()
        },
        spec: Some(template.spec.unwrap_or_default()),
        status: None,
    }
}

fn ts(t: &Time) -> Timestamp {
    t.0
}

/// Decides about one CronJob. `jobs` are the Jobs it controls.
pub fn plan(cj: &CronJob, jobs: &[&Job], now: Timestamp) -> Plan {
    let mut p = Plan::default();
    let name = cj.metadata.name.clone().unwrap_or_default();
    let Some(spec) = cj.spec.as_ref() else { return p };
    let status = cj.status.clone().unwrap_or_default();
    let was_active: Vec<String> = status.active.iter().flatten().filter_map(|r| r.name.clone()).collect();

    let mut active: Vec<&Job> = Vec::new();
    let mut done_ok: Vec<&Job> = Vec::new();
    let mut done_failed: Vec<&Job> = Vec::new();
    let mut last_successful = status.last_successful_time.as_ref().map(ts);
    for job in jobs {
        let job_name = job.metadata.name.clone().unwrap_or_default();
        match finished(job) {
            None if job.metadata.deletion_timestamp.is_none() => active.push(job),
            None => {}
            Some(ok) => {
                if was_active.contains(&job_name) {
                    let how = if ok { "Complete" } else { "Failed" };
                    p.ops.push(Op::Event { warning: false, reason: "SawCompletedJob", message: format!("Saw completed job: {job_name}, status: {how}") });
                }
                if ok {
                    let done = job.status.as_ref().and_then(|s| s.completion_time.as_ref()).map(ts);
                    if done.is_some_and(|d| last_successful.is_none_or(|l| d > l)) {
                        last_successful = done;
                    }
                    done_ok.push(job);
                } else {
                    done_failed.push(job);
                }
            }
        }
    }
    active.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));

    // History limits, oldest first (by start time, else creation).
    let started = |j: &&Job| {
        j.status.as_ref().and_then(|s| s.start_time.as_ref()).map(ts).or(j.metadata.creation_timestamp.as_ref().map(ts))
    };
    for (mut list, limit) in [
        (done_ok, spec.successful_jobs_history_limit.unwrap_or(3)),
        (done_failed, spec.failed_jobs_history_limit.unwrap_or(1)),
    ] {
        list.sort_by_key(started);
        let extra = list.len().saturating_sub(usize::try_from(limit.max(0)).unwrap_or(0));
        for j in list.iter().take(extra) {
            if j.metadata.deletion_timestamp.is_none() {
                p.ops.push(Op::DeleteJob { name: j.metadata.name.clone().unwrap_or_default(), reason: "SuccessfulDelete" });
            }
        }
    }

    let mut last_schedule = status.last_schedule_time.as_ref().map(ts);
    let mut active_refs: Vec<ObjectReference> = active.iter().map(|j| reference(j)).collect();
    let write_status = |p: &mut Plan, active: Vec<ObjectReference>, last_schedule: Option<Timestamp>| {
        let same = status.active.clone().unwrap_or_default().iter().map(|r| (&r.name, &r.uid)).eq(active.iter().map(|r| (&r.name, &r.uid)))
            && status.last_schedule_time.as_ref().map(ts) == last_schedule
            && status.last_successful_time.as_ref().map(ts) == last_successful;
        if !same {
            p.ops.push(Op::Status { active, last_schedule, last_successful });
        }
    };

    if cj.metadata.deletion_timestamp.is_some() || spec.suspend == Some(true) {
        p.waiting.push(if spec.suspend == Some(true) {
            "the CronJob is suspended (spec.suspend): no run starts until it is resumed".into()
        } else {
            "the CronJob is being deleted".into()
        });
        write_status(&mut p, active_refs, last_schedule);
        return p;
    }
    let zone_name = spec.time_zone.clone().unwrap_or_else(|| "UTC".into());
    let zone = match time_zone(&zone_name) {
        Ok(z) => z,
        Err(e) => {
            p.ops.push(Op::Event { warning: true, reason: "UnknownTimeZone", message: format!("invalid timeZone: {zone_name:?}: {e}") });
            write_status(&mut p, active_refs, last_schedule);
            return p;
        }
    };
    let schedule = match Schedule::parse(&spec.schedule) {
        Ok(s) => s,
        Err(e) => {
            p.ops.push(Op::Event { warning: true, reason: "UnparseableSchedule", message: format!("unparseable schedule: {:?} : {e}", spec.schedule) });
            write_status(&mut p, active_refs, last_schedule);
            return p;
        }
    };
    let created = cj.metadata.creation_timestamp.as_ref().map(ts).unwrap_or(now);
    let mut earliest = last_schedule.unwrap_or(created);
    if let Some(deadline) = spec.starting_deadline_seconds {
        let floor = now.checked_sub(jiff::SignedDuration::from_secs(deadline)).unwrap_or(now);
        if floor > earliest {
            earliest = floor;
        }
    }
    let now_z = now.to_zoned(zone.clone());
    let missed = schedule.times_between(&earliest.to_zoned(zone.clone()), &now_z, 1_000_000);
    p.wake_at = schedule.next_after(&now_z).map(|z| z.timestamp());
    let Some(due) = missed.last().map(|z| z.timestamp()) else {
        if let Some(next) = p.wake_at {
            let d = std::time::Duration::try_from(next.duration_since(now)).unwrap_or_default();
            p.waiting.push(format!("the next run is due at {next} (in {})", crate::controllers::explain::go_duration(d)));
        }
        write_status(&mut p, active_refs, last_schedule);
        return p;
    };
    if missed.len() > MAX_MISSED {
        p.ops.push(Op::Event {
            warning: true,
            reason: "TooManyMissedTimes",
            message: format!(
                "too many missed start times: {}. Set or decrease .spec.startingDeadlineSeconds or check clock skew",
                missed.len()
            ),
        });
    }
    let run = job_name(&name, due);
    if jobs.iter().any(|j| j.metadata.name.as_deref() == Some(run.as_str())) {
        // Already run (e.g. the status write was lost): record it.
        if last_schedule.is_none_or(|l| l < due) {
            last_schedule = Some(due);
        }
        write_status(&mut p, active_refs, last_schedule);
        return p;
    }
    match spec.concurrency_policy.as_deref() {
        Some("Forbid") if !active.is_empty() => {
            let names: Vec<&str> = active.iter().filter_map(|j| j.metadata.name.as_deref()).collect();
            p.waiting.push(format!(
                "the run due at {due} waits: {} still active and concurrencyPolicy is Forbid",
                names.join(", ")
            ));
            p.ops.push(Op::Event {
                warning: false,
                reason: "JobAlreadyActive",
                message: "Not starting job because prior execution is running and concurrency policy is Forbid".into(),
            });
            write_status(&mut p, active_refs, last_schedule);
            return p;
        }
        Some("Replace") => {
            for j in &active {
                p.ops.push(Op::DeleteJob { name: j.metadata.name.clone().unwrap_or_default(), reason: "SuccessfulDelete" });
            }
            active_refs.clear();
        }
        _ => {}
    }
    write_status(&mut p, active_refs, last_schedule);
    p.ops.push(Op::CreateJob { job: Box::new(job_for(cj, due, &zone)), scheduled: due });
    p
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn cron(spec: serde_json::Value, status: serde_json::Value) -> CronJob {
        let mut v = json!({
            "metadata": {"name": "tick", "namespace": "ns", "uid": "cj-1", "creationTimestamp": "2026-11-26T10:00:30Z"},
            "spec": {"schedule": "*/5 * * * *", "concurrencyPolicy": "Allow", "successfulJobsHistoryLimit": 3, "failedJobsHistoryLimit": 1,
                     "jobTemplate": {"metadata": {"labels": {"app": "tick"}}, "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i"}], "restartPolicy": "Never"}}}}},
            "status": status,
        });
        for (k, val) in spec.as_object().unwrap() {
            v["spec"][k] = val.clone();
        }
        serde_json::from_value(v).unwrap()
    }

    fn job(name: &str, state: Option<bool>, start: &str) -> Job {
        let mut v = json!({"metadata": {"name": name, "namespace": "ns", "uid": format!("u-{name}"), "creationTimestamp": start},
                           "status": {"startTime": start}});
        match state {
            Some(true) => v["status"]["conditions"] = json!([{"type": "Complete", "status": "True"}]),
            Some(false) => v["status"]["conditions"] = json!([{"type": "Failed", "status": "True"}]),
            None => {}
        }
        if state == Some(true) {
            v["status"]["completionTime"] = json!(start);
        }
        serde_json::from_value(v).unwrap()
    }

    fn created(p: &Plan) -> Vec<(String, Timestamp)> {
        p.ops
            .iter()
            .filter_map(|o| if let Op::CreateJob { job, scheduled } = o { Some((job.metadata.name.clone().unwrap(), *scheduled)) } else { None })
            .collect()
    }

    fn reasons(p: &Plan) -> Vec<&'static str> {
        p.ops.iter().filter_map(|o| if let Op::Event { reason, .. } = o { Some(*reason) } else { None }).collect()
    }

    #[test]
    fn nothing_runs_before_the_first_scheduled_time_and_the_wake_up_is_that_time() {
        let p = plan(&cron(json!({}), json!({})), &[], t("2026-11-26T10:03:00Z"));
        assert!(created(&p).is_empty());
        assert_eq!(p.wake_at, Some(t("2026-11-26T10:05:00Z")));
    }

    #[test]
    fn the_due_run_is_a_job_named_by_its_minute_with_the_template_and_an_owner() {
        let cj = cron(json!({"timeZone": "Europe/Paris"}), json!({}));
        let p = plan(&cj, &[], t("2026-11-26T10:05:20Z"));
        let c = created(&p);
        assert_eq!(c, vec![(format!("tick-{}", t("2026-11-26T10:05:00Z").as_second() / 60), t("2026-11-26T10:05:00Z"))]);
        let Some(Op::CreateJob { job: made, .. }) = p.ops.iter().find(|o| matches!(o, Op::CreateJob { .. })) else { unreachable!() };
        assert_eq!(made.metadata.labels.as_ref().unwrap()["app"], "tick");
        assert_eq!(made.metadata.annotations.as_ref().unwrap()[SCHEDULED_TIMESTAMP], "2026-11-26T11:05:00+01:00");
        let owner = &made.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!((owner.kind.as_str(), owner.uid.as_str(), owner.controller), ("CronJob", "cj-1", Some(true)));
        assert!(reasons(&p).is_empty(), "the executor says SuccessfulCreate once the create succeeded");
        assert_eq!(p.wake_at, Some(t("2026-11-26T10:10:00Z")));
        // Once the run exists, the same minute never creates it again.
        let existing = job_name("tick", t("2026-11-26T10:05:00Z"));
        let j = job(&existing, None, "2026-11-26T10:05:01Z");
        let again = plan(&cj, &[&j], t("2026-11-26T10:06:00Z"));
        assert!(created(&again).is_empty(), "{again:?}");
        assert!(again.ops.iter().any(|o| matches!(o, Op::Status { last_schedule: Some(s), active, .. } if *s == t("2026-11-26T10:05:00Z") && active.len() == 1)));
    }

    #[test]
    fn forbid_waits_for_the_active_job_replace_deletes_it_allow_runs_both() {
        let status = json!({"lastScheduleTime": "2026-11-26T10:05:00Z", "active": [{"kind": "Job", "name": "tick-a", "namespace": "ns", "uid": "u-tick-a"}]});
        let running = job("tick-a", None, "2026-11-26T10:05:00Z");
        let now = t("2026-11-26T10:10:10Z");
        let forbid = plan(&cron(json!({"concurrencyPolicy": "Forbid"}), status.clone()), &[&running], now);
        assert!(created(&forbid).is_empty());
        assert_eq!(reasons(&forbid), ["JobAlreadyActive"]);
        let replace = plan(&cron(json!({"concurrencyPolicy": "Replace"}), status.clone()), &[&running], now);
        assert!(replace.ops.contains(&Op::DeleteJob { name: "tick-a".into(), reason: "SuccessfulDelete" }));
        assert_eq!(created(&replace).len(), 1);
        let allow = plan(&cron(json!({}), status.clone()), &[&running], now);
        assert_eq!(created(&allow).len(), 1);
        assert!(!allow.ops.iter().any(|o| matches!(o, Op::DeleteJob { .. })));
        // Forbid, the active job done: the skipped 10:10 run starts (late), as upstream.
        let done = job("tick-a", Some(true), "2026-11-26T10:05:00Z");
        let later = plan(&cron(json!({"concurrencyPolicy": "Forbid"}), status), &[&done], t("2026-11-26T10:12:00Z"));
        assert_eq!(created(&later).iter().map(|c| c.1).collect::<Vec<_>>(), [t("2026-11-26T10:10:00Z")]);
        assert!(reasons(&later).contains(&"SawCompletedJob"));
        assert!(later.ops.iter().any(|o| matches!(o, Op::Status { last_successful: Some(_), .. })));
    }

    #[test]
    fn a_starting_deadline_drops_runs_too_late_and_many_missed_times_are_warned_about() {
        let status = json!({"lastScheduleTime": "2026-11-26T10:05:00Z"});
        // Down for 3 hours: 36 missed runs; only the latest runs.
        let p = plan(&cron(json!({}), status.clone()), &[], t("2026-11-26T13:07:00Z"));
        assert_eq!(created(&p).iter().map(|c| c.1).collect::<Vec<_>>(), [t("2026-11-26T13:05:00Z")]);
        assert!(!reasons(&p).contains(&"TooManyMissedTimes"));
        // Every minute for 3 hours: over 100.
        let p = plan(&cron(json!({"schedule": "* * * * *"}), status.clone()), &[], t("2026-11-26T13:07:00Z"));
        assert!(reasons(&p).contains(&"TooManyMissedTimes"), "{p:?}");
        assert_eq!(created(&p).len(), 1);
        // A 60 s deadline: the 13:05 run is too late at 13:07; nothing runs, wake at 13:10.
        let p = plan(&cron(json!({"startingDeadlineSeconds": 60}), status), &[], t("2026-11-26T13:07:00Z"));
        assert!(created(&p).is_empty(), "{p:?}");
        assert_eq!(p.wake_at, Some(t("2026-11-26T13:10:00Z")));
    }

    #[test]
    fn suspended_or_unparseable_cronjobs_run_nothing() {
        let p = plan(&cron(json!({"suspend": true}), json!({})), &[], t("2026-11-26T10:05:20Z"));
        assert!(created(&p).is_empty() && p.wake_at.is_none());
        let p = plan(&cron(json!({"schedule": "bad"}), json!({})), &[], t("2026-11-26T10:05:20Z"));
        assert_eq!(reasons(&p), ["UnparseableSchedule"]);
        let p = plan(&cron(json!({"timeZone": "Mars/Olympus"}), json!({})), &[], t("2026-11-26T10:05:20Z"));
        assert_eq!(reasons(&p), ["UnknownTimeZone"]);
    }

    #[test]
    fn finished_jobs_beyond_the_history_limits_go_oldest_first() {
        let ok: Vec<Job> = (0..5).map(|i| job(&format!("ok{i}"), Some(true), &format!("2026-11-26T0{i}:00:00Z"))).collect();
        let bad: Vec<Job> = (0..2).map(|i| job(&format!("bad{i}"), Some(false), &format!("2026-11-26T0{i}:30:00Z"))).collect();
        let all: Vec<&Job> = ok.iter().chain(bad.iter()).collect();
        let p = plan(&cron(json!({"suspend": true}), json!({})), &all, t("2026-11-26T10:00:00Z"));
        let deleted: Vec<&str> = p.ops.iter().filter_map(|o| if let Op::DeleteJob { name, .. } = o { Some(name.as_str()) } else { None }).collect();
        assert_eq!(deleted, ["ok0", "ok1", "bad0"]);
    }

    #[test]
    fn runs_follow_the_time_zone_across_daylight_saving() {
        // 02:30 every day in New York: none on 2026-03-08 (clocks jump 02:00 -> 03:00).
        let cj = cron(json!({"schedule": "30 2 * * *", "timeZone": "America/New_York"}), json!({"lastScheduleTime": "2026-03-07T07:30:00Z"}));
        let p = plan(&cj, &[], t("2026-03-08T12:00:00Z"));
        assert!(created(&p).is_empty(), "{p:?}");
        assert_eq!(p.wake_at, Some(t("2026-03-09T06:30:00Z")), "02:30 EDT the next day");
    }
}
