//! The netlink write path of nftables mode: a partial sync's typed operations (chains added,
//! flushed, deleted; map and set elements added and deleted; sets deleted) encoded as one
//! nf_tables batch (NFNL_MSG_BATCH_BEGIN, the commands, NFNL_MSG_BATCH_END) and written over
//! NETLINK_NETFILTER. The kernel applies a batch whole or not at all, as `nft -f` would, but
//! without `nft`'s cache: `nft -f` lists every chain of the table before it applies anything
//! (110,000 chains at 10,000 Services x 10 endpoints), a batch lists nothing.
//!
//! The encoding is written here (the attribute numbers are facts from
//! linux/netfilter/nf_tables.h and nfnetlink.h) with the builder of `crate::nl`: the crates
//! that exist for nftables batches are a C binding (`nftnl`, libnftnl) or `rustables`, which
//! also needs libnftnl's headers through bindgen; neither is in the workspace.
//!
//! Rules are not encoded yet: a partial sync that writes rules (a changed service chain) still
//! goes through `nft -f` (see `rules::Output::ops`).

use std::io;
use std::net::IpAddr;
use std::path::PathBuf;

use crate::model::{Family, Protocol};
use crate::nl::{self, Msg, NLM_F_ACK, NLM_F_CREATE, NLM_F_REQUEST};

const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_DELCHAIN: u16 = 5;
const NFT_MSG_DELRULE: u16 = 8;
const NFT_MSG_DELSET: u16 = 11;
const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_DELSETELEM: u16 = 14;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_SET_TABLE: u16 = 1;
const NFTA_SET_NAME: u16 = 2;
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_DATA: u16 = 2;
const NFTA_SET_ELEM_USERDATA: u16 = 6;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;
/// libnftnl's element comment in the element's user data (a TLV: type, length, text + NUL).
const NFTNL_UDATA_SET_ELEM_COMMENT: u8 = 0;
const NF_DROP: i32 = 0;
const NFT_GOTO: i32 = -4;
const NFPROTO_IPV4: u8 = 2;
const NFPROTO_IPV6: u8 = 10;
const EINVAL: i32 = 22;

/// The key of an element of one of the shared sets and maps, typed as the kernel stores it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Key {
    /// `cluster-ips`, `nodeport-ips`.
    Addr(IpAddr),
    /// `service-ips`, `no-endpoint-services`, `firewall-ips`: addr . inet_proto . inet_service.
    AddrProtoPort(IpAddr, Protocol, u16),
    /// `service-nodeports`, `no-endpoint-nodeports`: inet_proto . inet_service.
    ProtoPort(Protocol, u16),
}

/// The verdict of a map element.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verdict {
    Drop,
    Goto(String),
}

fn proto_number(p: Protocol) -> u8 {
    match p {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
    }
}

fn push_addr(b: &mut Vec<u8>, ip: &IpAddr) {
    match ip {
        IpAddr::V4(a) => b.extend_from_slice(&a.octets()),
        IpAddr::V6(a) => b.extend_from_slice(&a.octets()),
    }
}

impl Key {
    /// As nft spells it.
    pub fn text(&self) -> String {
        match self {
            Key::Addr(ip) => ip.to_string(),
            Key::AddrProtoPort(ip, proto, port) => format!("{ip} . {} . {port}", proto.lower()),
            Key::ProtoPort(proto, port) => format!("{} . {port}", proto.lower()),
        }
    }

    /// The key's bytes: a concatenation's fields each in network order, each padded to the
    /// kernel's 32-bit register size.
    pub fn bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(24);
        let proto = |b: &mut Vec<u8>, p: &Protocol| b.extend_from_slice(&[proto_number(*p), 0, 0, 0]);
        let port = |b: &mut Vec<u8>, p: u16| {
            b.extend_from_slice(&p.to_be_bytes());
            b.extend_from_slice(&[0, 0]);
        };
        match self {
            Key::Addr(ip) => push_addr(&mut b, ip),
            Key::AddrProtoPort(ip, p, n) => {
                push_addr(&mut b, ip);
                proto(&mut b, p);
                port(&mut b, *n);
            }
            Key::ProtoPort(p, n) => {
                proto(&mut b, p);
                port(&mut b, *n);
            }
        }
        b
    }
}

impl Verdict {
    pub fn text(&self) -> String {
        match self {
            Verdict::Drop => "drop".into(),
            Verdict::Goto(c) => format!("goto {c}"),
        }
    }
}

/// One operation of a partial sync, on ferro's own table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    AddChain(String),
    /// Deletes every rule of the chain (`flush chain`).
    FlushChain(String),
    DeleteChain(String),
    DeleteSet(String),
    AddElement { set: &'static str, key: Key, comment: Option<String>, verdict: Option<Verdict> },
    DeleteElement { set: &'static str, key: Key },
}

impl Op {
    /// The chain this operation writes or sends packets to, if any (to name a culprit).
    pub fn chain(&self) -> Option<&str> {
        match self {
            Op::AddChain(c) | Op::FlushChain(c) | Op::DeleteChain(c) => Some(c),
            Op::AddElement { verdict: Some(Verdict::Goto(c)), .. } => Some(c),
            _ => None,
        }
    }
}

/// The netlink messages of a batch: begin, one per operation (seq `first_seq + 1 + i`, with
/// NLM_F_ACK), end. Pure.
pub fn encode(family: Family, table: &str, ops: &[Op], first_seq: u32) -> Vec<u8> {
    let nfproto = match family {
        Family::V4 => NFPROTO_IPV4,
        Family::V6 => NFPROTO_IPV6,
    };
    let mut out = Vec::with_capacity(64 + ops.len() * 96);
    let subsys = NFNL_SUBSYS_NFTABLES.to_be_bytes();
    let batch_header = [0u8, 0, subsys[0], subsys[1]];
    out.extend(Msg::new(NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, first_seq, &batch_header).finish());
    let header = [nfproto, 0, 0, 0];
    let kind = |m: u16| (NFNL_SUBSYS_NFTABLES << 8) | m;
    for (i, op) in ops.iter().enumerate() {
        let seq = first_seq.wrapping_add(1 + i as u32);
        let flags = NLM_F_REQUEST | NLM_F_ACK;
        let m = match op {
            Op::AddChain(c) => {
                let mut m = Msg::new(kind(NFT_MSG_NEWCHAIN), flags | NLM_F_CREATE, seq, &header);
                m.str(NFTA_CHAIN_TABLE, table).str(NFTA_CHAIN_NAME, c);
                m
            }
            Op::FlushChain(c) => {
                let mut m = Msg::new(kind(NFT_MSG_DELRULE), flags, seq, &header);
                m.str(NFTA_RULE_TABLE, table).str(NFTA_RULE_CHAIN, c);
                m
            }
            Op::DeleteChain(c) => {
                let mut m = Msg::new(kind(NFT_MSG_DELCHAIN), flags, seq, &header);
                m.str(NFTA_CHAIN_TABLE, table).str(NFTA_CHAIN_NAME, c);
                m
            }
            Op::DeleteSet(s) => {
                let mut m = Msg::new(kind(NFT_MSG_DELSET), flags, seq, &header);
                m.str(NFTA_SET_TABLE, table).str(NFTA_SET_NAME, s);
                m
            }
            Op::AddElement { set, key, comment, verdict } => {
                let mut m = Msg::new(kind(NFT_MSG_NEWSETELEM), flags | NLM_F_CREATE, seq, &header);
                m.str(NFTA_SET_ELEM_LIST_TABLE, table).str(NFTA_SET_ELEM_LIST_SET, set);
                m.nest(NFTA_SET_ELEM_LIST_ELEMENTS, |m| {
                    m.nest(NFTA_LIST_ELEM, |m| {
                        m.nest(NFTA_SET_ELEM_KEY, |m| {
                            m.attr(NFTA_DATA_VALUE, &key.bytes());
                        });
                        if let Some(v) = verdict {
                            m.nest(NFTA_SET_ELEM_DATA, |m| {
                                m.nest(NFTA_DATA_VERDICT, |m| match v {
                                    Verdict::Drop => {
                                        m.attr(NFTA_VERDICT_CODE, &NF_DROP.to_be_bytes());
                                    }
                                    Verdict::Goto(c) => {
                                        m.attr(NFTA_VERDICT_CODE, &NFT_GOTO.to_be_bytes()).str(NFTA_VERDICT_CHAIN, c);
                                    }
                                });
                            });
                        }
                        if let Some(c) = comment {
                            let mut ud = vec![NFTNL_UDATA_SET_ELEM_COMMENT, (c.len() + 1) as u8];
                            ud.extend_from_slice(c.as_bytes());
                            ud.push(0);
                            m.attr(NFTA_SET_ELEM_USERDATA, &ud);
                        }
                    });
                });
                m
            }
            Op::DeleteElement { set, key } => {
                let mut m = Msg::new(kind(NFT_MSG_DELSETELEM), flags, seq, &header);
                m.str(NFTA_SET_ELEM_LIST_TABLE, table).str(NFTA_SET_ELEM_LIST_SET, set);
                m.nest(NFTA_SET_ELEM_LIST_ELEMENTS, |m| {
                    m.nest(NFTA_LIST_ELEM, |m| {
                        m.nest(NFTA_SET_ELEM_KEY, |m| {
                            m.attr(NFTA_DATA_VALUE, &key.bytes());
                        });
                    });
                });
                m
            }
        };
        out.extend(m.finish());
    }
    let end_seq = first_seq.wrapping_add(1 + ops.len() as u32);
    out.extend(Msg::new(NFNL_MSG_BATCH_END, NLM_F_REQUEST, end_seq, &batch_header).finish());
    out
}

/// A batch the kernel did not apply.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    #[error("nftables netlink socket")]
    Io(#[from] io::Error),
    /// The kernel refused operation `index` (None: the batch as a whole, at commit) with `errno`.
    #[error("kernel refused the batch ({}) at operation {index:?}", io::Error::from_raw_os_error(*errno))]
    Refused { index: Option<usize>, errno: i32 },
}

/// Writes one family's batch to the kernel. Injected into the nftables backend; tests use
/// [`Recording`].
pub trait NftWriter: Send + 'static {
    fn apply(&mut self, family: Family, table: &str, ops: &[Op]) -> Result<(), BatchError>;
}

/// The kernel, over NETLINK_NETFILTER, in this process's network namespace or `netns`'s.
#[derive(Debug, Default)]
pub struct Kernel {
    netns: Option<PathBuf>,
    seq: u32,
}

impl Kernel {
    pub fn new(netns: Option<PathBuf>) -> Kernel {
        Kernel { netns, seq: 1 }
    }
}

impl NftWriter for Kernel {
    fn apply(&mut self, family: Family, table: &str, ops: &[Op]) -> Result<(), BatchError> {
        if ops.is_empty() {
            return Ok(());
        }
        let sock = nl::socket(netlink_sys::protocols::NETLINK_NETFILTER, self.netns.as_deref())?;
        let first = self.seq;
        self.seq = self.seq.wrapping_add(ops.len() as u32 + 2);
        let buf = encode(family, table, ops, first);
        sock.send(&buf, 0)?;
        read_acks(&sock, first, ops.len())
    }
}

/// Reads the answers of a batch whose commands are `first + 1 ..= first + n`: every command
/// carries NLM_F_ACK, so the kernel answers each once (0 or its error) when it processed the
/// batch, or answers the batch's first message once with the error of the commit.
fn read_acks(sock: &netlink_sys::Socket, first: u32, n: usize) -> Result<(), BatchError> {
    let mut pending = n;
    let mut refused: Option<(usize, i32)> = None;
    let mut buf = vec![0u8; 256 * 1024];
    while pending > 0 {
        let len = sock.recv(&mut &mut buf[..], 0)?;
        for (kind, _flags, body) in nl::messages(&buf[..len])? {
            if kind != nl::NLMSG_ERROR {
                continue;
            }
            let code = nl::error_code(body)?;
            // the request's header follows the errno: its sequence number at offset 8
            let seq = body.get(12..16).map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]])).ok_or_else(|| nl::bad("error message"))?;
            let index = seq.wrapping_sub(first).wrapping_sub(1) as usize;
            if seq == first || index >= n {
                return Err(BatchError::Refused { index: None, errno: if code == 0 { EINVAL } else { code } });
            }
            pending = pending.saturating_sub(1);
            if code != 0 && refused.is_none() {
                refused = Some((index, code));
            }
        }
    }
    match refused {
        Some((index, errno)) => Err(BatchError::Refused { index: Some(index), errno }),
        None => Ok(()),
    }
}

/// A recording fake: keeps every batch; refuses the next one when told to.
#[derive(Debug, Clone, Default)]
pub struct Recording {
    inner: std::sync::Arc<std::sync::Mutex<RecordingState>>,
}

#[derive(Debug, Default)]
struct RecordingState {
    batches: Vec<(Family, Vec<Op>)>,
    refuse: Option<(usize, i32)>,
}

impl Recording {
    pub fn new() -> Recording {
        Recording::default()
    }

    /// The batches applied so far (a refused one is not recorded).
    pub fn batches(&self) -> Vec<(Family, Vec<Op>)> {
        self.inner.lock().map(|s| s.batches.clone()).unwrap_or_default()
    }

    /// The next batch is refused at operation `index` with `errno`.
    pub fn refuse_next(&self, index: usize, errno: i32) {
        if let Ok(mut s) = self.inner.lock() {
            s.refuse = Some((index, errno));
        }
    }
}

impl NftWriter for Recording {
    fn apply(&mut self, family: Family, _table: &str, ops: &[Op]) -> Result<(), BatchError> {
        let mut s = self.inner.lock().map_err(|_| io::Error::other("recording poisoned"))?;
        if let Some((index, errno)) = s.refuse.take() {
            return Err(BatchError::Refused { index: Some(index), errno });
        }
        s.batches.push((family, ops.to_vec()));
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_padded_to_registers_in_network_order() {
        let k = Key::AddrProtoPort("10.96.0.1".parse().unwrap(), Protocol::Udp, 53);
        assert_eq!(k.bytes(), [10, 96, 0, 1, 17, 0, 0, 0, 0, 53, 0, 0]);
        assert_eq!(k.text(), "10.96.0.1 . udp . 53");
        assert_eq!(Key::ProtoPort(Protocol::Tcp, 30080).bytes(), [6, 0, 0, 0, 0x75, 0x80, 0, 0]);
        assert_eq!(Key::Addr("fd00::1".parse().unwrap()).bytes().len(), 16);
    }

    #[test]
    fn a_batch_is_begin_commands_end_with_acks_on_the_commands() {
        let ops = [
            Op::AddElement {
                set: "no-endpoint-services",
                key: Key::AddrProtoPort("10.96.0.9".parse().unwrap(), Protocol::Tcp, 80),
                comment: Some("ns/s:p".into()),
                verdict: Some(Verdict::Goto("reject-chain".into())),
            },
            Op::FlushChain("service-X".into()),
            Op::DeleteChain("service-X".into()),
        ];
        let b = encode(Family::V4, "kube-proxy", &ops, 100);
        let msgs = nl::messages(&b).unwrap();
        let kinds: Vec<u16> = msgs.iter().map(|m| m.0).collect();
        assert_eq!(kinds, [0x10, 0x0a0c, 0x0a08, 0x0a05, 0x11]);
        // batch begin/end name the nftables subsystem in res_id (big endian)
        assert_eq!(msgs[0].2, [0, 0, 0, 10]);
        assert_eq!(msgs[0].1 & NLM_F_ACK, 0);
        assert!(msgs[1..4].iter().all(|m| m.1 & NLM_F_ACK != 0));
        assert_eq!(msgs[1].1 & NLM_F_CREATE, NLM_F_CREATE);
        // the element: table, set, then one element with key, verdict and comment
        let top = nl::attrs(&msgs[1].2[4..]).unwrap();
        assert_eq!(nl::find(&top, NFTA_SET_ELEM_LIST_TABLE).unwrap(), b"kube-proxy\0");
        let elems = nl::attrs(nl::find(&top, NFTA_SET_ELEM_LIST_ELEMENTS).unwrap()).unwrap();
        let elem = nl::attrs(nl::find(&elems, NFTA_LIST_ELEM).unwrap()).unwrap();
        let key = nl::attrs(nl::find(&elem, NFTA_SET_ELEM_KEY).unwrap()).unwrap();
        assert_eq!(nl::find(&key, NFTA_DATA_VALUE).unwrap(), [10, 96, 0, 9, 6, 0, 0, 0, 0, 80, 0, 0]);
        let data = nl::attrs(nl::find(&elem, NFTA_SET_ELEM_DATA).unwrap()).unwrap();
        let verdict = nl::attrs(nl::find(&data, NFTA_DATA_VERDICT).unwrap()).unwrap();
        assert_eq!(nl::find(&verdict, NFTA_VERDICT_CODE).unwrap(), (-4i32).to_be_bytes());
        assert_eq!(nl::find(&verdict, NFTA_VERDICT_CHAIN).unwrap(), b"reject-chain\0");
        assert_eq!(nl::find(&elem, NFTA_SET_ELEM_USERDATA).unwrap(), b"\x00\x07ns/s:p\0");
        // flush = DELRULE with only table and chain
        let flush = nl::attrs(&msgs[2].2[4..]).unwrap();
        assert_eq!(flush.iter().map(|a| a.0).collect::<Vec<_>>(), [NFTA_RULE_TABLE, NFTA_RULE_CHAIN]);
    }

    #[test]
    fn the_fake_records_and_refuses() {
        let r = Recording::new();
        let mut w = r.clone();
        w.apply(Family::V4, "kube-proxy", &[Op::AddChain("a".into())]).unwrap();
        r.refuse_next(0, 2);
        assert!(matches!(w.apply(Family::V4, "kube-proxy", &[Op::AddChain("b".into())]), Err(BatchError::Refused { index: Some(0), errno: 2 })));
        assert_eq!(r.batches().len(), 1);
    }
}
