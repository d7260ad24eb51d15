//! The mode's backend, chosen from the configuration.

use crate::config::{Config, Mode};
use crate::controller::{Backend, Changes, SyncReport};
use crate::error::SyncError;
use crate::model::{FamilyModel, NodeInfo};

impl Backend for Box<dyn Backend> {
    fn sync(&mut self, models: &[FamilyModel], node: &NodeInfo, full: bool) -> Result<SyncReport, SyncError> {
        (**self).sync(models, node, full)
    }
    fn sync_changed(&mut self, models: &[FamilyModel], node: &NodeInfo, full: bool, changed: &Changes) -> Result<SyncReport, SyncError> {
        (**self).sync_changed(models, node, full, changed)
    }
    fn drifted(&mut self) -> bool {
        (**self).drifted()
    }
}

/// The backend for `cfg.mode`, with the real kernel tools.
pub fn for_mode(cfg: &Config) -> Result<Box<dyn Backend>, SyncError> {
    match cfg.mode {
        Mode::Iptables => Ok(Box::new(crate::iptables::backend::IptablesBackend::new(
            crate::exec::Host,
            iptables_counter(),
            cfg.cluster_cidrs.clone(),
            cfg.masquerade_all,
            cfg.nodeport_addresses.clone(),
        ))),
        Mode::Nftables => Ok(Box::new(crate::nftables::backend::NftBackend::new(
            crate::exec::Host,
            Box::new(crate::nfcount::Netlink::new()),
            cfg.cluster_cidrs.clone(),
            cfg.masquerade_all,
            cfg.nodeport_addresses.clone(),
        )
        .with_writer(Box::new(crate::nftables::netlink::Kernel::new(None))))),
        Mode::Ipvs => {
            // refuse at start, with the reason, on a kernel without IPVS
            crate::ipvs::netlink::Ipvs::new(None)
                .probe()
                .map_err(|e| SyncError::Unsupported(format!("proxy mode ipvs: {e}")))?;
            Ok(Box::new(crate::ipvs::backend::IpvsBackend::new(
                crate::ipvs::exec::Kernel::new(crate::exec::Host, None),
                crate::exec::Host,
                iptables_counter(),
                cfg.cluster_cidrs.clone(),
                cfg.masquerade_all,
                cfg.nodeport_addresses.clone(),
            )))
        }
    }
}

/// The canary probe for iptables: netlink when `iptables` is iptables-nft (Debian 12's
/// default; its tables are nftables tables), `iptables -S` for iptables-legacy.
fn iptables_counter() -> Box<dyn crate::nfcount::RuleCounter> {
    use crate::exec::Runner as _;
    let version = crate::exec::Host.run("iptables", &["-V"], None).unwrap_or_default();
    if version.contains("nf_tables") {
        Box::new(crate::nfcount::Netlink::new())
    } else {
        tracing::info!(%version, "iptables is not iptables-nft: the drift check lists the canary chains with iptables -S");
        Box::new(crate::nfcount::ViaIptables(crate::exec::Host))
    }
}
