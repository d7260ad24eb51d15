//! Node join discovery as kubeadm does it (the `cluster-info` ConfigMap in `kube-public`):
//! - the control plane signs the ConfigMap's `kubeconfig` with every bootstrap token allowed to
//!   sign (`usage-bootstrap-signing: "true"`): a detached JWS (RFC 7515 appendix F: the
//!   compact serialization with the payload left out, `<header>..<signature>`), HS256 keyed
//!   with the token's secret, the token id as `kid`, stored under `jws-kubeconfig-<id>`;
//! - a joining node that knows the token fetches the ConfigMap without trusting the server
//!   yet, checks the signature (proof that the server knows the token) and pins the CA it
//!   carries with `--discovery-token-ca-cert-hash sha256:<hex of the SHA-256 of the CA's
//!   SubjectPublicKeyInfo>`.

use base64::Engine as _;

/// The ConfigMap and its namespace.
pub const CLUSTER_INFO: &str = "cluster-info";
pub const CLUSTER_INFO_NAMESPACE: &str = "kube-public";
/// The key of the signed content and the prefix of the signatures' keys.
pub const KUBECONFIG_KEY: &str = "kubeconfig";
pub const JWS_KEY_PREFIX: &str = "jws-kubeconfig-";

/// Splits a bootstrap token `<id>.<secret>` (6 and 16 characters of [a-z0-9]).
pub fn split_token(token: &str) -> Option<(&str, &str)> {
    let (id, secret) = token.split_once('.')?;
    let ok = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    (ok(id, 6) && ok(secret, 16)).then_some((id, secret))
}

fn b64url(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// The detached JWS of `content` for the token `<id>.<secret>`: `<header>..<signature>`, the
/// header `{"alg":"HS256","kid":"<id>"}` (keys in the order go-jose writes them).
pub fn detached_signature(content: &str, id: &str, secret: &str) -> String {
    let header = jws_header(id);
    let tag = ring::hmac::sign(&hmac_key(secret), signing_input(&header, content).as_bytes());
    format!("{header}..{}", b64url(tag.as_ref()))
}

fn jws_header(id: &str) -> String {
    b64url(format!(r#"{{"alg":"HS256","kid":"{id}"}}"#).as_bytes())
}

fn signing_input(header: &str, content: &str) -> String {
    format!("{header}.{}", b64url(content.as_bytes()))
}

fn hmac_key(secret: &str) -> ring::hmac::Key {
    ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes())
}

/// Whether `detached` is the signature of `content` by the token `<id>.<secret>` (the MAC
/// compared in constant time).
pub fn signature_valid(detached: &str, content: &str, id: &str, secret: &str) -> bool {
    let Some((header, sig)) = detached.split_once("..") else { return false };
    let Ok(tag) = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(sig) else { return false };
    header == jws_header(id) && ring::hmac::verify(&hmac_key(secret), signing_input(header, content).as_bytes(), &tag).is_ok()
}

/// Why a CA pin does not hold.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PinError {
    #[error("{0:?} is not a CA certificate hash: expected sha256:<64 hex digits>")]
    Format(String),
    #[error("the CA certificate does not parse: {0}")]
    Certificate(String),
    #[error("the cluster CA's public key hash {actual} is none of the pinned ones ({pinned})")]
    Mismatch { actual: String, pinned: String },
}

/// Normalises a pin (`sha256:<hex>`, kubeadm's `--discovery-token-ca-cert-hash`; upper-case hex
/// accepted) to lower case.
pub fn parse_pin(pin: &str) -> Result<String, PinError> {
    let hex = pin.strip_prefix("sha256:").ok_or_else(|| PinError::Format(pin.to_string()))?;
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(PinError::Format(pin.to_string()));
    }
    Ok(format!("sha256:{}", hex.to_ascii_lowercase()))
}

/// `sha256:<hex>` of a certificate's SubjectPublicKeyInfo (DER), as kubeadm prints and pins it.
pub fn ca_cert_hash(cert_der: &[u8]) -> Result<String, PinError> {
    let (_, cert) = x509_parser::parse_x509_certificate(cert_der).map_err(|e| PinError::Certificate(e.to_string()))?;
    let digest = ring::digest::digest(&ring::digest::SHA256, cert.public_key().raw);
    Ok(format!("sha256:{}", digest.as_ref().iter().map(|b| format!("{b:02x}")).collect::<String>()))
}

/// Checks a CA certificate (DER) against the pins; every pin must be well-formed.
pub fn check_pins(cert_der: &[u8], pins: &[String]) -> Result<(), PinError> {
    let pinned: Vec<String> = pins.iter().map(|p| parse_pin(p)).collect::<Result<_, _>>()?;
    let actual = ca_cert_hash(cert_der)?;
    if pinned.contains(&actual) {
        Ok(())
    } else {
        Err(PinError::Mismatch { actual, pinned: pinned.join(", ") })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_detached_signature_is_the_compact_jws_without_its_payload() {
        let content = "apiVersion: v1\nkind: Config\n";
        let sig = detached_signature(content, "abcdef", "0123456789abcdef");
        let (header, rest) = sig.split_once("..").unwrap();
        let header = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(header).unwrap();
        assert_eq!(std::str::from_utf8(&header).unwrap(), r#"{"alg":"HS256","kid":"abcdef"}"#);
        // HMAC-SHA256 over "<header>.<payload>", recomputed independently of the function
        let input = format!("{}.{}", sig.split("..").next().unwrap(), b64url(content.as_bytes()));
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, b"0123456789abcdef");
        assert!(ring::hmac::verify(&key, input.as_bytes(), &base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(rest).unwrap()).is_ok());
        assert!(signature_valid(&sig, content, "abcdef", "0123456789abcdef"));
        assert!(!signature_valid(&sig, "apiVersion: v1\nkind: Config\n# changed\n", "abcdef", "0123456789abcdef"), "other content");
        assert!(!signature_valid(&sig, content, "abcdef", "0123456789abcdeg"), "another secret");
        assert!(!signature_valid(&sig, content, "abcdeg", "0123456789abcdef"), "another id (kid)");
        assert!(!signature_valid("", content, "abcdef", "0123456789abcdef"));
    }

    #[test]
    fn tokens_have_the_bootstrap_shape() {
        assert_eq!(split_token("abcdef.0123456789abcdef"), Some(("abcdef", "0123456789abcdef")));
        for bad in ["", "abcdef", "abcdef.", "ABCDEF.0123456789abcdef", "abcde.0123456789abcdef", "abcdef.0123456789abcde", "abcdef.0123456789abcdef0", "abc-ef.0123456789abcdef"] {
            assert_eq!(split_token(bad), None, "{bad}");
        }
    }

    #[test]
    fn pins_are_checked_against_the_public_key_hash() {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap().self_signed(&key).unwrap();
        let der = cert.der().to_vec();
        let hash = ca_cert_hash(&der).unwrap();
        // the SHA-256 of the SubjectPublicKeyInfo DER, as `openssl x509 -pubkey | openssl pkey
        // -pubin -outform der | sha256sum` prints it
        use rcgen::PublicKeyData as _;
        let spki = key.subject_public_key_info();
        let want: String = ring::digest::digest(&ring::digest::SHA256, &spki).as_ref().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hash, format!("sha256:{want}"));
        assert_eq!(check_pins(&der, std::slice::from_ref(&hash)), Ok(()));
        assert_eq!(check_pins(&der, &[hash.to_uppercase().replace("SHA256:", "sha256:")]), Ok(()), "upper-case hex");
        let other = format!("sha256:{}", "0".repeat(64));
        assert!(matches!(check_pins(&der, std::slice::from_ref(&other)), Err(PinError::Mismatch { .. })));
        assert_eq!(check_pins(&der, &[other.clone(), hash.clone()]), Ok(()), "any pin may match");
        for bad in ["", "sha256:", "sha256:xyz", "md5:0123", &hash[7..]] {
            assert!(matches!(parse_pin(bad), Err(PinError::Format(_))), "{bad}");
        }
        assert!(matches!(check_pins(b"not a certificate", &[hash]), Err(PinError::Certificate(_))));
    }
}
