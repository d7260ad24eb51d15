//! ferro-dns entry point: flags, the listen addresses' interface, the sockets (bound before
//! anything is answered, so a port in use fails the start), the informers, the first index,
//! READY=1, then answers until SIGTERM/SIGINT.

use std::io::IsTerminal as _;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::Context as _;
use clap::Parser as _;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher;
use kube::Api;

use ferro_dns::answer::Options;
use ferro_dns::config::Args;
use ferro_dns::controller::{self, Inputs, Model};
use ferro_dns::forward::{Forwarder, Upstream};
use ferro_dns::handler::Handler;
use ferro_dns::{iface, server};

async fn client(kubeconfig: Option<&std::path::Path>, servers: &[String]) -> anyhow::Result<kube::Client> {
    use ferro_runtime::apiclient;
    let servers = apiclient::parse_servers(&servers.join(","))?;
    Ok(apiclient::client(kubeconfig, &servers).await?)
}

/// The watchdog's liveness check: a query for the zone's SOA to this server's first listen
/// address answered (any answer with the query's ID) within 2 s.
async fn answers(addr: std::net::SocketAddr, zone: hickory_proto::rr::Name) -> Result<(), String> {
    use hickory_proto::op::{Message, Query};
    let mut msg = Message::new();
    let id = rand::random::<u16>();
    msg.set_id(id).add_query(Query::query(zone, hickory_proto::rr::RecordType::SOA));
    let bytes = msg.to_vec().map_err(|e| e.to_string())?;
    let bind: std::net::SocketAddr =
        if addr.is_ipv4() { (std::net::Ipv4Addr::UNSPECIFIED, 0).into() } else { (std::net::Ipv6Addr::UNSPECIFIED, 0).into() };
    let sock = tokio::net::UdpSocket::bind(bind).await.map_err(|e| e.to_string())?;
    sock.send_to(&bytes, addr).await.map_err(|e| e.to_string())?;
    let mut buf = [0u8; 4096];
    let n = tokio::time::timeout(std::time::Duration::from_secs(2), sock.recv(&mut buf))
        .await
        .map_err(|_| format!("no answer from {addr} within 2s"))?
        .map_err(|e| e.to_string())?;
    match Message::from_vec(&buf[..n]) {
        Ok(m) if m.id() == id => Ok(()),
        Ok(_) => Err("an answer with another ID".into()),
        Err(e) => Err(format!("an answer that does not parse: {e}")),
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let cfg = args.validate(|p| std::fs::read_to_string(p))?;
    tracing::info!(zone = %cfg.zone.domain, listen = ?cfg.listen, upstreams = ?cfg.upstreams, "ferro-dns starting");
    let listen_ips: Vec<_> = cfg.listen.iter().map(|a| a.ip()).collect();
    if cfg.setup_interface.is_some() {
        let nl = iface::Netlink::new()?;
        iface::prepare(&nl, cfg.setup_interface.as_deref(), &listen_ips).await.context("setting up the listen interface")?;
    }
    let mut udp = Vec::new();
    let mut tcp = Vec::new();
    for addr in &cfg.listen {
        udp.push(std::net::UdpSocket::bind(addr).with_context(|| format!("binding udp {addr}"))?);
        tcp.push(tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding tcp {addr}"))?);
    }
    let client = client(cfg.kubeconfig.as_deref(), &cfg.api_servers).await?;
    let inputs = Inputs::new();
    let tasks = [
        inputs.services.spawn(Api::<Service>::all(client.clone()), watcher::Config::default()),
        inputs.slices.spawn(Api::<EndpointSlice>::all(client.clone()), watcher::Config::default()),
    ];
    let model = Model::new(cfg.zone.clone());
    let upstream: Option<Arc<dyn Upstream>> =
        cfg.upstreams.clone().map(|servers| Arc::new(Forwarder { servers, timeout: cfg.forward_timeout }) as Arc<dyn Upstream>);
    let handler = Arc::new(Handler { index: model.published.clone(), opts: Options { forward: upstream.is_some() }, upstream });

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let sd = ferro_runtime::systemd::Systemd::from_env();
    tokio::select! {
        () = controller::run(inputs, model.clone(), cfg.resync_period) => {}
        _ = term.recv() => return Ok(()),
        _ = tokio::signal::ctrl_c() => return Ok(()),
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    for s in udp {
        threads.extend(server::spawn_udp(s, cfg.udp_threads, handler.clone(), tokio::runtime::Handle::current(), stop.clone())?);
    }
    let tcp_tasks: Vec<_> = tcp.into_iter().map(|l| tokio::spawn(server::serve_tcp(l, handler.clone()))).collect();
    tracing::info!(services = model.published.load().services, "informers synced; answering");
    sd.ready("informers synced; answering");
    let (probe, zone) = (cfg.listen[0], cfg.zone.domain.clone());
    let liveness = sd.heartbeat().drive(std::time::Duration::from_secs(10), move || answers(probe, zone.clone()));
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    sd.stopping();
    liveness.abort();
    tracing::info!("stopping");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in tasks.iter().chain(tcp_tasks.iter()) {
        t.abort();
    }
    for t in threads {
        if t.join().is_err() {
            tracing::warn!("a udp thread panicked");
        }
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
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ferro-dns: starting the tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("ferro-dns: {e:#}");
            ExitCode::FAILURE
        }
    }
}
