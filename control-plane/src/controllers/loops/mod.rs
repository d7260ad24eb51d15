//! Executors: each wires informers to a work queue and applies what its planner decides.

pub mod gc;
pub mod namespace;
pub mod nodeipam;
pub mod serviceaccount;
