//! The CSR signer (upstream's `csrsigning` controller): approved requests for the
//! kubernetes.io/kube-apiserver-client-kubelet, kube-apiserver-client and kubelet-serving
//! signers get a certificate from the cluster CA (valid for `--cluster-signing-duration`,
//! or the request's shorter expirationSeconds, never past the CA), written to
//! status.certificate; an approved request the signer refuses gets a Failed condition with
//! the reason. `plan.rs` decides; this loop signs and writes.

pub mod plan;

use std::sync::Arc;
use std::time::Duration;

use ferro_runtime::{spawn_workers, Informer, Next};
use k8s_openapi::api::certificates::v1::{CertificateSigningRequest, CertificateSigningRequestCondition, CertificateSigningRequestStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::ByteString;
use kube::api::PostParams;
use kube::Api;

use crate::controllers::manager::{Informers, Options};
use crate::controllers::{is_conflict, is_not_found, Error};
use crate::pki::{Ca, Issue};

pub const NAME: &str = "csrsigning";
/// Upstream's --cluster-signing-duration default: one year.
pub const DEFAULT_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

struct Context {
    client: kube::Client,
    csrs: Arc<Informer<CertificateSigningRequest>>,
    ca: Arc<Ca>,
    duration: Duration,
}

pub fn start(inf: &Arc<Informers>, opts: &Options) {
    let Some(ca) = opts.signing_ca.clone() else {
        tracing::warn!("csrsigning: no signing CA (--cluster-signing-cert-file/--cluster-signing-key-file); certificate requests are not signed");
        return;
    };
    let (queue, csrs) = super::csrapproving::csr_queue(inf, opts);
    let ctx = Arc::new(Context { client: inf.client(), csrs, ca, duration: opts.cluster_signing_duration });
    spawn_workers(NAME, queue, 1, move |name: String| reconcile(ctx.clone(), name));
}

/// One pass over a request: signed, failed, or left as it is.
#[tracing::instrument(name = "reconcile", skip_all, fields(controller = NAME, key = %name))]
async fn reconcile(ctx: Arc<Context>, name: String) -> Result<Next, Error> {
    ctx.csrs.wait_synced().await;
    let Some(csr) = ctx.csrs.get(None, &name) else { return Ok(Next::Done) };
    let now = k8s_openapi::jiff::Timestamp::now();
    let duration = i64::try_from(ctx.duration.as_secs()).unwrap_or(i64::MAX / 4);
    let mut out = (*csr).clone();
    let status = out.status.get_or_insert_with(CertificateSigningRequestStatus::default);
    match plan::plan(&csr, now.as_second(), duration, ctx.ca.not_after()) {
        plan::Plan::Nothing => return Ok(Next::Done),
        plan::Plan::Fail(why) => {
            tracing::info!(%why, "refused by the signer");
            status.conditions.get_or_insert_with(Vec::new).push(CertificateSigningRequestCondition {
                type_: crate::certificates::FAILED.into(),
                status: "True".into(),
                reason: Some("SignerValidationFailure".into()),
                message: Some(why),
                last_update_time: Some(Time(now)),
                last_transition_time: Some(Time(now)),
            });
        }
        plan::Plan::Sign { request, usages, not_before, not_after, with_sans } => {
            let pem = ctx
                .ca
                .issue(&Issue { request: &request, usages: &usages, not_before, not_after, with_sans })
                .map_err(|e| Error::Other(format!("signing: {e}")))?;
            status.certificate = Some(ByteString(pem.into_bytes()));
        }
    }
    out.metadata.managed_fields = None;
    let api: Api<CertificateSigningRequest> = Api::all(ctx.client.clone());
    match api.replace_status(&name, &PostParams::default(), &out).await {
        Ok(_) => Ok(Next::Done),
        Err(e) if is_conflict(&e) || is_not_found(&e) => Ok(Next::Done),
        Err(e) => Err(e.into()),
    }
}
