//! Server-side printing of `storage.k8s.io/v1`: storage classes, volume attachments, CSI nodes,
//! drivers and storage capacities.

use super::*;

pub(super) const STORAGE_CLASS_COLUMNS: &[Column] = &[
    NAME,
    col("Provisioner", "string", D_SC_PROVISIONER),
    col("ReclaimPolicy", "string", D_SC_RECLAIM),
    col("VolumeBindingMode", "string", D_SC_BINDING_MODE),
    col("AllowVolumeExpansion", "string", D_SC_EXPANSION),
    AGE,
];

pub(super) const VOLUME_ATTACHMENT_COLUMNS: &[Column] = &[
    NAME,
    Column { name: "Attacher", type_: "string", format: "name", description: D_VA_ATTACHER, priority: 0 },
    col("PV", "string", D_VA_PV),
    col("Node", "string", D_VA_NODE),
    col("Attached", "boolean", D_VA_ATTACHED),
    AGE,
];

pub(super) const CSI_NODE_COLUMNS: &[Column] = &[
    NAME,
    col("Drivers", "integer", "Drivers indicates the number of CSI drivers registered on the node"),
    AGE,
];

pub(super) const CSI_DRIVER_COLUMNS: &[Column] = &[
    NAME,
    col("AttachRequired", "boolean", D_CSID_ATTACH),
    col("PodInfoOnMount", "boolean", D_CSID_POD_INFO),
    col("StorageCapacity", "boolean", D_CSID_CAPACITY),
    col("TokenRequests", "string", D_CSID_TOKEN),
    col("RequiresRepublish", "boolean", D_CSID_REPUBLISH),
    col("Modes", "string", D_CSID_MODES),
    AGE,
];

pub(super) const CSI_STORAGE_CAPACITY_COLUMNS: &[Column] =
    &[NAME, col("StorageClassName", "string", D_CSISC_CLASS), col("Capacity", "string", D_CSISC_CAPACITY)];

pub(super) fn storage_class_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
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

pub(super) fn volume_attachment_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    vec![
        name(obj),
        s(st(obj, &["spec", "attacher"])),
        s(st(obj, &["spec", "source", "persistentVolumeName"])),
        s(st(obj, &["spec", "nodeName"])),
        Value::Bool(boolean(obj, &["status", "attached"]).unwrap_or(false)),
        age(obj, now),
    ]
}

pub(super) fn csi_node_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    vec![name(obj), count(list(obj, &["spec", "drivers"]).len()), age(obj, now)]
}

pub(super) fn csi_driver_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
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

pub(super) fn csi_storage_capacity_cells(obj: &Value) -> Vec<Value> {
    let capacity = match at(obj, &["capacity"]) {
        None => "<unset>".to_string(),
        some => quantity(some),
    };
    vec![name(obj), s(st(obj, &["storageClassName"])), s(capacity)]
}

// Column descriptions: upstream takes them from the API types' documentation.

const D_SC_PROVISIONER: &str = "provisioner indicates the type of the provisioner.";
const D_SC_RECLAIM: &str = "reclaimPolicy controls the reclaimPolicy for dynamically provisioned PersistentVolumes of this storage class. Defaults to Delete.";
const D_SC_BINDING_MODE: &str = "volumeBindingMode indicates how PersistentVolumeClaims should be provisioned and bound.  When unset, VolumeBindingImmediate is used. This field is only honored by servers that enable the VolumeScheduling feature.";
const D_SC_EXPANSION: &str = "allowVolumeExpansion shows whether the storage class allow volume expand.";
const D_VA_ATTACHER: &str = "attacher indicates the name of the volume driver that MUST handle this request. This is the name returned by GetPluginName().";
const D_VA_PV: &str = "persistentVolumeName represents the name of the persistent volume to attach.";
const D_VA_NODE: &str = "nodeName represents the node that the volume should be attached to.";
const D_VA_ATTACHED: &str = "attached indicates the volume is successfully attached. This field must only be set by the entity completing the attach operation, i.e. the external-attacher.";
const D_CSID_ATTACH: &str = "attachRequired indicates this CSI volume driver requires an attach operation (because it implements the CSI ControllerPublishVolume() method), and that the Kubernetes attach detach controller should call the attach volume interface which checks the volumeattachment status and waits until the volume is attached before proceeding to mounting. The CSI external-attacher coordinates with CSI volume driver and updates the volumeattachment status when the attach operation is complete. If the CSIDriverRegistry feature gate is enabled and the value is specified to false, the attach operation will be skipped. Otherwise the attach operation will be called.\n\nThis field is immutable.";
const D_CSID_POD_INFO: &str = "podInfoOnMount indicates this CSI volume driver requires additional pod information (like podName, podUID, etc.) during mount operations, if set to true. If set to false, pod information will not be passed on mount. Default is false.\n\nThe CSI driver specifies podInfoOnMount as part of driver deployment. If true, Kubelet will pass pod information as VolumeContext in the CSI NodePublishVolume() calls. The CSI driver is responsible for parsing and validating the information passed in as VolumeContext.\n\nThe following VolumeContext will be passed if podInfoOnMount is set to true. This list might grow, but the prefix will be used. \"csi.storage.k8s.io/pod.name\": pod.Name \"csi.storage.k8s.io/pod.namespace\": pod.Namespace \"csi.storage.k8s.io/pod.uid\": string(pod.UID) \"csi.storage.k8s.io/ephemeral\": \"true\" if the volume is an ephemeral inline volume\ndefined by a CSIVolumeSource, otherwise \"false\"\n\n\"csi.storage.k8s.io/ephemeral\" is a new feature in Kubernetes 1.16. It is only required for drivers which support both the \"Persistent\" and \"Ephemeral\" VolumeLifecycleMode. Other drivers can leave pod info disabled and/or ignore this field. As Kubernetes 1.15 doesn't support this field, drivers can only support one mode when deployed on such a cluster and the deployment determines which mode that is, for example via a command line parameter of the driver.\n\nThis field was immutable in Kubernetes \\< 1.29 and now is mutable.";
const D_CSID_CAPACITY: &str = "storageCapacity indicates that the CSI volume driver wants pod scheduling to consider the storage capacity that the driver deployment will report by creating CSIStorageCapacity objects with capacity information, if set to true.\n\nThe check can be enabled immediately when deploying a driver. In that case, provisioning new volumes with late binding will pause until the driver deployment has published some suitable CSIStorageCapacity object.\n\nAlternatively, the driver can be deployed with the field unset or false and it can be flipped later when storage capacity information has been published.\n\nThis field was immutable in Kubernetes \\<= 1.22 and now is mutable.";
const D_CSID_TOKEN: &str = "tokenRequests indicates the CSI driver needs pods' service account tokens it is mounting volume for to do necessary authentication. Kubelet will pass the tokens in VolumeContext in the CSI NodePublishVolume calls. The CSI driver should parse and validate the following VolumeContext: \"csi.storage.k8s.io/serviceAccount.tokens\": {\n\"\\<audience\\>\": {\n\"token\": \\<token\\>,\n\"expirationTimestamp\": \\<expiration timestamp in RFC3339\\>,\n},\n...\n}\n\nNote: Audience in each TokenRequest should be different and at most one token is empty string. To receive a new token after expiry, RequiresRepublish can be used to trigger NodePublishVolume periodically.";
const D_CSID_REPUBLISH: &str = "requiresRepublish indicates the CSI driver wants `NodePublishVolume` being periodically called to reflect any possible change in the mounted volume. This field defaults to false.\n\nNote: After a successful initial NodePublishVolume call, subsequent calls to NodePublishVolume should only update the contents of the volume. New mount points will not be seen by a running container.";
const D_CSID_MODES: &str = "volumeLifecycleModes defines what kind of volumes this CSI volume driver supports. The default if the list is empty is \"Persistent\", which is the usage defined by the CSI specification and implemented in Kubernetes via the usual PV/PVC mechanism.\n\nThe other mode is \"Ephemeral\". In this mode, volumes are defined inline inside the pod spec with CSIVolumeSource and their lifecycle is tied to the lifecycle of that pod. A driver has to be aware of this because it is only going to get a NodePublishVolume call for such a volume.\n\nFor more information about implementing this mode, see https://kubernetes-csi.github.io/docs/ephemeral-local-volumes.html A driver can support one or more of these modes and more modes may be added in the future.\n\nThis field is beta. This field is immutable.";
const D_CSISC_CLASS: &str = "storageClassName represents the name of the StorageClass that the reported capacity applies to. It must meet the same requirements as the name of a StorageClass object (non-empty, DNS subdomain). If that object no longer exists, the CSIStorageCapacity object is obsolete and should be removed by its creator. This field is immutable.";
const D_CSISC_CAPACITY: &str = "capacity is the value reported by the CSI driver in its GetCapacityResponse for a GetCapacityRequest with topology and parameters that match the previous fields.\n\nThe semantic is currently (CSI spec 1.2) defined as: The available capacity, in bytes, of the storage that can be used to provision volumes. If not set, that information is currently unavailable.";
