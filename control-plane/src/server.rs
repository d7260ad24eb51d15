//! HTTPS serving: TLS with optional client certificates, authentication, routing of the
//! Kubernetes REST paths, content negotiation (JSON, YAML in, Table out) and watch streaming.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt as _;
use http::{header, Method, Request, Response};
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use serde_json::{json, Value};

use crate::api::{Api, DeleteOptions, ListOptions, PatchType, WatchItem};
use crate::auth::{self, Action, Attributes, Tokens, User};
use crate::discovery;
use crate::error::ApiError;
use crate::resources::{self, Resource, Sub};
use crate::store::{Record, Revision};

pub type Body = BoxBody<Bytes, std::io::Error>;

/// Largest request body accepted (upstream's limit).
pub const MAX_BODY: usize = 3 * 1024 * 1024;

pub struct ServerState {
    pub api: Arc<Api>,
    pub tokens: Tokens,
    pub kubelet: Option<crate::proxy::KubeletClient>,
    pub version: Value,
    /// Upstream's --max-requests-inflight / --max-mutating-requests-inflight: beyond these,
    /// requests get 429 with Retry-After (long-running watches and proxies are not counted).
    pub readonly_inflight: Arc<tokio::sync::Semaphore>,
    pub mutating_inflight: Arc<tokio::sync::Semaphore>,
    /// Signs and verifies service account tokens (None: no TokenRequest, no such tokens).
    pub sa_key: Option<Arc<crate::sa_token::SigningKey>>,
    /// The audiences the API server accepts in service account tokens (upstream's
    /// --api-audiences, by default the issuer).
    pub api_audiences: Vec<String>,
    /// The explainers of the loops running in this process, once they started.
    pub explain: Arc<std::sync::OnceLock<Arc<crate::controllers::explain::Registry>>>,
    /// metrics.k8s.io: the agents' usage the scrape loop keeps.
    pub resource_metrics: Arc<crate::resource_metrics::Metrics>,
    /// The RBAC policy the authorizer decides with (kept current from the store).
    pub rbac: Arc<crate::rbac::Policy>,
    /// The node authorizer's graph (kept current from the store).
    pub node_graph: Arc<crate::node_graph::NodeGraphView>,
    /// Requests without credentials are system:anonymous (else 401).
    pub anonymous_auth: bool,
}

pub fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).map_err(|never: Infallible| match never {}).boxed()
}

pub fn json_response(status: u16, v: &Value) -> Response<Body> {
    let body = serde_json::to_vec(v).unwrap_or_default();
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(full(body))
        .unwrap_or_else(|_| Response::new(full("")))
}

fn raw_json_response(status: u16, bytes: Bytes) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(full(bytes))
        .unwrap_or_else(|_| Response::new(full("")))
}

pub fn error_response(e: &ApiError) -> Response<Body> {
    let mut resp = json_response(e.code, &e.status());
    if e.code == 429 {
        resp.headers_mut().insert(header::RETRY_AFTER, http::HeaderValue::from_static("1"));
    }
    resp
}

/// A parsed resource request path.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestInfo {
    pub group: String,
    pub version: String,
    pub namespace: Option<String>,
    pub resource: String,
    pub name: Option<String>,
    pub subresource: Option<String>,
    /// The legacy `/watch/` path prefix was used.
    pub watch_path: bool,
}

/// Parses `/api/v1/...` and `/apis/<group>/<version>/...` paths below the group-version.
pub fn parse_path(path: &str) -> Option<RequestInfo> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] if !rest.is_empty() => ("", *v, rest),
        ["apis", g, v, rest @ ..] if !rest.is_empty() => (*g, *v, rest),
        _ => return None,
    };
    let mut info = RequestInfo { group: group.into(), version: version.into(), ..Default::default() };
    let mut rest = rest;
    if rest.first() == Some(&"watch") {
        info.watch_path = true;
        rest = &rest[1..];
    }
    match rest {
        ["namespaces", ns, sub @ ("status" | "finalize")] => {
            info.resource = "namespaces".into();
            info.name = Some(ns.to_string());
            info.subresource = Some(sub.to_string());
        }
        ["namespaces", ns, resource, tail @ ..] => {
            info.namespace = Some(ns.to_string());
            info.resource = resource.to_string();
            match tail {
                [] => {}
                [name] => info.name = Some(name.to_string()),
                [name, sub] => {
                    info.name = Some(name.to_string());
                    info.subresource = Some(sub.to_string());
                }
                _ => return None,
            }
        }
        [resource] => info.resource = resource.to_string(),
        [resource, name] => {
            info.resource = resource.to_string();
            info.name = Some(name.to_string());
        }
        [resource, name, sub] => {
            info.resource = resource.to_string();
            info.name = Some(name.to_string());
            info.subresource = Some(sub.to_string());
        }
        _ => return None,
    }
    if info.resource.is_empty() || info.name.as_deref() == Some("") {
        return None;
    }
    Some(info)
}

fn query(req: &Request<Incoming>) -> HashMap<String, String> {
    req.uri()
        .query()
        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default()
}

/// How the client wants the response.
#[derive(Debug, Clone, PartialEq)]
enum Output {
    Json,
    Yaml,
    Table { include_object: String },
}

fn negotiate(req: &Request<Incoming>, q: &HashMap<String, String>) -> Result<Output, ApiError> {
    let accept = req.headers().get(header::ACCEPT).and_then(|a| a.to_str().ok()).unwrap_or("application/json");
    let include = q.get("includeObject").cloned().unwrap_or_else(|| "Metadata".into());
    negotiate_accept(accept, include)
}

/// The response format for an Accept header. Responses are never protobuf: a client that also
/// accepts JSON (kubectl's typed clients send "application/vnd.kubernetes.protobuf, */*") gets
/// JSON; one that accepts only protobuf gets 406.
fn negotiate_accept(accept: &str, include: String) -> Result<Output, ApiError> {
    for part in accept.split(',') {
        let part = part.trim();
        let mut params = part.split(';').map(str::trim);
        let media = params.next().unwrap_or("");
        let params: Vec<&str> = params.collect();
        let is_table = params.contains(&"as=Table") && params.contains(&"g=meta.k8s.io");
        match media {
            "application/json" | "*/*" | "application/*" if is_table => {
                return Ok(Output::Table { include_object: include })
            }
            "application/json" | "*/*" | "application/*" => {
                if params.iter().any(|p| p.starts_with("as=")) {
                    continue; // another conversion we do not offer (e.g. PartialObjectMetadata)
                }
                return Ok(Output::Json);
            }
            "application/yaml" => return Ok(Output::Yaml),
            _ => continue,
        }
    }
    if accept.contains("application/vnd.kubernetes.protobuf") && !accept.contains("json") {
        return Err(ApiError::not_acceptable(accept));
    }
    Ok(Output::Json)
}

fn respond(out: &Output, status: u16, res: Option<&Resource>, obj: Value) -> Response<Body> {
    match out {
        Output::Json => json_response(status, &obj),
        Output::Yaml => {
            let body = serde_yaml::to_string(&obj).unwrap_or_default();
            Response::builder()
                .status(status)
                .header(header::CONTENT_TYPE, "application/yaml")
                .body(full(body))
                .unwrap_or_else(|_| Response::new(full("")))
        }
        Output::Table { include_object } => match res {
            Some(res) if obj.get("kind").and_then(|k| k.as_str()) != Some("Status") => {
                let (items, list_meta) = if obj.get("items").is_some() {
                    (
                        obj.get("items").and_then(|i| i.as_array()).cloned().unwrap_or_default(),
                        obj.get("metadata").cloned().unwrap_or(json!({})),
                    )
                } else {
                    let rv = obj.pointer("/metadata/resourceVersion").cloned().unwrap_or(json!(""));
                    (vec![obj], json!({"resourceVersion": rv}))
                };
                let t = table_of(res, &items, include_object, list_meta);
                json_response(status, &t)
            }
            _ => json_response(status, &obj),
        },
    }
}

/// The Table of objects of a resource: upstream's printer for built-in kinds, the CRD's
/// printer columns for custom ones.
fn table_of(res: &Resource, objects: &[Value], include_object: &str, list_meta: Value) -> Value {
    match res.custom {
        Some(c) => crate::crd::objects::table(c, objects, include_object, list_meta, jiff::Timestamp::now()),
        None => crate::table::table(res.plural, objects, include_object, list_meta, jiff::Timestamp::now()),
    }
}

fn record_response(out: &Output, status: u16, res: &Resource, r: &Record) -> Response<Body> {
    match out {
        Output::Json => raw_json_response(status, crate::crd::objects::served_bytes(res, &r.value)),
        _ => match r.json() {
            Ok(mut v) => {
                crate::crd::objects::served_value(res, &mut v);
                respond(out, status, Some(res), v)
            }
            Err(e) => error_response(&e.into()),
        },
    }
}

/// Reads a body, enforcing the size limit. An oversized body is still read (and dropped) up to
/// a hard cap, so a client that writes its whole body before reading gets the 413 rather than
/// a stalled connection.
async fn read_body(req: Request<Incoming>) -> Result<(http::request::Parts, Bytes), ApiError> {
    const DRAIN_CAP: usize = 64 * 1024 * 1024;
    let (parts, mut body) = req.into_parts();
    let mut buf = bytes::BytesMut::new();
    let mut total = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ApiError::bad_request(format!("reading the request body: {e}")))?;
        if let Ok(data) = frame.into_data() {
            total += data.len();
            if total <= MAX_BODY {
                buf.extend_from_slice(&data);
            } else if total > DRAIN_CAP {
                break;
            }
        }
    }
    if total > MAX_BODY {
        return Err(ApiError::too_large());
    }
    Ok((parts, buf.freeze()))
}

fn content_type(parts: &http::request::Parts) -> String {
    parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|c| c.to_str().ok())
        .unwrap_or("application/json")
        .to_string()
}

/// Decodes a JSON, YAML or Kubernetes protobuf object body.
pub(crate) fn decode_body(ct: &str, body: &[u8]) -> Result<Value, ApiError> {
    let media = ct.split(';').next().unwrap_or("").trim();
    let v: Value = match media {
        "application/json" | "" | "application/merge-patch+json" | "application/strategic-merge-patch+json"
        | "application/json-patch+json" | "application/apply-patch+json" => serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("json: cannot unmarshal the request body: {e}")))?,
        "application/yaml" | "application/apply-patch+yaml" => serde_yaml::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("yaml: unmarshal errors: {e}")))?,
        crate::protobuf::MEDIA_TYPE => crate::protobuf::decode_body(body).map_err(|e| ApiError::bad_request(e.to_string()))?,
        other => return Err(ApiError::unsupported_media_type(other)),
    };
    Ok(v)
}

/// The object name a request is authorized for: its path's, or for a list or watch the one
/// name its field selector requires (`fieldSelector=metadata.name=<name>`), as upstream's
/// RequestInfo does, so RBAC's resourceNames and the Node authorizer apply to a watch of one
/// object (the agent's watch of a ConfigMap its pods use). A name that could not be a path
/// segment is not one.
fn authorized_name(path_name: &str, verb: &str, q: &HashMap<String, String>) -> String {
    if !path_name.is_empty() || !matches!(verb, "list" | "watch") {
        return path_name.to_string();
    }
    let Some(Ok(sel)) = q.get("fieldSelector").map(|f| crate::selector::FieldSelector::parse(f)) else {
        return String::new();
    };
    match sel.exact_value("metadata.name") {
        Some(n) if !matches!(n, "" | "." | "..") && !n.contains(['/', '%']) => n.to_string(),
        _ => String::new(),
    }
}

fn verb_of(method: &Method, info: &RequestInfo, q: &HashMap<String, String>) -> &'static str {
    let watch = info.watch_path || matches!(q.get("watch").map(String::as_str), Some("true" | "1"));
    match *method {
        Method::GET | Method::HEAD if info.name.is_none() => {
            if watch {
                "watch"
            } else {
                "list"
            }
        }
        Method::GET | Method::HEAD => {
            if watch {
                "watch"
            } else {
                "get"
            }
        }
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if info.name.is_none() => "deletecollection",
        Method::DELETE => "delete",
        _ => "unknown",
    }
}

/// The review APIs: POST only, answered at once, nothing stored (authorized as a create of
/// the review's resource by [`route`]).
async fn serve_review(
    state: &Arc<ServerState>,
    user: &User,
    review: auth::Review,
    req: Request<Incoming>,
    seen: Revision,
) -> Result<Response<Body>, ApiError> {
    let (group, version, kind, _) = review.names();
    if req.method() != Method::POST {
        return Err(ApiError::method_not_allowed(req.method().as_str()));
    }
    let (parts, body) = read_body(req).await?;
    if review == auth::Review::SelfSubject {
        // the request carries nothing to read (kubectl sends it as protobuf)
        return Ok(json_response(201, &auth::self_subject_review(user)));
    }
    let obj = decode_body(&content_type(&parts), &body)?;
    Api::check_type(&obj, kind, &format!("{group}/{version}"))?;
    if review == auth::Review::Token {
        if let Some(answer) = service_account_token_review(state, &obj).await {
            return Ok(json_response(201, &answer));
        }
        // a bootstrap token (upstream's authenticator chain answers TokenReviews too)
        let token = obj.pointer("/spec/token").and_then(Value::as_str).unwrap_or("");
        if crate::bootstrap_token::split(token).is_some() {
            let mut out = obj.clone();
            out["status"] = match crate::bootstrap_token::authenticate(&state.api, token).await {
                Some(u) => json!({"authenticated": true, "user": {"username": u.name, "groups": u.groups}, "audiences": obj.pointer("/spec/audiences").cloned().unwrap_or(json!([]))}),
                None => json!({"user": {}, "error": "invalid bearer token"}),
            };
            return Ok(json_response(201, &out));
        }
    }
    if review == auth::Review::SelfSubjectRules {
        state.rbac.caught_up(seen, std::time::Duration::from_secs(1)).await;
        return Ok(json_response(201, &crate::rbac::review::self_subject_rules_review(user, &obj, &state.rbac.read())?));
    }
    let answer = || {
        let graph = state.node_graph.read();
        let policy = state.rbac.read();
        match review {
            auth::Review::SelfSubjectAccess => auth::self_subject_access_review(user, &obj, &*graph, &policy),
            auth::Review::SubjectAccess => auth::subject_access_review(&obj, &*graph, &policy),
            auth::Review::Token => auth::token_review(&state.tokens, &obj),
            auth::Review::SelfSubject | auth::Review::SelfSubjectRules => Ok(auth::self_subject_review(user)),
        }
    };
    let mut answered = answer();
    // a refusal lets the policy reach the revision the request saw (a binding just made)
    let refused = answered.as_ref().is_ok_and(|v| v.pointer("/status/allowed") == Some(&Value::Bool(false)));
    if refused && state.caught_up(seen).await {
        answered = answer();
    }
    let answer = answered.map_err(|why| ApiError::new(422, "Invalid", format!("{kind}.{group} \"\" is invalid: {why}")))?;
    Ok(json_response(201, &answer))
}

/// A TokenReview of a service account token: the token's user when it is valid for one of the
/// review's audiences (the API server's when none are given), with the audiences it matched;
/// None for a token that does not look like one (the static tokens are asked then).
async fn service_account_token_review(state: &ServerState, review: &Value) -> Option<Value> {
    let token = review.pointer("/spec/token").and_then(Value::as_str)?;
    let key = state.sa_key.as_ref()?;
    if token.matches('.').count() != 2 {
        return None;
    }
    let wanted: Vec<String> = review
        .pointer("/spec/audiences")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|x| x.as_str().map(str::to_string)).collect())
        .filter(|a: &Vec<String>| !a.is_empty())
        .unwrap_or_else(|| state.api_audiences.clone());
    let mut out = review.clone();
    match crate::subresources::authenticate_service_account(&state.api, key, &wanted, token).await {
        Some((user, claims)) => {
            let matched: Vec<&String> = claims.aud.iter().filter(|a| wanted.contains(a)).collect();
            out["status"] = json!({
                "authenticated": true,
                "user": {"username": user.name, "uid": claims.kubernetes.serviceaccount.uid, "groups": user.groups, "extra": claims.extra()},
                "audiences": matched,
            });
        }
        None => out["status"] = json!({"user": {}, "error": "[invalid bearer token, service account token is not valid]"}),
    }
    Some(out)
}

/// Entry point for one request.
pub async fn handle(state: Arc<ServerState>, cert_user: Option<User>, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    let started = std::time::Instant::now();
    let q = query(&req);
    let writer = crate::managed::Writer {
        manager: match q.get("fieldManager").filter(|m| !m.is_empty()) {
            Some(m) => m.clone(),
            None => crate::managed::default_manager(req.headers().get(header::USER_AGENT).and_then(|u| u.to_str().ok()).unwrap_or("")),
        },
        force: q.get("force").is_some_and(|f| f == "true"),
    };
    let apply = req.headers().get(header::CONTENT_TYPE).and_then(|c| c.to_str().ok()).is_some_and(|c| c.starts_with("application/apply-patch"));
    let info = parse_path(&path);
    // room for the requester too, which RBAC's escalation checks read (upstream's request context)
    let resp = crate::managed::WRITER.scope(writer, crate::rbac::escalation::scope(route(&state, cert_user, req))).await;
    let resp = resp.unwrap_or_else(|e| error_response(&e));
    {
        let (verb, group, version, resource, sub, scope) = match &info {
            Some(i) => {
                let api_verb = verb_of(&method, i, &q);
                let scope = if i.name.is_some() {
                    "resource"
                } else if i.namespace.is_some() {
                    "namespace"
                } else {
                    "cluster"
                };
                (
                    crate::metrics::canonical_verb(method.as_str(), api_verb, apply),
                    i.group.as_str(),
                    i.version.as_str(),
                    i.resource.as_str(),
                    i.subresource.as_deref().unwrap_or(""),
                    scope,
                )
            }
            None => (crate::metrics::canonical_verb(method.as_str(), "", false), "", "", "", "", ""),
        };
        let dry_run = q.get("dryRun").is_some_and(|d| d == "All");
        crate::metrics::record_request(verb, group, version, resource, sub, scope, dry_run, resp.status().as_u16(), started.elapsed().as_secs_f64());
    }
    tracing::debug!(%method, %path, status = resp.status().as_u16(), elapsed_ms = started.elapsed().as_millis() as u64, "request");
    resp
}

/// `/debug/controllers[/<loop>/<namespace>/<name>]`: what a loop would do for an object and
/// why it waits (controllers::explain); like upstream's /debug paths, for those allowed the
/// path (cluster-admin's `*`).
async fn serve_explain(state: &ServerState, rest: &str, req: &Request<Incoming>) -> Result<Response<Body>, ApiError> {
    use crate::controllers::explain::{ExplainError, Registry};
    if req.method() != Method::GET {
        return Err(ApiError::method_not_allowed(req.method().as_str()));
    }
    let empty;
    let registry: &Registry = match state.explain.get() {
        Some(r) => r,
        None => {
            empty = Registry::default();
            &empty
        }
    };
    let target = crate::controllers::explain::parse_path(rest).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let Some((name, key)) = target else {
        return Ok(json_response(200, &registry.index()));
    };
    let q = query(req);
    let e = registry.explain(&name, key, q.get("kind").cloned()).await.map_err(|e| match e {
        ExplainError::BadPath | ExplainError::BadRequest(_) => ApiError::bad_request(e.to_string()),
        ExplainError::NotFound { resource, name } => ApiError::not_found(&resource, &name),
        _ => ApiError::new(404, "NotFound", e.to_string()),
    })?;
    if q.get("format").map(String::as_str) == Some("text") {
        return Ok(Response::builder()
            .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
            .body(full(e.to_text()))
            .unwrap_or_else(|_| Response::new(full(""))));
    }
    Ok(json_response(200, &serde_json::to_value(&e).unwrap_or_default()))
}

/// The authorizer chain on one request (`auth::authorize`). A refusal first lets the RBAC
/// policy and the node graph reach the store revision the request saw (a binding created, a
/// pod bound just before), then decides again.
async fn authorize(state: &ServerState, user: &User, action: &Action<'_>, body: Option<&Value>, seen: Revision) -> Result<(), String> {
    let decide = || auth::authorize(user, action, &*state.node_graph.read(), body, &state.rbac.read());
    match decide() {
        Err(_) if state.caught_up(seen).await => decide(),
        other => other,
    }
}

impl ServerState {
    /// Whether the authorizer's views were behind `seen` and reached it (within a second).
    async fn caught_up(&self, seen: Revision) -> bool {
        let within = std::time::Duration::from_secs(1);
        let behind = self.rbac.applied() < seen || self.node_graph.applied() < seen;
        behind && self.rbac.caught_up(seen, within).await && self.node_graph.caught_up(seen, within).await
    }
}

/// The verb of a request that is not on a resource: the method, lower-case (upstream's).
fn path_verb(method: &Method) -> String {
    method.as_str().to_ascii_lowercase()
}

async fn route(state: &Arc<ServerState>, cert_user: Option<User>, req: Request<Incoming>) -> Result<Response<Body>, ApiError> {
    let path = req.uri().path().to_string();
    // what a refused request lets RBAC catch up with: every write acknowledged before it
    let seen = state.api.store.acknowledged();
    // Public endpoints (upstream's system:public-info-viewer).
    match path.as_str() {
        "/healthz" | "/livez" | "/readyz" | "/healthz/ping" | "/livez/ping" | "/readyz/ping" => {
            return Ok(Response::builder()
                .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
                .body(full("ok"))
                .unwrap_or_else(|_| Response::new(full("ok"))));
        }
        // with a trailing slash too, as upstream (the Python client asks for /version/)
        "/version" | "/version/" => return Ok(json_response(200, &state.version)),
        _ => {}
    }
    let user = match cert_user {
        Some(u) => u,
        None => {
            let authz = req.headers().get(header::AUTHORIZATION).and_then(|a| a.to_str().ok()).unwrap_or("");
            match state.tokens.authenticate(authz) {
                Some(u) => u,
                // no credentials at all (no certificate, no Authorization header)
                None if state.anonymous_auth && req.headers().get(header::AUTHORIZATION).is_none() => auth::User::anonymous(),
                None => {
                    let token = authz.strip_prefix("Bearer ").map(str::trim).unwrap_or_default();
                    if crate::bootstrap_token::split(token).is_some() {
                        crate::bootstrap_token::authenticate(&state.api, token).await.ok_or_else(ApiError::unauthorized)?
                    } else {
                        let key = state.sa_key.as_ref().ok_or_else(ApiError::unauthorized)?;
                        crate::subresources::authenticate_service_account(&state.api, key, &state.api_audiences, token)
                            .await
                            .map(|(u, _)| u)
                            .ok_or_else(ApiError::unauthorized)?
                    }
                }
            }
        }
    };
    // Impersonation (kubectl --as): the requester must be allowed to impersonate each part.
    let user = {
        let may = |a: &Attributes<'_>| auth::authorize(&user, &Action::Resource(a.clone()), &*state.node_graph.read(), None, &state.rbac.read());
        crate::rbac::impersonation::impersonate(&user, req.headers(), &may)?.unwrap_or(user)
    };
    crate::rbac::escalation::set_requester(crate::rbac::escalation::Requester { user: user.clone(), policy: state.rbac.clone(), seen });
    // Requests that are not on a resource (discovery, OpenAPI, the issuer's documents, the
    // loops' explanations) are authorized on their path (upstream's system:discovery,
    // system:service-account-issuer-discovery, cluster-admin's `*`).
    if parse_path(&path).is_none() && crate::proxy::node_proxy_path(&path, None).is_none() {
        let verb = path_verb(req.method());
        if let Err(why) = authorize(state, &user, &Action::Path { verb: &verb, path: &path }, None, seen).await {
            return Err(ApiError::new(403, "Forbidden", format!("forbidden: {why}")));
        }
    }
    if let Some(key) = state.sa_key.as_ref() {
        match path.as_str() {
            "/.well-known/openid-configuration" => return Ok(json_response(200, &key.openid_configuration())),
            "/openid/v1/jwks" => {
                let mut resp = json_response(200, &key.jwks());
                resp.headers_mut().insert(header::CONTENT_TYPE, http::HeaderValue::from_static("application/jwk-set+json"));
                return Ok(resp);
            }
            _ => {}
        }
    }
    // Prometheus metrics (authorized above: upstream's system:monitoring, bound to the
    // system:monitoring group, and cluster-admin)
    if path == "/metrics" {
        let text = crate::metrics::render(&state.api).await;
        return Ok(Response::builder()
            .header(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")
            .body(full(text))
            .unwrap_or_else(|_| Response::new(full(""))));
    }
    if let Some(review) = auth::Review::of_path(&path) {
        let (group, _, _, plural) = review.names();
        let verb = if req.method() == Method::POST { "create" } else { verb_of(req.method(), &RequestInfo::default(), &HashMap::new()) };
        let attrs = Attributes { verb, group, resource: plural, subresource: "", namespace: "", name: "" };
        if let Err(why) = authorize(state, &user, &Action::Resource(attrs), None, seen).await {
            return Err(ApiError::forbidden(&format!("{plural}.{group}"), "", why));
        }
        return serve_review(state, &user, review, req, seen).await;
    }
    if let Some(rest) = path.strip_prefix("/debug/controllers").filter(|r| r.is_empty() || r.starts_with('/')) {
        return serve_explain(state, rest, &req).await;
    }
    let q = query(&req);
    if path.trim_end_matches('/') == "/openapi/v2" {
        let accept = req.headers().get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("");
        return Ok(discovery::serve_openapi_v2(accept));
    }
    if let Some(resp) = discovery::serve(&path)? {
        return Ok(resp);
    }
    // nodes/proxy: to the node's agent, authorized as <verb> nodes/proxy
    if let Some((node, target)) = crate::proxy::node_proxy_path(&path, req.uri().query()) {
        let info = RequestInfo { resource: "nodes".into(), name: Some(node.to_string()), ..Default::default() };
        let attrs = Attributes { verb: verb_of(req.method(), &info, &q), group: "", resource: "nodes", subresource: "proxy", namespace: "", name: node };
        if let Err(why) = authorize(state, &user, &Action::Resource(attrs), None, seen).await {
            return Err(ApiError::forbidden("nodes", node, why));
        }
        let kubelet = state.kubelet.as_ref().ok_or_else(|| ApiError::service_unavailable("no kubelet client configured"))?;
        return crate::proxy::proxy_node(&state.api, kubelet, node, &target, req).await;
    }
    let Some(info) = parse_path(&path) else {
        return Err(ApiError::no_route());
    };
    // metrics.k8s.io: served from the scraped usage, authorized as any read
    if info.group == crate::resource_metrics::GROUP {
        let name = info.name.as_deref().unwrap_or("");
        let attrs = Attributes {
            verb: verb_of(req.method(), &info, &q),
            group: crate::resource_metrics::GROUP,
            resource: &info.resource,
            subresource: info.subresource.as_deref().unwrap_or(""),
            namespace: info.namespace.as_deref().unwrap_or(""),
            name,
        };
        if let Err(why) = authorize(state, &user, &Action::Resource(attrs), None, seen).await {
            return Err(ApiError::forbidden(&format!("{}.{}", info.resource, info.group), name, why));
        }
        return crate::resource_metrics::serve(&state.api, &state.resource_metrics, req.method(), &info, &q).await;
    }
    let res = resources::find(&info.group, &info.version, &info.resource).ok_or_else(ApiError::no_route)?;
    if res.namespaced != info.namespace.is_some() && !(res.namespaced && info.namespace.is_none() && info.name.is_none()) {
        return Err(ApiError::no_route());
    }
    let sub = match info.subresource.as_deref() {
        None => None,
        Some(s) => Some(
            res.subresources
                .iter()
                .copied()
                .find(|x| x.name() == s)
                .ok_or_else(ApiError::no_route)?,
        ),
    };
    let verb = verb_of(req.method(), &info, &q);
    let long_running = verb == "watch" || matches!(sub, Some(Sub::Log | Sub::Exec | Sub::Attach | Sub::PortForward));
    let _permit = if long_running {
        None
    } else {
        let sem = if matches!(verb, "get" | "list") { &state.readonly_inflight } else { &state.mutating_inflight };
        Some(sem.clone().try_acquire_owned().map_err(|_| {
            ApiError::too_many_requests("storage is (re)initializing or too many requests are in flight, please try again later")
        })?)
    };
    let out = negotiate(&req, &q)?;
    // Bodies are needed for some authorization decisions (node creating its own Node).
    let (parts, body, req_opt) = match *req.method() {
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE if !matches!(sub, Some(Sub::Exec | Sub::Attach | Sub::PortForward)) => {
            let (p, b) = read_body(req).await?;
            (Some(p), Some(b), None)
        }
        _ => (None, None, Some(req)),
    };
    let ct = parts.as_ref().map(content_type).unwrap_or_default();
    let body_value = match (&body, verb) {
        (Some(b), "create" | "update") if !b.is_empty() => Some(decode_body(&ct, b)?),
        _ => None,
    };
    let ns = info.namespace.as_deref();
    let name = info.name.as_deref().unwrap_or("");
    let authz_name = authorized_name(name, verb, &q);
    let attrs = Attributes {
        verb,
        group: res.group,
        resource: res.plural,
        subresource: info.subresource.as_deref().unwrap_or(""),
        namespace: ns.unwrap_or(""),
        name: &authz_name,
    };
    if let Err(why) = authorize(state, &user, &Action::Resource(attrs), body_value.as_ref(), seen).await {
        return Err(ApiError::forbidden(&res.group_resource(), name, why));
    }
    let dry_run = q.get("dryRun").map(|d| d == "All").unwrap_or(false);
    let field_validation = q.get("fieldValidation").cloned().unwrap_or_else(|| "Warn".into());
    let mut warnings = Vec::new();
    let api = &state.api;
    let mut resp = match (sub, verb) {
        (None, "get") => {
            let r = if q.get("resourceVersion").is_none_or(|v| v.is_empty()) {
                api.get_latest(res, ns, name).await?
            } else {
                api.get(res, ns, name).await?
            };
            record_response(&out, 200, res, &r)
        }
        (None, "list") => list(api, res, ns, &q, &out).await?,
        (None, "watch") | (Some(Sub::Status), "watch") => watch(api, res, ns, name, &info, &q, &out)?,
        (None, "create") => {
            let obj = body_value.ok_or_else(|| ApiError::bad_request("the request body is empty"))?;
            Api::check_type(&obj, res.kind, &res.api_version())?;
            let obj = Api::decode(res, obj, &field_validation, &mut warnings)?;
            let r = api.create(res, ns, obj, dry_run).await?;
            record_response(&out, 201, res, &r)
        }
        (None | Some(Sub::Status | Sub::Approval), "update") => {
            let obj = body_value.ok_or_else(|| ApiError::bad_request("the request body is empty"))?;
            Api::check_type(&obj, res.kind, &res.api_version())?;
            let obj = Api::decode(res, obj, &field_validation, &mut warnings)?;
            let (r, created) = api.update(res, ns, name, obj, crate::api::Endpoint::of(sub), dry_run).await?;
            record_response(&out, if created { 201 } else { 200 }, res, &r)
        }
        (Some(Sub::Finalize), "update") => {
            let obj = body_value.ok_or_else(|| ApiError::bad_request("the request body is empty"))?;
            Api::check_type(&obj, res.kind, &res.api_version())?;
            let obj = Api::decode(res, obj, &field_validation, &mut warnings)?;
            let r = api.finalize_namespace(res, name, obj, dry_run).await?;
            record_response(&out, 200, res, &r)
        }
        (None | Some(Sub::Status | Sub::Approval), "patch") => {
            let pt = PatchType::from_content_type(&ct).ok_or_else(|| ApiError::unsupported_media_type(&ct))?;
            let patch = decode_body(&ct, body.as_deref().unwrap_or_default())?;
            if pt == PatchType::Apply && q.get("fieldManager").map(|m| m.is_empty()).unwrap_or(true) {
                return Err(ApiError::bad_request("PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch"));
            }
            let r = api
                .patch(res, ns, name, pt, &patch, crate::api::Endpoint::of(sub), &field_validation, &mut warnings, dry_run)
                .await?;
            record_response(&out, 200, res, &r)
        }
        (Some(Sub::Status | Sub::Approval), "get") => {
            let r = if q.get("resourceVersion").is_none_or(|v| v.is_empty()) {
                api.get_latest(res, ns, name).await?
            } else {
                api.get(res, ns, name).await?
            };
            record_response(&out, 200, res, &r)
        }
        (None, "delete") => {
            let opts = delete_options(&q, &ct, body.as_deref())?;
            let (r, _gone) = api.delete(res, ns, name, &opts).await?;
            record_response(&out, 200, res, &r)
        }
        (None, "deletecollection") => {
            let opts = delete_options(&q, &ct, body.as_deref())?;
            let lopts = list_options(&q);
            let page = api.list(res, ns, &lopts).await?;
            let mut items = Vec::new();
            for r in page.records {
                let (rns, rname) = resources::key_parts(res, &r.key);
                match api.delete(res, rns, rname, &opts).await {
                    Ok((r, _)) => items.push(r.json()?),
                    Err(e) if e.code == 404 => {}
                    Err(e) => return Err(e),
                }
            }
            json_response(200, &json!({"kind": res.list_kind(), "apiVersion": res.api_version(), "metadata": {}, "items": items}))
        }
        (Some(Sub::Scale), v) => crate::subresources::scale(api, res, ns, name, v, &ct, body.as_deref()).await?,
        (Some(Sub::Binding), "create") => {
            crate::subresources::bind(api, ns, name, body_value.unwrap_or(Value::Null)).await?
        }
        (Some(Sub::Token), "create") => {
            let key = state.sa_key.as_ref().ok_or_else(|| ApiError::service_unavailable("no service account signing key"))?;
            crate::subresources::create_token(api, key, &state.api_audiences, ns.unwrap_or("default"), name, body_value.unwrap_or(Value::Null)).await?
        }
        (Some(Sub::Eviction), "create") => {
            crate::subresources::evict(api, ns, name, body_value.unwrap_or(Value::Null)).await?
        }
        (Some(Sub::Log | Sub::Exec | Sub::Attach | Sub::PortForward), _) => {
            let req = match req_opt {
                Some(r) => r,
                None => return Err(ApiError::method_not_allowed("this method")),
            };
            let kubelet = state.kubelet.as_ref().ok_or_else(|| ApiError::service_unavailable("no kubelet client configured"))?;
            crate::proxy::proxy_pod_subresource(api, kubelet, ns.unwrap_or(""), name, sub.unwrap_or(Sub::Log), req).await?
        }
        (_, v) => return Err(ApiError::method_not_allowed(v)),
    };
    for w in warnings {
        if let Ok(v) = http::HeaderValue::from_str(&format!("299 - \"{}\"", w.replace('"', "'"))) {
            resp.headers_mut().append("Warning", v);
        }
    }
    Ok(resp)
}

fn list_options(q: &HashMap<String, String>) -> ListOptions {
    ListOptions {
        label_selector: q.get("labelSelector").cloned(),
        field_selector: q.get("fieldSelector").cloned(),
        limit: q.get("limit").and_then(|l| l.parse().ok()),
        continue_token: q.get("continue").cloned(),
        resource_version: q.get("resourceVersion").cloned(),
        timeout_seconds: q.get("timeoutSeconds").and_then(|t| t.parse().ok()),
        allow_bookmarks: q.get("allowWatchBookmarks").map(|b| b == "true" || b == "1").unwrap_or(false),
        send_initial_events: q.get("sendInitialEvents").map(|b| b == "true").unwrap_or(false),
    }
}

fn delete_options(q: &HashMap<String, String>, ct: &str, body: Option<&[u8]>) -> Result<DeleteOptions, ApiError> {
    let mut opts = DeleteOptions {
        grace_period_seconds: q.get("gracePeriodSeconds").and_then(|g| g.parse().ok()),
        propagation_policy: q.get("propagationPolicy").cloned(),
        orphan_dependents: q.get("orphanDependents").map(|o| o == "true"),
        dry_run: q.get("dryRun").map(|d| d == "All").unwrap_or(false),
        ..Default::default()
    };
    if let Some(b) = body.filter(|b| !b.is_empty()) {
        let v = decode_body(ct, b).map_err(|e| ApiError::bad_request(format!("invalid DeleteOptions: {}", e.message)))?;
        if let Some(g) = v.get("gracePeriodSeconds").and_then(|g| g.as_i64()) {
            opts.grace_period_seconds = Some(g);
        }
        if let Some(p) = v.get("propagationPolicy").and_then(|g| g.as_str()) {
            opts.propagation_policy = Some(p.to_string());
        }
        if let Some(o) = v.get("orphanDependents").and_then(|g| g.as_bool()) {
            opts.orphan_dependents = Some(o);
        }
        if let Some(u) = v.pointer("/preconditions/uid").and_then(|g| g.as_str()) {
            opts.precondition_uid = Some(u.to_string());
        }
        if let Some(u) = v.pointer("/preconditions/resourceVersion").and_then(|g| g.as_str()) {
            opts.precondition_rv = Some(u.to_string());
        }
        if v.get("dryRun").and_then(|d| d.as_array()).map(|d| d.iter().any(|x| x == "All")).unwrap_or(false) {
            opts.dry_run = true;
        }
    }
    Ok(opts)
}

async fn list(api: &Api, res: &'static Resource, ns: Option<&str>, q: &HashMap<String, String>, out: &Output) -> Result<Response<Body>, ApiError> {
    let opts = list_options(q);
    let page = api.list(res, ns, &opts).await?;
    let mut meta = json!({"resourceVersion": page.revision.to_string()});
    if let Some(c) = &page.continue_token {
        meta["continue"] = json!(c);
    }
    if let Some(r) = page.remaining {
        meta["remainingItemCount"] = json!(r);
    }
    if let Output::Json = out {
        // Splice the stored bytes without re-encoding each object.
        let mut buf = Vec::with_capacity(page.records.iter().map(|r| r.value.len() + 1).sum::<usize>() + 256);
        buf.extend_from_slice(
            format!("{{\"kind\":\"{}\",\"apiVersion\":\"{}\",\"metadata\":{},\"items\":[", res.list_kind(), res.api_version(), meta).as_bytes(),
        );
        for (i, r) in page.records.iter().enumerate() {
            if i > 0 {
                buf.push(b',');
            }
            buf.extend_from_slice(&crate::crd::objects::served_bytes(res, &r.value));
        }
        buf.extend_from_slice(b"]}");
        return Ok(raw_json_response(200, Bytes::from(buf)));
    }
    let items: Result<Vec<Value>, _> = page
        .records
        .iter()
        .map(|r| {
            r.json().map(|mut v| {
                crate::crd::objects::served_value(res, &mut v);
                v
            })
        })
        .collect();
    let list = json!({"kind": res.list_kind(), "apiVersion": res.api_version(), "metadata": meta, "items": items?});
    Ok(respond(out, 200, Some(res), list))
}

fn watch(
    api: &Arc<Api>,
    res: &'static Resource,
    ns: Option<&str>,
    name: &str,
    info: &RequestInfo,
    q: &HashMap<String, String>,
    out: &Output,
) -> Result<Response<Body>, ApiError> {
    let mut opts = list_options(q);
    if info.name.is_some() {
        // watch of a single object (legacy /watch/ path with a name)
        let sel = format!("metadata.name={name}");
        opts.field_selector = Some(match opts.field_selector.take().filter(|f| !f.is_empty()) {
            Some(f) => format!("{f},{sel}"),
            None => sel,
        });
    }
    let rx = api.watch(res, ns, &opts)?;
    let out = out.clone();
    let mut first_table = true;
    let stream = tokio_stream_from(rx).map(move |item| {
        let line = watch_line(res, &out, item, &mut first_table);
        Ok::<_, std::io::Error>(Frame::data(Bytes::from(line)))
    });
    Response::builder()
        .status(200)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CACHE_CONTROL, "no-cache, private")
        .body(BodyExt::boxed(StreamBody::new(stream)))
        .map_err(ApiError::internal)
}

fn tokio_stream_from<T: Send + 'static>(mut rx: tokio::sync::mpsc::Receiver<T>) -> impl futures::Stream<Item = T> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

fn watch_line(res: &Resource, out: &Output, item: WatchItem, first_table: &mut bool) -> Vec<u8> {
    let mut line = match item {
        WatchItem::Event { kind, object } => match out {
            Output::Table { include_object } => {
                let mut obj: Value = serde_json::from_slice(&object).unwrap_or(Value::Null);
                crate::crd::objects::served_value(res, &mut obj);
                let rv = obj.pointer("/metadata/resourceVersion").cloned().unwrap_or(json!(""));
                let mut t = table_of(res, &[obj], include_object, json!({"resourceVersion": rv}));
                if !*first_table {
                    t["columnDefinitions"] = json!([]);
                }
                *first_table = false;
                serde_json::to_vec(&json!({"type": kind, "object": t})).unwrap_or_default()
            }
            _ => {
                let mut v = Vec::with_capacity(object.len() + 32);
                v.extend_from_slice(format!("{{\"type\":\"{kind}\",\"object\":").as_bytes());
                v.extend_from_slice(&crate::crd::objects::served_bytes(res, &object));
                v.push(b'}');
                v
            }
        },
        WatchItem::Bookmark { revision, initial_events_end } => {
            let mut meta = json!({"resourceVersion": revision.to_string()});
            if initial_events_end {
                meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
            }
            let obj = json!({"kind": res.kind, "apiVersion": res.api_version(), "metadata": meta});
            serde_json::to_vec(&json!({"type": "BOOKMARK", "object": obj})).unwrap_or_default()
        }
        WatchItem::Error(e) => serde_json::to_vec(&json!({"type": "ERROR", "object": e.status()})).unwrap_or_default(),
    };
    line.push(b'\n');
    line
}

/// TLS and connection serving.
pub async fn serve_tls(
    state: Arc<ServerState>,
    listener: tokio::net::TcpListener,
    tls: Arc<rustls::ServerConfig>,
    shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let mut shutdown = shutdown;
    loop {
        let (tcp, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    continue;
                }
            },
            _ = shutdown.changed() => return,
        };
        let acceptor = acceptor.clone();
        let state = state.clone();
        tokio::spawn(async move {
            let _ = tcp.set_nodelay(true);
            let tls = match acceptor.accept(tcp).await {
                Ok(t) => t,
                Err(e) => {
                    tracing::debug!(%peer, error = %e, "tls handshake failed");
                    return;
                }
            };
            let cert_user = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .and_then(|c| auth::identity_from_cert(c));
            serve_conn(state, tls, cert_user, peer).await;
        });
    }
}

async fn serve_conn<IO>(state: Arc<ServerState>, io: IO, cert_user: Option<User>, peer: SocketAddr)
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |req| {
        let state = state.clone();
        let user = cert_user.clone();
        async move { Ok::<_, Infallible>(handle(state, user, req).await) }
    });
    let builder = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
    if let Err(e) = builder.serve_connection_with_upgrades(hyper_util::rt::TokioIo::new(io), svc).await {
        tracing::debug!(%peer, error = %e, "connection ended with an error");
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_list_or_watch_of_one_name_is_authorized_for_that_name() {
        let q = |sel: &str| HashMap::from([("fieldSelector".to_string(), sel.to_string())]);
        assert_eq!(authorized_name("", "watch", &q("metadata.name=kube-root-ca.crt")), "kube-root-ca.crt");
        assert_eq!(authorized_name("", "list", &q("metadata.name==x,metadata.namespace=default")), "x");
        assert_eq!(authorized_name("", "list", &q(r"metadata.name=a\,b")), "a,b");
        // not one name: a set, an inequality, another field, no selector, a bad selector
        assert_eq!(authorized_name("", "watch", &q("metadata.name!=x")), "");
        assert_eq!(authorized_name("", "watch", &q("spec.nodeName=x")), "");
        assert_eq!(authorized_name("", "watch", &HashMap::new()), "");
        assert_eq!(authorized_name("", "watch", &q("metadata.name")), "");
        // names that cannot be a path segment
        for bad in ["..", ".", "a/b", "a%2Fb", ""] {
            assert_eq!(authorized_name("", "watch", &q(&format!("metadata.name={bad}"))), "", "{bad}");
        }
        // only lists and watches; a path's name is the name
        assert_eq!(authorized_name("", "deletecollection", &q("metadata.name=x")), "");
        assert_eq!(authorized_name("p", "get", &q("metadata.name=x")), "p");
    }

    #[test]
    fn paths() {
        let p = parse_path("/api/v1/namespaces/default/pods/web/status").unwrap();
        assert_eq!(
            (p.group.as_str(), p.namespace.as_deref(), p.resource.as_str(), p.name.as_deref(), p.subresource.as_deref()),
            ("", Some("default"), "pods", Some("web"), Some("status"))
        );
        let p = parse_path("/apis/apps/v1/deployments").unwrap();
        assert_eq!((p.group.as_str(), p.resource.as_str(), p.namespace), ("apps", "deployments", None));
        let p = parse_path("/api/v1/namespaces/kube-system").unwrap();
        assert_eq!((p.resource.as_str(), p.name.as_deref()), ("namespaces", Some("kube-system")));
        let p = parse_path("/api/v1/namespaces/x/status").unwrap();
        assert_eq!((p.resource.as_str(), p.name.as_deref(), p.subresource.as_deref()), ("namespaces", Some("x"), Some("status")));
        let p = parse_path("/api/v1/watch/namespaces/default/pods").unwrap();
        assert!(p.watch_path);
        assert!(parse_path("/api/v1").is_none());
        assert!(parse_path("/api/v1/namespaces/a/pods/b/c/d").is_none());
    }

    #[test]
    fn protobuf_requests_get_json_answers() {
        let neg = |a: &str| negotiate_accept(a, "Metadata".into());
        assert_eq!(neg("application/vnd.kubernetes.protobuf, */*").unwrap(), Output::Json);
        assert_eq!(neg("application/vnd.kubernetes.protobuf,application/json").unwrap(), Output::Json);
        let e = neg("application/vnd.kubernetes.protobuf").unwrap_err();
        assert_eq!((e.code, e.status()["kind"].as_str()), (406, Some("Status")));
    }

    #[test]
    fn bodies_by_media_type() {
        assert_eq!(decode_body("application/json", br#"{"a":1}"#).unwrap(), json!({"a": 1}));
        let e = decode_body("application/vnd.kubernetes.protobuf", b"{}").unwrap_err();
        assert_eq!(e.code, 400);
        assert!(e.message.contains("does not appear to be a protobuf message"), "{}", e.message);
        assert_eq!(decode_body("application/cbor", b"").unwrap_err().code, 415);
    }
}
