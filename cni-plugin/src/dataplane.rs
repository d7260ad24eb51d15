//! The narrow executor bridge mode needs, and its real implementation over rtnetlink.
//!
//! The plugin runs in the node's network namespace. Work inside the container's namespace
//! goes through a second netlink socket opened while this thread is switched into that
//! namespace with `setns` (a socket stays bound to the namespace it was created in), so the
//! thread is back in the node namespace before any request is sent. Both are blocking
//! sockets ([`crate::nlsock`]): a CNI call is a short process with no use for a runtime.

use crate::netlink::{route_parts, RouteParts, EADDRNOTAVAIL, EEXIST, ENODEV, ENOENT};
use crate::nlsock::{NlError, NlSocket, Request};
use std::fs::File;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;

use ipnet::IpNet;
use netlink_packet_route::address::{
    AddressAttribute, AddressFlags, AddressHeaderFlags, AddressMessage,
};
use netlink_packet_route::link::{
    InfoData, InfoVeth, LinkAttribute, LinkFlags, LinkInfo as NlLinkInfo, LinkMessage,
};
use netlink_packet_route::route::RouteHeader;
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use nix::sched::CloneFlags;
use rtnetlink::packet_core::{NLM_F_CREATE, NLM_F_ECHO, NLM_F_EXCL};
use rtnetlink::{
    AddressMessageBuilder, LinkBridge, LinkBridgePort, LinkUnspec, LinkVeth, RouteMessageBuilder,
};

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

fn nl(context: impl Into<String>, e: NlError) -> CniError {
    CniError::io(context, e.into_io())
}

fn mac_of(msg: &LinkMessage) -> Option<String> {
    msg.attributes.iter().find_map(|a| match a {
        LinkAttribute::Address(b) if b.len() == 6 => Some(mac_string(b)),
        _ => None,
    })
}

/// Ok when the kernel answered "done" or "already exists".
fn exist_ok<T>(r: Result<T, NlError>) -> Result<(), NlError> {
    match r {
        Err(e) if e.errno() != Some(EEXIST) => Err(e),
        _ => Ok(()),
    }
}

/// RTM_NEWADDR of `a` on link `index`.
fn addr_request(index: u32, a: &IpNet) -> Request {
    let mut msg = match a.addr() {
        IpAddr::V4(ip) => AddressMessageBuilder::<Ipv4Addr>::new()
            .index(index)
            .address(ip, a.prefix_len())
            .build(),
        IpAddr::V6(ip) => AddressMessageBuilder::<Ipv6Addr>::new()
            .index(index)
            .address(ip, a.prefix_len())
            .build(),
    };
    if a.addr().is_ipv6() {
        // No duplicate address detection: the IPAM hands each address to one interface on
        // this bridge, and DAD would keep it tentative (unusable) for about a second after
        // ADD returns. Also set in the IFA_FLAGS attribute, which the kernel prefers.
        msg.header.flags |= AddressHeaderFlags::Nodad;
        msg.attributes
            .push(AddressAttribute::Flags(AddressFlags::Nodad));
    }
    Request::new(RouteNetlinkMessage::NewAddress(msg), NLM_F_CREATE | NLM_F_EXCL)
}

/// RTM_NEWROUTE of `r` out of link `index`.
fn route_request(index: u32, r: &Route) -> Result<Request, CniError> {
    let mut b = RouteMessageBuilder::<IpAddr>::new()
        .destination_prefix(r.dst.addr(), r.dst.prefix_len())
        .map_err(|e| CniError::InvalidConfig(format!("route {}: {e}", r.dst)))?
        .output_interface(index);
    if let Some(gw) = r.gw {
        b = b
            .gateway(gw)
            .map_err(|e| CniError::InvalidConfig(format!("route {} via {gw}: {e}", r.dst)))?;
    }
    Ok(Request::new(
        RouteNetlinkMessage::NewRoute(b.build()),
        NLM_F_CREATE | NLM_F_EXCL,
    ))
}

/// RTM_SETLINK bringing link `index` up.
fn up_request(index: u32) -> Request {
    Request::new(
        RouteNetlinkMessage::SetLink(LinkUnspec::new_with_index(index).up().build()),
        0,
    )
}

/// RTM_DELLINK of link `index`.
fn del_link(sock: &mut NlSocket, index: u32) -> Result<(), NlError> {
    let mut msg = LinkMessage::default();
    msg.header.index = index;
    sock.ack(RouteNetlinkMessage::DelLink(msg), 0)
}

/// The real dataplane: blocking rtnetlink sockets ([`NlSocket`]), one in the node namespace
/// and one in the container namespace of the call.
pub struct Netlink {
    host: NlSocket,
    /// The socket inside the container namespace (its path), opened once per call.
    container: Option<(String, NlSocket)>,
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

/// A netlink socket bound to the namespace behind `ns` (code 4 when it is not a network
/// namespace). The thread is back in its own namespace before this returns.
fn socket_in(ns: &File, path: &str) -> Result<NlSocket, CniError> {
    let orig = File::open("/proc/thread-self/ns/net")
        .map_err(|e| CniError::io("open /proc/thread-self/ns/net", e))?;
    nix::sched::setns(ns, CloneFlags::CLONE_NEWNET).map_err(|e| CniError::InvalidEnv {
        name: "CNI_NETNS".into(),
        reason: format!("{path:?} is not a network namespace: {e}"),
    })?;
    let sock = NlSocket::open();
    // Always return to the node namespace before anything else.
    nix::sched::setns(&orig, CloneFlags::CLONE_NEWNET)
        .map_err(|e| CniError::io("return to the node network namespace", io::Error::from(e)))?;
    sock.map_err(|e| CniError::io(format!("open netlink socket in {path}"), e))
}

impl Netlink {
    /// Opens a netlink socket in the current (node) namespace.
    pub fn new(proc_sys: PathBuf) -> Result<Netlink, CniError> {
        let host = NlSocket::open().map_err(|e| CniError::io("open netlink socket", e))?;
        Ok(Netlink {
            host,
            container: None,
            proc_sys,
            iptables: Iptables::default(),
        })
    }

    /// The socket inside the namespace behind `ns` (at `path`), opened on first use.
    fn container_socket(&mut self, ns: &File, path: &str) -> Result<&mut NlSocket, CniError> {
        let entry = match self.container.take() {
            Some((p, s)) if p == path => (p, s),
            _ => (path.to_string(), socket_in(ns, path)?),
        };
        let (_, sock) = self.container.insert(entry);
        Ok(sock)
    }

    /// The socket inside `netns`; `None` when the namespace is gone or is not (or no longer)
    /// a network namespace: nothing of ours can be inside then.
    fn container_if_any(&mut self, netns: &str) -> Result<Option<&mut NlSocket>, CniError> {
        let ns = match File::open(netns) {
            Ok(f) => f,
            Err(e) if e.raw_os_error() == Some(ENOENT) => return Ok(None),
            Err(e) => return Err(CniError::io(format!("open network namespace {netns}"), e)),
        };
        match self.container_socket(&ns, netns) {
            Ok(s) => Ok(Some(s)),
            Err(CniError::InvalidEnv { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The container end of DEL: removes every address of `ifname` in `netns`. Returns
    /// whether the link exists (a missing namespace or link has nothing to remove).
    fn strip_container_link(&mut self, netns: &str, ifname: &str) -> Result<bool, CniError> {
        let Some(cont) = self.container_if_any(netns)? else {
            return Ok(false);
        };
        let Some(link) = cont
            .link_by_name(ifname)
            .map_err(|e| nl(format!("get {ifname} in container"), e))?
        else {
            return Ok(false);
        };
        let idx = link.header.index;
        let dels: Vec<Request> = addresses_of(cont, idx)
            .map_err(|e| nl(format!("list addresses of {ifname} in container"), e))?
            .into_iter()
            .map(|a| Request::new(RouteNetlinkMessage::DelAddress(a), 0))
            .collect();
        if dels.is_empty() {
            return Ok(true);
        }
        let answers = cont
            .batch(dels)
            .map_err(|e| nl(format!("remove the addresses of {ifname} in container"), e))?;
        for answer in answers {
            match answer {
                Err(e) if !matches!(e.errno(), Some(EADDRNOTAVAIL | ENODEV)) => {
                    return Err(nl(format!("remove an address of {ifname} in container"), e))
                }
                _ => {}
            }
        }
        Ok(true)
    }

    /// Deletes the node-namespace link `index` if it is still named `name` (so a reused
    /// index is never touched); success when it is gone.
    pub fn reap_link(&mut self, index: u32, name: &str) -> Result<(), CniError> {
        let Some(link) = self
            .host
            .link_by_index(index)
            .map_err(|e| nl(format!("get link {index}"), e))?
        else {
            return Ok(());
        };
        let named = link
            .attributes
            .iter()
            .any(|a| matches!(a, LinkAttribute::IfName(n) if n == name));
        if !named {
            return Ok(());
        }
        match del_link(&mut self.host, index) {
            Err(e) if e.errno() != Some(ENODEV) => Err(nl(format!("delete link {name}"), e)),
            _ => Ok(()),
        }
    }

    /// Starts the detached child that runs [`Netlink::reap_link`] (this binary with
    /// [`REAP_ARG`]); deletes the link itself when the child cannot be started.
    fn delete_later(&mut self, index: u32, name: &str) -> Result<(), CniError> {
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
}

/// The addresses of link `index` (the kernel ignores the index of a dump request unless
/// strict checking is on, so they are filtered here).
fn addresses_of(sock: &mut NlSocket, index: u32) -> Result<Vec<AddressMessage>, NlError> {
    let mut query = AddressMessage::default();
    query.header.index = index;
    Ok(sock
        .dump(RouteNetlinkMessage::GetAddress(query))?
        .into_iter()
        .filter_map(|m| match m {
            RouteNetlinkMessage::NewAddress(a) if a.header.index == index => Some(a),
            _ => None,
        })
        .collect())
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
/// created inside `ns`, with `peer_mac`.
fn veth_message(
    spec: &VethSpec,
    bridge: u32,
    ns: &File,
    host_mac: &[u8; 6],
    peer_mac: &[u8; 6],
) -> RouteNetlinkMessage {
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
    RouteNetlinkMessage::NewLink(msg)
}

/// Creates the pair of `spec` in one message: the peer directly inside the container
/// namespace under its final name (moving a link between namespaces afterwards costs the
/// kernel a network-wide synchronisation, ~20 ms here), the host end up and on the bridge,
/// both MACs chosen here so nothing needs reading back. A stale pair of the same attachment
/// (a repeated ADD) is replaced; any other failure (the container name is taken, ...) is the
/// answer. Returns what the kernel echoed (`NLM_F_ECHO`, kernels since 6.3): the new host end.
fn create_pair(
    host: &mut NlSocket,
    spec: &VethSpec,
    bridge: u32,
    ns: &File,
    macs: (&[u8; 6], &[u8; 6]),
) -> Result<Option<LinkMessage>, CniError> {
    let ctx = |what: &str| format!("{what} {}", spec.host_name);
    let flags = NLM_F_CREATE | NLM_F_EXCL | NLM_F_ECHO;
    let create = |host: &mut NlSocket| host.request(veth_message(spec, bridge, ns, macs.0, macs.1), flags);
    let echoed = match create(host) {
        Ok(r) => r,
        Err(e) if e.errno() == Some(EEXIST) => {
            let Some(old) = host
                .link_by_name(&spec.host_name)
                .map_err(|e| nl(ctx("get stale veth"), e))?
            else {
                return Err(nl(ctx("create veth"), e));
            };
            match del_link(host, old.header.index) {
                Err(e) if e.errno() != Some(ENODEV) => return Err(nl(ctx("delete stale veth"), e)),
                _ => {}
            }
            create(host).map_err(|e| nl(ctx("create veth"), e))?
        }
        Err(e) => return Err(nl(ctx("create veth"), e)),
    };
    Ok(echoed.into_iter().find_map(|m| match m {
        RouteNetlinkMessage::NewLink(l)
            if l.attributes
                .iter()
                .any(|a| matches!(a, LinkAttribute::IfName(n) if *n == spec.host_name)) =>
        {
            Some(l)
        }
        _ => None,
    }))
}

impl Dataplane for Netlink {
    fn check_netns(&mut self, netns: &str) -> Result<(), CniError> {
        let f = open_netns(netns)?;
        self.container_socket(&f, netns).map(drop)
    }

    fn ensure_bridge(&mut self, spec: &BridgeSpec) -> Result<LinkInfo, CniError> {
        let h = &mut self.host;
        let ctx = |what: &str| format!("{what} bridge {}", spec.name);
        let mut link = h.link_by_name(&spec.name).map_err(|e| nl(ctx("get"), e))?;
        if link.is_none() {
            // A MAC of its own, so it does not follow its ports' lowest.
            let create = LinkBridge::new(&spec.name)
                .address(random_mac().to_vec())
                .build();
            exist_ok(h.ack(
                RouteNetlinkMessage::NewLink(create),
                NLM_F_CREATE | NLM_F_EXCL,
            ))
            .map_err(|e| nl(ctx("create"), e))?;
            link = h.link_by_name(&spec.name).map_err(|e| nl(ctx("get"), e))?;
        }
        let link =
            link.ok_or_else(|| CniError::io(ctx("find"), io::Error::from_raw_os_error(ENODEV)))?;
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
            h.ack(RouteNetlinkMessage::SetLink(set.build()), 0)
                .map_err(|e| nl(ctx("bring up"), e))?;
        }
        if !spec.addresses.is_empty() {
            let answers = h
                .batch(spec.addresses.iter().map(|a| addr_request(idx, a)).collect())
                .map_err(|e| nl(ctx("add addresses to"), e))?;
            for (a, answer) in spec.addresses.iter().zip(answers) {
                exist_ok(answer).map_err(|e| nl(ctx(&format!("add address {a} to")), e))?;
            }
        }
        Ok(LinkInfo {
            index: idx,
            mac: mac_of(&link),
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
        // The container's socket first: a namespace that is none fails before anything exists.
        self.container_socket(&ns, &spec.netns)?;
        let ctx = |what: &str| format!("{what} {}", spec.host_name);
        let host_mac = random_mac();
        let peer_mac = random_mac();
        let echo = create_pair(&mut self.host, spec, bridge, &ns, (&host_mac, &peer_mac))?;
        // The echo carries the host end's index and, as IFLA_LINK, its peer's index inside
        // the container; older kernels echo nothing and both are read back.
        let mut host_index = echo.as_ref().map_or(0, |l| l.header.index);
        let peer_index = echo.as_ref().and_then(|l| {
            l.attributes.iter().find_map(|a| match a {
                LinkAttribute::Link(i) => Some(*i),
                _ => None,
            })
        });
        if spec.hairpin {
            if host_index == 0 {
                host_index = self
                    .host
                    .link_by_name(&spec.host_name)
                    .map_err(|e| nl(ctx("get veth"), e))?
                    .ok_or_else(|| {
                        CniError::io(ctx("get veth"), io::Error::from_raw_os_error(ENODEV))
                    })?
                    .header
                    .index;
            }
            self.host
                .ack(
                    RouteNetlinkMessage::NewLink(
                        LinkBridgePort::new(host_index).hairpin(true).build(),
                    ),
                    0,
                )
                .map_err(|e| nl(ctx("set hairpin on"), e))?;
        }
        let cont = self.container_socket(&ns, &spec.netns)?;
        let cidx = match peer_index {
            Some(i) => i,
            None => {
                cont.link_by_name(&spec.ifname)
                    .map_err(|e| nl("find veth peer in container", e))?
                    .ok_or_else(|| {
                        CniError::io(
                            "find veth peer in container",
                            io::Error::from_raw_os_error(ENODEV),
                        )
                    })?
                    .header
                    .index
            }
        };
        // Inside the container, in one datagram: the peer up, lo up (index 1 in every
        // namespace), the addresses, then the routes (which need the addresses).
        let mut reqs = vec![
            (up_request(cidx), format!("bring up {} in container", spec.ifname)),
            (up_request(LOOPBACK_INDEX), "bring up lo in container".to_string()),
        ];
        for a in &spec.addresses {
            reqs.push((addr_request(cidx, a), format!("add address {a} in container")));
        }
        for r in &spec.routes {
            reqs.push((route_request(cidx, r)?, format!("add route {} in container", r.dst)));
        }
        let (reqs, what): (Vec<Request>, Vec<String>) = reqs.into_iter().unzip();
        let answers = cont
            .batch(reqs)
            .map_err(|e| nl(format!("configure {} in container", spec.ifname), e))?;
        for (answer, what) in answers.into_iter().zip(what) {
            exist_ok(answer).map_err(|e| nl(what, e))?;
        }
        Ok((
            LinkInfo {
                index: host_index,
                mac: Some(mac_string(&host_mac)),
            },
            LinkInfo {
                index: cidx,
                mac: Some(mac_string(&peer_mac)),
            },
        ))
    }

    fn host_link(&mut self, name: &str) -> Result<Option<LinkInfo>, CniError> {
        Ok(self
            .host
            .link_by_name(name)
            .map_err(|e| nl(format!("get link {name}"), e))?
            .map(|l| LinkInfo {
                index: l.header.index,
                mac: mac_of(&l),
            }))
    }

    fn delete_host_link(&mut self, name: &str) -> Result<bool, CniError> {
        let Some(link) = self
            .host
            .link_by_name(name)
            .map_err(|e| nl(format!("get link {name}"), e))?
        else {
            return Ok(false);
        };
        match del_link(&mut self.host, link.header.index) {
            Ok(()) => Ok(true),
            Err(e) if e.errno() == Some(ENODEV) => Ok(false),
            Err(e) => Err(nl(format!("delete link {name}"), e)),
        }
    }

    fn container_link(
        &mut self,
        netns: &str,
        ifname: &str,
    ) -> Result<Option<ContainerLink>, CniError> {
        let ns = open_netns(netns)?;
        let cont = self.container_socket(&ns, netns)?;
        let Some(link) = cont
            .link_by_name(ifname)
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
        for a in addresses_of(cont, idx).map_err(|e| nl(format!("list addresses of {ifname}"), e))? {
            let ip = a.attributes.iter().find_map(|x| match x {
                AddressAttribute::Address(ip) => Some(*ip),
                _ => None,
            });
            if let Some(net) = ip.and_then(|ip| IpNet::new(ip, a.header.prefix_len).ok()) {
                out.addresses.push(net);
            }
        }
        for query in [
            RouteMessageBuilder::<Ipv4Addr>::new().build(),
            RouteMessageBuilder::<Ipv6Addr>::new().build(),
        ] {
            let routes = cont
                .dump(RouteNetlinkMessage::GetRoute(query))
                .map_err(|e| nl(format!("list routes of {ifname}"), e))?;
            for r in routes {
                let RouteNetlinkMessage::NewRoute(r) = r else {
                    continue;
                };
                if r.header.table != RouteHeader::RT_TABLE_MAIN {
                    continue;
                }
                let RouteParts { oif, dst, gw } = route_parts(&r);
                if oif != Some(idx) {
                    continue;
                }
                let dst = dst.unwrap_or(match r.header.address_family {
                    AddressFamily::Inet6 => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
                    _ => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                });
                if let Ok(net) = IpNet::new(dst, r.header.destination_prefix_length) {
                    out.routes.push((net, gw));
                }
            }
        }
        Ok(Some(out))
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
        let host_link = self
            .host
            .link_by_name(host)
            .map_err(|e| nl(format!("get link {host}"), e))?;
        match (host_link, netns) {
            (Some(l), _) => self.delete_later(l.header.index, host),
            (None, Some(ns)) if in_container => self.delete_container_link(ns, ifname),
            _ => Ok(()),
        }
    }

    fn delete_container_link(&mut self, netns: &str, ifname: &str) -> Result<(), CniError> {
        let Some(cont) = self.container_if_any(netns)? else {
            return Ok(());
        };
        let Some(link) = cont
            .link_by_name(ifname)
            .map_err(|e| nl(format!("get {ifname} in container"), e))?
        else {
            return Ok(());
        };
        match del_link(cont, link.header.index) {
            Ok(()) => Ok(()),
            Err(e) if e.errno() == Some(ENODEV) => Ok(()),
            Err(e) => Err(nl(format!("delete {ifname} in container"), e)),
        }
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
        let h = &mut self.host;
        let Some(br) = h
            .link_by_name(bridge)
            .map_err(|e| nl(format!("get bridge {bridge}"), e))?
        else {
            return Ok(Vec::new());
        };
        let bidx = br.header.index;
        let mut stale = Vec::new();
        let links = h
            .dump(RouteNetlinkMessage::GetLink(LinkMessage::default()))
            .map_err(|e| nl("list links", e))?;
        for l in links {
            let RouteNetlinkMessage::NewLink(l) = l else {
                continue;
            };
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
            match del_link(h, idx) {
                Ok(()) => removed.push(name),
                Err(e) if e.errno() == Some(ENODEV) => {}
                Err(e) => return Err(nl(format!("delete link {name}"), e)),
            }
        }
        Ok(removed)
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
