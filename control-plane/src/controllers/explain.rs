//! Every loop explains itself: for one object, what the loop observes, what it wants, the
//! actions its pure planner would take now and why it waits, computed by the same planner the
//! loop runs, on the same informer caches and in-memory state (expectations, back-off).
//! Served by the API server at `/debug/controllers/<loop>/<namespace>/<name>` (JSON, or text
//! with `?format=text`), e.g. `kubectl get --raw /debug/controllers/statefulset/default/web`.
//!
//! Nothing here writes: an explanation is a dry run of one reconcile.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use ferro_runtime::ObjectKey;
use futures::future::BoxFuture;
use serde::Serialize;
use serde_json::Value;

/// The object an explanation is about.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Subject {
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
}

impl Subject {
    pub fn of<K: kube::Resource<DynamicType = ()>>(obj: &K) -> Self {
        let m = obj.meta();
        Subject {
            kind: K::kind(&()).to_string(),
            namespace: m.namespace.clone().unwrap_or_default(),
            name: m.name.clone().unwrap_or_default(),
            uid: m.uid.clone().unwrap_or_default(),
            resource_version: m.resource_version.clone().unwrap_or_default(),
            generation: m.generation,
        }
    }
}

/// What a loop would do for one object now, and why it waits.
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    pub kind: &'static str,
    pub api_version: &'static str,
    /// The loop, by its `--controllers` name.
    pub controller: String,
    pub object: Subject,
    /// What the loop reads (from its informer caches), summarised.
    pub observed: Value,
    /// The state the loop drives the object towards.
    pub wants: Value,
    /// The writes the planner would make now, in order; empty when it is content.
    pub actions: Vec<String>,
    /// Why it does not go further now; empty when nothing holds it back.
    pub waiting: Vec<String>,
    /// When the loop looks at the object again without a change (e.g. minReadySeconds).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requeue_after: Option<String>,
}

impl Explanation {
    pub fn new(controller: &str, object: Subject) -> Self {
        Explanation {
            kind: "ControllerExplanation",
            api_version: "debug.ferro.dev/v1",
            controller: controller.to_string(),
            object,
            observed: Value::Null,
            wants: Value::Null,
            actions: Vec::new(),
            waiting: Vec::new(),
            requeue_after: None,
        }
    }

    pub fn requeue(mut self, after: Option<Duration>) -> Self {
        self.requeue_after = after.map(go_duration);
        self
    }

    /// The human form (`?format=text`).
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let o = &self.object;
        let _ = write!(out, "{} {}/{}", self.controller, o.namespace, o.name);
        let _ = write!(out, " ({} uid {} resourceVersion {}", o.kind, o.uid, o.resource_version);
        if let Some(g) = o.generation {
            let _ = write!(out, " generation {g}");
        }
        out.push_str(")\n");
        for (title, v) in [("observed", &self.observed), ("wants", &self.wants)] {
            out.push_str(title);
            out.push_str(":\n");
            let yaml = serde_yaml::to_string(v).unwrap_or_default();
            for line in yaml.lines() {
                let _ = writeln!(out, "  {line}");
            }
        }
        for (title, items, none) in [
            ("actions", &self.actions, "none: the object is as the loop wants it"),
            ("waiting", &self.waiting, "nothing"),
        ] {
            let _ = writeln!(out, "{title}:");
            if items.is_empty() {
                let _ = writeln!(out, "  {none}");
            }
            for i in items {
                let _ = writeln!(out, "  - {i}");
            }
        }
        if let Some(r) = &self.requeue_after {
            let _ = writeln!(out, "looks again in {r}");
        }
        out
    }
}

/// A duration as Go prints it, to the millisecond (`1m30s`, `200ms`).
pub fn go_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (h, m, s, rest) = (ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000);
    let mut out = String::new();
    if h > 0 {
        let _ = write!(out, "{h}h");
    }
    if h > 0 || m > 0 {
        let _ = write!(out, "{m}m");
    }
    if rest == 0 {
        let _ = write!(out, "{s}s");
    } else {
        let frac = format!("{rest:03}");
        let _ = write!(out, "{s}.{}s", frac.trim_end_matches('0'));
    }
    out
}

/// Why no explanation could be given.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ExplainError {
    #[error("controller {name:?} does not exist; known: {known}")]
    UnknownLoop { name: String, known: String },
    #[error("controller {name:?} is not running in this process (see --controllers)")]
    NotRunning { name: String },
    #[error("controller {name:?} does not explain itself yet; these do: {explaining}")]
    NotExplaining { name: String, explaining: String },
    /// Upstream's not-found wording, e.g. `statefulsets.apps "web" not found`.
    #[error("{resource} {name:?} not found")]
    NotFound { resource: String, name: String },
    #[error("{0}")]
    BadRequest(String),
    #[error("the path must be /debug/controllers/<controller>/<namespace>/<name>, or /debug/controllers/<controller>/<name> for a cluster-scoped object")]
    BadPath,
}

impl ExplainError {
    pub fn not_found(resource: &str, key: &ObjectKey) -> Self {
        ExplainError::NotFound { resource: resource.to_string(), name: key.name.clone() }
    }
}

/// One loop's explainer: a dry run of its reconcile for a key.
pub type Explainer = Arc<dyn Fn(ObjectKey) -> BoxFuture<'static, Result<Explanation, ExplainError>> + Send + Sync>;

/// The explainer of a loop over objects of any kind (the garbage collector): the key and the
/// `kind` query parameter (`ReplicaSet`, or `ReplicaSet.apps` when a kind name is ambiguous).
pub type KindedExplainer =
    Arc<dyn Fn(ObjectKey, Option<String>) -> BoxFuture<'static, Result<Explanation, ExplainError>> + Send + Sync>;

/// The explainers of the loops running in this process.
#[derive(Default)]
pub struct Registry {
    running: RwLock<Vec<&'static str>>,
    loops: RwLock<BTreeMap<&'static str, Explainer>>,
    kinded: RwLock<BTreeMap<&'static str, KindedExplainer>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").field("explaining", &self.explaining()).finish()
    }
}

impl Registry {
    pub fn register(&self, name: &'static str, explainer: Explainer) {
        self.loops.write().unwrap_or_else(|e| e.into_inner()).insert(name, explainer);
    }

    pub fn register_kinded(&self, name: &'static str, explainer: KindedExplainer) {
        self.kinded.write().unwrap_or_else(|e| e.into_inner()).insert(name, explainer);
    }

    pub fn set_running(&self, names: Vec<&'static str>) {
        *self.running.write().unwrap_or_else(|e| e.into_inner()) = names;
    }

    pub fn running(&self) -> Vec<&'static str> {
        self.running.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn explaining(&self) -> Vec<&'static str> {
        let mut names: Vec<&'static str> = self.loops.read().unwrap_or_else(|e| e.into_inner()).keys().copied().collect();
        names.extend(self.kinded.read().unwrap_or_else(|e| e.into_inner()).keys().copied());
        names.sort_unstable();
        names
    }

    /// `/debug/controllers`: the loops of this process and those that explain themselves.
    pub fn index(&self) -> Value {
        serde_json::json!({
            "kind": "ControllerList",
            "apiVersion": "debug.ferro.dev/v1",
            "running": self.running(),
            "explaining": self.explaining(),
        })
    }

    pub async fn explain(&self, name: &str, key: ObjectKey, kind: Option<String>) -> Result<Explanation, ExplainError> {
        if !super::manager::ALL.contains(&name) {
            return Err(ExplainError::UnknownLoop { name: name.to_string(), known: super::manager::ALL.join(", ") });
        }
        if !self.running().contains(&name) {
            return Err(ExplainError::NotRunning { name: name.to_string() });
        }
        let kinded = self.kinded.read().unwrap_or_else(|e| e.into_inner()).get(name).cloned();
        if let Some(k) = kinded {
            return k(key, kind).await;
        }
        let explainer = self.loops.read().unwrap_or_else(|e| e.into_inner()).get(name).cloned();
        let Some(explainer) = explainer else {
            return Err(ExplainError::NotExplaining { name: name.to_string(), explaining: self.explaining().join(", ") });
        };
        explainer(key).await
    }
}

/// Splits `/debug/controllers[/<loop>[/<namespace>]/<name>]` (the prefix already removed); a
/// key without a namespace names a cluster-scoped object (a Node, a Namespace).
pub fn parse_path(rest: &str) -> Result<Option<(String, ObjectKey)>, ExplainError> {
    let rest = rest.trim_matches('/');
    if rest.is_empty() {
        return Ok(None);
    }
    let parts: Vec<&str> = rest.split('/').collect();
    match parts.as_slice() {
        [l, ns, name] if !l.is_empty() && !ns.is_empty() && !name.is_empty() => {
            Ok(Some((l.to_string(), ObjectKey::new(Some(ns), name))))
        }
        [l, name] if !l.is_empty() && !name.is_empty() => Ok(Some((l.to_string(), ObjectKey::new(None, name)))),
        _ => Err(ExplainError::BadPath),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn durations_print_as_go_does() {
        assert_eq!(go_duration(Duration::from_millis(200)), "200ms");
        assert_eq!(go_duration(Duration::from_secs(5)), "5s");
        assert_eq!(go_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(go_duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(go_duration(Duration::from_secs(3600)), "1h0m0s");
    }

    #[test]
    fn paths_name_a_loop_and_an_object() {
        assert_eq!(parse_path("").unwrap(), None);
        assert_eq!(parse_path("/").unwrap(), None);
        let (l, k) = parse_path("/statefulset/default/web").unwrap().unwrap();
        assert_eq!((l.as_str(), k), ("statefulset", ObjectKey::new(Some("default"), "web")));
        let (l, k) = parse_path("/nodelifecycle/n1").unwrap().unwrap();
        assert_eq!((l.as_str(), k), ("nodelifecycle", ObjectKey::new(None, "n1")));
        assert_eq!(parse_path("/statefulset"), Err(ExplainError::BadPath));
        assert_eq!(parse_path("/statefulset//web"), Err(ExplainError::BadPath));
        assert_eq!(parse_path("/statefulset/default/web/extra"), Err(ExplainError::BadPath));
    }

    #[tokio::test]
    async fn a_loop_must_exist_run_here_and_explain_itself() {
        let r = Registry::default();
        let key = ObjectKey::new(Some("default"), "web");
        assert!(matches!(r.explain("statefulsets", key.clone(), None).await, Err(ExplainError::UnknownLoop { .. })));
        assert!(matches!(r.explain("statefulset", key.clone(), None).await, Err(ExplainError::NotRunning { .. })));
        r.set_running(vec!["statefulset", "podgc"]);
        assert!(matches!(r.explain("podgc", key.clone(), None).await, Err(ExplainError::NotExplaining { .. })));
        r.register(
            "statefulset",
            Arc::new(|k: ObjectKey| {
                Box::pin(async move { Err(ExplainError::NotFound { resource: "statefulsets.apps".into(), name: k.name }) })
            }),
        );
        let e = r.explain("statefulset", key, None).await.unwrap_err();
        assert_eq!(e.to_string(), "statefulsets.apps \"web\" not found");
    }

    #[test]
    fn text_form_lists_actions_and_waits() {
        let mut e = Explanation::new(
            "statefulset",
            Subject { kind: "StatefulSet".into(), namespace: "default".into(), name: "web".into(), ..Subject::default() },
        );
        e.observed = serde_json::json!({"pods": [{"name": "web-0", "phase": "Running"}]});
        e.waiting.push("web-2 waits for web-1 to be Running and Ready (OrderedReady)".into());
        let e = e.requeue(Some(Duration::from_secs(3)));
        let t = e.to_text();
        assert!(t.starts_with("statefulset default/web (StatefulSet"), "{t}");
        assert!(t.contains("  pods:\n  - name: web-0\n    phase: Running\n"), "{t}");
        assert!(t.contains("actions:\n  none: the object is as the loop wants it\n"), "{t}");
        assert!(t.contains("waiting:\n  - web-2 waits for web-1 to be Running and Ready (OrderedReady)\n"), "{t}");
        assert!(t.ends_with("looks again in 3s\n"), "{t}");
    }
}
