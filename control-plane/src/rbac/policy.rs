//! The live policy: the [`PolicyIndex`] kept current from the store, as upstream's RBAC
//! authorizer is kept current from informers. A list of the four kinds, then every store event
//! in revision order (a relist when the watch falls behind or its revision was compacted).
//! The revision the index has applied is published, so a request that was refused can wait
//! for the index to reach the revision its request saw (a binding created just before).

use std::sync::{Arc, RwLock, RwLockReadGuard};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::broadcast::error::RecvError;

use super::index::{rules_of, Binding, PolicyIndex};
use crate::store::{Event, EventKind, Record, Revision, Store, StoreError};

/// The store key prefixes of the four kinds (resources.rs: `/<group>/<plural>/`).
const CLUSTER_ROLES: &str = "/rbac.authorization.k8s.io/clusterroles/";
const ROLES: &str = "/rbac.authorization.k8s.io/roles/";
const CLUSTER_ROLE_BINDINGS: &str = "/rbac.authorization.k8s.io/clusterrolebindings/";
const ROLE_BINDINGS: &str = "/rbac.authorization.k8s.io/rolebindings/";
const PREFIXES: [&str; 4] = [CLUSTER_ROLES, ROLES, CLUSTER_ROLE_BINDINGS, ROLE_BINDINGS];

/// One change to the index, from a stored object (None: deleted).
fn apply(ix: &mut PolicyIndex, key: &str, obj: Option<&Value>) {
    let Some(prefix) = PREFIXES.iter().find(|p| key.starts_with(**p)) else { return };
    let rest = &key[prefix.len()..];
    let (ns, name) = match *prefix {
        ROLES | ROLE_BINDINGS => rest.split_once('/').unwrap_or(("", rest)),
        _ => ("", rest),
    };
    match (*prefix, obj) {
        (CLUSTER_ROLES, Some(o)) => ix.set_cluster_role(name, rules_of(o)),
        (CLUSTER_ROLES, None) => ix.remove_cluster_role(name),
        (ROLES, Some(o)) => ix.set_role(ns, name, rules_of(o)),
        (ROLES, None) => ix.remove_role(ns, name),
        (_, Some(o)) => {
            let mut b = Binding::from_json(o);
            // the key is the truth for where a binding lives
            b.namespace = ns.to_string();
            b.name = name.to_string();
            ix.set_binding(b);
        }
        (_, None) => ix.remove_binding(ns, name),
    }
}

fn record_json(r: &Record) -> Option<Value> {
    match r.json() {
        Ok(v) => Some(v),
        Err(e) => {
            tracing::warn!(key = %r.key, error = %e, "rbac: a stored object is not JSON; left out of the policy");
            None
        }
    }
}

/// The policy the authorizer reads, kept current from a store.
pub struct Policy {
    index: RwLock<PolicyIndex>,
    applied: tokio::sync::watch::Sender<Revision>,
}

impl Policy {
    /// A fixed policy (tests, benchmarks).
    pub fn fixed(index: PolicyIndex) -> Policy {
        Policy { index: RwLock::new(index), applied: tokio::sync::watch::Sender::new(0) }
    }

    /// Lists the four kinds into a fresh index, then follows the store in the background.
    pub async fn start(store: Arc<dyn Store>) -> Result<Arc<Policy>, StoreError> {
        let policy = Arc::new(Policy::fixed(PolicyIndex::default()));
        let (mut watch, mut listed) = policy.relist(store.as_ref()).await?;
        let p = policy.clone();
        tokio::spawn(async move {
            loop {
                let err = p.follow(&mut watch, &listed).await;
                tracing::info!(reason = %err, "rbac: relisting the policy");
                // a store that is closing or unreachable: try again shortly
                loop {
                    match p.relist(store.as_ref()).await {
                        Ok((w, l)) => {
                            watch = w;
                            listed = l;
                            break;
                        }
                        Err(StoreError::Closed) => return,
                        Err(e) => {
                            tracing::warn!(error = %e, "rbac: relisting the policy failed; again in 1s");
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                    }
                }
            }
        });
        Ok(policy)
    }

    /// Lists every prefix, swaps in the index built from them and opens a watch from the
    /// oldest listing's revision; returns the watch and each prefix's listing revision (events
    /// of a prefix at or before its listing are already in the index).
    async fn relist(&self, store: &dyn Store) -> Result<(crate::store::Watch, [Revision; 4]), StoreError> {
        loop {
            let mut ix = PolicyIndex::default();
            let mut revs = [0; 4];
            for (i, prefix) in PREFIXES.iter().enumerate() {
                let listing = store.list(prefix).await?;
                revs[i] = listing.revision;
                for r in &listing.records {
                    if let Some(v) = record_json(r) {
                        apply(&mut ix, &r.key, Some(&v));
                    }
                }
            }
            let from = revs.iter().copied().min().unwrap_or(0);
            match store.watch(from) {
                Ok(w) => {
                    *self.index.write().unwrap_or_else(|p| p.into_inner()) = ix;
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
    async fn follow(&self, watch: &mut crate::store::Watch, listed: &[Revision; 4]) -> String {
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

    fn event(&self, ev: &Event, listed: &[Revision; 4]) {
        if let Some(i) = PREFIXES.iter().position(|p| ev.record.key.starts_with(p)) {
            if ev.rev > listed[i] {
                let obj = match ev.kind {
                    EventKind::Deleted => None,
                    EventKind::Added | EventKind::Modified => record_json(&ev.record),
                };
                if obj.is_some() || ev.kind == EventKind::Deleted {
                    let mut ix = self.index.write().unwrap_or_else(|p| p.into_inner());
                    apply(&mut ix, &ev.record.key, obj.as_ref());
                }
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

    /// The index, for one decision.
    pub fn read(&self) -> RwLockReadGuard<'_, PolicyIndex> {
        self.index.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The store revision the index reflects.
    pub fn applied(&self) -> Revision {
        *self.applied.borrow()
    }

    /// Waits (at most `within`) until the index reflects revision `rev`; whether it does.
    pub async fn caught_up(&self, rev: Revision, within: Duration) -> bool {
        let mut rx = self.applied.subscribe();
        let reached = matches!(tokio::time::timeout(within, rx.wait_for(|r| *r >= rev)).await, Ok(Ok(_)));
        reached
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::auth::User;
    use crate::store::{EmbeddedStore, EmbeddedStoreOptions, Op};
    use serde_json::json;

    fn bob() -> User {
        User { name: "bob".into(), groups: vec!["system:authenticated".into()] }
    }

    fn can_list_pods(p: &Policy, ns: &str) -> bool {
        let (rules, _) = p.read().rules_for(&bob(), ns);
        rules.iter().any(|r| r.allows_resource("list", "", "pods", "", ""))
    }

    #[tokio::test]
    async fn the_index_follows_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> =
            Arc::new(EmbeddedStore::open(&dir.path().join("s.redb"), crate::strategy::indexer(), EmbeddedStoreOptions::default()).unwrap());
        let role = json!({"metadata": {"name": "view"}, "rules": [{"verbs": ["list"], "apiGroups": [""], "resources": ["pods"]}]});
        store.write(Op::Create { key: format!("{CLUSTER_ROLES}view"), value: role }).await.unwrap();
        let p = Policy::start(store.clone()).await.unwrap();
        assert!(!can_list_pods(&p, "team"));
        let rb = json!({"metadata": {"name": "b", "namespace": "team"}, "roleRef": {"kind": "ClusterRole", "name": "view"},
            "subjects": [{"kind": "User", "name": "bob"}]});
        let r = store.write(Op::Create { key: format!("{ROLE_BINDINGS}team/b"), value: rb }).await.unwrap();
        assert!(p.caught_up(r.mod_rev, Duration::from_secs(10)).await);
        assert!(can_list_pods(&p, "team"));
        assert!(!can_list_pods(&p, "other"));
        let r = store.write(Op::Delete { key: format!("{CLUSTER_ROLES}view"), expect: None }).await.unwrap();
        assert!(p.caught_up(r.mod_rev, Duration::from_secs(10)).await);
        assert!(!can_list_pods(&p, "team"));
        let (_, errors) = p.read().rules_for(&bob(), "team");
        assert_eq!(errors, ["clusterrole.rbac.authorization.k8s.io \"view\" not found"]);
        let r = store.write(Op::Delete { key: format!("{ROLE_BINDINGS}team/b"), expect: None }).await.unwrap();
        assert!(p.caught_up(r.mod_rev, Duration::from_secs(10)).await);
        assert_eq!(p.read().bindings(), 0);
        // other keys move the revision too
        let r = store.write(Op::Create { key: "/core/configmaps/team/x".into(), value: json!({}) }).await.unwrap();
        assert!(p.caught_up(r.mod_rev, Duration::from_secs(10)).await);
        assert!(!p.caught_up(r.mod_rev + 1, Duration::from_millis(10)).await);
    }
}
