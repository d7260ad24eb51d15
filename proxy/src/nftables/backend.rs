//! The nftables backend: one `nft -f -` transaction per family, rendered against the state it
//! committed; a refused transaction changes nothing in the kernel and makes the next sync full.

use std::collections::BTreeMap;

use ipnet::IpNet;

use crate::controller::{Backend, SyncReport};
use crate::error::{ExecError, SyncError};
use crate::exec::Runner;
use crate::iptables::backend::local_addresses;
use crate::model::{Family, FamilyModel, NodeInfo};
use crate::nftables::rules::{self, RenderConfig, State};

pub struct NftBackend<R: Runner> {
    runner: R,
    cluster_cidrs: Vec<IpNet>,
    masquerade_all: bool,
    nodeport_cidrs: Vec<IpNet>,
    states: BTreeMap<Family, State>,
}

impl<R: Runner> NftBackend<R> {
    pub fn new(runner: R, cluster_cidrs: Vec<IpNet>, masquerade_all: bool, nodeport_cidrs: Vec<IpNet>) -> Self {
        NftBackend { runner, cluster_cidrs, masquerade_all, nodeport_cidrs, states: BTreeMap::new() }
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
                    self.states.remove(&family);
                    return Err(SyncError::Apply { family, source });
                }
            }
            tracing::debug!(?family, chains = out.chains_written, deleted = out.chains_deleted, elements = out.elements_changed, bytes = out.text.len(), full = out.full, "nft -f");
        }
        Ok(report)
    }

    fn drifted(&mut self) -> bool {
        let families: Vec<Family> = self.states.keys().copied().collect();
        for family in families {
            let tf = rules::table_family(family);
            for chain in rules::DRIFT_CHAINS {
                match self.runner.run("nft", &["list", "chain", tf, rules::TABLE, chain], None) {
                    Ok(out) if rules::drift_listing_ok(chain, &out) => {}
                    Ok(_) | Err(_) => {
                        tracing::warn!(?family, chain, "kube-proxy table gone or flushed");
                        self.states.remove(&family);
                        return true;
                    }
                }
            }
        }
        false
    }
}
