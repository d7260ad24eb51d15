//! The nftables backend: one transaction per family, rendered against the state it committed;
//! a refused transaction changes nothing in the kernel and makes the next sync full. Full syncs
//! (and partial ones with a rule or set that is not encoded: affinity, a Local traffic policy's
//! `fib` rules, firewall ranges) go through `nft -f -`; other partial syncs (elements, chains
//! added, rewritten or deleted with their rules: an endpoint change) go as one netlink batch
//! through the [`NftWriter`] when one is given, which spares `nft`'s listing of every chain of
//! the table.

use std::collections::{BTreeMap, BTreeSet};

use ipnet::IpNet;

use crate::controller::{Backend, Changes, SyncReport};
use crate::error::{ExecError, SyncError};
use crate::iptables::backend::culprit;
use crate::exec::Runner;
use crate::iptables::backend::local_addresses;
use crate::model::{Family, FamilyModel, NodeInfo, ServicePortName};
use crate::nfcount::RuleCounter;
use crate::nftables::netlink::{BatchError, NftWriter};
use crate::nftables::rules::{self, RenderConfig, State};

/// No service port changed.
static NONE: BTreeSet<ServicePortName> = BTreeSet::new();

pub struct NftBackend<R: Runner> {
    runner: R,
    cluster_cidrs: Vec<IpNet>,
    masquerade_all: bool,
    nodeport_cidrs: Vec<IpNet>,
    states: BTreeMap<Family, State>,
    counter: Box<dyn RuleCounter>,
    writer: Option<Box<dyn NftWriter>>,
}

impl<R: Runner> NftBackend<R> {
    /// `counter` probes the dispatch chains for the drift check.
    pub fn new(
        runner: R,
        counter: Box<dyn RuleCounter>,
        cluster_cidrs: Vec<IpNet>,
        masquerade_all: bool,
        nodeport_cidrs: Vec<IpNet>,
    ) -> Self {
        NftBackend { runner, cluster_cidrs, masquerade_all, nodeport_cidrs, states: BTreeMap::new(), counter, writer: None }
    }

    /// Partial syncs that can be written through netlink go through `writer`.
    pub fn with_writer(mut self, writer: Box<dyn NftWriter>) -> Self {
        self.writer = Some(writer);
        self
    }

    fn render_config(&mut self, family: Family) -> Result<RenderConfig, ExecError> {
        let nodeport_ips = if self.nodeport_cidrs.is_empty() {
            None
        } else {
            let locals = local_addresses(&self.runner.run("ip", &["-o", "addr", "show"], None)?);
            Some(
                locals
                    .into_iter()
                    .filter(|ip| family.contains(ip) && self.nodeport_cidrs.iter().any(|n| n.contains(ip)))
                    .collect(),
            )
        };
        Ok(RenderConfig {
            cluster_cidrs: self.cluster_cidrs.iter().filter(|n| family.contains_net(n)).copied().collect(),
            masquerade_all: self.masquerade_all,
            nodeport_ips,
        })
    }
}

impl<R: Runner> Backend for NftBackend<R> {
    fn sync(&mut self, models: &[FamilyModel], node: &NodeInfo, full: bool) -> Result<SyncReport, SyncError> {
        self.sync_families(models, node, full, None)
    }

    fn sync_changed(&mut self, models: &[FamilyModel], node: &NodeInfo, full: bool, changed: &Changes) -> Result<SyncReport, SyncError> {
        self.sync_families(models, node, full, Some(changed))
    }

    fn drifted(&mut self) -> bool {
        let families: Vec<Family> = self.states.keys().copied().collect();
        for family in families {
            for (chain, want) in rules::DRIFT_CHAINS {
                match self.counter.count(family, rules::TABLE, chain) {
                    Ok(Some(n)) if n >= want => {}
                    other => {
                        tracing::warn!(?family, chain, answer = ?other, "kube-proxy table gone or flushed");
                        self.states.remove(&family);
                        return true;
                    }
                }
            }
        }
        false
    }
}

impl<R: Runner> NftBackend<R> {
    fn sync_families(&mut self, models: &[FamilyModel], node: &NodeInfo, full: bool, changed: Option<&Changes>) -> Result<SyncReport, SyncError> {
        let mut report = SyncReport { full: true, rules: Vec::new() };
        for m in models {
            let family = m.family;
            let cfg = self.render_config(family).map_err(|source| SyncError::Apply { family, source })?;
            let full = full || !self.states.contains_key(&family);
            let state = self.states.entry(family).or_default();
            let hint = changed.map(|c| c.get(&family).unwrap_or(&NONE));
            let out = rules::render_changed(m, node, &cfg, state, full, hint);
            report.full &= out.full;
            if let (Some(writer), Some(ops)) = (self.writer.as_mut(), out.ops.as_ref()) {
                if ops.is_empty() {
                    continue;
                }
                let plain: Vec<_> = ops.iter().map(|(op, _)| op.clone()).collect();
                if let Err(e) = writer.apply(family, rules::TABLE, &plain) {
                    self.states.remove(&family);
                    let service = match &e {
                        BatchError::Refused { index: Some(i), .. } => ops.get(*i).and_then(|(_, owner)| owner.clone()),
                        _ => None,
                    };
                    let source = ExecError::Failed { program: "nftables netlink batch".into(), status: "refused".into(), stderr: e.to_string() };
                    tracing::warn!(?family, error = %e, ?service, "netlink batch refused; next sync is full");
                    return Err(match service {
                        Some(service) => SyncError::Refused { family, service: Box::new(service), source },
                        None => SyncError::Apply { family, source },
                    });
                }
                tracing::debug!(?family, ops = ops.len(), deleted = out.chains_deleted, elements = out.elements_changed, "netlink batch");
                continue;
            }
            if !out.text.is_empty() {
                if let Err(source) = self.runner.run("nft", &["-f", "-"], Some(&out.text)) {
                    let culprit = self.states.remove(&family).and_then(|st| culprit(&source, &out.text, |l| st.owner_of_line(l)));
                    return Err(match culprit {
                        Some(service) => SyncError::Refused { family, service: Box::new(service), source },
                        None => SyncError::Apply { family, source },
                    });
                }
            }
            tracing::debug!(?family, chains = out.chains_written, deleted = out.chains_deleted, elements = out.elements_changed, bytes = out.text.len(), full = out.full, "nft -f");
        }
        Ok(report)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::exec::Recording;

    #[test]
    fn drift_is_a_missing_or_short_dispatch_chain() {
        for (answer, drifted) in [(Some(2), false), (Some(1), true), (None, true)] {
            let r = Recording::new();
            let mut b = NftBackend::new(
                r.clone(),
                Box::new(crate::nfcount::Fake(move |_, t, c| {
                    assert_eq!(t, "kube-proxy");
                    if c == "services" { answer } else { Some(2) }
                })),
                vec![],
                false,
                vec![],
            );
            let m = FamilyModel { family: Family::V4, services: Default::default() };
            b.sync(&[m], &NodeInfo::default(), false).unwrap();
            assert_eq!(r.calls().len(), 1, "one nft -f");
            assert_eq!(b.drifted(), drifted, "{answer:?}");
        }
    }

    fn entry(name: &str, ip: &str, eps: &[&str]) -> crate::model::ServiceEntry {
        use crate::model::{Endpoint, Protocol, ServiceEntry, ServicePort, ServicePortName};
        let name = ServicePortName { namespace: "ns".into(), name: name.into(), port: "p".into(), protocol: Protocol::Tcp };
        ServiceEntry {
            port: ServicePort {
                name,
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
            endpoints: eps
                .iter()
                .map(|i| Endpoint {
                    ip: i.parse().unwrap(),
                    port: 80,
                    ready: true,
                    serving: true,
                    terminating: false,
                    local: false,
                    zone: None,
                    zone_hints: Default::default(),
                })
                .collect(),
        }
    }

    fn model(entries: &[crate::model::ServiceEntry]) -> FamilyModel {
        FamilyModel { family: Family::V4, services: entries.iter().map(|e| (e.port.name.clone(), std::sync::Arc::new(e.clone()))).collect() }
    }

    #[test]
    fn partial_syncs_of_elements_chains_and_rules_go_as_one_netlink_batch() {
        use crate::nftables::netlink::{Key, Op, Recording as Batches};
        use crate::nftables::rule::Rule;
        let r = Recording::new();
        let batches = Batches::new();
        let mut b = NftBackend::new(r.clone(), Box::new(crate::nfcount::Fake(|_, _, _| Some(2))), vec![], false, vec![])
            .with_writer(Box::new(batches.clone()));
        let a = entry("a", "10.96.0.1", &["10.1.0.1"]);
        let node = NodeInfo::default();
        b.sync(&[model(std::slice::from_ref(&a))], &node, false).unwrap();
        assert_eq!(r.calls().len(), 1, "the cold start is nft -f");
        assert!(batches.batches().is_empty());
        // a Service with no endpoints: elements only -> netlink
        let z = entry("z", "10.96.0.9", &[]);
        b.sync(&[model(&[a.clone(), z.clone()])], &node, false).unwrap();
        assert_eq!(r.calls().len(), 1, "no nft process for a partial sync");
        let got = batches.batches();
        assert_eq!(got.len(), 1);
        assert!(got[0].1.contains(&Op::AddElement {
            set: "no-endpoint-services",
            key: Key::AddrProtoPort("10.96.0.9".parse().unwrap(), crate::model::Protocol::Tcp, 80),
            comment: Some("ns/z:p".into()),
            verdict: Some(crate::nftables::netlink::Verdict::Goto("reject-chain".into())),
        }));
        // an endpoint added writes rules: the service chain rewritten, the new endpoint's chain
        // created, both through netlink
        let a2 = entry("a", "10.96.0.1", &["10.1.0.1", "10.1.0.2"]);
        b.sync(&[model(&[a2.clone(), z.clone()])], &node, false).unwrap();
        assert_eq!(r.calls().len(), 1, "no nft process for an endpoint change");
        let last = batches.batches().pop().unwrap().1;
        let svc = last.iter().find_map(|o| match o {
            Op::AddChain(c) if c.starts_with("service-") => Some(c.clone()),
            _ => None,
        });
        let svc = svc.expect("the service chain is rewritten");
        let ep2 = "endpoint-".to_string() + &last.iter().find_map(|o| match o {
            Op::AddChain(c) if c.contains("10.1.0.2") => c.strip_prefix("endpoint-").map(str::to_string),
            _ => None,
        }).expect("the new endpoint's chain");
        let at = |want: &Op| last.iter().position(|o| o == want).unwrap_or_else(|| panic!("{want:?} in {last:?}"));
        // chains first (created, flushed), then their rules
        let first_rule = last.iter().position(|o| matches!(o, Op::AddRule { .. })).unwrap();
        assert!(at(&Op::FlushChain(svc.clone())) < first_rule && at(&Op::AddChain(ep2.clone())) < first_rule);
        let balance = last
            .iter()
            .find_map(|o| match o {
                Op::AddRule { chain, rule: Rule::Balance(eps) } if chain == &svc => Some(eps.clone()),
                _ => None,
            })
            .expect("numgen vmap rule");
        assert_eq!(balance.len(), 2);
        assert!(at(&Op::AddChain(ep2.clone())) < at(&Op::AddRule { chain: svc.clone(), rule: Rule::Balance(balance) }));
        assert!(last.contains(&Op::AddRule {
            chain: ep2.clone(),
            rule: Rule::Dnat { proto: crate::model::Protocol::Tcp, addr: "10.1.0.2".parse().unwrap(), port: 80 }
        }));
        assert!(!last.iter().any(|o| matches!(o, Op::AddChain(c) if c.contains("10.1.0.1"))), "the unchanged endpoint chain is not written");
        // a Service with session affinity: its sets and dynset rules are not encoded -> nft -f
        let mut s = entry("s", "10.96.0.5", &["10.1.0.5"]);
        s.port.affinity_seconds = Some(10800);
        b.sync(&[model(&[a2.clone(), z.clone(), s.clone()])], &node, false).unwrap();
        assert_eq!(r.calls().len(), 2, "affinity: nft -f");
        b.sync(&[model(&[a2.clone(), z.clone()])], &node, false).unwrap();
        assert_eq!(r.calls().len(), 2, "removing it is elements and chains: netlink");
        // a removed Service: elements deleted, chains flushed and deleted -> netlink
        b.sync(&[model(std::slice::from_ref(&z))], &node, false).unwrap();
        assert_eq!(r.calls().len(), 2);
        let last = batches.batches().pop().unwrap().1;
        assert!(matches!(last.first(), Some(Op::DeleteElement { .. })), "{last:?}");
        assert!(matches!(last.last(), Some(Op::DeleteChain(_))), "{last:?}");
        // a refused batch names the service port, changes nothing and makes the next sync full
        batches.refuse_next(0, 2);
        let e = b.sync(&[model(&[])], &node, false).unwrap_err();
        assert!(matches!(&e, SyncError::Refused { service, .. } if &*service.name == "z"), "{e:?}");
        let report = b.sync(&[model(&[])], &node, false).unwrap();
        assert!(report.full);
        assert_eq!(r.calls().len(), 3, "the full sync after the refusal is nft -f");
    }
}
