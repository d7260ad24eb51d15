//! Authorization of the :10250 server's requests, as upstream kubelet's (pkg/kubelet/server
//! auth.go): every authenticated request is a `get`/`create`/... on the `nodes` resource named
//! after this node, with a subresource picked by path, and in Webhook mode the API server
//! decides with a SubjectAccessReview. Answers are cached per (user, groups, verb,
//! subresource): allowed ones for `cacheAuthorizedTTL`, denied ones for `cacheUnauthorizedTTL`;
//! a failed review is not cached.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use http::Method;

/// `authorization.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Every authenticated request is allowed.
    AlwaysAllow,
    /// A SubjectAccessReview against the API server.
    Webhook,
}

/// `authorization` of the KubeletConfiguration, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct AuthzConfig {
    pub mode: Mode,
    pub authorized_ttl: Duration,
    pub unauthorized_ttl: Duration,
}

impl Default for AuthzConfig {
    fn default() -> Self {
        AuthzConfig {
            mode: Mode::AlwaysAllow,
            authorized_ttl: Duration::from_secs(300),
            unauthorized_ttl: Duration::from_secs(30),
        }
    }
}

/// The API verb of an HTTP method, as upstream maps it.
pub fn verb(method: &Method) -> &'static str {
    match *method {
        Method::POST => "create",
        Method::GET | Method::HEAD => "get",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "",
    }
}

/// The `nodes` subresources to check for a path, in order: upstream's fine-grained ones
/// (`pods`, `healthz`, `configz`) fall back to `proxy` when denied; the classic ones
/// (`stats`, `metrics`, `log`, `spec`, `checkpoint`) stand alone; anything else is `proxy`
/// (exec, attach, port-forward, container logs).
pub fn subresources(path: &str) -> &'static [&'static str] {
    let first = path.trim_start_matches('/').split('/').next().unwrap_or("");
    match first {
        "pods" => &["pods", "proxy"],
        "healthz" => &["healthz", "proxy"],
        "configz" => &["configz", "proxy"],
        "stats" => &["stats"],
        "metrics" => &["metrics"],
        "logs" => &["log"],
        "spec" => &["spec"],
        "checkpoint" => &["checkpoint"],
        _ => &["proxy"],
    }
}

/// The caller, as authentication established it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Subject {
    pub name: String,
    pub groups: Vec<String>,
}

/// Why a request is not served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denial {
    /// 403 with upstream's text.
    Forbidden(String),
    /// 500: the review itself failed.
    Error(String),
}

type Key = (Subject, &'static str, &'static str);

/// Answers per [`AuthzConfig`]; keeps the webhook's cache.
pub struct Authorizer {
    cfg: AuthzConfig,
    node: String,
    client: Option<kube::Client>,
    cache: Mutex<HashMap<Key, (bool, Instant)>>,
}

impl Authorizer {
    pub fn new(cfg: AuthzConfig, node: &str, client: Option<kube::Client>) -> Authorizer {
        Authorizer { cfg, node: node.to_string(), client, cache: Mutex::new(HashMap::new()) }
    }

    /// Decides a request of `who`.
    pub async fn authorize(&self, who: &Subject, method: &Method, path: &str) -> Result<(), Denial> {
        if self.cfg.mode == Mode::AlwaysAllow {
            return Ok(());
        }
        let verb = verb(method);
        let subs = subresources(path);
        for sub in subs {
            match self.allowed(who, verb, sub).await {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(user = %who.name, verb, subresource = sub, error = %e, "SubjectAccessReview failed");
                    return Err(Denial::Error(format!(
                        "Authorization error (user={}, verb={verb}, resource=nodes, subresource={sub})",
                        who.name
                    )));
                }
            }
        }
        let sub = subs.last().copied().unwrap_or("proxy");
        Err(Denial::Forbidden(format!("Forbidden (user={}, verb={verb}, resource=nodes, subresource={sub})", who.name)))
    }

    async fn allowed(&self, who: &Subject, verb: &'static str, sub: &'static str) -> Result<bool, String> {
        let key: Key = (who.clone(), verb, sub);
        let now = Instant::now();
        if let Some((allowed, until)) = self.cache.lock().ok().and_then(|c| c.get(&key).copied()) {
            if now < until {
                return Ok(allowed);
            }
        }
        let allowed = self.review(who, verb, sub).await?;
        let ttl = if allowed { self.cfg.authorized_ttl } else { self.cfg.unauthorized_ttl };
        if let Ok(mut c) = self.cache.lock() {
            c.retain(|_, (_, until)| *until > now);
            if !ttl.is_zero() {
                c.insert(key, (allowed, now + ttl));
            }
        }
        Ok(allowed)
    }

    async fn review(&self, who: &Subject, verb: &str, sub: &str) -> Result<bool, String> {
        use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
        let client = self.client.as_ref().ok_or("no API server configured")?;
        let api: kube::Api<SubjectAccessReview> = kube::Api::all(client.clone());
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(who.name.clone()),
                groups: Some(who.groups.clone()),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(verb.to_string()),
                    version: Some("v1".into()),
                    resource: Some("nodes".into()),
                    subresource: Some(sub.to_string()),
                    name: Some(self.node.clone()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let pp = kube::api::PostParams::default();
        match tokio::time::timeout(Duration::from_secs(10), api.create(&pp, &review)).await {
            Ok(Ok(r)) => Ok(r.status.is_some_and(|s| s.allowed)),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("timed out".into()),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn verbs_and_subresources_as_upstream() {
        assert_eq!(verb(&Method::GET), "get");
        assert_eq!(verb(&Method::HEAD), "get");
        assert_eq!(verb(&Method::POST), "create");
        assert_eq!(verb(&Method::PUT), "update");
        assert_eq!(verb(&Method::PATCH), "patch");
        assert_eq!(verb(&Method::DELETE), "delete");
        assert_eq!(subresources("/pods"), ["pods", "proxy"]);
        assert_eq!(subresources("/healthz"), ["healthz", "proxy"]);
        assert_eq!(subresources("/metrics"), ["metrics"]);
        assert_eq!(subresources("/metrics/cadvisor"), ["metrics"]);
        assert_eq!(subresources("/stats/summary"), ["stats"]);
        assert_eq!(subresources("/logs/syslog"), ["log"]);
        assert_eq!(subresources("/spec/"), ["spec"]);
        assert_eq!(subresources("/exec/ns/pod/c"), ["proxy"]);
        assert_eq!(subresources("/containerLogs/ns/pod/c"), ["proxy"]);
        assert_eq!(subresources("/portForward/ns/pod"), ["proxy"]);
        assert_eq!(subresources("/"), ["proxy"]);
    }

    /// A kube client whose API server answers SubjectAccessReviews: admins may do everything,
    /// `bob` only `nodes/proxy`; `fail` makes every review a 500. Counts the reviews.
    fn reviewer(calls: Arc<AtomicUsize>, fail: bool) -> kube::Client {
        use http_body_util::BodyExt as _;
        let svc = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let calls = calls.clone();
            async move {
                assert_eq!(req.uri().path(), "/apis/authorization.k8s.io/v1/subjectaccessreviews");
                calls.fetch_add(1, Ordering::SeqCst);
                let body = req.into_body().collect().await.unwrap().to_bytes();
                let review: serde_json::Value = serde_json::from_slice(&body).unwrap();
                let spec = &review["spec"];
                assert_eq!(spec["resourceAttributes"]["resource"], "nodes");
                assert_eq!(spec["resourceAttributes"]["name"], "n1");
                let admin = spec["groups"].as_array().is_some_and(|g| g.contains(&"system:masters".into()));
                let bob_proxy = spec["user"] == "bob" && spec["resourceAttributes"]["subresource"] == "proxy";
                let mut out = review.clone();
                out["status"] = serde_json::json!({"allowed": admin || bob_proxy});
                let (code, text) = if fail { (500, "{}".to_string()) } else { (201, out.to_string()) };
                let resp = http::Response::builder()
                    .status(code)
                    .header("content-type", "application/json")
                    .body(http_body_util::Full::new(bytes::Bytes::from(text)))
                    .unwrap();
                Ok::<_, std::convert::Infallible>(resp)
            }
        });
        kube::Client::new(svc, "default")
    }

    fn webhook(unauthorized_ttl: Duration) -> AuthzConfig {
        AuthzConfig { mode: Mode::Webhook, authorized_ttl: Duration::from_secs(300), unauthorized_ttl }
    }

    #[tokio::test]
    async fn webhook_asks_the_api_server_and_caches_the_answers() {
        let calls = Arc::new(AtomicUsize::new(0));
        let a = Authorizer::new(webhook(Duration::from_secs(30)), "n1", Some(reviewer(calls.clone(), false)));
        let admin = Subject { name: "root".into(), groups: vec!["system:masters".into()] };
        let bob = Subject { name: "bob".into(), groups: vec![] };
        let eve = Subject { name: "eve".into(), groups: vec![] };
        assert_eq!(a.authorize(&admin, &Method::POST, "/exec/ns/p/c").await, Ok(()));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        // Cached: no second review.
        assert_eq!(a.authorize(&admin, &Method::POST, "/exec/ns/p/c").await, Ok(()));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        // /pods: the fine-grained `pods` is denied to bob, `proxy` then allows.
        assert_eq!(a.authorize(&bob, &Method::GET, "/pods").await, Ok(()));
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        // /metrics has no fallback.
        assert_eq!(
            a.authorize(&bob, &Method::GET, "/metrics").await,
            Err(Denial::Forbidden("Forbidden (user=bob, verb=get, resource=nodes, subresource=metrics)".into()))
        );
        assert_eq!(
            a.authorize(&eve, &Method::GET, "/healthz").await,
            Err(Denial::Forbidden("Forbidden (user=eve, verb=get, resource=nodes, subresource=proxy)".into()))
        );
        let before = calls.load(Ordering::SeqCst);
        // Denials are cached too (for cacheUnauthorizedTTL).
        assert!(a.authorize(&eve, &Method::GET, "/healthz").await.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), before);
        // A zero TTL caches nothing.
        let calls = Arc::new(AtomicUsize::new(0));
        let a = Authorizer::new(webhook(Duration::ZERO), "n1", Some(reviewer(calls.clone(), false)));
        for _ in 0..2 {
            assert!(a.authorize(&eve, &Method::GET, "/metrics").await.is_err());
        }
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_failed_review_is_an_error_and_not_cached() {
        let calls = Arc::new(AtomicUsize::new(0));
        let a = Authorizer::new(webhook(Duration::from_secs(30)), "n1", Some(reviewer(calls.clone(), true)));
        let admin = Subject { name: "root".into(), groups: vec!["system:masters".into()] };
        for _ in 0..2 {
            assert_eq!(
                a.authorize(&admin, &Method::GET, "/containerLogs/ns/p/c").await,
                Err(Denial::Error("Authorization error (user=root, verb=get, resource=nodes, subresource=proxy)".into()))
            );
        }
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn always_allow_needs_no_api_server() {
        let a = Authorizer::new(AuthzConfig::default(), "n1", None);
        let who = Subject { name: "anyone".into(), groups: vec![] };
        assert_eq!(a.authorize(&who, &Method::POST, "/exec/a/b/c").await, Ok(()));
    }
}
