//! Role-based access control as upstream's (`rbac.authorization.k8s.io/v1`): the rule
//! semantics (`rules`), the index of roles and bindings the authorizer decides with
//! (`index`), kept current from the store (`policy`), the validation of the four kinds
//! (`validation`), the escalation checks on writing them (`escalation`), the bootstrap policy
//! reconciled at start (`bootstrap`), impersonation (`impersonation`) and the rules review
//! (`review`). The ClusterRole aggregation loop is a controller
//! (`controllers/clusterroleaggregation`).

pub mod bootstrap;
pub mod escalation;
pub mod impersonation;
pub mod index;
pub mod policy;
pub mod review;
pub mod rules;
pub mod validation;

pub use policy::Policy;
pub use rules::Rule;

use crate::auth::{Action, User};
use index::{aggregate, PolicyIndex, Visit};

/// The group of the four kinds.
pub const GROUP: &str = "rbac.authorization.k8s.io";

/// Whether a rule allows an action (upstream's RuleAllows).
pub fn rule_allows(rule: &Rule, action: &Action<'_>) -> bool {
    match action {
        Action::Resource(a) => rule.allows_resource(a.verb, a.group, a.resource, a.subresource, a.name),
        Action::Path { verb, path } => rule.allows_path(verb, path),
    }
}

/// The RBAC authorizer: allowed with upstream's reason ("RBAC: allowed by ClusterRoleBinding
/// ..."), or no opinion with the resolution errors met on the way (bindings whose role is
/// missing) as the reason.
pub fn authorize(ix: &PolicyIndex, user: &User, action: &Action<'_>) -> (bool, String) {
    let namespace = match action {
        Action::Resource(a) => a.namespace,
        Action::Path { .. } => "",
    };
    let mut allowed_by = None;
    let mut errors = Vec::new();
    ix.visit(user, namespace, &mut |v| match v {
        Visit::Rule(rule, binding, subject) => {
            if rule_allows(rule, action) {
                allowed_by = Some(binding.describe(subject));
                return false;
            }
            true
        }
        Visit::Error(e) => {
            errors.push(e);
            true
        }
    });
    match allowed_by {
        Some(by) => (true, format!("RBAC: allowed by {by}")),
        None if errors.is_empty() => (false, String::new()),
        None => (false, format!("RBAC: {}", aggregate(&errors))),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::auth::Attributes;
    use index::Binding;
    use serde_json::json;

    #[test]
    fn reasons_as_upstream() {
        let mut ix = PolicyIndex::default();
        ix.set_cluster_role("view", vec![Rule::resource(&["list"], &[""], &["pods"]), Rule::urls(&["get"], &["/metrics"])]);
        ix.set_binding(Binding::from_json(&json!({"metadata": {"name": "v"}, "roleRef": {"kind": "ClusterRole", "name": "view"},
            "subjects": [{"kind": "Group", "name": "viewers"}]})));
        let u = User { name: "bob".into(), groups: vec!["viewers".into()] };
        let list = Action::Resource(Attributes { verb: "list", group: "", resource: "pods", subresource: "", namespace: "default", name: "" });
        assert_eq!(authorize(&ix, &u, &list), (true, "RBAC: allowed by ClusterRoleBinding \"v\" of ClusterRole \"view\" to Group \"viewers\"".into()));
        assert!(authorize(&ix, &u, &Action::Path { verb: "get", path: "/metrics" }).0);
        assert!(!authorize(&ix, &u, &Action::Path { verb: "get", path: "/healthz" }).0);
        let del = Action::Resource(Attributes { verb: "delete", group: "", resource: "pods", subresource: "", namespace: "default", name: "p" });
        assert_eq!(authorize(&ix, &u, &del), (false, String::new()));
        ix.set_binding(Binding::from_json(&json!({"metadata": {"name": "broken"}, "roleRef": {"kind": "ClusterRole", "name": "nope"},
            "subjects": [{"kind": "User", "name": "bob"}]})));
        assert_eq!(authorize(&ix, &u, &del), (false, "RBAC: clusterrole.rbac.authorization.k8s.io \"nope\" not found".into()));
    }
}
