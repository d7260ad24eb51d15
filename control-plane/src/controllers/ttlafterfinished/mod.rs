//! TTL-after-finished executor.

pub mod plan;
