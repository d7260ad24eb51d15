//! Kubernetes strategic merge patch (`application/strategic-merge-patch+json`).
//!
//! [`apply`] merges a strategic merge patch into the live object of a built-in kind. The
//! patch format is the one kubectl and client-go produce (`kubectl apply`, `label`,
//! `annotate`, `scale`, `set image`, `patch --type strategic`):
//!
//! - maps merge recursively and a `null` value deletes the key;
//! - lists follow the patch strategy of their field: lists with a merge key merge element by
//!   element on that key, lists of scalars with the `merge` strategy are sets (union), every
//!   other list is replaced as a whole;
//! - the directives `$patch` (`replace` / `delete`, on maps and as list elements),
//!   `$retainKeys`, `$setElementOrder/<list>` and `$deleteFromPrimitiveList/<list>` are
//!   honoured; any other `$`-key is rejected.
//!
//! The patch strategies come from a hand-written table ([`SchemaType`]) transcribed from the
//! `patchStrategy` / `patchMergeKey` struct tags of `k8s.io/api`. Types share entries, so the
//! `PodSpec` of a Pod, a Deployment template and a DaemonSet template are one entry. Fields
//! that are not in the table (and kinds that are not, see [`schema_for_kind`]) merge as plain
//! maps with lists replaced, which is also what upstream does for data it has no type for.
//!
//! List order follows the upstream rules: items named by the patch (or by
//! `$setElementOrder`) take the patch's order, items only on the server keep their place
//! relative to the items around them in the live list, and new items come before server-only
//! items that follow them. So a plain patch that adds a container puts it first, as
//! `kubectl patch` does against a real cluster; `kubectl apply` sends `$setElementOrder` and
//! gets exactly the order of its manifest.

use serde_json::{Map, Value};

type Object = Map<String, Value>;

const DIRECTIVE: &str = "$patch";
const RETAIN_KEYS: &str = "$retainKeys";
const SET_ORDER_PREFIX: &str = "$setElementOrder/";
const DELETE_PRIMITIVE_PREFIX: &str = "$deleteFromPrimitiveList/";
/// `$`-keys that are real fields, not directives (JSON schema keywords in CRD validation).
const DOLLAR_FIELDS: [&str; 2] = ["$ref", "$schema"];
const ROOT: &str = ".";

/// Why a strategic merge patch could not be applied. All of these are the client's fault
/// (a malformed patch, or a patch that does not fit the object).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SmpError {
    #[error("the {what} must be a json object")]
    NotAnObject { what: &'static str },
    #[error("unknown patch directive `{directive}` at {path}")]
    UnknownDirective { path: String, directive: String },
    #[error("invalid `{directive}` at {path}: {reason}")]
    InvalidDirective {
        path: String,
        directive: String,
        reason: String,
    },
    #[error("element {index} of the list at {path} has no merge key `{key}`")]
    MissingMergeKey {
        path: String,
        key: &'static str,
        index: usize,
    },
    #[error("invalid value at {path}: {reason}")]
    InvalidValue { path: String, reason: String },
}

/// Apply a strategic merge patch to `original` (the live object as JSON) for the given kind
/// ("Pod", "Deployment", ...), returning the patched object. Neither input is modified.
pub fn apply(kind: &str, original: &Value, patch: &Value) -> Result<Value, SmpError> {
    let Value::Object(original) = original else {
        return Err(SmpError::NotAnObject {
            what: "object to patch",
        });
    };
    let Value::Object(patch) = patch else {
        return Err(SmpError::NotAnObject { what: "patch" });
    };
    match merge_map(original.clone(), patch.clone(), schema_for_kind(kind), ROOT)? {
        Outcome::Keep(merged) => Ok(Value::Object(merged)),
        Outcome::Delete => Err(SmpError::InvalidDirective {
            path: ROOT.to_string(),
            directive: "$patch: delete".to_string(),
            reason: "a patch cannot delete the whole object".to_string(),
        }),
    }
}

// ---------------------------------------------------------------------------------------
// Patch metadata.
// ---------------------------------------------------------------------------------------

/// How the elements of a list field combine with a patch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListStrategy {
    /// No patch strategy: the patch's list replaces the live one.
    Atomic,
    /// `patchStrategy:"merge"` with `patchMergeKey`: a list of objects merged by that key.
    MergeByKey(&'static str),
    /// `patchStrategy:"merge"` on a list of scalars: a set, the patch adds values.
    MergePrimitives,
}

/// Patch metadata of one field of a [`SchemaType`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldMeta {
    /// JSON name of the field.
    pub name: &'static str,
    /// Entries for the field's value (for a list: for each element), when it has any.
    pub ty: Option<SchemaType>,
    /// Strategy when the field holds a list. Maps always merge.
    pub list: ListStrategy,
    /// The field's `patchStrategy` includes `retainKeys` (clients send `$retainKeys` in it).
    /// Informational: like upstream, the directive is honoured wherever it appears.
    pub retain_keys: bool,
}

/// A node of the patch metadata tree: a Kubernetes type with the fields that have a patch
/// strategy or lead to one. Fields not listed are plain maps / atomic lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SchemaType {
    /// Kinds whose only patch metadata is in `metadata` (ConfigMap, Secret, Event, ...).
    MetadataOnly,
    Namespace,
    Node,
    Pod,
    Service,
    ServiceAccount,
    PersistentVolumeClaim,
    CsiNode,
    Deployment,
    /// ReplicaSet, DaemonSet, StatefulSet and ReplicationController: a pod template in
    /// `spec.template` and conditions in `status`.
    Workload,
    PodTemplate,
    ObjectMeta,
    /// A status whose only patch metadata is `conditions` merged by `type`.
    ConditionsStatus,
    NodeSpec,
    NodeStatus,
    PodTemplateSpec,
    PodSpec,
    PodStatus,
    Container,
    Volume,
    EphemeralVolumeSource,
    ServiceSpec,
    CsiNodeSpec,
    DeploymentSpec,
    WorkloadSpec,
}

/// The root of the metadata tree for a kind, `None` for kinds without an entry (patched as
/// plain JSON maps).
pub fn schema_for_kind(kind: &str) -> Option<SchemaType> {
    use SchemaType as T;
    Some(match kind {
        "Namespace" => T::Namespace,
        "Node" => T::Node,
        "Pod" => T::Pod,
        "Service" => T::Service,
        "ServiceAccount" => T::ServiceAccount,
        "PersistentVolumeClaim" => T::PersistentVolumeClaim,
        "CSINode" => T::CsiNode,
        "Deployment" => T::Deployment,
        "ReplicaSet" | "DaemonSet" | "StatefulSet" | "ReplicationController" => T::Workload,
        "PodTemplate" => T::PodTemplate,
        "Endpoints" | "ConfigMap" | "Secret" | "Event" | "PersistentVolume" | "EndpointSlice"
        | "Lease" | "StorageClass" | "CSIDriver" | "VolumeAttachment" | "CSIStorageCapacity" | "Scale" => T::MetadataOnly,
        _ => return None,
    })
}

impl SchemaType {
    /// The fields of this type that carry patch metadata.
    pub fn fields(self) -> &'static [FieldMeta] {
        use SchemaType as T;
        match self {
            T::MetadataOnly => METADATA_ONLY,
            T::Namespace => NAMESPACE,
            T::Node => NODE,
            T::Pod => POD,
            T::Service => SERVICE,
            T::ServiceAccount => SERVICE_ACCOUNT,
            T::PersistentVolumeClaim => PERSISTENT_VOLUME_CLAIM,
            T::CsiNode => CSI_NODE,
            T::Deployment => DEPLOYMENT,
            T::Workload => WORKLOAD,
            T::PodTemplate => POD_TEMPLATE,
            T::ObjectMeta => OBJECT_META,
            T::ConditionsStatus => CONDITIONS_STATUS,
            T::NodeSpec => NODE_SPEC,
            T::NodeStatus => NODE_STATUS,
            T::PodTemplateSpec => POD_TEMPLATE_SPEC,
            T::PodSpec => POD_SPEC,
            T::PodStatus => POD_STATUS,
            T::Container => CONTAINER,
            T::Volume => VOLUME,
            T::EphemeralVolumeSource => EPHEMERAL_VOLUME_SOURCE,
            T::ServiceSpec => SERVICE_SPEC,
            T::CsiNodeSpec => CSI_NODE_SPEC,
            T::DeploymentSpec => DEPLOYMENT_SPEC,
            T::WorkloadSpec => WORKLOAD_SPEC,
        }
    }

    /// The metadata of one field, `None` when the field has no entry.
    pub fn field(self, name: &str) -> Option<&'static FieldMeta> {
        self.fields().iter().find(|f| f.name == name)
    }
}

/// A field holding a map with entries of its own.
const fn nested(name: &'static str, ty: SchemaType) -> FieldMeta {
    FieldMeta {
        name,
        ty: Some(ty),
        list: ListStrategy::Atomic,
        retain_keys: false,
    }
}

/// A list of objects merged by `key`, elements of type `ty`.
const fn keyed(name: &'static str, key: &'static str, ty: Option<SchemaType>) -> FieldMeta {
    FieldMeta {
        name,
        ty,
        list: ListStrategy::MergeByKey(key),
        retain_keys: false,
    }
}

/// `patchStrategy:"merge,retainKeys"`: merged by `key`, elements carry `$retainKeys`.
const fn keyed_retaining(
    name: &'static str,
    key: &'static str,
    ty: Option<SchemaType>,
) -> FieldMeta {
    FieldMeta {
        name,
        ty,
        list: ListStrategy::MergeByKey(key),
        retain_keys: true,
    }
}

/// A list of scalars with `patchStrategy:"merge"`.
const fn set(name: &'static str) -> FieldMeta {
    FieldMeta {
        name,
        ty: None,
        list: ListStrategy::MergePrimitives,
        retain_keys: false,
    }
}

/// A map with `patchStrategy:"retainKeys"`.
const fn retaining(name: &'static str) -> FieldMeta {
    FieldMeta {
        name,
        ty: None,
        list: ListStrategy::Atomic,
        retain_keys: true,
    }
}

const METADATA: FieldMeta = nested("metadata", SchemaType::ObjectMeta);
const CONDITIONS: FieldMeta = keyed("conditions", "type", None);

// Roots.
const METADATA_ONLY: &[FieldMeta] = &[METADATA];
const NAMESPACE: &[FieldMeta] = &[METADATA, nested("status", SchemaType::ConditionsStatus)];
const NODE: &[FieldMeta] = &[
    METADATA,
    nested("spec", SchemaType::NodeSpec),
    nested("status", SchemaType::NodeStatus),
];
const POD: &[FieldMeta] = &[
    METADATA,
    nested("spec", SchemaType::PodSpec),
    nested("status", SchemaType::PodStatus),
];
const SERVICE: &[FieldMeta] = &[
    METADATA,
    nested("spec", SchemaType::ServiceSpec),
    nested("status", SchemaType::ConditionsStatus),
];
const SERVICE_ACCOUNT: &[FieldMeta] = &[METADATA, keyed("secrets", "name", None)];
const PERSISTENT_VOLUME_CLAIM: &[FieldMeta] =
    &[METADATA, nested("status", SchemaType::ConditionsStatus)];
const CSI_NODE: &[FieldMeta] = &[METADATA, nested("spec", SchemaType::CsiNodeSpec)];
const DEPLOYMENT: &[FieldMeta] = &[
    METADATA,
    nested("spec", SchemaType::DeploymentSpec),
    nested("status", SchemaType::ConditionsStatus),
];
const WORKLOAD: &[FieldMeta] = &[
    METADATA,
    nested("spec", SchemaType::WorkloadSpec),
    nested("status", SchemaType::ConditionsStatus),
];
const POD_TEMPLATE: &[FieldMeta] = &[METADATA, nested("template", SchemaType::PodTemplateSpec)];

// Shared types.
const OBJECT_META: &[FieldMeta] = &[set("finalizers"), keyed("ownerReferences", "uid", None)];
const CONDITIONS_STATUS: &[FieldMeta] = &[CONDITIONS];
const NODE_SPEC: &[FieldMeta] = &[set("podCIDRs")];
const NODE_STATUS: &[FieldMeta] = &[CONDITIONS, keyed("addresses", "type", None)];
const POD_TEMPLATE_SPEC: &[FieldMeta] = &[METADATA, nested("spec", SchemaType::PodSpec)];
const POD_SPEC: &[FieldMeta] = &[
    keyed_retaining("volumes", "name", Some(SchemaType::Volume)),
    keyed("initContainers", "name", Some(SchemaType::Container)),
    keyed("containers", "name", Some(SchemaType::Container)),
    // EphemeralContainerCommon carries the same tags as Container.
    keyed("ephemeralContainers", "name", Some(SchemaType::Container)),
    keyed("imagePullSecrets", "name", None),
    keyed("hostAliases", "ip", None),
    keyed("topologySpreadConstraints", "topologyKey", None),
    keyed("schedulingGates", "name", None),
    keyed_retaining("resourceClaims", "name", None),
];
const POD_STATUS: &[FieldMeta] = &[
    CONDITIONS,
    keyed("podIPs", "ip", None),
    keyed("hostIPs", "ip", None),
    keyed_retaining("resourceClaimStatuses", "name", None),
];
const CONTAINER: &[FieldMeta] = &[
    keyed("ports", "containerPort", None),
    keyed("env", "name", None),
    keyed("volumeMounts", "mountPath", None),
    keyed("volumeDevices", "devicePath", None),
];
const VOLUME: &[FieldMeta] = &[nested("ephemeral", SchemaType::EphemeralVolumeSource)];
const EPHEMERAL_VOLUME_SOURCE: &[FieldMeta] =
    &[nested("volumeClaimTemplate", SchemaType::MetadataOnly)];
const SERVICE_SPEC: &[FieldMeta] = &[keyed("ports", "port", None)];
const CSI_NODE_SPEC: &[FieldMeta] = &[keyed("drivers", "name", None)];
const DEPLOYMENT_SPEC: &[FieldMeta] = &[
    nested("template", SchemaType::PodTemplateSpec),
    retaining("strategy"),
];
const WORKLOAD_SPEC: &[FieldMeta] = &[nested("template", SchemaType::PodTemplateSpec)];

// ---------------------------------------------------------------------------------------
// Merging.
// ---------------------------------------------------------------------------------------

/// The result of merging a patch map: the merged map, or `$patch: delete`.
enum Outcome {
    Keep(Object),
    Delete,
}

/// A merged list element with its position in the live list, if it came from there.
struct Item {
    value: Value,
    server_pos: Option<usize>,
}

fn child_path(path: &str, key: &str) -> String {
    if path == ROOT {
        format!(".{key}")
    } else {
        format!("{path}.{key}")
    }
}

fn element_path(path: &str, key: &str, value: &Value) -> String {
    match value {
        Value::String(s) => format!("{path}[{key}={s}]"),
        other => format!("{path}[{key}={other}]"),
    }
}

/// JSON equality where numbers compare by value (`80` equals `80.0`), as they do in Go.
fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            x == y || matches!((x.as_f64(), y.as_f64()), (Some(p), Some(q)) if p == q)
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| json_eq(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|other| json_eq(v, other)))
        }
        _ => a == b,
    }
}

/// The merge key of a list element, if present and not null.
fn key_of<'a>(value: &'a Value, key: &str) -> Option<&'a Value> {
    value.get(key).filter(|v| !v.is_null())
}

fn directive_str<'a>(value: &'a Value, path: &str) -> Result<&'a str, SmpError> {
    value.as_str().ok_or_else(|| SmpError::InvalidDirective {
        path: path.to_string(),
        directive: DIRECTIVE.to_string(),
        reason: format!("expected a string, got {value}"),
    })
}

/// Merge `patch` into `original`, both maps of type `ty`.
fn merge_map(
    mut original: Object,
    mut patch: Object,
    ty: Option<SchemaType>,
    path: &str,
) -> Result<Outcome, SmpError> {
    if let Some(directive) = patch.remove(DIRECTIVE) {
        return match directive_str(&directive, path)? {
            // The rest of the patch, applied to nothing, is the new map.
            "replace" => merge_map(Object::new(), patch, ty, path),
            "delete" => Ok(Outcome::Delete),
            other => Err(SmpError::UnknownDirective {
                path: path.to_string(),
                directive: format!("{DIRECTIVE}: {other}"),
            }),
        };
    }

    if let Some(keys) = patch.remove(RETAIN_KEYS) {
        apply_retain_keys(&mut original, &patch, &keys, path)?;
    }

    let order_directives: Vec<String> = patch
        .keys()
        .filter(|k| k.starts_with(SET_ORDER_PREFIX))
        .cloned()
        .collect();
    for directive in order_directives {
        if let Some(order) = patch.remove(&directive) {
            apply_set_element_order(&mut original, &mut patch, &directive, order, ty, path)?;
        }
    }

    let mut deletions = Vec::new();
    for (key, value) in patch {
        if let Some(field) = key.strip_prefix(DELETE_PRIMITIVE_PREFIX) {
            deletions.push((field.to_string(), value));
            continue;
        }
        if key.starts_with('$') && !DOLLAR_FIELDS.contains(&key.as_str()) {
            return Err(SmpError::UnknownDirective {
                path: path.to_string(),
                directive: key,
            });
        }
        if value.is_null() {
            original.remove(&key);
            continue;
        }
        let field_path = child_path(path, &key);
        let meta = ty.and_then(|t| t.field(&key));
        let merged = match original.get_mut(&key) {
            Some(existing) => merge_value(std::mem::take(existing), value, meta, &field_path)?,
            None => clean_value(value, meta, &field_path)?,
        };
        match merged {
            Some(merged) => {
                original.insert(key, merged);
            }
            None => {
                original.remove(&key);
            }
        }
    }

    for (field, values) in deletions {
        let directive = format!("{DELETE_PRIMITIVE_PREFIX}{field}");
        if field.is_empty() {
            return Err(SmpError::InvalidDirective {
                path: path.to_string(),
                directive,
                reason: "the directive must name a list field, e.g. `$deleteFromPrimitiveList/finalizers`"
                    .to_string(),
            });
        }
        let Value::Array(values) = values else {
            return Err(SmpError::InvalidDirective {
                path: path.to_string(),
                directive,
                reason: "expected a list of values to delete".to_string(),
            });
        };
        match original.get_mut(&field) {
            Some(Value::Array(list)) => {
                list.retain(|v| !values.iter().any(|d| json_eq(v, d)));
            }
            Some(Value::Null) | None => {}
            Some(_) => {
                return Err(SmpError::InvalidValue {
                    path: child_path(path, &field),
                    reason: format!("`{directive}` needs a list, but the field is not one"),
                });
            }
        }
    }

    Ok(Outcome::Keep(original))
}

/// `$retainKeys`: drop every key of `original` not in the list, after checking that the
/// patch only sets keys from the list.
fn apply_retain_keys(
    original: &mut Object,
    patch: &Object,
    keys: &Value,
    path: &str,
) -> Result<(), SmpError> {
    let invalid = |reason: String| SmpError::InvalidDirective {
        path: path.to_string(),
        directive: RETAIN_KEYS.to_string(),
        reason,
    };
    let Value::Array(keys) = keys else {
        return Err(invalid(format!(
            "expected a list of field names, got {keys}"
        )));
    };
    let mut retained = Vec::with_capacity(keys.len());
    for key in keys {
        let Some(name) = key.as_str() else {
            return Err(invalid(format!(
                "expected a list of field names, found {key}"
            )));
        };
        retained.push(name);
    }
    for (key, value) in patch {
        if value.is_null()
            || key.starts_with(SET_ORDER_PREFIX)
            || key.starts_with(DELETE_PRIMITIVE_PREFIX)
        {
            continue;
        }
        if !retained.contains(&key.as_str()) {
            return Err(invalid(format!(
                "the patch sets `{key}`, which is not in the list of keys to retain"
            )));
        }
    }
    original.retain(|key, _| retained.contains(&key.as_str()));
    Ok(())
}

/// `$setElementOrder/<field>`: merge the field's patch list (if any) and order the result by
/// the directive's list. Removes the field from `patch` once done.
fn apply_set_element_order(
    original: &mut Object,
    patch: &mut Object,
    directive: &str,
    order: Value,
    ty: Option<SchemaType>,
    path: &str,
) -> Result<(), SmpError> {
    let directive_path = child_path(path, directive);
    let invalid = |reason: &str| SmpError::InvalidDirective {
        path: path.to_string(),
        directive: directive.to_string(),
        reason: reason.to_string(),
    };
    let field = directive
        .strip_prefix(SET_ORDER_PREFIX)
        .unwrap_or_default()
        .to_string();
    if field.is_empty() {
        return Err(invalid(
            "the directive must name a list field, e.g. `$setElementOrder/containers`",
        ));
    }
    let Value::Array(order) = order else {
        return Err(invalid("expected a list"));
    };
    let field_path = child_path(path, &field);
    let meta = ty.and_then(|t| t.field(&field));
    let key = match meta.map(|m| m.list) {
        Some(ListStrategy::MergeByKey(key)) => Some(key),
        _ => None,
    };

    let patch_list = match patch.remove(&field) {
        None => None,
        Some(Value::Array(list)) => Some(list),
        Some(Value::Null) => {
            // The field is being deleted: there is nothing to order.
            patch.insert(field, Value::Null);
            return Ok(());
        }
        Some(other) => {
            return Err(SmpError::InvalidValue {
                path: field_path,
                reason: format!("expected a list to go with `{directive}`, got {other}"),
            });
        }
    };

    // The identities the order is expressed in: merge-key values, or whole values.
    let order_ids: Vec<Value> = match key {
        Some(key) => order
            .iter()
            .enumerate()
            .map(|(index, element)| {
                key_of(element, key)
                    .cloned()
                    .ok_or_else(|| SmpError::MissingMergeKey {
                        path: directive_path.clone(),
                        key,
                        index,
                    })
            })
            .collect::<Result<_, _>>()?,
        None => order,
    };
    if let Some(list) = &patch_list {
        check_patch_order(list, &order_ids, key, &field_path, directive)?;
    }

    let original_list = match original.get_mut(&field) {
        Some(Value::Array(list)) => Some(std::mem::take(list)),
        _ => None,
    };
    let items = match (original_list, patch_list) {
        (None, None) => return Ok(()),
        (Some(list), None) => list
            .into_iter()
            .enumerate()
            .map(|(i, value)| Item {
                value,
                server_pos: Some(i),
            })
            .collect(),
        (list, Some(patch_list)) => {
            merge_list(list.unwrap_or_default(), patch_list, meta, &field_path)?
        }
    };
    let ordered = order_items(items, &order_ids, key);
    original.insert(
        field,
        Value::Array(ordered.into_iter().map(|item| item.value).collect()),
    );
    Ok(())
}

/// The patch list's elements must appear in the `$setElementOrder` list, in the same order
/// (deletions and other directive elements aside).
fn check_patch_order(
    patch_list: &[Value],
    order_ids: &[Value],
    key: Option<&'static str>,
    path: &str,
    directive: &str,
) -> Result<(), SmpError> {
    if order_ids.is_empty() {
        return Ok(());
    }
    let mut next = 0;
    for (index, element) in patch_list.iter().enumerate() {
        if element.get(DIRECTIVE).is_some() {
            continue;
        }
        let id = match key {
            Some(key) => key_of(element, key).ok_or_else(|| SmpError::MissingMergeKey {
                path: path.to_string(),
                key,
                index,
            })?,
            None => element,
        };
        let found = order_ids
            .get(next..)
            .and_then(|rest| rest.iter().position(|o| json_eq(o, id)));
        match found {
            Some(offset) => next += offset + 1,
            None => {
                return Err(SmpError::InvalidDirective {
                    path: path.to_string(),
                    directive: directive.to_string(),
                    reason: format!(
                        "element {index} of the patch list is missing from the order list or out of order"
                    ),
                });
            }
        }
    }
    Ok(())
}

/// Merge a patch value into an existing one; `None` means the field goes away.
fn merge_value(
    existing: Value,
    patch: Value,
    meta: Option<&FieldMeta>,
    path: &str,
) -> Result<Option<Value>, SmpError> {
    match (existing, patch) {
        (Value::Object(existing), Value::Object(patch)) => Ok(
            match merge_map(existing, patch, meta.and_then(|m| m.ty), path)? {
                Outcome::Keep(merged) => Some(Value::Object(merged)),
                Outcome::Delete => None,
            },
        ),
        (Value::Array(existing), Value::Array(patch)) => {
            let items = merge_list(existing, patch, meta, path)?;
            Ok(Some(Value::Array(
                items.into_iter().map(|item| item.value).collect(),
            )))
        }
        (_, patch) => clean_value(patch, meta, path),
    }
}

/// A patch value for a field the live object does not have (or has with another JSON type):
/// the patch applied to nothing, so directives are resolved and nulls dropped.
fn clean_value(
    patch: Value,
    meta: Option<&FieldMeta>,
    path: &str,
) -> Result<Option<Value>, SmpError> {
    match patch {
        Value::Object(patch) => merge_value(
            Value::Object(Object::new()),
            Value::Object(patch),
            meta,
            path,
        ),
        Value::Array(patch) => {
            merge_value(Value::Array(Vec::new()), Value::Array(patch), meta, path)
        }
        other => Ok(Some(other)),
    }
}

/// Merge a patch list into a live list by the field's strategy.
fn merge_list(
    existing: Vec<Value>,
    patch: Vec<Value>,
    meta: Option<&FieldMeta>,
    path: &str,
) -> Result<Vec<Item>, SmpError> {
    let element_type = meta.and_then(|m| m.ty);
    match meta.map_or(ListStrategy::Atomic, |m| m.list) {
        ListStrategy::MergeByKey(key) => merge_keyed(existing, patch, key, element_type, path),
        ListStrategy::MergePrimitives => merge_primitives(existing, patch, path),
        ListStrategy::Atomic => replace_atomic(&existing, patch, element_type, path),
    }
}

/// A list without a strategy: the patch list, cleaned, replaces the live one.
fn replace_atomic(
    existing: &[Value],
    patch: Vec<Value>,
    element_type: Option<SchemaType>,
    path: &str,
) -> Result<Vec<Item>, SmpError> {
    let mut items = Vec::with_capacity(patch.len());
    for (index, element) in patch.into_iter().enumerate() {
        let element_path = format!("{path}[{index}]");
        let value = match element {
            Value::Object(element) => {
                if let Some(directive) = element.get(DIRECTIVE) {
                    // List directives mean nothing in a list that is replaced anyway.
                    match directive_str(directive, &element_path)? {
                        "replace" | "delete" => continue,
                        other => {
                            return Err(SmpError::UnknownDirective {
                                path: element_path,
                                directive: format!("{DIRECTIVE}: {other}"),
                            });
                        }
                    }
                }
                match merge_map(Object::new(), element, element_type, &element_path)? {
                    Outcome::Keep(element) => Value::Object(element),
                    Outcome::Delete => continue,
                }
            }
            Value::Array(nested) => Value::Array(
                replace_atomic(&[], nested, None, &element_path)?
                    .into_iter()
                    .map(|item| item.value)
                    .collect(),
            ),
            other => other,
        };
        let server_pos = existing.iter().position(|e| json_eq(e, &value));
        items.push(Item { value, server_pos });
    }
    Ok(items)
}

/// A list of objects merged by `key`.
fn merge_keyed(
    existing: Vec<Value>,
    patch: Vec<Value>,
    key: &'static str,
    element_type: Option<SchemaType>,
    path: &str,
) -> Result<Vec<Item>, SmpError> {
    if let Some(index) = existing.iter().position(|e| !e.is_object()) {
        return Err(SmpError::InvalidValue {
            path: path.to_string(),
            reason: format!(
                "element {index} of the existing list is not an object, so the list cannot be merged by `{key}`"
            ),
        });
    }

    let mut deleted = Vec::new();
    let mut replace = false;
    let mut entries = Vec::with_capacity(patch.len());
    for (index, element) in patch.into_iter().enumerate() {
        let Value::Object(element) = element else {
            return Err(SmpError::InvalidValue {
                path: path.to_string(),
                reason: format!(
                    "element {index} of the patch list is not an object; this list is merged by `{key}`"
                ),
            });
        };
        let Some(directive) = element.get(DIRECTIVE) else {
            entries.push((index, element));
            continue;
        };
        let element_path = format!("{path}[{index}]");
        match directive_str(directive, &element_path)? {
            "delete" => {
                let value = element
                    .get(key)
                    .filter(|v| !v.is_null())
                    .cloned()
                    .ok_or_else(|| SmpError::MissingMergeKey {
                        path: path.to_string(),
                        key,
                        index,
                    })?;
                deleted.push(value);
            }
            "replace" => replace = true,
            "merge" => {
                return Err(SmpError::InvalidDirective {
                    path: element_path,
                    directive: format!("{DIRECTIVE}: merge"),
                    reason:
                        "lists with a merge key are merged already; `merge` is not a list directive"
                            .to_string(),
                });
            }
            other => {
                return Err(SmpError::UnknownDirective {
                    path: element_path,
                    directive: format!("{DIRECTIVE}: {other}"),
                });
            }
        }
    }

    if replace {
        // `{"$patch": "replace"}` in the list: the other elements are the whole new list.
        let mut items = Vec::with_capacity(entries.len());
        for (index, element) in entries {
            let element_path = format!("{path}[{index}]");
            if let Outcome::Keep(element) =
                merge_map(Object::new(), element, element_type, &element_path)?
            {
                items.push(Item {
                    value: Value::Object(element),
                    server_pos: None,
                });
            }
        }
        return Ok(items);
    }

    let mut items: Vec<Item> = existing
        .into_iter()
        .filter(|e| !key_of(e, key).is_some_and(|value| deleted.iter().any(|d| json_eq(value, d))))
        .enumerate()
        .map(|(i, value)| Item {
            value,
            server_pos: Some(i),
        })
        .collect();

    let mut order = Vec::with_capacity(entries.len());
    for (index, element) in entries {
        let Some(id) = element.get(key).filter(|v| !v.is_null()).cloned() else {
            return Err(SmpError::MissingMergeKey {
                path: path.to_string(),
                key,
                index,
            });
        };
        let element_path = element_path(path, key, &id);
        let position = items
            .iter()
            .position(|item| key_of(&item.value, key).is_some_and(|v| json_eq(v, &id)));
        match position {
            Some(position) => {
                let Some(item) = items.get_mut(position) else {
                    continue;
                };
                let current = match std::mem::take(&mut item.value) {
                    Value::Object(current) => current,
                    _ => Object::new(),
                };
                match merge_map(current, element, element_type, &element_path)? {
                    Outcome::Keep(merged) => item.value = Value::Object(merged),
                    Outcome::Delete => {
                        items.remove(position);
                    }
                }
            }
            None => {
                if let Outcome::Keep(element) =
                    merge_map(Object::new(), element, element_type, &element_path)?
                {
                    items.push(Item {
                        value: Value::Object(element),
                        server_pos: None,
                    });
                }
            }
        }
        order.push(id);
    }
    Ok(order_items(items, &order, Some(key)))
}

/// A list of scalars with the merge strategy: the union, in upstream's order.
fn merge_primitives(
    existing: Vec<Value>,
    patch: Vec<Value>,
    path: &str,
) -> Result<Vec<Item>, SmpError> {
    if let Some(index) = patch.iter().position(|v| v.is_object() || v.is_array()) {
        return Err(SmpError::InvalidValue {
            path: path.to_string(),
            reason: format!(
                "element {index} of the patch list is not a scalar; this list is merged as a set of values"
            ),
        });
    }
    let mut items: Vec<Item> = Vec::with_capacity(existing.len() + patch.len());
    for (i, value) in existing.into_iter().enumerate() {
        if !items.iter().any(|item| json_eq(&item.value, &value)) {
            items.push(Item {
                value,
                server_pos: Some(i),
            });
        }
    }
    for value in &patch {
        if !items.iter().any(|item| json_eq(&item.value, value)) {
            items.push(Item {
                value: value.clone(),
                server_pos: None,
            });
        }
    }
    Ok(order_items(items, &patch, None))
}

/// Upstream's list order: items whose identity (merge-key value, or the value itself when
/// `key` is `None`) is in `order` take that order; the other items keep their live order; the
/// two runs are interleaved so that a server-only item goes before an ordered item exactly
/// when both are in the live list and it came first there.
fn order_items(items: Vec<Item>, order: &[Value], key: Option<&str>) -> Vec<Item> {
    let total = items.len();
    let mut ordered: Vec<(usize, Item)> = Vec::with_capacity(total);
    let mut server_only: Vec<Item> = Vec::with_capacity(total);
    for item in items {
        let id = match key {
            Some(key) => key_of(&item.value, key),
            None => Some(&item.value),
        };
        match id.and_then(|id| order.iter().position(|o| json_eq(o, id))) {
            Some(rank) => ordered.push((rank, item)),
            None => server_only.push(item),
        }
    }
    ordered.sort_by_key(|(rank, _)| *rank);
    server_only.sort_by_key(|item| item.server_pos.unwrap_or(usize::MAX));

    let mut left = server_only.into_iter().peekable();
    let mut right = ordered.into_iter().map(|(_, item)| item).peekable();
    let mut out = Vec::with_capacity(total);
    loop {
        let take_left = match (left.peek(), right.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(l), Some(r)) => {
                matches!((l.server_pos, r.server_pos), (Some(a), Some(b)) if a < b)
            }
        };
        let next = if take_left { left.next() } else { right.next() };
        out.extend(next);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn patched(kind: &str, original: Value, patch: Value) -> Value {
        match apply(kind, &original, &patch) {
            Ok(v) => v,
            Err(e) => panic!("patch failed: {e}"),
        }
    }

    fn names(list: &Value) -> Vec<&str> {
        list.as_array()
            .map(|l| l.iter().filter_map(|e| e["name"].as_str()).collect())
            .unwrap_or_default()
    }

    fn pod() -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web", "tier": "front"}},
            "spec": {
                "containers": [
                    {"name": "app", "image": "nginx:1.21", "imagePullPolicy": "IfNotPresent",
                     "ports": [{"containerPort": 80, "protocol": "TCP"}],
                     "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]},
                    {"name": "log", "image": "busybox", "args": ["tail", "-f"]}
                ],
                "volumes": [{"name": "data", "emptyDir": {}}],
                "tolerations": [
                    {"key": "a", "operator": "Exists"},
                    {"key": "b", "operator": "Equal", "value": "x", "effect": "NoSchedule"}
                ]
            }
        })
    }

    fn deployment() -> Value {
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "default", "annotations": {"keep": "me"}},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": "web"}},
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {
                        "containers": [
                            {"name": "app", "image": "nginx:1.21", "resources": {"limits": {"cpu": "1"}},
                             "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]}
                        ]
                    }
                }
            },
            "status": {"replicas": 2, "conditions": [{"type": "Available", "status": "True"}]}
        })
    }

    #[test]
    fn maps_merge_and_null_deletes() {
        let out = patched(
            "Pod",
            pod(),
            json!({"metadata": {"labels": {"tier": null, "env": "prod"}, "annotations": {"a": "b"}}}),
        );
        assert_eq!(
            out["metadata"]["labels"],
            json!({"app": "web", "env": "prod"})
        );
        assert_eq!(out["metadata"]["annotations"], json!({"a": "b"}));
        assert_eq!(out["metadata"]["name"], "web");
        assert_eq!(out["spec"], pod()["spec"]);
    }

    #[test]
    fn null_for_missing_key_and_nested_nulls_in_new_maps_are_dropped() {
        let out = patched(
            "Pod",
            pod(),
            json!({"metadata": {"annotations": {"gone": null}}, "spec": {"securityContext": {"runAsUser": 1000, "fsGroup": null}}}),
        );
        assert_eq!(out["metadata"]["annotations"], json!({}));
        assert_eq!(out["spec"]["securityContext"], json!({"runAsUser": 1000}));
    }

    #[test]
    fn containers_merge_by_name() {
        let out = patched(
            "Pod",
            pod(),
            json!({"spec": {"containers": [{"name": "app", "image": "nginx:1.22"}]}}),
        );
        let containers = &out["spec"]["containers"];
        assert_eq!(names(containers), ["app", "log"]);
        assert_eq!(containers[0]["image"], "nginx:1.22");
        assert_eq!(containers[0]["imagePullPolicy"], "IfNotPresent");
        assert_eq!(containers[0]["env"], pod()["spec"]["containers"][0]["env"]);
        assert_eq!(containers[1], pod()["spec"]["containers"][1]);
    }

    #[test]
    fn new_container_is_added_and_goes_where_upstream_puts_it() {
        // A plain patch: the new container comes before the server-only ones, as with
        // `kubectl patch` against a real API server.
        let out = patched(
            "Pod",
            pod(),
            json!({"spec": {"containers": [{"name": "sidecar", "image": "envoy"}]}}),
        );
        assert_eq!(names(&out["spec"]["containers"]), ["sidecar", "app", "log"]);
        assert_eq!(
            out["spec"]["containers"][0],
            json!({"name": "sidecar", "image": "envoy"})
        );

        // With `$setElementOrder` (kubectl apply) the order is the manifest's.
        let out = patched(
            "Pod",
            pod(),
            json!({"spec": {
                "$setElementOrder/containers": [{"name": "app"}, {"name": "log"}, {"name": "sidecar"}],
                "containers": [{"name": "sidecar", "image": "envoy"}]
            }}),
        );
        assert_eq!(names(&out["spec"]["containers"]), ["app", "log", "sidecar"]);
    }

    #[test]
    fn patch_delete_removes_a_container() {
        let out = patched(
            "Pod",
            pod(),
            json!({"spec": {"containers": [{"$patch": "delete", "name": "log"}]}}),
        );
        assert_eq!(names(&out["spec"]["containers"]), ["app"]);
        assert_eq!(out["spec"]["containers"][0], pod()["spec"]["containers"][0]);
    }

    #[test]
    fn patch_replace_in_a_list_replaces_the_list() {
        let out = patched(
            "Pod",
            pod(),
            json!({"spec": {"containers": [{"name": "only", "image": "x"}, {"$patch": "replace"}]}}),
        );
        assert_eq!(
            out["spec"]["containers"],
            json!([{"name": "only", "image": "x"}])
        );
    }

    #[test]
    fn patch_replace_on_a_map_replaces_the_map() {
        let out = patched(
            "Pod",
            pod(),
            json!({"metadata": {"labels": {"$patch": "replace", "fresh": "yes", "dropped": null}}}),
        );
        assert_eq!(out["metadata"]["labels"], json!({"fresh": "yes"}));
    }

    #[test]
    fn patch_delete_on_a_map_deletes_it() {
        let out = patched(
            "Deployment",
            deployment(),
            json!({"spec": {"strategy": {"$patch": "delete"}}}),
        );
        assert!(out["spec"].get("strategy").is_none());
        assert_eq!(out["spec"]["replicas"], 2);
    }

    #[test]
    fn patch_replace_on_the_root_replaces_the_object() {
        let out = patched(
            "ConfigMap",
            json!({"metadata": {"name": "a"}, "data": {"x": "1"}}),
            json!({"$patch": "replace", "metadata": {"name": "a"}, "data": {"y": "2"}}),
        );
        assert_eq!(out, json!({"metadata": {"name": "a"}, "data": {"y": "2"}}));
    }

    #[test]
    fn env_merges_by_name_inside_a_deployment_template() {
        let out = patched(
            "Deployment",
            deployment(),
            json!({"spec": {"template": {"spec": {"containers": [
                {"name": "app", "env": [{"name": "B", "value": "two"}, {"name": "C", "value": "3"}]}
            ]}}}}),
        );
        let container = &out["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(container["image"], "nginx:1.21");
        assert_eq!(container["resources"], json!({"limits": {"cpu": "1"}}));
        // A and B keep their places; C is new and goes after the patch's B.
        assert_eq!(
            container["env"],
            json!([{"name": "A", "value": "1"}, {"name": "B", "value": "two"}, {"name": "C", "value": "3"}])
        );
    }

    #[test]
    fn env_merge_in_daemonset_and_statefulset_templates_too() {
        for kind in ["ReplicaSet", "DaemonSet", "StatefulSet"] {
            let out = patched(
                kind,
                deployment(),
                json!({"spec": {"template": {"spec": {"containers": [{"name": "app", "env": [{"name": "A", "value": "x"}]}]}}}}),
            );
            let container = &out["spec"]["template"]["spec"]["containers"][0];
            assert_eq!(container["image"], "nginx:1.21", "{kind}");
            assert_eq!(
                container["env"],
                json!([{"name": "A", "value": "x"}, {"name": "B", "value": "2"}]),
                "{kind}"
            );
        }
    }

    #[test]
    fn service_ports_merge_by_port() {
        let service = json!({
            "metadata": {"name": "s"},
            "spec": {"type": "ClusterIP", "ports": [
                {"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"},
                {"name": "https", "port": 443, "targetPort": 8443, "protocol": "TCP"}
            ]}
        });
        let out = patched(
            "Service",
            service,
            json!({"spec": {"ports": [{"port": 443, "targetPort": 9443}]}}),
        );
        assert_eq!(
            out["spec"]["ports"],
            json!([
                {"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"},
                {"name": "https", "port": 443, "targetPort": 9443, "protocol": "TCP"}
            ])
        );
    }

    #[test]
    fn merge_keys_compare_numbers_by_value() {
        let out = patched(
            "Pod",
            pod(),
            json!({"spec": {"containers": [{"name": "app", "ports": [{"containerPort": 80.0, "name": "http"}]}]}}),
        );
        // One port, merged: the stored protocol is kept, the patch adds the name.
        let ports = &out["spec"]["containers"][0]["ports"];
        assert_eq!(ports.as_array().map(Vec::len), Some(1));
        assert_eq!(ports[0]["protocol"], "TCP");
        assert_eq!(ports[0]["name"], "http");
    }

    #[test]
    fn finalizers_union_and_delete_from_primitive_list() {
        let original = json!({"metadata": {"name": "cm", "finalizers": ["a", "b"]}, "data": {}});
        let out = patched(
            "ConfigMap",
            original.clone(),
            json!({"metadata": {"finalizers": ["b", "c"]}}),
        );
        let finalizers = out["metadata"]["finalizers"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert_eq!(finalizers.len(), 3);
        for f in ["a", "b", "c"] {
            assert!(finalizers.contains(&json!(f)));
        }

        let out = patched(
            "ConfigMap",
            original.clone(),
            json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}}),
        );
        assert_eq!(out["metadata"]["finalizers"], json!(["b"]));

        // What kubectl apply sends when a manifest swaps finalizer a for c.
        let out = patched(
            "ConfigMap",
            original,
            json!({"metadata": {
                "$setElementOrder/finalizers": ["b", "c"],
                "finalizers": ["c"],
                "$deleteFromPrimitiveList/finalizers": ["a"]
            }}),
        );
        assert_eq!(out["metadata"]["finalizers"], json!(["b", "c"]));
    }

    #[test]
    fn empty_list_does_not_clear_a_merge_list() {
        let original = json!({"metadata": {"name": "cm", "finalizers": ["a"]}});
        let out = patched(
            "ConfigMap",
            original,
            json!({"metadata": {"finalizers": []}}),
        );
        assert_eq!(out["metadata"]["finalizers"], json!(["a"]));
    }

    #[test]
    fn set_element_order_with_a_deleted_list() {
        let out = patched(
            "Pod",
            pod(),
            json!({"spec": {"$setElementOrder/tolerations": [], "tolerations": null}}),
        );
        assert!(out["spec"].get("tolerations").is_none());
    }

    #[test]
    fn set_element_order_reorders() {
        let out = patched(
            "Pod",
            pod(),
            json!({"spec": {"$setElementOrder/containers": [{"name": "log"}, {"name": "app"}]}}),
        );
        assert_eq!(names(&out["spec"]["containers"]), ["log", "app"]);
        // Contents untouched.
        assert_eq!(out["spec"]["containers"][1], pod()["spec"]["containers"][0]);

        let out = patched(
            "Pod",
            pod(),
            json!({"spec": {"containers": [{"name": "app", "$setElementOrder/env": [{"name": "B"}, {"name": "A"}]}]}}),
        );
        assert_eq!(
            out["spec"]["containers"][0]["env"],
            json!([{"name": "B", "value": "2"}, {"name": "A", "value": "1"}])
        );
    }

    #[test]
    fn set_element_order_keeps_server_only_items_in_place() {
        // An injected container the manifest does not know about keeps its position.
        let mut original = pod();
        original["spec"]["containers"] = json!([
            {"name": "injected", "image": "proxy"},
            {"name": "app", "image": "nginx:1.21"}
        ]);
        let out = patched(
            "Pod",
            original.clone(),
            json!({"spec": {"$setElementOrder/containers": [{"name": "app"}], "containers": [{"name": "app", "image": "nginx:1.22"}]}}),
        );
        assert_eq!(names(&out["spec"]["containers"]), ["injected", "app"]);

        original["spec"]["containers"] = json!([
            {"name": "app", "image": "nginx:1.21"},
            {"name": "injected", "image": "proxy"}
        ]);
        let out = patched(
            "Pod",
            original,
            json!({"spec": {"$setElementOrder/containers": [{"name": "app"}], "containers": [{"name": "app", "image": "nginx:1.22"}]}}),
        );
        assert_eq!(names(&out["spec"]["containers"]), ["app", "injected"]);
        assert_eq!(out["spec"]["containers"][0]["image"], "nginx:1.22");
    }

    #[test]
    fn set_element_order_must_agree_with_the_patch_list() {
        let err = apply(
            "Pod",
            &pod(),
            &json!({"spec": {
                "$setElementOrder/containers": [{"name": "app"}, {"name": "log"}],
                "containers": [{"name": "log", "image": "x"}, {"name": "app", "image": "y"}]
            }}),
        );
        assert!(
            matches!(err, Err(SmpError::InvalidDirective { ref directive, .. }) if directive == "$setElementOrder/containers")
        );

        let err = apply(
            "Pod",
            &pod(),
            &json!({"spec": {"$setElementOrder/containers": [{"image": "app"}]}}),
        );
        assert!(matches!(
            err,
            Err(SmpError::MissingMergeKey { key: "name", .. })
        ));
    }

    #[test]
    fn retain_keys_switches_a_volume_source() {
        let out = patched(
            "Pod",
            pod(),
            json!({"spec": {"volumes": [
                {"name": "data", "configMap": {"name": "settings"}, "$retainKeys": ["configMap", "name"]}
            ]}}),
        );
        assert_eq!(
            out["spec"]["volumes"],
            json!([{"name": "data", "configMap": {"name": "settings"}}])
        );

        // Without the directive both sources would remain.
        let out = patched(
            "Pod",
            pod(),
            json!({"spec": {"volumes": [{"name": "data", "configMap": {"name": "settings"}}]}}),
        );
        assert_eq!(
            out["spec"]["volumes"],
            json!([{"name": "data", "emptyDir": {}, "configMap": {"name": "settings"}}])
        );
    }

    #[test]
    fn retain_keys_on_deployment_strategy() {
        let out = patched(
            "Deployment",
            deployment(),
            json!({"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate", "rollingUpdate": null}}}),
        );
        assert_eq!(out["spec"]["strategy"], json!({"type": "Recreate"}));
    }

    #[test]
    fn retain_keys_rejects_fields_outside_the_list() {
        let err = apply(
            "Deployment",
            &deployment(),
            &json!({"spec": {"strategy": {"$retainKeys": ["type"], "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}}}}),
        );
        match err {
            Err(e @ SmpError::InvalidDirective { .. }) => {
                let message = e.to_string();
                assert!(message.contains("$retainKeys"), "{message}");
                assert!(message.contains("rollingUpdate"), "{message}");
                assert!(message.contains(".spec.strategy"), "{message}");
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn tolerations_are_replaced_atomically() {
        let out = patched(
            "Pod",
            pod(),
            json!({"spec": {"tolerations": [{"key": "c", "operator": "Exists"}]}}),
        );
        assert_eq!(
            out["spec"]["tolerations"],
            json!([{"key": "c", "operator": "Exists"}])
        );
    }

    #[test]
    fn container_statuses_are_atomic_and_conditions_merge_by_type() {
        let mut original = pod();
        original["status"] = json!({
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "False"}, {"type": "Initialized", "status": "True"}],
            "containerStatuses": [{"name": "app", "ready": false}, {"name": "log", "ready": true}],
            "podIPs": [{"ip": "10.0.0.1"}]
        });
        let out = patched(
            "Pod",
            original,
            json!({"status": {
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": "app", "ready": true}],
                "podIPs": [{"ip": "fd00::1"}]
            }}),
        );
        let conditions = out["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert_eq!(conditions.len(), 2);
        assert!(conditions.contains(&json!({"type": "Ready", "status": "True"})));
        assert!(conditions.contains(&json!({"type": "Initialized", "status": "True"})));
        assert_eq!(
            out["status"]["containerStatuses"],
            json!([{"name": "app", "ready": true}])
        );
        assert_eq!(out["status"]["podIPs"].as_array().map(Vec::len), Some(2));
        assert_eq!(out["status"]["phase"], "Running");
    }

    #[test]
    fn node_pod_cidrs_addresses_and_conditions() {
        let node = json!({
            "metadata": {"name": "n1"},
            "spec": {"podCIDRs": ["10.244.0.0/24"]},
            "status": {
                "addresses": [{"type": "InternalIP", "address": "192.168.1.2"}, {"type": "Hostname", "address": "n1"}],
                "conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady"}]
            }
        });
        let out = patched(
            "Node",
            node,
            json!({
                "spec": {"podCIDRs": ["fd00:10:244::/64"]},
                "status": {
                    "addresses": [{"type": "InternalIP", "address": "192.168.1.3"}],
                    "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]
                }
            }),
        );
        let cidrs = out["spec"]["podCIDRs"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert_eq!(cidrs.len(), 2);
        assert_eq!(out["status"]["addresses"].as_array().map(Vec::len), Some(2));
        assert!(out["status"]["addresses"]
            .as_array()
            .is_some_and(|a| a.contains(&json!({"type": "InternalIP", "address": "192.168.1.3"}))));
        assert_eq!(
            out["status"]["conditions"],
            json!([{"type": "Ready", "status": "True", "reason": "KubeletReady"}])
        );
    }

    #[test]
    fn owner_references_merge_by_uid() {
        let original = json!({"metadata": {"name": "rs", "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": "u1", "controller": true}
        ]}});
        let out = patched(
            "ReplicaSet",
            original.clone(),
            json!({"metadata": {"ownerReferences": [{"uid": "u1", "blockOwnerDeletion": true}]}}),
        );
        assert_eq!(
            out["metadata"]["ownerReferences"],
            json!([{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": "u1", "controller": true, "blockOwnerDeletion": true}])
        );
        let out = patched(
            "ReplicaSet",
            original,
            json!({"metadata": {"ownerReferences": [{"$patch": "delete", "uid": "u1"}]}}),
        );
        assert_eq!(out["metadata"]["ownerReferences"], json!([]));
    }

    #[test]
    fn unknown_directives_are_rejected() {
        let err = apply("Pod", &pod(), &json!({"spec": {"$frobnicate": true}}));
        match err {
            Err(e @ SmpError::UnknownDirective { .. }) => {
                assert_eq!(
                    e.to_string(),
                    "unknown patch directive `$frobnicate` at .spec"
                );
            }
            other => panic!("unexpected {other:?}"),
        }
        let err = apply(
            "Pod",
            &pod(),
            &json!({"metadata": {"labels": {"$patch": "merge"}}}),
        );
        assert!(
            matches!(err, Err(SmpError::UnknownDirective { ref directive, .. }) if directive == "$patch: merge")
        );
        let err = apply(
            "Pod",
            &pod(),
            &json!({"spec": {"containers": [{"$patch": "explode", "name": "app"}]}}),
        );
        assert!(matches!(err, Err(SmpError::UnknownDirective { .. })));
        let err = apply(
            "Pod",
            &pod(),
            &json!({"spec": {"containers": [{"$patch": "merge"}]}}),
        );
        assert!(matches!(err, Err(SmpError::InvalidDirective { .. })));
        let err = apply("Pod", &pod(), &json!({"metadata": {"$patch": 3}}));
        assert!(matches!(err, Err(SmpError::InvalidDirective { .. })));
    }

    #[test]
    fn malformed_patches_are_rejected() {
        let err = apply(
            "Pod",
            &pod(),
            &json!({"spec": {"containers": [{"image": "x"}]}}),
        );
        match err {
            Err(e @ SmpError::MissingMergeKey { .. }) => {
                assert_eq!(
                    e.to_string(),
                    "element 0 of the list at .spec.containers has no merge key `name`"
                );
            }
            other => panic!("unexpected {other:?}"),
        }
        let err = apply("Pod", &pod(), &json!({"spec": {"containers": ["app"]}}));
        assert!(matches!(err, Err(SmpError::InvalidValue { .. })));
        let err = apply(
            "Pod",
            &pod(),
            &json!({"metadata": {"finalizers": [{"a": 1}]}}),
        );
        assert!(matches!(err, Err(SmpError::InvalidValue { .. })));
        let err = apply("Pod", &pod(), &json!({"$patch": "delete"}));
        assert!(matches!(err, Err(SmpError::InvalidDirective { .. })));
        let err = apply("Pod", &pod(), &json!(["not", "an", "object"]));
        assert_eq!(err, Err(SmpError::NotAnObject { what: "patch" }));
        let err = apply("Pod", &json!(null), &json!({}));
        assert!(matches!(err, Err(SmpError::NotAnObject { .. })));
        let err = apply(
            "Pod",
            &pod(),
            &json!({"metadata": {"$deleteFromPrimitiveList/finalizers": "a"}}),
        );
        assert!(matches!(err, Err(SmpError::InvalidDirective { .. })));
        let err = apply(
            "Pod",
            &pod(),
            &json!({"spec": {"$setElementOrder/containers": "app"}}),
        );
        assert!(matches!(err, Err(SmpError::InvalidDirective { .. })));
    }

    #[test]
    fn kubectl_apply_patch_for_a_deployment() {
        let out = patched(
            "Deployment",
            deployment(),
            json!({
                "metadata": {"annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{\"kind\":\"Deployment\"}\n"}},
                "spec": {"template": {"spec": {
                    "$setElementOrder/containers": [{"name": "app"}],
                    "containers": [{"image": "nginx:1.22", "name": "app"}]
                }}}
            }),
        );
        assert_eq!(
            out["metadata"]["annotations"],
            json!({"keep": "me", "kubectl.kubernetes.io/last-applied-configuration": "{\"kind\":\"Deployment\"}\n"})
        );
        let mut expected = deployment();
        expected["metadata"] = out["metadata"].clone();
        expected["spec"]["template"]["spec"]["containers"][0]["image"] = json!("nginx:1.22");
        assert_eq!(out, expected);
    }

    #[test]
    fn kubectl_apply_patch_removing_env_and_adding_a_container() {
        let out = patched(
            "Deployment",
            deployment(),
            json!({"spec": {
                "replicas": 3,
                "template": {"spec": {
                    "$setElementOrder/containers": [{"name": "app"}, {"name": "sidecar"}],
                    "containers": [
                        {"name": "app", "$setElementOrder/env": [{"name": "B"}],
                         "env": [{"$patch": "delete", "name": "A"}], "resources": null},
                        {"name": "sidecar", "image": "envoy"}
                    ]
                }}
            }}),
        );
        assert_eq!(out["spec"]["replicas"], 3);
        let containers = &out["spec"]["template"]["spec"]["containers"];
        assert_eq!(names(containers), ["app", "sidecar"]);
        assert_eq!(
            containers[0],
            json!({"name": "app", "image": "nginx:1.21", "env": [{"name": "B", "value": "2"}]})
        );
    }

    #[test]
    fn kubectl_label_annotate_scale_and_set_image() {
        let out = patched(
            "Deployment",
            deployment(),
            json!({"metadata": {"labels": {"team": "a"}, "annotations": {"keep": null, "note": "x"}}}),
        );
        assert_eq!(out["metadata"]["labels"], json!({"team": "a"}));
        assert_eq!(out["metadata"]["annotations"], json!({"note": "x"}));

        let out = patched("Deployment", deployment(), json!({"spec": {"replicas": 5}}));
        assert_eq!(out["spec"]["replicas"], 5);

        let scale = json!({"kind": "Scale", "metadata": {"name": "web"}, "spec": {"replicas": 2}, "status": {"replicas": 2}});
        let out = patched("Scale", scale, json!({"spec": {"replicas": 0}}));
        assert_eq!(out["spec"], json!({"replicas": 0}));

        let out = patched(
            "Deployment",
            deployment(),
            json!({"spec": {"template": {"spec": {"containers": [{"name": "app", "image": "nginx:1.23"}]}}}}),
        );
        assert_eq!(
            out["spec"]["template"]["spec"]["containers"][0]["image"],
            "nginx:1.23"
        );
        assert_eq!(
            out["spec"]["template"]["spec"]["containers"][0]["env"],
            deployment()["spec"]["template"]["spec"]["containers"][0]["env"]
        );
    }

    #[test]
    fn kinds_not_in_the_table_merge_plainly() {
        let original = json!({
            "apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": "w", "labels": {"a": "1"}},
            "spec": {"items": [{"name": "x", "size": 1}, {"name": "y", "size": 2}], "nested": {"p": 1, "q": 2}}
        });
        let out = patched(
            "Widget",
            original,
            json!({"metadata": {"labels": {"b": "2"}}, "spec": {"items": [{"name": "x", "size": 5}], "nested": {"q": null, "r": 3}}}),
        );
        assert_eq!(out["metadata"]["labels"], json!({"a": "1", "b": "2"}));
        assert_eq!(out["spec"]["items"], json!([{"name": "x", "size": 5}]));
        assert_eq!(out["spec"]["nested"], json!({"p": 1, "r": 3}));
    }

    #[test]
    fn schema_keywords_are_fields_not_directives() {
        let original = json!({"spec": {"schema": {"$ref": "#/a"}}});
        let out = patched(
            "CustomResourceDefinition",
            original,
            json!({"spec": {"schema": {"$ref": "#/b", "$schema": "x"}}}),
        );
        assert_eq!(
            out["spec"]["schema"],
            json!({"$ref": "#/b", "$schema": "x"})
        );
    }

    #[test]
    fn new_fields_are_cleaned_of_directives() {
        let mut original = pod();
        if let Some(spec) = original["spec"].as_object_mut() {
            spec.remove("volumes");
        }
        let out = patched(
            "Pod",
            original,
            json!({"spec": {
                "$setElementOrder/volumes": [{"name": "b"}, {"name": "a"}],
                "volumes": [
                    {"name": "b", "secret": {"secretName": "s", "optional": null}},
                    {"name": "a", "emptyDir": {}},
                    {"$patch": "delete", "name": "zzz"}
                ]
            }}),
        );
        assert_eq!(
            out["spec"]["volumes"],
            json!([{"name": "b", "secret": {"secretName": "s"}}, {"name": "a", "emptyDir": {}}])
        );

        // $retainKeys is checked on new elements too.
        let err = apply(
            "Pod",
            &pod(),
            &json!({"spec": {"volumes": [{"name": "x", "$retainKeys": ["name"], "emptyDir": {}}]}}),
        );
        assert!(matches!(err, Err(SmpError::InvalidDirective { .. })));
    }
}
