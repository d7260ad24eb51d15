//! Pods on this node: the model of what the runtime holds ([`model`]), the planner of one
//! sync ([`plan`]) with its crash-loop backoff ([`backoff`]), and (to come) the status
//! computation, CRI configs, volumes, probes and the per-pod workers.

pub mod backoff;
pub mod model;
pub mod plan;
