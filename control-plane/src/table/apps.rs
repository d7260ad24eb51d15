//! Server-side printing of `apps/v1`: replica sets, daemon sets, stateful sets, deployments,
//! controller revisions.

use super::*;

pub(super) const RS_COLUMNS: &[Column] = &[
    NAME,
    col("Desired", "integer", D_RS_SPEC_REPLICAS),
    col("Current", "integer", D_RS_STATUS_REPLICAS),
    col("Ready", "integer", D_RS_READY),
    AGE,
    W_CONTAINERS,
    W_IMAGES,
    wide("Selector", "string", D_RS_SELECTOR),
];

pub(super) const DS_COLUMNS: &[Column] = &[
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

pub(super) const STS_COLUMNS: &[Column] = &[
    NAME,
    col("Ready", "string", "Number of the pod with ready state"),
    AGE,
    W_CONTAINERS,
    W_IMAGES,
];

pub(super) const DEPLOYMENT_COLUMNS: &[Column] = &[
    NAME,
    col("Ready", "string", "Number of the pod with ready state"),
    col("Up-to-date", "string", D_DEPLOY_UPDATED),
    col("Available", "string", D_DEPLOY_AVAILABLE),
    AGE,
    W_CONTAINERS,
    W_IMAGES,
    wide("Selector", "string", D_DEPLOY_SELECTOR),
];

pub(super) const CONTROLLER_REVISION_COLUMNS: &[Column] = &[
    NAME,
    col("Controller", "string", "Controller of the object"),
    col("Revision", "string", D_CR_REVISION),
    AGE,
];

pub(super) fn replica_set_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
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

pub(super) fn daemon_set_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
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

pub(super) fn stateful_set_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    let (names, images) = template_containers(obj, &["spec", "template"]);
    vec![
        name(obj),
        s(format!("{}/{}", int(obj, &["status", "readyReplicas"]), int_or(obj, &["spec", "replicas"], 1))),
        age(obj, now),
        names,
        images,
    ]
}

pub(super) fn deployment_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
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

pub(super) fn controller_revision_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
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

// Column descriptions: upstream takes them from the API types' documentation.

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
const D_DEPLOY_UPDATED: &str = "Total number of non-terminating pods targeted by this deployment that have the desired template spec.";
const D_DEPLOY_AVAILABLE: &str = "Total number of available non-terminating pods (ready for at least minReadySeconds) targeted by this deployment.";
const D_DEPLOY_SELECTOR: &str = "Label selector for pods. Existing ReplicaSets whose pods are selected by this will be the ones affected by this deployment. It must match the pod template's labels.";
const D_CR_REVISION: &str = "Revision indicates the revision of the state represented by Data.";
