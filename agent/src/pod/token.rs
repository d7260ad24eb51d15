//! Service account tokens for pods' projected `serviceAccountToken` sources, as upstream's
//! kubelet token manager: a TokenRequest per (pod, audience, expiry) bound to the pod, cached
//! and requested again once 80 % of its lifetime has passed or it is older than 24 h, so the
//! volume refresh rotates the file before the token expires.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount, ServiceAccountTokenProjection};

/// The first serviceAccountToken projection of a pod (the one the agent provides).
pub fn projection(pod: &Pod) -> Option<&ServiceAccountTokenProjection> {
    pod.spec
        .as_ref()?
        .volumes
        .iter()
        .flatten()
        .flat_map(|v| v.projected.iter().flat_map(|p| p.sources.iter().flatten()))
        .find_map(|s| s.service_account_token.as_ref())
}

/// Whether a token issued at `issued` (seconds) that expires at `expires` must be replaced
/// at `now` (upstream's requiresRefresh: 80 % of the lifetime, or a day, whichever first).
pub fn needs_refresh(issued: i64, expires: i64, now: i64) -> bool {
    let lifetime = (expires - issued).max(0);
    now >= issued + lifetime * 8 / 10 || now - issued > 24 * 3600
}

#[derive(Clone, Debug)]
struct Cached {
    token: String,
    issued: i64,
    expires: i64,
}

/// Tokens by (pod uid, audience, expirationSeconds).
#[derive(Default)]
pub struct TokenManager {
    cache: Mutex<HashMap<(String, String, i64), Cached>>,
}

impl TokenManager {
    /// The token for the pod's projection: the cached one while fresh, else a new one from the
    /// API (None when it cannot be had; the volume setup then fails and is retried).
    pub async fn token(&self, client: &kube::Client, pod: &Pod, p: &ServiceAccountTokenProjection) -> Option<String> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let audience = p.audience.clone().unwrap_or_default();
        let expiration = p.expiration_seconds.unwrap_or(3600);
        let key = (uid.clone(), audience.clone(), expiration);
        let now = jiff::Timestamp::now().as_second();
        if let Some(c) = self.lock().get(&key).filter(|c| !needs_refresh(c.issued, c.expires, now)) {
            return Some(c.token.clone());
        }
        let ns = pod.metadata.namespace.clone().unwrap_or_else(|| "default".into());
        let sa = pod.spec.as_ref().and_then(|s| s.service_account_name.clone()).unwrap_or_else(|| "default".into());
        let req = TokenRequest {
            spec: TokenRequestSpec {
                audiences: if audience.is_empty() { Vec::new() } else { vec![audience] },
                expiration_seconds: Some(expiration),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: pod.metadata.name.clone(),
                    uid: Some(uid),
                }),
            },
            ..TokenRequest::default()
        };
        let api: kube::Api<ServiceAccount> = kube::Api::namespaced(client.clone(), &ns);
        let out: TokenRequest = match api.create_subresource("token", &sa, &kube::api::PostParams::default(), &req).await {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(pod = ?pod.metadata.name, serviceaccount = sa, error = %e, "requesting a service account token failed");
                // an older token still valid serves until it expires
                return self.lock().get(&key).filter(|c| now < c.expires).map(|c| c.token.clone());
            }
        };
        let status = out.status?;
        let expires = status.expiration_timestamp.0.as_second();
        let token = status.token;
        self.lock().insert(key, Cached { token: token.clone(), issued: now, expires });
        Some(token)
    }

    /// Forgets the tokens of pods that are gone.
    pub fn retain(&self, live: impl Fn(&str) -> bool) {
        self.lock().retain(|(uid, ..), _| live(uid));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String, i64), Cached>> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_renewed_at_80_percent_or_after_a_day() {
        assert!(!needs_refresh(0, 3600, 2879));
        assert!(needs_refresh(0, 3600, 2880));
        assert!(!needs_refresh(0, 10 * 24 * 3600, 24 * 3600));
        assert!(needs_refresh(0, 10 * 24 * 3600, 24 * 3600 + 1));
    }

    #[test]
    fn the_first_projection_is_the_one_provided() {
        let pod: Pod = serde_json::from_value(serde_json::json!({"spec": {"containers": [], "volumes": [
            {"name": "a", "emptyDir": {}},
            {"name": "kube-api-access-x", "projected": {"sources": [
                {"configMap": {"name": "kube-root-ca.crt"}},
                {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607, "audience": "vault"}}]}}]}}))
        .unwrap();
        let p = projection(&pod).unwrap();
        assert_eq!((p.path.as_str(), p.expiration_seconds, p.audience.as_deref()), ("token", Some(3607), Some("vault")));
    }
}
