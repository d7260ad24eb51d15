//! The authorizer's view of the four RBAC kinds: roles by name, and bindings indexed by the
//! users and groups they name, so that deciding a request looks only at the bindings that can
//! apply to its user (a few hash lookups), never at all of them. Upstream's rule resolver
//! walks every ClusterRoleBinding and every RoleBinding of the namespace per request; the
//! answers are the same, in the same order of preference (cluster bindings first).
//!
//! Pure data: built and changed by [`super::policy`] from the store's events.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;

use super::rules::Rule;
use crate::auth::User;

/// A subject of a binding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subject {
    pub kind: String,
    pub api_group: String,
    pub name: String,
    pub namespace: String,
}

/// A RoleBinding (namespace set) or ClusterRoleBinding (namespace empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    pub namespace: String,
    pub name: String,
    pub role_kind: String,
    pub role_name: String,
    pub subjects: Vec<Subject>,
}

/// The user name of a service account (upstream's serviceaccount.MakeUsername).
pub fn service_account_user(namespace: &str, name: &str) -> String {
    format!("system:serviceaccount:{namespace}:{name}")
}

impl Binding {
    /// From a stored RoleBinding or ClusterRoleBinding.
    pub fn from_json(obj: &Value) -> Binding {
        let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        let meta = obj.get("metadata").cloned().unwrap_or(Value::Null);
        let role_ref = obj.get("roleRef").cloned().unwrap_or(Value::Null);
        let subjects = obj
            .get("subjects")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .map(|x| Subject { kind: s(x, "kind"), api_group: s(x, "apiGroup"), name: s(x, "name"), namespace: s(x, "namespace") })
                    .collect()
            })
            .unwrap_or_default();
        Binding { namespace: s(&meta, "namespace"), name: s(&meta, "name"), role_kind: s(&role_ref, "kind"), role_name: s(&role_ref, "name"), subjects }
    }

    /// Upstream's appliesToUser: the index of the first subject naming the user.
    pub fn applies_to(&self, user: &User) -> Option<usize> {
        self.subjects.iter().position(|s| match s.kind.as_str() {
            "User" => s.name == user.name,
            "Group" => user.groups.contains(&s.name),
            "ServiceAccount" => self.sa_user(s).is_some_and(|u| u == user.name),
            _ => false,
        })
    }

    /// The user name a ServiceAccount subject stands for (its namespace defaults to the
    /// binding's; a cluster binding's subject without one names nobody).
    fn sa_user(&self, s: &Subject) -> Option<String> {
        let ns = if s.namespace.is_empty() { &self.namespace } else { &s.namespace };
        (!ns.is_empty()).then(|| service_account_user(ns, &s.name))
    }

    /// Upstream's describer, the source named in "RBAC: allowed by ...".
    pub fn describe(&self, subject: usize) -> String {
        let subject = self.subjects.get(subject).map(|s| describe_subject(s, &self.namespace)).unwrap_or_default();
        if self.namespace.is_empty() {
            format!("ClusterRoleBinding \"{}\" of {} \"{}\" to {subject}", self.name, self.role_kind, self.role_name)
        } else {
            format!("RoleBinding \"{}/{}\" of {} \"{}\" to {subject}", self.name, self.namespace, self.role_kind, self.role_name)
        }
    }
}

fn describe_subject(s: &Subject, binding_ns: &str) -> String {
    if s.kind == "ServiceAccount" {
        let ns = if s.namespace.is_empty() { binding_ns } else { &s.namespace };
        format!("{} \"{}/{ns}\"", s.kind, s.name)
    } else {
        format!("{} \"{}\"", s.kind, s.name)
    }
}

/// Rules of a stored Role or ClusterRole.
pub fn rules_of(obj: &Value) -> Vec<Rule> {
    obj.get("rules").cloned().and_then(|r| serde_json::from_value(r).ok()).unwrap_or_default()
}

/// Bindings reachable from a user name or a group name.
#[derive(Debug, Default)]
struct Subjects {
    users: HashMap<String, Vec<Arc<Binding>>>,
    groups: HashMap<String, Vec<Arc<Binding>>>,
}

impl Subjects {
    fn keys(b: &Binding) -> Vec<(bool, String)> {
        let mut keys: Vec<(bool, String)> = b
            .subjects
            .iter()
            .filter_map(|s| match s.kind.as_str() {
                "User" => Some((true, s.name.clone())),
                "Group" => Some((false, s.name.clone())),
                "ServiceAccount" => b.sa_user(s).map(|u| (true, u)),
                _ => None,
            })
            .collect();
        keys.sort();
        keys.dedup();
        keys
    }

    fn add(&mut self, b: &Arc<Binding>) {
        for (user, key) in Self::keys(b) {
            let map = if user { &mut self.users } else { &mut self.groups };
            map.entry(key).or_default().push(b.clone());
        }
    }

    fn remove(&mut self, b: &Arc<Binding>) {
        for (user, key) in Self::keys(b) {
            let map = if user { &mut self.users } else { &mut self.groups };
            if let Some(v) = map.get_mut(&key) {
                v.retain(|x| !Arc::ptr_eq(x, b));
                if v.is_empty() {
                    map.remove(&key);
                }
            }
        }
    }

    /// The bindings naming the user or one of its groups, each once, by name.
    fn candidates(&self, user: &User) -> Vec<&Arc<Binding>> {
        let mut out: Vec<&Arc<Binding>> = Vec::new();
        let lists = self.users.get(user.name.as_str()).into_iter().chain(user.groups.iter().filter_map(|g| self.groups.get(g.as_str())));
        for list in lists {
            for b in list {
                if !out.iter().any(|x| Arc::ptr_eq(x, b)) {
                    out.push(b);
                }
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    fn len(&self) -> usize {
        self.users.values().chain(self.groups.values()).map(Vec::len).sum()
    }
}

/// What the visitor of [`PolicyIndex::visit`] is given.
pub enum Visit<'a> {
    /// A rule, and the binding (with the index of the subject) that grants it.
    Rule(&'a Rule, &'a Binding, usize),
    /// A binding that applies but whose role cannot be resolved (upstream's wording).
    Error(String),
}

/// Roles, cluster roles and bindings, indexed.
#[derive(Debug, Default)]
pub struct PolicyIndex {
    cluster_roles: HashMap<String, Arc<[Rule]>>,
    /// namespace -> name -> rules
    roles: HashMap<String, HashMap<String, Arc<[Rule]>>>,
    cluster_bindings: HashMap<String, Arc<Binding>>,
    /// namespace -> name -> binding
    role_bindings: HashMap<String, HashMap<String, Arc<Binding>>>,
    cluster_subjects: Subjects,
    namespace_subjects: HashMap<String, Subjects>,
}

impl PolicyIndex {
    pub fn set_cluster_role(&mut self, name: &str, rules: Vec<Rule>) {
        self.cluster_roles.insert(name.to_string(), rules.into());
    }

    pub fn remove_cluster_role(&mut self, name: &str) {
        self.cluster_roles.remove(name);
    }

    pub fn set_role(&mut self, namespace: &str, name: &str, rules: Vec<Rule>) {
        self.roles.entry(namespace.to_string()).or_default().insert(name.to_string(), rules.into());
    }

    pub fn remove_role(&mut self, namespace: &str, name: &str) {
        if let Some(m) = self.roles.get_mut(namespace) {
            m.remove(name);
            if m.is_empty() {
                self.roles.remove(namespace);
            }
        }
    }

    /// Adds or replaces a binding (a RoleBinding when its namespace is set).
    pub fn set_binding(&mut self, b: Binding) {
        self.remove_binding(&b.namespace.clone(), &b.name.clone());
        let b = Arc::new(b);
        if b.namespace.is_empty() {
            self.cluster_subjects.add(&b);
            self.cluster_bindings.insert(b.name.clone(), b);
        } else {
            self.namespace_subjects.entry(b.namespace.clone()).or_default().add(&b);
            self.role_bindings.entry(b.namespace.clone()).or_default().insert(b.name.clone(), b);
        }
    }

    pub fn remove_binding(&mut self, namespace: &str, name: &str) {
        if namespace.is_empty() {
            if let Some(old) = self.cluster_bindings.remove(name) {
                self.cluster_subjects.remove(&old);
            }
            return;
        }
        let Some(m) = self.role_bindings.get_mut(namespace) else { return };
        if let Some(old) = m.remove(name) {
            if let Some(s) = self.namespace_subjects.get_mut(namespace) {
                s.remove(&old);
                if s.len() == 0 {
                    self.namespace_subjects.remove(namespace);
                }
            }
        }
        if m.is_empty() {
            self.role_bindings.remove(namespace);
        }
    }

    /// The rules a binding's roleRef resolves to (upstream's GetRoleReferenceRules); the
    /// error as upstream's listers word it.
    pub fn role_rules(&self, kind: &str, name: &str, namespace: &str) -> Result<Arc<[Rule]>, String> {
        match kind {
            "ClusterRole" => self
                .cluster_roles
                .get(name)
                .cloned()
                .ok_or_else(|| format!("clusterrole.rbac.authorization.k8s.io \"{name}\" not found")),
            "Role" => self
                .roles
                .get(namespace)
                .and_then(|m| m.get(name))
                .cloned()
                .ok_or_else(|| format!("role.rbac.authorization.k8s.io \"{name}\" not found")),
            other => Err(format!("unsupported role reference kind: \"{other}\"")),
        }
    }

    /// Upstream's VisitRulesFor: the rules of every cluster binding naming the user, then (for
    /// a namespace) of every binding in it naming the user; stops when `f` returns false.
    pub fn visit(&self, user: &User, namespace: &str, f: &mut dyn FnMut(Visit<'_>) -> bool) {
        let scopes = std::iter::once((&self.cluster_subjects, "")).chain(
            (!namespace.is_empty())
                .then(|| self.namespace_subjects.get(namespace).map(|s| (s, namespace)))
                .flatten(),
        );
        for (subjects, ns) in scopes {
            for b in subjects.candidates(user) {
                let Some(subject) = b.applies_to(user) else { continue };
                match self.role_rules(&b.role_kind, &b.role_name, ns) {
                    Ok(rules) => {
                        for r in rules.iter() {
                            if !f(Visit::Rule(r, b, subject)) {
                                return;
                            }
                        }
                    }
                    Err(e) => {
                        if !f(Visit::Error(e)) {
                            return;
                        }
                    }
                }
            }
        }
    }

    /// Upstream's RulesFor: every rule that applies to the user in the namespace (cluster-wide
    /// only for ""), and the resolution errors met.
    pub fn rules_for(&self, user: &User, namespace: &str) -> (Vec<Rule>, Vec<String>) {
        let mut rules = Vec::new();
        let mut errors = Vec::new();
        self.visit(user, namespace, &mut |v| {
            match v {
                Visit::Rule(r, ..) => rules.push(r.clone()),
                Visit::Error(e) => errors.push(e),
            }
            true
        });
        (rules, errors)
    }

    /// The number of bindings (both kinds).
    pub fn bindings(&self) -> usize {
        self.cluster_bindings.len() + self.role_bindings.values().map(HashMap::len).sum::<usize>()
    }
}

/// Upstream's utilerrors.NewAggregate(...).Error(): one message as it is, several in brackets.
pub fn aggregate(errors: &[String]) -> String {
    let mut seen: Vec<&String> = Vec::new();
    for e in errors {
        if !seen.contains(&e) {
            seen.push(e);
        }
    }
    match seen.as_slice() {
        [one] => one.to_string(),
        many => format!("[{}]", many.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn user(name: &str, groups: &[&str]) -> User {
        User { name: name.into(), groups: groups.iter().map(|g| g.to_string()).collect() }
    }

    fn binding(ns: &str, name: &str, role: (&str, &str), subjects: Value) -> Binding {
        Binding::from_json(&json!({"metadata": {"name": name, "namespace": ns}, "roleRef": {"kind": role.0, "name": role.1}, "subjects": subjects}))
    }

    fn allowed(ix: &PolicyIndex, u: &User, ns: &str, verb: &str, resource: &str) -> Option<String> {
        let mut by = None;
        ix.visit(u, ns, &mut |v| match v {
            Visit::Rule(r, b, s) if r.allows_resource(verb, "", resource, "", "x") => {
                by = Some(b.describe(s));
                false
            }
            _ => true,
        });
        by
    }

    #[test]
    fn bindings_apply_to_users_groups_and_service_accounts() {
        let mut ix = PolicyIndex::default();
        ix.set_cluster_role("view", vec![Rule::resource(&["get", "list"], &[""], &["pods"])]);
        ix.set_role("team", "deleter", vec![Rule::resource(&["delete"], &[""], &["pods"])]);
        ix.set_binding(binding("", "bob-view", ("ClusterRole", "view"), json!([{"kind": "User", "name": "bob"}])));
        ix.set_binding(binding("team", "devs", ("Role", "deleter"), json!([{"kind": "Group", "name": "dev"}])));
        ix.set_binding(binding("team", "robot", ("ClusterRole", "view"), json!([{"kind": "ServiceAccount", "name": "ci"}])));
        let bob = user("bob", &["system:authenticated"]);
        assert_eq!(allowed(&ix, &bob, "default", "list", "pods").unwrap(), "ClusterRoleBinding \"bob-view\" of ClusterRole \"view\" to User \"bob\"");
        assert!(allowed(&ix, &bob, "team", "delete", "pods").is_none());
        let dev = user("jane", &["dev"]);
        assert_eq!(allowed(&ix, &dev, "team", "delete", "pods").unwrap(), "RoleBinding \"devs/team\" of Role \"deleter\" to Group \"dev\"");
        assert!(allowed(&ix, &dev, "other", "delete", "pods").is_none(), "a RoleBinding grants only in its namespace");
        assert!(allowed(&ix, &dev, "", "delete", "pods").is_none());
        let ci = user("system:serviceaccount:team:ci", &["system:serviceaccounts"]);
        assert_eq!(allowed(&ix, &ci, "team", "get", "pods").unwrap(), "RoleBinding \"robot/team\" of ClusterRole \"view\" to ServiceAccount \"ci/team\"");
        assert!(allowed(&ix, &ci, "default", "get", "pods").is_none(), "a ClusterRole bound in a namespace grants there only");
        let other_ci = user("system:serviceaccount:other:ci", &[]);
        assert!(allowed(&ix, &other_ci, "team", "get", "pods").is_none());
    }

    #[test]
    fn changes_and_removals_are_seen() {
        let mut ix = PolicyIndex::default();
        ix.set_cluster_role("view", vec![Rule::resource(&["get"], &[""], &["pods"])]);
        let b = binding("", "b", ("ClusterRole", "view"), json!([{"kind": "User", "name": "bob"}, {"kind": "Group", "name": "g"}]));
        ix.set_binding(b.clone());
        ix.set_binding(b.clone());
        let bob = user("bob", &["g"]);
        let mut seen = 0;
        ix.visit(&bob, "", &mut |_| {
            seen += 1;
            true
        });
        assert_eq!(seen, 1, "a binding reached through two subjects is visited once");
        assert_eq!(ix.bindings(), 1);
        // the subject changes: bob no longer, g still
        ix.set_binding(binding("", "b", ("ClusterRole", "view"), json!([{"kind": "Group", "name": "g"}])));
        assert!(allowed(&ix, &user("bob", &[]), "", "get", "pods").is_none());
        assert!(allowed(&ix, &user("x", &["g"]), "", "get", "pods").is_some());
        // the role's rules change
        ix.set_cluster_role("view", vec![Rule::resource(&["list"], &[""], &["pods"])]);
        assert!(allowed(&ix, &user("x", &["g"]), "", "get", "pods").is_none());
        ix.remove_binding("", "b");
        assert!(allowed(&ix, &user("x", &["g"]), "", "list", "pods").is_none());
        assert_eq!(ix.bindings(), 0);
        assert_eq!(ix.cluster_subjects.len(), 0);
    }

    #[test]
    fn missing_roles_are_errors_in_upstream_words() {
        let mut ix = PolicyIndex::default();
        ix.set_binding(binding("", "b", ("ClusterRole", "ghost"), json!([{"kind": "User", "name": "bob"}])));
        ix.set_binding(binding("ns", "r", ("Role", "gone"), json!([{"kind": "User", "name": "bob"}])));
        let (rules, errors) = ix.rules_for(&user("bob", &[]), "ns");
        assert!(rules.is_empty());
        assert_eq!(errors, ["clusterrole.rbac.authorization.k8s.io \"ghost\" not found", "role.rbac.authorization.k8s.io \"gone\" not found"]);
        assert_eq!(aggregate(&errors[..1]), "clusterrole.rbac.authorization.k8s.io \"ghost\" not found");
        assert!(aggregate(&errors).starts_with("[clusterrole"));
        // a cluster binding's ServiceAccount subject without a namespace names nobody
        let b = binding("", "sa", ("ClusterRole", "x"), json!([{"kind": "ServiceAccount", "name": "default"}]));
        assert_eq!(b.applies_to(&user("system:serviceaccount::default", &[])), None);
    }
}
