//! Server-side printing of the core group (`v1`): pods, pod templates, replication controllers,
//! services, endpoints, nodes, events, namespaces, secrets, service accounts, persistent volumes
//! and claims, component statuses, config maps, resource quotas.

use super::*;

pub(super) const POD_COLUMNS: &[Column] = &[
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

pub(super) const POD_TEMPLATE_COLUMNS: &[Column] = &[
    NAME,
    col("Containers", "string", "Names of each container in the template."),
    col("Images", "string", "Images referenced by each container in the template."),
    col("Pod Labels", "string", "The labels for the pod template."),
];

pub(super) const RC_COLUMNS: &[Column] = &[
    NAME,
    col("Desired", "integer", D_RC_SPEC_REPLICAS),
    col("Current", "integer", D_RC_STATUS_REPLICAS),
    col("Ready", "integer", D_RC_READY),
    AGE,
    W_CONTAINERS,
    W_IMAGES,
    wide("Selector", "string", D_RC_SELECTOR),
];

pub(super) const SERVICE_COLUMNS: &[Column] = &[
    NAME,
    col("Type", "string", D_SVC_TYPE),
    col("Cluster-IP", "string", D_SVC_CLUSTER_IP),
    col("External-IP", "string", D_SVC_EXTERNAL_IPS),
    col("Port(s)", "string", D_SVC_PORTS),
    AGE,
    wide("Selector", "string", D_SVC_SELECTOR),
];

pub(super) const ENDPOINTS_COLUMNS: &[Column] = &[NAME, col("Endpoints", "string", D_EP_SUBSETS), AGE];

pub(super) const NODE_COLUMNS: &[Column] = &[
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

pub(super) const EVENT_COLUMNS: &[Column] = &[
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

pub(super) const NAMESPACE_COLUMNS: &[Column] = &[NAME, col("Status", "string", "The status of the namespace"), AGE];

pub(super) const SECRET_COLUMNS: &[Column] =
    &[NAME, col("Type", "string", D_SECRET_TYPE), col("Data", "string", D_SECRET_DATA), AGE];

pub(super) const SERVICE_ACCOUNT_COLUMNS: &[Column] = &[NAME, col("Secrets", "string", D_SA_SECRETS), AGE];

pub(super) const PV_COLUMNS: &[Column] = &[
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

pub(super) const PVC_COLUMNS: &[Column] = &[
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

pub(super) const COMPONENT_STATUS_COLUMNS: &[Column] = &[
    NAME,
    col("Status", "string", "Status of the component conditions"),
    col("Message", "string", "Message of the component conditions"),
    col("Error", "string", "Error of the component conditions"),
];

pub(super) const CONFIGMAP_COLUMNS: &[Column] = &[NAME, col("Data", "string", D_CM_DATA), AGE];

pub(super) const RESOURCE_QUOTA_COLUMNS: &[Column] = &[
    NAME,
    col("Request", "string", "Request represents a minimum amount of cpu/memory that a container may consume."),
    col(
        "Limit",
        "string",
        "Limits control the maximum amount of cpu/memory that a container may use independent of contention on the node.",
    ),
    AGE,
];

/// Upstream marks rows of finished pods with a `Completed` row condition.
pub(super) fn pod_row_conditions(pod: &Value) -> Option<Value> {
    let (reason, message) = match st(pod, &["status", "phase"]) {
        "Succeeded" => ("Succeeded", "The pod has completed successfully."),
        "Failed" => ("Failed", "The pod failed."),
        _ => return None,
    };
    Some(json!([{"type": "Completed", "status": "True", "reason": reason, "message": message}]))
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

/// "Init:Signal:9" / "ExitCode:1" style text for a terminated state without a reason.
fn terminated_text(terminated: &Value) -> String {
    let signal = int(terminated, &["signal"]);
    if signal != 0 {
        format!("Signal:{signal}")
    } else {
        format!("ExitCode:{}", int(terminated, &["exitCode"]))
    }
}

pub(super) fn pod_cells(pod: &Value, now: Timestamp) -> Vec<Value> {
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

pub(super) fn pod_template_cells(obj: &Value) -> Vec<Value> {
    let (names, images) = template_containers(obj, &["template"]);
    vec![name(obj), names, images, s(format_labels(at(obj, &["template", "metadata", "labels"])))]
}

pub(super) fn rc_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
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

/// The sorted, de-duplicated IPs (or hostnames) of a load balancer status.
pub(super) fn load_balancer_ingress(obj: &Value) -> String {
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

pub(super) fn service_cells(svc: &Value, now: Timestamp) -> Vec<Value> {
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

pub(super) fn endpoints_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    vec![name(obj), s(format_endpoints(obj)), age(obj, now)]
}

/// Up to three items, then " + N more..."; "<unset>" when there are none.
pub(super) fn list_with_more(items: Vec<String>) -> String {
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

pub(super) fn node_cells(node: &Value, now: Timestamp) -> Vec<Value> {
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
pub(super) fn event_cells(ev: &Value, now: Timestamp) -> Vec<Value> {
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

pub(super) fn namespace_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    vec![name(obj), s(st_or(obj, &["status", "phase"], "Active")), age(obj, now)]
}

pub(super) fn secret_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    vec![name(obj), s(st_or(obj, &["type"], "Opaque")), count(map_len(obj, &["data"])), age(obj, now)]
}

pub(super) fn service_account_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    vec![name(obj), count(list(obj, &["secrets"]).len()), age(obj, now)]
}

pub(super) fn config_map_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    vec![name(obj), count(map_len(obj, &["data"]) + map_len(obj, &["binaryData"])), age(obj, now)]
}

pub(super) fn pv_cells(pv: &Value, now: Timestamp) -> Vec<Value> {
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

pub(super) fn pvc_cells(pvc: &Value, now: Timestamp) -> Vec<Value> {
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

pub(super) fn component_status_cells(obj: &Value) -> Vec<Value> {
    let (mut status, mut message, mut error) = ("Unknown", "", "");
    if let Some(c) = list(obj, &["conditions"]).iter().find(|c| st(c, &["type"]) == "Healthy") {
        status = if st(c, &["status"]) == "True" { "Healthy" } else { "Unhealthy" };
        message = st(c, &["message"]);
        error = st(c, &["error"]);
    }
    vec![name(obj), s(status), s(message), s(error)]
}

pub(super) fn resource_quota_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
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

// Column descriptions: upstream takes them from the API types' documentation.

const D_POD_IP: &str = "podIP address allocated to the pod. Routable at least within the cluster. Empty if not yet allocated.";
const D_POD_NODE_NAME: &str = "NodeName indicates in which node this pod is scheduled. If empty, this pod is a candidate for scheduling by the scheduler defined in schedulerName. Once this field is set, the kubelet for this node becomes responsible for the lifecycle of this pod. This field should not be used to express a desire for the pod to be scheduled on a specific node. https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/#nodename";
const D_POD_NOMINATED: &str = "nominatedNodeName is set only when this pod preempts other pods on the node, but it cannot be scheduled right away as preemption victims receive their graceful termination periods. This field does not guarantee that the pod will be scheduled on this node. Scheduler may decide to place the pod elsewhere if other nodes become available sooner. Scheduler may also decide to give the resources on this node to a higher priority pod that is created after preemption. As a result, this field may be different than PodSpec.nodeName when the pod is scheduled.";
const D_POD_READINESS_GATES: &str = "If specified, all readiness gates will be evaluated for pod readiness. A pod is ready when all its containers are ready AND all conditions specified in the readiness gates have status equal to \"True\" More info: https://git.k8s.io/enhancements/keps/sig-network/580-pod-readiness-gates";
const D_RC_SPEC_REPLICAS: &str = "Replicas is the number of desired replicas. This is a pointer to distinguish between explicit zero and unspecified. Defaults to 1. More info: https://kubernetes.io/docs/concepts/workloads/controllers/replicationcontroller#what-is-a-replicationcontroller";
const D_RC_STATUS_REPLICAS: &str = "Replicas is the most recently observed number of replicas. More info: https://kubernetes.io/docs/concepts/workloads/controllers/replicationcontroller#what-is-a-replicationcontroller";
const D_RC_READY: &str = "The number of ready replicas for this replication controller.";
const D_RC_SELECTOR: &str = "Selector is a label query over pods that should match the Replicas count. If Selector is empty, it is defaulted to the labels present on the Pod template. Label keys and values that must match in order to be controlled by this replication controller, if empty defaulted to labels on Pod template. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors";
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
const D_CM_DATA: &str = "Data contains the configuration data. Each key must consist of alphanumeric characters, '-', '_' or '.'. Values with non-UTF-8 byte sequences must use the BinaryData field. The keys stored in Data must not overlap with the keys in the BinaryData field, this is enforced during validation process.";
