//! The TLS-bootstrap join end to end, with kubectl and a kube client: a bootstrap token made by
//! `ferro-control-plane token create` authenticates as system:bootstrap:<id>, may ask for a node
//! client certificate and nothing else; the request is auto-approved and signed by the cluster
//! CA, and the certificate then works as the node's identity. Wrong, expired and deleted tokens
//! get 401; a node asking for another node's certificate is not approved; other signers'
//! requests wait for `kubectl certificate approve|deny` by someone allowed to approve for that
//! signer; system:masters certificates cannot be had; bad requests get 422 with the field.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine as _;
use common::fake::eventually;
use common::Server;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::Api;
use serde_json::{json, Value};

fn token_create(s: &Server, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_ferro-control-plane"))
        .args(["token", "create", "--data-dir", s.dir.path().to_str().unwrap()])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "token create: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

fn token_kubeconfig(s: &Server, token: &str) -> PathBuf {
    let kc = format!(
        "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: \"https://127.0.0.1:{}\", certificate-authority: {}}}}}]\nusers: [{{name: u, user: {{token: \"{token}\"}}}}]\ncontexts: [{{name: x, context: {{cluster: c, user: u}}}}]\ncurrent-context: x\n",
        s.port,
        s.data_dir().join("ca.crt").display()
    );
    let path = s.data_dir().join(format!("bootstrap-{}.kubeconfig", &token[..6]));
    std::fs::write(&path, kc).unwrap();
    path
}

/// A kubeconfig with a client certificate and key (PEM) given.
fn cert_kubeconfig(s: &Server, name: &str, cert_pem: &[u8], key_pem: &str) -> PathBuf {
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let kc = format!(
        "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: \"https://127.0.0.1:{}\", certificate-authority: {}}}}}]\nusers: [{{name: u, user: {{client-certificate-data: {}, client-key-data: {}}}}}]\ncontexts: [{{name: x, context: {{cluster: c, user: u}}}}]\ncurrent-context: x\n",
        s.port,
        s.data_dir().join("ca.crt").display(),
        b64(cert_pem),
        b64(key_pem.as_bytes())
    );
    let path = s.data_dir().join(format!("{name}.kubeconfig"));
    std::fs::write(&path, kc).unwrap();
    path
}

fn kubectl(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
    use std::io::Write as _;
    let mut child = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).unwrap();
    }
    drop(input);
    let out = child.wait_with_output().unwrap();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// A key and a PKCS#10 request for `cn` in `orgs` (what a kubelet makes).
fn request(cn: &str, orgs: &[&str]) -> (rcgen::KeyPair, String) {
    let kp = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    let mut dn = rcgen::DistinguishedName::new();
    dn.push(rcgen::DnType::CommonName, cn);
    for o in orgs {
        dn.push(rcgen::DnType::OrganizationName, *o);
    }
    params.distinguished_name = dn;
    let pem = params.serialize_request(&kp).unwrap().pem().unwrap();
    (kp, pem)
}

fn csr_yaml(name: &str, pem: &str, signer: &str, usages: &[&str]) -> String {
    let obj = json!({
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"name": name},
        "spec": {
            "request": base64::engine::general_purpose::STANDARD.encode(pem),
            "signerName": signer,
            "usages": usages,
        }
    });
    serde_json::to_string(&obj).unwrap()
}

fn get_csr(s: &Server, name: &str) -> Value {
    serde_json::from_str(&s.ok(&["get", "csr", name, "-o", "json"])).unwrap()
}

/// Waits for the request to carry its certificate; returns it (PEM).
async fn issued(s: &Server, name: &str) -> Vec<u8> {
    eventually(&format!("certificate of {name}"), || async {
        let v = get_csr(s, name);
        let c = v.pointer("/status/certificate")?.as_str()?;
        Some(base64::engine::general_purpose::STANDARD.decode(c).unwrap())
    })
    .await
}

fn conditions(v: &Value) -> Vec<(String, String)> {
    v.pointer("/status/conditions")
        .and_then(Value::as_array)
        .map(|a| a.iter().map(|c| (c["type"].as_str().unwrap_or("").to_string(), c["reason"].as_str().unwrap_or("").to_string())).collect())
        .unwrap_or_default()
}

fn subject(cert_pem: &[u8]) -> (String, Vec<String>, i64) {
    use rustls::pki_types::pem::PemObject as _;
    let der = rustls::pki_types::CertificateDer::from_pem_slice(cert_pem).unwrap();
    let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    let cn = cert.subject().iter_common_name().next().unwrap().as_str().unwrap().to_string();
    let orgs = cert.subject().iter_organization().map(|o| o.as_str().unwrap().to_string()).collect();
    let life = cert.validity().not_after.timestamp() - cert.validity().not_before.timestamp();
    (cn, orgs, life)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bootstrap_token_joins_a_node_and_does_nothing_else() {
    let s = Server::start();
    let token = token_create(&s, &["--ttl", "1h"]);
    let id = &token[..6];
    // the token's Secret, as kubeadm writes it
    let secret: Value = serde_json::from_str(&s.ok(&["get", "secret", "-n", "kube-system", &format!("bootstrap-token-{id}"), "-o", "json"])).unwrap();
    assert_eq!(secret["type"], "bootstrap.kubernetes.io/token");
    let boot = token_kubeconfig(&s, &token);
    let who: Value = serde_json::from_str(&kubectl(&boot, &["auth", "whoami", "-o", "json"], None).unwrap()).unwrap();
    assert_eq!(who["status"]["userInfo"]["username"], format!("system:bootstrap:{id}"));
    assert_eq!(
        who["status"]["userInfo"]["groups"],
        json!(["system:bootstrappers", "system:bootstrappers:ferro:default-node-token", "system:authenticated"])
    );
    // a TokenReview (what a webhook authenticator or a kubelet's delegated authentication
    // asks) knows the token too, and refuses a wrong one
    let answer: Value = serde_json::from_slice(
        &s.kubectl_stdin(&["create", "--raw", "/apis/authentication.k8s.io/v1/tokenreviews", "-f", "-"], Some(&json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}).to_string())).stdout,
    )
    .unwrap();
    assert_eq!(answer["status"]["authenticated"], true, "{answer}");
    assert_eq!(answer["status"]["user"]["username"], format!("system:bootstrap:{id}"));
    let wrong: Value = serde_json::from_slice(
        &s.kubectl_stdin(&["create", "--raw", "/apis/authentication.k8s.io/v1/tokenreviews", "-f", "-"], Some(&json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": format!("{id}.zzzzzzzzzzzzzzzz")}}).to_string())).stdout,
    )
    .unwrap();
    assert_ne!(wrong["status"]["authenticated"], true, "{wrong}");
    // a bootstrapper may not read the cluster
    let err = kubectl(&boot, &["get", "pods", "-A"], None).unwrap_err();
    assert!(err.contains("is forbidden: User \"system:bootstrap:"), "{err}");

    // the node's request: approved by the approver, signed by the CA
    let (key, pem) = request("system:node:joiner", &["system:nodes"]);
    kubectl(&boot, &["create", "-f", "-"], Some(&csr_yaml("node-csr-joiner", &pem, "kubernetes.io/kube-apiserver-client-kubelet", &["digital signature", "client auth"]))).unwrap();
    let cert = issued(&s, "node-csr-joiner").await;
    let v = get_csr(&s, "node-csr-joiner");
    assert_eq!(v["spec"]["username"], format!("system:bootstrap:{id}"), "the requester is recorded by the server");
    assert_eq!(conditions(&v), [("Approved".to_string(), "AutoApproved".to_string())]);
    let (cn, orgs, life) = subject(&cert);
    assert_eq!((cn.as_str(), orgs), ("system:node:joiner", vec!["system:nodes".to_string()]));
    assert!(life > 364 * 24 * 3600 && life <= 365 * 24 * 3600 + 300, "upstream's one-year default: {life}");

    // the certificate is the node's identity: it registers its Node, and is a node to the API
    let node = cert_kubeconfig(&s, "joiner", &cert, &key.serialize_pem());
    let who: Value = serde_json::from_str(&kubectl(&node, &["auth", "whoami", "-o", "json"], None).unwrap()).unwrap();
    assert_eq!(who["status"]["userInfo"]["username"], "system:node:joiner");
    kubectl(&node, &["create", "-f", "-"], Some(r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"joiner"}}"#)).unwrap();
    let err = kubectl(&node, &["delete", "node", "other"], None).unwrap_err();
    assert!(err.contains("forbidden"), "the Node authorizer still applies: {err}");
    let err = kubectl(&node, &["label", "node", "joiner", "node-role.kubernetes.io/control-plane="], None).unwrap_err();
    assert!(err.contains("is not allowed to modify labels: node-role.kubernetes.io/control-plane"), "NodeRestriction: {err}");
    kubectl(&node, &["label", "node", "joiner", "example.com/rack=r1"], None).unwrap();

    // a node asking for another node's certificate is not approved (it may only renew its
    // own): the approver looks at both, in order; the renewal is approved, the other is not
    let client = s.client().await;
    let (_, other) = request("system:node:victim", &["system:nodes"]);
    kubectl(&node, &["create", "-f", "-"], Some(&csr_yaml("steal", &other, "kubernetes.io/kube-apiserver-client-kubelet", &["digital signature", "client auth"]))).unwrap();
    let (_, renew) = request("system:node:joiner", &["system:nodes"]);
    kubectl(&node, &["create", "-f", "-"], Some(&csr_yaml("renew", &renew, "kubernetes.io/kube-apiserver-client-kubelet", &["digital signature", "client auth"]))).unwrap();
    issued(&s, "renew").await;
    let renewed = get_csr(&s, "renew");
    assert!(renewed["status"]["conditions"][0]["message"].as_str().unwrap().contains("self kubelet client"), "{renewed}");
    let csrs: Api<CertificateSigningRequest> = Api::all(client);
    let steal = csrs.get("steal").await.unwrap();
    assert!(steal.status.as_ref().and_then(|s| s.conditions.as_ref()).is_none_or(|c| c.is_empty()), "{steal:?}");
    assert!(steal.status.and_then(|s| s.certificate).is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_expired_and_deleted_tokens_are_refused() {
    let s = Server::start();
    let token = token_create(&s, &[]);
    let (id, secret) = token.split_once('.').unwrap();
    let unauthorized = |kc: &Path| {
        let err = kubectl(kc, &["auth", "whoami"], None).unwrap_err();
        assert!(err.contains("Unauthorized") || err.contains("must be logged in"), "{err}");
    };
    // the right id with a wrong secret
    let wrong = format!("{id}.{}", secret.chars().rev().collect::<String>());
    assert_ne!(wrong, token);
    unauthorized(&token_kubeconfig(&s, &wrong));
    // a token nobody made
    unauthorized(&token_kubeconfig(&s, "zzzzzz.0123456789abcdef"));
    // an expired token (its Secret written with an expiration in the past)
    let past = json!({
        "apiVersion": "v1", "kind": "Secret", "type": "bootstrap.kubernetes.io/token",
        "metadata": {"name": "bootstrap-token-expird", "namespace": "kube-system"},
        "stringData": {"token-id": "expird", "token-secret": "0123456789abcdef", "expiration": "2020-01-01T00:00:00Z",
                       "usage-bootstrap-authentication": "true", "auth-extra-groups": "system:bootstrappers:ferro:default-node-token"}
    });
    // the same Secret with a future expiration works: the refusal was the expiry
    let mut future = past.clone();
    future["metadata"]["name"] = json!("bootstrap-token-future");
    future["stringData"]["token-id"] = json!("future");
    future["stringData"]["expiration"] = json!("2099-01-01T00:00:00Z");
    s.kubectl_stdin(&["create", "-f", "-"], Some(&future.to_string()));
    kubectl(&token_kubeconfig(&s, "future.0123456789abcdef"), &["auth", "whoami"], None).unwrap();
    s.kubectl_stdin(&["create", "-f", "-"], Some(&past.to_string()));
    unauthorized(&token_kubeconfig(&s, "expird.0123456789abcdef"));
    // and the token cleaner deletes the expired one (not the other)
    eventually("the expired token's Secret deleted", || async {
        let out = s.kubectl(&["get", "secret", "-n", "kube-system", "bootstrap-token-expird"]);
        String::from_utf8_lossy(&out.stderr).contains("NotFound").then_some(())
    })
    .await;
    s.ok(&["get", "secret", "-n", "kube-system", "bootstrap-token-future"]);
    // the valid token works until its Secret is deleted
    let kc = token_kubeconfig(&s, &token);
    kubectl(&kc, &["auth", "whoami"], None).unwrap();
    s.ok(&["delete", "secret", "-n", "kube-system", &format!("bootstrap-token-{id}")]);
    unauthorized(&kc);
    // bad input to token create: a clear error, nothing made
    let out = Command::new(env!("CARGO_BIN_EXE_ferro-control-plane"))
        .args(["token", "create", "--data-dir", s.dir.path().to_str().unwrap(), "NOT-A-TOKEN"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not of the form"), "{}", String::from_utf8_lossy(&out.stderr));
    let out = Command::new(env!("CARGO_BIN_EXE_ferro-control-plane"))
        .args(["token", "create", "--data-dir", s.dir.path().to_str().unwrap(), "--groups", "system:masters"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("system:bootstrappers"), "{}", String::from_utf8_lossy(&out.stderr));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_signers_wait_for_an_allowed_approver() {
    let s = Server::start();
    // jane may create requests but not approve them
    s.apply(
        r#"{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRole","metadata":{"name":"csr-requester"},
            "rules":[{"apiGroups":["certificates.k8s.io"],"resources":["certificatesigningrequests","certificatesigningrequests/approval"],"verbs":["create","get","list","update"]}]}"#,
    );
    s.apply(
        r#"{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRoleBinding","metadata":{"name":"jane-csr"},
            "roleRef":{"apiGroup":"rbac.authorization.k8s.io","kind":"ClusterRole","name":"csr-requester"},
            "subjects":[{"kind":"User","name":"jane","apiGroup":"rbac.authorization.k8s.io"}]}"#,
    );
    let jane = s.cert_kubeconfig("jane", &[]);
    let (key, pem) = request("bob", &["team-a"]);
    let yaml = csr_yaml("bob", &pem, "kubernetes.io/kube-apiserver-client", &["digital signature", "client auth"]);
    // the server records who asked, whatever the request says
    let mut forged: Value = serde_json::from_str(&yaml).unwrap();
    forged["spec"]["username"] = json!("system:admin");
    kubectl(&jane, &["create", "-f", "-"], Some(&forged.to_string())).unwrap();
    assert_eq!(get_csr(&s, "bob")["spec"]["username"], "jane");
    // jane may update the approval subresource, but not approve for this signer
    let err = kubectl(&jane, &["certificate", "approve", "bob"], None).unwrap_err();
    assert!(err.contains("user not permitted to approve requests with signerName \"kubernetes.io/kube-apiserver-client\""), "{err}");
    assert!(conditions(&get_csr(&s, "bob")).is_empty(), "nothing approved");
    // the admin approves; the CA signs; the certificate authenticates bob in team-a
    s.ok(&["certificate", "approve", "bob"]);
    let cert = issued(&s, "bob").await;
    assert_eq!(conditions(&get_csr(&s, "bob"))[0].0, "Approved");
    let bob = cert_kubeconfig(&s, "bob", &cert, &key.serialize_pem());
    let who: Value = serde_json::from_str(&kubectl(&bob, &["auth", "whoami", "-o", "json"], None).unwrap()).unwrap();
    assert_eq!(who["status"]["userInfo"]["groups"], json!(["team-a", "system:authenticated"]));
    // an approval cannot be taken back
    let mut csr = get_csr(&s, "bob");
    csr["status"]["conditions"] = json!([]);
    let err = s.kubectl_stdin(&["replace", "--raw", "/apis/certificates.k8s.io/v1/certificatesigningrequests/bob/approval", "-f", "-"], Some(&csr.to_string()));
    assert!(String::from_utf8_lossy(&err.stderr).contains("updates may not remove a condition of type"), "{}", String::from_utf8_lossy(&err.stderr));

    // denied: never signed
    let (_, pem) = request("carol", &[]);
    s.kubectl_stdin(&["create", "-f", "-"], Some(&csr_yaml("carol", &pem, "kubernetes.io/kube-apiserver-client", &["client auth"])));
    s.ok(&["certificate", "deny", "carol"]);
    // approving a denied request is refused
    let out = s.kubectl(&["certificate", "approve", "carol"]);
    assert!(!out.status.success() || String::from_utf8_lossy(&out.stdout).contains("denied"), "{}", String::from_utf8_lossy(&out.stderr));
    // an approved request the signer refuses fails with the reason
    let (_, pem) = request("dave", &[]);
    s.kubectl_stdin(&["create", "-f", "-"], Some(&csr_yaml("dave", &pem, "kubernetes.io/kube-apiserver-client", &["server auth"])));
    s.ok(&["certificate", "approve", "dave"]);
    let failed = eventually("dave failed", || async {
        let v = get_csr(&s, "dave");
        conditions(&v).iter().any(|(t, _)| t == "Failed").then_some(v)
    })
    .await;
    assert_eq!(conditions(&failed)[1], ("Failed".to_string(), "SignerValidationFailure".to_string()));
    assert!(failed.pointer("/status/certificate").is_none());
    let carol = get_csr(&s, "carol");
    assert!(carol.pointer("/status/certificate").is_none(), "denied requests are never signed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_refused_with_their_field_and_nothing_is_stored() {
    let s = Server::start();
    let create = |yaml: String| {
        let out = s.kubectl_stdin(&["create", "-f", "-"], Some(&yaml));
        assert!(!out.status.success(), "{yaml}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let (_, pem) = request("system:node:n1", &["system:nodes"]);
    let err = create(csr_yaml("garbage", "hello", "kubernetes.io/kube-apiserver-client-kubelet", &["client auth"]));
    assert!(err.contains("spec.request: Invalid value") && err.contains("PEM block type must be CERTIFICATE REQUEST"), "{err}");
    let err = create(csr_yaml("nosigner", &pem, "", &["client auth"]));
    assert!(err.contains("spec.signerName: Required value"), "{err}");
    let err = create(csr_yaml("badsigner", &pem, "nodomain", &["client auth"]));
    assert!(err.contains("spec.signerName: Invalid value"), "{err}");
    let err = create(csr_yaml("nousage", &pem, "kubernetes.io/kube-apiserver-client-kubelet", &[]));
    assert!(err.contains("spec.usages: Required value"), "{err}");
    let err = create(csr_yaml("badusage", &pem, "kubernetes.io/kube-apiserver-client-kubelet", &["client auth", "flying"]));
    assert!(err.contains("spec.usages[1]: Unsupported value: \"flying\""), "{err}");
    // nobody gets system:masters through the API
    let (_, masters) = request("mallory", &["system:masters"]);
    let err = create(csr_yaml("masters", &masters, "kubernetes.io/kube-apiserver-client", &["client auth"]));
    assert!(err.contains("use of kubernetes.io/kube-apiserver-client signer with system:masters group is not allowed"), "{err}");
    // the kind's schema is published (kubectl explain, client-side validation)
    let explained = s.ok(&["explain", "csr.spec.signerName"]);
    assert!(explained.contains("KIND:       CertificateSigningRequest") && explained.contains("signerName <string>"), "{explained}");
    let listed = s.ok(&["get", "csr", "-o", "name"]);
    assert!(listed.trim().is_empty(), "nothing stored: {listed}");
}

/// A request with no credentials that does not check the server's certificate (what a
/// joining node has before discovery; kubectl would prompt for a password instead): the body,
/// or the Status's code and message.
async fn anonymous(s: &Server, method: &str, path: &str) -> Result<String, (u16, String)> {
    let mut config = kube::Config::new(format!("https://127.0.0.1:{}", s.port).parse().unwrap());
    config.accept_invalid_certs = true;
    let client = kube::Client::try_from(config).unwrap();
    let req = http::Request::builder().method(method).uri(path).body(Vec::new()).unwrap();
    client.request_text(req).await.map_err(|e| match e {
        kube::Error::Api(st) => (st.code, st.message),
        other => (0, other.to_string()),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_info_is_public_signed_for_each_token_and_pins_the_ca() {
    use k8s_semantics::bootstrap::{ca_cert_hash, signature_valid};
    let s = Server::start();
    let token = token_create(&s, &["--ttl", "1h"]);
    let (id, secret) = token.split_once('.').unwrap();
    // anyone may read cluster-info; the bootstrapsigner loop signs it for the token
    let path = "/api/v1/namespaces/kube-public/configmaps/cluster-info";
    let cm: Value = eventually("cluster-info signed for the token", || async {
        let v: Value = serde_json::from_str(&anonymous(&s, "GET", path).await.ok()?).ok()?;
        v.pointer(&format!("/data/jws-kubeconfig-{id}")).is_some().then_some(v)
    })
    .await;
    let content = cm["data"]["kubeconfig"].as_str().unwrap();
    assert!(signature_valid(cm["data"][format!("jws-kubeconfig-{id}")].as_str().unwrap(), content, id, secret));
    assert!(!signature_valid(cm["data"][format!("jws-kubeconfig-{id}")].as_str().unwrap(), content, id, "0000000000000000"));
    // it carries the cluster CA and this server, no credentials
    let kc: Value = serde_yaml::from_str(content).unwrap();
    let ca_pem = base64::engine::general_purpose::STANDARD.decode(kc["clusters"][0]["cluster"]["certificate-authority-data"].as_str().unwrap()).unwrap();
    assert_eq!(ca_pem, std::fs::read(s.data_dir().join("ca.crt")).unwrap());
    assert_eq!(kc["clusters"][0]["cluster"]["server"], format!("https://127.0.0.1:{}", s.port));
    assert!(kc["users"].is_null());
    // the join command names the hash of that CA's public key
    let out = Command::new(env!("CARGO_BIN_EXE_ferro-control-plane"))
        .args(["token", "create", "--print-join-command", "--data-dir", s.dir.path().to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let join = String::from_utf8(out.stdout).unwrap();
    let der = {
        use rustls::pki_types::pem::PemObject as _;
        rustls::pki_types::CertificateDer::from_pem_slice(&ca_pem).unwrap()
    };
    let hash = ca_cert_hash(&der).unwrap();
    assert!(join.starts_with(&format!("scripts/install.sh --role worker --api-server https://127.0.0.1:{} --token ", s.port)), "{join}");
    assert!(join.trim_end().ends_with(&format!("--discovery-token-ca-cert-hash {hash}")), "{join}");
    // that second token is signed too
    let second = join.split_whitespace().skip_while(|w| *w != "--token").nth(1).unwrap().to_string();
    let second_id = second[..6].to_string();
    eventually("cluster-info signed for the second token", || async {
        let v: Value = serde_json::from_str(&anonymous(&s, "GET", path).await.ok()?).ok()?;
        v.pointer(&format!("/data/jws-kubeconfig-{second_id}")).is_some().then_some(())
    })
    .await;
    // an anonymous request may read that one object and nothing else (403, not 401)
    for other in ["/api/v1/namespaces/kube-public/configmaps", "/api/v1/namespaces/kube-system/secrets", "/api/v1/namespaces/kube-public/configmaps/other", "/api"] {
        let (code, message) = anonymous(&s, "GET", other).await.unwrap_err();
        assert_eq!(code, 403, "{other}: {message}");
        assert!(message.contains("system:anonymous"), "{other}: {message}");
    }
    // writes neither
    assert_eq!(anonymous(&s, "DELETE", path).await.unwrap_err().0, 403);
    assert_eq!(anonymous(&s, "GET", "/readyz").await.unwrap(), "ok");
    // a deleted token's signature goes
    s.ok(&["delete", "secret", "-n", "kube-system", &format!("bootstrap-token-{id}")]);
    eventually("the deleted token's signature removed", || async {
        let v: Value = serde_json::from_str(&anonymous(&s, "GET", path).await.ok()?).ok()?;
        (v.pointer(&format!("/data/jws-kubeconfig-{id}")).is_none() && v.pointer(&format!("/data/jws-kubeconfig-{second_id}")).is_some()).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_anonymous_auth_a_request_without_credentials_is_401() {
    let s = Server::start_with(&["--anonymous-auth=false"]);
    let (code, message) = anonymous(&s, "GET", "/api/v1/namespaces/kube-public/configmaps/cluster-info").await.unwrap_err();
    assert_eq!(code, 401, "{message}");
    // health endpoints stay public
    assert_eq!(anonymous(&s, "GET", "/readyz").await.unwrap(), "ok");
}
