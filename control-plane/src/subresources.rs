//! The scale, binding and eviction subresources.

use http::Response;
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

fn to_scale(obj: &Value) -> Value {
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
        "spec": {"replicas": obj.pointer("/spec/replicas").cloned().unwrap_or(json!(0))},
        "status": {
            "replicas": obj.pointer("/status/replicas").cloned().unwrap_or(json!(0)),
            "selector": selector_string(obj.pointer("/spec/selector").unwrap_or(&Value::Null)),
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
    let current = api.get(res, ns, name).await?;
    let obj = current.json()?;
    let scale = to_scale(&obj);
    let new_scale = match verb {
        "get" => return Ok(json_response(200, &scale)),
        "update" => crate::server::decode_body(content_type, body.unwrap_or_default())?,
        "patch" => {
            let pt = PatchType::from_content_type(content_type)
                .ok_or_else(|| ApiError::unsupported_media_type(content_type))?;
            let patch: Value = serde_json::from_slice(body.unwrap_or_default())
                .map_err(|e| ApiError::bad_request(format!("invalid patch: {e}")))?;
            let scale_res = resources::Resource { kind: "Scale", ..*res };
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
    let patch = json!({"spec": {"replicas": replicas}});
    let mut warnings = Vec::new();
    let r = api.patch(res, ns, name, PatchType::Merge, &patch, false, "Ignore", &mut warnings, false).await?;
    Ok(json_response(200, &to_scale(&r.json()?)))
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
        let current = api.get(pods, ns, name).await?;
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

/// POST pods/<name>/eviction: deletes the pod with the eviction's delete options (no
/// PodDisruptionBudgets are served, so nothing blocks an eviction).
pub async fn evict(api: &Api, ns: Option<&str>, name: &str, body: Value) -> Result<Response<Body>, ApiError> {
    let pods = resources::find("", "v1", "pods").ok_or_else(|| ApiError::internal("no pods"))?;
    let opts = DeleteOptions {
        grace_period_seconds: body.pointer("/deleteOptions/gracePeriodSeconds").and_then(|g| g.as_i64()),
        precondition_uid: body.pointer("/deleteOptions/preconditions/uid").and_then(|g| g.as_str()).map(str::to_string),
        precondition_rv: body.pointer("/deleteOptions/preconditions/resourceVersion").and_then(|g| g.as_str()).map(str::to_string),
        ..Default::default()
    };
    api.delete(pods, ns, name, &opts).await?;
    Ok(json_response(201, &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selector_strings() {
        assert_eq!(selector_string(&json!({"matchLabels": {"app": "web", "tier": "fe"}})), "app=web,tier=fe");
        assert_eq!(
            selector_string(&json!({"matchExpressions": [{"key": "a", "operator": "In", "values": ["x", "y"]}, {"key": "b", "operator": "DoesNotExist"}]})),
            "a in (x,y),!b"
        );
    }
}
