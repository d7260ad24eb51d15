//! The nftables renderer: a family's model -> one `nft -f` transaction, in upstream
//! kube-proxy's nftables layout (pkg/proxy/nftables/proxier.go, v1.31+): table
//! `ip kube-proxy` / `ip6 kube-proxy`, base chains at upstream's hooks and priorities, and
//! dispatch through verdict maps (`service-ips`, `service-nodeports`, `no-endpoint-services`,
//! `no-endpoint-nodeports`, `firewall-ips`), so a packet's lookup costs the same at 10 or
//! 10,000 Services.
//!
//! A full sync recreates the table in one transaction (`add table`, `delete table`, then
//! everything). A partial sync touches only the map elements and chains of service ports whose
//! entry changed, computed against the state ferro-proxy committed — the table is never listed.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::model::{categorize, Endpoint, Family, FamilyModel, NodeInfo, ServiceEntry, ServicePortName};
use crate::names::hash_prefix;
use crate::nftables::netlink::{Key, Op, Verdict};
use crate::nftables::rule::{Rule, MARK_CHAIN};

pub const TABLE: &str = "kube-proxy";

/// What the renderer needs besides the model.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RenderConfig {
    /// Local-traffic detector ("ClusterCIDR"): this family's pod networks.
    pub cluster_cidrs: Vec<IpNet>,
    pub masquerade_all: bool,
    /// None: NodePorts on every local address but loopback (`fib daddr type local`); Some:
    /// only these addresses (the `nodeport-ips` set).
    pub nodeport_ips: Option<Vec<IpAddr>>,
}

fn fam(f: Family) -> (&'static str, &'static str, &'static str, &'static str) {
    // (table family, address match keyword, set type, loopback)
    match f {
        Family::V4 => ("ip", "ip", "ipv4_addr", "127.0.0.0/8"),
        Family::V6 => ("ip6", "ip6", "ipv6_addr", "::1"),
    }
}

/// Upstream's hashAndTruncate: 8 characters of base32(sha256(name)), "-", the name (cut to
/// 240 characters with "..." if longer).
fn hash_and_truncate(name: &str) -> String {
    let mut s = format!("{}-{name}", hash_prefix(name, 8));
    if s.len() > 240 {
        s.truncate(237);
        s.push_str("...");
    }
    s
}

/// Upstream's servicePortChainNameBase: "HASH-ns/name/proto/port".
pub fn chain_base(name: &ServicePortName) -> String {
    hash_and_truncate(&format!("{}/{}/{}/{}", name.namespace, name.name, name.protocol.lower(), name.port))
}

/// Upstream's endpoint chain: "endpoint-" + "HASH-ns/name/proto/port__ip/port" (an IPv6
/// address with '.' for ':').
pub fn endpoint_chain(name: &ServicePortName, ep: &Endpoint) -> String {
    let ip = ep.ip.to_string().replace(':', ".");
    format!(
        "endpoint-{}",
        hash_and_truncate(&format!("{}/{}/{}/{}__{ip}/{}", name.namespace, name.name, name.protocol.lower(), name.port, ep.port))
    )
}

/// One element of one of the shared maps or sets: typed (the netlink batch encodes it) and
/// its nft text derived from the same value, so the two writers cannot disagree.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Element {
    pub map: &'static str,
    /// The key (and " comment", ": verdict" for maps) as nft spells it.
    pub text: String,
    pub key: Key,
    pub comment: Option<String>,
    pub verdict: Option<Verdict>,
}

impl Element {
    pub fn new(map: &'static str, key: Key, comment: Option<String>, verdict: Option<Verdict>) -> Element {
        let mut text = key.text();
        if let Some(c) = &comment {
            let _ = write!(text, " comment \"{c}\"");
        }
        if let Some(v) = &verdict {
            let _ = write!(text, " : {}", v.text());
        }
        Element { map, text, key, comment, verdict }
    }

    /// The operation that adds it.
    pub fn add(&self) -> Op {
        Op::AddElement { set: self.map, key: self.key.clone(), comment: self.comment.clone(), verdict: self.verdict.clone() }
    }
}

/// A service port's map and set elements, sorted. A service port has a few (its cluster IP,
/// its verdict map entries): a sorted vector of exactly that many, not a B-tree node with
/// room for eleven, is what 10,000 committed renderings keep.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Elements(Vec<Element>);

impl Elements {
    /// Adds `e` unless it is there; whether it was added.
    pub fn insert(&mut self, e: Element) -> bool {
        match self.0.binary_search(&e) {
            Ok(_) => false,
            Err(i) => {
                self.0.insert(i, e);
                true
            }
        }
    }

    pub fn contains(&self, e: &Element) -> bool {
        self.0.binary_search(e).is_ok()
    }

    pub fn iter(&self) -> std::slice::Iter<'_, Element> {
        self.0.iter()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The elements of `self` not in `other`, in order.
    pub fn difference<'a>(&'a self, other: &'a Elements) -> impl Iterator<Item = &'a Element> + 'a {
        self.0.iter().filter(move |e| !other.contains(e))
    }

    fn shrink(&mut self) {
        self.0.shrink_to_fit();
    }
}

impl<'a> IntoIterator for &'a Elements {
    type Item = &'a Element;
    type IntoIter = std::slice::Iter<'a, Element>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

/// One service port rendered on its own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rendered {
    /// Its chains with their rule lines (`add rule` lines), in writing order.
    pub chains: Vec<(String, String)>,
    /// The typed rules of each chain of `chains` (same order), the text's source. Only a fresh
    /// rendering has them: the committed state keeps the chains' digests, not their rules.
    pub rules: Vec<Vec<Rule>>,
    /// A committed rendering's [`crate::names::digest`] of each chain's text (same order as
    /// `chains`, whose texts it keeps empty); a fresh rendering has none.
    pub digests: Vec<u128>,
    /// Its affinity sets (name, timeout seconds).
    pub sets: Vec<(String, u32)>,
    pub elements: Elements,
}

/// What ferro-proxy committed for one family.
#[derive(Debug, Clone, Default)]
pub struct State {
    services: HashMap<ServicePortName, (std::sync::Arc<ServiceEntry>, Rendered)>,
    /// How many committed renderings hold each plain set element (no comment, no verdict:
    /// `cluster-ips`, which every port of a Service shares), so a partial sync knows whether
    /// one a changed service port lets go of is still someone's without looking at the
    /// others. Elements with a comment or a verdict name their service port (its name, its
    /// chain) and are held by it alone.
    set_refs: HashMap<(&'static str, Key), u32>,
    committed: bool,
}

impl State {
    /// Counts (or, `add` false, uncounts) a rendering's plain set elements.
    fn count(&mut self, r: &Rendered, add: bool) {
        for e in r.elements.iter().filter(|e| e.comment.is_none() && e.verdict.is_none()) {
            let k = (e.map, e.key.clone());
            if add {
                *self.set_refs.entry(k).or_default() += 1;
            } else if let Some(n) = self.set_refs.get_mut(&k) {
                *n -= 1;
                if *n == 0 {
                    self.set_refs.remove(&k);
                }
            }
        }
    }

    /// Whether a committed rendering (counted) still holds `e`.
    fn element_in_use(&self, e: &Element) -> bool {
        e.comment.is_none() && e.verdict.is_none() && self.set_refs.contains_key(&(e.map, e.key.clone()))
    }

    /// Takes a service port's rendering out of the state (uncounted).
    fn uncommit(&mut self, name: &ServicePortName) -> Option<Rendered> {
        let (_, r) = self.services.remove(name)?;
        self.count(&r, false);
        Some(r)
    }

    /// Keeps a rendering (already counted) as committed: its chains' digests, not their text
    /// or rules.
    fn keep(&mut self, name: ServicePortName, entry: std::sync::Arc<ServiceEntry>, mut r: Rendered) {
        r.digests = r.chains.iter().map(|(_, t)| crate::names::digest(t)).collect();
        for (c, t) in r.chains.iter_mut() {
            *t = String::new();
            c.shrink_to_fit();
        }
        r.rules = Vec::new();
        r.chains.shrink_to_fit();
        r.elements.shrink();
        self.services.insert(name, (entry, r));
    }

    /// The next render is full (after a refused transaction or drift).
    pub fn reset(&mut self) {
        self.committed = false;
    }

    /// The service port whose chain a line of the transaction writes or names (its map
    /// elements `goto` its chain), to name the culprit of a refused transaction.
    pub fn owner_of_line(&self, line: &str) -> Option<ServicePortName> {
        let tokens: BTreeSet<&str> = line
            .split(|c: char| c.is_whitespace() || c == ',' || c == '{' || c == '}')
            .filter(|t| !t.is_empty())
            .collect();
        self.services
            .iter()
            .find(|(_, (_, r))| r.chains.iter().any(|(c, _)| tokens.contains(c.as_str())))
            .map(|(name, _)| name.clone())
    }
}

/// One render's output.
#[derive(Debug, Clone, Default)]
pub struct Output {
    pub text: String,
    pub full: bool,
    pub chains_written: usize,
    pub chains_deleted: usize,
    pub elements_changed: usize,
    /// A partial sync's operations, typed, each with the service port it belongs to, when all
    /// of them can be written through netlink (`netlink::encode`): elements, chains created,
    /// flushed or deleted, sets deleted, rules whose expressions are encoded (`rule::Rule`).
    /// None for a full sync and for one that writes a rule that is not encoded or adds a set
    /// (affinity): those go through `nft -f` with `text`.
    pub ops: Option<Vec<(Op, Option<ServicePortName>)>>,
}

fn rule(out: &mut String, tf: &str, chain: &str, body: &str) {
    let _ = writeln!(out, "add rule {tf} {TABLE} {chain} {body}");
}

/// Renders one service port, as upstream's per-service loop of syncProxyRules.
pub fn render_service(entry: &ServiceEntry, node: &NodeInfo, cfg: &RenderConfig, family: Family) -> Rendered {
    let (tf, af, _, _) = fam(family);
    let port = &entry.port;
    let name = &port.name;
    let spn = name.to_string();
    let base = chain_base(name);
    let cat = categorize(entry, node);
    let mut r = Rendered::default();
    let svc_chain = format!("service-{base}");
    let local_chain = format!("local-{base}");
    let ext_chain = format!("external-{base}");
    let fw_chain = format!("firewall-{base}");
    let has_endpoints = cat.has_any;
    let uses_cluster_chain = !cat.cluster.is_empty() && port.uses_cluster_endpoints();
    let uses_local_chain = !cat.local.is_empty() && port.uses_local_endpoints();
    let (internal_chain, has_internal) = if port.internal_policy_local {
        (&local_chain, has_endpoints && !cat.local.is_empty())
    } else {
        (&svc_chain, has_endpoints)
    };
    let (external_policy_chain, has_external) = if port.external_policy_local {
        (&local_chain, has_endpoints && !cat.local.is_empty())
    } else {
        (&svc_chain, has_endpoints)
    };
    let uses_ext_chain = has_endpoints && port.externally_accessible();
    let uses_fw_chain = has_endpoints && !port.load_balancer_ips.is_empty() && !port.load_balancer_source_ranges.is_empty();
    let no_ep_verdict = || if has_endpoints { Verdict::Drop } else { Verdict::Goto("reject-chain".into()) };
    let goto = |c: &str| Some(Verdict::Goto(c.to_string()));
    let comment = || Some(spn.clone());
    let cluster_ip = port.cluster_ip;
    let p = port.port;
    let proto_t = port.protocol;
    let apk = |ip: IpAddr| Key::AddrProtoPort(ip, proto_t, p);

    r.elements.insert(Element::new("cluster-ips", Key::Addr(cluster_ip), None, None));
    if has_internal {
        r.elements.insert(Element::new("service-ips", apk(cluster_ip), None, goto(internal_chain)));
    } else {
        r.elements.insert(Element::new("no-endpoint-services", apk(cluster_ip), comment(), Some(no_ep_verdict())));
    }
    for ip in &port.external_ips {
        if has_endpoints {
            r.elements.insert(Element::new("service-ips", apk(*ip), None, goto(&ext_chain)));
        }
        if !has_external {
            r.elements.insert(Element::new("no-endpoint-services", apk(*ip), comment(), Some(no_ep_verdict())));
        }
    }
    for ip in &port.load_balancer_ips {
        if has_endpoints {
            r.elements.insert(Element::new("service-ips", apk(*ip), None, goto(&ext_chain)));
        }
        if uses_fw_chain {
            r.elements.insert(Element::new("firewall-ips", apk(*ip), comment(), goto(&fw_chain)));
        }
        if !has_external {
            r.elements.insert(Element::new("no-endpoint-services", apk(*ip), comment(), Some(no_ep_verdict())));
        }
    }
    if port.node_port != 0 {
        let np = Key::ProtoPort(proto_t, port.node_port);
        if has_endpoints {
            r.elements.insert(Element::new("service-nodeports", np.clone(), None, goto(&ext_chain)));
        }
        if !has_external {
            r.elements.insert(Element::new("no-endpoint-nodeports", np, comment(), Some(no_ep_verdict())));
        }
    }

    let cidrs: Vec<IpNet> = cfg.cluster_cidrs.iter().filter(|n| family.contains_net(n)).copied().collect();
    let mut masq: Vec<Rule> = Vec::new();
    if has_internal && (cfg.masquerade_all || !cidrs.is_empty()) {
        let except = if cfg.masquerade_all { Vec::new() } else { cidrs.clone() };
        masq.push(Rule::MasqueradeService { daddr: cluster_ip, proto: proto_t, port: p, except });
    }
    let mut chains: Vec<(String, Vec<Rule>)> = Vec::new();
    if uses_ext_chain {
        let mut t = Vec::new();
        if !port.external_policy_local {
            t.push(Rule::Jump(MARK_CHAIN.into()));
        } else {
            if !cidrs.is_empty() {
                let set: Vec<String> = cidrs.iter().map(|c| c.to_string()).collect();
                t.push(Rule::Text(format!("{af} saddr {{ {} }} goto {svc_chain} comment \"short-circuit pod traffic\"", set.join(", "))));
            }
            t.push(Rule::Text("fib saddr type local jump mark-for-masquerade comment \"masquerade local traffic\"".into()));
            t.push(Rule::Text(format!("fib saddr type local goto {svc_chain} comment \"short-circuit local traffic\"")));
        }
        if has_external {
            t.push(Rule::Goto(external_policy_chain.clone()));
        }
        chains.push((ext_chain.clone(), t));
    }
    if uses_fw_chain {
        let ranges: Vec<String> = port.load_balancer_source_ranges.iter().map(|c| c.to_string()).collect();
        chains.push((fw_chain.clone(), vec![Rule::Text(format!("{af} saddr != {{ {} }} drop", ranges.join(", ")))]));
    }
    let mut sets = Vec::new();
    let policy = |eps: &[&Endpoint], sets: &mut Vec<(String, u32)>| -> Vec<Rule> {
        let mut t = Vec::new();
        if let Some(secs) = port.affinity_seconds {
            for ep in eps {
                let epc = endpoint_chain(name, ep);
                let set = format!("affinity-{}", &epc["endpoint-".len()..]);
                t.push(Rule::Text(format!("{af} saddr @{set} goto {epc}")));
                if !sets.iter().any(|(s, _)| s == &set) {
                    sets.push((set, secs));
                }
            }
        }
        if !eps.is_empty() {
            t.push(Rule::Balance(eps.iter().map(|ep| endpoint_chain(name, ep)).collect()));
        }
        t
    };
    if uses_cluster_chain {
        let mut t = if internal_chain == &svc_chain { masq.clone() } else { Vec::new() };
        t.extend(policy(&cat.cluster, &mut sets));
        chains.push((svc_chain.clone(), t));
    }
    if uses_local_chain {
        let mut t = if internal_chain == &local_chain { masq.clone() } else { Vec::new() };
        t.extend(policy(&cat.local, &mut sets));
        chains.push((local_chain.clone(), t));
    }
    for ep in &cat.all_reachable {
        let epc = endpoint_chain(name, ep);
        let mut t = vec![Rule::Hairpin(ep.ip)];
        if port.affinity_seconds.is_some() {
            let set = format!("affinity-{}", &epc["endpoint-".len()..]);
            t.push(Rule::Text(format!("update @{set} {{ {af} saddr }}")));
        }
        t.push(Rule::Dnat { proto: proto_t, addr: ep.ip, port: ep.port });
        chains.push((epc, t));
    }
    r.chains = chains
        .iter()
        .map(|(c, rules)| {
            let mut t = String::new();
            for x in rules {
                rule(&mut t, tf, c, &x.text());
            }
            (c.clone(), t)
        })
        .collect();
    r.rules = chains.into_iter().map(|(_, rules)| rules).collect();
    r.sets = sets;
    r
}

/// The table's fixed part: base chains, helper chains, the shared sets and maps.
fn skeleton(family: Family, cfg: &RenderConfig) -> String {
    let (tf, af, addr_t, lo) = fam(family);
    let mut s = String::with_capacity(4096);
    let _ = writeln!(s, "add table {tf} {TABLE} {{ comment \"rules for kube-proxy\" ; }}");
    let chain = |s: &mut String, name: &str, spec: &str| {
        if spec.is_empty() {
            let _ = writeln!(s, "add chain {tf} {TABLE} {name}");
        } else {
            let _ = writeln!(s, "add chain {tf} {TABLE} {name} {{ {spec} ; }}");
        }
    };
    let r = |s: &mut String, c: &str, body: &str| rule(s, tf, c, body);
    let _ = writeln!(s, "add set {tf} {TABLE} cluster-ips {{ type {addr_t} ; comment \"Active ClusterIPs\" ; }}");
    let _ = writeln!(s, "add set {tf} {TABLE} nodeport-ips {{ type {addr_t} ; comment \"IPs that accept NodePort traffic\" ; }}");
    let _ = writeln!(s, "add map {tf} {TABLE} firewall-ips {{ type {addr_t} . inet_proto . inet_service : verdict ; comment \"destinations that are subject to LoadBalancerSourceRanges\" ; }}");
    let _ = writeln!(s, "add map {tf} {TABLE} no-endpoint-nodeports {{ type inet_proto . inet_service : verdict ; comment \"vmap to drop or reject packets to service nodeports with no endpoints\" ; }}");
    let _ = writeln!(s, "add map {tf} {TABLE} no-endpoint-services {{ type {addr_t} . inet_proto . inet_service : verdict ; comment \"vmap to drop or reject packets to services with no endpoints\" ; }}");
    let _ = writeln!(s, "add map {tf} {TABLE} service-ips {{ type {addr_t} . inet_proto . inet_service : verdict ; comment \"ClusterIP, ExternalIP and LoadBalancer IP traffic\" ; }}");
    let _ = writeln!(s, "add map {tf} {TABLE} service-nodeports {{ type inet_proto . inet_service : verdict ; comment \"NodePort traffic\" ; }}");
    chain(&mut s, "mark-for-masquerade", "");
    r(&mut s, "mark-for-masquerade", "mark set mark or 0x4000");
    chain(&mut s, "masquerading", "");
    r(&mut s, "masquerading", "mark and 0x4000 == 0 return");
    r(&mut s, "masquerading", "mark set mark xor 0x4000");
    r(&mut s, "masquerading", "masquerade fully-random");
    chain(&mut s, "reject-chain", "comment \"helper for @no-endpoint-services / @no-endpoint-nodeports\"");
    r(&mut s, "reject-chain", "reject");
    chain(&mut s, "firewall-check", "");
    r(&mut s, "firewall-check", &format!("{af} daddr . meta l4proto . th dport vmap @firewall-ips"));
    chain(&mut s, "service-endpoints-check", "");
    r(&mut s, "service-endpoints-check", &format!("{af} daddr . meta l4proto . th dport vmap @no-endpoint-services"));
    chain(&mut s, "nodeport-endpoints-check", "");
    match &cfg.nodeport_ips {
        None => r(&mut s, "nodeport-endpoints-check", &format!("fib daddr type local {af} daddr != {lo} meta l4proto . th dport vmap @no-endpoint-nodeports")),
        Some(_) => r(&mut s, "nodeport-endpoints-check", &format!("{af} daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports")),
    }
    chain(&mut s, "cluster-ips-check", "");
    r(&mut s, "cluster-ips-check", &format!("{af} daddr @cluster-ips reject comment \"Reject traffic to invalid ports of ClusterIPs\""));
    chain(&mut s, "services", "");
    r(&mut s, "services", &format!("{af} daddr . meta l4proto . th dport vmap @service-ips"));
    match &cfg.nodeport_ips {
        None => r(&mut s, "services", &format!("fib daddr type local {af} daddr != {lo} meta l4proto . th dport vmap @service-nodeports")),
        Some(_) => r(&mut s, "services", &format!("{af} daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports")),
    }
    if let Some(ips) = &cfg.nodeport_ips {
        let mine: Vec<String> = ips.iter().filter(|ip| family.contains(ip) && !ip.is_loopback()).map(|ip| ip.to_string()).collect();
        if !mine.is_empty() {
            let _ = writeln!(s, "add element {tf} {TABLE} nodeport-ips {{ {} }}", mine.join(", "));
        }
    }
    for (name, spec, jumps) in [
        ("filter-prerouting", "type filter hook prerouting priority -110", &["ct state new jump firewall-check"][..]),
        ("filter-forward", "type filter hook forward priority -110", &["ct state new jump service-endpoints-check", "ct state new jump cluster-ips-check"][..]),
        ("filter-input", "type filter hook input priority -110", &["ct state new jump nodeport-endpoints-check", "ct state new jump service-endpoints-check"][..]),
        ("filter-output", "type filter hook output priority -110", &["ct state new jump service-endpoints-check", "ct state new jump firewall-check"][..]),
        ("filter-output-post-dnat", "type filter hook output priority -90", &["ct state new jump cluster-ips-check"][..]),
        ("nat-output", "type nat hook output priority -100", &["jump services"][..]),
        ("nat-postrouting", "type nat hook postrouting priority 100", &["jump masquerading"][..]),
        ("nat-prerouting", "type nat hook prerouting priority -100", &["jump services"][..]),
    ] {
        chain(&mut s, name, spec);
        for j in jumps {
            r(&mut s, name, j);
        }
    }
    s
}

fn write_service_chains(out: &mut String, tf: &str, r: &Rendered) {
    for (set, secs) in &r.sets {
        let addr_t = if tf == "ip" { "ipv4_addr" } else { "ipv6_addr" };
        let _ = writeln!(out, "add set {tf} {TABLE} {set} {{ type {addr_t} ; flags dynamic,timeout ; timeout {secs}s ; }}");
    }
    for (c, _) in &r.chains {
        let _ = writeln!(out, "add chain {tf} {TABLE} {c}");
    }
}

/// Renders one family against `state`; `full` recreates the table. Updates `state` as if the
/// text was committed (the caller resets it when nft refuses the transaction).
pub fn render(model: &FamilyModel, node: &NodeInfo, cfg: &RenderConfig, state: &mut State, full: bool) -> Output {
    render_changed(model, node, cfg, state, full, None)
}

/// [`render`], told which service ports may differ from `state` (`changed`; None: any may).
/// A partial render looks only at those (the state is changed in place), so its work is
/// proportional to the change, not to the number of service ports.
pub fn render_changed(
    model: &FamilyModel,
    node: &NodeInfo,
    cfg: &RenderConfig,
    state: &mut State,
    full: bool,
    changed: Option<&BTreeSet<ServicePortName>>,
) -> Output {
    let family = model.family;
    let (tf, _, _, _) = fam(family);
    let full = full || !state.committed;
    let mut out = Output { full, ..Output::default() };
    let mut text = String::new();
    if full {
        state.services.clear();
        state.set_refs.clear();
        // One service port at a time: rendered, written into the three parts of the text,
        // kept in the state (digests), its rules dropped before the next is rendered, so the
        // transient strings of one rendering are reused by the next instead of 100,000
        // endpoints' worth of them living at once (the process's memory after a cold sync
        // would stay at that peak, fragmented around what the state keeps).
        let _ = writeln!(text, "add table {tf} {TABLE}");
        let _ = writeln!(text, "delete table {tf} {TABLE}");
        text.push_str(&skeleton(family, cfg));
        let mut rules_text = String::new();
        // per map: its "add element" lines so far, and the elements on the open line
        let mut by_map: BTreeMap<&str, (String, usize)> = BTreeMap::new();
        for (name, entry) in &model.services {
            let r = render_service(entry, node, cfg, family);
            write_service_chains(&mut text, tf, &r);
            for (_, rules) in &r.chains {
                rules_text.push_str(rules);
            }
            out.chains_written += r.chains.len();
            for e in &r.elements {
                let (lines, open) = by_map.entry(e.map).or_default();
                if *open == 1000 {
                    lines.push_str(" }\n");
                    *open = 0;
                }
                if *open == 0 {
                    let _ = write!(lines, "add element {tf} {TABLE} {} {{ {}", e.map, e.text);
                } else {
                    let _ = write!(lines, ", {}", e.text);
                }
                *open += 1;
                out.elements_changed += 1;
            }
            state.count(&r, true);
            state.keep(name.clone(), entry.clone(), r);
        }
        text.push_str(&rules_text);
        drop(rules_text);
        for (_, (lines, open)) in by_map {
            text.push_str(&lines);
            if open > 0 {
                text.push_str(" }\n");
            }
        }
    } else {
        // (old rendering, new rendering) of each changed service port; None = absent
        let mut changes: Vec<(ServicePortName, Option<Rendered>, Option<Rendered>)> = Vec::new();
        for name in &model.changed_since(&state.services, changed) {
            let entry = model.services.get(name);
            let old_r = state.uncommit(name);
            let new_r = entry.map(|e| render_service(e, node, cfg, family));
            if let Some(r) = &new_r {
                state.count(r, true);
            }
            changes.push((name.clone(), old_r, new_r));
        }
        partial(&mut text, &mut out, tf, &changes, state);
        for (name, _, new_r) in changes {
            if let (Some(r), Some(entry)) = (new_r, model.services.get(&name)) {
                state.keep(name, entry.clone(), r);
            }
        }
    }
    out.text = text;
    state.committed = true;
    out
}

/// A committed rendering's chains with their digests.
fn committed_digests(r: &Rendered) -> HashMap<&str, u128> {
    r.chains.iter().zip(&r.digests).map(|((c, _), d)| (c.as_str(), *d)).collect()
}

/// A partial sync's text and operations for `changed` (each service port's old and new
/// rendering), against `state` (the new renderings already counted in its shared elements).
fn partial(
    text: &mut String,
    out: &mut Output,
    tf: &str,
    changed: &[(ServicePortName, Option<Rendered>, Option<Rendered>)],
    state: &State,
) {
    // 1. elements that go; 2. new and changed chains; 3. elements that come; 4. stale chains
    let mut removed_elements: BTreeSet<&Element> = BTreeSet::new();
    let mut added_elements: BTreeSet<&Element> = BTreeSet::new();
    // Chain names are derived from the service port's name (and the endpoint's address):
    // a chain is live when a changed service port's new rendering writes it; the chains of
    // unchanged service ports are not looked at (at 100,000 endpoints that set alone costs
    // ~100 ms per sync).
    let live_chains: BTreeSet<&str> =
        changed.iter().filter_map(|(_, _, n)| n.as_ref()).flat_map(|r| r.chains.iter().map(|(c, _)| c.as_str())).collect();
    let empty = Elements::default();
    // the service port each element, chain and set of the plan belongs to (the culprit of
    // a refused batch)
    let mut owner: HashMap<&str, &ServicePortName> = HashMap::new();
    let mut element_owner: HashMap<&Element, &ServicePortName> = HashMap::new();
    for (name, old_r, new_r) in changed {
        let old_e = old_r.as_ref().map(|r| &r.elements).unwrap_or(&empty);
        let new_e = new_r.as_ref().map(|r| &r.elements).unwrap_or(&empty);
        for e in old_e.difference(new_e).chain(new_e.difference(old_e)) {
            element_owner.insert(e, name);
        }
        removed_elements.extend(old_e.difference(new_e));
        added_elements.extend(new_e.difference(old_e));
        for r in old_r.iter().chain(new_r.iter()) {
            for (c, _) in &r.chains {
                owner.insert(c.as_str(), name);
            }
            for (set, _) in &r.sets {
                owner.insert(set.as_str(), name);
            }
        }
    }
    let mut ops: Vec<(Op, Option<ServicePortName>)> = Vec::new();
    let mut typed = true;
    // elements shared by several service ports (cluster-ips of a multi-port Service) stay
    // while any live rendering still has them (the state counts them)
    removed_elements.retain(|e| !state.element_in_use(e));
    for e in &removed_elements {
        let _ = writeln!(*text, "delete element {tf} {TABLE} {} {{ {} }}", e.map, e.key.text());
        ops.push((Op::DeleteElement { set: e.map, key: e.key.clone() }, element_owner.get(e).map(|n| (*n).clone())));
    }
    let mut stale_chains: BTreeSet<String> = BTreeSet::new();
    let mut stale_sets: BTreeSet<String> = BTreeSet::new();
    for (_, old_r, new_r) in changed {
        let old_chains: HashMap<&str, u128> = old_r.as_ref().map(committed_digests).unwrap_or_default();
        if let Some(r) = new_r {
            let old_sets: BTreeSet<&String> = old_r.as_ref().map(|o| o.sets.iter().map(|(s, _)| s).collect()).unwrap_or_default();
            for (set, secs) in &r.sets {
                if !old_sets.contains(set) {
                    let addr_t = if tf == "ip" { "ipv4_addr" } else { "ipv6_addr" };
                    let _ = writeln!(*text, "add set {tf} {TABLE} {set} {{ type {addr_t} ; flags dynamic,timeout ; timeout {secs}s ; }}");
                    typed = false;
                }
            }
            for (i, (c, rules)) in r.chains.iter().enumerate() {
                if old_chains.get(c.as_str()).is_none_or(|old| *old != crate::names::digest(rules)) {
                    let _ = writeln!(*text, "add chain {tf} {TABLE} {c}");
                    let _ = writeln!(*text, "flush chain {tf} {TABLE} {c}");
                    // its rules follow
                    if r.rules.get(i).is_some_and(|rs| rs.iter().all(Rule::encodable)) {
                        ops.push((Op::AddChain(c.clone()), owner.get(c.as_str()).map(|n| (*n).clone())));
                        ops.push((Op::FlushChain(c.clone()), owner.get(c.as_str()).map(|n| (*n).clone())));
                    } else {
                        typed = false;
                    }
                }
            }
        }
        if let Some(o) = old_r {
            for (c, _) in &o.chains {
                if !live_chains.contains(c.as_str()) {
                    stale_chains.insert(c.clone());
                }
            }
            let keep: BTreeSet<&String> = new_r.as_ref().map(|n| n.sets.iter().map(|(s, _)| s).collect()).unwrap_or_default();
            for (s, _) in &o.sets {
                if !keep.contains(s) {
                    stale_sets.insert(s.clone());
                }
            }
        }
    }
    for (_, old_r, new_r) in changed {
        let old_chains: HashMap<&str, u128> = old_r.as_ref().map(committed_digests).unwrap_or_default();
        if let Some(r) = new_r {
            for (i, (c, rules)) in r.chains.iter().enumerate() {
                if old_chains.get(c.as_str()).is_none_or(|old| *old != crate::names::digest(rules)) {
                    text.push_str(rules);
                    out.chains_written += 1;
                    if typed {
                        for rule in r.rules.get(i).into_iter().flatten() {
                            ops.push((Op::AddRule { chain: c.clone(), rule: rule.clone() }, owner.get(c.as_str()).map(|n| (*n).clone())));
                        }
                    }
                }
            }
        }
    }
    for e in &added_elements {
        let _ = writeln!(*text, "add element {tf} {TABLE} {} {{ {} }}", e.map, e.text);
        ops.push((e.add(), element_owner.get(e).map(|n| (*n).clone())));
    }
    out.elements_changed = removed_elements.len() + added_elements.len();
    let owned = |what: &str| owner.get(what).map(|n| (*n).clone());
    for c in &stale_chains {
        let _ = writeln!(*text, "flush chain {tf} {TABLE} {c}");
        ops.push((Op::FlushChain(c.clone()), owned(c)));
    }
    for c in &stale_chains {
        let _ = writeln!(*text, "delete chain {tf} {TABLE} {c}");
        ops.push((Op::DeleteChain(c.clone()), owned(c)));
    }
    for s in &stale_sets {
        let _ = writeln!(*text, "delete set {tf} {TABLE} {s}");
        ops.push((Op::DeleteSet(s.clone()), owned(s)));
    }
    if typed {
        out.ops = Some(ops);
    }
    out.chains_deleted = stale_chains.len();
}

/// The small chains the drift check counts the rules of (with the least it must find): a
/// deleted table or a flush of the dispatch shows in them, and the probe (a netlink dump the
/// kernel filters to one chain) costs the same at any number of Services.
pub const DRIFT_CHAINS: [(&str, usize); 3] = [("nat-prerouting", 1), ("services", 2), ("filter-forward", 2)];

/// The family keyword of a table (`ip`, `ip6`).
pub fn table_family(family: Family) -> &'static str {
    fam(family).0
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::model::{Protocol, ServicePort};

    fn spn(ns: &str, name: &str, port: &str) -> ServicePortName {
        ServicePortName { namespace: ns.into(), name: name.into(), port: port.into(), protocol: Protocol::Tcp }
    }

    fn ep(ip: &str) -> Endpoint {
        Endpoint {
            ip: ip.parse().unwrap(),
            port: 80,
            ready: true,
            serving: true,
            terminating: false,
            local: false,
            zone: None,
            zone_hints: BTreeSet::new(),
        }
    }

    fn entry(name: ServicePortName, ip: &str, eps: &[&str]) -> ServiceEntry {
        ServiceEntry {
            port: ServicePort {
                name: name.clone(),
                cluster_ip: ip.parse().unwrap(),
                port: 80,
                protocol: Protocol::Tcp,
                node_port: 0,
                external_ips: vec![],
                load_balancer_ips: vec![],
                load_balancer_source_ranges: vec![],
                affinity_seconds: None,
                external_policy_local: false,
                internal_policy_local: false,
                health_check_node_port: 0,
                topology_aware: false,
            },
            endpoints: eps.iter().map(|i| ep(i)).collect(),
        }
    }

    fn model(entries: Vec<ServiceEntry>) -> FamilyModel {
        FamilyModel { family: Family::V4, services: entries.into_iter().map(|e| (e.port.name.clone(), std::sync::Arc::new(e))).collect() }
    }

    fn cfg() -> RenderConfig {
        RenderConfig { cluster_cidrs: vec!["10.0.0.0/8".parse().unwrap()], ..RenderConfig::default() }
    }

    #[test]
    fn names_follow_upstream() {
        let n = spn("ns1", "svc1", "p80");
        assert_eq!(chain_base(&n), "ULMVA6XW-ns1/svc1/tcp/p80");
        assert_eq!(endpoint_chain(&n, &ep("10.180.0.1")), "endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80");
    }

    #[test]
    fn cluster_ip_service_renders_upstreams_rules() {
        let e = entry(spn("ns1", "svc1", "p80"), "172.30.0.41", &["10.180.0.1"]);
        let r = render_service(&e, &NodeInfo::default(), &cfg(), Family::V4);
        assert_eq!(r.chains[0].0, "service-ULMVA6XW-ns1/svc1/tcp/p80");
        assert_eq!(
            r.chains[0].1,
            "add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 ip daddr 172.30.0.41 tcp dport 80 ip saddr != { 10.0.0.0/8 } jump mark-for-masquerade\n\
             add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 }\n"
        );
        assert_eq!(
            r.chains[1].1,
            "add rule ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 ip saddr 10.180.0.1 jump mark-for-masquerade\n\
             add rule ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 meta l4proto tcp dnat to 10.180.0.1:80\n"
        );
        assert!(r.elements.iter().any(|e| e.map == "service-ips" && e.text == "172.30.0.41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80"));
    }

    #[test]
    fn no_endpoints_goes_to_the_reject_chain() {
        let e = entry(spn("ns", "s", "p"), "10.96.0.9", &[]);
        let r = render_service(&e, &NodeInfo::default(), &cfg(), Family::V4);
        assert!(r.chains.is_empty());
        assert!(r.elements.iter().any(|e| e.map == "no-endpoint-services" && e.text.ends_with(": goto reject-chain")));
    }

    #[test]
    fn a_full_render_declares_every_chain_then_the_rules_then_the_elements_1000_per_line() {
        let entries: Vec<ServiceEntry> = (0..1500u32)
            .map(|i| {
                let vip = std::net::Ipv4Addr::from(0x0a60_0000 + i).to_string();
                let ep = std::net::Ipv4Addr::from(0x0a80_0000 + i).to_string();
                entry(spn("ns", &format!("s{i}"), "p"), &vip, &[&ep])
            })
            .collect();
        let m = model(entries);
        let mut st = State::default();
        let o = render(&m, &NodeInfo::default(), &cfg(), &mut st, true);
        let lines: Vec<&str> = o.text.lines().collect();
        let last_chain = lines.iter().rposition(|l| l.starts_with("add chain ")).unwrap();
        let first_rule = lines.iter().position(|l| l.starts_with("add rule ip kube-proxy endpoint-")).unwrap();
        let last_rule = lines.iter().rposition(|l| l.starts_with("add rule ")).unwrap();
        let first_element = lines.iter().position(|l| l.starts_with("add element ")).unwrap();
        assert!(last_chain < first_rule && last_rule < first_element, "{last_chain} {first_rule} {last_rule} {first_element}: {}", lines[last_chain]);
        assert_eq!(o.chains_written, 3000);
        for map in ["cluster-ips", "service-ips"] {
            let mine: Vec<&&str> = lines.iter().filter(|l| l.starts_with(&format!("add element ip kube-proxy {map} {{ "))).collect();
            assert_eq!(mine.len(), 2, "{map}");
            assert!(mine.iter().all(|l| l.ends_with(" }")));
            let counts: Vec<usize> = mine.iter().map(|l| l.matches(", ").count() + 1).collect();
            assert_eq!(counts, [1000, 500], "{map}");
        }
        assert_eq!(o.elements_changed, 3000);
        // every element exactly once, in the model's order
        assert!(o.text.contains("10.96.0.0 . tcp . 80 : goto service-"));
        assert_eq!(o.text.matches("10.96.5.219 . tcp . 80 : goto").count(), 1);
    }

    #[test]
    fn partial_transactions_touch_only_the_change() {
        let a = entry(spn("ns", "a", "p"), "10.96.0.1", &["10.1.0.1"]);
        let b = entry(spn("ns", "b", "p"), "10.96.0.2", &["10.1.0.2"]);
        let mut st = State::default();
        let o = render(&model(vec![a.clone(), b.clone()]), &NodeInfo::default(), &cfg(), &mut st, false);
        assert!(o.full && o.text.starts_with("add table ip kube-proxy\ndelete table ip kube-proxy\n"));
        let o = render(&model(vec![a.clone(), b.clone()]), &NodeInfo::default(), &cfg(), &mut st, false);
        assert_eq!(o.text, "");
        // an endpoint added to b: b's service chain rewritten, one new endpoint chain, no element
        let b2 = entry(spn("ns", "b", "p"), "10.96.0.2", &["10.1.0.2", "10.1.0.3"]);
        let o = render(&model(vec![a.clone(), b2.clone()]), &NodeInfo::default(), &cfg(), &mut st, false);
        assert_eq!((o.chains_written, o.chains_deleted, o.elements_changed), (2, 0, 0), "{}", o.text);
        assert!(!o.text.contains("ns/a/"));
        // b removed: its elements first, then its chains flushed and deleted
        let o = render(&model(vec![a.clone()]), &NodeInfo::default(), &cfg(), &mut st, false);
        assert_eq!(o.chains_deleted, 3, "{}", o.text);
        let del_el = o.text.find("delete element ip kube-proxy service-ips { 10.96.0.2 . tcp . 80 }").unwrap();
        let del_chain = o.text.find("delete chain ip kube-proxy service-").unwrap();
        assert!(del_el < del_chain);
        assert!(o.text.contains("delete element ip kube-proxy cluster-ips { 10.96.0.2 }"));
    }

    /// A model sequence covering what a partial sync handles: endpoints replaced, drained,
    /// restored, a Service added with a node port, ports of one Service (sharing the
    /// ClusterIP element) removed one at a time, nothing changed.
    pub(crate) fn steps() -> Vec<FamilyModel> {
        let mut np = entry(spn("ns", "c", "p"), "10.96.0.3", &["10.1.0.30"]);
        np.port.node_port = 30003;
        let m1 = entry(spn("ns", "m", "p1"), "10.96.0.9", &["10.1.0.90"]);
        let mut m2 = entry(spn("ns", "m", "p2"), "10.96.0.9", &["10.1.0.91"]);
        m2.port.port = 81;
        let a = |eps: &[&str]| entry(spn("ns", "a", "p"), "10.96.0.1", eps);
        let b = |eps: &[&str]| entry(spn("ns", "b", "p"), "10.96.0.2", eps);
        vec![
            model(vec![a(&["10.1.0.1", "10.1.0.2"]), b(&["10.1.0.3"]), m1.clone(), m2.clone()]),
            model(vec![a(&["10.1.0.1", "10.1.0.4"]), b(&["10.1.0.3"]), m1.clone(), m2.clone()]),
            model(vec![a(&["10.1.0.1", "10.1.0.4"]), b(&[]), m1.clone(), m2.clone()]),
            model(vec![a(&["10.1.0.1", "10.1.0.4"]), b(&[]), m1.clone()]),
            model(vec![a(&["10.1.0.1", "10.1.0.4"]), b(&["10.1.0.3"]), m1.clone(), np.clone()]),
            model(vec![b(&["10.1.0.3"]), np.clone()]),
            model(vec![b(&["10.1.0.3"]), np.clone()]),
        ]
    }

    /// The service ports whose entries differ between two models.
    pub(crate) fn differing(a: &FamilyModel, b: &FamilyModel) -> BTreeSet<ServicePortName> {
        a.services.keys().chain(b.services.keys()).filter(|n| a.services.get(*n) != b.services.get(*n)).cloned().collect()
    }

    #[test]
    fn a_partial_render_told_what_changed_is_the_render_that_compares_everything() {
        let node = NodeInfo::default();
        let steps = steps();
        let (mut told, mut told_more, mut compared) = (State::default(), State::default(), State::default());
        for (i, m) in steps.iter().enumerate() {
            let changed = if i == 0 { BTreeSet::new() } else { differing(&steps[i - 1], m) };
            // a hint naming more than what changed is as good
            let mut more = changed.clone();
            more.extend(m.services.keys().cloned());
            let a = render_changed(m, &node, &cfg(), &mut told, false, Some(&changed));
            let b = render_changed(m, &node, &cfg(), &mut told_more, false, Some(&more));
            let c = render(m, &node, &cfg(), &mut compared, false);
            for o in [&b, &c] {
                assert_eq!(a.text, o.text, "step {i}");
                assert_eq!(a.ops, o.ops, "step {i}");
                assert_eq!((a.full, a.chains_written, a.chains_deleted, a.elements_changed), (o.full, o.chains_written, o.chains_deleted, o.elements_changed), "step {i}");
            }
            // and the state is what a full render of this model commits
            let mut fresh = State::default();
            render(m, &node, &cfg(), &mut fresh, true);
            assert_eq!(told.services, fresh.services, "step {i}");
            assert_eq!(told.set_refs, fresh.set_refs, "step {i}");
        }
        // the shared ClusterIP element of ns/m stays while one of its ports is there
        let mut st = State::default();
        render(&steps[2], &node, &cfg(), &mut st, true);
        let o = render_changed(&steps[3], &node, &cfg(), &mut st, false, Some(&differing(&steps[2], &steps[3])));
        assert!(!o.text.contains("delete element ip kube-proxy cluster-ips"), "{}", o.text);
        let o = render_changed(&steps[5], &node, &cfg(), &mut st, false, Some(&differing(&steps[3], &steps[5])));
        assert!(o.text.contains("delete element ip kube-proxy cluster-ips { 10.96.0.9 }"), "{}", o.text);
    }
}
