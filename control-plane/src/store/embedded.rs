//! The embedded store: every object in memory for reads, redb on disk for durability.
//!
//! Writes go to one writer thread that batches whatever is queued (group commit): it checks the
//! preconditions of each write against the current state, assigns consecutive revisions, writes
//! the objects, the new events and the revision counter in one redb transaction committed with
//! `Durability::Immediate` (fsync), and only then makes the changes visible, publishes the events
//! and acknowledges the callers. A crash therefore loses nothing acknowledged, and a batch is all
//! or nothing. Recent events are persisted too, so watchers resume across a restart.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::Path;
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use futures::future::BoxFuture;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use tokio::sync::{broadcast, mpsc, oneshot};

use super::{
    stamp, Event, EventKind, Indexer, Listing, Op, Record, Revision, Store, StoreError, Watch,
};

const OBJECTS: TableDefinition<&str, &[u8]> = TableDefinition::new("objects");
const EVENTS: TableDefinition<i64, &[u8]> = TableDefinition::new("events");
const META: TableDefinition<&str, i64> = TableDefinition::new("meta");
const META_REVISION: &str = "revision";

/// Tuning of the embedded store.
#[derive(Debug, Clone)]
pub struct EmbeddedStoreOptions {
    /// How many recent events are kept (in memory and on disk) for watches to start from.
    pub history: usize,
    /// Largest number of writes committed together.
    pub max_batch: usize,
    /// redb page cache; reads are served from memory, so this can stay small.
    pub cache_bytes: usize,
}

impl Default for EmbeddedStoreOptions {
    fn default() -> Self {
        EmbeddedStoreOptions { history: 20_000, max_batch: 1024, cache_bytes: 16 << 20 }
    }
}

struct State {
    objects: BTreeMap<Arc<str>, Record>,
    revision: Revision,
    history: VecDeque<Arc<Event>>,
    /// Watches may start after this revision and no earlier.
    oldest_watchable: Revision,
}

struct Shared {
    state: RwLock<State>,
    events: broadcast::Sender<Arc<Event>>,
    indexer: Indexer,
    history: usize,
}

type Reply = oneshot::Sender<Result<Record, StoreError>>;

pub struct EmbeddedStore {
    shared: Arc<Shared>,
    writes: mpsc::Sender<(Op, Reply)>,
}

fn io<E: std::fmt::Display>(e: E) -> StoreError {
    StoreError::Io(e.to_string())
}

impl EmbeddedStore {
    /// Opens (or creates) the store in `path` and loads it into memory. Must be called from
    /// within a tokio runtime only if the caller then awaits writes; opening itself is blocking.
    pub fn open(
        path: &Path,
        indexer: Indexer,
        options: EmbeddedStoreOptions,
    ) -> Result<EmbeddedStore, StoreError> {
        let mut builder = Database::builder();
        builder.set_cache_size(options.cache_bytes);
        let db = builder.create(path).map_err(io)?;
        let init = db.begin_write().map_err(io)?;
        {
            init.open_table(OBJECTS).map_err(io)?;
            init.open_table(EVENTS).map_err(io)?;
            init.open_table(META).map_err(io)?;
        }
        init.commit().map_err(io)?;

        let read = db.begin_read().map_err(io)?;
        let meta = read.open_table(META).map_err(io)?;
        let revision = meta.get(META_REVISION).map_err(io)?.map(|v| v.value()).unwrap_or(0);
        let mut objects = BTreeMap::new();
        for entry in read.open_table(OBJECTS).map_err(io)?.iter().map_err(io)? {
            let (k, v) = entry.map_err(io)?;
            let key: Arc<str> = Arc::from(k.value());
            let record = decode_record(key.clone(), v.value(), &indexer)?;
            objects.insert(key, record);
        }
        let mut history = VecDeque::new();
        for entry in read.open_table(EVENTS).map_err(io)?.iter().map_err(io)? {
            let (_, v) = entry.map_err(io)?;
            history.push_back(Arc::new(decode_event(v.value(), &indexer)?));
        }
        drop(meta);
        drop(read);
        // Drop events beyond the configured history (the option may have shrunk).
        while history.len() > options.history {
            history.pop_front();
        }
        let oldest_watchable = history.front().map(|e| e.rev - 1).unwrap_or(revision);
        let (events, _) = broadcast::channel(65_536);
        let shared = Arc::new(Shared {
            state: RwLock::new(State { objects, revision, history, oldest_watchable }),
            events,
            indexer,
            history: options.history,
        });
        let (tx, rx) = mpsc::channel(options.max_batch * 4);
        let writer_shared = shared.clone();
        let max_batch = options.max_batch;
        std::thread::Builder::new()
            .name("store-writer".into())
            .spawn(move || writer(db, writer_shared, rx, max_batch))
            .map_err(io)?;
        Ok(EmbeddedStore { shared, writes: tx })
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        // A poisoned lock means a writer panicked mid-apply; the data on disk is still sound,
        // and readers keep seeing the last complete state.
        self.shared.state.read().unwrap_or_else(|p| p.into_inner())
    }
}

impl Store for EmbeddedStore {
    fn revision(&self) -> Revision {
        self.read().revision
    }

    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Record>, StoreError>> {
        let found = self.read().objects.get(key).cloned();
        Box::pin(async move { Ok(found) })
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Listing, StoreError>> {
        let state = self.read();
        let records: Vec<Record> = state
            .objects
            .range::<str, _>((std::ops::Bound::Included(prefix), std::ops::Bound::Unbounded))
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(_, r)| r.clone())
            .collect();
        let listing = Listing { records, revision: state.revision };
        drop(state);
        Box::pin(async move { Ok(listing) })
    }

    fn write(&self, op: Op) -> BoxFuture<'_, Result<Record, StoreError>> {
        Box::pin(async move {
            let (tx, rx) = oneshot::channel();
            self.writes.send((op, tx)).await.map_err(|_| StoreError::Closed)?;
            rx.await.map_err(|_| StoreError::Closed)?
        })
    }

    fn watch(&self, after: Revision) -> Result<Watch, StoreError> {
        let state = self.read();
        if after < state.oldest_watchable {
            return Err(StoreError::Compacted { requested: after, oldest: state.oldest_watchable });
        }
        // Subscribing under the read lock: events are published under the write lock, so nothing
        // falls between the backlog and the live feed.
        let live = self.shared.events.subscribe();
        let start = state.history.partition_point(|e| e.rev <= after);
        let backlog = state.history.range(start..).cloned().collect();
        Ok(Watch { backlog, live, after })
    }

    fn oldest_watchable(&self) -> Revision {
        self.read().oldest_watchable
    }
}

/// The result of planning one write of a batch.
struct Planned {
    event: Arc<Event>,
}

fn plan_op(
    op: Op,
    current: Option<&Record>,
    rev: Revision,
    indexer: &Indexer,
) -> Result<Planned, StoreError> {
    let check = |expect: Option<Revision>, current: Option<&Record>| -> Result<Record, StoreError> {
        let cur = current.ok_or(StoreError::NotFound)?;
        if let Some(expect) = expect {
            if expect != cur.mod_rev {
                return Err(StoreError::Conflict { current: cur.mod_rev });
            }
        }
        Ok(cur.clone())
    };
    let (kind, record, prev) = match op {
        Op::Create { key, mut value } => {
            if current.is_some() {
                return Err(StoreError::AlreadyExists);
            }
            let attrs = Arc::new(indexer(&key, &value));
            let bytes = stamp(&mut value, rev)?;
            let record =
                Record { key: Arc::from(key), create_rev: rev, mod_rev: rev, value: bytes, attrs };
            (EventKind::Added, record, None)
        }
        Op::Update { key, mut value, expect } => {
            let prev = check(expect, current)?;
            let attrs = Arc::new(indexer(&key, &value));
            let bytes = stamp(&mut value, rev)?;
            let record = Record {
                key: prev.key.clone(),
                create_rev: prev.create_rev,
                mod_rev: rev,
                value: bytes,
                attrs,
            };
            (EventKind::Modified, record, Some(prev))
        }
        Op::Delete { key: _, expect } => {
            let prev = check(expect, current)?;
            let mut value = prev.json()?;
            let bytes = stamp(&mut value, rev)?;
            let record = Record {
                key: prev.key.clone(),
                create_rev: prev.create_rev,
                mod_rev: rev,
                value: bytes,
                attrs: prev.attrs.clone(),
            };
            (EventKind::Deleted, record, Some(prev))
        }
    };
    Ok(Planned { event: Arc::new(Event { kind, rev, record, prev }) })
}

fn writer(
    db: Database,
    shared: Arc<Shared>,
    mut rx: mpsc::Receiver<(Op, Reply)>,
    max_batch: usize,
) {
    while let Some(first) = rx.blocking_recv() {
        let mut batch = vec![first];
        while batch.len() < max_batch {
            match rx.try_recv() {
                Ok(item) => batch.push(item),
                Err(_) => break,
            }
        }
        let start_rev = shared.state.read().unwrap_or_else(|p| p.into_inner()).revision;
        let mut rev = start_rev;
        // Effects of earlier writes in this batch, seen by later ones.
        let mut overlay: HashMap<String, Option<Record>> = HashMap::new();
        let mut outcomes: Vec<(Reply, Result<Arc<Event>, StoreError>)> = Vec::new();
        {
            let state = shared.state.read().unwrap_or_else(|p| p.into_inner());
            for (op, reply) in batch {
                let key = op.key().to_owned();
                let current = match overlay.get(&key) {
                    Some(v) => v.as_ref(),
                    None => state.objects.get(key.as_str()),
                };
                match plan_op(op, current, rev + 1, &shared.indexer) {
                    Ok(planned) => {
                        rev += 1;
                        let after = match planned.event.kind {
                            EventKind::Deleted => None,
                            _ => Some(planned.event.record.clone()),
                        };
                        overlay.insert(key, after);
                        outcomes.push((reply, Ok(planned.event)));
                    }
                    Err(e) => outcomes.push((reply, Err(e))),
                }
            }
        }
        let events: Vec<Arc<Event>> =
            outcomes.iter().filter_map(|(_, r)| r.as_ref().ok().cloned()).collect();
        if !events.is_empty() {
            if let Err(e) = persist(&db, &events, rev, shared.history) {
                tracing::error!(error = %e, "store commit failed");
                for (reply, result) in outcomes {
                    let _ = reply.send(result.and(Err(e.clone())));
                }
                continue;
            }
            let mut state = shared.state.write().unwrap_or_else(|p| p.into_inner());
            for event in &events {
                match event.kind {
                    EventKind::Deleted => {
                        state.objects.remove(&event.record.key);
                    }
                    _ => {
                        state.objects.insert(event.record.key.clone(), event.record.clone());
                    }
                }
                state.history.push_back(event.clone());
                // Nobody listening is fine.
                let _ = shared.events.send(event.clone());
            }
            state.revision = rev;
            while state.history.len() > shared.history {
                if let Some(old) = state.history.pop_front() {
                    state.oldest_watchable = old.rev;
                }
            }
        }
        for (reply, result) in outcomes {
            let _ = reply.send(result.map(|e| e.record.clone()));
        }
    }
}

fn persist(
    db: &Database,
    events: &[Arc<Event>],
    rev: Revision,
    history: usize,
) -> Result<(), StoreError> {
    let txn = db.begin_write().map_err(io)?;
    {
        let mut objects = txn.open_table(OBJECTS).map_err(io)?;
        let mut log = txn.open_table(EVENTS).map_err(io)?;
        for event in events {
            let r = &event.record;
            match event.kind {
                EventKind::Deleted => {
                    objects.remove(&*r.key).map_err(io)?;
                }
                _ => {
                    objects.insert(&*r.key, encode_record(r).as_slice()).map_err(io)?;
                }
            }
            log.insert(event.rev, encode_event(event).as_slice()).map_err(io)?;
        }
        let floor = rev - history as i64;
        if floor > 0 {
            log.retain_in(..=floor, |_, _| false).map_err(io)?;
        }
        let mut meta = txn.open_table(META).map_err(io)?;
        meta.insert(META_REVISION, rev).map_err(io)?;
    }
    txn.commit().map_err(io)
}

fn encode_record(r: &Record) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + r.value.len());
    out.extend_from_slice(&r.create_rev.to_le_bytes());
    out.extend_from_slice(&r.mod_rev.to_le_bytes());
    out.extend_from_slice(&r.value);
    out
}

fn read_i64(bytes: &[u8], at: usize) -> Result<i64, StoreError> {
    bytes
        .get(at..at + 8)
        .and_then(|s| <[u8; 8]>::try_from(s).ok())
        .map(i64::from_le_bytes)
        .ok_or_else(|| StoreError::Corrupt("short record".into()))
}

fn decode_record(key: Arc<str>, bytes: &[u8], indexer: &Indexer) -> Result<Record, StoreError> {
    let create_rev = read_i64(bytes, 0)?;
    let mod_rev = read_i64(bytes, 8)?;
    let value = Bytes::copy_from_slice(&bytes[16..]);
    let json: serde_json::Value =
        serde_json::from_slice(&value).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let attrs = Arc::new(indexer(&key, &json));
    Ok(Record { key, create_rev, mod_rev, value, attrs })
}

fn encode_event(e: &Event) -> Vec<u8> {
    let kind = match e.kind {
        EventKind::Added => 0u8,
        EventKind::Modified => 1,
        EventKind::Deleted => 2,
    };
    let key = e.record.key.as_bytes();
    let mut out = Vec::with_capacity(5 + key.len() + 16 + e.record.value.len());
    out.push(kind);
    out.extend_from_slice(&(key.len() as u32).to_le_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(&encode_record(&e.record));
    out
}

fn decode_event(bytes: &[u8], indexer: &Indexer) -> Result<Event, StoreError> {
    let corrupt = || StoreError::Corrupt("short event".into());
    let kind = match bytes.first().ok_or_else(corrupt)? {
        0 => EventKind::Added,
        1 => EventKind::Modified,
        _ => EventKind::Deleted,
    };
    let len = bytes
        .get(1..5)
        .and_then(|s| <[u8; 4]>::try_from(s).ok())
        .map(u32::from_le_bytes)
        .ok_or_else(corrupt)? as usize;
    let key = std::str::from_utf8(bytes.get(5..5 + len).ok_or_else(corrupt)?)
        .map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let record = decode_record(Arc::from(key), bytes.get(5 + len..).ok_or_else(corrupt)?, indexer)?;
    // The previous state is not persisted; after a restart, watchers with selectors see a
    // modification as the new state only, which is what upstream does after a relist.
    Ok(Event { kind, rev: record.mod_rev, record, prev: None })
}

/// An indexer that records labels only, for tests.
#[cfg(test)]
pub fn labels_only() -> Indexer {
    Arc::new(|_, v: &serde_json::Value| super::Attrs {
        labels: v
            .pointer("/metadata/labels")
            .and_then(|l| serde_json::from_value(l.clone()).ok())
            .unwrap_or_default(),
        fields: Vec::new(),
        refs: Vec::new(),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn open(dir: &Path, history: usize) -> EmbeddedStore {
        EmbeddedStore::open(
            &dir.join("store.redb"),
            labels_only(),
            EmbeddedStoreOptions { history, ..Default::default() },
        )
        .unwrap()
    }

    #[tokio::test]
    async fn create_update_delete_with_revisions() {
        let dir = tempfile::tempdir().unwrap();
        let s = open(dir.path(), 100);
        let a = s
            .write(Op::Create { key: "/a".into(), value: json!({"metadata":{"name":"a"}}) })
            .await
            .unwrap();
        assert_eq!(a.mod_rev, 1);
        assert_eq!(a.json().unwrap()["metadata"]["resourceVersion"], "1");
        let err = s
            .write(Op::Create { key: "/a".into(), value: json!({}) })
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::AlreadyExists));
        let err = s
            .write(Op::Update { key: "/a".into(), value: json!({}), expect: Some(7) })
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Conflict { current: 1 }));
        let b = s
            .write(Op::Update { key: "/a".into(), value: json!({"x":1}), expect: Some(1) })
            .await
            .unwrap();
        assert_eq!((b.create_rev, b.mod_rev), (1, 2));
        let d = s.write(Op::Delete { key: "/a".into(), expect: None }).await.unwrap();
        assert_eq!(d.mod_rev, 3);
        assert_eq!(d.json().unwrap()["x"], 1);
        assert!(s.get("/a").await.unwrap().is_none());
        let err = s.write(Op::Delete { key: "/a".into(), expect: None }).await.unwrap_err();
        assert!(matches!(err, StoreError::NotFound));
        assert_eq!(s.revision(), 3);
    }

    #[tokio::test]
    async fn reopen_keeps_objects_revision_and_history() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = open(dir.path(), 100);
            for i in 0..10 {
                s.write(Op::Create { key: format!("/k/{i}"), value: json!({"i": i}) })
                    .await
                    .unwrap();
            }
        }
        // The writer thread of the first instance holds the file until its channel closes.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let s = open(dir.path(), 100);
        assert_eq!(s.revision(), 10);
        assert_eq!(s.list("/k/").await.unwrap().records.len(), 10);
        let w = s.watch(4).unwrap();
        let revs: Vec<_> = w.backlog.iter().map(|e| e.rev).collect();
        assert_eq!(revs, vec![5, 6, 7, 8, 9, 10]);
        let next = s.write(Op::Create { key: "/k/x".into(), value: json!({}) }).await.unwrap();
        assert_eq!(next.mod_rev, 11);
    }

    #[tokio::test]
    async fn a_wait_for_a_revision_ends_when_a_write_reaches_it() {
        let dir = tempfile::tempdir().unwrap();
        let s = Arc::new(open(dir.path(), 100));
        s.write(Op::Create { key: "/k/0".into(), value: json!({}) }).await.unwrap();
        assert!(s.wait_for(1, std::time::Duration::ZERO).await);
        // not reached: the wait ends at its deadline, false
        assert!(!s.wait_for(2, std::time::Duration::from_millis(20)).await);
        let waiter = tokio::spawn({
            let s = s.clone();
            async move { s.wait_for(3, std::time::Duration::from_secs(600)).await }
        });
        tokio::task::yield_now().await;
        for i in 1..3 {
            s.write(Op::Create { key: format!("/k/{i}"), value: json!({}) }).await.unwrap();
        }
        assert!(waiter.await.unwrap());
        assert_eq!(s.revision(), 3);
    }

    #[tokio::test]
    async fn watch_from_compacted_revision_fails() {
        let dir = tempfile::tempdir().unwrap();
        let s = open(dir.path(), 3);
        for i in 0..6 {
            s.write(Op::Create { key: format!("/k/{i}"), value: json!({}) }).await.unwrap();
        }
        // History keeps revisions 4..=6: a watch may start after 3 but not after 2.
        assert_eq!(s.watch(3).unwrap().backlog.len(), 3);
        assert!(matches!(s.watch(2), Err(StoreError::Compacted { requested: 2, oldest: 3 })));
        assert_eq!(s.watch(6).unwrap().backlog.len(), 0);
    }

    #[tokio::test]
    async fn concurrent_writes_get_unique_ordered_revisions() {
        let dir = tempfile::tempdir().unwrap();
        let s = Arc::new(open(dir.path(), 1000));
        let mut w = s.watch(0).unwrap();
        let mut tasks = Vec::new();
        for i in 0..200 {
            let s = s.clone();
            tasks.push(tokio::spawn(async move {
                s.write(Op::Create { key: format!("/c/{i}"), value: json!({}) }).await.unwrap().mod_rev
            }));
        }
        let mut revs = Vec::new();
        for t in tasks {
            revs.push(t.await.unwrap());
        }
        revs.sort();
        assert_eq!(revs, (1..=200).collect::<Vec<_>>());
        for expected in 1..=200 {
            assert_eq!(w.live.recv().await.unwrap().rev, expected);
        }
    }
}
