//! The pure planner: Node objects + local facts -> the overlay entries this node should have,
//! and `plan(desired, observed) -> Vec<Op>`.
//!
//! Scheme (flannel's VXLAN backend, in ferro's names):
//! - every node has one VXLAN device, [`crate::netd::config::VXLAN_DEVICE`], whose MAC it
//!   publishes in the annotation [`ANN_VTEP_MAC`] of its Node, and whose underlay address it
//!   publishes in [`ANN_PUBLIC_IP`];
//! - the VTEP address of a node is the network address of each of its pod CIDRs (`10.244.1.0`
//!   for `10.244.1.0/24`), put on its VXLAN device as /32 (/128); nothing has to be published
//!   for it, every node derives it from `spec.podCIDRs`;
//! - for every other node with a pod CIDR and both annotations: an FDB entry (VTEP MAC -> dst
//!   underlay IP, permanent), a neighbour (VTEP address -> VTEP MAC, permanent) and a route
//!   `podCIDR via VTEP address dev ferro.vxlan onlink`, all on the VXLAN device; with direct
//!   routing and the peer's underlay address on a connected subnet of the underlay interface,
//!   only a route `podCIDR via underlay IP dev <underlay>`.
//!
//! What ferro-netd owns, and so may delete: every FDB entry and every permanent neighbour on
//! its VXLAN device, and every route of protocol [`ROUTE_PROTOCOL`] in the main table.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;

use crate::netd::error::NodeError;

/// Annotation with the MAC address of a node's VXLAN device.
pub const ANN_VTEP_MAC: &str = "ferro.dev/vtep-mac";
/// Annotation with a node's underlay address (the VXLAN tunnel endpoint).
pub const ANN_PUBLIC_IP: &str = "ferro.dev/public-ip";
/// Route protocol (`rtm_protocol`) that marks ferro-netd's routes: `ip route show proto 147`.
/// Unassigned in iproute2's `rt_protos`.
pub const ROUTE_PROTOCOL: u8 = 147;

/// An Ethernet address.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Mac(pub [u8; 6]);

impl fmt::Debug for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

impl FromStr for Mac {
    type Err = &'static str;
    fn from_str(s: &str) -> Result<Mac, Self::Err> {
        let mut out = [0u8; 6];
        let mut parts = s.split(':');
        for b in out.iter_mut() {
            let p = parts.next().ok_or("want six hex bytes separated by ':'")?;
            if p.len() != 2 {
                return Err("want six hex bytes separated by ':'");
            }
            *b = u8::from_str_radix(p, 16).map_err(|_| "want six hex bytes separated by ':'")?;
        }
        if parts.next().is_some() {
            return Err("want six hex bytes separated by ':'");
        }
        if out == [0; 6] || out[0] & 1 == 1 {
            return Err("not a unicast address");
        }
        Ok(Mac(out))
    }
}

impl Mac {
    /// From a netlink attribute; `None` unless 6 bytes.
    pub fn from_bytes(b: &[u8]) -> Option<Mac> {
        <[u8; 6]>::try_from(b).ok().map(Mac)
    }
}

/// What the planner needs of one Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    pub name: String,
    /// `spec.podCIDRs`, or `spec.podCIDR` when the list is empty; truncated to the network.
    pub pod_cidrs: Vec<IpNet>,
    pub vtep_mac: Option<Mac>,
    pub public_ip: Option<IpAddr>,
}

/// A Node's pod CIDRs: `spec.podCIDRs`, or `spec.podCIDR` when the list is empty, truncated
/// to the network; empty when none is assigned yet.
pub fn pod_cidrs_of(node: &Node) -> Result<Vec<IpNet>, NodeError> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let spec = node.spec.as_ref();
    let mut raw: Vec<String> = spec.and_then(|s| s.pod_cidrs.clone()).unwrap_or_default();
    if raw.is_empty() {
        raw.extend(spec.and_then(|s| s.pod_cidr.clone()));
    }
    let mut pod_cidrs = Vec::new();
    for value in raw {
        let net: IpNet = value.parse().map_err(|_| NodeError::PodCidr {
            node: name.clone(),
            value: value.clone(),
        })?;
        // A VTEP address is the network address: a /32 (/128) has no room for pods.
        if net.prefix_len() + 2 > net.max_prefix_len() {
            return Err(NodeError::PodCidr { node: name, value });
        }
        pod_cidrs.push(net.trunc());
    }
    Ok(pod_cidrs)
}

/// Reads a Node. A malformed pod CIDR or annotation is an error (the node is skipped); a
/// missing one is `None`/empty (the node is not ready yet).
pub fn node_view(node: &Node) -> Result<NodeView, NodeError> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let pod_cidrs = pod_cidrs_of(node)?;
    let ann = node.metadata.annotations.as_ref();
    let get = |k: &str| ann.and_then(|a| a.get(k)).map(|v| v.trim().to_string());
    let vtep_mac = match get(ANN_VTEP_MAC) {
        None => None,
        Some(v) => Some(v.parse::<Mac>().map_err(|reason| NodeError::Annotation {
            node: name.clone(),
            key: ANN_VTEP_MAC,
            value: v.clone(),
            reason,
        })?),
    };
    let public_ip = match get(ANN_PUBLIC_IP) {
        None => None,
        Some(v) => {
            let ip: IpAddr = v.parse().map_err(|_| NodeError::Annotation {
                node: name.clone(),
                key: ANN_PUBLIC_IP,
                value: v.clone(),
                reason: "not an IP address",
            })?;
            if ip.is_unspecified() || ip.is_multicast() || ip.is_loopback() {
                return Err(NodeError::Annotation {
                    node: name,
                    key: ANN_PUBLIC_IP,
                    value: v,
                    reason: "not a unicast address",
                });
            }
            Some(ip)
        }
    };
    Ok(NodeView {
        name,
        pod_cidrs,
        vtep_mac,
        public_ip,
    })
}

/// The VTEP address of a pod CIDR: its network address.
pub fn vtep_addr(cidr: &IpNet) -> IpAddr {
    cidr.network()
}

/// The VTEP addresses (as /32 or /128) of this node's VXLAN device.
pub fn vtep_addresses(pod_cidrs: &[IpNet]) -> Vec<IpNet> {
    pod_cidrs
        .iter()
        .map(|c| IpNet::from(vtep_addr(c)))
        .collect()
}

/// Facts about this node the planner needs, observed by the executor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalFacts {
    pub underlay_ip: IpAddr,
    pub underlay_index: u32,
    /// Prefixes connected to the underlay interface (for direct routing).
    pub underlay_nets: Vec<IpNet>,
    pub vxlan_index: u32,
    pub direct_routing: bool,
}

/// How a route leaves this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct RouteSpec {
    pub gateway: IpAddr,
    pub oif: u32,
    pub onlink: bool,
}

/// The overlay entries of this node (desired or observed).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Entries {
    /// FDB on the VXLAN device: (VTEP MAC, underlay dst).
    pub fdb: BTreeSet<(Mac, IpAddr)>,
    /// Permanent neighbours on the VXLAN device: VTEP address -> MAC.
    pub neigh: BTreeMap<IpAddr, Mac>,
    /// Routes of protocol [`ROUTE_PROTOCOL`] in the main table.
    pub routes: BTreeMap<IpNet, RouteSpec>,
}

/// A node the planner did not use, and why (logged by the caller).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skipped {
    Invalid(NodeError),
    /// No pod CIDR or no annotations yet: normal while a node starts.
    NotReady(String),
    /// Its public IP is ours.
    SameUnderlay(String),
}

/// The desired entries for the peers of `own`, and the nodes left out.
pub fn desired_entries(own: &str, nodes: &[Node], local: &LocalFacts) -> (Entries, Vec<Skipped>) {
    let mut out = Entries::default();
    let mut skipped = Vec::new();
    for node in nodes {
        if node.metadata.name.as_deref() == Some(own) {
            continue;
        }
        let view = match node_view(node) {
            Ok(v) => v,
            Err(e) => {
                skipped.push(Skipped::Invalid(e));
                continue;
            }
        };
        let (Some(mac), Some(public_ip)) = (view.vtep_mac, view.public_ip) else {
            skipped.push(Skipped::NotReady(view.name));
            continue;
        };
        if view.pod_cidrs.is_empty() {
            skipped.push(Skipped::NotReady(view.name));
            continue;
        }
        if public_ip == local.underlay_ip {
            skipped.push(Skipped::SameUnderlay(view.name));
            continue;
        }
        // The underlay address must be of the underlay's family to be a VXLAN destination.
        if public_ip.is_ipv4() != local.underlay_ip.is_ipv4() {
            skipped.push(Skipped::Invalid(NodeError::Annotation {
                node: view.name,
                key: ANN_PUBLIC_IP,
                value: public_ip.to_string(),
                reason: "not of the underlay's address family",
            }));
            continue;
        }
        let direct =
            local.direct_routing && local.underlay_nets.iter().any(|n| n.contains(&public_ip));
        let mut uses_vxlan = false;
        for cidr in &view.pod_cidrs {
            if direct && cidr.addr().is_ipv4() == public_ip.is_ipv4() {
                out.routes.insert(
                    *cidr,
                    RouteSpec {
                        gateway: public_ip,
                        oif: local.underlay_index,
                        onlink: false,
                    },
                );
            } else {
                uses_vxlan = true;
                let vtep = vtep_addr(cidr);
                out.neigh.insert(vtep, mac);
                out.routes.insert(
                    *cidr,
                    RouteSpec {
                        gateway: vtep,
                        oif: local.vxlan_index,
                        onlink: true,
                    },
                );
            }
        }
        if uses_vxlan {
            out.fdb.insert((mac, public_ip));
        }
    }
    (out, skipped)
}

/// One change to the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    DelRoute {
        dst: IpNet,
        route: RouteSpec,
    },
    DelNeigh {
        ip: IpAddr,
        mac: Mac,
    },
    DelFdb {
        mac: Mac,
        dst: IpAddr,
    },
    AddFdb {
        mac: Mac,
        dst: IpAddr,
    },
    /// Create or replace.
    SetNeigh {
        ip: IpAddr,
        mac: Mac,
    },
    /// Create or replace.
    SetRoute {
        dst: IpNet,
        route: RouteSpec,
    },
}

/// The ops that turn `observed` into `desired`: deletions first (routes, then neighbours,
/// then FDB), then additions in the opposite order, so a route only appears once its
/// neighbour and FDB entry exist. Entries that are already right are not touched.
pub fn plan(desired: &Entries, observed: &Entries) -> Vec<Op> {
    let mut ops = Vec::new();
    for (dst, route) in &observed.routes {
        if !desired.routes.contains_key(dst) {
            ops.push(Op::DelRoute {
                dst: *dst,
                route: *route,
            });
        }
    }
    for (ip, mac) in &observed.neigh {
        if !desired.neigh.contains_key(ip) {
            ops.push(Op::DelNeigh { ip: *ip, mac: *mac });
        }
    }
    for (mac, dst) in observed.fdb.difference(&desired.fdb) {
        ops.push(Op::DelFdb {
            mac: *mac,
            dst: *dst,
        });
    }
    for (mac, dst) in desired.fdb.difference(&observed.fdb) {
        ops.push(Op::AddFdb {
            mac: *mac,
            dst: *dst,
        });
    }
    for (ip, mac) in &desired.neigh {
        if observed.neigh.get(ip) != Some(mac) {
            ops.push(Op::SetNeigh { ip: *ip, mac: *mac });
        }
    }
    for (dst, route) in &desired.routes {
        if observed.routes.get(dst) != Some(route) {
            ops.push(Op::SetRoute {
                dst: *dst,
                route: *route,
            });
        }
    }
    ops
}

/// The annotations this node publishes.
pub fn own_annotations(mac: Mac, underlay_ip: IpAddr) -> BTreeMap<String, String> {
    BTreeMap::from([
        (ANN_VTEP_MAC.to_string(), mac.to_string()),
        (ANN_PUBLIC_IP.to_string(), underlay_ip.to_string()),
    ])
}

/// The annotations from `want` that `node` does not have with the same value.
pub fn annotations_to_patch(
    node: &Node,
    want: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let have = node.metadata.annotations.as_ref();
    want.iter()
        .filter(|(k, v)| have.and_then(|h| h.get(*k)) != Some(*v))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The MTU of pod interfaces and of the VXLAN device: the underlay's minus the VXLAN
/// overhead (50 bytes over IPv4, 70 over IPv6).
pub fn overlay_mtu(underlay_mtu: u32, underlay_ip: IpAddr) -> u32 {
    let overhead = if underlay_ip.is_ipv4() { 50 } else { 70 };
    underlay_mtu.saturating_sub(overhead).max(68)
}

/// The gateway address ferro-cni puts on the bridge: the pod CIDR's network + 1.
pub fn gateway_of(cidr: &IpNet) -> IpNet {
    let gw = match cidr.network() {
        IpAddr::V4(a) => IpAddr::V4(std::net::Ipv4Addr::from(u32::from(a).wrapping_add(1))),
        IpAddr::V6(a) => IpAddr::V6(std::net::Ipv6Addr::from(u128::from(a).wrapping_add(1))),
    };
    IpNet::new(gw, cidr.prefix_len()).unwrap_or(*cidr)
}
