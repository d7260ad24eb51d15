//! The CRI configs the agent creates for a pod: the PodSandboxConfig, and for each container its
//! environment, mounts, the managed /etc/hosts and the ContainerConfig. Pure, with one named
//! exception: [`container_mounts`] creates a missing subPath directory inside its volume (as
//! upstream does before handing the mount to the runtime).
//!
//! The rules follow the upstream kubelet (kuberuntime's generatePodSandboxConfig and
//! generateContainerConfig, makeEnvironmentVariables, the dns configurer, makeMounts and the
//! managed hosts file); where ferro deviates, the item says so.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use k8s_cri::v1::security_profile::ProfileType;
use k8s_cri::v1::{
    Capability, ContainerConfig, ContainerMetadata, DnsConfig, ImageSpec, Int64Value, KeyValue,
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
    #[error("unable to provision subPath `{sub_path}` in {volume_path}")]
    SubPathProvision {
        sub_path: String,
        volume_path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("subPathExpr is not supported (volume mount {0:?})")]
    SubPathExprUnsupported(String),
    #[error("invalid mountPropagation {0:?}")]
    InvalidPropagation(String),
    #[error("container's runAsUser breaks non-root policy (pod: \"{pod}\", container: {container})")]
    RunAsNonRoot { pod: String, container: String },
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

    let ips = sorted_pod_ips(pod, pod_ips, ctx);
    for var in container.env.iter().flatten() {
        let value = match (var.value.as_deref(), var.value_from.as_ref()) {
            (Some(v), _) if !v.is_empty() => expand(v, |n| env.get(n)),
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

    Ok(env.0.into_iter().map(|(key, value)| KeyValue { key, value }).collect())
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

fn ceil_div(n: i128, d: i128) -> i128 {
    if d == 0 {
        return 0;
    }
    let q = n / d;
    if (n % d != 0) && ((n < 0) == (d < 0)) {
        q + 1
    } else {
        q
    }
}

/// A quantity times `scale`, rounded up, exactly (no floating point): scale 1 gives upstream's
/// Quantity.Value(), 1000 its MilliValue().
fn quantity_scaled(s: &str, scale: i128) -> Option<i128> {
    let s = s.trim();
    let (neg, s) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let end = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (num, suffix) = s.split_at(end);
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if (int.is_empty() && frac.is_empty()) || frac.contains('.') {
        return None;
    }
    let mantissa: i128 = format!("{int}{frac}").parse().ok()?;
    let (pow10, pow2): (i32, u32) = match suffix {
        "" => (0, 0),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        _ => {
            let e: i32 = suffix.strip_prefix(['e', 'E'])?.parse().ok()?;
            if e.abs() > 30 {
                return None;
            }
            (e, 0)
        }
    };
    let frac_digits = u32::try_from(frac.len()).ok()?;
    let mut den = 10i128.checked_pow(frac_digits)?;
    let mut mul = scale.checked_mul(1i128 << pow2)?;
    if pow10 >= 0 {
        mul = mul.checked_mul(10i128.checked_pow(pow10.unsigned_abs())?)?;
    } else {
        den = den.checked_mul(10i128.checked_pow(pow10.unsigned_abs())?)?;
    }
    let n = mantissa.checked_mul(mul)?;
    Some(if neg { -(n / den) } else { ceil_div(n, den) })
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
    quantity_scaled(&q.0, scale)
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

/// Upstream's ExtractContainerResourceValue with defaultPodLimitsForDownwardAPI: the value
/// divided by the divisor, rounded up; limits.cpu/limits.memory default to the node's
/// allocatable.
fn resource_value(container: &Container, resource: &str, divisor: Option<&str>, ctx: &NodeContext) -> Result<String, SpecError> {
    let res = container.resources.as_ref();
    let (limits, name) = match resource.split_once('.') {
        Some(("limits", n)) => (true, n),
        Some(("requests", n)) => (false, n),
        _ => return Err(SpecError::UnsupportedResource(resource.into())),
    };
    let known = matches!(name, "cpu" | "memory" | "ephemeral-storage") || name.starts_with("hugepages-");
    if !known {
        return Err(SpecError::UnsupportedResource(resource.into()));
    }
    let scale = if name == "cpu" { 1000 } else { 1 };
    let divisor = divisor.filter(|d| quantity_scaled(d, 1000).is_some_and(|v| v != 0)).unwrap_or("1");
    let div = quantity_scaled(divisor, scale)
        .filter(|v| *v != 0)
        .ok_or_else(|| SpecError::InvalidQuantity { field: "divisor".into(), quantity: divisor.into() })?;
    let value = if limits {
        match (container_quantity(res, true, name, scale)?, name) {
            (Some(v), _) => v,
            (None, "cpu") => ctx.allocatable_cpu_milli,
            (None, "memory") => ctx.allocatable_memory,
            (None, "ephemeral-storage") => return Err(SpecError::UnknownNodeValue("allocatable ephemeral-storage")),
            (None, _) => 0,
        }
    } else {
        request_or_limit(res, name, scale)?.unwrap_or(0)
    };
    Ok(ceil_div(i128::from(value), div).to_string())
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

/// The subPath's host directory in the volume, created when missing, and checked to resolve
/// inside the volume (a symlink in the volume may not lead out of it).
///
/// Deviation: upstream bind-mounts an opened file descriptor of the subPath so that the check
/// and the mount see the same inode; ferro checks the resolved path, which a container racing
/// a symlink swap could outrun.
fn sub_path_dir(volume: &Path, sub_path: &str) -> Result<PathBuf, SpecError> {
    let invalid = |reason| SpecError::InvalidSubPath { sub_path: sub_path.into(), reason };
    if Path::new(sub_path).is_absolute() {
        return Err(invalid("must not be an absolute path"));
    }
    if sub_path.split('/').any(|c| c == "..") {
        return Err(invalid("must not contain '..'"));
    }
    let provision = |source| SpecError::SubPathProvision {
        sub_path: sub_path.into(),
        volume_path: volume.to_path_buf(),
        source,
    };
    let host = volume.join(sub_path);
    if std::fs::symlink_metadata(&host).is_err() {
        std::fs::create_dir_all(&host).map_err(provision)?;
    }
    let root = volume.canonicalize().map_err(provision)?;
    let resolved = host.canonicalize().map_err(provision)?;
    if !resolved.starts_with(&root) {
        return Err(invalid("resolves outside of the volume"));
    }
    Ok(host)
}

/// The container's CRI mounts: its volumeMounts (by volume name from `volumes`), then the
/// managed /etc/hosts (`hosts_file`, unless the container mounts /etc/hosts itself) and the
/// termination message file (`termination_log`, at terminationMessagePath).
///
/// Side effect: a subPath missing in its volume is created as a directory.
pub fn container_mounts(
    container: &Container,
    volumes: &BTreeMap<String, VolumePath>,
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
        if vm.sub_path_expr.as_deref().is_some_and(|e| !e.is_empty()) {
            return Err(SpecError::SubPathExprUnsupported(vm.mount_path.clone()));
        }
        let host = match vm.sub_path.as_deref().filter(|s| !s.is_empty()) {
            Some(sub) => sub_path_dir(&vol.host_path, sub)?,
            None => vol.host_path.clone(),
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

/// The pod's and the container's securityContext merged as upstream's
/// DetermineEffectiveSecurityContext (the container's user, group, runAsNonRoot and seccomp
/// profile win over the pod's), plus the namespaces and supplemental groups.
///
/// Deviation: runAsNonRoot is checked against runAsUser only; upstream also refuses an image
/// whose configured user is root or not numeric, which needs the image's config.
fn security_context(pod: &Pod, spec: &PodSpec, container: &Container) -> Result<LinuxContainerSecurityContext, SpecError> {
    let psc = spec.security_context.as_ref();
    let csc = container.security_context.as_ref();
    let run_as_user = csc.and_then(|s| s.run_as_user).or(psc.and_then(|s| s.run_as_user));
    let run_as_group = csc.and_then(|s| s.run_as_group).or(psc.and_then(|s| s.run_as_group));
    let non_root = csc.and_then(|s| s.run_as_non_root).or(psc.and_then(|s| s.run_as_non_root));
    if non_root == Some(true) && run_as_user == Some(0) {
        return Err(SpecError::RunAsNonRoot { pod: pod_desc(pod), container: container.name.clone() });
    }
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
        run_as_group: run_as_group.map(|value| Int64Value { value }),
        readonly_rootfs: csc.and_then(|s| s.read_only_root_filesystem) == Some(true),
        supplemental_groups: supplemental_groups(spec),
        no_new_privs: csc.and_then(|s| s.allow_privilege_escalation) == Some(false),
        seccomp: seccomp(profile, &container.name)?,
        ..Default::default()
    })
}

/// The container's ContainerConfig. `env` is [`resolve_env`]'s result (command and args are
/// expanded against it), `mounts` [`container_mounts`]'; `ctx` gives the node's memory for the
/// oom_score_adj of Burstable containers.
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
            security_context: Some(security_context(pod, spec, container)?),
        }),
        ..Default::default()
    })
}
