//! A packet tracer over the `iptables-restore --noflush` text ferro-proxy renders: the text is
//! loaded into a [`Ruleset`] the way iptables-restore would (tables committed at `COMMIT`,
//! `:CHAIN - [0:0]` creating or flushing a chain, `-A`, `-I`, `-X`, jumps checked at commit),
//! and a [`Packet`] is followed through it (see [`crate::trace`] for the path and the answer).
//!
//! Only what ferro emits is understood: `-s`/`-d` (with `!`), `-p`, `-m tcp|udp|sctp --dport`,
//! `-m addrtype --dst-type|--src-type LOCAL`, `-m comment`, `-m statistic --mode random`
//! (both ways), `-m recent` (`--rcheck` both ways, `--set`), `-m mark`, `-m conntrack
//! --ctstate` (the traced packet is NEW), and the targets ACCEPT, DROP, REJECT, RETURN, a
//! chain, DNAT, MARK, MASQUERADE. Anything else is an error: the tracer never skips a rule it
//! does not understand.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;

use crate::trace::{walk, BaseChain, Flow, Hook, Packet, PacketState, PathError, Rules, Trace, Tri, MAX_DEPTH};

/// Text the tracer cannot load, or rules it cannot follow.
#[derive(Debug, thiserror::Error)]
pub enum IptablesTraceError {
    #[error("line {line}: {reason}: {text}")]
    Parse { line: usize, text: String, reason: String },
    #[error("table {table}: chain {chain} jumps to {target}, which does not exist")]
    DanglingJump {
        table: String,
        chain: String,
        target: String,
    },
    #[error("table {table}: no chain {chain}")]
    NoChain { table: String, chain: String },
    #[error("chains nest deeper than {MAX_DEPTH} at {chain} (a loop?)")]
    TooDeep { chain: String },
    #[error(transparent)]
    Path(#[from] PathError),
}

/// The tables as iptables-restore would leave them.
#[derive(Debug, Clone, Default)]
pub struct Ruleset {
    tables: BTreeMap<String, Table>,
}

#[derive(Debug, Clone, Default)]
struct Table {
    chains: BTreeMap<String, Chain>,
}

#[derive(Debug, Clone, Default)]
struct Chain {
    builtin: bool,
    policy_drop: bool,
    rules: Vec<Rule>,
}

#[derive(Debug, Clone)]
struct Rule {
    matches: Vec<Match>,
    target: Target,
}

#[derive(Debug, Clone)]
enum Match {
    Src {
        net: IpNet,
        neg: bool,
    },
    Dst {
        net: IpNet,
        neg: bool,
    },
    /// `-p`: a protocol name, "all" for any.
    Proto {
        name: String,
        neg: bool,
    },
    Dport {
        proto: String,
        port: u16,
        neg: bool,
    },
    /// `-m addrtype --src-type|--dst-type LOCAL`.
    Local {
        src: bool,
        neg: bool,
    },
    Mark {
        value: u32,
        mask: u32,
        neg: bool,
    },
    /// `-m conntrack --ctstate`: whether the list names NEW.
    CtNew {
        new: bool,
        neg: bool,
    },
    /// `statistic` or `recent --rcheck`: either way.
    Random,
}

#[derive(Debug, Clone)]
enum Target {
    /// No `-j`: the rule only counts.
    None,
    Jump(String),
    Return,
    Accept,
    Drop,
    Reject,
    Dnat {
        ip: IpAddr,
        port: Option<u16>,
    },
    /// mark = (mark & !clear) ^ xor
    Mark {
        clear: u32,
        xor: u32,
    },
    Masquerade,
}

/// The built-in chains of a table.
fn builtins(table: &str) -> Option<&'static [&'static str]> {
    Some(match table {
        "raw" => &["PREROUTING", "OUTPUT"],
        "mangle" => &["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"],
        "nat" => &["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"],
        "filter" => &["INPUT", "FORWARD", "OUTPUT"],
        "security" => &["INPUT", "FORWARD", "OUTPUT"],
        _ => return None,
    })
}

/// Splits a rule line into words; a double-quoted string (with `\"` and `\\`) is one word.
fn words(line: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(e) => cur.push(e),
                            None => return Err("unterminated quote".into()),
                        },
                        Some(o) => cur.push(o),
                        None => return Err("unterminated quote".into()),
                    }
                }
            }
            c if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                cur.push(c);
            }
        }
    }
    if in_word {
        out.push(cur);
    }
    Ok(out)
}

fn parse_net(s: &str) -> Result<IpNet, String> {
    if let Ok(n) = s.parse::<IpNet>() {
        return Ok(n);
    }
    s.parse::<IpAddr>()
        .map(IpNet::from)
        .map_err(|_| format!("{s:?} is not an address or CIDR"))
}

fn parse_u32(s: &str) -> Result<u32, String> {
    let r = match s.strip_prefix("0x") {
        Some(h) => u32::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|_| format!("{s:?} is not a number"))
}

/// `V` or `V/M` (M defaults to all bits).
fn parse_mark(s: &str) -> Result<(u32, u32), String> {
    match s.split_once('/') {
        Some((v, m)) => Ok((parse_u32(v)?, parse_u32(m)?)),
        None => Ok((parse_u32(s)?, u32::MAX)),
    }
}

/// "ip", "ip:port", "[ip6]:port".
fn parse_dnat(s: &str) -> Result<(IpAddr, Option<u16>), String> {
    let bad = || format!("{s:?} is not a DNAT destination");
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Ok((ip, None));
    }
    let a: SocketAddr = s.parse().map_err(|_| bad())?;
    Ok((a.ip(), Some(a.port())))
}

const MODULES: &[&str] = &[
    "tcp",
    "udp",
    "sctp",
    "comment",
    "statistic",
    "recent",
    "addrtype",
    "mark",
    "conntrack",
];

/// Parses the words after `-A CHAIN`.
fn parse_rule(w: &[String]) -> Result<Rule, String> {
    let mut matches = Vec::new();
    let mut modules: Vec<&str> = Vec::new();
    let mut proto: Option<String> = None;
    let mut neg = false;
    let mut i = 0;
    let value = |i: usize| -> Result<&str, String> {
        w.get(i + 1)
            .map(String::as_str)
            .ok_or_else(|| format!("{} needs a value", w[i]))
    };
    let need = |modules: &[&str], m: &str, opt: &str| -> Result<(), String> {
        if modules.contains(&m) {
            Ok(())
        } else {
            Err(format!("{opt} without -m {m}"))
        }
    };
    while i < w.len() {
        let opt = w[i].as_str();
        if opt == "!" {
            if neg {
                return Err("two ! in a row".into());
            }
            neg = true;
            i += 1;
            continue;
        }
        let negatable = matches!(
            opt,
            "-s" | "--source"
                | "-d"
                | "--destination"
                | "-p"
                | "--protocol"
                | "--dport"
                | "--destination-port"
                | "--dst-type"
                | "--src-type"
                | "--mark"
                | "--ctstate"
        );
        if neg && !negatable {
            return Err(format!("{opt} cannot be negated"));
        }
        let mut step = 2;
        match opt {
            "-s" | "--source" => matches.push(Match::Src {
                net: parse_net(value(i)?)?,
                neg,
            }),
            "-d" | "--destination" => matches.push(Match::Dst {
                net: parse_net(value(i)?)?,
                neg,
            }),
            "-p" | "--protocol" => {
                let name = value(i)?.to_ascii_lowercase();
                if !["tcp", "udp", "sctp", "icmp", "ipv6-icmp", "all"].contains(&name.as_str()) {
                    return Err(format!("unknown protocol {name:?}"));
                }
                proto = Some(name.clone());
                matches.push(Match::Proto { name, neg });
            }
            "-m" | "--match" => {
                let m = value(i)?;
                let Some(known) = MODULES.iter().find(|k| **k == m) else {
                    return Err(format!("unknown match -m {m}"));
                };
                modules.push(known);
            }
            "--dport" | "--destination-port" => {
                let Some(l4) = modules.iter().rev().find(|m| ["tcp", "udp", "sctp"].contains(*m)) else {
                    return Err(format!("{opt} without -m tcp|udp|sctp"));
                };
                let v = value(i)?;
                let port = v.parse::<u16>().map_err(|_| format!("{v:?} is not a port"))?;
                matches.push(Match::Dport {
                    proto: l4.to_string(),
                    port,
                    neg,
                });
            }
            "--comment" => {
                need(&modules, "comment", opt)?;
                value(i)?;
            }
            "--mode" => {
                need(&modules, "statistic", opt)?;
                if value(i)? != "random" {
                    return Err(format!("statistic mode {:?} is not followed", value(i)?));
                }
            }
            "--probability" => {
                need(&modules, "statistic", opt)?;
                let v = value(i)?;
                match v.parse::<f64>() {
                    Ok(p) if (0.0..=1.0).contains(&p) => matches.push(Match::Random),
                    _ => return Err(format!("{v:?} is not a probability")),
                }
            }
            "--name" | "--seconds" | "--mask" => {
                need(&modules, "recent", opt)?;
                value(i)?;
            }
            "--rcheck" | "--update" => {
                need(&modules, "recent", opt)?;
                matches.push(Match::Random);
                step = 1;
            }
            "--set" | "--reap" | "--rsource" => {
                need(&modules, "recent", opt)?;
                step = 1;
            }
            "--dst-type" | "--src-type" => {
                need(&modules, "addrtype", opt)?;
                if value(i)? != "LOCAL" {
                    return Err(format!("address type {:?} is not followed", value(i)?));
                }
                matches.push(Match::Local {
                    src: opt == "--src-type",
                    neg,
                });
            }
            "--mark" => {
                need(&modules, "mark", opt)?;
                let (value, mask) = parse_mark(value(i)?)?;
                matches.push(Match::Mark { value, mask, neg });
            }
            "--ctstate" => {
                need(&modules, "conntrack", opt)?;
                let mut new = false;
                for s in value(i)?.split(',') {
                    match s {
                        "NEW" => new = true,
                        "ESTABLISHED" | "RELATED" | "INVALID" | "UNTRACKED" => {}
                        other => return Err(format!("conntrack state {other:?} is not followed")),
                    }
                }
                matches.push(Match::CtNew { new, neg });
            }
            "-j" | "--jump" => {
                check_l4(&modules, proto.as_deref())?;
                let target = parse_target(value(i)?, &w[i + 2..])?;
                return Ok(Rule { matches, target });
            }
            other => return Err(format!("unknown option {other:?}")),
        }
        neg = false;
        i += step;
    }
    if neg {
        return Err("! at the end".into());
    }
    check_l4(&modules, proto.as_deref())?;
    Ok(Rule {
        matches,
        target: Target::None,
    })
}

/// `-m tcp` needs `-p tcp` (in either order), as iptables checks.
fn check_l4(modules: &[&str], proto: Option<&str>) -> Result<(), String> {
    match modules.iter().find(|m| ["tcp", "udp", "sctp"].contains(*m)) {
        Some(m) if proto != Some(*m) => Err(format!("-m {m} without -p {m}")),
        _ => Ok(()),
    }
}

fn parse_target(name: &str, opts: &[String]) -> Result<Target, String> {
    let o: Vec<&str> = opts.iter().map(String::as_str).collect();
    let none = |t: Target| {
        if o.is_empty() {
            Ok(t)
        } else {
            Err(format!("-j {name} takes no {:?}", o[0]))
        }
    };
    match name {
        "ACCEPT" => none(Target::Accept),
        "DROP" => none(Target::Drop),
        "RETURN" => none(Target::Return),
        "REJECT" => match o.as_slice() {
            [] | ["--reject-with", _] => Ok(Target::Reject),
            _ => Err(format!("-j REJECT options {o:?} are not followed")),
        },
        "DNAT" => match o.as_slice() {
            ["--to-destination", d] => {
                let (ip, port) = parse_dnat(d)?;
                Ok(Target::Dnat { ip, port })
            }
            _ => Err(format!("-j DNAT options {o:?} are not followed")),
        },
        "MASQUERADE" => match o.as_slice() {
            [] | ["--random-fully"] | ["--random"] => Ok(Target::Masquerade),
            _ => Err(format!("-j MASQUERADE options {o:?} are not followed")),
        },
        "MARK" => {
            let [op, v] = o.as_slice() else {
                return Err(format!("-j MARK options {o:?} are not followed"));
            };
            let (value, mask) = parse_mark(v)?;
            let whole = mask == u32::MAX;
            match *op {
                "--or-mark" if whole => Ok(Target::Mark {
                    clear: value,
                    xor: value,
                }),
                "--xor-mark" if whole => Ok(Target::Mark { clear: 0, xor: value }),
                "--and-mark" if whole => Ok(Target::Mark { clear: !value, xor: 0 }),
                "--set-xmark" => Ok(Target::Mark {
                    clear: mask,
                    xor: value,
                }),
                "--set-mark" => Ok(Target::Mark {
                    clear: mask | value,
                    xor: value,
                }),
                _ => Err(format!("-j MARK {op} {v} is not followed")),
            }
        }
        "SNAT" | "REDIRECT" | "LOG" | "NFLOG" | "CT" | "NOTRACK" | "TPROXY" | "CONNMARK" | "TRACE" | "QUEUE"
        | "NFQUEUE" => Err(format!("target {name} is not followed")),
        chain if chain.starts_with('-') => Err(format!("{chain:?} is not a target")),
        chain => none(Target::Jump(chain.to_string())),
    }
}

impl Table {
    fn new(name: &str) -> Option<Table> {
        let chains = builtins(name)?
            .iter()
            .map(|c| {
                (
                    c.to_string(),
                    Chain {
                        builtin: true,
                        ..Chain::default()
                    },
                )
            })
            .collect();
        Some(Table { chains })
    }

    /// iptables-restore refuses a table whose rules jump to a chain it does not have.
    fn check(&self, table: &str) -> Result<(), IptablesTraceError> {
        for (name, c) in &self.chains {
            for r in &c.rules {
                if let Target::Jump(t) = &r.target {
                    if self.chains.get(t).is_none_or(|c| c.builtin) {
                        return Err(IptablesTraceError::DanglingJump {
                            table: table.to_string(),
                            chain: name.clone(),
                            target: t.clone(),
                        });
                    }
                }
            }
        }
        Ok(())
    }
}

impl Ruleset {
    /// The rules `text` leaves in empty tables.
    pub fn parse(text: &str) -> Result<Ruleset, IptablesTraceError> {
        let mut r = Ruleset::default();
        r.apply(text)?;
        Ok(r)
    }

    /// Applies one `iptables-restore --noflush` input; nothing changes when any of it is
    /// refused (iptables-restore commits per table; ferro's inputs are all or nothing).
    pub fn apply(&mut self, text: &str) -> Result<(), IptablesTraceError> {
        let mut next = self.clone();
        let mut current: Option<(String, Table)> = None;
        for (i, raw) in text.lines().enumerate() {
            let l = raw.trim();
            if l.is_empty() || l.starts_with('#') {
                continue;
            }
            let err = |reason: String| IptablesTraceError::Parse {
                line: i + 1,
                text: l.to_string(),
                reason,
            };
            if let Some(t) = l.strip_prefix('*') {
                if current.is_some() {
                    return Err(err("a table starts before COMMIT".into()));
                }
                let table = match next.tables.get(t) {
                    Some(t) => t.clone(),
                    None => Table::new(t).ok_or_else(|| err(format!("unknown table {t:?}")))?,
                };
                current = Some((t.to_string(), table));
                continue;
            }
            if l == "COMMIT" {
                let (name, table) = current.take().ok_or_else(|| err("COMMIT outside a table".into()))?;
                table.check(&name)?;
                next.tables.insert(name, table);
                continue;
            }
            let Some((_, table)) = current.as_mut() else {
                return Err(err("a rule outside a table".into()));
            };
            if let Some(decl) = l.strip_prefix(':') {
                let mut w = decl.split_whitespace();
                let (Some(name), Some(policy)) = (w.next(), w.next()) else {
                    return Err(err("a chain needs a name and a policy".into()));
                };
                match table.chains.get_mut(name) {
                    Some(c) if c.builtin => match policy {
                        "ACCEPT" => c.policy_drop = false,
                        "DROP" => c.policy_drop = true,
                        p => return Err(err(format!("policy {p:?} is not followed"))),
                    },
                    Some(_) if policy != "-" => return Err(err("a user chain has no policy".into())),
                    // --noflush: declaring an existing chain flushes it
                    Some(c) => c.rules.clear(),
                    None if policy != "-" => return Err(err("a user chain has no policy".into())),
                    None => {
                        table.chains.insert(name.to_string(), Chain::default());
                    }
                }
                continue;
            }
            let w = words(l).map_err(err)?;
            let (Some(cmd), Some(chain)) = (w.first(), w.get(1)) else {
                return Err(err("a command needs a chain".into()));
            };
            match cmd.as_str() {
                "-A" | "--append" => {
                    let rule = parse_rule(&w[2..]).map_err(err)?;
                    let c = table
                        .chains
                        .get_mut(chain)
                        .ok_or_else(|| err(format!("no chain {chain}")))?;
                    c.rules.push(rule);
                }
                "-I" | "--insert" => {
                    let (pos, rest) = match w.get(2).and_then(|n| n.parse::<usize>().ok()) {
                        Some(n) if n >= 1 => (n - 1, &w[3..]),
                        Some(_) => return Err(err("rule numbers start at 1".into())),
                        None => (0, &w[2..]),
                    };
                    let rule = parse_rule(rest).map_err(err)?;
                    let c = table
                        .chains
                        .get_mut(chain)
                        .ok_or_else(|| err(format!("no chain {chain}")))?;
                    if pos > c.rules.len() {
                        return Err(err(format!("chain {chain} has no rule {pos}")));
                    }
                    c.rules.insert(pos, rule);
                }
                "-X" | "--delete-chain" => {
                    if w.len() != 2 {
                        return Err(err("-X takes one chain".into()));
                    }
                    match table.chains.get(chain) {
                        Some(c) if c.builtin => return Err(err(format!("{chain} is built in"))),
                        Some(_) => {
                            table.chains.remove(chain);
                        }
                        None => return Err(err(format!("no chain {chain}"))),
                    }
                }
                other => return Err(err(format!("unknown command {other:?}"))),
            }
        }
        if let Some((name, _)) = current {
            return Err(IptablesTraceError::Parse {
                line: text.lines().count(),
                text: format!("*{name}"),
                reason: "no COMMIT".into(),
            });
        }
        *self = next;
        Ok(())
    }

    /// Every outcome of `packet`; `local` are the node's addresses.
    pub fn trace(&self, packet: &Packet, local: &[IpAddr]) -> Result<Trace, IptablesTraceError> {
        walk(&Tracer { rules: self, local }, packet, local)
    }

    /// The chains of a table (for tests and diagnostics).
    pub fn chains(&self, table: &str) -> Vec<String> {
        self.tables
            .get(table)
            .map(|t| t.chains.keys().cloned().collect())
            .unwrap_or_default()
    }
}

struct Tracer<'a> {
    rules: &'a Ruleset,
    local: &'a [IpAddr],
}

impl Tracer<'_> {
    fn is_local(&self, ip: &IpAddr) -> bool {
        ip.is_loopback() || self.local.contains(ip)
    }

    fn eval(&self, m: &Match, st: &PacketState) -> Tri {
        let b = match m {
            Match::Src { net, neg } => net.contains(&st.src) != *neg,
            Match::Dst { net, neg } => net.contains(&st.dst) != *neg,
            Match::Proto { name, neg } => (name == "all" || name == st.protocol.lower()) != *neg,
            Match::Dport { proto, port, neg } => (proto == st.protocol.lower() && *port == st.port) != *neg,
            Match::Local { src, neg } => self.is_local(if *src { &st.src } else { &st.dst }) != *neg,
            Match::Mark { value, mask, neg } => (st.mark & mask == *value) != *neg,
            Match::CtNew { new, neg } => *new != *neg,
            Match::Random => return Tri::Either,
        };
        Tri::of(b)
    }

    fn run_chain(
        &self,
        table: &str,
        chain: &str,
        st: PacketState,
        depth: usize,
    ) -> Result<Vec<(PacketState, Flow)>, IptablesTraceError> {
        if depth > MAX_DEPTH {
            return Err(IptablesTraceError::TooDeep {
                chain: chain.to_string(),
            });
        }
        let c = self
            .rules
            .tables
            .get(table)
            .and_then(|t| t.chains.get(chain))
            .ok_or_else(|| IptablesTraceError::NoChain {
                table: table.to_string(),
                chain: chain.to_string(),
            })?;
        self.run_rules(table, &c.rules, 0, st, depth)
    }

    fn run_rules(
        &self,
        table: &str,
        rules: &[Rule],
        from: usize,
        mut st: PacketState,
        depth: usize,
    ) -> Result<Vec<(PacketState, Flow)>, IptablesTraceError> {
        let mut out = Vec::new();
        for (i, r) in rules.iter().enumerate().skip(from) {
            let m = r.matches.iter().fold(Tri::Yes, |acc, m| acc.and(self.eval(m, &st)));
            match m {
                Tri::No => continue,
                // the packet that does not match goes on with the next rule
                Tri::Either => out.extend(self.run_rules(table, rules, i + 1, st.clone(), depth)?),
                Tri::Yes => {}
            }
            let flow = match &r.target {
                Target::None => continue,
                Target::Mark { clear, xor } => {
                    st.mark = (st.mark & !clear) ^ xor;
                    continue;
                }
                Target::Return => Flow::Return,
                Target::Accept => Flow::Accept,
                Target::Drop => Flow::Drop,
                Target::Reject => Flow::Reject,
                Target::Masquerade => Flow::Masquerade,
                Target::Dnat { ip, port } => Flow::Dnat(SocketAddr::new(*ip, port.unwrap_or(st.port))),
                Target::Jump(c) => {
                    for (s, f) in self.run_chain(table, c, st, depth + 1)? {
                        match f {
                            Flow::Return => out.extend(self.run_rules(table, rules, i + 1, s, depth)?),
                            f => out.push((s, f)),
                        }
                    }
                    return Ok(out);
                }
            };
            out.push((st, flow));
            return Ok(out);
        }
        out.push((st, Flow::Return));
        Ok(out)
    }
}

impl Rules for Tracer<'_> {
    type Error = IptablesTraceError;

    fn base_chains(&self, hook: Hook, _family_v4: bool) -> Vec<BaseChain> {
        // the tables of a hook in the order of their priorities
        let (chain, order): (&str, &[(&str, i32)]) = match hook {
            Hook::Prerouting => ("PREROUTING", &[("raw", -300), ("mangle", -150), ("nat", -100)]),
            Hook::Input => (
                "INPUT",
                &[("mangle", -150), ("filter", 0), ("security", 50), ("nat", 100)],
            ),
            Hook::Forward => ("FORWARD", &[("mangle", -150), ("filter", 0), ("security", 50)]),
            Hook::Output => (
                "OUTPUT",
                &[
                    ("raw", -300),
                    ("mangle", -150),
                    ("nat", -100),
                    ("filter", 0),
                    ("security", 50),
                ],
            ),
            Hook::Postrouting => ("POSTROUTING", &[("mangle", -150), ("nat", 100)]),
        };
        order
            .iter()
            .filter_map(|(t, prio)| {
                let c = self.rules.tables.get(*t)?.chains.get(chain)?;
                Some(BaseChain {
                    table: t.to_string(),
                    chain: chain.to_string(),
                    priority: *prio,
                    policy_drop: c.policy_drop,
                })
            })
            .collect()
    }

    fn run(&self, chain: &BaseChain, st: PacketState) -> Result<Vec<(PacketState, Flow)>, IptablesTraceError> {
        self.run_chain(&chain.table, &chain.chain, st, 0)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::model::Protocol;
    use crate::trace::{Outcome, Verdict};

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn out(v: Verdict, masquerade: bool) -> Outcome {
        Outcome { verdict: v, masquerade }
    }

    fn dnat(a: &str, masquerade: bool) -> Outcome {
        out(Verdict::Dnat(a.parse().unwrap()), masquerade)
    }

    const NAT: &str = "*nat\n\
        :KUBE-SERVICES - [0:0]\n:KUBE-SVC-A - [0:0]\n:KUBE-SEP-1 - [0:0]\n:KUBE-SEP-2 - [0:0]\n\
        :KUBE-MARK-MASQ - [0:0]\n:KUBE-POSTROUTING - [0:0]\n\
        -I PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
        -I OUTPUT -j KUBE-SERVICES\n\
        -I POSTROUTING -j KUBE-POSTROUTING\n\
        -A KUBE-SERVICES -m comment --comment \"ns/a cluster IP\" -m tcp -p tcp -d 172.30.0.1 --dport 80 -j KUBE-SVC-A\n\
        -A KUBE-SVC-A -m tcp -p tcp -d 172.30.0.1 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ\n\
        -A KUBE-SVC-A -m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-1\n\
        -A KUBE-SVC-A -j KUBE-SEP-2\n\
        -A KUBE-SEP-1 -s 10.1.0.1 -j KUBE-MARK-MASQ\n\
        -A KUBE-SEP-1 -m tcp -p tcp -j DNAT --to-destination 10.1.0.1:8080\n\
        -A KUBE-SEP-2 -s 10.1.0.2 -j KUBE-MARK-MASQ\n\
        -A KUBE-SEP-2 -m tcp -p tcp -j DNAT --to-destination 10.1.0.2:8080\n\
        -A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\n\
        -A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n\
        -A KUBE-POSTROUTING -j MARK --xor-mark 0x4000\n\
        -A KUBE-POSTROUTING -j MASQUERADE --random-fully\n\
        COMMIT\n";

    #[test]
    fn follows_random_arms_and_the_mark_to_masquerade() {
        let r = Ruleset::parse(NAT).unwrap();
        let local = [ip("192.168.0.2")];
        let t = r
            .trace(&Packet::tcp(ip("10.0.0.5"), ip("172.30.0.1"), 80), &local)
            .unwrap();
        assert_eq!(
            t.outcomes,
            [dnat("10.1.0.1:8080", false), dnat("10.1.0.2:8080", false)].into()
        );
        // from the node (outside the cluster CIDR): through OUTPUT, masqueraded
        let t = r
            .trace(&Packet::tcp(ip("192.168.0.2"), ip("172.30.0.1"), 80), &local)
            .unwrap();
        assert_eq!(
            t.outcomes,
            [dnat("10.1.0.1:8080", true), dnat("10.1.0.2:8080", true)].into()
        );
        // hairpin: the endpoint itself is masqueraded on its own arm only
        let t = r
            .trace(&Packet::tcp(ip("10.1.0.1"), ip("172.30.0.1"), 80), &local)
            .unwrap();
        assert_eq!(
            t.outcomes,
            [dnat("10.1.0.1:8080", true), dnat("10.1.0.2:8080", false)].into()
        );
        // another port, another protocol: untouched
        let t = r
            .trace(&Packet::tcp(ip("10.0.0.5"), ip("172.30.0.1"), 81), &local)
            .unwrap();
        assert_eq!(t.outcomes, [out(Verdict::Accept, false)].into());
        let udp = Packet {
            protocol: Protocol::Udp,
            ..Packet::tcp(ip("10.0.0.5"), ip("172.30.0.1"), 80)
        };
        assert_eq!(
            r.trace(&udp, &local).unwrap().outcomes,
            [out(Verdict::Accept, false)].into()
        );
    }

    #[test]
    fn filter_verdicts_policies_and_insert_order() {
        let text = "*filter\n:KUBE-SERVICES - [0:0]\n:FORWARD DROP [0:0]\n\
            -I FORWARD -m conntrack --ctstate NEW -j KUBE-SERVICES\n\
            -I FORWARD -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n\
            -I FORWARD 3 -d 10.1.0.0/16 -j ACCEPT\n\
            -A KUBE-SERVICES -m tcp -p tcp -d 172.30.0.9 --dport 80 -j REJECT\n\
            -A KUBE-SERVICES -m addrtype --dst-type LOCAL -j DROP\nCOMMIT\n";
        let r = Ruleset::parse(text).unwrap();
        let local = [ip("192.168.0.2")];
        let t = |dst: &str| {
            r.trace(&Packet::tcp(ip("10.0.0.5"), ip(dst), 80), &local)
                .unwrap()
                .outcomes
        };
        assert_eq!(t("172.30.0.9"), [out(Verdict::Reject, false)].into());
        assert_eq!(t("10.1.2.3"), [out(Verdict::Accept, false)].into());
        // FORWARD's policy drops what no rule accepted
        assert_eq!(t("10.2.0.1"), [out(Verdict::Drop, false)].into());
        // to the node: INPUT, not FORWARD
        assert_eq!(t("192.168.0.2"), [out(Verdict::Accept, false)].into());
    }

    #[test]
    fn noflush_declarations_flush_and_delete_needs_no_reference() {
        let mut r = Ruleset::parse(NAT).unwrap();
        // a partial restore: one endpoint chain gone, the service chain rewritten
        r.apply("*nat\n:KUBE-SVC-A - [0:0]\n:KUBE-SEP-2 - [0:0]\n-A KUBE-SVC-A -j KUBE-SEP-1\n-X KUBE-SEP-2\nCOMMIT\n")
            .unwrap();
        assert!(!r.chains("nat").contains(&"KUBE-SEP-2".to_string()));
        let t = r
            .trace(&Packet::tcp(ip("10.0.0.5"), ip("172.30.0.1"), 80), &[])
            .unwrap();
        assert_eq!(t.outcomes, [dnat("10.1.0.1:8080", false)].into());
        // deleting a chain that is still jumped to is refused, and nothing changes
        let e = r
            .apply("*nat\n:KUBE-SEP-1 - [0:0]\n-X KUBE-SEP-1\nCOMMIT\n")
            .unwrap_err();
        assert!(
            matches!(e, IptablesTraceError::DanglingJump { ref target, .. } if target == "KUBE-SEP-1"),
            "{e}"
        );
        assert!(r.chains("nat").contains(&"KUBE-SEP-1".to_string()));
        assert_eq!(
            r.trace(&Packet::tcp(ip("10.0.0.5"), ip("172.30.0.1"), 80), &[])
                .unwrap(),
            t
        );
    }

    #[test]
    fn anything_not_understood_is_an_error() {
        for (rule, what) in [
            ("-A KUBE-SERVICES -m limit --limit 5/s -j ACCEPT", "unknown match"),
            ("-A KUBE-SERVICES -j LOG", "not followed"),
            ("-A KUBE-SERVICES -j SNAT --to-source 1.2.3.4", "not followed"),
            ("-A KUBE-SERVICES -i eth0 -j ACCEPT", "unknown option"),
            ("-A KUBE-SERVICES -m tcp -p tcp --sport 80 -j ACCEPT", "unknown option"),
            ("-A KUBE-SERVICES --dport 80 -j ACCEPT", "without -m"),
            ("-A KUBE-SERVICES -m tcp -p udp --dport 80 -j ACCEPT", "without -p tcp"),
            (
                "-A KUBE-SERVICES -m statistic --mode nth --every 2 -j ACCEPT",
                "not followed",
            ),
            (
                "-A KUBE-SERVICES -m addrtype --dst-type BROADCAST -j ACCEPT",
                "not followed",
            ),
            (
                "-A KUBE-SERVICES -j DNAT --to-destination 10.1.0.1:80 --persistent",
                "not followed",
            ),
            ("-A KUBE-SERVICES -j MARK --or-mark 0x4000/0x4000", "not followed"),
            (
                "-A KUBE-SERVICES ! -m comment --comment x -j ACCEPT",
                "cannot be negated",
            ),
            ("-A KUBE-SERVICES -d 300.1.1.1 -j ACCEPT", "not an address"),
            ("-A KUBE-SERVICES -m comment --comment \"open -j ACCEPT", "unterminated"),
            ("-A NOPE -j ACCEPT", "no chain"),
            ("-F KUBE-SERVICES", "unknown command"),
        ] {
            let text = format!("*filter\n:KUBE-SERVICES - [0:0]\n{rule}\nCOMMIT\n");
            let e = Ruleset::parse(&text).unwrap_err().to_string();
            assert!(e.contains(what) && e.starts_with("line 3:"), "{rule}: {e}");
        }
        assert!(Ruleset::parse("*filter\n-A KUBE-X -j KUBE-Y\nCOMMIT\n").is_err());
        assert!(matches!(
            Ruleset::parse("*filter\n:KUBE-X - [0:0]\n-A KUBE-X -j KUBE-Y\nCOMMIT\n"),
            Err(IptablesTraceError::DanglingJump { .. })
        ));
        assert!(Ruleset::parse("*filter\n:KUBE-X - [0:0]\n")
            .unwrap_err()
            .to_string()
            .contains("no COMMIT"));
        assert!(Ruleset::parse("*weird\nCOMMIT\n").is_err());
    }

    #[test]
    fn mark_targets_compose_as_the_kernel_does() {
        let text = "*nat\n:KUBE-X - [0:0]\n-I PREROUTING -j KUBE-X\n\
            -A KUBE-X -j MARK --set-xmark 0x4000/0xffffffff\n\
            -A KUBE-X -j MARK --set-mark 0x1/0x1\n\
            -A KUBE-X -m mark --mark 0x4001 -j DNAT --to-destination 10.9.9.9\n\
            -A KUBE-X -j DNAT --to-destination [fd00::1]:80\nCOMMIT\n";
        let r = Ruleset::parse(text).unwrap();
        let t = r
            .trace(&Packet::tcp(ip("10.0.0.5"), ip("172.30.0.1"), 8080), &[])
            .unwrap();
        assert_eq!(t.outcomes, [dnat("10.9.9.9:8080", false)].into());
    }

    #[test]
    fn loops_are_an_error_not_a_hang() {
        let text = "*nat\n:KUBE-A - [0:0]\n:KUBE-B - [0:0]\n-I PREROUTING -j KUBE-A\n-A KUBE-A -j KUBE-B\n-A KUBE-B -j KUBE-A\nCOMMIT\n";
        let r = Ruleset::parse(text).unwrap();
        assert!(matches!(
            r.trace(&Packet::tcp(ip("10.0.0.5"), ip("1.1.1.1"), 80), &[]),
            Err(IptablesTraceError::TooDeep { .. })
        ));
    }
}
