//! Garbage collector planning (pure): what an owner being deleted must do for its dependents,
//! and what happens to a dependent whose owners are gone. The executor (`gc/mod.rs`) keeps
//! the ownership graph and confirms missing owners with a live read before asking.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

pub const ORPHAN_FINALIZER: &str = "orphan";
pub const FOREGROUND_FINALIZER: &str = "foregroundDeletion";

/// A dependent as the graph knows it.
#[derive(Clone, Debug)]
pub struct Dependent {
    pub uid: String,
    pub owners: Vec<OwnerReference>,
    pub deleting: bool,
    /// It has dependents of its own (then it is deleted in the foreground too).
    pub has_dependents: bool,
}

/// What an owner's deletion requires now.
#[derive(Debug, PartialEq)]
pub enum OwnerPlan {
    /// Not being deleted with a GC finalizer: nothing to do as an owner.
    None,
    /// propagationPolicy=Orphan: set these dependents' ownerReferences (the owner's removed),
    /// then remove the `orphan` finalizer.
    Orphan { release: Vec<(String, Vec<OwnerReference>)> },
    /// propagationPolicy=Foreground: delete these dependents (uid, in the foreground?) and wait.
    Foreground { delete: Vec<(String, bool)> },
    /// Foreground deletion whose dependents are all gone: remove `foregroundDeletion`.
    ForegroundDone,
}

pub fn plan_owner(uid: &str, deleting: bool, finalizers: &[String], dependents: &[Dependent]) -> OwnerPlan {
    if !deleting {
        return OwnerPlan::None;
    }
    if finalizers.iter().any(|f| f == ORPHAN_FINALIZER) {
        let release = dependents
            .iter()
            .map(|d| (d.uid.clone(), d.owners.iter().filter(|o| o.uid != uid).cloned().collect()))
            .collect();
        return OwnerPlan::Orphan { release };
    }
    if finalizers.iter().any(|f| f == FOREGROUND_FINALIZER) {
        if dependents.is_empty() {
            return OwnerPlan::ForegroundDone;
        }
        let delete = dependents.iter().filter(|d| !d.deleting).map(|d| (d.uid.clone(), d.has_dependents)).collect();
        return OwnerPlan::Foreground { delete };
    }
    OwnerPlan::None
}

/// The owners whose absence must be confirmed: those the graph does not know.
pub fn owners_to_verify<'a>(owners: &'a [OwnerReference], known: &dyn Fn(&str) -> bool) -> Vec<&'a OwnerReference> {
    owners.iter().filter(|o| !known(&o.uid)).collect()
}

/// What happens to a dependent once `dangling` (uids of owners confirmed gone) is known.
#[derive(Debug, PartialEq)]
pub enum DependentPlan {
    Keep,
    /// Every owner is gone: delete it (background).
    Delete,
    /// Some owners are gone: keep the live references only.
    DropOwners(Vec<OwnerReference>),
}

pub fn plan_dependent(owners: &[OwnerReference], deleting: bool, dangling: &[String]) -> DependentPlan {
    if owners.is_empty() || deleting || dangling.is_empty() {
        return DependentPlan::Keep;
    }
    let live: Vec<OwnerReference> = owners.iter().filter(|o| !dangling.contains(&o.uid)).cloned().collect();
    if live.is_empty() {
        DependentPlan::Delete
    } else {
        DependentPlan::DropOwners(live)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(uid: &str) -> OwnerReference {
        OwnerReference { uid: uid.into(), name: format!("o-{uid}"), ..Default::default() }
    }

    fn dep(uid: &str, owners: &[&str], deleting: bool, has_dependents: bool) -> Dependent {
        Dependent { uid: uid.into(), owners: owners.iter().map(|o| owner(o)).collect(), deleting, has_dependents }
    }

    #[test]
    fn orphaning_releases_every_dependent_keeping_other_owners() {
        let fins = vec![ORPHAN_FINALIZER.to_string()];
        let plan = plan_owner("a", true, &fins, &[dep("d1", &["a"], false, false), dep("d2", &["a", "b"], false, false)]);
        let OwnerPlan::Orphan { release } = plan else { panic!("{plan:?}") };
        assert_eq!(release.len(), 2);
        assert!(release[0].1.is_empty());
        assert_eq!(release[1].1.iter().map(|o| o.uid.as_str()).collect::<Vec<_>>(), ["b"]);
        // orphaning with no dependents still removes the finalizer
        assert_eq!(plan_owner("a", true, &fins, &[]), OwnerPlan::Orphan { release: vec![] });
    }

    #[test]
    fn foreground_deletes_dependents_then_finishes() {
        let fins = vec![FOREGROUND_FINALIZER.to_string()];
        let plan = plan_owner("a", true, &fins, &[dep("d1", &["a"], false, true), dep("d2", &["a"], true, false), dep("d3", &["a"], false, false)]);
        assert_eq!(plan, OwnerPlan::Foreground { delete: vec![("d1".into(), true), ("d3".into(), false)] });
        assert_eq!(plan_owner("a", true, &fins, &[]), OwnerPlan::ForegroundDone);
    }

    #[test]
    fn an_owner_not_being_deleted_has_nothing_to_do() {
        assert_eq!(plan_owner("a", false, &[ORPHAN_FINALIZER.into()], &[dep("d", &["a"], false, false)]), OwnerPlan::None);
        assert_eq!(plan_owner("a", true, &["other".into()], &[dep("d", &["a"], false, false)]), OwnerPlan::None);
    }

    #[test]
    fn dependents_go_only_when_all_owners_are_gone() {
        let owners = vec![owner("a"), owner("b")];
        assert_eq!(plan_dependent(&owners, false, &[]), DependentPlan::Keep);
        assert_eq!(plan_dependent(&owners, false, &["a".into()]), DependentPlan::DropOwners(vec![owner("b")]));
        assert_eq!(plan_dependent(&owners, false, &["a".into(), "b".into()]), DependentPlan::Delete);
        // already being deleted, or no owners: nothing
        assert_eq!(plan_dependent(&owners, true, &["a".into(), "b".into()]), DependentPlan::Keep);
        assert_eq!(plan_dependent(&[], false, &["a".into()]), DependentPlan::Keep);
    }

    #[test]
    fn only_unknown_owners_are_verified() {
        let owners = vec![owner("a"), owner("b")];
        let v = owners_to_verify(&owners, &|u| u == "a");
        assert_eq!(v.iter().map(|o| o.uid.as_str()).collect::<Vec<_>>(), ["b"]);
    }
}
