//! Namespace controller: a namespace being deleted has everything in it deleted, then its
//! `kubernetes` finalizer removed (which completes the deletion).

use std::sync::Arc;
use std::time::Duration;

use ferro_runtime::{spawn_resync, spawn_workers, Change, Next, WorkQueue};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{ApiResource, DeleteParams, DynamicObject, ListParams, PostParams};
use kube::{Api, ResourceExt as _};

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
    spawn_workers("namespace", queue, 2, move |name: String| {
        let client = client.clone();
        async move { reconcile(client, &name).await }
    });
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
