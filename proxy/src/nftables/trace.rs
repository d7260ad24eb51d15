//! A packet tracer over the `nft -f` text ferro-proxy renders: the transaction is loaded into a
//! [`Ruleset`] the way nft would (tables, chains with their hooks and priorities, sets and
//! verdict maps with their elements, references checked at the end, all or nothing), and a
//! [`Packet`] is followed through it (see [`crate::trace`] for the path and the answer).
//!
//! Only what ferro emits is understood: `ip`/`ip6 saddr|daddr` with addresses, prefixes,
//! anonymous sets and named sets (`!=` too), `meta l4proto`, `th dport`, `tcp|udp|sctp dport`,
//! concatenations `a . b . c` looked up in verdict maps (`vmap @map`, `vmap { ... }`),
//! `numgen random mod N vmap` (every arm), `fib saddr|daddr type local`, `ct state`, `mark`
//! compares and sets, `update @set`, lookups in dynamic (affinity) sets (both ways), jump, goto,
//! return, accept, drop, reject, dnat, masquerade, comments. Anything else is an error: the
//! tracer never skips a rule it does not understand.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;

use crate::model::Protocol;
use crate::trace::{walk, BaseChain, Flow, Hook, Packet, PacketState, PathError, Rules, Trace, Tri, MAX_DEPTH};

/// Text the tracer cannot load, or rules it cannot follow.
#[derive(Debug, thiserror::Error)]
pub enum NftTraceError {
    #[error("line {line}: {reason}: {text}")]
    Parse { line: usize, text: String, reason: String },
    #[error("table {table}: {what} refers to {target}, which does not exist")]
    Dangling {
        table: String,
        what: String,
        target: String,
    },
    #[error("table {table}: no chain {chain}")]
    NoChain { table: String, chain: String },
    #[error("chains nest deeper than {MAX_DEPTH} at {chain} (a loop?)")]
    TooDeep { chain: String },
    #[error(transparent)]
    Path(#[from] PathError),
}

/// The tables as nft would leave them.
#[derive(Debug, Clone, Default)]
pub struct Ruleset {
    tables: BTreeMap<(String, String), Table>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fam {
    Ip,
    Ip6,
    Inet,
}

#[derive(Debug, Clone)]
struct Table {
    family: Fam,
    chains: BTreeMap<String, Chain>,
    sets: BTreeMap<String, Set>,
}

#[derive(Debug, Clone, Default)]
struct Chain {
    base: Option<Base>,
    rules: Vec<Vec<Stmt>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Base {
    hook: Hook,
    priority: i32,
    policy_drop: bool,
}

#[derive(Debug, Clone)]
struct Set {
    key: Vec<Ty>,
    /// A verdict map.
    map: bool,
    interval: bool,
    /// Filled by the packet path (`update`): its contents are unknown to the tracer.
    dynamic: bool,
    elements: BTreeMap<Vec<Val>, Option<Verdict>>,
}

/// A data type of a set key or a selector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ty {
    Ipv4,
    Ipv6,
    Proto,
    Service,
    Int,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Val {
    Net(IpNet),
    Proto(Protocol),
    Port(u16),
    Int(u64),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Verdict {
    Accept,
    Drop,
    Return,
    Continue,
    Jump(String),
    Goto(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sel {
    Saddr,
    Daddr,
    L4proto,
    /// `th dport`.
    Dport,
    /// `tcp dport` and friends: only packets of that protocol.
    ProtoDport(Protocol),
}

#[derive(Debug, Clone)]
enum Stmt {
    /// `sel [!=] value` or `sel [!=] { values }`.
    Cmp {
        sels: Vec<Sel>,
        neg: bool,
        values: Vec<Vec<Val>>,
    },
    InSet {
        sels: Vec<Sel>,
        neg: bool,
        set: String,
    },
    Fib {
        src: bool,
        neg: bool,
    },
    CtNew {
        new: bool,
        neg: bool,
    },
    MarkCmp {
        mask: u32,
        value: u32,
        neg: bool,
    },
    VmapNamed {
        sels: Vec<Sel>,
        map: String,
    },
    VmapAnon {
        sels: Vec<Sel>,
        arms: Vec<(Vec<Val>, Verdict)>,
    },
    Numgen {
        modulus: u64,
        arms: Vec<(Vec<Val>, Verdict)>,
    },
    SetMark {
        clear: u32,
        xor: u32,
    },
    Update {
        set: String,
    },
    Masquerade,
    Dnat {
        ip: IpAddr,
        port: Option<u16>,
    },
    Reject,
    Verdict(Verdict),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Word(String),
    Str(String),
    Open,
    Close,
    Comma,
    Semi,
}

fn lex(line: &str) -> Result<Vec<Tok>, String> {
    let mut out = Vec::new();
    let mut chars = line.chars().peekable();
    while let Some(&c) = chars.peek() {
        match c {
            c if c.is_whitespace() => {
                chars.next();
            }
            '{' | '}' | ',' | ';' => {
                chars.next();
                out.push(match c {
                    '{' => Tok::Open,
                    '}' => Tok::Close,
                    ',' => Tok::Comma,
                    _ => Tok::Semi,
                });
            }
            '"' => {
                chars.next();
                let mut s = String::new();
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => s.push(chars.next().ok_or("unterminated string")?),
                        Some(o) => s.push(o),
                        None => return Err("unterminated string".into()),
                    }
                }
                out.push(Tok::Str(s));
            }
            _ => {
                let mut w = String::new();
                while let Some(&c) = chars.peek() {
                    if c.is_whitespace() || "{},;\"".contains(c) {
                        break;
                    }
                    w.push(c);
                    chars.next();
                }
                out.push(Tok::Word(w));
            }
        }
    }
    Ok(out)
}

struct Cur<'a> {
    t: &'a [Tok],
    i: usize,
}

impl<'a> Cur<'a> {
    fn peek(&self) -> Option<&'a Tok> {
        self.t.get(self.i)
    }

    fn peek_word(&self) -> Option<&'a str> {
        match self.peek() {
            Some(Tok::Word(w)) => Some(w),
            _ => None,
        }
    }

    fn at_end(&self) -> bool {
        self.i >= self.t.len()
    }

    fn word(&mut self) -> Result<&'a str, String> {
        match self.t.get(self.i) {
            Some(Tok::Word(w)) => {
                self.i += 1;
                Ok(w)
            }
            other => Err(format!("expected a word, found {other:?}")),
        }
    }

    fn string(&mut self) -> Result<&'a str, String> {
        match self.t.get(self.i) {
            Some(Tok::Str(s)) => {
                self.i += 1;
                Ok(s)
            }
            other => Err(format!("expected a string, found {other:?}")),
        }
    }

    fn expect_word(&mut self, w: &str) -> Result<(), String> {
        let got = self.word()?;
        if got == w {
            Ok(())
        } else {
            Err(format!("expected {w:?}, found {got:?}"))
        }
    }

    fn eat(&mut self, t: &Tok) -> bool {
        if self.peek() == Some(t) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, t: &Tok) -> Result<(), String> {
        if self.eat(t) {
            Ok(())
        } else {
            Err(format!("expected {t:?}, found {:?}", self.peek()))
        }
    }

    /// `@name`.
    fn set_ref(&mut self) -> Result<&'a str, String> {
        let w = self.word()?;
        w.strip_prefix('@').ok_or_else(|| format!("expected @set, found {w:?}"))
    }
}

fn parse_u32(s: &str) -> Result<u32, String> {
    let r = match s.strip_prefix("0x") {
        Some(h) => u32::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|_| format!("{s:?} is not a number"))
}

fn parse_ty(s: &str) -> Result<Ty, String> {
    Ok(match s {
        "ipv4_addr" => Ty::Ipv4,
        "ipv6_addr" => Ty::Ipv6,
        "inet_proto" => Ty::Proto,
        "inet_service" => Ty::Service,
        other => return Err(format!("set type {other:?} is not followed")),
    })
}

fn parse_val(ty: Ty, s: &str, interval: bool) -> Result<Val, String> {
    let bad = || format!("{s:?} is not a {ty:?} value");
    Ok(match ty {
        Ty::Ipv4 | Ty::Ipv6 => {
            let net = match s.parse::<IpAddr>() {
                Ok(a) => IpNet::from(a),
                Err(_) if interval => s.parse::<IpNet>().map_err(|_| bad())?,
                Err(_) => return Err(format!("{s:?}: a prefix needs an interval set")),
            };
            if net.addr().is_ipv4() != (ty == Ty::Ipv4) {
                return Err(bad());
            }
            Val::Net(net)
        }
        Ty::Proto => Val::Proto(match s {
            "tcp" | "6" => Protocol::Tcp,
            "udp" | "17" => Protocol::Udp,
            "sctp" | "132" => Protocol::Sctp,
            _ => return Err(bad()),
        }),
        Ty::Service => Val::Port(s.parse().map_err(|_| bad())?),
        Ty::Int => Val::Int(s.parse().map_err(|_| bad())?),
    })
}

fn parse_verdict(c: &mut Cur) -> Result<Verdict, String> {
    Ok(match c.word()? {
        "accept" => Verdict::Accept,
        "drop" => Verdict::Drop,
        "return" => Verdict::Return,
        "continue" => Verdict::Continue,
        "jump" => Verdict::Jump(c.word()?.to_string()),
        "goto" => Verdict::Goto(c.word()?.to_string()),
        other => return Err(format!("verdict {other:?} is not followed")),
    })
}

/// `a . b . c` of the given types.
fn parse_key(c: &mut Cur, tys: &[Ty], interval: bool) -> Result<Vec<Val>, String> {
    let mut key = Vec::with_capacity(tys.len());
    for (n, ty) in tys.iter().enumerate() {
        if n > 0 {
            c.expect_word(".")?;
        }
        key.push(parse_val(*ty, c.word()?, interval)?);
    }
    Ok(key)
}

/// Elements as written: keys and (in maps) their verdicts.
type Elements = Vec<(Vec<Val>, Option<Verdict>)>;

/// `{ key [comment "x"] [: verdict], ... }`.
fn parse_elements(c: &mut Cur, tys: &[Ty], map: bool, interval: bool) -> Result<Elements, String> {
    c.expect(&Tok::Open)?;
    let mut out = Vec::new();
    loop {
        let key = parse_key(c, tys, interval)?;
        if c.peek_word() == Some("comment") {
            c.word()?;
            c.string()?;
        }
        let v = if map {
            c.expect_word(":")?;
            Some(parse_verdict(c)?)
        } else {
            None
        };
        out.push((key, v));
        if c.eat(&Tok::Close) {
            return Ok(out);
        }
        c.expect(&Tok::Comma)?;
    }
}

/// The keys of `delete element`: `{ key, ... }`.
fn parse_keys(c: &mut Cur, tys: &[Ty], interval: bool) -> Result<Vec<Vec<Val>>, String> {
    c.expect(&Tok::Open)?;
    let mut out = Vec::new();
    loop {
        out.push(parse_key(c, tys, interval)?);
        if c.eat(&Tok::Close) {
            return Ok(out);
        }
        c.expect(&Tok::Comma)?;
    }
}

fn sel_ty(sel: Sel, fam: Ty) -> Ty {
    match sel {
        Sel::Saddr | Sel::Daddr => fam,
        Sel::L4proto => Ty::Proto,
        Sel::Dport | Sel::ProtoDport(_) => Ty::Service,
    }
}

/// The parser of one table's rules.
struct RuleParser<'a> {
    table: &'a Table,
    /// The address type of the table's family.
    addr: Ty,
}

impl RuleParser<'_> {
    fn sel(&self, c: &mut Cur) -> Result<Sel, String> {
        let first = c.word()?;
        let second = c.word()?;
        Ok(match (first, second) {
            ("ip", "saddr") if self.addr == Ty::Ipv4 => Sel::Saddr,
            ("ip", "daddr") if self.addr == Ty::Ipv4 => Sel::Daddr,
            ("ip6", "saddr") if self.addr == Ty::Ipv6 => Sel::Saddr,
            ("ip6", "daddr") if self.addr == Ty::Ipv6 => Sel::Daddr,
            ("meta", "l4proto") => Sel::L4proto,
            ("th", "dport") => Sel::Dport,
            ("tcp", "dport") => Sel::ProtoDport(Protocol::Tcp),
            ("udp", "dport") => Sel::ProtoDport(Protocol::Udp),
            ("sctp", "dport") => Sel::ProtoDport(Protocol::Sctp),
            (a, b) => return Err(format!("selector {a} {b} is not followed here")),
        })
    }

    fn set(&self, name: &str, want_map: bool, tys: Option<&[Ty]>) -> Result<&Set, String> {
        let s = self.table.sets.get(name).ok_or_else(|| format!("no set {name}"))?;
        if s.map != want_map {
            return Err(format!("{name} is {} a verdict map", if s.map { "" } else { "not" }));
        }
        if let Some(tys) = tys {
            if s.key != tys {
                return Err(format!("{name} has keys {:?}, the rule looks up {tys:?}", s.key));
            }
        }
        Ok(s)
    }

    /// One rule's statements.
    fn rule(&self, c: &mut Cur) -> Result<Vec<Stmt>, String> {
        let mut out = Vec::new();
        while !c.at_end() {
            let w = c.peek_word().ok_or_else(|| format!("unexpected {:?}", c.peek()))?;
            let stmt = match w {
                "comment" => {
                    c.word()?;
                    c.string()?;
                    if !c.at_end() {
                        return Err("a comment ends the rule".into());
                    }
                    continue;
                }
                "ct" => {
                    c.word()?;
                    c.expect_word("state")?;
                    let neg = c.peek_word() == Some("!=") && c.word().is_ok();
                    let mut new = false;
                    loop {
                        match c.word()? {
                            "new" => new = true,
                            "established" | "related" | "invalid" | "untracked" => {}
                            s => return Err(format!("ct state {s:?} is not followed")),
                        }
                        if !c.eat(&Tok::Comma) {
                            break;
                        }
                    }
                    Stmt::CtNew { new, neg }
                }
                "fib" => {
                    c.word()?;
                    let src = match c.word()? {
                        "saddr" => true,
                        "daddr" => false,
                        o => return Err(format!("fib {o} is not followed")),
                    };
                    c.expect_word("type")?;
                    let neg = c.peek_word() == Some("!=") && c.word().is_ok();
                    c.expect_word("local")?;
                    Stmt::Fib { src, neg }
                }
                "numgen" => {
                    c.word()?;
                    c.expect_word("random")?;
                    c.expect_word("mod")?;
                    let modulus: u64 = c.word()?.parse().map_err(|_| "numgen needs a modulus".to_string())?;
                    if modulus == 0 {
                        return Err("numgen mod 0".into());
                    }
                    c.expect_word("vmap")?;
                    let arms = parse_elements(c, &[Ty::Int], true, false)?;
                    let arms = arms.into_iter().filter_map(|(k, v)| v.map(|v| (k, v))).collect();
                    Stmt::Numgen { modulus, arms }
                }
                "mark" => {
                    c.word()?;
                    match c.word()? {
                        "set" => {
                            let (clear, xor) = if c.peek_word() == Some("mark") {
                                c.word()?;
                                let op = c.word()?;
                                let v = parse_u32(c.word()?)?;
                                match op {
                                    "or" => (v, v),
                                    "xor" => (0, v),
                                    "and" => (!v, 0),
                                    o => return Err(format!("mark set mark {o} is not followed")),
                                }
                            } else {
                                (u32::MAX, parse_u32(c.word()?)?)
                            };
                            Stmt::SetMark { clear, xor }
                        }
                        "and" => {
                            let mask = parse_u32(c.word()?)?;
                            let neg = match c.peek_word() {
                                Some("==") => c.word().map(|_| false)?,
                                Some("!=") => c.word().map(|_| true)?,
                                _ => false,
                            };
                            let value = parse_u32(c.word()?)?;
                            Stmt::MarkCmp { mask, value, neg }
                        }
                        o => return Err(format!("mark {o} is not followed")),
                    }
                }
                "update" => {
                    c.word()?;
                    let set = c.set_ref()?;
                    let s = self.set(set, false, None)?;
                    if !s.dynamic {
                        return Err(format!("update of {set}, which is not dynamic"));
                    }
                    c.expect(&Tok::Open)?;
                    let sel = self.sel(c)?;
                    if vec![sel_ty(sel, self.addr)] != s.key {
                        return Err(format!("update of {set} with another key type"));
                    }
                    c.expect(&Tok::Close)?;
                    Stmt::Update { set: set.to_string() }
                }
                "masquerade" => {
                    c.word()?;
                    if matches!(c.peek_word(), Some("fully-random" | "random" | "persistent")) {
                        c.word()?;
                    }
                    Stmt::Masquerade
                }
                "dnat" => {
                    c.word()?;
                    c.expect_word("to")?;
                    let d = c.word()?;
                    let (ip, port) = match d.parse::<IpAddr>() {
                        Ok(ip) => (ip, None),
                        Err(_) => {
                            let a: SocketAddr = d.parse().map_err(|_| format!("{d:?} is not a dnat destination"))?;
                            (a.ip(), Some(a.port()))
                        }
                    };
                    if ip.is_ipv4() != (self.addr == Ty::Ipv4) {
                        return Err(format!("dnat to {d} in the other family"));
                    }
                    if port.is_some() && !matches!(out.last(), Some(Stmt::Cmp { sels, .. }) if sels == &[Sel::L4proto])
                    {
                        return Err("dnat to a port needs a transport protocol match before it".into());
                    }
                    Stmt::Dnat { ip, port }
                }
                "reject" => {
                    c.word()?;
                    Stmt::Reject
                }
                "accept" | "drop" | "return" | "continue" | "jump" | "goto" => Stmt::Verdict(parse_verdict(c)?),
                "ip" | "ip6" | "meta" | "th" | "tcp" | "udp" | "sctp" => {
                    let mut sels = vec![self.sel(c)?];
                    while c.peek_word() == Some(".") {
                        c.word()?;
                        sels.push(self.sel(c)?);
                    }
                    let tys: Vec<Ty> = sels.iter().map(|s| sel_ty(*s, self.addr)).collect();
                    let neg = match c.peek_word() {
                        Some("!=") => c.word().map(|_| true)?,
                        Some("==") => c.word().map(|_| false)?,
                        _ => false,
                    };
                    match c.peek() {
                        Some(Tok::Word(w)) if w == "vmap" && !neg => {
                            c.word()?;
                            if c.peek() == Some(&Tok::Open) {
                                let arms = parse_elements(c, &tys, true, true)?;
                                let arms = arms.into_iter().filter_map(|(k, v)| v.map(|v| (k, v))).collect();
                                Stmt::VmapAnon { sels, arms }
                            } else {
                                let map = c.set_ref()?;
                                self.set(map, true, Some(&tys))?;
                                Stmt::VmapNamed {
                                    sels,
                                    map: map.to_string(),
                                }
                            }
                        }
                        Some(Tok::Word(w)) if w.starts_with('@') => {
                            let set = c.set_ref()?;
                            self.set(set, false, Some(&tys))?;
                            Stmt::InSet {
                                sels,
                                neg,
                                set: set.to_string(),
                            }
                        }
                        Some(Tok::Open) => {
                            let values = parse_elements(c, &tys, false, true)?
                                .into_iter()
                                .map(|(k, _)| k)
                                .collect();
                            Stmt::Cmp { sels, neg, values }
                        }
                        _ => Stmt::Cmp {
                            sels,
                            neg,
                            values: vec![parse_key(c, &tys, true)?],
                        },
                    }
                }
                other => return Err(format!("statement {other:?} is not followed")),
            };
            if let Some(last) = out.last() {
                if matches!(
                    last,
                    Stmt::Verdict(_)
                        | Stmt::Reject
                        | Stmt::Dnat { .. }
                        | Stmt::Masquerade
                        | Stmt::VmapNamed { .. }
                        | Stmt::VmapAnon { .. }
                        | Stmt::Numgen { .. }
                ) {
                    return Err("a statement after a terminal one".into());
                }
            }
            out.push(stmt);
        }
        Ok(out)
    }
}

fn parse_hook(s: &str) -> Result<Hook, String> {
    Ok(match s {
        "prerouting" => Hook::Prerouting,
        "input" => Hook::Input,
        "forward" => Hook::Forward,
        "output" => Hook::Output,
        "postrouting" => Hook::Postrouting,
        o => return Err(format!("hook {o:?} is not followed")),
    })
}

fn parse_priority(s: &str) -> Result<i32, String> {
    Ok(match s {
        "raw" => -300,
        "mangle" => -150,
        "dstnat" => -100,
        "filter" => 0,
        "security" => 50,
        "srcnat" => 100,
        n => n.parse().map_err(|_| format!("priority {n:?} is not followed"))?,
    })
}

/// `{ type filter hook input priority 0 ; policy accept ; comment "x" ; }` (None: no body).
fn parse_chain_body(c: &mut Cur) -> Result<Option<Base>, String> {
    if !c.eat(&Tok::Open) {
        return Ok(None);
    }
    let mut base = None;
    let mut policy_drop = false;
    while !c.eat(&Tok::Close) {
        match c.word()? {
            "type" => {
                match c.word()? {
                    "filter" | "nat" | "route" => {}
                    t => return Err(format!("chain type {t:?} is not followed")),
                }
                c.expect_word("hook")?;
                let hook = parse_hook(c.word()?)?;
                c.expect_word("priority")?;
                let priority = parse_priority(c.word()?)?;
                base = Some(Base {
                    hook,
                    priority,
                    policy_drop: false,
                });
            }
            "policy" => {
                policy_drop = match c.word()? {
                    "accept" => false,
                    "drop" => true,
                    p => return Err(format!("policy {p:?} is not followed")),
                }
            }
            "comment" => {
                c.string()?;
            }
            o => return Err(format!("chain option {o:?} is not followed")),
        }
        c.expect(&Tok::Semi)?;
    }
    Ok(base.map(|b| Base { policy_drop, ..b }))
}

/// `{ type a . b [: verdict] ; flags f,g ; timeout 10s ; comment "x" ; }`.
fn parse_set_body(c: &mut Cur, map: bool) -> Result<Set, String> {
    c.expect(&Tok::Open)?;
    let mut set = Set {
        key: Vec::new(),
        map,
        interval: false,
        dynamic: false,
        elements: BTreeMap::new(),
    };
    while !c.eat(&Tok::Close) {
        match c.word()? {
            "type" => {
                set.key.push(parse_ty(c.word()?)?);
                while c.peek_word() == Some(".") {
                    c.word()?;
                    set.key.push(parse_ty(c.word()?)?);
                }
                if map {
                    c.expect_word(":")?;
                    c.expect_word("verdict")?;
                }
            }
            "flags" => loop {
                match c.word()? {
                    "interval" => set.interval = true,
                    "dynamic" => set.dynamic = true,
                    "timeout" => {}
                    f => return Err(format!("set flag {f:?} is not followed")),
                }
                if !c.eat(&Tok::Comma) {
                    break;
                }
            },
            "timeout" => {
                let t = c.word()?;
                if !t.ends_with('s') || t[..t.len() - 1].parse::<u64>().is_err() {
                    return Err(format!("timeout {t:?} is not followed"));
                }
            }
            "comment" => {
                c.string()?;
            }
            o => return Err(format!("set option {o:?} is not followed")),
        }
        c.expect(&Tok::Semi)?;
    }
    if set.key.is_empty() {
        return Err("a set needs a type".into());
    }
    Ok(set)
}

impl Table {
    /// nft refuses a transaction that leaves a jump, goto or lookup pointing at nothing.
    fn check(&self, name: &str) -> Result<(), NftTraceError> {
        let dangling = |what: String, target: &str| NftTraceError::Dangling {
            table: name.to_string(),
            what,
            target: target.to_string(),
        };
        let chain_ok = |v: &Verdict| match v {
            // a base chain cannot be jumped to
            Verdict::Jump(c) | Verdict::Goto(c) => self.chains.get(c).is_some_and(|c| c.base.is_none()),
            _ => true,
        };
        let target = |v: &Verdict| match v {
            Verdict::Jump(c) | Verdict::Goto(c) => c.clone(),
            _ => String::new(),
        };
        for (cname, chain) in &self.chains {
            for stmt in chain.rules.iter().flatten() {
                let what = || format!("a rule of chain {cname}");
                match stmt {
                    Stmt::Verdict(v) if !chain_ok(v) => return Err(dangling(what(), &target(v))),
                    Stmt::VmapAnon { arms, .. } | Stmt::Numgen { arms, .. } => {
                        if let Some((_, v)) = arms.iter().find(|(_, v)| !chain_ok(v)) {
                            return Err(dangling(what(), &target(v)));
                        }
                    }
                    Stmt::VmapNamed { map: s, .. } | Stmt::InSet { set: s, .. } | Stmt::Update { set: s }
                        if !self.sets.contains_key(s) =>
                    {
                        return Err(dangling(what(), s));
                    }
                    _ => {}
                }
            }
        }
        for (sname, set) in &self.sets {
            for v in set.elements.values().flatten() {
                if !chain_ok(v) {
                    return Err(dangling(format!("an element of {sname}"), &target(v)));
                }
            }
        }
        Ok(())
    }
}

impl Ruleset {
    /// The rules `text` leaves in an empty ruleset.
    pub fn parse(text: &str) -> Result<Ruleset, NftTraceError> {
        let mut r = Ruleset::default();
        r.apply(text)?;
        Ok(r)
    }

    /// Applies one `nft -f` transaction: all of it, or nothing when any of it is refused.
    pub fn apply(&mut self, text: &str) -> Result<(), NftTraceError> {
        let mut next = self.clone();
        for (i, raw) in text.lines().enumerate() {
            let l = raw.trim();
            if l.is_empty() || l.starts_with('#') {
                continue;
            }
            let err = |reason: String| NftTraceError::Parse {
                line: i + 1,
                text: l.to_string(),
                reason,
            };
            let toks = lex(l).map_err(err)?;
            next.command(&toks).map_err(err)?;
        }
        for ((_, name), t) in &next.tables {
            t.check(name)?;
        }
        *self = next;
        Ok(())
    }

    fn command(&mut self, toks: &[Tok]) -> Result<(), String> {
        let mut c = Cur { t: toks, i: 0 };
        let verb = c.word()?;
        let object = c.word()?;
        let fam = c.word()?;
        let family = match fam {
            "ip" => Fam::Ip,
            "ip6" => Fam::Ip6,
            "inet" => Fam::Inet,
            f => return Err(format!("family {f:?} is not followed")),
        };
        let tname = c.word()?.to_string();
        let key = (fam.to_string(), tname.clone());
        if object == "table" {
            match verb {
                "add" => {
                    if c.eat(&Tok::Open) {
                        while !c.eat(&Tok::Close) {
                            c.expect_word("comment")?;
                            c.string()?;
                            c.expect(&Tok::Semi)?;
                        }
                    }
                    self.tables.entry(key).or_insert_with(|| Table {
                        family,
                        chains: BTreeMap::new(),
                        sets: BTreeMap::new(),
                    });
                }
                "delete" => {
                    self.tables
                        .remove(&key)
                        .ok_or_else(|| format!("no table {fam} {tname}"))?;
                }
                v => return Err(format!("{v} table is not followed")),
            }
            return if c.at_end() {
                Ok(())
            } else {
                Err("trailing words".into())
            };
        }
        let table = self
            .tables
            .get_mut(&key)
            .ok_or_else(|| format!("no table {fam} {tname}"))?;
        let name = c.word()?.to_string();
        match (verb, object) {
            ("add", "chain") => {
                let base = parse_chain_body(&mut c)?;
                match table.chains.get(&name) {
                    Some(old) if base.is_some() && old.base != base => {
                        return Err(format!("chain {name} exists with another hook"))
                    }
                    Some(_) => {}
                    None => {
                        table.chains.insert(
                            name,
                            Chain {
                                base,
                                rules: Vec::new(),
                            },
                        );
                    }
                }
            }
            ("flush", "chain") => table
                .chains
                .get_mut(&name)
                .ok_or_else(|| format!("no chain {name}"))?
                .rules
                .clear(),
            ("delete", "chain") => match table.chains.get(&name) {
                None => return Err(format!("no chain {name}")),
                Some(ch) if !ch.rules.is_empty() => return Err(format!("chain {name} is not empty")),
                Some(_) => {
                    table.chains.remove(&name);
                }
            },
            ("add", "rule") => {
                let addr = match table.family {
                    Fam::Ip => Ty::Ipv4,
                    Fam::Ip6 => Ty::Ipv6,
                    Fam::Inet => return Err("rules of inet tables are not followed".into()),
                };
                if !table.chains.contains_key(&name) {
                    return Err(format!("no chain {name}"));
                }
                let stmts = RuleParser { table, addr }.rule(&mut c)?;
                table
                    .chains
                    .get_mut(&name)
                    .ok_or_else(|| format!("no chain {name}"))?
                    .rules
                    .push(stmts);
                return Ok(());
            }
            ("add", "set") | ("add", "map") => {
                let set = parse_set_body(&mut c, object == "map")?;
                match table.sets.get(&name) {
                    Some(old) if old.key != set.key || old.map != set.map => {
                        return Err(format!("set {name} exists with another type"))
                    }
                    Some(_) => {}
                    None => {
                        table.sets.insert(name, set);
                    }
                }
            }
            ("delete", "set") | ("delete", "map") => {
                table.sets.remove(&name).ok_or_else(|| format!("no set {name}"))?;
            }
            ("add", "element") => {
                let set = table.sets.get_mut(&name).ok_or_else(|| format!("no set {name}"))?;
                for (k, v) in parse_elements(&mut c, &set.key.clone(), set.map, set.interval)? {
                    match set.elements.get(&k) {
                        Some(old) if old != &v => {
                            return Err(format!("element {k:?} of {name} exists with another verdict"))
                        }
                        _ => {
                            set.elements.insert(k, v);
                        }
                    }
                }
            }
            ("delete", "element") => {
                let set = table.sets.get_mut(&name).ok_or_else(|| format!("no set {name}"))?;
                for k in parse_keys(&mut c, &set.key.clone(), set.interval)? {
                    set.elements
                        .remove(&k)
                        .ok_or_else(|| format!("no element {k:?} in {name}"))?;
                }
            }
            (v, o) => return Err(format!("{v} {o} is not followed")),
        }
        if c.at_end() {
            Ok(())
        } else {
            Err(format!("trailing {:?}", c.peek()))
        }
    }

    /// Every outcome of `packet`; `local` are the node's addresses.
    pub fn trace(&self, packet: &Packet, local: &[IpAddr]) -> Result<Trace, NftTraceError> {
        walk(&Tracer { rules: self, local }, packet, local)
    }

    /// The chains of a table (for tests and diagnostics).
    pub fn chains(&self, family: &str, table: &str) -> Vec<String> {
        self.tables
            .get(&(family.to_string(), table.to_string()))
            .map(|t| t.chains.keys().cloned().collect())
            .unwrap_or_default()
    }
}

struct Tracer<'a> {
    rules: &'a Ruleset,
    local: &'a [IpAddr],
}

enum Act {
    Addr(IpAddr),
    Proto(Protocol),
    Port(u16),
    /// `tcp dport` of a packet of another protocol: nothing matches.
    Absent,
}

fn val_matches(a: &Act, v: &Val) -> bool {
    match (a, v) {
        (Act::Addr(a), Val::Net(n)) => n.contains(a),
        (Act::Proto(a), Val::Proto(p)) => a == p,
        (Act::Port(a), Val::Port(p)) => a == p,
        _ => false,
    }
}

fn key_matches(acts: &[Act], key: &[Val]) -> bool {
    acts.len() == key.len() && acts.iter().zip(key).all(|(a, v)| val_matches(a, v))
}

type Paths = Vec<(PacketState, Flow)>;

impl Tracer<'_> {
    fn is_local(&self, ip: &IpAddr) -> bool {
        ip.is_loopback() || self.local.contains(ip)
    }

    fn acts(sels: &[Sel], st: &PacketState) -> Vec<Act> {
        sels.iter()
            .map(|s| match s {
                Sel::Saddr => Act::Addr(st.src),
                Sel::Daddr => Act::Addr(st.dst),
                Sel::L4proto => Act::Proto(st.protocol),
                Sel::Dport => Act::Port(st.port),
                Sel::ProtoDport(p) if *p == st.protocol => Act::Port(st.port),
                Sel::ProtoDport(_) => Act::Absent,
            })
            .collect()
    }

    fn run_chain(
        &self,
        t: &Table,
        tname: &str,
        chain: &str,
        st: PacketState,
        depth: usize,
    ) -> Result<Paths, NftTraceError> {
        if depth > MAX_DEPTH {
            return Err(NftTraceError::TooDeep {
                chain: chain.to_string(),
            });
        }
        let c = t.chains.get(chain).ok_or_else(|| NftTraceError::NoChain {
            table: tname.to_string(),
            chain: chain.to_string(),
        })?;
        self.run_rules(t, tname, &c.rules, 0, st, depth)
    }

    fn run_rules(
        &self,
        t: &Table,
        tname: &str,
        rules: &[Vec<Stmt>],
        ri: usize,
        st: PacketState,
        depth: usize,
    ) -> Result<Paths, NftTraceError> {
        if ri >= rules.len() {
            return Ok(vec![(st, Flow::Return)]);
        }
        self.run_stmts(t, tname, rules, ri, 0, st, depth)
    }

    #[allow(clippy::too_many_arguments)]
    fn run_stmts(
        &self,
        t: &Table,
        tname: &str,
        rules: &[Vec<Stmt>],
        ri: usize,
        si: usize,
        mut st: PacketState,
        depth: usize,
    ) -> Result<Paths, NftTraceError> {
        let Some(stmt) = rules[ri].get(si) else {
            return self.run_rules(t, tname, rules, ri + 1, st, depth);
        };
        let go_on = |st: PacketState| self.run_stmts(t, tname, rules, ri, si + 1, st, depth);
        let next_rule = |st: PacketState| self.run_rules(t, tname, rules, ri + 1, st, depth);
        let tri = match stmt {
            Stmt::Cmp { sels, neg, values } => {
                let acts = Self::acts(sels, &st);
                Tri::of(values.iter().any(|k| key_matches(&acts, k)) != *neg)
            }
            Stmt::InSet { sels, neg, set } => {
                let s = t.sets.get(set).ok_or_else(|| NftTraceError::Dangling {
                    table: tname.into(),
                    what: "a lookup".into(),
                    target: set.clone(),
                })?;
                if s.dynamic {
                    Tri::Either
                } else {
                    let acts = Self::acts(sels, &st);
                    Tri::of(s.elements.keys().any(|k| key_matches(&acts, k)) != *neg)
                }
            }
            Stmt::Fib { src, neg } => Tri::of(self.is_local(if *src { &st.src } else { &st.dst }) != *neg),
            Stmt::CtNew { new, neg } => Tri::of(*new != *neg),
            Stmt::MarkCmp { mask, value, neg } => Tri::of((st.mark & mask == *value) != *neg),
            Stmt::SetMark { clear, xor } => {
                st.mark = (st.mark & !clear) ^ xor;
                return go_on(st);
            }
            Stmt::Update { .. } => return go_on(st),
            Stmt::Masquerade => return Ok(vec![(st, Flow::Masquerade)]),
            Stmt::Dnat { ip, port } => {
                let to = SocketAddr::new(*ip, port.unwrap_or(st.port));
                return Ok(vec![(st, Flow::Dnat(to))]);
            }
            Stmt::Reject => return Ok(vec![(st, Flow::Reject)]),
            Stmt::Verdict(v) => return self.verdict(t, tname, rules, ri, v, st, depth),
            Stmt::VmapNamed { sels, map } => {
                let s = t.sets.get(map).ok_or_else(|| NftTraceError::Dangling {
                    table: tname.into(),
                    what: "a lookup".into(),
                    target: map.clone(),
                })?;
                let acts = Self::acts(sels, &st);
                let hit = s
                    .elements
                    .iter()
                    .find(|(k, _)| key_matches(&acts, k))
                    .and_then(|(_, v)| v.as_ref());
                return match hit {
                    Some(v) => self.verdict(t, tname, rules, ri, v, st, depth),
                    None => next_rule(st),
                };
            }
            Stmt::VmapAnon { sels, arms } => {
                let acts = Self::acts(sels, &st);
                return match arms.iter().find(|(k, _)| key_matches(&acts, k)) {
                    Some((_, v)) => self.verdict(t, tname, rules, ri, v, st, depth),
                    None => next_rule(st),
                };
            }
            Stmt::Numgen { modulus, arms } => {
                // every number the generator can give, each with its arm (or none)
                let mut out = Vec::new();
                for n in 0..*modulus {
                    match arms.iter().find(|(k, _)| k == &[Val::Int(n)]) {
                        Some((_, v)) => out.extend(self.verdict(t, tname, rules, ri, v, st.clone(), depth)?),
                        None => out.extend(next_rule(st.clone())?),
                    }
                }
                return Ok(out);
            }
        };
        match tri {
            Tri::Yes => go_on(st),
            Tri::No => next_rule(st),
            Tri::Either => {
                let mut out = go_on(st.clone())?;
                out.extend(next_rule(st)?);
                Ok(out)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn verdict(
        &self,
        t: &Table,
        tname: &str,
        rules: &[Vec<Stmt>],
        ri: usize,
        v: &Verdict,
        st: PacketState,
        depth: usize,
    ) -> Result<Paths, NftTraceError> {
        Ok(match v {
            Verdict::Accept => vec![(st, Flow::Accept)],
            Verdict::Drop => vec![(st, Flow::Drop)],
            Verdict::Return => vec![(st, Flow::Return)],
            Verdict::Continue => self.run_rules(t, tname, rules, ri + 1, st, depth)?,
            // a goto's chain returns to whoever called this one
            Verdict::Goto(c) => self.run_chain(t, tname, c, st, depth + 1)?,
            Verdict::Jump(c) => {
                let mut out = Vec::new();
                for (s, f) in self.run_chain(t, tname, c, st, depth + 1)? {
                    match f {
                        Flow::Return => out.extend(self.run_rules(t, tname, rules, ri + 1, s, depth)?),
                        f => out.push((s, f)),
                    }
                }
                out
            }
        })
    }
}

impl Rules for Tracer<'_> {
    type Error = NftTraceError;

    fn base_chains(&self, hook: Hook, family_v4: bool) -> Vec<BaseChain> {
        let mut out: Vec<BaseChain> = Vec::new();
        for ((fam, tname), t) in &self.rules.tables {
            let applies = match t.family {
                Fam::Ip => family_v4,
                Fam::Ip6 => !family_v4,
                Fam::Inet => true,
            };
            if !applies {
                continue;
            }
            for (cname, c) in &t.chains {
                if let Some(b) = c.base.filter(|b| b.hook == hook) {
                    out.push(BaseChain {
                        table: format!("{fam} {tname}"),
                        chain: cname.clone(),
                        priority: b.priority,
                        policy_drop: b.policy_drop,
                    });
                }
            }
        }
        out.sort_by_key(|b| b.priority);
        out
    }

    fn run(&self, chain: &BaseChain, st: PacketState) -> Result<Vec<(PacketState, Flow)>, NftTraceError> {
        let (fam, tname) = chain.table.split_once(' ').unwrap_or(("", &chain.table));
        let t = self
            .rules
            .tables
            .get(&(fam.to_string(), tname.to_string()))
            .ok_or_else(|| NftTraceError::NoChain {
                table: chain.table.clone(),
                chain: chain.chain.clone(),
            })?;
        self.run_chain(t, &chain.table, &chain.chain, st, 0)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::trace::{Outcome, Verdict as V};

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn dnat(a: &str, masquerade: bool) -> Outcome {
        Outcome {
            verdict: V::Dnat(a.parse().unwrap()),
            masquerade,
        }
    }

    fn only(v: V) -> std::collections::BTreeSet<Outcome> {
        [Outcome {
            verdict: v,
            masquerade: false,
        }]
        .into()
    }

    const TABLE: &str = "add table ip t\n\
        add map ip t svc { type ipv4_addr . inet_proto . inet_service : verdict ; }\n\
        add set ip t aff { type ipv4_addr ; flags dynamic,timeout ; timeout 60s ; }\n\
        add chain ip t mark-for-masquerade\n\
        add rule ip t mark-for-masquerade mark set mark or 0x4000\n\
        add chain ip t masquerading\n\
        add rule ip t masquerading mark and 0x4000 == 0 return\n\
        add rule ip t masquerading mark set mark xor 0x4000\n\
        add rule ip t masquerading masquerade fully-random\n\
        add chain ip t svc-a\n\
        add chain ip t ep-1\n\
        add chain ip t ep-2\n\
        add rule ip t svc-a ip daddr 172.30.0.1 tcp dport 80 ip saddr != { 10.0.0.0/8 } jump mark-for-masquerade\n\
        add rule ip t svc-a numgen random mod 2 vmap { 0 : goto ep-1, 1 : goto ep-2 }\n\
        add rule ip t ep-1 ip saddr 10.1.0.1 jump mark-for-masquerade\n\
        add rule ip t ep-1 meta l4proto tcp dnat to 10.1.0.1:8080\n\
        add rule ip t ep-2 ip saddr 10.1.0.2 jump mark-for-masquerade\n\
        add rule ip t ep-2 update @aff { ip saddr }\n\
        add rule ip t ep-2 meta l4proto tcp dnat to 10.1.0.2:8080\n\
        add chain ip t nat-prerouting { type nat hook prerouting priority -100 ; }\n\
        add rule ip t nat-prerouting ip daddr . meta l4proto . th dport vmap @svc\n\
        add chain ip t nat-output { type nat hook output priority dstnat ; }\n\
        add rule ip t nat-output ip daddr . meta l4proto . th dport vmap @svc\n\
        add chain ip t nat-postrouting { type nat hook postrouting priority srcnat ; }\n\
        add rule ip t nat-postrouting jump masquerading\n\
        add element ip t svc { 172.30.0.1 . tcp . 80 : goto svc-a }\n";

    #[test]
    fn follows_numgen_arms_maps_and_the_mark() {
        let r = Ruleset::parse(TABLE).unwrap();
        let local = [ip("192.168.0.2")];
        let t = |src: &str, port| {
            r.trace(&Packet::tcp(ip(src), ip("172.30.0.1"), port), &local)
                .unwrap()
                .outcomes
        };
        assert_eq!(
            t("10.0.0.5", 80),
            [dnat("10.1.0.1:8080", false), dnat("10.1.0.2:8080", false)].into()
        );
        assert_eq!(
            t("192.168.0.2", 80),
            [dnat("10.1.0.1:8080", true), dnat("10.1.0.2:8080", true)].into()
        );
        assert_eq!(
            t("10.1.0.2", 80),
            [dnat("10.1.0.1:8080", false), dnat("10.1.0.2:8080", true)].into()
        );
        assert_eq!(t("10.0.0.5", 81), only(V::Accept));
    }

    #[test]
    fn partial_transactions_apply_on_top() {
        let mut r = Ruleset::parse(TABLE).unwrap();
        r.apply(
            "add chain ip t svc-a\nflush chain ip t svc-a\n\
             add rule ip t svc-a numgen random mod 1 vmap { 0 : goto ep-1 }\n\
             flush chain ip t ep-2\ndelete chain ip t ep-2\n",
        )
        .unwrap();
        let t = r
            .trace(&Packet::tcp(ip("10.0.0.5"), ip("172.30.0.1"), 80), &[])
            .unwrap();
        assert_eq!(t.outcomes, [dnat("10.1.0.1:8080", false)].into());
        // the element leaves, the service with it; deleting it twice is refused
        r.apply("delete element ip t svc { 172.30.0.1 . tcp . 80 }\n").unwrap();
        assert_eq!(
            r.trace(&Packet::tcp(ip("10.0.0.5"), ip("172.30.0.1"), 80), &[])
                .unwrap()
                .outcomes,
            only(V::Accept)
        );
        assert!(r.apply("delete element ip t svc { 172.30.0.1 . tcp . 80 }\n").is_err());
    }

    #[test]
    fn refused_transactions_change_nothing() {
        let mut r = Ruleset::parse(TABLE).unwrap();
        // a chain still jumped to cannot go, a non-empty chain cannot be deleted
        let e = r.apply("flush chain ip t ep-1\ndelete chain ip t ep-1\n").unwrap_err();
        assert!(
            matches!(e, NftTraceError::Dangling { ref target, .. } if target == "ep-1"),
            "{e}"
        );
        assert!(r
            .apply("delete chain ip t ep-1\n")
            .unwrap_err()
            .to_string()
            .contains("not empty"));
        assert!(r.chains("ip", "t").contains(&"ep-1".to_string()));
        // an element with another verdict for the same key
        let e = r
            .apply("add element ip t svc { 172.30.0.1 . tcp . 80 : goto ep-1 }\n")
            .unwrap_err();
        assert!(e.to_string().contains("another verdict"), "{e}");
        // the same element again is fine
        r.apply("add element ip t svc { 172.30.0.1 . tcp . 80 : goto svc-a }\n")
            .unwrap();
        let t = r
            .trace(&Packet::tcp(ip("10.0.0.5"), ip("172.30.0.1"), 80), &[])
            .unwrap();
        assert_eq!(t.endpoints().len(), 2);
    }

    #[test]
    fn dynamic_sets_go_both_ways_and_goto_returns_to_the_caller() {
        let text = "add table ip t\n\
            add set ip t aff { type ipv4_addr ; flags dynamic,timeout ; timeout 60s ; }\n\
            add set ip t locals { type ipv4_addr ; }\n\
            add element ip t locals { 192.168.0.9 }\n\
            add chain ip t a\nadd chain ip t b\n\
            add rule ip t a ip saddr @aff goto b\n\
            add rule ip t a drop\n\
            add rule ip t b ip daddr @locals reject\n\
            add chain ip t f { type filter hook forward priority 0 ; policy drop ; }\n\
            add rule ip t f ct state new jump a\n\
            add rule ip t f accept\n";
        let r = Ruleset::parse(text).unwrap();
        let t = |dst: &str| {
            r.trace(&Packet::tcp(ip("10.0.0.5"), ip(dst), 80), &[])
                .unwrap()
                .outcomes
        };
        // goto b, b falls off: back in f after "jump a", then accept
        let both = [
            Outcome {
                verdict: V::Drop,
                masquerade: false,
            },
            Outcome {
                verdict: V::Accept,
                masquerade: false,
            },
        ];
        assert_eq!(t("10.9.9.9"), both.into());
        let both = [
            Outcome {
                verdict: V::Drop,
                masquerade: false,
            },
            Outcome {
                verdict: V::Reject,
                masquerade: false,
            },
        ];
        assert_eq!(t("192.168.0.9"), both.into());
    }

    #[test]
    fn anything_not_understood_is_an_error() {
        let head = "add table ip t\nadd chain ip t c\nadd map ip t m { type ipv4_addr . inet_proto . inet_service : verdict ; }\n";
        for (line, what) in [
            ("add rule ip t c counter", "statement \"counter\""),
            ("add rule ip t c ip protocol tcp accept", "selector ip protocol"),
            ("add rule ip t c ip6 saddr ::1 accept", "selector ip6 saddr"),
            ("add rule ip t c tcp sport 80 accept", "selector tcp sport"),
            ("add rule ip t c meta mark 1 accept", "selector meta mark"),
            ("add rule ip t c fib daddr type broadcast drop", "expected \"local\""),
            ("add rule ip t c ct state new,bogus accept", "ct state \"bogus\""),
            ("add rule ip t c log prefix \"x\"", "statement \"log\""),
            ("add rule ip t c ip daddr . th dport vmap @m", "has keys"),
            (
                "add rule ip t c ip daddr . meta l4proto . th dport vmap @nope",
                "no set nope",
            ),
            ("add rule ip t c ip daddr 10.0.0.1 drop accept", "after a terminal"),
            ("add rule ip t c dnat to 10.0.0.1:80", "needs a transport protocol"),
            ("add rule ip t c snat to 10.0.0.1", "statement \"snat\""),
            ("add rule ip t nope accept", "no chain nope"),
            ("add rule ip t c goto nowhere", "nowhere"),
            ("add element ip t m { 10.0.0.1 . tcp . 80 : goto nowhere }", "nowhere"),
            ("add element ip t m { 10.0.0.1 . tcp : accept }", "expected \".\""),
            (
                "add element ip t m { 10.0.0.0/8 . tcp . 80 : accept }",
                "needs an interval set",
            ),
            (
                "add element ip t m { 10.0.0.1 . icmp . 80 : accept }",
                "not a Proto value",
            ),
            (
                "add chain ip t x { type filter hook ingress priority 0 ; }",
                "hook \"ingress\"",
            ),
            ("add set ip t s { type ether_addr ; }", "ether_addr"),
            ("add flowtable ip t f", "not followed"),
            ("add table bridge t", "family \"bridge\""),
            ("add rule ip t c comment \"x\" accept", "ends the rule"),
            ("add rule ip t c ip daddr \"unterminated", "unterminated"),
        ] {
            let e = Ruleset::parse(&format!("{head}{line}\n")).unwrap_err().to_string();
            assert!(e.contains(what), "{line}: {e}");
        }
    }
}
