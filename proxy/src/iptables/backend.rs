//! The iptables backend: renders each family against the state it committed, reads the kernel
//! only at a full sync (which base jumps are missing: `iptables -S` of the six built-in chains
//! they live in; which per-service chains exist: the nat table's chain names through the
//! [`RuleCounter`]'s netlink dump — never `iptables-save`, which takes minutes at 100,000
//! chains), and
//! applies the result in one `iptables-restore -w --noflush` per family. A refused restore
//! changes nothing in the kernel (the transaction is atomic) and makes the next sync full.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;

use crate::controller::{Backend, Changes, SyncReport};
use crate::error::{ExecError, SyncError};
use crate::exec::Runner;
use crate::iptables::rules::{self, RenderConfig, State};
use crate::model::{Family, FamilyModel, NodeInfo, ServicePortName};
use crate::nfcount::RuleCounter;

/// No service port changed.
static NONE: BTreeSet<ServicePortName> = BTreeSet::new();

/// The iptables backend over a [`Runner`].
pub struct IptablesBackend<R: Runner> {
    runner: R,
    cluster_cidrs: Vec<IpNet>,
    masquerade_all: bool,
    nodeport_cidrs: Vec<IpNet>,
    states: BTreeMap<Family, State>,
    counter: Box<dyn RuleCounter>,
}

/// (iptables, iptables-save, iptables-restore) of `family`.
pub fn tools(family: Family) -> (&'static str, &'static str, &'static str) {
    match family {
        Family::V4 => ("iptables", "iptables-save", "iptables-restore"),
        Family::V6 => ("ip6tables", "ip6tables-save", "ip6tables-restore"),
    }
}

/// The rules of the built-in chains `jumps` live in, each listed alone with `iptables -S
/// <chain>` (iptables-nft fetches only that chain; iptables-save fetches the whole table), in
/// iptables-save's layout for [`rules::missing_of`].
pub fn base_chain_rules<R: Runner>(runner: &mut R, family: Family, jumps: &[rules::BaseJump]) -> Result<String, ExecError> {
    let (iptables, _, _) = tools(family);
    let chains: BTreeSet<(&str, &str)> = jumps.iter().map(|j| (j.table, j.chain)).collect();
    let mut out = String::new();
    for (table, chain) in chains {
        out.push('*');
        out.push_str(table);
        out.push('\n');
        out.push_str(&runner.run(iptables, &["-w", "-t", table, "-S", chain], None)?);
        out.push_str("COMMIT\n");
    }
    Ok(out)
}

/// Whether the three KUBE-PROXY-CANARY chains (mangle, nat, filter) of `family` still hold
/// their rule (iptables and IPVS mode write them; a flush or a deleted table empties one).
pub fn canaries_intact(counter: &mut dyn RuleCounter, family: Family) -> bool {
    for table in ["mangle", "nat", "filter"] {
        match counter.count(family, table, rules::KUBE_PROXY_CANARY) {
            Ok(Some(n)) if n > 0 => {}
            other => {
                tracing::warn!(?family, table, answer = ?other, "canary chain gone or flushed");
                return false;
            }
        }
    }
    true
}

/// A refused transaction: with the service port its error line belongs to, or as a whole.
enum Refusal {
    Of(Box<crate::model::ServicePortName>, ExecError),
    Whole(ExecError),
}

/// The service port a kernel tool's refusal points at: the line its error names, looked up
/// with `owner` (the committed state's chain names).
pub fn culprit(
    e: &ExecError,
    text: &str,
    owner: impl Fn(&str) -> Option<crate::model::ServicePortName>,
) -> Option<crate::model::ServicePortName> {
    let ExecError::Failed { stderr, .. } = e else { return None };
    let n = crate::model::error_line(stderr)?;
    let line = text.lines().nth(n.checked_sub(1)?)?;
    // one `add element` line carries many service ports' elements: where nft names a column,
    // only the element around it counts
    let part = match crate::model::error_column(stderr).and_then(|c| c.checked_sub(1)).filter(|c| *c < line.len()) {
        Some(c) if line.is_char_boundary(c) => {
            let start = line[..c].rfind([',', '{']).map_or(0, |i| i + 1);
            let end = line[c..].find([',', '}']).map_or(line.len(), |i| c + i);
            &line[start..end]
        }
        _ => line,
    };
    owner(part)
}

/// The addresses of `ip -o addr show` output.
pub fn local_addresses(ip_addr_output: &str) -> Vec<IpAddr> {
    ip_addr_output
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            while let Some(tok) = w.next() {
                if tok == "inet" || tok == "inet6" {
                    return w.next().and_then(|a| a.split('/').next()).and_then(|a| a.parse().ok());
                }
            }
            None
        })
        .collect()
}

impl<R: Runner> IptablesBackend<R> {
    /// `counter` probes the canary chains for the drift check.
    pub fn new(
        runner: R,
        counter: Box<dyn RuleCounter>,
        cluster_cidrs: Vec<IpNet>,
        masquerade_all: bool,
        nodeport_cidrs: Vec<IpNet>,
    ) -> Self {
        IptablesBackend { runner, cluster_cidrs, masquerade_all, nodeport_cidrs, states: BTreeMap::new(), counter }
    }

    fn render_config(&mut self, family: Family) -> Result<RenderConfig, ExecError> {
        let locals = local_addresses(&self.runner.run("ip", &["-o", "addr", "show"], None)?);
        let nodeport_ips = if self.nodeport_cidrs.is_empty() {
            None
        } else {
            Some(
                locals
                    .iter()
                    .filter(|ip| family.contains(ip) && self.nodeport_cidrs.iter().any(|n| n.contains(*ip)))
                    .copied()
                    .collect(),
            )
        };
        Ok(RenderConfig {
            cluster_cidrs: self.cluster_cidrs.iter().filter(|n| family.contains_net(n)).copied().collect(),
            masquerade_all: self.masquerade_all,
            nodeport_ips,
            node_ips: locals.into_iter().filter(|ip| family.contains(ip) && !ip.is_loopback()).collect(),
        })
    }

    fn sync_family(&mut self, model: &FamilyModel, node: &NodeInfo, full: bool, changed: Option<&Changes>) -> Result<rules::Output, Refusal> {
        let family = model.family;
        let (_, _, restore) = tools(family);
        let cfg = self.render_config(family).map_err(Refusal::Whole)?;
        let full = full || !self.states.contains_key(&family);
        let (missing, existing) = if full {
            let jumps = rules::base_jumps();
            let base = base_chain_rules(&mut self.runner, family, &jumps).map_err(Refusal::Whole)?;
            let existing = self
                .counter
                .chains(family, "nat")
                .map_err(|source| Refusal::Whole(ExecError::Spawn { program: "the nat table's chain dump (netlink)".into(), source }))?;
            (rules::missing_of(&base, jumps), existing)
        } else {
            (Vec::new(), BTreeSet::new())
        };
        let state = self.states.entry(family).or_default();
        let hint = changed.map(|c| c.get(&family).unwrap_or(&NONE));
        let out = rules::render_changed(model, node, &cfg, state, full, &missing, &existing, hint);
        if !out.text.is_empty() {
            if let Err(e) = self.runner.run(restore, &["-w", "--noflush"], Some(&out.text)) {
                // nothing of the transaction is in the kernel: start over with a full sync
                let owner = self.states.remove(&family).and_then(|st| culprit(&e, &out.text, |l| st.owner_of_line(l)));
                return Err(match owner {
                    Some(service) => Refusal::Of(Box::new(service), e),
                    None => Refusal::Whole(e),
                });
            }
        }
        Ok(out)
    }
}

impl<R: Runner> Backend for IptablesBackend<R> {
    fn sync(&mut self, models: &[FamilyModel], node: &NodeInfo, full: bool) -> Result<SyncReport, SyncError> {
        self.sync_families(models, node, full, None)
    }

    fn sync_changed(&mut self, models: &[FamilyModel], node: &NodeInfo, full: bool, changed: &Changes) -> Result<SyncReport, SyncError> {
        self.sync_families(models, node, full, Some(changed))
    }

    fn drifted(&mut self) -> bool {
        let families: Vec<Family> = self.states.keys().copied().collect();
        for family in families {
            if !canaries_intact(self.counter.as_mut(), family) {
                self.states.remove(&family);
                return true;
            }
        }
        false
    }
}

impl<R: Runner> IptablesBackend<R> {
    fn sync_families(&mut self, models: &[FamilyModel], node: &NodeInfo, full: bool, changed: Option<&Changes>) -> Result<SyncReport, SyncError> {
        let mut report = SyncReport { full: true, rules: Vec::new() };
        for m in models {
            let family = m.family;
            let out = self.sync_family(m, node, full, changed).map_err(|r| match r {
                Refusal::Of(service, source) => SyncError::Refused { family, service, source },
                Refusal::Whole(source) => SyncError::Apply { family, source },
            })?;
            report.full &= out.full;
            let suffix = if m.family == Family::V6 { "6" } else { "" };
            for (t, n) in out.rules {
                report.rules.push((format!("{t}{suffix}"), n));
            }
            tracing::debug!(family = ?m.family, written = out.written, deleted = out.deleted, bytes = out.text.len(), full = out.full, "iptables-restore");
        }
        Ok(report)
    }
}

/// What a full sync runs on IPv4 (iptables and IPVS mode alike): the address listing, the
/// built-in chains' rules read one by one ([`base_chain_rules`]), then one restore.
#[cfg(test)]
pub(crate) const FULL_SYNC_CALLS: [&str; 8] = [
    "ip -o addr show",
    "iptables -w -t filter -S FORWARD",
    "iptables -w -t filter -S INPUT",
    "iptables -w -t filter -S OUTPUT",
    "iptables -w -t nat -S OUTPUT",
    "iptables -w -t nat -S POSTROUTING",
    "iptables -w -t nat -S PREROUTING",
    "iptables-restore -w --noflush",
];

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::exec::Recording;
    use crate::model::{Endpoint, Protocol, ServiceEntry, ServicePort, ServicePortName};

    fn model() -> FamilyModel {
        let name = ServicePortName { namespace: "ns".into(), name: "a".into(), port: "".into(), protocol: Protocol::Tcp };
        let port = ServicePort {
            name: name.clone(),
            cluster_ip: "10.96.0.1".parse().unwrap(),
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
        };
        let ep = Endpoint {
            ip: "10.1.0.1".parse().unwrap(),
            port: 80,
            ready: true,
            serving: true,
            terminating: false,
            local: false,
            zone: None,
            zone_hints: Default::default(),
        };
        FamilyModel { family: Family::V4, services: [(name, std::sync::Arc::new(ServiceEntry { port, endpoints: vec![ep] }))].into() }
    }

    #[test]
    fn full_sync_reads_the_kernel_then_partial_syncs_do_not() {
        let r = Recording::new();
        let mut b = IptablesBackend::new(r.clone(), Box::new(crate::nfcount::Fake(|_, _, _| Some(1))), vec!["10.0.0.0/8".parse().unwrap()], false, vec![]);
        let node = NodeInfo::default();
        let rep = b.sync(&[model()], &node, false).unwrap();
        assert!(rep.full);
        let lines: Vec<String> = r.calls().iter().map(|c| c.line()).collect();
        assert_eq!(
            lines,
            FULL_SYNC_CALLS
        );
        let text = r.calls()[7].stdin.clone().unwrap();
        assert!(text.contains("-I PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES"), "{text}");
        // unchanged: no restore at all
        let rep = b.sync(&[model()], &node, false).unwrap();
        assert!(!rep.full);
        assert_eq!(r.calls().len(), 9, "only the address listing");
    }

    #[test]
    fn a_refused_restore_makes_the_next_sync_full() {
        let r = Recording::new();
        let mut b = IptablesBackend::new(r.clone(), Box::new(crate::nfcount::Fake(|_, _, _| Some(1))), vec![], false, vec![]);
        b.sync(&[model()], &NodeInfo::default(), false).unwrap();
        let mut m = model();
        std::sync::Arc::make_mut(m.services.values_mut().next().unwrap()).endpoints[0].port = 81;
        let refuse = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let rf = refuse.clone();
        r.answer(move |c| {
            (c.program == "iptables-restore" && rf.swap(false, std::sync::atomic::Ordering::SeqCst)).then(|| {
                Err(ExecError::Failed { program: "iptables-restore".into(), status: "exit 2".into(), stderr: "line 3 failed".into() })
            })
        });
        let e = b.sync(&[m.clone()], &NodeInfo::default(), false).unwrap_err();
        assert!(matches!(e, SyncError::Apply { family: Family::V4, .. }));
        let rep = b.sync(&[m], &NodeInfo::default(), false).unwrap();
        assert!(rep.full);
    }

    #[test]
    fn a_refusal_on_one_service_ports_line_names_it() {
        let r = Recording::new();
        let mut b = IptablesBackend::new(r.clone(), Box::new(crate::nfcount::Fake(|_, _, _| Some(1))), vec![], false, vec![]);
        let text = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let t = text.clone();
        r.answer(move |c| {
            (c.program == "iptables-restore").then(|| {
                // refuse the line that writes the service's endpoint chain
                let stdin = c.stdin.clone().unwrap_or_default();
                let n = stdin.lines().position(|l| l.starts_with("-A KUBE-SEP-")).unwrap() + 1;
                *t.lock().unwrap() = stdin;
                Err(ExecError::Failed {
                    program: "iptables-restore".into(),
                    status: "exit status: 2".into(),
                    stderr: format!("iptables-restore v1.8.9 (nf_tables): unknown option\nError occurred at line: {n}\n"),
                })
            })
        });
        let e = b.sync(&[model()], &NodeInfo::default(), false).unwrap_err();
        match e {
            SyncError::Refused { family, service, .. } => {
                assert_eq!(family, Family::V4);
                assert_eq!(&*service.name, "a");
            }
            other => panic!("{other}"),
        }
        assert!(!text.lock().unwrap().is_empty());
        // a refusal at COMMIT (the kernel's own, no line of a service) is the whole sync's
        let r = Recording::new();
        let mut b = IptablesBackend::new(r.clone(), Box::new(crate::nfcount::Fake(|_, _, _| Some(1))), vec![], false, vec![]);
        r.answer(|c| {
            (c.program == "iptables-restore").then(|| {
                let n = c.stdin.as_deref().unwrap_or_default().lines().position(|l| l == "COMMIT").unwrap() + 1;
                Err(ExecError::Failed { program: "iptables-restore".into(), status: "exit status: 1".into(), stderr: format!("Error occurred at line: {n}") })
            })
        });
        assert!(matches!(b.sync(&[model()], &NodeInfo::default(), false).unwrap_err(), SyncError::Apply { .. }));
    }

    #[test]
    fn a_batched_element_line_names_the_element_nft_points_at() {
        let line = "add element ip kube-proxy service-ips { 10.0.0.1 . tcp . 80 : goto service-A-x, 10.0.0.1 . tcp . 80 : goto service-B-y }";
        let col = line.rfind("10.0.0.1").unwrap() + 1;
        let e = ExecError::Failed {
            program: "nft".into(),
            status: "exit status: 1".into(),
            stderr: format!("/dev/stdin:2:{col}-{}: Error: Could not process rule: File exists\n", col + 7),
        };
        let text = format!("add table ip kube-proxy\n{line}\n");
        let who = culprit(&e, &text, |part| {
            let n = |name: &str| crate::model::ServicePortName { namespace: "ns".into(), name: name.into(), port: "p".into(), protocol: crate::model::Protocol::Tcp };
            if part.contains("service-A-x") {
                Some(n("a"))
            } else if part.contains("service-B-y") {
                Some(n("b"))
            } else {
                None
            }
        });
        assert_eq!(&*who.unwrap().name, "b");
    }

    #[test]
    fn drift_is_a_missing_or_empty_canary() {
        for (answer, drifted) in [(Some(1), false), (Some(0), true), (None, true)] {
            let r = Recording::new();
            let mut b = IptablesBackend::new(
                r.clone(),
                Box::new(crate::nfcount::Fake(move |_, t, c| {
                    assert_eq!(c, "KUBE-PROXY-CANARY");
                    if t == "filter" { answer } else { Some(1) }
                })),
                vec![],
                false,
                vec![],
            );
            assert!(!b.drifted(), "nothing committed, nothing to check");
            b.sync(&[model()], &NodeInfo::default(), false).unwrap();
            assert_eq!(b.drifted(), drifted, "{answer:?}");
        }
    }

    #[test]
    fn local_addresses_from_ip_addr() {
        let out = "1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever\n2: eth0    inet 192.168.77.1/24 brd 192.168.77.255 scope global eth0\n2: eth0    inet6 fe80::1/64 scope link\n";
        let ips = local_addresses(out);
        assert_eq!(ips.len(), 3);
        assert_eq!(ips[1], "192.168.77.1".parse::<IpAddr>().unwrap());
    }
}
