//! ferro-agent: the node side of ferro, a kubelet. This first slice registers the Node, keeps
//! its Lease renewed and reports node status from the CRI runtime's Version and Status; pods come later.

pub mod clock;
pub mod config;
pub mod cri;
pub mod csi;
pub mod eviction;
pub mod node;
pub mod pod;
pub mod server;
pub mod status;
