//! ferro-control-plane: serves the Kubernetes API from an embedded store.

/// mimalloc: glibc malloc spent about 30 % of the API server's CPU in chunk consolidation
/// under apiserver-bench (docs/performance.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::net::IpAddr;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use ferro_control_plane::config::{start, Config};
use ferro_control_plane::controllers::manager;
use ferro_control_plane::{leader_election, pki};

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
    /// Loops to run, upstream syntax: `*` all, `name` one, `-name` not that one (e.g.
    /// `*,-scheduler`). Names: scheduler, endpointslice, endpoints, nodelifecycle,
    /// garbagecollector, namespace, replicaset, deployment, statefulset, daemonset, job,
    /// ttl-after-finished, cronjob, disruption, podgc, persistentvolume-binder, serviceaccount,
    /// nodeipam, volumesnapshot, root-ca-cert-publisher,
    /// clusterrole-aggregation, csrapproving, csrsigning, csrcleaner, tokencleaner, bootstrapsigner.
    #[arg(long, default_value = "*", value_delimiter = ',')]
    controllers: Vec<String>,
    /// Time a node may go without renewing its Lease before it is marked unreachable.
    #[arg(long, default_value = "40s", value_parser = parse_duration)]
    node_monitor_grace_period: std::time::Duration,
    /// Give each Node a podCIDR from --cluster-cidr.
    #[arg(long)]
    allocate_node_cidrs: bool,
    /// The pod network of the cluster (e.g. 10.244.0.0/16).
    #[arg(long)]
    cluster_cidr: Option<ipnet::IpNet>,
    #[arg(long, default_value_t = 24)]
    node_cidr_mask_size: u8,
    /// Terminated pods kept before the pod garbage collector deletes the oldest (0: keep all).
    #[arg(long, default_value_t = 12_500)]
    terminated_pod_gc_threshold: usize,
    /// How long a node must stay missing before the pod garbage collector deletes its pods.
    #[arg(long, default_value = "40s", value_parser = parse_duration)]
    pod_gc_quarantine: std::time::Duration,
    /// Tests only: the controllers read the time (CronJob schedules) from this file, an RFC
    /// 3339 timestamp the test rewrites, instead of the system clock.
    #[arg(long, hide = true)]
    controllers_clock_file: Option<PathBuf>,
    /// Keep objects in etcd (comma-separated client URLs) instead of the embedded store.
    #[arg(long = "etcd-servers", value_delimiter = ',')]
    etcd_servers: Vec<String>,
    /// CA bundle to verify the etcd servers' certificates (https URLs).
    #[arg(long)]
    etcd_cafile: Option<PathBuf>,
    /// Client certificate for etcd (mutual TLS), with --etcd-keyfile.
    #[arg(long)]
    etcd_certfile: Option<PathBuf>,
    #[arg(long)]
    etcd_keyfile: Option<PathBuf>,
    /// Every key in etcd lives under this prefix.
    #[arg(long, default_value = "/registry")]
    etcd_prefix: String,
    /// How often old etcd revisions are compacted (0: never).
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    etcd_compaction_interval: std::time::Duration,
    /// The issuer of service account tokens: their `iss` claim and the OIDC discovery
    /// documents (upstream's --service-account-issuer).
    #[arg(long, default_value = ferro_control_plane::sa_token::DEFAULT_ISSUER)]
    service_account_issuer: String,
    /// The audiences the API accepts in service account tokens, comma separated; a
    /// TokenRequest without audiences gets them (default: the issuer).
    #[arg(long = "api-audiences", value_delimiter = ',')]
    api_audiences: Vec<String>,
    /// Requests with no credentials at all are the user system:anonymous in the group
    /// system:unauthenticated, which RBAC authorizes (upstream's --anonymous-auth, default
    /// true: /healthz, /version and kube-public/cluster-info); false: they get 401. Requests
    /// with credentials that do not authenticate get 401 either way.
    #[arg(long = "anonymous-auth", default_value_t = true, action = clap::ArgAction::Set)]
    anonymous_auth: bool,
    /// Tests only: service account tokens are issued and checked by the RFC 3339 time in
    /// this file (re-read as it changes), so a test can see one expire.
    #[arg(long, hide = true)]
    tokens_clock_file: Option<PathBuf>,
    /// Run the loops against this API server instead of the embedded one (no API server is
    /// started then).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Run the loops only while this replica holds the leader Lease (upstream's default: true).
    /// It takes effect where another replica can exist: with --etcd-servers or --kubeconfig; the
    /// embedded store admits one server, which runs the loops at once.
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    leader_elect: bool,
    /// How long a candidate waits after the leader's last renewal before taking over.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    leader_elect_lease_duration: std::time::Duration,
    /// How long the leader tries to renew before it stops leading (and exits).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    leader_elect_renew_deadline: std::time::Duration,
    /// How often candidates try to acquire and the leader renews.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    leader_elect_retry_period: std::time::Duration,
    /// The Lease all of ferro's loops share (scheduler and controllers run together).
    #[arg(long, default_value = "ferro-control-plane")]
    leader_elect_resource_name: String,
    #[arg(long, default_value = "kube-system")]
    leader_elect_resource_namespace: String,
    /// The CA certificate the csrsigning loop signs with (default: the data dir's ca.crt
    /// when this server runs the API).
    #[arg(long, requires = "cluster_signing_key_file")]
    cluster_signing_cert_file: Option<PathBuf>,
    #[arg(long, requires = "cluster_signing_cert_file")]
    cluster_signing_key_file: Option<PathBuf>,
    /// How long certificates signed for CertificateSigningRequests are valid (a request's
    /// expirationSeconds may shorten it).
    #[arg(long, default_value = "8760h", value_parser = parse_duration)]
    cluster_signing_duration: std::time::Duration,
}

impl Cli {
    /// The election settings, when leader election applies.
    fn election(&self) -> anyhow::Result<Option<leader_election::Config>> {
        if !self.leader_elect {
            return Ok(None);
        }
        if self.etcd_servers.is_empty() && self.kubeconfig.is_none() {
            tracing::info!("leader election skipped: the embedded store admits one server");
            return Ok(None);
        }
        let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        let hostname = if hostname.trim().is_empty() { "localhost" } else { hostname.trim() };
        // upstream's identity: the host name and a fresh uuid, unique per process
        let identity = format!("{hostname}_{}", uuid::Uuid::new_v4());
        let cfg = leader_election::Config {
            lease_duration: self.leader_elect_lease_duration,
            renew_deadline: self.leader_elect_renew_deadline,
            retry_period: self.leader_elect_retry_period,
            ..leader_election::Config::new(&self.leader_elect_resource_namespace, &self.leader_elect_resource_name, identity)
        };
        cfg.validate()?;
        Ok(Some(cfg))
    }
}

/// Runs the loops (under leader election when `election` is set) until a signal, or until
/// leadership is lost (an error: the process exits non-zero and its supervisor restarts it).
async fn run_loops(
    client: kube::Client,
    copts: &manager::Options,
    election: Option<leader_election::Config>,
    explain: Option<&ExplainSlot>,
) -> anyhow::Result<()> {
    let start = || {
        let loops = manager::start(client.clone(), copts);
        if let Some(slot) = explain {
            let _already_set = slot.set(loops.explain());
        }
        loops
    };
    match election {
        None => {
            let _loops = start();
            wait_for_signal().await
        }
        Some(cfg) => {
            // on a signal the election gives the Lease back (if held) before returning
            let signal = shutdown_signal()?;
            Ok(leader_election::run(client.clone(), &cfg, start, signal).await?)
        }
    }
}

type ExplainSlot = std::sync::OnceLock<std::sync::Arc<ferro_control_plane::controllers::explain::Registry>>;

/// A Go duration ("40s", "5m", "1h30m", "500ms"; the shared implementation) or, as ferro's
/// flags have always taken, a plain number of seconds.
fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let s = s.trim();
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        return s.parse().map(std::time::Duration::from_secs).map_err(|_| format!("invalid duration {s:?}"));
    }
    k8s_semantics::parse_duration(s).map_err(|e| e.to_string())
}

async fn kube_client(path: &std::path::Path) -> anyhow::Result<kube::Client> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let kc = kube::config::Kubeconfig::from_yaml(&text).with_context(|| format!("parsing {}", path.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default()).await?;
    Ok(kube::Client::try_from(config)?)
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
    /// Bootstrap tokens for joining nodes (kubeadm token's subset).
    #[command(subcommand)]
    Token(TokenCmd),
}

#[derive(Subcommand, Debug)]
enum TokenCmd {
    /// Create a bootstrap token (a Secret in kube-system, through the API with the data dir's
    /// admin.kubeconfig) and print it: `<id>.<secret>`. A worker joins with it
    /// (ferro-agent --bootstrap-kubeconfig; scripts/install.sh --role worker --token).
    Create {
        /// How long the token is valid (0: forever).
        #[arg(long, default_value = "24h", value_parser = parse_duration)]
        ttl: std::time::Duration,
        #[arg(long, default_value = "ferro join token")]
        description: String,
        /// Extra groups (system:bootstrappers:...); the default group may join nodes.
        #[arg(long = "groups", value_delimiter = ',', default_value = ferro_control_plane::bootstrap_token::DEFAULT_GROUP)]
        groups: Vec<String>,
        /// The token to create (default: random).
        token: Option<String>,
        /// Print the command a worker joins with (scripts/install.sh --role worker with the
        /// API server of the data dir's admin.kubeconfig, the token and the cluster CA's
        /// public key hash for --discovery-token-ca-cert-hash) instead of the token alone.
        #[arg(long)]
        print_join_command: bool,
    },
}

/// `token create`: writes the token's Secret and prints the token.
fn token_create(data_dir: &std::path::Path, token: Option<&str>, ttl: std::time::Duration, description: &str, groups: &[String], join_command: bool) -> anyhow::Result<()> {
    use ferro_control_plane::bootstrap_token as bt;
    let token = token.map(str::to_string).unwrap_or_else(bt::generate);
    if bt::split(&token).is_none() {
        anyhow::bail!("token {token:?} is not of the form [a-z0-9]{{6}}.[a-z0-9]{{16}}");
    }
    if let Some(g) = groups.iter().find(|g| !bt::valid_group(g)) {
        anyhow::bail!("group {g:?} is not a system:bootstrappers:... group");
    }
    let expiration = (!ttl.is_zero())
        .then(|| jiff::Timestamp::now().checked_add(jiff::SignedDuration::try_from(ttl).unwrap_or(jiff::SignedDuration::MAX)))
        .transpose()
        .context("token expiration")?;
    let secret = bt::secret_for(&token, expiration, description, groups).context("token shape")?;
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(secret)?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        let client = kube_client(&data_dir.join("admin.kubeconfig")).await?;
        let api: kube::Api<k8s_openapi::api::core::v1::Secret> = kube::Api::namespaced(client, bt::NAMESPACE);
        api.create(&kube::api::PostParams::default(), &secret).await.context("creating the token's Secret")?;
        anyhow::Ok(())
    })?;
    if !join_command {
        println!("{token}");
        return Ok(());
    }
    let kc = kube::config::Kubeconfig::read_from(data_dir.join("admin.kubeconfig")).context("reading admin.kubeconfig")?;
    let server = kc.clusters.first().and_then(|c| c.cluster.as_ref()).and_then(|c| c.server.clone()).context("admin.kubeconfig names no server")?;
    let ca = pki::Ca::load_or_create(data_dir).context("loading the cluster CA")?;
    use rustls::pki_types::pem::PemObject as _;
    let der = rustls::pki_types::CertificateDer::from_pem_slice(ca.cert_pem.as_bytes()).context("the cluster CA certificate")?;
    let hash = k8s_semantics::bootstrap::ca_cert_hash(&der)?;
    println!("scripts/install.sh --role worker --api-server {server} --token {token} --discovery-token-ca-cert-hash {hash}");
    Ok(())
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
    if let Some(Command::Token(TokenCmd::Create { ttl, description, groups, token, print_join_command })) = &cli.command {
        return token_create(&cli.data_dir, token.as_deref(), *ttl, description, groups, *print_join_command);
    }
    let election = cli.election()?;
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
        etcd: (!cli.etcd_servers.is_empty()).then(|| ferro_control_plane::config::EtcdConfig {
            servers: cli.etcd_servers.clone(),
            ca_file: cli.etcd_cafile.clone(),
            cert_file: cli.etcd_certfile.clone(),
            key_file: cli.etcd_keyfile.clone(),
            prefix: cli.etcd_prefix.clone(),
            compaction_interval: cli.etcd_compaction_interval,
        }),
        api_audiences: match cli.api_audiences.iter().filter(|a| !a.is_empty()).count() {
            0 => vec![cli.service_account_issuer.clone()],
            _ => cli.api_audiences.iter().filter(|a| !a.is_empty()).cloned().collect(),
        },
        tokens_clock_file: cli.tokens_clock_file.clone(),
        anonymous_auth: cli.anonymous_auth,
        service_account_issuer: ferro_control_plane::sa_token::validate_issuer(&cli.service_account_issuer).map_err(anyhow::Error::msg)?,
    };
    ferro_control_plane::controllers::manager::validate(&cli.controllers).map_err(anyhow::Error::msg)?;
    let copts = ferro_control_plane::controllers::manager::Options {
        controllers: cli.controllers.clone(),
        node_monitor_grace_period: cli.node_monitor_grace_period,
        cluster_cidr: cli.cluster_cidr,
        allocate_node_cidrs: cli.allocate_node_cidrs,
        node_cidr_mask_size: cli.node_cidr_mask_size,
        terminated_pod_gc_threshold: cli.terminated_pod_gc_threshold,
        pod_gc_quarantine: cli.pod_gc_quarantine,
        cluster_signing_duration: cli.cluster_signing_duration,
        signing_ca: match (&cli.cluster_signing_cert_file, &cli.cluster_signing_key_file) {
            (Some(c), Some(k)) => Some(std::sync::Arc::new(ferro_control_plane::pki::Ca::load(c, k)?)),
            _ => None,
        },
        ..Default::default()
    };
    if cli.allocate_node_cidrs && cli.cluster_cidr.is_none() {
        anyhow::bail!("--allocate-node-cidrs needs --cluster-cidr");
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let mut copts = copts;
    if let Some(file) = &cli.controllers_clock_file {
        copts.clock = rt
            .block_on(async { ferro_control_plane::controllers::clock::Clock::from_file(file.clone()) })
            .map_err(anyhow::Error::msg)?;
    }
    if let Some(path) = &cli.kubeconfig {
        copts.root_ca = kubeconfig_ca(path);
        return rt.block_on(async {
            let client = kube_client(path).await?;
            run_loops(client, &copts, election, None).await?;
            tracing::info!("shutting down");
            anyhow::Ok(())
        });
    }
    rt.block_on(async {
        let running = start(&cfg).await?;
        // The API listens and the store is open: READY=1; the watchdog's keep-alives while
        // the server answers its own /readyz.
        let sd = ferro_runtime::systemd::Systemd::from_env();
        let admin = kube_client(&cfg.data_dir.join("admin.kubeconfig")).await?;
        sd.ready("serving the API");
        let _liveness = sd.heartbeat().drive(std::time::Duration::from_secs(10), move || readyz(admin.clone()));
        // this server's CA, made by start at first start
        copts.root_ca = std::fs::read_to_string(cfg.data_dir.join("ca.crt")).ok();
        if copts.signing_ca.is_none() {
            copts.signing_ca = Some(std::sync::Arc::new(ferro_control_plane::pki::Ca::load_or_create(&cfg.data_dir)?));
        }
        copts.sa_key = Some(running.sa_key.clone());
        if copts.controllers.iter().any(|c| !c.is_empty()) {
            let client = kube_client(&cfg.data_dir.join("admin.kubeconfig")).await?;
            run_loops(client, &copts, election, Some(&running.explain)).await?;
        } else {
            wait_for_signal().await?;
        }
        sd.stopping();
        tracing::info!("shutting down");
        running.stop();
        anyhow::Ok(())
    })
}

/// The watchdog's liveness check: GET /readyz answered 200.
async fn readyz(client: kube::Client) -> Result<(), String> {
    let req = http::Request::get("/readyz").body(Vec::new()).map_err(|e| e.to_string())?;
    client.request_text(req).await.map(drop).map_err(|e| e.to_string())
}

/// The cluster CA the root CA publisher hands out when the loops run against another API
/// server: the kubeconfig's.
fn kubeconfig_ca(path: &std::path::Path) -> Option<String> {
    use base64::Engine as _;
    let kc = kube::config::Kubeconfig::read_from(path).ok()?;
    let cluster = kc.clusters.first()?.cluster.as_ref()?;
    if let Some(data) = &cluster.certificate_authority_data {
        let pem = base64::engine::general_purpose::STANDARD.decode(data.trim()).ok()?;
        return String::from_utf8(pem).ok();
    }
    std::fs::read_to_string(cluster.certificate_authority.as_ref()?).ok()
}

async fn wait_for_signal() -> anyhow::Result<()> {
    shutdown_signal()?.await;
    Ok(())
}

/// Resolves at SIGINT or SIGTERM (the handlers are installed now).
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
    })
}
