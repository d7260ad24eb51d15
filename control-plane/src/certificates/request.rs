//! A PKCS#10 certificate request (`spec.request` of a CertificateSigningRequest): parsed, its
//! signature checked, and what each of upstream's signers accepts.

use std::net::IpAddr;

use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::prelude::FromDer as _;

/// Client certificates of kubelets (`system:node:<name>` in `system:nodes`).
pub const KUBELET_CLIENT: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// Any client certificate the API server trusts (never auto-approved).
pub const APISERVER_CLIENT: &str = "kubernetes.io/kube-apiserver-client";
/// Serving certificates of kubelets.
pub const KUBELET_SERVING: &str = "kubernetes.io/kubelet-serving";
/// Upstream's legacy signer: kube-controller-manager never signs for it.
pub const LEGACY_UNKNOWN: &str = "kubernetes.io/legacy-unknown";

/// The key usages a request may name (upstream's KeyUsage values).
pub const USAGES: &[&str] = &[
    "signing",
    "digital signature",
    "content commitment",
    "key encipherment",
    "key agreement",
    "data encipherment",
    "cert sign",
    "crl sign",
    "encipher only",
    "decipher only",
    "any",
    "server auth",
    "client auth",
    "code signing",
    "email protection",
    "s/mime",
    "ipsec end system",
    "ipsec tunnel",
    "ipsec user",
    "timestamping",
    "ocsp signing",
    "microsoft sgc",
    "netscape sgc",
];

/// What a certificate request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub common_name: String,
    pub organizations: Vec<String>,
    pub dns_names: Vec<String>,
    pub ip_addresses: Vec<IpAddr>,
    pub emails: Vec<String>,
    pub uris: Vec<String>,
    /// The requester's public key (SubjectPublicKeyInfo, DER).
    pub public_key_der: Vec<u8>,
    /// RSA key (key encipherment is allowed for RSA keys only).
    pub rsa: bool,
}

/// Parses the PEM `CERTIFICATE REQUEST` block and checks its signature (upstream's ParseCSR).
pub fn parse(pem_bytes: &[u8]) -> Result<Request, String> {
    use rustls::pki_types::pem::PemObject as _;
    let der = rustls::pki_types::CertificateSigningRequestDer::from_pem_slice(pem_bytes)
        .map_err(|_| "PEM block type must be CERTIFICATE REQUEST".to_string())?;
    let (_, csr) = X509CertificationRequest::from_der(der.as_ref()).map_err(|e| format!("x509: malformed certificate request: {e}"))?;
    csr.verify_signature().map_err(|_| "x509: ECDSA verification failure or invalid signature on the certificate request".to_string())?;
    let info = &csr.certification_request_info;
    let text_of = |a: &x509_parser::x509::AttributeTypeAndValue<'_>| a.as_str().map(str::to_string).ok();
    let common_name = info.subject.iter_common_name().next().and_then(text_of).unwrap_or_default();
    let organizations = info.subject.iter_organization().filter_map(text_of).collect();
    let mut req = Request {
        common_name,
        organizations,
        dns_names: Vec::new(),
        ip_addresses: Vec::new(),
        emails: Vec::new(),
        uris: Vec::new(),
        public_key_der: info.subject_pki.raw.to_vec(),
        rsa: info.subject_pki.algorithm.algorithm == x509_parser::oid_registry::OID_PKCS1_RSAENCRYPTION,
    };
    for ext in csr.requested_extensions().into_iter().flatten() {
        if let ParsedExtension::SubjectAlternativeName(san) = ext {
            for name in &san.general_names {
                match name {
                    GeneralName::DNSName(d) => req.dns_names.push(d.to_string()),
                    GeneralName::RFC822Name(e) => req.emails.push(e.to_string()),
                    GeneralName::URI(u) => req.uris.push(u.to_string()),
                    GeneralName::IPAddress(b) => match b.len() {
                        4 => req.ip_addresses.push(IpAddr::from(<[u8; 4]>::try_from(*b).unwrap_or_default())),
                        16 => req.ip_addresses.push(IpAddr::from(<[u8; 16]>::try_from(*b).unwrap_or_default())),
                        _ => return Err("x509: invalid IP address length in subjectAltName".into()),
                    },
                    _ => {}
                }
            }
        }
    }
    Ok(req)
}

fn usages_within(usages: &[String], required: &str, allowed: &[&str]) -> Result<(), String> {
    if !usages.iter().any(|u| u == required) {
        return Err(format!("usages did not include {required:?}"));
    }
    if let Some(u) = usages.iter().find(|u| !allowed.contains(&u.as_str())) {
        return Err(format!("usage {u:?} is not allowed (allowed: {})", allowed.iter().map(|a| format!("{a:?}")).collect::<Vec<_>>().join(", ")));
    }
    Ok(())
}

fn node_subject(req: &Request) -> Result<(), String> {
    if req.organizations != ["system:nodes"] {
        return Err("subject organization is not system:nodes".into());
    }
    if !req.common_name.starts_with("system:node:") || req.common_name.len() == "system:node:".len() {
        return Err("subject common name does not begin with system:node:".into());
    }
    Ok(())
}

/// Upstream's ValidateKubeletClientCSR: a node's client certificate and nothing else.
pub fn kubelet_client(req: &Request, usages: &[String]) -> Result<(), String> {
    node_subject(req)?;
    if !req.dns_names.is_empty() {
        return Err("DNS subjectAltNames are not allowed".into());
    }
    if !req.emails.is_empty() {
        return Err("Email subjectAltNames are not allowed".into());
    }
    if !req.ip_addresses.is_empty() {
        return Err("IP subjectAltNames are not allowed".into());
    }
    if !req.uris.is_empty() {
        return Err("URI subjectAltNames are not allowed".into());
    }
    let allowed: &[&str] = if req.rsa { &["digital signature", "key encipherment", "client auth"] } else { &["digital signature", "client auth"] };
    usages_within(usages, "client auth", allowed)
}

/// Whether the signer `signer` may sign this request: Ok, or why not (the Failed condition's
/// message). None for signers ferro does not sign for (left to another signer).
pub fn signer_accepts(signer: &str, req: &Request, usages: &[String]) -> Option<Result<(), String>> {
    Some(match signer {
        KUBELET_CLIENT => kubelet_client(req, usages),
        APISERVER_CLIENT => usages_within(usages, "client auth", &["digital signature", "key encipherment", "client auth"]),
        KUBELET_SERVING => node_subject(req).and_then(|()| {
            if !req.emails.is_empty() || !req.uris.is_empty() {
                return Err("only DNS and IP subjectAltNames are allowed".into());
            }
            if req.dns_names.is_empty() && req.ip_addresses.is_empty() {
                return Err("at least one DNS or IP subjectAltName is required".into());
            }
            usages_within(usages, "server auth", &["digital signature", "key encipherment", "server auth"])
        }),
        _ => return None,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod tests {
    use super::*;
    use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair, SanType};

    /// A request PEM as a client makes it (rcgen), for tests.
    pub fn make_request(cn: &str, orgs: &[&str], sans: &[SanType]) -> String {
        let kp = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, cn);
        for o in orgs {
            dn.push(DnType::OrganizationName, *o);
        }
        params.distinguished_name = dn;
        params.subject_alt_names = sans.to_vec();
        params.serialize_request(&kp).unwrap().pem().unwrap()
    }

    fn usages(u: &[&str]) -> Vec<String> {
        u.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_request_is_parsed_and_its_signature_checked() {
        let pem = make_request("system:node:n1", &["system:nodes"], &[SanType::IpAddress("10.0.0.1".parse().unwrap())]);
        let r = parse(pem.as_bytes()).unwrap();
        assert_eq!(r.common_name, "system:node:n1");
        assert_eq!(r.organizations, ["system:nodes"]);
        assert_eq!(r.ip_addresses, ["10.0.0.1".parse::<IpAddr>().unwrap()]);
        assert!(!r.rsa);
        assert_eq!(parse(b"not pem").unwrap_err(), "PEM block type must be CERTIFICATE REQUEST");
        let cert = pem.replace("CERTIFICATE REQUEST", "CERTIFICATE");
        assert_eq!(parse(cert.as_bytes()).unwrap_err(), "PEM block type must be CERTIFICATE REQUEST");
        // one byte of the signed part changed: the signature no longer holds
        use base64::Engine as _;
        use rustls::pki_types::pem::PemObject as _;
        let der = rustls::pki_types::CertificateSigningRequestDer::from_pem_slice(pem.as_bytes()).unwrap();
        let mut der = der.as_ref().to_vec();
        let i = der.windows(2).position(|w| w == b"n1").unwrap();
        der[i + 1] = b'2';
        let b64 = base64::engine::general_purpose::STANDARD.encode(&der);
        let tampered = format!("-----BEGIN CERTIFICATE REQUEST-----\n{b64}\n-----END CERTIFICATE REQUEST-----\n");
        assert!(parse(tampered.as_bytes()).unwrap_err().contains("signature"));
    }

    #[test]
    fn kubelet_client_requests_are_recognised_as_upstream_does() {
        let ok = parse(make_request("system:node:n1", &["system:nodes"], &[]).as_bytes()).unwrap();
        assert_eq!(kubelet_client(&ok, &usages(&["digital signature", "client auth"])), Ok(()));
        assert_eq!(kubelet_client(&ok, &usages(&["digital signature"])).unwrap_err(), "usages did not include \"client auth\"");
        assert!(kubelet_client(&ok, &usages(&["client auth", "key encipherment"])).unwrap_err().contains("not allowed"), "ECDSA keys: no key encipherment");
        assert!(kubelet_client(&ok, &usages(&["client auth", "server auth"])).is_err());
        let admin = parse(make_request("system:node:n1", &["system:masters"], &[]).as_bytes()).unwrap();
        assert_eq!(kubelet_client(&admin, &usages(&["client auth"])).unwrap_err(), "subject organization is not system:nodes");
        let two = parse(make_request("system:node:n1", &["system:nodes", "system:masters"], &[]).as_bytes()).unwrap();
        assert!(kubelet_client(&two, &usages(&["client auth"])).is_err());
        let bob = parse(make_request("bob", &["system:nodes"], &[]).as_bytes()).unwrap();
        assert_eq!(kubelet_client(&bob, &usages(&["client auth"])).unwrap_err(), "subject common name does not begin with system:node:");
        let san = parse(make_request("system:node:n1", &["system:nodes"], &[SanType::DnsName("n1".try_into().unwrap())]).as_bytes()).unwrap();
        assert_eq!(kubelet_client(&san, &usages(&["client auth"])).unwrap_err(), "DNS subjectAltNames are not allowed");
    }

    #[test]
    fn each_signer_has_its_rules() {
        let node = parse(make_request("system:node:n1", &["system:nodes"], &[]).as_bytes()).unwrap();
        let serving = parse(make_request("system:node:n1", &["system:nodes"], &[SanType::IpAddress("10.0.0.1".parse().unwrap())]).as_bytes()).unwrap();
        let bob = parse(make_request("bob", &["team"], &[]).as_bytes()).unwrap();
        assert_eq!(signer_accepts(KUBELET_CLIENT, &node, &usages(&["client auth"])), Some(Ok(())));
        assert_eq!(signer_accepts(APISERVER_CLIENT, &bob, &usages(&["client auth", "digital signature"])), Some(Ok(())));
        assert!(signer_accepts(APISERVER_CLIENT, &bob, &usages(&["server auth"])).unwrap().is_err());
        assert_eq!(signer_accepts(KUBELET_SERVING, &serving, &usages(&["server auth", "digital signature"])), Some(Ok(())));
        assert!(signer_accepts(KUBELET_SERVING, &node, &usages(&["server auth"])).unwrap().is_err(), "a serving certificate names its addresses");
        assert_eq!(signer_accepts(LEGACY_UNKNOWN, &node, &usages(&["client auth"])), None);
        assert_eq!(signer_accepts("example.com/mine", &node, &usages(&["client auth"])), None);
    }
}
