//! SelfSubjectRulesReview (`kubectl auth can-i --list`): what the requester may do in a
//! namespace, as upstream's union of its authorizers' rule resolvers answers it. The Node
//! authorizer cannot enumerate its rules (a node's answer is marked incomplete, with
//! upstream's evaluation error); RBAC lists the rules of the bindings that apply, cluster-wide
//! and in the namespace; the resolution errors met (a binding to a missing role) are the
//! evaluation error.

use serde_json::{json, Value};

use super::index::{aggregate, PolicyIndex};
use crate::auth::User;
use crate::error::ApiError;

/// The answer to a SelfSubjectRulesReview of `user`: the review with its `status`.
pub fn self_subject_rules_review(user: &User, review: &Value, policy: &PolicyIndex) -> Result<Value, ApiError> {
    let namespace = review.pointer("/spec/namespace").and_then(Value::as_str).unwrap_or("");
    if namespace.is_empty() {
        return Err(ApiError::bad_request("no namespace on request"));
    }
    let mut incomplete = false;
    let mut errors = Vec::new();
    if user.node_name().is_some() {
        incomplete = true;
        errors.push("node authorizer does not support user rule resolution".to_string());
    }
    let (rules, rbac_errors) = policy.rules_for(user, namespace);
    if !rbac_errors.is_empty() {
        errors.push(aggregate(&rbac_errors));
    }
    let mut resource_rules = Vec::new();
    let mut non_resource_rules = Vec::new();
    for r in &rules {
        if !r.resources.is_empty() {
            let mut rule = json!({"verbs": r.verbs});
            if !r.api_groups.is_empty() {
                rule["apiGroups"] = json!(r.api_groups);
            }
            rule["resources"] = json!(r.resources);
            if !r.resource_names.is_empty() {
                rule["resourceNames"] = json!(r.resource_names);
            }
            resource_rules.push(rule);
        }
        if !r.non_resource_urls.is_empty() {
            non_resource_rules.push(json!({"verbs": r.verbs, "nonResourceURLs": r.non_resource_urls}));
        }
    }
    let mut status = json!({"resourceRules": resource_rules, "nonResourceRules": non_resource_rules, "incomplete": incomplete});
    if !errors.is_empty() {
        status["evaluationError"] = json!(aggregate(&errors));
    }
    let mut out = review.clone();
    if out.get("metadata").is_none_or(Value::is_null) {
        out["metadata"] = json!({"creationTimestamp": null});
    }
    out["status"] = status;
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::rbac::index::Binding;
    use crate::rbac::Rule;

    #[test]
    fn lists_what_applies_in_the_namespace() {
        let mut ix = PolicyIndex::default();
        ix.set_cluster_role("basic", vec![Rule::resource(&["create"], &["authorization.k8s.io"], &["selfsubjectrulesreviews"])]);
        ix.set_cluster_role("disc", vec![Rule::urls(&["get"], &["/api", "/api/*"])]);
        ix.set_role("team", "cm", vec![Rule::resource(&["get"], &[""], &["configmaps"]).named(&["settings"])]);
        let bind = |ns: &str, name: &str, kind: &str, role: &str, subject: Value| {
            Binding::from_json(&json!({"metadata": {"name": name, "namespace": ns}, "roleRef": {"kind": kind, "name": role}, "subjects": [subject]}))
        };
        ix.set_binding(bind("", "basic", "ClusterRole", "basic", json!({"kind": "Group", "name": "system:authenticated"})));
        ix.set_binding(bind("", "disc", "ClusterRole", "disc", json!({"kind": "Group", "name": "system:authenticated"})));
        ix.set_binding(bind("team", "cm", "Role", "cm", json!({"kind": "User", "name": "bob"})));
        ix.set_binding(bind("team", "broken", "Role", "gone", json!({"kind": "User", "name": "bob"})));
        let bob = User { name: "bob".into(), groups: vec!["system:authenticated".into()] };
        let out = self_subject_rules_review(&bob, &json!({"spec": {"namespace": "team"}}), &ix).unwrap();
        let st = &out["status"];
        assert_eq!(
            st["resourceRules"],
            json!([{"verbs": ["create"], "apiGroups": ["authorization.k8s.io"], "resources": ["selfsubjectrulesreviews"]},
                   {"verbs": ["get"], "apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["settings"]}])
        );
        assert_eq!(st["nonResourceRules"], json!([{"verbs": ["get"], "nonResourceURLs": ["/api", "/api/*"]}]));
        assert_eq!(st["incomplete"], false);
        assert_eq!(st["evaluationError"], "role.rbac.authorization.k8s.io \"gone\" not found");
        let other = self_subject_rules_review(&bob, &json!({"spec": {"namespace": "other"}}), &ix).unwrap();
        assert_eq!(other["status"]["resourceRules"].as_array().unwrap().len(), 1);
        assert!(other["status"].get("evaluationError").is_none());
        let node = User { name: "system:node:n1".into(), groups: vec!["system:nodes".into()] };
        let st = self_subject_rules_review(&node, &json!({"spec": {"namespace": "x"}}), &ix).unwrap()["status"].clone();
        assert_eq!((st["incomplete"].clone(), st["evaluationError"].clone()), (json!(true), json!("node authorizer does not support user rule resolution")));
        assert_eq!(self_subject_rules_review(&bob, &json!({"spec": {}}), &ix).unwrap_err().code, 400);
    }
}
