//! The StatefulSet's revisions (upstream `getStatefulSetRevisions`, `newRevision`,
//! `ApplyRevision`): the update revision made from the live template, and the current one.

use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use serde_json::{json, Value};

use super::identity::controller_ref;
use crate::controllers::history;

/// A revision the planner works with: its name and the pod template it holds.
#[derive(Clone, Debug, PartialEq)]
pub struct Revision {
    pub name: String,
    pub template: PodTemplateSpec,
}

/// What has to happen to the history before the pods can follow the update revision.
#[derive(Clone, Debug, PartialEq)]
pub enum RevisionStep {
    /// The live template is a revision not seen before: create it.
    Create(Box<ControllerRevision>),
    /// The live template equals an older revision (a rollback): it becomes the newest by
    /// taking the next revision number.
    Renumber { name: String, revision: i64 },
}

impl RevisionStep {
    pub fn describe(&self) -> String {
        match self {
            RevisionStep::Create(cr) => format!(
                "create ControllerRevision {} (revision {}) from the template",
                cr.metadata.name.as_deref().unwrap_or_default(),
                cr.revision
            ),
            RevisionStep::Renumber { name, revision } => {
                format!("renumber ControllerRevision {name} to revision {revision}: the template went back to it")
            }
        }
    }
}

/// The revision's data (upstream `getPatch`): `{"spec": {"template": <template>, "$patch":
/// "replace"}}`, the strategic-merge patch `kubectl rollout undo` applies to the set.
pub fn patch_of(set: &StatefulSet) -> Value {
    let template = set.spec.as_ref().map(|s| &s.template);
    let mut t = serde_json::to_value(template).unwrap_or(Value::Null);
    if !t.is_object() {
        t = json!({});
    }
    if let Some(m) = t.as_object_mut() {
        m.insert("$patch".into(), json!("replace"));
    }
    json!({"spec": {"template": t}})
}

/// The template a revision holds (upstream `ApplyRevision` for a patch that replaces the
/// template), `None` when its data is not such a patch.
pub fn template_of(r: &ControllerRevision) -> Option<PodTemplateSpec> {
    let mut t = r.data.as_ref()?.0.pointer("/spec/template")?.clone();
    t.as_object_mut()?.remove("$patch");
    serde_json::from_value(t).ok()
}

/// A new revision of the set's live template (upstream `newRevision`): the template's labels,
/// the set's annotations (`kubernetes.io/change-cause` for `kubectl rollout history`).
pub fn new_revision(set: &StatefulSet, revision: i64, collision_count: i32) -> ControllerRevision {
    let labels = set.spec.as_ref().and_then(|s| s.template.metadata.as_ref()).and_then(|m| m.labels.as_ref());
    let mut cr = history::new_revision(&set.metadata, controller_ref(set), labels, patch_of(set), revision, Some(collision_count));
    cr.metadata.annotations = set.metadata.annotations.clone().filter(|a| !a.is_empty());
    cr
}

/// The current and update revisions and the history step (upstream `getStatefulSetRevisions`).
/// `revisions` are the set's own.
pub fn revisions(set: &StatefulSet, revisions: &[&ControllerRevision]) -> (Revision, Revision, Option<RevisionStep>) {
    let mut sorted = revisions.to_vec();
    history::sort(&mut sorted);
    let collision = set.status.as_ref().and_then(|s| s.collision_count).unwrap_or(0);
    let candidate = new_revision(set, history::next_revision(&sorted), collision);
    let equal = history::find_equal(&sorted, &candidate);
    let live_template = set.spec.as_ref().map(|s| s.template.clone()).unwrap_or_default();
    let (update_name, step) = match (equal.last(), sorted.last()) {
        (Some(e), Some(last)) if e.metadata.name == last.metadata.name => (e.metadata.name.clone().unwrap_or_default(), None),
        (Some(e), _) => {
            let name = e.metadata.name.clone().unwrap_or_default();
            (name.clone(), Some(RevisionStep::Renumber { name, revision: candidate.revision }))
        }
        (None, _) => (candidate.metadata.name.clone().unwrap_or_default(), Some(RevisionStep::Create(Box::new(candidate)))),
    };
    let update = Revision { name: update_name, template: live_template };
    let current_name = set.status.as_ref().and_then(|s| s.current_revision.as_deref()).unwrap_or_default();
    let current = sorted
        .iter()
        .find(|r| r.metadata.name.as_deref() == Some(current_name) && current_name != update.name)
        .and_then(|r| Some(Revision { name: current_name.to_string(), template: template_of(r)? }))
        .unwrap_or_else(|| update.clone());
    (current, update, step)
}

/// Revisions without a controller whose labels the set's selector matches: the set adopts
/// them (upstream `adoptOrphanRevisions`), so a set recreated after an orphaning delete keeps
/// its history. None while the set is being deleted or has an empty or unparsable selector.
pub fn orphans_to_adopt(set: &StatefulSet, revisions: &[&ControllerRevision]) -> Vec<String> {
    let Some(selector) = set.spec.as_ref().and_then(|s| crate::selector::LabelSelector::from_api(&s.selector).ok()) else {
        return Vec::new();
    };
    if selector.is_empty() || set.metadata.deletion_timestamp.is_some() || set.metadata.uid.is_none() {
        return Vec::new();
    }
    revisions
        .iter()
        .filter(|r| r.metadata.namespace == set.metadata.namespace)
        .filter(|r| !r.metadata.owner_references.iter().flatten().any(|o| o.controller == Some(true)))
        .filter(|r| r.metadata.deletion_timestamp.is_none())
        .filter(|r| selector.matches(&r.metadata.labels.clone().unwrap_or_default()))
        .filter_map(|r| r.metadata.name.clone())
        .collect()
}
