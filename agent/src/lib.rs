//! ferro-agent: the node side of ferro, a kubelet. This first slice registers the Node, keeps
//! its Lease renewed and reports node status; pods come with the CRI client.

pub mod config;
pub mod node;
pub mod status;
