//! ferro-proxy, ferro's kube-proxy: Services and EndpointSlices -> iptables, nftables or IPVS.
//!
//! Layers (the shape of cni-plugin's netd): [`model`] (pure: the API objects reduced to service
//! ports and endpoints), renderers per mode ([`iptables`], [`nftables`], [`ipvs`]; pure), executors
//! behind narrow traits (one atomic apply each), and the controller (informers -> sync).

pub mod config;
pub mod conntrack;
pub mod backend;
pub mod cleanup;
pub mod controller;
pub mod error;
pub mod exec;
pub mod health;
pub mod ipvs;
pub mod iptables;
pub mod model;
pub mod mem;
pub mod metrics;
pub mod names;
pub mod nfcount;
pub mod nl;
pub mod nftables;
pub mod server;
pub mod slim;
pub mod trace;
