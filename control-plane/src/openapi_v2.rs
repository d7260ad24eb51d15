//! `/openapi/v2`: the Swagger 2.0 document, built from the OpenAPI v3 schemas the server
//! already publishes (discovery.rs), in JSON or in the protobuf kubectl asks for
//! (Accept `application/com.github.proto-openapi.spec.v2@v1.0+protobuf`: gnostic's
//! `openapi.v2.Document`).
//!
//! kubectl reads it for client-side validation of a kind whose /openapi/v3 path has no PATCH
//! (the review APIs: TokenReview, SubjectAccessReview, ...): without it `kubectl create -f` of
//! such a kind fails with "failed to download openapi". The document carries definitions only,
//! no paths: kubectl's client-side apply looks up a kind's PATCH media types in the v2 paths and,
//! finding none, keeps computing strategic merge patches from its compiled-in types, as it does
//! when /openapi/v2 is absent. Custom resources are left out (their v3 path has PATCH, so
//! kubectl leaves their validation to the server).
//!
//! The conversion keeps what kubectl's v2 models read (kube-openapi's proto package): type,
//! format, description, properties, required, items, additionalProperties, `$ref` and
//! x-kubernetes-group-version-kind. A v3 `allOf` of one `$ref` (schemars' way of giving a
//! reference a description) becomes that `$ref`; an int-or-string becomes upstream's v2 form
//! (type string, format int-or-string); what v2's models cannot say (anyOf, oneOf, nullable,
//! enum, default) is left out, which leaves such a value unchecked rather than wrongly refused.

use serde_json::{json, Map, Value};

/// The media type of the protobuf form, as the response names it (a valid MIME type: Go's
/// mime parser, which kubectl runs on the Content-Type, refuses the `@` of the Accept spelling).
pub const PROTOBUF: &str = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";
/// The spelling kubectl (client-go) puts in its Accept header.
pub const PROTOBUF_ACCEPT: &str = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";

/// Whether an Accept header asks for the protobuf form.
pub fn wants_protobuf(accept: &str) -> bool {
    accept.split(',').any(|m| {
        let m = m.split(';').next().unwrap_or("").trim();
        m == PROTOBUF || m == PROTOBUF_ACCEPT
    })
}

const V3_REF: &str = "#/components/schemas/";
const V2_REF: &str = "#/definitions/";

/// The Swagger 2.0 document of `schemas` (v3 component schemas by name).
pub fn document(schemas: &Map<String, Value>, version: &str) -> Value {
    let definitions: Map<String, Value> = schemas.iter().map(|(name, s)| (name.clone(), schema(s))).collect();
    json!({
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": version},
        "paths": {},
        "definitions": definitions,
    })
}

/// One v3 schema as v2.
pub fn schema(s: &Value) -> Value {
    let Some(obj) = s.as_object() else { return json!({}) };
    let mut out = Map::new();
    if let Some(d) = obj.get("description") {
        out.insert("description".into(), d.clone());
    }
    if let Some(r) = obj.get("$ref").and_then(Value::as_str) {
        out.insert("$ref".into(), json!(rewrite_ref(r)));
        return Value::Object(out);
    }
    // schemars: {"allOf": [{"$ref": ...}], "description": ...}
    if let Some([only]) = obj.get("allOf").and_then(Value::as_array).map(Vec::as_slice) {
        if let Some(r) = only.get("$ref").and_then(Value::as_str) {
            out.insert("$ref".into(), json!(rewrite_ref(r)));
            return Value::Object(out);
        }
    }
    if obj.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
        out.insert("type".into(), json!("string"));
        out.insert("format".into(), json!("int-or-string"));
        return Value::Object(out);
    }
    // one type only (v2's models refuse several); a v3 ["string", "null"] is its first
    let ty = match obj.get("type") {
        Some(Value::String(t)) => Some(t.clone()),
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).find(|t| *t != "null").map(str::to_string),
        _ => None,
    };
    match ty.as_deref() {
        Some(t @ ("string" | "integer" | "number" | "boolean")) => {
            out.insert("type".into(), json!(t));
            if let Some(f) = obj.get("format") {
                out.insert("format".into(), f.clone());
            }
        }
        Some("array") => {
            out.insert("type".into(), json!("array"));
            // v2's models want exactly one item schema; without it, any item
            let items = obj.get("items").filter(|i| i.is_object()).map(schema).unwrap_or_else(|| json!({}));
            out.insert("items".into(), items);
        }
        Some("object") | None => {
            let props = obj.get("properties").and_then(Value::as_object);
            if ty.is_some() || props.is_some() {
                out.insert("type".into(), json!("object"));
            }
            if let Some(props) = props {
                let p: Map<String, Value> = props.iter().map(|(k, v)| (k.clone(), schema(v))).collect();
                out.insert("properties".into(), Value::Object(p));
                if let Some(req) = obj.get("required").and_then(Value::as_array) {
                    out.insert("required".into(), Value::Array(req.iter().filter(|r| r.is_string()).cloned().collect()));
                }
            }
            match obj.get("additionalProperties") {
                Some(v @ Value::Object(_)) => {
                    out.insert("additionalProperties".into(), schema(v));
                }
                Some(Value::Bool(b)) => {
                    out.insert("additionalProperties".into(), json!(b));
                }
                _ => {}
            }
        }
        // an unknown type: left unchecked
        Some(_) => {}
    }
    if let Some(gvk) = obj.get("x-kubernetes-group-version-kind") {
        out.insert("x-kubernetes-group-version-kind".into(), gvk.clone());
    }
    Value::Object(out)
}

fn rewrite_ref(r: &str) -> String {
    match r.strip_prefix(V3_REF) {
        Some(name) => format!("{V2_REF}{name}"),
        None => r.to_string(),
    }
}

/// gnostic's `openapi.v2` messages, the fields this document uses (field numbers from
/// OpenAPIv2.proto).
pub mod pb {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Document {
        #[prost(string, tag = "1")]
        pub swagger: String,
        #[prost(message, optional, tag = "2")]
        pub info: Option<Info>,
        #[prost(message, optional, tag = "8")]
        pub paths: Option<Paths>,
        #[prost(message, optional, tag = "9")]
        pub definitions: Option<Definitions>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Info {
        #[prost(string, tag = "1")]
        pub title: String,
        #[prost(string, tag = "2")]
        pub version: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Paths {}

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Definitions {
        #[prost(message, repeated, tag = "1")]
        pub additional_properties: Vec<NamedSchema>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct NamedSchema {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(message, optional, tag = "2")]
        pub value: Option<Schema>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Schema {
        #[prost(string, tag = "1")]
        pub r#ref: String,
        #[prost(string, tag = "2")]
        pub format: String,
        #[prost(string, tag = "4")]
        pub description: String,
        #[prost(string, repeated, tag = "19")]
        pub required: Vec<String>,
        #[prost(message, optional, tag = "21")]
        pub additional_properties: Option<AdditionalPropertiesItem>,
        #[prost(message, optional, tag = "22")]
        pub r#type: Option<TypeItem>,
        #[prost(message, optional, tag = "23")]
        pub items: Option<ItemsItem>,
        #[prost(message, optional, tag = "25")]
        pub properties: Option<Properties>,
        #[prost(message, repeated, tag = "31")]
        pub vendor_extension: Vec<NamedAny>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct AdditionalPropertiesItem {
        #[prost(oneof = "AdditionalProperties", tags = "1, 2")]
        pub oneof: Option<AdditionalProperties>,
    }

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum AdditionalProperties {
        #[prost(message, tag = "1")]
        Schema(Box<Schema>),
        #[prost(bool, tag = "2")]
        Boolean(bool),
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TypeItem {
        #[prost(string, repeated, tag = "1")]
        pub value: Vec<String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ItemsItem {
        #[prost(message, repeated, tag = "1")]
        pub schema: Vec<Schema>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Properties {
        #[prost(message, repeated, tag = "1")]
        pub additional_properties: Vec<NamedSchema>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct NamedAny {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(message, optional, tag = "2")]
        pub value: Option<Any>,
    }

    /// gnostic's Any: the value as YAML text (field 2; JSON is YAML).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Any {
        #[prost(string, tag = "2")]
        pub yaml: String,
    }
}

/// The protobuf form of a document [`document`] made.
pub fn to_protobuf(doc: &Value) -> Vec<u8> {
    use prost::Message as _;
    let defs = doc.get("definitions").and_then(Value::as_object).map(named_schemas).unwrap_or_default();
    let pbdoc = pb::Document {
        swagger: "2.0".into(),
        info: Some(pb::Info {
            title: str_of(doc.pointer("/info/title")),
            version: str_of(doc.pointer("/info/version")),
        }),
        paths: Some(pb::Paths {}),
        definitions: Some(pb::Definitions { additional_properties: defs }),
    };
    pbdoc.encode_to_vec()
}

fn str_of(v: Option<&Value>) -> String {
    v.and_then(Value::as_str).unwrap_or_default().to_string()
}

fn named_schemas(m: &Map<String, Value>) -> Vec<pb::NamedSchema> {
    m.iter().map(|(name, s)| pb::NamedSchema { name: name.clone(), value: Some(pb_schema(s)) }).collect()
}

fn pb_schema(s: &Value) -> pb::Schema {
    let mut out = pb::Schema {
        r#ref: str_of(s.get("$ref")),
        format: str_of(s.get("format")),
        description: str_of(s.get("description")),
        ..Default::default()
    };
    if let Some(t) = s.get("type").and_then(Value::as_str) {
        out.r#type = Some(pb::TypeItem { value: vec![t.to_string()] });
    }
    if let Some(req) = s.get("required").and_then(Value::as_array) {
        out.required = req.iter().filter_map(Value::as_str).map(str::to_string).collect();
    }
    if let Some(items) = s.get("items") {
        out.items = Some(pb::ItemsItem { schema: vec![pb_schema(items)] });
    }
    if let Some(props) = s.get("properties").and_then(Value::as_object) {
        out.properties = Some(pb::Properties { additional_properties: named_schemas(props) });
    }
    match s.get("additionalProperties") {
        Some(v @ Value::Object(_)) => {
            out.additional_properties =
                Some(pb::AdditionalPropertiesItem { oneof: Some(pb::AdditionalProperties::Schema(Box::new(pb_schema(v)))) });
        }
        Some(Value::Bool(b)) => {
            out.additional_properties = Some(pb::AdditionalPropertiesItem { oneof: Some(pb::AdditionalProperties::Boolean(*b)) });
        }
        _ => {}
    }
    if let Some(gvk) = s.get("x-kubernetes-group-version-kind") {
        out.vendor_extension.push(pb::NamedAny {
            name: "x-kubernetes-group-version-kind".into(),
            value: Some(pb::Any { yaml: gvk.to_string() }),
        });
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use prost::Message as _;

    #[test]
    fn schemas_become_v2_with_definitions_refs() {
        let v3 = json!({
            "description": "A thing.",
            "type": "object",
            "required": ["spec"],
            "properties": {
                "metadata": {"allOf": [{"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}], "description": "Standard."},
                "spec": {"$ref": "#/components/schemas/x.Spec"},
                "port": {"x-kubernetes-int-or-string": true, "description": "A port."},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "items": {"type": "array", "items": {"type": "integer", "format": "int32"}},
                "free": {"type": "object", "additionalProperties": true},
                "either": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
                "maybe": {"type": ["string", "null"], "enum": ["a", null], "default": "a"},
                "list": {"type": "array"},
            },
            "x-kubernetes-group-version-kind": [{"group": "", "version": "v1", "kind": "Thing"}],
        });
        let v2 = schema(&v3);
        assert_eq!(
            v2,
            json!({
                "description": "A thing.",
                "type": "object",
                "required": ["spec"],
                "properties": {
                    "metadata": {"$ref": "#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta", "description": "Standard."},
                    "spec": {"$ref": "#/definitions/x.Spec"},
                    "port": {"type": "string", "format": "int-or-string", "description": "A port."},
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                    "items": {"type": "array", "items": {"type": "integer", "format": "int32"}},
                    "free": {"type": "object", "additionalProperties": true},
                    "either": {},
                    "maybe": {"type": "string"},
                    "list": {"type": "array", "items": {}},
                },
                "x-kubernetes-group-version-kind": [{"group": "", "version": "v1", "kind": "Thing"}],
            })
        );
    }

    #[test]
    fn the_protobuf_form_decodes_to_the_same_document() {
        let mut schemas = Map::new();
        schemas.insert(
            "x.Thing".into(),
            json!({"type": "object", "properties": {
                "spec": {"allOf": [{"$ref": "#/components/schemas/x.Spec"}]},
                "extra": {"type": "object", "additionalProperties": {"type": "array", "items": {"type": "string"}}},
                "open": {"type": "object", "additionalProperties": false}},
                "x-kubernetes-group-version-kind": [{"group": "g", "version": "v1", "kind": "Thing"}]}),
        );
        schemas.insert("x.Spec".into(), json!({"type": "object", "required": ["token"], "properties": {"token": {"type": "string"}}}));
        let doc = document(&schemas, "v1.33.0");
        let bytes = to_protobuf(&doc);
        let back = pb::Document::decode(bytes.as_slice()).unwrap();
        assert_eq!(back.swagger, "2.0");
        assert_eq!(back.info.unwrap().version, "v1.33.0");
        let defs = back.definitions.unwrap().additional_properties;
        let names: Vec<&str> = defs.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["x.Spec", "x.Thing"]);
        let thing = defs[1].value.as_ref().unwrap();
        assert_eq!(thing.r#type.as_ref().unwrap().value, ["object"]);
        let props = &thing.properties.as_ref().unwrap().additional_properties;
        let prop = |n: &str| props.iter().find(|p| p.name == n).unwrap().value.clone().unwrap();
        assert_eq!(prop("spec").r#ref, "#/definitions/x.Spec");
        match prop("extra").additional_properties.unwrap().oneof.unwrap() {
            pb::AdditionalProperties::Schema(s) => assert_eq!(s.items.unwrap().schema[0].r#type.as_ref().unwrap().value, ["string"]),
            other => panic!("{other:?}"),
        }
        assert_eq!(prop("open").additional_properties.unwrap().oneof, Some(pb::AdditionalProperties::Boolean(false)));
        let ext = &thing.vendor_extension[0];
        assert_eq!(ext.name, "x-kubernetes-group-version-kind");
        let gvk: Value = serde_json::from_str(&ext.value.as_ref().unwrap().yaml).unwrap();
        assert_eq!(gvk, json!([{"group": "g", "version": "v1", "kind": "Thing"}]));
        let spec = defs[0].value.as_ref().unwrap();
        assert_eq!(spec.required, ["token"]);
    }

    #[test]
    fn accept_headers() {
        assert!(wants_protobuf(PROTOBUF_ACCEPT));
        assert!(wants_protobuf("application/json;q=0.5, application/com.github.proto-openapi.spec.v2@v1.0+protobuf"));
        assert!(wants_protobuf("application/com.github.proto-openapi.spec.v2.v1.0+protobuf"));
        assert!(!wants_protobuf("application/json"));
        assert!(!wants_protobuf("*/*"));
    }
}
