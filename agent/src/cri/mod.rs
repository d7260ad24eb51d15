//! The agent's CRI client: runtime.v1 RuntimeService and ImageService over a `unix://` socket,
//! and the [`Cri`] trait the pod workers use (with [`fake::FakeCri`] for tests without a runtime).
//!
//! The channel is the same one crates/lab/src/cri.rs opens (k8s-cri's tonic clients on a unix
//! stream). It is a small copy rather than shared so that the agent does not depend on the test
//! lab (and the lab not on the agent's kube stack).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{StatusRequest, VersionRequest};
pub use k8s_cri::v1 as api;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::node::{self, Health, RuntimeCondition};

pub mod fake;

/// How long one CRI call may take before the runtime counts as down.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// Timeout of the calls that do real work (sandbox and container lifecycle), as upstream's
/// runtime request timeout.
pub const WORK_TIMEOUT: Duration = Duration::from_secs(120);
/// Timeout of an image pull.
pub const PULL_TIMEOUT: Duration = Duration::from_secs(300);

/// The CRI API version the agent speaks (VersionRequest.version).
pub const CRI_API_VERSION: &str = "v1";

#[derive(Debug, thiserror::Error)]
pub enum CriError {
    #[error("connect to CRI socket {0}: {1}")]
    Connect(PathBuf, String),
    #[error("{0} timed out after {1:?}")]
    Timeout(&'static str, Duration),
    #[error("{0}: {1}")]
    Call(&'static str, tonic::Status),
}

/// Clients of the runtime and image services on one channel.
#[derive(Debug, Clone)]
pub struct Runtime {
    pub runtime: RuntimeServiceClient<Channel>,
    pub image: ImageServiceClient<Channel>,
}

/// The runtime's name and version, as VersionResponse reports them.
#[derive(Debug, Clone, PartialEq)]
pub struct RuntimeVersion {
    pub runtime_name: String,
    pub runtime_version: String,
    pub runtime_api_version: String,
}

impl RuntimeVersion {
    /// nodeInfo.containerRuntimeVersion as upstream formats it: `<runtimeName>://<runtimeVersion>`.
    pub fn node_info(&self) -> String {
        format!("{}://{}", self.runtime_name, self.runtime_version)
    }
}

/// The endpoint of every channel. The URI is required by tonic but unused: every connection
/// goes to the socket.
fn endpoint() -> Endpoint {
    Endpoint::from_static("http://[::]:50051").connect_timeout(CALL_TIMEOUT)
}

/// A tonic connector that dials the unix socket at `socket`.
fn unix_connector(
    socket: &Path,
) -> impl tower::Service<
    Uri,
    Response = TokioIo<UnixStream>,
    Error = std::io::Error,
    Future = impl std::future::Future<Output = Result<TokioIo<UnixStream>, std::io::Error>> + Send,
> + Clone
       + Send {
    let path: PathBuf = socket.to_path_buf();
    tower::service_fn(move |_: Uri| {
        let path = path.clone();
        async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
    })
}

/// A connected channel to the CRI socket at `socket` (within [`CALL_TIMEOUT`]).
pub async fn channel(socket: &Path) -> Result<Channel, CriError> {
    let endpoint = endpoint();
    let connect = endpoint.connect_with_connector(unix_connector(socket));
    match tokio::time::timeout(CALL_TIMEOUT, connect).await {
        Ok(Ok(ch)) => Ok(ch),
        Ok(Err(e)) => Err(CriError::Connect(socket.to_path_buf(), format!("{e:?}"))),
        Err(_) => Err(CriError::Timeout("connect", CALL_TIMEOUT)),
    }
}

async fn call<T>(
    what: &'static str,
    fut: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, CriError> {
    call_within(what, CALL_TIMEOUT, fut).await
}

async fn call_within<T>(
    what: &'static str,
    limit: Duration,
    fut: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, CriError> {
    match tokio::time::timeout(limit, fut).await {
        Ok(Ok(r)) => Ok(r.into_inner()),
        Ok(Err(s)) => Err(CriError::Call(what, s)),
        Err(_) => Err(CriError::Timeout(what, limit)),
    }
}

impl CriError {
    /// The gRPC status code of a failed call (NotFound means the object is already gone).
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            CriError::Call(_, s) => Some(s.code()),
            _ => None,
        }
    }

    pub fn is_not_found(&self) -> bool {
        self.code() == Some(tonic::Code::NotFound)
    }

    /// A stop or remove of something already gone is success (as upstream treats NotFound).
    pub fn gone_ok(r: Result<(), CriError>) -> Result<(), CriError> {
        match r {
            Err(e) if !e.is_not_found() => Err(e),
            _ => Ok(()),
        }
    }

    /// The runtime's own message for a failed call.
    pub fn message(&self) -> String {
        match self {
            CriError::Call(_, s) => s.message().to_string(),
            other => other.to_string(),
        }
    }
}

/// Clients whose channel connects on first use and again after the runtime went away (the
/// pod workers keep one for the agent's lifetime).
pub fn connect_lazy(socket: &Path) -> Runtime {
    let ch = endpoint().connect_with_connector_lazy(unix_connector(socket));
    Runtime { runtime: RuntimeServiceClient::new(ch.clone()), image: ImageServiceClient::new(ch) }
}

/// Connects to `socket` (the path of a `unix://` endpoint).
pub async fn connect(socket: &Path) -> Result<Runtime, CriError> {
    let ch = channel(socket).await?;
    Ok(Runtime { runtime: RuntimeServiceClient::new(ch.clone()), image: ImageServiceClient::new(ch) })
}

impl Runtime {
    /// RuntimeService.Version.
    pub async fn version(&mut self) -> Result<RuntimeVersion, CriError> {
        let req = VersionRequest { version: CRI_API_VERSION.into() };
        let v = call("Version", self.runtime.version(req)).await?;
        Ok(RuntimeVersion {
            runtime_name: v.runtime_name,
            runtime_version: v.runtime_version,
            runtime_api_version: v.runtime_api_version,
        })
    }

    /// RuntimeService.Status: the runtime's conditions (RuntimeReady, NetworkReady, ...).
    pub async fn status(&mut self) -> Result<Vec<RuntimeCondition>, CriError> {
        let st = call("Status", self.runtime.status(StatusRequest { verbose: false })).await?;
        Ok(st
            .status
            .map(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .map(|c| RuntimeCondition { type_: c.r#type, status: c.status, reason: c.reason, message: c.message })
            .collect())
    }
}

/// The pod lifecycle calls, each with [`WORK_TIMEOUT`] (pulls [`PULL_TIMEOUT`], listing and
/// status [`CALL_TIMEOUT`] x 5).
impl Runtime {
    pub async fn list_sandboxes(
        &mut self,
        labels: HashMap<String, String>,
    ) -> Result<Vec<api::PodSandbox>, CriError> {
        let req = api::ListPodSandboxRequest {
            filter: Some(api::PodSandboxFilter { label_selector: labels, ..Default::default() }),
        };
        Ok(call_within("ListPodSandbox", CALL_TIMEOUT * 5, self.runtime.list_pod_sandbox(req)).await?.items)
    }

    pub async fn sandbox_status(&mut self, id: &str) -> Result<Option<api::PodSandboxStatus>, CriError> {
        let req = api::PodSandboxStatusRequest { pod_sandbox_id: id.into(), verbose: false };
        Ok(call_within("PodSandboxStatus", CALL_TIMEOUT * 5, self.runtime.pod_sandbox_status(req)).await?.status)
    }

    pub async fn list_containers(
        &mut self,
        labels: HashMap<String, String>,
    ) -> Result<Vec<api::Container>, CriError> {
        let req = api::ListContainersRequest {
            filter: Some(api::ContainerFilter { label_selector: labels, ..Default::default() }),
        };
        Ok(call_within("ListContainers", CALL_TIMEOUT * 5, self.runtime.list_containers(req)).await?.containers)
    }

    pub async fn container_status(&mut self, id: &str) -> Result<Option<api::ContainerStatus>, CriError> {
        let req = api::ContainerStatusRequest { container_id: id.into(), verbose: false };
        Ok(call_within("ContainerStatus", CALL_TIMEOUT * 5, self.runtime.container_status(req)).await?.status)
    }

    pub async fn run_sandbox(&mut self, config: api::PodSandboxConfig) -> Result<String, CriError> {
        let req = api::RunPodSandboxRequest { config: Some(config), runtime_handler: String::new() };
        Ok(call_within("RunPodSandbox", WORK_TIMEOUT, self.runtime.run_pod_sandbox(req)).await?.pod_sandbox_id)
    }

    pub async fn stop_sandbox(&mut self, id: &str) -> Result<(), CriError> {
        let req = api::StopPodSandboxRequest { pod_sandbox_id: id.into() };
        call_within("StopPodSandbox", WORK_TIMEOUT, self.runtime.stop_pod_sandbox(req)).await.map(|_| ())
    }

    pub async fn remove_sandbox(&mut self, id: &str) -> Result<(), CriError> {
        let req = api::RemovePodSandboxRequest { pod_sandbox_id: id.into() };
        call_within("RemovePodSandbox", WORK_TIMEOUT, self.runtime.remove_pod_sandbox(req)).await.map(|_| ())
    }

    pub async fn create_container(
        &mut self,
        sandbox_id: &str,
        config: api::ContainerConfig,
        sandbox_config: api::PodSandboxConfig,
    ) -> Result<String, CriError> {
        let req = api::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.into(),
            config: Some(config),
            sandbox_config: Some(sandbox_config),
        };
        Ok(call_within("CreateContainer", WORK_TIMEOUT, self.runtime.create_container(req)).await?.container_id)
    }

    pub async fn start_container(&mut self, id: &str) -> Result<(), CriError> {
        let req = api::StartContainerRequest { container_id: id.into() };
        call_within("StartContainer", WORK_TIMEOUT, self.runtime.start_container(req)).await.map(|_| ())
    }

    /// StopContainer with a grace period in seconds (the runtime sends SIGTERM, then SIGKILL).
    pub async fn stop_container(&mut self, id: &str, grace_seconds: i64) -> Result<(), CriError> {
        let req = api::StopContainerRequest { container_id: id.into(), timeout: grace_seconds.max(0) };
        let limit = WORK_TIMEOUT + Duration::from_secs(grace_seconds.max(0).unsigned_abs());
        call_within("StopContainer", limit, self.runtime.stop_container(req)).await.map(|_| ())
    }

    pub async fn remove_container(&mut self, id: &str) -> Result<(), CriError> {
        let req = api::RemoveContainerRequest { container_id: id.into() };
        call_within("RemoveContainer", WORK_TIMEOUT, self.runtime.remove_container(req)).await.map(|_| ())
    }

    /// ExecSync: (exit code, stdout + stderr).
    pub async fn exec_sync(&mut self, id: &str, cmd: Vec<String>, timeout: Duration) -> Result<(i32, Vec<u8>), CriError> {
        let req = api::ExecSyncRequest { container_id: id.into(), cmd, timeout: timeout.as_secs().max(1).try_into().unwrap_or(i64::MAX) };
        let r = call_within("ExecSync", timeout + CALL_TIMEOUT * 5, self.runtime.exec_sync(req)).await?;
        let mut out = r.stdout;
        out.extend_from_slice(&r.stderr);
        Ok((r.exit_code, out))
    }

    /// ListContainerStats of the containers with `labels`: working set, writable layer.
    pub async fn list_container_stats(&mut self, labels: HashMap<String, String>) -> Result<Vec<api::ContainerStats>, CriError> {
        let req = api::ListContainerStatsRequest {
            filter: Some(api::ContainerStatsFilter { label_selector: labels, ..Default::default() }),
        };
        Ok(call_within("ListContainerStats", CALL_TIMEOUT * 5, self.runtime.list_container_stats(req)).await?.stats)
    }

    /// ListPodSandboxStats of the sandboxes with `labels`: the pods' CPU, memory, network and
    /// processes (Unimplemented on runtimes without it).
    pub async fn list_pod_sandbox_stats(&mut self, labels: HashMap<String, String>) -> Result<Vec<api::PodSandboxStats>, CriError> {
        let req = api::ListPodSandboxStatsRequest {
            filter: Some(api::PodSandboxStatsFilter { label_selector: labels, ..Default::default() }),
        };
        Ok(call_within("ListPodSandboxStats", CALL_TIMEOUT * 5, self.runtime.list_pod_sandbox_stats(req)).await?.stats)
    }

    /// The image's id when present on the node.
    pub async fn image_present(&mut self, image: &str) -> Result<Option<String>, CriError> {
        Ok(self.image_status(image).await?.map(|i| i.id))
    }

    /// ImageService.ImageStatus: the image when present on the node (id, names, size, and the
    /// user it runs as: `uid` or `username`).
    pub async fn image_status(&mut self, image: &str) -> Result<Option<api::Image>, CriError> {
        let req = api::ImageStatusRequest {
            image: Some(api::ImageSpec { image: image.into(), ..Default::default() }),
            verbose: false,
        };
        Ok(call_within("ImageStatus", CALL_TIMEOUT * 5, self.image.image_status(req)).await?.image)
    }

    /// ImageService.ImageFsInfo: the filesystems holding images (mountpoint, bytes used).
    pub async fn image_fs_info(&mut self) -> Result<Vec<api::FilesystemUsage>, CriError> {
        let r = call_within("ImageFsInfo", CALL_TIMEOUT * 5, self.image.image_fs_info(api::ImageFsInfoRequest {})).await?;
        Ok(r.image_filesystems)
    }

    /// ImageService.ListImages: every image.
    pub async fn list_images(&mut self) -> Result<Vec<api::Image>, CriError> {
        let req = api::ListImagesRequest { filter: None };
        Ok(call_within("ListImages", CALL_TIMEOUT * 5, self.image.list_images(req)).await?.images)
    }

    /// ImageService.RemoveImage by id or name (a missing image is NotFound or success, as the
    /// runtime decides).
    pub async fn remove_image(&mut self, image: &str) -> Result<(), CriError> {
        let req = api::RemoveImageRequest { image: Some(api::ImageSpec { image: image.into(), ..Default::default() }) };
        call_within("RemoveImage", WORK_TIMEOUT, self.image.remove_image(req)).await.map(|_| ())
    }

    /// RuntimeService.Status with verbose=true: the runtime's info map (containerd puts its CRI
    /// plugin config JSON under `config`).
    pub async fn status_info(&mut self) -> Result<HashMap<String, String>, CriError> {
        Ok(call_within("Status", CALL_TIMEOUT * 5, self.runtime.status(StatusRequest { verbose: true })).await?.info)
    }

    /// PullImage: the image reference the runtime resolved.
    pub async fn pull_image(&mut self, image: &str, sandbox: Option<api::PodSandboxConfig>) -> Result<String, CriError> {
        let req = api::PullImageRequest {
            image: Some(api::ImageSpec { image: image.into(), ..Default::default() }),
            auth: None,
            sandbox_config: sandbox,
        };
        Ok(call_within("PullImage", PULL_TIMEOUT, self.image.pull_image(req)).await?.image_ref)
    }
}

/// The CRI calls the pod workers and the image GC make, as one narrow trait: [`Runtime`] (the
/// containerd client) is one implementation, [`fake::FakeCri`] (an in-memory runtime that
/// records every call) the other, so the pod lifecycle is tested without root or containerd.
#[async_trait::async_trait]
pub trait Cri: Send + Sync + 'static {
    async fn list_sandboxes(&self, labels: HashMap<String, String>) -> Result<Vec<api::PodSandbox>, CriError>;
    async fn sandbox_status(&self, id: &str) -> Result<Option<api::PodSandboxStatus>, CriError>;
    async fn list_containers(&self, labels: HashMap<String, String>) -> Result<Vec<api::Container>, CriError>;
    async fn container_status(&self, id: &str) -> Result<Option<api::ContainerStatus>, CriError>;
    async fn run_sandbox(&self, config: api::PodSandboxConfig) -> Result<String, CriError>;
    async fn stop_sandbox(&self, id: &str) -> Result<(), CriError>;
    async fn remove_sandbox(&self, id: &str) -> Result<(), CriError>;
    async fn create_container(
        &self,
        sandbox_id: &str,
        config: api::ContainerConfig,
        sandbox_config: api::PodSandboxConfig,
    ) -> Result<String, CriError>;
    async fn start_container(&self, id: &str) -> Result<(), CriError>;
    /// StopContainer with a grace period in seconds (SIGTERM, then SIGKILL).
    async fn stop_container(&self, id: &str, grace_seconds: i64) -> Result<(), CriError>;
    async fn remove_container(&self, id: &str) -> Result<(), CriError>;
    /// ExecSync: (exit code, stdout + stderr).
    async fn exec_sync(&self, id: &str, cmd: Vec<String>, timeout: Duration) -> Result<(i32, Vec<u8>), CriError>;
    async fn image_status(&self, image: &str) -> Result<Option<api::Image>, CriError>;
    /// The image's id when present on the node.
    async fn image_present(&self, image: &str) -> Result<Option<String>, CriError> {
        Ok(self.image_status(image).await?.map(|i| i.id))
    }
    async fn pull_image(&self, image: &str, sandbox: Option<api::PodSandboxConfig>) -> Result<String, CriError>;
    async fn list_images(&self) -> Result<Vec<api::Image>, CriError>;
    async fn remove_image(&self, image: &str) -> Result<(), CriError>;
    async fn image_fs_info(&self) -> Result<Vec<api::FilesystemUsage>, CriError>;
    /// RuntimeService.Status's verbose info map.
    async fn status_info(&self) -> Result<HashMap<String, String>, CriError>;
    /// ListContainerStats of the containers with `labels` (the eviction manager's usage).
    async fn list_container_stats(&self, labels: HashMap<String, String>) -> Result<Vec<api::ContainerStats>, CriError>;
    /// ListPodSandboxStats of the sandboxes with `labels` (the Summary API's pod usage).
    async fn list_pod_sandbox_stats(&self, labels: HashMap<String, String>) -> Result<Vec<api::PodSandboxStats>, CriError>;
}

/// Every call on a clone of the client (tonic clients are cheap handles on one channel).
#[async_trait::async_trait]
impl Cri for Runtime {
    async fn list_sandboxes(&self, labels: HashMap<String, String>) -> Result<Vec<api::PodSandbox>, CriError> {
        Runtime::list_sandboxes(&mut self.clone(), labels).await
    }
    async fn sandbox_status(&self, id: &str) -> Result<Option<api::PodSandboxStatus>, CriError> {
        Runtime::sandbox_status(&mut self.clone(), id).await
    }
    async fn list_containers(&self, labels: HashMap<String, String>) -> Result<Vec<api::Container>, CriError> {
        Runtime::list_containers(&mut self.clone(), labels).await
    }
    async fn container_status(&self, id: &str) -> Result<Option<api::ContainerStatus>, CriError> {
        Runtime::container_status(&mut self.clone(), id).await
    }
    async fn run_sandbox(&self, config: api::PodSandboxConfig) -> Result<String, CriError> {
        Runtime::run_sandbox(&mut self.clone(), config).await
    }
    async fn stop_sandbox(&self, id: &str) -> Result<(), CriError> {
        Runtime::stop_sandbox(&mut self.clone(), id).await
    }
    async fn remove_sandbox(&self, id: &str) -> Result<(), CriError> {
        Runtime::remove_sandbox(&mut self.clone(), id).await
    }
    async fn create_container(
        &self,
        sandbox_id: &str,
        config: api::ContainerConfig,
        sandbox_config: api::PodSandboxConfig,
    ) -> Result<String, CriError> {
        Runtime::create_container(&mut self.clone(), sandbox_id, config, sandbox_config).await
    }
    async fn start_container(&self, id: &str) -> Result<(), CriError> {
        Runtime::start_container(&mut self.clone(), id).await
    }
    async fn stop_container(&self, id: &str, grace_seconds: i64) -> Result<(), CriError> {
        Runtime::stop_container(&mut self.clone(), id, grace_seconds).await
    }
    async fn remove_container(&self, id: &str) -> Result<(), CriError> {
        Runtime::remove_container(&mut self.clone(), id).await
    }
    async fn exec_sync(&self, id: &str, cmd: Vec<String>, timeout: Duration) -> Result<(i32, Vec<u8>), CriError> {
        Runtime::exec_sync(&mut self.clone(), id, cmd, timeout).await
    }
    async fn image_status(&self, image: &str) -> Result<Option<api::Image>, CriError> {
        Runtime::image_status(&mut self.clone(), image).await
    }
    async fn pull_image(&self, image: &str, sandbox: Option<api::PodSandboxConfig>) -> Result<String, CriError> {
        Runtime::pull_image(&mut self.clone(), image, sandbox).await
    }
    async fn list_images(&self) -> Result<Vec<api::Image>, CriError> {
        Runtime::list_images(&mut self.clone()).await
    }
    async fn remove_image(&self, image: &str) -> Result<(), CriError> {
        Runtime::remove_image(&mut self.clone(), image).await
    }
    async fn image_fs_info(&self) -> Result<Vec<api::FilesystemUsage>, CriError> {
        Runtime::image_fs_info(&mut self.clone()).await
    }
    async fn status_info(&self) -> Result<HashMap<String, String>, CriError> {
        Runtime::status_info(&mut self.clone()).await
    }
    async fn list_container_stats(&self, labels: HashMap<String, String>) -> Result<Vec<api::ContainerStats>, CriError> {
        Runtime::list_container_stats(&mut self.clone(), labels).await
    }
    async fn list_pod_sandbox_stats(&self, labels: HashMap<String, String>) -> Result<Vec<api::PodSandboxStats>, CriError> {
        Runtime::list_pod_sandbox_stats(&mut self.clone(), labels).await
    }
}

/// Probes the runtime for the node status: keeps one connection, drops it on any error and
/// reconnects on the next probe, so the runtime coming back is picked up.
#[derive(Debug)]
pub struct Prober {
    socket: PathBuf,
    conn: Option<Runtime>,
    /// The last version the runtime reported (kept while it is down).
    version: Option<String>,
}

impl Prober {
    pub fn new(socket: PathBuf) -> Self {
        Prober { socket, conn: None, version: None }
    }

    /// The runtime's version for nodeInfo, once it has been reached.
    pub fn version(&self) -> Option<&str> {
        self.version.as_deref()
    }

    /// The node health from one Version (until known) and one Status call.
    pub async fn probe(&mut self) -> Health {
        let conditions = match self.try_probe().await {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::debug!(error = %e, socket = %self.socket.display(), "container runtime unreachable");
                self.conn = None;
                None
            }
        };
        let mut h = node::runtime_health(conditions.as_deref());
        h.runtime_version = self.version.clone();
        h
    }

    async fn try_probe(&mut self) -> Result<Vec<RuntimeCondition>, CriError> {
        if self.conn.is_none() {
            self.conn = Some(connect(&self.socket).await?);
        }
        let Some(rt) = self.conn.as_mut() else {
            return Err(CriError::Connect(self.socket.clone(), "not connected".into()));
        };
        if self.version.is_none() {
            let v = rt.version().await?;
            tracing::info!(runtime = %v.node_info(), api = %v.runtime_api_version, "container runtime version");
            self.version = Some(v.node_info());
        }
        rt.status().await
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn node_info_version_format() {
        let v = RuntimeVersion {
            runtime_name: "containerd".into(),
            runtime_version: "1.6.20".into(),
            runtime_api_version: "v1".into(),
        };
        assert_eq!(v.node_info(), "containerd://1.6.20");
    }

    #[tokio::test]
    async fn missing_socket_is_down_quickly() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = Prober::new(dir.path().join("none.sock"));
        let t = std::time::Instant::now();
        let h = p.probe().await;
        assert!(!h.runtime_ready);
        assert!(t.elapsed() < CALL_TIMEOUT * 2);
    }

    #[tokio::test]
    async fn hung_runtime_times_out() {
        // A socket that accepts but never speaks: the probe gives up after the call timeout.
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("hung.sock");
        let _l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let mut p = Prober::new(sock);
        let t = std::time::Instant::now();
        let h = p.probe().await;
        assert!(!h.runtime_ready);
        assert!(t.elapsed() < CALL_TIMEOUT * 3, "{:?}", t.elapsed());
    }
}
