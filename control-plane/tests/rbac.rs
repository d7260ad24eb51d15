//! RBAC end to end with kubectl: users and service accounts get what their bindings grant and
//! are refused the rest in upstream's words, `kubectl auth can-i` (with --as and --list),
//! escalation refused until the writer may `escalate` or `bind`, aggregated roles picking up a
//! new ClusterRole, and bad RBAC objects refused with their field paths, nothing stored.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::fake::eventually;
use common::Server;
use serde_json::Value;

fn kubectl(kubeconfig: &Path, args: &[&str]) -> Output {
    Command::new("kubectl").arg("--kubeconfig").arg(kubeconfig).args(args).output().expect("kubectl must be installed")
}

/// kubectl as the kubeconfig's user: Ok(stdout) or Err(stderr).
fn run(kubeconfig: &Path, args: &[&str]) -> Result<String, String> {
    let out = kubectl(kubeconfig, args);
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

fn run_stdin(kubeconfig: &Path, args: &[&str], input: &str) -> Result<String, String> {
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
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// `kubectl auth can-i ...` as the admin: its answer ("yes"/"no").
fn can_i(s: &Server, args: &[&str]) -> String {
    let mut all = vec!["auth", "can-i"];
    all.extend_from_slice(args);
    String::from_utf8_lossy(&s.kubectl(&all).stdout).trim().to_string()
}

/// A kubeconfig that authenticates with a bearer token only.
fn token_kubeconfig(s: &Server, token: &str, namespace: &str) -> PathBuf {
    let kc = format!(
        "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: \"https://127.0.0.1:{}\", certificate-authority: {}}}}}]\nusers: [{{name: u, user: {{token: \"{token}\"}}}}]\ncontexts: [{{name: x, context: {{cluster: c, user: u, namespace: {namespace}}}}}]\ncurrent-context: x\n",
        s.port,
        s.data_dir().join("ca.crt").display()
    );
    let path = s.data_dir().join(format!("token-{}.kubeconfig", &token[token.len() - 8..]));
    std::fs::write(&path, kc).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_bound_to_view_can_list_but_not_delete() {
    let s = Server::start();
    let bob = s.cert_kubeconfig("bob", &[]);
    s.ok(&["create", "configmap", "settings", "--from-literal=a=b"]);
    // without a binding: discovery and whoami, nothing else
    let err = run(&bob, &["get", "configmaps"]).unwrap_err();
    assert!(err.contains("configmaps is forbidden: User \"bob\" cannot list resource \"configmaps\" in API group \"\" in the namespace \"default\""), "{err}");
    assert!(run(&bob, &["api-resources"]).unwrap().contains("rolebindings"), "system:discovery");
    assert!(run(&bob, &["auth", "whoami"]).unwrap().contains("bob"), "system:basic-user");

    s.ok(&["create", "rolebinding", "bob-view", "--clusterrole=view", "--user=bob"]);
    assert!(run(&bob, &["get", "configmaps"]).unwrap().contains("settings"));
    assert!(run(&bob, &["get", "configmap", "settings", "-o", "jsonpath={.data.a}"]).unwrap() == "b");
    let err = run(&bob, &["delete", "configmap", "settings"]).unwrap_err();
    assert!(
        err.contains("configmaps \"settings\" is forbidden: User \"bob\" cannot delete resource \"configmaps\" in API group \"\" in the namespace \"default\""),
        "{err}"
    );
    let err = run(&bob, &["get", "secrets"]).unwrap_err();
    assert!(err.contains("cannot list resource \"secrets\""), "view does not read secrets: {err}");
    let err = run(&bob, &["get", "configmaps", "-n", "kube-system"]).unwrap_err();
    assert!(err.contains("in the namespace \"kube-system\""), "a RoleBinding grants in its namespace only: {err}");
    assert!(s.ok(&["get", "configmap", "settings"]).contains("settings"), "still there");
    // the raw 403: a Status with upstream's reason and details
    let out = kubectl(&bob, &["delete", "configmap", "settings", "-v=8"]);
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("403 Forbidden") && text.contains("\"reason\": \"Forbidden\""), "{text}");
    // paths other than discovery: the admin's
    let err = run(&bob, &["get", "--raw", "/debug/controllers"]).unwrap_err();
    assert!(err.contains("forbidden: User \"bob\" cannot get path \"/debug/controllers\""), "{err}");
    // the bindings print upstream's columns
    let table = s.ok(&["get", "rolebinding", "bob-view", "-o", "wide"]);
    assert!(table.starts_with("NAME") && table.contains("ROLE") && table.contains("ClusterRole/view") && table.contains("bob"), "{table}");
    let table = s.ok(&["get", "clusterrolebinding", "cluster-admin"]);
    assert!(table.contains("ClusterRole/cluster-admin") && table.contains("AGE"), "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_can_i_as_another_user_and_the_list_of_rules() {
    let s = Server::start();
    s.ok(&["create", "namespace", "team"]);
    s.ok(&["create", "rolebinding", "bob-edit", "-n", "team", "--clusterrole=edit", "--user=bob"]);
    s.ok(&["create", "serviceaccount", "ci", "-n", "team"]);
    s.ok(&["create", "role", "cm", "-n", "team", "--verb=get,list", "--resource=configmaps", "--resource-name=settings"]);
    s.ok(&["create", "rolebinding", "ci-cm", "-n", "team", "--role=cm", "--serviceaccount=team:ci"]);
    assert_eq!(can_i(&s, &["delete", "pods", "-n", "team", "--as=bob"]), "yes");
    assert_eq!(can_i(&s, &["delete", "pods", "-n", "default", "--as=bob"]), "no");
    assert_eq!(can_i(&s, &["create", "roles", "-n", "team", "--as=bob"]), "no", "edit does not manage RBAC");
    assert_eq!(can_i(&s, &["get", "configmaps/settings", "-n", "team", "--as=system:serviceaccount:team:ci"]), "yes");
    assert_eq!(can_i(&s, &["get", "configmaps/other", "-n", "team", "--as=system:serviceaccount:team:ci"]), "no");
    assert_eq!(can_i(&s, &["get", "/version", "--as=bob"]), "yes");
    assert_eq!(can_i(&s, &["get", "/debug/controllers", "--as=bob"]), "no");
    // a group through --as-group
    s.ok(&["create", "clusterrolebinding", "ops-nodes", "--clusterrole=system:node-proxier", "--group=ops"]);
    assert_eq!(can_i(&s, &["list", "nodes", "--as=jane", "--as-group=ops"]), "yes");
    assert_eq!(can_i(&s, &["list", "nodes", "--as=jane"]), "no");
    // kubectl --as on a request
    let out = s.kubectl(&["get", "configmap", "settings", "-n", "team", "--as=system:serviceaccount:team:ci"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("configmaps \"settings\" not found"), "allowed, then not found: {out:?}");
    // only those allowed to impersonate may
    let bob = s.cert_kubeconfig("bob", &[]);
    let err = run(&bob, &["get", "pods", "-n", "team", "--as=alice"]).unwrap_err();
    assert!(err.contains("users \"alice\" is forbidden: User \"bob\" cannot impersonate resource \"users\" in API group \"\" at the cluster scope"), "{err}");
    // edit may impersonate the namespace's service accounts (upstream's aggregate-to-edit)
    assert!(run(&bob, &["get", "configmap", "settings", "-n", "team", "--as=system:serviceaccount:team:ci"]).unwrap_err().contains("not found"));

    // can-i --list: the rules that apply in the namespace, cluster-wide ones included
    let list = run(&bob, &["auth", "can-i", "--list", "-n", "team"]).unwrap();
    let line = |resource: &str| list.lines().find(|l| l.split_whitespace().next() == Some(resource)).map(str::to_string);
    let pods = line("pods").unwrap_or_else(|| panic!("{list}"));
    assert!(pods.contains("create") && pods.contains("delete"), "{list}");
    assert!(line("selfsubjectaccessreviews.authorization.k8s.io").is_some(), "{list}");
    assert!(list.contains("/api/*"), "system:discovery's paths: {list}");
    let other = run(&bob, &["auth", "can-i", "--list", "-n", "default"]).unwrap();
    assert!(!other.lines().any(|l| l.starts_with("pods ")), "{other}");
    let ci = s.ok(&["auth", "can-i", "--list", "-n", "team", "--as=system:serviceaccount:team:ci"]);
    assert!(ci.lines().any(|l| l.starts_with("configmaps") && l.contains("[settings]") && l.contains("[get list]")), "{ci}");
    // the admin: everything
    let admin = s.ok(&["auth", "can-i", "--list"]);
    assert!(admin.lines().any(|l| l.starts_with("*.*") && l.contains("[*]")), "{admin}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_account_token_does_exactly_what_its_role_binding_grants() {
    let s = Server::start();
    s.ok(&["create", "namespace", "team"]);
    s.ok(&["create", "serviceaccount", "robot", "-n", "team"]);
    s.ok(&["create", "role", "cm-rw", "-n", "team", "--verb=get,list,create", "--resource=configmaps"]);
    s.ok(&["create", "rolebinding", "robot-cm", "-n", "team", "--role=cm-rw", "--serviceaccount=team:robot"]);
    let token = s.ok(&["create", "token", "robot", "-n", "team"]).trim().to_string();
    let kc = token_kubeconfig(&s, &token, "team");
    assert!(run(&kc, &["get", "configmaps"]).unwrap().contains("NAME"));
    run(&kc, &["create", "configmap", "made-by-robot", "--from-literal=x=y"]).unwrap();
    let err = run(&kc, &["delete", "configmap", "made-by-robot"]).unwrap_err();
    assert!(
        err.contains("configmaps \"made-by-robot\" is forbidden: User \"system:serviceaccount:team:robot\" cannot delete resource \"configmaps\" in API group \"\" in the namespace \"team\""),
        "{err}"
    );
    assert!(run(&kc, &["get", "pods"]).unwrap_err().contains("cannot list resource \"pods\""));
    assert!(run(&kc, &["get", "configmaps", "-n", "default"]).unwrap_err().contains("in the namespace \"default\""));
    assert!(run(&kc, &["get", "--raw", "/openid/v1/jwks"]).unwrap().contains("keys"), "service accounts read the issuer's keys");
    // the binding goes: so does the grant
    s.ok(&["delete", "rolebinding", "robot-cm", "-n", "team"]);
    eventually("the grant gone with its binding", || async { run(&kc, &["get", "configmaps"]).err().filter(|e| e.contains("forbidden")).map(|_| ()) }).await;
    // a user is refused the issuer's documents (upstream binds them to service accounts only)
    let bob = s.cert_kubeconfig("bob", &[]);
    assert!(run(&bob, &["get", "--raw", "/openid/v1/jwks"]).unwrap_err().contains("cannot get path \"/openid/v1/jwks\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escalation_is_refused_until_escalate_or_bind_is_granted() {
    let s = Server::start();
    s.ok(&["create", "namespace", "team"]);
    s.ok(&["create", "rolebinding", "bob-admin", "-n", "team", "--clusterrole=admin", "--user=bob"]);
    let bob = s.cert_kubeconfig("bob", &[]);
    // what bob holds he may grant
    run(&bob, &["create", "role", "readers", "-n", "team", "--verb=get,list", "--resource=pods,secrets"]).unwrap();
    run(&bob, &["create", "rolebinding", "eve-view", "-n", "team", "--clusterrole=view", "--user=eve"]).unwrap();
    // more is refused, in upstream's words, nothing stored
    let err = run(&bob, &["create", "role", "nodes", "-n", "team", "--verb=get", "--resource=nodes,pods"]).unwrap_err();
    assert!(
        err.contains("roles.rbac.authorization.k8s.io \"nodes\" is forbidden: user \"bob\" (groups=[\"system:authenticated\"]) is attempting to grant RBAC permissions not currently held:\n{APIGroups:[\"\"], Resources:[\"nodes\"], Verbs:[\"get\"]}"),
        "{err}"
    );
    assert!(!s.kubectl(&["get", "role", "nodes", "-n", "team"]).status.success());
    let err = run(&bob, &["create", "rolebinding", "root", "-n", "team", "--clusterrole=cluster-admin", "--user=bob"]).unwrap_err();
    assert!(err.contains("rolebindings.rbac.authorization.k8s.io \"root\" is forbidden: user \"bob\""), "{err}");
    assert!(err.contains("{APIGroups:[\"*\"], Resources:[\"*\"], Verbs:[\"*\"]}") && err.contains("{NonResourceURLs:[\"*\"], Verbs:[\"*\"]}"), "{err}");
    // changing a role he may change into one granting more: refused too
    let patch = r#"{"rules":[{"apiGroups":[""],"resources":["nodes"],"verbs":["get"]}]}"#;
    let err = run(&bob, &["patch", "role", "readers", "-n", "team", "--type=merge", "-p", patch]).unwrap_err();
    assert!(err.contains("is attempting to grant RBAC permissions not currently held"), "{err}");

    // escalate on roles in team: bob may write any Role there
    s.ok(&["create", "role", "escalator", "-n", "team", "--verb=escalate", "--resource=roles.rbac.authorization.k8s.io"]);
    s.ok(&["create", "rolebinding", "bob-escalate", "-n", "team", "--role=escalator", "--user=bob"]);
    run(&bob, &["create", "role", "nodes", "-n", "team", "--verb=get", "--resource=nodes,pods"]).unwrap();
    run(&bob, &["patch", "role", "readers", "-n", "team", "--type=merge", "-p", patch]).unwrap();
    // bind on cluster-admin, by name: bob may bind it (in team), not another role
    s.ok(&["create", "role", "binder", "-n", "team", "--verb=bind", "--resource=clusterroles.rbac.authorization.k8s.io", "--resource-name=cluster-admin"]);
    s.ok(&["create", "rolebinding", "bob-bind", "-n", "team", "--role=binder", "--user=bob"]);
    run(&bob, &["create", "rolebinding", "root", "-n", "team", "--clusterrole=cluster-admin", "--user=eve"]).unwrap();
    let err = run(&bob, &["create", "rolebinding", "nodes", "-n", "team", "--clusterrole=system:node", "--user=eve"]).unwrap_err();
    assert!(err.contains("is attempting to grant RBAC permissions not currently held"), "{err}");
    // a ClusterRoleBinding needs the grant cluster-wide
    let err = run(&bob, &["create", "clusterrolebinding", "root", "--clusterrole=cluster-admin", "--user=eve"]).unwrap_err();
    assert!(err.contains("forbidden"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aggregated_roles_pick_up_a_new_cluster_role() {
    let s = Server::start();
    s.ok(&["create", "clusterrolebinding", "bob-view", "--clusterrole=view", "--user=bob"]);
    assert_eq!(can_i(&s, &["list", "nodes", "--as=bob"]), "no");
    s.apply(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: node-reader\n  labels: {rbac.authorization.k8s.io/aggregate-to-view: \"true\"}\nrules:\n- {apiGroups: [\"\"], resources: [nodes], verbs: [get, list, watch]}\n",
    );
    eventually("view (and edit and admin, which gather view) with the nodes rule", || async {
        let ok = ["view", "edit", "admin"]
            .iter()
            .all(|r| s.ok(&["get", "clusterrole", r, "-o", "jsonpath={.rules[*].resources}"]).contains("nodes"));
        ok.then_some(())
    })
    .await;
    eventually("bob lists nodes", || async { (can_i(&s, &["list", "nodes", "--as=bob"]) == "yes").then_some(()) }).await;
    // the label goes: so does the rule
    s.ok(&["label", "clusterrole", "node-reader", "rbac.authorization.k8s.io/aggregate-to-view-"]);
    eventually("view without the nodes rule", || async {
        (!s.ok(&["get", "clusterrole", "view", "-o", "jsonpath={.rules[*].resources}"]).contains("nodes")).then_some(())
    })
    .await;
    // the authorizer's index follows the store a moment later
    eventually("bob no longer lists nodes", || async { (can_i(&s, &["list", "nodes", "--as=bob"]) == "no").then_some(()) }).await;
    // the loop explains itself
    let text = s.ok(&["get", "--raw", "/debug/controllers/clusterrole-aggregation/view?format=text"]);
    assert!(text.contains("none: the object is as the loop wants it"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_rbac_objects_are_refused_with_field_paths_nothing_stored() {
    let s = Server::start();
    let admin = s.kubeconfig();
    let refused = |yaml: &str, name: &str, kind: &str| -> String {
        let err = run_stdin(&admin, &["create", "-f", "-"], yaml).unwrap_err();
        assert!(!s.kubectl(&["get", kind, name]).status.success(), "{kind}/{name} stored");
        err
    };
    let binding = |name: &str, role_ref: &str| {
        format!("apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: {name}, namespace: default}}\nroleRef: {role_ref}\nsubjects: [{{kind: User, name: bob}}]\n")
    };
    let e = refused(&binding("wrong-kind", "{apiGroup: rbac.authorization.k8s.io, kind: Rol, name: view}"), "wrong-kind", "rolebinding");
    assert!(e.contains("RoleBinding \"wrong-kind\" is invalid: roleRef.kind: Unsupported value: \"Rol\": supported values: \"Role\", \"ClusterRole\""), "{e}");
    let e = refused(&binding("no-kind", "{name: view}"), "no-kind", "rolebinding");
    assert!(e.contains("roleRef.kind: Unsupported value: \"\""), "{e}");
    let e = refused(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: bad-subject}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: view}\nsubjects: [{kind: ServiceAccount, name: ci}, {kind: Robot, name: r}]\n",
        "bad-subject",
        "clusterrolebinding",
    );
    assert!(e.contains("subjects[0].namespace: Required value") && e.contains("subjects[1].kind: Unsupported value: \"Robot\""), "{e}");
    let e = refused(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: no-verbs}\nrules: [{apiGroups: [\"\"], resources: [pods]}]\n",
        "no-verbs",
        "clusterrole",
    );
    assert!(e.contains("ClusterRole \"no-verbs\" is invalid: rules[0].verbs: Required value: verbs must contain at least one value"), "{e}");
    let e = refused(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {name: urls, namespace: default}\nrules: [{nonResourceURLs: [/healthz], verbs: [get]}]\n",
        "urls",
        "role",
    );
    assert!(e.contains("rules[0].nonResourceURLs: Invalid value: []string{\"/healthz\"}: namespaced rules cannot apply to non-resource URLs"), "{e}");
    // the 422's Status names the field
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&admin)
        .args(["create", "--raw", "/apis/rbac.authorization.k8s.io/v1/clusterroles", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write as _;
            c.stdin.take().unwrap().write_all(br#"{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRole","metadata":{"name":"x"},"rules":[{"resources":["pods"]}]}"#)?;
            c.wait_with_output()
        })
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && text.contains("The ClusterRole \"x\" is invalid"), "{text}");
    assert!(text.contains("rules[0].verbs: Required value: verbs must contain at least one value"), "{text}");
    assert!(text.contains("rules[0].apiGroups: Required value: resource rules must supply at least one api group"), "{text}");
    // a changed roleRef: 422, the binding as it was
    s.ok(&["create", "rolebinding", "bob-view", "--clusterrole=view", "--user=bob"]);
    let err = run(&admin, &["patch", "rolebinding", "bob-view", "--type=merge", "-p", r#"{"roleRef":{"name":"edit"}}"#]).unwrap_err();
    assert!(
        err.contains("roleRef: Invalid value: rbac.RoleRef{APIGroup:\"rbac.authorization.k8s.io\", Kind:\"ClusterRole\", Name:\"edit\"}: cannot change roleRef"),
        "{err}"
    );
    let rb: Value = serde_json::from_str(&s.ok(&["get", "rolebinding", "bob-view", "-o", "json"])).unwrap();
    assert_eq!(rb["roleRef"]["name"], "view");
    // the defaults upstream fills
    assert_eq!(rb["roleRef"]["apiGroup"], "rbac.authorization.k8s.io");
    assert_eq!(rb["subjects"][0]["apiGroup"], "rbac.authorization.k8s.io");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bootstrap_policy_is_reconciled_at_start() {
    let mut s = Server::start();
    for r in ["cluster-admin", "admin", "edit", "view", "system:basic-user", "system:discovery", "system:public-info-viewer", "system:node-proxier", "system:node"] {
        assert!(s.kubectl(&["get", "clusterrole", r]).status.success(), "{r}");
    }
    // an edited default gets its rules back at the next start; one marked autoupdate=false keeps its edit
    s.ok(&["patch", "clusterrole", "system:node-proxier", "--type=json", "-p", r#"[{"op":"remove","path":"/rules/0"}]"#]);
    s.ok(&["patch", "clusterrole", "system:heapster", "--type=json", "-p", r#"[{"op":"remove","path":"/rules/0"}]"#]);
    s.ok(&["annotate", "--overwrite", "clusterrole", "system:heapster", "rbac.authorization.kubernetes.io/autoupdate=false"]);
    s.ok(&["delete", "clusterrolebinding", "system:basic-user"]);
    let rules = |s: &Server, r: &str| s.ok(&["get", "clusterrole", r, "-o", "jsonpath={.rules[*].resources}"]);
    assert!(!rules(&s, "system:node-proxier").contains("services"));
    s.restart();
    assert!(rules(&s, "system:node-proxier").contains("services"), "rule put back");
    assert!(!rules(&s, "system:heapster").contains("pods"), "left as its owner made it");
    assert!(s.kubectl(&["get", "clusterrolebinding", "system:basic-user"]).status.success(), "binding put back");
    // kube-proxy's own identity works with the bootstrap binding alone
    let proxy = s.cert_kubeconfig("system:kube-proxy", &[]);
    assert!(run(&proxy, &["get", "endpointslices", "-A"]).is_ok());
    assert!(run(&proxy, &["get", "secrets", "-A"]).is_err());
}
