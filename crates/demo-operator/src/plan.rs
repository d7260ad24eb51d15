//! The operator's decisions, as pure functions of a Website and what was observed of its
//! Deployment and Service: the objects it should have ([`desired_deployment`],
//! [`desired_service`]), the writes that get there ([`plan`] -> [`Op`]s) and the status to
//! report. Nothing here talks to the API; `cluster.rs` executes the ops.
//!
//! Rules:
//! - The Deployment and the Service are named as the Website, labelled with the
//!   `app.kubernetes.io/*` labels and controlled by it (an ownerReference with `controller:
//!   true`), so the garbage collector removes them with it.
//! - A missing object is created. An object the Website controls is patched (JSON merge patch)
//!   when a field the operator owns differs: replicas, the pod template's labels and container,
//!   the Service's selector and ports. Fields others own (defaults, the Deployment controller's
//!   annotations, the ClusterIP) are left alone.
//! - An object of that name the Website does not control is never touched: the Website reports
//!   `Ready=False` with reason `ResourceExists` (as upstream's sample-controller does).
//! - The status (replicas and ready replicas of the Deployment, the `Ready` condition) is
//!   written only when it differs from the stored one, so a status write does not cause another.
//! - A Website being deleted gets no ops: its objects go with it.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, HTTPGetAction, PodSpec, PodTemplateSpec, Probe, Service,
    ServicePort, ServiceSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    Condition, LabelSelector, ObjectMeta, OwnerReference, Time,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Resource;
use serde_json::{json, Value};

use crate::website::{Website, WebsiteStatus, READY};

/// The label every object of the operator carries, naming it.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "ferro-demo-operator");
/// The label naming the kind of application.
pub const NAME_LABEL: (&str, &str) = ("app.kubernetes.io/name", "website");
/// The label naming the Website an object belongs to.
pub const INSTANCE_LABEL: &str = "app.kubernetes.io/instance";
/// The container of the website's pods.
pub const CONTAINER: &str = "web";
/// The Service's port (the pods listen on `spec.port`).
pub const SERVICE_PORT: i32 = 80;

/// The pods' command: write the page, serve it with busybox's httpd. `sh` stays PID 1 and exits
/// on SIGTERM (httpd as PID 1 would ignore it and make every deletion wait its grace period).
const SCRIPT: &str = "trap 'exit 0' TERM; mkdir -p /tmp/www && printf '%s\\n' \"$WEBSITE_MESSAGE\" >/tmp/www/index.html || exit 1; httpd -f -p \"$WEBSITE_PORT\" -h /tmp/www & wait $!";

/// What was observed of a Website's objects (None: not found).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observed {
    pub deployment: Option<Deployment>,
    pub service: Option<Service>,
}

/// One write to the API.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    CreateDeployment(Box<Deployment>),
    /// A JSON merge patch of the named Deployment.
    PatchDeployment {
        name: String,
        patch: Value,
    },
    CreateService(Box<Service>),
    /// A JSON merge patch of the named Service.
    PatchService {
        name: String,
        patch: Value,
    },
    /// The Website's status, written through its status subresource.
    UpdateStatus(WebsiteStatus),
}

impl Op {
    /// A one-line description for logs.
    pub fn describe(&self) -> String {
        let name = |m: &ObjectMeta| m.name.clone().unwrap_or_default();
        match self {
            Op::CreateDeployment(d) => format!("create deployment {}", name(&d.metadata)),
            Op::PatchDeployment { name, patch } => format!("patch deployment {name}: {patch}"),
            Op::CreateService(s) => format!("create service {}", name(&s.metadata)),
            Op::PatchService { name, patch } => format!("patch service {name}: {patch}"),
            Op::UpdateStatus(st) => {
                let ready = st.conditions.iter().find(|c| c.type_ == READY);
                format!(
                    "update status: {} of {} ready, Ready={} ({})",
                    st.ready_replicas,
                    st.replicas,
                    ready.map(|c| c.status.as_str()).unwrap_or("-"),
                    ready.map(|c| c.reason.as_str()).unwrap_or("-"),
                )
            }
        }
    }
}

/// The writes of one reconcile, in order, and the status they report.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub ops: Vec<Op>,
    pub status: WebsiteStatus,
}

/// A Website that cannot be planned for (the API always sets these fields; a client-built
/// object may not).
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PlanError {
    #[error("website has no {0}")]
    Missing(&'static str),
}

fn name_of(site: &Website) -> Result<&str, PlanError> {
    site.metadata
        .name
        .as_deref()
        .ok_or(PlanError::Missing("metadata.name"))
}

/// The labels of the Website's objects and pods.
pub fn labels(site: &Website) -> Result<BTreeMap<String, String>, PlanError> {
    let name = name_of(site)?;
    Ok(BTreeMap::from([
        (NAME_LABEL.0.to_string(), NAME_LABEL.1.to_string()),
        (INSTANCE_LABEL.to_string(), name.to_string()),
        (MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string()),
    ]))
}

/// The pod selector of the Deployment and the Service (immutable in a Deployment, so it never
/// names anything that may change).
pub fn selector(site: &Website) -> Result<BTreeMap<String, String>, PlanError> {
    let name = name_of(site)?;
    Ok(BTreeMap::from([
        (NAME_LABEL.0.to_string(), NAME_LABEL.1.to_string()),
        (INSTANCE_LABEL.to_string(), name.to_string()),
    ]))
}

/// The ownerReference of the Website's objects: `controller: true` (kube's
/// `controller_owner_ref`; no `blockOwnerDeletion`, which under upstream's
/// OwnerReferencesPermissionEnforcement admission would also need `update` on
/// `websites/finalizers`).
pub fn owner_reference(site: &Website) -> Result<OwnerReference, PlanError> {
    name_of(site)?;
    if site.metadata.uid.is_none() {
        return Err(PlanError::Missing("metadata.uid"));
    }
    site.controller_owner_ref(&())
        .ok_or(PlanError::Missing("metadata.uid"))
}

fn meta(site: &Website) -> Result<ObjectMeta, PlanError> {
    Ok(ObjectMeta {
        name: Some(name_of(site)?.to_string()),
        namespace: site.metadata.namespace.clone(),
        labels: Some(labels(site)?),
        owner_references: Some(vec![owner_reference(site)?]),
        ..ObjectMeta::default()
    })
}

fn pod_template(site: &Website) -> Result<PodTemplateSpec, PlanError> {
    let spec = &site.spec;
    Ok(PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels(site)?),
            ..ObjectMeta::default()
        }),
        spec: Some(PodSpec {
            containers: vec![Container {
                name: CONTAINER.to_string(),
                image: Some(spec.image.clone()),
                command: Some(vec!["sh".into(), "-c".into(), SCRIPT.into()]),
                env: Some(vec![
                    EnvVar {
                        name: "WEBSITE_MESSAGE".into(),
                        value: Some(spec.message.clone()),
                        ..EnvVar::default()
                    },
                    EnvVar {
                        name: "WEBSITE_PORT".into(),
                        value: Some(spec.port.to_string()),
                        ..EnvVar::default()
                    },
                ]),
                ports: Some(vec![ContainerPort {
                    name: Some("http".into()),
                    container_port: spec.port,
                    protocol: Some("TCP".into()),
                    ..ContainerPort::default()
                }]),
                readiness_probe: Some(Probe {
                    http_get: Some(HTTPGetAction {
                        path: Some("/".into()),
                        port: IntOrString::String("http".into()),
                        ..HTTPGetAction::default()
                    }),
                    period_seconds: Some(2),
                    ..Probe::default()
                }),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
    })
}

/// The Deployment the Website should have.
pub fn desired_deployment(site: &Website) -> Result<Deployment, PlanError> {
    Ok(Deployment {
        metadata: meta(site)?,
        spec: Some(DeploymentSpec {
            replicas: Some(site.spec.replicas),
            selector: LabelSelector {
                match_labels: Some(selector(site)?),
                ..LabelSelector::default()
            },
            template: pod_template(site)?,
            ..DeploymentSpec::default()
        }),
        status: None,
    })
}

/// The Service the Website should have: ClusterIP, port 80 to the pods' `http` port.
pub fn desired_service(site: &Website) -> Result<Service, PlanError> {
    Ok(Service {
        metadata: meta(site)?,
        spec: Some(ServiceSpec {
            selector: Some(selector(site)?),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: SERVICE_PORT,
                target_port: Some(IntOrString::String("http".into())),
                protocol: Some("TCP".into()),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        status: None,
    })
}

/// Whether `meta` names `site` as its controller (by uid).
pub fn controlled_by(meta: &ObjectMeta, site: &Website) -> bool {
    let Some(uid) = site.metadata.uid.as_deref() else {
        return false;
    };
    meta.owner_references
        .iter()
        .flatten()
        .any(|r| r.controller == Some(true) && r.uid == uid)
}

/// True when every label of `want` is in `have` with the same value.
fn has_labels(have: Option<&BTreeMap<String, String>>, want: &BTreeMap<String, String>) -> bool {
    want.iter()
        .all(|(k, v)| have.and_then(|h| h.get(k)) == Some(v))
}

/// The parts of a container the operator owns, defaults filled in as the API server fills
/// them, so an observed container compares equal to the desired one.
#[derive(Debug, PartialEq)]
struct ContainerView<'a> {
    name: &'a str,
    image: Option<&'a str>,
    command: Option<&'a [String]>,
    env: Vec<(&'a str, Option<&'a str>)>,
    ports: Vec<(Option<&'a str>, i32, &'a str)>,
    probe: Option<(Option<&'a str>, &'a IntOrString)>,
}

fn container_view(c: &Container) -> ContainerView<'_> {
    ContainerView {
        name: &c.name,
        image: c.image.as_deref(),
        command: c.command.as_deref(),
        env: c
            .env
            .iter()
            .flatten()
            .map(|e| (e.name.as_str(), e.value.as_deref()))
            .collect(),
        ports: c
            .ports
            .iter()
            .flatten()
            .map(|p| {
                (
                    p.name.as_deref(),
                    p.container_port,
                    p.protocol.as_deref().unwrap_or("TCP"),
                )
            })
            .collect(),
        probe: c
            .readiness_probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .map(|h| (h.path.as_deref(), &h.port)),
    }
}

/// Whether the observed Deployment differs from the desired one in a field the operator owns.
fn deployment_drifted(observed: &Deployment, desired: &Deployment) -> bool {
    let labels = desired.metadata.labels.clone().unwrap_or_default();
    if !has_labels(observed.metadata.labels.as_ref(), &labels) {
        return true;
    }
    let (Some(have), Some(want)) = (observed.spec.as_ref(), desired.spec.as_ref()) else {
        return true;
    };
    if have.replicas.unwrap_or(1) != want.replicas.unwrap_or(1) {
        return true;
    }
    let template_labels = want
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    if !has_labels(
        have.template
            .metadata
            .as_ref()
            .and_then(|m| m.labels.as_ref()),
        &template_labels,
    ) {
        return true;
    }
    let containers = |t: &PodTemplateSpec| -> Vec<Container> {
        t.spec
            .as_ref()
            .map(|s| s.containers.clone())
            .unwrap_or_default()
    };
    let (have_c, want_c) = (containers(&have.template), containers(&want.template));
    have_c.iter().map(container_view).collect::<Vec<_>>()
        != want_c.iter().map(container_view).collect::<Vec<_>>()
}

/// A JSON merge patch of a string map from `have` to `want` (removed keys set to null).
fn map_patch(have: Option<&BTreeMap<String, String>>, want: &BTreeMap<String, String>) -> Value {
    let mut out = serde_json::Map::new();
    for k in have.into_iter().flatten().map(|(k, _)| k) {
        if !want.contains_key(k) {
            out.insert(k.clone(), Value::Null);
        }
    }
    for (k, v) in want {
        out.insert(k.clone(), Value::String(v.clone()));
    }
    Value::Object(out)
}

fn deployment_patch(desired: &Deployment) -> Value {
    let spec = desired.spec.as_ref();
    json!({
        "metadata": {"labels": desired.metadata.labels},
        "spec": {
            "replicas": spec.and_then(|s| s.replicas),
            "template": spec.map(|s| &s.template),
        },
    })
}

#[derive(Debug, PartialEq)]
struct ServiceView<'a> {
    selector: Option<&'a BTreeMap<String, String>>,
    ports: Vec<(Option<&'a str>, i32, Option<&'a IntOrString>, &'a str)>,
}

fn service_view(s: &Service) -> ServiceView<'_> {
    let spec = s.spec.as_ref();
    ServiceView {
        selector: spec.and_then(|s| s.selector.as_ref()),
        ports: spec
            .and_then(|s| s.ports.as_ref())
            .into_iter()
            .flatten()
            .map(|p| {
                (
                    p.name.as_deref(),
                    p.port,
                    p.target_port.as_ref(),
                    p.protocol.as_deref().unwrap_or("TCP"),
                )
            })
            .collect(),
    }
}

fn service_drifted(observed: &Service, desired: &Service) -> bool {
    let labels = desired.metadata.labels.clone().unwrap_or_default();
    !has_labels(observed.metadata.labels.as_ref(), &labels)
        || service_view(observed) != service_view(desired)
}

fn service_patch(observed: &Service, desired: &Service) -> Value {
    let want = desired.spec.as_ref();
    json!({
        "metadata": {"labels": desired.metadata.labels},
        "spec": {
            "selector": map_patch(
                observed.spec.as_ref().and_then(|s| s.selector.as_ref()),
                &want.and_then(|s| s.selector.clone()).unwrap_or_default(),
            ),
            "ports": want.and_then(|s| s.ports.as_ref()),
        },
    })
}

/// Why the website is (not) ready: the `Ready` condition's status, reason and message.
fn readiness(
    site: &Website,
    observed: &Observed,
    pending: bool,
    status: &WebsiteStatus,
) -> (bool, &'static str, String) {
    let name = site.metadata.name.as_deref().unwrap_or("");
    let want = site.spec.replicas;
    let foreign = |kind: &str| format!("{kind} {name} exists and is not managed by this Website");
    if let Some(d) = &observed.deployment {
        if !controlled_by(&d.metadata, site) {
            return (false, "ResourceExists", foreign("deployment"));
        }
    }
    if let Some(s) = &observed.service {
        if !controlled_by(&s.metadata, site) {
            return (false, "ResourceExists", foreign("service"));
        }
    }
    let Some(d) = &observed.deployment else {
        return (false, "Creating", format!("creating deployment {name}"));
    };
    if pending {
        return (
            false,
            "Updating",
            format!("updating the objects of website {name}"),
        );
    }
    let st = d.status.clone().unwrap_or_default();
    let seen = st.observed_generation.unwrap_or(0) >= d.metadata.generation.unwrap_or(0);
    let ready = status.ready_replicas;
    let done = seen
        && ready == want
        && st.updated_replicas.unwrap_or(0) == want
        && st.replicas.unwrap_or(0) == want;
    let msg = format!("{ready} of {want} pods ready");
    if done {
        (true, "Available", msg)
    } else {
        (false, "Progressing", msg)
    }
}

/// The status to report: the Deployment's replica counts and the `Ready` condition, its
/// lastTransitionTime kept unless its status changes (then `now`).
pub fn status(site: &Website, observed: &Observed, pending: bool, now: &Time) -> WebsiteStatus {
    let counts = observed
        .deployment
        .as_ref()
        .filter(|d| controlled_by(&d.metadata, site))
        .and_then(|d| d.status.as_ref());
    let mut out = WebsiteStatus {
        observed_generation: site.metadata.generation,
        replicas: counts.and_then(|s| s.replicas).unwrap_or(0),
        ready_replicas: counts.and_then(|s| s.ready_replicas).unwrap_or(0),
        conditions: Vec::new(),
    };
    let (ready, reason, message) = readiness(site, observed, pending, &out);
    let cond_status = if ready { "True" } else { "False" };
    let previous = site
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == READY));
    let since = match previous {
        Some(c) if c.status == cond_status => c.last_transition_time.clone(),
        _ => now.clone(),
    };
    out.conditions = vec![Condition {
        type_: READY.to_string(),
        status: cond_status.to_string(),
        reason: reason.to_string(),
        message,
        observed_generation: site.metadata.generation,
        last_transition_time: since,
    }];
    // Conditions of other types someone else wrote are kept.
    if let Some(st) = &site.status {
        out.conditions
            .extend(st.conditions.iter().filter(|c| c.type_ != READY).cloned());
    }
    out
}

/// The writes that bring the Website's objects to what it asks for, and its status.
pub fn plan(site: &Website, observed: &Observed, now: &Time) -> Result<Plan, PlanError> {
    let current = site.status.clone().unwrap_or_default();
    if site.metadata.deletion_timestamp.is_some() {
        return Ok(Plan {
            ops: Vec::new(),
            status: current,
        });
    }
    let deployment = desired_deployment(site)?;
    let service = desired_service(site)?;
    let name = name_of(site)?.to_string();
    let mut ops = Vec::new();
    match &observed.deployment {
        None => ops.push(Op::CreateDeployment(Box::new(deployment))),
        Some(d) if controlled_by(&d.metadata, site) && deployment_drifted(d, &deployment) => ops
            .push(Op::PatchDeployment {
                name: name.clone(),
                patch: deployment_patch(&deployment),
            }),
        Some(_) => {}
    }
    match &observed.service {
        None => ops.push(Op::CreateService(Box::new(service))),
        Some(s) if controlled_by(&s.metadata, site) && service_drifted(s, &service) => {
            ops.push(Op::PatchService {
                name,
                patch: service_patch(s, &service),
            })
        }
        Some(_) => {}
    }
    let pending = ops.iter().any(|o| matches!(o, Op::PatchDeployment { .. }));
    let status = status(site, observed, pending, now);
    if status != current {
        ops.push(Op::UpdateStatus(status.clone()));
    }
    Ok(Plan { ops, status })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use k8s_openapi::api::apps::v1::DeploymentStatus;

    use super::*;
    use crate::website::WebsiteSpec;

    fn time(s: i64) -> Time {
        Time(jiff::Timestamp::from_second(s).unwrap())
    }

    fn site(replicas: i32) -> Website {
        let mut w = Website::new(
            "hello",
            WebsiteSpec {
                replicas,
                image: "busybox:1".into(),
                port: 8080,
                message: "hi".into(),
            },
        );
        w.metadata.namespace = Some("web".into());
        w.metadata.uid = Some("uid-1".into());
        w.metadata.generation = Some(1);
        w
    }

    /// The Deployment as the API server would return it: the desired one with defaults filled
    /// in and the Deployment controller's status.
    fn served_deployment(w: &Website, ready: i32) -> Deployment {
        let mut d = desired_deployment(w).unwrap();
        d.metadata.generation = Some(3);
        d.metadata.uid = Some("d-uid".into());
        d.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert("deployment.kubernetes.io/revision".into(), "1".into());
        let spec = d.spec.as_mut().unwrap();
        spec.revision_history_limit = Some(10);
        let c = &mut spec.template.spec.as_mut().unwrap().containers[0];
        c.image_pull_policy = Some("IfNotPresent".into());
        c.termination_message_path = Some("/dev/termination-log".into());
        let probe = c.readiness_probe.as_mut().unwrap();
        probe.timeout_seconds = Some(1);
        probe.http_get.as_mut().unwrap().scheme = Some("HTTP".into());
        d.status = Some(DeploymentStatus {
            observed_generation: Some(3),
            replicas: Some(w.spec.replicas),
            updated_replicas: Some(w.spec.replicas),
            ready_replicas: Some(ready),
            available_replicas: Some(ready),
            ..DeploymentStatus::default()
        });
        d
    }

    fn served_service(w: &Website) -> Service {
        let mut s = desired_service(w).unwrap();
        let spec = s.spec.as_mut().unwrap();
        spec.cluster_ip = Some("10.96.0.10".into());
        spec.type_ = Some("ClusterIP".into());
        spec.session_affinity = Some("None".into());
        s
    }

    fn ready_condition(st: &WebsiteStatus) -> &Condition {
        st.conditions.iter().find(|c| c.type_ == READY).unwrap()
    }

    #[test]
    fn a_new_website_gets_its_deployment_service_and_a_status() {
        let w = site(2);
        let p = plan(&w, &Observed::default(), &time(100)).unwrap();
        assert_eq!(p.ops.len(), 3, "{:?}", p.ops);
        let Op::CreateDeployment(d) = &p.ops[0] else {
            panic!("{:?}", p.ops[0])
        };
        assert_eq!(d.metadata.name.as_deref(), Some("hello"));
        assert_eq!(d.metadata.namespace.as_deref(), Some("web"));
        let owner = &d.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (
                owner.api_version.as_str(),
                owner.kind.as_str(),
                owner.name.as_str(),
                owner.uid.as_str()
            ),
            ("demo.ferro.dev/v1", "Website", "hello", "uid-1")
        );
        assert_eq!(
            (owner.controller, owner.block_owner_deletion),
            (Some(true), None)
        );
        let spec = d.spec.as_ref().unwrap();
        assert_eq!(spec.replicas, Some(2));
        assert_eq!(
            spec.selector.match_labels.as_ref().unwrap(),
            &selector(&w).unwrap()
        );
        let c = &spec.template.spec.as_ref().unwrap().containers[0];
        assert_eq!(c.image.as_deref(), Some("busybox:1"));
        let env: Vec<_> = c
            .env
            .iter()
            .flatten()
            .map(|e| (e.name.as_str(), e.value.as_deref()))
            .collect();
        assert_eq!(
            env,
            [
                ("WEBSITE_MESSAGE", Some("hi")),
                ("WEBSITE_PORT", Some("8080"))
            ]
        );
        assert_eq!(c.ports.as_ref().unwrap()[0].container_port, 8080);
        let Op::CreateService(s) = &p.ops[1] else {
            panic!("{:?}", p.ops[1])
        };
        let port = &s.spec.as_ref().unwrap().ports.as_ref().unwrap()[0];
        assert_eq!(
            (port.port, port.target_port.clone()),
            (80, Some(IntOrString::String("http".into())))
        );
        assert_eq!(s.metadata.owner_references, d.metadata.owner_references);
        let Op::UpdateStatus(st) = &p.ops[2] else {
            panic!("{:?}", p.ops[2])
        };
        assert_eq!(
            (st.replicas, st.ready_replicas, st.observed_generation),
            (0, 0, Some(1))
        );
        let c = ready_condition(st);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", "Creating")
        );
        assert_eq!(c.last_transition_time, time(100));
        assert_eq!(c.observed_generation, Some(1));
    }

    #[test]
    fn ready_pods_make_the_website_ready_and_nothing_changes_after() {
        let mut w = site(2);
        let observed = Observed {
            deployment: Some(served_deployment(&w, 2)),
            service: Some(served_service(&w)),
        };
        let p = plan(&w, &observed, &time(100)).unwrap();
        let [Op::UpdateStatus(st)] = p.ops.as_slice() else {
            panic!("{:?}", p.ops)
        };
        assert_eq!((st.replicas, st.ready_replicas), (2, 2));
        let c = ready_condition(st);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
            ("True", "Available", "2 of 2 pods ready")
        );
        // The status written, the same observation plans nothing (server defaults do not count
        // as drift), also later.
        w.status = Some(st.clone());
        let again = plan(&w, &observed, &time(200)).unwrap();
        assert!(again.ops.is_empty(), "{:?}", again.ops);
    }

    #[test]
    fn pods_not_yet_ready_are_progressing() {
        let w = site(3);
        let observed = Observed {
            deployment: Some(served_deployment(&w, 1)),
            service: Some(served_service(&w)),
        };
        let p = plan(&w, &observed, &time(100)).unwrap();
        let c = ready_condition(&p.status);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
            ("False", "Progressing", "1 of 3 pods ready")
        );
        assert_eq!(p.status.ready_replicas, 1);
        // A Deployment whose new generation the Deployment controller has not seen is not done
        // even if its counts match.
        let mut d = served_deployment(&w, 3);
        d.metadata.generation = Some(4);
        let p = plan(
            &w,
            &Observed {
                deployment: Some(d),
                service: Some(served_service(&w)),
            },
            &time(100),
        )
        .unwrap();
        assert_eq!(ready_condition(&p.status).reason, "Progressing");
    }

    #[test]
    fn a_changed_spec_patches_the_deployment() {
        let old = site(2);
        let observed = Observed {
            deployment: Some(served_deployment(&old, 2)),
            service: Some(served_service(&old)),
        };
        let mut w = site(1);
        w.spec.message = "bye".into();
        w.metadata.generation = Some(2);
        let p = plan(&w, &observed, &time(100)).unwrap();
        let Op::PatchDeployment { name, patch } = &p.ops[0] else {
            panic!("{:?}", p.ops)
        };
        assert_eq!(name, "hello");
        assert_eq!(patch["spec"]["replicas"], 1);
        let env = &patch["spec"]["template"]["spec"]["containers"][0]["env"];
        assert_eq!(env[0], json!({"name": "WEBSITE_MESSAGE", "value": "bye"}));
        assert_eq!(patch["metadata"]["labels"][INSTANCE_LABEL], "hello");
        // Only the fields the operator owns: no status, no ownerReferences rewritten.
        assert!(
            patch.get("status").is_none() && patch["metadata"].get("ownerReferences").is_none()
        );
        let Op::UpdateStatus(st) = &p.ops[1] else {
            panic!("{:?}", p.ops)
        };
        assert_eq!(ready_condition(st).reason, "Updating");
        assert_eq!(st.observed_generation, Some(2));
        assert_eq!(p.ops.len(), 2);
    }

    #[test]
    fn objects_of_that_name_the_website_does_not_control_are_left_alone() {
        let w = site(1);
        let mut d = served_deployment(&w, 1);
        d.metadata.owner_references = None;
        d.spec.as_mut().unwrap().replicas = Some(5);
        let p = plan(
            &w,
            &Observed {
                deployment: Some(d),
                service: None,
            },
            &time(100),
        )
        .unwrap();
        // The Service is still made; the Deployment is not touched.
        assert!(matches!(p.ops[0], Op::CreateService(_)), "{:?}", p.ops);
        let Op::UpdateStatus(st) = &p.ops[1] else {
            panic!("{:?}", p.ops)
        };
        let c = ready_condition(st);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", "ResourceExists")
        );
        assert_eq!(
            c.message,
            "deployment hello exists and is not managed by this Website"
        );
        assert_eq!((st.replicas, st.ready_replicas), (0, 0));
        // Another Website's Service (another uid) is not this one's either.
        let mut other = site(1);
        other.metadata.uid = Some("uid-2".into());
        let p = plan(
            &w,
            &Observed {
                deployment: Some(served_deployment(&w, 1)),
                service: Some(served_service(&other)),
            },
            &time(100),
        )
        .unwrap();
        assert!(!p
            .ops
            .iter()
            .any(|o| matches!(o, Op::PatchService { .. } | Op::CreateService(_))));
        assert_eq!(
            ready_condition(&p.status).message,
            "service hello exists and is not managed by this Website"
        );
    }

    #[test]
    fn a_service_selector_is_restored_with_extra_keys_removed() {
        let w = site(1);
        let mut s = served_service(&w);
        let spec = s.spec.as_mut().unwrap();
        spec.selector
            .as_mut()
            .unwrap()
            .insert("extra".into(), "x".into());
        spec.ports.as_mut().unwrap()[0].port = 81;
        let p = plan(
            &w,
            &Observed {
                deployment: Some(served_deployment(&w, 1)),
                service: Some(s),
            },
            &time(100),
        )
        .unwrap();
        let Op::PatchService { patch, .. } = &p.ops[0] else {
            panic!("{:?}", p.ops)
        };
        assert_eq!(patch["spec"]["selector"]["extra"], Value::Null);
        assert_eq!(patch["spec"]["selector"][INSTANCE_LABEL], "hello");
        assert_eq!(patch["spec"]["ports"][0]["port"], 80);
    }

    #[test]
    fn the_transition_time_moves_only_when_the_condition_flips() {
        let mut w = site(1);
        let progressing = Observed {
            deployment: Some(served_deployment(&w, 0)),
            service: Some(served_service(&w)),
        };
        w.status = Some(plan(&w, &progressing, &time(100)).unwrap().status);
        // Still progressing later: the time stays, nothing to write.
        let p = plan(&w, &progressing, &time(200)).unwrap();
        assert!(p.ops.is_empty(), "{:?}", p.ops);
        assert_eq!(ready_condition(&p.status).last_transition_time, time(100));
        // Ready: the time moves.
        let ready = Observed {
            deployment: Some(served_deployment(&w, 1)),
            service: Some(served_service(&w)),
        };
        let p = plan(&w, &ready, &time(300)).unwrap();
        assert_eq!(ready_condition(&p.status).last_transition_time, time(300));
        // Other condition types someone else set are kept.
        let mut st = p.status.clone();
        st.conditions.push(Condition {
            type_: "Audited".into(),
            status: "True".into(),
            reason: "Ok".into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: time(1),
        });
        w.status = Some(st);
        let p = plan(&w, &ready, &time(400)).unwrap();
        assert!(p.ops.is_empty(), "{:?}", p.ops);
        assert_eq!(p.status.conditions.len(), 2);
    }

    #[test]
    fn a_website_being_deleted_gets_no_ops() {
        let mut w = site(1);
        w.metadata.deletion_timestamp = Some(time(50));
        let p = plan(&w, &Observed::default(), &time(100)).unwrap();
        assert!(p.ops.is_empty());
    }

    #[test]
    fn a_website_without_uid_cannot_own_anything() {
        let mut w = site(1);
        w.metadata.uid = None;
        assert_eq!(
            plan(&w, &Observed::default(), &time(1)),
            Err(PlanError::Missing("metadata.uid"))
        );
    }

    #[test]
    fn scaled_to_zero_is_ready_with_no_pods() {
        let w = site(0);
        let observed = Observed {
            deployment: Some(served_deployment(&w, 0)),
            service: Some(served_service(&w)),
        };
        let p = plan(&w, &observed, &time(1)).unwrap();
        let c = ready_condition(&p.status);
        assert_eq!(
            (c.status.as_str(), c.message.as_str()),
            ("True", "0 of 0 pods ready")
        );
    }
}
