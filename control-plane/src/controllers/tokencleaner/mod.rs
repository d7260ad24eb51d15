//! The bootstrap token cleaner (upstream's `tokencleaner`): a bootstrap token's Secret
//! (`kube-system`, type `bootstrap.kubernetes.io/token`) is deleted once its `expiration` has
//! passed; until then the key comes back at the expiration. The authenticator refuses an
//! expired token whether or not it is gone yet.

use std::sync::Arc;
use std::time::Duration;

use ferro_runtime::{spawn_resync, spawn_workers, Informer, Next, WorkQueue};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{DeleteParams, Preconditions};
use kube::runtime::watcher;
use kube::{Api, ResourceExt as _};

use crate::bootstrap_token::{NAMESPACE, SECRET_TYPE};
use crate::controllers::manager::{Informers, Options};
use crate::controllers::{is_conflict, is_not_found, Error};

pub const NAME: &str = "tokencleaner";

/// What to do with a token's Secret at `now`: delete it, or look again after this long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    Keep,
    Delete,
    After(Duration),
}

pub fn plan(secret: &Secret, now: jiff::Timestamp) -> Plan {
    if secret.type_.as_deref() != Some(SECRET_TYPE) || secret.metadata.deletion_timestamp.is_some() {
        return Plan::Keep;
    }
    let Some(raw) = secret.data.as_ref().and_then(|d| d.get("expiration")) else { return Plan::Keep };
    let Ok(text) = std::str::from_utf8(&raw.0) else { return Plan::Keep };
    let Ok(at) = text.parse::<jiff::Timestamp>() else { return Plan::Keep };
    if now >= at {
        Plan::Delete
    } else {
        let left = at.duration_since(now);
        Plan::After(Duration::try_from(left).unwrap_or(Duration::from_secs(1)).max(Duration::from_secs(1)))
    }
}

struct Context {
    client: kube::Client,
    secrets: Arc<Informer<Secret>>,
}

pub fn start(inf: &Arc<Informers>, opts: &Options) {
    let queue: WorkQueue<String> = WorkQueue::new();
    let secrets: Arc<Informer<Secret>> = Informer::new();
    secrets.spawn(
        Api::namespaced(inf.client(), NAMESPACE),
        watcher::Config::default().fields(&format!("type={SECRET_TYPE}")),
    );
    {
        let q = queue.clone();
        secrets.on_change(move |c| q.add(c.object().name_any()));
    }
    {
        let s = secrets.clone();
        spawn_resync(queue.clone(), opts.resync, move || s.list().iter().map(|x| x.name_any()).collect());
    }
    {
        let (s, q) = (secrets.clone(), queue.clone());
        tokio::spawn(async move {
            s.wait_synced().await;
            s.list().iter().for_each(|x| q.add(x.name_any()));
        });
    }
    let ctx = Arc::new(Context { client: inf.client(), secrets });
    spawn_workers(NAME, queue, 1, move |name: String| reconcile(ctx.clone(), name));
}

/// One pass over a token's Secret: deleted when expired (guarded by its uid).
#[tracing::instrument(name = "reconcile", skip_all, fields(controller = NAME, key = %name))]
async fn reconcile(ctx: Arc<Context>, name: String) -> Result<Next, Error> {
    ctx.secrets.wait_synced().await;
    let Some(secret) = ctx.secrets.get(Some(NAMESPACE), &name) else { return Ok(Next::Done) };
    match plan(&secret, jiff::Timestamp::now()) {
        Plan::Keep => Ok(Next::Done),
        Plan::After(d) => Ok(Next::After(d)),
        Plan::Delete => {
            let api: Api<Secret> = Api::namespaced(ctx.client.clone(), NAMESPACE);
            let dp = DeleteParams { preconditions: Some(Preconditions { uid: secret.uid(), resource_version: None }), ..Default::default() };
            match api.delete(&name, &dp).await {
                Ok(_) => {
                    tracing::info!("expired bootstrap token deleted");
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
    use std::collections::BTreeMap;

    fn token(expiration: Option<&str>) -> Secret {
        let mut data = BTreeMap::new();
        if let Some(e) = expiration {
            data.insert("expiration".to_string(), k8s_openapi::ByteString(e.as_bytes().to_vec()));
        }
        Secret { type_: Some(SECRET_TYPE.into()), data: Some(data), ..Default::default() }
    }

    #[test]
    fn expired_tokens_go_the_others_come_back_at_their_expiration() {
        let now: jiff::Timestamp = "2026-11-27T00:00:00Z".parse().unwrap();
        assert_eq!(plan(&token(Some("2026-11-26T23:59:59Z")), now), Plan::Delete);
        assert_eq!(plan(&token(Some("2026-11-27T00:00:00Z")), now), Plan::Delete);
        assert_eq!(plan(&token(Some("2026-11-27T01:00:00Z")), now), Plan::After(Duration::from_secs(3600)));
        assert_eq!(plan(&token(None), now), Plan::Keep, "no expiration: kept forever");
        assert_eq!(plan(&token(Some("soon")), now), Plan::Keep, "unparseable: the authenticator refuses it; kept for a person to see");
        let mut opaque = token(Some("2020-01-01T00:00:00Z"));
        opaque.type_ = Some("Opaque".into());
        assert_eq!(plan(&opaque, now), Plan::Keep);
    }
}
