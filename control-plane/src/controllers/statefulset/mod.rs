//! StatefulSet executor: plans with [`plan`] and applies the plan.

pub mod plan;
