//! Start-up: the data dir, PKI, store, built-in objects and the listeners.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use serde_json::json;

use crate::alloc::{Cidr, IpAllocator, PortAllocator};
use crate::api::Api;
use crate::auth::Tokens;
use crate::pki;
use crate::resources;
use crate::server::ServerState;
use crate::store::{EmbeddedStore, EmbeddedStoreOptions, EtcdOptions, EtcdStore, KeyLayout, Store};

/// Everything `ferro-control-plane` is configured with.
#[derive(Debug, Clone)]
pub struct Config {
    pub data_dir: PathBuf,
    pub bind_addresses: Vec<IpAddr>,
    pub secure_port: u16,
    /// Address written into admin.kubeconfig and the `kubernetes` endpoints; defaults to the
    /// first bind address (127.0.0.1 when that is unspecified).
    pub advertise_address: Option<IpAddr>,
    pub service_cluster_ip_range: String,
    pub service_node_port_range: String,
    /// Extra names/addresses for the serving certificate.
    pub tls_sans: Vec<String>,
    pub watch_history: usize,
    pub max_requests_inflight: usize,
    pub max_mutating_requests_inflight: usize,
    /// Keep objects in etcd instead of the embedded store.
    pub etcd: Option<EtcdConfig>,
    /// `--service-account-issuer`.
    pub service_account_issuer: String,
    /// `--api-audiences` (the issuer when not given).
    pub api_audiences: Vec<String>,
    /// Tests only: tokens are issued and checked by the time in this file.
    pub tokens_clock_file: Option<PathBuf>,
    /// `--anonymous-auth`: a request without credentials is system:anonymous (else 401).
    pub anonymous_auth: bool,
}

/// The etcd backend (`--etcd-servers` and friends).
#[derive(Debug, Clone)]
pub struct EtcdConfig {
    pub servers: Vec<String>,
    pub ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// Every key lives under it (upstream's `/registry`).
    pub prefix: String,
    /// Zero: never compact.
    pub compaction_interval: std::time::Duration,
}

/// Upstream's etcd key layout for the served resources: `<prefix>/<resource>/<namespace>/<name>`
/// with upstream's few exceptions (nodes are `minions`, services `services/specs`, endpoints
/// `services/endpoints`, kinds upstream serves from CustomResourceDefinitions
/// `<group>/<resource>`).
pub fn etcd_key_layout(prefix: &str) -> KeyLayout {
    let segments = resources::RESOURCES
        .iter()
        .map(|r| {
            let segment = match (r.group, r.plural) {
                ("", "nodes") => "minions/".to_string(),
                ("", "services") => "services/specs/".to_string(),
                ("", "endpoints") => "services/endpoints/".to_string(),
                ("snapshot.storage.k8s.io" | "apiextensions.k8s.io", plural) => format!("{}/{plural}/", r.group),
                (_, plural) => format!("{plural}/"),
            };
            (r.prefix(None), segment)
        })
        .chain([
            // the Service allocations (crate::service_alloc): upstream's key for IPAddress
            // objects, and ferro's own for NodePorts
            (crate::service_alloc::IP_PREFIX.to_string(), "ipaddresses/".to_string()),
            (crate::service_alloc::PORT_PREFIX.to_string(), "servicenodeports/".to_string()),
        ])
        .collect();
    KeyLayout::mapped(prefix, segments)
}

/// How often every API server repairs the Service allocations (upstream's repair loops run
/// every 3 minutes).
const ALLOCATION_REPAIR_INTERVAL: std::time::Duration = std::time::Duration::from_secs(180);

async fn repair_allocations(api: Arc<Api>) {
    let mut tick = tokio::time::interval(ALLOCATION_REPAIR_INTERVAL);
    tick.tick().await; // the first run was Api::new's
    loop {
        tick.tick().await;
        if let Err(e) = api.allocations.repair().await {
            tracing::warn!(error = %e, "repairing the service allocations failed; next run in 3m");
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("data dir {0}: {1}")]
    DataDir(PathBuf, std::io::Error),
    #[error(transparent)]
    Pki(#[from] pki::PkiError),
    #[error(transparent)]
    Alloc(#[from] crate::alloc::AllocError),
    #[error("store: {0}")]
    Store(#[from] crate::store::StoreError),
    #[error("api: {0}")]
    Api(#[from] crate::error::ApiError),
    #[error(transparent)]
    Auth(#[from] crate::auth::AuthError),
    #[error("tls: {0}")]
    Tls(String),
    #[error("start-up: {0}")]
    Internal(String),
    #[error("listen on {0}: {1}")]
    Listen(SocketAddr, std::io::Error),
}

impl Config {
    pub fn advertise(&self) -> IpAddr {
        self.advertise_address.unwrap_or_else(|| {
            self.bind_addresses
                .iter()
                .copied()
                .find(|a| !a.is_unspecified())
                .unwrap_or(IpAddr::from([127, 0, 0, 1]))
        })
    }

    pub fn server_url(&self) -> String {
        match self.advertise() {
            IpAddr::V6(a) => format!("https://[{a}]:{}", self.secure_port),
            IpAddr::V4(a) => format!("https://{a}:{}", self.secure_port),
        }
    }
}

/// A started server: its address and a handle to stop it.
pub struct Running {
    pub addrs: Vec<SocketAddr>,
    pub api: Arc<Api>,
    /// Serves `/debug/controllers` once the loops of this process are set here.
    pub explain: Arc<std::sync::OnceLock<Arc<crate::controllers::explain::Registry>>>,
    /// The service account signing key (loops of this process sign legacy tokens with it).
    pub sa_key: Arc<crate::sa_token::SigningKey>,
    shutdown: tokio::sync::watch::Sender<bool>,
}

impl Running {
    pub fn stop(&self) {
        let _ = self.shutdown.send(true);
    }
}

pub async fn start(cfg: &Config) -> Result<Running, StartError> {
    let dir = &cfg.data_dir;
    std::fs::create_dir_all(dir).map_err(|e| StartError::DataDir(dir.clone(), e))?;
    let ips = IpAllocator::new(Cidr::parse(&cfg.service_cluster_ip_range)?);
    let kubernetes_ip = ips.first();
    let ports = PortAllocator::parse(&cfg.service_node_port_range)?;

    // PKI and credentials.
    let ca = pki::Ca::load_or_create(dir)?;
    let mut sans: Vec<String> = vec![
        "localhost".into(),
        "kubernetes".into(),
        "kubernetes.default".into(),
        "kubernetes.default.svc".into(),
        "kubernetes.default.svc.cluster.local".into(),
        "127.0.0.1".into(),
        kubernetes_ip.to_string(),
        cfg.advertise().to_string(),
    ];
    for a in &cfg.bind_addresses {
        if !a.is_unspecified() {
            sans.push(a.to_string());
        }
    }
    sans.extend(cfg.tls_sans.iter().cloned());
    sans.dedup();
    let (serving_cert, serving_key) = pki::serving_pair(dir, &ca, &sans)?;
    let token = pki::admin_token(dir)?;
    let tokens = Tokens::load(&dir.join("tokens.csv"))?;
    let kubeconfig = pki::kubeconfig(&cfg.server_url(), &ca.cert_pem, "admin", pki::Credentials::Token(&token));
    pki::write_kubeconfig(&dir.join("admin.kubeconfig"), &kubeconfig)?;
    let (kc_cert, kc_key) = pki::client_pair(
        dir,
        &ca,
        "kubelet-client",
        "kube-apiserver-kubelet-client",
        &["system:masters".to_string()],
    )?;
    let kubelet = crate::proxy::KubeletClient::new(&kc_cert, &kc_key).map_err(StartError::Tls)?;
    let resource_metrics = Arc::new(crate::resource_metrics::Metrics::default());

    // Store and API.
    let store: Arc<dyn Store> = match &cfg.etcd {
        Some(etcd) => {
            let opts = EtcdOptions {
                ca_file: etcd.ca_file.clone(),
                cert_file: etcd.cert_file.clone(),
                key_file: etcd.key_file.clone(),
                compaction_interval: etcd.compaction_interval,
                history: cfg.watch_history,
                ..EtcdOptions::new(etcd.servers.clone())
            };
            let layout = etcd_key_layout(&etcd.prefix);
            Arc::new(EtcdStore::connect(opts, layout, crate::strategy::indexer()).await?)
        }
        None => {
            let store_path = dir.join("store.redb");
            let store = tokio::task::spawn_blocking({
                let opts = EmbeddedStoreOptions { history: cfg.watch_history, ..Default::default() };
                move || EmbeddedStore::open(&store_path, crate::strategy::indexer(), opts)
            })
            .await
            .map_err(|e| StartError::Internal(e.to_string()))??;
            Arc::new(store)
        }
    };
    let api = Arc::new(Api::new(store, ips, ports).await?);
    tokio::spawn(repair_allocations(api.clone()));
    // metrics.k8s.io: the agents' /metrics/resource every 15 s
    tokio::spawn(crate::resource_metrics::scrape::run(
        api.clone(),
        crate::resource_metrics::scrape::AgentScraper(kubelet.clone()),
        resource_metrics.clone(),
        crate::resource_metrics::scrape::RESOLUTION,
    ));
    tokio::spawn(crate::crd::controller::run(api.clone()));
    bootstrap_objects(&api, cfg, kubernetes_ip).await?;
    // kube-public/cluster-info: a joining node's discovery (signed by the bootstrapsigner loop)
    crate::cluster_info::publish(&api, &cfg.server_url(), &ca.cert_pem).await?;
    // the `kubernetes` Service's endpoints: this server among the live ones
    crate::apiserver_endpoints::start(api.clone(), cfg.advertise(), cfg.secure_port).await?;
    // RBAC: upstream's default roles and bindings, then the policy the authorizer follows
    crate::rbac::bootstrap::reconcile(&api).await?;
    let rbac = crate::rbac::Policy::start(api.store.clone()).await?;
    let node_graph = crate::node_graph::NodeGraphView::start(api.store.clone()).await?;

    // TLS: client certificates are optional; requests without one need a bearer token.
    let tls = tls_config(&ca.cert_pem, &serving_cert, &serving_key)?;
    let explain: Arc<std::sync::OnceLock<_>> = Arc::default();
    if let Some(f) = &cfg.tokens_clock_file {
        crate::sa_token::set_clock(crate::controllers::clock::Clock::from_file(f.clone()).map_err(StartError::Internal)?);
    }
    let sa_key = Arc::new(
        crate::sa_token::SigningKey::load_or_create(dir, &cfg.service_account_issuer).map_err(|e| StartError::Internal(e.to_string()))?,
    );
    let state = Arc::new(ServerState {
        api: api.clone(),
        sa_key: Some(sa_key.clone()),
        api_audiences: cfg.api_audiences.clone(),
        explain: explain.clone(),
        resource_metrics,
        rbac,
        node_graph,
        tokens,
        anonymous_auth: cfg.anonymous_auth,
        kubelet: Some(kubelet),
        readonly_inflight: Arc::new(tokio::sync::Semaphore::new(cfg.max_requests_inflight.max(1))),
        mutating_inflight: Arc::new(tokio::sync::Semaphore::new(cfg.max_mutating_requests_inflight.max(1))),
        version: json!({
            "major": "1",
            "minor": "33",
            "gitVersion": concat!("v1.33.0-ferro.", env!("CARGO_PKG_VERSION")),
            "gitCommit": "",
            "gitTreeState": "clean",
            "buildDate": "1970-01-01T00:00:00Z",
            "goVersion": "n/a (rust)",
            "compiler": "rustc",
            "platform": format!("{}/{}", std::env::consts::OS, if cfg!(target_arch = "x86_64") { "amd64" } else { std::env::consts::ARCH }),
        }),
    });
    let (tx, rx) = tokio::sync::watch::channel(false);
    let mut addrs = Vec::new();
    for bind in &cfg.bind_addresses {
        let addr = SocketAddr::new(*bind, cfg.secure_port);
        let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| StartError::Listen(addr, e))?;
        let local = listener.local_addr().map_err(|e| StartError::Listen(addr, e))?;
        addrs.push(local);
        tokio::spawn(crate::server::serve_tls(state.clone(), listener, tls.clone(), rx.clone()));
    }
    tracing::info!(?addrs, kubeconfig = %dir.join("admin.kubeconfig").display(), "ferro-control-plane serving");
    Ok(Running { addrs, api, explain, sa_key, shutdown: tx })
}

fn tls_config(ca_pem: &str, cert_pem: &str, key_pem: &str) -> Result<Arc<rustls::ServerConfig>, StartError> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let err = |e: &dyn std::fmt::Display| StartError::Tls(e.to_string());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.map_err(|e| err(&e))?).map_err(|e| err(&e))?;
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .allow_unauthenticated()
        .build()
        .map_err(|e| err(&e))?;
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(cert_pem.as_bytes()).collect::<Result<_, _>>().map_err(|e| err(&e))?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| err(&e))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| err(&e))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .map_err(|e| err(&e))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The namespaces and the `kubernetes` Service every cluster has.
async fn bootstrap_objects(api: &Api, cfg: &Config, kubernetes_ip: IpAddr) -> Result<(), StartError> {
    let namespaces = resources::find("", "v1", "namespaces").ok_or_else(|| StartError::Internal("no namespaces resource".into()))?;
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        if api.store.get(&namespaces.key(None, ns)).await?.is_none() {
            let obj = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
            api.create(namespaces, None, obj, false).await?;
        }
    }
    let services = resources::find("", "v1", "services").ok_or_else(|| StartError::Internal("no services resource".into()))?;
    if api.store.get(&services.key(Some("default"), "kubernetes")).await?.is_none() {
        let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "kubernetes", "namespace": "default",
            "labels": {"component": "apiserver", "provider": "kubernetes"}},
            "spec": {"clusterIP": kubernetes_ip.to_string(), "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": cfg.secure_port}]}});
        api.create(services, Some("default"), svc, false).await?;
    }
    Ok(())
}
