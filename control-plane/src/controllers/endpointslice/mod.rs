//! EndpointSlice and Endpoints executors: for each Service with a selector, the planner's
//! slices (created with generateName, updated in place, deleted when surplus) and the legacy
//! Endpoints object. Writes the informer has not reflected yet hold the next plan back, so a
//! lagging cache never creates a slice twice.

pub mod plan;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferro_runtime::{spawn_resync, spawn_workers, Change, Informer, Next, ObjectKey, WorkQueue};
use k8s_openapi::api::core::v1::{Endpoints, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, ResourceExt as _};
use serde_json::json;

use self::plan::MANAGED_BY;
use crate::controllers::explain::{ExplainError, Explanation, Subject};
use crate::controllers::manager::{Informers, Options};
use crate::controllers::{is_conflict, is_not_found, Error};

const SERVICE_NAME: &str = "kubernetes.io/service-name";
const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";

/// Slice writes per service not yet seen by the informer: name -> resourceVersion written
/// (None for a deletion).
type Pending = Arc<Mutex<HashMap<ObjectKey, (std::time::Instant, Vec<(String, Option<i64>)>)>>>;

fn services_selecting(services: &[Arc<Service>], pod: &Pod) -> Vec<ObjectKey> {
    services
        .iter()
        .filter(|s| {
            s.spec.as_ref().and_then(|sp| sp.selector.as_ref()).is_some_and(|sel| {
                !sel.is_empty() && sel.iter().all(|(k, v)| pod.labels().get(k) == Some(v))
            })
        })
        .map(|s| ObjectKey::of(s.as_ref()))
        .collect()
}

/// The Services a pod change concerns: those of its namespace selecting it before or after the
/// change. `in_namespace` lists a namespace's Services.
pub fn keys_for_pod(change: &Change<Pod>, in_namespace: impl FnOnce(&str) -> Vec<Arc<Service>>) -> Vec<ObjectKey> {
    let ns = change.object().namespace().unwrap_or_default();
    let in_ns = in_namespace(&ns);
    let mut keys = services_selecting(&in_ns, change.object());
    if let Change::Applied { old: Some(old), .. } = change {
        keys.extend(services_selecting(&in_ns, old));
    }
    keys
}

/// The Service a slice belongs to (its `kubernetes.io/service-name` label), whoever manages it.
pub fn keys_for_endpointslice(slice: &EndpointSlice) -> Vec<ObjectKey> {
    slice.labels().get(SERVICE_NAME).map(|svc| ObjectKey::new(slice.namespace().as_deref(), svc)).into_iter().collect()
}

/// A deleted Endpoints object's Service (which writes it again); other changes are ours.
pub fn keys_for_endpoints(change: &Change<Endpoints>) -> Vec<ObjectKey> {
    match change {
        Change::Deleted(e) => vec![ObjectKey::of(e.as_ref())],
        Change::Applied { .. } => Vec::new(),
    }
}

/// What the workers share.
struct Context {
    client: kube::Client,
    services: Arc<Informer<Service>>,
    pods: Arc<Informer<Pod>>,
    slices: Arc<Informer<EndpointSlice>>,
    endpoints: Arc<Informer<Endpoints>>,
    nodes: Arc<Informer<Node>>,
    pending: Pending,
    slices_on: bool,
    endpoints_on: bool,
}

pub fn start(inf: &Arc<Informers>, opts: &Options, slices_on: bool, endpoints_on: bool) {
    let queue: WorkQueue<ObjectKey> = WorkQueue::new();
    let services = inf.services();
    let pods = inf.pods();
    let slices = inf.endpoint_slices();
    let endpoints = inf.endpoints();
    let nodes = inf.nodes();
    {
        let q = queue.clone();
        services.on_change(move |c| q.add(ObjectKey::of(c.object().as_ref())));
    }
    {
        let (q, services) = (queue.clone(), services.clone());
        pods.on_change(move |c| {
            for k in keys_for_pod(c, |ns| services.list_namespace(ns)) {
                q.add(k);
            }
        });
    }
    {
        let q = queue.clone();
        slices.on_change(move |c| {
            for k in keys_for_endpointslice(c.object()) {
                q.add(k);
            }
        });
    }
    {
        let q = queue.clone();
        endpoints.on_change(move |c| {
            for k in keys_for_endpoints(c) {
                q.add(k);
            }
        });
    }
    {
        let s = services.clone();
        spawn_resync(queue.clone(), opts.resync, move || s.keys());
    }
    let pending: Pending = Arc::default();
    let ctx = Arc::new(Context { client: inf.client(), services, pods, slices, endpoints, nodes, pending, slices_on, endpoints_on });
    for name in ["endpointslice", "endpoints"] {
        let ctx = ctx.clone();
        inf.explain().register(name, Arc::new(move |key| Box::pin(explain(ctx.clone(), key))));
    }
    spawn_workers("endpointslice", queue, 4, move |key: ObjectKey| reconcile(ctx.clone(), key));
}

/// One pass over a Service: its slices and its Endpoints object, each when its loop is on.
#[tracing::instrument(name = "reconcile", skip_all, fields(controller = "endpointslice", key = %key))]
async fn reconcile(ctx: Arc<Context>, key: ObjectKey) -> Result<Next, Error> {
    let Context { client, services, pods, slices, endpoints, nodes, pending, .. } = &*ctx;
    let (slices_on, endpoints_on) = (ctx.slices_on, ctx.endpoints_on);
    for synced in [services.is_synced(), pods.is_synced(), slices.is_synced(), endpoints.is_synced()] {
        if !synced {
            return Ok(Next::After(Duration::from_millis(200)));
        }
    }
    let ns = key.namespace.clone().unwrap_or_default();
    let Some(svc) = services.get(Some(&ns), &key.name) else {
        // slices and endpoints go with the service (ownerReference / GC, or below)
        pending.lock().unwrap_or_else(|p| p.into_inner()).remove(&key);
        return Ok(Next::Done);
    };
    if svc.spec.as_ref().and_then(|s| s.selector.as_ref()).is_none_or(|s| s.is_empty()) {
        return Ok(Next::Done);
    }
    // hold back while our own writes are not in the cache yet
    {
        let mut p = pending.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((since, list)) = p.get_mut(&key) {
            // a write someone else undid right away must not hold the service forever
            if since.elapsed() > Duration::from_secs(10) {
                list.clear();
            }
            list.retain(|(name, rv)| match (slices.get(Some(&ns), name), rv) {
                (Some(s), Some(rv)) => s.resource_version().and_then(|v| v.parse::<i64>().ok()).unwrap_or(0) < *rv,
                (Some(_), None) => true,
                (None, Some(_)) => true,
                (None, None) => false,
            });
            if !list.is_empty() {
                return Ok(Next::After(Duration::from_millis(100)));
            }
            p.remove(&key);
        }
    }
    let all_pods = pods.list_namespace(&ns);
    let pod_refs: Vec<&Pod> = all_pods.iter().map(|p| p.as_ref()).collect();
    let zone_of = |node: &str| -> Option<String> {
        nodes.get(None, node).and_then(|n: Arc<Node>| n.labels().get("topology.kubernetes.io/zone").cloned())
    };
    if slices_on {
        let mine = managed_slices(slices, &key);
        let slice_refs: Vec<&EndpointSlice> = mine.iter().map(|s| s.as_ref()).collect();
        let p = plan::plan_slices(&svc, &pod_refs, &slice_refs, &zone_of);
        let api: Api<EndpointSlice> = Api::namespaced(client.clone(), &ns);
        let mut written = Vec::new();
        let mut outcome = Ok(());
        for s in &p.create {
            match api.create(&PostParams::default(), s).await {
                Ok(o) => written.push((o.name_any(), rv_of(&o))),
                Err(e) => outcome = Err(e),
            }
        }
        for s in &p.update {
            match api.replace(&s.name_any(), &PostParams::default(), s).await {
                Ok(o) => written.push((o.name_any(), rv_of(&o))),
                Err(e) if is_not_found(&e) => {}
                Err(e) => outcome = Err(e),
            }
        }
        for name in &p.delete {
            match api.delete(name, &DeleteParams::default()).await {
                Ok(_) => written.push((name.clone(), None)),
                Err(e) if is_not_found(&e) => {}
                Err(e) => outcome = Err(e),
            }
        }
        if !written.is_empty() {
            pending.lock().unwrap_or_else(|p| p.into_inner()).insert(key.clone(), (std::time::Instant::now(), written));
        }
        match outcome {
            Ok(()) => {}
            Err(e) if is_conflict(&e) => return Ok(Next::After(Duration::from_millis(200))),
            Err(e) => return Err(Error::from(e)),
        }
    }
    if endpoints_on {
        let existing = endpoints.get(Some(&ns), &key.name);
        if let Some(ep) = plan::plan_endpoints(&svc, &pod_refs, existing.as_deref()) {
            let api: Api<Endpoints> = Api::namespaced(client.clone(), &ns);
            let r = match existing {
                Some(_) => api.replace(&key.name, &PostParams::default(), &ep).await,
                None => api.create(&PostParams::default(), &ep).await,
            };
            match r {
                Ok(_) => {}
                Err(e) if is_conflict(&e) => return Ok(Next::After(Duration::from_millis(200))),
                Err(e) => return Err(Error::from(e)),
            }
        }
    }
    Ok(Next::Done)
}

/// The slices of a Service this loop manages.
fn managed_slices(slices: &Informer<EndpointSlice>, key: &ObjectKey) -> Vec<Arc<EndpointSlice>> {
    slices
        .list_namespace(key.namespace.as_deref().unwrap_or_default())
        .into_iter()
        .filter(|s| s.labels().get(SERVICE_NAME) == Some(&key.name) && s.labels().get(MANAGED_BY_LABEL).map(String::as_str) == Some(MANAGED_BY))
        .collect()
}

/// A dry run of [`reconcile`] for one Service: its pods as endpoints, and the slice and
/// Endpoints writes the planner would make.
async fn explain(ctx: Arc<Context>, key: ObjectKey) -> Result<Explanation, ExplainError> {
    let Context { services, pods, slices, endpoints, nodes, pending, .. } = &*ctx;
    services.wait_synced().await;
    pods.wait_synced().await;
    slices.wait_synced().await;
    endpoints.wait_synced().await;
    let svc = services.get(key.namespace.as_deref(), &key.name).ok_or_else(|| ExplainError::not_found("services", &key))?;
    let ns = key.namespace.clone().unwrap_or_default();
    let mut e = Explanation::new("endpointslice", Subject::of(svc.as_ref()));
    let selector = svc.spec.as_ref().and_then(|s| s.selector.clone()).unwrap_or_default();
    if selector.is_empty() {
        e.waiting.push("nothing to do: the Service has no selector, its EndpointSlices are the user's".into());
        return Ok(e);
    }
    let all_pods = pods.list_namespace(&ns);
    let pod_refs: Vec<&Pod> = all_pods.iter().map(|p| p.as_ref()).collect();
    let selected: Vec<&Pod> = pod_refs.iter().copied().filter(|p| selector.iter().all(|(k, v)| p.labels().get(k) == Some(v))).collect();
    let ready = |p: &Pod| {
        p.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    };
    let mine = managed_slices(slices, &key);
    e.observed = json!({
        "pods": selected.iter().map(|p| {
            let ip = p.status.as_ref().and_then(|s| s.pod_ip.clone());
            let state = if p.metadata.deletion_timestamp.is_some() { "terminating" } else if ready(p) { "ready" } else { "not ready" };
            json!({"name": p.name_any(), "ip": ip, "state": state})
        }).collect::<Vec<_>>(),
        "slices": mine.iter().map(|s| json!({"name": s.name_any(), "endpoints": s.endpoints.len()})).collect::<Vec<_>>(),
    });
    e.wants = json!({
        "selector": selector,
        "endpoints": selected.iter().filter(|p| p.status.as_ref().and_then(|s| s.pod_ip.as_ref()).is_some()).count(),
    });
    if pending.lock().unwrap_or_else(|p| p.into_inner()).get(&key).is_some_and(|(_, l)| !l.is_empty()) {
        e.waiting.push("waits for its informer to show the slices it wrote last".into());
    }
    let unaddressed: Vec<String> = selected
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none() && p.status.as_ref().and_then(|s| s.pod_ip.as_ref()).is_none())
        .map(|p| p.name_any())
        .collect();
    if !unaddressed.is_empty() {
        e.waiting.push(format!("{} get an endpoint once they have an IP", unaddressed.join(", ")));
    }
    let zone_of = |node: &str| -> Option<String> {
        nodes.get(None, node).and_then(|n: Arc<Node>| n.labels().get("topology.kubernetes.io/zone").cloned())
    };
    if ctx.slices_on {
        let slice_refs: Vec<&EndpointSlice> = mine.iter().map(|s| s.as_ref()).collect();
        let p = plan::plan_slices(&svc, &pod_refs, &slice_refs, &zone_of);
        e.actions.extend(p.create.iter().map(|s| format!("create an EndpointSlice with {} endpoints", s.endpoints.len())));
        e.actions.extend(p.update.iter().map(|s| format!("update EndpointSlice {} to {} endpoints", s.name_any(), s.endpoints.len())));
        e.actions.extend(p.delete.iter().map(|n| format!("delete EndpointSlice {n}")));
    }
    if ctx.endpoints_on {
        let existing = endpoints.get(Some(&ns), &key.name);
        if let Some(ep) = plan::plan_endpoints(&svc, &pod_refs, existing.as_deref()) {
            let n: usize = ep.subsets.iter().flatten().map(|s| s.addresses.as_ref().map_or(0, Vec::len)).sum();
            e.actions.push(format!("{} Endpoints {} with {n} ready addresses", if existing.is_some() { "update" } else { "create" }, key.name));
        }
    }
    Ok(e)
}

fn rv_of(s: &EndpointSlice) -> Option<i64> {
    s.resource_version().and_then(|v| v.parse().ok())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(labels: serde_json::Value) -> Arc<Pod> {
        Arc::new(serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "ns", "labels": labels}})).unwrap())
    }

    fn service(name: &str, selector: Option<serde_json::Value>) -> Arc<Service> {
        Arc::new(serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ns"}, "spec": {"selector": selector}})).unwrap())
    }

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new(Some("ns"), name)
    }

    #[test]
    fn a_pod_maps_to_the_services_selecting_it_before_and_after() {
        let services = vec![
            service("web", Some(json!({"app": "web"}))),
            service("web-canary", Some(json!({"app": "web", "track": "canary"}))),
            service("db", Some(json!({"app": "db"}))),
            // without a selector (or with an empty one) the endpoints are the user's
            service("external", None),
            service("empty", Some(json!({}))),
        ];
        let canary = pod(json!({"app": "web", "track": "canary"}));
        let created = Change::Applied { old: None, new: canary.clone() };
        assert_eq!(keys_for_pod(&created, |ns| {
            assert_eq!(ns, "ns");
            services.clone()
        }), [key("web"), key("web-canary")]);
        // relabelled from web to db: both services look again
        let relabelled = Change::Applied { old: Some(pod(json!({"app": "web"}))), new: pod(json!({"app": "db"})) };
        assert_eq!(keys_for_pod(&relabelled, |_| services.clone()), [key("db"), key("web")]);
        assert_eq!(keys_for_pod(&Change::Deleted(canary), |_| services.clone()), [key("web"), key("web-canary")]);
        assert!(keys_for_pod(&Change::Deleted(pod(json!({"app": "other"}))), |_| services.clone()).is_empty());
    }

    #[test]
    fn a_slice_maps_to_its_service_label() {
        let slice: EndpointSlice = serde_json::from_value(json!({
            "metadata": {"name": "web-abc", "namespace": "ns", "labels": {SERVICE_NAME: "web"}},
            "addressType": "IPv4", "endpoints": []
        }))
        .unwrap();
        assert_eq!(keys_for_endpointslice(&slice), [key("web")]);
        let unlabelled: EndpointSlice =
            serde_json::from_value(json!({"metadata": {"name": "x", "namespace": "ns"}, "addressType": "IPv4", "endpoints": []})).unwrap();
        assert!(keys_for_endpointslice(&unlabelled).is_empty());
    }

    #[test]
    fn only_a_deleted_endpoints_object_is_a_key() {
        let ep: Arc<Endpoints> = Arc::new(serde_json::from_value(json!({"metadata": {"name": "web", "namespace": "ns"}})).unwrap());
        assert_eq!(keys_for_endpoints(&Change::Deleted(ep.clone())), [key("web")]);
        assert!(keys_for_endpoints(&Change::Applied { old: None, new: ep }).is_empty());
    }
}
