//! ferro-cni: the CNI plugin of type `ferro` (bridge + veth + host-local compatible IPAM).
//!
//! Everything here is pure or touches only files under paths the caller passes in; the
//! netlink side is added separately.

pub mod commands;
pub mod config;
pub mod error;
pub mod ipam;
pub mod result;

pub use error::CniError;
