//! The real executor: ctnetlink (NETLINK_NETFILTER, subsystem NFNL_SUBSYS_CTNETLINK), written
//! by hand like `nfcount.rs`. One deletion is
//!
//! 1. an `IPCTNL_MSG_CT_GET` dump that the kernel filters itself (`CTA_FILTER`, kernel 5.8+):
//!    protocol and original destination port always, original destination address and reply
//!    source address for IPv4. The answer is the handful of entries of that service port, not
//!    the whole table. Every entry is checked again here against the whole selection, so a
//!    kernel that ignores `CTA_FILTER` (older than 5.8: it dumps the family) or a `NotFrom`
//!    selection (which the kernel cannot express) still deletes exactly the right entries.
//!    IPv6 addresses are not given to the kernel's filter (kernel 6.18 refuses such a dump
//!    with EINVAL, and ctnetlink_filter_match_tuple compares them with `!ipv6_addr_cmp(...)`,
//!    which reads inverted), so they are matched here.
//! 2. an `IPCTNL_MSG_CT_DELETE` per selected entry with its exact original tuple as the dump
//!    gave it (and its `CTA_ID`, so an entry recreated meanwhile under the same tuple is not
//!    deleted by mistake; and its zone).

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr as IpPort};
use std::path::PathBuf;

use netlink_sys::{protocols::NETLINK_NETFILTER, Socket};

use super::{Conntrack, Flows, Reply};
use crate::error::ConntrackError;
use crate::model::{Family, Protocol};
use crate::nl::Msg;

const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_NEW: u16 = 0;
const IPCTNL_MSG_CT_GET: u16 = 1;
const IPCTNL_MSG_CT_DELETE: u16 = 2;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NLM_F_DUMP: u16 = 0x300;
const NLA_TYPE_MASK: u16 = 0x3fff;

const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_TIMEOUT: u16 = 7;
const CTA_ID: u16 = 12;
const CTA_ZONE: u16 = 18;
const CTA_FILTER: u16 = 25;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_SRC: u16 = 3;
const CTA_IP_V6_DST: u16 = 4;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;
const CTA_FILTER_ORIG_FLAGS: u16 = 1;
const CTA_FILTER_REPLY_FLAGS: u16 = 2;
// the kernel's CTA_FILTER_F_* bits (net/netfilter/nf_internals.h)
const F_IP_SRC: u32 = 1 << 0;
const F_IP_DST: u32 = 1 << 1;
const F_PROTO_NUM: u32 = 1 << 3;
const F_PROTO_DST_PORT: u32 = 1 << 5;

const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;
const ENOENT: i32 = 2;

fn af(family: Family) -> u8 {
    match family {
        Family::V4 => AF_INET,
        Family::V6 => AF_INET6,
    }
}

fn ipproto(p: Protocol) -> u8 {
    match p {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
    }
}

fn protocol_of(n: u8) -> Option<Protocol> {
    match n {
        6 => Some(Protocol::Tcp),
        17 => Some(Protocol::Udp),
        132 => Some(Protocol::Sctp),
        _ => None,
    }
}

/// A ctnetlink message under construction (nlmsghdr + nfgenmsg + attributes).
fn ct_msg(kind: u16, flags: u16, seq: u32, family: u8) -> Msg {
    // nfgenmsg: family, version NFNETLINK_V0, res_id
    Msg::new((NFNL_SUBSYS_CTNETLINK << 8) | kind, flags, seq, &[family, 0, 0, 0])
}

fn ip_bytes(ip: &IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(ip) => ip.octets().to_vec(),
        IpAddr::V6(ip) => ip.octets().to_vec(),
    }
}

/// The filtered dump request for `flows` (pure, for tests).
pub fn dump_request(flows: &Flows, seq: u32) -> Vec<u8> {
    let mut m = ct_msg(IPCTNL_MSG_CT_GET, NLM_F_REQUEST | NLM_F_DUMP, seq, af(flows.family));
    // Only IPv4 addresses go to the kernel's filter (see the module's notes on IPv6).
    let dst = flows.dst.filter(|d| d.is_ipv4());
    let reply_src = match &flows.reply {
        Reply::From(ip) if ip.is_ipv4() => Some(*ip),
        _ => None,
    };
    m.nest(CTA_TUPLE_ORIG, |m| {
        if let Some(dst) = &dst {
            m.nest(CTA_TUPLE_IP, |m| {
                m.attr(CTA_IP_V4_DST, &ip_bytes(dst));
            });
        }
        m.nest(CTA_TUPLE_PROTO, |m| {
            m.attr(CTA_PROTO_NUM, &[ipproto(flows.protocol)]);
            m.attr(CTA_PROTO_DST_PORT, &flows.dst_port.to_be_bytes());
        });
    });
    if let Some(src) = &reply_src {
        m.nest(CTA_TUPLE_REPLY, |m| {
            m.nest(CTA_TUPLE_IP, |m| {
                m.attr(CTA_IP_V4_SRC, &ip_bytes(src));
            });
        });
    }
    m.nest(CTA_FILTER, |m| {
        let orig = F_PROTO_NUM | F_PROTO_DST_PORT | if dst.is_some() { F_IP_DST } else { 0 };
        m.attr(CTA_FILTER_ORIG_FLAGS, &orig.to_ne_bytes());
        if reply_src.is_some() {
            m.attr(CTA_FILTER_REPLY_FLAGS, &F_IP_SRC.to_ne_bytes());
        }
    });
    m.finish()
}

/// The request that makes an entry with these tuples without any traffic (`conntrack -I`;
/// pure; the executor's lab test fills a table with it).
pub fn insert_request(
    protocol: Protocol,
    orig: (IpPort, IpPort),
    reply: (IpPort, IpPort),
    timeout: u32,
    seq: u32,
) -> Vec<u8> {
    let family = if orig.0.is_ipv4() { AF_INET } else { AF_INET6 };
    let flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL;
    let mut m = ct_msg(IPCTNL_MSG_CT_NEW, flags, seq, family);
    let tuple = |m: &mut Msg, (src, dst): (IpPort, IpPort)| {
        m.nest(CTA_TUPLE_IP, |m| {
            let (s, d) = if src.is_ipv4() {
                (CTA_IP_V4_SRC, CTA_IP_V4_DST)
            } else {
                (CTA_IP_V6_SRC, CTA_IP_V6_DST)
            };
            m.attr(s, &ip_bytes(&src.ip()));
            m.attr(d, &ip_bytes(&dst.ip()));
        });
        m.nest(CTA_TUPLE_PROTO, |m| {
            m.attr(CTA_PROTO_NUM, &[ipproto(protocol)]);
            m.attr(CTA_PROTO_SRC_PORT, &src.port().to_be_bytes());
            m.attr(CTA_PROTO_DST_PORT, &dst.port().to_be_bytes());
        });
    };
    m.nest(CTA_TUPLE_ORIG, |m| tuple(m, orig));
    m.nest(CTA_TUPLE_REPLY, |m| tuple(m, reply));
    m.attr(CTA_TIMEOUT, &timeout.to_be_bytes());
    m.finish()
}

/// One conntrack entry of a dump: what selection needs, and the attributes that name it
/// exactly for its deletion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub family: u8,
    pub protocol: u8,
    pub orig_dst: IpAddr,
    pub orig_dst_port: u16,
    pub reply_src: IpAddr,
    orig_raw: Vec<u8>,
    zone_raw: Option<Vec<u8>>,
    id_raw: Option<Vec<u8>>,
}

impl Entry {
    pub fn selected_by(&self, flows: &Flows) -> bool {
        self.family == af(flows.family)
            && protocol_of(self.protocol)
                .is_some_and(|p| flows.matches(p, self.orig_dst, self.orig_dst_port, self.reply_src))
    }
}

/// The deletion of one entry by its exact original tuple (pure, for tests).
pub fn delete_request(e: &Entry, seq: u32) -> Vec<u8> {
    let mut m = ct_msg(IPCTNL_MSG_CT_DELETE, NLM_F_REQUEST | NLM_F_ACK, seq, e.family);
    m.raw(&e.orig_raw);
    if let Some(z) = &e.zone_raw {
        m.raw(z);
    }
    if let Some(id) = &e.id_raw {
        m.raw(id);
    }
    m.finish()
}

fn bad(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("malformed ctnetlink message: {what}"),
    )
}

/// An attribute: (type without flags, payload, the whole attribute).
type Attr<'a> = (u16, &'a [u8], &'a [u8]);

/// The attributes in `b`.
fn attrs(mut b: &[u8]) -> io::Result<Vec<Attr<'_>>> {
    let mut out = Vec::new();
    while b.len() >= 4 {
        let len = u16::from_ne_bytes([b[0], b[1]]) as usize;
        let kind = u16::from_ne_bytes([b[2], b[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > b.len() {
            return Err(bad("attribute length"));
        }
        out.push((kind, &b[4..len], &b[..len]));
        let next = (len + 3) & !3;
        b = if next >= b.len() { &[] } else { &b[next..] };
    }
    Ok(out)
}

fn addr(kind: u16, v: &[u8]) -> io::Result<IpAddr> {
    match kind {
        CTA_IP_V4_SRC | CTA_IP_V4_DST => {
            let o: [u8; 4] = v.try_into().map_err(|_| bad("IPv4 address"))?;
            Ok(IpAddr::V4(Ipv4Addr::from(o)))
        }
        _ => {
            let o: [u8; 16] = v.try_into().map_err(|_| bad("IPv6 address"))?;
            Ok(IpAddr::V6(Ipv6Addr::from(o)))
        }
    }
}

/// The parts of a tuple selection looks at.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Tuple {
    src: Option<IpAddr>,
    dst: Option<IpAddr>,
    proto: Option<u8>,
    dst_port: Option<u16>,
}

fn tuple(payload: &[u8]) -> io::Result<Tuple> {
    let mut t = Tuple::default();
    for (kind, v, _) in attrs(payload)? {
        match kind {
            CTA_TUPLE_IP => {
                for (k, v, _) in attrs(v)? {
                    match k {
                        CTA_IP_V4_SRC | CTA_IP_V6_SRC => t.src = Some(addr(k, v)?),
                        CTA_IP_V4_DST | CTA_IP_V6_DST => t.dst = Some(addr(k, v)?),
                        _ => {}
                    }
                }
            }
            CTA_TUPLE_PROTO => {
                for (k, v, _) in attrs(v)? {
                    match k {
                        CTA_PROTO_NUM => t.proto = v.first().copied(),
                        CTA_PROTO_DST_PORT => {
                            t.dst_port = Some(u16::from_be_bytes(v.try_into().map_err(|_| bad("port"))?));
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Ok(t)
}

fn entry(family: u8, body: &[u8]) -> io::Result<Option<Entry>> {
    let (mut orig, mut reply) = (None, None);
    let (mut orig_raw, mut zone_raw, mut id_raw) = (None, None, None);
    for (kind, v, raw) in attrs(body)? {
        match kind {
            CTA_TUPLE_ORIG => {
                orig = Some(tuple(v)?);
                orig_raw = Some(raw.to_vec());
            }
            CTA_TUPLE_REPLY => reply = Some(tuple(v)?),
            CTA_ZONE => zone_raw = Some(raw.to_vec()),
            CTA_ID => id_raw = Some(raw.to_vec()),
            _ => {}
        }
    }
    let (Some(orig), Some(reply), Some(orig_raw)) = (orig, reply, orig_raw) else {
        return Ok(None);
    };
    let (Some(orig_dst), Some(protocol), Some(reply_src)) = (orig.dst, orig.proto, reply.src) else {
        return Ok(None);
    };
    let orig_dst_port = orig.dst_port.unwrap_or(0);
    Ok(Some(Entry {
        family,
        protocol,
        orig_dst,
        orig_dst_port,
        reply_src,
        orig_raw,
        zone_raw,
        id_raw,
    }))
}

/// What one datagram of an answer holds.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Part {
    pub entries: Vec<Entry>,
    /// The answer is complete: 0 (done, or acknowledged) or the kernel's errno.
    pub end: Option<i32>,
}

/// Parses one datagram (pure, for tests).
pub fn parse(buf: &[u8]) -> io::Result<Part> {
    let mut part = Part::default();
    let mut off = 0;
    while off + 16 <= buf.len() {
        let len = u32::from_ne_bytes([buf[off], buf[off + 1], buf[off + 2], buf[off + 3]]) as usize;
        let kind = u16::from_ne_bytes([buf[off + 4], buf[off + 5]]);
        if len < 16 || off + len > buf.len() {
            return Err(bad("message length"));
        }
        let body = &buf[off + 16..off + len];
        match kind {
            NLMSG_DONE => {
                part.end = Some(0);
                return Ok(part);
            }
            NLMSG_ERROR => {
                let e: [u8; 4] = body
                    .get(..4)
                    .and_then(|b| b.try_into().ok())
                    .ok_or_else(|| bad("error message"))?;
                part.end = Some(-i32::from_ne_bytes(e));
                return Ok(part);
            }
            k if k == (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_NEW => {
                let family = *body.first().ok_or_else(|| bad("nfgenmsg"))?;
                if body.len() >= 4 {
                    part.entries.extend(entry(family, &body[4..])?);
                }
            }
            _ => {}
        }
        off += (len + 3) & !3;
    }
    Ok(part)
}

/// The real executor: a NETLINK_NETFILTER socket in this process's network namespace, or in
/// the one at `netns` (tests: the socket is opened on a thread that entered it).
pub struct Ctnetlink {
    seq: u32,
    netns: Option<PathBuf>,
}

impl Ctnetlink {
    pub fn new() -> Ctnetlink {
        Ctnetlink { seq: 1, netns: None }
    }

    /// Works in the namespace at `path` (e.g. /run/netns/NAME) instead of this process's.
    pub fn in_namespace(path: impl Into<PathBuf>) -> Ctnetlink {
        Ctnetlink {
            seq: 1,
            netns: Some(path.into()),
        }
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    fn socket(&self) -> io::Result<Socket> {
        crate::nl::socket(NETLINK_NETFILTER, self.netns.as_deref())
    }

    /// The entries `flows` selects (what [`Conntrack::delete`] would delete).
    pub fn entries(&mut self, flows: &Flows) -> Result<Vec<Entry>, ConntrackError> {
        let sock = self.socket().map_err(ConntrackError::Socket)?;
        let mut buf = vec![0u8; 64 * 1024];
        self.list(&sock, flows, &mut buf).map_err(ConntrackError::Dump)
    }

    /// Makes an entry without traffic (see [`insert_request`]).
    pub fn insert(
        &mut self,
        protocol: Protocol,
        orig: (IpPort, IpPort),
        reply: (IpPort, IpPort),
        timeout: u32,
    ) -> Result<(), ConntrackError> {
        let sock = self.socket().map_err(ConntrackError::Socket)?;
        let seq = self.next_seq();
        sock.send(&insert_request(protocol, orig, reply, timeout, seq), 0)
            .map_err(ConntrackError::Insert)?;
        let mut buf = vec![0u8; 4096];
        loop {
            let n = sock.recv(&mut &mut buf[..], 0).map_err(ConntrackError::Insert)?;
            match parse(&buf[..n]).map_err(ConntrackError::Insert)?.end {
                None => {}
                Some(0) => return Ok(()),
                Some(errno) => return Err(ConntrackError::Insert(io::Error::from_raw_os_error(errno))),
            }
        }
    }

    /// The selected entries of a filtered dump.
    fn list(&mut self, sock: &Socket, flows: &Flows, buf: &mut [u8]) -> io::Result<Vec<Entry>> {
        let seq = self.next_seq();
        sock.send(&dump_request(flows, seq), 0)?;
        let mut out = Vec::new();
        loop {
            let n = sock.recv(&mut &mut buf[..], 0)?;
            let part = parse(&buf[..n])?;
            out.extend(part.entries.into_iter().filter(|e| e.selected_by(flows)));
            match part.end {
                None => {}
                Some(0) => return Ok(out),
                Some(errno) => return Err(io::Error::from_raw_os_error(errno)),
            }
        }
    }

    /// Deletes one entry; false when it was already gone.
    fn remove(&mut self, sock: &Socket, e: &Entry, buf: &mut [u8]) -> io::Result<bool> {
        let seq = self.next_seq();
        sock.send(&delete_request(e, seq), 0)?;
        loop {
            let n = sock.recv(&mut &mut buf[..], 0)?;
            match parse(&buf[..n])?.end {
                None => {}
                Some(0) => return Ok(true),
                Some(ENOENT) => return Ok(false),
                Some(errno) => return Err(io::Error::from_raw_os_error(errno)),
            }
        }
    }
}

impl Default for Ctnetlink {
    fn default() -> Self {
        Ctnetlink::new()
    }
}

impl Conntrack for Ctnetlink {
    fn delete(&mut self, flows: &Flows) -> Result<usize, ConntrackError> {
        let sock = self.socket().map_err(ConntrackError::Socket)?;
        let mut buf = vec![0u8; 64 * 1024];
        let stale = self.list(&sock, flows, &mut buf).map_err(ConntrackError::Dump)?;
        let mut deleted = 0;
        for e in &stale {
            if self.remove(&sock, e, &mut buf).map_err(ConntrackError::Delete)? {
                deleted += 1;
            }
        }
        Ok(deleted)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn u16_at(b: &[u8], at: usize) -> u16 {
        u16::from_ne_bytes([b[at], b[at + 1]])
    }

    #[test]
    fn dump_request_asks_the_kernel_to_filter_ipv4() {
        let f = Flows {
            family: Family::V4,
            protocol: Protocol::Udp,
            dst: Some(ip("10.96.0.10")),
            dst_port: 53,
            reply: Reply::From(ip("10.244.0.5")),
        };
        let b = dump_request(&f, 9);
        assert_eq!(u32::from_ne_bytes(b[..4].try_into().unwrap()) as usize, b.len());
        assert_eq!(u16_at(&b, 4), 0x0101, "ctnetlink GET");
        assert_eq!(u16_at(&b, 6), 0x301, "request + dump");
        assert_eq!(b[16], AF_INET);
        let top = attrs(&b[20..]).unwrap();
        let kinds: Vec<u16> = top.iter().map(|a| a.0).collect();
        assert_eq!(kinds, [CTA_TUPLE_ORIG, CTA_TUPLE_REPLY, CTA_FILTER]);
        assert!(
            top.iter().all(|a| u16_at(a.2, 2) & crate::nl::NLA_F_NESTED != 0),
            "nested attributes say so"
        );
        let t = tuple(top[0].1).unwrap();
        assert_eq!(
            t,
            Tuple {
                src: None,
                dst: Some(ip("10.96.0.10")),
                proto: Some(17),
                dst_port: Some(53)
            }
        );
        assert_eq!(tuple(top[1].1).unwrap().src, Some(ip("10.244.0.5")));
        let filter = attrs(top[2].1).unwrap();
        assert_eq!(filter[0].0, CTA_FILTER_ORIG_FLAGS);
        assert_eq!(
            u32::from_ne_bytes(filter[0].1.try_into().unwrap()),
            F_PROTO_NUM | F_PROTO_DST_PORT | F_IP_DST
        );
        assert_eq!(filter[1].0, CTA_FILTER_REPLY_FLAGS);
        assert_eq!(u32::from_ne_bytes(filter[1].1.try_into().unwrap()), F_IP_SRC);
    }

    #[test]
    fn ipv6_and_not_from_are_filtered_by_port_only() {
        let f = Flows {
            family: Family::V6,
            protocol: Protocol::Udp,
            dst: Some(ip("fd00::10")),
            dst_port: 53,
            reply: Reply::From(ip("fd00::5")),
        };
        let b = dump_request(&f, 1);
        assert_eq!(b[16], AF_INET6);
        let top = attrs(&b[20..]).unwrap();
        assert_eq!(
            top.iter().map(|a| a.0).collect::<Vec<_>>(),
            [CTA_TUPLE_ORIG, CTA_FILTER]
        );
        assert_eq!(
            tuple(top[0].1).unwrap(),
            Tuple {
                src: None,
                dst: None,
                proto: Some(17),
                dst_port: Some(53)
            }
        );
        let filter = attrs(top[1].1).unwrap();
        assert_eq!(filter.len(), 1);
        assert_eq!(
            u32::from_ne_bytes(filter[0].1.try_into().unwrap()),
            F_PROTO_NUM | F_PROTO_DST_PORT
        );
        let node_port = Flows {
            family: Family::V4,
            protocol: Protocol::Udp,
            dst: None,
            dst_port: 30053,
            reply: Reply::NotFrom([ip("10.244.0.5")].into()),
        };
        let top_b = dump_request(&node_port, 1);
        let top = attrs(&top_b[20..]).unwrap();
        assert_eq!(
            top.iter().map(|a| a.0).collect::<Vec<_>>(),
            [CTA_TUPLE_ORIG, CTA_FILTER]
        );
    }

    /// A dumped entry as the kernel writes it.
    fn dumped(orig: (&str, &str, u16, u16), reply: (&str, &str, u16, u16), id: u32) -> Vec<u8> {
        let tuple = |m: &mut Msg, t: (&str, &str, u16, u16)| {
            m.nest(CTA_TUPLE_IP, |m| {
                m.attr(CTA_IP_V4_SRC, &ip_bytes(&ip(t.0)));
                m.attr(CTA_IP_V4_DST, &ip_bytes(&ip(t.1)));
            });
            m.nest(CTA_TUPLE_PROTO, |m| {
                m.attr(CTA_PROTO_NUM, &[17]);
                m.attr(2, &t.2.to_be_bytes());
                m.attr(CTA_PROTO_DST_PORT, &t.3.to_be_bytes());
            });
        };
        let mut m = ct_msg(IPCTNL_MSG_CT_NEW, 2, 9, AF_INET);
        m.nest(CTA_TUPLE_ORIG, |m| tuple(m, orig));
        m.nest(CTA_TUPLE_REPLY, |m| tuple(m, reply));
        m.attr(3, &8u32.to_be_bytes()); // CTA_STATUS
        m.attr(CTA_ID, &id.to_be_bytes());
        m.finish()
    }

    #[test]
    fn dumps_are_parsed_and_deletions_name_the_exact_tuple() {
        let mut d = dumped(
            ("10.244.0.11", "10.96.0.10", 40000, 53),
            ("10.244.0.12", "10.244.0.11", 5353, 40000),
            77,
        );
        d.extend(dumped(
            ("10.244.0.11", "10.96.0.10", 40001, 53),
            ("10.244.0.13", "10.244.0.11", 5353, 40001),
            78,
        ));
        let part = parse(&d).unwrap();
        assert_eq!(part.end, None);
        assert_eq!(part.entries.len(), 2);
        let e = &part.entries[0];
        assert_eq!(
            (e.protocol, e.orig_dst, e.orig_dst_port, e.reply_src),
            (17, ip("10.96.0.10"), 53, ip("10.244.0.12"))
        );
        let gone = Flows {
            family: Family::V4,
            protocol: Protocol::Udp,
            dst: Some(ip("10.96.0.10")),
            dst_port: 53,
            reply: Reply::From(ip("10.244.0.12")),
        };
        let selected: Vec<bool> = part.entries.iter().map(|e| e.selected_by(&gone)).collect();
        assert_eq!(selected, [true, false]);

        let del = delete_request(e, 5);
        assert_eq!(u16_at(&del, 4), 0x0102, "ctnetlink DELETE");
        assert_eq!(u16_at(&del, 6), NLM_F_REQUEST | NLM_F_ACK);
        let top = attrs(&del[20..]).unwrap();
        assert_eq!(top.iter().map(|a| a.0).collect::<Vec<_>>(), [CTA_TUPLE_ORIG, CTA_ID]);
        let t = tuple(top[0].1).unwrap();
        assert_eq!(
            t,
            Tuple {
                src: Some(ip("10.244.0.11")),
                dst: Some(ip("10.96.0.10")),
                proto: Some(17),
                dst_port: Some(53)
            }
        );
        assert_eq!(top[1].1, 77u32.to_be_bytes());

        let mut done = Vec::new();
        done.extend_from_slice(&20u32.to_ne_bytes());
        done.extend_from_slice(&NLMSG_DONE.to_ne_bytes());
        done.extend_from_slice(&[0; 14]);
        let mut with_done = d.clone();
        with_done.extend(done);
        assert_eq!(parse(&with_done).unwrap().end, Some(0));
        let mut err = Vec::new();
        err.extend_from_slice(&36u32.to_ne_bytes());
        err.extend_from_slice(&NLMSG_ERROR.to_ne_bytes());
        err.extend_from_slice(&[0; 10]);
        err.extend_from_slice(&(-ENOENT).to_ne_bytes());
        err.extend_from_slice(&[0; 16]);
        assert_eq!(parse(&err).unwrap().end, Some(ENOENT));
        assert!(parse(&d[..d.len() - 8]).is_err(), "truncated");
    }
}
