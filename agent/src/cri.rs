//! The agent's CRI client: runtime.v1 RuntimeService and ImageService over a `unix://` socket.
//!
//! The channel is the same one crates/lab/src/cri.rs opens (k8s-cri's tonic clients on a unix
//! stream). It is a small copy rather than shared so that the agent does not depend on the test
//! lab (and the lab not on the agent's kube stack).

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{StatusRequest, VersionRequest};
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::node::{self, Health, RuntimeCondition};

/// How long one CRI call may take before the runtime counts as down.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(2);

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

/// A connected channel to the CRI socket at `socket` (within [`CALL_TIMEOUT`]).
pub async fn channel(socket: &Path) -> Result<Channel, CriError> {
    let path: PathBuf = socket.to_path_buf();
    // The URI is required by tonic but unused: every connection goes to the socket.
    let endpoint = Endpoint::from_static("http://[::]:50051").connect_timeout(CALL_TIMEOUT);
    let connect = endpoint.connect_with_connector(tower::service_fn(move |_: Uri| {
        let path = path.clone();
        async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
    }));
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
    match tokio::time::timeout(CALL_TIMEOUT, fut).await {
        Ok(Ok(r)) => Ok(r.into_inner()),
        Ok(Err(s)) => Err(CriError::Call(what, s)),
        Err(_) => Err(CriError::Timeout(what, CALL_TIMEOUT)),
    }
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
