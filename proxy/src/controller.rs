//! The sync loop: informers on Services, EndpointSlices and this Node feed one level-triggered
//! `sync` (build the model of every family, hand it to the mode's [`Backend`], which diffs it
//! against what it committed last and applies the difference in one atomic step per family).
//!
//! Timing as upstream's BoundedFrequencyRunner: a change syncs at once unless the last sync
//! that had something to write started less than `min_sync_period` ago (unlike upstream, a
//! periodic sync that found nothing changed does not hold back the change that follows it:
//! the rate limit bounds how often rules are written, and that sync wrote none); nothing
//! changing still syncs every `sync_period`;
//! a full sync happens at start, after a failure, every `full_sync_period` and when the
//! backend's drift check (every `drift_check_period`) finds its rules damaged.
//!
//! After every successful sync, rules first as upstream, the stale UDP flows of what changed
//! since the last successful sync are deleted through the injected [`Conntrack`] (see
//! [`crate::conntrack`]); a failed deletion is logged and counted, never fails the sync.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Node;
use crate::slim::Service;
use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::Instrument as _;

use ferro_runtime::{Change, Informer};

use crate::conntrack::{self, Conntrack};
use crate::error::SyncError;
use crate::health::Health;
use crate::metrics::Metrics;
use crate::slim::EndpointSlice;
use crate::model::{self, Family, FamilyModel, NodeInfo, Problem, ServiceEntry, ServicePortName, LABEL_ZONE};

/// What a mode's backend did in one sync.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// The whole ruleset was written (else only what changed).
    pub full: bool,
    /// Rules written, per table (for kubeproxy_sync_proxy_rules_iptables_total).
    pub rules: Vec<(String, u64)>,
}

/// One proxy mode: turns models into kernel state. Implementations keep what they committed
/// last, so a partial sync is computed against their own state, never by listing the kernel.
pub trait Backend: Send + 'static {
    /// Applies `models` (one per family). `full` asks for a complete rewrite (start, after a
    /// failure, drift, the periodic full sync). On error nothing of that family may be left
    /// half-applied, and the next call gets `full`.
    fn sync(&mut self, models: &[FamilyModel], node: &NodeInfo, full: bool) -> Result<SyncReport, SyncError>;
    /// [`Backend::sync`], told which service ports may differ from what the last successful
    /// sync committed (`changed`, per family; every other service port is as then), so that a
    /// partial sync need not compare every service port. Backends whose diff is cheap keep
    /// this default, which compares everything.
    fn sync_changed(&mut self, models: &[FamilyModel], node: &NodeInfo, full: bool, _changed: &Changes) -> Result<SyncReport, SyncError> {
        self.sync(models, node, full)
    }
    /// A cheap check that the rules this backend wrote are still in place (e.g. a canary).
    fn drifted(&mut self) -> bool;
}

/// Timing of the loop.
#[derive(Debug, Clone)]
pub struct LoopConfig {
    pub node_name: String,
    pub families: Vec<Family>,
    pub sync_period: Duration,
    pub min_sync_period: Duration,
    pub full_sync_period: Duration,
    pub drift_check_period: Duration,
}

/// The informers the loop reads.
#[derive(Clone)]
pub struct Inputs {
    pub services: Arc<Informer<Service>>,
    pub slices: Arc<Informer<EndpointSlice>>,
    pub nodes: Arc<Informer<Node>>,
}


/// This node as the model needs it, and whether /healthz may call it eligible.
pub fn node_info(name: &str, node: Option<&Node>) -> (NodeInfo, bool) {
    let zone = node.and_then(|n| n.metadata.labels.as_ref()).and_then(|l| l.get(LABEL_ZONE)).cloned();
    let deleting = node.is_some_and(|n| n.metadata.deletion_timestamp.is_some());
    let tainted = node
        .and_then(|n| n.spec.as_ref())
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == "ToBeDeletedByClusterAutoscaler"));
    (NodeInfo { name: name.to_string(), zone }, !deleting && !tainted)
}

/// Wires informer handlers to the loop: every change wakes it and is counted. Returns the
/// EndpointSlice trigger times waiting for their sync (only those after this call, as
/// upstream's tracker ignores changes older than its start).
pub fn watch_changes(inputs: &Inputs, notify: Arc<Notify>, metrics: Arc<Metrics>, health: Arc<Health>) -> Arc<Mutex<Vec<SystemTime>>> {
    let triggers = Arc::new(Mutex::new(Vec::new()));
    let started = SystemTime::now();
    {
        let (notify, metrics, health) = (notify.clone(), metrics.clone(), health.clone());
        inputs.services.on_change(move |_c: &Change<Service>| {
            metrics.queued(false);
            health.queued(SystemTime::now());
            notify.notify_one();
        });
    }
    {
        let (notify, metrics, health, triggers) = (notify.clone(), metrics.clone(), health.clone(), triggers.clone());
        inputs.slices.on_change(move |c: &Change<EndpointSlice>| {
            if let Change::Applied { new, .. } = c {
                // when the change that caused it happened (the EndpointSlice controller's annotation)
                if let Some(ts) = new.trigger_time().map(SystemTime::from).filter(|t| *t > started) {
                    triggers.lock().unwrap_or_else(|p| p.into_inner()).push(ts);
                }
            }
            metrics.queued(true);
            health.queued(SystemTime::now());
            notify.notify_one();
        });
    }
    inputs.nodes.on_change(move |_c: &Change<Node>| {
        notify.notify_one();
    });
    triggers
}

/// What [`run`] reports after each sync (tests and the sd_notify READY wait on it).
#[derive(Debug, Clone, Default)]
pub struct Progress {
    pub syncs: u64,
    pub failures: u64,
    pub last: Option<SyncReport>,
    pub last_error: Option<String>,
    /// Conntrack entries deleted after syncs, and deletions that failed.
    pub conntrack_deleted: u64,
    pub conntrack_failures: u64,
}

/// Runs the loop until `shutdown` resolves. Rules stay in place on exit (a restart takes them
/// over; `--cleanup` removes them).
#[allow(clippy::too_many_arguments)]
pub async fn run<B: Backend, C: Conntrack>(
    cfg: LoopConfig,
    inputs: Inputs,
    backend: B,
    conntrack: C,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    notify: Arc<Notify>,
    triggers: Arc<Mutex<Vec<SystemTime>>>,
    progress: tokio::sync::watch::Sender<Progress>,
    on_problem: impl Fn(&Problem) + Send + 'static,
    shutdown: impl Future<Output = ()>,
) {
    let mut shutdown = std::pin::pin!(shutdown);
    tokio::select! {
        () = async {
            inputs.services.wait_synced().await;
            inputs.slices.wait_synced().await;
            inputs.nodes.wait_synced().await;
        } => {}
        () = &mut shutdown => return,
    }
    tracing::info!("informers synced; programming rules");
    let mut backend = Some(backend);
    let mut conntrack = Some(conntrack);
    // The models, kept from sync to sync and changed in place by the model cache (only the
    // service ports of Services whose objects changed are written).
    let mut models: Vec<FamilyModel> =
        cfg.families.iter().map(|f| FamilyModel { family: *f, services: Default::default() }).collect();
    // What the last successful sync programmed differs from `models` only in these service
    // ports, each with its entry as then programmed (None: absent; everything is absent before
    // the first sync, so then every UDP frontend's flows that do not go to a serving endpoint
    // are stale). The conntrack planner and the backend's diff look at these only.
    let mut unsynced: BTreeMap<Family, BTreeMap<ServicePortName, Option<Arc<ServiceEntry>>>> =
        cfg.families.iter().map(|f| (*f, BTreeMap::new())).collect();
    let mut need_full = true;
    let mut last_full = Instant::now();
    let mut last_start: Option<Instant> = None;
    let mut known_problems: BTreeSet<String> = BTreeSet::new();
    // Services whose object and slices did not change are not parsed again
    let mut model_cache = model::ModelCache::default();
    // Service ports whose rules the kernel refused, with the entry it refused and why: left
    // out of the models (the others are programmed) until their entry changes.
    let mut quarantine: BTreeMap<(Family, ServicePortName), (Arc<ServiceEntry>, String)> = BTreeMap::new();
    let mut drift_tick = tokio::time::interval(cfg.drift_check_period);
    drift_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    drift_tick.tick().await;
    loop {
        // min_sync_period between the starts of two syncs that write
        if let Some(t) = last_start {
            let earliest = t + cfg.min_sync_period;
            tokio::select! {
                () = tokio::time::sleep_until(earliest) => {}
                () = &mut shutdown => break,
            }
        }
        if last_full.elapsed() >= cfg.full_sync_period {
            need_full = true;
        }
        let previous_start = last_start.replace(Instant::now());
        // Level-triggered: whatever woke us before this point is covered by this sync.
        let _ = futures::FutureExt::now_or_never(notify.notified());
        let (node, eligible) = node_info(&cfg.node_name, inputs.nodes.get(None, &cfg.node_name).as_deref());
        health.set_node_eligible(eligible);
        let services = inputs.services.list();
        let slices = inputs.slices.list();
        let mut problems = Vec::new();
        for m in models.iter_mut() {
            let (changes, p) = model_cache.update(m, &services, &slices, &node);
            problems.extend(p);
            note_changes(unsynced.entry(m.family).or_default(), changes);
        }
        leave_out_refused(&mut models, &mut quarantine, &mut problems, &mut unsynced, &model_cache);
        drop(services);
        drop(slices);
        let mut now_problems = BTreeSet::new();
        for p in &problems {
            let text = p.to_string();
            if !known_problems.contains(&text) {
                tracing::warn!(problem = %text, "input left out of the rules");
                on_problem(p);
            }
            now_problems.insert(text);
        }
        known_problems = now_problems;
        let pending_triggers: Vec<SystemTime> = std::mem::take(&mut *triggers.lock().unwrap_or_else(|p| p.into_inner()));

        let full = need_full;
        let Some(mut b) = backend.take() else { break };
        let span = tracing::info_span!("sync", full, service_ports = models.iter().map(|m| m.services.len()).sum::<usize>());
        let started = std::time::Instant::now();
        let hint: Changes = unsynced.iter().map(|(f, c)| (*f, c.keys().cloned().collect())).collect();
        if !full && hint.values().all(BTreeSet::is_empty) {
            // nothing to write (the periodic sync with nothing changed): not rate-limited
            last_start = previous_start;
        }
        let joined = tokio::task::spawn_blocking(move || {
            let r = b.sync_changed(&models, &node, full, &hint);
            (b, r, models, node)
        })
        .instrument(span.clone())
        .await;
        let (b, result, returned, node) = match joined {
            Ok(x) => x,
            Err(e) => {
                tracing::error!(error = %e, "sync task failed");
                break;
            }
        };
        backend = Some(b);
        models = returned;
        let took = started.elapsed();
        let _enter = span.enter();
        let mut synced = None;
        match result {
            Ok(report) => {
                need_full = false;
                if report.full {
                    last_full = Instant::now();
                }
                let now = SystemTime::now();
                for f in &cfg.families {
                    health.updated(*f, now);
                }
                for t in pending_triggers {
                    if let Ok(d) = now.duration_since(t) {
                        metrics.network_programming(d);
                    }
                }
                metrics.synced(took, report.full, report.rules.clone());
                if report.full {
                    // the full render's strings are freed: give their pages back
                    crate::mem::release_freed();
                }
                tracing::info!(took_ms = took.as_millis() as u64, full = report.full, "synced");
                synced = Some(report);
            }
            Err(e) => {
                need_full = true;
                metrics.restore_failed();
                if let SyncError::Refused { family, service, source } = &e {
                    if let Some(entry) = models.iter().find(|m| m.family == *family).and_then(|m| m.services.get(&**service)) {
                        tracing::warn!(%service, ?family, error = %source, "the kernel refused one service port's rules; leaving it out");
                        quarantine.insert((*family, (**service).clone()), (entry.clone(), source.to_string()));
                    }
                }
                tracing::warn!(error = %e, source = ?std::error::Error::source(&e).map(ToString::to_string), "sync failed; retrying with a full sync");
                progress.send_modify(|p| {
                    p.failures += 1;
                    p.last_error = Some(format!("{e}: {}", std::error::Error::source(&e).map(ToString::to_string).unwrap_or_default()));
                });
            }
        }
        drop(_enter);
        if let Some(report) = synced {
            // rules first, then conntrack (upstream's order): a flow deleted now is re-created
            // by its next packet through the new rules. Only the service ports that changed
            // since the last successful sync can call for a deletion.
            let deletions: Vec<conntrack::Flows> = models
                .iter()
                .flat_map(|m| {
                    let changed = unsynced.get(&m.family).into_iter().flatten();
                    conntrack::plan_changes(m.family, changed.map(|(name, old)| (name, old.as_deref(), m.services.get(name).map(|e| &**e))), &node)
                })
                .collect();
            for c in unsynced.values_mut() {
                c.clear();
            }
            let mut outcome = conntrack::Outcome::default();
            if !deletions.is_empty() {
                let Some(mut ct) = conntrack.take() else { break };
                let joined = tokio::task::spawn_blocking(move || {
                    let o = conntrack::execute(&mut ct, &deletions);
                    (ct, o)
                })
                .instrument(span.clone())
                .await;
                match joined {
                    Ok((ct, o)) => {
                        conntrack = Some(ct);
                        outcome = o;
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "conntrack task failed");
                        break;
                    }
                }
                let (deleted, failed) = (outcome.deleted, outcome.failed);
                span.in_scope(|| tracing::info!(deleted, failed, "stale conntrack entries cleaned"));
            }
            progress.send_modify(|p| {
                p.syncs += 1;
                p.last = Some(report);
                p.last_error = None;
                p.conntrack_deleted += outcome.deleted as u64;
                p.conntrack_failures += outcome.failed as u64;
            });
        }
        // wait for the next reason to sync
        let deadline = Instant::now() + if need_full { cfg.min_sync_period } else { cfg.sync_period };
        loop {
            tokio::select! {
                () = notify.notified() => break,
                () = tokio::time::sleep_until(deadline) => break,
                _ = drift_tick.tick() => {
                    let Some(mut b) = backend.take() else { break };
                    let (b, drifted) = match tokio::task::spawn_blocking(move || { let d = b.drifted(); (b, d) }).await {
                        Ok(x) => x,
                        Err(e) => {
                            tracing::error!(error = %e, "drift check task failed");
                            return;
                        }
                    };
                    backend = Some(b);
                    if drifted {
                        tracing::warn!("rules changed behind ferro-proxy's back; full sync");
                        need_full = true;
                        break;
                    }
                }
                () = &mut shutdown => {
                    tracing::info!("shutting down; rules stay in place");
                    return;
                }
            }
        }
    }
}

/// Per family, the service ports whose entries may differ from those the backend committed at
/// its last successful sync (the others are the same): the backend's diff need not look at
/// the rest.
pub type Changes = BTreeMap<Family, BTreeSet<ServicePortName>>;

/// Notes service ports the model cache changed: the first entry noted for a service port since
/// the last successful sync is the one that sync programmed.
fn note_changes(unsynced: &mut BTreeMap<ServicePortName, Option<Arc<ServiceEntry>>>, changes: Vec<model::Changed>) {
    for (name, before) in changes {
        unsynced.entry(name).or_insert(before);
    }
}

/// Takes the quarantined service ports out of `models` (each a [`Problem::Refused`]) and
/// forgets those whose entry changed or went: they are tried again. The models are kept from
/// sync to sync, so a service port taken out stays out until the model cache writes it again
/// (its Service or slices changed): then it is in the model with an entry that is either the
/// refused one (another port of its Service changed: taken out again) or a new one (tried).
fn leave_out_refused(
    models: &mut [FamilyModel],
    quarantine: &mut BTreeMap<(Family, ServicePortName), (Arc<ServiceEntry>, String)>,
    problems: &mut Vec<Problem>,
    unsynced: &mut BTreeMap<Family, BTreeMap<ServicePortName, Option<Arc<ServiceEntry>>>>,
    cache: &model::ModelCache,
) {
    if quarantine.is_empty() {
        // the usual case: nothing to look up
        return;
    }
    quarantine.retain(|(family, name), (entry, message)| {
        let Some(m) = models.iter_mut().find(|m| m.family == *family) else { return false };
        match m.services.get(name) {
            Some(e) if e == &*entry => {
                // (back) in the model with the entry the kernel refused: out again
                if let Some(before) = m.services.remove(name) {
                    unsynced.entry(*family).or_default().entry(name.clone()).or_insert(Some(before));
                }
            }
            // a new entry: tried again
            Some(_) => return false,
            // still out, while its Service still has the port; else gone: forgotten
            None if cache.has_port(*family, name) => {}
            None => return false,
        }
        problems.push(Problem::Refused {
            service: format!("{}/{}", name.namespace, name.name),
            port: name.port.to_string(),
            family: *family,
            message: message.clone(),
        });
        true
    });
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use kube::runtime::watcher::Event;
    use serde_json::json;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// A recording backend: every sync's (full, number of service ports, endpoints).
    #[derive(Clone, Default)]
    struct Fake {
        log: Arc<Mutex<Vec<(bool, usize, usize)>>>,
        fail_next: Arc<AtomicBool>,
        drift: Arc<AtomicBool>,
        /// A Service whose rules the "kernel" refuses whenever they are in the models.
        refuse: Arc<Mutex<Option<String>>>,
        /// Backend syncs and conntrack deletions in the order they happened.
        events: Arc<Mutex<Vec<String>>>,
        /// The models of the last successful sync, and every service port whose entry
        /// differed from them without being named as changed (must stay empty).
        last_ok: Arc<Mutex<Option<Vec<FamilyModel>>>>,
        unnamed: Arc<Mutex<Vec<String>>>,
    }

    /// The recording conntrack fake, also writing into the backend's event log.
    #[derive(Clone)]
    struct Ct {
        rec: conntrack::Recorder,
        events: Arc<Mutex<Vec<String>>>,
    }

    impl Conntrack for Ct {
        fn delete(&mut self, flows: &conntrack::Flows) -> Result<usize, crate::error::ConntrackError> {
            self.events.lock().unwrap().push(format!("conntrack {flows}"));
            self.rec.delete(flows).map(|_| 1)
        }
    }

    impl Backend for Fake {
        fn sync(&mut self, models: &[FamilyModel], _node: &NodeInfo, full: bool) -> Result<SyncReport, SyncError> {
            if self.fail_next.swap(false, Ordering::SeqCst) {
                return Err(SyncError::Unsupported("refused".into()));
            }
            if let Some(bad) = self.refuse.lock().unwrap().clone() {
                for m in models {
                    if let Some(service) = m.services.keys().find(|k| *k.name == *bad) {
                        self.events.lock().unwrap().push(format!("refused {bad}"));
                        return Err(SyncError::Refused {
                            family: m.family,
                            service: Box::new(service.clone()),
                            source: crate::error::ExecError::Failed {
                                program: "iptables-restore".into(),
                                status: "exit status: 2".into(),
                                stderr: "Error occurred at line: 7".into(),
                            },
                        });
                    }
                }
            }
            let ports: usize = models.iter().map(|m| m.services.len()).sum();
            let eps: usize = models.iter().flat_map(|m| m.services.values()).map(|e| e.endpoints.len()).sum();
            self.log.lock().unwrap().push((full, ports, eps));
            self.events.lock().unwrap().push(format!("sync full={full}"));
            Ok(SyncReport { full, rules: vec![] })
        }
        fn sync_changed(&mut self, models: &[FamilyModel], node: &NodeInfo, full: bool, changed: &Changes) -> Result<SyncReport, SyncError> {
            if let Some(last) = self.last_ok.lock().unwrap().as_ref() {
                for (m, l) in models.iter().zip(last) {
                    let named = changed.get(&m.family);
                    for name in m.services.keys().chain(l.services.keys()) {
                        if m.services.get(name) != l.services.get(name) && !named.is_some_and(|n| n.contains(name)) {
                            self.unnamed.lock().unwrap().push(name.to_string());
                        }
                    }
                }
            }
            let r = self.sync(models, node, full);
            if r.is_ok() {
                *self.last_ok.lock().unwrap() = Some(models.to_vec());
            }
            r
        }

        fn drifted(&mut self) -> bool {
            self.drift.swap(false, Ordering::SeqCst)
        }
    }

    struct World {
        inputs: Inputs,
        fake: Fake,
        ct: conntrack::Recorder,
        progress: tokio::sync::watch::Receiver<Progress>,
        problems: Arc<Mutex<Vec<String>>>,
        health: Arc<Health>,
        metrics: Arc<Metrics>,
        _stop: tokio::sync::oneshot::Sender<()>,
    }

    /// A new resourceVersion for every object made, as an API server gives every write.
    fn next_rv() -> String {
        static RV: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        RV.fetch_add(1, Ordering::SeqCst).to_string()
    }

    fn svc(name: &str, ip: &str) -> Service {
        serde_json::from_value(json!({
            "metadata": {"namespace": "ns", "name": name, "resourceVersion": next_rv()},
            "spec": {"clusterIP": ip, "ports": [{"port": 80}]},
        }))
        .unwrap()
    }

    fn udp_svc(name: &str, ip: &str) -> Service {
        serde_json::from_value(json!({
            "metadata": {"namespace": "ns", "name": name, "resourceVersion": next_rv()},
            "spec": {"clusterIP": ip, "ports": [{"name": "dns", "port": 53, "protocol": "UDP"}]},
        }))
        .unwrap()
    }

    fn udp_slice(name: &str, ips: &[&str]) -> EndpointSlice {
        let eps: Vec<_> = ips.iter().map(|ip| json!({"addresses": [ip]})).collect();
        serde_json::from_value(json!({
            "metadata": {"namespace": "ns", "name": format!("{name}-x"), "resourceVersion": next_rv(),
                         "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4",
            "ports": [{"name": "dns", "port": 5353, "protocol": "UDP"}],
            "endpoints": eps,
        }))
        .unwrap()
    }

    fn slice(name: &str, ips: &[&str]) -> EndpointSlice {
        slice_at(name, ips, "2026-01-01T00:00:00Z")
    }

    fn slice_at(name: &str, ips: &[&str], trigger: &str) -> EndpointSlice {
        let eps: Vec<_> = ips.iter().map(|ip| json!({"addresses": [ip]})).collect();
        serde_json::from_value(json!({
            "metadata": {"namespace": "ns", "name": format!("{name}-x"), "resourceVersion": next_rv(),
                         "labels": {"kubernetes.io/service-name": name},
                         "annotations": {crate::slim::TRIGGER_TIME: trigger}},
            "addressType": "IPv4",
            "ports": [{"port": 8080, "protocol": "TCP"}],
            "endpoints": eps,
        }))
        .unwrap()
    }

    fn start(services: Vec<Service>, slices: Vec<EndpointSlice>) -> World {
        let inputs = Inputs { services: Informer::new(), slices: Informer::new(), nodes: Informer::new() };
        let notify = Arc::new(Notify::new());
        let metrics = Arc::new(Metrics::default());
        let health = Arc::new(Health::new(Duration::from_secs(30), vec![Family::V4]));
        let triggers = watch_changes(&inputs, notify.clone(), metrics.clone(), health.clone());
        let mut buf = None;
        inputs.services.inject(Event::Init, &mut buf);
        for s in services {
            inputs.services.inject(Event::InitApply(s), &mut buf);
        }
        inputs.services.inject(Event::InitDone, &mut buf);
        let mut buf = None;
        inputs.slices.inject(Event::Init, &mut buf);
        for s in slices {
            inputs.slices.inject(Event::InitApply(s), &mut buf);
        }
        inputs.slices.inject(Event::InitDone, &mut buf);
        let mut buf = None;
        inputs.nodes.inject(Event::Init, &mut buf);
        inputs.nodes.inject(Event::InitDone, &mut buf);
        let fake = Fake::default();
        let ct = Ct { rec: conntrack::Recorder::default(), events: fake.events.clone() };
        let (tx, rx) = tokio::sync::watch::channel(Progress::default());
        let problems = Arc::new(Mutex::new(Vec::new()));
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let cfg = LoopConfig {
            node_name: "node-a".into(),
            families: vec![Family::V4],
            sync_period: Duration::from_secs(30),
            min_sync_period: Duration::from_secs(1),
            full_sync_period: Duration::from_secs(3600),
            drift_check_period: Duration::from_secs(2),
        };
        let p = problems.clone();
        tokio::spawn(run(
            cfg,
            inputs.clone(),
            fake.clone(),
            ct.clone(),
            health.clone(),
            metrics.clone(),
            notify,
            triggers,
            tx,
            move |problem| p.lock().unwrap().push(problem.to_string()),
            async move {
                let _ = stop_rx.await;
            },
        ));
        World { inputs, fake, ct: ct.rec, progress: rx, problems, health, metrics, _stop: stop_tx }
    }

    async fn wait_syncs(w: &mut World, n: u64) -> Progress {
        let p = w.progress.wait_for(|p| p.syncs + p.failures >= n).await.unwrap().clone();
        assert!(w.fake.unnamed.lock().unwrap().is_empty(), "changed but not named to the backend: {:?}", w.fake.unnamed.lock().unwrap());
        p
    }

    fn apply<K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static>(inf: &Informer<K>, obj: K) {
        let mut buf = None;
        inf.inject(Event::Apply(obj), &mut buf);
    }

    #[tokio::test(start_paused = true)]
    async fn first_sync_is_full_and_changes_sync_partially() {
        let mut w = start(vec![svc("a", "10.96.0.1")], vec![slice("a", &["10.244.0.1"])]);
        wait_syncs(&mut w, 1).await;
        assert_eq!(*w.fake.log.lock().unwrap(), [(true, 1, 1)]);
        assert!(w.health.answer(false, SystemTime::now()).healthy);
        let t0 = Instant::now();
        let now = jiff::Timestamp::now().to_string();
        apply(&w.inputs.slices, slice_at("a", &["10.244.0.1", "10.244.0.2"], &now));
        wait_syncs(&mut w, 2).await;
        // min_sync_period: not before 1 s after the first sync started
        assert!(Instant::now() - t0 >= Duration::from_millis(999), "{:?}", Instant::now() - t0);
        assert_eq!(w.fake.log.lock().unwrap()[1], (false, 1, 2));
        assert_eq!(w.metrics.syncs(), 2);
        assert!(w.metrics.render().contains("kubeproxy_network_programming_duration_seconds_count 1"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_of_changes_is_one_sync() {
        let mut w = start(vec![], vec![]);
        wait_syncs(&mut w, 1).await;
        for i in 0..50 {
            apply(&w.inputs.services, svc(&format!("s{i}"), &format!("10.96.1.{i}")));
        }
        wait_syncs(&mut w, 2).await;
        assert_eq!(w.fake.log.lock().unwrap()[1], (false, 50, 0));
        // nothing more queued: the next sync is the periodic one, 30 s later
        let t = Instant::now();
        wait_syncs(&mut w, 3).await;
        assert!(Instant::now() - t >= Duration::from_secs(29));
        assert_eq!(w.fake.log.lock().unwrap().len(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_right_after_a_periodic_sync_that_wrote_nothing_syncs_at_once() {
        let mut w = start(vec![svc("a", "10.96.0.1")], vec![slice("a", &["10.244.0.1"])]);
        wait_syncs(&mut w, 1).await;
        // nothing changes: the periodic sync, 30 s later, has nothing to write
        wait_syncs(&mut w, 2).await;
        assert_eq!(w.fake.log.lock().unwrap()[1], (false, 1, 1));
        let t = Instant::now();
        apply(&w.inputs.slices, slice("a", &["10.244.0.1", "10.244.0.2"]));
        wait_syncs(&mut w, 3).await;
        assert!(Instant::now() - t < Duration::from_millis(100), "held back {:?} by a sync that wrote nothing", Instant::now() - t);
        assert_eq!(w.fake.log.lock().unwrap()[2], (false, 1, 2));
        // that sync wrote: the next change waits for min_sync_period
        let t = Instant::now();
        apply(&w.inputs.slices, slice("a", &["10.244.0.3"]));
        wait_syncs(&mut w, 4).await;
        assert!(Instant::now() - t >= Duration::from_millis(999), "{:?}", Instant::now() - t);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_sync_is_retried_in_full() {
        let mut w = start(vec![svc("a", "10.96.0.1")], vec![]);
        wait_syncs(&mut w, 1).await;
        w.fake.fail_next.store(true, Ordering::SeqCst);
        apply(&w.inputs.services, svc("b", "10.96.0.2"));
        let p = wait_syncs(&mut w, 2).await;
        assert_eq!(p.failures, 1);
        assert!(p.last_error.unwrap().contains("refused"));
        wait_syncs(&mut w, 3).await;
        assert_eq!(w.fake.log.lock().unwrap()[1], (true, 2, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn drift_forces_a_full_sync_within_the_check_period() {
        let mut w = start(vec![svc("a", "10.96.0.1")], vec![]);
        wait_syncs(&mut w, 1).await;
        let t = Instant::now();
        w.fake.drift.store(true, Ordering::SeqCst);
        wait_syncs(&mut w, 2).await;
        assert!(Instant::now() - t <= Duration::from_secs(3));
        assert_eq!(w.fake.log.lock().unwrap()[1], (true, 1, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_service_port_the_kernel_refuses_is_left_out_until_it_changes() {
        let mut w = start(vec![svc("a", "10.96.0.1"), svc("bad", "10.96.0.9")], vec![]);
        *w.fake.refuse.lock().unwrap() = Some("bad".into());
        let p = wait_syncs(&mut w, 2).await;
        assert_eq!((p.failures, p.syncs), (1, 1));
        // the retry left "bad" out and programmed the rest, in full
        assert_eq!(*w.fake.log.lock().unwrap(), [(true, 1, 0)]);
        let problems = w.problems.lock().unwrap().clone();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("service ns/bad") && problems[0].contains("refused"), "{problems:?}");
        // other changes go on being synced without it, and the problem is not reported again
        apply(&w.inputs.services, svc("c", "10.96.0.3"));
        wait_syncs(&mut w, 3).await;
        assert_eq!(w.fake.log.lock().unwrap()[1], (false, 2, 0));
        assert_eq!(w.problems.lock().unwrap().len(), 1);
        // a change to the refused Service is tried again (refused again here, then left out)
        apply(&w.inputs.services, svc("bad", "10.96.0.10"));
        let p = wait_syncs(&mut w, 5).await;
        assert_eq!(p.failures, 2);
        assert_eq!(w.fake.events.lock().unwrap().iter().filter(|e| *e == "refused bad").count(), 2);
        // the kernel takes it now: once its entry changes again it is programmed
        *w.fake.refuse.lock().unwrap() = None;
        apply(&w.inputs.services, svc("bad", "10.96.0.11"));
        wait_syncs(&mut w, 6).await;
        assert_eq!(w.fake.log.lock().unwrap().last().unwrap().1, 3, "a, c and bad");
    }

    #[tokio::test(start_paused = true)]
    async fn bad_input_is_reported_once_and_the_rest_synced() {
        let mut bad = svc("bad", "10.96.0.9");
        bad.spec.as_mut().unwrap().external_ips = Some(vec!["999.1.1.1".into()]);
        let mut w = start(vec![svc("a", "10.96.0.1"), bad], vec![]);
        wait_syncs(&mut w, 1).await;
        assert_eq!(*w.fake.log.lock().unwrap(), [(true, 2, 0)]);
        apply(&w.inputs.services, svc("c", "10.96.0.3"));
        wait_syncs(&mut w, 2).await;
        let problems = w.problems.lock().unwrap().clone();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("999.1.1.1"));
    }

    fn ip(s: &str) -> std::net::IpAddr {
        s.parse().unwrap()
    }

    fn gone(dst: &str, endpoint: &str) -> conntrack::Flows {
        conntrack::Flows {
            family: Family::V4,
            protocol: model::Protocol::Udp,
            dst: Some(ip(dst)),
            dst_port: 53,
            reply: conntrack::Reply::From(ip(endpoint)),
        }
    }

    fn stuck(dst: &str, keep: &[&str]) -> conntrack::Flows {
        conntrack::Flows {
            family: Family::V4,
            protocol: model::Protocol::Udp,
            dst: Some(ip(dst)),
            dst_port: 53,
            reply: conntrack::Reply::NotFrom(keep.iter().map(|s| ip(s)).collect()),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn stale_udp_flows_are_deleted_after_the_rules_are_synced() {
        let mut w = start(
            vec![udp_svc("dns", "10.96.0.10"), svc("web", "10.96.0.1")],
            vec![udp_slice("dns", &["10.244.0.5"]), slice("web", &["10.244.0.9"])],
        );
        let p = wait_syncs(&mut w, 1).await;
        // first sync after a start: flows to the UDP frontend that miss its endpoints
        assert_eq!(w.ct.deletions(), [stuck("10.96.0.10", &["10.244.0.5"])]);
        assert_eq!(p.conntrack_deleted, 1);
        // the endpoint pod is replaced: a partial sync, then its flows are deleted
        apply(&w.inputs.slices, udp_slice("dns", &["10.244.0.6"]));
        let p = wait_syncs(&mut w, 2).await;
        assert_eq!(w.fake.log.lock().unwrap()[1], (false, 2, 2));
        assert_eq!(w.ct.deletions()[1..], [gone("10.96.0.10", "10.244.0.5")]);
        assert_eq!((p.conntrack_deleted, p.conntrack_failures), (2, 0));
        let events = w.fake.events.lock().unwrap().clone();
        assert_eq!(
            events,
            [
                "sync full=true",
                "conntrack udp orig-dst 10.96.0.10:53 reply-src not 10.244.0.5",
                "sync full=false",
                "conntrack udp orig-dst 10.96.0.10:53 reply-src 10.244.0.5",
            ],
            "rules first, then conntrack"
        );
        // a TCP change and a periodic sync with nothing changed delete nothing
        apply(&w.inputs.slices, slice("web", &["10.244.0.10"]));
        wait_syncs(&mut w, 3).await;
        wait_syncs(&mut w, 4).await;
        assert_eq!(w.ct.deletions().len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn zero_to_one_endpoint_deletes_the_blackholed_flows() {
        let mut w = start(vec![udp_svc("dns", "10.96.0.10")], vec![udp_slice("dns", &[])]);
        wait_syncs(&mut w, 1).await;
        assert!(w.ct.deletions().is_empty(), "nothing to DNAT to yet");
        apply(&w.inputs.slices, udp_slice("dns", &["10.244.0.5"]));
        wait_syncs(&mut w, 2).await;
        assert_eq!(w.ct.deletions(), [stuck("10.96.0.10", &["10.244.0.5"])]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_sync_cleans_nothing_and_the_next_one_cleans_from_the_last_applied_state() {
        let mut w = start(vec![udp_svc("dns", "10.96.0.10")], vec![udp_slice("dns", &["10.244.0.5"])]);
        wait_syncs(&mut w, 1).await;
        w.fake.fail_next.store(true, Ordering::SeqCst);
        apply(&w.inputs.slices, udp_slice("dns", &["10.244.0.6"]));
        let p = wait_syncs(&mut w, 2).await;
        assert_eq!(p.failures, 1);
        assert_eq!(w.ct.deletions().len(), 1, "rules not applied: flows untouched");
        let p = wait_syncs(&mut w, 3).await;
        assert_eq!(p.syncs, 2);
        assert_eq!(w.ct.deletions()[1..], [gone("10.96.0.10", "10.244.0.5")]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_clean_up_is_counted_and_the_sync_stands() {
        let mut w = start(vec![udp_svc("dns", "10.96.0.10")], vec![udp_slice("dns", &["10.244.0.5"])]);
        wait_syncs(&mut w, 1).await;
        w.ct.fail.store(true, Ordering::SeqCst);
        apply(&w.inputs.slices, udp_slice("dns", &["10.244.0.6"]));
        let p = wait_syncs(&mut w, 2).await;
        assert_eq!((p.syncs, p.failures, p.conntrack_failures), (2, 0, 1));
        assert!(p.last_error.is_none());
        // the next sync is not made full by it
        apply(&w.inputs.services, svc("web", "10.96.0.1"));
        wait_syncs(&mut w, 3).await;
        assert!(!w.fake.log.lock().unwrap()[2].0);
    }

    #[test]
    fn node_info_reads_zone_and_eligibility() {
        let n: Node = serde_json::from_value(json!({
            "metadata": {"name": "n", "labels": {LABEL_ZONE: "z1"}},
            "spec": {"taints": [{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}]},
        }))
        .unwrap();
        let (info, eligible) = node_info("n", Some(&n));
        assert_eq!(info.zone.as_deref(), Some("z1"));
        assert!(!eligible);
        assert!(node_info("n", None).1);
    }
}
