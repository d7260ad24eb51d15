//! The manifests in deploy/demo-operator/ agree with the code: the CRD is the one derived from
//! the Rust types, the ClusterRole grants exactly the requests the operator makes, and the
//! operator's Deployment runs as its service account with nothing mounted by hand.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::PathBuf;

use ferro_demo_operator::cluster::PERMISSIONS;
use ferro_demo_operator::website::Website;
use kube::CustomResourceExt as _;
use serde::Deserialize as _;
use serde_json::Value;

fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/demo-operator")
}

fn documents(file: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(deploy_dir().join(file)).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind}"))
}

#[test]
fn crd_yaml_is_the_derived_definition() {
    let docs = documents("crd.yaml");
    assert_eq!(docs.len(), 1);
    assert_eq!(
        docs[0],
        serde_json::to_value(Website::crd()).unwrap(),
        "deploy/demo-operator/crd.yaml is stale: regenerate it with `ferro-demo-operator crd` (keep the header comment)"
    );
}

#[test]
fn the_cluster_role_grants_exactly_what_the_operator_uses() {
    let docs = documents("operator.yaml");
    let granted: BTreeSet<(String, String, String)> = of_kind(&docs, "ClusterRole")["rules"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|rule| {
            assert!(
                rule.get("resourceNames").is_none() && rule.get("nonResourceURLs").is_none(),
                "{rule}"
            );
            let list = |k: &str| -> Vec<String> {
                rule[k]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_str().unwrap().to_string())
                    .collect()
            };
            let (groups, resources, verbs) = (list("apiGroups"), list("resources"), list("verbs"));
            let mut out = Vec::new();
            for g in &groups {
                for r in &resources {
                    for v in &verbs {
                        assert!(g != "*" && r != "*" && v != "*", "no wildcards: {rule}");
                        out.push((g.clone(), r.clone(), v.clone()));
                    }
                }
            }
            out
        })
        .collect();
    let used: BTreeSet<(String, String, String)> = PERMISSIONS
        .iter()
        .flat_map(|(g, r, verbs)| {
            verbs
                .iter()
                .map(move |v| (g.to_string(), r.to_string(), v.to_string()))
        })
        .collect();
    assert_eq!(granted, used);
}

#[test]
fn the_operator_runs_as_its_bound_service_account_with_in_cluster_config() {
    let docs = documents("operator.yaml");
    let sa = of_kind(&docs, "ServiceAccount");
    let binding = of_kind(&docs, "ClusterRoleBinding");
    assert_eq!(
        binding["roleRef"]["name"],
        of_kind(&docs, "ClusterRole")["metadata"]["name"]
    );
    assert_eq!(
        binding["subjects"][0],
        serde_json::json!({"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": sa["metadata"]["namespace"]})
    );
    let deployment = of_kind(&docs, "Deployment");
    assert_eq!(
        deployment["metadata"]["namespace"],
        sa["metadata"]["namespace"]
    );
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], sa["metadata"]["name"]);
    assert!(
        pod.get("volumes").is_none() && pod["containers"][0].get("volumeMounts").is_none(),
        "nothing mounted by hand"
    );
    assert!(pod.get("automountServiceAccountToken").is_none());
    assert_eq!(
        pod["containers"][0]["image"],
        "registry.ferro.test/demo-operator:1"
    );
}
