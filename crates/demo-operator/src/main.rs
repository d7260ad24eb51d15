//! `ferro-demo-operator`: runs the Website controller with the in-cluster configuration (or
//! the kubeconfig kube-rs finds); `ferro-demo-operator crd` prints the CustomResourceDefinition.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use ferro_demo_operator::cluster::KubeCluster;
use ferro_demo_operator::controller::{self, Context};
use ferro_demo_operator::website::Website;
use kube::CustomResourceExt as _;

#[derive(Parser, Debug)]
#[command(
    name = "ferro-demo-operator",
    about = "reconciles Websites (demo.ferro.dev/v1) into Deployments and Services"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    /// Seconds after which a Website is reconciled again without any event.
    #[arg(long, default_value_t = 300)]
    resync_seconds: u64,
    /// Seconds after which a failed reconcile is tried again.
    #[arg(long, default_value_t = 5)]
    retry_seconds: u64,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Print the Website CustomResourceDefinition as YAML (deploy/demo-operator/crd.yaml).
    Crd,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Some(Cmd::Crd) = cli.cmd {
        print!("{}", serde_yaml::to_string(&Website::crd())?);
        return Ok(());
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let client = kube::Client::try_default()
        .await
        .context("no Kubernetes configuration (in a pod: the service account's files and KUBERNETES_SERVICE_HOST/PORT)")?;
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        "ferro-demo-operator starting"
    );
    let ctx = Arc::new(Context {
        cluster: KubeCluster::new(client.clone()),
        resync: Duration::from_secs(cli.resync_seconds),
        retry: Duration::from_secs(cli.retry_seconds),
    });
    controller::run(client, ctx).await;
    tracing::info!("ferro-demo-operator stopped");
    Ok(())
}
