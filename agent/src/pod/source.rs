//! Where pods come from: the API (a watch of the pods bound to this node) and the static pod
//! manifests in --pod-manifest-path, with their mirror pods in the API.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ferro_runtime::{Change, Informer};
use k8s_openapi::api::core::v1::{Pod, Toleration};
use kube::runtime::watcher;

use crate::pod::exec::{PodWorkers, Source};

/// Annotations upstream puts on static pods.
pub const ANN_CONFIG_SOURCE: &str = "kubernetes.io/config.source";
pub const ANN_CONFIG_HASH: &str = "kubernetes.io/config.hash";
pub const ANN_CONFIG_MIRROR: &str = "kubernetes.io/config.mirror";
pub const ANN_CONFIG_SEEN: &str = "kubernetes.io/config.seen";

/// How often the manifest directory is read again (upstream's file check frequency).
pub const FILE_CHECK_FREQUENCY: Duration = Duration::from_secs(20);

fn fnv1a_128(data: &[u8]) -> u128 {
    const OFFSET: u128 = 0x6c62272e07bb014262b821756295c58d;
    const PRIME: u128 = 0x0000000001000000000000000000013B;
    data.iter().fold(OFFSET, |h, b| (h ^ u128::from(*b)).wrapping_mul(PRIME))
}

fn is_mirror(pod: &Pod) -> bool {
    pod.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(ANN_CONFIG_MIRROR))
}

/// Watches the pods bound to `node` (fieldSelector spec.nodeName) and hands them to the
/// workers; mirror pods are left out (their static pod is the desired state).
pub fn watch_api(client: kube::Client, node: &str, workers: PodWorkers) -> Arc<Informer<Pod>> {
    let informer = Informer::<Pod>::new();
    informer.on_change(move |c| match c {
        Change::Applied { new, .. } => {
            if !is_mirror(new) {
                workers.upsert((**new).clone(), Source::Api);
            }
        }
        Change::Deleted(old) => {
            if !is_mirror(old) {
                if let Some(uid) = old.metadata.uid.as_deref() {
                    workers.remove(uid);
                }
            }
        }
    });
    let cfg = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    informer.spawn(kube::Api::all(client), cfg);
    informer
}

/// A static pod read from `file`: named `<name>-<node>`, namespace "default" unless set, a UID
/// derived from the file's path, content and the node (so an edit makes a new pod, as
/// upstream), bound to `node`, tolerating every NoExecute taint.
pub fn static_pod(file: &Path, text: &str, node: &str) -> Result<Pod, String> {
    let mut pod: Pod = serde_yaml::from_str(text).map_err(|e| format!("invalid pod manifest: {e}"))?;
    let name = pod.metadata.name.clone().filter(|n| !n.is_empty()).ok_or("the manifest has no metadata.name")?;
    if pod.spec.as_ref().is_none_or(|s| s.containers.is_empty()) {
        return Err("the manifest has no containers".into());
    }
    // Upstream's UID of a static pod is a hex digest of the manifest, node and source; a
    // 128-bit FNV-1a (stable across restarts and builds) serves the same purpose.
    let key = format!("{}\n{node}\n{text}", file.display());
    let uid = format!("{:032x}", fnv1a_128(key.as_bytes()));
    pod.metadata.name = Some(format!("{name}-{node}"));
    if pod.metadata.namespace.as_deref().is_none_or(str::is_empty) {
        pod.metadata.namespace = Some("default".into());
    }
    pod.metadata.uid = Some(uid.clone());
    let ann = pod.metadata.annotations.get_or_insert_with(BTreeMap::new);
    ann.insert(ANN_CONFIG_SOURCE.into(), "file".into());
    ann.insert(ANN_CONFIG_HASH.into(), uid);
    if let Some(spec) = pod.spec.as_mut() {
        spec.node_name = Some(node.to_string());
        spec.tolerations.get_or_insert_with(Vec::new).push(Toleration {
            operator: Some("Exists".into()),
            effect: Some("NoExecute".into()),
            ..Default::default()
        });
    }
    Ok(pod)
}

/// Reads the manifests of `dir` (files not starting with '.'), logging the invalid ones.
pub fn read_manifests(dir: &Path, node: &str) -> Vec<(PathBuf, Pod)> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    let mut files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    files.sort();
    for f in files {
        if f.file_name().and_then(|n| n.to_str()).is_none_or(|n| n.starts_with('.')) || !f.is_file() {
            continue;
        }
        let text = match std::fs::read_to_string(&f) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(file = %f.display(), error = %e, "cannot read static pod manifest");
                continue;
            }
        };
        match static_pod(&f, &text, node) {
            Ok(p) => out.push((f, p)),
            Err(e) => tracing::warn!(file = %f.display(), error = %e, "skipping static pod manifest"),
        }
    }
    out
}

/// Keeps the workers' static pods equal to the manifests of `dir`, and their mirror pods in
/// the API when there is one.
pub async fn static_pods_loop(dir: PathBuf, node: String, workers: PodWorkers, client: Option<kube::Client>) {
    let mut known: BTreeSet<String> = BTreeSet::new();
    loop {
        let pods = read_manifests(&dir, &node);
        let now: BTreeSet<String> = pods.iter().filter_map(|(_, p)| p.metadata.uid.clone()).collect();
        for uid in known.difference(&now) {
            workers.remove(uid);
        }
        for (_, p) in &pods {
            let uid = p.metadata.uid.clone().unwrap_or_default();
            if !known.contains(&uid) {
                tracing::info!(pod = %p.metadata.name.as_deref().unwrap_or(""), "static pod");
            }
            workers.upsert(p.clone(), Source::File);
        }
        if let Some(c) = client.as_ref() {
            if let Err(e) = sync_mirrors(c, &node, &pods).await {
                tracing::debug!(error = %e, "mirror pods");
            }
        }
        known = now;
        tokio::time::sleep(FILE_CHECK_FREQUENCY).await;
    }
}

/// Creates the missing mirror pods, replaces outdated ones, deletes those without a manifest.
async fn sync_mirrors(client: &kube::Client, node: &str, pods: &[(PathBuf, Pod)]) -> Result<(), kube::Error> {
    let all: kube::Api<Pod> = kube::Api::all(client.clone());
    let lp = kube::api::ListParams::default().fields(&format!("spec.nodeName={node}"));
    let existing: Vec<Pod> = all.list(&lp).await?.items.into_iter().filter(is_mirror).collect();
    let want: BTreeMap<(String, String), &Pod> = pods
        .iter()
        .map(|(_, p)| {
            ((p.metadata.namespace.clone().unwrap_or_default(), p.metadata.name.clone().unwrap_or_default()), p)
        })
        .collect();
    for m in &existing {
        let key = (m.metadata.namespace.clone().unwrap_or_default(), m.metadata.name.clone().unwrap_or_default());
        let hash = m.metadata.annotations.as_ref().and_then(|a| a.get(ANN_CONFIG_MIRROR)).cloned();
        let keep = want.get(&key).is_some_and(|p| p.metadata.uid == hash);
        if !keep {
            let api: kube::Api<Pod> = kube::Api::namespaced(client.clone(), &key.0);
            let _ = api.delete(&key.1, &kube::api::DeleteParams::default().grace_period(0)).await;
        }
    }
    for ((ns, name), p) in want {
        let present = existing.iter().any(|m| {
            m.metadata.namespace.as_deref() == Some(&ns)
                && m.metadata.name.as_deref() == Some(&name)
                && m.metadata.annotations.as_ref().and_then(|a| a.get(ANN_CONFIG_MIRROR)) == p.metadata.uid.as_ref()
        });
        if present {
            continue;
        }
        let mut mirror = p.clone();
        mirror.metadata.uid = None;
        mirror.metadata.resource_version = None;
        mirror.status = None;
        let hash = p.metadata.uid.clone().unwrap_or_default();
        mirror.metadata.annotations.get_or_insert_with(BTreeMap::new).insert(ANN_CONFIG_MIRROR.into(), hash);
        let api: kube::Api<Pod> = kube::Api::namespaced(client.clone(), &ns);
        match api.create(&kube::api::PostParams::default(), &mirror).await {
            Ok(_) => tracing::info!(pod = %format!("{ns}/{name}"), "mirror pod created"),
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn static_pod_naming_and_uid() {
        let text = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: c\n    image: busybox\n";
        let p = static_pod(Path::new("/etc/m/web.yaml"), text, "node1").unwrap();
        assert_eq!(p.metadata.name.as_deref(), Some("web-node1"));
        assert_eq!(p.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(p.spec.as_ref().unwrap().node_name.as_deref(), Some("node1"));
        let again = static_pod(Path::new("/etc/m/web.yaml"), text, "node1").unwrap();
        assert_eq!(p.metadata.uid, again.metadata.uid);
        let edited = static_pod(Path::new("/etc/m/web.yaml"), &text.replace("busybox", "busybox:2"), "node1").unwrap();
        assert_ne!(p.metadata.uid, edited.metadata.uid);
        assert_eq!(p.metadata.annotations.as_ref().unwrap()[ANN_CONFIG_SOURCE], "file");
    }

    #[test]
    fn invalid_manifests_are_errors() {
        assert!(static_pod(Path::new("/x"), "{not yaml", "n").unwrap_err().contains("invalid pod manifest"));
        assert!(static_pod(Path::new("/x"), "kind: Pod\nspec:\n  containers: []\n", "n").is_err());
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("bad.yaml"), "metadata: [").unwrap();
        std::fs::write(dir.path().join(".hidden.yaml"), "x").unwrap();
        std::fs::write(dir.path().join("ok.yaml"), "metadata:\n  name: a\nspec:\n  containers:\n  - name: c\n    image: i\n").unwrap();
        let pods = read_manifests(dir.path(), "n");
        assert_eq!(pods.len(), 1);
        assert_eq!(pods[0].1.metadata.name.as_deref(), Some("a-n"));
    }
}
