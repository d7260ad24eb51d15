//! pods/log and pods/exec are proxied to the agent of the pod's node; here a stand-in agent
//! (an HTTPS server in the test) plays the kubelet's side, including the protocol upgrade.
#![allow(clippy::unwrap_used)]

mod common;

use std::convert::Infallible;
use std::sync::Arc;

use common::Server;
use http_body_util::{BodyExt as _, Full};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::json;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// Serves /containerLogs with the path and query echoed back, and answers upgrades to
/// SPDY/3.1 with an echo of whatever the client sends.
async fn stand_in_agent() -> u16 {
    let kp = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap().self_signed(&kp).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from_pem_slice(cert.pem().as_bytes()).unwrap()],
            PrivateKeyDer::from_pem_slice(kp.serialize_pem().as_bytes()).unwrap(),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let tls = acceptor.accept(tcp).await.unwrap();
                let svc = hyper::service::service_fn(|mut req: http::Request<hyper::body::Incoming>| async move {
                    if req.headers().contains_key(http::header::UPGRADE) {
                        let up = hyper::upgrade::on(&mut req);
                        tokio::spawn(async move {
                            let mut io = hyper_util::rt::TokioIo::new(up.await.unwrap());
                            let mut buf = [0u8; 64];
                            let n = io.read(&mut buf).await.unwrap();
                            io.write_all(&buf[..n]).await.unwrap();
                            io.shutdown().await.unwrap();
                        });
                        return Ok::<_, Infallible>(
                            http::Response::builder()
                                .status(101)
                                .header("Connection", "Upgrade")
                                .header("Upgrade", "SPDY/3.1")
                                .header("X-Stream-Protocol-Version", "v4.channel.k8s.io")
                                .body(Full::new(bytes::Bytes::new()))
                                .unwrap(),
                        );
                    }
                    let text = format!("agent saw {}\n", req.uri());
                    Ok(http::Response::new(Full::new(bytes::Bytes::from(text))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), svc)
                    .with_upgrades()
                    .await;
            });
        }
    });
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_and_exec_reach_the_agent() {
    let s = Server::start();
    let agent_port = stand_in_agent().await;
    let client = s.client().await;
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "n1"},
            "status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                       "daemonEndpoints": {"kubeletEndpoint": {"Port": agent_port}}}})).unwrap())
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "p"},
        "spec": {"nodeName": "n1", "containers": [{"name": "app", "image": "i"}]}})).unwrap())
        .await
        .unwrap();

    // kubectl logs goes through pods/log
    let out = s.ok(&["logs", "p", "--tail=5"]);
    assert_eq!(out.trim(), "agent saw /containerLogs/default/p/app?tailLines=5");
    // unscheduled pods have no agent
    pods.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "q"},
        "spec": {"containers": [{"name": "app", "image": "i"}]}})).unwrap())
        .await
        .unwrap();
    let out = s.kubectl(&["logs", "q"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not have a host assigned"));

    // exec: an HTTP/1.1 upgrade through the server, then bytes both ways
    let (mut tls, token) = common::raw_tls(&s).await;
    let req = format!(
        "POST /api/v1/namespaces/default/pods/p/exec?command=sh&stdin=true&stdout=true HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\nContent-Length: 0\r\n\r\n"
    );
    tls.write_all(req.as_bytes()).await.unwrap();
    let head = common::read_head(&mut tls).await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(head.to_lowercase().contains("x-stream-protocol-version: v4.channel.k8s.io"), "{head}");
    tls.write_all(b"ping through the proxy").await.unwrap();
    let mut echoed = Vec::new();
    tls.read_to_end(&mut echoed).await.unwrap_or(0);
    assert_eq!(echoed, b"ping through the proxy");

    // a non-upgrade body read still works through hyper in the test crate
    let _ = Full::new(bytes::Bytes::new()).collect().await;
}
