//! Policy rules and upstream's semantics for them: whether a rule allows a request
//! (`RuleAllows`), whether one set of rules covers another (the escalation check's `Covers`),
//! and the compact form escalation errors list missing rules in (`CompactRules`,
//! `CompactString`). Pure functions, no allocation on the matching path.

use serde::{Deserialize, Deserializer, Serialize};

/// `*` in verbs, apiGroups, resources and nonResourceURLs.
pub const ALL: &str = "*";

/// An rbac.authorization.k8s.io/v1 PolicyRule.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rule {
    #[serde(default, deserialize_with = "nullable")]
    pub verbs: Vec<String>,
    #[serde(default, deserialize_with = "nullable", skip_serializing_if = "Vec::is_empty")]
    pub api_groups: Vec<String>,
    #[serde(default, deserialize_with = "nullable", skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<String>,
    #[serde(default, deserialize_with = "nullable", skip_serializing_if = "Vec::is_empty")]
    pub resource_names: Vec<String>,
    #[serde(rename = "nonResourceURLs", default, deserialize_with = "nullable", skip_serializing_if = "Vec::is_empty")]
    pub non_resource_urls: Vec<String>,
}

/// A list that may be written as `null` (Go's nil slice).
fn nullable<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    Ok(Option::<Vec<String>>::deserialize(d)?.unwrap_or_default())
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

impl Rule {
    /// A resource rule (tests and the bootstrap data's helpers).
    pub fn resource(verbs: &[&str], groups: &[&str], resources: &[&str]) -> Rule {
        Rule { verbs: strings(verbs), api_groups: strings(groups), resources: strings(resources), ..Rule::default() }
    }

    pub fn named(mut self, names: &[&str]) -> Rule {
        self.resource_names = strings(names);
        self
    }

    /// A non-resource rule.
    pub fn urls(verbs: &[&str], urls: &[&str]) -> Rule {
        Rule { verbs: strings(verbs), non_resource_urls: strings(urls), ..Rule::default() }
    }

    pub fn verb_matches(&self, verb: &str) -> bool {
        self.verbs.iter().any(|v| v == ALL || v == verb)
    }

    pub fn group_matches(&self, group: &str) -> bool {
        self.api_groups.iter().any(|g| g == ALL || g == group)
    }

    /// `resource` with `subresource` ("pods" + "log"): a rule's `*`, the combined name
    /// ("pods/log"), or `*/log` for any resource's subresource of that name.
    pub fn resource_matches(&self, resource: &str, subresource: &str) -> bool {
        self.resources.iter().any(|r| {
            if r == ALL {
                return true;
            }
            if subresource.is_empty() {
                return r == resource;
            }
            match r.split_once('/') {
                Some((res, sub)) => sub == subresource && (res == resource || res == ALL),
                None => false,
            }
        })
    }

    /// No resourceNames: any name (also none, as for list and create); otherwise the
    /// request's name must be listed.
    pub fn name_matches(&self, name: &str) -> bool {
        self.resource_names.is_empty() || self.resource_names.iter().any(|n| n == name)
    }

    /// `*`, the exact path, or a prefix ending in `*` ("/healthz/*", "/apis*").
    pub fn url_matches(&self, path: &str) -> bool {
        self.non_resource_urls.iter().any(|u| url_covers(u, path) || u == ALL)
    }

    /// Upstream's RuleAllows for a resource request.
    pub fn allows_resource(&self, verb: &str, group: &str, resource: &str, subresource: &str, name: &str) -> bool {
        self.verb_matches(verb)
            && self.group_matches(group)
            && self.resource_matches(resource, subresource)
            && self.name_matches(name)
    }

    /// Upstream's RuleAllows for a non-resource request.
    pub fn allows_path(&self, verb: &str, path: &str) -> bool {
        self.verb_matches(verb) && self.url_matches(path)
    }

    /// Upstream's CompactString, the form escalation errors list rules in:
    /// `{APIGroups:["apps"], Resources:["deployments"], Verbs:["get" "list"]}`.
    pub fn compact_string(&self) -> String {
        let q = |v: &[String]| -> String {
            let parts: Vec<String> = v.iter().map(|s| k8s_semantics::go_quote(s)).collect();
            format!("[{}]", parts.join(" "))
        };
        let mut parts = Vec::new();
        if !self.api_groups.is_empty() {
            parts.push(format!("APIGroups:{}", q(&self.api_groups)));
        }
        if !self.resources.is_empty() {
            parts.push(format!("Resources:{}", q(&self.resources)));
        }
        if !self.non_resource_urls.is_empty() {
            parts.push(format!("NonResourceURLs:{}", q(&self.non_resource_urls)));
        }
        if !self.resource_names.is_empty() {
            parts.push(format!("ResourceNames:{}", q(&self.resource_names)));
        }
        if !self.verbs.is_empty() {
            parts.push(format!("Verbs:{}", q(&self.verbs)));
        }
        format!("{{{}}}", parts.join(", "))
    }
}

fn url_covers(owner: &str, path: &str) -> bool {
    owner == path || (owner.ends_with('*') && path.starts_with(owner.trim_end_matches('*')))
}

fn has(set: &[String], x: &str) -> bool {
    set.iter().any(|s| s == x)
}

/// The rule split into rules of one verb, one group, one resource and at most one name (and
/// one verb per non-resource URL): each is then covered by a single owner rule or not at all.
fn breakdown(rule: &Rule) -> Vec<Rule> {
    let mut out = Vec::new();
    for group in &rule.api_groups {
        for resource in &rule.resources {
            for verb in &rule.verbs {
                let one = Rule {
                    verbs: vec![verb.clone()],
                    api_groups: vec![group.clone()],
                    resources: vec![resource.clone()],
                    ..Rule::default()
                };
                if rule.resource_names.is_empty() {
                    out.push(one);
                } else {
                    for name in &rule.resource_names {
                        out.push(Rule { resource_names: vec![name.clone()], ..one.clone() });
                    }
                }
            }
        }
    }
    for url in &rule.non_resource_urls {
        for verb in &rule.verbs {
            out.push(Rule { verbs: vec![verb.clone()], non_resource_urls: vec![url.clone()], ..Rule::default() });
        }
    }
    out
}

/// Whether the owner's resources cover every one of `wanted`: `*`, the same name, or
/// `*/<subresource>` for a subresource.
fn resources_cover(owner: &[String], wanted: &[String]) -> bool {
    if has(owner, ALL) {
        return true;
    }
    wanted.iter().all(|w| {
        has(owner, w)
            || w.split_once('/').is_some_and(|(_, sub)| owner.iter().any(|o| o.strip_prefix("*/") == Some(sub)))
    })
}

/// Whether one owner rule covers one broken-down rule (upstream's ruleCovers).
fn rule_covers(owner: &Rule, sub: &Rule) -> bool {
    let verbs = has(&owner.verbs, ALL) || sub.verbs.iter().all(|v| has(&owner.verbs, v));
    let groups = has(&owner.api_groups, ALL) || sub.api_groups.iter().all(|g| has(&owner.api_groups, g));
    let resources = resources_cover(&owner.resources, &sub.resources);
    let urls = sub.non_resource_urls.iter().all(|p| owner.non_resource_urls.iter().any(|o| url_covers(o, p)));
    let names = if sub.resource_names.is_empty() {
        owner.resource_names.is_empty()
    } else {
        owner.resource_names.is_empty() || sub.resource_names.iter().all(|n| has(&owner.resource_names, n))
    };
    verbs && groups && resources && urls && names
}

/// Upstream's Covers: whether `owner` rules allow everything `servant` rules do, and the
/// broken-down rules they do not.
pub fn covers(owner: &[Rule], servant: &[Rule]) -> (bool, Vec<Rule>) {
    let missing: Vec<Rule> = servant
        .iter()
        .flat_map(breakdown)
        .filter(|sub| !owner.iter().any(|o| rule_covers(o, sub)))
        .collect();
    (missing.is_empty(), missing)
}

/// Upstream's CompactRules: rules of one group and one resource and nothing but verbs are
/// merged (verbs appended in order); the others stay as they are.
pub fn compact(rules: &[Rule]) -> Vec<Rule> {
    let mut out: Vec<Rule> = Vec::new();
    let mut simple: Vec<Rule> = Vec::new();
    for r in rules {
        let is_simple = r.resource_names.is_empty()
            && r.non_resource_urls.is_empty()
            && r.api_groups.len() == 1
            && r.resources.len() == 1;
        if !is_simple {
            out.push(r.clone());
            continue;
        }
        match simple.iter_mut().find(|s| s.api_groups == r.api_groups && s.resources == r.resources) {
            Some(s) => s.verbs.extend(r.verbs.iter().cloned()),
            None => simple.push(r.clone()),
        }
    }
    out.extend(simple);
    out
}

/// The text of an escalation refusal's missing rules: compacted, one per line, sorted and
/// without duplicates (upstream's sets.NewString(...).List()).
pub fn describe_missing(missing: &[Rule]) -> String {
    let set: std::collections::BTreeSet<String> = compact(missing).iter().map(Rule::compact_string).collect();
    set.into_iter().collect::<Vec<_>>().join("\n")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn verbs_groups_and_wildcards() {
        let r = Rule::resource(&["get", "list"], &["", "apps"], &["pods", "deployments"]);
        assert!(r.allows_resource("get", "", "pods", "", "p"));
        assert!(r.allows_resource("list", "apps", "deployments", "", ""));
        assert!(!r.allows_resource("delete", "", "pods", "", "p"));
        assert!(!r.allows_resource("get", "batch", "pods", "", "p"));
        assert!(!r.allows_resource("get", "", "services", "", "s"));
        let all = Rule::resource(&["*"], &["*"], &["*"]);
        assert!(all.allows_resource("escalate", "rbac.authorization.k8s.io", "clusterroles", "", "x"));
        assert!(all.allows_resource("get", "", "pods", "log", "p"), "* covers subresources");
        // `*` is not a prefix match for verbs or groups
        assert!(!Rule::resource(&["get*"], &["*"], &["*"]).allows_resource("get", "", "pods", "", ""));
    }

    #[test]
    fn subresources() {
        let r = Rule::resource(&["get"], &[""], &["pods/log"]);
        assert!(r.allows_resource("get", "", "pods", "log", "p"));
        assert!(!r.allows_resource("get", "", "pods", "", "p"), "the subresource does not give the resource");
        assert!(!r.allows_resource("get", "", "pods", "exec", "p"));
        let pods = Rule::resource(&["get"], &[""], &["pods"]);
        assert!(!pods.allows_resource("get", "", "pods", "log", "p"), "the resource does not give its subresources");
        let any_status = Rule::resource(&["update"], &["*"], &["*/status"]);
        assert!(any_status.allows_resource("update", "apps", "deployments", "status", "d"));
        assert!(any_status.allows_resource("update", "", "pods", "status", "p"));
        assert!(!any_status.allows_resource("update", "", "pods", "", "p"));
        assert!(!any_status.allows_resource("update", "", "pods", "binding", "p"));
        // a nested name is compared whole
        assert!(!Rule::resource(&["get"], &[""], &["pods/log/x"]).allows_resource("get", "", "pods", "log", "p"));
    }

    #[test]
    fn resource_names() {
        let r = Rule::resource(&["get", "update", "list"], &[""], &["configmaps"]).named(&["a", "b"]);
        assert!(r.allows_resource("get", "", "configmaps", "", "a"));
        assert!(r.allows_resource("update", "", "configmaps", "", "b"));
        assert!(!r.allows_resource("get", "", "configmaps", "", "c"));
        assert!(!r.allows_resource("list", "", "configmaps", "", ""), "a list has no name: names do not match it");
        assert!(Rule::resource(&["list"], &[""], &["configmaps"]).allows_resource("list", "", "configmaps", "", ""));
    }

    #[test]
    fn non_resource_urls() {
        let r = Rule::urls(&["get"], &["/healthz", "/apis/*", "/version"]);
        assert!(r.allows_path("get", "/healthz"));
        assert!(!r.allows_path("get", "/healthz/etcd"));
        assert!(r.allows_path("get", "/apis/apps/v1"));
        assert!(r.allows_path("get", "/apis/"));
        assert!(!r.allows_path("get", "/apis"), "the prefix keeps its slash");
        assert!(!r.allows_path("post", "/healthz"));
        assert!(Rule::urls(&["*"], &["*"]).allows_path("delete", "/anything"));
        assert!(Rule::urls(&["get"], &["/api*"]).allows_path("get", "/apis"));
        assert!(!Rule::resource(&["get"], &["*"], &["*"]).allows_path("get", "/healthz"), "resource rules do not match paths");
    }

    #[test]
    fn covers_breaks_rules_down() {
        let owner = vec![Rule::resource(&["get", "list"], &[""], &["pods", "services"]), Rule::urls(&["get"], &["/logs/*"])];
        assert!(covers(&owner, &[Rule::resource(&["get"], &[""], &["pods"])]).0);
        assert!(covers(&owner, &[Rule::resource(&["list"], &[""], &["pods", "services"])]).0);
        assert!(covers(&owner, &[Rule::resource(&["get"], &[""], &["pods"]).named(&["x"])]).0, "no names covers any name");
        assert!(covers(&owner, &[Rule::urls(&["get"], &["/logs/a"])]).0);
        let (ok, missing) = covers(&owner, &[Rule::resource(&["get", "delete"], &["", "apps"], &["pods"])]);
        assert!(!ok);
        assert_eq!(
            missing,
            vec![
                Rule::resource(&["delete"], &[""], &["pods"]),
                Rule::resource(&["get"], &["apps"], &["pods"]),
                Rule::resource(&["delete"], &["apps"], &["pods"]),
            ]
        );
        // names do not cover the nameless
        let named = vec![Rule::resource(&["get"], &[""], &["secrets"]).named(&["a"])];
        assert!(!covers(&named, &[Rule::resource(&["get"], &[""], &["secrets"])]).0);
        assert!(covers(&named, &[Rule::resource(&["get"], &[""], &["secrets"]).named(&["a"])]).0);
        // star subresources and the superuser
        let status = vec![Rule::resource(&["update"], &["*"], &["*/status"])];
        assert!(covers(&status, &[Rule::resource(&["update"], &["apps"], &["deployments/status"])]).0);
        assert!(!covers(&status, &[Rule::resource(&["update"], &["apps"], &["deployments"])]).0);
        let admin = vec![Rule::resource(&["*"], &["*"], &["*"]), Rule::urls(&["*"], &["*"])];
        assert!(covers(&admin, &[Rule::resource(&["escalate"], &["x"], &["y"]).named(&["z"]), Rule::urls(&["put"], &["/a"])]).0);
    }

    #[test]
    fn missing_rules_read_as_upstream_writes_them() {
        let (_, missing) = covers(&[], &[Rule::resource(&["get", "list"], &[""], &["pods"]), Rule::urls(&["get"], &["/metrics"])]);
        assert_eq!(
            describe_missing(&missing),
            "{APIGroups:[\"\"], Resources:[\"pods\"], Verbs:[\"get\" \"list\"]}\n{NonResourceURLs:[\"/metrics\"], Verbs:[\"get\"]}"
        );
        let (_, missing) = covers(&[], &[Rule::resource(&["get"], &["apps"], &["deployments"]).named(&["web"])]);
        assert_eq!(describe_missing(&missing), "{APIGroups:[\"apps\"], Resources:[\"deployments\"], ResourceNames:[\"web\"], Verbs:[\"get\"]}");
    }

    #[test]
    fn rules_read_from_json_with_nulls() {
        let r: Rule = serde_json::from_str(r#"{"verbs":["get"],"apiGroups":null,"resources":["pods"]}"#).unwrap();
        assert_eq!(r, Rule::resource(&["get"], &[], &["pods"]));
        assert_eq!(serde_json::to_string(&Rule::urls(&["get"], &["/x"])).unwrap(), r#"{"verbs":["get"],"nonResourceURLs":["/x"]}"#);
    }
}
