//! Starts the enabled loops over one set of shared informers (one watch per kind), against
//! any Kubernetes API server reachable with the given client.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use api_ext::snapshot::v1::{VolumeSnapshot, VolumeSnapshotClass, VolumeSnapshotContent};
use ferro_runtime::Informer;
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    ConfigMap, Endpoints, Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod, Service, ServiceAccount,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::rbac::v1::ClusterRole;
use k8s_openapi::api::storage::v1::{CSIDriver, CSIStorageCapacity, StorageClass};
use kube::runtime::watcher;
use kube::Api;

/// The loops ferro runs, by their upstream names (`--controllers`).
pub const ALL: &[&str] = &[
    "scheduler",
    "endpointslice",
    "endpoints",
    "nodelifecycle",
    "garbagecollector",
    "namespace",
    "replicaset",
    "deployment",
    "daemonset",
    "podgc",
    "statefulset",
    "job",
    "ttl-after-finished",
    "persistentvolume-binder",
    "serviceaccount",
    "nodeipam",
    "volumesnapshot",
    "cronjob",
    "disruption",
    "root-ca-cert-publisher",
    "serviceaccount-token",
    "clusterrole-aggregation",
    "csrapproving",
    "csrsigning",
    "csrcleaner",
    "tokencleaner",
    "bootstrapsigner",
];

/// Options of the loops (flags of ferro-control-plane).
#[derive(Clone, Debug)]
pub struct Options {
    /// Upstream syntax: `*` enables all, `name` enables one, `-name` disables one.
    pub controllers: Vec<String>,
    /// Time without a Lease renewal before a node is considered unreachable.
    pub node_monitor_grace_period: Duration,
    /// Pod network of the cluster; with `allocate_node_cidrs` each Node gets a podCIDR from it.
    pub cluster_cidr: Option<ipnet::IpNet>,
    pub allocate_node_cidrs: bool,
    pub node_cidr_mask_size: u8,
    /// Every object of a loop's kind is looked at again this often (level-triggered repair).
    pub resync: Duration,
    /// Terminated pods kept before PodGC deletes the oldest (`--terminated-pod-gc-threshold`,
    /// 0 keeps all).
    pub terminated_pod_gc_threshold: usize,
    /// How long a node must stay missing before PodGC deletes its pods (upstream's fixed 40 s).
    pub pod_gc_quarantine: Duration,
    /// The time loops that act on the clock (CronJobs) read; tests set a manual one.
    pub clock: super::clock::Clock,
    /// The cluster CA (PEM) the root CA publisher puts in every namespace.
    pub root_ca: Option<String>,
    /// The service account signing key (the legacy token loop signs with it).
    pub sa_key: Option<Arc<crate::sa_token::SigningKey>>,
    /// The CA that signs approved CertificateSigningRequests (the cluster CA).
    pub signing_ca: Option<Arc<crate::pki::Ca>>,
    /// How long the certificates it signs are valid (`--cluster-signing-duration`).
    pub cluster_signing_duration: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            controllers: vec!["*".into()],
            node_monitor_grace_period: Duration::from_secs(40),
            cluster_cidr: None,
            allocate_node_cidrs: false,
            node_cidr_mask_size: 24,
            resync: Duration::from_secs(300),
            terminated_pod_gc_threshold: super::podgc::plan::DEFAULT_THRESHOLD,
            pod_gc_quarantine: super::podgc::plan::QUARANTINE,
            clock: super::clock::Clock::System,
            root_ca: None,
            sa_key: None,
            signing_ca: None,
            cluster_signing_duration: super::csrsigning::DEFAULT_DURATION,
        }
    }
}

/// Whether a loop is enabled by the `--controllers` list.
pub fn enabled(spec: &[String], name: &str) -> bool {
    let mut on = false;
    for item in spec.iter().flat_map(|s| s.split(',')).map(str::trim) {
        if item == "*" {
            on = true;
        } else if item.strip_prefix('-') == Some(name) {
            return false;
        } else if item == name {
            on = true;
        }
    }
    on
}

/// Checks a `--controllers` list: every name must be known.
pub fn validate(spec: &[String]) -> Result<(), String> {
    for item in spec.iter().flat_map(|s| s.split(',')).map(str::trim).filter(|s| !s.is_empty()) {
        let name = item.strip_prefix('-').unwrap_or(item);
        if name != "*" && !ALL.contains(&name) {
            return Err(format!("unknown controller {name:?}; known: {}", ALL.join(", ")));
        }
    }
    Ok(())
}

macro_rules! informers {
    ($($field:ident: $ty:ty),* $(,)?) => {
        /// The shared informers, each started on first use.
        pub struct Informers {
            client: kube::Client,
            explain: Arc<super::explain::Registry>,
            $($field: OnceLock<Arc<Informer<$ty>>>,)*
        }

        impl Informers {
            pub fn new(client: kube::Client) -> Arc<Self> {
                Arc::new(Informers { client, explain: Arc::default(), $($field: OnceLock::new(),)* })
            }

            $(
            pub fn $field(&self) -> Arc<Informer<$ty>> {
                self.$field
                    .get_or_init(|| {
                        let inf = Informer::new();
                        inf.spawn(Api::all(self.client.clone()), watcher::Config::default().page_size(1000));
                        inf
                    })
                    .clone()
            }
            )*
        }
    };
}

informers! {
    pods: Pod,
    nodes: Node,
    leases: Lease,
    services: Service,
    endpoint_slices: EndpointSlice,
    endpoints: Endpoints,
    replica_sets: ReplicaSet,
    deployments: Deployment,
    claims: PersistentVolumeClaim,
    volumes: PersistentVolume,
    storage_classes: StorageClass,
    csi_drivers: CSIDriver,
    storage_capacities: CSIStorageCapacity,
    namespaces: Namespace,
    service_accounts: ServiceAccount,
    config_maps: ConfigMap,
    volume_snapshots: VolumeSnapshot,
    volume_snapshot_contents: VolumeSnapshotContent,
    volume_snapshot_classes: VolumeSnapshotClass,
    stateful_sets: StatefulSet,
    daemon_sets: DaemonSet,
    controller_revisions: ControllerRevision,
    jobs: Job,
    cron_jobs: CronJob,
    pod_disruption_budgets: PodDisruptionBudget,
    cluster_roles: ClusterRole,
    csrs: CertificateSigningRequest,
}

impl Informers {
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// The explainers of the running loops (`/debug/controllers`).
    pub fn explain(&self) -> Arc<super::explain::Registry> {
        self.explain.clone()
    }
}

/// Starts every enabled loop; they run until the process ends.
pub fn start(client: kube::Client, opts: &Options) -> Arc<Informers> {
    let inf = Informers::new(client);
    let on = |name: &str| enabled(&opts.controllers, name);
    if on("serviceaccount") {
        super::serviceaccount::start(&inf, opts);
    }
    if on("root-ca-cert-publisher") {
        super::rootca::start(&inf, opts);
    }
    if on("serviceaccount-token") {
        super::satoken::start(&inf, opts);
    }
    if on("namespace") {
        super::namespace::start(&inf, opts);
    }
    if on("garbagecollector") {
        super::gc::start(&inf, opts);
    }
    if on("replicaset") {
        super::replicaset::start(&inf, opts);
    }
    if on("deployment") {
        super::deployment::start(&inf, opts);
    }
    if on("daemonset") {
        super::daemonset::start(&inf, opts);
    }
    if on("podgc") {
        super::podgc::start(&inf, opts);
    }
    if on("statefulset") {
        super::statefulset::start(&inf, opts);
    }
    if on("job") {
        super::job::start(&inf, opts);
    }
    if on("ttl-after-finished") {
        super::ttlafterfinished::start(&inf, opts);
    }
    if on("endpointslice") || on("endpoints") {
        super::endpointslice::start(&inf, opts, on("endpointslice"), on("endpoints"));
    }
    if on("nodelifecycle") {
        super::nodelifecycle::start(&inf, opts);
    }
    if on("persistentvolume-binder") {
        super::pvbinder::start(&inf, opts);
    }
    if on("disruption") {
        super::disruption::start(&inf, opts);
    }
    if on("cronjob") {
        super::cronjob::start(&inf, opts);
    }
    if on("volumesnapshot") {
        super::snapshot::start(&inf, opts);
    }
    if on("scheduler") {
        super::scheduler::start(&inf, opts);
    }
    if on("clusterrole-aggregation") {
        super::clusterroleaggregation::start(&inf, opts);
    }
    if on("nodeipam") && opts.allocate_node_cidrs {
        super::nodeipam::start(&inf, opts);
    }
    if on("csrapproving") {
        super::csrapproving::start(&inf, opts);
    }
    if on("csrsigning") {
        super::csrsigning::start(&inf, opts);
    }
    if on("csrcleaner") {
        super::csrcleaner::start(&inf, opts);
    }
    if on("tokencleaner") {
        super::tokencleaner::start(&inf, opts);
    }
    if on("bootstrapsigner") {
        super::bootstrapsigner::start(&inf, opts);
    }
    let running: Vec<&str> = ALL
        .iter()
        .copied()
        .filter(|n| on(n) && (*n != "nodeipam" || opts.allocate_node_cidrs) && (*n != "root-ca-cert-publisher" || opts.root_ca.is_some())
            && (*n != "serviceaccount-token" || (opts.root_ca.is_some() && opts.sa_key.is_some()))
            && (*n != "csrsigning" || opts.signing_ca.is_some()))
        .collect();
    tracing::info!(loops = %running.join(","), "controller loops started");
    inf.explain.set_running(running);
    inf
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn controllers_flag_follows_upstream_syntax() {
        assert!(enabled(&s(&["*"]), "scheduler"));
        assert!(!enabled(&s(&["*,-scheduler"]), "scheduler"));
        assert!(enabled(&s(&["*,-scheduler"]), "deployment"));
        assert!(!enabled(&s(&["deployment"]), "scheduler"));
        assert!(enabled(&s(&["deployment", "replicaset"]), "replicaset"));
        assert!(!enabled(&s(&[]), "replicaset"));
        assert!(validate(&s(&["*,-scheduler"])).is_ok());
        assert!(validate(&s(&["*,-schedular"])).is_err());
    }
}
