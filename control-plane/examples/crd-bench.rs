//! Benchmark of custom resources: writes/s of objects validated against a CRD's structural
//! schema, and list latency, next to the same number of ConfigMaps (no schema) in the same run.
//!
//! cargo build --release -p ferro-control-plane --example crd-bench --bin ferro-control-plane
//! ./target/release/examples/crd-bench [--objects 10000] [--concurrency 16]
//!
//! Starts the release binary on loopback with a fresh data dir (no controllers), creates a CRD
//! whose schema has the usual shapes (required fields, enums, patterns, bounds, a list-map, a
//! map, int-or-string, defaults), waits for it to be established, then creates N objects with
//! C requests in flight (each pruned, defaulted and validated), then N ConfigMaps the same way.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, PostParams};
use serde_json::json;

use common::{arg, pct};

const CRD: &str = r#"{
  "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
  "metadata": {"name": "databases.bench.ferro.dev"},
  "spec": {"group": "bench.ferro.dev", "scope": "Namespaced",
    "names": {"plural": "databases", "kind": "Database"},
    "versions": [{"name": "v1", "served": true, "storage": true,
      "subresources": {"status": {}},
      "schema": {"openAPIV3Schema": {"type": "object", "properties": {
        "spec": {"type": "object", "required": ["engine", "storage"], "properties": {
          "engine": {"type": "string", "enum": ["postgres", "mysql", "redis"]},
          "version": {"type": "string", "pattern": "^[0-9]+(\\.[0-9]+)*$"},
          "replicas": {"type": "integer", "minimum": 1, "maximum": 9, "default": 1},
          "storage": {"type": "object", "required": ["size"], "properties": {
            "size": {"x-kubernetes-int-or-string": true}, "class": {"type": "string", "maxLength": 63}}},
          "users": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
            "items": {"type": "object", "required": ["name"], "properties": {
              "name": {"type": "string"}, "roles": {"type": "array", "items": {"type": "string"}}}}},
          "parameters": {"type": "object", "additionalProperties": {"type": "string"}}}},
        "status": {"type": "object", "properties": {"phase": {"type": "string"}}}}}}}]}
}"#;

fn database(i: usize) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "bench.ferro.dev/v1", "kind": "Database",
        "metadata": {"name": format!("db{i:05}"), "labels": {"app": "bench"}},
        "spec": {"engine": "postgres", "version": "16.2", "storage": {"size": "10Gi", "class": "fast"},
                 "users": [{"name": "app", "roles": ["rw"]}, {"name": "report", "roles": ["ro"]}],
                 "parameters": {"max_connections": "200", "shared_buffers": "1GB"}}
    }))
    .unwrap()
}

fn config_map(i: usize) -> ConfigMap {
    serde_json::from_value(json!({
        "metadata": {"name": format!("cm{i:05}"), "labels": {"app": "bench"}},
        "data": {"engine": "postgres", "version": "16.2", "size": "10Gi", "class": "fast", "users": "app,report",
                 "max_connections": "200", "shared_buffers": "1GB"}
    }))
    .unwrap()
}

#[tokio::main]
async fn main() {
    let n = arg("--objects", 10_000);
    let conc = arg("--concurrency", 16);
    let server = common::Server::start("ferro-crd-bench", &["--controllers="]).await;
    let client = server.client.clone();
    println!("ferro-control-plane custom resource benchmark: {n} objects, {conc} concurrent writers");

    let crds: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource {
            group: "apiextensions.k8s.io".into(),
            version: "v1".into(),
            api_version: "apiextensions.k8s.io/v1".into(),
            kind: "CustomResourceDefinition".into(),
            plural: "customresourcedefinitions".into(),
        },
    );
    crds.create(&PostParams::default(), &serde_json::from_str(CRD).unwrap()).await.unwrap();
    let ar = ApiResource {
        group: "bench.ferro.dev".into(),
        version: "v1".into(),
        api_version: "bench.ferro.dev/v1".into(),
        kind: "Database".into(),
        plural: "databases".into(),
    };
    let dbs: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
    // established: the resource answers
    let deadline = Instant::now() + Duration::from_secs(30);
    while dbs.list(&ListParams::default().limit(1)).await.is_err() {
        assert!(Instant::now() < deadline, "the CRD was not established");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let start = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let dbs = dbs.clone();
            async move { dbs.create(&PostParams::default(), &database(i)).await.unwrap() }
        })
        .buffer_unordered(conc)
        .for_each(|_| async {})
        .await;
    let secs = start.elapsed().as_secs_f64();
    println!("create {n} custom objects (schema-validated): {secs:.2} s, {:.0} writes/s", n as f64 / secs);
    let one = dbs.get("db00000").await.unwrap();
    assert_eq!(one.data["spec"]["replicas"], 1, "defaulted");

    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let start = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let cms = cms.clone();
            async move { cms.create(&PostParams::default(), &config_map(i)).await.unwrap() }
        })
        .buffer_unordered(conc)
        .for_each(|_| async {})
        .await;
    let secs = start.elapsed().as_secs_f64();
    println!("create {n} ConfigMaps (same run, no schema): {secs:.2} s, {:.0} writes/s", n as f64 / secs);

    let mut lists = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let l = dbs.list(&ListParams::default()).await.unwrap();
        assert_eq!(l.items.len(), n);
        lists.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    println!("list {n} custom objects (kube-rs, incl. decoding): min {:.0} ms, median {:.0} ms", pct(&mut lists.clone(), 0.0), pct(&mut lists, 0.5));
}
