//! A kube-rs client and raw HTTP against the real ferro-control-plane binary: list, watch and
//! resume across a restart, conflicts, node credentials, bad input, durability, and the
//! pods/log + pods/exec proxy to a stand-in agent.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{client_for, Server};
use futures::{StreamExt as _, TryStreamExt as _};
use http_body_util::BodyExt as _;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::{json, Value};

fn cm(name: &str, value: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name, "labels": {"k": value}}, "data": {"v": value}})).unwrap()
}

fn api_code(e: kube::Error) -> u16 {
    match e {
        kube::Error::Api(s) => s.code,
        other => panic!("not an API error: {other}"),
    }
}

/// A raw request; returns status and body as JSON.
async fn raw(client: &kube::Client, method: &str, path: &str, ct: &str, body: Vec<u8>) -> (u16, Value) {
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("Content-Type", ct)
        .body(kube::client::Body::from(body))
        .unwrap();
    let resp = client.send(req).await.unwrap();
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into())))
}

/// These tests count the objects of the `default` namespace: no `kube-root-ca.crt` there.
const WITHOUT_ROOT_CA: &[&str] = &["--controllers=*,-root-ca-cert-publisher"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_paginate_select_and_conflict() {
    let s = Server::start_with(WITHOUT_ROOT_CA);
    let client = s.client().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    for i in 0..25 {
        cms.create(&PostParams::default(), &cm(&format!("c{i:02}"), if i % 2 == 0 { "even" } else { "odd" })).await.unwrap();
    }
    let all = cms.list(&ListParams::default()).await.unwrap();
    assert_eq!(all.items.len(), 25);
    let even = cms.list(&ListParams::default().labels("k=even")).await.unwrap();
    assert_eq!(even.items.len(), 13);
    let named = cms.list(&ListParams::default().fields("metadata.name=c03")).await.unwrap();
    assert_eq!(named.items.len(), 1);
    // pagination: consistent pages, remainingItemCount, continue
    let mut seen = Vec::new();
    let mut lp = ListParams::default().limit(10);
    loop {
        let page = cms.list(&lp).await.unwrap();
        seen.extend(page.items.iter().map(|c| c.metadata.name.clone().unwrap()));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => {
                // a write between pages does not show up in the paginated list
                if seen.len() == 10 {
                    cms.create(&PostParams::default(), &cm("c99", "odd")).await.unwrap();
                    assert_eq!(page.metadata.remaining_item_count, Some(15));
                }
                lp = lp.continue_token(&c);
            }
            None => break,
        }
    }
    assert_eq!(seen.len(), 25);
    assert!(seen.windows(2).all(|w| w[0] < w[1]));

    // optimistic concurrency
    let mut a = cms.get("c00").await.unwrap();
    let mut b = a.clone();
    a.data = Some([("v".to_string(), "a".to_string())].into());
    cms.replace("c00", &PostParams::default(), &a).await.unwrap();
    b.data = Some([("v".to_string(), "b".to_string())].into());
    let err = cms.replace("c00", &PostParams::default(), &b).await.unwrap_err();
    assert_eq!(api_code(err), 409);
    assert_eq!(cms.get("c00").await.unwrap().data.unwrap()["v"], "a");
    // create of an existing name
    assert_eq!(api_code(cms.create(&PostParams::default(), &cm("c00", "x")).await.unwrap_err()), 409);
    // generateName
    let mut g = cm("", "g");
    g.metadata.name = None;
    g.metadata.generate_name = Some("gen-".into());
    let created = cms.create(&PostParams::default(), &g).await.unwrap();
    let name = created.metadata.name.unwrap();
    assert!(name.starts_with("gen-") && name.len() == 9, "{name}");
    assert!(created.metadata.uid.is_some() && created.metadata.creation_timestamp.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_resumes_across_a_restart_and_410_when_compacted() {
    let mut s = Server::start_with(WITHOUT_ROOT_CA);
    let client = s.client().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let first = cms.create(&PostParams::default(), &cm("w0", "a")).await.unwrap();
    let rv0 = first.metadata.resource_version.clone().unwrap();
    cms.create(&PostParams::default(), &cm("w1", "a")).await.unwrap();

    s.restart();
    let client = s.client().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    // Resume from before the restart: the event after rv0 is replayed, then live ones follow.
    let mut stream = cms.watch(&WatchParams::default().timeout(20), &rv0).await.unwrap().boxed();
    let ev = tokio::time::timeout(Duration::from_secs(10), stream.try_next()).await.unwrap().unwrap().unwrap();
    match ev {
        WatchEvent::Added(c) => assert_eq!(c.metadata.name.as_deref(), Some("w1")),
        other => panic!("unexpected {other:?}"),
    }
    cms.create(&PostParams::default(), &cm("w2", "a")).await.unwrap();
    let ev = tokio::time::timeout(Duration::from_secs(10), stream.try_next()).await.unwrap().unwrap().unwrap();
    assert!(matches!(ev, WatchEvent::Added(c) if c.metadata.name.as_deref() == Some("w2")));

    // The server keeps 500 events (--watch-history): push past it, then watch from rv0.
    for i in 0..260 {
        let mut c = cm(&format!("churn{i}"), "x");
        c.metadata.name = Some(format!("churn{i}"));
        cms.create(&PostParams::default(), &c).await.unwrap();
        cms.delete(&format!("churn{i}"), &Default::default()).await.unwrap();
    }
    let mut stream = cms.watch(&WatchParams::default().timeout(5), &rv0).await.unwrap().boxed();
    let ev = tokio::time::timeout(Duration::from_secs(10), stream.try_next()).await.unwrap().unwrap().unwrap();
    match ev {
        WatchEvent::Error(e) => {
            assert_eq!(e.code, 410);
            assert_eq!(e.reason, "Expired");
        }
        other => panic!("expected 410, got {other:?}"),
    }
    // kube-runtime's watcher recovers from that by relisting
    let names: Vec<String> = kube::runtime::watcher(cms.clone(), Default::default())
        .take(1)
        .filter_map(|e| async move { e.ok() })
        .map(|e| format!("{e:?}"))
        .collect()
        .await;
    assert_eq!(names.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_with_selector_sees_objects_enter_and_leave() {
    let s = Server::start_with(WITHOUT_ROOT_CA);
    let client = s.client().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let created = cms.create(&PostParams::default(), &cm("sel", "no")).await.unwrap();
    let rv = created.metadata.resource_version.unwrap();
    let mut stream = cms.watch(&WatchParams::default().labels("k=yes").timeout(10), &rv).await.unwrap().boxed();
    let patch = |v: &str| Patch::Merge(json!({"metadata": {"labels": {"k": v}}}));
    cms.patch("sel", &PatchParams::default(), &patch("yes")).await.unwrap();
    cms.patch("sel", &PatchParams::default(), &patch("no")).await.unwrap();
    let a = stream.try_next().await.unwrap().unwrap();
    let b = stream.try_next().await.unwrap().unwrap();
    assert!(matches!(a, WatchEvent::Added(_)), "{a:?}");
    assert!(matches!(b, WatchEvent::Deleted(_)), "{b:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_list_from_an_older_version_sends_the_current_state_first() {
    let s = Server::start_with(WITHOUT_ROOT_CA);
    let client = s.client().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let first = cms.create(&PostParams::default(), &cm("stream-a", "x")).await.unwrap();
    cms.create(&PostParams::default(), &cm("stream-b", "x")).await.unwrap();
    let rv = first.metadata.resource_version.unwrap();
    let wp = WatchParams::streaming_lists().labels("k=x").timeout(10);
    let mut stream = cms.watch(&wp, &rv).await.unwrap().boxed();
    let mut added = Vec::new();
    loop {
        match stream.try_next().await.unwrap().unwrap() {
            WatchEvent::Added(o) => added.push(o.metadata.name.unwrap()),
            WatchEvent::Bookmark(b) => {
                assert_eq!(b.metadata.annotations.get("k8s.io/initial-events-end").map(String::as_str), Some("true"));
                break;
            }
            other => panic!("unexpected event before the initial-events bookmark: {other:?}"),
        }
    }
    added.sort();
    assert_eq!(added, ["stream-a", "stream-b"]);
    // A version from the future is refused with 504, as upstream does after its wait (raw
    // HTTP: kube-rs would retry a 504).
    use tokio::io::AsyncWriteExt as _;
    let (mut tls, token) = common::raw_tls(&s).await;
    let path = "/api/v1/namespaces/default/configmaps?watch=1&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&resourceVersion=99999999";
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n");
    tls.write_all(req.as_bytes()).await.unwrap();
    let head = common::read_head(&mut tls).await;
    assert!(head.starts_with("HTTP/1.1 504"), "{head}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_credentials_are_limited_to_their_node() {
    let s = Server::start_with(WITHOUT_ROOT_CA);
    let admin = s.client().await;
    let nodes: Api<Node> = Api::all(admin.clone());
    for n in ["n1", "n2"] {
        nodes.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": n}})).unwrap()).await.unwrap();
    }
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    for (p, n, cm) in [("on-n1", "n1", "used-cm"), ("on-n2", "n2", "other-cm")] {
        pods.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": p},
            "spec": {"nodeName": n, "containers": [{"name": "c", "image": "i"}],
                     "volumes": [{"name": "v", "configMap": {"name": cm}}]}})).unwrap()).await.unwrap();
    }
    let admin_cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "default");
    for n in ["used-cm", "other-cm"] {
        admin_cms.create(&PostParams::default(), &cm(n, "v")).await.unwrap();
    }
    let node_client = client_for(&s.cert_kubeconfig("system:node:n1", &["system:nodes"])).await;
    let as_node: Api<Node> = Api::all(node_client.clone());
    let status = Patch::Merge(json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}));
    as_node.patch_status("n1", &PatchParams::default(), &status).await.unwrap();
    let e = as_node.patch_status("n2", &PatchParams::default(), &status).await.unwrap_err();
    assert_eq!(api_code(e), 403);
    let pods_as_node: Api<Pod> = Api::namespaced(node_client.clone(), "default");
    let pstatus = Patch::Merge(json!({"status": {"phase": "Running"}}));
    pods_as_node.patch_status("on-n1", &PatchParams::default(), &pstatus).await.unwrap();
    assert_eq!(api_code(pods_as_node.patch_status("on-n2", &PatchParams::default(), &pstatus).await.unwrap_err()), 403);
    assert_eq!(api_code(pods_as_node.patch("on-n1", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}}))).await.unwrap_err()), 403);
    // reads are fine; writes elsewhere are not
    assert_eq!(pods_as_node.list(&ListParams::default()).await.unwrap().items.len(), 2);
    let cms: Api<ConfigMap> = Api::namespaced(node_client.clone(), "default");
    // ConfigMaps its pods use: get, or list and watch by name (the agent's watch-based cache,
    // upstream's Node authorizer); not the others, not all of them
    assert_eq!(cms.get("used-cm").await.unwrap().metadata.name.as_deref(), Some("used-cm"));
    assert_eq!(api_code(cms.get("other-cm").await.unwrap_err()), 403);
    let by_name = |n: &str| ListParams::default().fields(&format!("metadata.name={n}"));
    let listed = cms.list(&by_name("used-cm")).await.unwrap();
    assert_eq!(listed.items.iter().map(|c| c.metadata.name.clone().unwrap()).collect::<Vec<_>>(), vec!["used-cm"]);
    assert_eq!(api_code(cms.list(&by_name("other-cm")).await.unwrap_err()), 403);
    assert_eq!(api_code(cms.list(&ListParams::default()).await.unwrap_err()), 403);
    let rv = listed.metadata.resource_version.clone().unwrap();
    let mut watch = cms.watch(&kube::api::WatchParams::default().fields("metadata.name=used-cm"), &rv).await.unwrap().boxed();
    admin_cms.patch("used-cm", &PatchParams::default(), &Patch::Merge(json!({"data": {"k": "changed"}}))).await.unwrap();
    admin_cms.patch("other-cm", &PatchParams::default(), &Patch::Merge(json!({"data": {"k": "changed"}}))).await.unwrap();
    match watch.next().await.unwrap().unwrap() {
        kube::api::WatchEvent::Modified(c) => assert_eq!(c.metadata.name.as_deref(), Some("used-cm")),
        other => panic!("{other:?}"),
    }
    assert_eq!(api_code(cms.watch(&kube::api::WatchParams::default().fields("metadata.name=other-cm"), &rv).await.map(|_| ()).unwrap_err()), 403);
    let e = cms.create(&PostParams::default(), &cm("x", "y")).await.unwrap_err();
    match e {
        kube::Error::Api(st) => {
            assert_eq!(st.code, 403);
            assert_eq!(st.reason, "Forbidden");
            assert!(st.message.contains("system:node:n1"), "{}", st.message);
        }
        other => panic!("{other}"),
    }
    // a lease of its own in kube-node-lease
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(node_client.clone(), "kube-node-lease");
    leases.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "n1"}, "spec": {"holderIdentity": "n1"}})).unwrap()).await.unwrap();
    let e = leases.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "n2"}})).unwrap()).await.unwrap_err();
    assert_eq!(api_code(e), 403);
    // a token that does not authenticate: 401 as a Status (also with anonymous requests allowed)
    let anon_status = {
        let kc = std::fs::read_to_string(s.kubeconfig()).unwrap();
        let token_line = kc.lines().find(|l| l.trim_start().starts_with("token:")).unwrap().to_string();
        let path = s.data_dir().join("bad.kubeconfig");
        std::fs::write(&path, kc.replace(&token_line, "    token: wrong")).unwrap();
        let c = client_for(&path).await;
        raw(&c, "GET", "/api/v1/namespaces", "application/json", vec![]).await
    };
    assert_eq!(anon_status.0, 401);
    assert_eq!(anon_status.1["kind"], "Status");
    assert_eq!(anon_status.1["reason"], "Unauthorized");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_the_right_status_and_stores_nothing() {
    let s = Server::start_with(WITHOUT_ROOT_CA);
    let c = s.client().await;
    let base = "/api/v1/namespaces/default/configmaps";
    // (what, method, content type, body, expected code, expected reason)
    type Case = (&'static str, &'static str, &'static str, Vec<u8>, u16, &'static str);
    let cases: Vec<Case> = vec![
        ("malformed json", "POST", "application/json", b"{\"metadata\": {".to_vec(), 400, "BadRequest"),
        ("malformed yaml", "POST", "application/yaml", b"metadata: [unclosed".to_vec(), 400, "BadRequest"),
        ("wrong apiVersion", "POST", "application/json", br#"{"apiVersion":"apps/v1","kind":"ConfigMap","metadata":{"name":"a"}}"#.to_vec(), 400, "BadRequest"),
        ("wrong kind", "POST", "application/json", br#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"a"}}"#.to_vec(), 400, "BadRequest"),
        ("invalid name", "POST", "application/json", br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"Not_Valid"}}"#.to_vec(), 422, "Invalid"),
        ("missing name", "POST", "application/json", br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{}}"#.to_vec(), 422, "Invalid"),
        ("unsupported media type", "POST", "text/plain", b"hello".to_vec(), 415, "UnsupportedMediaType"),
        ("body over the limit", "POST", "application/json", vec![b' '; 3 * 1024 * 1024 + 10], 413, "RequestEntityTooLarge"),
    ];
    for (what, method, ct, body, code, reason) in cases {
        let (status, st) = raw(&c, method, base, ct, body).await;
        assert_eq!(status, code, "{what}: {st}");
        assert_eq!(st["kind"], "Status", "{what}");
        assert_eq!(st["reason"], reason, "{what}: {st}");
        assert_eq!(st["code"], code, "{what}");
    }
    let (status, st) = raw(&c, "POST", "/api/v1/namespaces/default/widgets", "application/json", b"{}".to_vec()).await;
    assert_eq!((status, st["reason"].as_str()), (404, Some("NotFound")));
    let (status, _) = raw(&c, "GET", "/api/v1/namespaces/default/pods?labelSelector=a%20in%20(b", "application/json", vec![]).await;
    assert_eq!(status, 400);
    let (status, st) = raw(&c, "GET", "/api/v1/pods?fieldSelector=spec.bogus%3Dx", "application/json", vec![]).await;
    assert_eq!(status, 400, "{st}");
    let (status, _) = raw(&c, "POST", "/api/v1/namespaces/nonexistent/configmaps", "application/json",
        br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"}}"#.to_vec()).await;
    assert_eq!(status, 404);
    // nothing was stored
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
    assert!(cms.list(&ListParams::default()).await.unwrap().items.is_empty());

    // strict field validation
    let (status, st) = raw(&c, "POST", &format!("{base}?fieldValidation=Strict"), "application/json",
        br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"},"dta":{}}"#.to_vec()).await;
    assert_eq!(status, 400);
    assert!(st["message"].as_str().unwrap().contains("unknown field \"dta\""), "{st}");

    // immutable field patch and stale resourceVersion
    let svc: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(c.clone(), "default");
    svc.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "s"}, "spec": {"ports": [{"port": 80}]}})).unwrap()).await.unwrap();
    let e = svc.patch("s", &PatchParams::default(), &Patch::Merge(json!({"spec": {"clusterIP": "10.96.0.77"}}))).await.unwrap_err();
    match e {
        kube::Error::Api(st) => {
            assert_eq!(st.code, 422);
            assert!(st.message.contains("field is immutable"), "{}", st.message);
        }
        other => panic!("{other}"),
    }
    let e = svc.patch("s", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"resourceVersion": "1"}, "spec": {"ports": [{"port": 81}]}}))).await.unwrap_err();
    assert_eq!(api_code(e), 409);
    // a list at a revision the store has not reached: 504 Timeout, as upstream (kubectl here,
    // because kube-rs retries 504s)
    let out = s.kubectl(&["get", "--raw", "/api/v1/namespaces/default/configmaps?resourceVersion=999999999"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Too large resource version"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_kill_9() {
    let mut s = Server::start_with(WITHOUT_ROOT_CA);
    let client = s.client().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let acked = Arc::new(std::sync::Mutex::new(Vec::<(String, String)>::new()));
    let mut tasks = Vec::new();
    for w in 0..8 {
        let cms = cms.clone();
        let acked = acked.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0.. {
                let name = format!("d{w}-{i}");
                match cms.create(&PostParams::default(), &cm(&name, "x")).await {
                    Ok(c) => acked.lock().unwrap().push((name, c.metadata.resource_version.unwrap())),
                    Err(_) => return,
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    s.kill9();
    for t in tasks {
        let _ = t.await;
    }
    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() > 50, "only {} writes acknowledged", acked.len());
    s.spawn();
    let client = s.client().await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let stored: std::collections::HashMap<String, String> = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|c| (c.metadata.name.unwrap(), c.metadata.resource_version.unwrap()))
        .collect();
    for (name, rv) in &acked {
        assert_eq!(stored.get(name), Some(rv), "acknowledged write {name} lost or changed");
    }
    // revisions keep increasing after the restart
    let max = stored.values().map(|v| v.parse::<i64>().unwrap()).max().unwrap();
    let next = cms.create(&PostParams::default(), &cm("after", "x")).await.unwrap();
    assert!(next.metadata.resource_version.unwrap().parse::<i64>().unwrap() > max);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_beyond_the_inflight_limit_get_429() {
    use tokio::io::AsyncWriteExt as _;
    // The API server alone: the loops' own writes (default service accounts...) would take
    // the single mutating slot at start.
    let s = Server::start_with(&["--max-mutating-requests-inflight", "1", "--controllers="]);
    // One mutating request stays in flight: its body never finishes arriving.
    let (mut slow, token) = common::raw_tls(&s).await;
    let head = format!(
        "POST /api/v1/namespaces/default/configmaps HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"apiVersion\":"
    );
    slow.write_all(head.as_bytes()).await.unwrap();
    slow.flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (mut other, token) = common::raw_tls(&s).await;
    let body = r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"second"}}"#;
    let req = format!(
        "POST /api/v1/namespaces/default/configmaps HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    other.write_all(req.as_bytes()).await.unwrap();
    let head = common::read_head(&mut other).await;
    assert!(head.starts_with("HTTP/1.1 429"), "{head}");
    assert!(head.to_lowercase().contains("retry-after: 1"), "{head}");
    // reads have their own budget and still work
    let cms: Api<ConfigMap> = Api::namespaced(s.client().await, "default");
    assert!(cms.list(&ListParams::default()).await.unwrap().items.is_empty());
    drop(slow);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_without_a_class_gets_the_newest_default_class() {
    let s = common::Server::start_with(WITHOUT_ROOT_CA);
    let claim = |name: &str, class: &str| {
        format!("apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: {name}\nspec:\n{class}  accessModes: [ReadWriteOnce]\n  resources:\n    requests:\n      storage: 1Gi\n")
    };
    let class_of = |name: &str| s.ok(&["get", "pvc", name, "-o", "jsonpath={.spec.storageClassName}"]);
    // No default class yet: the claim keeps no class.
    s.apply(&claim("before", ""));
    assert_eq!(class_of("before"), "");
    let sc = |name: &str, default: bool| {
        format!(
            "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata:\n  name: {name}\n  annotations:\n    storageclass.kubernetes.io/is-default-class: \"{default}\"\nprovisioner: loop.csi.ferro.dev\n"
        )
    };
    s.apply(&sc("plain", false));
    s.apply(&sc("first", true));
    s.apply(&claim("one", ""));
    assert_eq!(class_of("one"), "first");
    // Several defaults: the newest wins (creationTimestamp has second resolution, so wait for
    // the clock to pass a second boundary before creating the second one).
    let created = s.ok(&["get", "sc", "first", "-o", "jsonpath={.metadata.creationTimestamp}"]);
    while jiff::Timestamp::now().to_string()[..19] <= created[..19] {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    s.apply(&sc("second", true));
    s.apply(&claim("two", ""));
    assert_eq!(class_of("two"), "second");
    // An explicit class, or "" (no class), is kept.
    s.apply(&claim("explicit", "  storageClassName: plain\n"));
    assert_eq!(class_of("explicit"), "plain");
    s.apply(&claim("none", "  storageClassName: \"\"\n"));
    assert_eq!(class_of("none"), "");
    assert_eq!(class_of("before"), "", "existing claims are not changed by admission");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_grow_only_when_bound_and_their_class_allows_it() {
    let s = common::Server::start_with(WITHOUT_ROOT_CA);
    let sc = |name: &str, expand: bool| {
        format!("apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata:\n  name: {name}\nprovisioner: loop.csi.ferro.dev\nallowVolumeExpansion: {expand}\n")
    };
    s.apply(&sc("grows", true));
    s.apply(&sc("fixed", false));
    let claim = |name: &str, class: &str, size: &str| {
        format!("apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: {name}\nspec:\n  storageClassName: {class}\n  accessModes: [ReadWriteOnce]\n  resources:\n    requests:\n      storage: {size}\n")
    };
    // A volume pre-bound to each claim, so the PV controller binds them.
    for (name, class) in [("a", "grows"), ("b", "fixed")] {
        s.apply(&format!(
            "apiVersion: v1\nkind: PersistentVolume\nmetadata:\n  name: pv-{name}\nspec:\n  storageClassName: {class}\n  capacity: {{storage: 1Gi}}\n  accessModes: [ReadWriteOnce]\n  claimRef: {{namespace: default, name: {name}}}\n  csi: {{driver: loop.csi.ferro.dev, volumeHandle: h-{name}}}\n"
        ));
        s.apply(&claim(name, class, "1Gi"));
    }
    s.apply(&claim("unbound", "grows", "1Gi"));
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while ["a", "b"].iter().any(|c| s.ok(&["get", "pvc", c, "-o", "jsonpath={.spec.volumeName}"]).is_empty()) {
        assert!(std::time::Instant::now() < deadline, "claims not bound\n{}", s.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let resize = |name: &str, size: &str| {
        let patch = format!("{{\"spec\":{{\"resources\":{{\"requests\":{{\"storage\":\"{size}\"}}}}}}}}");
        s.kubectl(&["patch", "pvc", name, "--type=merge", "-p", &patch])
    };
    let out = resize("a", "2Gi");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(s.ok(&["get", "pvc", "a", "-o", "jsonpath={.spec.resources.requests.storage}"]), "2Gi");
    for (name, size, why) in [
        ("a", "1Gi", "field can not be less than previous value"),
        ("b", "2Gi", "the storageclass that provisions the pvc must support resize"),
        ("unbound", "2Gi", "only dynamically provisioned pvc can be resized"),
    ] {
        let out = resize(name, size);
        assert!(!out.status.success(), "{name} resized to {size}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("spec.resources.requests.storage") && err.contains(why), "{name}: {err}");
    }
}

/// Graceful deletion as upstream: a bound pod being deleted stays, whatever is written to it
/// (the kubelet's status updates), until a delete with grace 0; with a finalizer left, that
/// delete shortens the grace to 0 and the pod goes with its last finalizer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gracefully_deleted_pod_stays_until_its_grace_0_delete() {
    let s = Server::start_with(&["--controllers", "garbagecollector"]);
    let client = s.client().await;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let pod = |name: &str, finalizers: serde_json::Value| -> Pod {
        serde_json::from_value(json!({"metadata": {"name": name, "finalizers": finalizers},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]}}))
        .unwrap()
    };
    pods.create(&PostParams::default(), &pod("plain", json!([]))).await.unwrap();
    pods.delete("plain", &DeleteParams::default()).await.unwrap();
    let p = pods.get("plain").await.unwrap();
    assert!(p.metadata.deletion_timestamp.is_some());
    assert_eq!(p.metadata.deletion_grace_period_seconds, Some(30));
    // The kubelet's status write while the containers stop: the pod stays.
    let status = json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}]}});
    pods.patch_status("plain", &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
    assert!(pods.get_opt("plain").await.unwrap().is_some(), "a status write finished a graceful deletion");
    // Its final delete with grace 0.
    pods.delete("plain", &DeleteParams::default().grace_period(0)).await.unwrap();
    assert!(pods.get_opt("plain").await.unwrap().is_none());

    pods.create(&PostParams::default(), &pod("held", json!(["example.com/hold"]))).await.unwrap();
    pods.delete("held", &DeleteParams::default()).await.unwrap();
    pods.delete("held", &DeleteParams::default().grace_period(0)).await.unwrap();
    let p = pods.get("held").await.unwrap();
    assert_eq!(p.metadata.deletion_grace_period_seconds, Some(0), "grace 0 shortens the deletion");
    pods.patch("held", &PatchParams::default(), &Patch::Merge(&json!({"metadata": {"finalizers": null}}))).await.unwrap();
    assert!(pods.get_opt("held").await.unwrap().is_none(), "the last finalizer completes it");
}
