//! The bootstrap policy (`policy.yaml`: upstream's default ClusterRoles and ClusterRoleBindings,
//! and ferro's own) reconciled at every start as upstream's kube-apiserver does
//! (`pkg/registry/rbac/reconciliation`, without removing anything): a missing object is
//! created; an existing one whose annotation `rbac.authorization.kubernetes.io/autoupdate` is
//! not "false" gets the rules, aggregation selectors, subjects, labels and annotations it
//! lacks; a binding whose roleRef differs is deleted and created again (roleRef cannot
//! change). Objects set to "false" are left as their owner made them.
//!
//! [`plan`] is the pure planner; [`reconcile`] applies its ops through the API in-process
//! (as the server itself: no escalation check, upstream's loopback client is a superuser).

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::rules::{covers, Rule};
use super::GROUP;
use crate::api::{Api, DeleteOptions};
use crate::error::ApiError;

const POLICY: &str = include_str!("policy.yaml");
pub const AUTOUPDATE: &str = "rbac.authorization.kubernetes.io/autoupdate";
pub const BOOTSTRAPPING: &str = "kubernetes.io/bootstrapping";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    #[serde(rename = "clusterRoles")]
    cluster_roles: Vec<RoleData>,
    #[serde(rename = "clusterRoleBindings")]
    cluster_role_bindings: Vec<BindingData>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RoleData {
    name: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    rules: Vec<Rule>,
    #[serde(default, rename = "aggregationRule")]
    aggregation_rule: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BindingData {
    name: String,
    role: String,
    subjects: Vec<SubjectData>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SubjectData {
    kind: String,
    name: String,
    #[serde(default)]
    namespace: Option<String>,
}

fn metadata(name: &str, labels: &BTreeMap<String, String>) -> Value {
    let mut l: Map<String, Value> = labels.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
    l.insert(BOOTSTRAPPING.into(), json!("rbac-defaults"));
    json!({"name": name, "labels": l, "annotations": {AUTOUPDATE: "true"}})
}

/// The bootstrap ClusterRoles and ClusterRoleBindings, as the API stores them.
pub fn desired() -> (Vec<Value>, Vec<Value>) {
    // The file is part of the binary and its parse is unit-tested: it cannot fail at run time.
    let file: PolicyFile = match serde_yaml::from_str(POLICY) {
        Ok(f) => f,
        Err(e) => {
            tracing::error!(error = %e, "rbac: the built-in bootstrap policy does not parse");
            return (Vec::new(), Vec::new());
        }
    };
    let roles = file
        .cluster_roles
        .iter()
        .map(|r| {
            let mut o = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": metadata(&r.name, &r.labels)});
            if let Some(agg) = &r.aggregation_rule {
                o["aggregationRule"] = agg.clone();
            }
            if !r.rules.is_empty() {
                o["rules"] = json!(r.rules);
            }
            o
        })
        .collect();
    let bindings = file
        .cluster_role_bindings
        .iter()
        .map(|b| {
            let subjects: Vec<Value> = b
                .subjects
                .iter()
                .map(|s| match (s.kind.as_str(), &s.namespace) {
                    ("ServiceAccount", ns) => json!({"kind": "ServiceAccount", "name": s.name, "namespace": ns.clone().unwrap_or_default()}),
                    (kind, _) => json!({"kind": kind, "apiGroup": GROUP, "name": s.name}),
                })
                .collect();
            let mut o = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": metadata(&b.name, &BTreeMap::new()),
                "roleRef": {"apiGroup": GROUP, "kind": "ClusterRole", "name": b.role}});
            if !subjects.is_empty() {
                o["subjects"] = json!(subjects);
            }
            o
        })
        .collect();
    (roles, bindings)
}

/// A write the reconcile makes.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    Create(Value),
    Update(Value),
    /// Delete the existing object and create this one (a binding's roleRef changed).
    Recreate(Value),
}

fn protected(existing: &Value) -> bool {
    existing.pointer(&format!("/metadata/annotations/{}", AUTOUPDATE.replace('/', "~1"))).and_then(Value::as_str) == Some("false")
}

/// Expected labels and annotations added where the existing object has none of that key.
fn merge_meta(expected: &Value, out: &mut Value) {
    for field in ["labels", "annotations"] {
        let Some(want) = expected.pointer(&format!("/metadata/{field}")).and_then(Value::as_object) else { continue };
        let meta = &mut out["metadata"];
        if !meta.get(field).is_some_and(Value::is_object) {
            meta[field] = json!({});
        }
        if let Some(have) = meta.get_mut(field).and_then(Value::as_object_mut) {
            for (k, v) in want {
                have.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
    }
}

fn list(v: &Value, key: &str) -> Vec<Value> {
    v.get(key).and_then(Value::as_array).cloned().unwrap_or_default()
}

/// What to do about one bootstrap object (a ClusterRole or ClusterRoleBinding, told apart by
/// its kind): None when the existing object is as it should be or protected.
pub fn plan(expected: &Value, existing: Option<&Value>) -> Option<Op> {
    let Some(existing) = existing else { return Some(Op::Create(expected.clone())) };
    if protected(existing) {
        return None;
    }
    let mut out = existing.clone();
    merge_meta(expected, &mut out);
    let mut recreate = false;
    if expected["kind"] == "ClusterRoleBinding" {
        if existing.get("roleRef") != expected.get("roleRef") {
            out["roleRef"] = expected["roleRef"].clone();
            recreate = true;
        }
        let mut subjects = list(existing, "subjects");
        for s in list(expected, "subjects") {
            if !subjects.contains(&s) {
                subjects.push(s);
            }
        }
        if !subjects.is_empty() {
            out["subjects"] = json!(subjects);
        }
    } else {
        if let Some(want) = expected.pointer("/aggregationRule/clusterRoleSelectors").and_then(Value::as_array) {
            let mut selectors = existing.pointer("/aggregationRule/clusterRoleSelectors").and_then(Value::as_array).cloned().unwrap_or_default();
            for s in want {
                if !selectors.contains(s) {
                    selectors.push(s.clone());
                }
            }
            out["aggregationRule"] = json!({"clusterRoleSelectors": selectors});
        }
        // upstream's union: the missing rules, broken down, appended
        let have: Vec<Rule> = super::index::rules_of(existing);
        let (_, missing) = covers(&have, &super::index::rules_of(expected));
        if !missing.is_empty() {
            let mut rules = list(existing, "rules");
            rules.extend(missing.iter().map(|r| json!(r)));
            out["rules"] = json!(rules);
        }
    }
    match (out == *existing, recreate) {
        (true, _) => None,
        (false, true) => Some(Op::Recreate(out)),
        (false, false) => Some(Op::Update(out)),
    }
}

/// Reconciles the bootstrap policy through `api` (every API server does this at start; a
/// conflict with another one is read again and planned again).
pub async fn reconcile(api: &Api) -> Result<(), ApiError> {
    let (roles, bindings) = desired();
    let find = |plural: &str| crate::resources::find(GROUP, "v1", plural).ok_or_else(|| ApiError::internal(format!("no {plural} resource")));
    let (role_res, binding_res) = (find("clusterroles")?, find("clusterrolebindings")?);
    let mut changed = 0;
    for (res, want) in roles.iter().map(|r| (role_res, r)).chain(bindings.iter().map(|b| (binding_res, b))) {
        let name = want.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
        for attempt in 0.. {
            let existing = match api.get(res, None, name).await {
                Ok(r) => Some(r.json()?),
                Err(e) if e.code == 404 => None,
                Err(e) => return Err(e),
            };
            let op = plan(want, existing.as_ref());
            let writes = op.is_some();
            let result = match op {
                None => Ok(()),
                Some(Op::Create(o)) => api.create(res, None, o, false).await.map(drop),
                Some(Op::Update(o)) => api.update(res, None, name, o, crate::api::Endpoint::Main, false).await.map(drop),
                Some(Op::Recreate(mut o)) => {
                    let opts = DeleteOptions { precondition_rv: o.pointer("/metadata/resourceVersion").and_then(Value::as_str).map(str::to_string), ..Default::default() };
                    if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
                        for f in ["resourceVersion", "uid", "creationTimestamp"] {
                            m.remove(f);
                        }
                    }
                    match api.delete(res, None, name, &opts).await {
                        Ok(_) => api.create(res, None, o, false).await.map(drop),
                        Err(e) => Err(e),
                    }
                }
            };
            match result {
                Ok(()) => {
                    if writes {
                        changed += 1;
                        tracing::debug!(kind = res.kind, name, "rbac: bootstrap object reconciled");
                    }
                    break;
                }
                // another API server got there first: look again
                Err(e) if matches!(e.code, 409 | 404) && attempt < 5 => continue,
                Err(e) => return Err(e),
            }
        }
    }
    tracing::info!(roles = roles.len(), bindings = bindings.len(), changed, "rbac: bootstrap policy reconciled");
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn by_name<'a>(objs: &'a [Value], name: &str) -> &'a Value {
        objs.iter().find(|o| o["metadata"]["name"] == name).unwrap()
    }

    #[test]
    fn the_policy_parses_and_has_upstreams_defaults() {
        let (roles, bindings) = desired();
        for name in ["cluster-admin", "admin", "edit", "view", "system:aggregate-to-view", "system:basic-user", "system:discovery",
            "system:public-info-viewer", "system:node-proxier", "system:kube-scheduler", "system:kube-controller-manager", "system:node",
            "system:service-account-issuer-discovery", "system:auth-delegator", "system:heapster", "system:ferro-csi"] {
            let r = by_name(&roles, name);
            assert_eq!(r["metadata"]["labels"][BOOTSTRAPPING], "rbac-defaults", "{name}");
            assert_eq!(r["metadata"]["annotations"][AUTOUPDATE], "true", "{name}");
            // every role is valid as the API validates it
            assert!(crate::rbac::validation::validate("clusterroles", r).is_empty(), "{name}: {:?}", crate::rbac::validation::validate("clusterroles", r));
        }
        assert_eq!(by_name(&roles, "view")["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"], "true");
        assert!(by_name(&roles, "admin").get("rules").is_none());
        let admin = by_name(&bindings, "cluster-admin");
        assert_eq!(admin["subjects"], json!([{"kind": "Group", "apiGroup": GROUP, "name": "system:masters"}]));
        assert_eq!(by_name(&bindings, "system:public-info-viewer")["subjects"].as_array().unwrap().len(), 2);
        assert!(by_name(&bindings, "system:node").get("subjects").is_none(), "unbound as upstream");
        assert_eq!(by_name(&bindings, "system:kube-dns")["subjects"][0], json!({"kind": "ServiceAccount", "name": "kube-dns", "namespace": "kube-system"}));
        for b in &bindings {
            assert!(crate::rbac::validation::validate("clusterrolebindings", b).is_empty(), "{b}");
            let role = b["roleRef"]["name"].as_str().unwrap();
            assert!(roles.iter().any(|r| r["metadata"]["name"] == role), "binding to a missing role {role}");
        }
    }

    #[test]
    fn missing_objects_are_created_and_edited_ones_completed() {
        let (roles, _) = desired();
        let view = by_name(&roles, "system:aggregate-to-view");
        assert_eq!(plan(view, None), Some(Op::Create(view.clone())));
        assert_eq!(plan(view, Some(view)), None, "as it should be: nothing");
        // someone removed a rule and a label, and added their own rule and label
        let mut edited = view.clone();
        edited["rules"].as_array_mut().unwrap().remove(0);
        edited["rules"].as_array_mut().unwrap().push(json!({"verbs": ["get"], "apiGroups": ["example.com"], "resources": ["widgets"]}));
        edited["metadata"]["labels"] = json!({"mine": "yes", BOOTSTRAPPING: "changed"});
        let Some(Op::Update(fixed)) = plan(view, Some(&edited)) else { panic!("an update") };
        let rules = fixed["rules"].as_array().unwrap();
        assert!(rules.contains(&json!({"verbs": ["get"], "apiGroups": ["example.com"], "resources": ["widgets"]})), "extra rules stay");
        assert!(covers(&super::super::index::rules_of(&fixed), &super::super::index::rules_of(view)).0, "every expected rule is back");
        assert_eq!(fixed["metadata"]["labels"]["mine"], "yes");
        assert_eq!(fixed["metadata"]["labels"][BOOTSTRAPPING], "changed", "an existing value is kept");
        assert_eq!(fixed["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"], "true");
        assert_eq!(plan(view, Some(&fixed)), None, "and then it is content");
        // autoupdate=false: left alone
        let mut mine = edited.clone();
        mine["metadata"]["annotations"] = json!({AUTOUPDATE: "false"});
        assert_eq!(plan(view, Some(&mine)), None);
        // aggregated roles: selectors completed, rules (the aggregation loop's) untouched
        let admin = by_name(&roles, "admin");
        let mut agg = admin.clone();
        agg["aggregationRule"] = json!({"clusterRoleSelectors": [{"matchLabels": {"extra": "true"}}]});
        agg["rules"] = json!([{"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}]);
        let Some(Op::Update(fixed)) = plan(admin, Some(&agg)) else { panic!("an update") };
        assert_eq!(fixed["aggregationRule"]["clusterRoleSelectors"].as_array().unwrap().len(), 2);
        assert_eq!(fixed["rules"], agg["rules"]);
    }

    #[test]
    fn bindings_get_their_subjects_back_and_a_changed_role_ref_is_recreated() {
        let (_, bindings) = desired();
        let b = by_name(&bindings, "system:basic-user");
        let mut edited = b.clone();
        edited["subjects"] = json!([{"kind": "User", "apiGroup": GROUP, "name": "bob"}]);
        let Some(Op::Update(fixed)) = plan(b, Some(&edited)) else { panic!("an update") };
        assert_eq!(fixed["subjects"], json!([{"kind": "User", "apiGroup": GROUP, "name": "bob"}, {"kind": "Group", "apiGroup": GROUP, "name": "system:authenticated"}]));
        let mut moved = b.clone();
        moved["roleRef"]["name"] = json!("view");
        let Some(Op::Recreate(again)) = plan(b, Some(&moved)) else { panic!("a recreate") };
        assert_eq!(again["roleRef"]["name"], "system:basic-user");
    }
}
