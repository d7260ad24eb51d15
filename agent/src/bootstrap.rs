//! The TLS-bootstrap join (kubelet's `--bootstrap-kubeconfig`): when the node's kubeconfig is
//! missing or its client certificate has expired, the agent makes a key, asks the control plane
//! for a certificate with a CertificateSigningRequest (signer
//! kubernetes.io/kube-apiserver-client-kubelet, subject `system:node:<name>` in
//! `system:nodes`) using the bootstrap kubeconfig's credentials (a bootstrap token), waits for
//! it to be approved and signed, and writes `<cert-dir>/kubelet-client-current.pem` (certificate
//! and key) and the node's kubeconfig pointing at it, with the bootstrap kubeconfig's server and
//! CA. The pair is kept as rotation keeps it ([`crate::certificate::store`]): in
//! `kubelet-client-<time>.pem`, with `kubelet-client-current.pem` a symlink to it. The
//! request's name is derived from the key and the node, so an agent restarted while waiting
//! finds its request again (the key is kept in `kubelet-client.key.tmp` until then).

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::certificates::v1::{CertificateSigningRequest, CertificateSigningRequestSpec};
use k8s_openapi::ByteString;
use kube::api::{ObjectMeta, PostParams};
use kube::Api;

pub use crate::certificate::store::CLIENT_PEM;

pub const SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
const KEY_TMP: &str = "kubelet-client.key.tmp";

#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("bootstrap kubeconfig {path}: {why}")]
    Kubeconfig { path: PathBuf, why: String },
    #[error("making the key or the request: {0}")]
    Crypto(String),
    #[error("the API refused the certificate request: {0}")]
    Api(#[from] kube::Error),
    #[error("certificate request {name} was denied: {why}")]
    Denied { name: String, why: String },
    #[error("certificate request {name} failed: {why}")]
    Failed { name: String, why: String },
    #[error("certificate request {name} already exists for another key")]
    Taken { name: String },
}

pub struct Bootstrap<'a> {
    /// Where the node's kubeconfig is (written when missing or expired).
    pub kubeconfig: &'a Path,
    pub bootstrap_kubeconfig: &'a Path,
    pub cert_dir: &'a Path,
    pub node_name: &'a str,
    /// API servers to use in turn (the agent's --api-servers).
    pub servers: &'a [http::Uri],
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> BootstrapError + '_ {
    move |source| BootstrapError::Io { path: path.to_path_buf(), source }
}

fn write_private(path: &Path, data: &[u8]) -> Result<(), BootstrapError> {
    crate::certificate::store::write_private(path, data).map_err(io(path))
}

/// The notAfter (seconds since the epoch) of the client certificate a kubeconfig uses, when
/// it has one that parses.
pub fn client_cert_not_after(kubeconfig: &Path) -> Option<i64> {
    crate::certificate::store::validity(kubeconfig).map(|v| v.not_after)
}

/// Whether the node needs to bootstrap: no kubeconfig, or one whose client certificate is
/// unreadable or expired at `now`.
pub fn needed(kubeconfig: &Path, now: i64) -> bool {
    client_cert_not_after(kubeconfig).is_none_or(|t| t <= now)
}

/// The request's name: stable for a key and a node (upstream names it from a digest too).
pub fn request_name(public_key_der: &[u8], node: &str) -> String {
    use std::fmt::Write as _;
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(public_key_der);
    ctx.update(node.as_bytes());
    let digest = ctx.finish();
    let hex = digest.as_ref().iter().take(16).fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    });
    format!("node-csr-{hex}")
}

/// The node's kubeconfig: the bootstrap kubeconfig's cluster, the client certificate file.
pub fn node_kubeconfig(bootstrap: &kube::config::Kubeconfig, pem_path: &Path) -> Result<String, String> {
    use kube::config::{AuthInfo, Context, Kubeconfig, NamedAuthInfo, NamedContext};
    let ctx_name = bootstrap.current_context.clone().ok_or("no current-context")?;
    let ctx = bootstrap.contexts.iter().find(|c| c.name == ctx_name).and_then(|c| c.context.clone()).ok_or("the current context is missing")?;
    let cluster = bootstrap.clusters.iter().find(|c| c.name == ctx.cluster).cloned().ok_or("the context's cluster is missing")?;
    let pem = pem_path.display().to_string();
    let kc = Kubeconfig {
        clusters: vec![cluster.clone()],
        auth_infos: vec![NamedAuthInfo {
            name: "default-auth".into(),
            auth_info: Some(AuthInfo { client_certificate: Some(pem.clone()), client_key: Some(pem), ..Default::default() }),
            other: Default::default(),
        }],
        contexts: vec![NamedContext {
            name: "default-context".into(),
            context: Some(Context { cluster: cluster.name, user: Some("default-auth".into()), ..Default::default() }),
            other: Default::default(),
        }],
        current_context: Some("default-context".into()),
        api_version: Some("v1".into()),
        kind: Some("Config".into()),
        ..Default::default()
    };
    serde_yaml::to_string(&kc).map_err(|e| e.to_string())
}

/// A certificate request for `system:node:<node>` in `system:nodes`, signed with `key` (PEM).
pub fn node_request(key: &rcgen::KeyPair, node: &str) -> Result<String, BootstrapError> {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(|e| BootstrapError::Crypto(e.to_string()))?;
    let mut dn = rcgen::DistinguishedName::new();
    dn.push(rcgen::DnType::OrganizationName, "system:nodes");
    dn.push(rcgen::DnType::CommonName, format!("system:node:{node}"));
    params.distinguished_name = dn;
    params.serialize_request(key).and_then(|r| r.pem()).map_err(|e| BootstrapError::Crypto(e.to_string()))
}

/// Creates the CertificateSigningRequest `name` for `request_pem` (or finds the one this agent
/// made before a restart) and waits until it carries a certificate (PEM), is denied or failed.
pub async fn request_certificate(client: kube::Client, name: &str, request_pem: &str) -> Result<Vec<u8>, BootstrapError> {
    let api: Api<CertificateSigningRequest> = Api::all(client);
    let csr = CertificateSigningRequest {
        metadata: ObjectMeta { name: Some(name.to_string()), ..Default::default() },
        spec: CertificateSigningRequestSpec {
            request: ByteString(request_pem.as_bytes().to_vec()),
            signer_name: SIGNER.into(),
            usages: Some(vec!["digital signature".into(), "client auth".into()]),
            ..Default::default()
        },
        ..Default::default()
    };
    match api.create(&PostParams::default(), &csr).await {
        Ok(_) => tracing::info!(csr = %name, "certificate request created; waiting for approval"),
        Err(kube::Error::Api(s)) if s.code == 409 => {
            // made by this agent before a restart: the same key gives the same request
            let existing = api.get(name).await?;
            if existing.spec.request.0 != request_pem.as_bytes() {
                return Err(BootstrapError::Taken { name: name.to_string() });
            }
            tracing::info!(csr = %name, "certificate request exists; waiting for approval");
        }
        Err(e) => return Err(e.into()),
    }
    wait_for_certificate(&api, name).await
}

/// Joins when needed: on return the node's kubeconfig holds a valid client certificate.
pub async fn ensure(b: &Bootstrap<'_>) -> Result<(), BootstrapError> {
    if !needed(b.kubeconfig, jiff::Timestamp::now().as_second()) {
        return Ok(());
    }
    tracing::info!(kubeconfig = %b.kubeconfig.display(), "no valid client certificate: joining with the bootstrap kubeconfig");
    let kc_err = |why: String| BootstrapError::Kubeconfig { path: b.bootstrap_kubeconfig.to_path_buf(), why };
    let bootstrap_kc = kube::config::Kubeconfig::read_from(b.bootstrap_kubeconfig).map_err(|e| kc_err(e.to_string()))?;
    // the certificate directory holds the key: private to root
    std::fs::create_dir_all(b.cert_dir).map_err(io(b.cert_dir))?;
    let key_path = b.cert_dir.join(KEY_TMP);
    let key = match std::fs::read_to_string(&key_path).ok().and_then(|p| rcgen::KeyPair::from_pem(&p).ok()) {
        Some(k) => k,
        None => {
            let k = rcgen::KeyPair::generate().map_err(|e| BootstrapError::Crypto(e.to_string()))?;
            write_private(&key_path, k.serialize_pem().as_bytes())?;
            k
        }
    };
    let request_pem = node_request(&key, b.node_name)?;
    let name = request_name(key.public_key_raw(), b.node_name);

    let config = ferro_runtime::apiclient::load_config(Some(b.bootstrap_kubeconfig)).await.map_err(|e| kc_err(e.to_string()))?;
    let client = ferro_runtime::apiclient::build(config, b.servers).map_err(|e| kc_err(e.to_string()))?;
    let cert = request_certificate(client, &name, &request_pem).await?;
    let pem_path = crate::certificate::store::install(b.cert_dir, &cert, key.serialize_pem().as_bytes(), jiff::Timestamp::now())
        .map_err(io(b.cert_dir))?;
    let kubeconfig = node_kubeconfig(&bootstrap_kc, &pem_path).map_err(kc_err)?;
    if let Some(dir) = b.kubeconfig.parent() {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
    }
    write_private(b.kubeconfig, kubeconfig.as_bytes())?;
    let _ = std::fs::remove_file(&key_path).map_err(|e| tracing::debug!(error = %e, "removing the key's temporary file"));
    tracing::info!(csr = %name, kubeconfig = %b.kubeconfig.display(), "client certificate issued; joined");
    Ok(())
}

/// Waits (watching the request) until it carries a certificate, or is denied or failed.
async fn wait_for_certificate(api: &Api<CertificateSigningRequest>, name: &str) -> Result<Vec<u8>, BootstrapError> {
    use futures::TryStreamExt as _;
    use kube::runtime::watcher;
    let answer = |csr: &CertificateSigningRequest| -> Option<Result<Vec<u8>, BootstrapError>> {
        let status = csr.status.as_ref()?;
        if let Some(c) = status.certificate.as_ref().filter(|c| !c.0.is_empty()) {
            return Some(Ok(c.0.clone()));
        }
        for c in status.conditions.iter().flatten() {
            let why = format!("{}: {}", c.reason.clone().unwrap_or_default(), c.message.clone().unwrap_or_default());
            match c.type_.as_str() {
                "Denied" => return Some(Err(BootstrapError::Denied { name: name.to_string(), why })),
                "Failed" => return Some(Err(BootstrapError::Failed { name: name.to_string(), why })),
                _ => {}
            }
        }
        None
    };
    let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
    use kube::runtime::WatchStreamExt as _;
    let mut stream = std::pin::pin!(watcher::watcher(api.clone(), cfg).default_backoff().applied_objects());
    let mut waiting_since = std::time::Instant::now();
    loop {
        match tokio::time::timeout(Duration::from_secs(60), stream.try_next()).await {
            Ok(Ok(Some(csr))) => {
                if let Some(a) = answer(&csr) {
                    return a;
                }
            }
            Ok(Ok(None)) => return Err(BootstrapError::Failed { name: name.into(), why: "the watch ended".into() }),
            Ok(Err(e)) => tracing::warn!(error = %e, "watching the certificate request"),
            Err(_) => {}
        }
        if waiting_since.elapsed() >= Duration::from_secs(60) {
            tracing::info!(csr = %name, "still waiting for the certificate request to be approved (kubectl certificate approve {name})");
            waiting_since = std::time::Instant::now();
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_request_name_is_stable_for_a_key_and_a_node() {
        let a = request_name(b"key", "n1");
        assert_eq!(a, request_name(b"key", "n1"));
        assert_ne!(a, request_name(b"key", "n2"));
        assert_ne!(a, request_name(b"other", "n1"));
        assert!(a.starts_with("node-csr-") && a.len() == "node-csr-".len() + 32);
    }

    #[test]
    fn a_missing_or_expired_client_certificate_needs_a_join() {
        let dir = tempfile::tempdir().unwrap();
        let kc = dir.path().join("kubeconfig");
        assert!(needed(&kc, 0), "no kubeconfig");
        // a kubeconfig pointing at a certificate valid until 2030
        let kp = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.not_after = rcgen::date_time_ymd(2030, 1, 1);
        let cert = p.self_signed(&kp).unwrap();
        let pem = dir.path().join(CLIENT_PEM);
        std::fs::write(&pem, format!("{}{}", cert.pem(), kp.serialize_pem())).unwrap();
        let bootstrap: kube::config::Kubeconfig = serde_yaml::from_str(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://10.0.0.1:6443\n    certificate-authority-data: Q0E=\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: tok\ncurrent-context: x\nusers:\n- name: tok\n  user:\n    token: abcdef.0123456789abcdef\n",
        )
        .unwrap();
        std::fs::write(&kc, node_kubeconfig(&bootstrap, &pem).unwrap()).unwrap();
        let written = kube::config::Kubeconfig::read_from(&kc).unwrap();
        assert_eq!(written.clusters[0].cluster.as_ref().unwrap().server.as_deref(), Some("https://10.0.0.1:6443"));
        assert!(written.auth_infos[0].auth_info.as_ref().unwrap().token.is_none(), "the token is not carried over");
        let until = rcgen::date_time_ymd(2030, 1, 1).unix_timestamp();
        assert_eq!(client_cert_not_after(&kc), Some(until));
        assert!(!needed(&kc, until - 1));
        assert!(needed(&kc, until), "expired");
        std::fs::write(&pem, "garbage").unwrap();
        assert!(needed(&kc, 0), "unreadable");
    }
}
