//! ferro-csi: serves the CSI services of `loop.csi.ferro.dev` on a unix socket.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use ferro_csi::service::{serve, Mode};
use ferro_csi::volume::engine::{Engine, EngineConfig};
use ferro_csi::volume::real::RealHost;
use tracing::info;

#[derive(Parser, Debug)]
#[command(
    name = "ferro-csi",
    version,
    about = "ferro's CSI driver: node-local volumes on loop devices"
)]
struct Args {
    /// The CSI endpoint: unix:///path/to/csi.sock or a plain path.
    #[arg(
        long,
        env = "CSI_ENDPOINT",
        default_value = "unix:///run/ferro/csi/csi.sock"
    )]
    endpoint: String,
    /// This node's name (NodeGetInfo's node_id and the topology value).
    #[arg(long, env = "NODE_NAME")]
    node_id: String,
    /// Where backing files and the journal live.
    #[arg(long, default_value = "/var/lib/ferro/csi")]
    data_dir: PathBuf,
    /// Bytes the node may provision in total (a Kubernetes quantity: 100Gi).
    #[arg(long, default_value = "100Gi")]
    pool_size: String,
    /// Directories the CO's staging and target paths lie under (kubelet's root dir);
    /// any other path is refused. Repeat for several.
    #[arg(long = "allowed-path", default_value = "/var/lib/kubelet")]
    allowed_paths: Vec<PathBuf>,
    /// Kubeconfig for the provisioner (PVC -> CreateVolume -> PV, released PV -> DeleteVolume)
    /// this node runs for the claims selected for it. Without it ferro-csi serves CSI only.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// API servers for the provisioner to use in turn with the kubeconfig's credentials,
    /// comma-separated (several ferro-control-plane replicas without a load balancer; default:
    /// the kubeconfig's server).
    #[arg(long = "api-servers", env = "FERRO_API_SERVERS", value_delimiter = ',')]
    api_servers: Vec<String>,
    /// The kubelet's plugin registry dir (`<agent root>/plugins_registry`): ferro-csi
    /// registers itself there as the node-driver-registrar would. Without it, nothing registers.
    #[arg(long)]
    registration_dir: Option<PathBuf>,
    /// Which services to serve.
    #[arg(long, value_enum, default_value = "all")]
    mode: Mode,
    /// Namespace of this node's CSIStorageCapacity objects (the provisioner publishes one per
    /// StorageClass of the driver).
    #[arg(long, default_value = "kube-system")]
    capacity_namespace: String,
    /// How often the capacity is published again (also soon after a StorageClass or a volume
    /// changes); a Go duration.
    #[arg(long, default_value = "1m")]
    capacity_poll_interval: String,
}

fn socket_path(endpoint: &str) -> anyhow::Result<PathBuf> {
    let path = endpoint.strip_prefix("unix://").unwrap_or(endpoint);
    anyhow::ensure!(
        path.starts_with('/'),
        "--endpoint {endpoint:?} is not an absolute unix socket path"
    );
    Ok(PathBuf::from(path))
}

/// A CSI Probe over the driver's own socket: READY's condition and the watchdog's check.
async fn probe(socket: PathBuf) -> Result<(), String> {
    let path = socket.clone();
    let channel = tonic::transport::Endpoint::from_static("http://[::]:50051")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tokio::net::UnixStream::connect(path).await?)) }
        }))
        .await
        .map_err(|e| format!("connecting to {}: {e}", socket.display()))?;
    let mut identity = csi_proto::csi::identity_client::IdentityClient::new(channel);
    tokio::time::timeout(std::time::Duration::from_secs(5), identity.probe(csi_proto::csi::ProbeRequest {}))
        .await
        .map_err(|_| "no Probe answer within 5s".to_string())?
        .map_err(|s| format!("Probe: {s}"))?;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();
    anyhow::ensure!(!args.node_id.is_empty(), "--node-id must not be empty");
    let pool = k8s_semantics::quantity::Quantity::parse(&args.pool_size)
        .with_context(|| format!("--pool-size {:?}", args.pool_size))?;
    let pool_size = pool
        .value()
        .and_then(|v| u64::try_from(v).ok())
        .with_context(|| {
            format!(
                "--pool-size {:?} is not a whole, non-negative number of bytes",
                args.pool_size
            )
        })?;
    let socket = socket_path(&args.endpoint)?;
    let engine = Arc::new(Engine::new(
        Arc::new(RealHost::default()),
        EngineConfig {
            node_id: args.node_id.clone(),
            data_dir: args.data_dir.clone(),
            pool_size,
            allowed_roots: args.allowed_paths.clone(),
        },
    ));
    let report = {
        let engine = Arc::clone(&engine);
        tokio::task::spawn_blocking(move || engine.recover()).await??
    };
    info!(?report, "start-up recovery done");
    if let Some(path) = &args.kubeconfig {
        anyhow::ensure!(args.mode != Mode::Node, "the provisioner (--kubeconfig) needs the controller service (--mode all or controller)");
        let servers = ferro_runtime::apiclient::parse_servers(&args.api_servers.join(","))?;
        let client = ferro_runtime::apiclient::client(Some(path), &servers).await?;
        let capacity = ferro_csi::provisioner::CapacityConfig {
            namespace: args.capacity_namespace.clone(),
            poll_interval: k8s_semantics::parse_duration(&args.capacity_poll_interval)
                .map_err(|e| anyhow::anyhow!("--capacity-poll-interval {:?}: {e}", args.capacity_poll_interval))?,
        };
        anyhow::ensure!(!capacity.poll_interval.is_zero(), "--capacity-poll-interval must be positive");
        ferro_csi::provisioner::start(Arc::clone(&engine), client, args.node_id.clone(), Some(capacity)).await;
        info!(node = %args.node_id, "provisioner running");
    }
    info!(socket = %socket.display(), node = %args.node_id, mode = ?args.mode, "serving CSI");
    // READY=1 once a Probe over the socket is answered; keep-alives while Probes are.
    let sd = Arc::new(ferro_runtime::systemd::Systemd::from_env());
    let ready = {
        let (sd, socket) = (Arc::clone(&sd), socket.clone());
        tokio::spawn(async move {
            while let Err(e) = probe(socket.clone()).await {
                tracing::debug!(error = %e, "not serving yet");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            sd.ready("serving CSI");
        })
    };
    let liveness = {
        let socket = socket.clone();
        sd.heartbeat().drive(std::time::Duration::from_secs(10), move || probe(socket.clone()))
    };
    let stopping = Arc::clone(&sd);
    let shutdown = async move {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending::<()>().await } } => {}
        }
        stopping.stopping();
        ready.abort();
        liveness.abort();
        // Shutdown detaches, unmounts and deletes nothing: volumes stay as they are.
        info!("shutting down");
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let registration = args.registration_dir.clone().map(|dir| {
        let mut rx = stop_rx.clone();
        let endpoint = socket.clone();
        tokio::spawn(async move {
            let stopped = async move {
                let _ = rx.wait_for(|s| *s).await;
            };
            ferro_csi::service::registration::serve_registration(&dir, &endpoint, stopped).await
        })
    });
    let served = serve(engine, args.mode, &socket, async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    })
    .await;
    if let Some(r) = registration {
        r.await??;
    }
    served
}
