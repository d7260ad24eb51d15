//! ferro-cni: the CNI plugin of type `ferro` (bridge + veth + host-local compatible IPAM).
//!
//! Everything here is pure or touches only files under paths the caller passes in, except
//! [`dataplane::Netlink`], the real executor `main` injects.

pub mod commands;
pub mod config;
pub mod dataplane;
pub mod error;
pub mod ipam;
pub mod plan;
pub mod result;

pub use error::CniError;
