//! Privileged: nftables partial syncs written through nftables netlink (one batch, no `nft`)
//! leave the kernel with the same table as `nft -f` of a full sync of the same model, packets
//! follow them, and a batch the kernel refuses changes nothing.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::{World, CLUSTER_CIDR};
use ferro_lab::netns::NetNs;
use ferro_proxy::controller::Backend;
use ferro_proxy::model::{self, Family, FamilyModel, NodeInfo, Protocol};
use ferro_proxy::nftables::backend::NftBackend;
use ferro_proxy::nftables::netlink::{BatchError, Kernel, Key, NftWriter, Op, Verdict};
use ferro_proxy::slim::Service;
use ferro_proxy::slim::EndpointSlice;
use serde_json::json;

fn node() -> NodeInfo {
    NodeInfo { name: "node-a".into(), zone: None }
}

/// A Service `name` at `vip` (port 80 -> 8080) with `spec` merged in, and its slice of `pods`.
fn objects(w: &World, name: &str, vip: &str, spec: serde_json::Value, pods: &[usize]) -> (Service, EndpointSlice) {
    let mut s = json!({"clusterIP": vip, "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]});
    for (k, v) in spec.as_object().unwrap() {
        s[k] = v.clone();
    }
    let svc = serde_json::from_value(json!({"metadata": {"namespace": "default", "name": name}, "spec": s})).unwrap();
    let eps: Vec<_> = pods
        .iter()
        .map(|i| json!({"addresses": [w.pods[*i].ip], "conditions": {"ready": true}, "nodeName": "node-a"}))
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

/// The real writer, counting the batches it wrote.
struct Counting(Kernel, Arc<AtomicUsize>);

impl NftWriter for Counting {
    fn apply(&mut self, family: Family, table: &str, ops: &[Op]) -> Result<(), BatchError> {
        self.0.apply(family, table, ops)?;
        self.1.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

fn backend(ns: &str, writer: Option<Counting>) -> NftBackend<common::InNs> {
    let cidrs = vec![CLUSTER_CIDR.parse().unwrap()];
    let counter = Box::new(ferro_proxy::nfcount::Netlink::in_namespace(format!("/run/netns/{ns}")));
    let b = NftBackend::new(common::InNs(ns.to_string()), counter, cidrs, false, vec![]);
    match writer {
        Some(w) => b.with_writer(Box::new(w)),
        None => b,
    }
}

/// `nft list table ip kube-proxy` in `ns`, the items of each `elements = { ... }` sorted (a
/// hash set lists its elements in bucket order, which depends on insertion history), and the
/// table's blocks sorted.
fn listing(ns: &str) -> String {
    listing_of(ns, "ip")
}

fn listing_of(ns: &str, family: &str) -> String {
    let out = ferro_lab::run(std::process::Command::new("ip").args(["netns", "exec", ns, "nft", "list", "table", family, "kube-proxy"])).unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut norm = String::new();
    let mut rest = text.as_str();
    while let Some(at) = rest.find("elements = {") {
        let open = at + "elements = {".len();
        let close = open + rest[open..].find('}').unwrap();
        let mut items: Vec<&str> = rest[open..close].split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
        items.sort();
        norm.push_str(&rest[..open]);
        norm.push(' ');
        norm.push_str(&items.join(", "));
        norm.push_str(" }");
        rest = &rest[close + 1..];
    }
    norm.push_str(rest);
    // the table's sets, maps and chains as a set too: the kernel lists chains in the order they
    // were added, so a chain a partial sync added comes after older ones a full sync orders
    // by name
    let body = norm.trim_end().strip_suffix('}').unwrap_or(&norm).trim_end();
    let mut blocks: Vec<&str> = body.split("\n\n").collect();
    let head = blocks.remove(0);
    blocks.sort();
    format!("{head}\n\n{}\n}}\n", blocks.join("\n\n"))
}

#[test]
#[ignore = "privileged: needs root and network namespaces; run by scripts/test.sh"]
fn partial_syncs_through_netlink_list_as_a_full_nft_sync_does() {
    let w = World::new("nfnl", 3).unwrap();
    let full_ns = NetNs::new(&NetNs::unique_name("fpx-nfnl-full")).unwrap();
    let web = objects(&w, "web", "10.96.0.10", json!({}), &[1, 2]);
    let np = json!({"type": "NodePort", "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP", "nodePort": 30082}]});
    let local = json!({"type": "NodePort", "externalTrafficPolicy": "Local", "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP", "nodePort": 30083}]});
    // (what, before, after, written through netlink)
    let cases = vec![
        ("add a Service with no endpoints", vec![web.clone()], vec![web.clone(), objects(&w, "empty", "10.96.0.20", json!({}), &[])], true),
        ("remove a Service", vec![web.clone(), objects(&w, "gone", "10.96.0.21", json!({}), &[1])], vec![web.clone()], true),
        (
            "endpoints gone: reject",
            vec![web.clone(), objects(&w, "drain", "10.96.0.22", json!({}), &[1, 2])],
            vec![web.clone(), objects(&w, "drain", "10.96.0.22", json!({}), &[])],
            true,
        ),
        ("remove a NodePort Service", vec![web.clone(), objects(&w, "np", "10.96.0.23", np.clone(), &[1])], vec![web.clone()], true),
        (
            "remove a Service with session affinity",
            vec![web.clone(), objects(&w, "sticky", "10.96.0.24", json!({"sessionAffinity": "ClientIP"}), &[1, 2])],
            vec![web.clone()],
            true,
        ),
        (
            "remove an externalTrafficPolicy=Local NodePort",
            vec![web.clone(), objects(&w, "local", "10.96.0.25", local.clone(), &[2])],
            vec![web.clone()],
            true,
        ),
        ("NodePort with no endpoints", vec![web.clone()], vec![web.clone(), objects(&w, "np0", "10.96.0.26", np.clone(), &[])], true),
        // rules: service and endpoint chains written through netlink too
        ("remove an endpoint", vec![web.clone()], vec![objects(&w, "web", "10.96.0.10", json!({}), &[1])], true),
        ("add an endpoint", vec![web.clone()], vec![objects(&w, "web", "10.96.0.10", json!({}), &[0, 1, 2])], true),
        ("replace an endpoint", vec![web.clone()], vec![objects(&w, "web", "10.96.0.10", json!({}), &[0, 2])], true),
        ("add a Service with endpoints", vec![web.clone()], vec![web.clone(), objects(&w, "new", "10.96.0.27", json!({}), &[0, 1, 2])], true),
        ("endpoints back after none", vec![objects(&w, "web", "10.96.0.10", json!({}), &[])], vec![web.clone()], true),
        (
            "add a NodePort Service with endpoints",
            vec![web.clone()],
            vec![web.clone(), objects(&w, "np1", "10.96.0.28", np.clone(), &[1, 2])],
            true,
        ),
        // not encoded: affinity's named sets and dynset, the fib rules of a Local policy
        (
            "add an endpoint to a Service with session affinity",
            vec![web.clone(), objects(&w, "sticky", "10.96.0.24", json!({"sessionAffinity": "ClientIP"}), &[1])],
            vec![web.clone(), objects(&w, "sticky", "10.96.0.24", json!({"sessionAffinity": "ClientIP"}), &[1, 2])],
            false,
        ),
        (
            "add an externalTrafficPolicy=Local NodePort",
            vec![web.clone()],
            vec![web.clone(), objects(&w, "local", "10.96.0.25", local.clone(), &[2])],
            false,
        ),
    ];
    for (what, before, after, through_netlink) in cases {
        let batches = Arc::new(AtomicUsize::new(0));
        let mut partial = backend(w.node.name(), Some(Counting(Kernel::new(Some(w.node.path().into())), batches.clone())));
        assert!(partial.sync(&build(&before), &node(), false).unwrap().full, "{what}: cold start");
        assert_eq!(batches.load(Ordering::SeqCst), 0, "{what}: the cold start is nft -f");
        assert!(!partial.sync(&build(&after), &node(), false).unwrap().full, "{what}: partial");
        assert_eq!(batches.load(Ordering::SeqCst), usize::from(through_netlink), "{what}: netlink batches");
        let mut full = backend(full_ns.name(), None);
        assert!(full.sync(&build(&after), &node(), false).unwrap().full);
        assert_eq!(listing(w.node.name()), listing(full_ns.name()), "{what}: netlink partial vs nft -f full");
        assert!(!partial.drifted(), "{what}");
    }
    // the data path after netlink-written changes: a Service whose endpoints went away refuses
    // at once (curl 7, not a timeout); endpoint changes reach the new endpoints only
    let batches = Arc::new(AtomicUsize::new(0));
    let mut b = backend(w.node.name(), Some(Counting(Kernel::new(Some(w.node.path().into())), batches.clone())));
    let drain = objects(&w, "drain", "10.96.0.22", json!({}), &[1, 2]);
    b.sync(&build(&[web.clone(), drain]), &node(), false).unwrap();
    assert_eq!(w.get_in_pod(0, "http://10.96.0.22/").unwrap().len(), 4, "pod1 or pod2 answers");
    b.sync(&build(&[web.clone(), objects(&w, "drain", "10.96.0.22", json!({}), &[])]), &node(), false).unwrap();
    assert_eq!(batches.load(Ordering::SeqCst), 1);
    let e = w.get_in_pod(0, "http://10.96.0.22/").unwrap_err();
    assert_eq!(e.code, 7, "{e:?}");
    assert_eq!(w.get_in_pod(0, "http://10.96.0.10/").unwrap().len(), 4, "web still answers");
    let answers = |url: &str| -> std::collections::BTreeSet<String> { (0..12).map(|_| w.get_in_pod(0, url).unwrap()).collect() };
    // web [pod1, pod2] -> [pod2]: only pod2 answers
    b.sync(&build(&[objects(&w, "web", "10.96.0.10", json!({}), &[2])]), &node(), false).unwrap();
    assert_eq!(batches.load(Ordering::SeqCst), 2);
    assert_eq!(answers("http://10.96.0.10/"), ["pod2".to_string()].into());
    // [pod2] -> [pod1]: the endpoint replaced
    b.sync(&build(&[objects(&w, "web", "10.96.0.10", json!({}), &[1])]), &node(), false).unwrap();
    assert_eq!(batches.load(Ordering::SeqCst), 3);
    assert_eq!(answers("http://10.96.0.10/"), ["pod1".to_string()].into());
    // hairpin through a netlink-written endpoint chain: pod1 reaching itself via the Service
    assert_eq!(w.get_in_pod(1, "http://10.96.0.10/").unwrap(), "pod1");
    // [pod1] -> [pod1, pod2]: both answer (numgen over the new anonymous map), from a new
    // Service too
    b.sync(
        &build(&[objects(&w, "web", "10.96.0.10", json!({}), &[1, 2]), objects(&w, "fresh", "10.96.0.30", json!({}), &[2])]),
        &node(),
        false,
    )
    .unwrap();
    assert_eq!(batches.load(Ordering::SeqCst), 4);
    let spread: std::collections::BTreeSet<String> = (0..40).map(|_| w.get_in_pod(0, "http://10.96.0.10/").unwrap()).collect();
    assert_eq!(spread, ["pod1".to_string(), "pod2".to_string()].into(), "random over two endpoints: 40 tries miss one with p = 2^-39");
    assert_eq!(answers("http://10.96.0.30/"), ["pod2".to_string()].into());
    assert!(!b.drifted());
}

#[test]
#[ignore = "privileged: needs root and network namespaces; run by scripts/test.sh"]
fn a_batch_the_kernel_refuses_changes_nothing() {
    let w = World::new("nfnlbad", 1).unwrap();
    let web = objects(&w, "web", "10.96.0.10", json!({}), &[0]);
    let mut b = backend(w.node.name(), None);
    b.sync(&build(&[web]), &node(), false).unwrap();
    let before = listing(w.node.name());
    let mut k = Kernel::new(Some(w.node.path().into()));
    let ok = Op::AddElement { set: "cluster-ips", key: Key::Addr("10.96.9.9".parse().unwrap()), comment: None, verdict: None };
    let bad = Op::AddElement {
        set: "service-ips",
        key: Key::AddrProtoPort("10.96.9.9".parse().unwrap(), Protocol::Tcp, 80),
        comment: None,
        verdict: Some(Verdict::Goto("no-such-chain".into())),
    };
    let e = k.apply(Family::V4, "kube-proxy", &[ok.clone(), bad, Op::FlushChain("services".into())]).unwrap_err();
    assert!(matches!(e, BatchError::Refused { index: Some(1), errno: 2 }), "{e:?}");
    assert_eq!(listing(w.node.name()), before, "nothing of the refused batch is in the kernel");
    // the same socket path works for a good batch afterwards
    k.apply(Family::V4, "kube-proxy", &[ok]).unwrap();
    assert!(listing(w.node.name()).contains("10.96.9.9"));
}

/// An IPv6 Service `name` at `vip` with endpoints `eps` (no pods: the listing is compared).
fn objects6(name: &str, vip: &str, eps: &[&str]) -> (Service, EndpointSlice) {
    let svc = serde_json::from_value(json!({"metadata": {"namespace": "default", "name": name}, "spec": {
        "clusterIP": vip, "ipFamilies": ["IPv6"], "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}}))
    .unwrap();
    let eps: Vec<_> = eps.iter().map(|ip| json!({"addresses": [ip], "conditions": {"ready": true}, "nodeName": "node-a"})).collect();
    let slice = serde_json::from_value(json!({
        "metadata": {"namespace": "default", "name": format!("{name}-1"), "labels": {"kubernetes.io/service-name": name}},
        "addressType": "IPv6",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": eps,
    }))
    .unwrap();
    (svc, slice)
}

fn build6(objs: &[(Service, EndpointSlice)]) -> Vec<FamilyModel> {
    let services: Vec<Arc<Service>> = objs.iter().map(|(s, _)| Arc::new(s.clone())).collect();
    let slices: Vec<Arc<EndpointSlice>> = objs.iter().map(|(_, e)| Arc::new(e.clone())).collect();
    let (m, problems) = model::build(Family::V6, &services, &slices, &node());
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(m.services.len(), objs.len());
    vec![m]
}

fn backend6(ns: &NetNs, writer: Option<Counting>) -> NftBackend<common::InNs> {
    // a /60: the masquerade match's prefix is masked with bitwise (not whole bytes)
    let cidrs = vec!["fd00:10::/60".parse().unwrap()];
    let counter = Box::new(ferro_proxy::nfcount::Netlink::in_namespace(ns.path()));
    let b = NftBackend::new(common::InNs(ns.name().to_string()), counter, cidrs, false, vec![]);
    match writer {
        Some(w) => b.with_writer(Box::new(w)),
        None => b,
    }
}

#[test]
#[ignore = "privileged: needs root and network namespaces; run by scripts/test.sh"]
fn ipv6_endpoint_changes_through_netlink_list_as_a_full_nft_sync_does() {
    ferro_lab::require_root().unwrap();
    let partial_ns = NetNs::new(&NetNs::unique_name("fpx-nfnl6")).unwrap();
    let full_ns = NetNs::new(&NetNs::unique_name("fpx-nfnl6-full")).unwrap();
    let web = objects6("web", "fd00:96::10", &["fd00:10::11", "fd00:10::12"]);
    let cases = vec![
        ("remove an endpoint", vec![web.clone()], vec![objects6("web", "fd00:96::10", &["fd00:10::12"])]),
        ("add an endpoint", vec![web.clone()], vec![objects6("web", "fd00:96::10", &["fd00:10::11", "fd00:10::12", "fd00:10::13"])]),
        ("add a Service", vec![web.clone()], vec![web.clone(), objects6("new", "fd00:96::20", &["fd00:10::14"])]),
        ("remove a Service", vec![web.clone(), objects6("gone", "fd00:96::21", &["fd00:10::15"])], vec![web.clone()]),
    ];
    for (what, before, after) in cases {
        let batches = Arc::new(AtomicUsize::new(0));
        let mut partial = backend6(&partial_ns, Some(Counting(Kernel::new(Some(partial_ns.path().into())), batches.clone())));
        assert!(partial.sync(&build6(&before), &node(), false).unwrap().full, "{what}: cold start");
        assert!(!partial.sync(&build6(&after), &node(), false).unwrap().full, "{what}: partial");
        assert_eq!(batches.load(Ordering::SeqCst), 1, "{what}: one netlink batch");
        let mut full = backend6(&full_ns, None);
        assert!(full.sync(&build6(&after), &node(), false).unwrap().full);
        let got = listing_of(partial_ns.name(), "ip6");
        assert!(got.contains("ip6 saddr != fd00:10::/60 jump mark-for-masquerade"), "{got}");
        assert_eq!(got, listing_of(full_ns.name(), "ip6"), "{what}: netlink partial vs nft -f full");
        assert!(!partial.drifted(), "{what}");
    }
}
