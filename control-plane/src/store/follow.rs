//! A view kept in memory and current from a store, as upstream's authorizers are kept current
//! from informers: a list of the view's key prefixes, then every store event in revision order
//! (a relist when the watch falls behind or its revision was compacted). The revision the view
//! has applied is published, so a request that was refused can wait for the view to reach the
//! revision its request saw (a binding or a pod's node written just before).
//!
//! A view is read without awaiting: the authorizer decides synchronously, and a store read
//! there would have to block a runtime thread on a future that may wait for the store's own
//! watch (the etcd store's reads wait for an acknowledged write to reach its cache).

use std::sync::{Arc, RwLock, RwLockReadGuard};
use std::time::Duration;

use tokio::sync::broadcast::error::RecvError;

use super::{Event, EventKind, Record, Revision, Store, StoreError, Watch};

/// What a [`Followed`] keeps: built from the records under its prefixes, changed by each event.
pub trait View: Default + Send + Sync + 'static {
    /// The store key prefixes the view is made of.
    const PREFIXES: &'static [&'static str];
    /// Its name in logs.
    const NAME: &'static str;
    /// The object at `key` is now `record` (None: deleted).
    fn apply(&mut self, key: &str, record: Option<&Record>);
}

/// A [`View`] kept current from a store.
pub struct Followed<V> {
    view: RwLock<V>,
    applied: tokio::sync::watch::Sender<Revision>,
}

impl<V: View> Followed<V> {
    /// A view that follows nothing (tests, benchmarks).
    pub fn fixed(view: V) -> Followed<V> {
        Followed { view: RwLock::new(view), applied: tokio::sync::watch::Sender::new(0) }
    }

    /// Lists the prefixes into a fresh view, then follows the store in the background.
    pub async fn start(store: Arc<dyn Store>) -> Result<Arc<Followed<V>>, StoreError> {
        let followed = Arc::new(Followed::fixed(V::default()));
        let (mut watch, mut listed) = followed.relist(store.as_ref()).await?;
        let f = followed.clone();
        tokio::spawn(async move {
            loop {
                let err = f.follow(&mut watch, &listed).await;
                tracing::info!(view = V::NAME, reason = %err, "relisting a view of the store");
                // a store that is closing or unreachable: try again shortly
                loop {
                    match f.relist(store.as_ref()).await {
                        Ok((w, l)) => {
                            watch = w;
                            listed = l;
                            break;
                        }
                        Err(StoreError::Closed) => return,
                        Err(e) => {
                            tracing::warn!(view = V::NAME, error = %e, "relisting a view of the store failed; again in 1s");
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                    }
                }
            }
        });
        Ok(followed)
    }

    /// Lists every prefix, swaps in the view built from them and opens a watch from the
    /// oldest listing's revision; returns the watch and each prefix's listing revision (events
    /// of a prefix at or before its listing are already in the view).
    async fn relist(&self, store: &dyn Store) -> Result<(Watch, Vec<Revision>), StoreError> {
        loop {
            let mut view = V::default();
            let mut revs = Vec::with_capacity(V::PREFIXES.len());
            for prefix in V::PREFIXES {
                let listing = store.list(prefix).await?;
                revs.push(listing.revision);
                for r in &listing.records {
                    view.apply(&r.key, Some(r));
                }
            }
            let from = revs.iter().copied().min().unwrap_or(0);
            match store.watch(from) {
                Ok(w) => {
                    *self.view.write().unwrap_or_else(|p| p.into_inner()) = view;
                    self.applied.send_replace(from);
                    return Ok((w, revs));
                }
                // written and compacted between the listings and the watch: list again
                Err(StoreError::Compacted { .. }) => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Applies events until the watch ends; returns why it ended.
    async fn follow(&self, watch: &mut Watch, listed: &[Revision]) -> String {
        let backlog = std::mem::take(&mut watch.backlog);
        for ev in backlog {
            self.event(&ev, listed);
        }
        loop {
            match watch.recv().await {
                Ok(ev) => self.event(&ev, listed),
                Err(RecvError::Lagged(n)) => return format!("the watch fell {n} events behind"),
                Err(RecvError::Closed) => return "the store's watch ended".to_string(),
            }
        }
    }

    fn event(&self, ev: &Event, listed: &[Revision]) {
        if let Some(i) = V::PREFIXES.iter().position(|p| ev.record.key.starts_with(p)) {
            if ev.rev > listed[i] {
                let record = match ev.kind {
                    EventKind::Deleted => None,
                    EventKind::Added | EventKind::Modified => Some(&ev.record),
                };
                self.view.write().unwrap_or_else(|p| p.into_inner()).apply(&ev.record.key, record);
            }
        }
        self.applied.send_if_modified(|r| {
            let newer = ev.rev > *r;
            if newer {
                *r = ev.rev;
            }
            newer
        });
    }

    /// The view, for one decision.
    pub fn read(&self) -> RwLockReadGuard<'_, V> {
        self.view.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The store revision the view reflects.
    pub fn applied(&self) -> Revision {
        *self.applied.borrow()
    }

    /// Waits (at most `within`) until the view reflects revision `rev`; whether it does.
    pub async fn caught_up(&self, rev: Revision, within: Duration) -> bool {
        let mut rx = self.applied.subscribe();
        let reached = matches!(tokio::time::timeout(within, rx.wait_for(|r| *r >= rev)).await, Ok(Ok(_)));
        reached
    }
}
