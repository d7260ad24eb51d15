//! The rules of ferro's per-service chains, typed: the nft text (`nft -f`) and the nf_tables
//! expressions (the netlink batch) are both derived from one [`Rule`] value, so the two writers
//! cannot say different things.
//!
//! The expressions are the ones nft 1.0.6 sends for the same text (`nft --debug=netlink`): a
//! match is `payload` (or `meta l4proto`) into register 1 and `cmp`; a one-CIDR anonymous set
//! is folded by nft into a prefix compare (the prefix's whole bytes, or the whole address with
//! a `bitwise` mask when the prefix is not a multiple of 8); `numgen random mod N vmap { .. }`
//! is an anonymous constant verdict map with its elements, looked up with `numgen`'s register;
//! `dnat to A:P` is two `immediate`s and `nat`. Attribute numbers and constants are facts of
//! linux/netfilter/nf_tables.h.
//!
//! A rule nft would write in another way (several CIDRs: an interval set; `fib`; affinity's
//! named sets and `dynset`; comments) is [`Rule::Text`]: a chain that holds one goes through
//! `nft -f`.

use std::fmt::Write as _;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::model::Protocol;
use crate::nl::Msg;

const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;
const NFTA_PAYLOAD_DREG: u16 = 1;
const NFTA_PAYLOAD_BASE: u16 = 2;
const NFTA_PAYLOAD_OFFSET: u16 = 3;
const NFTA_PAYLOAD_LEN: u16 = 4;
const NFTA_CMP_SREG: u16 = 1;
const NFTA_CMP_OP: u16 = 2;
const NFTA_CMP_DATA: u16 = 3;
const NFTA_META_DREG: u16 = 1;
const NFTA_META_KEY: u16 = 2;
const NFTA_BITWISE_SREG: u16 = 1;
const NFTA_BITWISE_DREG: u16 = 2;
const NFTA_BITWISE_LEN: u16 = 3;
const NFTA_BITWISE_MASK: u16 = 4;
const NFTA_BITWISE_XOR: u16 = 5;
const NFTA_IMMEDIATE_DREG: u16 = 1;
const NFTA_IMMEDIATE_DATA: u16 = 2;
const NFTA_NG_DREG: u16 = 1;
const NFTA_NG_MODULUS: u16 = 2;
const NFTA_NG_TYPE: u16 = 3;
const NFTA_NG_OFFSET: u16 = 4;
const NFTA_LOOKUP_SET: u16 = 1;
const NFTA_LOOKUP_SREG: u16 = 2;
const NFTA_LOOKUP_DREG: u16 = 3;
const NFTA_LOOKUP_SET_ID: u16 = 4;
const NFTA_NAT_TYPE: u16 = 1;
const NFTA_NAT_FAMILY: u16 = 2;
const NFTA_NAT_REG_ADDR_MIN: u16 = 3;
const NFTA_NAT_REG_PROTO_MIN: u16 = 5;
const NFTA_NAT_FLAGS: u16 = 7;

const NFT_REG_VERDICT: u32 = 0;
const NFT_REG_1: u32 = 1;
const NFT_REG_2: u32 = 2;
const NFT_PAYLOAD_NETWORK_HEADER: u32 = 1;
const NFT_PAYLOAD_TRANSPORT_HEADER: u32 = 2;
const NFT_CMP_EQ: u32 = 0;
const NFT_CMP_NEQ: u32 = 1;
const NFT_META_L4PROTO: u32 = 16;
const NFT_NG_RANDOM: u32 = 1;
const NFT_NAT_DNAT: u32 = 1;
const NF_NAT_RANGE_PROTO_SPECIFIED: u32 = 2;
pub(crate) const NFT_JUMP: i32 = -3;
pub(crate) const NFT_GOTO: i32 = -4;
const NFPROTO_IPV4: u32 = 2;
const NFPROTO_IPV6: u32 = 10;

/// The chain every masquerade rule jumps to.
pub const MARK_CHAIN: &str = "mark-for-masquerade";

/// One rule of a per-service chain.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Rule {
    /// `<af> daddr D <proto> dport P [<af> saddr != { CIDRs }] jump mark-for-masquerade`:
    /// traffic to the service from outside the cluster CIDRs (all traffic when `except` is
    /// empty, `--masquerade-all`) is masqueraded.
    MasqueradeService {
        daddr: IpAddr,
        proto: Protocol,
        port: u16,
        except: Vec<IpNet>,
    },
    /// `numgen random mod N vmap { 0 : goto C0, 1 : goto C1, .. }`.
    Balance(Vec<String>),
    /// `<af> saddr A jump mark-for-masquerade`: hairpin (an endpoint reaching itself).
    Hairpin(IpAddr),
    /// `meta l4proto P dnat to A:port`.
    Dnat {
        proto: Protocol,
        addr: IpAddr,
        port: u16,
    },
    /// `jump C`.
    Jump(String),
    /// `goto C`.
    Goto(String),
    /// A rule written as nft text only (see the module's note).
    Text(String),
}

fn af(ip: &IpAddr) -> &'static str {
    if ip.is_ipv4() {
        "ip"
    } else {
        "ip6"
    }
}

fn addr_bytes(ip: &IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// Network-header offsets of the source and destination address.
fn addr_offsets(ip: &IpAddr) -> (u32, u32) {
    if ip.is_ipv4() {
        (12, 16)
    } else {
        (8, 24)
    }
}

pub(crate) fn proto_number(p: Protocol) -> u8 {
    match p {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
    }
}

impl Rule {
    /// The rule as nft spells it (the part after `add rule <family> <table> <chain>`).
    pub fn text(&self) -> String {
        match self {
            Rule::MasqueradeService {
                daddr,
                proto,
                port,
                except,
            } => {
                let af = af(daddr);
                let mut t = format!("{af} daddr {daddr} {} dport {port}", proto.lower());
                if !except.is_empty() {
                    let set: Vec<String> = except.iter().map(|c| c.to_string()).collect();
                    let _ = write!(t, " {af} saddr != {{ {} }}", set.join(", "));
                }
                t.push_str(" jump ");
                t.push_str(MARK_CHAIN);
                t
            }
            Rule::Balance(chains) => {
                let arms: Vec<String> = chains
                    .iter()
                    .enumerate()
                    .map(|(i, c)| format!("{i} : goto {c}"))
                    .collect();
                format!(
                    "numgen random mod {} vmap {{ {} }}",
                    chains.len(),
                    arms.join(", ")
                )
            }
            Rule::Hairpin(ip) => format!("{} saddr {ip} jump {MARK_CHAIN}", af(ip)),
            Rule::Dnat { proto, addr, port } => match addr {
                IpAddr::V4(a) => format!("meta l4proto {} dnat to {a}:{port}", proto.lower()),
                IpAddr::V6(a) => format!("meta l4proto {} dnat to [{a}]:{port}", proto.lower()),
            },
            Rule::Jump(c) => format!("jump {c}"),
            Rule::Goto(c) => format!("goto {c}"),
            Rule::Text(t) => t.clone(),
        }
    }

    /// Whether [`Rule::encode`] writes it as nft would.
    pub fn encodable(&self) -> bool {
        match self {
            Rule::MasqueradeService { daddr, except, .. } => match except.as_slice() {
                [] => true,
                // one CIDR of the service's family, folded by nft into a prefix compare
                [net] => net.prefix_len() > 0 && net.addr().is_ipv4() == daddr.is_ipv4(),
                _ => false,
            },
            Rule::Balance(chains) => !chains.is_empty(),
            Rule::Hairpin(_) | Rule::Dnat { .. } | Rule::Jump(_) | Rule::Goto(_) => true,
            Rule::Text(_) => false,
        }
    }

    /// The anonymous map the rule needs, created (NFT_MSG_NEWSET, NEWSETELEM) before the rule
    /// in the same batch: its elements (key, chain), for `Balance`.
    pub fn anonymous_map(&self) -> Option<Vec<(u32, &str)>> {
        match self {
            Rule::Balance(chains) => Some(
                chains
                    .iter()
                    .enumerate()
                    .map(|(i, c)| (i as u32, c.as_str()))
                    .collect(),
            ),
            _ => None,
        }
    }

    /// The rule's expressions (the payload of NFTA_RULE_EXPRESSIONS). `set_id` is the batch id
    /// of the rule's anonymous map, if it has one.
    pub fn encode(&self, m: &mut Msg, set_id: u32) {
        match self {
            Rule::MasqueradeService {
                daddr,
                proto,
                port,
                except,
            } => {
                let (saddr_off, daddr_off) = addr_offsets(daddr);
                let a = addr_bytes(daddr);
                payload(m, NFT_PAYLOAD_NETWORK_HEADER, daddr_off, a.len() as u32);
                cmp(m, NFT_CMP_EQ, &a);
                meta_l4proto(m);
                cmp(m, NFT_CMP_EQ, &[proto_number(*proto)]);
                payload(m, NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2);
                cmp(m, NFT_CMP_EQ, &port.to_be_bytes());
                if let Some(net) = except.first() {
                    prefix_neq(m, saddr_off, net);
                }
                verdict(m, NFT_JUMP, MARK_CHAIN);
            }
            Rule::Balance(chains) => {
                expr(m, "numgen", |m| {
                    m.attr(NFTA_NG_DREG, &NFT_REG_1.to_be_bytes())
                        .attr(NFTA_NG_MODULUS, &(chains.len() as u32).to_be_bytes())
                        .attr(NFTA_NG_TYPE, &NFT_NG_RANDOM.to_be_bytes())
                        .attr(NFTA_NG_OFFSET, &0u32.to_be_bytes());
                });
                expr(m, "lookup", |m| {
                    m.attr(NFTA_LOOKUP_SREG, &NFT_REG_1.to_be_bytes())
                        .attr(NFTA_LOOKUP_DREG, &NFT_REG_VERDICT.to_be_bytes())
                        .str(NFTA_LOOKUP_SET, ANON_MAP)
                        .attr(NFTA_LOOKUP_SET_ID, &set_id.to_be_bytes());
                });
            }
            Rule::Hairpin(ip) => {
                let a = addr_bytes(ip);
                payload(
                    m,
                    NFT_PAYLOAD_NETWORK_HEADER,
                    addr_offsets(ip).0,
                    a.len() as u32,
                );
                cmp(m, NFT_CMP_EQ, &a);
                verdict(m, NFT_JUMP, MARK_CHAIN);
            }
            Rule::Dnat { proto, addr, port } => {
                meta_l4proto(m);
                cmp(m, NFT_CMP_EQ, &[proto_number(*proto)]);
                immediate(m, NFT_REG_1, &addr_bytes(addr));
                immediate(m, NFT_REG_2, &port.to_be_bytes());
                let family = if addr.is_ipv4() {
                    NFPROTO_IPV4
                } else {
                    NFPROTO_IPV6
                };
                expr(m, "nat", |m| {
                    m.attr(NFTA_NAT_TYPE, &NFT_NAT_DNAT.to_be_bytes())
                        .attr(NFTA_NAT_FAMILY, &family.to_be_bytes())
                        .attr(NFTA_NAT_REG_ADDR_MIN, &NFT_REG_1.to_be_bytes())
                        .attr(NFTA_NAT_REG_PROTO_MIN, &NFT_REG_2.to_be_bytes())
                        .attr(NFTA_NAT_FLAGS, &NF_NAT_RANGE_PROTO_SPECIFIED.to_be_bytes());
                });
            }
            Rule::Jump(c) => verdict(m, NFT_JUMP, c),
            Rule::Goto(c) => verdict(m, NFT_GOTO, c),
            // never encoded: the backend sends a chain holding one through nft -f
            Rule::Text(_) => {}
        }
    }
}

/// The name nft gives an anonymous map in a batch; the kernel makes it unique (`__map0`..).
pub const ANON_MAP: &str = "__map%d";

/// One expression: NFTA_LIST_ELEM { NFTA_EXPR_NAME, NFTA_EXPR_DATA { .. } }.
fn expr(m: &mut Msg, name: &str, data: impl FnOnce(&mut Msg)) {
    m.nest(NFTA_LIST_ELEM, |m| {
        m.str(NFTA_EXPR_NAME, name);
        m.nest(NFTA_EXPR_DATA, data);
    });
}

fn payload(m: &mut Msg, base: u32, offset: u32, len: u32) {
    expr(m, "payload", |m| {
        m.attr(NFTA_PAYLOAD_DREG, &NFT_REG_1.to_be_bytes())
            .attr(NFTA_PAYLOAD_BASE, &base.to_be_bytes())
            .attr(NFTA_PAYLOAD_OFFSET, &offset.to_be_bytes())
            .attr(NFTA_PAYLOAD_LEN, &len.to_be_bytes());
    });
}

fn cmp(m: &mut Msg, op: u32, value: &[u8]) {
    expr(m, "cmp", |m| {
        m.attr(NFTA_CMP_SREG, &NFT_REG_1.to_be_bytes())
            .attr(NFTA_CMP_OP, &op.to_be_bytes());
        m.nest(NFTA_CMP_DATA, |m| {
            m.attr(NFTA_DATA_VALUE, value);
        });
    });
}

fn meta_l4proto(m: &mut Msg) {
    expr(m, "meta", |m| {
        m.attr(NFTA_META_KEY, &NFT_META_L4PROTO.to_be_bytes())
            .attr(NFTA_META_DREG, &NFT_REG_1.to_be_bytes());
    });
}

/// `saddr != NET` as nft folds it: the prefix's bytes compared, or (a prefix that is not a
/// multiple of 8) the whole address masked with `bitwise` and compared.
fn prefix_neq(m: &mut Msg, offset: u32, net: &IpNet) {
    let bits = u32::from(net.prefix_len());
    let a = addr_bytes(&net.network());
    if bits % 8 == 0 {
        let n = (bits / 8) as usize;
        payload(m, NFT_PAYLOAD_NETWORK_HEADER, offset, n as u32);
        cmp(m, NFT_CMP_NEQ, &a[..n]);
    } else {
        let mask = addr_bytes(&net.netmask());
        payload(m, NFT_PAYLOAD_NETWORK_HEADER, offset, a.len() as u32);
        expr(m, "bitwise", |m| {
            m.attr(NFTA_BITWISE_SREG, &NFT_REG_1.to_be_bytes())
                .attr(NFTA_BITWISE_DREG, &NFT_REG_1.to_be_bytes())
                .attr(NFTA_BITWISE_LEN, &(a.len() as u32).to_be_bytes());
            m.nest(NFTA_BITWISE_MASK, |m| {
                m.attr(NFTA_DATA_VALUE, &mask);
            });
            m.nest(NFTA_BITWISE_XOR, |m| {
                m.attr(NFTA_DATA_VALUE, &vec![0u8; a.len()]);
            });
        });
        cmp(m, NFT_CMP_NEQ, &a);
    }
}

fn immediate(m: &mut Msg, reg: u32, value: &[u8]) {
    expr(m, "immediate", |m| {
        m.attr(NFTA_IMMEDIATE_DREG, &reg.to_be_bytes());
        m.nest(NFTA_IMMEDIATE_DATA, |m| {
            m.attr(NFTA_DATA_VALUE, value);
        });
    });
}

fn verdict(m: &mut Msg, code: i32, chain: &str) {
    expr(m, "immediate", |m| {
        m.attr(NFTA_IMMEDIATE_DREG, &NFT_REG_VERDICT.to_be_bytes());
        m.nest(NFTA_IMMEDIATE_DATA, |m| {
            m.nest(NFTA_DATA_VERDICT, |m| {
                m.attr(NFTA_VERDICT_CODE, &code.to_be_bytes())
                    .str(NFTA_VERDICT_CHAIN, chain);
            });
        });
    });
}
