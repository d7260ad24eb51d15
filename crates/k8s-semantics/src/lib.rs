//! Kubernetes semantics that more than one ferro component needs, implemented once and exactly
//! as upstream: Go's duration syntax (`metav1.Duration`, flags), resource quantities, Go-style
//! quoting, and (as the crate grows) pod requests, tolerations and node selector terms.
//! Components never parse these themselves.

pub mod duration;
pub mod quantity;
pub mod quote;

pub use duration::{format_go_duration, parse_duration, parse_go_duration, DurationError};
pub use quantity::{Milli, Quantity, QuantityError};
pub use quote::go_quote;
