//! CronJob controller executor (upstream's "cronjob"): informers on CronJobs and Jobs, the pure
//! planner, and wake-ups at the next scheduled time on the controllers' [`Clock`].

pub mod plan;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ferro_runtime::events::Recorder;
use ferro_runtime::{spawn_resync, spawn_workers, Change, Informer, Next, ObjectKey, WorkQueue};
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt as _};
use serde_json::json;

use self::plan::Op;
use crate::controllers::clock::Clock;
use crate::controllers::explain::{ExplainError, Explanation, Subject};
use crate::controllers::manager::{Informers, Options};
use crate::controllers::replicaset::controller_of;
use crate::controllers::{is_conflict, is_not_found, Error};

/// A CronJob changed.
pub fn keys_for_cron_job(change: &Change<CronJob>) -> Vec<ObjectKey> {
    vec![ObjectKey::of(change.object().as_ref())]
}

/// A Job changed: the CronJob controlling it.
pub fn keys_for_job(change: &Change<Job>) -> Vec<ObjectKey> {
    let job = change.object();
    let ns = job.namespace().unwrap_or_default();
    controller_of(job.owner_references())
        .filter(|r| r.kind == "CronJob" && r.api_version.starts_with("batch/"))
        .map(|r| ObjectKey::new(Some(&ns), &r.name))
        .into_iter()
        .collect()
}

struct Context {
    client: kube::Client,
    recorder: Recorder,
    cron_jobs: Arc<Informer<CronJob>>,
    jobs: Arc<Informer<Job>>,
    clock: Clock,
    queue: WorkQueue<ObjectKey>,
    /// The wake-up each CronJob waits for (one timer task per key and time).
    wakes: Mutex<HashMap<ObjectKey, Timestamp>>,
}

pub fn start(inf: &Arc<Informers>, opts: &Options) {
    let queue: WorkQueue<ObjectKey> = WorkQueue::new();
    let (cron_jobs, jobs) = (inf.cron_jobs(), inf.jobs());
    {
        let q = queue.clone();
        cron_jobs.on_change(move |c| keys_for_cron_job(c).into_iter().for_each(|k| q.add(k)));
        let q = queue.clone();
        jobs.on_change(move |c| keys_for_job(c).into_iter().for_each(|k| q.add(k)));
        let cjs = cron_jobs.clone();
        spawn_resync(queue.clone(), opts.resync, move || cjs.list().iter().map(|c| ObjectKey::of(c.as_ref())).collect());
    }
    let ctx = Arc::new(Context {
        recorder: Recorder::new(inf.client(), "cronjob-controller"),
        client: inf.client(),
        cron_jobs,
        jobs,
        clock: opts.clock.clone(),
        queue: queue.clone(),
        wakes: Mutex::new(HashMap::new()),
    });
    {
        let ctx = ctx.clone();
        inf.explain().register("cronjob", Arc::new(move |key| Box::pin(explain(ctx.clone(), key))));
    }
    spawn_workers("cronjob", queue, 2, move |key: ObjectKey| reconcile(ctx.clone(), key));
}

/// The Jobs a CronJob controls.
fn owned_jobs(ctx: &Context, cj: &CronJob) -> Vec<Arc<Job>> {
    let ns = cj.namespace();
    let uid = cj.metadata.uid.clone().unwrap_or_default();
    ctx.jobs
        .list()
        .into_iter()
        .filter(|j| j.namespace() == ns)
        .filter(|j| controller_of(j.owner_references()).is_some_and(|r| r.kind == "CronJob" && r.uid == uid))
        .collect()
}

/// A dry run of [`reconcile`] for one CronJob.
async fn explain(ctx: Arc<Context>, key: ObjectKey) -> Result<Explanation, ExplainError> {
    ctx.cron_jobs.wait_synced().await;
    ctx.jobs.wait_synced().await;
    let cj = ctx.cron_jobs.get(key.namespace.as_deref(), &key.name).ok_or_else(|| ExplainError::not_found("cronjobs.batch", &key))?;
    let owned = owned_jobs(&ctx, &cj);
    let refs: Vec<&Job> = owned.iter().map(AsRef::as_ref).collect();
    let now = ctx.clock.now();
    let plan = plan::plan(&cj, &refs, now);
    let spec = cj.spec.clone().unwrap_or_default();
    let mut e = Explanation::new("cronjob", Subject::of(cj.as_ref()));
    e.observed = json!({
        "now": now.to_string(),
        "jobs": owned.iter().map(|j| {
            let state = match plan::finished(j) {
                Some(true) => "Complete",
                Some(false) => "Failed",
                None if j.metadata.deletion_timestamp.is_some() => "Terminating",
                None => "Active",
            };
            json!({"name": j.name_any(), "state": state})
        }).collect::<Vec<_>>(),
        "lastScheduleTime": cj.status.as_ref().and_then(|s| s.last_schedule_time.as_ref()).map(|t| t.0.to_string()),
    });
    e.wants = json!({
        "schedule": spec.schedule,
        "timeZone": spec.time_zone.as_deref().unwrap_or("UTC"),
        "concurrencyPolicy": spec.concurrency_policy.as_deref().unwrap_or("Allow"),
        "nextRun": plan.wake_at.map(|t| t.to_string()),
    });
    for op in &plan.ops {
        e.actions.push(match op {
            Op::DeleteJob { name, .. } => format!("delete Job {name}"),
            Op::CreateJob { job, scheduled } => format!("create Job {} for the run due at {scheduled}", job.name_any()),
            Op::Status { active, last_schedule, .. } => {
                let names: Vec<&str> = active.iter().filter_map(|r| r.name.as_deref()).collect();
                let last = last_schedule.map(|t| t.to_string()).unwrap_or_else(|| "none".into());
                format!("write status: active [{}], lastScheduleTime {last}", names.join(", "))
            }
            Op::Event { warning, reason, message } => {
                format!("record {} event {reason}: {message}", if *warning { "Warning" } else { "Normal" })
            }
        });
    }
    e.waiting = plan.waiting.clone();
    let after = plan.wake_at.map(|t| std::time::Duration::try_from(t.duration_since(now)).unwrap_or_default());
    Ok(e.requeue(after))
}

/// Makes sure `key` is looked at again at `at` (on the controllers' clock).
fn wake_at(ctx: &Arc<Context>, key: &ObjectKey, at: Timestamp) {
    let mut wakes = ctx.wakes.lock().unwrap_or_else(|p| p.into_inner());
    if wakes.get(key) == Some(&at) {
        return;
    }
    wakes.insert(key.clone(), at);
    let (ctx, key) = (Arc::clone(ctx), key.clone());
    tokio::spawn(async move {
        ctx.clock.sleep_until(at).await;
        let due = {
            let mut wakes = ctx.wakes.lock().unwrap_or_else(|p| p.into_inner());
            let due = wakes.get(&key) == Some(&at);
            if due {
                wakes.remove(&key);
            }
            due
        };
        if due {
            ctx.queue.add(key);
        }
    });
}

/// One pass over a CronJob.
#[tracing::instrument(name = "reconcile", skip_all, fields(controller = "cronjob", key = %key))]
async fn reconcile(ctx: Arc<Context>, key: ObjectKey) -> Result<Next, Error> {
    ctx.cron_jobs.wait_synced().await;
    ctx.jobs.wait_synced().await;
    let ns = key.namespace.clone().unwrap_or_default();
    let Some(cj) = ctx.cron_jobs.get(Some(&ns), &key.name) else {
        ctx.wakes.lock().unwrap_or_else(|p| p.into_inner()).remove(&key);
        return Ok(Next::Done);
    };
    let all = owned_jobs(&ctx, &cj);
    let owned: Vec<&Job> = all.iter().map(AsRef::as_ref).collect();
    let plan = plan::plan(&cj, &owned, ctx.clock.now());
    tracing::debug!(?plan, "plan");
    let cjs: Api<CronJob> = Api::namespaced(ctx.client.clone(), &ns);
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &ns);
    let pp = PatchParams::default();
    let mut active: Vec<ObjectReference> = cj.status.as_ref().and_then(|s| s.active.clone()).unwrap_or_default();
    let stamp = |t: Timestamp| t.round(jiff::Unit::Second).map(|t| t.to_string()).unwrap_or_default();
    for op in plan.ops {
        match op {
            Op::DeleteJob { name, reason } => {
                match jobs.delete(&name, &DeleteParams::background()).await {
                    Err(e) if is_not_found(&e) => {}
                    r => {
                        r?;
                    }
                }
                ctx.recorder.record(cj.as_ref(), "Normal", reason, format!("Deleted job {name}"));
            }
            Op::Status { active: refs, last_schedule, last_successful } => {
                active = refs;
                let status = json!({"status": {
                    "active": if active.is_empty() { serde_json::Value::Null } else { json!(active) },
                    "lastScheduleTime": last_schedule.map(stamp),
                    "lastSuccessfulTime": last_successful.map(stamp),
                }});
                cjs.patch_status(&key.name, &pp, &Patch::Merge(&status)).await?;
            }
            Op::CreateJob { job, scheduled } => {
                let made = match jobs.create(&PostParams::default(), &job).await {
                    Ok(j) => {
                        ctx.recorder.record(cj.as_ref(), "Normal", "SuccessfulCreate", format!("Created job {}", job.name_any()));
                        j
                    }
                    // Made before (a lost status write, or another replica): the name says so.
                    Err(e) if is_conflict(&e) => jobs.get(&job.name_any()).await?,
                    Err(e) => return Err(e.into()),
                };
                active.retain(|r| r.name != made.metadata.name);
                active.push(plan::reference(&made));
                let status = json!({"status": {"active": active, "lastScheduleTime": stamp(scheduled)}});
                cjs.patch_status(&key.name, &pp, &Patch::Merge(&status)).await?;
            }
            Op::Event { warning, reason, message } => {
                ctx.recorder.record(cj.as_ref(), if warning { "Warning" } else { "Normal" }, reason, message);
            }
        }
    }
    if let Some(at) = plan.wake_at {
        wake_at(&ctx, &key, at);
    }
    Ok(Next::Done)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_job_maps_to_the_cron_job_controlling_it() {
        let job: Arc<Job> = Arc::new(
            serde_json::from_value(json!({"metadata": {"name": "tick-1", "namespace": "ns", "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "CronJob", "name": "tick", "uid": "u", "controller": true}]}}))
            .unwrap(),
        );
        assert_eq!(keys_for_job(&Change::Applied { old: None, new: job }), vec![ObjectKey::new(Some("ns"), "tick")]);
        let orphan: Arc<Job> = Arc::new(serde_json::from_value(json!({"metadata": {"name": "x", "namespace": "ns"}})).unwrap());
        assert!(keys_for_job(&Change::Deleted(orphan)).is_empty());
    }
}
