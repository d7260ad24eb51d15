//! metrics.k8s.io served by the API server from the agents' /metrics/resource, and the
//! nodes/proxy subresource, with the real kubectl (`top`, `get --raw`). A stand-in agent (an
//! HTTPS server in the test) answers /metrics/resource with counters that grow with the clock:
//! a container using one core, an idle one using a thousandth, the node one and a half.
//! Metrics appear after the server's scrapes (every 15 s): the test waits for them.
#![allow(clippy::unwrap_used)]

mod common;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use common::fake::{eventually, FakeNodes};
use common::Server;
use http_body_util::Full;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::json;

fn now_ms() -> i64 {
    jiff::Timestamp::now().as_millisecond()
}

/// The stand-in agent's /metrics/resource at this moment.
fn resource_text(started: Instant, start_ms: i64) -> String {
    let secs = started.elapsed().as_secs_f64() + 60.0;
    let ts = now_ms();
    let start = start_ms as f64 / 1000.0;
    let mut t = String::new();
    t.push_str("# TYPE container_cpu_usage_seconds_total counter\n");
    t.push_str(&format!("container_cpu_usage_seconds_total{{container=\"burner\",namespace=\"top\",pod=\"burner\"}} {secs} {ts}\n"));
    t.push_str(&format!("container_cpu_usage_seconds_total{{container=\"idle\",namespace=\"top\",pod=\"idle\"}} {} {ts}\n", secs / 1000.0));
    t.push_str("# TYPE container_memory_working_set_bytes gauge\n");
    t.push_str(&format!("container_memory_working_set_bytes{{container=\"burner\",namespace=\"top\",pod=\"burner\"}} 1048576 {ts}\n"));
    t.push_str(&format!("container_memory_working_set_bytes{{container=\"idle\",namespace=\"top\",pod=\"idle\"}} 6.7108864e+07 {ts}\n"));
    t.push_str("# TYPE container_start_time_seconds gauge\n");
    t.push_str(&format!("container_start_time_seconds{{container=\"burner\",namespace=\"top\",pod=\"burner\"}} {start}\n"));
    t.push_str(&format!("container_start_time_seconds{{container=\"idle\",namespace=\"top\",pod=\"idle\"}} {start}\n"));
    t.push_str(&format!("node_cpu_usage_seconds_total {} {ts}\n", secs * 1.5));
    t.push_str(&format!("node_memory_working_set_bytes 1.073741824e+09 {ts}\n"));
    t.push_str("resource_scrape_error 0\n");
    t
}

/// An HTTPS server answering /metrics/resource, /stats/summary and /metrics as an agent does
/// (404 otherwise); its port.
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
    let started = Instant::now();
    let start_ms = now_ms() - 60_000;
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else { return };
                let svc = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| async move {
                    let (code, ct, body) = match req.uri().path() {
                        "/metrics/resource" => (200, "text/plain; version=0.0.4; charset=utf-8", resource_text(started, start_ms)),
                        "/stats/summary" => (200, "application/json", json!({"node": {"nodeName": "n1"}, "pods": [], "query": req.uri().query()}).to_string()),
                        _ => (404, "text/plain; charset=utf-8", "404 page not found\n".to_string()),
                    };
                    Ok::<_, Infallible>(http::Response::builder().status(code).header("Content-Type", ct).body(Full::new(bytes::Bytes::from(body))).unwrap())
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(hyper_util::rt::TokioIo::new(tls), svc).await;
            });
        }
    });
    port
}

/// `kubectl top` rows as (name, cpu in millicores, memory in MiB).
fn rows(out: &str) -> Vec<(String, i64, i64)> {
    out.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let cpu = f.get(1)?.strip_suffix('m')?.parse().ok()?;
            let mem = f.iter().skip(2).find_map(|x| x.strip_suffix("Mi"))?.parse().ok()?;
            Some((f[0].to_string(), cpu, mem))
        })
        .collect()
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_top_and_node_proxy() {
    let s = Server::start();
    let client = s.client().await;
    let port = stand_in_agent().await;
    let _nodes = FakeNodes::start(client.clone(), &["n1"], "2", "4Gi").await;
    // The node's agent is the stand-in.
    let nodes: Api<Node> = Api::all(client.clone());
    let status = json!({"status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": port}}}});
    nodes.patch_status("n1", &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
    // A node without an address (and not Ready: never scraped).
    s.apply("apiVersion: v1\nkind: Node\nmetadata:\n  name: bare\n");
    for ns in ["top", "empty"] {
        s.ok(&["create", "namespace", ns]);
    }
    for pod in ["burner", "idle", "late"] {
        s.ok(&["run", pod, "-n", "top", "--image=busybox:1", "--restart=Never"]);
    }

    // Discovery first, as kubectl top checks it.
    let groups = s.ok(&["api-versions"]);
    assert!(groups.lines().any(|l| l == "metrics.k8s.io/v1beta1"), "{groups}");
    let res = s.ok(&["api-resources", "--api-group=metrics.k8s.io", "--no-headers"]);
    assert!(res.contains("PodMetrics") && res.contains("NodeMetrics"), "{res}");

    let top = eventually("pod metrics after two scrapes", || async {
        let o = s.kubectl(&["top", "pods", "-n", "top", "--no-headers"]);
        let r = rows(&String::from_utf8_lossy(&o.stdout));
        (r.len() == 2).then_some(r)
    })
    .await;
    let (burner, idle) = (&top[0], &top[1]);
    assert_eq!((burner.0.as_str(), idle.0.as_str()), ("burner", "idle"), "{top:?}");
    assert!((950..=1050).contains(&burner.1), "one core: {top:?}");
    assert!(idle.1 <= 2, "a thousandth of a core: {top:?}");
    assert_eq!((burner.2, idle.2), (1, 64), "{top:?}");

    // The objects as metrics-server serves them.
    let raw: serde_json::Value =
        serde_json::from_str(&s.ok(&["get", "--raw", "/apis/metrics.k8s.io/v1beta1/namespaces/top/pods/burner"])).unwrap();
    assert_eq!(raw["kind"], "PodMetrics");
    assert_eq!(raw["metadata"]["labels"]["run"], "burner");
    assert_eq!(raw["containers"][0]["name"], "burner");
    assert_eq!(raw["containers"][0]["usage"]["memory"], "1Mi");
    let window = k8s_semantics::parse_go_duration(raw["window"].as_str().unwrap()).unwrap();
    assert!((10_000_000_000..=20_000_000_000).contains(&window), "about the resolution: {raw}");
    // Selectors, all namespaces, containers.
    let sel = s.ok(&["top", "pods", "-n", "top", "-l", "run=idle", "--no-headers"]);
    assert_eq!(rows(&sel).iter().map(|r| r.0.as_str()).collect::<Vec<_>>(), ["idle"], "{sel}");
    let field = s.ok(&["get", "--raw", "/apis/metrics.k8s.io/v1beta1/pods?fieldSelector=metadata.name%3Dburner"]);
    let field: serde_json::Value = serde_json::from_str(&field).unwrap();
    assert_eq!(field["kind"], "PodMetricsList");
    assert_eq!(field["items"].as_array().unwrap().len(), 1, "{field}");
    let all = s.ok(&["top", "pods", "-A", "--no-headers"]);
    assert!(all.lines().any(|l| l.starts_with("top ") && l.contains("burner")), "{all}");
    let containers = s.ok(&["top", "pod", "burner", "-n", "top", "--containers", "--no-headers"]);
    assert!(containers.split_whitespace().take(2).eq(["burner", "burner"]), "{containers}");

    // The node.
    let node = eventually("node metrics", || async {
        let o = s.kubectl(&["top", "node", "n1", "--no-headers"]);
        o.status.success().then(|| String::from_utf8_lossy(&o.stdout).into_owned())
    })
    .await;
    let f: Vec<&str> = node.split_whitespace().collect();
    assert_eq!(f[0], "n1", "{node}");
    let cpu: i64 = f[1].strip_suffix('m').unwrap().parse().unwrap();
    assert!((1400..=1600).contains(&cpu), "one and a half cores: {node}");
    assert_eq!((f[2], f[3], f[4]), ("75%", "1024Mi", "25%"), "of 2 CPUs and 4Gi: {node}");
    let list: serde_json::Value = serde_json::from_str(&s.ok(&["get", "--raw", "/apis/metrics.k8s.io/v1beta1/nodes?labelSelector=kubernetes.io%2Fhostname%3Dn1"])).unwrap();
    assert_eq!(list["items"][0]["metadata"]["name"], "n1");
    assert_eq!(list["items"][0]["usage"]["memory"], "1Gi");

    // Bad input, in upstream's words.
    let empty = s.kubectl(&["top", "pods", "-n", "empty"]);
    assert!(empty.status.success(), "{}", stderr(&empty));
    assert_eq!(stderr(&empty).trim(), "No resources found in empty namespace.");
    let missing = s.kubectl(&["top", "pod", "nosuch", "-n", "top"]);
    assert!(!missing.status.success());
    assert_eq!(stderr(&missing).trim(), "Error from server (NotFound): pods \"nosuch\" not found");
    let late = s.kubectl(&["get", "--raw", "/apis/metrics.k8s.io/v1beta1/namespaces/top/pods/late"]);
    assert_eq!(stderr(&late).trim(), "Error from server (NotFound): podmetrics.metrics.k8s.io \"top/late\" not found");
    let no_node = s.kubectl(&["top", "node", "nosuch"]);
    assert_eq!(stderr(&no_node).trim(), "Error from server (NotFound): node \"nosuch\" not found");
    let bare = s.kubectl(&["get", "--raw", "/apis/metrics.k8s.io/v1beta1/nodes/bare"]);
    assert_eq!(stderr(&bare).trim(), "Error from server (NotFound): nodemetrics.metrics.k8s.io \"bare\" not found");
    let watch = s.kubectl(&["get", "--raw", "/apis/metrics.k8s.io/v1beta1/pods?watch=true"]);
    assert!(stderr(&watch).contains("MethodNotAllowed"), "{}", stderr(&watch));

    // nodes/proxy.
    let text = s.ok(&["get", "--raw", "/api/v1/nodes/n1/proxy/metrics/resource"]);
    assert!(text.contains("node_cpu_usage_seconds_total "), "{text}");
    let summary = s.ok(&["get", "--raw", "/api/v1/nodes/n1/proxy/stats/summary?only_cpu_and_memory=true"]);
    let summary: serde_json::Value = serde_json::from_str(&summary).unwrap();
    assert_eq!(summary["node"]["nodeName"], "n1");
    assert_eq!(summary["query"], "only_cpu_and_memory=true", "the query goes along");
    let nothing = s.kubectl(&["get", "--raw", "/api/v1/nodes/n1/proxy/nothing"]);
    assert_eq!(stderr(&nothing).trim(), "Error from server (NotFound): the server could not find the requested resource");
    let unknown = s.kubectl(&["get", "--raw", "/api/v1/nodes/nosuch/proxy/metrics"]);
    assert_eq!(stderr(&unknown).trim(), "Error from server (NotFound): nodes \"nosuch\" not found");
    let no_address = s.kubectl(&["get", "--raw", "/api/v1/nodes/bare/proxy/metrics"]);
    assert_eq!(
        stderr(&no_address).trim(),
        "Error from server (ServiceUnavailable): no preferred addresses found; known addresses: []"
    );

    // Authorized as reads: a user without rights gets upstream's 403.
    let kc = s.cert_kubeconfig("jane", &[]);
    let jane = |args: &[&str]| std::process::Command::new("kubectl").arg("--kubeconfig").arg(&kc).args(args).output().unwrap();
    let o = jane(&["top", "pods", "-n", "top"]);
    assert!(
        stderr(&o).contains("pods.metrics.k8s.io is forbidden: User \"jane\" cannot list resource \"pods\" in API group \"metrics.k8s.io\" in the namespace \"top\""),
        "{}",
        stderr(&o)
    );
    let o = jane(&["get", "--raw", "/api/v1/nodes/n1/proxy/metrics"]);
    assert!(
        stderr(&o).contains("nodes \"n1\" is forbidden: User \"jane\" cannot get resource \"nodes/proxy\" in API group \"\" at the cluster scope"),
        "{}",
        stderr(&o)
    );
}
