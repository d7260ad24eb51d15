//! Proxying of pods/log, pods/exec, pods/attach and pods/portforward to the agent (kubelet) on
//! the pod's node, including the HTTP upgrade (SPDY/3.1 or WebSocket) that exec, attach and
//! port-forward use: the server forwards the upgrade request, and once the agent answers 101 it
//! splices the two connections. And the nodes/proxy subresource
//! (`/api/v1/nodes/<node>/proxy/<path>`): GET requests passed to the node's agent as they are,
//! its answer passed back as it is.

use std::sync::Arc;

use http::{header, Request, Response};
use http_body_util::{BodyExt as _, Empty};
use hyper::body::Incoming;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use serde_json::Value;

use crate::api::Api;
use crate::error::ApiError;
use crate::resources::{self, Sub};
use crate::server::Body;

/// How the server reaches agents: TLS with the server's kubelet-client certificate. Like
/// upstream without --kubelet-certificate-authority, the agent's serving certificate is not
/// verified.
#[derive(Clone)]
pub struct KubeletClient {
    tls: Arc<rustls::ClientConfig>,
}

#[derive(Debug)]
struct AcceptAny(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AcceptAny {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

impl KubeletClient {
    pub fn new(cert_pem: &str, key_pem: &str) -> Result<KubeletClient, String> {
        use rustls::pki_types::pem::PemObject as _;
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
            .collect::<Result<_, _>>()
            .map_err(|e| format!("kubelet client certificate: {e}"))?;
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| format!("kubelet client key: {e}"))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAny(provider)))
            .with_client_auth_cert(certs, key)
            .map_err(|e| format!("kubelet client certificate: {e}"))?;
        Ok(KubeletClient { tls: Arc::new(tls) })
    }
}

impl KubeletClient {
    /// Sends `req` (a path and headers, no body) to the agent at `host:port` over TLS with the
    /// server's client certificate; the agent's answer, unread.
    pub async fn send(
        &self,
        host: &str,
        port: u16,
        req: Request<Empty<bytes::Bytes>>,
    ) -> Result<Response<Incoming>, ApiError> {
        let tcp = tokio::net::TcpStream::connect((host, port))
            .await
            .map_err(|e| ApiError::service_unavailable(format!("error dialing backend: dial tcp {host}:{port}: {e}")))?;
        let server_name =
            ServerName::try_from(host.to_string()).map_err(|e| ApiError::internal(format!("agent address {host}: {e}")))?;
        let tls = tokio_rustls::TlsConnector::from(self.tls.clone())
            .connect(server_name, tcp)
            .await
            .map_err(|e| ApiError::service_unavailable(format!("error dialing backend: tls: {e}")))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .map_err(|e| ApiError::service_unavailable(format!("error dialing backend: {e}")))?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "agent connection ended");
            }
        });
        sender
            .send_request(req)
            .await
            .map_err(|e| ApiError::service_unavailable(format!("error talking to the agent: {e}")))
    }
}

/// `/api/v1/nodes/<node>/proxy[/<path>]`: the node's name and the agent path (`/` and the rest,
/// its query kept); None for any other path.
pub fn node_proxy_path<'a>(path: &'a str, query: Option<&str>) -> Option<(&'a str, String)> {
    let rest = path.strip_prefix("/api/v1/nodes/")?;
    let (node, tail) = rest.split_once('/')?;
    let tail = tail.strip_prefix("proxy")?;
    if node.is_empty() || !(tail.is_empty() || tail.starts_with('/')) {
        return None;
    }
    let mut target = if tail.is_empty() { "/".to_string() } else { tail.to_string() };
    if let Some(q) = query.filter(|q| !q.is_empty()) {
        target.push('?');
        target.push_str(q);
    }
    Some((node, target))
}

/// nodes/proxy: a GET to `path` on the node's agent, answered as the agent answers (status,
/// headers, body). An unknown node is NotFound; a node without an address to reach its agent
/// is 503.
pub async fn proxy_node(api: &Api, kubelet: &KubeletClient, node_name: &str, path: &str, req: Request<Incoming>) -> Result<Response<Body>, ApiError> {
    if req.method() != http::Method::GET && req.method() != http::Method::HEAD {
        return Err(ApiError::method_not_allowed(req.method().as_str()));
    }
    let nodes = resources::find("", "v1", "nodes").ok_or_else(|| ApiError::internal("no nodes"))?;
    let node = api.get(nodes, None, node_name).await?.json()?;
    // (kubelet_address takes any address there is: only a node without one has none)
    let (host, port) = kubelet_address(&node)
        .ok_or_else(|| ApiError::service_unavailable("no preferred addresses found; known addresses: []"))?;
    let mut out = Request::builder().method(req.method().clone()).uri(path);
    for (k, v) in req.headers() {
        if k == header::AUTHORIZATION || k == header::HOST || k == header::CONNECTION || k == header::UPGRADE {
            continue;
        }
        out = out.header(k, v);
    }
    out = out.header(header::HOST, format!("{host}:{port}"));
    let out = out.body(Empty::<bytes::Bytes>::new()).map_err(ApiError::internal)?;
    let resp = kubelet.send(&host, port, out).await?;
    let (mut parts, body) = resp.into_parts();
    for h in [header::CONNECTION, header::TRANSFER_ENCODING, header::UPGRADE] {
        parts.headers.remove(h);
    }
    parts.headers.remove("keep-alive");
    Ok(Response::from_parts(parts, body.map_err(std::io::Error::other).boxed()))
}

/// Where the agent of a node listens: its InternalIP (or first address) and the kubelet port.
pub fn kubelet_address(node: &Value) -> Option<(String, u16)> {
    let addrs = node.pointer("/status/addresses").and_then(|a| a.as_array())?;
    let pick = |t: &str| addrs.iter().find(|a| a["type"] == t).and_then(|a| a["address"].as_str());
    let host = pick("InternalIP").or_else(|| pick("Hostname")).or_else(|| addrs.first()?.get("address")?.as_str())?;
    let port = node
        .pointer("/status/daemonEndpoints/kubeletEndpoint/Port")
        .and_then(|p| p.as_u64())
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p > 0)
        .unwrap_or(10250);
    Some((host.to_string(), port))
}

/// The agent path for a subresource request, choosing the container as upstream does.
pub fn agent_path(pod: &Value, ns: &str, name: &str, sub: Sub, query: Option<&str>) -> Result<String, ApiError> {
    let mut params: Vec<(String, String)> = query
        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default();
    let container = params.iter().find(|(k, _)| k == "container").map(|(_, v)| v.clone());
    params.retain(|(k, _)| k != "container");
    let rest: String = form_urlencoded::Serializer::new(String::new()).extend_pairs(params.iter()).finish();
    let qs = if rest.is_empty() { String::new() } else { format!("?{rest}") };
    if sub == Sub::PortForward {
        return Ok(format!("/portForward/{ns}/{name}{qs}"));
    }
    let containers: Vec<&str> = pod
        .pointer("/spec/containers")
        .and_then(|c| c.as_array())
        .into_iter()
        .flatten()
        .filter_map(|c| c.get("name")?.as_str())
        .collect();
    let container = match container {
        Some(c) => {
            let all: Vec<&str> = ["containers", "initContainers", "ephemeralContainers"]
                .iter()
                .filter_map(|k| pod.pointer(&format!("/spec/{k}")).and_then(|c| c.as_array()))
                .flatten()
                .filter_map(|c| c.get("name")?.as_str())
                .collect();
            if !all.contains(&c.as_str()) {
                return Err(ApiError::bad_request(format!("container {c} is not valid for pod {name}")));
            }
            c
        }
        None => match pod
            .pointer("/metadata/annotations/kubectl.kubernetes.io~1default-container")
            .and_then(|d| d.as_str())
        {
            Some(d) => d.to_string(),
            None if containers.len() == 1 => containers[0].to_string(),
            None => {
                return Err(ApiError::bad_request(format!(
                    "a container name must be specified for pod {name}, choose one of: [{}]",
                    containers.join(" ")
                )))
            }
        },
    };
    let prefix = match sub {
        Sub::Log => "containerLogs",
        Sub::Exec => "exec",
        Sub::Attach => "attach",
        _ => return Err(ApiError::no_route()),
    };
    Ok(format!("/{prefix}/{ns}/{name}/{container}{qs}"))
}

pub async fn proxy_pod_subresource(
    api: &Api,
    kubelet: &KubeletClient,
    ns: &str,
    name: &str,
    sub: Sub,
    mut req: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let pods = resources::find("", "v1", "pods").ok_or_else(|| ApiError::internal("no pods"))?;
    let nodes = resources::find("", "v1", "nodes").ok_or_else(|| ApiError::internal("no nodes"))?;
    let pod = api.get(pods, Some(ns), name).await?.json()?;
    let node_name = pod
        .pointer("/spec/nodeName")
        .and_then(|n| n.as_str())
        .filter(|n| !n.is_empty())
        .ok_or_else(|| ApiError::bad_request(format!("pod {name} does not have a host assigned")))?
        .to_string();
    let node = api.get(nodes, None, &node_name).await?.json()?;
    let (host, port) = kubelet_address(&node)
        .ok_or_else(|| ApiError::bad_request(format!("node {node_name} has no address to reach its agent")))?;
    let path = agent_path(&pod, ns, name, sub, req.uri().query())?;

    let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| ApiError::service_unavailable(format!("error dialing backend: dial tcp {host}:{port}: {e}")))?;
    let server_name = ServerName::try_from(host.clone())
        .map_err(|e| ApiError::internal(format!("agent address {host}: {e}")))?;
    let tls = tokio_rustls::TlsConnector::from(kubelet.tls.clone())
        .connect(server_name, tcp)
        .await
        .map_err(|e| ApiError::service_unavailable(format!("error dialing backend: tls: {e}")))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
        .await
        .map_err(|e| ApiError::service_unavailable(format!("error dialing backend: {e}")))?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "agent connection ended");
        }
    });

    let upgrade = req.headers().get(header::UPGRADE).is_some();
    let mut out = Request::builder().method(req.method().clone()).uri(&path);
    for (k, v) in req.headers() {
        if k == header::AUTHORIZATION || k == header::HOST {
            continue;
        }
        out = out.header(k, v);
    }
    out = out.header(header::HOST, format!("{host}:{port}"));
    let out = out
        .body(Empty::<bytes::Bytes>::new())
        .map_err(ApiError::internal)?;
    let mut resp = sender
        .send_request(out)
        .await
        .map_err(|e| ApiError::service_unavailable(format!("error talking to the agent: {e}")))?;

    if upgrade && resp.status() == http::StatusCode::SWITCHING_PROTOCOLS {
        let mut client_resp = Response::builder().status(101);
        for (k, v) in resp.headers() {
            client_resp = client_resp.header(k, v);
        }
        let upstream = hyper::upgrade::on(&mut resp);
        let downstream = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            match (downstream.await, upstream.await) {
                (Ok(d), Ok(u)) => {
                    let mut d = hyper_util::rt::TokioIo::new(d);
                    let mut u = hyper_util::rt::TokioIo::new(u);
                    let _ = tokio::io::copy_bidirectional(&mut d, &mut u).await;
                }
                (d, u) => tracing::debug!(downstream = d.is_ok(), upstream = u.is_ok(), "upgrade failed"),
            }
        });
        return client_resp
            .body(http_body_util::Empty::new().map_err(|never| match never {}).boxed())
            .map_err(ApiError::internal);
    }
    let json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !upgrade && resp.status().as_u16() >= 400 && !json {
        // As upstream's API server: the agent's plain-text error becomes a Status, so that
        // kubectl prints it (e.g. `previous terminated container "c" in pod "p" not found`).
        let code = resp.status().as_u16();
        let bytes = http_body_util::Limited::new(resp.into_body(), 64 * 1024)
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let text = String::from_utf8_lossy(&bytes).trim().to_string();
        return Err(ApiError::new(code, agent_error_reason(code), text));
    }
    let (parts, body) = resp.into_parts();
    let body = body.map_err(std::io::Error::other).boxed();
    Ok(Response::from_parts(parts, body))
}

/// The Status reason for an agent's error code.
fn agent_error_reason(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        409 => "Conflict",
        429 => "TooManyRequests",
        503 => "ServiceUnavailable",
        _ => "InternalError",
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn paths_and_container_choice() {
        let pod = json!({"spec":{"containers":[{"name":"app"}]}});
        assert_eq!(agent_path(&pod, "ns", "p", Sub::Log, Some("follow=true")).unwrap(), "/containerLogs/ns/p/app?follow=true");
        assert_eq!(
            agent_path(&pod, "ns", "p", Sub::Exec, Some("command=ls&command=-l&container=app&stdout=true")).unwrap(),
            "/exec/ns/p/app?command=ls&command=-l&stdout=true"
        );
        assert_eq!(agent_path(&pod, "ns", "p", Sub::PortForward, Some("ports=80")).unwrap(), "/portForward/ns/p?ports=80");
        let two = json!({"spec":{"containers":[{"name":"a"},{"name":"b"}]}});
        let e = agent_path(&two, "ns", "p", Sub::Log, None).unwrap_err();
        assert_eq!(e.message, "a container name must be specified for pod p, choose one of: [a b]");
        assert_eq!(agent_path(&two, "ns", "p", Sub::Log, Some("container=x")).unwrap_err().code, 400);
    }

    #[test]
    fn node_proxy_paths() {
        assert_eq!(node_proxy_path("/api/v1/nodes/n1/proxy/metrics/resource", None), Some(("n1", "/metrics/resource".into())));
        assert_eq!(node_proxy_path("/api/v1/nodes/n1/proxy/stats/summary", Some("only_cpu_and_memory=true")), Some(("n1", "/stats/summary?only_cpu_and_memory=true".into())));
        assert_eq!(node_proxy_path("/api/v1/nodes/n1/proxy", None), Some(("n1", "/".into())));
        assert_eq!(node_proxy_path("/api/v1/nodes/n1/proxy/", None), Some(("n1", "/".into())));
        assert_eq!(node_proxy_path("/api/v1/nodes/n1/proxyx", None), None);
        assert_eq!(node_proxy_path("/api/v1/nodes/n1/status", None), None);
        assert_eq!(node_proxy_path("/api/v1/nodes/n1", None), None);
        assert_eq!(node_proxy_path("/api/v1/nodes//proxy/x", None), None);
        assert_eq!(node_proxy_path("/api/v1/namespaces/a/pods/b/proxy", None), None);
    }

    #[test]
    fn node_address() {
        let node = json!({"status":{"addresses":[{"type":"Hostname","address":"n1"},{"type":"InternalIP","address":"10.0.0.5"}],
            "daemonEndpoints":{"kubeletEndpoint":{"Port":10255}}}});
        assert_eq!(kubelet_address(&node), Some(("10.0.0.5".into(), 10255)));
        assert_eq!(kubelet_address(&json!({"status":{"addresses":[{"type":"Hostname","address":"h"}]}})), Some(("h".into(), 10250)));
        assert_eq!(kubelet_address(&json!({})), None);
    }
}
