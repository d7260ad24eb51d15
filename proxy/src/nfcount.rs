//! The drift check's probe: how many rules one chain of one nftables table has, through a
//! netlink dump that the kernel filters to that chain (NFT_MSG_GETRULE with NFTA_RULE_TABLE
//! and NFTA_RULE_CHAIN). Its cost does not grow with the ruleset, unlike `nft list chain` or
//! `iptables -S`, which fetch the whole table first (~50 ms at 1,000 Services). iptables-nft
//! tables are nftables tables, so the same probe serves both modes.
//!
//! The same socket lists the chain names of a table (NFT_MSG_GETCHAIN dump) for the iptables
//! backend's full sync, which must know the per-service chains the nat table holds:
//! `iptables-save` lists them in minutes at 100,000 chains (iptables-nft 1.8.9), the dump in
//! about a second.

use std::collections::BTreeSet;
use std::io;

use netlink_sys::{protocols::NETLINK_NETFILTER, Socket};

use crate::model::Family;

const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_GETCHAIN: u16 = 4;
const NFT_MSG_NEWRULE: u16 = 6;
const NFT_MSG_GETRULE: u16 = 7;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_DUMP: u16 = 0x300;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NLA_TYPE_MASK: u16 = 0x3fff;
const NFPROTO_IPV4: u8 = 2;
const NFPROTO_IPV6: u8 = 10;
const ENOENT: i32 = 2;

/// Counts rules of chains. Injected into the backends; tests use a fake.
pub trait RuleCounter: Send + 'static {
    /// The number of rules in `table`/`chain` of the family; None when the table or chain is
    /// missing.
    fn count(&mut self, family: Family, table: &str, chain: &str) -> io::Result<Option<usize>>;

    /// The names of the chains of `table` of the family (none when the table is missing).
    fn chains(&mut self, family: Family, table: &str) -> io::Result<BTreeSet<String>>;
}

fn attr(buf: &mut Vec<u8>, kind: u16, s: &str) {
    let len = 4 + s.len() + 1;
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(s.as_bytes());
    buf.push(0);
    while !buf.len().is_multiple_of(4) {
        buf.push(0);
    }
}

/// The dump request (pure, for tests).
pub fn request(family: Family, table: &str, chain: &str, seq: u32) -> Vec<u8> {
    dump_request(NFT_MSG_GETRULE, family, &[(NFTA_RULE_TABLE, table), (NFTA_RULE_CHAIN, chain)], seq)
}

/// The request of a dump of every chain of the family (the kernel does not filter chain
/// dumps by table; [`chains_of`] does).
pub fn chain_request(family: Family, seq: u32) -> Vec<u8> {
    dump_request(NFT_MSG_GETCHAIN, family, &[], seq)
}

fn dump_request(msg: u16, family: Family, attrs: &[(u16, &str)], seq: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(64);
    b.extend_from_slice(&[0; 4]); // length, set below
    b.extend_from_slice(&((NFNL_SUBSYS_NFTABLES << 8) | msg).to_ne_bytes());
    b.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    b.extend_from_slice(&seq.to_ne_bytes());
    b.extend_from_slice(&0u32.to_ne_bytes());
    // nfgenmsg
    b.push(match family {
        Family::V4 => NFPROTO_IPV4,
        Family::V6 => NFPROTO_IPV6,
    });
    b.push(0);
    b.extend_from_slice(&0u16.to_be_bytes());
    for (kind, value) in attrs {
        attr(&mut b, *kind, value);
    }
    let len = b.len() as u32;
    b[..4].copy_from_slice(&len.to_ne_bytes());
    b
}

/// What one datagram of the answer says.
#[derive(Debug, PartialEq, Eq)]
pub enum Part {
    /// Rules in it; more datagrams follow.
    Rules(usize),
    /// Rules in it, and the dump is complete.
    Done(usize),
    /// The kernel's errno (0 is an acknowledgement).
    Error(i32),
}

fn short() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, "short netlink message")
}

/// The messages of one datagram: `each` gets the type and the payload (after the netlink
/// header) of every one before the end of the dump. Ok(Some(errno)) at the end (0: done or
/// acknowledged), Ok(None) when more datagrams follow.
fn messages(buf: &[u8], mut each: impl FnMut(u16, &[u8])) -> io::Result<Option<i32>> {
    let mut off = 0;
    while off + 16 <= buf.len() {
        let len = u32::from_ne_bytes(buf[off..off + 4].try_into().map_err(|_| short())?) as usize;
        let kind = u16::from_ne_bytes(buf[off + 4..off + 6].try_into().map_err(|_| short())?);
        if len < 16 || off + len > buf.len() {
            return Err(short());
        }
        match kind {
            NLMSG_DONE => return Ok(Some(0)),
            NLMSG_ERROR => {
                let e = buf.get(off + 16..off + 20).ok_or_else(short)?;
                return Ok(Some(-i32::from_ne_bytes(e.try_into().map_err(|_| short())?)));
            }
            k => each(k, &buf[off + 16..off + len]),
        }
        off += (len + 3) & !3;
    }
    Ok(None)
}

/// Parses one datagram (pure, for tests).
pub fn parse(buf: &[u8]) -> io::Result<Part> {
    let mut rules = 0;
    let end = messages(buf, |k, _| {
        if k == (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWRULE {
            rules += 1;
        }
    })?;
    Ok(match end {
        None => Part::Rules(rules),
        Some(0) => Part::Done(rules),
        Some(e) => Part::Error(e),
    })
}

/// The string attributes `kinds` of one nftables message's payload (after its nfgenmsg).
fn strings<const N: usize>(payload: &[u8], kinds: [u16; N]) -> [Option<&str>; N] {
    let mut out = [None; N];
    let mut off = 4;
    while off + 4 <= payload.len() {
        let len = u16::from_ne_bytes([payload[off], payload[off + 1]]) as usize;
        let kind = u16::from_ne_bytes([payload[off + 2], payload[off + 3]]) & NLA_TYPE_MASK;
        if len < 4 || off + len > payload.len() {
            break;
        }
        if let Some(i) = kinds.iter().position(|k| *k == kind) {
            let v = &payload[off + 4..off + len];
            let v = v.split(|b| *b == 0).next().unwrap_or(v);
            out[i] = std::str::from_utf8(v).ok();
        }
        off += (len + 3) & !3;
    }
    out
}

/// The names of the chains of `table` in one datagram of a chain dump, added to `into`
/// (pure, for tests); the end of the dump as [`messages`] gives it.
pub fn chains_of(buf: &[u8], table: &str, into: &mut BTreeSet<String>) -> io::Result<Option<i32>> {
    messages(buf, |k, payload| {
        if k == (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWCHAIN {
            if let [Some(t), Some(name)] = strings(payload, [NFTA_CHAIN_TABLE, NFTA_CHAIN_NAME]) {
                if t == table {
                    into.insert(name.to_string());
                }
            }
        }
    })
}

/// The real counter: a NETLINK_NETFILTER socket in this process's network namespace, or in
/// the namespace at `netns` (tests: the socket is opened on a thread that entered it).
pub struct Netlink {
    seq: u32,
    netns: Option<std::path::PathBuf>,
}

impl Netlink {
    pub fn new() -> Netlink {
        Netlink { seq: 1, netns: None }
    }

    /// Probes the namespace at `path` (e.g. /run/netns/NAME) instead of this process's.
    pub fn in_namespace(path: impl Into<std::path::PathBuf>) -> Netlink {
        Netlink { seq: 1, netns: Some(path.into()) }
    }

    fn socket(&self) -> io::Result<Socket> {
        crate::nl::socket(NETLINK_NETFILTER, self.netns.as_deref())
    }
}

impl Default for Netlink {
    fn default() -> Self {
        Netlink::new()
    }
}

impl RuleCounter for Netlink {
    fn count(&mut self, family: Family, table: &str, chain: &str) -> io::Result<Option<usize>> {
        let sock = self.socket()?;
        self.seq = self.seq.wrapping_add(1);
        sock.send(&request(family, table, chain, self.seq), 0)?;
        let mut total = 0;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = sock.recv(&mut &mut buf[..], 0)?;
            match parse(&buf[..n])? {
                Part::Rules(r) => total += r,
                Part::Done(r) => return Ok(Some(total + r)),
                Part::Error(0) => return Ok(Some(total)),
                Part::Error(ENOENT) => return Ok(None),
                Part::Error(e) => return Err(io::Error::from_raw_os_error(e)),
            }
        }
    }

    fn chains(&mut self, family: Family, table: &str) -> io::Result<BTreeSet<String>> {
        let sock = self.socket()?;
        self.seq = self.seq.wrapping_add(1);
        sock.send(&chain_request(family, self.seq), 0)?;
        let mut names = BTreeSet::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = sock.recv(&mut &mut buf[..], 0)?;
            match chains_of(&buf[..n], table, &mut names)? {
                None => {}
                Some(0 | ENOENT) => return Ok(names),
                Some(e) => return Err(io::Error::from_raw_os_error(e)),
            }
        }
    }
}

/// For iptables-legacy (whose tables are not nftables tables): `iptables -S <chain>` through
/// a [`Runner`](crate::exec::Runner); it lists only that chain but costs more.
pub struct ViaIptables<R: crate::exec::Runner>(pub R);

impl<R: crate::exec::Runner> RuleCounter for ViaIptables<R> {
    fn count(&mut self, family: Family, table: &str, chain: &str) -> io::Result<Option<usize>> {
        let bin = match family {
            Family::V4 => "iptables",
            Family::V6 => "ip6tables",
        };
        match self.0.run(bin, &["-w", "-t", table, "-S", chain], None) {
            Ok(out) => Ok(Some(out.lines().filter(|l| l.starts_with("-A ")).count())),
            Err(_) => Ok(None),
        }
    }

    fn chains(&mut self, family: Family, table: &str) -> io::Result<BTreeSet<String>> {
        let save = match family {
            Family::V4 => "iptables-save",
            Family::V6 => "ip6tables-save",
        };
        let saved = self.0.run(save, &["-t", table], None).map_err(io::Error::other)?;
        Ok(crate::iptables::rules::saved_chains(&saved))
    }
}

/// A fake: answers from a closure.
pub struct Fake<F: FnMut(Family, &str, &str) -> Option<usize> + Send + 'static>(pub F);

impl<F: FnMut(Family, &str, &str) -> Option<usize> + Send + 'static> RuleCounter for Fake<F> {
    fn count(&mut self, family: Family, table: &str, chain: &str) -> io::Result<Option<usize>> {
        Ok((self.0)(family, table, chain))
    }

    /// No chain names (a table without per-service chains).
    fn chains(&mut self, _family: Family, _table: &str) -> io::Result<BTreeSet<String>> {
        Ok(BTreeSet::new())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn request_is_a_filtered_rule_dump() {
        let b = request(Family::V6, "nat", "KUBE-PROXY-CANARY", 7);
        assert_eq!(b.len() % 4, 0);
        assert_eq!(u32::from_ne_bytes(b[..4].try_into().unwrap()) as usize, b.len());
        assert_eq!(u16::from_ne_bytes(b[4..6].try_into().unwrap()), 0x0a07);
        assert_eq!(u16::from_ne_bytes(b[6..8].try_into().unwrap()), 0x301);
        assert_eq!(b[16], 10, "NFPROTO_IPV6");
        assert_eq!(&b[24..28], b"nat\0");
        assert_eq!(&b[32..49], b"KUBE-PROXY-CANARY");
    }

    fn msg(kind: u16, extra: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&((16 + extra.len()) as u32).to_ne_bytes());
        m.extend_from_slice(&kind.to_ne_bytes());
        m.extend_from_slice(&[0; 10]);
        m.extend_from_slice(extra);
        m
    }

    fn attr_bytes(kind: u16, s: &str) -> Vec<u8> {
        let mut b = Vec::new();
        attr(&mut b, kind, s);
        b
    }

    #[test]
    fn a_chain_dump_is_read_for_one_table() {
        let b = chain_request(Family::V4, 3);
        assert_eq!(u32::from_ne_bytes(b[..4].try_into().unwrap()) as usize, b.len());
        assert_eq!(b.len(), 20, "no attributes: the kernel does not filter chain dumps");
        assert_eq!(u16::from_ne_bytes(b[4..6].try_into().unwrap()), 0x0a04);
        assert_eq!(b[16], 2, "NFPROTO_IPV4");
        let chain = |table: &str, name: &str| {
            let mut p = vec![2, 0, 0, 0];
            p.extend(attr_bytes(NFTA_CHAIN_TABLE, table));
            p.extend(attr_bytes(2, "handle")); // another attribute in between
            p.extend(attr_bytes(NFTA_CHAIN_NAME, name));
            msg(0x0a03, &p)
        };
        let mut d = chain("nat", "KUBE-SERVICES");
        d.extend(chain("filter", "KUBE-FORWARD"));
        d.extend(chain("nat", "KUBE-SVC-AAAA"));
        let mut names = BTreeSet::new();
        assert_eq!(chains_of(&d, "nat", &mut names).unwrap(), None, "more to come");
        d.extend(msg(NLMSG_DONE, &[0; 4]));
        let mut names = BTreeSet::new();
        assert_eq!(chains_of(&d, "nat", &mut names).unwrap(), Some(0));
        assert_eq!(names, ["KUBE-SERVICES", "KUBE-SVC-AAAA"].map(String::from).into());
        assert_eq!(chains_of(&msg(NLMSG_ERROR, &(-1i32).to_ne_bytes()), "nat", &mut names).unwrap(), Some(1));
    }

    #[test]
    fn answers_are_counted() {
        let mut d = msg(0x0a06, &[0; 4]);
        d.extend(msg(0x0a06, &[0; 4]));
        assert_eq!(parse(&d).unwrap(), Part::Rules(2));
        d.extend(msg(NLMSG_DONE, &[0; 4]));
        assert_eq!(parse(&d).unwrap(), Part::Done(2));
        assert_eq!(parse(&msg(NLMSG_ERROR, &(-2i32).to_ne_bytes())).unwrap(), Part::Error(2));
        assert!(parse(&[1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]).is_err());
    }
}
