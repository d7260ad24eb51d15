//! The node authorizer's graph, as upstream's: which node each pod is bound to, and which
//! Secrets, ConfigMaps and PersistentVolumeClaims the pods bound to a node use (edges counted
//! per node). Kept current from the store ([`Followed`]); a check is two hash lookups, not a
//! scan of the namespace's pods, and never awaits.

use std::collections::HashMap;
use std::sync::Arc;

use crate::auth::NodeGraph;
use crate::store::follow::{Followed, View};
use crate::store::Record;

/// The store key prefix of pods (resources.rs: `/core/pods/<namespace>/<name>`).
const PODS: &str = "/core/pods/";

/// What the graph keeps of one pod.
#[derive(Debug, Clone, PartialEq)]
struct PodEdges {
    node: String,
    uses: Vec<(&'static str, String)>,
}

/// (namespace, resource, name) of an object pods use.
type Used = (String, &'static str, String);

#[derive(Debug, Default)]
pub struct PodGraph {
    /// By pod key.
    pods: HashMap<Arc<str>, PodEdges>,
    /// For each used object, the nodes whose pods use it, with how many of their pods do.
    used_by: HashMap<Used, HashMap<String, usize>>,
}

/// The graph kept current from a store.
pub type NodeGraphView = Followed<PodGraph>;

fn namespace_of(key: &str) -> &str {
    key.strip_prefix(PODS).and_then(|rest| rest.split_once('/')).map(|(ns, _)| ns).unwrap_or("")
}

impl PodGraph {
    fn unlink(&mut self, key: &str, pod: &PodEdges) {
        if pod.node.is_empty() {
            return;
        }
        let ns = namespace_of(key);
        for (resource, name) in &pod.uses {
            let used = (ns.to_string(), *resource, name.clone());
            if let Some(nodes) = self.used_by.get_mut(&used) {
                if let Some(n) = nodes.get_mut(&pod.node) {
                    *n -= 1;
                    if *n == 0 {
                        nodes.remove(&pod.node);
                    }
                }
                if nodes.is_empty() {
                    self.used_by.remove(&used);
                }
            }
        }
    }

    fn link(&mut self, key: &str, pod: &PodEdges) {
        if pod.node.is_empty() {
            return;
        }
        let ns = namespace_of(key);
        for (resource, name) in &pod.uses {
            *self.used_by.entry((ns.to_string(), *resource, name.clone())).or_default().entry(pod.node.clone()).or_default() += 1;
        }
    }

    /// How many objects have edges (tests).
    #[cfg(test)]
    fn edges(&self) -> usize {
        self.used_by.values().map(HashMap::len).sum()
    }
}

impl View for PodGraph {
    const PREFIXES: &'static [&'static str] = &[PODS];
    const NAME: &'static str = "node graph";

    fn apply(&mut self, key: &str, record: Option<&Record>) {
        let new = record.map(|r| PodEdges {
            node: r.attrs.field("spec.nodeName").unwrap_or("").to_string(),
            uses: r.attrs.refs.clone(),
        });
        if let Some(old) = self.pods.get(key).cloned() {
            if Some(&old) == new.as_ref() {
                return;
            }
            self.unlink(key, &old);
        }
        match new {
            Some(pod) => {
                self.link(key, &pod);
                self.pods.insert(Arc::from(key), pod);
            }
            None => {
                self.pods.remove(key);
            }
        }
    }
}

impl NodeGraph for PodGraph {
    fn pod_node(&self, namespace: &str, name: &str) -> Option<String> {
        self.pods.get(format!("{PODS}{namespace}/{name}").as_str()).map(|p| p.node.clone())
    }

    fn node_references(&self, node: &str, namespace: &str, resource: &str, name: &str) -> bool {
        // the key's resource is one of pod_uses' three names
        let Some(resource) = ["secrets", "configmaps", "persistentvolumeclaims"].into_iter().find(|r| *r == resource) else {
            return false;
        };
        self.used_by
            .get(&(namespace.to_string(), resource, name.to_string()))
            .is_some_and(|nodes| nodes.contains_key(node))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::store::{EmbeddedStore, EmbeddedStoreOptions, Op, Store};
    use serde_json::{json, Value};
    use std::time::Duration;

    fn pod(node: &str, secret: &str, cm: &str) -> Value {
        json!({"metadata": {"name": "p", "namespace": "team"}, "spec": {
            "nodeName": node,
            "volumes": [{"name": "s", "secret": {"secretName": secret}}],
            "containers": [{"name": "c", "image": "i", "envFrom": [{"configMapRef": {"name": cm}}]}]}})
    }

    #[tokio::test]
    async fn the_graph_follows_pods_binding_changing_and_going() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> =
            Arc::new(EmbeddedStore::open(&dir.path().join("s.redb"), crate::strategy::indexer(), EmbeddedStoreOptions::default()).unwrap());
        // one pod bound before the graph starts (listed), one after (watched)
        store.write(Op::Create { key: format!("{PODS}team/a"), value: pod("n1", "s1", "c1") }).await.unwrap();
        let g = NodeGraphView::start(store.clone()).await.unwrap();
        let wait = |rev| {
            let g = g.clone();
            async move { assert!(g.caught_up(rev, Duration::from_secs(10)).await) }
        };
        assert!(g.read().node_references("n1", "team", "secrets", "s1"));
        assert!(g.read().node_references("n1", "team", "configmaps", "c1"));
        assert!(!g.read().node_references("n1", "team", "configmaps", "s1"), "a Secret's name is not a ConfigMap's");
        assert!(!g.read().node_references("n1", "other", "secrets", "s1"), "namespaced");
        assert!(!g.read().node_references("n2", "team", "secrets", "s1"));
        assert_eq!(g.read().pod_node("team", "a").as_deref(), Some("n1"));

        // a second pod on another node uses the same Secret; an unbound pod gives no edge
        let r = store.write(Op::Create { key: format!("{PODS}team/b"), value: pod("n2", "s1", "c2") }).await.unwrap();
        wait(r.mod_rev).await;
        assert!(g.read().node_references("n2", "team", "secrets", "s1"));
        let r = store.write(Op::Create { key: format!("{PODS}team/u"), value: pod("", "s9", "c9") }).await.unwrap();
        wait(r.mod_rev).await;
        assert!(!g.read().node_references("", "team", "secrets", "s9"));
        assert_eq!(g.read().pod_node("team", "u").as_deref(), Some(""));

        // a changed pod (as an update could, for ephemeral containers) moves its edges
        let current = store.get(&format!("{PODS}team/a")).await.unwrap().unwrap();
        let r = store
            .write(Op::Update { key: format!("{PODS}team/a"), value: pod("n1", "s2", "c1"), expect: Some(current.mod_rev) })
            .await
            .unwrap();
        wait(r.mod_rev).await;
        assert!(!g.read().node_references("n1", "team", "secrets", "s1"));
        assert!(g.read().node_references("n1", "team", "secrets", "s2"));
        assert!(g.read().node_references("n2", "team", "secrets", "s1"), "the other node's pod still uses it");

        // deleted pods take their edges with them
        for name in ["a", "b", "u"] {
            let r = store.write(Op::Delete { key: format!("{PODS}team/{name}"), expect: None }).await.unwrap();
            wait(r.mod_rev).await;
        }
        assert!(!g.read().node_references("n2", "team", "secrets", "s1"));
        assert_eq!(g.read().pod_node("team", "a"), None);
        assert_eq!(g.read().edges(), 0);
        assert!(g.read().pods.is_empty());
    }
}
