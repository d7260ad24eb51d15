//! The ServiceAccount admission of pods (upstream's `ServiceAccount` admission plugin): a pod
//! runs as `default` unless it names a service account, the account must exist, and unless
//! `automountServiceAccountToken` is false (on the pod, else on the account) every container
//! gets the `kube-api-access-<random>` projected volume at
//! `/var/run/secrets/kubernetes.io/serviceaccount`: a bound token (`token`, 3607 s, refreshed
//! by the node), the cluster CA (`ca.crt` from the `kube-root-ca.crt` ConfigMap) and the
//! namespace (`namespace`, from the downward API).
//!
//! One deliberate difference: a missing `default` account of an active namespace is created
//! on the spot instead of refusing the pod until the serviceaccount loop has made it (upstream
//! refuses with "error looking up service account"; a namespace created just before its first
//! pod is the usual victim).

use serde_json::{json, Value};

use crate::api::Api;
use crate::error::ApiError;
use crate::resources;

pub const MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
pub const VOLUME_PREFIX: &str = "kube-api-access-";
const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// The volume and its mounts, pure: `sa` is the account, `suffix` the random part of the
/// volume's name. The pod's service account name is already set.
pub fn inject(pod: &mut Value, sa: &Value, suffix: &str) {
    let automount = pod
        .pointer("/spec/automountServiceAccountToken")
        .and_then(Value::as_bool)
        .or_else(|| sa.get("automountServiceAccountToken").and_then(Value::as_bool))
        .unwrap_or(true);
    if !automount {
        return;
    }
    let lists = ["initContainers", "containers"];
    let mounted = lists.iter().any(|l| {
        pod.pointer(&format!("/spec/{l}")).and_then(Value::as_array).into_iter().flatten().any(|c| {
            c.get("volumeMounts")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .any(|m| m.get("mountPath").and_then(Value::as_str).map(|p| p.trim_end_matches('/')) == Some(MOUNT_PATH))
        })
    });
    if mounted {
        return;
    }
    let name = format!("{VOLUME_PREFIX}{suffix}");
    let volume = json!({"name": name, "projected": {"defaultMode": 420, "sources": [
        {"serviceAccountToken": {"expirationSeconds": crate::sa_token::POD_TOKEN_EXPIRATION_SECONDS, "path": "token"}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
    ]}});
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else { return };
    match spec.get_mut("volumes").and_then(Value::as_array_mut) {
        Some(v) => v.push(volume),
        None => {
            spec.insert("volumes".into(), json!([volume]));
        }
    }
    for l in lists {
        for c in spec.get_mut(l).and_then(Value::as_array_mut).into_iter().flatten() {
            let Some(c) = c.as_object_mut() else { continue };
            let mount = json!({"name": name, "readOnly": true, "mountPath": MOUNT_PATH});
            match c.get_mut("volumeMounts").and_then(Value::as_array_mut) {
                Some(m) => m.push(mount),
                None => {
                    c.insert("volumeMounts".into(), json!([mount]));
                }
            }
        }
    }
}

/// Five characters of upstream's random name alphabet.
fn suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    use rand::Rng as _;
    let mut rng = rand::rng();
    (0..5).map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char).collect()
}

/// Admits a pod being created in `ns`.
pub async fn admit_pod(api: &Api, ns: &str, name: &str, pod: &mut Value) -> Result<(), ApiError> {
    if pod.pointer(&format!("/metadata/annotations/{}", MIRROR_ANNOTATION.replace('/', "~1"))).is_some() {
        return Ok(());
    }
    let sa_name = pod
        .pointer("/spec/serviceAccountName")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .or_else(|| pod.pointer("/spec/serviceAccount").and_then(Value::as_str).filter(|s| !s.is_empty()))
        .unwrap_or("default")
        .to_string();
    if let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) {
        spec.insert("serviceAccountName".into(), json!(sa_name));
        spec.insert("serviceAccount".into(), json!(sa_name));
    }
    let sas = resources::find("", "v1", "serviceaccounts").ok_or_else(|| ApiError::internal("no serviceaccounts"))?;
    let sa = match api.get(sas, Some(ns), &sa_name).await {
        Ok(r) => r.json()?,
        Err(e) if e.code == 404 && sa_name == "default" => {
            let obj = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": ns}});
            // boxed: this is a create inside a create
            match Box::pin(api.create(sas, Some(ns), obj, false)).await {
                Ok(r) => r.json()?,
                Err(e) if e.code == 409 => api.get(sas, Some(ns), "default").await?.json()?,
                Err(e) => return Err(e),
            }
        }
        Err(e) if e.code == 404 => {
            return Err(ApiError::forbidden(
                "pods",
                name,
                format!("error looking up service account {ns}/{sa_name}: serviceaccount {sa_name:?} not found"),
            ))
        }
        Err(e) => return Err(e),
    };
    inject(pod, &sa, &suffix());
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn pod() -> Value {
        json!({"spec": {"serviceAccountName": "app", "initContainers": [{"name": "i"}],
                        "containers": [{"name": "a"}, {"name": "b", "volumeMounts": [{"name": "d", "mountPath": "/data"}]}],
                        "volumes": [{"name": "d", "emptyDir": {}}]}})
    }

    #[test]
    fn every_container_gets_the_api_access_volume() {
        let mut p = pod();
        inject(&mut p, &json!({}), "abcde");
        let vols = p["spec"]["volumes"].as_array().unwrap();
        assert_eq!(vols[1]["name"], "kube-api-access-abcde");
        let sources = vols[1]["projected"]["sources"].as_array().unwrap();
        assert_eq!(sources[0]["serviceAccountToken"], json!({"expirationSeconds": 3607, "path": "token"}));
        assert_eq!(sources[1]["configMap"]["name"], "kube-root-ca.crt");
        assert_eq!(sources[2]["downwardAPI"]["items"][0]["fieldRef"]["fieldPath"], "metadata.namespace");
        for c in ["initContainers", "containers"] {
            for container in p["spec"][c].as_array().unwrap() {
                let mounts = container["volumeMounts"].as_array().unwrap();
                assert_eq!(mounts.last().unwrap(), &json!({"name": "kube-api-access-abcde", "readOnly": true, "mountPath": MOUNT_PATH}));
            }
        }
    }

    #[test]
    fn automount_false_or_an_own_mount_leaves_the_pod_alone() {
        let mut p = pod();
        inject(&mut p, &json!({"automountServiceAccountToken": false}), "abcde");
        assert_eq!(p, pod());
        // the pod's own setting wins over the account's
        let mut p = pod();
        p["spec"]["automountServiceAccountToken"] = json!(true);
        inject(&mut p, &json!({"automountServiceAccountToken": false}), "abcde");
        assert_eq!(p["spec"]["volumes"].as_array().unwrap().len(), 2);
        let mut p = pod();
        p["spec"]["containers"][0]["volumeMounts"] = json!([{"name": "mine", "mountPath": MOUNT_PATH}]);
        let before = p.clone();
        inject(&mut p, &json!({}), "abcde");
        assert_eq!(p, before);
    }
}
