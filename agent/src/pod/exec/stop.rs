//! Stopping: a pod's containers in upstream's order with preStop hooks and what is left of the
//! grace period, the final delete of a deleted pod, the clean-up of a pod gone from the node,
//! container GC and the pod's cgroups.

use super::*;

impl PodWorkers {
    /// Container GC as upstream with MaxPerPodContainer=1: of each container, the newest
    /// attempt and one dead attempt before it are kept, older exited ones are removed; sandboxes
    /// other than the newest are removed once they hold no containers.
    pub(super) async fn gc_containers(&self, observed: &PodRuntime) {
        let rt = self.inner.rt.clone();
        let mut seen: BTreeMap<(bool, &str), usize> = BTreeMap::new();
        let mut kept_sandboxes: BTreeSet<&str> = observed.sandbox().map(|s| s.id.as_str()).into_iter().collect();
        for c in &observed.containers {
            let n = seen.entry((c.kind == ContainerKind::Init, c.name.as_str())).or_insert(0);
            *n += 1;
            if *n > 2 && c.state == ContainerState::Exited {
                if let Err(e) = self.remove_dead_container(observed, c).await {
                    tracing::debug!(container = %c.id, error = %e, "container gc");
                }
            } else {
                kept_sandboxes.insert(c.sandbox_id.as_str());
            }
        }
        for s in &observed.sandboxes {
            if !kept_sandboxes.contains(s.id.as_str()) && s.state == SandboxState::NotReady {
                if let Err(e) = rt.remove_sandbox(&s.id).await {
                    tracing::debug!(sandbox = %s.id, error = %e, "sandbox gc");
                }
            }
        }
    }

    /// Removes an exited container and its log file (as upstream's container GC: the log goes
    /// with the container it belongs to).
    async fn remove_dead_container(&self, observed: &PodRuntime, c: &ContainerObs) -> Result<(), CriError> {
        CriError::gone_ok(self.inner.rt.remove_container(&c.id).await)?;
        if !observed.name.is_empty() {
            let log = self
                .inner
                .cfg
                .node
                .pod_log_root
                .join(format!("{}_{}_{}", observed.namespace, observed.name, observed.uid))
                .join(&c.name)
                .join(format!("{}.log", c.restart_count));
            match std::fs::remove_file(&log) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    tracing::warn!(file = %log.display(), error = %e, "removing a dead container's log");
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Node-level container reclaim under disk pressure (upstream's DeleteAllUnusedContainers):
    /// every container and sandbox of the pods that have finished (Succeeded or Failed, nothing
    /// left running) is removed with its log, where the periodic GC keeps the last attempts of
    /// each for `kubectl logs`. Their statuses stay as written (a terminated container the
    /// runtime no longer holds keeps its status). Returns how many containers went.
    pub async fn remove_dead_containers(&self) -> Result<usize, CriError> {
        let finished: Vec<String> = {
            // the order of active_pods: desired, then states
            let desired = self.inner.desired.read().unwrap_or_else(|p| p.into_inner());
            let known: Vec<String> = desired.keys().cloned().collect();
            let states = self.inner.states.lock().unwrap_or_else(|p| p.into_inner());
            // The phase the agent wrote last, else the API's (after a restart of the agent)
            let phase = |uid: &str| {
                states
                    .get(uid)
                    .and_then(|s| s.last_status.as_ref())
                    .or_else(|| desired.get(uid).and_then(|(p, _)| p.status.as_ref()))
                    .and_then(|st| st.phase.clone())
            };
            known.into_iter().filter(|uid| matches!(phase(uid).as_deref(), Some("Succeeded" | "Failed"))).collect()
        };
        let mut removed = 0;
        for uid in finished {
            let observed = self.observe(&uid).await?;
            let still_running = observed.running().next().is_some() || observed.sandboxes.iter().any(|s| s.state == SandboxState::Ready);
            if still_running {
                continue;
            }
            for c in &observed.containers {
                self.remove_dead_container(&observed, c).await?;
                removed += 1;
            }
            for s in &observed.sandboxes {
                CriError::gone_ok(self.inner.rt.remove_sandbox(&s.id).await)?;
            }
            if !observed.containers.is_empty() || !observed.sandboxes.is_empty() {
                tracing::info!(pod = %format!("{}/{}", observed.namespace, observed.name), containers = observed.containers.len(), "node-level reclaim: removed the containers of a finished pod");
                // the next look at the runtime records that nothing is left
                self.inner.queue.add(uid.clone());
            }
        }
        Ok(removed)
    }

    /// Stops every running container (preStop hooks first, whatever ends the pod: deletion, a
    /// finished restartPolicy Never pod's sidecars, activeDeadlineSeconds) and every ready
    /// sandbox. The app containers (and any other container that is not a sidecar)
    /// are stopped first, all at once; then the sidecars one at a time in reverse order of their
    /// declaration, each with what is left of the grace period (at least 2 s). The sidecars'
    /// preStop hooks run at the start, next to the app containers' ones (as upstream).
    pub(super) async fn kill_pod(&self, uid: &str, pod: &Pod, observed: &PodRuntime) -> Result<(), SyncError> {
        // An eviction's grace period when it is shorter than the pod's own (upstream's
        // override).
        let evicted = self.with_state(uid, |s| s.evicted.as_ref().map(|(g, _)| *g));
        let grace = evicted.map_or(grace_seconds(pod), |g| g.min(grace_seconds(pod)));
        let elapsed = self.with_state(uid, |s| s.deletion_seen.map(|t| t.elapsed().as_secs())).unwrap_or(0);
        let remaining = grace_left(grace, elapsed);
        let running: Vec<&ContainerObs> = observed.running().collect();
        let (first, sidecars) = plan::termination_order(pod.spec.as_ref(), &running);
        let pod_ip = observed.sandbox().and_then(|s| s.ip.clone());
        let t0 = Instant::now();
        // What is left of the grace period when a container's turn comes.
        let left = || grace_left(remaining, t0.elapsed().as_secs());
        let apps = futures::future::join_all(first.iter().map(|c| {
            let pod_ip = pod_ip.clone();
            async move {
                self.pre_stop(pod, c, pod_ip, remaining).await;
                self.stop_in_pod(pod, c, left()).await
            }
        }));
        let sidecar_hooks = futures::future::join_all(
            sidecars.iter().map(|c| self.pre_stop(pod, c, pod_ip.clone(), remaining)),
        );
        let (results, _) = futures::future::join(apps, sidecar_hooks).await;
        for r in results {
            r?;
        }
        for c in &sidecars {
            self.stop_in_pod(pod, c, left()).await?;
        }
        let rt = self.inner.rt.clone();
        for s in observed.sandboxes.iter().filter(|s| s.state == SandboxState::Ready) {
            tracing::info!(pod = %pod_label(pod), sandbox = %s.id, "stopping pod sandbox");
            CriError::gone_ok(rt.stop_sandbox(&s.id).await)?;
        }
        Ok(())
    }

    /// Runs container `c`'s preStop hook, if it has one, for at most `remaining` seconds. As
    /// upstream's killContainer, before every stop of a running container with a grace period
    /// (none when it is 0).
    pub(super) async fn pre_stop(&self, pod: &Pod, c: &ContainerObs, pod_ip: Option<String>, remaining: i64) {
        if remaining <= 0 {
            return;
        }
        let Some(spec) = spec_container(pod, c.kind, &c.name) else {
            return;
        };
        let Some(h) = spec.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref()) else {
            return;
        };
        let target = Target { pod_ip, container_id: c.id.clone(), ports: spec.ports.clone().unwrap_or_default() };
        let exec = CriExec { rt: self.inner.rt.clone() };
        tracing::info!(pod = %pod_label(pod), container = %c.name, "running preStop hook");
        if let Err(e) = hooks::run_handler(h, &target, &exec, Duration::from_secs(remaining.unsigned_abs())).await {
            tracing::warn!(pod = %pod_label(pod), container = %c.name, error = %e, "preStop hook failed");
        }
    }

    /// StopContainer for container `c` of `pod` with `grace` seconds.
    pub(super) async fn stop_in_pod(&self, pod: &Pod, c: &ContainerObs, grace: i64) -> Result<(), SyncError> {
        let rt = self.inner.rt.clone();
        tracing::info!(pod = %pod_label(pod), container = %c.name, grace, "stopping container");
        self.event(pod, "Normal", "Killing", format!("Stopping container {}", c.name));
        Ok(CriError::gone_ok(rt.stop_container(&c.id, grace).await)?)
    }

    /// The pod is deleted in the API and stopped here: write the final status and delete the
    /// object with grace 0 (uid precondition), as upstream's status manager.
    pub(super) async fn finalize_deletion(&self, uid: &str, pod: &Pod) -> Result<(), SyncError> {
        if self.with_state(uid, |s| s.finalized) {
            return Ok(());
        }
        let Some(client) = self.inner.kube.clone() else {
            return Ok(());
        };
        let ns = pod.metadata.namespace.clone().unwrap_or_else(|| "default".into());
        let api: kube::Api<Pod> = kube::Api::namespaced(client, &ns);
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions { uid: Some(uid.to_string()), resource_version: None }),
            ..Default::default()
        };
        match api.delete(pod.metadata.name.as_deref().unwrap_or(""), &dp).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
            Err(source) => return Err(SyncError::Api { what: "deleting pod", source }),
        }
        tracing::info!(pod = %pod_label(pod), "pod terminated and deleted");
        self.with_state(uid, |s| s.finalized = true);
        Ok(())
    }

    /// Pod `uid` is no longer wanted: stop and remove its containers and sandboxes, unmount its
    /// volumes, forget it.
    pub(super) async fn cleanup(&self, uid: &str, observed: &PodRuntime) -> Result<(), SyncError> {
        let rt = self.inner.rt.clone();
        self.inner.probes.remove_pod(uid);
        if !observed.containers.is_empty() || !observed.sandboxes.is_empty() {
            tracing::info!(uid = %uid, pod = %format!("{}/{}", observed.namespace, observed.name), "removing a pod that is no longer bound here");
        }
        for c in &observed.containers {
            if c.state == ContainerState::Running {
                CriError::gone_ok(rt.stop_container(&c.id, 2).await)?;
            }
            CriError::gone_ok(rt.remove_container(&c.id).await)?;
        }
        for s in &observed.sandboxes {
            CriError::gone_ok(rt.stop_sandbox(&s.id).await)?;
            CriError::gone_ok(rt.remove_sandbox(&s.id).await)?;
        }
        // CSI volumes through their driver first (unpublish, unstage), then the rest.
        if let Some(csi) = self.inner.csi.get() {
            csi.teardown(uid).await?;
        }
        volume::teardown(&self.inner.cfg.root_dir, uid)?;
        if !observed.name.is_empty() {
            let logs = self.inner.cfg.node.pod_log_root.join(format!("{}_{}_{uid}", observed.namespace, observed.name));
            match std::fs::remove_dir_all(&logs) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    tracing::warn!(dir = %logs.display(), error = %e, "removing the pod's logs");
                }
                _ => {}
            }
        }
        if self.inner.cfg.node.cgroup_driver == spec::CgroupDriver::Cgroupfs {
            remove_pod_cgroups(Path::new("/sys/fs/cgroup"), &self.inner.cfg.cgroup_root, uid);
        }
        self.inner.states.lock().unwrap_or_else(|p| p.into_inner()).remove(uid);
        self.inner.census.lock().unwrap_or_else(|p| p.into_inner()).forget(uid);
        self.inner.observed.write().unwrap_or_else(|p| p.into_inner()).remove(uid);
        if let Some(c) = self.inner.config_maps.get() {
            c.unregister(uid);
        }
        if let Some(c) = self.inner.secrets.get() {
            c.unregister(uid);
        }
        Ok(())
    }
}

/// Removes the (empty) cgroup directories of pod `uid` that the runtime created under
/// `<root>/kubepods` with the cgroupfs driver, in every hierarchy (cgroup v1 controllers or the
/// v2 unified tree). Best effort: a cgroup still holding a process stays.
pub fn remove_pod_cgroups(cgroup_fs: &Path, root: &str, uid: &str) {
    let rel = root.trim_start_matches('/');
    let mut hierarchies = vec![cgroup_fs.to_path_buf()];
    if let Ok(entries) = std::fs::read_dir(cgroup_fs) {
        hierarchies.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
    }
    for h in hierarchies {
        let base = if rel.is_empty() { h.join("kubepods") } else { h.join(rel).join("kubepods") };
        for qos in ["", "burstable", "besteffort"] {
            let dir = if qos.is_empty() { base.join(format!("pod{uid}")) } else { base.join(qos).join(format!("pod{uid}")) };
            if dir.is_dir() {
                remove_cgroup_tree(&dir);
            }
        }
    }
}

/// rmdir of a cgroup directory and its sub-cgroups, deepest first.
pub fn remove_cgroup_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&e.path());
            }
        }
    }
    if let Err(e) = std::fs::remove_dir(dir) {
        tracing::debug!(cgroup = %dir.display(), error = %e, "cgroup not removed");
    }
}
