//! The eviction manager's decisions, pure: upstream's eviction manager `synchronize`
//! (pkg/kubelet/eviction) from observations, thresholds and the pods' usage to the node's
//! pressure conditions and at most one pod to evict per round.
//!
//! - A threshold is met when a signal's available amount is below it (a quantity, or a
//!   percentage of the signal's capacity).
//! - Pressure conditions follow every met threshold, hard or soft (a soft one before its grace
//!   period is over too), and stay true for `pressure_transition_period` after the last round
//!   that met one (upstream's default 5 min), so a node does not flap.
//! - A hard threshold evicts at once, with a grace period of 1 s (upstream's
//!   immediateEvictionGracePeriodSeconds); a soft one once it has been met continuously for its
//!   grace period, with the pod's grace period capped by `max_pod_grace_period` (when above 0).
//! - The signal to reclaim is the first met in upstream's order (memory, then nodefs, imagefs,
//!   pids); pods are ranked as upstream's: for memory, pods using more than their request
//!   first, then lower priority, then the larger usage above the request; the same for disk
//!   with ephemeral-storage; inodes by priority then inodes used; pids by priority then
//!   processes. Critical pods (static or mirror pods, priority >= 2,000,000,000) are never
//!   evicted, nor pods already finished or being deleted.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

/// An eviction signal, in the order upstream reclaims them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Signal {
    MemoryAvailable,
    /// Node allocatable memory less the pods' working set (with enforceNodeAllocatable
    /// `pods`, upstream's default: a hard memory.available threshold applies to it too).
    AllocatableMemoryAvailable,
    NodefsAvailable,
    NodefsInodesFree,
    ImagefsAvailable,
    ImagefsInodesFree,
    PidAvailable,
}

/// The node condition a signal drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Pressure {
    Memory,
    Disk,
    Pid,
}

impl Signal {
    pub const ALL: [Signal; 7] = [
        Signal::MemoryAvailable,
        Signal::AllocatableMemoryAvailable,
        Signal::NodefsAvailable,
        Signal::NodefsInodesFree,
        Signal::ImagefsAvailable,
        Signal::ImagefsInodesFree,
        Signal::PidAvailable,
    ];

    pub fn parse(s: &str) -> Option<Signal> {
        Signal::ALL.into_iter().find(|x| x.as_str() == s)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Signal::MemoryAvailable => "memory.available",
            Signal::AllocatableMemoryAvailable => "allocatableMemory.available",
            Signal::NodefsAvailable => "nodefs.available",
            Signal::NodefsInodesFree => "nodefs.inodesFree",
            Signal::ImagefsAvailable => "imagefs.available",
            Signal::ImagefsInodesFree => "imagefs.inodesFree",
            Signal::PidAvailable => "pid.available",
        }
    }

    /// The resource named in the eviction message (upstream's signalToResource).
    pub fn resource(self) -> &'static str {
        match self {
            Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable => "memory",
            Signal::NodefsAvailable | Signal::ImagefsAvailable => "ephemeral-storage",
            Signal::NodefsInodesFree | Signal::ImagefsInodesFree => "inodes",
            Signal::PidAvailable => "pids",
        }
    }

    pub fn pressure(self) -> Pressure {
        match self {
            Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable => Pressure::Memory,
            Signal::PidAvailable => Pressure::Pid,
            _ => Pressure::Disk,
        }
    }

    /// Whether amounts of this signal are bytes (printed as quantities such as `100Mi`).
    fn bytes(self) -> bool {
        matches!(
            self,
            Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable | Signal::NodefsAvailable | Signal::ImagefsAvailable
        )
    }
}

/// A threshold: an absolute amount or a percentage of the signal's capacity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Threshold {
    Quantity(u64),
    Percent(f64),
}

impl Threshold {
    /// `100Mi`, `1000`, `10%`.
    pub fn parse(v: &str) -> Result<Threshold, String> {
        if let Some(p) = v.strip_suffix('%') {
            let p: f64 = p.trim().parse().map_err(|_| format!("invalid percentage {v:?}"))?;
            if !(0.0..=100.0).contains(&p) {
                return Err(format!("percentage {v:?} out of 0-100"));
            }
            return Ok(Threshold::Percent(p));
        }
        let n = k8s_semantics::quantity::scaled(v, 1).ok_or_else(|| format!("invalid quantity {v:?}"))?;
        let n = u64::try_from(n).map_err(|_| format!("negative quantity {v:?}"))?;
        Ok(Threshold::Quantity(n))
    }

    /// The amount below which the threshold is met, for a signal of `capacity`.
    pub fn amount(self, capacity: u64) -> u64 {
        match self {
            Threshold::Quantity(n) => n,
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)]
            Threshold::Percent(p) => ((capacity as f64) * p / 100.0).round() as u64,
        }
    }
}

/// One signal as observed: what is available of what capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Observation {
    pub available: u64,
    pub capacity: u64,
}

pub type Observations = BTreeMap<Signal, Observation>;

/// evictionHard, evictionSoft, evictionSoftGracePeriod, evictionPressureTransitionPeriod,
/// evictionMaxPodGracePeriod.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub hard: BTreeMap<Signal, Threshold>,
    pub soft: BTreeMap<Signal, Threshold>,
    pub soft_grace: BTreeMap<Signal, Duration>,
    pub pressure_transition_period: Duration,
    pub max_pod_grace_period: i64,
}

impl Default for Config {
    /// Upstream's defaults on Linux: memory.available < 100Mi, nodefs.available < 10%,
    /// nodefs.inodesFree < 5%, imagefs.available < 15%; no soft thresholds; 5 min transition.
    fn default() -> Self {
        Config {
            hard: BTreeMap::from([
                (Signal::MemoryAvailable, Threshold::Quantity(100 * 1024 * 1024)),
                (Signal::NodefsAvailable, Threshold::Percent(10.0)),
                (Signal::NodefsInodesFree, Threshold::Percent(5.0)),
                (Signal::ImagefsAvailable, Threshold::Percent(15.0)),
            ]),
            soft: BTreeMap::new(),
            soft_grace: BTreeMap::new(),
            pressure_transition_period: Duration::from_secs(300),
            max_pod_grace_period: 0,
        }
    }
}

/// Parses a map of thresholds (evictionHard, evictionSoft). Unknown signals are errors;
/// `0%` and `100%` turn the signal's threshold off, as upstream's (a threshold the node
/// always or never meets is no threshold: an operator writes `nodefs.available: 0%` to stop
/// evicting for disk).
pub fn parse_thresholds(m: &BTreeMap<String, String>) -> Result<BTreeMap<Signal, Threshold>, String> {
    let mut out = BTreeMap::new();
    for (k, v) in m {
        let s = Signal::parse(k).ok_or_else(|| format!("unknown eviction signal {k:?}"))?;
        if v == "0%" || v == "100%" {
            continue;
        }
        out.insert(s, Threshold::parse(v).map_err(|e| format!("{k}: {e}"))?);
    }
    Ok(out)
}

/// enforceNodeAllocatable with `pods` (upstream's addAllocatableThresholds): a hard
/// memory.available threshold also applies to allocatableMemory.available, unless one is set.
pub fn with_allocatable_thresholds(mut hard: BTreeMap<Signal, Threshold>) -> BTreeMap<Signal, Threshold> {
    if let Some(t) = hard.get(&Signal::MemoryAvailable).copied() {
        hard.entry(Signal::AllocatableMemoryAvailable).or_insert(t);
    }
    hard
}

/// allocatableMemory.available: the node's allocatable memory less what the pods use.
pub fn allocatable_memory(allocatable: u64, pods_working_set: u64) -> Observation {
    Observation { available: allocatable.saturating_sub(pods_working_set), capacity: allocatable }
}

impl Config {
    /// Checks what upstream's validation checks: every soft threshold has a grace period and
    /// every grace period a soft threshold.
    pub fn validate(&self) -> Result<(), String> {
        for s in self.soft.keys() {
            if !self.soft_grace.contains_key(s) {
                return Err(format!("grace period must be specified for the soft eviction threshold {}", s.as_str()));
            }
        }
        for s in self.soft_grace.keys() {
            if !self.soft.contains_key(s) {
                return Err(format!("grace period specified for {} without a soft eviction threshold", s.as_str()));
            }
        }
        Ok(())
    }
}

/// What the manager remembers between rounds (Unix ns).
#[derive(Debug, Clone, Default)]
pub struct State {
    /// When each met threshold (signal, hard) was first seen met, continuously since.
    first_met: BTreeMap<(Signal, bool), i64>,
    /// When each pressure was last seen.
    last_pressure: BTreeMap<Pressure, i64>,
}

/// One pod and what it uses now.
#[derive(Debug, Clone)]
pub struct PodUsage<'a> {
    pub pod: &'a Pod,
    /// Working set bytes of its containers.
    pub memory: u64,
    /// Bytes of its containers' writable layers, logs and local (disk) volumes.
    pub disk: u64,
    /// Inodes of the same.
    pub inodes: u64,
    /// Bytes and inodes the pod is ranked by for the imagefs signals: the same as `disk` and
    /// `inodes` when the image filesystem is the node's, its containers' writable layers alone
    /// on a dedicated one (upstream's ranking).
    pub imagefs_disk: u64,
    pub imagefs_inodes: u64,
    pub processes: u64,
}

/// A pod to evict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Eviction {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub signal: Signal,
    pub grace_seconds: i64,
    /// Upstream's message (the pod status' message).
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Decision {
    pub memory_pressure: bool,
    pub disk_pressure: bool,
    pub pid_pressure: bool,
    /// The thresholds met now (for the log): signal, hard.
    pub met: Vec<(Signal, bool)>,
    /// The signal whose node-level resources are reclaimed before a pod is evicted (upstream's
    /// reclaimNodeLevelResources): the first threshold past its grace period, when it is a
    /// disk one (unused images go; the eviction stands only if the resource is still
    /// [`starved`] afterwards).
    pub reclaim: Option<Signal>,
    pub evict: Option<Eviction>,
}

/// Whether `signal` has node-level resources to reclaim before pods are evicted for it.
pub fn node_reclaim(signal: Signal) -> bool {
    signal.pressure() == Pressure::Disk
}

/// Whether any threshold (hard or soft) of a signal of `resource` is met under `obs`: after
/// the node-level reclaim, an eviction for that resource goes ahead only if so.
pub fn starved(cfg: &Config, obs: &Observations, resource: &str) -> bool {
    cfg.hard.iter().chain(cfg.soft.iter()).any(|(signal, th)| {
        signal.resource() == resource && obs.get(signal).is_some_and(|o| o.available < th.amount(o.capacity))
    })
}

/// Upstream's immediateEvictionGracePeriodSeconds.
pub const HARD_EVICTION_GRACE_SECONDS: i64 = 1;

/// Upstream's IsCriticalPod: static and mirror pods, and pods of a critical priority.
pub fn is_critical(pod: &Pod) -> bool {
    let ann = pod.metadata.annotations.as_ref();
    let static_or_mirror = ann.is_some_and(|a| {
        a.get("kubernetes.io/config.source").is_some_and(|s| s != "api") || a.contains_key("kubernetes.io/config.mirror")
    });
    static_or_mirror || pod.spec.as_ref().and_then(|s| s.priority).is_some_and(|p| p >= 2_000_000_000)
}

fn priority(pod: &Pod) -> i32 {
    pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

/// The pod's request of `resource` in bytes (containers; init containers and overhead aside,
/// as upstream's eviction ranking).
fn request(pod: &Pod, resource: &str) -> u64 {
    pod.spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .filter_map(|c| c.resources.as_ref()?.requests.as_ref()?.get(resource))
        .filter_map(|q| k8s_semantics::quantity::scaled(&q.0, 1))
        .map(|v| u64::try_from(v).unwrap_or(0))
        .sum()
}

fn eligible(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    !is_critical(pod) && pod.metadata.deletion_timestamp.is_none() && !matches!(phase, Some("Succeeded" | "Failed"))
}

/// Pods ranked for `signal`, first to evict first.
pub fn rank<'a>(signal: Signal, pods: &[PodUsage<'a>]) -> Vec<PodUsage<'a>> {
    let mut v: Vec<PodUsage<'a>> = pods.iter().filter(|p| eligible(p.pod)).cloned().collect();
    let by_usage = |usage: fn(&PodUsage) -> u64, resource: &'static str| {
        move |a: &PodUsage, b: &PodUsage| {
            let (ra, rb) = (request(a.pod, resource), request(b.pod, resource));
            let (ua, ub) = (usage(a), usage(b));
            // Exceeding the request first, then lower priority, then more above the request.
            (ub > rb)
                .cmp(&(ua > ra))
                .then(priority(a.pod).cmp(&priority(b.pod)))
                .then(ub.saturating_sub(rb).cmp(&ua.saturating_sub(ra)))
        }
    };
    match signal {
        Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable => v.sort_by(by_usage(|p| p.memory, "memory")),
        Signal::NodefsAvailable => v.sort_by(by_usage(|p| p.disk, "ephemeral-storage")),
        Signal::ImagefsAvailable => v.sort_by(by_usage(|p| p.imagefs_disk, "ephemeral-storage")),
        Signal::NodefsInodesFree => {
            v.sort_by(|a, b| priority(a.pod).cmp(&priority(b.pod)).then(b.inodes.cmp(&a.inodes)));
        }
        Signal::ImagefsInodesFree => {
            v.sort_by(|a, b| priority(a.pod).cmp(&priority(b.pod)).then(b.imagefs_inodes.cmp(&a.imagefs_inodes)));
        }
        Signal::PidAvailable => {
            v.sort_by(|a, b| priority(a.pod).cmp(&priority(b.pod)).then(b.processes.cmp(&a.processes)));
        }
    }
    v
}

fn amount(signal: Signal, n: u64) -> String {
    if signal.bytes() {
        k8s_semantics::quantity::binary_si(i64::try_from(n).unwrap_or(i64::MAX))
    } else {
        n.to_string()
    }
}

/// Upstream's evictionMessage (pod-level usage: ferro measures pods, not containers).
fn message(signal: Signal, threshold: u64, available: u64, usage: &PodUsage) -> String {
    let mut m = format!(
        "The node was low on resource: {}. Threshold quantity: {}, available: {}. ",
        signal.resource(),
        amount(signal, threshold),
        amount(signal, available)
    );
    let (used, req) = match signal {
        Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable => (usage.memory, request(usage.pod, "memory")),
        Signal::NodefsAvailable => (usage.disk, request(usage.pod, "ephemeral-storage")),
        Signal::ImagefsAvailable => (usage.imagefs_disk, request(usage.pod, "ephemeral-storage")),
        _ => return m,
    };
    m.push_str(&format!(
        "Pod was using {}, request is {}, has larger consumption of {}. ",
        amount(signal, used),
        amount(signal, req),
        signal.resource()
    ));
    m
}

/// One round at `now` (Unix ns).
pub fn decide(cfg: &Config, state: &mut State, obs: &Observations, pods: &[PodUsage], now: i64) -> Decision {
    // Thresholds met now, hard and soft.
    let mut met: Vec<(Signal, bool, u64, Observation)> = Vec::new();
    for (hard, map) in [(true, &cfg.hard), (false, &cfg.soft)] {
        for (signal, th) in map {
            let Some(o) = obs.get(signal) else { continue };
            let amount = th.amount(o.capacity);
            if o.available < amount {
                met.push((*signal, hard, amount, *o));
            }
        }
    }
    state.first_met.retain(|k, _| met.iter().any(|(s, h, ..)| (*s, *h) == *k));
    for (s, h, ..) in &met {
        state.first_met.entry((*s, *h)).or_insert(now);
        state.last_pressure.insert(s.pressure(), now);
    }
    let period = i64::try_from(cfg.pressure_transition_period.as_nanos()).unwrap_or(i64::MAX);
    let under = |p: Pressure| state.last_pressure.get(&p).is_some_and(|t| now.saturating_sub(*t) < period.max(1));
    let mut d = Decision {
        memory_pressure: under(Pressure::Memory),
        disk_pressure: under(Pressure::Disk),
        pid_pressure: under(Pressure::Pid),
        met: met.iter().map(|(s, h, ..)| (*s, *h)).collect(),
        reclaim: None,
        evict: None,
    };
    // Thresholds whose grace period is over, in reclaim order (hard first on a signal).
    let mut ready: Vec<&(Signal, bool, u64, Observation)> = met
        .iter()
        .filter(|(s, hard, ..)| {
            *hard || {
                let grace = cfg.soft_grace.get(s).copied().unwrap_or_default();
                let since = state.first_met.get(&(*s, false)).copied().unwrap_or(now);
                now.saturating_sub(since) >= i64::try_from(grace.as_nanos()).unwrap_or(i64::MAX)
            }
        })
        .collect();
    ready.sort_by_key(|(s, hard, ..)| (*s, !*hard));
    d.reclaim = ready.first().map(|(s, ..)| *s).filter(|s| node_reclaim(*s));
    for (signal, hard, threshold, o) in ready {
        let Some(victim) = rank(*signal, pods).into_iter().next() else { continue };
        let pod_grace = victim
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds)
            .unwrap_or(30);
        let grace_seconds = if *hard {
            HARD_EVICTION_GRACE_SECONDS
        } else if cfg.max_pod_grace_period > 0 {
            pod_grace.min(cfg.max_pod_grace_period)
        } else {
            pod_grace
        };
        d.evict = Some(Eviction {
            uid: victim.pod.metadata.uid.clone().unwrap_or_default(),
            namespace: victim.pod.metadata.namespace.clone().unwrap_or_default(),
            name: victim.pod.metadata.name.clone().unwrap_or_default(),
            signal: *signal,
            grace_seconds,
            message: message(*signal, *threshold, o.available, &victim),
        });
        break;
    }
    d
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    const S: i64 = 1_000_000_000;
    const MI: u64 = 1024 * 1024;

    fn pod(name: &str, extra: serde_json::Value) -> Pod {
        let mut p = json!({"metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
                           "spec": {"containers": [{"name": "c"}]}});
        if let Some(o) = extra.as_object() {
            for (k, v) in o {
                match k.as_str() {
                    "requests" => p["spec"]["containers"][0]["resources"] = json!({"requests": v}),
                    "annotations" => p["metadata"]["annotations"] = v.clone(),
                    "deleting" => p["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z"),
                    "phase" => p["status"] = json!({"phase": v}),
                    other => p["spec"][other] = v.clone(),
                }
            }
        }
        serde_json::from_value(p).unwrap()
    }

    fn usage(pod: &Pod, memory: u64, disk: u64) -> PodUsage<'_> {
        PodUsage { pod, memory, disk, inodes: 0, imagefs_disk: disk, imagefs_inodes: 0, processes: 0 }
    }

    fn obs(signal: Signal, available: u64, capacity: u64) -> Observations {
        BTreeMap::from([(signal, Observation { available, capacity })])
    }

    #[test]
    fn thresholds_parse_and_resolve() {
        assert_eq!(Threshold::parse("100Mi").unwrap(), Threshold::Quantity(100 * MI));
        assert_eq!(Threshold::parse("10%").unwrap().amount(1000), 100);
        assert!(Threshold::parse("101%").is_err());
        assert!(Threshold::parse("-1").is_err());
        assert!(Threshold::parse("lots").is_err());
        let m = BTreeMap::from([("memory.available".to_string(), "1Gi".to_string())]);
        assert_eq!(parse_thresholds(&m).unwrap()[&Signal::MemoryAvailable], Threshold::Quantity(1 << 30));
        let bad = BTreeMap::from([("memory.free".to_string(), "1Gi".to_string())]);
        assert_eq!(parse_thresholds(&bad).unwrap_err(), "unknown eviction signal \"memory.free\"");
        // 0% and 100% switch a signal off, as upstream's; 99.5% does not
        let off = BTreeMap::from([
            ("nodefs.available".to_string(), "0%".to_string()),
            ("pid.available".to_string(), "100%".to_string()),
            ("imagefs.available".to_string(), "99.5%".to_string()),
        ]);
        assert_eq!(parse_thresholds(&off).unwrap(), BTreeMap::from([(Signal::ImagefsAvailable, Threshold::Percent(99.5))]));
        let mut c = Config::default();
        c.soft.insert(Signal::MemoryAvailable, Threshold::Quantity(MI));
        assert!(c.validate().unwrap_err().contains("grace period must be specified"));
        c.soft_grace.insert(Signal::MemoryAvailable, Duration::from_secs(30));
        c.validate().unwrap();
        c.soft_grace.insert(Signal::PidAvailable, Duration::from_secs(30));
        assert!(c.validate().is_err());
    }

    #[test]
    fn a_hard_threshold_evicts_at_once_the_pod_most_above_its_request() {
        let (a, b, c) = (
            pod("within", json!({"requests": {"memory": "500Mi"}})),
            pod("above", json!({"requests": {"memory": "10Mi"}})),
            pod("besteffort", json!({})),
        );
        let pods = [usage(&a, 400 * MI, 0), usage(&b, 100 * MI, 0), usage(&c, 50 * MI, 0)];
        let mut st = State::default();
        let d = decide(&Config::default(), &mut st, &obs(Signal::MemoryAvailable, 50 * MI, 1 << 30), &pods, 10 * S);
        assert!(d.memory_pressure && !d.disk_pressure);
        let e = d.evict.unwrap();
        // "above" exceeds its request by 90Mi, "besteffort" by 50Mi; "within" does not exceed.
        assert_eq!((e.name.as_str(), e.grace_seconds, e.signal), ("above", 1, Signal::MemoryAvailable));
        assert_eq!(
            e.message,
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. Pod was using 100Mi, request is 10Mi, has larger consumption of memory. "
        );
    }

    #[test]
    fn ranking_puts_lower_priority_first_among_pods_exceeding_requests() {
        let (hi, lo, within) = (
            pod("hi", json!({"priority": 1000})),
            pod("lo", json!({"priority": -5})),
            pod("within", json!({"requests": {"ephemeral-storage": "1Gi"}, "priority": -100})),
        );
        let pods = [usage(&hi, 0, 900 * MI), usage(&lo, 0, 10 * MI), usage(&within, 0, 500 * MI)];
        let ranked: Vec<&str> = rank(Signal::NodefsAvailable, &pods).iter().map(|p| p.pod.metadata.name.as_deref().unwrap()).collect();
        assert_eq!(ranked, ["lo", "hi", "within"]);
    }

    #[test]
    fn critical_finished_and_deleting_pods_are_never_chosen() {
        let pods_owned = [
            pod("static", json!({"annotations": {"kubernetes.io/config.source": "file"}})),
            pod("mirror", json!({"annotations": {"kubernetes.io/config.mirror": "x"}})),
            pod("critical", json!({"priority": 2_000_001_000})),
            pod("done", json!({"phase": "Succeeded"})),
            pod("going", json!({"deleting": true})),
        ];
        let pods: Vec<PodUsage> = pods_owned.iter().map(|p| usage(p, 900 * MI, 900 * MI)).collect();
        let mut st = State::default();
        let d = decide(&Config::default(), &mut st, &obs(Signal::MemoryAvailable, 0, 1 << 30), &pods, 0);
        assert!(d.memory_pressure);
        assert_eq!(d.evict, None);
    }

    #[test]
    fn soft_thresholds_wait_their_grace_period_and_conditions_hold_for_the_transition_period() {
        let mut cfg = Config { hard: BTreeMap::new(), ..Config::default() };
        cfg.soft.insert(Signal::NodefsAvailable, Threshold::Percent(20.0));
        cfg.soft_grace.insert(Signal::NodefsAvailable, Duration::from_secs(60));
        cfg.max_pod_grace_period = 10;
        cfg.pressure_transition_period = Duration::from_secs(30);
        let p = pod("writer", json!({"terminationGracePeriodSeconds": 45}));
        let pods = [usage(&p, 0, 100 * MI)];
        let low = obs(Signal::NodefsAvailable, 100 * MI, 1000 * MI);
        let fine = obs(Signal::NodefsAvailable, 500 * MI, 1000 * MI);
        let mut st = State::default();
        let d = decide(&cfg, &mut st, &low, &pods, 0);
        assert!(d.disk_pressure, "a soft threshold sets the condition at once");
        assert_eq!(d.evict, None, "but evicts only after its grace period");
        assert_eq!(decide(&cfg, &mut st, &low, &pods, 59 * S).evict, None);
        let e = decide(&cfg, &mut st, &low, &pods, 60 * S).evict.unwrap();
        assert_eq!((e.name.as_str(), e.grace_seconds), ("writer", 10), "the pod's 45 s capped at 10");
        assert!(e.message.starts_with("The node was low on resource: ephemeral-storage. Threshold quantity: 200Mi, available: 100Mi. "), "{}", e.message);
        // Relieved: the condition stays for the transition period, then clears.
        let d = decide(&cfg, &mut st, &fine, &pods, 70 * S);
        assert!(d.disk_pressure && d.evict.is_none());
        assert!(!decide(&cfg, &mut st, &fine, &pods, 90 * S).disk_pressure);
        // Met again: the grace period starts over.
        assert_eq!(decide(&cfg, &mut st, &low, &pods, 100 * S).evict, None);
        assert_eq!(decide(&cfg, &mut st, &fine, &pods, 110 * S).evict, None);
        assert_eq!(decide(&cfg, &mut st, &low, &pods, 150 * S).evict, None, "an interruption restarts the grace period");
    }

    #[test]
    fn memory_is_reclaimed_before_disk_and_pids_rank_by_processes() {
        let (m, dsk) = (pod("mem", json!({})), pod("disk", json!({})));
        let pods = [usage(&m, 500 * MI, 0), usage(&dsk, 0, 900 * MI)];
        let mut both = obs(Signal::MemoryAvailable, 10 * MI, 1 << 30);
        both.insert(Signal::NodefsAvailable, Observation { available: 1, capacity: 1000 * MI });
        let d = decide(&Config::default(), &mut State::default(), &both, &pods, 0);
        assert!(d.memory_pressure && d.disk_pressure);
        assert_eq!(d.evict.unwrap().name, "mem");
        let (few, many) = (pod("few", json!({})), pod("many", json!({})));
        let pods = [
            PodUsage { pod: &few, memory: 0, disk: 0, inodes: 0, imagefs_disk: 0, imagefs_inodes: 0, processes: 3 },
            PodUsage { pod: &many, memory: 0, disk: 0, inodes: 0, imagefs_disk: 0, imagefs_inodes: 0, processes: 300 },
        ];
        let cfg = Config { hard: BTreeMap::from([(Signal::PidAvailable, Threshold::Quantity(100))]), ..Config::default() };
        let d = decide(&cfg, &mut State::default(), &obs(Signal::PidAvailable, 50, 4096), &pods, 0);
        assert!(d.pid_pressure);
        let e = d.evict.unwrap();
        assert_eq!(e.name, "many");
        assert_eq!(e.message, "The node was low on resource: pids. Threshold quantity: 100, available: 50. ");
    }

    #[test]
    fn disk_signals_reclaim_node_level_resources_first_memory_does_not() {
        let (m, dsk) = (pod("mem", json!({})), pod("disk", json!({})));
        let pods = [usage(&m, 500 * MI, 0), usage(&dsk, 0, 900 * MI)];
        // imagefs.available below upstream's 15 %: unused images are reclaimed first.
        let low_images = obs(Signal::ImagefsAvailable, 100 * MI, 1000 * MI);
        let d = decide(&Config::default(), &mut State::default(), &low_images, &pods, 0);
        assert!(d.disk_pressure);
        assert_eq!(d.reclaim, Some(Signal::ImagefsAvailable));
        assert_eq!(d.evict.as_ref().unwrap().name, "disk", "the eviction planned if the reclaim does not relieve it");
        // Memory comes first and has nothing to reclaim at node level.
        let mut both = low_images.clone();
        both.insert(Signal::MemoryAvailable, Observation { available: 0, capacity: 1 << 30 });
        let d = decide(&Config::default(), &mut State::default(), &both, &pods, 0);
        assert_eq!((d.reclaim, d.evict.unwrap().name.as_str()), (None, "mem"));
        // A soft disk threshold within its grace period: nothing ready, nothing reclaimed.
        let cfg = Config {
            hard: BTreeMap::new(),
            soft: BTreeMap::from([(Signal::NodefsAvailable, Threshold::Percent(50.0))]),
            soft_grace: BTreeMap::from([(Signal::NodefsAvailable, Duration::from_secs(60))]),
            ..Config::default()
        };
        let d = decide(&cfg, &mut State::default(), &obs(Signal::NodefsAvailable, 100 * MI, 1000 * MI), &pods, 0);
        assert!(d.disk_pressure && d.reclaim.is_none() && d.evict.is_none());
    }

    #[test]
    fn starved_after_reclaim_looks_at_every_threshold_of_the_resource() {
        let cfg = Config::default(); // nodefs.available < 10 %, imagefs.available < 15 %
        let at = |nodefs: u64, imagefs: u64| {
            let mut o = obs(Signal::NodefsAvailable, nodefs * MI, 1000 * MI);
            o.insert(Signal::ImagefsAvailable, Observation { available: imagefs * MI, capacity: 1000 * MI });
            o
        };
        assert!(starved(&cfg, &at(500, 100), "ephemeral-storage"), "imagefs still below 15 %");
        assert!(starved(&cfg, &at(50, 500), "ephemeral-storage"), "nodefs below 10 %");
        assert!(!starved(&cfg, &at(500, 200), "ephemeral-storage"), "relieved");
        assert!(!starved(&cfg, &at(50, 100), "memory"), "another resource");
        // A soft threshold counts too (upstream looks at every threshold met).
        let soft = Config {
            soft: BTreeMap::from([(Signal::ImagefsAvailable, Threshold::Percent(30.0))]),
            soft_grace: BTreeMap::from([(Signal::ImagefsAvailable, Duration::from_secs(60))]),
            ..Config::default()
        };
        assert!(starved(&soft, &at(500, 200), "ephemeral-storage"));
    }

    #[test]
    fn imagefs_signals_rank_by_what_the_pod_holds_on_the_image_filesystem() {
        let (logs, layers) = (pod("logs", json!({})), pod("layers", json!({})));
        // On a dedicated image filesystem: "logs" writes its volumes and logs (node fs),
        // "layers" its containers' writable layers (image fs).
        let pods = [
            PodUsage { pod: &logs, memory: 0, disk: 800 * MI, inodes: 9000, imagefs_disk: 0, imagefs_inodes: 0, processes: 0 },
            PodUsage { pod: &layers, memory: 0, disk: 100 * MI, inodes: 10, imagefs_disk: 300 * MI, imagefs_inodes: 5000, processes: 0 },
        ];
        let names = |s: Signal| -> Vec<String> { rank(s, &pods).iter().map(|p| p.pod.metadata.name.clone().unwrap()).collect() };
        assert_eq!(names(Signal::NodefsAvailable), ["logs", "layers"]);
        assert_eq!(names(Signal::ImagefsAvailable), ["layers", "logs"]);
        assert_eq!(names(Signal::NodefsInodesFree), ["logs", "layers"]);
        assert_eq!(names(Signal::ImagefsInodesFree), ["layers", "logs"]);
        let d = decide(&Config::default(), &mut State::default(), &obs(Signal::ImagefsAvailable, 100 * MI, 1000 * MI), &pods, 0);
        let e = d.evict.unwrap();
        assert_eq!(e.name, "layers");
        assert_eq!(
            e.message,
            "The node was low on resource: ephemeral-storage. Threshold quantity: 150Mi, available: 100Mi. Pod was using 300Mi, request is 0, has larger consumption of ephemeral-storage. "
        );
    }

    #[test]
    fn allocatable_memory_evicts_when_the_pods_use_more_than_allocatable_whatever_the_node_has() {
        let hard = with_allocatable_thresholds(Config::default().hard);
        assert_eq!(hard[&Signal::AllocatableMemoryAvailable], Threshold::Quantity(100 * MI));
        // a threshold of its own stays; no memory.available threshold, none added
        let own = BTreeMap::from([(Signal::MemoryAvailable, Threshold::Quantity(MI)), (Signal::AllocatableMemoryAvailable, Threshold::Percent(5.0))]);
        assert_eq!(with_allocatable_thresholds(own)[&Signal::AllocatableMemoryAvailable], Threshold::Percent(5.0));
        assert!(!with_allocatable_thresholds(BTreeMap::new()).contains_key(&Signal::AllocatableMemoryAvailable));
        assert_eq!(Signal::parse("allocatableMemory.available"), Some(Signal::AllocatableMemoryAvailable));

        let cfg = Config { hard, ..Config::default() };
        let (big, small) = (pod("big", json!({})), pod("small", json!({})));
        let pods = [usage(&big, 900 * MI, 0), usage(&small, 50 * MI, 0)];
        // the node has plenty (8 GiB available) but the pods use 950Mi of 1Gi allocatable
        let mut o = obs(Signal::MemoryAvailable, 8 << 30, 16 << 30);
        o.insert(Signal::AllocatableMemoryAvailable, allocatable_memory(1 << 30, 950 * MI));
        let d = decide(&cfg, &mut State::default(), &o, &pods, 0);
        let e = d.evict.unwrap();
        assert_eq!((e.name.as_str(), e.signal), ("big", Signal::AllocatableMemoryAvailable));
        assert!(d.memory_pressure, "MemoryPressure, as upstream's signal-to-condition map");
        assert!(d.reclaim.is_none(), "no node-level reclaim for memory");
        assert!(e.message.starts_with("The node was low on resource: memory. Threshold quantity: 100Mi, available: 74Mi. "), "{}", e.message);
        // under allocatable by more than the threshold: nothing
        o.insert(Signal::AllocatableMemoryAvailable, allocatable_memory(1 << 30, 900 * MI));
        assert!(decide(&cfg, &mut State::default(), &o, &pods, 0).evict.is_none());
        // pods above allocatable: none available, not an underflow
        assert_eq!(allocatable_memory(MI, 2 * MI), Observation { available: 0, capacity: MI });
    }

    #[test]
    fn nothing_met_nothing_done() {
        let p = pod("idle", json!({}));
        let d = decide(&Config::default(), &mut State::default(), &obs(Signal::MemoryAvailable, 1 << 30, 2 << 30), &[usage(&p, 0, 0)], 0);
        assert_eq!(d, Decision::default());
    }
}
