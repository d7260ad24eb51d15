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
    #[error("observing the kernel's rules")]
    Observe(#[source] ExecError),
    #[error("{0}")]
    Unsupported(String),
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
