//! The control loop, in kube-runtime's `Controller` shape: Websites are watched, and so are
//! the Deployments and Services the operator labels (each event maps to its controlling
//! Website through the ownerReference); every change and a periodic resync run the named
//! [`reconcile`] for one Website: observe its objects, [`plan`], apply the ops. Failures are
//! retried by [`error_policy`].

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::Api;
use tracing::Instrument as _;

use crate::cluster::{Cluster, ClusterError};
use crate::plan::{plan, PlanError, MANAGED_BY};
use crate::website::Website;

/// What every reconcile shares.
pub struct Context<C> {
    pub cluster: C,
    /// When a Website is looked at again without any event (level-triggered repair).
    pub resync: Duration,
    /// When a failed reconcile is tried again.
    pub retry: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Cluster(#[from] ClusterError),
}

/// The current time in whole seconds (what a condition's lastTransitionTime keeps).
fn now() -> Time {
    let now = jiff::Timestamp::now();
    Time(jiff::Timestamp::from_second(now.as_second()).unwrap_or(now))
}

/// One reconcile of one Website, inside a span naming it.
pub async fn reconcile<C: Cluster>(
    site: Arc<Website>,
    ctx: Arc<Context<C>>,
) -> Result<Action, ReconcileError> {
    let span = tracing::info_span!("reconcile", website = %site.key());
    reconcile_at(&site, &ctx, &now()).instrument(span).await
}

/// [`reconcile`] with the time given (tests).
pub async fn reconcile_at<C: Cluster>(
    site: &Website,
    ctx: &Context<C>,
    now: &Time,
) -> Result<Action, ReconcileError> {
    let namespace = site
        .metadata
        .namespace
        .as_deref()
        .ok_or(PlanError::Missing("metadata.namespace"))?;
    let name = site
        .metadata
        .name
        .as_deref()
        .ok_or(PlanError::Missing("metadata.name"))?;
    let observed = ctx.cluster.observe(namespace, name).await?;
    let plan = plan(site, &observed, now)?;
    for op in &plan.ops {
        ctx.cluster.apply(namespace, name, op).await?;
        tracing::info!(op = %op.describe(), "applied");
    }
    if plan.ops.is_empty() {
        tracing::debug!("nothing to do");
    }
    Ok(Action::requeue(ctx.resync))
}

/// A failed reconcile is logged and tried again after `ctx.retry`.
pub fn error_policy<C: Cluster>(
    site: Arc<Website>,
    error: &ReconcileError,
    ctx: Arc<Context<C>>,
) -> Action {
    tracing::warn!(website = %site.key(), %error, "reconcile failed, retrying");
    Action::requeue(ctx.retry)
}

/// The label selector of the objects the operator makes.
pub fn children_selector() -> String {
    format!("{}={}", MANAGED_BY.0, MANAGED_BY.1)
}

/// Runs the controller over every namespace until SIGTERM or SIGINT.
pub async fn run<C: Cluster>(client: kube::Client, ctx: Arc<Context<C>>) {
    let children = watcher::Config::default().labels(&children_selector());
    Controller::new(
        Api::<Website>::all(client.clone()),
        watcher::Config::default(),
    )
    .owns(Api::<Deployment>::all(client.clone()), children.clone())
    .owns(Api::<Service>::all(client), children)
    .shutdown_on_signal()
    .run(reconcile, error_policy, ctx)
    .for_each(|result| async move {
        match result {
            Ok((obj, _)) => tracing::debug!(website = %obj, "reconciled"),
            Err(error) => tracing::warn!(%error, "controller"),
        }
    })
    .await;
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::cluster::FakeCluster;
    use crate::plan::Op;
    use crate::website::WebsiteSpec;

    fn ctx() -> Context<FakeCluster> {
        Context {
            cluster: FakeCluster::default(),
            resync: Duration::from_secs(300),
            retry: Duration::from_secs(5),
        }
    }

    fn site() -> Website {
        let mut w = Website::new(
            "hello",
            WebsiteSpec {
                replicas: 1,
                image: "busybox:1".into(),
                port: 8080,
                message: "hi".into(),
            },
        );
        w.metadata.namespace = Some("web".into());
        w.metadata.uid = Some("uid-1".into());
        w
    }

    #[tokio::test]
    async fn reconcile_creates_then_changes_nothing_the_second_time() {
        let ctx = ctx();
        let mut w = site();
        let now = Time(jiff::Timestamp::from_second(10).unwrap());
        let action = reconcile_at(&w, &ctx, &now).await.unwrap();
        assert_eq!(action, Action::requeue(Duration::from_secs(300)));
        let applied = ctx.cluster.take_applied();
        let kinds: Vec<&str> = applied
            .iter()
            .map(|(key, op)| {
                assert_eq!(key, "web/hello");
                match op {
                    Op::CreateDeployment(_) => "create deployment",
                    Op::CreateService(_) => "create service",
                    Op::UpdateStatus(_) => "status",
                    other => panic!("{other:?}"),
                }
            })
            .collect();
        assert_eq!(kinds, ["create deployment", "create service", "status"]);
        // The status stored, the objects there (the fake kept the creates): the Deployment
        // seen, the status moves from Creating to Progressing, and then nothing is left to do.
        let Some((_, Op::UpdateStatus(st))) = applied.last() else {
            panic!()
        };
        w.status = Some(st.clone());
        reconcile_at(&w, &ctx, &now).await.unwrap();
        let applied = ctx.cluster.take_applied();
        let [(_, Op::UpdateStatus(st))] = applied.as_slice() else {
            panic!("{applied:?}")
        };
        assert_eq!(st.conditions[0].reason, "Progressing");
        w.status = Some(st.clone());
        reconcile_at(&w, &ctx, &now).await.unwrap();
        assert!(ctx.cluster.take_applied().is_empty());
    }

    #[tokio::test]
    async fn a_website_without_namespace_is_an_error_not_a_write() {
        let ctx = ctx();
        let mut w = site();
        w.metadata.namespace = None;
        let now = Time(jiff::Timestamp::from_second(10).unwrap());
        let err = reconcile_at(&w, &ctx, &now).await.unwrap_err();
        assert_eq!(err.to_string(), "website has no metadata.namespace");
        assert!(ctx.cluster.take_applied().is_empty());
        assert_eq!(
            error_policy(Arc::new(w), &err, Arc::new(ctx)),
            Action::requeue(Duration::from_secs(5))
        );
    }

    #[test]
    fn children_are_selected_by_the_managed_by_label() {
        assert_eq!(
            children_selector(),
            "app.kubernetes.io/managed-by=ferro-demo-operator"
        );
    }
}
