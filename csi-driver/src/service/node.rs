//! CSI Node: staging, publishing, growth, usage and the node's identity and topology.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::blocking;
use super::controller::topology;
use crate::proto::node_server::Node;
use crate::proto::node_service_capability::rpc::Type as Rpc;
use crate::proto::node_service_capability::{Rpc as RpcCap, Type as CapType};
use crate::proto::volume_usage::Unit;
use crate::proto::*;
use crate::volume::engine::Engine;
use crate::volume::host::Host;
use crate::volume::node::Usage;

pub struct NodeService<H: Host> {
    pub engine: Arc<Engine<H>>,
}

pub const CAPABILITIES: &[Rpc] = &[
    Rpc::StageUnstageVolume,
    Rpc::GetVolumeStats,
    Rpc::ExpandVolume,
    Rpc::VolumeCondition,
    Rpc::SingleNodeMultiWriter,
];

fn usage(u: Usage) -> Vec<VolumeUsage> {
    let i = |v: u64| v as i64;
    match u {
        Usage::Fs(s) => vec![
            VolumeUsage {
                available: i(s.available_bytes),
                total: i(s.total_bytes),
                used: i(s.used_bytes),
                unit: Unit::Bytes as i32,
            },
            VolumeUsage {
                available: i(s.free_inodes),
                total: i(s.total_inodes),
                used: i(s.used_inodes),
                unit: Unit::Inodes as i32,
            },
        ],
        Usage::Block { total_bytes } => {
            vec![VolumeUsage {
                available: 0,
                total: i(total_bytes),
                used: 0,
                unit: Unit::Bytes as i32,
            }]
        }
    }
}

#[tonic::async_trait]
impl<H: Host> Node for NodeService<H> {
    async fn node_stage_volume(
        &self,
        req: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        let r = req.into_inner();
        let id = r.volume_id.clone();
        blocking(&self.engine, "NodeStageVolume", &id, move |e| {
            e.stage(
                &r.volume_id,
                &r.staging_target_path,
                r.volume_capability.as_ref(),
            )
        })
        .await?;
        Ok(Response::new(NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume(
        &self,
        req: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        let r = req.into_inner();
        let id = r.volume_id.clone();
        blocking(&self.engine, "NodeUnstageVolume", &id, move |e| {
            e.unstage(&r.volume_id, &r.staging_target_path)
        })
        .await?;
        Ok(Response::new(NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(
        &self,
        req: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let r = req.into_inner();
        let id = r.volume_id.clone();
        blocking(&self.engine, "NodePublishVolume", &id, move |e| {
            e.node_publish(
                &r.volume_id,
                &r.staging_target_path,
                &r.target_path,
                r.volume_capability.as_ref(),
                r.readonly,
                &r.volume_context,
            )
        })
        .await?;
        Ok(Response::new(NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        req: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let r = req.into_inner();
        let id = r.volume_id.clone();
        blocking(&self.engine, "NodeUnpublishVolume", &id, move |e| {
            e.unpublish(&r.volume_id, &r.target_path)
        })
        .await?;
        Ok(Response::new(NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(
        &self,
        req: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        let r = req.into_inner();
        let id = r.volume_id.clone();
        let (u, condition) = blocking(&self.engine, "NodeGetVolumeStats", &id, move |e| {
            e.stats(&r.volume_id, &r.volume_path)
        })
        .await?;
        Ok(Response::new(NodeGetVolumeStatsResponse {
            usage: usage(u),
            volume_condition: Some(VolumeCondition {
                abnormal: condition.abnormal,
                message: condition.message,
            }),
        }))
    }

    async fn node_expand_volume(
        &self,
        req: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        let r = req.into_inner();
        let id = r.volume_id.clone();
        let size = blocking(&self.engine, "NodeExpandVolume", &id, move |e| {
            e.node_expand(&r.volume_id, &r.volume_path)
        })
        .await?;
        Ok(Response::new(NodeExpandVolumeResponse {
            capacity_bytes: size as i64,
        }))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        let capabilities = CAPABILITIES
            .iter()
            .map(|t| NodeServiceCapability {
                r#type: Some(CapType::Rpc(RpcCap { r#type: *t as i32 })),
            })
            .collect();
        Ok(Response::new(NodeGetCapabilitiesResponse { capabilities }))
    }

    async fn node_get_info(
        &self,
        _: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        let node = self.engine.config().node_id.clone();
        Ok(Response::new(NodeGetInfoResponse {
            node_id: node.clone(),
            max_volumes_per_node: 0,
            accessible_topology: Some(topology(&node)),
        }))
    }
}
