//! The watch cache of a remote store: every object in memory, fed by one ordered stream of
//! changes (the etcd watch), serving gets, lists and watches without asking the remote store.
//!
//! The cache only applies changes; where they come from is the feeder's business
//! (`etcd.rs`). That keeps it testable without etcd: feed it changes, look at what it serves.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use tokio::sync::{broadcast, watch};

use super::{stamp, Event, EventKind, Indexer, Listing, Record, Revision, StoreError, Watch};

/// One change of the remote store, in revision order.
#[derive(Debug, Clone)]
pub enum Change {
    /// A key was written: its value as stored (JSON, without `resourceVersion`).
    Put { key: Arc<str>, create_rev: Revision, mod_rev: Revision, value: Bytes },
    Delete { key: Arc<str>, rev: Revision },
}

impl Change {
    pub fn rev(&self) -> Revision {
        match self {
            Change::Put { mod_rev, .. } => *mod_rev,
            Change::Delete { rev, .. } => *rev,
        }
    }
}

struct State {
    objects: BTreeMap<Arc<str>, Record>,
    revision: Revision,
    history: VecDeque<Arc<Event>>,
    /// Watches may start after this revision and no earlier.
    oldest_watchable: Revision,
    /// Replaced on every reset, which ends the watches of the old generation.
    events: broadcast::Sender<Arc<Event>>,
}

pub struct Cache {
    state: RwLock<State>,
    indexer: Indexer,
    history: usize,
    /// The revision the cache has reached, for writers waiting to see their own write.
    progress: watch::Sender<Revision>,
    /// The values this process is writing, by key, serialized once: the watch event of a
    /// key whose stored bytes are those of the value expected for it is applied with the
    /// prepared record (same bytes, same record) instead of parsing the value again.
    expected: std::sync::Mutex<std::collections::HashMap<Arc<str>, Arc<Prepared>>>,
}

/// More values expected at once than this means something forgot to withdraw: start over
/// (only costs parses).
const EXPECTED_MAX: usize = 65_536;

/// A value about to be written, serialized once: the bytes to store (without
/// `metadata.resourceVersion`), its attributes, and where `"resourceVersion":"<rev>"` goes
/// in the bytes clients receive, so the record of any revision is one copy with the
/// revision spliced in, byte for byte what [`stamp`] makes of the value.
#[derive(Debug)]
pub struct Prepared {
    stored: Bytes,
    at: usize,
    /// A comma before the resourceVersion (a metadata field sorts before it), or after it
    /// (none sorts before it and some after).
    comma_before: bool,
    comma_after: bool,
    attrs: Arc<super::Attrs>,
}

fn write_json<T: serde::Serialize + ?Sized>(out: &mut Vec<u8>, v: &T) -> Result<(), StoreError> {
    serde_json::to_writer(out, v).map_err(|e| StoreError::InvalidValue(e.to_string()))
}

impl Prepared {
    /// Serializes `value` as [`stamp`] would (fields in serde_json's sorted order), leaving
    /// out any `metadata.resourceVersion` it carries.
    pub fn new(key: &str, mut value: serde_json::Value, indexer: &Indexer) -> Result<Prepared, StoreError> {
        let obj = value.as_object_mut().ok_or_else(|| StoreError::InvalidValue("not a JSON object".into()))?;
        obj.entry("metadata")
            .or_insert_with(|| serde_json::json!({}))
            .as_object_mut()
            .ok_or_else(|| StoreError::InvalidValue("metadata is not an object".into()))?
            .remove("resourceVersion");
        let attrs = Arc::new(indexer(key, &value));
        let serde_json::Value::Object(obj) = &value else {
            return Err(StoreError::InvalidValue("not a JSON object".into()));
        };
        let mut out = Vec::with_capacity(2048);
        let (mut at, mut comma_before, mut comma_after) = (0, false, false);
        out.push(b'{');
        for (i, (k, v)) in obj.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_json(&mut out, k)?;
            out.push(b':');
            match (k.as_str(), v) {
                ("metadata", serde_json::Value::Object(meta)) => {
                    out.push(b'{');
                    let mut placed = false;
                    for (j, (mk, mv)) in meta.iter().enumerate() {
                        if !placed && mk.as_str() > "resourceVersion" {
                            (at, comma_before, comma_after, placed) = (out.len(), j > 0, j == 0, true);
                        }
                        if j > 0 {
                            out.push(b',');
                        }
                        write_json(&mut out, mk)?;
                        out.push(b':');
                        write_json(&mut out, mv)?;
                    }
                    if !placed {
                        (at, comma_before, comma_after) = (out.len(), !meta.is_empty(), false);
                    }
                    out.push(b'}');
                }
                _ => write_json(&mut out, v)?,
            }
        }
        out.push(b'}');
        Ok(Prepared { stored: Bytes::from(out), at, comma_before, comma_after, attrs })
    }

    /// The bytes to store.
    pub fn stored(&self) -> &Bytes {
        &self.stored
    }

    /// The record of this value stored at `mod_rev`.
    pub fn record(&self, key: Arc<str>, create_rev: Revision, mod_rev: Revision) -> Record {
        let rv = format!("\"resourceVersion\":\"{mod_rev}\"");
        let mut out = Vec::with_capacity(self.stored.len() + rv.len() + 1);
        out.extend_from_slice(&self.stored[..self.at]);
        if self.comma_before {
            out.push(b',');
        }
        out.extend_from_slice(rv.as_bytes());
        if self.comma_after {
            out.push(b',');
        }
        out.extend_from_slice(&self.stored[self.at..]);
        Record { key, create_rev, mod_rev, value: Bytes::from(out), attrs: self.attrs.clone() }
    }
}

/// Builds the record of a stored value: parses it, computes its attributes and stamps
/// `metadata.resourceVersion` with `mod_rev` (the bytes clients receive).
pub fn record_from_stored(
    key: Arc<str>,
    create_rev: Revision,
    mod_rev: Revision,
    stored: &[u8],
    indexer: &Indexer,
) -> Result<Record, StoreError> {
    let mut value: serde_json::Value =
        serde_json::from_slice(stored).map_err(|e| StoreError::Corrupt(format!("{key}: {e}")))?;
    let attrs = Arc::new(indexer(&key, &value));
    let bytes = stamp(&mut value, mod_rev)?;
    Ok(Record { key, create_rev, mod_rev, value: bytes, attrs })
}

/// The same record as of a later revision (a deletion): only `resourceVersion` changes.
pub fn restamp(record: &Record, rev: Revision) -> Result<Record, StoreError> {
    let mut value = record.json()?;
    let bytes = stamp(&mut value, rev)?;
    Ok(Record {
        key: record.key.clone(),
        create_rev: record.create_rev,
        mod_rev: rev,
        value: bytes,
        attrs: record.attrs.clone(),
    })
}

impl Cache {
    pub fn new(indexer: Indexer, history: usize) -> Cache {
        let (events, _) = broadcast::channel(65_536);
        let (progress, _) = watch::channel(0);
        Cache {
            state: RwLock::new(State {
                objects: BTreeMap::new(),
                revision: 0,
                history: VecDeque::new(),
                oldest_watchable: 0,
                events,
            }),
            indexer,
            history: history.max(1),
            progress,
            expected: Default::default(),
        }
    }

    /// A write of `key` with `prepared` is about to be sent: its watch event is applied with
    /// the prepared record. One value per key (a later write of the key replaces it).
    pub fn expect(&self, key: Arc<str>, prepared: Arc<Prepared>) {
        let mut expected = self.expected.lock().unwrap_or_else(|p| p.into_inner());
        if expected.len() >= EXPECTED_MAX {
            expected.clear();
        }
        expected.insert(key, prepared);
    }

    /// The write with `prepared` failed (or may not have been applied): forget it, unless a
    /// later write of the key replaced it.
    pub fn withdraw(&self, key: &str, prepared: &Arc<Prepared>) {
        let mut expected = self.expected.lock().unwrap_or_else(|p| p.into_inner());
        if expected.get(key).is_some_and(|p| Arc::ptr_eq(p, prepared)) {
            expected.remove(key);
        }
    }

    /// The record of a put: the prepared one when the stored bytes are those expected for
    /// the key, else parsed. Any put of the key ends what was expected for it.
    fn record_of_put(&self, key: Arc<str>, create_rev: Revision, mod_rev: Revision, value: &[u8]) -> Result<Record, StoreError> {
        let expected = self.expected.lock().unwrap_or_else(|p| p.into_inner()).remove(&key);
        match expected {
            Some(p) if p.stored[..] == value[..] => Ok(p.record(key, create_rev, mod_rev)),
            _ => record_from_stored(key, create_rev, mod_rev, value, &self.indexer),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        // A panic while applying leaves a consistent map (each change is applied whole); keep
        // serving it.
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|p| p.into_inner())
    }

    pub fn indexer(&self) -> &Indexer {
        &self.indexer
    }

    /// Replaces the whole content with a listing at `revision` (start-up and relist). The
    /// history is dropped, so watches can start at `revision` and no earlier, and every watch
    /// of the previous content ends (its clients resume from their last revision, or get 410
    /// and relist), as upstream's watch cache does when it reinitialises.
    pub fn reset(&self, records: Vec<Record>, revision: Revision) {
        let (events, _) = broadcast::channel(65_536);
        let mut state = self.write();
        state.objects = records.into_iter().map(|r| (r.key.clone(), r)).collect();
        state.revision = revision;
        state.history.clear();
        state.oldest_watchable = revision;
        // Dropping the old sender closes the receivers of the old generation.
        state.events = events;
        drop(state);
        // writes in flight may be in the listing: their events may never come
        self.expected.lock().unwrap_or_else(|p| p.into_inner()).clear();
        self.progress.send_replace(revision);
    }

    /// Applies changes in revision order; changes at or below the cache's revision are
    /// skipped (a resumed watch may repeat a revision). A value that is not a JSON object is
    /// logged and skipped: keys ferro did not write never break the cache.
    pub fn apply(&self, changes: Vec<Change>) {
        if changes.is_empty() {
            return;
        }
        // Records are built before the lock is taken (parsing is most of the work): readers
        // and the writers waiting for their write are not held up by it.
        let applied = self.revision();
        let prepared: Vec<(Change, Option<Result<Record, StoreError>>)> = changes
            .into_iter()
            .map(|change| match &change {
                Change::Put { key, create_rev, mod_rev, value } if *mod_rev > applied => {
                    let built = self.record_of_put(key.clone(), *create_rev, *mod_rev, value);
                    (change, Some(built))
                }
                _ => (change, None),
            })
            .collect();
        let mut state = self.write();
        let mut reached = state.revision;
        for (change, built) in prepared {
            let rev = change.rev();
            if rev <= state.revision {
                continue;
            }
            let event = match change {
                Change::Put { key, create_rev, mod_rev, value } => {
                    let built = built.unwrap_or_else(|| record_from_stored(key.clone(), create_rev, mod_rev, &value, &self.indexer));
                    match built {
                        Ok(record) => {
                            let prev = state.objects.insert(key, record.clone());
                            let kind = if prev.is_some() { EventKind::Modified } else { EventKind::Added };
                            Some(Event { kind, rev, record, prev })
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "ignoring a stored value that is not a JSON object");
                            // The key no longer holds a usable object.
                            state.objects.remove(&key).and_then(|prev| deleted(prev, rev))
                        }
                    }
                }
                Change::Delete { key, rev } => state.objects.remove(&key).and_then(|prev| deleted(prev, rev)),
            };
            reached = rev;
            state.revision = rev;
            if let Some(event) = event {
                let event = Arc::new(event);
                state.history.push_back(event.clone());
                // Nobody listening is fine.
                let _ = state.events.send(event);
            }
        }
        while state.history.len() > self.history {
            if let Some(old) = state.history.pop_front() {
                state.oldest_watchable = old.rev;
            }
        }
        drop(state);
        self.progress.send_replace(reached);
    }

    /// Moves the revision forward without a change under the watched prefix (a progress
    /// notification: everything up to `rev` has been delivered).
    pub fn advance(&self, rev: Revision) {
        let mut state = self.write();
        if rev > state.revision {
            state.revision = rev;
            drop(state);
            self.progress.send_replace(rev);
        }
    }

    /// Waits until the cache has applied `rev` (or `timeout` passes); true when it has.
    pub async fn wait_for(&self, rev: Revision, timeout: std::time::Duration) -> bool {
        let mut rx = self.progress.subscribe();
        tokio::time::timeout(timeout, rx.wait_for(|r| *r >= rev)).await.map(|r| r.is_ok()).unwrap_or(false)
    }

    pub fn revision(&self) -> Revision {
        self.read().revision
    }

    pub fn oldest_watchable(&self) -> Revision {
        self.read().oldest_watchable
    }

    pub fn get(&self, key: &str) -> Option<Record> {
        self.read().objects.get(key).cloned()
    }

    pub fn list(&self, prefix: &str) -> Listing {
        let state = self.read();
        let records = state
            .objects
            .range::<str, _>((std::ops::Bound::Included(prefix), std::ops::Bound::Unbounded))
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(_, r)| r.clone())
            .collect();
        Listing { records, revision: state.revision }
    }

    pub fn watch(&self, after: Revision) -> Result<Watch, StoreError> {
        let state = self.read();
        if after < state.oldest_watchable {
            return Err(StoreError::Compacted { requested: after, oldest: state.oldest_watchable });
        }
        // Subscribing under the read lock: changes are published under the write lock, so
        // nothing falls between the backlog and the live feed.
        let live = state.events.subscribe();
        let start = state.history.partition_point(|e| e.rev <= after);
        let backlog = state.history.range(start..).cloned().collect();
        Ok(Watch { backlog, live, after })
    }
}

/// The event of a deletion at `rev` of the object last seen as `prev`.
fn deleted(prev: Record, rev: Revision) -> Option<Event> {
    match restamp(&prev, rev) {
        Ok(record) => Some(Event { kind: EventKind::Deleted, rev, record, prev: Some(prev) }),
        Err(e) => {
            tracing::warn!(key = %prev.key, error = %e, "cached object unreadable at its deletion");
            None
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn put(key: &str, create: Revision, rev: Revision, v: serde_json::Value) -> Change {
        Change::Put {
            key: Arc::from(key),
            create_rev: create,
            mod_rev: rev,
            value: Bytes::from(serde_json::to_vec(&v).unwrap()),
        }
    }

    #[test]
    fn a_prepared_value_is_byte_for_byte_what_a_parse_and_stamp_make() {
        let indexer = super::super::embedded::labels_only();
        let values = [
            json!({"metadata": {}}),
            json!({}),
            json!({"metadata": {"name": "a", "uid": "u"}, "spec": {"x": [1, 2.5, -3, null, true]}}),
            json!({"metadata": {"name": "a", "labels": {"k": "v"}, "resourceVersion": "7"}, "z": "é\"\n\u{1}"}),
            json!({"metadata": {"uid": "u", "selfLink": "s"}, "a\"b": {"metadata": {"name": "nested"}}}),
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"resourceVersion": "3"}}),
            json!({"metadata": {"annotations": {"a": "b"}, "resourceVersion": "3", "uid": "u", "zz": 1}, "status": {}}),
        ];
        for v in values {
            let p = Prepared::new("/k/a", v.clone(), &indexer).unwrap();
            // stored as serde_json writes the value without a resourceVersion
            let mut plain = v.clone();
            let meta = plain.as_object_mut().unwrap().entry("metadata").or_insert_with(|| json!({}));
            meta.as_object_mut().unwrap().remove("resourceVersion");
            assert_eq!(p.stored()[..], serde_json::to_vec(&plain).unwrap()[..], "{v}");
            // the record of any revision is the one parsing and stamping the stored bytes make
            for rev in [1, 42, 1_000_000_007] {
                let got = p.record(Arc::from("/k/a"), 1, rev);
                let want = record_from_stored(Arc::from("/k/a"), 1, rev, p.stored(), &indexer).unwrap();
                assert_eq!(String::from_utf8_lossy(&got.value), String::from_utf8_lossy(&want.value), "{v}");
                assert_eq!((got.create_rev, got.mod_rev, &got.attrs), (want.create_rev, want.mod_rev, &want.attrs));
            }
        }
        assert!(Prepared::new("/k/a", json!([1]), &indexer).is_err());
        assert!(Prepared::new("/k/a", json!({"metadata": 1}), &indexer).is_err());
    }

    #[test]
    fn an_expected_value_is_applied_without_a_parse_when_its_bytes_came() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let parses = Arc::new(AtomicUsize::new(0));
        let counted = parses.clone();
        let labels = super::super::embedded::labels_only();
        let indexer: Indexer = Arc::new(move |k, v| {
            counted.fetch_add(1, Ordering::Relaxed);
            labels(k, v)
        });
        let c = Cache::new(indexer.clone(), 100);
        c.reset(Vec::new(), 10);
        let value = json!({"metadata": {"name": "a", "labels": {"x": "1"}}});
        let p = Arc::new(Prepared::new("/k/a", value.clone(), &indexer).unwrap());
        assert_eq!(parses.load(Ordering::Relaxed), 1);
        c.expect(Arc::from("/k/a"), p.clone());
        c.apply(vec![put("/k/a", 11, 11, value.clone())]);
        assert_eq!(parses.load(Ordering::Relaxed), 1, "the prepared record, not a parse");
        let got = c.get("/k/a").unwrap();
        assert_eq!((got.mod_rev, got.json().unwrap()["metadata"]["resourceVersion"].clone()), (11, json!("11")));
        assert!(c.expected.lock().unwrap().is_empty(), "used once");
        // other bytes came for the key (another writer's): parsed, and the expectation ends
        c.expect(Arc::from("/k/a"), p.clone());
        c.apply(vec![put("/k/a", 11, 12, json!({"metadata": {"name": "a"}, "spec": 12}))]);
        assert_eq!(parses.load(Ordering::Relaxed), 2);
        assert_eq!(c.get("/k/a").unwrap().json().unwrap()["spec"], 12);
        assert!(c.expected.lock().unwrap().is_empty());
        // a failed write withdraws its own expectation, not a later writer's
        let later = Arc::new(Prepared::new("/k/a", value.clone(), &indexer).unwrap());
        c.expect(Arc::from("/k/a"), p.clone());
        c.expect(Arc::from("/k/a"), later.clone());
        c.withdraw("/k/a", &p);
        assert!(c.expected.lock().unwrap().contains_key("/k/a"));
        c.withdraw("/k/a", &later);
        assert!(c.expected.lock().unwrap().is_empty());
        // a relist ends every expectation
        c.expect(Arc::from("/k/b"), p);
        c.reset(Vec::new(), 20);
        assert!(c.expected.lock().unwrap().is_empty());
    }

    #[test]
    fn changes_become_events_with_stamped_values_and_previous_state() {
        let c = Cache::new(super::super::embedded::labels_only(), 100);
        c.reset(Vec::new(), 10);
        let mut w = c.watch(10).unwrap();
        c.apply(vec![
            put("/k/a", 11, 11, json!({"metadata": {"name": "a", "labels": {"x": "1"}}})),
            put("/k/a", 11, 12, json!({"metadata": {"name": "a"}, "spec": 2})),
            Change::Delete { key: Arc::from("/k/a"), rev: 13 },
            // a repeat of an applied revision (a resumed etcd watch) changes nothing
            Change::Delete { key: Arc::from("/k/a"), rev: 12 },
        ]);
        let kinds: Vec<_> = (0..3).map(|_| w.live.try_recv().unwrap()).map(|e| (e.kind, e.rev)).collect();
        assert_eq!(kinds, vec![(EventKind::Added, 11), (EventKind::Modified, 12), (EventKind::Deleted, 13)]);
        assert!(w.live.try_recv().is_err());
        let backlog = c.watch(10).unwrap().backlog;
        assert_eq!(backlog.len(), 3);
        assert_eq!(
            std::str::from_utf8(&backlog[0].record.value).unwrap(),
            r#"{"metadata":{"labels":{"x":"1"},"name":"a","resourceVersion":"11"}}"#
        );
        assert_eq!(backlog[0].record.attrs.labels.get("x").map(String::as_str), Some("1"));
        assert_eq!(backlog[1].prev.as_ref().unwrap().mod_rev, 11);
        // the deletion carries the last state, stamped with the deletion's revision
        assert_eq!(backlog[2].record.json().unwrap()["spec"], 2);
        assert_eq!(backlog[2].record.json().unwrap()["metadata"]["resourceVersion"], "13");
        assert_eq!(c.revision(), 13);
        assert!(c.get("/k/a").is_none());
    }

    #[test]
    fn a_watch_from_a_revision_the_cache_has_not_reached_skips_the_events_up_to_it() {
        // etcd acknowledged a write at 11 before the cache applied its event; a watch from 11
        // made meanwhile must not see that write (fresh-clone CI saw it once).
        let c = Cache::new(super::super::embedded::labels_only(), 100);
        c.reset(Vec::new(), 10);
        let mut w = c.watch(11).unwrap();
        assert!(w.backlog.is_empty());
        c.apply(vec![put("/k/a", 11, 11, json!({})), put("/k/b", 12, 12, json!({}))]);
        assert_eq!(w.try_recv().unwrap().record.key.as_ref(), "/k/b");
        assert!(w.try_recv().is_err());
        let mut w = c.watch(11).unwrap();
        c.apply(vec![put("/k/c", 13, 13, json!({}))]);
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        assert_eq!(rt.block_on(w.recv()).unwrap().record.key.as_ref(), "/k/c");
    }

    #[test]
    fn history_window_and_reset_end_old_watches() {
        let c = Cache::new(super::super::embedded::labels_only(), 2);
        c.reset(Vec::new(), 0);
        c.apply((1..=4).map(|i| put(&format!("/k/{i}"), i, i, json!({}))).collect());
        // history keeps revisions 3 and 4
        assert_eq!(c.watch(2).unwrap().backlog.len(), 2);
        assert!(matches!(c.watch(1), Err(StoreError::Compacted { requested: 1, oldest: 2 })));
        assert_eq!(c.list("/k/").records.len(), 4);
        let mut old = c.watch(4).unwrap();
        c.reset(vec![c.get("/k/1").unwrap()], 9);
        assert!(matches!(old.live.try_recv(), Err(broadcast::error::TryRecvError::Closed)));
        assert!(matches!(c.watch(4), Err(StoreError::Compacted { requested: 4, oldest: 9 })));
        let l = c.list("/k/");
        assert_eq!((l.records.len(), l.revision), (1, 9));
    }

    #[test]
    fn a_value_that_is_not_json_is_skipped_and_the_revision_moves_on() {
        let c = Cache::new(super::super::embedded::labels_only(), 10);
        c.reset(Vec::new(), 0);
        c.apply(vec![
            Change::Put { key: Arc::from("/k/x"), create_rev: 1, mod_rev: 1, value: Bytes::from_static(b"\x00garbage") },
            put("/k/y", 2, 2, json!({})),
        ]);
        assert!(c.get("/k/x").is_none());
        assert_eq!(c.revision(), 2);
        assert_eq!(c.watch(0).unwrap().backlog.len(), 1);
        c.advance(7);
        assert_eq!(c.revision(), 7);
    }

    #[tokio::test]
    async fn writers_wait_for_their_revision() {
        let c = Arc::new(Cache::new(super::super::embedded::labels_only(), 10));
        c.reset(Vec::new(), 0);
        assert!(!c.wait_for(1, std::time::Duration::from_millis(10)).await);
        let waiter = tokio::spawn({
            let c = c.clone();
            async move { c.wait_for(1, std::time::Duration::from_secs(10)).await }
        });
        c.apply(vec![put("/k/a", 1, 1, json!({}))]);
        assert!(waiter.await.unwrap());
    }
}
