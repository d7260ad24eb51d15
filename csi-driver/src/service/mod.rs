//! The CSI gRPC services over the engine: Identity, Controller, Node. Each request is checked,
//! run on tokio's blocking pool (the engine blocks on the host), and its error mapped to the
//! gRPC code the CSI spec names.

mod controller;
mod identity;
mod node;
pub mod registration;

use std::path::Path;
use std::sync::Arc;

use tonic::{Code, Status};
use tracing::{info_span, Instrument};

use crate::proto::controller_server::ControllerServer;
use crate::proto::identity_server::IdentityServer;
use crate::proto::node_server::NodeServer;
use crate::volume::engine::{Engine, EngineError};
use crate::volume::host::{Host, HostError};
use crate::volume::plan::PlanError;

pub use controller::ControllerService;
pub use identity::IdentityService;
pub use node::NodeService;

/// The gRPC status for an engine error.
pub fn status(err: EngineError) -> Status {
    let code = match &err {
        EngineError::Plan(p) => match p {
            PlanError::InvalidArgument(_) => Code::InvalidArgument,
            PlanError::NotFound(_) => Code::NotFound,
            PlanError::AlreadyExists(_) => Code::AlreadyExists,
            PlanError::OutOfRange(_) => Code::OutOfRange,
            PlanError::ResourceExhausted(_) => Code::ResourceExhausted,
            PlanError::FailedPrecondition(_) => Code::FailedPrecondition,
            PlanError::Aborted(_) => Code::Aborted,
        },
        EngineError::Host(h) if h.is_no_space() => Code::ResourceExhausted,
        EngineError::Host(HostError::MissingCapability(_)) => Code::FailedPrecondition,
        EngineError::Journal(_) | EngineError::Host(_) | EngineError::NoProgress { .. } => {
            Code::Internal
        }
    };
    Status::new(code, err.to_string())
}

/// Runs a blocking engine call inside a span named for the RPC and the object.
pub(crate) async fn blocking<H, T, F>(
    engine: &Arc<Engine<H>>,
    rpc: &'static str,
    object: &str,
    f: F,
) -> Result<T, Status>
where
    H: Host,
    T: Send + 'static,
    F: FnOnce(&Engine<H>) -> Result<T, EngineError> + Send + 'static,
{
    let engine = Arc::clone(engine);
    let span = info_span!("csi", rpc, object = %object);
    let inner = span.clone();
    let result = tokio::task::spawn_blocking(move || inner.in_scope(|| f(&engine)))
        .instrument(span.clone())
        .await
        .map_err(|e| Status::internal(format!("{rpc} panicked or was cancelled: {e}")))?;
    result.map_err(|e| {
        let st = status(e);
        span.in_scope(
            || tracing::warn!(code = ?st.code(), message = %st.message(), "request failed"),
        );
        st
    })
}

/// Which services a ferro-csi process serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Controller and Node (the default for node-local volumes: the node provisions).
    All,
    Controller,
    Node,
}

/// Serves the CSI services on a unix socket until `shutdown` resolves. An existing socket
/// file is replaced (a stale one from a crashed run would refuse the bind).
pub async fn serve<H: Host>(
    engine: Arc<Engine<H>>,
    mode: Mode,
    socket: &Path,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::remove_file(socket) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
        _ => {}
    }
    let listener = tokio::net::UnixListener::bind(socket)?;
    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
    let identity = IdentityService {
        engine: Arc::clone(&engine),
        mode,
    };
    let controller = (mode != Mode::Node).then(|| {
        ControllerServer::new(ControllerService {
            engine: Arc::clone(&engine),
        })
    });
    let node = (mode != Mode::Controller).then(|| {
        NodeServer::new(NodeService {
            engine: Arc::clone(&engine),
        })
    });
    tonic::transport::Server::builder()
        .add_service(IdentityServer::new(identity))
        .add_optional_service(controller)
        .add_optional_service(node)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await?;
    Ok(())
}
