//! ferro-netd's error types, one per layer.

use std::io;
use std::path::PathBuf;

/// A bad flag.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("invalid {flag}: {reason}")]
    Invalid { flag: &'static str, reason: String },
}

/// Why one Node object cannot be used by the planner (it is skipped, others still work).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeError {
    #[error("node {node}: bad pod CIDR {value:?}")]
    PodCidr { node: String, value: String },
    #[error("node {node}: bad annotation {key}={value:?}: {reason}")]
    Annotation {
        node: String,
        key: &'static str,
        value: String,
        reason: &'static str,
    },
}

/// Failures of the kernel executor.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("{context}: {source}")]
    Netlink {
        context: String,
        #[source]
        source: io::Error,
    },
    #[error("{0}")]
    Underlay(String),
    #[error("masquerade rules: {0}")]
    Masq(#[source] crate::CniError),
}

/// Failures of one reconcile.
#[derive(Debug, thiserror::Error)]
pub enum NetdError {
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error("write {path}: {source}")]
    File {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("patch annotations of node {node}: {source}")]
    Patch {
        node: String,
        #[source]
        source: kube::Error,
    },
}
