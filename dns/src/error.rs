//! Errors of ferro-dns's parts.

use std::net::SocketAddr;

/// Forwarding a query to the upstream resolver failed.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error("no upstream resolver configured")]
    NoServers,
    #[error("upstream {server} did not answer in time")]
    Timeout { server: SocketAddr },
    #[error("upstream {server}: {source}")]
    Io {
        server: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("upstream {server} answered another query")]
    Mismatch { server: SocketAddr },
    #[error("query too long for TCP")]
    TooLong,
}

/// Setting up the listen addresses' interface failed.
#[derive(Debug, thiserror::Error)]
pub enum InterfaceError {
    #[error("{context}: {source}")]
    Netlink {
        context: String,
        #[source]
        source: rtnetlink::Error,
    },
    #[error("opening the netlink socket: {0}")]
    Open(#[source] std::io::Error),
    #[error("interface {0} vanished after its creation")]
    Vanished(String),
}

/// Flags and configuration that cannot work.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("--cluster-domain: {0}")]
    Domain(#[from] crate::model::ModelError),
    #[error("--upstream: {0}")]
    Upstream(String),
    #[error("reading {path}: {source}")]
    ResolvConf {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("--forward-timeout: {0}")]
    Timeout(String),
    #[error("{0}")]
    Invalid(String),
}
