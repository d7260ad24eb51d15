//! The scale, binding and eviction subresources.

use http::Response;
use base64::Engine as _;
use serde_json::{json, Value};

use crate::api::{apply_patch, Api, DeleteOptions, PatchType};
use crate::error::ApiError;
use crate::resources::{self, Resource};
use crate::server::{json_response, Body};

fn selector_string(sel: &Value) -> String {
    let mut parts: Vec<String> = Vec::new();
    if let Some(m) = sel.get("matchLabels").and_then(|m| m.as_object()) {
        for (k, v) in m {
            parts.push(format!("{k}={}", v.as_str().unwrap_or("")));
        }
    }
    for e in sel.get("matchExpressions").and_then(|m| m.as_array()).into_iter().flatten() {
        let key = e.get("key").and_then(|k| k.as_str()).unwrap_or("");
        let values: Vec<&str> = e.get("values").and_then(|v| v.as_array()).into_iter().flatten().filter_map(|v| v.as_str()).collect();
        match e.get("operator").and_then(|o| o.as_str()).unwrap_or("") {
            "In" => parts.push(format!("{key} in ({})", values.join(","))),
            "NotIn" => parts.push(format!("{key} notin ({})", values.join(","))),
            "Exists" => parts.push(key.to_string()),
            "DoesNotExist" => parts.push(format!("!{key}")),
            _ => {}
        }
    }
    parts.join(",")
}

/// Where a resource keeps its scale: the workloads' fixed fields, or a CRD's scale paths
/// (JSON pointers of spec replicas, status replicas and the label selector string).
fn scale_paths(res: &Resource) -> (String, String, Option<String>) {
    match res.custom.and_then(|c| c.scale.as_ref()) {
        Some(p) => (
            crate::crd::pointer_of(&p.spec_replicas),
            crate::crd::pointer_of(&p.status_replicas),
            p.label_selector.as_deref().map(crate::crd::pointer_of),
        ),
        None => ("/spec/replicas".into(), "/status/replicas".into(), None),
    }
}

/// A merge patch setting the value at a JSON pointer.
fn patch_at(pointer: &str, value: Value) -> Value {
    pointer.rsplit('/').filter(|s| !s.is_empty()).fold(value, |inner, seg| {
        let key = seg.replace("~1", "/").replace("~0", "~");
        json!({ key: inner })
    })
}

fn to_scale(res: &Resource, obj: &Value) -> Value {
    let (spec_replicas, status_replicas, selector) = scale_paths(res);
    let selector = match selector {
        Some(p) => obj.pointer(&p).and_then(Value::as_str).unwrap_or("").to_string(),
        None if res.custom.is_some() => String::new(),
        None => selector_string(obj.pointer("/spec/selector").unwrap_or(&Value::Null)),
    };
    let meta = obj.get("metadata").cloned().unwrap_or(json!({}));
    let mut m = serde_json::Map::new();
    for k in ["name", "namespace", "uid", "resourceVersion", "creationTimestamp"] {
        if let Some(v) = meta.get(k) {
            m.insert(k.into(), v.clone());
        }
    }
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": m,
        "spec": {"replicas": obj.pointer(&spec_replicas).cloned().unwrap_or(json!(0))},
        "status": {
            "replicas": obj.pointer(&status_replicas).cloned().unwrap_or(json!(0)),
            "selector": selector,
        },
    })
}

/// GET/PUT/PATCH of `<workload>/scale` as autoscaling/v1 Scale.
pub async fn scale(
    api: &Api,
    res: &'static Resource,
    ns: Option<&str>,
    name: &str,
    verb: &str,
    content_type: &str,
    body: Option<&[u8]>,
) -> Result<Response<Body>, ApiError> {
    let current = api.get_for_write(res, ns, name).await?;
    let obj = current.json()?;
    let scale = to_scale(res, &obj);
    let new_scale = match verb {
        "get" => return Ok(json_response(200, &scale)),
        "update" => crate::server::decode_body(content_type, body.unwrap_or_default())?,
        "patch" => {
            let pt = PatchType::from_content_type(content_type)
                .ok_or_else(|| ApiError::unsupported_media_type(content_type))?;
            let patch: Value = serde_json::from_slice(body.unwrap_or_default())
                .map_err(|e| ApiError::bad_request(format!("invalid patch: {e}")))?;
            let scale_res = resources::Resource { kind: "Scale", custom: None, ..*res };
            apply_patch(&scale_res, &scale, if pt == PatchType::Strategic { PatchType::Merge } else { pt }, &patch)?
        }
        other => return Err(ApiError::method_not_allowed(other)),
    };
    if let Some(rv) = new_scale.pointer("/metadata/resourceVersion").and_then(|r| r.as_str()) {
        if !rv.is_empty() && rv != current.mod_rev.to_string() {
            return Err(ApiError::stale(&res.group_resource(), name));
        }
    }
    let replicas = new_scale
        .pointer("/spec/replicas")
        .and_then(|r| r.as_i64())
        .ok_or_else(|| ApiError::invalid("Scale", "autoscaling", name, &[crate::validation::FieldError::required("spec.replicas", "")]))?;
    if replicas < 0 {
        return Err(ApiError::invalid(
            "Scale",
            "autoscaling",
            name,
            &[crate::validation::FieldError::invalid("spec.replicas", json!(replicas), "must be greater than or equal to 0")],
        ));
    }
    let patch = patch_at(&scale_paths(res).0, json!(replicas));
    let mut warnings = Vec::new();
    let r = api.patch(res, ns, name, PatchType::Merge, &patch, crate::api::Endpoint::Main, "Ignore", &mut warnings, false).await?;
    let mut obj = r.json()?;
    crate::crd::objects::served_value(res, &mut obj);
    Ok(json_response(200, &to_scale(res, &obj)))
}

/// POST pods/<name>/binding: sets spec.nodeName once and the PodScheduled condition.
pub async fn bind(api: &Api, ns: Option<&str>, name: &str, body: Value) -> Result<Response<Body>, ApiError> {
    let pods = resources::find("", "v1", "pods").ok_or_else(|| ApiError::internal("no pods"))?;
    let node = body.pointer("/target/name").and_then(|n| n.as_str()).unwrap_or("");
    if node.is_empty() {
        return Err(ApiError::invalid(
            "Binding",
            "",
            name,
            &[crate::validation::FieldError::required("target.name", "")],
        ));
    }
    for _ in 0..8 {
        let current = api.get_for_write(pods, ns, name).await?;
        let mut pod = current.json()?;
        if pod.pointer("/metadata/deletionTimestamp").is_some() {
            return Err(ApiError::conflict("pods", name, "pod is being deleted, cannot be assigned to a host"));
        }
        if let Some(existing) = pod.pointer("/spec/nodeName").and_then(|n| n.as_str()).filter(|n| !n.is_empty()) {
            return Err(ApiError::conflict("pods", name, &format!("pod {name} is already assigned to node \"{existing}\"")));
        }
        pod["spec"]["nodeName"] = json!(node);
        let now = jiff::Timestamp::now().round(jiff::Unit::Second).map(|t| t.to_string()).unwrap_or_default();
        let conds = pod["status"]["conditions"].as_array().cloned().unwrap_or_default();
        let mut conds: Vec<Value> = conds.into_iter().filter(|c| c["type"] != "PodScheduled").collect();
        conds.push(json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": now}));
        pod["status"]["conditions"] = json!(conds);
        if let Some(ann) = body.pointer("/metadata/annotations").and_then(|a| a.as_object()) {
            for (k, v) in ann {
                pod["metadata"]["annotations"][k] = v.clone();
            }
        }
        match api.store.write(crate::store::Op::Update { key: pods.key(ns, name), value: pod, expect: Some(current.mod_rev) }).await {
            Ok(_) => return Ok(json_response(201, &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}))),
            Err(crate::store::StoreError::Conflict { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(ApiError::stale("pods", name))
}

/// What an eviction may do, from the pod and the budgets of its namespace (upstream's
/// pkg/registry/core/pod/storage/eviction.go). Pure.
#[derive(Debug, Clone, PartialEq)]
pub enum EvictionDecision {
    /// Delete the pod without touching a budget.
    Delete,
    /// Take one disruption from the budget `pdb` (its key), then delete the pod.
    Disrupt { pdb: String },
    Refuse(ApiError),
}

fn pod_ready(pod: &Value) -> bool {
    pod.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
}

fn too_many_requests(cause: String) -> ApiError {
    let mut e = ApiError::new(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget.");
    e.details = Some(json!({"causes": [{"reason": "DisruptionBudget", "message": cause}]}));
    e
}

/// Decides an eviction of `pod` given the budgets (`(key, object)`) of its namespace.
pub fn decide_eviction(pod: &Value, budgets: &[(String, Value)]) -> EvictionDecision {
    let phase = pod.pointer("/status/phase").and_then(Value::as_str).unwrap_or("Pending");
    // Terminal or not yet running pods, and pods already going, are not counted by budgets.
    if matches!(phase, "Succeeded" | "Failed" | "Pending") || pod.pointer("/metadata/deletionTimestamp").is_some() {
        return EvictionDecision::Delete;
    }
    let labels: std::collections::BTreeMap<String, String> = pod
        .pointer("/metadata/labels")
        .and_then(|l| serde_json::from_value(l.clone()).ok())
        .unwrap_or_default();
    let matching: Vec<&(String, Value)> = budgets
        .iter()
        .filter(|(_, b)| match b.pointer("/spec/selector") {
            None => true,
            Some(sel) => serde_json::from_value(sel.clone())
                .ok()
                .and_then(|sel| crate::selector::LabelSelector::from_api(&sel).ok())
                .is_some_and(|sel| sel.matches(&labels)),
        })
        .collect();
    let (key, pdb) = match matching.as_slice() {
        [] => return EvictionDecision::Delete,
        [one] => (&one.0, &one.1),
        _ => {
            return EvictionDecision::Refuse(ApiError::new(
                500,
                "InternalError",
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            ))
        }
    };
    let name = pdb.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    let int = |ptr: &str| pdb.pointer(ptr).and_then(Value::as_i64).unwrap_or(0);
    if int("/status/observedGeneration") < int("/metadata/generation") {
        return EvictionDecision::Refuse(too_many_requests(format!("The disruption budget {name} is still being processed by the server.")));
    }
    if !pod_ready(pod) {
        let policy = pdb.pointer("/spec/unhealthyPodEvictionPolicy").and_then(Value::as_str).unwrap_or("IfHealthyBudget");
        if policy == "AlwaysAllow" || int("/status/currentHealthy") >= int("/status/desiredHealthy") {
            return EvictionDecision::Delete;
        }
    }
    match int("/status/disruptionsAllowed") {
        n if n < 0 => EvictionDecision::Refuse(ApiError::new(403, "Forbidden", "pdb disruptions allowed is negative")),
        0 => EvictionDecision::Refuse(too_many_requests(format!(
            "The disruption budget {name} needs {} healthy pods and has {} currently",
            int("/status/desiredHealthy"),
            int("/status/currentHealthy")
        ))),
        _ => EvictionDecision::Disrupt { pdb: key.clone() },
    }
}

/// POST pods/<name>/eviction: grants the eviction when the pod's PodDisruptionBudget allows a
/// disruption (taking one from its status and recording the pod in `disruptedPods`, guarded
/// by the budget's revision), refuses it with upstream's 429 otherwise; a granted eviction
/// sets the pod's DisruptionTarget condition, then deletes it with the eviction's options.
pub async fn evict(api: &Api, ns: Option<&str>, name: &str, body: Value) -> Result<Response<Body>, ApiError> {
    let pods = resources::find("", "v1", "pods").ok_or_else(|| ApiError::internal("no pods"))?;
    let pdbs = resources::find("policy", "v1", "poddisruptionbudgets").ok_or_else(|| ApiError::internal("no pdbs"))?;
    let opts = DeleteOptions {
        grace_period_seconds: body.pointer("/deleteOptions/gracePeriodSeconds").and_then(|g| g.as_i64()),
        precondition_uid: body.pointer("/deleteOptions/preconditions/uid").and_then(|g| g.as_str()).map(str::to_string),
        precondition_rv: body.pointer("/deleteOptions/preconditions/resourceVersion").and_then(|g| g.as_str()).map(str::to_string),
        ..Default::default()
    };
    let now = jiff::Timestamp::now().round(jiff::Unit::Second).map(|t| t.to_string()).unwrap_or_default();
    let mut granted = false;
    for _ in 0..8 {
        let current = api.get_for_write(pods, ns, name).await?;
        let pod = current.json()?;
        let listed = api.store.list(&pdbs.prefix(ns)).await?;
        let budgets: Vec<(String, Value)> =
            listed.records.iter().filter_map(|r| Some((r.key.to_string(), r.json().ok()?))).collect();
        match decide_eviction(&pod, &budgets) {
            EvictionDecision::Refuse(e) => return Err(e),
            EvictionDecision::Delete => {
                granted = true;
                break;
            }
            EvictionDecision::Disrupt { pdb } => {
                let Some(rec) = listed.records.iter().find(|r| *r.key == *pdb) else { continue };
                let mut b = rec.json()?;
                let allowed = b.pointer("/status/disruptionsAllowed").and_then(Value::as_i64).unwrap_or(0);
                b["status"]["disruptionsAllowed"] = json!(allowed - 1);
                if !b["status"]["disruptedPods"].is_object() {
                    b["status"]["disruptedPods"] = json!({});
                }
                b["status"]["disruptedPods"][name] = json!(now);
                let op = crate::store::Op::Update { key: pdb.clone(), value: b, expect: Some(rec.mod_rev) };
                match api.store.write(op).await {
                    Ok(_) => {
                        granted = true;
                        break;
                    }
                    Err(crate::store::StoreError::Conflict { .. }) => continue,
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
    if !granted {
        return Err(too_many_requests("the disruption budget changed too often while evicting".into()));
    }
    // The DisruptionTarget condition (upstream: EvictionByEvictionAPI), best effort: the pod may
    // be going already.
    for _ in 0..4 {
        let Ok(current) = api.get(pods, ns, name).await else { break };
        let mut pod = current.json()?;
        if pod.pointer("/metadata/deletionTimestamp").is_some() {
            break;
        }
        let conds = pod["status"]["conditions"].as_array().cloned().unwrap_or_default();
        let mut conds: Vec<Value> = conds.into_iter().filter(|c| c["type"] != "DisruptionTarget").collect();
        conds.push(json!({"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
                          "message": "Eviction API: evicting", "lastProbeTime": null, "lastTransitionTime": now}));
        pod["status"]["conditions"] = json!(conds);
        match api.store.write(crate::store::Op::Update { key: pods.key(ns, name), value: pod, expect: Some(current.mod_rev) }).await {
            Ok(_) => break,
            Err(crate::store::StoreError::Conflict { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    api.delete(pods, ns, name, &opts).await?;
    Ok(json_response(201, &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})))
}

/// `serviceaccounts/<name>/token` (the TokenRequest API): a token signed for the service
/// account, for the requested audiences (default: the API server's) and time (default 1 h, at
/// least 10 min), bound when asked to a Pod (with its Node), a Secret or a Node that must exist
/// with the uid given.
pub async fn create_token(
    api: &Api,
    key: &crate::sa_token::SigningKey,
    api_audiences: &[String],
    ns: &str,
    name: &str,
    body: Value,
) -> Result<Response<Body>, ApiError> {
    use crate::sa_token::{self as sat, Claims, KubernetesClaim, Ref};
    use crate::validation::FieldError;
    let find = |g: &str, v: &str, r: &str| resources::find(g, v, r).ok_or_else(|| ApiError::internal(format!("no {r} resource")));
    let (sas, pods, secrets, nodes) = (find("", "v1", "serviceaccounts")?, find("", "v1", "pods")?, find("", "v1", "secrets")?, find("", "v1", "nodes")?);
    let sa = api.get(sas, Some(ns), name).await?.json()?;
    let spec = body.get("spec").cloned().unwrap_or_else(|| json!({}));
    let expiration = spec.get("expirationSeconds").and_then(Value::as_i64).unwrap_or(sat::DEFAULT_EXPIRATION_SECONDS);
    let mut errs = Vec::new();
    if expiration < sat::MIN_EXPIRATION_SECONDS {
        errs.push(FieldError::invalid("spec.expirationSeconds", expiration, "may not specify a duration less than 10 minutes"));
    }
    if expiration > 1 << 32 {
        errs.push(FieldError::invalid("spec.expirationSeconds", expiration, "may not specify a duration larger than 2^32 seconds"));
    }
    let mut audiences: Vec<String> =
        spec.get("audiences").and_then(Value::as_array).into_iter().flatten().filter_map(|a| a.as_str().map(str::to_string)).collect();
    if audiences.is_empty() {
        audiences = api_audiences.to_vec();
    }
    let bound = spec.get("boundObjectRef").filter(|b| !b.is_null());
    let mut claim = KubernetesClaim {
        namespace: ns.to_string(),
        serviceaccount: Ref { name: name.to_string(), uid: sa.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or_default().to_string() },
        ..KubernetesClaim::default()
    };
    if let Some(b) = bound {
        let kind = b.get("kind").and_then(Value::as_str).unwrap_or_default();
        let api_version = b.get("apiVersion").and_then(Value::as_str).unwrap_or("v1");
        let bname = b.get("name").and_then(Value::as_str).unwrap_or_default();
        let buid = b.get("uid").and_then(Value::as_str).unwrap_or_default();
        if api_version != "v1" || !matches!(kind, "Pod" | "Secret" | "Node") {
            errs.push(FieldError::not_supported("spec.boundObjectRef.kind", kind, &["Pod", "Node", "Secret"]));
        }
        if !errs.is_empty() {
            return Err(ApiError::invalid("TokenRequest", "authentication.k8s.io", name, &errs));
        }
        let res = match kind {
            "Pod" => pods,
            "Secret" => secrets,
            _ => nodes,
        };
        let obj = api.get(res, if kind == "Node" { None } else { Some(ns) }, bname).await?.json()?;
        let uid = obj.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or_default().to_string();
        if !buid.is_empty() && buid != uid {
            return Err(ApiError::conflict(
                res.plural,
                bname,
                &format!(
                    "the UID in the bound object reference ({buid}) does not match the UID in record. The object might have been deleted and then recreated"
                ),
            ));
        }
        let r = Ref { name: bname.to_string(), uid };
        match kind {
            "Pod" => {
                let pod_sa = obj.pointer("/spec/serviceAccountName").and_then(Value::as_str).unwrap_or("default");
                if pod_sa != name {
                    return Err(ApiError::bad_request(format!(
                        "cannot bind token for serviceaccount {name:?} to pod running with different serviceaccount name."
                    )));
                }
                if let Some(node) = obj.pointer("/spec/nodeName").and_then(Value::as_str).filter(|n| !n.is_empty()) {
                    let node_uid = match api.get(nodes, None, node).await {
                        Ok(n) => n.json()?.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or_default().to_string(),
                        Err(_) => String::new(),
                    };
                    claim.node = Some(Ref { name: node.to_string(), uid: node_uid });
                }
                claim.pod = Some(r);
            }
            "Secret" => claim.secret = Some(r),
            _ => claim.node = Some(r),
        }
    }
    if !errs.is_empty() {
        return Err(ApiError::invalid("TokenRequest", "authentication.k8s.io", name, &errs));
    }
    let now = crate::sa_token::now();
    let claims = Claims {
        iss: key.issuer.clone(),
        sub: format!("system:serviceaccount:{ns}:{name}"),
        aud: audiences.clone(),
        exp: now + expiration,
        iat: now,
        nbf: now,
        jti: sat::new_jti(),
        kubernetes: claim,
    };
    let token = key.sign(&claims).map_err(|e| ApiError::internal(e.to_string()))?;
    let expires = jiff::Timestamp::from_second(claims.exp).map(|t| t.to_string()).unwrap_or_default();
    let created = jiff::Timestamp::from_second(now).map(|t| t.to_string()).unwrap_or_default();
    let mut out_spec = spec.clone();
    out_spec["audiences"] = json!(audiences);
    out_spec["expirationSeconds"] = json!(expiration);
    let out = json!({
        "kind": "TokenRequest",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"name": name, "namespace": ns, "creationTimestamp": created},
        "spec": out_spec,
        "status": {"token": token, "expirationTimestamp": expires},
    });
    Ok(json_response(201, &out))
}

/// The user a service account token names, once its signature, time and audience hold and the
/// service account and the object it is bound to still exist with the uids it names
/// (upstream's ServiceAccount token authenticator). None for anything else.
pub async fn authenticate_service_account(
    api: &Api,
    key: &crate::sa_token::SigningKey,
    audiences: &[String],
    token: &str,
) -> Option<(crate::auth::User, crate::sa_token::Claims)> {
    if token.matches('.').count() != 2 {
        return None;
    }
    let claims = match key.verify(token, crate::sa_token::now(), audiences) {
        Ok(c) => c,
        Err(e) => {
            if let Ok(legacy) = key.verify_legacy(token) {
                return authenticate_legacy(api, token, legacy).await;
            }
            tracing::debug!(error = %e, "service account token refused");
            return None;
        }
    };
    let k = &claims.kubernetes;
    let alive = |v: &Value, uid: &str| {
        v.pointer("/metadata/uid").and_then(Value::as_str) == Some(uid) && v.pointer("/metadata/deletionTimestamp").is_none()
    };
    let get = |r: &str, ns: Option<&str>, name: &str| {
        let res = resources::find("", "v1", r);
        let (name, ns) = (name.to_string(), ns.map(str::to_string));
        async move { api.get(res?, ns.as_deref(), &name).await.ok()?.json().ok() }
    };
    let sa = get("serviceaccounts", Some(&k.namespace), &k.serviceaccount.name).await?;
    if !alive(&sa, &k.serviceaccount.uid) {
        return None;
    }
    if let Some(p) = &k.pod {
        let pod = get("pods", Some(&k.namespace), &p.name).await?;
        if pod.pointer("/metadata/uid").and_then(Value::as_str) != Some(p.uid.as_str()) {
            return None;
        }
    }
    if let Some(s) = &k.secret {
        if !alive(&get("secrets", Some(&k.namespace), &s.name).await?, &s.uid) {
            return None;
        }
    }
    if let (Some(n), None) = (&k.node, &k.pod) {
        if !alive(&get("nodes", None, &n.name).await?, &n.uid) {
            return None;
        }
    }
    Some((crate::auth::User { name: claims.username(), groups: claims.groups() }, claims))
}

/// A legacy token (from a `kubernetes.io/service-account-token` Secret) authenticates while
/// its Secret exists, is not being deleted and still holds this token, and its service account
/// exists with the uid the token names (upstream's legacy validator). It has no audience and
/// no expiry, as upstream's.
async fn authenticate_legacy(
    api: &Api,
    token: &str,
    c: crate::sa_token::LegacyClaims,
) -> Option<(crate::auth::User, crate::sa_token::Claims)> {
    let get = |r: &str, name: &str| {
        let res = resources::find("", "v1", r);
        let (name, ns) = (name.to_string(), c.namespace.clone());
        async move { api.get(res?, Some(&ns), &name).await.ok()?.json().ok() }
    };
    let secret: Value = get("secrets", &c.secret).await?;
    let stored = secret.pointer("/data/token").and_then(Value::as_str)?;
    let stored = base64::engine::general_purpose::STANDARD.decode(stored).ok()?;
    if stored != token.as_bytes() || secret.pointer("/metadata/deletionTimestamp").is_some() {
        return None;
    }
    let sa: Value = get("serviceaccounts", &c.account).await?;
    if sa.pointer("/metadata/uid").and_then(Value::as_str) != Some(c.account_uid.as_str()) || sa.pointer("/metadata/deletionTimestamp").is_some() {
        return None;
    }
    let claims = crate::sa_token::Claims {
        iss: c.iss.clone(),
        sub: c.sub.clone(),
        aud: Vec::new(),
        exp: i64::MAX / 2,
        iat: 0,
        nbf: 0,
        jti: String::new(),
        kubernetes: crate::sa_token::KubernetesClaim {
            namespace: c.namespace.clone(),
            serviceaccount: crate::sa_token::Ref { name: c.account.clone(), uid: c.account_uid.clone() },
            secret: Some(crate::sa_token::Ref {
                name: c.secret.clone(),
                uid: secret.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or("").to_string(),
            }),
            ..Default::default()
        },
    };
    Some((crate::auth::User { name: claims.username(), groups: claims.groups() }, claims))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn running(labels: Value, ready: bool) -> Value {
        json!({"metadata": {"name": "web-1", "labels": labels},
               "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}})
    }

    fn budget(allowed: i64, current: i64, desired: i64) -> (String, Value) {
        ("/policy/poddisruptionbudgets/ns/web".into(), json!({
            "metadata": {"name": "web", "generation": 1},
            "spec": {"selector": {"matchLabels": {"app": "web"}}, "minAvailable": 2},
            "status": {"observedGeneration": 1, "disruptionsAllowed": allowed, "currentHealthy": current, "desiredHealthy": desired},
        }))
    }

    #[test]
    fn evictions_follow_the_budget_as_upstream() {
        let web = running(json!({"app": "web"}), true);
        assert_eq!(decide_eviction(&web, &[]), EvictionDecision::Delete);
        assert_eq!(decide_eviction(&web, &[budget(1, 3, 2)]), EvictionDecision::Disrupt { pdb: "/policy/poddisruptionbudgets/ns/web".into() });
        let EvictionDecision::Refuse(e) = decide_eviction(&web, &[budget(0, 2, 2)]) else { panic!() };
        assert_eq!((e.code, e.reason, e.message.as_str()), (429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget."));
        assert_eq!(e.details.unwrap()["causes"][0]["message"], "The disruption budget web needs 2 healthy pods and has 2 currently");
        // Another app's pod is not covered.
        assert_eq!(decide_eviction(&running(json!({"app": "db"}), true), &[budget(0, 2, 2)]), EvictionDecision::Delete);
        // An unready pod goes while the budget is healthy, without taking a disruption.
        assert_eq!(decide_eviction(&running(json!({"app": "web"}), false), &[budget(0, 2, 2)]), EvictionDecision::Delete);
        assert!(matches!(decide_eviction(&running(json!({"app": "web"}), false), &[budget(0, 1, 2)]), EvictionDecision::Refuse(_)));
        // A budget the controller has not seen yet: 429.
        let (k, mut b) = budget(5, 3, 2);
        b["metadata"]["generation"] = json!(2);
        let EvictionDecision::Refuse(e) = decide_eviction(&web, &[(k.clone(), b.clone())]) else { panic!() };
        assert_eq!(e.code, 429);
        // Two budgets: upstream's 500.
        let EvictionDecision::Refuse(e) = decide_eviction(&web, &[budget(1, 3, 2), budget(1, 3, 2)]) else { panic!() };
        assert_eq!(e.code, 500);
        // Pending and terminal pods are not counted.
        let mut pending = web.clone();
        pending["status"]["phase"] = json!("Pending");
        assert_eq!(decide_eviction(&pending, &[budget(0, 2, 2)]), EvictionDecision::Delete);
    }

    #[test]
    fn selector_strings() {
        assert_eq!(selector_string(&json!({"matchLabels": {"app": "web", "tier": "fe"}})), "app=web,tier=fe");
        assert_eq!(
            selector_string(&json!({"matchExpressions": [{"key": "a", "operator": "In", "values": ["x", "y"]}, {"key": "b", "operator": "DoesNotExist"}]})),
            "a in (x,y),!b"
        );
    }
}

