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

use std::collections::BTreeSet;
use std::time::Duration;

use jiff::Timestamp;
use serde_json::{json, Map, Value};

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

const POD_COLUMNS: &[Column] = &[
    NAME,
    col("Ready", "string", "The aggregate readiness state of this pod for accepting traffic."),
    col("Status", "string", "The aggregate status of the containers in this pod."),
    col(
        "Restarts",
        "string",
        "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted.",
    ),
    AGE,
    wide("IP", "string", D_POD_IP),
    wide("Node", "string", D_POD_NODE_NAME),
    wide("Nominated Node", "string", D_POD_NOMINATED),
    wide("Readiness Gates", "string", D_POD_READINESS_GATES),
];

const POD_TEMPLATE_COLUMNS: &[Column] = &[
    NAME,
    col("Containers", "string", "Names of each container in the template."),
    col("Images", "string", "Images referenced by each container in the template."),
    col("Pod Labels", "string", "The labels for the pod template."),
];

const PDB_COLUMNS: &[Column] = &[
    NAME,
    col("Min Available", "string", "The minimum number of pods that must be available."),
    col("Max Unavailable", "string", "The maximum number of pods that may be unavailable."),
    col("Allowed Disruptions", "integer", "Calculated number of pods that may be disrupted at this time."),
    AGE,
];

const RC_COLUMNS: &[Column] = &[
    NAME,
    col("Desired", "integer", D_RC_SPEC_REPLICAS),
    col("Current", "integer", D_RC_STATUS_REPLICAS),
    col("Ready", "integer", D_RC_READY),
    AGE,
    W_CONTAINERS,
    W_IMAGES,
    wide("Selector", "string", D_RC_SELECTOR),
];

const RS_COLUMNS: &[Column] = &[
    NAME,
    col("Desired", "integer", D_RS_SPEC_REPLICAS),
    col("Current", "integer", D_RS_STATUS_REPLICAS),
    col("Ready", "integer", D_RS_READY),
    AGE,
    W_CONTAINERS,
    W_IMAGES,
    wide("Selector", "string", D_RS_SELECTOR),
];

const DS_COLUMNS: &[Column] = &[
    NAME,
    col("Desired", "integer", D_DS_DESIRED),
    col("Current", "integer", D_DS_CURRENT),
    col("Ready", "integer", D_DS_READY),
    col("Up-to-date", "integer", D_DS_UPDATED),
    col("Available", "integer", D_DS_AVAILABLE),
    col("Node Selector", "string", D_POD_NODE_SELECTOR),
    AGE,
    W_CONTAINERS,
    W_IMAGES,
    wide("Selector", "string", D_DS_SELECTOR),
];

const JOB_COLUMNS: &[Column] = &[
    NAME,
    col("Status", "string", "Status of the job."),
    col("Completions", "string", D_JOB_SUCCEEDED),
    col("Duration", "string", "Time required to complete the job."),
    AGE,
    W_CONTAINERS,
    W_IMAGES,
    wide("Selector", "string", D_JOB_SELECTOR),
];

const CRONJOB_COLUMNS: &[Column] = &[
    NAME,
    col("Schedule", "string", D_CJ_SCHEDULE),
    col("Timezone", "string", D_CJ_TIME_ZONE),
    col("Suspend", "boolean", D_CJ_SUSPEND),
    col("Active", "integer", D_CJ_ACTIVE),
    col("Last Schedule", "string", D_CJ_LAST_SCHEDULE),
    AGE,
    W_CONTAINERS,
    W_IMAGES,
    wide("Selector", "string", D_JOB_SELECTOR),
];

const SERVICE_COLUMNS: &[Column] = &[
    NAME,
    col("Type", "string", D_SVC_TYPE),
    col("Cluster-IP", "string", D_SVC_CLUSTER_IP),
    col("External-IP", "string", D_SVC_EXTERNAL_IPS),
    col("Port(s)", "string", D_SVC_PORTS),
    AGE,
    wide("Selector", "string", D_SVC_SELECTOR),
];

const INGRESS_COLUMNS: &[Column] = &[
    NAME,
    col("Class", "string", "The name of the IngressClass resource that should be used for additional configuration"),
    col("Hosts", "string", "Hosts that incoming requests are matched against before the ingress rule"),
    col("Address", "string", "Address is a list containing ingress points for the load-balancer"),
    col("Ports", "string", "Ports of TLS configurations that open"),
    AGE,
];

const INGRESS_CLASS_COLUMNS: &[Column] = &[
    NAME,
    col("Controller", "string", "Controller that is responsible for handling this class"),
    col("Parameters", "string", "A reference to a resource with additional parameters"),
    AGE,
];

const STS_COLUMNS: &[Column] = &[
    NAME,
    col("Ready", "string", "Number of the pod with ready state"),
    AGE,
    W_CONTAINERS,
    W_IMAGES,
];

const ENDPOINTS_COLUMNS: &[Column] = &[NAME, col("Endpoints", "string", D_EP_SUBSETS), AGE];

const NODE_COLUMNS: &[Column] = &[
    NAME,
    col("Status", "string", "The status of the node"),
    col("Roles", "string", "The roles of the node"),
    AGE,
    col("Version", "string", D_NODE_KUBELET),
    wide("Internal-IP", "string", D_NODE_ADDRESSES),
    wide("External-IP", "string", D_NODE_ADDRESSES),
    wide("OS-Image", "string", D_NODE_OS_IMAGE),
    wide("Kernel-Version", "string", D_NODE_KERNEL),
    wide("Container-Runtime", "string", D_NODE_RUNTIME),
];

const EVENT_COLUMNS: &[Column] = &[
    col("Last Seen", "string", D_EV_LAST),
    col("Type", "string", D_EV_TYPE),
    col("Reason", "string", D_EV_REASON),
    col("Object", "string", D_EV_INVOLVED),
    wide("Subobject", "string", D_EV_FIELD_PATH),
    wide("Source", "string", D_EV_SOURCE),
    col("Message", "string", D_EV_MESSAGE),
    wide("First Seen", "string", D_EV_FIRST),
    wide("Count", "string", D_EV_COUNT),
    Column { name: "Name", type_: "string", format: "name", description: D_NAME, priority: 1 },
];

const NAMESPACE_COLUMNS: &[Column] = &[NAME, col("Status", "string", "The status of the namespace"), AGE];

const SECRET_COLUMNS: &[Column] =
    &[NAME, col("Type", "string", D_SECRET_TYPE), col("Data", "string", D_SECRET_DATA), AGE];

const SERVICE_ACCOUNT_COLUMNS: &[Column] = &[NAME, col("Secrets", "string", D_SA_SECRETS), AGE];

const PV_COLUMNS: &[Column] = &[
    NAME,
    col("Capacity", "string", D_PV_CAPACITY),
    col("Access Modes", "string", D_PV_ACCESS_MODES),
    col("Reclaim Policy", "string", D_PV_RECLAIM),
    col("Status", "string", D_PV_PHASE),
    col("Claim", "string", D_PV_CLAIM),
    col("StorageClass", "string", "StorageClass of the pv"),
    col("VolumeAttributesClass", "string", "VolumeAttributesClass of the pv"),
    col("Reason", "string", D_PV_REASON),
    AGE,
    wide("VolumeMode", "string", D_PV_VOLUME_MODE),
];

const PVC_COLUMNS: &[Column] = &[
    NAME,
    col("Status", "string", D_PVC_PHASE),
    col("Volume", "string", D_PVC_VOLUME_NAME),
    col("Capacity", "string", D_PVC_CAPACITY),
    col("Access Modes", "string", D_PVC_ACCESS_MODES),
    col("StorageClass", "string", "StorageClass of the pvc"),
    col("VolumeAttributesClass", "string", "VolumeAttributesClass of the pvc"),
    AGE,
    wide("VolumeMode", "string", D_PVC_VOLUME_MODE),
];

const COMPONENT_STATUS_COLUMNS: &[Column] = &[
    NAME,
    col("Status", "string", "Status of the component conditions"),
    col("Message", "string", "Message of the component conditions"),
    col("Error", "string", "Error of the component conditions"),
];

const DEPLOYMENT_COLUMNS: &[Column] = &[
    NAME,
    col("Ready", "string", "Number of the pod with ready state"),
    col("Up-to-date", "string", D_DEPLOY_UPDATED),
    col("Available", "string", D_DEPLOY_AVAILABLE),
    AGE,
    W_CONTAINERS,
    W_IMAGES,
    wide("Selector", "string", D_DEPLOY_SELECTOR),
];

const CONFIGMAP_COLUMNS: &[Column] = &[NAME, col("Data", "string", D_CM_DATA), AGE];

const NETWORK_POLICY_COLUMNS: &[Column] = &[NAME, col("Pod-Selector", "string", D_NP_POD_SELECTOR), AGE];

const ROLE_BINDING_COLUMNS: &[Column] = &[
    NAME,
    col("Role", "string", D_RB_ROLE_REF),
    AGE,
    wide("Users", "string", "Users in the roleBinding"),
    wide("Groups", "string", "Groups in the roleBinding"),
    wide("ServiceAccounts", "string", "ServiceAccounts in the roleBinding"),
];

const CLUSTER_ROLE_BINDING_COLUMNS: &[Column] = &[
    NAME,
    col("Role", "string", D_CRB_ROLE_REF),
    AGE,
    wide("Users", "string", "Users in the clusterRoleBinding"),
    wide("Groups", "string", "Groups in the clusterRoleBinding"),
    wide("ServiceAccounts", "string", "ServiceAccounts in the clusterRoleBinding"),
];

const CSR_COLUMNS: &[Column] = &[
    NAME,
    AGE,
    col("SignerName", "string", D_CSR_SIGNER),
    col("Requestor", "string", D_CSR_REQUEST),
    col("RequestedDuration", "string", D_CSR_EXPIRATION),
    col("Condition", "string", D_CSR_CONDITIONS),
];

const LEASE_COLUMNS: &[Column] = &[NAME, col("Holder", "string", D_LEASE_HOLDER), AGE];

const STORAGE_CLASS_COLUMNS: &[Column] = &[
    NAME,
    col("Provisioner", "string", D_SC_PROVISIONER),
    col("ReclaimPolicy", "string", D_SC_RECLAIM),
    col("VolumeBindingMode", "string", D_SC_BINDING_MODE),
    col("AllowVolumeExpansion", "string", D_SC_EXPANSION),
    AGE,
];

const CONTROLLER_REVISION_COLUMNS: &[Column] = &[
    NAME,
    col("Controller", "string", "Controller of the object"),
    col("Revision", "string", D_CR_REVISION),
    AGE,
];

const RESOURCE_QUOTA_COLUMNS: &[Column] = &[
    NAME,
    col("Request", "string", "Request represents a minimum amount of cpu/memory that a container may consume."),
    col(
        "Limit",
        "string",
        "Limits control the maximum amount of cpu/memory that a container may use independent of contention on the node.",
    ),
    AGE,
];

const PRIORITY_CLASS_COLUMNS: &[Column] = &[
    NAME,
    col("Value", "integer", D_PC_VALUE),
    col("Global-Default", "boolean", D_PC_GLOBAL_DEFAULT),
    AGE,
    col("PreemptionPolicy", "string", D_PC_PREEMPTION),
];

// Upstream describes the handler column with a key ObjectMeta has no docs for: empty.
const RUNTIME_CLASS_COLUMNS: &[Column] = &[NAME, col("Handler", "string", ""), AGE];

const VOLUME_ATTACHMENT_COLUMNS: &[Column] = &[
    NAME,
    Column { name: "Attacher", type_: "string", format: "name", description: D_VA_ATTACHER, priority: 0 },
    col("PV", "string", D_VA_PV),
    col("Node", "string", D_VA_NODE),
    col("Attached", "boolean", D_VA_ATTACHED),
    AGE,
];

const ENDPOINT_SLICE_COLUMNS: &[Column] = &[
    NAME,
    col("AddressType", "string", D_ES_ADDRESS_TYPE),
    col("Ports", "string", D_ES_PORTS),
    col("Endpoints", "string", D_ES_ENDPOINTS),
    AGE,
];

const CSI_NODE_COLUMNS: &[Column] = &[
    NAME,
    col("Drivers", "integer", "Drivers indicates the number of CSI drivers registered on the node"),
    AGE,
];

const CSI_DRIVER_COLUMNS: &[Column] = &[
    NAME,
    col("AttachRequired", "boolean", D_CSID_ATTACH),
    col("PodInfoOnMount", "boolean", D_CSID_POD_INFO),
    col("StorageCapacity", "boolean", D_CSID_CAPACITY),
    col("TokenRequests", "string", D_CSID_TOKEN),
    col("RequiresRepublish", "boolean", D_CSID_REPUBLISH),
    col("Modes", "string", D_CSID_MODES),
    AGE,
];

const CSI_STORAGE_CAPACITY_COLUMNS: &[Column] =
    &[NAME, col("StorageClassName", "string", D_CSISC_CLASS), col("Capacity", "string", D_CSISC_CAPACITY)];

const WEBHOOK_COLUMNS: &[Column] = &[
    NAME,
    col("Webhooks", "integer", "Webhooks indicates the number of webhooks registered in this configuration"),
    AGE,
];

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

/// Upstream marks rows of finished pods with a `Completed` row condition.
fn pod_row_conditions(pod: &Value) -> Option<Value> {
    let (reason, message) = match st(pod, &["status", "phase"]) {
        "Succeeded" => ("Succeeded", "The pod has completed successfully."),
        "Failed" => ("Failed", "The pod failed."),
        _ => return None,
    };
    Some(json!([{"type": "Completed", "status": "True", "reason": reason, "message": message}]))
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

fn finished_at(status: &Value) -> Option<Timestamp> {
    timestamp(at(status, &["lastTerminationState", "terminated", "finishedAt"]))
}

fn latest(current: Option<Timestamp>, candidate: Option<Timestamp>) -> Option<Timestamp> {
    match (current, candidate) {
        (Some(c), Some(t)) if t > c => Some(t),
        (None, t) => t,
        (c, _) => c,
    }
}

fn condition_status<'a>(obj: &'a Value, path: &[&str], type_: &str) -> Option<&'a str> {
    list(obj, path)
        .iter()
        .find(|c| st(c, &["type"]) == type_)
        .map(|c| st(c, &["status"]))
}

/// "Init:Signal:9" / "ExitCode:1" style text for a terminated state without a reason.
fn terminated_text(terminated: &Value) -> String {
    let signal = int(terminated, &["signal"]);
    if signal != 0 {
        format!("Signal:{signal}")
    } else {
        format!("ExitCode:{}", int(terminated, &["exitCode"]))
    }
}

fn pod_cells(pod: &Value, now: Timestamp) -> Vec<Value> {
    let init_specs = list(pod, &["spec", "initContainers"]);
    let is_restartable = |container_name: &str| {
        init_specs
            .iter()
            .any(|c| st(c, &["name"]) == container_name && st(c, &["restartPolicy"]) == "Always")
    };
    let mut total = list(pod, &["spec", "containers"]).len();
    total += init_specs.iter().filter(|c| st(c, &["restartPolicy"]) == "Always").count();
    let mut ready = 0usize;
    let mut restarts = 0i64;
    let mut sidecar_restarts = 0i64;
    let mut last_restart: Option<Timestamp> = None;
    let mut last_sidecar_restart: Option<Timestamp> = None;

    let phase = st_or(pod, &["status", "phase"], "Pending");
    let status_reason = st(pod, &["status", "reason"]);
    let mut reason = if status_reason.is_empty() { phase.to_string() } else { status_reason.to_string() };
    if list(pod, &["status", "conditions"])
        .iter()
        .any(|c| st(c, &["type"]) == "PodScheduled" && st(c, &["reason"]) == "SchedulingGated")
    {
        reason = "SchedulingGated".into();
    }

    let mut initializing = false;
    for (i, cs) in list(pod, &["status", "initContainerStatuses"]).iter().enumerate() {
        let restart_count = int(cs, &["restartCount"]);
        restarts += restart_count;
        last_restart = latest(last_restart, finished_at(cs));
        let restartable = is_restartable(st(cs, &["name"]));
        if restartable {
            sidecar_restarts += restart_count;
            last_sidecar_restart = latest(last_sidecar_restart, finished_at(cs));
        }
        let terminated = at(cs, &["state", "terminated"]);
        let waiting_reason = st(cs, &["state", "waiting", "reason"]);
        if terminated.is_some_and(|t| int(t, &["exitCode"]) == 0) {
            continue;
        }
        if restartable && boolean(cs, &["started"]) == Some(true) {
            if boolean(cs, &["ready"]) == Some(true) {
                ready += 1;
            }
            continue;
        }
        if let Some(t) = terminated {
            reason = match st(t, &["reason"]) {
                "" => format!("Init:{}", terminated_text(t)),
                r => format!("Init:{r}"),
            };
        } else if at(cs, &["state", "waiting"]).is_some()
            && !waiting_reason.is_empty()
            && waiting_reason != "PodInitializing"
        {
            reason = format!("Init:{waiting_reason}");
        } else {
            reason = format!("Init:{}/{}", i, init_specs.len());
        }
        initializing = true;
        break;
    }

    if !initializing || condition_status(pod, &["status", "conditions"], "Initialized") == Some("True") {
        restarts = sidecar_restarts;
        last_restart = last_sidecar_restart;
        let mut has_running = false;
        for cs in list(pod, &["status", "containerStatuses"]).iter().rev() {
            restarts += int(cs, &["restartCount"]);
            last_restart = latest(last_restart, finished_at(cs));
            let waiting_reason = st(cs, &["state", "waiting", "reason"]);
            let terminated = at(cs, &["state", "terminated"]);
            if !waiting_reason.is_empty() {
                reason = waiting_reason.to_string();
            } else if let Some(t) = terminated {
                reason = match st(t, &["reason"]) {
                    "" => terminated_text(t),
                    r => r.to_string(),
                };
            } else if boolean(cs, &["ready"]) == Some(true) && at(cs, &["state", "running"]).is_some() {
                has_running = true;
                ready += 1;
            }
        }
        // A pod whose last container completed but another still runs is not "Completed".
        if reason == "Completed" && has_running {
            reason = if condition_status(pod, &["status", "conditions"], "Ready") == Some("True") {
                "Running".into()
            } else {
                "NotReady".into()
            };
        }
    }

    if is_deleting(pod) && status_reason == "NodeLost" {
        reason = "Unknown".into();
    } else if is_deleting(pod) && phase != "Succeeded" && phase != "Failed" {
        reason = "Terminating".into();
    }

    let restarts_text = match last_restart {
        Some(ts) if restarts != 0 => format!(
            "{restarts} ({} ago)",
            human_duration_nanos(now.as_nanosecond() - ts.as_nanosecond())
        ),
        _ => restarts.to_string(),
    };

    let pod_ip = list(pod, &["status", "podIPs"])
        .first()
        .map(|p| st(p, &["ip"]))
        .unwrap_or_else(|| st(pod, &["status", "podIP"]));
    let readiness_gates = list(pod, &["spec", "readinessGates"]);
    let gates = if readiness_gates.is_empty() {
        "<none>".to_string()
    } else {
        let passed = readiness_gates
            .iter()
            .filter(|g| {
                condition_status(pod, &["status", "conditions"], st(g, &["conditionType"])) == Some("True")
            })
            .count();
        format!("{passed}/{}", readiness_gates.len())
    };

    vec![
        name(pod),
        s(format!("{ready}/{total}")),
        s(reason),
        s(restarts_text),
        age(pod, now),
        s(if pod_ip.is_empty() { "<none>" } else { pod_ip }),
        s(st_or(pod, &["spec", "nodeName"], "<none>")),
        s(st_or(pod, &["status", "nominatedNodeName"], "<none>")),
        s(gates),
    ]
}

fn pod_template_cells(obj: &Value) -> Vec<Value> {
    let (names, images) = template_containers(obj, &["template"]);
    vec![name(obj), names, images, s(format_labels(at(obj, &["template", "metadata", "labels"])))]
}

fn pdb_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    let bound = |key: &str| at(obj, &["spec", key]).map_or_else(|| "N/A".to_string(), int_or_string);
    vec![
        name(obj),
        s(bound("minAvailable")),
        s(bound("maxUnavailable")),
        Value::from(int(obj, &["status", "disruptionsAllowed"])),
        age(obj, now),
    ]
}

fn rc_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    let (names, images) = template_containers(obj, &["spec", "template"]);
    vec![
        name(obj),
        Value::from(int_or(obj, &["spec", "replicas"], 1)),
        Value::from(int(obj, &["status", "replicas"])),
        Value::from(int(obj, &["status", "readyReplicas"])),
        age(obj, now),
        names,
        images,
        s(format_labels(at(obj, &["spec", "selector"]))),
    ]
}

fn replica_set_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    let (names, images) = template_containers(obj, &["spec", "template"]);
    vec![
        name(obj),
        Value::from(int_or(obj, &["spec", "replicas"], 1)),
        Value::from(int(obj, &["status", "replicas"])),
        Value::from(int(obj, &["status", "readyReplicas"])),
        age(obj, now),
        names,
        images,
        s(format_label_selector(at(obj, &["spec", "selector"]))),
    ]
}

fn daemon_set_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    let (names, images) = template_containers(obj, &["spec", "template"]);
    vec![
        name(obj),
        Value::from(int(obj, &["status", "desiredNumberScheduled"])),
        Value::from(int(obj, &["status", "currentNumberScheduled"])),
        Value::from(int(obj, &["status", "numberReady"])),
        Value::from(int(obj, &["status", "updatedNumberScheduled"])),
        Value::from(int(obj, &["status", "numberAvailable"])),
        s(format_labels(at(obj, &["spec", "template", "spec", "nodeSelector"]))),
        age(obj, now),
        names,
        images,
        s(format_label_selector(at(obj, &["spec", "selector"]))),
    ]
}

fn stateful_set_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    let (names, images) = template_containers(obj, &["spec", "template"]);
    vec![
        name(obj),
        s(format!("{}/{}", int(obj, &["status", "readyReplicas"]), int_or(obj, &["spec", "replicas"], 1))),
        age(obj, now),
        names,
        images,
    ]
}

fn deployment_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    let (names, images) = template_containers(obj, &["spec", "template"]);
    let selector = selector_string(at(obj, &["spec", "selector"])).unwrap_or_else(|()| "<invalid>".into());
    vec![
        name(obj),
        s(format!("{}/{}", int(obj, &["status", "readyReplicas"]), int_or(obj, &["spec", "replicas"], 1))),
        Value::from(int(obj, &["status", "updatedReplicas"])),
        Value::from(int(obj, &["status", "availableReplicas"])),
        age(obj, now),
        names,
        images,
        s(selector),
    ]
}

fn job_condition(obj: &Value, type_: &str) -> bool {
    condition_status(obj, &["status", "conditions"], type_) == Some("True")
}

fn job_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    let succeeded = int(obj, &["status", "succeeded"]);
    let completions = match at(obj, &["spec", "completions"]).and_then(Value::as_i64) {
        Some(c) => format!("{succeeded}/{c}"),
        None => match int_or(obj, &["spec", "parallelism"], 1) {
            p if p > 1 => format!("{succeeded}/1 of {p}"),
            _ => format!("{succeeded}/1"),
        },
    };
    let duration = match (
        timestamp(at(obj, &["status", "startTime"])),
        timestamp(at(obj, &["status", "completionTime"])),
    ) {
        (None, _) => String::new(),
        (Some(start), None) => human_duration_nanos(now.as_nanosecond() - start.as_nanosecond()),
        (Some(start), Some(end)) => human_duration_nanos(end.as_nanosecond() - start.as_nanosecond()),
    };
    let status = if job_condition(obj, "Complete") {
        "Complete"
    } else if job_condition(obj, "Failed") {
        "Failed"
    } else if is_deleting(obj) {
        "Terminating"
    } else if job_condition(obj, "Suspended") {
        "Suspended"
    } else if job_condition(obj, "FailureTarget") {
        "FailureTarget"
    } else {
        "Running"
    };
    let (names, images) = template_containers(obj, &["spec", "template"]);
    vec![
        name(obj),
        s(status),
        s(completions),
        s(duration),
        age(obj, now),
        names,
        images,
        s(format_label_selector(at(obj, &["spec", "selector"]))),
    ]
}

fn cron_job_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    let last_schedule = match at(obj, &["status", "lastScheduleTime"]) {
        Some(ts) => translate_timestamp_since(Some(ts), now),
        None => "<none>".into(),
    };
    let (names, images) = template_containers(obj, &["spec", "jobTemplate", "spec", "template"]);
    vec![
        name(obj),
        s(st(obj, &["spec", "schedule"])),
        s(at(obj, &["spec", "timeZone"]).and_then(Value::as_str).unwrap_or("<none>")),
        // Defaulting makes an unset suspend false.
        s(go_bool(boolean(obj, &["spec", "suspend"]).unwrap_or(false))),
        count(list(obj, &["status", "active"]).len()),
        s(last_schedule),
        age(obj, now),
        names,
        images,
        s(format_label_selector(at(obj, &["spec", "jobTemplate", "spec", "selector"]))),
    ]
}

/// The sorted, de-duplicated IPs (or hostnames) of a load balancer status.
fn load_balancer_ingress(obj: &Value) -> String {
    let set: BTreeSet<&str> = list(obj, &["status", "loadBalancer", "ingress"])
        .iter()
        .filter_map(|i| match (st(i, &["ip"]), st(i, &["hostname"])) {
            ("", "") => None,
            ("", host) => Some(host),
            (ip, _) => Some(ip),
        })
        .collect();
    set.into_iter().collect::<Vec<_>>().join(",")
}

fn service_external_ip(svc: &Value, svc_type: &str) -> String {
    let external: Vec<&str> = list(svc, &["spec", "externalIPs"]).iter().filter_map(Value::as_str).collect();
    match svc_type {
        "ClusterIP" | "NodePort" => {
            if external.is_empty() {
                "<none>".into()
            } else {
                external.join(",")
            }
        }
        "LoadBalancer" => {
            // Upstream's table convertor prints wide, so the address is never truncated.
            let lb = load_balancer_ingress(svc);
            if !external.is_empty() {
                let mut all: Vec<&str> = if lb.is_empty() { Vec::new() } else { lb.split(',').collect() };
                all.extend(external);
                all.join(",")
            } else if !lb.is_empty() {
                lb
            } else {
                "<pending>".into()
            }
        }
        "ExternalName" => st(svc, &["spec", "externalName"]).to_string(),
        _ => "<unknown>".into(),
    }
}

fn service_ports(svc: &Value) -> String {
    let ports: Vec<String> = list(svc, &["spec", "ports"])
        .iter()
        .map(|p| {
            let port = int(p, &["port"]);
            let protocol = st_or(p, &["protocol"], "TCP");
            match int(p, &["nodePort"]) {
                node_port if node_port > 0 => format!("{port}:{node_port}/{protocol}"),
                _ => format!("{port}/{protocol}"),
            }
        })
        .collect();
    if ports.is_empty() {
        "<none>".into()
    } else {
        ports.join(",")
    }
}

fn service_cells(svc: &Value, now: Timestamp) -> Vec<Value> {
    let svc_type = st_or(svc, &["spec", "type"], "ClusterIP");
    let cluster_ip = match list(svc, &["spec", "clusterIPs"]).first() {
        Some(ip) => ip.as_str().unwrap_or("").to_string(),
        None => st_or(svc, &["spec", "clusterIP"], "<none>").to_string(),
    };
    vec![
        name(svc),
        s(svc_type),
        s(cluster_ip),
        s(service_external_ip(svc, svc_type)),
        s(service_ports(svc)),
        age(svc, now),
        s(format_labels(at(svc, &["spec", "selector"]))),
    ]
}

fn ingress_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    let rules = list(obj, &["spec", "rules"]);
    let mut hosts: Vec<&str> = Vec::new();
    let mut more = false;
    for rule in rules {
        if hosts.len() == 3 {
            more = true;
        }
        let host = st(rule, &["host"]);
        if !more && !host.is_empty() {
            hosts.push(host);
        }
    }
    let hosts = if hosts.is_empty() {
        "*".to_string()
    } else if more {
        format!("{} + {} more...", hosts.join(","), rules.len() - 3)
    } else {
        hosts.join(",")
    };
    let ports = if list(obj, &["spec", "tls"]).is_empty() { "80" } else { "80, 443" };
    vec![
        name(obj),
        s(at(obj, &["spec", "ingressClassName"]).and_then(Value::as_str).unwrap_or("<none>")),
        s(hosts),
        s(load_balancer_ingress(obj)),
        s(ports),
        age(obj, now),
    ]
}

fn ingress_class_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    let parameters = match at(obj, &["spec", "parameters"]) {
        None => "<none>".to_string(),
        Some(p) => {
            let mut text = st(p, &["kind"]).to_string();
            if let Some(group) = at(p, &["apiGroup"]).and_then(Value::as_str) {
                text = format!("{text}.{group}");
            }
            format!("{text}/{}", st(p, &["name"]))
        }
    };
    vec![name(obj), s(st(obj, &["spec", "controller"])), s(parameters), age(obj, now)]
}

fn host_port(ip: &str, port: i64) -> String {
    if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    }
}

fn format_endpoints(obj: &Value) -> String {
    const MAX: usize = 3;
    let subsets = list(obj, &["subsets"]);
    if subsets.is_empty() {
        return "<none>".into();
    }
    let mut out: Vec<String> = Vec::new();
    let mut more = false;
    let mut total = 0usize;
    for subset in subsets {
        let addresses = list(subset, &["addresses"]);
        let ports = list(subset, &["ports"]);
        if ports.is_empty() {
            // Headless services may have no ports.
            total += addresses.len();
            for addr in addresses {
                if out.len() == MAX {
                    more = true;
                    break;
                }
                out.push(st(addr, &["ip"]).to_string());
            }
            continue;
        }
        for port in ports {
            total += addresses.len();
            for addr in addresses {
                if out.len() == MAX {
                    more = true;
                    break;
                }
                out.push(host_port(st(addr, &["ip"]), int(port, &["port"])));
            }
        }
    }
    let joined = out.join(",");
    if more {
        format!("{joined} + {} more...", total - MAX)
    } else {
        joined
    }
}

fn endpoints_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    vec![name(obj), s(format_endpoints(obj)), age(obj, now)]
}

/// Up to three items, then " + N more..."; "<unset>" when there are none.
fn list_with_more(items: Vec<String>) -> String {
    const MAX: usize = 3;
    let total = items.len();
    let shown = items.into_iter().take(MAX).collect::<Vec<_>>().join(",");
    if total > MAX {
        format!("{shown} + {} more...", total - MAX)
    } else if shown.is_empty() {
        "<unset>".into()
    } else {
        shown
    }
}

fn endpoint_slice_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    let ports: Vec<String> = list(obj, &["ports"])
        .iter()
        .map(|p| match (at(p, &["port"]).and_then(Value::as_i64), at(p, &["name"]).and_then(Value::as_str)) {
            (Some(port), _) => port.to_string(),
            (None, Some(port_name)) => port_name.to_string(),
            (None, None) => "*".to_string(),
        })
        .collect();
    let addresses: Vec<String> = list(obj, &["endpoints"])
        .iter()
        .flat_map(|e| list(e, &["addresses"]).iter().map(|a| a.as_str().unwrap_or("").to_string()))
        .collect();
    vec![
        name(obj),
        s(st(obj, &["addressType"])),
        s(list_with_more(ports)),
        s(list_with_more(addresses)),
        age(obj, now),
    ]
}

fn node_cells(node: &Value, now: Timestamp) -> Vec<Value> {
    let mut status: Vec<&str> = Vec::new();
    // The last Ready condition wins, as in upstream's condition map.
    if let Some(cond) = list(node, &["status", "conditions"]).iter().rev().find(|c| st(c, &["type"]) == "Ready") {
        status.push(if st(cond, &["status"]) == "True" { "Ready" } else { "NotReady" });
    }
    if status.is_empty() {
        status.push("Unknown");
    }
    if boolean(node, &["spec", "unschedulable"]) == Some(true) {
        status.push("SchedulingDisabled");
    }

    let mut roles: BTreeSet<&str> = BTreeSet::new();
    if let Some(labels) = at(node, &["metadata", "labels"]).and_then(Value::as_object) {
        for (key, value) in labels {
            if let Some(role) = key.strip_prefix("node-role.kubernetes.io/") {
                if !role.is_empty() {
                    roles.insert(role);
                }
            } else if key == "kubernetes.io/role" {
                if let Some(role) = value.as_str().filter(|r| !r.is_empty()) {
                    roles.insert(role);
                }
            }
        }
    }
    let roles = if roles.is_empty() {
        "<none>".to_string()
    } else {
        roles.into_iter().collect::<Vec<_>>().join(",")
    };

    let address = |type_: &str| {
        list(node, &["status", "addresses"])
            .iter()
            .find(|a| st(a, &["type"]) == type_)
            .map_or("<none>", |a| st(a, &["address"]))
    };
    let info = |key: &str| st_or(node, &["status", "nodeInfo", key], "<unknown>");
    vec![
        name(node),
        s(status.join(",")),
        s(roles),
        age(node, now),
        s(st(node, &["status", "nodeInfo", "kubeletVersion"])),
        s(address("InternalIP")),
        s(address("ExternalIP")),
        s(info("osImage")),
        s(info("kernelVersion")),
        s(info("containerRuntimeVersion")),
    ]
}

/// Events of core/v1 and of events.k8s.io/v1 (whose fields have other names) print alike.
fn event_cells(ev: &Value, now: Timestamp) -> Vec<Value> {
    let new_api = st(ev, &["apiVersion"]).starts_with("events.k8s.io/")
        || (at(ev, &["involvedObject"]).is_none() && at(ev, &["regarding"]).is_some());
    let (first_key, last_key, count_key, involved_key, message_key, source_key, controller_key) = if new_api {
        (
            "deprecatedFirstTimestamp",
            "deprecatedLastTimestamp",
            "deprecatedCount",
            "regarding",
            "note",
            "deprecatedSource",
            "reportingController",
        )
    } else {
        ("firstTimestamp", "lastTimestamp", "count", "involvedObject", "message", "source", "reportingComponent")
    };

    let mut first_seen = translate_timestamp_since(at(ev, &[first_key]), now);
    if timestamp(at(ev, &[first_key])).is_none() {
        first_seen = translate_timestamp_since(at(ev, &["eventTime"]), now);
    }
    let mut last_seen = if timestamp(at(ev, &[last_key])).is_none() {
        first_seen.clone()
    } else {
        translate_timestamp_since(at(ev, &[last_key]), now)
    };
    let mut count = int(ev, &[count_key]);
    if let Some(series) = at(ev, &["series"]) {
        last_seen = translate_timestamp_since(at(series, &["lastObservedTime"]), now);
        count = int(series, &["count"]);
    } else if count == 0 {
        // Singleton events of the new API have no count.
        count = 1;
    }

    let kind = st(ev, &[involved_key, "kind"]).to_lowercase();
    let target = match st(ev, &[involved_key, "name"]) {
        "" => kind,
        obj_name => format!("{kind}/{obj_name}"),
    };
    let component = st_or(ev, &[source_key, "component"], st(ev, &[controller_key]));
    let instance = st_or(ev, &[source_key, "host"], st(ev, &["reportingInstance"]));
    let source = if instance.is_empty() { component.to_string() } else { format!("{component}, {instance}") };

    vec![
        s(last_seen),
        s(st(ev, &["type"])),
        s(st(ev, &["reason"])),
        s(target),
        s(st(ev, &[involved_key, "fieldPath"])),
        s(source),
        s(st(ev, &[message_key]).trim()),
        s(first_seen),
        Value::from(count),
        name(ev),
    ]
}

fn namespace_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    vec![name(obj), s(st_or(obj, &["status", "phase"], "Active")), age(obj, now)]
}

fn secret_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    vec![name(obj), s(st_or(obj, &["type"], "Opaque")), count(map_len(obj, &["data"])), age(obj, now)]
}

fn service_account_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    vec![name(obj), count(list(obj, &["secrets"]).len()), age(obj, now)]
}

fn config_map_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    vec![name(obj), count(map_len(obj, &["data"]) + map_len(obj, &["binaryData"])), age(obj, now)]
}

const BETA_STORAGE_CLASS_ANNOTATION: &str = "volume.beta.kubernetes.io/storage-class";

fn pv_cells(pv: &Value, now: Timestamp) -> Vec<Value> {
    let claim = match at(pv, &["spec", "claimRef"]) {
        Some(c) => format!("{}/{}", st(c, &["namespace"]), st(c, &["name"])),
        None => String::new(),
    };
    let phase = if is_deleting(pv) { "Terminating" } else { st_or(pv, &["status", "phase"], "Pending") };
    let class = match at(pv, &["metadata", "annotations", BETA_STORAGE_CLASS_ANNOTATION]) {
        Some(v) => v.as_str().unwrap_or(""),
        None => st(pv, &["spec", "storageClassName"]),
    };
    vec![
        name(pv),
        s(quantity(at(pv, &["spec", "capacity", "storage"]))),
        s(access_modes(list(pv, &["spec", "accessModes"]))),
        s(st_or(pv, &["spec", "persistentVolumeReclaimPolicy"], "Retain")),
        s(phase),
        s(claim),
        s(class),
        s(at(pv, &["spec", "volumeAttributesClassName"]).and_then(Value::as_str).unwrap_or("<unset>")),
        s(st(pv, &["status", "reason"])),
        age(pv, now),
        s(at(pv, &["spec", "volumeMode"]).and_then(Value::as_str).unwrap_or("Filesystem")),
    ]
}

fn pvc_cells(pvc: &Value, now: Timestamp) -> Vec<Value> {
    let phase = if is_deleting(pvc) { "Terminating" } else { st_or(pvc, &["status", "phase"], "Pending") };
    let volume = st(pvc, &["spec", "volumeName"]);
    let (capacity, modes) = if volume.is_empty() {
        (String::new(), String::new())
    } else {
        (
            quantity(at(pvc, &["status", "capacity", "storage"])),
            access_modes(list(pvc, &["status", "accessModes"])),
        )
    };
    let class = match at(pvc, &["metadata", "annotations", BETA_STORAGE_CLASS_ANNOTATION]) {
        Some(v) => v.as_str().unwrap_or(""),
        None => st(pvc, &["spec", "storageClassName"]),
    };
    vec![
        name(pvc),
        s(phase),
        s(volume),
        s(capacity),
        s(modes),
        s(class),
        s(at(pvc, &["spec", "volumeAttributesClassName"]).and_then(Value::as_str).unwrap_or("<unset>")),
        age(pvc, now),
        s(at(pvc, &["spec", "volumeMode"]).and_then(Value::as_str).unwrap_or("Filesystem")),
    ]
}

fn component_status_cells(obj: &Value) -> Vec<Value> {
    let (mut status, mut message, mut error) = ("Unknown", "", "");
    if let Some(c) = list(obj, &["conditions"]).iter().find(|c| st(c, &["type"]) == "Healthy") {
        status = if st(c, &["status"]) == "True" { "Healthy" } else { "Unhealthy" };
        message = st(c, &["message"]);
        error = st(c, &["error"]);
    }
    vec![name(obj), s(status), s(message), s(error)]
}

fn network_policy_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    vec![name(obj), s(format_label_selector(at(obj, &["spec", "podSelector"]))), age(obj, now)]
}

fn role_binding_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
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

fn csr_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
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

fn lease_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    vec![name(obj), s(st(obj, &["spec", "holderIdentity"])), age(obj, now)]
}

fn storage_class_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    let is_default = ["storageclass.kubernetes.io/is-default-class", "storageclass.beta.kubernetes.io/is-default-class"]
        .iter()
        .any(|a| st(obj, &["metadata", "annotations", *a]) == "true");
    let mut display = st(obj, &["metadata", "name"]).to_string();
    if is_default {
        display.push_str(" (default)");
    }
    vec![
        s(display),
        s(st(obj, &["provisioner"])),
        s(st_or(obj, &["reclaimPolicy"], "Delete")),
        s(st_or(obj, &["volumeBindingMode"], "Immediate")),
        Value::Bool(boolean(obj, &["allowVolumeExpansion"]).unwrap_or(false)),
        age(obj, now),
    ]
}

fn controller_revision_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    let controller = list(obj, &["metadata", "ownerReferences"])
        .iter()
        .find(|r| boolean(r, &["controller"]) == Some(true))
        .map_or_else(
            || "<none>".to_string(),
            |r| {
                let api_version = st(r, &["apiVersion"]);
                let group = api_version.split_once('/').map_or("", |(g, _)| g);
                let kind = st(r, &["kind"]);
                let owner = st(r, &["name"]);
                match (group, kind) {
                    ("", "") => owner.to_string(),
                    ("", k) => format!("{}/{owner}", k.to_lowercase()),
                    (g, k) => format!("{}.{}/{owner}", k.to_lowercase(), g.to_lowercase()),
                }
            },
        );
    vec![name(obj), s(controller), Value::from(int(obj, &["revision"])), age(obj, now)]
}

fn resource_quota_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    let mut resources: Vec<&String> =
        at(obj, &["status", "hard"]).and_then(Value::as_object).map(|m| m.keys().collect()).unwrap_or_default();
    resources.sort();
    let (mut requests, mut limits) = (Vec::new(), Vec::new());
    for resource in resources {
        let used = quantity(at(obj, &["status", "used", resource.as_str()]));
        let hard = quantity(at(obj, &["status", "hard", resource.as_str()]));
        let entry = format!("{resource}: {used}/{hard}");
        match resource.split_once('.') {
            Some(("limits", _)) => limits.push(entry),
            _ => requests.push(entry),
        }
    }
    vec![name(obj), s(requests.join(", ")), s(limits.join(", ")), age(obj, now)]
}

fn priority_class_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    vec![
        name(obj),
        Value::from(int(obj, &["value"])),
        Value::Bool(boolean(obj, &["globalDefault"]).unwrap_or(false)),
        age(obj, now),
        s(st_or(obj, &["preemptionPolicy"], "PreemptLowerPriority")),
    ]
}

fn runtime_class_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    vec![name(obj), s(st(obj, &["handler"])), age(obj, now)]
}

fn volume_attachment_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    vec![
        name(obj),
        s(st(obj, &["spec", "attacher"])),
        s(st(obj, &["spec", "source", "persistentVolumeName"])),
        s(st(obj, &["spec", "nodeName"])),
        Value::Bool(boolean(obj, &["status", "attached"]).unwrap_or(false)),
        age(obj, now),
    ]
}

fn csi_node_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    vec![name(obj), count(list(obj, &["spec", "drivers"]).len()), age(obj, now)]
}

fn csi_driver_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    let token_requests = match at(obj, &["spec", "tokenRequests"]).and_then(Value::as_array) {
        None => "<unset>".to_string(),
        Some(reqs) => reqs.iter().map(|r| st(r, &["audience"])).collect::<Vec<_>>().join(","),
    };
    let modes: Vec<&str> = list(obj, &["spec", "volumeLifecycleModes"]).iter().filter_map(Value::as_str).collect();
    // Defaulting turns an empty mode list into ["Persistent"].
    let modes = if modes.is_empty() { "Persistent".to_string() } else { modes.join(",") };
    vec![
        name(obj),
        Value::Bool(boolean(obj, &["spec", "attachRequired"]).unwrap_or(true)),
        Value::Bool(boolean(obj, &["spec", "podInfoOnMount"]).unwrap_or(false)),
        Value::Bool(boolean(obj, &["spec", "storageCapacity"]).unwrap_or(false)),
        s(token_requests),
        Value::Bool(boolean(obj, &["spec", "requiresRepublish"]).unwrap_or(false)),
        s(modes),
        age(obj, now),
    ]
}

fn csi_storage_capacity_cells(obj: &Value) -> Vec<Value> {
    let capacity = match at(obj, &["capacity"]) {
        None => "<unset>".to_string(),
        some => quantity(some),
    };
    vec![name(obj), s(st(obj, &["storageClassName"])), s(capacity)]
}

fn webhook_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    vec![name(obj), count(list(obj, &["webhooks"]).len()), age(obj, now)]
}

// ---------------------------------------------------------------------------------------------
// Column descriptions: upstream takes them from the API types' documentation.

const D_NAME: &str = "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names";
const D_CREATED: &str = "CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null for lists. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata";
const D_POD_IP: &str = "podIP address allocated to the pod. Routable at least within the cluster. Empty if not yet allocated.";
const D_POD_NODE_NAME: &str = "NodeName indicates in which node this pod is scheduled. If empty, this pod is a candidate for scheduling by the scheduler defined in schedulerName. Once this field is set, the kubelet for this node becomes responsible for the lifecycle of this pod. This field should not be used to express a desire for the pod to be scheduled on a specific node. https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/#nodename";
const D_POD_NOMINATED: &str = "nominatedNodeName is set only when this pod preempts other pods on the node, but it cannot be scheduled right away as preemption victims receive their graceful termination periods. This field does not guarantee that the pod will be scheduled on this node. Scheduler may decide to place the pod elsewhere if other nodes become available sooner. Scheduler may also decide to give the resources on this node to a higher priority pod that is created after preemption. As a result, this field may be different than PodSpec.nodeName when the pod is scheduled.";
const D_POD_READINESS_GATES: &str = "If specified, all readiness gates will be evaluated for pod readiness. A pod is ready when all its containers are ready AND all conditions specified in the readiness gates have status equal to \"True\" More info: https://git.k8s.io/enhancements/keps/sig-network/580-pod-readiness-gates";
const D_RC_SPEC_REPLICAS: &str = "Replicas is the number of desired replicas. This is a pointer to distinguish between explicit zero and unspecified. Defaults to 1. More info: https://kubernetes.io/docs/concepts/workloads/controllers/replicationcontroller#what-is-a-replicationcontroller";
const D_RC_STATUS_REPLICAS: &str = "Replicas is the most recently observed number of replicas. More info: https://kubernetes.io/docs/concepts/workloads/controllers/replicationcontroller#what-is-a-replicationcontroller";
const D_RC_READY: &str = "The number of ready replicas for this replication controller.";
const D_RC_SELECTOR: &str = "Selector is a label query over pods that should match the Replicas count. If Selector is empty, it is defaulted to the labels present on the Pod template. Label keys and values that must match in order to be controlled by this replication controller, if empty defaulted to labels on Pod template. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors";
const D_RS_SPEC_REPLICAS: &str = "Replicas is the number of desired pods. This is a pointer to distinguish between explicit zero and unspecified. Defaults to 1. More info: https://kubernetes.io/docs/concepts/workloads/controllers/replicaset";
const D_RS_STATUS_REPLICAS: &str = "Replicas is the most recently observed number of non-terminating pods. More info: https://kubernetes.io/docs/concepts/workloads/controllers/replicaset";
const D_RS_READY: &str = "The number of non-terminating pods targeted by this ReplicaSet with a Ready Condition.";
const D_RS_SELECTOR: &str = "Selector is a label query over pods that should match the replica count. Label keys and values that must match in order to be controlled by this replica set. It must match the pod template's labels. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors";
const D_DS_DESIRED: &str = "The total number of nodes that should be running the daemon pod (including nodes correctly running the daemon pod). More info: https://kubernetes.io/docs/concepts/workloads/controllers/daemonset/";
const D_DS_CURRENT: &str = "The number of nodes that are running at least 1 daemon pod and are supposed to run the daemon pod. More info: https://kubernetes.io/docs/concepts/workloads/controllers/daemonset/";
const D_DS_READY: &str = "numberReady is the number of nodes that should be running the daemon pod and have one or more of the daemon pod running with a Ready Condition.";
const D_DS_UPDATED: &str = "The total number of nodes that are running updated daemon pod";
const D_DS_AVAILABLE: &str = "The number of nodes that should be running the daemon pod and have one or more of the daemon pod running and available (ready for at least spec.minReadySeconds)";
const D_POD_NODE_SELECTOR: &str = "NodeSelector is a selector which must be true for the pod to fit on a node. Selector which must match a node's labels for the pod to be scheduled on that node. More info: https://kubernetes.io/docs/concepts/configuration/assign-pod-node/";
const D_DS_SELECTOR: &str = "A label query over pods that are managed by the daemon set. Must match in order to be controlled. It must match the pod template's labels. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors";
const D_JOB_SUCCEEDED: &str = "The number of pods which reached phase Succeeded. The value increases monotonically for a given spec. However, it may decrease in reaction to scale down of elastic indexed jobs.";
const D_JOB_SELECTOR: &str = "A label query over pods that should match the pod count. Normally, the system sets this field for you. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors";
const D_CJ_SCHEDULE: &str = "The schedule in Cron format, see https://en.wikipedia.org/wiki/Cron.";
const D_CJ_TIME_ZONE: &str = "The time zone name for the given schedule, see https://en.wikipedia.org/wiki/List_of_tz_database_time_zones. If not specified, this will default to the time zone of the kube-controller-manager process. The set of valid time zone names and the time zone offset is loaded from the system-wide time zone database by the API server during CronJob validation and the controller manager during execution. If no system-wide time zone database can be found a bundled version of the database is used instead. If the time zone name becomes invalid during the lifetime of a CronJob or due to a change in host configuration, the controller will stop creating new new Jobs and will create a system event with the reason UnknownTimeZone. More information can be found in https://kubernetes.io/docs/concepts/workloads/controllers/cron-jobs/#time-zones";
const D_CJ_SUSPEND: &str = "This flag tells the controller to suspend subsequent executions, it does not apply to already started executions.  Defaults to false.";
const D_CJ_ACTIVE: &str = "A list of pointers to currently running jobs.";
const D_CJ_LAST_SCHEDULE: &str = "Information when was the last time the job was successfully scheduled.";
const D_SVC_TYPE: &str = "type determines how the Service is exposed. Defaults to ClusterIP. Valid options are ExternalName, ClusterIP, NodePort, and LoadBalancer. \"ClusterIP\" allocates a cluster-internal IP address for load-balancing to endpoints. Endpoints are determined by the selector or if that is not specified, by manual construction of an Endpoints object or EndpointSlice objects. If clusterIP is \"None\", no virtual IP is allocated and the endpoints are published as a set of endpoints rather than a virtual IP. \"NodePort\" builds on ClusterIP and allocates a port on every node which routes to the same endpoints as the clusterIP. \"LoadBalancer\" builds on NodePort and creates an external load-balancer (if supported in the current cloud) which routes to the same endpoints as the clusterIP. \"ExternalName\" aliases this service to the specified externalName. Several other fields do not apply to ExternalName services. More info: https://kubernetes.io/docs/concepts/services-networking/service/#publishing-services-service-types";
const D_SVC_CLUSTER_IP: &str = "clusterIP is the IP address of the service and is usually assigned randomly. If an address is specified manually, is in-range (as per system configuration), and is not in use, it will be allocated to the service; otherwise creation of the service will fail. This field may not be changed through updates unless the type field is also being changed to ExternalName (which requires this field to be blank) or the type field is being changed from ExternalName (in which case this field may optionally be specified, as describe above).  Valid values are \"None\", empty string (\"\"), or a valid IP address. Setting this to \"None\" makes a \"headless service\" (no virtual IP), which is useful when direct endpoint connections are preferred and proxying is not required.  Only applies to types ClusterIP, NodePort, and LoadBalancer. If this field is specified when creating a Service of type ExternalName, creation will fail. This field will be wiped when updating a Service to type ExternalName. More info: https://kubernetes.io/docs/concepts/services-networking/service/#virtual-ips-and-service-proxies";
const D_SVC_EXTERNAL_IPS: &str = "externalIPs is a list of IP addresses for which nodes in the cluster will also accept traffic for this service.  These IPs are not managed by Kubernetes.  The user is responsible for ensuring that traffic arrives at a node with this IP.  A common example is external load-balancers that are not part of the Kubernetes system.";
const D_SVC_PORTS: &str = "The list of ports that are exposed by this service. More info: https://kubernetes.io/docs/concepts/services-networking/service/#virtual-ips-and-service-proxies";
const D_SVC_SELECTOR: &str = "Route service traffic to pods with label keys and values matching this selector. If empty or not present, the service is assumed to have an external process managing its endpoints, which Kubernetes will not modify. Only applies to types ClusterIP, NodePort, and LoadBalancer. Ignored if type is ExternalName. More info: https://kubernetes.io/docs/concepts/services-networking/service/";
const D_EP_SUBSETS: &str = "The set of all endpoints is the union of all subsets. Addresses are placed into subsets according to the IPs they share. A single address with multiple ports, some of which are ready and some of which are not (because they come from different containers) will result in the address being displayed in different subsets for the different ports. No address will appear in both Addresses and NotReadyAddresses in the same subset. Sets of addresses and ports that comprise a service.";
const D_NODE_KUBELET: &str = "Kubelet Version reported by the node.";
const D_NODE_ADDRESSES: &str = "List of addresses reachable to the node. Queried from cloud provider, if available. More info: https://kubernetes.io/docs/reference/node/node-status/#addresses Note: This field is declared as mergeable, but the merge key is not sufficiently unique, which can cause data corruption when it is merged. Callers should instead use a full-replacement patch. See https://pr.k8s.io/79391 for an example. Consumers should assume that addresses can change during the lifetime of a Node. However, there are some exceptions where this may not be possible, such as Pods that inherit a Node's address in its own status or consumers of the downward API (status.hostIP).";
const D_NODE_OS_IMAGE: &str = "OS Image reported by the node from /etc/os-release (e.g. Debian GNU/Linux 7 (wheezy)).";
const D_NODE_KERNEL: &str = "Kernel Version reported by the node from 'uname -r' (e.g. 3.16.0-0.bpo.4-amd64).";
const D_NODE_RUNTIME: &str = "ContainerRuntime Version reported by the node through runtime remote API (e.g. containerd://1.4.2).";
const D_EV_LAST: &str = "The time at which the most recent occurrence of this event was recorded.";
const D_EV_TYPE: &str = "Type of this event (Normal, Warning), new types could be added in the future";
const D_EV_REASON: &str = "This should be a short, machine understandable string that gives the reason for the transition into the object's current status.";
const D_EV_INVOLVED: &str = "The object that this event is about.";
const D_EV_FIELD_PATH: &str = "If referring to a piece of an object instead of an entire object, this string should contain a valid JSON/Go field access statement, such as desiredState.manifest.containers\\[2\\]. For example, if the object reference is to a container within a pod, this would take on a value like: \"spec.containers{name}\" (where \"name\" refers to the name of the container that triggered the event) or if no container name is specified \"spec.containers\\[2\\]\" (container with index 2 in this pod). This syntax is chosen only to have some well-defined way of referencing a part of an object.";
const D_EV_SOURCE: &str = "The component reporting this event. Should be a short machine understandable string.";
const D_EV_MESSAGE: &str = "A human-readable description of the status of this operation.";
const D_EV_FIRST: &str = "The time at which the event was first recorded. (Time of server receipt is in TypeMeta.)";
const D_EV_COUNT: &str = "The number of times this event has occurred.";
const D_SECRET_TYPE: &str = "Used to facilitate programmatic handling of secret data. More info: https://kubernetes.io/docs/concepts/configuration/secret/#secret-types";
const D_SECRET_DATA: &str = "Data contains the secret data. Each key must consist of alphanumeric characters, '-', '_' or '.'. The serialized form of the secret data is a base64 encoded string, representing the arbitrary (possibly non-string) data value here. Described in https://tools.ietf.org/html/rfc4648#section-4";
const D_SA_SECRETS: &str = "Secrets is a list of the secrets in the same namespace that pods running using this ServiceAccount are allowed to use. Pods are only limited to this list if this service account has a \"kubernetes.io/enforce-mountable-secrets\" annotation set to \"true\". The \"kubernetes.io/enforce-mountable-secrets\" annotation is deprecated since v1.32. Prefer separate namespaces to isolate access to mounted secrets. This field should not be used to find auto-generated service account token secrets for use outside of pods. Instead, tokens can be requested directly using the TokenRequest API, or service account token secrets can be manually created. More info: https://kubernetes.io/docs/concepts/configuration/secret";
const D_PV_CAPACITY: &str = "capacity is the description of the persistent volume's resources and capacity. More info: https://kubernetes.io/docs/concepts/storage/persistent-volumes#capacity";
const D_PV_ACCESS_MODES: &str = "accessModes contains all ways the volume can be mounted. More info: https://kubernetes.io/docs/concepts/storage/persistent-volumes#access-modes";
const D_PV_RECLAIM: &str = "persistentVolumeReclaimPolicy defines what happens to a persistent volume when released from its claim. Valid options are Retain (default for manually created PersistentVolumes), Delete (default for dynamically provisioned PersistentVolumes), and Recycle (deprecated). Recycle must be supported by the volume plugin underlying this PersistentVolume. More info: https://kubernetes.io/docs/concepts/storage/persistent-volumes#reclaiming";
const D_PV_PHASE: &str = "phase indicates if a volume is available, bound to a claim, or released by a claim. More info: https://kubernetes.io/docs/concepts/storage/persistent-volumes#phase";
const D_PV_CLAIM: &str = "claimRef is part of a bi-directional binding between PersistentVolume and PersistentVolumeClaim. Expected to be non-nil when bound. claim.VolumeName is the authoritative bind between PV and PVC. More info: https://kubernetes.io/docs/concepts/storage/persistent-volumes#binding";
const D_PV_REASON: &str = "reason is a brief CamelCase string that describes any failure and is meant for machine parsing and tidy display in the CLI.";
const D_PV_VOLUME_MODE: &str = "volumeMode defines if a volume is intended to be used with a formatted filesystem or to remain in raw block state. Value of Filesystem is implied when not included in spec.";
const D_PVC_PHASE: &str = "phase represents the current phase of PersistentVolumeClaim.";
const D_PVC_VOLUME_NAME: &str = "volumeName is the binding reference to the PersistentVolume backing this claim.";
const D_PVC_CAPACITY: &str = "capacity represents the actual resources of the underlying volume.";
const D_PVC_ACCESS_MODES: &str = "accessModes contains the actual access modes the volume backing the PVC has. More info: https://kubernetes.io/docs/concepts/storage/persistent-volumes#access-modes-1";
const D_PVC_VOLUME_MODE: &str = "volumeMode defines what type of volume is required by the claim. Value of Filesystem is implied when not included in claim spec.";
const D_DEPLOY_UPDATED: &str = "Total number of non-terminating pods targeted by this deployment that have the desired template spec.";
const D_DEPLOY_AVAILABLE: &str = "Total number of available non-terminating pods (ready for at least minReadySeconds) targeted by this deployment.";
const D_DEPLOY_SELECTOR: &str = "Label selector for pods. Existing ReplicaSets whose pods are selected by this will be the ones affected by this deployment. It must match the pod template's labels.";
const D_CM_DATA: &str = "Data contains the configuration data. Each key must consist of alphanumeric characters, '-', '_' or '.'. Values with non-UTF-8 byte sequences must use the BinaryData field. The keys stored in Data must not overlap with the keys in the BinaryData field, this is enforced during validation process.";
const D_NP_POD_SELECTOR: &str = "podSelector selects the pods to which this NetworkPolicy object applies. The array of ingress rules is applied to any pods selected by this field. Multiple network policies can select the same set of pods. In this case, the ingress rules for each are combined additively. This field is NOT optional and follows standard label selector semantics. An empty podSelector matches all pods in this namespace.";
const D_RB_ROLE_REF: &str = "RoleRef can reference a Role in the current namespace or a ClusterRole in the global namespace. If the RoleRef cannot be resolved, the Authorizer must return an error. This field is immutable.";
const D_CRB_ROLE_REF: &str = "RoleRef can only reference a ClusterRole in the global namespace. If the RoleRef cannot be resolved, the Authorizer must return an error. This field is immutable.";
const D_CSR_SIGNER: &str = "signerName indicates the requested signer, and is a qualified name.\n\nList/watch requests for CertificateSigningRequests can filter on this field using a \"spec.signerName=NAME\" fieldSelector.\n\nWell-known Kubernetes signers are:\n1. \"kubernetes.io/kube-apiserver-client\": issues client certificates that can be used to authenticate to kube-apiserver.\nRequests for this signer are never auto-approved by kube-controller-manager, can be issued by the \"csrsigning\" controller in kube-controller-manager.\n2. \"kubernetes.io/kube-apiserver-client-kubelet\": issues client certificates that kubelets use to authenticate to kube-apiserver.\nRequests for this signer can be auto-approved by the \"csrapproving\" controller in kube-controller-manager, and can be issued by the \"csrsigning\" controller in kube-controller-manager.\n3. \"kubernetes.io/kubelet-serving\" issues serving certificates that kubelets use to serve TLS endpoints, which kube-apiserver can connect to securely.\nRequests for this signer are never auto-approved by kube-controller-manager, and can be issued by the \"csrsigning\" controller in kube-controller-manager.\n\nMore details are available at https://k8s.io/docs/reference/access-authn-authz/certificate-signing-requests/#kubernetes-signers\n\nCustom signerNames can also be specified. The signer defines:\n1. Trust distribution: how trust (CA bundles) are distributed.\n2. Permitted subjects: and behavior when a disallowed subject is requested.\n3. Required, permitted, or forbidden x509 extensions in the request (including whether subjectAltNames are allowed, which types, restrictions on allowed values) and behavior when a disallowed extension is requested.\n4. Required, permitted, or forbidden key usages / extended key usages.\n5. Expiration/certificate lifetime: whether it is fixed by the signer, configurable by the admin.\n6. Whether or not requests for CA certificates are allowed.";
const D_CSR_REQUEST: &str = "request contains an x509 certificate signing request encoded in a \"CERTIFICATE REQUEST\" PEM block. When serialized as JSON or YAML, the data is additionally base64-encoded.";
const D_CSR_EXPIRATION: &str = "expirationSeconds is the requested duration of validity of the issued certificate. The certificate signer may issue a certificate with a different validity duration so a client must check the delta between the notBefore and and notAfter fields in the issued certificate to determine the actual duration.\n\nThe v1.22+ in-tree implementations of the well-known Kubernetes signers will honor this field as long as the requested duration is not greater than the maximum duration they will honor per the --cluster-signing-duration CLI flag to the Kubernetes controller manager.\n\nCertificate signers may not honor this field for various reasons:\n\n1. Old signer that is unaware of the field (such as the in-tree\nimplementations prior to v1.22)\n2. Signer whose configured maximum is shorter than the requested duration\n3. Signer whose configured minimum is longer than the requested duration\n\nThe minimum valid value for expirationSeconds is 600, i.e. 10 minutes.";
const D_CSR_CONDITIONS: &str = "conditions applied to the request. Known conditions are \"Approved\", \"Denied\", and \"Failed\".";
const D_LEASE_HOLDER: &str = "holderIdentity contains the identity of the holder of a current lease. If Coordinated Leader Election is used, the holder identity must be equal to the elected LeaseCandidate.metadata.name field.";
const D_SC_PROVISIONER: &str = "provisioner indicates the type of the provisioner.";
const D_SC_RECLAIM: &str = "reclaimPolicy controls the reclaimPolicy for dynamically provisioned PersistentVolumes of this storage class. Defaults to Delete.";
const D_SC_BINDING_MODE: &str = "volumeBindingMode indicates how PersistentVolumeClaims should be provisioned and bound.  When unset, VolumeBindingImmediate is used. This field is only honored by servers that enable the VolumeScheduling feature.";
const D_SC_EXPANSION: &str = "allowVolumeExpansion shows whether the storage class allow volume expand.";
const D_CR_REVISION: &str = "Revision indicates the revision of the state represented by Data.";
const D_PC_VALUE: &str = "value represents the integer value of this priority class. This is the actual priority that pods receive when they have the name of this class in their pod spec.";
const D_PC_GLOBAL_DEFAULT: &str = "globalDefault specifies whether this PriorityClass should be considered as the default priority for pods that do not have any priority class. Only one PriorityClass can be marked as `globalDefault`. However, if more than one PriorityClasses exists with their `globalDefault` field set to true, the smallest value of such global default PriorityClasses will be used as the default priority.";
const D_PC_PREEMPTION: &str = "preemptionPolicy is the Policy for preempting pods with lower priority. One of Never, PreemptLowerPriority. Defaults to PreemptLowerPriority if unset.";
const D_VA_ATTACHER: &str = "attacher indicates the name of the volume driver that MUST handle this request. This is the name returned by GetPluginName().";
const D_VA_PV: &str = "persistentVolumeName represents the name of the persistent volume to attach.";
const D_VA_NODE: &str = "nodeName represents the node that the volume should be attached to.";
const D_VA_ATTACHED: &str = "attached indicates the volume is successfully attached. This field must only be set by the entity completing the attach operation, i.e. the external-attacher.";
const D_ES_ADDRESS_TYPE: &str = "addressType specifies the type of address carried by this EndpointSlice. All addresses in this slice must be the same type. This field is immutable after creation. The following address types are currently supported: * IPv4: Represents an IPv4 Address. * IPv6: Represents an IPv6 Address. * FQDN: Represents a Fully Qualified Domain Name. (Deprecated) The EndpointSlice controller only generates, and kube-proxy only processes, slices of addressType \"IPv4\" and \"IPv6\". No semantics are defined for the \"FQDN\" type.";
const D_ES_PORTS: &str = "ports specifies the list of network ports exposed by each endpoint in this slice. Each port must have a unique name. Each slice may include a maximum of 100 ports. Services always have at least 1 port, so EndpointSlices generated by the EndpointSlice controller will likewise always have at least 1 port. EndpointSlices used for other purposes may have an empty ports list.";
const D_ES_ENDPOINTS: &str = "endpoints is a list of unique endpoints in this slice. Each slice may include a maximum of 1000 endpoints.";
const D_CSID_ATTACH: &str = "attachRequired indicates this CSI volume driver requires an attach operation (because it implements the CSI ControllerPublishVolume() method), and that the Kubernetes attach detach controller should call the attach volume interface which checks the volumeattachment status and waits until the volume is attached before proceeding to mounting. The CSI external-attacher coordinates with CSI volume driver and updates the volumeattachment status when the attach operation is complete. If the CSIDriverRegistry feature gate is enabled and the value is specified to false, the attach operation will be skipped. Otherwise the attach operation will be called.\n\nThis field is immutable.";
const D_CSID_POD_INFO: &str = "podInfoOnMount indicates this CSI volume driver requires additional pod information (like podName, podUID, etc.) during mount operations, if set to true. If set to false, pod information will not be passed on mount. Default is false.\n\nThe CSI driver specifies podInfoOnMount as part of driver deployment. If true, Kubelet will pass pod information as VolumeContext in the CSI NodePublishVolume() calls. The CSI driver is responsible for parsing and validating the information passed in as VolumeContext.\n\nThe following VolumeContext will be passed if podInfoOnMount is set to true. This list might grow, but the prefix will be used. \"csi.storage.k8s.io/pod.name\": pod.Name \"csi.storage.k8s.io/pod.namespace\": pod.Namespace \"csi.storage.k8s.io/pod.uid\": string(pod.UID) \"csi.storage.k8s.io/ephemeral\": \"true\" if the volume is an ephemeral inline volume\ndefined by a CSIVolumeSource, otherwise \"false\"\n\n\"csi.storage.k8s.io/ephemeral\" is a new feature in Kubernetes 1.16. It is only required for drivers which support both the \"Persistent\" and \"Ephemeral\" VolumeLifecycleMode. Other drivers can leave pod info disabled and/or ignore this field. As Kubernetes 1.15 doesn't support this field, drivers can only support one mode when deployed on such a cluster and the deployment determines which mode that is, for example via a command line parameter of the driver.\n\nThis field was immutable in Kubernetes \\< 1.29 and now is mutable.";
const D_CSID_CAPACITY: &str = "storageCapacity indicates that the CSI volume driver wants pod scheduling to consider the storage capacity that the driver deployment will report by creating CSIStorageCapacity objects with capacity information, if set to true.\n\nThe check can be enabled immediately when deploying a driver. In that case, provisioning new volumes with late binding will pause until the driver deployment has published some suitable CSIStorageCapacity object.\n\nAlternatively, the driver can be deployed with the field unset or false and it can be flipped later when storage capacity information has been published.\n\nThis field was immutable in Kubernetes \\<= 1.22 and now is mutable.";
const D_CSID_TOKEN: &str = "tokenRequests indicates the CSI driver needs pods' service account tokens it is mounting volume for to do necessary authentication. Kubelet will pass the tokens in VolumeContext in the CSI NodePublishVolume calls. The CSI driver should parse and validate the following VolumeContext: \"csi.storage.k8s.io/serviceAccount.tokens\": {\n\"\\<audience\\>\": {\n\"token\": \\<token\\>,\n\"expirationTimestamp\": \\<expiration timestamp in RFC3339\\>,\n},\n...\n}\n\nNote: Audience in each TokenRequest should be different and at most one token is empty string. To receive a new token after expiry, RequiresRepublish can be used to trigger NodePublishVolume periodically.";
const D_CSID_REPUBLISH: &str = "requiresRepublish indicates the CSI driver wants `NodePublishVolume` being periodically called to reflect any possible change in the mounted volume. This field defaults to false.\n\nNote: After a successful initial NodePublishVolume call, subsequent calls to NodePublishVolume should only update the contents of the volume. New mount points will not be seen by a running container.";
const D_CSID_MODES: &str = "volumeLifecycleModes defines what kind of volumes this CSI volume driver supports. The default if the list is empty is \"Persistent\", which is the usage defined by the CSI specification and implemented in Kubernetes via the usual PV/PVC mechanism.\n\nThe other mode is \"Ephemeral\". In this mode, volumes are defined inline inside the pod spec with CSIVolumeSource and their lifecycle is tied to the lifecycle of that pod. A driver has to be aware of this because it is only going to get a NodePublishVolume call for such a volume.\n\nFor more information about implementing this mode, see https://kubernetes-csi.github.io/docs/ephemeral-local-volumes.html A driver can support one or more of these modes and more modes may be added in the future.\n\nThis field is beta. This field is immutable.";
const D_CSISC_CLASS: &str = "storageClassName represents the name of the StorageClass that the reported capacity applies to. It must meet the same requirements as the name of a StorageClass object (non-empty, DNS subdomain). If that object no longer exists, the CSIStorageCapacity object is obsolete and should be removed by its creator. This field is immutable.";
const D_CSISC_CAPACITY: &str = "capacity is the value reported by the CSI driver in its GetCapacityResponse for a GetCapacityRequest with topology and parameters that match the previous fields.\n\nThe semantic is currently (CSI spec 1.2) defined as: The available capacity, in bytes, of the storage that can be used to provision volumes. If not set, that information is currently unavailable.";

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn now() -> Timestamp {
        "2024-05-01T12:00:00Z".parse().unwrap()
    }

    /// RFC 3339 time `secs` seconds before `now()`.
    fn ago(secs: i64) -> String {
        let ts = now().checked_sub(jiff::SignedDuration::from_secs(secs)).unwrap();
        ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
    }

    fn meta(name: &str) -> Value {
        json!({"name": name, "namespace": "default", "uid": "u-1", "resourceVersion": "42",
               "creationTimestamp": ago(5 * 86400)})
    }

    fn cells_of(resource: &str, obj: &Value) -> Vec<Value> {
        let out = cells(resource, obj, now());
        assert_eq!(out.len(), columns(resource).len(), "{resource}: one cell per column");
        out
    }

    fn names(resource: &str) -> Vec<(&'static str, &'static str, i32)> {
        columns(resource).iter().map(|c| (c.name, c.type_, c.priority)).collect()
    }

    // --- durations -------------------------------------------------------------------------

    #[test]
    fn human_duration_boundaries() {
        let cases: &[(u64, &str)] = &[
            (0, "0s"),
            (1, "1s"),
            (119, "119s"),
            (120, "2m"),
            (150, "2m30s"),
            (599, "9m59s"),
            (600, "10m"),
            (3 * 3600 - 1, "179m"),
            (3 * 3600, "3h"),
            (3 * 3600 + 30 * 60, "3h30m"),
            (8 * 3600 - 1, "7h59m"),
            (8 * 3600, "8h"),
            (48 * 3600 - 1, "47h"),
            (48 * 3600, "2d"),
            (49 * 3600, "2d1h"),
            (8 * 86400 - 1, "7d23h"),
            (8 * 86400, "8d"),
            (730 * 86400 - 1, "729d"),
            (730 * 86400, "2y"),
            (731 * 86400, "2y1d"),
            (8 * 365 * 86400 - 1, "7y364d"),
            (8 * 365 * 86400, "8y"),
            (20 * 365 * 86400, "20y"),
        ];
        for (secs, want) in cases {
            assert_eq!(human_duration(Duration::from_secs(*secs)), *want, "{secs}s");
        }
        assert_eq!(human_duration(Duration::from_millis(1999)), "1s");
    }

    #[test]
    fn future_timestamps_and_unknown() {
        assert_eq!(human_duration_nanos(-1_500_000_000), "0s");
        assert_eq!(human_duration_nanos(-1_999_999_999), "0s");
        assert_eq!(human_duration_nanos(-2_000_000_000), "<invalid>");
        let future = json!("2024-05-01T12:00:01Z");
        assert_eq!(translate_timestamp_since(Some(&future), now()), "0s");
        let far = json!("2024-05-01T12:00:10Z");
        assert_eq!(translate_timestamp_since(Some(&far), now()), "<invalid>");
        assert_eq!(translate_timestamp_since(None, now()), "<unknown>");
        assert_eq!(translate_timestamp_since(Some(&json!("0001-01-01T00:00:00Z")), now()), "<unknown>");
        assert_eq!(translate_timestamp_since(Some(&json!("2024-05-01T11:59:30.123456Z")), now()), "29s");
    }

    // --- helpers ---------------------------------------------------------------------------

    #[test]
    fn quantities_print_canonically() {
        let cases = [
            ("10Gi", "10Gi"),
            ("1024Mi", "1Gi"),
            ("1536Mi", "1536Mi"),
            ("1.5Gi", "1536Mi"),
            ("2048Ki", "2Mi"),
            ("1000", "1k"),
            ("1000M", "1G"),
            ("1500M", "1500M"),
            ("1.5G", "1500M"),
            ("0.5", "500m"),
            ("100m", "100m"),
            ("0", "0"),
            ("0Gi", "0"),
            ("512", "512"),
            ("0.5Ki", "512"),
            ("1e3", "1e3"),
            ("1E", "1E"),
            ("-2Gi", "-2Gi"),
            ("1n", "1n"),
            ("0.1n", "1n"),
            ("5", "5"),
            ("12345", "12345"),
        ];
        for (input, want) in cases {
            assert_eq!(canonical_quantity(input).as_deref(), Some(want), "{input}");
        }
        assert_eq!(canonical_quantity("abc"), None);
        assert_eq!(quantity(None), "0");
        assert_eq!(quantity(Some(&json!(2048))), "2048");
    }

    #[test]
    fn label_selectors_format_like_upstream() {
        let sel = json!({
            "matchLabels": {"b": "2", "a": "1"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["web", "api"]},
                {"key": "env", "operator": "NotIn", "values": ["dev"]},
                {"key": "canary", "operator": "DoesNotExist"},
                {"key": "zone", "operator": "Exists"}
            ]
        });
        assert_eq!(
            format_label_selector(Some(&sel)),
            "a=1,b=2,!canary,env notin (dev),tier in (api,web),zone"
        );
        assert_eq!(format_label_selector(None), "<none>");
        assert_eq!(format_label_selector(Some(&json!({}))), "<none>");
        let bad = json!({"matchExpressions": [{"key": "x", "operator": "In", "values": []}]});
        assert_eq!(format_label_selector(Some(&bad)), "<error>");
        assert_eq!(format_labels(Some(&json!({"z": "1", "app": "web"}))), "app=web,z=1");
        assert_eq!(format_labels(None), "<none>");
    }

    // --- pods ------------------------------------------------------------------------------

    fn running_pod() -> Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": meta("web-7d4b9c8f5-x2x9q"),
            "spec": {"nodeName": "node-1", "containers": [{"name": "web", "image": "nginx:1.25"}, {"name": "log", "image": "busybox"}]},
            "status": {
                "phase": "Running",
                "podIP": "10.244.1.5",
                "podIPs": [{"ip": "10.244.1.5"}, {"ip": "fd00::5"}],
                "conditions": [{"type": "Initialized", "status": "True"}, {"type": "Ready", "status": "True"}],
                "containerStatuses": [
                    {"name": "web", "ready": true, "restartCount": 0, "state": {"running": {"startedAt": ago(3600)}}},
                    {"name": "log", "ready": true, "restartCount": 0, "state": {"running": {"startedAt": ago(3600)}}}
                ]
            }
        })
    }

    #[test]
    fn pod_columns() {
        assert_eq!(
            names("pods"),
            vec![
                ("Name", "string", 0),
                ("Ready", "string", 0),
                ("Status", "string", 0),
                ("Restarts", "string", 0),
                ("Age", "string", 0),
                ("IP", "string", 1),
                ("Node", "string", 1),
                ("Nominated Node", "string", 1),
                ("Readiness Gates", "string", 1),
            ]
        );
        assert_eq!(columns("pods")[0].format, "name");
        assert_eq!(columns("pods")[1].format, "");
    }

    #[test]
    fn pod_running() {
        assert_eq!(
            cells_of("pods", &running_pod()),
            vec![
                json!("web-7d4b9c8f5-x2x9q"),
                json!("2/2"),
                json!("Running"),
                json!("0"),
                json!("5d"),
                json!("10.244.1.5"),
                json!("node-1"),
                json!("<none>"),
                json!("<none>"),
            ]
        );
    }

    #[test]
    fn pod_pending_unscheduled() {
        let pod = json!({
            "metadata": meta("p"),
            "spec": {"containers": [{"name": "c", "image": "i"}]},
            "status": {"phase": "Pending"}
        });
        assert_eq!(
            cells_of("pods", &pod),
            vec![json!("p"), json!("0/1"), json!("Pending"), json!("0"), json!("5d"), json!("<none>"), json!("<none>"), json!("<none>"), json!("<none>")]
        );
    }

    fn status_of(pod: &Value) -> (Value, Value, Value) {
        let c = cells("pods", pod, now());
        (c[1].clone(), c[2].clone(), c[3].clone())
    }

    #[test]
    fn pod_container_creating_and_image_pull_backoff() {
        let mut pod = running_pod();
        pod["status"]["phase"] = json!("Pending");
        pod["status"]["containerStatuses"][0] =
            json!({"name": "web", "ready": false, "restartCount": 0, "state": {"waiting": {"reason": "ContainerCreating"}}});
        assert_eq!(status_of(&pod), (json!("1/2"), json!("ContainerCreating"), json!("0")));
        pod["status"]["containerStatuses"][1] =
            json!({"name": "log", "ready": false, "restartCount": 0, "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}});
        // The first container's state wins (statuses are walked last to first).
        assert_eq!(status_of(&pod), (json!("0/2"), json!("ContainerCreating"), json!("0")));
        pod["status"]["containerStatuses"][0] =
            json!({"name": "web", "ready": true, "restartCount": 0, "state": {"running": {}}});
        assert_eq!(status_of(&pod), (json!("1/2"), json!("ImagePullBackOff"), json!("0")));
    }

    #[test]
    fn pod_crash_loop_with_last_restart() {
        let mut pod = running_pod();
        pod["status"]["containerStatuses"][0] = json!({
            "name": "web", "ready": false, "restartCount": 5,
            "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 2m40s"}},
            "lastState": {},
            "lastTerminationState": {"terminated": {"exitCode": 1, "reason": "Error", "finishedAt": ago(180)}}
        });
        pod["status"]["containerStatuses"][1]["restartCount"] = json!(1);
        pod["status"]["containerStatuses"][1]["lastTerminationState"] =
            json!({"terminated": {"exitCode": 137, "reason": "OOMKilled", "finishedAt": ago(4000)}});
        assert_eq!(status_of(&pod), (json!("1/2"), json!("CrashLoopBackOff"), json!("6 (3m ago)")));
    }

    #[test]
    fn pod_terminated_without_reason() {
        let mut pod = running_pod();
        pod["status"]["containerStatuses"][0] =
            json!({"name": "web", "ready": false, "restartCount": 0, "state": {"terminated": {"exitCode": 137, "signal": 9}}});
        assert_eq!(status_of(&pod).1, json!("Signal:9"));
        pod["status"]["containerStatuses"][0] =
            json!({"name": "web", "ready": false, "restartCount": 0, "state": {"terminated": {"exitCode": 2}}});
        assert_eq!(status_of(&pod).1, json!("ExitCode:2"));
    }

    #[test]
    fn pod_completed_and_failed() {
        let pod = json!({
            "metadata": meta("job-abc"),
            "spec": {"nodeName": "n1", "containers": [{"name": "main", "image": "busybox"}]},
            "status": {
                "phase": "Succeeded", "podIP": "10.0.0.9",
                "conditions": [{"type": "Ready", "status": "False", "reason": "PodCompleted"}],
                "containerStatuses": [{"name": "main", "ready": false, "restartCount": 0,
                    "state": {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": ago(60)}}}]
            }
        });
        assert_eq!(
            cells_of("pods", &pod),
            vec![json!("job-abc"), json!("0/1"), json!("Completed"), json!("0"), json!("5d"), json!("10.0.0.9"), json!("n1"), json!("<none>"), json!("<none>")]
        );
        let evicted = json!({
            "metadata": meta("ev"),
            "spec": {"containers": [{"name": "c", "image": "i"}]},
            "status": {"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."}
        });
        assert_eq!(status_of(&evicted).1, json!("Evicted"));
    }

    #[test]
    fn pod_completed_container_with_another_running() {
        let mut pod = running_pod();
        pod["status"]["containerStatuses"][0] =
            json!({"name": "web", "ready": false, "restartCount": 0, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}});
        // "log" (walked first) is running and ready; "web" (walked last) completed.
        assert_eq!(status_of(&pod).1, json!("Running"));
        pod["status"]["conditions"][1]["status"] = json!("False");
        assert_eq!(status_of(&pod).1, json!("NotReady"));
    }

    #[test]
    fn pod_terminating_and_node_lost() {
        let mut pod = running_pod();
        pod["metadata"]["deletionTimestamp"] = json!(ago(10));
        assert_eq!(status_of(&pod).1, json!("Terminating"));
        pod["status"]["reason"] = json!("NodeLost");
        assert_eq!(status_of(&pod).1, json!("Unknown"));
        // Finished pods keep their terminal status while being deleted.
        let mut done = running_pod();
        done["metadata"]["deletionTimestamp"] = json!(ago(10));
        done["status"]["phase"] = json!("Succeeded");
        done["status"]["containerStatuses"] = json!([
            {"name": "web", "ready": false, "restartCount": 0, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
            {"name": "log", "ready": false, "restartCount": 0, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}
        ]);
        assert_eq!(status_of(&done).1, json!("Completed"));
    }

    fn init_pod(init_statuses: Value) -> Value {
        json!({
            "metadata": meta("init"),
            "spec": {
                "initContainers": [{"name": "migrate", "image": "m"}, {"name": "seed", "image": "s"}],
                "containers": [{"name": "app", "image": "a"}]
            },
            "status": {
                "phase": "Pending",
                "conditions": [{"type": "Initialized", "status": "False"}],
                "initContainerStatuses": init_statuses,
                "containerStatuses": [{"name": "app", "ready": false, "restartCount": 0, "state": {"waiting": {"reason": "PodInitializing"}}}]
            }
        })
    }

    #[test]
    fn pod_init_containers() {
        let waiting = json!({"waiting": {"reason": "PodInitializing"}});
        let pod = init_pod(json!([
            {"name": "migrate", "ready": false, "restartCount": 0, "state": {"running": {}}},
            {"name": "seed", "ready": false, "restartCount": 0, "state": waiting}
        ]));
        assert_eq!(status_of(&pod), (json!("0/1"), json!("Init:0/2"), json!("0")));

        let pod = init_pod(json!([
            {"name": "migrate", "ready": true, "restartCount": 0, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
            {"name": "seed", "ready": false, "restartCount": 0, "state": {"running": {}}}
        ]));
        assert_eq!(status_of(&pod).1, json!("Init:1/2"));

        let pod = init_pod(json!([
            {"name": "migrate", "ready": false, "restartCount": 3, "state": {"terminated": {"exitCode": 1, "reason": "Error"}},
             "lastTerminationState": {"terminated": {"exitCode": 1, "reason": "Error", "finishedAt": ago(30)}}},
            {"name": "seed", "ready": false, "restartCount": 0, "state": waiting}
        ]));
        assert_eq!(status_of(&pod), (json!("0/1"), json!("Init:Error"), json!("3 (30s ago)")));

        let pod = init_pod(json!([
            {"name": "migrate", "ready": false, "restartCount": 4, "state": {"waiting": {"reason": "CrashLoopBackOff"}}},
            {"name": "seed", "ready": false, "restartCount": 0, "state": waiting}
        ]));
        assert_eq!(status_of(&pod), (json!("0/1"), json!("Init:CrashLoopBackOff"), json!("4")));

        let pod = init_pod(json!([
            {"name": "migrate", "ready": false, "restartCount": 0, "state": {"terminated": {"exitCode": 3}}},
            {"name": "seed", "ready": false, "restartCount": 0, "state": waiting}
        ]));
        assert_eq!(status_of(&pod).1, json!("Init:ExitCode:3"));

        let pod = init_pod(json!([
            {"name": "migrate", "ready": false, "restartCount": 0, "state": {"terminated": {"exitCode": 143, "signal": 15}}},
            {"name": "seed", "ready": false, "restartCount": 0, "state": waiting}
        ]));
        assert_eq!(status_of(&pod).1, json!("Init:Signal:15"));
    }

    #[test]
    fn pod_with_sidecar_init_container() {
        let pod = json!({
            "metadata": meta("sidecar"),
            "spec": {
                "initContainers": [{"name": "proxy", "image": "envoy", "restartPolicy": "Always"}],
                "containers": [{"name": "app", "image": "a"}]
            },
            "status": {
                "phase": "Running",
                "conditions": [{"type": "Initialized", "status": "True"}, {"type": "Ready", "status": "True"}],
                "initContainerStatuses": [{"name": "proxy", "ready": true, "started": true, "restartCount": 2,
                    "state": {"running": {}},
                    "lastTerminationState": {"terminated": {"exitCode": 1, "finishedAt": ago(7200)}}}],
                "containerStatuses": [{"name": "app", "ready": true, "restartCount": 0, "state": {"running": {}}}]
            }
        });
        assert_eq!(status_of(&pod), (json!("2/2"), json!("Running"), json!("2 (120m ago)")));
    }

    #[test]
    fn pod_scheduling_gated_and_readiness_gates() {
        let pod = json!({
            "metadata": meta("gated"),
            "spec": {"containers": [{"name": "c", "image": "i"}], "schedulingGates": [{"name": "g"}]},
            "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]}
        });
        assert_eq!(status_of(&pod).1, json!("SchedulingGated"));

        let mut pod = running_pod();
        pod["spec"]["readinessGates"] = json!([{"conditionType": "example.com/lb"}, {"conditionType": "example.com/dns"}]);
        pod["status"]["conditions"] = json!([
            {"type": "Ready", "status": "True"},
            {"type": "example.com/lb", "status": "True"},
            {"type": "example.com/dns", "status": "False"}
        ]);
        pod["status"]["nominatedNodeName"] = json!("node-2");
        let c = cells_of("pods", &pod);
        assert_eq!(c[7], json!("node-2"));
        assert_eq!(c[8], json!("1/2"));
    }

    // --- nodes -----------------------------------------------------------------------------

    fn node() -> Value {
        json!({
            "metadata": {"name": "cp-1", "creationTimestamp": ago(40 * 86400),
                "labels": {"node-role.kubernetes.io/control-plane": "", "node-role.kubernetes.io/etcd": "true",
                           "kubernetes.io/role": "master", "kubernetes.io/hostname": "cp-1"}},
            "spec": {},
            "status": {
                "conditions": [{"type": "MemoryPressure", "status": "False"}, {"type": "Ready", "status": "True"}],
                "addresses": [{"type": "Hostname", "address": "cp-1"}, {"type": "InternalIP", "address": "192.168.1.10"}],
                "nodeInfo": {"kubeletVersion": "v1.33.1", "osImage": "Ubuntu 24.04 LTS", "kernelVersion": "6.8.0-31-generic",
                             "containerRuntimeVersion": "containerd://1.7.12"}
            }
        })
    }

    #[test]
    fn node_ready() {
        assert_eq!(
            cells_of("nodes", &node()),
            vec![
                json!("cp-1"),
                json!("Ready"),
                json!("control-plane,etcd,master"),
                json!("40d"),
                json!("v1.33.1"),
                json!("192.168.1.10"),
                json!("<none>"),
                json!("Ubuntu 24.04 LTS"),
                json!("6.8.0-31-generic"),
                json!("containerd://1.7.12"),
            ]
        );
    }

    #[test]
    fn node_status_variants() {
        let mut n = node();
        n["spec"]["unschedulable"] = json!(true);
        assert_eq!(cells_of("nodes", &n)[1], json!("Ready,SchedulingDisabled"));
        n["status"]["conditions"][1]["status"] = json!("Unknown");
        assert_eq!(cells_of("nodes", &n)[1], json!("NotReady,SchedulingDisabled"));
        n["status"]["conditions"] = json!([]);
        assert_eq!(cells_of("nodes", &n)[1], json!("Unknown,SchedulingDisabled"));
        let bare = json!({"metadata": {"name": "w", "creationTimestamp": ago(10)}, "status": {}});
        assert_eq!(
            cells_of("nodes", &bare),
            vec![json!("w"), json!("Unknown"), json!("<none>"), json!("10s"), json!(""), json!("<none>"), json!("<none>"),
                 json!("<unknown>"), json!("<unknown>"), json!("<unknown>")]
        );
    }

    // --- services --------------------------------------------------------------------------

    #[test]
    fn service_cluster_ip() {
        let svc = json!({
            "metadata": meta("web"),
            "spec": {"type": "ClusterIP", "clusterIP": "10.96.12.4", "clusterIPs": ["10.96.12.4"],
                     "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080},
                               {"name": "dns", "port": 53, "protocol": "UDP"}],
                     "selector": {"app": "web", "tier": "front"}}
        });
        assert_eq!(
            cells_of("services", &svc),
            vec![json!("web"), json!("ClusterIP"), json!("10.96.12.4"), json!("<none>"), json!("80/TCP,53/UDP"), json!("5d"), json!("app=web,tier=front")]
        );
    }

    #[test]
    fn service_node_port_load_balancer_external_name() {
        let svc = json!({
            "metadata": meta("np"),
            "spec": {"type": "NodePort", "clusterIPs": ["10.96.0.20"], "externalIPs": ["1.2.3.4"],
                     "ports": [{"port": 80, "nodePort": 30080, "protocol": "TCP"}, {"port": 443, "nodePort": 30443}]}
        });
        assert_eq!(
            cells_of("services", &svc),
            vec![json!("np"), json!("NodePort"), json!("10.96.0.20"), json!("1.2.3.4"), json!("80:30080/TCP,443:30443/TCP"), json!("5d"), json!("<none>")]
        );

        let mut lb = json!({
            "metadata": meta("lb"),
            "spec": {"type": "LoadBalancer", "clusterIPs": ["10.96.0.30"], "ports": [{"port": 443, "nodePort": 31000, "protocol": "TCP"}]},
            "status": {"loadBalancer": {}}
        });
        assert_eq!(cells_of("services", &lb)[3], json!("<pending>"));
        lb["status"]["loadBalancer"]["ingress"] =
            json!([{"ip": "203.0.113.9"}, {"hostname": "a-very-long-hostname.elb.example.com"}, {"ip": "203.0.113.7"}]);
        assert_eq!(cells_of("services", &lb)[3], json!("203.0.113.7,203.0.113.9,a-very-long-hostname.elb.example.com"));
        lb["spec"]["externalIPs"] = json!(["198.51.100.1"]);
        assert_eq!(
            cells_of("services", &lb)[3],
            json!("203.0.113.7,203.0.113.9,a-very-long-hostname.elb.example.com,198.51.100.1")
        );

        let ext = json!({"metadata": meta("ext"), "spec": {"type": "ExternalName", "externalName": "db.example.com"}});
        assert_eq!(
            cells_of("services", &ext),
            vec![json!("ext"), json!("ExternalName"), json!("<none>"), json!("db.example.com"), json!("<none>"), json!("5d"), json!("<none>")]
        );

        let headless = json!({"metadata": meta("h"), "spec": {"clusterIP": "None", "clusterIPs": ["None"], "ports": [{"port": 5432}]}});
        assert_eq!(cells_of("services", &headless)[1..5], [json!("ClusterIP"), json!("None"), json!("<none>"), json!("5432/TCP")]);
    }

    // --- workloads -------------------------------------------------------------------------

    fn template() -> Value {
        json!({"metadata": {"labels": {"app": "web"}},
               "spec": {"containers": [{"name": "web", "image": "nginx:1.25"}, {"name": "sidecar", "image": "envoy:v1.30"}],
                        "nodeSelector": {"kubernetes.io/os": "linux"}}})
    }

    #[test]
    fn deployment() {
        let d = json!({
            "metadata": meta("web"),
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}}, "template": template()},
            "status": {"replicas": 3, "updatedReplicas": 2, "readyReplicas": 1, "availableReplicas": 1}
        });
        assert_eq!(
            names("deployments"),
            vec![("Name", "string", 0), ("Ready", "string", 0), ("Up-to-date", "string", 0), ("Available", "string", 0),
                 ("Age", "string", 0), ("Containers", "string", 1), ("Images", "string", 1), ("Selector", "string", 1)]
        );
        assert_eq!(
            cells_of("deployments", &d),
            vec![json!("web"), json!("1/3"), json!(2), json!(1), json!("5d"), json!("web,sidecar"), json!("nginx:1.25,envoy:v1.30"), json!("app=web")]
        );
        let fresh = json!({"metadata": meta("new"), "spec": {"template": template()}});
        assert_eq!(
            cells_of("deployments", &fresh),
            vec![json!("new"), json!("0/1"), json!(0), json!(0), json!("5d"), json!("web,sidecar"), json!("nginx:1.25,envoy:v1.30"), json!("")]
        );
    }

    #[test]
    fn replica_set() {
        let rs = json!({
            "metadata": meta("web-7d4b9c8f5"),
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web", "pod-template-hash": "7d4b9c8f5"}}, "template": template()},
            "status": {"replicas": 3, "readyReplicas": 2}
        });
        assert_eq!(
            cells_of("replicasets", &rs),
            vec![json!("web-7d4b9c8f5"), json!(3), json!(3), json!(2), json!("5d"), json!("web,sidecar"),
                 json!("nginx:1.25,envoy:v1.30"), json!("app=web,pod-template-hash=7d4b9c8f5")]
        );
        assert_eq!(names("replicasets")[1], ("Desired", "integer", 0));
    }

    #[test]
    fn daemon_set() {
        let ds = json!({
            "metadata": meta("kube-proxy"),
            "spec": {"selector": {"matchLabels": {"k8s-app": "kube-proxy"}}, "template": template()},
            "status": {"desiredNumberScheduled": 3, "currentNumberScheduled": 3, "numberReady": 2, "updatedNumberScheduled": 3, "numberAvailable": 2}
        });
        assert_eq!(
            names("daemonsets").iter().map(|c| c.0).collect::<Vec<_>>(),
            vec!["Name", "Desired", "Current", "Ready", "Up-to-date", "Available", "Node Selector", "Age", "Containers", "Images", "Selector"]
        );
        assert_eq!(
            cells_of("daemonsets", &ds),
            vec![json!("kube-proxy"), json!(3), json!(3), json!(2), json!(3), json!(2), json!("kubernetes.io/os=linux"), json!("5d"),
                 json!("web,sidecar"), json!("nginx:1.25,envoy:v1.30"), json!("k8s-app=kube-proxy")]
        );
    }

    #[test]
    fn stateful_set() {
        let sts = json!({
            "metadata": meta("db"),
            "spec": {"replicas": 3, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}}, "template": template()},
            "status": {"replicas": 3, "readyReplicas": 3}
        });
        assert_eq!(
            cells_of("statefulsets", &sts),
            vec![json!("db"), json!("3/3"), json!("5d"), json!("web,sidecar"), json!("nginx:1.25,envoy:v1.30")]
        );
    }

    #[test]
    fn replication_controller_job_cron_job() {
        let rc = json!({"metadata": meta("rc"), "spec": {"replicas": 2, "selector": {"app": "web"}, "template": template()},
                        "status": {"replicas": 2, "readyReplicas": 1}});
        assert_eq!(
            cells_of("replicationcontrollers", &rc),
            vec![json!("rc"), json!(2), json!(2), json!(1), json!("5d"), json!("web,sidecar"), json!("nginx:1.25,envoy:v1.30"), json!("app=web")]
        );

        let job = json!({
            "metadata": meta("pi"),
            "spec": {"completions": 3, "parallelism": 1, "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": "abc"}},
                     "template": {"spec": {"containers": [{"name": "pi", "image": "perl:5.34"}]}}},
            "status": {"succeeded": 1, "startTime": ago(150)}
        });
        assert_eq!(
            cells_of("jobs", &job),
            vec![json!("pi"), json!("Running"), json!("1/3"), json!("2m30s"), json!("5d"), json!("pi"), json!("perl:5.34"),
                 json!("batch.kubernetes.io/controller-uid=abc")]
        );
        let done = json!({
            "metadata": meta("once"),
            "spec": {"parallelism": 4, "template": {"spec": {"containers": []}}},
            "status": {"succeeded": 1, "startTime": ago(100), "completionTime": ago(55),
                       "conditions": [{"type": "SuccessCriteriaMet", "status": "True"}, {"type": "Complete", "status": "True"}]}
        });
        let c = cells_of("jobs", &done);
        assert_eq!(c[1..4], [json!("Complete"), json!("1/1 of 4"), json!("45s")]);

        let cj = json!({
            "metadata": meta("hourly"),
            "spec": {"schedule": "0 * * * *", "jobTemplate": {"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}},
            "status": {"active": [{"name": "hourly-1"}], "lastScheduleTime": ago(600)}
        });
        assert_eq!(
            cells_of("cronjobs", &cj),
            vec![json!("hourly"), json!("0 * * * *"), json!("<none>"), json!("False"), json!(1), json!("10m"), json!("5d"),
                 json!("c"), json!("busybox"), json!("<none>")]
        );
    }

    // --- config & storage ------------------------------------------------------------------

    #[test]
    fn namespace_configmap_secret_serviceaccount() {
        let ns = json!({"metadata": {"name": "kube-system", "creationTimestamp": ago(90 * 86400)}, "status": {"phase": "Active"}});
        assert_eq!(cells_of("namespaces", &ns), vec![json!("kube-system"), json!("Active"), json!("90d")]);
        let mut gone = ns.clone();
        gone["status"]["phase"] = json!("Terminating");
        assert_eq!(cells_of("namespaces", &gone)[1], json!("Terminating"));

        let cm = json!({"metadata": meta("cfg"), "data": {"a": "1", "b": "2"}, "binaryData": {"c": "AA=="}});
        assert_eq!(cells_of("configmaps", &cm), vec![json!("cfg"), json!(3), json!("5d")]);
        assert_eq!(cells_of("configmaps", &json!({"metadata": meta("empty")})), vec![json!("empty"), json!(0), json!("5d")]);

        let secret = json!({"metadata": meta("tls"), "type": "kubernetes.io/tls", "data": {"tls.crt": "", "tls.key": ""}});
        assert_eq!(cells_of("secrets", &secret), vec![json!("tls"), json!("kubernetes.io/tls"), json!(2), json!("5d")]);
        assert_eq!(names("secrets").iter().map(|c| c.0).collect::<Vec<_>>(), vec!["Name", "Type", "Data", "Age"]);

        let sa = json!({"metadata": meta("default"), "secrets": [{"name": "default-token"}]});
        assert_eq!(cells_of("serviceaccounts", &sa), vec![json!("default"), json!(1), json!("5d")]);
        assert_eq!(cells_of("serviceaccounts", &json!({"metadata": meta("x")}))[1], json!(0));
    }

    #[test]
    fn persistent_volume() {
        let pv = json!({
            "metadata": meta("pv-data"),
            "spec": {"capacity": {"storage": "10240Mi"}, "accessModes": ["ReadWriteMany", "ReadWriteOnce"],
                     "persistentVolumeReclaimPolicy": "Delete", "storageClassName": "fast",
                     "claimRef": {"kind": "PersistentVolumeClaim", "namespace": "apps", "name": "data"},
                     "volumeMode": "Filesystem", "hostPath": {"path": "/data"}},
            "status": {"phase": "Bound"}
        });
        assert_eq!(
            names("persistentvolumes").iter().map(|c| (c.0, c.2)).collect::<Vec<_>>(),
            vec![("Name", 0), ("Capacity", 0), ("Access Modes", 0), ("Reclaim Policy", 0), ("Status", 0), ("Claim", 0),
                 ("StorageClass", 0), ("VolumeAttributesClass", 0), ("Reason", 0), ("Age", 0), ("VolumeMode", 1)]
        );
        assert_eq!(
            cells_of("persistentvolumes", &pv),
            vec![json!("pv-data"), json!("10Gi"), json!("RWO,RWX"), json!("Delete"), json!("Bound"), json!("apps/data"),
                 json!("fast"), json!("<unset>"), json!(""), json!("5d"), json!("Filesystem")]
        );
        let mut released = pv.clone();
        released["metadata"]["deletionTimestamp"] = json!(ago(1));
        released["metadata"]["annotations"] = json!({"volume.beta.kubernetes.io/storage-class": "legacy"});
        released["spec"]["accessModes"] = json!(["ReadWriteOncePod", "ReadOnlyMany"]);
        released["spec"]["volumeMode"] = json!("Block");
        released["spec"]["volumeAttributesClassName"] = json!("gold");
        let c = cells_of("persistentvolumes", &released);
        assert_eq!(c[2], json!("ROX,RWOP"));
        assert_eq!(c[4], json!("Terminating"));
        assert_eq!(c[6], json!("legacy"));
        assert_eq!(c[7], json!("gold"));
        assert_eq!(c[10], json!("Block"));
    }

    #[test]
    fn persistent_volume_claim() {
        let bound = json!({
            "metadata": meta("data"),
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "5Gi"}},
                     "storageClassName": "standard", "volumeName": "pvc-1234", "volumeMode": "Filesystem"},
            "status": {"phase": "Bound", "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "8Gi"}}
        });
        assert_eq!(
            cells_of("persistentvolumeclaims", &bound),
            vec![json!("data"), json!("Bound"), json!("pvc-1234"), json!("8Gi"), json!("RWO"), json!("standard"),
                 json!("<unset>"), json!("5d"), json!("Filesystem")]
        );
        let pending = json!({
            "metadata": meta("wait"),
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "5Gi"}}},
            "status": {"phase": "Pending"}
        });
        assert_eq!(
            cells_of("persistentvolumeclaims", &pending),
            vec![json!("wait"), json!("Pending"), json!(""), json!(""), json!(""), json!(""), json!("<unset>"), json!("5d"), json!("Filesystem")]
        );
    }

    #[test]
    fn storage_class() {
        let sc = json!({
            "metadata": {"name": "standard", "creationTimestamp": ago(3 * 86400),
                         "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
            "provisioner": "rancher.io/local-path", "reclaimPolicy": "Delete", "volumeBindingMode": "WaitForFirstConsumer"
        });
        assert_eq!(
            names("storageclasses").iter().map(|c| c.0).collect::<Vec<_>>(),
            vec!["Name", "Provisioner", "ReclaimPolicy", "VolumeBindingMode", "AllowVolumeExpansion", "Age"]
        );
        assert_eq!(
            cells_of("storageclasses", &sc),
            vec![json!("standard (default)"), json!("rancher.io/local-path"), json!("Delete"), json!("WaitForFirstConsumer"), json!(false), json!("3d")]
        );
        let plain = json!({"metadata": {"name": "fast", "creationTimestamp": ago(60)}, "provisioner": "ebs.csi.aws.com",
                           "reclaimPolicy": "Retain", "allowVolumeExpansion": true});
        assert_eq!(
            cells_of("storageclasses", &plain),
            vec![json!("fast"), json!("ebs.csi.aws.com"), json!("Retain"), json!("Immediate"), json!(true), json!("60s")]
        );
    }

    #[test]
    fn csi_driver_csi_node_volume_attachment() {
        let driver = json!({"metadata": {"name": "ebs.csi.aws.com", "creationTimestamp": ago(86400)},
                            "spec": {"attachRequired": true, "podInfoOnMount": false, "volumeLifecycleModes": ["Persistent", "Ephemeral"],
                                     "tokenRequests": [{"audience": "sts.amazonaws.com"}, {"audience": "vault"}]}});
        assert_eq!(
            names("csidrivers").iter().map(|c| (c.0, c.1)).collect::<Vec<_>>(),
            vec![("Name", "string"), ("AttachRequired", "boolean"), ("PodInfoOnMount", "boolean"), ("StorageCapacity", "boolean"),
                 ("TokenRequests", "string"), ("RequiresRepublish", "boolean"), ("Modes", "string"), ("Age", "string")]
        );
        assert_eq!(
            cells_of("csidrivers", &driver),
            vec![json!("ebs.csi.aws.com"), json!(true), json!(false), json!(false), json!("sts.amazonaws.com,vault"), json!(false),
                 json!("Persistent,Ephemeral"), json!("24h")]
        );
        let minimal = json!({"metadata": {"name": "d", "creationTimestamp": ago(86400)}, "spec": {}});
        assert_eq!(
            cells_of("csidrivers", &minimal)[1..7],
            [json!(true), json!(false), json!(false), json!("<unset>"), json!(false), json!("Persistent")]
        );

        let node = json!({"metadata": {"name": "node-1", "creationTimestamp": ago(7200)},
                          "spec": {"drivers": [{"name": "ebs.csi.aws.com", "nodeID": "i-123"}]}});
        assert_eq!(cells_of("csinodes", &node), vec![json!("node-1"), json!(1), json!("120m")]);

        let va = json!({"metadata": {"name": "csi-abc", "creationTimestamp": ago(3600)},
                        "spec": {"attacher": "ebs.csi.aws.com", "nodeName": "node-1", "source": {"persistentVolumeName": "pvc-1"}},
                        "status": {"attached": true}});
        assert_eq!(
            names("volumeattachments"),
            vec![("Name", "string", 0), ("Attacher", "string", 0), ("PV", "string", 0), ("Node", "string", 0),
                 ("Attached", "boolean", 0), ("Age", "string", 0)]
        );
        assert_eq!(
            cells_of("volumeattachments", &va),
            vec![json!("csi-abc"), json!("ebs.csi.aws.com"), json!("pvc-1"), json!("node-1"), json!(true), json!("60m")]
        );
    }

    // --- networking & discovery ------------------------------------------------------------

    #[test]
    fn endpoints() {
        let ep = json!({
            "metadata": meta("web"),
            "subsets": [
                {"addresses": [{"ip": "10.0.0.1"}, {"ip": "10.0.0.2"}], "notReadyAddresses": [{"ip": "10.0.0.9"}],
                 "ports": [{"name": "http", "port": 80}, {"name": "https", "port": 443}]},
                {"addresses": [{"ip": "10.0.1.1"}], "ports": [{"port": 8080}]}
            ]
        });
        assert_eq!(
            cells_of("endpoints", &ep),
            vec![json!("web"), json!("10.0.0.1:80,10.0.0.2:80,10.0.0.1:443 + 2 more..."), json!("5d")]
        );
        let three = json!({"metadata": meta("x"), "subsets": [{"addresses": [{"ip": "fd00::1"}, {"ip": "10.0.0.2"}, {"ip": "10.0.0.3"}], "ports": [{"port": 53}]}]});
        assert_eq!(cells_of("endpoints", &three)[1], json!("[fd00::1]:53,10.0.0.2:53,10.0.0.3:53"));
        let headless = json!({"metadata": meta("h"), "subsets": [{"addresses": [{"ip": "10.0.0.5"}]}]});
        assert_eq!(cells_of("endpoints", &headless)[1], json!("10.0.0.5"));
        assert_eq!(cells_of("endpoints", &json!({"metadata": meta("none")}))[1], json!("<none>"));
        let not_ready = json!({"metadata": meta("nr"), "subsets": [{"notReadyAddresses": [{"ip": "10.0.0.5"}], "ports": [{"port": 80}]}]});
        assert_eq!(cells_of("endpoints", &not_ready)[1], json!(""));
    }

    #[test]
    fn endpoint_slices() {
        let es = json!({
            "metadata": meta("web-abc12"),
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 80, "protocol": "TCP"}, {"name": "metrics"}, {}, {"port": 9090}],
            "endpoints": [{"addresses": ["10.0.0.1"]}, {"addresses": ["10.0.0.2", "10.0.0.3"]}, {"addresses": ["10.0.0.4"]}]
        });
        assert_eq!(
            cells_of("endpointslices", &es),
            vec![json!("web-abc12"), json!("IPv4"), json!("80,metrics,* + 1 more..."), json!("10.0.0.1,10.0.0.2,10.0.0.3 + 1 more..."), json!("5d")]
        );
        let empty = json!({"metadata": meta("e"), "addressType": "IPv6", "endpoints": []});
        assert_eq!(cells_of("endpointslices", &empty)[1..4], [json!("IPv6"), json!("<unset>"), json!("<unset>")]);
    }

    #[test]
    fn ingress_and_ingress_class_and_network_policy() {
        let ing = json!({
            "metadata": meta("site"),
            "spec": {"ingressClassName": "nginx", "tls": [{"hosts": ["a.example.com"]}],
                     "rules": [{"host": "a.example.com"}, {"host": "b.example.com"}, {}, {"host": "c.example.com"}, {"host": "d.example.com"}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}}
        });
        assert_eq!(
            cells_of("ingresses", &ing),
            vec![json!("site"), json!("nginx"), json!("a.example.com,b.example.com,c.example.com + 2 more..."), json!("192.0.2.1"),
                 json!("80, 443"), json!("5d")]
        );
        let catch_all = json!({"metadata": meta("all"), "spec": {"defaultBackend": {"service": {"name": "x"}}}});
        assert_eq!(cells_of("ingresses", &catch_all)[1..5], [json!("<none>"), json!("*"), json!(""), json!("80")]);

        let class = json!({"metadata": meta("nginx"), "spec": {"controller": "k8s.io/ingress-nginx",
                           "parameters": {"apiGroup": "k8s.example.com", "kind": "IngressParameters", "name": "external-lb"}}});
        assert_eq!(
            cells_of("ingressclasses", &class),
            vec![json!("nginx"), json!("k8s.io/ingress-nginx"), json!("IngressParameters.k8s.example.com/external-lb"), json!("5d")]
        );

        let np = json!({"metadata": meta("deny"), "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}});
        assert_eq!(cells_of("networkpolicies", &np), vec![json!("deny"), json!("<none>"), json!("5d")]);
    }

    // --- events ----------------------------------------------------------------------------

    #[test]
    fn core_event() {
        let ev = json!({
            "apiVersion": "v1", "kind": "Event",
            "metadata": meta("web-1.17c0a1"),
            "involvedObject": {"kind": "Pod", "namespace": "default", "name": "web-1", "fieldPath": "spec.containers{web}"},
            "reason": "Pulled", "message": "Successfully pulled image \"nginx\"\n", "type": "Normal",
            "source": {"component": "kubelet", "host": "node-1"},
            "firstTimestamp": ago(600), "lastTimestamp": ago(90), "count": 3
        });
        assert_eq!(
            names("events").iter().map(|c| (c.0, c.2)).collect::<Vec<_>>(),
            vec![("Last Seen", 0), ("Type", 0), ("Reason", 0), ("Object", 0), ("Subobject", 1), ("Source", 1), ("Message", 0),
                 ("First Seen", 1), ("Count", 1), ("Name", 1)]
        );
        assert_eq!(
            cells_of("events", &ev),
            vec![json!("90s"), json!("Normal"), json!("Pulled"), json!("pod/web-1"), json!("spec.containers{web}"),
                 json!("kubelet, node-1"), json!("Successfully pulled image \"nginx\""), json!("10m"), json!(3), json!("web-1.17c0a1")]
        );
    }

    #[test]
    fn new_style_events() {
        // A core/v1 Event written by an events.k8s.io client: eventTime and series, no first/last timestamps.
        let ev = json!({
            "metadata": meta("e1"),
            "involvedObject": {"kind": "Node", "name": "node-1"},
            "reason": "Starting", "message": "", "type": "Normal",
            "eventTime": "2024-05-01T11:50:00.123456Z",
            "series": {"count": 4, "lastObservedTime": "2024-05-01T11:59:00.000000Z"},
            "reportingComponent": "kube-proxy", "reportingInstance": "kube-proxy-node-1", "source": {}
        });
        assert_eq!(
            cells_of("events", &ev),
            vec![json!("60s"), json!("Normal"), json!("Starting"), json!("node/node-1"), json!(""),
                 json!("kube-proxy, kube-proxy-node-1"), json!(""), json!("9m59s"), json!(4), json!("e1")]
        );
        // The events.k8s.io/v1 shape of a singleton event.
        let ev = json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": meta("e2"),
            "regarding": {"kind": "Deployment", "name": "web"},
            "reason": "ScalingReplicaSet", "note": " Scaled up replica set web-1 to 3 ", "type": "Normal",
            "eventTime": "2024-05-01T11:58:00.000000Z",
            "reportingController": "deployment-controller", "reportingInstance": ""
        });
        assert_eq!(
            cells_of("events", &ev),
            vec![json!("2m"), json!("Normal"), json!("ScalingReplicaSet"), json!("deployment/web"), json!(""),
                 json!("deployment-controller"), json!("Scaled up replica set web-1 to 3"), json!("2m"), json!(1), json!("e2")]
        );
    }

    // --- other kinds -----------------------------------------------------------------------

    #[test]
    fn lease() {
        let lease = json!({"metadata": meta("kube-scheduler"), "spec": {"holderIdentity": "cp-1_5a7c", "leaseDurationSeconds": 15}});
        assert_eq!(cells_of("leases", &lease), vec![json!("kube-scheduler"), json!("cp-1_5a7c"), json!("5d")]);
        assert_eq!(cells_of("leases", &json!({"metadata": meta("free"), "spec": {}})), vec![json!("free"), json!(""), json!("5d")]);
    }

    #[test]
    fn rbac_bindings() {
        let rb = json!({
            "metadata": meta("admins"),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "admin"},
            "subjects": [{"kind": "User", "name": "alice"}, {"kind": "Group", "name": "ops"}, {"kind": "User", "name": "bob"},
                         {"kind": "ServiceAccount", "namespace": "ci", "name": "deployer"}]
        });
        let want = vec![json!("admins"), json!("ClusterRole/admin"), json!("5d"), json!("alice, bob"), json!("ops"), json!("ci/deployer")];
        assert_eq!(cells_of("rolebindings", &rb), want);
        assert_eq!(cells_of("clusterrolebindings", &rb), want);
        assert_eq!(names("clusterrolebindings")[3], ("Users", "string", 1));
    }

    #[test]
    fn misc_printers() {
        let pc = json!({"metadata": meta("high"), "value": 1000000, "globalDefault": false});
        assert_eq!(
            cells_of("priorityclasses", &pc),
            vec![json!("high"), json!(1000000), json!(false), json!("5d"), json!("PreemptLowerPriority")]
        );
        let rc = json!({"metadata": meta("gvisor"), "handler": "runsc"});
        assert_eq!(cells_of("runtimeclasses", &rc), vec![json!("gvisor"), json!("runsc"), json!("5d")]);
        let wh = json!({"metadata": meta("policy"), "webhooks": [{"name": "a.example.com"}, {"name": "b.example.com"}]});
        assert_eq!(cells_of("validatingwebhookconfigurations", &wh), vec![json!("policy"), json!(2), json!("5d")]);
        assert_eq!(cells_of("mutatingwebhookconfigurations", &wh)[1], json!(2));

        let cr = json!({"metadata": {"name": "web-6d9f", "creationTimestamp": ago(30),
                        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web", "controller": true}]},
                        "revision": 2});
        assert_eq!(cells_of("controllerrevisions", &cr), vec![json!("web-6d9f"), json!("statefulset.apps/web"), json!(2), json!("30s")]);

        let pdb = json!({"metadata": meta("web"), "spec": {"minAvailable": "50%"}, "status": {"disruptionsAllowed": 1}});
        assert_eq!(cells_of("poddisruptionbudgets", &pdb), vec![json!("web"), json!("50%"), json!("N/A"), json!(1), json!("5d")]);
        let pdb2 = json!({"metadata": meta("db"), "spec": {"maxUnavailable": 1}, "status": {}});
        assert_eq!(cells_of("poddisruptionbudgets", &pdb2)[1..4], [json!("N/A"), json!("1"), json!(0)]);

        let pt = json!({"metadata": meta("tpl"), "template": template()});
        assert_eq!(
            cells_of("podtemplates", &pt),
            vec![json!("tpl"), json!("web,sidecar"), json!("nginx:1.25,envoy:v1.30"), json!("app=web")]
        );

        let rq = json!({"metadata": meta("quota"),
                        "status": {"hard": {"requests.cpu": "2", "limits.memory": "4096Mi", "pods": "10", "limits.cpu": "4"},
                                   "used": {"requests.cpu": "500m", "limits.memory": "1Gi", "pods": "3"}}});
        assert_eq!(
            cells_of("resourcequotas", &rq),
            vec![json!("quota"), json!("pods: 3/10, requests.cpu: 500m/2"), json!("limits.cpu: 0/4, limits.memory: 1Gi/4Gi"), json!("5d")]
        );

        let csr = json!({"metadata": meta("csr-1"),
                         "spec": {"signerName": "kubernetes.io/kube-apiserver-client", "username": "alice", "expirationSeconds": 86400},
                         "status": {"conditions": [{"type": "Approved", "status": "True"}], "certificate": "LS0t"}});
        assert_eq!(
            cells_of("certificatesigningrequests", &csr),
            vec![json!("csr-1"), json!("5d"), json!("kubernetes.io/kube-apiserver-client"), json!("alice"), json!("24h"), json!("Approved,Issued")]
        );

        let cap = json!({"metadata": meta("csisc-1"), "storageClassName": "fast", "capacity": "107374182400"});
        assert_eq!(cells_of("csistoragecapacities", &cap), vec![json!("csisc-1"), json!("fast"), json!("107374182400")]);
        assert_eq!(cells_of("csistoragecapacities", &json!({"metadata": meta("c"), "storageClassName": "x"}))[2], json!("<unset>"));

        let cs = json!({"metadata": {"name": "etcd-0"}, "conditions": [{"type": "Healthy", "status": "True", "message": "ok"}]});
        assert_eq!(cells_of("componentstatuses", &cs), vec![json!("etcd-0"), json!("Healthy"), json!("ok"), json!("")]);
    }

    #[test]
    fn default_convertor_for_kinds_without_printer() {
        assert!(!has_printer("roles"));
        assert!(has_printer("pods"));
        assert_eq!(names("roles"), vec![("Name", "string", 0), ("Created At", "date", 0)]);
        assert_eq!(columns("roles")[0].format, "name");
        let role = json!({"metadata": {"name": "reader", "creationTimestamp": "2024-04-01T08:30:00Z"}});
        assert_eq!(cells_of("roles", &role), vec![json!("reader"), json!("2024-04-01T08:30:00Z")]);
        let micro = json!({"metadata": {"name": "x", "creationTimestamp": "2024-04-01T08:30:00.5+02:00"}});
        assert_eq!(cells_of("widgets", &micro)[1], json!("2024-04-01T06:30:00Z"));
        assert_eq!(cells_of("widgets", &json!({"metadata": {"name": "y"}}))[1], json!("0001-01-01T00:00:00Z"));
    }

    // --- the Table -------------------------------------------------------------------------

    #[test]
    fn table_with_metadata_objects() {
        let pods = vec![running_pod()];
        let t = table("pods", &pods, "Metadata", json!({"resourceVersion": "1234", "continue": "tok", "remainingItemCount": 7}), now());
        assert_eq!(t["kind"], "Table");
        assert_eq!(t["apiVersion"], "meta.k8s.io/v1");
        assert_eq!(t["metadata"], json!({"resourceVersion": "1234", "continue": "tok", "remainingItemCount": 7}));
        let cols = t["columnDefinitions"].as_array().unwrap();
        assert_eq!(cols.len(), 9);
        assert_eq!(
            cols[0],
            json!({"name": "Name", "type": "string", "format": "name", "description": D_NAME, "priority": 0})
        );
        assert_eq!(cols[5]["priority"], 1);
        let rows = t["rows"].as_array().unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0]["cells"][2], "Running");
        assert!(rows[0].get("conditions").is_none());
        assert_eq!(
            rows[0]["object"],
            json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": running_pod()["metadata"]})
        );
        // The default includeObject is Metadata.
        assert_eq!(table("pods", &pods, "", json!({}), now())["rows"][0]["object"]["kind"], "PartialObjectMetadata");
    }

    #[test]
    fn table_with_none_and_object() {
        let objs = vec![json!({"metadata": meta("a"), "data": {"k": "v"}}), json!({"metadata": meta("b")})];
        let none = table("configmaps", &objs, "None", json!({"resourceVersion": "9"}), now());
        assert_eq!(none["metadata"], json!({"resourceVersion": "9"}));
        let rows = none["rows"].as_array().unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0], json!({"cells": ["a", 1, "5d"], "object": null}));
        assert_eq!(rows[1], json!({"cells": ["b", 0, "5d"], "object": null}));

        let full = table("configmaps", &objs, "Object", json!({"resourceVersion": "", "continue": ""}), now());
        assert_eq!(full["metadata"], json!({}));
        assert_eq!(full["rows"][0]["object"], objs[0]);
        assert_eq!(
            full["columnDefinitions"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect::<Vec<_>>(),
            vec!["Name", "Data", "Age"]
        );

        let empty = table("nodes", &[], "Metadata", json!({"resourceVersion": "3"}), now());
        assert_eq!(empty["rows"], json!([]));
        assert_eq!(empty["columnDefinitions"].as_array().unwrap().len(), 10);
    }

    #[test]
    fn table_marks_finished_pods() {
        let mut pod = running_pod();
        pod["status"]["phase"] = json!("Succeeded");
        let t = table("pods", &[pod.clone()], "None", json!({}), now());
        assert_eq!(
            t["rows"][0]["conditions"],
            json!([{"type": "Completed", "status": "True", "reason": "Succeeded", "message": "The pod has completed successfully."}])
        );
        pod["status"]["phase"] = json!("Failed");
        let t = table("pods", &[pod], "None", json!({}), now());
        assert_eq!(t["rows"][0]["conditions"][0]["reason"], "Failed");
        assert_eq!(t["rows"][0]["conditions"][0]["message"], "The pod failed.");
    }

    #[test]
    fn include_object_values() {
        for v in ["", "None", "Metadata", "Object"] {
            assert!(valid_include_object(v));
        }
        assert!(!valid_include_object("object"));
    }
}
