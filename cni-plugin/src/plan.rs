//! Pure planning for bridge mode: names, addresses and routes an ADD puts in place, and the
//! result it reports. Nothing here touches the host.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

use crate::config::{IpamConf, NetConf};
use crate::error::CniError;
use crate::ipam::Allocation;
use crate::masq::MasqSpec;
use crate::result::{CniResult, Dns, Interface, IpConfig, Route};

/// FNV-1a (32 bit): stable across Rust releases, unlike `DefaultHasher`.
fn fnv1a(parts: &[&str]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            // A 0 byte between parts: ("ab", "c") and ("a", "bc") differ.
            h = h.wrapping_mul(0x0100_0193);
        }
        for b in p.bytes() {
            h ^= u32::from(b);
            h = h.wrapping_mul(0x0100_0193);
        }
    }
    h
}

/// Host end of the veth: `veth` + 8 hex digits of a hash of (containerID, ifname).
pub fn host_veth_name(container_id: &str, ifname: &str) -> String {
    format!("veth{:08x}", fnv1a(&[container_id, ifname]))
}

/// The bridge to ensure in the node namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgeSpec {
    pub name: String,
    pub mtu: Option<u32>,
    pub promisc: bool,
    /// Gateway addresses (with the subnet's prefix) when `isGateway`.
    pub addresses: Vec<IpNet>,
}

/// The veth pair and the container side's configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct VethSpec {
    pub host_name: String,
    pub netns: String,
    pub ifname: String,
    pub mtu: Option<u32>,
    pub hairpin: bool,
    pub addresses: Vec<IpNet>,
    pub routes: Vec<Route>,
}

/// Everything an ADD applies, computed from the config and the IPAM allocations.
#[derive(Debug, Clone, PartialEq)]
pub struct AddPlan {
    pub bridge: BridgeSpec,
    /// Write `ip_forward` (v4) / `forwarding` (v6) in the node namespace.
    pub forward_v4: bool,
    pub forward_v6: bool,
    pub veth: VethSpec,
    /// ipMasq: one masquerade chain per allocated address (empty without ipMasq).
    pub masq: Vec<MasqSpec>,
    /// The result, without MAC addresses (filled in after the links exist).
    pub result: CniResult,
}

fn invalid(msg: impl Into<String>) -> CniError {
    CniError::InvalidConfig(msg.into())
}

/// Plans an ADD. `allocs` are the addresses IPAM reserved, one per range set.
pub fn plan_add(
    conf: &NetConf,
    container_id: &str,
    netns: &str,
    ifname: &str,
    allocs: &[Allocation],
) -> Result<AddPlan, CniError> {
    let addresses: Vec<IpNet> = allocs.iter().map(Allocation::address).collect();
    let bridge_addrs: Vec<IpNet> = if conf.is_gateway {
        allocs
            .iter()
            .map(|a| {
                IpNet::new(a.gateway, a.prefix)
                    .map_err(|_| invalid(format!("bad gateway prefix /{}", a.prefix)))
            })
            .collect::<Result<_, _>>()?
    } else {
        Vec::new()
    };
    let gw_for = |v4: bool| {
        allocs
            .iter()
            .find(|a| a.ip.is_ipv4() == v4)
            .map(|a| a.gateway)
    };
    let mut routes = Vec::new();
    if conf.is_gateway || conf.is_default_gateway {
        for a in allocs {
            let dst = if a.ip.is_ipv4() {
                IpNet::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0)
            } else {
                IpNet::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0)
            }
            .map_err(|_| invalid("default route"))?;
            if !routes.iter().any(|r: &Route| r.dst == dst) {
                routes.push(Route::new(dst, Some(a.gateway)));
            }
        }
    }
    if let Some(IpamConf::Builtin(b)) = &conf.ipam {
        for (i, r) in b.routes.iter().enumerate() {
            let dst: IpNet = r
                .dst
                .parse::<IpNet>()
                .map_err(|_| invalid(format!("ipam.routes[{i}].dst: bad subnet {:?}", r.dst)))?
                .trunc();
            let gw = match &r.gw {
                Some(g) => Some(
                    g.parse::<IpAddr>()
                        .map_err(|_| invalid(format!("ipam.routes[{i}].gw: bad address {g:?}")))?,
                ),
                // As host-local + the reference plugins: the gateway of the same family.
                None => gw_for(dst.addr().is_ipv4()),
            };
            if routes.iter().any(|x: &Route| x.dst == dst) {
                continue;
            }
            routes.push(Route::new(dst, gw));
        }
    }
    let host_name = host_veth_name(container_id, ifname);
    let dns = conf
        .dns
        .as_ref()
        .and_then(|d| serde_json::from_value::<Dns>(d.clone()).ok())
        .unwrap_or_default();
    let result = CniResult {
        interfaces: vec![
            Interface {
                name: conf.bridge.clone(),
                ..Interface::default()
            },
            Interface {
                name: host_name.clone(),
                ..Interface::default()
            },
            Interface {
                name: ifname.to_string(),
                sandbox: Some(netns.to_string()),
                ..Interface::default()
            },
        ],
        ips: allocs
            .iter()
            .map(|a| IpConfig {
                address: a.address(),
                gateway: Some(a.gateway),
                interface: Some(2),
            })
            .collect(),
        routes: routes.clone(),
        dns,
    };
    Ok(AddPlan {
        bridge: BridgeSpec {
            name: conf.bridge.clone(),
            mtu: conf.mtu,
            promisc: conf.promisc_mode,
            addresses: bridge_addrs,
        },
        forward_v4: conf.is_gateway && allocs.iter().any(|a| a.ip.is_ipv4()),
        forward_v6: conf.is_gateway && allocs.iter().any(|a| a.ip.is_ipv6()),
        veth: VethSpec {
            host_name,
            netns: netns.to_string(),
            ifname: ifname.to_string(),
            mtu: conf.mtu,
            hairpin: conf.hairpin_mode,
            addresses,
            routes,
        },
        masq: if conf.ip_masq {
            allocs
                .iter()
                .map(|a| MasqSpec::new(&conf.name, container_id, a.ip, a.prefix))
                .collect()
        } else {
            Vec::new()
        },
        result,
    })
}

fn check_failed(msg: impl Into<String>) -> CniError {
    CniError::CheckFailed(msg.into())
}

/// CHECK's comparison of a `prevResult` with the container interface as observed: the
/// interface is up, has the reported MAC, every reported address of that interface and
/// every reported route (a route without `gw` matches any gateway).
pub fn verify_container(
    prev: &CniResult,
    netns: &str,
    ifname: &str,
    observed: Option<&crate::dataplane::ContainerLink>,
) -> Result<(), CniError> {
    let Some((idx, iface)) = prev
        .interfaces
        .iter()
        .enumerate()
        .find(|(_, i)| i.name == ifname && i.sandbox.as_deref() == Some(netns))
    else {
        return Err(check_failed(format!(
            "prevResult has no interface {ifname} in sandbox {netns}"
        )));
    };
    let Some(link) = observed else {
        return Err(check_failed(format!("{ifname} does not exist in {netns}")));
    };
    if !link.up {
        return Err(check_failed(format!("{ifname} is down")));
    }
    if let (Some(want), Some(got)) = (&iface.mac, &link.mac) {
        if !want.eq_ignore_ascii_case(got) {
            return Err(check_failed(format!("{ifname} has MAC {got}, want {want}")));
        }
    }
    for ip in prev.ips.iter().filter(|ip| ip.interface == Some(idx)) {
        if !link.addresses.contains(&ip.address) {
            return Err(check_failed(format!(
                "{ifname} lacks address {}",
                ip.address
            )));
        }
    }
    for r in &prev.routes {
        let present = link
            .routes
            .iter()
            .any(|(dst, gw)| *dst == r.dst && (r.gw.is_none() || r.gw == *gw));
        if !present {
            return Err(check_failed(format!(
                "route to {} via {:?} is missing in {netns}",
                r.dst, r.gw
            )));
        }
    }
    Ok(())
}
