//! Authentication (static bearer tokens, x509 client certificates) and authorization (the
//! admin may do everything; nodes are limited like upstream's Node authorizer +
//! NodeRestriction admission).

use std::collections::HashMap;
use std::path::Path;

use serde_json::Value;

/// An authenticated user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub groups: Vec<String>,
}

impl User {
    /// A request without credentials, as upstream's anonymous authenticator names it.
    pub fn anonymous() -> User {
        User { name: "system:anonymous".into(), groups: vec!["system:unauthenticated".into()] }
    }

    pub fn is_admin(&self) -> bool {
        self.groups.iter().any(|g| g == "system:masters")
    }

    /// The node name when this is a node identity (`system:node:<name>` in `system:nodes`).
    pub fn node_name(&self) -> Option<&str> {
        if !self.groups.iter().any(|g| g == "system:nodes") {
            return None;
        }
        self.name.strip_prefix("system:node:").filter(|n| !n.is_empty())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("reading token file {0}: {1}")]
    TokenFile(String, std::io::Error),
    #[error("token file {file} line {line}: {why}")]
    TokenLine { file: String, line: usize, why: String },
}

/// Static tokens (upstream's --token-auth-file format: `token,user,uid,"group1,group2"`).
#[derive(Debug, Default)]
pub struct Tokens {
    by_token: HashMap<String, User>,
}

impl Tokens {
    pub fn load(path: &Path) -> Result<Tokens, AuthError> {
        let content = std::fs::read_to_string(path)
            .map_err(|e| AuthError::TokenFile(path.display().to_string(), e))?;
        Tokens::parse(&content, &path.display().to_string())
    }

    pub fn parse(content: &str, file: &str) -> Result<Tokens, AuthError> {
        let mut by_token = HashMap::new();
        for (i, line) in content.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (head, groups) = match line.split_once(",\"") {
                Some((h, g)) => (h, g.trim_end_matches('"')),
                None => (line, ""),
            };
            let cols: Vec<&str> = head.split(',').collect();
            if cols.len() < 3 || cols[0].is_empty() || cols[1].is_empty() {
                return Err(AuthError::TokenLine {
                    file: file.to_string(),
                    line: i + 1,
                    why: "expected token,user,uid[,\"groups\"]".into(),
                });
            }
            let mut groups: Vec<String> = groups
                .split(',')
                .chain(cols.get(3).copied())
                .map(str::trim)
                .filter(|g| !g.is_empty())
                .map(str::to_string)
                .collect();
            groups.push("system:authenticated".into());
            by_token.insert(cols[0].to_string(), User { name: cols[1].to_string(), groups });
        }
        Ok(Tokens { by_token })
    }

    pub fn authenticate(&self, authorization: &str) -> Option<User> {
        let token = authorization.strip_prefix("Bearer ")?.trim();
        self.by_token.get(token).cloned()
    }

    pub fn add(&mut self, token: &str, user: User) {
        self.by_token.insert(token.to_string(), user);
    }
}

/// The user a verified client certificate names: CN is the user, O entries are groups.
pub fn identity_from_cert(der: &[u8]) -> Option<User> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let subject = cert.subject();
    let name = subject.iter_common_name().next()?.as_str().ok()?.to_string();
    let mut groups: Vec<String> = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_string))
        .collect();
    groups.push("system:authenticated".into());
    Some(User { name, groups })
}

/// Labels a node may not set on its own Node (upstream's NodeRestriction): anything under
/// node-restriction.kubernetes.io, and kubernetes.io / k8s.io labels other than the ones
/// kubelets set (hostname, os, arch, instance type, zone and region) and the kubelet.kubernetes.io
/// and node.kubernetes.io namespaces.
pub fn node_may_not_set_label(key: &str) -> bool {
    let Some((domain, _)) = key.split_once('/') else { return false };
    let under = |d: &str| domain == d || domain.ends_with(&format!(".{d}"));
    if under("node-restriction.kubernetes.io") {
        return true;
    }
    if !under("kubernetes.io") && !under("k8s.io") {
        return false;
    }
    const KUBELET_LABELS: &[&str] = &[
        "kubernetes.io/hostname",
        "kubernetes.io/arch",
        "kubernetes.io/os",
        "beta.kubernetes.io/arch",
        "beta.kubernetes.io/os",
        "beta.kubernetes.io/instance-type",
        "node.kubernetes.io/instance-type",
        "failure-domain.beta.kubernetes.io/region",
        "failure-domain.beta.kubernetes.io/zone",
        "topology.kubernetes.io/region",
        "topology.kubernetes.io/zone",
    ];
    !(KUBELET_LABELS.contains(&key) || under("kubelet.kubernetes.io") || under("node.kubernetes.io"))
}

/// The restricted labels a node's write of its Node adds, changes or removes (sorted); empty
/// when it may make the write.
pub fn node_label_changes(old: Option<&Value>, new: &Value) -> Vec<String> {
    let labels = |v: Option<&Value>| -> std::collections::BTreeMap<String, Value> {
        v.and_then(|v| v.pointer("/metadata/labels")).and_then(Value::as_object).map(|m| m.clone().into_iter().collect()).unwrap_or_default()
    };
    let (before, after) = (labels(old), labels(Some(new)));
    let mut keys: Vec<String> = before.keys().chain(after.keys()).filter(|k| node_may_not_set_label(k) && before.get(*k) != after.get(*k)).cloned().collect();
    keys.sort();
    keys.dedup();
    keys
}

/// What a request wants to do, in upstream's authorizer terms.
#[derive(Debug, Clone)]
pub struct Attributes<'a> {
    pub verb: &'a str,
    pub group: &'a str,
    pub resource: &'a str,
    pub subresource: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
}

/// Facts the node rules need from the store.
pub trait NodeGraph {
    /// spec.nodeName of a pod, if the pod exists.
    fn pod_node(&self, namespace: &str, name: &str) -> Option<String>;
    /// Whether a pod bound to `node` references the named secret/configmap/pvc.
    fn node_references(&self, node: &str, namespace: &str, resource: &str, name: &str) -> bool;
}

/// The objects a pod uses by name in its namespace, as `(resource, name)`, sorted and
/// without repeats: Secrets (volumes, projected sources, imagePullSecrets, env and envFrom of
/// every container, init and ephemeral ones included), ConfigMaps (the same places) and
/// PersistentVolumeClaims (volumes). The node authorizer lets a node read what the pods
/// bound to it use (upstream's node graph edges).
pub fn pod_uses(pod: &Value) -> Vec<(&'static str, String)> {
    let mut out: Vec<(&'static str, String)> = Vec::new();
    let mut add = |resource: &'static str, v: Option<&Value>| {
        if let Some(name) = v.and_then(Value::as_str).filter(|n| !n.is_empty()) {
            out.push((resource, name.to_string()));
        }
    };
    let list = |v: Option<&Value>| v.and_then(Value::as_array).map(|a| a.as_slice()).unwrap_or(&[]).to_vec();
    let spec = pod.get("spec");
    for v in list(spec.and_then(|s| s.get("volumes"))) {
        add("secrets", v.pointer("/secret/secretName"));
        add("configmaps", v.pointer("/configMap/name"));
        add("persistentvolumeclaims", v.pointer("/persistentVolumeClaim/claimName"));
        for source in list(v.pointer("/projected/sources")) {
            add("secrets", source.pointer("/secret/name"));
            add("configmaps", source.pointer("/configMap/name"));
        }
    }
    for s in list(spec.and_then(|s| s.get("imagePullSecrets"))) {
        add("secrets", s.get("name"));
    }
    for kind in ["containers", "initContainers", "ephemeralContainers"] {
        for c in list(spec.and_then(|s| s.get(kind))) {
            for e in list(c.get("env")) {
                add("secrets", e.pointer("/valueFrom/secretKeyRef/name"));
                add("configmaps", e.pointer("/valueFrom/configMapKeyRef/name"));
            }
            for e in list(c.get("envFrom")) {
                add("secrets", e.pointer("/secretRef/name"));
                add("configmaps", e.pointer("/configMapRef/name"));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// A request in authorizer terms: on a resource, or on a non-resource path.
#[derive(Debug, Clone)]
pub enum Action<'a> {
    Resource(Attributes<'a>),
    Path { verb: &'a str, path: &'a str },
}

impl Action<'_> {
    pub fn verb(&self) -> &str {
        match self {
            Action::Resource(a) => a.verb,
            Action::Path { verb, .. } => verb,
        }
    }
}

/// Upstream's forbiddenMessage: what a refusal says, before the authorizers' reasons.
pub fn forbidden_message(user: &User, action: &Action<'_>) -> String {
    match action {
        Action::Path { verb, path } => format!("User \"{}\" cannot {verb} path \"{path}\"", user.name),
        Action::Resource(a) => {
            let resource = if a.subresource.is_empty() { a.resource.to_string() } else { format!("{}/{}", a.resource, a.subresource) };
            let scope = if a.namespace.is_empty() {
                "at the cluster scope".to_string()
            } else {
                format!("in the namespace \"{}\"", a.namespace)
            };
            format!("User \"{}\" cannot {} resource \"{resource}\" in API group \"{}\" {scope}", user.name, a.verb, a.group)
        }
    }
}

/// What the authorizer chain decided, with upstream's reason: why it was allowed ("RBAC:
/// allowed by ..."), or the reasons of the authorizers that had no opinion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    pub reason: String,
}

/// Upstream's authorizer chain: `system:masters` may do everything (kube-apiserver's
/// privileged group), then the Node authorizer for node identities, then RBAC. An authorizer
/// allows or has no opinion; the last no-opinion refuses, with the reasons met on the way.
pub fn decide(user: &User, action: &Action<'_>, graph: &dyn NodeGraph, body: Option<&Value>, policy: &crate::rbac::index::PolicyIndex) -> Decision {
    if user.is_admin() {
        return Decision { allowed: true, reason: String::new() };
    }
    let mut reasons = Vec::new();
    if let (Some(node), Action::Resource(a)) = (user.node_name(), action) {
        match node_rules(node, a, graph, body) {
            Ok(()) => return Decision { allowed: true, reason: String::new() },
            Err(why) if !why.is_empty() => reasons.push(why),
            Err(_) => {}
        }
    }
    let (allowed, why) = crate::rbac::authorize(policy, user, action);
    if allowed {
        return Decision { allowed, reason: why };
    }
    if !why.is_empty() {
        reasons.push(why);
    }
    Decision { allowed: false, reason: reasons.join("\n") }
}

/// Decides a request; Err carries the 403's text (upstream's forbiddenMessage and reasons).
pub fn authorize(user: &User, action: &Action<'_>, graph: &dyn NodeGraph, body: Option<&Value>, policy: &crate::rbac::index::PolicyIndex) -> Result<(), String> {
    let d = decide(user, action, graph, body, policy);
    if d.allowed {
        return Ok(());
    }
    let mut msg = forbidden_message(user, action);
    if !d.reason.is_empty() {
        msg.push_str(": ");
        msg.push_str(&d.reason);
    }
    Err(msg)
}

/// The node rules (upstream's Node authorizer with NodeRestriction's limits): Ok to allow,
/// Err with the reason (possibly empty) for no opinion, so RBAC decides next. Deliberate
/// difference: the NodeRestriction limits (a node writing another node, non-mirror pods...)
/// are no opinion here rather than an admission refusal, so only an RBAC grant to nodes, which
/// upstream leaves unbound, could lift them.
fn node_rules(node: &str, a: &Attributes<'_>, graph: &dyn NodeGraph, body: Option<&Value>) -> Result<(), String> {
    let deny = |why: String| Err(why);
    let read = matches!(a.verb, "get" | "list" | "watch");
    match (a.group, a.resource, a.subresource) {
        ("", "nodes", sub) if sub.is_empty() || sub == "status" => {
            if read {
                return Ok(());
            }
            if a.verb == "delete" || a.verb == "deletecollection" {
                return deny(format!("node \"{node}\" is not allowed to delete nodes"));
            }
            let target = if a.name.is_empty() {
                body.and_then(|b| b.pointer("/metadata/name")).and_then(|n| n.as_str()).unwrap_or("")
            } else {
                a.name
            };
            if target == node {
                Ok(())
            } else {
                deny(format!("node \"{node}\" is not allowed to modify node \"{target}\""))
            }
        }
        ("coordination.k8s.io", "leases", "") => {
            if a.namespace != "kube-node-lease" {
                return deny("can only access leases in the kube-node-lease namespace".to_string());
            }
            let target = if a.name.is_empty() {
                body.and_then(|b| b.pointer("/metadata/name")).and_then(|n| n.as_str()).unwrap_or("")
            } else {
                a.name
            };
            if matches!(a.verb, "list" | "watch" | "deletecollection") {
                return deny("can only access node lease with the same name as the requesting node".to_string());
            }
            if target == node {
                Ok(())
            } else {
                deny("can only access node lease with the same name as the requesting node".to_string())
            }
        }
        ("", "pods", sub) => {
            let bound_here = || graph.pod_node(a.namespace, a.name).as_deref() == Some(node);
            match (sub, a.verb) {
                ("", "get" | "list" | "watch") => Ok(()),
                ("status", "get") => Ok(()),
                ("status", "update" | "patch") => {
                    if bound_here() {
                        Ok(())
                    } else {
                        deny(format!("node \"{node}\" can only update the status of pods bound to it"))
                    }
                }
                ("", "delete") => {
                    if bound_here() {
                        Ok(())
                    } else {
                        deny(format!("node \"{node}\" can only delete pods bound to it"))
                    }
                }
                ("", "create") => {
                    // mirror pods of static pods, bound to this node
                    let b = body.cloned().unwrap_or(Value::Null);
                    let mirror = b
                        .pointer("/metadata/annotations/kubernetes.io~1config.mirror")
                        .is_some();
                    let bound = b.pointer("/spec/nodeName").and_then(|n| n.as_str()) == Some(node);
                    if mirror && bound {
                        Ok(())
                    } else {
                        deny(format!("node \"{node}\" can only create mirror pods bound to itself"))
                    }
                }
                _ => deny(String::new()),
            }
        }
        // Tokens for the service accounts of pods bound to this node, bound to those pods
        // (upstream's Node authorizer and NodeRestriction).
        ("", "serviceaccounts", "token") => {
            let b = body.cloned().unwrap_or(Value::Null);
            let kind = b.pointer("/spec/boundObjectRef/kind").and_then(Value::as_str);
            let pod = b.pointer("/spec/boundObjectRef/name").and_then(Value::as_str).unwrap_or("");
            if a.verb == "create" && kind == Some("Pod") && graph.pod_node(a.namespace, pod).as_deref() == Some(node) {
                Ok(())
            } else {
                deny(format!("node \"{node}\" can only create tokens bound to pods bound to it"))
            }
        }
        ("", "events", _) | ("events.k8s.io", "events", _) => {
            if matches!(a.verb, "create" | "update" | "patch") || read {
                Ok(())
            } else {
                deny(String::new())
            }
        }
        // kubelet reports a finished filesystem expansion in the claim's status.
        ("", "persistentvolumeclaims", "status") => {
            if matches!(a.verb, "get" | "update" | "patch") && graph.node_references(node, a.namespace, "persistentvolumeclaims", a.name) {
                Ok(())
            } else {
                deny(format!("no relationship found between node '{node}' and this object"))
            }
        }
        // Secrets and ConfigMaps: read one by name (a get, or a list or watch whose field
        // selector names it: the agent's watch-based cache); claims: get.
        ("", r @ ("secrets" | "configmaps" | "persistentvolumeclaims"), "") => {
            let verb_ok = a.verb == "get" || (r != "persistentvolumeclaims" && matches!(a.verb, "list" | "watch"));
            if verb_ok && !a.name.is_empty() && graph.node_references(node, a.namespace, r, a.name) {
                Ok(())
            } else {
                deny(format!("no relationship found between node '{node}' and this object"))
            }
        }
        ("", "persistentvolumes", "") | ("storage.k8s.io", "volumeattachments", "") => {
            if a.verb == "get" {
                Ok(())
            } else {
                deny(String::new())
            }
        }
        ("storage.k8s.io", "csinodes", "") => {
            if read {
                return Ok(());
            }
            let target = if a.name.is_empty() {
                body.and_then(|b| b.pointer("/metadata/name")).and_then(|n| n.as_str()).unwrap_or("")
            } else {
                a.name
            };
            if target == node && a.verb != "deletecollection" {
                Ok(())
            } else {
                deny(format!("node \"{node}\" can only modify its own CSINode"))
            }
        }
        // certificate requests: to renew its own client certificate (upstream's node rules);
        // whether one is approved is the approver's SubjectAccessReview (selfnodeclient)
        ("certificates.k8s.io", "certificatesigningrequests", "") if matches!(a.verb, "create" | "get" | "list" | "watch") => Ok(()),
        // delegated authentication and authorization (upstream's static node rules)
        ("authentication.k8s.io", "tokenreviews", "") | ("authorization.k8s.io", "subjectaccessreviews" | "localsubjectaccessreviews", "")
            if a.verb == "create" =>
        {
            Ok(())
        }
        (_, _, "") if read => Ok(()),
        _ => deny(String::new()),
    }
}

/// The review APIs served without storage, as upstream's: `authentication.k8s.io/v1`
/// TokenReview and SelfSubjectReview (`kubectl auth whoami`), `authorization.k8s.io/v1`
/// SubjectAccessReview, SelfSubjectAccessReview (`kubectl auth can-i`) and
/// SelfSubjectRulesReview (`kubectl auth can-i --list`); create only, authorized like any
/// other create (upstream's system:basic-user lets everyone ask about themselves,
/// system:auth-delegator and the node rules allow the others).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Review {
    Token,
    SubjectAccess,
    SelfSubject,
    SelfSubjectAccess,
    SelfSubjectRules,
}

impl Review {
    /// The review a request path names, if any.
    pub fn of_path(path: &str) -> Option<Review> {
        match path.trim_end_matches('/') {
            "/apis/authentication.k8s.io/v1/tokenreviews" => Some(Review::Token),
            "/apis/authorization.k8s.io/v1/subjectaccessreviews" => Some(Review::SubjectAccess),
            "/apis/authentication.k8s.io/v1/selfsubjectreviews" => Some(Review::SelfSubject),
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews" => Some(Review::SelfSubjectAccess),
            "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews" => Some(Review::SelfSubjectRules),
            _ => None,
        }
    }

    /// (group, version, kind, plural)
    pub fn names(self) -> (&'static str, &'static str, &'static str, &'static str) {
        match self {
            Review::Token => ("authentication.k8s.io", "v1", "TokenReview", "tokenreviews"),
            Review::SubjectAccess => ("authorization.k8s.io", "v1", "SubjectAccessReview", "subjectaccessreviews"),
            Review::SelfSubject => ("authentication.k8s.io", "v1", "SelfSubjectReview", "selfsubjectreviews"),
            Review::SelfSubjectAccess => ("authorization.k8s.io", "v1", "SelfSubjectAccessReview", "selfsubjectaccessreviews"),
            Review::SelfSubjectRules => ("authorization.k8s.io", "v1", "SelfSubjectRulesReview", "selfsubjectrulesreviews"),
        }
    }
}

/// A SelfSubjectReview: who the requester is.
pub fn self_subject_review(user: &User) -> Value {
    serde_json::json!({
        "kind": "SelfSubjectReview",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"creationTimestamp": null},
        "status": {"userInfo": {"username": user.name, "groups": user.groups}},
    })
}

/// A SelfSubjectAccessReview: the SubjectAccessReview of the requester itself.
pub fn self_subject_access_review(user: &User, review: &Value, graph: &dyn NodeGraph, policy: &crate::rbac::index::PolicyIndex) -> Result<Value, String> {
    let mut as_sar = review.clone();
    let spec = as_sar.get_mut("spec").and_then(Value::as_object_mut).ok_or("spec: Required value")?;
    spec.insert("user".into(), serde_json::json!(user.name));
    spec.insert("groups".into(), serde_json::json!(user.groups));
    let answered = subject_access_review(&as_sar, graph, policy)?;
    let mut out = review.clone();
    out["status"] = answered["status"].clone();
    Ok(out)
}

/// Answers a TokenReview: `spec.token` checked against the static tokens. The request's
/// object comes back with `status` filled (upstream: authenticated, user, audiences).
pub fn token_review(tokens: &Tokens, review: &Value) -> Result<Value, String> {
    let token = review.pointer("/spec/token").and_then(Value::as_str).unwrap_or("");
    if token.is_empty() {
        return Err("spec.token: Required value: token must be provided".into());
    }
    let mut out = review.clone();
    let status = match tokens.authenticate(&format!("Bearer {token}")) {
        Some(u) => serde_json::json!({
            "authenticated": true,
            "user": {"username": u.name, "groups": u.groups},
            "audiences": review.pointer("/spec/audiences").cloned().unwrap_or(Value::Array(Vec::new())),
        }),
        None => serde_json::json!({"user": {}}),
    };
    out["status"] = status;
    Ok(out)
}

/// Answers a SubjectAccessReview with the authorizer chain ([`decide`]) for `spec.user` in
/// `spec.groups` (taken as given, as upstream does), on `resourceAttributes` or
/// `nonResourceAttributes`: `status.allowed` and the chain's reason.
pub fn subject_access_review(review: &Value, graph: &dyn NodeGraph, policy: &crate::rbac::index::PolicyIndex) -> Result<Value, String> {
    let spec = review.get("spec").ok_or("spec: Required value")?;
    let name = spec.get("user").and_then(Value::as_str).unwrap_or("");
    let groups: Vec<String> = spec
        .get("groups")
        .and_then(Value::as_array)
        .map(|g| g.iter().filter_map(|x| x.as_str().map(str::to_string)).collect())
        .unwrap_or_default();
    if name.is_empty() && groups.is_empty() {
        return Err("spec.user: Invalid value: \"\": at least one of user or group must be specified".into());
    }
    let user = User { name: name.to_string(), groups };
    let ra = spec.get("resourceAttributes");
    let nra = spec.get("nonResourceAttributes");
    let decision = match (ra, nra) {
        (Some(_), Some(_)) => {
            return Err("spec: Invalid value: resourceAttributes and nonResourceAttributes are mutually exclusive".into())
        }
        (None, None) => {
            return Err("spec: Invalid value: exactly one of nonResourceAttributes or resourceAttributes must be specified".into())
        }
        (Some(ra), None) => {
            let f = |k: &str| ra.get(k).and_then(Value::as_str).unwrap_or("");
            let attrs = Attributes {
                verb: f("verb"),
                group: f("group"),
                resource: f("resource"),
                subresource: f("subresource"),
                namespace: f("namespace"),
                name: f("name"),
            };
            decide(&user, &Action::Resource(attrs), graph, None, policy)
        }
        (None, Some(nra)) => {
            let f = |k: &str| nra.get(k).and_then(Value::as_str).unwrap_or("");
            decide(&user, &Action::Path { verb: f("verb"), path: f("path") }, graph, None, policy)
        }
    };
    let mut out = review.clone();
    let mut status = serde_json::json!({"allowed": decision.allowed});
    if !decision.reason.is_empty() {
        status["reason"] = serde_json::json!(decision.reason);
    }
    out["status"] = status;
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::rbac::index::{Binding, PolicyIndex};
    use crate::rbac::Rule;
    use serde_json::json;

    struct Graph;
    impl NodeGraph for Graph {
        fn pod_node(&self, _ns: &str, name: &str) -> Option<String> {
            match name {
                "mine" => Some("n1".into()),
                "theirs" => Some("n2".into()),
                _ => None,
            }
        }
        fn node_references(&self, node: &str, _ns: &str, _r: &str, name: &str) -> bool {
            node == "n1" && name == "used"
        }
    }

    fn node() -> User {
        User { name: "system:node:n1".into(), groups: vec!["system:nodes".into(), "system:authenticated".into()] }
    }

    fn attrs<'a>(verb: &'a str, group: &'a str, resource: &'a str, sub: &'a str, ns: &'a str, name: &'a str) -> Attributes<'a> {
        Attributes { verb, group, resource, subresource: sub, namespace: ns, name }
    }

    /// The chain with no RBAC bindings.
    fn check(u: &User, a: Attributes<'_>, body: Option<&Value>) -> Result<(), String> {
        authorize(u, &Action::Resource(a), &Graph, body, &PolicyIndex::default())
    }

    #[test]
    fn tokens_parse() {
        let t = Tokens::parse("abc,admin,1,\"system:masters\"\nxyz,bob,2\n", "t").unwrap();
        let u = t.authenticate("Bearer abc").unwrap();
        assert!(u.is_admin());
        assert!(!t.authenticate("Bearer xyz").unwrap().is_admin());
        assert!(t.authenticate("Bearer nope").is_none());
        assert!(t.authenticate("Basic abc").is_none());
        assert!(Tokens::parse("justatoken\n", "t").is_err());
    }

    #[test]
    fn admin_may_do_everything_others_nothing() {
        let admin = User { name: "admin".into(), groups: vec!["system:masters".into()] };
        assert!(check(&admin, attrs("delete", "", "nodes", "", "", "x"), None).is_ok());
        let bob = User { name: "bob".into(), groups: vec!["system:authenticated".into()] };
        let err = check(&bob, attrs("get", "", "pods", "", "default", "p"), None).unwrap_err();
        assert_eq!(err, "User \"bob\" cannot get resource \"pods\" in API group \"\" in the namespace \"default\"");
        let err = check(&bob, attrs("update", "apps", "deployments", "scale", "", "p"), None).unwrap_err();
        assert_eq!(err, "User \"bob\" cannot update resource \"deployments/scale\" in API group \"apps\" at the cluster scope");
        let err = authorize(&bob, &Action::Path { verb: "get", path: "/metrics" }, &Graph, None, &PolicyIndex::default()).unwrap_err();
        assert_eq!(err, "User \"bob\" cannot get path \"/metrics\"");
    }

    #[test]
    fn a_pod_uses_the_secrets_config_maps_and_claims_it_names() {
        let pod = json!({"spec": {
            "volumes": [{"name": "v", "secret": {"secretName": "s1"}}, {"name": "c", "configMap": {"name": "cm1"}},
                        {"name": "p", "persistentVolumeClaim": {"claimName": "data"}},
                        {"name": "j", "projected": {"sources": [{"secret": {"name": "s4"}}, {"configMap": {"name": "cm2"}}]}}],
            "imagePullSecrets": [{"name": "pull"}],
            "containers": [{"name": "a", "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "s2", "key": "k"}}},
                                                 {"name": "Y", "valueFrom": {"configMapKeyRef": {"name": "cm3", "key": "k"}}}]}],
            "initContainers": [{"name": "i", "envFrom": [{"secretRef": {"name": "s3"}}, {"configMapRef": {"name": "cm1"}}]}],
            "ephemeralContainers": [{"name": "e", "envFrom": [{"secretRef": {"name": "s5"}}]}]}});
        let uses = pod_uses(&pod);
        let want: Vec<(&str, String)> = [
            ("configmaps", "cm1"), ("configmaps", "cm2"), ("configmaps", "cm3"), ("persistentvolumeclaims", "data"),
            ("secrets", "pull"), ("secrets", "s1"), ("secrets", "s2"), ("secrets", "s3"), ("secrets", "s4"), ("secrets", "s5"),
        ]
        .iter()
        .map(|(r, n)| (*r, n.to_string()))
        .collect();
        assert_eq!(uses, want);
        assert!(pod_uses(&json!({})).is_empty());
        assert!(pod_uses(&json!({"spec": {"volumes": [{"name": "x", "secret": {"secretName": ""}}], "containers": "nonsense"}})).is_empty());
    }

    #[test]
    fn the_chain_is_masters_then_node_then_rbac() {
        let mut ix = PolicyIndex::default();
        ix.set_cluster_role("secrets", vec![Rule::resource(&["get"], &[""], &["secrets"])]);
        ix.set_binding(Binding::from_json(&json!({"metadata": {"name": "nodes-secrets"}, "roleRef": {"kind": "ClusterRole", "name": "secrets"},
            "subjects": [{"kind": "Group", "name": "granted"}]})));
        let a = || Action::Resource(attrs("get", "", "secrets", "", "default", "other"));
        // the node rules have no opinion on a secret no pod of the node uses: RBAC decides
        let n = node();
        let d = decide(&n, &a(), &Graph, None, &ix);
        assert_eq!(d, Decision { allowed: false, reason: "no relationship found between node 'n1' and this object".into() });
        assert_eq!(
            authorize(&n, &a(), &Graph, None, &ix).unwrap_err(),
            "User \"system:node:n1\" cannot get resource \"secrets\" in API group \"\" in the namespace \"default\": no relationship found between node 'n1' and this object"
        );
        let granted = User { groups: vec!["system:nodes".into(), "granted".into()], ..node() };
        let d = decide(&granted, &a(), &Graph, None, &ix);
        assert!(d.allowed);
        assert_eq!(d.reason, "RBAC: allowed by ClusterRoleBinding \"nodes-secrets\" of ClusterRole \"secrets\" to Group \"granted\"");
        // delegated authentication and authorization for nodes
        assert!(check(&n, attrs("create", "authorization.k8s.io", "subjectaccessreviews", "", "", ""), None).is_ok());
        assert!(check(&n, attrs("create", "authentication.k8s.io", "tokenreviews", "", "", ""), None).is_ok());
    }

    #[test]
    fn nodes_may_not_give_themselves_restricted_labels() {
        assert!(node_may_not_set_label("node-role.kubernetes.io/control-plane"));
        assert!(node_may_not_set_label("node-restriction.kubernetes.io/trusted"));
        assert!(node_may_not_set_label("example.k8s.io/x"));
        assert!(!node_may_not_set_label("kubernetes.io/hostname"));
        assert!(!node_may_not_set_label("topology.kubernetes.io/zone"));
        assert!(!node_may_not_set_label("node.kubernetes.io/exclude-from-external-load-balancers"));
        assert!(!node_may_not_set_label("kubelet.kubernetes.io/x"));
        assert!(!node_may_not_set_label("topology.loop.csi.ferro.dev/node"));
        assert!(!node_may_not_set_label("plain"));
        let old = serde_json::json!({"metadata": {"labels": {"node-role.kubernetes.io/worker": "", "kubernetes.io/os": "linux"}}});
        // kept as they were: allowed; changed, added or removed: listed
        assert!(node_label_changes(Some(&old), &old).is_empty());
        let new = serde_json::json!({"metadata": {"labels": {"kubernetes.io/os": "windows", "node-role.kubernetes.io/control-plane": ""}}});
        assert_eq!(node_label_changes(Some(&old), &new), ["node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/worker"]);
        assert_eq!(node_label_changes(None, &new), ["node-role.kubernetes.io/control-plane"]);
    }

    #[test]
    fn node_rules() {
        let n = node();
        let ok = |a: Attributes<'_>, body: Option<&Value>| check(&n, a, body).is_ok();
        assert!(ok(attrs("update", "", "nodes", "status", "", "n1"), None));
        assert!(ok(attrs("patch", "", "nodes", "", "", "n1"), None));
        assert!(!ok(attrs("patch", "", "nodes", "status", "", "n2"), None));
        assert!(ok(attrs("create", "", "nodes", "", "", ""), Some(&json!({"metadata":{"name":"n1"}}))));
        assert!(!ok(attrs("create", "", "nodes", "", "", ""), Some(&json!({"metadata":{"name":"n2"}}))));
        assert!(!ok(attrs("delete", "", "nodes", "", "", "n1"), None));
        assert!(ok(attrs("update", "coordination.k8s.io", "leases", "", "kube-node-lease", "n1"), None));
        assert!(!ok(attrs("update", "coordination.k8s.io", "leases", "", "kube-node-lease", "n2"), None));
        assert!(!ok(attrs("update", "coordination.k8s.io", "leases", "", "default", "n1"), None));
        assert!(ok(attrs("patch", "", "pods", "status", "default", "mine"), None));
        assert!(!ok(attrs("patch", "", "pods", "status", "default", "theirs"), None));
        assert!(!ok(attrs("update", "", "pods", "", "default", "mine"), None));
        assert!(ok(attrs("delete", "", "pods", "", "default", "mine"), None));
        assert!(!ok(attrs("delete", "", "pods", "", "default", "theirs"), None));
        assert!(ok(attrs("list", "", "pods", "", "", ""), None));
        assert!(ok(attrs("get", "", "secrets", "", "default", "used"), None));
        assert!(!ok(attrs("get", "", "secrets", "", "default", "other"), None));
        assert!(!ok(attrs("list", "", "secrets", "", "default", ""), None));
        assert!(!ok(attrs("watch", "", "secrets", "", "default", ""), None));
        // a list or watch naming one object (its field selector's metadata.name)
        assert!(ok(attrs("watch", "", "secrets", "", "default", "used"), None));
        assert!(ok(attrs("list", "", "secrets", "", "default", "used"), None));
        assert!(!ok(attrs("watch", "", "secrets", "", "default", "other"), None));
        assert!(ok(attrs("watch", "", "configmaps", "", "default", "used"), None));
        assert!(!ok(attrs("watch", "", "persistentvolumeclaims", "", "default", "used"), None));
        assert!(!ok(attrs("delete", "", "secrets", "", "default", "used"), None));
        assert!(!ok(attrs("create", "", "services", "", "default", ""), None));
        assert!(!ok(attrs("update", "apps", "deployments", "", "default", "d"), None));
        assert!(ok(attrs("create", "", "events", "", "default", ""), None));
        let mirror = json!({"metadata":{"annotations":{"kubernetes.io/config.mirror":"x"}},"spec":{"nodeName":"n1"}});
        assert!(ok(attrs("create", "", "pods", "", "default", ""), Some(&mirror)));
        assert!(!ok(attrs("create", "", "pods", "", "default", ""), Some(&json!({"spec":{"nodeName":"n1"}}))));
        // not a node without the group
        let fake = User { name: "system:node:n1".into(), groups: vec![] };
        assert!(check(&fake, attrs("get", "", "pods", "", "", ""), None).is_err());
    }

    #[test]
    fn review_paths() {
        assert_eq!(Review::of_path("/apis/authentication.k8s.io/v1/tokenreviews"), Some(Review::Token));
        assert_eq!(Review::of_path("/apis/authorization.k8s.io/v1/subjectaccessreviews/"), Some(Review::SubjectAccess));
        assert_eq!(Review::of_path("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"), Some(Review::SelfSubjectAccess));
        assert_eq!(Review::of_path("/apis/authentication.k8s.io/v1/selfsubjectreviews"), Some(Review::SelfSubject));
        assert_eq!(Review::of_path("/apis/authorization.k8s.io/v1/selfsubjectrulesreviews"), Some(Review::SelfSubjectRules));
        assert_eq!(Review::of_path("/apis/authorization.k8s.io/v1/localsubjectaccessreviews"), None);
    }

    #[test]
    fn self_reviews_answer_for_the_requester() {
        let jane = User { name: "jane".into(), groups: vec!["dev".into(), "system:authenticated".into()] };
        assert_eq!(self_subject_review(&jane)["status"]["userInfo"], json!({"username": "jane", "groups": ["dev", "system:authenticated"]}));
        let ask = json!({"spec": {"resourceAttributes": {"verb": "list", "resource": "pods", "namespace": "default"}}});
        let ix = PolicyIndex::default();
        let out = self_subject_access_review(&jane, &ask, &Graph, &ix).unwrap();
        assert_eq!(out["status"]["allowed"], false);
        assert_eq!(out["spec"], ask["spec"], "the answer repeats the question, not the user filled in");
        let admin = User { name: "admin".into(), groups: vec!["system:masters".into()] };
        assert_eq!(self_subject_access_review(&admin, &ask, &Graph, &ix).unwrap()["status"]["allowed"], true);
    }

    #[test]
    fn token_review_answers_from_the_static_tokens() {
        let tokens = Tokens::parse("secret,admin,1,\"system:masters\"\n", "t").unwrap();
        let review = serde_json::json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "spec": {"token": "secret", "audiences": ["https://ferro"]}});
        let out = token_review(&tokens, &review).unwrap();
        assert_eq!(out["status"]["authenticated"], true);
        assert_eq!(out["status"]["user"]["username"], "admin");
        assert_eq!(out["status"]["user"]["groups"], serde_json::json!(["system:masters", "system:authenticated"]));
        assert_eq!(out["status"]["audiences"], serde_json::json!(["https://ferro"]));
        assert_eq!(out["spec"], review["spec"]);
        let out = token_review(&tokens, &serde_json::json!({"spec": {"token": "wrong"}})).unwrap();
        assert!(out["status"].get("authenticated").is_none(), "{out}");
        assert!(token_review(&tokens, &serde_json::json!({"spec": {}})).unwrap_err().contains("spec.token"));
    }

    #[test]
    fn subject_access_review_uses_the_authorizer() {
        let mut ix = PolicyIndex::default();
        ix.set_cluster_role("metrics", vec![Rule::urls(&["get"], &["/metrics"])]);
        ix.set_binding(Binding::from_json(&json!({"metadata": {"name": "m"}, "roleRef": {"kind": "ClusterRole", "name": "metrics"},
            "subjects": [{"kind": "Group", "name": "system:monitoring"}]})));
        let sar = |spec: Value| subject_access_review(&serde_json::json!({"spec": spec}), &Graph, &ix);
        let nodes_proxy = |user: &str, groups: Value| {
            sar(serde_json::json!({"user": user, "groups": groups,
                "resourceAttributes": {"verb": "get", "resource": "nodes", "subresource": "proxy", "name": "n1"}}))
            .unwrap()
        };
        let out = nodes_proxy("admin", serde_json::json!(["system:masters"]));
        assert_eq!(out["status"]["allowed"], true, "{out}");
        let out = nodes_proxy("jane", serde_json::json!([]));
        assert_eq!(out["status"], json!({"allowed": false}), "no reason without one");
        // A node may read its own Node object but not use another node's proxy.
        let out = sar(serde_json::json!({"user": "system:node:n1", "groups": ["system:nodes"],
            "resourceAttributes": {"verb": "get", "resource": "nodes", "name": "n1"}}))
        .unwrap();
        assert_eq!(out["status"]["allowed"], true, "{out}");
        let out = nodes_proxy("system:node:n1", serde_json::json!(["system:nodes"]));
        assert_eq!(out["status"]["allowed"], false, "{out}");
        // Non-resource paths: the admin, and RBAC's nonResourceURLs rules.
        let out = sar(serde_json::json!({"user": "admin", "groups": ["system:masters"],
            "nonResourceAttributes": {"verb": "get", "path": "/metrics"}}))
        .unwrap();
        assert_eq!(out["status"]["allowed"], true);
        let out = sar(serde_json::json!({"user": "jane", "nonResourceAttributes": {"verb": "get", "path": "/metrics"}})).unwrap();
        assert_eq!(out["status"]["allowed"], false);
        let out = sar(serde_json::json!({"user": "prom", "groups": ["system:monitoring"], "nonResourceAttributes": {"verb": "get", "path": "/metrics"}})).unwrap();
        assert_eq!(out["status"], json!({"allowed": true, "reason": "RBAC: allowed by ClusterRoleBinding \"m\" of ClusterRole \"metrics\" to Group \"system:monitoring\""}));
        // Bad input.
        assert!(sar(serde_json::json!({"resourceAttributes": {"verb": "get"}})).unwrap_err().contains("user or group"));
        assert!(sar(serde_json::json!({"user": "a"})).unwrap_err().contains("exactly one"));
        assert!(sar(serde_json::json!({"user": "a", "resourceAttributes": {}, "nonResourceAttributes": {}}))
            .unwrap_err()
            .contains("mutually exclusive"));
        assert!(subject_access_review(&serde_json::json!({}), &Graph, &ix).unwrap_err().contains("spec"));
    }

}
