//! Job executor.

pub mod plan;
