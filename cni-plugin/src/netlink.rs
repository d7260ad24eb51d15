//! Netlink helpers shared by ferro-cni's dataplane and ferro-netd's executor: errno of a
//! kernel answer, and the parts of a route message both read.

use std::net::IpAddr;

use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage};

/// errno values the callers treat as "already so" or "already gone".
pub const ENOENT: i32 = 2;
pub const ESRCH: i32 = 3;
pub const EEXIST: i32 = 17;
pub const ENODEV: i32 = 19;
pub const EADDRNOTAVAIL: i32 = 99;

/// The errno of a kernel's netlink error answer (None for other failures).
pub fn errno(e: &rtnetlink::Error) -> Option<i32> {
    match e {
        rtnetlink::Error::NetlinkError(m) => Some(-m.raw_code()),
        _ => None,
    }
}

/// An IP address of a route attribute.
pub fn route_ip(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

/// The parts of a route both callers compare.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RouteParts {
    pub oif: Option<u32>,
    pub dst: Option<IpAddr>,
    pub gw: Option<IpAddr>,
}

/// Output interface, destination and gateway of a route.
pub fn route_parts(r: &RouteMessage) -> RouteParts {
    let mut p = RouteParts::default();
    for attr in &r.attributes {
        match attr {
            RouteAttribute::Oif(i) => p.oif = Some(*i),
            RouteAttribute::Destination(a) => p.dst = route_ip(a),
            RouteAttribute::Gateway(a) => p.gw = route_ip(a),
            _ => {}
        }
    }
    p
}
