//! Privileged: the real backends load their rules into a node namespace, and real packets
//! (curl between namespaces) reach the endpoints the rules say.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;

use common::{World, CLIENT_IP, CLUSTER_CIDR};
use ferro_proxy::controller::Backend;
use ferro_proxy::iptables::backend::IptablesBackend;
use ferro_proxy::nftables::backend::NftBackend;
use ferro_proxy::model::{self, Family, FamilyModel, NodeInfo};
use ferro_proxy::slim::Service;
use ferro_proxy::slim::EndpointSlice;
use serde_json::json;

fn node() -> NodeInfo {
    NodeInfo { name: "node-a".into(), zone: None }
}

/// A Service `name` (port 80 -> 8080) with `spec` merged in, and its slice of `pods` (index,
/// ready) of the world.
fn objects(w: &World, name: &str, spec: serde_json::Value, pods: &[(usize, bool)]) -> (Service, EndpointSlice) {
    let mut s = json!({"clusterIP": format!("10.96.0.{}", 10 + name.len()), "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]});
    for (k, v) in spec.as_object().unwrap() {
        s[k] = v.clone();
    }
    let svc = serde_json::from_value(json!({"metadata": {"namespace": "default", "name": name}, "spec": s})).unwrap();
    let eps: Vec<_> = pods
        .iter()
        .map(|(i, ready)| json!({"addresses": [w.pods[*i].ip], "conditions": {"ready": ready}, "nodeName": "node-a"}))
        .collect();
    let slice = serde_json::from_value(json!({
        "metadata": {"namespace": "default", "name": format!("{name}-1"), "labels": {"kubernetes.io/service-name": name}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": eps,
    }))
    .unwrap();
    (svc, slice)
}

fn build(objs: &[(Service, EndpointSlice)]) -> Vec<FamilyModel> {
    let services: Vec<Arc<Service>> = objs.iter().map(|(s, _)| Arc::new(s.clone())).collect();
    let slices: Vec<Arc<EndpointSlice>> = objs.iter().map(|(_, e)| Arc::new(e.clone())).collect();
    let (m, problems) = model::build(Family::V4, &services, &slices, &node());
    assert!(problems.is_empty(), "{problems:?}");
    vec![m]
}

/// The set of pod names answering `n` requests to `url` from `get`.
fn answers(n: usize, mut get: impl FnMut() -> Result<String, common::Failure>) -> BTreeSet<String> {
    (0..n).map(|_| get().unwrap()).collect()
}

/// The real netlink probe, inside the world's node namespace.
fn counter(w: &World) -> Box<dyn ferro_proxy::nfcount::RuleCounter> {
    Box::new(ferro_proxy::nfcount::Netlink::in_namespace(w.node.path()))
}

fn backend(w: &World, mode: &str) -> Box<dyn Backend> {
    let cidrs = vec![CLUSTER_CIDR.parse().unwrap()];
    match mode {
        "iptables" => Box::new(IptablesBackend::new(w.runner(), counter(w), cidrs, false, vec![])),
        "nftables" => Box::new(NftBackend::new(w.runner(), counter(w), cidrs, false, vec![])),
        m => panic!("no mode {m}"),
    }
}

/// A restarted ferro-proxy (a new backend, nothing committed) removes the chains of a
/// Service deleted while it was down: its first, full sync reads the nat table's chains
/// through the netlink chain dump (the same names iptables-save lists), not iptables-save.
#[test]
#[ignore = "privileged: needs root and network namespaces; run by scripts/test.sh"]
fn iptables_a_restart_removes_the_chains_of_a_service_deleted_meanwhile() {
    use ferro_proxy::exec::Runner as _;
    let w = World::new("ipr", 3).unwrap();
    let web = objects(&w, "web", json!({}), &[(1, true)]);
    let gone = objects(&w, "gone", json!({}), &[(1, true), (2, true)]);
    let mut first = backend(&w, "iptables");
    first.sync(&build(&[web.clone(), gone]), &node(), false).unwrap();
    drop(first);
    let chains = |prefix: &str| {
        let saved = w.runner().run("iptables-save", &["-t", "nat"], None).unwrap();
        ferro_proxy::iptables::rules::saved_chains(&saved).into_iter().filter(|c| c.starts_with(prefix)).count()
    };
    assert_eq!((chains("KUBE-SVC-"), chains("KUBE-SEP-")), (2, 3));
    let saved = w.runner().run("iptables-save", &["-t", "nat"], None).unwrap();
    // iptables-save also prints the built-in chains iptables-nft did not create (INPUT here)
    let builtin = ["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"];
    let own = |set: BTreeSet<String>| set.into_iter().filter(|c| !builtin.contains(&c.as_str())).collect::<BTreeSet<_>>();
    let dumped = own(counter(&w).chains(Family::V4, "nat").unwrap());
    assert_eq!(dumped, own(ferro_proxy::iptables::rules::saved_chains(&saved)), "the netlink dump and iptables-save list other chains");
    assert_eq!(dumped.len(), 10, "{dumped:?}");

    let mut second = backend(&w, "iptables");
    let rep = second.sync(&build(std::slice::from_ref(&web)), &node(), false).unwrap();
    assert!(rep.full);
    assert_eq!((chains("KUBE-SVC-"), chains("KUBE-SEP-")), (1, 1), "the deleted Service's chains stayed");
    let vip = web.0.spec.as_ref().unwrap().cluster_ip.clone().unwrap();
    assert_eq!(w.get_in_pod(0, &format!("http://{vip}/")).unwrap(), "pod1");
}

#[test]
#[ignore = "privileged: needs root and network namespaces; run by scripts/test.sh"]
fn the_fixture_routes_pods_and_client() {
    let w = World::new("fx", 2).unwrap();
    assert_eq!(w.get_in_pod(0, "http://10.244.0.12:8080/").unwrap(), "pod1");
    assert_eq!(w.get_in_node("http://10.244.0.11:8080/").unwrap(), "pod0");
    assert_eq!(World::remote_ip(&w.get_in_client("http://10.244.0.11:8080/cgi-bin/ip").unwrap()), CLIENT_IP);
}

fn cluster_ip_node_port_and_no_endpoints(mode: &str) {
    let w = World::new(&format!("{}1", &mode[..3]), 3).unwrap();
    let mut b = backend(&w, mode);
    let web = objects(&w, "web", json!({"type": "NodePort", "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP", "nodePort": 30080}]}), &[(1, true), (2, true)]);
    let empty = objects(&w, "empty", json!({}), &[]);
    let vip = web.0.spec.as_ref().unwrap().cluster_ip.clone().unwrap();
    let empty_vip = empty.0.spec.as_ref().unwrap().cluster_ip.clone().unwrap();
    let rep = b.sync(&build(&[web.clone(), empty.clone()]), &node(), false).unwrap();
    assert!(rep.full);
    let url = format!("http://{vip}/");
    // a pod and the node reach the ClusterIP, spread over both endpoints
    assert_eq!(answers(30, || w.get_in_pod(0, &url)), BTreeSet::from(["pod1".to_string(), "pod2".to_string()]));
    assert_eq!(answers(30, || w.get_in_node(&url)), BTreeSet::from(["pod1".to_string(), "pod2".to_string()]));
    // a client outside the node reaches the NodePort, masqueraded (Cluster policy)
    let seen = World::remote_ip(&w.get_in_client(&format!("http://{}:30080/cgi-bin/ip", common::NODE_IP)).unwrap());
    assert_ne!(seen, CLIENT_IP);
    // no endpoints: refused at once (curl 7), not a timeout (28)
    let e = w.get_in_pod(0, &format!("http://{empty_vip}/")).unwrap_err();
    assert_eq!(e.code, 7, "{e:?}");
    // hairpin: pod1 through the Service to itself (only endpoint)
    let solo = objects(&w, "solo", json!({}), &[(1, true)]);
    let solo_vip = solo.0.spec.as_ref().unwrap().cluster_ip.clone().unwrap();
    let rep = b.sync(&build(&[web.clone(), empty.clone(), solo.clone()]), &node(), false).unwrap();
    assert!(!rep.full);
    assert_eq!(w.get_in_pod(1, &format!("http://{solo_vip}/")).unwrap(), "pod1");
    // readiness lost: the endpoint leaves the rules (partial sync)
    let web2 = objects(&w, "web", json!({"type": "NodePort", "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP", "nodePort": 30080}]}), &[(1, true), (2, false)]);
    b.sync(&build(&[web2, empty, solo]), &node(), false).unwrap();
    assert_eq!(answers(20, || w.get_in_pod(0, &url)), BTreeSet::from(["pod1".to_string()]));
    // the rules survive as the kernel has them: no drift
    assert!(!b.drifted());
}

fn affinity_local_policy_and_drift(mode: &str) {
    let w = World::new(&format!("{}2", &mode[..3]), 3).unwrap();
    let mut b = backend(&w, mode);
    let sticky = objects(&w, "sticky", json!({"sessionAffinity": "ClientIP"}), &[(1, true), (2, true)]);
    let local = objects(
        &w,
        "local",
        json!({"type": "NodePort", "externalTrafficPolicy": "Local", "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP", "nodePort": 30081}]}),
        &[(2, true)],
    );
    b.sync(&build(&[sticky.clone(), local.clone()]), &node(), false).unwrap();
    let vip = sticky.0.spec.as_ref().unwrap().cluster_ip.clone().unwrap();
    // ClientIP affinity: one client, one endpoint
    assert_eq!(answers(20, || w.get_in_pod(0, &format!("http://{vip}/"))).len(), 1);
    // externalTrafficPolicy=Local keeps the client's address
    let seen = World::remote_ip(&w.get_in_client(&format!("http://{}:30081/cgi-bin/ip", common::NODE_IP)).unwrap());
    assert_eq!(seen, CLIENT_IP);
    // someone flushes every chain (iptables) or the dispatch chain (nftables): the drift check
    // says so, a full sync repairs it
    if mode == "iptables" {
        lab_run(&w, &["iptables", "-t", "nat", "-F"]);
        lab_run(&w, &["iptables", "-t", "mangle", "-F"]);
    } else {
        lab_run(&w, &["nft", "flush", "chain", "ip", "kube-proxy", "services"]);
    }
    assert!(w.get_in_pod(0, &format!("http://{vip}/")).is_err());
    assert!(b.drifted());
    let rep = b.sync(&build(&[sticky, local]), &node(), false).unwrap();
    assert!(rep.full);
    assert!(w.get_in_pod(0, &format!("http://{vip}/")).is_ok());
    assert!(!b.drifted());
}

fn lab_run(w: &World, args: &[&str]) {
    let mut c = std::process::Command::new("ip");
    c.args(["netns", "exec", w.node.name()]).args(args);
    ferro_lab::run(&mut c).unwrap();
}

#[test]
#[ignore = "privileged: needs root and network namespaces; run by scripts/test.sh"]
fn iptables_cluster_ip_node_port_and_no_endpoints() {
    cluster_ip_node_port_and_no_endpoints("iptables");
}

#[test]
#[ignore = "privileged: needs root and network namespaces; run by scripts/test.sh"]
fn nftables_cluster_ip_node_port_and_no_endpoints() {
    cluster_ip_node_port_and_no_endpoints("nftables");
}

#[test]
#[ignore = "privileged: needs root and network namespaces; run by scripts/test.sh"]
fn iptables_affinity_local_policy_and_drift() {
    affinity_local_policy_and_drift("iptables");
}

#[test]
#[ignore = "privileged: needs root and network namespaces; run by scripts/test.sh"]
fn nftables_affinity_local_policy_and_drift() {
    affinity_local_policy_and_drift("nftables");
}

#[test]
#[ignore = "privileged: needs root and network namespaces; run by scripts/test.sh"]
fn nftables_table_deleted_is_drift() {
    let w = World::new("nftdel", 2).unwrap();
    let mut b = backend(&w, "nftables");
    let web = objects(&w, "web", json!({}), &[(1, true)]);
    b.sync(&build(std::slice::from_ref(&web)), &node(), false).unwrap();
    lab_run(&w, &["nft", "delete", "table", "ip", "kube-proxy"]);
    assert!(b.drifted());
    assert!(b.sync(&build(&[web]), &node(), false).unwrap().full);
    assert!(!b.drifted());
}

/// A rule the kernel refuses: two Services claiming one ClusterIP and port (the API server
/// forbids it, but a proxy can see it for a moment: a Service deleted and its address reused
/// before the deletion reaches the informer). nftables refuses the second map element, so the
/// whole transaction; the backend names the service port the refused line belongs to, and
/// without it (the sync loop leaves it out until it changes) the rest is programmed.
#[test]
#[ignore = "privileged: needs root and network namespaces; run by scripts/test.sh"]
fn nftables_names_the_service_port_the_kernel_refused() {
    let w = World::new("nfref", 1).unwrap();
    let mut b = backend(&w, "nftables");
    let web = objects(&w, "web", json!({}), &[(0, true)]);
    let vip = web.0.spec.as_ref().unwrap().cluster_ip.clone().unwrap();
    let dup = objects(&w, "dup", json!({"clusterIP": vip}), &[(0, true)]);
    let other = objects(&w, "other", json!({}), &[(0, true)]);
    let other_vip = other.0.spec.as_ref().unwrap().cluster_ip.clone().unwrap();
    let all = [web.clone(), dup.clone(), other.clone()];
    let e = b.sync(&build(&all), &node(), false).unwrap_err();
    let ferro_proxy::error::SyncError::Refused { service, family, source } = &e else {
        panic!("not attributed to a service port: {e}: {:?}", std::error::Error::source(&e));
    };
    assert_eq!(*family, Family::V4);
    assert!(["web", "dup"].contains(&&*service.name), "{service}");
    assert!(source.to_string().contains("File exists"), "{source}");
    // nothing of the refused transaction is in the kernel
    assert!(w.get_in_node(&format!("http://{other_vip}/")).is_err());
    // without the named one, everything else is programmed
    let rest: Vec<(Service, EndpointSlice)> =
        all.into_iter().filter(|(s, _)| s.metadata.name.as_deref() != Some(&*service.name)).collect();
    b.sync(&build(&rest), &node(), false).unwrap();
    assert_eq!(w.get_in_node(&format!("http://{other_vip}/")).unwrap(), "pod0");
    assert_eq!(w.get_in_node(&format!("http://{vip}/")).unwrap(), "pod0");
}
