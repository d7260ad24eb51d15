//! Server-side apply as upstream: managedFields per field manager, conflicts (409 naming the
//! managers and fields) unless forced, fields an applier stops applying removed, the apply
//! patch type on the status subresource, and kubectl's migration from client-side apply.
#![allow(clippy::unwrap_used)]

mod common;

use common::Server;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{json, Value};

fn deployment(replicas: Option<i64>, labels: Value) -> String {
    let mut d = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "labels": labels},
        "spec": {"selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "busybox:1"}]}}}
    });
    if let Some(r) = replicas {
        d["spec"]["replicas"] = json!(r);
    }
    d.to_string()
}

fn get(s: &Server) -> Value {
    serde_json::from_str(&s.ok(&["get", "deployment", "web", "-o", "json", "--show-managed-fields"])).unwrap()
}

fn entry<'a>(obj: &'a Value, manager: &str, operation: &str) -> Option<&'a Value> {
    obj["metadata"]["managedFields"].as_array()?.iter().find(|e| e["manager"] == manager && e["operation"] == operation)
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_side_apply_tracks_owners_reports_conflicts_and_removes_what_is_no_longer_applied() {
    let s = Server::start_with(&["--controllers="]);
    // an apply creates; the applier owns what it applied
    let out = s.kubectl_stdin(&["apply", "--server-side", "-f", "-"], Some(&deployment(Some(2), json!({"team": "a", "tier": "web"}))));
    assert!(out.status.success(), "{}", stderr(&out));
    let d = get(&s);
    let mine = entry(&d, "kubectl", "Apply").unwrap_or_else(|| panic!("no Apply entry: {}", d["metadata"]));
    assert_eq!(mine["apiVersion"], "apps/v1");
    assert_eq!(mine["fieldsType"], "FieldsV1");
    assert_eq!(mine["fieldsV1"]["f:spec"]["f:replicas"], json!({}));
    assert_eq!(mine["fieldsV1"]["f:metadata"]["f:labels"]["f:team"], json!({}));
    assert!(mine["fieldsV1"]["f:spec"]["f:template"]["f:spec"]["f:containers"]["k:{\"name\":\"c\"}"]["f:image"].is_object(), "{mine}");

    // another manager changes replicas (an Update): it owns them now
    s.ok(&["patch", "deployment", "web", "--field-manager=autoscaler", "--type=merge", "-p", r#"{"spec":{"replicas":5}}"#]);
    let d = get(&s);
    assert_eq!(entry(&d, "autoscaler", "Update").unwrap()["fieldsV1"], json!({"f:spec": {"f:replicas": {}}}));
    assert!(entry(&d, "kubectl", "Apply").unwrap()["fieldsV1"]["f:spec"].get("f:replicas").is_none());

    // applying replicas: 2 again conflicts with it (409, upstream's words), nothing changes
    let out = s.kubectl_stdin(&["apply", "--server-side", "-f", "-"], Some(&deployment(Some(2), json!({"team": "a", "tier": "web"}))));
    assert!(!out.status.success());
    assert!(stderr(&out).contains("conflict with \"autoscaler\""), "{}", stderr(&out));
    assert!(stderr(&out).contains(".spec.replicas"), "{}", stderr(&out));
    assert_eq!(get(&s)["spec"]["replicas"], 5);
    // the same value is no conflict
    let out = s.kubectl_stdin(&["apply", "--server-side", "-f", "-"], Some(&deployment(Some(5), json!({"team": "a", "tier": "web"}))));
    assert!(out.status.success(), "{}", stderr(&out));
    // forced: the applier takes replicas over
    let out = s.kubectl_stdin(&["apply", "--server-side", "--force-conflicts", "-f", "-"], Some(&deployment(Some(2), json!({"team": "a", "tier": "web"}))));
    assert!(out.status.success(), "{}", stderr(&out));
    let d = get(&s);
    assert_eq!(d["spec"]["replicas"], 2);
    assert!(entry(&d, "autoscaler", "Update").is_none(), "{}", d["metadata"]["managedFields"]);

    // a label the applier no longer applies is removed; one another manager owns stays
    s.ok(&["label", "deployment", "web", "--field-manager=labeler", "owner=ops"]);
    let out = s.kubectl_stdin(&["apply", "--server-side", "-f", "-"], Some(&deployment(Some(2), json!({"team": "a"}))));
    assert!(out.status.success(), "{}", stderr(&out));
    let labels = get(&s)["metadata"]["labels"].clone();
    assert_eq!(labels, json!({"team": "a", "owner": "ops"}));

    // the apply patch type on the status subresource: its own entry
    let client = s.client().await;
    let deps: Api<Deployment> = Api::namespaced(client, "default");
    let status = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}, "status": {"observedGeneration": 9, "replicas": 7}});
    deps.patch_status("web", &PatchParams::apply("status-writer"), &Patch::Apply(&status)).await.unwrap();
    let d = get(&s);
    let e = d["metadata"]["managedFields"].as_array().unwrap().iter().find(|e| e["manager"] == "status-writer").cloned().unwrap();
    assert_eq!((e["operation"].as_str(), e["subresource"].as_str()), (Some("Apply"), Some("status")));
    assert_eq!(e["fieldsV1"], json!({"f:status": {"f:observedGeneration": {}, "f:replicas": {}}}));
    assert_eq!(d["status"]["replicas"], 7);

    // bad input: an apply without a field manager, an apply of a different kind
    let out = s.kubectl(&["get", "--raw", "/version"]);
    assert!(out.status.success());
    let err = deps.patch("web", &PatchParams::default(), &Patch::Apply(&json!({"apiVersion": "apps/v1", "kind": "Deployment"}))).await.unwrap_err();
    assert!(err.to_string().contains("fieldManager: Required value"), "{err}");
    let err = deps.patch("web", &PatchParams::apply("x"), &Patch::Apply(&json!({"apiVersion": "v1", "kind": "Pod"}))).await.unwrap_err();
    assert!(err.to_string().contains("does not match the expected"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_moves_client_side_apply_to_server_side_apply() {
    let s = Server::start_with(&["--controllers="]);
    // client-side apply first: its manager owns the fields
    let out = s.kubectl_stdin(&["apply", "-f", "-"], Some(&deployment(Some(2), json!({"team": "a", "tier": "web"}))));
    assert!(out.status.success(), "{}", stderr(&out));
    let d = get(&s);
    assert!(entry(&d, "kubectl-client-side-apply", "Update").is_some(), "{}", d["metadata"]["managedFields"]);
    // then server-side with a label dropped: kubectl hands the client-side manager's fields to
    // its server-side manager first, so the dropped label goes
    let out = s.kubectl_stdin(&["apply", "--server-side", "-f", "-"], Some(&deployment(Some(2), json!({"team": "a"}))));
    assert!(out.status.success(), "{}", stderr(&out));
    let d = get(&s);
    assert_eq!(d["metadata"]["labels"], json!({"team": "a"}), "{}", d["metadata"]);
    assert!(entry(&d, "kubectl-client-side-apply", "Update").is_none(), "{}", d["metadata"]["managedFields"]);
    assert!(entry(&d, "kubectl", "Apply").is_some());
}
