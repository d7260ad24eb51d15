//! exec, attach and port-forward: the runtime's streaming server does the work.
//!
//! The agent asks the runtime for a one-time URL (CRI Exec, Attach, PortForward), then forwards
//! the client's request, with its upgrade headers (`Connection`, `Upgrade`,
//! `X-Stream-Protocol-Version`, `Sec-WebSocket-*`), to that URL and, once the runtime answers
//! 101, splices the client's connection with the runtime's. Any other answer is passed
//! through as it is: containerd 1.6's streaming server speaks SPDY/3.1 (`v4.channel.k8s.io`
//! and older for exec/attach, `portforward.k8s.io` for port-forward) and WebSocket only up to
//! `v4.channel.k8s.io`, so it refuses kubectl's WebSocket `v5.channel.k8s.io` and
//! `SPDY/3.1+portforward.k8s.io` tunnelling with a non-101 answer, which is exactly what makes
//! kubectl fall back to SPDY.

use std::sync::Arc;
use std::time::Duration;

use http::{header, Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Empty};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use k8s_cri::v1::{AttachRequest, ExecRequest, PortForwardRequest};

use super::{not_found, text, Body, State};

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
        return text(
            StatusCode::BAD_REQUEST,
            format!("container {container:?} in pod {pod:?} is not running"),
        );
    }
    let mut rt = match runtime(state).await {
        Ok(r) => r,
        Err(f) => return failed(f),
    };
    let url = match kind {
        Kind::Exec => {
            let r = ExecRequest {
                container_id: c.id,
                cmd: opts.command,
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
    match url {
        Ok(url) => proxy(&url, req).await,
        Err(f) => failed(f),
    }
}

/// `/portForward/{ns}/{pod}`.
pub(crate) async fn port_forward(state: &Arc<State>, namespace: &str, pod: &str, req: Request<Incoming>) -> Response<Body> {
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
    match url {
        Ok(url) => proxy(&url, req).await,
        Err(f) => failed(f),
    }
}

/// Forwards `req` to the runtime's streaming `url` and splices after a 101.
async fn proxy(url: &str, mut req: Request<Incoming>) -> Response<Body> {
    let bad_gateway = |m: String| text(StatusCode::BAD_GATEWAY, m);
    let uri: http::Uri = match url.parse() {
        Ok(u) => u,
        Err(e) => return bad_gateway(format!("the runtime's streaming URL {url:?}: {e}")),
    };
    if uri.scheme_str() != Some("http") {
        return bad_gateway(format!("the runtime's streaming URL {url:?} is not http"));
    }
    let Some(authority) = uri.authority().cloned() else {
        return bad_gateway(format!("the runtime's streaming URL {url:?} has no host"));
    };
    let path = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/").to_string();
    let tcp = match tokio::time::timeout(TIMEOUT, tokio::net::TcpStream::connect(authority.as_str())).await {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => return bad_gateway(format!("dial the runtime's streaming server {authority}: {e}")),
        Err(_) => return bad_gateway(format!("dial the runtime's streaming server {authority}: timed out")),
    };
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await {
        Ok(x) => x,
        Err(e) => return bad_gateway(format!("the runtime's streaming server: {e}")),
    };
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "streaming server connection ended");
        }
    });
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
        Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let mut resp = match sender.send_request(out).await {
        Ok(r) => r,
        Err(e) => return bad_gateway(format!("the runtime's streaming server: {e}")),
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
                (d, u) => tracing::debug!(client = d.is_ok(), runtime = u.is_ok(), "upgrade failed"),
            }
        });
        return client
            .body(super::full(bytes::Bytes::new()))
            .unwrap_or_else(|e| text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()));
    }
    tracing::debug!(status = %resp.status(), "the streaming server did not upgrade");
    let (parts, body) = resp.into_parts();
    Response::from_parts(parts, body.map_err(std::io::Error::other).boxed())
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
    fn ports() {
        assert_eq!(parse_ports(Some("ports=80&ports=8080,9090")).unwrap(), [80, 8080, 9090]);
        assert_eq!(parse_ports(None).unwrap(), Vec::<i32>::new());
        assert!(parse_ports(Some("ports=0")).is_err());
        assert!(parse_ports(Some("ports=x")).is_err());
    }
}
