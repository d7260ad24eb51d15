//! certificates.k8s.io/v1 CertificateSigningRequests as upstream serves them: the requester's
//! identity recorded in the spec at create, the spec immutable, the Approved/Denied conditions
//! written only through `/approval` by users allowed to `approve` for the signer, the
//! certificate only through `/status` by users allowed to `sign` for it (upstream's
//! CertificateApproval, CertificateSigning and CertificateSubjectRestriction admission), and
//! upstream's validation. The loops that act on them: controllers/csrapproving (node client
//! certificates after a SubjectAccessReview) and controllers/csrsigning (the cluster CA).

pub mod request;

use base64::Engine as _;
use serde_json::{json, Value};

use crate::api::Endpoint;
use crate::auth::Attributes;
use crate::error::ApiError;
use crate::resources::Resource;
use crate::validation::{self, FieldError};

pub const GROUP: &str = "certificates.k8s.io";
pub const APPROVED: &str = "Approved";
pub const DENIED: &str = "Denied";
pub const FAILED: &str = "Failed";

pub fn is_csr(res: &Resource) -> bool {
    res.group == GROUP && res.plural == "certificatesigningrequests" && res.custom.is_none()
}

/// `spec.request` decoded (the JSON carries base64 of the PEM bytes).
pub fn request_bytes(obj: &Value) -> Option<Vec<u8>> {
    let b64 = obj.pointer("/spec/request")?.as_str()?;
    base64::engine::general_purpose::STANDARD.decode(b64).ok()
}

pub fn signer_name(obj: &Value) -> &str {
    obj.pointer("/spec/signerName").and_then(Value::as_str).unwrap_or("")
}

fn conditions(obj: &Value) -> Vec<Value> {
    obj.pointer("/status/conditions").and_then(Value::as_array).cloned().unwrap_or_default()
}

/// Whether a condition of `kind` is there with status True.
pub fn has_condition(obj: &Value, kind: &str) -> bool {
    conditions(obj).iter().any(|c| c["type"] == kind && c["status"] == "True")
}

fn certificate(obj: &Value) -> &str {
    obj.pointer("/status/certificate").and_then(Value::as_str).unwrap_or("")
}

/// At create: the requester's identity in spec.username/uid/groups/extra, whatever the client
/// wrote there (upstream's csrStrategy.PrepareForCreate). The server's own writes keep theirs.
pub fn prepare_create(obj: &mut Value) {
    let Some(user) = crate::rbac::escalation::requesting_user() else { return };
    if let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) {
        spec.insert("username".into(), json!(user.name));
        spec.insert("groups".into(), json!(user.groups));
        spec.remove("uid");
        spec.remove("extra");
    }
}

/// Before an update is validated: the main resource never changes the spec; conditions get
/// their timestamps (upstream's populateConditionTimestamps).
pub fn prepare_update(endpoint: Endpoint, old: &Value, new: &mut Value, now: &str) {
    if endpoint == Endpoint::Main {
        if let (Some(spec), Some(n)) = (old.get("spec"), new.as_object_mut()) {
            n.insert("spec".into(), spec.clone());
        }
        return;
    }
    let before = conditions(old);
    let Some(list) = new.pointer_mut("/status/conditions").and_then(Value::as_array_mut) else { return };
    for c in list.iter_mut() {
        let Some(m) = c.as_object_mut() else { continue };
        if m.get("lastUpdateTime").is_none_or(Value::is_null) {
            m.insert("lastUpdateTime".into(), json!(now));
        }
        if m.get("lastTransitionTime").is_none_or(Value::is_null) {
            let same = before.iter().find(|o| o["type"] == m["type"] && o["status"] == m["status"]);
            let t = same.and_then(|o| o.get("lastTransitionTime")).filter(|t| !t.is_null()).cloned().unwrap_or_else(|| json!(now));
            m.insert("lastTransitionTime".into(), t);
        }
    }
}

fn validate_signer_name(name: &str, errs: &mut Vec<FieldError>) {
    const FIELD: &str = "spec.signerName";
    if name.is_empty() {
        errs.push(FieldError::required(FIELD, ""));
        return;
    }
    let form = "should be a domain with at least two segments separated by dots and a path, e.g. example.com/signer-name";
    let Some((domain, path)) = name.split_once('/') else {
        errs.push(FieldError::invalid(FIELD, json!(name), form));
        return;
    };
    if path.is_empty() || !domain.contains('.') || !validation::dns1123_subdomain(domain).is_empty() {
        errs.push(FieldError::invalid(FIELD, json!(name), form));
        return;
    }
    if path.len() > 571 || path.split('/').any(|seg| !validation::qualified_name(seg).is_empty() && seg != "*") {
        errs.push(FieldError::invalid(FIELD, json!(name), "validating path: each segment must be a qualified name"));
    }
}

/// Upstream's validation of a new CertificateSigningRequest (spec; status is cleared at create).
pub fn validate(obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    match obj.pointer("/spec/request").and_then(Value::as_str) {
        None | Some("") => errs.push(FieldError::required("spec.request", "")),
        Some(b64) => {
            let parsed = base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|_| "PEM block type must be CERTIFICATE REQUEST".to_string())
                .and_then(|bytes| request::parse(&bytes));
            if let Err(why) = parsed {
                errs.push(FieldError::invalid("spec.request", json!("<certificate request>"), why));
            }
        }
    }
    validate_signer_name(signer_name(obj), &mut errs);
    match obj.pointer("/spec/usages").and_then(Value::as_array) {
        None => errs.push(FieldError::required("spec.usages", "usages must be provided")),
        Some(list) if list.is_empty() => errs.push(FieldError::required("spec.usages", "usages must be provided")),
        Some(list) => {
            let mut seen = Vec::new();
            for (i, u) in list.iter().enumerate() {
                let s = u.as_str().unwrap_or("");
                if !request::USAGES.contains(&s) {
                    errs.push(FieldError::not_supported(format!("spec.usages[{i}]"), u.clone(), request::USAGES));
                } else if seen.contains(&s) {
                    errs.push(FieldError::duplicate(format!("spec.usages[{i}]"), u.clone()));
                }
                seen.push(s);
            }
        }
    }
    if let Some(secs) = obj.pointer("/spec/expirationSeconds").and_then(Value::as_i64) {
        if secs < 600 {
            errs.push(FieldError::invalid("spec.expirationSeconds", json!(secs), "may not specify a duration less than 600 seconds (10 minutes)"));
        }
    }
    validate_conditions(obj, &mut errs);
    errs
}

fn validate_conditions(obj: &Value, errs: &mut Vec<FieldError>) {
    let list = conditions(obj);
    let mut seen = Vec::new();
    for (i, c) in list.iter().enumerate() {
        let field = format!("status.conditions[{i}]");
        let kind = c["type"].as_str().unwrap_or("");
        if kind.is_empty() {
            errs.push(FieldError::required(format!("{field}.type"), ""));
        }
        let status = c["status"].as_str().unwrap_or("");
        let known = [APPROVED, DENIED, FAILED].contains(&kind);
        if status.is_empty() {
            errs.push(FieldError::required(format!("{field}.status"), ""));
        } else if known && status != "True" {
            errs.push(FieldError::not_supported(format!("{field}.status"), json!(status), &["True"]));
        } else if !["True", "False", "Unknown"].contains(&status) {
            errs.push(FieldError::not_supported(format!("{field}.status"), json!(status), &["False", "True", "Unknown"]));
        }
        if known && seen.contains(&kind) {
            errs.push(FieldError::duplicate(format!("{field}.type"), json!(kind)));
        }
        seen.push(kind);
    }
    if seen.contains(&APPROVED) && seen.contains(&DENIED) {
        errs.push(FieldError::invalid("status.conditions", json!(list), "Approved and Denied conditions are mutually exclusive"));
    }
}

/// Upstream's rules between the old and the new object, per endpoint.
pub fn validate_update(endpoint: Endpoint, old: &Value, new: &Value) -> Vec<FieldError> {
    // the conditions themselves are checked by validate, which every update runs too
    let mut errs = Vec::new();
    if endpoint == Endpoint::Main {
        return errs;
    }
    for kind in [APPROVED, DENIED] {
        let (was, is) = (has_condition(old, kind), has_condition(new, kind));
        if was && !is {
            errs.push(FieldError::forbidden("status.conditions", format!("updates may not remove a condition of type {kind:?}")));
        }
        if endpoint == Endpoint::Status && !was && is {
            errs.push(FieldError::forbidden("status.conditions", format!("updates may not add a condition of type {kind:?}")));
        }
    }
    if endpoint == Endpoint::Status {
        let (was, is) = (certificate(old), certificate(new));
        if !was.is_empty() && was != is {
            errs.push(FieldError::forbidden("status.certificate", "updates may not modify existing certificate"));
        } else if !is.is_empty() && was.is_empty() {
            if !has_condition(new, APPROVED) {
                errs.push(FieldError::forbidden("status.certificate", "certificate may only be set if the request is approved"));
            } else if has_condition(new, FAILED) {
                errs.push(FieldError::forbidden("status.certificate", "certificate may not be set if the request failed"));
            } else {
                let pem = base64::engine::general_purpose::STANDARD.decode(is).unwrap_or_default();
                use rustls::pki_types::pem::PemObject as _;
                let certs: Vec<_> = rustls::pki_types::CertificateDer::pem_slice_iter(&pem).collect();
                if certs.is_empty() || certs.iter().any(Result::is_err) {
                    errs.push(FieldError::invalid("status.certificate", json!("<certificate>"), "must contain at least one CERTIFICATE PEM block"));
                }
            }
        }
    }
    errs
}

fn forbidden(new: &Value, why: String) -> ApiError {
    let name = new.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
    ApiError::forbidden("certificatesigningrequests.certificates.k8s.io", name, why)
}

/// Whether the requester may `verb` for the signer: on `signers` named by the signer or by its
/// domain's wildcard (`example.com/*`), as upstream's admission asks.
async fn may_for_signer(verb: &str, signer: &str) -> bool {
    let exact = Attributes { verb, group: GROUP, resource: "signers", subresource: "", namespace: "", name: signer };
    if crate::rbac::escalation::requester_may(&exact).await {
        return true;
    }
    let Some((domain, _)) = signer.split_once('/') else { return false };
    let wildcard = format!("{domain}/*");
    crate::rbac::escalation::requester_may(&Attributes { name: &wildcard, ..exact }).await
}

/// CertificateSubjectRestriction: nobody gets a `system:masters` client certificate through
/// the API.
pub fn admit_create(obj: &Value) -> Result<(), ApiError> {
    if signer_name(obj) != request::APISERVER_CLIENT {
        return Ok(());
    }
    let Some(req) = request_bytes(obj).and_then(|b| request::parse(&b).ok()) else { return Ok(()) };
    if req.organizations.iter().any(|o| o == "system:masters") {
        return Err(forbidden(obj, format!("use of {} signer with system:masters group is not allowed", request::APISERVER_CLIENT)));
    }
    Ok(())
}

/// CertificateApproval and CertificateSigning: approving or denying needs `approve` for the
/// signer, setting the certificate needs `sign` for it.
pub async fn admit_update(endpoint: Endpoint, old: &Value, new: &Value) -> Result<(), ApiError> {
    let signer = signer_name(new);
    let verb = match endpoint {
        Endpoint::Approval if conditions(old) != conditions(new) => "approve",
        Endpoint::Status if certificate(old) != certificate(new) => "sign",
        _ => return Ok(()),
    };
    if may_for_signer(verb, signer).await {
        return Ok(());
    }
    Err(forbidden(new, format!("user not permitted to {verb} requests with signerName {signer:?}")))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn csr(signer: &str, usages: Value) -> Value {
        let pem = request::tests::make_request("system:node:n1", &["system:nodes"], &[]);
        json!({
            "metadata": {"name": "c1"},
            "spec": {
                "request": base64::engine::general_purpose::STANDARD.encode(pem),
                "signerName": signer,
                "usages": usages,
            }
        })
    }

    fn fields(errs: &[FieldError]) -> Vec<String> {
        errs.iter().map(|e| e.field.clone()).collect()
    }

    #[test]
    fn a_good_request_passes_and_bad_ones_name_their_field() {
        assert_eq!(validate(&csr(request::KUBELET_CLIENT, json!(["digital signature", "client auth"]))), vec![]);
        assert_eq!(fields(&validate(&csr("", json!(["client auth"])))), ["spec.signerName"]);
        assert_eq!(fields(&validate(&csr("no-domain", json!(["client auth"])))), ["spec.signerName"]);
        assert_eq!(fields(&validate(&csr("example.com/", json!(["client auth"])))), ["spec.signerName"]);
        assert_eq!(fields(&validate(&csr(request::KUBELET_CLIENT, json!([])))), ["spec.usages"]);
        assert_eq!(fields(&validate(&csr(request::KUBELET_CLIENT, json!(["client auth", "flying"])))), ["spec.usages[1]"]);
        assert_eq!(fields(&validate(&csr(request::KUBELET_CLIENT, json!(["client auth", "client auth"])))), ["spec.usages[1]"]);
        let mut short = csr(request::KUBELET_CLIENT, json!(["client auth"]));
        short["spec"]["expirationSeconds"] = json!(599);
        assert_eq!(fields(&validate(&short)), ["spec.expirationSeconds"]);
        let mut garbage = csr(request::KUBELET_CLIENT, json!(["client auth"]));
        garbage["spec"]["request"] = json!(base64::engine::general_purpose::STANDARD.encode("hello"));
        let errs = validate(&garbage);
        assert_eq!(fields(&errs), ["spec.request"]);
        assert_eq!(errs[0].detail, "PEM block type must be CERTIFICATE REQUEST");
    }

    fn with_conditions(mut obj: Value, conds: &[(&str, &str)]) -> Value {
        obj["status"]["conditions"] = conds.iter().map(|(t, s)| json!({"type": t, "status": s})).collect();
        obj
    }

    #[test]
    fn approval_and_status_each_change_only_their_part() {
        let base = csr(request::KUBELET_CLIENT, json!(["client auth"]));
        let approved = with_conditions(base.clone(), &[(APPROVED, "True")]);
        assert!(validate_update(Endpoint::Approval, &base, &approved).is_empty());
        // through /status an approval cannot be added, nor removed through /approval
        assert_eq!(validate_update(Endpoint::Status, &base, &approved)[0].detail, "updates may not add a condition of type \"Approved\"");
        assert_eq!(validate_update(Endpoint::Approval, &approved, &base)[0].detail, "updates may not remove a condition of type \"Approved\"");
        let both = with_conditions(base.clone(), &[(APPROVED, "True"), (DENIED, "True")]);
        assert!(validate(&both).iter().any(|e| e.detail == "Approved and Denied conditions are mutually exclusive"));
        let falsy = with_conditions(base.clone(), &[(APPROVED, "False")]);
        assert_eq!(fields(&validate(&falsy)), ["status.conditions[0].status"]);
        // a certificate only once approved, and never changed
        let mut signed = base.clone();
        signed["status"]["certificate"] = json!("x");
        assert_eq!(validate_update(Endpoint::Status, &base, &signed)[0].detail, "certificate may only be set if the request is approved");
        let mut bad_pem = approved.clone();
        bad_pem["status"]["certificate"] = json!(base64::engine::general_purpose::STANDARD.encode("not a cert"));
        assert_eq!(fields(&validate_update(Endpoint::Status, &approved, &bad_pem)), ["status.certificate"]);
        let mut changed = bad_pem.clone();
        changed["status"]["certificate"] = json!("other");
        assert_eq!(validate_update(Endpoint::Status, &bad_pem, &changed)[0].detail, "updates may not modify existing certificate");
    }

    #[test]
    fn updates_keep_the_spec_and_stamp_conditions() {
        let old = csr(request::KUBELET_CLIENT, json!(["client auth"]));
        let mut new = old.clone();
        new["spec"]["signerName"] = json!("example.com/other");
        prepare_update(Endpoint::Main, &old, &mut new, "T1");
        assert_eq!(new["spec"], old["spec"]);
        let mut approved = with_conditions(old.clone(), &[(APPROVED, "True")]);
        prepare_update(Endpoint::Approval, &old, &mut approved, "T2");
        assert_eq!(approved["status"]["conditions"][0]["lastUpdateTime"], "T2");
        assert_eq!(approved["status"]["conditions"][0]["lastTransitionTime"], "T2");
        let mut again = with_conditions(old.clone(), &[(APPROVED, "True")]);
        prepare_update(Endpoint::Approval, &approved, &mut again, "T3");
        assert_eq!(again["status"]["conditions"][0]["lastTransitionTime"], "T2", "no transition: the old time stays");
    }

    #[test]
    fn no_system_masters_through_the_client_signer() {
        let pem = request::tests::make_request("mallory", &["system:masters"], &[]);
        let obj = json!({"metadata": {"name": "m"}, "spec": {"request": base64::engine::general_purpose::STANDARD.encode(pem), "signerName": request::APISERVER_CLIENT, "usages": ["client auth"]}});
        let e = admit_create(&obj).unwrap_err();
        assert_eq!(e.code, 403);
        assert!(e.message.contains("use of kubernetes.io/kube-apiserver-client signer with system:masters group is not allowed"), "{}", e.message);
    }
}
