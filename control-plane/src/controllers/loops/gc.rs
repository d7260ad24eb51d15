//! Garbage collector: ownerReferences cascades. A dependent whose owners are all gone is
//! deleted (background); an owner deleted with propagationPolicy=Orphan (finalizer `orphan`)
//! has its dependents released first; one deleted in the foreground (finalizer
//! `foregroundDeletion`) stays until its dependents are gone. The graph is built from one
//! watch per served kind; before deleting, an owner's absence is confirmed with a live read.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ferro_runtime::{spawn_resync, spawn_workers, Change, Informer, Next, WorkQueue};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, Preconditions, PropagationPolicy};
use kube::runtime::watcher;
use kube::{Api, ResourceExt as _};
use serde_json::json;

use crate::controllers::gc::{self as plan, Dependent, DependentPlan, OwnerPlan};
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

struct Gc {
    client: kube::Client,
    kinds: Vec<(ApiResource, bool)>,
    graph: Mutex<Graph>,
}

impl Gc {
    fn graph(&self) -> MutexGuard<'_, Graph> {
        self.graph.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn api(&self, kind: usize, namespace: Option<&str>) -> Api<DynamicObject> {
        let (ar, namespaced) = &self.kinds[kind];
        match (namespaced, namespace) {
            (true, Some(ns)) => Api::namespaced_with(self.client.clone(), ns, ar),
            _ => Api::all_with(self.client.clone(), ar),
        }
    }

    fn kind_of(&self, owner: &OwnerReference) -> Option<usize> {
        let group = owner.api_version.rsplit_once('/').map(|(g, _)| g).unwrap_or("");
        self.kinds.iter().position(|(ar, _)| ar.group == group && ar.kind == owner.kind)
    }
}

pub fn start(inf: &Arc<Informers>, opts: &Options) {
    let kinds: Vec<(ApiResource, bool)> = RESOURCES
        .iter()
        .filter(|r| r.plural != "events")
        .map(|r| {
            let ar = ApiResource {
                group: r.group.into(),
                version: r.version.into(),
                api_version: r.api_version(),
                kind: r.kind.into(),
                plural: r.plural.into(),
            };
            (ar, r.namespaced)
        })
        .collect();
    let gc = Arc::new(Gc { client: inf.client(), kinds: kinds.clone(), graph: Mutex::default() });
    let queue: WorkQueue<String> = WorkQueue::new();
    let mut informers = Vec::new();
    for (i, (ar, _)) in kinds.iter().enumerate() {
        let informer: Arc<Informer<DynamicObject>> = Informer::new();
        let (g, q) = (gc.clone(), queue.clone());
        informer.on_change(move |c| on_change(&g, &q, i, c));
        informer.spawn(Api::all_with(inf.client(), ar), watcher::Config::default().page_size(1000));
        informers.push(informer);
    }
    {
        let g = gc.clone();
        spawn_resync(queue.clone(), opts.resync, move || g.graph().vertices.keys().cloned().collect());
    }
    spawn_workers("garbagecollector", queue, 4, move |uid: String| {
        let (gc, informers) = (gc.clone(), informers.clone());
        async move {
            for i in &informers {
                i.wait_synced().await;
            }
            reconcile(&gc, &uid).await
        }
    });
}

fn on_change(gc: &Gc, queue: &WorkQueue<String>, kind: usize, change: &Change<DynamicObject>) {
    match change {
        Change::Applied { new, .. } => {
            let Some(uid) = new.uid() else { return };
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
            gc.graph().upsert(uid.clone(), v);
            if interesting {
                queue.add(uid);
            }
        }
        Change::Deleted(old) => {
            let Some(uid) = old.uid() else { return };
            let removed = gc.graph().remove(&uid);
            // its dependents may now be orphans; owners waiting in the foreground may be done
            let deps = gc.graph().dependents_of(&uid);
            for (d, _) in deps {
                queue.add(d);
            }
            for o in removed.map(|v| v.owners).unwrap_or_default() {
                queue.add(o.uid);
            }
        }
    }
}

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
        let ns = if gc.kinds[kind].1 { v.namespace.as_deref() } else { None };
        match gc.api(kind, ns).get_metadata_opt(&o.name).await? {
            Some(live) if live.metadata.uid.as_deref() == Some(o.uid.as_str()) => {}
            _ => dangling.push(o.uid.clone()),
        }
    }
    match plan::plan_dependent(&v.owners, v.deleting, &dangling) {
        DependentPlan::Keep => {}
        DependentPlan::Delete => {
            tracing::info!(kind = gc.kinds[v.kind].0.kind, namespace = ?v.namespace, name = v.name, "deleting object whose owners are gone");
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

async fn remove_finalizer(gc: &Gc, v: &Vertex, finalizer: &str) -> Result<(), Error> {
    let rest: Vec<_> = v.finalizers.iter().filter(|f| *f != finalizer).collect();
    let patch = json!({"metadata": {"finalizers": rest, "resourceVersion": v.resource_version}});
    match gc.api(v.kind, v.namespace.as_deref()).patch(&v.name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => Ok(()),
        Err(e) if is_not_found(&e) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
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
}
