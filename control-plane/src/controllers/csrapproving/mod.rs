//! The CSR approver (upstream's `csrapproving` controller): a pending request for a node client
//! certificate (signer kubernetes.io/kube-apiserver-client-kubelet, subject
//! `system:node:<name>` in `system:nodes`, client usages only) is approved when a
//! SubjectAccessReview says its requester may `create certificatesigningrequests/nodeclient`
//! (a bootstrap token joining a node) or, for a node renewing its own, `.../selfnodeclient`.
//! Anything else is left for a human (`kubectl certificate approve|deny`). `plan.rs` decides
//! what to ask; this loop asks the API and writes the approval.

pub mod plan;

use std::sync::Arc;

use ferro_runtime::{spawn_resync, spawn_workers, Change, Informer, Next, WorkQueue};
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use k8s_openapi::api::certificates::v1::{CertificateSigningRequest, CertificateSigningRequestCondition, CertificateSigningRequestStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::PostParams;
use kube::{Api, ResourceExt as _};

use crate::controllers::manager::{Informers, Options};
use crate::controllers::{is_conflict, is_not_found, Error};

pub const NAME: &str = "csrapproving";

struct Context {
    client: kube::Client,
    csrs: Arc<Informer<CertificateSigningRequest>>,
}

/// A request created or changed (deleted ones need nothing).
pub fn keys_for_csr(change: &Change<CertificateSigningRequest>) -> Vec<String> {
    match change {
        Change::Applied { new, .. } => vec![new.name_any()],
        Change::Deleted(_) => Vec::new(),
    }
}

/// The shared CSR informer and a queue of request names fed from it (changes, resyncs, and
/// every request once synced): what each of the CSR loops (approving, signing, cleaning)
/// starts from.
pub fn csr_queue(inf: &Arc<Informers>, opts: &Options) -> (WorkQueue<String>, Arc<Informer<CertificateSigningRequest>>) {
    let queue: WorkQueue<String> = WorkQueue::new();
    let csrs = inf.csrs();
    {
        let q = queue.clone();
        csrs.on_change(move |c| keys_for_csr(c).into_iter().for_each(|k| q.add(k)));
    }
    {
        let c = csrs.clone();
        spawn_resync(queue.clone(), opts.resync, move || c.list().iter().map(|x| x.name_any()).collect());
    }
    {
        // the shared informer may have listed before this loop's handler was added
        let (c, q) = (csrs.clone(), queue.clone());
        tokio::spawn(async move {
            c.wait_synced().await;
            c.list().iter().for_each(|x| q.add(x.name_any()));
        });
    }
    (queue, csrs)
}

pub fn start(inf: &Arc<Informers>, opts: &Options) {
    let (queue, csrs) = csr_queue(inf, opts);
    let ctx = Arc::new(Context { client: inf.client(), csrs });
    spawn_workers(NAME, queue, 1, move |name: String| reconcile(ctx.clone(), name));
}

/// Asks the API whether the request's requester may create the subresource.
async fn allowed(client: &kube::Client, csr: &CertificateSigningRequest, subresource: &str) -> Result<bool, kube::Error> {
    let spec = &csr.spec;
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: spec.username.clone(),
            groups: spec.groups.clone(),
            uid: spec.uid.clone(),
            extra: spec.extra.clone(),
            resource_attributes: Some(ResourceAttributes {
                group: Some(crate::certificates::GROUP.into()),
                resource: Some("certificatesigningrequests".into()),
                subresource: Some(subresource.into()),
                verb: Some("create".into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = Api::<SubjectAccessReview>::all(client.clone()).create(&PostParams::default(), &review).await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// One pass over a request: approved if one of its candidates' reviews allows it.
#[tracing::instrument(name = "reconcile", skip_all, fields(controller = NAME, key = %name))]
async fn reconcile(ctx: Arc<Context>, name: String) -> Result<Next, Error> {
    ctx.csrs.wait_synced().await;
    let Some(csr) = ctx.csrs.get(None, &name) else { return Ok(Next::Done) };
    for candidate in plan::candidates(&csr) {
        if !allowed(&ctx.client, &csr, candidate.subresource).await? {
            tracing::debug!(subresource = candidate.subresource, "SubjectAccessReview refused");
            continue;
        }
        let mut approved = (*csr).clone();
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        approved.status.get_or_insert_with(CertificateSigningRequestStatus::default).conditions.get_or_insert_with(Vec::new).push(
            CertificateSigningRequestCondition {
                type_: crate::certificates::APPROVED.into(),
                status: "True".into(),
                reason: Some("AutoApproved".into()),
                message: Some(candidate.message.into()),
                last_update_time: Some(now.clone()),
                last_transition_time: Some(now),
            },
        );
        approved.metadata.managed_fields = None;
        let api: Api<CertificateSigningRequest> = Api::all(ctx.client.clone());
        return match api.replace_subresource("approval", &name, &PostParams::default(), &approved).await {
            Ok(_) => {
                tracing::info!(requester = csr.spec.username.as_deref().unwrap_or(""), subresource = candidate.subresource, "approved");
                Ok(Next::Done)
            }
            // the cache is behind: the change comes back as an event
            Err(e) if is_conflict(&e) || is_not_found(&e) => Ok(Next::Done),
            Err(e) => Err(e.into()),
        };
    }
    Ok(Next::Done)
}
