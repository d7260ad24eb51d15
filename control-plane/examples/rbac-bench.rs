//! What RBAC adds to a request with many bindings: the authorizer chain (`auth::authorize`:
//! system:masters, the node rules, then RBAC over the policy index) timed per decision, with
//! the bootstrap policy plus N RoleBindings (one per user, spread over namespaces, each to a
//! Role of its namespace or to a ClusterRole) and N/10 ClusterRoleBindings. The policy is built the
//! way the server builds it: the objects are written to an embedded store and the policy
//! follows it. For comparison, the same decisions by upstream's method (every cluster binding
//! and every binding of the namespace looked at per request) in the same run.
//!
//! ```text
//! cargo run --release -p ferro-control-plane --example rbac-bench -- --bindings 10000
//! ```
//! Prints figures; asserts nothing about time.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferro_control_plane::auth::{self, Action, Attributes, NodeGraph, User};
use ferro_control_plane::rbac::index::{rules_of, Binding};
use ferro_control_plane::rbac::{rule_allows, Policy};
use ferro_control_plane::store::{EmbeddedStore, EmbeddedStoreOptions, Op, Store};
use serde_json::{json, Value};

struct NoPods;
impl NodeGraph for NoPods {
    fn pod_node(&self, _: &str, _: &str) -> Option<String> {
        None
    }
    fn node_references(&self, _: &str, _: &str, _: &str, _: &str) -> bool {
        false
    }
}

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

fn report(what: &str, mut times: Vec<Duration>) {
    times.sort();
    println!(
        "{what:<58} p50 {:>7.2} µs  p99 {:>7.2} µs  max {:>8.2} µs  ({} decisions)",
        percentile(&times, 0.50).as_secs_f64() * 1e6,
        percentile(&times, 0.99).as_secs_f64() * 1e6,
        times.last().copied().unwrap_or_default().as_secs_f64() * 1e6,
        times.len()
    );
}

/// Upstream's resolver: every cluster binding, then every binding of the namespace.
struct Linear {
    cluster: Vec<(Binding, Vec<ferro_control_plane::rbac::Rule>)>,
    namespaced: std::collections::HashMap<String, Vec<(Binding, Vec<ferro_control_plane::rbac::Rule>)>>,
}

impl Linear {
    fn allows(&self, user: &User, action: &Action<'_>, ns: &str) -> bool {
        let scan = |list: &[(Binding, Vec<ferro_control_plane::rbac::Rule>)]| {
            list.iter().any(|(b, rules)| b.applies_to(user).is_some() && rules.iter().any(|r| rule_allows(r, action)))
        };
        scan(&self.cluster) || self.namespaced.get(ns).is_some_and(|l| scan(l))
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let n = arg("--bindings", 10_000);
    let decisions = arg("--decisions", 200_000);
    let namespaces = (n / 10).max(1);
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn Store> = Arc::new(EmbeddedStore::open(
        &dir.path().join("store.redb"),
        ferro_control_plane::strategy::indexer(),
        EmbeddedStoreOptions { history: 1000, ..Default::default() },
    )?);
    let (roles, bindings) = ferro_control_plane::rbac::bootstrap::desired();
    let mut writes: Vec<(String, Value)> = Vec::new();
    for r in &roles {
        writes.push((format!("/rbac.authorization.k8s.io/clusterroles/{}", r["metadata"]["name"].as_str().unwrap_or("")), r.clone()));
    }
    for b in &bindings {
        writes.push((format!("/rbac.authorization.k8s.io/clusterrolebindings/{}", b["metadata"]["name"].as_str().unwrap_or("")), b.clone()));
    }
    // a ClusterRole of the bench's own (the bootstrap `view` gets its rules from the aggregation
    // loop, which does not run here)
    writes.push((
        "/rbac.authorization.k8s.io/clusterroles/bench-viewer".to_string(),
        json!({"metadata": {"name": "bench-viewer"}, "rules": [{"verbs": ["get", "list", "watch"], "apiGroups": [""], "resources": ["configmaps", "pods", "services"]}]}),
    ));
    for i in 0..namespaces {
        let ns = format!("ns-{i}");
        let role = json!({"metadata": {"name": "cm-writer", "namespace": ns},
            "rules": [{"verbs": ["get", "list", "create", "update"], "apiGroups": [""], "resources": ["configmaps"]}]});
        writes.push((format!("/rbac.authorization.k8s.io/roles/{ns}/cm-writer"), role));
    }
    for i in 0..n {
        let ns = format!("ns-{}", i % namespaces);
        let (kind, role) = if i.is_multiple_of(2) { ("Role", "cm-writer") } else { ("ClusterRole", "bench-viewer") };
        let subject = if i.is_multiple_of(3) {
            json!({"kind": "ServiceAccount", "name": format!("sa-{i}"), "namespace": ns})
        } else {
            json!({"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": format!("user-{i}")})
        };
        let b = json!({"metadata": {"name": format!("b-{i}"), "namespace": ns}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role}, "subjects": [subject]});
        writes.push((format!("/rbac.authorization.k8s.io/rolebindings/{ns}/b-{i}"), b));
    }
    for i in 0..n / 10 {
        let b = json!({"metadata": {"name": format!("crb-{i}")}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "bench-viewer"},
            "subjects": [{"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": format!("group-{i}")}]});
        writes.push((format!("/rbac.authorization.k8s.io/clusterrolebindings/crb-{i}"), b));
    }
    let started = Instant::now();
    let policy = Policy::start(store.clone()).await?;
    let mut last = 0;
    for chunk in writes.chunks(256) {
        let mut pending = Vec::new();
        for (key, value) in chunk {
            pending.push(store.write(Op::Create { key: key.clone(), value: value.clone() }));
        }
        for r in futures::future::join_all(pending).await {
            last = last.max(r?.mod_rev);
        }
    }
    let caught_up = policy.caught_up(last, Duration::from_secs(60)).await;
    println!(
        "{} RoleBindings in {namespaces} namespaces, {} ClusterRoleBindings, {} roles: written and followed by the policy in {:.2} s (caught up: {caught_up})",
        n,
        n / 10 + bindings.len(),
        roles.len() + namespaces,
        started.elapsed().as_secs_f64()
    );

    // The same objects, for upstream's method.
    let mut linear = Linear { cluster: Vec::new(), namespaced: Default::default() };
    let role_map: std::collections::HashMap<String, Vec<ferro_control_plane::rbac::Rule>> = writes
        .iter()
        .filter(|(k, _)| k.contains("/roles/") || k.contains("/clusterroles/"))
        .map(|(k, v)| (k.clone(), rules_of(v)))
        .collect();
    for (key, v) in &writes {
        if key.contains("bindings/") {
            let b = Binding::from_json(v);
            let rk = if b.role_kind == "Role" {
                format!("/rbac.authorization.k8s.io/roles/{}/{}", b.namespace, b.role_name)
            } else {
                format!("/rbac.authorization.k8s.io/clusterroles/{}", b.role_name)
            };
            let rules = role_map.get(&rk).cloned().unwrap_or_default();
            if b.namespace.is_empty() {
                linear.cluster.push((b, rules));
            } else {
                linear.namespaced.entry(b.namespace.clone()).or_default().push((b, rules));
            }
        }
    }

    // Requests: users with a RoleBinding (allowed), the same users elsewhere (refused), service
    // accounts, group members, and the admin.
    let mut allowed_t = Vec::with_capacity(decisions);
    let mut refused_t = Vec::with_capacity(decisions);
    let mut admin_t = Vec::with_capacity(decisions);
    let mut linear_t = Vec::with_capacity(decisions / 10);
    let mut mismatches = 0;
    let admin = User { name: "admin".into(), groups: vec!["system:masters".into(), "system:authenticated".into()] };
    for d in 0..decisions {
        let i = (d * 7919) % n;
        let ns = format!("ns-{}", i % namespaces);
        let user = if i.is_multiple_of(3) {
            User { name: format!("system:serviceaccount:{ns}:sa-{i}"), groups: vec!["system:serviceaccounts".into(), format!("system:serviceaccounts:{ns}"), "system:authenticated".into()] }
        } else {
            User { name: format!("user-{i}"), groups: vec![format!("group-{}", i % (n / 10).max(1)), "system:authenticated".into()] }
        };
        let get = Action::Resource(Attributes { verb: "get", group: "", resource: "configmaps", subresource: "", namespace: &ns, name: "settings" });
        let t = Instant::now();
        let ok = auth::authorize(&user, &get, &NoPods, None, &policy.read()).is_ok();
        allowed_t.push(t.elapsed());
        let del = Action::Resource(Attributes { verb: "delete", group: "", resource: "secrets", subresource: "", namespace: &ns, name: "x" });
        let t = Instant::now();
        let refused = auth::authorize(&user, &del, &NoPods, None, &policy.read()).is_err();
        refused_t.push(t.elapsed());
        let t = Instant::now();
        let _ = auth::authorize(&admin, &del, &NoPods, None, &policy.read());
        admin_t.push(t.elapsed());
        if !(ok && refused) {
            mismatches += 1;
        }
        if d.is_multiple_of(10) {
            let t = Instant::now();
            let l = linear.allows(&user, &get, &ns);
            linear_t.push(t.elapsed());
            if l != ok {
                mismatches += 1;
            }
        }
    }
    report("allowed (a RoleBinding of the user's namespace)", allowed_t);
    report("refused (403 text built)", refused_t);
    report("system:masters (the floor: no RBAC lookup)", admin_t);
    report("upstream's method: every binding looked at, allowed", linear_t);
    println!("decisions that did not come out as expected: {mismatches}");
    anyhow::ensure!(mismatches == 0, "wrong decisions");
    node_authorizer(store, arg("--pods", 10_000), decisions / 10).await
}

/// The node authorizer at `pods` pods in one namespace (each using a Secret of its own, bound
/// to one of 100 nodes): a node's get of a Secret its pod uses (allowed) and of one another
/// node's pod uses (refused), decided from the graph the server keeps, and for comparison by
/// the scan of the namespace's pods the server did before the graph (their index attributes,
/// no JSON parsed), in the same run.
async fn node_authorizer(store: Arc<dyn Store>, pods: usize, decisions: usize) -> anyhow::Result<()> {
    use ferro_control_plane::node_graph::NodeGraphView;
    let nodes = 100;
    let started = Instant::now();
    let graph = NodeGraphView::start(store.clone()).await?;
    let mut last = 0;
    let all: Vec<usize> = (0..pods).collect();
    for chunk in all.chunks(256) {
        let writes = chunk.iter().map(|i| {
            let pod = json!({"metadata": {"name": format!("p-{i}"), "namespace": "big"}, "spec": {
                "nodeName": format!("node-{}", i % nodes),
                "volumes": [{"name": "s", "secret": {"secretName": format!("s-{i}")}}],
                "containers": [{"name": "c", "image": "busybox", "envFrom": [{"configMapRef": {"name": "shared"}}]}]}});
            store.write(Op::Create { key: format!("/core/pods/big/p-{i}"), value: pod })
        });
        for r in futures::future::join_all(writes).await {
            last = last.max(r?.mod_rev);
        }
    }
    let caught_up = graph.caught_up(last, Duration::from_secs(60)).await;
    println!(
        "{pods} pods in one namespace on {nodes} nodes: written and followed by the node graph in {:.2} s (caught up: {caught_up})",
        started.elapsed().as_secs_f64()
    );
    let scan = |node: &str, name: &str| {
        let listing = futures::executor::block_on(store.list("/core/pods/big/")).unwrap_or_else(|_| std::process::exit(1));
        listing
            .records
            .iter()
            .filter(|r| r.attrs.field("spec.nodeName") == Some(node))
            .any(|r| r.attrs.refs.iter().any(|(res, n)| *res == "secrets" && n == name))
    };
    // the node rules decide alone: no RBAC binding for nodes
    let empty = Policy::fixed(Default::default());
    let (mut allowed_t, mut refused_t, mut scan_t) = (Vec::new(), Vec::new(), Vec::new());
    let mut mismatches = 0;
    for d in 0..decisions {
        let i = (d * 7919) % pods;
        let node = format!("node-{}", i % nodes);
        let user = User { name: format!("system:node:{node}"), groups: vec!["system:nodes".into(), "system:authenticated".into()] };
        let (own, other) = (format!("s-{i}"), format!("s-{}", (i + 1) % pods));
        let get = |name| Action::Resource(Attributes { verb: "get", group: "", resource: "secrets", subresource: "", namespace: "big", name });
        let t = Instant::now();
        let ok = auth::authorize(&user, &get(&own), &*graph.read(), None, &empty.read()).is_ok();
        allowed_t.push(t.elapsed());
        let t = Instant::now();
        let refused = auth::authorize(&user, &get(&other), &*graph.read(), None, &empty.read()).is_err();
        refused_t.push(t.elapsed());
        if !(ok && refused) {
            mismatches += 1;
        }
        if d.is_multiple_of(10) {
            let t = Instant::now();
            let s = scan(&node, &own);
            scan_t.push(t.elapsed());
            if !s {
                mismatches += 1;
            }
        }
    }
    report("node: allowed (a Secret its pod uses), graph", allowed_t);
    report("node: refused (another node's pod's Secret), graph", refused_t);
    report("node: the namespace scan the server did before", scan_t);
    println!("node decisions that did not come out as expected: {mismatches}");
    anyhow::ensure!(mismatches == 0, "wrong node decisions");
    Ok(())
}
