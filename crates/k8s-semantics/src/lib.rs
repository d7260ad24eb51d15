//! Kubernetes semantics that more than one ferro component needs, implemented once and exactly
//! as upstream: Go's duration syntax (`metav1.Duration`, flags), resource quantities, Go-style
//! quoting, a pod's effective resource requests (init containers, sidecars, overhead) and the
//! scheduling rules of the core types (taints and tolerations, node selector terms, required
//! and preferred node affinity, topology selector terms), the cron schedules of CronJobs and
//! the node join discovery's signatures and CA pins (the `cluster-info` ConfigMap).
//! Components never parse these themselves.

pub mod bootstrap;
pub mod cron;
pub mod duration;
pub mod quantity;
pub mod quote;
pub mod resources;
pub mod scheduling;

pub use duration::{format_go_duration, parse_duration, parse_go_duration, DurationError};
pub use quantity::{Milli, Quantity, QuantityError};
pub use quote::go_quote;
pub use resources::{pod_non_zero_requests, pod_requests, Resources};
