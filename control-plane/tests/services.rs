//! Service ClusterIP and NodePort allocation through the API (claims in the store): a taken
//! address or port is refused, updates claim and give back, a dry run claims nothing, a delete
//! gives everything back, a restart keeps the claims.
#![allow(clippy::unwrap_used)]

mod common;

use common::Server;
use k8s_openapi::api::core::v1::Service;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::Api;
use serde_json::json;

fn svc(name: &str, spec: serde_json::Value) -> Service {
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap()
}

fn status(e: kube::Error) -> (u16, String) {
    match e {
        kube::Error::Api(st) => (st.code, st.message),
        other => panic!("{other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn addresses_and_node_ports_are_claimed_once_and_given_back() {
    let mut s = Server::start();
    let svcs: Api<Service> = Api::namespaced(s.client().await, "default");
    let pp = PostParams::default();
    let a = svcs
        .create(&pp, &svc("a", json!({"type": "NodePort", "clusterIP": "10.96.0.50", "ports": [{"port": 80, "nodePort": 30050}]})))
        .await
        .unwrap();
    assert_eq!(a.spec.unwrap().cluster_ip.as_deref(), Some("10.96.0.50"));

    // taken: refused with upstream's messages, nothing stored
    let (code, msg) = status(svcs.create(&pp, &svc("b", json!({"clusterIP": "10.96.0.50", "ports": [{"port": 80}]}))).await.unwrap_err());
    assert_eq!(code, 422);
    assert!(msg.contains("provided IP is already allocated"), "{msg}");
    let (code, msg) = status(
        svcs.create(&pp, &svc("b", json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": 30050}]}))).await.unwrap_err(),
    );
    assert_eq!(code, 422);
    assert!(msg.contains("provided port is already allocated"), "{msg}");
    assert!(svcs.get_opt("b").await.unwrap().is_none());
    // the failed create above gave back the address it had picked before the port failed: the
    // range's addresses and ports are all still free except a's
    let dry = PostParams { dry_run: true, ..Default::default() };
    svcs.create(&dry, &svc("c", json!({"clusterIP": "10.96.0.51", "type": "NodePort", "ports": [{"port": 80, "nodePort": 30051}]})))
        .await
        .unwrap();
    // a dry run claimed nothing
    let c = svcs
        .create(&pp, &svc("c", json!({"clusterIP": "10.96.0.51", "type": "NodePort", "ports": [{"port": 80, "nodePort": 30051}]})))
        .await
        .unwrap();
    assert_eq!(c.spec.unwrap().ports.unwrap()[0].node_port, Some(30051));

    // an update from NodePort to ClusterIP gives the port back
    svcs.patch("a", &PatchParams::default(), &Patch::Merge(json!({"spec": {"type": "ClusterIP", "ports": [{"port": 80}]}})))
        .await
        .unwrap();
    svcs.create(&pp, &svc("d", json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": 30050}]}))).await.unwrap();

    // the claims survive a restart (from the store, not this process's memory)
    s.restart();
    let svcs: Api<Service> = Api::namespaced(s.client().await, "default");
    let (code, _) = status(svcs.create(&pp, &svc("e", json!({"clusterIP": "10.96.0.51", "ports": [{"port": 80}]}))).await.unwrap_err());
    assert_eq!(code, 422);

    // a delete gives everything back
    svcs.delete("c", &DeleteParams::default()).await.unwrap();
    svcs.create(&pp, &svc("e", json!({"clusterIP": "10.96.0.51", "type": "NodePort", "ports": [{"port": 80, "nodePort": 30051}]})))
        .await
        .unwrap();
}
