//! Service accounts that work: the TokenRequest API (`kubectl create token`), tokens that
//! authenticate as the service account for as long as what they are bound to lives, TokenReview
//! of them, the OIDC discovery documents, the `kube-root-ca.crt` ConfigMap in every namespace,
//! and the pods' kube-api-access volume from the ServiceAccount admission. Bad input: Status
//! errors, nothing stored.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::PathBuf;

use common::fake::{eventually, FakeNodes};
use common::Server;
use serde_json::{json, Value};

/// A kubeconfig that authenticates with a bearer token only.
fn token_kubeconfig(s: &Server, token: &str) -> PathBuf {
    use base64::Engine as _;
    let ca = base64::engine::general_purpose::STANDARD.encode(std::fs::read(s.data_dir().join("ca.crt")).unwrap());
    let kc = format!(
        "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: \"https://127.0.0.1:{}\", certificate-authority-data: {ca}}}}}]\nusers: [{{name: u, user: {{token: \"{token}\"}}}}]\ncontexts: [{{name: x, context: {{cluster: c, user: u}}}}]\ncurrent-context: x\n",
        s.port
    );
    let path = s.data_dir().join(format!("token-{}.kubeconfig", &token[token.len() - 8..]));
    std::fs::write(&path, kc).unwrap();
    path
}

/// kubectl as the token's user: Ok(stdout) or Err(stderr).
fn kubectl_as(s: &Server, token: &str, args: &[&str]) -> Result<String, String> {
    let out = std::process::Command::new("kubectl").arg("--kubeconfig").arg(token_kubeconfig(s, token)).args(args).output().unwrap();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

fn review(s: &Server, token: &str, audiences: &[&str]) -> Value {
    let body = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token, "audiences": audiences}});
    let out = s.kubectl_stdin(&["create", "-f", "-", "-o", "json"], Some(&body.to_string()));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice::<Value>(&out.stdout).unwrap()["status"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_authenticate_as_their_service_account_while_it_and_its_pod_live() {
    let s = Server::start();
    let client = s.client().await;
    let _nodes = FakeNodes::start(client.clone(), &["n1"], "4", "8Gi").await;
    s.ok(&["create", "serviceaccount", "app"]);

    // kubectl create token: a JWT that authenticates (a 403 from authorization, not a 401)
    let token = s.ok(&["create", "token", "app", "--duration=1h"]).trim().to_string();
    assert_eq!(token.matches('.').count(), 2, "{token}");
    let err = kubectl_as(&s, &token, &["get", "pods"]).unwrap_err();
    assert!(err.contains("User \"system:serviceaccount:default:app\" cannot list resource \"pods\""), "{err}");
    // kubectl auth whoami / can-i (SelfSubjectReview, SelfSubjectAccessReview)
    let who = kubectl_as(&s, &token, &["auth", "whoami", "-o", "json"]).unwrap();
    let who: Value = serde_json::from_str(&who).unwrap();
    assert_eq!(who["status"]["userInfo"]["username"], "system:serviceaccount:default:app", "{who}");
    let can = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(token_kubeconfig(&s, &token))
        .args(["auth", "can-i", "list", "pods"])
        .output()
        .unwrap();
    assert!(!can.status.success() && String::from_utf8_lossy(&can.stdout).starts_with("no"), "{can:?}");
    assert_eq!(s.ok(&["auth", "can-i", "list", "pods"]).trim(), "yes");
    let version: Value = serde_json::from_str(&s.ok(&["get", "--raw", "/version/"])).unwrap();
    assert_eq!(version["major"], "1");
    let st = review(&s, &token, &[]);
    assert_eq!(st["authenticated"], true, "{st}");
    assert_eq!(st["user"]["username"], "system:serviceaccount:default:app");
    assert_eq!(st["user"]["groups"], json!(["system:serviceaccounts", "system:serviceaccounts:default", "system:authenticated"]));
    assert_eq!(st["audiences"], json!(["https://kubernetes.default.svc.cluster.local"]));
    // a token for another audience is not one for the API server
    let vault = s.ok(&["create", "token", "app", "--audience=vault"]).trim().to_string();
    assert!(kubectl_as(&s, &vault, &["get", "pods"]).unwrap_err().contains("Unauthorized"));
    assert_eq!(review(&s, &vault, &["vault"])["audiences"], json!(["vault"]));
    assert!(review(&s, &vault, &[])["authenticated"].is_null());

    // bound to a pod: valid while the pod lives, with the pod and node in the claims
    s.apply("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {serviceAccountName: app, containers: [{name: c, image: \"busybox:1\"}]}\n");
    eventually("p bound to n1", || async {
        (s.ok(&["get", "pod", "p", "-o", "jsonpath={.spec.nodeName}"]).trim() == "n1").then_some(())
    })
    .await;
    let bound = s.ok(&["create", "token", "app", "--bound-object-kind=Pod", "--bound-object-name=p"]).trim().to_string();
    let st = review(&s, &bound, &[]);
    assert_eq!(st["user"]["extra"]["authentication.kubernetes.io/pod-name"], json!(["p"]), "{st}");
    assert_eq!(st["user"]["extra"]["authentication.kubernetes.io/node-name"], json!(["n1"]), "{st}");
    s.ok(&["delete", "pod", "p", "--grace-period=0", "--force"]);
    eventually("the bound token refused once the pod is gone", || async {
        kubectl_as(&s, &bound, &["get", "pods"]).err().filter(|e| e.contains("Unauthorized")).map(|_| ())
    })
    .await;
    // the service account deleted: its tokens go with it
    s.ok(&["delete", "serviceaccount", "app"]);
    eventually("the token refused once the account is gone", || async {
        kubectl_as(&s, &token, &["get", "pods"]).err().filter(|e| e.contains("Unauthorized")).map(|_| ())
    })
    .await;

    // the issuer's discovery documents
    let cfg: Value = serde_json::from_str(&s.ok(&["get", "--raw", "/.well-known/openid-configuration"])).unwrap();
    assert_eq!(cfg["issuer"], "https://kubernetes.default.svc.cluster.local");
    assert_eq!(cfg["id_token_signing_alg_values_supported"], json!(["ES256"]));
    let jwks: Value = serde_json::from_str(&s.ok(&["get", "--raw", "/openid/v1/jwks"])).unwrap();
    assert_eq!(jwks["keys"][0]["kty"], "EC");
    assert_eq!(jwks["keys"][0]["crv"], "P-256");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_token_requests_are_refused() {
    let s = Server::start();
    let client = s.client().await;
    let _nodes = FakeNodes::start(client.clone(), &["n1"], "4", "8Gi").await;
    let err = |args: &[&str]| {
        let out = s.kubectl(args);
        assert!(!out.status.success(), "{args:?} succeeded");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let e = err(&["create", "token", "nobody"]);
    assert!(e.contains("serviceaccounts \"nobody\" not found"), "{e}");
    s.ok(&["create", "serviceaccount", "app"]);
    let e = err(&["create", "token", "app", "--duration=1m"]);
    assert!(e.contains("spec.expirationSeconds: Invalid value: 60: may not specify a duration less than 10 minutes"), "{e}");
    let e = err(&["create", "token", "app", "--bound-object-kind=Pod", "--bound-object-name=ghost"]);
    assert!(e.contains("pods \"ghost\" not found"), "{e}");
    s.apply("apiVersion: v1\nkind: Pod\nmetadata: {name: other}\nspec: {containers: [{name: c, image: \"busybox:1\"}]}\n");
    let e = err(&["create", "token", "app", "--bound-object-kind=Pod", "--bound-object-name=other"]);
    assert!(e.contains("cannot bind token for serviceaccount \"app\" to pod running with different serviceaccount name."), "{e}");
    let e = err(&["create", "token", "app", "--bound-object-kind=Pod", "--bound-object-name=other", "--bound-object-uid=0000"]);
    assert!(e.contains("the UID in the bound object reference (0000) does not match the UID in record"), "{e}");
    // a forged token
    let token = s.ok(&["create", "token", "app"]).trim().to_string();
    let mut parts: Vec<&str> = token.split('.').collect();
    let other = s.ok(&["create", "token", "default"]).trim().to_string();
    parts[1] = other.split('.').nth(1).unwrap();
    assert!(kubectl_as(&s, &parts.join("."), &["get", "pods"]).unwrap_err().contains("Unauthorized"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_get_their_api_access_volume_and_namespaces_the_root_ca() {
    let s = Server::start();
    s.ok(&["create", "namespace", "team"]);
    // the root CA in every namespace, put back when deleted
    let ca = std::fs::read_to_string(s.data_dir().join("ca.crt")).unwrap();
    let get_ca = || s.kubectl(&["get", "configmap", "kube-root-ca.crt", "-n", "team", "-o", "jsonpath={.data.ca\\.crt}"]);
    eventually("kube-root-ca.crt in team", || async {
        let out = get_ca();
        (out.status.success() && String::from_utf8_lossy(&out.stdout) == ca).then_some(())
    })
    .await;
    s.ok(&["delete", "configmap", "kube-root-ca.crt", "-n", "team"]);
    eventually("kube-root-ca.crt back", || async { get_ca().status.success().then_some(()) }).await;

    // a pod created right after its namespace: the default account, the volume in every container
    s.ok(&["create", "namespace", "fresh"]);
    s.apply("apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: fresh}\nspec: {initContainers: [{name: i, image: \"busybox:1\"}], containers: [{name: c, image: \"busybox:1\"}]}\n");
    let pod: Value = serde_json::from_str(&s.ok(&["get", "pod", "p", "-n", "fresh", "-o", "json"])).unwrap();
    assert_eq!(pod["spec"]["serviceAccountName"], "default");
    let vol = &pod["spec"]["volumes"][0];
    assert!(vol["name"].as_str().unwrap().starts_with("kube-api-access-"), "{vol}");
    assert_eq!(vol["projected"]["sources"][0]["serviceAccountToken"]["path"], "token");
    for c in ["initContainers", "containers"] {
        let m = &pod["spec"][c][0]["volumeMounts"][0];
        assert_eq!(m["mountPath"], "/var/run/secrets/kubernetes.io/serviceaccount", "{pod}");
        assert_eq!(m["readOnly"], true);
    }
    // automountServiceAccountToken: false on the account
    s.apply("apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: quiet}\nautomountServiceAccountToken: false\n");
    s.apply("apiVersion: v1\nkind: Pod\nmetadata: {name: q}\nspec: {serviceAccountName: quiet, containers: [{name: c, image: \"busybox:1\"}]}\n");
    let vols = s.ok(&["get", "pod", "q", "-o", "jsonpath={.spec.volumes}"]);
    assert_eq!(vols.trim(), "", "no volume: {vols}");
    // a missing account is refused, nothing stored
    let out = s.kubectl_stdin(
        &["apply", "-f", "-"],
        Some("apiVersion: v1\nkind: Pod\nmetadata: {name: r}\nspec: {serviceAccountName: ghost, containers: [{name: c, image: \"busybox:1\"}]}\n"),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("pods \"r\" is forbidden: error looking up service account default/ghost: serviceaccount \"ghost\" not found"), "{err}");
    assert!(!s.kubectl(&["get", "pod", "r"]).status.success());
}

/// The claims of a JWT (no verification: the test reads what the server put in).
fn jwt_claims(token: &str) -> Value {
    use base64::Engine as _;
    let payload = token.split('.').nth(1).unwrap();
    serde_json::from_slice(&base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_issuer_and_the_api_audiences_are_the_operators_choice() {
    let s = Server::start_with(&["--service-account-issuer", "https://issuer.ferro.test", "--api-audiences", "api.ferro.test,other"]);
    s.ok(&["create", "serviceaccount", "app"]);
    let token = s.ok(&["create", "token", "app"]).trim().to_string();
    let claims = jwt_claims(&token);
    assert_eq!(claims["iss"], "https://issuer.ferro.test");
    assert_eq!(claims["aud"], json!(["api.ferro.test", "other"]));
    let oidc: Value = serde_json::from_str(&s.ok(&["get", "--raw", "/.well-known/openid-configuration"])).unwrap();
    assert_eq!((oidc["issuer"].as_str(), oidc["jwks_uri"].as_str()), (Some("https://issuer.ferro.test"), Some("https://issuer.ferro.test/openid/v1/jwks")));
    // the token authenticates (its audience is one the API accepts)...
    let st = review(&s, &token, &[]);
    assert_eq!(st["authenticated"], true, "{st}");
    // ...one for another audience only does not
    let elsewhere = s.ok(&["create", "token", "app", "--audience=vault"]).trim().to_string();
    assert_eq!(jwt_claims(&elsewhere)["aud"], json!(["vault"]));
    let err = kubectl_as(&s, &elsewhere, &["get", "pods"]).unwrap_err();
    assert!(err.contains("Unauthorized") || err.contains("must be logged in"), "{err}");

    // bad flags: a clear error, no server
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ferro-control-plane"))
        .args(["--data-dir", dir.path().to_str().unwrap(), "--service-account-issuer", "http://insecure.example"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("an issuer URL must use the https scheme"), "{}", String::from_utf8_lossy(&out.stderr));
}

/// The token the legacy token loop put in a Secret, once it is there.
async fn secret_token(s: &Server, name: &str) -> String {
    use base64::Engine as _;
    eventually(&format!("the token in {name}"), || async {
        let out = s.kubectl(&["get", "secret", name, "-o", "jsonpath={.data.token}"]);
        let b64 = String::from_utf8(out.stdout).ok()?;
        let raw = base64::engine::general_purpose::STANDARD.decode(b64.trim()).ok()?;
        (!raw.is_empty()).then(|| String::from_utf8(raw).unwrap())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_token_secrets_are_filled_when_asked_for_and_die_with_their_secret_or_account() {
    let s = Server::start();
    s.ok(&["create", "serviceaccount", "app"]);
    let secret = |name: &str, account: &str| {
        format!("apiVersion: v1\nkind: Secret\nmetadata:\n  name: {name}\n  annotations:\n    kubernetes.io/service-account.name: {account}\ntype: kubernetes.io/service-account-token\n")
    };
    s.apply(&secret("app-token", "app"));
    let token = secret_token(&s, "app-token").await;
    let claims = jwt_claims(&token);
    assert_eq!(claims["iss"], "kubernetes/serviceaccount");
    assert_eq!(claims["kubernetes.io/serviceaccount/secret.name"], "app-token");
    let data: Value = serde_json::from_str(&s.ok(&["get", "secret", "app-token", "-o", "json"])).unwrap();
    assert!(data["data"]["ca.crt"].is_string() && data["data"]["namespace"] == "ZGVmYXVsdA==", "{data}");
    let uid = s.ok(&["get", "serviceaccount", "app", "-o", "jsonpath={.metadata.uid}"]);
    assert_eq!(data["metadata"]["annotations"]["kubernetes.io/service-account.uid"], uid);
    // it authenticates as the account (a 403 from authorization, not a 401)
    let err = kubectl_as(&s, &token, &["get", "pods"]).unwrap_err();
    assert!(err.contains("system:serviceaccount:default:app"), "{err}");
    assert_eq!(review(&s, &token, &[])["user"]["username"], "system:serviceaccount:default:app");
    // no Secret, no token
    s.ok(&["delete", "secret", "app-token"]);
    assert_ne!(review(&s, &token, &[])["authenticated"], true);
    let err = kubectl_as(&s, &token, &["get", "pods"]).unwrap_err();
    assert!(err.contains("Unauthorized") || err.contains("must be logged in"), "{err}");

    // a Secret for an account that does not exist yet waits for it; deleting the account
    // deletes its token Secrets
    s.apply(&secret("later-token", "later"));
    s.ok(&["create", "serviceaccount", "later"]);
    secret_token(&s, "later-token").await;
    s.ok(&["delete", "serviceaccount", "later"]);
    eventually("the token Secret deleted with its account", || async { (!s.kubectl(&["get", "secret", "later-token"]).status.success()).then_some(()) }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_is_accepted_until_it_expires_and_refused_after() {
    // the API server issues and checks tokens by a clock this test moves (a hidden test flag)
    let dir = tempfile::tempdir().unwrap();
    let clock = dir.path().join("clock");
    let t0: jiff::Timestamp = jiff::Timestamp::now().round(jiff::Unit::Second).unwrap();
    std::fs::write(&clock, t0.to_string()).unwrap();
    let s = Server::start_with(&["--tokens-clock-file", clock.to_str().unwrap()]);
    s.ok(&["create", "serviceaccount", "app"]);
    let token = s.ok(&["create", "token", "app", "--duration=10m"]).trim().to_string();
    assert_eq!(jwt_claims(&token)["exp"].as_i64(), Some(t0.as_second() + 600));
    let authenticated = |t: &str| kubectl_as(&s, t, &["get", "pods"]).unwrap_err().contains("system:serviceaccount:default:app");
    assert!(authenticated(&token));
    // just before the end (upstream's 60 s of leeway past exp): still accepted
    std::fs::write(&clock, (t0 + jiff::SignedDuration::from_secs(600 + 59)).to_string()).unwrap();
    eventually("the clock moved", || async { (jwt_claims(&s.ok(&["create", "token", "app"]))["iat"].as_i64()? == t0.as_second() + 659).then_some(()) }).await;
    assert!(authenticated(&token));
    // after: refused (401), and TokenReview says so
    std::fs::write(&clock, (t0 + jiff::SignedDuration::from_secs(600 + 61)).to_string()).unwrap();
    eventually("the token expired", || async { (!authenticated(&token)).then_some(()) }).await;
    let err = kubectl_as(&s, &token, &["get", "pods"]).unwrap_err();
    assert!(err.contains("Unauthorized") || err.contains("must be logged in"), "{err}");
    assert_ne!(review(&s, &token, &[])["authenticated"], true);
}
