//! The legacy service account token loop (upstream's `serviceaccount-token` controller): a
//! Secret of type `kubernetes.io/service-account-token` annotated with
//! `kubernetes.io/service-account.name` gets a non-expiring token of that service account
//! (`token`), the cluster CA (`ca.crt`) and its namespace (`namespace`), and the account's uid
//! annotation; a token Secret whose service account is gone (or was re-created with another
//! uid) is deleted. Only Secrets users ask for: nothing is created unasked (upstream since
//! 1.24). Such tokens authenticate while their Secret and account live (crate::subresources).

use std::collections::BTreeMap;
use std::sync::Arc;

use ferro_runtime::{spawn_resync, spawn_workers, Change, Informer, Next, ObjectKey, WorkQueue};
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::ByteString;
use kube::api::{DeleteParams, Preconditions, PostParams};
use kube::runtime::watcher;
use kube::{Api, ResourceExt as _};

use crate::controllers::explain::{ExplainError, Explanation, Subject};
use crate::controllers::manager::{Informers, Options};
use crate::controllers::{is_conflict, is_not_found, Error};
use crate::sa_token::SigningKey;

pub const TYPE: &str = "kubernetes.io/service-account-token";
pub const NAME_ANNOTATION: &str = "kubernetes.io/service-account.name";
pub const UID_ANNOTATION: &str = "kubernetes.io/service-account.uid";

/// What to do with a token Secret.
#[derive(Debug, Clone, PartialEq)]
pub enum Plan {
    Nothing,
    /// Its service account is gone or is another one now: delete it.
    Delete(String),
    /// Fill in token, ca.crt, namespace and the uid annotation.
    Populate { account_uid: String },
    /// The account does not exist yet: wait for it (upstream waits too).
    Wait(String),
}

/// The decision for one token Secret, given its service account as the cache has it.
pub fn plan(secret: &Secret, account: Option<&ServiceAccount>, ca: &str) -> Plan {
    if secret.type_.as_deref() != Some(TYPE) || secret.metadata.deletion_timestamp.is_some() {
        return Plan::Nothing;
    }
    let annotations = secret.annotations();
    let Some(name) = annotations.get(NAME_ANNOTATION).filter(|n| !n.is_empty()) else {
        return Plan::Nothing;
    };
    let wanted_uid = annotations.get(UID_ANNOTATION).filter(|u| !u.is_empty());
    let Some(sa) = account.filter(|a| a.metadata.deletion_timestamp.is_none()) else {
        return match wanted_uid {
            // populated once for an account that no longer exists
            Some(_) => Plan::Delete(format!("its service account {name} is gone")),
            None => Plan::Wait(format!("service account {name} does not exist")),
        };
    };
    let uid = sa.uid().unwrap_or_default();
    if let Some(w) = wanted_uid {
        if *w != uid {
            return Plan::Delete(format!("it was made for another service account {name} (uid {w})"));
        }
    }
    let data = secret.data.clone().unwrap_or_default();
    let has = |k: &str| data.get(k).is_some_and(|v| !v.0.is_empty());
    let ns_right = data.get("namespace").map(|v| v.0.as_slice()) == secret.metadata.namespace.as_deref().map(str::as_bytes);
    let ca_right = data.get("ca.crt").map(|v| v.0.as_slice()) == Some(ca.as_bytes());
    if has("token") && ns_right && ca_right && wanted_uid.is_some() {
        return Plan::Nothing;
    }
    Plan::Populate { account_uid: uid }
}

/// The Secret with its token data filled in (the token kept if it has one).
pub fn populated(secret: &Secret, token: &str, ca: &str, account_uid: &str) -> Secret {
    let mut s = secret.clone();
    let data = s.data.get_or_insert_with(BTreeMap::new);
    if data.get("token").is_none_or(|t| t.0.is_empty()) {
        data.insert("token".into(), ByteString(token.as_bytes().to_vec()));
    }
    data.insert("ca.crt".into(), ByteString(ca.as_bytes().to_vec()));
    data.insert("namespace".into(), ByteString(secret.metadata.namespace.clone().unwrap_or_default().into_bytes()));
    s.metadata.annotations.get_or_insert_with(BTreeMap::new).insert(UID_ANNOTATION.into(), account_uid.into());
    s
}

fn keys_for_secret(change: &Change<Secret>) -> Vec<ObjectKey> {
    match change {
        Change::Applied { new, .. } => vec![ObjectKey::of(new.as_ref())],
        Change::Deleted(_) => Vec::new(),
    }
}

struct Context {
    client: kube::Client,
    key: Arc<SigningKey>,
    ca: String,
    secrets: Arc<Informer<Secret>>,
    accounts: Arc<Informer<ServiceAccount>>,
}

pub fn start(inf: &Arc<Informers>, opts: &Options) {
    let (Some(key), Some(ca)) = (opts.sa_key.clone(), opts.root_ca.clone()) else {
        tracing::warn!("serviceaccount-token: no signing key or CA here (controllers run with --kubeconfig); legacy token Secrets are not filled");
        return;
    };
    let queue: WorkQueue<ObjectKey> = WorkQueue::new();
    let secrets: Arc<Informer<Secret>> = Informer::new();
    {
        let q = queue.clone();
        secrets.on_change(move |c| keys_for_secret(c).into_iter().for_each(|k| q.add(k)));
    }
    secrets.spawn(Api::all(inf.client()), watcher::Config::default().fields(&format!("type={TYPE}")));
    let accounts = inf.service_accounts();
    {
        // an account created, re-created or deleted: its token Secrets
        let (q, s) = (queue.clone(), secrets.clone());
        accounts.on_change(move |c| {
            let sa = c.object();
            let (ns, name) = (sa.namespace().unwrap_or_default(), sa.name_any());
            for secret in s.list_namespace(&ns) {
                if secret.annotations().get(NAME_ANNOTATION) == Some(&name) {
                    q.add(ObjectKey::of(secret.as_ref()));
                }
            }
        });
    }
    {
        let s = secrets.clone();
        spawn_resync(queue.clone(), opts.resync, move || s.list().iter().map(|x| ObjectKey::of(x.as_ref())).collect());
    }
    {
        // the shared account informer may have synced before the handler above was added
        let (a, s, q) = (accounts.clone(), secrets.clone(), queue.clone());
        tokio::spawn(async move {
            a.wait_synced().await;
            s.wait_synced().await;
            for x in s.list() {
                q.add(ObjectKey::of(x.as_ref()));
            }
        });
    }
    let ctx = Arc::new(Context { client: inf.client(), key, ca, secrets, accounts });
    {
        let ctx = ctx.clone();
        inf.explain().register("serviceaccount-token", Arc::new(move |key| Box::pin(explain(ctx.clone(), key))));
    }
    spawn_workers("serviceaccount-token", queue, 2, move |key: ObjectKey| reconcile(ctx.clone(), key));
}

fn account_of(ctx: &Context, secret: &Secret) -> Option<Arc<ServiceAccount>> {
    let name = secret.annotations().get(NAME_ANNOTATION)?;
    ctx.accounts.get(secret.namespace().as_deref(), name)
}

async fn explain(ctx: Arc<Context>, key: ObjectKey) -> Result<Explanation, ExplainError> {
    ctx.secrets.wait_synced().await;
    ctx.accounts.wait_synced().await;
    let s = ctx
        .secrets
        .get(key.namespace.as_deref(), &key.name)
        .ok_or_else(|| ExplainError::NotFound { resource: "secrets".into(), name: key.name.clone() })?;
    let mut e = Explanation::new("serviceaccount-token", Subject::of(s.as_ref()));
    let account = account_of(&ctx, &s);
    e.observed = serde_json::json!({"serviceAccount": account.as_ref().map(|a| a.name_any()), "hasToken": s.data.as_ref().is_some_and(|d| d.contains_key("token"))});
    match plan(&s, account.as_deref(), &ctx.ca) {
        Plan::Nothing => e.waiting.push("nothing to do".into()),
        Plan::Delete(why) => e.actions.push(format!("delete the Secret: {why}")),
        Plan::Populate { .. } => e.actions.push("fill in token, ca.crt and namespace".into()),
        Plan::Wait(why) => e.waiting.push(why),
    }
    Ok(e)
}

#[tracing::instrument(name = "reconcile", skip_all, fields(controller = "serviceaccount-token", key = %key))]
async fn reconcile(ctx: Arc<Context>, key: ObjectKey) -> Result<Next, Error> {
    if !ctx.secrets.is_synced() || !ctx.accounts.is_synced() {
        return Ok(Next::After(std::time::Duration::from_millis(200)));
    }
    let Some(secret) = ctx.secrets.get(key.namespace.as_deref(), &key.name) else { return Ok(Next::Done) };
    let account = account_of(&ctx, &secret);
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &secret.namespace().unwrap_or_default());
    match plan(&secret, account.as_deref(), &ctx.ca) {
        Plan::Nothing | Plan::Wait(_) => Ok(Next::Done),
        Plan::Delete(why) => {
            tracing::info!(secret = %key, %why, "deleting a service account token Secret");
            let dp = DeleteParams {
                preconditions: Some(Preconditions { uid: secret.uid(), resource_version: None }),
                ..DeleteParams::default()
            };
            match api.delete(&secret.name_any(), &dp).await {
                Ok(_) => Ok(Next::Done),
                Err(e) if is_not_found(&e) || is_conflict(&e) => Ok(Next::Done),
                Err(e) => Err(e.into()),
            }
        }
        Plan::Populate { account_uid } => {
            let ns = secret.namespace().unwrap_or_default();
            let sa_name = secret.annotations().get(NAME_ANNOTATION).cloned().unwrap_or_default();
            let token = ctx
                .key
                .sign_legacy(&ns, &secret.name_any(), &sa_name, &account_uid)
                .map_err(|e| Error::Other(e.to_string()))?;
            let new = populated(&secret, &token, &ctx.ca, &account_uid);
            match api.replace(&secret.name_any(), &PostParams::default(), &new).await {
                Ok(_) => Ok(Next::Done),
                Err(e) if is_not_found(&e) => Ok(Next::Done),
                Err(e) if is_conflict(&e) => Ok(Next::After(std::time::Duration::from_millis(100))),
                Err(e) => Err(e.into()),
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn secret(annotations: &[(&str, &str)], data: &[(&str, &str)]) -> Secret {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "t", "namespace": "ns", "annotations": annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>()},
            "type": TYPE,
            "data": data.iter().map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec()))).collect::<BTreeMap<_, _>>(),
        }))
        .unwrap()
    }

    fn account(uid: &str) -> ServiceAccount {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "app", "namespace": "ns", "uid": uid}})).unwrap()
    }

    #[test]
    fn token_secrets_are_filled_kept_or_deleted() {
        let fresh = secret(&[(NAME_ANNOTATION, "app")], &[]);
        assert_eq!(plan(&fresh, Some(&account("u1")), "CA"), Plan::Populate { account_uid: "u1".into() });
        assert!(matches!(plan(&fresh, None, "CA"), Plan::Wait(_)));
        let filled = populated(&fresh, "tok", "CA", "u1");
        assert_eq!(plan(&filled, Some(&account("u1")), "CA"), Plan::Nothing);
        assert_eq!(filled.data.as_ref().unwrap()["namespace"].0, b"ns");
        // the CA changed: filled again, the token kept
        assert_eq!(plan(&filled, Some(&account("u1")), "CA2"), Plan::Populate { account_uid: "u1".into() });
        assert_eq!(populated(&filled, "other", "CA2", "u1").data.unwrap()["token"].0, b"tok");
        // the account gone, or another one under the name
        assert!(matches!(plan(&filled, None, "CA"), Plan::Delete(_)));
        assert!(matches!(plan(&filled, Some(&account("u2")), "CA"), Plan::Delete(_)));
        // not ours
        assert_eq!(plan(&secret(&[], &[]), Some(&account("u1")), "CA"), Plan::Nothing);
        let mut opaque = fresh.clone();
        opaque.type_ = Some("Opaque".into());
        assert_eq!(plan(&opaque, Some(&account("u1")), "CA"), Plan::Nothing);
    }
}
