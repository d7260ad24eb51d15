//! The narrow executor bridge mode needs, and its real implementation over rtnetlink.
//!
//! The plugin runs in the node's network namespace. Work inside the container's namespace
//! goes through a second netlink socket opened while this thread is switched into that
//! namespace with `setns` (a socket stays bound to the namespace it was created in), so the
//! thread is back in the node namespace before any request is sent.

use crate::netlink::{errno, route_parts, RouteParts, EADDRNOTAVAIL, EEXIST, ENODEV, ENOENT};
use std::fs::File;
use std::io;
use std::net::IpAddr;
use std::path::PathBuf;

use futures::TryStreamExt;
use ipnet::IpNet;
use netlink_packet_route::address::{AddressAttribute, AddressFlags, AddressHeaderFlags};
use netlink_packet_route::link::{
    InfoData, InfoVeth, LinkAttribute, LinkFlags, LinkInfo as NlLinkInfo, LinkMessage,
};
use netlink_packet_route::route::RouteHeader;
use netlink_packet_route::AddressFamily;
use nix::sched::CloneFlags;
use rtnetlink::{Handle, LinkBridge, LinkBridgePort, LinkUnspec, LinkVeth, RouteMessageBuilder};

use crate::error::CniError;
use crate::masq::{Iptables, MasqSpec};
use crate::plan::{BridgeSpec, VethSpec};
use crate::result::Route;

/// A link as ADD reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkInfo {
    pub index: u32,
    pub mac: Option<String>,
}

/// The container interface as CHECK observes it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ContainerLink {
    pub mac: Option<String>,
    pub up: bool,
    pub addresses: Vec<IpNet>,
    /// Main-table routes out of this interface: (destination, gateway).
    pub routes: Vec<(IpNet, Option<IpAddr>)>,
}

/// What ADD and DEL do to the host. Implementations must be idempotent where noted.
pub trait Dataplane {
    /// Fails with code 4 when `netns` cannot be opened as a network namespace.
    fn check_netns(&mut self, netns: &str) -> Result<(), CniError>;
    /// Creates the bridge if missing, sets MTU/promisc, brings it up, adds the addresses
    /// (already present ones are fine).
    fn ensure_bridge(&mut self, spec: &BridgeSpec) -> Result<LinkInfo, CniError>;
    /// Turns on forwarding in the node namespace.
    fn enable_forwarding(&mut self, v4: bool, v6: bool) -> Result<(), CniError>;
    /// Creates the pair on `bridge`, moves the peer into the container and configures it
    /// there. Returns (host end, container end). A stale pair of the same name is replaced.
    fn create_veth(
        &mut self,
        spec: &VethSpec,
        bridge: u32,
    ) -> Result<(LinkInfo, LinkInfo), CniError>;
    /// A node-namespace link by name, `None` when missing.
    fn host_link(&mut self, name: &str) -> Result<Option<LinkInfo>, CniError>;
    /// Deletes a node-namespace link by name; `Ok(false)` when it does not exist.
    fn delete_host_link(&mut self, name: &str) -> Result<bool, CniError>;
    /// Deletes `ifname` inside `netns`; success when the namespace or link is gone.
    fn delete_container_link(&mut self, netns: &str, ifname: &str) -> Result<(), CniError>;
    /// DEL's part of the links. Makes the attachment inert before it returns: the addresses
    /// of `ifname` in `netns` are removed, so an address released afterwards is live nowhere.
    /// The veth pair itself (found by its host end `host`) is deleted after this process has
    /// exited, by a detached child: the kernel's unregister of a pair waits for RCU grace
    /// periods (~15-20 ms here), time the runtime would otherwise wait for. When the host
    /// end is missing, what is left in the container is deleted before returning. Success
    /// when the namespace or links are gone.
    fn release_links(
        &mut self,
        netns: Option<&str>,
        ifname: &str,
        host: &str,
    ) -> Result<(), CniError>;
    /// Reads `ifname` inside `netns`; `None` when the link is missing.
    fn container_link(
        &mut self,
        netns: &str,
        ifname: &str,
    ) -> Result<Option<ContainerLink>, CniError>;
    /// ipMasq: installs (or replaces) the container's masquerade chain and POSTROUTING jump
    /// in the node namespace's nat table, atomically.
    fn ensure_masq(&mut self, spec: &MasqSpec) -> Result<(), CniError>;
    /// Removes the POSTROUTING jumps to `chain` and the chain (ip6tables when `v6`);
    /// success when they do not exist.
    fn remove_masq(&mut self, chain: &str, v6: bool) -> Result<(), CniError>;
    /// CHECK: the masquerade chain and jump of `spec` are as ADD installed them (code 101
    /// otherwise).
    fn verify_masq(&mut self, spec: &MasqSpec) -> Result<(), CniError>;
    /// GC: removes the masquerade chains of `network` (by their comment) whose name is not
    /// in `keep`, for one family; returns the removed chains.
    fn gc_masq(
        &mut self,
        network: &str,
        keep: &[String],
        v6: bool,
    ) -> Result<Vec<String>, CniError>;
    /// GC: deletes the links enslaved to `bridge` whose name has the form of ferro's host
    /// veths (`veth` + 8 hex digits) and is not in `keep`; returns their names. A missing
    /// bridge has none.
    fn gc_host_veths(&mut self, bridge: &str, keep: &[String]) -> Result<Vec<String>, CniError>;
}

/// The first argument that makes ferro-cni a link reaper (`ferro-cni --reap-link <index>
/// <name>`), started by DEL; see [`Dataplane::release_links`].
pub const REAP_ARG: &str = "--reap-link";

/// Whether `name` has the form of [`crate::plan::host_veth_name`].
pub fn is_ferro_host_veth(name: &str) -> bool {
    name.strip_prefix("veth").is_some_and(|h| {
        h.len() == 8
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

fn nl(context: impl Into<String>, e: rtnetlink::Error) -> CniError {
    let source = match &e {
        rtnetlink::Error::NetlinkError(m) => m.to_io(),
        other => io::Error::other(other.to_string()),
    };
    CniError::io(context, source)
}

fn mac_of(msg: &LinkMessage) -> Option<String> {
    msg.attributes.iter().find_map(|a| match a {
        LinkAttribute::Address(b) if b.len() == 6 => Some(mac_string(b)),
        _ => None,
    })
}

async fn get_link(h: &Handle, name: &str) -> Result<Option<LinkMessage>, rtnetlink::Error> {
    match h
        .link()
        .get()
        .match_name(name.to_string())
        .execute()
        .try_next()
        .await
    {
        Ok(m) => Ok(m),
        Err(e) if errno(&e) == Some(ENODEV) => Ok(None),
        Err(e) => Err(e),
    }
}

async fn add_addr(h: &Handle, index: u32, a: &IpNet) -> Result<(), rtnetlink::Error> {
    let mut req = h.address().add(index, a.addr(), a.prefix_len());
    if a.addr().is_ipv6() {
        // No duplicate address detection: the IPAM hands each address to one interface on
        // this bridge, and DAD would keep it tentative (unusable) for about a second after
        // ADD returns. Also set in the IFA_FLAGS attribute, which the kernel prefers.
        req.message_mut().header.flags |= AddressHeaderFlags::Nodad;
        req.message_mut()
            .attributes
            .push(AddressAttribute::Flags(AddressFlags::Nodad));
    }
    match req.execute().await {
        Err(e) if errno(&e) == Some(EEXIST) => Ok(()),
        r => r,
    }
}

async fn add_route(h: &Handle, index: u32, r: &Route) -> Result<(), CniError> {
    let mut b = RouteMessageBuilder::<IpAddr>::new()
        .destination_prefix(r.dst.addr(), r.dst.prefix_len())
        .map_err(|e| CniError::InvalidConfig(format!("route {}: {e}", r.dst)))?
        .output_interface(index);
    if let Some(gw) = r.gw {
        b = b
            .gateway(gw)
            .map_err(|e| CniError::InvalidConfig(format!("route {} via {gw}: {e}", r.dst)))?;
    }
    match h.route().add(b.build()).execute().await {
        Err(e) if errno(&e) == Some(EEXIST) => Ok(()),
        r2 => r2.map_err(|e| nl(format!("add route {} in container", r.dst), e)),
    }
}

/// The real dataplane: rtnetlink on a current-thread tokio runtime.
pub struct Netlink {
    rt: tokio::runtime::Runtime,
    host: Handle,
    /// `/proc/sys` (for forwarding sysctls), passed in so it is visible where it is used.
    proc_sys: PathBuf,
    /// The iptables binaries for ipMasq.
    iptables: Iptables,
}

fn open_netns(path: &str) -> Result<File, CniError> {
    File::open(path).map_err(|e| CniError::InvalidEnv {
        name: "CNI_NETNS".into(),
        reason: format!("cannot open network namespace {path:?}: {e}"),
    })
}

impl Netlink {
    /// Opens a netlink socket in the current (node) namespace.
    pub fn new(proc_sys: PathBuf) -> Result<Netlink, CniError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| CniError::io("start tokio runtime", e))?;
        let host = {
            let _g = rt.enter();
            let (conn, handle, _) =
                rtnetlink::new_connection().map_err(|e| CniError::io("open netlink socket", e))?;
            rt.spawn(conn);
            handle
        };
        Ok(Netlink {
            rt,
            host,
            proc_sys,
            iptables: Iptables::default(),
        })
    }

    /// A netlink handle bound to the namespace behind `ns`.
    fn handle_in(&self, ns: &File, path: &str) -> Result<Handle, CniError> {
        let orig = File::open("/proc/thread-self/ns/net")
            .map_err(|e| CniError::io("open /proc/thread-self/ns/net", e))?;
        nix::sched::setns(ns, CloneFlags::CLONE_NEWNET).map_err(|e| CniError::InvalidEnv {
            name: "CNI_NETNS".into(),
            reason: format!("{path:?} is not a network namespace: {e}"),
        })?;
        let conn = {
            let _g = self.rt.enter();
            rtnetlink::new_connection()
        };
        // Always return to the node namespace before anything else.
        nix::sched::setns(&orig, CloneFlags::CLONE_NEWNET).map_err(|e| {
            CniError::io("return to the node network namespace", io::Error::from(e))
        })?;
        let (conn, handle, _) =
            conn.map_err(|e| CniError::io(format!("open netlink socket in {path}"), e))?;
        self.rt.spawn(conn);
        Ok(handle)
    }

    /// A netlink handle inside `netns`; `None` when the namespace is gone or is not (or no
    /// longer) a network namespace: nothing of ours can be inside then.
    fn container_handle(&self, netns: &str) -> Result<Option<Handle>, CniError> {
        let ns = match File::open(netns) {
            Ok(f) => f,
            Err(e) if e.raw_os_error() == Some(ENOENT) => return Ok(None),
            Err(e) => return Err(CniError::io(format!("open network namespace {netns}"), e)),
        };
        match self.handle_in(&ns, netns) {
            Ok(h) => Ok(Some(h)),
            Err(CniError::InvalidEnv { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The container end of DEL: removes every address of `ifname` in `netns`. Returns
    /// whether the link exists (a missing namespace or link has nothing to remove).
    fn strip_container_link(&self, netns: &str, ifname: &str) -> Result<bool, CniError> {
        let Some(cont) = self.container_handle(netns)? else {
            return Ok(false);
        };
        self.rt.block_on(async {
            let Some(link) = get_link(&cont, ifname)
                .await
                .map_err(|e| nl(format!("get {ifname} in container"), e))?
            else {
                return Ok(false);
            };
            let mut dump = cont
                .address()
                .get()
                .set_link_index_filter(link.header.index)
                .execute();
            let mut addrs = Vec::new();
            while let Some(a) = dump
                .try_next()
                .await
                .map_err(|e| nl(format!("list addresses of {ifname} in container"), e))?
            {
                addrs.push(a);
            }
            for a in addrs {
                match cont.address().del(a).execute().await {
                    Err(e) if !matches!(errno(&e), Some(EADDRNOTAVAIL | ENODEV)) => {
                        return Err(nl(format!("remove an address of {ifname} in container"), e))
                    }
                    _ => {}
                }
            }
            Ok(true)
        })
    }

    /// Deletes the node-namespace link `index` if it is still named `name` (so a reused
    /// index is never touched); success when it is gone.
    pub fn reap_link(&self, index: u32, name: &str) -> Result<(), CniError> {
        let h = self.host.clone();
        self.rt.block_on(async {
            let link = match h.link().get().match_index(index).execute().try_next().await {
                Ok(Some(l)) => l,
                Ok(None) => return Ok(()),
                Err(e) if errno(&e) == Some(ENODEV) => return Ok(()),
                Err(e) => return Err(nl(format!("get link {index}"), e)),
            };
            let named = link
                .attributes
                .iter()
                .any(|a| matches!(a, LinkAttribute::IfName(n) if n == name));
            if !named {
                return Ok(());
            }
            match h.link().del(index).execute().await {
                Err(e) if errno(&e) != Some(ENODEV) => Err(nl(format!("delete link {name}"), e)),
                _ => Ok(()),
            }
        })
    }

    /// Starts the detached child that runs [`Netlink::reap_link`] (this binary with
    /// [`REAP_ARG`]); deletes the link itself when the child cannot be started.
    fn delete_later(&self, index: u32, name: &str) -> Result<(), CniError> {
        let spawned = std::process::Command::new("/proc/self/exe")
            .args([REAP_ARG, &index.to_string(), name])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn();
        match spawned {
            // Not waited for: the child outlives this process and is reaped by init.
            Ok(_child) => Ok(()),
            Err(_) => self.reap_link(index, name),
        }
    }

    async fn configure_veth(
        &self,
        spec: &VethSpec,
        bridge: u32,
        ns: &File,
        cont: &Handle,
    ) -> Result<(LinkInfo, LinkInfo), CniError> {
        let h = &self.host;
        let ctx = |what: &str| format!("{what} {}", spec.host_name);
        // One message creates the pair: the peer directly inside the container namespace
        // under its final name (moving a link between namespaces afterwards costs the kernel
        // a network-wide synchronisation, ~20 ms here), the host end up and on the bridge,
        // both MACs chosen here so the host end needs no read-back.
        let host_mac = random_mac();
        let peer_mac = random_mac();
        let msg = veth_message(spec, bridge, ns, &host_mac, &peer_mac);
        if let Err(e) = h.link().add(msg).execute().await {
            // A stale pair of the same attachment (a repeated ADD) is replaced; any other
            // failure (the container name is taken, ...) is the answer.
            let stale = match errno(&e) {
                Some(EEXIST) => get_link(h, &spec.host_name)
                    .await
                    .map_err(|e| nl(ctx("get stale veth"), e))?,
                _ => None,
            };
            let Some(old) = stale else {
                return Err(nl(ctx("create veth"), e));
            };
            match h.link().del(old.header.index).execute().await {
                Err(e) if errno(&e) != Some(ENODEV) => return Err(nl(ctx("delete stale veth"), e)),
                _ => {}
            }
            h.link()
                .add(veth_message(spec, bridge, ns, &host_mac, &peer_mac))
                .execute()
                .await
                .map_err(|e| nl(ctx("create veth"), e))?;
        }
        let mut host_index = 0;
        if spec.hairpin {
            host_index = get_link(h, &spec.host_name)
                .await
                .map_err(|e| nl(ctx("get veth"), e))?
                .ok_or_else(|| CniError::io(ctx("get veth"), io::Error::from_raw_os_error(ENODEV)))?
                .header
                .index;
            h.link()
                .set_port(LinkBridgePort::new(host_index).hairpin(true).build())
                .execute()
                .await
                .map_err(|e| nl(ctx("set hairpin on"), e))?;
        }
        // Inside the container: the peer's index, for its address and routes.
        let cpeer = get_link(cont, &spec.ifname)
            .await
            .map_err(|e| nl("find veth peer in container", e))?
            .ok_or_else(|| {
                CniError::io(
                    "find veth peer in container",
                    io::Error::from_raw_os_error(ENODEV),
                )
            })?;
        let cidx = cpeer.header.index;
        cont.link()
            .set(LinkUnspec::new_with_index(cidx).up().build())
            .execute()
            .await
            .map_err(|e| nl(format!("bring up {} in container", spec.ifname), e))?;
        // lo has index 1 in every network namespace.
        cont.link()
            .set(LinkUnspec::new_with_index(LOOPBACK_INDEX).up().build())
            .execute()
            .await
            .map_err(|e| nl("bring up lo in container", e))?;
        for a in &spec.addresses {
            add_addr(cont, cidx, a)
                .await
                .map_err(|e| nl(format!("add address {a} in container"), e))?;
        }
        for r in &spec.routes {
            add_route(cont, cidx, r).await?;
        }
        Ok((
            LinkInfo {
                index: host_index,
                mac: Some(mac_string(&host_mac)),
            },
            LinkInfo {
                index: cidx,
                mac: mac_of(&cpeer).or(Some(mac_string(&peer_mac))),
            },
        ))
    }
}

/// The index of `lo` in every network namespace (the kernel's `LOOPBACK_IFINDEX`).
const LOOPBACK_INDEX: u32 = 1;

/// A random unicast, locally administered MAC, as the kernel picks for a veth.
fn random_mac() -> [u8; 6] {
    let mut mac: [u8; 6] = rand::random();
    mac[0] = (mac[0] & 0xfe) | 0x02;
    mac
}

fn mac_string(mac: &[u8]) -> String {
    mac.iter()
        .map(|x| format!("{x:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// RTM_NEWLINK for the pair of `spec`: host end up, on `bridge`, with `host_mac`; the peer
/// created inside `ns`, up, with `peer_mac`.
fn veth_message(
    spec: &VethSpec,
    bridge: u32,
    ns: &File,
    host_mac: &[u8; 6],
    peer_mac: &[u8; 6],
) -> LinkMessage {
    use std::os::fd::AsRawFd;
    let mut veth = LinkVeth::new(&spec.host_name, &spec.ifname)
        .up()
        .controller(bridge)
        .address(host_mac.to_vec());
    if let Some(mtu) = spec.mtu {
        veth = veth.mtu(mtu);
    }
    let mut msg = veth.build();
    for attr in msg.attributes.iter_mut() {
        if let LinkAttribute::LinkInfo(infos) = attr {
            for info in infos.iter_mut() {
                if let NlLinkInfo::Data(InfoData::Veth(InfoVeth::Peer(peer))) = info {
                    // Not up here: the kernel opens the peer before the pair is joined and
                    // refuses (ENOTCONN).
                    peer.attributes.push(LinkAttribute::NetNsFd(ns.as_raw_fd()));
                    peer.attributes
                        .push(LinkAttribute::Address(peer_mac.to_vec()));
                    if let Some(mtu) = spec.mtu {
                        peer.attributes.push(LinkAttribute::Mtu(mtu));
                    }
                }
            }
        }
    }
    msg
}

impl Dataplane for Netlink {
    fn check_netns(&mut self, netns: &str) -> Result<(), CniError> {
        let f = open_netns(netns)?;
        self.handle_in(&f, netns).map(drop)
    }

    fn ensure_bridge(&mut self, spec: &BridgeSpec) -> Result<LinkInfo, CniError> {
        let h = self.host.clone();
        self.rt.block_on(async {
            let ctx = |what: &str| format!("{what} bridge {}", spec.name);
            let mut link = get_link(&h, &spec.name)
                .await
                .map_err(|e| nl(ctx("get"), e))?;
            if link.is_none() {
                match h
                    .link()
                    // A MAC of its own, so it does not follow its ports' lowest.
                    .add(
                        LinkBridge::new(&spec.name)
                            .address(random_mac().to_vec())
                            .build(),
                    )
                    .execute()
                    .await
                {
                    Err(e) if errno(&e) != Some(EEXIST) => return Err(nl(ctx("create"), e)),
                    _ => {}
                }
                link = get_link(&h, &spec.name)
                    .await
                    .map_err(|e| nl(ctx("get"), e))?;
            }
            let link = link
                .ok_or_else(|| CniError::io(ctx("find"), io::Error::from_raw_os_error(ENODEV)))?;
            let idx = link.header.index;
            // Set up only what differs (after the first ADD, nothing does).
            let flags = link.header.flags;
            let mtu_ok = spec.mtu.is_none_or(|m| {
                link.attributes
                    .iter()
                    .any(|a| matches!(a, LinkAttribute::Mtu(x) if *x == m))
            });
            let promisc_ok = !spec.promisc || flags.contains(LinkFlags::Promisc);
            if !(flags.contains(LinkFlags::Up) && mtu_ok && promisc_ok) {
                let mut set = LinkUnspec::new_with_index(idx).up();
                if let Some(mtu) = spec.mtu {
                    set = set.mtu(mtu);
                }
                if spec.promisc {
                    set = set.promiscuous(true);
                }
                h.link()
                    .set(set.build())
                    .execute()
                    .await
                    .map_err(|e| nl(ctx("bring up"), e))?;
            }
            for a in &spec.addresses {
                add_addr(&h, idx, a)
                    .await
                    .map_err(|e| nl(ctx(&format!("add address {a} to")), e))?;
            }
            Ok(LinkInfo {
                index: idx,
                mac: mac_of(&link),
            })
        })
    }

    fn enable_forwarding(&mut self, v4: bool, v6: bool) -> Result<(), CniError> {
        let mut paths = Vec::new();
        if v4 {
            paths.push(self.proc_sys.join("net/ipv4/ip_forward"));
        }
        if v6 {
            paths.push(self.proc_sys.join("net/ipv6/conf/all/forwarding"));
        }
        for p in paths {
            if std::fs::read_to_string(&p).is_ok_and(|v| v.trim() == "1") {
                continue;
            }
            std::fs::write(&p, "1")
                .map_err(|e| CniError::io(format!("write {}", p.display()), e))?;
        }
        Ok(())
    }

    fn create_veth(
        &mut self,
        spec: &VethSpec,
        bridge: u32,
    ) -> Result<(LinkInfo, LinkInfo), CniError> {
        let ns = open_netns(&spec.netns)?;
        let cont = self.handle_in(&ns, &spec.netns)?;
        self.rt
            .block_on(async { self.configure_veth(spec, bridge, &ns, &cont).await })
    }

    fn host_link(&mut self, name: &str) -> Result<Option<LinkInfo>, CniError> {
        let h = self.host.clone();
        self.rt.block_on(async {
            Ok(get_link(&h, name)
                .await
                .map_err(|e| nl(format!("get link {name}"), e))?
                .map(|l| LinkInfo {
                    index: l.header.index,
                    mac: mac_of(&l),
                }))
        })
    }

    fn delete_host_link(&mut self, name: &str) -> Result<bool, CniError> {
        let h = self.host.clone();
        self.rt.block_on(async {
            let Some(link) = get_link(&h, name)
                .await
                .map_err(|e| nl(format!("get link {name}"), e))?
            else {
                return Ok(false);
            };
            match h.link().del(link.header.index).execute().await {
                Ok(()) => Ok(true),
                Err(e) if errno(&e) == Some(ENODEV) => Ok(false),
                Err(e) => Err(nl(format!("delete link {name}"), e)),
            }
        })
    }

    fn container_link(
        &mut self,
        netns: &str,
        ifname: &str,
    ) -> Result<Option<ContainerLink>, CniError> {
        let ns = open_netns(netns)?;
        let cont = self.handle_in(&ns, netns)?;
        self.rt.block_on(async {
            let Some(link) = get_link(&cont, ifname)
                .await
                .map_err(|e| nl(format!("get {ifname} in container"), e))?
            else {
                return Ok(None);
            };
            let idx = link.header.index;
            let mut out = ContainerLink {
                mac: mac_of(&link),
                up: link.header.flags.contains(LinkFlags::Up),
                ..ContainerLink::default()
            };
            let mut addrs = cont.address().get().set_link_index_filter(idx).execute();
            while let Some(a) = addrs
                .try_next()
                .await
                .map_err(|e| nl(format!("list addresses of {ifname}"), e))?
            {
                if a.header.index != idx {
                    continue;
                }
                let ip = a.attributes.iter().find_map(|x| match x {
                    AddressAttribute::Address(ip) => Some(*ip),
                    _ => None,
                });
                if let Some(net) = ip.and_then(|ip| IpNet::new(ip, a.header.prefix_len).ok()) {
                    out.addresses.push(net);
                }
            }
            for query in [
                RouteMessageBuilder::<std::net::Ipv4Addr>::new().build(),
                RouteMessageBuilder::<std::net::Ipv6Addr>::new().build(),
            ] {
                let mut routes = cont.route().get(query).execute();
                while let Some(r) = routes
                    .try_next()
                    .await
                    .map_err(|e| nl(format!("list routes of {ifname}"), e))?
                {
                    if r.header.table != RouteHeader::RT_TABLE_MAIN {
                        continue;
                    }
                    let RouteParts { oif, dst, gw } = route_parts(&r);
                    if oif != Some(idx) {
                        continue;
                    }
                    let dst = dst.unwrap_or(match r.header.address_family {
                        AddressFamily::Inet6 => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
                        _ => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
                    });
                    if let Ok(net) = IpNet::new(dst, r.header.destination_prefix_length) {
                        out.routes.push((net, gw));
                    }
                }
            }
            Ok(Some(out))
        })
    }

    fn release_links(
        &mut self,
        netns: Option<&str>,
        ifname: &str,
        host: &str,
    ) -> Result<(), CniError> {
        let in_container = match netns {
            Some(ns) => self.strip_container_link(ns, ifname)?,
            None => false,
        };
        let h = self.host.clone();
        let host_link = self
            .rt
            .block_on(get_link(&h, host))
            .map_err(|e| nl(format!("get link {host}"), e))?;
        match (host_link, netns) {
            (Some(l), _) => self.delete_later(l.header.index, host),
            (None, Some(ns)) if in_container => self.delete_container_link(ns, ifname),
            _ => Ok(()),
        }
    }

    fn delete_container_link(&mut self, netns: &str, ifname: &str) -> Result<(), CniError> {
        let Some(cont) = self.container_handle(netns)? else {
            return Ok(());
        };
        self.rt.block_on(async {
            let Some(link) = get_link(&cont, ifname)
                .await
                .map_err(|e| nl(format!("get {ifname} in container"), e))?
            else {
                return Ok(());
            };
            match cont.link().del(link.header.index).execute().await {
                Ok(()) => Ok(()),
                Err(e) if errno(&e) == Some(ENODEV) => Ok(()),
                Err(e) => Err(nl(format!("delete {ifname} in container"), e)),
            }
        })
    }
    fn ensure_masq(&mut self, spec: &MasqSpec) -> Result<(), CniError> {
        self.iptables.ensure(spec)
    }
    fn remove_masq(&mut self, chain: &str, v6: bool) -> Result<(), CniError> {
        self.iptables.remove(chain, v6)
    }
    fn verify_masq(&mut self, spec: &MasqSpec) -> Result<(), CniError> {
        self.iptables.verify(spec)
    }
    fn gc_masq(
        &mut self,
        network: &str,
        keep: &[String],
        v6: bool,
    ) -> Result<Vec<String>, CniError> {
        self.iptables.gc(network, keep, v6)
    }
    fn gc_host_veths(&mut self, bridge: &str, keep: &[String]) -> Result<Vec<String>, CniError> {
        let h = self.host.clone();
        self.rt.block_on(async {
            let Some(br) = get_link(&h, bridge)
                .await
                .map_err(|e| nl(format!("get bridge {bridge}"), e))?
            else {
                return Ok(Vec::new());
            };
            let bidx = br.header.index;
            let mut stale = Vec::new();
            let mut links = h.link().get().execute();
            while let Some(l) = links.try_next().await.map_err(|e| nl("list links", e))? {
                let on_bridge = l
                    .attributes
                    .iter()
                    .any(|a| matches!(a, LinkAttribute::Controller(i) if *i == bidx));
                let name = l.attributes.iter().find_map(|a| match a {
                    LinkAttribute::IfName(n) => Some(n.clone()),
                    _ => None,
                });
                if let Some(name) = name {
                    if on_bridge && is_ferro_host_veth(&name) && !keep.contains(&name) {
                        stale.push((l.header.index, name));
                    }
                }
            }
            let mut removed = Vec::new();
            for (idx, name) in stale {
                match h.link().del(idx).execute().await {
                    Ok(()) => removed.push(name),
                    Err(e) if errno(&e) == Some(ENODEV) => {}
                    Err(e) => return Err(nl(format!("delete link {name}"), e)),
                }
            }
            Ok(removed)
        })
    }
}

/// Lets callers keep ownership of a dataplane (e.g. a recording fake) they pass to
/// [`crate::commands::run_with`].
impl<T: Dataplane + ?Sized> Dataplane for &mut T {
    fn check_netns(&mut self, netns: &str) -> Result<(), CniError> {
        (**self).check_netns(netns)
    }
    fn ensure_bridge(&mut self, spec: &BridgeSpec) -> Result<LinkInfo, CniError> {
        (**self).ensure_bridge(spec)
    }
    fn enable_forwarding(&mut self, v4: bool, v6: bool) -> Result<(), CniError> {
        (**self).enable_forwarding(v4, v6)
    }
    fn create_veth(
        &mut self,
        spec: &VethSpec,
        bridge: u32,
    ) -> Result<(LinkInfo, LinkInfo), CniError> {
        (**self).create_veth(spec, bridge)
    }
    fn host_link(&mut self, name: &str) -> Result<Option<LinkInfo>, CniError> {
        (**self).host_link(name)
    }
    fn delete_host_link(&mut self, name: &str) -> Result<bool, CniError> {
        (**self).delete_host_link(name)
    }
    fn delete_container_link(&mut self, netns: &str, ifname: &str) -> Result<(), CniError> {
        (**self).delete_container_link(netns, ifname)
    }
    fn release_links(
        &mut self,
        netns: Option<&str>,
        ifname: &str,
        host: &str,
    ) -> Result<(), CniError> {
        (**self).release_links(netns, ifname, host)
    }
    fn container_link(
        &mut self,
        netns: &str,
        ifname: &str,
    ) -> Result<Option<ContainerLink>, CniError> {
        (**self).container_link(netns, ifname)
    }
    fn ensure_masq(&mut self, spec: &MasqSpec) -> Result<(), CniError> {
        (**self).ensure_masq(spec)
    }
    fn remove_masq(&mut self, chain: &str, v6: bool) -> Result<(), CniError> {
        (**self).remove_masq(chain, v6)
    }
    fn verify_masq(&mut self, spec: &MasqSpec) -> Result<(), CniError> {
        (**self).verify_masq(spec)
    }
    fn gc_masq(
        &mut self,
        network: &str,
        keep: &[String],
        v6: bool,
    ) -> Result<Vec<String>, CniError> {
        (**self).gc_masq(network, keep, v6)
    }
    fn gc_host_veths(&mut self, bridge: &str, keep: &[String]) -> Result<Vec<String>, CniError> {
        (**self).gc_host_veths(bridge, keep)
    }
}
