//! EndpointSlice and Endpoints executors: for each Service with a selector, the planner's
//! slices (created with generateName, updated in place, deleted when surplus) and the legacy
//! Endpoints object. Writes the informer has not reflected yet hold the next plan back, so a
//! lagging cache never creates a slice twice.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferro_runtime::{spawn_resync, spawn_workers, Change, Next, ObjectKey, WorkQueue};
use k8s_openapi::api::core::v1::{Endpoints, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, ResourceExt as _};

use crate::controllers::endpointslice::{self as plan, MANAGED_BY};
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
            let ns = c.object().namespace().unwrap_or_default();
            let in_ns = services.list_namespace(&ns);
            let mut keys = services_selecting(&in_ns, c.object());
            if let Change::Applied { old: Some(old), .. } = c {
                keys.extend(services_selecting(&in_ns, old));
            }
            for k in keys {
                q.add(k);
            }
        });
    }
    {
        let q = queue.clone();
        slices.on_change(move |c| {
            let s = c.object();
            if let Some(svc) = s.labels().get(SERVICE_NAME) {
                q.add(ObjectKey::new(s.namespace().as_deref(), svc));
            }
        });
    }
    {
        let q = queue.clone();
        endpoints.on_change(move |c| {
            if let Change::Deleted(e) = c {
                q.add(ObjectKey::of(e.as_ref()));
            }
        });
    }
    {
        let s = services.clone();
        spawn_resync(queue.clone(), opts.resync, move || s.keys());
    }
    let pending: Pending = Arc::default();
    let client = inf.client();
    spawn_workers("endpointslice", queue, 4, move |key: ObjectKey| {
        let (client, services, pods, slices, endpoints, nodes, pending) = (
            client.clone(),
            services.clone(),
            pods.clone(),
            slices.clone(),
            endpoints.clone(),
            nodes.clone(),
            pending.clone(),
        );
        async move {
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
                let mine: Vec<Arc<EndpointSlice>> = slices
                    .list_namespace(&ns)
                    .into_iter()
                    .filter(|s| {
                        s.labels().get(SERVICE_NAME) == Some(&key.name) && s.labels().get(MANAGED_BY_LABEL).map(String::as_str) == Some(MANAGED_BY)
                    })
                    .collect();
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
    });
}

fn rv_of(s: &EndpointSlice) -> Option<i64> {
    s.resource_version().and_then(|v| v.parse().ok())
}
