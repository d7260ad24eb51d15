//! ferro-netd, the node network daemon: turns this node's pod CIDR (from its Node object)
//! into the CNI conflist and subnet file ferro-cni reads, keeps the VXLAN overlay (FDB,
//! neighbour and route entries towards every other node) and the node-wide masquerade chain.
//!
//! Layers: [`config`] (flags), [`plan`] and [`render`] (pure); the executor and the control
//! loop come next.

pub mod config;
pub mod error;
pub mod plan;
pub mod render;
