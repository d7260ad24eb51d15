//! The HTTP endpoints: /healthz and /livez on the healthz address (10256), /metrics and
//! /proxyMode on the metrics address (10249).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;

use crate::health::Health;
use crate::metrics::Metrics;

/// What the endpoints read.
pub struct Shared {
    pub health: Arc<Health>,
    pub metrics: Arc<Metrics>,
    pub mode: &'static str,
}

fn reply(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    if let Ok(v) = http::HeaderValue::from_str(content_type) {
        r.headers_mut().insert(http::header::CONTENT_TYPE, v);
    }
    r.headers_mut().insert("x-content-type-options", http::HeaderValue::from_static("nosniff"));
    r
}

/// Answers one request (pure apart from the shared state; tested without sockets).
pub fn handle(shared: &Shared, path: &str, healthz_port: bool) -> Response<Full<Bytes>> {
    match (healthz_port, path) {
        (true, "/healthz") | (true, "/livez") => {
            let livez = path == "/livez";
            let a = shared.health.answer(livez, SystemTime::now());
            shared.metrics.health_answer(livez, a.healthy);
            let status = if a.healthy { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
            reply(status, "application/json", a.body)
        }
        (false, "/metrics") => reply(StatusCode::OK, "text/plain; version=0.0.4; charset=utf-8", shared.metrics.render()),
        (false, "/proxyMode") => reply(StatusCode::OK, "text/plain; charset=utf-8", shared.mode.to_string()),
        _ => reply(StatusCode::NOT_FOUND, "text/plain; charset=utf-8", "404 page not found\n".into()),
    }
}

/// Binds an address (so a taken port fails the start, not a background task).
pub async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await
}

/// Serves one listener until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, shared: Arc<Shared>, healthz_port: bool) {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, what = if healthz_port { "healthz" } else { "metrics" }, "serving");
    }
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                continue;
            }
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req: Request<Incoming>| {
                let r = handle(&shared, req.uri().path(), healthz_port);
                async move { Ok::<_, Infallible>(r) }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await {
                tracing::debug!(error = %e, "connection ended");
            }
        });
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::model::Family;
    use http_body_util::BodyExt as _;

    async fn body(r: Response<Full<Bytes>>) -> String {
        String::from_utf8(r.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap()
    }

    #[tokio::test]
    async fn endpoints_answer_as_upstream() {
        let shared = Shared {
            health: Arc::new(Health::new(std::time::Duration::from_secs(30), vec![Family::V4])),
            metrics: Arc::new(Metrics::default()),
            mode: "nftables",
        };
        shared.health.queued(SystemTime::now());
        let r = handle(&shared, "/healthz", true);
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()["content-type"], "application/json");
        shared.health.updated(Family::V4, SystemTime::now());
        let r = handle(&shared, "/healthz", true);
        assert_eq!(r.status(), StatusCode::OK);
        let b: serde_json::Value = serde_json::from_str(&body(r).await).unwrap();
        assert_eq!(b["nodeEligible"], true);
        assert_eq!(handle(&shared, "/livez", true).status(), StatusCode::OK);
        assert_eq!(handle(&shared, "/metrics", true).status(), StatusCode::NOT_FOUND);
        let m = body(handle(&shared, "/metrics", false)).await;
        assert!(m.contains("kubeproxy_proxy_healthz_total{code=\"503\"} 1"), "{m}");
        assert!(m.contains("kubeproxy_proxy_healthz_total{code=\"200\"} 1"), "{m}");
        assert_eq!(body(handle(&shared, "/proxyMode", false)).await, "nftables");
    }
}
