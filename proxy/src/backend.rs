//! The mode's backend, chosen from the configuration.

use crate::config::{Config, Mode};
use crate::controller::{Backend, SyncReport};
use crate::error::SyncError;
use crate::model::{FamilyModel, NodeInfo};

impl Backend for Box<dyn Backend> {
    fn sync(&mut self, models: &[FamilyModel], node: &NodeInfo, full: bool) -> Result<SyncReport, SyncError> {
        (**self).sync(models, node, full)
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
            cfg.cluster_cidrs.clone(),
            cfg.masquerade_all,
            cfg.nodeport_addresses.clone(),
        ))),
        Mode::Nftables => Ok(Box::new(crate::nftables::backend::NftBackend::new(
            crate::exec::Host,
            cfg.cluster_cidrs.clone(),
            cfg.masquerade_all,
            cfg.nodeport_addresses.clone(),
        ))),
        Mode::Ipvs => {
            Err(SyncError::Unsupported(format!("proxy mode {} is not wired yet", cfg.mode.as_str())))
        }
    }
}
