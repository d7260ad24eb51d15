//! Carrying out a plan's starts: volumes, the sandbox, the managed /etc/hosts, and per container
//! the crash-loop back-off, the image, the config, CreateContainer, StartContainer, postStart.

use super::*;

/// What every container started into one pod sandbox shares.
#[derive(Clone, Copy)]
pub(super) struct PodContext<'a> {
    pub sandbox_id: &'a str,
    pub sandbox_config: &'a cri::api::PodSandboxConfig,
    /// The pod's volumes by name, set up.
    pub volumes: &'a BTreeMap<String, volume::VolumePath>,
    /// The managed /etc/hosts (none with hostNetwork).
    pub hosts: Option<&'a Path>,
    pub pod_ips: &'a [String],
    /// The ConfigMaps, Secrets and Services the environment refers to.
    pub objects: &'a Objects,
}

impl PodWorkers {
    /// Fetches the ConfigMaps and Secrets the pod refers to (absent ones are left out).
    pub(super) async fn objects(&self, pod: &Pod, with_services: bool) -> Objects {
        let mut out = Objects::default();
        let Some(client) = self.inner.kube.clone() else {
            return out;
        };
        let ns = pod.metadata.namespace.clone().unwrap_or_else(|| "default".into());
        let refs = model::references(pod);
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        out.config_maps = referenced(&client, self.inner.config_maps.get(), uid, &ns, &refs.config_maps).await;
        out.secrets = referenced(&client, self.inner.secrets.get(), uid, &ns, &refs.secrets).await;
        if let Some(p) = crate::pod::token::projection(pod) {
            out.service_account_token = self.inner.tokens.token(&client, pod, p).await;
            let desired = self.inner.desired.read().unwrap_or_else(|e| e.into_inner());
            self.inner.tokens.retain(|uid| desired.contains_key(uid));
        }
        // Service links: the namespace's Services unless enableServiceLinks is false, and the
        // API server's `kubernetes` Service always.
        use k8s_openapi::api::core::v1::Service;
        if !with_services {
            return out;
        }
        let links = pod.spec.as_ref().and_then(|s| s.enable_service_links) != Some(false);
        let need_default = ns != "default" || !links;
        // From the Services informer once it has listed (upstream's service lister); the API
        // until then.
        if let Some(inf) = self.inner.services.get().filter(|i| i.is_synced()) {
            if links {
                out.services.extend(inf.list_namespace(&ns).iter().map(|s| (**s).clone()));
            }
            if need_default {
                out.services.extend(inf.get(Some("default"), "kubernetes").map(|s| (*s).clone()));
            }
            return out;
        }
        if links {
            let svcs: kube::Api<Service> = kube::Api::namespaced(client.clone(), &ns);
            if let Ok(list) = svcs.list(&Default::default()).await {
                out.services.extend(list.items);
            }
        }
        if need_default {
            let def: kube::Api<Service> = kube::Api::namespaced(client, "default");
            if let Ok(Some(s)) = def.get_opt("kubernetes").await {
                out.services.push(s);
            }
        }
        out
    }

    /// A volume could not be set up: FailedMount, and every container waits in ContainerCreating
    /// saying why.
    pub(super) fn mount_failed(&self, uid: &str, pod: &Pod, msg: &str) {
        tracing::warn!(pod = %pod_label(pod), error = %msg, "volume setup failed");
        self.event(pod, "Warning", "FailedMount", msg.to_string());
        self.with_state(uid, |s| {
            for c in pod.spec.iter().flat_map(|s| s.containers.iter().chain(s.init_containers.iter().flatten())) {
                s.waiting.insert(
                    c.name.clone(),
                    Waiting { reason: "ContainerCreating".into(), message: format!("MountVolume.SetUp failed: {msg}") },
                );
            }
        });
    }

    /// The pod's CSI volumes (persistentVolumeClaim and inline `csi:` ones), staged and
    /// published through their driver. On error: the message and how soon to try again (soon
    /// while the claim is not bound yet or the driver not registered: ferro's scheduler binds a
    /// pod only once its claims are, as upstream's PreBind, but an API server's pods may come
    /// from elsewhere).
    pub(super) async fn csi_setup(&self, pod: &Pod) -> Result<BTreeMap<String, volume::VolumePath>, (String, Duration)> {
        use crate::csi::mounter::CsiError;
        let has_csi = pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()).any(volume::is_csi);
        if !has_csi {
            return Ok(BTreeMap::new());
        }
        match self.inner.csi.get() {
            Some(csi) => csi.setup(pod).await.map_err(|e| {
                let soon = match e {
                    CsiError::ClaimNotBound { .. } | CsiError::DriverNotRegistered(_) | CsiError::VolumeNotFound(_) => {
                        Duration::from_millis(200)
                    }
                    _ => Duration::from_secs(2),
                };
                (e.to_string(), soon)
            }),
            None => Err((CsiError::NoApi.to_string(), Duration::from_secs(2))),
        }
    }

    /// Carries out `actions`; returns how soon to look again when something is pending.
    pub(super) async fn execute(
        &self,
        uid: &str,
        pod: &Pod,
        observed: &PodRuntime,
        actions: &Actions,
        objects: &Objects,
    ) -> Result<Option<Duration>, SyncError> {
        let rt = self.inner.rt.clone();
        let mut soon: Option<Duration> = None;
        if actions.kill_pod {
            self.kill_pod(uid, pod, observed).await?;
        }
        for k in &actions.kill {
            tracing::info!(pod = %pod_label(pod), container = %k.name, message = %k.message, "killing container");
            self.event(pod, "Normal", "Killing", k.message.clone());
            // A failed probe's own terminationGracePeriodSeconds, else the pod's.
            let grace = k.grace.unwrap_or_else(|| grace_seconds(pod));
            let t0 = Instant::now();
            if let Some(c) = observed.containers.iter().find(|c| c.id == k.id) {
                let pod_ip = observed.sandbox().and_then(|s| s.ip.clone());
                self.pre_stop(pod, c, pod_ip, grace).await;
            }
            let left = grace_left(grace, t0.elapsed().as_secs());
            CriError::gone_ok(rt.stop_container(&k.id, left).await)?;
        }
        if actions.kill_pod && !actions.create_sandbox {
            return Ok(None);
        }
        if actions.start.is_empty() && !actions.create_sandbox {
            return Ok(None);
        }
        // Volumes before the sandbox, as upstream: CSI (persistentVolumeClaim, inline csi) ones
        // first.
        let csi_vols = match self.csi_setup(pod).await {
            Ok(v) => v,
            Err((msg, soon)) => {
                self.mount_failed(uid, pod, &msg);
                return Ok(Some(soon));
            }
        };
        let vols = match volume::setup(
            &self.inner.cfg.root_dir,
            pod,
            objects,
            self.inner.cfg.allocatable_cpu_milli,
            self.inner.cfg.allocatable_memory,
        ) {
            Ok(mut v) => {
                v.extend(csi_vols);
                v
            }
            Err(e) => {
                let msg = e.to_string();
                self.mount_failed(uid, pod, &msg);
                return Ok(Some(Duration::from_secs(2)));
            }
        };
        let mut sandbox_config =
            spec::sandbox_config(pod, actions.sandbox_attempt, &self.inner.cfg.node)?;
        if self.inner.cfg.node.cgroup_driver == spec::CgroupDriver::Cgroupfs && !self.inner.cfg.cgroup_root.is_empty() {
            if let Some(l) = sandbox_config.linux.as_mut() {
                l.cgroup_parent = format!("{}{}", self.inner.cfg.cgroup_root, l.cgroup_parent);
            }
        }
        let pod_dir = volume::pod_dir(&self.inner.cfg.root_dir, uid);
        let (sandbox_id, pod_ips) = if actions.create_sandbox {
            let log_dir = spec::pod_log_dir(pod, &self.inner.cfg.node);
            std::fs::create_dir_all(&log_dir).map_err(file_error("creating", &log_dir))?;
            tracing::info!(pod = %pod_label(pod), attempt = actions.sandbox_attempt, "creating pod sandbox");
            self.inner.census.lock().unwrap_or_else(|p| p.into_inner()).creating(uid);
            let id = match rt.run_sandbox(sandbox_config.clone()).await {
                Ok(id) => id,
                Err(e) => {
                    let msg = e.message();
                    self.event(pod, "Warning", "FailedCreatePodSandBox", format!("Failed to create pod sandbox: {msg}"));
                    self.with_state(uid, |s| {
                        for c in pod.spec.iter().flat_map(|s| s.containers.iter()) {
                            s.waiting.insert(c.name.clone(), Waiting { reason: "ContainerCreating".into(), message: format!("Failed to create pod sandbox: {msg}") });
                        }
                    });
                    return Err(SyncError::Sandbox(msg));
                }
            };
            let network = rt.sandbox_status(&id).await?.and_then(|s| s.network);
            let (ip, additional_ips) = network
                .map(|n| (Some(n.ip).filter(|i| !i.is_empty()), n.additional_ips.into_iter().map(|p| p.ip).collect::<Vec<String>>()))
                .unwrap_or_default();
            let ips: Vec<String> = ip.iter().chain(additional_ips.iter()).filter(|i| !i.is_empty()).cloned().collect();
            let network = SandboxNetwork { id: id.clone(), ip, additional_ips };
            self.with_state(uid, |s| s.sandbox_network = Some(network));
            (id, ips)
        } else {
            let Some(id) = actions.sandbox_id.clone() else {
                return Ok(None);
            };
            let sb = observed.sandboxes.iter().find(|s| s.id == id);
            let ips = sb
                .map(|s| s.ip.iter().cloned().chain(s.additional_ips.iter().cloned()).collect())
                .unwrap_or_default();
            (id, ips)
        };
        let host_network = pod.spec.as_ref().and_then(|s| s.host_network).unwrap_or(false);
        let hosts_path = pod_dir.join("etc-hosts");
        let hosts = if host_network {
            None
        } else {
            let content = spec::hosts_file(pod, &pod_ips, &self.inner.cfg.node);
            std::fs::write(&hosts_path, content).map_err(file_error("writing", &hosts_path))?;
            Some(hosts_path.as_path())
        };
        let ctx = PodContext {
            sandbox_id: &sandbox_id,
            sandbox_config: &sandbox_config,
            volumes: &vols,
            hosts,
            pod_ips: &pod_ips,
            objects,
        };
        for start in &actions.start {
            if let Some(d) = self.start_container(uid, pod, start, &ctx).await? {
                soon = Some(soon.map_or(d, |s: Duration| s.min(d)));
            }
            if start.kind == ContainerKind::Init {
                soon = Some(soon.map_or(Duration::from_secs(1), |s| s.min(Duration::from_secs(1))));
            }
        }
        Ok(soon)
    }

    pub(super) async fn start_container(
        &self,
        uid: &str,
        pod: &Pod,
        start: &Start,
        sandbox: &PodContext<'_>,
    ) -> Result<Option<Duration>, SyncError> {
        let Some(c) = spec_container(pod, start.kind, &start.name) else {
            return Ok(None);
        };
        let PodContext { sandbox_id, sandbox_config, volumes: vols, hosts, pod_ips, objects } = *sandbox;
        let rt = self.inner.rt.clone();
        let hash = plan::container_hash(c);
        let name = c.name.clone();
        let set_waiting = |reason: &str, message: String| {
            self.with_state(uid, |s| {
                s.waiting.insert(name.clone(), Waiting { reason: reason.into(), message });
            })
        };
        // Crash-loop backoff.
        let key = backoff::container_key(uid, &c.name, hash);
        if start.previous_finished_at > 0 {
            let now = self.now_ns();
            let mut b = self.inner.crash_backoff.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(rem) = b.in_backoff(&key, start.previous_finished_at, now) {
                let cur = b.current(&key).unwrap_or(backoff::INITIAL);
                drop(b);
                self.event(pod, "Warning", "BackOff", format!("Back-off restarting failed container {} in pod {}", c.name, pod_label(pod)));
                set_waiting(
                    "CrashLoopBackOff",
                    format!(
                        "back-off {} restarting failed container={} pod={}_{}({uid})",
                        humanize(cur),
                        c.name,
                        pod.metadata.name.as_deref().unwrap_or(""),
                        pod.metadata.namespace.as_deref().unwrap_or("")
                    ),
                );
                return Ok(Some(rem));
            }
            b.next(&key, start.previous_finished_at, start.previous_ran_for);
        }
        // Image.
        let image = c.image.clone().unwrap_or_default();
        // One ImageStatus: whether to pull, and (unless a pull follows) the image's user. (No
        // name, nothing to ask: image_step refuses it.)
        let mut status =
            if image.is_empty() { None } else { rt.image_status(&image).await? };
        let present = status.is_some();
        let must_pull = match image_plan::image_step(&image, image_plan::pull_policy(c), present) {
            ImageStep::Pull => true,
            ImageStep::UsePresent => false,
            ImageStep::Invalid(msg) => {
                set_waiting("InvalidImageName", msg);
                return Ok(None);
            }
            ImageStep::NeverPullAbsent(msg) => {
                set_waiting("ErrImageNeverPull", msg);
                return Ok(Some(Duration::from_secs(5)));
            }
        };
        if must_pull {
            let pkey = format!("pull/{uid}/{image}");
            let now = self.now_ns();
            {
                let b = self.inner.pull_backoff.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(rem) = b.in_backoff(&pkey, now, now) {
                    drop(b);
                    self.event(pod, "Normal", "BackOff", format!("Back-off pulling image {image:?}"));
                    set_waiting("ImagePullBackOff", format!("Back-off pulling image {image:?}"));
                    return Ok(Some(rem));
                }
            }
            tracing::info!(pod = %pod_label(pod), %image, "pulling image");
            self.event(pod, "Normal", "Pulling", format!("Pulling image {image:?}"));
            let started = Instant::now();
            if let Err(e) = rt.pull_image(&image, Some(sandbox_config.clone())).await {
                self.event(pod, "Warning", "Failed", format!("Failed to pull image {image:?}: {}", e.message()));
                if present {
                    tracing::warn!(%image, error = %e, "pull failed; using the image present on the node");
                } else {
                    let mut b = self.inner.pull_backoff.lock().unwrap_or_else(|p| p.into_inner());
                    b.next(&pkey, now, Duration::ZERO);
                    let rem = b.current(&pkey).unwrap_or(backoff::INITIAL);
                    drop(b);
                    set_waiting("ErrImagePull", format!("failed to pull image {image:?}: {}", e.message()));
                    return Ok(Some(rem));
                }
            } else {
                self.inner.pull_backoff.lock().unwrap_or_else(|p| p.into_inner()).reset(&pkey);
                // The pulled image's user (upstream's getImageUser asks ImageStatus too).
                status = match rt.image_status(&image).await {
                    Ok(s) => s,
                    Err(e) => {
                        set_waiting("CreateContainerConfigError", e.message());
                        return Ok(Some(Duration::from_secs(5)));
                    }
                };
                self.event(
                    pod,
                    "Normal",
                    "Pulled",
                    format!("Successfully pulled image {image:?} in {:.3}s", started.elapsed().as_secs_f64()),
                );
            }
        } else if start.restart_count == 0 {
            self.event(pod, "Normal", "Pulled", format!("Container image {image:?} already present on machine"));
        }
        // Config.
        let env = match spec::resolve_env(pod, c, objects, pod_ips, &self.inner.cfg.node) {
            Ok(e) => e,
            Err(e) => {
                self.event(pod, "Warning", "Failed", format!("Error: {e}"));
                set_waiting("CreateContainerConfigError", e.to_string());
                return Ok(Some(Duration::from_secs(5)));
            }
        };
        let term_dir = volume::pod_dir(&self.inner.cfg.root_dir, uid).join("containers").join(&c.name);
        std::fs::create_dir_all(&term_dir).map_err(file_error("creating", &term_dir))?;
        let term_file = term_dir.join(format!("{}", start.restart_count));
        std::fs::write(&term_file, b"").map_err(file_error("creating", &term_file))?;
        let spec_vols: BTreeMap<String, spec::VolumePath> = vols
            .iter()
            .map(|(k, v)| (k.clone(), spec::VolumePath { host_path: v.host_path.clone(), read_only: v.read_only }))
            .collect();
        let mounts = match spec::container_mounts(c, &spec_vols, &env, hosts, Some(&term_file)) {
            Ok(m) => m,
            Err(e) => {
                self.event(pod, "Warning", "Failed", format!("Error: {e}"));
                set_waiting("CreateContainerConfigError", e.to_string());
                return Ok(Some(Duration::from_secs(5)));
            }
        };
        let image_user = spec::ImageUser::of(status.as_ref());
        let devices = match spec::container_devices(c, &spec_vols) {
            Ok(d) => d,
            Err(e) => {
                self.event(pod, "Warning", "Failed", format!("Error: {e}"));
                set_waiting("CreateContainerConfigError", e.to_string());
                return Ok(Some(Duration::from_secs(5)));
            }
        };
        let config = match spec::container_config(pod, c, start.kind, start.attempt, start.restart_count, hash, env, mounts, &image_user, &self.inner.cfg.node) {
            Ok(mut cfg) => {
                cfg.devices = devices;
                cfg
            }
            Err(e) => {
                self.event(pod, "Warning", "Failed", format!("Error: {e}"));
                set_waiting("CreateContainerConfigError", e.to_string());
                return Ok(Some(Duration::from_secs(5)));
            }
        };
        tracing::info!(pod = %pod_label(pod), container = %c.name, attempt = start.attempt, "creating container");
        self.inner.census.lock().unwrap_or_else(|p| p.into_inner()).creating(uid);
        let id = match rt.create_container(sandbox_id, config, sandbox_config.clone()).await {
            Ok(id) => id,
            Err(e) => {
                self.event(pod, "Warning", "Failed", format!("Error: {}", e.message()));
                set_waiting("CreateContainerError", e.message());
                return Ok(Some(Duration::from_secs(5)));
            }
        };
        self.event(pod, "Normal", "Created", format!("Created container: {}", c.name));
        if let Err(e) = rt.start_container(&id).await {
            self.event(pod, "Warning", "Failed", format!("Error: {}", e.message()));
            // The container exists but did not start (e.g. the command does not exist): its
            // exited status carries the runtime's reason; the waiting reason says why.
            set_waiting("RunContainerError", e.message());
            return Ok(Some(Duration::from_secs(1)));
        }
        self.with_state(uid, |s| {
            s.waiting.remove(&c.name);
        });
        tracing::info!(pod = %pod_label(pod), container = %c.name, "started container");
        self.event(pod, "Normal", "Started", format!("Started container {}", c.name));
        // postStart hook.
        if let Some(h) = c.lifecycle.as_ref().and_then(|l| l.post_start.as_ref()) {
            let target = Target { pod_ip: pod_ips.first().cloned(), container_id: id.clone(), ports: c.ports.clone().unwrap_or_default() };
            let exec = CriExec { rt: self.inner.rt.clone() };
            if let Err(msg) = hooks::run_handler(h, &target, &exec, Duration::from_secs(grace_seconds(pod).max(2).unsigned_abs())).await {
                tracing::warn!(pod = %pod_label(pod), container = %c.name, error = %msg, "postStart hook failed; killing the container");
                if let Err(e) = CriError::gone_ok(rt.stop_container(&id, 2).await) {
                    tracing::warn!(pod = %pod_label(pod), container = %c.name, error = %e, "stopping after a failed postStart hook");
                }
                set_waiting("PostStartHookError", msg);
            }
        }
        Ok(None)
    }
}

/// "10s", "1m20s", "5m0s" as Go prints durations in the backoff message.
pub(super) fn humanize(d: Duration) -> String {
    let s = d.as_secs();
    if s < 60 {
        format!("{s}s")
    } else {
        format!("{}m{}s", s / 60, s % 60)
    }
}

/// The objects `names` of kind K in `ns` that pod `uid` refers to: from `cache` (registering
/// the pod's references) where there is one and it knows the object, else from the API. An
/// object that cannot be read is left out (the volume or env that needs it reports it).
async fn referenced<K: crate::pod::objects::Referenced>(
    client: &kube::Client,
    cache: Option<&crate::pod::objects::ObjectCache<K>>,
    uid: &str,
    ns: &str,
    names: &std::collections::BTreeSet<String>,
) -> BTreeMap<String, K> {
    use crate::pod::objects::Lookup;
    let mut out = BTreeMap::new();
    if let Some(c) = cache {
        c.register(uid, ns, names);
    }
    let api: kube::Api<K> = kube::Api::namespaced(client.clone(), ns);
    for n in names {
        let lookup = match cache {
            Some(c) => c.get(ns, n).await,
            None => Lookup::Unknown,
        };
        match lookup {
            Lookup::Found(obj) => {
                out.insert(n.clone(), (*obj).clone());
            }
            Lookup::Missing => {}
            Lookup::Unknown => match api.get_opt(n).await {
                Ok(Some(obj)) => {
                    out.insert(n.clone(), obj);
                }
                Ok(None) => {}
                Err(e) => tracing::debug!(kind = %K::kind(&()), namespace = ns, name = %n, error = %e, "reading a referenced object"),
            },
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn backoff_message_durations() {
        assert_eq!(humanize(Duration::from_secs(10)), "10s");
        assert_eq!(humanize(Duration::from_secs(80)), "1m20s");
        assert_eq!(humanize(Duration::from_secs(300)), "5m0s");
    }
}
