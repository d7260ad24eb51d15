//! Root CA publisher (upstream `root-ca-cert-publisher`): every active namespace has the
//! ConfigMap `kube-root-ca.crt` holding the cluster CA (`ca.crt`), which pods' kube-api-access
//! volumes project so that in-cluster clients can verify the API server. A deleted or changed
//! ConfigMap is put back.

use std::collections::BTreeMap;
use std::sync::Arc;

use ferro_runtime::{spawn_resync, spawn_workers, Change, Informer, Next, ObjectKey, WorkQueue};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, ResourceExt as _};

use crate::controllers::explain::{ExplainError, Explanation, Subject};
use crate::controllers::manager::{Informers, Options};
use crate::controllers::{is_conflict, is_not_found, Error};

pub const NAME: &str = "kube-root-ca.crt";
pub const KEY: &str = "ca.crt";
/// Upstream's description annotation.
pub const DESCRIPTION: &str = "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters.";

/// A namespace created or changed.
pub fn keys_for_namespace(change: &Change<Namespace>) -> Vec<String> {
    match change {
        Change::Applied { new, .. } => vec![new.name_any()],
        Change::Deleted(_) => Vec::new(),
    }
}

/// The namespace of a `kube-root-ca.crt` that changed or went.
pub fn keys_for_config_map(change: &Change<ConfigMap>) -> Vec<String> {
    let cm = change.object();
    if cm.name_any() == NAME {
        cm.namespace().into_iter().collect()
    } else {
        Vec::new()
    }
}

/// What the ConfigMap of a namespace must become: None when it is right.
pub fn plan(ca: &str, current: Option<&ConfigMap>) -> Option<ConfigMap> {
    let right = current.is_some_and(|cm| {
        cm.data.as_ref().and_then(|d| d.get(KEY)).map(String::as_str) == Some(ca)
            && cm.data.as_ref().is_some_and(|d| d.len() == 1)
            && cm.annotations().get("kubernetes.io/description").map(String::as_str) == Some(DESCRIPTION)
    });
    if right {
        return None;
    }
    let mut meta = current.map(|c| c.metadata.clone()).unwrap_or_else(|| ObjectMeta { name: Some(NAME.into()), ..ObjectMeta::default() });
    meta.annotations.get_or_insert_with(BTreeMap::new).insert("kubernetes.io/description".into(), DESCRIPTION.into());
    Some(ConfigMap { metadata: meta, data: Some(BTreeMap::from([(KEY.to_string(), ca.to_string())])), ..ConfigMap::default() })
}

struct Context {
    client: kube::Client,
    ca: String,
    namespaces: Arc<Informer<Namespace>>,
    config_maps: Arc<Informer<ConfigMap>>,
}

pub fn start(inf: &Arc<Informers>, opts: &Options) {
    let Some(ca) = opts.root_ca.clone() else {
        tracing::warn!("root-ca-cert-publisher: no cluster CA known; kube-root-ca.crt is not published");
        return;
    };
    let queue: WorkQueue<String> = WorkQueue::new();
    let namespaces = inf.namespaces();
    let config_maps = inf.config_maps();
    {
        let q = queue.clone();
        namespaces.on_change(move |c| keys_for_namespace(c).into_iter().for_each(|k| q.add(k)));
    }
    {
        let q = queue.clone();
        config_maps.on_change(move |c| keys_for_config_map(c).into_iter().for_each(|k| q.add(k)));
    }
    {
        let ns = namespaces.clone();
        spawn_resync(queue.clone(), opts.resync, move || ns.list().iter().map(|n| n.name_any()).collect());
    }
    {
        // The shared namespace informer may have listed before this loop's handler was added
        // (another loop started it): every namespace is looked at once it has synced.
        let (ns, q) = (namespaces.clone(), queue.clone());
        tokio::spawn(async move {
            ns.wait_synced().await;
            for n in ns.list() {
                q.add(n.name_any());
            }
        });
    }
    let ctx = Arc::new(Context { client: inf.client(), ca, namespaces, config_maps });
    {
        let ctx = ctx.clone();
        inf.explain().register("root-ca-cert-publisher", Arc::new(move |key| Box::pin(explain(ctx.clone(), key))));
    }
    spawn_workers("root-ca-cert-publisher", queue, 1, move |ns: String| reconcile(ctx.clone(), ns));
}

/// A dry run for one namespace's ConfigMap (`/debug/controllers/root-ca-cert-publisher/<ns>/kube-root-ca.crt`).
async fn explain(ctx: Arc<Context>, key: ObjectKey) -> Result<Explanation, ExplainError> {
    ctx.namespaces.wait_synced().await;
    ctx.config_maps.wait_synced().await;
    let ns = key.namespace.clone().unwrap_or_default();
    let n = ctx.namespaces.get(None, &ns).ok_or_else(|| ExplainError::NotFound { resource: "namespaces".into(), name: ns.clone() })?;
    let mut e = Explanation::new("root-ca-cert-publisher", Subject::of(n.as_ref()));
    let cm = ctx.config_maps.get(Some(&ns), NAME);
    e.observed = serde_json::json!({"configMap": cm.is_some()});
    e.wants = serde_json::json!({"configMap": NAME, "key": KEY});
    if n.metadata.deletion_timestamp.is_some() {
        e.waiting.push("nothing to do: the namespace is being deleted".into());
    } else if let Some(want) = plan(&ctx.ca, cm.as_deref()) {
        let verb = if cm.is_some() { "update" } else { "create" };
        e.actions.push(format!("{verb} ConfigMap {} with the cluster CA", want.name_any()));
    }
    Ok(e)
}

/// One pass over a namespace: its `kube-root-ca.crt` created or set right.
#[tracing::instrument(name = "reconcile", skip_all, fields(controller = "root-ca-cert-publisher", key = %ns))]
async fn reconcile(ctx: Arc<Context>, ns: String) -> Result<Next, Error> {
    ctx.namespaces.wait_synced().await;
    ctx.config_maps.wait_synced().await;
    let Some(n) = ctx.namespaces.get(None, &ns) else { return Ok(Next::Done) };
    if n.metadata.deletion_timestamp.is_some() {
        return Ok(Next::Done);
    }
    let current = ctx.config_maps.get(Some(&ns), NAME);
    let Some(want) = plan(&ctx.ca, current.as_deref()) else { return Ok(Next::Done) };
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ns);
    let r = match current {
        Some(_) => api.replace(NAME, &PostParams::default(), &want).await,
        None => api.create(&PostParams::default(), &want).await,
    };
    match r {
        Ok(_) => Ok(Next::Done),
        // the cache is behind: the change comes back as an event
        Err(e) if is_conflict(&e) || is_not_found(&e) => Ok(Next::Done),
        // a namespace being deleted refuses new objects
        Err(kube::Error::Api(s)) if s.code == 403 => Ok(Next::Done),
        Err(e) => Err(Error::from(e)),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_config_map_is_made_and_kept_right() {
        let want = plan("CA", None).unwrap();
        assert_eq!(want.name_any(), NAME);
        assert_eq!(want.data.as_ref().unwrap()[KEY], "CA");
        assert_eq!(want.annotations()["kubernetes.io/description"], DESCRIPTION);
        assert_eq!(plan("CA", Some(&want)), None);
        let mut edited = want.clone();
        edited.data.as_mut().unwrap().insert("extra".into(), "x".into());
        assert_eq!(plan("CA", Some(&edited)).unwrap().data, want.data);
        assert_eq!(plan("NEW", Some(&want)).unwrap().data.unwrap()[KEY], "NEW");
    }

    #[test]
    fn only_its_own_config_map_is_a_key() {
        let cm = |name: &str| -> Arc<ConfigMap> {
            Arc::new(ConfigMap { metadata: ObjectMeta { name: Some(name.into()), namespace: Some("ns".into()), ..Default::default() }, ..Default::default() })
        };
        assert_eq!(keys_for_config_map(&Change::Deleted(cm(NAME))), ["ns"]);
        assert!(keys_for_config_map(&Change::Deleted(cm("other"))).is_empty());
    }
}
