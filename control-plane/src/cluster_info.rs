//! The `cluster-info` ConfigMap in `kube-public` (kubeadm's discovery for a joining node): a
//! kubeconfig naming the API server and carrying the cluster CA, readable without credentials
//! (Role and RoleBinding `ferro:bootstrap-signer-clusterinfo` for `system:anonymous`, as
//! kubeadm's `kubeadm:bootstrap-signer-clusterinfo`). The `bootstrapsigner` loop signs it with
//! the bootstrap tokens; a joining node checks a signature with its token and pins the CA by
//! its hash (k8s_semantics::bootstrap).
//!
//! Every API server publishes it at start when it is missing, and puts its CA in it when the
//! CA there is another one; the server address in it is left as it is (the first server's
//! `--advertise-address`; edit it to name a load-balanced address: the signatures follow).

use base64::Engine as _;
use k8s_semantics::bootstrap::{CLUSTER_INFO, CLUSTER_INFO_NAMESPACE, KUBECONFIG_KEY};
use serde_json::{json, Value};

use crate::api::{Api, Endpoint};
use crate::error::ApiError;
use crate::resources;

/// The Role and RoleBinding that let anyone read the ConfigMap (and nothing else).
pub const READER: &str = "ferro:bootstrap-signer-clusterinfo";

/// The published kubeconfig: one nameless cluster, no users, laid out as kubeadm writes it.
pub fn kubeconfig(server: &str, ca_pem: &str) -> String {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem.as_bytes());
    format!(
        "apiVersion: v1\nclusters:\n- cluster:\n    certificate-authority-data: {ca}\n    server: {server}\n  name: \"\"\ncontexts: null\ncurrent-context: \"\"\nkind: Config\npreferences: {{}}\nusers: null\n"
    )
}

/// The CA (PEM) a published kubeconfig carries.
pub fn kubeconfig_ca(text: &str) -> Option<String> {
    let kc: Value = serde_yaml::from_str(text).ok()?;
    let data = kc.pointer("/clusters/0/cluster/certificate-authority-data")?.as_str()?;
    let pem = base64::engine::general_purpose::STANDARD.decode(data.trim()).ok()?;
    String::from_utf8(pem).ok()
}

/// What to write about the ConfigMap: None when it is there with this CA.
pub fn plan(existing: Option<&Value>, server: &str, ca_pem: &str) -> Option<Value> {
    let Some(cm) = existing else {
        return Some(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": CLUSTER_INFO, "namespace": CLUSTER_INFO_NAMESPACE},
            "data": {KUBECONFIG_KEY: kubeconfig(server, ca_pem)}}));
    };
    let text = cm.pointer(&format!("/data/{KUBECONFIG_KEY}")).and_then(Value::as_str);
    if text.and_then(kubeconfig_ca).is_some_and(|ca| ca.trim() == ca_pem.trim()) {
        return None;
    }
    // keep the server an administrator may have set; the CA is this cluster's
    let kept = text
        .and_then(|t| serde_yaml::from_str::<Value>(t).ok())
        .and_then(|kc| kc.pointer("/clusters/0/cluster/server").and_then(Value::as_str).map(str::to_string))
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| server.to_string());
    let mut out = cm.clone();
    out["data"][KUBECONFIG_KEY] = json!(kubeconfig(&kept, ca_pem));
    Some(out)
}

fn reader_objects() -> [(&'static str, Value); 2] {
    [
        ("roles", json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": READER, "namespace": CLUSTER_INFO_NAMESPACE},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [CLUSTER_INFO], "verbs": ["get"]}]})),
        ("rolebindings", json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": READER, "namespace": CLUSTER_INFO_NAMESPACE},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": READER},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "system:anonymous"}]})),
    ]
}

/// Publishes the ConfigMap and its readers' Role and RoleBinding (each API server at start;
/// another server's concurrent write is read again).
pub async fn publish(api: &Api, server: &str, ca_pem: &str) -> Result<(), ApiError> {
    let find = |group: &str, plural: &str| resources::find(group, "v1", plural).ok_or_else(|| ApiError::internal(format!("no {plural} resource")));
    let ns = Some(CLUSTER_INFO_NAMESPACE);
    for (plural, obj) in reader_objects() {
        let res = find("rbac.authorization.k8s.io", plural)?;
        match api.get(res, ns, READER).await {
            Ok(_) => {}
            Err(e) if e.code == 404 => match api.create(res, ns, obj, false).await {
                Ok(_) => {}
                Err(e) if e.code == 409 => {}
                Err(e) => return Err(e),
            },
            Err(e) => return Err(e),
        }
    }
    let res = find("", "configmaps")?;
    for attempt in 0.. {
        let existing = match api.get(res, ns, CLUSTER_INFO).await {
            Ok(r) => Some(r.json()?),
            Err(e) if e.code == 404 => None,
            Err(e) => return Err(e),
        };
        let Some(want) = plan(existing.as_ref(), server, ca_pem) else { return Ok(()) };
        let result = match existing {
            None => api.create(res, ns, want, false).await.map(drop),
            Some(_) => api.update(res, ns, CLUSTER_INFO, want, Endpoint::Main, false).await.map(drop),
        };
        match result {
            Ok(()) => {
                tracing::info!(server, "cluster-info published in kube-public");
                return Ok(());
            }
            Err(e) if matches!(e.code, 409 | 404) && attempt < 5 => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const CA: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

    #[test]
    fn the_configmap_is_made_once_and_follows_the_ca_keeping_its_server() {
        let made = plan(None, "https://10.0.0.1:6443", CA).unwrap();
        let text = made["data"]["kubeconfig"].as_str().unwrap();
        assert_eq!(kubeconfig_ca(text).unwrap(), CA);
        let kc: Value = serde_yaml::from_str(text).unwrap();
        assert_eq!(kc["clusters"][0]["cluster"]["server"], "https://10.0.0.1:6443");
        assert_eq!(kc["clusters"][0]["name"], "");
        assert!(kc["users"].is_null() && kc["contexts"].is_null(), "no credentials in a public object");
        assert_eq!(made["metadata"]["namespace"], "kube-public");
        // as it should be: nothing to do, also from another server advertising another address
        assert_eq!(plan(Some(&made), "https://10.0.0.2:6443", CA), None);
        // an administrator's server kept, the CA replaced
        let mut edited = made.clone();
        edited["data"]["kubeconfig"] = json!(kubeconfig("https://lb.example:6443", "-----BEGIN CERTIFICATE-----\nOLD\n-----END CERTIFICATE-----\n"));
        edited["data"]["jws-kubeconfig-abcdef"] = json!("x..y");
        let fixed = plan(Some(&edited), "https://10.0.0.1:6443", CA).unwrap();
        let kc: Value = serde_yaml::from_str(fixed["data"]["kubeconfig"].as_str().unwrap()).unwrap();
        assert_eq!(kc["clusters"][0]["cluster"]["server"], "https://lb.example:6443");
        assert_eq!(kubeconfig_ca(fixed["data"]["kubeconfig"].as_str().unwrap()).unwrap(), CA);
        assert_eq!(fixed["data"]["jws-kubeconfig-abcdef"], "x..y", "the signer's business");
        // unreadable content: made again with this server
        let mut broken = made.clone();
        broken["data"] = json!({});
        let again = plan(Some(&broken), "https://10.0.0.1:6443", CA).unwrap();
        assert_eq!(again["data"]["kubeconfig"], made["data"]["kubeconfig"]);
    }
}
