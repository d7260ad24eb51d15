//! Custom objects on write (decode with pruning and defaults, validation against the version's
//! schema) and on read (the apiVersion of the version asked for; printer columns).

use bytes::Bytes;
use jiff::Timestamp;
use jsonpath_rust::JsonPath;
use serde_json::{json, Map, Value};

use super::{schema, Custom};
use crate::error::ApiError;
use crate::resources::Resource;
use crate::validation::{self, FieldError};

fn api_version(group: &str, version: &str) -> String {
    format!("{group}/{version}")
}

/// Decodes a custom object written through `res`: metadata reduced to ObjectMeta, fields the
/// schema does not know pruned (refused with fieldValidation=Strict, warned with Warn),
/// defaults applied; stored with the storage version's apiVersion.
pub fn decode(res: &Resource, c: &Custom, mut obj: Value, field_validation: &str, warnings: &mut Vec<String>) -> Result<Value, ApiError> {
    let Some(m) = obj.as_object_mut() else {
        return Err(ApiError::bad_request("the body of the request must be a JSON object"));
    };
    let mut dropped = Vec::new();
    if let Some(meta) = m.get("metadata").cloned() {
        let typed: Result<k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta, _> = serde_json::from_value(meta.clone());
        match typed {
            Ok(t) => {
                let normalized = serde_json::to_value(t).map_err(ApiError::internal)?;
                if let (Value::Object(before), Value::Object(after)) = (&meta, &normalized) {
                    dropped.extend(before.keys().filter(|k| !after.contains_key(*k) && !before[*k].is_null()).map(|k| format!("metadata.{k}")));
                }
                m.insert("metadata".into(), normalized);
            }
            Err(e) => {
                return Err(ApiError::bad_request(format!(
                    "{} in version \"{}\" cannot be handled as a {}: {e}",
                    res.kind,
                    res.api_version(),
                    res.kind
                )))
            }
        }
    }
    schema::prune(&c.schema, &mut obj, "", true, &mut dropped);
    if !dropped.is_empty() && field_validation != "Ignore" {
        dropped.sort();
        if field_validation == "Strict" {
            let list: Vec<String> = dropped.iter().map(|f| format!("unknown field \"{f}\"")).collect();
            return Err(ApiError::bad_request(format!("strict decoding error: {}", list.join(", "))));
        }
        warnings.extend(dropped.into_iter().map(|f| format!("unknown field \"{f}\"")));
    }
    schema::apply_defaults(&c.schema, &mut obj);
    if let Some(m) = obj.as_object_mut() {
        m.insert("apiVersion".into(), json!(api_version(res.group, c.storage_version)));
        m.insert("kind".into(), json!(res.kind));
    }
    Ok(obj)
}

/// Validation of a custom object: generic object metadata (DNS subdomain names) and the schema
/// of the version it was written through.
pub fn validate(res: &Resource, c: &Custom, obj: &Value) -> Vec<FieldError> {
    let meta = obj.get("metadata").cloned().unwrap_or(Value::Null);
    let mut errs = validation::validate_generic_object_meta(&meta, res.namespaced, validation::dns1123_subdomain);
    let mut body = obj.clone();
    if let Some(m) = body.as_object_mut() {
        m.remove("metadata");
        m.remove("apiVersion");
        m.remove("kind");
    }
    schema::validate(&c.schema, &body, "", &mut errs);
    errs
}

/// The stored bytes as the version `res` serves them: only apiVersion differs between
/// versions (conversion None). Stored objects' keys are sorted, so apiVersion comes first.
pub fn served_bytes(res: &Resource, stored: &Bytes) -> Bytes {
    let Some(c) = res.custom else { return stored.clone() };
    if c.storage_version == res.version {
        return stored.clone();
    }
    let from = format!("{{\"apiVersion\":\"{}\"", api_version(res.group, c.storage_version));
    if stored.starts_with(from.as_bytes()) {
        let mut out = Vec::with_capacity(stored.len() + 8);
        out.extend_from_slice(format!("{{\"apiVersion\":\"{}\"", res.api_version()).as_bytes());
        out.extend_from_slice(&stored[from.len()..]);
        return Bytes::from(out);
    }
    match serde_json::from_slice::<Value>(stored) {
        Ok(mut v) => {
            served_value(res, &mut v);
            Bytes::from(serde_json::to_vec(&v).unwrap_or_default())
        }
        Err(_) => stored.clone(),
    }
}

/// [`served_bytes`] for a parsed object.
pub fn served_value(res: &Resource, v: &mut Value) {
    if res.custom.is_some() {
        if let Some(m) = v.as_object_mut() {
            m.insert("apiVersion".into(), json!(res.api_version()));
        }
    }
}

/// The JSONPath of a printer column (`.spec.replicas`, `.status.conditions[?(@.type=="Ready")].status`)
/// in the syntax the JSONPath library reads (`$.spec...`). Errors for paths it cannot read.
pub fn column_path(path: &str) -> Result<String, String> {
    let p = path.trim();
    let p = p.strip_prefix('{').and_then(|x| x.strip_suffix('}')).unwrap_or(p);
    if !p.starts_with('.') {
        return Err("must start with a \".\"".into());
    }
    let full = format!("${p}");
    Value::Null.query(&full).map_err(|e| e.to_string())?;
    Ok(full)
}

fn cell(col: &super::Column, obj: &Value, now: Timestamp) -> Value {
    let Ok(path) = column_path(&col.json_path) else { return Value::Null };
    let found: Vec<Value> = obj.query(&path).map(|v| v.into_iter().cloned().collect()).unwrap_or_default();
    match found.as_slice() {
        [] => Value::Null,
        [one] if col.ty == "date" => Value::String(crate::table::translate_timestamp_since(Some(one), now)),
        [one] => match (col.ty.as_str(), one) {
            ("integer", Value::Number(_)) | ("number", Value::Number(_)) | ("boolean", Value::Bool(_)) | ("string", Value::String(_)) => one.clone(),
            (_, Value::String(s)) => Value::String(s.clone()),
            (_, other) => Value::String(other.to_string()),
        },
        many => Value::String(
            many.iter()
                .map(|v| match v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .collect::<Vec<_>>()
                .join(","),
        ),
    }
}

/// The Table of custom objects: Name, then the version's additionalPrinterColumns (or Age).
pub fn table(c: &Custom, objects: &[Value], include_object: &str, list_meta: Value, now: Timestamp) -> Value {
    let age = super::Column {
        name: "Age".into(),
        ty: "date".into(),
        format: String::new(),
        description: String::new(),
        priority: 0,
        json_path: ".metadata.creationTimestamp".into(),
    };
    let cols: Vec<&super::Column> = if c.columns.is_empty() { vec![&age] } else { c.columns.iter().collect() };
    let mut defs = vec![json!({"name": "Name", "type": "string", "format": "name", "description": "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names", "priority": 0})];
    defs.extend(cols.iter().map(|c| json!({"name": c.name, "type": c.ty, "format": c.format, "description": c.description, "priority": c.priority})));
    let rows: Vec<Value> = objects
        .iter()
        .map(|obj| {
            let mut cells = vec![obj.pointer("/metadata/name").cloned().unwrap_or(Value::Null)];
            cells.extend(cols.iter().map(|c| cell(c, obj, now)));
            let object = match include_object {
                "None" => Value::Null,
                "Object" => obj.clone(),
                _ => json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({}))}),
            };
            json!({"cells": cells, "object": object})
        })
        .collect();
    let mut metadata = Map::new();
    for key in ["resourceVersion", "continue"] {
        if let Some(Value::String(s)) = list_meta.get(key) {
            if !s.is_empty() {
                metadata.insert(key.into(), Value::String(s.clone()));
            }
        }
    }
    if let Some(n @ Value::Number(_)) = list_meta.get("remainingItemCount") {
        metadata.insert("remainingItemCount".into(), n.clone());
    }
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": metadata, "columnDefinitions": defs, "rows": rows})
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn custom() -> (&'static Resource, &'static Custom) {
        let mut errs = Vec::new();
        let schema = schema::Schema::parse(
            &json!({"type": "object", "properties": {
                "spec": {"type": "object", "properties": {"replicas": {"type": "integer", "default": 1}, "size": {"type": "string"}}},
                "status": {"type": "object", "properties": {"conditions": {"type": "array", "items": {"type": "object", "properties": {"type": {"type": "string"}, "status": {"type": "string"}}}}}}}}),
            "",
            &mut errs,
        );
        assert!(errs.is_empty());
        let c: &'static Custom = Box::leak(Box::new(Custom {
            crd: "widgets.example.com",
            storage_version: "v1",
            schema,
            raw_schema: Value::Null,
            scale: None,
            columns: vec![
                super::super::Column { name: "Replicas".into(), ty: "integer".into(), format: String::new(), description: String::new(), priority: 0, json_path: ".spec.replicas".into() },
                super::super::Column { name: "Ready".into(), ty: "string".into(), format: String::new(), description: String::new(), priority: 0, json_path: ".status.conditions[?(@.type==\"Ready\")].status".into() },
                super::super::Column { name: "Age".into(), ty: "date".into(), format: String::new(), description: String::new(), priority: 0, json_path: ".metadata.creationTimestamp".into() },
            ],
            list_kind: "WidgetList",
        }));
        let r: &'static Resource = Box::leak(Box::new(Resource {
            group: "example.com",
            version: "v1beta1",
            kind: "Widget",
            plural: "widgets",
            singular: "widget",
            namespaced: true,
            short_names: &[],
            categories: &[],
            subresources: &[],
            generation: true,
            normalize: Ok,
            custom: Some(c),
        }));
        (r, c)
    }

    #[test]
    fn decode_prunes_defaults_and_stores_the_storage_version() {
        let (r, c) = custom();
        let mut warnings = Vec::new();
        let obj = json!({"apiVersion": "example.com/v1beta1", "kind": "Widget", "metadata": {"name": "a", "bogus": 1}, "spec": {"size": "s", "extra": true}});
        let out = decode(r, c, obj.clone(), "Warn", &mut warnings).unwrap();
        assert_eq!(out, json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "a"}, "spec": {"size": "s", "replicas": 1}}));
        assert_eq!(warnings, vec!["unknown field \"metadata.bogus\"", "unknown field \"spec.extra\""]);
        let e = decode(r, c, obj, "Strict", &mut Vec::new()).unwrap_err();
        assert_eq!(e.code, 400);
        assert!(e.message.contains("unknown field \"spec.extra\""), "{}", e.message);
    }

    #[test]
    fn reads_through_another_version_carry_its_api_version() {
        let (r, _) = custom();
        let stored = Bytes::from_static(br#"{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"a"}}"#);
        assert_eq!(&served_bytes(r, &stored)[..], br#"{"apiVersion":"example.com/v1beta1","kind":"Widget","metadata":{"name":"a"}}"#);
    }

    #[test]
    fn printer_columns() {
        let (_, c) = custom();
        let now: Timestamp = "2026-01-01T00:10:00Z".parse().unwrap();
        let obj = json!({"metadata": {"name": "a", "creationTimestamp": "2026-01-01T00:00:00Z"}, "spec": {"replicas": 3},
            "status": {"conditions": [{"type": "Synced", "status": "False"}, {"type": "Ready", "status": "True"}]}});
        let t = table(c, &[obj, json!({"metadata": {"name": "b"}})], "None", json!({}), now);
        assert_eq!(t["rows"][0]["cells"], json!(["a", 3, "True", "10m"]));
        assert_eq!(t["rows"][1]["cells"][1], Value::Null);
        let names: Vec<&str> = t["columnDefinitions"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["Name", "Replicas", "Ready", "Age"]);
        assert!(column_path("spec.x").is_err());
        assert!(column_path(".spec[").is_err());
    }

    #[test]
    fn validation_names_fields() {
        let (r, c) = custom();
        let errs = validate(r, c, &json!({"metadata": {"name": "A_b", "namespace": "default"}, "spec": {"replicas": "x"}}));
        let msgs: Vec<String> = errs.iter().map(|e| e.message()).collect();
        assert_eq!(msgs.len(), 2, "{msgs:?}");
        assert!(msgs[0].starts_with("metadata.name: Invalid value: \"A_b\""), "{msgs:?}");
        assert_eq!(msgs[1], "spec.replicas: Invalid value: \"string\": spec.replicas in body must be of type integer: \"string\"");
    }
}
