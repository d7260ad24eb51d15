//! Namespace controller: a namespace being deleted has everything in it deleted, then its
//! `kubernetes` finalizer removed (which completes the deletion).

use std::sync::Arc;
use std::time::Duration;

use ferro_runtime::{spawn_resync, spawn_workers, Change, Next, WorkQueue};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{ApiResource, DeleteParams, DynamicObject, ListParams, PostParams};
use kube::{Api, ResourceExt as _};

use crate::controllers::explain::{ExplainError, Explanation, Subject};
use crate::controllers::manager::{Informers, Options};
use crate::controllers::{is_not_found, Error};
use crate::resources::RESOURCES;

/// The namespaced kinds the server serves, as dynamic API resources.
pub fn namespaced_kinds() -> Vec<ApiResource> {
    RESOURCES
        .iter()
        .filter(|r| r.namespaced)
        .map(|r| ApiResource {
            group: r.group.into(),
            version: r.version.into(),
            api_version: r.api_version(),
            kind: r.kind.into(),
            plural: r.plural.into(),
        })
        .collect()
}

/// A namespace being deleted (the only ones this loop has work for).
pub fn keys_for_namespace(change: &Change<Namespace>) -> Vec<String> {
    match change {
        Change::Applied { new, .. } if new.metadata.deletion_timestamp.is_some() => vec![new.name_any()],
        _ => Vec::new(),
    }
}

pub fn start(inf: &Arc<Informers>, opts: &Options) {
    let queue: WorkQueue<String> = WorkQueue::new();
    let namespaces = inf.namespaces();
    {
        let q = queue.clone();
        namespaces.on_change(move |c| {
            for k in keys_for_namespace(c) {
                q.add(k);
            }
        });
    }
    {
        let ns = namespaces.clone();
        spawn_resync(queue.clone(), opts.resync, move || {
            ns.list().iter().filter(|n| n.metadata.deletion_timestamp.is_some()).map(|n| n.name_any()).collect()
        });
    }
    let client = inf.client();
    {
        let client = client.clone();
        inf.explain().register("namespace", Arc::new(move |key| Box::pin(explain(client.clone(), key.name))));
    }
    spawn_workers("namespace", queue, 2, move |name: String| {
        let client = client.clone();
        async move { reconcile(client, &name).await }
    });
}

/// A dry run of [`reconcile`] for one namespace: what is left in it, by kind, and what the
/// loop would delete.
async fn explain(client: kube::Client, name: String) -> Result<Explanation, ExplainError> {
    let api: Api<Namespace> = Api::all(client.clone());
    let not_found = || ExplainError::NotFound { resource: "namespaces".into(), name: name.clone() };
    let ns = api.get_opt(&name).await.map_err(|_| not_found())?.ok_or_else(not_found)?;
    let mut e = Explanation::new("namespace", Subject::of(&ns));
    let finalizers = ns.spec.as_ref().and_then(|s| s.finalizers.clone()).unwrap_or_default();
    e.wants = serde_json::json!({"phase": if ns.metadata.deletion_timestamp.is_some() { "gone" } else { "Active" }});
    if ns.metadata.deletion_timestamp.is_none() {
        e.observed = serde_json::json!({"finalizers": finalizers});
        e.waiting.push("nothing to do: the namespace is not being deleted".into());
        return Ok(e);
    }
    let mut left = serde_json::Map::new();
    for ar in namespaced_kinds() {
        let objs: Api<DynamicObject> = Api::namespaced_with(client.clone(), &name, &ar);
        let Ok(list) = objs.list_metadata(&ListParams::default()).await else { continue };
        if list.items.is_empty() {
            continue;
        }
        let live = list.items.iter().filter(|o| o.metadata.deletion_timestamp.is_none()).count();
        if live > 0 {
            e.actions.push(format!("delete the {live} {} in it", ar.plural));
        }
        let held: Vec<String> = list
            .items
            .iter()
            .filter(|o| o.metadata.deletion_timestamp.is_some())
            .map(|o| format!("{} (finalizers {})", o.name_any(), o.finalizers().join(", ")))
            .collect();
        if !held.is_empty() {
            e.waiting.push(format!("{} being deleted: {}", ar.plural, held.join("; ")));
        }
        left.insert(ar.plural.clone(), serde_json::json!(list.items.len()));
    }
    e.observed = serde_json::json!({"finalizers": finalizers, "objectsLeft": left});
    if left.is_empty() && finalizers.iter().any(|f| f == "kubernetes") {
        e.actions.push("remove the kubernetes finalizer (namespaces/finalize)".into());
    }
    Ok(e)
}

/// One pass over a namespace being deleted: delete what is in it, then finalize it.
#[tracing::instrument(name = "reconcile", skip_all, fields(controller = "namespace", key = %name))]
async fn reconcile(client: kube::Client, name: &str) -> Result<Next, Error> {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns = match api.get(name).await {
        Ok(ns) => ns,
        Err(e) if is_not_found(&e) => return Ok(Next::Done),
        Err(e) => return Err(e.into()),
    };
    if ns.metadata.deletion_timestamp.is_none() {
        return Ok(Next::Done);
    }
    let mut remaining = 0usize;
    for ar in namespaced_kinds() {
        let objs: Api<DynamicObject> = Api::namespaced_with(client.clone(), name, &ar);
        let list = objs.list_metadata(&ListParams::default()).await?;
        if list.items.is_empty() {
            continue;
        }
        let pending: Vec<_> = list.items.iter().filter(|o| o.metadata.deletion_timestamp.is_none()).collect();
        if !pending.is_empty() {
            match objs.delete_collection(&DeleteParams::background(), &ListParams::default()).await {
                Ok(_) => {}
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(e.into()),
            }
        }
        remaining += objs.list_metadata(&ListParams::default()).await?.items.len();
    }
    if remaining > 0 {
        tracing::debug!(namespace = name, remaining, "namespace not empty yet");
        return Ok(Next::After(Duration::from_secs(2)));
    }
    let mut fin = ns.clone();
    let spec = fin.spec.get_or_insert_with(Default::default);
    spec.finalizers = Some(spec.finalizers.take().unwrap_or_default().into_iter().filter(|f| f != "kubernetes").collect());
    match api.replace_subresource("finalize", name, &PostParams::default(), &fin).await {
        Ok(_) => Ok(Next::Done),
        Err(e) if is_not_found(&e) => Ok(Next::Done),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn namespace(deleting: bool) -> Arc<Namespace> {
        let mut meta = json!({"name": "team"});
        if deleting {
            meta["deletionTimestamp"] = json!("2024-01-01T00:00:00Z");
        }
        Arc::new(serde_json::from_value(json!({"metadata": meta})).unwrap())
    }

    #[test]
    fn only_a_namespace_being_deleted_is_a_key() {
        assert_eq!(keys_for_namespace(&Change::Applied { old: Some(namespace(false)), new: namespace(true) }), ["team"]);
        assert!(keys_for_namespace(&Change::Applied { old: None, new: namespace(false) }).is_empty());
        // gone already: nothing left to finalize
        assert!(keys_for_namespace(&Change::Deleted(namespace(true))).is_empty());
    }
}
