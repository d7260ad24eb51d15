//! ferro-proxy's error types.

use std::path::PathBuf;

/// A flag or config file field that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{field}: {reason}")]
    Invalid { field: String, reason: String },
    #[error("config file: {reason}")]
    File { reason: String },
    #[error("reading config file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A kernel tool refused what it was given, or could not be run.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("running {program}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{program} failed ({status}): {stderr}")]
    Failed { program: String, status: String, stderr: String },
}

/// One sync that did not reach the kernel.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("{family:?} rules not applied")]
    Apply {
        family: crate::model::Family,
        #[source]
        source: ExecError,
    },
    #[error("{family:?} rules of service port {service} refused by the kernel")]
    Refused {
        family: crate::model::Family,
        service: Box<crate::model::ServicePortName>,
        #[source]
        source: ExecError,
    },
    #[error("observing the kernel's rules")]
    Observe(#[source] ExecError),
    #[error("{0}")]
    Unsupported(String),
    #[error("{family:?} IPVS state not applied")]
    Ipvs {
        family: crate::model::Family,
        #[source]
        source: IpvsError,
    },
}

/// The kernel refused an IPVS, ipset or address change, or could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum IpvsError {
    #[error("opening the {what} netlink socket")]
    Socket {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{op}")]
    Kernel {
        op: String,
        #[source]
        source: std::io::Error,
    },
    #[error("this kernel has no IPVS (no generic netlink family \"IPVS\"; ip_vs is not built in or loaded): use --proxy-mode iptables or nftables")]
    NoIpvs,
    #[error(transparent)]
    Exec(#[from] ExecError),
}

/// A conntrack clean-up that did not complete (logged and counted; the sync stands).
#[derive(Debug, thiserror::Error)]
pub enum ConntrackError {
    #[error("opening the ctnetlink socket")]
    Socket(#[source] std::io::Error),
    #[error("listing conntrack entries")]
    Dump(#[source] std::io::Error),
    #[error("deleting a conntrack entry")]
    Delete(#[source] std::io::Error),
    #[error("making a conntrack entry")]
    Insert(#[source] std::io::Error),
}
