//! Events about objects, as upstream's event recorder writes them (core/v1 Events named
//! `<object>.<hex timestamp>`); a repeat of the same event within 10 minutes bumps the count
//! of the first one instead of writing a new object.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Resource, ResourceExt as _};
use serde_json::json;

/// (involved object uid, reason, message) -> (namespace, event name, count, first seen).
type Seen = HashMap<(String, String, String), (String, String, i32, Instant)>;

/// Writes Events in the background; never blocks or fails the caller.
#[derive(Clone)]
pub struct Recorder {
    client: kube::Client,
    component: &'static str,
    /// source.host (the node, for the agent's events).
    host: Option<String>,
    seen: Arc<Mutex<(Seen, Option<Instant>)>>,
}

/// How long a repeat bumps the count of the first event.
const REPEAT_WINDOW: Duration = Duration::from_secs(600);

impl Recorder {
    pub fn new(client: kube::Client, component: &'static str) -> Self {
        Recorder { client, component, host: None, seen: Arc::default() }
    }

    /// Events from a node component name the node as their source host.
    pub fn with_host(mut self, host: &str) -> Self {
        self.host = Some(host.to_string());
        self
    }

    /// Records a Normal or Warning event about `obj`.
    pub fn record<K: Resource<DynamicType = ()>>(&self, obj: &K, type_: &str, reason: &str, message: String) {
        let reference = ObjectReference {
            api_version: Some(K::api_version(&()).to_string()),
            kind: Some(K::kind(&()).to_string()),
            namespace: obj.namespace(),
            name: Some(obj.name_any()),
            uid: obj.uid(),
            resource_version: obj.resource_version(),
            ..Default::default()
        };
        let ns = obj.namespace().unwrap_or_else(|| "default".into());
        let key = (reference.uid.clone().unwrap_or_default(), reason.to_string(), message.clone());
        let repeat = {
            let mut guard = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            let (seen, pruned) = &mut *guard;
            // The expired entries go once a minute, not at every event (a scan of all of them).
            if pruned.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
                seen.retain(|_, v| v.3.elapsed() < REPEAT_WINDOW);
                *pruned = Some(Instant::now());
            }
            match seen.get_mut(&key).filter(|v| v.3.elapsed() < REPEAT_WINDOW) {
                Some(v) => {
                    v.2 += 1;
                    Some((v.0.clone(), v.1.clone(), v.2))
                }
                None => None,
            }
        };
        let now = jiff::Timestamp::now();
        if let Some((ns_, name, count)) = repeat {
            let api: Api<Event> = Api::namespaced(self.client.clone(), &ns_);
            tokio::spawn(async move {
                let patch = json!({"count": count, "lastTimestamp": Time(now)});
                let _ = api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await;
            });
            return;
        }
        let name = format!("{}.{:x}", obj.name_any(), now.as_nanosecond());
        let ev = Event {
            metadata: ObjectMeta { name: Some(name.clone()), namespace: Some(ns.clone()), ..Default::default() },
            involved_object: reference,
            reason: Some(reason.to_string()),
            message: Some(message),
            type_: Some(type_.to_string()),
            count: Some(1),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            event_time: None::<MicroTime>,
            source: Some(EventSource { component: Some(self.component.to_string()), host: self.host.clone() }),
            reporting_component: Some(self.component.to_string()),
            reporting_instance: Some(self.host.clone().unwrap_or_else(|| self.component.to_string())),
            ..Default::default()
        };
        let request = serde_json::to_vec(&ev)
            .map_err(kube::Error::SerdeError)
            .and_then(|body| {
                kube::core::Request::new(Event::url_path(&(), Some(&ns)))
                    .create(&PostParams::default(), body)
                    .map_err(kube::Error::BuildRequest)
            });
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).0.insert(key, (ns, name, 1, Instant::now()));
        let client = self.client.clone();
        // The answer (the event as stored) is not decoded: nothing reads it.
        tokio::spawn(async move {
            if let Err(e) = async { client.request_text(request?).await }.await {
                tracing::debug!(error = %e, "writing an event failed");
            }
        });
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt as _, Full};
    use k8s_openapi::api::core::v1::Pod;
    use tokio::sync::mpsc;

    /// A client whose API server answers every request 201 with `{}` and hands (method, path,
    /// body) to the test.
    fn recording_client() -> (kube::Client, mpsc::UnboundedReceiver<(String, String, serde_json::Value)>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let svc = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let tx = tx.clone();
            async move {
                let (method, path) = (req.method().to_string(), req.uri().path().to_string());
                let body = req.into_body().collect().await.unwrap().to_bytes();
                tx.send((method, path, serde_json::from_slice(&body).unwrap())).unwrap();
                let resp = http::Response::builder()
                    .status(201)
                    .header("content-type", "application/json")
                    .body(Full::new(bytes::Bytes::from_static(b"{}")))
                    .unwrap();
                Ok::<_, std::convert::Infallible>(resp)
            }
        });
        (kube::Client::new(svc, "default"), rx)
    }

    fn pod() -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some("web".into());
        p.metadata.namespace = Some("shop".into());
        p.metadata.uid = Some("u-1".into());
        p
    }

    #[tokio::test]
    async fn an_event_is_created_once_and_its_repeat_bumps_the_count() {
        let (client, mut rx) = recording_client();
        let rec = Recorder::new(client, "kubelet").with_host("node-a");
        rec.record(&pod(), "Normal", "Started", "Started container c".into());
        let (method, path, body) = rx.recv().await.unwrap();
        assert_eq!((method.as_str(), path.as_str()), ("POST", "/api/v1/namespaces/shop/events"));
        assert_eq!(body["reason"], "Started");
        assert_eq!(body["type"], "Normal");
        assert_eq!(body["count"], 1);
        assert_eq!(body["involvedObject"]["uid"], "u-1");
        assert_eq!(body["involvedObject"]["kind"], "Pod");
        assert_eq!(body["source"], serde_json::json!({"component": "kubelet", "host": "node-a"}));
        let name = body["metadata"]["name"].as_str().unwrap().to_string();
        assert!(name.starts_with("web."), "{name}");

        rec.record(&pod(), "Normal", "Started", "Started container c".into());
        let (method, path, body) = rx.recv().await.unwrap();
        assert_eq!((method.as_str(), path), ("PATCH", format!("/api/v1/namespaces/shop/events/{name}")));
        assert_eq!(body["count"], 2);

        // Another message is another event.
        rec.record(&pod(), "Warning", "BackOff", "Back-off restarting".into());
        let (method, _, body) = rx.recv().await.unwrap();
        assert_eq!((method.as_str(), &body["reason"]), ("POST", &serde_json::json!("BackOff")));
    }
}
