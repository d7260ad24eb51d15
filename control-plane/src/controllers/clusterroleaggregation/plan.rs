//! The pure part of the ClusterRole aggregation loop: which ClusterRoles a change concerns,
//! and the rules an aggregated ClusterRole must carry (upstream's
//! clusterrole-aggregation controller): the rules of every other ClusterRole that one of its
//! `aggregationRule.clusterRoleSelectors` selects, selector by selector, roles by name, each
//! rule once.

use std::sync::Arc;

use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};
use kube::ResourceExt as _;

use crate::selector::LabelSelector;

/// Every aggregated ClusterRole, whatever changed: a change to any ClusterRole (its labels,
/// its rules, its going) may change what any aggregated role gathers.
pub fn keys_for_cluster_role(all: &[Arc<ClusterRole>]) -> Vec<String> {
    all.iter().filter(|r| r.aggregation_rule.is_some()).map(|r| r.name_any()).collect()
}

/// A rule with absent lists read as empty ones (nil and [] are the same rule to upstream's
/// semantic equality).
fn normal(r: &PolicyRule) -> PolicyRule {
    let list = |v: &Option<Vec<String>>| Some(v.clone().unwrap_or_default()).filter(|v| !v.is_empty());
    PolicyRule {
        api_groups: list(&r.api_groups),
        non_resource_urls: list(&r.non_resource_urls),
        resource_names: list(&r.resource_names),
        resources: list(&r.resources),
        verbs: r.verbs.clone(),
    }
}

/// The rules `role` gathers from `all` (None for a role without an aggregation rule); Err
/// with the selector that does not parse.
pub fn gathered(role: &ClusterRole, all: &[Arc<ClusterRole>]) -> Option<Result<Vec<PolicyRule>, String>> {
    let rule = role.aggregation_rule.as_ref()?;
    let mut sorted: Vec<&Arc<ClusterRole>> = all.iter().collect();
    sorted.sort_by_key(|r| r.name_any());
    let mut out: Vec<PolicyRule> = Vec::new();
    for (i, sel) in rule.cluster_role_selectors.iter().flatten().enumerate() {
        let sel = match LabelSelector::from_api(sel) {
            Ok(s) => s,
            Err(e) => return Some(Err(format!("aggregationRule.clusterRoleSelectors[{i}]: {e}"))),
        };
        for other in sorted.iter().filter(|r| r.name_any() != role.name_any() && sel.matches(r.labels())) {
            for r in other.rules.iter().flatten() {
                let r = normal(r);
                if !out.contains(&r) {
                    out.push(r);
                }
            }
        }
    }
    Some(Ok(out))
}

/// The rules to write into `role`, or None when it has them already (or aggregates nothing).
pub fn plan(role: &ClusterRole, all: &[Arc<ClusterRole>]) -> Option<Result<Vec<PolicyRule>, String>> {
    match gathered(role, all)? {
        Err(e) => Some(Err(e)),
        Ok(want) => {
            let have: Vec<PolicyRule> = role.rules.iter().flatten().map(normal).collect();
            (have != want).then_some(Ok(want))
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::api::rbac::v1::AggregationRule;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector as ApiSelector;
    use kube::api::ObjectMeta;
    use std::collections::BTreeMap;

    fn role(name: &str, labels: &[(&str, &str)], rules: &[(&str, &str)], aggregates: Option<&[(&str, &str)]>) -> Arc<ClusterRole> {
        Arc::new(ClusterRole {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
                ..Default::default()
            },
            rules: Some(
                rules
                    .iter()
                    .map(|(verb, res)| PolicyRule { verbs: vec![verb.to_string()], api_groups: Some(vec!["".into()]), resources: Some(vec![res.to_string()]), ..Default::default() })
                    .collect(),
            ),
            aggregation_rule: aggregates.map(|sel| AggregationRule {
                cluster_role_selectors: Some(vec![ApiSelector {
                    match_labels: Some(sel.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>()),
                    ..Default::default()
                }]),
            }),
        })
    }

    #[test]
    fn gathers_the_selected_roles_rules_once_by_name() {
        let view = role("view", &[], &[], Some(&[("agg", "view")]));
        let b = role("b-pods", &[("agg", "view")], &[("get", "pods"), ("list", "pods")], None);
        let a = role("a-svc", &[("agg", "view")], &[("get", "services"), ("get", "pods")], None);
        let other = role("other", &[("agg", "edit")], &[("delete", "pods")], None);
        let all = vec![view.clone(), b, a.clone(), other];
        let want = plan(&view, &all).unwrap().unwrap();
        let names: Vec<String> = want.iter().map(|r| format!("{} {}", r.verbs[0], r.resources.as_ref().unwrap()[0])).collect();
        assert_eq!(names, ["get services", "get pods", "list pods"]);
        // written back: content
        let mut done = (*view).clone();
        done.rules = Some(want);
        assert!(plan(&done, &all).is_none());
        // not aggregated: nothing to do; keys are the aggregated roles only
        assert!(plan(&a, &all).is_none());
        assert_eq!(keys_for_cluster_role(&all), ["view"]);
        // a selected role goes: its rules go
        let fewer: Vec<Arc<ClusterRole>> = all.iter().filter(|r| r.name_any() != "b-pods").cloned().collect();
        assert_eq!(plan(&done, &fewer).unwrap().unwrap().len(), 2);
    }

    #[test]
    fn roles_aggregate_in_chains_and_never_themselves() {
        // edit is labelled into admin and aggregates itself from a label it carries too
        let admin = role("admin", &[], &[], Some(&[("to", "admin")]));
        let edit = role("edit", &[("to", "admin"), ("to-edit", "yes")], &[("update", "pods")], Some(&[("to-edit", "yes")]));
        let all = vec![admin.clone(), edit.clone()];
        assert_eq!(plan(&admin, &all).unwrap().unwrap().len(), 1, "admin gathers edit's current rules");
        assert!(gathered(&edit, &all).unwrap().unwrap().is_empty(), "edit does not gather its own rules");
    }

    #[test]
    fn absent_and_empty_lists_are_the_same_rule() {
        let r1 = PolicyRule { verbs: vec!["get".into()], resource_names: None, ..Default::default() };
        let r2 = PolicyRule { verbs: vec!["get".into()], resource_names: Some(vec![]), ..Default::default() };
        assert_eq!(normal(&r1), normal(&r2));
    }
}
