//! The API client of every node binary (agent, netd, proxy, csi, dns): its configuration from a
//! kubeconfig (or in-cluster, or the default kubeconfig), and failover across several API
//! servers.
//!
//! Several ferro-control-plane replicas serve the same API (on etcd). A node binary given
//! `--api-servers https://a:6443,https://b:6443` talks to one of them with the kubeconfig's
//! credentials and CA; when a request to it fails below HTTP (connection refused or reset,
//! TLS, timeout: the server is gone), that request's error goes back to its caller as before
//! and the next request goes to the next server. Every loop of the node binaries already
//! retries (watchers re-watch with backoff, the Lease and status writers try again), so the
//! loss of a replica costs one failed request per loop, not an outage. An HTTP answer, even a
//! 5xx, is never a reason to switch: the server is alive and said something. With one server
//! (the default: the kubeconfig's) the client is kube-rs's own, unchanged. A load balancer in
//! front of the replicas works too, as upstream's kubelet expects; this is for when there is
//! none.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use kube::client::Body;

/// Why no client could be built.
#[derive(Debug)]
pub enum ClientError {
    /// The kubeconfig could not be read or loaded.
    Kubeconfig { path: PathBuf, error: String },
    /// No kubeconfig was given and none could be inferred.
    Infer(String),
    /// An entry of the server list is not an absolute http(s) URL.
    BadServer { server: String, error: String },
    /// kube-rs refused the configuration (TLS material, proxy settings ...).
    Build(String),
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::Kubeconfig { path, error } => write!(f, "loading kubeconfig {}: {error}", path.display()),
            ClientError::Infer(e) => write!(f, "no kubeconfig given and no in-cluster or default kubeconfig: {e}"),
            ClientError::BadServer { server, error } => write!(f, "API server {server:?}: {error}"),
            ClientError::Build(e) => write!(f, "building the API client: {e}"),
        }
    }
}

impl std::error::Error for ClientError {}

/// The client configuration: from `kubeconfig` when given (its current context), else
/// in-cluster or the default kubeconfig (`kube::Config::infer`).
pub async fn load_config(kubeconfig: Option<&Path>) -> Result<kube::Config, ClientError> {
    match kubeconfig {
        Some(path) => {
            let err = |e: &dyn std::fmt::Display| ClientError::Kubeconfig { path: path.to_path_buf(), error: e.to_string() };
            let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| err(&e))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.map_err(|e| err(&e))
        }
        None => kube::Config::infer().await.map_err(|e| ClientError::Infer(e.to_string())),
    }
}

/// Parses a server list as the flags take it: URLs separated by commas (blanks ignored).
pub fn parse_servers(list: &str) -> Result<Vec<http::Uri>, ClientError> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            let bad = |error: String| ClientError::BadServer { server: s.to_string(), error };
            let uri: http::Uri = s.parse().map_err(|e: http::uri::InvalidUri| bad(e.to_string()))?;
            match (uri.scheme_str(), uri.host()) {
                (Some("https" | "http"), Some(_)) => Ok(uri),
                _ => Err(bad("want an absolute http or https URL, e.g. https://10.0.0.1:6443".into())),
            }
        })
        .collect()
}

/// The client: kube-rs's own for `config` when `servers` is empty, else one over `servers` in
/// turn with `config`'s credentials, CA and timeouts (see the module's documentation).
pub fn build(config: kube::Config, servers: &[http::Uri]) -> Result<kube::Client, ClientError> {
    if servers.is_empty() {
        return kube::Client::try_from(config).map_err(|e| ClientError::Build(e.to_string()));
    }
    let namespace = config.default_namespace.clone();
    let mut clients = Vec::with_capacity(servers.len());
    for server in servers {
        let mut c = config.clone();
        c.cluster_url = server.clone();
        clients.push((server.to_string(), kube::Client::try_from(c).map_err(|e| ClientError::Build(e.to_string()))?));
    }
    Ok(kube::Client::new(Failover { servers: clients.into(), current: Arc::new(AtomicUsize::new(0)) }, namespace))
}

/// [`load_config`] then [`build`]: what a node binary calls with its `--kubeconfig` and
/// `--api-servers`.
pub async fn client(kubeconfig: Option<&Path>, servers: &[http::Uri]) -> Result<kube::Client, ClientError> {
    build(load_config(kubeconfig).await?, servers)
}

/// Sends each request to the current server; a failure below HTTP moves "current" on to the
/// next one (once per failed server: concurrent failures of the same server move it once).
#[derive(Clone)]
struct Failover {
    servers: Arc<[(String, kube::Client)]>,
    current: Arc<AtomicUsize>,
}

/// Whether an error means the server could not be reached or dropped the exchange (as
/// opposed to an HTTP answer, which kube-rs returns as a response, not an error).
fn unreachable(e: &kube::Error) -> bool {
    matches!(e, kube::Error::HyperError(_) | kube::Error::Service(_))
}

/// The server index after `failed` failed, among `n`.
fn next_after(failed: usize, n: usize) -> usize {
    (failed + 1) % n
}

impl tower::Service<Request<Body>> for Failover {
    type Response = Response<Body>;
    type Error = kube::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, kube::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let n = self.servers.len();
        let i = self.current.load(Ordering::Acquire) % n;
        let (name, client) = self.servers[i].clone();
        let current = self.current.clone();
        let next_name = self.servers[next_after(i, n)].0.clone();
        Box::pin(async move {
            let res = client.send(req).await;
            if let Err(e) = &res {
                if unreachable(e) && current.compare_exchange(i, next_after(i, n), Ordering::AcqRel, Ordering::Acquire).is_ok() {
                    tracing::warn!(server = %name, next = %next_name, error = %e, "API server unreachable; the next requests go to the next server");
                }
            }
            res
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn server_lists_parse_or_say_why() {
        let s = parse_servers("https://10.0.0.1:6443, https://10.0.0.2:6443,,").unwrap();
        assert_eq!(s.iter().map(|u| u.to_string()).collect::<Vec<_>>(), ["https://10.0.0.1:6443/", "https://10.0.0.2:6443/"]);
        assert!(parse_servers("").unwrap().is_empty());
        let e = parse_servers("https://a:6443,10.0.0.1:6443").unwrap_err().to_string();
        assert!(e.contains("\"10.0.0.1:6443\"") && e.contains("absolute http or https URL"), "{e}");
        assert!(parse_servers("https://a b").unwrap_err().to_string().contains("\"https://a b\""));
    }

    #[test]
    fn the_next_server_wraps_around() {
        assert_eq!(next_after(0, 2), 1);
        assert_eq!(next_after(1, 2), 0);
        assert_eq!(next_after(0, 1), 0);
    }

    fn config() -> kube::Config {
        kube::Config::new("https://127.0.0.1:1".parse().unwrap())
    }

    /// A server that answers every request with a fixed status and body, on loopback.
    async fn answering(status: u16, body: &'static str) -> (http::Uri, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut sock, _)) = listener.accept().await else { return };
                tokio::spawn(async move {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    let mut buf = vec![0u8; 4096];
                    let mut seen = Vec::new();
                    while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                        match sock.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => seen.extend_from_slice(&buf[..n]),
                        }
                    }
                    let resp = format!(
                        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = sock.write_all(resp.as_bytes()).await;
                });
            }
        });
        (format!("http://{addr}").parse().unwrap(), task)
    }

    /// A loopback address nothing listens on (bound, then closed).
    async fn closed() -> http::Uri {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        drop(l);
        format!("http://{addr}").parse().unwrap()
    }

    async fn get(client: &kube::Client) -> Result<String, kube::Error> {
        let req = Request::get("/version").body(Vec::new()).unwrap();
        client.request_text(req).await
    }

    #[tokio::test]
    async fn a_dead_server_costs_one_request_then_the_next_one_answers() {
        let dead = closed().await;
        let (alive, _task) = answering(200, r#"{"who":"b"}"#).await;
        let client = build(config(), &[dead, alive]).unwrap();
        assert!(matches!(get(&client).await, Err(e) if unreachable(&e)), "the first request meets the dead server");
        assert_eq!(get(&client).await.unwrap(), r#"{"who":"b"}"#);
        assert_eq!(get(&client).await.unwrap(), r#"{"who":"b"}"#, "and stays there");
    }

    #[tokio::test]
    async fn an_http_error_is_an_answer_not_a_reason_to_switch() {
        let (a, _ta) = answering(500, r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"broken","reason":"InternalError","code":500}"#).await;
        let (b, _tb) = answering(200, r#"{"who":"b"}"#).await;
        let client = build(config(), &[a, b]).unwrap();
        for _ in 0..3 {
            match get(&client).await {
                Err(kube::Error::Api(s)) => assert_eq!(s.code, 500),
                other => panic!("{other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn all_servers_dead_fail_every_request_and_wrap_around() {
        let client = build(config(), &[closed().await, closed().await]).unwrap();
        for _ in 0..4 {
            assert!(matches!(get(&client).await, Err(e) if unreachable(&e)));
        }
        // ... and a server that comes back is found again
        let (alive, _task) = answering(200, "{}").await;
        let client = build(config(), &[closed().await, alive]).unwrap();
        let _ = get(&client).await;
        assert_eq!(get(&client).await.unwrap(), "{}");
    }
}
