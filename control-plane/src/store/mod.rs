//! The storage seam of the API server.
//!
//! The [`Store`] trait follows etcd v3's model so that an etcd backend fits it later: one global
//! revision counter, every object carries the revision that created it and the one that last
//! modified it (`resourceVersion` = mod revision), writes are single-key transactions guarded by
//! the expected mod revision, and watches start from a revision, failing with
//! [`StoreError::Compacted`] when that revision is older than the history kept.
//!
//! Values go in as JSON objects; the store stamps `metadata.resourceVersion` with the revision of
//! the write before the value is kept, so reads hand out the exact bytes clients receive. The
//! etcd backend stores values without `resourceVersion` and stamps it when it builds its records
//! (as upstream's etcd3 storage does on read), so both serve the same bytes for the same writes.

mod cache;
mod embedded;
pub mod etcd;
pub mod follow;

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use tokio::sync::broadcast;

pub use embedded::{EmbeddedStore, EmbeddedStoreOptions};
pub use etcd::{EtcdOptions, EtcdStore, KeyLayout};

/// A revision of the store; `resourceVersion` on the wire.
pub type Revision = i64;

/// What list filtering and watch filtering look at, computed once per write by an [`Indexer`].
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Attrs {
    pub labels: BTreeMap<String, String>,
    /// Field-selector fields and their values (e.g. `spec.nodeName`).
    pub fields: Vec<(&'static str, String)>,
    /// For a pod, the objects it uses by name in its namespace, as `(resource, name)`
    /// (`auth::pod_uses`): the node authorizer's edges, read without parsing the pod.
    pub refs: Vec<(&'static str, String)>,
}

impl Attrs {
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Computes the [`Attrs`] of an object stored under a key.
pub type Indexer = Arc<dyn Fn(&str, &serde_json::Value) -> Attrs + Send + Sync>;

/// One stored object.
#[derive(Debug, Clone)]
pub struct Record {
    pub key: Arc<str>,
    pub create_rev: Revision,
    pub mod_rev: Revision,
    /// The object as JSON, `metadata.resourceVersion` already set to `mod_rev`.
    pub value: Bytes,
    pub attrs: Arc<Attrs>,
}

impl Record {
    pub fn json(&self) -> Result<serde_json::Value, StoreError> {
        serde_json::from_slice(&self.value).map_err(|e| StoreError::Corrupt(e.to_string()))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Added,
    Modified,
    Deleted,
}

/// A change, in revision order. For `Deleted` the record is the last state of the object with
/// `resourceVersion` set to the revision of the deletion.
#[derive(Debug, Clone)]
pub struct Event {
    pub kind: EventKind,
    pub rev: Revision,
    pub record: Record,
    /// The state before a modification or deletion (needed to tell a watcher with a selector
    /// that an object stopped matching).
    pub prev: Option<Record>,
}

/// A single-key write.
#[derive(Debug, Clone)]
pub enum Op {
    /// Fails with [`StoreError::AlreadyExists`] when the key exists.
    Create { key: String, value: serde_json::Value },
    /// Fails with [`StoreError::NotFound`] or, when `expect` is given and differs from the
    /// current mod revision, [`StoreError::Conflict`].
    Update { key: String, value: serde_json::Value, expect: Option<Revision> },
    /// Same preconditions as `Update`.
    Delete { key: String, expect: Option<Revision> },
}

impl Op {
    pub fn key(&self) -> &str {
        match self {
            Op::Create { key, .. } | Op::Update { key, .. } | Op::Delete { key, .. } => key,
        }
    }
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("key already exists")]
    AlreadyExists,
    #[error("key not found")]
    NotFound,
    #[error("precondition failed: current revision is {current}")]
    Conflict { current: Revision },
    #[error("revision {requested} has been compacted; oldest available is {oldest}")]
    Compacted { requested: Revision, oldest: Revision },
    #[error("the store is closed")]
    Closed,
    #[error("storage i/o error: {0}")]
    Io(String),
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    #[error("invalid value: {0}")]
    InvalidValue(String),
}

/// A consistent listing.
#[derive(Debug, Clone)]
pub struct Listing {
    pub records: Vec<Record>,
    /// The store revision the listing reflects.
    pub revision: Revision,
}

/// A watch: the backlog of events after the requested revision that had already happened when
/// the watch started, then the live feed ([`Watch::recv`]). Events of every key arrive; callers
/// filter by prefix.
pub struct Watch {
    pub backlog: Vec<Arc<Event>>,
    pub live: broadcast::Receiver<Arc<Event>>,
    /// The revision the watch is from: live events at or before it are skipped. A store whose
    /// cache lags its writes (etcd: a write is acknowledged with etcd's answer, its event
    /// applied a moment later) can be asked for a watch from a revision its cache has not
    /// reached yet; the events up to it then come through the live feed.
    pub after: Revision,
}

impl Watch {
    /// The next live event after [`Watch::after`].
    pub async fn recv(&mut self) -> Result<Arc<Event>, broadcast::error::RecvError> {
        loop {
            let ev = self.live.recv().await?;
            if ev.rev > self.after {
                return Ok(ev);
            }
        }
    }

    /// The next live event after [`Watch::after`] already queued, without waiting.
    pub fn try_recv(&mut self) -> Result<Arc<Event>, broadcast::error::TryRecvError> {
        loop {
            let ev = self.live.try_recv()?;
            if ev.rev > self.after {
                return Ok(ev);
            }
        }
    }
}

pub trait Store: Send + Sync + 'static {
    /// The latest committed revision.
    fn revision(&self) -> Revision;
    /// The latest revision this server acknowledged to a writer: at least [`Store::revision`];
    /// ahead of it while a write acknowledged by the store is not yet readable from it (reads
    /// through this store wait for it, other observers — the RBAC index — may wait for it).
    fn acknowledged(&self) -> Revision {
        self.revision()
    }
    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Record>, StoreError>>;
    /// Every record whose key starts with `prefix`, in key order.
    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Listing, StoreError>>;
    /// Applies one write once it is durable; returns the new record (for deletes, the deleted
    /// object stamped with the deletion revision).
    fn write(&self, op: Op) -> BoxFuture<'_, Result<Record, StoreError>>;
    /// Events with a revision greater than `after`.
    fn watch(&self, after: Revision) -> Result<Watch, StoreError>;
    /// The oldest revision a watch can start after.
    fn oldest_watchable(&self) -> Revision;
    /// [`Store::get`] of the most recent state: it reflects every write acknowledged anywhere
    /// before the call (upstream's consistent read; a get without `resourceVersion`). A store
    /// that is the only writer of its data (the embedded one) reads its own state.
    fn get_latest<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Record>, StoreError>> {
        self.get(key)
    }
    /// [`Store::list`] of the most recent state (a list without `resourceVersion`).
    fn list_latest<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Listing, StoreError>> {
        self.list(prefix)
    }
    /// [`Store::list`] as it was at revision `rev`: the rest of a paged list whose snapshot
    /// this server does not hold (its first page came from another API server; upstream reads
    /// a continued list from etcd at the list's revision). `Compacted` when the store no longer
    /// has that revision; a store without history of its own (the embedded one) has only the
    /// API's snapshots.
    fn list_at<'a>(&'a self, prefix: &'a str, rev: Revision) -> BoxFuture<'a, Result<Listing, StoreError>> {
        let _ = prefix;
        Box::pin(async move { Err(StoreError::Compacted { requested: rev, oldest: self.oldest_watchable() }) })
    }
    /// Waits until [`Store::revision`] is at least `rev`, or `within` passes; true when it is.
    /// Woken by the store's own progress (a read with a resourceVersion ahead of this server,
    /// as upstream's watch cache waits for it), not by polling. The default follows the
    /// store's events; a store whose revision also moves without an event (etcd's progress
    /// notifications) overrides it.
    fn wait_for(&self, rev: Revision, within: std::time::Duration) -> BoxFuture<'_, bool> {
        Box::pin(async move {
            if self.revision() >= rev {
                return true;
            }
            let Ok(mut watch) = self.watch(self.revision()) else { return self.revision() >= rev };
            let reached = async {
                while self.revision() < rev {
                    match watch.recv().await {
                        Ok(ev) if ev.rev >= rev => break,
                        Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                        Err(broadcast::error::RecvError::Closed) => break,
                    }
                }
            };
            let _ = tokio::time::timeout(within, reached).await;
            self.revision() >= rev
        })
    }
}

/// Sets `metadata.resourceVersion` of an object to `rev` and returns its JSON bytes (keys in
/// sorted order, so the same object gives the same bytes whichever backend stamps it).
pub(crate) fn stamp(value: &mut serde_json::Value, rev: Revision) -> Result<Bytes, StoreError> {
    let meta = value
        .as_object_mut()
        .ok_or_else(|| StoreError::InvalidValue("not a JSON object".into()))?
        .entry("metadata")
        .or_insert_with(|| serde_json::json!({}));
    let meta = meta
        .as_object_mut()
        .ok_or_else(|| StoreError::InvalidValue("metadata is not an object".into()))?;
    meta.insert("resourceVersion".into(), serde_json::Value::String(rev.to_string()));
    serde_json::to_vec(value).map(Bytes::from).map_err(|e| StoreError::InvalidValue(e.to_string()))
}
