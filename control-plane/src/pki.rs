//! The cluster CA, the serving certificate, client certificates and kubeconfig files.
//!
//! Files in the data dir: `ca.crt`/`ca.key` (the cluster CA), `apiserver.crt`/`apiserver.key`
//! (serving, SANs for every bind address plus localhost), `kubelet-client.crt`/`.key` (what the
//! server presents to agents when proxying logs/exec), `tokens.csv` (static bearer tokens in
//! upstream's token-file format) and `admin.kubeconfig`.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose,
    IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType,
};

#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid subject alternative name {0:?}")]
    BadSan(String),
}

/// Writes a private file (mode 0600) atomically.
pub fn write_secret(path: &Path, data: &[u8]) -> Result<(), PkiError> {
    write_file(path, data, true)
}

fn write_file(path: &Path, data: &[u8], private: bool) -> Result<(), PkiError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let io = |source| PkiError::Io { path: path.to_path_buf(), source };
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(if private { 0o600 } else { 0o644 })
        .open(&tmp)
        .map_err(io)?;
    f.write_all(data).map_err(io)?;
    f.sync_all().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

fn read(path: &Path) -> Result<String, PkiError> {
    std::fs::read_to_string(path).map_err(|source| PkiError::Io { path: path.to_path_buf(), source })
}

/// The cluster CA, able to sign certificates.
pub struct Ca {
    pub cert_pem: String,
    key: KeyPair,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").field("cert_pem", &self.cert_pem).finish_non_exhaustive()
    }
}

impl Ca {
    /// Loads a CA from its certificate and key files (upstream's
    /// --cluster-signing-cert-file/--cluster-signing-key-file).
    pub fn load(cert: &Path, key: &Path) -> Result<Ca, PkiError> {
        Ok(Ca { cert_pem: read(cert)?, key: KeyPair::from_pem(&read(key)?)? })
    }

    /// Loads `ca.crt`/`ca.key` from `dir`, creating them at first start.
    pub fn load_or_create(dir: &Path) -> Result<Ca, PkiError> {
        let crt = dir.join("ca.crt");
        let key = dir.join("ca.key");
        if crt.exists() && key.exists() {
            return Ok(Ca { cert_pem: read(&crt)?, key: KeyPair::from_pem(&read(&key)?)? });
        }
        let kp = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "ferro-ca");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        params.not_after = rcgen::date_time_ymd(2036, 1, 1);
        let cert = params.self_signed(&kp)?;
        write_file(&key, kp.serialize_pem().as_bytes(), true)?;
        write_file(&crt, cert.pem().as_bytes(), false)?;
        Ok(Ca { cert_pem: cert.pem(), key: kp })
    }

    fn sign(&self, params: CertificateParams) -> Result<(String, String), PkiError> {
        let issuer = Issuer::from_ca_cert_pem(&self.cert_pem, &self.key)?;
        let kp = KeyPair::generate()?;
        let cert = params.signed_by(&kp, &issuer)?;
        Ok((cert.pem(), kp.serialize_pem()))
    }

    /// A serving certificate for the given names and addresses.
    pub fn serving(&self, sans: &[String]) -> Result<(String, String), PkiError> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        for s in sans {
            let san = match s.parse::<IpAddr>() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName(s.clone().try_into().map_err(|_| PkiError::BadSan(s.clone()))?),
            };
            params.subject_alt_names.push(san);
        }
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "ferro-apiserver");
        params.distinguished_name = dn;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        self.sign(params)
    }

    /// A client certificate: CN is the user, each O a group (upstream's x509 authenticator).
    pub fn client(&self, user: &str, groups: &[String]) -> Result<(String, String), PkiError> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, user);
        for g in groups {
            dn.push(DnType::OrganizationName, g.as_str());
        }
        params.distinguished_name = dn;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        self.sign(params)
    }
}

/// A certificate a signer issues for an approved CertificateSigningRequest.
pub struct Issue<'a> {
    pub request: &'a crate::certificates::request::Request,
    pub usages: &'a [String],
    /// Seconds since the epoch.
    pub not_before: i64,
    pub not_after: i64,
    /// Subject alternative names are copied (serving certificates).
    pub with_sans: bool,
}

impl Ca {
    /// Signs a certificate for the request's public key and subject (CN, O), with the key
    /// usages of `usages` (upstream's signer: the CSR's own extensions are not copied), a
    /// random serial and the validity given. PEM.
    pub fn issue(&self, what: &Issue<'_>) -> Result<String, PkiError> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        let mut dn = DistinguishedName::new();
        if !what.request.common_name.is_empty() {
            dn.push(DnType::CommonName, what.request.common_name.as_str());
        }
        for o in &what.request.organizations {
            dn.push(DnType::OrganizationName, o.as_str());
        }
        params.distinguished_name = dn;
        if what.with_sans {
            for d in &what.request.dns_names {
                params.subject_alt_names.push(SanType::DnsName(d.clone().try_into().map_err(|_| PkiError::BadSan(d.clone()))?));
            }
            for ip in &what.request.ip_addresses {
                params.subject_alt_names.push(SanType::IpAddress(*ip));
            }
        }
        for u in what.usages {
            match u.as_str() {
                "digital signature" => params.key_usages.push(KeyUsagePurpose::DigitalSignature),
                "key encipherment" => params.key_usages.push(KeyUsagePurpose::KeyEncipherment),
                "client auth" => params.extended_key_usages.push(ExtendedKeyUsagePurpose::ClientAuth),
                "server auth" => params.extended_key_usages.push(ExtendedKeyUsagePurpose::ServerAuth),
                _ => {}
            }
        }
        let ts = |t: i64| time::OffsetDateTime::from_unix_timestamp(t).map_err(|_| PkiError::Generate(rcgen::Error::Time));
        params.not_before = ts(what.not_before)?;
        params.not_after = ts(what.not_after)?;
        use rand::Rng as _;
        let mut serial: [u8; 16] = rand::rng().random();
        serial[0] &= 0x7f;
        params.serial_number = Some(rcgen::SerialNumber::from_slice(&serial));
        params.use_authority_key_identifier_extension = true;
        let key = rcgen::SubjectPublicKeyInfo::from_der(&what.request.public_key_der)?;
        let issuer = Issuer::from_ca_cert_pem(&self.cert_pem, &self.key)?;
        Ok(params.signed_by(&key, &issuer)?.pem())
    }

    /// The CA certificate's notAfter, seconds since the epoch (an issued certificate never
    /// outlives its CA).
    pub fn not_after(&self) -> Option<i64> {
        use rustls::pki_types::pem::PemObject as _;
        let der = rustls::pki_types::CertificateDer::from_pem_slice(self.cert_pem.as_bytes()).ok()?;
        let (_, cert) = x509_parser::parse_x509_certificate(&der).ok()?;
        Some(cert.validity().not_after.timestamp())
    }
}

/// Loads the serving pair, re-issuing it when the wanted SANs changed.
pub fn serving_pair(dir: &Path, ca: &Ca, sans: &[String]) -> Result<(String, String), PkiError> {
    let crt = dir.join("apiserver.crt");
    let key = dir.join("apiserver.key");
    let sans_file = dir.join("apiserver.sans");
    let wanted = sans.join(",");
    if crt.exists() && key.exists() && read(&sans_file).map(|s| s == wanted).unwrap_or(false) {
        return Ok((read(&crt)?, read(&key)?));
    }
    let (c, k) = ca.serving(sans)?;
    write_file(&key, k.as_bytes(), true)?;
    write_file(&crt, c.as_bytes(), false)?;
    write_file(&sans_file, wanted.as_bytes(), false)?;
    Ok((c, k))
}

/// Loads or creates a client pair stored as `<name>.crt`/`<name>.key`.
pub fn client_pair(dir: &Path, ca: &Ca, name: &str, user: &str, groups: &[String]) -> Result<(String, String), PkiError> {
    let crt = dir.join(format!("{name}.crt"));
    let key = dir.join(format!("{name}.key"));
    if crt.exists() && key.exists() {
        return Ok((read(&crt)?, read(&key)?));
    }
    let (c, k) = ca.client(user, groups)?;
    write_file(&key, k.as_bytes(), true)?;
    write_file(&crt, c.as_bytes(), false)?;
    Ok((c, k))
}

/// The admin's token from `tokens.csv`, generating the file at first start.
pub fn admin_token(dir: &Path) -> Result<String, PkiError> {
    let path = dir.join("tokens.csv");
    if let Ok(existing) = read(&path) {
        for line in existing.lines() {
            let cols: Vec<&str> = line.split(',').collect();
            if cols.len() >= 2 && cols[1] == "admin" {
                return Ok(cols[0].to_string());
            }
        }
    }
    use rand::Rng;
    let bytes: [u8; 32] = rand::rng().random();
    let token = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    let mut content = read(&path).unwrap_or_default();
    if !content.is_empty() && !content.ends_with('\n') {
        content.push('\n');
    }
    content.push_str(&format!("{token},admin,admin,\"system:masters\"\n"));
    write_file(&path, content.as_bytes(), true)?;
    Ok(token)
}

/// Credentials a kubeconfig carries.
pub enum Credentials<'a> {
    Token(&'a str),
    Cert { cert_pem: &'a str, key_pem: &'a str },
}

/// A kubeconfig for `server` with the CA embedded.
pub fn kubeconfig(server: &str, ca_pem: &str, user: &str, creds: Credentials<'_>) -> String {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let user_block = match creds {
        Credentials::Token(t) => format!("    token: {t}\n"),
        Credentials::Cert { cert_pem, key_pem } => format!(
            "    client-certificate-data: {}\n    client-key-data: {}\n",
            b64(cert_pem),
            b64(key_pem)
        ),
    };
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: ferro\n  cluster:\n    server: {server}\n    certificate-authority-data: {}\ncontexts:\n- name: {user}@ferro\n  context:\n    cluster: ferro\n    user: {user}\ncurrent-context: {user}@ferro\nusers:\n- name: {user}\n  user:\n{user_block}",
        b64(ca_pem)
    )
}

pub fn write_kubeconfig(path: &Path, content: &str) -> Result<(), PkiError> {
    write_file(path, content.as_bytes(), true)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn ca_persists_and_signs_client_certs_with_groups() {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::load_or_create(dir.path()).unwrap();
        let again = Ca::load_or_create(dir.path()).unwrap();
        assert_eq!(ca.cert_pem, again.cert_pem);
        let (cert, _key) = ca.client("system:node:n1", &["system:nodes".into()]).unwrap();
        use rustls::pki_types::pem::PemObject as _;
        let der = rustls::pki_types::CertificateDer::from_pem_slice(cert.as_bytes()).unwrap();
        let id = crate::auth::identity_from_cert(&der).unwrap();
        assert_eq!(id.name, "system:node:n1");
        assert_eq!(id.groups, vec!["system:nodes".to_string(), "system:authenticated".to_string()]);
    }

    #[test]
    fn admin_token_is_stable() {
        let dir = tempfile::tempdir().unwrap();
        let a = admin_token(dir.path()).unwrap();
        assert_eq!(a, admin_token(dir.path()).unwrap());
        assert!(a.len() > 30);
    }
}
