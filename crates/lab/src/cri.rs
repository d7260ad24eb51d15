//! CRI v1 clients over a unix socket (k8s-cri's generated tonic clients).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use hyper_util::rt::TokioIo;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

pub use k8s_cri::v1 as api;

/// A connected channel to the CRI socket at `socket`.
pub async fn channel(socket: &Path) -> Result<Channel> {
    let path: PathBuf = socket.to_path_buf();
    // The URI is required by tonic but unused: every connection goes to the socket.
    Endpoint::try_from("http://[::]:50051")?
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
        .with_context(|| format!("connect to CRI socket {}", socket.display()))
}

/// Runtime and image service clients on one channel.
pub async fn connect(
    socket: &Path,
) -> Result<(RuntimeServiceClient<Channel>, ImageServiceClient<Channel>)> {
    let ch = channel(socket).await?;
    Ok((
        RuntimeServiceClient::new(ch.clone()),
        ImageServiceClient::new(ch),
    ))
}
