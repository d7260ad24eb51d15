//! The nftables backend: one `nft -f -` transaction per family, rendered against the state it
//! committed; a refused transaction changes nothing in the kernel and makes the next sync full.

use std::collections::BTreeMap;

use ipnet::IpNet;

use crate::controller::{Backend, SyncReport};
use crate::error::{ExecError, SyncError};
use crate::iptables::backend::culprit;
use crate::exec::Runner;
use crate::iptables::backend::local_addresses;
use crate::model::{Family, FamilyModel, NodeInfo};
use crate::nfcount::RuleCounter;
use crate::nftables::rules::{self, RenderConfig, State};

pub struct NftBackend<R: Runner> {
    runner: R,
    cluster_cidrs: Vec<IpNet>,
    masquerade_all: bool,
    nodeport_cidrs: Vec<IpNet>,
    states: BTreeMap<Family, State>,
    counter: Box<dyn RuleCounter>,
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
        NftBackend { runner, cluster_cidrs, masquerade_all, nodeport_cidrs, states: BTreeMap::new(), counter }
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
        let mut report = SyncReport { full: true, rules: Vec::new() };
        for m in models {
            let family = m.family;
            let cfg = self.render_config(family).map_err(|source| SyncError::Apply { family, source })?;
            let full = full || !self.states.contains_key(&family);
            let state = self.states.entry(family).or_default();
            let out = rules::render(m, node, &cfg, state, full);
            report.full &= out.full;
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
}
