//! The server's TLS: its serving certificate (given files, or a self-signed one kept under the
//! cert dir) and client certificate verification against the client CA.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, KeyPair, SanType};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::ServerError;

/// The file names of the self-signed pair under the cert dir, and the SANs it was made for.
pub const CERT_FILE: &str = "agent.crt";
pub const KEY_FILE: &str = "agent.key";
const SANS_FILE: &str = "agent.sans";

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ServerError + '_ {
    move |source| ServerError::Io { path: path.to_path_buf(), source }
}

fn write_file(path: &Path, data: &[u8], private: bool) -> Result<(), ServerError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(if private { 0o600 } else { 0o644 })
        .open(&tmp)
        .map_err(io_err(&tmp))?;
    f.write_all(data).map_err(io_err(&tmp))?;
    f.sync_all().map_err(io_err(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io_err(path))
}

/// The SANs of the self-signed certificate: the node name, its IPs, localhost. Pure.
pub fn sans(node_name: &str, node_ips: &[IpAddr]) -> Vec<String> {
    let mut out = vec![node_name.to_string()];
    out.extend(node_ips.iter().map(IpAddr::to_string));
    for l in ["localhost", "127.0.0.1", "::1"] {
        if !out.iter().any(|s| s == l) {
            out.push(l.to_string());
        }
    }
    out
}

/// Loads `<dir>/agent.crt` and `.key`, (re)creating a self-signed pair when missing or made
/// for other SANs. Returns (cert PEM, key PEM).
pub fn self_signed_pair(dir: &Path, sans: &[String]) -> Result<(String, String), ServerError> {
    let crt = dir.join(CERT_FILE);
    let key = dir.join(KEY_FILE);
    let sans_file = dir.join(SANS_FILE);
    let wanted = sans.join(",");
    if let (Ok(c), Ok(k), Ok(s)) =
        (std::fs::read_to_string(&crt), std::fs::read_to_string(&key), std::fs::read_to_string(&sans_file))
    {
        if s == wanted {
            return Ok((c, k));
        }
    }
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(ServerError::Cert)?;
    for s in sans {
        let san = match s.parse::<IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(
                s.clone().try_into().map_err(|_| ServerError::Config(format!("invalid subject alternative name {s:?}")))?,
            ),
        };
        params.subject_alt_names.push(san);
    }
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, format!("{}@ferro-agent", sans.first().map(String::as_str).unwrap_or("node")));
    params.distinguished_name = dn;
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let kp = KeyPair::generate().map_err(ServerError::Cert)?;
    let cert = params.self_signed(&kp).map_err(ServerError::Cert)?;
    let (c, k) = (cert.pem(), kp.serialize_pem());
    write_file(&key, k.as_bytes(), true)?;
    write_file(&crt, c.as_bytes(), false)?;
    write_file(&sans_file, wanted.as_bytes(), false)?;
    Ok((c, k))
}

/// The rustls server config: serving pair, HTTP/1.1 only, client certificates verified
/// against `client_ca_pem` but optional (bearer tokens are checked later).
pub fn server_config(
    cert_pem: &str,
    key_pem: &str,
    client_ca_pem: Option<&[u8]>,
) -> Result<rustls::ServerConfig, ServerError> {
    let bad = |what: &str, e: &dyn std::fmt::Display| ServerError::Config(format!("{what}: {e}"));
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| bad("serving certificate", &e))?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| bad("serving key", &e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| bad("tls", &e))?;
    let builder = match client_ca_pem {
        Some(pem) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_slice_iter(pem) {
                roots.add(c.map_err(|e| bad("client CA", &e))?).map_err(|e| bad("client CA", &e))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .allow_unauthenticated()
                .build()
                .map_err(|e| bad("client CA", &e))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut cfg = builder.with_single_cert(certs, key).map_err(|e| bad("serving certificate", &e))?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

/// The serving pair: the given files, or the self-signed pair under `cert_dir`.
pub fn serving_pair(
    cert_file: Option<&PathBuf>,
    key_file: Option<&PathBuf>,
    cert_dir: &Path,
    sans: &[String],
) -> Result<(String, String), ServerError> {
    match (cert_file, key_file) {
        (Some(c), Some(k)) => Ok((
            std::fs::read_to_string(c).map_err(io_err(c))?,
            std::fs::read_to_string(k).map_err(io_err(k))?,
        )),
        (None, None) => self_signed_pair(cert_dir, sans),
        _ => Err(ServerError::Config("tlsCertFile and tlsPrivateKeyFile must be given together".into())),
    }
}

/// The user a verified client certificate names: its subject CN, and each O a group (upstream's
/// x509 authenticator).
pub fn cert_user(der: &CertificateDer<'_>) -> Option<super::authz::Subject> {
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref()).ok()?;
    let subject = cert.subject();
    let name = subject.iter_common_name().next()?.as_str().ok()?.to_string();
    let groups = subject.iter_organization().filter_map(|o| o.as_str().ok().map(str::to_string)).collect();
    Some(super::authz::Subject { name, groups })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn self_signed_pair_is_kept_until_the_sans_change() {
        let dir = tempfile::tempdir().unwrap();
        let s1 = sans("node-a", &["10.0.0.5".parse().unwrap()]);
        assert_eq!(s1, ["node-a", "10.0.0.5", "localhost", "127.0.0.1", "::1"]);
        let (c1, k1) = self_signed_pair(dir.path(), &s1).unwrap();
        assert_eq!(self_signed_pair(dir.path(), &s1).unwrap(), (c1.clone(), k1));
        let (c2, _) = self_signed_pair(dir.path(), &sans("node-a", &[])).unwrap();
        assert_ne!(c1, c2);
        server_config(&c2, &std::fs::read_to_string(dir.path().join(KEY_FILE)).unwrap(), None).unwrap();
        let der = CertificateDer::from_pem_slice(c2.as_bytes()).unwrap();
        assert_eq!(cert_user(&der).map(|s| s.name).as_deref(), Some("node-a@ferro-agent"));
    }
}
