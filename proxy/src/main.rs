//! ferro-proxy entry point: flags and config file, `--cleanup`, the removal of other modes'
//! rules, the informers, the health and metrics servers, the mode's backend, then the sync loop
//! until SIGTERM/SIGINT (rules stay in place on exit).

use std::io::IsTerminal as _;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser as _;
use ferro_proxy::slim::Service;
use k8s_openapi::api::core::v1::Node;
use ferro_proxy::slim::EndpointSlice;
use kube::runtime::watcher;
use kube::Api;

use ferro_proxy::config::{Args, Config};
use ferro_proxy::controller::{self, Inputs, LoopConfig, Progress};
use ferro_proxy::exec::Host;
use ferro_proxy::health::Health;
use ferro_proxy::metrics::Metrics;
use ferro_proxy::model::{Family, Problem, LABEL_HEADLESS, LABEL_SERVICE_PROXY_NAME};
use ferro_proxy::{backend, cleanup, server, slim};
use ferro_runtime::systemd::Systemd;
use ferro_runtime::Informer;

fn hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname").ok().map(|h| h.trim().to_string()).filter(|h| !h.is_empty())
}

async fn client(cfg: &Config) -> anyhow::Result<kube::Client> {
    use ferro_runtime::apiclient;
    let servers = apiclient::parse_servers(&cfg.api_servers.join(","))?;
    Ok(apiclient::client(cfg.kubeconfig.as_deref(), &servers).await?)
}

fn problem_reason(p: &Problem) -> &'static str {
    match p {
        Problem::UnsupportedProtocol { .. } => "UnsupportedProtocol",
        Problem::InvalidIp { .. } => "InvalidIP",
        Problem::InvalidCidr { .. } => "InvalidCIDR",
        Problem::InvalidPort { .. } => "InvalidPort",
        Problem::InvalidEndpoint { .. } => "InvalidEndpoint",
        Problem::Refused { .. } => "RulesRefused",
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let cfg = args.validate(|p| std::fs::read_to_string(p), hostname)?;
    if cfg.cleanup {
        let removed = cleanup::cleanup(&mut Host, None, &[Family::V4, Family::V6])?;
        tracing::info!(?removed, "cleanup done");
        return Ok(());
    }
    tracing::info!(node = %cfg.node_name, mode = cfg.mode.as_str(), families = ?cfg.families, "ferro-proxy starting");
    // Rules of the other modes go (a mode switch); this mode's are taken over by the first sync.
    if let Err(e) = cleanup::cleanup(&mut Host, Some(cfg.mode), &[Family::V4, Family::V6]) {
        tracing::warn!(error = %e, "removing other modes' rules failed");
    }
    let backend = backend::for_mode(&cfg)?;
    let client = client(&cfg).await?;

    // the caches keep what the model reads (see slim.rs)
    let inputs = Inputs {
        services: Informer::with_transform(slim::service),
        slices: Informer::with_transform(slim::endpoint_slice),
        nodes: Informer::with_transform(slim::node),
    };
    let selector = format!("!{LABEL_SERVICE_PROXY_NAME},!{LABEL_HEADLESS}");
    let tasks = [
        inputs.services.spawn(Api::<Service>::all(client.clone()), watcher::Config::default().labels(&selector)),
        inputs.slices.spawn(Api::<EndpointSlice>::all(client.clone()), watcher::Config::default().labels(&selector)),
        inputs.nodes.spawn(
            Api::<Node>::all(client.clone()),
            watcher::Config::default().fields(&format!("metadata.name={}", cfg.node_name)),
        ),
    ];

    let health = Arc::new(Health::new(cfg.sync_period, cfg.families.clone()));
    health.queued(std::time::SystemTime::now());
    let metrics = Arc::new(Metrics::default());
    let shared = Arc::new(server::Shared { health: health.clone(), metrics: metrics.clone(), mode: cfg.mode.as_str() });
    let mut servers = Vec::new();
    if let Some(addr) = cfg.healthz_bind_address {
        let listener = server::bind(addr).await.with_context(|| format!("binding healthz on {addr}"))?;
        servers.push(tokio::spawn(server::serve(listener, shared.clone(), true)));
    }
    if let Some(addr) = cfg.metrics_bind_address {
        let listener = server::bind(addr).await.with_context(|| format!("binding metrics on {addr}"))?;
        servers.push(tokio::spawn(server::serve(listener, shared.clone(), false)));
    }

    let notify = Arc::new(tokio::sync::Notify::new());
    let triggers = controller::watch_changes(&inputs, notify.clone(), metrics.clone(), health.clone());
    let (progress_tx, mut progress_rx) = tokio::sync::watch::channel(Progress::default());
    // READY=1 after the first sync put the rules in the kernel; the watchdog's keep-alives
    // while /livez would say 200 (no update waiting longer than twice the sync period).
    let sd = Arc::new(Systemd::from_env());
    let ready = sd.clone();
    tokio::spawn(async move {
        if progress_rx.wait_for(|p| p.syncs > 0).await.is_ok() {
            ready.ready("first sync done: rules in the kernel");
        }
    });
    let live = health.clone();
    let liveness = sd.heartbeat().drive(Duration::from_secs(10), move || {
        let healthy = live.answer(true, std::time::SystemTime::now()).healthy;
        async move { if healthy { Ok(()) } else { Err("no sync yet, or an update has waited longer than twice the sync period".to_string()) } }
    });
    let recorder = ferro_runtime::events::Recorder::new(client.clone(), "ferro-proxy").with_host(&cfg.node_name);
    let services = inputs.services.clone();
    let on_problem = move |p: &Problem| {
        let key = match p {
            Problem::UnsupportedProtocol { service, .. }
            | Problem::InvalidIp { service, .. }
            | Problem::InvalidCidr { service, .. }
            | Problem::InvalidPort { service, .. }
            | Problem::Refused { service, .. } => Some(service.clone()),
            Problem::InvalidEndpoint { .. } => None,
        };
        if let Some((ns, name)) = key.as_deref().and_then(|k| k.split_once('/')) {
            if let Some(svc) = services.get(Some(ns), name) {
                recorder.record(svc.as_ref(), "Warning", problem_reason(p), p.to_string());
            }
        }
    };
    let loop_cfg = LoopConfig {
        node_name: cfg.node_name.clone(),
        families: cfg.families.clone(),
        sync_period: cfg.sync_period,
        min_sync_period: cfg.min_sync_period,
        full_sync_period: Duration::from_secs(3600),
        drift_check_period: Duration::from_secs(2),
    };
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let stopping = sd.clone();
    let shutdown = async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        stopping.stopping();
    };
    // stale UDP flows are deleted through ctnetlink after each sync
    let conntrack = ferro_proxy::conntrack::netlink::Ctnetlink::new();
    controller::run(
        loop_cfg, inputs, backend, conntrack, health, metrics, notify, triggers, progress_tx, on_problem, shutdown,
    )
    .await;
    liveness.abort();
    for t in tasks.iter().chain(servers.iter()) {
        t.abort();
    }
    Ok(())
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let args = Args::parse();
    match ferro_proxy::exec::raise_tool_stack_limit() {
        Ok(limit) => tracing::debug!(limit, "stack limit for the kernel tools"),
        Err(e) => tracing::warn!(error = %e, "cannot raise the stack limit for the kernel tools; iptables-save may crash on a table of ~100,000 chains"),
    }
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ferro-proxy: starting the tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("ferro-proxy: {e:#}");
            ExitCode::FAILURE
        }
    }
}
