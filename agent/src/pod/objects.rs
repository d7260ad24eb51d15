//! The ConfigMaps and Secrets pods refer to (volumes, projected sources, env, envFrom, image
//! pull secrets), as upstream's watch-based manager (configMapAndSecretChangeDetectionStrategy
//! `Watch`, its default): one watch per referenced object (`fieldSelector=metadata.name=<name>`
//! in its namespace, which the Node authorizer allows for objects of the node's pods), shared
//! by every pod that refers to it, started when the first such pod registers and ended when the
//! last one is gone; the watch of an immutable object ends once the object is cached. A pod's
//! sync reads the cache instead of GETting each object (a burst of pods in one namespace, each
//! with the projected kube-root-ca.crt, makes one watch instead of a GET per pod per sync).
//!
//! [`Refs`] is the pure bookkeeping (which pod refers to which object, which watches to start
//! or end); [`ObjectCache`] applies it through a [`Watches`] (the API's watches, or a recording
//! fake in tests).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferro_runtime::Informer;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::runtime::watcher;

/// Namespace and name of a referenced object.
pub type Key = (String, String);

/// Which watches a change of references needs started and ended.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Delta {
    pub start: Vec<Key>,
    pub stop: Vec<Key>,
}

/// The objects each pod refers to, and how many pods refer to each object.
#[derive(Debug, Default)]
pub struct Refs {
    by_pod: BTreeMap<String, BTreeSet<Key>>,
    count: BTreeMap<Key, usize>,
}

impl Refs {
    /// Pod `pod` now refers to `keys` (and to nothing else): the objects no pod referred to
    /// before are started, those no pod refers to any more are ended.
    pub fn register(&mut self, pod: &str, keys: BTreeSet<Key>) -> Delta {
        let old = self.by_pod.remove(pod).unwrap_or_default();
        let mut delta = Delta::default();
        for k in keys.difference(&old) {
            let n = self.count.entry(k.clone()).or_default();
            *n += 1;
            if *n == 1 {
                delta.start.push(k.clone());
            }
        }
        for k in old.difference(&keys) {
            if self.release(k) {
                delta.stop.push(k.clone());
            }
        }
        if !keys.is_empty() {
            self.by_pod.insert(pod.to_string(), keys);
        }
        delta
    }

    /// Pod `pod` is gone.
    pub fn unregister(&mut self, pod: &str) -> Delta {
        let old = self.by_pod.remove(pod).unwrap_or_default();
        Delta { start: Vec::new(), stop: old.iter().filter(|k| self.release(k)).cloned().collect() }
    }

    /// One reference to `k` less; true when it was the last.
    fn release(&mut self, k: &Key) -> bool {
        match self.count.get_mut(k) {
            Some(n) if *n > 1 => {
                *n -= 1;
                false
            }
            Some(_) => {
                self.count.remove(k);
                true
            }
            None => false,
        }
    }

    /// Whether some pod refers to `k`.
    pub fn referenced(&self, k: &Key) -> bool {
        self.count.contains_key(k)
    }
}

/// A kind the cache holds: ConfigMap or Secret.
pub trait Referenced: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
    + Clone
    + serde::de::DeserializeOwned
    + std::fmt::Debug
    + Send
    + Sync
    + 'static
{
    /// `immutable: true`: the data can no longer change (only the object's deletion).
    fn immutable(&self) -> bool;
}

impl Referenced for ConfigMap {
    fn immutable(&self) -> bool {
        self.immutable == Some(true)
    }
}

impl Referenced for Secret {
    fn immutable(&self) -> bool {
        self.immutable == Some(true)
    }
}

/// Starts the watch of one object into `informer`; the handle ends it.
pub trait Watches<K>: Send + Sync {
    fn start(&self, namespace: &str, name: &str, informer: Arc<Informer<K>>) -> tokio::task::AbortHandle;
}

/// The API's watches: a list+watch of the one object by a metadata.name field selector.
pub struct ApiWatches(pub kube::Client);

impl<K: Referenced> Watches<K> for ApiWatches {
    fn start(&self, namespace: &str, name: &str, informer: Arc<Informer<K>>) -> tokio::task::AbortHandle {
        let api: kube::Api<K> = kube::Api::namespaced(self.0.clone(), namespace);
        informer.spawn(api, watcher::Config::default().fields(&format!("metadata.name={name}"))).abort_handle()
    }
}

/// What the cache knows of one object.
#[derive(Debug, PartialEq)]
pub enum Lookup<K> {
    Found(Arc<K>),
    /// The watch has listed and the object does not exist.
    Missing,
    /// No pod registered the object, or its watch has not listed within the wait: the caller
    /// asks the API itself.
    Unknown,
}

struct Entry<K> {
    informer: Arc<Informer<K>>,
    /// None once the object was found immutable (the cached object stays).
    watch: Option<tokio::task::AbortHandle>,
}

/// The referenced objects of one kind, each kept current by its own watch.
pub struct ObjectCache<K> {
    refs: Mutex<Refs>,
    entries: Mutex<BTreeMap<Key, Entry<K>>>,
    watches: Box<dyn Watches<K>>,
    /// How long a read waits for a new watch's first listing (upstream: 1 s).
    sync_wait: Duration,
}

impl<K> Drop for ObjectCache<K> {
    fn drop(&mut self) {
        let entries = self.entries.get_mut().unwrap_or_else(|p| p.into_inner());
        for e in entries.values() {
            if let Some(w) = &e.watch {
                w.abort();
            }
        }
    }
}

impl<K: Referenced> ObjectCache<K> {
    pub fn new(watches: Box<dyn Watches<K>>) -> Self {
        ObjectCache { refs: Mutex::default(), entries: Mutex::default(), watches, sync_wait: Duration::from_secs(1) }
    }

    /// Pod `pod` (uid) refers to `names` in `namespace`.
    pub fn register(&self, pod: &str, namespace: &str, names: &BTreeSet<String>) {
        let keys = names.iter().map(|n| (namespace.to_string(), n.clone())).collect();
        let delta = self.refs.lock().unwrap_or_else(|p| p.into_inner()).register(pod, keys);
        self.apply(delta);
    }

    /// Pod `pod` is gone: the watches only it needed end.
    pub fn unregister(&self, pod: &str) {
        let delta = self.refs.lock().unwrap_or_else(|p| p.into_inner()).unregister(pod);
        self.apply(delta);
    }

    fn apply(&self, delta: Delta) {
        if delta.start.is_empty() && delta.stop.is_empty() {
            return;
        }
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        for k in delta.stop {
            if let Some(Entry { watch: Some(w), .. }) = entries.remove(&k) {
                w.abort();
            }
        }
        for (ns, name) in delta.start {
            let informer = Informer::new();
            let watch = Some(self.watches.start(&ns, &name, informer.clone()));
            tracing::debug!(kind = %K::kind(&()), namespace = %ns, name = %name, "watching a referenced object");
            if let Some(Entry { watch: Some(w), .. }) = entries.insert((ns, name), Entry { informer, watch }) {
                w.abort();
            }
        }
    }

    /// The object as its watch last saw it, once the watch has listed.
    pub async fn get(&self, namespace: &str, name: &str) -> Lookup<K> {
        let key = (namespace.to_string(), name.to_string());
        let Some(informer) = self.entries.lock().unwrap_or_else(|p| p.into_inner()).get(&key).map(|e| e.informer.clone()) else {
            return Lookup::Unknown;
        };
        if !informer.is_synced() && tokio::time::timeout(self.sync_wait, informer.wait_synced()).await.is_err() {
            return Lookup::Unknown;
        }
        match informer.get(Some(namespace), name) {
            Some(obj) => {
                if obj.immutable() {
                    // Nothing about it can change any more: its watch is not needed.
                    if let Some(e) = self.entries.lock().unwrap_or_else(|p| p.into_inner()).get_mut(&key) {
                        if let Some(w) = e.watch.take() {
                            w.abort();
                        }
                    }
                }
                Lookup::Found(obj)
            }
            None => Lookup::Missing,
        }
    }

    /// The objects being watched now (for tests and the debug endpoint).
    pub fn watched(&self) -> Vec<Key> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.iter().filter(|(_, e)| e.watch.is_some()).map(|(k, _)| k.clone()).collect()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use kube::runtime::watcher::Event;

    fn key(ns: &str, n: &str) -> Key {
        (ns.into(), n.into())
    }

    fn keys(v: &[(&str, &str)]) -> BTreeSet<Key> {
        v.iter().map(|(a, b)| key(a, b)).collect()
    }

    #[test]
    fn refs_start_a_watch_for_the_first_pod_and_end_it_with_the_last() {
        let mut r = Refs::default();
        let d = r.register("p1", keys(&[("ns", "ca"), ("ns", "cfg")]));
        assert_eq!(d, Delta { start: vec![key("ns", "ca"), key("ns", "cfg")], stop: vec![] });
        // the same references again: nothing to do
        assert_eq!(r.register("p1", keys(&[("ns", "ca"), ("ns", "cfg")])), Delta::default());
        // a second pod sharing one object
        assert_eq!(r.register("p2", keys(&[("ns", "ca")])), Delta::default());
        // p1 drops cfg (its only user) and adds other
        assert_eq!(r.register("p1", keys(&[("ns", "ca"), ("ns", "other")])), Delta { start: vec![key("ns", "other")], stop: vec![key("ns", "cfg")] });
        // p1 gone: ca stays for p2
        assert_eq!(r.unregister("p1"), Delta { start: vec![], stop: vec![key("ns", "other")] });
        assert!(r.referenced(&key("ns", "ca")));
        assert_eq!(r.unregister("p2"), Delta { start: vec![], stop: vec![key("ns", "ca")] });
        assert!(!r.referenced(&key("ns", "ca")));
        // unknown pods and twice-unregistered pods change nothing
        assert_eq!(r.unregister("p2"), Delta::default());
        assert_eq!(r.unregister("nobody"), Delta::default());
        // same name in two namespaces: two objects
        assert_eq!(r.register("p3", keys(&[("a", "x"), ("b", "x")])).start.len(), 2);
        // a pod with no references left keeps nothing
        assert_eq!(r.register("p3", BTreeSet::new()), Delta { start: vec![], stop: vec![key("a", "x"), key("b", "x")] });
        assert!(r.by_pod.is_empty() && r.count.is_empty());
    }

    type Started = (Key, Arc<Informer<ConfigMap>>, tokio::task::AbortHandle);

    /// Records the watches started; each is a pending task the test can see aborted.
    #[derive(Clone, Default)]
    struct FakeWatches {
        started: Arc<Mutex<Vec<Started>>>,
    }

    impl Watches<ConfigMap> for FakeWatches {
        fn start(&self, namespace: &str, name: &str, informer: Arc<Informer<ConfigMap>>) -> tokio::task::AbortHandle {
            let h = tokio::spawn(futures::future::pending::<()>()).abort_handle();
            self.started.lock().unwrap().push((key(namespace, name), informer, h.clone()));
            h
        }
    }

    impl FakeWatches {
        fn informer(&self, ns: &str, name: &str) -> Arc<Informer<ConfigMap>> {
            let s = self.started.lock().unwrap();
            s.iter().rev().find(|(k, _, _)| *k == key(ns, name)).map(|(_, i, _)| i.clone()).unwrap()
        }

        fn handle(&self, ns: &str, name: &str) -> tokio::task::AbortHandle {
            let s = self.started.lock().unwrap();
            s.iter().rev().find(|(k, _, _)| *k == key(ns, name)).map(|(_, _, h)| h.clone()).unwrap()
        }

        /// The watch's first listing: `objects`.
        fn list(&self, ns: &str, name: &str, objects: Vec<ConfigMap>) {
            let inf = self.informer(ns, name);
            let mut buf = None;
            inf.inject(Event::Init, &mut buf);
            for o in objects {
                inf.inject(Event::InitApply(o), &mut buf);
            }
            inf.inject(Event::InitDone, &mut buf);
        }
    }

    fn cm(ns: &str, name: &str, data: &str, immutable: bool) -> ConfigMap {
        let mut c = ConfigMap::default();
        c.metadata.namespace = Some(ns.into());
        c.metadata.name = Some(name.into());
        c.metadata.resource_version = Some("1".into());
        c.data = Some([("k".to_string(), data.to_string())].into());
        c.immutable = immutable.then_some(true);
        c
    }

    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn reads_come_from_the_watch_shared_by_the_pods_and_follow_its_changes() {
        let fake = FakeWatches::default();
        let cache = ObjectCache::new(Box::new(fake.clone()));
        let names: BTreeSet<String> = ["ca".to_string()].into();
        cache.register("p1", "ns", &names);
        cache.register("p2", "ns", &names);
        assert_eq!(fake.started.lock().unwrap().len(), 1, "one watch for both pods");
        assert_eq!(cache.watched(), vec![key("ns", "ca")]);

        // A read before the first listing waits for it.
        let listing = {
            let fake = fake.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                fake.list("ns", "ca", vec![cm("ns", "ca", "v1", false)]);
            })
        };
        let Lookup::Found(got) = cache.get("ns", "ca").await else { panic!("not found") };
        assert_eq!(got.data.as_ref().unwrap()["k"], "v1");
        listing.await.unwrap();

        // A change the watch brings is what the next read returns.
        let mut changed = cm("ns", "ca", "v2", false);
        changed.metadata.resource_version = Some("2".into());
        fake.informer("ns", "ca").inject(Event::Apply(changed), &mut None);
        let Lookup::Found(got) = cache.get("ns", "ca").await else { panic!("not found") };
        assert_eq!(got.data.as_ref().unwrap()["k"], "v2");

        // Deleted: missing.
        fake.informer("ns", "ca").inject(Event::Delete(cm("ns", "ca", "v2", false)), &mut None);
        assert_eq!(cache.get("ns", "ca").await, Lookup::Missing);

        // Objects nobody registered are not the cache's.
        assert_eq!(cache.get("ns", "other").await, Lookup::Unknown);
        assert_eq!(cache.get("elsewhere", "ca").await, Lookup::Unknown);

        // The watch ends with the last pod.
        let h = fake.handle("ns", "ca");
        cache.unregister("p1");
        settle().await;
        assert!(!h.is_finished(), "p2 still refers to it");
        cache.unregister("p2");
        settle().await;
        assert!(h.is_finished(), "the watch ended with the last pod");
        assert!(cache.watched().is_empty());
        assert_eq!(cache.get("ns", "ca").await, Lookup::Unknown);
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_that_has_not_listed_in_time_leaves_the_read_to_the_api() {
        let fake = FakeWatches::default();
        let cache = ObjectCache::new(Box::new(fake.clone()));
        cache.register("p1", "ns", &["ca".to_string()].into());
        // Nothing listed: after the wait, the caller is told to ask the API.
        assert_eq!(cache.get("ns", "ca").await, Lookup::Unknown);
        // Listed without the object: it does not exist.
        fake.list("ns", "ca", vec![]);
        assert_eq!(cache.get("ns", "ca").await, Lookup::Missing);
    }

    #[tokio::test(start_paused = true)]
    async fn an_immutable_object_is_kept_and_its_watch_ended() {
        let fake = FakeWatches::default();
        let cache = ObjectCache::new(Box::new(fake.clone()));
        cache.register("p1", "ns", &["frozen".to_string(), "live".to_string()].into());
        fake.list("ns", "frozen", vec![cm("ns", "frozen", "v1", true)]);
        fake.list("ns", "live", vec![cm("ns", "live", "v1", false)]);
        assert!(matches!(cache.get("ns", "frozen").await, Lookup::Found(_)));
        assert!(matches!(cache.get("ns", "live").await, Lookup::Found(_)));
        settle().await;
        assert!(fake.handle("ns", "frozen").is_finished(), "no watch for an immutable object");
        assert!(!fake.handle("ns", "live").is_finished());
        assert_eq!(cache.watched(), vec![key("ns", "live")]);
        // still served from the cache
        let Lookup::Found(got) = cache.get("ns", "frozen").await else { panic!("not kept") };
        assert_eq!(got.data.as_ref().unwrap()["k"], "v1");
        // a pod registering it again does not start a second watch while one pod holds it
        cache.register("p2", "ns", &["frozen".to_string()].into());
        assert_eq!(fake.started.lock().unwrap().len(), 2);
    }

    #[tokio::test]
    async fn dropping_the_cache_ends_its_watches() {
        let fake = FakeWatches::default();
        let cache = ObjectCache::new(Box::new(fake.clone()));
        cache.register("p1", "ns", &["a".to_string(), "b".to_string()].into());
        let (a, b) = (fake.handle("ns", "a"), fake.handle("ns", "b"));
        drop(cache);
        settle().await;
        assert!(a.is_finished() && b.is_finished());
    }
}
