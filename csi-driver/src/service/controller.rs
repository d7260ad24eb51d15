//! CSI Controller. Volumes are node-local, so the controller of a node's ferro-csi provisions
//! on that node only: a request whose topology requirement names another node is
//! ResourceExhausted (the provisioner routes each CreateVolume to the selected node's driver;
//! docs/design/csi.md).

use std::collections::HashMap;
use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::blocking;
use crate::proto::controller_server::Controller;
use crate::proto::controller_service_capability::rpc::Type as Rpc;
use crate::proto::controller_service_capability::{Rpc as RpcCap, Type as CapType};
use crate::proto::volume_content_source::{SnapshotSource, Type as SourceType, VolumeSource};
use crate::proto::*;
use crate::volume::controller::{page, CreateRequest};
use crate::volume::engine::Engine;
use crate::volume::host::Host;
use crate::volume::names::TOPOLOGY_KEY;
use crate::volume::record::{SnapshotRecord, Source, VolumeRecord};

pub struct ControllerService<H: Host> {
    pub engine: Arc<Engine<H>>,
}

/// The controller capabilities ferro-csi implements, each behaving as the spec says.
pub const CAPABILITIES: &[Rpc] = &[
    Rpc::CreateDeleteVolume,
    Rpc::ListVolumes,
    Rpc::GetCapacity,
    Rpc::CreateDeleteSnapshot,
    Rpc::ListSnapshots,
    Rpc::CloneVolume,
    Rpc::ExpandVolume,
    Rpc::GetVolume,
    Rpc::SingleNodeMultiWriter,
];

pub(crate) fn topology(node: &str) -> Topology {
    Topology {
        segments: HashMap::from([(TOPOLOGY_KEY.to_string(), node.to_string())]),
    }
}

pub(crate) fn volume_message(rec: &VolumeRecord, node: &str) -> Volume {
    Volume {
        capacity_bytes: rec.size as i64,
        volume_id: rec.id.clone(),
        volume_context: rec
            .parameters
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        content_source: rec.source.as_ref().map(|s| VolumeContentSource {
            r#type: Some(match s {
                Source::Snapshot(id) => SourceType::Snapshot(SnapshotSource {
                    snapshot_id: id.clone(),
                }),
                Source::Volume(id) => SourceType::Volume(VolumeSource {
                    volume_id: id.clone(),
                }),
            }),
        }),
        accessible_topology: vec![topology(node)],
    }
}

fn snapshot_message(rec: &SnapshotRecord) -> Snapshot {
    let creation_time =
        rec.created
            .parse::<jiff::Timestamp>()
            .ok()
            .map(|t| prost_types::Timestamp {
                seconds: t.as_second(),
                nanos: t.subsec_nanosecond(),
            });
    Snapshot {
        size_bytes: rec.size as i64,
        snapshot_id: rec.id.clone(),
        source_volume_id: rec.source_volume_id.clone(),
        creation_time,
        ready_to_use: true,
        group_snapshot_id: String::new(),
    }
}

/// Whether a topology requirement lets the volume be on `node`: no requirement, or a
/// requisite (or, without requisites, a preferred) segment set naming it.
fn topology_allows(req: Option<&TopologyRequirement>, node: &str) -> bool {
    let Some(req) = req else { return true };
    let names = |t: &Topology| t.segments.get(TOPOLOGY_KEY).is_none_or(|n| n == node);
    let set = if req.requisite.is_empty() {
        &req.preferred
    } else {
        &req.requisite
    };
    set.is_empty() || set.iter().any(names)
}

#[tonic::async_trait]
impl<H: Host> Controller for ControllerService<H> {
    async fn create_volume(
        &self,
        req: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        let r = req.into_inner();
        let node = self.engine.config().node_id.clone();
        if !topology_allows(r.accessibility_requirements.as_ref(), &node) {
            return Err(Status::resource_exhausted(format!(
                "the topology requirement does not include node {node}, the only node this driver instance provisions on"
            )));
        }
        let source = match r
            .volume_content_source
            .as_ref()
            .and_then(|s| s.r#type.as_ref())
        {
            None => None,
            Some(SourceType::Snapshot(s)) => Some(Source::Snapshot(s.snapshot_id.clone())),
            Some(SourceType::Volume(v)) => Some(Source::Volume(v.volume_id.clone())),
        };
        let name = r.name.clone();
        let rec = blocking(&self.engine, "CreateVolume", &name, move |e| {
            e.create_volume(CreateRequest {
                name: &r.name,
                range: r.capacity_range.as_ref(),
                capabilities: &r.volume_capabilities,
                parameters: &r.parameters,
                source,
            })
        })
        .await?;
        Ok(Response::new(CreateVolumeResponse {
            volume: Some(volume_message(&rec, &node)),
        }))
    }

    async fn delete_volume(
        &self,
        req: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        let id = req.into_inner().volume_id;
        blocking(&self.engine, "DeleteVolume", &id.clone(), move |e| {
            e.delete_volume(&id)
        })
        .await?;
        Ok(Response::new(DeleteVolumeResponse {}))
    }

    async fn controller_publish_volume(
        &self,
        _: Request<ControllerPublishVolumeRequest>,
    ) -> Result<Response<ControllerPublishVolumeResponse>, Status> {
        Err(Status::unimplemented(
            "ferro-csi has no attach step: volumes are node-local",
        ))
    }

    async fn controller_unpublish_volume(
        &self,
        _: Request<ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<ControllerUnpublishVolumeResponse>, Status> {
        Err(Status::unimplemented(
            "ferro-csi has no attach step: volumes are node-local",
        ))
    }

    async fn validate_volume_capabilities(
        &self,
        req: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<ValidateVolumeCapabilitiesResponse>, Status> {
        let r = req.into_inner();
        let (id, caps, params) = (
            r.volume_id.clone(),
            r.volume_capabilities.clone(),
            r.parameters.clone(),
        );
        let verdict = blocking(
            &self.engine,
            "ValidateVolumeCapabilities",
            &id.clone(),
            move |e| e.validate(&id, &caps, &params),
        )
        .await?;
        Ok(Response::new(match verdict {
            None => ValidateVolumeCapabilitiesResponse {
                confirmed: Some(validate_volume_capabilities_response::Confirmed {
                    volume_context: r.volume_context,
                    volume_capabilities: r.volume_capabilities,
                    parameters: r.parameters,
                    mutable_parameters: r.mutable_parameters,
                }),
                message: String::new(),
            },
            Some(reason) => ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message: reason,
            },
        }))
    }

    async fn list_volumes(
        &self,
        req: Request<ListVolumesRequest>,
    ) -> Result<Response<ListVolumesResponse>, Status> {
        let r = req.into_inner();
        let node = self.engine.config().node_id.clone();
        let all = blocking(&self.engine, "ListVolumes", "", |e| e.volumes()).await?;
        let (items, next_token) =
            page(&all, r.max_entries, &r.starting_token).map_err(|e| super::status(e.into()))?;
        let entries = items
            .iter()
            .map(|rec| list_volumes_response::Entry {
                volume: Some(volume_message(rec, &node)),
                status: None,
            })
            .collect();
        Ok(Response::new(ListVolumesResponse {
            entries,
            next_token,
        }))
    }

    async fn get_capacity(
        &self,
        req: Request<GetCapacityRequest>,
    ) -> Result<Response<GetCapacityResponse>, Status> {
        let r = req.into_inner();
        let node = self.engine.config().node_id.clone();
        let elsewhere = r
            .accessible_topology
            .as_ref()
            .and_then(|t| t.segments.get(TOPOLOGY_KEY))
            .is_some_and(|n| *n != node);
        for cap in &r.volume_capabilities {
            if let Err(e) = crate::volume::plan::capability(cap) {
                // A capability the driver cannot serve has no capacity, per the spec.
                tracing::debug!(error = %e, "GetCapacity for an unsupported capability");
                return Ok(Response::new(GetCapacityResponse {
                    available_capacity: 0,
                    ..Default::default()
                }));
            }
        }
        if let Err(e) = crate::volume::plan::Params::parse(&r.parameters) {
            return Err(Status::invalid_argument(e.to_string()));
        }
        let available = if elsewhere {
            0
        } else {
            blocking(&self.engine, "GetCapacity", "", |e| e.available()).await?
        };
        Ok(Response::new(GetCapacityResponse {
            available_capacity: available as i64,
            maximum_volume_size: Some(available as i64),
            minimum_volume_size: Some(crate::volume::plan::MIB as i64),
        }))
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
        let capabilities = CAPABILITIES
            .iter()
            .map(|t| ControllerServiceCapability {
                r#type: Some(CapType::Rpc(RpcCap { r#type: *t as i32 })),
            })
            .collect();
        Ok(Response::new(ControllerGetCapabilitiesResponse {
            capabilities,
        }))
    }

    async fn create_snapshot(
        &self,
        req: Request<CreateSnapshotRequest>,
    ) -> Result<Response<CreateSnapshotResponse>, Status> {
        let r = req.into_inner();
        if !r.parameters.is_empty() {
            let mut keys: Vec<_> = r.parameters.keys().cloned().collect();
            keys.sort();
            return Err(Status::invalid_argument(format!(
                "unknown snapshot parameters {keys:?} (ferro-csi takes none)"
            )));
        }
        let name = r.name.clone();
        let rec = blocking(&self.engine, "CreateSnapshot", &name, move |e| {
            e.create_snapshot(&r.source_volume_id, &r.name)
        })
        .await?;
        Ok(Response::new(CreateSnapshotResponse {
            snapshot: Some(snapshot_message(&rec)),
        }))
    }

    async fn delete_snapshot(
        &self,
        req: Request<DeleteSnapshotRequest>,
    ) -> Result<Response<DeleteSnapshotResponse>, Status> {
        let id = req.into_inner().snapshot_id;
        blocking(&self.engine, "DeleteSnapshot", &id.clone(), move |e| {
            e.delete_snapshot(&id)
        })
        .await?;
        Ok(Response::new(DeleteSnapshotResponse {}))
    }

    async fn list_snapshots(
        &self,
        req: Request<ListSnapshotsRequest>,
    ) -> Result<Response<ListSnapshotsResponse>, Status> {
        let r = req.into_inner();
        let all = blocking(&self.engine, "ListSnapshots", "", |e| e.snapshots()).await?;
        let filtered: Vec<SnapshotRecord> = all
            .into_iter()
            .filter(|s| r.snapshot_id.is_empty() || s.id == r.snapshot_id)
            .filter(|s| r.source_volume_id.is_empty() || s.source_volume_id == r.source_volume_id)
            .collect();
        let (items, next_token) = page(&filtered, r.max_entries, &r.starting_token)
            .map_err(|e| super::status(e.into()))?;
        let entries = items
            .iter()
            .map(|s| list_snapshots_response::Entry {
                snapshot: Some(snapshot_message(s)),
            })
            .collect();
        Ok(Response::new(ListSnapshotsResponse {
            entries,
            next_token,
        }))
    }

    async fn get_snapshot(
        &self,
        req: Request<GetSnapshotRequest>,
    ) -> Result<Response<GetSnapshotResponse>, Status> {
        let id = req.into_inner().snapshot_id;
        if id.is_empty() {
            return Err(Status::invalid_argument("snapshot id missing"));
        }
        let all = blocking(&self.engine, "GetSnapshot", &id.clone(), |e| e.snapshots()).await?;
        let snap = all
            .iter()
            .find(|s| s.id == id)
            .ok_or_else(|| Status::not_found(format!("snapshot {id:?} does not exist")))?;
        Ok(Response::new(GetSnapshotResponse {
            snapshot: Some(snapshot_message(snap)),
        }))
    }

    async fn controller_expand_volume(
        &self,
        req: Request<ControllerExpandVolumeRequest>,
    ) -> Result<Response<ControllerExpandVolumeResponse>, Status> {
        let r = req.into_inner();
        let id = r.volume_id.clone();
        let (size, node) = blocking(&self.engine, "ControllerExpandVolume", &id, move |e| {
            e.expand_volume(&r.volume_id, r.capacity_range.as_ref())
        })
        .await?;
        Ok(Response::new(ControllerExpandVolumeResponse {
            capacity_bytes: size as i64,
            node_expansion_required: node,
        }))
    }

    async fn controller_get_volume(
        &self,
        req: Request<ControllerGetVolumeRequest>,
    ) -> Result<Response<ControllerGetVolumeResponse>, Status> {
        let id = req.into_inner().volume_id;
        if id.is_empty() {
            return Err(Status::invalid_argument("volume id missing"));
        }
        let node = self.engine.config().node_id.clone();
        let all = blocking(&self.engine, "ControllerGetVolume", &id.clone(), |e| {
            e.volumes()
        })
        .await?;
        let rec = all
            .iter()
            .find(|v| v.id == id)
            .ok_or_else(|| Status::not_found(format!("volume {id:?} does not exist")))?;
        Ok(Response::new(ControllerGetVolumeResponse {
            volume: Some(volume_message(rec, &node)),
            status: Some(controller_get_volume_response::VolumeStatus {
                published_node_ids: if rec.published.is_empty() {
                    Vec::new()
                } else {
                    vec![node.clone()]
                },
                volume_condition: None,
            }),
        }))
    }

    async fn controller_modify_volume(
        &self,
        req: Request<ControllerModifyVolumeRequest>,
    ) -> Result<Response<ControllerModifyVolumeResponse>, Status> {
        let r = req.into_inner();
        if r.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume id missing"));
        }
        Err(Status::unimplemented("ferro-csi has no mutable parameters"))
    }
}
