//! Field ownership (`metadata.managedFields`) and server-side apply, as upstream's
//! structured-merge-diff does them for the cases ferro's clients meet.
//!
//! A [`Set`] is a tree of owned fields in upstream's FieldsV1 encoding: `f:<name>` for a field,
//! `k:{"name":"c"}` for an element of a list keyed by its merge key, `v:<json>` for a value of a
//! set-like list, `.` for the node itself (a keyed element, a map). Leaves are owned values; a
//! struct (spec, metadata) is never owned itself, only its fields.
//!
//! - Every write that is not an apply gives its field manager (`fieldManager`, else the client's
//!   User-Agent program name) the fields it changed, with operation `Update`, and takes them from
//!   every other manager.
//! - An apply (`application/apply-patch+yaml`) owns exactly the fields of its configuration
//!   (operation `Apply`); a field it would change that another manager owns is a conflict (409
//!   naming the managers and fields) unless `force=true`, which takes the field over; fields
//!   the same manager applied before and no longer applies are removed from the object unless
//!   another manager owns them too.
//!
//! Shapes of lists come from the strategic-merge metadata of built-in kinds (crate::smp) and
//! from the schemas of custom kinds (x-kubernetes-list-type / list-map-keys).

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use crate::crd::schema::Schema;
use crate::smp::{ListStrategy, SchemaType};

/// Who is writing: the request's field manager and whether an apply forces conflicts. Set per
/// request by the server; writes outside a request (the API server's own: bootstrap objects,
/// the CRD loop) are `ferro-control-plane`'s.
#[derive(Debug, Clone)]
pub struct Writer {
    pub manager: String,
    pub force: bool,
}

tokio::task_local! {
    pub static WRITER: Writer;
}

/// The current request's writer.
pub fn writer() -> Writer {
    WRITER.try_with(Clone::clone).unwrap_or_else(|_| Writer { manager: "ferro-control-plane".into(), force: false })
}

/// The shape of a resource's objects.
pub fn shape_of(res: &crate::resources::Resource) -> Shape<'static> {
    match res.custom {
        Some(c) => Shape::Custom(&c.schema),
        None => Shape::Builtin(crate::smp::schema_for_kind(res.kind)),
    }
}

/// A tree of owned fields.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Set {
    /// The node itself is owned (`.`).
    pub here: bool,
    pub children: BTreeMap<String, Set>,
}

impl Set {
    pub fn is_empty(&self) -> bool {
        !self.here && self.children.is_empty()
    }

    /// From FieldsV1 JSON.
    pub fn from_fields_v1(v: &Value) -> Set {
        let mut s = Set::default();
        if let Some(m) = v.as_object() {
            for (k, c) in m {
                if k == "." {
                    s.here = true;
                } else {
                    let child = Set::from_fields_v1(c);
                    // `"f:x": {}` is a leaf: owned itself
                    let child = if child.is_empty() { Set { here: true, children: BTreeMap::new() } } else { child };
                    s.children.insert(k.clone(), child);
                }
            }
        }
        s
    }

    /// To FieldsV1 JSON.
    pub fn to_fields_v1(&self) -> Value {
        let mut m = Map::new();
        if self.here && !self.children.is_empty() {
            m.insert(".".into(), json!({}));
        }
        for (k, c) in &self.children {
            m.insert(k.clone(), c.to_fields_v1());
        }
        Value::Object(m)
    }

    pub fn union(&mut self, other: &Set) {
        self.here |= other.here;
        for (k, c) in &other.children {
            self.children.entry(k.clone()).or_default().union(c);
        }
    }

    pub fn subtract(&mut self, other: &Set) {
        if other.here {
            self.here = false;
        }
        for (k, c) in &other.children {
            if let Some(mine) = self.children.get_mut(k) {
                mine.subtract(c);
                if mine.is_empty() {
                    self.children.remove(k);
                }
            }
        }
    }

    pub fn intersect(&self, other: &Set) -> Set {
        let mut out = Set { here: self.here && other.here, children: BTreeMap::new() };
        for (k, c) in &self.children {
            if let Some(o) = other.children.get(k) {
                let i = c.intersect(o);
                if !i.is_empty() {
                    out.children.insert(k.clone(), i);
                }
            }
        }
        out
    }

    /// Every owned node, as a path of path elements.
    pub fn leaves(&self) -> Vec<Vec<String>> {
        let mut out = Vec::new();
        self.walk(&mut Vec::new(), &mut out);
        out
    }

    fn walk(&self, at: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
        if self.here {
            out.push(at.clone());
        }
        for (k, c) in &self.children {
            at.push(k.clone());
            c.walk(at, out);
            at.pop();
        }
    }

    /// Whether the node at `path` is owned.
    pub fn contains(&self, path: &[&str]) -> bool {
        match path.split_first() {
            None => self.here,
            Some((first, rest)) => self.children.get(*first).is_some_and(|c| c.contains(rest)),
        }
    }
}

/// How to walk an object: built-in kinds by their strategic-merge metadata, custom kinds by
/// their schema.
#[derive(Clone, Copy)]
pub enum Shape<'a> {
    Builtin(Option<SchemaType>),
    Custom(&'a Schema),
    /// Nothing known: maps are structs, lists atomic.
    Plain,
}

/// How a list's elements are identified.
enum ListKind {
    Atomic,
    Keyed(Vec<String>),
    Set,
}

/// Maps (as opposed to structs) among built-in kinds' fields: their own node is owned too
/// (upstream's `.` on `f:labels`).
const MAP_FIELDS: &[&str] = &[
    "labels", "annotations", "data", "binaryData", "stringData", "matchLabels", "nodeSelector", "limits", "requests",
    "capacity", "allocatable", "parameters", "selector", "hard", "used",
];

impl<'a> Shape<'a> {
    fn child(self, field: &str) -> Shape<'a> {
        match self {
            Shape::Builtin(Some(t)) => Shape::Builtin(t.field(field).and_then(|f| f.ty)),
            Shape::Builtin(None) => Shape::Builtin(None),
            Shape::Custom(s) => match s.properties.get(field).or(s.additional.as_deref()) {
                Some(c) => Shape::Custom(c),
                None => Shape::Plain,
            },
            Shape::Plain => Shape::Plain,
        }
    }

    fn list(self, field: &str, parent: Shape<'a>) -> ListKind {
        match parent {
            Shape::Builtin(Some(t)) => match t.field(field).map(|f| f.list) {
                Some(ListStrategy::MergeByKey(k)) => ListKind::Keyed(vec![k.to_string()]),
                Some(ListStrategy::MergePrimitives) => ListKind::Set,
                _ => ListKind::Atomic,
            },
            Shape::Custom(s) => match s.properties.get(field).or(s.additional.as_deref()) {
                Some(c) => match c.list_type.as_deref() {
                    Some("map") => ListKind::Keyed(c.list_map_keys.clone()),
                    Some("set") => ListKind::Set,
                    _ => ListKind::Atomic,
                },
                None => ListKind::Atomic,
            },
            _ => ListKind::Atomic,
        }
    }

    fn items(self) -> Shape<'a> {
        match self {
            Shape::Custom(s) => s.items.as_deref().map(Shape::Custom).unwrap_or(Shape::Plain),
            other => other,
        }
    }

    fn is_map(self, field: &str, parent: Shape<'a>) -> bool {
        match parent {
            Shape::Custom(s) => s.properties.get(field).or(s.additional.as_deref()).is_some_and(|c| c.additional.is_some() || c.additional_any),
            _ => MAP_FIELDS.contains(&field),
        }
    }
}

fn key_element(item: &Value, keys: &[String]) -> Option<String> {
    let mut m = Map::new();
    for k in keys {
        m.insert(k.clone(), item.get(k)?.clone());
    }
    Some(format!("k:{}", Value::Object(m)))
}

/// Fields upstream never tracks (apiVersion, kind, the server's metadata).
const STRIPPED_META: &[&str] = &["name", "namespace", "creationTimestamp", "selfLink", "uid", "generation", "managedFields", "resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds"];

/// The set of fields an object (or an applied configuration) sets.
pub fn fields_of(obj: &Value, shape: Shape<'_>) -> Set {
    let mut s = Set::default();
    if let Some(m) = obj.as_object() {
        for (k, v) in m {
            if k == "apiVersion" || k == "kind" {
                continue;
            }
            if k == "metadata" {
                let mut meta = v.clone();
                if let Some(mm) = meta.as_object_mut() {
                    for f in STRIPPED_META {
                        mm.remove(*f);
                    }
                }
                let child = struct_fields(&meta, shape.child("metadata"));
                if !child.is_empty() {
                    s.children.insert("f:metadata".into(), child);
                }
                continue;
            }
            s.children.insert(format!("f:{k}"), value_fields(k, v, shape));
        }
    }
    s
}

fn struct_fields(obj: &Value, shape: Shape<'_>) -> Set {
    let mut s = Set::default();
    if let Some(m) = obj.as_object() {
        for (k, v) in m {
            s.children.insert(format!("f:{k}"), value_fields(k, v, shape));
        }
    }
    s
}

/// The fields under `field` (of a struct of `parent` shape) holding `v`.
fn value_fields(field: &str, v: &Value, parent: Shape<'_>) -> Set {
    let shape = parent.child(field);
    match v {
        Value::Object(m) if !m.is_empty() => {
            let mut s = struct_fields(v, shape);
            s.here = parent_map(field, parent);
            s
        }
        Value::Array(items) => match shape.list(field, parent) {
            ListKind::Keyed(keys) if !items.is_empty() => {
                let mut s = Set::default();
                for item in items {
                    match key_element(item, &keys) {
                        Some(k) => {
                            let mut e = struct_fields(item, shape.items());
                            e.here = true;
                            s.children.insert(k, e);
                        }
                        // an element without its key: the list is owned as a whole
                        None => return Set { here: true, children: BTreeMap::new() },
                    }
                }
                s
            }
            ListKind::Set if !items.is_empty() => {
                let mut s = Set::default();
                for item in items {
                    s.children.insert(format!("v:{item}"), Set { here: true, children: BTreeMap::new() });
                }
                s
            }
            _ => Set { here: true, children: BTreeMap::new() },
        },
        _ => Set { here: true, children: BTreeMap::new() },
    }
}

fn parent_map(field: &str, parent: Shape<'_>) -> bool {
    parent.is_map(field, parent)
}

/// The value at a path of a Set in an object (None when absent).
pub fn value_at<'v>(obj: &'v Value, path: &[String]) -> Option<&'v Value> {
    let mut cur = obj;
    for pe in path {
        if let Some(f) = pe.strip_prefix("f:") {
            cur = cur.get(f)?;
        } else if let Some(k) = pe.strip_prefix("k:") {
            let key: Map<String, Value> = serde_json::from_str(k).ok()?;
            cur = cur.as_array()?.iter().find(|item| key.iter().all(|(kk, kv)| item.get(kk) == Some(kv)))?;
        } else if let Some(v) = pe.strip_prefix("v:") {
            let want: Value = serde_json::from_str(v).ok()?;
            cur = cur.as_array()?.iter().find(|item| **item == want)?;
        } else {
            return None;
        }
    }
    Some(cur)
}

/// Removes the node at a path from an object (a field, a keyed element, a set value).
pub fn remove_at(obj: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else { return };
    let mut cur = obj;
    for pe in parents {
        let next = if let Some(f) = pe.strip_prefix("f:") {
            cur.get_mut(f)
        } else if let Some(k) = pe.strip_prefix("k:") {
            let Ok(key) = serde_json::from_str::<Map<String, Value>>(k) else { return };
            cur.as_array_mut().and_then(|a| a.iter_mut().find(|item| key.iter().all(|(kk, kv)| item.get(kk) == Some(kv))))
        } else {
            None
        };
        match next {
            Some(n) => cur = n,
            None => return,
        }
    }
    if let Some(f) = last.strip_prefix("f:") {
        if let Some(m) = cur.as_object_mut() {
            m.remove(f);
        }
    } else if let Some(k) = last.strip_prefix("k:") {
        if let (Ok(key), Some(a)) = (serde_json::from_str::<Map<String, Value>>(k), cur.as_array_mut()) {
            a.retain(|item| !key.iter().all(|(kk, kv)| item.get(kk) == Some(kv)));
        }
    } else if let Some(v) = last.strip_prefix("v:") {
        if let (Ok(want), Some(a)) = (serde_json::from_str::<Value>(v), cur.as_array_mut()) {
            a.retain(|item| *item != want);
        }
    }
}

/// The owned nodes whose values differ between two objects (added, removed or changed): one
/// walk over both trees, equal subtrees skipped at once.
pub fn changed(old: &Value, new: &Value, shape: Shape<'_>) -> Set {
    if old == new {
        return Set::default();
    }
    let strip = |v: &Value| -> Value {
        let mut v = v.clone();
        if let Some(m) = v.as_object_mut() {
            m.remove("apiVersion");
            m.remove("kind");
            if let Some(meta) = m.get_mut("metadata").and_then(Value::as_object_mut) {
                for f in STRIPPED_META {
                    meta.remove(*f);
                }
            }
        }
        v
    };
    let (old, new) = (strip(old), strip(new));
    let mut out = struct_diff(&old, &new, shape);
    // an emptied metadata is not a field of its own
    if out.children.get("f:metadata").is_some_and(|m| m.children.is_empty()) {
        out.children.remove("f:metadata");
    }
    out
}

fn struct_diff(old: &Value, new: &Value, shape: Shape<'_>) -> Set {
    let mut out = Set::default();
    let empty = Map::new();
    let (o, n) = (old.as_object().unwrap_or(&empty), new.as_object().unwrap_or(&empty));
    for (k, nv) in n {
        let d = field_diff(k, o.get(k), Some(nv), shape);
        if !d.is_empty() {
            out.children.insert(format!("f:{k}"), d);
        }
    }
    for (k, ov) in o {
        if !n.contains_key(k) {
            let d = field_diff(k, Some(ov), None, shape);
            if !d.is_empty() {
                out.children.insert(format!("f:{k}"), d);
            }
        }
    }
    out
}

/// The changed nodes under `field` of a struct of `parent` shape.
fn field_diff(field: &str, old: Option<&Value>, new: Option<&Value>, parent: Shape<'_>) -> Set {
    match (old, new) {
        (Some(o), Some(n)) if o == n => Set::default(),
        (None, Some(v)) | (Some(v), None) => value_fields(field, v, parent),
        (None, None) => Set::default(),
        (Some(o), Some(n)) => {
            let shape = parent.child(field);
            match (o, n) {
                (Value::Object(om), Value::Object(nm)) if !om.is_empty() && !nm.is_empty() => struct_diff(o, n, shape),
                (Value::Object(_), Value::Object(_)) => {
                    // one side empty: everything the other side has changed
                    let mut s = value_fields(field, o, parent);
                    s.union(&value_fields(field, n, parent));
                    s
                }
                (Value::Array(oa), Value::Array(na)) => match shape.list(field, parent) {
                    ListKind::Keyed(keys) if !oa.is_empty() && !na.is_empty() => {
                        let keyed = |a: &Vec<Value>| -> Option<Vec<(String, Value)>> { a.iter().map(|i| key_element(i, &keys).map(|k| (k, i.clone()))).collect() };
                        match (keyed(oa), keyed(na)) {
                            (Some(ok), Some(nk)) => {
                                let mut s = Set::default();
                                for (k, ni) in &nk {
                                    match ok.iter().find(|(x, _)| x == k) {
                                        Some((_, oi)) => {
                                            let d = struct_diff(oi, ni, shape.items());
                                            if !d.is_empty() {
                                                s.children.insert(k.clone(), d);
                                            }
                                        }
                                        None => {
                                            let mut e = struct_fields(ni, shape.items());
                                            e.here = true;
                                            s.children.insert(k.clone(), e);
                                        }
                                    }
                                }
                                for (k, oi) in &ok {
                                    if !nk.iter().any(|(x, _)| x == k) {
                                        let mut e = struct_fields(oi, shape.items());
                                        e.here = true;
                                        s.children.insert(k.clone(), e);
                                    }
                                }
                                s
                            }
                            _ => Set { here: true, children: BTreeMap::new() },
                        }
                    }
                    ListKind::Set if !oa.is_empty() && !na.is_empty() => {
                        let mut s = Set::default();
                        for v in na.iter().filter(|v| !oa.contains(v)).chain(oa.iter().filter(|v| !na.contains(v))) {
                            s.children.insert(format!("v:{v}"), Set { here: true, children: BTreeMap::new() });
                        }
                        s
                    }
                    _ => Set { here: true, children: BTreeMap::new() },
                },
                _ => Set { here: true, children: BTreeMap::new() },
            }
        }
    }
}

/// A managedFields entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub manager: String,
    pub operation: String,
    pub api_version: String,
    pub time: String,
    pub subresource: String,
    pub fields: Set,
}

pub fn entries_of(obj: &Value) -> Vec<Entry> {
    obj.pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|e| Entry {
            manager: e.get("manager").and_then(Value::as_str).unwrap_or("").to_string(),
            operation: e.get("operation").and_then(Value::as_str).unwrap_or("").to_string(),
            api_version: e.get("apiVersion").and_then(Value::as_str).unwrap_or("").to_string(),
            time: e.get("time").and_then(Value::as_str).unwrap_or("").to_string(),
            subresource: e.get("subresource").and_then(Value::as_str).unwrap_or("").to_string(),
            fields: Set::from_fields_v1(e.get("fieldsV1").unwrap_or(&Value::Null)),
        })
        .collect()
}

pub fn entries_to_json(entries: &[Entry]) -> Value {
    Value::Array(
        entries
            .iter()
            .filter(|e| !e.fields.is_empty())
            .map(|e| {
                let mut m = Map::new();
                m.insert("manager".into(), json!(e.manager));
                m.insert("operation".into(), json!(e.operation));
                m.insert("apiVersion".into(), json!(e.api_version));
                m.insert("time".into(), json!(e.time));
                m.insert("fieldsType".into(), json!("FieldsV1"));
                m.insert("fieldsV1".into(), e.fields.to_fields_v1());
                if !e.subresource.is_empty() {
                    m.insert("subresource".into(), json!(e.subresource));
                }
                Value::Object(m)
            })
            .collect(),
    )
}

/// Records a non-apply write: `manager` owns what it changed, nobody else does any more.
#[allow(clippy::too_many_arguments)] // the write's facts, as its callers have them at hand
pub fn record_update(entries: &mut Vec<Entry>, old: &Value, new: &Value, shape: Shape<'_>, manager: &str, api_version: &str, subresource: &str, now: &str) {
    let creating = old.as_object().is_none_or(|m| m.is_empty());
    let changed = if creating { fields_of(new, shape) } else { changed(old, new, shape) };
    if changed.is_empty() {
        return;
    }
    for e in entries.iter_mut() {
        e.fields.subtract(&changed);
    }
    // what is gone from the object is owned by nobody
    let owned = if creating { changed } else { changed.intersect(&fields_of(new, shape)) };
    match entries.iter_mut().find(|e| e.manager == manager && e.operation == "Update" && e.subresource == subresource) {
        Some(e) => {
            e.fields.union(&owned);
            e.time = now.to_string();
            e.api_version = api_version.to_string();
        }
        None if !owned.is_empty() => entries.push(Entry {
            manager: manager.to_string(),
            operation: "Update".into(),
            api_version: api_version.to_string(),
            time: now.to_string(),
            subresource: subresource.to_string(),
            fields: owned,
        }),
        None => {}
    }
    entries.retain(|e| !e.fields.is_empty());
}

/// One field another manager owns that an apply would change.
#[derive(Debug, Clone, PartialEq)]
pub struct Conflict {
    pub manager: String,
    pub api_version: String,
    /// Upstream's path notation: `.spec.replicas`, `.spec.containers[name="c"].image`.
    pub field: String,
}

/// Upstream's rendering of a path (`.spec.containers[name="c"].image`).
pub fn path_string(path: &[String]) -> String {
    let mut s = String::new();
    for pe in path {
        if let Some(f) = pe.strip_prefix("f:") {
            s.push('.');
            s.push_str(f);
        } else if let Some(k) = pe.strip_prefix("k:") {
            let key: Map<String, Value> = serde_json::from_str(k).unwrap_or_default();
            let parts: Vec<String> = key.iter().map(|(k, v)| format!("{k}={v}")).collect();
            s.push_str(&format!("[{}]", parts.join(",")));
        } else if let Some(v) = pe.strip_prefix("v:") {
            s.push_str(&format!("[={v}]"));
        }
    }
    s
}

/// The plan of an apply: conflicts (when not forced), or the managers' sets after it and the
/// fields to remove from the merged object.
pub struct ApplyPlan {
    pub conflicts: Vec<Conflict>,
    pub remove: Vec<Vec<String>>,
}

/// Plans an apply of `applied` by `manager` on `live` (`merged` = live with the configuration
/// merged in); updates `entries` unless there are conflicts and `force` is false.
#[allow(clippy::too_many_arguments)]
pub fn plan_apply(entries: &mut Vec<Entry>, live: &Value, applied: &Value, merged: &Value, shape: Shape<'_>, manager: &str, api_version: &str, subresource: &str, force: bool, now: &str) -> ApplyPlan {
    let applied_set = fields_of(applied, shape);
    // the fields the apply changes in the live object
    let changes = changed(live, merged, shape).intersect(&applied_set);
    let mut conflicts = Vec::new();
    for e in entries.iter().filter(|e| !(e.manager == manager && e.operation == "Apply" && e.subresource == subresource)) {
        for p in e.fields.intersect(&changes).leaves() {
            conflicts.push(Conflict { manager: e.manager.clone(), api_version: e.api_version.clone(), field: path_string(&p) });
        }
    }
    if !conflicts.is_empty() && !force {
        return ApplyPlan { conflicts, remove: Vec::new() };
    }
    // previously applied by this manager and no longer: removed unless someone else owns them
    let previous = entries
        .iter()
        .find(|e| e.manager == manager && e.operation == "Apply" && e.subresource == subresource)
        .map(|e| e.fields.clone())
        .unwrap_or_default();
    let mut dropped = previous;
    dropped.subtract(&applied_set);
    let mut others = Set::default();
    for e in entries.iter().filter(|e| !(e.manager == manager && e.operation == "Apply" && e.subresource == subresource)) {
        others.union(&e.fields);
    }
    let mut remove_set = dropped;
    remove_set.subtract(&others);
    // the changed fields are taken from the other managers (forced, or owned by nobody else)
    for e in entries.iter_mut() {
        e.fields.subtract(&changes);
    }
    match entries.iter_mut().find(|e| e.manager == manager && e.operation == "Apply" && e.subresource == subresource) {
        Some(e) => {
            e.fields = applied_set;
            e.time = now.to_string();
            e.api_version = api_version.to_string();
        }
        None => entries.push(Entry {
            manager: manager.to_string(),
            operation: "Apply".into(),
            api_version: api_version.to_string(),
            time: now.to_string(),
            subresource: subresource.to_string(),
            fields: applied_set,
        }),
    }
    entries.retain(|e| !e.fields.is_empty());
    let mut remove = remove_set.leaves();
    // deepest first, so removing an element does not disturb the paths of its fields
    remove.sort_by_key(|p| std::cmp::Reverse(p.len()));
    ApplyPlan { conflicts, remove }
}

/// Upstream's message for conflicts.
pub fn conflict_message(conflicts: &[Conflict]) -> String {
    let n = conflicts.len();
    let list: Vec<String> = conflicts.iter().map(|c| format!("conflict with \"{}\" using {}: {}", c.manager, c.api_version, c.field)).collect();
    if n == 1 {
        format!("Apply failed with 1 conflict: {}", list[0])
    } else {
        format!("Apply failed with {n} conflicts: {}", list.join("\n"))
    }
}

/// The default field manager of a request without `fieldManager`: upstream takes the program
/// name from the User-Agent (`kubectl/v1.32 (linux/amd64) ...` -> `kubectl`).
pub fn default_manager(user_agent: &str) -> String {
    let prog = user_agent.split('/').next().unwrap_or("").trim();
    if prog.is_empty() {
        "unknown".into()
    } else {
        prog.chars().take(128).collect()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn deploy_shape() -> Shape<'static> {
        Shape::Builtin(crate::smp::schema_for_kind("Deployment"))
    }

    fn deployment(replicas: i64, image: &str) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "labels": {"app": "web"}, "uid": "u", "resourceVersion": "5"},
            "spec": {"replicas": replicas, "template": {"spec": {"containers": [{"name": "c", "image": image}]}}}})
    }

    #[test]
    fn fields_v1_as_upstream_encodes_them() {
        let s = fields_of(&deployment(2, "nginx"), deploy_shape());
        assert_eq!(
            s.to_fields_v1(),
            json!({"f:metadata": {"f:labels": {".": {}, "f:app": {}}},
                   "f:spec": {"f:replicas": {}, "f:template": {"f:spec": {"f:containers": {"k:{\"name\":\"c\"}": {".": {}, "f:image": {}, "f:name": {}}}}}}})
        );
        assert_eq!(Set::from_fields_v1(&s.to_fields_v1()), s);
    }

    #[test]
    fn updates_move_ownership_of_what_they_change() {
        let mut entries = Vec::new();
        record_update(&mut entries, &json!({}), &deployment(2, "nginx"), deploy_shape(), "kubectl-create", "apps/v1", "", "T0");
        record_update(&mut entries, &deployment(2, "nginx"), &deployment(3, "nginx"), deploy_shape(), "kube-controller-manager", "apps/v1", "", "T1");
        assert_eq!(entries.len(), 2);
        assert_eq!((entries[1].manager.as_str(), entries[1].fields.leaves().len()), ("kube-controller-manager", 1));
        assert!(entries[1].fields.contains(&["f:spec", "f:replicas"]));
        assert!(!entries[0].fields.contains(&["f:spec", "f:replicas"]));
        assert!(entries[0].fields.contains(&["f:metadata", "f:labels", "f:app"]));
        // an empty map filled: its fields are the writer's
        let mut entries2 = Vec::new();
        let d0 = json!({"metadata": {"labels": {}}});
        let d1 = json!({"metadata": {"labels": {"a": "x"}}});
        record_update(&mut entries2, &d0, &d1, deploy_shape(), "m", "apps/v1", "", "T");
        assert!(entries2[0].fields.contains(&["f:metadata", "f:labels", "f:a"]), "{entries2:?}");
        // a no-op writes nothing
        let before = entries.clone();
        record_update(&mut entries, &deployment(3, "nginx"), &deployment(3, "nginx"), deploy_shape(), "x", "apps/v1", "", "T2");
        assert_eq!(entries, before);
    }

    #[test]
    fn applies_conflict_with_other_owners_unless_forced_and_drop_what_they_no_longer_apply() {
        let mut entries = Vec::new();
        let live = deployment(2, "nginx");
        // the first apply owns its configuration
        let cfg = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
            "spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "c", "image": "nginx"}]}}}});
        let plan = plan_apply(&mut entries, &json!({}), &cfg, &live, deploy_shape(), "alice", "apps/v1", "", false, "T0");
        assert!(plan.conflicts.is_empty());
        // a controller scales (Update)
        record_update(&mut entries, &live, &deployment(5, "nginx"), deploy_shape(), "hpa", "apps/v1", "", "T1");
        let live = deployment(5, "nginx");
        // alice applies replicas 2 again: conflict with hpa on .spec.replicas
        let mut merged = live.clone();
        merged["spec"]["replicas"] = json!(2);
        let plan = plan_apply(&mut entries.clone(), &live, &cfg, &merged, deploy_shape(), "alice", "apps/v1", "", false, "T2");
        assert_eq!(plan.conflicts, vec![Conflict { manager: "hpa".into(), api_version: "apps/v1".into(), field: ".spec.replicas".into() }]);
        assert_eq!(conflict_message(&plan.conflicts), "Apply failed with 1 conflict: conflict with \"hpa\" using apps/v1: .spec.replicas");
        // the same value is no conflict (shared ownership)
        let cfg5 = json!({"spec": {"replicas": 5, "template": {"spec": {"containers": [{"name": "c", "image": "nginx"}]}}}});
        assert!(plan_apply(&mut entries.clone(), &live, &cfg5, &live, deploy_shape(), "alice", "apps/v1", "", false, "T2").conflicts.is_empty());
        // forced: alice takes replicas over
        let plan = plan_apply(&mut entries, &live, &cfg, &merged, deploy_shape(), "alice", "apps/v1", "", true, "T3");
        assert_eq!(plan.conflicts.len(), 1);
        assert!(entries.iter().all(|e| e.manager != "hpa"), "hpa owned only replicas: {entries:?}");
        // alice stops applying replicas: removed (nobody else owns it)
        let cfg_without = json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "nginx"}]}}}});
        let plan = plan_apply(&mut entries, &merged, &cfg_without, &merged, deploy_shape(), "alice", "apps/v1", "", false, "T4");
        assert_eq!(plan.remove, vec![vec!["f:spec".to_string(), "f:replicas".to_string()]]);
        let mut obj = merged.clone();
        for p in &plan.remove {
            remove_at(&mut obj, p);
        }
        assert!(obj["spec"].get("replicas").is_none());
    }

    #[test]
    fn keyed_and_set_paths_render_as_upstream() {
        assert_eq!(path_string(&["f:spec".into(), "f:containers".into(), "k:{\"name\":\"c\"}".into(), "f:image".into()]), ".spec.containers[name=\"c\"].image");
        assert_eq!(default_manager("kubectl/v1.32.4 (linux/amd64) kubernetes/abc"), "kubectl");
        assert_eq!(default_manager(""), "unknown");
        let mut obj = json!({"metadata": {"finalizers": ["a", "b"]}});
        remove_at(&mut obj, &["f:metadata".into(), "f:finalizers".into(), "v:\"a\"".into()]);
        assert_eq!(obj["metadata"]["finalizers"], json!(["b"]));
    }
}
