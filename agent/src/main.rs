//! ferro-agent: parses flags and config, then registers the Node and runs the lease and status
//! loops until SIGTERM.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::Parser as _;
use ferro_agent::config::{AgentConfig, Flags, KubeletConfiguration};
use ferro_agent::cri::{self, Prober};
use ferro_agent::pod::{imagegc, source};
use ferro_agent::pod::spec::{CgroupDriver, NodeContext};
use ferro_agent::pod::exec::{PodWorkers, Source, WorkerConfig};
use ferro_agent::node::{self, HostFacts, NodeInput};
use ferro_agent::server;
use ferro_agent::status;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::signal::unix::{signal, SignalKind};

async fn kube_client(path: &Path, servers: &[String]) -> anyhow::Result<kube::Client> {
    use ferro_runtime::apiclient;
    let servers = apiclient::parse_servers(&servers.join(","))?;
    Ok(apiclient::client(Some(path), &servers).await?)
}

/// Client certificate rotation (rotateCertificates), when on and the kubeconfig authenticates
/// with a client certificate: the client the agent's loops use from then on follows the
/// rotated certificate.
fn start_rotation(
    cfg: &AgentConfig,
    kubeconfig: &Path,
    name: &str,
    client: kube::Client,
) -> anyhow::Result<(kube::Client, Option<tokio::task::JoinHandle<()>>)> {
    use ferro_agent::certificate::{client::Reloadable, rotate, store};
    if !cfg.rotate_certificates {
        tracing::info!("client certificate rotation is off (rotateCertificates: false)");
        return Ok((client, None));
    }
    if !kube::config::Kubeconfig::read_from(kubeconfig).is_ok_and(|kc| store::uses_client_certificate(&kc)) {
        tracing::info!(kubeconfig = %kubeconfig.display(), "the kubeconfig does not authenticate with a client certificate: nothing to rotate");
        return Ok((client, None));
    }
    let handle = Reloadable::new(client);
    let rotation = rotate::ApiRotation {
        kubeconfig: kubeconfig.to_path_buf(),
        bootstrap_kubeconfig: cfg.bootstrap_kubeconfig.clone(),
        cert_dir: cfg.cert_dir.clone(),
        node_name: name.to_string(),
        servers: ferro_runtime::apiclient::parse_servers(&cfg.api_servers.join(","))?,
        client: handle.clone(),
        request_timeout: rotate::REQUEST_TIMEOUT,
    };
    let settings = rotate::Settings {
        renew_before: i64::try_from(cfg.rotate_certificates_before.as_secs()).unwrap_or(i64::MAX),
        bootstrap_configured: cfg.bootstrap_kubeconfig.is_some(),
    };
    let task = tokio::spawn(rotate::run(
        std::sync::Arc::new(rotation),
        settings,
        ferro_agent::clock::Clock::System,
        rotate::system_jitter,
    ));
    Ok((handle.client(), Some(task)))
}

/// `ferro-agent discover`: a joining node's bootstrap kubeconfig from a bootstrap token and
/// the cluster CA's pinned hash (kubeadm join's token discovery; ferro_agent::discovery).
#[derive(clap::Parser, Debug)]
#[command(name = "ferro-agent discover")]
struct DiscoverArgs {
    /// The API server, https://<address>:<port>.
    #[arg(long)]
    server: String,
    /// The bootstrap token (`ferro-control-plane token create`).
    #[arg(long)]
    token: String,
    /// sha256:<hex> of the cluster CA's public key (`ferro-control-plane token create
    /// --print-join-command` prints it); repeat for several.
    #[arg(long = "ca-cert-hash", required = true)]
    ca_cert_hashes: Vec<String>,
    /// Where to write the bootstrap kubeconfig (0600), for --bootstrap-kubeconfig.
    #[arg(long)]
    output: PathBuf,
    /// How long to keep trying while the server cannot be reached or has not signed for the
    /// token yet.
    #[arg(long, default_value = "5m", value_parser = |s: &str| k8s_semantics::parse_duration(s).map_err(|e| e.to_string()))]
    timeout: std::time::Duration,
}

fn discover_main(args: &[String]) -> anyhow::Result<()> {
    let a = DiscoverArgs::parse_from(args);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let kc = rt.block_on(ferro_agent::discovery::discover(&a.server, &a.token, &a.ca_cert_hashes, a.timeout))?;
    ferro_agent::discovery::write(&a.output, &kc)?;
    tracing::info!(output = %a.output.display(), "cluster CA discovered and pinned; bootstrap kubeconfig written");
    Ok(())
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("discover") {
        return discover_main(&args[1..]);
    }
    let flags = Flags::parse();
    let file = flags.config.as_deref().map(KubeletConfiguration::load).transpose()?;
    let cfg = AgentConfig::resolve(&flags, file)?;
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(run(cfg))
}

/// The CA of the kubeconfig's cluster (PEM): the clients the :10250 server accepts by default
/// (the control plane's kubelet-client certificate is signed by it).
fn kubeconfig_ca(path: &Path) -> Option<Vec<u8>> {
    use base64::Engine as _;
    let kc = kube::config::Kubeconfig::read_from(path).ok()?;
    let cluster = kc.clusters.first()?.cluster.clone()?;
    if let Some(data) = cluster.certificate_authority_data {
        return base64::engine::general_purpose::STANDARD.decode(data.trim()).ok();
    }
    std::fs::read(cluster.certificate_authority?).ok()
}

/// Starts the HTTPS server on address:port (logs, exec, attach, port-forward, /pods, metrics,
/// the resource usage of /metrics/resource and /stats/summary).
fn start_server(
    cfg: &AgentConfig,
    name: &str,
    facts: &HostFacts,
    client: Option<kube::Client>,
    workers: PodWorkers,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let ip: std::net::IpAddr = cfg.address.parse().with_context(|| format!("invalid address {:?}", cfg.address))?;
    let node_ips: Vec<std::net::IpAddr> = node::pick_internal_ip(cfg.node_ip, &facts.interfaces).into_iter().collect();
    let scfg = server::ServerConfig {
        address: std::net::SocketAddr::new(ip, cfg.port),
        tls_cert_file: cfg.tls_cert_file.clone(),
        tls_key_file: cfg.tls_private_key_file.clone(),
        client_ca_pem: cfg
            .client_ca_file
            .as_ref()
            .and_then(|f| std::fs::read(f).ok())
            .or_else(|| cfg.kubeconfig.as_deref().and_then(kubeconfig_ca)),
        cert_dir: cfg.root_dir.join("pki"),
        node_name: name.to_string(),
        node_ips,
        runtime_socket: cfg.runtime_socket.clone(),
        kube: client,
        authorization: cfg.authorization.clone(),
        stats: Some(std::sync::Arc::new(ferro_agent::stats::Provider::new(
            ferro_agent::stats::StatsConfig {
                node_name: name.to_string(),
                proc_root: Path::new("/proc").to_path_buf(),
                cgroup_root: Path::new("/sys/fs/cgroup").to_path_buf(),
                root_dir: cfg.root_dir.clone(),
                pod_log_root: cfg.pod_logs_dir.clone(),
            },
            std::sync::Arc::new(cri::connect_lazy(&cfg.runtime_socket)),
        ))),
    };
    let lookup: std::sync::Arc<dyn server::Lookup> = std::sync::Arc::new(workers);
    Ok(tokio::spawn(async move {
        if let Err(e) = server::serve(scfg, lookup, std::future::pending()).await {
            tracing::error!(error = %e, "the :10250 server stopped");
        }
    }))
}

/// Starts the pod workers, the API pod source (with a client) and the static pods.
async fn start_pods(
    cfg: &AgentConfig,
    name: &str,
    facts: &HostFacts,
    client: Option<kube::Client>,
) -> anyhow::Result<(PodWorkers, imagegc::Shared)> {
    let host_ips: Vec<String> = node::pick_internal_ip(cfg.node_ip, &facts.interfaces)
        .map(|ip| ip.to_string())
        .into_iter()
        .collect();
    let memory = i64::try_from(facts.memory_ki.saturating_mul(1024)).unwrap_or(i64::MAX);
    let ctx = NodeContext {
        node_name: name.to_string(),
        host_ips,
        cluster_dns: cfg.cluster_dns.clone(),
        cluster_domain: cfg.cluster_domain.clone().unwrap_or_else(|| "cluster.local".into()),
        cgroup_driver: if cfg.cgroup_driver == "systemd" { CgroupDriver::Systemd } else { CgroupDriver::Cgroupfs },
        pod_log_root: cfg.pod_logs_dir.clone(),
        allocatable_cpu_milli: i64::from(facts.cpus) * 1000,
        allocatable_memory: memory,
        memory_capacity: memory,
    };
    let wcfg = WorkerConfig {
        root_dir: cfg.root_dir.clone(),
        node: ctx,
        // Upstream's syncFrequency; changes, the runtime relist and probes trigger syncs sooner.
        resync: std::time::Duration::from_secs(60),
        // In effect a worker per pod, as upstream's pod workers.
        workers: usize::try_from(cfg.max_pods).unwrap_or(110).max(1),
        max_pods: usize::try_from(cfg.max_pods).unwrap_or(110),
        allocatable_cpu_milli: i64::from(facts.cpus) * 1000,
        allocatable_memory: memory,
        cgroup_root: cfg.cgroup_root.clone(),
        clock: ferro_agent::clock::Clock::System,
    };
    let rt = cri::connect_lazy(&cfg.runtime_socket);
    let runtime_name = {
        let mut probe = rt.clone();
        match probe.version().await {
            Ok(v) => v.runtime_name,
            Err(e) => {
                tracing::warn!(error = %e, "container runtime not reachable yet");
                "containerd".to_string()
            }
        }
    };
    let runtime: std::sync::Arc<dyn cri::Cri> = std::sync::Arc::new(rt);
    let workers = PodWorkers::new(wcfg, runtime_name, runtime.clone(), client.clone());
    let node_events = client
        .clone()
        .map(|c| imagegc::NodeEvents::new(ferro_runtime::events::Recorder::new(c, "kubelet").with_host(name), name));
    let image_gc = imagegc::ImageGc::new(std::sync::Arc::new(cri::connect_lazy(&cfg.runtime_socket)), cfg.image_gc(), node_events).shared();
    tokio::spawn(imagegc::image_gc_loop(image_gc.clone()));
    if let Some(dir) = cfg.static_pod_path.clone() {
        // The first read happens before anything is cleaned up, so running static pods are
        // recognised after a restart.
        for (_, p) in source::read_manifests(&dir, name) {
            workers.upsert(p, Source::File);
        }
        tokio::spawn(source::static_pods_loop(dir, name.to_string(), workers.clone(), client.clone()));
    }
    if let Some(c) = client {
        // Every Service, for the service-link environment of the containers started here.
        let services = ferro_runtime::Informer::<k8s_openapi::api::core::v1::Service>::new();
        services.spawn(kube::Api::all(c.clone()), kube::runtime::watcher::Config::default());
        workers.set_services(services);
        if cfg.watch_referenced_objects {
            use ferro_agent::pod::objects::{ApiWatches, ObjectCache};
            workers.set_object_caches(ObjectCache::new(Box::new(ApiWatches(c.clone()))), ObjectCache::new(Box::new(ApiWatches(c.clone()))));
        }
        let informer = source::watch_api(c, name, workers.clone());
        let w = workers.clone();
        tokio::spawn(async move {
            informer.wait_synced().await;
            w.start();
            w.queue_all().await;
        });
    } else {
        workers.start();
        workers.queue_all().await;
    }
    Ok((workers, image_gc))
}

async fn run(cfg: AgentConfig) -> anyhow::Result<()> {
    std::fs::create_dir_all(&cfg.root_dir).with_context(|| format!("creating {}", cfg.root_dir.display()))?;
    let facts = HostFacts::read(
        Path::new("/proc"),
        Path::new("/sys"),
        Path::new("/etc/os-release"),
        &cfg.root_dir,
    )
    .context("reading the host's facts")?;
    let name = cfg
        .hostname_override
        .clone()
        .unwrap_or_else(|| facts.hostname.clone())
        .to_lowercase();
    let input = NodeInput {
        name: name.clone(),
        node_ip: cfg.node_ip,
        max_pods: cfg.max_pods,
        port: cfg.port,
        container_runtime_version: "unknown".into(),
        pod_cidr: cfg.pod_cidr.clone(),
    };
    let mut term = signal(SignalKind::terminate())?;
    let sd = ferro_runtime::systemd::Systemd::from_env();
    if let (Some(kubeconfig), Some(bootstrap_kubeconfig)) = (cfg.kubeconfig.as_deref(), cfg.bootstrap_kubeconfig.as_deref()) {
        let servers = ferro_runtime::apiclient::parse_servers(&cfg.api_servers.join(","))?;
        let join = ferro_agent::bootstrap::Bootstrap { kubeconfig, bootstrap_kubeconfig, cert_dir: &cfg.cert_dir, node_name: &name, servers: &servers };
        tokio::select! {
            r = ferro_agent::bootstrap::ensure(&join) => r.context("TLS bootstrap")?,
            _ = term.recv() => return Ok(()),
        }
    }
    let client = match cfg.kubeconfig.as_deref() {
        Some(k) => Some(kube_client(k, &cfg.api_servers).await?),
        None => None,
    };
    let (client, rotation_task) = match (client, cfg.kubeconfig.as_deref()) {
        (Some(c), Some(k)) => {
            let (c, task) = start_rotation(&cfg, k, &name, c)?;
            (Some(c), task)
        }
        (c, _) => (c, None),
    };
    let (workers, image_gc) = start_pods(&cfg, &name, &facts, client.clone()).await?;
    let csi_drivers = std::sync::Arc::new(ferro_agent::csi::registry::Drivers::default());
    let mounter = std::sync::Arc::new(ferro_agent::csi::mounter::CsiMounter {
        root: cfg.root_dir.clone(),
        node: name.clone(),
        drivers: csi_drivers.clone(),
        client: client.clone(),
        stats: std::sync::Mutex::new(Vec::new()),
    });
    workers.set_csi(mounter.clone());
    if client.is_some() {
        // kubelet's half of volume expansion (NodeExpandVolume for claims waiting on it).
        tokio::spawn(mounter.clone().expansion_loop(std::time::Duration::from_secs(2)));
        // kubelet_volume_stats_* of the published claims.
        tokio::spawn(mounter.clone().stats_loop(cfg.volume_stats_agg_period));
    }
    let server = start_server(&cfg, &name, &facts, client.clone(), workers.clone())?;
    let Some(client) = client else {
        tracing::info!(node = %name, "no --kubeconfig: running standalone (static pods only), nothing to register");
        sd.ready("standalone: static pods only");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        sd.stopping();
        drop(workers);
        server.abort();
        return Ok(());
    };
    // CSI drivers register through <root>/plugins_registry (kubelet's plugin watcher).
    let registry_task = tokio::spawn(ferro_agent::csi::registry::watch(
        cfg.root_dir.join("plugins_registry"),
        csi_drivers.clone(),
        Some(ferro_agent::csi::registry::NodeObjects { client: client.clone(), node: name.clone() }),
        std::time::Duration::from_secs(2),
    ));
    let mut prober = Prober::new(cfg.runtime_socket.clone());
    let initial = prober.probe().await;
    let (health_tx, health_rx) = tokio::sync::watch::channel(initial.clone());
    let health_tx = std::sync::Arc::new(health_tx);
    // Node-pressure eviction: the pressure conditions of the node status and the evictions.
    let eviction_task = tokio::spawn(
        ferro_agent::eviction::run::Manager {
            config: cfg.eviction.clone(),
            proc: Path::new("/proc").to_path_buf(),
            root_dir: cfg.root_dir.clone(),
            pod_log_root: cfg.pod_logs_dir.clone(),
            workers: workers.clone(),
            cri: std::sync::Arc::new(cri::connect_lazy(&cfg.runtime_socket)),
            health: health_tx.clone(),
            clock: ferro_agent::clock::Clock::System,
            period: ferro_agent::eviction::run::MONITORING_PERIOD,
            cgroup_fs: Path::new("/sys/fs/cgroup").to_path_buf(),
            cgroup_root: cfg.cgroup_root.clone(),
            image_gc: Some(image_gc),
        }
        .run(),
    );
    let probe_every = cfg.node_status_update_frequency;
    // The watchdog's heartbeat: this loop turning (a probe of the runtime every period).
    let heartbeat = sd.heartbeat();
    let probe_task = tokio::spawn(async move {
        loop {
            tokio::time::sleep(probe_every).await;
            let mut h = prober.probe().await;
            heartbeat.beat();
            health_tx.send_if_modified(|old| {
                // The pressure conditions are the eviction manager's.
                (h.memory_pressure, h.disk_pressure, h.pid_pressure) = (old.memory_pressure, old.disk_pressure, old.pid_pressure);
                let changed = *old != h;
                if changed {
                    tracing::info!(
                        runtime_ready = h.runtime_ready,
                        runtime_error = ?h.runtime_error,
                        network_error = ?h.network_error,
                        runtime_version = ?h.runtime_version,
                        "node health changed"
                    );
                }
                *old = h;
                changed
            });
        }
    });
    let work = async {
        let uid = if cfg.register_node {
            let desired = node::build_node(&input, &facts, &initial, &Time(jiff::Timestamp::now()));
            status::register(client.clone(), &desired).await
        } else {
            None
        };
        sd.ready("node registered");
        let lease = status::lease_loop(
            client.clone(),
            name.clone(),
            cfg.node_lease_duration_seconds,
            cfg.lease_renew_interval(),
            uid,
        );
        let src = status::StatusSource { input, facts, health: health_rx };
        let st = status::status_loop(
            client.clone(),
            src,
            cfg.node_status_update_frequency,
            cfg.node_status_report_frequency,
        );
        tokio::join!(lease, st);
    };
    tokio::select! {
        _ = work => {}
        _ = term.recv() => tracing::info!("SIGTERM: exiting"),
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupted: exiting"),
    }
    sd.stopping();
    if let Some(t) = rotation_task {
        t.abort();
    }
    probe_task.abort();
    eviction_task.abort();
    registry_task.abort();
    server.abort();
    Ok(())
}
