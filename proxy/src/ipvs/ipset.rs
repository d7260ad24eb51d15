//! ipsets through nfnetlink (NETLINK_NETFILTER, subsystem NFNL_SUBSYS_IPSET), written by hand:
//! the messages `ipset create/add/del/swap/destroy` would send, without the `ipset` binary.
//!
//! Requests carry IPSET_ATTR_PROTOCOL 7 (kernels since 3.x answer 6 and 7). Without NLM_F_EXCL
//! the kernel treats "create an existing set", "add an existing entry" and "delete a missing
//! entry" as success, which is what a reconcile wants (`ipset -exist`). A set's type revision
//! is the highest the kernel has, asked with IPSET_CMD_TYPE as the ipset tool does.

use std::collections::BTreeSet;
use std::io;
use std::net::IpAddr;
use std::path::PathBuf;

use netlink_sys::protocols::NETLINK_NETFILTER;
use netlink_sys::Socket;

use super::plan::{SetEntry, SetKind};
use crate::error::IpvsError;
use crate::model::{Family, Protocol};
use crate::nl::{self, Msg, NLA_F_NET_BYTEORDER, NLM_F_ACK, NLM_F_CREATE, NLM_F_REQUEST};

const NFNL_SUBSYS_IPSET: u16 = 6;
pub const IPSET_PROTOCOL: u8 = 7;

const CMD_CREATE: u16 = 2;
const CMD_DESTROY: u16 = 3;
const CMD_SWAP: u16 = 6;
const CMD_ADD: u16 = 9;
const CMD_DEL: u16 = 10;
const CMD_TYPE: u16 = 13;

const ATTR_PROTOCOL: u16 = 1;
const ATTR_SETNAME: u16 = 2;
const ATTR_TYPENAME: u16 = 3;
const ATTR_SETNAME2: u16 = 3;
const ATTR_REVISION: u16 = 4;
const ATTR_FAMILY: u16 = 5;
const ATTR_DATA: u16 = 7;
// inside DATA
const ATTR_IP: u16 = 1;
const ATTR_PORT: u16 = 4;
const ATTR_PORT_TO: u16 = 5;
const ATTR_PROTO: u16 = 7;
const ATTR_IP2: u16 = 20;
const ATTR_CIDR2: u16 = 21;
const ATTR_IPADDR_IPV4: u16 = 1;
const ATTR_IPADDR_IPV6: u16 = 2;

const NFPROTO_IPV4: u8 = 2;
const NFPROTO_IPV6: u8 = 10;
/// The nfgenmsg of every ipset request (the set's own family travels in ATTR_FAMILY).
const NFGEN: [u8; 4] = [NFPROTO_IPV4, 0, 0, 0];

/// The longest set name the kernel takes (IPSET_MAXNAMELEN 32 with its NUL).
pub const MAX_NAME: usize = 31;

fn nfproto(family: Family) -> u8 {
    match family {
        Family::V4 => NFPROTO_IPV4,
        Family::V6 => NFPROTO_IPV6,
    }
}

fn ipproto(p: Protocol) -> u8 {
    match p {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
    }
}

fn msg(cmd: u16, flags: u16, seq: u32) -> Msg {
    let mut m = Msg::new((NFNL_SUBSYS_IPSET << 8) | cmd, NLM_F_REQUEST | NLM_F_ACK | flags, seq, &NFGEN);
    m.u8(ATTR_PROTOCOL, IPSET_PROTOCOL);
    m
}

fn ip_attr(m: &mut Msg, kind: u16, ip: &IpAddr) {
    m.nest(kind, |m| match ip {
        IpAddr::V4(v4) => {
            m.attr(ATTR_IPADDR_IPV4 | NLA_F_NET_BYTEORDER, &v4.octets());
        }
        IpAddr::V6(v6) => {
            m.attr(ATTR_IPADDR_IPV6 | NLA_F_NET_BYTEORDER, &v6.octets());
        }
    });
}

fn port_attr(m: &mut Msg, kind: u16, port: u16) {
    m.attr(kind | NLA_F_NET_BYTEORDER, &port.to_be_bytes());
}

/// IPSET_CMD_TYPE: which revisions of `kind` the kernel has.
pub fn type_request(kind: SetKind, family: Family, seq: u32) -> Vec<u8> {
    let mut m = msg(CMD_TYPE, 0, seq);
    m.str(ATTR_TYPENAME, kind.type_name()).u8(ATTR_FAMILY, nfproto(family));
    m.finish()
}

/// The highest revision in a CMD_TYPE answer body.
pub fn parse_type_answer(body: &[u8]) -> io::Result<u8> {
    let top = nl::attrs(body.get(4..).ok_or_else(|| nl::bad("nfgenmsg"))?)?;
    nl::find(&top, ATTR_REVISION)
        .and_then(|v| v.first().copied())
        .ok_or_else(|| nl::bad("type answer without a revision"))
}

/// IPSET_CMD_CREATE of `name` (idempotent: no NLM_F_EXCL).
pub fn create_request(name: &str, kind: SetKind, family: Family, revision: u8, seq: u32) -> Vec<u8> {
    let mut m = msg(CMD_CREATE, NLM_F_CREATE, seq);
    m.str(ATTR_SETNAME, name)
        .str(ATTR_TYPENAME, kind.type_name())
        .u8(ATTR_REVISION, revision)
        .u8(ATTR_FAMILY, nfproto(family));
    m.nest(ATTR_DATA, |m| {
        if kind == SetKind::Port {
            port_attr(m, ATTR_PORT, 0);
            port_attr(m, ATTR_PORT_TO, 65535);
        }
    });
    m.finish()
}

/// IPSET_CMD_ADD (`add`) or IPSET_CMD_DEL of one entry.
pub fn entry_request(name: &str, entry: &SetEntry, add: bool, seq: u32) -> Vec<u8> {
    let mut m = msg(if add { CMD_ADD } else { CMD_DEL }, 0, seq);
    m.str(ATTR_SETNAME, name);
    m.nest(ATTR_DATA, |m| match entry {
        SetEntry::Port(port) => port_attr(m, ATTR_PORT, *port),
        SetEntry::Ip(ip) => ip_attr(m, ATTR_IP, ip),
        SetEntry::IpPort(ip, proto, port) => {
            ip_attr(m, ATTR_IP, ip);
            port_attr(m, ATTR_PORT, *port);
            m.u8(ATTR_PROTO, ipproto(*proto));
        }
        SetEntry::IpPortIp(ip, proto, port, ip2) => {
            ip_attr(m, ATTR_IP, ip);
            port_attr(m, ATTR_PORT, *port);
            m.u8(ATTR_PROTO, ipproto(*proto));
            ip_attr(m, ATTR_IP2, ip2);
        }
        SetEntry::IpPortNet(ip, proto, port, net) => {
            ip_attr(m, ATTR_IP, ip);
            port_attr(m, ATTR_PORT, *port);
            m.u8(ATTR_PROTO, ipproto(*proto));
            ip_attr(m, ATTR_IP2, &net.network());
            m.u8(ATTR_CIDR2, net.prefix_len());
        }
    });
    m.finish()
}

/// IPSET_CMD_SWAP of two sets' contents (atomic for the rules matching them).
pub fn swap_request(a: &str, b: &str, seq: u32) -> Vec<u8> {
    let mut m = msg(CMD_SWAP, 0, seq);
    m.str(ATTR_SETNAME, a).str(ATTR_SETNAME2, b);
    m.finish()
}

/// IPSET_CMD_DESTROY of one set (refused by the kernel while a rule references it).
pub fn destroy_request(name: &str, seq: u32) -> Vec<u8> {
    let mut m = msg(CMD_DESTROY, 0, seq);
    m.str(ATTR_SETNAME, name);
    m.finish()
}

/// The kernel's ipsets in one network namespace.
pub struct Ipset {
    netns: Option<PathBuf>,
    sock: Option<Socket>,
    seq: u32,
    /// The kernel's revision per set type, asked once (a full sync creates every set twice).
    revisions: std::collections::BTreeMap<(SetKind, Family), u8>,
}

/// The kernel's message for an ipset errno (its private codes start at 4096).
fn errno_error(op: String, errno: i32) -> IpvsError {
    let source = match errno {
        4097 => io::Error::other("protocol error (kernel and request disagree on the ipset protocol)"),
        4098 => io::Error::other("set type not supported by this kernel"),
        4099 => io::Error::other("the kernel's limit of sets is reached"),
        4100 => io::Error::other("set is in use by a rule"),
        4102 => io::Error::other("the set exists with another type"),
        4103 => io::Error::other("the entry or set already exists"),
        e if e >= 4096 => io::Error::other(format!("ipset error {e}")),
        e => io::Error::from_raw_os_error(e),
    };
    IpvsError::Kernel { op, source }
}

impl Ipset {
    /// Works in the namespace at `netns` (e.g. /run/netns/NAME), or in this process's.
    pub fn new(netns: Option<PathBuf>) -> Ipset {
        Ipset {
            netns,
            sock: None,
            seq: 1,
            revisions: Default::default(),
        }
    }

    fn call(&mut self, op: impl FnOnce() -> String, build: impl FnOnce(u32) -> Vec<u8>) -> Result<Vec<Vec<u8>>, IpvsError> {
        if self.sock.is_none() {
            let s = nl::socket(NETLINK_NETFILTER, self.netns.as_deref())
                .map_err(|source| IpvsError::Socket { what: "ipset", source })?;
            self.sock = Some(s);
        }
        self.seq = self.seq.wrapping_add(1);
        let bytes = build(self.seq);
        let sock = self.sock.as_ref().ok_or(IpvsError::Socket {
            what: "ipset",
            source: io::Error::other("no socket"),
        })?;
        match nl::request(sock, &bytes) {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(errno)) => Err(errno_error(op(), errno)),
            Err(source) => {
                self.sock = None;
                Err(IpvsError::Kernel { op: op(), source })
            }
        }
    }

    /// The highest revision of `kind` this kernel has.
    pub fn revision(&mut self, kind: SetKind, family: Family) -> Result<u8, IpvsError> {
        if let Some(r) = self.revisions.get(&(kind, family)) {
            return Ok(*r);
        }
        let answer = self.call(|| format!("asking for ipset type {}", kind.type_name()), |seq| type_request(kind, family, seq))?;
        let body = answer.first().ok_or_else(|| IpvsError::Kernel {
            op: format!("asking for ipset type {}", kind.type_name()),
            source: nl::bad("no answer"),
        })?;
        let r = parse_type_answer(body).map_err(|source| IpvsError::Kernel {
            op: format!("asking for ipset type {}", kind.type_name()),
            source,
        })?;
        self.revisions.insert((kind, family), r);
        Ok(r)
    }

    pub fn create(&mut self, name: &str, kind: SetKind, family: Family) -> Result<(), IpvsError> {
        let rev = self.revision(kind, family)?;
        self.call(|| format!("create set {name} {}", kind.type_name()), |seq| create_request(name, kind, family, rev, seq))
            .map(|_| ())
    }

    pub fn add(&mut self, name: &str, entry: &SetEntry) -> Result<(), IpvsError> {
        self.call(|| format!("add {name} {entry}"), |seq| entry_request(name, entry, true, seq)).map(|_| ())
    }

    pub fn del(&mut self, name: &str, entry: &SetEntry) -> Result<(), IpvsError> {
        self.call(|| format!("del {name} {entry}"), |seq| entry_request(name, entry, false, seq)).map(|_| ())
    }

    pub fn swap(&mut self, a: &str, b: &str) -> Result<(), IpvsError> {
        self.call(|| format!("swap {a} {b}"), |seq| swap_request(a, b, seq)).map(|_| ())
    }

    /// Destroys `name`; a set that does not exist is not an error.
    pub fn destroy(&mut self, name: &str) -> Result<(), IpvsError> {
        match self.call(|| format!("destroy {name}"), |seq| destroy_request(name, seq)) {
            Ok(_) => Ok(()),
            Err(IpvsError::Kernel { source, .. }) if source.raw_os_error() == Some(2) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Makes `name` hold exactly `entries` in one step the rules see atomically: a scratch
    /// set is created and filled, swapped with `name` (created first if missing), destroyed.
    pub fn replace(&mut self, name: &str, kind: SetKind, family: Family, entries: &BTreeSet<SetEntry>) -> Result<(), IpvsError> {
        let scratch = scratch_name(name);
        self.destroy(&scratch)?;
        self.create(&scratch, kind, family)?;
        for e in entries {
            self.add(&scratch, e)?;
        }
        self.create(name, kind, family)?;
        self.swap(name, &scratch)?;
        self.destroy(&scratch)
    }
}

/// The scratch set of a full replacement: at most 31 bytes, distinct from every set name.
pub fn scratch_name(name: &str) -> String {
    let base: String = name.chars().take(MAX_NAME - 4).collect();
    format!("{base}-TMP")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn body(b: &[u8]) -> Vec<(u16, Vec<u8>)> {
        let msgs = nl::messages(b).unwrap();
        assert_eq!(msgs.len(), 1);
        assert_eq!(&msgs[0].2[..4], &NFGEN);
        nl::attrs(&msgs[0].2[4..]).unwrap().into_iter().map(|(k, v)| (k, v.to_vec())).collect()
    }

    #[test]
    fn create_names_type_revision_and_family_without_excl() {
        let b = create_request("KUBE-NODE-PORT-TCP", SetKind::Port, Family::V4, 3, 9);
        let msgs = nl::messages(&b).unwrap();
        assert_eq!(msgs[0].0, (6 << 8) | 2, "NFNL_SUBSYS_IPSET, IPSET_CMD_CREATE");
        assert_eq!(msgs[0].1 & nl::NLM_F_EXCL, 0, "no NLM_F_EXCL: an existing set is fine");
        let a = body(&b);
        assert_eq!(a[0], (ATTR_PROTOCOL, vec![7]));
        assert_eq!(a[1], (ATTR_SETNAME, b"KUBE-NODE-PORT-TCP\0".to_vec()));
        assert_eq!(a[2], (ATTR_TYPENAME, b"bitmap:port\0".to_vec()));
        assert_eq!(a[3], (ATTR_REVISION, vec![3]));
        assert_eq!(a[4], (ATTR_FAMILY, vec![NFPROTO_IPV4]));
        let data = nl::attrs(&a[5].1).unwrap();
        assert_eq!(data, [(ATTR_PORT, &[0u8, 0][..]), (ATTR_PORT_TO, &[0xff, 0xff][..])], "the whole port range");
    }

    #[test]
    fn entries_carry_addresses_ports_and_protocols_in_network_order() {
        let e = SetEntry::IpPortNet(
            "203.0.113.50".parse().unwrap(),
            Protocol::Udp,
            8080,
            "198.51.100.0/24".parse().unwrap(),
        );
        let a = body(&entry_request("KUBE-LOAD-BALANCER-SOURCE-CIDR", &e, true, 3));
        let data = nl::attrs(&a[2].1).unwrap();
        let kinds: Vec<u16> = data.iter().map(|d| d.0).collect();
        assert_eq!(kinds, [ATTR_IP, ATTR_PORT, ATTR_PROTO, ATTR_IP2, ATTR_CIDR2]);
        assert_eq!(nl::attrs(data[0].1).unwrap(), [(ATTR_IPADDR_IPV4, &[203u8, 0, 113, 50][..])]);
        assert_eq!(data[1].1, &8080u16.to_be_bytes());
        assert_eq!(data[2].1, &[17]);
        assert_eq!(nl::attrs(data[3].1).unwrap(), [(ATTR_IPADDR_IPV4, &[198u8, 51, 100, 0][..])]);
        assert_eq!(data[4].1, &[24]);
        // the raw flags: nested IPs, network byte order ports and addresses
        let raw = entry_request("S", &SetEntry::IpPort("fd00::1".parse().unwrap(), Protocol::Tcp, 80), false, 4);
        assert_eq!(nl::messages(&raw).unwrap()[0].0, (6 << 8) | 10, "IPSET_CMD_DEL");
        let pos = raw.windows(2).position(|w| w == (ATTR_IPADDR_IPV6 | NLA_F_NET_BYTEORDER).to_ne_bytes()).unwrap();
        assert_eq!(u16::from_ne_bytes([raw[pos - 2], raw[pos - 1]]), 20, "a 16-byte address");
    }

    #[test]
    fn scratch_names_fit_the_kernel() {
        assert_eq!(scratch_name("KUBE-CLUSTER-IP"), "KUBE-CLUSTER-IP-TMP");
        let long = scratch_name("KUBE-6-LOAD-BALANCER-SOURCE-CIDR");
        assert!(long.len() <= MAX_NAME && long.ends_with("-TMP"), "{long}");
    }
}
