//! Observing the runtime: one pod's sandboxes and containers as the agent models them, and the
//! relist (upstream's PLEG) that queues pods whose runtime state changed.

use super::*;

impl PodWorkers {
    /// The newest sandbox's addresses as a PodSandboxStatus of this agent gave them.
    fn sandbox_network(&self, uid: &str) -> Option<SandboxNetwork> {
        self.inner.states.lock().unwrap_or_else(|p| p.into_inner()).get(uid).and_then(|s| s.sandbox_network.clone())
    }

    /// Upstream's PLEG: relist containers and sandboxes every second and queue the pods whose
    /// state changed, unless the pod's last sync already saw the state the relist sees (the
    /// containers a sync started and observed do not sync the pod a second time).
    pub(super) async fn relist_loop(&self) {
        let mut last: Relisted = BTreeMap::new();
        let rt = self.inner.rt.clone();
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let (Ok(cs), Ok(sbs)) = (rt.list_containers(managed()).await, rt.list_sandboxes(managed()).await) else {
                continue;
            };
            let mut now: Relisted = BTreeMap::new();
            for c in &cs {
                if let Some(uid) = c.labels.get(model::LABEL_POD_UID) {
                    now.insert(c.id.clone(), (uid.clone(), Seen::Container(container_state(c.state))));
                }
            }
            for s in &sbs {
                if let Some(uid) = s.labels.get(model::LABEL_POD_UID) {
                    now.insert(s.id.clone(), (uid.clone(), Seen::Sandbox(sandbox_state(s.state))));
                }
            }
            self.inner
                .census
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .listed(now.values().map(|(uid, _)| uid.as_str()));
            let changed = {
                let observed = self.inner.observed.read().unwrap_or_else(|p| p.into_inner());
                relist_changes(&last, &now, &observed)
            };
            for uid in changed {
                self.inner.queue.add(uid);
            }
            last = now;
        }
    }

    /// Everything the runtime holds for pod `uid`, newest first. Nothing, without asking the
    /// runtime, for a pod the [`Census`] knows it holds nothing for (the first sync of a new
    /// pod).
    pub(super) async fn observe(&self, uid: &str) -> Result<PodRuntime, CriError> {
        if self.inner.census.lock().unwrap_or_else(|p| p.into_inner()).holds_nothing(uid) {
            return Ok(PodRuntime { uid: uid.to_string(), ..Default::default() });
        }
        let rt = self.inner.rt.clone();
        let sel = HashMap::from([
            (model::LABEL_POD_UID.to_string(), uid.to_string()),
            (model::LABEL_MANAGED_BY.to_string(), model::MANAGED_BY.to_string()),
        ]);
        let mut out = PodRuntime { uid: uid.to_string(), ..Default::default() };
        let mut sbs = rt.list_sandboxes(sel.clone()).await?;
        // newest first; the attempt breaks ties (a sandbox whose start failed can have no
        // creation time)
        sbs.sort_by_key(|s| std::cmp::Reverse((s.created_at, s.metadata.as_ref().map_or(0, |m| m.attempt))));
        for (i, s) in sbs.iter().enumerate() {
            let md = s.metadata.clone().unwrap_or_default();
            out.name = md.name.clone();
            out.namespace = md.namespace.clone();
            let state = sandbox_state(s.state);
            let (mut ip, mut additional) = (None, Vec::new());
            if i == 0 && state == SandboxState::Ready {
                let known = self.sandbox_network(uid).filter(|n| n.id == s.id);
                if let Some(n) = known {
                    (ip, additional) = (n.ip, n.additional_ips);
                } else if let Some(st) = rt.sandbox_status(&s.id).await? {
                    if let Some(n) = st.network {
                        ip = Some(n.ip).filter(|x| !x.is_empty());
                        additional = n.additional_ips.into_iter().map(|p| p.ip).collect();
                    }
                    let network = SandboxNetwork { id: s.id.clone(), ip: ip.clone(), additional_ips: additional.clone() };
                    self.with_state(uid, |st| st.sandbox_network = Some(network));
                }
            }
            out.sandboxes.push(Sandbox {
                id: s.id.clone(),
                attempt: md.attempt,
                state,
                created_at: s.created_at,
                ip,
                additional_ips: additional,
            });
        }
        let mut cs = rt.list_containers(sel).await?;
        cs.sort_by_key(|c| std::cmp::Reverse(c.created_at));
        for c in cs {
            let Some(st) = (match rt.container_status(&c.id).await {
                Ok(s) => s,
                Err(e) if e.is_not_found() => None,
                Err(e) => return Err(e),
            }) else {
                continue;
            };
            let md = c.metadata.clone().unwrap_or_default();
            let kind = if c.annotations.get(model::ANN_CONTAINER_TYPE).map(String::as_str) == Some("init") {
                ContainerKind::Init
            } else {
                ContainerKind::App
            };
            let name = c.labels.get(model::LABEL_CONTAINER_NAME).cloned().unwrap_or(md.name.clone());
            let restart_count: u32 =
                c.annotations.get(model::ANN_RESTART_COUNT).and_then(|h| h.parse().ok()).unwrap_or(0);
            let mut message = st.message;
            if container_state(st.state) == ContainerState::Exited {
                let fallback = c.annotations.get(model::ANN_TERMINATION_MESSAGE_POLICY).map(String::as_str)
                    == Some("FallbackToLogsOnError");
                let log = self
                    .inner
                    .cfg
                    .node
                    .pod_log_root
                    .join(format!("{}_{}_{uid}", out.namespace, out.name))
                    .join(&name)
                    .join(format!("{restart_count}.log"));
                let term = volume::pod_dir(&self.inner.cfg.root_dir, uid)
                    .join("containers")
                    .join(&name)
                    .join(restart_count.to_string());
                if let Some(m) = termination_message(&term, fallback && st.exit_code != 0, &log) {
                    message = m;
                }
            }
            out.containers.push(ContainerObs {
                id: c.id.clone(),
                sandbox_id: c.pod_sandbox_id.clone(),
                name,
                kind,
                attempt: md.attempt,
                state: container_state(st.state),
                created_at: st.created_at,
                started_at: st.started_at,
                finished_at: st.finished_at,
                exit_code: st.exit_code,
                reason: st.reason,
                message,
                image: st.image.map(|i| i.image).unwrap_or_default(),
                image_ref: st.image_ref,
                hash: c.annotations.get(model::ANN_CONTAINER_HASH).and_then(|h| h.parse().ok()).unwrap_or(0),
                restart_count,
            });
        }
        Ok(out)
    }
}

/// Which pods the runtime may hold a sandbox or container for: every pod of a listing of the
/// runtime (each relist's), and every pod the agent asks the runtime to create something for,
/// from before it asks. Until the first listing succeeded every pod may have something there
/// (what an agent restarted next to running pods finds).
#[derive(Debug, Default)]
pub(super) struct Census {
    listed: bool,
    uids: HashSet<String>,
}

impl Census {
    /// The pods of a listing of the runtime.
    pub(super) fn listed<'a>(&mut self, uids: impl Iterator<Item = &'a str>) {
        for uid in uids {
            if !self.uids.contains(uid) {
                self.uids.insert(uid.to_string());
            }
        }
        self.listed = true;
    }

    /// Before the agent asks the runtime to create a sandbox or container of `uid`.
    pub(super) fn creating(&mut self, uid: &str) {
        if !self.uids.contains(uid) {
            self.uids.insert(uid.to_string());
        }
    }

    /// The runtime holds nothing more of `uid` (its cleanup removed everything).
    pub(super) fn forget(&mut self, uid: &str) {
        self.uids.remove(uid);
    }

    /// True when the runtime cannot hold anything of `uid`.
    pub(super) fn holds_nothing(&self, uid: &str) -> bool {
        self.listed && !self.uids.contains(uid)
    }
}

/// What a relist sees of one container or sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Seen {
    Container(ContainerState),
    Sandbox(SandboxState),
}

/// A relist: container or sandbox id -> (pod uid, state).
pub(super) type Relisted = BTreeMap<String, (String, Seen)>;

/// The pods to sync after a relist: those with a container or sandbox that appeared, changed
/// state or went away since the previous relist, except a pod whose last sync observed exactly
/// what this relist sees with every container running and every sandbox ready (the starts of
/// that sync, already in its status, with nothing left for the planner).
pub(super) fn relist_changes(last: &Relisted, now: &Relisted, observed: &BTreeMap<String, PodRuntime>) -> BTreeSet<String> {
    let mut changed: BTreeSet<String> = BTreeSet::new();
    for (id, v) in now {
        if last.get(id) != Some(v) {
            changed.insert(v.0.clone());
        }
    }
    for (id, v) in last {
        if !now.contains_key(id) {
            changed.insert(v.0.clone());
        }
    }
    changed.retain(|uid| {
        let Some(o) = observed.get(uid) else { return true };
        // Only a pod whose last sync left everything running is settled: an exited or created
        // container may need the planner (a restart, the next init container).
        let settled = o.containers.iter().all(|c| c.state == ContainerState::Running)
            && o.sandboxes.iter().all(|s| s.state == SandboxState::Ready);
        if !settled {
            return true;
        }
        let seen: BTreeMap<&str, Seen> = o
            .containers
            .iter()
            .map(|c| (c.id.as_str(), Seen::Container(c.state)))
            .chain(o.sandboxes.iter().map(|s| (s.id.as_str(), Seen::Sandbox(s.state))))
            .collect();
        let relisted: BTreeMap<&str, Seen> = now.iter().filter(|(_, (u, _))| u == uid).map(|(id, (_, s))| (id.as_str(), *s)).collect();
        seen != relisted
    });
    changed
}

pub(super) fn sandbox_state(s: i32) -> SandboxState {
    if s == cri::api::PodSandboxState::SandboxReady as i32 {
        SandboxState::Ready
    } else {
        SandboxState::NotReady
    }
}

pub(super) fn container_state(s: i32) -> ContainerState {
    match cri::api::ContainerState::try_from(s) {
        Ok(cri::api::ContainerState::ContainerCreated) => ContainerState::Created,
        Ok(cri::api::ContainerState::ContainerRunning) => ContainerState::Running,
        Ok(cri::api::ContainerState::ContainerExited) => ContainerState::Exited,
        _ => ContainerState::Unknown,
    }
}

/// The termination message of an exited container: the file it wrote at its
/// terminationMessagePath (at most 4096 bytes), or with FallbackToLogsOnError and a failure,
/// the end of its log (at most 80 lines / 2048 bytes), as upstream.
pub fn termination_message(file: &Path, fallback_to_log: bool, log: &Path) -> Option<String> {
    if let Ok(b) = std::fs::read(file) {
        let b = &b[..b.len().min(4096)];
        if !b.is_empty() {
            return Some(String::from_utf8_lossy(b).into_owned());
        }
    }
    if !fallback_to_log {
        return None;
    }
    let text = std::fs::read_to_string(log).ok()?;
    // CRI log lines: "<time> <stream> <P|F> <content>"; P parts join the next record.
    let mut lines: Vec<String> = Vec::new();
    let mut partial = String::new();
    for l in text.lines() {
        let mut it = l.splitn(4, ' ');
        let (_, _, tag, content) = (it.next(), it.next(), it.next(), it.next().unwrap_or(""));
        partial.push_str(content);
        if tag != Some("P") {
            lines.push(std::mem::take(&mut partial));
        }
    }
    let tail = lines[lines.len().saturating_sub(80)..].join("\n");
    let start = tail.len().saturating_sub(2048);
    let start = (start..=tail.len()).find(|i| tail.is_char_boundary(*i)).unwrap_or(tail.len());
    let msg = tail[start..].to_string();
    (!msg.is_empty()).then_some(msg)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn relisted(v: &[(&str, &str, Seen)]) -> Relisted {
        v.iter().map(|(id, uid, s)| (id.to_string(), (uid.to_string(), *s))).collect()
    }

    fn runtime(uid: &str, containers: &[(&str, ContainerState)], sandboxes: &[(&str, SandboxState)]) -> PodRuntime {
        PodRuntime {
            uid: uid.into(),
            containers: containers
                .iter()
                .map(|(id, st)| ContainerObs {
                    id: id.to_string(),
                    sandbox_id: String::new(),
                    name: "app".into(),
                    kind: ContainerKind::App,
                    attempt: 0,
                    state: *st,
                    created_at: 0,
                    started_at: 0,
                    finished_at: 0,
                    exit_code: 0,
                    reason: String::new(),
                    message: String::new(),
                    image: String::new(),
                    image_ref: String::new(),
                    hash: 0,
                    restart_count: 0,
                })
                .collect(),
            sandboxes: sandboxes
                .iter()
                .map(|(id, st)| Sandbox { id: id.to_string(), attempt: 0, state: *st, created_at: 0, ip: None, additional_ips: Vec::new() })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_relist_syncs_the_pods_whose_runtime_state_their_last_sync_did_not_see() {
        use ContainerState::*;
        use Seen::{Container as C, Sandbox as S};
        let ready = SandboxState::Ready;
        let last = relisted(&[("s1", "a", S(ready)), ("c1", "a", C(Running)), ("s2", "b", S(ready)), ("c2", "b", C(Running))]);
        // a's container exited, b's is unchanged, c is new, d's container went away
        let mut before = last.clone();
        before.insert("c4".into(), ("d".into(), C(Running)));
        let now = relisted(&[
            ("s1", "a", S(ready)),
            ("c1", "a", C(Exited)),
            ("s2", "b", S(ready)),
            ("c2", "b", C(Running)),
            ("s3", "c", S(ready)),
            ("c3", "c", C(Running)),
        ]);
        let none = BTreeMap::new();
        assert_eq!(relist_changes(&before, &now, &none), ["a", "c", "d"].map(String::from).into());
        // c's sync started its sandbox and container and observed them running: not again;
        // a's last sync saw the container running: synced; d's saw a container now gone: synced
        let observed = BTreeMap::from([
            ("a".to_string(), runtime("a", &[("c1", Running)], &[("s1", ready)])),
            ("c".to_string(), runtime("c", &[("c3", Running)], &[("s3", ready)])),
            ("d".to_string(), runtime("d", &[("c4", Running)], &[])),
        ]);
        assert_eq!(relist_changes(&before, &now, &observed), ["a", "d"].map(String::from).into());
        // c's sync saw the container only as created: synced
        let observed = BTreeMap::from([("c".to_string(), runtime("c", &[("c3", Created)], &[("s3", ready)]))]);
        assert!(relist_changes(&last, &now, &observed).contains("c"));
        // c's sync saw one container fewer than there are: synced
        let observed = BTreeMap::from([("c".to_string(), runtime("c", &[], &[("s3", ready)]))]);
        assert!(relist_changes(&last, &now, &observed).contains("c"));
        // c's sync saw exactly this, but with a container exited at once (to be restarted): synced
        let exited = relisted(&[("s3", "c", S(ready)), ("c3", "c", C(Exited))]);
        let observed = BTreeMap::from([("c".to_string(), runtime("c", &[("c3", Exited)], &[("s3", ready)]))]);
        assert!(relist_changes(&BTreeMap::new(), &exited, &observed).contains("c"));
        // nothing changed since the last relist: nothing, whatever the syncs saw
        assert!(relist_changes(&now, &now, &none).is_empty());
    }

    #[test]
    fn the_census_holds_nothing_only_after_a_listing_for_a_pod_neither_listed_nor_created() {
        let mut c = Census::default();
        assert!(!c.holds_nothing("a"), "before any listing every pod may have something there");
        c.creating("b");
        c.listed(["a"].into_iter());
        assert!(!c.holds_nothing("a"), "listed");
        assert!(!c.holds_nothing("b"), "created before the listing");
        assert!(c.holds_nothing("c"));
        c.creating("c");
        assert!(!c.holds_nothing("c"), "created after the listing");
        c.listed(std::iter::empty());
        assert!(!c.holds_nothing("a") && !c.holds_nothing("c"), "a listing only adds");
        c.forget("a");
        assert!(c.holds_nothing("a"));
    }

    #[test]
    fn termination_messages() {
        let d = tempfile::tempdir().unwrap();
        let file = d.path().join("0");
        let log = d.path().join("0.log");
        std::fs::write(&log, "2026-01-01T00:00:00.1Z stdout P part\n2026-01-01T00:00:00.2Z stdout F ial\n2026-01-01T00:00:00.3Z stderr F boom\n").unwrap();
        assert_eq!(termination_message(&file, false, &log), None);
        assert_eq!(termination_message(&file, true, &log).as_deref(), Some("partial\nboom"));
        std::fs::write(&file, "bye").unwrap();
        assert_eq!(termination_message(&file, true, &log).as_deref(), Some("bye"));
        std::fs::write(&file, "x".repeat(5000)).unwrap();
        assert_eq!(termination_message(&file, false, &log).unwrap().len(), 4096);
    }
}
