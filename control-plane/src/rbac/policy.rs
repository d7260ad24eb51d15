//! The live policy: the [`PolicyIndex`] kept current from the store ([`Followed`]), as
//! upstream's RBAC authorizer is kept current from informers: a list of the four kinds, then
//! every store event in revision order. A request that was refused can wait for the index to
//! reach the revision its request saw (a binding created just before).

use serde_json::Value;

use super::index::{rules_of, Binding, PolicyIndex};
use crate::store::follow::{Followed, View};
use crate::store::Record;

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
pub type Policy = Followed<PolicyIndex>;

impl View for PolicyIndex {
    const PREFIXES: &'static [&'static str] = &PREFIXES;
    const NAME: &'static str = "rbac";

    fn apply(&mut self, key: &str, record: Option<&Record>) {
        match record {
            None => apply(self, key, None),
            Some(r) => {
                if let Some(v) = record_json(r) {
                    apply(self, key, Some(&v));
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::auth::User;
    use crate::store::{EmbeddedStore, EmbeddedStoreOptions, Op, Store};
    use std::sync::Arc;
    use std::time::Duration;
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
