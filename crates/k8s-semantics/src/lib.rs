//! Kubernetes semantics that more than one ferro component needs, implemented once and exactly
//! as upstream: Go's duration syntax (`metav1.Duration`, flags), and (as the crate grows)
//! resource quantities, pod requests, tolerations, node selector terms and Go-style quoting.
//! Components never parse these themselves.

pub mod duration;

pub use duration::{format_go_duration, parse_duration, parse_go_duration, DurationError};
