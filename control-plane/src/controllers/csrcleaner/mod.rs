//! The CSR cleaner (upstream's `csrcleaner`): CertificateSigningRequests do not pile up. A
//! request still pending after 24 hours, one approved, denied or failed more than an hour
//! ago (by its condition's lastUpdateTime) and one whose issued certificate has expired are
//! deleted; the others come back at their deadline.

use std::sync::Arc;
use std::time::Duration;

use ferro_runtime::{spawn_workers, Informer, Next};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::api::{DeleteParams, Preconditions};
use kube::{Api, ResourceExt as _};

use crate::certificates::{APPROVED, DENIED, FAILED};
use crate::controllers::manager::{Informers, Options};
use crate::controllers::{is_conflict, is_not_found, Error};

pub const NAME: &str = "csrcleaner";
pub const PENDING: i64 = 24 * 3600;
pub const DECIDED: i64 = 3600;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    Keep,
    Delete,
    After(Duration),
}

/// The notAfter of an issued certificate (seconds since the epoch).
fn certificate_not_after(csr: &CertificateSigningRequest) -> Option<i64> {
    use rustls::pki_types::pem::PemObject as _;
    let pem = &csr.status.as_ref()?.certificate.as_ref()?.0;
    let der = rustls::pki_types::CertificateDer::pem_slice_iter(pem).next()?.ok()?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der).ok()?;
    Some(cert.validity().not_after.timestamp())
}

/// `now` in seconds since the epoch.
pub fn plan(csr: &CertificateSigningRequest, now: i64) -> Plan {
    let mut deadlines = Vec::new();
    let conditions = csr.status.as_ref().and_then(|s| s.conditions.as_ref()).cloned().unwrap_or_default();
    let decided: Vec<i64> = conditions
        .iter()
        .filter(|c| [APPROVED, DENIED, FAILED].contains(&c.type_.as_str()))
        .filter_map(|c| c.last_update_time.as_ref().or(c.last_transition_time.as_ref()).map(|t| t.0.as_second()))
        .collect();
    match decided.iter().max() {
        Some(t) => deadlines.push(t + DECIDED),
        None if conditions.iter().any(|c| [APPROVED, DENIED, FAILED].contains(&c.type_.as_str())) => {}
        None => {
            if let Some(created) = csr.metadata.creation_timestamp.as_ref() {
                deadlines.push(created.0.as_second() + PENDING);
            }
        }
    }
    if let Some(t) = certificate_not_after(csr) {
        deadlines.push(t);
    }
    match deadlines.into_iter().min() {
        None => Plan::Keep,
        Some(d) if d <= now => Plan::Delete,
        Some(d) => Plan::After(Duration::from_secs(u64::try_from(d - now).unwrap_or(1).max(1))),
    }
}

struct Context {
    client: kube::Client,
    csrs: Arc<Informer<CertificateSigningRequest>>,
}

pub fn start(inf: &Arc<Informers>, opts: &Options) {
    let (queue, csrs) = super::csrapproving::csr_queue(inf, opts);
    let ctx = Arc::new(Context { client: inf.client(), csrs });
    spawn_workers(NAME, queue, 1, move |name: String| reconcile(ctx.clone(), name));
}

#[tracing::instrument(name = "reconcile", skip_all, fields(controller = NAME, key = %name))]
async fn reconcile(ctx: Arc<Context>, name: String) -> Result<Next, Error> {
    ctx.csrs.wait_synced().await;
    let Some(csr) = ctx.csrs.get(None, &name) else { return Ok(Next::Done) };
    match plan(&csr, jiff::Timestamp::now().as_second()) {
        Plan::Keep => Ok(Next::Done),
        Plan::After(d) => Ok(Next::After(d)),
        Plan::Delete => {
            let api: Api<CertificateSigningRequest> = Api::all(ctx.client.clone());
            let dp = DeleteParams { preconditions: Some(Preconditions { uid: csr.uid(), resource_version: None }), ..Default::default() };
            match api.delete(&name, &dp).await {
                Ok(_) => {
                    tracing::info!("old certificate signing request deleted");
                    Ok(Next::Done)
                }
                Err(e) if is_conflict(&e) || is_not_found(&e) => Ok(Next::Done),
                Err(e) => Err(e.into()),
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::api::certificates::v1::{CertificateSigningRequestCondition, CertificateSigningRequestStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn at(secs: i64) -> Time {
        Time(jiff::Timestamp::from_second(secs).unwrap())
    }

    fn csr(created: i64, condition: Option<(&str, i64)>) -> CertificateSigningRequest {
        let mut c = CertificateSigningRequest::default();
        c.metadata.creation_timestamp = Some(at(created));
        if let Some((kind, t)) = condition {
            c.status = Some(CertificateSigningRequestStatus {
                conditions: Some(vec![CertificateSigningRequestCondition { type_: kind.into(), status: "True".into(), last_update_time: Some(at(t)), ..Default::default() }]),
                ..Default::default()
            });
        }
        c
    }

    #[test]
    fn pending_requests_live_a_day_decided_ones_an_hour() {
        let now = 1_000_000;
        assert_eq!(plan(&csr(now - 100, None), now), Plan::After(Duration::from_secs((PENDING - 100) as u64)));
        assert_eq!(plan(&csr(now - PENDING, None), now), Plan::Delete);
        for kind in [APPROVED, DENIED, FAILED] {
            assert_eq!(plan(&csr(now - 10, Some((kind, now - 10))), now), Plan::After(Duration::from_secs(3590)), "{kind}");
            assert_eq!(plan(&csr(now - 5000, Some((kind, now - DECIDED))), now), Plan::Delete, "{kind}");
        }
        assert_eq!(plan(&CertificateSigningRequest::default(), now), Plan::Keep, "no creation time: nothing to go by");
    }
}
