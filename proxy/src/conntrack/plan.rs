//! The pure planner: which conntrack entries a change of the models makes stale.
//!
//! Upstream's facts (pkg/proxy/conntrack and its issues): only UDP needs this (TCP and SCTP
//! flows to a gone endpoint fail and the client reconnects; a UDP client reusing its source
//! port never does). A flow is selected by its original destination (a service IP and port,
//! or `*:nodePort`) and its reply source (the endpoint it was DNATed to). The endpoints whose
//! flows are kept are the *serving* ones, whatever the traffic policies or topology say
//! (changing a Service must not break its existing flows). Per UDP service port:
//!
//! - an endpoint that stops serving (or leaves, or whose service port or frontend goes, also
//!   down to zero endpoints: upstream #139628, and a deleted Service: #141371): its flows to
//!   each frontend are deleted;
//! - a frontend that starts having usable endpoints (0 -> >0, a new Service, a new external
//!   or LB IP, a new node port, and every frontend at the first sync after a start): its flows
//!   that do not go to a serving endpoint are deleted, so a client stuck on an entry made
//!   while there was nothing to DNAT to (upstream #48370) re-resolves through the new rules.
//!   Flows that already reach a serving endpoint are left alone (upstream #122740: a restart
//!   does not move working flows).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use super::{Flows, Reply};
use crate::model::{categorize, FamilyModel, NodeInfo, Protocol, ServiceEntry, ServicePortName};

/// The protocols whose stale flows are deleted.
fn cleaned(p: Protocol) -> bool {
    p == Protocol::Udp
}

/// (address, port) a service port answers on; address None: its node port on any node address.
fn frontends(e: &ServiceEntry) -> BTreeSet<(Option<IpAddr>, u16)> {
    let p = &e.port;
    let mut out = BTreeSet::new();
    for ip in std::iter::once(&p.cluster_ip)
        .chain(&p.external_ips)
        .chain(&p.load_balancer_ips)
    {
        out.insert((Some(*ip), p.port));
    }
    if p.node_port != 0 {
        out.insert((None, p.node_port));
    }
    out
}

/// Endpoint addresses whose flows are kept: the serving ones (upstream's IsServing).
fn serving(e: &ServiceEntry) -> BTreeSet<IpAddr> {
    e.endpoints.iter().filter(|e| e.serving).map(|e| e.ip).collect()
}

/// Whether the rules DNAT this service port's traffic anywhere (else it is rejected or dropped).
fn usable(e: &ServiceEntry, node: &NodeInfo) -> bool {
    !categorize(e, node).all_reachable.is_empty()
}

/// The deletions that going from `old` to `new` (one family) calls for, sorted, without
/// duplicates. `old` is an empty model at the first sync after a start.
pub fn plan(old: &FamilyModel, new: &FamilyModel, node: &NodeInfo) -> Vec<Flows> {
    let family = new.family;
    let empty = BTreeMap::new();
    let old_services: &BTreeMap<ServicePortName, std::sync::Arc<ServiceEntry>> =
        if old.family == family { &old.services } else { &empty };
    let names: BTreeSet<&ServicePortName> = old_services.keys().chain(new.services.keys()).collect();
    plan_changes(family, names.into_iter().map(|n| (n, old_services.get(n).map(|e| &**e), new.services.get(n).map(|e| &**e))), node)
}

/// [`plan`] over the service ports that changed only, each as (name, entry before, entry
/// after): a service port whose entry is the same before and after calls for no deletion, so
/// the deletions of the service ports that changed are the plan of the whole models.
pub fn plan_changes<'a>(
    family: crate::model::Family,
    changes: impl IntoIterator<Item = (&'a ServicePortName, Option<&'a ServiceEntry>, Option<&'a ServiceEntry>)>,
    node: &NodeInfo,
) -> Vec<Flows> {
    let mut out = BTreeSet::new();
    for (name, o, n) in changes {
        if !cleaned(name.protocol) || o == n {
            continue;
        }
        if let Some(o) = o {
            let (new_front, new_serving) = n.map(|n| (frontends(n), serving(n))).unwrap_or_default();
            for (dst, dst_port) in frontends(o) {
                for ep in serving(o) {
                    if !(new_front.contains(&(dst, dst_port)) && new_serving.contains(&ep)) {
                        out.insert(Flows { family, protocol: name.protocol, dst, dst_port, reply: Reply::From(ep) });
                    }
                }
            }
        }
        let Some(n) = n else { continue };
        if !usable(n, node) {
            continue;
        }
        let was_usable = o.is_some_and(|o| usable(o, node));
        let old_front = o.map(frontends).unwrap_or_default();
        let keep = serving(n);
        for (dst, dst_port) in frontends(n) {
            if !was_usable || !old_front.contains(&(dst, dst_port)) {
                out.insert(Flows { family, protocol: name.protocol, dst, dst_port, reply: Reply::NotFrom(keep.clone()) });
            }
        }
    }
    out.into_iter().collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::model::{Endpoint, Family, ServicePort};

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn node() -> NodeInfo {
        NodeInfo {
            name: "node-a".into(),
            zone: None,
        }
    }

    fn ep(addr: &str, ready: bool, serving: bool, terminating: bool) -> Endpoint {
        Endpoint {
            ip: ip(addr),
            port: 5353,
            ready,
            serving,
            terminating,
            local: true,
            zone: None,
            zone_hints: BTreeSet::new(),
        }
    }

    fn up(addr: &str) -> Endpoint {
        ep(addr, true, true, false)
    }

    fn entry(name: &str, protocol: Protocol, eps: Vec<Endpoint>, f: impl FnOnce(&mut ServicePort)) -> ServiceEntry {
        let mut port = ServicePort {
            name: ServicePortName {
                namespace: "ns".into(),
                name: name.into(),
                port: "dns".into(),
                protocol,
            },
            cluster_ip: ip("10.96.0.10"),
            port: 53,
            protocol,
            node_port: 0,
            external_ips: vec![],
            load_balancer_ips: vec![],
            load_balancer_source_ranges: vec![],
            affinity_seconds: None,
            external_policy_local: false,
            internal_policy_local: false,
            health_check_node_port: 0,
            topology_aware: false,
        };
        f(&mut port);
        ServiceEntry { port, endpoints: eps }
    }

    fn model(entries: Vec<ServiceEntry>) -> FamilyModel {
        FamilyModel {
            family: Family::V4,
            services: entries.into_iter().map(|e| (e.port.name.clone(), std::sync::Arc::new(e))).collect(),
        }
    }

    fn udp(eps: Vec<Endpoint>) -> ServiceEntry {
        entry("dns", Protocol::Udp, eps, |_| {})
    }

    fn gone(dst: Option<&str>, port: u16, endpoint: &str) -> Flows {
        Flows {
            family: Family::V4,
            protocol: Protocol::Udp,
            dst: dst.map(ip),
            dst_port: port,
            reply: Reply::From(ip(endpoint)),
        }
    }

    fn stuck(dst: Option<&str>, port: u16, keep: &[&str]) -> Flows {
        Flows {
            family: Family::V4,
            protocol: Protocol::Udp,
            dst: dst.map(ip),
            dst_port: port,
            reply: Reply::NotFrom(keep.iter().map(|s| ip(s)).collect()),
        }
    }

    #[test]
    fn nothing_changed_deletes_nothing() {
        let m = model(vec![udp(vec![up("10.244.0.5"), up("10.244.0.6")])]);
        assert!(plan(&m, &m, &node()).is_empty());
    }

    #[test]
    fn a_replaced_endpoint_loses_its_flows_on_every_frontend() {
        let set = |p: &mut ServicePort| {
            p.node_port = 30053;
            p.external_ips = vec![ip("192.0.2.1")];
            p.load_balancer_ips = vec![ip("198.51.100.1")];
        };
        let old = model(vec![entry(
            "dns",
            Protocol::Udp,
            vec![up("10.244.0.5"), up("10.244.0.6")],
            set,
        )]);
        let new = model(vec![entry(
            "dns",
            Protocol::Udp,
            vec![up("10.244.0.6"), up("10.244.0.7")],
            set,
        )]);
        assert_eq!(
            plan(&old, &new, &node()),
            [
                gone(None, 30053, "10.244.0.5"),
                gone(Some("10.96.0.10"), 53, "10.244.0.5"),
                gone(Some("192.0.2.1"), 53, "10.244.0.5"),
                gone(Some("198.51.100.1"), 53, "10.244.0.5"),
            ]
        );
    }

    #[test]
    fn down_to_zero_endpoints_still_deletes_the_old_flows() {
        // upstream #139628: one-way senders stayed DNATed to the deleted pod
        let old = model(vec![udp(vec![up("10.244.0.5")])]);
        let new = model(vec![udp(vec![])]);
        assert_eq!(plan(&old, &new, &node()), [gone(Some("10.96.0.10"), 53, "10.244.0.5")]);
    }

    #[test]
    fn a_deleted_service_loses_its_flows() {
        // upstream #141371
        let old = model(vec![udp(vec![up("10.244.0.5")])]);
        assert_eq!(
            plan(&old, &model(vec![]), &node()),
            [gone(Some("10.96.0.10"), 53, "10.244.0.5")]
        );
    }

    #[test]
    fn zero_to_some_endpoints_deletes_flows_not_going_to_them() {
        let set = |p: &mut ServicePort| p.node_port = 30053;
        let old = model(vec![entry("dns", Protocol::Udp, vec![], set)]);
        let new = model(vec![entry("dns", Protocol::Udp, vec![up("10.244.0.5")], set)]);
        assert_eq!(
            plan(&old, &new, &node()),
            [
                stuck(None, 30053, &["10.244.0.5"]),
                stuck(Some("10.96.0.10"), 53, &["10.244.0.5"])
            ]
        );
        // an endpoint that exists but does not serve is not a reason: nothing DNATs yet
        let unready = model(vec![entry(
            "dns",
            Protocol::Udp,
            vec![ep("10.244.0.5", false, false, false)],
            set,
        )]);
        assert!(plan(&old, &unready, &node()).is_empty());
        // ... until it is ready
        assert_eq!(plan(&unready, &new, &node()).len(), 2);
    }

    #[test]
    fn a_new_service_and_a_new_frontend_are_cleaned_the_first_time() {
        let new = model(vec![udp(vec![up("10.244.0.5")])]);
        assert_eq!(
            plan(&model(vec![]), &new, &node()),
            [stuck(Some("10.96.0.10"), 53, &["10.244.0.5"])]
        );
        let with_ext = model(vec![entry("dns", Protocol::Udp, vec![up("10.244.0.5")], |p| {
            p.external_ips = vec![ip("192.0.2.1")]
        })]);
        assert_eq!(
            plan(&new, &with_ext, &node()),
            [stuck(Some("192.0.2.1"), 53, &["10.244.0.5"])]
        );
        // the external IP goes: its flows to the (still serving) endpoint go with it
        assert_eq!(
            plan(&with_ext, &new, &node()),
            [gone(Some("192.0.2.1"), 53, "10.244.0.5")]
        );
    }

    #[test]
    fn serving_terminating_endpoints_keep_their_flows() {
        let old = model(vec![udp(vec![up("10.244.0.5"), up("10.244.0.6")])]);
        let new = model(vec![udp(vec![ep("10.244.0.5", false, true, true), up("10.244.0.6")])]);
        assert!(plan(&old, &new, &node()).is_empty());
        // not serving any more: its flows go
        let new = model(vec![udp(vec![ep("10.244.0.5", false, false, true), up("10.244.0.6")])]);
        assert_eq!(plan(&old, &new, &node()), [gone(Some("10.96.0.10"), 53, "10.244.0.5")]);
    }

    #[test]
    fn traffic_policy_changes_do_not_touch_flows() {
        let old = model(vec![udp(vec![up("10.244.0.5")])]);
        let new = model(vec![entry("dns", Protocol::Udp, vec![up("10.244.0.5")], |p| {
            p.internal_policy_local = true
        })]);
        assert!(plan(&old, &new, &node()).is_empty());
    }

    #[test]
    fn tcp_and_sctp_are_left_alone() {
        let old = model(vec![
            entry("web", Protocol::Tcp, vec![up("10.244.0.5")], |_| {}),
            entry("s", Protocol::Sctp, vec![up("10.244.0.5")], |_| {}),
        ]);
        assert!(plan(&old, &model(vec![]), &node()).is_empty());
        assert!(plan(&model(vec![]), &old, &node()).is_empty());
    }

    #[test]
    fn a_port_number_change_is_a_frontend_change() {
        let old = model(vec![udp(vec![up("10.244.0.5")])]);
        let new = model(vec![entry("dns", Protocol::Udp, vec![up("10.244.0.5")], |p| {
            p.port = 5353
        })]);
        assert_eq!(
            plan(&old, &new, &node()),
            [
                gone(Some("10.96.0.10"), 53, "10.244.0.5"),
                stuck(Some("10.96.0.10"), 5353, &["10.244.0.5"])
            ]
        );
    }
}
