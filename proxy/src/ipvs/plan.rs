//! The pure plan of IPVS mode: model -> the state the kernel must hold (virtual servers with
//! their real servers, the addresses on the `kube-ipvs0` dummy, the ipsets the iptables rules
//! match), and the diff from one state to the next as ordered operations.
//!
//! As upstream's IPVS proxier: one virtual server per (ClusterIP | externalIP | load-balancer
//! IP | node IP for a node port, port, protocol), scheduler `rr`, ClientIP affinity as the
//! persistent flag with the affinity timeout, real servers of weight 1 (the endpoints
//! `categorize` picks: cluster endpoints, or the local ones where a traffic policy is Local).
//! The ipsets carry what the iptables rules must tell apart (which destinations are Services,
//! which need masquerading, hairpin, source ranges, node ports with policy Local).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::model::{categorize, Family, FamilyModel, NodeInfo, Protocol, ServiceEntry};

/// The dummy interface every Service address is bound to, so the node accepts the traffic
/// IPVS intercepts in INPUT.
pub const DUMMY: &str = "kube-ipvs0";
/// Upstream's default scheduler (round robin).
pub const SCHEDULER: &str = "rr";

/// The ipsets of upstream's IPVS proxier, with the kernel type of each.
pub const SETS: &[(&str, SetKind)] = &[
    ("KUBE-CLUSTER-IP", SetKind::IpPort),
    ("KUBE-LOOP-BACK", SetKind::IpPortIp),
    ("KUBE-EXTERNAL-IP", SetKind::IpPort),
    ("KUBE-EXTERNAL-IP-LOCAL", SetKind::IpPort),
    ("KUBE-LOAD-BALANCER", SetKind::IpPort),
    ("KUBE-LOAD-BALANCER-LOCAL", SetKind::IpPort),
    ("KUBE-LOAD-BALANCER-FW", SetKind::IpPort),
    ("KUBE-LOAD-BALANCER-SOURCE-IP", SetKind::IpPortIp),
    ("KUBE-LOAD-BALANCER-SOURCE-CIDR", SetKind::IpPortNet),
    ("KUBE-NODE-PORT-TCP", SetKind::Port),
    ("KUBE-NODE-PORT-LOCAL-TCP", SetKind::Port),
    ("KUBE-NODE-PORT-UDP", SetKind::Port),
    ("KUBE-NODE-PORT-LOCAL-UDP", SetKind::Port),
    ("KUBE-NODE-PORT-SCTP-HASH", SetKind::IpPort),
    ("KUBE-NODE-PORT-LOCAL-SCTP-HASH", SetKind::IpPort),
    ("KUBE-HEALTH-CHECK-NODE-PORT", SetKind::Port),
    ("KUBE-IPVS-IPS", SetKind::Ip),
];

/// An ipset's kernel type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SetKind {
    /// hash:ip
    Ip,
    /// hash:ip,port
    IpPort,
    /// hash:ip,port,ip
    IpPortIp,
    /// hash:ip,port,net
    IpPortNet,
    /// bitmap:port (0-65535)
    Port,
}

impl SetKind {
    pub fn type_name(self) -> &'static str {
        match self {
            SetKind::Ip => "hash:ip",
            SetKind::IpPort => "hash:ip,port",
            SetKind::IpPortIp => "hash:ip,port,ip",
            SetKind::IpPortNet => "hash:ip,port,net",
            SetKind::Port => "bitmap:port",
        }
    }
}

/// The name of set `base` for `family`: upstream keeps the IPv4 names and prefixes IPv6 ones
/// with "KUBE-6-" (ipset names are global to the namespace, not per family). Two IPv6 names
/// would be 32 bytes, past the kernel's 31: "KUBE-6-LOAD-BALANCER-SOURCE-CIDR" becomes
/// "KUBE-6-LB-SOURCE-CIDR" and "KUBE-6-NODE-PORT-LOCAL-SCTP-HASH" "KUBE-6-NODE-PORT-LOCAL-SCTP"
/// (upstream's would be refused by the kernel).
pub fn set_name(base: &str, family: Family) -> String {
    match family {
        Family::V4 => base.to_string(),
        Family::V6 => {
            let name = format!("KUBE-6-{}", base.trim_start_matches("KUBE-"));
            if name.len() > 31 {
                name.replace("LOAD-BALANCER", "LB").replace("-SCTP-HASH", "-SCTP")
            } else {
                name
            }
        }
    }
}

/// One member of a set.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SetEntry {
    Ip(IpAddr),
    IpPort(IpAddr, Protocol, u16),
    IpPortIp(IpAddr, Protocol, u16, IpAddr),
    IpPortNet(IpAddr, Protocol, u16, IpNet),
    Port(u16),
}

impl fmt::Display for SetEntry {
    /// The `ipset add` syntax ("10.0.0.1,tcp:80", "10.0.0.1,tcp:80,10.0.0.2", "30080").
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SetEntry::Ip(ip) => write!(f, "{ip}"),
            SetEntry::IpPort(ip, p, port) => write!(f, "{ip},{}:{port}", p.lower()),
            SetEntry::IpPortIp(ip, p, port, ip2) => write!(f, "{ip},{}:{port},{ip2}", p.lower()),
            SetEntry::IpPortNet(ip, p, port, net) => write!(f, "{ip},{}:{port},{net}", p.lower()),
            SetEntry::Port(port) => write!(f, "{port}"),
        }
    }
}

/// A virtual server's identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VirtualKey {
    pub addr: IpAddr,
    pub port: u16,
    pub protocol: Protocol,
}

impl fmt::Display for VirtualKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.addr {
            IpAddr::V4(ip) => write!(f, "{}/{ip}:{}", self.protocol.lower(), self.port),
            IpAddr::V6(ip) => write!(f, "{}/[{ip}]:{}", self.protocol.lower(), self.port),
        }
    }
}

/// A virtual server's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VirtualServer {
    pub scheduler: String,
    /// ClientIP affinity: IPVS persistence with this timeout (seconds).
    pub persistent: Option<u32>,
}

/// A real server (an endpoint) of a virtual server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RealKey {
    pub addr: IpAddr,
    pub port: u16,
}

/// Virtual servers with their real servers and weights.
pub type VirtualServers = BTreeMap<VirtualKey, (VirtualServer, BTreeMap<RealKey, u32>)>;

/// What the kernel must hold for one family.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Desired {
    /// Addresses bound to kube-ipvs0 (each as /32 or /128).
    pub addresses: BTreeSet<IpAddr>,
    pub virtual_servers: VirtualServers,
    /// Every set of [`SETS`] (by its family's name), possibly empty.
    pub sets: BTreeMap<String, (SetKind, BTreeSet<SetEntry>)>,
}

/// What the plan needs besides the model.
#[derive(Debug, Clone, Default)]
pub struct PlanConfig {
    /// The node's addresses node ports are served on (already filtered by
    /// --nodeport-addresses; loopback never: a node port on 127.0.0.1 would need
    /// route_localnet, which opens the node's loopback services to its neighbours).
    pub node_ips: Vec<IpAddr>,
}

/// The state `model` needs on this node.
pub fn desired(model: &FamilyModel, node: &NodeInfo, cfg: &PlanConfig) -> Desired {
    let family = model.family;
    let mut d = Desired::default();
    for (base, kind) in SETS {
        d.sets.insert(set_name(base, family), (*kind, BTreeSet::new()));
    }
    for entry in model.services.values() {
        add_service(&mut d, entry, node, cfg, family);
    }
    // every address on the dummy, for the rule refusing its other ports
    for ip in d.addresses.clone() {
        set_in(&mut d, family, "KUBE-IPVS-IPS", SetEntry::Ip(ip));
    }
    d
}

fn add_service(d: &mut Desired, entry: &ServiceEntry, node: &NodeInfo, cfg: &PlanConfig, family: Family) {
    let port = &entry.port;
    let proto = port.protocol;
    let eps = categorize(entry, node);
    let vs = VirtualServer {
        scheduler: SCHEDULER.to_string(),
        persistent: port.affinity_seconds,
    };
    let reals = |list: &[&crate::model::Endpoint]| -> BTreeMap<RealKey, u32> {
        list.iter()
            .map(|e| {
                (
                    RealKey {
                        addr: e.ip,
                        port: e.port,
                    },
                    1,
                )
            })
            .collect()
    };
    let cluster_reals = reals(if port.internal_policy_local { &eps.local } else { &eps.cluster });
    let external_reals = reals(if port.external_policy_local { &eps.local } else { &eps.cluster });
    let set = |d: &mut Desired, base: &str, e: SetEntry| set_in(d, family, base, e);

    // hairpin: an endpoint reaching itself through a Service is masqueraded
    for ep in &eps.all_reachable {
        set(d, "KUBE-LOOP-BACK", SetEntry::IpPortIp(ep.ip, proto, ep.port, ep.ip));
    }
    set(d, "KUBE-CLUSTER-IP", SetEntry::IpPort(port.cluster_ip, proto, port.port));
    let add_vs = |d: &mut Desired, addr: IpAddr, p: u16, reals: &BTreeMap<RealKey, u32>, bind: bool| {
        if bind {
            d.addresses.insert(addr);
        }
        d.virtual_servers.insert(
            VirtualKey {
                addr,
                port: p,
                protocol: proto,
            },
            (vs.clone(), reals.clone()),
        );
    };
    add_vs(d, port.cluster_ip, port.port, &cluster_reals, true);

    for ip in &port.external_ips {
        set(d, "KUBE-EXTERNAL-IP", SetEntry::IpPort(*ip, proto, port.port));
        if port.external_policy_local {
            set(d, "KUBE-EXTERNAL-IP-LOCAL", SetEntry::IpPort(*ip, proto, port.port));
        }
        add_vs(d, *ip, port.port, &external_reals, true);
    }
    for ip in &port.load_balancer_ips {
        set(d, "KUBE-LOAD-BALANCER", SetEntry::IpPort(*ip, proto, port.port));
        if port.external_policy_local {
            set(d, "KUBE-LOAD-BALANCER-LOCAL", SetEntry::IpPort(*ip, proto, port.port));
        }
        if !port.load_balancer_source_ranges.is_empty() {
            set(d, "KUBE-LOAD-BALANCER-FW", SetEntry::IpPort(*ip, proto, port.port));
            for net in &port.load_balancer_source_ranges {
                set(d, "KUBE-LOAD-BALANCER-SOURCE-CIDR", SetEntry::IpPortNet(*ip, proto, port.port, *net));
            }
            // as upstream: when a source range holds the node's address, the node reaches the
            // load-balancer IP too (a request from an endpoint's node loops back with the
            // load-balancer IP as its source)
            let from_node = port
                .load_balancer_source_ranges
                .iter()
                .any(|net| cfg.node_ips.iter().any(|n| net.contains(n)));
            if from_node {
                set(d, "KUBE-LOAD-BALANCER-SOURCE-IP", SetEntry::IpPortIp(*ip, proto, port.port, *ip));
            }
        }
        add_vs(d, *ip, port.port, &external_reals, true);
    }
    if port.node_port != 0 {
        let np = port.node_port;
        match proto {
            Protocol::Tcp | Protocol::Udp => {
                let up = if proto == Protocol::Tcp { "TCP" } else { "UDP" };
                set(d, &format!("KUBE-NODE-PORT-{up}"), SetEntry::Port(np));
                if port.external_policy_local {
                    set(d, &format!("KUBE-NODE-PORT-LOCAL-{up}"), SetEntry::Port(np));
                }
            }
            Protocol::Sctp => {
                for ip in cfg.node_ips.iter().filter(|ip| family.contains(ip)) {
                    set(d, "KUBE-NODE-PORT-SCTP-HASH", SetEntry::IpPort(*ip, proto, np));
                    if port.external_policy_local {
                        set(d, "KUBE-NODE-PORT-LOCAL-SCTP-HASH", SetEntry::IpPort(*ip, proto, np));
                    }
                }
            }
        }
        for ip in cfg.node_ips.iter().filter(|ip| family.contains(ip) && !ip.is_loopback()) {
            // the node's own addresses are not bound to the dummy
            add_vs(d, *ip, np, &external_reals, false);
        }
    }
    if port.health_check_node_port != 0 {
        set(d, "KUBE-HEALTH-CHECK-NODE-PORT", SetEntry::Port(port.health_check_node_port));
    }
}

fn set_in(d: &mut Desired, family: Family, base: &str, e: SetEntry) {
    if let Some((_, entries)) = d.sets.get_mut(&set_name(base, family)) {
        entries.insert(e);
    }
}

/// One change to the kernel's IPVS / ipset / address state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Create the set if it does not exist (idempotent).
    CreateSet { name: String, kind: SetKind, family: Family },
    AddEntry { set: String, entry: SetEntry },
    DelEntry { set: String, entry: SetEntry },
    BindAddress(IpAddr),
    UnbindAddress(IpAddr),
    NewVirtual(VirtualKey, VirtualServer),
    EditVirtual(VirtualKey, VirtualServer),
    DelVirtual(VirtualKey),
    NewReal(VirtualKey, RealKey, u32),
    EditReal(VirtualKey, RealKey, u32),
    DelReal(VirtualKey, RealKey),
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::CreateSet { name, kind, .. } => write!(f, "create set {name} {}", kind.type_name()),
            Op::AddEntry { set, entry } => write!(f, "add {set} {entry}"),
            Op::DelEntry { set, entry } => write!(f, "del {set} {entry}"),
            Op::BindAddress(ip) => write!(f, "bind {ip} to {DUMMY}"),
            Op::UnbindAddress(ip) => write!(f, "unbind {ip} from {DUMMY}"),
            Op::NewVirtual(k, v) => write!(f, "new virtual server {k} {}{}", v.scheduler, persist(v)),
            Op::EditVirtual(k, v) => write!(f, "edit virtual server {k} {}{}", v.scheduler, persist(v)),
            Op::DelVirtual(k) => write!(f, "delete virtual server {k}"),
            Op::NewReal(k, r, w) => write!(f, "new real server {k} -> {} weight {w}", real(r)),
            Op::EditReal(k, r, w) => write!(f, "edit real server {k} -> {} weight {w}", real(r)),
            Op::DelReal(k, r) => write!(f, "delete real server {k} -> {}", real(r)),
        }
    }
}

fn persist(v: &VirtualServer) -> String {
    v.persistent.map(|t| format!(" persistent {t}")).unwrap_or_default()
}

fn real(r: &RealKey) -> String {
    match r.addr {
        IpAddr::V4(ip) => format!("{ip}:{}", r.port),
        IpAddr::V6(ip) => format!("[{ip}]:{}", r.port),
    }
}

/// The operations turning `from` into `to`, in the order that never drops traffic to a
/// Service that stays: sets first (created and filled before the rules match them),
/// addresses, virtual servers and their new real servers; then the removals (real servers,
/// virtual servers, addresses, set entries). Sets themselves are never destroyed here (the
/// iptables rules reference them; `--cleanup` removes them).
pub fn diff(from: &Desired, to: &Desired, family: Family) -> Vec<Op> {
    let mut ops = Vec::new();
    let empty = BTreeSet::new();
    for (name, (kind, entries)) in &to.sets {
        if !from.sets.contains_key(name) {
            ops.push(Op::CreateSet {
                name: name.clone(),
                kind: *kind,
                family,
            });
        }
        let old = from.sets.get(name).map(|(_, e)| e).unwrap_or(&empty);
        for e in entries.difference(old) {
            ops.push(Op::AddEntry {
                set: name.clone(),
                entry: e.clone(),
            });
        }
    }
    for ip in to.addresses.difference(&from.addresses) {
        ops.push(Op::BindAddress(*ip));
    }
    let no_reals = BTreeMap::new();
    for (key, (vs, reals)) in &to.virtual_servers {
        let old_reals = match from.virtual_servers.get(key) {
            None => {
                ops.push(Op::NewVirtual(*key, vs.clone()));
                &no_reals
            }
            Some((old, old_reals)) => {
                if old != vs {
                    ops.push(Op::EditVirtual(*key, vs.clone()));
                }
                old_reals
            }
        };
        for (r, w) in reals {
            match old_reals.get(r) {
                None => ops.push(Op::NewReal(*key, *r, *w)),
                Some(old) if old != w => ops.push(Op::EditReal(*key, *r, *w)),
                Some(_) => {}
            }
        }
    }
    for (key, (_, old_reals)) in &from.virtual_servers {
        match to.virtual_servers.get(key) {
            None => ops.push(Op::DelVirtual(*key)),
            Some((_, reals)) => {
                for r in old_reals.keys().filter(|r| !reals.contains_key(r)) {
                    ops.push(Op::DelReal(*key, *r));
                }
            }
        }
    }
    for ip in from.addresses.difference(&to.addresses) {
        ops.push(Op::UnbindAddress(*ip));
    }
    for (name, (_, old)) in &from.sets {
        let new = to.sets.get(name).map(|(_, e)| e).unwrap_or(&empty);
        for e in old.difference(new) {
            ops.push(Op::DelEntry {
                set: name.clone(),
                entry: e.clone(),
            });
        }
    }
    ops
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Arc;

    use crate::slim::Service;
    use crate::slim::EndpointSlice;
    use serde_json::{json, Value};

    use super::*;
    use crate::model;

    fn node() -> NodeInfo {
        NodeInfo {
            name: "node-a".into(),
            zone: None,
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn svc(name: &str, spec: Value) -> Arc<Service> {
        Arc::new(serde_json::from_value(json!({"metadata": {"namespace": "ns", "name": name}, "spec": spec})).unwrap())
    }

    /// A slice of `name` with endpoints (address, on this node, ready).
    fn slice(name: &str, protocol: &str, eps: &[(&str, bool, bool)]) -> Arc<EndpointSlice> {
        let eps: Vec<Value> = eps
            .iter()
            .map(|(a, local, ready)| {
                json!({"addresses": [a], "nodeName": if *local {"node-a"} else {"node-b"},
                       "conditions": {"ready": ready, "serving": ready, "terminating": false}})
            })
            .collect();
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"namespace": "ns", "name": format!("{name}-1"), "labels": {"kubernetes.io/service-name": name}},
                "addressType": "IPv4",
                "ports": [{"name": "p", "port": 8080, "protocol": protocol}],
                "endpoints": eps,
            }))
            .unwrap(),
        )
    }

    fn plan(services: &[Arc<Service>], slices: &[Arc<EndpointSlice>]) -> Desired {
        let (m, problems) = model::build(Family::V4, services, slices, &node());
        assert!(problems.is_empty(), "{problems:?}");
        desired(
            &m,
            &node(),
            &PlanConfig {
                node_ips: vec![ip("192.168.0.2"), ip("127.0.0.1")],
            },
        )
    }

    fn vk(addr: &str, port: u16) -> VirtualKey {
        VirtualKey {
            addr: ip(addr),
            port,
            protocol: Protocol::Tcp,
        }
    }

    fn rk(addr: &str) -> RealKey {
        RealKey {
            addr: ip(addr),
            port: 8080,
        }
    }

    fn entries(d: &Desired, set: &str) -> Vec<String> {
        d.sets[set].1.iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn cluster_ip_node_port_and_external_ip_become_virtual_servers() {
        let s = svc(
            "web",
            json!({"type": "NodePort", "clusterIP": "172.30.0.10", "externalIPs": ["203.0.113.9"], "sessionAffinity": "ClientIP",
                   "ports": [{"name": "p", "port": 80, "targetPort": 8080, "protocol": "TCP", "nodePort": 30080}]}),
        );
        let d = plan(&[s], &[slice("web", "TCP", &[("10.180.0.1", true, true), ("10.180.0.2", false, true), ("10.180.0.3", false, false)])]);
        let keys: Vec<String> = d.virtual_servers.keys().map(|k| k.to_string()).collect();
        assert_eq!(keys, ["tcp/172.30.0.10:80", "tcp/192.168.0.2:30080", "tcp/203.0.113.9:80"]);
        let (vs, reals) = &d.virtual_servers[&vk("172.30.0.10", 80)];
        assert_eq!(vs.persistent, Some(10800), "ClientIP affinity is persistence with upstream's default timeout");
        assert_eq!(vs.scheduler, "rr");
        assert_eq!(reals.keys().copied().collect::<Vec<_>>(), [rk("10.180.0.1"), rk("10.180.0.2")], "the not-ready endpoint is left out");
        // the node's address carries the node port but is not bound to the dummy; loopback never
        assert_eq!(d.addresses, [ip("172.30.0.10"), ip("203.0.113.9")].into_iter().collect());
        assert_eq!(entries(&d, "KUBE-CLUSTER-IP"), ["172.30.0.10,tcp:80"]);
        assert_eq!(entries(&d, "KUBE-EXTERNAL-IP"), ["203.0.113.9,tcp:80"]);
        assert_eq!(entries(&d, "KUBE-NODE-PORT-TCP"), ["30080"]);
        assert!(entries(&d, "KUBE-NODE-PORT-LOCAL-TCP").is_empty());
        assert_eq!(entries(&d, "KUBE-LOOP-BACK"), ["10.180.0.1,tcp:8080,10.180.0.1", "10.180.0.2,tcp:8080,10.180.0.2"]);
        assert_eq!(d.sets.len(), SETS.len(), "every set exists, empty or not");
        assert_eq!(entries(&d, "KUBE-IPVS-IPS"), ["172.30.0.10", "203.0.113.9"]);
    }

    #[test]
    fn traffic_policy_local_uses_local_endpoints_and_the_local_sets() {
        let s = svc(
            "web",
            json!({"type": "LoadBalancer", "clusterIP": "172.30.0.10", "externalTrafficPolicy": "Local", "healthCheckNodePort": 32000,
                   "loadBalancerSourceRanges": ["198.51.100.0/24"],
                   "ports": [{"name": "p", "port": 80, "targetPort": 8080, "protocol": "UDP", "nodePort": 30080}]}),
        );
        let mut s = (*s).clone();
        s.status = Some(serde_json::from_value(json!({"loadBalancer": {"ingress": [{"ip": "203.0.113.50"}]}})).unwrap());
        let d = plan(&[Arc::new(s)], &[slice("web", "UDP", &[("10.180.0.1", true, true), ("10.180.0.2", false, true)])]);
        let udp = |a: &str, p| VirtualKey {
            addr: ip(a),
            port: p,
            protocol: Protocol::Udp,
        };
        // cluster traffic goes everywhere; external traffic only to the local endpoint
        assert_eq!(d.virtual_servers[&udp("172.30.0.10", 80)].1.len(), 2);
        assert_eq!(d.virtual_servers[&udp("203.0.113.50", 80)].1.keys().copied().collect::<Vec<_>>(), [rk("10.180.0.1")]);
        assert_eq!(d.virtual_servers[&udp("192.168.0.2", 30080)].1.keys().copied().collect::<Vec<_>>(), [rk("10.180.0.1")]);
        assert_eq!(entries(&d, "KUBE-NODE-PORT-UDP"), ["30080"]);
        assert_eq!(entries(&d, "KUBE-NODE-PORT-LOCAL-UDP"), ["30080"]);
        assert_eq!(entries(&d, "KUBE-LOAD-BALANCER-LOCAL"), ["203.0.113.50,udp:80"]);
        assert_eq!(entries(&d, "KUBE-LOAD-BALANCER-FW"), ["203.0.113.50,udp:80"]);
        assert_eq!(entries(&d, "KUBE-LOAD-BALANCER-SOURCE-CIDR"), ["203.0.113.50,udp:80,198.51.100.0/24"]);
        assert_eq!(entries(&d, "KUBE-HEALTH-CHECK-NODE-PORT"), ["32000"]);
        assert!(entries(&d, "KUBE-LOAD-BALANCER-SOURCE-IP").is_empty(), "the node is outside the source ranges");
    }

    #[test]
    fn a_service_without_endpoints_keeps_its_virtual_server_without_real_servers() {
        // IPVS answers a virtual server without destinations with ICMP port unreachable: the
        // client is refused at once, as the REJECT rules of the other modes do
        let s = svc("none", json!({"clusterIP": "172.30.0.11", "ports": [{"name": "p", "port": 80, "targetPort": 8080}]}));
        let d = plan(&[s], &[]);
        assert!(d.virtual_servers[&vk("172.30.0.11", 80)].1.is_empty());
        assert_eq!(entries(&d, "KUBE-CLUSTER-IP"), ["172.30.0.11,tcp:80"]);
    }

    #[test]
    fn ipv6_sets_have_their_own_names() {
        assert_eq!(set_name("KUBE-CLUSTER-IP", Family::V6), "KUBE-6-CLUSTER-IP");
        assert_eq!(set_name("KUBE-CLUSTER-IP", Family::V4), "KUBE-CLUSTER-IP");
        assert_eq!(set_name("KUBE-LOAD-BALANCER-SOURCE-CIDR", Family::V6), "KUBE-6-LB-SOURCE-CIDR");
        let mut names = BTreeSet::new();
        for (n, _) in SETS {
            for f in [Family::V4, Family::V6] {
                let name = set_name(n, f);
                assert!(name.len() <= 31, "ipset names are at most 31 bytes: {name}");
                assert!(names.insert(name.clone()), "{name} twice");
                assert!(names.insert(super::super::ipset::scratch_name(&name)), "scratch of {name} clashes");
            }
        }
    }

    #[test]
    fn diff_adds_before_it_removes_and_touches_only_what_changed() {
        let s = |eps: &[(&str, bool, bool)], affinity: bool| {
            let mut spec = json!({"clusterIP": "172.30.0.10", "ports": [{"name": "p", "port": 80, "targetPort": 8080}]});
            if affinity {
                spec["sessionAffinity"] = json!("ClientIP");
            }
            plan(&[svc("web", spec)], &[slice("web", "TCP", eps)])
        };
        let a = s(&[("10.180.0.1", true, true), ("10.180.0.2", false, true)], false);
        let b = s(&[("10.180.0.2", false, true), ("10.180.0.3", false, true)], true);
        let ops: Vec<String> = diff(&a, &b, Family::V4).iter().map(|o| o.to_string()).collect();
        assert_eq!(
            ops,
            [
                "add KUBE-LOOP-BACK 10.180.0.3,tcp:8080,10.180.0.3",
                "edit virtual server tcp/172.30.0.10:80 rr persistent 10800",
                "new real server tcp/172.30.0.10:80 -> 10.180.0.3:8080 weight 1",
                "delete real server tcp/172.30.0.10:80 -> 10.180.0.1:8080",
                "del KUBE-LOOP-BACK 10.180.0.1,tcp:8080,10.180.0.1",
            ]
        );
        assert!(diff(&b, &b, Family::V4).is_empty(), "nothing to do for an unchanged state");

        // from nothing: every set created first, then filled, then the address and the servers
        let ops = diff(&Desired::default(), &a, Family::V4);
        let mut created = BTreeSet::new();
        for o in &ops {
            match o {
                Op::CreateSet { name, .. } => {
                    created.insert(name.clone());
                }
                Op::AddEntry { set, .. } => assert!(created.contains(set), "{set} filled before it is created"),
                _ => {}
            }
        }
        assert_eq!(created.len(), SETS.len());
        let last_set_op = ops.iter().rposition(|o| matches!(o, Op::CreateSet { .. } | Op::AddEntry { .. })).unwrap();
        let first_other = ops.iter().position(|o| !matches!(o, Op::CreateSet { .. } | Op::AddEntry { .. })).unwrap();
        assert!(last_set_op < first_other, "the sets are complete before any address or server");
        let bind = ops.iter().position(|o| matches!(o, Op::BindAddress(_))).unwrap();
        let vs = ops.iter().position(|o| matches!(o, Op::NewVirtual(..))).unwrap();
        assert!(bind < vs);
        // and back to nothing: servers, address, entries removed; the sets stay
        let ops: Vec<String> = diff(&a, &Desired::default(), Family::V4).iter().map(|o| o.to_string()).collect();
        assert_eq!(ops[0], "delete virtual server tcp/172.30.0.10:80");
        assert_eq!(ops[1], "unbind 172.30.0.10 from kube-ipvs0");
        assert!(ops[2..].iter().all(|o| o.starts_with("del KUBE-")), "{ops:?}");
    }
}
