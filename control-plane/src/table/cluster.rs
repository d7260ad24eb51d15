//! Server-side printing of the cluster-administration groups: pod disruption budgets (`policy`),
//! role bindings (`rbac.authorization.k8s.io`), certificate signing requests
//! (`certificates.k8s.io`), leases (`coordination.k8s.io`), priority classes (`scheduling.k8s.io`),
//! runtime classes (`node.k8s.io`), webhook configurations (`admissionregistration.k8s.io`).

use super::*;

pub(super) const PDB_COLUMNS: &[Column] = &[
    NAME,
    col("Min Available", "string", "The minimum number of pods that must be available."),
    col("Max Unavailable", "string", "The maximum number of pods that may be unavailable."),
    col("Allowed Disruptions", "integer", "Calculated number of pods that may be disrupted at this time."),
    AGE,
];

pub(super) const ROLE_BINDING_COLUMNS: &[Column] = &[
    NAME,
    col("Role", "string", D_RB_ROLE_REF),
    AGE,
    wide("Users", "string", "Users in the roleBinding"),
    wide("Groups", "string", "Groups in the roleBinding"),
    wide("ServiceAccounts", "string", "ServiceAccounts in the roleBinding"),
];

pub(super) const CLUSTER_ROLE_BINDING_COLUMNS: &[Column] = &[
    NAME,
    col("Role", "string", D_CRB_ROLE_REF),
    AGE,
    wide("Users", "string", "Users in the clusterRoleBinding"),
    wide("Groups", "string", "Groups in the clusterRoleBinding"),
    wide("ServiceAccounts", "string", "ServiceAccounts in the clusterRoleBinding"),
];

pub(super) const CSR_COLUMNS: &[Column] = &[
    NAME,
    AGE,
    col("SignerName", "string", D_CSR_SIGNER),
    col("Requestor", "string", D_CSR_REQUEST),
    col("RequestedDuration", "string", D_CSR_EXPIRATION),
    col("Condition", "string", D_CSR_CONDITIONS),
];

pub(super) const LEASE_COLUMNS: &[Column] = &[NAME, col("Holder", "string", D_LEASE_HOLDER), AGE];

pub(super) const PRIORITY_CLASS_COLUMNS: &[Column] = &[
    NAME,
    col("Value", "integer", D_PC_VALUE),
    col("Global-Default", "boolean", D_PC_GLOBAL_DEFAULT),
    AGE,
    col("PreemptionPolicy", "string", D_PC_PREEMPTION),
];

// Upstream describes the handler column with a key ObjectMeta has no docs for: empty.
pub(super) const RUNTIME_CLASS_COLUMNS: &[Column] = &[NAME, col("Handler", "string", ""), AGE];

pub(super) const WEBHOOK_COLUMNS: &[Column] = &[
    NAME,
    col("Webhooks", "integer", "Webhooks indicates the number of webhooks registered in this configuration"),
    AGE,
];

pub(super) fn pdb_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    let bound = |key: &str| at(obj, &["spec", key]).map_or_else(|| "N/A".to_string(), int_or_string);
    vec![
        name(obj),
        s(bound("minAvailable")),
        s(bound("maxUnavailable")),
        Value::from(int(obj, &["status", "disruptionsAllowed"])),
        age(obj, now),
    ]
}

pub(super) fn role_binding_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    let (mut users, mut groups, mut sas) = (Vec::new(), Vec::new(), Vec::new());
    for subject in list(obj, &["subjects"]) {
        let subject_name = st(subject, &["name"]);
        match st(subject, &["kind"]) {
            "ServiceAccount" => sas.push(format!("{}/{subject_name}", st(subject, &["namespace"]))),
            "User" => users.push(subject_name.to_string()),
            "Group" => groups.push(subject_name.to_string()),
            _ => {}
        }
    }
    vec![
        name(obj),
        s(format!("{}/{}", st(obj, &["roleRef", "kind"]), st(obj, &["roleRef", "name"]))),
        age(obj, now),
        s(users.join(", ")),
        s(groups.join(", ")),
        s(sas.join(", ")),
    ]
}

pub(super) fn csr_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    let conditions = list(obj, &["status", "conditions"]);
    let has = |t: &str| conditions.iter().any(|c| st(c, &["type"]) == t);
    let mut status = if has("Denied") {
        "Denied".to_string()
    } else if has("Approved") {
        "Approved".to_string()
    } else {
        "Pending".to_string()
    };
    if has("Failed") {
        status.push_str(",Failed");
    }
    if !st(obj, &["status", "certificate"]).is_empty() {
        status.push_str(",Issued");
    }
    let requested = match at(obj, &["spec", "expirationSeconds"]).and_then(Value::as_i64) {
        Some(secs) => human_duration_nanos(i128::from(secs) * 1_000_000_000),
        None => "<none>".into(),
    };
    vec![
        name(obj),
        age(obj, now),
        s(st_or(obj, &["spec", "signerName"], "<none>")),
        s(st(obj, &["spec", "username"])),
        s(requested),
        s(status),
    ]
}

pub(super) fn lease_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    vec![name(obj), s(st(obj, &["spec", "holderIdentity"])), age(obj, now)]
}

pub(super) fn priority_class_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    vec![
        name(obj),
        Value::from(int(obj, &["value"])),
        Value::Bool(boolean(obj, &["globalDefault"]).unwrap_or(false)),
        age(obj, now),
        s(st_or(obj, &["preemptionPolicy"], "PreemptLowerPriority")),
    ]
}

pub(super) fn runtime_class_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    vec![name(obj), s(st(obj, &["handler"])), age(obj, now)]
}

pub(super) fn webhook_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    vec![name(obj), count(list(obj, &["webhooks"]).len()), age(obj, now)]
}

// Column descriptions: upstream takes them from the API types' documentation.

const D_RB_ROLE_REF: &str = "RoleRef can reference a Role in the current namespace or a ClusterRole in the global namespace. If the RoleRef cannot be resolved, the Authorizer must return an error. This field is immutable.";
const D_CRB_ROLE_REF: &str = "RoleRef can only reference a ClusterRole in the global namespace. If the RoleRef cannot be resolved, the Authorizer must return an error. This field is immutable.";
const D_CSR_SIGNER: &str = "signerName indicates the requested signer, and is a qualified name.\n\nList/watch requests for CertificateSigningRequests can filter on this field using a \"spec.signerName=NAME\" fieldSelector.\n\nWell-known Kubernetes signers are:\n1. \"kubernetes.io/kube-apiserver-client\": issues client certificates that can be used to authenticate to kube-apiserver.\nRequests for this signer are never auto-approved by kube-controller-manager, can be issued by the \"csrsigning\" controller in kube-controller-manager.\n2. \"kubernetes.io/kube-apiserver-client-kubelet\": issues client certificates that kubelets use to authenticate to kube-apiserver.\nRequests for this signer can be auto-approved by the \"csrapproving\" controller in kube-controller-manager, and can be issued by the \"csrsigning\" controller in kube-controller-manager.\n3. \"kubernetes.io/kubelet-serving\" issues serving certificates that kubelets use to serve TLS endpoints, which kube-apiserver can connect to securely.\nRequests for this signer are never auto-approved by kube-controller-manager, and can be issued by the \"csrsigning\" controller in kube-controller-manager.\n\nMore details are available at https://k8s.io/docs/reference/access-authn-authz/certificate-signing-requests/#kubernetes-signers\n\nCustom signerNames can also be specified. The signer defines:\n1. Trust distribution: how trust (CA bundles) are distributed.\n2. Permitted subjects: and behavior when a disallowed subject is requested.\n3. Required, permitted, or forbidden x509 extensions in the request (including whether subjectAltNames are allowed, which types, restrictions on allowed values) and behavior when a disallowed extension is requested.\n4. Required, permitted, or forbidden key usages / extended key usages.\n5. Expiration/certificate lifetime: whether it is fixed by the signer, configurable by the admin.\n6. Whether or not requests for CA certificates are allowed.";
const D_CSR_REQUEST: &str = "request contains an x509 certificate signing request encoded in a \"CERTIFICATE REQUEST\" PEM block. When serialized as JSON or YAML, the data is additionally base64-encoded.";
const D_CSR_EXPIRATION: &str = "expirationSeconds is the requested duration of validity of the issued certificate. The certificate signer may issue a certificate with a different validity duration so a client must check the delta between the notBefore and and notAfter fields in the issued certificate to determine the actual duration.\n\nThe v1.22+ in-tree implementations of the well-known Kubernetes signers will honor this field as long as the requested duration is not greater than the maximum duration they will honor per the --cluster-signing-duration CLI flag to the Kubernetes controller manager.\n\nCertificate signers may not honor this field for various reasons:\n\n1. Old signer that is unaware of the field (such as the in-tree\nimplementations prior to v1.22)\n2. Signer whose configured maximum is shorter than the requested duration\n3. Signer whose configured minimum is longer than the requested duration\n\nThe minimum valid value for expirationSeconds is 600, i.e. 10 minutes.";
const D_CSR_CONDITIONS: &str = "conditions applied to the request. Known conditions are \"Approved\", \"Denied\", and \"Failed\".";
const D_LEASE_HOLDER: &str = "holderIdentity contains the identity of the holder of a current lease. If Coordinated Leader Election is used, the holder identity must be equal to the elected LeaseCandidate.metadata.name field.";
const D_PC_VALUE: &str = "value represents the integer value of this priority class. This is the actual priority that pods receive when they have the name of this class in their pod spec.";
const D_PC_GLOBAL_DEFAULT: &str = "globalDefault specifies whether this PriorityClass should be considered as the default priority for pods that do not have any priority class. Only one PriorityClass can be marked as `globalDefault`. However, if more than one PriorityClasses exists with their `globalDefault` field set to true, the smallest value of such global default PriorityClasses will be used as the default priority.";
const D_PC_PREEMPTION: &str = "preemptionPolicy is the Policy for preempting pods with lower priority. One of Never, PreemptLowerPriority. Defaults to PreemptLowerPriority if unset.";
