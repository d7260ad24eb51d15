//! Resource quantities for the scheduler's resource fit and the volume binder's capacity
//! comparison: the shared exact implementation (`k8s_semantics::quantity`), read from the API
//! type.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

pub use k8s_semantics::quantity::{parse_milli as parse, Milli, QuantityError};

/// Parses an API quantity; an unparsable one counts as zero (the API server validated it).
pub fn of(q: &Quantity) -> Milli {
    parse(&q.0).unwrap_or_default()
}
