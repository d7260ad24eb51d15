//! ferro-cni: the CNI plugin of type `ferro` (bridge + veth + host-local compatible IPAM),
//! and [`netd`], the library of the node network daemon `ferro-netd`.
//!
//! Everything here is pure or touches only files under paths the caller passes in, except
//! [`dataplane::Netlink`], the real executor `main` injects (with [`masq::Iptables`] for
//! ipMasq).

pub mod commands;
pub mod config;
pub mod dataplane;
pub mod delegate;
pub mod error;
pub mod ipam;
pub mod masq;
pub mod netd;
pub mod netlink;
pub mod nlsock;
pub mod plan;
pub mod result;

pub use error::CniError;
