//! The iptables renderer: a family's model -> `iptables-restore --noflush` text, in upstream
//! kube-proxy's layout (pkg/proxy/iptables/proxier.go, v1.28+), written against the state
//! ferro-proxy committed last so that a sync writes only the chains whose rules changed.
//!
//! Each service port is rendered on its own into a [`Rendered`] (its own chains, and its lines
//! in the shared chains KUBE-SERVICES, KUBE-EXTERNAL-SERVICES, KUBE-NODEPORTS,
//! KUBE-PROXY-FIREWALL); a service port whose [`ServiceEntry`] did not change is not rendered
//! again. The shared chains are the concatenation of every service port's lines in name order
//! (plus fixed rules); they are written only when their text changed. A chain that existed
//! last time and not now is flushed and deleted (`-X`) in the same transaction, after the
//! chains that jumped to it were rewritten.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::model::{categorize, Family, FamilyModel, NodeInfo, ServiceEntry, ServicePortName};
use crate::names;

pub const KUBE_SERVICES: &str = "KUBE-SERVICES";
pub const KUBE_EXTERNAL_SERVICES: &str = "KUBE-EXTERNAL-SERVICES";
pub const KUBE_NODEPORTS: &str = "KUBE-NODEPORTS";
pub const KUBE_POSTROUTING: &str = "KUBE-POSTROUTING";
pub const KUBE_MARK_MASQ: &str = "KUBE-MARK-MASQ";
pub const KUBE_FORWARD: &str = "KUBE-FORWARD";
pub const KUBE_PROXY_FIREWALL: &str = "KUBE-PROXY-FIREWALL";
pub const KUBE_PROXY_CANARY: &str = "KUBE-PROXY-CANARY";
/// Upstream's masquerade mark (bit 14).
pub const MASQ_MARK: &str = "0x4000";

/// What the renderer needs besides the model.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RenderConfig {
    /// The local-traffic detector (upstream's "ClusterCIDR" mode): traffic from outside these
    /// to a ClusterIP is masqueraded; traffic from inside them to an external destination of
    /// an externalTrafficPolicy=Local Service short-circuits to the cluster chain. Only this
    /// family's CIDRs count.
    pub cluster_cidrs: Vec<IpNet>,
    /// Masquerade all traffic to ClusterIPs.
    pub masquerade_all: bool,
    /// None: NodePorts on every local address but loopback (`-m addrtype --dst-type LOCAL`);
    /// Some: only on these addresses (the node's addresses inside `--nodeport-addresses`).
    pub nodeport_ips: Option<Vec<IpAddr>>,
    /// This node's addresses (loadBalancerSourceRanges that contain one also admit traffic
    /// from the node itself, as upstream).
    pub node_ips: Vec<IpAddr>,
}

/// One service port rendered on its own.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rendered {
    /// Its own nat chains (KUBE-SVC/SVL/EXT/FW/SEP) with their rules, in writing order.
    pub chains: Vec<(String, String)>,
    /// Its lines in nat KUBE-SERVICES, nat KUBE-NODEPORTS, filter KUBE-SERVICES, filter
    /// KUBE-EXTERNAL-SERVICES, filter KUBE-NODEPORTS, filter KUBE-PROXY-FIREWALL.
    pub nat_services: String,
    pub nat_nodeports: String,
    pub filter_services: String,
    pub filter_external: String,
    pub filter_nodeports: String,
    pub filter_firewall: String,
    /// Rules in its own chains (for the rules-total metric).
    pub rules: u64,
    /// Whether it has no local endpoint for a Local policy (internal, external).
    pub no_local: (bool, bool),
}

/// What ferro-proxy committed for one family (nothing is read back from the kernel).
#[derive(Debug, Clone, Default)]
pub struct State {
    /// Per service port: the entry it was rendered from, and the result (compact).
    services: HashMap<ServicePortName, (std::sync::Arc<ServiceEntry>, Committed)>,
    /// Text of every shared chain as last written, per (table, chain) (a digest).
    shared: BTreeMap<(&'static str, &'static str), String>,
    /// Rules in each shared chain as last written, the rules of the per-service chains, and
    /// the service ports without a local endpoint for a Local policy (internal, external):
    /// kept up to date by each sync's changes, for the metrics.
    shared_lines: BTreeMap<(&'static str, &'static str), u64>,
    own_rules: u64,
    no_local: (u64, u64),
    /// The configuration the shared chains were last built with.
    cfg: Option<RenderConfig>,
    /// Whether a full write has happened (else the next render is full).
    committed: bool,
}

/// A service port's rendering as kept once committed, for every service port until it
/// changes (10,000 of them at 10,000 Services): its chains' names and digests, not their
/// texts, and its lines of the shared chains, each in one allocation (a `Rendered` kept as
/// such is eleven chain-name strings, a vector of pairs and six strings per service port).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Committed {
    /// Its own chains' names, each followed by a newline, in writing order.
    chains: Box<str>,
    /// [`crate::names::digest`] of each chain's text, in the same order.
    digests: Box<[u128]>,
    /// Its lines of the shared chains ([`Rendered::shared_lines`] order), one after another;
    /// part `i` ends at `ends[i]`.
    lines: Box<str>,
    ends: [u32; 6],
    /// Rules in its own chains.
    rules: u32,
    /// Whether it has no local endpoint for a Local policy (internal, external).
    no_local: (bool, bool),
}

impl Committed {
    fn new(r: &Rendered) -> Committed {
        let mut chains = String::with_capacity(r.chains.iter().map(|(c, _)| c.len() + 1).sum());
        for (c, _) in &r.chains {
            chains.push_str(c);
            chains.push('\n');
        }
        let parts = r.shared_lines();
        let mut lines = String::with_capacity(parts.iter().map(|p| p.len()).sum());
        let mut ends = [0u32; 6];
        for (i, p) in parts.iter().enumerate() {
            lines.push_str(p);
            ends[i] = u32::try_from(lines.len()).unwrap_or(u32::MAX);
        }
        Committed {
            chains: chains.into_boxed_str(),
            digests: r.chains.iter().map(|(_, t)| crate::names::digest(t)).collect(),
            lines: lines.into_boxed_str(),
            ends,
            rules: u32::try_from(r.rules).unwrap_or(u32::MAX),
            no_local: r.no_local,
        }
    }

    /// Its chains' names, in writing order.
    fn chain_names(&self) -> impl Iterator<Item = &str> {
        self.chains.split_terminator('\n')
    }

    /// Its lines of shared chain `i` ([`Rendered::shared_lines`] order).
    fn part(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        self.lines.get(start..self.ends[i] as usize).unwrap_or("")
    }

    fn shared_lines(&self) -> [&str; 6] {
        std::array::from_fn(|i| self.part(i))
    }
}

/// One render's output.
#[derive(Debug, Clone, Default)]
pub struct Output {
    /// The `iptables-restore --noflush` input (empty when nothing changed).
    pub text: String,
    /// Chains written (declared) in this transaction.
    pub written: usize,
    /// Chains deleted in this transaction.
    pub deleted: usize,
    /// Rules in the ruleset after this transaction, per table.
    pub rules: Vec<(String, u64)>,
    /// Service ports with a Local policy and no local endpoint (internal, external).
    pub no_local: (u64, u64),
    /// The whole ruleset was written.
    pub full: bool,
}

fn proto_match(out: &mut String, p: &str) {
    let _ = write!(out, " -m {p} -p {p}");
}

fn net_of(ip: &IpAddr) -> String {
    match ip {
        IpAddr::V4(a) => a.to_string(),
        IpAddr::V6(a) => a.to_string(),
    }
}

/// Upstream's probability(n): 1/n with ten decimals.
pub fn probability(n: usize) -> String {
    format!("{:.10}", 1.0 / n as f64)
}

/// Renders one service port (pure), as upstream's per-service loop of syncProxyRules.
pub fn render_service(entry: &ServiceEntry, node: &NodeInfo, cfg: &RenderConfig, family: Family) -> Rendered {
    let port = &entry.port;
    let name = &port.name;
    let spn = name.to_string();
    let proto = port.protocol.lower();
    let cat = categorize(entry, node);
    let mut r = Rendered::default();

    let svc_chain = names::svc_chain(name);
    let svl_chain = names::svl_chain(name);
    let ext_chain = names::ext_chain(name);
    let fw_chain = names::fw_chain(name);
    let has_endpoints = cat.has_any;
    let uses_cluster_chain = !cat.cluster.is_empty() && port.uses_cluster_endpoints();
    let uses_local_chain = !cat.local.is_empty() && port.uses_local_endpoints();
    let (internal_chain, has_internal) = if port.internal_policy_local {
        (&svl_chain, has_endpoints && !cat.local.is_empty())
    } else {
        (&svc_chain, has_endpoints)
    };
    let (external_policy_chain, has_external) = if port.external_policy_local {
        (&svl_chain, has_endpoints && !cat.local.is_empty())
    } else {
        (&svc_chain, has_endpoints)
    };
    let uses_ext_chain = has_endpoints && port.externally_accessible();
    let uses_fw_chain = has_endpoints && !port.load_balancer_ips.is_empty() && !port.load_balancer_source_ranges.is_empty();
    let lb_chain = if uses_fw_chain { &fw_chain } else { &ext_chain };
    let (internal_target, internal_comment, external_target, external_comment) = if !has_endpoints {
        let c = format!("\"{spn} has no endpoints\"");
        ("REJECT", c.clone(), "REJECT", c)
    } else {
        let c = format!("\"{spn} has no local endpoints\"");
        ("DROP", c.clone(), "DROP", c)
    };
    r.no_local = (has_endpoints && !has_internal, has_endpoints && !has_external && port.externally_accessible());
    let cluster_ip = net_of(&port.cluster_ip);
    let dport = port.port;

    // the ClusterIP
    if has_internal {
        let _ = write!(r.nat_services, "-A {KUBE_SERVICES} -m comment --comment \"{spn} cluster IP\"");
        proto_match(&mut r.nat_services, proto);
        let _ = writeln!(r.nat_services, " -d {cluster_ip} --dport {dport} -j {internal_chain}");
    } else {
        let _ = write!(r.filter_services, "-A {KUBE_SERVICES} -m comment --comment {internal_comment}");
        proto_match(&mut r.filter_services, proto);
        let _ = writeln!(r.filter_services, " -d {cluster_ip} --dport {dport} -j {internal_target}");
    }
    // external IPs
    for ip in &port.external_ips {
        let ip = net_of(ip);
        if has_endpoints {
            let _ = write!(r.nat_services, "-A {KUBE_SERVICES} -m comment --comment \"{spn} external IP\"");
            proto_match(&mut r.nat_services, proto);
            let _ = writeln!(r.nat_services, " -d {ip} --dport {dport} -j {ext_chain}");
        }
        if !has_external {
            let _ = write!(r.filter_external, "-A {KUBE_EXTERNAL_SERVICES} -m comment --comment {external_comment}");
            proto_match(&mut r.filter_external, proto);
            let _ = writeln!(r.filter_external, " -d {ip} --dport {dport} -j {external_target}");
        }
    }
    // load-balancer IPs
    for ip in &port.load_balancer_ips {
        let ip = net_of(ip);
        if has_endpoints {
            let _ = write!(r.nat_services, "-A {KUBE_SERVICES} -m comment --comment \"{spn} loadbalancer IP\"");
            proto_match(&mut r.nat_services, proto);
            let _ = writeln!(r.nat_services, " -d {ip} --dport {dport} -j {lb_chain}");
        }
        if uses_fw_chain {
            let _ = write!(r.filter_firewall, "-A {KUBE_PROXY_FIREWALL} -m comment --comment \"{spn} traffic not accepted by {fw_chain}\"");
            proto_match(&mut r.filter_firewall, proto);
            let _ = writeln!(r.filter_firewall, " -d {ip} --dport {dport} -j DROP");
        }
    }
    if !has_external {
        for ip in &port.load_balancer_ips {
            let ip = net_of(ip);
            let _ = write!(r.filter_external, "-A {KUBE_EXTERNAL_SERVICES} -m comment --comment {external_comment}");
            proto_match(&mut r.filter_external, proto);
            let _ = writeln!(r.filter_external, " -d {ip} --dport {dport} -j {external_target}");
        }
    }
    // node port
    if port.node_port != 0 {
        let np = port.node_port;
        if has_endpoints {
            let _ = write!(r.nat_nodeports, "-A {KUBE_NODEPORTS} -m comment --comment {spn}");
            proto_match(&mut r.nat_nodeports, proto);
            let _ = writeln!(r.nat_nodeports, " --dport {np} -j {ext_chain}");
        }
        if !has_external {
            let _ = write!(
                r.filter_external,
                "-A {KUBE_EXTERNAL_SERVICES} -m comment --comment {external_comment} -m addrtype --dst-type LOCAL"
            );
            proto_match(&mut r.filter_external, proto);
            let _ = writeln!(r.filter_external, " --dport {np} -j {external_target}");
        }
    }
    // health check node port: always accepted
    if port.health_check_node_port != 0 {
        let _ = writeln!(
            r.filter_nodeports,
            "-A {KUBE_NODEPORTS} -m comment --comment \"{spn} health check node port\" -m tcp -p tcp --dport {} -j ACCEPT",
            port.health_check_node_port
        );
    }

    let cidrs: Vec<&IpNet> = cfg.cluster_cidrs.iter().filter(|n| family.contains_net(n)).collect();
    let mut chains: Vec<(String, String)> = Vec::new();
    // the internal chain's masquerade rule comes first in it
    let mut internal_masq = String::new();
    if has_internal {
        let mut args = format!("-A {internal_chain} -m comment --comment \"{spn} cluster IP\"");
        proto_match(&mut args, proto);
        let _ = write!(args, " -d {cluster_ip} --dport {dport}");
        if cfg.masquerade_all {
            let _ = writeln!(internal_masq, "{args} -j {KUBE_MARK_MASQ}");
        } else {
            for c in &cidrs {
                let _ = writeln!(internal_masq, "{args} ! -s {c} -j {KUBE_MARK_MASQ}");
            }
        }
    }
    // external chain
    if uses_ext_chain {
        let mut t = String::new();
        if !port.external_policy_local {
            let _ = writeln!(t, "-A {ext_chain} -m comment --comment \"masquerade traffic for {spn} external destinations\" -j {KUBE_MARK_MASQ}");
        } else {
            for c in &cidrs {
                let _ = writeln!(t, "-A {ext_chain} -m comment --comment \"pod traffic for {spn} external destinations\" -s {c} -j {svc_chain}");
            }
            let _ = writeln!(t, "-A {ext_chain} -m comment --comment \"masquerade LOCAL traffic for {spn} external destinations\" -m addrtype --src-type LOCAL -j {KUBE_MARK_MASQ}");
            let _ = writeln!(t, "-A {ext_chain} -m comment --comment \"route LOCAL traffic for {spn} external destinations\" -m addrtype --src-type LOCAL -j {svc_chain}");
        }
        if has_external {
            let _ = writeln!(t, "-A {ext_chain} -j {external_policy_chain}");
        }
        chains.push((ext_chain.clone(), t));
    }
    // firewall chain
    if uses_fw_chain {
        let mut t = String::new();
        let args = format!("-A {fw_chain} -m comment --comment \"{spn} loadbalancer IP\"");
        let mut from_node = false;
        for c in &port.load_balancer_source_ranges {
            let _ = writeln!(t, "{args} -s {c} -j {ext_chain}");
            if cfg.node_ips.iter().any(|ip| c.contains(ip)) {
                from_node = true;
            }
        }
        if from_node {
            for ip in &port.load_balancer_ips {
                let _ = writeln!(t, "{args} -s {} -j {ext_chain}", net_of(ip));
            }
        }
        let _ = writeln!(t, "-A {fw_chain} -m comment --comment \"other traffic to {spn} will be dropped by KUBE-PROXY-FIREWALL\"");
        chains.push((fw_chain.clone(), t));
    }
    let policy_rules = |chain: &str, eps: &[&crate::model::Endpoint]| -> String {
        let mut t = String::new();
        if let Some(secs) = port.affinity_seconds {
            for ep in eps {
                let sep = names::sep_chain(name, ep);
                let _ = writeln!(
                    t,
                    "-A {chain} -m comment --comment \"{spn} -> {}\" -m recent --name {sep} --rcheck --seconds {secs} --reap -j {sep}",
                    ep.addr()
                );
            }
        }
        let n = eps.len();
        for (i, ep) in eps.iter().enumerate() {
            let sep = names::sep_chain(name, ep);
            let _ = write!(t, "-A {chain} -m comment --comment \"{spn} -> {}\"", ep.addr());
            if i + 1 < n {
                let _ = write!(t, " -m statistic --mode random --probability {}", probability(n - i));
            }
            let _ = writeln!(t, " -j {sep}");
        }
        t
    };
    if uses_cluster_chain {
        let mut t = if internal_chain == &svc_chain { internal_masq.clone() } else { String::new() };
        t.push_str(&policy_rules(&svc_chain, &cat.cluster));
        chains.push((svc_chain.clone(), t));
    }
    if uses_local_chain {
        let mut t = if internal_chain == &svl_chain { internal_masq.clone() } else { String::new() };
        t.push_str(&policy_rules(&svl_chain, &cat.local));
        chains.push((svl_chain.clone(), t));
    }
    for ep in &cat.all_reachable {
        let sep = names::sep_chain(name, ep);
        let ip = net_of(&ep.ip);
        let mut t = String::new();
        let _ = writeln!(t, "-A {sep} -m comment --comment {spn} -s {ip} -j {KUBE_MARK_MASQ}");
        let _ = write!(t, "-A {sep} -m comment --comment {spn}");
        if port.affinity_seconds.is_some() {
            let _ = write!(t, " -m recent --name {sep} --set");
        }
        proto_match(&mut t, proto);
        let _ = writeln!(t, " -j DNAT --to-destination {}", ep.addr());
        chains.push((sep, t));
    }
    r.rules = chains.iter().map(|(_, t)| t.lines().count() as u64).sum();
    r.chains = chains;
    r
}

/// The fixed chains' rules (the same for every model of a family and config).
fn fixed_rules(family: Family, cfg: &RenderConfig) -> Vec<(&'static str, &'static str, String)> {
    let nodeports_tail = match &cfg.nodeport_ips {
        None => {
            let lo = match family {
                Family::V4 => "127.0.0.0/8",
                Family::V6 => "::1/128",
            };
            format!(
                "-A {KUBE_SERVICES} -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL ! -d {lo} -j {KUBE_NODEPORTS}\n"
            )
        }
        Some(ips) => {
            let mut t = String::new();
            for ip in ips.iter().filter(|ip| family.contains(ip) && !ip.is_loopback()) {
                let _ = writeln!(
                    t,
                    "-A {KUBE_SERVICES} -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -d {} -j {KUBE_NODEPORTS}",
                    net_of(ip)
                );
            }
            t
        }
    };
    vec![
        ("nat", "nodeports-tail", nodeports_tail),
        ("nat", KUBE_MARK_MASQ, format!("-A {KUBE_MARK_MASQ} -j MARK --or-mark {MASQ_MARK}\n")),
        (
            "nat",
            KUBE_POSTROUTING,
            format!(
                "-A {KUBE_POSTROUTING} -m mark ! --mark {MASQ_MARK}/{MASQ_MARK} -j RETURN\n\
                 -A {KUBE_POSTROUTING} -j MARK --xor-mark {MASQ_MARK}\n\
                 -A {KUBE_POSTROUTING} -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully\n"
            ),
        ),
        (
            "filter",
            KUBE_FORWARD,
            format!(
                "-A {KUBE_FORWARD} -m conntrack --ctstate INVALID -j DROP\n\
                 -A {KUBE_FORWARD} -m comment --comment \"kubernetes forwarding rules\" -m mark --mark {MASQ_MARK}/{MASQ_MARK} -j ACCEPT\n\
                 -A {KUBE_FORWARD} -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n"
            ),
        ),
    ]
}

/// Whether a chain is one of the per-service-port chains.
pub fn is_service_chain(name: &str) -> bool {
    ["KUBE-SVC-", "KUBE-SVL-", "KUBE-EXT-", "KUBE-FW-", "KUBE-SEP-"].iter().any(|p| name.starts_with(p))
}

/// The chains declared in iptables-save output of one table.
pub fn saved_chains(saved: &str) -> BTreeSet<String> {
    saved
        .lines()
        .filter_map(|l| l.strip_prefix(':'))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// The canary's one rule: a flush of every chain (`iptables -F`) empties it, a deleted table
/// loses it; the drift check looks for it.
pub fn canary_rule() -> String {
    format!("-A {KUBE_PROXY_CANARY} -j RETURN")
}

/// A jump from a built-in chain, as upstream's iptablesJumpChains.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseJump {
    pub table: &'static str,
    pub chain: &'static str,
    /// The rule after `-A <chain> ` as iptables-save prints it.
    pub rule: String,
}

/// The jumps from the built-in chains into ferro-proxy's.
pub fn base_jumps() -> Vec<BaseJump> {
    let j = |table, chain, rule: &str| BaseJump { table, chain, rule: rule.to_string() };
    vec![
        j("filter", "INPUT", "-m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL"),
        j("filter", "INPUT", "-m comment --comment \"kubernetes health check service ports\" -j KUBE-NODEPORTS"),
        j("filter", "INPUT", "-m conntrack --ctstate NEW -m comment --comment \"kubernetes externally-visible service portals\" -j KUBE-EXTERNAL-SERVICES"),
        j("filter", "FORWARD", "-m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL"),
        j("filter", "FORWARD", "-m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD"),
        j("filter", "FORWARD", "-m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES"),
        j("filter", "FORWARD", "-m conntrack --ctstate NEW -m comment --comment \"kubernetes externally-visible service portals\" -j KUBE-EXTERNAL-SERVICES"),
        j("filter", "OUTPUT", "-m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL"),
        j("filter", "OUTPUT", "-m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES"),
        j("nat", "OUTPUT", "-m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES"),
        j("nat", "PREROUTING", "-m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES"),
        j("nat", "POSTROUTING", "-m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING"),
    ]
}

/// The base jumps missing from `saved` (iptables-save output of the filter and nat tables).
pub fn missing_jumps(saved: &str) -> Vec<BaseJump> {
    missing_of(saved, base_jumps())
}

/// Which of `jumps` are missing from `saved` (iptables-save output of their tables).
pub fn missing_of(saved: &str, jumps: Vec<BaseJump>) -> Vec<BaseJump> {
    // only the rules of the chains the jumps live in are kept (the dump of a big nat table
    // has 100,000s of rules; keeping them all would cost tens of MiB at every full sync)
    let chains: BTreeSet<&str> = jumps.iter().map(|j| j.chain).collect();
    let mut have: BTreeSet<(String, String)> = BTreeSet::new();
    let mut table = String::new();
    for line in saved.lines() {
        if let Some(t) = line.strip_prefix('*') {
            table = t.trim().to_string();
        } else if let Some(rule) = line.strip_prefix("-A ") {
            if rule.split_whitespace().next().is_some_and(|c| chains.contains(c)) {
                have.insert((table.clone(), rule.trim().to_string()));
            }
        }
    }
    jumps
        .into_iter()
        .filter(|j| !have.contains(&(j.table.to_string(), format!("{} {}", j.chain, j.rule))))
        .collect()
}

/// Renders one family against `state`. `full` rewrites every chain (and forgets nothing:
/// stale chains of the state are still deleted). `missing` are the base jumps to insert in
/// the same transaction; `existing` are the per-service chains the nat table has now (read
/// at a full sync: after a restart, the chains of Services deleted meanwhile are removed).
/// Returns the text and updates `state` as if it was committed; the caller restores the old
/// state if the kernel refused it.
pub fn render(
    model: &FamilyModel,
    node: &NodeInfo,
    cfg: &RenderConfig,
    state: &mut State,
    full: bool,
    missing: &[BaseJump],
    existing: &BTreeSet<String>,
) -> Output {
    render_changed(model, node, cfg, state, full, missing, existing, None)
}

/// [`render`], told which service ports may differ from `state` (`changed`; None: any may).
/// A partial render looks only at those (the state is changed in place) and builds the shared
/// chains only when a changed service port's lines in them changed (or the configuration
/// did), so an endpoint change costs the same at 10 or 10,000 Services.
#[allow(clippy::too_many_arguments)]
pub fn render_changed(
    model: &FamilyModel,
    node: &NodeInfo,
    cfg: &RenderConfig,
    state: &mut State,
    full: bool,
    missing: &[BaseJump],
    existing: &BTreeSet<String>,
    changed: Option<&BTreeSet<ServicePortName>>,
) -> Output {
    let family = model.family;
    let full = full || !state.committed;
    // render what changed: the chains to write, and the chains of previous renderings that
    // are gone
    let mut changed_chains = Chains::default();
    let mut gone: Vec<String> = Vec::new();
    let mut shared_dirty = full || state.cfg.as_ref() != Some(cfg);
    if full {
        let old = std::mem::take(&mut state.services);
        state.own_rules = 0;
        state.no_local = (0, 0);
        for (name, entry) in &model.services {
            let r = render_service(entry, node, cfg, family);
            for (c, t) in &r.chains {
                changed_chains.insert(c, t);
            }
            state.keep(name.clone(), entry.clone(), &r);
        }
        for (_, c) in old.values() {
            gone.extend(c.chain_names().map(str::to_string));
        }
    } else {
        for name in &model.changed_since(&state.services, changed) {
            let entry = model.services.get(name);
            let prev = state.uncommit(name);
            let r = entry.map(|e| render_service(e, node, cfg, family));
            let prev_chains: HashMap<&str, u128> = prev
                .as_ref()
                .map(|p| p.chain_names().zip(p.digests.iter()).map(|(c, d)| (c, *d)).collect())
                .unwrap_or_default();
            if let Some(r) = &r {
                for (c, t) in &r.chains {
                    if prev_chains.get(c.as_str()).is_none_or(|old| *old != crate::names::digest(t)) {
                        changed_chains.insert(c, t);
                    }
                }
            }
            if let Some(p) = &prev {
                let keep: BTreeSet<&str> = r.iter().flat_map(|r| r.chains.iter().map(|(c, _)| c.as_str())).collect();
                gone.extend(p.chain_names().filter(|c| !keep.contains(c)).map(str::to_string));
            }
            let none = [""; 6];
            shared_dirty |= prev.as_ref().map_or(none, Committed::shared_lines) != r.as_ref().map_or(none, Rendered::shared_lines);
            if let (Some(r), Some(entry)) = (&r, entry) {
                state.keep(name.clone(), entry.clone(), r);
            }
        }
    }
    // chains to delete: every chain of a service port that is gone (or of a previous rendering)
    // unless a service port now writes the same chain. Chain names are derived from the
    // service port's name (and the endpoint's address), so a chain left over by one service
    // port is owned by no other: no need to look at every live chain at a partial sync.
    let mut deleted: BTreeSet<String> = gone.into_iter().filter(|c| !changed_chains.contains_key(c)).collect();
    if !existing.is_empty() {
        let live: BTreeSet<&str> = state.services.values().flat_map(|(_, r)| r.chain_names()).collect();
        for c in existing {
            if is_service_chain(c) && !live.contains(c.as_str()) {
                deleted.insert(c.clone());
            }
        }
    }

    // shared chains, in service port name order: built only when they may have changed
    let mut shared: BTreeMap<(&'static str, &'static str), String> = BTreeMap::new();
    if shared_dirty {
        let ordered: Vec<&Committed> = model.services.keys().filter_map(|k| state.services.get(k).map(|(_, r)| r)).collect();
        let fixed = fixed_rules(family, cfg);
        let concat = |part: usize| -> String {
            let mut s = String::with_capacity(ordered.iter().map(|r| r.part(part).len()).sum::<usize>() + 256);
            for r in &ordered {
                s.push_str(r.part(part));
            }
            s
        };
        let mut nat_services = concat(0);
        if let Some((_, _, tail)) = fixed.iter().find(|(_, c, _)| *c == "nodeports-tail") {
            nat_services.push_str(tail);
        }
        shared.insert(("nat", KUBE_SERVICES), nat_services);
        shared.insert(("nat", KUBE_NODEPORTS), concat(1));
        shared.insert(("filter", KUBE_SERVICES), concat(2));
        shared.insert(("filter", KUBE_EXTERNAL_SERVICES), concat(3));
        shared.insert(("filter", KUBE_NODEPORTS), concat(4));
        shared.insert(("filter", KUBE_PROXY_FIREWALL), concat(5));
        for (t, c, text) in fixed.into_iter().filter(|(_, c, _)| *c != "nodeports-tail") {
            shared.insert((t, c), text);
        }
        for t in ["mangle", "nat", "filter"] {
            shared.insert((t, KUBE_PROXY_CANARY), format!("{}\n", canary_rule()));
        }
    }

    // the transaction
    let mut out = Output { full, ..Output::default() };
    let mut text = String::with_capacity(
        changed_chains.text.len() + if full { shared.values().map(String::len).sum() } else { 4096 },
    );
    let mut written = 0usize;
    for table in ["mangle", "filter", "nat"] {
        let shared_here: Vec<(&&str, &String)> = shared
            .iter()
            .filter(|((t, _), _)| *t == table)
            .filter(|(k, v)| full || !state.shared.get(*k).is_some_and(|old| crate::names::same_text(old, v)))
            .map(|((_, c), v)| (c, v))
            .collect();
        let own_here = table == "nat";
        let jumps: Vec<&BaseJump> = missing.iter().filter(|j| j.table == table).collect();
        if shared_here.is_empty() && jumps.is_empty() && (!own_here || (changed_chains.is_empty() && deleted.is_empty())) {
            continue;
        }
        let _ = writeln!(text, "*{table}");
        for (c, _) in &shared_here {
            let _ = writeln!(text, ":{c} - [0:0]");
        }
        if own_here {
            for c in changed_chains.at.keys().chain(deleted.iter()) {
                let _ = writeln!(text, ":{c} - [0:0]");
            }
        }
        for j in &jumps {
            let _ = writeln!(text, "-I {} {}", j.chain, j.rule);
        }
        for (_, rules) in &shared_here {
            text.push_str(rules);
        }
        if own_here {
            for rules in changed_chains.texts() {
                text.push_str(rules);
            }
            for c in &deleted {
                let _ = writeln!(text, "-X {c}");
            }
        }
        let _ = writeln!(text, "COMMIT");
        written += shared_here.len() + if own_here { changed_chains.len() } else { 0 };
    }
    out.written = written;
    out.deleted = deleted.len();
    out.text = text;

    if shared_dirty {
        state.shared_lines = shared.iter().map(|(k, v)| (*k, v.lines().count() as u64)).collect();
        state.shared = shared.into_iter().map(|(k, v)| (k, crate::names::text_digest(&v))).collect();
        state.cfg = Some(cfg.clone());
    }
    let count = |table: &str| -> u64 { state.shared_lines.iter().filter(|((t, _), _)| *t == table).map(|(_, n)| n).sum() };
    out.rules = vec![("filter".into(), count("filter")), ("nat".into(), count("nat") + state.own_rules)];
    out.no_local = state.no_local;
    state.committed = true;
    out
}

/// The per-service chains a transaction writes, by name, their texts one after another in
/// one string (at a full sync that is 110,000 chains at 100,000 endpoints: one allocation
/// instead of a copy of each, which would outlive the sync's other strings and leave the heap
/// fragmented around what the state keeps).
#[derive(Default)]
struct Chains {
    text: String,
    at: BTreeMap<String, std::ops::Range<usize>>,
}

impl Chains {
    fn insert(&mut self, name: &str, rules: &str) {
        let start = self.text.len();
        self.text.push_str(rules);
        self.at.insert(name.to_string(), start..self.text.len());
    }

    fn contains_key(&self, name: &str) -> bool {
        self.at.contains_key(name)
    }

    /// Their texts, in name order.
    fn texts(&self) -> impl Iterator<Item = &str> {
        self.at.values().map(|r| &self.text[r.clone()])
    }

    fn len(&self) -> usize {
        self.at.len()
    }

    fn is_empty(&self) -> bool {
        self.at.is_empty()
    }
}

impl Rendered {
    /// Its lines of the shared chains: nat KUBE-SERVICES, nat KUBE-NODEPORTS, filter
    /// KUBE-SERVICES, filter KUBE-EXTERNAL-SERVICES, filter KUBE-NODEPORTS, filter
    /// KUBE-PROXY-FIREWALL.
    fn shared_lines(&self) -> [&str; 6] {
        [
            &self.nat_services,
            &self.nat_nodeports,
            &self.filter_services,
            &self.filter_external,
            &self.filter_nodeports,
            &self.filter_firewall,
        ]
    }
}

impl State {
    /// Keeps a rendering as committed (its chains' digests, not their text), counted in the
    /// totals.
    fn keep(&mut self, name: ServicePortName, entry: std::sync::Arc<ServiceEntry>, r: &Rendered) {
        let c = Committed::new(r);
        self.own_rules += u64::from(c.rules);
        self.no_local.0 += u64::from(c.no_local.0);
        self.no_local.1 += u64::from(c.no_local.1);
        self.services.insert(name, (entry, c));
    }

    /// Takes a service port's rendering out of the state and of the totals.
    fn uncommit(&mut self, name: &ServicePortName) -> Option<Committed> {
        let (_, r) = self.services.remove(name)?;
        self.own_rules -= u64::from(r.rules);
        self.no_local.0 -= u64::from(r.no_local.0);
        self.no_local.1 -= u64::from(r.no_local.1);
        Some(r)
    }

    /// Forgets everything: the next render is full (after a failed restore, a drift).
    pub fn reset(&mut self) {
        self.committed = false;
    }

    /// The service port whose chain a line of the transaction writes or jumps to (to name
    /// the culprit of a refused transaction).
    pub fn owner_of_line(&self, line: &str) -> Option<ServicePortName> {
        let tokens: BTreeSet<&str> = line.split_whitespace().collect();
        self.services
            .iter()
            .find(|(_, (_, r))| r.chain_names().any(|c| tokens.contains(c)))
            .map(|(name, _)| name.clone())
    }

    /// Chains ferro-proxy believes it has in the nat table (for tests and diagnostics).
    pub fn nat_chains(&self) -> BTreeSet<String> {
        self.services.values().flat_map(|(_, r)| r.chain_names().map(str::to_string)).collect()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::model::{Endpoint, Protocol, ServicePort};

    pub(crate) fn spn(ns: &str, name: &str, port: &str) -> ServicePortName {
        ServicePortName { namespace: ns.into(), name: name.into(), port: port.into(), protocol: Protocol::Tcp }
    }

    pub(crate) fn ep(ip: &str, port: u16, local: bool) -> Endpoint {
        Endpoint {
            ip: ip.parse().unwrap(),
            port,
            ready: true,
            serving: true,
            terminating: false,
            local,
            zone: None,
            zone_hints: BTreeSet::new(),
        }
    }

    pub(crate) fn sp(name: ServicePortName, ip: &str, port: u16) -> ServicePort {
        ServicePort {
            name,
            cluster_ip: ip.parse().unwrap(),
            port,
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
        }
    }

    fn node() -> NodeInfo {
        NodeInfo { name: "node1".into(), zone: None }
    }

    fn cfg() -> RenderConfig {
        RenderConfig { cluster_cidrs: vec!["10.0.0.0/8".parse().unwrap()], ..RenderConfig::default() }
    }

    fn model(entries: Vec<ServiceEntry>) -> FamilyModel {
        FamilyModel { family: Family::V4, services: entries.into_iter().map(|e| (e.port.name.clone(), std::sync::Arc::new(e))).collect() }
    }

    #[test]
    fn cluster_ip_service_renders_upstreams_rules() {
        let e = ServiceEntry { port: sp(spn("ns1", "svc1", "p80"), "172.30.0.41", 80), endpoints: vec![ep("10.180.0.1", 80, false)] };
        let r = render_service(&e, &node(), &cfg(), Family::V4);
        assert_eq!(
            r.nat_services,
            "-A KUBE-SERVICES -m comment --comment \"ns1/svc1:p80 cluster IP\" -m tcp -p tcp -d 172.30.0.41 --dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O\n"
        );
        assert_eq!(
            r.chains,
            vec![
                (
                    "KUBE-SVC-XPGD46QRK7WJZT7O".to_string(),
                    "-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment \"ns1/svc1:p80 cluster IP\" -m tcp -p tcp -d 172.30.0.41 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ\n\
                     -A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment \"ns1/svc1:p80 -> 10.180.0.1:80\" -j KUBE-SEP-SXIVWICOYRO3J4NJ\n"
                        .to_string()
                ),
                (
                    "KUBE-SEP-SXIVWICOYRO3J4NJ".to_string(),
                    "-A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -s 10.180.0.1 -j KUBE-MARK-MASQ\n\
                     -A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.1:80\n"
                        .to_string()
                ),
            ]
        );
    }

    #[test]
    fn no_endpoints_rejects_in_filter() {
        let e = ServiceEntry { port: sp(spn("ns6", "svc6", "p80"), "172.30.0.46", 80), endpoints: vec![] };
        let r = render_service(&e, &node(), &cfg(), Family::V4);
        assert!(r.nat_services.is_empty() && r.chains.is_empty());
        assert_eq!(
            r.filter_services,
            "-A KUBE-SERVICES -m comment --comment \"ns6/svc6:p80 has no endpoints\" -m tcp -p tcp -d 172.30.0.46 --dport 80 -j REJECT\n"
        );
    }

    #[test]
    fn probabilities_are_upstreams() {
        assert_eq!(probability(2), "0.5000000000");
        assert_eq!(probability(3), "0.3333333333");
        let e = ServiceEntry {
            port: sp(spn("ns", "s", ""), "10.96.0.1", 80),
            endpoints: vec![ep("10.1.0.1", 80, false), ep("10.1.0.2", 80, false), ep("10.1.0.3", 80, false)],
        };
        let r = render_service(&e, &node(), &cfg(), Family::V4);
        let svc = &r.chains[0].1;
        assert!(svc.contains("--probability 0.3333333333 -j KUBE-SEP-"), "{svc}");
        assert!(svc.contains("--probability 0.5000000000 -j KUBE-SEP-"), "{svc}");
        assert_eq!(svc.matches("statistic").count(), 2);
    }

    #[test]
    fn partial_sync_writes_only_what_changed() {
        let a = ServiceEntry { port: sp(spn("ns", "a", "http"), "10.96.0.1", 80), endpoints: vec![ep("10.1.0.1", 80, false)] };
        let b = ServiceEntry { port: sp(spn("ns", "b", "http"), "10.96.0.2", 80), endpoints: vec![ep("10.1.0.2", 80, false)] };
        let mut st = State::default();
        let o = render(&model(vec![a.clone(), b.clone()]), &node(), &cfg(), &mut st, false, &base_jumps(), &BTreeSet::new());
        assert!(o.full);
        assert!(o.text.contains(":KUBE-SERVICES - [0:0]") && o.text.contains("-I PREROUTING"));
        // nothing changed: nothing written
        let o = render(&model(vec![a.clone(), b.clone()]), &node(), &cfg(), &mut st, false, &[], &BTreeSet::new());
        assert_eq!(o.text, "");
        // one endpoint added to b: b's SVC chain and the new SEP chain, no shared chain
        let mut b2 = b.clone();
        b2.endpoints.push(ep("10.1.0.3", 80, false));
        let o = render(&model(vec![a.clone(), b2.clone()]), &node(), &cfg(), &mut st, false, &[], &BTreeSet::new());
        let declared: Vec<&str> = o.text.lines().filter(|l| l.starts_with(':')).collect();
        assert_eq!(declared.len(), 2, "{}", o.text);
        assert!(o.text.contains(&format!(":{} - [0:0]", names::svc_chain(&b.port.name))));
        assert!(!o.text.contains(":KUBE-SERVICES"));
        // b removed: its chains deleted, KUBE-SERVICES rewritten without it
        let o = render(&model(vec![a.clone()]), &node(), &cfg(), &mut st, false, &[], &BTreeSet::new());
        assert_eq!(o.deleted, 3, "{}", o.text);
        assert!(o.text.contains(&format!("-X {}", names::svc_chain(&b.port.name))));
        assert!(o.text.contains(":KUBE-SERVICES - [0:0]"));
        assert!(!o.text.contains("10.96.0.2"));
        assert_eq!(st.nat_chains().len(), 2);
        // endpoint removed from a: the old SEP chain is deleted
        let mut a2 = a.clone();
        a2.endpoints = vec![ep("10.1.0.9", 80, false)];
        let o = render(&model(vec![a2]), &node(), &cfg(), &mut st, false, &[], &BTreeSet::new());
        assert!(o.text.contains(&format!("-X {}", names::sep_chain(&a.port.name, &a.endpoints[0]))), "{}", o.text);
    }

    #[test]
    fn a_full_sync_removes_chains_left_from_before_a_restart() {
        let a = ServiceEntry { port: sp(spn("ns", "a", "http"), "10.96.0.1", 80), endpoints: vec![ep("10.1.0.1", 80, false)] };
        let saved = "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]\n:FERRO-MASQ-1 - [0:0]\nCOMMIT\n";
        let mut st = State::default();
        let o = render(&model(vec![a]), &node(), &cfg(), &mut st, true, &[], &saved_chains(saved));
        assert!(o.text.contains("-X KUBE-SVC-AAAAAAAAAAAAAAAA"), "{}", o.text);
        assert!(!o.text.contains("FERRO-MASQ"));
    }

    #[test]
    fn missing_jumps_reads_iptables_save() {
        let saved = "*nat\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\nCOMMIT\n";
        let missing = missing_jumps(saved);
        assert_eq!(missing.len(), base_jumps().len() - 1);
        assert!(!missing.iter().any(|j| j.table == "nat" && j.chain == "PREROUTING"));
    }

    #[test]
    fn a_partial_render_told_what_changed_is_the_render_that_compares_everything() {
        let e = |name: &str, ip: &str, eps: &[&str]| ServiceEntry {
            port: sp(spn("ns", name, "http"), ip, 80),
            endpoints: eps.iter().map(|i| ep(i, 80, false)).collect(),
        };
        let mut np = e("c", "10.96.0.3", &["10.1.0.30"]);
        np.port.node_port = 30003;
        np.port.external_policy_local = true;
        let mut m2 = ServiceEntry { port: sp(spn("ns", "m", "p2"), "10.96.0.9", 81), endpoints: vec![ep("10.1.0.91", 81, true)] };
        m2.port.internal_policy_local = true;
        let a = |eps: &[&str]| e("a", "10.96.0.1", eps);
        let b = |eps: &[&str]| e("b", "10.96.0.2", eps);
        let steps = [
            model(vec![a(&["10.1.0.1", "10.1.0.2"]), b(&["10.1.0.3"]), m2.clone()]),
            model(vec![a(&["10.1.0.1", "10.1.0.4"]), b(&["10.1.0.3"]), m2.clone()]),
            model(vec![a(&["10.1.0.1", "10.1.0.4"]), b(&[]), m2.clone()]),
            model(vec![a(&["10.1.0.1", "10.1.0.4"]), b(&[]), np.clone()]),
            model(vec![a(&["10.1.0.1", "10.1.0.4"]), b(&["10.1.0.3"]), np.clone()]),
            model(vec![b(&["10.1.0.3"]), np.clone()]),
            model(vec![b(&["10.1.0.3"]), np.clone()]),
        ];
        let differing = |a: &FamilyModel, b: &FamilyModel| -> BTreeSet<ServicePortName> {
            a.services.keys().chain(b.services.keys()).filter(|n| a.services.get(*n) != b.services.get(*n)).cloned().collect()
        };
        let none = BTreeSet::new();
        let (mut told, mut told_more, mut compared) = (State::default(), State::default(), State::default());
        for (i, m) in steps.iter().enumerate() {
            let changed = if i == 0 { BTreeSet::new() } else { differing(&steps[i - 1], m) };
            let mut more = changed.clone();
            more.extend(m.services.keys().cloned());
            let x = render_changed(m, &node(), &cfg(), &mut told, false, &[], &none, Some(&changed));
            let y = render_changed(m, &node(), &cfg(), &mut told_more, false, &[], &none, Some(&more));
            let z = render(m, &node(), &cfg(), &mut compared, false, &[], &none);
            for o in [&y, &z] {
                assert_eq!(x.text, o.text, "step {i}");
                assert_eq!((x.written, x.deleted, &x.rules, x.no_local, x.full), (o.written, o.deleted, &o.rules, o.no_local, o.full), "step {i}");
            }
            // the state and the totals are what a full render of this model gives
            let mut fresh = State::default();
            let f = render(m, &node(), &cfg(), &mut fresh, true, &[], &none);
            assert_eq!((&x.rules, x.no_local), (&f.rules, f.no_local), "step {i}");
            assert_eq!(told.services, fresh.services, "step {i}");
            assert_eq!((&told.shared, &told.shared_lines, told.own_rules), (&fresh.shared, &fresh.shared_lines, fresh.own_rules), "step {i}");
            if i == 1 {
                assert!(!x.text.contains(":KUBE-SERVICES"), "an endpoint change writes no shared chain: {}", x.text);
            }
        }
        // a changed configuration (the node's addresses) rebuilds the shared chains
        let mut other = cfg();
        other.nodeport_ips = Some(vec!["192.0.2.1".parse().unwrap()]);
        let o = render_changed(&steps[6], &node(), &other, &mut told, false, &[], &none, Some(&BTreeSet::new()));
        assert!(o.text.contains(":KUBE-SERVICES - [0:0]") && o.text.contains("192.0.2.1"), "{}", o.text);
    }
}
