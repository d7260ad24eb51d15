//! What the signer does with a CertificateSigningRequest (upstream's `csrsigning` controller
//! for the kubernetes.io signers it serves): nothing until it is approved, then either the
//! certificate or a Failed condition saying why the signer refuses it.

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;

use crate::certificates::request::{self, Request, KUBELET_SERVING};
use crate::certificates::{APPROVED, FAILED};

/// Upstream backdates certificates by five minutes against clock skew.
pub const BACKDATE_SECS: i64 = 300;

#[derive(Debug, Clone, PartialEq)]
pub enum Plan {
    Nothing,
    /// Sign this request, valid from..until (seconds since the epoch).
    Sign { request: Request, usages: Vec<String>, not_before: i64, not_after: i64, with_sans: bool },
    /// Add a Failed condition (reason SignerValidationFailure) with this message.
    Fail(String),
}

fn has(csr: &CertificateSigningRequest, kind: &str) -> bool {
    csr.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|cs| cs.iter().any(|c| c.type_ == kind && c.status == "True"))
}

/// `now` and `ca_not_after` in seconds since the epoch; `duration` the cluster's signing
/// duration (`--cluster-signing-duration`), shortened by the request's expirationSeconds.
pub fn plan(csr: &CertificateSigningRequest, now: i64, duration_secs: i64, ca_not_after: Option<i64>) -> Plan {
    let issued = csr.status.as_ref().and_then(|s| s.certificate.as_ref()).is_some_and(|c| !c.0.is_empty());
    if issued || !has(csr, APPROVED) || has(csr, FAILED) {
        return Plan::Nothing;
    }
    let req = match request::parse(&csr.spec.request.0) {
        Ok(r) => r,
        Err(why) => return Plan::Fail(format!("unable to parse csr: {why}")),
    };
    let usages = csr.spec.usages.clone().unwrap_or_default();
    match request::signer_accepts(&csr.spec.signer_name, &req, &usages) {
        None => Plan::Nothing,
        Some(Err(why)) => Plan::Fail(why),
        Some(Ok(())) => {
            let wanted = csr.spec.expiration_seconds.map(i64::from).filter(|s| *s > 0).map_or(duration_secs, |s| s.min(duration_secs));
            let mut not_after = now + wanted;
            if let Some(ca) = ca_not_after {
                not_after = not_after.min(ca);
            }
            let with_sans = csr.spec.signer_name == KUBELET_SERVING;
            Plan::Sign { request: req, usages, not_before: now - BACKDATE_SECS, not_after, with_sans }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::api::certificates::v1::{CertificateSigningRequestCondition, CertificateSigningRequestSpec, CertificateSigningRequestStatus};
    use k8s_openapi::ByteString;

    fn csr(orgs: &[&str], approved: bool, expiration: Option<i32>) -> CertificateSigningRequest {
        let pem = crate::certificates::request::tests::make_request("system:node:n1", orgs, &[]);
        CertificateSigningRequest {
            spec: CertificateSigningRequestSpec {
                request: ByteString(pem.into_bytes()),
                signer_name: request::KUBELET_CLIENT.into(),
                usages: Some(vec!["digital signature".into(), "client auth".into()]),
                expiration_seconds: expiration,
                ..Default::default()
            },
            status: approved.then(|| CertificateSigningRequestStatus {
                conditions: Some(vec![CertificateSigningRequestCondition { type_: APPROVED.into(), status: "True".into(), ..Default::default() }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn only_approved_requests_are_signed_for_the_shorter_of_the_durations() {
        assert_eq!(plan(&csr(&["system:nodes"], false, None), 1000, 3600, None), Plan::Nothing);
        match plan(&csr(&["system:nodes"], true, None), 1000, 3600, None) {
            Plan::Sign { not_before, not_after, with_sans, .. } => {
                assert_eq!((not_before, not_after, with_sans), (700, 4600, false));
            }
            other => panic!("{other:?}"),
        }
        match plan(&csr(&["system:nodes"], true, Some(900)), 1000, 3600, Some(1500)) {
            Plan::Sign { not_after, .. } => assert_eq!(not_after, 1500, "never past the CA"),
            other => panic!("{other:?}"),
        }
        match plan(&csr(&["system:nodes"], true, Some(900)), 1000, 3600, None) {
            Plan::Sign { not_after, .. } => assert_eq!(not_after, 1900),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_approved_request_the_signer_refuses_fails_with_the_reason() {
        assert_eq!(plan(&csr(&["system:masters"], true, None), 1000, 3600, None), Plan::Fail("subject organization is not system:nodes".into()));
        let mut other = csr(&["system:nodes"], true, None);
        other.spec.signer_name = "example.com/other".into();
        assert_eq!(plan(&other, 1000, 3600, None), Plan::Nothing, "another signer's request");
    }
}
