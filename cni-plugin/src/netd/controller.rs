//! The control loop: an informer over Nodes (ferro-runtime's, as every ferro loop); every
//! change and every resync tick runs one full, level-triggered reconcile (observe the kernel,
//! plan, apply).

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use ferro_runtime::Informer;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher;
use kube::Api;
use tracing::Instrument;

use crate::netd::config::{Config, VXLAN_DEVICE};
use crate::netd::error::NetdError;
use crate::netd::kernel::{BridgeSpec, Kernel, VxlanSpec};
use crate::netd::plan::{
    annotations_to_patch, desired_entries, gateway_of, overlay_mtu, own_annotations, plan,
    pod_cidrs_of, vtep_addresses, LocalFacts, Skipped,
};
use crate::netd::render::{conflist, masq_rules, subnet_env, write_if_changed};

/// What one reconcile did.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Why nothing was done (own node missing, no pod CIDR yet, ...); `None` when reconciled.
    pub waiting: Option<String>,
    /// Kernel ops applied (FDB, neighbour, route changes).
    pub applied: usize,
    /// Annotations of the own Node to patch (the caller talks to the API).
    pub patch: BTreeMap<String, String>,
    /// Failures after the VXLAN device was in place (ops, masquerade, files): the rest of the
    /// reconcile was still done.
    pub errors: Vec<NetdError>,
}

/// One reconcile of this node against the Node objects in `nodes`.
pub async fn reconcile<K: Kernel>(
    cfg: &Config,
    kernel: &K,
    nodes: &[Node],
) -> Result<Outcome, NetdError> {
    let Some(own) = nodes
        .iter()
        .find(|n| n.metadata.name.as_deref() == Some(cfg.node_name.as_str()))
    else {
        return Ok(Outcome {
            waiting: Some(format!("node {} not found in the API", cfg.node_name)),
            ..Outcome::default()
        });
    };
    // Only the pod CIDRs of the own Node matter here: its annotations are ours and get
    // rewritten below, also when someone broke them.
    let pod_cidrs = match pod_cidrs_of(own) {
        Ok(c) => c,
        Err(e) => {
            return Ok(Outcome {
                waiting: Some(format!("own node unusable: {e}")),
                ..Outcome::default()
            })
        }
    };
    if pod_cidrs.is_empty() {
        return Ok(Outcome {
            waiting: Some(format!("node {} has no podCIDR yet", cfg.node_name)),
            ..Outcome::default()
        });
    }
    let underlay = kernel.underlay(cfg.iface.as_deref(), cfg.node_ip).await?;
    let mtu = overlay_mtu(underlay.mtu, underlay.ip);
    let (vxlan_index, mac) = kernel
        .ensure_vxlan(&VxlanSpec {
            name: VXLAN_DEVICE.to_string(),
            vni: cfg.vxlan_id,
            port: cfg.vxlan_port,
            local: underlay.ip,
            underlay_index: underlay.index,
            mtu,
            addresses: vtep_addresses(&pod_cidrs),
        })
        .await?;
    kernel
        .ensure_bridge(&BridgeSpec {
            name: cfg.bridge.clone(),
            mtu,
            addresses: pod_cidrs.iter().map(gateway_of).collect(),
        })
        .await?;
    let patch = annotations_to_patch(own, &own_annotations(mac, underlay.ip));

    let local = LocalFacts {
        underlay_ip: underlay.ip,
        underlay_index: underlay.index,
        underlay_nets: underlay.nets.clone(),
        vxlan_index,
        direct_routing: cfg.direct_routing,
    };
    let (desired, skipped) = desired_entries(&cfg.node_name, nodes, &local);
    for s in &skipped {
        match s {
            Skipped::Invalid(e) => tracing::warn!(error = %e, "skipping node"),
            Skipped::NotReady(n) => {
                tracing::debug!(node = %n, "skipping node without podCIDR or ferro annotations")
            }
            Skipped::SameUnderlay(n) => {
                tracing::warn!(node = %n, ip = %underlay.ip, "skipping node that claims this node's underlay address")
            }
        }
    }
    let observed = kernel.observe(vxlan_index).await?;
    let ops = plan(&desired, &observed);
    let mut applied = 0;
    // From here on a failure is recorded and the rest still done: one bad entry must not keep
    // the node from its conflist or the other peers.
    let mut errors: Vec<NetdError> = Vec::new();
    for op in &ops {
        match kernel.apply(vxlan_index, op).await {
            Ok(()) => {
                applied += 1;
                tracing::info!(?op, "applied");
            }
            Err(e) => {
                tracing::warn!(?op, error = %e, "op failed");
                errors.push(e.into());
            }
        }
    }

    for v6 in [false, true] {
        let rules = masq_rules(&pod_cidrs, &cfg.cluster_cidrs, v6);
        match kernel.ensure_masq(v6, &rules) {
            Ok(true) => tracing::info!(v6, rules = rules.len(), "masquerade rules applied"),
            Ok(false) => {}
            Err(e) => errors.push(e.into()),
        }
    }

    let files = [
        (cfg.subnet_file.clone(), subnet_env(&pod_cidrs, mtu)),
        (
            cfg.conflist_path(),
            conflist(
                &cfg.bridge,
                mtu,
                &cfg.subnet_file,
                cfg.cni_data_dir.as_ref(),
            ),
        ),
    ];
    for (path, text) in files {
        match write_if_changed(&path, &text) {
            Ok(true) => tracing::info!(path = %path.display(), "wrote"),
            Ok(false) => {}
            Err(source) => errors.push(NetdError::File { path, source }),
        }
    }
    Ok(Outcome {
        waiting: None,
        applied,
        patch,
        errors,
    })
}

async fn patch_annotations(
    api: &Api<Node>,
    node: &str,
    annotations: &BTreeMap<String, String>,
) -> Result<(), NetdError> {
    let body = serde_json::json!({"metadata": {"annotations": annotations}});
    api.patch(node, &PatchParams::default(), &Patch::Merge(&body))
        .await
        .map(drop)
        .map_err(|source| NetdError::Patch {
            node: node.to_string(),
            source,
        })
}

/// How often the waiting loop beats the watchdog's heartbeat (well under WatchdogSec / 2).
pub const HEARTBEAT_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Runs until `shutdown` resolves. The dataplane is left in place on exit.
///
/// `sd`: READY=1 after the first reconcile that programmed everything (no wait, no error), and
/// the watchdog's heartbeat at every turn and every [`HEARTBEAT_EVERY`] while it waits (a
/// reconcile that hangs stops the beats).
pub async fn run<K: Kernel>(
    cfg: Config,
    client: kube::Client,
    kernel: K,
    sd: &ferro_runtime::systemd::Systemd,
    shutdown: impl Future<Output = ()>,
) {
    let heartbeat = sd.heartbeat();
    let mut ready = false;
    let api: Api<Node> = Api::all(client);
    let informer = Informer::<Node>::new();
    let notify = Arc::new(tokio::sync::Notify::new());
    {
        let notify = notify.clone();
        informer.on_change(move |_| notify.notify_one());
    }
    // The informer retries a failing watch with backoff and logs each failure.
    let watch = informer.spawn(api.clone(), watcher::Config::default());
    let mut shutdown = std::pin::pin!(shutdown);
    tokio::select! {
        () = informer.wait_synced() => {}
        () = &mut shutdown => {
            watch.abort();
            return;
        }
    }
    tracing::info!(node = %cfg.node_name, "node list synced; reconciling");
    loop {
        let nodes: Vec<Node> = informer.list().iter().map(|n| (**n).clone()).collect();
        let span = tracing::info_span!("reconcile", node = %cfg.node_name);
        async {
            match reconcile(&cfg, &kernel, &nodes).await {
                Ok(out) => {
                    if let Some(w) = &out.waiting {
                        tracing::info!(reason = %w, "waiting");
                    } else {
                        if !out.patch.is_empty() {
                            match patch_annotations(&api, &cfg.node_name, &out.patch).await {
                                Ok(()) => tracing::info!(annotations = ?out.patch, "published node annotations"),
                                Err(e) => tracing::warn!(error = %e, "publishing annotations failed"),
                            }
                        }
                        for e in &out.errors {
                            tracing::warn!(error = %e, "reconcile incomplete; retrying at the next event or resync");
                        }
                        tracing::info!(applied = out.applied, errors = out.errors.len(), nodes = nodes.len(), "reconciled");
                        if !ready && out.errors.is_empty() {
                            ready = true;
                            sd.ready("routes programmed");
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "reconcile failed; retrying at the next event or resync"),
            }
        }
        .instrument(span)
        .await;
        heartbeat.beat();
        let resync = tokio::time::Instant::now() + cfg.resync_period;
        let stop = loop {
            tokio::select! {
                () = notify.notified() => break false,
                () = tokio::time::sleep_until(resync) => break false,
                () = tokio::time::sleep(HEARTBEAT_EVERY) => heartbeat.beat(),
                () = &mut shutdown => break true,
            }
        };
        if stop {
            break;
        }
    }
    watch.abort();
    tracing::info!("shutting down; the dataplane stays in place");
}
