//! Server-side printing: the `meta.k8s.io/v1` Table that kube-apiserver answers with when a
//! client (kubectl) asks for `Accept: application/json;as=Table;v=v1;g=meta.k8s.io`.
//!
//! Columns (names, types, formats, priorities) and cell text follow upstream's printers
//! (`pkg/printers/internalversion`), so `kubectl get` / `kubectl get -o wide` look the same as
//! against a real cluster. Like upstream's `TableConvertor`, every row always carries the wide
//! (priority 1) cells too; kubectl hides those columns unless `-o wide` is given.
//!
//! Resources without a dedicated printer get upstream's default convertor: `Name` and
//! `Created At` (a `date` column whose cell is the RFC 3339 creation time).
//!
//! Upstream prints from internal (defaulted) objects; where a field may be missing from the
//! JSON given here but upstream's defaulting always fills it, the printer applies that default.
//!
//! This module holds the machinery: the column type, the dispatch by resource, the Table itself,
//! durations, JSON access, quantities, and the column descriptions several groups share. The
//! columns and printers of each API group's kinds are in their own file (`core`, `apps`,
//! `batch`, `networking`, `storage`, `cluster`, and `snapshot` for the kinds upstream serves
//! from CustomResourceDefinitions).

use std::collections::BTreeSet;
use std::time::Duration;

use jiff::Timestamp;
use serde_json::{json, Map, Value};

mod core;
mod apps;
mod batch;
mod networking;
mod storage;
mod cluster;
mod snapshot;

use self::core::*;
use self::apps::*;
use self::batch::*;
use self::networking::*;
use self::storage::*;
use self::cluster::*;
use self::snapshot::*;

/// A `meta.k8s.io/v1` TableColumnDefinition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Column {
    /// Human readable column name ("Name", "Ready", "Cluster-IP"...); kubectl upper-cases it.
    pub name: &'static str,
    /// OpenAPI type: "string", "integer", "boolean", "date", ...
    pub type_: &'static str,
    /// "name" for the column holding the object's name, otherwise "".
    pub format: &'static str,
    pub description: &'static str,
    /// 0 for normal columns, 1 for the ones kubectl shows only with `-o wide`.
    pub priority: i32,
}

impl Column {
    /// The column's JSON form in a Table's `columnDefinitions`.
    pub fn to_json(&self) -> Value {
        json!({
            "name": self.name,
            "type": self.type_,
            "format": self.format,
            "description": self.description,
            "priority": self.priority,
        })
    }
}

const fn col(name: &'static str, type_: &'static str, description: &'static str) -> Column {
    Column { name, type_, format: "", description, priority: 0 }
}

const fn wide(name: &'static str, type_: &'static str, description: &'static str) -> Column {
    Column { name, type_, format: "", description, priority: 1 }
}

const NAME: Column = Column { name: "Name", type_: "string", format: "name", description: D_NAME, priority: 0 };
const AGE: Column = col("Age", "string", D_CREATED);
const W_CONTAINERS: Column = wide("Containers", "string", "Names of each container in the template.");
const W_IMAGES: Column = wide("Images", "string", "Images referenced by each container in the template.");

const DEFAULT_COLUMNS: &[Column] = &[NAME, col("Created At", "date", D_CREATED)];

fn printer_columns(resource: &str) -> Option<&'static [Column]> {
    Some(match resource {
        "pods" => POD_COLUMNS,
        "podtemplates" => POD_TEMPLATE_COLUMNS,
        "poddisruptionbudgets" => PDB_COLUMNS,
        "replicationcontrollers" => RC_COLUMNS,
        "replicasets" => RS_COLUMNS,
        "daemonsets" => DS_COLUMNS,
        "jobs" => JOB_COLUMNS,
        "cronjobs" => CRONJOB_COLUMNS,
        "services" => SERVICE_COLUMNS,
        "ingresses" => INGRESS_COLUMNS,
        "ingressclasses" => INGRESS_CLASS_COLUMNS,
        "statefulsets" => STS_COLUMNS,
        "endpoints" => ENDPOINTS_COLUMNS,
        "nodes" => NODE_COLUMNS,
        "events" => EVENT_COLUMNS,
        "namespaces" => NAMESPACE_COLUMNS,
        "secrets" => SECRET_COLUMNS,
        "serviceaccounts" => SERVICE_ACCOUNT_COLUMNS,
        "persistentvolumes" => PV_COLUMNS,
        "persistentvolumeclaims" => PVC_COLUMNS,
        "componentstatuses" => COMPONENT_STATUS_COLUMNS,
        "deployments" => DEPLOYMENT_COLUMNS,
        "configmaps" => CONFIGMAP_COLUMNS,
        "networkpolicies" => NETWORK_POLICY_COLUMNS,
        "rolebindings" => ROLE_BINDING_COLUMNS,
        "clusterrolebindings" => CLUSTER_ROLE_BINDING_COLUMNS,
        "certificatesigningrequests" => CSR_COLUMNS,
        "leases" => LEASE_COLUMNS,
        "storageclasses" => STORAGE_CLASS_COLUMNS,
        "controllerrevisions" => CONTROLLER_REVISION_COLUMNS,
        "resourcequotas" => RESOURCE_QUOTA_COLUMNS,
        "priorityclasses" => PRIORITY_CLASS_COLUMNS,
        "runtimeclasses" => RUNTIME_CLASS_COLUMNS,
        "volumeattachments" => VOLUME_ATTACHMENT_COLUMNS,
        "endpointslices" => ENDPOINT_SLICE_COLUMNS,
        "csinodes" => CSI_NODE_COLUMNS,
        "csidrivers" => CSI_DRIVER_COLUMNS,
        "csistoragecapacities" => CSI_STORAGE_CAPACITY_COLUMNS,
        "volumesnapshotclasses" => VOLUME_SNAPSHOT_CLASS_COLUMNS,
        "volumesnapshots" => VOLUME_SNAPSHOT_COLUMNS,
        "volumesnapshotcontents" => VOLUME_SNAPSHOT_CONTENT_COLUMNS,
        "mutatingwebhookconfigurations" | "validatingwebhookconfigurations" => WEBHOOK_COLUMNS,
        _ => return None,
    })
}

fn column_defs(resource: &str) -> &'static [Column] {
    printer_columns(resource).unwrap_or(DEFAULT_COLUMNS)
}

/// Whether `resource` (a plural name) has a dedicated printer; the others get upstream's
/// default convertor (Name, Created At).
pub fn has_printer(resource: &str) -> bool {
    printer_columns(resource).is_some()
}

/// Column definitions for a resource (plural name, e.g. "pods", "deployments"), wide columns
/// included (priority 1).
pub fn columns(resource: &str) -> Vec<Column> {
    column_defs(resource).to_vec()
}

/// One row's cells for `obj`, in column order (wide cells included). `now` is the reference
/// for ages.
pub fn cells(resource: &str, obj: &Value, now: Timestamp) -> Vec<Value> {
    match resource {
        "pods" => pod_cells(obj, now),
        "podtemplates" => pod_template_cells(obj),
        "poddisruptionbudgets" => pdb_cells(obj, now),
        "replicationcontrollers" => rc_cells(obj, now),
        "replicasets" => replica_set_cells(obj, now),
        "daemonsets" => daemon_set_cells(obj, now),
        "jobs" => job_cells(obj, now),
        "cronjobs" => cron_job_cells(obj, now),
        "services" => service_cells(obj, now),
        "ingresses" => ingress_cells(obj, now),
        "ingressclasses" => ingress_class_cells(obj, now),
        "statefulsets" => stateful_set_cells(obj, now),
        "endpoints" => endpoints_cells(obj, now),
        "nodes" => node_cells(obj, now),
        "events" => event_cells(obj, now),
        "namespaces" => namespace_cells(obj, now),
        "secrets" => secret_cells(obj, now),
        "serviceaccounts" => service_account_cells(obj, now),
        "persistentvolumes" => pv_cells(obj, now),
        "persistentvolumeclaims" => pvc_cells(obj, now),
        "componentstatuses" => component_status_cells(obj),
        "deployments" => deployment_cells(obj, now),
        "configmaps" => config_map_cells(obj, now),
        "networkpolicies" => network_policy_cells(obj, now),
        "rolebindings" | "clusterrolebindings" => role_binding_cells(obj, now),
        "certificatesigningrequests" => csr_cells(obj, now),
        "leases" => lease_cells(obj, now),
        "storageclasses" => storage_class_cells(obj, now),
        "controllerrevisions" => controller_revision_cells(obj, now),
        "resourcequotas" => resource_quota_cells(obj, now),
        "priorityclasses" => priority_class_cells(obj, now),
        "runtimeclasses" => runtime_class_cells(obj, now),
        "volumeattachments" => volume_attachment_cells(obj, now),
        "endpointslices" => endpoint_slice_cells(obj, now),
        "csinodes" => csi_node_cells(obj, now),
        "csidrivers" => csi_driver_cells(obj, now),
        "csistoragecapacities" => csi_storage_capacity_cells(obj),
        "volumesnapshotclasses" => volume_snapshot_class_cells(obj, now),
        "volumesnapshots" => volume_snapshot_cells(obj, now),
        "volumesnapshotcontents" => volume_snapshot_content_cells(obj, now),
        "mutatingwebhookconfigurations" | "validatingwebhookconfigurations" => webhook_cells(obj, now),
        _ => default_cells(obj),
    }
}

/// Whether `include_object` is a value upstream accepts for `includeObject` (the empty string
/// meaning the default, "Metadata"); upstream answers 400 for anything else.
pub fn valid_include_object(include_object: &str) -> bool {
    matches!(include_object, "" | "None" | "Metadata" | "Object")
}

/// The full `meta.k8s.io/v1` Table for `objects` (one object for a get or a watch event).
///
/// `include_object` is the request's `includeObject`: "None" (row objects are `null`),
/// "Object" (the object as given), anything else (default "Metadata") a PartialObjectMetadata.
/// `list_meta` supplies `resourceVersion`, `continue` and `remainingItemCount`; empty or
/// missing ones are left out, as upstream does.
pub fn table(
    resource: &str,
    objects: &[Value],
    include_object: &str,
    list_meta: Value,
    now: Timestamp,
) -> Value {
    let columns: Vec<Value> = column_defs(resource).iter().map(Column::to_json).collect();
    let rows: Vec<Value> = objects
        .iter()
        .map(|obj| {
            let mut row = Map::new();
            row.insert("cells".into(), Value::Array(cells(resource, obj, now)));
            if resource == "pods" {
                if let Some(c) = pod_row_conditions(obj) {
                    row.insert("conditions".into(), c);
                }
            }
            let object = match include_object {
                "None" => Value::Null,
                "Object" => obj.clone(),
                _ => partial_object_metadata(obj),
            };
            row.insert("object".into(), object);
            Value::Object(row)
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

    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata,
        "columnDefinitions": columns,
        "rows": rows,
    })
}

fn partial_object_metadata(obj: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({})),
    })
}

// ---------------------------------------------------------------------------------------------
// Durations and timestamps

/// Upstream's `duration.HumanDuration`: a short approximation with 2-3 significant figures
/// ("45s", "2m30s", "17m", "5h3m", "20h", "3d4h", "30d", "2y5d", "9y").
pub fn human_duration(d: Duration) -> String {
    human_duration_nanos(i128::try_from(d.as_nanos()).unwrap_or(i128::MAX))
}

/// HumanDuration for a signed duration in nanoseconds: up to 2s in the future counts as now
/// ("0s"), further is "<invalid>".
fn human_duration_nanos(d: i128) -> String {
    const SEC: i128 = 1_000_000_000;
    let seconds = d / SEC;
    if seconds < -1 {
        return "<invalid>".into();
    } else if seconds < 0 {
        return "0s".into();
    } else if seconds < 60 * 2 {
        return format!("{seconds}s");
    }
    let minutes = d / (60 * SEC);
    if minutes < 10 {
        let s = seconds % 60;
        if s == 0 {
            return format!("{minutes}m");
        }
        return format!("{minutes}m{s}s");
    } else if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = d / (3600 * SEC);
    if hours < 8 {
        let m = minutes % 60;
        if m == 0 {
            return format!("{hours}h");
        }
        format!("{hours}h{m}m")
    } else if hours < 48 {
        format!("{hours}h")
    } else if hours < 24 * 8 {
        let h = hours % 24;
        if h == 0 {
            return format!("{}d", hours / 24);
        }
        format!("{}d{}h", hours / 24, h)
    } else if hours < 24 * 365 * 2 {
        format!("{}d", hours / 24)
    } else if hours < 24 * 365 * 8 {
        let dy = (hours / 24) % 365;
        if dy == 0 {
            return format!("{}y", hours / 24 / 365);
        }
        format!("{}y{}d", hours / 24 / 365, dy)
    } else {
        format!("{}y", hours / 24 / 365)
    }
}

/// A (Micro)Time field's value; `None` when missing, null, unparsable or Go's zero time.
fn timestamp(v: Option<&Value>) -> Option<Timestamp> {
    let ts: Timestamp = v?.as_str()?.parse().ok()?;
    // Go's zero time, 0001-01-01T00:00:00Z, is "unset".
    if ts.as_second() == -62_135_596_800 && ts.subsec_nanosecond() == 0 {
        return None;
    }
    Some(ts)
}

/// Upstream's translateTimestampSince: the age of a timestamp field, "<unknown>" when unset.
pub fn translate_timestamp_since(ts: Option<&Value>, now: Timestamp) -> String {
    match timestamp(ts) {
        Some(ts) => human_duration_nanos(now.as_nanosecond() - ts.as_nanosecond()),
        None => "<unknown>".into(),
    }
}

fn age(obj: &Value, now: Timestamp) -> Value {
    Value::String(translate_timestamp_since(at(obj, &["metadata", "creationTimestamp"]), now))
}

// ---------------------------------------------------------------------------------------------
// JSON access helpers (missing and null read as absent)

fn at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    let mut cur = v;
    for key in path {
        cur = cur.get(*key)?;
    }
    if cur.is_null() {
        None
    } else {
        Some(cur)
    }
}

fn st<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    at(v, path).and_then(Value::as_str).unwrap_or("")
}

fn st_or<'a>(v: &'a Value, path: &[&str], default: &'a str) -> &'a str {
    match st(v, path) {
        "" => default,
        s => s,
    }
}

fn int(v: &Value, path: &[&str]) -> i64 {
    at(v, path).and_then(Value::as_i64).unwrap_or(0)
}

fn int_or(v: &Value, path: &[&str], default: i64) -> i64 {
    at(v, path).and_then(Value::as_i64).unwrap_or(default)
}

fn boolean(v: &Value, path: &[&str]) -> Option<bool> {
    at(v, path).and_then(Value::as_bool)
}

fn list<'a>(v: &'a Value, path: &[&str]) -> &'a [Value] {
    at(v, path).and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[])
}

fn map_len(v: &Value, path: &[&str]) -> usize {
    at(v, path).and_then(Value::as_object).map_or(0, Map::len)
}

fn name(obj: &Value) -> Value {
    Value::String(st(obj, &["metadata", "name"]).to_string())
}

fn count(n: usize) -> Value {
    Value::from(i64::try_from(n).unwrap_or(i64::MAX))
}

fn s(text: impl Into<String>) -> Value {
    Value::String(text.into())
}

fn is_deleting(obj: &Value) -> bool {
    at(obj, &["metadata", "deletionTimestamp"]).is_some()
}

/// A string-to-string map as `k=v` pairs sorted by key (labels.FormatLabels); "<none>" if empty.
fn format_labels(m: Option<&Value>) -> String {
    let mut pairs: Vec<(&str, &str)> = m
        .and_then(Value::as_object)
        .map(|m| m.iter().map(|(k, v)| (k.as_str(), v.as_str().unwrap_or(""))).collect())
        .unwrap_or_default();
    if pairs.is_empty() {
        return "<none>".into();
    }
    pairs.sort();
    pairs.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
}

/// A metav1.LabelSelector in selector syntax (LabelSelectorAsSelector(..).String()); "" for
/// a missing or empty selector, `Err` for one upstream rejects.
fn selector_string(sel: Option<&Value>) -> Result<String, ()> {
    let Some(sel) = sel else { return Ok(String::new()) };
    let mut reqs: Vec<(String, String)> = Vec::new();
    if let Some(labels) = at(sel, &["matchLabels"]).and_then(Value::as_object) {
        let mut keys: Vec<&String> = labels.keys().collect();
        keys.sort();
        for k in keys {
            let v = labels.get(k.as_str()).and_then(Value::as_str).unwrap_or("");
            reqs.push((k.clone(), format!("{k}={v}")));
        }
    }
    for expr in list(sel, &["matchExpressions"]) {
        let key = st(expr, &["key"]);
        let mut values: Vec<&str> = list(expr, &["values"]).iter().filter_map(Value::as_str).collect();
        values.sort_unstable();
        let rendered = match st(expr, &["operator"]) {
            op @ ("In" | "NotIn") => {
                if values.is_empty() {
                    return Err(());
                }
                let word = if op == "In" { "in" } else { "notin" };
                format!("{key} {word} ({})", values.join(","))
            }
            "Exists" if values.is_empty() => key.to_string(),
            "DoesNotExist" if values.is_empty() => format!("!{key}"),
            _ => return Err(()),
        };
        reqs.push((key.to_string(), rendered));
    }
    reqs.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(reqs.into_iter().map(|(_, r)| r).collect::<Vec<_>>().join(","))
}

/// metav1.FormatLabelSelector: "<none>" when empty, "<error>" when invalid.
fn format_label_selector(sel: Option<&Value>) -> String {
    match selector_string(sel) {
        Err(()) => "<error>".into(),
        Ok(s) if s.is_empty() => "<none>".into(),
        Ok(s) => s,
    }
}

/// Container names and images, each comma separated (layoutContainerCells).
fn layout_containers(containers: &[Value]) -> (Value, Value) {
    let names: Vec<&str> = containers.iter().map(|c| st(c, &["name"])).collect();
    let images: Vec<&str> = containers.iter().map(|c| st(c, &["image"])).collect();
    (s(names.join(",")), s(images.join(",")))
}

fn template_containers(obj: &Value, template: &[&str]) -> (Value, Value) {
    let mut path: Vec<&str> = template.to_vec();
    path.extend(["spec", "containers"]);
    layout_containers(list(obj, &path))
}

fn access_modes(modes: &[Value]) -> String {
    let has = |m: &str| modes.iter().any(|v| v.as_str() == Some(m));
    let mut out = Vec::new();
    for (mode, short) in [
        ("ReadWriteOnce", "RWO"),
        ("ReadOnlyMany", "ROX"),
        ("ReadWriteMany", "RWX"),
        ("ReadWriteOncePod", "RWOP"),
    ] {
        if has(mode) {
            out.push(short);
        }
    }
    out.join(",")
}

fn go_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}

/// An IntOrString's text.
fn int_or_string(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

// ---------------------------------------------------------------------------------------------
// resource.Quantity canonical form (Quantity.String())

/// The canonical text upstream prints for a quantity (the shared implementation).
fn canonical_quantity(text: &str) -> Option<String> {
    k8s_semantics::quantity::canonical(text)
}

/// A quantity field as upstream prints it; a missing quantity is the zero quantity, "0".
fn quantity(v: Option<&Value>) -> String {
    match v {
        None => "0".into(),
        Some(Value::String(text)) => canonical_quantity(text).unwrap_or_else(|| text.clone()),
        Some(Value::Number(n)) => {
            let text = n.to_string();
            canonical_quantity(&text).unwrap_or(text)
        }
        Some(other) => other.to_string(),
    }
}

// ---------------------------------------------------------------------------------------------
// Printers

fn default_cells(obj: &Value) -> Vec<Value> {
    // Upstream's default convertor prints the creation time in RFC 3339 (UTC, whole seconds);
    // an unset time is Go's zero time.
    let created = timestamp(at(obj, &["metadata", "creationTimestamp"]))
        .map(|ts| ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_else(|| "0001-01-01T00:00:00Z".into());
    vec![name(obj), s(created)]
}

fn condition_status<'a>(obj: &'a Value, path: &[&str], type_: &str) -> Option<&'a str> {
    list(obj, path)
        .iter()
        .find(|c| st(c, &["type"]) == type_)
        .map(|c| st(c, &["status"]))
}

const BETA_STORAGE_CLASS_ANNOTATION: &str = "volume.beta.kubernetes.io/storage-class";

// ---------------------------------------------------------------------------------------------
// Column descriptions: upstream takes them from the API types' documentation.

const D_NAME: &str = "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names";
const D_CREATED: &str = "CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null for lists. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata";

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
