//! Join discovery with a bootstrap token, as `kubeadm join --discovery-token-ca-cert-hash`:
//! `ferro-agent discover` fetches `kube-public/cluster-info` from the API server without
//! trusting it yet (the server's certificate is not checked on this first read), checks the
//! ConfigMap's signature for the token (`jws-kubeconfig-<id>`: only a server that knows the
//! token's secret can have made it), checks the CA it carries against the pinned hashes, reads
//! the ConfigMap again over a connection verified with that CA, and writes the bootstrap
//! kubeconfig (the server, the CA, the token) that `--bootstrap-kubeconfig` takes.

use std::path::Path;
use std::time::Duration;

use base64::Engine as _;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_semantics::bootstrap::{check_pins, signature_valid, split_token, PinError, CLUSTER_INFO, CLUSTER_INFO_NAMESPACE, JWS_KEY_PREFIX, KUBECONFIG_KEY};

#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error("the token is not a bootstrap token ([a-z0-9]{{6}}.[a-z0-9]{{16}})")]
    Token,
    #[error("{0:?} is not an https:// URL of the API server")]
    Server(String),
    #[error("at least one --ca-cert-hash sha256:<hex> is needed (the control plane's `ferro-control-plane token create --print-join-command` prints it)")]
    NoPin,
    #[error(transparent)]
    Pin(#[from] PinError),
    #[error("reading {CLUSTER_INFO_NAMESPACE}/{CLUSTER_INFO}: {0}")]
    Fetch(String),
    #[error("{CLUSTER_INFO_NAMESPACE}/{CLUSTER_INFO} has no kubeconfig")]
    NoContent,
    #[error("{CLUSTER_INFO_NAMESPACE}/{CLUSTER_INFO} is not signed for token id {0} (unknown or expired token, or the bootstrapsigner loop is not running)")]
    NotSigned(String),
    #[error("{CLUSTER_INFO_NAMESPACE}/{CLUSTER_INFO}'s signature for token id {0} does not match: the server does not know this token's secret")]
    BadSignature(String),
    #[error("{CLUSTER_INFO_NAMESPACE}/{CLUSTER_INFO}'s kubeconfig: {0}")]
    Content(String),
    #[error("{CLUSTER_INFO_NAMESPACE}/{CLUSTER_INFO} read over the verified connection differs from the signed one")]
    Changed,
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
}

impl DiscoveryError {
    /// Worth another try (the server not up yet, the signer not done yet).
    pub fn transient(&self) -> bool {
        matches!(self, DiscoveryError::Fetch(_) | DiscoveryError::NotSigned(_))
    }
}

/// The CA (PEM) of a signed, pinned cluster-info: the checks of the first, unverified read.
pub fn verify(cm: &ConfigMap, token: &str, pins: &[String]) -> Result<Vec<u8>, DiscoveryError> {
    let (id, secret) = split_token(token).ok_or(DiscoveryError::Token)?;
    if pins.is_empty() {
        return Err(DiscoveryError::NoPin);
    }
    let data = cm.data.clone().unwrap_or_default();
    let content = data.get(KUBECONFIG_KEY).ok_or(DiscoveryError::NoContent)?;
    let sig = data.get(&format!("{JWS_KEY_PREFIX}{id}")).ok_or_else(|| DiscoveryError::NotSigned(id.to_string()))?;
    if !signature_valid(sig, content, id, secret) {
        return Err(DiscoveryError::BadSignature(id.to_string()));
    }
    let kc: serde_json::Value = serde_yaml::from_str(content).map_err(|e| DiscoveryError::Content(e.to_string()))?;
    let ca_b64 = kc
        .pointer("/clusters/0/cluster/certificate-authority-data")
        .and_then(|v| v.as_str())
        .ok_or_else(|| DiscoveryError::Content("no certificate-authority-data in its first cluster".into()))?;
    let ca_pem = base64::engine::general_purpose::STANDARD.decode(ca_b64.trim()).map_err(|e| DiscoveryError::Content(format!("certificate-authority-data: {e}")))?;
    let ders = pem_certificates(&ca_pem).map_err(DiscoveryError::Content)?;
    // kubeadm: the CA is the first certificate; every pin names a public key hash
    check_pins(&ders[0], pins)?;
    Ok(ca_pem)
}

fn pem_certificates(pem: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    use rustls::pki_types::pem::PemObject as _;
    let ders: Vec<Vec<u8>> = rustls::pki_types::CertificateDer::pem_slice_iter(pem)
        .map(|c| c.map(|c| c.to_vec()).map_err(|e| format!("certificate-authority-data: {e}")))
        .collect::<Result<_, _>>()?;
    if ders.is_empty() {
        return Err("certificate-authority-data holds no certificate".into());
    }
    Ok(ders)
}

/// The bootstrap kubeconfig: the server the node was told, the discovered CA, the token.
pub fn bootstrap_kubeconfig(server: &str, ca_pem: &[u8], token: &str) -> String {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: ferro\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\ncontexts:\n- name: tls-bootstrap\n  context:\n    cluster: ferro\n    user: tls-bootstrap\ncurrent-context: tls-bootstrap\nusers:\n- name: tls-bootstrap\n  user:\n    token: {token}\n"
    )
}

async fn fetch(server: &http::Uri, ca_pem: Option<&[u8]>) -> Result<ConfigMap, DiscoveryError> {
    let mut config = kube::Config::new(server.clone());
    config.connect_timeout = Some(Duration::from_secs(10));
    config.read_timeout = Some(Duration::from_secs(10));
    match ca_pem {
        // the first read: nothing is trusted yet; what it brings is checked by signature and pin
        None => config.accept_invalid_certs = true,
        Some(pem) => config.root_cert = Some(pem_certificates(pem).map_err(DiscoveryError::Content)?),
    }
    let client = kube::Client::try_from(config).map_err(|e| DiscoveryError::Fetch(e.to_string()))?;
    kube::Api::<ConfigMap>::namespaced(client, CLUSTER_INFO_NAMESPACE).get(CLUSTER_INFO).await.map_err(|e| DiscoveryError::Fetch(e.to_string()))
}

/// Discovers the cluster's CA at `server` and returns the bootstrap kubeconfig; transient
/// failures are tried again every 2 s until `timeout` (kubeadm's discovery timeout is 5 min).
pub async fn discover(server: &str, token: &str, pins: &[String], timeout: Duration) -> Result<String, DiscoveryError> {
    split_token(token).ok_or(DiscoveryError::Token)?;
    if pins.is_empty() {
        return Err(DiscoveryError::NoPin);
    }
    for p in pins {
        k8s_semantics::bootstrap::parse_pin(p)?;
    }
    let uri: http::Uri = server.parse().map_err(|_| DiscoveryError::Server(server.to_string()))?;
    if uri.scheme_str() != Some("https") || uri.host().is_none() {
        return Err(DiscoveryError::Server(server.to_string()));
    }
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let attempt = async {
            let first = fetch(&uri, None).await?;
            let ca = verify(&first, token, pins)?;
            let second = fetch(&uri, Some(&ca)).await?;
            if second.data.as_ref().and_then(|d| d.get(KUBECONFIG_KEY)) != first.data.as_ref().and_then(|d| d.get(KUBECONFIG_KEY)) {
                return Err(DiscoveryError::Changed);
            }
            Ok(bootstrap_kubeconfig(server, &ca, token))
        };
        match attempt.await {
            Ok(kc) => return Ok(kc),
            Err(e) if e.transient() && tokio::time::Instant::now() + Duration::from_secs(2) < deadline => {
                tracing::warn!(error = %e, "cluster-info discovery: trying again in 2 s");
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Writes the kubeconfig (0600, replaced in one rename).
pub fn write(path: &Path, text: &str) -> Result<(), DiscoveryError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let io = |source| DiscoveryError::Io { path: path.display().to_string(), source };
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp).map_err(io)?;
    f.write_all(text.as_bytes()).map_err(io)?;
    f.sync_all().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_semantics::bootstrap::{ca_cert_hash, detached_signature};

    const TOKEN: &str = "abcdef.0123456789abcdef";

    fn ca() -> (String, Vec<u8>) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).unwrap();
        (cert.pem(), cert.der().to_vec())
    }

    fn cluster_info(ca_pem: &str, signer: Option<(&str, &str)>) -> ConfigMap {
        let content = format!(
            "apiVersion: v1\nclusters:\n- cluster:\n    certificate-authority-data: {}\n    server: https://10.0.0.1:6443\n  name: \"\"\nkind: Config\n",
            base64::engine::general_purpose::STANDARD.encode(ca_pem)
        );
        let mut data = std::collections::BTreeMap::from([(KUBECONFIG_KEY.to_string(), content.clone())]);
        if let Some((id, secret)) = signer {
            data.insert(format!("{JWS_KEY_PREFIX}{id}"), detached_signature(&content, id, secret));
        }
        ConfigMap { data: Some(data), ..Default::default() }
    }

    #[test]
    fn a_signed_and_pinned_cluster_info_gives_its_ca() {
        let (pem, der) = ca();
        let pin = ca_cert_hash(&der).unwrap();
        let cm = cluster_info(&pem, Some(("abcdef", "0123456789abcdef")));
        assert_eq!(verify(&cm, TOKEN, std::slice::from_ref(&pin)).unwrap(), pem.as_bytes());
        let kc = bootstrap_kubeconfig("https://10.0.0.1:6443", pem.as_bytes(), TOKEN);
        let parsed = kube::config::Kubeconfig::from_yaml(&kc).unwrap();
        assert_eq!(parsed.clusters[0].cluster.as_ref().unwrap().server.as_deref(), Some("https://10.0.0.1:6443"));
        assert!(kc.contains(&format!("token: {TOKEN}")));
    }

    #[test]
    fn what_a_server_without_the_token_or_with_another_ca_serves_is_refused() {
        let (pem, der) = ca();
        let pin = ca_cert_hash(&der).unwrap();
        // signed with another secret: a server that does not know the token
        let forged = cluster_info(&pem, Some(("abcdef", "ffffffffffffffff")));
        assert!(matches!(verify(&forged, TOKEN, std::slice::from_ref(&pin)), Err(DiscoveryError::BadSignature(id)) if id == "abcdef"));
        // not signed for this token (yet): transient
        let unsigned = cluster_info(&pem, Some(("zzzzzz", "0123456789abcdef")));
        let e = verify(&unsigned, TOKEN, std::slice::from_ref(&pin)).unwrap_err();
        assert!(matches!(e, DiscoveryError::NotSigned(_)) && e.transient());
        // signed, but a CA other than the pinned one (a man in the middle who knows the token)
        let (other_pem, _) = ca();
        let swapped = cluster_info(&other_pem, Some(("abcdef", "0123456789abcdef")));
        let e = verify(&swapped, TOKEN, std::slice::from_ref(&pin)).unwrap_err();
        assert!(matches!(e, DiscoveryError::Pin(PinError::Mismatch { .. })) && !e.transient(), "{e}");
        // bad input
        let good = cluster_info(&pem, Some(("abcdef", "0123456789abcdef")));
        assert!(matches!(verify(&good, "abcdef", std::slice::from_ref(&pin)), Err(DiscoveryError::Token)));
        assert!(matches!(verify(&good, TOKEN, &[]), Err(DiscoveryError::NoPin)));
        assert!(matches!(verify(&good, TOKEN, &["sha256:nothex".into()]), Err(DiscoveryError::Pin(PinError::Format(_)))));
        assert!(matches!(verify(&ConfigMap::default(), TOKEN, &[pin]), Err(DiscoveryError::NoContent)));
    }

    #[tokio::test]
    async fn bad_flags_are_refused_before_any_request() {
        let pin = format!("sha256:{}", "0".repeat(64));
        let d = Duration::from_secs(1);
        assert!(matches!(discover("https://127.0.0.1:1", "nope", std::slice::from_ref(&pin), d).await, Err(DiscoveryError::Token)));
        assert!(matches!(discover("https://127.0.0.1:1", TOKEN, &[], d).await, Err(DiscoveryError::NoPin)));
        assert!(matches!(discover("http://127.0.0.1:1", TOKEN, std::slice::from_ref(&pin), d).await, Err(DiscoveryError::Server(_))));
        assert!(matches!(discover("https://127.0.0.1:1", TOKEN, &["md5:00".into()], d).await, Err(DiscoveryError::Pin(_))));
    }
}
