//! ferro-control-plane: a compact Kubernetes API server with an embedded, crash-safe store.

pub mod selector;
pub mod smp;
pub mod table;
pub mod validation;
