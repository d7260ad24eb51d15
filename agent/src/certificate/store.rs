//! The node's client certificate on disk, kept as upstream's certificate store keeps it: each
//! issued pair (certificate then key, one PEM file, 0600) in `<cert-dir>/kubelet-client-<time>.pem`
//! and the symlink `<cert-dir>/kubelet-client-current.pem` pointing at the one in use, replaced in
//! one rename so a reader sees the old pair or the new one, never half of either. The node's
//! kubeconfig names the symlink, so a client built from it afterwards uses the new pair.

use std::path::{Path, PathBuf};

use super::plan::{self, Validity};

pub const CLIENT_PEM: &str = "kubelet-client-current.pem";

/// Writes `data` to `path` (0600) through a temporary file and a rename.
pub fn write_private(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let tmp = path.with_extension("writing");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(data)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// Keeps a newly issued pair: `<dir>/kubelet-client-<issued>.pem` holds the certificate and the
/// key, then `<dir>/kubelet-client-current.pem` points at it. Returns the current path.
pub fn install(
    dir: &Path,
    cert_pem: &[u8],
    key_pem: &[u8],
    issued: jiff::Timestamp,
) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let name = plan::pem_file_name(issued);
    let mut both = cert_pem.to_vec();
    if !both.ends_with(b"\n") {
        both.push(b'\n');
    }
    both.extend_from_slice(key_pem);
    write_private(&dir.join(&name), &both)?;
    // the link is relative: the directory may be moved or mounted elsewhere
    let current = dir.join(CLIENT_PEM);
    let tmp = dir.join(format!("{CLIENT_PEM}.updating"));
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    std::os::unix::fs::symlink(&name, &tmp)?;
    std::fs::rename(&tmp, &current)?;
    std::fs::File::open(dir)?.sync_all()?;
    Ok(current)
}

/// The client certificate a kubeconfig uses, as PEM: its embedded data or the file it names
/// (relative to the kubeconfig's directory). `None` when it has none or it cannot be read.
pub fn client_cert_pem(kubeconfig: &Path) -> Option<Vec<u8>> {
    use base64::Engine as _;
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).ok()?;
    let user = current_user(&kc)?;
    match (user.client_certificate_data, user.client_certificate) {
        (Some(d), _) => base64::engine::general_purpose::STANDARD
            .decode(d.trim())
            .ok(),
        (None, Some(file)) => {
            let p = Path::new(&file);
            let p = if p.is_relative() {
                kubeconfig.parent()?.join(p)
            } else {
                p.to_path_buf()
            };
            std::fs::read(p).ok()
        }
        _ => None,
    }
}

/// The user of a kubeconfig's current context.
fn current_user(kc: &kube::config::Kubeconfig) -> Option<kube::config::AuthInfo> {
    let ctx_name = kc.current_context.clone()?;
    let ctx = kc
        .contexts
        .iter()
        .find(|c| c.name == ctx_name)?
        .context
        .clone()?;
    kc.auth_infos
        .iter()
        .find(|a| a.name == ctx.user.clone().unwrap_or_default())?
        .auth_info
        .clone()
}

/// Whether the kubeconfig's user authenticates with a client certificate (what rotation
/// renews), as opposed to a token or an exec plugin.
pub fn uses_client_certificate(kc: &kube::config::Kubeconfig) -> bool {
    current_user(kc)
        .is_some_and(|u| u.client_certificate.is_some() || u.client_certificate_data.is_some())
}

/// Whether the kubeconfig's user takes its certificate and key from `pem` (the store's
/// current pair), so that a rotated pair is what a client built from it uses.
pub fn points_at(kc: &kube::config::Kubeconfig, pem: &Path) -> bool {
    let pem = pem.display().to_string();
    current_user(kc).is_some_and(|u| {
        u.client_certificate_data.is_none()
            && u.client_key_data.is_none()
            && u.client_certificate.as_deref() == Some(pem.as_str())
            && u.client_key.as_deref() == Some(pem.as_str())
    })
}

/// The first certificate of a PEM text: its validity and serial number.
pub fn parse(pem: &[u8]) -> Option<(Validity, Vec<u8>)> {
    use rustls::pki_types::pem::PemObject as _;
    let der = rustls::pki_types::CertificateDer::pem_slice_iter(pem)
        .next()?
        .ok()?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der).ok()?;
    let v = cert.validity();
    Some((
        Validity {
            not_before: v.not_before.timestamp(),
            not_after: v.not_after.timestamp(),
        },
        cert.raw_serial().to_vec(),
    ))
}

/// The validity of the client certificate a kubeconfig uses, when it has one that parses.
pub fn validity(kubeconfig: &Path) -> Option<Validity> {
    parse(&client_cert_pem(kubeconfig)?).map(|(v, _)| v)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn cert(not_after_year: i32) -> (String, String) {
        let kp = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.not_before = rcgen::date_time_ymd(2025, 1, 1);
        p.not_after = rcgen::date_time_ymd(not_after_year, 1, 1);
        (p.self_signed(&kp).unwrap().pem(), kp.serialize_pem())
    }

    #[test]
    fn installing_a_pair_repoints_the_current_link() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let (c1, k1) = cert(2030);
        let t1: jiff::Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let current = install(dir.path(), c1.as_bytes(), k1.as_bytes(), t1).unwrap();
        assert_eq!(current, dir.path().join(CLIENT_PEM));
        assert_eq!(
            std::fs::read_link(&current).unwrap(),
            Path::new("kubelet-client-2026-01-01-00-00-00.pem")
        );
        assert_eq!(
            std::fs::read_to_string(&current).unwrap(),
            format!("{c1}{k1}")
        );
        assert_eq!(
            std::fs::metadata(&current).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let (v1, s1) = parse(c1.as_bytes()).unwrap();
        assert_eq!(
            v1.not_after,
            rcgen::date_time_ymd(2030, 1, 1).unix_timestamp()
        );

        let (c2, k2) = cert(2031);
        let t2: jiff::Timestamp = "2026-06-01T00:00:00Z".parse().unwrap();
        install(dir.path(), c2.as_bytes(), k2.as_bytes(), t2).unwrap();
        assert_eq!(
            std::fs::read_link(&current).unwrap(),
            Path::new("kubelet-client-2026-06-01-00-00-00.pem")
        );
        let (v2, s2) = parse(&std::fs::read(&current).unwrap()).unwrap();
        assert!(v2.not_after > v1.not_after && s2 != s1);
        assert!(
            dir.path()
                .join("kubelet-client-2026-01-01-00-00-00.pem")
                .exists(),
            "the old pair is kept, as upstream"
        );
        let mut names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        assert_eq!(names.len(), 3, "no temporary file left: {names:?}");
    }

    #[test]
    fn a_regular_current_file_from_before_is_replaced_by_the_link() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(CLIENT_PEM), "old").unwrap();
        let (c, k) = cert(2030);
        install(
            dir.path(),
            c.as_bytes(),
            k.as_bytes(),
            jiff::Timestamp::UNIX_EPOCH,
        )
        .unwrap();
        assert!(std::fs::symlink_metadata(dir.path().join(CLIENT_PEM))
            .unwrap()
            .file_type()
            .is_symlink());
    }

    #[test]
    fn what_a_kubeconfig_authenticates_with() {
        let kc = |user: &str| -> kube::config::Kubeconfig {
            serde_yaml::from_str(&format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: 'https://10.0.0.1:6443'}}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\nusers:\n- name: u\n  user: {user}\n"
            ))
            .unwrap()
        };
        let pem = Path::new("/var/lib/ferro/agent/pki/kubelet-client-current.pem");
        let files = kc("{client-certificate: /var/lib/ferro/agent/pki/kubelet-client-current.pem, client-key: /var/lib/ferro/agent/pki/kubelet-client-current.pem}");
        assert!(uses_client_certificate(&files) && points_at(&files, pem));
        let elsewhere = kc("{client-certificate: /etc/node.crt, client-key: /etc/node.key}");
        assert!(uses_client_certificate(&elsewhere) && !points_at(&elsewhere, pem));
        let data = kc("{client-certificate-data: Q0E=, client-key-data: Q0E=}");
        assert!(uses_client_certificate(&data) && !points_at(&data, pem));
        let token = kc("{token: abc}");
        assert!(!uses_client_certificate(&token) && !points_at(&token, pem));
    }
}
