//! Defaulting and validation of Role, ClusterRole, RoleBinding and ClusterRoleBinding as
//! upstream's (`pkg/apis/rbac/v1/defaults.go`, `pkg/apis/rbac/validation`), with its messages.
//! Names are checked by the caller (`strategy.rs`) as path segments (upstream's
//! ValidateRBACName).

use serde_json::{json, Value};

use super::GROUP;
use crate::validation::{go_quote, FieldError, FieldErrorKind};

/// Upstream's v1 defaults: a binding's roleRef.apiGroup, and the apiGroup of User and Group
/// subjects, default to rbac.authorization.k8s.io.
pub fn apply_defaults(plural: &str, obj: &mut Value) {
    if !matches!(plural, "rolebindings" | "clusterrolebindings") {
        return;
    }
    if let Some(r) = obj.get_mut("roleRef").and_then(Value::as_object_mut) {
        if r.get("apiGroup").and_then(Value::as_str).unwrap_or("").is_empty() {
            r.insert("apiGroup".into(), json!(GROUP));
        }
    }
    if let Some(subjects) = obj.get_mut("subjects").and_then(Value::as_array_mut) {
        for s in subjects.iter_mut().filter_map(Value::as_object_mut) {
            let kind = s.get("kind").and_then(Value::as_str).unwrap_or("");
            if matches!(kind, "User" | "Group") && s.get("apiGroup").and_then(Value::as_str).unwrap_or("").is_empty() {
                s.insert("apiGroup".into(), json!(GROUP));
            }
        }
    }
}

/// An Invalid error whose value upstream prints with Go's `%#v` (a struct or a slice).
fn invalid_go(field: String, go_value: String, detail: &str) -> FieldError {
    FieldError { kind: FieldErrorKind::Invalid, field, value: None, detail: format!("{go_value}: {detail}") }
}

/// Go's `%#v` of a []string.
fn go_strings(v: &[String]) -> String {
    let items: Vec<String> = v.iter().map(|s| go_quote(s)).collect();
    format!("[]string{{{}}}", items.join(", "))
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array).map(|a| a.iter().filter_map(|x| x.as_str().map(str::to_string)).collect()).unwrap_or_default()
}

fn str_of<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or("")
}

/// Upstream's ValidatePolicyRule.
fn validate_rule(rule: &Value, namespaced: bool, path: &str, errs: &mut Vec<FieldError>) {
    let verbs = strings(rule.get("verbs"));
    let groups = strings(rule.get("apiGroups"));
    let resources = strings(rule.get("resources"));
    let names = strings(rule.get("resourceNames"));
    let urls = strings(rule.get("nonResourceURLs"));
    if verbs.is_empty() {
        errs.push(FieldError::required(format!("{path}.verbs"), "verbs must contain at least one value"));
    }
    if !urls.is_empty() {
        if namespaced {
            errs.push(invalid_go(format!("{path}.nonResourceURLs"), go_strings(&urls), "namespaced rules cannot apply to non-resource URLs"));
        }
        if !groups.is_empty() || !resources.is_empty() || !names.is_empty() {
            errs.push(invalid_go(
                format!("{path}.nonResourceURLs"),
                go_strings(&urls),
                "rules cannot apply to both regular resources and non-resource URLs",
            ));
        }
        return;
    }
    if groups.is_empty() {
        errs.push(FieldError::required(format!("{path}.apiGroups"), "resource rules must supply at least one api group"));
    }
    if resources.is_empty() {
        errs.push(FieldError::required(format!("{path}.resources"), "resource rules must supply at least one resource"));
    }
}

/// Upstream's ValidateRoleBindingSubject.
fn validate_subject(s: &Value, namespaced: bool, path: &str, errs: &mut Vec<FieldError>) {
    let name = str_of(s, "/name");
    let api_group = str_of(s, "/apiGroup");
    if name.is_empty() {
        errs.push(FieldError::required(format!("{path}.name"), ""));
    }
    match str_of(s, "/kind") {
        "ServiceAccount" => {
            if !name.is_empty() {
                for msg in crate::validation::dns1123_subdomain(name) {
                    errs.push(FieldError::invalid(format!("{path}.name"), json!(name), msg));
                }
            }
            if !api_group.is_empty() {
                errs.push(FieldError::not_supported(format!("{path}.apiGroup"), json!(api_group), &[""]));
            }
            if !namespaced && str_of(s, "/namespace").is_empty() {
                errs.push(FieldError::required(format!("{path}.namespace"), ""));
            }
        }
        "User" | "Group" => {
            if api_group != GROUP {
                errs.push(FieldError::not_supported(format!("{path}.apiGroup"), json!(api_group), &[GROUP]));
            }
        }
        other => errs.push(FieldError::not_supported(format!("{path}.kind"), json!(other), &["ServiceAccount", "User", "Group"])),
    }
}

/// Upstream's ValidateRole / ValidateClusterRole / ValidateRoleBinding /
/// ValidateClusterRoleBinding, metadata aside.
pub fn validate(plural: &str, obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    match plural {
        "roles" | "clusterroles" => {
            let namespaced = plural == "roles";
            for (i, rule) in obj.get("rules").and_then(Value::as_array).into_iter().flatten().enumerate() {
                validate_rule(rule, namespaced, &format!("rules[{i}]"), &mut errs);
            }
            if let Some(agg) = obj.get("aggregationRule").filter(|a| !a.is_null() && !namespaced) {
                let selectors = agg.get("clusterRoleSelectors").and_then(Value::as_array).cloned().unwrap_or_default();
                if selectors.is_empty() {
                    errs.push(FieldError::required(
                        "aggregationRule.clusterRoleSelectors",
                        "at least one clusterRoleSelector required if aggregationRule is non-nil",
                    ));
                }
                for (i, sel) in selectors.iter().enumerate() {
                    let parsed = serde_json::from_value::<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>(sel.clone())
                        .map_err(|e| e.to_string())
                        .and_then(|s| crate::selector::LabelSelector::from_api(&s).map_err(|e| e.to_string()));
                    if let Err(e) = parsed {
                        errs.push(FieldError::invalid(format!("aggregationRule.clusterRoleSelectors[{i}]"), sel.clone(), format!("invalid label selector: {e}")));
                    }
                }
            }
        }
        "rolebindings" | "clusterrolebindings" => {
            let namespaced = plural == "rolebindings";
            let api_group = str_of(obj, "/roleRef/apiGroup");
            if api_group != GROUP {
                errs.push(FieldError::not_supported("roleRef.apiGroup", json!(api_group), &[GROUP]));
            }
            let kind = str_of(obj, "/roleRef/kind");
            let kinds: &[&str] = if namespaced { &["Role", "ClusterRole"] } else { &["ClusterRole"] };
            if !kinds.contains(&kind) {
                errs.push(FieldError::not_supported("roleRef.kind", json!(kind), kinds));
            }
            let name = str_of(obj, "/roleRef/name");
            if name.is_empty() {
                errs.push(FieldError::required("roleRef.name", ""));
            } else {
                for msg in crate::validation::path_segment_name(name) {
                    errs.push(FieldError::invalid("roleRef.name", json!(name), msg));
                }
            }
            for (i, s) in obj.get("subjects").and_then(Value::as_array).into_iter().flatten().enumerate() {
                validate_subject(s, namespaced, &format!("subjects[{i}]"), &mut errs);
            }
        }
        _ => {}
    }
    errs
}

/// A binding's roleRef may not change (upstream: delete and recreate the binding).
pub fn validate_update(plural: &str, old: &Value, new: &Value) -> Vec<FieldError> {
    if !matches!(plural, "rolebindings" | "clusterrolebindings") {
        return Vec::new();
    }
    let role_ref = |v: &Value| (str_of(v, "/roleRef/apiGroup").to_string(), str_of(v, "/roleRef/kind").to_string(), str_of(v, "/roleRef/name").to_string());
    let (g, k, n) = role_ref(new);
    if role_ref(old) != (g.clone(), k.clone(), n.clone()) {
        let shown = format!("rbac.RoleRef{{APIGroup:{}, Kind:{}, Name:{}}}", go_quote(&g), go_quote(&k), go_quote(&n));
        return vec![invalid_go("roleRef".into(), shown, "cannot change roleRef")];
    }
    Vec::new()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn messages(errs: &[FieldError]) -> Vec<String> {
        errs.iter().map(FieldError::message).collect()
    }

    #[test]
    fn rules_need_verbs_and_keep_urls_to_cluster_roles() {
        let role = json!({"rules": [{"apiGroups": [""], "resources": ["pods"]}, {"verbs": ["get"], "nonResourceURLs": ["/healthz"]},
            {"verbs": ["get"]}, {"verbs": ["get"], "apiGroups": [""], "nonResourceURLs": ["/x"]}]});
        assert_eq!(
            messages(&validate("roles", &role)),
            [
                "rules[0].verbs: Required value: verbs must contain at least one value",
                "rules[1].nonResourceURLs: Invalid value: []string{\"/healthz\"}: namespaced rules cannot apply to non-resource URLs",
                "rules[2].apiGroups: Required value: resource rules must supply at least one api group",
                "rules[2].resources: Required value: resource rules must supply at least one resource",
                "rules[3].nonResourceURLs: Invalid value: []string{\"/x\"}: namespaced rules cannot apply to non-resource URLs",
                "rules[3].nonResourceURLs: Invalid value: []string{\"/x\"}: rules cannot apply to both regular resources and non-resource URLs",
            ]
        );
        let cluster = json!({"rules": [{"verbs": ["get"], "nonResourceURLs": ["/healthz", "/version"]}]});
        assert!(validate("clusterroles", &cluster).is_empty());
        let agg = json!({"aggregationRule": {"clusterRoleSelectors": []}});
        assert_eq!(
            messages(&validate("clusterroles", &agg)),
            ["aggregationRule.clusterRoleSelectors: Required value: at least one clusterRoleSelector required if aggregationRule is non-nil"]
        );
        let bad = json!({"aggregationRule": {"clusterRoleSelectors": [{"matchExpressions": [{"key": "a", "operator": "Near"}]}]}});
        assert_eq!(validate("clusterroles", &bad)[0].field, "aggregationRule.clusterRoleSelectors[0]");
        let good = json!({"aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"rbac.example.com/aggregate-to-x": "true"}}]}});
        assert!(validate("clusterroles", &good).is_empty());
    }

    #[test]
    fn bindings_as_upstream() {
        let mut rb = json!({"roleRef": {"kind": "ClusterRole", "name": "view"},
            "subjects": [{"kind": "User", "name": "bob"}, {"kind": "ServiceAccount", "name": "ci"}, {"kind": "Group", "name": "g", "apiGroup": "x"}]});
        apply_defaults("rolebindings", &mut rb);
        assert_eq!(rb["roleRef"]["apiGroup"], GROUP);
        assert_eq!(rb["subjects"][0]["apiGroup"], GROUP);
        assert!(rb["subjects"][1].get("apiGroup").is_none());
        assert_eq!(messages(&validate("rolebindings", &rb)), ["subjects[2].apiGroup: Unsupported value: \"x\": supported values: \"rbac.authorization.k8s.io\""]);
        // a cluster binding: ClusterRole only, service accounts with their namespace
        let crb = json!({"roleRef": {"apiGroup": GROUP, "kind": "Role", "name": "r"},
            "subjects": [{"kind": "ServiceAccount", "name": "ci"}, {"kind": "Robot", "name": "r2"}, {"kind": "User", "name": ""}]});
        assert_eq!(
            messages(&validate("clusterrolebindings", &crb)),
            [
                "roleRef.kind: Unsupported value: \"Role\": supported values: \"ClusterRole\"",
                "subjects[0].namespace: Required value",
                "subjects[1].kind: Unsupported value: \"Robot\": supported values: \"ServiceAccount\", \"User\", \"Group\"",
                "subjects[2].name: Required value",
                "subjects[2].apiGroup: Unsupported value: \"\": supported values: \"rbac.authorization.k8s.io\"",
            ]
        );
        let missing = json!({"roleRef": {"apiGroup": "", "kind": "", "name": ""}});
        assert_eq!(
            messages(&validate("rolebindings", &missing)),
            [
                "roleRef.apiGroup: Unsupported value: \"\": supported values: \"rbac.authorization.k8s.io\"",
                "roleRef.kind: Unsupported value: \"\": supported values: \"Role\", \"ClusterRole\"",
                "roleRef.name: Required value",
            ]
        );
        let slash = json!({"roleRef": {"apiGroup": GROUP, "kind": "Role", "name": "a/b"}});
        assert_eq!(messages(&validate("rolebindings", &slash)), ["roleRef.name: Invalid value: \"a/b\": may not contain '/'"]);
    }

    #[test]
    fn the_role_ref_is_immutable() {
        let old = json!({"roleRef": {"apiGroup": GROUP, "kind": "ClusterRole", "name": "view"}});
        let new = json!({"roleRef": {"apiGroup": GROUP, "kind": "ClusterRole", "name": "edit"}});
        assert_eq!(
            messages(&validate_update("rolebindings", &old, &new)),
            ["roleRef: Invalid value: rbac.RoleRef{APIGroup:\"rbac.authorization.k8s.io\", Kind:\"ClusterRole\", Name:\"edit\"}: cannot change roleRef"]
        );
        assert!(validate_update("rolebindings", &old, &old).is_empty());
        assert!(validate_update("clusterroles", &old, &new).is_empty());
    }
}
