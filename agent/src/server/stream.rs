//! exec, attach and port-forward: the runtime's streaming server does the work.
//!
//! The agent asks the runtime for a one-time URL (CRI Exec, Attach, PortForward). containerd
//! 1.6's streaming server speaks SPDY/3.1 (`v4.channel.k8s.io` and older for exec/attach,
//! `portforward.k8s.io` for port-forward) and WebSocket only up to `v4.channel.k8s.io`; kubectl
//! 1.32 asks first for WebSocket `v5.channel.k8s.io` (exec, attach) and
//! `SPDY/3.1+portforward.k8s.io` (port-forward), which the agent therefore serves itself, as
//! upstream's kubelet does ([`Upgrade::of`] decides):
//!
//! - WebSocket offering `v5.channel.k8s.io`: the agent upgrades to the runtime as a SPDY/3.1
//!   `v4.channel.k8s.io` client, sets up the streams, answers the client's handshake (101,
//!   `Sec-WebSocket-Protocol: v5.channel.k8s.io`) and translates between the two
//!   ([`wsbridge::bridge`]). v4 over WebSocket cannot say "stdin closed", which is why the
//!   runtime's own WebSocket v4 is not used for this.
//! - WebSocket offering `SPDY/3.1+portforward.k8s.io`: the agent upgrades to the runtime with
//!   plain SPDY and carries the SPDY bytes in WebSocket binary messages ([`wsbridge::tunnel`]).
//! - Anything else (SPDY/3.1 from kubectl's fallback or an upstream API server, WebSocket v4
//!   and older): the request is forwarded with its upgrade headers (`Connection`, `Upgrade`,
//!   `X-Stream-Protocol-Version`, `Sec-WebSocket-*`) and, once the runtime answers 101, the
//!   two connections are spliced. Any other answer is passed through as it is.
//!
//! Upgraded sessions are counted by route and protocol
//! (`ferro_agent_stream_requests_total{path,protocol}`: `v5.channel.k8s.io`,
//! `SPDY/3.1+portforward.k8s.io`, or `spdy` / `websocket` for the spliced ones).

use std::sync::Arc;
use std::time::Duration;

use http::{header, Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Empty};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use k8s_cri::v1::{AttachRequest, ExecRequest, PortForwardRequest};

use super::{not_found, text, wsbridge, Body, State};

/// How long the CRI call and the connection to the streaming server may take.
const TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    Exec,
    Attach,
}

/// The options of an exec or attach request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StreamOptions {
    pub command: Vec<String>,
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

fn truthy(v: &str) -> bool {
    matches!(v, "1" | "true" | "True" | "TRUE" | "t" | "T")
}

impl StreamOptions {
    /// Parses the query (`command` repeated, `stdin`, `stdout`, `stderr`, `tty`; upstream's
    /// older `input`/`output`/`error` too). Errors are 400 messages.
    pub fn parse(query: Option<&str>, kind: Kind) -> Result<StreamOptions, String> {
        let mut o = StreamOptions::default();
        for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
            match k.as_ref() {
                "command" => o.command.push(v.into_owned()),
                "stdin" | "input" => o.stdin = truthy(&v),
                "stdout" | "output" => o.stdout = truthy(&v),
                "stderr" | "error" => o.stderr = truthy(&v),
                "tty" => o.tty = truthy(&v),
                _ => {}
            }
        }
        if !(o.stdin || o.stdout || o.stderr) {
            return Err("you must specify at least 1 of stdin, stdout, stderr".into());
        }
        if kind == Kind::Exec && o.command.is_empty() {
            return Err("you must specify a command".into());
        }
        // With a terminal, stderr is merged into stdout (the runtime refuses both).
        if o.tty {
            o.stderr = false;
        }
        Ok(o)
    }
}

/// The ports of a port-forward request's query (`ports=80&ports=8080` or `ports=80,8080`).
pub fn parse_ports(query: Option<&str>) -> Result<Vec<i32>, String> {
    let mut out = Vec::new();
    for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        if k == "ports" || k == "port" {
            for p in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                let n: u16 = p.parse().map_err(|_| format!("invalid port {p:?}"))?;
                if n == 0 {
                    return Err(format!("invalid port {p:?}"));
                }
                out.push(i32::from(n));
            }
        }
    }
    Ok(out)
}

/// A failed answer: status and message.
type Failure = (StatusCode, String);

fn failed((code, msg): Failure) -> Response<Body> {
    text(code, msg)
}

async fn runtime(state: &State) -> Result<crate::cri::Runtime, Failure> {
    crate::cri::connect(&state.runtime_socket)
        .await
        .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, format!("container runtime: {e}")))
}

type Answer = Result<Result<tonic::Response<String>, tonic::Status>, tokio::time::error::Elapsed>;

fn cri_error(what: &str, r: Answer) -> Result<String, Failure> {
    match r {
        Ok(Ok(url)) => Ok(url.into_inner()),
        Ok(Err(s)) => {
            let code = match s.code() {
                tonic::Code::NotFound => StatusCode::NOT_FOUND,
                tonic::Code::InvalidArgument | tonic::Code::FailedPrecondition => StatusCode::BAD_REQUEST,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            };
            Err((code, format!("{what}: {}", s.message())))
        }
        Err(_) => Err((StatusCode::GATEWAY_TIMEOUT, format!("{what}: the container runtime did not answer"))),
    }
}

/// How a client asked to upgrade an exec, attach or port-forward request.
#[derive(Debug, Clone, PartialEq)]
pub enum Upgrade {
    /// WebSocket offering `protocol` (one the agent terminates itself); the handshake key.
    WebSocket { protocol: &'static str, key: String },
    /// Anything else (SPDY/3.1, WebSocket without a protocol the agent serves, no upgrade):
    /// forwarded to the runtime as it is. The label of the stream counter.
    PassThrough(&'static str),
}

/// The tokens of every `name` header (comma-separated lists, several headers).
fn tokens<'a>(headers: &'a http::HeaderMap, name: &header::HeaderName) -> impl Iterator<Item = &'a str> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

impl Upgrade {
    /// Decides from the request headers; `serves` is the WebSocket subprotocol the agent
    /// terminates on this route.
    pub fn of(headers: &http::HeaderMap, serves: &'static str) -> Upgrade {
        let upgrade: Vec<&str> = tokens(headers, &header::UPGRADE).collect();
        let websocket = upgrade.iter().any(|u| u.eq_ignore_ascii_case("websocket"));
        if !websocket {
            return Upgrade::PassThrough(if upgrade.is_empty() { "none" } else { "spdy" });
        }
        let key = headers.get(header::SEC_WEBSOCKET_KEY).and_then(|k| k.to_str().ok()).map(str::trim);
        let version_13 = tokens(headers, &header::SEC_WEBSOCKET_VERSION).any(|v| v == "13");
        let offered = tokens(headers, &header::SEC_WEBSOCKET_PROTOCOL).any(|p| p == serves);
        match key {
            Some(key) if offered && version_13 && !key.is_empty() => {
                Upgrade::WebSocket { protocol: serves, key: key.to_string() }
            }
            _ => Upgrade::PassThrough("websocket"),
        }
    }
}

/// `/exec/...` and `/attach/...`.
pub(crate) async fn exec(
    state: &Arc<State>,
    kind: Kind,
    namespace: &str,
    pod: &str,
    container: &str,
    req: Request<Incoming>,
) -> Response<Body> {
    let opts = match StreamOptions::parse(req.uri().query(), kind) {
        Ok(o) => o,
        Err(m) => return text(StatusCode::BAD_REQUEST, m),
    };
    let Some(c) = state.lookup.container(namespace, pod, container) else {
        return not_found(state, namespace, pod, container);
    };
    if !c.running {
        return text(StatusCode::BAD_REQUEST, format!("container {container:?} in pod {pod:?} is not running"));
    }
    let mut rt = match runtime(state).await {
        Ok(r) => r,
        Err(f) => return failed(f),
    };
    let route = match kind {
        Kind::Exec => "exec",
        Kind::Attach => "attach",
    };
    let upgrade = Upgrade::of(req.headers(), wsbridge::V5);
    let url = match kind {
        Kind::Exec => {
            let r = ExecRequest {
                container_id: c.id,
                cmd: opts.command.clone(),
                tty: opts.tty,
                stdin: opts.stdin,
                stdout: opts.stdout,
                stderr: opts.stderr,
            };
            cri_error(
                "failed to exec in container",
                tokio::time::timeout(TIMEOUT, rt.runtime.exec(r)).await.map(|r| r.map(|x| x.map(|e| e.url))),
            )
        }
        Kind::Attach => {
            let r = AttachRequest {
                container_id: c.id,
                stdin: opts.stdin,
                tty: opts.tty,
                stdout: opts.stdout,
                stderr: opts.stderr,
            };
            cri_error(
                "failed to attach to container",
                tokio::time::timeout(TIMEOUT, rt.runtime.attach(r)).await.map(|r| r.map(|x| x.map(|e| e.url))),
            )
        }
    };
    let url = match url {
        Ok(url) => url,
        Err(f) => return failed(f),
    };
    let resp = match upgrade {
        Upgrade::WebSocket { protocol, key } => v5(&url, opts, protocol, &key, req).await,
        Upgrade::PassThrough(label) => proxy(&url, req).await.map(|r| (r, label)),
    };
    count(state, route, resp)
}

fn count(
    state: &State,
    route: &'static str,
    resp: Result<(Response<Body>, &'static str), Response<Body>>,
) -> Response<Body> {
    match resp {
        Ok((r, protocol)) => {
            if r.status() == StatusCode::SWITCHING_PROTOCOLS {
                state.streams.add(route, protocol);
            }
            r
        }
        Err(r) => r,
    }
}

/// `/portForward/{ns}/{pod}`.
pub(crate) async fn port_forward(
    state: &Arc<State>,
    namespace: &str,
    pod: &str,
    req: Request<Incoming>,
) -> Response<Body> {
    let ports = match parse_ports(req.uri().query()) {
        Ok(p) => p,
        Err(m) => return text(StatusCode::BAD_REQUEST, m),
    };
    let Some(sandbox) = state.lookup.sandbox(namespace, pod) else {
        return text(StatusCode::NOT_FOUND, format!("pod {pod:?} not found"));
    };
    let mut rt = match runtime(state).await {
        Ok(r) => r,
        Err(f) => return failed(f),
    };
    let r = PortForwardRequest { pod_sandbox_id: sandbox, port: ports };
    let url = cri_error(
        "failed to port-forward",
        tokio::time::timeout(TIMEOUT, rt.runtime.port_forward(r)).await.map(|r| r.map(|x| x.map(|e| e.url))),
    );
    let url = match url {
        Ok(url) => url,
        Err(f) => return failed(f),
    };
    let resp = match Upgrade::of(req.headers(), wsbridge::PORT_FORWARD_TUNNEL) {
        Upgrade::WebSocket { protocol, key } => tunnel(&url, protocol, &key, req).await,
        Upgrade::PassThrough(label) => proxy(&url, req).await.map(|r| (r, label)),
    };
    count(state, "portForward", resp)
}

/// An HTTP/1.1 connection to the runtime's streaming server, and the request path.
async fn dial(
    url: &str,
) -> Result<(hyper::client::conn::http1::SendRequest<Empty<bytes::Bytes>>, String, String), Response<Body>> {
    let bad_gateway = |m: String| text(StatusCode::BAD_GATEWAY, m);
    let uri: http::Uri = match url.parse() {
        Ok(u) => u,
        Err(e) => return Err(bad_gateway(format!("the runtime's streaming URL {url:?}: {e}"))),
    };
    if uri.scheme_str() != Some("http") {
        return Err(bad_gateway(format!("the runtime's streaming URL {url:?} is not http")));
    }
    let Some(authority) = uri.authority().cloned() else {
        return Err(bad_gateway(format!("the runtime's streaming URL {url:?} has no host")));
    };
    let path = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/").to_string();
    let tcp = match tokio::time::timeout(TIMEOUT, tokio::net::TcpStream::connect(authority.as_str())).await {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => return Err(bad_gateway(format!("dial the runtime's streaming server {authority}: {e}"))),
        Err(_) => return Err(bad_gateway(format!("dial the runtime's streaming server {authority}: timed out"))),
    };
    let (sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await {
        Ok(x) => x,
        Err(e) => return Err(bad_gateway(format!("the runtime's streaming server: {e}"))),
    };
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "streaming server connection ended");
        }
    });
    Ok((sender, authority.to_string(), path))
}

/// The runtime's answer, passed to the client as it is (when it did not upgrade).
fn passed_through(resp: Response<Incoming>) -> Response<Body> {
    let (parts, body) = resp.into_parts();
    Response::from_parts(parts, body.map_err(std::io::Error::other).boxed())
}

/// Upgrades a connection to the runtime's streaming `url` to SPDY/3.1 with `protocol`
/// (`X-Stream-Protocol-Version`); a refusal is the runtime's answer, to pass on.
async fn spdy_upgrade(url: &str, protocol: &str) -> Result<hyper::upgrade::Upgraded, Response<Body>> {
    let (mut sender, authority, path) = dial(url).await?;
    let out = Request::builder()
        .method(http::Method::POST)
        .uri(path)
        .header(header::HOST, authority)
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, "SPDY/3.1")
        .header("X-Stream-Protocol-Version", protocol)
        .body(Empty::<bytes::Bytes>::new())
        .map_err(|e| text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    let mut resp = match tokio::time::timeout(TIMEOUT, sender.send_request(out)).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return Err(text(StatusCode::BAD_GATEWAY, format!("the runtime's streaming server: {e}"))),
        Err(_) => return Err(text(StatusCode::GATEWAY_TIMEOUT, "the runtime's streaming server did not answer")),
    };
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        tracing::debug!(status = %resp.status(), "the streaming server did not upgrade");
        return Err(passed_through(resp));
    }
    let chosen = resp.headers().get("X-Stream-Protocol-Version").and_then(|v| v.to_str().ok()).unwrap_or(protocol);
    if chosen != protocol {
        return Err(text(
            StatusCode::BAD_GATEWAY,
            format!("the runtime's streaming server chose protocol {chosen:?}, not {protocol:?}"),
        ));
    }
    hyper::upgrade::on(&mut resp)
        .await
        .map_err(|e| text(StatusCode::BAD_GATEWAY, format!("the runtime's streaming server: {e}")))
}

/// The 101 answer to a WebSocket handshake with `key`, choosing `protocol`.
fn websocket_accept(protocol: &'static str, key: &str) -> Response<Body> {
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, "websocket")
        .header(header::SEC_WEBSOCKET_ACCEPT, accept)
        .header(header::SEC_WEBSOCKET_PROTOCOL, protocol)
        .body(super::full(bytes::Bytes::new()))
        .unwrap_or_else(|e| text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
}

async fn server_websocket(
    upgraded: hyper::upgrade::OnUpgrade,
) -> Option<tokio_tungstenite::WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>> {
    match upgraded.await {
        Ok(u) => Some(
            tokio_tungstenite::WebSocketStream::from_raw_socket(
                TokioIo::new(u),
                tokio_tungstenite::tungstenite::protocol::Role::Server,
                None,
            )
            .await,
        ),
        Err(e) => {
            tracing::debug!(error = %e, "the client's upgrade failed");
            None
        }
    }
}

/// WebSocket `v5.channel.k8s.io`: a SPDY/3.1 `v4.channel.k8s.io` session with the runtime,
/// its streams set up before the client gets its 101, then [`wsbridge::bridge`].
async fn v5(
    url: &str,
    opts: StreamOptions,
    protocol: &'static str,
    key: &str,
    mut req: Request<Incoming>,
) -> Result<(Response<Body>, &'static str), Response<Body>> {
    let io = TokioIo::new(spdy_upgrade(url, wsbridge::SPDY_V4).await?);
    let session = match tokio::time::timeout(TIMEOUT, wsbridge::Session::open(io, &opts)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(text(StatusCode::BAD_GATEWAY, e.to_string())),
        Err(_) => {
            return Err(text(StatusCode::GATEWAY_TIMEOUT, "the runtime's streaming server did not set up the streams"))
        }
    };
    let client = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        if let Some(ws) = server_websocket(client).await {
            let end = wsbridge::bridge(ws, session).await;
            tracing::debug!(?end, "exec/attach session ended");
        }
    });
    Ok((websocket_accept(protocol, key), protocol))
}

/// WebSocket `SPDY/3.1+portforward.k8s.io`: a plain SPDY upgrade to the runtime, then
/// [`wsbridge::tunnel`].
async fn tunnel(
    url: &str,
    protocol: &'static str,
    key: &str,
    mut req: Request<Incoming>,
) -> Result<(Response<Body>, &'static str), Response<Body>> {
    let runtime = TokioIo::new(spdy_upgrade(url, "portforward.k8s.io").await?);
    let client = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        if let Some(ws) = server_websocket(client).await {
            wsbridge::tunnel(ws, runtime).await;
            tracing::debug!("port-forward tunnel ended");
        }
    });
    Ok((websocket_accept(protocol, key), protocol))
}

/// Forwards `req` to the runtime's streaming `url` and splices after a 101.
async fn proxy(url: &str, mut req: Request<Incoming>) -> Result<Response<Body>, Response<Body>> {
    let (mut sender, authority, path) = dial(url).await?;
    let upgrade = req.headers().contains_key(header::UPGRADE);
    let mut out = Request::builder().method(req.method().clone()).uri(path);
    for (k, v) in req.headers() {
        if k == header::AUTHORIZATION || k == header::HOST || k == header::CONTENT_LENGTH {
            continue;
        }
        out = out.header(k, v);
    }
    out = out.header(header::HOST, authority.as_str());
    let out = match out.body(Empty::<bytes::Bytes>::new()) {
        Ok(o) => o,
        Err(e) => return Err(text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())),
    };
    let mut resp = match sender.send_request(out).await {
        Ok(r) => r,
        Err(e) => return Err(text(StatusCode::BAD_GATEWAY, format!("the runtime's streaming server: {e}"))),
    };
    if upgrade && resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        let mut client = Response::builder().status(StatusCode::SWITCHING_PROTOCOLS);
        for (k, v) in resp.headers() {
            client = client.header(k, v);
        }
        let upstream = hyper::upgrade::on(&mut resp);
        let downstream = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            match (downstream.await, upstream.await) {
                (Ok(d), Ok(u)) => {
                    let mut d = TokioIo::new(d);
                    let mut u = TokioIo::new(u);
                    let _ = tokio::io::copy_bidirectional(&mut d, &mut u).await;
                }
                (d, u) => {
                    tracing::debug!(client = d.is_ok(), runtime = u.is_ok(), "upgrade failed")
                }
            }
        });
        return Ok(client
            .body(super::full(bytes::Bytes::new()))
            .unwrap_or_else(|e| text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())));
    }
    tracing::debug!(status = %resp.status(), "the streaming server did not upgrade");
    Ok(passed_through(resp))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn exec_options() {
        let o = StreamOptions::parse(Some("command=sh&command=-c&command=echo%20hi&stdout=true&stderr=1&tty=false"), Kind::Exec)
            .unwrap();
        assert_eq!(
            o,
            StreamOptions {
                command: vec!["sh".into(), "-c".into(), "echo hi".into()],
                stdout: true,
                stderr: true,
                ..Default::default()
            }
        );
        let t = StreamOptions::parse(Some("command=sh&stdin=true&stdout=true&stderr=true&tty=true"), Kind::Exec).unwrap();
        assert!(t.tty && t.stdin && !t.stderr);
        assert_eq!(
            StreamOptions::parse(Some("command=ls"), Kind::Exec).unwrap_err(),
            "you must specify at least 1 of stdin, stdout, stderr"
        );
        assert!(StreamOptions::parse(Some("stdout=true"), Kind::Exec).is_err());
        assert!(StreamOptions::parse(Some("stdout=true"), Kind::Attach).is_ok());
    }

    #[test]
    fn upgrades() {
        let h = |pairs: &[(&str, &str)]| {
            let mut m = http::HeaderMap::new();
            for (k, v) in pairs {
                m.append(http::HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
            }
            m
        };
        let ws = |protocols: &str| {
            h(&[
                ("connection", "Upgrade"),
                ("upgrade", "websocket"),
                ("sec-websocket-version", "13"),
                ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
                ("sec-websocket-protocol", protocols),
            ])
        };
        let v5 = Upgrade::WebSocket { protocol: wsbridge::V5, key: "dGhlIHNhbXBsZSBub25jZQ==".into() };
        assert_eq!(Upgrade::of(&ws("v5.channel.k8s.io"), wsbridge::V5), v5);
        assert_eq!(Upgrade::of(&ws("v4.channel.k8s.io, v5.channel.k8s.io,base64.channel.k8s.io"), wsbridge::V5), v5);
        let mut two = ws("v4.channel.k8s.io");
        two.append(header::SEC_WEBSOCKET_PROTOCOL, "v5.channel.k8s.io".parse().unwrap());
        assert_eq!(Upgrade::of(&two, wsbridge::V5), v5);
        assert_eq!(
            Upgrade::of(&ws("v4.channel.k8s.io, channel.k8s.io"), wsbridge::V5),
            Upgrade::PassThrough("websocket")
        );
        assert_eq!(
            Upgrade::of(&ws("v5.channel.k8s.io"), wsbridge::PORT_FORWARD_TUNNEL),
            Upgrade::PassThrough("websocket")
        );
        assert!(matches!(
            Upgrade::of(&ws("SPDY/3.1+portforward.k8s.io"), wsbridge::PORT_FORWARD_TUNNEL),
            Upgrade::WebSocket { protocol: wsbridge::PORT_FORWARD_TUNNEL, .. }
        ));
        let spdy = h(&[
            ("connection", "Upgrade"),
            ("upgrade", "SPDY/3.1"),
            ("x-stream-protocol-version", "v4.channel.k8s.io"),
        ]);
        assert_eq!(Upgrade::of(&spdy, wsbridge::V5), Upgrade::PassThrough("spdy"));
        assert_eq!(Upgrade::of(&h(&[]), wsbridge::V5), Upgrade::PassThrough("none"));
        // No key: not a handshake the agent can answer.
        let mut nokey = ws("v5.channel.k8s.io");
        nokey.remove(header::SEC_WEBSOCKET_KEY);
        assert_eq!(Upgrade::of(&nokey, wsbridge::V5), Upgrade::PassThrough("websocket"));
    }

    #[test]
    fn ports() {
        assert_eq!(parse_ports(Some("ports=80&ports=8080,9090")).unwrap(), [80, 8080, 9090]);
        assert_eq!(parse_ports(None).unwrap(), Vec::<i32>::new());
        assert!(parse_ports(Some("ports=0")).is_err());
        assert!(parse_ports(Some("ports=x")).is_err());
    }
}
