//! ferro-netd, the node network daemon: turns this node's pod CIDR (from its Node object)
//! into the CNI conflist and subnet file ferro-cni reads, keeps the VXLAN overlay (FDB,
//! neighbour and route entries towards every other node) and the node-wide masquerade chain.
//!
//! Layers: [`config`] (flags), [`plan`] and [`render`] (pure), [`kernel`] (the executor),
//! [`controller`] (watch + resync -> reconcile).

pub mod config;
pub mod controller;
pub mod error;
pub mod kernel;
pub mod plan;
pub mod render;
