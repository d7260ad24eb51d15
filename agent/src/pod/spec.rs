//! The CRI configs the agent creates for a pod: the PodSandboxConfig, and for each container its
//! environment, mounts, the managed /etc/hosts and the ContainerConfig. Pure, with one named
//! exception: [`container_mounts`] creates a missing subPath (or expanded subPathExpr) directory
//! inside its volume (as upstream does before handing the mount to the runtime). What the image
//! says about its user comes in from the caller's ImageStatus ([`ImageUser`]).
//!
//! The rules follow the upstream kubelet (kuberuntime's generatePodSandboxConfig and
//! generateContainerConfig, makeEnvironmentVariables, the dns configurer, makeMounts and the
//! managed hosts file); where ferro deviates, the item says so.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use k8s_cri::v1::security_profile::ProfileType;
use k8s_cri::v1::{
    Capability, ContainerConfig, ContainerMetadata, Device, DnsConfig, Image, ImageSpec, Int64Value, KeyValue,
    LinuxContainerConfig, LinuxContainerResources, LinuxContainerSecurityContext, LinuxPodSandboxConfig,
    LinuxSandboxSecurityContext, Mount, MountPropagation, NamespaceMode, NamespaceOption, PodSandboxConfig,
    PodSandboxMetadata, PortMapping, Protocol, SecurityProfile,
};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ResourceRequirements, SeccompProfile};

use super::model::{
    qos_class, ContainerKind, Objects, QosClass, ANN_CONTAINER_HASH, ANN_CONTAINER_TYPE, ANN_RESTART_COUNT,
    ANN_TERMINATION_GRACE, ANN_TERMINATION_MESSAGE_PATH, ANN_TERMINATION_MESSAGE_POLICY, LABEL_CONTAINER_NAME,
    LABEL_MANAGED_BY, LABEL_POD_NAME, LABEL_POD_NAMESPACE, LABEL_POD_UID, MANAGED_BY,
};

/// The cgroup driver the runtime uses; decides the form of the pod's cgroup parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupDriver {
    Cgroupfs,
    Systemd,
}

/// What the configs need to know about the node.
#[derive(Debug, Clone)]
pub struct NodeContext {
    pub node_name: String,
    /// The node's IPs, preferred family first (status.hostIP(s), and the family pod IPs are
    /// ordered by).
    pub host_ips: Vec<String>,
    pub cluster_dns: Vec<String>,
    /// "cluster.local" unless configured otherwise (the caller defaults it).
    pub cluster_domain: String,
    pub cgroup_driver: CgroupDriver,
    /// /var/log/pods.
    pub pod_log_root: PathBuf,
    /// Defaults for resourceFieldRef limits.cpu / limits.memory of a container without limits.
    pub allocatable_cpu_milli: i64,
    pub allocatable_memory: i64,
    /// The node's memory in bytes, for the oom_score_adj of Burstable containers.
    pub memory_capacity: i64,
}

/// Why a config could not be built. The messages are what the pod status shows (the message of
/// CreateContainerConfigError), mostly upstream's words.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("pod has no spec")]
    NoSpec,
    #[error("configmap \"{0}\" not found")]
    ConfigMapNotFound(String),
    #[error("secret \"{0}\" not found")]
    SecretNotFound(String),
    #[error("couldn't find key {key} in ConfigMap {namespace}/{name}")]
    ConfigMapKeyNotFound { key: String, namespace: String, name: String },
    #[error("couldn't find key {key} in Secret {namespace}/{name}")]
    SecretKeyNotFound { key: String, namespace: String, name: String },
    #[error("unsupported fieldPath: {0}")]
    UnsupportedFieldPath(String),
    #[error("unsupported pod version: {0}")]
    UnsupportedApiVersion(String),
    #[error("unsupported container resource: {0}")]
    UnsupportedResource(String),
    #[error("{0} is not known to the agent")]
    UnknownNodeValue(&'static str),
    #[error("invalid quantity {quantity:?} in {field}")]
    InvalidQuantity { field: String, quantity: String },
    #[error("cannot find volume \"{volume}\" to mount into container \"{container}\"")]
    VolumeNotFound { volume: String, container: String },
    #[error("invalid subPath `{sub_path}`: {reason}")]
    InvalidSubPath { sub_path: String, reason: &'static str },
    #[error("error SubPath `{0}` must not be an absolute path")]
    SubPathAbsolute(String),
    #[error("unable to provision SubPath `{0}`: must not contain '..'")]
    SubPathBacksteps(String),
    /// subPathExpr references variables the container's environment lacks or has empty
    /// (sorted, comma-separated).
    #[error("missing value for {0}")]
    SubPathExprMissing(String),
    #[error("unable to provision subPath `{sub_path}` in {volume_path}")]
    SubPathProvision {
        sub_path: String,
        volume_path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid mountPropagation {0:?}")]
    InvalidPropagation(String),
    #[error("container's runAsUser breaks non-root policy (pod: \"{pod}\", container: {container})")]
    RunAsNonRoot { pod: String, container: String },
    #[error("container has runAsNonRoot and image will run as root (pod: \"{pod}\", container: {container})")]
    ImageRunsAsRoot { pod: String, container: String },
    #[error(
        "container has runAsNonRoot and image has non-numeric user ({user}), cannot verify user is non-root (pod: \"{pod}\", container: {container})"
    )]
    ImageUserNotNumeric { user: String, pod: String, container: String },
    #[error("localhost seccomp profiles are not supported (container {0})")]
    LocalhostSeccomp(String),
    #[error(
        "failed to construct FQDN from pod hostname and cluster domain, FQDN {0} is too long (64 characters is the max, {1} characters requested)"
    )]
    FqdnTooLong(String, usize),
}

const DEFAULT_TERMINATION_MESSAGE_PATH: &str = "/dev/termination-log";
const DEFAULT_TERMINATION_GRACE_SECONDS: i64 = 30;
const ETC_HOSTS: &str = "/etc/hosts";
/// CFS period in microseconds (upstream quotaPeriod).
const CPU_PERIOD: i64 = 100_000;
const MIN_QUOTA: i64 = 1_000;
const MIN_SHARES: i64 = 2;
const MAX_SHARES: i64 = 262_144;
const GUARANTEED_OOM_SCORE_ADJ: i64 = -997;
const BESTEFFORT_OOM_SCORE_ADJ: i64 = 1000;
const HOSTNAME_MAX_LEN: usize = 63;
const FQDN_MAX_LEN: usize = 64;
const MAX_DNS_NAMESERVERS: usize = 3;
const MAX_DNS_SEARCH_PATHS: usize = 32;
const MAX_DNS_SEARCH_LIST_CHARS: usize = 2048;
const MAX_DNS_SEARCH_LEN: usize = 253;

fn spec_of(pod: &Pod) -> Result<&PodSpec, SpecError> {
    pod.spec.as_ref().ok_or(SpecError::NoSpec)
}

fn name(pod: &Pod) -> &str {
    pod.metadata.name.as_deref().unwrap_or_default()
}

fn namespace(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or("default")
}

fn uid(pod: &Pod) -> &str {
    pod.metadata.uid.as_deref().unwrap_or_default()
}

fn host_network(pod: &Pod) -> bool {
    pod.spec.as_ref().and_then(|s| s.host_network).unwrap_or(false)
}

/// Upstream's format.Pod: "name_namespace(uid)".
fn pod_desc(pod: &Pod) -> String {
    format!("{}_{}({})", name(pod), namespace(pod), uid(pod))
}

fn termination_grace(pod: &Pod) -> i64 {
    pod.spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(DEFAULT_TERMINATION_GRACE_SECONDS)
}

/// The pod's cgroup parent, as the runtime takes it for the sandbox: under the QoS tier of
/// kubepods.
///
/// cgroupfs: "/kubepods/pod<uid>" (Guaranteed), "/kubepods/burstable/pod<uid>",
/// "/kubepods/besteffort/pod<uid>"; systemd: "kubepods-pod<uid_>.slice",
/// "kubepods-burstable-pod<uid_>.slice", "kubepods-besteffort-pod<uid_>.slice" (dashes of the
/// uid become underscores, as systemd reads a dash as a slice separator).
pub fn cgroup_parent(pod: &Pod, driver: CgroupDriver) -> String {
    let tier = match qos_class(pod) {
        QosClass::Guaranteed => None,
        QosClass::Burstable => Some("burstable"),
        QosClass::BestEffort => Some("besteffort"),
    };
    match driver {
        CgroupDriver::Cgroupfs => match tier {
            None => format!("/kubepods/pod{}", uid(pod)),
            Some(t) => format!("/kubepods/{t}/pod{}", uid(pod)),
        },
        CgroupDriver::Systemd => {
            let u = uid(pod).replace('-', "_");
            match tier {
                None => format!("kubepods-pod{u}.slice"),
                Some(t) => format!("kubepods-{t}-pod{u}.slice"),
            }
        }
    }
}

/// The pod's log directory: `<pod_log_root>/<namespace>_<name>_<uid>`.
pub fn pod_log_dir(pod: &Pod, ctx: &NodeContext) -> PathBuf {
    ctx.pod_log_root
        .join(format!("{}_{}_{}", namespace(pod), name(pod), uid(pod)))
}

/// Upstream's GeneratePodHostNameAndDomain: spec.hostname or the pod name, cut to 63 characters
/// (without trailing '-' or '.'); the domain "<subdomain>.<ns>.svc.<cluster domain>" when the
/// pod sets a subdomain.
fn hostname_and_domain(pod: &Pod, ctx: &NodeContext) -> (String, Option<String>) {
    let spec = pod.spec.as_ref();
    let mut hostname = spec
        .and_then(|s| s.hostname.clone())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| name(pod).to_string());
    if hostname.len() > HOSTNAME_MAX_LEN {
        // Hostnames are DNS labels (ASCII); cut on a char boundary anyway.
        let mut cut = HOSTNAME_MAX_LEN;
        while !hostname.is_char_boundary(cut) {
            cut -= 1;
        }
        hostname.truncate(cut);
        let trimmed = hostname.trim_end_matches(['-', '.']).len();
        hostname.truncate(trimmed);
    }
    let domain = spec
        .and_then(|s| s.subdomain.as_deref())
        .filter(|d| !d.is_empty())
        .map(|sub| format!("{sub}.{}.svc.{}", namespace(pod), ctx.cluster_domain));
    (hostname, domain)
}

/// The pod's sandbox config for attempt `attempt`.
pub fn sandbox_config(pod: &Pod, attempt: u32, ctx: &NodeContext) -> Result<PodSandboxConfig, SpecError> {
    let spec = spec_of(pod)?;
    let host_net = spec.host_network.unwrap_or(false);

    // The runtime keeps the node's hostname for host network pods.
    let hostname = if host_net {
        String::new()
    } else {
        let (host, domain) = hostname_and_domain(pod, ctx);
        match domain {
            Some(d) if spec.set_hostname_as_fqdn == Some(true) => {
                let fqdn = format!("{host}.{d}");
                if fqdn.len() > FQDN_MAX_LEN {
                    let n = fqdn.len();
                    return Err(SpecError::FqdnTooLong(fqdn, n));
                }
                fqdn
            }
            _ => host,
        }
    };

    let mut labels: HashMap<String, String> = pod.metadata.labels.clone().unwrap_or_default().into_iter().collect();
    labels.insert(LABEL_POD_NAME.into(), name(pod).into());
    labels.insert(LABEL_POD_NAMESPACE.into(), namespace(pod).into());
    labels.insert(LABEL_POD_UID.into(), uid(pod).into());
    labels.insert(LABEL_MANAGED_BY.into(), MANAGED_BY.into());

    let mut annotations: HashMap<String, String> =
        pod.metadata.annotations.clone().unwrap_or_default().into_iter().collect();
    annotations.insert(ANN_TERMINATION_GRACE.into(), termination_grace(pod).to_string());

    let psc = spec.security_context.as_ref();
    // containerd refuses a privileged container in a sandbox that is not privileged (upstream
    // HasPrivilegedContainer, over init containers too).
    let privileged = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .any(|c| c.security_context.as_ref().and_then(|s| s.privileged) == Some(true));
    let security_context = LinuxSandboxSecurityContext {
        namespace_options: Some(namespace_options(spec)),
        run_as_user: psc.and_then(|s| s.run_as_user).map(|value| Int64Value { value }),
        run_as_group: psc.and_then(|s| s.run_as_group).map(|value| Int64Value { value }),
        supplemental_groups: supplemental_groups(spec),
        privileged,
        // Upstream runs the sandbox (pause) under the runtime's default seccomp profile.
        seccomp: Some(SecurityProfile { profile_type: ProfileType::RuntimeDefault as i32, localhost_ref: String::new() }),
        ..Default::default()
    };
    let sysctls = psc
        .and_then(|s| s.sysctls.as_ref())
        .into_iter()
        .flatten()
        .map(|s| (s.name.clone(), s.value.clone()))
        .collect();

    Ok(PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: name(pod).into(),
            uid: uid(pod).into(),
            namespace: namespace(pod).into(),
            attempt,
        }),
        hostname,
        log_directory: pod_log_dir(pod, ctx).to_string_lossy().into_owned(),
        dns_config: dns_config(pod, spec, ctx),
        port_mappings: port_mappings(spec),
        labels,
        annotations,
        linux: Some(LinuxPodSandboxConfig {
            cgroup_parent: cgroup_parent(pod, ctx.cgroup_driver),
            security_context: Some(security_context),
            sysctls,
            ..Default::default()
        }),
        windows: None,
    })
}

fn namespace_options(spec: &PodSpec) -> NamespaceOption {
    let mode = |node: bool| if node { NamespaceMode::Node } else { NamespaceMode::Pod } as i32;
    let pid = if spec.host_pid == Some(true) {
        NamespaceMode::Node
    } else if spec.share_process_namespace == Some(true) {
        NamespaceMode::Pod
    } else {
        NamespaceMode::Container
    };
    NamespaceOption {
        network: mode(spec.host_network == Some(true)),
        pid: pid as i32,
        ipc: mode(spec.host_ipc == Some(true)),
        ..Default::default()
    }
}

/// fsGroup first, then supplementalGroups (upstream's order).
fn supplemental_groups(spec: &PodSpec) -> Vec<i64> {
    let psc = spec.security_context.as_ref();
    psc.and_then(|s| s.fs_group)
        .into_iter()
        .chain(psc.and_then(|s| s.supplemental_groups.clone()).into_iter().flatten())
        .collect()
}

/// Every port of an app container that has a hostPort, deduplicated.
fn port_mappings(spec: &PodSpec) -> Vec<PortMapping> {
    let mut out: Vec<PortMapping> = Vec::new();
    for p in spec.containers.iter().flat_map(|c| c.ports.iter().flatten()) {
        let host_port = p.host_port.unwrap_or(0);
        if host_port == 0 {
            continue;
        }
        let protocol = match p.protocol.as_deref() {
            Some("UDP") => Protocol::Udp,
            Some("SCTP") => Protocol::Sctp,
            _ => Protocol::Tcp,
        } as i32;
        let m = PortMapping {
            protocol,
            container_port: p.container_port,
            host_port,
            host_ip: p.host_ip.clone().unwrap_or_default(),
        };
        if !out.contains(&m) {
            out.push(m);
        }
    }
    out
}

fn push_unique(list: &mut Vec<String>, items: impl IntoIterator<Item = String>) {
    for i in items {
        if !list.contains(&i) {
            list.push(i);
        }
    }
}

/// The resolver config per dnsPolicy (upstream's dns configurer). None lets the runtime copy
/// the node's resolv.conf.
///
/// Deviation: upstream starts from the node's resolv.conf (its servers, searches and options)
/// for Default and appends the host's searches to ClusterFirst's; ferro does not read the
/// node's resolv.conf, so Default with a dnsConfig yields only the dnsConfig entries.
fn dns_config(pod: &Pod, spec: &PodSpec, ctx: &NodeContext) -> Option<DnsConfig> {
    let host_net = spec.host_network == Some(true);
    let cluster = || {
        if ctx.cluster_dns.is_empty() {
            // Upstream records MissingClusterDNS and falls back to Default.
            return None;
        }
        let mut searches = Vec::new();
        if !ctx.cluster_domain.is_empty() {
            let d = &ctx.cluster_domain;
            push_unique(&mut searches, [format!("{}.svc.{d}", namespace(pod)), format!("svc.{d}"), d.clone()]);
        }
        Some(DnsConfig { servers: ctx.cluster_dns.clone(), searches, options: vec!["ndots:5".into()] })
    };
    let mut config = match spec.dns_policy.as_deref() {
        Some("None") => Some(DnsConfig::default()),
        Some("Default") => None,
        Some("ClusterFirstWithHostNet") => cluster(),
        // ClusterFirst (the default): host network pods fall back to Default.
        _ if host_net => None,
        _ => cluster(),
    };
    if let Some(pc) = spec.dns_config.as_ref() {
        let c = config.get_or_insert_with(DnsConfig::default);
        push_unique(&mut c.servers, pc.nameservers.clone().unwrap_or_default());
        push_unique(&mut c.searches, pc.searches.clone().unwrap_or_default());
        c.options = merge_dns_options(&c.options, pc.options.iter().flatten().map(|o| {
            (o.name.clone().unwrap_or_default(), o.value.clone().unwrap_or_default())
        }));
    }
    config.map(fit_dns_limits)
}

/// Options by name, the pod's overriding existing ones, in first-seen order.
fn merge_dns_options(existing: &[String], pod: impl Iterator<Item = (String, String)>) -> Vec<String> {
    let mut opts: Vec<(String, String)> = existing
        .iter()
        .map(|o| match o.split_once(':') {
            Some((n, v)) => (n.to_string(), v.to_string()),
            None => (o.clone(), String::new()),
        })
        .collect();
    for (n, v) in pod {
        match opts.iter_mut().find(|(name, _)| *name == n) {
            Some(slot) => slot.1 = v,
            None => opts.push((n, v)),
        }
    }
    opts.into_iter()
        .map(|(n, v)| if v.is_empty() { n } else { format!("{n}:{v}") })
        .collect()
}

/// Upstream's formDNSConfigFitsLimits: at most 3 nameservers, 32 search domains of at most 253
/// characters, a search line of at most 2048 characters.
fn fit_dns_limits(mut c: DnsConfig) -> DnsConfig {
    c.servers.truncate(MAX_DNS_NAMESERVERS);
    c.searches.truncate(MAX_DNS_SEARCH_PATHS);
    c.searches.retain(|s| s.len() <= MAX_DNS_SEARCH_LEN);
    while !c.searches.is_empty() && c.searches.join(" ").len() > MAX_DNS_SEARCH_LIST_CHARS {
        c.searches.pop();
    }
    c
}

/// Upstream's relaxed environment variable name check (the default since 1.32): printable
/// ASCII except '='.
fn valid_env_name(n: &str) -> bool {
    !n.is_empty() && n.bytes().all(|b| (32..=126).contains(&b) && b != b'=')
}

/// Upstream's $(VAR) expansion: `$(NAME)` becomes the mapped value, or stays as written when the
/// name is unknown; `$$` is an escaped `$`; an unterminated `$(` stays as written.
pub fn expand(input: &str, lookup: impl Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let Some(next) = after.chars().next() else {
            // A trailing '$' is copied as is.
            out.push('$');
            rest = after;
            break;
        };
        match next {
            '$' => {
                out.push('$');
                rest = &after[1..];
            }
            '(' => match after.find(')') {
                Some(close) => {
                    let var = &after[1..close];
                    match lookup(var) {
                        Some(v) => out.push_str(&v),
                        None => {
                            out.push_str("$(");
                            out.push_str(var);
                            out.push(')');
                        }
                    }
                    rest = &after[close + 1..];
                }
                None => {
                    out.push_str("$(");
                    rest = &after[1..];
                }
            },
            c => {
                out.push('$');
                out.push(c);
                rest = &after[c.len_utf8()..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Environment variables in definition order; a redefinition replaces the earlier entry and
/// moves to the end.
#[derive(Default)]
struct EnvList(Vec<(String, String)>);

impl EnvList {
    fn set(&mut self, k: String, v: String) {
        self.0.retain(|(n, _)| *n != k);
        self.0.push((k, v));
    }

    fn get(&self, k: &str) -> Option<String> {
        self.0.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
    }
}

/// Pod IPs with the node's preferred family first (upstream sortPodIPs).
fn sorted_pod_ips(pod: &Pod, pod_ips: &[String], ctx: &NodeContext) -> Vec<String> {
    if pod_ips.is_empty() && host_network(pod) {
        return ctx.host_ips.clone();
    }
    let Some(first) = ctx.host_ips.first() else {
        return pod_ips.to_vec();
    };
    let v6 = first.contains(':');
    let (mut same, other): (Vec<String>, Vec<String>) = pod_ips.iter().cloned().partition(|ip| ip.contains(':') == v6);
    same.extend(other);
    same
}

/// The container's environment: envFrom sources first (a prefix prepended; keys that are not
/// valid variable names skipped), then spec.env in order, each overriding earlier definitions.
/// `value` is expanded against the variables defined before it; valueFrom reads the pod's
/// fields, the container's resources (limits defaulting to the node's allocatable), or a key of
/// a ConfigMap/Secret in `objects`. A missing object or key is an error unless the reference is
/// optional, in which case the variable is left out.
///
/// Not here: the service link variables (FOO_SERVICE_HOST..., KUBERNETES_SERVICE_*), which
/// need the namespace's Services.
pub fn resolve_env(
    pod: &Pod,
    container: &Container,
    objects: &Objects,
    pod_ips: &[String],
    ctx: &NodeContext,
) -> Result<Vec<KeyValue>, SpecError> {
    let ns = namespace(pod);
    let mut env = EnvList::default();

    for from in container.env_from.iter().flatten() {
        let prefix = from.prefix.as_deref().unwrap_or_default();
        let pairs: Vec<(String, String)> = if let Some(r) = from.config_map_ref.as_ref() {
            match objects.config_maps.get(&r.name) {
                Some(cm) => cm.data.iter().flatten().map(|(k, v)| (k.clone(), v.clone())).collect(),
                None if r.optional == Some(true) => continue,
                None => return Err(SpecError::ConfigMapNotFound(r.name.clone())),
            }
        } else if let Some(r) = from.secret_ref.as_ref() {
            match objects.secrets.get(&r.name) {
                Some(s) => s
                    .data
                    .iter()
                    .flatten()
                    .map(|(k, v)| (k.clone(), String::from_utf8_lossy(&v.0).into_owned()))
                    .collect(),
                None if r.optional == Some(true) => continue,
                None => return Err(SpecError::SecretNotFound(r.name.clone())),
            }
        } else {
            continue;
        };
        for (k, v) in pairs {
            let key = format!("{prefix}{k}");
            // Upstream records an InvalidEnvironmentVariableNames event for these.
            if valid_env_name(&key) {
                env.set(key, v);
            }
        }
    }

    let services = service_env(&objects.services);
    let svc = |n: &str| services.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    let ips = sorted_pod_ips(pod, pod_ips, ctx);
    for var in container.env.iter().flatten() {
        let value = match (var.value.as_deref(), var.value_from.as_ref()) {
            (Some(v), _) if !v.is_empty() => expand(v, |n| env.get(n).or_else(|| svc(n))),
            (_, Some(from)) => {
                if let Some(f) = from.field_ref.as_ref() {
                    field_value(pod, f.api_version.as_deref(), &f.field_path, &ips, ctx)?
                } else if let Some(r) = from.resource_field_ref.as_ref() {
                    resource_value(container, &r.resource, r.divisor.as_ref().map(|d| d.0.as_str()), ctx)?
                } else if let Some(r) = from.config_map_key_ref.as_ref() {
                    let optional = r.optional == Some(true);
                    let Some(cm) = objects.config_maps.get(&r.name) else {
                        if optional {
                            continue;
                        }
                        return Err(SpecError::ConfigMapNotFound(r.name.clone()));
                    };
                    match cm.data.as_ref().and_then(|d| d.get(&r.key)) {
                        Some(v) => v.clone(),
                        None if optional => continue,
                        None => {
                            return Err(SpecError::ConfigMapKeyNotFound {
                                key: r.key.clone(),
                                namespace: ns.into(),
                                name: r.name.clone(),
                            })
                        }
                    }
                } else if let Some(r) = from.secret_key_ref.as_ref() {
                    let optional = r.optional == Some(true);
                    let Some(s) = objects.secrets.get(&r.name) else {
                        if optional {
                            continue;
                        }
                        return Err(SpecError::SecretNotFound(r.name.clone()));
                    };
                    match s.data.as_ref().and_then(|d| d.get(&r.key)) {
                        Some(v) => String::from_utf8_lossy(&v.0).into_owned(),
                        None if optional => continue,
                        None => {
                            return Err(SpecError::SecretKeyNotFound {
                                key: r.key.clone(),
                                namespace: ns.into(),
                                name: r.name.clone(),
                            })
                        }
                    }
                } else {
                    String::new()
                }
            }
            _ => String::new(),
        };
        env.set(var.name.clone(), value);
    }
    // Service variables come last and only where the container defines no variable of the name.
    for (k, v) in services {
        if env.get(&k).is_none() {
            env.0.push((k, v));
        }
    }

    Ok(env.0.into_iter().map(|(key, value)| KeyValue { key, value }).collect())
}

/// Upstream's service link variables (docker links format) for Services with a cluster IP:
/// `<NAME>_SERVICE_HOST`, `<NAME>_SERVICE_PORT` (first port), `<NAME>_SERVICE_PORT_<PORTNAME>`,
/// `<NAME>_PORT=<proto>://<ip>:<port>` and per port `<NAME>_PORT_<port>_<PROTO>[_PROTO|_PORT|_ADDR]`,
/// NAME being the Service name upper-cased with `-` as `_`. Services sorted by name.
pub fn service_env(services: &[k8s_openapi::api::core::v1::Service]) -> Vec<(String, String)> {
    let mut sorted: Vec<&k8s_openapi::api::core::v1::Service> = services.iter().collect();
    sorted.sort_by_key(|s| s.metadata.name.clone().unwrap_or_default());
    sorted.dedup_by_key(|s| s.metadata.name.clone());
    let mut out = Vec::new();
    for s in sorted {
        let Some(spec) = s.spec.as_ref() else { continue };
        let Some(ip) = spec.cluster_ip.as_deref().filter(|ip| !ip.is_empty() && *ip != "None") else {
            continue;
        };
        let ports = spec.ports.as_deref().unwrap_or_default();
        let Some(first) = ports.first() else { continue };
        let name = s.metadata.name.as_deref().unwrap_or_default().to_uppercase().replace('-', "_");
        out.push((format!("{name}_SERVICE_HOST"), ip.to_string()));
        out.push((format!("{name}_SERVICE_PORT"), first.port.to_string()));
        for p in ports {
            if let Some(pn) = p.name.as_deref().filter(|n| !n.is_empty()) {
                out.push((format!("{name}_SERVICE_PORT_{}", pn.to_uppercase().replace('-', "_")), p.port.to_string()));
            }
        }
        let url_ip = if ip.contains(':') { format!("[{ip}]") } else { ip.to_string() };
        let proto_of = |p: &k8s_openapi::api::core::v1::ServicePort| p.protocol.clone().unwrap_or_else(|| "TCP".into());
        out.push((format!("{name}_PORT"), format!("{}://{url_ip}:{}", proto_of(first).to_lowercase(), first.port)));
        for p in ports {
            let proto = proto_of(p);
            let prefix = format!("{name}_PORT_{}_{}", p.port, proto.to_uppercase());
            out.push((prefix.clone(), format!("{}://{url_ip}:{}", proto.to_lowercase(), p.port)));
            out.push((format!("{prefix}_PROTO"), proto.to_lowercase()));
            out.push((format!("{prefix}_PORT"), p.port.to_string()));
            out.push((format!("{prefix}_ADDR"), ip.to_string()));
        }
    }
    out
}

/// `metadata.labels['key']` -> ("metadata.labels", "key").
fn split_subscript(path: &str) -> Option<(&str, &str)> {
    let s = path.strip_suffix("']")?;
    let (base, key) = s.split_once("['")?;
    (!base.is_empty()).then_some((base, key))
}

/// Upstream's fieldpath.FormatMap: `key="value"` lines in key order.
fn format_map(m: &BTreeMap<String, String>) -> String {
    m.iter().map(|(k, v)| format!("{k}={v:?}")).collect::<Vec<_>>().join("\n")
}

fn field_value(
    pod: &Pod,
    api_version: Option<&str>,
    path: &str,
    pod_ips: &[String],
    ctx: &NodeContext,
) -> Result<String, SpecError> {
    if let Some(v) = api_version.filter(|v| !v.is_empty() && *v != "v1") {
        return Err(SpecError::UnsupportedApiVersion(v.into()));
    }
    let spec = pod.spec.as_ref();
    let empty = BTreeMap::new();
    let labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
    let annotations = pod.metadata.annotations.as_ref().unwrap_or(&empty);
    if let Some((base, key)) = split_subscript(path) {
        return match base {
            "metadata.labels" => Ok(labels.get(key).cloned().unwrap_or_default()),
            "metadata.annotations" => Ok(annotations.get(key).cloned().unwrap_or_default()),
            _ => Err(SpecError::UnsupportedFieldPath(path.into())),
        };
    }
    let v = match path {
        "metadata.name" => name(pod).to_string(),
        "metadata.namespace" => namespace(pod).to_string(),
        "metadata.uid" => uid(pod).to_string(),
        "metadata.labels" => format_map(labels),
        "metadata.annotations" => format_map(annotations),
        // "spec.host" is the old name of spec.nodeName.
        "spec.nodeName" | "spec.host" => spec.and_then(|s| s.node_name.clone()).unwrap_or_else(|| ctx.node_name.clone()),
        "spec.serviceAccountName" => spec.and_then(|s| s.service_account_name.clone()).unwrap_or_default(),
        "status.podIP" => pod_ips.first().cloned().unwrap_or_default(),
        "status.podIPs" => pod_ips.join(","),
        "status.hostIP" => ctx.host_ips.first().cloned().ok_or(SpecError::UnknownNodeValue("the node's IP"))?,
        "status.hostIPs" => {
            if ctx.host_ips.is_empty() {
                return Err(SpecError::UnknownNodeValue("the node's IP"));
            }
            ctx.host_ips.join(",")
        }
        _ => return Err(SpecError::UnsupportedFieldPath(path.into())),
    };
    Ok(v)
}

fn to_i64(v: i128) -> i64 {
    i64::try_from(v).unwrap_or(if v < 0 { i64::MIN } else { i64::MAX })
}

/// A resource of the container's requests or limits, times `scale` (see [`quantity_scaled`]);
/// None when not set.
fn container_quantity(
    res: Option<&ResourceRequirements>,
    limits: bool,
    resource: &str,
    scale: i128,
) -> Result<Option<i64>, SpecError> {
    let map = res.and_then(|r| if limits { r.limits.as_ref() } else { r.requests.as_ref() });
    let Some(q) = map.and_then(|m| m.get(resource)) else {
        return Ok(None);
    };
    let field = format!("{}.{resource}", if limits { "limits" } else { "requests" });
    k8s_semantics::quantity::scaled(&q.0, scale)
        .map(|v| Some(to_i64(v)))
        .ok_or_else(|| SpecError::InvalidQuantity { field, quantity: q.0.clone() })
}

/// A request, defaulting to the limit as API defaulting does.
fn request_or_limit(res: Option<&ResourceRequirements>, resource: &str, scale: i128) -> Result<Option<i64>, SpecError> {
    match container_quantity(res, false, resource, scale)? {
        Some(v) => Ok(Some(v)),
        None => container_quantity(res, true, resource, scale),
    }
}

/// A resourceFieldRef's value: [`k8s_semantics::resources::container_resource_value`] with
/// the node's allocatable cpu and memory for unset limits.
fn resource_value(container: &Container, resource: &str, divisor: Option<&str>, ctx: &NodeContext) -> Result<String, SpecError> {
    use k8s_semantics::resources::{container_resource_value, NodeAllocatable, ResourceFieldError as E};
    let node = NodeAllocatable { cpu_milli: ctx.allocatable_cpu_milli, memory: ctx.allocatable_memory, ephemeral_storage: None };
    container_resource_value(container, resource, divisor, &node).map_err(|e| match e {
        E::Unsupported(r) => SpecError::UnsupportedResource(r),
        E::InvalidQuantity { field, quantity } => SpecError::InvalidQuantity { field, quantity },
        E::UnknownNodeValue(_) => SpecError::UnknownNodeValue("allocatable ephemeral-storage"),
    })
}

fn propagation(p: Option<&str>) -> Result<MountPropagation, SpecError> {
    match p {
        None | Some("None") => Ok(MountPropagation::PropagationPrivate),
        Some("HostToContainer") => Ok(MountPropagation::PropagationHostToContainer),
        Some("Bidirectional") => Ok(MountPropagation::PropagationBidirectional),
        Some(other) => Err(SpecError::InvalidPropagation(other.into())),
    }
}

/// A volume as the volume manager set it up, by volume name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumePath {
    pub host_path: PathBuf,
    /// The volume is read-only whatever the mount says (e.g. configMap, secret, projected).
    pub read_only: bool,
}

/// The container's volumeDevices as CRI devices: each raw block volume's published device node
/// at its devicePath (read, write and mknod; read and mknod for a read-only volume).
pub fn container_devices(container: &Container, volumes: &BTreeMap<String, VolumePath>) -> Result<Vec<Device>, SpecError> {
    container
        .volume_devices
        .iter()
        .flatten()
        .map(|d| {
            let vol = volumes.get(&d.name).ok_or_else(|| SpecError::VolumeNotFound {
                volume: d.name.clone(),
                container: container.name.clone(),
            })?;
            Ok(Device {
                container_path: d.device_path.clone(),
                host_path: vol.host_path.to_string_lossy().into_owned(),
                permissions: if vol.read_only { "mr" } else { "mrw" }.into(),
            })
        })
        .collect()
}

/// The subPath's host path in the volume, checked to resolve inside the volume (a symlink in
/// the volume may not lead out of it). Missing directories are created as upstream's
/// SafeMakeDir does: one at a time, each with the volume root's mode (setgid and sticky
/// included, whatever the umask), so that a subPath of a group-writable fsGroup volume is
/// group-writable too; an existing component that resolves outside the volume stops it.
///
/// Deviation: upstream bind-mounts an opened file descriptor of the subPath so that the check
/// and the mount see the same inode; ferro checks the resolved path, which a container racing
/// a symlink swap could outrun.
fn sub_path_dir(volume: &Path, sub_path: &str) -> Result<PathBuf, SpecError> {
    use std::os::unix::fs::PermissionsExt;
    let invalid = |reason| SpecError::InvalidSubPath { sub_path: sub_path.into(), reason };
    if Path::new(sub_path).is_absolute() {
        return Err(SpecError::SubPathAbsolute(sub_path.into()));
    }
    if sub_path.split('/').any(|c| c == "..") {
        return Err(SpecError::SubPathBacksteps(sub_path.into()));
    }
    let provision = |source| SpecError::SubPathProvision {
        sub_path: sub_path.into(),
        volume_path: volume.to_path_buf(),
        source,
    };
    let root = volume.canonicalize().map_err(provision)?;
    let perm = std::fs::metadata(&root).map_err(provision)?.permissions().mode() & 0o7777;
    let mut host = volume.to_path_buf();
    for component in sub_path.split('/').filter(|c| !c.is_empty() && *c != ".") {
        host.push(component);
        match std::fs::symlink_metadata(&host) {
            Ok(_) => {
                if !host.canonicalize().map_err(provision)?.starts_with(&root) {
                    return Err(invalid("resolves outside of the volume"));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir(&host).map_err(provision)?;
                std::fs::set_permissions(&host, std::fs::Permissions::from_mode(perm)).map_err(provision)?;
            }
            Err(e) => return Err(provision(e)),
        }
    }
    Ok(volume.join(sub_path))
}

/// Upstream's ExpandContainerVolumeMounts: a subPathExpr with its `$(VAR)` references taken from
/// the container's environment `env` ([`resolve_env`]'s result), `$$` an escaped `$`. Unlike in
/// command and args, a reference to a variable that is unset or empty is an error naming every
/// such variable.
pub fn expand_sub_path_expr(expr: &str, env: &[KeyValue]) -> Result<String, SpecError> {
    let missing = std::cell::RefCell::new(std::collections::BTreeSet::new());
    let expanded = expand(expr, |n| {
        // The last definition wins, as in the runtime's environment.
        match env.iter().rev().find(|kv| kv.key == n).filter(|kv| !kv.value.is_empty()) {
            Some(kv) => Some(kv.value.clone()),
            None => {
                missing.borrow_mut().insert(n.to_string());
                None
            }
        }
    });
    let missing = missing.into_inner();
    if !missing.is_empty() {
        return Err(SpecError::SubPathExprMissing(missing.into_iter().collect::<Vec<_>>().join(", ")));
    }
    Ok(expanded)
}

/// The container's CRI mounts: its volumeMounts (by volume name from `volumes`), then the
/// managed /etc/hosts (`hosts_file`, unless the container mounts /etc/hosts itself) and the
/// termination message file (`termination_log`, at terminationMessagePath). As upstream, the
/// caller passes a hosts file only when the sandbox has IPs (or is on the host network). A
/// subPathExpr is expanded against `env` (see [`expand_sub_path_expr`]) and then is a subPath.
///
/// Side effect: a subPath missing in its volume is created as a directory.
pub fn container_mounts(
    container: &Container,
    volumes: &BTreeMap<String, VolumePath>,
    env: &[KeyValue],
    hosts_file: Option<&Path>,
    termination_log: Option<&Path>,
) -> Result<Vec<Mount>, SpecError> {
    let mut mounts = Vec::new();
    let mut mounts_etc_hosts = false;
    for vm in container.volume_mounts.iter().flatten() {
        let vol = volumes.get(&vm.name).ok_or_else(|| SpecError::VolumeNotFound {
            volume: vm.name.clone(),
            container: container.name.clone(),
        })?;
        let sub_path = match vm.sub_path_expr.as_deref().filter(|e| !e.is_empty()) {
            Some(expr) => expand_sub_path_expr(expr, env)?,
            None => vm.sub_path.clone().unwrap_or_default(),
        };
        let host = match sub_path.as_str() {
            "" => vol.host_path.clone(),
            sub => sub_path_dir(&vol.host_path, sub)?,
        };
        mounts_etc_hosts |= vm.mount_path == ETC_HOSTS;
        mounts.push(Mount {
            container_path: vm.mount_path.clone(),
            host_path: host.to_string_lossy().into_owned(),
            readonly: vm.read_only == Some(true) || vol.read_only,
            propagation: propagation(vm.mount_propagation.as_deref())? as i32,
            ..Default::default()
        });
    }
    if let Some(h) = hosts_file.filter(|_| !mounts_etc_hosts) {
        mounts.push(Mount {
            container_path: ETC_HOSTS.into(),
            host_path: h.to_string_lossy().into_owned(),
            ..Default::default()
        });
    }
    if let Some(t) = termination_log {
        let path = container
            .termination_message_path
            .clone()
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| DEFAULT_TERMINATION_MESSAGE_PATH.into());
        mounts.push(Mount {
            container_path: path,
            host_path: t.to_string_lossy().into_owned(),
            ..Default::default()
        });
    }
    Ok(mounts)
}

const HOSTS_HEADER: &str = "# Kubernetes-managed hosts file.\n";
const HOSTS_HEADER_HOST_NETWORK: &str = "# Kubernetes-managed hosts file (host network).\n";

fn host_alias_lines(pod: &Pod) -> String {
    let aliases = pod.spec.as_ref().and_then(|s| s.host_aliases.as_ref()).filter(|a| !a.is_empty());
    let Some(aliases) = aliases else {
        return String::new();
    };
    let mut out = String::from("\n# Entries added by HostAliases.\n");
    for a in aliases {
        out.push_str(&format!("{}\t{}\n", a.ip, a.hostnames.clone().unwrap_or_default().join("\t")));
    }
    out
}

/// The kubelet-managed /etc/hosts of a pod on the pod network: localhost and the IPv6 names,
/// one line per pod IP with the pod's hostname (and FQDN when the pod has a subdomain), then
/// the hostAliases. For host network pods see [`host_network_hosts_file`].
pub fn hosts_file(pod: &Pod, pod_ips: &[String], ctx: &NodeContext) -> String {
    let (hostname, domain) = hostname_and_domain(pod, ctx);
    let mut out = String::from(HOSTS_HEADER);
    out.push_str("127.0.0.1\tlocalhost\n");
    out.push_str("::1\tlocalhost ip6-localhost ip6-loopback\n");
    out.push_str("fe00::0\tip6-localnet\n");
    out.push_str("fe00::0\tip6-mcastprefix\n");
    out.push_str("fe00::1\tip6-allnodes\n");
    out.push_str("fe00::2\tip6-allrouters\n");
    for ip in pod_ips {
        match &domain {
            Some(d) => out.push_str(&format!("{ip}\t{hostname}.{d}\t{hostname}\n")),
            None => out.push_str(&format!("{ip}\t{hostname}\n")),
        }
    }
    out.push_str(&host_alias_lines(pod));
    out
}

/// The managed /etc/hosts of a host network pod: the node's /etc/hosts (`node_hosts`, read by
/// the caller) under a header, then the pod's hostAliases.
pub fn host_network_hosts_file(pod: &Pod, node_hosts: &str) -> String {
    format!("{HOSTS_HEADER_HOST_NETWORK}{node_hosts}{}", host_alias_lines(pod))
}

fn cpu_shares(milli: i64) -> i64 {
    if milli == 0 {
        return MIN_SHARES;
    }
    (milli.saturating_mul(1024) / 1000).clamp(MIN_SHARES, MAX_SHARES)
}

fn cpu_quota(milli: i64, period: i64) -> i64 {
    if milli == 0 {
        return 0;
    }
    (milli.saturating_mul(period) / 1000).max(MIN_QUOTA)
}

/// Upstream's IsNodeCriticalPod: system-node-critical with a critical priority.
fn node_critical(pod: &Pod) -> bool {
    let spec = pod.spec.as_ref();
    spec.and_then(|s| s.priority_class_name.as_deref()) == Some("system-node-critical")
        && spec.and_then(|s| s.priority).is_some_and(|p| p >= 2_000_000_000)
}

/// Upstream's GetContainerOOMScoreAdjust: Guaranteed (and node-critical) -997, BestEffort
/// 1000, Burstable 1000 - 1000*memoryRequest/memoryCapacity kept within [3, 999], so that it
/// stays above a Guaranteed container using all memory and below BestEffort.
fn oom_score_adj(pod: &Pod, container: &Container, memory_capacity: i64) -> Result<i64, SpecError> {
    if node_critical(pod) {
        return Ok(GUARANTEED_OOM_SCORE_ADJ);
    }
    match qos_class(pod) {
        QosClass::Guaranteed => return Ok(GUARANTEED_OOM_SCORE_ADJ),
        QosClass::BestEffort => return Ok(BESTEFFORT_OOM_SCORE_ADJ),
        QosClass::Burstable => {}
    }
    let request = request_or_limit(container.resources.as_ref(), "memory", 1)?.unwrap_or(0);
    let adj = if memory_capacity > 0 {
        let v = 1000 - (1000 * i128::from(request)) / i128::from(memory_capacity);
        i64::try_from(v).unwrap_or(i64::MIN)
    } else {
        BESTEFFORT_OOM_SCORE_ADJ
    };
    Ok(adj.clamp(1000 + GUARANTEED_OOM_SCORE_ADJ, BESTEFFORT_OOM_SCORE_ADJ - 1))
}

fn linux_resources(pod: &Pod, container: &Container, memory_capacity: i64) -> Result<LinuxContainerResources, SpecError> {
    let res = container.resources.as_ref();
    let req_cpu = container_quantity(res, false, "cpu", 1000)?.unwrap_or(0);
    let lim_cpu = container_quantity(res, true, "cpu", 1000)?.unwrap_or(0);
    // A request left out defaults to the limit.
    let shares = if req_cpu == 0 && lim_cpu != 0 { cpu_shares(lim_cpu) } else { cpu_shares(req_cpu) };
    Ok(LinuxContainerResources {
        cpu_period: CPU_PERIOD,
        cpu_quota: cpu_quota(lim_cpu, CPU_PERIOD),
        cpu_shares: shares,
        memory_limit_in_bytes: container_quantity(res, true, "memory", 1)?.unwrap_or(0),
        oom_score_adj: oom_score_adj(pod, container, memory_capacity)?,
        ..Default::default()
    })
}

fn seccomp(profile: Option<&SeccompProfile>, container: &str) -> Result<Option<SecurityProfile>, SpecError> {
    let t = match profile.map(|p| p.type_.as_str()) {
        None => return Ok(None),
        Some("RuntimeDefault") => ProfileType::RuntimeDefault,
        Some("Unconfined") => ProfileType::Unconfined,
        Some(_) => return Err(SpecError::LocalhostSeccomp(container.into())),
    };
    Ok(Some(SecurityProfile { profile_type: t as i32, localhost_ref: String::new() }))
}

/// The user an image runs as, from the runtime's ImageStatus, read as upstream's getImageUser
/// does: the uid when the runtime reports one, else the user name; an image that names neither
/// (or that the runtime does not report) runs as root, uid 0. The runtime parses the image's
/// `User` (containerd: a numeric user, also `1000:1000`, is a uid), so a name is taken as given
/// even when it looks numeric, as upstream does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageUser {
    Uid(i64),
    Name(String),
}

impl ImageUser {
    pub fn of(image: Option<&Image>) -> ImageUser {
        match image {
            Some(Image { uid: Some(uid), .. }) => ImageUser::Uid(uid.value),
            Some(i) if !i.username.is_empty() => ImageUser::Name(i.username.clone()),
            _ => ImageUser::Uid(0),
        }
    }
}

/// Upstream's verifyRunAsNonRoot: with runAsNonRoot, the effective runAsUser must not be 0; without
/// a runAsUser, the image's user must be a uid other than 0 (a user name cannot be verified).
fn verify_run_as_non_root(
    pod: &Pod,
    container: &Container,
    non_root: Option<bool>,
    run_as_user: Option<i64>,
    image: &ImageUser,
) -> Result<(), SpecError> {
    if non_root != Some(true) {
        return Ok(());
    }
    let (pod, container) = (pod_desc(pod), container.name.clone());
    match (run_as_user, image) {
        (Some(0), _) => Err(SpecError::RunAsNonRoot { pod, container }),
        (Some(_), _) => Ok(()),
        (None, ImageUser::Uid(0)) => Err(SpecError::ImageRunsAsRoot { pod, container }),
        (None, ImageUser::Name(user)) => Err(SpecError::ImageUserNotNumeric { user: user.clone(), pod, container }),
        (None, ImageUser::Uid(_)) => Ok(()),
    }
}

/// The pod's and the container's securityContext merged as upstream's
/// DetermineEffectiveSecurityContext (the container's user, group, runAsNonRoot and seccomp
/// profile win over the pod's), plus the namespaces and supplemental groups. runAsNonRoot is
/// verified against the effective runAsUser or else the image's user (`image`). As upstream's
/// determineEffectiveSecurityContext, a container without runAsUser gets the image's uid as
/// run_as_user, or its name as run_as_username, so that a runAsGroup applies to the image's user.
fn security_context(
    pod: &Pod,
    spec: &PodSpec,
    container: &Container,
    image: &ImageUser,
) -> Result<LinuxContainerSecurityContext, SpecError> {
    let psc = spec.security_context.as_ref();
    let csc = container.security_context.as_ref();
    let run_as_user = csc.and_then(|s| s.run_as_user).or(psc.and_then(|s| s.run_as_user));
    let run_as_group = csc.and_then(|s| s.run_as_group).or(psc.and_then(|s| s.run_as_group));
    let non_root = csc.and_then(|s| s.run_as_non_root).or(psc.and_then(|s| s.run_as_non_root));
    verify_run_as_non_root(pod, container, non_root, run_as_user, image)?;
    let (run_as_user, run_as_username) = match (run_as_user, image) {
        (Some(uid), _) => (Some(uid), String::new()),
        (None, ImageUser::Uid(uid)) => (Some(*uid), String::new()),
        (None, ImageUser::Name(name)) => (None, name.clone()),
    };
    let profile = csc
        .and_then(|s| s.seccomp_profile.as_ref())
        .or(psc.and_then(|s| s.seccomp_profile.as_ref()));
    Ok(LinuxContainerSecurityContext {
        capabilities: csc.and_then(|s| s.capabilities.as_ref()).map(|c| Capability {
            add_capabilities: c.add.clone().unwrap_or_default(),
            drop_capabilities: c.drop.clone().unwrap_or_default(),
            add_ambient_capabilities: Vec::new(),
        }),
        privileged: csc.and_then(|s| s.privileged) == Some(true),
        namespace_options: Some(namespace_options(spec)),
        run_as_user: run_as_user.map(|value| Int64Value { value }),
        run_as_username,
        run_as_group: run_as_group.map(|value| Int64Value { value }),
        readonly_rootfs: csc.and_then(|s| s.read_only_root_filesystem) == Some(true),
        supplemental_groups: supplemental_groups(spec),
        no_new_privs: csc.and_then(|s| s.allow_privilege_escalation) == Some(false),
        seccomp: seccomp(profile, &container.name)?,
        ..Default::default()
    })
}

/// The container's ContainerConfig. `env` is [`resolve_env`]'s result (command and args are
/// expanded against it), `mounts` [`container_mounts`]', `image_user` the user the container's
/// image runs as (from ImageStatus); `ctx` gives the node's memory for the oom_score_adj of
/// Burstable containers.
#[allow(clippy::too_many_arguments)]
pub fn container_config(
    pod: &Pod,
    container: &Container,
    kind: ContainerKind,
    attempt: u32,
    restart_count: u32,
    hash: u64,
    env: Vec<KeyValue>,
    mounts: Vec<Mount>,
    image_user: &ImageUser,
    ctx: &NodeContext,
) -> Result<ContainerConfig, SpecError> {
    let spec = spec_of(pod)?;
    let vars: HashMap<&str, &str> = env.iter().map(|kv| (kv.key.as_str(), kv.value.as_str())).collect();
    let expand_all = |items: Option<&Vec<String>>| -> Vec<String> {
        items
            .into_iter()
            .flatten()
            .map(|s| expand(s, |n| vars.get(n).map(|v| v.to_string())))
            .collect()
    };
    let command = expand_all(container.command.as_ref());
    let args = expand_all(container.args.as_ref());

    let labels = HashMap::from([
        (LABEL_POD_NAME.to_string(), name(pod).to_string()),
        (LABEL_POD_NAMESPACE.to_string(), namespace(pod).to_string()),
        (LABEL_POD_UID.to_string(), uid(pod).to_string()),
        (LABEL_CONTAINER_NAME.to_string(), container.name.clone()),
        (LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string()),
    ]);
    let termination_path = container
        .termination_message_path
        .clone()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| DEFAULT_TERMINATION_MESSAGE_PATH.into());
    let termination_policy = container
        .termination_message_policy
        .clone()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "File".into());
    let kind = match kind {
        ContainerKind::Init => "init",
        ContainerKind::App => "app",
    };
    let annotations = HashMap::from([
        (ANN_CONTAINER_HASH.to_string(), hash.to_string()),
        (ANN_RESTART_COUNT.to_string(), restart_count.to_string()),
        (ANN_TERMINATION_MESSAGE_PATH.to_string(), termination_path),
        (ANN_TERMINATION_MESSAGE_POLICY.to_string(), termination_policy),
        (ANN_TERMINATION_GRACE.to_string(), termination_grace(pod).to_string()),
        (ANN_CONTAINER_TYPE.to_string(), kind.to_string()),
    ]);
    let image = container.image.clone().unwrap_or_default();

    Ok(ContainerConfig {
        metadata: Some(ContainerMetadata { name: container.name.clone(), attempt }),
        image: Some(ImageSpec { image: image.clone(), user_specified_image: image, ..Default::default() }),
        command,
        args,
        working_dir: container.working_dir.clone().unwrap_or_default(),
        envs: env,
        mounts,
        labels,
        annotations,
        log_path: format!("{}/{restart_count}.log", container.name),
        stdin: container.stdin == Some(true),
        stdin_once: container.stdin_once == Some(true),
        tty: container.tty == Some(true),
        linux: Some(LinuxContainerConfig {
            resources: Some(linux_resources(pod, container, ctx.memory_capacity)?),
            security_context: Some(security_context(pod, spec, container, image_user)?),
        }),
        ..Default::default()
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod service_env_tests {
    use super::*;

    #[test]
    fn service_links_as_upstream() {
        let svc: k8s_openapi::api::core::v1::Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "my-db"},
            "spec": {"clusterIP": "10.96.0.7", "ports": [{"name": "sql", "port": 5432}, {"port": 53, "protocol": "UDP"}]}
        }))
        .unwrap();
        let headless: k8s_openapi::api::core::v1::Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "h"}, "spec": {"clusterIP": "None", "ports": [{"port": 1}]}
        }))
        .unwrap();
        let env = service_env(&[svc, headless]);
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("MY_DB_SERVICE_HOST"), Some("10.96.0.7"));
        assert_eq!(get("MY_DB_SERVICE_PORT"), Some("5432"));
        assert_eq!(get("MY_DB_SERVICE_PORT_SQL"), Some("5432"));
        assert_eq!(get("MY_DB_PORT"), Some("tcp://10.96.0.7:5432"));
        assert_eq!(get("MY_DB_PORT_53_UDP"), Some("udp://10.96.0.7:53"));
        assert_eq!(get("MY_DB_PORT_53_UDP_PROTO"), Some("udp"));
        assert_eq!(get("MY_DB_PORT_5432_TCP_ADDR"), Some("10.96.0.7"));
        assert!(env.iter().all(|(k, _)| !k.starts_with("H_")), "headless services get no variables");
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    use serde_json::json;

    const UID: &str = "1234-abcd";

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "ns1", "uid": UID,
                "labels": {"app": "web"}, "annotations": {"note": "x"}},
            "spec": spec,
        }))
        .unwrap()
    }

    fn ctx() -> NodeContext {
        NodeContext {
            node_name: "node-a".into(),
            host_ips: vec!["10.0.0.5".into(), "fd00::5".into()],
            cluster_dns: vec!["10.96.0.10".into()],
            cluster_domain: "cluster.local".into(),
            cgroup_driver: CgroupDriver::Cgroupfs,
            pod_log_root: PathBuf::from("/var/log/pods"),
            allocatable_cpu_milli: 4000,
            allocatable_memory: 8 << 30,
            memory_capacity: 10_000_000_000,
        }
    }

    fn first(p: &Pod) -> Container {
        p.spec.as_ref().unwrap().containers[0].clone()
    }

    fn objects() -> Objects {
        let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "cm"},
            "data": {"A": "cm-a", "B": "cm-b", "bad=key": "x"}}))
        .unwrap();
        let s: Secret = serde_json::from_value(json!({"metadata": {"name": "s"},
            "data": {"PW": "c2VjcmV0", "B": "c2VjLWI="}}))
        .unwrap();
        Objects {
            config_maps: BTreeMap::from([("cm".to_string(), cm)]),
            secrets: BTreeMap::from([("s".to_string(), s)]),
            service_account_token: None,
            services: Vec::new(),
        }
    }

    fn env_of(p: &Pod) -> Result<Vec<(String, String)>, SpecError> {
        let ips = vec!["10.1.0.7".to_string(), "fd01::7".to_string()];
        resolve_env(p, &first(p), &objects(), &ips, &ctx())
            .map(|v| v.into_iter().map(|kv| (kv.key, kv.value)).collect())
    }

    fn env_pod(env: serde_json::Value) -> Pod {
        pod(json!({"nodeName": "node-a", "serviceAccountName": "sa",
            "containers": [{"name": "c", "env": env}]}))
    }

    fn one_env(var: serde_json::Value) -> Result<String, SpecError> {
        let name = var["name"].as_str().unwrap().to_string();
        let env = env_of(&env_pod(json!([var])))?;
        Ok(env.into_iter().find(|(k, _)| *k == name).map(|(_, v)| v).unwrap_or_else(|| "<unset>".into()))
    }

    fn field(path: &str) -> String {
        one_env(json!({"name": "V", "valueFrom": {"fieldRef": {"fieldPath": path}}})).unwrap()
    }

    // --- cgroup parent, log dir ---

    #[test]
    fn cgroup_parents_for_every_qos_and_driver() {
        let g = pod(json!({"containers": [{"name": "c", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]}));
        let b = pod(json!({"containers": [{"name": "c", "resources": {"requests": {"cpu": "100m"}}}]}));
        let be = pod(json!({"containers": [{"name": "c"}]}));
        assert_eq!(cgroup_parent(&g, CgroupDriver::Cgroupfs), "/kubepods/pod1234-abcd");
        assert_eq!(cgroup_parent(&b, CgroupDriver::Cgroupfs), "/kubepods/burstable/pod1234-abcd");
        assert_eq!(cgroup_parent(&be, CgroupDriver::Cgroupfs), "/kubepods/besteffort/pod1234-abcd");
        assert_eq!(cgroup_parent(&g, CgroupDriver::Systemd), "kubepods-pod1234_abcd.slice");
        assert_eq!(cgroup_parent(&b, CgroupDriver::Systemd), "kubepods-burstable-pod1234_abcd.slice");
        assert_eq!(cgroup_parent(&be, CgroupDriver::Systemd), "kubepods-besteffort-pod1234_abcd.slice");
    }

    #[test]
    fn log_dir() {
        let p = pod(json!({"containers": [{"name": "c"}]}));
        assert_eq!(pod_log_dir(&p, &ctx()), PathBuf::from("/var/log/pods/ns1_web_1234-abcd"));
    }

    // --- sandbox ---

    #[test]
    fn sandbox_metadata_labels_annotations_and_linux() {
        let p = pod(json!({"terminationGracePeriodSeconds": 45,
            "securityContext": {"runAsUser": 1000, "runAsGroup": 2000, "fsGroup": 3000,
                "supplementalGroups": [4000], "sysctls": [{"name": "net.core.somaxconn", "value": "1024"}]},
            "containers": [{"name": "c"}]}));
        let mut c = ctx();
        c.cgroup_driver = CgroupDriver::Systemd;
        let s = sandbox_config(&p, 2, &c).unwrap();
        let m = s.metadata.unwrap();
        assert_eq!((m.name.as_str(), m.namespace.as_str(), m.uid.as_str(), m.attempt), ("web", "ns1", UID, 2));
        assert_eq!(s.hostname, "web");
        assert_eq!(s.log_directory, "/var/log/pods/ns1_web_1234-abcd");
        assert_eq!(s.labels["app"], "web");
        assert_eq!(s.labels[LABEL_POD_NAME], "web");
        assert_eq!(s.labels[LABEL_POD_NAMESPACE], "ns1");
        assert_eq!(s.labels[LABEL_POD_UID], UID);
        assert_eq!(s.labels[LABEL_MANAGED_BY], MANAGED_BY);
        assert_eq!(s.annotations["note"], "x");
        assert_eq!(s.annotations[ANN_TERMINATION_GRACE], "45");
        let l = s.linux.unwrap();
        assert_eq!(l.cgroup_parent, "kubepods-besteffort-pod1234_abcd.slice");
        assert_eq!(l.sysctls["net.core.somaxconn"], "1024");
        let sc = l.security_context.unwrap();
        assert_eq!(sc.run_as_user, Some(Int64Value { value: 1000 }));
        assert_eq!(sc.run_as_group, Some(Int64Value { value: 2000 }));
        assert_eq!(sc.supplemental_groups, vec![3000, 4000]);
        assert!(!sc.privileged);
        assert!(!sc.readonly_rootfs);
        assert_eq!(sc.seccomp.unwrap().profile_type, ProfileType::RuntimeDefault as i32);
        let ns = sc.namespace_options.unwrap();
        assert_eq!(ns.network, NamespaceMode::Pod as i32);
        assert_eq!(ns.pid, NamespaceMode::Container as i32);
        assert_eq!(ns.ipc, NamespaceMode::Pod as i32);
    }

    #[test]
    fn sandbox_default_grace_and_privileged_when_any_container_is() {
        let p = pod(json!({"initContainers": [{"name": "i", "securityContext": {"privileged": true}}],
            "containers": [{"name": "c"}]}));
        let s = sandbox_config(&p, 0, &ctx()).unwrap();
        assert_eq!(s.annotations[ANN_TERMINATION_GRACE], "30");
        assert!(s.linux.unwrap().security_context.unwrap().privileged);
    }

    #[test]
    fn sandbox_host_namespaces() {
        let p = pod(json!({"hostNetwork": true, "hostPID": true, "hostIPC": true, "hostname": "h",
            "containers": [{"name": "c"}]}));
        let s = sandbox_config(&p, 0, &ctx()).unwrap();
        assert_eq!(s.hostname, "", "host network keeps the node's hostname");
        let ns = s.linux.unwrap().security_context.unwrap().namespace_options.unwrap();
        assert_eq!(ns.network, NamespaceMode::Node as i32);
        assert_eq!(ns.pid, NamespaceMode::Node as i32);
        assert_eq!(ns.ipc, NamespaceMode::Node as i32);
        let shared = pod(json!({"shareProcessNamespace": true, "containers": [{"name": "c"}]}));
        let s = sandbox_config(&shared, 0, &ctx()).unwrap();
        assert_eq!(s.linux.unwrap().security_context.unwrap().namespace_options.unwrap().pid, NamespaceMode::Pod as i32);
    }

    #[test]
    fn hostnames() {
        let p = pod(json!({"hostname": "custom", "containers": [{"name": "c"}]}));
        assert_eq!(sandbox_config(&p, 0, &ctx()).unwrap().hostname, "custom");
        // Cut to 63 characters, without a trailing '-' or '.'.
        let long = format!("{}-{}", "a".repeat(62), "b".repeat(10));
        let p = pod(json!({"hostname": long, "containers": [{"name": "c"}]}));
        assert_eq!(sandbox_config(&p, 0, &ctx()).unwrap().hostname, "a".repeat(62));
        let p = pod(json!({"hostname": "h", "subdomain": "sub", "setHostnameAsFQDN": true, "containers": [{"name": "c"}]}));
        assert_eq!(sandbox_config(&p, 0, &ctx()).unwrap().hostname, "h.sub.ns1.svc.cluster.local");
        let p = pod(json!({"hostname": "h".repeat(50), "subdomain": "sub", "setHostnameAsFQDN": true,
            "containers": [{"name": "c"}]}));
        let err = sandbox_config(&p, 0, &ctx()).unwrap_err();
        assert!(matches!(err, SpecError::FqdnTooLong(_, 76)), "{err}");
        // Without setHostnameAsFQDN the subdomain does not change the hostname.
        let p = pod(json!({"hostname": "h", "subdomain": "sub", "containers": [{"name": "c"}]}));
        assert_eq!(sandbox_config(&p, 0, &ctx()).unwrap().hostname, "h");
    }

    fn dns(spec: serde_json::Value, c: &NodeContext) -> Option<DnsConfig> {
        sandbox_config(&pod(spec), 0, c).unwrap().dns_config
    }

    #[test]
    fn dns_cluster_first() {
        let d = dns(json!({"containers": [{"name": "c"}]}), &ctx()).unwrap();
        assert_eq!(d.servers, ["10.96.0.10"]);
        assert_eq!(d.searches, ["ns1.svc.cluster.local", "svc.cluster.local", "cluster.local"]);
        assert_eq!(d.options, ["ndots:5"]);
        let explicit = dns(json!({"dnsPolicy": "ClusterFirst", "containers": [{"name": "c"}]}), &ctx());
        assert_eq!(explicit, Some(d));
    }

    #[test]
    fn dns_cluster_first_without_cluster_dns_falls_back_to_default() {
        let mut c = ctx();
        c.cluster_dns.clear();
        assert_eq!(dns(json!({"containers": [{"name": "c"}]}), &c), None);
    }

    #[test]
    fn dns_default_and_host_network() {
        assert_eq!(dns(json!({"dnsPolicy": "Default", "containers": [{"name": "c"}]}), &ctx()), None);
        // ClusterFirst on the host network falls back to Default...
        assert_eq!(dns(json!({"hostNetwork": true, "containers": [{"name": "c"}]}), &ctx()), None);
        // ...unless the pod asks for ClusterFirstWithHostNet.
        let d = dns(json!({"hostNetwork": true, "dnsPolicy": "ClusterFirstWithHostNet",
            "containers": [{"name": "c"}]}), &ctx())
        .unwrap();
        assert_eq!(d.servers, ["10.96.0.10"]);
        let d = dns(json!({"dnsPolicy": "ClusterFirstWithHostNet", "containers": [{"name": "c"}]}), &ctx()).unwrap();
        assert_eq!(d.options, ["ndots:5"]);
    }

    #[test]
    fn dns_none_uses_dns_config_only() {
        let d = dns(json!({"dnsPolicy": "None", "dnsConfig": {"nameservers": ["1.1.1.1"], "searches": ["a.example"],
            "options": [{"name": "ndots", "value": "2"}, {"name": "edns0"}]}, "containers": [{"name": "c"}]}), &ctx())
        .unwrap();
        assert_eq!(d.servers, ["1.1.1.1"]);
        assert_eq!(d.searches, ["a.example"]);
        assert_eq!(d.options, ["ndots:2", "edns0"]);
    }

    #[test]
    fn dns_config_merged_into_cluster_first() {
        let d = dns(json!({"dnsConfig": {"nameservers": ["1.1.1.1", "10.96.0.10"],
            "searches": ["svc.cluster.local", "b.example"],
            "options": [{"name": "ndots", "value": "1"}, {"name": "timeout", "value": "3"}]},
            "containers": [{"name": "c"}]}), &ctx())
        .unwrap();
        assert_eq!(d.servers, ["10.96.0.10", "1.1.1.1"]);
        assert_eq!(d.searches, ["ns1.svc.cluster.local", "svc.cluster.local", "cluster.local", "b.example"]);
        assert_eq!(d.options, ["ndots:1", "timeout:3"]);
    }

    #[test]
    fn dns_limits() {
        let searches: Vec<String> = (0..40).map(|i| format!("s{i}.example")).collect();
        let d = dns(json!({"dnsPolicy": "None", "dnsConfig": {"nameservers": ["1.1.1.1", "2.2.2.2", "3.3.3.3", "4.4.4.4"],
            "searches": searches}, "containers": [{"name": "c"}]}), &ctx())
        .unwrap();
        assert_eq!(d.servers.len(), 3);
        assert_eq!(d.searches.len(), 32);
    }

    #[test]
    fn port_mappings_only_with_host_port() {
        let p = pod(json!({"containers": [
            {"name": "a", "ports": [{"containerPort": 80, "hostPort": 8080},
                {"containerPort": 53, "hostPort": 5353, "protocol": "UDP", "hostIP": "10.0.0.5"},
                {"containerPort": 9000}]},
            {"name": "b", "ports": [{"containerPort": 7, "hostPort": 7, "protocol": "SCTP"}]}]}));
        let pm = sandbox_config(&p, 0, &ctx()).unwrap().port_mappings;
        assert_eq!(pm, vec![
            PortMapping { protocol: Protocol::Tcp as i32, container_port: 80, host_port: 8080, host_ip: String::new() },
            PortMapping { protocol: Protocol::Udp as i32, container_port: 53, host_port: 5353, host_ip: "10.0.0.5".into() },
            PortMapping { protocol: Protocol::Sctp as i32, container_port: 7, host_port: 7, host_ip: String::new() },
        ]);
    }

    #[test]
    fn sandbox_without_spec_is_an_error() {
        let p: Pod = serde_json::from_value(json!({"metadata": {"name": "x"}})).unwrap();
        assert!(matches!(sandbox_config(&p, 0, &ctx()), Err(SpecError::NoSpec)));
    }

    // --- expansion ---

    #[test]
    fn expansion() {
        let vars = |n: &str| match n {
            "A" => Some("a".to_string()),
            "EMPTY" => Some(String::new()),
            _ => None,
        };
        assert_eq!(expand("x$(A)y", vars), "xay");
        assert_eq!(expand("$(A)$(A)", vars), "aa");
        assert_eq!(expand("$(EMPTY)|", vars), "|");
        assert_eq!(expand("$(MISSING)", vars), "$(MISSING)");
        assert_eq!(expand("$$(A)", vars), "$(A)");
        assert_eq!(expand("$$$(A)", vars), "$a");
        assert_eq!(expand("$$", vars), "$");
        assert_eq!(expand("a$", vars), "a$");
        assert_eq!(expand("$(A", vars), "$(A");
        assert_eq!(expand("$A", vars), "$A");
        assert_eq!(expand("$é$(A)", vars), "$éa");
        assert_eq!(expand("no refs", vars), "no refs");
    }

    // --- env ---

    #[test]
    fn env_values_expand_against_earlier_vars() {
        let env = env_of(&env_pod(json!([
            {"name": "A", "value": "1"},
            {"name": "B", "value": "$(A)-$(C)"},
            {"name": "C", "value": "3"},
            {"name": "D", "value": "$$(A)"},
            {"name": "E"},
        ])))
        .unwrap();
        assert_eq!(env, vec![
            ("A".to_string(), "1".to_string()),
            ("B".into(), "1-$(C)".into()),
            ("C".into(), "3".into()),
            ("D".into(), "$(A)".into()),
            ("E".into(), String::new()),
        ]);
    }

    #[test]
    fn env_field_refs() {
        assert_eq!(field("metadata.name"), "web");
        assert_eq!(field("metadata.namespace"), "ns1");
        assert_eq!(field("metadata.uid"), UID);
        assert_eq!(field("metadata.labels['app']"), "web");
        assert_eq!(field("metadata.labels['nope']"), "");
        assert_eq!(field("metadata.annotations['note']"), "x");
        assert_eq!(field("metadata.labels"), "app=\"web\"");
        assert_eq!(field("spec.nodeName"), "node-a");
        assert_eq!(field("spec.serviceAccountName"), "sa");
        assert_eq!(field("status.podIP"), "10.1.0.7");
        assert_eq!(field("status.podIPs"), "10.1.0.7,fd01::7");
        assert_eq!(field("status.hostIP"), "10.0.0.5");
        assert_eq!(field("status.hostIPs"), "10.0.0.5,fd00::5");
        let err = one_env(json!({"name": "V", "valueFrom": {"fieldRef": {"fieldPath": "spec.bogus"}}})).unwrap_err();
        assert_eq!(err.to_string(), "unsupported fieldPath: spec.bogus");
        let err = one_env(json!({"name": "V", "valueFrom": {"fieldRef": {"apiVersion": "v2", "fieldPath": "metadata.name"}}}))
            .unwrap_err();
        assert!(matches!(err, SpecError::UnsupportedApiVersion(_)));
    }

    #[test]
    fn pod_ips_follow_the_node_family() {
        let p = env_pod(json!([{"name": "V", "valueFrom": {"fieldRef": {"fieldPath": "status.podIPs"}}}]));
        let mut c = ctx();
        c.host_ips = vec!["fd00::5".into()];
        let ips = vec!["10.1.0.7".to_string(), "fd01::7".to_string()];
        let env = resolve_env(&p, &first(&p), &objects(), &ips, &c).unwrap();
        assert_eq!(env[0].value, "fd01::7,10.1.0.7");
        // A host network pod without sandbox IPs has the node's.
        let p = pod(json!({"hostNetwork": true, "containers": [{"name": "c",
            "env": [{"name": "V", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]}]}));
        let env = resolve_env(&p, &first(&p), &objects(), &[], &ctx()).unwrap();
        assert_eq!(env[0].value, "10.0.0.5");
    }

    fn resource_env(resources: serde_json::Value, resource: &str, divisor: Option<&str>) -> String {
        let mut sel = json!({"resource": resource});
        if let Some(d) = divisor {
            sel["divisor"] = json!(d);
        }
        let p = pod(json!({"containers": [{"name": "c", "resources": resources,
            "env": [{"name": "V", "valueFrom": {"resourceFieldRef": sel}}]}]}));
        let env = resolve_env(&p, &first(&p), &objects(), &[], &ctx()).unwrap();
        env[0].value.clone()
    }

    #[test]
    fn env_resource_field_refs() {
        let r = json!({"requests": {"cpu": "250m", "memory": "64Mi"}, "limits": {"cpu": "1500m", "memory": "128Mi"}});
        assert_eq!(resource_env(r.clone(), "limits.cpu", None), "2", "rounded up to whole cores");
        assert_eq!(resource_env(r.clone(), "limits.cpu", Some("1m")), "1500");
        assert_eq!(resource_env(r.clone(), "requests.cpu", Some("1m")), "250");
        assert_eq!(resource_env(r.clone(), "requests.cpu", None), "1");
        assert_eq!(resource_env(r.clone(), "limits.memory", None), "134217728");
        assert_eq!(resource_env(r.clone(), "limits.memory", Some("1Mi")), "128");
        assert_eq!(resource_env(r.clone(), "requests.memory", Some("1M")), "68");
        assert_eq!(resource_env(r, "requests.memory", Some("0")), "67108864", "zero divisor means 1");
        // Without limits: the node's allocatable.
        assert_eq!(resource_env(json!({}), "limits.cpu", Some("1m")), "4000");
        assert_eq!(resource_env(json!({}), "limits.memory", None), (8i64 << 30).to_string());
        assert_eq!(resource_env(json!({}), "requests.cpu", None), "0");
        // A request left out defaults to the limit.
        assert_eq!(resource_env(json!({"limits": {"memory": "1Gi"}}), "requests.memory", Some("1Gi")), "1");
        let p = pod(json!({"containers": [{"name": "c",
            "env": [{"name": "V", "valueFrom": {"resourceFieldRef": {"resource": "limits.gpu"}}}]}]}));
        let err = resolve_env(&p, &first(&p), &objects(), &[], &ctx()).unwrap_err();
        assert!(matches!(err, SpecError::UnsupportedResource(_)));
    }

    #[test]
    fn env_config_map_and_secret_keys() {
        let v = one_env(json!({"name": "V", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "A"}}})).unwrap();
        assert_eq!(v, "cm-a");
        let v = one_env(json!({"name": "V", "valueFrom": {"secretKeyRef": {"name": "s", "key": "PW"}}})).unwrap();
        assert_eq!(v, "secret");
    }

    #[test]
    fn env_missing_objects_and_keys() {
        let err = |var| one_env(var).unwrap_err().to_string();
        assert_eq!(
            err(json!({"name": "V", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "FOO"}}})),
            "couldn't find key FOO in ConfigMap ns1/cm"
        );
        assert_eq!(
            err(json!({"name": "V", "valueFrom": {"configMapKeyRef": {"name": "other", "key": "A"}}})),
            "configmap \"other\" not found"
        );
        assert_eq!(
            err(json!({"name": "V", "valueFrom": {"secretKeyRef": {"name": "s", "key": "FOO"}}})),
            "couldn't find key FOO in Secret ns1/s"
        );
        assert_eq!(
            err(json!({"name": "V", "valueFrom": {"secretKeyRef": {"name": "other", "key": "A"}}})),
            "secret \"other\" not found"
        );
        // Optional references leave the variable out.
        for var in [
            json!({"name": "V", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "FOO", "optional": true}}}),
            json!({"name": "V", "valueFrom": {"configMapKeyRef": {"name": "other", "key": "A", "optional": true}}}),
            json!({"name": "V", "valueFrom": {"secretKeyRef": {"name": "s", "key": "FOO", "optional": true}}}),
            json!({"name": "V", "valueFrom": {"secretKeyRef": {"name": "other", "key": "A", "optional": true}}}),
        ] {
            assert_eq!(one_env(var).unwrap(), "<unset>");
        }
    }

    #[test]
    fn env_from_with_prefix_invalid_keys_and_overrides() {
        let p = pod(json!({"containers": [{"name": "c",
            "envFrom": [{"configMapRef": {"name": "cm"}}, {"secretRef": {"name": "s"}, "prefix": "S_"},
                {"configMapRef": {"name": "gone", "optional": true}}, {"secretRef": {"name": "gone2", "optional": true}}],
            "env": [{"name": "A", "value": "env-a"}, {"name": "X", "value": "$(S_PW)"}]}]}));
        let env: Vec<(String, String)> = resolve_env(&p, &first(&p), &objects(), &[], &ctx())
            .unwrap()
            .into_iter()
            .map(|kv| (kv.key, kv.value))
            .collect();
        assert_eq!(env, vec![
            ("B".to_string(), "cm-b".to_string()),
            ("S_B".into(), "sec-b".into()),
            ("S_PW".into(), "secret".into()),
            ("A".into(), "env-a".into()),
            ("X".into(), "secret".into()),
        ]);
    }

    #[test]
    fn env_from_missing_sources() {
        let p = pod(json!({"containers": [{"name": "c", "envFrom": [{"configMapRef": {"name": "gone"}}]}]}));
        let err = resolve_env(&p, &first(&p), &objects(), &[], &ctx()).unwrap_err();
        assert_eq!(err.to_string(), "configmap \"gone\" not found");
        let p = pod(json!({"containers": [{"name": "c", "envFrom": [{"secretRef": {"name": "gone"}}]}]}));
        let err = resolve_env(&p, &first(&p), &objects(), &[], &ctx()).unwrap_err();
        assert_eq!(err.to_string(), "secret \"gone\" not found");
    }

    #[test]
    fn env_names() {
        assert!(valid_env_name("my.env-name"));
        assert!(valid_env_name("1abc"));
        assert!(!valid_env_name("a=b"));
        assert!(!valid_env_name(""));
        assert!(!valid_env_name("tab\there"));
    }

    // --- quantities ---

    #[test]
    fn exact_quantities() {
        assert_eq!(k8s_semantics::quantity::scaled("100m", 1000), Some(100));
        assert_eq!(k8s_semantics::quantity::scaled("0.3", 1000), Some(300));
        assert_eq!(k8s_semantics::quantity::scaled("1.5", 1), Some(2));
        assert_eq!(k8s_semantics::quantity::scaled("1Gi", 1), Some(1 << 30));
        assert_eq!(k8s_semantics::quantity::scaled("1e3", 1), Some(1000));
        assert_eq!(k8s_semantics::quantity::scaled("1.1k", 1), Some(1100));
        assert_eq!(k8s_semantics::quantity::scaled("1n", 1000), Some(1));
        assert_eq!(k8s_semantics::quantity::scaled("x", 1), None);
        assert_eq!(k8s_semantics::quantity::scaled("1.2.3", 1), None);
    }

    // --- mounts ---

    fn vols(dir: &Path) -> BTreeMap<String, VolumePath> {
        BTreeMap::from([
            ("data".to_string(), VolumePath { host_path: dir.join("data"), read_only: false }),
            ("conf".to_string(), VolumePath { host_path: dir.join("conf"), read_only: true }),
        ])
    }

    fn container(v: serde_json::Value) -> Container {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn mounts_from_volumes_hosts_and_termination_log() {
        let dir = tempfile::tempdir().unwrap();
        let c = container(json!({"name": "c", "volumeMounts": [
            {"name": "data", "mountPath": "/data"},
            {"name": "data", "mountPath": "/ro", "readOnly": true, "mountPropagation": "HostToContainer"},
            {"name": "conf", "mountPath": "/conf", "mountPropagation": "Bidirectional"}]}));
        let hosts = dir.path().join("etc-hosts");
        let term = dir.path().join("term");
        let m = container_mounts(&c, &vols(dir.path()), &[], Some(&hosts), Some(&term)).unwrap();
        let data = dir.path().join("data").to_string_lossy().into_owned();
        assert_eq!(m.len(), 5);
        assert_eq!((m[0].container_path.as_str(), m[0].host_path.as_str(), m[0].readonly), ("/data", data.as_str(), false));
        assert_eq!(m[0].propagation, MountPropagation::PropagationPrivate as i32);
        assert!(m[1].readonly);
        assert_eq!(m[1].propagation, MountPropagation::PropagationHostToContainer as i32);
        assert!(m[2].readonly, "a read-only volume forces the mount read-only");
        assert_eq!(m[2].propagation, MountPropagation::PropagationBidirectional as i32);
        assert_eq!(m[3].container_path, "/etc/hosts");
        assert_eq!(m[3].host_path, hosts.to_string_lossy());
        assert_eq!(m[4].container_path, "/dev/termination-log");
        assert_eq!(m[4].host_path, term.to_string_lossy());
        assert!(!dir.path().join("data").exists(), "no I/O without a subPath");
    }

    #[test]
    fn own_etc_hosts_and_custom_termination_path() {
        let dir = tempfile::tempdir().unwrap();
        let c = container(json!({"name": "c", "terminationMessagePath": "/tmp/msg",
            "volumeMounts": [{"name": "data", "mountPath": "/etc/hosts"}]}));
        let hosts = dir.path().join("etc-hosts");
        let term = dir.path().join("term");
        let m = container_mounts(&c, &vols(dir.path()), &[], Some(&hosts), Some(&term)).unwrap();
        let paths: Vec<&str> = m.iter().map(|m| m.container_path.as_str()).collect();
        assert_eq!(paths, ["/etc/hosts", "/tmp/msg"]);
        assert_eq!(m[0].host_path, dir.path().join("data").to_string_lossy());
        let none = container_mounts(&container(json!({"name": "c"})), &vols(dir.path()), &[], None, None).unwrap();
        assert!(none.is_empty());
    }

    #[test]
    fn mount_errors() {
        let dir = tempfile::tempdir().unwrap();
        let c = container(json!({"name": "c", "volumeMounts": [{"name": "nope", "mountPath": "/x"}]}));
        let err = container_mounts(&c, &vols(dir.path()), &[], None, None).unwrap_err();
        assert_eq!(err.to_string(), "cannot find volume \"nope\" to mount into container \"c\"");
        let c = container(json!({"name": "c", "volumeMounts": [{"name": "data", "mountPath": "/x", "mountPropagation": "Sideways"}]}));
        assert!(matches!(container_mounts(&c, &vols(dir.path()), &[], None, None), Err(SpecError::InvalidPropagation(_))));
    }

    #[test]
    fn sub_paths() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("data")).unwrap();
        let c = container(json!({"name": "c", "volumeMounts": [{"name": "data", "mountPath": "/x", "subPath": "a/b"}]}));
        let m = container_mounts(&c, &vols(dir.path()), &[], None, None).unwrap();
        let want = dir.path().join("data/a/b");
        assert_eq!(m[0].host_path, want.to_string_lossy());
        assert!(want.is_dir(), "a missing subPath is created");
        // With the volume root's mode, setgid included, whatever the umask.
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        std::fs::set_permissions(dir.path().join("data"), std::fs::Permissions::from_mode(0o2777)).unwrap();
        let c2 = container(json!({"name": "c", "volumeMounts": [{"name": "data", "mountPath": "/x", "subPath": "g/h"}]}));
        container_mounts(&c2, &vols(dir.path()), &[], None, None).unwrap();
        assert_eq!((mode(&dir.path().join("data/g")), mode(&dir.path().join("data/g/h"))), (0o2777, 0o2777));
        // Existing again: no error.
        container_mounts(&c, &vols(dir.path()), &[], None, None).unwrap();

        for bad in ["../x", "a/../../x", ".."] {
            let c = container(json!({"name": "c", "volumeMounts": [{"name": "data", "mountPath": "/x", "subPath": bad}]}));
            let err = container_mounts(&c, &vols(dir.path()), &[], None, None).unwrap_err();
            assert_eq!(err.to_string(), format!("unable to provision SubPath `{bad}`: must not contain '..'"));
        }
        let c = container(json!({"name": "c", "volumeMounts": [{"name": "data", "mountPath": "/x", "subPath": "/abs"}]}));
        let err = container_mounts(&c, &vols(dir.path()), &[], None, None).unwrap_err();
        assert_eq!(err.to_string(), "error SubPath `/abs` must not be an absolute path");
        assert!(!dir.path().join("x").exists());

        // A symlink out of the volume is refused.
        std::os::unix::fs::symlink(dir.path(), dir.path().join("data/escape")).unwrap();
        let c = container(json!({"name": "c", "volumeMounts": [{"name": "data", "mountPath": "/x", "subPath": "escape"}]}));
        let err = container_mounts(&c, &vols(dir.path()), &[], None, None).unwrap_err();
        assert!(err.to_string().contains("outside of the volume"), "{err}");
    }

    #[test]
    fn sub_path_expr_expansion() {
        let kv = |k: &str, v: &str| KeyValue { key: k.into(), value: v.into() };
        let env = [kv("POD_NAME", "web-0"), kv("NS", "ns1"), kv("EMPTY", ""), kv("DUP", "old"), kv("DUP", "new")];
        assert_eq!(expand_sub_path_expr("$(POD_NAME)", &env).unwrap(), "web-0");
        assert_eq!(expand_sub_path_expr("logs/$(NS)/$(POD_NAME).d", &env).unwrap(), "logs/ns1/web-0.d");
        assert_eq!(expand_sub_path_expr("$$(POD_NAME)", &env).unwrap(), "$(POD_NAME)", "$$ escapes");
        assert_eq!(expand_sub_path_expr("a$b", &env).unwrap(), "a$b");
        assert_eq!(expand_sub_path_expr("$(DUP)", &env).unwrap(), "new", "the last definition wins");
        assert_eq!(expand_sub_path_expr("plain", &env).unwrap(), "plain");
        // Unset or empty variables are an error naming each one, sorted.
        let err = expand_sub_path_expr("$(ZED)/$(EMPTY)/$(POD_NAME)/$(ZED)", &env).unwrap_err();
        assert_eq!(err.to_string(), "missing value for EMPTY, ZED");
    }

    #[test]
    fn sub_path_expr_mounts() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("data")).unwrap();
        let env = [KeyValue { key: "POD_NAME".into(), value: "web-0".into() }, KeyValue { key: "UP".into(), value: "..".into() },
            KeyValue { key: "ABS".into(), value: "/etc".into() }];
        let mount = |expr: &str| container(json!({"name": "c", "volumeMounts": [
            {"name": "data", "mountPath": "/x", "subPathExpr": expr}, {"name": "data", "mountPath": "/all"}]}));
        let m = container_mounts(&mount("logs/$(POD_NAME)"), &vols(dir.path()), &env, None, None).unwrap();
        let want = dir.path().join("data/logs/web-0");
        assert_eq!(m[0].host_path, want.to_string_lossy());
        assert!(want.is_dir(), "the expanded subPath is created");
        assert_eq!(m[1].host_path, dir.path().join("data").to_string_lossy(), "the whole volume elsewhere");
        // After expansion, the subPath rules.
        let err = container_mounts(&mount("$(UP)/x"), &vols(dir.path()), &env, None, None).unwrap_err();
        assert_eq!(err.to_string(), "unable to provision SubPath `../x`: must not contain '..'");
        let err = container_mounts(&mount("$(ABS)"), &vols(dir.path()), &env, None, None).unwrap_err();
        assert_eq!(err.to_string(), "error SubPath `/etc` must not be an absolute path");
        let err = container_mounts(&mount("$(NOPE)"), &vols(dir.path()), &env, None, None).unwrap_err();
        assert_eq!(err.to_string(), "missing value for NOPE");
        assert!(!dir.path().join("data/$(NOPE)").exists());
        // subPathExpr takes precedence over a subPath (the API allows only one of them).
        let c = container(json!({"name": "c", "volumeMounts": [
            {"name": "data", "mountPath": "/x", "subPath": "other", "subPathExpr": "$(POD_NAME)"}]}));
        let m = container_mounts(&c, &vols(dir.path()), &env, None, None).unwrap();
        assert_eq!(m[0].host_path, dir.path().join("data/web-0").to_string_lossy());
    }

    // --- hosts file ---

    const LOCAL: &str = "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n\
        ::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\n\
        fe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n";

    #[test]
    fn hosts_file_plain() {
        let p = pod(json!({"containers": [{"name": "c"}]}));
        let ips = ["10.1.0.7".to_string(), "fd01::7".to_string()];
        assert_eq!(hosts_file(&p, &ips, &ctx()), format!("{LOCAL}10.1.0.7\tweb\nfd01::7\tweb\n"));
    }

    #[test]
    fn hosts_file_with_subdomain_and_aliases() {
        let p = pod(json!({"hostname": "h", "subdomain": "sub", "containers": [{"name": "c"}],
            "hostAliases": [{"ip": "1.2.3.4", "hostnames": ["foo", "bar"]}, {"ip": "5.6.7.8", "hostnames": ["baz"]}]}));
        assert_eq!(
            hosts_file(&p, &["10.1.0.7".to_string()], &ctx()),
            format!("{LOCAL}10.1.0.7\th.sub.ns1.svc.cluster.local\th\n\n# Entries added by HostAliases.\n1.2.3.4\tfoo\tbar\n5.6.7.8\tbaz\n")
        );
    }

    #[test]
    fn hosts_file_host_network() {
        let p = pod(json!({"hostNetwork": true, "containers": [{"name": "c"}],
            "hostAliases": [{"ip": "1.2.3.4", "hostnames": ["foo"]}]}));
        assert_eq!(
            host_network_hosts_file(&p, "127.0.0.1 localhost\n"),
            "# Kubernetes-managed hosts file (host network).\n127.0.0.1 localhost\n\n# Entries added by HostAliases.\n1.2.3.4\tfoo\n"
        );
    }

    // --- container config ---

    fn config(p: &Pod, env: Vec<KeyValue>) -> Result<ContainerConfig, SpecError> {
        config_with(p, env, &ctx())
    }

    fn config_with(p: &Pod, env: Vec<KeyValue>, c: &NodeContext) -> Result<ContainerConfig, SpecError> {
        container_config_as(p, env, &ImageUser::Uid(0), c)
    }

    /// `image`: the image's user (busybox's, root, in most tests).
    fn container_config_as(p: &Pod, env: Vec<KeyValue>, image: &ImageUser, c: &NodeContext) -> Result<ContainerConfig, SpecError> {
        container_config(p, &first(p), ContainerKind::App, 1, 3, 42, env, Vec::new(), image, c)
    }

    fn resources(p: &Pod) -> LinuxContainerResources {
        config(p, Vec::new()).unwrap().linux.unwrap().resources.unwrap()
    }

    #[test]
    fn container_config_basics() {
        let p = pod(json!({"terminationGracePeriodSeconds": 10, "containers": [{"name": "app", "image": "nginx:1",
            "command": ["/bin/sh", "-c", "echo $(A) $$(A) $(B)"], "args": ["$(A)"], "workingDir": "/w",
            "stdin": true, "stdinOnce": true, "tty": true, "terminationMessagePolicy": "FallbackToLogsOnError"}]}));
        let env = vec![KeyValue { key: "A".into(), value: "1".into() }];
        let mount = Mount { container_path: "/data".into(), host_path: "/h".into(), ..Default::default() };
        let c = container_config(&p, &first(&p), ContainerKind::Init, 2, 5, 0xdead_beef, env.clone(), vec![mount.clone()], &ImageUser::Uid(0), &ctx())
            .unwrap();
        assert_eq!(c.metadata, Some(ContainerMetadata { name: "app".into(), attempt: 2 }));
        assert_eq!(c.image.as_ref().unwrap().image, "nginx:1");
        assert_eq!(c.command, ["/bin/sh", "-c", "echo 1 $(A) $(B)"]);
        assert_eq!(c.args, ["1"]);
        assert_eq!(c.working_dir, "/w");
        assert_eq!(c.envs, env);
        assert_eq!(c.mounts, vec![mount]);
        assert_eq!(c.log_path, "app/5.log");
        assert!(c.stdin && c.stdin_once && c.tty);
        assert_eq!(c.labels[LABEL_POD_NAME], "web");
        assert_eq!(c.labels[LABEL_POD_NAMESPACE], "ns1");
        assert_eq!(c.labels[LABEL_POD_UID], UID);
        assert_eq!(c.labels[LABEL_CONTAINER_NAME], "app");
        assert_eq!(c.labels[LABEL_MANAGED_BY], MANAGED_BY);
        assert_eq!(c.annotations[ANN_CONTAINER_HASH], "3735928559");
        assert_eq!(c.annotations[ANN_RESTART_COUNT], "5");
        assert_eq!(c.annotations[ANN_TERMINATION_MESSAGE_PATH], "/dev/termination-log");
        assert_eq!(c.annotations[ANN_TERMINATION_MESSAGE_POLICY], "FallbackToLogsOnError");
        assert_eq!(c.annotations[ANN_TERMINATION_GRACE], "10");
        assert_eq!(c.annotations[ANN_CONTAINER_TYPE], "init");
        let app = config(&p, Vec::new()).unwrap();
        assert_eq!(app.annotations[ANN_CONTAINER_TYPE], "app");
        assert_eq!(app.command, ["/bin/sh", "-c", "echo $(A) $(A) $(B)"]);
    }

    #[test]
    fn guaranteed_resources() {
        let p = pod(json!({"containers": [{"name": "c", "resources": {"limits": {"cpu": "500m", "memory": "256Mi"}}}]}));
        let r = resources(&p);
        assert_eq!(r.cpu_shares, 512, "limit stands in for a missing request");
        assert_eq!(r.cpu_period, 100_000);
        assert_eq!(r.cpu_quota, 50_000);
        assert_eq!(r.memory_limit_in_bytes, 256 << 20);
        assert_eq!(r.oom_score_adj, -997);
    }

    #[test]
    fn best_effort_resources() {
        let r = resources(&pod(json!({"containers": [{"name": "c"}]})));
        assert_eq!((r.cpu_shares, r.cpu_quota, r.memory_limit_in_bytes, r.oom_score_adj), (2, 0, 0, 1000));
        assert_eq!(r.cpu_period, 100_000);
    }

    #[test]
    fn burstable_resources_and_oom_score() {
        let p = pod(json!({"containers": [{"name": "c", "resources": {"requests": {"cpu": "1m", "memory": "2500000000"}}}]}));
        let r = resources(&p);
        assert_eq!(r.cpu_shares, 2, "minimum shares");
        assert_eq!(r.cpu_quota, 0);
        assert_eq!(r.oom_score_adj, 750);
        // A tiny cpu limit still gets the minimum quota.
        let p = pod(json!({"containers": [{"name": "c", "resources": {"requests": {"cpu": "1m"}, "limits": {"cpu": "5m"}}}]}));
        assert_eq!(resources(&p).cpu_quota, 1000);
        // Requests near the whole node stay above Guaranteed...
        let p = pod(json!({"containers": [{"name": "c", "resources": {"requests": {"memory": "10G"}}}]}));
        assert_eq!(resources(&p).oom_score_adj, 3);
        // ...and none at all stays below BestEffort.
        let p = pod(json!({"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}));
        let r = resources(&p);
        assert_eq!(r.oom_score_adj, 999);
        assert_eq!(r.cpu_shares, 1024);
        // Node-critical pods are protected like Guaranteed ones.
        let p = pod(json!({"priorityClassName": "system-node-critical", "priority": 2_000_001_000,
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}));
        assert_eq!(resources(&p).oom_score_adj, -997);
        // Without a known capacity a Burstable container counts as nearly BestEffort.
        let mut c = ctx();
        c.memory_capacity = 0;
        let p = pod(json!({"containers": [{"name": "c", "resources": {"requests": {"memory": "1Gi"}}}]}));
        assert_eq!(config_with(&p, Vec::new(), &c).unwrap().linux.unwrap().resources.unwrap().oom_score_adj, 999);
    }

    #[test]
    fn invalid_quantity_is_an_error() {
        let p = pod(json!({"containers": [{"name": "c", "resources": {"limits": {"cpu": "lots"}}}]}));
        assert!(matches!(config(&p, Vec::new()), Err(SpecError::InvalidQuantity { .. })));
    }

    fn sec(p: &Pod) -> LinuxContainerSecurityContext {
        config(p, Vec::new()).unwrap().linux.unwrap().security_context.unwrap()
    }

    #[test]
    fn security_context_merge() {
        let p = pod(json!({"securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "runAsNonRoot": true,
                "fsGroup": 2000, "supplementalGroups": [3000], "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "c", "securityContext": {"runAsUser": 1001, "privileged": false,
                "readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false,
                "capabilities": {"add": ["NET_ADMIN"], "drop": ["ALL"]}}}]}));
        let s = sec(&p);
        assert_eq!(s.run_as_user, Some(Int64Value { value: 1001 }), "the container's user wins");
        assert_eq!(s.run_as_group, Some(Int64Value { value: 1000 }), "the pod's group applies");
        assert_eq!(s.supplemental_groups, vec![2000, 3000]);
        assert!(s.readonly_rootfs);
        assert!(s.no_new_privs);
        assert!(!s.privileged);
        let caps = s.capabilities.unwrap();
        assert_eq!(caps.add_capabilities, ["NET_ADMIN"]);
        assert_eq!(caps.drop_capabilities, ["ALL"]);
        assert_eq!(s.seccomp.unwrap().profile_type, ProfileType::RuntimeDefault as i32);
        assert!(s.masked_paths.is_empty() && s.readonly_paths.is_empty(), "left to the runtime");
        let ns = s.namespace_options.unwrap();
        assert_eq!((ns.network, ns.pid, ns.ipc), (NamespaceMode::Pod as i32, NamespaceMode::Container as i32, NamespaceMode::Pod as i32));
    }

    #[test]
    fn security_context_defaults() {
        let s = sec(&pod(json!({"containers": [{"name": "c"}]})));
        assert_eq!(s.run_as_user, Some(Int64Value { value: 0 }), "the image's user (root)");
        assert_eq!(s.run_as_username, "");
        assert_eq!(s.capabilities, None);
        assert_eq!(s.seccomp, None);
        assert!(!s.no_new_privs && !s.privileged && !s.readonly_rootfs);
        let s = sec(&pod(json!({"containers": [{"name": "c", "securityContext": {"allowPrivilegeEscalation": true,
            "privileged": true, "seccompProfile": {"type": "Unconfined"}}}]})));
        assert!(!s.no_new_privs);
        assert!(s.privileged);
        assert_eq!(s.seccomp.unwrap().profile_type, ProfileType::Unconfined as i32);
        let p = pod(json!({"containers": [{"name": "c", "securityContext": {"seccompProfile": {"type": "Localhost",
            "localhostProfile": "x.json"}}}]}));
        assert!(matches!(config(&p, Vec::new()), Err(SpecError::LocalhostSeccomp(_))));
        let s = sec(&pod(json!({"hostNetwork": true, "hostPID": true, "containers": [{"name": "c"}]})));
        let ns = s.namespace_options.unwrap();
        assert_eq!((ns.network, ns.pid, ns.ipc), (NamespaceMode::Node as i32, NamespaceMode::Node as i32, NamespaceMode::Pod as i32));
    }

    #[test]
    fn image_user_from_image_status() {
        let img = |uid: Option<i64>, name: &str| Image {
            uid: uid.map(|value| Int64Value { value }),
            username: name.into(),
            ..Default::default()
        };
        assert_eq!(ImageUser::of(Some(&img(Some(1000), ""))), ImageUser::Uid(1000));
        assert_eq!(ImageUser::of(Some(&img(Some(0), ""))), ImageUser::Uid(0));
        assert_eq!(ImageUser::of(Some(&img(None, "nobody"))), ImageUser::Name("nobody".into()));
        assert_eq!(ImageUser::of(Some(&img(Some(7), "nobody"))), ImageUser::Uid(7), "the uid wins");
        assert_eq!(ImageUser::of(Some(&img(None, ""))), ImageUser::Uid(0), "no user: root");
        assert_eq!(ImageUser::of(None), ImageUser::Uid(0), "unknown image: root");
    }

    #[test]
    fn run_as_non_root() {
        const WHO: &str = "(pod: \"web_ns1(1234-abcd)\", container: c)";
        let breaks = format!("container's runAsUser breaks non-root policy {WHO}");
        let root = format!("container has runAsNonRoot and image will run as root {WHO}");
        let named = |u: &str| format!("container has runAsNonRoot and image has non-numeric user ({u}), cannot verify user is non-root {WHO}");
        let uid = |u: i64| ImageUser::Uid(u);
        let name = |n: &str| ImageUser::Name(n.into());
        // (pod securityContext, container securityContext, image user, Err(message) or Ok(run_as_user, run_as_username))
        type Case = (serde_json::Value, serde_json::Value, ImageUser, Result<(Option<i64>, &'static str), String>);
        let cases: Vec<Case> = vec![
            // runAsUser decides when set, whatever the image.
            (json!({"runAsNonRoot": true}), json!({"runAsUser": 0}), uid(1000), Err(breaks.clone())),
            (json!({"runAsNonRoot": true, "runAsUser": 5}), json!({}), uid(0), Ok((Some(5), ""))),
            (json!({"runAsNonRoot": true, "runAsUser": 5}), json!({}), name("nobody"), Ok((Some(5), ""))),
            // Without runAsUser, the image's user.
            (json!({"runAsNonRoot": true}), json!({}), uid(0), Err(root.clone())),
            (json!({"runAsNonRoot": true}), json!({}), uid(1000), Ok((Some(1000), ""))),
            (json!({"runAsNonRoot": true}), json!({}), name("nobody"), Err(named("nobody"))),
            // A name is never parsed (the runtime reports numeric users as uids).
            (json!({"runAsNonRoot": true}), json!({}), name("1000"), Err(named("1000"))),
            (json!({"runAsNonRoot": true}), json!({}), ImageUser::of(None), Err(root.clone())),
            // Pod and container levels: the container's fields win, each on its own.
            (json!({"runAsNonRoot": true, "runAsUser": 0}), json!({"runAsNonRoot": false}), uid(0), Ok((Some(0), ""))),
            (json!({"runAsNonRoot": true, "runAsUser": 0}), json!({"runAsUser": 1000}), uid(0), Ok((Some(1000), ""))),
            (json!({"runAsUser": 1000}), json!({"runAsNonRoot": true}), uid(0), Ok((Some(1000), ""))),
            (json!({"runAsUser": 1000}), json!({"runAsNonRoot": true, "runAsUser": 0}), uid(5), Err(breaks.clone())),
            (json!({"runAsNonRoot": false}), json!({"runAsNonRoot": true}), uid(0), Err(root.clone())),
            (json!({"runAsNonRoot": true}), json!({"runAsNonRoot": false}), uid(0), Ok((Some(0), ""))),
            // Without runAsNonRoot nothing is verified; the image's user is passed on.
            (json!({}), json!({}), name("nobody"), Ok((None, "nobody"))),
            (json!({}), json!({}), uid(0), Ok((Some(0), ""))),
        ];
        for (psc, csc, image, want) in cases {
            let p = pod(json!({"securityContext": psc, "containers": [{"name": "c", "securityContext": csc}]}));
            let got = container_config_as(&p, Vec::new(), &image, &ctx()).map(|c| {
                let s = c.linux.unwrap().security_context.unwrap();
                (s.run_as_user.map(|u| u.value), s.run_as_username)
            });
            match (&got, &want) {
                (Ok((u, n)), Ok((wu, wn))) => assert_eq!((u, n.as_str()), (wu, *wn), "{psc} {csc} {image:?}"),
                (Err(e), Err(w)) => assert_eq!(&e.to_string(), w, "{psc} {csc} {image:?}"),
                _ => panic!("{psc} {csc} {image:?}: got {got:?}, want {want:?}"),
            }
        }
        // runAsGroup without runAsUser applies to the image's user.
        let p = pod(json!({"securityContext": {"runAsGroup": 3000}, "containers": [{"name": "c"}]}));
        let s = container_config_as(&p, Vec::new(), &uid(1000), &ctx()).unwrap().linux.unwrap().security_context.unwrap();
        assert_eq!((s.run_as_user, s.run_as_group), (Some(Int64Value { value: 1000 }), Some(Int64Value { value: 3000 })));
    }
}
