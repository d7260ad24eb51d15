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
//! Rules are typed (`rule::Rule`): a rule is NFT_MSG_NEWRULE with its expressions, preceded,
//! for `numgen .. vmap`, by its anonymous map (NFT_MSG_NEWSET, NFT_MSG_NEWSETELEM) in the same
//! batch, as nft sends them. A partial sync with a rule that is not encoded (see `rule.rs`)
//! still goes through `nft -f` (see `rules::Output::ops`).

use std::io;
use std::net::IpAddr;
use std::path::PathBuf;

use crate::model::{Family, Protocol};
use crate::nftables::rule::{proto_number, Rule, ANON_MAP, NFT_GOTO};
use crate::nl::{self, Msg, NLM_F_ACK, NLM_F_CREATE, NLM_F_REQUEST};

const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_DELCHAIN: u16 = 5;
const NFT_MSG_NEWRULE: u16 = 6;
const NFT_MSG_NEWSET: u16 = 9;
const NFT_MSG_DELRULE: u16 = 8;
const NFT_MSG_DELSET: u16 = 11;
const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_DELSETELEM: u16 = 14;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_SET_TABLE: u16 = 1;
const NFTA_SET_NAME: u16 = 2;
const NFTA_SET_FLAGS: u16 = 3;
const NFTA_SET_KEY_TYPE: u16 = 4;
const NFTA_SET_KEY_LEN: u16 = 5;
const NFTA_SET_DATA_TYPE: u16 = 6;
const NFTA_SET_DATA_LEN: u16 = 7;
const NFTA_SET_DESC: u16 = 9;
const NFTA_SET_ID: u16 = 10;
const NFTA_SET_USERDATA: u16 = 13;
const NFTA_SET_DESC_SIZE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET_ID: u16 = 4;
/// NFT_SET_ANONYMOUS | NFT_SET_CONSTANT | NFT_SET_MAP.
const ANON_MAP_FLAGS: u32 = 0x1 | 0x2 | 0x8;
/// nft's datatype of a `numgen` key (TYPE_INTEGER).
const NFT_TYPE_INTEGER: u32 = 4;
const NFT_DATA_VERDICT: u32 = 0xffff_ff00;
const NLM_F_APPEND: u16 = 0x800;
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
/// libnftnl's set user data types.
const NFTNL_UDATA_SET_KEYBYTEORDER: u8 = 0;
const NFTNL_UDATA_SET_DATABYTEORDER: u8 = 1;
const NFTNL_UDATA_SET_DATA_TYPEOF: u8 = 4;
const NFTNL_UDATA_SET_DATA_INTERVAL: u8 = 6;
const NF_DROP: i32 = 0;
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
    /// Appends a rule to a chain (its anonymous map, if any, made in the same batch).
    AddRule { chain: String, rule: Rule },
}

impl Op {
    /// The chain this operation writes or sends packets to, if any (to name a culprit).
    pub fn chain(&self) -> Option<&str> {
        match self {
            Op::AddChain(c) | Op::FlushChain(c) | Op::DeleteChain(c) | Op::AddRule { chain: c, .. } => Some(c),
            Op::AddElement { verdict: Some(Verdict::Goto(c)), .. } => Some(c),
            _ => None,
        }
    }
}

/// The netlink messages of a batch: begin, the operations' commands (seq `first_seq + 1 + k`
/// for the k-th command, with NLM_F_ACK), end. Pure. See [`encode_batch`].
pub fn encode(family: Family, table: &str, ops: &[Op], first_seq: u32) -> Vec<u8> {
    encode_batch(family, table, ops, first_seq).0
}

/// The batch and, for each of its commands, the index of the operation it belongs to (an
/// operation is one command, except a rule with an anonymous map: NEWSET, NEWSETELEM, NEWRULE).
pub fn encode_batch(family: Family, table: &str, ops: &[Op], first_seq: u32) -> (Vec<u8>, Vec<usize>) {
    let nfproto = match family {
        Family::V4 => NFPROTO_IPV4,
        Family::V6 => NFPROTO_IPV6,
    };
    let mut out = Vec::with_capacity(64 + ops.len() * 96);
    let mut owners: Vec<usize> = Vec::with_capacity(ops.len());
    let subsys = NFNL_SUBSYS_NFTABLES.to_be_bytes();
    let batch_header = [0u8, 0, subsys[0], subsys[1]];
    out.extend(Msg::new(NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, first_seq, &batch_header).finish());
    let header = [nfproto, 0, 0, 0];
    let kind = |m: u16| (NFNL_SUBSYS_NFTABLES << 8) | m;
    let flags = NLM_F_REQUEST | NLM_F_ACK;
    let mut set_id = 0u32;
    for (i, op) in ops.iter().enumerate() {
        let mut msgs: Vec<Msg> = Vec::with_capacity(1);
        let mut next = first_seq.wrapping_add(1 + owners.len() as u32);
        let mut seq = || {
            let s = next;
            next = next.wrapping_add(1);
            s
        };
        match op {
            Op::AddChain(c) => {
                let mut m = Msg::new(kind(NFT_MSG_NEWCHAIN), flags | NLM_F_CREATE, seq(), &header);
                m.str(NFTA_CHAIN_TABLE, table).str(NFTA_CHAIN_NAME, c);
                msgs.push(m);
            }
            Op::FlushChain(c) => {
                let mut m = Msg::new(kind(NFT_MSG_DELRULE), flags, seq(), &header);
                m.str(NFTA_RULE_TABLE, table).str(NFTA_RULE_CHAIN, c);
                msgs.push(m);
            }
            Op::DeleteChain(c) => {
                let mut m = Msg::new(kind(NFT_MSG_DELCHAIN), flags, seq(), &header);
                m.str(NFTA_CHAIN_TABLE, table).str(NFTA_CHAIN_NAME, c);
                msgs.push(m);
            }
            Op::DeleteSet(s) => {
                let mut m = Msg::new(kind(NFT_MSG_DELSET), flags, seq(), &header);
                m.str(NFTA_SET_TABLE, table).str(NFTA_SET_NAME, s);
                msgs.push(m);
            }
            Op::AddElement { set, key, comment, verdict } => {
                let mut m = Msg::new(kind(NFT_MSG_NEWSETELEM), flags | NLM_F_CREATE, seq(), &header);
                m.str(NFTA_SET_ELEM_LIST_TABLE, table).str(NFTA_SET_ELEM_LIST_SET, set);
                m.nest(NFTA_SET_ELEM_LIST_ELEMENTS, |m| {
                    m.nest(NFTA_LIST_ELEM, |m| {
                        m.nest(NFTA_SET_ELEM_KEY, |m| {
                            m.attr(NFTA_DATA_VALUE, &key.bytes());
                        });
                        if let Some(v) = verdict {
                            m.nest(NFTA_SET_ELEM_DATA, |m| verdict_data(m, v));
                        }
                        if let Some(c) = comment {
                            let mut ud = vec![NFTNL_UDATA_SET_ELEM_COMMENT, (c.len() + 1) as u8];
                            ud.extend_from_slice(c.as_bytes());
                            ud.push(0);
                            m.attr(NFTA_SET_ELEM_USERDATA, &ud);
                        }
                    });
                });
                msgs.push(m);
            }
            Op::DeleteElement { set, key } => {
                let mut m = Msg::new(kind(NFT_MSG_DELSETELEM), flags, seq(), &header);
                m.str(NFTA_SET_ELEM_LIST_TABLE, table).str(NFTA_SET_ELEM_LIST_SET, set);
                m.nest(NFTA_SET_ELEM_LIST_ELEMENTS, |m| {
                    m.nest(NFTA_LIST_ELEM, |m| {
                        m.nest(NFTA_SET_ELEM_KEY, |m| {
                            m.attr(NFTA_DATA_VALUE, &key.bytes());
                        });
                    });
                });
                msgs.push(m);
            }
            Op::AddRule { chain, rule } => {
                if let Some(elements) = rule.anonymous_map() {
                    set_id += 1;
                    msgs.push(anonymous_map(kind(NFT_MSG_NEWSET), flags | NLM_F_CREATE, seq(), &header, table, set_id, elements.len()));
                    let mut m = Msg::new(kind(NFT_MSG_NEWSETELEM), flags | NLM_F_CREATE, seq(), &header);
                    m.str(NFTA_SET_ELEM_LIST_TABLE, table)
                        .str(NFTA_SET_ELEM_LIST_SET, ANON_MAP)
                        .attr(NFTA_SET_ELEM_LIST_SET_ID, &set_id.to_be_bytes());
                    m.nest(NFTA_SET_ELEM_LIST_ELEMENTS, |m| {
                        for (n, (k, c)) in elements.iter().enumerate() {
                            // libnftnl numbers the elements' nests 1, 2, ..; the kernel reads
                            // any type there (NFTA_LIST_ELEM is 1)
                            m.nest(NFTA_LIST_ELEM + n as u16, |m| {
                                // the key is a host-order integer (the set's key byte order)
                                m.nest(NFTA_SET_ELEM_KEY, |m| {
                                    m.attr(NFTA_DATA_VALUE, &k.to_ne_bytes());
                                });
                                m.nest(NFTA_SET_ELEM_DATA, |m| verdict_data(m, &Verdict::Goto((*c).to_string())));
                            });
                        }
                    });
                    msgs.push(m);
                }
                let mut m = Msg::new(kind(NFT_MSG_NEWRULE), flags | NLM_F_CREATE | NLM_F_APPEND, seq(), &header);
                m.str(NFTA_RULE_TABLE, table).str(NFTA_RULE_CHAIN, chain);
                m.nest(NFTA_RULE_EXPRESSIONS, |m| rule.encode(m, set_id));
                msgs.push(m);
            }
        }
        for m in msgs {
            out.extend(m.finish());
            owners.push(i);
        }
    }
    let end_seq = first_seq.wrapping_add(1 + owners.len() as u32);
    out.extend(Msg::new(NFNL_MSG_BATCH_END, NLM_F_REQUEST, end_seq, &batch_header).finish());
    (out, owners)
}

fn verdict_data(m: &mut Msg, v: &Verdict) {
    m.nest(NFTA_DATA_VERDICT, |m| match v {
        Verdict::Drop => {
            m.attr(NFTA_VERDICT_CODE, &NF_DROP.to_be_bytes());
        }
        Verdict::Goto(c) => {
            m.attr(NFTA_VERDICT_CODE, &NFT_GOTO.to_be_bytes()).str(NFTA_VERDICT_CHAIN, c);
        }
    });
}

/// NFT_MSG_NEWSET of a rule's anonymous verdict map keyed by a 32-bit integer (`numgen`'s),
/// with the user data nft 1.0.6 attaches (key byte order host, data byte order, the data's
/// typeof, data interval 0: what `nft list` reads back to print the map as `0 : goto c`).
fn anonymous_map(kind: u16, flags: u16, seq: u32, header: &[u8], table: &str, id: u32, size: usize) -> Msg {
    let mut m = Msg::new(kind, flags, seq, header);
    m.str(NFTA_SET_TABLE, table)
        .str(NFTA_SET_NAME, ANON_MAP)
        .attr(NFTA_SET_FLAGS, &ANON_MAP_FLAGS.to_be_bytes())
        .attr(NFTA_SET_KEY_TYPE, &NFT_TYPE_INTEGER.to_be_bytes())
        .attr(NFTA_SET_KEY_LEN, &4u32.to_be_bytes())
        .attr(NFTA_SET_DATA_TYPE, &NFT_DATA_VERDICT.to_be_bytes())
        .attr(NFTA_SET_DATA_LEN, &0u32.to_be_bytes())
        .attr(NFTA_SET_ID, &id.to_be_bytes());
    m.nest(NFTA_SET_DESC, |m| {
        m.attr(NFTA_SET_DESC_SIZE, &(size as u32).to_be_bytes());
    });
    // libnftnl's set user data: TLVs (type u8, length u8, value)
    let one = 1u32.to_ne_bytes();
    let zero = 0u32.to_ne_bytes();
    let mut ud = Vec::with_capacity(28);
    ud.extend_from_slice(&[NFTNL_UDATA_SET_KEYBYTEORDER, 4]);
    ud.extend_from_slice(&one);
    ud.extend_from_slice(&[NFTNL_UDATA_SET_DATABYTEORDER, 4]);
    ud.extend_from_slice(&zero);
    ud.extend_from_slice(&[NFTNL_UDATA_SET_DATA_TYPEOF, 8, 0, 4]);
    ud.extend_from_slice(&one);
    ud.extend_from_slice(&[1, 0]);
    ud.extend_from_slice(&[NFTNL_UDATA_SET_DATA_INTERVAL, 4]);
    ud.extend_from_slice(&zero);
    m.attr(NFTA_SET_USERDATA, &ud);
    m
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
        let (buf, owners) = encode_batch(family, table, ops, first);
        self.seq = self.seq.wrapping_add(owners.len() as u32 + 2);
        sock.send(&buf, 0)?;
        read_acks(&sock, first, &owners)
    }
}

/// Reads the answers of a batch whose commands are `first + 1 ..= first + n` (`owners[k]`: the
/// operation of command k): every command carries NLM_F_ACK, so the kernel answers each once
/// (0 or its error) when it processed the batch, or answers the batch's first message once with
/// the error of the commit.
fn read_acks(sock: &netlink_sys::Socket, first: u32, owners: &[usize]) -> Result<(), BatchError> {
    let n = owners.len();
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
                refused = Some((owners[index], code));
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


    /// The bodies (nfgenmsg + attributes) of the commands nft 1.0.6 sent for
    /// `nft --debug=mnl -f` of the chains and rules in the test below, on this machine (its
    /// anonymous map's batch id 2 written as ours, 1).
    const NFT_SENT: [(u16, &str); 9] = [
        (2563, "020000000f0001006b7562652d70726f787900000800030073766300"),
        (2563, "020000000f0001006b7562652d70726f787900000800030065703100"),
        (2563, "020000000f0001006b7562652d70726f787900000800030065703200"),
        (2566, "020000000f0001006b7562652d70726f787900000800020073766300bc010480340001800c0001007061796c6f6164002400028008000100000000010800020000000001080003000000001008000400000000042c00018008000100636d700020000280080001000000000108000200000000000c00038008000100ac1e002924000180090001006d6574610000000014000280080002000000001008000100000000012c00018008000100636d700020000280080001000000000108000200000000000c0003800500010006000000340001800c0001007061796c6f6164002400028008000100000000010800020000000002080003000000000208000400000000022c00018008000100636d700020000280080001000000000108000200000000000c0003800600010000500000340001800c0001007061796c6f6164002400028008000100000000010800020000000001080003000000000c08000400000000012c00018008000100636d700020000280080001000000000108000200000000010c000380050001000a000000480001800e000100696d6d656469617465000000340002800800010000000000280002802400028008000100fffffffd180002006d61726b2d666f722d6d61737175657261646500"),
        (2569, "020000000f0001006b7562652d70726f787900000c0002005f5f6d6170256400080003000000000b0800040000000004080005000000000408000600ffffff00080007000000000008000a00000000010c000980080001000000000220000d0000040100000001040000000004080004010000000100060400000000"),
        (2572, "020000000f0001006b7562652d70726f787900000c0002005f5f6d6170256400080004000000000154000380280001800c0001800800010000000000180002801400028008000100fffffffc0800020065703100280002800c0001800800010001000000180002801400028008000100fffffffc0800020065703200"),
        (2566, "020000000f0001006b7562652d70726f78790000080002007376630070000480340001800b0001006e756d67656e0000240002800800010000000001080002000000000208000300000000010800040000000000380001800b0001006c6f6f6b7570000028000280080002000000000108000300000000000c0001005f5f6d61702564000800040000000001"),
        (2566, "020000000f0001006b7562652d70726f787900000800020065703100ac000480340001800c0001007061796c6f6164002400028008000100000000010800020000000001080003000000000c08000400000000042c00018008000100636d700020000280080001000000000108000200000000000c000380080001000ab40001480001800e000100696d6d656469617465000000340002800800010000000000280002802400028008000100fffffffd180002006d61726b2d666f722d6d61737175657261646500"),
        (2566, "020000000f0001006b7562652d70726f787900000800020065703100e400048024000180090001006d6574610000000014000280080002000000001008000100000000012c00018008000100636d700020000280080001000000000108000200000000000c00038005000100060000002c0001800e000100696d6d6564696174650000001800028008000100000000010c000280080001000ab400012c0001800e000100696d6d6564696174650000001800028008000100000000020c000280060001000050000038000180080001006e6174002c00028008000100000000010800020000000002080003000000000108000500000000020800070000000002"),
    ];

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn rules_are_encoded_byte_for_byte_as_nft_sends_them() {
        use crate::nftables::rule::Rule;
        let ep = |c: &str| c.to_string();
        let ops = [
            Op::AddChain("svc".into()),
            Op::AddChain("ep1".into()),
            Op::AddChain("ep2".into()),
            Op::AddRule {
                chain: "svc".into(),
                rule: Rule::MasqueradeService {
                    daddr: "172.30.0.41".parse().unwrap(),
                    proto: Protocol::Tcp,
                    port: 80,
                    except: vec!["10.0.0.0/8".parse().unwrap()],
                },
            },
            Op::AddRule { chain: "svc".into(), rule: Rule::Balance(vec![ep("ep1"), ep("ep2")]) },
            Op::AddRule { chain: "ep1".into(), rule: Rule::Hairpin("10.180.0.1".parse().unwrap()) },
            Op::AddRule { chain: "ep1".into(), rule: Rule::Dnat { proto: Protocol::Tcp, addr: "10.180.0.1".parse().unwrap(), port: 80 } },
        ];
        // the text nft was given
        let text: Vec<String> = ops[3..].iter().map(|o| match o {
            Op::AddRule { rule, .. } => rule.text(),
            _ => unreachable!(),
        }).collect();
        assert_eq!(
            text,
            [
                "ip daddr 172.30.0.41 tcp dport 80 ip saddr != { 10.0.0.0/8 } jump mark-for-masquerade",
                "numgen random mod 2 vmap { 0 : goto ep1, 1 : goto ep2 }",
                "ip saddr 10.180.0.1 jump mark-for-masquerade",
                "meta l4proto tcp dnat to 10.180.0.1:80",
            ]
        );
        let (b, owners) = encode_batch(Family::V4, "kube-proxy", &ops, 0);
        // the vmap rule is three commands: its map, the map's elements, the rule
        assert_eq!(owners, [0, 1, 2, 3, 4, 4, 4, 5, 6]);
        let msgs = nl::messages(&b).unwrap();
        assert_eq!(msgs.len(), NFT_SENT.len() + 2);
        for (i, ((kind, flags, body), (want_kind, want))) in msgs[1..msgs.len() - 1].iter().zip(NFT_SENT).enumerate() {
            assert_eq!(*kind, want_kind, "command {i}");
            assert_eq!(hex(body), want, "command {i}");
            assert!(flags & NLM_F_ACK != 0);
        }
        assert_eq!(msgs[8].1 & (NLM_F_CREATE | NLM_F_APPEND), NLM_F_CREATE | NLM_F_APPEND, "rules are appended");
    }

    #[test]
    fn a_prefix_that_is_not_whole_bytes_is_masked_as_nft_does() {
        use crate::nftables::rule::Rule;
        let r = Rule::MasqueradeService {
            daddr: "172.30.0.41".parse().unwrap(),
            proto: Protocol::Udp,
            port: 53,
            except: vec!["10.16.0.0/12".parse().unwrap()],
        };
        assert!(r.encodable());
        let mut m = Msg::new(0, 0, 0, &[]);
        r.encode(&mut m, 0);
        let b = m.finish();
        let exprs = nl::attrs(&b[16..]).unwrap();
        let names: Vec<&[u8]> = exprs.iter().map(|(_, e)| nl::find(&nl::attrs(e).unwrap(), 1).unwrap()).collect();
        assert_eq!(names, [&b"payload\0"[..], b"cmp\0", b"meta\0", b"cmp\0", b"payload\0", b"cmp\0", b"payload\0", b"bitwise\0", b"cmp\0", b"immediate\0"]);
        // nft: payload load 4b @ network header + 12; bitwise & 0x0000f0ff ^ 0; cmp neq 0x0000100a
        let data = |i: usize| nl::attrs(nl::find(&nl::attrs(exprs[i].1).unwrap(), 2).unwrap()).unwrap();
        assert_eq!(nl::find(&data(6), 3).unwrap(), 12u32.to_be_bytes());
        assert_eq!(nl::find(&data(6), 4).unwrap(), 4u32.to_be_bytes());
        let mask = nl::attrs(nl::find(&data(7), 4).unwrap()).unwrap();
        assert_eq!(nl::find(&mask, 1).unwrap(), [255, 240, 0, 0]);
        let value = nl::attrs(nl::find(&data(8), 3).unwrap()).unwrap();
        assert_eq!(nl::find(&value, 1).unwrap(), [10, 16, 0, 0]);
        assert_eq!(nl::find(&data(8), 2).unwrap(), 1u32.to_be_bytes(), "neq");
        // several CIDRs are an interval set: not encoded, the chain goes through nft -f
        let two = Rule::MasqueradeService {
            daddr: "172.30.0.41".parse().unwrap(),
            proto: Protocol::Udp,
            port: 53,
            except: vec!["10.16.0.0/12".parse().unwrap(), "10.96.0.0/16".parse().unwrap()],
        };
        assert!(!two.encodable());
        assert!(!Rule::Text("fib saddr type local goto x".into()).encodable());
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
