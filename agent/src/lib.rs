//! ferro-agent: the node side of ferro, a kubelet. It registers the Node and keeps its Lease
//! and status ([`node`], [`status`]), runs the pods bound to it through CRI ([`pod`], over the
//! [`cri::Cri`] trait), mounts their volumes ([`pod::volume`], CSI in [`csi`]), evicts under
//! node pressure ([`eviction`]) and serves logs, exec, attach, port-forward, metrics and the
//! node's and pods' resource usage ([`stats`]) on :10250 ([`server`]). docs/design/agent.md
//! describes it.

pub mod bootstrap;
pub mod certificate;
pub mod clock;
pub mod discovery;
pub mod config;
pub mod cri;
pub mod csi;
pub mod eviction;
pub mod node;
pub mod pod;
pub mod server;
pub mod stats;
pub mod status;
