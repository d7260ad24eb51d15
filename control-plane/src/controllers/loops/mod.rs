//! Executors: each wires informers to a work queue and applies what its planner decides.

pub mod deployment;
pub mod endpointslice;
pub mod gc;
pub mod namespace;
pub mod nodeipam;
pub mod nodelifecycle;
pub mod pvbinder;
pub mod replicaset;
pub mod scheduler;
pub mod serviceaccount;
