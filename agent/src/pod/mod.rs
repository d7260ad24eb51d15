//! Pods on this node: the model of what the runtime holds ([`model`]), and (to come) the
//! planner, status computation, CRI configs, volumes, probes and the per-pod workers.

pub mod model;
pub mod atomic_writer;
pub mod volumes;
