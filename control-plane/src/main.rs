//! ferro-control-plane: serves the Kubernetes API from an embedded store.

use std::net::IpAddr;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use ferro_control_plane::config::{start, Config};
use ferro_control_plane::pki;

#[derive(Parser, Debug)]
#[command(name = "ferro-control-plane", version, about = "A compact Kubernetes API server with an embedded store")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Where the store, certificates and admin.kubeconfig live.
    #[arg(long, default_value = "/var/lib/ferro/control-plane", global = true)]
    data_dir: PathBuf,
    /// Addresses to listen on (repeat or comma-separate).
    #[arg(long = "bind-address", default_value = "0.0.0.0", value_delimiter = ',')]
    bind_address: Vec<IpAddr>,
    #[arg(long, default_value_t = 6443)]
    secure_port: u16,
    /// Address advertised to clients (admin.kubeconfig, the `kubernetes` endpoints).
    #[arg(long)]
    advertise_address: Option<IpAddr>,
    #[arg(long, default_value = "10.96.0.0/12")]
    service_cluster_ip_range: String,
    #[arg(long, default_value = "30000-32767")]
    service_node_port_range: String,
    /// Extra subject alternative names for the serving certificate.
    #[arg(long = "tls-san", value_delimiter = ',')]
    tls_san: Vec<String>,
    /// Events kept for watches to resume from.
    #[arg(long, default_value_t = 20_000)]
    watch_history: usize,
    /// Non-mutating requests in flight before 429 (upstream's default).
    #[arg(long, default_value_t = 400)]
    max_requests_inflight: usize,
    /// Mutating requests in flight before 429 (upstream's default).
    #[arg(long, default_value_t = 200)]
    max_mutating_requests_inflight: usize,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print a kubeconfig with a client certificate signed by the cluster CA.
    Kubeconfig {
        /// User name (certificate CN), e.g. system:node:node1.
        #[arg(long)]
        user: String,
        /// Groups (certificate O), e.g. system:nodes.
        #[arg(long = "group")]
        groups: Vec<String>,
        /// API server URL to put in the kubeconfig.
        #[arg(long, default_value = "https://127.0.0.1:6443")]
        server: String,
    },
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    if let Some(Command::Kubeconfig { user, groups, server }) = &cli.command {
        let ca = pki::Ca::load_or_create(&cli.data_dir).context("loading the cluster CA")?;
        let (cert, key) = ca.client(user, groups).context("signing the client certificate")?;
        print!("{}", pki::kubeconfig(server, &ca.cert_pem, user, pki::Credentials::Cert { cert_pem: &cert, key_pem: &key }));
        return Ok(());
    }
    let cfg = Config {
        data_dir: cli.data_dir,
        bind_addresses: cli.bind_address,
        secure_port: cli.secure_port,
        advertise_address: cli.advertise_address,
        service_cluster_ip_range: cli.service_cluster_ip_range,
        service_node_port_range: cli.service_node_port_range,
        tls_sans: cli.tls_san,
        watch_history: cli.watch_history,
        max_requests_inflight: cli.max_requests_inflight,
        max_mutating_requests_inflight: cli.max_mutating_requests_inflight,
    };
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async {
        let running = start(&cfg).await?;
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        tracing::info!("shutting down");
        running.stop();
        anyhow::Ok(())
    })
}
