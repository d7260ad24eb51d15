//! Pods on this node: the model of what the runtime holds ([`model`]), the planner of one
//! sync ([`plan`]) with its crash-loop backoff ([`backoff`]), the pod status ([`status`]),
//! the CRI sandbox and container configs ([`spec`]), the ConfigMaps and Secrets pods refer to
//! ([`objects`]), volumes ([`volume`], with
//! [`volume::atomic_writer`] and their fsGroup ownership in [`volume::ownership`]), probes and lifecycle hooks
//! ([`probe`]), where pods come from ([`source`]), image garbage collection ([`imagegc`]) and
//! the executor that ties them together ([`exec`]).

pub mod backoff;
pub mod model;
pub mod objects;
pub mod plan;
pub mod spec;
pub mod status;
pub mod token;
pub mod hooks;
pub mod imagegc;
pub mod probe;
pub mod source;
pub mod exec;
pub mod volume;
