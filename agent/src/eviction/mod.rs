//! Node-pressure eviction, as upstream's eviction manager: every round (10 s) the node's
//! signals and the pods' usage are observed, the pure [`plan`] decides the pressure conditions
//! and at most one pod to evict, and [`run::Manager`] applies it: the conditions to
//! the node status, the eviction to the pod workers (phase Failed, reason Evicted, the
//! DisruptionTarget condition, the pod stopped with the decided grace period).

pub mod plan;
pub mod run;
