//! Per-kind behaviour: field-selector attributes, defaulting, validation and the parts of an
//! object each endpoint may change (upstream's "strategies").

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{json, Map, Value};

use crate::resources::{self, Resource};
use crate::store::{Attrs, Indexer};
use crate::validation::{self, FieldError};

/// The annotation an upstream API server keeps on apps/v1 DaemonSets for the internal
/// `spec.templateGeneration`: 1 at creation, one more at each change of the pod template
/// (other spec changes bump only `metadata.generation`). A value a client sends is replaced.
pub const DAEMONSET_TEMPLATE_GENERATION: &str = "deprecated.daemonset.template.generation";

/// Sets [`DAEMONSET_TEMPLATE_GENERATION`] on a DaemonSet being created (`old` None) or updated
/// (an object stored without it counts from its generation).
pub fn daemonset_template_generation(old: Option<&Value>, obj: &mut Value) {
    let value = match old {
        None => 1,
        Some(old) => {
            let before = old
                .pointer("/metadata/annotations")
                .and_then(|a| a.get(DAEMONSET_TEMPLATE_GENERATION))
                .and_then(Value::as_str)
                .and_then(|v| v.parse::<i64>().ok())
                .or_else(|| old.pointer("/metadata/generation").and_then(Value::as_i64))
                .unwrap_or(1);
            if old.pointer("/spec/template") != obj.pointer("/spec/template") {
                before + 1
            } else {
                before
            }
        }
    };
    let meta = obj_mut(obj, "metadata");
    let ann = meta.entry("annotations").or_insert_with(|| json!({}));
    if !ann.is_object() {
        *ann = json!({});
    }
    if let Some(a) = ann.as_object_mut() {
        a.insert(DAEMONSET_TEMPLATE_GENERATION.into(), json!(value.to_string()));
    }
}

/// Field-selector fields each kind supports (beyond metadata.name and metadata.namespace).
pub fn selectable_fields(res: &Resource) -> &'static [&'static str] {
    if res.custom.is_some() {
        return &[];
    }
    match res.plural {
        "pods" => &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        "events" => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        "nodes" => &["spec.unschedulable"],
        "namespaces" => &["status.phase"],
        "secrets" => &["type"],
        "persistentvolumeclaims" | "persistentvolumes" => &["status.phase"],
        "replicasets" => &["status.replicas"],
        _ => &[],
    }
}

fn field_string(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Bool(b)) => b.to_string(),
        Some(Value::Number(n)) => n.to_string(),
        _ => String::new(),
    }
}

/// The indexer for every served kind: labels plus the selectable fields.
pub fn indexer() -> Indexer {
    Arc::new(|key: &str, obj: &Value| {
        let labels: BTreeMap<String, String> = obj
            .pointer("/metadata/labels")
            .and_then(|l| l.as_object())
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())))
                    .collect()
            })
            .unwrap_or_default();
        let mut fields = vec![
            ("metadata.name", field_string(obj.pointer("/metadata/name"))),
            ("metadata.namespace", field_string(obj.pointer("/metadata/namespace"))),
        ];
        if let Some(res) = resources::from_key(key) {
            for f in selectable_fields(res) {
                let value = if *f == "source" {
                    // events: source is the reporting component as upstream's field set has it
                    field_string(obj.pointer("/source/component"))
                } else if res.plural == "pods" && *f == "spec.hostNetwork" {
                    field_string(obj.pointer("/spec/hostNetwork").or(Some(&Value::Bool(false))))
                } else if res.plural == "nodes" && *f == "spec.unschedulable" {
                    field_string(obj.pointer("/spec/unschedulable").or(Some(&Value::Bool(false))))
                } else {
                    let ptr = format!("/{}", f.replace('.', "/"));
                    field_string(obj.pointer(&ptr))
                };
                fields.push((*f, value));
            }
        }
        let refs = if resources::from_key(key).is_some_and(|r| r.plural == "pods" && r.group.is_empty()) {
            crate::auth::pod_uses(obj)
        } else {
            Vec::new()
        };
        Attrs { labels, fields, refs }
    })
}

fn obj_mut<'a>(v: &'a mut Value, key: &str) -> &'a mut Map<String, Value> {
    if !v.get(key).map(|x| x.is_object()).unwrap_or(false) {
        v[key] = json!({});
    }
    match v.get_mut(key) {
        Some(Value::Object(m)) => m,
        // just ensured above
        _ => unreachable!("object ensured"),
    }
}

fn default(m: &mut Map<String, Value>, key: &str, value: Value) {
    if m.get(key).map(|v| v.is_null()).unwrap_or(true) {
        m.insert(key.to_string(), value);
    }
}

/// Upstream's defaults for a PodSpec (pods and pod templates).
pub fn default_pod_spec(spec: &mut Map<String, Value>) {
    default(spec, "restartPolicy", json!("Always"));
    default(spec, "terminationGracePeriodSeconds", json!(30));
    default(spec, "dnsPolicy", json!("ClusterFirst"));
    default(spec, "securityContext", json!({}));
    default(spec, "schedulerName", json!("default-scheduler"));
    if let Some(sa) = spec.get("serviceAccountName").cloned() {
        default(spec, "serviceAccount", sa);
    }
    for list in ["containers", "initContainers"] {
        if let Some(Value::Array(cs)) = spec.get_mut(list) {
            for c in cs.iter_mut().filter_map(|c| c.as_object_mut()) {
                default(c, "terminationMessagePath", json!("/dev/termination-log"));
                default(c, "terminationMessagePolicy", json!("File"));
                let latest = c
                    .get("image")
                    .and_then(|i| i.as_str())
                    .map(|i| {
                        let last = i.rsplit('/').next().unwrap_or(i);
                        !last.contains(':') && !i.contains('@') || i.ends_with(":latest")
                    })
                    .unwrap_or(false);
                default(
                    c,
                    "imagePullPolicy",
                    json!(if latest { "Always" } else { "IfNotPresent" }),
                );
                default(c, "resources", json!({}));
                if let Some(Value::Array(ports)) = c.get_mut("ports") {
                    for p in ports.iter_mut().filter_map(|p| p.as_object_mut()) {
                        default(p, "protocol", json!("TCP"));
                    }
                }
                // limits without requests: requests default to the limits
                if let Some(Value::Object(res)) = c.get_mut("resources") {
                    if let Some(Value::Object(limits)) = res.get("limits").cloned() {
                        let req = res.entry("requests").or_insert_with(|| json!({}));
                        if let Some(req) = req.as_object_mut() {
                            for (k, v) in limits {
                                req.entry(k).or_insert(v);
                            }
                        }
                    }
                }
            }
        }
    }
    if let Some(Value::Array(vols)) = spec.get_mut("volumes") {
        for v in vols.iter_mut().filter_map(|v| v.as_object_mut()) {
            for (src, mode_key) in
                [("configMap", "defaultMode"), ("secret", "defaultMode"), ("projected", "defaultMode"), ("downwardAPI", "defaultMode")]
            {
                if let Some(Value::Object(s)) = v.get_mut(src) {
                    default(s, mode_key, json!(420));
                }
            }
            if let Some(Value::Object(hp)) = v.get_mut("hostPath") {
                default(hp, "type", json!(""));
            }
        }
        let has_source = |v: &Map<String, Value>| v.keys().any(|k| k != "name");
        for v in vols.iter_mut().filter_map(|v| v.as_object_mut()) {
            if !has_source(v) {
                v.insert("emptyDir".into(), json!({}));
            }
        }
    }
}

/// Upstream's `DefaultTolerationSeconds` admission plugin (pods only, not templates): a pod
/// that does not tolerate the `node.kubernetes.io/not-ready` or `node.kubernetes.io/unreachable`
/// NoExecute taints gets a 300 s toleration for each, so the node lifecycle controller evicts it
/// five minutes after its node fails.
pub fn default_toleration_seconds(spec: &mut Map<String, Value>) {
    let tolerates = |key: &str| {
        spec.get("tolerations").and_then(|t| t.as_array()).is_some_and(|ts| {
            ts.iter().any(|t| {
                let k = t.get("key").and_then(|k| k.as_str()).unwrap_or("");
                let e = t.get("effect").and_then(|e| e.as_str()).unwrap_or("");
                (k == key || k.is_empty()) && (e == "NoExecute" || e.is_empty())
            })
        })
    };
    let missing: Vec<&str> = ["node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"]
        .into_iter()
        .filter(|k| !tolerates(k))
        .collect();
    if missing.is_empty() {
        return;
    }
    if !spec.get("tolerations").is_some_and(|t| t.is_array()) {
        spec.insert("tolerations".into(), json!([]));
    }
    if let Some(Value::Array(ts)) = spec.get_mut("tolerations") {
        for key in missing {
            ts.push(json!({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}));
        }
    }
}

/// Upstream's Job defaults (SetDefaults_Job) and, unless `manualSelector`, the selector and
/// template labels the API server generates from the Job's uid and name.
fn default_job(obj: &mut Value) {
    let uid = obj.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or_default().to_string();
    let name = obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_string();
    let spec = obj_mut(obj, "spec");
    if spec.get("completions").is_none() && spec.get("parallelism").is_none() {
        spec.insert("completions".into(), json!(1));
    }
    default(spec, "parallelism", json!(1));
    let per_index = spec.get("backoffLimitPerIndex").is_some_and(|v| !v.is_null());
    default(spec, "backoffLimit", json!(if per_index { i64::from(i32::MAX) } else { 6 }));
    default(spec, "completionMode", json!("NonIndexed"));
    default(spec, "suspend", json!(false));
    let failure_policy = spec.get("podFailurePolicy").is_some_and(|v| !v.is_null());
    default(spec, "podReplacementPolicy", json!(if failure_policy { "Failed" } else { "TerminatingOrFailed" }));
    if spec.get("manualSelector").and_then(Value::as_bool) == Some(true) || uid.is_empty() {
        return;
    }
    spec.insert("selector".into(), json!({"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}));
    let t = spec.entry("template").or_insert_with(|| json!({}));
    if let Value::Object(t) = t {
        let meta = t.entry("metadata").or_insert_with(|| json!({}));
        if let Value::Object(meta) = meta {
            let labels = meta.entry("labels").or_insert_with(|| json!({}));
            if let Value::Object(labels) = labels {
                for (k, v) in [
                    ("batch.kubernetes.io/controller-uid", &uid),
                    ("batch.kubernetes.io/job-name", &name),
                    ("controller-uid", &uid),
                    ("job-name", &name),
                ] {
                    labels.insert(k.into(), json!(v));
                }
            }
        }
    }
}

fn default_template(obj: &mut Value) {
    if let Some(Value::Object(spec)) = obj.pointer_mut("/spec/template/spec") {
        default_pod_spec(spec);
    }
    if let Some(Value::Object(t)) = obj.pointer_mut("/spec/template") {
        t.entry("metadata").or_insert_with(|| json!({}));
    }
    // upstream always serializes creationTimestamp: null inside templates
    if let Some(Value::Object(meta)) = obj.pointer_mut("/spec/template/metadata") {
        meta.entry("creationTimestamp").or_insert(Value::Null);
    }
}

/// A Secret's write-only `stringData` goes into `data` (base64, its keys winning) and is not
/// stored (upstream's conversion); `type` defaults to Opaque.
fn merge_string_data(obj: &mut Value) {
    use base64::Engine as _;
    let Some(m) = obj.as_object_mut() else { return };
    if let Some(Value::Object(strings)) = m.remove("stringData") {
        let data = m.entry("data").or_insert_with(|| Value::Object(Map::new()));
        if !data.is_object() {
            *data = Value::Object(Map::new());
        }
        if let Some(d) = data.as_object_mut() {
            for (k, v) in strings {
                let text = v.as_str().unwrap_or_default();
                d.insert(k, json!(base64::engine::general_purpose::STANDARD.encode(text)));
            }
        }
    }
    default(m, "type", json!("Opaque"));
}

/// Applies upstream's defaults for the kind.
pub fn apply_defaults(res: &Resource, obj: &mut Value) {
    if let Some(c) = res.custom {
        crate::crd::schema::apply_defaults(&c.schema, obj);
        return;
    }
    if res.group == crate::rbac::GROUP {
        crate::rbac::validation::apply_defaults(res.plural, obj);
    }
    match res.plural {
        "customresourcedefinitions" => crate::crd::definition::apply_defaults(obj),
        "secrets" => merge_string_data(obj),
        "pods" => {
            let spec = obj_mut(obj, "spec");
            default_pod_spec(spec);
            default_toleration_seconds(spec);
            let qos = qos_class(obj.get("spec").unwrap_or(&Value::Null));
            let status = obj_mut(obj, "status");
            default(status, "phase", json!("Pending"));
            default(status, "qosClass", json!(qos));
        }
        "services" => {
            let spec = obj_mut(obj, "spec");
            default(spec, "type", json!("ClusterIP"));
            default(spec, "sessionAffinity", json!("None"));
            let ty = spec.get("type").and_then(|t| t.as_str()).unwrap_or("ClusterIP").to_string();
            if ty != "ExternalName" {
                default(spec, "internalTrafficPolicy", json!("Cluster"));
            }
            if ty == "NodePort" || ty == "LoadBalancer" {
                default(spec, "externalTrafficPolicy", json!("Cluster"));
            }
            if ty == "LoadBalancer" {
                default(spec, "allocateLoadBalancerNodePorts", json!(true));
            }
            if let Some(Value::Array(ports)) = spec.get_mut("ports") {
                for p in ports.iter_mut().filter_map(|p| p.as_object_mut()) {
                    default(p, "protocol", json!("TCP"));
                    if let Some(port) = p.get("port").cloned() {
                        default(p, "targetPort", port);
                    }
                }
            }
            let status = obj_mut(obj, "status");
            default(status, "loadBalancer", json!({}));
        }
        "deployments" => {
            let spec = obj_mut(obj, "spec");
            default(spec, "replicas", json!(1));
            default(spec, "revisionHistoryLimit", json!(10));
            default(spec, "progressDeadlineSeconds", json!(600));
            default(
                spec,
                "strategy",
                json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}}),
            );
            if let Some(Value::Object(st)) = spec.get_mut("strategy") {
                default(st, "type", json!("RollingUpdate"));
                if st.get("type") == Some(&json!("RollingUpdate")) {
                    let ru = st.entry("rollingUpdate").or_insert_with(|| json!({}));
                    if let Some(ru) = ru.as_object_mut() {
                        default(ru, "maxUnavailable", json!("25%"));
                        default(ru, "maxSurge", json!("25%"));
                    }
                }
            }
            default_template(obj);
        }
        "replicasets" => {
            let spec = obj_mut(obj, "spec");
            default(spec, "replicas", json!(1));
            default_template(obj);
        }
        "daemonsets" => {
            let spec = obj_mut(obj, "spec");
            default(spec, "revisionHistoryLimit", json!(10));
            default(
                spec,
                "updateStrategy",
                json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}),
            );
            default_template(obj);
        }
        "statefulsets" => {
            let spec = obj_mut(obj, "spec");
            default(spec, "replicas", json!(1));
            default(spec, "podManagementPolicy", json!("OrderedReady"));
            default(spec, "revisionHistoryLimit", json!(10));
            default(spec, "updateStrategy", json!({"type": "RollingUpdate"}));
            default(spec, "persistentVolumeClaimRetentionPolicy", json!({"whenDeleted": "Retain", "whenScaled": "Retain"}));
            if let Some(Value::Object(u)) = obj.pointer_mut("/spec/updateStrategy") {
                if u.get("type").and_then(Value::as_str) == Some("RollingUpdate") {
                    let r = u.entry("rollingUpdate").or_insert_with(|| json!({}));
                    if let Value::Object(r) = r {
                        default(r, "partition", json!(0));
                    }
                }
            }
            if let Some(Value::Array(templates)) = obj.pointer_mut("/spec/volumeClaimTemplates") {
                for t in templates {
                    if let Some(Value::Object(spec)) = t.get_mut("spec") {
                        default(spec, "volumeMode", json!("Filesystem"));
                    }
                    if let Value::Object(t) = t {
                        t.entry("status").or_insert_with(|| json!({"phase": "Pending"}));
                    }
                }
            }
            default_template(obj);
        }
        "jobs" => {
            default_job(obj);
            default_template(obj);
        }
        "cronjobs" => {
            let spec = obj_mut(obj, "spec");
            default(spec, "concurrencyPolicy", json!("Allow"));
            default(spec, "suspend", json!(false));
            default(spec, "successfulJobsHistoryLimit", json!(3));
            default(spec, "failedJobsHistoryLimit", json!(1));
            if let Some(Value::Object(spec)) = obj.pointer_mut("/spec/jobTemplate/spec/template/spec") {
                default_pod_spec(spec);
            }
        }
        "namespaces" => {
            let spec = obj_mut(obj, "spec");
            default(spec, "finalizers", json!(["kubernetes"]));
            let status = obj_mut(obj, "status");
            default(status, "phase", json!("Active"));
            let name = obj.pointer("/metadata/name").cloned();
            if let Some(name) = name {
                let meta = obj_mut(obj, "metadata");
                let labels = meta.entry("labels").or_insert_with(|| json!({}));
                if let Some(l) = labels.as_object_mut() {
                    l.insert("kubernetes.io/metadata.name".into(), name);
                }
            }
        }
        "persistentvolumes" => {
            let spec = obj_mut(obj, "spec");
            default(spec, "persistentVolumeReclaimPolicy", json!("Retain"));
            default(spec, "volumeMode", json!("Filesystem"));
            let status = obj_mut(obj, "status");
            default(status, "phase", json!("Pending"));
        }
        "persistentvolumeclaims" => {
            let spec = obj_mut(obj, "spec");
            default(spec, "volumeMode", json!("Filesystem"));
            let status = obj_mut(obj, "status");
            default(status, "phase", json!("Pending"));
        }
        "storageclasses" => {
            if let Some(m) = obj.as_object_mut() {
                default(m, "reclaimPolicy", json!("Delete"));
                default(m, "volumeBindingMode", json!("Immediate"));
            }
        }
        "csidrivers" => {
            let spec = obj_mut(obj, "spec");
            default(spec, "attachRequired", json!(true));
            default(spec, "podInfoOnMount", json!(false));
            default(spec, "requiresRepublish", json!(false));
            default(spec, "storageCapacity", json!(false));
            default(spec, "fsGroupPolicy", json!("ReadWriteOnceWithFSType"));
            default(spec, "volumeLifecycleModes", json!(["Persistent"]));
            default(spec, "seLinuxMount", json!(false));
        }
        "endpointslices" => {
            if let Some(Value::Array(ports)) = obj.get_mut("ports") {
                for p in ports.iter_mut().filter_map(|p| p.as_object_mut()) {
                    default(p, "protocol", json!("TCP"));
                    default(p, "name", json!(""));
                }
            }
        }
        _ => {}
    }
}

/// QoS class of a pod spec, as upstream computes it.
pub fn qos_class(spec: &Value) -> &'static str {
    let mut any = false;
    let mut guaranteed = true;
    let containers = ["containers", "initContainers"]
        .iter()
        .filter_map(|k| spec.get(*k).and_then(|c| c.as_array()))
        .flatten();
    for c in containers {
        let req = c.pointer("/resources/requests").and_then(|r| r.as_object());
        let lim = c.pointer("/resources/limits").and_then(|r| r.as_object());
        let relevant = |m: Option<&Map<String, Value>>| -> Vec<(String, Value)> {
            m.map(|m| {
                m.iter()
                    .filter(|(k, _)| *k == "cpu" || *k == "memory")
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default()
        };
        let r = relevant(req);
        let l = relevant(lim);
        if !r.is_empty() || !l.is_empty() {
            any = true;
        }
        if l.len() < 2 {
            guaranteed = false;
        }
        for (k, v) in &r {
            if l.iter().find(|(lk, _)| lk == k).map(|(_, lv)| lv) != Some(v) {
                guaranteed = false;
            }
        }
    }
    if !any {
        "BestEffort"
    } else if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

fn name_rule(res: &Resource) -> fn(&str) -> Vec<String> {
    match res.plural {
        "namespaces" => validation::dns1123_label,
        "services" => validation::dns1035_label,
        // upstream's ValidateRBACName
        "roles" | "clusterroles" | "rolebindings" | "clusterrolebindings" if res.group == crate::rbac::GROUP => validation::path_segment_name,
        // upstream: "we don't care what you call your certificate requests" (a path segment
        // still, to be addressable)
        "certificatesigningrequests" => validation::path_segment_name,
        _ => validation::dns1123_subdomain,
    }
}

fn required_str(obj: &Value, ptr: &str, field: &str, errs: &mut Vec<FieldError>) {
    if obj.pointer(ptr).and_then(|v| v.as_str()).map(|s| s.is_empty()).unwrap_or(true) {
        errs.push(FieldError::required(field, ""));
    }
}

fn validate_containers(spec: &Value, path: &str, errs: &mut Vec<FieldError>) {
    let containers = spec.get("containers").and_then(|c| c.as_array());
    match containers {
        None => errs.push(FieldError::required(format!("{path}.containers"), "")),
        Some(cs) if cs.is_empty() => errs.push(FieldError::required(format!("{path}.containers"), "")),
        Some(_) => {}
    }
    let mut names = std::collections::BTreeSet::new();
    for list in ["initContainers", "containers"] {
        for (i, c) in spec.get(list).and_then(|c| c.as_array()).into_iter().flatten().enumerate() {
            let p = format!("{path}.{list}[{i}]");
            match c.get("name").and_then(|n| n.as_str()) {
                None | Some("") => errs.push(FieldError::required(format!("{p}.name"), "")),
                Some(n) => {
                    for m in validation::dns1123_label(n) {
                        errs.push(FieldError::invalid(format!("{p}.name"), json!(n), &m));
                    }
                    if !names.insert(n.to_string()) {
                        errs.push(FieldError::duplicate(format!("{p}.name"), json!(n)));
                    }
                }
            }
            if c.get("image").and_then(|n| n.as_str()).map(|s| s.trim().is_empty()).unwrap_or(true) {
                errs.push(FieldError::required(format!("{p}.image"), ""));
            }
            for (j, port) in c.get("ports").and_then(|p| p.as_array()).into_iter().flatten().enumerate() {
                let cp = port.get("containerPort").and_then(|p| p.as_i64()).unwrap_or(0);
                if !(1..=65535).contains(&cp) {
                    errs.push(FieldError::invalid(
                        format!("{p}.ports[{j}].containerPort"),
                        json!(cp),
                        "must be between 1 and 65535, inclusive",
                    ));
                }
            }
        }
    }
    if let Some(rp) = spec.get("restartPolicy").and_then(|r| r.as_str()) {
        if !["Always", "OnFailure", "Never"].contains(&rp) {
            errs.push(FieldError::not_supported(
                format!("{path}.restartPolicy"),
                json!(rp),
                &["Always", "OnFailure", "Never"],
            ));
        }
    }
    let mut vol_names = std::collections::BTreeSet::new();
    for (i, v) in spec.get("volumes").and_then(|v| v.as_array()).into_iter().flatten().enumerate() {
        let n = v.get("name").and_then(|n| n.as_str()).unwrap_or("");
        if n.is_empty() {
            errs.push(FieldError::required(format!("{path}.volumes[{i}].name"), ""));
        } else if !vol_names.insert(n.to_string()) {
            errs.push(FieldError::duplicate(format!("{path}.volumes[{i}].name"), json!(n)));
        }
    }
}

fn selector_matches_template(obj: &Value, errs: &mut Vec<FieldError>) {
    let Some(sel) = obj.pointer("/spec/selector") else {
        errs.push(FieldError::required("spec.selector", ""));
        return;
    };
    let parsed: Result<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector, _> =
        serde_json::from_value(sel.clone());
    let Ok(parsed) = parsed else {
        errs.push(FieldError::invalid("spec.selector", sel.clone(), "invalid label selector"));
        return;
    };
    if parsed.match_labels.as_ref().map(|m| m.is_empty()).unwrap_or(true)
        && parsed.match_expressions.as_ref().map(|m| m.is_empty()).unwrap_or(true)
    {
        errs.push(FieldError::invalid("spec.selector", sel.clone(), "empty selector is invalid for deployment"));
        return;
    }
    let labels: BTreeMap<String, String> = obj
        .pointer("/spec/template/metadata/labels")
        .and_then(|l| serde_json::from_value(l.clone()).ok())
        .unwrap_or_default();
    match crate::selector::LabelSelector::from_api(&parsed) {
        Ok(s) => {
            if !s.matches(&labels) {
                errs.push(FieldError::invalid(
                    "spec.template.metadata.labels",
                    serde_json::to_value(&labels).unwrap_or(Value::Null),
                    "`selector` does not match template `labels`",
                ));
            }
        }
        Err(e) => errs.push(FieldError::invalid("spec.selector", sel.clone(), e.to_string())),
    }
}

/// Validation of a new object (422 causes when not empty).
pub fn validate(res: &Resource, obj: &Value) -> Vec<FieldError> {
    if let Some(c) = res.custom {
        return crate::crd::objects::validate(res, c, obj);
    }
    let meta = obj.get("metadata").cloned().unwrap_or(Value::Null);
    let mut errs = if res.is("customresourcedefinitions") {
        // apiextensions validates metadata with apimachinery's generic rules (its own
        // finalizer has no domain prefix)
        validation::validate_generic_object_meta(&meta, res.namespaced, name_rule(res))
    } else {
        validation::validate_object_meta(&meta, res.namespaced, name_rule(res))
    };
    match res.plural {
        "customresourcedefinitions" => errs.extend(crate::crd::definition::validate(obj, None)),
        "certificatesigningrequests" if crate::certificates::is_csr(res) => errs.extend(crate::certificates::validate(obj)),
        "pods" => {
            if let Some(spec) = obj.get("spec") {
                validate_containers(spec, "spec", &mut errs);
            } else {
                errs.push(FieldError::required("spec", ""));
            }
        }
        "deployments" | "replicasets" | "daemonsets" => {
            selector_matches_template(obj, &mut errs);
            match obj.pointer("/spec/template/spec") {
                Some(spec) => validate_containers(spec, "spec.template.spec", &mut errs),
                None => errs.push(FieldError::required("spec.template.spec.containers", "")),
            }
            if let Some(r) = obj.pointer("/spec/replicas").and_then(|r| r.as_i64()) {
                if r < 0 {
                    errs.push(FieldError::invalid(
                        "spec.replicas",
                        json!(r),
                        "must be greater than or equal to 0",
                    ));
                }
            }
        }
        "services" => {
            let ty = obj.pointer("/spec/type").and_then(|t| t.as_str()).unwrap_or("ClusterIP");
            let types = ["ClusterIP", "NodePort", "LoadBalancer", "ExternalName"];
            if !types.contains(&ty) {
                errs.push(FieldError::not_supported("spec.type", json!(ty), &types));
            }
            let ports = obj.pointer("/spec/ports").and_then(|p| p.as_array());
            if ty != "ExternalName" && ports.map(|p| p.is_empty()).unwrap_or(true)
                && obj.pointer("/spec/clusterIP").and_then(|c| c.as_str()) != Some("None")
            {
                errs.push(FieldError::required("spec.ports", ""));
            }
            if ty == "ExternalName" {
                required_str(obj, "/spec/externalName", "spec.externalName", &mut errs);
            }
            let multi = ports.map(|p| p.len() > 1).unwrap_or(false);
            let mut seen = std::collections::BTreeSet::new();
            for (i, p) in ports.into_iter().flatten().enumerate() {
                let port = p.get("port").and_then(|p| p.as_i64()).unwrap_or(0);
                if !(1..=65535).contains(&port) {
                    errs.push(FieldError::invalid(
                        format!("spec.ports[{i}].port"),
                        json!(port),
                        "must be between 1 and 65535, inclusive",
                    ));
                }
                let name = p.get("name").and_then(|n| n.as_str()).unwrap_or("");
                if multi && name.is_empty() {
                    errs.push(FieldError::required(format!("spec.ports[{i}].name"), ""));
                }
                let proto = p.get("protocol").and_then(|n| n.as_str()).unwrap_or("TCP");
                if !seen.insert((port, proto.to_string())) {
                    errs.push(FieldError::duplicate(
                        format!("spec.ports[{i}]"),
                        json!({"port": port, "protocol": proto}),
                    ));
                }
            }
        }
        "events" => {
            required_str(obj, "/involvedObject/name", "involvedObject.name", &mut errs);
        }
        "leases" | "configmaps" | "secrets" | "endpoints" | "serviceaccounts" | "nodes"
        | "namespaces" | "endpointslices" | "csinodes" | "csidrivers" | "volumeattachments" => {}
        "storageclasses" => {
            required_str(obj, "/provisioner", "provisioner", &mut errs);
        }
        "csistoragecapacities" => {
            // Upstream's ValidateCSIStorageCapacity: a storage class name that is a valid
            // object name; capacity and maximumVolumeSize, when set, not negative.
            required_str(obj, "/storageClassName", "storageClassName", &mut errs);
            for (ptr, field) in [("/capacity", "capacity"), ("/maximumVolumeSize", "maximumVolumeSize")] {
                if let Some(q) = obj.pointer(ptr).and_then(|v| v.as_str()) {
                    if k8s_semantics::quantity::scaled(q, 1).is_none_or(|v| v < 0) {
                        errs.push(FieldError::invalid(field, json!(q), "must be greater than or equal to 0"));
                    }
                }
            }
        }
        "persistentvolumeclaims" => {
            if obj.pointer("/spec/accessModes").and_then(|a| a.as_array()).map(|a| a.is_empty()).unwrap_or(true) {
                errs.push(FieldError::required("spec.accessModes", "at least 1 access mode is required"));
            }
            if obj.pointer("/spec/resources/requests/storage").is_none() {
                errs.push(FieldError::required("spec.resources[storage]", ""));
            }
        }
        "statefulsets" => validate_stateful_set(obj, &mut errs),
        "jobs" => validate_job(obj, "/spec", "spec", &mut errs),
        "cronjobs" => validate_cron_job(obj, &mut errs),
        "poddisruptionbudgets" => validate_pdb(obj, &mut errs),
        "controllerrevisions" if obj.get("revision").and_then(Value::as_i64).is_none_or(|r| r < 0) => {
            errs.push(FieldError::invalid("revision", obj.get("revision").cloned().unwrap_or(Value::Null), "must be greater than or equal to 0"));
        }
        "volumesnapshotclasses" => {
            required_str(obj, "/driver", "driver", &mut errs);
            deletion_policy(obj, "/deletionPolicy", "deletionPolicy", &mut errs);
        }
        "volumesnapshots" => validate_volume_snapshot(obj, &mut errs),
        "volumesnapshotcontents" => validate_volume_snapshot_content(obj, &mut errs),
        plural if res.group == crate::rbac::GROUP => errs.extend(crate::rbac::validation::validate(plural, obj)),
        "persistentvolumes" => {
            if obj.pointer("/spec/capacity/storage").is_none() {
                errs.push(FieldError::required("spec.capacity", ""));
            }
            if obj.pointer("/spec/accessModes").and_then(|a| a.as_array()).map(|a| a.is_empty()).unwrap_or(true) {
                errs.push(FieldError::required("spec.accessModes", ""));
            }
        }
        _ => {}
    }
    errs
}

fn non_negative(obj: &Value, ptr: &str, field: &str, errs: &mut Vec<FieldError>) {
    if let Some(v) = obj.pointer(ptr).and_then(Value::as_i64) {
        if v < 0 {
            errs.push(FieldError::invalid(field, json!(v), "must be greater than or equal to 0"));
        }
    }
}

fn one_of(obj: &Value, ptr: &str, field: &str, allowed: &[&str], errs: &mut Vec<FieldError>) {
    if let Some(v) = obj.pointer(ptr).and_then(Value::as_str) {
        if !allowed.contains(&v) {
            errs.push(FieldError::not_supported(field, json!(v), allowed));
        }
    }
}

/// Upstream's ValidateStatefulSet (the parts users meet): the selector selects the template,
/// known policies, non-negative numbers, a pod template whose restartPolicy is Always.
fn validate_stateful_set(obj: &Value, errs: &mut Vec<FieldError>) {
    selector_matches_template(obj, errs);
    match obj.pointer("/spec/template/spec") {
        Some(spec) => validate_containers(spec, "spec.template.spec", errs),
        None => errs.push(FieldError::required("spec.template.spec.containers", "")),
    }
    non_negative(obj, "/spec/replicas", "spec.replicas", errs);
    non_negative(obj, "/spec/minReadySeconds", "spec.minReadySeconds", errs);
    non_negative(obj, "/spec/updateStrategy/rollingUpdate/partition", "spec.updateStrategy.rollingUpdate.partition", errs);
    non_negative(obj, "/spec/ordinals/start", "spec.ordinals.start", errs);
    one_of(obj, "/spec/podManagementPolicy", "spec.podManagementPolicy", &["OrderedReady", "Parallel"], errs);
    one_of(obj, "/spec/updateStrategy/type", "spec.updateStrategy.type", &["RollingUpdate", "OnDelete"], errs);
    for (ptr, f) in [("/spec/persistentVolumeClaimRetentionPolicy/whenDeleted", "whenDeleted"), ("/spec/persistentVolumeClaimRetentionPolicy/whenScaled", "whenScaled")] {
        one_of(obj, ptr, &format!("spec.persistentVolumeClaimRetentionPolicy.{f}"), &["Retain", "Delete"], errs);
    }
    one_of(obj, "/spec/template/spec/restartPolicy", "spec.template.spec.restartPolicy", &["Always"], errs);
}

/// Upstream's ValidateJobSpec (the parts users meet), for a Job's `spec` at `ptr` (a
/// CronJob's `spec.jobTemplate.spec` too).
fn validate_job(obj: &Value, ptr: &str, path: &str, errs: &mut Vec<FieldError>) {
    for f in ["parallelism", "completions", "backoffLimit", "backoffLimitPerIndex", "maxFailedIndexes"] {
        non_negative(obj, &format!("{ptr}/{f}"), &format!("{path}.{f}"), errs);
    }
    if let Some(d) = obj.pointer(&format!("{ptr}/activeDeadlineSeconds")).and_then(Value::as_i64) {
        if d <= 0 {
            errs.push(FieldError::invalid(format!("{path}.activeDeadlineSeconds"), json!(d), "must be greater than 0"));
        }
    }
    one_of(obj, &format!("{ptr}/completionMode"), &format!("{path}.completionMode"), &["NonIndexed", "Indexed"], errs);
    if obj.pointer(&format!("{ptr}/completionMode")).and_then(Value::as_str) == Some("Indexed")
        && obj.pointer(&format!("{ptr}/completions")).is_none_or(Value::is_null)
    {
        errs.push(FieldError::required(format!("{path}.completions"), "when completion mode is Indexed"));
    }
    match obj.pointer(&format!("{ptr}/template/spec")) {
        Some(spec) => validate_containers(spec, &format!("{path}.template.spec"), errs),
        None => errs.push(FieldError::required(format!("{path}.template.spec.containers"), "")),
    }
    match obj.pointer(&format!("{ptr}/template/spec/restartPolicy")).and_then(Value::as_str) {
        Some("OnFailure" | "Never") => {}
        Some(other) => errs.push(FieldError::not_supported(format!("{path}.template.spec.restartPolicy"), json!(other), &["OnFailure", "Never"])),
        None => errs.push(FieldError::required(format!("{path}.template.spec.restartPolicy"), "")),
    }
}

/// Upstream's ValidateCronJob (the parts users meet): the schedule, the time zone, the
/// concurrency policy, the Job template.
fn validate_cron_job(obj: &Value, errs: &mut Vec<FieldError>) {
    match obj.pointer("/spec/schedule").and_then(Value::as_str) {
        None | Some("") => errs.push(FieldError::required("spec.schedule", "")),
        Some(schedule) => {
            if schedule.contains("TZ") {
                errs.push(FieldError::invalid("spec.schedule", json!(schedule), "cannot use TZ or CRON_TZ in schedule, use timeZone field instead"));
            } else if let Err(e) = k8s_semantics::cron::Schedule::parse(schedule) {
                errs.push(FieldError::invalid("spec.schedule", json!(schedule), e.to_string()));
            }
        }
    }
    if let Some(tz) = obj.pointer("/spec/timeZone").and_then(Value::as_str) {
        if k8s_semantics::cron::time_zone(tz).is_err() {
            errs.push(FieldError::invalid("spec.timeZone", json!(tz), format!("unknown time zone {tz}")));
        }
    }
    one_of(obj, "/spec/concurrencyPolicy", "spec.concurrencyPolicy", &["Allow", "Forbid", "Replace"], errs);
    non_negative(obj, "/spec/startingDeadlineSeconds", "spec.startingDeadlineSeconds", errs);
    non_negative(obj, "/spec/successfulJobsHistoryLimit", "spec.successfulJobsHistoryLimit", errs);
    non_negative(obj, "/spec/failedJobsHistoryLimit", "spec.failedJobsHistoryLimit", errs);
    validate_job(obj, "/spec/jobTemplate/spec", "spec.jobTemplate.spec", errs);
}

/// Upstream's ValidatePodDisruptionBudgetSpec: minAvailable or maxUnavailable, not both;
/// integers not negative, percentages up to 100%.
fn validate_pdb(obj: &Value, errs: &mut Vec<FieldError>) {
    let min = obj.pointer("/spec/minAvailable").filter(|v| !v.is_null());
    let max = obj.pointer("/spec/maxUnavailable").filter(|v| !v.is_null());
    if min.is_some() && max.is_some() {
        errs.push(FieldError::invalid("spec", obj.pointer("/spec").cloned().unwrap_or(Value::Null), "minAvailable and maxUnavailable cannot be both set"));
    }
    for (v, f) in [(min, "spec.minAvailable"), (max, "spec.maxUnavailable")] {
        match v {
            Some(Value::Number(n)) if n.as_i64().is_some_and(|n| n < 0) => {
                errs.push(FieldError::invalid(f, v.cloned().unwrap_or(Value::Null), "must be greater than or equal to 0"));
            }
            Some(Value::String(p)) => {
                let pct = p.strip_suffix('%').and_then(|n| n.parse::<i64>().ok());
                match pct {
                    None => errs.push(FieldError::invalid(f, json!(p), "a valid percent string must be a numeric string followed by an ending '%' (e.g. '1%',  or '93%', regex used for validation is '[0-9]+%')")),
                    Some(n) if n > 100 => errs.push(FieldError::invalid(f, json!(p), "must not be greater than 100%")),
                    Some(_) => {}
                }
            }
            _ => {}
        }
    }
    one_of(obj, "/spec/unhealthyPodEvictionPolicy", "spec.unhealthyPodEvictionPolicy", &["IfHealthyBudget", "AlwaysAllow"], errs);
}

/// A snapshot deletionPolicy: required, Delete or Retain (the CRDs' enum).
fn deletion_policy(obj: &Value, ptr: &str, field: &str, errs: &mut Vec<FieldError>) {
    match obj.pointer(ptr).and_then(Value::as_str) {
        None | Some("") => errs.push(FieldError::required(field, "")),
        Some("Delete" | "Retain") => {}
        Some(other) => errs.push(FieldError::not_supported(field, json!(other), &["Delete", "Retain"])),
    }
}

/// Exactly one of two optional strings under `ptr` (the snapshot CRDs' CEL rules).
fn exactly_one(obj: &Value, ptr: &str, field: &str, keys: [&str; 2], message: &str, errs: &mut Vec<FieldError>) {
    let set = |k: &str| obj.pointer(&format!("{ptr}/{k}")).is_some_and(|v| !v.is_null());
    if set(keys[0]) == set(keys[1]) {
        errs.push(FieldError::invalid(field, json!("object"), message));
    }
}

/// The VolumeSnapshot CRD's validation: a source with exactly one of its fields, a class name
/// that is not empty when set.
fn validate_volume_snapshot(obj: &Value, errs: &mut Vec<FieldError>) {
    if obj.pointer("/spec/source").is_none() {
        errs.push(FieldError::required("spec.source", ""));
        return;
    }
    exactly_one(
        obj,
        "/spec/source",
        "spec.source",
        ["persistentVolumeClaimName", "volumeSnapshotContentName"],
        "Exactly one of persistentVolumeClaimName and volumeSnapshotContentName should be specified",
        errs,
    );
    if obj.pointer("/spec/volumeSnapshotClassName").and_then(Value::as_str) == Some("") {
        errs.push(FieldError::invalid(
            "spec.volumeSnapshotClassName",
            json!(""),
            "volumeSnapshotClassName must not be the empty string when set",
        ));
    }
}

/// The VolumeSnapshotContent CRD's validation: driver, deletion policy, exactly one source,
/// the snapshot it belongs to named with its namespace.
fn validate_volume_snapshot_content(obj: &Value, errs: &mut Vec<FieldError>) {
    required_str(obj, "/spec/driver", "spec.driver", errs);
    deletion_policy(obj, "/spec/deletionPolicy", "spec.deletionPolicy", errs);
    exactly_one(
        obj,
        "/spec/source",
        "spec.source",
        ["volumeHandle", "snapshotHandle"],
        "volumeHandle or snapshotHandle must be set",
        errs,
    );
    let named = |k: &str| obj.pointer(&format!("/spec/volumeSnapshotRef/{k}")).and_then(Value::as_str).is_some_and(|v| !v.is_empty());
    if !(named("name") && named("namespace")) {
        errs.push(FieldError::invalid(
            "spec.volumeSnapshotRef",
            json!("object"),
            "both spec.volumeSnapshotRef.name and spec.volumeSnapshotRef.namespace must be set",
        ));
    }
}

fn immutable(old: &Value, new: &Value, ptr: &str, field: &str, errs: &mut Vec<FieldError>) {
    let a = old.pointer(ptr);
    let b = new.pointer(ptr);
    if a != b {
        errs.push(FieldError::immutable(field, b.cloned().unwrap_or(Value::Null)));
    }
}

/// Rules an update must keep (on top of [`validate`]).
pub fn validate_update(res: &Resource, old: &Value, new: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if res.custom.is_some() {
        return errs;
    }
    if res.group == crate::rbac::GROUP {
        errs.extend(crate::rbac::validation::validate_update(res.plural, old, new));
    }
    match res.plural {
        "customresourcedefinitions" => {
            // validate() checked the new object alone; these are the rules between the two
            let all = crate::crd::definition::validate(new, Some(old));
            let alone = crate::crd::definition::validate(new, None);
            errs.extend(all.into_iter().filter(|e| !alone.contains(e)));
        }
        "pods" => {
            // Upstream lets only images, activeDeadlineSeconds, tolerations (additions) and
            // terminationGracePeriodSeconds change.
            let strip = |v: &Value| -> Value {
                let mut s = v.get("spec").cloned().unwrap_or(Value::Null);
                for list in ["containers", "initContainers"] {
                    if let Some(Value::Array(cs)) = s.get_mut(list) {
                        for c in cs.iter_mut().filter_map(|c| c.as_object_mut()) {
                            c.remove("image");
                        }
                    }
                }
                if let Some(m) = s.as_object_mut() {
                    m.remove("activeDeadlineSeconds");
                    m.remove("tolerations");
                    m.remove("terminationGracePeriodSeconds");
                    // binding sets it once
                    if old.pointer("/spec/nodeName").is_none() {
                        m.remove("nodeName");
                    }
                }
                s
            };
            if strip(old) != strip(new) {
                errs.push(FieldError::forbidden(
                    "spec",
                    "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)",
                ));
            }
        }
        "services"
            if old.pointer("/spec/clusterIP").is_some()
                && new.pointer("/spec/type").and_then(|t| t.as_str()) != Some("ExternalName")
            => {
                immutable(old, new, "/spec/clusterIP", "spec.clusterIP", &mut errs);
            }
        "deployments" | "replicasets" | "daemonsets" => {
            immutable(old, new, "/spec/selector", "spec.selector", &mut errs);
        }
        "configmaps" | "secrets" => {
            if old.get("immutable") == Some(&Value::Bool(true)) {
                for f in ["data", "binaryData", "stringData", "immutable"] {
                    if old.get(f) != new.get(f) {
                        errs.push(FieldError::forbidden(
                            f,
                            "field is immutable when `immutable` is set",
                        ));
                    }
                }
            }
            if res.plural == "secrets" {
                immutable(old, new, "/type", "type", &mut errs);
            }
        }
        "persistentvolumeclaims" => {
            let strip = |v: &Value| -> Value {
                let mut s = v.get("spec").cloned().unwrap_or(Value::Null);
                if let Some(m) = s.as_object_mut() {
                    m.remove("resources");
                    if old.pointer("/spec/volumeName").is_none() {
                        m.remove("volumeName");
                    }
                }
                s
            };
            if strip(old) != strip(new) {
                errs.push(FieldError::forbidden(
                    "spec",
                    "spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims",
                ));
            }
        }
        "storageclasses" => {
            for (ptr, f) in [("/provisioner", "provisioner"), ("/parameters", "parameters"), ("/reclaimPolicy", "reclaimPolicy"), ("/volumeBindingMode", "volumeBindingMode")] {
                immutable(old, new, ptr, f, &mut errs);
            }
        }
        "csidrivers" => immutable(old, new, "/spec/attachRequired", "spec.attachRequired", &mut errs),
        "volumeattachments" => immutable(old, new, "/spec", "spec", &mut errs),
        "statefulsets" => {
            // Upstream: everything but replicas, ordinals, template, updateStrategy,
            // persistentVolumeClaimRetentionPolicy, minReadySeconds and revisionHistoryLimit.
            for (ptr, f) in [("/spec/selector", "selector"), ("/spec/serviceName", "serviceName"), ("/spec/podManagementPolicy", "podManagementPolicy"), ("/spec/volumeClaimTemplates", "volumeClaimTemplates")] {
                if old.pointer(ptr) != new.pointer(ptr) {
                    errs.push(FieldError::forbidden(
                        "spec",
                        format!("updates to statefulset spec for fields other than 'replicas', 'ordinals', 'template', 'updateStrategy', 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden ({f} changed)"),
                    ));
                    break;
                }
            }
        }
        "jobs" => {
            immutable(old, new, "/spec/selector", "spec.selector", &mut errs);
            immutable(old, new, "/spec/completionMode", "spec.completionMode", &mut errs);
            if old.pointer("/spec/template") != new.pointer("/spec/template") && new.pointer("/spec/suspend").and_then(Value::as_bool) != Some(true) {
                immutable(old, new, "/spec/template", "spec.template", &mut errs);
            }
        }
        "controllerrevisions" => immutable(old, new, "/data", "data", &mut errs),
        "volumesnapshots" => {
            for (ptr, f) in [
                ("/spec/source/persistentVolumeClaimName", "persistentVolumeClaimName"),
                ("/spec/source/volumeSnapshotContentName", "volumeSnapshotContentName"),
            ] {
                if old.pointer(ptr) != new.pointer(ptr) {
                    errs.push(FieldError::invalid("spec.source", json!("object"), format!("{f} is immutable")));
                }
            }
        }
        "volumesnapshotcontents" => {
            for (ptr, f) in [("/spec/source/volumeHandle", "volumeHandle"), ("/spec/source/snapshotHandle", "snapshotHandle")] {
                if old.pointer(ptr) != new.pointer(ptr) {
                    errs.push(FieldError::invalid("spec.source", json!("object"), format!("{f} is immutable")));
                }
            }
            if old.pointer("/spec/sourceVolumeMode") != new.pointer("/spec/sourceVolumeMode") {
                errs.push(FieldError::invalid("spec", json!("object"), "sourceVolumeMode is immutable"));
            }
        }
        _ => {}
    }
    errs
}

/// Whether updates through the main resource keep the stored status (status is written through
/// the status subresource only).
pub fn main_keeps_status(res: &Resource) -> bool {
    res.has(crate::resources::Sub::Status)
}

/// Copies the part an endpoint may not change from `old` into `new`.
/// For the main resource: status; for the status subresource: everything but status
/// (metadata labels and annotations may change through status, as upstream allows); for a
/// CertificateSigningRequest's approval: everything but status.conditions (upstream's
/// csrApprovalStrategy).
pub fn keep_unchangeable(res: &Resource, endpoint: crate::api::Endpoint, old: &Value, new: &mut Value) {
    let Some(n) = new.as_object_mut() else { return };
    if endpoint == crate::api::Endpoint::Approval {
        let conditions = n.get("status").and_then(|s| s.get("conditions")).cloned();
        let mut kept = old.clone();
        match (conditions, kept.as_object_mut()) {
            (Some(c), Some(k)) => {
                let status = k.entry("status").or_insert_with(|| Value::Object(Map::new()));
                if let Some(s) = status.as_object_mut() {
                    s.insert("conditions".into(), c);
                }
            }
            (None, Some(k)) => {
                if let Some(s) = k.get_mut("status").and_then(Value::as_object_mut) {
                    s.remove("conditions");
                }
            }
            _ => {}
        }
        *new = kept;
        return;
    }
    if endpoint == crate::api::Endpoint::Status {
        let status = n.remove("status");
        let meta = n.remove("metadata");
        *n = old.as_object().cloned().unwrap_or_default();
        if let Some(s) = status {
            n.insert("status".into(), s);
        } else {
            n.remove("status");
        }
        if let (Some(Value::Object(new_meta)), Some(Value::Object(m))) = (meta, n.get_mut("metadata")) {
            for k in ["labels", "annotations"] {
                match new_meta.get(k) {
                    Some(v) => {
                        m.insert(k.into(), v.clone());
                    }
                    None => {
                        m.remove(k);
                    }
                }
            }
        }
    } else if main_keeps_status(res) {
        match old.get("status") {
            Some(s) => {
                n.insert("status".into(), s.clone());
            }
            None => {
                n.remove("status");
            }
        }
    }
}

/// Whether the change from `old` to `new` should bump metadata.generation.
pub fn spec_changed(old: &Value, new: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(m) = v.as_object_mut() {
            m.remove("metadata");
            m.remove("status");
        }
        v
    };
    strip(old) != strip(new)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn workload_kinds_get_upstreams_defaults() {
        let find = |g: &str, plural: &str| crate::resources::find(g, "v1", plural).unwrap();
        let pod = json!({"spec": {"containers": [{"name": "c", "image": "i"}], "restartPolicy": "Never"}});
        let mut job = json!({"metadata": {"name": "pi", "namespace": "d", "uid": "u-1"}, "spec": {"template": pod}});
        apply_defaults(find("batch", "jobs"), &mut job);
        assert_eq!(job["spec"]["completions"], 1);
        assert_eq!(job["spec"]["parallelism"], 1);
        assert_eq!(job["spec"]["backoffLimit"], 6);
        assert_eq!(job["spec"]["completionMode"], "NonIndexed");
        assert_eq!(job["spec"]["podReplacementPolicy"], "TerminatingOrFailed");
        assert_eq!(job["spec"]["selector"], json!({"matchLabels": {"batch.kubernetes.io/controller-uid": "u-1"}}));
        assert_eq!(job["spec"]["template"]["metadata"]["labels"]["batch.kubernetes.io/job-name"], "pi");
        assert_eq!(job["spec"]["template"]["metadata"]["labels"]["controller-uid"], "u-1");
        assert!(validate(find("batch", "jobs"), &job).is_empty(), "{:?}", validate(find("batch", "jobs"), &job));
        // parallelism alone: completions stays unset (a work queue).
        let mut queue = json!({"metadata": {"name": "q", "uid": "u-2"}, "spec": {"parallelism": 3, "template": pod}});
        apply_defaults(find("batch", "jobs"), &mut queue);
        assert!(queue["spec"].get("completions").is_none());
        let mut manual = json!({"metadata": {"name": "m", "uid": "u-3"}, "spec": {"manualSelector": true, "selector": {"matchLabels": {"a": "b"}}, "template": pod}});
        apply_defaults(find("batch", "jobs"), &mut manual);
        assert_eq!(manual["spec"]["selector"], json!({"matchLabels": {"a": "b"}}));

        let mut sts = json!({"metadata": {"name": "web", "namespace": "d"}, "spec": {"selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}},
            "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"]}}]}});
        apply_defaults(find("apps", "statefulsets"), &mut sts);
        assert_eq!(sts["spec"]["replicas"], 1);
        assert_eq!(sts["spec"]["podManagementPolicy"], "OrderedReady");
        assert_eq!(sts["spec"]["updateStrategy"], json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}));
        assert_eq!(sts["spec"]["revisionHistoryLimit"], 10);
        assert_eq!(sts["spec"]["persistentVolumeClaimRetentionPolicy"], json!({"whenDeleted": "Retain", "whenScaled": "Retain"}));
        assert_eq!(sts["spec"]["volumeClaimTemplates"][0]["spec"]["volumeMode"], "Filesystem");
        assert_eq!(sts["spec"]["template"]["spec"]["restartPolicy"], "Always");
        assert!(validate(find("apps", "statefulsets"), &sts).is_empty());

        let mut cj = json!({"metadata": {"name": "tick", "namespace": "d"}, "spec": {"schedule": "*/1 * * * *", "jobTemplate": {"spec": {"template": pod}}}});
        apply_defaults(find("batch", "cronjobs"), &mut cj);
        assert_eq!(
            (&cj["spec"]["concurrencyPolicy"], &cj["spec"]["suspend"], &cj["spec"]["successfulJobsHistoryLimit"], &cj["spec"]["failedJobsHistoryLimit"]),
            (&json!("Allow"), &json!(false), &json!(3), &json!(1))
        );
        assert!(validate(find("batch", "cronjobs"), &cj).is_empty(), "{:?}", validate(find("batch", "cronjobs"), &cj));
    }

    #[test]
    fn workload_bad_input_gets_field_causes() {
        let find = |g: &str, plural: &str| crate::resources::find(g, "v1", plural).unwrap();
        let messages = |g: &str, plural: &str, obj: Value| -> Vec<String> { validate(find(g, plural), &obj).iter().map(FieldError::message).collect() };
        let pod = json!({"spec": {"containers": [{"name": "c", "image": "i"}], "restartPolicy": "Never"}});
        let cron = |schedule: &str, tz: Option<&str>| {
            let mut cj = json!({"metadata": {"name": "c", "namespace": "d"}, "spec": {"schedule": schedule, "jobTemplate": {"spec": {"template": pod}}}});
            if let Some(tz) = tz {
                cj["spec"]["timeZone"] = json!(tz);
            }
            messages("batch", "cronjobs", cj)
        };
        assert_eq!(cron("* * *", None), ["spec.schedule: Invalid value: \"* * *\": expected exactly 5 fields, found 3: * * *"]);
        assert_eq!(cron("0 0 * * *", Some("Mars/Olympus")), ["spec.timeZone: Invalid value: \"Mars/Olympus\": unknown time zone Mars/Olympus"]);
        assert_eq!(cron("CRON_TZ=UTC 0 0 * * *", None), ["spec.schedule: Invalid value: \"CRON_TZ=UTC 0 0 * * *\": cannot use TZ or CRON_TZ in schedule, use timeZone field instead"]);
        assert!(cron("0 0 * * *", Some("Europe/Paris")).is_empty());

        let job = messages("batch", "jobs", json!({"metadata": {"name": "j", "namespace": "d"}, "spec": {"parallelism": -1, "template": pod}}));
        assert_eq!(job, ["spec.parallelism: Invalid value: -1: must be greater than or equal to 0"]);
        let always = messages("batch", "jobs", json!({"metadata": {"name": "j", "namespace": "d"}, "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i"}], "restartPolicy": "Always"}}}}));
        assert_eq!(always, ["spec.template.spec.restartPolicy: Unsupported value: \"Always\": supported values: \"OnFailure\", \"Never\""]);

        let sts = messages("apps", "statefulsets", json!({"metadata": {"name": "web", "namespace": "d"}, "spec": {
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "db"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}}));
        assert_eq!(sts.len(), 1, "{sts:?}");
        assert!(sts[0].starts_with("spec.template.metadata.labels: Invalid value:"), "{sts:?}");

        let pdb = messages("policy", "poddisruptionbudgets", json!({"metadata": {"name": "p", "namespace": "d"}, "spec": {"minAvailable": 1, "maxUnavailable": "50%"}}));
        assert_eq!(pdb.len(), 1, "{pdb:?}");
        assert!(pdb[0].ends_with("minAvailable and maxUnavailable cannot be both set"), "{pdb:?}");
        let pct = messages("policy", "poddisruptionbudgets", json!({"metadata": {"name": "p", "namespace": "d"}, "spec": {"maxUnavailable": "150%"}}));
        assert_eq!(pct, ["spec.maxUnavailable: Invalid value: \"150%\": must not be greater than 100%"]);
    }

    #[test]
    fn snapshot_kinds_are_validated_as_their_crds_rules_say() {
        let res = |plural: &str| crate::resources::find("snapshot.storage.k8s.io", "v1", plural).unwrap();
        let messages = |plural: &str, obj: Value| -> Vec<String> { validate(res(plural), &obj).iter().map(FieldError::message).collect() };
        let meta = json!({"name": "s", "namespace": "default"});
        assert!(messages("volumesnapshots", json!({"metadata": meta, "spec": {"source": {"persistentVolumeClaimName": "data"}}})).is_empty());
        let both = messages(
            "volumesnapshots",
            json!({"metadata": meta, "spec": {"source": {"persistentVolumeClaimName": "a", "volumeSnapshotContentName": "b"}}}),
        );
        assert_eq!(both, ["spec.source: Invalid value: \"object\": Exactly one of persistentVolumeClaimName and volumeSnapshotContentName should be specified"]);
        assert_eq!(messages("volumesnapshots", json!({"metadata": meta, "spec": {"source": {}}})).len(), 1);
        assert_eq!(messages("volumesnapshots", json!({"metadata": meta, "spec": {}})), ["spec.source: Required value"]);
        let empty_class = messages("volumesnapshots", json!({"metadata": meta, "spec": {"source": {"persistentVolumeClaimName": "a"}, "volumeSnapshotClassName": ""}}));
        assert!(empty_class[0].contains("must not be the empty string"), "{empty_class:?}");

        let cmeta = json!({"name": "c"});
        let good = json!({"metadata": cmeta, "spec": {"driver": "d", "deletionPolicy": "Delete", "source": {"volumeHandle": "v"},
                                                     "volumeSnapshotRef": {"name": "s", "namespace": "default"}}});
        assert!(messages("volumesnapshotcontents", good.clone()).is_empty());
        let bad = messages("volumesnapshotcontents", json!({"metadata": cmeta, "spec": {"deletionPolicy": "Keep", "source": {"volumeHandle": "v", "snapshotHandle": "s"},
                                                                                       "volumeSnapshotRef": {"name": "s"}}}));
        assert_eq!(bad.len(), 4, "{bad:?}");
        assert!(bad.iter().any(|m| m == "spec.deletionPolicy: Unsupported value: \"Keep\": supported values: \"Delete\", \"Retain\""), "{bad:?}");
        let mut moved = good.clone();
        moved["spec"]["source"]["volumeHandle"] = json!("other");
        let update: Vec<String> = validate_update(res("volumesnapshotcontents"), &good, &moved).iter().map(FieldError::message).collect();
        assert_eq!(update, ["spec.source: Invalid value: \"object\": volumeHandle is immutable"]);

        assert_eq!(
            messages("volumesnapshotclasses", json!({"metadata": cmeta})),
            ["driver: Required value", "deletionPolicy: Required value"]
        );
    }

    #[test]
    fn secrets_take_string_data_into_data() {
        let secrets = crate::resources::find("", "v1", "secrets").unwrap();
        let mut s = json!({"metadata": {"name": "s"}, "data": {"a": "eA==", "b": "eA=="}, "stringData": {"b": "yz", "c": "w"}});
        apply_defaults(secrets, &mut s);
        assert_eq!(s, json!({"metadata": {"name": "s"}, "type": "Opaque", "data": {"a": "eA==", "b": "eXo=", "c": "dw=="}}));
    }

    #[test]
    fn qos() {
        assert_eq!(qos_class(&json!({"containers":[{"name":"a"}]})), "BestEffort");
        assert_eq!(
            qos_class(&json!({"containers":[{"resources":{"requests":{"cpu":"1"}}}]})),
            "Burstable"
        );
        assert_eq!(
            qos_class(&json!({"containers":[{"resources":{"limits":{"cpu":"1","memory":"1Gi"},"requests":{"cpu":"1","memory":"1Gi"}}}]})),
            "Guaranteed"
        );
    }

    #[test]
    fn pod_defaults() {
        let pods = crate::resources::find("", "v1", "pods").unwrap();
        let mut p = json!({"metadata":{"name":"a"},"spec":{"containers":[{"name":"c","image":"busybox","ports":[{"containerPort":80}]}]}});
        apply_defaults(pods, &mut p);
        assert_eq!(p["spec"]["restartPolicy"], "Always");
        assert_eq!(p["spec"]["containers"][0]["imagePullPolicy"], "Always");
        assert_eq!(p["spec"]["containers"][0]["ports"][0]["protocol"], "TCP");
        assert_eq!(p["status"]["phase"], "Pending");
        assert_eq!(p["status"]["qosClass"], "BestEffort");
        let mut p = json!({"metadata":{"name":"a"},"spec":{"containers":[{"name":"c","image":"reg:5000/busybox:1.36"}]}});
        apply_defaults(pods, &mut p);
        assert_eq!(p["spec"]["containers"][0]["imagePullPolicy"], "IfNotPresent");
    }

    #[test]
    fn default_toleration_seconds_for_pods_only() {
        let pods = crate::resources::find("", "v1", "pods").unwrap();
        let mut p = json!({"metadata":{"name":"a"},"spec":{"containers":[{"name":"c","image":"i"}]}});
        apply_defaults(pods, &mut p);
        assert_eq!(
            p["spec"]["tolerations"],
            json!([
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
            ])
        );
        // idempotent
        let before = p.clone();
        apply_defaults(pods, &mut p);
        assert_eq!(p, before);
        // an existing toleration for one of them (or for everything) is kept and not doubled
        let own = json!({"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 6000});
        let mut p = json!({"metadata":{"name":"a"},"spec":{"containers":[{"name":"c","image":"i"}],"tolerations":[own.clone()]}});
        apply_defaults(pods, &mut p);
        let ts = p["spec"]["tolerations"].as_array().unwrap();
        assert_eq!(ts.len(), 2);
        assert_eq!(ts[0], own);
        assert_eq!(ts[1]["key"], "node.kubernetes.io/not-ready");
        let mut p = json!({"metadata":{"name":"a"},"spec":{"containers":[{"name":"c","image":"i"}],"tolerations":[{"operator":"Exists"}]}});
        apply_defaults(pods, &mut p);
        assert_eq!(p["spec"]["tolerations"].as_array().unwrap().len(), 1);
        // templates are not touched
        let d = crate::resources::find("apps", "v1", "deployments").unwrap();
        let mut dep = json!({"metadata":{"name":"d"},"spec":{"selector":{"matchLabels":{"a":"b"}},"template":{"metadata":{"labels":{"a":"b"}},"spec":{"containers":[{"name":"c","image":"i"}]}}}});
        apply_defaults(d, &mut dep);
        assert!(dep["spec"]["template"]["spec"].get("tolerations").is_none());
    }

    #[test]
    fn deployment_selector_must_match_template() {
        let d = crate::resources::find("apps", "v1", "deployments").unwrap();
        let obj = json!({"metadata":{"name":"d","namespace":"default"},"spec":{"selector":{"matchLabels":{"app":"x"}},
            "template":{"metadata":{"labels":{"app":"y"}},"spec":{"containers":[{"name":"c","image":"i"}]}}}});
        let errs = validate(d, &obj);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert_eq!(errs[0].field, "spec.template.metadata.labels");
    }

    #[test]
    fn status_endpoint_keeps_spec() {
        let pods = crate::resources::find("", "v1", "pods").unwrap();
        let old = json!({"metadata":{"name":"a","labels":{"x":"1"}},"spec":{"nodeName":"n"},"status":{"phase":"Pending"}});
        let mut new = json!({"metadata":{"name":"a","labels":{"x":"2"}},"spec":{"nodeName":"other"},"status":{"phase":"Running"}});
        keep_unchangeable(pods, crate::api::Endpoint::Status, &old, &mut new);
        assert_eq!(new["spec"]["nodeName"], "n");
        assert_eq!(new["status"]["phase"], "Running");
        assert_eq!(new["metadata"]["labels"]["x"], "2");
        let mut new = json!({"metadata":{"name":"a"},"spec":{"nodeName":"n"},"status":{"phase":"Failed"}});
        keep_unchangeable(pods, crate::api::Endpoint::Main, &old, &mut new);
        assert_eq!(new["status"]["phase"], "Pending");
    }
}
