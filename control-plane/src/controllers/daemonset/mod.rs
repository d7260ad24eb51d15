//! DaemonSet executor (work in progress).

pub mod plan;
