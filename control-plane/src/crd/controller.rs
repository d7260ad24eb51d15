//! The CRD loop every API server runs (upstream's naming, establishing and finalizing
//! controllers of the apiextensions-apiserver, in one): the registry follows the stored CRDs,
//! each CRD's status says whether its names are accepted and it is established and which
//! versions were ever stored, and a CRD being deleted first loses its custom objects.
//!
//! Every replica runs it (each one serves from its own registry); their status writes are the
//! same, a conflicting one is simply done again on the next event.

use std::collections::HashSet;
use std::sync::{Arc, LazyLock, RwLock};

use serde_json::{json, Value};
use tokio::sync::broadcast::error::RecvError;

use super::registry::{self, Outcome};
use super::{crd_resource, CLEANUP_FINALIZER};
use crate::api::{Api, DeleteOptions};
use crate::error::ApiError;
use crate::resources::Resource;

const CRD_PREFIX: &str = "/apiextensions.k8s.io/customresourcedefinitions/";

static TERMINATING: LazyLock<RwLock<HashSet<String>>> = LazyLock::new(Default::default);

/// Whether the CRD of this name is being deleted (its objects may be read, changed and
/// deleted, not created).
pub fn terminating(crd: &str) -> bool {
    TERMINATING.read().unwrap_or_else(|p| p.into_inner()).contains(crd)
}

/// Upstream's refusal of a create while the CRD is being deleted.
pub fn refuse_create(res: &Resource) -> Result<(), ApiError> {
    match res.custom {
        Some(c) if terminating(c.crd) => Err(ApiError::new(
            405,
            "MethodNotAllowed",
            "create not allowed while custom resource definition is terminating",
        )),
        _ => Ok(()),
    }
}

fn now() -> String {
    jiff::Timestamp::now().round(jiff::Unit::Second).map(|t| t.to_string()).unwrap_or_default()
}

/// The status a CRD should have, given the registry's outcome; timestamps of conditions that
/// did not change are kept.
pub fn desired_status(crd: &Value, outcome: &Outcome, objects_left: Option<usize>, now: &str) -> Value {
    let old = crd.get("status").cloned().unwrap_or_else(|| json!({}));
    let mut status = old.clone();
    let condition = |ty: &str, st: &str, reason: &str, message: &str| {
        let previous = old
            .get("conditions")
            .and_then(Value::as_array)
            .and_then(|cs| cs.iter().find(|c| c["type"] == ty))
            .filter(|c| c["status"] == st)
            .and_then(|c| c.get("lastTransitionTime").cloned());
        json!({"type": ty, "status": st, "reason": reason, "message": message, "lastTransitionTime": previous.unwrap_or_else(|| json!(now))})
    };
    let mut conditions = Vec::new();
    match outcome {
        Outcome::Served => {
            conditions.push(condition("NamesAccepted", "True", "NoConflicts", "no conflicts found"));
            conditions.push(condition("Established", "True", "InitialNamesAccepted", "the initial names have been accepted"));
            let mut names = crd.pointer("/spec/names").cloned().unwrap_or_else(|| json!({}));
            let kind = names.get("kind").and_then(Value::as_str).unwrap_or("").to_string();
            if let Some(n) = names.as_object_mut() {
                n.entry("singular").or_insert_with(|| json!(kind.to_lowercase()));
                n.entry("listKind").or_insert_with(|| json!(format!("{kind}List")));
            }
            status["acceptedNames"] = names;
        }
        Outcome::NamesConflict(why) => {
            conditions.push(condition("NamesAccepted", "False", "KindConflict", why));
            conditions.push(condition("Established", "False", "NotAccepted", "not all names are accepted"));
            if status.get("acceptedNames").is_none() {
                status["acceptedNames"] = json!({"plural": "", "kind": ""});
            }
        }
        Outcome::Invalid => {
            conditions.push(condition("NamesAccepted", "False", "Invalid", "the definition is not valid"));
        }
    }
    if let Some(left) = objects_left {
        let message = if left == 0 {
            "removed all instances".to_string()
        } else {
            format!("CustomResource deletion is in progress: {left} instances left")
        };
        let reason = if left == 0 { "InstanceDeletionCompleted" } else { "InstanceDeletionInProgress" };
        conditions.push(condition("Terminating", "True", reason, &message));
    }
    status["conditions"] = json!(conditions);
    let mut stored: Vec<Value> = old.get("storedVersions").and_then(Value::as_array).cloned().unwrap_or_default();
    let storage = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .and_then(|vs| vs.iter().find(|v| v["storage"] == true))
        .and_then(|v| v.get("name").cloned());
    if let Some(s) = storage {
        if !stored.contains(&s) {
            stored.push(s);
        }
    }
    status["storedVersions"] = json!(stored);
    status
}

/// Lists the CRDs, serves them, and brings each one's status (and deletion) forward. Returns
/// the key prefixes of the custom objects of CRDs being deleted (their events matter too).
async fn reconcile_all(api: &Api) -> Result<Vec<String>, ApiError> {
    let crd_res = crd_resource().ok_or_else(|| ApiError::internal("no CRD resource"))?;
    let listing = api.store.list(CRD_PREFIX).await?;
    let mut crds = Vec::new();
    for r in &listing.records {
        crds.push(r.json()?);
    }
    let outcomes = registry::set(&crds);
    let terminating: HashSet<String> = crds
        .iter()
        .filter(|c| c.pointer("/metadata/deletionTimestamp").is_some())
        .filter_map(|c| c.pointer("/metadata/name").and_then(Value::as_str).map(str::to_string))
        .collect();
    *TERMINATING.write().unwrap_or_else(|p| p.into_inner()) = terminating;
    let mut watched = Vec::new();
    for (crd, (name, outcome)) in crds.iter().zip(outcomes_in_order(&crds, outcomes)) {
        let span = tracing::info_span!("reconcile", loop_ = "crd", crd = %name);
        let _g = span.enter();
        let deleting = crd.pointer("/metadata/deletionTimestamp").is_some();
        let mut left = None;
        if deleting {
            let prefix = objects_prefix(crd);
            watched.push(prefix.clone());
            left = Some(delete_objects(api, crd, &prefix).await?);
        }
        let status = desired_status(crd, &outcome, left, &now());
        if crd.get("status") != Some(&status) {
            let mut updated = crd.clone();
            updated["status"] = status;
            match api.update(crd_res, None, &name, updated, crate::api::Endpoint::Status, false).await {
                Ok(_) => {}
                Err(e) if e.code == 409 || e.code == 404 => tracing::debug!(error = %e.message, "status write lost a race; next event"),
                Err(e) => tracing::warn!(error = %e.message, "writing the CRD status"),
            }
        }
        if deleting && left == Some(0) {
            remove_finalizer(api, crd_res, &name).await;
        }
    }
    Ok(watched)
}

fn outcomes_in_order(crds: &[Value], outcomes: Vec<(String, Outcome)>) -> Vec<(String, Outcome)> {
    crds.iter()
        .map(|c| {
            let name = c.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("").to_string();
            let o = outcomes.iter().find(|(n, _)| *n == name).map(|(_, o)| o.clone()).unwrap_or(Outcome::Invalid);
            (name, o)
        })
        .collect()
}

fn objects_prefix(crd: &Value) -> String {
    let group = crd.pointer("/spec/group").and_then(Value::as_str).unwrap_or("");
    let plural = crd.pointer("/spec/names/plural").and_then(Value::as_str).unwrap_or("");
    format!("/{group}/{plural}/")
}

/// Deletes the custom objects of a CRD being deleted; returns how many are left (those with
/// finalizers of their own stay until their controllers let them go).
async fn delete_objects(api: &Api, crd: &Value, prefix: &str) -> Result<usize, ApiError> {
    let listing = api.store.list(prefix).await?;
    if listing.records.is_empty() {
        return Ok(0);
    }
    let name = crd.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
    let res = registry::served().iter().copied().find(|r| r.custom.is_some_and(|c| c.crd == name));
    let mut left = 0;
    for r in &listing.records {
        left += 1;
        let Some(res) = res else {
            // not served (invalid or conflicting names): nothing can have added finalizers through
            // the API, the objects go directly
            let _ = api.store.write(crate::store::Op::Delete { key: r.key.to_string(), expect: None }).await;
            continue;
        };
        let obj = r.json()?;
        if obj.pointer("/metadata/deletionTimestamp").is_some() {
            continue;
        }
        let (ns, n) = crate::resources::key_parts(res, &r.key);
        match api.delete(res, ns, n, &DeleteOptions::default()).await {
            Ok(_) => {}
            Err(e) if e.code == 404 => {}
            Err(e) => tracing::warn!(object = %r.key, error = %e.message, "deleting a custom object of a CRD being deleted"),
        }
    }
    let after = api.store.list(prefix).await?.records.len();
    Ok(if after == 0 { 0 } else { left.min(after) })
}

async fn remove_finalizer(api: &Api, crd_res: &'static Resource, name: &str) {
    let Ok(current) = api.get(crd_res, None, name).await else { return };
    let Ok(mut obj) = current.json() else { return };
    let Some(fins) = obj.pointer_mut("/metadata/finalizers").and_then(Value::as_array_mut) else { return };
    fins.retain(|f| f != CLEANUP_FINALIZER);
    if let Err(e) = api.update(crd_res, None, name, obj, crate::api::Endpoint::Main, false).await {
        if e.code != 404 && e.code != 409 {
            tracing::warn!(crd = %name, error = %e.message, "removing the cleanup finalizer");
        }
    }
}

/// Runs until the store closes.
pub async fn run(api: Arc<Api>) {
    loop {
        let mut watched = match reconcile_all(&api).await {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(error = %e.message, "CRD loop: listing failed; again in 1 s");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                continue;
            }
        };
        let from = api.store.revision();
        let mut w = match api.store.watch(from) {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(error = %e, "CRD loop: watch failed; again in 1 s");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                continue;
            }
        };
        let relevant = |key: &str, watched: &[String]| key.starts_with(CRD_PREFIX) || watched.iter().any(|p| key.starts_with(p.as_str()));
        let mut dirty = w.backlog.iter().any(|e| relevant(&e.record.key, &watched));
        loop {
            if dirty {
                match reconcile_all(&api).await {
                    Ok(x) => watched = x,
                    Err(e) => tracing::warn!(error = %e.message, "CRD loop"),
                }
            }
            match w.recv().await {
                Ok(e) => dirty = relevant(&e.record.key, &watched),
                Err(RecvError::Lagged(_)) => dirty = true,
                Err(RecvError::Closed) => return,
            }
            // take every event already queued before reconciling once
            while let Ok(e) = w.try_recv() {
                dirty |= relevant(&e.record.key, &watched);
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn status_of_an_accepted_crd_and_of_one_being_deleted() {
        let crd = json!({"spec": {"names": {"plural": "widgets", "kind": "Widget"}, "versions": [{"name": "v1", "storage": true}]}});
        let s = desired_status(&crd, &Outcome::Served, None, "T1");
        assert_eq!(s["acceptedNames"], json!({"plural": "widgets", "kind": "Widget", "singular": "widget", "listKind": "WidgetList"}));
        assert_eq!(s["storedVersions"], json!(["v1"]));
        assert_eq!(s["conditions"][1]["type"], "Established");
        // unchanged conditions keep their time: a second pass writes nothing
        let crd2 = json!({"spec": crd["spec"], "status": s});
        assert_eq!(desired_status(&crd2, &Outcome::Served, None, "T2"), crd2["status"]);
        let d = desired_status(&crd2, &Outcome::Served, Some(3), "T3");
        assert_eq!(d["conditions"][2]["message"], "CustomResource deletion is in progress: 3 instances left");
        let c = desired_status(&crd, &Outcome::NamesConflict("\"Widget\" is already in use".into()), None, "T1");
        assert_eq!(c["conditions"][0]["status"], "False");
        assert_eq!(c["conditions"][1]["reason"], "NotAccepted");
    }
}
