//! TTL-after-finished executor (upstream name "ttl-after-finished"): a finished Job with
//! `ttlSecondsAfterFinished` is deleted once that many seconds passed since its Complete or
//! Failed condition, after a fresh read confirms it (upstream checks the live object too),
//! with foreground propagation and uid + resourceVersion preconditions, as upstream does.

pub mod plan;

use std::sync::Arc;

use ferro_runtime::{spawn_resync, spawn_workers, Change, Informer, Next, ObjectKey, WorkQueue};
use k8s_openapi::api::batch::v1::Job;
use kube::api::{DeleteParams, Preconditions, PropagationPolicy};
use kube::Api;

use self::plan::{decide, finished_in_future, needs_cleanup, Ttl};
use crate::controllers::explain::{ExplainError, Explanation, Subject};
use crate::controllers::manager::{Informers, Options};
use crate::controllers::{is_conflict, is_not_found, Error};

struct Context {
    client: kube::Client,
    jobs: Arc<Informer<Job>>,
}

/// A Job change concerns the loop when the Job (now) has a TTL and is finished.
pub fn keys_for_job(change: &Change<Job>) -> Vec<ObjectKey> {
    match change {
        Change::Applied { new, .. } if needs_cleanup(new) => vec![ObjectKey::of(new.as_ref())],
        _ => Vec::new(),
    }
}

pub fn start(inf: &Arc<Informers>, opts: &Options) {
    let queue: WorkQueue<ObjectKey> = WorkQueue::new();
    let jobs = inf.jobs();
    {
        let q = queue.clone();
        jobs.on_change(move |c| {
            for k in keys_for_job(c) {
                q.add(k);
            }
        });
    }
    {
        let j = jobs.clone();
        spawn_resync(queue.clone(), opts.resync, move || j.list().iter().filter(|j| needs_cleanup(j)).map(|j| ObjectKey::of(j.as_ref())).collect());
    }
    let ctx = Arc::new(Context { client: inf.client(), jobs });
    {
        let ctx = ctx.clone();
        inf.explain().register("ttl-after-finished", Arc::new(move |key| Box::pin(explain(ctx.clone(), key))));
    }
    spawn_workers("ttl-after-finished", queue, 2, move |key: ObjectKey| reconcile(ctx.clone(), key));
}

/// A dry run of [`reconcile`] for one Job.
async fn explain(ctx: Arc<Context>, key: ObjectKey) -> Result<Explanation, ExplainError> {
    ctx.jobs.wait_synced().await;
    let job = ctx.jobs.get(key.namespace.as_deref(), &key.name).ok_or_else(|| ExplainError::not_found("jobs.batch", &key))?;
    let now = jiff::Timestamp::now();
    let mut e = Explanation::new("ttl-after-finished", Subject::of(job.as_ref()));
    let ttl = job.spec.as_ref().and_then(|s| s.ttl_seconds_after_finished);
    e.observed = serde_json::json!({
        "finished": crate::controllers::job::plan::is_finished(&job),
        "finishTime": crate::controllers::job::plan::finish_time(&job).map(|t| t.to_string()),
    });
    e.wants = serde_json::json!({"ttlSecondsAfterFinished": ttl});
    match decide(&job, now) {
        Ok(Ttl::Skip) => e.waiting.push(if ttl.is_none() {
            "nothing to do: the Job has no ttlSecondsAfterFinished".into()
        } else if job.metadata.deletion_timestamp.is_some() {
            "nothing to do: the Job is being deleted".into()
        } else {
            "the Job has not finished: its TTL starts when it does".into()
        }),
        Ok(Ttl::After(d)) => {
            e.waiting.push(format!("the Job is deleted when its TTL runs out, in {}", crate::controllers::explain::go_duration(d)));
            return Ok(e.requeue(Some(d)));
        }
        Ok(Ttl::Expired) => e.actions.push("delete the Job (foreground): its TTL after finishing ran out".into()),
        Err(err) => e.waiting.push(err.to_string()),
    }
    Ok(e)
}

/// One look at a Job: wait for its expiry, or delete it once expired.
#[tracing::instrument(name = "reconcile", skip_all, fields(controller = "ttl-after-finished", key = %key))]
async fn reconcile(ctx: Arc<Context>, key: ObjectKey) -> Result<Next, Error> {
    ctx.jobs.wait_synced().await;
    let Some(cached) = ctx.jobs.get(key.namespace.as_deref(), &key.name) else { return Ok(Next::Done) };
    let now = jiff::Timestamp::now();
    if finished_in_future(&cached, now) {
        tracing::warn!("found a Job finished in the future; likely clock skew in the cluster, its cleanup is deferred");
    }
    match decide(&cached, now).map_err(|e| Error::Other(e.to_string()))? {
        Ttl::Skip => return Ok(Next::Done),
        Ttl::After(d) => return Ok(Next::After(d)),
        Ttl::Expired => {}
    }
    // the cache may be stale (the TTL changed, the Job was recreated): decide on a fresh copy
    let api: Api<Job> = Api::namespaced(ctx.client.clone(), key.namespace.as_deref().unwrap_or_default());
    let Some(fresh) = api.get_opt(&key.name).await? else { return Ok(Next::Done) };
    match decide(&fresh, jiff::Timestamp::now()).map_err(|e| Error::Other(e.to_string()))? {
        Ttl::Skip => return Ok(Next::Done),
        Ttl::After(d) => return Ok(Next::After(d)),
        Ttl::Expired => {}
    }
    let dp = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Foreground),
        preconditions: Some(Preconditions { uid: fresh.metadata.uid.clone(), resource_version: fresh.metadata.resource_version.clone() }),
        ..DeleteParams::default()
    };
    tracing::info!("cleaning up a Job whose TTL after finishing expired");
    match api.delete(&key.name, &dp).await {
        Ok(_) => Ok(Next::Done),
        Err(e) if is_not_found(&e) => Ok(Next::Done),
        // changed since the read: look again
        Err(e) if is_conflict(&e) => Ok(Next::After(std::time::Duration::from_millis(200))),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn job(ttl: Option<i32>, finished: bool) -> Arc<Job> {
        let conditions: Vec<_> =
            if finished { vec![json!({"type": "Failed", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"})] } else { vec![] };
        Arc::new(
            serde_json::from_value(json!({"metadata": {"name": "pi", "namespace": "ns"},
                "spec": {"ttlSecondsAfterFinished": ttl, "template": {}}, "status": {"conditions": conditions}}))
            .unwrap(),
        )
    }

    #[test]
    fn only_finished_jobs_with_a_ttl_are_keys() {
        let key = ObjectKey::new(Some("ns"), "pi");
        assert_eq!(keys_for_job(&Change::Applied { old: None, new: job(Some(5), true) }), [key]);
        assert!(keys_for_job(&Change::Applied { old: None, new: job(None, true) }).is_empty());
        assert!(keys_for_job(&Change::Applied { old: None, new: job(Some(5), false) }).is_empty());
        assert!(keys_for_job(&Change::Deleted(job(Some(5), true))).is_empty());
    }
}
