//! ferro-netd entry point: flags, logging to stderr, the kube client and the netlink
//! executor, then the control loop until SIGTERM/SIGINT (the dataplane stays in place).

use std::io::IsTerminal as _;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser as _;
use ferro_cni::netd::config::Args;
use ferro_cni::netd::{controller, kernel};

fn hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
}

async fn client(cfg: &ferro_cni::netd::config::Config) -> anyhow::Result<kube::Client> {
    use ferro_runtime::apiclient;
    let servers = apiclient::parse_servers(&cfg.api_servers.join(","))?;
    Ok(apiclient::client(cfg.kubeconfig.as_deref(), &servers).await?)
}

async fn run(args: Args) -> anyhow::Result<()> {
    let cfg = args.validate(hostname)?;
    tracing::info!(node = %cfg.node_name, conf_dir = %cfg.cni_conf_dir.display(), resync = ?cfg.resync_period, "ferro-netd starting");
    let client = client(&cfg).await?;
    let kernel = kernel::Netlink::new()?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    // READY=1 once the node's routes are programmed; STOPPING=1 at the signal
    let sd = ferro_runtime::systemd::Systemd::from_env();
    let shutdown = async {
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        sd.stopping();
    };
    controller::run(cfg, client, kernel, &sd, shutdown).await;
    Ok(())
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let args = Args::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ferro-netd: starting the tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("ferro-netd: {e:#}");
            ExitCode::FAILURE
        }
    }
}
