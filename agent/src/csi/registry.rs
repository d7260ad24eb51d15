//! The plugin watcher: CSI drivers register by putting a socket in `<root>/plugins_registry`
//! that serves kubelet's pluginregistration v1 `Registration` service. On each scan the agent
//! registers new sockets (GetInfo -> the driver's CSI endpoint -> NodeGetInfo -> CSINode and
//! Node labels -> NotifyRegistrationStatus) and deregisters drivers whose socket is gone.
//! Upstream watches the directory with inotify; a scan every couple of seconds gives the same
//! result with less machinery, and also recovers a registration that failed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use csi_proto::csi::node_client::NodeClient;
use csi_proto::csi::NodeGetInfoRequest;
use csi_proto::registration::registration_client::RegistrationClient;
use csi_proto::registration::{InfoRequest, RegistrationStatus};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::CSINode;
use kube::api::{Patch, PatchParams, PostParams};
use kube::Api;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};
use tracing::{info, info_span, warn, Instrument};

use super::node_info::{self, DriverInfo};

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("connecting to {}: {source}", socket.display())]
    Connect {
        socket: PathBuf,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("{call} on {}: {}", socket.display(), status.message())]
    Rpc { call: &'static str, socket: PathBuf, status: tonic::Status },
    #[error("plugin at {}: {reason}", socket.display())]
    Refused { socket: PathBuf, reason: String },
    #[error("updating the node's CSI objects: {0}")]
    Api(#[from] kube::Error),
}

/// A registered driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registered {
    pub info: DriverInfo,
    /// The driver's CSI socket.
    pub endpoint: PathBuf,
    /// Its registration socket in the registry dir.
    pub registration: PathBuf,
}

/// The registered drivers, by name.
#[derive(Debug, Default)]
pub struct Drivers {
    inner: RwLock<BTreeMap<String, Registered>>,
}

impl Drivers {
    pub fn get(&self, name: &str) -> Option<Registered> {
        self.inner.read().unwrap_or_else(|p| p.into_inner()).get(name).cloned()
    }

    pub fn names(&self) -> Vec<String> {
        self.inner.read().unwrap_or_else(|p| p.into_inner()).keys().cloned().collect()
    }

    fn all(&self) -> Vec<Registered> {
        self.inner.read().unwrap_or_else(|p| p.into_inner()).values().cloned().collect()
    }

    fn insert(&self, r: Registered) {
        self.inner.write().unwrap_or_else(|p| p.into_inner()).insert(r.info.name.clone(), r);
    }

    fn remove(&self, name: &str) {
        self.inner.write().unwrap_or_else(|p| p.into_inner()).remove(name);
    }
}

/// A gRPC channel over a unix socket.
pub async fn channel(socket: &Path) -> Result<Channel, RegistryError> {
    let path = socket.to_path_buf();
    Endpoint::from_static("http://[::]:50051")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
        .map_err(|source| RegistryError::Connect { socket: socket.to_path_buf(), source })
}

/// Where the agent writes what drivers registered: its Node's labels and CSINode.
#[derive(Clone)]
pub struct NodeObjects {
    pub client: kube::Client,
    pub node: String,
}

impl NodeObjects {
    async fn put(&self, d: &DriverInfo) -> Result<(), kube::Error> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let node = nodes.get(&self.node).await?;
        let labels = node_info::missing_labels(&node, d);
        if !labels.is_empty() {
            let patch = serde_json::json!({"metadata": {"labels": labels}});
            nodes.patch(&self.node, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        }
        let api: Api<CSINode> = Api::all(self.client.clone());
        let existing = api.get_opt(&self.node).await?;
        match (node_info::with_driver(existing.as_ref(), &node, d), existing.is_some()) {
            (None, _) => {}
            (Some(updated), true) => {
                api.replace(&self.node, &PostParams::default(), &updated).await?;
            }
            (Some(created), false) => {
                api.create(&PostParams::default(), &created).await?;
            }
        }
        Ok(())
    }

    async fn remove(&self, name: &str) -> Result<(), kube::Error> {
        let api: Api<CSINode> = Api::all(self.client.clone());
        if let Some(existing) = api.get_opt(&self.node).await? {
            if let Some(updated) = node_info::without_driver(&existing, name) {
                api.replace(&self.node, &PostParams::default(), &updated).await?;
            }
        }
        Ok(())
    }
}

/// Registers the plugin behind one registration socket.
pub async fn register(socket: &Path, api: Option<&NodeObjects>) -> Result<Registered, RegistryError> {
    let rpc = |call: &'static str| {
        let socket = socket.to_path_buf();
        move |status: tonic::Status| RegistryError::Rpc { call, socket, status }
    };
    let mut reg = RegistrationClient::new(channel(socket).await?);
    let info = reg.get_info(InfoRequest {}).await.map_err(rpc("GetInfo"))?.into_inner();
    let outcome = async {
        let refuse = |reason: String| RegistryError::Refused { socket: socket.to_path_buf(), reason };
        if info.r#type != "CSIPlugin" {
            return Err(refuse(format!("plugin type {:?} is not supported (CSIPlugin is)", info.r#type)));
        }
        if info.name.is_empty() {
            return Err(refuse("the plugin has no name".into()));
        }
        if !info.supported_versions.iter().any(|v| v.starts_with("1.")) {
            return Err(refuse(format!("no supported CSI version in {:?} (1.x is)", info.supported_versions)));
        }
        let endpoint = PathBuf::from(info.endpoint.strip_prefix("unix://").unwrap_or(&info.endpoint));
        if !endpoint.is_absolute() {
            return Err(refuse(format!("endpoint {:?} is not an absolute socket path", info.endpoint)));
        }
        let mut node = NodeClient::new(channel(&endpoint).await?);
        let ni = node.node_get_info(NodeGetInfoRequest {}).await.map_err(rpc("NodeGetInfo"))?.into_inner();
        if ni.node_id.is_empty() {
            return Err(refuse("NodeGetInfo returned no node_id".into()));
        }
        let d = DriverInfo {
            name: info.name.clone(),
            node_id: ni.node_id,
            topology: ni.accessible_topology.map(|t| t.segments.into_iter().collect()).unwrap_or_default(),
            max_volumes: ni.max_volumes_per_node,
        };
        if let Some(api) = api {
            api.put(&d).await?;
        }
        Ok(Registered { info: d, endpoint, registration: socket.to_path_buf() })
    }
    .await;
    let status = match &outcome {
        Ok(_) => RegistrationStatus { plugin_registered: true, error: String::new() },
        Err(e) => RegistrationStatus { plugin_registered: false, error: e.to_string() },
    };
    reg.notify_registration_status(status).await.map_err(rpc("NotifyRegistrationStatus"))?;
    outcome
}

/// Registration sockets in the registry dir, sorted.
fn sockets(dir: &Path) -> Vec<PathBuf> {
    use std::os::unix::fs::FileTypeExt;
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut out: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_socket()))
        .map(|e| e.path())
        .collect();
    out.sort();
    out
}

/// One pass over the registry dir. `failed` remembers the last error per socket so a plugin
/// that keeps failing is logged once per distinct error.
pub async fn scan(dir: &Path, drivers: &Drivers, api: Option<&NodeObjects>, failed: &mut BTreeMap<PathBuf, String>) {
    let present = sockets(dir);
    for r in drivers.all() {
        if !present.contains(&r.registration) {
            info!(driver = %r.info.name, "the driver's registration socket is gone: deregistering");
            drivers.remove(&r.info.name);
            if let Some(api) = api {
                if let Err(e) = api.remove(&r.info.name).await {
                    warn!(driver = %r.info.name, error = %e, "removing the driver from CSINode");
                }
            }
        }
    }
    failed.retain(|p, _| present.contains(p));
    let known: Vec<PathBuf> = drivers.all().into_iter().map(|r| r.registration).collect();
    for socket in present.into_iter().filter(|s| !known.contains(s)) {
        let span = info_span!("register", socket = %socket.display());
        match register(&socket, api).instrument(span).await {
            Ok(r) => {
                info!(driver = %r.info.name, node_id = %r.info.node_id, endpoint = %r.endpoint.display(), "CSI driver registered");
                failed.remove(&socket);
                drivers.insert(r);
            }
            Err(e) => {
                let msg = e.to_string();
                if failed.get(&socket) != Some(&msg) {
                    warn!(socket = %socket.display(), error = %msg, "plugin registration failed; retrying");
                    failed.insert(socket, msg);
                }
            }
        }
    }
}

/// Scans the registry dir every `period`, forever.
pub async fn watch(dir: PathBuf, drivers: Arc<Drivers>, api: Option<NodeObjects>, period: Duration) {
    if let Err(e) = std::fs::create_dir_all(&dir) {
        warn!(dir = %dir.display(), error = %e, "cannot create the plugin registry dir");
    }
    let mut failed = BTreeMap::new();
    let mut tick = tokio::time::interval(period);
    loop {
        tick.tick().await;
        scan(&dir, &drivers, api.as_ref(), &mut failed).await;
    }
}
