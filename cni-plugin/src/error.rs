//! The plugin's error type and its rendering as the CNI spec's error JSON.
//!
//! Codes 1-11 and 50/51 are the ones the CNI spec (1.1.0) reserves; codes 100 and above are
//! ferro's own, as the spec allows plugins to define.

use std::error::Error as _;

/// Every way a ferro-cni invocation can fail, each mapped to a CNI error code.
#[derive(Debug, thiserror::Error)]
pub enum CniError {
    /// Code 1.
    #[error("incompatible cni version {version:?}: supported versions are {supported}")]
    IncompatibleVersion { version: String, supported: String },
    /// Code 2.
    #[error("unsupported field in network configuration: {0}")]
    UnsupportedField(String),
    /// Code 3.
    #[error("container unknown or does not exist: {0}")]
    UnknownContainer(String),
    /// Code 4.
    #[error("invalid environment variable {name}: {reason}")]
    InvalidEnv { name: String, reason: String },
    /// Code 5.
    #[error("{context}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// Code 6.
    #[error("failed to decode {what}")]
    Decode {
        what: String,
        #[source]
        source: serde_json::Error,
    },
    /// Code 7.
    #[error("invalid network config: {0}")]
    InvalidConfig(String),
    /// Code 11.
    #[error("try again later: {0}")]
    TryAgainLater(String),
    /// Code 50 (STATUS): the plugin cannot serve ADDs right now.
    #[error("plugin not available: {0}")]
    NotAvailable(String),
    /// Code 100: every address of a range set is reserved.
    #[error("address range exhausted: {0}")]
    RangeExhausted(String),
    /// Code 101 (CHECK): the attachment differs from what ADD set up.
    #[error("check failed: {0}")]
    CheckFailed(String),
    /// Code 199: a command (or part of one) ferro-cni does not implement yet.
    #[error("{0} is not implemented yet")]
    NotImplemented(String),
    /// A delegated plugin's (the IPAM plugin's) own error, passed through with its code.
    #[error("{plugin}: {msg}: {details}")]
    Delegated {
        plugin: String,
        code: u32,
        msg: String,
        details: String,
    },
}

/// Code for [`CniError::RangeExhausted`].
pub const CODE_RANGE_EXHAUSTED: u32 = 100;
/// Code for [`CniError::CheckFailed`].
pub const CODE_CHECK_FAILED: u32 = 101;
/// Code for [`CniError::NotImplemented`].
pub const CODE_NOT_IMPLEMENTED: u32 = 199;

impl CniError {
    /// Shorthand for an I/O error with the operation and path that failed.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        CniError::Io {
            context: context.into(),
            source,
        }
    }

    /// The CNI error code.
    pub fn code(&self) -> u32 {
        match self {
            CniError::IncompatibleVersion { .. } => 1,
            CniError::UnsupportedField(_) => 2,
            CniError::UnknownContainer(_) => 3,
            CniError::InvalidEnv { .. } => 4,
            CniError::Io { .. } => 5,
            CniError::Decode { .. } => 6,
            CniError::InvalidConfig(_) => 7,
            CniError::TryAgainLater(_) => 11,
            CniError::NotAvailable(_) => 50,
            CniError::RangeExhausted(_) => CODE_RANGE_EXHAUSTED,
            CniError::CheckFailed(_) => CODE_CHECK_FAILED,
            CniError::NotImplemented(_) => CODE_NOT_IMPLEMENTED,
            CniError::Delegated { code, .. } => *code,
        }
    }

    /// Short, fixed message for the code (the spec's `msg`).
    fn summary(&self) -> &'static str {
        match self {
            CniError::IncompatibleVersion { .. } => "Incompatible CNI version",
            CniError::UnsupportedField(_) => "Unsupported field in network configuration",
            CniError::UnknownContainer(_) => "Container unknown or does not exist",
            CniError::InvalidEnv { .. } => "Invalid necessary environment variables",
            CniError::Io { .. } => "I/O failure",
            CniError::Decode { .. } => "Failed to decode content",
            CniError::InvalidConfig(_) => "Invalid network config",
            CniError::TryAgainLater(_) => "Try again later",
            CniError::NotAvailable(_) => "Plugin not available",
            CniError::RangeExhausted(_) => "Address range exhausted",
            CniError::CheckFailed(_) => "Check failed",
            CniError::NotImplemented(_) => "Not implemented",
            CniError::Delegated { .. } => "Delegated plugin failed",
        }
    }

    /// The error and its chain of causes, joined with ": ".
    pub fn details(&self) -> String {
        let mut out = self.to_string();
        let mut cause = self.source();
        while let Some(c) = cause {
            out.push_str(": ");
            out.push_str(&c.to_string());
            cause = c.source();
        }
        out
    }

    /// The spec's error result:
    /// `{"cniVersion": .., "code": .., "msg": .., "details": ..}`.
    pub fn to_json(&self, cni_version: &str) -> serde_json::Value {
        if let CniError::Delegated {
            code, msg, details, ..
        } = self
        {
            // Passed through unchanged, as the spec's delegation rules ask.
            return serde_json::json!({
                "cniVersion": cni_version,
                "code": code,
                "msg": msg,
                "details": details,
            });
        }
        serde_json::json!({
            "cniVersion": cni_version,
            "code": self.code(),
            "msg": self.summary(),
            "details": self.details(),
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn codes_match_spec() {
        let io = || std::io::Error::other("boom");
        let decode = || serde_json::from_str::<u8>("x").unwrap_err();
        let cases: Vec<(CniError, u32)> = vec![
            (
                CniError::IncompatibleVersion {
                    version: "0.3.1".into(),
                    supported: "1.1.0".into(),
                },
                1,
            ),
            (CniError::UnsupportedField("x".into()), 2),
            (CniError::UnknownContainer("x".into()), 3),
            (
                CniError::InvalidEnv {
                    name: "CNI_IFNAME".into(),
                    reason: "missing".into(),
                },
                4,
            ),
            (CniError::io("read", io()), 5),
            (
                CniError::Decode {
                    what: "x".into(),
                    source: decode(),
                },
                6,
            ),
            (CniError::InvalidConfig("x".into()), 7),
            (CniError::TryAgainLater("x".into()), 11),
            (CniError::NotAvailable("x".into()), 50),
            (CniError::RangeExhausted("x".into()), 100),
            (CniError::CheckFailed("x".into()), 101),
            (CniError::NotImplemented("ADD".into()), 199),
        ];
        for (err, code) in cases {
            assert_eq!(err.code(), code, "{err}");
        }
    }

    #[test]
    fn error_json_shape() {
        let err = CniError::io(
            "read /var/lib/cni/networks/x/lock",
            std::io::Error::other("disk on fire"),
        );
        let v = err.to_json("1.0.0");
        let obj = v.as_object().unwrap();
        assert_eq!(obj.len(), 4);
        assert_eq!(v["cniVersion"], "1.0.0");
        assert_eq!(v["code"], 5);
        assert_eq!(v["msg"], "I/O failure");
        assert_eq!(
            v["details"],
            "read /var/lib/cni/networks/x/lock: disk on fire"
        );
    }
}
