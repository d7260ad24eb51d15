//! CSI Identity: the driver's name and version, its capabilities, and readiness.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::Mode;
use crate::proto::identity_server::Identity;
use crate::proto::plugin_capability::{service, volume_expansion, Service, Type, VolumeExpansion};
use crate::proto::*;
use crate::volume::engine::Engine;
use crate::volume::host::Host;
use crate::volume::names::DRIVER_NAME;

pub struct IdentityService<H: Host> {
    pub engine: Arc<Engine<H>>,
    pub mode: Mode,
}

#[tonic::async_trait]
impl<H: Host> Identity for IdentityService<H> {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: DRIVER_NAME.into(),
            vendor_version: env!("CARGO_PKG_VERSION").into(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        let svc = |t: service::Type| PluginCapability {
            r#type: Some(Type::Service(Service { r#type: t as i32 })),
        };
        let mut capabilities = vec![svc(service::Type::VolumeAccessibilityConstraints)];
        if self.mode != Mode::Node {
            capabilities.push(svc(service::Type::ControllerService));
        }
        capabilities.push(PluginCapability {
            r#type: Some(Type::VolumeExpansion(VolumeExpansion {
                r#type: volume_expansion::Type::Online as i32,
            })),
        });
        Ok(Response::new(GetPluginCapabilitiesResponse {
            capabilities,
        }))
    }

    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        // Ready when the data dir can be read: the engine has nothing else to wait for.
        let root = self.engine.layout().root().to_path_buf();
        let ready = tokio::task::spawn_blocking(move || std::fs::metadata(root).is_ok())
            .await
            .map_err(|e| Status::internal(e.to_string()))?;
        if !ready {
            return Err(Status::failed_precondition("the data dir is not readable"));
        }
        Ok(Response::new(ProbeResponse { ready: Some(true) }))
    }
}
