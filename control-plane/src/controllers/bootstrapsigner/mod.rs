//! The bootstrap signer (upstream's `bootstrapsigner`): the `cluster-info` ConfigMap in
//! `kube-public` carries, for every bootstrap token allowed to sign (`usage-bootstrap-signing:
//! "true"`, not expired), `jws-kubeconfig-<token id>`: the detached JWS of its `kubeconfig`
//! keyed with the token's secret (k8s_semantics::bootstrap). Signatures of tokens that are gone,
//! expired or no longer allowed to sign are removed; a changed kubeconfig is signed again.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ferro_runtime::{spawn_resync, spawn_workers, Informer, Next, WorkQueue};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_semantics::bootstrap::{detached_signature, CLUSTER_INFO, CLUSTER_INFO_NAMESPACE, JWS_KEY_PREFIX, KUBECONFIG_KEY};
use kube::api::PostParams;
use kube::runtime::watcher;
use kube::Api;

use crate::bootstrap_token::{NAMESPACE, NAME_PREFIX, SECRET_TYPE};
use crate::controllers::manager::{Informers, Options};
use crate::controllers::{is_conflict, is_not_found, Error};

pub const NAME: &str = "bootstrapsigner";

/// A token that signs: its id and secret, and when it stops signing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signer {
    pub id: String,
    pub secret: String,
    pub expires: Option<jiff::Timestamp>,
}

fn text<'a>(secret: &'a Secret, key: &str) -> Option<&'a str> {
    secret.data.as_ref()?.get(key).and_then(|b| std::str::from_utf8(&b.0).ok())
}

/// The token a Secret holds, when it may sign at `now` (upstream's rules: the type, the name
/// `bootstrap-token-<id>`, the id and secret's shape, `usage-bootstrap-signing: "true"`, an
/// expiration that is unset or later than now).
pub fn signer(secret: &Secret, now: jiff::Timestamp) -> Option<Signer> {
    if secret.type_.as_deref() != Some(SECRET_TYPE) || secret.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let (id, token_secret) = (text(secret, "token-id")?, text(secret, "token-secret")?);
    crate::bootstrap_token::split(&format!("{id}.{token_secret}"))?;
    if secret.metadata.name.as_deref() != Some(&format!("{NAME_PREFIX}{id}")) || text(secret, "usage-bootstrap-signing") != Some("true") {
        return None;
    }
    let expires = match text(secret, "expiration") {
        None => None,
        Some(t) => Some(t.parse::<jiff::Timestamp>().ok()?),
    };
    if expires.is_some_and(|e| now >= e) {
        return None;
    }
    Some(Signer { id: id.to_string(), secret: token_secret.to_string(), expires })
}

/// The ConfigMap's data as it should be (None: as it is), and when to look again (the next
/// expiry of a signing token).
pub fn plan(cm: &ConfigMap, secrets: &[Arc<Secret>], now: jiff::Timestamp) -> (Option<BTreeMap<String, String>>, Option<Duration>) {
    let data = cm.data.clone().unwrap_or_default();
    let signers: Vec<Signer> = secrets.iter().filter_map(|s| signer(s, now)).collect();
    let again = signers
        .iter()
        .filter_map(|s| s.expires)
        .min()
        .map(|e| Duration::try_from(e.duration_since(now)).unwrap_or(Duration::from_secs(1)).max(Duration::from_secs(1)));
    let mut want: BTreeMap<String, String> = data.iter().filter(|(k, _)| !k.starts_with(JWS_KEY_PREFIX)).map(|(k, v)| (k.clone(), v.clone())).collect();
    // nothing to sign: every signature goes (upstream leaves such a ConfigMap alone; a
    // signature of content that is not there proves nothing)
    if let Some(content) = data.get(KUBECONFIG_KEY) {
        for s in &signers {
            want.insert(format!("{JWS_KEY_PREFIX}{}", s.id), detached_signature(content, &s.id, &s.secret));
        }
    }
    ((want != data).then_some(want), again)
}

struct Context {
    client: kube::Client,
    secrets: Arc<Informer<Secret>>,
    configmaps: Arc<Informer<ConfigMap>>,
}

pub fn start(inf: &Arc<Informers>, opts: &Options) {
    let queue: WorkQueue<String> = WorkQueue::new();
    let secrets: Arc<Informer<Secret>> = Informer::new();
    secrets.spawn(Api::namespaced(inf.client(), NAMESPACE), watcher::Config::default().fields(&format!("type={SECRET_TYPE}")));
    let configmaps: Arc<Informer<ConfigMap>> = Informer::new();
    configmaps.spawn(
        Api::namespaced(inf.client(), CLUSTER_INFO_NAMESPACE),
        watcher::Config::default().fields(&format!("metadata.name={CLUSTER_INFO}")),
    );
    // one key: every token's change and the ConfigMap's own lead to the same pass
    {
        let q = queue.clone();
        secrets.on_change(move |_| q.add(CLUSTER_INFO.to_string()));
    }
    {
        let q = queue.clone();
        configmaps.on_change(move |_| q.add(CLUSTER_INFO.to_string()));
    }
    spawn_resync(queue.clone(), opts.resync, || vec![CLUSTER_INFO.to_string()]);
    {
        let (s, c, q) = (secrets.clone(), configmaps.clone(), queue.clone());
        tokio::spawn(async move {
            s.wait_synced().await;
            c.wait_synced().await;
            q.add(CLUSTER_INFO.to_string());
        });
    }
    let ctx = Arc::new(Context { client: inf.client(), secrets, configmaps });
    spawn_workers(NAME, queue, 1, move |key: String| reconcile(ctx.clone(), key));
}

/// One pass over the ConfigMap: its signatures made to match the signing tokens (a write
/// guarded by its resourceVersion).
#[tracing::instrument(name = "reconcile", skip_all, fields(controller = NAME, key = %format!("{CLUSTER_INFO_NAMESPACE}/{key}")))]
async fn reconcile(ctx: Arc<Context>, key: String) -> Result<Next, Error> {
    ctx.secrets.wait_synced().await;
    ctx.configmaps.wait_synced().await;
    let Some(cm) = ctx.configmaps.get(Some(CLUSTER_INFO_NAMESPACE), &key) else { return Ok(Next::Done) };
    let (data, again) = plan(&cm, &ctx.secrets.list(), jiff::Timestamp::now());
    if let Some(data) = data {
        let mut out = (*cm).clone();
        let signed: Vec<&str> = data.keys().filter_map(|k| k.strip_prefix(JWS_KEY_PREFIX)).collect();
        tracing::info!(tokens = %signed.join(","), "cluster-info signatures updated");
        out.data = Some(data);
        let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), CLUSTER_INFO_NAMESPACE);
        match api.replace(&key, &PostParams::default(), &out).await {
            Ok(_) => {}
            // changed or gone meanwhile: the informer brings the new state back
            Err(e) if is_conflict(&e) || is_not_found(&e) => return Ok(Next::Done),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(again.map_or(Next::Done, Next::After))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use k8s_semantics::bootstrap::signature_valid;

    fn token(id: &str, secret: &str, extra: &[(&str, &str)]) -> Arc<Secret> {
        let mut data: BTreeMap<String, ByteString> =
            [("token-id", id), ("token-secret", secret), ("usage-bootstrap-signing", "true")].iter().map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec()))).collect();
        for (k, v) in extra {
            if v.is_empty() {
                data.remove(*k);
            } else {
                data.insert(k.to_string(), ByteString(v.as_bytes().to_vec()));
            }
        }
        let mut s = Secret { type_: Some(SECRET_TYPE.into()), data: Some(data), ..Default::default() };
        s.metadata.name = Some(format!("{NAME_PREFIX}{id}"));
        Arc::new(s)
    }

    fn cluster_info(data: &[(&str, &str)]) -> ConfigMap {
        ConfigMap { data: Some(data.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()), ..Default::default() }
    }

    #[test]
    fn each_signing_token_signs_the_kubeconfig_and_only_those() {
        let now: jiff::Timestamp = "2026-11-27T00:00:00Z".parse().unwrap();
        let kc = "apiVersion: v1\nkind: Config\n";
        let tokens = vec![
            token("abcdef", "0123456789abcdef", &[("expiration", "2026-11-27T01:00:00Z")]),
            token("ghijkl", "0123456789abcdef", &[]),
            token("expird", "0123456789abcdef", &[("expiration", "2026-11-26T00:00:00Z")]),
            token("nosign", "0123456789abcdef", &[("usage-bootstrap-signing", "")]),
            token("falsey", "0123456789abcdef", &[("usage-bootstrap-signing", "false")]),
            token("BADID1", "0123456789abcdef", &[]),
            token("baddat", "0123456789abcdef", &[("expiration", "tomorrow")]),
        ];
        let cm = cluster_info(&[("kubeconfig", kc), ("jws-kubeconfig-gone00", "x..y"), ("other", "kept")]);
        let (data, again) = plan(&cm, &tokens, now);
        let data = data.unwrap();
        let keys: Vec<&str> = data.keys().map(String::as_str).collect();
        assert_eq!(keys, ["jws-kubeconfig-abcdef", "jws-kubeconfig-ghijkl", "kubeconfig", "other"]);
        assert!(signature_valid(&data["jws-kubeconfig-abcdef"], kc, "abcdef", "0123456789abcdef"));
        assert!(signature_valid(&data["jws-kubeconfig-ghijkl"], kc, "ghijkl", "0123456789abcdef"));
        assert_eq!(again, Some(Duration::from_secs(3600)), "looked at again when abcdef expires");
        // signed as it should be: nothing to write
        let signed = ConfigMap { data: Some(data.clone()), ..Default::default() };
        assert_eq!(plan(&signed, &tokens, now).0, None);
        // the kubeconfig changes: signed again
        let mut changed = data.clone();
        changed.insert("kubeconfig".into(), "apiVersion: v1\nkind: Config\nclusters: []\n".into());
        let (again_signed, _) = plan(&ConfigMap { data: Some(changed), ..Default::default() }, &tokens, now);
        assert!(signature_valid(&again_signed.unwrap()["jws-kubeconfig-abcdef"], "apiVersion: v1\nkind: Config\nclusters: []\n", "abcdef", "0123456789abcdef"));
        // after abcdef's expiry its signature goes
        let later: jiff::Timestamp = "2026-11-27T01:00:00Z".parse().unwrap();
        let (after, again) = plan(&signed, &tokens, later);
        assert_eq!(after.unwrap().keys().map(String::as_str).collect::<Vec<_>>(), ["jws-kubeconfig-ghijkl", "kubeconfig", "other"]);
        assert_eq!(again, None);
        // no kubeconfig: no signatures
        let (empty, _) = plan(&cluster_info(&[("jws-kubeconfig-abcdef", "x..y")]), &tokens, now);
        assert_eq!(empty.unwrap(), BTreeMap::new());
    }

    #[test]
    fn a_secret_named_for_another_id_does_not_sign() {
        let now: jiff::Timestamp = "2026-11-27T00:00:00Z".parse().unwrap();
        let mut s = (*token("abcdef", "0123456789abcdef", &[])).clone();
        assert!(signer(&s, now).is_some());
        s.metadata.name = Some("bootstrap-token-zzzzzz".into());
        assert_eq!(signer(&s, now), None);
        s.metadata.name = Some("bootstrap-token-abcdef".into());
        s.type_ = Some("Opaque".into());
        assert_eq!(signer(&s, now), None);
    }
}
