//! CustomResourceDefinitions with kubectl: a CRD applied, established and served in two
//! versions; objects of it validated against its structural schema (422 with the field path),
//! pruned and defaulted; printer columns, short names and categories in `kubectl get`; the
//! status and scale subresources; `kubectl explain`; reads through the other version; and the
//! CRD's deletion taking its objects with it. Bad input: non-structural schemas, invalid
//! objects, strategic merge patches: Status errors, nothing stored.
#![allow(clippy::unwrap_used)]

mod common;

use common::fake::eventually;
use common::Server;
use futures::StreamExt;
use kube::api::{Api, DynamicObject, WatchEvent, WatchParams};
use kube::discovery::ApiResource;
use serde_json::{json, Value};

const WIDGETS: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  scope: Namespaced
  names:
    plural: widgets
    kind: Widget
    shortNames: [wg]
    categories: [all]
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        description: A Widget is a thing that widgets.
        properties:
          spec:
            type: object
            description: What the widget should be.
            required: [size]
            properties:
              size:
                type: string
                description: How big the widget is.
                enum: [small, large]
              replicas:
                type: integer
                minimum: 0
                default: 1
              color:
                type: string
                pattern: '^[a-z]+$'
              port:
                x-kubernetes-int-or-string: true
              selector:
                type: string
          status:
            type: object
            properties:
              replicas:
                type: integer
              phase:
                type: string
    subresources:
      status: {}
      scale:
        specReplicasPath: .spec.replicas
        statusReplicasPath: .status.replicas
        labelSelectorPath: .spec.selector
    additionalPrinterColumns:
    - name: Size
      type: string
      jsonPath: .spec.size
    - name: Replicas
      type: integer
      jsonPath: .spec.replicas
    - name: Phase
      type: string
      jsonPath: .status.phase
  - name: v1beta1
    served: true
    storage: false
    schema:
      openAPIV3Schema:
        type: object
        x-kubernetes-preserve-unknown-fields: true
"#;

fn widget(name: &str, spec: Value) -> String {
    json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": name}, "spec": spec}).to_string()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crd_is_served_validated_printed_scaled_explained_and_deleted_with_its_objects() {
    let s = Server::start();
    s.apply(WIDGETS);
    s.ok(&["wait", "--for=condition=established", "--timeout=60s", "crd/widgets.example.com"]);
    let crd: Value = serde_json::from_str(&s.ok(&["get", "crd", "widgets.example.com", "-o", "json"])).unwrap();
    assert_eq!(crd["status"]["acceptedNames"]["listKind"], "WidgetList");
    assert_eq!(crd["status"]["storedVersions"], json!(["v1"]));
    assert_eq!(crd["metadata"]["finalizers"], json!(["customresourcecleanup.apiextensions.k8s.io"]));
    assert_eq!(crd["spec"]["names"]["singular"], "widget", "defaulted");

    // a valid object: defaulted, its unknown fields pruned (kubectl's default strict field
    // validation refuses them; --validate=false lets the server prune them)
    let out = s.kubectl_stdin(&["create", "-f", "-"], Some(&widget("w1", json!({"size": "small", "bogus": 1}))));
    assert!(stderr(&out).contains("unknown field \"spec.bogus\""), "{}", stderr(&out));
    s.kubectl_stdin(&["create", "--validate=false", "-f", "-"], Some(&widget("w1", json!({"size": "small", "bogus": 1, "port": "http", "selector": "app=w1"}))));
    let w1: Value = serde_json::from_str(&s.ok(&["get", "widget", "w1", "-o", "json"])).unwrap();
    assert_eq!(w1["spec"], json!({"size": "small", "replicas": 1, "port": "http", "selector": "app=w1"}));
    assert_eq!(w1["metadata"]["generation"], 1);

    // invalid objects: 422 naming each field, nothing stored
    let out = s.kubectl_stdin(&["create", "-f", "-"], Some(&widget("bad", json!({"size": "medium", "replicas": -1, "color": "Red"}))));
    assert!(!out.status.success());
    let err = stderr(&out);
    for want in [
        "The Widget \"bad\" is invalid",
        "spec.size: Unsupported value: \"medium\": supported values: \"small\", \"large\"",
        "spec.replicas: Invalid value: -1: spec.replicas in body should be greater than or equal to 0",
        "spec.color: Invalid value: \"Red\": spec.color in body should match '^[a-z]+$'",
    ] {
        assert!(err.contains(want), "missing {want:?} in {err}");
    }
    let out = s.kubectl_stdin(&["create", "-f", "-"], Some(&widget("bad", json!({"replicas": 2}))));
    assert!(stderr(&out).contains("spec.size: Required value"), "{}", stderr(&out));
    assert!(!s.kubectl(&["get", "widget", "bad"]).status.success(), "nothing stored");

    // printer columns, the short name, the category
    s.kubectl_stdin(&["create", "-f", "-"], Some(&widget("w2", json!({"size": "large", "replicas": 3}))));
    let table = s.ok(&["get", "wg"]);
    let lines: Vec<Vec<&str>> = table.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(lines[0], ["NAME", "SIZE", "REPLICAS", "PHASE"], "{table}");
    // a column whose path finds nothing is empty, as upstream prints it
    assert_eq!(lines[1], ["w1", "small", "1"], "{table}");
    assert_eq!(lines[2], ["w2", "large", "3"], "{table}");
    assert!(s.ok(&["get", "all"]).contains("widget.example.com/w2"));

    // status only through the status subresource; generation follows spec changes only
    s.ok(&["patch", "widget", "w2", "--type=merge", "-p", r#"{"status":{"phase":"Ignored"}}"#]);
    s.ok(&["patch", "widget", "w2", "--subresource=status", "--type=merge", "-p", r#"{"status":{"phase":"Running","replicas":3}}"#]);
    let w2: Value = serde_json::from_str(&s.ok(&["get", "widget", "w2", "-o", "json"])).unwrap();
    assert_eq!((w2["status"]["phase"].as_str(), w2["metadata"]["generation"].as_i64()), (Some("Running"), Some(1)));
    s.ok(&["patch", "widget", "w2", "--type=merge", "-p", r#"{"spec":{"color":"blue"}}"#]);
    let w2: Value = serde_json::from_str(&s.ok(&["get", "widget", "w2", "-o", "json"])).unwrap();
    assert_eq!(w2["metadata"]["generation"], 2);
    // strategic merge patches are not for custom resources (415 as upstream)
    let out = s.kubectl(&["patch", "widget", "w2", "--type=strategic", "-p", r#"{"spec":{"color":"red"}}"#]);
    assert!(stderr(&out).contains("UnsupportedMediaType") || stderr(&out).contains("unknown format"), "{}", stderr(&out));

    // the scale subresource
    s.ok(&["scale", "widget", "w1", "--replicas=5"]);
    let scale: Value = serde_json::from_str(&s.ok(&["get", "--raw", "/apis/example.com/v1/namespaces/default/widgets/w1/scale"])).unwrap();
    assert_eq!((scale["spec"]["replicas"].as_i64(), scale["status"]["selector"].as_str()), (Some(5), Some("app=w1")));

    // kubectl explain from the served OpenAPI
    let explain = s.ok(&["explain", "widget.spec.size"]);
    assert!(explain.contains("How big the widget is."), "{explain}");

    // the other served version: the same object, its apiVersion
    let beta: Value = serde_json::from_str(&s.ok(&["get", "widgets.v1beta1.example.com", "w1", "-o", "json"])).unwrap();
    assert_eq!((beta["apiVersion"].as_str(), beta["spec"]["replicas"].as_i64()), (Some("example.com/v1beta1"), Some(5)));
    let list: Value = serde_json::from_str(&s.ok(&["get", "--raw", "/apis/example.com/v1beta1/namespaces/default/widgets"])).unwrap();
    assert_eq!(list["kind"], "WidgetList");
    assert!(list["items"].as_array().unwrap().iter().all(|i| i["apiVersion"] == "example.com/v1beta1"), "{list}");
    // and a watch through it (kube-rs, dynamic)
    let client = s.client().await;
    let ar = ApiResource { group: "example.com".into(), version: "v1beta1".into(), api_version: "example.com/v1beta1".into(), kind: "Widget".into(), plural: "widgets".into() };
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
    let rv = api.list(&Default::default()).await.unwrap().metadata.resource_version.unwrap();
    let mut events = api.watch(&WatchParams::default(), &rv).await.unwrap().boxed();
    s.ok(&["label", "widget", "w1", "seen=yes"]);
    // (bookmarks may come first: the etcd store sends them on its progress notifications)
    let ev = loop {
        match events.next().await.unwrap().unwrap() {
            WatchEvent::Bookmark(_) => continue,
            ev => break ev,
        }
    };
    match ev {
        WatchEvent::Modified(o) => assert_eq!(o.types.unwrap().api_version, "example.com/v1beta1"),
        other => panic!("unexpected {other:?}"),
    }

    // the garbage collector follows custom kinds: a ConfigMap owned by a Widget goes with it
    s.kubectl_stdin(&["create", "-f", "-"], Some(&widget("owner", json!({"size": "small"}))));
    let uid = s.ok(&["get", "widget", "owner", "-o", "jsonpath={.metadata.uid}"]);
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owned", "ownerReferences": [
        {"apiVersion": "example.com/v1", "kind": "Widget", "name": "owner", "uid": uid}]}, "data": {"k": "v"}});
    s.kubectl_stdin(&["create", "-f", "-"], Some(&cm.to_string()));
    s.ok(&["delete", "widget", "owner"]);
    eventually("the owned ConfigMap collected", || async { (!s.kubectl(&["get", "configmap", "owned"]).status.success()).then_some(()) }).await;

    // deleting the CRD: a finalizer on an object holds it (creates are refused meanwhile);
    // once it goes, the CRD goes, and with it the served resource
    s.ok(&["patch", "widget", "w2", "--type=merge", "-p", r#"{"metadata":{"finalizers":["example.com/hold"]}}"#]);
    s.ok(&["delete", "crd", "widgets.example.com", "--wait=false"]);
    eventually("w1 deleted with its CRD", || async { (!s.kubectl(&["get", "widget", "w1"]).status.success()).then_some(()) }).await;
    let crd: Value = eventually("the CRD terminating", || async {
        let c: Value = serde_json::from_str(&s.ok(&["get", "crd", "widgets.example.com", "-o", "json"])).ok()?;
        c["status"]["conditions"].as_array()?.iter().any(|x| x["type"] == "Terminating").then_some(c)
    })
    .await;
    assert!(crd["metadata"]["deletionTimestamp"].is_string());
    let out = s.kubectl_stdin(&["create", "-f", "-"], Some(&widget("w3", json!({"size": "small"}))));
    assert!(stderr(&out).contains("create not allowed while custom resource definition is terminating"), "{}", stderr(&out));
    s.ok(&["patch", "widget", "w2", "--type=merge", "-p", r#"{"metadata":{"finalizers":null}}"#]);
    eventually("the CRD gone", || async { (!s.kubectl(&["get", "crd", "widgets.example.com"]).status.success()).then_some(()) }).await;
    eventually("widgets no longer served", || async {
        let out = s.kubectl(&["get", "--raw", "/apis/example.com/v1/widgets"]);
        (!out.status.success() && stderr(&out).contains("NotFound")).then_some(())
    })
    .await;
    assert!(!s.ok(&["get", "--raw", "/apis"]).contains("example.com"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_crds_are_refused_with_the_field_path_and_nothing_is_stored() {
    let s = Server::start();
    let non_structural = WIDGETS.replace("          spec:\n            type: object\n            description: What the widget should be.", "          spec:\n            description: What the widget should be.");
    let out = s.kubectl_stdin(&["apply", "-f", "-"], Some(&non_structural));
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("spec.versions[0].schema.openAPIV3Schema.properties[spec].type: Required value: must not be empty for specified object fields"),
        "{}",
        stderr(&out)
    );
    let wrong_name = WIDGETS.replace("name: widgets.example.com", "name: gadgets.example.com");
    let out = s.kubectl_stdin(&["apply", "-f", "-"], Some(&wrong_name));
    assert!(stderr(&out).contains("must be spec.names.plural+\".\"+spec.group"), "{}", stderr(&out));
    let two_storage = WIDGETS.replace("    storage: false", "    storage: true");
    let out = s.kubectl_stdin(&["apply", "-f", "-"], Some(&two_storage));
    assert!(stderr(&out).contains("must have exactly one version marked as storage version"), "{}", stderr(&out));
    assert_eq!(s.ok(&["get", "crd", "-o", "name"]).trim(), "", "nothing stored");

    // a kind that is taken in its group: stored, not accepted, not served
    s.apply(WIDGETS);
    s.ok(&["wait", "--for=condition=established", "--timeout=60s", "crd/widgets.example.com"]);
    let clash = WIDGETS.replace("name: widgets.example.com", "name: gizmos.example.com").replace("plural: widgets", "plural: gizmos").replace("shortNames: [wg]", "shortNames: [gz]");
    s.apply(&clash);
    let c: Value = eventually("the conflict reported", || async {
        let c: Value = serde_json::from_str(&s.ok(&["get", "crd", "gizmos.example.com", "-o", "json"])).ok()?;
        c["status"]["conditions"].as_array()?.iter().find(|x| x["type"] == "NamesAccepted").cloned()
    })
    .await;
    assert_eq!((c["status"].as_str(), c["reason"].as_str()), (Some("False"), Some("KindConflict")), "{c}");
    assert!(!s.kubectl(&["get", "--raw", "/apis/example.com/v1/gizmos"]).status.success());

    // a cluster-scoped CRD: objects without a namespace
    let cluster = WIDGETS.replace("name: widgets.example.com", "name: knobs.example.com").replace("plural: widgets", "plural: knobs").replace("kind: Widget", "kind: Knob").replace("shortNames: [wg]", "shortNames: [kn]").replace("scope: Namespaced", "scope: Cluster");
    // with a CEL rule: stored, and the client told it is not evaluated
    let cluster = cluster.replace("            required: [size]\n", "            required: [size]\n            x-kubernetes-validations:\n            - rule: \"self.size != 'huge'\"\n");
    let out = s.kubectl_stdin(&["apply", "-f", "-"], Some(&cluster));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("1 x-kubernetes-validations rule(s) are stored but not evaluated"), "{}", stderr(&out));
    s.ok(&["wait", "--for=condition=established", "--timeout=60s", "crd/knobs.example.com"]);
    s.kubectl_stdin(&["create", "-f", "-"], Some(&json!({"apiVersion": "example.com/v1", "kind": "Knob", "metadata": {"name": "k1"}, "spec": {"size": "small"}}).to_string()));
    let k: Value = serde_json::from_str(&s.ok(&["get", "knob", "k1", "-o", "json"])).unwrap();
    assert!(k["metadata"].get("namespace").is_none());
    // scope cannot change
    let out = s.kubectl_stdin(&["apply", "-f", "-"], Some(&cluster.replace("scope: Cluster", "scope: Namespaced")));
    assert!(stderr(&out).contains("spec.scope: Invalid value: \"Namespaced\": field is immutable"), "{}", stderr(&out));
}
