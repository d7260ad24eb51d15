//! The executor: observes and changes the node namespace's network through rtnetlink (no `ip`
//! commands), and the nat table through `iptables-save` / `iptables-restore`.
//!
//! It makes no decisions beyond "is this link/address as asked": what to add and remove is
//! decided by [`crate::netd::plan`].

use crate::netlink::{
    errno, route_parts, RouteParts, EADDRNOTAVAIL, EEXIST, ENODEV, ENOENT, ESRCH,
};
use std::io;
use std::net::IpAddr;

use futures::TryStreamExt;
use ipnet::IpNet;
use netlink_packet_route::address::{AddressAttribute, AddressMessage, AddressScope};
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoVxlan, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
};
use netlink_packet_route::route::{
    RouteAttribute, RouteFlags, RouteHeader, RouteMessage, RouteProtocol,
};
use netlink_packet_route::AddressFamily;
use rtnetlink::{Handle, LinkBridge, LinkUnspec, LinkVxlan, RouteMessageBuilder};

use crate::masq::Iptables;
use crate::netd::error::KernelError;
use crate::netd::plan::{Entries, Mac, Op, RouteSpec, ROUTE_PROTOCOL};
use crate::netd::render::{observe_masq, render_masq};

/// The underlay interface as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Underlay {
    pub name: String,
    pub index: u32,
    pub mtu: u32,
    pub ip: IpAddr,
    /// Its global addresses with their prefixes, truncated (the connected subnets).
    pub nets: Vec<IpNet>,
}

/// The VXLAN device ferro-netd wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VxlanSpec {
    pub name: String,
    pub vni: u32,
    pub port: u16,
    pub local: IpAddr,
    pub underlay_index: u32,
    pub mtu: u32,
    /// VTEP addresses (/32, /128).
    pub addresses: Vec<IpNet>,
}

/// The pod bridge as ferro-cni would create it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgeSpec {
    pub name: String,
    pub mtu: u32,
    /// Gateway addresses with the pod CIDR's prefix.
    pub addresses: Vec<IpNet>,
}

/// What a reconcile needs from the host. Injected from `main`; tests may fake it.
#[allow(async_fn_in_trait)]
pub trait Kernel {
    /// Finds the underlay: `iface` if given, else the interface holding `node_ip`, else the
    /// default route's.
    async fn underlay(
        &self,
        iface: Option<&str>,
        node_ip: Option<IpAddr>,
    ) -> Result<Underlay, KernelError>;
    /// Creates (or, when its VNI, port, local address or underlay differ, recreates) the
    /// VXLAN device; sets MTU, learning off, up; makes its addresses exactly `addresses`.
    /// Returns its index and MAC.
    async fn ensure_vxlan(&self, spec: &VxlanSpec) -> Result<(u32, Mac), KernelError>;
    /// Creates the bridge if missing, brings it up with the MTU and adds the addresses.
    async fn ensure_bridge(&self, spec: &BridgeSpec) -> Result<(), KernelError>;
    /// The entries ferro-netd owns.
    async fn observe(&self, vxlan_index: u32) -> Result<Entries, KernelError>;
    /// Applies one op.
    async fn apply(&self, vxlan_index: u32, op: &Op) -> Result<(), KernelError>;
    /// Makes the masquerade chain hold exactly `rules`; returns whether it changed anything.
    fn ensure_masq(&self, v6: bool, rules: &[String]) -> Result<bool, KernelError>;
}

fn nl(context: impl Into<String>, e: rtnetlink::Error) -> KernelError {
    let source = match &e {
        rtnetlink::Error::NetlinkError(m) => m.to_io(),
        other => io::Error::other(other.to_string()),
    };
    KernelError::Netlink {
        context: context.into(),
        source,
    }
}

fn neigh_ip(a: &NeighbourAddress) -> Option<IpAddr> {
    match a {
        NeighbourAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        NeighbourAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        // In AF_BRIDGE (FDB) messages the parser cannot tell the family of NDA_DST from the
        // header: it comes as raw bytes.
        NeighbourAddress::Other(b) => match b.len() {
            4 => <[u8; 4]>::try_from(b.as_slice()).ok().map(IpAddr::from),
            16 => <[u8; 16]>::try_from(b.as_slice()).ok().map(IpAddr::from),
            _ => None,
        },
        _ => None,
    }
}

fn neigh_addr(ip: IpAddr) -> NeighbourAddress {
    match ip {
        IpAddr::V4(v4) => NeighbourAddress::Inet(v4),
        IpAddr::V6(v6) => NeighbourAddress::Inet6(v6),
    }
}

fn link_mac(msg: &LinkMessage) -> Option<Mac> {
    msg.attributes.iter().find_map(|a| match a {
        LinkAttribute::Address(b) => Mac::from_bytes(b),
        _ => None,
    })
}

fn link_mtu(msg: &LinkMessage) -> Option<u32> {
    msg.attributes.iter().find_map(|a| match a {
        LinkAttribute::Mtu(m) => Some(*m),
        _ => None,
    })
}

fn link_name(msg: &LinkMessage) -> Option<String> {
    msg.attributes.iter().find_map(|a| match a {
        LinkAttribute::IfName(n) => Some(n.clone()),
        _ => None,
    })
}

fn vxlan_info(msg: &LinkMessage) -> Option<Vec<InfoVxlan>> {
    let infos = msg.attributes.iter().find_map(|a| match a {
        LinkAttribute::LinkInfo(i) => Some(i),
        _ => None,
    })?;
    let mut is_vxlan = false;
    let mut data = None;
    for i in infos {
        match i {
            LinkInfo::Kind(InfoKind::Vxlan) => is_vxlan = true,
            LinkInfo::Data(InfoData::Vxlan(d)) => data = Some(d.clone()),
            _ => {}
        }
    }
    if is_vxlan {
        data
    } else {
        None
    }
}

/// Whether an existing VXLAN device matches `spec` in what cannot be changed in place.
fn vxlan_matches(info: &[InfoVxlan], spec: &VxlanSpec) -> bool {
    let mut id = None;
    let mut port = None;
    let mut local = None;
    let mut link = None;
    let mut learning = None;
    for i in info {
        match i {
            InfoVxlan::Id(v) => id = Some(*v),
            InfoVxlan::Port(p) => port = Some(*p),
            InfoVxlan::Local(a) => local = Some(IpAddr::V4(*a)),
            InfoVxlan::Local6(a) => local = Some(IpAddr::V6(*a)),
            InfoVxlan::Link(l) => link = Some(*l),
            InfoVxlan::Learning(l) => learning = Some(*l),
            _ => {}
        }
    }
    id == Some(spec.vni)
        && port == Some(spec.port)
        && local == Some(spec.local)
        && link == Some(spec.underlay_index)
        && learning == Some(false)
}

fn addr_of(a: &AddressMessage) -> Option<IpNet> {
    // IFA_LOCAL is the address itself on point-to-point links; IFA_ADDRESS otherwise.
    let local = a.attributes.iter().find_map(|x| match x {
        AddressAttribute::Local(ip) => Some(*ip),
        _ => None,
    });
    let addr = a.attributes.iter().find_map(|x| match x {
        AddressAttribute::Address(ip) => Some(*ip),
        _ => None,
    });
    IpNet::new(local.or(addr)?, a.header.prefix_len).ok()
}

/// The real executor: rtnetlink in the namespace the daemon runs in.
pub struct Netlink {
    h: Handle,
    iptables: Iptables,
}

impl Netlink {
    /// Opens the netlink socket; call inside a tokio runtime.
    pub fn new() -> Result<Netlink, KernelError> {
        let (conn, h, _) = rtnetlink::new_connection().map_err(|e| KernelError::Netlink {
            context: "open netlink socket".into(),
            source: e,
        })?;
        tokio::spawn(conn);
        Ok(Netlink {
            h,
            iptables: Iptables::default(),
        })
    }

    async fn link_by_name(&self, name: &str) -> Result<Option<LinkMessage>, KernelError> {
        match self
            .h
            .link()
            .get()
            .match_name(name.to_string())
            .execute()
            .try_next()
            .await
        {
            Ok(m) => Ok(m),
            Err(e) if errno(&e) == Some(ENODEV) => Ok(None),
            Err(e) => Err(nl(format!("get link {name}"), e)),
        }
    }

    async fn link_by_index(&self, index: u32) -> Result<Option<LinkMessage>, KernelError> {
        match self
            .h
            .link()
            .get()
            .match_index(index)
            .execute()
            .try_next()
            .await
        {
            Ok(m) => Ok(m),
            Err(e) if errno(&e) == Some(ENODEV) => Ok(None),
            Err(e) => Err(nl(format!("get link {index}"), e)),
        }
    }

    async fn addresses(&self, index: Option<u32>) -> Result<Vec<AddressMessage>, KernelError> {
        let mut req = self.h.address().get();
        if let Some(i) = index {
            req = req.set_link_index_filter(i);
        }
        let mut s = req.execute();
        let mut out = Vec::new();
        while let Some(a) = s.try_next().await.map_err(|e| nl("list addresses", e))? {
            if index.is_none_or(|i| a.header.index == i) {
                out.push(a);
            }
        }
        Ok(out)
    }

    async fn default_route_oif(&self) -> Result<Option<u32>, KernelError> {
        for query in [
            RouteMessageBuilder::<std::net::Ipv4Addr>::new().build(),
            RouteMessageBuilder::<std::net::Ipv6Addr>::new().build(),
        ] {
            let mut routes = self.h.route().get(query).execute();
            while let Some(r) = routes.try_next().await.map_err(|e| nl("list routes", e))? {
                if r.header.table != RouteHeader::RT_TABLE_MAIN
                    || r.header.destination_prefix_length != 0
                {
                    continue;
                }
                if let Some(oif) = r.attributes.iter().find_map(|a| match a {
                    RouteAttribute::Oif(i) => Some(*i),
                    _ => None,
                }) {
                    return Ok(Some(oif));
                }
            }
        }
        Ok(None)
    }

    async fn ensure_addresses(
        &self,
        index: u32,
        name: &str,
        want: &[IpNet],
        remove_others: bool,
    ) -> Result<(), KernelError> {
        let have = self.addresses(Some(index)).await?;
        if remove_others {
            for a in &have {
                let Some(net) = addr_of(a) else { continue };
                let link_local =
                    matches!(net, IpNet::V6(n) if n.addr().segments()[0] & 0xffc0 == 0xfe80);
                if link_local || want.contains(&net) {
                    continue;
                }
                match self.h.address().del(a.clone()).execute().await {
                    Err(e) if errno(&e) != Some(EADDRNOTAVAIL) => {
                        return Err(nl(format!("delete address {net} from {name}"), e))
                    }
                    _ => tracing::info!(link = name, address = %net, "removed stale address"),
                }
            }
        }
        for net in want {
            if have.iter().any(|a| addr_of(a) == Some(*net)) {
                continue;
            }
            match self
                .h
                .address()
                .add(index, net.addr(), net.prefix_len())
                .execute()
                .await
            {
                Err(e) if errno(&e) != Some(EEXIST) => {
                    return Err(nl(format!("add address {net} to {name}"), e))
                }
                _ => tracing::info!(link = name, address = %net, "added address"),
            }
        }
        Ok(())
    }

    async fn set_up_mtu(
        &self,
        link: &LinkMessage,
        name: &str,
        mtu: u32,
    ) -> Result<(), KernelError> {
        let up = link.header.flags.contains(LinkFlags::Up);
        if up && link_mtu(link) == Some(mtu) {
            return Ok(());
        }
        self.h
            .link()
            .set(
                LinkUnspec::new_with_index(link.header.index)
                    .mtu(mtu)
                    .up()
                    .build(),
            )
            .execute()
            .await
            .map_err(|e| nl(format!("set {name} up with mtu {mtu}"), e))
    }

    fn route_message(dst: &IpNet, route: &RouteSpec) -> Result<RouteMessage, KernelError> {
        let mut b = RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(dst.addr(), dst.prefix_len())
            .map_err(|e| KernelError::Underlay(format!("route {dst}: {e}")))?
            .gateway(route.gateway)
            .map_err(|e| KernelError::Underlay(format!("route {dst}: {e}")))?
            .output_interface(route.oif)
            .protocol(RouteProtocol::from(ROUTE_PROTOCOL));
        if route.onlink {
            b = b.onlink();
        }
        Ok(b.build())
    }

    fn neigh_message(vxlan: u32, ip: IpAddr) -> NeighbourMessage {
        let mut m = NeighbourMessage::default();
        m.header.family = if ip.is_ipv4() {
            AddressFamily::Inet
        } else {
            AddressFamily::Inet6
        };
        m.header.ifindex = vxlan;
        m.attributes
            .push(NeighbourAttribute::Destination(neigh_addr(ip)));
        m
    }

    fn fdb_message(vxlan: u32, mac: Mac, dst: IpAddr) -> NeighbourMessage {
        let mut m = NeighbourMessage::default();
        m.header.family = AddressFamily::Bridge;
        m.header.ifindex = vxlan;
        m.header.state = NeighbourState::Permanent;
        m.header.flags = NeighbourFlags::Own;
        m.attributes
            .push(NeighbourAttribute::LinkLayerAddress(mac.0.to_vec()));
        m.attributes
            .push(NeighbourAttribute::Destination(neigh_addr(dst)));
        m
    }
}

impl Kernel for Netlink {
    async fn underlay(
        &self,
        iface: Option<&str>,
        node_ip: Option<IpAddr>,
    ) -> Result<Underlay, KernelError> {
        let index = match (iface, node_ip) {
            (Some(name), _) => {
                self.link_by_name(name)
                    .await?
                    .ok_or_else(|| {
                        KernelError::Underlay(format!("underlay interface {name} not found"))
                    })?
                    .header
                    .index
            }
            (None, Some(ip)) => self
                .addresses(None)
                .await?
                .iter()
                .find(|a| addr_of(a).is_some_and(|n| n.addr() == ip))
                .map(|a| a.header.index)
                .ok_or_else(|| {
                    KernelError::Underlay(format!("no interface holds --node-ip {ip}"))
                })?,
            (None, None) => self.default_route_oif().await?.ok_or_else(|| {
                KernelError::Underlay(
                    "no default route to find the underlay interface; set --iface or --node-ip"
                        .into(),
                )
            })?,
        };
        let link = self
            .link_by_index(index)
            .await?
            .ok_or_else(|| KernelError::Underlay(format!("underlay link {index} vanished")))?;
        let name = link_name(&link).unwrap_or_else(|| index.to_string());
        let addrs: Vec<IpNet> = self
            .addresses(Some(index))
            .await?
            .iter()
            .filter(|a| a.header.scope == AddressScope::Universe)
            .filter_map(addr_of)
            .collect();
        let ip = match node_ip {
            Some(ip) => {
                if !addrs.iter().any(|n| n.addr() == ip) {
                    return Err(KernelError::Underlay(format!(
                        "--node-ip {ip} is not an address of {name}"
                    )));
                }
                ip
            }
            None => addrs
                .iter()
                .map(IpNet::addr)
                .find(IpAddr::is_ipv4)
                .or_else(|| addrs.first().map(IpNet::addr))
                .ok_or_else(|| {
                    KernelError::Underlay(format!(
                        "underlay interface {name} has no global address"
                    ))
                })?,
        };
        Ok(Underlay {
            name,
            index,
            mtu: link_mtu(&link).unwrap_or(1500),
            ip,
            nets: addrs.iter().map(IpNet::trunc).collect(),
        })
    }

    async fn ensure_vxlan(&self, spec: &VxlanSpec) -> Result<(u32, Mac), KernelError> {
        let mut link = self.link_by_name(&spec.name).await?;
        if let Some(l) = &link {
            if !vxlan_info(l).is_some_and(|i| vxlan_matches(&i, spec)) {
                tracing::warn!(link = %spec.name, "existing device differs from the configuration (VNI, port, local address or underlay); recreating it");
                match self.h.link().del(l.header.index).execute().await {
                    Err(e) if errno(&e) != Some(ENODEV) => {
                        return Err(nl(format!("delete {}", spec.name), e))
                    }
                    _ => {}
                }
                link = None;
            }
        }
        if link.is_none() {
            let mut b = LinkVxlan::new(&spec.name, spec.vni)
                .dev(spec.underlay_index)
                .port(spec.port)
                .learning(false)
                .mtu(spec.mtu);
            b = match spec.local {
                IpAddr::V4(a) => b.local(a),
                IpAddr::V6(a) => b.local6(a),
            };
            match self.h.link().add(b.build()).execute().await {
                Err(e) if errno(&e) != Some(EEXIST) => {
                    return Err(nl(format!("create vxlan device {}", spec.name), e))
                }
                _ => {
                    tracing::info!(link = %spec.name, vni = spec.vni, port = spec.port, local = %spec.local, "created vxlan device")
                }
            }
            link = self.link_by_name(&spec.name).await?;
        }
        let link = link.ok_or_else(|| {
            KernelError::Underlay(format!(
                "vxlan device {} vanished after creation",
                spec.name
            ))
        })?;
        self.set_up_mtu(&link, &spec.name, spec.mtu).await?;
        self.ensure_addresses(link.header.index, &spec.name, &spec.addresses, true)
            .await?;
        let mac = link_mac(&link).ok_or_else(|| {
            KernelError::Underlay(format!("vxlan device {} has no MAC address", spec.name))
        })?;
        Ok((link.header.index, mac))
    }

    async fn ensure_bridge(&self, spec: &BridgeSpec) -> Result<(), KernelError> {
        let mut link = self.link_by_name(&spec.name).await?;
        if link.is_none() {
            match self
                .h
                .link()
                .add(LinkBridge::new(&spec.name).mtu(spec.mtu).build())
                .execute()
                .await
            {
                Err(e) if errno(&e) != Some(EEXIST) => {
                    return Err(nl(format!("create bridge {}", spec.name), e))
                }
                _ => tracing::info!(link = %spec.name, "created bridge"),
            }
            link = self.link_by_name(&spec.name).await?;
        }
        let link = link.ok_or_else(|| {
            KernelError::Underlay(format!("bridge {} vanished after creation", spec.name))
        })?;
        self.set_up_mtu(&link, &spec.name, spec.mtu).await?;
        self.ensure_addresses(link.header.index, &spec.name, &spec.addresses, false)
            .await
    }

    async fn observe(&self, vxlan: u32) -> Result<Entries, KernelError> {
        let mut out = Entries::default();
        // FDB: every entry with a destination on the VXLAN device.
        let mut s = self
            .h
            .neighbours()
            .get()
            .set_address_family(AddressFamily::Bridge)
            .execute();
        while let Some(n) = s.try_next().await.map_err(|e| nl("list fdb", e))? {
            if n.header.ifindex != vxlan {
                continue;
            }
            let mut mac = None;
            let mut dst = None;
            for a in &n.attributes {
                match a {
                    NeighbourAttribute::LinkLayerAddress(b) => mac = Mac::from_bytes(b),
                    NeighbourAttribute::Destination(d) => dst = neigh_ip(d),
                    _ => {}
                }
            }
            if let (Some(mac), Some(dst)) = (mac, dst) {
                out.fdb.insert((mac, dst));
            }
        }
        // Neighbours: the permanent ones on the VXLAN device.
        for fam in [AddressFamily::Inet, AddressFamily::Inet6] {
            let mut s = self.h.neighbours().get().set_address_family(fam).execute();
            while let Some(n) = s.try_next().await.map_err(|e| nl("list neighbours", e))? {
                if n.header.ifindex != vxlan || n.header.state != NeighbourState::Permanent {
                    continue;
                }
                let mut mac = None;
                let mut ip = None;
                for a in &n.attributes {
                    match a {
                        NeighbourAttribute::LinkLayerAddress(b) => mac = Mac::from_bytes(b),
                        NeighbourAttribute::Destination(d) => ip = neigh_ip(d),
                        _ => {}
                    }
                }
                if let (Some(ip), Some(mac)) = (ip, mac) {
                    out.neigh.insert(ip, mac);
                }
            }
        }
        // Routes: protocol ROUTE_PROTOCOL in the main table.
        for query in [
            RouteMessageBuilder::<std::net::Ipv4Addr>::new().build(),
            RouteMessageBuilder::<std::net::Ipv6Addr>::new().build(),
        ] {
            let mut routes = self.h.route().get(query).execute();
            while let Some(r) = routes.try_next().await.map_err(|e| nl("list routes", e))? {
                if r.header.table != RouteHeader::RT_TABLE_MAIN
                    || u8::from(r.header.protocol) != ROUTE_PROTOCOL
                {
                    continue;
                }
                let RouteParts { oif, dst, gw } = route_parts(&r);
                let fam_any = if r.header.address_family == AddressFamily::Inet6 {
                    IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)
                } else {
                    IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)
                };
                let Ok(dst) =
                    IpNet::new(dst.unwrap_or(fam_any), r.header.destination_prefix_length)
                else {
                    continue;
                };
                out.routes.insert(
                    dst,
                    RouteSpec {
                        gateway: gw.unwrap_or(fam_any),
                        oif: oif.unwrap_or(0),
                        onlink: r.header.flags.contains(RouteFlags::Onlink),
                    },
                );
            }
        }
        Ok(out)
    }

    async fn apply(&self, vxlan: u32, op: &Op) -> Result<(), KernelError> {
        let h = &self.h;
        match op {
            Op::DelRoute { dst, route } => {
                let msg = Self::route_message(dst, route)?;
                match h.route().del(msg).execute().await {
                    Err(e) if !matches!(errno(&e), Some(ESRCH | ENOENT)) => {
                        Err(nl(format!("delete route {dst}"), e))
                    }
                    _ => Ok(()),
                }
            }
            Op::DelNeigh { ip, .. } => {
                match h
                    .neighbours()
                    .del(Self::neigh_message(vxlan, *ip))
                    .execute()
                    .await
                {
                    Err(e) if errno(&e) != Some(ENOENT) => {
                        Err(nl(format!("delete neighbour {ip}"), e))
                    }
                    _ => Ok(()),
                }
            }
            Op::DelFdb { mac, dst } => {
                match h
                    .neighbours()
                    .del(Self::fdb_message(vxlan, *mac, *dst))
                    .execute()
                    .await
                {
                    Err(e) if errno(&e) != Some(ENOENT) => {
                        Err(nl(format!("delete fdb {mac} dst {dst}"), e))
                    }
                    _ => Ok(()),
                }
            }
            Op::AddFdb { mac, dst } => {
                // NLM_F_CREATE|NLM_F_APPEND semantics: `bridge fdb append`.
                let mut req = h.neighbours().add_bridge(vxlan, &mac.0);
                let m = req.message_mut();
                m.header.flags = NeighbourFlags::Own;
                m.attributes
                    .push(NeighbourAttribute::Destination(neigh_addr(*dst)));
                match req.execute().await {
                    Err(e) if errno(&e) != Some(EEXIST) => {
                        Err(nl(format!("add fdb {mac} dst {dst}"), e))
                    }
                    _ => Ok(()),
                }
            }
            Op::SetNeigh { ip, mac } => h
                .neighbours()
                .add(vxlan, *ip)
                .link_layer_address(&mac.0)
                .state(NeighbourState::Permanent)
                .replace()
                .execute()
                .await
                .map_err(|e| nl(format!("set neighbour {ip} lladdr {mac}"), e)),
            Op::SetRoute { dst, route } => {
                let msg = Self::route_message(dst, route)?;
                h.route()
                    .add(msg)
                    .replace()
                    .execute()
                    .await
                    .map_err(|e| nl(format!("set route {dst} via {}", route.gateway), e))
            }
        }
    }

    fn ensure_masq(&self, v6: bool, rules: &[String]) -> Result<bool, KernelError> {
        if rules.is_empty() {
            return Ok(false);
        }
        let observed = observe_masq(&self.iptables.save(v6).map_err(KernelError::Masq)?);
        match render_masq(rules, &observed) {
            None => Ok(false),
            Some(text) => {
                self.iptables
                    .restore(v6, &text)
                    .map_err(KernelError::Masq)?;
                Ok(true)
            }
        }
    }
}
