//! Discovery documents (/api, /apis, group versions) and OpenAPI v3.

use std::sync::OnceLock;

use http::Response;
use serde_json::{json, Map, Value};

use crate::error::ApiError;
use crate::resources::{self, Resource, Sub, RESOURCES};
use crate::server::{json_response, Body};

const VERBS: &[&str] = &["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"];

fn resource_entries(r: &Resource) -> Vec<Value> {
    let mut main = json!({
        "name": r.plural,
        "singularName": r.singular,
        "namespaced": r.namespaced,
        "kind": r.kind,
        "verbs": VERBS,
    });
    if !r.short_names.is_empty() {
        main["shortNames"] = json!(r.short_names);
    }
    if !r.categories.is_empty() {
        main["categories"] = json!(r.categories);
    }
    let mut out = vec![main];
    for s in r.subresources {
        let (kind, group, version, verbs): (&str, Option<&str>, Option<&str>, &[&str]) = match s {
            Sub::Status => (r.kind, None, None, &["get", "patch", "update"]),
            Sub::Scale => ("Scale", Some("autoscaling"), Some("v1"), &["get", "patch", "update"]),
            Sub::Binding => ("Binding", None, None, &["create"]),
            Sub::Eviction => ("Eviction", Some("policy"), Some("v1"), &["create"]),
            Sub::Log => ("Pod", None, None, &["get"]),
            Sub::Exec => ("PodExecOptions", None, None, &["create", "get"]),
            Sub::Attach => ("PodAttachOptions", None, None, &["create", "get"]),
            Sub::PortForward => ("PodPortForwardOptions", None, None, &["create", "get"]),
            Sub::Finalize => (r.kind, None, None, &["update"]),
            Sub::Approval => (r.kind, None, None, &["get", "patch", "update"]),
            Sub::Token => ("TokenRequest", Some("authentication.k8s.io"), Some("v1"), &["create"]),
        };
        let mut e = json!({
            "name": format!("{}/{}", r.plural, s.name()),
            "singularName": "",
            "namespaced": r.namespaced,
            "kind": kind,
            "verbs": verbs,
        });
        if let (Some(g), Some(v)) = (group, version) {
            e["group"] = json!(g);
            e["version"] = json!(v);
        }
        out.push(e);
    }
    out
}

/// The review APIs (served without storage, create only): group, version, plural, kind.
const REVIEWS: &[(&str, &str, &str, &str)] = &[
    ("authentication.k8s.io", "v1", "tokenreviews", "TokenReview"),
    ("authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview"),
    ("authentication.k8s.io", "v1", "selfsubjectreviews", "SelfSubjectReview"),
    ("authorization.k8s.io", "v1", "selfsubjectaccessreviews", "SelfSubjectAccessReview"),
    ("authorization.k8s.io", "v1", "selfsubjectrulesreviews", "SelfSubjectRulesReview"),
];

/// Every served group version: the stored resources' and the review APIs'.
fn group_versions() -> Vec<(&'static str, &'static str)> {
    let mut out = resources::group_versions();
    for (g, v, ..) in REVIEWS {
        if !out.contains(&(*g, *v)) {
            out.push((*g, *v));
        }
    }
    // metrics.k8s.io, served from the agents' usage (crate::resource_metrics)
    out.push((crate::resource_metrics::objects::GROUP, crate::resource_metrics::objects::VERSION));
    out
}

fn resource_list(group: &str, version: &str) -> Value {
    let gv = if group.is_empty() { version.to_string() } else { format!("{group}/{version}") };
    let mut resources: Vec<Value> = resources::all()
        .into_iter()
        .filter(|r| r.group == group && r.version == version)
        .flat_map(resource_entries)
        .collect();
    for (_, _, plural, kind) in REVIEWS.iter().filter(|(g, v, ..)| *g == group && *v == version) {
        resources.push(json!({"name": plural, "singularName": "", "namespaced": false, "kind": kind, "verbs": ["create"]}));
    }
    if (group, version) == ("", "v1") {
        // served by crate::proxy (GET only)
        resources.push(json!({"name": "nodes/proxy", "singularName": "", "namespaced": false, "kind": "NodeProxyOptions", "verbs": ["get"]}));
    }
    if (group, version) == (crate::resource_metrics::objects::GROUP, crate::resource_metrics::objects::VERSION) {
        for (plural, kind, namespaced) in crate::resource_metrics::RESOURCES {
            resources.push(json!({"name": plural, "singularName": "", "namespaced": namespaced, "kind": kind, "verbs": ["get", "list"]}));
        }
    }
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources})
}

/// Kubernetes' version priority (upstream's CompareKubeAwareVersionStrings): GA before beta
/// before alpha, higher numbers first, anything else last in alphabetical order.
pub fn version_priority(v: &str) -> (u8, i64, i64, String) {
    let parse = |v: &str| -> Option<(u8, i64, i64)> {
        let rest = v.strip_prefix('v')?;
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let major: i64 = digits.parse().ok()?;
        let tail = &rest[digits.len()..];
        if tail.is_empty() {
            return Some((0, -major, 0));
        }
        for (level, pre) in [(1u8, "beta"), (2u8, "alpha")] {
            if let Some(n) = tail.strip_prefix(pre) {
                let minor: i64 = n.parse().ok()?;
                return Some((level, -major, -minor));
            }
        }
        None
    };
    match parse(v) {
        Some((level, major, minor)) => (level, major, minor, String::new()),
        None => (3, 0, 0, v.to_string()),
    }
}

fn group_doc(group: &str) -> Value {
    let mut gvs: Vec<(&str, &str)> = group_versions().into_iter().filter(|(g, _)| *g == group).collect();
    gvs.sort_by_key(|(_, v)| version_priority(v));
    let versions: Vec<Value> = gvs
        .into_iter()
        .map(|(g, v)| json!({"groupVersion": format!("{g}/{v}"), "version": v}))
        .collect();
    let preferred = versions.first().cloned().unwrap_or(Value::Null);
    json!({"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": versions, "preferredVersion": preferred})
}

/// Serves discovery and OpenAPI paths; None for any other path.
pub fn serve(path: &str) -> Result<Option<Response<Body>>, ApiError> {
    let path = path.trim_end_matches('/');
    let v = match path {
        "/api" => json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}],
        }),
        "/api/v1" => resource_list("", "v1"),
        "/apis" => {
            let mut groups: Vec<&str> = Vec::new();
            for (g, _) in group_versions() {
                if !g.is_empty() && !groups.contains(&g) {
                    groups.push(g);
                }
            }
            let docs: Vec<Value> = groups.iter().map(|g| group_doc(g)).collect();
            json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": docs})
        }
        "/openapi/v3" => openapi_index(),
        p if p.starts_with("/openapi/v3/") => {
            let gv = &p["/openapi/v3/".len()..];
            let (group, version) = match gv.split('/').collect::<Vec<_>>().as_slice() {
                ["api", v] => ("", *v),
                ["apis", g, v] => (*g, *v),
                _ => return Err(ApiError::no_route()),
            };
            if !openapi_group_versions().contains(&(group, version)) {
                return Err(ApiError::no_route());
            }
            openapi_doc(group, version)
        }
        p if p.starts_with("/apis/") => {
            let rest: Vec<&str> = p["/apis/".len()..].split('/').collect();
            match rest.as_slice() {
                [g] if group_versions().iter().any(|(x, _)| x == g) => group_doc(g),
                [g, v] if group_versions().contains(&(g, v)) => resource_list(g, v),
                [_] | [_, _] => return Err(ApiError::no_route()),
                _ => return Ok(None),
            }
        }
        _ => return Ok(None),
    };
    Ok(Some(json_response(200, &v)))
}

/// `/openapi/v2` (crate::openapi_v2): the built-in kinds' schemas of every group version, in
/// protobuf when `accept` asks for it, else JSON. Built once (custom kinds are not in it).
pub fn serve_openapi_v2(accept: &str) -> Response<Body> {
    static DOC: OnceLock<(bytes::Bytes, bytes::Bytes)> = OnceLock::new();
    let (json_bytes, pb_bytes) = DOC.get_or_init(|| {
        let mut schemas = Map::new();
        for (g, v) in openapi_group_versions() {
            schemas.extend(components(g, v));
        }
        let doc = crate::openapi_v2::document(&schemas, OPENAPI_VERSION);
        (bytes::Bytes::from(serde_json::to_vec(&doc).unwrap_or_default()), bytes::Bytes::from(crate::openapi_v2::to_protobuf(&doc)))
    });
    let (body, media) = if crate::openapi_v2::wants_protobuf(accept) {
        (pb_bytes.clone(), crate::openapi_v2::PROTOBUF)
    } else {
        (json_bytes.clone(), "application/json")
    };
    Response::builder()
        .status(200)
        .header(http::header::CONTENT_TYPE, media)
        .body(crate::server::full(body))
        .unwrap_or_else(|_| json_response(500, &json!({})))
}

/// The version the OpenAPI documents name.
const OPENAPI_VERSION: &str = "v1.33.0";

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// The group versions with an OpenAPI document: the stored resources' and the review APIs'
/// (kubectl validates a TokenReview it creates against it).
fn openapi_group_versions() -> Vec<(&'static str, &'static str)> {
    let mut out = resources::group_versions();
    for (g, v, ..) in REVIEWS {
        if !out.contains(&(*g, *v)) {
            out.push((*g, *v));
        }
    }
    out
}

fn openapi_index() -> Value {
    let mut paths = Map::new();
    for (g, v) in openapi_group_versions() {
        let p = gv_path(g, v);
        // custom groups change with their CRDs: the hash (kubectl caches by it) follows them
        let custom: Vec<String> = resources::all()
            .into_iter()
            .filter(|r| r.group == g && r.version == v)
            .filter_map(|r| r.custom.map(|c| format!("{}{}", c.crd, c.raw_schema)))
            .collect();
        let hash = format!("{:016X}", fnv(&format!("{p}{}", custom.concat())));
        paths.insert(p.clone(), json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash={hash}")}));
    }
    json!({"paths": paths})
}

fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf29ce484222325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100000001b3))
}

/// Builds the schema components for every kind of a group version with schemars from the
/// k8s-openapi types, tagged with x-kubernetes-group-version-kind as upstream does.
fn components(group: &str, version: &str) -> Map<String, Value> {
    use k8s_openapi::api::{apps, authentication, authorization, batch, certificates, coordination, core, discovery, policy, rbac, storage};
    let settings = schemars::generate::SchemaSettings::openapi3().with(|s| {
        s.definitions_path = "/components/schemas".into();
    });
    let mut generator = settings.into_generator();
    let mut roots: Vec<(String, &Resource)> = Vec::new();
    macro_rules! add {
        ($ty:ty, $plural:expr) => {{
            let r = RESOURCES.iter().find(|r| r.group == group && r.version == version && r.plural == $plural);
            if let Some(r) = r {
                generator.subschema_for::<$ty>();
                roots.push((<$ty as schemars::JsonSchema>::schema_name().to_string(), r));
            }
        }};
    }
    add!(core::v1::Namespace, "namespaces");
    add!(core::v1::Node, "nodes");
    add!(core::v1::Pod, "pods");
    add!(core::v1::Service, "services");
    add!(core::v1::Endpoints, "endpoints");
    add!(core::v1::ConfigMap, "configmaps");
    add!(core::v1::Secret, "secrets");
    add!(core::v1::ServiceAccount, "serviceaccounts");
    add!(core::v1::Event, "events");
    add!(core::v1::PersistentVolume, "persistentvolumes");
    add!(core::v1::PersistentVolumeClaim, "persistentvolumeclaims");
    add!(discovery::v1::EndpointSlice, "endpointslices");
    add!(coordination::v1::Lease, "leases");
    add!(storage::v1::StorageClass, "storageclasses");
    add!(storage::v1::CSIDriver, "csidrivers");
    add!(storage::v1::CSINode, "csinodes");
    add!(storage::v1::VolumeAttachment, "volumeattachments");
    add!(storage::v1::CSIStorageCapacity, "csistoragecapacities");
    add!(api_ext::snapshot::v1::VolumeSnapshotClass, "volumesnapshotclasses");
    add!(api_ext::snapshot::v1::VolumeSnapshot, "volumesnapshots");
    add!(api_ext::snapshot::v1::VolumeSnapshotContent, "volumesnapshotcontents");
    add!(apps::v1::Deployment, "deployments");
    add!(apps::v1::ReplicaSet, "replicasets");
    add!(apps::v1::DaemonSet, "daemonsets");
    add!(apps::v1::StatefulSet, "statefulsets");
    add!(apps::v1::ControllerRevision, "controllerrevisions");
    add!(batch::v1::Job, "jobs");
    add!(batch::v1::CronJob, "cronjobs");
    add!(policy::v1::PodDisruptionBudget, "poddisruptionbudgets");
    add!(rbac::v1::ClusterRole, "clusterroles");
    add!(rbac::v1::ClusterRoleBinding, "clusterrolebindings");
    add!(rbac::v1::Role, "roles");
    add!(rbac::v1::RoleBinding, "rolebindings");
    add!(certificates::v1::CertificateSigningRequest, "certificatesigningrequests");
    // the review APIs (served without storage)
    let mut reviews: Vec<(String, &str, &str, &str)> = Vec::new();
    macro_rules! review {
        ($ty:ty, $plural:expr) => {{
            if let Some((g, v, _, kind)) = REVIEWS.iter().find(|(g, v, p, _)| *g == group && *v == version && *p == $plural) {
                generator.subschema_for::<$ty>();
                reviews.push((<$ty as schemars::JsonSchema>::schema_name().to_string(), g, v, kind));
            }
        }};
    }
    review!(authentication::v1::TokenReview, "tokenreviews");
    review!(authentication::v1::SelfSubjectReview, "selfsubjectreviews");
    review!(authorization::v1::SubjectAccessReview, "subjectaccessreviews");
    review!(authorization::v1::SelfSubjectAccessReview, "selfsubjectaccessreviews");
    review!(authorization::v1::SelfSubjectRulesReview, "selfsubjectrulesreviews");
    let mut defs: Map<String, Value> = generator
        .take_definitions(true)
        .into_iter()
        .collect();
    // k8s-openapi's types hold `metadata` as a plain ObjectMeta (always there in Rust), so
    // schemars lists it as required; upstream's schemas never require it (kubectl's
    // client-side validation would refuse a manifest without it)
    for schema in defs.values_mut() {
        if let Some(Value::Array(req)) = schema.get_mut("required") {
            req.retain(|f| f != "metadata");
        }
        if schema.get("required").and_then(Value::as_array).is_some_and(Vec::is_empty) {
            schema.as_object_mut().map(|m| m.remove("required"));
        }
    }
    for (name, r) in roots {
        if let Some(Value::Object(s)) = defs.get_mut(&name) {
            s.insert(
                "x-kubernetes-group-version-kind".into(),
                json!([{"group": r.group, "version": r.version, "kind": r.kind}]),
            );
        }
    }
    for (name, g, v, kind) in reviews {
        if let Some(Value::Object(s)) = defs.get_mut(&name) {
            s.insert("x-kubernetes-group-version-kind".into(), json!([{"group": g, "version": v, "kind": kind}]));
        }
    }
    defs
}

fn openapi_doc(group: &str, version: &str) -> Value {
    static CACHE: OnceLock<std::sync::Mutex<std::collections::HashMap<String, Value>>> = OnceLock::new();
    let key = gv_path(group, version);
    let custom = resources::all().into_iter().any(|r| r.group == group && r.version == version && r.custom.is_some());
    let cache = CACHE.get_or_init(Default::default);
    if !custom {
        if let Some(v) = cache.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
            return v.clone();
        }
    }
    let mut schemas = components(group, version);
    if custom {
        schemas.extend(custom_components(group, version));
    }
    // Paths with the fieldValidation parameter on PATCH/PUT/POST: kubectl then leaves field
    // validation to the server (which implements fieldValidation=Strict).
    let field_validation = json!({
        "name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true},
        "description": "fieldValidation instructs the server on how to handle objects in the request containing unknown or duplicate fields."
    });
    let mut paths = Map::new();
    for r in resources::all().into_iter().filter(|r| r.group == group && r.version == version) {
        let base = if r.namespaced {
            format!("/{}/namespaces/{{namespace}}/{}", key, r.plural)
        } else {
            format!("/{}/{}", key, r.plural)
        };
        let gvk = json!({"group": r.group, "version": r.version, "kind": r.kind});
        let op = |action: &str| {
            json!({
                "parameters": [field_validation.clone()],
                "x-kubernetes-action": action,
                "x-kubernetes-group-version-kind": gvk.clone(),
                "responses": {"200": {"description": "OK"}},
            })
        };
        paths.insert(base.clone(), json!({"post": op("post"), "get": op("list")}));
        paths.insert(
            format!("{base}/{{name}}"),
            json!({"get": op("get"), "put": op("put"), "patch": op("patch"), "delete": op("delete")}),
        );
    }
    for (_, _, plural, kind) in REVIEWS.iter().filter(|(g, v, ..)| *g == group && *v == version) {
        let gvk = json!({"group": group, "version": version, "kind": kind});
        paths.insert(
            format!("/{key}/{plural}"),
            json!({"post": {"parameters": [field_validation.clone()], "x-kubernetes-action": "post", "x-kubernetes-group-version-kind": gvk, "responses": {"201": {"description": "Created"}}}}),
        );
    }
    let doc = json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": OPENAPI_VERSION},
        "paths": paths,
        "components": {"schemas": schemas},
    });
    if !custom {
        cache.lock().unwrap_or_else(|p| p.into_inner()).insert(key, doc.clone());
    }
    doc
}

/// The schema name upstream gives a custom kind: the group reversed, the version, the kind
/// (`com.example.v1.Widget`).
fn custom_schema_name(r: &Resource) -> String {
    let mut parts: Vec<&str> = r.group.split('.').collect();
    parts.reverse();
    format!("{}.{}.{}", parts.join("."), r.version, r.kind)
}

/// Components for the custom kinds of a group version: each version's schema with apiVersion,
/// kind and metadata (ObjectMeta) as upstream's builder adds them, plus the ObjectMeta schema.
fn custom_components(group: &str, version: &str) -> Map<String, Value> {
    let settings = schemars::generate::SchemaSettings::openapi3().with(|s| {
        s.definitions_path = "/components/schemas".into();
    });
    let mut generator = settings.into_generator();
    let meta_ref = generator.subschema_for::<k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>();
    let mut defs: Map<String, Value> = generator.take_definitions(true).into_iter().collect();
    for r in resources::all().into_iter().filter(|r| r.group == group && r.version == version) {
        let Some(c) = r.custom else { continue };
        let mut schema = c.raw_schema.clone();
        if let Some(m) = schema.as_object_mut() {
            let props = m.entry("properties").or_insert_with(|| json!({}));
            if let Some(p) = props.as_object_mut() {
                p.insert("apiVersion".into(), json!({"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object. Servers should convert recognized schemas to the latest internal value, and may reject unrecognized values. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources"}));
                p.insert("kind".into(), json!({"type": "string", "description": "Kind is a string value representing the REST resource this object represents. Servers may infer this from the endpoint the client submits requests to. Cannot be updated. In CamelCase. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds"}));
                let mut meta = serde_json::to_value(&meta_ref).unwrap_or(Value::Null);
                if let Some(own) = p.get("metadata").and_then(|x| x.get("properties")).cloned() {
                    meta = json!({"allOf": [meta], "properties": own});
                }
                p.insert("metadata".into(), meta);
            }
            m.insert("x-kubernetes-group-version-kind".into(), json!([{"group": r.group, "version": r.version, "kind": r.kind}]));
        }
        defs.insert(custom_schema_name(r), schema);
    }
    defs
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn core_resource_list_has_subresources() {
        let l = resource_list("", "v1");
        let names: Vec<&str> = l["resources"].as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap()).collect();
        assert!(names.contains(&"pods"));
        assert!(names.contains(&"pods/status"));
        assert!(names.contains(&"pods/exec"));
        assert!(names.contains(&"nodes"));
        let apps = resource_list("apps", "v1");
        let scale = apps["resources"].as_array().unwrap().iter().find(|r| r["name"] == "deployments/scale").unwrap();
        assert_eq!(scale["group"], "autoscaling");
    }

    #[test]
    fn metrics_api_and_node_proxy_in_discovery() {
        assert!(group_versions().contains(&("metrics.k8s.io", "v1beta1")));
        let doc = group_doc("metrics.k8s.io");
        assert_eq!(doc["preferredVersion"]["groupVersion"], "metrics.k8s.io/v1beta1");
        let l = resource_list("metrics.k8s.io", "v1beta1");
        assert_eq!(
            l["resources"],
            json!([
                {"name": "nodes", "singularName": "", "namespaced": false, "kind": "NodeMetrics", "verbs": ["get", "list"]},
                {"name": "pods", "singularName": "", "namespaced": true, "kind": "PodMetrics", "verbs": ["get", "list"]},
            ])
        );
        let core = resource_list("", "v1");
        assert!(core["resources"].as_array().unwrap().iter().any(|r| r["name"] == "nodes/proxy" && r["verbs"] == json!(["get"])));
    }

    #[test]
    fn openapi_doc_has_tagged_schemas_with_resolvable_refs() {
        let d = openapi_doc("apps", "v1");
        let schemas = d["components"]["schemas"].as_object().unwrap();
        let dep = &schemas["io.k8s.api.apps.v1.Deployment"];
        assert_eq!(dep["x-kubernetes-group-version-kind"][0]["kind"], "Deployment");
        // metadata is never required (upstream's schemas), spec is where upstream says so
        assert!(dep.get("required").is_none(), "{}", dep["required"]);
        let tr = openapi_doc("authentication.k8s.io", "v1");
        assert_eq!(tr["components"]["schemas"]["io.k8s.api.authentication.v1.TokenReview"]["required"], json!(["spec"]));
        let text = d.to_string();
        for r in text.split("\"$ref\":\"#/components/schemas/").skip(1) {
            let name = &r[..r.find('"').unwrap()];
            assert!(schemas.contains_key(name), "unresolved {name}");
        }
    }
}
