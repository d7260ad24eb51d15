//! Server-side printing of `batch/v1`: jobs and cron jobs.

use super::*;

pub(super) const JOB_COLUMNS: &[Column] = &[
    NAME,
    col("Status", "string", "Status of the job."),
    col("Completions", "string", D_JOB_SUCCEEDED),
    col("Duration", "string", "Time required to complete the job."),
    AGE,
    W_CONTAINERS,
    W_IMAGES,
    wide("Selector", "string", D_JOB_SELECTOR),
];

pub(super) const CRONJOB_COLUMNS: &[Column] = &[
    NAME,
    col("Schedule", "string", D_CJ_SCHEDULE),
    col("Timezone", "string", D_CJ_TIME_ZONE),
    col("Suspend", "boolean", D_CJ_SUSPEND),
    col("Active", "integer", D_CJ_ACTIVE),
    col("Last Schedule", "string", D_CJ_LAST_SCHEDULE),
    AGE,
    W_CONTAINERS,
    W_IMAGES,
    wide("Selector", "string", D_JOB_SELECTOR),
];

fn job_condition(obj: &Value, type_: &str) -> bool {
    condition_status(obj, &["status", "conditions"], type_) == Some("True")
}

pub(super) fn job_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    let succeeded = int(obj, &["status", "succeeded"]);
    let completions = match at(obj, &["spec", "completions"]).and_then(Value::as_i64) {
        Some(c) => format!("{succeeded}/{c}"),
        None => match int_or(obj, &["spec", "parallelism"], 1) {
            p if p > 1 => format!("{succeeded}/1 of {p}"),
            _ => format!("{succeeded}/1"),
        },
    };
    let duration = match (
        timestamp(at(obj, &["status", "startTime"])),
        timestamp(at(obj, &["status", "completionTime"])),
    ) {
        (None, _) => String::new(),
        (Some(start), None) => human_duration_nanos(now.as_nanosecond() - start.as_nanosecond()),
        (Some(start), Some(end)) => human_duration_nanos(end.as_nanosecond() - start.as_nanosecond()),
    };
    let status = if job_condition(obj, "Complete") {
        "Complete"
    } else if job_condition(obj, "Failed") {
        "Failed"
    } else if is_deleting(obj) {
        "Terminating"
    } else if job_condition(obj, "Suspended") {
        "Suspended"
    } else if job_condition(obj, "FailureTarget") {
        "FailureTarget"
    } else {
        "Running"
    };
    let (names, images) = template_containers(obj, &["spec", "template"]);
    vec![
        name(obj),
        s(status),
        s(completions),
        s(duration),
        age(obj, now),
        names,
        images,
        s(format_label_selector(at(obj, &["spec", "selector"]))),
    ]
}

pub(super) fn cron_job_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    let last_schedule = match at(obj, &["status", "lastScheduleTime"]) {
        Some(ts) => translate_timestamp_since(Some(ts), now),
        None => "<none>".into(),
    };
    let (names, images) = template_containers(obj, &["spec", "jobTemplate", "spec", "template"]);
    vec![
        name(obj),
        s(st(obj, &["spec", "schedule"])),
        s(at(obj, &["spec", "timeZone"]).and_then(Value::as_str).unwrap_or("<none>")),
        // Defaulting makes an unset suspend false.
        s(go_bool(boolean(obj, &["spec", "suspend"]).unwrap_or(false))),
        count(list(obj, &["status", "active"]).len()),
        s(last_schedule),
        age(obj, now),
        names,
        images,
        s(format_label_selector(at(obj, &["spec", "jobTemplate", "spec", "selector"]))),
    ]
}

// Column descriptions: upstream takes them from the API types' documentation.

const D_JOB_SUCCEEDED: &str = "The number of pods which reached phase Succeeded. The value increases monotonically for a given spec. However, it may decrease in reaction to scale down of elastic indexed jobs.";
const D_JOB_SELECTOR: &str = "A label query over pods that should match the pod count. Normally, the system sets this field for you. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors";
const D_CJ_SCHEDULE: &str = "The schedule in Cron format, see https://en.wikipedia.org/wiki/Cron.";
const D_CJ_TIME_ZONE: &str = "The time zone name for the given schedule, see https://en.wikipedia.org/wiki/List_of_tz_database_time_zones. If not specified, this will default to the time zone of the kube-controller-manager process. The set of valid time zone names and the time zone offset is loaded from the system-wide time zone database by the API server during CronJob validation and the controller manager during execution. If no system-wide time zone database can be found a bundled version of the database is used instead. If the time zone name becomes invalid during the lifetime of a CronJob or due to a change in host configuration, the controller will stop creating new new Jobs and will create a system event with the reason UnknownTimeZone. More information can be found in https://kubernetes.io/docs/concepts/workloads/controllers/cron-jobs/#time-zones";
const D_CJ_SUSPEND: &str = "This flag tells the controller to suspend subsequent executions, it does not apply to already started executions.  Defaults to false.";
const D_CJ_ACTIVE: &str = "A list of pointers to currently running jobs.";
const D_CJ_LAST_SCHEDULE: &str = "Information when was the last time the job was successfully scheduled.";
