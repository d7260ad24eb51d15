//! ControllerRevision history (upstream `pkg/controller/history`), shared by the StatefulSet and
//! DaemonSet controllers: a revision's hash and name, equality, revision numbers, and which
//! revisions a history limit lets go.
//!
//! Pure: no I/O. The owner decides what a revision's `data` is (the StatefulSet's is a
//! strategic-merge patch of `spec.template` with `$patch: replace`, which is what
//! `kubectl rollout undo` sends back).
//!
//! Differences from upstream, deliberate:
//! - the hash is FNV-32 (FNV-1, as upstream's `fnv.New32`) over the data's canonical JSON (keys
//!   sorted; nulls, empty lists and maps, `false` and `0` dropped) instead of the bytes a Go
//!   encoder wrote, so one template always hashes the same whichever client wrote it;
//! - equality compares those canonical forms instead of raw bytes, for the same reason.

use std::collections::BTreeSet;

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use serde_json::Value;

/// The label carrying a revision's hash (upstream `ControllerRevisionHashLabel`).
pub const HASH_LABEL: &str = "controller.kubernetes.io/hash";

/// Upstream `rand.SafeEncodeString` alphabet (no vowels, no confusable characters).
const SAFE_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// The JSON value with nulls, empty lists and maps, `false` and `0` removed (absent and zero are
/// the same to Go's semantic equality once a protobuf or JSON client has had its say).
pub fn canonical(v: &Value) -> Option<Value> {
    match v {
        Value::Null | Value::Bool(false) => None,
        Value::Number(n) if n.as_f64() == Some(0.0) => None,
        Value::Array(items) => {
            let items: Vec<Value> = items.iter().map(|i| canonical(i).unwrap_or(Value::Null)).collect();
            (!items.is_empty()).then_some(Value::Array(items))
        }
        Value::Object(map) => {
            let m: serde_json::Map<String, Value> =
                map.iter().filter_map(|(k, v)| canonical(v).map(|v| (k.clone(), v))).collect();
            (!m.is_empty()).then_some(Value::Object(m))
        }
        other => Some(other.clone()),
    }
}

/// Canonical JSON text with sorted keys (serde_json's map is ordered by key here, but sort
/// explicitly so the hash never depends on a crate feature).
fn canonical_text(v: &Value) -> String {
    fn write(v: &Value, out: &mut String) {
        match v {
            Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                out.push('{');
                for (i, k) in keys.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::String((*k).clone()).to_string());
                    out.push(':');
                    write(&m[k.as_str()], out);
                }
                out.push('}');
            }
            Value::Array(a) => {
                out.push('[');
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(x, out);
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let mut s = String::new();
    write(&canonical(v).unwrap_or(Value::Null), &mut s);
    s
}

/// A revision's hash (upstream `HashControllerRevision`): FNV-32 over the data, then the
/// collision count in decimal when set, rendered through `SafeEncodeString`.
pub fn hash(data: &Value, collision_count: Option<i32>) -> String {
    let mut h: u32 = 0x811c_9dc5;
    let mut feed = |bytes: &[u8]| {
        for b in bytes {
            h = h.wrapping_mul(0x0100_0193);
            h ^= u32::from(*b);
        }
    };
    feed(canonical_text(data).as_bytes());
    if let Some(c) = collision_count {
        feed(c.to_string().as_bytes());
    }
    h.to_string().bytes().map(|b| char::from(SAFE_ALPHABET[usize::from(b) % SAFE_ALPHABET.len()])).collect()
}

/// `<prefix>-<hash>`, the prefix cut to 223 characters (upstream `ControllerRevisionName`).
pub fn name(prefix: &str, hash: &str) -> String {
    let prefix: String = prefix.chars().take(223).collect();
    format!("{prefix}-{hash}")
}

/// A new revision of an owner (upstream `NewControllerRevision`): the template's labels plus the
/// hash label, a controller reference to the owner, the owner's namespace, the data and the
/// revision number; named `<owner>-<hash>`.
pub fn new_revision(
    owner: &ObjectMeta,
    owner_ref: OwnerReference,
    template_labels: Option<&std::collections::BTreeMap<String, String>>,
    data: Value,
    revision: i64,
    collision_count: Option<i32>,
) -> ControllerRevision {
    let h = hash(&data, collision_count);
    let mut labels = template_labels.cloned().unwrap_or_default();
    labels.insert(HASH_LABEL.to_string(), h.clone());
    ControllerRevision {
        metadata: ObjectMeta {
            name: Some(name(owner.name.as_deref().unwrap_or_default(), &h)),
            namespace: owner.namespace.clone(),
            labels: Some(labels),
            owner_references: Some(vec![owner_ref]),
            ..ObjectMeta::default()
        },
        data: Some(RawExtension(data)),
        revision,
    }
}

fn data_of(r: &ControllerRevision) -> Value {
    r.data.as_ref().map(|d| d.0.clone()).unwrap_or(Value::Null)
}

/// Whether two revisions hold the same data (upstream `EqualRevision`: different hash labels
/// that parse as numbers differ; then the data decides).
pub fn equal(a: &ControllerRevision, b: &ControllerRevision) -> bool {
    let num = |r: &ControllerRevision| r.metadata.labels.as_ref()?.get(HASH_LABEL)?.parse::<u32>().ok();
    if let (Some(x), Some(y)) = (num(a), num(b)) {
        if x != y {
            return false;
        }
    }
    canonical(&data_of(a)) == canonical(&data_of(b))
}

/// The revisions equal to `needle`, in the order given (upstream `FindEqualRevisions`).
pub fn find_equal<'a>(revisions: &[&'a ControllerRevision], needle: &ControllerRevision) -> Vec<&'a ControllerRevision> {
    revisions.iter().copied().filter(|r| equal(r, needle)).collect()
}

/// Sorts by revision number, then creation time, then name (upstream `SortControllerRevisions`).
pub fn sort(revisions: &mut [&ControllerRevision]) {
    revisions.sort_by(|a, b| {
        (a.revision, a.metadata.creation_timestamp.as_ref().map(|t| t.0), a.metadata.name.as_deref()).cmp(&(
            b.revision,
            b.metadata.creation_timestamp.as_ref().map(|t| t.0),
            b.metadata.name.as_deref(),
        ))
    });
}

/// The number of the next revision: one more than the highest (upstream `nextRevision`).
pub fn next_revision(revisions: &[&ControllerRevision]) -> i64 {
    revisions.iter().map(|r| r.revision).max().unwrap_or(0) + 1
}

/// The names of the revisions to delete so that at most `limit` revisions are kept besides the
/// live ones (upstream `truncateHistory`): the oldest first among those not in `live` (the
/// current and update revisions and every revision a pod still runs).
pub fn to_delete(revisions: &[&ControllerRevision], live: &BTreeSet<String>, limit: i32) -> Vec<String> {
    let mut history: Vec<&ControllerRevision> = revisions
        .iter()
        .copied()
        .filter(|r| !live.contains(r.metadata.name.as_deref().unwrap_or_default()))
        .collect();
    let limit = usize::try_from(limit.max(0)).unwrap_or(0);
    if history.len() <= limit {
        return Vec::new();
    }
    sort(&mut history);
    let n = history.len() - limit;
    history.into_iter().take(n).filter_map(|r| r.metadata.name.clone()).collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn owner() -> ObjectMeta {
        ObjectMeta { name: Some("web".into()), namespace: Some("ns".into()), ..Default::default() }
    }

    fn owner_ref() -> OwnerReference {
        OwnerReference {
            api_version: "apps/v1".into(),
            kind: "StatefulSet".into(),
            name: "web".into(),
            uid: "u1".into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }

    fn rev(image: &str, n: i64) -> ControllerRevision {
        let data = json!({"spec": {"template": {"$patch": "replace", "spec": {"containers": [{"name": "c", "image": image}]}}}});
        new_revision(&owner(), owner_ref(), None, data, n, None)
    }

    #[test]
    fn hash_is_stable_and_ignores_absent_versus_zero() {
        let a = json!({"spec": {"containers": [{"name": "c", "image": "x", "stdin": false}], "volumes": []}});
        let b = json!({"spec": {"containers": [{"image": "x", "name": "c"}]}});
        assert_eq!(hash(&a, None), hash(&b, None));
        assert_ne!(hash(&a, None), hash(&a, Some(1)), "the collision count changes the hash");
        assert_ne!(hash(&a, None), hash(&json!({"spec": {"containers": [{"name": "c", "image": "y"}]}}), None));
        assert!(hash(&a, None).bytes().all(|b| SAFE_ALPHABET.contains(&b)));
    }

    #[test]
    fn a_revision_is_named_and_labelled_by_its_hash() {
        let labels = [("app".to_string(), "web".to_string())].into_iter().collect();
        let r = new_revision(&owner(), owner_ref(), Some(&labels), json!({"a": 1}), 3, None);
        let h = hash(&json!({"a": 1}), None);
        assert_eq!(r.metadata.name.as_deref(), Some(format!("web-{h}").as_str()));
        let l = r.metadata.labels.as_ref().unwrap();
        assert_eq!(l.get("app").map(String::as_str), Some("web"));
        assert_eq!(l.get(HASH_LABEL), Some(&h));
        assert_eq!(r.metadata.namespace.as_deref(), Some("ns"));
        assert_eq!(r.revision, 3);
        assert_eq!(r.metadata.owner_references.as_ref().unwrap()[0].controller, Some(true));
        assert_eq!(name(&"x".repeat(300), "h").len(), 225);
    }

    #[test]
    fn equality_and_numbers() {
        let (a, b, c) = (rev("1", 1), rev("2", 2), rev("1", 3));
        assert!(equal(&a, &c));
        assert!(!equal(&a, &b));
        assert_eq!(find_equal(&[&a, &b, &c], &rev("1", 9)).len(), 2);
        assert_eq!(next_revision(&[&a, &c, &b]), 4);
        assert_eq!(next_revision(&[]), 1);
        let mut v = vec![&c, &a, &b];
        sort(&mut v);
        assert_eq!(v.iter().map(|r| r.revision).collect::<Vec<_>>(), [1, 2, 3]);
    }

    #[test]
    fn history_keeps_the_live_and_the_newest() {
        let revs: Vec<ControllerRevision> = (1..=6).map(|i| rev(&i.to_string(), i)).collect();
        let refs: Vec<&ControllerRevision> = revs.iter().rev().collect();
        let n = |i: usize| revs[i - 1].metadata.name.clone().unwrap();
        // revisions 6 (update) and 2 (a pod still runs it) are live
        let live: BTreeSet<String> = [n(6), n(2)].into_iter().collect();
        assert_eq!(to_delete(&refs, &live, 2), [n(1), n(3)]);
        assert!(to_delete(&refs, &live, 10).is_empty());
        assert_eq!(to_delete(&refs, &live, 0).len(), 4);
    }
}
