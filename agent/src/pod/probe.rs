//! Container probes: the pure state machine of one probe ([`ProbeState`]), one probe run
//! ([`run_probe`]: exec, httpGet, tcpSocket, grpc) and the [`ProbeManager`] that runs one tokio
//! task per (container, probe kind) and publishes [`ProbeResults`] for the pod worker.
//!
//! Upstream behaviour kept: readiness starts failed, liveness starts succeeded, startup starts
//! unknown and gates liveness and readiness; a liveness or startup failure past
//! failureThreshold stops that worker until the container changes; httpGet succeeds on
//! 200..=399, follows redirects on the same host (up to 10) and takes a redirect to another
//! host as success; HTTPS certificates are not verified; the User-Agent is "kube-probe/1.33".

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::clock::Clock;

use http::header::{HeaderName, HeaderValue, ACCEPT, HOST, LOCATION, USER_AGENT};
use http::{HeaderMap, Uri};
use http_body_util::Empty;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::{Container, ContainerPort, ExecAction, GRPCAction, HTTPGetAction, Pod, Probe, TCPSocketAction};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tracing::Instrument;

use super::model::{is_sidecar, ProbeResults};

/// The User-Agent of httpGet probes (and the gRPC probe's), as upstream kubelet 1.33 sends it.
pub const PROBE_USER_AGENT: &str = "kube-probe/1.33";
/// The User-Agent of httpGet lifecycle hooks.
pub const LIFECYCLE_USER_AGENT: &str = "kube-lifecycle/1.33";
/// Redirects an httpGet probe follows on the same host before it fails.
const MAX_REDIRECTS: usize = 10;
const HEALTH_CHECK_PATH: &str = "/grpc.health.v1.Health/Check";

/// A boxed, sendable future (the shape of `futures::future::BoxFuture`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProbeKind {
    Liveness,
    Readiness,
    Startup,
}

impl ProbeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProbeKind::Liveness => "liveness",
            ProbeKind::Readiness => "readiness",
            ProbeKind::Startup => "startup",
        }
    }

    /// The container's probe of this kind.
    pub fn probe_of(self, c: &Container) -> Option<&Probe> {
        match self {
            ProbeKind::Liveness => c.liveness_probe.as_ref(),
            ProbeKind::Readiness => c.readiness_probe.as_ref(),
            ProbeKind::Startup => c.startup_probe.as_ref(),
        }
    }
}

/// The result of one probe run; a failure carries the message upstream would record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Success,
    Failure(String),
}

/// Where handlers act: the pod IP (httpGet/tcpSocket/grpc default host), the container's ports
/// (for named ports), and the container to exec in.
#[derive(Debug, Clone, Default)]
pub struct Target {
    pub pod_ip: Option<String>,
    pub container_id: String,
    pub ports: Vec<ContainerPort>,
}

/// Exec inside a container (the executor implements it with CRI ExecSync). Ok carries the exit
/// code and the combined output; Err a failure to run the command at all (or a timeout).
pub trait Exec: Send + Sync + 'static {
    fn exec_sync(&self, container_id: &str, cmd: Vec<String>, timeout: Duration) -> BoxFuture<'static, Result<(i32, Vec<u8>), String>>;
}

fn seconds(v: Option<i32>, default: i32, min: i32) -> Duration {
    Duration::from_secs(u64::try_from(v.unwrap_or(default).max(min)).unwrap_or(0))
}

/// The state of one probe of one container: consecutive results counted against
/// successThreshold/failureThreshold, as upstream's prober worker does. Pure.
#[derive(Debug, Clone)]
pub struct ProbeState {
    kind: ProbeKind,
    success_threshold: u32,
    failure_threshold: u32,
    period: Duration,
    initial_delay: Duration,
    timeout: Duration,
    /// The published result; None is "unknown" (startup before its verdict).
    result: Option<bool>,
    /// The last raw outcome and how many times in a row it came.
    last: Option<bool>,
    run: u32,
}

impl ProbeState {
    /// Initial result: readiness failed, liveness succeeded, startup unknown (`result()` false,
    /// `failed()` false): a container with a startup probe has not started until it succeeds.
    pub fn new(kind: ProbeKind, probe: &Probe) -> Self {
        let threshold = |v: Option<i32>, default: u32| v.and_then(|v| u32::try_from(v).ok()).filter(|v| *v > 0).unwrap_or(default);
        ProbeState {
            kind,
            // The API allows only 1 for liveness and startup; take it as validated.
            success_threshold: threshold(probe.success_threshold, 1),
            failure_threshold: threshold(probe.failure_threshold, 3),
            period: seconds(probe.period_seconds, 10, 1),
            initial_delay: seconds(probe.initial_delay_seconds, 0, 0),
            timeout: seconds(probe.timeout_seconds, 1, 1),
            result: match kind {
                ProbeKind::Readiness => Some(false),
                ProbeKind::Liveness => Some(true),
                ProbeKind::Startup => None,
            },
            last: None,
            run: 0,
        }
    }

    /// Counts one outcome; true when the published result changed (including unknown to known).
    pub fn record(&mut self, outcome: &Outcome) -> bool {
        let ok = *outcome == Outcome::Success;
        if self.last == Some(ok) {
            self.run = self.run.saturating_add(1);
        } else {
            self.last = Some(ok);
            self.run = 1;
        }
        let threshold = if ok { self.success_threshold } else { self.failure_threshold };
        if self.run < threshold {
            return false;
        }
        let flipped = self.result != Some(ok);
        self.result = Some(ok);
        flipped
    }

    /// The published result (unknown counts as false).
    pub fn result(&self) -> bool {
        self.result.unwrap_or(false)
    }

    /// The published result, None while unknown.
    pub fn known(&self) -> Option<bool> {
        self.result
    }

    /// A liveness or startup probe that failed failureThreshold times in a row: the container is
    /// to be restarted.
    pub fn failed(&self) -> bool {
        self.kind != ProbeKind::Readiness && self.result == Some(false)
    }

    pub fn kind(&self) -> ProbeKind {
        self.kind
    }

    /// Whether the probe runs yet, `since_start` after the container started (initialDelaySeconds).
    pub fn should_probe(&self, since_start: Duration) -> bool {
        since_start >= self.initial_delay
    }

    pub fn period(&self) -> Duration {
        self.period
    }

    pub fn initial_delay(&self) -> Duration {
        self.initial_delay
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

/// A probe or hook port: a number, or the name of one of the container's ports (or a number
/// written as a string, as upstream accepts).
pub fn resolve_port(port: &IntOrString, ports: &[ContainerPort]) -> Result<u16, String> {
    let n = match port {
        IntOrString::Int(n) => *n,
        IntOrString::String(s) => match ports.iter().find(|p| p.name.as_deref() == Some(s.as_str())) {
            Some(p) => p.container_port,
            None => s.parse::<i32>().map_err(|_| format!("couldn't find port: {s}"))?,
        },
    };
    u16::try_from(n).ok().filter(|p| *p > 0).ok_or_else(|| format!("invalid port number: {n}"))
}

/// `host:port` with brackets around an IPv6 address.
fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// One probe run with its timeoutSeconds.
pub async fn run_probe(probe: &Probe, target: &Target, exec: &dyn Exec) -> Outcome {
    let timeout = seconds(probe.timeout_seconds, 1, 1);
    if let Some(e) = &probe.exec {
        exec_probe(e, target, exec, timeout).await
    } else if let Some(h) = &probe.http_get {
        match tokio::time::timeout(timeout, http_get(h, target, PROBE_USER_AGENT)).await {
            Ok(Ok(r)) if (200..400).contains(&r.status) => Outcome::Success,
            Ok(Ok(r)) => Outcome::Failure(format!("HTTP probe failed with statuscode: {}", r.status)),
            Ok(Err(e)) => Outcome::Failure(e),
            Err(_) => Outcome::Failure(format!("Get \"{}\": timeout after {timeout:?} awaiting headers", describe_url(h, target))),
        }
    } else if let Some(t) = &probe.tcp_socket {
        tcp_probe(t, target, timeout).await
    } else if let Some(g) = &probe.grpc {
        grpc_probe(g, target, timeout).await
    } else {
        Outcome::Failure("probe has no handler".to_string())
    }
}

/// Why an exec in a container gave no exit code.
enum ExecFailure {
    /// The command could not be run (no command, a runtime error).
    Error(String),
    /// It did not finish within the timeout.
    Timeout(String),
}

async fn exec_once(action: &ExecAction, target: &Target, exec: &dyn Exec, timeout: Duration) -> Result<(i32, String), ExecFailure> {
    let cmd = action.command.clone().unwrap_or_default();
    if cmd.is_empty() {
        return Err(ExecFailure::Error("exec action has no command".to_string()));
    }
    let run = exec.exec_sync(&target.container_id, cmd.clone(), timeout);
    match tokio::time::timeout(timeout, run).await {
        Ok(Ok((code, out))) => Ok((code, String::from_utf8_lossy(&out).into_owned())),
        Ok(Err(e)) => Err(ExecFailure::Error(e)),
        Err(_) => Err(ExecFailure::Timeout(format!("command {cmd:?} timed out"))),
    }
}

/// Runs `action` in the container; Ok(exit code, output) or Err on a timeout or exec error.
pub(crate) async fn exec_command(action: &ExecAction, target: &Target, exec: &dyn Exec, timeout: Duration) -> Result<(i32, String), String> {
    exec_once(action, target, exec, timeout).await.map_err(|(ExecFailure::Error(e) | ExecFailure::Timeout(e))| e)
}

/// How often a probe whose command could not be run at all is tried within one period
/// (upstream's maxProbeRetries); a timeout or an exit code is an answer and is not retried.
const PROBE_ATTEMPTS: usize = 3;

async fn exec_probe(action: &ExecAction, target: &Target, exec: &dyn Exec, timeout: Duration) -> Outcome {
    let mut last = String::new();
    for _ in 0..PROBE_ATTEMPTS {
        match exec_once(action, target, exec, timeout).await {
            Ok((0, _)) => return Outcome::Success,
            Ok((code, out)) if out.trim().is_empty() => return Outcome::Failure(format!("command exited with code {code}")),
            Ok((_, out)) => return Outcome::Failure(out.trim_end().to_string()),
            Err(ExecFailure::Timeout(e)) => return Outcome::Failure(e),
            Err(ExecFailure::Error(e)) => last = e,
        }
    }
    Outcome::Failure(last)
}

async fn tcp_probe(action: &TCPSocketAction, target: &Target, timeout: Duration) -> Outcome {
    let port = match resolve_port(&action.port, &target.ports) {
        Ok(p) => p,
        Err(e) => return Outcome::Failure(e),
    };
    let Some(host) = action.host.clone().filter(|h| !h.is_empty()).or_else(|| target.pod_ip.clone()) else {
        return Outcome::Failure("no host to probe: the pod has no IP".to_string());
    };
    let addr = host_port(&host, port);
    match tokio::time::timeout(timeout, TcpStream::connect((host.as_str(), port))).await {
        Ok(Ok(_)) => Outcome::Success,
        Ok(Err(e)) => Outcome::Failure(format!("dial tcp {addr}: {e}")),
        Err(_) => Outcome::Failure(format!("dial tcp {addr}: i/o timeout")),
    }
}

// ---------------------------------------------------------------------------------------------
// httpGet

/// The answer of an httpGet action after redirects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HttpAnswer {
    pub status: u16,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Url {
    tls: bool,
    host: String,
    port: u16,
    /// Path and query, starting with '/'.
    path: String,
}

impl std::fmt::Display for Url {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = if self.tls { "https" } else { "http" };
        write!(f, "{scheme}://{}{}", host_port(&self.host, self.port), self.path)
    }
}

impl Url {
    /// The target of a redirect's Location, relative to this URL; None when unparseable.
    fn join(&self, location: &str) -> Option<Url> {
        if location.starts_with("http://") || location.starts_with("https://") || location.starts_with("//") {
            let full = if location.starts_with("//") {
                format!("{}:{location}", if self.tls { "https" } else { "http" })
            } else {
                location.to_string()
            };
            let uri: Uri = full.parse().ok()?;
            let tls = uri.scheme_str() == Some("https");
            let host = uri.host()?.trim_start_matches('[').trim_end_matches(']').to_string();
            let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
            let path = uri.path_and_query().map(|p| p.as_str().to_string()).unwrap_or_else(|| "/".to_string());
            return Some(Url { tls, host, port, path });
        }
        let path = if location.starts_with('/') {
            location.to_string()
        } else {
            let base = self.path.split('?').next().unwrap_or("/");
            let dir = &base[..base.rfind('/').map_or(0, |i| i + 1)];
            format!("{dir}{location}")
        };
        Some(Url { path, ..self.clone() })
    }
}

fn action_url(action: &HTTPGetAction, target: &Target) -> Result<Url, String> {
    let tls = match action.scheme.as_deref().unwrap_or("HTTP").to_ascii_uppercase().as_str() {
        "HTTP" => false,
        "HTTPS" => true,
        other => return Err(format!("unsupported scheme {other:?}")),
    };
    let host = action
        .host
        .clone()
        .filter(|h| !h.is_empty())
        .or_else(|| target.pod_ip.clone())
        .ok_or_else(|| "no host to probe: the pod has no IP".to_string())?;
    let port = resolve_port(&action.port, &target.ports)?;
    let path = action.path.clone().unwrap_or_default();
    let path = if path.starts_with('/') { path } else { format!("/{path}") };
    Ok(Url { tls, host, port, path })
}

fn describe_url(action: &HTTPGetAction, target: &Target) -> String {
    action_url(action, target).map_or_else(|e| e, |u| u.to_string())
}

/// Performs the GET of an httpGet action (probe or hook) without a time limit of its own: the
/// caller bounds it. Redirects are followed on the same host; a redirect elsewhere is the answer.
pub(crate) async fn http_get(action: &HTTPGetAction, target: &Target, user_agent: &str) -> Result<HttpAnswer, String> {
    let first = action_url(action, target)?;
    let mut headers = HeaderMap::new();
    for h in action.http_headers.iter().flatten() {
        let name = HeaderName::from_bytes(h.name.as_bytes()).map_err(|e| format!("invalid header name {:?}: {e}", h.name))?;
        let value = HeaderValue::from_str(&h.value).map_err(|e| format!("invalid value of header {:?}: {e}", h.name))?;
        headers.append(name, value);
    }
    if !headers.contains_key(USER_AGENT) {
        headers.insert(USER_AGENT, HeaderValue::from_str(user_agent).map_err(|e| e.to_string())?);
    }
    if !headers.contains_key(ACCEPT) {
        headers.insert(ACCEPT, HeaderValue::from_static("*/*"));
    }
    let mut url = first.clone();
    for _ in 0..=MAX_REDIRECTS {
        let (status, location) = get_once(&url, &headers).await?;
        let next = location.filter(|_| matches!(status, 301 | 302 | 303 | 307 | 308)).and_then(|l| url.join(&l));
        match next {
            Some(next) if next.host == first.host => url = next,
            _ => return Ok(HttpAnswer { status }),
        }
    }
    Err(format!("Get \"{url}\": stopped after {MAX_REDIRECTS} redirects"))
}

async fn get_once(url: &Url, headers: &HeaderMap) -> Result<(u16, Option<String>), String> {
    let addr = host_port(&url.host, url.port);
    let tcp = TcpStream::connect((url.host.as_str(), url.port)).await.map_err(|e| format!("Get \"{url}\": dial tcp {addr}: {e}"))?;
    let mut req = http::Request::get(url.path.as_str()).body(Empty::<Bytes>::new()).map_err(|e| format!("Get \"{url}\": {e}"))?;
    *req.headers_mut() = headers.clone();
    if !req.headers().contains_key(HOST) {
        req.headers_mut().insert(HOST, HeaderValue::from_str(&addr).map_err(|e| e.to_string())?);
    }
    let res = if url.tls {
        let name = rustls::pki_types::ServerName::try_from(url.host.clone()).map_err(|e| format!("Get \"{url}\": {e}"))?;
        let connector = tokio_rustls::TlsConnector::from(insecure_tls_config()?);
        let tls = connector.connect(name, tcp).await.map_err(|e| format!("Get \"{url}\": tls: {e}"))?;
        send(TokioIo::new(tls), req).await
    } else {
        send(TokioIo::new(tcp), req).await
    };
    res.map_err(|e| format!("Get \"{url}\": {e}"))
}

async fn send<I>(io: I, req: http::Request<Empty<Bytes>>) -> Result<(u16, Option<String>), String>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.map_err(|e| e.to_string())?;
    // The connection task is ours alone: aborting it on return closes the connection.
    struct AbortOnDrop(JoinHandle<()>);
    impl Drop for AbortOnDrop {
        fn drop(&mut self) {
            self.0.abort();
        }
    }
    let _conn = AbortOnDrop(tokio::spawn(async move {
        let _ = conn.await;
    }));
    let res = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let location = res.headers().get(LOCATION).and_then(|v| v.to_str().ok()).map(str::to_string);
    Ok((res.status().as_u16(), location))
}

/// HTTPS probes do not verify the server's certificate (upstream: InsecureSkipVerify); the
/// handshake signatures are still checked against the presented certificate.
#[derive(Debug)]
struct NoCertVerification(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for NoCertVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn insecure_tls_config() -> Result<Arc<rustls::ClientConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("tls config: {e}"))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(NoCertVerification(provider)))
        .with_no_client_auth();
    Ok(Arc::new(config))
}

// ---------------------------------------------------------------------------------------------
// grpc (grpc.health.v1.Health/Check, the two messages written out instead of generated)

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct HealthCheckRequest {
    #[prost(string, tag = "1")]
    pub service: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct HealthCheckResponse {
    /// UNKNOWN = 0, SERVING = 1, NOT_SERVING = 2, SERVICE_UNKNOWN = 3.
    #[prost(int32, tag = "1")]
    pub status: i32,
}

fn health_status_name(s: i32) -> String {
    match s {
        0 => "UNKNOWN".to_string(),
        1 => "SERVING".to_string(),
        2 => "NOT_SERVING".to_string(),
        3 => "SERVICE_UNKNOWN".to_string(),
        n => n.to_string(),
    }
}

async fn grpc_probe(action: &GRPCAction, target: &Target, timeout: Duration) -> Outcome {
    let Some(ip) = target.pod_ip.as_deref() else {
        return Outcome::Failure("no host to probe: the pod has no IP".to_string());
    };
    let Some(port) = u16::try_from(action.port).ok().filter(|p| *p > 0) else {
        return Outcome::Failure(format!("invalid port number: {}", action.port));
    };
    let addr = host_port(ip, port);
    let service = action.service.clone().unwrap_or_default();
    let endpoint = match tonic::transport::Endpoint::from_shared(format!("http://{addr}")).and_then(|e| e.user_agent(PROBE_USER_AGENT)) {
        Ok(e) => e.connect_timeout(timeout).timeout(timeout),
        Err(e) => return Outcome::Failure(format!("invalid address {addr}: {e}")),
    };
    let channel = match tokio::time::timeout(timeout, endpoint.connect()).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => return Outcome::Failure(format!("timeout: failed to connect service {addr:?} within {timeout:?}: {e}")),
        Err(_) => return Outcome::Failure(format!("timeout: failed to connect service {addr:?} within {timeout:?}")),
    };
    let mut client = tonic::client::Grpc::new(channel);
    let call = async {
        client.ready().await.map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let codec = tonic_prost::ProstCodec::<HealthCheckRequest, HealthCheckResponse>::default();
        let path = http::uri::PathAndQuery::from_static(HEALTH_CHECK_PATH);
        client.unary(tonic::Request::new(HealthCheckRequest { service }), path, codec).await
    };
    match tokio::time::timeout(timeout, call).await {
        Err(_) => Outcome::Failure(format!("timeout: health rpc did not complete within {timeout:?}")),
        Ok(Err(s)) if s.code() == tonic::Code::Unimplemented => {
            Outcome::Failure(format!("this server does not implement the grpc health protocol (grpc.health.v1.Health): {}", s.message()))
        }
        Ok(Err(s)) if s.code() == tonic::Code::DeadlineExceeded => {
            Outcome::Failure(format!("timeout: health rpc did not complete within {timeout:?}"))
        }
        Ok(Err(s)) => Outcome::Failure(format!("error: health rpc probe failed: {s}")),
        Ok(Ok(r)) if r.get_ref().status == 1 => Outcome::Success,
        Ok(Ok(r)) => Outcome::Failure(format!("service unhealthy (responded with {:?})", health_status_name(r.get_ref().status))),
    }
}

// ---------------------------------------------------------------------------------------------
// The manager

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The message upstream records for a container killed by its probe.
pub fn failure_message(container: &str, kind: ProbeKind) -> String {
    format!("Container {container} failed {} probe, will be restarted", kind.as_str())
}

/// What the workers of one pod share: the results and, per container name, the container id
/// they belong to (a worker of an older id writes nothing) and whether it has started.
#[derive(Default)]
struct Shared {
    results: ProbeResults,
    ids: HashMap<String, String>,
    started: HashMap<String, watch::Sender<bool>>,
}

impl Shared {
    fn forget(&mut self, name: &str) {
        self.results.readiness.remove(name);
        self.results.startup.remove(name);
        self.results.failed.remove(name);
        self.results.failed_grace.remove(name);
        self.ids.remove(name);
        self.started.remove(name);
    }
}

struct Worker {
    container_id: String,
    pod_ip: Option<String>,
    task: JoinHandle<()>,
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Default)]
struct PodProbes {
    shared: Arc<Mutex<Shared>>,
    workers: HashMap<(String, ProbeKind), Worker>,
}

/// Runs the probe workers of all pods. `sync` must be called within a tokio runtime.
pub struct ProbeManager {
    exec: Arc<dyn Exec>,
    notify: mpsc::UnboundedSender<String>,
    pods: Mutex<HashMap<String, PodProbes>>,
    failures: Option<mpsc::UnboundedSender<ProbeFailure>>,
    clock: Clock,
}

/// One failed probe run (for upstream's `Unhealthy` events).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeFailure {
    pub pod_uid: String,
    pub container: String,
    pub kind: ProbeKind,
    pub message: String,
}

impl ProbeFailure {
    /// The event message as upstream writes it: "Liveness probe failed: <output>".
    pub fn event_message(&self) -> String {
        let kind = match self.kind {
            ProbeKind::Liveness => "Liveness",
            ProbeKind::Readiness => "Readiness",
            ProbeKind::Startup => "Startup",
        };
        format!("{kind} probe failed: {}", self.message)
    }
}

/// A pod's containers that may carry probes: app containers and restartable (sidecar) init
/// containers.
fn probed_containers(pod: &Pod) -> Vec<&Container> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let sidecars = spec.init_containers.iter().flatten().filter(|c| is_sidecar(c));
    spec.containers.iter().chain(sidecars).collect()
}

const KINDS: [ProbeKind; 3] = [ProbeKind::Startup, ProbeKind::Liveness, ProbeKind::Readiness];

impl ProbeManager {
    pub fn new(exec: Arc<dyn Exec>, notify: mpsc::UnboundedSender<String>) -> Self {
        ProbeManager { exec, notify, pods: Mutex::new(HashMap::new()), failures: None, clock: Clock::System }
    }

    /// Also reports every failed probe run on `failures`.
    pub fn with_failures(mut self, failures: mpsc::UnboundedSender<ProbeFailure>) -> Self {
        self.failures = Some(failures);
        self
    }

    /// Measures initial delays against `clock` (the system's by default).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Starts a worker for each (running container, probe kind) the pod's spec defines and stops
    /// the workers whose container is gone, changed id, or whose pod IP changed; the results of
    /// containers no longer running are dropped. `running`: (container name, container id,
    /// started_at unix ns) of the pod's running containers now.
    pub fn sync(&self, pod: &Pod, pod_ip: Option<String>, running: &[(String, String, i64)]) {
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        let containers = probed_containers(pod);
        let mut desired = HashMap::new();
        for (name, id, started_at) in running {
            let Some(c) = containers.iter().find(|c| &c.name == name) else {
                continue;
            };
            for kind in KINDS {
                if let Some(p) = kind.probe_of(c) {
                    desired.insert((name.clone(), kind), (id.clone(), *started_at, p.clone(), *c));
                }
            }
        }
        let mut pods = lock(&self.pods);
        if desired.is_empty() && !pods.contains_key(&uid) {
            return;
        }
        let pod_probes = pods.entry(uid.clone()).or_default();
        pod_probes
            .workers
            .retain(|key, w| desired.get(key).is_some_and(|(id, ..)| *id == w.container_id) && w.pod_ip == pod_ip);
        let mut shared = lock(&pod_probes.shared);
        let current: HashMap<&str, &str> = running.iter().map(|(n, id, _)| (n.as_str(), id.as_str())).collect();
        let stale: Vec<String> =
            shared.ids.iter().filter(|(n, id)| current.get(n.as_str()) != Some(&id.as_str())).map(|(n, _)| n.clone()).collect();
        for n in stale {
            shared.forget(&n);
        }
        for ((name, kind), (id, started_at, probe, container)) in desired {
            if !shared.ids.contains_key(&name) {
                shared.ids.insert(name.clone(), id.clone());
                shared.started.insert(name.clone(), watch::channel(container.startup_probe.is_none()).0);
            }
            if pod_probes.workers.contains_key(&(name.clone(), kind)) {
                continue;
            }
            // A worker restarted for a new pod IP does not redo what its container is done with:
            // startup once succeeded, liveness and startup once the container failed.
            let done = match kind {
                ProbeKind::Startup => shared.results.startup.contains_key(&name) || shared.results.failed.contains_key(&name),
                ProbeKind::Liveness => shared.results.failed.contains_key(&name),
                ProbeKind::Readiness => false,
            };
            if done {
                continue;
            }
            let started = shared.started.get(&name).map(|s| s.subscribe());
            let target = Target {
                pod_ip: pod_ip.clone(),
                container_id: id.clone(),
                ports: container.ports.clone().unwrap_or_default(),
            };
            let run = WorkerRun {
                uid: uid.clone(),
                name: name.clone(),
                container_id: id.clone(),
                kind,
                probe,
                target,
                started_at,
                started,
                exec: self.exec.clone(),
                shared: pod_probes.shared.clone(),
                notify: self.notify.clone(),
                failures: self.failures.clone(),
                clock: self.clock.clone(),
            };
            let span = tracing::debug_span!("probe", pod = %uid, container = %name, kind = kind.as_str());
            let task = tokio::spawn(run.run().instrument(span));
            pod_probes.workers.insert((name, kind), Worker { container_id: id, pod_ip: pod_ip.clone(), task });
        }
    }

    /// The pod's current probe results (empty for a pod without probes).
    pub fn results(&self, pod_uid: &str) -> ProbeResults {
        lock(&self.pods).get(pod_uid).map(|p| lock(&p.shared).results.clone()).unwrap_or_default()
    }

    /// Stops the pod's workers and forgets its results.
    pub fn remove_pod(&self, pod_uid: &str) {
        let removed = lock(&self.pods).remove(pod_uid);
        drop(removed);
    }
}

/// One worker: probes one container with one probe until stopped or, for liveness and startup,
/// until the probe failed (startup: or succeeded).
struct WorkerRun {
    uid: String,
    name: String,
    container_id: String,
    kind: ProbeKind,
    probe: Probe,
    target: Target,
    started_at: i64,
    /// Whether the container has started (its startup probe succeeded, or it has none).
    started: Option<watch::Receiver<bool>>,
    exec: Arc<dyn Exec>,
    shared: Arc<Mutex<Shared>>,
    notify: mpsc::UnboundedSender<String>,
    failures: Option<mpsc::UnboundedSender<ProbeFailure>>,
    clock: Clock,
}

impl WorkerRun {
    async fn run(mut self) {
        let mut state = ProbeState::new(self.kind, &self.probe);
        if self.kind != ProbeKind::Startup {
            if let Some(rx) = self.started.as_mut() {
                if rx.wait_for(|s| *s).await.is_err() {
                    return;
                }
            }
        }
        let now_ns = self.clock.now_ns();
        let since_start = Duration::from_nanos(u64::try_from(now_ns.saturating_sub(self.started_at)).unwrap_or(0));
        if !state.should_probe(since_start) {
            tokio::time::sleep(state.initial_delay().saturating_sub(since_start)).await;
        }
        loop {
            let outcome = run_probe(&self.probe, &self.target, self.exec.as_ref()).await;
            if let Outcome::Failure(msg) = &outcome {
                tracing::debug!(message = %msg, "probe failed");
                if let Some(f) = self.failures.as_ref() {
                    let _ = f.send(ProbeFailure {
                        pod_uid: self.uid.clone(),
                        container: self.name.clone(),
                        kind: self.kind,
                        message: msg.clone(),
                    });
                }
            }
            let flipped = state.record(&outcome);
            let Some(stop) = self.publish(&state) else {
                return;
            };
            if flipped {
                tracing::info!(result = state.result(), "probe result changed");
                let _ = self.notify.send(self.uid.clone());
            }
            if stop {
                return;
            }
            tokio::time::sleep(state.period()).await;
        }
    }

    /// Writes the state into the shared results; Some(true) when this worker is done, None when
    /// its container is no longer the current one.
    fn publish(&self, state: &ProbeState) -> Option<bool> {
        let mut shared = lock(&self.shared);
        if shared.ids.get(&self.name) != Some(&self.container_id) {
            return None;
        }
        let done = match self.kind {
            ProbeKind::Readiness => {
                shared.results.readiness.insert(self.name.clone(), state.result());
                false
            }
            ProbeKind::Startup if state.known() == Some(true) => {
                shared.results.startup.insert(self.name.clone(), true);
                if let Some(s) = shared.started.get(&self.name) {
                    s.send_replace(true);
                }
                true
            }
            ProbeKind::Liveness | ProbeKind::Startup if state.failed() => {
                shared.results.failed.insert(self.name.clone(), failure_message(&self.name, self.kind));
                // The probe's own terminationGracePeriodSeconds is the kill's grace (KEP-2238).
                if let Some(g) = self.probe.termination_grace_period_seconds {
                    shared.results.failed_grace.insert(self.name.clone(), g);
                }
                true
            }
            ProbeKind::Liveness | ProbeKind::Startup => false,
        };
        Some(done)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod tests {
    use super::*;
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicI32, Ordering};

    type ExitFn = Box<dyn Fn(&[String]) -> Option<i32> + Send + Sync>;

    /// Answers exec with the exit code `exit` gives for the command (None: never returns), and
    /// records the commands.
    pub(crate) struct FakeExec {
        calls: Mutex<Vec<Vec<String>>>,
        exit: ExitFn,
    }

    impl FakeExec {
        pub(crate) fn new(exit: impl Fn(&[String]) -> Option<i32> + Send + Sync + 'static) -> Arc<Self> {
            Arc::new(FakeExec { calls: Mutex::new(Vec::new()), exit: Box::new(exit) })
        }

        pub(crate) fn calls(&self, first: &str) -> usize {
            lock(&self.calls).iter().filter(|c| c.first().map(String::as_str) == Some(first)).count()
        }
    }

    impl Exec for FakeExec {
        fn exec_sync(&self, _id: &str, cmd: Vec<String>, _timeout: Duration) -> BoxFuture<'static, Result<(i32, Vec<u8>), String>> {
            lock(&self.calls).push(cmd.clone());
            match (self.exit)(&cmd) {
                // -1: the runtime could not run the command.
                Some(-1) => Box::pin(async move { Err(format!("exec of {} failed in the runtime", cmd.join(" "))) }),
                Some(code) => Box::pin(async move { Ok((code, format!("output of {}\n", cmd.join(" ")).into_bytes())) }),
                None => Box::pin(std::future::pending()),
            }
        }
    }

    fn probe(v: serde_json::Value) -> Probe {
        serde_json::from_value(v).unwrap()
    }

    fn local(ports: Vec<ContainerPort>) -> Target {
        Target { pod_ip: Some("127.0.0.1".to_string()), container_id: "c1".to_string(), ports }
    }

    fn never() -> Arc<FakeExec> {
        FakeExec::new(|_| Some(0))
    }

    #[test]
    fn initial_results_per_kind() {
        let p = probe(serde_json::json!({}));
        let r = ProbeState::new(ProbeKind::Readiness, &p);
        assert!(!r.result());
        assert_eq!(r.known(), Some(false));
        let l = ProbeState::new(ProbeKind::Liveness, &p);
        assert!(l.result());
        assert!(!l.failed());
        let s = ProbeState::new(ProbeKind::Startup, &p);
        assert!(!s.result());
        assert_eq!(s.known(), None);
        assert!(!s.failed());
        // Defaults: period 10s, timeout 1s, no initial delay, failureThreshold 3.
        assert_eq!((l.period(), l.timeout(), l.initial_delay()), (Duration::from_secs(10), Duration::from_secs(1), Duration::ZERO));
    }

    #[test]
    fn thresholds() {
        let fail = Outcome::Failure("no".to_string());
        let p = probe(serde_json::json!({"successThreshold": 2, "failureThreshold": 3, "periodSeconds": 5, "timeoutSeconds": 2, "initialDelaySeconds": 7}));
        let mut r = ProbeState::new(ProbeKind::Readiness, &p);
        assert_eq!((r.period(), r.timeout(), r.initial_delay()), (Duration::from_secs(5), Duration::from_secs(2), Duration::from_secs(7)));
        assert!(!r.should_probe(Duration::from_secs(6)));
        assert!(r.should_probe(Duration::from_secs(7)));
        assert!(!r.record(&Outcome::Success));
        assert!(!r.result());
        assert!(r.record(&Outcome::Success));
        assert!(r.result());
        assert!(!r.record(&Outcome::Success));
        // Two failures, then a success: the run restarts.
        assert!(!r.record(&fail));
        assert!(!r.record(&fail));
        assert!(!r.record(&Outcome::Success));
        assert!(!r.record(&fail));
        assert!(!r.record(&fail));
        assert!(r.record(&fail));
        assert!(!r.result());
        assert!(!r.failed(), "readiness never fails the container");
        assert!(!r.record(&fail));

        let mut l = ProbeState::new(ProbeKind::Liveness, &probe(serde_json::json!({"failureThreshold": 2})));
        assert!(!l.record(&fail));
        assert!(l.result());
        assert!(l.record(&fail));
        assert!(l.failed());

        let mut s = ProbeState::new(ProbeKind::Startup, &probe(serde_json::json!({"failureThreshold": 2})));
        assert!(!s.record(&fail));
        assert!(s.record(&Outcome::Success), "unknown to success is a change");
        assert!(s.result());
        let mut s = ProbeState::new(ProbeKind::Startup, &probe(serde_json::json!({"failureThreshold": 2})));
        assert!(!s.record(&fail));
        assert!(s.record(&fail), "unknown to failure is a change");
        assert!(s.failed());
    }

    #[test]
    fn named_ports() {
        let ports: Vec<ContainerPort> = serde_json::from_value(serde_json::json!([{"name": "web", "containerPort": 8080}, {"containerPort": 9090}])).unwrap();
        assert_eq!(resolve_port(&IntOrString::String("web".into()), &ports), Ok(8080));
        assert_eq!(resolve_port(&IntOrString::Int(81), &ports), Ok(81));
        assert_eq!(resolve_port(&IntOrString::String("82".into()), &ports), Ok(82));
        assert!(resolve_port(&IntOrString::String("nope".into()), &ports).unwrap_err().contains("nope"));
        assert!(resolve_port(&IntOrString::Int(0), &ports).is_err());
        assert!(resolve_port(&IntOrString::Int(70000), &ports).is_err());
    }

    #[test]
    fn redirect_targets() {
        let u = Url { tls: false, host: "10.0.0.1".into(), port: 8080, path: "/a/b?x=1".into() };
        assert_eq!(u.join("c").unwrap().path, "/a/c");
        assert_eq!(u.join("/z").unwrap().path, "/z");
        let abs = u.join("https://other:8443/p?q").unwrap();
        assert_eq!(abs, Url { tls: true, host: "other".into(), port: 8443, path: "/p?q".into() });
        assert_eq!(u.join("http://[::1]/").unwrap().host, "::1");
        assert_eq!(u.to_string(), "http://10.0.0.1:8080/a/b?x=1");
        assert_eq!(host_port("fd00::1", 80), "[fd00::1]:80");
    }

    type Seen = Arc<Mutex<Vec<(String, HeaderMap)>>>;

    /// A plain HTTP server on 127.0.0.1 (or TLS with a self-signed certificate) answering by
    /// path; it records (path, headers) of each request.
    pub(crate) async fn http_server(tls: bool) -> (u16, Seen) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen: Seen = Arc::new(Mutex::new(Vec::new()));
        let acceptor = tls.then(|| {
            let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
            let key = rustls::pki_types::PrivateKeyDer::try_from(ck.signing_key.serialize_der()).unwrap();
            let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(vec![ck.cert.der().clone()], key)
                .unwrap();
            tokio_rustls::TlsAcceptor::from(Arc::new(config))
        });
        let seen2 = seen.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let seen = seen2.clone();
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let seen = seen.clone();
                        async move {
                            let path = req.uri().path().to_string();
                            lock(&seen).push((path.clone(), req.headers().clone()));
                            let (status, location) = match path.as_str() {
                                "/ok" => (200, None),
                                "/found" => (302, Some("/ok")),
                                "/dir/to-fail" => (302, Some("fail")),
                                "/dir/fail" | "/fail" => (500, None),
                                "/elsewhere" => (302, Some("http://elsewhere.invalid/x")),
                                "/loop" => (307, Some("/loop")),
                                "/slow" => {
                                    tokio::time::sleep(Duration::from_secs(30)).await;
                                    (200, None)
                                }
                                _ => (404, None),
                            };
                            let mut b = http::Response::builder().status(status);
                            if let Some(l) = location {
                                b = b.header(LOCATION, l);
                            }
                            Ok::<_, Infallible>(b.body(Empty::<Bytes>::new()).unwrap())
                        }
                    });
                    let http = hyper::server::conn::http1::Builder::new();
                    match acceptor {
                        Some(a) => {
                            if let Ok(s) = a.accept(stream).await {
                                let _ = http.serve_connection(TokioIo::new(s), svc).await;
                            }
                        }
                        None => {
                            let _ = http.serve_connection(TokioIo::new(stream), svc).await;
                        }
                    }
                });
            }
        });
        (port, seen)
    }

    fn http_probe(port: serde_json::Value, path: &str, extra: serde_json::Value) -> Probe {
        let mut v = serde_json::json!({"httpGet": {"port": port, "path": path}, "timeoutSeconds": 1});
        if let (Some(h), Some(e)) = (v["httpGet"].as_object_mut(), extra.as_object()) {
            h.extend(e.clone());
        }
        probe(v)
    }

    #[tokio::test]
    async fn http_probe_statuses_and_redirects() {
        let (port, seen) = http_server(false).await;
        let t = local(Vec::new());
        let run = |path: &str| run_probe_owned(http_probe(port.into(), path, serde_json::json!({})), t.clone());
        assert_eq!(run("/ok").await, Outcome::Success);
        assert_eq!(run("ok").await, Outcome::Success, "a path without a leading slash");
        assert_eq!(run("/found").await, Outcome::Success);
        assert_eq!(lock(&seen).iter().rev().take(2).map(|(p, _)| p.clone()).collect::<Vec<_>>(), ["/ok", "/found"]);
        assert_eq!(run("/fail").await, Outcome::Failure("HTTP probe failed with statuscode: 500".to_string()));
        assert_eq!(run("/dir/to-fail").await, Outcome::Failure("HTTP probe failed with statuscode: 500".to_string()));
        assert_eq!(run("/elsewhere").await, Outcome::Success, "a redirect to another host is success");
        let Outcome::Failure(m) = run("/loop").await else { panic!("redirect loop succeeded") };
        assert!(m.contains("stopped after 10 redirects"), "{m}");
        let Outcome::Failure(m) = run("/slow").await else { panic!("slow answer succeeded") };
        assert!(m.contains("timeout"), "{m}");
        assert!(matches!(run("/missing").await, Outcome::Failure(_)));
    }

    async fn run_probe_owned(p: Probe, t: Target) -> Outcome {
        run_probe(&p, &t, never().as_ref()).await
    }

    #[tokio::test]
    async fn http_probe_headers_named_port_and_host() {
        let (port, seen) = http_server(false).await;
        let ports: Vec<ContainerPort> = serde_json::from_value(serde_json::json!([{"name": "http", "containerPort": port}])).unwrap();
        let p = http_probe("http".into(), "/ok", serde_json::json!({"httpHeaders": [{"name": "X-Custom", "value": "yes"}]}));
        assert_eq!(run_probe(&p, &local(ports), never().as_ref()).await, Outcome::Success);
        let (path, h) = lock(&seen).last().cloned().unwrap();
        assert_eq!(path, "/ok");
        assert_eq!(h[USER_AGENT], "kube-probe/1.33");
        assert_eq!(h["x-custom"], "yes");
        assert_eq!(h[ACCEPT], "*/*");
        assert_eq!(h[HOST], format!("127.0.0.1:{port}"));

        // Headers the user sets win; an explicit host replaces the pod IP.
        let p = http_probe(
            port.into(),
            "/ok",
            serde_json::json!({"host": "127.0.0.1", "httpHeaders": [{"name": "User-Agent", "value": "mine"}, {"name": "Host", "value": "example.test"}]}),
        );
        let no_ip = Target { pod_ip: None, ..local(Vec::new()) };
        assert_eq!(run_probe(&p, &no_ip, never().as_ref()).await, Outcome::Success);
        let (_, h) = lock(&seen).last().cloned().unwrap();
        assert_eq!(h[USER_AGENT], "mine");
        assert_eq!(h[HOST], "example.test");

        // No host and no pod IP.
        let p = http_probe(port.into(), "/ok", serde_json::json!({}));
        assert!(matches!(run_probe(&p, &no_ip, never().as_ref()).await, Outcome::Failure(_)));
        // An unknown named port.
        let p = http_probe("nope".into(), "/ok", serde_json::json!({}));
        assert!(matches!(run_probe(&p, &local(Vec::new()), never().as_ref()).await, Outcome::Failure(_)));
    }

    #[tokio::test]
    async fn https_probe_skips_certificate_verification() {
        let (port, _) = http_server(true).await;
        let p = http_probe(port.into(), "/ok", serde_json::json!({"scheme": "HTTPS"}));
        assert_eq!(run_probe(&p, &local(Vec::new()), never().as_ref()).await, Outcome::Success);
        let p = http_probe(port.into(), "/fail", serde_json::json!({"scheme": "HTTPS"}));
        assert!(matches!(run_probe(&p, &local(Vec::new()), never().as_ref()).await, Outcome::Failure(_)));
    }

    async fn closed_port() -> u16 {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap().port()
    }

    #[tokio::test]
    async fn tcp_probe_open_and_closed() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let open = l.local_addr().unwrap().port();
        let p = probe(serde_json::json!({"tcpSocket": {"port": open}}));
        assert_eq!(run_probe(&p, &local(Vec::new()), never().as_ref()).await, Outcome::Success);
        let p = probe(serde_json::json!({"tcpSocket": {"port": closed_port().await, "host": "127.0.0.1"}}));
        let Outcome::Failure(m) = run_probe(&p, &Target::default(), never().as_ref()).await else { panic!("closed port succeeded") };
        assert!(m.starts_with("dial tcp 127.0.0.1:"), "{m}");
    }

    #[tokio::test(start_paused = true)]
    async fn exec_probe_exit_codes_and_timeout() {
        let exec = FakeExec::new(|cmd| match cmd[0].as_str() {
            "ok" => Some(0),
            "bad" => Some(1),
            _ => None,
        });
        let t = local(Vec::new());
        let p = |cmd: &str| probe(serde_json::json!({"exec": {"command": [cmd, "arg"]}, "timeoutSeconds": 3}));
        assert_eq!(run_probe(&p("ok"), &t, exec.as_ref()).await, Outcome::Success);
        assert_eq!(run_probe(&p("bad"), &t, exec.as_ref()).await, Outcome::Failure("output of bad arg".to_string()));
        let start = tokio::time::Instant::now();
        let Outcome::Failure(m) = run_probe(&p("hang"), &t, exec.as_ref()).await else { panic!("hang succeeded") };
        assert!(m.contains("timed out"), "{m}");
        assert_eq!(start.elapsed(), Duration::from_secs(3), "bounded by timeoutSeconds");
        assert!(matches!(run_probe(&probe(serde_json::json!({"exec": {}})), &t, exec.as_ref()).await, Outcome::Failure(_)));
        assert!(matches!(run_probe(&probe(serde_json::json!({})), &t, exec.as_ref()).await, Outcome::Failure(_)));
    }

    #[tokio::test]
    async fn exec_probe_errors_are_retried_up_to_three_times() {
        // Errors twice, then exits 0: one probe run, three attempts, success.
        let tries = Arc::new(AtomicI32::new(0));
        let t2 = tries.clone();
        let exec = FakeExec::new(move |cmd| match cmd[0].as_str() {
            "flaky" => Some(if t2.fetch_add(1, Ordering::SeqCst) < 2 { -1 } else { 0 }),
            "broken" => Some(-1),
            _ => Some(1),
        });
        let t = local(Vec::new());
        let p = |cmd: &str| probe(serde_json::json!({"exec": {"command": [cmd]}}));
        assert_eq!(run_probe(&p("flaky"), &t, exec.as_ref()).await, Outcome::Success);
        assert_eq!(exec.calls("flaky"), 3);
        // Always an error: a failure with the runtime's message after exactly three attempts.
        assert_eq!(
            run_probe(&p("broken"), &t, exec.as_ref()).await,
            Outcome::Failure("exec of broken failed in the runtime".to_string())
        );
        assert_eq!(exec.calls("broken"), 3);
        // An exit code is an answer: not retried.
        assert!(matches!(run_probe(&p("exit1"), &t, exec.as_ref()).await, Outcome::Failure(_)));
        assert_eq!(exec.calls("exit1"), 1);
    }

    /// A grpc.health.v1.Health server answering Check with a fixed status, or Unimplemented for
    /// the service "other".
    #[derive(Clone)]
    struct Health(i32);

    impl tonic::server::NamedService for Health {
        const NAME: &'static str = "grpc.health.v1.Health";
    }

    struct Check(i32);

    impl tonic::server::UnaryService<HealthCheckRequest> for Check {
        type Response = HealthCheckResponse;
        type Future = BoxFuture<'static, Result<tonic::Response<HealthCheckResponse>, tonic::Status>>;
        fn call(&mut self, req: tonic::Request<HealthCheckRequest>) -> Self::Future {
            let status = self.0;
            let service = req.into_inner().service;
            Box::pin(async move {
                if service == "other" {
                    return Err(tonic::Status::not_found("unknown service"));
                }
                Ok(tonic::Response::new(HealthCheckResponse { status }))
            })
        }
    }

    impl tower::Service<http::Request<tonic::body::Body>> for Health {
        type Response = http::Response<tonic::body::Body>;
        type Error = Infallible;
        type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

        fn poll_ready(&mut self, _cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Infallible>> {
            std::task::Poll::Ready(Ok(()))
        }

        fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
            let status = self.0;
            Box::pin(async move {
                if req.uri().path() == HEALTH_CHECK_PATH && status >= 0 {
                    let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::<HealthCheckResponse, HealthCheckRequest>::default());
                    return Ok(grpc.unary(Check(status), req).await);
                }
                Ok(tonic::Status::unimplemented("no such method").into_http())
            })
        }
    }

    /// A health server (status < 0: one without the health service).
    async fn grpc_server(status: i32) -> u16 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        tokio::spawn(tonic::transport::Server::builder().add_service(Health(status)).serve_with_incoming(incoming));
        port
    }

    #[tokio::test]
    async fn grpc_probe_health_statuses() {
        let t = local(Vec::new());
        let p = |port: u16, service: Option<&str>| probe(serde_json::json!({"grpc": {"port": port, "service": service}, "timeoutSeconds": 2}));
        let serving = grpc_server(1).await;
        assert_eq!(run_probe(&p(serving, None), &t, never().as_ref()).await, Outcome::Success);
        assert_eq!(run_probe(&p(serving, Some("svc")), &t, never().as_ref()).await, Outcome::Success);
        let Outcome::Failure(m) = run_probe(&p(serving, Some("other")), &t, never().as_ref()).await else { panic!() };
        assert!(m.contains("health rpc probe failed"), "{m}");
        let not_serving = grpc_server(2).await;
        assert_eq!(
            run_probe(&p(not_serving, None), &t, never().as_ref()).await,
            Outcome::Failure("service unhealthy (responded with \"NOT_SERVING\")".to_string())
        );
        let Outcome::Failure(m) = run_probe(&p(grpc_server(-1).await, None), &t, never().as_ref()).await else { panic!() };
        assert!(m.contains("does not implement the grpc health protocol"), "{m}");
        let Outcome::Failure(m) = run_probe(&p(closed_port().await, None), &t, never().as_ref()).await else { panic!() };
        assert!(m.contains("failed to connect"), "{m}");
    }

    // -----------------------------------------------------------------------------------------
    // The manager, on tokio's paused clock with exec probes.

    fn pod(containers: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({"metadata": {"uid": "u1"}, "spec": {"containers": containers}})).unwrap()
    }

    fn now_ns() -> i64 {
        i64::try_from(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()).unwrap()
    }

    fn running(id: &str) -> Vec<(String, String, i64)> {
        vec![("app".to_string(), id.to_string(), now_ns())]
    }

    fn ip() -> Option<String> {
        Some("10.0.0.1".to_string())
    }

    #[tokio::test(start_paused = true)]
    async fn failing_liveness_lands_in_failed_and_stops_until_the_container_changes() {
        let exec = FakeExec::new(|_| Some(1));
        let (tx, mut rx) = mpsc::unbounded_channel();
        let m = ProbeManager::new(exec.clone(), tx);
        let p = pod(serde_json::json!([{"name": "app", "livenessProbe": {"exec": {"command": ["live"]}, "periodSeconds": 10, "failureThreshold": 3}}]));
        let start = tokio::time::Instant::now();
        m.sync(&p, ip(), &running("c1"));
        assert_eq!(rx.recv().await.unwrap(), "u1");
        assert_eq!(start.elapsed(), Duration::from_secs(20), "3 probes, 10s apart");
        assert_eq!(exec.calls("live"), 3);
        let r = m.results("u1");
        assert_eq!(r.failed.get("app").map(String::as_str), Some("Container app failed liveness probe, will be restarted"));
        // The worker is on hold: a sync with the same container changes nothing.
        m.sync(&p, ip(), &running("c1"));
        tokio::time::sleep(Duration::from_secs(100)).await;
        assert_eq!(exec.calls("live"), 3);
        assert_eq!(m.results("u1"), r);
        // The restarted container starts from scratch.
        m.sync(&p, ip(), &running("c2"));
        assert!(m.results("u1").failed.is_empty());
        assert_eq!(rx.recv().await.unwrap(), "u1");
        assert_eq!(exec.calls("live"), 6);
        assert!(m.results("u1").failed.contains_key("app"));
        // A new pod IP restarts workers, but not one whose container already failed.
        m.sync(&p, Some("10.0.0.2".to_string()), &running("c2"));
        tokio::time::sleep(Duration::from_secs(100)).await;
        assert_eq!(exec.calls("live"), 6);
        assert!(m.results("u1").failed.contains_key("app"));
        // Gone: the results go with it.
        m.sync(&p, ip(), &[]);
        assert_eq!(m.results("u1"), ProbeResults::default());
    }

    #[tokio::test(start_paused = true)]
    async fn initial_delay_counts_from_the_container_start() {
        let exec = FakeExec::new(|_| Some(0));
        let (tx, _rx) = mpsc::unbounded_channel();
        let m = ProbeManager::new(exec.clone(), tx);
        let p = pod(serde_json::json!([{"name": "app", "livenessProbe": {"exec": {"command": ["live"]}, "initialDelaySeconds": 30}}]));
        // Started 10s ago (wall clock): the first probe comes 20s from now.
        let started = now_ns() - 10_000_000_000;
        m.sync(&p, ip(), &[("app".to_string(), "c1".to_string(), started)]);
        tokio::time::sleep(Duration::from_secs(19)).await;
        assert_eq!(exec.calls("live"), 0);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(exec.calls("live"), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn readiness_flips_both_ways_and_keeps_running() {
        let code = Arc::new(AtomicI32::new(0));
        let c = code.clone();
        let exec = FakeExec::new(move |_| Some(c.load(Ordering::SeqCst)));
        let (tx, mut rx) = mpsc::unbounded_channel();
        let m = ProbeManager::new(exec.clone(), tx);
        let p = pod(serde_json::json!([{"name": "app", "readinessProbe": {"exec": {"command": ["ready"]}, "periodSeconds": 5, "successThreshold": 2, "failureThreshold": 1}}]));
        m.sync(&p, ip(), &running("c1"));
        assert!(m.results("u1").readiness.get("app") != Some(&true));
        assert_eq!(rx.recv().await.unwrap(), "u1");
        assert_eq!(m.results("u1").readiness.get("app"), Some(&true));
        assert_eq!(exec.calls("ready"), 2);
        code.store(1, Ordering::SeqCst);
        assert_eq!(rx.recv().await.unwrap(), "u1");
        assert_eq!(m.results("u1").readiness.get("app"), Some(&false));
        assert!(m.results("u1").failed.is_empty(), "readiness never fails the container");
        code.store(0, Ordering::SeqCst);
        assert_eq!(rx.recv().await.unwrap(), "u1");
        assert_eq!(m.results("u1").readiness.get("app"), Some(&true));
        m.remove_pod("u1");
        let calls = exec.calls("ready");
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(exec.calls("ready"), calls, "removed pods are not probed");
        assert_eq!(m.results("u1"), ProbeResults::default());
    }

    #[tokio::test(start_paused = true)]
    async fn startup_gates_liveness_and_readiness() {
        let startup_code = Arc::new(AtomicI32::new(1));
        let c = startup_code.clone();
        let exec = FakeExec::new(move |cmd| Some(if cmd[0] == "start" { c.load(Ordering::SeqCst) } else { 0 }));
        let (tx, mut rx) = mpsc::unbounded_channel();
        let m = ProbeManager::new(exec.clone(), tx);
        let p = pod(serde_json::json!([{"name": "app",
            "startupProbe": {"exec": {"command": ["start"]}, "periodSeconds": 1, "failureThreshold": 100},
            "livenessProbe": {"exec": {"command": ["live"]}, "periodSeconds": 1},
            "readinessProbe": {"exec": {"command": ["ready"]}, "periodSeconds": 1}}]));
        m.sync(&p, ip(), &running("c1"));
        tokio::time::sleep(Duration::from_millis(5500)).await;
        assert_eq!(exec.calls("start"), 6);
        assert_eq!((exec.calls("live"), exec.calls("ready")), (0, 0));
        assert_eq!(m.results("u1"), ProbeResults::default());
        startup_code.store(0, Ordering::SeqCst);
        assert_eq!(rx.recv().await.unwrap(), "u1");
        assert_eq!(m.results("u1").startup.get("app"), Some(&true));
        assert_eq!(rx.recv().await.unwrap(), "u1");
        assert_eq!(m.results("u1").readiness.get("app"), Some(&true));
        let starts = exec.calls("start");
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(exec.calls("start"), starts, "startup probing ends once it succeeded");
        assert!(exec.calls("live") >= 10);
        assert!(exec.calls("ready") >= 10);
        // A new pod IP restarts liveness and readiness, not the startup probe that succeeded.
        m.sync(&p, Some("10.0.0.2".to_string()), &running("c1"));
        let (lives, readies) = (exec.calls("live"), exec.calls("ready"));
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(exec.calls("start"), starts);
        assert!(exec.calls("live") > lives && exec.calls("ready") > readies);
        assert_eq!(m.results("u1").startup.get("app"), Some(&true));
    }

    #[tokio::test(start_paused = true)]
    async fn failing_startup_fails_the_container() {
        let exec = FakeExec::new(|cmd| Some(if cmd[0] == "start" { 1 } else { 0 }));
        let (tx, mut rx) = mpsc::unbounded_channel();
        let m = ProbeManager::new(exec.clone(), tx);
        let p = pod(serde_json::json!([{"name": "app",
            "startupProbe": {"exec": {"command": ["start"]}, "periodSeconds": 1, "failureThreshold": 2},
            "livenessProbe": {"exec": {"command": ["live"]}}}]));
        m.sync(&p, ip(), &running("c1"));
        assert_eq!(rx.recv().await.unwrap(), "u1");
        let r = m.results("u1");
        assert_eq!(r.failed.get("app").map(String::as_str), Some("Container app failed startup probe, will be restarted"));
        assert!(r.startup.is_empty());
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!((exec.calls("start"), exec.calls("live")), (2, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn pods_without_probes_or_uid_start_nothing() {
        let exec = FakeExec::new(|_| Some(0));
        let (tx, _rx) = mpsc::unbounded_channel();
        let m = ProbeManager::new(exec.clone(), tx);
        m.sync(&pod(serde_json::json!([{"name": "app"}])), ip(), &running("c1"));
        let mut no_uid = pod(serde_json::json!([{"name": "app", "livenessProbe": {"exec": {"command": ["live"]}}}]));
        no_uid.metadata.uid = None;
        m.sync(&no_uid, ip(), &running("c1"));
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(exec.calls("live"), 0);
        assert!(lock(&m.pods).is_empty());
    }
}
