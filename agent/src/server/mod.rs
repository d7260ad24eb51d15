//! The agent's HTTPS server (the kubelet port, 10250): what the API server proxies
//! `pods/log`, `pods/exec`, `pods/attach` and `pods/portforward` to, plus `/healthz`, `/pods`,
//! `/metrics`, `/metrics/resource` and `/stats/summary` ([`crate::stats`]).
//!
//! - TLS with the configured serving pair, or a self-signed one kept under the cert dir.
//! - Authentication: a client certificate signed by the client CA (what the API server's
//!   kubelet-client certificate is), or `Authorization: Bearer` checked with a TokenReview
//!   against the API server when a client is configured. Anything else is 401, every path
//!   included.
//! - Authorization ([`authz`]): in Webhook mode (the default with an API server) a
//!   SubjectAccessReview on `nodes/<subresource>` of this node decides each request (403
//!   otherwise), cached as upstream; AlwaysAllow serves every authenticated client.
//! - Logs are read from the CRI log files ([`logs`]); exec, attach and port-forward ask the
//!   runtime for a streaming URL (CRI Exec/Attach/PortForward) and either proxy the client's
//!   upgrade request to it, splicing both connections after the runtime answers 101, or, for
//!   WebSocket `v5.channel.k8s.io` and `SPDY/3.1+portforward.k8s.io`, terminate the WebSocket
//!   and talk SPDY/3.1 to the runtime themselves ([`stream`], [`wsbridge`], [`spdy`]).

pub mod authz;
pub mod logs;
pub mod spdy;
pub mod stream;
pub mod tls;
pub mod wsbridge;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::io::{Read as _, Seek as _};
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Full};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use logs::{Joiner, LogOptions, Writer};

/// The response body type of every handler.
pub type Body = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("certificate generation failed: {0}")]
    Cert(#[source] rcgen::Error),
    #[error("{0}")]
    Config(String),
    #[error("listen on {0}: {1}")]
    Listen(SocketAddr, #[source] std::io::Error),
}

/// A container as the server needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerRef {
    /// The runtime's container id.
    pub id: String,
    /// The CRI log file of the current attempt.
    pub log_path: PathBuf,
    /// The previous attempt's log (for ?previous=true).
    pub previous_log_path: Option<PathBuf>,
    pub running: bool,
}

/// What the server needs from the pod workers (the executor implements it; tests use a small
/// fake).
pub trait Lookup: Send + Sync + 'static {
    /// The pods bound to this node (`GET /pods`).
    fn pods(&self) -> Vec<Pod>;
    /// A container of a pod, by names.
    fn container(&self, namespace: &str, pod: &str, container: &str) -> Option<ContainerRef>;
    /// The pod's sandbox id (for port-forward).
    fn sandbox(&self, namespace: &str, pod: &str) -> Option<String>;
    /// The last stats of the claims' volumes (the kubelet_volume_stats_* metrics).
    fn volume_stats(&self) -> Vec<crate::csi::mounter::VolumeStats> {
        Vec::new()
    }
}

/// How the server is set up.
#[derive(Clone)]
pub struct ServerConfig {
    pub address: SocketAddr,
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
    /// PEM of the CA that signs clients (the caller's default: the kubeconfig's CA). `None`:
    /// no client certificate is accepted.
    pub client_ca_pem: Option<Vec<u8>>,
    /// Where the self-signed pair is kept (`agent.crt`/`agent.key`), e.g. `<root>/pki`.
    pub cert_dir: PathBuf,
    pub node_name: String,
    pub node_ips: Vec<IpAddr>,
    /// The CRI socket (exec, attach, port-forward).
    pub runtime_socket: PathBuf,
    /// For bearer tokens: TokenReview against the API server. `None`: tokens are refused.
    /// Also the SubjectAccessReviews of Webhook authorization.
    pub kube: Option<kube::Client>,
    pub authorization: authz::AuthzConfig,
    /// `/metrics/resource` and `/stats/summary`; `None`: not served (404).
    pub stats: Option<Arc<crate::stats::Provider>>,
}

/// Where a request goes. Pure function of method and path: [`route`].
#[derive(Debug, Clone, PartialEq)]
pub enum Route {
    Healthz,
    Pods,
    Metrics,
    MetricsResource,
    StatsSummary,
    ContainerLogs { namespace: String, pod: String, container: String },
    Exec { namespace: String, pod: String, container: String },
    Attach { namespace: String, pod: String, container: String },
    PortForward { namespace: String, pod: String },
    MethodNotAllowed,
    NotFound,
}

impl Route {
    /// The label of the request counter.
    pub fn name(&self) -> &'static str {
        match self {
            Route::Healthz => "healthz",
            Route::Pods => "pods",
            Route::Metrics => "metrics",
            Route::MetricsResource => "metrics/resource",
            Route::StatsSummary => "stats/summary",
            Route::ContainerLogs { .. } => "containerLogs",
            Route::Exec { .. } => "exec",
            Route::Attach { .. } => "attach",
            Route::PortForward { .. } => "portForward",
            Route::MethodNotAllowed | Route::NotFound => "other",
        }
    }
}

/// Routes a request by method and path.
pub fn route(method: &Method, path: &str) -> Route {
    let segs: Vec<&str> = path.trim_start_matches('/').trim_end_matches('/').split('/').collect();
    let read_only = method == Method::GET || method == Method::HEAD;
    let streaming = method == Method::GET || method == Method::POST;
    let s = |x: &str| x.to_string();
    let ok = |v: bool, r: Route| if v { r } else { Route::MethodNotAllowed };
    match segs.as_slice() {
        ["healthz"] => ok(read_only, Route::Healthz),
        ["pods"] => ok(read_only, Route::Pods),
        ["metrics"] => ok(read_only, Route::Metrics),
        ["metrics", "resource"] => ok(read_only, Route::MetricsResource),
        ["stats", "summary"] => ok(read_only, Route::StatsSummary),
        ["containerLogs", ns, pod, c] if ![ns, pod, c].iter().any(|x| x.is_empty()) => {
            ok(read_only, Route::ContainerLogs { namespace: s(ns), pod: s(pod), container: s(c) })
        }
        ["exec", ns, pod, c] if ![ns, pod, c].iter().any(|x| x.is_empty()) => {
            ok(streaming, Route::Exec { namespace: s(ns), pod: s(pod), container: s(c) })
        }
        ["attach", ns, pod, c] if ![ns, pod, c].iter().any(|x| x.is_empty()) => {
            ok(streaming, Route::Attach { namespace: s(ns), pod: s(pod), container: s(c) })
        }
        ["portForward", ns, pod] if !ns.is_empty() && !pod.is_empty() => {
            ok(streaming, Route::PortForward { namespace: s(ns), pod: s(pod) })
        }
        _ => Route::NotFound,
    }
}

/// Who made a request, once authenticated, and how.
#[derive(Debug, Clone, PartialEq)]
pub enum Identity {
    Certificate(authz::Subject),
    Token(authz::Subject),
}

impl Identity {
    fn subject(&self) -> &authz::Subject {
        match self {
            Identity::Certificate(s) | Identity::Token(s) => s,
        }
    }
}

/// Request counts by two labels (route and status code; route and stream protocol).
#[derive(Debug)]
pub(crate) struct Counters<L>(Mutex<BTreeMap<(&'static str, L), u64>>);

impl<L> Default for Counters<L> {
    fn default() -> Self {
        Counters(Mutex::new(BTreeMap::new()))
    }
}

impl<L: Ord + Clone> Counters<L> {
    fn add(&self, route: &'static str, label: L) {
        if let Ok(mut m) = self.0.lock() {
            *m.entry((route, label)).or_default() += 1;
        }
    }

    fn snapshot(&self) -> BTreeMap<(&'static str, L), u64> {
        self.0.lock().map(|m| m.clone()).unwrap_or_default()
    }
}

pub(crate) struct State {
    pub(crate) lookup: Arc<dyn Lookup>,
    pub(crate) runtime_socket: PathBuf,
    kube: Option<kube::Client>,
    authz: authz::Authorizer,
    counters: Counters<u16>,
    /// Upgraded exec/attach/port-forward sessions by route and protocol (see [`stream`]).
    pub(crate) streams: Counters<&'static str>,
    /// `/proc` (tests point it elsewhere).
    proc_root: PathBuf,
    stats: Option<Arc<crate::stats::Provider>>,
}

pub(crate) fn text(code: StatusCode, msg: impl Into<String>) -> Response<Body> {
    let mut body: String = msg.into();
    if !body.ends_with('\n') {
        body.push('\n');
    }
    let mut r = Response::new(full(body));
    *r.status_mut() = code;
    r.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static("text/plain; charset=utf-8"));
    r
}

pub(crate) fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).map_err(|never| match never {}).boxed()
}

/// A body fed from a channel: ends when the sender is dropped.
struct ChannelBody(mpsc::Receiver<Bytes>);

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        self.0.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b))))
    }
}

/// Binds `cfg.address` and serves until `shutdown` completes.
pub async fn serve(
    cfg: ServerConfig,
    lookup: Arc<dyn Lookup>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    let listener = TcpListener::bind(cfg.address).await.map_err(|e| ServerError::Listen(cfg.address, e))?;
    serve_on(listener, cfg, lookup, shutdown).await
}

/// Serves on an already bound listener (`cfg.address` is not used) until `shutdown`
/// completes; open connections are dropped then.
pub async fn serve_on(
    listener: TcpListener,
    cfg: ServerConfig,
    lookup: Arc<dyn Lookup>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    let sans = tls::sans(&cfg.node_name, &cfg.node_ips);
    let (cert, key) = tls::serving_pair(cfg.tls_cert_file.as_ref(), cfg.tls_key_file.as_ref(), &cfg.cert_dir, &sans)?;
    let tls_cfg = tls::server_config(&cert, &key, cfg.client_ca_pem.as_deref())?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls_cfg));
    let state = Arc::new(State {
        lookup,
        runtime_socket: cfg.runtime_socket.clone(),
        kube: cfg.kube.clone(),
        authz: authz::Authorizer::new(cfg.authorization.clone(), &cfg.node_name, cfg.kube.clone()),
        counters: Counters::default(),
        streams: Counters::default(),
        proc_root: PathBuf::from("/proc"),
        stats: cfg.stats.clone(),
    });
    if let Ok(a) = listener.local_addr() {
        tracing::info!(address = %a, "agent server listening");
    }
    let mut conns = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        while conns.try_join_next().is_some() {}
        let (tcp, peer) = tokio::select! {
            _ = &mut shutdown => break,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let acceptor = acceptor.clone();
        let state = state.clone();
        conns.spawn(async move {
            let tls = match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await {
                Ok(Ok(t)) => t,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "tls handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "tls handshake timed out");
                    return;
                }
            };
            let cert_user = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .map(|c| tls::cert_user(c).unwrap_or(authz::Subject { name: String::new(), groups: Vec::new() }));
            let cert_user = Arc::new(cert_user);
            let svc = hyper::service::service_fn(move |req| {
                let state = state.clone();
                let cert_user = cert_user.clone();
                async move { Ok::<_, Infallible>(handle(state, cert_user.as_ref().clone(), req).await) }
            });
            if let Err(e) =
                hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tls), svc).with_upgrades().await
            {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    tracing::info!("agent server stopped");
    Ok(())
}

async fn handle(state: Arc<State>, cert_user: Option<authz::Subject>, req: Request<Incoming>) -> Response<Body> {
    let r = route(req.method(), req.uri().path());
    let resp = match authenticate(&state, cert_user, req.headers()).await {
        None => text(StatusCode::UNAUTHORIZED, "Unauthorized"),
        Some(who) => {
            tracing::debug!(user = ?who, method = %req.method(), path = %req.uri().path(), "request");
            match state.authz.authorize(who.subject(), req.method(), req.uri().path()).await {
                Ok(()) => dispatch(&state, r.clone(), req).await,
                Err(authz::Denial::Forbidden(msg)) => text(StatusCode::FORBIDDEN, msg),
                Err(authz::Denial::Error(msg)) => text(StatusCode::INTERNAL_SERVER_ERROR, msg),
            }
        }
    };
    state.counters.add(r.name(), resp.status().as_u16());
    resp
}

/// The client's identity: its verified certificate, or a bearer token the API server accepts.
async fn authenticate(state: &State, cert_user: Option<authz::Subject>, headers: &http::HeaderMap) -> Option<Identity> {
    if let Some(u) = cert_user {
        return Some(Identity::Certificate(u));
    }
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())?;
    let client = state.kube.as_ref()?;
    token_review(client, token).await.map(Identity::Token)
}

/// TokenReview (authentication.k8s.io/v1): the user and groups when the API server
/// authenticates the token.
async fn token_review(client: &kube::Client, token: &str) -> Option<authz::Subject> {
    use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
    let api: kube::Api<TokenReview> = kube::Api::all(client.clone());
    let review = TokenReview {
        spec: TokenReviewSpec { token: Some(token.to_string()), ..Default::default() },
        ..Default::default()
    };
    let pp = kube::api::PostParams::default();
    let created = tokio::time::timeout(Duration::from_secs(10), api.create(&pp, &review));
    match created.await {
        Ok(Ok(r)) => {
            let st = r.status?;
            (st.authenticated == Some(true)).then(|| {
                let user = st.user.unwrap_or_default();
                authz::Subject { name: user.username.unwrap_or_default(), groups: user.groups.unwrap_or_default() }
            })
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "TokenReview failed");
            None
        }
        Err(_) => {
            tracing::warn!("TokenReview timed out");
            None
        }
    }
}

async fn dispatch(state: &Arc<State>, r: Route, req: Request<Incoming>) -> Response<Body> {
    match r {
        Route::Healthz => text(StatusCode::OK, "ok"),
        Route::Pods => {
            let list = serde_json::json!({
                "kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": state.lookup.pods(),
            });
            let mut resp = Response::new(full(list.to_string()));
            resp.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/json"));
            resp
        }
        Route::Metrics => {
            let mut resp = Response::new(full(metrics_text(state)));
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            resp
        }
        Route::MetricsResource => resource_stats(state, true, req.uri().query()).await,
        Route::StatsSummary => resource_stats(state, false, req.uri().query()).await,
        Route::ContainerLogs { namespace, pod, container } => {
            container_logs(state.clone(), &namespace, &pod, &container, req.uri().query()).await
        }
        Route::Exec { namespace, pod, container } => {
            stream::exec(state, stream::Kind::Exec, &namespace, &pod, &container, req).await
        }
        Route::Attach { namespace, pod, container } => {
            stream::exec(state, stream::Kind::Attach, &namespace, &pod, &container, req).await
        }
        Route::PortForward { namespace, pod } => stream::port_forward(state, &namespace, &pod, req).await,
        Route::MethodNotAllowed => text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed"),
        Route::NotFound => text(StatusCode::NOT_FOUND, "404 page not found"),
    }
}

/// `/metrics/resource` (Prometheus text, `prometheus`) or `/stats/summary` (JSON;
/// `only_cpu_and_memory=true` leaves out network, file systems and volumes) from one
/// collection.
async fn resource_stats(state: &State, prometheus: bool, query: Option<&str>) -> Response<Body> {
    let Some(provider) = state.stats.as_ref() else {
        return text(StatusCode::NOT_FOUND, "404 page not found");
    };
    let summary = provider.collect(&state.lookup.pods(), &state.lookup.volume_stats()).await;
    let (body, content_type) = if prometheus {
        (crate::stats::render::resource_metrics(&summary), "text/plain; version=0.0.4; charset=utf-8")
    } else {
        let only = query
            .map(|q| form_urlencoded::parse(q.as_bytes()).any(|(k, v)| k == "only_cpu_and_memory" && v == "true"))
            .unwrap_or(false);
        (crate::stats::render::summary(&summary, only).to_string(), "application/json")
    };
    let mut resp = Response::new(full(body));
    resp.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static(content_type));
    resp
}

/// The answer when a pod's container is unknown: which of the two is missing, in upstream's
/// words.
pub(crate) fn not_found(state: &State, namespace: &str, pod: &str, container: &str) -> Response<Body> {
    let pods = state.lookup.pods();
    let pod_known = pods.iter().any(|p| {
        p.metadata.namespace.as_deref() == Some(namespace) && p.metadata.name.as_deref() == Some(pod)
    }) || state.lookup.sandbox(namespace, pod).is_some();
    if pod_known {
        text(StatusCode::NOT_FOUND, format!("container {container:?} in pod {pod:?} is not available"))
    } else {
        text(StatusCode::NOT_FOUND, format!("pod {pod:?} not found"))
    }
}

fn rss_bytes(proc_root: &Path) -> Option<u64> {
    let status = std::fs::read_to_string(proc_root.join("self/status")).ok()?;
    let kb: u64 = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kb * 1024)
}

/// Upstream's kubelet_volume_stats_* gauges, labelled by the claim.
fn volume_metrics(s: &mut String, stats: &[crate::csi::mounter::VolumeStats]) {
    use std::fmt::Write as _;
    type Get = fn(&crate::csi::mounter::VolumeStats) -> i64;
    let gauges: [(&str, &str, Get); 6] = [
        ("kubelet_volume_stats_capacity_bytes", "Capacity in bytes of the volume", |v| v.capacity_bytes),
        ("kubelet_volume_stats_available_bytes", "Number of available bytes in the volume", |v| v.available_bytes),
        ("kubelet_volume_stats_used_bytes", "Number of used bytes in the volume", |v| v.used_bytes),
        ("kubelet_volume_stats_inodes", "Maximum number of inodes in the volume", |v| v.inodes),
        ("kubelet_volume_stats_inodes_free", "Number of free inodes in the volume", |v| v.inodes_free),
        ("kubelet_volume_stats_inodes_used", "Number of used inodes in the volume", |v| v.inodes_used),
    ];
    if stats.is_empty() {
        return;
    }
    for (name, help, get) in gauges {
        let _ = writeln!(s, "# HELP {name} {help}");
        let _ = writeln!(s, "# TYPE {name} gauge");
        for v in stats {
            let _ = writeln!(s, "{name}{{namespace=\"{}\",persistentvolumeclaim=\"{}\"}} {}", v.namespace, v.claim, get(v));
        }
    }
    let _ = writeln!(s, "# HELP kubelet_volume_stats_health_status_abnormal Abnormal volume health status (1 abnormal, 0 normal)");
    let _ = writeln!(s, "# TYPE kubelet_volume_stats_health_status_abnormal gauge");
    for v in stats.iter().filter(|v| v.abnormal.is_some()) {
        let _ = writeln!(
            s,
            "kubelet_volume_stats_health_status_abnormal{{namespace=\"{}\",persistentvolumeclaim=\"{}\"}} {}",
            v.namespace,
            v.claim,
            u8::from(v.abnormal == Some(true))
        );
    }
}

/// Prometheus text: pods and running containers (as the pod workers report them), request
/// counts, the process's resident memory.
fn metrics_text(state: &State) -> String {
    use std::fmt::Write as _;
    let pods = state.lookup.pods();
    let running = pods
        .iter()
        .filter_map(|p| p.status.as_ref()?.container_statuses.as_ref())
        .flatten()
        .filter(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
        .count();
    let mut s = String::new();
    let _ = writeln!(s, "# HELP ferro_agent_pods Pods on this node, as the pod workers know them.");
    let _ = writeln!(s, "# TYPE ferro_agent_pods gauge");
    let _ = writeln!(s, "ferro_agent_pods {}", pods.len());
    let _ = writeln!(s, "# HELP ferro_agent_running_containers Containers whose reported state is running.");
    let _ = writeln!(s, "# TYPE ferro_agent_running_containers gauge");
    let _ = writeln!(s, "ferro_agent_running_containers {running}");
    let _ = writeln!(s, "# HELP ferro_agent_server_requests_total Requests served, by route and status code.");
    let _ = writeln!(s, "# TYPE ferro_agent_server_requests_total counter");
    for ((route, code), n) in state.counters.snapshot() {
        let _ = writeln!(s, "ferro_agent_server_requests_total{{path=\"{route}\",code=\"{code}\"}} {n}");
    }
    let _ = writeln!(
        s,
        "# HELP ferro_agent_stream_requests_total Upgraded exec, attach and port-forward sessions, by route and protocol."
    );
    let _ = writeln!(s, "# TYPE ferro_agent_stream_requests_total counter");
    for ((route, protocol), n) in state.streams.snapshot() {
        let _ = writeln!(s, "ferro_agent_stream_requests_total{{path=\"{route}\",protocol=\"{protocol}\"}} {n}");
    }
    volume_metrics(&mut s, &state.lookup.volume_stats());
    if let Some(rss) = rss_bytes(&state.proc_root) {
        let _ = writeln!(s, "# HELP process_resident_memory_bytes Resident memory size in bytes.");
        let _ = writeln!(s, "# TYPE process_resident_memory_bytes gauge");
        let _ = writeln!(s, "process_resident_memory_bytes {rss}");
    }
    s
}

/// Opens a log file; a missing file reads as empty (the runtime creates it lazily).
fn open_log(path: &Path) -> std::io::Result<Option<std::fs::File>> {
    match std::fs::File::open(path) {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

async fn container_logs(
    state: Arc<State>,
    namespace: &str,
    pod: &str,
    container: &str,
    query: Option<&str>,
) -> Response<Body> {
    let opts = match LogOptions::parse(query, jiff::Timestamp::now()) {
        Ok(o) => o,
        Err(m) => return text(StatusCode::BAD_REQUEST, m),
    };
    let Some(c) = state.lookup.container(namespace, pod, container) else {
        return not_found(&state, namespace, pod, container);
    };
    let path = if opts.previous {
        match c.previous_log_path.clone() {
            Some(p) => p,
            None => {
                return text(
                    StatusCode::BAD_REQUEST,
                    format!("previous terminated container {container:?} in pod {pod:?} not found"),
                )
            }
        }
    } else {
        c.log_path.clone()
    };
    let initial = {
        let path = path.clone();
        tokio::task::spawn_blocking(move || -> std::io::Result<(Option<std::fs::File>, Vec<u8>)> {
            let mut f = open_log(&path)?;
            let mut data = Vec::new();
            if let Some(f) = f.as_mut() {
                f.read_to_end(&mut data)?;
            }
            Ok((f, data))
        })
        .await
    };
    let (file, data) = match initial {
        Ok(Ok(x)) => x,
        Ok(Err(e)) => return text(StatusCode::INTERNAL_SERVER_ERROR, format!("failed to read log {}: {e}", path.display())),
        Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let mut joiner = Joiner::default();
    let mut writer = Writer::new(&opts);
    let first = writer.render(&logs::tail(joiner.push(&data), opts.tail_lines));
    let mut resp = if !opts.follow || opts.previous || writer.done() {
        Response::new(full(first))
    } else {
        let (tx, rx) = mpsc::channel::<Bytes>(16);
        let ids = (namespace.to_string(), pod.to_string(), container.to_string());
        tokio::spawn(async move {
            if !first.is_empty() && tx.send(Bytes::from(first)).await.is_err() {
                return;
            }
            follow(state, ids, c.id, path, file, joiner, writer, tx).await;
        });
        Response::new(ChannelBody(rx).boxed())
    };
    resp.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static("text/plain"));
    resp
}

/// Keeps reading the log file as it grows (and reopens it when the runtime replaced it) until
/// the client goes away, the byte limit is reached, or the container stopped and everything
/// it wrote was sent.
#[allow(clippy::too_many_arguments)]
async fn follow(
    state: Arc<State>,
    (namespace, pod, container): (String, String, String),
    id: String,
    path: PathBuf,
    mut file: Option<std::fs::File>,
    mut joiner: Joiner,
    mut writer: Writer,
    tx: mpsc::Sender<Bytes>,
) {
    let mut idle = 0u32;
    loop {
        tokio::select! {
            _ = tx.closed() => return,
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
        // Whether the container is done is checked before reading, so the last read sees
        // everything it wrote.
        let stopped = idle >= 5 && {
            idle = 0;
            !state.lookup.container(&namespace, &pod, &container).is_some_and(|c| c.running && c.id == id)
        };
        let p = path.clone();
        let read = tokio::task::spawn_blocking(move || -> (Option<std::fs::File>, Vec<u8>, bool) {
            let mut data = Vec::new();
            let mut rotated = false;
            if let Some(f) = file.as_mut() {
                let _ = f.read_to_end(&mut data);
                let pos = f.stream_position().unwrap_or(0);
                // Replaced (another inode) or truncated (shorter than what was read): reopen.
                let same = match (f.metadata(), std::fs::metadata(&p)) {
                    (Ok(a), Ok(b)) => a.ino() == b.ino() && a.dev() == b.dev() && b.len() >= pos,
                    (_, Err(_)) => true,
                    _ => false,
                };
                if !same {
                    file = None;
                    rotated = true;
                }
            }
            if file.is_none() {
                if let Ok(Some(mut f)) = open_log(&p) {
                    let _ = f.read_to_end(&mut data);
                    file = Some(f);
                }
            }
            (file, data, rotated)
        })
        .await;
        let Ok((f, data, rotated)) = read else { return };
        file = f;
        if rotated {
            joiner.reset();
        }
        if data.is_empty() {
            idle += 1;
        } else {
            idle = 0;
            let out = writer.render(&joiner.push(&data));
            if !out.is_empty() && tx.send(Bytes::from(out)).await.is_err() {
                return;
            }
            if writer.done() {
                return;
            }
        }
        if stopped && data.is_empty() {
            return;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn volume_stats_metrics() {
        use crate::csi::mounter::VolumeStats;
        let mut s = String::new();
        volume_metrics(&mut s, &[]);
        assert_eq!(s, "", "no claims, no volume gauges");
        let v = VolumeStats {
            namespace: "db".into(),
            claim: "data".into(),
            capacity_bytes: 100,
            available_bytes: 60,
            used_bytes: 40,
            inodes: 10,
            inodes_free: 7,
            inodes_used: 3,
            abnormal: Some(false),
        };
        volume_metrics(&mut s, &[v.clone(), VolumeStats { claim: "logs".into(), abnormal: None, ..v }]);
        for line in [
            "kubelet_volume_stats_capacity_bytes{namespace=\"db\",persistentvolumeclaim=\"data\"} 100\n",
            "kubelet_volume_stats_available_bytes{namespace=\"db\",persistentvolumeclaim=\"data\"} 60\n",
            "kubelet_volume_stats_used_bytes{namespace=\"db\",persistentvolumeclaim=\"logs\"} 40\n",
            "kubelet_volume_stats_inodes_free{namespace=\"db\",persistentvolumeclaim=\"data\"} 7\n",
            "kubelet_volume_stats_health_status_abnormal{namespace=\"db\",persistentvolumeclaim=\"data\"} 0\n",
            "# TYPE kubelet_volume_stats_inodes_used gauge\n",
        ] {
            assert!(s.contains(line), "{line} missing from\n{s}");
        }
        assert!(!s.contains("health_status_abnormal{namespace=\"db\",persistentvolumeclaim=\"logs\"}"), "no condition, no health gauge");
    }

    #[test]
    fn routes() {
        let get = Method::GET;
        assert_eq!(route(&get, "/healthz"), Route::Healthz);
        assert_eq!(route(&get, "/pods/"), Route::Pods);
        assert_eq!(route(&get, "/metrics"), Route::Metrics);
        assert_eq!(route(&get, "/metrics/resource"), Route::MetricsResource);
        assert_eq!(route(&get, "/stats/summary/"), Route::StatsSummary);
        assert_eq!(route(&get, "/stats"), Route::NotFound);
        assert_eq!(route(&Method::POST, "/stats/summary"), Route::MethodNotAllowed);
        assert_eq!(
            route(&get, "/containerLogs/ns/p/c"),
            Route::ContainerLogs { namespace: "ns".into(), pod: "p".into(), container: "c".into() }
        );
        assert_eq!(
            route(&Method::POST, "/exec/ns/p/c"),
            Route::Exec { namespace: "ns".into(), pod: "p".into(), container: "c".into() }
        );
        assert_eq!(
            route(&get, "/attach/ns/p/c"),
            Route::Attach { namespace: "ns".into(), pod: "p".into(), container: "c".into() }
        );
        assert_eq!(route(&get, "/portForward/ns/p"), Route::PortForward { namespace: "ns".into(), pod: "p".into() });
        assert_eq!(route(&get, "/containerLogs/ns/p"), Route::NotFound);
        assert_eq!(route(&get, "/containerLogs/ns//c"), Route::NotFound);
        assert_eq!(route(&get, "/exec/ns/p/c/d"), Route::NotFound);
        assert_eq!(route(&get, "/"), Route::NotFound);
        assert_eq!(route(&Method::POST, "/containerLogs/ns/p/c"), Route::MethodNotAllowed);
        assert_eq!(route(&Method::DELETE, "/exec/ns/p/c"), Route::MethodNotAllowed);
    }

    struct NoPods;
    impl Lookup for NoPods {
        fn pods(&self) -> Vec<Pod> {
            Vec::new()
        }
        fn container(&self, _: &str, _: &str, _: &str) -> Option<ContainerRef> {
            None
        }
        fn sandbox(&self, _: &str, _: &str) -> Option<String> {
            None
        }
    }

    /// Trusts any server certificate (the API server does the same with agents).
    #[derive(Debug)]
    struct AnyServer(Arc<rustls::crypto::CryptoProvider>);

    impl rustls::client::danger::ServerCertVerifier for AnyServer {
        fn verify_server_cert(
            &self,
            _: &rustls::pki_types::CertificateDer<'_>,
            _: &[rustls::pki_types::CertificateDer<'_>],
            _: &rustls::pki_types::ServerName<'_>,
            _: &[u8],
            _: rustls::pki_types::UnixTime,
        ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        }
        fn verify_tls12_signature(
            &self,
            m: &[u8],
            c: &rustls::pki_types::CertificateDer<'_>,
            d: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(m, c, d, &self.0.signature_verification_algorithms)
        }
        fn verify_tls13_signature(
            &self,
            m: &[u8],
            c: &rustls::pki_types::CertificateDer<'_>,
            d: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(m, c, d, &self.0.signature_verification_algorithms)
        }
        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }

    /// GET `path` over TLS, optionally with a client pair; returns (status, body).
    async fn get(port: u16, path: &str, client: Option<(&str, &str)>, bearer: Option<&str>) -> (u16, String) {
        try_get(port, path, client, bearer).await.unwrap()
    }

    /// `None` when the connection fails (handshake refused).
    async fn try_get(port: u16, path: &str, client: Option<(&str, &str)>, bearer: Option<&str>) -> Option<(u16, String)> {
        use rustls::pki_types::pem::PemObject as _;
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let b = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyServer(provider)));
        let cfg = match client {
            Some((c, k)) => b
                .with_client_auth_cert(
                    vec![rustls::pki_types::CertificateDer::from_pem_slice(c.as_bytes()).unwrap()],
                    rustls::pki_types::PrivateKeyDer::from_pem_slice(k.as_bytes()).unwrap(),
                )
                .unwrap(),
            None => b.with_no_client_auth(),
        };
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let mut tls = tokio_rustls::TlsConnector::from(Arc::new(cfg)).connect(name, tcp).await.ok()?;
        let auth = bearer.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
        let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Connection: close\r\n\r\n");
        tls.write_all(req.as_bytes()).await.ok()?;
        let mut out = Vec::new();
        let _ = tls.read_to_end(&mut out).await;
        let text = String::from_utf8(out).ok()?;
        let code = text.get(9..12)?.parse().ok()?;
        let body = text.split_once("\r\n\r\n")?.1.to_string();
        Some((code, body))
    }

    /// A kube client whose API server knows one token (`good-token` of user alice) and
    /// answers every TokenReview.
    fn token_reviewer() -> kube::Client {
        let svc = tower::service_fn(|req: http::Request<kube::client::Body>| async move {
            assert_eq!(req.uri().path(), "/apis/authentication.k8s.io/v1/tokenreviews");
            let body = req.into_body().collect().await.unwrap().to_bytes();
            let review: serde_json::Value = serde_json::from_slice(&body).unwrap();
            let ok = review["spec"]["token"] == "good-token";
            let mut out = review.clone();
            out["status"] = if ok {
                serde_json::json!({"authenticated": true, "user": {"username": "alice"}})
            } else {
                serde_json::json!({"authenticated": false})
            };
            let resp = http::Response::builder()
                .status(201)
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(out.to_string())))
                .unwrap();
            Ok::<_, Infallible>(resp)
        });
        kube::Client::new(svc, "default")
    }

    #[tokio::test]
    async fn bearer_tokens_go_through_token_review() {
        let dir = tempfile::tempdir().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let cfg = ServerConfig {
            address: listener.local_addr().unwrap(),
            tls_cert_file: None,
            tls_key_file: None,
            client_ca_pem: None,
            cert_dir: dir.path().join("pki"),
            node_name: "node-a".into(),
            node_ips: vec![],
            runtime_socket: dir.path().join("none.sock"),
            kube: Some(token_reviewer()),
            authorization: authz::AuthzConfig::default(),
            stats: None,
        };
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_on(listener, cfg, Arc::new(NoPods), async move {
            let _ = rx.await;
        }));
        assert_eq!(get(port, "/healthz", None, Some("good-token")).await, (200, "ok\n".into()));
        assert_eq!(get(port, "/healthz", None, Some("bad-token")).await.0, 401);
        assert_eq!(get(port, "/healthz", None, None).await.0, 401);
        tx.send(()).unwrap();
        server.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn only_clients_of_the_ca_are_served() {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name.push(DnType::CommonName, "test-ca");
        let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
        let issuer = Issuer::from_ca_cert_pem(&ca_pem, &ca_key).unwrap();
        let client = |cn: &str, issuer: &Issuer<'_, &KeyPair>| {
            let key = KeyPair::generate().unwrap();
            let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
            p.distinguished_name.push(DnType::CommonName, cn);
            p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
            (p.signed_by(&key, issuer).unwrap().pem(), key.serialize_pem())
        };
        let (good_c, good_k) = client("kube-apiserver-kubelet-client", &issuer);
        // Same name, another CA: refused at the TLS layer.
        let other_key = KeyPair::generate().unwrap();
        let other_pem = ca.self_signed(&other_key).unwrap().pem();
        let other = Issuer::from_ca_cert_pem(&other_pem, &other_key).unwrap();
        let (bad_c, bad_k) = client("kube-apiserver-kubelet-client", &other);

        let dir = tempfile::tempdir().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let cfg = ServerConfig {
            address: listener.local_addr().unwrap(),
            tls_cert_file: None,
            tls_key_file: None,
            client_ca_pem: Some(ca_pem.into_bytes()),
            cert_dir: dir.path().join("pki"),
            node_name: "node-a".into(),
            node_ips: vec![],
            runtime_socket: dir.path().join("none.sock"),
            kube: None,
            authorization: authz::AuthzConfig::default(),
            stats: None,
        };
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_on(listener, cfg, Arc::new(NoPods), async move {
            let _ = rx.await;
        }));
        let good = Some((good_c.as_str(), good_k.as_str()));

        assert_eq!(get(port, "/healthz", None, None).await, (401, "Unauthorized\n".into()));
        assert_eq!(get(port, "/pods", None, Some("some-token")).await.0, 401, "no TokenReview configured");
        assert_eq!(get(port, "/healthz", good, None).await, (200, "ok\n".into()));
        let (code, pods) = get(port, "/pods", good, None).await;
        assert_eq!((code, pods.as_str()), (200, r#"{"apiVersion":"v1","items":[],"kind":"PodList","metadata":{}}"#));
        assert_eq!(get(port, "/containerLogs/ns/p/c", good, None).await, (404, "pod \"p\" not found\n".into()));
        assert_eq!(get(port, "/containerLogs/ns/p/c?tailLines=x", good, None).await.0, 400);
        assert_eq!(get(port, "/exec/ns/p/c?command=ls", good, None).await.0, 400);
        assert_eq!(get(port, "/nothing", good, None).await.0, 404);
        assert!(dir.path().join("pki").join(tls::CERT_FILE).exists());
        // A certificate from another CA does not get through the handshake.
        assert_eq!(try_get(port, "/healthz", Some((&bad_c, &bad_k)), None).await, None);
        let (_, metrics) = get(port, "/metrics", good, None).await;
        assert!(metrics.contains("ferro_agent_server_requests_total{path=\"healthz\",code=\"401\"} 1\n"), "{metrics}");
        assert!(metrics.contains("ferro_agent_pods 0\n"), "{metrics}");
        tx.send(()).unwrap();
        server.await.unwrap().unwrap();
    }

    /// One container whose log and state the test changes.
    struct OneContainer(Mutex<ContainerRef>);
    impl Lookup for OneContainer {
        fn pods(&self) -> Vec<Pod> {
            Vec::new()
        }
        fn container(&self, _: &str, _: &str, c: &str) -> Option<ContainerRef> {
            (c == "c").then(|| self.0.lock().unwrap().clone())
        }
        fn sandbox(&self, _: &str, _: &str) -> Option<String> {
            None
        }
    }

    fn state(lookup: Arc<dyn Lookup>) -> Arc<State> {
        Arc::new(State {
            lookup,
            runtime_socket: PathBuf::from("/nonexistent"),
            kube: None,
            authz: authz::Authorizer::new(authz::AuthzConfig::default(), "node-a", None),
            counters: Counters::default(),
        streams: Counters::default(),
            proc_root: PathBuf::from("/proc"),
            stats: None,
        })
    }

    async fn next_chunk(body: &mut Body) -> Option<String> {
        let frame = tokio::time::timeout(Duration::from_secs(10), body.frame()).await.unwrap()?.unwrap();
        Some(String::from_utf8(frame.into_data().unwrap().to_vec()).unwrap())
    }

    fn append(path: &Path, text: &str) {
        use std::io::Write as _;
        std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap().write_all(text.as_bytes()).unwrap();
    }

    #[tokio::test]
    async fn follow_reads_growth_rotation_and_truncation_then_ends_with_the_container() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("0.log");
        append(&log, "2026-11-22T00:00:01Z stdout F one\n2026-11-22T00:00:02Z stdout P t\n");
        let c = ContainerRef { id: "id1".into(), log_path: log.clone(), previous_log_path: None, running: true };
        let lookup = Arc::new(OneContainer(Mutex::new(c)));
        let st = state(lookup.clone());
        let resp = container_logs(st.clone(), "ns", "p", "c", Some("follow=true&timestamps=false")).await;
        assert_eq!(resp.status(), 200);
        let mut body = resp.into_body();
        assert_eq!(next_chunk(&mut body).await.as_deref(), Some("one\n"));
        append(&log, "2026-11-22T00:00:03Z stdout F wo\n");
        assert_eq!(next_chunk(&mut body).await.as_deref(), Some("two\n"));
        // Rotation: the runtime renames the file and starts a new one.
        std::fs::rename(&log, dir.path().join("0.log.1")).unwrap();
        append(&log, "2026-11-22T00:00:04Z stderr F three\n");
        assert_eq!(next_chunk(&mut body).await.as_deref(), Some("three\n"));
        // Truncation in place (copytruncate): read again from the start.
        std::fs::write(&log, "").unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        append(&log, "2026-11-22T00:00:05Z stdout F four\n");
        assert_eq!(next_chunk(&mut body).await.as_deref(), Some("four\n"));
        // The container stops: the stream ends.
        lookup.0.lock().unwrap().running = false;
        assert_eq!(next_chunk(&mut body).await, None);

        // limitBytes ends a follow too; previous without a previous log is a 400.
        let resp = container_logs(st.clone(), "ns", "p", "c", Some("follow=true&limitBytes=2")).await;
        let mut body = resp.into_body();
        assert_eq!(next_chunk(&mut body).await.as_deref(), Some("fo"));
        assert_eq!(next_chunk(&mut body).await, None);
        let resp = container_logs(st.clone(), "ns", "p", "c", Some("previous=true")).await;
        assert_eq!(resp.status(), 400);
        let resp = container_logs(st, "ns", "p", "x", None).await;
        assert_eq!(resp.status(), 404);
    }

    #[test]
    fn rss_from_proc_status() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("self")).unwrap();
        std::fs::write(dir.path().join("self/status"), "Name:\tx\nVmRSS:\t    1234 kB\n").unwrap();
        assert_eq!(rss_bytes(dir.path()), Some(1234 * 1024));
        assert!(rss_bytes(Path::new("/proc")).unwrap() > 0);
    }
}
