//! An API client whose credentials can be replaced while the agent runs: every clone the loops
//! hold sends each request through the client installed last. After a rotation the agent builds
//! a client from the kubeconfig again (it names the store's current pair) and installs it here,
//! so new requests and new connections present the new certificate.
//!
//! Requests already under way (a watch in particular) finish on the connection they started on,
//! with the old certificate: it is still valid (rotation happens with 10-30 % of its life
//! left), and when the server ends the watch (kube-rs's watcher asks for a timeout of under
//! five minutes) the watcher's next request goes through the new client. The old client's
//! connections close when its last request is done.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, PoisonError, RwLock};
use std::task::{Context, Poll};

use http::{Request, Response};
use kube::client::Body;

/// The handle that replaces the client behind [`Reloadable::client`]'s clones.
#[derive(Clone)]
pub struct Reloadable {
    inner: Arc<RwLock<kube::Client>>,
    namespace: String,
}

impl Reloadable {
    pub fn new(initial: kube::Client) -> Self {
        let namespace = initial.default_namespace().to_string();
        Reloadable {
            inner: Arc::new(RwLock::new(initial)),
            namespace,
        }
    }

    /// A client that always uses the client installed last.
    pub fn client(&self) -> kube::Client {
        kube::Client::new(Current(self.inner.clone()), self.namespace.clone())
    }

    /// Installs `next` for every request from now on.
    pub fn replace(&self, next: kube::Client) {
        *self.inner.write().unwrap_or_else(PoisonError::into_inner) = next;
    }
}

#[derive(Clone)]
struct Current(Arc<RwLock<kube::Client>>);

impl tower::Service<Request<Body>> for Current {
    type Response = Response<Body>;
    type Error = kube::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, kube::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let client = self
            .0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        Box::pin(async move { client.send(req).await })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A plain-http server on loopback answering every request with `body`.
    async fn answering(body: &'static str) -> http::Uri {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                tokio::spawn(async move {
                    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
                    let mut buf = vec![0u8; 4096];
                    let mut seen = Vec::new();
                    while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                        match sock.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => seen.extend_from_slice(&buf[..n]),
                        }
                    }
                    let resp = format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    sock.write_all(resp.as_bytes()).await.unwrap_or_default();
                });
            }
        });
        format!("http://{addr}").parse().unwrap()
    }

    async fn get(c: &kube::Client) -> String {
        c.request_text(Request::get("/version").body(Vec::new()).unwrap())
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn clones_made_before_a_replacement_use_the_new_client() {
        let a = kube::Client::try_from(kube::Config::new(answering("a").await)).unwrap();
        let b = kube::Client::try_from(kube::Config::new(answering("b").await)).unwrap();
        let handle = Reloadable::new(a);
        let client = handle.client();
        let clone = client.clone();
        assert_eq!(get(&clone).await, "a");
        handle.replace(b);
        assert_eq!(get(&clone).await, "b");
        assert_eq!(get(&client).await, "b");
        assert_eq!(client.default_namespace(), "default");
    }
}
