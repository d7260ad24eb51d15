//! A shared informer: one list+watch of a kind (kube-runtime's watcher, which relists on 410
//! and backs off on errors), a local cache of the objects, and change notifications to any
//! number of handlers, each of which usually just queues keys for a controller.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use futures::StreamExt as _;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt as _;
use kube::{Api, Resource, ResourceExt as _};
use serde::de::DeserializeOwned;

/// Namespace (None for cluster-scoped kinds) and name of an object.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    pub namespace: Option<String>,
    pub name: String,
}

impl ObjectKey {
    pub fn new(namespace: Option<&str>, name: &str) -> Self {
        ObjectKey { namespace: namespace.map(str::to_string), name: name.to_string() }
    }

    pub fn of<K: Resource>(obj: &K) -> Self {
        ObjectKey { namespace: obj.namespace(), name: obj.name_any() }
    }
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{ns}/{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

/// What an informer saw happen to one object.
pub enum Change<K> {
    /// Created (old is None) or changed.
    Applied { old: Option<Arc<K>>, new: Arc<K> },
    /// Deleted (the last state the informer knew).
    Deleted(Arc<K>),
}

impl<K> Change<K> {
    /// The object as it is now, or as it was when deleted.
    pub fn object(&self) -> &Arc<K> {
        match self {
            Change::Applied { new, .. } => new,
            Change::Deleted(o) => o,
        }
    }
}

type Handler<K> = Box<dyn Fn(&Change<K>) + Send + Sync>;
type Transform<K> = Box<dyn Fn(&mut K) + Send + Sync>;

/// One watch of a kind, its cache, and its handlers.
pub struct Informer<K> {
    cache: RwLock<BTreeMap<ObjectKey, Arc<K>>>,
    handlers: RwLock<Vec<Handler<K>>>,
    synced: tokio::sync::watch::Sender<bool>,
    transform: Option<Transform<K>>,
}

impl<K> Informer<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    pub fn new() -> Arc<Self> {
        Self::build(None)
    }

    /// An informer that passes every object it receives through `transform` before caching it
    /// or telling a handler (client-go's SetTransform): a loop that reads a few fields of a
    /// kind it holds by the ten thousand drops the rest (managedFields, fields it never reads)
    /// and keeps its memory to what it uses. The transform must keep the namespace, name and
    /// resourceVersion (the cache's key and its relist comparison).
    pub fn with_transform(transform: impl Fn(&mut K) + Send + Sync + 'static) -> Arc<Self> {
        Self::build(Some(Box::new(transform)))
    }

    fn build(transform: Option<Transform<K>>) -> Arc<Self> {
        Arc::new(Informer {
            cache: RwLock::new(BTreeMap::new()),
            handlers: RwLock::new(Vec::new()),
            synced: tokio::sync::watch::Sender::new(false),
            transform,
        })
    }

    fn transformed(&self, mut obj: K) -> K {
        if let Some(t) = &self.transform {
            t(&mut obj);
        }
        obj
    }

    fn read(&self) -> RwLockReadGuard<'_, BTreeMap<ObjectKey, Arc<K>>> {
        self.cache.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, BTreeMap<ObjectKey, Arc<K>>> {
        self.cache.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a handler, called for every change after the cache was updated. Handlers run
    /// on the informer's task and must be quick (queue a key, update a small index).
    ///
    /// A handler registered late (several loops share one informer, each registering when it
    /// starts, and the watch may have listed already) is first told of every object in the
    /// cache as added, as client-go does for a late event handler: nothing the informer saw
    /// before is lost to it. Replayed under the handlers' lock, so the cache's next change
    /// reaches it after the replay; it may see an object once more than needed, never miss one.
    pub fn on_change(&self, f: impl Fn(&Change<K>) + Send + Sync + 'static) {
        let mut handlers = self.handlers.write().unwrap_or_else(|p| p.into_inner());
        let cached: Vec<Arc<K>> = self.read().values().cloned().collect();
        for new in cached {
            f(&Change::Applied { old: None, new });
        }
        handlers.push(Box::new(f));
    }

    fn notify(&self, changes: &[Change<K>]) {
        let handlers = self.handlers.read().unwrap_or_else(|p| p.into_inner());
        for c in changes {
            for h in handlers.iter() {
                h(c);
            }
        }
    }

    /// Starts the watch on the current tokio runtime.
    pub fn spawn(self: &Arc<Self>, api: Api<K>, config: watcher::Config) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move {
            let kind = std::any::type_name::<K>().rsplit("::").next().unwrap_or("object").to_string();
            let mut stream = watcher::watcher(api, config).default_backoff().boxed();
            let mut buffer: Option<BTreeMap<ObjectKey, Arc<K>>> = None;
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(ev) => this.apply(ev, &mut buffer),
                    Err(e) => tracing::warn!(kind, error = %e, "watch failed; retrying"),
                }
            }
        })
    }

    fn apply(&self, ev: Event<K>, buffer: &mut Option<BTreeMap<ObjectKey, Arc<K>>>) {
        let ev = match ev {
            Event::InitApply(obj) => Event::InitApply(self.transformed(obj)),
            Event::Apply(obj) => Event::Apply(self.transformed(obj)),
            Event::Delete(obj) => Event::Delete(self.transformed(obj)),
            other => other,
        };
        match ev {
            Event::Init => *buffer = Some(BTreeMap::new()),
            Event::InitApply(obj) => {
                buffer.get_or_insert_with(BTreeMap::new).insert(ObjectKey::of(&obj), Arc::new(obj));
            }
            Event::InitDone => {
                let fresh = buffer.take().unwrap_or_default();
                let mut changes = Vec::new();
                {
                    let mut cache = self.write();
                    for (key, old) in cache.iter() {
                        if !fresh.contains_key(key) {
                            changes.push(Change::Deleted(old.clone()));
                        }
                    }
                    for (key, new) in &fresh {
                        let old = cache.get(key).cloned();
                        let same = old.as_ref().is_some_and(|o| {
                            o.meta().resource_version.is_some() && o.meta().resource_version == new.meta().resource_version
                        });
                        if !same {
                            changes.push(Change::Applied { old, new: new.clone() });
                        }
                    }
                    *cache = fresh;
                }
                self.notify(&changes);
                self.synced.send_replace(true);
            }
            Event::Apply(obj) => {
                let new = Arc::new(obj);
                let old = self.write().insert(ObjectKey::of(new.as_ref()), new.clone());
                self.notify(&[Change::Applied { old, new }]);
            }
            Event::Delete(obj) => {
                let key = ObjectKey::of(&obj);
                let last = self.write().remove(&key).unwrap_or_else(|| Arc::new(obj));
                self.notify(&[Change::Deleted(last)]);
            }
        }
    }

    /// Waits until the first complete listing is in the cache.
    pub async fn wait_synced(&self) {
        let mut rx = self.synced.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }

    pub fn is_synced(&self) -> bool {
        *self.synced.borrow()
    }

    pub fn get(&self, namespace: Option<&str>, name: &str) -> Option<Arc<K>> {
        self.read().get(&ObjectKey::new(namespace, name)).cloned()
    }

    /// Every cached object.
    pub fn list(&self) -> Vec<Arc<K>> {
        self.read().values().cloned().collect()
    }

    /// The cached objects of one namespace (a range scan, not a filter over everything).
    pub fn list_namespace(&self, namespace: &str) -> Vec<Arc<K>> {
        let start = ObjectKey::new(Some(namespace), "");
        self.read()
            .range(start..)
            .take_while(|(k, _)| k.namespace.as_deref() == Some(namespace))
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Keys of every cached object.
    pub fn keys(&self) -> Vec<ObjectKey> {
        self.read().keys().cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.read().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Applies an event as if it came from the watch (for tests of handlers and indexes).
    pub fn inject(&self, ev: Event<K>, buffer: &mut Option<BTreeMap<ObjectKey, Arc<K>>>) {
        self.apply(ev, buffer);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use std::sync::Mutex;

    fn cm(ns: &str, name: &str, rv: &str) -> ConfigMap {
        let mut c = ConfigMap::default();
        c.metadata.namespace = Some(ns.into());
        c.metadata.name = Some(name.into());
        c.metadata.resource_version = Some(rv.into());
        c
    }

    fn recorder(inf: &Informer<ConfigMap>) -> Arc<Mutex<Vec<String>>> {
        let log = Arc::new(Mutex::new(Vec::new()));
        let l = log.clone();
        inf.on_change(move |c| {
            let s = match c {
                Change::Applied { old: None, new } => format!("add {}", ObjectKey::of(new.as_ref())),
                Change::Applied { old: Some(_), new } => format!("update {}", ObjectKey::of(new.as_ref())),
                Change::Deleted(o) => format!("delete {}", ObjectKey::of(o.as_ref())),
            };
            l.lock().unwrap().push(s);
        });
        log
    }

    #[test]
    fn relist_reports_only_differences_and_deletions() {
        let inf = Informer::<ConfigMap>::new();
        let log = recorder(&inf);
        let mut buf = None;
        inf.inject(Event::Init, &mut buf);
        inf.inject(Event::InitApply(cm("a", "x", "1")), &mut buf);
        inf.inject(Event::InitApply(cm("a", "y", "2")), &mut buf);
        inf.inject(Event::InitDone, &mut buf);
        assert!(inf.is_synced());
        inf.inject(Event::Apply(cm("b", "z", "3")), &mut buf);
        // a relist after a 410: x unchanged, y changed, z gone
        inf.inject(Event::Init, &mut buf);
        inf.inject(Event::InitApply(cm("a", "x", "1")), &mut buf);
        inf.inject(Event::InitApply(cm("a", "y", "4")), &mut buf);
        inf.inject(Event::InitDone, &mut buf);
        inf.inject(Event::Delete(cm("a", "x", "5")), &mut buf);
        assert_eq!(
            *log.lock().unwrap(),
            ["add a/x", "add a/y", "add b/z", "delete b/z", "update a/y", "delete a/x"]
        );
        assert_eq!(inf.len(), 1);
    }

    #[test]
    fn a_handler_registered_after_the_list_is_told_of_every_cached_object() {
        let inf = Informer::<ConfigMap>::new();
        let early = recorder(&inf);
        let mut buf = None;
        inf.inject(Event::Init, &mut buf);
        inf.inject(Event::InitApply(cm("a", "x", "1")), &mut buf);
        inf.inject(Event::InitApply(cm("b", "y", "2")), &mut buf);
        inf.inject(Event::InitDone, &mut buf);
        let late = recorder(&inf);
        assert_eq!(*late.lock().unwrap(), ["add a/x", "add b/y"]);
        inf.inject(Event::Delete(cm("a", "x", "3")), &mut buf);
        assert_eq!(*late.lock().unwrap(), ["add a/x", "add b/y", "delete a/x"]);
        assert_eq!(*early.lock().unwrap(), ["add a/x", "add b/y", "delete a/x"]);
    }

    #[test]
    fn a_transform_applies_before_the_cache_and_the_handlers() {
        let inf = Informer::<ConfigMap>::with_transform(|c| {
            c.data = None;
            c.metadata.managed_fields = None;
        });
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        inf.on_change(move |c| s.lock().unwrap().push(c.object().data.is_none() && c.object().metadata.managed_fields.is_none()));
        let mut full = cm("a", "x", "1");
        full.data = Some([("k".to_string(), "v".to_string())].into());
        full.metadata.managed_fields = Some(vec![Default::default()]);
        let mut buf = None;
        inf.inject(Event::Init, &mut buf);
        inf.inject(Event::InitApply(full.clone()), &mut buf);
        inf.inject(Event::InitDone, &mut buf);
        full.metadata.resource_version = Some("2".into());
        inf.inject(Event::Apply(full.clone()), &mut buf);
        inf.inject(Event::Delete(full), &mut buf);
        assert_eq!(*seen.lock().unwrap(), [true, true, true]);
        inf.inject(Event::Apply(cm("a", "y", "3")), &mut buf);
        let y = inf.get(Some("a"), "y").unwrap();
        assert_eq!(y.metadata.resource_version.as_deref(), Some("3"));
    }

    #[test]
    fn list_namespace_is_a_range() {
        let inf = Informer::<ConfigMap>::new();
        let mut buf = None;
        for (ns, n) in [("a", "1"), ("ab", "2"), ("b", "3"), ("a", "4")] {
            inf.inject(Event::Apply(cm(ns, n, "1")), &mut buf);
        }
        let names: Vec<_> = inf.list_namespace("a").iter().map(|c| c.name_any()).collect();
        assert_eq!(names, ["1", "4"]);
        assert!(inf.get(Some("ab"), "2").is_some());
        assert!(inf.list_namespace("c").is_empty());
    }
}
