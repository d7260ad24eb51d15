//! ClusterRole aggregation (upstream's `clusterrole-aggregation` controller): a ClusterRole
//! with an `aggregationRule` carries the rules of the ClusterRoles its selectors select, kept
//! current as they come, change and go (upstream's admin, edit and view are made this way,
//! and a new ClusterRole labelled `rbac.authorization.k8s.io/aggregate-to-view: "true"`
//! extends view). The pure planner is `plan.rs`; this is the loop: the shared ClusterRole
//! informer -> every aggregated role's name -> `reconcile`, which writes the rules.

pub mod plan;

use std::sync::Arc;

use ferro_runtime::{spawn_resync, spawn_workers, Informer, Next, WorkQueue};
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::PostParams;
use kube::{Api, ResourceExt as _};
use serde_json::json;

use crate::controllers::explain::{ExplainError, Explanation, Subject};
use crate::controllers::manager::{Informers, Options};
use crate::controllers::{is_conflict, is_not_found, Error};

pub const NAME: &str = "clusterrole-aggregation";

struct Context {
    client: kube::Client,
    roles: Arc<Informer<ClusterRole>>,
}

pub fn start(inf: &Arc<Informers>, opts: &Options) {
    let queue: WorkQueue<String> = WorkQueue::new();
    let roles = inf.cluster_roles();
    {
        let (q, r) = (queue.clone(), roles.clone());
        roles.on_change(move |_| plan::keys_for_cluster_role(&r.list()).into_iter().for_each(|k| q.add(k)));
    }
    {
        let r = roles.clone();
        spawn_resync(queue.clone(), opts.resync, move || plan::keys_for_cluster_role(&r.list()));
    }
    {
        // the shared informer may have listed before this handler was added
        let (r, q) = (roles.clone(), queue.clone());
        tokio::spawn(async move {
            r.wait_synced().await;
            plan::keys_for_cluster_role(&r.list()).into_iter().for_each(|k| q.add(k));
        });
    }
    let ctx = Arc::new(Context { client: inf.client(), roles });
    {
        let ctx = ctx.clone();
        inf.explain().register(NAME, Arc::new(move |key| Box::pin(explain(ctx.clone(), key.name))));
    }
    spawn_workers(NAME, queue, 1, move |name: String| reconcile(ctx.clone(), name));
}

/// A dry run for one ClusterRole (`/debug/controllers/clusterrole-aggregation/<name>`).
async fn explain(ctx: Arc<Context>, name: String) -> Result<Explanation, ExplainError> {
    ctx.roles.wait_synced().await;
    let role = ctx.roles.get(None, &name).ok_or_else(|| ExplainError::NotFound { resource: "clusterroles.rbac.authorization.k8s.io".into(), name: name.clone() })?;
    let mut e = Explanation::new(NAME, Subject::of(role.as_ref()));
    e.observed = json!({"rules": role.rules.as_ref().map_or(0, Vec::len)});
    let Some(rule) = role.aggregation_rule.as_ref() else {
        e.waiting.push("nothing to do: the ClusterRole has no aggregationRule".into());
        return Ok(e);
    };
    e.wants = json!({"clusterRoleSelectors": rule.cluster_role_selectors});
    let all = ctx.roles.list();
    match plan::plan(&role, &all) {
        None => {}
        Some(Ok(rules)) => e.actions.push(format!("update the ClusterRole's rules to the {} gathered from the selected ClusterRoles", rules.len())),
        Some(Err(why)) => e.waiting.push(format!("a selector does not parse: {why}")),
    }
    Ok(e)
}

/// One pass over an aggregated ClusterRole: its rules set to what its selectors gather.
#[tracing::instrument(name = "reconcile", skip_all, fields(controller = NAME, key = %name))]
async fn reconcile(ctx: Arc<Context>, name: String) -> Result<Next, Error> {
    ctx.roles.wait_synced().await;
    let Some(role) = ctx.roles.get(None, &name) else { return Ok(Next::Done) };
    let all = ctx.roles.list();
    let rules = match plan::plan(&role, &all) {
        None => return Ok(Next::Done),
        Some(Ok(rules)) => rules,
        // the API validates selectors: only a role stored before that could have one
        Some(Err(why)) => return Err(Error::Other(why)),
    };
    let mut want = (*role).clone();
    want.rules = Some(rules);
    match Api::<ClusterRole>::all(ctx.client.clone()).replace(&role.name_any(), &PostParams::default(), &want).await {
        Ok(_) => Ok(Next::Done),
        // the cache is behind: the change comes back as an event
        Err(e) if is_conflict(&e) || is_not_found(&e) => Ok(Next::Done),
        Err(e) => Err(Error::from(e)),
    }
}
