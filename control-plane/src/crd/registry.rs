//! The custom resources this API server serves now.
//!
//! Request handling looks resources up as `&'static Resource` (the built-in table is static);
//! a CRD's resources are built once per distinct CRD spec and kept for the life of the process
//! (a few hundred bytes plus the schema per CRD change: CRDs change rarely, and a request that
//! started with a resource keeps a valid one whatever happens to its CRD meanwhile).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, LazyLock, Mutex, RwLock};

use serde_json::Value;

use super::definition::{self, Definition};
use super::Custom;
use crate::resources::{Resource, Sub, RESOURCES};

static SERVED: LazyLock<RwLock<Arc<Vec<&'static Resource>>>> = LazyLock::new(Default::default);
static BUILT: LazyLock<Mutex<HashMap<String, Vec<&'static Resource>>>> = LazyLock::new(Default::default);
static STRINGS: LazyLock<Mutex<HashSet<&'static str>>> = LazyLock::new(Default::default);

/// The custom resources served now (every served version of every accepted CRD).
pub fn served() -> Arc<Vec<&'static Resource>> {
    SERVED.read().unwrap_or_else(|p| p.into_inner()).clone()
}

fn intern(s: &str) -> &'static str {
    let mut set = STRINGS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(x) = set.get(s) {
        return x;
    }
    let leaked: &'static str = Box::leak(s.to_string().into_boxed_str());
    set.insert(leaked);
    leaked
}

fn intern_list(list: &[String]) -> &'static [&'static str] {
    if list.is_empty() {
        return &[];
    }
    Box::leak(list.iter().map(|s| intern(s)).collect::<Vec<_>>().into_boxed_slice())
}

fn unchanged(v: Value) -> Result<Value, serde_json::Error> {
    Ok(v)
}

fn build(d: Definition) -> Vec<&'static Resource> {
    let short_names = intern_list(&d.short_names);
    let categories = intern_list(&d.categories);
    let storage_version = intern(&d.storage_version);
    let crd = intern(&d.name);
    let list_kind = intern(&d.list_kind);
    d.versions
        .into_iter()
        .map(|v| {
            let subresources: &'static [Sub] = match (v.status, v.scale.is_some()) {
                (true, true) => &[Sub::Status, Sub::Scale],
                (true, false) => &[Sub::Status],
                (false, true) => &[Sub::Scale],
                (false, false) => &[],
            };
            let custom: &'static Custom = Box::leak(Box::new(Custom {
                crd,
                storage_version,
                schema: v.schema,
                raw_schema: v.raw_schema,
                scale: v.scale,
                columns: v.columns,
                list_kind,
            }));
            let r: &'static Resource = Box::leak(Box::new(Resource {
                group: intern(&d.group),
                version: intern(&v.name),
                kind: intern(&d.kind),
                plural: intern(&d.plural),
                singular: intern(&d.singular),
                namespaced: d.namespaced,
                short_names,
                categories,
                subresources,
                generation: true,
                normalize: unchanged,
                custom: Some(custom),
            }));
            r
        })
        .collect()
}

/// Why a CRD's names are not accepted, if they are not: its kind or plural is served already
/// in its group by a built-in resource or by a CRD that came first.
pub fn names_conflict(d: &Definition, earlier: &[&'static Resource]) -> Option<String> {
    let clash = |r: &&Resource| r.group == d.group && (r.kind == d.kind || r.plural == d.plural);
    if let Some(r) = RESOURCES.iter().find(clash) {
        return Some(format!("\"{}\" is already in use", if r.plural == d.plural { &d.plural } else { &d.kind }));
    }
    if let Some(r) = earlier.iter().find(|r| clash(r) && r.custom.is_some_and(|c| c.crd != d.name)) {
        return Some(format!("\"{}\" is already in use", if r.plural == d.plural { &d.plural } else { &d.kind }));
    }
    None
}

/// The outcome of one CRD in [`set`].
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Served,
    /// Names in use elsewhere (the message says which).
    NamesConflict(String),
    /// An invalid CRD in the store (written before a rule existed, or by hand).
    Invalid,
}

/// Serves exactly the resources of these CRDs (on a names conflict, the one whose names were
/// accepted already keeps them, else the older). Returns the outcome per CRD name.
pub fn set(crds: &[Value]) -> Vec<(String, Outcome)> {
    let mut out = Vec::new();
    let mut served: Vec<&'static Resource> = Vec::new();
    let mut sorted: Vec<&Value> = crds.iter().collect();
    // those whose names were accepted already keep them; then the older, then by name
    sorted.sort_by_key(|c| {
        let accepted = c
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .is_some_and(|cs| cs.iter().any(|x| x["type"] == "NamesAccepted" && x["status"] == "True"));
        (
            !accepted,
            c.pointer("/metadata/creationTimestamp").and_then(Value::as_str).unwrap_or("").to_string(),
            c.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("").to_string(),
        )
    });
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    let mut keep: HashSet<String> = HashSet::new();
    for crd in sorted {
        let name = crd.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("").to_string();
        let Some(d) = definition::parse(crd) else {
            out.push((name, Outcome::Invalid));
            continue;
        };
        if let Some(why) = names_conflict(&d, &served) {
            out.push((name, Outcome::NamesConflict(why)));
            continue;
        }
        let key = format!("{name}\n{}", crd.get("spec").map(|s| s.to_string()).unwrap_or_default());
        let resources = built.entry(key.clone()).or_insert_with(|| build(d)).clone();
        keep.insert(key);
        served.extend(resources);
        out.push((name, Outcome::Served));
    }
    // forget definitions no longer in use (their leaked parts stay valid for requests in flight)
    built.retain(|k, _| keep.contains(k));
    *SERVED.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(served);
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn crd(plural: &str, kind: &str, created: &str) -> Value {
        json!({
            "metadata": {"name": format!("{plural}.reg.test"), "creationTimestamp": created},
            "spec": {"group": "reg.test", "scope": "Cluster", "names": {"plural": plural, "kind": kind},
                     "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {"type": "object"}}}]}
        })
    }

    // One test only: the registry is process-wide.
    #[test]
    fn served_resources_follow_the_crds_and_the_older_keeps_a_contested_kind() {
        let out = set(&[crd("gizmos", "Gizmo", "2026-01-02T00:00:00Z"), crd("gadgets", "Gizmo", "2026-01-01T00:00:00Z")]);
        assert_eq!(out[0], ("gadgets.reg.test".to_string(), Outcome::Served));
        assert!(matches!(&out[1].1, Outcome::NamesConflict(m) if m.contains("Gizmo")), "{out:?}");
        let r = crate::resources::find("reg.test", "v1", "gadgets").unwrap();
        assert_eq!((r.kind, r.custom.unwrap().crd), ("Gizmo", "gadgets.reg.test"));
        assert!(crate::resources::find("reg.test", "v1", "gizmos").is_none());
        assert_eq!(crate::resources::from_key("/reg.test/gadgets/a").unwrap().plural, "gadgets");
        // the same spec again: the same resource, nothing rebuilt
        set(&[crd("gadgets", "Gadget", "2026-01-01T00:00:00Z")]);
        let again = crate::resources::find("reg.test", "v1", "gadgets").unwrap();
        assert_eq!(again.kind, "Gadget");
        set(&[crd("gadgets", "Gadget", "2026-01-01T00:00:00Z")]);
        assert!(std::ptr::eq(again, crate::resources::find("reg.test", "v1", "gadgets").unwrap()));
        // a pod's plural in another group is the custom one there, the built-in stays
        let out = set(&[crd("pods", "Pod", "2026-01-01T00:00:00Z")]);
        assert_eq!(out[0].1, Outcome::Served);
        assert!(crate::resources::find("", "v1", "pods").unwrap().is("pods"));
        assert!(!crate::resources::find("reg.test", "v1", "pods").unwrap().is("pods"));
        set(&[]);
        assert!(crate::resources::find("reg.test", "v1", "pods").is_none());
    }
}
