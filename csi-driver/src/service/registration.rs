//! kubelet plugin registration (the node-driver-registrar's job): a `Registration` service on
//! `<kubelet plugins_registry>/loop.csi.ferro.dev-reg.sock` telling the kubelet (ferro-agent)
//! the driver's name and CSI endpoint. The socket is removed when ferro-csi stops, which is
//! how the kubelet learns that the plugin went away.

use std::path::{Path, PathBuf};

use csi_proto::registration::registration_server::{Registration, RegistrationServer};
use csi_proto::registration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use tonic::{Request, Response, Status};
use tracing::{error, info};

use crate::volume::names::DRIVER_NAME;

pub struct RegistrationService {
    pub endpoint: PathBuf,
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: "CSIPlugin".into(),
            name: DRIVER_NAME.into(),
            endpoint: self.endpoint.to_string_lossy().into_owned(),
            supported_versions: vec!["1.0.0".into()],
        }))
    }

    async fn notify_registration_status(
        &self,
        req: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let st = req.into_inner();
        if st.plugin_registered {
            info!("the kubelet registered the driver");
        } else {
            error!(error = %st.error, "the kubelet refused to register the driver");
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

/// The registration socket's path in the kubelet's registry dir.
pub fn socket_in(registry_dir: &Path) -> PathBuf {
    registry_dir.join(format!("{DRIVER_NAME}-reg.sock"))
}

/// Serves registration until `shutdown`, then removes the socket.
pub async fn serve_registration(
    registry_dir: &Path,
    csi_endpoint: &Path,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(registry_dir)?;
    let socket = socket_in(registry_dir);
    match std::fs::remove_file(&socket) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
        _ => {}
    }
    let listener = tokio::net::UnixListener::bind(&socket)?;
    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
    let svc = RegistrationService {
        endpoint: csi_endpoint.to_path_buf(),
    };
    let served = tonic::transport::Server::builder()
        .add_service(RegistrationServer::new(svc))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await;
    if let Err(e) = std::fs::remove_file(&socket) {
        if e.kind() != std::io::ErrorKind::NotFound {
            error!(socket = %socket.display(), error = %e, "removing the registration socket");
        }
    }
    served?;
    Ok(())
}
