//! Pods on this node: the model of what the runtime holds ([`model`]), probes ([`probe`]) and
//! lifecycle hooks ([`hooks`]), and (to come) the planner, status computation, CRI configs,
//! volumes and the per-pod workers.

pub mod hooks;
pub mod model;
pub mod probe;
