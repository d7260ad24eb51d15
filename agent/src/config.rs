//! Flags and the KubeletConfiguration file, resolved into one validated [`AgentConfig`].
//!
//! As upstream, a flag given on the command line overrides the same setting in `--config`.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use serde::Deserialize;

/// Command-line flags, named as the upstream kubelet's.
#[derive(Parser, Debug, Clone)]
#[command(name = "ferro-agent", version, about = "ferro-agent: the ferro node agent (a kubelet)")]
pub struct Flags {
    /// Kubeconfig with the node's credentials. Without it the agent runs standalone.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig with a bootstrap token: when --kubeconfig is missing or its client
    /// certificate expired, the agent asks the control plane for a certificate with it (a
    /// CertificateSigningRequest) and writes --kubeconfig (kubelet's TLS bootstrap).
    #[arg(long, requires = "kubeconfig")]
    pub bootstrap_kubeconfig: Option<PathBuf>,
    /// Where the client certificate got by the bootstrap is kept (default: <root-dir>/pki).
    #[arg(long)]
    pub cert_dir: Option<PathBuf>,
    /// Renew the client certificate before it expires (rotateCertificates; default true):
    /// at 70-90 % of its validity, with a CertificateSigningRequest made with the current one.
    /// `--rotate-certificates=false` turns it off.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", require_equals = true)]
    pub rotate_certificates: Option<bool>,
    /// ferro-specific (no upstream flag), meant for tests: also rotate as soon as less than this
    /// Go duration of validity is left, even before the 70-90 % point (default 0s: off).
    #[arg(long, default_value = "0s")]
    pub rotate_certificates_before: String,
    /// API servers to use in turn with the kubeconfig's credentials, comma-separated (several
    /// ferro-control-plane replicas without a load balancer; default: the kubeconfig's server).
    /// When one cannot be reached the next requests go to the next (ferro_runtime::apiclient).
    #[arg(long, env = "FERRO_API_SERVERS", value_delimiter = ',')]
    pub api_servers: Vec<String>,
    /// Node name to use instead of the host name.
    #[arg(long)]
    pub hostname_override: Option<String>,
    /// The node's InternalIP; by default the first non-loopback IPv4 address of the host.
    #[arg(long)]
    pub node_ip: Option<IpAddr>,
    /// Directory for the agent's state.
    #[arg(long, default_value = "/var/lib/ferro/agent")]
    pub root_dir: PathBuf,
    /// The CRI endpoint (unix socket).
    #[arg(long, default_value = "unix:///run/containerd/containerd.sock")]
    pub container_runtime_endpoint: String,
    /// Directory of static pod manifests (overrides staticPodPath of --config).
    #[arg(long)]
    pub pod_manifest_path: Option<PathBuf>,
    /// A KubeletConfiguration file (kubelet.config.k8s.io/v1beta1).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// How pod cgroups are named: cgroupfs or systemd (must match the runtime's setting).
    #[arg(long)]
    pub cgroup_driver: Option<String>,
    /// The cgroup under which the pod cgroups (kubepods) are made; "/" by default.
    #[arg(long)]
    pub cgroup_root: Option<String>,
    /// Serving certificate of the :10250 server (self-signed under <root-dir>/pki when unset).
    #[arg(long)]
    pub tls_cert_file: Option<PathBuf>,
    #[arg(long)]
    pub tls_private_key_file: Option<PathBuf>,
    /// CA whose client certificates the :10250 server accepts (default: the kubeconfig's CA).
    #[arg(long)]
    pub client_ca_file: Option<PathBuf>,
    /// ferro-specific (no upstream flag): how often image garbage collection runs, a Go
    /// duration (upstream's fixed ImageGCPeriod is 5m).
    #[arg(long, default_value = "1m")]
    pub image_gc_period: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("parsing {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
    #[error("invalid duration {value:?} for {field}: {reason}")]
    Duration { field: &'static str, value: String, reason: String },
    #[error("invalid {field} {value:?}: {reason}")]
    Value { field: &'static str, value: String, reason: String },
    #[error("invalid container runtime endpoint {0:?}: only unix:// endpoints are supported")]
    Endpoint(String),
}

/// The fields of KubeletConfiguration that ferro supports; any other field is an error.
#[derive(Deserialize, Debug, Default, Clone, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubeletConfiguration {
    pub api_version: Option<String>,
    pub kind: Option<String>,
    pub node_lease_duration_seconds: Option<i32>,
    pub node_status_update_frequency: Option<String>,
    pub node_status_report_frequency: Option<String>,
    pub max_pods: Option<i64>,
    pub cgroup_driver: Option<String>,
    pub cgroup_root: Option<String>,
    pub pod_logs_dir: Option<PathBuf>,
    pub tls_cert_file: Option<PathBuf>,
    pub tls_private_key_file: Option<PathBuf>,
    pub authentication: Option<Authentication>,
    pub authorization: Option<Authorization>,
    pub eviction_hard: Option<std::collections::BTreeMap<String, String>>,
    pub eviction_soft: Option<std::collections::BTreeMap<String, String>>,
    pub eviction_soft_grace_period: Option<std::collections::BTreeMap<String, String>>,
    pub eviction_pressure_transition_period: Option<String>,
    pub eviction_max_pod_grace_period: Option<i64>,
    pub volume_stats_agg_period: Option<String>,
    pub static_pod_path: Option<PathBuf>,
    #[serde(rename = "podCIDR")]
    pub pod_cidr: Option<String>,
    #[serde(rename = "clusterDNS")]
    pub cluster_dns: Option<Vec<String>>,
    pub cluster_domain: Option<String>,
    pub register_node: Option<bool>,
    pub rotate_certificates: Option<bool>,
    pub address: Option<String>,
    pub port: Option<u16>,
    #[serde(rename = "imageGCHighThresholdPercent")]
    pub image_gc_high_threshold_percent: Option<i32>,
    #[serde(rename = "imageGCLowThresholdPercent")]
    pub image_gc_low_threshold_percent: Option<i32>,
    #[serde(rename = "imageMinimumGCAge")]
    pub image_minimum_gc_age: Option<String>,
    #[serde(rename = "imageMaximumGCAge")]
    pub image_maximum_gc_age: Option<String>,
    pub config_map_and_secret_change_detection_strategy: Option<String>,
    pub enforce_node_allocatable: Option<Vec<String>>,
}

/// `authentication` of KubeletConfiguration: the x509 client CA.
#[derive(Deserialize, Debug, Default, Clone, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Authentication {
    pub x509: Option<X509Authentication>,
}

/// `authorization` of KubeletConfiguration: the mode and the webhook's cache.
#[derive(Deserialize, Debug, Default, Clone, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Authorization {
    pub mode: Option<String>,
    pub webhook: Option<AuthorizationWebhook>,
}

#[derive(Deserialize, Debug, Default, Clone, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AuthorizationWebhook {
    #[serde(rename = "cacheAuthorizedTTL")]
    pub cache_authorized_ttl: Option<String>,
    #[serde(rename = "cacheUnauthorizedTTL")]
    pub cache_unauthorized_ttl: Option<String>,
}

#[derive(Deserialize, Debug, Default, Clone, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct X509Authentication {
    #[serde(rename = "clientCAFile")]
    pub client_ca_file: Option<PathBuf>,
}

pub const API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
pub const KIND: &str = "KubeletConfiguration";

impl KubeletConfiguration {
    /// Parses the YAML text of a KubeletConfiguration; `path` names it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let c: KubeletConfiguration = serde_yaml::from_str(text)
            .map_err(|e| ConfigError::Parse { path: path.to_path_buf(), message: e.to_string() })?;
        let invalid = |message: String| ConfigError::Invalid { path: path.to_path_buf(), message };
        if c.api_version.as_deref() != Some(API_VERSION) {
            return Err(invalid(format!("apiVersion must be {API_VERSION}, got {:?}", c.api_version)));
        }
        if c.kind.as_deref() != Some(KIND) {
            return Err(invalid(format!("kind must be {KIND}, got {:?}", c.kind)));
        }
        Ok(c)
    }

    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
        Self::parse(&text, path)
    }
}

/// The resolved configuration the agent runs with.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentConfig {
    pub kubeconfig: Option<PathBuf>,
    pub bootstrap_kubeconfig: Option<PathBuf>,
    pub cert_dir: PathBuf,
    /// rotateCertificates / `--rotate-certificates` (default true).
    pub rotate_certificates: bool,
    /// `--rotate-certificates-before` (ferro-specific, for tests; zero: off).
    pub rotate_certificates_before: Duration,
    /// `--api-servers`, as given (parsed when the client is built).
    pub api_servers: Vec<String>,
    pub hostname_override: Option<String>,
    pub node_ip: Option<IpAddr>,
    pub root_dir: PathBuf,
    /// Filesystem path of the runtime's unix socket.
    pub runtime_socket: PathBuf,
    pub static_pod_path: Option<PathBuf>,
    pub node_lease_duration_seconds: i32,
    pub node_status_update_frequency: Duration,
    pub node_status_report_frequency: Duration,
    pub max_pods: i64,
    pub cgroup_driver: String,
    /// Prefix of the pod cgroups ("" for the root).
    pub cgroup_root: String,
    /// Where container logs go (/var/log/pods).
    pub pod_logs_dir: PathBuf,
    pub tls_cert_file: Option<PathBuf>,
    pub tls_private_key_file: Option<PathBuf>,
    pub client_ca_file: Option<PathBuf>,
    /// Node-pressure eviction: evictionHard (upstream's defaults when unset; a configured map
    /// replaces them entirely), evictionSoft with evictionSoftGracePeriod,
    /// evictionPressureTransitionPeriod (5m), evictionMaxPodGracePeriod.
    pub eviction: crate::eviction::plan::Config,
    /// volumeStatsAggPeriod (1m): how often the volumes' stats are collected for the metrics.
    pub volume_stats_agg_period: Duration,
    pub pod_cidr: Option<String>,
    pub cluster_dns: Vec<String>,
    pub cluster_domain: Option<String>,
    pub register_node: bool,
    pub address: String,
    pub port: u16,
    /// imageGCHighThresholdPercent (100 disables image GC).
    pub image_gc_high_threshold_percent: u8,
    pub image_gc_low_threshold_percent: u8,
    pub image_minimum_gc_age: Duration,
    /// imageMaximumGCAge: unused longer than this, an image is removed whatever the disk
    /// usage (0, the default, turns it off).
    pub image_maximum_gc_age: Duration,
    /// `--image-gc-period` (ferro-specific).
    pub image_gc_period: Duration,
    /// How requests to the :10250 server are authorized.
    pub authorization: crate::server::authz::AuthzConfig,
    /// configMapAndSecretChangeDetectionStrategy: `Watch` (default; a watch per referenced
    /// object) or `Get` (a GET per pod sync).
    pub watch_referenced_objects: bool,
}

impl AgentConfig {
    /// Merges flags over the file (when given), applying upstream defaults and validating.
    pub fn resolve(flags: &Flags, file: Option<KubeletConfiguration>) -> Result<Self, ConfigError> {
        let file = file.unwrap_or_default();
        let runtime_socket = flags
            .container_runtime_endpoint
            .strip_prefix("unix://")
            .map(PathBuf::from)
            .ok_or_else(|| ConfigError::Endpoint(flags.container_runtime_endpoint.clone()))?;
        let lease = file.node_lease_duration_seconds.unwrap_or(40);
        if lease <= 0 {
            return Err(ConfigError::Duration {
                field: "nodeLeaseDurationSeconds",
                value: lease.to_string(),
                reason: "must be positive".into(),
            });
        }
        let dur = |field: &'static str, v: &Option<String>, default: &str| {
            let value = v.clone().unwrap_or_else(|| default.to_string());
            parse_duration(&value).map_err(|reason| ConfigError::Duration { field, value, reason })
        };
        let cgroup_driver =
            flags.cgroup_driver.clone().or(file.cgroup_driver).unwrap_or_else(|| "cgroupfs".into());
        if cgroup_driver != "cgroupfs" && cgroup_driver != "systemd" {
            return Err(ConfigError::Value {
                field: "cgroupDriver",
                value: cgroup_driver,
                reason: "must be cgroupfs or systemd".into(),
            });
        }
        let watch_referenced_objects = match file.config_map_and_secret_change_detection_strategy.as_deref() {
            None | Some("Watch") => true,
            Some("Get") => false,
            Some(other) => {
                return Err(ConfigError::Value {
                    field: "configMapAndSecretChangeDetectionStrategy",
                    value: other.to_string(),
                    reason: if other == "Cache" {
                        "ferro-agent supports Watch (the default) and Get, not the TTL cache".into()
                    } else {
                        "must be Watch or Get".into()
                    },
                });
            }
        };
        let (image_gc_high_threshold_percent, image_gc_low_threshold_percent) =
            image_gc_thresholds(file.image_gc_high_threshold_percent, file.image_gc_low_threshold_percent)?;
        let image_gc_period = parse_duration(&flags.image_gc_period).map_err(|reason| ConfigError::Duration {
            field: "--image-gc-period",
            value: flags.image_gc_period.clone(),
            reason,
        })?;
        if image_gc_period.is_zero() {
            return Err(ConfigError::Duration {
                field: "--image-gc-period",
                value: flags.image_gc_period.clone(),
                reason: "must be positive".into(),
            });
        }
        let image_minimum_gc_age = dur("imageMinimumGCAge", &file.image_minimum_gc_age, "2m")?;
        let image_maximum_gc_age = dur("imageMaximumGCAge", &file.image_maximum_gc_age, "0s")?;
        if !image_maximum_gc_age.is_zero() && image_maximum_gc_age <= image_minimum_gc_age {
            // Upstream's validation.
            return Err(ConfigError::Value {
                field: "imageMaximumGCAge",
                value: file.image_maximum_gc_age.clone().unwrap_or_default(),
                reason: format!("must be greater than imageMinimumGCAge ({image_minimum_gc_age:?})"),
            });
        }
        let eviction = {
            use crate::eviction::plan::{parse_thresholds, Config, Signal};
            let thresholds = |field: &'static str, m: Option<&std::collections::BTreeMap<String, String>>| {
                m.map(|m| parse_thresholds(m).map_err(|reason| ConfigError::Value { field, value: format!("{m:?}"), reason }))
                    .transpose()
            };
            let defaults = Config::default();
            let mut grace = std::collections::BTreeMap::new();
            for (k, v) in file.eviction_soft_grace_period.iter().flatten() {
                let field = "evictionSoftGracePeriod";
                let signal = Signal::parse(k).ok_or_else(|| ConfigError::Value {
                    field,
                    value: k.clone(),
                    reason: "unknown eviction signal".into(),
                })?;
                let d = parse_duration(v).map_err(|reason| ConfigError::Duration { field, value: v.clone(), reason })?;
                grace.insert(signal, d);
            }
            // enforceNodeAllocatable (default [pods]): "pods" applies a hard memory.available
            // threshold to allocatableMemory.available too; "none" alone turns that off.
            let enforce = file.enforce_node_allocatable.clone().unwrap_or_else(|| vec!["pods".into()]);
            for e in &enforce {
                let reason = match e.as_str() {
                    "pods" => continue,
                    "none" if enforce.len() == 1 => continue,
                    "none" => "none cannot be combined with other values".to_string(),
                    "system-reserved" | "kube-reserved" | "system-reserved-compressible" | "kube-reserved-compressible" => {
                        format!("{e} is not supported: ferro-agent reserves nothing for the system or kube daemons (no systemReserved/kubeReserved)")
                    }
                    _ => "must be pods or none".to_string(),
                };
                return Err(ConfigError::Value { field: "enforceNodeAllocatable", value: e.clone(), reason });
            }
            let hard = thresholds("evictionHard", file.eviction_hard.as_ref())?.unwrap_or(defaults.hard);
            let hard = if enforce.iter().any(|e| e == "pods") { crate::eviction::plan::with_allocatable_thresholds(hard) } else { hard };
            let cfg = Config {
                hard,
                soft: thresholds("evictionSoft", file.eviction_soft.as_ref())?.unwrap_or_default(),
                soft_grace: grace,
                pressure_transition_period: dur(
                    "evictionPressureTransitionPeriod",
                    &file.eviction_pressure_transition_period,
                    "5m",
                )?,
                max_pod_grace_period: file.eviction_max_pod_grace_period.unwrap_or(0),
            };
            cfg.validate().map_err(|reason| ConfigError::Value {
                field: "evictionSoft",
                value: format!("{:?}", file.eviction_soft),
                reason,
            })?;
            cfg
        };
        let authorization = authorization(file.authorization.as_ref(), flags.kubeconfig.is_some())?;
        Ok(AgentConfig {
            authorization,
            image_gc_high_threshold_percent,
            image_gc_low_threshold_percent,
            image_minimum_gc_age,
            image_maximum_gc_age,
            image_gc_period,
            kubeconfig: flags.kubeconfig.clone(),
            bootstrap_kubeconfig: flags.bootstrap_kubeconfig.clone(),
            cert_dir: flags.cert_dir.clone().unwrap_or_else(|| flags.root_dir.join("pki")),
            rotate_certificates: flags.rotate_certificates.or(file.rotate_certificates).unwrap_or(true),
            rotate_certificates_before: parse_duration(&flags.rotate_certificates_before).map_err(|reason| {
                ConfigError::Duration { field: "--rotate-certificates-before", value: flags.rotate_certificates_before.clone(), reason }
            })?,
            api_servers: flags.api_servers.clone(),
            hostname_override: flags.hostname_override.clone(),
            node_ip: flags.node_ip,
            root_dir: flags.root_dir.clone(),
            runtime_socket,
            static_pod_path: flags.pod_manifest_path.clone().or(file.static_pod_path),
            node_lease_duration_seconds: lease,
            node_status_update_frequency: dur(
                "nodeStatusUpdateFrequency",
                &file.node_status_update_frequency,
                "10s",
            )?,
            node_status_report_frequency: dur(
                "nodeStatusReportFrequency",
                &file.node_status_report_frequency,
                "5m",
            )?,
            max_pods: file.max_pods.unwrap_or(110),
            cgroup_driver,
            watch_referenced_objects,
            cgroup_root: flags
                .cgroup_root
                .clone()
                .or(file.cgroup_root)
                .unwrap_or_default()
                .trim_end_matches('/')
                .to_string(),
            pod_logs_dir: file.pod_logs_dir.unwrap_or_else(|| PathBuf::from("/var/log/pods")),
            eviction,
            volume_stats_agg_period: {
                let d = dur("volumeStatsAggPeriod", &file.volume_stats_agg_period, "1m")?;
                if d.is_zero() {
                    return Err(ConfigError::Duration {
                        field: "volumeStatsAggPeriod",
                        value: file.volume_stats_agg_period.clone().unwrap_or_default(),
                        reason: "must be positive (ferro does not turn the collection off)".into(),
                    });
                }
                d
            },
            tls_cert_file: flags.tls_cert_file.clone().or(file.tls_cert_file),
            tls_private_key_file: flags.tls_private_key_file.clone().or(file.tls_private_key_file),
            client_ca_file: flags
                .client_ca_file
                .clone()
                .or(file.authentication.and_then(|a| a.x509).and_then(|x| x.client_ca_file)),
            pod_cidr: file.pod_cidr,
            cluster_dns: file.cluster_dns.unwrap_or_default(),
            cluster_domain: file.cluster_domain,
            register_node: file.register_node.unwrap_or(true),
            address: file.address.unwrap_or_else(|| "0.0.0.0".into()),
            port: file.port.unwrap_or(10250),
        })
    }

    /// The image GC policy (see [`crate::pod::imagegc`]).
    pub fn image_gc(&self) -> crate::pod::imagegc::ImageGcConfig {
        crate::pod::imagegc::ImageGcConfig {
            high_threshold_percent: self.image_gc_high_threshold_percent,
            low_threshold_percent: self.image_gc_low_threshold_percent,
            min_age: self.image_minimum_gc_age,
            max_age: self.image_maximum_gc_age,
            period: self.image_gc_period,
        }
    }

    /// The lease renew interval: a quarter of the lease duration, as upstream.
    pub fn lease_renew_interval(&self) -> Duration {
        Duration::from_millis(u64::try_from(self.node_lease_duration_seconds).unwrap_or(40) * 250)
    }
}

/// imageGCHighThresholdPercent (default 85) and imageGCLowThresholdPercent (default 80),
/// validated as upstream's kubelet config validation does: each within 0..=100, and low less
/// than high (so high = 100, which disables GC, still needs low below 100).
fn image_gc_thresholds(high: Option<i32>, low: Option<i32>) -> Result<(u8, u8), ConfigError> {
    let (high, low) = (high.unwrap_or(85), low.unwrap_or(80));
    let percent = |field: &'static str, v: i32| {
        u8::try_from(v).ok().filter(|p| *p <= 100).ok_or_else(|| ConfigError::Value {
            field,
            value: v.to_string(),
            reason: "must be between 0 and 100, inclusive".into(),
        })
    };
    let high_p = percent("imageGCHighThresholdPercent", high)?;
    let low_p = percent("imageGCLowThresholdPercent", low)?;
    if low_p >= high_p {
        return Err(ConfigError::Value {
            field: "imageGCLowThresholdPercent",
            value: low.to_string(),
            reason: format!("must be less than imageGCHighThresholdPercent {high}"),
        });
    }
    Ok((high_p, low_p))
}

/// Parses a Go duration string ("10s", "5m", "1h30m", "250ms", "1.5s"): the shared
/// implementation; negative durations are refused.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    k8s_semantics::parse_duration(s).map_err(|e| e.to_string())
}

/// `authorization`: upstream's v1beta1 default mode is Webhook (a SubjectAccessReview per
/// request, cached 5m when allowed and 30s when denied); without an API server (standalone)
/// the default is AlwaysAllow, and Webhook is an error.
fn authorization(
    a: Option<&Authorization>,
    has_api: bool,
) -> Result<crate::server::authz::AuthzConfig, ConfigError> {
    use crate::server::authz::{AuthzConfig, Mode};
    let mode = match a.and_then(|a| a.mode.as_deref()) {
        None if has_api => Mode::Webhook,
        None => Mode::AlwaysAllow,
        Some("AlwaysAllow") => Mode::AlwaysAllow,
        Some("Webhook") if has_api => Mode::Webhook,
        Some("Webhook") => {
            return Err(ConfigError::Value {
                field: "authorization.mode",
                value: "Webhook".into(),
                reason: "needs an API server (--kubeconfig)".into(),
            })
        }
        Some(other) => {
            return Err(ConfigError::Value {
                field: "authorization.mode",
                value: other.into(),
                reason: "must be AlwaysAllow or Webhook".into(),
            })
        }
    };
    let webhook = a.and_then(|a| a.webhook.as_ref());
    let ttl = |field: &'static str, v: Option<&String>, default: &str| {
        let value = v.cloned().unwrap_or_else(|| default.to_string());
        parse_duration(&value).map_err(|reason| ConfigError::Duration { field, value, reason })
    };
    Ok(AuthzConfig {
        mode,
        authorized_ttl: ttl(
            "authorization.webhook.cacheAuthorizedTTL",
            webhook.and_then(|w| w.cache_authorized_ttl.as_ref()),
            "5m",
        )?,
        unauthorized_ttl: ttl(
            "authorization.webhook.cacheUnauthorizedTTL",
            webhook.and_then(|w| w.cache_unauthorized_ttl.as_ref()),
            "30s",
        )?,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn flags(args: &[&str]) -> Flags {
        let mut v = vec!["ferro-agent"];
        v.extend_from_slice(args);
        Flags::try_parse_from(v).unwrap()
    }

    #[test]
    fn defaults() {
        let c = AgentConfig::resolve(&flags(&[]), None).unwrap();
        assert_eq!(c.root_dir, PathBuf::from("/var/lib/ferro/agent"));
        assert_eq!(c.runtime_socket, PathBuf::from("/run/containerd/containerd.sock"));
        assert_eq!(c.node_lease_duration_seconds, 40);
        assert_eq!(c.lease_renew_interval(), Duration::from_secs(10));
        assert_eq!(c.node_status_update_frequency, Duration::from_secs(10));
        assert_eq!(c.node_status_report_frequency, Duration::from_secs(300));
        assert_eq!(c.max_pods, 110);
        assert!(c.register_node);
        assert_eq!(c.port, 10250);
        assert_eq!(c.kubeconfig, None);
    }

    #[test]
    fn file_and_flag_override() {
        let text = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
                    nodeLeaseDurationSeconds: 8\nnodeStatusUpdateFrequency: 2s\nmaxPods: 50\n\
                    staticPodPath: /etc/from-file\npodCIDR: 10.244.1.0/24\nclusterDNS: [10.96.0.10]\n\
                    clusterDomain: cluster.local\nregisterNode: false\nport: 10251\ncgroupDriver: systemd\n";
        let file = KubeletConfiguration::parse(text, Path::new("c.yaml")).unwrap();
        let c = AgentConfig::resolve(
            &flags(&["--pod-manifest-path", "/etc/from-flag", "--node-ip", "10.0.0.5", "--hostname-override", "n1"]),
            Some(file.clone()),
        )
        .unwrap();
        assert_eq!(c.lease_renew_interval(), Duration::from_secs(2));
        assert_eq!(c.node_status_update_frequency, Duration::from_secs(2));
        assert_eq!(c.max_pods, 50);
        assert_eq!(c.static_pod_path, Some(PathBuf::from("/etc/from-flag")));
        assert_eq!(c.pod_cidr.as_deref(), Some("10.244.1.0/24"));
        assert_eq!(c.cluster_dns, vec!["10.96.0.10".to_string()]);
        assert!(!c.register_node);
        assert_eq!(c.port, 10251);
        assert_eq!(c.cgroup_driver, "systemd");
        assert_eq!(c.hostname_override.as_deref(), Some("n1"));
        let c = AgentConfig::resolve(&flags(&[]), Some(file)).unwrap();
        assert_eq!(c.static_pod_path, Some(PathBuf::from("/etc/from-file")));
    }

    #[test]
    fn referenced_objects_are_watched_unless_get_is_asked_for() {
        let file = |v: &str| {
            let text = format!("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nconfigMapAndSecretChangeDetectionStrategy: {v}\n");
            KubeletConfiguration::parse(&text, Path::new("c.yaml")).unwrap()
        };
        assert!(AgentConfig::resolve(&flags(&[]), None).unwrap().watch_referenced_objects);
        assert!(AgentConfig::resolve(&flags(&[]), Some(file("Watch"))).unwrap().watch_referenced_objects);
        assert!(!AgentConfig::resolve(&flags(&[]), Some(file("Get"))).unwrap().watch_referenced_objects);
        let e = AgentConfig::resolve(&flags(&[]), Some(file("Cache"))).unwrap_err().to_string();
        assert!(e.contains("configMapAndSecretChangeDetectionStrategy") && e.contains("Watch (the default) and Get"), "{e}");
        let e = AgentConfig::resolve(&flags(&[]), Some(file("watch"))).unwrap_err().to_string();
        assert!(e.contains("must be Watch or Get"), "{e}");
    }

    #[test]
    fn certificate_rotation_is_on_unless_turned_off() {
        let file = |v: bool| {
            let text = format!("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nrotateCertificates: {v}\n");
            KubeletConfiguration::parse(&text, Path::new("c.yaml")).unwrap()
        };
        let c = AgentConfig::resolve(&flags(&[]), None).unwrap();
        assert!(c.rotate_certificates);
        assert_eq!(c.rotate_certificates_before, Duration::ZERO);
        assert!(!AgentConfig::resolve(&flags(&[]), Some(file(false))).unwrap().rotate_certificates);
        assert!(AgentConfig::resolve(&flags(&["--rotate-certificates"]), Some(file(false))).unwrap().rotate_certificates, "the flag wins");
        assert!(!AgentConfig::resolve(&flags(&["--rotate-certificates=false"]), Some(file(true))).unwrap().rotate_certificates);
        let c = AgentConfig::resolve(&flags(&["--rotate-certificates-before", "9m55s"]), None).unwrap();
        assert_eq!(c.rotate_certificates_before, Duration::from_secs(595));
        let e = AgentConfig::resolve(&flags(&["--rotate-certificates-before", "soon"]), None).unwrap_err();
        assert!(e.to_string().contains("--rotate-certificates-before"), "{e}");
    }

    #[test]
    fn eviction_settings() {
        use crate::eviction::plan::{Signal, Threshold};
        let parse = |body: &str| {
            let text = format!("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{body}");
            let file = KubeletConfiguration::parse(&text, Path::new("c.yaml")).unwrap();
            AgentConfig::resolve(&flags(&[]), Some(file))
        };
        let c = parse("").unwrap();
        let defaults = crate::eviction::plan::Config::default();
        assert_eq!(c.eviction.hard, crate::eviction::plan::with_allocatable_thresholds(defaults.hard.clone()), "enforceNodeAllocatable [pods] by default");
        assert_eq!(c.eviction.hard[&Signal::AllocatableMemoryAvailable], Threshold::Quantity(100 << 20));
        assert_eq!(c.eviction.soft, defaults.soft);
        assert_eq!(parse("enforceNodeAllocatable: [none]\n").unwrap().eviction.hard, defaults.hard);
        assert_eq!(parse("enforceNodeAllocatable: [pods]\nevictionHard: {memory.available: 1Gi}\n").unwrap().eviction.hard[&Signal::AllocatableMemoryAvailable], Threshold::Quantity(1 << 30));
        assert!(!parse("evictionHard: {nodefs.available: 30%}\n").unwrap().eviction.hard.contains_key(&Signal::AllocatableMemoryAvailable));
        for (body, want) in [
            ("enforceNodeAllocatable: [system-reserved]\n", "ferro-agent reserves nothing"),
            ("enforceNodeAllocatable: [pods, none]\n", "none cannot be combined"),
            ("enforceNodeAllocatable: [everything]\n", "must be pods or none"),
        ] {
            let err = parse(body).unwrap_err().to_string();
            assert!(err.contains("enforceNodeAllocatable") && err.contains(want), "{body}: {err}");
        }
        assert_eq!(c.volume_stats_agg_period, Duration::from_secs(60));
        assert_eq!(parse("volumeStatsAggPeriod: 2s\n").unwrap().volume_stats_agg_period, Duration::from_secs(2));
        assert!(parse("volumeStatsAggPeriod: 0s\n").unwrap_err().to_string().contains("volumeStatsAggPeriod"));
        let c = parse("evictionHard: {nodefs.available: 30%}\nevictionSoft: {memory.available: 1Gi}\nevictionSoftGracePeriod: {memory.available: 1m30s}\nevictionPressureTransitionPeriod: 5s\nevictionMaxPodGracePeriod: 20\n").unwrap();
        assert_eq!(c.eviction.hard.len(), 1, "a configured map replaces the defaults (no memory.available: no allocatable threshold)");
        assert_eq!(c.eviction.hard[&Signal::NodefsAvailable], Threshold::Percent(30.0));
        assert_eq!(c.eviction.soft[&Signal::MemoryAvailable], Threshold::Quantity(1 << 30));
        assert_eq!(c.eviction.soft_grace[&Signal::MemoryAvailable], Duration::from_secs(90));
        assert_eq!(c.eviction.pressure_transition_period, Duration::from_secs(5));
        assert_eq!(c.eviction.max_pod_grace_period, 20);
        for (body, want) in [
            ("evictionHard: {memory.free: 1Gi}\n", "unknown eviction signal \"memory.free\""),
            ("evictionHard: {nodefs.available: 120%}\n", "out of 0-100"),
            ("evictionSoft: {memory.available: 1Gi}\n", "grace period must be specified for the soft eviction threshold memory.available"),
            ("evictionSoftGracePeriod: {memory.available: soon}\n", "evictionSoftGracePeriod"),
            ("evictionPressureTransitionPeriod: forever\n", "evictionPressureTransitionPeriod"),
        ] {
            let err = parse(body).unwrap_err().to_string();
            assert!(err.contains(want), "{body}: {err}");
        }
    }

    #[test]
    fn unknown_field_is_named() {
        let text = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nevictionSofter: {}\n";
        let err = KubeletConfiguration::parse(text, Path::new("c.yaml")).unwrap_err().to_string();
        assert!(err.contains("unknown field `evictionSofter`"), "{err}");
        assert!(err.contains("c.yaml"), "{err}");
    }

    #[test]
    fn wrong_kind_or_version() {
        let err = KubeletConfiguration::parse("apiVersion: v1\nkind: KubeletConfiguration\n", Path::new("c"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("apiVersion must be"), "{err}");
        let err = KubeletConfiguration::parse("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: Pod\n", Path::new("c"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("kind must be"), "{err}");
    }

    #[test]
    fn bad_duration() {
        let text = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nnodeStatusReportFrequency: 5 minutes\n";
        let file = KubeletConfiguration::parse(text, Path::new("c.yaml")).unwrap();
        let err = AgentConfig::resolve(&flags(&[]), Some(file)).unwrap_err().to_string();
        assert!(err.contains("nodeStatusReportFrequency"), "{err}");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("10x").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("").is_err());
    }

    fn gc_file(lines: &str) -> Result<AgentConfig, ConfigError> {
        let text = format!("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{lines}");
        let file = KubeletConfiguration::parse(&text, Path::new("c.yaml"))?;
        AgentConfig::resolve(&flags(&[]), Some(file))
    }

    #[test]
    fn image_gc_defaults() {
        let c = AgentConfig::resolve(&flags(&[]), None).unwrap();
        assert_eq!(c.image_gc_high_threshold_percent, 85);
        assert_eq!(c.image_gc_low_threshold_percent, 80);
        assert_eq!(c.image_minimum_gc_age, Duration::from_secs(120));
        assert_eq!(c.image_gc_period, Duration::from_secs(60));
        let gc = c.image_gc();
        assert_eq!((gc.high_threshold_percent, gc.low_threshold_percent), (85, 80));
        assert!(!gc.disabled());
    }

    #[test]
    fn image_gc_from_file_and_flag() {
        let c = gc_file("imageGCHighThresholdPercent: 1\nimageGCLowThresholdPercent: 0\nimageMinimumGCAge: 0s\n").unwrap();
        assert_eq!((c.image_gc_high_threshold_percent, c.image_gc_low_threshold_percent), (1, 0));
        assert_eq!(c.image_minimum_gc_age, Duration::ZERO);
        let c = gc_file("imageMinimumGCAge: 1h30m\n").unwrap();
        assert_eq!(c.image_minimum_gc_age, Duration::from_secs(5400));
        let c = AgentConfig::resolve(&flags(&["--image-gc-period", "2s"]), None).unwrap();
        assert_eq!(c.image_gc().period, Duration::from_secs(2));
    }

    #[test]
    fn authorization_modes() {
        use crate::server::authz::Mode;
        let c = AgentConfig::resolve(&flags(&[]), None).unwrap();
        assert_eq!(c.authorization.mode, Mode::AlwaysAllow, "standalone");
        let c = AgentConfig::resolve(&flags(&["--kubeconfig", "/k"]), None).unwrap();
        assert_eq!(c.authorization.mode, Mode::Webhook, "upstream's default with an API server");
        assert_eq!(c.authorization.authorized_ttl, Duration::from_secs(300));
        assert_eq!(c.authorization.unauthorized_ttl, Duration::from_secs(30));
        let file = |lines: &str| {
            let text = format!("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{lines}");
            KubeletConfiguration::parse(&text, Path::new("c.yaml")).unwrap()
        };
        let c = AgentConfig::resolve(
            &flags(&["--kubeconfig", "/k"]),
            Some(file("authorization:\n  mode: AlwaysAllow\n")),
        )
        .unwrap();
        assert_eq!(c.authorization.mode, Mode::AlwaysAllow);
        let c = AgentConfig::resolve(
            &flags(&["--kubeconfig", "/k"]),
            Some(file("authorization:\n  mode: Webhook\n  webhook:\n    cacheAuthorizedTTL: 1m\n    cacheUnauthorizedTTL: 0s\n")),
        )
        .unwrap();
        assert_eq!(c.authorization.authorized_ttl, Duration::from_secs(60));
        assert_eq!(c.authorization.unauthorized_ttl, Duration::ZERO);
        let err = AgentConfig::resolve(&flags(&[]), Some(file("authorization:\n  mode: Webhook\n"))).unwrap_err();
        assert!(err.to_string().contains("needs an API server"), "{err}");
        let err = AgentConfig::resolve(&flags(&["--kubeconfig", "/k"]), Some(file("authorization:\n  mode: RBAC\n")))
            .unwrap_err();
        assert!(err.to_string().contains("must be AlwaysAllow or Webhook"), "{err}");
        let text = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nauthorization:\n  modes: [Webhook]\n";
        assert!(KubeletConfiguration::parse(text, Path::new("c.yaml")).is_err(), "unknown fields are rejected");
    }

    #[test]
    fn image_maximum_gc_age() {
        assert_eq!(AgentConfig::resolve(&flags(&[]), None).unwrap().image_gc().max_age, Duration::ZERO);
        let c = gc_file("imageMaximumGCAge: 168h
").unwrap();
        assert_eq!(c.image_gc().max_age, Duration::from_secs(168 * 3600));
        let c = gc_file("imageMinimumGCAge: 0s
imageMaximumGCAge: 3s
").unwrap();
        assert_eq!(c.image_gc().max_age, Duration::from_secs(3));
        // It must exceed the minimum age (2m by default), as upstream validates.
        for lines in ["imageMaximumGCAge: 1m
", "imageMaximumGCAge: 2m
", "imageMinimumGCAge: 1h
imageMaximumGCAge: 30m
"] {
            let err = gc_file(lines).unwrap_err().to_string();
            assert!(err.contains("imageMaximumGCAge") && err.contains("must be greater than imageMinimumGCAge"), "{err}");
        }
        let err = gc_file("imageMaximumGCAge: soon
").unwrap_err().to_string();
        assert!(err.contains("imageMaximumGCAge"), "{err}");
    }

    #[test]
    fn image_gc_high_100_disables() {
        let c = gc_file("imageGCHighThresholdPercent: 100\n").unwrap();
        assert!(c.image_gc().disabled());
        let c = gc_file("imageGCHighThresholdPercent: 100\nimageGCLowThresholdPercent: 99\n").unwrap();
        assert!(c.image_gc().disabled());
        // As upstream, low must stay below high even then.
        let err = gc_file("imageGCHighThresholdPercent: 100\nimageGCLowThresholdPercent: 100\n").unwrap_err().to_string();
        assert!(err.contains("imageGCLowThresholdPercent") && err.contains("must be less than imageGCHighThresholdPercent 100"), "{err}");
    }

    #[test]
    fn image_gc_invalid_thresholds() {
        for (lines, field, reason) in [
            ("imageGCHighThresholdPercent: 101\n", "imageGCHighThresholdPercent", "between 0 and 100"),
            ("imageGCHighThresholdPercent: -1\n", "imageGCHighThresholdPercent", "between 0 and 100"),
            ("imageGCLowThresholdPercent: -5\n", "imageGCLowThresholdPercent", "between 0 and 100"),
            ("imageGCLowThresholdPercent: 101\n", "imageGCLowThresholdPercent", "between 0 and 100"),
            ("imageGCHighThresholdPercent: 50\nimageGCLowThresholdPercent: 50\n", "imageGCLowThresholdPercent", "must be less than"),
            ("imageGCHighThresholdPercent: 70\n", "imageGCLowThresholdPercent", "must be less than imageGCHighThresholdPercent 70"),
            ("imageGCHighThresholdPercent: 0\nimageGCLowThresholdPercent: 0\n", "imageGCLowThresholdPercent", "must be less than"),
        ] {
            let err = gc_file(lines).unwrap_err();
            assert!(matches!(err, ConfigError::Value { field: f, .. } if f == field), "{lines}: {err}");
            assert!(err.to_string().contains(reason), "{lines}: {err}");
        }
    }

    #[test]
    fn image_gc_bad_durations() {
        let err = gc_file("imageMinimumGCAge: 2 minutes\n").unwrap_err().to_string();
        assert!(err.contains("imageMinimumGCAge"), "{err}");
        let err = gc_file("imageMinimumGCAge: -1s\n").unwrap_err().to_string();
        assert!(err.contains("imageMinimumGCAge"), "{err}");
        let err = AgentConfig::resolve(&flags(&["--image-gc-period", "0s"]), None).unwrap_err().to_string();
        assert!(err.contains("--image-gc-period") && err.contains("positive"), "{err}");
        let err = AgentConfig::resolve(&flags(&["--image-gc-period", "soon"]), None).unwrap_err().to_string();
        assert!(err.contains("--image-gc-period"), "{err}");
        // Field names are exact: upstream's spelling only.
        let err = gc_file("imageMinimumGcAge: 1m\n").unwrap_err().to_string();
        assert!(err.contains("unknown field `imageMinimumGcAge`"), "{err}");
    }

    #[test]
    fn non_unix_endpoint_rejected() {
        let err = AgentConfig::resolve(&flags(&["--container-runtime-endpoint", "tcp://x:1"]), None).unwrap_err();
        assert!(matches!(err, ConfigError::Endpoint(_)));
    }
}
