//! ServiceAccount controller: every active namespace has a `default` service account.

use std::sync::Arc;

use ferro_runtime::{spawn_resync, spawn_workers, Change, Informer, Next, WorkQueue};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, ResourceExt as _};

use crate::controllers::explain::{ExplainError, Explanation, Subject};
use crate::controllers::manager::{Informers, Options};
use crate::controllers::{is_conflict, Error};

/// A namespace created or changed (it may lack its `default` account).
pub fn keys_for_namespace(change: &Change<Namespace>) -> Vec<String> {
    match change {
        Change::Applied { new, .. } => vec![new.name_any()],
        Change::Deleted(_) => Vec::new(),
    }
}

/// The namespace of a deleted `default` account (which is created again).
pub fn keys_for_service_account(change: &Change<ServiceAccount>) -> Vec<String> {
    match change {
        Change::Deleted(sa) if sa.name_any() == "default" => vec![sa.namespace().unwrap_or_default()],
        _ => Vec::new(),
    }
}

/// What the workers share.
struct Context {
    client: kube::Client,
    namespaces: Arc<Informer<Namespace>>,
    accounts: Arc<Informer<ServiceAccount>>,
}

pub fn start(inf: &Arc<Informers>, opts: &Options) {
    let queue: WorkQueue<String> = WorkQueue::new();
    let namespaces = inf.namespaces();
    let accounts = inf.service_accounts();
    {
        let q = queue.clone();
        namespaces.on_change(move |c| {
            for k in keys_for_namespace(c) {
                q.add(k);
            }
        });
    }
    {
        let q = queue.clone();
        accounts.on_change(move |c| {
            for k in keys_for_service_account(c) {
                q.add(k);
            }
        });
    }
    {
        let ns = namespaces.clone();
        spawn_resync(queue.clone(), opts.resync, move || ns.list().iter().map(|n| n.name_any()).collect());
    }
    let ctx = Arc::new(Context { client: inf.client(), namespaces, accounts });
    {
        let ctx = ctx.clone();
        inf.explain().register("serviceaccount", Arc::new(move |key| Box::pin(explain(ctx.clone(), key.name))));
    }
    spawn_workers("serviceaccount", queue, 1, move |ns: String| reconcile(ctx.clone(), ns));
}

/// A dry run of [`reconcile`] for one namespace (the loop's key): its `default` account.
async fn explain(ctx: Arc<Context>, ns: String) -> Result<Explanation, ExplainError> {
    ctx.namespaces.wait_synced().await;
    ctx.accounts.wait_synced().await;
    let n = ctx.namespaces.get(None, &ns).ok_or_else(|| ExplainError::NotFound { resource: "namespaces".into(), name: ns.clone() })?;
    let mut e = Explanation::new("serviceaccount", Subject::of(n.as_ref()));
    let has = ctx.accounts.get(Some(&ns), "default").is_some();
    e.observed = serde_json::json!({"defaultServiceAccount": has});
    e.wants = serde_json::json!({"defaultServiceAccount": n.metadata.deletion_timestamp.is_none()});
    if n.metadata.deletion_timestamp.is_some() {
        e.waiting.push("nothing to do: the namespace is being deleted".into());
    } else if !has {
        e.actions.push("create ServiceAccount default".into());
    }
    Ok(e)
}

/// One pass over a namespace: create its `default` account when missing.
#[tracing::instrument(name = "reconcile", skip_all, fields(controller = "serviceaccount", key = %ns))]
async fn reconcile(ctx: Arc<Context>, ns: String) -> Result<Next, Error> {
    let Context { client, namespaces, accounts } = &*ctx;
    accounts.wait_synced().await;
    let Some(n) = namespaces.get(None, &ns) else { return Ok(Next::Done) };
    if n.metadata.deletion_timestamp.is_some() || accounts.get(Some(&ns), "default").is_some() {
        return Ok(Next::Done);
    }
    let sa = ServiceAccount {
        metadata: ObjectMeta { name: Some("default".into()), ..Default::default() },
        ..Default::default()
    };
    match Api::<ServiceAccount>::namespaced(client.clone(), &ns).create(&PostParams::default(), &sa).await {
        Ok(_) => Ok(Next::Done),
        Err(e) if is_conflict(&e) => Ok(Next::Done),
        // a namespace being deleted refuses new objects
        Err(kube::Error::Api(s)) if s.code == 403 => Ok(Next::Done),
        Err(e) => Err(Error::from(e)),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_namespace_change_is_a_key() {
        let ns: Arc<Namespace> = Arc::new(serde_json::from_value(json!({"metadata": {"name": "team"}})).unwrap());
        assert_eq!(keys_for_namespace(&Change::Applied { old: None, new: ns.clone() }), ["team"]);
        assert!(keys_for_namespace(&Change::Deleted(ns)).is_empty());
    }

    #[test]
    fn a_deleted_default_account_maps_to_its_namespace() {
        let sa = |name: &str| -> Arc<ServiceAccount> {
            Arc::new(serde_json::from_value(json!({"metadata": {"name": name, "namespace": "team"}})).unwrap())
        };
        assert_eq!(keys_for_service_account(&Change::Deleted(sa("default"))), ["team"]);
        assert!(keys_for_service_account(&Change::Deleted(sa("builder"))).is_empty());
        assert!(keys_for_service_account(&Change::Applied { old: None, new: sa("default") }).is_empty());
    }
}
