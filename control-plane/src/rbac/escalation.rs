//! Upstream's escalation checks on writing the four kinds (`pkg/registry/rbac/*/policybased`):
//! a Role or ClusterRole may only grant what its writer holds, unless the writer may
//! `escalate` it; a binding may only bind a role whose permissions its writer holds, unless
//! the writer may `bind` it; `system:masters` skips both. Refusals are 403s in upstream's
//! words, listing the missing rules.
//!
//! The writer travels with the request as upstream's does in its request context: the
//! server sets it for the task serving a request ([`scope`], [`set_requester`]) and the
//! store-facing code asks [`admit`] before validating a write of one of the four kinds.
//! Writes with no requester (the server's own, such as the bootstrap policy) are not checked.

use std::cell::RefCell;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::rules::{covers, describe_missing, Rule};
use super::{Policy, GROUP};
use crate::auth::{Action, Attributes, User};
use crate::error::ApiError;
use crate::resources::Resource;
use crate::store::Revision;

/// Who is writing, and the policy to hold the write against.
#[derive(Clone)]
pub struct Requester {
    pub user: User,
    pub policy: Arc<Policy>,
    /// The store revision when the request came: a refusal first lets the policy reach it.
    pub seen: Revision,
}

tokio::task_local! {
    static REQUESTER: RefCell<Option<Requester>>;
}

/// Runs a request's future with room for its requester.
pub async fn scope<F: Future>(f: F) -> F::Output {
    REQUESTER.scope(RefCell::new(None), f).await
}

/// Sets the requester of the request being served (within [`scope`]; elsewhere a no-op).
pub fn set_requester(requester: Requester) {
    let _outside_a_request = REQUESTER.try_with(|r| *r.borrow_mut() = Some(requester));
}

fn requester() -> Option<Requester> {
    REQUESTER.try_with(|r| r.borrow().clone()).ok().flatten()
}

/// The user of the request being served; None outside a request (the server's own writes).
pub fn requesting_user() -> Option<User> {
    requester().map(|r| r.user)
}

/// Whether the request's user may do what `attrs` names (RBAC, with `system:masters`
/// allowed everything), for admission checks beyond the request's own authorization
/// (upstream's CertificateApproval/CertificateSigning); Ok outside a request. A refusal first
/// lets the policy reach the revision the request saw.
pub async fn requester_may(attrs: &Attributes<'_>) -> bool {
    let Some(r) = requester() else { return true };
    if r.user.is_admin() {
        return true;
    }
    let may = |r: &Requester| super::authorize(&r.policy.read(), &r.user, &Action::Resource(attrs.clone())).0;
    if may(&r) {
        return true;
    }
    r.policy.applied() < r.seen && r.policy.caught_up(r.seen, Duration::from_secs(1)).await && may(&r)
}

/// What a write asks of its writer, beyond being allowed to write.
#[derive(Debug, Clone, PartialEq)]
pub enum Needs {
    Nothing,
    /// The writer holds these rules (in the namespace, or cluster-wide for ""), or may do
    /// `verb` on the object named by the attributes.
    Rules { rules: Vec<Rule>, namespace: String, verb: &'static str, resource: &'static str, name: String },
    /// A binding to a role that does not resolve: upstream's lister error.
    RoleNotFound(String),
}

fn only_gc_fields_changed(old: &Value, new: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
            for f in ["ownerReferences", "finalizers", "resourceVersion", "managedFields"] {
                m.remove(f);
            }
        }
        v
    };
    strip(old) == strip(new)
}

/// The rules of a role: (kind, namespace, name) -> its rules, or why there are none.
pub type RoleRules<'a> = dyn Fn(&str, &str, &str) -> Result<Vec<Rule>, String> + 'a;

/// The pure part: what writing `obj` (over `old`) requires, given how a binding's roleRef
/// resolves. ClusterRoles with an aggregationRule need everything (upstream: "must have
/// cluster-admin privileges to use the aggregationRule"), checked separately by [`admit`].
pub fn needs(plural: &str, namespace: &str, obj: &Value, old: Option<&Value>, role_rules: &RoleRules<'_>) -> Needs {
    if old.is_some_and(|o| only_gc_fields_changed(o, obj)) {
        return Needs::Nothing;
    }
    let name = obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("").to_string();
    match plural {
        "roles" | "clusterroles" => Needs::Rules {
            rules: super::index::rules_of(obj),
            namespace: namespace.to_string(),
            verb: "escalate",
            resource: if plural == "roles" { "roles" } else { "clusterroles" },
            name,
        },
        "rolebindings" | "clusterrolebindings" => {
            let kind = obj.pointer("/roleRef/kind").and_then(Value::as_str).unwrap_or("");
            let role = obj.pointer("/roleRef/name").and_then(Value::as_str).unwrap_or("").to_string();
            let resource = match kind {
                "Role" if plural == "rolebindings" => "roles",
                "ClusterRole" => "clusterroles",
                // validation refuses it with a 422
                _ => return Needs::Nothing,
            };
            match role_rules(kind, &role, namespace) {
                Ok(rules) => Needs::Rules { rules, namespace: namespace.to_string(), verb: "bind", resource, name: role },
                Err(e) => Needs::RoleNotFound(e),
            }
        }
        _ => Needs::Nothing,
    }
}

/// The aggregation rule's own need: everything, when it is set or changed.
fn full_authority() -> Vec<Rule> {
    vec![Rule::resource(&["*"], &["*"], &["*"]), Rule::urls(&["*"], &["*"])]
}

/// Upstream's ConfirmNoEscalation: Err with its message when the user's rules in the
/// namespace do not cover `rules`.
pub fn confirm_no_escalation(policy: &Policy, user: &User, namespace: &str, rules: &[Rule]) -> Result<(), String> {
    let (owned, errors) = policy.read().rules_for(user, namespace);
    let (ok, missing) = covers(&owned, rules);
    if ok {
        return Ok(());
    }
    let groups: Vec<String> = user.groups.iter().map(|g| k8s_semantics::go_quote(g)).collect();
    let mut msg = format!(
        "user {} (groups=[{}]) is attempting to grant RBAC permissions not currently held:\n{}",
        k8s_semantics::go_quote(&user.name),
        groups.join(" "),
        describe_missing(&missing)
    );
    if !errors.is_empty() {
        msg.push_str(&format!("; resolution errors: [{}]", super::index::aggregate(&errors)));
    }
    Err(msg)
}

fn verb_allowed(policy: &Policy, user: &User, verb: &str, resource: &str, namespace: &str, name: &str) -> bool {
    let attrs = Attributes { verb, group: GROUP, resource, subresource: "", namespace, name };
    super::authorize(&policy.read(), user, &Action::Resource(attrs)).0
}

/// One decision on the current policy.
fn check(r: &Requester, res: &Resource, ns: &str, obj: &Value, old: Option<&Value>) -> Result<(), ApiError> {
    let name = obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
    let forbidden = |why: String| ApiError::forbidden(&res.group_resource(), name, why);
    let policy = &r.policy;
    let role_rules = |kind: &str, role: &str, ns: &str| policy.read().role_rules(kind, role, ns).map(|r| r.to_vec());
    match needs(res.plural, ns, obj, old, &role_rules) {
        Needs::Nothing => {}
        Needs::RoleNotFound(_) => {
            let kind = obj.pointer("/roleRef/kind").and_then(Value::as_str).unwrap_or("");
            let role = obj.pointer("/roleRef/name").and_then(Value::as_str).unwrap_or("");
            let (resource, singular) = if kind == "Role" { ("roles", "role") } else { ("clusterroles", "clusterrole") };
            if !verb_allowed(policy, &r.user, "bind", resource, ns, role) {
                return Err(ApiError::not_found(&format!("{singular}.{GROUP}"), role));
            }
        }
        Needs::Rules { rules, namespace, verb, resource, name: target } => {
            if !verb_allowed(policy, &r.user, verb, resource, ns, &target) {
                confirm_no_escalation(policy, &r.user, &namespace, &rules).map_err(forbidden)?;
            }
        }
    }
    // setting (or changing) an aggregation rule gathers anything: it needs everything
    if res.plural == "clusterroles" {
        let rule_of = |v: &Value| v.get("aggregationRule").filter(|a| !a.is_null()).cloned();
        let agg = rule_of(obj);
        if agg.is_some() && agg != old.and_then(rule_of) && confirm_no_escalation(policy, &r.user, "", &full_authority()).is_err() {
            return Err(forbidden("must have cluster-admin privileges to use the aggregationRule".into()));
        }
    }
    Ok(())
}

/// The escalation check of a write of `obj` (over `old` for an update) by the request's
/// writer; nothing for other kinds, the server's own writes and `system:masters`. A refusal
/// waits (briefly) for the policy to reach the revision the request saw, then decides again.
pub async fn admit(res: &Resource, ns: Option<&str>, obj: &Value, old: Option<&Value>) -> Result<(), ApiError> {
    if res.group != GROUP {
        return Ok(());
    }
    let Some(r) = requester() else { return Ok(()) };
    if r.user.is_admin() {
        return Ok(());
    }
    let ns = ns.unwrap_or("");
    match check(&r, res, ns, obj, old) {
        Err(_) if r.policy.applied() < r.seen && r.policy.caught_up(r.seen, Duration::from_secs(1)).await => {
            check(&r, res, ns, obj, old)
        }
        other => other,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::rbac::index::{Binding, PolicyIndex};
    use serde_json::json;

    fn bob() -> User {
        User { name: "bob".into(), groups: vec!["system:authenticated".into()] }
    }

    /// bob may manage pods in "team" and get configmaps anywhere.
    fn policy(extra: &[Rule]) -> Policy {
        let mut ix = PolicyIndex::default();
        ix.set_role("team", "pods", vec![Rule::resource(&["get", "list", "delete"], &[""], &["pods"])]);
        ix.set_cluster_role("cm", vec![Rule::resource(&["get"], &[""], &["configmaps"])]);
        ix.set_cluster_role("extra", extra.to_vec());
        ix.set_cluster_role("admin", vec![Rule::resource(&["*"], &["*"], &["*"])]);
        for (ns, name, kind, role) in [("team", "p", "Role", "pods"), ("", "c", "ClusterRole", "cm"), ("", "e", "ClusterRole", "extra")] {
            ix.set_binding(Binding::from_json(&json!({"metadata": {"name": name, "namespace": ns}, "roleRef": {"kind": kind, "name": role},
                "subjects": [{"kind": "User", "name": "bob"}]})));
        }
        Policy::fixed(ix)
    }

    fn res(plural: &str) -> &'static Resource {
        crate::resources::RESOURCES.iter().find(|r| r.plural == plural && r.group == GROUP).unwrap()
    }

    fn role(rules: Value) -> Value {
        json!({"metadata": {"name": "r"}, "rules": rules})
    }

    fn req(p: Policy) -> Requester {
        Requester { user: bob(), policy: Arc::new(p), seen: 0 }
    }

    #[test]
    fn roles_grant_only_what_their_writer_holds() {
        let r = req(policy(&[]));
        let pods = role(json!([{"verbs": ["get", "delete"], "apiGroups": [""], "resources": ["pods"]}]));
        assert!(check(&r, res("roles"), "team", &pods, None).is_ok());
        let e = check(&r, res("roles"), "other", &pods, None).unwrap_err();
        assert_eq!(e.code, 403);
        assert_eq!(
            e.message,
            "roles.rbac.authorization.k8s.io \"r\" is forbidden: user \"bob\" (groups=[\"system:authenticated\"]) is attempting to grant RBAC permissions not currently held:\n{APIGroups:[\"\"], Resources:[\"pods\"], Verbs:[\"get\" \"delete\"]}"
        );
        let e = check(&r, res("clusterroles"), "", &pods, None).unwrap_err();
        assert!(e.message.contains("not currently held"), "a Role's rules in a namespace do not count cluster-wide: {e:?}");
        assert!(check(&r, res("clusterroles"), "", &role(json!([{"verbs": ["get"], "apiGroups": [""], "resources": ["configmaps"]}])), None).is_ok());
        // the escalate verb lifts it
        let r = req(policy(&[Rule::resource(&["escalate"], &[GROUP], &["roles"])]));
        assert!(check(&r, res("roles"), "other", &pods, None).is_ok());
        assert!(check(&r, res("clusterroles"), "", &pods, None).is_err(), "escalate on roles is not on clusterroles");
        // aggregation needs everything
        let r = req(policy(&[Rule::resource(&["escalate"], &[GROUP], &["clusterroles"])]));
        let agg = json!({"metadata": {"name": "a"}, "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"x": "y"}}]}});
        let e = check(&r, res("clusterroles"), "", &agg, None).unwrap_err();
        assert!(e.message.ends_with("must have cluster-admin privileges to use the aggregationRule"), "{e:?}");
        // changing only finalizers or owner references is always allowed
        let r = req(policy(&[]));
        let mut gc = pods.clone();
        gc["metadata"]["finalizers"] = json!(["x"]);
        assert!(check(&r, res("roles"), "other", &gc, Some(&pods)).is_ok());
    }

    #[test]
    fn bindings_need_the_role_or_bind() {
        let binding = |kind: &str, role: &str| json!({"metadata": {"name": "b"}, "roleRef": {"apiGroup": GROUP, "kind": kind, "name": role}, "subjects": []});
        let r = req(policy(&[]));
        assert!(check(&r, res("rolebindings"), "team", &binding("Role", "pods"), None).is_ok());
        assert!(check(&r, res("rolebindings"), "team", &binding("ClusterRole", "cm"), None).is_ok());
        let e = check(&r, res("rolebindings"), "team", &binding("ClusterRole", "admin"), None).unwrap_err();
        assert_eq!(e.code, 403);
        assert!(e.message.starts_with("rolebindings.rbac.authorization.k8s.io \"b\" is forbidden: user \"bob\""), "{e:?}");
        assert!(e.message.contains("{APIGroups:[\"*\"], Resources:[\"*\"], Verbs:[\"*\"]}"), "{e:?}");
        let e = check(&r, res("clusterrolebindings"), "", &binding("ClusterRole", "ghost"), None).unwrap_err();
        assert_eq!((e.code, e.message.as_str()), (404, "clusterrole.rbac.authorization.k8s.io \"ghost\" not found"));
        // bind on that one role, in that namespace
        let r = req(policy(&[Rule::resource(&["bind"], &[GROUP], &["clusterroles"]).named(&["admin"])]));
        assert!(check(&r, res("rolebindings"), "team", &binding("ClusterRole", "admin"), None).is_ok());
        assert!(check(&r, res("clusterrolebindings"), "", &binding("ClusterRole", "admin"), None).is_ok());
        assert!(check(&r, res("clusterrolebindings"), "", &binding("ClusterRole", "extra"), None).is_ok(), "bob holds extra's rules");
        // an unknown kind is left to validation
        assert!(check(&r, res("rolebindings"), "team", &binding("Rol", "x"), None).is_ok());
    }

    #[tokio::test]
    async fn no_requester_no_check() {
        let res = res("clusterroles");
        let obj = role(json!([{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}]));
        assert!(admit(res, None, &obj, None).await.is_ok());
        let out = scope(async {
            set_requester(req(policy(&[])));
            admit(res, None, &obj, None).await
        })
        .await;
        assert_eq!(out.unwrap_err().code, 403);
        let out = scope(async {
            set_requester(Requester { user: User { name: "root".into(), groups: vec!["system:masters".into()] }, ..req(policy(&[])) });
            admit(res, None, &obj, None).await
        })
        .await;
        assert!(out.is_ok());
    }
}
