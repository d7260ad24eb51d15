//! Pods on this node: the model of what the runtime holds ([`model`]), their volumes on the
//! host ([`volumes`], files written with [`atomic_writer`]), and (to come) the planner, status
//! computation, CRI configs, probes and the per-pod workers.

pub mod atomic_writer;
pub mod model;
pub mod volumes;
