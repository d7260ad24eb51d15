//! Garbage collector: ownerReferences cascades. A dependent whose owners are all gone is
//! deleted (background); an owner deleted with propagationPolicy=Orphan (finalizer `orphan`)
//! has its dependents released first; one deleted in the foreground (finalizer
//! `foregroundDeletion`) stays until its dependents are gone. The graph is built from one
//! watch per served kind; before deleting, an owner's absence is confirmed with a live read.

pub mod plan;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ferro_runtime::{spawn_resync, spawn_workers, Change, Informer, Next, ObjectKey, WorkQueue};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, Preconditions, PropagationPolicy};
use kube::runtime::watcher;
use kube::{Api, ResourceExt as _};
use serde_json::json;

use self::plan::{Dependent, DependentPlan, OwnerPlan};
use crate::controllers::explain::{ExplainError, Explanation, Subject};
use crate::controllers::manager::{Informers, Options};
use crate::controllers::{is_conflict, is_not_found, Error};
use crate::resources::RESOURCES;

/// One object in the ownership graph.
#[derive(Clone, Debug)]
struct Vertex {
    kind: usize,
    namespace: Option<String>,
    name: String,
    resource_version: String,
    owners: Vec<OwnerReference>,
    deleting: bool,
    finalizers: Vec<String>,
}

#[derive(Default)]
struct Graph {
    vertices: HashMap<String, Vertex>,
    dependents: HashMap<String, HashSet<String>>,
}

impl Graph {
    fn upsert(&mut self, uid: String, v: Vertex) {
        if let Some(old) = self.vertices.get(&uid) {
            for o in &old.owners {
                if let Some(d) = self.dependents.get_mut(&o.uid) {
                    d.remove(&uid);
                    if d.is_empty() {
                        self.dependents.remove(&o.uid);
                    }
                }
            }
        }
        for o in &v.owners {
            self.dependents.entry(o.uid.clone()).or_default().insert(uid.clone());
        }
        self.vertices.insert(uid, v);
    }

    fn remove(&mut self, uid: &str) -> Option<Vertex> {
        let old = self.vertices.remove(uid)?;
        for o in &old.owners {
            if let Some(d) = self.dependents.get_mut(&o.uid) {
                d.remove(uid);
                if d.is_empty() {
                    self.dependents.remove(&o.uid);
                }
            }
        }
        Some(old)
    }

    fn dependents_of(&self, uid: &str) -> Vec<(String, Vertex)> {
        self.dependents
            .get(uid)
            .map(|d| d.iter().filter_map(|u| self.vertices.get(u).map(|v| (u.clone(), v.clone()))).collect())
            .unwrap_or_default()
    }
}

/// A kind the collector watches: the built-in kinds from the start, custom kinds (their
/// storage version) while their CustomResourceDefinition is established. Indices never change;
/// a kind whose CRD went keeps its slot, without a watch.
struct Kind {
    ar: ApiResource,
    namespaced: bool,
    informer: Arc<Informer<DynamicObject>>,
    task: Option<tokio::task::JoinHandle<()>>,
    /// The CRD it comes from.
    crd: Option<String>,
}

struct Gc {
    client: kube::Client,
    kinds: Mutex<Vec<Kind>>,
    graph: Mutex<Graph>,
    queue: WorkQueue<String>,
}

impl Gc {
    fn graph(&self) -> MutexGuard<'_, Graph> {
        self.graph.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn kinds(&self) -> MutexGuard<'_, Vec<Kind>> {
        self.kinds.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn kind(&self, i: usize) -> (ApiResource, bool) {
        let kinds = self.kinds();
        (kinds[i].ar.clone(), kinds[i].namespaced)
    }

    fn informers(&self) -> Vec<Arc<Informer<DynamicObject>>> {
        self.kinds().iter().filter(|k| k.task.is_some()).map(|k| k.informer.clone()).collect()
    }

    fn api(&self, kind: usize, namespace: Option<&str>) -> Api<DynamicObject> {
        let (ar, namespaced) = self.kind(kind);
        match (namespaced, namespace) {
            (true, Some(ns)) => Api::namespaced_with(self.client.clone(), ns, &ar),
            _ => Api::all_with(self.client.clone(), &ar),
        }
    }

    fn kind_of(&self, owner: &OwnerReference) -> Option<usize> {
        let group = owner.api_version.rsplit_once('/').map(|(g, _)| g).unwrap_or("");
        self.kinds().iter().position(|k| k.ar.group == group && k.ar.kind == owner.kind && k.task.is_some())
    }

    /// Starts watching a kind; returns its index.
    fn watch_kind(self: &Arc<Self>, ar: ApiResource, namespaced: bool, crd: Option<String>) -> usize {
        let mut kinds = self.kinds();
        let i = kinds.len();
        let informer: Arc<Informer<DynamicObject>> = Informer::new();
        let (g, q) = (Arc::downgrade(self), self.queue.clone());
        let follows_crds = ar.group == "apiextensions.k8s.io" && ar.plural == "customresourcedefinitions";
        informer.on_change(move |c| {
            if let Some(g) = g.upgrade() {
                on_change(&g, &q, i, c);
                if follows_crds {
                    g.follow_crd(c);
                }
            }
        });
        let task = informer.spawn(Api::all_with(self.client.clone(), &ar), watcher::Config::default().page_size(1000));
        kinds.push(Kind { ar, namespaced, informer, task: Some(task), crd });
        i
    }

    /// Follows a CustomResourceDefinition: its storage version watched while it is
    /// established, the watch stopped when it goes.
    fn follow_crd(self: &Arc<Self>, change: &Change<DynamicObject>) {
        match change {
            Change::Applied { new, .. } => {
                let Some(ar) = custom_kind(new) else { return };
                let name = new.name_any();
                let namespaced = new.data.pointer("/spec/scope").and_then(|s| s.as_str()) == Some("Namespaced");
                let known = self
                    .kinds()
                    .iter()
                    .any(|k| k.crd.as_deref() == Some(name.as_str()) && k.task.is_some() && k.ar.version == ar.version && k.ar.kind == ar.kind);
                if !known {
                    self.stop_crd(&name);
                    tracing::info!(crd = %name, kind = %ar.kind, "garbage collector watches a custom kind");
                    self.watch_kind(ar, namespaced, Some(name));
                }
            }
            Change::Deleted(old) => self.stop_crd(&old.name_any()),
        }
    }

    fn stop_crd(&self, name: &str) {
        for k in self.kinds().iter_mut().filter(|k| k.crd.as_deref() == Some(name)) {
            if let Some(t) = k.task.take() {
                t.abort();
            }
        }
    }
}

/// The storage version of an established CRD as a kind to watch.
fn custom_kind(crd: &DynamicObject) -> Option<ApiResource> {
    let established = crd
        .data
        .pointer("/status/conditions")
        .and_then(|c| c.as_array())
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Established" && c["status"] == "True"));
    if !established || crd.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let group = crd.data.pointer("/spec/group")?.as_str()?;
    let kind = crd.data.pointer("/status/acceptedNames/kind")?.as_str()?;
    let plural = crd.data.pointer("/status/acceptedNames/plural")?.as_str()?;
    let version = crd.data.pointer("/spec/versions")?.as_array()?.iter().find(|v| v["storage"] == true)?.get("name")?.as_str()?;
    Some(ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: format!("{group}/{version}"),
        kind: kind.into(),
        plural: plural.into(),
    })
}

pub fn start(inf: &Arc<Informers>, opts: &Options) {
    let queue: WorkQueue<String> = WorkQueue::new();
    let gc = Arc::new(Gc { client: inf.client(), kinds: Mutex::default(), graph: Mutex::default(), queue: queue.clone() });
    for r in RESOURCES.iter().filter(|r| r.plural != "events") {
        let ar = ApiResource {
            group: r.group.into(),
            version: r.version.into(),
            api_version: r.api_version(),
            kind: r.kind.into(),
            plural: r.plural.into(),
        };
        gc.watch_kind(ar, r.namespaced, None);
    }
    {
        let g = gc.clone();
        spawn_resync(queue.clone(), opts.resync, move || g.graph().vertices.keys().cloned().collect());
    }
    {
        let gc = gc.clone();
        inf.explain().register_kinded("garbagecollector", Arc::new(move |key, kind| Box::pin(explain(gc.clone(), key, kind))));
    }
    spawn_workers("garbagecollector", queue, 4, move |uid: String| {
        let gc = gc.clone();
        async move {
            for i in gc.informers() {
                i.wait_synced().await;
            }
            reconcile(&gc, &uid).await
        }
    });
}

/// A dry run of [`reconcile`] for one object, named by its key and `?kind=`: its owners and
/// dependents in the graph, what its deletion requires, and whether it is collected.
async fn explain(gc: Arc<Gc>, key: ObjectKey, kind: Option<String>) -> Result<Explanation, ExplainError> {
    for i in gc.informers() {
        i.wait_synced().await;
    }
    let kind = kind.ok_or_else(|| {
        ExplainError::BadRequest(
            "the garbage collector looks at objects of every kind: name one with ?kind=<Kind> (e.g. ?kind=ReplicaSet, or ?kind=ReplicaSet.apps)"
                .into(),
        )
    })?;
    let (kind_name, group) = match kind.split_once('.') {
        Some((k, g)) => (k, Some(g)),
        None => (kind.as_str(), None),
    };
    let candidates: Vec<usize> = gc
        .kinds()
        .iter()
        .enumerate()
        .filter(|(_, k)| k.task.is_some() && k.ar.kind == kind_name && group.is_none_or(|g| k.ar.group == g))
        .map(|(i, _)| i)
        .collect();
    let idx = match candidates.as_slice() {
        [i] => *i,
        [] => return Err(ExplainError::BadRequest(format!("no served kind {kind:?}"))),
        many => {
            let names: Vec<String> = many.iter().map(|i| {
                let (ar, _) = gc.kind(*i);
                format!("{}.{}", ar.kind, ar.group)
            }).collect();
            return Err(ExplainError::BadRequest(format!("kind {kind:?} is ambiguous: {}", names.join(", "))));
        }
    };
    let (ar, namespaced) = gc.kind(idx);
    let ns = if namespaced { key.namespace.clone() } else { None };
    let resource = if ar.group.is_empty() { ar.plural.clone() } else { format!("{}.{}", ar.plural, ar.group) };
    let found = gc.graph().vertices.iter().find(|(_, v)| v.kind == idx && v.name == key.name && v.namespace == ns).map(|(u, v)| (u.clone(), v.clone()));
    let (uid, v) = found.ok_or_else(|| ExplainError::NotFound { resource: resource.clone(), name: key.name.clone() })?;
    let mut e = Explanation::new(
        "garbagecollector",
        Subject {
            kind: ar.kind.clone(),
            namespace: ns.clone().unwrap_or_default(),
            name: v.name.clone(),
            uid: uid.clone(),
            resource_version: v.resource_version.clone(),
            generation: None,
        },
    );
    let (dependents, known): (Vec<(Dependent, Vertex)>, Vec<bool>) = {
        let g = gc.graph();
        let deps = g
            .dependents_of(&uid)
            .into_iter()
            .map(|(u, d)| {
                let has_dependents = !g.dependents_of(&u).is_empty();
                (Dependent { uid: u, owners: d.owners.clone(), deleting: d.deleting, has_dependents }, d)
            })
            .collect();
        (deps, v.owners.iter().map(|o| g.vertices.contains_key(&o.uid)).collect())
    };
    let name_of = |d: &Vertex| format!("{} {}", gc.kind(d.kind).0.kind, d.name);
    e.observed = serde_json::json!({
        "owners": v.owners.iter().zip(&known).map(|(o, k)| serde_json::json!({
            "kind": o.kind, "name": o.name, "uid": o.uid, "inGraph": k,
        })).collect::<Vec<_>>(),
        "dependents": dependents.iter().map(|(_, d)| name_of(d)).collect::<Vec<_>>(),
        "deleting": v.deleting,
        "finalizers": v.finalizers,
    });
    e.wants = serde_json::json!({"collectedWhenOwnersAreGone": !v.owners.is_empty()});
    let deps: Vec<Dependent> = dependents.iter().map(|(d, _)| d.clone()).collect();
    let dep_name = |u: &str| dependents.iter().find(|(d, _)| d.uid == u).map(|(_, v)| name_of(v)).unwrap_or_else(|| u.to_string());
    match plan::plan_owner(&uid, v.deleting, &v.finalizers, &deps) {
        OwnerPlan::None => {}
        OwnerPlan::Orphan { release } => {
            e.actions.extend(release.iter().map(|(u, _)| format!("release {} (orphan propagation)", dep_name(u))));
            e.actions.push(format!("remove the {} finalizer", plan::ORPHAN_FINALIZER));
            return Ok(e);
        }
        OwnerPlan::Foreground { delete } => {
            e.actions.extend(delete.iter().map(|(u, fg)| {
                format!("delete {} ({})", dep_name(u), if *fg { "foreground" } else { "background" })
            }));
            e.waiting.push(format!("the foreground deletion waits for its {} dependents to be gone", deps.len()));
            return Ok(e.requeue(Some(Duration::from_secs(5))));
        }
        OwnerPlan::ForegroundDone => {
            e.actions.push(format!("remove the {} finalizer: its dependents are gone", plan::FOREGROUND_FINALIZER));
            return Ok(e);
        }
    }
    if v.owners.is_empty() {
        e.waiting.push("nothing to do: it has no owners".into());
        return Ok(e);
    }
    if v.deleting {
        e.waiting.push("nothing to do: it is being deleted".into());
        return Ok(e);
    }
    let mut dangling = Vec::new();
    for (o, in_graph) in v.owners.iter().zip(&known) {
        if *in_graph {
            continue;
        }
        let Some(k) = gc.kind_of(o) else { continue };
        let ons = if gc.kind(k).1 { v.namespace.as_deref() } else { None };
        match gc.api(k, ons).get_metadata_opt(&o.name).await {
            Ok(Some(live)) if live.metadata.uid.as_deref() == Some(o.uid.as_str()) => {}
            Ok(_) => dangling.push(o.uid.clone()),
            Err(err) => e.waiting.push(format!("cannot read the owner {} {}: {err}", o.kind, o.name)),
        }
    }
    match plan::plan_dependent(&v.owners, v.deleting, &dangling) {
        DependentPlan::Keep => {
            let names: Vec<String> = v.owners.iter().map(|o| format!("{} {}", o.kind, o.name)).collect();
            e.waiting.push(format!("nothing to do: its owners exist ({})", names.join(", ")));
        }
        DependentPlan::Delete => e.actions.push("delete it (background): every owner is gone".into()),
        DependentPlan::DropOwners(live) => {
            let names: Vec<String> = live.iter().map(|o| format!("{} {}", o.kind, o.name)).collect();
            e.actions.push(format!("drop the owner references of gone owners, keeping {}", names.join(", ")));
        }
    }
    Ok(e)
}

fn on_change(gc: &Gc, queue: &WorkQueue<String>, kind: usize, change: &Change<DynamicObject>) {
    let keys = keys_for_change(&mut gc.graph(), kind, change);
    for k in keys {
        queue.add(k);
    }
}

/// Records a change of an object of `kind` in the graph and returns the uids to look at: the
/// object itself when it has owners or is being deleted; for a deletion, its dependents (orphans
/// now?) and its owners (waiting in the foreground?).
fn keys_for_change(graph: &mut Graph, kind: usize, change: &Change<DynamicObject>) -> Vec<String> {
    match change {
        Change::Applied { new, .. } => {
            let Some(uid) = new.uid() else { return Vec::new() };
            let v = Vertex {
                kind,
                namespace: new.namespace(),
                name: new.name_any(),
                resource_version: new.resource_version().unwrap_or_default(),
                owners: new.owner_references().to_vec(),
                deleting: new.metadata.deletion_timestamp.is_some(),
                finalizers: new.finalizers().to_vec(),
            };
            let interesting = !v.owners.is_empty() || v.deleting;
            graph.upsert(uid.clone(), v);
            if interesting {
                vec![uid]
            } else {
                Vec::new()
            }
        }
        Change::Deleted(old) => {
            let Some(uid) = old.uid() else { return Vec::new() };
            let removed = graph.remove(&uid);
            let mut keys: Vec<String> = graph.dependents_of(&uid).into_iter().map(|(d, _)| d).collect();
            keys.extend(removed.map(|v| v.owners).unwrap_or_default().into_iter().map(|o| o.uid));
            keys
        }
    }
}

/// One pass over an object of the graph: as an owner being deleted (orphan or foreground), then
/// as a dependent whose owners may be gone.
#[tracing::instrument(name = "reconcile", skip_all, fields(controller = "garbagecollector", key = %uid))]
async fn reconcile(gc: &Gc, uid: &str) -> Result<Next, Error> {
    let Some(v) = gc.graph().vertices.get(uid).cloned() else { return Ok(Next::Done) };
    let dependents: Vec<(Dependent, Vertex)> = {
        let g = gc.graph();
        g.dependents_of(uid)
            .into_iter()
            .map(|(u, d)| {
                let has_dependents = !g.dependents_of(&u).is_empty();
                (Dependent { uid: u, owners: d.owners.clone(), deleting: d.deleting, has_dependents }, d)
            })
            .collect()
    };
    let deps: Vec<Dependent> = dependents.iter().map(|(d, _)| d.clone()).collect();
    let vertex_of = |u: &str| dependents.iter().find(|(d, _)| d.uid == u).map(|(_, v)| v.clone());
    match plan::plan_owner(uid, v.deleting, &v.finalizers, &deps) {
        OwnerPlan::None => {}
        OwnerPlan::Orphan { release } => {
            for (dep_uid, owners) in release {
                if let Some(dep) = vertex_of(&dep_uid) {
                    patch_owners(gc, &dep, owners).await?;
                }
            }
            remove_finalizer(gc, &v, plan::ORPHAN_FINALIZER).await?;
            return Ok(Next::Done);
        }
        OwnerPlan::Foreground { delete: victims } => {
            for (dep_uid, foreground) in victims {
                let policy = if foreground { PropagationPolicy::Foreground } else { PropagationPolicy::Background };
                if let Some(dep) = vertex_of(&dep_uid) {
                    delete(gc, &dep_uid, &dep, policy).await?;
                }
            }
            return Ok(Next::After(Duration::from_secs(5)));
        }
        OwnerPlan::ForegroundDone => {
            remove_finalizer(gc, &v, plan::FOREGROUND_FINALIZER).await?;
            return Ok(Next::Done);
        }
    }
    if v.owners.is_empty() || v.deleting {
        return Ok(Next::Done);
    }
    let unknown: Vec<OwnerReference> = {
        let g = gc.graph();
        plan::owners_to_verify(&v.owners, &|u| g.vertices.contains_key(u)).into_iter().cloned().collect()
    };
    let mut dangling = Vec::new();
    for o in &unknown {
        // The watch may lag behind: confirm with a live read.
        let Some(kind) = gc.kind_of(o) else { continue };
        let ns = if gc.kind(kind).1 { v.namespace.as_deref() } else { None };
        match gc.api(kind, ns).get_metadata_opt(&o.name).await? {
            Some(live) if live.metadata.uid.as_deref() == Some(o.uid.as_str()) => {}
            _ => dangling.push(o.uid.clone()),
        }
    }
    match plan::plan_dependent(&v.owners, v.deleting, &dangling) {
        DependentPlan::Keep => {}
        DependentPlan::Delete => {
            tracing::info!(kind = gc.kind(v.kind).0.kind, namespace = ?v.namespace, name = v.name, "deleting object whose owners are gone");
            delete(gc, uid, &v, PropagationPolicy::Background).await?;
        }
        DependentPlan::DropOwners(owners) => patch_owners(gc, &v, owners).await?,
    }
    Ok(Next::Done)
}

async fn delete(gc: &Gc, uid: &str, v: &Vertex, policy: PropagationPolicy) -> Result<(), Error> {
    let dp = DeleteParams {
        propagation_policy: Some(policy),
        preconditions: Some(Preconditions { uid: Some(uid.to_string()), resource_version: None }),
        ..Default::default()
    };
    match gc.api(v.kind, v.namespace.as_deref()).delete(&v.name, &dp).await {
        Ok(_) => Ok(()),
        Err(e) if is_not_found(&e) || is_conflict(&e) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Replaces the object's ownerReferences, guarded by its resourceVersion.
async fn patch_owners(gc: &Gc, v: &Vertex, owners: Vec<OwnerReference>) -> Result<(), Error> {
    let patch = json!({"metadata": {"ownerReferences": owners, "resourceVersion": v.resource_version}});
    match gc.api(v.kind, v.namespace.as_deref()).patch(&v.name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => Ok(()),
        Err(e) if is_not_found(&e) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Removes one finalizer, guarded by the resourceVersion read; when the object changed in
/// between (its controller writing its status, say), read it again and retry at once rather
/// than through the queue's growing back-off (upstream's RetryOnConflict).
async fn remove_finalizer(gc: &Gc, v: &Vertex, finalizer: &str) -> Result<(), Error> {
    let api = gc.api(v.kind, v.namespace.as_deref());
    let (mut finalizers, mut rv) = (v.finalizers.clone(), v.resource_version.clone());
    for _ in 0..5 {
        let rest: Vec<&String> = finalizers.iter().filter(|f| *f != finalizer).collect();
        let patch = json!({"metadata": {"finalizers": rest, "resourceVersion": rv}});
        match api.patch(&v.name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => return Ok(()),
            Err(e) if is_not_found(&e) => return Ok(()),
            Err(e) if is_conflict(&e) => {
                let Some(live) = api.get_metadata_opt(&v.name).await? else { return Ok(()) };
                finalizers = live.metadata.finalizers.unwrap_or_default();
                rv = live.metadata.resource_version.unwrap_or_default();
                if !finalizers.iter().any(|f| f == finalizer) {
                    return Ok(());
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(Error::Other(format!("the {finalizer} finalizer of {} kept changing under us", v.name)))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn vertex(owners: &[&str]) -> Vertex {
        Vertex {
            kind: 0,
            namespace: Some("ns".into()),
            name: "x".into(),
            resource_version: "1".into(),
            owners: owners.iter().map(|u| OwnerReference { uid: u.to_string(), ..Default::default() }).collect(),
            deleting: false,
            finalizers: vec![],
        }
    }

    #[test]
    fn graph_tracks_dependents_through_updates_and_removal() {
        let mut g = Graph::default();
        g.upsert("a".into(), vertex(&["o1"]));
        g.upsert("b".into(), vertex(&["o1", "o2"]));
        assert_eq!(g.dependents_of("o1").len(), 2);
        g.upsert("a".into(), vertex(&["o2"]));
        assert_eq!(g.dependents_of("o1").len(), 1);
        assert_eq!(g.dependents_of("o2").len(), 2);
        g.remove("b");
        assert!(g.dependents_of("o1").is_empty());
        assert!(!g.dependents.contains_key("o1"));
        assert_eq!(g.dependents_of("o2").len(), 1);
    }

    fn object(uid: &str, owners: &[&str], deleting: bool) -> Arc<DynamicObject> {
        let refs: Vec<_> = owners.iter().map(|o| json!({"apiVersion": "v1", "kind": "ConfigMap", "name": format!("o-{o}"), "uid": o})).collect();
        let mut meta = json!({"name": format!("n-{uid}"), "namespace": "ns", "uid": uid, "resourceVersion": "7", "ownerReferences": refs});
        if deleting {
            meta["deletionTimestamp"] = json!("2024-01-01T00:00:00Z");
        }
        Arc::new(serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta})).unwrap())
    }

    fn applied(o: Arc<DynamicObject>) -> Change<DynamicObject> {
        Change::Applied { old: None, new: o }
    }

    #[test]
    fn objects_with_owners_or_being_deleted_are_keys() {
        let mut g = Graph::default();
        assert_eq!(keys_for_change(&mut g, 3, &applied(object("d", &["o"], false))), ["d"]);
        assert_eq!(g.vertices["d"].kind, 3);
        assert_eq!(g.vertices["d"].name, "n-d");
        // an owner-less object is only remembered (it may be someone's owner)
        assert!(keys_for_change(&mut g, 0, &applied(object("o", &[], false))).is_empty());
        assert!(g.vertices.contains_key("o"));
        // until it is deleted with a finalizer pending
        assert_eq!(keys_for_change(&mut g, 0, &applied(object("o", &[], true))), ["o"]);
        // without a uid there is nothing to track
        let no_uid: Arc<DynamicObject> = Arc::new(serde_json::from_value(json!({"metadata": {"name": "x"}})).unwrap());
        assert!(keys_for_change(&mut g, 0, &applied(no_uid)).is_empty());
    }

    #[test]
    fn a_deletion_maps_to_its_dependents_and_its_owners() {
        let mut g = Graph::default();
        keys_for_change(&mut g, 0, &applied(object("owner", &[], false)));
        keys_for_change(&mut g, 0, &applied(object("mid", &["owner"], false)));
        keys_for_change(&mut g, 0, &applied(object("leaf", &["mid"], false)));
        // mid goes: its dependent may be an orphan now, its owner may wait in the foreground
        assert_eq!(keys_for_change(&mut g, 0, &Change::Deleted(object("mid", &["owner"], false))), ["leaf", "owner"]);
        assert!(!g.vertices.contains_key("mid"));
        assert!(g.dependents_of("owner").is_empty());
        // a deletion of an owner the graph never saw still wakes its dependents
        keys_for_change(&mut g, 0, &applied(object("x", &["ghost"], false)));
        assert_eq!(keys_for_change(&mut g, 0, &Change::Deleted(object("ghost", &[], false))), ["x"]);
    }
}
