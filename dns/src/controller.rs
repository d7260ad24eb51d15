//! The control loop: informers on Services and EndpointSlices; a change queues the Service's
//! key (a slice maps to its Service through the `kubernetes.io/service-name` label); the named
//! [`reconcile`] recomputes that Service's records (a pure function, [`service_records`]) in a
//! span with the key; the publisher rebuilds the [`Index`] from every Service's records when
//! something changed and swaps it in whole. A periodic resync requeues every Service
//! (level-triggered: whatever a missed event left wrong is repaired).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use tokio::sync::Notify;
use tracing::Instrument as _;

use ferro_runtime::{Change, Informer, Next, ObjectKey, WorkQueue};

use crate::handler::Published;
use crate::model::{service_records, slice_service, Index, ModelError, ServiceRecords, Zone, LABEL_SERVICE_NAME};

/// The informers the loop reads.
#[derive(Clone)]
pub struct Inputs {
    pub services: Arc<Informer<Service>>,
    pub slices: Arc<Informer<EndpointSlice>>,
}

impl Inputs {
    pub fn new() -> Self {
        Inputs { services: Informer::new(), slices: Informer::new() }
    }
}

impl Default for Inputs {
    fn default() -> Self {
        Self::new()
    }
}

/// The Service key of a slice change: the Service it belongs to now and, if its label
/// changed, the one it belonged to.
pub fn slice_keys(change: &Change<EndpointSlice>) -> Vec<ObjectKey> {
    let key = |s: &EndpointSlice| slice_service(s).map(|(ns, n)| ObjectKey::new(Some(&ns), &n));
    let mut out = Vec::new();
    match change {
        Change::Applied { old, new } => {
            out.extend(key(new));
            if let Some(k) = old.as_deref().and_then(key) {
                if !out.contains(&k) {
                    out.push(k);
                }
            }
        }
        Change::Deleted(s) => out.extend(key(s)),
    }
    out
}

/// Every Service's records, and the index published from them.
pub struct Model {
    pub zone: Zone,
    records: Mutex<BTreeMap<ObjectKey, Arc<ServiceRecords>>>,
    pub published: Arc<Published>,
    dirty: Notify,
}

impl Model {
    pub fn new(zone: Zone) -> Arc<Self> {
        let published = Arc::new(Published::new(Index::empty(&zone)));
        Arc::new(Model { zone, records: Mutex::default(), published, dirty: Notify::new() })
    }

    fn set(&self, key: ObjectKey, rec: Option<ServiceRecords>) -> bool {
        let mut m = self.records.lock().unwrap_or_else(|p| p.into_inner());
        let changed = match rec {
            Some(r) => {
                if m.get(&key).is_some_and(|o| **o == r) {
                    false
                } else {
                    m.insert(key, Arc::new(r));
                    true
                }
            }
            None => m.remove(&key).is_some(),
        };
        if changed {
            self.dirty.notify_one();
        }
        changed
    }

    /// Builds the index from every Service's records and swaps it in.
    pub fn publish(&self) {
        let all: Vec<Arc<ServiceRecords>> = self.records.lock().unwrap_or_else(|p| p.into_inner()).values().cloned().collect();
        let serial = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as u32)
            .unwrap_or(1);
        let idx = Index::build(&self.zone, serial, all.iter().map(|a| a.as_ref()));
        tracing::debug!(services = idx.services, "published a new index");
        self.published.store(idx);
    }

    /// Publishes after every batch of changes until the task is dropped.
    pub async fn publish_loop(self: Arc<Self>) {
        loop {
            self.dirty.notified().await;
            self.publish();
        }
    }
}

/// One Service: its records from the cache (none once it is gone). Returns whether they
/// changed.
pub fn reconcile(key: &ObjectKey, inputs: &Inputs, model: &Model) -> Result<bool, ModelError> {
    let span = tracing::debug_span!("reconcile", service = %key);
    let _e = span.enter();
    let ns = key.namespace.as_deref().unwrap_or_default();
    let Some(svc) = inputs.services.get(Some(ns), &key.name) else {
        return Ok(model.set(key.clone(), None));
    };
    let slices: Vec<Arc<EndpointSlice>> = inputs
        .slices
        .list_namespace(ns)
        .into_iter()
        .filter(|s| s.metadata.labels.as_ref().and_then(|l| l.get(LABEL_SERVICE_NAME)) == Some(&key.name))
        .collect();
    match service_records(&model.zone, &svc, &slices) {
        Ok(r) => Ok(model.set(key.clone(), Some(r))),
        Err(e) => {
            // the Service's names cannot be served; what it had is withdrawn
            model.set(key.clone(), None);
            Err(e)
        }
    }
}

/// Queues Service keys on every change of the informers.
pub fn wire(inputs: &Inputs, queue: &WorkQueue<ObjectKey>) {
    let q = queue.clone();
    inputs.services.on_change(move |c: &Change<Service>| q.add(ObjectKey::of(c.object().as_ref())));
    let q = queue.clone();
    inputs.slices.on_change(move |c: &Change<EndpointSlice>| {
        for k in slice_keys(c) {
            q.add(k);
        }
    });
}

/// Waits for both informers, builds and publishes the first index (the caller starts
/// answering after this), then keeps the model current: workers, resync, publisher.
pub async fn run(inputs: Inputs, model: Arc<Model>, resync: std::time::Duration) {
    let queue: WorkQueue<ObjectKey> = WorkQueue::new();
    wire(&inputs, &queue);
    inputs.services.wait_synced().await;
    inputs.slices.wait_synced().await;
    initial(&inputs, &model);
    let (i, m) = (inputs.clone(), model.clone());
    ferro_runtime::spawn_workers("dns", queue.clone(), 1, move |key: ObjectKey| {
        let (i, m) = (i.clone(), m.clone());
        async move { reconcile(&key, &i, &m).map(|_| Next::Done) }.instrument(tracing::Span::none())
    });
    let services = inputs.services.clone();
    ferro_runtime::spawn_resync(queue, resync, move || services.keys());
    tokio::spawn(model.publish_loop());
}

/// Every Service reconciled once and the index published (the start, after the informers
/// synced).
pub fn initial(inputs: &Inputs, model: &Model) {
    for key in inputs.services.keys() {
        if let Err(e) = reconcile(&key, inputs, model) {
            tracing::warn!(service = %key, error = %e, "service left out");
        }
    }
    model.publish();
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use hickory_proto::rr::{Name, RecordType};
    use kube::runtime::watcher::Event;
    use serde_json::json;

    fn zone() -> Zone {
        Zone::new("cluster.local", 5, vec![]).unwrap()
    }

    fn addrs(m: &Model, name: &str) -> Vec<String> {
        let idx = m.published.load();
        let mut v: Vec<String> = idx.lookup(&Name::from_ascii(name).unwrap(), RecordType::A).map(|d| d.to_string()).collect();
        v.sort();
        v
    }

    fn slice(name: &str, svc: &str, ips: &[(&str, bool)]) -> EndpointSlice {
        let eps: Vec<serde_json::Value> = ips.iter().map(|(ip, ready)| json!({"addresses": [ip], "conditions": {"ready": ready}})).collect();
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ns1", "resourceVersion": "1",
            "labels": {LABEL_SERVICE_NAME: svc}}, "addressType": "IPv4", "endpoints": eps}))
        .unwrap()
    }

    /// Runs the queue by hand: every queued key reconciled, then one publish.
    async fn drain(q: &WorkQueue<ObjectKey>, inputs: &Inputs, m: &Model) {
        while !q.is_empty() {
            let k = q.get().await.unwrap();
            reconcile(&k, inputs, m).unwrap();
            q.done(&k);
        }
        m.publish();
    }

    #[tokio::test]
    async fn endpoint_slice_changes_update_the_headless_service_records() {
        let inputs = Inputs::new();
        let model = Model::new(zone());
        let q = WorkQueue::new();
        wire(&inputs, &q);
        let mut buf = None;
        let mut sbuf = None;
        let svc: Service = serde_json::from_value(json!({"metadata": {"name": "db", "namespace": "ns1", "resourceVersion": "1"},
            "spec": {"clusterIP": "None"}}))
        .unwrap();
        inputs.services.inject(Event::Apply(svc.clone()), &mut sbuf);
        inputs.slices.inject(Event::Apply(slice("db-a", "db", &[("10.88.0.1", true), ("10.88.0.2", false)])), &mut buf);
        drain(&q, &inputs, &model).await;
        assert_eq!(addrs(&model, "db.ns1.svc.cluster.local."), ["10.88.0.1"]);
        // the second endpoint becomes ready, a second slice appears
        inputs.slices.inject(Event::Apply(slice("db-a", "db", &[("10.88.0.1", true), ("10.88.0.2", true)])), &mut buf);
        inputs.slices.inject(Event::Apply(slice("db-b", "db", &[("10.88.0.3", true)])), &mut buf);
        drain(&q, &inputs, &model).await;
        assert_eq!(addrs(&model, "db.ns1.svc.cluster.local."), ["10.88.0.1", "10.88.0.2", "10.88.0.3"]);
        // a slice relabelled to another Service leaves this one
        inputs.slices.inject(Event::Apply(slice("db-b", "other", &[("10.88.0.3", true)])), &mut buf);
        drain(&q, &inputs, &model).await;
        assert_eq!(addrs(&model, "db.ns1.svc.cluster.local."), ["10.88.0.1", "10.88.0.2"]);
        // slice deleted: no ready endpoints, the name is gone
        inputs.slices.inject(Event::Delete(slice("db-a", "db", &[])), &mut buf);
        drain(&q, &inputs, &model).await;
        assert!(addrs(&model, "db.ns1.svc.cluster.local.").is_empty());
        assert!(!model.published.load().exists(&Name::from_ascii("db.ns1.svc.cluster.local.").unwrap()));
        // the Service deleted: forgotten
        inputs.slices.inject(Event::Apply(slice("db-a", "db", &[("10.88.0.1", true)])), &mut buf);
        drain(&q, &inputs, &model).await;
        assert_eq!(addrs(&model, "db.ns1.svc.cluster.local."), ["10.88.0.1"]);
        inputs.services.inject(Event::Delete(svc), &mut sbuf);
        drain(&q, &inputs, &model).await;
        assert!(addrs(&model, "db.ns1.svc.cluster.local.").is_empty());
        assert_eq!(model.published.load().services, 0);
    }

    #[test]
    fn slice_keys_follow_the_service_label() {
        let a = Arc::new(slice("s", "a", &[]));
        let b = Arc::new(slice("s", "b", &[]));
        let keys = slice_keys(&Change::Applied { old: Some(a.clone()), new: b });
        assert_eq!(keys, [ObjectKey::new(Some("ns1"), "b"), ObjectKey::new(Some("ns1"), "a")]);
        assert_eq!(slice_keys(&Change::Deleted(a)), [ObjectKey::new(Some("ns1"), "a")]);
        let mut unlabelled = slice("s", "a", &[]);
        unlabelled.metadata.labels = None;
        assert!(slice_keys(&Change::Applied { old: None, new: Arc::new(unlabelled) }).is_empty());
    }

    #[test]
    fn unchanged_records_do_not_mark_the_model_dirty() {
        let inputs = Inputs::new();
        let model = Model::new(zone());
        let mut buf = None;
        let svc: Service = serde_json::from_value(json!({"metadata": {"name": "web", "namespace": "ns1", "resourceVersion": "1"},
            "spec": {"clusterIP": "10.96.0.9"}}))
        .unwrap();
        inputs.services.inject(Event::Apply(svc), &mut buf);
        let k = ObjectKey::new(Some("ns1"), "web");
        assert!(reconcile(&k, &inputs, &model).unwrap());
        assert!(!reconcile(&k, &inputs, &model).unwrap());
    }
}
