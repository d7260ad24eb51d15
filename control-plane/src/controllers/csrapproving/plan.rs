//! What the approver asks before approving a CertificateSigningRequest (upstream's
//! `csrapproving` controller, its sarapprove recognizers).

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;

use crate::certificates::request::{self, KUBELET_CLIENT};
use crate::certificates::{APPROVED, DENIED, FAILED};

/// One way a request may be approved: the requester must be allowed to `create`
/// `certificatesigningrequests/<subresource>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub subresource: &'static str,
    pub message: &'static str,
}

pub const NODE_CLIENT: Candidate =
    Candidate { subresource: "nodeclient", message: "Auto approving kubelet client certificate after SubjectAccessReview." };
pub const SELF_NODE_CLIENT: Candidate =
    Candidate { subresource: "selfnodeclient", message: "Auto approving self kubelet client certificate after SubjectAccessReview." };

/// Whether the request already has its answer (approved, denied, failed or issued).
pub fn decided(csr: &CertificateSigningRequest) -> bool {
    let status = csr.status.as_ref();
    status.and_then(|s| s.certificate.as_ref()).is_some_and(|c| !c.0.is_empty())
        || status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| [APPROVED, DENIED, FAILED].contains(&c.type_.as_str())))
}

/// The checks to make, in upstream's order; empty when the approver leaves the request to
/// someone else (another signer, not a node client certificate, already decided).
pub fn candidates(csr: &CertificateSigningRequest) -> Vec<Candidate> {
    if decided(csr) || csr.spec.signer_name != KUBELET_CLIENT {
        return Vec::new();
    }
    let Ok(req) = request::parse(&csr.spec.request.0) else { return Vec::new() };
    let usages = csr.spec.usages.clone().unwrap_or_default();
    if request::kubelet_client(&req, &usages).is_err() {
        return Vec::new();
    }
    let mut out = vec![NODE_CLIENT];
    if csr.spec.username.as_deref() == Some(req.common_name.as_str()) {
        out.push(SELF_NODE_CLIENT);
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::api::certificates::v1::{CertificateSigningRequestCondition, CertificateSigningRequestSpec, CertificateSigningRequestStatus};
    use k8s_openapi::ByteString;

    fn csr(cn: &str, orgs: &[&str], username: &str, signer: &str) -> CertificateSigningRequest {
        let pem = crate::certificates::request::tests::make_request(cn, orgs, &[]);
        CertificateSigningRequest {
            spec: CertificateSigningRequestSpec {
                request: ByteString(pem.into_bytes()),
                signer_name: signer.into(),
                usages: Some(vec!["digital signature".into(), "client auth".into()]),
                username: Some(username.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn a_bootstrapper_asks_nodeclient_a_node_renewing_asks_selfnodeclient_too() {
        let join = csr("system:node:n1", &["system:nodes"], "system:bootstrap:abcdef", KUBELET_CLIENT);
        assert_eq!(candidates(&join), [NODE_CLIENT]);
        let renew = csr("system:node:n1", &["system:nodes"], "system:node:n1", KUBELET_CLIENT);
        assert_eq!(candidates(&renew), [NODE_CLIENT, SELF_NODE_CLIENT]);
        // a node asking for another node's certificate: only nodeclient, which nodes lack
        let other = csr("system:node:n2", &["system:nodes"], "system:node:n1", KUBELET_CLIENT);
        assert_eq!(candidates(&other), [NODE_CLIENT]);
    }

    #[test]
    fn other_requests_are_left_alone() {
        assert!(candidates(&csr("system:node:n1", &["system:nodes"], "u", request::APISERVER_CLIENT)).is_empty());
        assert!(candidates(&csr("system:node:n1", &["system:masters"], "u", KUBELET_CLIENT)).is_empty());
        assert!(candidates(&csr("bob", &["system:nodes"], "bob", KUBELET_CLIENT)).is_empty());
        let mut denied = csr("system:node:n1", &["system:nodes"], "u", KUBELET_CLIENT);
        denied.status = Some(CertificateSigningRequestStatus {
            conditions: Some(vec![CertificateSigningRequestCondition { type_: DENIED.into(), status: "True".into(), ..Default::default() }]),
            ..Default::default()
        });
        assert!(candidates(&denied).is_empty());
    }
}
