//! metrics.k8s.io/v1beta1 served by the API server itself (no metrics-server): NodeMetrics and
//! PodMetrics for `kubectl top nodes|pods` and autoscalers.
//!
//! - [`scrape`]: a background loop scrapes every Ready node's agent `/metrics/resource` every
//!   15 s (metrics-server's resolution) through the server's kubelet client.
//! - [`parse`]: the Prometheus text into points (pure).
//! - [`store`]: the last two points of each node and container and the usage from them, with
//!   metrics-server's rules for restarts and counter resets (pure).
//! - [`objects`]: NodeMetrics and PodMetrics as metrics-server writes them (pure).
//! - [`serve`]: get and list, with label and field selectors and namespaces; a pod or node
//!   without metrics yet is NotFound in metrics-server's words.
//!
//! Nothing is stored: after a restart the server has metrics again after two scrapes.

pub mod objects;
pub mod parse;
pub mod scrape;
pub mod store;

use std::collections::{BTreeMap, HashMap};
use std::sync::RwLock;

use http::{Method, Response};
use serde_json::Value;

use crate::api::{Api, ListOptions};
use crate::error::ApiError;
use crate::resources;
use crate::server::{json_response, Body};

pub use objects::GROUP;

/// The stored samples, shared by the scrape loop and the request handlers.
#[derive(Debug)]
pub struct Metrics {
    store: RwLock<store::Store>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics { store: RwLock::new(store::Store::new(i64::try_from(scrape::RESOLUTION.as_millis()).unwrap_or(15_000))) }
    }
}

impl Metrics {
    /// Stores a scrape round.
    pub fn store(&self, round: &BTreeMap<String, parse::Batch>) {
        self.store.write().unwrap_or_else(|p| p.into_inner()).store(round);
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, store::Store> {
        self.store.read().unwrap_or_else(|p| p.into_inner())
    }
}

/// The metrics.k8s.io resources: (plural, kind, namespaced), for discovery.
pub const RESOURCES: &[(&str, &str, bool)] = &[("nodes", "NodeMetrics", false), ("pods", "PodMetrics", true)];

fn now_ms() -> i64 {
    jiff::Timestamp::now().as_millisecond()
}

/// metrics-server's answer for an object without metrics.
fn no_metrics(resource: &str, name: &str) -> ApiError {
    ApiError::not_found(&format!("{resource}.{GROUP}"), name)
}

/// A request below /apis/metrics.k8s.io/v1beta1, already authorized: GET of the node or pod
/// metrics, one or a list. `query` holds labelSelector and fieldSelector.
pub async fn serve(
    api: &Api,
    metrics: &Metrics,
    method: &Method,
    info: &crate::server::RequestInfo,
    query: &HashMap<String, String>,
) -> Result<Response<Body>, ApiError> {
    if info.version != objects::VERSION || info.subresource.is_some() || info.watch_path {
        return Err(ApiError::no_route());
    }
    if method != Method::GET {
        return Err(ApiError::method_not_allowed(method.as_str()));
    }
    if query.get("watch").is_some_and(|w| w == "true" || w == "1") {
        return Err(ApiError::method_not_allowed("watch"));
    }
    let opts = ListOptions {
        label_selector: query.get("labelSelector").cloned(),
        field_selector: query.get("fieldSelector").cloned(),
        ..Default::default()
    };
    let now = now_ms();
    let v = match (info.resource.as_str(), info.namespace.as_deref(), info.name.as_deref()) {
        ("nodes", None, None) => {
            let res = resources::find("", "v1", "nodes").ok_or_else(|| ApiError::internal("no nodes resource"))?;
            let page = api.list(res, None, &opts).await?;
            let store = metrics.read();
            let items = page
                .records
                .iter()
                .filter_map(|r| r.json().ok())
                .filter_map(|n| {
                    let u = store.node(n.pointer("/metadata/name")?.as_str()?)?;
                    Some(objects::node_metrics(&n, &u, now))
                })
                .collect();
            objects::list("NodeMetricsList", items)
        }
        ("nodes", None, Some(name)) => {
            let res = resources::find("", "v1", "nodes").ok_or_else(|| ApiError::internal("no nodes resource"))?;
            let node = match api.get(res, None, name).await {
                Ok(r) => r.json()?,
                // the words of metrics-server's node lister
                Err(e) if e.code == 404 => {
                    return Err(ApiError::new(404, "NotFound", format!("node \"{name}\" not found")).with_details("", "node", name))
                }
                Err(e) => return Err(e),
            };
            let u = metrics.read().node(name).ok_or_else(|| no_metrics("nodemetrics", name))?;
            objects::node_metrics(&node, &u, now)
        }
        ("pods", ns, None) => {
            let res = resources::find("", "v1", "pods").ok_or_else(|| ApiError::internal("no pods resource"))?;
            let page = api.list(res, ns, &opts).await?;
            let store = metrics.read();
            let items = page
                .records
                .iter()
                .filter_map(|r| r.json().ok())
                .filter(objects::is_running)
                .filter_map(|p| {
                    let u = store.pod(p.pointer("/metadata/namespace")?.as_str()?, p.pointer("/metadata/name")?.as_str()?)?;
                    Some(objects::pod_metrics(&p, &u, now))
                })
                .collect();
            objects::list("PodMetricsList", items)
        }
        ("pods", Some(ns), Some(name)) => {
            let res = resources::find("", "v1", "pods").ok_or_else(|| ApiError::internal("no pods resource"))?;
            // a missing pod is the pods' NotFound (`pods "x" not found`)
            let pod: Value = api.get(res, Some(ns), name).await?.json()?;
            let u = if objects::is_running(&pod) { metrics.read().pod(ns, name) } else { None };
            let u = u.ok_or_else(|| no_metrics("podmetrics", &format!("{ns}/{name}")))?;
            objects::pod_metrics(&pod, &u, now)
        }
        _ => return Err(ApiError::no_route()),
    };
    Ok(json_response(200, &v))
}
