//! ferro-dns, the node-local cluster DNS server: the Kubernetes DNS specification answered
//! from Service and EndpointSlice informers, other names forwarded to the node's resolvers.
//!
//! Layers (the shape of cni-plugin's netd): [`model`] (pure: Services and slices -> records ->
//! an index), [`answer`] (pure: query bytes + index -> response or "forward"), the executors
//! behind narrow traits ([`forward::Upstream`], [`iface::Interface`]), [`controller`]
//! (informers -> a reconcile per Service -> a published index) and the thin [`server`]
//! (UDP and TCP sockets). Design and reasons: docs/design/dns.md.

pub mod answer;
pub mod config;
pub mod controller;
pub mod error;
pub mod forward;
pub mod handler;
pub mod iface;
pub mod model;
pub mod server;
