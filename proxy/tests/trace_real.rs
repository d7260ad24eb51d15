//! Privileged: the packet tracers' predictions against the kernel. The real backends load their
//! rules into a node namespace; the tracers load exactly the text the backends gave
//! iptables-restore / nft; then real requests (curl between namespaces) must reach the set of
//! endpoints the tracer predicted, masqueraded when it said so (the pod sees the bridge's
//! address instead of the client's), refused at once when it predicted REJECT and unanswered
//! when it predicted DROP. In iptables mode the kernel's own dump (iptables-save) is traced
//! too and must give the same answers.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use common::{InNs, World, CLIENT_IP, CLUSTER_CIDR, GATEWAY, NODE_IP};
use ferro_proxy::controller::Backend;
use ferro_proxy::error::ExecError;
use ferro_proxy::exec::Runner;
use ferro_proxy::iptables::backend::IptablesBackend;
use ferro_proxy::model::{self, Family, FamilyModel, NodeInfo};
use ferro_proxy::nftables::backend::NftBackend;
use ferro_proxy::trace::{Packet, Trace, Verdict};
use ferro_proxy::slim::Service;
use ferro_proxy::slim::EndpointSlice;
use serde_json::{json, Value};

/// Runs the tools in the node namespace and keeps every input that was loaded.
#[derive(Clone)]
struct Tee {
    inner: InNs,
    loaded: Arc<Mutex<Vec<(String, String)>>>,
}

impl Runner for Tee {
    fn run(&mut self, program: &str, args: &[&str], stdin: Option<&str>) -> Result<String, ExecError> {
        let out = self.inner.run(program, args, stdin)?;
        if let Some(text) = stdin {
            self.loaded
                .lock()
                .unwrap()
                .push((program.to_string(), text.to_string()));
        }
        Ok(out)
    }
}

/// The tracer of one mode, fed with what the backend loaded.
enum Tracer {
    Iptables(ferro_proxy::iptables::trace::Ruleset),
    Nft(ferro_proxy::nftables::trace::Ruleset),
}

impl Tracer {
    fn new(mode: &str) -> Tracer {
        match mode {
            "iptables" => Tracer::Iptables(Default::default()),
            _ => Tracer::Nft(Default::default()),
        }
    }

    /// Applies the inputs loaded since the last call.
    fn catch_up(&mut self, loaded: &Mutex<Vec<(String, String)>>) {
        let texts: Vec<(String, String)> = loaded.lock().unwrap().drain(..).collect();
        assert!(!texts.is_empty(), "the backend loaded nothing");
        for (program, text) in texts {
            match (&mut *self, program.as_str()) {
                (Tracer::Iptables(r), "iptables-restore") => r.apply(&text).unwrap_or_else(|e| panic!("{e}\n{text}")),
                (Tracer::Nft(r), "nft") => r.apply(&text).unwrap_or_else(|e| panic!("{e}\n{text}")),
                (_, p) => panic!("unexpected input to {p}"),
            }
        }
    }

    fn trace(&self, p: &Packet, local: &[IpAddr]) -> Trace {
        match self {
            Tracer::Iptables(r) => r.trace(p, local).unwrap(),
            Tracer::Nft(r) => r.trace(p, local).unwrap(),
        }
    }
}

fn node() -> NodeInfo {
    NodeInfo {
        name: "node-a".into(),
        zone: None,
    }
}

/// A Service `name` (port 80 -> 8080) with `spec` and `status`, and its slice of `eps` (pod
/// index, whether the endpoint is on this node).
fn objects(
    w: &World,
    name: &str,
    ip: &str,
    spec: Value,
    status: Value,
    eps: &[(usize, bool)],
) -> (Service, EndpointSlice) {
    let mut s =
        json!({"clusterIP": ip, "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]});
    for (k, v) in spec.as_object().unwrap() {
        s[k] = v.clone();
    }
    let svc = serde_json::from_value(
        json!({"metadata": {"namespace": "default", "name": name}, "spec": s, "status": status}),
    )
    .unwrap();
    let eps: Vec<Value> = eps
        .iter()
        .map(|(i, here)| json!({"addresses": [w.pods[*i].ip], "nodeName": if *here { "node-a" } else { "node-b" }}))
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

fn node_port(n: u16, extra: Value) -> Value {
    let mut s = json!({"type": "NodePort", "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP", "nodePort": n}]});
    for (k, v) in extra.as_object().unwrap() {
        s[k] = v.clone();
    }
    s
}

fn services(w: &World, web_eps: &[(usize, bool)]) -> Vec<(Service, EndpointSlice)> {
    let lb = |ip: &str| json!({"loadBalancer": {"ingress": [{"ip": ip}]}});
    let none = json!({});
    vec![
        objects(
            w,
            "web",
            "10.96.0.20",
            node_port(30080, json!({})),
            none.clone(),
            web_eps,
        ),
        objects(
            w,
            "local",
            "10.96.0.21",
            node_port(30081, json!({"externalTrafficPolicy": "Local"})),
            none.clone(),
            &[(1, true), (2, false)],
        ),
        objects(
            w,
            "none-here",
            "10.96.0.22",
            node_port(30082, json!({"externalTrafficPolicy": "Local"})),
            none.clone(),
            &[(2, false)],
        ),
        objects(
            w,
            "internal",
            "10.96.0.23",
            json!({"internalTrafficPolicy": "Local"}),
            none.clone(),
            &[(1, true), (2, false)],
        ),
        objects(w, "empty", "10.96.0.24", json!({}), none.clone(), &[]),
        objects(w, "solo", "10.96.0.25", json!({}), none.clone(), &[(1, true)]),
        objects(
            w,
            "lb-open",
            "10.96.0.26",
            node_port(
                30083,
                json!({"type": "LoadBalancer", "loadBalancerSourceRanges": [format!("{CLIENT_IP}/32")]}),
            ),
            lb("10.96.1.26"),
            &[(1, true), (2, true)],
        ),
        objects(
            w,
            "lb-closed",
            "10.96.0.27",
            node_port(
                30084,
                json!({"type": "LoadBalancer", "loadBalancerSourceRanges": ["192.168.99.0/24"]}),
            ),
            lb("10.96.1.27"),
            &[(1, true), (2, true)],
        ),
        objects(
            w,
            "ext",
            "10.96.0.28",
            json!({"externalIPs": ["10.96.1.28"]}),
            none,
            &[(1, true), (2, true)],
        ),
    ]
}

#[derive(Debug, Clone, Copy)]
enum Src {
    Pod(usize),
    Node,
    Client,
}

/// A request the tracer predicts and the kernel answers.
struct Probe {
    what: &'static str,
    from: Src,
    dst: &'static str,
    port: u16,
}

fn probe(what: &'static str, from: Src, dst: &'static str, port: u16) -> Probe {
    Probe { what, from, dst, port }
}

/// Requests per probe that reaches endpoints: with two equally likely endpoints, missing one in
/// 24 tries happens once in 8 million.
const TRIES: usize = 24;

/// The packet a probe sends.
fn packet(w: &World, p: &Probe) -> Packet {
    let src = match p.from {
        Src::Pod(i) => w.pods[i].ip.clone(),
        // the node reaches ClusterIPs over its default route (the uplink), its own address directly
        Src::Node => NODE_IP.to_string(),
        Src::Client => CLIENT_IP.to_string(),
    };
    Packet::tcp(src.parse().unwrap(), p.dst.parse().unwrap(), p.port)
}

/// Predicts `p` with the tracer, asks the kernel, and compares; returns the prediction.
fn check(w: &World, tracer: &Tracer, p: &Probe) -> Trace {
    let packet = packet(w, p);
    let src = packet.src.to_string();
    let want = tracer.trace(&packet, &w.node_local_ips());
    let get = |path: &str| {
        let url = format!("http://{}:{}{path}", p.dst, p.port);
        match p.from {
            Src::Pod(i) => w.get_in_pod(i, &url),
            Src::Node => w.get_in_node(&url),
            Src::Client => w.get_in_client(&url),
        }
    };
    if want.only(Verdict::Reject) {
        let e = get("/").unwrap_err();
        assert_eq!(
            e.code, 7,
            "{}: REJECT predicted, so refused at once (curl 7): {e:?}",
            p.what
        );
        return want;
    }
    if want.only(Verdict::Drop) {
        let e = get("/").unwrap_err();
        assert_eq!(e.code, 28, "{}: DROP predicted, so no answer (curl 28): {e:?}", p.what);
        return want;
    }
    assert!(
        want.outcomes.iter().all(|o| matches!(o.verdict, Verdict::Dnat(_))),
        "{}: this test only sends to Services, predicted {want}",
        p.what
    );
    let answered: BTreeSet<String> = (0..TRIES)
        .map(|_| {
            let name = get("/").unwrap_or_else(|e| panic!("{}: {e:?}", p.what));
            let pod = w.pods.iter().find(|pod| pod.name == name).unwrap();
            format!("{}:8080", pod.ip)
        })
        .collect();
    assert_eq!(
        answered,
        want.endpoints(),
        "{}: endpoints that answered vs predicted {want}",
        p.what
    );
    // a masqueraded request comes from the bridge's address (the node's side of the pods)
    let seen: BTreeSet<String> = (0..TRIES)
        .map(|_| World::remote_ip(&get("/cgi-bin/ip").unwrap_or_else(|e| panic!("{}: {e:?}", p.what))))
        .collect();
    let predicted: BTreeSet<String> = want
        .outcomes
        .iter()
        .map(|o| if o.masquerade { GATEWAY.to_string() } else { src.clone() })
        .collect();
    assert_eq!(
        seen, predicted,
        "{}: client addresses the pods saw vs predicted {want}",
        p.what
    );
    want
}

fn backend(w: &World, mode: &str, runner: Tee) -> Box<dyn Backend> {
    let cidrs = vec![CLUSTER_CIDR.parse().unwrap()];
    let counter = Box::new(ferro_proxy::nfcount::Netlink::in_namespace(w.node.path()));
    match mode {
        "iptables" => Box::new(IptablesBackend::new(runner, counter, cidrs, false, vec![])),
        "nftables" => Box::new(NftBackend::new(runner, counter, cidrs, false, vec![])),
        m => panic!("no mode {m}"),
    }
}

fn tracer_agrees_with_the_kernel(mode: &str) {
    let w = World::new(&format!("tr{}", &mode[..3]), 3).unwrap();
    let loaded = Arc::new(Mutex::new(Vec::new()));
    let mut b = backend(
        &w,
        mode,
        Tee {
            inner: w.runner(),
            loaded: loaded.clone(),
        },
    );
    let mut tracer = Tracer::new(mode);
    b.sync(&build(&services(&w, &[(1, true), (2, true)])), &node(), false)
        .unwrap();
    tracer.catch_up(&loaded);

    let probes = [
        probe("ClusterIP from a pod", Src::Pod(0), "10.96.0.20", 80),
        probe("ClusterIP from the node", Src::Node, "10.96.0.20", 80),
        probe("NodePort from outside", Src::Client, NODE_IP, 30080),
        probe(
            "NodePort with externalTrafficPolicy Local from outside",
            Src::Client,
            NODE_IP,
            30081,
        ),
        probe(
            "NodePort with externalTrafficPolicy Local and no local endpoint",
            Src::Client,
            NODE_IP,
            30082,
        ),
        probe(
            "ClusterIP with internalTrafficPolicy Local from a pod",
            Src::Pod(0),
            "10.96.0.23",
            80,
        ),
        probe("ClusterIP without endpoints", Src::Pod(0), "10.96.0.24", 80),
        probe("hairpin: the only endpoint to itself", Src::Pod(1), "10.96.0.25", 80),
        probe("LoadBalancer IP from an allowed source", Src::Client, "10.96.1.26", 80),
        probe(
            "LoadBalancer IP from a source outside the ranges",
            Src::Client,
            "10.96.1.27",
            80,
        ),
        probe("external IP from outside", Src::Client, "10.96.1.28", 80),
    ];
    // iptables mode: the rules as the kernel holds them, read back with iptables-save (its
    // spelling: --set-xmark, /32, ...), must mean what the rendered text means
    let saved = (mode == "iptables").then(|| {
        let mut r = w.runner();
        let text = format!(
            "{}{}",
            r.run("iptables-save", &["-t", "nat"], None).unwrap(),
            r.run("iptables-save", &["-t", "filter"], None).unwrap()
        );
        ferro_proxy::iptables::trace::Ruleset::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"))
    });
    let mut kinds = BTreeSet::new();
    for p in &probes {
        let t = check(&w, &tracer, p);
        if let Some(k) = &saved {
            assert_eq!(
                k.trace(&packet(&w, p), &w.node_local_ips()).unwrap(),
                t,
                "{}: iptables-save",
                p.what
            );
        }
        kinds.extend(t.outcomes.iter().map(|o| match o.verdict {
            Verdict::Dnat(_) if o.masquerade => "endpoint, masqueraded",
            Verdict::Dnat(_) => "endpoint, source kept",
            Verdict::Accept => "accepted",
            Verdict::Drop => "dropped",
            Verdict::Reject => "rejected",
        }));
    }
    // the probes cover reaching endpoints with and without masquerading, REJECT and DROP
    assert_eq!(kinds.len(), 4, "{kinds:?}");

    // a partial sync (one endpoint no longer ready): the tracer follows it, the kernel agrees
    b.sync(&build(&services(&w, &[(1, true)])), &node(), false).unwrap();
    tracer.catch_up(&loaded);
    let t = check(
        &w,
        &tracer,
        &probe(
            "ClusterIP from a pod after a partial sync",
            Src::Pod(0),
            "10.96.0.20",
            80,
        ),
    );
    assert_eq!(t.endpoints(), BTreeSet::from([format!("{}:8080", w.pods[1].ip)]));
}

#[test]
#[ignore = "privileged: needs root and network namespaces; run by scripts/test.sh"]
fn iptables_tracer_agrees_with_the_kernel() {
    tracer_agrees_with_the_kernel("iptables");
}

#[test]
#[ignore = "privileged: needs root and network namespaces; run by scripts/test.sh"]
fn nftables_tracer_agrees_with_the_kernel() {
    tracer_agrees_with_the_kernel("nftables");
}
